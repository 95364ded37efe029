//! Engine counters and introspection for tests, through `metampi-testkit` (feature
//! `test-counters`, which only that crate turns on). Not part of the API.

use std::sync::atomic::Ordering as AtomicOrdering;

/// Chunks of long shared-memory messages this rank has copied into their
/// receivers' buffers while it waited for those sends (the receiver asked
/// for help, see `docs/decisions/0012-cooperative-copy-of-long-shm-messages.md`); `None` where this rank does not
/// always copy cooperatively (no shared-memory peers, no cross-memory
/// attach, `METAMPI_NO_COOP`, or more processes than cores, where help is
/// asked only while few are awake). Call it after `initialize`.
pub fn chunks_helped() -> Option<u64> {
    let on = crate::environment::shared()
        .quick(|e| e.core.coop_min != usize::MAX && e.links.crowd.is_none());
    on.then(|| crate::engine::coop::HELPED.load(AtomicOrdering::Relaxed))
}

/// Blocking receives from a shared-memory peer that waited for their
/// message by watching the peer's ring and took it without being posted
/// (see `Shared::recv_spin`); `None` where this rank never waits that way
/// (more processes than cores on its machine). Call it after `initialize`.
pub fn spin_receives() -> Option<u64> {
    let on = !crate::environment::shared().oversubscribed();
    on.then(|| crate::engine::SPIN_RECEIVES.load(AtomicOrdering::Relaxed))
}

/// How often a thread of this rank asleep in a wait was woken by another thread, and how
/// many of those wake-ups found its wait not over (it slept again or took over polling).
/// Each thread asleep is woken for its own request, or to poll in place of one that left;
/// before, every progress any thread made woke them all.
pub fn thread_wake_ups() -> (u64, u64) {
    (
        crate::engine::WAKE_UPS.load(AtomicOrdering::Relaxed),
        crate::engine::IDLE_WAKE_UPS.load(AtomicOrdering::Relaxed),
    )
}

/// This rank's spin budget before sleeping, learnt from its sleeps (see
/// `docs/architecture.md`, "Waiting"): its base and its value now, how often
/// it grew, and how often the machine was too busy for it to. `None` where
/// the budget is fixed (`METAMPI_SPIN_US`) or does not learn
/// (`METAMPI_SPIN_LEARN=0`). Call it after `initialize`.
pub fn spin_budget() -> Option<(std::time::Duration, std::time::Duration, u64, u64)> {
    crate::environment::shared().spin_budget()
}

/// Wake-up datagrams this process has sent to shared-memory peers that
/// slept in their wait loops (at most one per sleep of each peer).
pub fn wake_ups_sent() -> u64 {
    crate::engine::links::WAKE_UPS.load(AtomicOrdering::Relaxed)
}

/// Progress passes of this process that looked at its TCP sockets (one
/// `poll` for all), and passes that skipped the look because the last ones
/// found nothing (see `docs/architecture.md`, "TCP sockets in a progress
/// pass").
pub fn socket_looks() -> (u64, u64) {
    (
        crate::engine::links::SOCKET_LOOKS.load(AtomicOrdering::Relaxed),
        crate::engine::links::SOCKET_SKIPS.load(AtomicOrdering::Relaxed),
    )
}

/// Payload bytes of long messages arriving on streams (TCP, router pipes)
/// that went through the staging buffer before reaching the receive buffer
/// (copied twice) instead of being read straight into it.
pub fn staged_payload_bytes() -> u64 {
    crate::engine::stream::STAGED_PAYLOAD.load(AtomicOrdering::Relaxed)
}

/// Blocking collectives other than barriers that `comm`'s shared-memory
/// region has served (`Algorithm::SharedMemory`); 0 before it has one. Call
/// it after `initialize`.
pub fn shared_memory_calls<C: crate::traits::Communicator>(comm: &C) -> u64 {
    crate::collective::shm::calls(&comm.as_handle().0)
}

/// Barriers `comm`'s shared-memory region has served, and how: `"flat"` (gathered at
/// member 0, where ranks outnumber cores) or `"dissemination"`; `None` before it has a
/// region. Call it after `initialize`.
pub fn shared_memory_barriers<C: crate::traits::Communicator>(
    comm: &C,
) -> Option<(u64, &'static str)> {
    crate::collective::shm::barriers(&comm.as_handle().0)
        .map(|(n, flat)| (n, if flat { "flat" } else { "dissemination" }))
}

/// The algorithm a collective `op` on `comm` moving `bytes` per rank runs
/// when it reaches the schedules (blocking calls small enough for the
/// shared-memory flags are served before that). Call it after `initialize`.
pub fn collective_algorithm<C: crate::traits::Communicator>(
    comm: &C,
    op: crate::collective::Collective,
    bytes: usize,
    commutative: bool,
) -> crate::collective::Algorithm {
    crate::collective::algorithm::choose(&comm.as_handle().0, op, bytes, commutative)
}

/// Whether this process reaches point-to-point rank `rank` of `comm` (for an
/// intercommunicator, of its remote group) through shared memory. Call it
/// after `initialize`.
pub fn reaches_over_shared_memory<C: crate::traits::Communicator>(comm: &C, rank: i32) -> bool {
    let Ok(w) = comm.as_handle().0.world_of(rank) else {
        return false;
    };
    crate::environment::shared().quick(|e| e.links.sleep_flag(w).is_some())
}
