//! One HTTP/1.1 exchange at a time on a connection to a plain-HTTP tool: the request written as
//! it was put together, the answer's head parsed with `httparse` (the parser hyper uses) and its
//! body read to its end under a cap.
//!
//! The tool client needs one shape of exchange: a `POST` with a body whose length is known, and
//! an answer read whole. Doing just that on the connection, in the call's task, costs a fraction
//! of a general client's per-request work (its request and response types, header maps, and the
//! channel between a request handle and the task that drives the connection).
//!
//! What an answer may look like, and what is done with it:
//! - `1xx` heads (other than `101`) are passed over; `101` is an error (nothing asks to upgrade).
//! - The body is framed by `Transfer-Encoding` when it is present (chunked when `chunked` is its
//!   last coding, else up to the close), else by `Content-Length`, else up to the close. `204`
//!   and `304` have none. Several `Content-Length`s that differ, or one that is not a number,
//!   are an error.
//! - A head longer than [`MAX_HEAD`] bytes or with more than [`MAX_HEADERS`] fields is an error.
//! - A declared length over the cap fails at once; any other body fails as soon as what was
//!   read passes the cap.
//! - The connection is used again only when the body was read to its end, the answer is
//!   HTTP/1.1 without `Connection: close`, it was not framed both ways, and nothing followed it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::body::ReadError;

/// The longest answer head read (the status line, fields and the empty line).
pub const MAX_HEAD: usize = 64 * 1024;

/// The most fields an answer head may have.
pub const MAX_HEADERS: usize = 100;

/// What is read at least at a time.
const READ_CHUNK: usize = 8 * 1024;

/// A connection and what was read on it and not used yet.
pub struct Conn<S> {
    io: S,
    buf: BytesMut,
}

/// A tool's answer: its status, and its body or why it could not be read.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Result<Bytes, ReadError>,
}

/// How an answer's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

/// What an answer's head says, read out of it before its bytes are let go.
struct Head {
    status: u16,
    framing: Framing,
    /// Whether the connection may carry another exchange after this one.
    keep: bool,
    /// The head's length in the buffer.
    len: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub fn new(io: S) -> Conn<S> {
        Conn {
            io,
            buf: BytesMut::new(),
        }
    }

    /// Whether the connection is still open and quiet: polled once without waiting, a close
    /// or any byte from the peer (nothing was asked) ends it.
    pub fn probe(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut byte = [0u8; 1];
        let mut read = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(Waker::noop());
        matches!(
            Pin::new(&mut self.io).poll_read(&mut cx, &mut read),
            Poll::Pending
        )
    }

    /// Writes a whole request.
    pub async fn write(&mut self, request: &[u8]) -> io::Result<()> {
        self.io.write_all(request).await?;
        self.io.flush().await
    }

    /// Reads the answer to the request written, its body up to `limit` bytes. Gives the
    /// answer and whether the connection may be used again; `Err` when no answer head could
    /// be read (the text is for logs).
    pub async fn read_answer(&mut self, limit: u64) -> Result<(Answer, bool), String> {
        let head = loop {
            let head = self.read_head().await?;
            match head.status {
                101 => return Err("tool answered 101 Switching Protocols".into()),
                100..=199 => self.buf.advance(head.len),
                _ => break head,
            }
        };
        self.buf.advance(head.len);
        let status = head.status;
        let body = match head.framing {
            Framing::Empty => Ok(Bytes::new()),
            Framing::Length(n) if n > limit => Err(ReadError::TooLarge),
            Framing::Length(n) => self.fixed(n as usize).await,
            Framing::Chunked => self.chunked(limit).await,
            Framing::UntilClose => self.until_close(limit).await,
        };
        let keep =
            head.keep && head.framing != Framing::UntilClose && body.is_ok() && self.buf.is_empty();
        Ok((Answer { status, body }, keep))
    }

