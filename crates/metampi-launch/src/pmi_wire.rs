//! A client of the PMI wire protocols that other process managers serve, so that a metampi
//! rank started by MPICH's Hydra (`mpiexec.hydra`, Debian's `mpiexec.mpich`) or by Slurm
//! (`srun --mpi=pmi2`) joins one world with its siblings instead of being a world of one.
//!
//! # Finding the process manager
//! - `PMI_FD`: a socket the process manager left open in this process (Hydra's default,
//!   Slurm's); `PMI_RANK` and `PMI_SIZE` say who the rank is.
//! - `PMI_PORT` (`host:port`) with `PMI_ID`: a socket to connect to (`mpiexec -pmi-port`); the
//!   server says rank and size after `cmd=initack`.
//!
//! # The two protocols
//! Both start with the same line, `cmd=init pmi_version=V pmi_subversion=S`, answered by
//! `cmd=response_to_init ... rc=0`.
//! - **PMI-1**: lines of space-separated `key=value` fields ending in `\n`; `put`, `barrier_in`
//!   (answered when every rank has sent it), `get`, `abort`, `finalize`.
//! - **PMI-2**: each message is its length as 6 ASCII characters (left-aligned), then
//!   `key=value;` fields, where a `;` inside a value is written `;;`; `fullinit` (which says
//!   rank, size and appnum), `job-getid`, `kvs-put`, `kvs-fence`, `kvs-get`, `abort`,
//!   `finalize`.
//!
//! Under Slurm PMI-2 is asked for first, elsewhere PMI-1 (Hydra 4.0's PMI-2 lacks `abort`);
//! a server that declines one gets the other, and `METAMPI_PMI_VERSION=1` or `2` pins one. Values are percent-escaped before they go out, so that any text survives
//! servers that split on spaces, `=` or `;`, and unescaped when read back: both ends of the
//! exchange are metampi ranks.
//!
//! The framing and parsing are functions on byte slices ([`take_message`], [`decode`],
//! [`encode`]), tested and fuzzable without a process manager; [`WireClient`] drives them over
//! the socket. Nothing a server sends can make them panic.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;

use thiserror::Error;

use crate::contract::{optional, ContractError};

/// The socket a process manager left open for this process.
pub const PMI_FD: &str = "PMI_FD";
/// `host:port` of a process manager to connect to.
pub const PMI_PORT: &str = "PMI_PORT";
/// This process's id for [`PMI_PORT`].
pub const PMI_ID: &str = "PMI_ID";
/// The rank, where the process manager says it in the environment.
pub const PMI_RANK: &str = "PMI_RANK";
/// The number of ranks, likewise.
pub const PMI_SIZE: &str = "PMI_SIZE";
/// The job id Slurm's PMI-2 plugin wants back in `fullinit`.
pub const PMI_JOBID: &str = "PMI_JOBID";
/// Set in the tasks Slurm's `srun` starts.
pub const SLURM_STEP: &str = "SLURM_STEP_ID";
/// `1` or `2`: the protocol to speak; unset, PMI-2 first under Slurm, PMI-1 first elsewhere.
pub const VERSION_KNOB: &str = "METAMPI_PMI_VERSION";

/// A key no rank puts (keys are checked in [`WireClient::put`], which refuses `.`): the
/// get after a PMI-2 fence that waits for every rank.
const BARRIER_KEY: &str = "metampi.barrier";
/// Longest message accepted from a server.
const MAX_MESSAGE: usize = 64 << 10;
/// Longest key accepted by the servers we know (Hydra's `keylen_max`).
const MAX_KEY: usize = 64;
/// Longest value where the server does not say (Hydra's `vallen_max`, PMI-2's limit).
const DEFAULT_MAX_VALUE: usize = 1024;

/// What went wrong talking to the process manager.
#[derive(Debug, Error)]
pub enum WireError {
    /// A variable that names the process manager is missing or malformed.
    #[error(transparent)]
    Env(#[from] ContractError),
    /// The connection failed.
    #[error("talking to the process manager ({version}): {source}")]
    Io {
        /// The protocol spoken.
        version: Version,
        /// The failure.
        source: io::Error,
    },
    /// The server answered something this client cannot use.
    #[error("the process manager ({version}) answered `{request}` with `{reply}`: {problem}")]
    Protocol {
        /// The protocol spoken.
        version: Version,
        /// The command sent.
        request: String,
        /// The reply, as far as it could be read.
        reply: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A key or value this client will not send.
    #[error("PMI key `{key}`: {problem}")]
    Unsendable {
        /// The key.
        key: String,
        /// Why.
        problem: String,
    },
}

/// The wire protocol spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The line protocol of MPICH's simple PMI.
    One,
    /// The length-prefixed protocol of PMI-2.
    Two,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::One => "PMI-1",
            Version::Two => "PMI-2",
        })
    }
}

