//! The bootstrap key-value server (the role of PMI in MPICH or mpimon's exchange in ScaMPI)
//! and a small blocking client for it.
//!
//! # Protocol
//! One persistent TCP connection per rank; UTF-8 lines ending in `\n` (a `\r` before it is
//! tolerated); fields separated by one space. Requests and replies:
//!
//! | request | reply |
//! |---|---|
//! | `HELLO <job> <rank>` | `OK`, or `ERR <msg>` on a wrong job id, a rank out of range or a rank already connected |
//! | `PUT <key> <value>` | `OK` (key and value are non-empty and contain no whitespace) |
//! | `FENCE` | `OK`, sent to every rank once all `size` ranks have issued their k-th FENCE |
//! | `GET <key>` | `VAL <value>` or `NONE` |
//! | `ABORT <code> <message>` | `OK`; the launcher then ends the job with exit status `code` |
//! | `FINALIZE` | `OK`; the rank will exit cleanly |
//!
//! Every request but `HELLO` needs a successful `HELLO` on the same connection first, so a
//! stray client that does not know the job id can change nothing. Anything malformed gets
//! `ERR <reason>` and the connection stays usable; a line longer than [`MAX_LINE`] bytes
//! closes it. Network input never panics the server.
//!
//! PUTs made before a FENCE are visible to GETs made after it: each connection is served in
//! order and the barrier releases nobody until every rank has reached it.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::sys;

/// Handshake context of the bootstrap connection.
const PMI_CTX: &[u8] = b"metampi pmi";

/// A job's secret as the bootstrap exchange uses it: a rank proves it knows
/// it with `AUTH` (the server's challenge) and an HMAC-SHA256 in `HELLO`, and
/// the server proves it back in its `OK`; the secret never crosses the wire.
#[derive(Clone)]
pub struct JobKey([u8; 32]);

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobKey(..)")
    }
}

