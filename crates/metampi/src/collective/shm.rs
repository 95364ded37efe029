//! Barrier and small broadcast, reduce, all-reduce, gather and all-gather
//! through flags in shared memory, for communicators whose members all share
//! this machine's memory (ScaMPI's remote-write / local-read rule: every
//! cache line has one writer).
//!
//! Messages through the rings cost two cache-line transfers each (the ring's
//! tail and the record) plus the matching of the point-to-point engine; a
//! flag costs one. So a communicator that is used for blocking barriers or
//! all-reduces a few times gets a region of its own in `/dev/shm`:
//!
//! - one block per member, written only by that member: a line of barrier
//!   round counters, then [`SLOTS`] slots, one per call in turn;
//! - barrier: dissemination over the counters; in round k a member raises
//!   its counter k to the barrier's epoch and waits for that of the member
//!   2^k below it. Where ranks outnumber cores, flat instead: every member
//!   raises its counter 0 and waits for member 0's counter 1, which member 0
//!   raises once it has seen them all;
//! - all-reduce up to [`MAX_BYTES`]: each member writes its vector and the
//!   epoch into its slot, then reads every slot and folds them in rank order
//!   itself, so non-commutative operations keep MPI's order and every member
//!   gets the same bits. A slot is rewritten [`SLOTS`] calls later, once
//!   every member has provably finished reading it (it published a later
//!   call).
//! - the same exchange serves the others up to [`MAX_BYTES`] per member:
//!   reduce (only the root folds), gather and all-gather (the root, or every
//!   member, copies the slots in rank order), all-to-all (every member
//!   publishes its whole send buffer and takes its block of each slot),
//!   broadcast (the root publishes its buffer, the others an empty slot),
//!   scatter (the same with the root's whole send buffer, of which each
//!   member takes its block). Every member takes part in every call, but
//!   waits only for the slots it reads: the root of a broadcast or scatter
//!   for none, the others for the root's; a member that only contributes to
//!   a reduce or gather for none. So a root leaves as soon as it has
//!   published, as on the schedules, and runs up to [`SLOTS`] - 1 calls
//!   ahead of the slowest member. The reuse rule is kept where a slot is
//!   rewritten: a member first waits until every other has published the
//!   call after the one the slot held (known without looking after a call
//!   that waited for all).
//!
//! Waiting goes through the engine's wait loop, so point-to-point traffic
//! keeps moving and a member that waits long sleeps; a writer nudges a
//! sleeping reader with the engine's wake-up datagram. The region is set up
//! collectively (through ordinary schedules) on the [`SETUP_AFTER`]th
//! eligible call, and only for blocking calls: `immediate_*` forms and
//! forced algorithms other than `shared_memory` keep the schedules.

use std::cell::{Ref, RefCell};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::algorithm::{forced_algorithm, Algorithm, Collective};
use super::bracket::{self, Plan};
use super::op::Operation;
use super::schedule::run;
use super::SystemOperation;
use crate::datatype::{pack, type_map, Buffer, BufferMut, RecvLayout, UncommittedDatatype};
use crate::engine::report::{in_call, Call};
use crate::engine::traffic;
use crate::environment::shared;
use crate::error::{Error, ErrorClass};
use crate::sys::shm::Segment;
use crate::topology::CommInner;

const LINE: usize = 64;
/// Largest contribution per member, in bytes, that goes through the slots.
/// At 1 KiB the 2-8 KiB calls took the schedules and ran 1.5-3x slower; a
/// member's block is then 16 KiB of the region.
pub(crate) const MAX_BYTES: usize = 8192;
/// Slot header: the epoch (u64) and the length (u64).
const SLOT_HDR: usize = 16;
const SLOT: usize = (SLOT_HDR + MAX_BYTES).div_ceil(LINE) * LINE;
/// Slots per member, used in turn: a member runs up to this many calls less
/// one ahead of the slowest. With 2 (every other call), ranks that
/// outnumber the cores waited to be scheduled in step: 4 ranks on 2 cores,
/// 8-byte broadcast 6-10 µs, against 0.7 on the schedules, whose root runs
/// ahead as far as the rings hold; with 8, 0.2-0.3 (4: 0.25-0.45, 16 as 8).
const SLOTS: usize = 8;
/// Bytes of all members' vectors a reduce's root folds here at most where
/// ranks outnumber cores.
const OVERSUBSCRIBED_FOLD_MAX: usize = 16 << 10;
/// Barrier round counters per member (one line): up to 2^8 members.
const ROUNDS: usize = LINE / 8;
const MAX_MEMBERS: usize = 1 << ROUNDS;
/// Bytes per member: the counter line and the slots.
const BLOCK: usize = LINE + SLOTS * SLOT;
/// Blocking calls that run on schedules before a communicator gets a
/// region: one that is used once or twice is not worth a file and two
/// extra collectives.
const SETUP_AFTER: u32 = 3;

