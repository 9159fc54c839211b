//! A connection of toolgate's own to one Redis node, for the direct writes ([`super::direct`]).
//!
//! One connection per node carries every direct write to it, pipelined, and the writes drive
//! it themselves, each in its own task: no connection task sits in between. A write queues its
//! command, and whoever polls the connection reads what has come (handing each reply, in order,
//! to the command it answers and waking that command's task) and writes what is queued. A
//! command finding nothing in flight is written at once; one queued while others are on their
//! way waits for their first replies, and everything queued by then goes out in one write. So
//! with one write at a time the connection costs what a connection of its own would (one write,
//! one read), and under load many commands share a write and their replies a read, on both
//! sides of the socket, while no command waits longer than one round trip to be sent.
//!
//! The socket wakes only the task that polled it last. That task, when it finishes (its reply
//! came) or is dropped while others still wait, wakes the first of them to take over. A write
//! dropped before its reply came leaves its place: the reply is read and thrown away, so a
//! reply is never given to the wrong write. A command queued or on the wire when its write is
//! dropped still runs. Any I/O or protocol failure breaks the connection for good: every write
//! waiting on it, and every later one, fails, and the caller ([`super::direct`]) then drops the
//! node with the slot map and detours through the cluster client.
//!
//! It speaks RESP2 and understands only the replies the direct writes get: an integer (the
//! scripts' result codes), a simple string (`+OK` to `AUTH` and `CLIENT SETNAME`) and an error.
//! Anything else is a protocol error.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The longest reply line read: error replies carry a message, the others a few bytes.
const MAX_LINE: usize = 64 * 1024;

/// A send buffer grown past this by large commands is given back once it is written.
const KEEP_BUFFER: usize = 64 * 1024;

/// How much room a read asks for.
const READ_CHUNK: usize = 4096;

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

/// One node's pipelined connection.
pub struct Node {
    pipe: Mutex<Pipe>,
}

impl Node {
    /// Opens a connection to `host:port` and runs the handshake on it.
    pub async fn connect(host: &str, port: u16, handshake: &Handshake) -> io::Result<Node> {
        let tcp = TcpStream::connect((host, port)).await?;
        tcp.set_nodelay(true)?;
        let mut stream = match &handshake.tls {
            None => Stream::Tcp(tcp),
            Some(tls) => {
                let name = ServerName::try_from(host.to_string())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                Stream::Tls(Box::new(tls.connect(name, tcp).await?))
            }
        };
        stream.send(&handshake.commands).await?;
        let mut input = Vec::with_capacity(64);
        for _ in 0..handshake.replies {
            let reply = loop {
                if let Some((reply, used)) = parse(&input)? {
                    input.drain(..used);
                    break reply;
                }
                if input.len() > MAX_LINE {
                    return Err(protocol("reply line too long"));
                }
                if stream.read_buf(&mut input).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            };
            match reply {
                Reply::Simple(_) => {}
                Reply::Error(e) => return Err(io::Error::other(format!("handshake refused: {e}"))),
                Reply::Int(_) => return Err(protocol("an integer answered the handshake")),
            }
        }
        Ok(Node {
            pipe: Mutex::new(Pipe {
                stream,
                broken: None,
                out: Vec::new(),
                written: 0,
                batch_end: 0,
                unsent: 0,
                input,
                commands: VecDeque::new(),
                first: 0,
                answered: 0,
                registered: None,
            }),
        })
    }

