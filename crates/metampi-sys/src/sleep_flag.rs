//! The sleep-flag handshake between a process that blocks in `poll` and the processes
//! that write to its shared memory (ring records, freed ring space, collective flags).
//!
//! The sleeper raises its flag (a word in its own segment), makes the sleeper's fence
//! ([`super::sleep_fence`]), looks for work once more, and only then sleeps. A writer
//! publishes, makes the writer's fence ([`super::publish_fence`]), and looks at the flag:
//! up, it takes it down and sends the one wake-up datagram. The two fences order each
//! side's store before its load (Dekker), so at least one side sees the other: either the
//! sleeper's last look finds what was published, or the writer finds the flag up. Taking
//! the flag down with a compare-exchange sends one datagram per sleep however many
//! writers see it.
//!
//! The loom model at the end runs these functions against the shared-memory ring's own
//! producer and consumer code (`sys::ring`), with both fences as `SeqCst` fences. Where the
//! kernel offers `membarrier`, the pair is asymmetric (the writer's half is a compiler
//! fence, the sleeper's a barrier on every running CPU); loom cannot express that, and the
//! model checks the symmetric form the protocol falls back to.

use std::sync::atomic::{AtomicU32, Ordering};

/// A sleep flag's word: shared memory in the library, a loom atomic in the model.
pub trait SleepWord {
    fn load(&self, order: Ordering) -> u32;
    fn store(&self, v: u32, order: Ordering);
    fn compare_exchange(&self, current: u32, new: u32) -> bool;
}

impl SleepWord for AtomicU32 {
    #[inline(always)]
    fn load(&self, order: Ordering) -> u32 {
        AtomicU32::load(self, order)
    }
    #[inline(always)]
    fn store(&self, v: u32, order: Ordering) {
        AtomicU32::store(self, v, order)
    }
    #[inline(always)]
    fn compare_exchange(&self, current: u32, new: u32) -> bool {
        AtomicU32::compare_exchange(self, current, new, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

/// The writer's half, after it published: `fence` (the writer's fence), then whether the
/// flag's owner sleeps and this writer is the one to wake it (the flag is down again).
#[inline(always)]
pub fn must_wake_after_publish<W: SleepWord + ?Sized>(flag: &W, fence: impl FnOnce()) -> bool {
    fence();
    take(flag)
}

/// Takes the flag down where it is up; whether this call did (the caller's publish was
/// already fenced: [`must_wake_after_publish`]). Looked at first with a plain load: a flag
/// that is down costs no write to a line the sleeper owns.
#[inline(always)]
pub fn take<W: SleepWord + ?Sized>(flag: &W) -> bool {
    flag.load(Ordering::Relaxed) != 0 && flag.compare_exchange(1, 0)
}

/// The sleeper's half: raises (or lowers) its flags; raising ends with `fence` (the sleeper's
/// fence), after which the caller looks for work once more before it sleeps.
pub fn announce<'a, W: SleepWord + 'a>(
    flags: impl IntoIterator<Item = &'a W>,
    asleep: bool,
    fence: impl FnOnce(),
) {
    for f in flags {
        f.store(asleep as u32, Ordering::SeqCst);
    }
    if asleep {
        fence();
    }
}

/// Loom models of the handshake: a writer publishing a ring record and a sleeper going to
/// sleep, in every interleaving and every outcome of the memory model. A sleeper that sleeps
/// although nothing will wake it, with a record waiting, fails the model.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use crate::ring::loom_model::{ring, Model};
    use crate::ring::{Consumer, Producer, LINE};
    use loom::sync::atomic::{fence, AtomicBool, AtomicU32 as LoomU32};
    use loom::sync::Arc;

    impl SleepWord for LoomU32 {
        fn load(&self, order: Ordering) -> u32 {
            LoomU32::load(self, order)
        }
        fn store(&self, v: u32, order: Ordering) {
            LoomU32::store(self, v, order)
        }
        fn compare_exchange(&self, current: u32, new: u32) -> bool {
            LoomU32::compare_exchange(self, current, new, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        }
    }

    fn writer_fence() {
        fence(Ordering::SeqCst)
    }
    fn sleeper_fence() {
        fence(Ordering::SeqCst)
    }

    /// `writers` records published into one ring while its reader goes to sleep; the
    /// reader either finds one in its last look or is woken, and is woken at most once.
    fn no_lost_wake_up(writers: usize, writer_fence: fn(), sleeper_fence: fn()) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(move || {
            let mem: Arc<Model> = ring(4);
            let cap = 4 * LINE;
            let flag = Arc::new(LoomU32::new(0));
            let wakes = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
            let published = Arc::new(AtomicBool::new(false));
            // The ring has one producer; a second writer publishes a collective's flag
            // word, as the shared-memory collectives do to the same sleeper.
            let mut p = Producer::in_memory(mem.clone(), cap);
            let c = Consumer::in_memory(mem, cap);
            let (f1, w1) = (flag.clone(), wakes.clone());
            let ring_writer = loom::thread::spawn(move || {
                assert!(p.try_write(&[1u8; LINE], &[]));
                if must_wake_after_publish(&*f1, writer_fence) {
                    w1.fetch_add(1, Ordering::Relaxed);
                }
            });
            let other = (writers > 1).then(|| {
                let (f2, w2, pub2) = (flag.clone(), wakes.clone(), published.clone());
                loom::thread::spawn(move || {
                    pub2.store(true, Ordering::Release);
                    if must_wake_after_publish(&*f2, writer_fence) {
                        w2.fetch_add(1, Ordering::Relaxed);
                    }
                })
            });
            announce([&*flag], true, sleeper_fence);
            let found = c.has_record() || (writers > 1 && published.load(Ordering::Acquire));
            ring_writer.join().unwrap();
            if let Some(t) = other {
                t.join().unwrap();
            }
            let woken = wakes.load(Ordering::Relaxed);
            assert!(
                found || woken > 0,
                "the sleeper slept with work published and no wake-up"
            );
            assert!(woken <= 1, "one wake-up per sleep: {woken}");
        });
    }

    #[test]
    fn a_sleeping_reader_is_woken_once_by_its_ring_writer() {
        no_lost_wake_up(1, writer_fence, sleeper_fence);
    }

    #[test]
    fn two_writers_wake_a_sleeper_once() {
        no_lost_wake_up(2, writer_fence, sleeper_fence);
    }

    /// The mutations the models must catch: either fence left out loses a wake-up.
    #[test]
    #[should_panic(expected = "no wake-up")]
    fn without_the_writers_fence_a_wake_up_is_lost() {
        no_lost_wake_up(1, || {}, sleeper_fence);
    }

    #[test]
    #[should_panic(expected = "no wake-up")]
    fn without_the_sleepers_fence_a_wake_up_is_lost() {
        no_lost_wake_up(1, writer_fence, || {});
    }
}
