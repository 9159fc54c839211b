//! The canonical record of one call, its lifecycle rules, and the facts filter.
//!
//! A record is one compact JSON string. Its lifecycle is PROJECTING → READY | ERROR and nothing
//! else; the shapes each state allows are checked here, by the store, whoever the caller is.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock;
use crate::error::{CodeName, Error, Result, SizeStage};
use crate::evidence::{SealInput, Sealer, sha256_hex};
use crate::ids::{RunId, ToolCallId, ToolName};

/// Whether a result holds evidence. `Error` only appears on ERROR records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Evidence {
    #[serde(rename = "EVIDENCE_FOUND")]
    Found,
    #[serde(rename = "NO_EVIDENCE")]
    None,
    #[serde(rename = "ERROR")]
    Error,
}

impl Evidence {
    pub const ALL: [Evidence; 3] = [Evidence::Found, Evidence::None, Evidence::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::Found => "EVIDENCE_FOUND",
            Evidence::None => "NO_EVIDENCE",
            Evidence::Error => "ERROR",
        }
    }
}

/// Lifecycle state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Projecting,
    Ready,
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Projecting => "PROJECTING",
            Status::Ready => "READY",
            Status::Error => "ERROR",
        }
    }
}

/// The canonical record of one call, serialized compactly as one JSON string, fields in the
/// contract's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub schema: u32,
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
    pub tool: ToolName,
    pub status: Status,
    pub evidence_status: Option<Evidence>,
    pub request: Value,
    /// The input as the agent sent it, when parameter roles rewrote an argument; else `null`.
    pub agent_input: Value,
    pub raw_response: Value,
    pub agent_result: Value,
    pub error_code: Option<CodeName>,
    pub upstream_status: Option<u16>,
    pub created_at: String,
    pub updated_at: String,
    pub duration_ms: Option<u64>,
    /// Lowercase hex SHA-256 of the compact text of `request`, `raw_response` and
    /// `agent_result` as they stand in the record (`None` where the part is null), and the seal
    /// over them: set when the store finalizes the record, `None` while PROJECTING. Records
    /// written before evidence existed lack them (and are never facts).
    #[serde(default)]
    pub request_sha256: Option<String>,
    #[serde(default)]
    pub raw_sha256: Option<String>,
    #[serde(default)]
    pub result_sha256: Option<String>,
    #[serde(default)]
    pub seal: Option<String>,
    /// The raw response as compact JSON, the one form the call path carries a record's parts
    /// in: written in place of `raw_response` (which the call path leaves null). A record read
    /// back has `None` here and `raw_response` parsed; a record built in code may use either.
    #[serde(skip)]
    pub raw_json: Option<String>,
    /// The agent result as compact JSON, written in place of `agent_result` (then null), as
    /// `raw_json` is.
    #[serde(skip)]
    pub agent_json: Option<String>,
    /// `,"request":…,"agent_input":…` as written, and where the request's JSON ends in it;
    /// kept by [`Record::keep_request_json`] once both are final, so that the PROJECTING
    /// record, the final record and the tool's request body serialize the input once between
    /// them. A record read back has `None` here; a record built with `..` from one that kept
    /// it must not change `request` or `agent_input`.
    #[serde(skip)]
    pub request_json: Option<(String, usize)>,
}

impl Record {
    /// A fresh PROJECTING record.
    pub fn projecting(
        run_id: RunId,
        tool_call_id: ToolCallId,
        tool: ToolName,
        request: Value,
        now: u64,
    ) -> Record {
        let at = clock::rfc3339(now);
        Record {
            schema: 1,
            run_id,
            tool_call_id,
            tool,
            status: Status::Projecting,
            evidence_status: None,
            request,
            agent_input: Value::Null,
            raw_response: Value::Null,
            agent_result: Value::Null,
            error_code: None,
            upstream_status: None,
            created_at: at.clone(),
            updated_at: at,
            duration_ms: None,
            request_sha256: None,
            raw_sha256: None,
            result_sha256: None,
            seal: None,
            raw_json: None,
            agent_json: None,
            request_json: None,
        }
    }

    /// Serializes `request` and `agent_input` once, for every later write of this record and
    /// for [`Record::request_text`]. Called once they are final: neither may change after.
    pub fn keep_request_json(&mut self) -> Result<()> {
        let mut out = String::with_capacity(64);
        let mut scratch = Vec::with_capacity(64);
        let w = &mut Fields {
            out: &mut out,
            scratch: &mut scratch,
        };
        w.value(REQUEST, &self.request)?;
        let end = w.out.len();
        w.value(AGENT_INPUT, &self.agent_input)?;
        self.request_json = Some((out, end));
        Ok(())
    }

