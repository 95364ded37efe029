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
mod start;

pub(crate) use start::{accept_peers, configure_stream, contract, ring_cap, SEG_CTL};

use std::io;
use std::net::IpAddr;
use std::os::unix::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use self::core::Core;
use self::links::Links;
use crate::bootstrap::Pmi;
use crate::sys::poll;

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

/// What start-up ([`start`]) learned and built, for [`Shared::new`].
struct Parts {
    core: Core,
    links: Links,
    spin: spin::SpinBudget,
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
                colls: Default::default(),
                sleepers: Vec::new(),
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
            finalized: AtomicBool::new(false),
            next_context: AtomicU32::new(p.next_context),
            tcp_ip: p.tcp_ip,
            listen_ip: p.listen_ip,
            parent: p.parent,
            children: Mutex::default(),
        })
    }
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

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

impl Shared {
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