/// The fields of one message, in order, values as sent (PMI-2's `;;` already undone).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fields(pub Vec<(String, String)>);

impl Fields {
    /// The value of `key`, the first where it repeats.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `cmd` field.
    pub fn cmd(&self) -> &str {
        self.get("cmd").unwrap_or("")
    }
}

/// The message `cmd` with `fields`, framed for `version`.
pub fn encode(version: Version, cmd: &str, fields: &[(&str, &str)]) -> Vec<u8> {
    match version {
        Version::One => {
            let mut line = format!("cmd={cmd}");
            for (k, v) in fields {
                line.push_str(&format!(" {k}={v}"));
            }
            line.push('\n');
            line.into_bytes()
        }
        Version::Two => {
            let mut body = format!("cmd={cmd};");
            for (k, v) in fields {
                body.push_str(&format!("{k}={};", v.replace(';', ";;")));
            }
            let mut out = format!("{:<6}", body.len()).into_bytes();
            out.extend_from_slice(body.as_bytes());
            out
        }
    }
}

/// Takes one whole message off the front of `buf` (its body, without the frame), `None` while
/// it is incomplete; an error for a frame no server sends (a length that is not a number, or
/// a message over 64 KiB).
pub fn take_message(version: Version, buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
    match version {
        Version::One => match buf.iter().position(|&b| b == b'\n') {
            Some(end) => {
                let mut line: Vec<u8> = buf.drain(..=end).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                Ok(Some(line))
            }
            None if buf.len() > MAX_MESSAGE => Err("a line longer than 64 KiB".into()),
            None => Ok(None),
        },
        Version::Two => {
            if buf.len() < 6 {
                return Ok(None);
            }
            let head = std::str::from_utf8(&buf[..6]).map_err(|_| "a length that is not text")?;
            let len: usize = head
                .trim()
                .parse()
                .map_err(|_| format!("a length field `{}`", head.escape_debug()))?;
            if len > MAX_MESSAGE {
                return Err(format!("a message of {len} bytes"));
            }
            if buf.len() < 6 + len {
                return Ok(None);
            }
            let body = buf[6..6 + len].to_vec();
            buf.drain(..6 + len);
            Ok(Some(body))
        }
    }
}

/// The fields of a message body.
pub fn decode(version: Version, body: &[u8]) -> Result<Fields, String> {
    let text = std::str::from_utf8(body).map_err(|_| "a message that is not UTF-8")?;
    let mut fields = Vec::new();
    let mut field = |f: &str| -> Result<(), String> {
        if f.is_empty() {
            return Ok(());
        }
        match f.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                fields.push((k.to_string(), v.to_string()));
                Ok(())
            }
            _ => Err(format!("a field `{}` without a key", f.escape_debug())),
        }
    };
    match version {
        Version::One => {
            for f in text.split_ascii_whitespace() {
                field(f)?;
            }
        }
        Version::Two => {
            let mut cur = String::new();
            let mut chars = text.chars().peekable();
            while let Some(c) = chars.next() {
                if c != ';' {
                    cur.push(c);
                } else if chars.peek() == Some(&';') {
                    chars.next();
                    cur.push(';');
                } else {
                    field(&cur)?;
                    cur.clear();
                }
            }
            field(&cur)?;
        }
    }
    Ok(Fields(fields))
}

