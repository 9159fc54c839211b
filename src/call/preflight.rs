//! The ordered preflight checks that need no store (steps 1–9; step 10 is the store's
//! reservation). The first failing check answers; nothing is forwarded and nothing is spent.
//! The order is listed in `docs/api.md`.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use hyper::HeaderMap;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::incoming::{Form, Incoming, Received, Rejection};
use super::live::{LivePolicy, LiveTool};
use crate::auth::Tokens;
use crate::body::value_depth;
use crate::error::{Code, Error};
use crate::ids::{RunId, ToolCallId};

/// A call that passed steps 1–6: identified, authenticated, bound to its run and tool.
pub struct Identified {
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
    pub tool: Arc<LiveTool>,
    input: Option<Value>,
}

/// A call that passed steps 1–9: ready for the store reservation.
pub struct Admitted {
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
    pub tool: Arc<LiveTool>,
    /// The input object exactly as it will be forwarded and recorded.
    pub input: Value,
}

/// What the request says, read once: each field is only trusted by the step that checks it.
/// An envelope's strings are borrowed from the body where they need no unescaping.
struct Claims<'a> {
    /// The envelope's `input`; `Err` when the envelope body is not a JSON object (step 3).
    envelope: Result<Option<Value>, ()>,
    tool_call_id: Option<Cow<'a, str>>,
    run_id: Option<Cow<'a, str>>,
    tool: Option<Cow<'a, str>>,
}

/// The envelope `{"run_id","tool_call_id","tool","input"}`, read in one pass as a JSON object
/// parsed into a map would be read, without building the map: each value is parsed as a
/// `Value` (other keys' too, then dropped, so the same texts are refused), a claim that is
/// not a string reads as absent, and a repeated key keeps its last value. A claim is borrowed
/// from the body unless it has an escape.
#[derive(Default)]
struct Envelope<'a> {
    run_id: Option<Cow<'a, str>>,
    tool_call_id: Option<Cow<'a, str>>,
    tool: Option<Cow<'a, str>>,
    input: Option<Value>,
}

