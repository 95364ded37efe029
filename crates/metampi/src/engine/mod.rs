//! The per-process engine: matching core plus transports, shared by every
//! thread of the process, and the wait loop that drives them.
//!
//! Progress happens inside calls (no background thread unless a `Future` is
//! waiting). A waiting thread spins for a short while, then blocks in `poll`
//! on its wake-up socket and TCP connections; shared-memory writers see the
//! raised sleep flag and send a one-byte datagram, so ranks that outnumber
//! cores sleep instead of burning CPU.

pub(crate) mod coop;
pub(crate) mod core;
pub(crate) mod join;
pub(crate) mod links;
pub(crate) mod spin;

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr as InetAddr, TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use self::coop::{PeerSlots, Table};
use self::core::Core;
use self::links::{Link, Links, ShmLink, SleepFlag};
use crate::bootstrap::Pmi;
use crate::sys::ring::{Consumer, Producer, CTL_BYTES};
use crate::sys::shm::Segment;
use crate::sys::{cma, poll};

pub(crate) struct Engine {
    pub core: Core,
    pub links: Links,
    /// Collective schedules in flight (blocking and nonblocking).
    pub colls: crate::collective::schedule::Schedules,
    /// Threads asleep on a condition variable of their own in [`Shared::wait_until`].
    sleepers: Vec<Sleeper>,
}

/// A thread asleep in [`Shared::wait_until`]: what it waits for, and how to wake it.
struct Sleeper {
    /// The request it waits for; `None`: anything may end its wait.
    want: Option<core::ReqId>,
    cv: Arc<Condvar>,
}

impl Engine {
    pub(crate) fn progress(&mut self) -> bool {
        self.progress_as(false)
    }

    /// A progress pass; `lazy`: see [`links::Links::progress_as`].
    pub(crate) fn progress_as(&mut self, lazy: bool) -> bool {
        let moved = self.links.progress_as(&mut self.core, lazy);
        if let Some(why) = self.links.fatal.take() {
            crate::environment::abort_job(1, &why);
        }
        // Collectives advance on every pass, whichever thread drives it.
        self.colls.advance(&mut self.core, &mut self.links) || moved
    }

    /// The pass after posting a receive from world rank `src`: its ring
    /// alone where it is a shared-memory peer, else the whole lazy pass.
    pub(crate) fn progress_from(&mut self, src: u32) -> bool {
        match self.links.progress_ring_of(&mut self.core, src) {
            Some(moved) => moved,
            None => self.progress_as(true),
        }
    }

    /// A receive that the message due to it completes at once, without a
    /// request slot, a posted-queue entry or a progress pass: the first
    /// match in the unexpected queue (no posted receive matches what is
    /// there), or else the next message in the source's shared-memory ring
    /// where no posted receive matches it, when that message is a plain
    /// eager one that `buf` holds. Anything else (a rendezvous, a
    /// synchronous send, a truncation, another link) is left for the full
    /// path. Returns the status of the message now in `buf`.
    ///
    /// Measured (2 ranks pinned, 8-byte messages, a window of 32 receives
    /// posted then waited for): 150-200 ns a message at the receiver
    /// through the full path, most of it slot, queue and pass bookkeeping.
    #[inline]
    pub(crate) fn recv_now(
        &mut self,
        pat: &core::Pattern,
        buf: &mut core::RecvBuf,
    ) -> Option<core::RawStatus> {
        if let Some(found) = self.core.take_unexpected_eager(pat, buf) {
            return found;
        }
        self.links.take_ring_head(&self.core, pat.src?, pat, buf)
    }
}

/// The progress pass after a call that starts a request.
pub(crate) enum Pass {
    /// None: a send that went out at once has nothing to wait for, and MPI
    /// asks no progress of the call that started it.
    None,
    /// A pass that leaves unmatched shared-memory messages in their rings
    /// (after posting a receive: the next one posted may want them) and
    /// long matched messages uncopied until a wait or test (after posting
    /// any request: see [`links::Links::progress_as`]).
    Lazy,
    /// After posting a receive from this world rank: [`Engine::progress_from`].
    From(u32),
}

/// Facts about the job learned at start-up.
pub(crate) struct JobInfo {
    pub rank: u32,
    pub size: u32,
    /// Machine name of every world rank (ranks with equal names share memory).
    pub nodes: Vec<String>,
    /// Meta host (site) of every world rank; all 0 without a meta-computer.
    pub sites: Vec<u32>,
    pub appnum: u32,
    /// The launcher's job id (names shared segments).
    pub job: String,
    /// This meta host declares a byte order other than this machine's, so
    /// typed point-to-point data to other meta hosts is converted on sending.
    pub swap_routed: bool,
    /// Some meta host declares a byte order other than this machine's, so
    /// collective messages between meta hosts may need converting.
    pub orders_differ: bool,
}

impl JobInfo {
    /// Whether typed data sent to world rank `w` must be converted first.
    pub(crate) fn swap_to(&self, w: u32) -> bool {
        self.swap_routed && self.sites.get(w as usize) != self.sites.get(self.rank as usize)
    }
}

/// Whether the meta host `site` declares big-endian data
/// (`METAMPI_SITE_ORDERS`: `native`, `little` or `big` per meta host).
fn site_big_endian(site: u32) -> io::Result<bool> {
    let native = cfg!(target_endian = "big");
    let Some(v) = crate::knobs::text("METAMPI_SITE_ORDERS") else {
        return Ok(native);
    };
    match v.split(',').nth(site as usize).map(str::trim) {
        None | Some("native") => Ok(native),
        Some("big") => Ok(true),
        Some("little") => Ok(false),
        Some(o) => Err(other(format!("METAMPI_SITE_ORDERS has a bad order `{o}`"))),
    }
}