/// `value` with every byte other than letters, digits and `-._:/[],@+` written `%XX`.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._:/[],@+".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Undoes [`escape`]; `None` for a malformed escape or bytes that are not UTF-8.
pub fn unescape(value: &str) -> Option<String> {
    let b = value.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Who the environment or `initack` says this process is.
#[derive(Debug, Clone, Default)]
struct Who {
    rank: Option<u32>,
    size: Option<u32>,
    /// `PMI_ID`, for `PMI_PORT`.
    id: Option<u32>,
    /// `PMI_JOBID` (Slurm).
    jobid: Option<String>,
}

trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

/// A rank's connection to a PMI-1 or PMI-2 process manager, initialised: it knows its rank,
/// the size of the job and the name of the job's key-value space.
pub struct WireClient {
    io: Box<dyn Conn>,
    rbuf: Vec<u8>,
    version: Version,
    rank: u32,
    size: u32,
    appnum: u32,
    kvs: String,
    max_value: usize,
    port: Option<String>,
}

impl std::fmt::Debug for WireClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireClient")
            .field("version", &self.version)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("kvs", &self.kvs)
            .finish_non_exhaustive()
    }
}

fn env_err(var: &'static str, value: &str, problem: &str) -> WireError {
    WireError::Env(ContractError::bad(var, value, problem))
}

