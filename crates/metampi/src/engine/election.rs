//! The poller's role and the sleepers: which waiting thread of a process sleeps in `poll`,
//! which sleep on condition variables of their own, and who wakes whom (the protocol is
//! written down in `wait.rs`).
//!
//! The pieces here are the parts of that protocol where a wake-up can be lost: taking the
//! role, listing a sleeper, a kick, and giving the role back. They are generic over the
//! condition variable and the role's flag so that the loom model at the end runs them with
//! loom's types: the library's own code, in every interleaving loom allows, with condition
//! variables that never time out (loom's), so that a lost hand-over is a deadlock the model
//! reports instead of a 20 ms stall the timeouts would hide.

use std::ops::DerefMut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, MutexGuard};
use std::time::Duration;

/// A condition variable and the guard of the mutex it waits with.
pub(crate) trait Cond {
    type Guard<'a, T: 'a>: DerefMut<Target = T>;
    fn new() -> Self;
    /// Sleeps at most `limit`; the guard, and whether a notification (not the timeout) ended
    /// the sleep.
    fn sleep<'a, T: 'a>(
        &self,
        g: Self::Guard<'a, T>,
        limit: Duration,
    ) -> (Self::Guard<'a, T>, bool);
    fn notify_one(&self);
}

impl Cond for Condvar {
    type Guard<'a, T: 'a> = MutexGuard<'a, T>;
    fn new() -> Self {
        Condvar::new()
    }
    fn sleep<'a, T: 'a>(&self, g: MutexGuard<'a, T>, limit: Duration) -> (MutexGuard<'a, T>, bool) {
        let (g, r) = self
            .wait_timeout(g, limit)
            .unwrap_or_else(|p| p.into_inner());
        (g, !r.timed_out())
    }
    fn notify_one(&self) {
        Condvar::notify_one(self)
    }
}

/// The flag that says a thread holds the poller's role.
pub(crate) trait RoleFlag {
    fn held(&self) -> bool;
    /// Takes the role where nobody holds it; whether this call did.
    fn take(&self) -> bool;
    fn give_back(&self);
}

impl RoleFlag for AtomicBool {
    fn held(&self) -> bool {
        self.load(Ordering::SeqCst)
    }
    fn take(&self) -> bool {
        self.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
    fn give_back(&self) {
        self.store(false, Ordering::SeqCst)
    }
}

/// A thread asleep on its own condition variable: the request it waits for (`None`: anything
/// may end its wait), and how to wake it.
pub(crate) struct Sleeper<I, C> {
    want: Option<I>,
    cv: Arc<C>,
}

/// The threads asleep on condition variables. Lives under the same lock as the requests'
/// state, and is only read or changed with that lock held.
pub(crate) struct Sleepers<I, C = Condvar> {
    list: Vec<Sleeper<I, C>>,
}

impl<I, C> Default for Sleepers<I, C> {
    fn default() -> Self {
        Sleepers { list: Vec::new() }
    }
}

impl<I: Copy, C: Cond> Sleepers<I, C> {
    /// A kick's wake-ups: the sleepers whose request is `done` or who wait for anything, and
    /// where the poller's role is `vacant`, one more (the first) to take it.
    pub(crate) fn kick(&self, vacant: bool, done: impl Fn(I) -> bool) {
        let mut to_poll = vacant;
        for s in &self.list {
            if to_poll || s.want.is_none_or(&done) {
                s.cv.notify_one();
                to_poll = false;
            }
        }
    }