pub(crate) struct Shared {
    engine: Mutex<Engine>,
    /// Where the progress thread of futures waits for work (`ensure_async_progress`).
    cond: Condvar,
    /// A thread holds the poller's role: it sleeps in `poll` when nothing moves, and the
    /// other waiters sleep on their condition variables.
    poller: AtomicBool,
    /// The poller is asleep in `poll` (a kick sends it the wake-up datagram).
    in_poll: AtomicBool,
    /// Threads blocked on the condition variable or in `poll`.
    blocked: AtomicUsize,
    /// Threads inside [`Shared::wait_until`].
    waiting: AtomicUsize,
    /// Two threads have been inside it at once.
    threads_waited: AtomicBool,
    spin: spin::SpinBudget,
    oversubscribed: bool,
    /// Cores this machine's ranks were given (see `sys::cpus`).
    cores: usize,
    /// Processes on this machine whose sleep the rank cannot see, counted as
    /// always awake: ranks of other emulated nodes, ranks of this node without a
    /// shared-memory link, and routers reached on loopback.
    unseen_here: usize,
    pub info: JobInfo,
    pmi: Mutex<Option<Pmi>>,
    self_wake: Option<SocketAddr>,
    async_started: AtomicBool,
    pub finalized: AtomicBool,
    /// Next free context id (even numbers; +1 is the collective context).
    pub next_context: AtomicU32,
    /// The address others reach this rank's listeners at, and where to
    /// bind them (spawned processes connect to their parents there).
    pub tcp_ip: IpAddr,
    pub listen_ip: IpAddr,
    /// For a spawned process: the parent intercommunicator's context and
    /// the engine ranks of the parents, in their group's order.
    pub parent: Option<(u32, Vec<u32>)>,
    /// Processes this one spawned, watched until they end (joined at finalize).
    pub children: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// Blocking receives whose message [`Shared::recv_spin`] waited for and
/// took (for tests, `testing::spin_receives`).
pub(crate) static SPIN_RECEIVES: AtomicU64 = AtomicU64::new(0);

/// Times a thread asleep in [`Shared::wait_until`] was woken by another and found its wait
/// not over, and all times it was woken by another (for `testing::thread_wake_ups`).
pub(crate) static IDLE_WAKE_UPS: AtomicU64 = AtomicU64::new(0);
pub(crate) static WAKE_UPS: AtomicU64 = AtomicU64::new(0);

/// How long a blocking receive watches its sender's ring without the lock
/// before it takes the engine's loop ([`Shared::recv_spin`]).
const PURE_SPIN: Duration = Duration::from_micros(10);

/// Looks at a ring's head word between two looks with the lock, in
/// [`Shared::recv_spin`].
const LOOKS_UNLOCKED: u32 = 64;

/// Shared-memory rendezvous messages from this size on are copied by
/// receiver and sender together (`coop`): all of them, with the eager limit
/// at 64 KiB. Measured against 128 KiB (2 ranks pinned, alternating runs):
/// 96 KiB streaming 7.2-8.3 -> 10.5-13 GB/s, both ways 6.1-7.2 -> 12.5-16.6;
/// 72 KiB 6.6-7.9 -> 8.4 and 5.8-6.1 -> 10.9-13.
const COOP_MIN: usize = 64 << 10;

/// Bytes of the control block at the start of a rank's inbound segment.
pub(crate) const SEG_CTL: usize = 64;

/// Bytes of each shared-memory ring between two ranks (`METAMPI_SHM_RING`).
pub(crate) fn ring_cap() -> usize {
    crate::knobs::number::<usize>("METAMPI_SHM_RING")
        .unwrap_or(256 << 10)
        .next_power_of_two()
        .max(64 << 10)
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// Site of every rank from `METAMPI_SITES` (rank counts per meta host, in
/// order, as PACX-MPI numbers them); all 0 when unset.
fn parse_sites(size: u32) -> io::Result<Vec<u32>> {
    let Some(v) = crate::knobs::text("METAMPI_SITES") else {
        return Ok(vec![0; size as usize]);
    };
    let mut sites = Vec::with_capacity(size as usize);
    for (i, n) in v.split(',').enumerate() {
        let n: usize = n
            .trim()
            .parse()
            .map_err(|_| other(format!("METAMPI_SITES has a bad count `{n}`")))?;
        sites.extend(std::iter::repeat_n(i as u32, n));
    }
    if sites.len() != size as usize {
        return Err(other(format!(
            "METAMPI_SITES counts {} ranks, the job has {size}",
            sites.len()
        )));
    }
    Ok(sites)
}

/// Context of the handshake between two ranks (see `auth`).
const RANK_CTX: &str = "metampi rank-rank";

/// Names the physical machine (the kernel's boot id), so ranks on emulated
/// nodes of one machine know they share its cores.
fn machine_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Router endpoints from `METAMPI_ROUTERS`: `from>to@host:port,...`.
pub(crate) fn parse_routers() -> io::Result<Vec<(u32, u32, String)>> {
    let Some(v) = crate::knobs::text("METAMPI_ROUTERS") else {
        return Ok(Vec::new());
    };
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|e| {
            let bad = || {
                other(format!(
                    "METAMPI_ROUTERS entry `{e}` is not from>to@host:port"
                ))
            };
            let (pair, addr) = e.split_once('@').ok_or_else(bad)?;
            let (from, to) = pair.split_once('>').ok_or_else(bad)?;
            Ok((
                from.parse().map_err(|_| bad())?,
                to.parse().map_err(|_| bad())?,
                addr.to_string(),
            ))
        })
        .collect()
}

/// Pairs of meta hosts whose ranks connect directly (`PAIR A B 0`), from
/// `METAMPI_DIRECT`: `a-b,...`.
fn parse_direct() -> io::Result<Vec<(u32, u32)>> {
    let Some(v) = crate::knobs::text("METAMPI_DIRECT") else {
        return Ok(Vec::new());
    };
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|e| {
            let bad = || other(format!("METAMPI_DIRECT entry `{e}` is not a-b"));
            let (a, b) = e.split_once('-').ok_or_else(bad)?;
            Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?))
        })
        .collect()
}

/// Accepts the TCP connections of the lower ranks in `expected`, each
/// handshake in a thread of its own: a stranger that connects and then says
/// nothing (or trickles bytes) holds only its own thread until the
/// handshake timeout, while the real peers are accepted meanwhile.
/// The warning for a node whose ranks' rings may need `need` bytes of a
/// shared-memory file system with `free` bytes left, if they may not fit.
fn shm_space_warning(need: u64, free: u64) -> Option<String> {
    (need > free).then(|| {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        format!(
            "the shared-memory rings of this node's ranks may take {:.0} MiB, and {} has {:.0} MiB \
             free: a rank that fills its rings past that dies with SIGBUS. Make it larger \
             (docker run --shm-size), or the rings smaller (METAMPI_SHM_RING, bytes per sender), \
             or use TCP (METAMPI_FORCE_TCP=1)",
            mib(need),
            crate::sys::shm::dir().display(),
            mib(free)
        )
    })
}

/// After the handshake with a router: offers it shared-memory pipes (when
/// `want`), and returns them if it runs on this rank's node and took them.
/// The router answers one byte: 1 for "mapped", 0 for "keep TCP".
/// How a process connects to a router of its meta host.
struct RouterEnd<'a> {
    /// Shared-memory pipes may be offered.
    pipes: bool,
    /// This process's node (the router gives pipes only on its own).
    node: &'a str,
    pipe_bytes: usize,
}

impl RouterEnd<'_> {
    /// Connects to the router at `addr`, proves the job's `key`, names this
    /// process `id` (its wire id: routers deliver by it) and settles the
    /// channel (pipes or the TCP connection itself).
    fn connect(
        &self,
        addr: &str,
        key: &crate::auth::Secret,
        id: u32,
    ) -> io::Result<(TcpStream, Option<crate::sys::vchan::VChan>)> {
        let mut s = TcpStream::connect(addr)
            .map_err(|e| other(format!("connecting to the router at {addr}: {e}")))?;
        crate::auth::connect(&mut s, key, crate::router::VERTICAL_CTX, &id.to_le_bytes())
            .map_err(|e| other(format!("authenticating with the router at {addr}: {e}")))?;
        let vchan = offer_pipes(&mut s, self.pipes, self.node, self.pipe_bytes).map_err(|e| {
            other(format!(
                "setting up the channel to the router at {addr}: {e}"
            ))
        })?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        Ok((s, vchan))
    }
}

