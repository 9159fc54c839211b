//! Watches the request framing on a connection's bytes as hyper reads them, to find the
//! request-smuggling shape: a request that carries both `Content-Length` and
//! `Transfer-Encoding`. hyper obeys `Transfer-Encoding` and drops the length before a handler
//! could see it, so the check has to look at the bytes; the accept loop then answers that
//! request 400 and closes the connection, as nginx and Envoy do.
//!
//! The watcher follows HTTP/1.1 message boundaries (a head, then a body of `Content-Length`
//! bytes or chunked) without copying anything: it only counts and scans.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// No request is marked.
const NONE: usize = usize::MAX;
/// A head longer than this is hyper's to refuse (431); the watcher stops looking at it.
const MAX_HEAD: usize = 64 * 1024;

/// Which request of a connection (0-based) was framed two ways, shared with the service.
#[derive(Clone)]
pub struct Marks(Arc<AtomicUsize>);

impl Marks {
    pub fn new() -> Marks {
        Marks(Arc::new(AtomicUsize::new(NONE)))
    }

    /// Whether request `n` of the connection was framed two ways.
    pub fn is_smuggled(&self, n: usize) -> bool {
        self.0.load(Ordering::Acquire) == n
    }
}

/// A stream whose reads are watched.
pub struct Watched<S> {
    inner: S,
    framing: Framing,
    marks: Marks,
}