    /// Sends the command that `pack` appends to the connection's queue, and reads its reply.
    pub fn call<F: FnOnce(&mut Vec<u8>)>(&self, pack: F) -> Call<'_, F> {
        Call {
            node: self,
            pack: Some(pack),
            seq: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pipe> {
        self.pipe.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A command's place in its connection's order.
enum Slot {
    /// Its reply has not come; the waker of the task that last polled it.
    Waiting(Option<Waker>),
    /// Its reply came and was not taken yet.
    Done(Reply),
    /// Taken, or its write was dropped.
    Gone,
}

/// The connection and the commands on it.
struct Pipe {
    stream: Stream,
    /// The first failure; from then on every command fails with it.
    broken: Option<io::ErrorKind>,
    /// Commands queued. `out[..batch_end]` is the batch being written, of which
    /// `out[..written]` is on the wire; the rest waits for the next batch.
    out: Vec<u8>,
    written: usize,
    batch_end: usize,
    /// The number of the first command not in a batch yet.
    unsent: u64,
    /// What was read and not yet parsed.
    input: Vec<u8>,
    /// Every command whose slot is still needed, oldest first; replies come in this order.
    commands: VecDeque<Slot>,
    /// The number of the command in `commands[0]` (commands are numbered from 0 as queued).
    first: u64,
    /// `commands[..answered]` have had their reply.
    answered: usize,
    /// The command whose task the socket wakes: the last one to poll it and find it not ready.
    registered: Option<u64>,
}

impl Pipe {
    fn index(&self, seq: u64) -> usize {
        seq.checked_sub(self.first)
            .and_then(|i| usize::try_from(i).ok())
            .unwrap_or(usize::MAX)
    }

    /// Command `seq` waits for its reply in the task `waker` wakes.
    fn wait(&mut self, seq: u64, waker: &Waker) {
        let at = self.index(seq);
        if let Some(Slot::Waiting(w)) = self.commands.get_mut(at) {
            match w {
                Some(old) if old.will_wake(waker) => {}
                _ => *w = Some(waker.clone()),
            }
        }
    }

    /// Queues a command; returns its number.
    fn push(&mut self, pack: impl FnOnce(&mut Vec<u8>)) -> u64 {
        pack(&mut self.out);
        self.commands.push_back(Slot::Waiting(None));
        self.first + (self.commands.len() as u64 - 1)
    }

    /// Command `seq`'s reply, when it came: it is taken, and its slot let go.
    fn take(&mut self, seq: u64) -> Option<Reply> {
        let slot = self.commands.get_mut(self.index(seq))?;
        if !matches!(slot, Slot::Done(_)) {
            return None;
        }
        let Slot::Done(reply) = std::mem::replace(slot, Slot::Gone) else {
            return None;
        };
        Some(reply)
    }

    /// Command `seq` is finished with (its reply taken, or its write dropped): its slot goes,
    /// and if the socket would wake only its task, the next command still waiting takes over.
    fn leave(&mut self, seq: u64) {
        let at = self.index(seq);
        if let Some(slot) = self.commands.get_mut(at) {
            *slot = Slot::Gone;
        }
        while self.answered > 0 && matches!(self.commands.front(), Some(Slot::Gone)) {
            self.commands.pop_front();
            self.first += 1;
            self.answered -= 1;
        }
        if self.registered == Some(seq) {
            self.registered = None;
            let next = self
                .commands
                .iter()
                .skip(self.answered)
                .find_map(|s| match s {
                    Slot::Waiting(Some(w)) => Some(w),
                    _ => None,
                });
            if let Some(w) = next {
                w.wake_by_ref();
            }
        }
    }

    /// Writes what is queued and reads what came, for command `me`, whose task `cx` wakes.
    fn drive(&mut self, cx: &mut Context<'_>, me: u64) {
        if let Err(e) = self.exchange(cx, me) {
            self.fail(e.kind(), me);
        }
    }

    fn exchange(&mut self, cx: &mut Context<'_>, me: u64) -> io::Result<()> {
        loop {
            let mut read_pending = false;
            let replied = self.read(cx, me, &mut read_pending)?;
            // A new batch, all that is queued: once the last one is on the wire, and either
            // nothing is in flight or replies just came (so the commands queued while they
            // were on their way go out together).
            if self.written == self.batch_end
                && self.batch_end < self.out.len()
                && (replied || self.answered == self.sent())
            {
                self.batch_end = self.out.len();
                self.unsent = self.first + self.commands.len() as u64;
            }
            let (wrote, full) = self.write(cx)?;
            if wrote == 0 {
                // The last read came after the last write: the socket wakes this task when
                // a reply comes for what is on the wire, or when it takes more bytes.
                if read_pending || full {
                    self.registered = Some(me);
                }
                return Ok(());
            }
        }
    }

    /// How many of `commands` (from the front) are on the wire, or in the batch being written.
    fn sent(&self) -> usize {
        self.index(self.unsent)
    }

    /// Writes what is left of the batch; how many bytes went, and whether the socket is full.
    fn write(&mut self, cx: &mut Context<'_>) -> io::Result<(usize, bool)> {
        let mut full = false;
        let mut wrote = 0;
        while self.written < self.batch_end {
            match Pin::new(&mut self.stream).poll_write(cx, &self.out[self.written..self.batch_end])
            {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => {
                    self.written += n;
                    wrote += n;
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => {
                    full = true;
                    break;
                }
            }
        }
        if self.written == self.batch_end && self.written > 0 {
            if self.written == self.out.len() && self.out.capacity() > KEEP_BUFFER {
                self.out = Vec::new();
            } else {
                self.out.drain(..self.written);
            }
            self.written = 0;
            self.batch_end = 0;
        }
        if let Stream::Tls(_) = self.stream {
            match Pin::new(&mut self.stream).poll_flush(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => full = true,
            }
        }
        Ok((wrote, full))
    }

    /// Reads and hands out replies while commands on the wire wait for them; whether any came.
    /// `pending` is set when the socket has nothing more yet.
    fn read(&mut self, cx: &mut Context<'_>, me: u64, pending: &mut bool) -> io::Result<bool> {
        let mut replied = false;
        loop {
            let mut used = 0;
            while self.answered < self.sent() {
                let Some((reply, n)) = parse(&self.input[used..])? else {
                    break;
                };
                used += n;
                self.answer(reply, me);
                replied = true;
            }
            self.input.drain(..used);
            if self.answered == self.sent() {
                if !self.input.is_empty() {
                    return Err(protocol("a reply no command asked for"));
                }
                return Ok(replied);
            }
            if self.input.len() > MAX_LINE {
                return Err(protocol("reply line too long"));
            }
            self.input.reserve(READ_CHUNK);
            match pin!(self.stream.read_buf(&mut self.input)).poll(cx) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => {
                    *pending = true;
                    return Ok(replied);
                }
            }
        }
    }

    /// Gives `reply` to the oldest command without one, and wakes its task (unless it is `me`,
    /// the one polling).
    fn answer(&mut self, reply: Reply, me: u64) {
        let seq = self.first + self.answered as u64;
        let Some(slot) = self.commands.get_mut(self.answered) else {
            return;
        };
        self.answered += 1;
        if let Slot::Waiting(waker) = std::mem::replace(slot, Slot::Done(reply)) {
            if seq != me
                && let Some(w) = waker
            {
                w.wake();
            }
        } else {
            // The write was dropped: its reply is thrown away.
            *slot = Slot::Gone;
        }
    }

    /// Breaks the connection: every command still waiting is woken to fail.
    fn fail(&mut self, kind: io::ErrorKind, me: u64) {
        self.broken = Some(kind);
        for (i, slot) in self.commands.iter_mut().enumerate().skip(self.answered) {
            if let Slot::Waiting(Some(w)) = slot
                && self.first + i as u64 != me
            {
                w.wake_by_ref();
            }
        }
    }
}

/// One command on a [`Node`] and its reply; see the module's comment.
pub struct Call<'a, F> {
    node: &'a Node,
    /// Packs the command; taken when it is queued.
    pack: Option<F>,
    /// The command's number once queued, until it is finished with.
    seq: Option<u64>,
}

// `Call` is never pinned structurally: `pack` is only ever moved out whole.
impl<F> Unpin for Call<'_, F> {}

impl<F: FnOnce(&mut Vec<u8>)> Future for Call<'_, F> {
    type Output = io::Result<Reply>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<Reply>> {
        let this = self.get_mut();
        let mut pipe = this.node.lock();
        let seq = match this.seq {
            Some(seq) => seq,
            None => {
                if let Some(kind) = pipe.broken {
                    return Poll::Ready(Err(kind.into()));
                }
                let Some(pack) = this.pack.take() else {
                    return Poll::Ready(Err(io::Error::other("polled after it finished")));
                };
                let seq = pipe.push(pack);
                this.seq = Some(seq);
                seq
            }
        };
        let reply = match pipe.take(seq) {
            Some(reply) => Ok(reply),
            None => {
                if pipe.broken.is_none() {
                    pipe.drive(cx, seq);
                }
                match (pipe.take(seq), pipe.broken) {
                    (Some(reply), _) => Ok(reply),
                    (None, Some(kind)) => Err(kind.into()),
                    (None, None) => {
                        pipe.wait(seq, cx.waker());
                        return Poll::Pending;
                    }
                }
            }
        };
        this.seq = None;
        pipe.leave(seq);
        Poll::Ready(reply)
    }
}

impl<F> Drop for Call<'_, F> {
    fn drop(&mut self) {
        if let Some(seq) = self.seq {
            self.node.lock().leave(seq);
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::Duration;
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

    /// What the fake node does, in order.
    enum Step {
        /// Reads exactly these bytes (in as many reads as they take).
        Read(&'static [u8]),
        Write(&'static [u8]),
        /// Waits for the test to say go.
        Wait(Arc<tokio::sync::Notify>),
    }

    /// A node that follows `script`, then closes; it returns the reads that brought the
    /// commands (how many).
    async fn fake_node(script: Vec<Step>) -> (u16, tokio::task::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut reads = 0;
            for step in script {
                match step {
                    Step::Read(want) => {
                        let mut got = Vec::new();
                        while got.len() < want.len() {
                            let mut buf = vec![0u8; want.len() - got.len()];
                            let n = s.read(&mut buf).await.unwrap();
                            assert!(n > 0, "closed before {want:?}");
                            got.extend_from_slice(&buf[..n]);
                            reads += 1;
                        }
                        assert_eq!(got, want, "the node read");
                    }
                    Step::Write(bytes) => s.write_all(bytes).await.unwrap(),
                    Step::Wait(go) => go.notified().await,
                }
            }
            reads
        });
        (port, task)
    }

    fn handshake(commands: &[u8], replies: usize) -> Handshake {
        Handshake {
            tls: None,
            commands: commands.to_vec(),
            replies,
        }
    }

    /// The handshake every test node expects first.
    fn hello() -> [Step; 2] {
        [Step::Read(b"HELLO\r\n"), Step::Write(b"+OK\r\n")]
    }

    async fn connect(port: u16) -> Node {
        Node::connect("127.0.0.1", port, &handshake(b"HELLO\r\n", 1))
            .await
            .expect("connect")
    }

    fn cmd(text: &'static [u8]) -> impl FnOnce(&mut Vec<u8>) {
        move |out: &mut Vec<u8>| out.extend_from_slice(text)
    }

    /// Counts its wakes.
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Counter>, Waker) {
        let c = Arc::new(Counter(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    fn poll<F: Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
        Pin::new(f).poll(&mut Context::from_waker(waker))
    }

    /// Lets the runtime's I/O driver run, so sockets wake what waits on them.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn a_connection_sends_its_handshake_then_one_command_per_call() {
        let [r, w] = hello();
        let (port, node) = fake_node(vec![
            r,
            w,
            Step::Read(b"ONE\r\n"),
            Step::Write(b":7\r\n"),
            Step::Read(b"TWO\r\n"),
            Step::Write(b"-ERR no\r\n"),
        ])
        .await;
        let conn = connect(port).await;
        assert_eq!(conn.call(cmd(b"ONE\r\n")).await.unwrap(), Reply::Int(7));
        assert_eq!(
            conn.call(cmd(b"TWO\r\n")).await.unwrap(),
            Reply::Error("ERR no".into())
        );
        drop(conn);
        node.await.unwrap();
    }

    #[tokio::test]
    async fn a_refused_handshake_or_a_closed_connection_is_an_error() {
        let (port, _node) = fake_node(vec![
            Step::Read(b"AUTH\r\n"),
            Step::Write(b"+OK\r\n-WRONGPASS invalid\r\n"),
        ])
        .await;
        let e = Node::connect("127.0.0.1", port, &handshake(b"AUTH\r\n", 2))
            .await
            .err()
            .expect("refused");
        assert!(e.to_string().contains("WRONGPASS"), "{e}");

        // The node goes after the handshake: the call fails, and so does every later one,
        // without touching the socket.
        let [r, w] = hello();
        let (port, node) = fake_node(vec![r, w]).await;
        let conn = connect(port).await;
        node.await.unwrap();
        let e = conn.call(cmd(b"X\r\n")).await.expect_err("closed");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
            ),
            "{e}"
        );
        let again = conn.call(cmd(b"Y\r\n")).await.expect_err("broken");
        assert_eq!(again.kind(), e.kind());
    }