impl JobKey {
    /// From 64 hex digits (`METAMPI_SECRET`).
    pub fn from_hex(text: &str) -> Option<JobKey> {
        let v = unhex(text.trim())?;
        Some(JobKey(v.try_into().ok()?))
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        use hmac::Mac;
        let mut m = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.0)
            .expect("HMAC takes keys of any length");
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    /// The `HELLO` line answering `challenge` (the hex after `CHALLENGE`), and
    /// the proof the server must send back in `OK <proof>`.
    pub fn hello(&self, challenge: &str, job: JobId, rank: usize) -> Option<(String, String)> {
        let na = unhex(challenge)?;
        let nc = random_bytes::<16>().ok()?;
        let who = format!("{job} {rank}");
        let tag = self.mac(&[b"C", PMI_CTX, &na, &nc, who.as_bytes()]);
        let expect = hex(&self.mac(&[b"A", PMI_CTX, &nc, &na]));
        Some((format!("HELLO {who} {} {}", hex(&nc), hex(&tag)), expect))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(t: &str) -> Option<Vec<u8>> {
    if t.len() % 2 != 0 || t.len() > 128 {
        return None;
    }
    (0..t.len() / 2)
        .map(|i| u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

/// Longest request line accepted, in bytes, without the newline.
pub const MAX_LINE: usize = 64 * 1024;

/// Identifies one job, so that a rank of another job (or a stray client) cannot join it.
/// Shown as 16 lowercase hex digits, which is the `METAMPI_JOB` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobId(pub u64);

impl JobId {
    /// A fresh, unpredictable id: from the OS random source, or, failing that, from std's
    /// randomly keyed hasher over the time and pid.
    pub fn random() -> JobId {
        let mut bytes = [0u8; 8];
        if std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .is_ok()
        {
            return JobId(u64::from_ne_bytes(bytes));
        }
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            hasher.write_u128(t.as_nanos());
        }
        JobId(hasher.finish())
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl FromStr for JobId {
    type Err = ProtocolError;

    /// Accepts exactly 16 hex digits.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ProtocolError::BadJobId(excerpt(s)));
        }
        u64::from_str_radix(s, 16)
            .map(JobId)
            .map_err(|_| ProtocolError::BadJobId(excerpt(s)))
    }
}

/// One parsed request line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request<'a> {
    /// `HELLO <job> <rank> [<nonce> <proof>]`
    Hello {
        /// The job id the rank was given.
        job: JobId,
        /// Its global rank.
        rank: usize,
        /// The client's challenge and its answer to the server's (hex), when the
        /// server asked for proof of the job secret.
        proof: Option<(&'a str, &'a str)>,
    },
    /// `AUTH`: asks for a challenge before `HELLO`.
    Auth,
    /// `PUT <key> <value>`
    Put {
        /// Non-empty, no whitespace.
        key: &'a str,
        /// Non-empty, no whitespace.
        value: &'a str,
    },
    /// `FENCE`
    Fence,
    /// `GET <key>`
    Get {
        /// Non-empty, no whitespace.
        key: &'a str,
    },
    /// `ABORT <code> <message>`
    Abort {
        /// The code the job should exit with.
        code: i32,
        /// Free text, possibly empty.
        message: &'a str,
    },
    /// `FINALIZE`
    Finalize,
}

/// Why a request line was rejected; the text after `ERR `.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Nothing on the line.
    #[error("empty request")]
    Empty,
    /// The first word is not a command.
    #[error("unknown command `{0}`")]
    UnknownCommand(String),
    /// Too few or too many fields.
    #[error("{command} takes {expected}")]
    Arity {
        /// The command.
        command: &'static str,
        /// Its argument shape.
        expected: &'static str,
    },
    /// Two spaces in a row, a tab, a leading space...
    #[error("fields must be separated by exactly one space and contain no other whitespace")]
    Whitespace,
    /// Not 16 hex digits.
    #[error("bad job id `{0}` (want 16 hex digits)")]
    BadJobId(String),
    /// Not a non-negative integer.
    #[error("bad rank `{0}`")]
    BadRank(String),
    /// Not an integer.
    #[error("bad abort code `{0}`")]
    BadCode(String),
}

impl<'a> Request<'a> {
    /// Parses one line, without its trailing newline.
    ///
    /// # Errors
    /// Any deviation from the grammar in the [module docs](self).
    pub fn parse(line: &'a str) -> Result<Request<'a>, ProtocolError> {
        if line.is_empty() {
            return Err(ProtocolError::Empty);
        }
        let (command, rest) = match line.split_once(' ') {
            Some((c, r)) => (c, Some(r)),
            None => (line, None),
        };
        if command == "ABORT" {
            // The message is free text, so only the code is a strict field.
            let rest = rest.ok_or(ProtocolError::Arity {
                command: "ABORT",
                expected: "a code and a message",
            })?;
            let (code, message) = rest.split_once(' ').unwrap_or((rest, ""));
            let code = code
                .parse::<i32>()
                .map_err(|_| ProtocolError::BadCode(excerpt(code)))?;
            return Ok(Request::Abort { code, message });
        }
        let fields: Vec<&str> = line.split(' ').collect();
        if fields
            .iter()
            .any(|f| f.is_empty() || f.contains(char::is_whitespace))
        {
            return Err(ProtocolError::Whitespace);
        }
        let arity = |n: usize, command: &'static str, expected: &'static str| {
            if fields.len() == n {
                Ok(())
            } else {
                Err(ProtocolError::Arity { command, expected })
            }
        };
        match command {
            "HELLO" => {
                if fields.len() != 5 {
                    arity(
                        3,
                        "HELLO",
                        "a job id and a rank, then optionally a nonce and a proof",
                    )?;
                }
                let job = fields[1].parse::<JobId>()?;
                let rank = fields[2]
                    .parse::<usize>()
                    .map_err(|_| ProtocolError::BadRank(excerpt(fields[2])))?;
                let proof = (fields.len() == 5).then(|| (fields[3], fields[4]));
                Ok(Request::Hello { job, rank, proof })
            }
            "AUTH" => {
                arity(1, "AUTH", "no arguments")?;
                Ok(Request::Auth)
            }
            "PUT" => {
                arity(3, "PUT", "a key and a value")?;
                Ok(Request::Put {
                    key: fields[1],
                    value: fields[2],
                })
            }
            "GET" => {
                arity(2, "GET", "a key")?;
                Ok(Request::Get { key: fields[1] })
            }
            "FENCE" => {
                arity(1, "FENCE", "no arguments")?;
                Ok(Request::Fence)
            }
            "FINALIZE" => {
                arity(1, "FINALIZE", "no arguments")?;
                Ok(Request::Finalize)
            }
            other => Err(ProtocolError::UnknownCommand(excerpt(other))),
        }
    }
}

/// Something a rank told the server that the launcher must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PmiEvent {
    /// A rank sent `ABORT`.
    Abort {
        /// Who.
        rank: usize,
        /// The requested exit code.
        code: i32,
        /// Its message.
        message: String,
    },
    /// A rank completed `HELLO`: it is running and has joined the job. This is how the
    /// launcher learns that a rank it did not start itself (one started by hand) is there.
    Joined {
        /// Who.
        rank: usize,
    },
    /// The connection of a rank that had said `HELLO` closed: the rank ended (cleanly if it
    /// sent `FINALIZE` first, see [`PmiServer::rank_state`]) or lost the network. For ranks
    /// the launcher did not start, this is the only sign that they are gone.
    Left {
        /// Who.
        rank: usize,
    },
}

/// What the server knows about one rank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RankPmiState {
    /// It completed `HELLO`.
    pub connected: bool,
    /// It sent `FINALIZE`.
    pub finalized: bool,
    /// It sent `ABORT` with this code and message.
    pub abort: Option<(i32, String)>,
}

type EventSink = Box<dyn Fn(PmiEvent) + Send + Sync>;

/// A running key-value server for one job. Dropping it closes every connection, wakes ranks
/// blocked in `FENCE` with an `ERR`, and joins its threads.
pub struct PmiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    unix_path: Option<PathBuf>,
    unix_acceptor: Option<JoinHandle<()>>,
    events: Option<Receiver<PmiEvent>>,
}

struct Shared {
    job: JobId,
    size: usize,
    /// The job secret ranks must prove in `HELLO`, when the job has one.
    key: Option<JobKey>,
    state: Mutex<State>,
    fence_done: Condvar,
    sink: EventSink,
}

#[derive(Default)]
struct State {
    kv: HashMap<String, String>,
    ranks: Vec<RankPmiState>,
    fence_waiting: usize,
    fence_generation: u64,
    /// The current fence's wake-up pipe: its write end is dropped when the fence completes,
    /// which makes the read end readable for every waiter polling it next to its connection.
    fence_wake: Option<(Arc<OwnedFd>, OwnedFd)>,
    shutdown: bool,
    /// Clones of every accepted stream, so shutdown can unblock their threads.
    streams: Vec<Conn>,
    handlers: Vec<JoinHandle<()>>,
}

