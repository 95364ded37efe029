//! What this rank's program has sent and received, point-to-point and collective, over
//! every transport: messages and bytes, for the launcher's live view (`metampi run --web`,
//! carried in the answer to `REPORT`, see [`super::report::answer`]).
//!
//! Counted where every message of the engine passes, each once:
//! - sent: [`super::links::Links::post_send`] and a [`super::links::Links::try_send_now`]
//!   that took the message;
//! - received: when a receive matches the message and takes its bytes: a quick receive
//!   ([`super::Engine::recv_now`]: from the unexpected queue or straight from a ring), an
//!   eager message delivered to a posted or probed receive (`Core::deliver_eager`), one a
//!   stream reads straight into its receive (`Core::claim_eager`), a rendezvous whose data
//!   starts to move (`Core::start_rendezvous`). A message nobody receives is not counted;
//!   a receive that fails by truncation counts the bytes that arrived.
//!
//! Collective schedules send and receive through those paths, so their messages count as
//! any others. Collectives through a shared-memory region (`collective/shm.rs`) bypass the
//! engine: a member counts the bytes it publishes for the others as one message sent, and
//! the parts it reads as one message received from each member it reads.
//!
//! Cost: the engine's counts are written only by the thread that holds the engine's lock, so
//! an add is a relaxed load and a store (no atomic read-modify-write, whose `lock` prefix
//! would drain the store buffer on the path of every message); the report thread reads them
//! without the lock and may see a count a message old. The shared-memory collectives, which
//! run beside the lock, add atomically to counts of their own, once per call.

use std::sync::atomic::{AtomicU64, Ordering};

use metampi_launch::Traffic;

/// Messages and bytes in each direction, on a cache line of their own so that the counting
/// thread does not share it with anything another core writes.
#[repr(align(64))]
struct Counts {
    sent: AtomicU64,
    sent_bytes: AtomicU64,
    received: AtomicU64,
    received_bytes: AtomicU64,
}

impl Counts {
    const fn new() -> Counts {
        Counts {
            sent: AtomicU64::new(0),
            sent_bytes: AtomicU64::new(0),
            received: AtomicU64::new(0),
            received_bytes: AtomicU64::new(0),
        }
    }

    fn read(&self) -> Traffic {
        Traffic {
            sent: self.sent.load(Ordering::Relaxed),
            sent_bytes: self.sent_bytes.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            received_bytes: self.received_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Counted by the engine, under its lock.
static ENGINE: Counts = Counts::new();
/// Counted by collectives through shared-memory regions, atomically.
static REGIONS: Counts = Counts::new();

/// Adds `n` to a count whose writers all hold the engine's lock, which orders them: a load
/// and a store instead of an atomic add.
#[inline(always)]
fn add_held(count: &AtomicU64, n: u64) {
    count.store(
        count.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// The engine took a message of `bytes` to send. The caller holds the engine's lock (it has
/// the engine's `Links` or `Core` mutably).
#[inline(always)]
pub(crate) fn sent(bytes: usize) {
    add_held(&ENGINE.sent, 1);
    add_held(&ENGINE.sent_bytes, bytes as u64);
}

/// A receive took a message of `bytes`. The caller holds the engine's lock, as for [`sent`].
#[inline(always)]
pub(crate) fn received(bytes: usize) {
    add_held(&ENGINE.received, 1);
    add_held(&ENGINE.received_bytes, bytes as u64);
}

/// A collective through a shared-memory region published `sent` bytes for the others (one
/// message, if any) and read `received` bytes from `from` members.
pub(crate) fn through_region(sent: usize, from: usize, received: usize) {
    if sent > 0 {
        REGIONS.sent.fetch_add(1, Ordering::Relaxed);
        REGIONS.sent_bytes.fetch_add(sent as u64, Ordering::Relaxed);
    }
    if from > 0 {
        REGIONS.received.fetch_add(from as u64, Ordering::Relaxed);
        REGIONS
            .received_bytes
            .fetch_add(received as u64, Ordering::Relaxed);
    }
}

/// Everything counted so far.
pub(crate) fn total() -> Traffic {
    let (e, r) = (ENGINE.read(), REGIONS.read());
    Traffic {
        sent: e.sent + r.sent,
        sent_bytes: e.sent_bytes + r.sent_bytes,
        received: e.received + r.received,
        received_bytes: e.received_bytes + r.received_bytes,
    }
}