    /// The request's compact JSON, when [`Record::keep_request_json`] has kept it.
    pub fn request_text(&self) -> Option<&str> {
        let (kept, end) = self.request_json.as_ref()?;
        kept.get(REQUEST.len()..*end)
    }

    /// The compact JSON form whose byte length every size limit counts, with the digests and
    /// seal the record holds (none while PROJECTING).
    pub fn to_json(&self) -> Result<String> {
        Ok(self.write_json(None)?.0)
    }

    pub fn from_json(s: &str) -> Result<Record> {
        serde_json::from_str(s).map_err(|e| Error::internal(format!("corrupt record: {e}")))
    }

    /// The compact JSON of this record, and where in it lie the fields that its stripped form
    /// replaces. Written field by field, in the order and form of the derived `Serialize`, so
    /// that the raw response can be spliced in as it was kept. With a sealer, the digests are
    /// taken from the parts' texts as just written (nothing is serialized twice) and the record
    /// is sealed; without one, the digests and seal are written as the record holds them.
    fn write_json(&self, sealer: Option<&Sealer>) -> Result<(String, Marks)> {
        let raw_len = self.raw_json.as_ref().map_or(0, String::len)
            + self.agent_json.as_ref().map_or(0, String::len);
        let mut out = String::with_capacity(768 + raw_len);
        // A tree not kept as text (the input of a record made without `keep_request_json`, a
        // raw response or result of a record read back) is serialized here and checked as
        // UTF-8 on its own; the texts kept are appended as they are. A call's records keep
        // theirs, so this is allocated only when used.
        let mut scratch = Vec::new();
        let w = &mut Fields {
            out: &mut out,
            scratch: &mut scratch,
        };
        w.number("{\"schema\":", Some(u64::from(self.schema)));
        w.text(",\"run_id\":", Some(self.run_id.as_str()));
        w.text(",\"tool_call_id\":", Some(self.tool_call_id.as_str()));
        w.text(",\"tool\":", Some(self.tool.as_str()));
        let status = w.out.len();
        w.text(",\"status\":", Some(self.status.as_str()));
        w.text(
            ",\"evidence_status\":",
            self.evidence_status.map(Evidence::as_str),
        );
        let request = w.out.len();
        let agent_input = match &self.request_json {
            Some((kept, end)) => {
                w.out.push_str(kept);
                request + end
            }
            None => {
                w.value(REQUEST, &self.request)?;
                let at = w.out.len();
                w.value(AGENT_INPUT, &self.agent_input)?;
                at
            }
        };
        let raw_response = w.out.len();
        match &self.raw_json {
            Some(raw) => {
                w.out.push_str(RAW_RESPONSE);
                w.out.push_str(raw);
            }
            None => w.value(RAW_RESPONSE, &self.raw_response)?,
        }
        let agent_result = w.out.len();
        match &self.agent_json {
            Some(result) => {
                w.out.push_str(AGENT_RESULT);
                w.out.push_str(result);
            }
            None => w.value(AGENT_RESULT, &self.agent_result)?,
        }
        let error_code = w.out.len();
        w.text(",\"error_code\":", self.error_code.map(CodeName::as_str));
        let upstream_status = w.out.len();
        w.number(",\"upstream_status\":", self.upstream_status.map(u64::from));
        w.text(",\"created_at\":", Some(&self.created_at));
        w.text(",\"updated_at\":", Some(&self.updated_at));
        w.number(",\"duration_ms\":", self.duration_ms);
        let digests = w.out.len();
        let mut marks = Marks {
            status,
            request,
            raw_response,
            upstream_status,
            digests,
            fallback: None,
        };
        match sealer {
            None => write_digests(
                &mut out,
                [
                    self.request_sha256.as_deref(),
                    self.raw_sha256.as_deref(),
                    self.result_sha256.as_deref(),
                ],
                self.seal.as_deref(),
            ),
            Some(sealer) => {
                let part =
                    |from: usize, name: &str, to: usize| digest_of(&out[from + name.len()..to]);
                let request_sha256 = part(request, REQUEST, agent_input);
                let raw_sha256 = part(raw_response, RAW_RESPONSE, agent_result);
                let result_sha256 = part(agent_result, AGENT_RESULT, error_code);
                let input = SealInput {
                    run_id: self.run_id.as_str(),
                    tool_call_id: self.tool_call_id.as_str(),
                    tool: self.tool.as_str(),
                    status: self.status.as_str(),
                    evidence_status: self.evidence_status.map_or("null", Evidence::as_str),
                    request_sha256: request_sha256.as_deref(),
                    raw_sha256: raw_sha256.as_deref(),
                    result_sha256: result_sha256.as_deref(),
                };
                let seal = sealer.seal(&input);
                write_digests(
                    &mut out,
                    [
                        request_sha256.as_deref(),
                        raw_sha256.as_deref(),
                        result_sha256.as_deref(),
                    ],
                    Some(&seal),
                );
                marks.fallback = Some(Fallback { request_sha256 });
            }
        }
        Ok((out, marks))
    }

