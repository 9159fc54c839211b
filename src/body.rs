//! Capped body reads, for both directions: what a client sends a listener and what a tool sends
//! back. Reading stops as soon as the cap is passed, so memory stays bounded by the cap plus one
//! frame whatever the peer sends.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

/// Why a capped body read stopped.
#[derive(Debug)]
pub enum ReadError {
    TooLarge,
    Body(String),
}

/// Reads a body into memory, failing as soon as it exceeds `limit` bytes.
pub async fn read_capped<B>(mut body: B, limit: u64) -> Result<Bytes, ReadError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Body(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > limit {
                return Err(ReadError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}