    /// Wakes the sleepers that wait for anything (after the poller woke from `poll`: another
    /// process may have written what they look at).
    pub(crate) fn wake_anything(&self) {
        for s in self.list.iter().filter(|s| s.want.is_none()) {
            s.cv.notify_one();
        }
    }
}

/// Sleeps on this thread's own condition variable (`cv`, made on first use) as a sleeper
/// waiting for `want`, at most `limit`: listed under the lock `g` holds, which the wait
/// releases, and unlisted under it again. The guard back, and whether a thread woke it.
pub(crate) fn sleep<'a, T: 'a, I: Copy, C: Cond>(
    g: C::Guard<'a, T>,
    sleepers: impl Fn(&mut T) -> &mut Sleepers<I, C>,
    want: Option<I>,
    cv: &mut Option<Arc<C>>,
    limit: Duration,
) -> (C::Guard<'a, T>, bool) {
    let cv = cv.get_or_insert_with(|| Arc::new(C::new()));
    let mut g = g;
    sleepers(&mut g).list.push(Sleeper {
        want,
        cv: Arc::clone(cv),
    });
    let (mut g, woken) = cv.sleep(g, limit);
    let list = &mut sleepers(&mut g).list;
    if let Some(k) = list.iter().position(|s| Arc::ptr_eq(&s.cv, cv)) {
        list.swap_remove(k);
    }
    (g, woken)
}

/// A thread that bids for the poller's role with the lock held, takes it where it `holds` it
/// already or nobody does; whether it holds it now. One that loses is listed as a sleeper
/// before it lets the lock go ([`sleep`]), so the holder's [`give_back`] finds it.
pub(crate) fn bid(role: &impl RoleFlag, holds: bool) -> bool {
    holds || role.take()
}

/// The holder leaves: gives the role back, then under the lock (`lock`) wakes the first
/// sleeper to take it over unless another thread took it meanwhile. Under the lock: a thread
/// that lost its bid to us is listed as a sleeper by then, and one that bids later finds the
/// role free.
pub(crate) fn give_back<'a, T: 'a, I: Copy, C: Cond + 'a>(
    role: &impl RoleFlag,
    lock: impl FnOnce() -> C::Guard<'a, T>,
    sleepers: impl Fn(&T) -> &Sleepers<I, C>,
) {
    role.give_back();
    let g = lock();
    if !role.held() {
        if let Some(s) = sleepers(&g).list.first() {
            s.cv.notify_one();
        }
    }
}

/// A thread a wake-up reached that leaves without bidding for the role (its own wait is
/// over): where the role is vacant, the first sleeper gets the wake-up instead. The waker
/// may have meant this thread to take the role ([`give_back`] and a kick wake one sleeper
/// for that), and a second wake-up of a thread already woken is lost, so without this the
/// others would sleep out their timeouts with nobody polling (the model below found it: one
/// pass completing the poller's request and a sleeper's).
pub(crate) fn pass_on<I: Copy, C: Cond>(role: &impl RoleFlag, sleepers: &Sleepers<I, C>) {
    if !role.held() {
        if let Some(s) = sleepers.list.first() {
            s.cv.notify_one();
        }
    }
}

/// Loom model of the election: waiting threads of one process, each for a request of its
/// own, completed by messages that only a progress pass finds; passes are made by the
/// poller after `poll` (here a one-permit `Notify` the sender raises, standing in for the
/// wake-up datagram whose sleep-flag handshake `sys::sleep_flag` models) and by threads that
/// still spin. A thread asleep for ever while its request can only be found by a pass nobody
/// makes is a deadlock, which loom reports. `bash .ci/loom.sh` runs it.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::atomic::AtomicBool as LoomBool;
    use loom::sync::{Condvar as LoomCondvar, Mutex, MutexGuard as LoomGuard, Notify};

    impl Cond for LoomCondvar {
        type Guard<'a, T: 'a> = LoomGuard<'a, T>;
        fn new() -> Self {
            LoomCondvar::new()
        }
        fn sleep<'a, T: 'a>(
            &self,
            g: LoomGuard<'a, T>,
            _limit: Duration,
        ) -> (LoomGuard<'a, T>, bool) {
            // loom's condition variables never time out: the model needs the hand-over to
            // be complete without the library's timeouts.
            (self.wait(g).unwrap(), true)
        }
        fn notify_one(&self) {
            LoomCondvar::notify_one(self)
        }
    }

    impl RoleFlag for LoomBool {
        fn held(&self) -> bool {
            self.load(Ordering::SeqCst)
        }
        fn take(&self) -> bool {
            self.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        }
        fn give_back(&self) {
            self.store(false, Ordering::SeqCst)
        }
    }

    /// The state under the lock: which requests a pass found done, and the sleepers.
    struct State {
        done: Vec<bool>,
        sleepers: Sleepers<usize, LoomCondvar>,
    }