/// A communicator's shared-memory state.
#[derive(Default)]
pub(crate) enum State {
    /// Eligibility not checked yet.
    #[default]
    Unknown,
    /// Not all members share memory, or the region could not be made.
    Off,
    /// Eligible; this many calls so far.
    Counting(u32),
    On(Region),
}

pub(crate) struct Region {
    seg: Segment,
    n: usize,
    me: usize,
    barrier_epoch: u64,
    reduce_epoch: u64,
    /// Every member has been seen to publish this call (or a later one).
    settled: u64,
    /// Calls other than barriers served here (for tests).
    calls: u64,
    /// World rank of every member.
    world: Vec<u32>,
    /// Each member's sleep flag (null for this process).
    sleep: Vec<*const AtomicU32>,
    /// Barriers gather at member 0 and are released by it ([`Region::barrier_flat`]).
    flat_barrier: bool,
    /// Combining orders, made on first use: reduce's for each root with a
    /// commutative operation, then the one from rank 0 that every
    /// non-commutative reduce shares, then all-reduce's ([`Region::plan`]).
    plans: RefCell<Vec<Option<Plan>>>,
}

/// Whose parts of a call a member waits for once it has published its own.
#[derive(Clone, Copy)]
enum Await {
    /// Every member's (it reads them all).
    All,
    /// The root's (it reads only that).
    One(usize),
    /// None (it reads nothing: a root that only gives, a member that only
    /// contributes).
    Nothing,
}

// SAFETY: the pointers address shared mappings that live as long as the
// process's engine (its segments are never unmapped while ranks run); a
// region is only used under its communicator's lock.
unsafe impl Send for Region {}

impl Region {
    fn block(&self, member: usize) -> *mut u8 {
        // SAFETY: the segment holds `n` blocks and `member < n`.
        unsafe { self.seg.base().add(member * BLOCK) }
    }

    fn counter(&self, member: usize, round: usize) -> &AtomicU64 {
        debug_assert!(round < ROUNDS);
        // SAFETY: 8-byte aligned word inside the member's counter line
        // (blocks are line-aligned), living as long as the segment.
        unsafe { &*(self.block(member) as *const AtomicU64).add(round) }
    }

    fn slot(&self, member: usize, turn: usize) -> *mut u8 {
        // SAFETY: slot `turn` (below `SLOTS`) lies inside the member's block.
        unsafe { self.block(member).add(LINE + turn * SLOT) }
    }

    fn slot_epoch(&self, member: usize, turn: usize) -> &AtomicU64 {
        // SAFETY: the slot starts line-aligned with its epoch word.
        unsafe { &*(self.slot(member, turn) as *const AtomicU64) }
    }

    /// Wakes member `m` if it sleeps in the engine's wait loop. The caller
    /// has just published with a SeqCst fence, so either `m` sees the flag
    /// before sleeping or we see its sleep flag here (Dekker).
    fn nudge(&self, m: usize) {
        let p = self.sleep[m];
        // SAFETY: `p` is a peer's sleep word in a live mapping (see `Region`).
        if !p.is_null() && unsafe { (*p).load(Ordering::SeqCst) } != 0 {
            let w = self.world[m];
            shared().quick(|e| e.links.wake_peer(w));
        }
    }

    fn barrier(&mut self) {
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        if self.flat_barrier {
            self.barrier_flat(epoch);
            return;
        }
        let (n, me) = (self.n, self.me);
        let (mut k, mut round) = (1, 0);
        while k < n {
            self.counter(me, round).store(epoch, Ordering::Release);
            crate::sys::publish_fence();
            self.nudge((me + k) % n);
            let from = self.counter((me + n - k) % n, round);
            wait_for(|| from.load(Ordering::Acquire) >= epoch);
            k <<= 1;
            round += 1;
        }
    }

    /// The barrier where ranks outnumber cores ([`flat_barriers`]): every member raises
    /// its arrival counter (round 0) and waits for member 0's release counter (round 1);
    /// member 0 waits for every arrival, then releases. Each counter keeps one writer.
    fn barrier_flat(&mut self, epoch: u64) {
        let n = self.n;
        if self.me == 0 {
            for m in 1..n {
                let c = self.counter(m, 0);
                wait_for(|| c.load(Ordering::Acquire) >= epoch);
            }
            self.counter(0, 1).store(epoch, Ordering::Release);
            crate::sys::publish_fence();
            for m in 1..n {
                self.nudge(m);
            }
        } else {
            self.counter(self.me, 0).store(epoch, Ordering::Release);
            crate::sys::publish_fence();
            self.nudge(0);
            let r = self.counter(0, 1);
            wait_for(|| r.load(Ordering::Acquire) >= epoch);
        }
    }