impl PmiServer {
    /// Starts a server for a job of `size` ranks on `127.0.0.1`, on a free port.
    ///
    /// Aborts queue up for [`PmiServer::recv_event_timeout`] (joins and departures are left
    /// out: this server is for tests and tools that watch for aborts).
    ///
    /// # Errors
    /// The socket cannot be bound or the accept thread cannot start.
    pub fn start(size: usize, job: JobId) -> io::Result<PmiServer> {
        let (tx, rx) = mpsc::channel();
        let sink: EventSink = Box::new(move |event| {
            if matches!(event, PmiEvent::Abort { .. }) {
                // The receiver goes away only with the server itself.
                let _ = tx.send(event);
            }
        });
        let mut server = Self::bind(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            size,
            job,
            sink,
            false,
            None,
        )?;
        server.events = Some(rx);
        Ok(server)
    }

    /// Starts a server on `ip` (port chosen by the OS) that hands events to `sink`;
    /// with `unix`, also on a Unix socket in the temporary directory, which ranks on this
    /// machine reach whatever network namespace they run in.
    pub(crate) fn bind(
        ip: IpAddr,
        size: usize,
        job: JobId,
        sink: EventSink,
        unix: bool,
        key: Option<JobKey>,
    ) -> io::Result<PmiServer> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))?;
        let unix_listener = if unix {
            let path = std::env::temp_dir().join(format!("metampi-pmi-{job}.sock"));
            let _ = std::fs::remove_file(&path);
            Some((UnixListener::bind(&path)?, path))
        } else {
            None
        };
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            job,
            size,
            state: Mutex::new(State {
                ranks: vec![RankPmiState::default(); size],
                ..State::default()
            }),
            fence_done: Condvar::new(),
            sink,
            key,
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("metampi-pmi-accept".into())
                .stack_size(128 * 1024)
                .spawn(move || {
                    accept_loop(&shared, listener.incoming().map(|c| c.map(Conn::Tcp)));
                })?
        };
        let mut unix_path = None;
        let mut unix_acceptor = None;
        if let Some((l, path)) = unix_listener {
            let shared = Arc::clone(&shared);
            unix_path = Some(path);
            unix_acceptor = Some(
                std::thread::Builder::new()
                    .name("metampi-pmi-accept-unix".into())
                    .stack_size(128 * 1024)
                    .spawn(move || {
                        accept_loop(&shared, l.incoming().map(|c| c.map(Conn::Unix)));
                    })?,
            );
        }
        Ok(PmiServer {
            addr,
            shared,
            acceptor: Some(acceptor),
            unix_path,
            unix_acceptor,
            events: None,
        })
    }

    /// The Unix socket ranks on this machine may connect to instead (`unix:PATH` in
    /// `METAMPI_PMI`), when the server has one.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix_path.as_deref()
    }

    /// The address ranks connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The job id ranks must present in `HELLO`.
    pub fn job(&self) -> JobId {
        self.shared.job
    }

    /// What the server knows about `rank`; `None` if out of range.
    pub fn rank_state(&self, rank: usize) -> Option<RankPmiState> {
        self.shared.lock().ranks.get(rank).cloned()
    }

    /// Waits up to `timeout` for the next event; `None` on timeout. Always `None` for a
    /// server whose events go to the launcher instead.
    pub fn recv_event_timeout(&self, timeout: Duration) -> Option<PmiEvent> {
        self.events.as_ref()?.recv_timeout(timeout).ok()
    }

    fn stop(&mut self) {
        let wake = {
            let mut state = self.shared.lock();
            state.shutdown = true;
            for stream in &state.streams {
                let _ = stream.shutdown(Shutdown::Both);
            }
            self.shared.fence_done.notify_all();
            std::mem::take(&mut state.handlers)
        };
        // accept() has no timeout; a connection of our own is what wakes it.
        let mut wake_addr = self.addr;
        if wake_addr.ip().is_unspecified() {
            wake_addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let woke = TcpStream::connect_timeout(&wake_addr, Duration::from_secs(2)).is_ok();
        if let Some(acceptor) = self.acceptor.take() {
            // Without the wake-up connection the acceptor would never return; leave it be
            // rather than hang the launcher.
            if woke {
                let _ = acceptor.join();
            }
        }
        if let Some(path) = self.unix_path.take() {
            let woke = UnixStream::connect(&path).is_ok();
            if let Some(acceptor) = self.unix_acceptor.take() {
                if woke {
                    let _ = acceptor.join();
                }
            }
            let _ = std::fs::remove_file(&path);
        }
        for handler in wake {
            let _ = handler.join();
        }
    }
}

impl Drop for PmiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl fmt::Debug for PmiServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PmiServer")
            .field("addr", &self.addr)
            .field("job", &self.shared.job)
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code path panics while holding the lock; if one ever did, the state is still
        // consistent enough to shut down.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection, over TCP or a Unix socket.
#[derive(Debug)]
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.shutdown(how),
            Conn::Unix(s) => s.shutdown(how),
        }
    }
}

