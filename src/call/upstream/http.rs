//! Plain HTTP: a `POST` of the input on one of the tool's kept connections, the answer read
//! within the cap and compacted in one pass.

use hyper::Uri;
use serde_json::Value;

use super::{Answer, Failed, Reply, ToolRequest, Upstream, UpstreamError, each_header, too_deep};
use crate::body::{ReadError, json_depth};
use crate::compact;

impl Upstream {
    /// POSTs the input and reads the answer, stopping at `raw_bytes + 1`.
    pub(super) async fn http(&self, req: ToolRequest<'_>) -> Result<Reply, UpstreamError> {
        let serialized;
        let body = match req.input_json {
            Some(text) => text.as_bytes(),
            None => {
                serialized = serde_json::to_vec(req.input)
                    .map_err(|e| UpstreamError::Body(e.to_string()))?;
                &serialized[..]
            }
        };
        let request = plain_request(&req, req.connections.target(), body)?;
        let answer = req
            .connections
            .send(&self.connector, req.uri, &request, req.raw_bytes)
            .await
            .map_err(UpstreamError::Unreachable)?;
        let status = answer.status;
        let body = answer.body.map_err(|e| match e {
            ReadError::TooLarge => UpstreamError::TooLarge { status },
            ReadError::Body(e) => UpstreamError::Body(e),
        });
        let body = body?;
        // The usual answer: compacted in one pass and kept as that text.
        if (200..300).contains(&status)
            && let Some(compact) = compact::compact_selecting(&body, req.select)
        {
            if compact.depth > req.json_depth {
                return Ok(Reply {
                    status,
                    raw: Err(too_deep()),
                });
            }
            return Ok(Reply {
                status,
                raw: Ok(Answer {
                    json: compact.json,
                    selected: compact.selected,
                }),
            });
        }
        if json_depth(&body) > req.json_depth {
            return Ok(Reply {
                status,
                raw: Err(too_deep()),
            });
        }
        let raw = match serde_json::from_slice::<Value>(&body) {
            Ok(raw) if (200..300).contains(&status) => Ok(Answer::from_tree(&raw)),
            Ok(raw) => Err(Failed {
                raw,
                why: format!("tool status {status}, JSON body"),
            }),
            Err(_) => Err(Failed {
                raw: Value::String(String::from_utf8_lossy(&body).into()),
                why: format!("tool status {status}, body not JSON"),
            }),
        };
        Ok(Reply { status, raw })
    }
}

/// The whole HTTP/1.1 request of a plain-HTTP call: a `POST` of `body` to `target` with the
/// headers of [`each_header`], and its length.
fn plain_request(
    req: &ToolRequest<'_>,
    target: &Uri,
    body: &[u8],
) -> Result<Vec<u8>, UpstreamError> {
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(
        target
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .as_bytes(),
    );
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut field = |name: &str, value: &[u8]| {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    };
    each_header(req, &mut field)?;
    let mut length = itoa::Buffer::new();
    field("content-length", length.format(body.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    Ok(out)
}
