//! The one error type: every failure a caller can see has a stable code, an HTTP status, a
//! failure layer and a fixed message. Causes are kept for logs only.
//!
//! `status()`, `message()` and `layer()` are matches without a catch-all arm, so a new code
//! forces a decision in each. The codes and their layers are listed in `docs/api.md`.

use std::fmt;

use hyper::StatusCode;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::ToolCallId;

/// Stable error codes of the contract. `ResultTooLarge` carries the limit that was exceeded,
/// because that limit decides who is to blame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    RequestTooLarge,
    Unauthenticated,
    InvalidInput,
    InvalidToolCallId,
    RunMismatch,
    UnknownTool,
    Unauthorized,
    ToolNotReadOnly,
    /// A path or network argument outside what the tool may touch; carries the argument's role.
    PolicyDenied(Role),
    DuplicateToolCall,
    RunInactive,
    RunDeadlineExceeded,
    BudgetExhausted,
    RunCancelled,
    ToolExecutionFailed,
    ToolTimeout,
    ResultTooLarge(SizeStage),
    ProjectionFailed,
    RecordExpired,
    StoreUnavailable,
    ShuttingDown,
    /// A listener at its connection cap with a request in progress on every connection.
    Overloaded,
    Internal,
    NotFound,
    RunExists,
}

/// Where a byte limit was exceeded; it decides the failure layer of `RESULT_TOO_LARGE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SizeStage {
    Raw,
    Agent,
    Record,
    Run,
}

/// The role a tool declares for an input argument (`params`); checks dispatch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A path the call acts on.
    Path,
    /// A path the call only reads from while acting on another.
    SourcePath,
    /// A URL the tool will fetch.
    NetworkTarget,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Path, Role::SourcePath, Role::NetworkTarget];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Path => "path",
            Role::SourcePath => "source_path",
            Role::NetworkTarget => "network_target",
        }
    }
}

/// Who is to blame for a failed call (failure attribution).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    Agent,
    Workflow,
    Provider,
    Environment,
    Harness,
    Operator,
    Unknown,
}