    /// Publishes `mine` as this member's part of the next call, then waits
    /// for the parts `wait` names; returns the slot to read them from.
    /// `own`: the bytes of `mine` that no other member reads, which stay out
    /// of the slot (this member takes them from `mine`: [`Region::part_or`]).
    fn exchange(&mut self, mine: &[u8], own: Range<usize>, wait: Await) -> usize {
        debug_assert!(mine.len() <= MAX_BYTES);
        self.reduce_epoch += 1;
        let epoch = self.reduce_epoch;
        let turn = (epoch % SLOTS as u64) as usize;
        // Our slot for this call holds call `epoch - SLOTS`: every member
        // must be done reading it, which it shows by having published the
        // call after it. Known without looking after a call that waited for
        // all.
        if self.settled + (SLOTS as u64 - 1) < epoch {
            self.wait_all(epoch + 1 - SLOTS as u64);
        }
        let slot = self.slot(self.me, turn);
        let start = own.start.min(mine.len());
        let own = start..own.end.clamp(start, mine.len());
        // SAFETY: our own slot has one writer (us), and no member reads this
        // slot until we publish the new epoch below; both copies stay inside
        // `mine` and the slot (`mine` is at most `MAX_BYTES`).
        unsafe {
            let data = slot.add(SLOT_HDR);
            crate::sys::copy::copy_raw(mine.as_ptr(), data, own.start);
            crate::sys::copy::copy_raw(
                mine.as_ptr().add(own.end),
                data.add(own.end),
                mine.len() - own.end,
            );
            (*(slot.add(8) as *const AtomicU64)).store(mine.len() as u64, Ordering::Relaxed);
        }
        self.slot_epoch(self.me, turn)
            .store(epoch, Ordering::Release);
        crate::sys::publish_fence();
        traffic::through_region(mine.len() - own.len(), 0, 0);
        for m in (0..self.n).filter(|&m| m != self.me) {
            self.nudge(m);
        }
        match wait {
            Await::All => self.wait_all(epoch),
            Await::One(m) if m != self.me => {
                let e = self.slot_epoch(m, turn);
                wait_for(|| e.load(Ordering::Acquire) >= epoch);
            }
            _ => {}
        }
        turn
    }

    /// Waits until every member has published call `epoch`.
    fn wait_all(&mut self, epoch: u64) {
        let turn = (epoch % SLOTS as u64) as usize;
        let mut next = 0;
        wait_for(|| {
            while next < self.n {
                if next != self.me && self.slot_epoch(next, turn).load(Ordering::Acquire) < epoch {
                    return false;
                }
                next += 1;
            }
            true
        });
        self.settled = epoch;
    }

    /// Member `m`'s vector of the current call, this member's own being
    /// `mine` (its slot may lack some of it: see [`Region::exchange`]).
    /// The combining order of the schedule this region stands in for: the
    /// binomial tree to `root` for reduce, recursive doubling for all-reduce.
    fn plan(&self, root: Option<usize>, commutative: bool) -> Ref<'_, Plan> {
        let n = self.n;
        let at = match root {
            Some(root) if commutative => root,
            Some(_) => n,
            None => n + 1,
        };
        if self.plans.borrow()[at].is_none() {
            self.plans.borrow_mut()[at] = Some(match root {
                Some(root) => bracket::binomial(n, root, commutative),
                None => bracket::doubling(n),
            });
        }
        Ref::map(self.plans.borrow(), |p| p[at].as_ref().expect("made above"))
    }

    fn part_or<'a>(&'a self, m: usize, turn: usize, mine: &'a [u8]) -> &'a [u8] {
        if m == self.me {
            mine
        } else {
            self.part(m, turn)
        }
    }

    /// Member `m`'s vector of the current call (after [`Region::exchange`]).
    fn part(&self, m: usize, turn: usize) -> &[u8] {
        let s = self.slot(m, turn);
        // SAFETY: the slot was published for this call (Acquire in
        // `exchange`) and is not rewritten before every member, us included,
        // has finished it; the length is clamped to the slot.
        unsafe {
            let len = (*(s.add(8) as *const AtomicU64)).load(Ordering::Relaxed) as usize;
            std::slice::from_raw_parts(s.add(SLOT_HDR), len.min(MAX_BYTES))
        }
    }
}