    /// Reads until the buffer holds a whole head, and reads that head.
    async fn read_head(&mut self) -> Result<Head, String> {
        loop {
            if !self.buf.is_empty() {
                let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut response = httparse::Response::new(&mut fields);
                match response.parse(&self.buf) {
                    Ok(httparse::Status::Complete(len)) => return head(&response, len),
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return Err(format!("tool answer head: {e}")),
                }
                if self.buf.len() >= MAX_HEAD {
                    return Err("tool answer head too long".into());
                }
            }
            match self.fill().await {
                Ok(0) => return Err("tool closed the connection before answering".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("tool connection: {e}")),
            }
        }
    }

    /// Reads more into the buffer: how many bytes (0 at the end of the stream).
    async fn fill(&mut self) -> io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 {
            self.buf.reserve(READ_CHUNK);
        }
        self.io.read_buf(&mut self.buf).await
    }

    /// Reads until the buffer holds `n` bytes; `Body` if the stream ends first.
    async fn fill_to(&mut self, n: usize) -> Result<(), ReadError> {
        if self.buf.len() < n {
            self.buf.reserve(n - self.buf.len());
        }
        while self.buf.len() < n {
            match self.fill().await {
                Ok(0) => return Err(ReadError::Body("tool answer ended early".into())),
                Ok(_) => {}
                Err(e) => return Err(ReadError::Body(e.to_string())),
            }
        }
        Ok(())
    }

    /// A body of `n` bytes (within the cap).
    async fn fixed(&mut self, n: usize) -> Result<Bytes, ReadError> {
        self.fill_to(n).await?;
        Ok(self.buf.split_to(n).freeze())
    }

    /// A chunked body, its trailers read and dropped.
    async fn chunked(&mut self, limit: u64) -> Result<Bytes, ReadError> {
        let mut body = BytesMut::new();
        loop {
            let (line, size) = loop {
                match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete(found)) => break found,
                    Ok(httparse::Status::Partial) => {
                        // A size line (with its extensions) is bounded like a head.
                        if self.buf.len() >= MAX_HEAD {
                            return Err(ReadError::Body("chunk size line too long".into()));
                        }
                        let have = self.buf.len();
                        self.fill_to(have + 1).await?;
                    }
                    Err(_) => return Err(ReadError::Body("bad chunk size".into())),
                }
            };
            self.buf.advance(line);
            if size == 0 {
                self.trailers().await?;
                return Ok(body.freeze());
            }
            if body.len() as u64 + size > limit {
                return Err(ReadError::TooLarge);
            }
            let mut left = size as usize;
            if body.is_empty() {
                // The first chunk (most tools send their answer as one): read whole into the
                // connection buffer, which grows once to its size (within the cap), and taken
                // out of it without a copy.
                self.fill_to(left).await?;
                body = self.buf.split_to(left);
                left = 0;
            } else {
                body.reserve(left);
            }
            while left > 0 {
                if self.buf.is_empty() {
                    self.fill_to(1).await?;
                }
                let take = left.min(self.buf.len());
                body.extend_from_slice(&self.buf[..take]);
                self.buf.advance(take);
                left -= take;
            }
            self.fill_to(2).await?;
            if &self.buf[..2] != b"\r\n" {
                return Err(ReadError::Body("chunk not followed by CRLF".into()));
            }
            self.buf.advance(2);
        }
    }

    /// The trailer fields after the last chunk, up to the empty line.
    async fn trailers(&mut self) -> Result<(), ReadError> {
        let mut read = 0;
        loop {
            match memchr::memchr(b'\n', &self.buf) {
                Some(end) => {
                    let empty = matches!(&self.buf[..end], b"" | b"\r");
                    self.buf.advance(end + 1);
                    read += end + 1;
                    if empty {
                        return Ok(());
                    }
                }
                None => {
                    if read + self.buf.len() >= MAX_HEAD {
                        return Err(ReadError::Body("trailers too long".into()));
                    }
                    let have = self.buf.len();
                    self.fill_to(have + 1).await?;
                }
            }
        }
    }

    /// A body that ends with the stream.
    async fn until_close(&mut self, limit: u64) -> Result<Bytes, ReadError> {
        loop {
            if self.buf.len() as u64 > limit {
                return Err(ReadError::TooLarge);
            }
            match self.fill().await {
                Ok(0) => return Ok(self.buf.split().freeze()),
                Ok(_) => {}
                Err(e) => return Err(ReadError::Body(e.to_string())),
            }
        }
    }
}