    #[tokio::test]
    async fn a_reply_without_an_end_is_bounded() {
        static LONG: [u8; MAX_LINE + 10] = [b'-'; MAX_LINE + 10];
        let [r, w] = hello();
        let (port, _node) = fake_node(vec![r, w, Step::Read(b"X\r\n"), Step::Write(&LONG)]).await;
        let conn = connect(port).await;
        let e = conn.call(cmd(b"X\r\n")).await.expect_err("too long");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn a_reply_nobody_asked_for_breaks_the_connection() {
        let [r, w] = hello();
        let (port, _node) = fake_node(vec![
            r,
            w,
            Step::Read(b"X\r\n"),
            Step::Write(b":1\r\n:2\r\n"),
        ])
        .await;
        let conn = connect(port).await;
        // X's own reply came before the stray one, in the same read: X may have it.
        match conn.call(cmd(b"X\r\n")).await {
            Ok(reply) => assert_eq!(reply, Reply::Int(1)),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::InvalidData),
        }
        let e = conn.call(cmd(b"Y\r\n")).await.expect_err("broken");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn commands_queued_behind_one_in_flight_go_out_in_one_write() {
        let go = Arc::new(tokio::sync::Notify::new());
        let [r, w] = hello();
        let (port, node) = fake_node(vec![
            r,
            w,
            Step::Read(b"A\r\n"),
            Step::Wait(go.clone()),
            Step::Write(b":1\r\n"),
            // B and C were queued while A was on its way: they come together, after A's reply.
            Step::Read(b"B\r\nC\r\n"),
            Step::Write(b":2\r\n:3\r\n"),
        ])
        .await;
        let conn = connect(port).await;
        let (ca, wa) = counter();
        let (cb, wb) = counter();
        let (cc, wc) = counter();
        let mut a = conn.call(cmd(b"A\r\n"));
        let mut b = conn.call(cmd(b"B\r\n"));
        let mut c = conn.call(cmd(b"C\r\n"));
        assert!(poll(&mut a, &wa).is_pending());
        assert!(poll(&mut b, &wb).is_pending());
        assert!(poll(&mut c, &wc).is_pending());
        settle().await;
        go.notify_one();
        settle().await;
        // A's reply woke C's task, the last to poll the socket; C reads it, hands it to A (and
        // wakes A), and writes B and C in one batch.
        assert_eq!(cc.0.load(Ordering::SeqCst), 1, "the socket wakes C");
        assert_eq!(ca.0.load(Ordering::SeqCst), 0);
        assert!(poll(&mut c, &wc).is_pending());
        assert_eq!(ca.0.load(Ordering::SeqCst), 1, "A is woken with its reply");
        assert!(matches!(poll(&mut a, &wa), Poll::Ready(Ok(Reply::Int(1)))));
        settle().await;
        // B's and C's replies came in one write; C's poll reads both and wakes B.
        assert_eq!(cc.0.load(Ordering::SeqCst), 2, "the socket wakes C again");
        assert!(matches!(poll(&mut c, &wc), Poll::Ready(Ok(Reply::Int(3)))));
        assert_eq!(cb.0.load(Ordering::SeqCst), 1, "B is woken with its reply");
        assert!(matches!(poll(&mut b, &wb), Poll::Ready(Ok(Reply::Int(2)))));
        drop((a, b, c));
        drop(conn);
        assert_eq!(
            node.await.unwrap(),
            3,
            "the handshake, A, then B and C together: one read each"
        );
    }

    #[tokio::test]
    async fn the_task_the_socket_wakes_hands_over_when_it_finishes_or_leaves() {
        let go = Arc::new(tokio::sync::Notify::new());
        let [r, w] = hello();
        let (port, _node) = fake_node(vec![
            r,
            w,
            Step::Read(b"A\r\n"),
            Step::Wait(go.clone()),
            Step::Write(b":1\r\n"),
            Step::Read(b"B\r\n"),
            Step::Write(b":2\r\n"),
            Step::Read(b"C\r\n"),
            Step::Write(b":3\r\n"),
            Step::Read(b"D\r\n"),
            Step::Write(b":4\r\n"),
            Step::Read(b"E\r\n"),
            Step::Write(b":5\r\n"),
        ])
        .await;
        let conn = connect(port).await;
        let (_, wa) = counter();
        let (cb, wb) = counter();
        let mut a = conn.call(cmd(b"A\r\n"));
        let mut b = conn.call(cmd(b"B\r\n"));
        assert!(poll(&mut a, &wa).is_pending());
        assert!(poll(&mut b, &wb).is_pending());
        // A polls last, so the socket wakes A; A reads its reply, writes B, and finishes:
        // it wakes B to take the socket over.
        assert!(poll(&mut a, &wa).is_pending());
        go.notify_one();
        settle().await;
        assert_eq!(cb.0.load(Ordering::SeqCst), 0);
        assert!(matches!(poll(&mut a, &wa), Poll::Ready(Ok(Reply::Int(1)))));
        assert_eq!(cb.0.load(Ordering::SeqCst), 1, "A hands the socket to B");
        settle().await;
        assert!(matches!(poll(&mut b, &wb), Poll::Ready(Ok(Reply::Int(2)))));

        // C in flight, D queued behind it and the one the socket wakes; D is dropped: C takes
        // over and gets its reply. D still goes out (after C's reply), and its reply is thrown
        // away: E gets its own.
        let (cc, wc) = counter();
        let (_, wd) = counter();
        let mut c = conn.call(cmd(b"C\r\n"));
        let mut d = conn.call(cmd(b"D\r\n"));
        assert!(poll(&mut c, &wc).is_pending());
        assert!(poll(&mut d, &wd).is_pending());
        drop(d);
        assert_eq!(cc.0.load(Ordering::SeqCst), 1, "D hands the socket to C");
        settle().await;
        assert!(matches!(poll(&mut c, &wc), Poll::Ready(Ok(Reply::Int(3)))));
        settle().await;
        assert_eq!(conn.call(cmd(b"E\r\n")).await.unwrap(), Reply::Int(5));
        let pipe = conn.lock();
        assert!(pipe.commands.is_empty(), "no slot is left behind");
        assert!(pipe.broken.is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_concurrent_writes_each_get_their_own_reply() {
        // A real exchange under load: an echoing node answers each `N` with `:N`.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut input = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    return;
                }
                input.extend_from_slice(&buf[..n]);
                let mut out = Vec::new();
                while let Some(end) = input.windows(2).position(|w| w == b"\r\n") {
                    let line: Vec<u8> = input.drain(..end + 2).collect();
                    if line == b"HELLO\r\n" {
                        out.extend_from_slice(b"+OK\r\n");
                    } else {
                        out.push(b':');
                        out.extend_from_slice(&line);
                    }
                }
                s.write_all(&out).await.unwrap();
            }
        });
        let conn = Arc::new(connect(port).await);
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..16u64 {
            let conn = conn.clone();
            tasks.spawn(async move {
                for i in 0..200u64 {
                    let n = t * 1000 + i;
                    let reply = conn
                        .call(|out: &mut Vec<u8>| {
                            out.extend_from_slice(format!("{n}\r\n").as_bytes())
                        })
                        .await
                        .expect("reply");
                    assert_eq!(reply, Reply::Int(n as i64));
                    if i % 7 == 0 {
                        // Now and then a write that gives up at once.
                        let mut gone = conn.call(cmd(b"99999\r\n"));
                        let _ = futures_poll_once(&mut gone).await;
                    }
                }
            });
        }
        let all = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(r) = tasks.join_next().await {
                r.expect("task");
            }
        })
        .await;
        assert!(all.is_ok(), "every write finished");
        let pipe = conn.lock();
        assert!(pipe.broken.is_none());
    }

    /// Polls `f` once, in the current task.
    async fn futures_poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *f).poll(cx))).await
    }
}