/// Waits through the engine's loop (progress, spin, then sleep) until `ready`.
fn wait_for(mut ready: impl FnMut() -> bool) {
    let sh = shared();
    // A short pure spin first: the peer is usually a few hundred nanoseconds
    // behind, and the engine's pass costs more than a flag load. Not when
    // ranks outnumber cores: then the peer may need this core to get there.
    if !sh.oversubscribed() {
        for _ in 0..64 {
            if ready() {
                return;
            }
            std::hint::spin_loop();
        }
    }
    sh.wait_until(|_| ready().then_some(()));
}

#[cfg(feature = "test-counters")]
/// Blocking calls other than barriers that `comm`'s region has served.
pub(crate) fn calls(comm: &CommInner) -> u64 {
    match &*comm.shm.lock().unwrap_or_else(|p| p.into_inner()) {
        State::On(r) => r.calls,
        _ => 0,
    }
}

#[cfg(feature = "test-counters")]
/// Barriers `comm`'s region has served and whether they were flat; `None` before it has
/// a region (for tests).
pub(crate) fn barriers(comm: &CommInner) -> Option<(u64, bool)> {
    match &*comm.shm.lock().unwrap_or_else(|p| p.into_inner()) {
        State::On(r) => Some((r.barrier_epoch, r.flat_barrier)),
        _ => None,
    }
}

/// Whether the blocking `op` may run here: nothing else forced for it.
fn allowed(op: Collective) -> bool {
    matches!(forced_algorithm(op), None | Some(Algorithm::SharedMemory))
}

/// The region of `comm`, set up on the eligible call that reaches
/// [`SETUP_AFTER`]; `None` while calls should take the schedules.
fn region<'s>(
    comm: &CommInner,
    op: Collective,
    st: &'s mut State,
) -> Result<Option<&'s mut Region>, Error> {
    if let State::Unknown = st {
        *st = if eligible(comm) {
            State::Counting(0)
        } else {
            State::Off
        };
    }
    if let State::Counting(c) = st {
        *c += 1;
        // Forced, it serves the first call already (tests and benchmarks).
        let after = if forced_algorithm(op) == Some(Algorithm::SharedMemory) {
            1
        } else {
            SETUP_AFTER
        };
        if *c < after {
            return Ok(None);
        }
        *st = match setup(comm)? {
            Some(r) => State::On(r),
            None => State::Off,
        };
    }
    Ok(match st {
        State::On(r) => Some(r),
        _ => None,
    })
}

/// Whether a new region's barriers are flat: where ranks outnumber cores, unless
/// `METAMPI_SHM_BARRIER` names `dissemination` (or `flat`, to have them anyway).
///
/// Dissemination makes every member wait once per round, each time for one given
/// member to have run; where ranks share cores the scheduler often runs another, and the
/// rounds add up. Flat, every member waits once and member 0 once per member, with
/// whoever runs making progress (alternating runs of `metampi bench --ops barrier` on 2
/// cores, medians: 3 ranks 5.9 -> 5.2 µs, 4 ranks 8.6 -> 7.5, 8 ranks 26.9 -> 14.3,
/// 16 ranks 108 -> 58). With a core per rank the rounds run side by side and
/// dissemination's log2(n) steps beat member 0 reading n lines in turn.
fn flat_barriers(oversubscribed: bool) -> bool {
    match crate::knobs::text("METAMPI_SHM_BARRIER").as_deref() {
        Some("flat") => true,
        Some("dissemination") => false,
        _ => oversubscribed,
    }
}

/// Every member shares memory with this process (the same test on every
/// member: they all see the same machine).
fn eligible(comm: &CommInner) -> bool {
    let n = comm.ranks.len();
    // Members of two worlds (a spawn) would name the region after
    // different jobs.
    if !(2..=MAX_MEMBERS).contains(&n)
        || comm.is_inter()
        || comm.mixed
        || crate::knobs::flag("METAMPI_NO_SHM_COLL", false)
    {
        return false;
    }
    let sh = shared();
    let me = sh.info.rank;
    sh.quick(|e| {
        comm.ranks
            .iter()
            .all(|&w| w == me || e.links.sleep_flag(w).is_some())
    })
}

