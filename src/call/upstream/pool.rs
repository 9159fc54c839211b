//! The connections to one plain-HTTP tool, kept between its calls.
//!
//! A connection is used by the call that holds it, in the call's own task: the request is
//! written and the answer read on it directly (`call::upstream::h1`). Between calls it waits here,
//! unpolled. So before it is used again it is polled once, which is when a
//! close by the tool service is seen, and a closed one is dropped then.
//!
//! - Kept per thread ([`PerThread`]): a call on a serving thread takes a connection
//!   that thread opened, so the socket's wakes come to the thread the call runs on.
//! - Newest first: the connection used last is used next.
//! - At most [`MAX_IDLE`] wait per thread; one more is closed instead of kept.
//! - One idle for [`IDLE_TIMEOUT`] is closed: at the next checkout or check-in, or by the sweep
//!   that runs while any wait.
//! - A request that could not be written because its connection had closed in the meantime is
//!   sent once more, on a new connection (it never reached the tool).
//! - A call that is dropped (timeout, cancellation) drops the connection it holds, and so closes
//!   it: an HTTP/1 connection with an unfinished exchange cannot be used again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hyper::Uri;
use hyper::http::uri::PathAndQuery;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower_service::Service;

use super::h1;
pub use super::h1::Answer;
use crate::workers::PerThread;

/// How long a connection may wait unused before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The most connections that wait unused for one tool.
pub const MAX_IDLE: usize = 256;

/// A connection's stream: TCP, or TLS over it, seen through tokio's IO traits.
type Stream = TokioIo<MaybeHttpsStream<TokioIo<TcpStream>>>;

/// One open HTTP/1 connection.
struct Conn {
    h1: h1::Conn<Stream>,
    /// When it was last checked in.
    since: Instant,
}

/// The unused connections to one tool, made with its config.
pub struct Connections {
    /// The request target: the upstream URL's path and query (origin form).
    target: Uri,
    idle: PerThread<Arc<Mutex<Idle>>>,
}

#[derive(Default)]
struct Idle {
    conns: VecDeque<Box<Conn>>,
    /// Whether a sweep task is running for these connections.
    sweeping: bool,
}

