//! The ids a call carries: validated once where they enter (a request, a config file, a stored
//! record) and typed after, so no later step checks them again.
//!
//! - `RunId` and `ToolName`: `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`
//! - `ToolCallId`: `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$` (the agent framework's own id, kept
//!   exactly), except the two words `run` and `progress`: a record's key is
//!   `{prefix}:{run_id}:{tool_call_id}`, beside the run's own `…:run` and `…:progress` keys, so
//!   those two ids would name the run's state instead of a record.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A table keyed by run id, with foldhash's seeded hash instead of SipHash. Its keys come only
/// from genuine run tokens or the admin API, so the harness, not the agent, chooses them; tables
/// keyed by what an agent sends (a tool call id) keep the standard library's SipHash.
pub type RunMap<V> = std::collections::HashMap<RunId, V, foldhash::fast::RandomState>;

/// Whether `s` is a safe id: a leading ASCII letter or digit, then letters, digits and `extra`,
/// at most `max` bytes in all, and none of the `reserved` words.
fn is_safe(s: &str, max: usize, extra: &[u8], reserved: &[&str]) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && !reserved.contains(&s)
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
}

macro_rules! safe_id {
    ($(#[$doc:meta])* $name:ident, $max:expr, $extra:expr) => {
        safe_id!($(#[$doc])* $name, $max, $extra, &[]);
    };
    ($(#[$doc:meta])* $name:ident, $max:expr, $extra:expr, $reserved:expr) => {
        $(#[$doc])*
        ///
        /// Shared, not copied: a call passes its ids to its record, its store keys, its spans
        /// and its log line, and each of those clones is a reference count.
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// The id, if `s` is a safe one.
            pub fn parse(s: &str) -> Option<$name> {
                is_safe(s, $max, $extra, $reserved).then(|| $name(Arc::from(s)))
            }

            /// Takes an owned string, if it is a safe id.
            pub fn from_string(s: String) -> Option<$name> {
                is_safe(&s, $max, $extra, $reserved).then(|| $name(Arc::from(s)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                *self.0 == *other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                *self.0 == **other
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let s = String::deserialize(d)?;
                $name::from_string(s).ok_or_else(|| {
                    serde::de::Error::custom(concat!("not a safe ", stringify!($name)))
                })
            }
        }
    };
}

safe_id!(
    /// A run's id.
    RunId,
    64,
    b"._-"
);
safe_id!(
    /// The agent framework's id for one tool call (OpenAI `call_…`, Anthropic `toolu_…`).
    ToolCallId,
    128,
    b"._:-",
    &["run", "progress"]
);
safe_id!(
    /// A configured tool's name.
    ToolName,
    64,
    b"._-"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_ids() {
        assert!(RunId::parse("run-42").is_some());
        assert!(RunId::parse("-run").is_none());
        assert!(RunId::parse(&"a".repeat(64)).is_some());
        assert!(RunId::parse(&"a".repeat(65)).is_none());
        assert!(ToolCallId::parse("toolu_01:abc").is_some());
        assert!(ToolCallId::parse("call abc").is_none());
        assert!(ToolCallId::parse("").is_none());
        // The run's own keys are not record keys.
        assert!(ToolCallId::parse("run").is_none());
        assert!(ToolCallId::parse("progress").is_none());
        assert!(ToolCallId::from_string("progress".into()).is_none());
        assert!(ToolCallId::parse("Run").is_some());
        assert!(ToolCallId::parse("run1").is_some());
        assert!(ToolCallId::parse("progress:2").is_some());
        assert!(RunId::parse("run:1").is_none());
        assert!(ToolName::parse("read_file").is_some());
    }

    #[test]
    fn deserializing_validates() {
        assert!(serde_json::from_str::<RunId>(r#""run-1""#).is_ok());
        assert!(serde_json::from_str::<RunId>(r#""run 1""#).is_err());
        assert_eq!(
            serde_json::to_string(&ToolCallId::parse("c:1").unwrap()).unwrap(),
            r#""c:1""#
        );
    }
}