impl Code {
    /// Every code, in contract order, `RESULT_TOO_LARGE` once per stage.
    pub const ALL: [Code; 30] = [
        Code::RequestTooLarge,
        Code::Unauthenticated,
        Code::InvalidInput,
        Code::InvalidToolCallId,
        Code::RunMismatch,
        Code::UnknownTool,
        Code::Unauthorized,
        Code::ToolNotReadOnly,
        Code::PolicyDenied(Role::Path),
        Code::PolicyDenied(Role::SourcePath),
        Code::PolicyDenied(Role::NetworkTarget),
        Code::DuplicateToolCall,
        Code::RunInactive,
        Code::RunDeadlineExceeded,
        Code::BudgetExhausted,
        Code::RunCancelled,
        Code::ToolExecutionFailed,
        Code::ToolTimeout,
        Code::ResultTooLarge(SizeStage::Raw),
        Code::ResultTooLarge(SizeStage::Agent),
        Code::ResultTooLarge(SizeStage::Record),
        Code::ResultTooLarge(SizeStage::Run),
        Code::ProjectionFailed,
        Code::RecordExpired,
        Code::StoreUnavailable,
        Code::ShuttingDown,
        Code::Overloaded,
        Code::Internal,
        Code::NotFound,
        Code::RunExists,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::RequestTooLarge => "REQUEST_TOO_LARGE",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::InvalidInput => "INVALID_INPUT",
            Code::InvalidToolCallId => "INVALID_TOOL_CALL_ID",
            Code::RunMismatch => "RUN_MISMATCH",
            Code::UnknownTool => "UNKNOWN_TOOL",
            Code::Unauthorized => "UNAUTHORIZED",
            Code::ToolNotReadOnly => "TOOL_NOT_READ_ONLY",
            Code::PolicyDenied(_) => "POLICY_DENIED",
            Code::DuplicateToolCall => "DUPLICATE_TOOL_CALL",
            Code::RunInactive => "RUN_INACTIVE",
            Code::RunDeadlineExceeded => "RUN_DEADLINE_EXCEEDED",
            Code::BudgetExhausted => "BUDGET_EXHAUSTED",
            Code::RunCancelled => "RUN_CANCELLED",
            Code::ToolExecutionFailed => "TOOL_EXECUTION_FAILED",
            Code::ToolTimeout => "TOOL_TIMEOUT",
            Code::ResultTooLarge(_) => "RESULT_TOO_LARGE",
            Code::ProjectionFailed => "PROJECTION_FAILED",
            Code::RecordExpired => "RECORD_EXPIRED",
            Code::StoreUnavailable => "STORE_UNAVAILABLE",
            Code::ShuttingDown => "SHUTTING_DOWN",
            Code::Overloaded => "OVERLOADED",
            Code::Internal => "INTERNAL",
            Code::NotFound => "NOT_FOUND",
            Code::RunExists => "RUN_EXISTS",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            Code::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::InvalidInput | Code::InvalidToolCallId => StatusCode::BAD_REQUEST,
            Code::RunMismatch
            | Code::Unauthorized
            | Code::ToolNotReadOnly
            | Code::PolicyDenied(_) => StatusCode::FORBIDDEN,
            Code::UnknownTool | Code::NotFound => StatusCode::NOT_FOUND,
            Code::DuplicateToolCall
            | Code::RunInactive
            | Code::RunDeadlineExceeded
            | Code::RunCancelled
            | Code::RunExists => StatusCode::CONFLICT,
            Code::BudgetExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::ToolExecutionFailed | Code::ResultTooLarge(_) | Code::ProjectionFailed => {
                StatusCode::BAD_GATEWAY
            }
            Code::ToolTimeout => StatusCode::GATEWAY_TIMEOUT,
            Code::RecordExpired
            | Code::StoreUnavailable
            | Code::ShuttingDown
            | Code::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The fixed sentence the caller sees. Never carries payload, hosts or keys.
    pub fn message(self) -> &'static str {
        match self {
            Code::RequestTooLarge => "The request body exceeds the size limit for this tool.",
            Code::Unauthenticated => "A valid bearer token is required.",
            Code::InvalidInput => "The request body or tool input is not valid.",
            Code::InvalidToolCallId => "The tool_call_id is missing, blank or not a safe id.",
            Code::RunMismatch => "The run id does not match the run of the token.",
            Code::UnknownTool => "The tool is not configured.",
            Code::Unauthorized => "The tool is not allowed for this run.",
            Code::ToolNotReadOnly => "The tool is not declared read-only.",
            Code::PolicyDenied(_) => {
                "A path or network argument is outside what the tool may touch."
            }
            Code::DuplicateToolCall => "This run already has a call with this tool_call_id.",
            Code::RunInactive => "The run is unknown, ended or cancelled.",
            Code::RunDeadlineExceeded => "The run deadline has passed.",
            Code::BudgetExhausted => "The run's call budget is used up.",
            Code::RunCancelled => "The run was cancelled while the call was in flight.",
            Code::ToolExecutionFailed => "The tool failed or returned an invalid response.",
            Code::ToolTimeout => "The tool did not answer in time.",
            Code::ResultTooLarge(_) => "The result exceeds a size limit and was not returned.",
            Code::ProjectionFailed => "The tool result could not be projected.",
            Code::RecordExpired => "The call record expired before the call finished.",
            Code::StoreUnavailable => "The record store is unavailable.",
            Code::ShuttingDown => "The sidecar is shutting down.",
            Code::Overloaded => "Every connection to the sidecar is busy; retry shortly.",
            Code::Internal => "An internal error occurred.",
            Code::NotFound => "Not found.",
            Code::RunExists => "A run with this id already exists.",
        }
    }

    /// The one mapping from a code to its failure layer, used by metrics and attribution alike.
    pub fn layer(self) -> Layer {
        match self {
            Code::RequestTooLarge
            | Code::Unauthenticated
            | Code::InvalidInput
            | Code::InvalidToolCallId
            | Code::RunMismatch
            | Code::UnknownTool
            | Code::Unauthorized
            | Code::ToolNotReadOnly
            | Code::PolicyDenied(_)
            | Code::DuplicateToolCall => Layer::Agent,
            Code::RunInactive | Code::RunDeadlineExceeded | Code::BudgetExhausted => {
                Layer::Workflow
            }
            Code::RunCancelled | Code::ShuttingDown => Layer::Operator,
            Code::ToolExecutionFailed | Code::ToolTimeout => Layer::Provider,
            Code::ResultTooLarge(stage) => match stage {
                SizeStage::Raw => Layer::Provider,
                SizeStage::Agent | SizeStage::Record => Layer::Harness,
                SizeStage::Run => Layer::Workflow,
            },
            Code::ProjectionFailed | Code::Internal => Layer::Harness,
            Code::RecordExpired | Code::StoreUnavailable | Code::Overloaded => Layer::Environment,
            Code::NotFound | Code::RunExists => Layer::Unknown,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A code as a record keeps it: the wire name only. A stored `RESULT_TOO_LARGE` does not say
/// which limit it was, so reading a record back never invents a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeName(&'static str);

impl CodeName {
    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// The HTTP status and fixed message are the same for every stage of a code, so a name
    /// alone decides them.
    fn any_code(self) -> Code {
        Code::ALL
            .into_iter()
            .find(|c| c.as_str() == self.0)
            .unwrap_or(Code::Internal)
    }

    pub fn status(self) -> StatusCode {
        self.any_code().status()
    }

    pub fn message(self) -> &'static str {
        self.any_code().message()
    }

    /// A known wire name, or `None`.
    pub fn parse(s: &str) -> Option<CodeName> {
        Code::ALL
            .into_iter()
            .map(Code::as_str)
            .find(|name| *name == s)
            .map(CodeName)
    }
}

impl From<Code> for CodeName {
    fn from(code: Code) -> CodeName {
        CodeName(code.as_str())
    }
}

impl PartialEq<Code> for CodeName {
    fn eq(&self, code: &Code) -> bool {
        self.0 == code.as_str()
    }
}

impl fmt::Display for CodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for CodeName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for CodeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CodeName, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        CodeName::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown error code {s:?}")))
    }
}

