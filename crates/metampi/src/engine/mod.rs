//! The per-process engine: matching core plus transports, shared by every
//! thread of the process, and the wait loop that drives them.
//!
//! Progress happens inside calls (no background thread unless a `Future` is
//! waiting). A waiting thread spins for a short while, then blocks in `poll`
//! on its wake-up socket and TCP connections; shared-memory writers see the
//! raised sleep flag and send a one-byte datagram, so ranks that outnumber
//! cores sleep instead of burning CPU.

#[allow(unsafe_code)]
pub(crate) mod coop;
#[allow(unsafe_code)]
pub(crate) mod core;
#[allow(unsafe_code)]
pub(crate) mod join;
// Of the transports, only the shared-memory backend (`links::shm`) may use `unsafe`.
mod election;
pub(crate) mod links;
pub(crate) mod parents;
pub(crate) mod report;
#[allow(unsafe_code)]
mod start;
pub mod stream;
pub(crate) mod traffic;
#[allow(unsafe_code)]
mod wait;

pub(crate) use start::{
    accept_peers, accept_peers_until, configure_stream, contract, ring_cap, SEG_CTL,
};
pub(crate) use wait::{IDLE_WAKE_UPS, SPIN_RECEIVES, WAKE_UPS};

use std::io;
use std::net::IpAddr;
use std::os::unix::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use self::core::Core;
use self::links::Links;
use crate::bootstrap::Pmi;

/// The context pair of the library's finalization barrier
/// (`SimpleCommunicator::finalizer`); the world has 0 and 1, `MPI_COMM_SELF` 2 and 3.
pub(crate) const FINALIZE_CONTEXT: u32 = 4;
/// The first context a communicator the program makes may get.
pub(crate) const FIRST_FREE_CONTEXT: u32 = FINALIZE_CONTEXT + 2;

/// What advances on every progress pass besides point-to-point traffic: the collective
/// schedules in flight. Defined above the engine (`collective::schedule::Schedules`), which
/// adds to it through [`Engine::pass_work`]; the engine only drives it.
pub(crate) trait PassWork: Send + std::any::Any {
    /// Advances what runs; whether anything moved, and whether anything still runs.
    fn advance(&mut self, core: &mut Core, links: &mut Links) -> (bool, bool);
    /// The name and context of the work that request `id` completes with.
    fn describe(&self, id: core::ReqId) -> Option<(&'static str, u32)>;
}

pub(crate) struct Engine {
    pub core: Core,
    pub links: Links,
    /// Collective schedules in flight (blocking and nonblocking): made by the first
    /// collective ([`Engine::pass_work`]).
    colls: Option<Box<dyn PassWork>>,
    /// Whether `colls` may have something running: a pass with nothing there costs a
    /// load, not a call (3% of a receiving rank's cycles in an 8-byte message-rate run
    /// went to a call that found nothing).
    colls_running: bool,
    /// Threads asleep on a condition variable of their own in [`Shared::wait_until`].
    sleepers: election::Sleepers<core::ReqId>,
}

impl Engine {
    pub(crate) fn progress(&mut self) -> bool {
        self.progress_as(false)
    }

    /// A progress pass; `lazy`: see [`links::Links::progress_as`].
    pub(crate) fn progress_as(&mut self, lazy: bool) -> bool {
        let moved = self.links.progress_as(&mut self.core, lazy);
        if let Some(why) = self.links.fatal.take() {
            abort_job(1, &why);
        }
        // Collectives advance on every pass, whichever thread drives it.
        if !self.colls_running {
            return moved;
        }
        let Some(w) = self.colls.as_mut() else {
            return moved;
        };
        let (advanced, running) = w.advance(&mut self.core, &mut self.links);
        self.colls_running = running;
        advanced || moved
    }

    /// The work of kind `W` that advances on every pass (the collective schedules), made
    /// on first use, to add to; with the engine's queues and links. What is added advances
    /// from the next pass on.
    pub(crate) fn pass_work<W: PassWork + Default>(&mut self) -> (&mut W, &mut Core, &mut Links) {
        self.colls_running = true;
        let w: &mut dyn std::any::Any =
            &mut **self.colls.get_or_insert_with(|| Box::<W>::default());
        let w = w
            .downcast_mut::<W>()
            .expect("the engine holds one kind of pass work");
        (w, &mut self.core, &mut self.links)
    }