    /// The seal input of this record as read back, its digests recomputed from its parts (the
    /// stored texts are compact JSON as serde writes it, so serializing the parsed parts gives
    /// them back byte for byte). The ids are the ones the record was read under.
    fn recomputed<'a>(
        &'a self,
        run_id: &'a RunId,
        tool_call_id: &'a ToolCallId,
        digests: &'a [Option<String>; 3],
    ) -> SealInput<'a> {
        SealInput {
            run_id: run_id.as_str(),
            tool_call_id: tool_call_id.as_str(),
            tool: self.tool.as_str(),
            status: self.status.as_str(),
            evidence_status: self.evidence_status.map_or("null", Evidence::as_str),
            request_sha256: digests[0].as_deref(),
            raw_sha256: digests[1].as_deref(),
            result_sha256: digests[2].as_deref(),
        }
    }

    /// Whether this record, read under `run_id` and `tool_call_id`, is what toolgate sealed:
    /// its digests match its parts and its seal matches them (in constant time).
    pub fn seal_holds(&self, run_id: &RunId, tool_call_id: &ToolCallId, sealer: &Sealer) -> bool {
        let Some(seal) = &self.seal else {
            return false;
        };
        let digests = [&self.request, &self.raw_response, &self.agent_result]
            .map(|part| serde_json::to_string(part).ok().and_then(|t| digest_of(&t)));
        let stored = [&self.request_sha256, &self.raw_sha256, &self.result_sha256];
        if digests.iter().zip(stored).any(|(d, s)| d != s) {
            return false;
        }
        sealer.check(&self.recomputed(run_id, tool_call_id, &digests), seal)
    }
}

const RAW_RESPONSE: &str = ",\"raw_response\":";
const AGENT_RESULT: &str = ",\"agent_result\":";

/// The digest of a part's compact text; `None` for `null`.
fn digest_of(text: &str) -> Option<String> {
    (text != "null").then(|| sha256_hex(text.as_bytes()))
}

/// `,"request_sha256":…,"raw_sha256":…,"result_sha256":…,"seal":…}`: the end of a record.
fn write_digests(out: &mut String, digests: [Option<&str>; 3], seal: Option<&str>) {
    for (name, value) in [
        ",\"request_sha256\":",
        ",\"raw_sha256\":",
        ",\"result_sha256\":",
    ]
    .into_iter()
    .zip(digests)
    {
        out.push_str(name);
        push_opt(out, value);
    }
    out.push_str(",\"seal\":");
    push_opt(out, seal);
    out.push('}');
}

/// A hex string or `null` (hex needs no escaping).
fn push_opt(out: &mut String, value: Option<&str>) {
    match value {
        Some(v) => {
            out.push('"');
            out.push_str(v);
            out.push('"');
        }
        None => out.push_str("null"),
    }
}

const REQUEST: &str = ",\"request\":";
const AGENT_INPUT: &str = ",\"agent_input\":";

/// Where, in a record's JSON, the fields that its stripped form replaces begin: the byte offset
/// of the `,"name":` before `status`, `request`, `raw_response`, `upstream_status` and
/// `request_sha256`; and, for a sealed record, what the stripped form's own seal covers.
#[derive(Debug, Clone)]
struct Marks {
    status: usize,
    request: usize,
    raw_response: usize,
    upstream_status: usize,
    digests: usize,
    fallback: Option<Fallback>,
}

/// What the seal of a sealed record's stripped form covers besides the record's ids and its
/// fixed state: kept, so the seal is made only when the stripped form is (most records never
/// need it).
#[derive(Debug, Clone)]
struct Fallback {
    request_sha256: Option<String>,
}

impl Marks {
    /// What the stripped form of `record` ends with: its own digests and seal, when the record
    /// is sealed.
    fn tail(&self, record: &Record, sealer: &Sealer) -> String {
        let Some(f) = &self.fallback else {
            return UNSEALED_TAIL.to_string();
        };
        // The stripped ERROR/RESULT_TOO_LARGE form keeps the request and drops the rest.
        let stripped = SealInput {
            run_id: record.run_id.as_str(),
            tool_call_id: record.tool_call_id.as_str(),
            tool: record.tool.as_str(),
            status: Status::Error.as_str(),
            evidence_status: Evidence::Error.as_str(),
            request_sha256: f.request_sha256.as_deref(),
            raw_sha256: None,
            result_sha256: None,
        };
        let mut tail = String::with_capacity(192);
        write_digests(
            &mut tail,
            [f.request_sha256.as_deref(), None, None],
            Some(&sealer.seal(&stripped)),
        );
        tail
    }
}