fn offer_pipes(
    s: &mut TcpStream,
    want: bool,
    node: &str,
    bytes: usize,
) -> io::Result<Option<crate::sys::vchan::VChan>> {
    use crate::sys::vchan::{node_hash, Offer, VChan};
    use std::io::{Read, Write};
    // A segment that cannot be made (no /dev/shm, full) leaves TCP.
    let made = if want {
        VChan::create(node_hash(node), bytes).ok()
    } else {
        None
    };
    let offer = made.as_ref().map_or_else(Offer::none, |(_, o)| o.encode());
    let mut answer = [0u8; 1];
    let got = s
        .write_all(&offer)
        .and_then(|()| s.set_read_timeout(Some(Duration::from_secs(30))))
        .and_then(|()| s.read_exact(&mut answer))
        .and_then(|()| s.set_read_timeout(None));
    // The router has mapped the segment or never will: its name goes either way.
    let vchan = made.map(|(v, _)| {
        v.unlink();
        v
    });
    got?;
    let mut vchan = vchan.filter(|_| answer[0] == 1);
    if let Some(v) = &mut vchan {
        v.probe_loans(!crate::knobs::flag("METAMPI_NO_ROUTER_LOANS", false));
    }
    Ok(vchan)
}

/// Accepts one authenticated connection (context `ctx`, a 4-byte hello
/// naming the peer) from each of `expected`, refusing strangers.
pub(crate) fn accept_peers(
    rank: u32,
    listener: &TcpListener,
    key: &crate::auth::Secret,
    ctx: &'static str,
    mut expected: Vec<u32>,
) -> io::Result<Vec<(u32, TcpStream)>> {
    use std::os::fd::AsRawFd;
    use std::sync::mpsc;
    // Every handshake thread reports once: the peer, or `None` if refused.
    let (tx, rx) = mpsc::channel::<Option<(u32, TcpStream)>>();
    let mut done = Vec::with_capacity(expected.len());
    let mut pending = 0usize;
    listener.set_nonblocking(true)?;
    while !expected.is_empty() {
        // Collect finished handshakes, then wait briefly for new connections.
        while let Ok(got) = rx.try_recv() {
            pending -= 1;
            let Some((r, s)) = got else { continue };
            let Some(i) = expected.iter().position(|&x| x == r) else {
                return Err(other(format!("unexpected TCP hello from rank {r}")));
            };
            expected.swap_remove(i);
            done.push((r, s));
        }
        if expected.is_empty() {
            break;
        }
        match listener.accept() {
            Ok((s, from)) => {
                s.set_nonblocking(false)?;
                let (tx, key) = (tx.clone(), key.clone());
                pending += 1;
                std::thread::Builder::new()
                    .name("metampi-accept".into())
                    .spawn(move || {
                        let mut s = s;
                        // A connection that cannot prove the job secret is
                        // logged and dropped; the job goes on waiting for its
                        // real peers.
                        match crate::auth::accept(&mut s, &key, ctx, 4) {
                            Ok(h) => {
                                let r = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
                                let _ = tx.send(Some((r, s)));
                            }
                            Err(e) => {
                                eprintln!(
                                    "metampi: rank {rank}: refused a connection from {from}: {e}"
                                );
                                let _ = tx.send(None);
                            }
                        }
                    })?;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Short waits while handshakes run, so a finished one is
                // taken promptly; longer ones while nobody is connecting.
                let t = if pending > 0 { 1 } else { 50 };
                poll::wait(&[(listener.as_raw_fd(), false)], Duration::from_millis(t))?;
            }
            Err(e) => return Err(e),
        }
    }
    listener.set_nonblocking(false)?;
    Ok(done)
}

/// A connection to a peer as every stream link wants it: no Nagle delay,
/// non-blocking, explicit 4 MiB buffers (they beat loopback autotuning for
/// streaming, measured).
pub(crate) fn configure_stream(s: &TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    let tcp_buf = crate::knobs::number::<usize>("METAMPI_TCP_BUF").unwrap_or(4 << 20);
    if tcp_buf > 0 {
        use std::os::fd::AsRawFd;
        poll::set_socket_buffers(s.as_raw_fd(), tcp_buf)?;
    }
    Ok(())
}

impl Shared {
    /// Joins the job described by the launcher's environment, or starts a
    /// world of one when there is no launcher.
    pub(crate) fn init() -> io::Result<Shared> {
        let pmi_addr = crate::knobs::text("METAMPI_PMI");
        let Some(pmi_addr) = pmi_addr else {
            crate::knobs::check_names();
            return Self::singleton();
        };
        let parse = |k: &str| -> io::Result<u32> {
            crate::knobs::text(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| other(format!("{k} is missing or not a number")))
        };
        let rank = parse("METAMPI_RANK")?;
        // Every rank sees the same environment: one warning per job is enough.
        if rank == 0 {
            crate::knobs::check_names();
        }
        let size = parse("METAMPI_SIZE")?;
        if rank >= size {
            return Err(other(format!(
                "METAMPI_RANK {rank} is not below METAMPI_SIZE {size}"
            )));
        }
        let appnum = parse("METAMPI_APPNUM").unwrap_or(0);
        let job = crate::knobs::text("METAMPI_JOB").unwrap_or_else(|| "0".into());
        let node = crate::knobs::text("METAMPI_NODE").unwrap_or_else(crate::environment::hostname);
        let mut pmi = Pmi::connect(&pmi_addr, &job, rank)?;

        let wake = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(format!(
            "metampi-{job}-{rank}"
        ))?)?;
        wake.set_nonblocking(true)?;

