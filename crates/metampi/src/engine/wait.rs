//! Waiting: how threads of a rank wait for their requests without burning the cores others
//! need, and who wakes them.
//!
//! # The protocol
//! A thread in [`Shared::wait_until_for`] goes through these states, leaving as soon as its
//! check succeeds:
//! 1. **Spin**: progress passes under the engine's lock for the spin budget (`spin.rs`; time
//!    without progress, learnt unless set). Where more processes are awake on this machine
//!    than it has cores, it yields between passes instead of spinning flat out.
//! 2. **Bid for the poller's role** (`Shared::poller`, one holder per process). The holder
//!    keeps it until it leaves, so the others sleep until their own request is done rather
//!    than take turns at polling.
//! 3. **The poller announces sleep, looks once more, then sleeps in `poll`**: it raises its
//!    sleep flags in shared memory and arms the router pipes (`set_sleeping`), makes a full
//!    fence (`sys::sleep_fence`, paired with the writers' `publish_fence`), and makes one
//!    more pass: a writer that published before it saw the flag is caught by that pass, one
//!    that published after sees the flag and sends the wake-up datagram (Dekker-style). It
//!    then sets `in_poll` under the lock and sleeps in `poll` on its wake-up socket and
//!    sockets, at most 200 ms.
//! 4. **The others sleep on a condition variable of their own** as a [`Sleeper`] naming the
//!    request they wait for (20 ms at most; 2 ms for a wait on anything, which may end with
//!    what another process writes to shared memory and no pass of ours reports).
//!
//! Waking ([`Shared::kick`], after any pass that completed something or while threads are
//! blocked): the progress thread of futures, the sleepers whose request is done or who wait
//! for anything, one more sleeper when nobody holds the poller's role (to take it), and the
//! poller through its wake-up datagram when it is in `poll`. A woken sleeper looks at its own
//! request first and does not repeat the waker's pass. A poller that leaves gives the role
//! back and wakes the first sleeper, under the lock, so a thread that failed to take the role
//! is listed as a sleeper by then. A woken thread whose wait is over while the role is vacant
//! passes the wake-up on to the first sleeper (it may have been the one meant to take the
//! role). These pieces are in `election.rs`, with a loom model that finds a lost hand-over
//! when any of them is left out.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, MutexGuard};
use std::time::{Duration, Instant};

use super::election::{self, RoleFlag};
use super::{core, report, Engine, Shared};
use crate::sys::{poll, sleep_flag};

/// Blocking receives whose message [`Shared::recv_spin`] waited for and
/// took (for tests, `counters::spin_receives`).
pub(crate) static SPIN_RECEIVES: AtomicU64 = AtomicU64::new(0);

/// Times a thread asleep in [`Shared::wait_until`] was woken by another and found its wait
/// not over, and all times it was woken by another (for `counters::thread_wake_ups`).
pub(crate) static IDLE_WAKE_UPS: AtomicU64 = AtomicU64::new(0);
pub(crate) static WAKE_UPS: AtomicU64 = AtomicU64::new(0);

/// How long a blocking receive watches its sender's ring without the lock
/// before it takes the engine's loop ([`Shared::recv_spin`]).
const PURE_SPIN: Duration = Duration::from_micros(10);

/// Looks at a ring's head word between two looks with the lock, in
/// [`Shared::recv_spin`].
const LOOKS_UNLOCKED: u32 = 64;

impl Shared {
    #[inline]
    pub(super) fn after_progress(&self, wakers: Vec<std::task::Waker>) {
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
        e.sleepers
            .kick(!self.poller.held(), |id| e.core.done_or_gone(id));
        if self.in_poll.load(Ordering::SeqCst) {
            if let Some(a) = &self.self_wake {
                let _ = e.links.wake.send_to_addr(&[1], a);
            }
        }
    }