impl AsRawFd for Conn {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Conn::Tcp(s) => s.as_raw_fd(),
            Conn::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn accept_loop(shared: &Arc<Shared>, incoming: impl Iterator<Item = io::Result<Conn>>) {
    for stream in incoming {
        let Ok(stream) = stream else {
            // Transient (EMFILE, ECONNABORTED): the listener itself stays usable.
            continue;
        };
        let mut state = shared.lock();
        if state.shutdown {
            return;
        }
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        let handler = {
            let shared = Arc::clone(shared);
            std::thread::Builder::new()
                .name("metampi-pmi-conn".into())
                .stack_size(128 * 1024)
                .spawn(move || serve(&shared, stream))
        };
        if let Ok(handler) = handler {
            state.streams.push(clone);
            state.handlers.push(handler);
        }
    }
}

/// Serves one connection until it closes, errs, or the server shuts down; then reports the
/// departure of the rank it belonged to, if it said `HELLO`.
fn serve(shared: &Shared, stream: Conn) {
    let mut me: Option<usize> = None;
    serve_lines(shared, stream, &mut me);
    if let Some(rank) = me {
        (shared.sink)(PmiEvent::Left { rank });
    }
}

fn serve_lines(shared: &Shared, stream: Conn, me: &mut Option<usize>) {
    if let Conn::Tcp(s) = &stream {
        let _ = s.set_nodelay(true);
    }
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    let mut challenge = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        // One byte more than the limit tells "too long" apart from "exactly at the limit".
        match (&mut reader)
            .take(MAX_LINE as u64 + 2)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            if line.len() > MAX_LINE {
                let _ =
                    writer.write_all(format!("ERR line longer than {MAX_LINE} bytes\n").as_bytes());
            }
            // Either too long or cut off by EOF: the stream has lost its framing.
            return;
        }
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let reply = match std::str::from_utf8(&line) {
            Ok(text) => handle(shared, me, &mut challenge, text, writer.as_raw_fd()),
            Err(_) => Reply::Err("request is not valid UTF-8".into()),
        };
        if matches!(reply, Reply::Closed) {
            return;
        }
        if writer.write_all(reply.to_line().as_bytes()).is_err() {
            return;
        }
        if shared.lock().shutdown {
            return;
        }
    }
}

enum Reply {
    /// The rank closed its connection while waiting (in a fence): nothing to answer.
    Closed,
    Ok,
    Val(String),
    None,
    Err(String),
    Challenge(String),
    Proof(String),
}

impl Reply {
    fn to_line(&self) -> String {
        match self {
            Reply::Ok => "OK\n".into(),
            Reply::Val(v) => format!("VAL {v}\n"),
            Reply::None => "NONE\n".into(),
            Reply::Challenge(n) => format!("CHALLENGE {n}\n"),
            Reply::Proof(p) => format!("OK {p}\n"),
            Reply::Err(msg) => format!("ERR {msg}\n"),
            Reply::Closed => String::new(),
        }
    }
}

/// Answers one request; `conn` is the connection's fd, watched while a fence waits.
fn handle(
    shared: &Shared,
    me: &mut Option<usize>,
    challenge: &mut Option<[u8; 16]>,
    text: &str,
    conn: RawFd,
) -> Reply {
    let request = match Request::parse(text) {
        Ok(r) => r,
        Err(e) => return Reply::Err(e.to_string()),
    };
    let rank = match (request.clone(), *me) {
        (Request::Auth, None) => {
            let Ok(n) = random_bytes::<16>() else {
                return Reply::Err("no randomness for a challenge".into());
            };
            *challenge = Some(n);
            return Reply::Challenge(hex(&n));
        }
        (Request::Hello { job, rank, proof }, None) => {
            if job != shared.job {
                return Reply::Err(format!("job id {job} is not this job's"));
            }
            // With a job secret, a rank proves it knows it (and learns that we do).
            let mut server_proof = None;
            if let Some(key) = &shared.key {
                let (Some(na), Some((nc, tag))) = (challenge.take(), proof) else {
                    return Reply::Err("this job needs AUTH and a proof in HELLO".into());
                };
                let (Some(nc), Some(tag)) = (unhex(nc), unhex(tag)) else {
                    return Reply::Err("the nonce and proof must be hex".into());
                };
                let who = format!("{job} {rank}");
                if !same(&tag, &key.mac(&[b"C", PMI_CTX, &na, &nc, who.as_bytes()])) {
                    return Reply::Err("the proof does not match this job's secret".into());
                }
                server_proof = Some(hex(&key.mac(&[b"A", PMI_CTX, &nc, &na])));
            }
            if rank >= shared.size {
                return Reply::Err(format!(
                    "rank {rank} out of range for a job of {} ranks",
                    shared.size
                ));
            }
            let mut state = shared.lock();
            if state.ranks[rank].connected {
                return Reply::Err(format!("rank {rank} is already connected"));
            }
            state.ranks[rank].connected = true;
            drop(state);
            *me = Some(rank);
            (shared.sink)(PmiEvent::Joined { rank });
            return match server_proof {
                Some(p) => Reply::Proof(p),
                None => Reply::Ok,
            };
        }
        (Request::Auth, Some(_)) => return Reply::Err("AUTH comes before HELLO".into()),
        (Request::Hello { .. }, Some(rank)) => {
            return Reply::Err(format!("this connection already said HELLO as rank {rank}"))
        }
        (_, None) => return Reply::Err("say HELLO first".into()),
        (_, Some(rank)) => rank,
    };
    match request {
        Request::Put { key, value } => {
            shared.lock().kv.insert(key.to_string(), value.to_string());
            Reply::Ok
        }
        Request::Get { key } => match shared.lock().kv.get(key) {
            Some(value) => Reply::Val(value.clone()),
            None => Reply::None,
        },
        Request::Fence => fence(shared, conn),
        Request::Abort { code, message } => {
            shared.lock().ranks[rank].abort = Some((code, message.to_string()));
            (shared.sink)(PmiEvent::Abort {
                rank,
                code,
                message: message.to_string(),
            });
            Reply::Ok
        }
        Request::Finalize => {
            shared.lock().ranks[rank].finalized = true;
            Reply::Ok
        }
        Request::Hello { .. } | Request::Auth => Reply::Err("HELLO handled above".into()),
    }
}