impl SizeStage {
    pub const ALL: [SizeStage; 4] = [
        SizeStage::Raw,
        SizeStage::Agent,
        SizeStage::Record,
        SizeStage::Run,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SizeStage::Raw => "raw",
            SizeStage::Agent => "agent",
            SizeStage::Record => "record",
            SizeStage::Run => "run",
        }
    }
}

impl Layer {
    /// Every layer, in report order.
    pub const ALL: [Layer; 7] = [
        Layer::Agent,
        Layer::Workflow,
        Layer::Provider,
        Layer::Environment,
        Layer::Harness,
        Layer::Operator,
        Layer::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Agent => "AGENT",
            Layer::Workflow => "WORKFLOW",
            Layer::Provider => "PROVIDER",
            Layer::Environment => "ENVIRONMENT",
            Layer::Harness => "HARNESS",
            Layer::Operator => "OPERATOR",
            Layer::Unknown => "UNKNOWN",
        }
    }
}

/// A failure with its code and, for logs only, its cause.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {cause}")]
pub struct Error {
    pub code: Code,
    /// Operator-facing detail. Logged, never sent to the agent.
    pub cause: String,
}

impl Error {
    pub fn new(code: Code) -> Error {
        Error {
            code,
            cause: String::new(),
        }
    }

    pub fn with_cause(code: Code, cause: impl fmt::Display) -> Error {
        Error {
            code,
            cause: cause.to_string(),
        }
    }

    pub fn too_large(stage: SizeStage) -> Error {
        Error::with_cause(
            Code::ResultTooLarge(stage),
            format_args!("{} limit exceeded", stage.as_str()),
        )
    }

    pub fn store(cause: impl fmt::Display) -> Error {
        Error::with_cause(Code::StoreUnavailable, cause)
    }

    pub fn internal(cause: impl fmt::Display) -> Error {
        Error::with_cause(Code::Internal, cause)
    }

    pub fn layer(&self) -> Layer {
        self.code.layer()
    }
}

impl From<Code> for Error {
    fn from(code: Code) -> Error {
        Error::new(code)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error body every listener answers with: the code, its fixed sentence, and the call's id
/// when it is a safe one (else `null`).
pub fn body(tool_call_id: Option<&ToolCallId>, code: Code) -> Vec<u8> {
    let id = tool_call_id.map(ToolCallId::as_str);
    serde_json::to_vec(&serde_json::json!({
        "status": "ERROR",
        "tool_call_id": id,
        "error": {"code": code.as_str(), "message": code.message()},
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_messages_are_plain() {
        for code in Code::ALL {
            assert_eq!(CodeName::parse(code.as_str()), Some(CodeName::from(code)));
            assert!(!code.message().is_empty());
        }
        assert_eq!(CodeName::parse("NOPE"), None);
    }

    #[test]
    fn result_too_large_layer_depends_on_stage() {
        let layer = |s| Code::ResultTooLarge(s).layer();
        assert_eq!(layer(SizeStage::Raw), Layer::Provider);
        assert_eq!(layer(SizeStage::Agent), Layer::Harness);
        assert_eq!(layer(SizeStage::Record), Layer::Harness);
        assert_eq!(layer(SizeStage::Run), Layer::Workflow);
    }

    #[test]
    fn statuses_follow_the_contract() {
        assert_eq!(Code::BudgetExhausted.status().as_u16(), 429);
        assert_eq!(Code::RequestTooLarge.status().as_u16(), 413);
        assert_eq!(Code::ToolTimeout.status().as_u16(), 504);
        assert_eq!(Code::RecordExpired.status().as_u16(), 503);
        assert_eq!(Code::Internal.status().as_u16(), 500);
    }
}