/// Makes the region: the lowest member creates the file, the others map it,
/// and all agree that everyone did before it is used (or nobody uses it).
fn setup(comm: &CommInner) -> Result<Option<Region>, Error> {
    let sh = shared();
    let n = comm.ranks.len();
    let leader = comm.ranks[0];
    let path =
        crate::sys::shm::dir().join(format!("metampi-{}-c{}-r{leader}", sh.info.job, comm.ctx));
    let mut seg = None;
    let mut ok = 0u8;
    if comm.rank == 0 {
        let _ = std::fs::remove_file(&path);
        seg = Segment::create(&path, n * BLOCK).ok();
        // 0: no region; 1: barriers by dissemination; 2: flat (member 0 decides, so
        // every member runs the same one).
        ok = if seg.is_none() {
            0
        } else if flat_barriers(sh.oversubscribed()) {
            2
        } else {
            1
        };
    }
    run(super::plan_bcast(comm, 0, &mut ok))?;
    if comm.rank != 0 && ok != 0 {
        seg = Segment::open(&path, n * BLOCK).ok();
    }
    let mine = u8::from(seg.is_some());
    let mut all = 0u8;
    run(super::plan_all_reduce(
        comm,
        &mine,
        &mut all,
        SystemOperation::min(),
    ))?;
    if comm.rank == 0 {
        let _ = std::fs::remove_file(&path);
    }
    let Some(seg) = seg.filter(|_| all == 1) else {
        return Ok(None);
    };
    let me = sh.info.rank;
    let sleep = sh.quick(|e| {
        comm.ranks
            .iter()
            .map(|&w| {
                (w != me)
                    .then(|| e.links.sleep_flag(w))
                    .flatten()
                    .unwrap_or(std::ptr::null())
            })
            .collect()
    });
    Ok(Some(Region {
        seg,
        n,
        me: comm.rank as usize,
        barrier_epoch: 0,
        reduce_epoch: 0,
        settled: 0,
        calls: 0,
        world: comm.ranks.to_vec(),
        sleep,
        flat_barrier: ok == 2,
        plans: RefCell::new(vec![None; n + 2]),
    }))
}

/// A blocking barrier through the region, or `None` where the schedules run it.
pub(crate) fn barrier(comm: &CommInner) -> Option<Result<(), Error>> {
    if !allowed(Collective::Barrier) {
        return None;
    }
    let mut st = comm.shm.lock().unwrap_or_else(|p| p.into_inner());
    match region(comm, Collective::Barrier, &mut st) {
        Err(e) => Some(Err(e)),
        Ok(None) => None,
        Ok(Some(r)) => {
            let _call = in_call(Call::Collective {
                name: "barrier",
                ctx: comm.ctx | 1,
            });
            let t = crate::trace::start();
            r.barrier();
            record(t, "barrier", -1, 0, comm);
            Some(Ok(()))
        }
    }
}

/// Runs `body` on `comm`'s region for blocking `op` with `bytes` per
/// member's slot, traced as `name` with `root` (-1: none); `None` where the
/// schedules run it (too large, another algorithm forced, not set up yet or
/// not possible).
fn on_region<T>(
    comm: &CommInner,
    op: Collective,
    (name, root): (&'static str, i32),
    bytes: usize,
    body: impl FnOnce(&mut Region) -> Result<T, Error>,
) -> Option<Result<T, Error>> {
    if bytes > MAX_BYTES || !allowed(op) {
        return None;
    }
    // Where ranks outnumber cores, the root of a reduce folds every
    // member's vector itself while the schedules share that out along a
    // tree: past 16 KiB in all, the tree won (8 ranks on 2 cores, 4 KiB
    // each: 16 µs here, 2-3.5 on the schedules).
    if op == Collective::Reduce
        && shared().oversubscribed()
        && forced_algorithm(op).is_none()
        && bytes * comm.ranks.len() > OVERSUBSCRIBED_FOLD_MAX
    {
        return None;
    }
    let mut st = comm.shm.lock().unwrap_or_else(|p| p.into_inner());
    match region(comm, op, &mut st) {
        Err(e) => Some(Err(e)),
        Ok(None) => None,
        Ok(Some(r)) => {
            let _call = in_call(Call::Collective {
                name,
                ctx: comm.ctx | 1,
            });
            let t = crate::trace::start();
            let result = body(r);
            record(t, name, root, bytes, comm);
            r.calls += 1;
            Some(result)
        }
    }
}

fn record(t: Option<u64>, name: &'static str, root: i32, bytes: usize, comm: &CommInner) {
    crate::trace::record(
        t,
        crate::trace::Kind::Collective,
        name,
        root,
        0,
        bytes,
        comm.ctx + 1,
    );
}

fn count_error(what: String) -> Error {
    Error::new(ErrorClass::Count, what)
}

/// Every member's slot of this call holds `len` bytes; else the first that
/// does not, as a `Count` error.
fn same_lengths(r: &Region, turn: usize, len: usize, what: &str) -> Result<(), Error> {
    match (0..r.n).find(|&m| r.part(m, turn).len() != len) {
        None => Ok(()),
        Some(m) => Err(count_error(format!(
            "{what} differ: {len} bytes here, {} bytes at rank {m}",
            r.part(m, turn).len()
        ))),
    }
}

thread_local! {
    /// Running values of the members' vectors while a fold combines them.
    static FOLD_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Combines every member's slot into `acc` in the order of `plan` (the
/// schedule this region stands in for), so a result has the same bits
/// whichever path computed it. A slot is read in place until a step first
/// writes that member's running value; those live in a per-thread scratch.
#[allow(clippy::too_many_arguments)]
fn fold<O: Operation>(
    r: &Region,
    turn: usize,
    mine: &[u8],
    op: &O,
    prim: Option<crate::datatype::Prim>,
    dt: u32,
    plan: &Plan,
    acc: &mut [u8],
) -> Result<(), Error> {
    let len = acc.len();
    // The last step's result goes straight into `acc`; a plan of one step (two
    // members) needs no scratch at all.
    let Some((&(a, b), rest)) = plan.steps.split_last() else {
        crate::sys::copy::copy(acc, r.part_or(plan.result, turn, mine));
        return Ok(());
    };
    debug_assert_eq!(b, plan.result, "a plan ends in its result");
    // Members whose running value is in the scratch (at most 256 members).
    let mut held = [0u64; MAX_MEMBERS / 64];
    let is_held = |held: &[u64], m: usize| held[m / 64] >> (m % 64) & 1 == 1;
    let finish = |scratch: &[u8], held: &[u64], acc: &mut [u8]| {
        let value = |m: usize| {
            if is_held(held, m) {
                &scratch[m * len..(m + 1) * len]
            } else {
                r.part_or(m, turn, mine)
            }
        };
        crate::sys::copy::copy(acc, value(b));
        op.apply(value(a), acc, prim, dt)
    };
    if rest.is_empty() {
        return finish(&[], &held, acc);
    }
    FOLD_SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        if scratch.len() < r.n * len {
            scratch.resize(r.n * len, 0);
        }
        for &(a, b) in rest {
            if !is_held(&held, b) {
                crate::sys::copy::copy(
                    &mut scratch[b * len..(b + 1) * len],
                    r.part_or(b, turn, mine),
                );
                held[b / 64] |= 1 << (b % 64);
            }
            if is_held(&held, a) {
                let (lo, hi) = scratch.split_at_mut(a.max(b) * len);
                let (lower, upper) = if a < b {
                    (&lo[a * len..(a + 1) * len], &mut hi[..len])
                } else {
                    (&hi[..len], &mut lo[b * len..(b + 1) * len])
                };
                op.apply(lower, upper, prim, dt)?;
            } else {
                op.apply(
                    r.part_or(a, turn, mine),
                    &mut scratch[b * len..(b + 1) * len],
                    prim,
                    dt,
                )?;
            }
        }
        finish(&scratch, &held, acc)
    })
}