/// Reads the fields that matter out of a parsed head of `len` bytes.
fn head(response: &httparse::Response<'_, '_>, len: usize) -> Result<Head, String> {
    let status = response.code.unwrap_or(0);
    let mut length: Option<u64> = None;
    let mut coded = None;
    let mut close = response.version != Some(1);
    for field in response.headers.iter() {
        if field.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(field.value)
                .ok()
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or("tool answer has a bad Content-Length")?;
            if length.is_some_and(|l| l != n) {
                return Err("tool answer has two Content-Lengths".into());
            }
            length = Some(n);
        } else if field.name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding of the last field is the one that frames the body.
            let last = field.value.rsplit(|&b| b == b',').next().unwrap_or(b"");
            coded = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if field.name.eq_ignore_ascii_case("connection") {
            close |= field
                .value
                .split(|&b| b == b',')
                .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
    }
    let framing = match (status, coded, length) {
        (204 | 304, _, _) => Framing::Empty,
        (_, Some(true), _) => Framing::Chunked,
        (_, Some(false), _) => Framing::UntilClose,
        (_, None, Some(n)) => Framing::Length(n),
        (_, None, None) => Framing::UntilClose,
    };
    let framed_twice = coded.is_some() && length.is_some();
    Ok(Head {
        status,
        framing,
        keep: !(close || framed_twice),
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::DuplexStream;

    /// A connection whose peer sends `parts` one write at a time, then closes (or keeps its
    /// end open, when `hold`).
    async fn answered(parts: &[&[u8]], hold: bool) -> (Conn<DuplexStream>, Option<DuplexStream>) {
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        for part in parts {
            theirs.write_all(part).await.unwrap();
        }
        let kept = if hold {
            Some(theirs)
        } else {
            drop(theirs);
            None
        };
        (Conn::new(ours), kept)
    }

    async fn read(parts: &[&[u8]], hold: bool, limit: u64) -> Result<(u16, Vec<u8>, bool), String> {
        let (mut conn, _peer) = answered(parts, hold).await;
        let (answer, keep) = conn.read_answer(limit).await?;
        match answer.body {
            Ok(body) => Ok((answer.status, body.to_vec(), keep)),
            Err(ReadError::TooLarge) => Err("too large".into()),
            Err(ReadError::Body(e)) => Err(format!("body: {e}")),
        }
    }

    #[tokio::test]
    async fn lengths_chunks_and_closes_frame_the_body() {
        // What the peer sends, whether it then keeps its end open, and what is read: the
        // status, body and whether the connection is kept, or a part of the error.
        type Case = (
            &'static [&'static [u8]],
            bool,
            Result<(u16, &'static [u8], bool), &'static str>,
        );
        let cases: &[Case] = &[
            (&[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"], true, Ok((200, b"{}", true))),
            // Split anywhere, in several reads.
            (&[b"HTTP/1.1 20", b"0 OK\r\ncontent-len", b"gth: 5\r\n\r", b"\n{\"a\"", b"}"], true, Ok((200, b"{\"a\"}", true))),
            (&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\n{\"a\r\n2\r\n\":\r\n2\r\n1}\r\n0\r\nX-T: 1\r\n\r\n"], true, Ok((200, b"{\"a\":1}", true))),
            (&[b"HTTP/1.1 200 OK\r\n\r\nto the end"], false, Ok((200, b"to the end", false))),
            (&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nraw"], false, Ok((200, b"raw", false))),
            (&[b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n"], true, Ok((204, b"", true))),
            (&[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 500 Oops\r\nContent-Length: 1\r\n\r\nx"], true, Ok((500, b"x", true))),
            (&[b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n"], true, Ok((200, b"", false))),
            (&[b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"], true, Ok((200, b"", false))),
            // Both framings: the coding wins, and the connection is not used again.
            (&[b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"], true, Ok((200, b"x", false))),
            // Bytes after the answer: not used again.
            (&[b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxy"], true, Ok((200, b"x", false))),
            (&[b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy"], true, Err("two Content-Lengths")),
            (&[b"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx"], true, Err("bad Content-Length")),
            (&[b"HTTP/1.1 101 Switching Protocols\r\n\r\n"], true, Err("101")),
            (&[b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort"], false, Err("body: tool answer ended early")),
            (&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], true, Err("body: bad chunk size")),
            (&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxyz"], true, Err("body: chunk not followed by CRLF")),
            (&[b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n"], true, Err("too large")),
            (&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n123456\r\n5\r\n12345\r\n0\r\n\r\n"], true, Err("too large")),
            (&[b"HTTP/1.1 200 OK\r\n\r\n0123456789x"], false, Err("too large")),
            (&[b"HTTP/1.1 200"], false, Err("closed the connection before answering")),
            (&[b"not http\r\n\r\n"], false, Err("answer head")),
        ];
        for (parts, hold, want) in cases {
            let got = read(parts, *hold, 10).await;
            match (want, &got) {
                (Ok((status, body, keep)), Ok(g)) => {
                    assert_eq!(g, &(*status, body.to_vec(), *keep), "{parts:?}")
                }
                (Err(part), Err(e)) => assert!(e.contains(part), "{parts:?}: {e}"),
                _ => panic!("{parts:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[tokio::test]
    async fn heads_are_bounded() {
        let long = format!("HTTP/1.1 200 OK\r\nX: {}\r\n", "a".repeat(MAX_HEAD));
        let got = read(&[long.as_bytes()], false, 10).await;
        assert!(got.unwrap_err().contains("too long"));
        let many = format!(
            "HTTP/1.1 200 OK\r\n{}\r\n",
            "X: 1\r\n".repeat(MAX_HEADERS + 1)
        );
        let got = read(&[many.as_bytes()], false, 10).await;
        assert!(got.unwrap_err().contains("answer head"));
        // A chunk's size line and the trailers are bounded the same way, while the tool
        // keeps its end open.
        let extended = format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;{}",
            "e".repeat(MAX_HEAD)
        );
        let got = read(&[extended.as_bytes()], true, 10).await;
        assert!(got.unwrap_err().contains("chunk size line too long"));
        let trailers = format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n{}",
            "t: 1\r\n".repeat(MAX_HEAD / 4)
        );
        let got = read(&[trailers.as_bytes()], true, 10).await;
        assert!(got.unwrap_err().contains("trailers too long"));
    }

    #[tokio::test]
    async fn a_connection_answers_one_exchange_after_another() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 16);
        let mut conn = Conn::new(ours);
        for i in 0..3u8 {
            assert!(conn.probe(), "quiet before exchange {i}");
            conn.write(b"POST / HTTP/1.1\r\n\r\n").await.unwrap();
            let mut request = [0u8; 19];
            theirs.read_exact(&mut request).await.unwrap();
            let body = [b'0' + i];
            theirs
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n")
                .await
                .unwrap();
            theirs.write_all(&body).await.unwrap();
            let (answer, keep) = conn.read_answer(10).await.unwrap();
            assert_eq!(answer.body.unwrap(), &body[..]);
            assert!(keep);
        }
        // A stray byte, or the close, ends it.
        theirs.write_all(b"x").await.unwrap();
        assert!(!conn.probe());
        drop(theirs);
        assert!(!conn.probe());
    }
}