/// A reusable barrier: a generation counter, so a rank released from fence k that races ahead
/// into fence k+1 cannot be confused with the stragglers of fence k.
///
/// A waiter watches its connection too (`conn`, polled next to the fence's wake-up pipe): a
/// rank that the launcher did not start, one started by hand, can only be seen to have gone by
/// its connection closing, and a rank waiting in a fence is where it sits most of the time
/// while the others start.
fn fence(shared: &Shared, conn: RawFd) -> Reply {
    let mut state = shared.lock();
    let generation = state.fence_generation;
    state.fence_waiting += 1;
    if state.fence_waiting >= shared.size {
        state.fence_waiting = 0;
        state.fence_generation += 1;
        // Dropping the write end wakes every waiter's poll.
        state.fence_wake = None;
        shared.fence_done.notify_all();
        return Reply::Ok;
    }
    let wake = match &state.fence_wake {
        Some((read, _)) => Some(Arc::clone(read)),
        None => sys::pipe().ok().map(|(read, write)| {
            let read = Arc::new(read);
            state.fence_wake = Some((Arc::clone(&read), write));
            read
        }),
    };
    if let Some(wake) = wake {
        drop(state);
        loop {
            // Bounded, so that a wake-up can never be missed for long, whatever happens to
            // the pipe.
            let ready = sys::poll_either_for(conn, wake.as_raw_fd(), Duration::from_secs(1));
            state = shared.lock();
            if state.fence_generation != generation {
                return Reply::Ok;
            }
            if state.shutdown {
                break;
            }
            match ready {
                Ok(Some(sys::Ready::First)) if sys::peer_closed(conn).unwrap_or(false) => {
                    // Gone for good: this fence cannot count it.
                    state.fence_waiting -= 1;
                    return Reply::Closed;
                }
                Ok(None) => drop(state),
                // A request sent while waiting (which no client does) or a failed poll: fall
                // back to waiting for the fence alone.
                _ => break,
            }
        }
    }
    while state.fence_generation == generation && !state.shutdown {
        state = shared
            .fence_done
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
    if state.fence_generation == generation {
        Reply::Err("the job is shutting down".into())
    } else {
        Reply::Ok
    }
}

/// At most 40 characters of untrusted input, for error messages.
fn excerpt(s: &str) -> String {
    let mut out: String = s.chars().take(40).collect();
    if out.len() < s.len() {
        out.push_str("...");
    }
    out
}

/// Why a [`PmiClient`] call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PmiClientError {
    /// The connection failed.
    #[error("key-value server connection: {0}")]
    Io(#[from] io::Error),
    /// The server answered `ERR`.
    #[error("key-value server refused: {0}")]
    Refused(String),
    /// The server answered something the protocol does not allow here.
    #[error("unexpected reply from key-value server: `{0}`")]
    UnexpectedReply(String),
    /// A key or value is empty or contains whitespace, which the protocol cannot carry.
    #[error("key or value `{0}` is empty or contains whitespace")]
    BadToken(String),
    /// A `METAMPI_*` variable is missing or malformed.
    #[error("environment variable {name}: {problem}")]
    Env {
        /// The variable.
        name: &'static str,
        /// What is wrong.
        problem: String,
    },
}

/// A blocking client for [`PmiServer`], as a rank uses it.
#[derive(Debug)]
pub struct PmiClient {
    reader: BufReader<Conn>,
    writer: Conn,
}

impl PmiClient {
    /// Connects and says `HELLO`.
    ///
    /// # Errors
    /// Connection failure or `ERR` from the server.
    pub fn connect(
        addr: impl ToSocketAddrs,
        job: JobId,
        rank: usize,
    ) -> Result<PmiClient, PmiClientError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Self::hello(Conn::Tcp(stream), job, rank)
    }

    /// Connects over the server's Unix socket ([`PmiServer::unix_path`]) and says `HELLO`.
    ///
    /// # Errors
    /// Connection failure or `ERR` from the server.
    pub fn connect_unix(
        path: impl AsRef<Path>,
        job: JobId,
        rank: usize,
    ) -> Result<PmiClient, PmiClientError> {
        Self::hello(Conn::Unix(UnixStream::connect(path)?), job, rank)
    }

    fn hello(stream: Conn, job: JobId, rank: usize) -> Result<PmiClient, PmiClientError> {
        let mut client = PmiClient {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        // A job started by the launcher has a secret: prove it (and check the server's proof).
        match std::env::var("METAMPI_SECRET")
            .ok()
            .and_then(|k| JobKey::from_hex(&k))
        {
            Some(key) => {
                let reply = client.request("AUTH")?;
                let Some(challenge) = reply.strip_prefix("CHALLENGE ") else {
                    return Err(unexpected(reply));
                };
                let (line, expect) = key
                    .hello(challenge, job, rank)
                    .ok_or_else(|| unexpected(reply.clone()))?;
                let reply = client.request(&line)?;
                if reply.strip_prefix("OK ") != Some(expect.as_str()) {
                    return Err(unexpected(reply));
                }
            }
            None => client.expect_ok(&format!("HELLO {job} {rank}"))?,
        }
        Ok(client)
    }

    /// Connects using `METAMPI_PMI`, `METAMPI_JOB` and `METAMPI_RANK`, as a rank started by
    /// [`run`](crate::run) finds them.
    ///
    /// # Errors
    /// A missing or malformed variable, or as [`PmiClient::connect`].
    pub fn from_env() -> Result<PmiClient, PmiClientError> {
        let var = |name: &'static str| {
            std::env::var(name).map_err(|e| PmiClientError::Env {
                name,
                problem: e.to_string(),
            })
        };
        let addr = var("METAMPI_PMI")?;
        let job = var("METAMPI_JOB")?
            .parse::<JobId>()
            .map_err(|e| PmiClientError::Env {
                name: "METAMPI_JOB",
                problem: e.to_string(),
            })?;
        let rank = var("METAMPI_RANK")?
            .parse::<usize>()
            .map_err(|e| PmiClientError::Env {
                name: "METAMPI_RANK",
                problem: e.to_string(),
            })?;
        match addr.strip_prefix("unix:") {
            Some(path) => PmiClient::connect_unix(path, job, rank),
            None => PmiClient::connect(addr.as_str(), job, rank),
        }
    }

    /// Publishes `key = value`; visible to every rank after the next [`PmiClient::fence`].
    ///
    /// # Errors
    /// A key or value the protocol cannot carry, connection failure, or `ERR`.
    pub fn put(&mut self, key: &str, value: &str) -> Result<(), PmiClientError> {
        check_token(key)?;
        check_token(value)?;
        self.expect_ok(&format!("PUT {key} {value}"))
    }

    /// Looks `key` up.
    ///
    /// # Errors
    /// A key the protocol cannot carry, connection failure, or `ERR`.
    pub fn get(&mut self, key: &str) -> Result<Option<String>, PmiClientError> {
        check_token(key)?;
        let reply = self.request(&format!("GET {key}"))?;
        if reply == "NONE" {
            return Ok(None);
        }
        if let Some(value) = reply.strip_prefix("VAL ") {
            return Ok(Some(value.to_string()));
        }
        Err(unexpected(reply))
    }

    /// Blocks until every rank of the job has called `fence` as often as this one.
    ///
    /// # Errors
    /// Connection failure, or `ERR` if the job is shutting down.
    pub fn fence(&mut self) -> Result<(), PmiClientError> {
        self.expect_ok("FENCE")
    }

    /// Asks the launcher to end the whole job with exit status `code`.
    ///
    /// # Errors
    /// Connection failure or `ERR`.
    pub fn abort(&mut self, code: i32, message: &str) -> Result<(), PmiClientError> {
        // The protocol is line-based, so the message must stay on one line.
        let message: String = message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        self.expect_ok(&format!("ABORT {code} {message}"))
    }

    /// Tells the launcher this rank is about to exit cleanly.
    ///
    /// # Errors
    /// Connection failure or `ERR`.
    pub fn finalize(mut self) -> Result<(), PmiClientError> {
        self.expect_ok("FINALIZE")
    }

    /// Sends one raw line (without newline) and returns the reply line (without newline).
    /// For tests and tools; the typed methods are the normal way in.
    ///
    /// # Errors
    /// Connection failure, or the server closing the connection instead of answering.
    pub fn request(&mut self, line: &str) -> Result<String, PmiClientError> {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.writer.write_all(&bytes)?;
        let mut reply = String::new();
        if self.reader.read_line(&mut reply)? == 0 {
            return Err(PmiClientError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        if reply.ends_with('\n') {
            reply.pop();
        }
        Ok(reply)
    }

    fn expect_ok(&mut self, line: &str) -> Result<(), PmiClientError> {
        let reply = self.request(line)?;
        if reply == "OK" {
            Ok(())
        } else {
            Err(unexpected(reply))
        }
    }
}

fn unexpected(reply: String) -> PmiClientError {
    match reply.strip_prefix("ERR ") {
        Some(msg) => PmiClientError::Refused(msg.to_string()),
        None => PmiClientError::UnexpectedReply(reply),
    }
}

fn check_token(token: &str) -> Result<(), PmiClientError> {
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(PmiClientError::BadToken(token.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: JobId = JobId(0x0123_4567_89ab_cdef);

    #[test]
    fn job_id_round_trips_as_16_hex_digits() {
        assert_eq!(JOB.to_string(), "0123456789abcdef");
        assert_eq!("0123456789ABCDEF".parse::<JobId>().unwrap(), JOB);
        assert_eq!(JobId(1).to_string(), "0000000000000001");
        assert!("123".parse::<JobId>().is_err());
        assert!("0123456789abcdeg".parse::<JobId>().is_err());
        assert!("+123456789abcdef".parse::<JobId>().is_err());
        assert_ne!(JobId::random(), JobId::random());
    }

    #[test]
    fn parses_every_request() {
        assert_eq!(
            Request::parse("HELLO 0123456789abcdef 7"),
            Ok(Request::Hello {
                job: JOB,
                rank: 7,
                proof: None
            })
        );
        assert_eq!(
            Request::parse("PUT k v=1"),
            Ok(Request::Put {
                key: "k",
                value: "v=1"
            })
        );
        assert_eq!(Request::parse("GET k"), Ok(Request::Get { key: "k" }));
        assert_eq!(Request::parse("FENCE"), Ok(Request::Fence));
        assert_eq!(Request::parse("FINALIZE"), Ok(Request::Finalize));
        assert_eq!(
            Request::parse("ABORT 3 disk  full, giving up"),
            Ok(Request::Abort {
                code: 3,
                message: "disk  full, giving up"
            })
        );
        assert_eq!(
            Request::parse("ABORT -1"),
            Ok(Request::Abort {
                code: -1,
                message: ""
            })
        );
    }

    #[test]
    fn rejects_malformed_requests() {
        let bad = [
            ("", ProtocolError::Empty),
            (
                "hello 0123456789abcdef 1",
                ProtocolError::UnknownCommand("hello".into()),
            ),
            (
                "PUT k",
                ProtocolError::Arity {
                    command: "PUT",
                    expected: "a key and a value",
                },
            ),
            (
                "PUT k v extra",
                ProtocolError::Arity {
                    command: "PUT",
                    expected: "a key and a value",
                },
            ),
            ("PUT  k v", ProtocolError::Whitespace),
            ("PUT k\tx v", ProtocolError::Whitespace),
            ("GET k ", ProtocolError::Whitespace),
            (
                "FENCE now",
                ProtocolError::Arity {
                    command: "FENCE",
                    expected: "no arguments",
                },
            ),
            ("HELLO 12 1", ProtocolError::BadJobId("12".into())),
            (
                "HELLO 0123456789abcdef -1",
                ProtocolError::BadRank("-1".into()),
            ),
            (
                "HELLO 0123456789abcdef 99999999999999999999999",
                ProtocolError::BadRank("99999999999999999999999".into()),
            ),
            (
                "ABORT",
                ProtocolError::Arity {
                    command: "ABORT",
                    expected: "a code and a message",
                },
            ),
            ("ABORT x msg", ProtocolError::BadCode("x".into())),
        ];
        for (line, want) in bad {
            assert_eq!(Request::parse(line), Err(want), "{line:?}");
        }
    }

    #[test]
    fn garbage_never_panics_the_parser() {
        // A cheap deterministic fuzz: every short string over an alphabet rich in separators.
        let alphabet = [
            "HELLO",
            "PUT",
            "GET",
            "FENCE",
            "ABORT",
            " ",
            "  ",
            "\t",
            "-1",
            "x",
            "0123456789abcdef",
            "é",
            "\u{0}",
        ];
        let mut count = 0;
        for a in alphabet {
            for b in alphabet {
                for c in alphabet {
                    for d in alphabet {
                        let line = format!("{a}{b}{c}{d}");
                        let _ = Request::parse(&line);
                        count += 1;
                    }
                }
            }
        }
        assert_eq!(count, alphabet.len().pow(4));
    }

    fn raw(addr: SocketAddr) -> (BufReader<TcpStream>, TcpStream) {
        let s = TcpStream::connect(addr).unwrap();
        (BufReader::new(s.try_clone().unwrap()), s)
    }

    fn say(conn: &mut (BufReader<TcpStream>, TcpStream), bytes: &[u8]) -> String {
        conn.1.write_all(bytes).unwrap();
        let mut reply = String::new();
        conn.0.read_line(&mut reply).unwrap();
        reply
    }

    #[test]
    fn a_job_secret_is_proved_and_strangers_wrong_keys_and_replays_are_refused() {
        let job = JobId::random();
        let hexkey = "ab".repeat(32);
        let key = JobKey::from_hex(&hexkey).unwrap();
        let server = PmiServer::bind(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            3,
            job,
            Box::new(|_| {}),
            false,
            Some(key.clone()),
        )
        .unwrap();
        let challenge = |c: &mut (BufReader<TcpStream>, TcpStream)| {
            let r = say(c, b"AUTH\n");
            r.trim().strip_prefix("CHALLENGE ").unwrap().to_string()
        };
        // A stranger that knows the job id but not the secret.
        let mut c = raw(server.addr());
        assert!(say(&mut c, format!("HELLO {job} 0\n").as_bytes()).starts_with("ERR "));
        // A wrong secret.
        let wrong = JobKey::from_hex(&"cd".repeat(32)).unwrap();
        let na = challenge(&mut c);
        let (line, _) = wrong.hello(&na, job, 0).unwrap();
        assert!(say(&mut c, format!("{line}\n").as_bytes()).starts_with("ERR "));
        // A replay of a valid answer to an earlier challenge.
        let mut first = raw(server.addr());
        let na1 = challenge(&mut first);
        let (recorded, _) = key.hello(&na1, job, 1).unwrap();
        drop(first);
        let mut c = raw(server.addr());
        let na2 = challenge(&mut c);
        assert_ne!(na1, na2);
        assert!(say(&mut c, format!("{recorded}\n").as_bytes()).starts_with("ERR "));
        assert!(!server.rank_state(1).unwrap().connected);
        // The real rank: accepted, and the server proves the secret back.
        let mut c = raw(server.addr());
        let na = challenge(&mut c);
        let (line, expect) = key.hello(&na, job, 2).unwrap();
        assert_eq!(
            say(&mut c, format!("{line}\n").as_bytes()).trim(),
            format!("OK {expect}")
        );
        assert!(server.rank_state(2).unwrap().connected);
        assert_eq!(say(&mut c, b"PUT k v\n").trim(), "OK");
    }

    #[test]
    fn server_answers_garbage_with_err_and_keeps_serving() {
        let server = PmiServer::start(2, JOB).unwrap();
        let mut c = raw(server.addr());
        assert!(say(&mut c, b"PUT a b\n").starts_with("ERR say HELLO first"));
        assert!(say(&mut c, b"\xff\xfe\n").starts_with("ERR request is not valid UTF-8"));
        assert!(say(&mut c, b"\n").starts_with("ERR empty"));
        assert!(say(&mut c, b"HELLO ffffffffffffffff 0\n").starts_with("ERR job id"));
        assert!(say(&mut c, b"HELLO 0123456789abcdef 2\n").starts_with("ERR rank 2 out of range"));
        assert_eq!(say(&mut c, b"HELLO 0123456789abcdef 1\r\n"), "OK\n");
        assert!(
            say(&mut c, b"HELLO 0123456789abcdef 0\n").starts_with("ERR this connection already")
        );
        assert!(say(&mut c, b"BOGUS\n").starts_with("ERR unknown command"));
        assert_eq!(say(&mut c, b"PUT a b\n"), "OK\n");
        assert_eq!(say(&mut c, b"GET a\n"), "VAL b\n");
        assert_eq!(say(&mut c, b"GET zz\n"), "NONE\n");

        let mut dup = raw(server.addr());
        assert!(say(&mut dup, b"HELLO 0123456789abcdef 1\n")
            .starts_with("ERR rank 1 is already connected"));

        // An over-long line closes that connection only.
        let mut long = raw(server.addr());
        let mut huge = vec![b'x'; MAX_LINE + 10];
        huge.push(b'\n');
        assert!(say(&mut long, &huge).starts_with("ERR line longer"));
        assert_eq!(say(&mut c, b"GET a\n"), "VAL b\n");
        assert!(server.rank_state(1).unwrap().connected);
        assert!(!server.rank_state(0).unwrap().connected);
    }

    #[test]
    fn fence_is_a_reusable_barrier_and_publishes_puts() {
        const N: usize = 4;
        let server = PmiServer::start(N, JOB).unwrap();
        let addr = server.addr();
        let threads: Vec<_> = (0..N)
            .map(|rank| {
                std::thread::spawn(move || {
                    let mut c = PmiClient::connect(addr, JOB, rank).unwrap();
                    for round in 0..3 {
                        c.put(
                            &format!("r{round}-{rank}"),
                            &format!("v{}", rank * 10 + round),
                        )
                        .unwrap();
                        c.fence().unwrap();
                        for peer in 0..N {
                            assert_eq!(
                                c.get(&format!("r{round}-{peer}")).unwrap(),
                                Some(format!("v{}", peer * 10 + round)),
                                "rank {rank} round {round}"
                            );
                        }
                    }
                    c.finalize().unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for rank in 0..N {
            let state = server.rank_state(rank).unwrap();
            assert!(state.connected && state.finalized);
        }
    }

    /// A server whose every event (joins and departures too) arrives on the returned channel.
    fn server_with_events(size: usize) -> (PmiServer, Receiver<PmiEvent>) {
        let (tx, rx) = mpsc::channel();
        let sink: EventSink = Box::new(move |event| {
            let _ = tx.send(event);
        });
        let server = PmiServer::bind(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            size,
            JOB,
            sink,
            false,
            None,
        )
        .unwrap();
        (server, rx)
    }

    #[test]
    fn joins_and_departures_are_events_even_during_a_fence() {
        let (server, events) = server_with_events(3);
        let wait = Duration::from_secs(5);
        let a = PmiClient::connect(server.addr(), JOB, 0).unwrap();
        assert_eq!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::Joined { rank: 0 }
        );
        let addr = server.addr();
        // Rank 1 enters a fence that cannot complete (rank 2 never comes), then dies: its
        // departure is seen at once, not when the fence would have completed.
        let waiter = std::thread::spawn(move || {
            let mut b = PmiClient::connect(addr, JOB, 1).unwrap();
            b.writer.write_all(b"FENCE\n").unwrap();
            b
        });
        assert_eq!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::Joined { rank: 1 }
        );
        let b = waiter.join().unwrap();
        // Give the server time to enter the fence; if it has not yet, it finds the connection
        // closed there all the same.
        std::thread::sleep(Duration::from_millis(100));
        drop(b);
        assert_eq!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::Left { rank: 1 }
        );
        assert_eq!(server.shared.lock().fence_waiting, 0);
        // A finalized rank's departure is an event as well; its state tells the two apart.
        a.finalize().unwrap();
        assert_eq!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::Left { rank: 0 }
        );
        assert!(server.rank_state(0).unwrap().finalized);
        assert!(!server.rank_state(1).unwrap().finalized);
    }

    #[test]
    fn abort_becomes_an_event() {
        let server = PmiServer::start(2, JOB).unwrap();
        let mut c = PmiClient::connect(server.addr(), JOB, 1).unwrap();
        c.abort(7, "bad\ninput").unwrap();
        assert_eq!(
            server.recv_event_timeout(Duration::from_secs(5)),
            Some(PmiEvent::Abort {
                rank: 1,
                code: 7,
                message: "bad input".into()
            })
        );
        assert_eq!(
            server.rank_state(1).unwrap().abort,
            Some((7, "bad input".into()))
        );
    }

    #[test]
    fn dropping_the_server_releases_a_pending_fence() {
        let server = PmiServer::start(2, JOB).unwrap();
        let addr = server.addr();
        let waiter = std::thread::spawn(move || {
            let mut c = PmiClient::connect(addr, JOB, 0).unwrap();
            c.fence()
        });
        // Give the rank time to enter the fence; if it has not yet, it still fails cleanly
        // because the server is gone.
        std::thread::sleep(Duration::from_millis(100));
        drop(server);
        assert!(waiter.join().unwrap().is_err());
    }

    #[test]
    fn client_refuses_tokens_the_protocol_cannot_carry() {
        let server = PmiServer::start(1, JOB).unwrap();
        let mut c = PmiClient::connect(server.addr(), JOB, 0).unwrap();
        assert!(matches!(
            c.put("a b", "v"),
            Err(PmiClientError::BadToken(_))
        ));
        assert!(matches!(c.put("k", ""), Err(PmiClientError::BadToken(_))));
        // A single-rank fence completes at once.
        c.fence().unwrap();
    }
}