/// What a stripped record has in place of its `status` and `evidence_status`.
pub const STRIPPED_STATE: &str = r#","status":"ERROR","evidence_status":"ERROR""#;
/// What a stripped record has in place of its `raw_response`, `agent_result` and `error_code`.
pub const STRIPPED_RESULT: &str =
    r#","raw_response":null,"agent_result":null,"error_code":"RESULT_TOO_LARGE""#;

/// The record whose JSON is `full`, turned into an `ERROR/RESULT_TOO_LARGE` without raw
/// response or agent result: spliced from `full`, so nothing is serialized again and the
/// large parts are not copied. The Redis finalize script splices the same way, from the same
/// marks ([`FinalBody::fallback_marks`]).
fn stripped(full: &str, m: &Marks, tail: &str) -> String {
    let mut out = String::with_capacity(
        m.status
            + STRIPPED_STATE.len()
            + (m.raw_response - m.request)
            + STRIPPED_RESULT.len()
            + (m.digests - m.upstream_status)
            + tail.len(),
    );
    out.push_str(&full[..m.status]);
    out.push_str(STRIPPED_STATE);
    out.push_str(&full[m.request..m.raw_response]);
    out.push_str(STRIPPED_RESULT);
    out.push_str(&full[m.upstream_status..m.digests]);
    out.push_str(tail);
    out
}

/// The end of a stripped record that was never sealed (only tests build one).
const UNSEALED_TAIL: &str =
    r#","request_sha256":null,"raw_sha256":null,"result_sha256":null,"seal":null}"#;

/// Where [`Record::write_json`] writes: the text, and a buffer to serialize a tree in. Each
/// entry is `name` (with the punctuation before the value) and the value as compact JSON, as
/// serde_json writes it.
struct Fields<'a> {
    out: &'a mut String,
    scratch: &'a mut Vec<u8>,
}

impl Fields<'_> {
    fn text(&mut self, name: &str, value: Option<&str>) {
        self.out.push_str(name);
        match value {
            Some(v) => crate::log::push_json_string(self.out, v),
            None => self.out.push_str("null"),
        }
    }

    fn number(&mut self, name: &str, value: Option<u64>) {
        self.out.push_str(name);
        match value {
            Some(v) => self.out.push_str(itoa::Buffer::new().format(v)),
            None => self.out.push_str("null"),
        }
    }

    /// A tree, serialized into the scratch buffer and checked as UTF-8 there.
    fn value(&mut self, name: &str, value: &Value) -> Result<()> {
        self.out.push_str(name);
        if value.is_null() {
            self.out.push_str("null");
            return Ok(());
        }
        self.scratch.clear();
        serde_json::to_writer(&mut *self.scratch, value).map_err(Error::internal)?;
        self.out
            .push_str(std::str::from_utf8(self.scratch).map_err(Error::internal)?);
        Ok(())
    }
}

/// Checks that a record is a valid new PROJECTING record.
pub fn check_projecting(r: &Record) -> Result<()> {
    let ok = r.status == Status::Projecting
        && r.evidence_status.is_none()
        && !has_result(r)
        && r.error_code.is_none();
    if ok {
        Ok(())
    } else {
        Err(Error::internal(
            "reserve needs a well-formed PROJECTING record",
        ))
    }
}

/// Whether a record carries an agent result, as a tree or as text.
fn has_result(r: &Record) -> bool {
    !r.agent_result.is_null() || r.agent_json.is_some()
}

/// Checks the shape of a final record: READY has evidence and a result; ERROR has a code,
/// `evidence_status: ERROR` and no agent result.
pub fn check_final(r: &Record) -> Result<()> {
    let ok = match r.status {
        Status::Ready => {
            matches!(r.evidence_status, Some(Evidence::Found | Evidence::None))
                && r.error_code.is_none()
                && has_result(r)
        }
        Status::Error => {
            r.evidence_status == Some(Evidence::Error) && !has_result(r) && r.error_code.is_some()
        }
        Status::Projecting => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "invalid transition PROJECTING -> {:?}",
            r.status
        )))
    }
}

/// What finalize wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalized {
    /// The record as given.
    Written,
    /// A stripped `ERROR/RESULT_TOO_LARGE` record, because the record or the run was too large.
    TooLarge(SizeStage),
}

/// A final record's body: the full record, or the stripped fallback (and the stage) when the
/// full one is over the record limit. The fallback for a run over its byte budget is made only
/// when it is needed: by [`FinalBody::run_fallback`], or by the Redis finalize script from
/// [`FinalBody::fallback_marks`].
#[derive(Debug)]
pub struct FinalBody {
    pub text: String,
    pub replaced: Option<SizeStage>,
    /// Where the fields of `text` lie, while it is the full record.
    marks: Option<Marks>,
}

