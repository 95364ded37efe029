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
//! | `FENCE` | `OK`, sent to every rank once all `size` ranks have issued their k-th FENCE and every helper has said `HELPER` |
//! | `GET <key>` | `VAL <value>` or `NONE` |
//! | `ABORT <code> <message>` | `OK`; the launcher then ends the job with exit status `code` |
//! | `FINALIZE` | `OK`; the rank will exit cleanly |
//! | `HELPER <job> <index>` | `OK`, or `ERR <msg>` as for `HELLO`; see below |
//! | `WATCH` | `OK`; the rank answers `REPORT` from now on, see below |
//! | `STATE <waited> <text>[<sections>]` | none: the rank's answer to `REPORT` |
//!
//! Every request but `HELLO` needs a successful `HELLO` on the same connection first, so a
//! stray client that does not know the job id can change nothing. Anything malformed gets
//! `ERR <reason>` and the connection stays usable; a line longer than [`MAX_LINE`] bytes
//! closes it. Network input never panics the server.
//!
//! PUTs made before a FENCE are visible to GETs made after it: each connection is served in
//! order and the barrier releases nobody until every rank has reached it.
//!
//! # Helpers
//! A process of the job that is not a rank and that the launcher did not start itself (a
//! router on a machine started by hand, see [`HostLaunch::Manual`](crate::HostLaunch::Manual))
//! says `HELPER <job> <index>` instead of `HELLO`, once it is running, with its index among
//! the job's helpers ([`HELPER_ENV`]). The launcher learns from it that the helper is up, and
//! from the connection closing that it is gone. No fence completes before every helper is
//! up, so that ranks past a fence may use what the helpers serve (routers' ports). The helper sends nothing more: it waits, and
//! the server writes `END` and closes the connection when the job is over, which is the
//! helper's sign to leave (a connection that closes without `END` means the launcher is gone).
//!
//! # Reports
//! A rank that has said `WATCH` reads its connection on a thread of its own from then on: the
//! server may write `REPORT` to it at any time, and the rank answers with one `STATE` line,
//! which gets no reply: `<waited>` is how long its oldest current wait has lasted, in
//! milliseconds (`-` when no thread of it waits), and `<text>` says what it waits in; after
//! a tab may follow its traffic counters and, asked with `REPORT CALLS`, the calls it made
//! lately ([`crate::answer`] has the format, and how older ranks and launchers get along
//! with it). The launcher asks ([`PmiServer::ask_reports`]) when the user wants a hang
//! report, to find a job that no longer moves, and for the live view. At most one `REPORT` is
//! outstanding per rank, so a rank that does not read (a stopped process) cannot block the
//! server.
//!
//! With a job secret, `HELLO` and `HELPER` prove it: `AUTH` first, answered with
//! `CHALLENGE <hex>`; then the request carries the client's nonce and an HMAC-SHA256 over both
//! nonces and who the client is, and the `OK` carries the server's proof in return.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::answer::{self, Answer, Ask, RecentCalls, Traffic};
use crate::auth::{hex, same, unhex};
use crate::sys;

/// Handshake context of the bootstrap connection.
const PMI_CTX: &str = "metampi pmi";

/// How long a connection may take to introduce itself (`HELLO` or `HELPER`, with `AUTH`
/// first where the job has a secret) before the server closes it: a stranger cannot hold a
/// connection, and its thread, for longer.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// Connections not yet introduced that the server keeps open at once, at least; a job of
/// many ranks gets twice its ranks and helpers, as they all connect at start-up.
const STRANGERS_MIN: usize = 64;
/// Least time between two log lines about refused connections.
const REFUSAL_LOG_GAP: Duration = Duration::from_secs(10);

/// A job's secret as the bootstrap exchange uses it: a rank proves it knows
/// it with `AUTH` (the server's challenge) and an HMAC-SHA256 in `HELLO`, and
/// the server proves it back in its `OK`; the secret never crosses the wire. The same
/// secret and steps as every other connection of the job ([`crate::auth`]).
pub type JobKey = crate::auth::Secret;

impl JobKey {
    /// The `HELLO` line answering `challenge` (the hex after `CHALLENGE`), and
    /// the proof the server must send back in `OK <proof>`.
    pub fn hello(&self, challenge: &str, job: JobId, rank: usize) -> Option<(String, String)> {
        self.introduce(challenge, Peer::Rank(rank), job)
    }

    /// The `HELPER` line answering `challenge` for helper `index`, and the proof the server
    /// must send back in `OK <proof>`.
    pub fn helper(&self, challenge: &str, job: JobId, index: usize) -> Option<(String, String)> {
        self.introduce(challenge, Peer::Helper(index), job)
    }

    fn introduce(&self, challenge: &str, peer: Peer, job: JobId) -> Option<(String, String)> {
        let na = unhex(challenge)?;
        let nc = crate::auth::nonce().ok()?;
        let tag = self.connector_tag(PMI_CTX, &na, &nc, peer.proved(job).as_bytes());
        let expect = hex(&self.acceptor_tag(PMI_CTX, &nc, &na));
        Some((
            format!(
                "{} {job} {} {} {}",
                peer.verb(),
                peer.index(),
                hex(&nc),
                hex(&tag)
            ),
            expect,
        ))
    }
}

/// Who a connection belongs to, once it has introduced itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Rank(usize),
    Helper(usize),
}

impl Peer {
    fn verb(self) -> &'static str {
        match self {
            Peer::Rank(_) => "HELLO",
            Peer::Helper(_) => "HELPER",
        }
    }

    fn index(self) -> usize {
        match self {
            Peer::Rank(i) | Peer::Helper(i) => i,
        }
    }

    /// What the HMAC of the introduction covers besides the nonces: a proof made for a rank
    /// cannot pass for a helper, nor the other way round.
    fn proved(self, job: JobId) -> String {
        match self {
            Peer::Rank(rank) => format!("{job} {rank}"),
            Peer::Helper(index) => format!("helper {job} {index}"),
        }
    }
}

/// Longest request line accepted, in bytes, without the newline.
pub const MAX_LINE: usize = 64 * 1024;

/// The variable that gives a helper its index among the job's helpers (next to
/// `METAMPI_PMI` and `METAMPI_JOB`, which it shares with the ranks); see
/// [`PmiClient::helper_from_env`].
pub const HELPER_ENV: &str = "METAMPI_HELPER";

/// Identifies one job, so that a rank of another job (or a stray client) cannot join it.
/// Shown as 16 lowercase hex digits, which is the `METAMPI_JOB` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobId(pub u64);