/// A claim's value: the string, or nothing for any other JSON value, which is read all the
/// same (as a `Value` would read it) so that the same texts are refused.
struct Claim<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for Claim<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct AnyValue;
        impl<'de> Visitor<'de> for AnyValue {
            type Value = Claim<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Claim<'de>, E> {
                Ok(Claim(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Claim<'de>, E> {
                Ok(Claim(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Claim<'de>, E> {
                Ok(Claim(Some(Cow::Owned(v))))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Claim<'de>, E> {
                Ok(Claim(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Claim<'de>, E> {
                Ok(Claim(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Claim<'de>, E> {
                Ok(Claim(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Claim<'de>, E> {
                Ok(Claim(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Claim<'de>, E> {
                Ok(Claim(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Claim<'de>, A::Error> {
                while seq.next_element::<Value>()?.is_some() {}
                Ok(Claim(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Claim<'de>, A::Error> {
                while map.next_entry::<String, Value>()?.is_some() {}
                Ok(Claim(None))
            }
        }
        d.deserialize_any(AnyValue)
    }
}

/// A key of the envelope.
enum EnvelopeKey {
    RunId,
    ToolCallId,
    Tool,
    Input,
    Other,
}

impl<'de> Deserialize<'de> for EnvelopeKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Key;
        impl Visitor<'_> for Key {
            type Value = EnvelopeKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<EnvelopeKey, E> {
                Ok(match key {
                    "run_id" => EnvelopeKey::RunId,
                    "tool_call_id" => EnvelopeKey::ToolCallId,
                    "tool" => EnvelopeKey::Tool,
                    "input" => EnvelopeKey::Input,
                    _ => EnvelopeKey::Other,
                })
            }
        }
        d.deserialize_identifier(Key)
    }
}

impl<'de> Deserialize<'de> for Envelope<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Envelope<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envelope<'de>, A::Error> {
                let mut e = Envelope::default();
                while let Some(key) = map.next_key::<EnvelopeKey>()? {
                    match key {
                        EnvelopeKey::RunId => e.run_id = map.next_value::<Claim<'de>>()?.0,
                        EnvelopeKey::ToolCallId => {
                            e.tool_call_id = map.next_value::<Claim<'de>>()?.0;
                        }
                        EnvelopeKey::Tool => e.tool = map.next_value::<Claim<'de>>()?.0,
                        EnvelopeKey::Input => e.input = Some(map.next_value()?),
                        EnvelopeKey::Other => {
                            map.next_value::<Value>()?;
                        }
                    }
                }
                Ok(e)
            }
        }
        d.deserialize_map(Object)
    }
}

impl<'a> Claims<'a> {
    /// What a request claims; only its body is borrowed, so the form stays free to take the
    /// input from.
    fn of(form: &Form, headers: &HeaderMap, body: &'a Received) -> Claims<'a> {
        let body = match body {
            Received::Complete(b) => Some(b),
            Received::TooLarge | Received::Broken => None,
        };
        Claims::read(form, headers, body)
    }

    fn read(form: &Form, headers: &HeaderMap, body: Option<&'a Bytes>) -> Claims<'a> {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| Cow::Owned(v.to_owned()))
        };
        match form {
            Form::Envelope => match body.and_then(|b| serde_json::from_slice::<Envelope>(b).ok()) {
                Some(e) => Claims {
                    tool_call_id: e.tool_call_id,
                    run_id: e.run_id,
                    tool: e.tool,
                    envelope: Ok(e.input),
                },
                None => Claims {
                    envelope: Err(()),
                    tool_call_id: None,
                    run_id: None,
                    tool: None,
                },
            },
            Form::Mcp(call) => Claims {
                envelope: Ok(None),
                tool_call_id: call.tool_call_id.clone().map(Cow::Owned),
                run_id: call.run_id.clone().map(Cow::Owned),
                tool: Some(Cow::Owned(call.tool.clone())),
            },
            Form::Intercept { tool } => Claims {
                envelope: Ok(None),
                tool_call_id: header("x-tool-call-id"),
                run_id: header("x-run-id"),
                tool: Some(Cow::Owned(tool.clone())),
            },
        }
    }

    /// The id to echo in an error body: only ever a safe one.
    fn safe_id(&self) -> Option<ToolCallId> {
        self.tool_call_id.as_deref().and_then(ToolCallId::parse)
    }
}

impl Incoming {
    fn claims(&self) -> Claims<'_> {
        Claims::of(&self.form, &self.headers, &self.body)
    }
}

/// A rejection before any check (the sidecar is draining), echoing what the request claims.
pub fn refuse(policy: &LivePolicy, incoming: &Incoming, code: Code) -> Rejection {
    let claims = incoming.claims();
    let tool = claims.tool.as_deref().and_then(|t| policy.tool(t));
    rejection(&claims, tool, code)
}

/// A rejection found before step 6: the safe id the request carried, the tool if configured.
fn rejection(claims: &Claims, tool: Option<&Arc<LiveTool>>, code: Code) -> Rejection {
    Rejection {
        error: Error::new(code),
        tool_call_id: claims.safe_id(),
        tool: tool.map(|t| t.name.clone()),
    }
}

/// Steps 1–6. The input is moved out of `incoming` (an MCP call's arguments), not copied.
pub fn identify(
    policy: &LivePolicy,
    tokens: &Tokens,
    incoming: &mut Incoming,
) -> Result<Identified, Rejection> {
    let claims = Claims::of(&incoming.form, &incoming.headers, &incoming.body);
    let tool = claims.tool.as_deref().and_then(|t| policy.tool(t)).cloned();
    let reject = |code: Code| rejection(&claims, tool.as_ref(), code);

    // A body the client never finished sending is unreadable input; nothing in it is trusted,
    // not even an id to echo.
    let body = match &incoming.body {
        Received::Complete(body) => body,
        Received::TooLarge => return Err(reject(Code::RequestTooLarge)),
        Received::Broken => {
            return Err(Rejection {
                tool_call_id: None,
                ..reject(Code::InvalidInput)
            });
        }
    };
    // 1. Size: the tool's own limit once it is known, the global one before.
    let limit = tool
        .as_ref()
        .map_or(policy.limits.request_bytes, |t| t.limits.request_bytes);
    if body.len() as u64 > limit {
        return Err(reject(Code::RequestTooLarge));
    }
    // 2. The run token.
    let Some(token_run) = tokens.run_of(&incoming.headers) else {
        return Err(reject(Code::Unauthenticated));
    };
    // 3. The envelope is a JSON object.
    if claims.envelope.is_err() {
        return Err(reject(Code::InvalidInput));
    }
    // 4. The framework's tool_call_id, kept exactly.
    let Some(tool_call_id) = claims.safe_id() else {
        return Err(reject(Code::InvalidToolCallId));
    };
    // 5. The call belongs to the token's run.
    let run_id = match claims.run_id.as_deref().and_then(RunId::parse) {
        Some(r) if r == token_run => r,
        _ => return Err(reject(Code::RunMismatch)),
    };
    // 6. The tool is configured.
    let Some(tool) = tool.clone() else {
        return Err(reject(Code::UnknownTool));
    };
    let input = match &mut incoming.form {
        Form::Envelope => claims.envelope.ok().flatten(),
        Form::Intercept { .. } => serde_json::from_slice(body).ok(),
        Form::Mcp(call) => call.input.take(),
    };
    Ok(Identified {
        run_id,
        tool_call_id,
        tool,
        input,
    })
}

impl Identified {
    /// Steps 7–9. `run_tools` is the run's allow-list (`None`: every configured tool).
    pub fn authorize(self, run_tools: Option<&[String]>) -> Result<Admitted, Rejection> {
        let reject = |code: Code| Rejection {
            error: Error::new(code),
            tool_call_id: Some(self.tool_call_id.clone()),
            tool: Some(self.tool.name.clone()),
        };
        // 7. Allowed for this run.
        if run_tools.is_some_and(|tools| !tools.iter().any(|t| self.tool.name == t.as_str())) {
            return Err(reject(Code::Unauthorized));
        }
        // 8. Read-only.
        if !self.tool.read_only {
            return Err(reject(Code::ToolNotReadOnly));
        }
        // 9. The input is an object that satisfies the tool's schema.
        let Some(input @ Value::Object(_)) = self.input else {
            return Err(reject(Code::InvalidInput));
        };
        // Nested no deeper than limits.json_depth, so the record that holds it stays readable.
        if value_depth(&input) > self.tool.limits.json_depth {
            return Err(reject(Code::InvalidInput));
        }
        if let Some(schema) = &self.tool.schema
            && !schema.is_valid(&input)
        {
            return Err(reject(Code::InvalidInput));
        }
        Ok(Admitted {
            run_id: self.run_id,
            tool_call_id: self.tool_call_id,
            tool: self.tool,
            input,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the envelope said when it was read as a map.
    type Read = (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<Value>,
    );

    fn by_map(text: &str) -> Option<Read> {
        let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(text) else {
            return None;
        };
        let field = |m: &serde_json::Map<String, Value>, k: &str| {
            m.get(k).and_then(Value::as_str).map(str::to_string)
        };
        Some((
            field(&m, "run_id"),
            field(&m, "tool_call_id"),
            field(&m, "tool"),
            m.remove("input"),
        ))
    }

    fn by_envelope(text: &str) -> Option<Read> {
        let e = serde_json::from_str::<Envelope>(text).ok()?;
        let owned = |c: Option<Cow<'_, str>>| c.map(Cow::into_owned);
        Some((
            owned(e.run_id),
            owned(e.tool_call_id),
            owned(e.tool),
            e.input,
        ))
    }

    /// Envelope-like texts: the four keys (one of them escaped), another key, values of every
    /// kind including escaped and non-ASCII strings, repeated keys, spacing, and sometimes a
    /// byte changed.
    fn envelopes() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let key = prop::sample::select(vec![
            r#""run_id""#,
            r#""tool_call_id""#,
            r#""tool""#,
            r#""input""#,
            r#""run\u005fid""#,
            r#""in\u0070ut""#,
            r#""other""#,
            r#""""#,
        ]);
        let value = prop::sample::select(vec![
            r#""r-1""#,
            r#""c\"q\\""#,
            r#""\u00e9\ud83d\ude00""#,
            "\"\u{e9}t\u{1F600}\"",
            r#""a\/b\n""#,
            "5",
            "-0.5e3",
            "1e400",
            "true",
            "null",
            r#"{"q":"x","n":[1,2.50,{"z":null}]}"#,
            r#"{"q":"x","q":"y"}"#,
            "[ ]",
            r#"{ "a" : [ 1 , "b" ] }"#,
        ]);
        let space = prop::sample::select(vec!["", " ", "\n\t"]);
        let member = (key, space.clone(), value).prop_map(|(k, s, v)| format!("{k}:{s}{v}"));
        (
            prop::collection::vec(member, 0..6),
            space,
            any::<prop::sample::Index>(),
            prop::option::of(any::<u8>()),
        )
            .prop_map(|(members, s, at, byte)| {
                let mut text = format!("{{{s}{}{s}}}", members.join(","));
                if let Some(b) = byte {
                    let mut bytes = text.into_bytes();
                    let i = at.index(bytes.len());
                    bytes[i] = b;
                    text = String::from_utf8_lossy(&bytes).into_owned();
                }
                text
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn envelopes_read_as_the_maps_they_are(text in envelopes()) {
            proptest::prop_assert_eq!(by_envelope(&text), by_map(&text), "{}", text);
        }
    }

    #[test]
    fn the_envelope_reads_as_the_map_it_is() {
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
        for text in [
            r#"{"run_id":"r","tool_call_id":"c","tool":"t","input":{"q":"x"}}"#,
            r#"{"input":{"q":[1,{"a":null}]},"tool":"t","extra":{"k":[true]}}"#,
            r#"{"run_id":"a","run_id":"b","input":1,"input":{"z":2}}"#,
            r#"{"run_id":"a","run_id":5}"#,
            r#"{"run_id":5,"tool_call_id":["c"],"tool":{"n":"t"},"input":null}"#,
            r#"{"run\u005fid":"esc","t\u006fol":"t\n\"x"}"#,
            r#"{"run_id":"r","x":1e400}"#,
            r#"{"run_id":"r","input":1e400}"#,
            r#"{"run_id":"r"} trailing"#,
            r#"{"run_id":"r",}"#,
            r#"["run_id","r"]"#,
            r#""run_id""#,
            "null",
            "{}",
            "",
            "{\"run_id\":\"\u{e9}\u{1F600}\"}",
            &deep,
        ] {
            assert_eq!(by_envelope(text), by_map(text), "{text}");
        }
    }
}