impl WireClient {
    /// Connects to the process manager the environment names (through `get`) and
    /// initialises; `None` where it names none.
    ///
    /// # Errors
    /// A malformed variable, a socket that fails, or a server whose answers make no sense,
    /// each named.
    pub fn from_env(
        get: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<WireClient>, WireError> {
        let wanted = match get(VERSION_KNOB).as_deref().map(str::trim) {
            None | Some("") => None,
            Some("1") => Some(Version::One),
            Some("2") => Some(Version::Two),
            Some(other) => return Err(env_err(VERSION_KNOB, other, "not 1 or 2")),
        };
        // Slurm's plugin is PMI-2's home; Hydra knows PMI-2 only in part (4.0 fails on its
        // `abort`), so elsewhere PMI-1 comes first.
        let prefer_two = get(SLURM_STEP).is_some();
        let mut who = Who {
            rank: optional(get, PMI_RANK)?,
            size: optional(get, PMI_SIZE)?,
            id: None,
            jobid: get(PMI_JOBID),
        };
        let io_err = |source| WireError::Io {
            version: wanted.unwrap_or(if prefer_two {
                Version::Two
            } else {
                Version::One
            }),
            source,
        };
        if let Some(fd) = get(PMI_FD) {
            let n: i32 = fd
                .trim()
                .parse()
                .map_err(|_| env_err(PMI_FD, &fd, "not a descriptor number"))?;
            let sock = crate::sys::inherited_socket(n)
                .map_err(|e| env_err(PMI_FD, &fd, &e.to_string()))?;
            let c = WireClient::bare(Box::new(UnixStream::from(sock)), None);
            return c.start((wanted, prefer_two), who).map(Some);
        }
        let Some(port) = get(PMI_PORT) else {
            return Ok(None);
        };
        let id =
            optional(get, PMI_ID)?.ok_or_else(|| env_err(PMI_PORT, &port, "PMI_ID is not set"))?;
        let mut stream = TcpStream::connect(port.trim()).map_err(io_err)?;
        let _ = stream.set_nodelay(true);
        // `initack` first, as MPICH's own client does: the server answers with who this is.
        stream
            .write_all(format!("cmd=initack pmiid={id}\n").as_bytes())
            .map_err(io_err)?;
        let mut c = WireClient::bare(Box::new(stream), Some(port.trim().to_string()));
        who.id = Some(id);
        c.expect("initack", "initack")?;
        loop {
            let f = c.receive("initack")?;
            if f.cmd() != "set" {
                return Err(c.protocol("initack", &f, "expected `cmd=set`"));
            }
            if let Some(v) = f.get("size") {
                who.size = v.parse().ok();
            }
            if let Some(v) = f.get("rank") {
                who.rank = v.parse().ok();
            }
            if f.get("debug").is_some() {
                break;
            }
        }
        c.start((wanted, prefer_two), who).map(Some)
    }

    fn bare(io: Box<dyn Conn>, port: Option<String>) -> WireClient {
        WireClient {
            io,
            rbuf: Vec::new(),
            version: Version::One,
            rank: 0,
            size: 0,
            appnum: 0,
            kvs: String::new(),
            max_value: DEFAULT_MAX_VALUE,
            port,
        }
    }

    /// Initialises with `wanted`, or else the preferred version (PMI-2 where `prefer_two`,
    /// else PMI-1), then the other.
    fn start(
        self,
        (wanted, prefer_two): (Option<Version>, bool),
        who: Who,
    ) -> Result<WireClient, WireError> {
        let mut c = self;
        let prefer = if prefer_two {
            Version::Two
        } else {
            Version::One
        };
        let mut version = wanted.unwrap_or(prefer);
        loop {
            let (v, sub) = match version {
                Version::One => ("1", "1"),
                Version::Two => ("2", "0"),
            };
            // The first line is PMI-1's format whichever version follows.
            c.version = Version::One;
            c.send("init", &[("pmi_version", v), ("pmi_subversion", sub)])?;
            let f = c.receive("init")?;
            if f.cmd() != "response_to_init" {
                return Err(c.protocol("init", &f, "expected `cmd=response_to_init`"));
            }
            let agreed = f.get("rc").is_none_or(|rc| rc == "0") && f.get("pmi_version") == Some(v);
            if agreed {
                break;
            }
            if wanted.is_none() && version == prefer {
                version = match prefer {
                    Version::One => Version::Two,
                    Version::Two => Version::One,
                };
                continue;
            }
            return Err(c.protocol("init", &f, &format!("{version} was not accepted")));
        }
        c.version = version;
        match version {
            Version::One => c.init_one(who)?,
            Version::Two => c.init_two(who)?,
        }
        if c.rank >= c.size {
            return Err(WireError::Protocol {
                version,
                request: "init".into(),
                reply: format!("rank {} of {}", c.rank, c.size),
                problem: "the rank is not below the size".into(),
            });
        }
        Ok(c)
    }

    fn init_one(&mut self, who: Who) -> Result<(), WireError> {
        let missing =
            |var| WireError::Env(ContractError::missing(var, "PMI-1 does not say it either"));
        self.rank = who.rank.ok_or_else(|| missing(PMI_RANK))?;
        self.size = who.size.ok_or_else(|| missing(PMI_SIZE))?;
        let f = self.call("get_maxes", &[], "maxes")?;
        if let Some(v) = f.get("vallen_max").and_then(|v| v.parse().ok()) {
            self.max_value = v;
        }
        let f = self.call("get_appnum", &[], "appnum")?;
        self.appnum = f.get("appnum").and_then(|v| v.parse().ok()).unwrap_or(0);
        let f = self.call("get_my_kvsname", &[], "my_kvsname")?;
        self.kvs = self.field(&f, "get_my_kvsname", "kvsname")?;
        Ok(())
    }

    fn init_two(&mut self, who: Who) -> Result<(), WireError> {
        let (key, id) = match (who.rank, who.id) {
            (Some(rank), _) => ("pmirank", rank),
            (None, Some(id)) => ("pmiid", id),
            (None, None) => {
                return Err(WireError::Env(ContractError::missing(
                    PMI_RANK,
                    "PMI-2 needs it (or PMI_ID) for `fullinit`",
                )))
            }
        };
        // Slurm wants the job id it gave (`PMI_JOBID`) back (Hydra gives none), and whether
        // this client calls from several threads (each call here holds the connection).
        let id = id.to_string();
        let mut fields = vec![(key, id.as_str()), ("threaded", "FALSE")];
        if let Some(job) = &who.jobid {
            fields.push(("pmijobid", job));
        }
        let f = self.call("fullinit", &fields, "fullinit-response")?;
        let num = |c: &Self, name: &str| -> Result<u32, WireError> {
            let v = c.field(&f, "fullinit", name)?;
            v.parse()
                .map_err(|_| c.protocol("fullinit", &f, &format!("`{name}` is not a number")))
        };
        self.rank = num(self, "rank")?;
        self.size = num(self, "size")?;
        self.appnum = num(self, "appnum").unwrap_or(0);
        let f = self.call("job-getid", &[], "job-getid-response")?;
        self.kvs = self.field(&f, "job-getid", "jobid")?;
        Ok(())
    }

    /// The protocol spoken.
    pub fn version(&self) -> Version {
        self.version
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The rank's application number (0 where there is one).
    pub fn appnum(&self) -> u32 {
        self.appnum
    }

    /// The name of the job's key-value space (PMI-1) or the job id (PMI-2): the same for all
    /// ranks of the job, different between jobs.
    pub fn job_name(&self) -> &str {
        &self.kvs
    }

    /// The `host:port` of a process manager reached through [`PMI_PORT`].
    pub fn port(&self) -> Option<&str> {
        self.port.as_deref()
    }

    /// Publishes `key` = `value` for the ranks to read after the next [`WireClient::fence`].
    ///
    /// # Errors
    /// A key that is empty, too long or not made of letters, digits, `-` and `_`; a value
    /// longer than the server takes; a refusal.
    pub fn put(&mut self, key: &str, value: &str) -> Result<(), WireError> {
        let unsendable = |problem: String| WireError::Unsendable {
            key: key.to_string(),
            problem,
        };
        if key.is_empty()
            || key.len() > MAX_KEY
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(unsendable(
                "a key is 1 to 64 letters, digits, `-` and `_`".into(),
            ));
        }
        let value = escape(value);
        if value.len() > self.max_value {
            return Err(unsendable(format!(
                "the value is {} bytes escaped; the server takes at most {}",
                value.len(),
                self.max_value
            )));
        }
        match self.version {
            Version::One => {
                let kvs = self.kvs.clone();
                let f = self.call(
                    "put",
                    &[("kvsname", &kvs), ("key", key), ("value", &value)],
                    "put_result",
                )?;
                self.check_rc("put", &f)
            }
            Version::Two => {
                let f = self.call(
                    "kvs-put",
                    &[("key", key), ("value", &value)],
                    "kvs-put-response",
                )?;
                self.check_rc("kvs-put", &f)
            }
        }
    }

    /// Waits until every rank has come here; what was put before is then visible to all.
    ///
    /// PMI-2 promises only the visibility: Hydra answers `kvs-fence` at once and holds back a
    /// `kvs-get` until what it asks for can be answered. A "not found" can be answered only once
    /// every rank has passed its fence (any of them might still put the key), so a get of a
    /// key nobody puts follows the fence and makes it a barrier on every server.
    ///
    /// # Errors
    /// A failed connection or a refusal.
    pub fn fence(&mut self) -> Result<(), WireError> {
        match self.version {
            Version::One => self.call("barrier_in", &[], "barrier_out").map(drop),
            Version::Two => {
                let f = self.call("kvs-fence", &[], "kvs-fence-response")?;
                self.check_rc("kvs-fence", &f)?;
                let f = self.call(
                    "kvs-get",
                    &[("srcid", "-1"), ("key", BARRIER_KEY)],
                    "kvs-get-response",
                )?;
                self.check_rc("kvs-get", &f)
            }
        }
    }

    /// The value some rank put under `key`; `None` where none did.
    ///
    /// # Errors
    /// A failed connection, or a value that is not one this client escaped.
    pub fn get(&mut self, key: &str) -> Result<Option<String>, WireError> {
        let f = match self.version {
            Version::One => {
                let kvs = self.kvs.clone();
                let f = self.call("get", &[("kvsname", &kvs), ("key", key)], "get_result")?;
                if f.get("rc") != Some("0") {
                    return Ok(None);
                }
                f
            }
            Version::Two => {
                let f = self.call(
                    "kvs-get",
                    &[("srcid", "-1"), ("key", key)],
                    "kvs-get-response",
                )?;
                self.check_rc("kvs-get", &f)?;
                if f.get("found") != Some("TRUE") {
                    return Ok(None);
                }
                f
            }
        };
        let raw = self.field(&f, "get", "value")?;
        unescape(&raw)
            .map(Some)
            .ok_or_else(|| self.protocol("get", &f, "the value is not one a metampi rank put"))
    }

    /// Asks the process manager to end the whole job with exit status `code`.
    ///
    /// # Errors
    /// A failed connection.
    pub fn abort(&mut self, code: i32, message: &str) -> Result<(), WireError> {
        match self.version {
            Version::One => self.send("abort", &[("exitcode", &code.to_string())]),
            Version::Two => self.send("abort", &[("isworldabort", "TRUE"), ("msg", message)]),
        }
    }

    /// Says this rank leaves cleanly.
    ///
    /// # Errors
    /// A failed connection or an unexpected answer.
    pub fn finalize(&mut self) -> Result<(), WireError> {
        match self.version {
            Version::One => self.call("finalize", &[], "finalize_ack").map(drop),
            Version::Two => {
                let f = self.call("finalize", &[], "finalize-response")?;
                self.check_rc("finalize", &f)
            }
        }
    }

    fn send(&mut self, cmd: &str, fields: &[(&str, &str)]) -> Result<(), WireError> {
        let bytes = encode(self.version, cmd, fields);
        self.io.write_all(&bytes).map_err(|source| WireError::Io {
            version: self.version,
            source,
        })
    }

    fn receive(&mut self, request: &str) -> Result<Fields, WireError> {
        let mut chunk = [0u8; 4096];
        loop {
            match take_message(self.version, &mut self.rbuf) {
                Ok(Some(body)) => {
                    return decode(self.version, &body).map_err(|problem| WireError::Protocol {
                        version: self.version,
                        request: request.into(),
                        reply: String::from_utf8_lossy(&body).into_owned(),
                        problem,
                    })
                }
                Ok(None) => {}
                Err(problem) => {
                    return Err(WireError::Protocol {
                        version: self.version,
                        request: request.into(),
                        reply: String::from_utf8_lossy(&self.rbuf[..self.rbuf.len().min(80)])
                            .into_owned(),
                        problem,
                    })
                }
            }
            let n = match self.io.read(&mut chunk) {
                Ok(0) => {
                    return Err(WireError::Io {
                        version: self.version,
                        source: io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the process manager closed the connection (waiting for the answer to `{request}`)"),
                        ),
                    })
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(WireError::Io {
                        version: self.version,
                        source,
                    })
                }
            };
            self.rbuf.extend_from_slice(&chunk[..n]);
        }
    }