    /// The name and context of the pass work (a collective) request `id` completes with.
    pub(crate) fn describe_pass_work(&self, id: core::ReqId) -> Option<(&'static str, u32)> {
        self.colls.as_ref()?.describe(id)
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
        let got = match self.core.take_unexpected_eager(pat, buf) {
            Some(found) => found,
            None => self.links.take_ring_head(&self.core, pat.src?, pat, buf),
        };
        if let Some(st) = &got {
            traffic::received(st.len);
        }
        got
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
    spin: crate::sys::spin::SpinBudget,
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
    /// `METAMPI_ASYNC_PROGRESS`: the progress thread moves every request, not only futures.
    progress_all: bool,
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

/// What start-up ([`start`]) learned and built, for [`Shared::new`].
struct Parts {
    core: Core,
    links: Links,
    spin: crate::sys::spin::SpinBudget,
    oversubscribed: bool,
    cores: usize,
    unseen_here: usize,
    info: JobInfo,
    pmi: Option<Pmi>,
    next_context: u32,
    tcp_ip: IpAddr,
    listen_ip: IpAddr,
    parent: Option<(u32, Vec<u32>)>,
}

impl Shared {
    /// The one constructor: nothing waits, nothing is finalized yet.
    fn new(p: Parts) -> io::Result<Shared> {
        let self_wake = start::wake_name(&p.info.job, p.info.rank)?;
        Ok(Shared {
            engine: Mutex::new(Engine {
                core: p.core,
                links: p.links,
                colls: None,
                colls_running: false,
                sleepers: Default::default(),
            }),
            cond: Condvar::new(),
            poller: AtomicBool::new(false),
            in_poll: AtomicBool::new(false),
            blocked: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            threads_waited: AtomicBool::new(false),
            spin: p.spin,
            oversubscribed: p.oversubscribed,
            cores: p.cores,
            unseen_here: p.unseen_here,
            info: p.info,
            pmi: Mutex::new(p.pmi),
            self_wake: Some(self_wake),
            async_started: AtomicBool::new(false),
            progress_all: crate::knobs::flag("METAMPI_ASYNC_PROGRESS", false),
            finalized: AtomicBool::new(false),
            next_context: AtomicU32::new(p.next_context),
            tcp_ip: p.tcp_ip,
            listen_ip: p.listen_ip,
            parent: p.parent,
            children: Mutex::default(),
        })
    }
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

impl Shared {
    /// Whether `METAMPI_ASYNC_PROGRESS` asked for a thread that moves every request.
    pub(crate) fn progress_all(&self) -> bool {
        self.progress_all
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

    /// Asks the launcher to end the job, saying why on stderr unless `metampi run` took the
    /// message (it prints it with the rank's process and host). Does not return.
    pub(crate) fn abort(&self, code: i32, msg: &str) -> ! {
        let full = format!("rank {}: {msg}", self.info.rank);
        let mut said = false;
        if let Ok(mut g) = self.pmi.lock() {
            if let Some(p) = g.as_mut() {
                if p.prints_aborts() {
                    said = p.abort(code, msg).is_ok();
                } else {
                    eprintln!("metampi: {full}");
                    said = true;
                    let _ = p.abort(code, &full);
                }
            }
        }
        if !said {
            eprintln!("metampi: {full}");
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

/// The running job's engine, set once at start-up: a single atomic load on every call.
static ENGINE: std::sync::OnceLock<Arc<Shared>> = std::sync::OnceLock::new();

/// Makes `s` the engine of this process (`initialize`, once).
pub(crate) fn install(s: Arc<Shared>) {
    let _ = ENGINE.set(s);
}

/// The running job's engine; a clear error if the library is not initialized.
#[inline]
pub(crate) fn shared() -> &'static Arc<Shared> {
    match ENGINE.get() {
        Some(s) if !s.finalized.load(std::sync::atomic::Ordering::Relaxed) => s,
        other => not_running(other.is_some()),
    }
}

#[cold]
#[inline(never)]
fn not_running(finalized: bool) -> ! {
    if finalized {
        panic!("metampi was finalized: the Universe has been dropped")
    }
    panic!("metampi is not initialized: call metampi::initialize() first")
}

pub(crate) fn try_shared() -> Option<&'static Arc<Shared>> {
    ENGINE
        .get()
        .filter(|s| !s.finalized.load(std::sync::atomic::Ordering::Relaxed))
}

/// Ends every process of the job with `code` and a message naming this rank.
pub(crate) fn abort_job(code: i32, msg: &str) -> ! {
    match try_shared() {
        // Said once: by `metampi run`, which names the rank's process and host, or here
        // where another process manager (or none) takes the abort.
        Some(s) => s.abort(code, msg),
        None => {
            eprintln!("metampi: {msg}");
            std::process::exit(if code == 0 { 1 } else { code })
        }
    }
}