/// Hands `data` (signature bytes) to the user's buffer behind `layout`:
/// straight into it when dense, else through `fill` on a staging vector and
/// an unpack.
fn deliver(
    layout: &mut RecvLayout<'_>,
    fill: impl FnOnce(&mut [u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    match layout.dense() {
        Some(d) => fill(d),
        None => {
            let mut staged = vec![0u8; layout.capacity()];
            fill(&mut staged)?;
            layout.unpack(&staged);
            Ok(())
        }
    }
}

/// What a member does in a call where every member publishes its send buffer.
#[derive(Clone, Copy)]
enum Part {
    /// Reads every slot; nobody reads its own (the root of a reduce or gather).
    Root,
    /// Reads nothing (the other members of a reduce or gather).
    Contributor,
    /// Reads every slot, and every member reads its (all-reduce, all-gather).
    Everyone,
    /// Reads block `me` of every slot; its own block `me` nobody else reads.
    AllToAll,
}

impl Part {
    /// The part of a member of a reduce or gather (`root`: not the all- form)
    /// that has a receive buffer or not.
    fn of(root: Option<u32>, receives: bool) -> Part {
        match (root, receives) {
            (None, _) => Part::Everyone,
            (Some(_), true) => Part::Root,
            (Some(_), false) => Part::Contributor,
        }
    }
}

/// The common part of the collectives whose members each publish `send`:
/// `None` where the schedules run `op`; else `body` gets the region, the
/// call's slot (`None` for an empty call that waited for nobody: no slot
/// may be read) and this member's bytes, after the members it reads
/// published, and the call is traced as `name`.
fn publish_send<S, T>(
    comm: &CommInner,
    op: Collective,
    send: &S,
    name: &'static str,
    root: Option<u32>,
    part: Part,
    body: impl FnOnce(&Region, Option<usize>, &[u8]) -> Result<T, Error>,
) -> Option<Result<T, Error>>
where
    S: Buffer + ?Sized,
{
    let es = type_map(send.as_datatype().type_id()).size;
    let bytes = usize::try_from(send.count()).unwrap_or(0) * es;
    let traced = (name, root.map_or(-1, |r| r as i32));
    on_region(comm, op, traced, bytes, |r| {
        let packed = pack(send);
        let mine = packed.bytes();
        let (me, len) = (r.me, mine.len());
        let turn = match part {
            Part::Root => r.exchange(mine, 0..len, Await::All),
            Part::Contributor => r.exchange(mine, 0..0, Await::Nothing),
            // Nothing to receive: nothing to wait for (as in MPICH and Open
            // MPI, whose empty calls return at once). A member that does
            // expect bytes still waits, and reports a `Count` mismatch.
            Part::Everyone | Part::AllToAll if len == 0 => {
                r.exchange(mine, 0..0, Await::Nothing);
                return body(r, None, mine);
            }
            Part::Everyone => r.exchange(mine, 0..0, Await::All),
            Part::AllToAll => {
                let bs = len / r.n;
                r.exchange(mine, me * bs..(me + 1) * bs, Await::All)
            }
        };
        let others = r.n - 1;
        match part {
            Part::Root | Part::Everyone => traffic::through_region(0, others, others * len),
            Part::AllToAll => traffic::through_region(0, others, others * (len / r.n)),
            Part::Contributor => {}
        }
        body(r, Some(turn), mine)
    })
}

/// A blocking reduce (`root`; `recv` is the root's buffer) or all-reduce (no
/// root) of at most [`MAX_BYTES`] per member through the region: every member
/// publishes its vector, and whoever has `recv` folds them all. `None` (with
/// `op` handed back) where the schedules run it.
pub(crate) fn reduce<S, R, O>(
    comm: &CommInner,
    root: Option<u32>,
    send: &S,
    recv: Option<&mut R>,
    op: O,
) -> Result<Result<(), Error>, O>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    let (kind, name, what) = match root {
        Some(_) => (Collective::Reduce, "reduce", "reduce vectors"),
        None => (Collective::AllReduce, "allreduce", "all-reduce vectors"),
    };
    let dt = send.as_datatype().type_id();
    let prim = type_map(dt).prim;
    let part = Part::of(root, recv.is_some());
    let result = publish_send(comm, kind, send, name, root, part, |r, turn, mine| {
        op.check(prim, dt)?;
        let Some(recv) = recv else {
            return Ok(());
        };
        let mut layout = RecvLayout::of(recv);
        let cap = layout.capacity();
        if let Some(turn) = turn {
            same_lengths(r, turn, mine.len(), what)?;
        }
        if cap != mine.len() {
            return Err(count_error(format!(
                "a contribution of {} bytes does not match a block of {cap} bytes",
                mine.len()
            )));
        }
        let Some(turn) = turn else {
            return Ok(());
        };
        let plan = r.plan(root.map(|x| x as usize), op.is_commutative());
        deliver(&mut layout, |acc| {
            fold(r, turn, mine, &op, prim, dt, &plan, acc)
        })
    });
    result.ok_or(op)
}

/// A blocking broadcast of at most [`MAX_BYTES`] through the region (the
/// root publishes its buffer, the others an empty slot), or `None`.
pub(crate) fn bcast<B: BufferMut + ?Sized>(
    comm: &CommInner,
    root: u32,
    buf: &mut B,
) -> Option<Result<(), Error>> {
    let mut layout = RecvLayout::of(buf);
    let bytes = layout.capacity();
    let traced = ("bcast", root as i32);
    let root = root as usize;
    on_region(comm, Collective::Broadcast, traced, bytes, |r| {
        if r.me == root {
            match layout.dense() {
                Some(d) => r.exchange(d, 0..0, Await::Nothing),
                None => r.exchange(&layout.pack(), 0..0, Await::Nothing),
            };
            Ok(())
        } else {
            let turn = r.exchange(&[], 0..0, Await::One(root));
            let data = r.part(root, turn);
            traffic::through_region(0, 1, data.len());
            match data.len() == bytes {
                true => deliver(&mut layout, |d| {
                    crate::sys::copy::copy(d, data);
                    Ok(())
                }),
                false => Err(count_error(format!(
                    "a broadcast of {} bytes does not match a buffer of {bytes} bytes",
                    data.len()
                ))),
            }
        }
    })
}

/// A blocking scatter whose send buffer (`send`, the root's) is at most
/// [`MAX_BYTES`] through the region: the root publishes it whole, the others
/// an empty slot, and each member copies its block out of the root's slot.
/// `None` where the schedules run it. Every member must size the call alike
/// (the root by its send buffer, the others by `size` times their receive
/// buffer), as they do when the counts agree.
pub(crate) fn scatter<S, R>(
    comm: &CommInner,
    root: u32,
    send: Option<&S>,
    recv: &mut R,
) -> Option<Result<(), Error>>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
{
    let mut layout = RecvLayout::of(recv);
    let bs = layout.capacity();
    let n = comm.ranks.len();
    let (bytes, es) = match send {
        Some(s) => {
            let es = type_map(s.as_datatype().type_id()).size;
            (usize::try_from(s.count()).unwrap_or(0) * es, es)
        }
        None => (bs.saturating_mul(n), 0),
    };
    let traced = ("scatter", root as i32);
    let root = root as usize;
    on_region(comm, Collective::Scatter, traced, bytes, |r| {
        let me = r.me;
        let packed = send.map(|s| pack(s));
        let mine = packed.as_ref().map_or(&[][..], |p| p.bytes());
        let turn = match send {
            // Nobody else reads the root's own block.
            Some(_) => r.exchange(mine, me * bs..(me + 1) * bs, Await::Nothing),
            None => {
                let turn = r.exchange(&[], 0..0, Await::One(root));
                traffic::through_region(0, 1, bs);
                turn
            }
        };
        let all = r.part_or(root, turn, mine);
        let elems = all.len().checked_div(es).unwrap_or(0);
        if me == root && elems % n != 0 {
            Err(count_error(format!(
                "the scatter send buffer of {elems} elements does not split into {n} equal blocks"
            )))
        } else if all.len() != bs * n {
            Err(count_error(format!(
                "a scatter block of {} bytes does not fit a receive buffer of {bs} bytes",
                all.len() / n
            )))
        } else {
            deliver(&mut layout, |d| {
                crate::sys::copy::copy(d, &all[me * bs..(me + 1) * bs]);
                Ok(())
            })
        }
    })
}

/// A blocking gather (`recv` at the root) or all-gather (`recv` everywhere,
/// `all`) of at most [`MAX_BYTES`] per member through the region, or `None`.
pub(crate) fn gather<S, R>(
    comm: &CommInner,
    root: Option<u32>,
    send: &S,
    recv: Option<&mut R>,
) -> Option<Result<(), Error>>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
{
    let (op, name) = match root {
        Some(_) => (Collective::Gather, "gather"),
        None => (Collective::AllGather, "allgather"),
    };
    let part = Part::of(root, recv.is_some());
    publish_send(comm, op, send, name, root, part, |r, turn, mine| {
        let Some(recv) = recv else {
            return Ok(());
        };
        let mut layout = RecvLayout::of(recv);
        let (cap, len, n) = (layout.capacity(), mine.len(), r.n);
        if let Some(turn) = turn {
            same_lengths(r, turn, len, "gathered blocks")?;
        }
        if cap != n * len {
            return Err(count_error(format!(
                "a receive buffer of {cap} bytes does not hold {n} blocks of {len} bytes"
            )));
        }
        let Some(turn) = turn else {
            return Ok(());
        };
        deliver(&mut layout, |all| {
            for (m, block) in all.chunks_exact_mut(len.max(1)).take(n).enumerate() {
                crate::sys::copy::copy(block, r.part_or(m, turn, mine));
            }
            Ok(())
        })
    })
}

/// A blocking all-to-all whose send buffer is at most [`MAX_BYTES`] through
/// the region: every member publishes its whole send buffer and takes block
/// `me` of every slot. Not rooted, so it serves oversubscribed machines too.
/// `None` where the schedules run it.
pub(crate) fn all_to_all<S, R>(
    comm: &CommInner,
    send: &S,
    recv: &mut R,
) -> Option<Result<(), Error>>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
{
    let es = type_map(send.as_datatype().type_id()).size;
    publish_send(
        comm,
        Collective::AllToAll,
        send,
        "alltoall",
        None,
        Part::AllToAll,
        |r, turn, mine| {
            let (n, me, len) = (r.n, r.me, mine.len());
            let bs = len / n;
            let mut layout = RecvLayout::of(recv);
            let cap = layout.capacity();
            if len % n != 0 || (es > 0 && bs % es != 0) {
                return Err(count_error(format!(
                "the all-to-all send buffer of {len} bytes does not split into {n} blocks of whole elements"
            )));
            }
            if cap != len {
                return Err(count_error(format!(
                "an all-to-all receive buffer of {cap} bytes does not match a send buffer of {len} bytes"
            )));
            }
            let Some(turn) = turn else {
                return Ok(());
            };
            same_lengths(r, turn, len, "all-to-all send buffers")?;
            deliver(&mut layout, |all| {
                for (m, block) in all.chunks_exact_mut(bs.max(1)).take(n).enumerate() {
                    crate::sys::copy::copy(
                        block,
                        &r.part_or(m, turn, mine)[me * bs..(me + 1) * bs],
                    );
                }
                Ok(())
            })
        },
    )
}
