//! HTTP plumbing shared by every listener (the agent, admin and telemetry listeners and the
//! injector): the accept loop, plain or TLS, and response building, including the ONE place a
//! toolgate [`Error`] becomes an HTTP response.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::framing::{Marks, Watched};
use super::slots::{Requests, Slot, Slots};
use crate::error::{self, Code};
use crate::ids::ToolCallId;
use crate::metrics::ConnectionCounts;
use crate::workers::Workers;

pub type Body = Full<Bytes>;

/// The error body for `code`, with its HTTP status: the one way an error is answered.
pub fn error(code: Code, tool_call_id: Option<&ToolCallId>) -> Response<Body> {
    bytes(code.status(), error::body(tool_call_id, code))
}

/// A path segment that carries an id or a tool name, percent-decoded once (`%3A` is `:`). Bytes
/// that do not decode to UTF-8 keep the segment as sent, which no safe id matches.
pub fn path_segment(raw: &str) -> std::borrow::Cow<'_, str> {
    match percent_encoding::percent_decode_str(raw).decode_utf8() {
        Ok(decoded) => decoded,
        Err(_) => std::borrow::Cow::Borrowed(raw),
    }
}

/// A JSON response.
pub fn json(status: StatusCode, body: &Value) -> Response<Body> {
    bytes(status, serde_json::to_vec(body).unwrap_or_default())
}

/// A response whose body is already-serialized JSON.
pub fn bytes(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    text(status, body, "application/json")
}

/// A response with any content type.
pub fn text(
    status: StatusCode,
    body: impl Into<Bytes>,
    content_type: &'static str,
) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// How a listener treats its connections.
#[derive(Clone)]
pub struct Serving {
    /// TLS in front of HTTP, for the injector.
    pub tls: Option<TlsAcceptor>,
    /// A client must send its request head within this time.
    pub header_read_timeout: Duration,
    /// How long open connections get to finish their last response once the listener stops.
    pub close_grace: Duration,
    /// Open connections served at once. At the cap the longest-idle one is closed to admit a
    /// new one; with a request in progress on every one, a new one is refused (`OVERLOADED`).
    pub max_connections: usize,
    /// A connection with no request in progress for this long is closed.
    pub idle_timeout: Duration,
    /// This listener's series of the connection metrics.
    pub counts: ConnectionCounts,
    /// The serving threads connections are handed to; `None` serves them on the runtime
    /// that runs the accept loop.
    pub workers: Option<Arc<Workers>>,
}

impl Serving {
    /// Plain HTTP/1.1, as the agent and admin listeners serve: a client gets 30 s for its head.
    pub fn plain(max_connections: usize) -> Serving {
        Serving {
            tls: None,
            header_read_timeout: Duration::from_secs(30),
            close_grace: Duration::from_secs(5),
            max_connections,
            idle_timeout: Duration::from_millis(crate::config::DEFAULT_IDLE_TIMEOUT_MS),
            counts: ConnectionCounts::default(),
            workers: None,
        }
    }

    /// The telemetry listener: Prometheus and the kubelet send their request at once, so an
    /// idle connection there is dropped after 5 s.
    pub fn telemetry(max_connections: usize) -> Serving {
        Serving {
            header_read_timeout: Duration::from_secs(5),
            ..Serving::plain(max_connections)
        }
    }
}

/// A refused connection gets this long to be told `OVERLOADED` and to close.
const REFUSE_GRACE: Duration = Duration::from_secs(1);

/// Refused connections being told so at once; past it a refusal is one best-effort write.
const MAX_REFUSING: usize = 64;

/// A TLS handshake must finish within this time.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections and serves each with HTTP/1.1 and `handler` until `stop` turns true;
/// then stops accepting, lets responses in progress finish, closes idle keep-alive
/// connections (bounded by `close_grace`) and returns.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    serving: Serving,
    handler: F,
    mut stop: watch::Receiver<bool>,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let mut connections = JoinSet::new();
    let slots = Slots::new(
        serving.max_connections,
        serving.idle_timeout,
        serving.counts.clone(),
    );
    let overloaded: Arc<[u8]> = overloaded().into();
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let mut sweep = tokio::time::interval(slots.sweep_every());
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Some(slot) = slots.admit() else {
                        refuse(stream, &overloaded, &refusing);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    // With serving threads the socket moves to a worker's runtime: it is
                    // registered there when the task first runs.
                    let socket = match &serving.workers {
                        None => Socket::Here(stream),
                        Some(_) => match stream.into_std() {
                            Ok(stream) => Socket::Moving(stream),
                            Err(_) => continue,
                        },
                    };
                    let served =
                        serve_socket(socket, slot, serving.clone(), handler.clone(), stop.clone());
                    // Inline: hyper's request body wakes this task from within its own poll;
                    // that wake is taken as a second poll, not a trip through the scheduler
                    // (`wake.rs`).
                    let task = crate::wake::Inline::new(served);
                    match &serving.workers {
                        None => {
                            connections.spawn(task);
                        }
                        Some(workers) => {
                            workers.spawn(&mut connections, task);
                        }
                    }
                }
                Err(e) => {
                    // Out of file descriptors and similar: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = sweep.tick() => {
                slots.sweep();
            }
            () = stopped(&mut stop) => break,
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(serving.close_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::debug!(
            open = connections.len(),
            "closing connections after the grace period"
        );
    }
}