impl<S> Watched<S> {
    pub fn new(inner: S, marks: Marks) -> Watched<S> {
        Watched {
            inner,
            framing: Framing::default(),
            marks,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = poll {
            let this = &mut *self;
            if let Some(n) = this.framing.feed(&buf.filled()[before..]) {
                // Only the first one matters: hyper closes the connection after it.
                let _ = this
                    .marks
                    .0
                    .compare_exchange(NONE, n, Ordering::AcqRel, Ordering::Acquire);
            }
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Where in the byte stream the watcher is.
#[derive(Debug, Default)]
struct Framing {
    /// Requests whose head is complete.
    heads: usize,
    state: State,
    /// The head being read (up to [`MAX_HEAD`]).
    head: Vec<u8>,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    Head,
    /// A head too long to look at: wait for its end, then follow no body (hyper refuses it).
    Skipping,
    Fixed(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    /// The framing could not be followed (hyper will refuse it); watch no further.
    Lost,
}

impl Framing {
    /// Takes the next bytes; gives the index of a request framed two ways, if one head ended
    /// in them.
    fn feed(&mut self, mut bytes: &[u8]) -> Option<usize> {
        let mut found = None;
        while !bytes.is_empty() {
            match &mut self.state {
                State::Lost => return found,
                State::Fixed(n) => {
                    let take = (*n).min(bytes.len() as u64) as usize;
                    *n -= take as u64;
                    bytes = &bytes[take..];
                    if *n == 0 {
                        self.state = State::Head;
                    }
                }
                State::ChunkData(n) => {
                    let take = (*n).min(bytes.len() as u64) as usize;
                    *n -= take as u64;
                    bytes = &bytes[take..];
                    if *n == 0 {
                        self.state = State::ChunkEnd;
                    }
                }
                // The usual case: a whole head in one read, looked at where it lies.
                State::Head
                    if self.head.is_empty()
                        && !matches!(bytes.first(), Some(b'\r' | b'\n'))
                        && let Some(end) = head_end(bytes) =>
                {
                    if let Some(n) = self.head_done(&bytes[..end]) {
                        found = found.or(Some(n));
                    }
                    bytes = &bytes[end..];
                }
                State::Head
                | State::Skipping
                | State::ChunkSize
                | State::ChunkEnd
                | State::Trailers => {
                    // Line-oriented states: collect up to the end of a line (or the head).
                    let Some(end) = memchr::memchr(b'\n', bytes) else {
                        self.push(bytes);
                        return found;
                    };
                    self.push(&bytes[..=end]);
                    bytes = &bytes[end + 1..];
                    if let Some(n) = self.line() {
                        found = found.or(Some(n));
                    }
                }
            }
        }
        found
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.state == State::Head && self.head.len() + bytes.len() > MAX_HEAD {
            self.state = State::Skipping;
            self.head.clear();
        }
        if self.state != State::Skipping {
            self.head.extend_from_slice(bytes);
        }
    }

    /// A request's whole head: count it and follow its body; its index if it is framed two
    /// ways.
    fn head_done(&mut self, head: &[u8]) -> Option<usize> {
        let n = self.heads;
        self.heads += 1;
        let (length, chunked, both) = body_framing(head);
        self.state = match (chunked, length) {
            (true, _) => State::ChunkSize,
            (false, Some(0)) | (false, None) => State::Head,
            (false, Some(len)) => State::Fixed(len),
        };
        both.then_some(n)
    }

    /// One complete line is in `head` (for the head: the whole head so far).
    fn line(&mut self) -> Option<usize> {
        let line_ended_head = self.head.ends_with(b"\r\n\r\n") || self.head.ends_with(b"\n\n");
        match self.state {
            State::Head => {
                // Empty lines before a request line are allowed.
                if self.head == b"\r\n" || self.head == b"\n" {
                    self.head.clear();
                    return None;
                }
                if !line_ended_head {
                    return None;
                }
                let head = std::mem::take(&mut self.head);
                let found = self.head_done(&head);
                self.head = head;
                self.head.clear();
                found
            }
            State::Skipping => {
                // The end of an over-long head is a lone empty line.
                if self.head.is_empty() {
                    self.state = State::Lost;
                }
                None
            }
            State::ChunkSize => {
                let line = std::mem::take(&mut self.head);
                let text = String::from_utf8_lossy(&line);
                let size = text.trim().split(';').next().unwrap_or("").trim();
                self.state = match u64::from_str_radix(size, 16) {
                    Ok(0) => State::Trailers,
                    Ok(n) => State::ChunkData(n),
                    Err(_) => State::Lost,
                };
                None
            }
            State::ChunkEnd => {
                self.head.clear();
                self.state = State::ChunkSize;
                None
            }
            State::Trailers => {
                let line = std::mem::take(&mut self.head);
                if line == b"\r\n" || line == b"\n" {
                    self.state = State::Head;
                }
                None
            }
            State::Fixed(_) | State::ChunkData(_) | State::Lost => None,
        }
    }
}

/// Where the head at the start of `bytes` ends (after its empty line), when it ends within
/// [`MAX_HEAD`]: the first line end that makes the head end in `\r\n\r\n` or `\n\n`, as
/// line by line.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let window = &bytes[..bytes.len().min(MAX_HEAD)];
    memchr::memchr_iter(b'\n', window)
        .find(|&at| {
            let line = &window[..at];
            line.ends_with(b"\n") || line.ends_with(b"\r\n\r")
        })
        .map(|at| at + 1)
}

/// A head's body framing: its `Content-Length` (if one parses), whether it is chunked, and
/// whether it carries both headers.
///
/// A header line is one that starts after a `\n`, so the request line is never one. Only the
/// lines whose name is one of the two framing headers (the name up to the first colon,
/// compared without case) are looked at further.
fn body_framing(head: &[u8]) -> (Option<u64>, bool, bool) {
    const LENGTH: &[u8] = b"content-length:";
    const ENCODING: &[u8] = b"transfer-encoding:";
    let (mut length, mut has_length, mut has_te, mut chunked) = (None, false, false, false);
    for newline in memchr::memchr_iter(b'\n', head) {
        let line = &head[newline + 1..];
        // Most lines are passed over on their first byte.
        if !matches!(line.first(), Some(b'c' | b'C' | b't' | b'T')) {
            continue;
        }
        let named = |name: &[u8]| {
            line.get(..name.len())
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
        };
        let value = |name: &[u8]| {
            let rest = &line[name.len()..];
            let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end])
        };
        if named(LENGTH) {
            has_length = true;
            length = value(LENGTH).trim().parse().ok();
        } else if named(ENCODING) {
            has_te = true;
            let value = value(ENCODING);
            chunked = value
                .trim()
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        }
    }
    (length, chunked, has_length && has_te)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks_of(chunks: &[&str]) -> Vec<usize> {
        let mut f = Framing::default();
        chunks.iter().filter_map(|c| f.feed(c.as_bytes())).collect()
    }

    #[test]
    fn finds_the_request_framed_two_ways() {
        let plain = "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
        let chunked =
            "POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        let both =
            "POST /c HTTP/1.1\r\ncontent-length: 3\r\nTRANSFER-ENCODING: chunked\r\n\r\n0\r\n\r\n";
        let get = "GET /d HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(marks_of(&[plain, chunked, get]), Vec::<usize>::new());
        assert_eq!(marks_of(&[plain, chunked, both, get]), vec![2]);
        // Split anywhere, the same answer.
        let all = format!("{plain}{get}{both}");
        for cut in 1..all.len() {
            let (a, b) = all.split_at(cut);
            assert_eq!(marks_of(&[a, b]), vec![2], "cut at {cut}");
        }
    }

    /// The line-by-line reading `body_framing` replaced, kept to compare against.
    fn body_framing_by_lines(head: &[u8]) -> (Option<u64>, bool, bool) {
        let (mut length, mut has_length, mut has_te, mut chunked) = (None, false, false, false);
        for line in head.split(|b| *b == b'\n').skip(1) {
            let Some(colon) = line.iter().position(|b| *b == b':') else {
                continue;
            };
            let name = &line[..colon];
            let value = || String::from_utf8_lossy(&line[colon + 1..]);
            if name.eq_ignore_ascii_case(b"content-length") {
                has_length = true;
                length = value().trim().parse().ok();
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                has_te = true;
                let value = value();
                let value = value.trim();
                chunked = value
                    .rsplit(',')
                    .next()
                    .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
            }
        }
        (length, chunked, has_length && has_te)
    }

    proptest::proptest! {
        /// The one-pass end search finds what searching for both endings finds.
        #[test]
        fn a_head_ends_at_the_first_empty_line(
            bytes in proptest::collection::vec(proptest::sample::select(b"\r\nab:".to_vec()), 0..64),
        ) {
            let crlf = memchr::memmem::find(&bytes, b"\r\n\r\n").map(|i| i + 4);
            let lf = memchr::memmem::find(&bytes, b"\n\n").map(|i| i + 2);
            let both = match (crlf, lf) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            proptest::prop_assert_eq!(head_end(&bytes), both);
        }

        /// Heads made of header-like lines: framing names in any case, near-misses, spaces,
        /// colons in values, bare `\n` and `\r\n` endings.
        #[test]
        fn the_framing_scan_reads_heads_as_lines_do(
            lines in proptest::collection::vec((0..10usize, 0..8usize, proptest::bool::ANY), 0..8),
        ) {
            let names = [
                "Content-Length", "content-LENGTH", "Transfer-Encoding", "transfer-encoding",
                "Content-Lengthx", "Content-Length ", "X-Content-Length", "Host", "", "Transfer-Encoding:",
            ];
            let values = [
                " 5", "12", " chunked", "gzip, chunked", "chunked, gzip", " 1:2", "", " x\r",
            ];
            let mut head = String::from("POST /a HTTP/1.1\r\n");
            for (name, value, crlf) in lines {
                head.push_str(names[name]);
                head.push(':');
                head.push_str(values[value]);
                head.push_str(if crlf { "\r\n" } else { "\n" });
            }
            head.push_str("\r\n");
            proptest::prop_assert_eq!(body_framing(head.as_bytes()), body_framing_by_lines(head.as_bytes()));
        }

        /// Whole reads (where a head is looked at in place) and reads of one byte (line by
        /// line) mark the same first request.
        #[test]
        fn whole_heads_and_lines_agree(parts in proptest::collection::vec(0..7usize, 1..8)) {
            let pieces = [
                "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
                "POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                "POST /c HTTP/1.1\r\ncontent-length: 3\r\nTRANSFER-ENCODING: chunked\r\n\r\n0\r\n\r\n",
                "GET /d HTTP/1.1\r\nHost: x\r\n\r\n",
                "\r\nGET /e HTTP/1.1\nHost: x\n\n",
                "POST /f HTTP/1.1\nContent-Length: 2\nTransfer-Encoding: chunked\n\n0\n\n",
                "POST /g HTTP/1.1\r\nContent-Length: 4\r\n\nab\r\n",
            ];
            let all: String = parts.iter().map(|&i| pieces[i]).collect();
            let whole = marks_of(&[&all]);
            let mut f = Framing::default();
            let bytewise: Vec<usize> = all.as_bytes().iter().filter_map(|b| f.feed(&[*b])).collect();
            // A read reports the first request framed two ways in it (the connection closes
            // after that one).
            proptest::prop_assert_eq!(whole.first(), bytewise.first());
        }
    }

    #[test]
    fn a_body_that_looks_like_headers_is_not_a_head() {
        let body = "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let req = format!(
            "POST /a HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}GET / HTTP/1.1\r\n\r\n",
            body.len()
        );
        assert_eq!(marks_of(&[&req]), Vec::<usize>::new());
    }
}