        use std::net::ToSocketAddrs;
        let pmi_ip: IpAddr = pmi_addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        // The launcher names the address where it knows better (a network
        // namespace, whose ranks reach it through a Unix socket).
        let given: Option<IpAddr> = match crate::knobs::text("METAMPI_TCP_IP") {
            Some(v) => Some(
                v.parse()
                    .map_err(|_| other(format!("METAMPI_TCP_IP `{v}` is not an IP address")))?,
            ),
            None => None,
        };
        let listen_ip = match given {
            Some(ip) => ip,
            None if pmi_ip.is_loopback() => pmi_ip,
            None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        let listener = TcpListener::bind((listen_ip, 0))?;
        let port = listener.local_addr()?.port();
        // The address others use is the one this machine uses to reach the launcher.
        let my_ip = match given {
            Some(ip) => ip,
            None if pmi_ip.is_loopback() => pmi_ip,
            None => TcpStream::connect(&pmi_addr)?.local_addr()?.ip(),
        };
        // Before the pid is out: the ranks of this machine may then copy
        // from our memory under Yama's scope 1 too.
        if !cma::turned_off() {
            cma::let_peers_attach();
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        pmi.put(&format!("n{rank}"), &node)?;
        pmi.put(&format!("m{rank}"), &machine_id())?;
        // The pid, then the affinity mask (see `sys::cpus`).
        let mask = crate::sys::cpus::affinity_hex().unwrap_or_default();
        pmi.put(&format!("p{rank}"), &format!("{pid}/{mask}"))?;
        pmi.put(&format!("t{rank}"), &InetAddr::new(my_ip, port).to_string())?;
        pmi.fence()?;

        let mut nodes = Vec::with_capacity(size as usize);
        let mut pids = Vec::with_capacity(size as usize);
        let mut tcp_addrs = Vec::with_capacity(size as usize);
        let me = machine_id();
        let mut on_machine = 0;
        let mut masks = Vec::new();
        for r in 0..size {
            let here = pmi.get(&format!("m{r}"))? == me;
            on_machine += usize::from(here);
            nodes.push(pmi.get(&format!("n{r}"))?);
            let p = pmi.get(&format!("p{r}"))?;
            let (pid, cpus) = p.split_once('/').unwrap_or((&p, ""));
            pids.push(pid.parse::<i32>().unwrap_or(0));
            if here {
                masks.push(cpus.to_string());
            }
            tcp_addrs.push(pmi.get(&format!("t{r}"))?);
        }
        let sites = parse_sites(size)?;
        let my_site = sites[rank as usize];
        let force_tcp = crate::knobs::flag("METAMPI_FORCE_TCP", false);
        let local: Vec<u32> = (0..size).filter(|&r| nodes[r as usize] == node).collect();
        let shm_ranks: Vec<u32> = if force_tcp { vec![rank] } else { local.clone() };
        let local_index = |r: u32| shm_ranks.iter().position(|&x| x == r).unwrap_or(0);
        let ring_cap = ring_cap();
        let ring_bytes = CTL_BYTES + ring_cap;
        // The cooperative-copy slots follow the rings.
        let coop_at = SEG_CTL + shm_ranks.len() * ring_bytes;
        let seg_len = coop_at + coop::TABLE_BYTES;
        if shm_ranks.len() > 1 && shm_ranks[0] == rank {
            // Rings take pages as they are used; a tmpfs that runs out kills
            // the rank that touches the next page with SIGBUS. Say so before.
            let need = shm_ranks.len() * seg_len;
            if let Some(w) =
                crate::sys::shm::free_bytes().and_then(|free| shm_space_warning(need as u64, free))
            {
                eprintln!("metampi: rank {rank}: {w}");
            }
        }

        let mut own_seg = None;
        if shm_ranks.len() > 1 {
            let path = crate::sys::shm::dir().join(format!("metampi-{job}-{rank}"));
            let _ = std::fs::remove_file(&path);
            let seg = Segment::create(&path, seg_len)?;
            pmi.put(&format!("s{rank}"), &path.display().to_string())?;
            own_seg = Some(seg);
        }
        pmi.fence()?;

        let mut peers: Vec<Link> = Vec::with_capacity(size as usize);
        let mut inbound = Vec::new();
        let mut segments = Vec::new();
        for r in 0..size {
            if r == rank {
                peers.push(Link::Local);
                continue;
            }
            if shm_ranks.len() > 1 && shm_ranks.contains(&r) {
                let own = own_seg.as_ref().expect("created above for local peers");
                let path = PathBuf::from(pmi.get(&format!("s{r}"))?);
                let seg = Segment::open(&path, seg_len)?;
                // SAFETY: ring `local_index(rank)` of the peer's segment is written
                // only by us (one producer per ring), and the segment lives in
                // `segments` for as long as the links.
                let prod = unsafe {
                    Producer::new(
                        seg.base().add(SEG_CTL + local_index(rank) * ring_bytes),
                        ring_cap,
                    )
                };
                // SAFETY: ring `local_index(r)` of our segment is read only by us.
                let cons = unsafe {
                    Consumer::new(
                        own.base().add(SEG_CTL + local_index(r) * ring_bytes),
                        ring_cap,
                    )
                };
                // SAFETY: the first word of the peer's segment is its sleep flag,
                // aligned and alive as long as `seg`.
                let peer_sleep = unsafe { SleepFlag::new(seg.base() as *const AtomicU32) };
                // SAFETY: the slot table sits at `coop_at`, 64-byte aligned (the
                // segment is page aligned, `SEG_CTL` and `ring_bytes` are lines),
                // alive as long as `seg`.
                let peer_coop = unsafe { PeerSlots::new(seg.base().add(coop_at)) };
                peers.push(Link::Shm(ShmLink {
                    prod,
                    peer_sleep,
                    peer_coop,
                    peer_wake: SocketAddr::from_abstract_name(format!("metampi-{job}-{r}"))?,
                }));
                inbound.push((r, cons));
                segments.push(seg);
            } else {
                peers.push(Link::Local); // replaced by TCP below
            }
        }
        // Ranks of this site and of directly paired ones are TCP peers.
        let direct = parse_direct()?;
        let reaches = |site: u32| {
            site == my_site
                || direct.contains(&(my_site, site))
                || direct.contains(&(site, my_site))
        };
        // Lower ranks connect to higher ones; the listen backlog holds early connects.
        let tcp_peers: Vec<u32> = (0..size)
            .filter(|&r| {
                r != rank
                    && !(shm_ranks.len() > 1 && shm_ranks.contains(&r))
                    && reaches(sites[r as usize])
            })
            .collect();
        let needs_key = !tcp_peers.is_empty() || parse_routers()?.iter().any(|r| r.0 == my_site);
        let key = if needs_key {
            Some(crate::auth::Secret::from_env()?)
        } else {
            None
        };
        for &r in tcp_peers.iter().filter(|&&r| r > rank) {
            let addr = &tcp_addrs[r as usize];
            let mut s = TcpStream::connect(addr.as_str())
                .map_err(|e| other(format!("connecting to rank {r} at {addr}: {e}")))?;
            let key = key.as_ref().expect("made when there are TCP peers");
            crate::auth::connect(&mut s, key, RANK_CTX, &rank.to_le_bytes())
                .map_err(|e| other(format!("authenticating with rank {r} at {addr}: {e}")))?;
            peers[r as usize] = Links::tcp(s);
        }
        let expected: Vec<u32> = tcp_peers.iter().copied().filter(|&r| r < rank).collect();
        if !expected.is_empty() {
            let key = key.as_ref().expect("made when there are TCP peers");
            for (r, s) in accept_peers(rank, &listener, key, RANK_CTX, expected)? {
                peers[r as usize] = Links::tcp(s);
            }
        }
        for p in &peers {
            if let Link::Tcp(t) = p {
                configure_stream(&t.stream)?;
            }
        }
        pmi.fence()?;

        // Ranks of other sites are reached through this site's routers.
        let mut routers = Vec::new();
        let pipes = !force_tcp && !crate::knobs::flag("METAMPI_NO_ROUTER_SHM", false);
        // Reserved at once (see `VChan::create`): as small as streaming allows.
        // 256 KiB where the machine has under four CPUs (1 MiB measured no
        // faster on 4 MiB messages there); 1 MiB from four, where rank and router
        // copy on cores of their own (4 MiB routed streaming on a 16-core machine:
        // faster in 6 of 7 alternating pairs, medians 2.7 -> 3.05 GB/s).
        let pipe_bytes =
            crate::knobs::number::<usize>("METAMPI_ROUTER_PIPE").unwrap_or_else(|| {
                if crate::sys::cpus::online() >= 4 {
                    1 << 20
                } else {
                    256 << 10
                }
            });
        let router_end = RouterEnd {
            pipes,
            node: &node,
            pipe_bytes,
        };
        for (from, to, addr) in parse_routers()? {
            if from != my_site {
                continue;
            }
            let key = key.as_ref().expect("made when there are routers");
            let (s, vchan) = router_end.connect(&addr, key, rank)?;
            routers.push((to, s, vchan));
        }
        let mut links = Links::new(rank, peers, wake);
        links.routed_big_endian = site_big_endian(my_site)?;
        links.sites = sites.clone();
        let swap_routed = links.routed_big_endian != cfg!(target_endian = "big");
        let mut orders_differ = false;
        for site in sites
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<u32>>()
        {
            orders_differ |= site_big_endian(site)? != cfg!(target_endian = "big");
        }
        let mut by_site: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (to, s, vchan) in routers {
            let c = links.add_channel(Links::stream(s, vchan));
            by_site.entry(to).or_default().push(c);
        }
        for r in 0..size {
            let site = sites[r as usize];
            if reaches(site) {
                continue;
            }
            let chans = by_site.get(&site).ok_or_else(|| {
                other(format!(
                    "no router from site {my_site} to site {site} (rank {r})"
                ))
            })?;
            // One fixed router per pair of ranks keeps their messages in order.
            links.route_via(r, chans[(r as usize + rank as usize) % chans.len()]);
        }
        for (r, c) in inbound {
            links.add_inbound(r, c);
        }
        // A spawned process meets its parents before its start-up ends,
        // over shared memory with those on its machine, and through the
        // routers of its parents' root's meta host with those on others.
        let parent = match crate::topology::spawn::parent_spec()? {
            Some(spec) => {
                let mut by_site: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
                let me = spec.wire_id(rank);
                if let Some(me) = me {
                    let key = crate::auth::Secret::from_env()?;
                    for (to, addr) in spec.routers() {
                        let (s, vchan) = router_end.connect(addr, &key, me)?;
                        let c = links.add_channel(Links::stream(s, vchan));
                        by_site.entry(*to).or_default().push(c);
                    }
                    links.set_wire_self(me);
                }
                let mut streams = crate::topology::spawn::connect_parents(&spec, rank)?;
                let own = (!force_tcp)
                    .then(|| join::JoinSegment::create(&job, rank, streams.len()).ok())
                    .flatten();
                let joined = join::join_all(&mut streams, own.as_ref(), &job, rank)?;
                let mut direct = join::add_peers(&mut links, streams, joined, own)?.into_iter();
                let mut ranks = Vec::with_capacity(spec.len());
                for i in 0..spec.len() {
                    let r = match spec.routed(i) {
                        None => direct
                            .next()
                            .ok_or_else(|| other("a parent went missing".into()))?,
                        Some((wire, site)) => {
                            let chans = by_site.get(&site).ok_or_else(|| {
                                other(format!("no router to meta host {site} for parent {i}"))
                            })?;
                            let c = chans[(wire as usize + me.unwrap_or(0) as usize) % chans.len()];
                            links.add_routed(wire, c)
                        }
                    };
                    ranks.push(r);
                }
                Some((spec.ctx, ranks))
            }
            None => None,
        };
        if let Some(seg) = own_seg {
            seg.unlink();
            // SAFETY: the first word of our segment is our sleep flag; the
            // segment lives in `links.segments`.
            links
                .my_sleep
                .push(unsafe { SleepFlag::new(seg.base() as *const AtomicU32) });
            // SAFETY: our slot table (see above); only we open slots in it.
            links.coop = Some(unsafe { Table::new(seg.base().add(coop_at)) });
            links.segments.push(seg);
        }
        links.segments.extend(segments);
        links.cma = shm_ranks.len() > 1 && !cma::turned_off() && cma::available();
        if let Some(n) = crate::knobs::number::<usize>("METAMPI_EAGER_LIMIT") {
            links.eager_shm = n;
            links.eager_tcp = n;
            links.eager_router = n;
        }
        if let Some(n) = crate::knobs::number::<usize>("METAMPI_EAGER_ROUTER") {
            // A router takes frames of at most 1 MiB, envelope included.
            links.eager_router = n.min((1 << 20) - 64);
        }
        let mut core = Core::new(rank, size as usize);
        for &r in &shm_ranks {
            core.pids[r as usize] = pids[r as usize];
        }
        // The cores this machine's ranks were given together: ranks pinned to
        // a core each are not oversubscribed, though each sees one core.
        let cores = crate::sys::cpus::machine_cores(
            crate::sys::cpus::union_count([mask.as_str()]),
            crate::sys::cpus::union_count(masks.iter().map(String::as_str)),
        );
        // Emulated nodes, sites and their routers share this machine's cores:
        // count every rank on the machine, and the routers it reaches on loopback.
        let routers_here = parse_routers()?
            .iter()
            .filter(|(_, _, a)| a.starts_with("127.") || a.starts_with("[::1]"))
            .count();
        let on_machine = on_machine.max(local.len());
        let oversubscribed = on_machine + routers_here > cores;
        let unseen_here = on_machine - shm_ranks.len() + routers_here;
        if links.cma && links.coop.is_some() && !crate::knobs::flag("METAMPI_NO_COOP", false) {
            core.coop_min = crate::knobs::number::<usize>("METAMPI_COOP_MIN").unwrap_or(COOP_MIN);
            // Two copiers need two cores: where processes outnumber cores,
            // help is asked only while few enough are awake (see `Links::pull`).
            links.crowd = oversubscribed.then_some((cores, unseen_here));
        }
        // Oversubscribed ranks yield while they spin, which hands the core to a peer
        // that has work; blocking early costs a wake-up per message (measured:
        // 8 ranks on 2 cores, barrier 138 µs with 20 µs of spinning, 29 µs with 1 ms).
        // The budget learns (see `spin`), unless set.
        let set_spin = crate::knobs::number::<usize>("METAMPI_SPIN_US");
        let spin_us = set_spin.unwrap_or(if oversubscribed { 1000 } else { 200 });
        let next_context = parent.as_ref().map_or(4, |p| (p.0 + 2).max(4));
        Ok(Shared {
            engine: Mutex::new(Engine {
                core,
                links,
                colls: Default::default(),
                sleepers: Vec::new(),
            }),
            cond: Condvar::new(),
            poller: AtomicBool::new(false),
            in_poll: AtomicBool::new(false),
            blocked: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            threads_waited: AtomicBool::new(false),
            spin: spin::SpinBudget::new(
                Duration::from_micros(spin_us as u64),
                set_spin.is_none() && crate::knobs::flag("METAMPI_SPIN_LEARN", true),
                oversubscribed,
            ),
            oversubscribed,
            cores,
            unseen_here,
            info: JobInfo {
                rank,
                size,
                nodes,
                sites,
                appnum,
                job: job.clone(),
                swap_routed,
                orders_differ,
            },
            pmi: Mutex::new(Some(pmi)),
            self_wake: Some(SocketAddr::from_abstract_name(format!(
                "metampi-{job}-{rank}"
            ))?),
            async_started: AtomicBool::new(false),
            finalized: AtomicBool::new(false),
            next_context: AtomicU32::new(next_context),
            tcp_ip: my_ip,
            listen_ip,
            parent,
            children: Mutex::default(),
        })
    }

    fn singleton() -> io::Result<Shared> {
        let job = format!("single{}", std::process::id());
        // Named, so that processes it spawns can wake it (`join`).
        let wake =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(format!("metampi-{job}-0"))?)?;
        wake.set_nonblocking(true)?;
        let links = Links::new(0, vec![Link::Local], wake);
        Ok(Shared {
            engine: Mutex::new(Engine {
                core: Core::new(0, 1),
                links,
                colls: Default::default(),
                sleepers: Vec::new(),
            }),
            cond: Condvar::new(),
            poller: AtomicBool::new(false),
            in_poll: AtomicBool::new(false),
            blocked: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            threads_waited: AtomicBool::new(false),
            spin: spin::SpinBudget::new(Duration::from_micros(50), false, false),
            oversubscribed: false,
            cores: 1,
            unseen_here: 0,
            info: JobInfo {
                rank: 0,
                size: 1,
                nodes: vec![crate::environment::hostname()],
                sites: vec![0],
                appnum: 0,
                job,
                swap_routed: false,
                orders_differ: false,
            },
            pmi: Mutex::new(None),
            self_wake: Some(SocketAddr::from_abstract_name(format!(
                "metampi-single{}-0",
                std::process::id()
            ))?),
            async_started: AtomicBool::new(false),
            finalized: AtomicBool::new(false),
            next_context: AtomicU32::new(4),
            tcp_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            listen_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            parent: None,
            children: Mutex::default(),
        })
    }