/// An accepted socket: on the runtime that serves it, or on its way to a serving thread.
enum Socket {
    Here(TcpStream),
    Moving(std::net::TcpStream),
}

/// [`connection`] on `socket`, registered with the runtime this runs on.
async fn serve_socket<F, Fut>(
    socket: Socket,
    slot: Slot,
    serving: Serving,
    handler: F,
    stop: watch::Receiver<bool>,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let tcp = match socket {
        Socket::Here(tcp) => tcp,
        Socket::Moving(std) => match TcpStream::from_std(std) {
            Ok(tcp) => tcp,
            Err(_) => return,
        },
    };
    connection(tcp, slot, serving, handler, stop).await;
}

/// One connection: the TLS handshake if any, then HTTP/1.1 until the peer closes or the
/// listener stops (then the response in progress finishes and the connection closes).
///
/// Nothing is set up for a connection until its first byte arrives (within the header
/// timeout): a silent connection costs a socket and this small future, not hyper's buffers.
/// A connection shed before then just closes. Its slot is freed when it ends.
async fn connection<F, Fut>(
    tcp: TcpStream,
    slot: Slot,
    serving: Serving,
    handler: F,
    stop: watch::Receiver<bool>,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    tokio::select! {
        readable = tokio::time::timeout(serving.header_read_timeout, tcp.readable()) => {
            match readable {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return,
            }
        }
        () = slot.conn.closing() => return,
    }
    // Boxed, so the idle future above stays small.
    Box::pin(serve_stream(tcp, &slot, serving, handler, stop)).await;
}

async fn serve_stream<F, Fut>(
    tcp: TcpStream,
    slot: &Slot,
    serving: Serving,
    handler: F,
    stop: watch::Receiver<bool>,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    match &serving.tls {
        None => http(tcp, slot, &serving, handler, stop).await,
        Some(acceptor) => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => http(tls, slot, &serving, handler, stop).await,
                Ok(Err(e)) => tracing::warn!(error = %e, "TLS handshake failed"),
                Err(_) => tracing::warn!("TLS handshake timed out"),
            }
        }
    }
}

async fn http<S, F, Fut>(
    stream: S,
    slot: &Slot,
    serving: &Serving,
    handler: F,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let marks = Marks::new();
    let requests = Arc::new(AtomicUsize::new(0));
    let watched = marks.clone();
    let in_progress: Requests = slot.requests();
    let service = service_fn(move |req: Request<Incoming>| {
        let handler = handler.clone();
        let n = requests.fetch_add(1, Ordering::Relaxed);
        let smuggled = watched.is_smuggled(n);
        let busy = in_progress.begin();
        async move {
            if smuggled {
                return Ok::<_, Infallible>(two_framings());
            }
            let response = handler(req).await;
            drop(busy);
            Ok::<_, Infallible>(response)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(serving.header_read_timeout)
        .serve_connection(TokioIo::new(Watched::new(stream, marks)), service);
    tokio::pin!(conn);
    // Polled only when they are woken themselves, not at each of the connection's wakes: the
    // listener stops, or sheds this connection (idle at the cap, or idle too long).
    let stop = crate::wake::Gated::new(stopped(&mut stop));
    let shed = crate::wake::Gated::new(slot.conn.closing());
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stop => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = shed => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// The whole answer a refused connection gets: `503` with the `OVERLOADED` error body.
fn overloaded() -> Vec<u8> {
    let body = error::body(None, Code::Overloaded);
    let mut out = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Tells a connection past the cap `OVERLOADED` and closes it, never making the accept loop
/// wait: up to [`MAX_REFUSING`] at once get [`REFUSE_GRACE`] to take the answer (what the client
/// already sent is read and dropped, so the close does not reset the answer away); past that,
/// one best-effort write.
fn refuse(stream: TcpStream, answer: &Arc<[u8]>, refusing: &Arc<Semaphore>) {
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        let _ = stream.try_write(answer);
        return;
    };
    let answer = answer.clone();
    tokio::spawn(async move {
        let mut stream = stream;
        let _ = tokio::time::timeout(REFUSE_GRACE, async {
            stream.write_all(&answer).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 1024];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
        drop(permit);
    });
}

/// The answer to a request framed two ways (`Content-Length` together with
/// `Transfer-Encoding`, the request-smuggling shape): 400, and the connection closes.
fn two_framings() -> Response<Body> {
    let mut resp = error(Code::InvalidInput, None);
    resp.headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An idle keep-alive connection is closed as soon as the listener stops, not left to the
    /// grace period: the stop reaches a connection whose task nothing else wakes.
    #[tokio::test]
    async fn a_stop_closes_idle_keep_alive_connections_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel(false);
        let serving = Serving {
            close_grace: Duration::from_secs(600),
            ..Serving::plain(8)
        };
        let server = tokio::spawn(serve(
            listener,
            serving,
            |_req| async { text(StatusCode::OK, "ok", "text/plain") },
            rx,
        ));

        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 512];
        while !seen.ends_with(b"ok") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the response: {seen:?}");
            seen.extend_from_slice(&buf[..n]);
        }
        assert!(seen.starts_with(b"HTTP/1.1 200"), "{seen:?}");

        tx.send_replace(true);
        // A hang guard far below the grace period, not a timing: the connection must end.
        let eof = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf))
            .await
            .expect("the idle connection was left open after the stop");
        assert_eq!(eof.unwrap(), 0, "the connection should be closed");
        tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .expect("serve returned")
            .unwrap();
    }
}
