//! How long a waiting thread spins without progress before it sleeps.
//!
//! A rank with a core of its own starts at 200 µs and learns from its
//! sleeps. Waking a sleeping process is cheap on a bare machine but costs
//! 60-400 µs in the virtual machines this project runs on (an idle vCPU is
//! halted, and the host must run it again): 2 ranks taking turns computing
//! for 0.3-3 ms before an all-reduce paid 53-224 µs per iteration there
//! (`bench/turns.sh`), where MPICH, which never sleeps, paid 2-11. So a wait that ended
//! soon after its rank fell asleep (the whole wait within [`LEARN_MAX`])
//! raises the budget to half as much again as that wait, and a longer one
//! halves it, back towards the base: waits of a regular rhythm are spun
//! through, and a rank idle for seconds still sleeps within a few
//! milliseconds. Such a rank's budget grows only while the machine has a core for
//! every runnable thread (`/proc/loadavg`): where other processes want the
//! cores (concurrent jobs, a busy neighbour) it stays at the base, and a
//! spinning rank does not take time from them.
//!
//! Ranks that outnumber the cores start at 1 ms and learn the same way,
//! whatever the load: they yield their core between looks while more
//! processes are awake than cores, as Open MPI's ranks do, which never sleep
//! (4 ranks on 2 cores taking turns to compute 1-3 ms, `bench/turns.sh`:
//! 25-155 µs per iteration with the fixed 1 ms, 8.5-39 learnt, Open MPI
//! 28-60).
//! Nor does a budget grow once two threads of the process have waited at
//! the same time: each would spin that long, and threads outnumbering the
//! cores took a time slice (2 ms here) to see their message (two threads of
//! a rank receiving by turns every 2 ms: 1.9-2.0 ms from send to receive
//! with the budget grown, 75-100 µs without, as before it learnt).
//! `METAMPI_SPIN_US` fixes the budget of any rank, and `METAMPI_SPIN_LEARN=0`
//! keeps the starting one (`psrsearch` sets it for its ranks, as it turns
//! its routers' spin off: its plan measures the clients' speeds).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The longest a learnt budget gets.
pub const LEARN_MAX: Duration = Duration::from_millis(5);

/// How often a learnt budget grew and how often the machine was too busy
/// for it to (for tests, `counters::spin_budget`).
pub static GROWN: AtomicU64 = AtomicU64::new(0);
pub static BUSY: AtomicU64 = AtomicU64::new(0);

pub struct SpinBudget {
    base: Duration,
    now_ns: AtomicU64,
    learn: bool,
    /// Grow only where the machine has room (a rank that spins hard).
    needs_room: bool,
}

impl SpinBudget {
    /// A budget of `base`; `learn`: adapted by [`SpinBudget::learn`];
    /// `yields`: the rank yields its core while it spins among more awake
    /// processes than cores, so it may grow whatever the machine's load.
    pub fn new(base: Duration, learn: bool, yields: bool) -> SpinBudget {
        SpinBudget {
            base,
            now_ns: AtomicU64::new(base.as_nanos() as u64),
            learn,
            needs_room: !yields,
        }
    }

    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.now_ns.load(Ordering::Relaxed))
    }

    /// Whether it learns from waits (see [`SpinBudget::new`]).
    pub fn learns(&self) -> bool {
        self.learn
    }

    /// The budget it started from.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// After a sleep: `wait` is the whole wait, spinning and sleeping;
    /// `alone`: no two threads of this process have waited at once.
    pub fn learn(&self, wait: Duration, alone: bool) {
        if !self.learn {
            return;
        }
        let room = alone && (wait > LEARN_MAX || !self.needs_room || machine_has_room());
        if !room {
            BUSY.fetch_add(1, Ordering::Relaxed);
        }
        let now = self.get();
        let next = next_budget(now, self.base, wait, room);
        if next > now {
            GROWN.fetch_add(1, Ordering::Relaxed);
        }
        self.now_ns.store(next.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// The budget after a wait of `wait` that slept, from budget `now`; `room`:
/// the machine has a core for every runnable thread.
pub fn next_budget(now: Duration, base: Duration, wait: Duration, room: bool) -> Duration {
    if !room {
        base
    } else if wait <= LEARN_MAX {
        (wait * 3 / 2).clamp(now.max(base), LEARN_MAX.max(base))
    } else {
        (now / 2).max(base)
    }
}

/// Whether no more threads are runnable on this machine than it has online
/// CPUs (the caller among them).
fn machine_has_room() -> bool {
    let cpus = crate::cpus::online();
    let runnable =
        super::cpus::runnable(&std::fs::read_to_string("/proc/loadavg").unwrap_or_default());
    matches!(runnable, Some(r) if r <= cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_micros(200);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_short_wait_raises_the_budget_to_cover_it() {
        assert_eq!(next_budget(BASE, BASE, us(1000), true), us(1500));
        // Never below what it was, never above the cap.
        assert_eq!(next_budget(us(3000), BASE, us(1000), true), us(3000));
        assert_eq!(next_budget(BASE, BASE, us(4000), true), LEARN_MAX);
        // A wait shorter than the base leaves the base.
        assert_eq!(next_budget(BASE, BASE, us(100), true), BASE);
    }

    #[test]
    fn a_long_wait_halves_it_back_towards_the_base() {
        assert_eq!(next_budget(LEARN_MAX, BASE, us(50_000), true), us(2500));
        assert_eq!(next_budget(us(300), BASE, us(50_000), true), BASE);
        assert_eq!(next_budget(BASE, BASE, Duration::from_secs(1), true), BASE);
    }

    #[test]
    fn a_busy_machine_keeps_the_base() {
        assert_eq!(next_budget(us(3000), BASE, us(1000), false), BASE);
    }

    #[test]
    fn a_fixed_budget_does_not_learn() {
        let b = SpinBudget::new(BASE, false, false);
        b.learn(us(1000), true);
        assert_eq!(b.get(), BASE);
    }
}