    /// The cores this machine's ranks were given together.
    pub(crate) fn cores(&self) -> usize {
        self.cores
    }

    /// Whether this machine's ranks (and routers) outnumber its cores.
    pub(crate) fn oversubscribed(&self) -> bool {
        self.oversubscribed
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Engine> {
        // A panic while holding the lock leaves the engine usable: its state is
        // updated in steps that are each consistent.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the engine without a progress pass.
    pub(crate) fn quick<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        f(&mut self.lock())
    }

    /// Runs `f` on the engine, then one progress pass; wakes other waiters if
    /// the call may have completed their requests.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        let mut e = self.lock();
        let r = f(&mut e);
        e.progress();
        let wakers = std::mem::take(&mut e.core.wakers);
        drop(e);
        self.after_progress(wakers);
        r
    }

    /// As [`Shared::with`], with the progress pass `f` asks for.
    #[inline]
    pub(crate) fn with_then<R>(&self, f: impl FnOnce(&mut Engine) -> (R, Pass)) -> R {
        let mut e = self.lock();
        let (r, pass) = f(&mut e);
        match pass {
            Pass::None => {}
            Pass::Lazy => {
                e.progress_as(true);
            }
            Pass::From(src) => {
                e.progress_from(src);
            }
        }
        let wakers = std::mem::take(&mut e.core.wakers);
        drop(e);
        self.after_progress(wakers);
        r
    }

