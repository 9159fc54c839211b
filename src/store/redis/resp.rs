//! A connection of toolgate's own to one Redis node, for the direct writes ([`super::direct`]).
//!
//! It is driven by the write that uses it, in the write's own task: the packed command is
//! written and its one reply read, with no connection task in between. Between writes it waits
//! in its node's idle list. A write that is dropped before its reply arrived (the store timeout)
//! drops the connection with it, so a reply is never read by the wrong write.
//!
//! It speaks RESP2 and understands only the replies the direct writes get: an integer (the
//! scripts' result codes), a simple string (`+OK` to `AUTH` and `CLIENT SETNAME`) and an error.
//! Anything else is a protocol error, and the connection is not used again.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The longest reply line read: error replies carry a message, the others a few bytes.
const MAX_LINE: usize = 64 * 1024;

/// The most connections kept unused for one node; one more is closed instead.
const MAX_IDLE: usize = 32;

/// A buffer grown past this by a large command is given back after it.
const KEEP_BUFFER: usize = 64 * 1024;

/// One reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Int(i64),
    Simple(String),
    Error(String),
}

/// How to open a connection to a node: TLS, and the commands sent first on each.
pub struct Handshake {
    /// `rediss://`: the TLS settings; `None` for `redis://`.
    pub tls: Option<TlsConnector>,
    /// `AUTH` (when the node URL has credentials) and `CLIENT SETNAME`, packed.
    pub commands: Vec<u8>,
    /// How many commands `commands` holds; each must answer `+OK`.
    pub replies: usize,
}

/// One node's address and its unused connections.
pub struct Node {
    host: String,
    port: u16,
    handshake: Arc<Handshake>,
    idle: Mutex<Vec<Conn>>,
}

impl Node {
    pub fn new(host: String, port: u16, handshake: Arc<Handshake>) -> Node {
        Node {
            host,
            port,
            handshake,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An unused connection, the one used last; else a new one. Opening one is the rare
    /// case, and its future (TCP, TLS, the handshake) is large, so it is boxed: the writes'
    /// futures stay small, and cheap to move.
    pub async fn checkout(&self) -> io::Result<Conn> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(conn) => Ok(conn),
            None => Box::pin(self.connect()).await,
        }
    }

    /// Keeps `conn` for the next write, unless [`MAX_IDLE`] already wait.
    pub fn checkin(&self, mut conn: Conn) {
        if conn.out.capacity() > KEEP_BUFFER {
            conn.out = Vec::new();
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// Opens a connection and runs the handshake on it.
    pub async fn connect(&self) -> io::Result<Conn> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
        tcp.set_nodelay(true)?;
        let stream = match &self.handshake.tls {
            None => Stream::Tcp(tcp),
            Some(tls) => {
                let name = ServerName::try_from(self.host.clone())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                Stream::Tls(Box::new(tls.connect(name, tcp).await?))
            }
        };
        let mut conn = Conn {
            stream,
            out: Vec::new(),
            input: Vec::with_capacity(64),
        };
        conn.stream.send(&self.handshake.commands).await?;
        for _ in 0..self.handshake.replies {
            match conn.read_reply().await? {
                Reply::Simple(_) => {}
                Reply::Error(e) => return Err(io::Error::other(format!("handshake refused: {e}"))),
                Reply::Int(_) => return Err(protocol("an integer answered the handshake")),
            }
        }
        Ok(conn)
    }
}

/// An open connection.
pub struct Conn {
    stream: Stream,
    /// The command being sent; kept between writes.
    out: Vec<u8>,
    /// What was read and not yet parsed.
    input: Vec<u8>,
}

impl Conn {
    /// Sends the command that `pack` appends to an empty buffer, and reads its reply.
    pub async fn call(&mut self, pack: impl FnOnce(&mut Vec<u8>)) -> io::Result<Reply> {
        self.out.clear();
        pack(&mut self.out);
        self.stream.send(&self.out).await?;
        self.read_reply().await
    }