    fn set_sleeping(&self, e: &Engine, on: bool) {
        // The pipes are armed before the flags' fence, which orders both before the last look
        // (writers to our rings and pipes may skip their barrier: `publish_fence`).
        e.links.arm_pipes(on);
        sleep_flag::announce(
            e.links.my_sleep.iter().map(|f| f.get()),
            on,
            crate::sys::sleep_fence,
        );
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
        // This thread's entry in the hang report, made when it first sleeps.
        let mut entered: Option<report::Entered> = None;
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
                    election::pass_on(&self.poller, &e.sleepers);
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
                // Moving is not hanging: a later sleep enters the wait afresh.
                entered = None;
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
            if entered.is_none() {
                entered = report::enter(&e, want, start.unwrap_or_else(Instant::now));
            }
            polls = election::bid(&self.poller, polls);
            if polls {
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
                    // What it waits beside may have changed (a message moved from its ring
                    // to the unexpected queue): the next sleep describes the wait afresh.
                    entered = None;
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
                e.sleepers.wake_anything();
                held = Some(e);
            } else {
                woken = self.sleep_on_cond(&mut held, e, want, &mut cv);
            }
        };
        if polls {
            // A sleeper takes the role over.
            election::give_back(&self.poller, || self.lock(), |e: &Engine| &e.sleepers);
        }
        r
    }

    /// Sleeps on this thread's own condition variable (`cv`, made on first use) as a
    /// [`Sleeper`] waiting for `want`, at most 20 ms (2 ms waiting for anything), keeping
    /// the lock it returns with in `held`; whether a thread woke it, rather than the timeout.
    fn sleep_on_cond<'a>(
        &'a self,
        held: &mut Option<MutexGuard<'a, Engine>>,
        e: MutexGuard<'a, Engine>,
        want: Option<core::ReqId>,
        cv: &mut Option<Arc<Condvar>>,
    ) -> bool {
        self.blocked.fetch_add(1, Ordering::SeqCst);
        // A request completes in a progress pass, and whoever makes one wakes its waiter
        // (`kick`). Other waits may end with what other processes write to shared memory,
        // which no pass of ours reports: they look again every 2 ms. Each look costs: 16
        // threads asleep in receives, one message every 200 µs, took 90 µs of CPU per
        // message when each looked every 2 ms, 55-60 with 20 ms.
        let limit = Duration::from_millis(if want.is_some() { 20 } else { 2 });
        let (e, woken) = election::sleep(e, |e: &mut Engine| &mut e.sleepers, want, cv, limit);
        self.blocked.fetch_sub(1, Ordering::SeqCst);
        *held = Some(e);
        woken
    }

    /// Whether the progress thread has work: futures wait, or (with
    /// `METAMPI_ASYNC_PROGRESS`) any send or receive is under way.
    fn wants_progress(&self, e: &Engine) -> bool {
        e.core.async_waiters > 0 || (self.progress_all && e.core.any_incomplete())
    }

    /// Starts (once) the thread that drives progress while futures wait, and with
    /// `METAMPI_ASYNC_PROGRESS` while any nonblocking operation is under way, so that a
    /// transfer goes on while the program computes between its start and its wait.
    pub(crate) fn ensure_async_progress(self: &Arc<Self>) {
        if self.async_started.swap(true, Ordering::SeqCst) {
            self.cond.notify_all();
            return;
        }
        let me = Arc::clone(self);
        let _ = std::thread::Builder::new()
            .name("metampi-progress".into())
            .spawn(move || {
                // It waits for others' futures, which the report names where they wait.
                report::never_report();
                loop {
                    {
                        let mut e = me.lock();
                        // Nothing tells this thread that a request was posted: it looks
                        // every 2 ms when it moves every request, else every 50 ms (futures
                        // notify it).
                        let idle = Duration::from_millis(if me.progress_all { 2 } else { 50 });
                        while !me.wants_progress(&e) && !me.finalized.load(Ordering::SeqCst) {
                            e = me
                                .cond
                                .wait_timeout(e, idle)
                                .map(|r| r.0)
                                .unwrap_or_else(|p| p.into_inner().0);
                        }
                    }
                    if me.finalized.load(Ordering::SeqCst) {
                        return;
                    }
                    me.wait_until(|e| {
                        (!me.wants_progress(e) || me.finalized.load(Ordering::SeqCst)).then_some(())
                    });
                }
            });
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

    #[cfg(feature = "test-counters")]
    /// For `counters::spin_budget`.
    pub(crate) fn spin_budget(&self) -> Option<(Duration, Duration, u64, u64)> {
        self.spin.learns().then(|| {
            (
                self.spin.base(),
                self.spin.get(),
                crate::sys::spin::GROWN.load(Ordering::Relaxed),
                crate::sys::spin::BUSY.load(Ordering::Relaxed),
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