    /// Releases the engine after a progress pass made under `e`, waking whoever that pass
    /// completed a request for (futures, threads asleep in a wait).
    pub(crate) fn unlock_after_progress(&self, mut e: MutexGuard<'_, Engine>) {
        let wakers = std::mem::take(&mut e.core.wakers);
        drop(e);
        self.after_progress(wakers);
    }

    #[inline]
    fn after_progress(&self, wakers: Vec<std::task::Waker>) {
        if wakers.is_empty() {
            if self.blocked.load(Ordering::SeqCst) > 0 {
                self.kick();
            }
            return;
        }
        self.wake_all(wakers);
    }

    /// Wakes the futures whose requests completed, and the threads that
    /// drive progress for them.
    fn wake_all(&self, wakers: Vec<std::task::Waker>) {
        for w in wakers {
            w.wake();
        }
        self.kick();
    }

    /// Wakes threads waiting in this process: the sleepers whose request is done or who wait
    /// for anything, one more where no thread holds the poller's role (to take it), the
    /// progress thread, and the poller.
    ///
    /// Only those: every blocked thread woke at every step of progress before, and with 16
    /// threads each blocked in a receive the receiving process spent 465 µs of CPU per message
    /// (70 µs with one thread), most of it switching between threads that went back to sleep.
    fn kick(&self) {
        // Only the progress thread of futures waits on `cond` (a system call saved per kick
        // where there is none).
        if self.async_started.load(Ordering::SeqCst) {
            self.cond.notify_all();
        }
        let e = self.lock();
        let mut to_poll = !self.poller.load(Ordering::SeqCst);
        for s in &e.sleepers {
            if to_poll || s.want.is_none_or(|id| e.core.done_or_gone(id)) {
                s.cv.notify_one();
                to_poll = false;
            }
        }
        if self.in_poll.load(Ordering::SeqCst) {
            if let Some(a) = &self.self_wake {
                let _ = e.links.wake.send_to_addr(&[1], a);
            }
        }
    }

    fn set_sleeping(&self, e: &Engine, on: bool) {
        for f in &e.links.my_sleep {
            f.get().store(on as u32, Ordering::SeqCst);
        }
        e.links.arm_pipes(on);
        if on {
            // Writers to our rings and pipes skip their barrier (`publish_fence`).
            crate::sys::sleep_fence();
        }
    }

    /// Drives progress until `check` returns a value.
    pub(crate) fn wait_until<R>(&self, check: impl FnMut(&mut Engine) -> Option<R>) -> R {
        self.wait_until_for(None, check)
    }