impl FinalBody {
    /// The sealed body of a final record (see [`Record::write_json`]).
    pub fn new(record: &Record, record_bytes: u64, sealer: &Sealer) -> Result<FinalBody> {
        check_final(record)?;
        let (full, marks) = record.write_json(Some(sealer))?;
        Ok(if full.len() as u64 > record_bytes {
            FinalBody {
                text: stripped(&full, &marks, &marks.tail(record, sealer)),
                replaced: Some(SizeStage::Record),
                marks: None,
            }
        } else {
            FinalBody {
                text: full,
                replaced: None,
                marks: Some(marks),
            }
        })
    }

    /// The bytes the body adds to the run when it is written.
    pub fn size(&self) -> u64 {
        self.text.len() as u64
    }

    /// The outcome when `text` was written.
    pub fn written(&self) -> Finalized {
        match self.replaced {
            Some(stage) => Finalized::TooLarge(stage),
            None => Finalized::Written,
        }
    }

    /// The fallback written when the run's byte budget cannot take the body: `record` (the one
    /// this body was made of) stripped of its raw response and result, sealed with `sealer` (the
    /// one that sealed it).
    pub fn run_fallback(&self, record: &Record, sealer: &Sealer) -> String {
        match &self.marks {
            Some(marks) => stripped(&self.text, marks, &marks.tail(record, sealer)),
            None => self.text.clone(),
        }
    }

    /// The byte offsets [`stripped`] splices `text` at, as five decimal numbers separated by
    /// spaces (the `,` before `status`, `request`, `raw_response`, `upstream_status` and
    /// `request_sha256`); empty when `text` is stripped already and is its own fallback.
    pub fn fallback_marks(&self) -> String {
        let Some(m) = &self.marks else {
            return String::new();
        };
        let mut out = String::with_capacity(5 * 6);
        let mut n = itoa::Buffer::new();
        for (i, at) in [
            m.status,
            m.request,
            m.raw_response,
            m.upstream_status,
            m.digests,
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(n.format(at));
        }
        out
    }

    /// What the stripped fallback of `record` (the one this body was made of) ends with in
    /// place of the full record's digests and seal: its own, sealed with `sealer` (empty when
    /// `text` is stripped already).
    pub fn fallback_tail(&self, record: &Record, sealer: &Sealer) -> String {
        self.marks
            .as_ref()
            .map_or_else(String::new, |m| m.tail(record, sealer))
    }
}

/// One entry of a run's progress list: the id, and its record if it still exists.
pub type ProgressEntry = (ToolCallId, Option<Record>);

/// One fact: a READY record of the run, as the harness sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fact {
    pub tool_call_id: ToolCallId,
    pub tool: ToolName,
    pub evidence_status: Evidence,
    pub result: Value,
    /// What a signed statement adds to a fact: the record's digests and times.
    #[serde(skip)]
    pub request_sha256: Option<String>,
    #[serde(skip)]
    pub raw_sha256: Option<String>,
    #[serde(skip)]
    pub result_sha256: Option<String>,
    #[serde(skip)]
    pub created_at: String,
    #[serde(skip)]
    pub updated_at: String,
}

/// The facts projection of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Facts {
    pub run_id: RunId,
    pub facts: Vec<Fact>,
    pub excluded: u64,
    /// How many of the excluded failed their seal.
    pub tampered: u64,
    /// Their ids, for the log.
    #[serde(skip)]
    pub tampered_ids: Vec<ToolCallId>,
}