impl JobId {
    /// A fresh, unpredictable id: from the OS random source, or, failing that, from std's
    /// randomly keyed hasher over the time and pid.
    pub fn random() -> JobId {
        if let Ok(bytes) = crate::auth::random_bytes::<8>() {
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
    /// `WATCH`: the rank answers `REPORT` from now on.
    Watch,
    /// `STATE <waited> <text>[<sections>]`: a rank's answer to `REPORT`.
    State {
        /// Its oldest current wait, in milliseconds; `None` for `-` (it does not wait).
        waited_ms: Option<u64>,
        /// What it waits in, free text.
        text: &'a str,
        /// What follows the text after its first tab (traffic counters, recent calls: see
        /// [`crate::answer`]); empty where nothing does.
        sections: &'a str,
    },
    /// `HELPER <job> <index> [<nonce> <proof>]`: a helper (not a rank) is up; see the
    /// [module docs](self).
    Helper {
        /// The job id the helper was given.
        job: JobId,
        /// Its index among the job's helpers.
        index: usize,
        /// As for [`Request::Hello`].
        proof: Option<(&'a str, &'a str)>,
    },
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
    /// Not a non-negative integer.
    #[error("bad helper index `{0}`")]
    BadHelper(String),
    /// Neither `-` nor a number of milliseconds.
    #[error("bad wait time `{0}` (want milliseconds or `-`)")]
    BadWaited(String),
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
        if command == "STATE" {
            let rest = rest.ok_or(ProtocolError::Arity {
                command: "STATE",
                expected: "a wait time and a text",
            })?;
            let (waited, text) = rest.split_once(' ').unwrap_or((rest, ""));
            let (text, sections) = text.split_once('\t').unwrap_or((text, ""));
            let waited_ms = match waited {
                "-" => None,
                ms => Some(
                    ms.parse::<u64>()
                        .map_err(|_| ProtocolError::BadWaited(excerpt(ms)))?,
                ),
            };
            return Ok(Request::State {
                waited_ms,
                text,
                sections,
            });
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
            "HELPER" => {
                if fields.len() != 5 {
                    arity(
                        3,
                        "HELPER",
                        "a job id and a helper index, then optionally a nonce and a proof",
                    )?;
                }
                let job = fields[1].parse::<JobId>()?;
                let index = fields[2]
                    .parse::<usize>()
                    .map_err(|_| ProtocolError::BadHelper(excerpt(fields[2])))?;
                let proof = (fields.len() == 5).then(|| (fields[3], fields[4]));
                Ok(Request::Helper { job, index, proof })
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
            "WATCH" => {
                arity(1, "WATCH", "no arguments")?;
                Ok(Request::Watch)
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
    /// A rank answered `REPORT` ([`PmiServer::ask_reports`]).
    Report {
        /// Who.
        rank: usize,
        /// How long its oldest current wait has lasted; `None`: no thread of it waits.
        waited: Option<Duration>,
        /// What it waits in.
        text: String,
        /// Its traffic counters; `None` from a rank that sends none.
        traffic: Option<Traffic>,
        /// The calls it made since it last said, when asked for them and it records them.
        calls: Option<RecentCalls>,
    },
    /// A helper completed `HELPER`: it is up.
    HelperJoined {
        /// Its index among the job's helpers.
        helper: usize,
    },
    /// The connection of a helper that had said `HELPER` closed: it ended or lost the network
    /// (or the server is shutting down).
    HelperLeft {
        /// Its index among the job's helpers.
        helper: usize,
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
    /// The thread that accepts connections and holds them until they introduce themselves.
    gate: Option<JoinHandle<()>>,
    /// Dropped to wake the gate when the server stops.
    gate_wake: Option<UnixStream>,
    unix_path: Option<PathBuf>,
    events: Option<Receiver<PmiEvent>>,
}

struct Shared {
    job: JobId,
    size: usize,
    /// How many helpers the job has (`HELPER` indices are below it).
    helpers: usize,
    /// The job secret ranks must prove in `HELLO`, when the job has one.
    key: Option<JobKey>,
    state: Mutex<State>,
    fence_done: Condvar,
    sink: EventSink,
    /// Connections accepted that have not introduced themselves yet.
    strangers: AtomicUsize,
    /// [`HANDSHAKE_DEADLINE`], in milliseconds (tests shorten it).
    handshake_ms: AtomicU64,
}

impl Shared {
    /// How many connections that have not introduced themselves are kept open at once.
    fn strangers_cap(&self) -> usize {
        STRANGERS_MIN.max(2 * (self.size + self.helpers))
    }
}

/// A rank that said `WATCH`: the writing side of its connection, whether a `REPORT` to it
/// is still unanswered, and whether its answers carry counters (so it knows `REPORT CALLS`).
struct Watched {
    writer: Arc<Mutex<Conn>>,
    outstanding: bool,
    counts: bool,
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
    /// Which helpers have said `HELPER`.
    helpers: Vec<bool>,
    shutdown: bool,
    /// Clones of every accepted stream, so shutdown can unblock their threads.
    streams: Vec<Conn>,
    /// Clones of the helpers' streams, which get `END` at shutdown.
    helper_streams: Vec<Conn>,
    /// Each rank that said `WATCH`.
    watched: HashMap<usize, Watched>,
    handlers: Vec<JoinHandle<()>>,
    /// Connections refused because too many strangers were open, and when that was last logged
    /// (with how many had been refused by then).
    refused: u64,
    refusals_logged: Option<(Instant, u64)>,
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
        Self::start_with_key(size, job, None)
    }

    /// As [`PmiServer::start`], for ranks that must prove `key` (`AUTH`) when one is given.
    /// A process that starts others (`MPI_Comm_spawn`) hosts their start-up with it.
    ///
    /// # Errors
    /// As for [`PmiServer::start`].
    pub fn start_with_key(size: usize, job: JobId, key: Option<JobKey>) -> io::Result<PmiServer> {
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
            0,
            job,
            sink,
            false,
            key,
        )?;
        server.events = Some(rx);
        Ok(server)
    }

    /// Starts a server on `ip` (port chosen by the OS) for `size` ranks and `helpers` helpers
    /// that hands events to `sink`; with `unix`, also on a Unix socket in the temporary
    /// directory, which ranks on this machine reach whatever network namespace they run in.
    pub(crate) fn bind(
        ip: IpAddr,
        size: usize,
        helpers: usize,
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
            helpers,
            state: Mutex::new(State {
                ranks: vec![RankPmiState::default(); size],
                helpers: vec![false; helpers],
                ..State::default()
            }),
            fence_done: Condvar::new(),
            sink,
            key,
            strangers: AtomicUsize::new(0),
            handshake_ms: AtomicU64::new(HANDSHAKE_DEADLINE.as_millis() as u64),
        });
        listener.set_nonblocking(true)?;
        let unix_path = match unix_listener {
            Some((l, path)) => {
                l.set_nonblocking(true)?;
                Some((l, path))
            }
            None => None,
        };
        let (wake_rx, wake_tx) = UnixStream::pair()?;
        let gate = {
            let shared = Arc::clone(&shared);
            let unix = unix_path.as_ref().map(|(l, _)| l.try_clone()).transpose()?;
            std::thread::Builder::new()
                .name("metampi-pmi-gate".into())
                .stack_size(256 * 1024)
                .spawn(move || Gate::new(shared, listener, unix, wake_rx).run())?
        };
        Ok(PmiServer {
            addr,
            shared,
            gate: Some(gate),
            gate_wake: Some(wake_tx),
            unix_path: unix_path.map(|(_, path)| path),
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

    /// Writes `REPORT` to every rank that said `WATCH` and has not finalized, unless the
    /// last one to it is still unanswered; answers come as [`PmiEvent::Report`]. With
    /// [`Ask::WaitAndCalls`], ranks whose answers have shown that they know it are asked
    /// `REPORT CALLS` instead. Returns the ranks that owe an answer now (asked now or
    /// before), in rank order.
    pub fn ask_reports(&self, ask: Ask) -> Vec<usize> {
        let mut state = self.shared.lock();
        let State { watched, ranks, .. } = &mut *state;
        let mut owing = Vec::new();
        for (&rank, w) in watched.iter_mut() {
            if ranks.get(rank).is_some_and(|r| r.finalized) {
                continue;
            }
            if !w.outstanding {
                let ask = if w.counts { ask } else { Ask::Wait };
                // A short line into a socket that has at most one other `REPORT` unread:
                // this cannot block on a rank that stopped reading.
                let mut conn = w.writer.lock().unwrap_or_else(PoisonError::into_inner);
                if conn.write_all(ask.line()).is_err() {
                    continue;
                }
                w.outstanding = true;
            }
            owing.push(rank);
        }
        owing.sort_unstable();
        owing
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
            // The job is over: helpers leave on this line. Four bytes into a socket whose peer
            // never gets anything else cannot block.
            for stream in &mut state.helper_streams {
                let _ = stream.write_all(b"END\n");
            }
            for stream in &state.streams {
                let _ = stream.shutdown(Shutdown::Both);
            }
            self.shared.fence_done.notify_all();
            std::mem::take(&mut state.handlers)
        };
        // The gate polls the other end of this socket pair.
        drop(self.gate_wake.take());
        if let Some(gate) = self.gate.take() {
            let _ = gate.join();
        }
        if let Some(path) = self.unix_path.take() {
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

    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_nonblocking(on),
            Conn::Unix(s) => s.set_nonblocking(on),
        }
    }

    /// Who is at the other end, for a log line.
    fn peer(&self) -> String {
        match self {
            Conn::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "an unknown address".into(), |a| a.to_string()),
            Conn::Unix(_) => "a local socket".into(),
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

/// A connection accepted that has not introduced itself yet: held without a thread, read
/// when it has bytes, closed at its deadline.
struct Stranger {
    conn: Conn,
    /// Bytes read and not yet taken as lines.
    got: Vec<u8>,
    challenge: Option<[u8; 16]>,
    until: Instant,
}

/// What became of a stranger after its bytes were read.
enum Fate {
    Waits,
    Closed,
    /// Introduced as this peer: the reply to its introduction, and the bytes it sent after it.
    Introduced(Peer, String, Vec<u8>),
}

/// The one thread that accepts connections on the server's sockets and holds every one that
/// has not introduced itself (`HELLO`, `HELPER`, with `AUTH` before them), non-blocking, in one
/// `poll`. A stranger costs a descriptor and a buffer of at most [`MAX_LINE`] bytes, no thread,
/// and at most [`Shared::strangers_cap`] are held; a connection gets its own thread once it has
/// introduced itself, as ranks and helpers do at once.
struct Gate {
    shared: Arc<Shared>,
    tcp: TcpListener,
    unix: Option<UnixListener>,
    wake: UnixStream,
    strangers: Vec<Stranger>,
}

impl Gate {
    fn new(
        shared: Arc<Shared>,
        tcp: TcpListener,
        unix: Option<UnixListener>,
        wake: UnixStream,
    ) -> Gate {
        Gate {
            shared,
            tcp,
            unix,
            wake,
            strangers: Vec::new(),
        }
    }

    fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            let pollfd = |fd: RawFd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            fds.clear();
            fds.push(pollfd(self.wake.as_raw_fd()));
            fds.push(pollfd(self.tcp.as_raw_fd()));
            fds.push(pollfd(self.unix.as_ref().map_or(-1, AsRawFd::as_raw_fd)));
            fds.extend(self.strangers.iter().map(|s| pollfd(s.conn.as_raw_fd())));
            let timeout = self
                .strangers
                .iter()
                .map(|s| s.until)
                .min()
                .map(|t| t.saturating_duration_since(Instant::now()));
            if crate::sys::poll_fds(&mut fds, timeout).is_err() {
                // Only a bad argument makes poll fail; go on after a pause rather than spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            if fds[0].revents != 0 || self.shared.lock().shutdown {
                return;
            }
            // Strangers first (their indices match `fds`), then the newcomers.
            let now = Instant::now();
            let mut k = self.strangers.len();
            while k > 0 {
                k -= 1;
                let fate = if fds[3 + k].revents != 0 {
                    self.read(k)
                } else {
                    Fate::Waits
                };
                match fate {
                    Fate::Waits if self.strangers[k].until > now => {}
                    Fate::Waits | Fate::Closed => {
                        let _ = self.strangers.swap_remove(k).conn.shutdown(Shutdown::Both);
                    }
                    Fate::Introduced(peer, reply, rest) => {
                        let s = self.strangers.swap_remove(k);
                        admit(&self.shared, s.conn, peer, reply, rest);
                    }
                }
            }
            if fds[1].revents != 0 {
                loop {
                    match self.tcp.accept() {
                        Ok((s, _)) => {
                            let _ = s.set_nodelay(true);
                            self.welcome(Conn::Tcp(s));
                        }
                        Err(e) => {
                            pause_unless_drained(&e);
                            break;
                        }
                    }
                }
            }
            // Taken out while `welcome` borrows the gate, and put back.
            let unix = self.unix.take();
            if let Some(l) = unix.as_ref().filter(|_| fds[2].revents != 0) {
                loop {
                    match l.accept() {
                        Ok((s, _)) => self.welcome(Conn::Unix(s)),
                        Err(e) => {
                            pause_unless_drained(&e);
                            break;
                        }
                    }
                }
            }
            self.unix = unix;
            self.shared
                .strangers
                .store(self.strangers.len(), Ordering::SeqCst);
        }
    }

    /// Holds a new connection, or refuses it when the cap is reached.
    fn welcome(&mut self, conn: Conn) {
        let cap = self.shared.strangers_cap();
        if self.strangers.len() >= cap {
            refuse(&mut self.shared.lock(), &conn, cap, self.shared.job);
            return;
        }
        if conn.set_nonblocking(true).is_err() {
            return;
        }
        let handshake = Duration::from_millis(self.shared.handshake_ms.load(Ordering::Relaxed));
        self.strangers.push(Stranger {
            conn,
            got: Vec::new(),
            challenge: None,
            until: Instant::now() + handshake,
        });
    }

    /// Reads what stranger `k` sent and answers its whole lines.
    fn read(&mut self, k: usize) -> Fate {
        let shared = Arc::clone(&self.shared);
        let s = &mut self.strangers[k];
        let mut buf = [0u8; 4096];
        // At most a line's worth per pass: one that floods waits for the next (the poll is
        // level-triggered), so the others are served meanwhile.
        // Lines that came before the end are still answered.
        let mut ended = false;
        while s.got.len() <= MAX_LINE + 1 {
            match s.conn.read(&mut buf) {
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(n) => s.got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Fate::Closed,
            }
        }
        let mut me = None;
        let mut start = 0;
        while let Some(end) = s.got[start..].iter().position(|&b| b == b'\n') {
            let mut line = &s.got[start..start + end];
            start += end + 1;
            if line.len() > MAX_LINE {
                let _ = s
                    .conn
                    .write_all(format!("ERR line longer than {MAX_LINE} bytes\n").as_bytes());
                return Fate::Closed;
            }
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let reply = match std::str::from_utf8(line) {
                Ok(text) => match Request::parse(text) {
                    Ok(request) => greet(&shared, &mut me, &mut s.challenge, request, &s.conn),
                    Err(e) => Reply::Err(e.to_string()),
                },
                Err(_) => Reply::Err("request is not valid UTF-8".into()),
            };
            if let Some(peer) = me {
                // Introduced: the rest of the conversation is its own thread's, which sends
                // this reply first (blocking: it has proved it belongs to the job).
                return Fate::Introduced(peer, reply.to_line(), s.got.split_off(start));
            }
            // A short line into a socket whose peer does not read would block: such a
            // stranger is closed instead.
            if !matches!(reply, Reply::Silent)
                && s.conn.write_all(reply.to_line().as_bytes()).is_err()
            {
                return Fate::Closed;
            }
        }
        s.got.drain(..start);
        if ended {
            return Fate::Closed;
        }
        if s.got.len() > MAX_LINE {
            let _ = s
                .conn
                .write_all(format!("ERR line longer than {MAX_LINE} bytes\n").as_bytes());
            return Fate::Closed;
        }
        Fate::Waits
    }
}

/// Ends a round of accepts on `e`: `WouldBlock` means none is left; anything else (out of
/// descriptors, above all) would leave the listener readable, so the gate pauses instead of
/// spinning on it.
fn pause_unless_drained(e: &io::Error) {
    if e.kind() != io::ErrorKind::WouldBlock {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Gives an introduced connection its own thread, which first sends `reply` (to the
/// introduction) and then serves the lines in `rest` and those that follow.
fn admit(shared: &Arc<Shared>, conn: Conn, peer: Peer, reply: String, rest: Vec<u8>) {
    let mut state = shared.lock();
    if state.shutdown {
        return;
    }
    // Threads of connections that ended are joined here, so that nothing piles up.
    let mut k = 0;
    while k < state.handlers.len() {
        if state.handlers[k].is_finished() {
            let _ = state.handlers.swap_remove(k).join();
            state.streams.swap_remove(k);
        } else {
            k += 1;
        }
    }
    let Ok(clone) = conn.try_clone() else {
        drop(state);
        let _ = conn.shutdown(Shutdown::Both);
        depart(shared, peer);
        return;
    };
    let handler = {
        let shared = Arc::clone(shared);
        std::thread::Builder::new()
            .name("metampi-pmi-conn".into())
            .stack_size(128 * 1024)
            .spawn(move || serve(&shared, conn, peer, &reply, rest))
    };
    match handler {
        Ok(handler) => {
            state.streams.push(clone);
            state.handlers.push(handler);
        }
        Err(_) => {
            drop(state);
            let _ = clone.shutdown(Shutdown::Both);
            depart(shared, peer);
        }
    }
}

/// Closes `stream`, accepted while `cap` connections that have not introduced themselves were
/// open; counts it, and says so on stderr at most every [`REFUSAL_LOG_GAP`].
fn refuse(state: &mut State, stream: &Conn, cap: usize, job: JobId) {
    let _ = stream.shutdown(Shutdown::Both);
    state.refused += 1;
    let due = state
        .refusals_logged
        .is_none_or(|(at, _)| at.elapsed() >= REFUSAL_LOG_GAP);
    if due {
        let before = state.refusals_logged.map_or(0, |(_, n)| n);
        tracing::warn!(
            "metampi: the key-value server of job {job} refused a connection from {}: {cap} \
             connections that have not introduced themselves are open ({} refused since the \
             last report)",
            stream.peer(),
            state.refused - before
        );
        state.refusals_logged = Some((Instant::now(), state.refused));
    }
}

/// Serves an introduced connection until it closes, errs, or the server shuts down; then
/// reports the departure of the rank or helper it belongs to.
fn serve(shared: &Shared, stream: Conn, peer: Peer, reply: &str, rest: Vec<u8>) {
    // Back to blocking: this thread waits in reads (and a fence polls it).
    if stream.set_nonblocking(false).is_ok() {
        if let Ok(read_half) = stream.try_clone() {
            // Replies and `REPORT` lines (written by the launcher's thread) share the stream.
            let writer = Arc::new(Mutex::new(stream));
            if lock_conn(&writer).write_all(reply.as_bytes()).is_ok() {
                serve_lines(shared, read_half, rest, &writer, peer);
            }
            // The server keeps a clone of every stream (for shutdown), so dropping ours would
            // not close the connection: it is shut down here when serving it ends.
            let _ = lock_conn(&writer).shutdown(Shutdown::Both);
        }
    }
    depart(shared, peer);
}

/// Tells the launcher that `peer`'s connection has ended.
fn depart(shared: &Shared, peer: Peer) {
    match peer {
        Peer::Rank(rank) => {
            shared.lock().watched.remove(&rank);
            (shared.sink)(PmiEvent::Left { rank })
        }
        Peer::Helper(helper) => (shared.sink)(PmiEvent::HelperLeft { helper }),
    }
}

fn lock_conn(conn: &Mutex<Conn>) -> MutexGuard<'_, Conn> {
    conn.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The reading side of an introduced connection: the bytes read with its introduction first.
struct Rest {
    first: io::Cursor<Vec<u8>>,
    conn: Conn,
}

impl Read for Rest {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.first.read(buf)? {
            0 => self.conn.read(buf),
            n => Ok(n),
        }
    }
}

fn serve_lines(
    shared: &Shared,
    read_half: Conn,
    rest: Vec<u8>,
    writer: &Arc<Mutex<Conn>>,
    peer: Peer,
) {
    let mut reader = BufReader::new(Rest {
        first: io::Cursor::new(rest),
        conn: read_half,
    });
    let mut me = Some(peer);
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
                let _ = lock_conn(writer)
                    .write_all(format!("ERR line longer than {MAX_LINE} bytes\n").as_bytes());
            }
            // Either too long or cut off by EOF: the stream has lost its framing.
            return;
        }
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let conn = Served {
            read: &reader.get_ref().conn,
            write: writer,
        };
        let reply = match std::str::from_utf8(&line) {
            Ok(text) => handle(shared, &mut me, &mut challenge, text, conn),
            Err(_) => Reply::Err("request is not valid UTF-8".into()),
        };
        if matches!(reply, Reply::Closed) {
            return;
        }
        if !matches!(reply, Reply::Silent)
            && lock_conn(writer)
                .write_all(reply.to_line().as_bytes())
                .is_err()
        {
            return;
        }
        if shared.lock().shutdown {
            return;
        }
    }
}

/// The connection a request came on: its reading side (watched in a fence, kept for helpers)
/// and its writing side (kept for `REPORT`).
#[derive(Clone, Copy)]
struct Served<'a> {
    read: &'a Conn,
    write: &'a Arc<Mutex<Conn>>,
}

enum Reply {
    /// The rank closed its connection while waiting (in a fence): nothing to answer.
    Closed,
    /// A request that gets no answer (`STATE`).
    Silent,
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
            Reply::Closed | Reply::Silent => String::new(),
        }
    }
}