    fn expect(&mut self, request: &str, reply: &str) -> Result<Fields, WireError> {
        let f = self.receive(request)?;
        if f.cmd() != reply {
            return Err(self.protocol(request, &f, &format!("expected `cmd={reply}`")));
        }
        Ok(f)
    }

    fn call(
        &mut self,
        cmd: &str,
        fields: &[(&str, &str)],
        reply: &str,
    ) -> Result<Fields, WireError> {
        self.send(cmd, fields)?;
        self.expect(cmd, reply)
    }

    fn check_rc(&self, request: &str, f: &Fields) -> Result<(), WireError> {
        match f.get("rc") {
            None | Some("0") => Ok(()),
            Some(rc) => Err(self.protocol(request, f, &format!("refused (rc {rc})"))),
        }
    }

    fn field(&self, f: &Fields, request: &str, name: &str) -> Result<String, WireError> {
        f.get(name)
            .map(str::to_string)
            .ok_or_else(|| self.protocol(request, f, &format!("no `{name}` field")))
    }

    fn protocol(&self, request: &str, f: &Fields, problem: &str) -> WireError {
        let reply =
            f.0.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
        WireError::Protocol {
            version: self.version,
            request: request.into(),
            reply,
            problem: problem.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader};

    #[test]
    fn encodes_both_framings() {
        assert_eq!(
            encode(Version::One, "put", &[("key", "a"), ("value", "b")]),
            b"cmd=put key=a value=b\n"
        );
        assert_eq!(
            encode(Version::Two, "kvs-put", &[("key", "a"), ("value", "x;y")]),
            b"29    cmd=kvs-put;key=a;value=x;;y;"
        );
    }

    #[test]
    fn takes_whole_messages_only() {
        let mut buf = b"cmd=barrier_out\ncmd=get_res".to_vec();
        assert_eq!(
            take_message(Version::One, &mut buf).unwrap().unwrap(),
            b"cmd=barrier_out"
        );
        assert_eq!(take_message(Version::One, &mut buf).unwrap(), None);
        let mut buf = b"10    cmd=a;b=1;".to_vec();
        assert_eq!(
            take_message(Version::Two, &mut buf).unwrap().unwrap(),
            b"cmd=a;b=1;"
        );
        assert!(buf.is_empty());
        let mut buf = b"12    cmd=a;".to_vec();
        assert_eq!(take_message(Version::Two, &mut buf).unwrap(), None);
        assert!(take_message(Version::Two, &mut b"12a   cmd=a;".to_vec()).is_err());
        assert!(take_message(Version::Two, &mut b"999999x".to_vec()).is_err());
        assert!(take_message(Version::One, &mut vec![b'a'; MAX_MESSAGE + 1]).is_err());
    }

    #[test]
    fn decodes_fields_and_escaped_semicolons() {
        let f = decode(
            Version::Two,
            b"cmd=kvs-get-response;found=TRUE;value=a;;b;rc=0;",
        )
        .unwrap();
        assert_eq!(f.cmd(), "kvs-get-response");
        assert_eq!(f.get("value"), Some("a;b"));
        assert_eq!(f.get("rc"), Some("0"));
        let f = decode(Version::One, b"cmd=get_result rc=0 msg=success value=x=y").unwrap();
        assert_eq!(f.get("value"), Some("x=y"));
        assert!(decode(Version::One, b"cmd=a =b").is_err());
        assert!(decode(Version::Two, b"cmd=a;junk;").is_err());
        assert!(decode(Version::One, &[0xff, 0xfe]).is_err());
    }

    #[test]
    fn escaping_round_trips_anything() {
        for v in [
            "",
            "plain",
            "a b=c;d%e\n",
            "[::1]:5000",
            "/dev/shm/x y",
            "ü∂",
        ] {
            let e = escape(v);
            assert!(!e.contains([' ', '=', ';', '\n']), "{e}");
            assert_eq!(unescape(&e).as_deref(), Some(v));
        }
        assert_eq!(unescape("%4"), None);
        assert_eq!(unescape("%zz"), None);
        assert_eq!(unescape("%ff"), None);
    }

    #[test]
    fn malformed_input_never_panics() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut bytes = Vec::new();
            for _ in 0..(seed % 40) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                bytes.push(b"0123456789 ;=cmd\n%\xff"[(seed % 18) as usize]);
            }
            for v in [Version::One, Version::Two] {
                let mut buf = bytes.clone();
                while let Ok(Some(m)) = take_message(v, &mut buf) {
                    let _ = decode(v, &m);
                }
            }
            let _ = unescape(&String::from_utf8_lossy(&bytes));
        }
    }

    /// A process manager for `ranks` ranks over socket pairs, speaking whatever version each
    /// client asks for, PMI-2 only where `two` (else it declines PMI-2).
    fn fake_manager(ranks: u32, two: bool) -> Vec<UnixStream> {
        use std::sync::{Arc, Barrier, Mutex};
        let kvs = Arc::new(Mutex::new(HashMap::<String, String>::new()));
        let barrier = Arc::new(Barrier::new(ranks as usize));
        let mut clients = Vec::new();
        for rank in 0..ranks {
            let (mine, theirs) = UnixStream::pair().unwrap();
            clients.push(theirs);
            let (kvs, barrier) = (kvs.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut w = mine.try_clone().unwrap();
                let mut r = BufReader::new(mine);
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                let f = decode(Version::One, line.trim_end().as_bytes()).unwrap();
                let v = if f.get("pmi_version") == Some("2") && two {
                    Version::Two
                } else if f.get("pmi_version") == Some("2") {
                    w.write_all(b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1\n")
                        .unwrap();
                    line.clear();
                    r.read_line(&mut line).unwrap();
                    Version::One
                } else {
                    Version::One
                };
                let vs = if v == Version::Two { "2" } else { "1" };
                w.write_all(
                    format!("cmd=response_to_init pmi_version={vs} pmi_subversion=0 rc=0\n")
                        .as_bytes(),
                )
                .unwrap();
                let mut buf = Vec::new();
                let mut chunk = [0u8; 512];
                loop {
                    let body = loop {
                        if let Some(b) = take_message(v, &mut buf).unwrap() {
                            break b;
                        }
                        let n = r.read(&mut chunk).unwrap();
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    };
                    let f = decode(v, &body).unwrap();
                    let reply: (&str, Vec<(&str, String)>) = match f.cmd() {
                        "get_maxes" => ("maxes", vec![("vallen_max", "1024".into())]),
                        "get_appnum" => ("appnum", vec![("appnum", "0".into())]),
                        "get_my_kvsname" => ("my_kvsname", vec![("kvsname", "kvs_7".into())]),
                        "fullinit" => (
                            "fullinit-response",
                            vec![
                                ("rank", f.get("pmirank").unwrap().into()),
                                ("size", ranks.to_string()),
                                ("appnum", "0".into()),
                                ("rc", "0".into()),
                            ],
                        ),
                        "job-getid" => ("job-getid-response", vec![("jobid", "job7".into())]),
                        "put" | "kvs-put" => {
                            kvs.lock().unwrap().insert(
                                f.get("key").unwrap().into(),
                                f.get("value").unwrap().into(),
                            );
                            let r = if v == Version::One {
                                "put_result"
                            } else {
                                "kvs-put-response"
                            };
                            (r, vec![("rc", "0".into())])
                        }
                        "barrier_in" | "kvs-fence" => {
                            barrier.wait();
                            let r = if v == Version::One {
                                "barrier_out"
                            } else {
                                "kvs-fence-response"
                            };
                            (r, vec![])
                        }
                        "get" => match kvs.lock().unwrap().get(f.get("key").unwrap()) {
                            Some(val) => (
                                "get_result",
                                vec![("rc", "0".into()), ("value", val.clone())],
                            ),
                            None => ("get_result", vec![("rc", "-1".into())]),
                        },
                        "kvs-get" => match kvs.lock().unwrap().get(f.get("key").unwrap()) {
                            Some(val) => (
                                "kvs-get-response",
                                vec![
                                    ("found", "TRUE".into()),
                                    ("value", val.clone()),
                                    ("rc", "0".into()),
                                ],
                            ),
                            None => (
                                "kvs-get-response",
                                vec![("found", "FALSE".into()), ("rc", "0".into())],
                            ),
                        },
                        "finalize" => {
                            let r = if v == Version::One {
                                "finalize_ack"
                            } else {
                                "finalize-response"
                            };
                            (r, vec![])
                        }
                        other => panic!("unexpected command {other} from rank {rank}"),
                    };
                    let fields: Vec<(&str, &str)> =
                        reply.1.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    w.write_all(&encode(v, reply.0, &fields)).unwrap();
                }
            });
        }
        clients
    }

    fn exchange(wanted: (Option<Version>, bool), two: bool, expect: Version) {
        let clients = fake_manager(3, two);
        let threads: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(rank, s)| {
                std::thread::spawn(move || {
                    let who = Who {
                        rank: Some(rank as u32),
                        size: Some(3),
                        ..Who::default()
                    };
                    let mut c = WireClient::bare(Box::new(s), None)
                        .start(wanted, who)
                        .unwrap();
                    assert_eq!(c.version(), expect);
                    assert_eq!((c.rank(), c.size()), (rank as u32, 3));
                    c.put(&format!("k{rank}"), &format!("rank {rank}; a=b %"))
                        .unwrap();
                    c.fence().unwrap();
                    for r in 0..3 {
                        assert_eq!(
                            c.get(&format!("k{r}")).unwrap().as_deref(),
                            Some(format!("rank {r}; a=b %").as_str())
                        );
                    }
                    assert_eq!(c.get("absent").unwrap(), None);
                    assert!(matches!(
                        c.put("bad key", "x"),
                        Err(WireError::Unsendable { .. })
                    ));
                    assert!(matches!(
                        c.put("k", &"x".repeat(2000)),
                        Err(WireError::Unsendable { .. })
                    ));
                    c.finalize().unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn three_ranks_exchange_over_pmi_2() {
        exchange((None, true), true, Version::Two);
    }

    #[test]
    fn a_server_declining_pmi_2_gets_pmi_1() {
        exchange((None, true), false, Version::One);
    }

    #[test]
    fn pmi_1_comes_first_outside_slurm() {
        exchange((None, false), true, Version::One);
    }

    #[test]
    fn pmi_1_can_be_pinned() {
        exchange((Some(Version::One), true), true, Version::One);
    }

    #[test]
    fn a_closed_connection_is_an_error_naming_the_request() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let who = Who {
            rank: Some(0),
            size: Some(1),
            ..Who::default()
        };
        let err = WireClient::bare(Box::new(a), None)
            .start((None, false), who)
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("init") || text.contains("Broken pipe"),
            "{text}"
        );
    }

    #[test]
    fn environment_mistakes_are_named() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(WireClient::from_env(&env(&[])).unwrap().is_none());
        let e = WireClient::from_env(&env(&[(PMI_FD, "x")])).unwrap_err();
        assert!(e.to_string().contains("PMI_FD=`x`"), "{e}");
        let e = WireClient::from_env(&env(&[(PMI_FD, "0"), (VERSION_KNOB, "3")])).unwrap_err();
        assert!(e.to_string().contains("METAMPI_PMI_VERSION=`3`"), "{e}");
        let e = WireClient::from_env(&env(&[(PMI_FD, "987654")])).unwrap_err();
        assert!(e.to_string().starts_with("PMI_FD=`987654`"), "{e}");
        let e = WireClient::from_env(&env(&[(PMI_PORT, "127.0.0.1:1")])).unwrap_err();
        assert!(e.to_string().contains("PMI_ID"), "{e}");
    }
}