/// Keeps only the progress entries that exist, are READY, belong to this run and hold their
/// seal. A record that exists but fails its seal (changed in the store, copied from another
/// key, written without one) is excluded and counted as tampered; a missing record, an ERROR
/// and a repeated id are only excluded.
pub fn facts(run_id: &RunId, entries: Vec<ProgressEntry>, sealer: &Sealer) -> Facts {
    let mut out = Facts {
        run_id: run_id.clone(),
        facts: Vec::new(),
        excluded: 0,
        tampered: 0,
        tampered_ids: Vec::new(),
    };
    let mut seen = std::collections::HashSet::new();
    for (id, record) in entries {
        let Some(record) = record else {
            out.excluded += 1;
            continue;
        };
        if !record.seal_holds(run_id, &id, sealer) {
            out.excluded += 1;
            out.tampered += 1;
            out.tampered_ids.push(id);
            continue;
        }
        let (Status::Ready, Some(evidence)) = (record.status, record.evidence_status) else {
            out.excluded += 1;
            continue;
        };
        if !seen.insert(id.clone()) {
            out.excluded += 1;
            continue;
        }
        out.facts.push(Fact {
            tool_call_id: id,
            tool: record.tool,
            evidence_status: evidence,
            result: record.agent_result,
            request_sha256: record.request_sha256,
            raw_sha256: record.raw_sha256,
            result_sha256: record.result_sha256,
            created_at: record.created_at,
            updated_at: record.updated_at,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use serde_json::json;

    fn ids(run: &str, id: &str) -> (RunId, ToolCallId, ToolName) {
        (
            RunId::parse(run).unwrap(),
            ToolCallId::parse(id).unwrap(),
            ToolName::parse("search").unwrap(),
        )
    }

    fn sealer() -> Sealer {
        Sealer::derive(b"the record tests' run-token key")
    }

    /// A record as the store would hold it once finalized: sealed, read back.
    fn sealed(r: &Record) -> Record {
        Record::from_json(&FinalBody::new(r, u64::MAX, &sealer()).unwrap().text).unwrap()
    }

    fn ready(run: &str, id: &str) -> Record {
        let (run, id, tool) = ids(run, id);
        let mut r = Record::projecting(run, id, tool, json!({"q": "x"}), 0);
        r.status = Status::Ready;
        r.evidence_status = Some(Evidence::Found);
        r.agent_result = json!({"item": 1});
        r
    }

    #[test]
    fn record_serializes_in_contract_order() {
        let (run, id, _) = ids("r", "c");
        let s = Record::projecting(
            run,
            id,
            ToolName::parse("t").unwrap(),
            json!({"b": 1, "a": "é"}),
            0,
        )
        .to_json()
        .unwrap();
        assert!(s.starts_with(r#"{"schema":1,"run_id":"r","tool_call_id":"c","tool":"t","status":"PROJECTING","evidence_status":null,"request":{"b":1,"a":"é"},"agent_input":null,"raw_response":null"#), "{s}");
    }

    #[test]
    fn a_kept_request_is_written_as_it_would_be_serialized() {
        let inputs = [
            (json!({"q": "x"}), Value::Null),
            (
                json!({"b": 1, "a": "é\u{1}\"", "n": [1.5, null, {"z": true}]}),
                json!({"b": 2}),
            ),
            // A key like the field that follows the request.
            (
                json!({"x": {"a": 1, "agent_input": 2}}),
                json!({"agent_input": {"agent_input": 3}}),
            ),
            (json!([]), json!("s")),
        ];
        for (request, agent_input) in inputs {
            let mut r = ready("r", "c");
            r.request = request.clone();
            r.agent_input = agent_input;
            let mut kept = r.clone();
            assert_eq!(kept.request_text(), None);
            kept.keep_request_json().unwrap();
            assert_eq!(
                kept.request_text(),
                Some(serde_json::to_string(&request).unwrap().as_str())
            );
            assert_eq!(kept.to_json().unwrap(), r.to_json().unwrap());
            assert_eq!(kept.to_json().unwrap(), serde_json::to_string(&r).unwrap());
            let (full, marks) = kept.write_json(None).unwrap();
            let (want, want_marks) = r.write_json(None).unwrap();
            assert_eq!(full, want);
            assert_eq!(
                super::stripped(&full, &marks, &marks.tail(&kept, &sealer())),
                super::stripped(&want, &want_marks, &want_marks.tail(&r, &sealer()))
            );
        }
    }

    #[test]
    fn written_json_is_the_derived_serialization() {
        let text = r#"{ "results" : [ {"t": "é\u00e9\"\/", "n": 1.50, "big": 18446744073709551616}, null ] }"#;
        let mut r = ready("r", "c");
        r.raw_response = serde_json::from_str(text).unwrap();
        r.agent_input = json!({"q": "\u{1}é"});
        r.upstream_status = Some(200);
        r.duration_ms = Some(3);
        assert_eq!(r.to_json().unwrap(), serde_json::to_string(&r).unwrap());

        let spliced = Record {
            raw_json: Some(crate::compact::compact(text.as_bytes()).unwrap().json),
            agent_json: Some(serde_json::to_string(&r.agent_result).unwrap()),
            agent_result: Value::Null,
            ..r.clone()
        };
        assert!(check_final(&spliced).is_ok());
        assert_eq!(spliced.to_json().unwrap(), r.to_json().unwrap());

        let stripped = Record {
            status: Status::Error,
            evidence_status: Some(Evidence::Error),
            raw_response: Value::Null,
            agent_result: Value::Null,
            error_code: Some(Code::ResultTooLarge(SizeStage::Record).into()),
            ..r.clone()
        };
        let want = serde_json::to_string(&stripped).unwrap();
        let strip = |r: &Record| {
            let (full, marks) = r.write_json(None).unwrap();
            super::stripped(&full, &marks, &marks.tail(r, &sealer()))
        };
        assert_eq!(strip(&r), want);
        assert_eq!(strip(&spliced), want);
        // Sealed, the fallback is the stripped record with its own digests and seal.
        let body = FinalBody::new(&r, u64::MAX, &sealer()).unwrap();
        let fallback = Record::from_json(&body.run_fallback(&r, &sealer())).unwrap();
        assert!(fallback.seal_holds(&fallback.run_id, &fallback.tool_call_id, &sealer()));
        let unsealed = Record {
            request_sha256: None,
            raw_sha256: None,
            result_sha256: None,
            seal: None,
            ..fallback.clone()
        };
        assert_eq!(serde_json::to_string(&unsealed).unwrap(), want);
        assert_eq!(
            body.run_fallback(&r, &sealer()),
            serde_json::to_string(&fallback).unwrap()
        );

        // A tool error is stripped too: its code gives way to RESULT_TOO_LARGE.
        let failed = Record {
            status: Status::Error,
            evidence_status: Some(Evidence::Error),
            agent_result: Value::Null,
            error_code: Some(Code::ToolTimeout.into()),
            upstream_status: None,
            duration_ms: None,
            ..r.clone()
        };
        let want = serde_json::to_string(&Record {
            raw_response: Value::Null,
            error_code: Some(Code::ResultTooLarge(SizeStage::Record).into()),
            ..failed.clone()
        })
        .unwrap();
        assert_eq!(strip(&failed), want);
    }

    #[test]
    fn final_shapes_are_checked() {
        assert!(check_final(&ready("r", "c")).is_ok());
        let mut r = ready("r", "c");
        r.evidence_status = Some(Evidence::Error);
        assert!(check_final(&r).is_err());
        let mut r = ready("r", "c");
        r.status = Status::Projecting;
        assert!(check_final(&r).is_err());
        let mut e = ready("r", "c");
        e.status = Status::Error;
        e.evidence_status = Some(Evidence::Error);
        e.error_code = Some(Code::ToolTimeout.into());
        assert!(
            check_final(&e).is_err(),
            "ERROR must not carry an agent result"
        );
        e.agent_result = Value::Null;
        assert!(check_final(&e).is_ok());
    }

    #[test]
    fn an_unknown_stored_code_is_refused() {
        let mut e = ready("r", "c");
        e.status = Status::Error;
        e.evidence_status = Some(Evidence::Error);
        e.agent_result = Value::Null;
        e.error_code = Some(Code::ToolTimeout.into());
        let text = e.to_json().unwrap().replace("TOOL_TIMEOUT", "NOPE");
        assert!(Record::from_json(&text).is_err());
    }

    #[test]
    fn oversized_record_is_replaced_by_a_stripped_error() {
        let mut r = ready("r", "c");
        r.raw_response = json!({"blob": "x".repeat(1000)});
        let p = FinalBody::new(&r, 500, &sealer()).unwrap();
        assert_eq!(p.written(), Finalized::TooLarge(SizeStage::Record));
        assert_eq!(
            p.fallback_marks(),
            "",
            "a stripped body is its own fallback"
        );
        assert_eq!(p.run_fallback(&r, &sealer()), p.text);
        let stored = Record::from_json(&p.text).unwrap();
        assert_eq!(stored.status, Status::Error);
        assert!(stored.raw_response.is_null() && stored.agent_result.is_null());
        assert_eq!(
            stored.error_code.map(CodeName::as_str),
            Some("RESULT_TOO_LARGE")
        );
    }

    #[test]
    fn facts_keep_only_ready_records_of_the_run() {
        let mut err = ready("r", "e");
        err.status = Status::Error;
        err.evidence_status = Some(Evidence::Error);
        err.agent_result = Value::Null;
        err.error_code = Some(Code::ToolTimeout.into());
        let id = |s: &str| ToolCallId::parse(s).unwrap();
        let entries = vec![
            (id("a"), Some(sealed(&ready("r", "a")))),
            (id("gone"), None),
            (id("e"), Some(sealed(&err))),
            (id("f"), Some(sealed(&ready("other", "f")))),
            (id("b"), Some(sealed(&ready("r", "b")))),
            // A repeated id: excluded, though its record holds its seal.
            (id("a"), Some(sealed(&ready("r", "a")))),
        ];
        let f = facts(&RunId::parse("r").unwrap(), entries, &sealer());
        let ids: Vec<&str> = f.facts.iter().map(|f| f.tool_call_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(
            (f.excluded, f.tampered),
            (4, 1),
            "another run's record fails its seal here"
        );
        assert_eq!(f.tampered_ids, [id("f")]);
        let a = &f.facts[0];
        assert_eq!(
            a.request_sha256.as_deref(),
            Some(sha256_hex(br#"{"q":"x"}"#).as_str())
        );
        assert_eq!(
            a.result_sha256.as_deref(),
            Some(sha256_hex(br#"{"item":1}"#).as_str())
        );
        assert_eq!(a.raw_sha256, None, "a null part has a null digest");
    }

    /// Whatever JSON a tool answers, its record reads back to the texts it was sealed over: a
    /// float whose shortest text a fast parser reads an ulp off, and an object whose first key
    /// is the name serde_json's raw-value feature reserves.
    #[test]
    fn any_answer_reads_back_to_its_sealed_texts() {
        for body in [
            r#"{"results":[{"n":3.0261999441573203e-52,"m":2.347135155778617e+214},906.7979265841685]}"#,
            r#"{"$serde_json::private::RawValue":"[1,2]"}"#,
            r#"{"a":{"$serde_json::private::RawValue":{"x":1}}}"#,
        ] {
            let raw = crate::compact::compact(body.as_bytes()).unwrap().json;
            let mut r = ready("r", "c");
            r.raw_json = Some(raw.clone());
            r.agent_json = Some(r#"{"item":1}"#.to_string());
            r.agent_result = Value::Null;
            let text = FinalBody::new(&r, u64::MAX, &sealer()).unwrap().text;
            let stored = Record::from_json(&text).expect("what was written reads back");
            assert_eq!(stored.raw_response.to_string(), raw, "{body}");
            let (run, id) = (stored.run_id.clone(), stored.tool_call_id.clone());
            assert!(stored.seal_holds(&run, &id, &sealer()), "{body}");
        }
    }

    #[test]
    fn a_final_record_is_sealed_over_its_stored_texts() {
        let mut r = ready("r", "c");
        let raw = r#"{"results":[{"t":"é\"","n":1.5}]}"#;
        r.raw_json = Some(raw.to_string());
        r.agent_json = Some(r#"{"item":1}"#.to_string());
        r.agent_result = Value::Null;
        r.keep_request_json().unwrap();
        let text = FinalBody::new(&r, u64::MAX, &sealer()).unwrap().text;
        let stored = Record::from_json(&text).unwrap();
        assert_eq!(
            stored.raw_sha256.as_deref(),
            Some(sha256_hex(raw.as_bytes()).as_str())
        );
        assert_eq!(
            stored.request_sha256.as_deref(),
            Some(sha256_hex(br#"{"q":"x"}"#).as_str())
        );
        assert_eq!(
            stored.result_sha256.as_deref(),
            Some(sha256_hex(br#"{"item":1}"#).as_str())
        );
        assert!(text.ends_with(&format!(
            r#","seal":"{}"}}"#,
            stored.seal.as_deref().unwrap()
        )));
        // What is written is what the derived serialization of the read-back record gives.
        assert_eq!(serde_json::to_string(&stored).unwrap(), text);
        let (run, id) = (stored.run_id.clone(), stored.tool_call_id.clone());
        assert!(stored.seal_holds(&run, &id, &sealer()));

        // Every change to what the seal covers breaks it.
        let other = RunId::parse("r2").unwrap();
        assert!(
            !stored.seal_holds(&other, &id, &sealer()),
            "copied to another run"
        );
        assert!(!stored.seal_holds(&run, &ToolCallId::parse("c2").unwrap(), &sealer()));
        let changes: [&dyn Fn(&mut Record); 8] = [
            &|r| r.raw_response["results"][0]["n"] = json!(2),
            &|r| r.agent_result = json!({"item": 2}),
            &|r| r.request = json!({"q": "y"}),
            &|r| r.status = Status::Error,
            &|r| r.evidence_status = Some(Evidence::None),
            &|r| r.tool = ToolName::parse("other").unwrap(),
            &|r| r.seal = None,
            &|r| r.raw_sha256 = Some(sha256_hex(b"x")),
        ];
        for change in changes {
            let mut t = stored.clone();
            change(&mut t);
            assert!(!t.seal_holds(&run, &id, &sealer()), "{t:?}");
        }
        assert!(!stored.seal_holds(&run, &id, &Sealer::derive(b"another key")));
    }

    #[test]
    fn a_stripped_record_carries_its_own_seal() {
        let mut r = ready("r", "c");
        r.raw_response = json!({"blob": "x".repeat(1000)});
        let body = FinalBody::new(&r, 500, &sealer()).unwrap();
        let stored = Record::from_json(&body.text).unwrap();
        assert_eq!(stored.status, Status::Error);
        assert_eq!(
            (
                stored.raw_sha256.as_deref(),
                stored.result_sha256.as_deref()
            ),
            (None, None)
        );
        assert!(stored.seal_holds(&stored.run_id, &stored.tool_call_id, &sealer()));
        assert_eq!(serde_json::to_string(&stored).unwrap(), body.text);
    }
}