    struct Process {
        state: Mutex<State>,
        role: LoomBool,
        /// Messages sent (the sender's side; a pass turns them into completions).
        arrived: Vec<LoomBool>,
        /// The wake-up datagram.
        poll: Notify,
        /// The poller is in `poll`.
        in_poll: LoomBool,
    }

    impl Process {
        /// A progress pass: whether it completed anything.
        fn pass(&self, s: &mut State) -> bool {
            let mut moved = false;
            for (d, a) in s.done.iter_mut().zip(&self.arrived) {
                if !*d && a.load(Ordering::SeqCst) {
                    *d = true;
                    moved = true;
                }
            }
            moved
        }

        /// `Shared::kick` after a pass that moved something.
        fn kick(&self, s: &State) {
            s.sleepers.kick(!self.role.held(), |id| s.done[id]);
            if self.in_poll.load(Ordering::SeqCst) {
                self.poll.notify();
            }
        }

        /// `Shared::wait_until_for(Some(id))` with the spin phase cut to `spins` passes.
        fn wait(&self, id: usize, spins: usize) {
            let mut held: Option<LoomGuard<'_, State>> = None;
            let mut polls = false;
            let mut woken = false;
            let mut cv = None;
            let mut left = spins;
            loop {
                let mut g = held.take().unwrap_or_else(|| self.state.lock().unwrap());
                if std::mem::take(&mut woken) {
                    if g.done[id] {
                        pass_on(&self.role, &g.sleepers);
                        break;
                    }
                    if self.role.held() {
                        let (g, w) =
                            sleep(g, |s: &mut State| &mut s.sleepers, Some(id), &mut cv, MAX);
                        (held, woken) = (Some(g), w);
                        continue;
                    }
                }
                if self.pass(&mut g) {
                    self.kick(&g);
                }
                if g.done[id] {
                    break;
                }
                if left > 0 {
                    left -= 1;
                    drop(g);
                    loom::thread::yield_now();
                    continue;
                }
                polls = bid(&self.role, polls);
                if polls {
                    self.in_poll.store(true, Ordering::SeqCst);
                    // The last look after announcing sleep (the sleep-flag handshake).
                    if self.pass(&mut g) {
                        self.in_poll.store(false, Ordering::SeqCst);
                        self.kick(&g);
                        held = Some(g);
                        continue;
                    }
                    drop(g);
                    self.poll.wait();
                    self.in_poll.store(false, Ordering::SeqCst);
                    let g = self.state.lock().unwrap();
                    g.sleepers.wake_anything();
                    held = Some(g);
                } else {
                    let (g, w) = sleep(g, |s: &mut State| &mut s.sleepers, Some(id), &mut cv, MAX);
                    (held, woken) = (Some(g), w);
                }
            }
            drop(held);
            if polls {
                give_back(
                    &self.role,
                    || self.state.lock().unwrap(),
                    |s: &State| &s.sleepers,
                );
            }
        }
    }

    const MAX: Duration = Duration::from_millis(20);

    /// `threads` waiters, each for its own message; the sender sends them in order and
    /// raises the wake-up datagram after each.
    fn every_waiter_returns(threads: usize, spins: usize) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(2);
        b.check(move || {
            let p = Arc::new(Process {
                state: Mutex::new(State {
                    done: vec![false; threads],
                    sleepers: Sleepers::default(),
                }),
                role: LoomBool::new(false),
                arrived: (0..threads).map(|_| LoomBool::new(false)).collect(),
                poll: Notify::new(),
                in_poll: LoomBool::new(false),
            });
            let waiters: Vec<_> = (0..threads)
                .map(|id| {
                    let p = p.clone();
                    loom::thread::spawn(move || p.wait(id, spins))
                })
                .collect();
            for a in &p.arrived {
                a.store(true, Ordering::SeqCst);
                p.poll.notify();
            }
            for w in waiters {
                w.join().unwrap();
            }
        });
    }

    #[test]
    fn loom_model_two_waiters_hand_the_poller_role_over() {
        every_waiter_returns(2, 0);
    }

    #[test]
    fn loom_model_three_waiters_hand_the_poller_role_over() {
        every_waiter_returns(3, 0);
    }

    #[test]
    fn loom_model_a_spinner_and_a_sleeper() {
        every_waiter_returns(2, 1);
    }
}