    async fn read_reply(&mut self) -> io::Result<Reply> {
        loop {
            if let Some((reply, used)) = parse(&self.input)? {
                self.input.drain(..used);
                return Ok(reply);
            }
            if self.input.len() > MAX_LINE {
                return Err(protocol("reply line too long"));
            }
            if self.stream.read_buf(&mut self.input).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

fn protocol(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The first reply in `input` and the bytes it took; `None` while it is incomplete.
fn parse(input: &[u8]) -> io::Result<Option<(Reply, usize)>> {
    let Some(end) = input.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let (kind, line) = input[..end]
        .split_first()
        .ok_or_else(|| protocol("empty reply line"))?;
    let text = || String::from_utf8_lossy(line).into_owned();
    let reply = match kind {
        b':' => Reply::Int(
            std::str::from_utf8(line)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| protocol("malformed integer reply"))?,
        ),
        b'+' => Reply::Simple(text()),
        b'-' => Reply::Error(text()),
        _ => return Err(protocol("unexpected reply type")),
    };
    Ok(Some((reply, end + 2)))
}

enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Stream {
    /// Writes all of `buf`; TLS records are flushed to the socket.
    async fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write_all(buf).await?;
        if let Stream::Tls(_) = self {
            self.flush().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn replies_are_parsed_one_at_a_time() {
        assert_eq!(parse(b":42\r\n+OK\r\n").unwrap(), Some((Reply::Int(42), 5)));
        assert_eq!(parse(b":-3\r\n").unwrap(), Some((Reply::Int(-3), 5)));
        assert_eq!(
            parse(b"+OK\r\n").unwrap(),
            Some((Reply::Simple("OK".into()), 5))
        );
        assert_eq!(
            parse(b"-NOSCRIPT No matching script\r\n").unwrap(),
            Some((Reply::Error("NOSCRIPT No matching script".into()), 30))
        );
        // Incomplete: wait for more.
        assert_eq!(parse(b":4").unwrap(), None);
        assert_eq!(parse(b":4\r").unwrap(), None);
        assert_eq!(parse(b"").unwrap(), None);
        // Not a reply a direct write gets.
        for bad in [
            &b"$3\r\nabc\r\n"[..],
            b"*1\r\n:1\r\n",
            b"\r\n",
            b":x\r\n",
            b":\r\n",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
    }

    /// A node that answers each read with the next of `replies`; it returns all it read.
    async fn fake_node(replies: Vec<&'static [u8]>) -> (u16, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for reply in replies {
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
                s.write_all(reply).await.unwrap();
            }
            seen
        });
        (port, task)
    }

    fn handshake(commands: &[u8], replies: usize) -> Arc<Handshake> {
        Arc::new(Handshake {
            tls: None,
            commands: commands.to_vec(),
            replies,
        })
    }

    #[tokio::test]
    async fn a_connection_sends_its_handshake_then_one_command_per_call() {
        let (port, node) = fake_node(vec![b"+OK\r\n+OK\r\n", b":7\r\n", b"-ERR no\r\n"]).await;
        let node_conn = Node::new("127.0.0.1".into(), port, handshake(b"HELLO\r\n", 2));
        let mut conn = node_conn.checkout().await.expect("connect");
        let reply = conn.call(|out| out.extend_from_slice(b"ONE\r\n")).await;
        assert_eq!(reply.unwrap(), Reply::Int(7));
        let reply = conn.call(|out| out.extend_from_slice(b"TWO\r\n")).await;
        assert_eq!(reply.unwrap(), Reply::Error("ERR no".into()));
        node_conn.checkin(conn);
        assert_eq!(node_conn.idle.lock().unwrap().len(), 1);
        drop(node_conn);
        assert_eq!(node.await.unwrap(), b"HELLO\r\nONE\r\nTWO\r\n");
    }

    #[tokio::test]
    async fn a_refused_handshake_or_a_closed_connection_is_an_error() {
        let (port, _node) = fake_node(vec![b"+OK\r\n-WRONGPASS invalid\r\n"]).await;
        let node = Node::new("127.0.0.1".into(), port, handshake(b"AUTH\r\n", 2));
        let e = node.connect().await.err().expect("refused");
        assert!(e.to_string().contains("WRONGPASS"), "{e}");

        let (port, _node) = fake_node(vec![b"+OK\r\n"]).await;
        let node = Node::new("127.0.0.1".into(), port, handshake(b"SETNAME\r\n", 1));
        let mut conn = node.connect().await.expect("connect");
        // The fake node has gone after its one reply.
        let e = conn.call(|out| out.extend_from_slice(b"X\r\n")).await;
        assert!(e.is_err());
    }

    #[tokio::test]
    async fn a_reply_without_an_end_is_bounded() {
        static LONG: [u8; MAX_LINE + 10] = [b'-'; MAX_LINE + 10];
        let (port, _node) = fake_node(vec![b"+OK\r\n", &LONG]).await;
        let node = Node::new("127.0.0.1".into(), port, handshake(b"SETNAME\r\n", 1));
        let mut conn = node.connect().await.expect("connect");
        let e = conn
            .call(|out| out.extend_from_slice(b"X\r\n"))
            .await
            .expect_err("too long");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