/// Answers one request; `conn` is the connection, watched while a fence waits and kept (as a
/// clone) for `END` when it belongs to a helper.
fn handle(
    shared: &Shared,
    me: &mut Option<Peer>,
    challenge: &mut Option<[u8; 16]>,
    text: &str,
    conn: Served<'_>,
) -> Reply {
    let request = match Request::parse(text) {
        Ok(r) => r,
        Err(e) => return Reply::Err(e.to_string()),
    };
    let rank = match (&request, *me) {
        (_, None) => return greet(shared, me, challenge, request, conn.read),
        (Request::Auth, Some(_)) => return Reply::Err("AUTH comes before HELLO".into()),
        (Request::Hello { .. } | Request::Helper { .. }, Some(Peer::Rank(rank))) => {
            return Reply::Err(format!("this connection already said HELLO as rank {rank}"))
        }
        (_, Some(Peer::Helper(index))) => {
            return Reply::Err(format!(
                "this connection is helper {index}'s, which only waits for END"
            ))
        }
        (_, Some(Peer::Rank(rank))) => rank,
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
        Request::Fence => fence(shared, conn.read.as_raw_fd()),
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
        Request::Watch => {
            let watched = Watched {
                writer: Arc::clone(conn.write),
                outstanding: false,
                counts: false,
            };
            shared.lock().watched.insert(rank, watched);
            Reply::Ok
        }
        Request::State {
            waited_ms,
            text,
            sections,
        } => {
            let (traffic, calls) = answer::read_sections(sections);
            if let Some(w) = shared.lock().watched.get_mut(&rank) {
                w.outstanding = false;
                w.counts = traffic.is_some();
            }
            (shared.sink)(PmiEvent::Report {
                rank,
                waited: waited_ms.map(Duration::from_millis),
                text: text.to_string(),
                traffic,
                calls,
            });
            Reply::Silent
        }
        Request::Hello { .. } | Request::Helper { .. } | Request::Auth => {
            Reply::Err("HELLO handled above".into())
        }
    }
}