impl Connections {
    /// The connections to `upstream`, none open yet.
    pub fn new(upstream: &Uri) -> Connections {
        let mut target = hyper::http::uri::Parts::default();
        target.path_and_query = Some(
            upstream
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
        Connections {
            target: Uri::from_parts(target).unwrap_or_else(|_| Uri::from_static("/")),
            idle: PerThread::new(Arc::default),
        }
    }

    /// What a request names as its target: the path and query of the upstream URL.
    pub fn target(&self) -> &Uri {
        &self.target
    }

    /// Writes `request` (a whole HTTP/1.1 request, for the origin-form target and with its
    /// `Host`) on a kept connection, or on a new one to `uri`, and reads the answer, its body
    /// up to `limit` bytes. Only a connection whose answer was read to its end, and that may
    /// carry another exchange, is kept again.
    pub async fn send(
        &self,
        connector: &HttpsConnector<HttpConnector>,
        uri: &Uri,
        request: &[u8],
        limit: u64,
    ) -> Result<Answer, String> {
        let (conn, pooled) = match self.checkout() {
            Some(conn) => (conn, true),
            None => (Box::pin(connect(connector, uri)).await?, false),
        };
        self.exchange(conn, pooled, connector, uri, request, limit)
            .await
    }

    /// [`Connections::send`] on `conn`, which was kept (`pooled`) or has just been opened.
    async fn exchange(
        &self,
        mut conn: Box<Conn>,
        pooled: bool,
        connector: &HttpsConnector<HttpConnector>,
        uri: &Uri,
        request: &[u8],
        limit: u64,
    ) -> Result<Answer, String> {
        // A kept connection that closed since it was looked at, or that a write finds closed:
        // the request did not reach the tool. Once more, on a new one.
        let mut written = if pooled && !conn.h1.probe() {
            Err(std::io::ErrorKind::ConnectionReset.into())
        } else {
            conn.h1.write(request).await
        };
        if written.is_err() && pooled {
            conn = Box::pin(connect(connector, uri)).await?;
            written = conn.h1.write(request).await;
        }
        written.map_err(|e| format!("writing the request: {e}"))?;
        let (answer, keep) = conn.h1.read_answer(limit).await?;
        if keep {
            self.checkin(conn);
        }
        Ok(answer)
    }

    /// The newest kept connection that is still open.
    fn checkout(&self) -> Option<Box<Conn>> {
        let mut idle = self.lock();
        let now = Instant::now();
        while let Some(mut conn) = idle.conns.pop_back() {
            if now.duration_since(conn.since) >= IDLE_TIMEOUT {
                // The rest waited longer still.
                idle.conns.clear();
                return None;
            }
            if conn.h1.probe() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps a connection whose exchange is over.
    fn checkin(&self, mut conn: Box<Conn>) {
        let now = Instant::now();
        conn.since = now;
        let mut idle = self.lock();
        drop_expired(&mut idle.conns, now);
        if idle.conns.len() >= MAX_IDLE {
            return;
        }
        idle.conns.push_back(conn);
        if !idle.sweeping {
            idle.sweeping = true;
            tokio::spawn(sweep(Arc::downgrade(self.idle.get())));
        }
    }

    /// How many connections wait unused.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.idle
            .iter()
            .map(|i| i.lock().unwrap_or_else(|p| p.into_inner()).conns.len())
            .sum()
    }

    /// This thread's connections.
    fn lock(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.get().lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A new connection to `uri` (TCP, and TLS for https). Its future is large and opening one
/// the rare case, so callers box it: the future of every call that reuses a connection stays
/// small, and cheap to move.
async fn connect(
    connector: &HttpsConnector<HttpConnector>,
    uri: &Uri,
) -> Result<Box<Conn>, String> {
    let mut connector = connector.clone();
    std::future::poll_fn(|cx| connector.poll_ready(cx))
        .await
        .map_err(|e| e.to_string())?;
    let stream = connector
        .call(uri.clone())
        .await
        .map_err(|e| e.to_string())?;
    Ok(Box::new(Conn {
        h1: h1::Conn::new(TokioIo::new(stream)),
        since: Instant::now(),
    }))
}

/// Drops, oldest first, the connections that have waited [`IDLE_TIMEOUT`].
fn drop_expired(conns: &mut VecDeque<Box<Conn>>, now: Instant) {
    while conns
        .front()
        .is_some_and(|c| now.duration_since(c.since) >= IDLE_TIMEOUT)
    {
        conns.pop_front();
    }
}

/// Closes expired connections while any wait; ends when none do, or the tool is gone.
async fn sweep(idle: Weak<Mutex<Idle>>) {
    loop {
        tokio::time::sleep(IDLE_TIMEOUT / 2).await;
        let Some(idle) = idle.upgrade() else { return };
        let mut idle = idle.lock().unwrap_or_else(|p| p.into_inner());
        drop_expired(&mut idle.conns, Instant::now());
        if idle.conns.is_empty() {
            idle.sweeping = false;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// How the test tool service treats a connection after its first answer.
    #[derive(Clone, Copy, PartialEq)]
    enum After {
        KeepOpen,
        Close,
        /// Answers with `Connection: close` (and closes).
        SayClose,
    }

    /// A tool service on a raw socket; counts the connections it accepts.
    async fn service(after: After) -> (Uri, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}/tool?x=1", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        // One request: the head, then its declared body.
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            let mut chunk = [0u8; 1024];
                            match socket.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                        assert!(head.starts_with("post /tool?x=1 http/1.1\r\n"), "{head}");
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        while buf.len() < head_end + length {
                            let mut chunk = [0u8; 1024];
                            let n = socket.read(&mut chunk).await.unwrap();
                            buf.extend_from_slice(&chunk[..n]);
                        }
                        buf.drain(..head_end + length);
                        let close = if after == After::SayClose {
                            "connection: close\r\n"
                        } else {
                            ""
                        };
                        let answer =
                            format!("HTTP/1.1 200 OK\r\n{close}content-length: 2\r\n\r\n{{}}");
                        socket.write_all(answer.as_bytes()).await.unwrap();
                        if after != After::KeepOpen {
                            return;
                        }
                    }
                });
            }
        });
        (uri, accepted)
    }

    fn connector() -> HttpsConnector<HttpConnector> {
        crate::call::upstream::Upstream::new().unwrap().connector
    }

    fn request(conns: &Connections, uri: &Uri) -> Vec<u8> {
        format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-length: 2\r\n\r\n{{}}",
            conns.target(),
            uri.authority().unwrap()
        )
        .into_bytes()
    }

    async fn call(
        conns: &Connections,
        connector: &HttpsConnector<HttpConnector>,
        uri: &Uri,
    ) -> Vec<u8> {
        let answer = conns
            .send(connector, uri, &request(conns, uri), 1024)
            .await
            .unwrap();
        assert_eq!(answer.status, 200);
        answer.body.map_err(|_| "read").unwrap().to_vec()
    }

    #[tokio::test]
    async fn one_connection_serves_call_after_call() {
        let (uri, accepted) = service(After::KeepOpen).await;
        let (conns, connector) = (Connections::new(&uri), connector());
        for _ in 0..5 {
            assert_eq!(call(&conns, &connector, &uri).await, b"{}");
            assert_eq!(conns.idle(), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_tool_closed_is_replaced() {
        for after in [After::Close, After::SayClose] {
            let (uri, accepted) = service(after).await;
            let (conns, connector) = (Connections::new(&uri), connector());
            for i in 1..=3 {
                assert_eq!(call(&conns, &connector, &uri).await, b"{}");
                // Let the close reach this side before the next call.
                tokio::time::sleep(Duration::from_millis(20)).await;
                assert_eq!(accepted.load(Ordering::SeqCst), i);
            }
            assert!(conns.idle() <= 1);
        }
    }

    #[tokio::test]
    async fn a_request_not_written_before_the_close_goes_on_a_new_connection() {
        let (uri, accepted) = service(After::Close).await;
        let (conns, connector) = (Connections::new(&uri), connector());
        assert_eq!(call(&conns, &connector, &uri).await, b"{}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A kept connection that the tool closed after the probe passed: the request is not
        // written on it, and goes on a new connection.
        let mut conn = connect(&connector, &uri).await.unwrap();
        conn.h1.write(&request(&conns, &uri)).await.unwrap();
        let first = conn.h1.read_answer(1024).await;
        assert!(first.is_ok());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        let status = conns
            .exchange(conn, true, &connector, &uri, &request(&conns, &uri), 1024)
            .await
            .map(|a| a.status);
        assert_eq!(status.unwrap(), 200);
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connections_are_closed_after_the_idle_timeout() {
        let (uri, accepted) = service(After::KeepOpen).await;
        let (conns, connector) = (Connections::new(&uri), connector());
        assert_eq!(call(&conns, &connector, &uri).await, b"{}");
        assert_eq!(conns.idle(), 1);
        tokio::time::sleep(IDLE_TIMEOUT * 2).await;
        assert_eq!(conns.idle(), 0, "the sweep closed it");
        assert_eq!(call(&conns, &connector, &uri).await, b"{}");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_target_is_the_path_and_query() {
        let target = |u: &str| Connections::new(&u.parse().unwrap()).target().to_string();
        assert_eq!(target("http://tool:8080/search?q=1"), "/search?q=1");
        assert_eq!(target("https://tool"), "/");
        assert_eq!(target("http://[::1]:9/a/b"), "/a/b");
    }
}