    /// As [`Shared::wait_until`], for a `check` that can only succeed once request `want`
    /// is done (where given): asleep, the thread is woken for that, not for every step of
    /// progress.
    pub(crate) fn wait_until_for<R>(
        &self,
        want: Option<core::ReqId>,
        mut check: impl FnMut(&mut Engine) -> Option<R>,
    ) -> R {
        // What is already there is taken before anything else (a request that
        // completed earlier, most often: the later waits of a window of
        // receives): no count of waiters to touch, no progress pass.
        let mut held = self.lock();
        if let Some(r) = check(&mut held) {
            return r;
        }
        let mut held = Some(held);
        // Counted while it waits, for the spin budget (see `spin`): once two
        // threads have waited at the same time it stops growing, as several
        // long spinners would share the cores.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        if self.waiting.fetch_add(1, Ordering::Relaxed) > 0 {
            self.threads_waited.store(true, Ordering::Relaxed);
        }
        let _waiting = Waiting(&self.waiting);
        // With a core of our own, the clock starts at the 16th empty pass and
        // is read on every 16th pass only: a pass without it is several times
        // shorter, and a short pass is what notices an arriving message soonest
        // (a ping-pong's reply often comes within those first passes). A pass
        // that yields the core may take a time slice, so it reads the clock.
        let mut start = None;
        let mut spins = 0u32;
        let mut waited = Duration::ZERO;
        // Yield while spinning only while more processes are awake on this
        // machine than it has cores: on an oversubscribed machine whose other
        // ranks sleep, the awake ones spin as on a machine of their own
        // (measured: 4 ranks on 2 cores, 8-byte ping-pong between two of them
        // 0.60 µs yielding, about 0.25 µs spinning). Looked at on the clock's
        // passes; a sleeper that wakes is seen within 16 passes.
        let mut crowded = self.oversubscribed;
        let mut fds = Vec::new();
        // Set when this thread was woken from its condition variable by a thread that had
        // just made progress (see below).
        let mut woken = false;
        let mut cv = None;
        // Whether this thread holds the poller's role: it keeps it from its first sleep in
        // `poll` until it leaves, so the other waiters sleep until their own request is done
        // rather than take turns at polling.
        let mut polls = false;
        let r = loop {
            let mut e = held.take().unwrap_or_else(|| self.lock());
            if std::mem::take(&mut woken) {
                WAKE_UPS.fetch_add(1, Ordering::Relaxed);
                // What the waking thread moved is in the engine already: look at our own
                // request, then take over polling or sleep again. A pass of our own would
                // only repeat its work, and every woken thread made one: with 16 threads
                // each blocked in a receive, the receiving process spent 465 µs of CPU per
                // message (70 with one thread), and a pass that moved anything restarted
                // the thread's spin.
                if let Some(r) = check(&mut e) {
                    break r;
                }
                IDLE_WAKE_UPS.fetch_add(1, Ordering::Relaxed);
                if self.poller.load(Ordering::SeqCst) {
                    woken = self.sleep_on_cond(&mut held, e, want, &mut cv);
                    continue;
                }
                // The poller's role is free (its holder stopped and woke us): a full
                // iteration bids for it the usual way.
            }
            let moved = e.progress();
            let wakers = std::mem::take(&mut e.core.wakers);
            if let Some(r) = check(&mut e) {
                drop(e);
                if moved {
                    self.after_progress(wakers);
                }
                break r;
            }
            if moved {
                drop(e);
                self.after_progress(wakers);
                // The spin budget is time without progress: a long transfer
                // that stalls now and then on ring space must not fall back to
                // sleeping (a wake-up per stall) once it has run for longer
                // than the budget.
                start = None;
                spins = 0;
                waited = Duration::ZERO;
                continue;
            }
            if crowded || spins % 16 == 15 {
                waited = start.get_or_insert_with(Instant::now).elapsed();
                crowded =
                    self.oversubscribed && self.unseen_here + e.links.shm_awake() > self.cores;
            }
            if waited < self.spin.get() {
                drop(e);
                spins += 1;
                // With a core of our own, never: a process of another job that
                // shares our core takes a whole time slice at each yield while
                // the reply waits (2 ranks on 2 cores beside a CPU hog, yielding
                // every 32 passes after 10 µs: 8-byte broadcast and all-reduce
                // medians 31-37 µs, ping-pong p90 63-76 µs; not yielding:
                // 0.18-0.57 µs, MPICH 0.24-1.24).
                if crowded {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            if polls
                || self
                    .poller
                    .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                polls = true;
                // Announce sleep, then look once more: a writer that published
                // before seeing the flag is caught here (Dekker-style). This
                // pass also takes messages flow control held (`Core::hold`):
                // nothing else to do is when a hold could stall the job.
                self.set_sleeping(&e, true);
                e.core.unheld += 1;
                let moved = e.progress();
                e.core.unheld -= 1;
                // A completion found here must be returned, not dropped: the
                // check may have taken it (a request's slot is freed by `take`).
                let done = if moved { None } else { check(&mut e) };
                if moved || done.is_some() {
                    self.set_sleeping(&e, false);
                    let wakers = std::mem::take(&mut e.core.wakers);
                    drop(e);
                    self.after_progress(wakers);
                    match done {
                        Some(r) => break r,
                        None => continue,
                    }
                }
                e.links.poll_fds(&mut fds);
                // Set under the lock, as the sleep flags: a thread that makes progress after
                // our last look sees it and sends the wake-up datagram.
                self.in_poll.store(true, Ordering::SeqCst);
                drop(e);
                self.blocked.fetch_add(1, Ordering::SeqCst);
                let slept = Instant::now();
                let _ = poll::wait(&fds, Duration::from_millis(200));
                self.blocked.fetch_sub(1, Ordering::SeqCst);
                self.in_poll.store(false, Ordering::SeqCst);
                let alone = !self.threads_waited.load(Ordering::Relaxed);
                self.spin.learn(waited + slept.elapsed(), alone);
                let mut e = self.lock();
                e.links.drain_wake();
                self.set_sleeping(&e, false);
                // Woken by another process, maybe for what a sleeper waiting for anything
                // (a shared-memory collective's flags) looks at.
                for s in e.sleepers.iter().filter(|s| s.want.is_none()) {
                    s.cv.notify_one();
                }
                held = Some(e);
            } else {
                woken = self.sleep_on_cond(&mut held, e, want, &mut cv);
            }
        };
        if polls {
            // A sleeper takes the role over. Under the lock: a thread that failed to take the
            // role from us is listed as a sleeper by then, and one that comes later takes it.
            self.poller.store(false, Ordering::SeqCst);
            let e = self.lock();
            if !self.poller.load(Ordering::SeqCst) {
                if let Some(s) = e.sleepers.first() {
                    s.cv.notify_one();
                }
            }
        }
        r
    }

    /// Sleeps on this thread's own condition variable (`cv`, made on first use) as a
    /// [`Sleeper`] waiting for `want`, at most 20 ms (2 ms waiting for anything), keeping
    /// the lock it returns with in `held`; whether a thread woke it, rather than the timeout.
    fn sleep_on_cond<'a>(
        &'a self,
        held: &mut Option<MutexGuard<'a, Engine>>,
        mut e: MutexGuard<'a, Engine>,
        want: Option<core::ReqId>,
        cv: &mut Option<Arc<Condvar>>,
    ) -> bool {
        let cv = cv.get_or_insert_with(|| Arc::new(Condvar::new()));
        e.sleepers.push(Sleeper {
            want,
            cv: Arc::clone(cv),
        });
        self.blocked.fetch_add(1, Ordering::SeqCst);
        // A request completes in a progress pass, and whoever makes one wakes its waiter
        // (`kick`). Other waits may end with what other processes write to shared memory,
        // which no pass of ours reports: they look again every 2 ms. Each look costs: 16
        // threads asleep in receives, one message every 200 µs, took 90 µs of CPU per
        // message when each looked every 2 ms, 55-60 with 20 ms.
        let limit = Duration::from_millis(if want.is_some() { 20 } else { 2 });
        let (mut e, timeout) = cv.wait_timeout(e, limit).unwrap_or_else(|p| p.into_inner());
        self.blocked.fetch_sub(1, Ordering::SeqCst);
        if let Some(k) = e.sleepers.iter().position(|s| Arc::ptr_eq(&s.cv, cv)) {
            e.sleepers.swap_remove(k);
        }
        *held = Some(e);
        !timeout.timed_out()
    }

    /// Starts (once) the thread that drives progress while futures wait.
    pub(crate) fn ensure_async_progress(self: &Arc<Self>) {
        if self.async_started.swap(true, Ordering::SeqCst) {
            self.cond.notify_all();
            return;
        }
        let me = Arc::clone(self);
        let _ = std::thread::Builder::new()
            .name("metampi-progress".into())
            .spawn(move || loop {
                {
                    let mut e = me.lock();
                    while e.core.async_waiters == 0 && !me.finalized.load(Ordering::SeqCst) {
                        e = me
                            .cond
                            .wait_timeout(e, Duration::from_millis(50))
                            .map(|r| r.0)
                            .unwrap_or_else(|p| p.into_inner().0);
                    }
                }
                if me.finalized.load(Ordering::SeqCst) {
                    return;
                }
                me.wait_until(|e| {
                    (e.core.async_waiters == 0 || me.finalized.load(Ordering::SeqCst)).then_some(())
                });
            });
    }

    /// Asks the launcher to end the job. Does not return.
    pub(crate) fn abort(&self, code: i32, msg: &str) -> ! {
        if let Ok(mut g) = self.pmi.lock() {
            if let Some(p) = g.as_mut() {
                let _ = p.abort(code, msg);
            }
        }
        std::process::exit(if code == 0 { 1 } else { code })
    }

    /// Leaves the job cleanly after the final barrier.
    pub(crate) fn finalize(&self) {
        self.wait_until(|e| (!e.links.has_pending()).then_some(()));
        if let Ok(mut g) = self.pmi.lock() {
            if let Some(p) = g.as_mut() {
                let _ = p.finalize();
            }
        }
        self.finalized.store(true, Ordering::SeqCst);
        self.cond.notify_all();
    }
}