/// Answers a request of a connection that has not introduced itself: `AUTH`, then `HELLO` or
/// `HELPER`; nothing else.
fn greet(
    shared: &Shared,
    me: &mut Option<Peer>,
    challenge: &mut Option<[u8; 16]>,
    request: Request<'_>,
    conn: &Conn,
) -> Reply {
    match request {
        Request::Auth => {
            let Ok(n) = crate::auth::nonce() else {
                return Reply::Err("no randomness for a challenge".into());
            };
            *challenge = Some(n);
            Reply::Challenge(hex(&n))
        }
        Request::Hello { job, rank, proof } => {
            introduce(shared, me, challenge, Peer::Rank(rank), job, proof, conn)
        }
        Request::Helper { job, index, proof } => {
            introduce(shared, me, challenge, Peer::Helper(index), job, proof, conn)
        }
        _ => Reply::Err("say HELLO first".into()),
    }
}

/// `HELLO` or `HELPER`: checks the job id, the proof of the job secret (when the job has one;
/// the client learns in return that we know it too) and the index, then records `peer`.
fn introduce(
    shared: &Shared,
    me: &mut Option<Peer>,
    challenge: &mut Option<[u8; 16]>,
    peer: Peer,
    job: JobId,
    proof: Option<(&str, &str)>,
    conn: &Conn,
) -> Reply {
    if job != shared.job {
        return Reply::Err(format!("job id {job} is not this job's"));
    }
    let mut server_proof = None;
    if let Some(key) = &shared.key {
        let (Some(na), Some((nc, tag))) = (challenge.take(), proof) else {
            return Reply::Err(format!(
                "this job needs AUTH and a proof in {}",
                peer.verb()
            ));
        };
        let (Some(nc), Some(tag)) = (unhex(nc), unhex(tag)) else {
            return Reply::Err("the nonce and proof must be hex".into());
        };
        let who = peer.proved(job);
        if !same(&tag, &key.connector_tag(PMI_CTX, &na, &nc, who.as_bytes())) {
            return Reply::Err("the proof does not match this job's secret".into());
        }
        server_proof = Some(hex(&key.acceptor_tag(PMI_CTX, &nc, &na)));
    }
    let mut state = shared.lock();
    let event = match peer {
        Peer::Rank(rank) => {
            if rank >= shared.size {
                return Reply::Err(format!(
                    "rank {rank} out of range for a job of {} ranks",
                    shared.size
                ));
            }
            if state.ranks[rank].connected {
                return Reply::Err(format!("rank {rank} is already connected"));
            }
            state.ranks[rank].connected = true;
            PmiEvent::Joined { rank }
        }
        Peer::Helper(helper) => {
            if helper >= shared.helpers {
                return Reply::Err(format!(
                    "helper {helper} out of range for a job of {} helpers",
                    shared.helpers
                ));
            }
            if state.helpers[helper] {
                return Reply::Err(format!("helper {helper} is already connected"));
            }
            let Ok(clone) = conn.try_clone() else {
                return Reply::Err("cannot keep this connection".into());
            };
            state.helpers[helper] = true;
            state.helper_streams.push(clone);
            // The last helper to come may be what a fence waits for.
            complete_fence(shared, &mut state);
            PmiEvent::HelperJoined { helper }
        }
    };
    drop(state);
    *me = Some(peer);
    (shared.sink)(event);
    match server_proof {
        Some(p) => Reply::Proof(p),
        None => Reply::Ok,
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
    if complete_fence(shared, &mut state) {
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

/// Releases the current fence if every rank has reached it and every helper is up; says
/// whether it did.
fn complete_fence(shared: &Shared, state: &mut State) -> bool {
    if state.fence_waiting < shared.size || !state.helpers.iter().all(|&up| up) {
        return false;
    }
    state.fence_waiting = 0;
    state.fence_generation += 1;
    // Dropping the write end wakes every waiter's poll.
    state.fence_wake = None;
    shared.fence_done.notify_all();
    true
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
    replies: Replies,
    writer: Arc<Mutex<Conn>>,
}

/// Where a [`PmiClient`] reads its replies.
#[derive(Debug)]
enum Replies {
    /// From the connection, as it needs them.
    Direct(BufReader<Conn>),
    /// From the thread that reads the connection and answers `REPORT` itself
    /// ([`PmiClient::answer_reports`]); it ends, closing this, when the connection does.
    Relayed(Receiver<String>),
}

/// What a rank says when the launcher asks for a report ([`Ask`]): how long its oldest current
/// wait has lasted, what it waits in, its counters and, if asked, its recent calls.
pub type ReportFn = Box<dyn Fn(Ask) -> Answer + Send>;

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
        Self::introduce(stream, job, Peer::Rank(rank))
    }

    /// Connects as helper `index` of the job and says `HELPER` (see the
    /// [module docs](self#helpers)); then [`PmiClient::wait_for_end`] is all that is left
    /// to do with the connection.
    ///
    /// # Errors
    /// Connection failure or `ERR` from the server.
    pub fn connect_helper(
        addr: impl ToSocketAddrs,
        job: JobId,
        index: usize,
    ) -> Result<PmiClient, PmiClientError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Self::introduce(Conn::Tcp(stream), job, Peer::Helper(index))
    }

    /// Connects as the helper that [`HELPER_ENV`], `METAMPI_PMI` and `METAMPI_JOB` name, as
    /// a process started by a command printed for a machine started by hand finds them;
    /// `None` when [`HELPER_ENV`] is not set (the process is not such a helper).
    ///
    /// # Errors
    /// A missing or malformed variable, or as [`PmiClient::connect_helper`].
    pub fn helper_from_env() -> Result<Option<PmiClient>, PmiClientError> {
        let Some(index) = std::env::var_os(HELPER_ENV) else {
            return Ok(None);
        };
        let index = index
            .to_str()
            .and_then(|i| i.parse::<usize>().ok())
            .ok_or_else(|| PmiClientError::Env {
                name: HELPER_ENV,
                problem: format!("`{}` is not a helper index", index.to_string_lossy()),
            })?;
        let (addr, job) = server_from_env()?;
        let stream = match addr.strip_prefix("unix:") {
            Some(path) => Conn::Unix(UnixStream::connect(path)?),
            None => {
                let s = TcpStream::connect(addr.as_str())?;
                s.set_nodelay(true)?;
                Conn::Tcp(s)
            }
        };
        Self::introduce(stream, job, Peer::Helper(index)).map(Some)
    }

    /// Blocks until the job is over: `Ok` when the server says `END`.
    ///
    /// # Errors
    /// The connection closed or failed first (the launcher is gone), or the server sent
    /// something else.
    pub fn wait_for_end(mut self) -> Result<(), PmiClientError> {
        match self.read_line() {
            Err(PmiClientError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(PmiClientError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the launcher closed the connection without saying that the job ended",
                )))
            }
            Err(e) => Err(e),
            Ok(line) if line == "END" => Ok(()),
            Ok(other) => Err(unexpected(other)),
        }
    }

    /// Says `WATCH` and from then on answers the launcher's `REPORT` with `report`'s answer,
    /// on a thread of its own that reads the connection (and hands the replies to later
    /// requests). For a rank, once its start-up exchange is over.
    ///
    /// # Errors
    /// Connection failure, `ERR`, or no thread to be had.
    pub fn answer_reports(&mut self, report: ReportFn) -> Result<(), PmiClientError> {
        self.expect_ok("WATCH")?;
        let (tx, rx) = mpsc::channel();
        let Replies::Direct(mut reader) =
            std::mem::replace(&mut self.replies, Replies::Relayed(rx))
        else {
            return Ok(());
        };
        let writer = Arc::clone(&self.writer);
        std::thread::Builder::new()
            .name("metampi-report".into())
            .stack_size(128 * 1024)
            .spawn(move || loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let line = line.trim_end_matches(['\n', '\r']);
                let Some(ask) = Ask::parse(line) else {
                    if tx.send(line.to_string()).is_err() {
                        return;
                    }
                    continue;
                };
                let answer = report(ask).line();
                if lock_conn(&writer).write_all(answer.as_bytes()).is_err() {
                    return;
                }
            })?;
        Ok(())
    }

    /// The next line from the server, without its newline.
    fn read_line(&mut self) -> Result<String, PmiClientError> {
        match &mut self.replies {
            Replies::Direct(reader) => {
                let mut reply = String::new();
                if reader.read_line(&mut reply)? == 0 {
                    return Err(PmiClientError::Io(io::ErrorKind::UnexpectedEof.into()));
                }
                if reply.ends_with('\n') {
                    reply.pop();
                }
                Ok(reply)
            }
            Replies::Relayed(rx) => rx
                .recv()
                .map_err(|_| PmiClientError::Io(io::ErrorKind::UnexpectedEof.into())),
        }
    }

    fn introduce(stream: Conn, job: JobId, peer: Peer) -> Result<PmiClient, PmiClientError> {
        let mut client = PmiClient {
            replies: Replies::Direct(BufReader::new(stream.try_clone()?)),
            writer: Arc::new(Mutex::new(stream)),
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
                    .introduce(challenge, peer, job)
                    .ok_or_else(|| unexpected(reply.clone()))?;
                let reply = client.request(&line)?;
                if reply.strip_prefix("OK ") != Some(expect.as_str()) {
                    return Err(unexpected(reply));
                }
            }
            None => client.expect_ok(&format!("{} {job} {}", peer.verb(), peer.index()))?,
        }
        Ok(client)
    }

    /// Connects using `METAMPI_PMI`, `METAMPI_JOB` and `METAMPI_RANK`, as a rank started by
    /// [`run`](crate::run) finds them.
    ///
    /// # Errors
    /// A missing or malformed variable, or as [`PmiClient::connect`].
    pub fn from_env() -> Result<PmiClient, PmiClientError> {
        let (addr, job) = server_from_env()?;
        let rank = env_var(crate::contract::RANK)?
            .parse::<usize>()
            .map_err(|e| PmiClientError::Env {
                name: crate::contract::RANK,
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
        self.expect_ok(&format!("ABORT {code} {}", one_line(message)))
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
        lock_conn(&self.writer).write_all(&bytes)?;
        self.read_line()
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

/// `text` with its control characters (newlines above all) made spaces, for a line of the
/// protocol.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn env_var(name: &'static str) -> Result<String, PmiClientError> {
    std::env::var(name).map_err(|e| PmiClientError::Env {
        name,
        problem: e.to_string(),
    })
}

/// `METAMPI_PMI` and `METAMPI_JOB`.
fn server_from_env() -> Result<(String, JobId), PmiClientError> {
    let addr = env_var(crate::contract::PMI)?;
    let job = env_var(crate::contract::JOB)?
        .parse::<JobId>()
        .map_err(|e| PmiClientError::Env {
            name: crate::contract::JOB,
            problem: e.to_string(),
        })?;
    Ok((addr, job))
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
        assert_eq!(
            Request::parse("HELPER 0123456789abcdef 2"),
            Ok(Request::Helper {
                job: JOB,
                index: 2,
                proof: None
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
        assert_eq!(
            Request::parse("STATE 20 a receive from rank 1\tio 1 2 3 4\tcalls 0 "),
            Ok(Request::State {
                waited_ms: Some(20),
                text: "a receive from rank 1",
                sections: "io 1 2 3 4\tcalls 0 "
            })
        );
        assert_eq!(
            Request::parse("STATE - computing"),
            Ok(Request::State {
                waited_ms: None,
                text: "computing",
                sections: ""
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
            1,
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
        // A helper proves the secret the same way, but a rank's proof is no helper's.
        let mut h = raw(server.addr());
        let na = challenge(&mut h);
        let (line, _) = key.hello(&na, job, 0).unwrap();
        let as_helper = line.replacen("HELLO", "HELPER", 1);
        assert!(say(&mut h, format!("{as_helper}\n").as_bytes()).starts_with("ERR the proof"));
        let na = challenge(&mut h);
        let (line, expect) = key.helper(&na, job, 0).unwrap();
        assert!(line.starts_with(&format!("HELPER {job} 0 ")), "{line}");
        assert_eq!(
            say(&mut h, format!("{line}\n").as_bytes()).trim(),
            format!("OK {expect}")
        );
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

    /// Whether the server has closed `c`: a read sees the end within `within`.
    fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
        c.set_read_timeout(Some(within)).unwrap();
        let mut b = [0u8; 64];
        matches!(c.read(&mut b), Ok(0)) || matches!(c.read(&mut b), Ok(0))
    }

    #[test]
    fn a_silent_stranger_is_closed_at_the_handshake_deadline() {
        let server = PmiServer::start(1, JOB).unwrap();
        server.shared.handshake_ms.store(300, Ordering::Relaxed);
        let t0 = Instant::now();
        let mut silent = TcpStream::connect(server.addr()).unwrap();
        // A few bytes, never a whole line, do not buy more time.
        let mut slow = TcpStream::connect(server.addr()).unwrap();
        slow.write_all(b"HEL").unwrap();
        assert!(closed_within(&mut silent, Duration::from_secs(10)));
        assert!(closed_within(&mut slow, Duration::from_secs(10)));
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // A rank that introduces itself in time keeps its connection past the deadline.
        let mut c = raw(server.addr());
        assert_eq!(say(&mut c, b"HELLO 0123456789abcdef 0\n"), "OK\n");
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(say(&mut c, b"PUT a b\n"), "OK\n");
        assert_eq!(server.shared.strangers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn strangers_beyond_the_cap_are_refused_and_the_rest_expire() {
        let server = PmiServer::start(1, JOB).unwrap();
        server.shared.handshake_ms.store(4000, Ordering::Relaxed);
        let cap = server.shared.strangers_cap();
        let mut held: Vec<TcpStream> = (0..cap + 8)
            .map(|_| TcpStream::connect(server.addr()).unwrap())
            .collect();
        // The acceptor has seen them all by then; the look at each is short, so that the
        // ones kept are all still open while it goes on (within their deadline).
        std::thread::sleep(Duration::from_millis(300));
        let refused = held
            .iter_mut()
            .map(|c| closed_within(c, Duration::from_millis(10)))
            .filter(|&closed| closed)
            .count();
        assert_eq!(refused, 8, "cap {cap}");
        assert!(server.shared.strangers.load(Ordering::SeqCst) <= cap);
        // Threads and descriptors stay bounded: strangers are held by the one thread that
        // accepts, none has a thread of its own.
        assert!(server.shared.lock().handlers.is_empty());
        for c in &mut held {
            assert!(closed_within(c, Duration::from_secs(10)));
        }
        // Once they expire, a rank gets in.
        std::thread::sleep(Duration::from_millis(100));
        let mut c = raw(server.addr());
        assert_eq!(say(&mut c, b"HELLO 0123456789abcdef 0\n"), "OK\n");
        assert_eq!(server.shared.lock().refused, 8);
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
        server_with_helpers(size, 0)
    }

    fn server_with_helpers(size: usize, helpers: usize) -> (PmiServer, Receiver<PmiEvent>) {
        let (tx, rx) = mpsc::channel();
        let sink: EventSink = Box::new(move |event| {
            let _ = tx.send(event);
        });
        let server = PmiServer::bind(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            size,
            helpers,
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
            let b = PmiClient::connect(addr, JOB, 1).unwrap();
            lock_conn(&b.writer).write_all(b"FENCE\n").unwrap();
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
    fn helpers_join_wait_and_are_told_when_the_job_ends() {
        let (server, events) = server_with_helpers(1, 2);
        let wait = Duration::from_secs(5);
        let addr = server.addr();
        // Out of range, twice the same, and anything but waiting: refused.
        let mut c = raw(addr);
        assert!(say(&mut c, format!("HELPER {JOB} 2\n").as_bytes())
            .starts_with("ERR helper 2 out of range for a job of 2 helpers"));
        assert!(say(&mut c, format!("HELPER {JOB} x\n").as_bytes())
            .starts_with("ERR bad helper index `x`"));
        let first = PmiClient::connect_helper(addr, JOB, 1).unwrap();
        assert_eq!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::HelperJoined { helper: 1 }
        );
        assert!(say(&mut c, format!("HELPER {JOB} 1\n").as_bytes())
            .starts_with("ERR helper 1 is already connected"));
        let mut h0 = raw(addr);
        assert_eq!(say(&mut h0, format!("HELPER {JOB} 0\n").as_bytes()), "OK\n");
        assert_eq!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::HelperJoined { helper: 0 }
        );
        assert!(say(&mut h0, b"PUT k v\n").starts_with("ERR this connection is helper 0's"));
        assert!(say(&mut h0, b"FENCE\n").starts_with("ERR this connection is helper 0's"));
        // A helper that goes is an event; ranks are not affected.
        drop(h0);
        assert_eq!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::HelperLeft { helper: 0 }
        );
        assert!(!server.rank_state(0).unwrap().connected);
        // The end of the job reaches the helper that waits as `END`.
        let waiter = std::thread::spawn(move || first.wait_for_end());
        std::thread::sleep(Duration::from_millis(100));
        drop(server);
        waiter.join().unwrap().unwrap();
    }

    #[test]
    fn no_fence_completes_before_every_helper_is_up() {
        let (server, _events) = server_with_helpers(2, 1);
        let addr = server.addr();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let mut c = PmiClient::connect(addr, JOB, rank).unwrap();
                    c.fence().unwrap();
                    let released = std::time::Instant::now();
                    // Once the helper is up, fences need only the ranks.
                    c.fence().unwrap();
                    released
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let up = std::time::Instant::now();
        let _helper = PmiClient::connect_helper(addr, JOB, 0).unwrap();
        for rank in ranks {
            assert!(rank.join().unwrap() >= up);
        }
    }

    #[test]
    fn a_helper_whose_server_vanishes_learns_it() {
        // A "server" that accepts HELPER and then closes without END, as a launcher that died.
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(s.try_clone().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line, format!("HELPER {JOB} 0\n"));
            (&s).write_all(b"OK\n").unwrap();
        });
        let client = PmiClient::connect_helper(addr, JOB, 0).unwrap();
        server.join().unwrap();
        let err = client.wait_for_end().unwrap_err();
        assert!(
            matches!(&err, PmiClientError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{err}"
        );
    }

    #[test]
    fn a_watched_rank_answers_reports_and_its_requests_still_get_replies() {
        let (server, events) = server_with_events(2);
        let mut c = PmiClient::connect(server.addr(), JOB, 1).unwrap();
        let wait = Duration::from_secs(5);
        assert_eq!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::Joined { rank: 1 }
        );
        // Not watched yet: nobody to ask.
        assert!(server.ask_reports(Ask::Wait).is_empty());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&asked);
        let traffic = Traffic {
            sent: 1,
            sent_bytes: 4,
            received: 2,
            received_bytes: 8,
        };
        c.answer_reports(Box::new(move |ask| {
            log.lock().unwrap().push(ask);
            Answer {
                waited: Some(Duration::from_millis(1500)),
                text: "a receive\nfrom rank 0".into(),
                traffic: Some(traffic),
                calls: (ask == Ask::WaitAndCalls).then(RecentCalls::not_recording),
            }
        }))
        .unwrap();
        // Until it has answered with counters, a rank is not asked for its calls.
        assert_eq!(server.ask_reports(Ask::WaitAndCalls), vec![1]);
        assert_eq!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::Report {
                rank: 1,
                waited: Some(Duration::from_millis(1500)),
                text: "a receive from rank 0".into(),
                traffic: Some(traffic),
                calls: None,
            }
        );
        // Replies to the rank's own requests reach it through the reading thread.
        c.put("k", "v").unwrap();
        assert_eq!(c.get("k").unwrap().as_deref(), Some("v"));
        assert_eq!(server.ask_reports(Ask::WaitAndCalls), vec![1]);
        assert!(matches!(
            events.recv_timeout(wait).unwrap(),
            PmiEvent::Report {
                rank: 1,
                calls: Some(_),
                ..
            }
        ));
        assert_eq!(*asked.lock().unwrap(), [Ask::Wait, Ask::WaitAndCalls]);
        c.request("FINALIZE").unwrap();
        // A finalized rank is not asked.
        assert!(server.ask_reports(Ask::Wait).is_empty());
    }

    #[test]
    fn a_rank_that_does_not_read_is_asked_once() {
        let (server, events) = server_with_events(1);
        let mut conn = raw(server.addr());
        assert_eq!(
            say(&mut conn, format!("HELLO {JOB} 0\n").as_bytes()),
            "OK\n"
        );
        assert_eq!(say(&mut conn, b"WATCH\n"), "OK\n");
        assert_eq!(
            events.recv_timeout(Duration::from_secs(5)).unwrap(),
            PmiEvent::Joined { rank: 0 }
        );
        for _ in 0..3 {
            assert_eq!(server.ask_reports(Ask::WaitAndCalls), vec![0]);
        }
        let mut line = String::new();
        conn.0.read_line(&mut line).unwrap();
        assert_eq!(line, "REPORT\n");
        // The answer clears the debt; a malformed one gets an error and changes nothing.
        assert_eq!(
            say(&mut conn, b"STATE soon x\n"),
            "ERR bad wait time `soon` (want milliseconds or `-`)\n"
        );
        // An answer without counters (an older rank) is still an answer, and such a rank
        // is never asked for its calls.
        conn.1.write_all(b"STATE - computing\n").unwrap();
        assert_eq!(
            events.recv_timeout(Duration::from_secs(5)).unwrap(),
            PmiEvent::Report {
                rank: 0,
                waited: None,
                text: "computing".into(),
                traffic: None,
                calls: None,
            }
        );
        assert_eq!(server.ask_reports(Ask::WaitAndCalls), vec![0]);
        line.clear();
        conn.0.read_line(&mut line).unwrap();
        assert_eq!(line, "REPORT\n");
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