impl Shared {
    /// One progress pass, then the result of `id` if it is complete.
    pub(crate) fn test(&self, id: core::ReqId) -> Option<core::Completed> {
        let mut e = self.lock();
        e.progress();
        let r = e.core.take(id);
        let wakers = std::mem::take(&mut e.core.wakers);
        drop(e);
        self.after_progress(wakers);
        r
    }

    /// A blocking receive from a shared-memory peer, before it is posted:
    /// spins for up to [`PURE_SPIN`] while the peer's ring stays empty,
    /// polling the word its next record sets without the engine's lock, and
    /// takes the message through [`Engine::recv_now`]. `None`: post it and
    /// wait as usual (no ring, an oversubscribed machine, something there the
    /// cheap path cannot take, or nothing came).
    ///
    /// Measured (2 ranks pinned, 8-byte ping-pong, 24 alternating runs,
    /// median): 0.24 µs one way through a posted receive, 0.20 this way
    /// (MPICH in the same session: 0.20-0.24).
    pub(crate) fn recv_spin(
        &self,
        pat: &core::Pattern,
        buf: &mut core::RecvBuf,
    ) -> Option<core::RawStatus> {
        // Nor where waits must not spin at all (`METAMPI_SPIN_US=0`).
        if self.oversubscribed || self.spin.get().is_zero() {
            return None;
        }
        let src = pat.src?;
        let mut start = None;
        let mut looks = 0u32;
        loop {
            let mut e = self.lock();
            if let Some(st) = e.recv_now(pat, buf) {
                if looks > 0 {
                    SPIN_RECEIVES.fetch_add(1, Ordering::Relaxed);
                }
                return Some(st);
            }
            let (waiting, watch) = e.links.ring_head(src)?;
            // Something there already that the cheap path refuses.
            if waiting || e.core.probe(*pat).is_some() {
                return None;
            }
            looks += 1;
            if looks % 16 == 0 {
                // Everything else this rank owes progress to moves too; what
                // that pass takes from the ring goes the full way.
                let moved = e.progress();
                let wakers = std::mem::take(&mut e.core.wakers);
                drop(e);
                self.after_progress(wakers);
                if moved || start.get_or_insert_with(Instant::now).elapsed() > PURE_SPIN {
                    return None;
                }
            } else {
                drop(e);
            }
            for _ in 0..LOOKS_UNLOCKED {
                // SAFETY: the ring is in this rank's own segment (`ring_head`).
                if unsafe { watch.published() } {
                    break;
                }
                std::hint::spin_loop();
            }
        }
    }

    /// As [`Shared::wait`], for a request whose result is its status alone
    /// ([`core::Core::take_status`]).
    pub(crate) fn wait_status(&self, id: core::ReqId) -> Result<core::RawStatus, crate::Error> {
        if id == core::SENT {
            return Ok(core::RawStatus::default());
        }
        self.wait_until_for(Some(id), |e| e.core.take_status(id))
    }

    /// For `testing::spin_budget`.
    pub(crate) fn spin_budget(&self) -> Option<(Duration, Duration, u64, u64)> {
        self.spin.learns().then(|| {
            (
                self.spin.base(),
                self.spin.get(),
                spin::GROWN.load(Ordering::Relaxed),
                spin::BUSY.load(Ordering::Relaxed),
            )
        })
    }

    /// Blocks until request `id` completes and returns its result.
    pub(crate) fn wait(&self, id: core::ReqId) -> core::Completed {
        // A send that completed as it started needs no lock.
        if id == core::SENT {
            return core::Completed::sent();
        }
        self.wait_until_for(Some(id), |e| e.core.take(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{self, Secret};

    #[test]
    fn a_small_shared_memory_file_system_is_reported() {
        assert_eq!(shm_space_warning(64 << 20, 64 << 20), None);
        let w = shm_space_warning(96 << 20, 60 << 20).expect("a warning");
        assert!(w.contains("96 MiB") && w.contains("60 MiB"), "{w}");
        assert!(
            w.contains("--shm-size") && w.contains("METAMPI_SHM_RING"),
            "{w}"
        );
    }

    /// Silent strangers connected first must not hold up the real peers:
    /// each handshake runs on its own, so the two peers get in long before
    /// the strangers' 10-second handshake timeout.
    #[test]
    fn silent_strangers_do_not_delay_peers() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let key = Secret::random().unwrap();
        let strangers: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let peers: Vec<_> = [1u32, 0]
            .into_iter()
            .map(|r| {
                let key = key.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(50));
                    let mut s = TcpStream::connect(addr).unwrap();
                    auth::connect(&mut s, &key, RANK_CTX, &r.to_le_bytes()).unwrap();
                    s
                })
            })
            .collect();
        let t = Instant::now();
        let mut got = accept_peers(2, &listener, &key, RANK_CTX, vec![0, 1]).unwrap();
        let took = t.elapsed();
        got.sort_by_key(|p| p.0);
        assert_eq!(got.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1]);
        assert!(
            took < Duration::from_secs(5),
            "peers waited {took:?} behind strangers"
        );
        for p in peers {
            p.join().unwrap();
        }
        drop(strangers);
    }

    /// A wrong secret is refused and the real peer still gets in.
    #[test]
    fn wrong_secret_is_refused_and_peer_accepted() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let key = Secret::random().unwrap();
        let bad = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let wrong = Secret::random().unwrap();
            auth::connect(&mut s, &wrong, RANK_CTX, &0u32.to_le_bytes()).unwrap_err()
        });
        let k = key.clone();
        let good = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let mut s = TcpStream::connect(addr).unwrap();
            auth::connect(&mut s, &k, RANK_CTX, &0u32.to_le_bytes()).unwrap();
        });
        let got = accept_peers(1, &listener, &key, RANK_CTX, vec![0]).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 0);
        let e = bad.join().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        good.join().unwrap();
    }
}
