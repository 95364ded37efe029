//! Collective schedules: every collective, blocking or not, is compiled into
//! a list of *rounds* of point-to-point steps and local steps (libNBC's
//! design), and the engine runs it.
//!
//! Contract of the runner:
//! - Steps of a round run in order: local steps (reduce, copy, unpack) at
//!   once, sends and receives are posted. The next round starts when every
//!   send and receive of this round has completed.
//! - A schedule lives in the engine (`Engine::pass_work`) and advances on every
//!   progress pass, whichever thread drives it (a blocking call of any kind, a
//!   `wait`/`test`, or the futures progress thread). Blocking collectives
//!   start a schedule and wait for its request, so both forms share one code
//!   path.
//! - Each schedule the engine holds completes one engine request, made as a
//!   send to no peer (`NO_PEER`), which `Request`, `RequestCollection` and
//!   `wait_any` treat like any other request. A blocking collective that
//!   finishes while its caller starts it (one rank, or every message already
//!   in) never gets one (`run`).
//! - A schedule's step, round and buffer vectors are reused per thread
//!   (`POOL`), so a small collective does not go through the allocator for
//!   them.
//! - Traffic goes to the communicator's collective context with tags from
//!   the per-call sequence (`CommInner::next_coll_tag`), so no point-to-point
//!   receive can match it and concurrent collectives stay apart.
//! - A length mismatch or a failed message does not stop the schedule: it
//!   runs to the end (so other ranks are not left waiting) and completes with
//!   the first error.
//!
//! This module is the collectives' unsafe island: it holds raw views of user
//! buffers and erases the lifetime of the reduction operation. The API layer
//! keeps both alive until the schedule's request has completed (blocking
//! calls wait; nonblocking ones are tied to a `Scope`, as in rsmpi).

use crate::collective::op::OpApply;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::datatype::{swap_packed, type_map, Prim, RecvLayout, TypeMap};
use crate::engine::core::{Core, Pattern, RecvBuf, ReqId, SendBuf};
use crate::engine::links::Links;
use crate::engine::PassWork;
use crate::environment::shared;
use crate::error::{Error, ErrorClass};
use crate::sys::rawbuf::{RecvPtr, SendPtr};
use crate::topology::CommInner;
use crate::{Rank, Tag};

/// The destination of the request a schedule completes: no rank has it, so
/// `Core::fail_peer` never touches it.
const NO_PEER: u32 = u32::MAX;

/// A byte range of one of a schedule's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reg {
    pub buf: usize,
    pub off: usize,
    pub len: usize,
}

impl Reg {
    /// The part `[off, off + len)` of this region.
    pub(crate) fn at(self, off: usize, len: usize) -> Reg {
        assert!(
            off + len <= self.len,
            "schedule region {off}+{len} outside {}",
            self.len
        );
        Reg {
            buf: self.buf,
            off: self.off + off,
            len,
        }
    }

    fn overlaps(self, o: Reg) -> bool {
        self.buf == o.buf && self.off < o.off + o.len && o.off < self.off + self.len
    }
}

#[derive(Clone, Copy)]
enum Step {
    Send {
        to: Rank,
        tag: Tag,
        src: Reg,
    },
    Recv {
        from: Rank,
        tag: Tag,
        dst: Reg,
    },
    /// `upper = lower ∘ upper`.
    Apply {
        lower: Reg,
        upper: Reg,
    },
    Copy {
        from: Reg,
        to: Reg,
    },
    /// Scatter signature bytes into a non-contiguous user buffer.
    Unpack {
        from: Reg,
        out: usize,
    },
    /// `got` must equal `want`, else the ranks' arguments differ (`Count`).
    Expect {
        got: Reg,
        want: Reg,
        what: &'static str,
    },
}

/// One buffer: library-owned (a `Vec` taken apart) or a view of user memory.
struct Mem {
    ptr: *mut u8,
    len: usize,
    /// Capacity of the library's allocation; `None` for user memory.
    owned_cap: Option<usize>,
    /// A scratch buffer ([`Scratch`]) with this many bytes initialised (at
    /// least `len`); it goes back to the pool when the schedule is done.
    pooled: Option<usize>,
    writable: bool,
}

/// Scratch buffers of finished schedules, kept for the next ones. A fresh
/// allocation of a large temporary was zeroed by `calloc` and, after the
/// allocator had trimmed its heap, faulted in page by page: an all-reduce
/// of 4 MiB over TCP between two ranks spent 8% of its time in `memset`
/// and 9% in page faults for its two 4 MiB temporaries, every call.
struct Scratch {
    free: Vec<Vec<u8>>,
    bytes: usize,
}

static SCRATCH: Mutex<Scratch> = Mutex::new(Scratch {
    free: Vec::new(),
    bytes: 0,
});
/// Temporaries smaller than this come from the allocator as before (cheap
/// there, and many small ones would crowd the pool).
const SCRATCH_MIN: usize = 64 << 10;
/// At most this many bytes are kept in the pool (per process).
const SCRATCH_KEEP: usize = 32 << 20;
/// At most this many buffers are kept.
const SCRATCH_BUFFERS: usize = 8;

impl Scratch {
    /// A buffer of at least `len` bytes, all initialised (contents left
    /// from an earlier schedule, or zero): the smallest pooled one that
    /// holds `len` without being more than twice as large, else a new one.
    fn take(len: usize) -> Vec<u8> {
        let mut p = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
        let best = (0..p.free.len())
            .filter(|&i| (len..=len.saturating_mul(2)).contains(&p.free[i].len()))
            .min_by_key(|&i| p.free[i].len());
        match best {
            Some(i) => {
                let v = p.free.swap_remove(i);
                p.bytes -= v.len();
                v
            }
            None => {
                drop(p);
                vec![0; len]
            }
        }
    }

    /// Keeps `v` (all of it initialised) for a later schedule, dropping the
    /// smallest buffers kept where the pool would grow past its limits.
    fn give(v: Vec<u8>) {
        if v.len() > SCRATCH_KEEP {
            return;
        }
        let mut p = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
        p.bytes += v.len();
        p.free.push(v);
        while p.bytes > SCRATCH_KEEP || p.free.len() > SCRATCH_BUFFERS {
            let i = (0..p.free.len())
                .min_by_key(|&i| p.free[i].len())
                .expect("not empty");
            let gone = p.free.swap_remove(i);
            p.bytes -= gone.len();
        }
    }
}

// SAFETY: `Mem` is a plain address plus ownership of a byte allocation. User
// memory behind it stays valid until the schedule completes (module docs), and
// every access happens under the engine lock, one thread at a time.
unsafe impl Send for Mem {}

impl Mem {
    fn owned(v: Vec<u8>) -> Mem {
        let mut v = std::mem::ManuallyDrop::new(v);
        Mem {
            ptr: v.as_mut_ptr(),
            len: v.len(),
            owned_cap: Some(v.capacity()),
            pooled: None,
            writable: true,
        }
    }

    /// A scratch buffer of `len` bytes from the pool (see [`Scratch`]).
    fn scratch(len: usize) -> Mem {
        let mut v = std::mem::ManuallyDrop::new(Scratch::take(len));
        Mem {
            ptr: v.as_mut_ptr(),
            len,
            owned_cap: Some(v.capacity()),
            pooled: Some(v.len()),
            writable: true,
        }
    }

    /// The bytes of `r`.
    ///
    /// # Safety
    /// Nobody may write `r` while the slice lives (schedules never read and
    /// write one range in the same step; see `Builder` checks).
    unsafe fn bytes(&self, r: Reg) -> &[u8] {
        if r.len == 0 {
            return &[];
        }
        // SAFETY: the builder checked `r` lies inside the buffer; the memory
        // is alive (owned, or user memory kept alive per the module docs);
        // the caller rules out concurrent writes.
        unsafe { std::slice::from_raw_parts(self.ptr.add(r.off), r.len) }
    }

    /// The bytes of `r`, writable.
    ///
    /// # Safety
    /// As for [`Mem::bytes`], and no other slice of `r` may live meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, r: Reg) -> &mut [u8] {
        if r.len == 0 {
            return &mut [];
        }
        debug_assert!(self.writable);
        // SAFETY: as in `bytes`; exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.off), r.len) }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        let Some(cap) = self.owned_cap else {
            return;
        };
        if let Some(init) = self.pooled {
            // SAFETY: the raw parts of the pool's `Vec` taken apart in
            // `Mem::scratch`, with its length (bytes initialised; the
            // schedule only wrote bytes into them) and capacity; rebuilt once.
            let v = unsafe { Vec::from_raw_parts(self.ptr, init, cap) };
            Scratch::give(v);
            return;
        }
        // SAFETY: these are the raw parts of the `Vec` taken apart in
        // `Mem::owned`, rebuilt exactly once.
        drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, cap) });
    }
}

/// A user receive buffer, borrowed for the schedule's life, that is written by unpacking
/// at the end.
struct Out<'a>(RecvLayout<'a>);

// SAFETY: the layout is an exclusive borrow of a user buffer for the whole collective
// (`&mut [u8]` is `Send`), held as an address; it is written once, under the engine lock.
unsafe impl Send for Out<'_> {}

/// The reduction a schedule applies, with the lifetime of the caller's
/// operation erased (see `Builder::reduction`).
struct Reduction {
    op: Box<dyn OpApply + Send>,
    prim: Option<Prim>,
    dt: u32,
}

/// The vectors of a finished schedule, kept per thread for the next one:
/// a small collective otherwise spends a good part of its time in the
/// allocator (three vectors per call).
struct Spare {
    mem: Vec<Mem>,
    steps: Vec<Step>,
    ends: Vec<usize>,
}

/// Schedules' vectors kept per thread, and the most kept.
const POOL_MAX: usize = 4;
/// Vectors above this capacity are freed rather than kept.
const POOL_CAP: usize = 256;

thread_local! {
    static POOL: std::cell::RefCell<Vec<Spare>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn take_spare() -> Spare {
    POOL.try_with(|p| p.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Spare {
            mem: Vec::with_capacity(4),
            steps: Vec::with_capacity(8),
            ends: Vec::with_capacity(4),
        })
}

fn give_spare(mut sp: Spare) {
    if sp.mem.capacity() > POOL_CAP
        || sp.steps.capacity() > POOL_CAP
        || sp.ends.capacity() > POOL_CAP
    {
        return;
    }
    // Frees the library's buffers; views of user memory need nothing.
    sp.mem.clear();
    sp.steps.clear();
    sp.ends.clear();
    let _ = POOL.try_with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < POOL_MAX {
            p.push(sp);
        }
    });
}

/// Builds a schedule: the algorithms in the sibling modules describe their
/// communication pattern here, identically on every rank.
pub(crate) struct Builder<'c, 'a> {
    comm: &'c CommInner,
    /// The user buffers the schedule reads and writes, borrowed for `'a`.
    user: PhantomData<&'a mut [u8]>,
    name: &'static str,
    pub n: Rank,
    pub me: Rank,
    tag: Tag,
    mem: Vec<Mem>,
    /// Every step, round after round.
    steps: Vec<Step>,
    /// Index in `steps` where the current round starts.
    round_start: usize,
    /// End (exclusive index in `steps`) of every finished round.
    ends: Vec<usize>,
    outs: Vec<Out<'a>>,
    red: Option<Reduction>,
    error: Option<Error>,
    /// The element layout of the data, where meta hosts differ in byte
    /// order (see [`Builder::elements`]).
    swap: Option<Arc<TypeMap>>,
}

impl<'c, 'a> Builder<'c, 'a> {
    /// A builder for collective `name` (as it appears in traces) on `comm`.
    pub(crate) fn new(comm: &'c CommInner, name: &'static str) -> Builder<'c, 'a> {
        let Spare { mem, steps, ends } = take_spare();
        Builder {
            comm,
            user: PhantomData,
            name,
            n: comm.size(),
            me: comm.rank,
            tag: 0,
            mem,
            steps,
            round_start: 0,
            ends,
            outs: Vec::new(),
            red: None,
            error: None,
            swap: None,
        }
    }

    /// Records the datatype of the collective's data. Where some meta host
    /// declares another byte order than this machine's, messages to other
    /// meta hosts are converted to this host's declared order and messages
    /// from them back (receiver makes right), element by element; every
    /// region a message carries is whole elements of it.
    pub(crate) fn elements(&mut self, type_id: u32) {
        if self.swap.is_none() && shared().info.orders_differ {
            self.swap = Some(type_map(type_id));
        }
    }

    /// Starts a phase: a fresh tag base from the communicator's collective
    /// sequence. Every rank must call it the same number of times.
    pub(crate) fn phase(&mut self) {
        self.tag = self.comm.next_coll_tag();
    }

    /// A buffer of the library's, for the schedule to write before it reads
    /// it: its contents are unspecified (large ones are reused scratch).
    pub(crate) fn owned(&mut self, len: usize) -> Reg {
        if len < SCRATCH_MIN {
            return self.owned_from(vec![0; len]);
        }
        self.mem.push(Mem::scratch(len));
        Reg {
            buf: self.mem.len() - 1,
            off: 0,
            len,
        }
    }

    /// Takes `v` as a buffer of the library's.
    pub(crate) fn owned_from(&mut self, v: Vec<u8>) -> Reg {
        let len = v.len();
        self.mem.push(Mem::owned(v));
        Reg {
            buf: self.mem.len() - 1,
            off: 0,
            len,
        }
    }

    /// A read-only view of user memory, borrowed for as long as the schedule.
    pub(crate) fn user_read(&mut self, bytes: &'a [u8]) -> Reg {
        self.mem.push(Mem {
            ptr: bytes.as_ptr() as *mut u8,
            len: bytes.len(),
            owned_cap: None,
            pooled: None,
            writable: false,
        });
        Reg {
            buf: self.mem.len() - 1,
            off: 0,
            len: bytes.len(),
        }
    }

    /// A writable view of user memory, borrowed exclusively for as long as the schedule.
    pub(crate) fn user_write(&mut self, bytes: &'a mut [u8]) -> Reg {
        self.mem.push(Mem {
            ptr: bytes.as_mut_ptr(),
            len: bytes.len(),
            owned_cap: None,
            pooled: None,
            writable: true,
        });
        Reg {
            buf: self.mem.len() - 1,
            off: 0,
            len: bytes.len(),
        }
    }

    /// Registers a user receive buffer that must be unpacked into at the end.
    pub(crate) fn out_layout(&mut self, layout: RecvLayout<'a>) -> usize {
        self.outs.push(Out(layout));
        self.outs.len() - 1
    }

    /// Installs the reduction operation, whose borrows last as long as the schedule.
    pub(crate) fn reduction(
        &mut self,
        op: Box<dyn OpApply + Send + 'a>,
        prim: Option<Prim>,
        dt: u32,
    ) {
        // SAFETY: only the lifetime bound of the trait object changes: the schedule holds it,
        // and a schedule lives no longer than `'a` (`Schedule<'a>`; `run` and `request`
        // keep that when they hand it to the engine).
        let op: Box<dyn OpApply + Send + 'static> = unsafe { std::mem::transmute(op) };
        self.red = Some(Reduction { op, prim, dt });
    }

    /// Records a local error (a bad argument found while planning); the
    /// schedule still runs so that the other ranks are not left waiting.
    pub(crate) fn fail(&mut self, e: Error) {
        self.error.get_or_insert(e);
    }

    /// Ends the current round: later steps wait for its messages.
    pub(crate) fn round(&mut self) {
        if self.steps.len() > self.round_start {
            self.round_start = self.steps.len();
            self.ends.push(self.round_start);
        }
    }

    fn push(&mut self, s: Step) {
        self.steps.push(s);
    }

    fn check(&self, r: Reg, write: bool) {
        let m = &self.mem[r.buf];
        assert!(r.off + r.len <= m.len, "schedule region outside its buffer");
        assert!(!write || m.writable, "schedule writes a read-only buffer");
    }

    /// A region a step of the current round writes must not be touched by
    /// another step of the round that is still in flight. This guards the
    /// algorithms (an overlap would corrupt data, not memory: every access is
    /// a short-lived slice under the engine lock), so long rounds (all-to-all
    /// on many ranks) skip the quadratic scan outside debug builds.
    fn check_round(&self, r: Reg, write: bool) {
        let round = &self.steps[self.round_start..];
        if !cfg!(debug_assertions) && round.len() > 64 {
            return;
        }
        for s in round {
            let clash = match *s {
                Step::Send { src, .. } => write && src.overlaps(r),
                Step::Recv { dst, .. } => dst.overlaps(r),
                _ => false,
            };
            assert!(!clash, "schedule step clashes with a message in flight");
        }
    }

    /// Sends `src` to `to` with tag `label` of the current phase.
    pub(crate) fn send(&mut self, to: Rank, label: u32, src: Reg) {
        self.check(src, false);
        self.check_round(src, false);
        let tag = self.tag + (label & 0xff) as Tag;
        self.push(Step::Send { to, tag, src });
    }

    /// Receives exactly `dst.len` bytes from `from` into `dst`.
    pub(crate) fn recv(&mut self, from: Rank, label: u32, dst: Reg) {
        self.check(dst, true);
        self.check_round(dst, true);
        let tag = self.tag + (label & 0xff) as Tag;
        self.push(Step::Recv { from, tag, dst });
    }

    /// `upper = lower ∘ upper` with the schedule's reduction.
    pub(crate) fn apply(&mut self, lower: Reg, upper: Reg) {
        assert_eq!(lower.len, upper.len, "reduction operands differ in length");
        assert!(!lower.overlaps(upper), "reduction operands overlap");
        self.check(lower, false);
        self.check(upper, true);
        self.check_round(lower, false);
        self.check_round(upper, true);
        self.push(Step::Apply { lower, upper });
    }

    /// Copies `from` to `to` (same length); nothing when they are the same.
    pub(crate) fn copy(&mut self, from: Reg, to: Reg) {
        assert_eq!(from.len, to.len, "copy between regions of different length");
        if from == to {
            return;
        }
        assert!(!from.overlaps(to), "copy between overlapping regions");
        self.check(from, false);
        self.check(to, true);
        self.check_round(from, false);
        self.check_round(to, true);
        self.push(Step::Copy { from, to });
    }

    /// Copies as much of `from` as fits `to`; a difference in length means
    /// this rank's arguments disagree (`Count`).
    pub(crate) fn copy_fit(&mut self, from: Reg, to: Reg) {
        if from.len != to.len {
            self.fail(Error::new(
                ErrorClass::Count,
                format!(
                    "a contribution of {} bytes does not match a block of {} bytes",
                    from.len, to.len
                ),
            ));
        }
        let l = from.len.min(to.len);
        self.copy(from.at(0, l), to.at(0, l));
    }

    /// Checks, once `got` has arrived, that it equals `want`; a difference
    /// fails the operation with `Count` ("`what` differ").
    pub(crate) fn expect(&mut self, got: Reg, want: Reg, what: &'static str) {
        assert_eq!(got.len, want.len, "compared regions differ in length");
        self.check(got, false);
        self.check(want, false);
        self.check_round(got, false);
        self.check_round(want, false);
        self.push(Step::Expect { got, want, what });
    }

    /// Unpacks `from` into the user buffer registered as `out`.
    pub(crate) fn unpack(&mut self, from: Reg, out: usize) {
        self.check(from, false);
        self.check_round(from, false);
        self.push(Step::Unpack { from, out });
    }

    pub(crate) fn finish(mut self) -> Schedule<'a> {
        self.round();
        if self.comm.is_inter() {
            // MPI-1 defines no collective on an intercommunicator: fail on
            // every member at once, touching no buffer and sending nothing.
            self.steps.clear();
            self.ends.clear();
            self.outs.clear();
            self.error = Some(Error::new(
                ErrorClass::Comm,
                format!(
                    "{} on an intercommunicator: collective operations need an \
                     intracommunicator (merge the intercommunicator first)",
                    self.name
                ),
            ));
        }
        Schedule {
            user: PhantomData,
            name: self.name,
            ctx: self.comm.ctx + 1,
            ranks: std::sync::Arc::clone(&self.comm.ranks),
            mem: std::mem::take(&mut self.mem),
            steps: std::mem::take(&mut self.steps),
            ends: std::mem::take(&mut self.ends),
            next: 0,
            pending: Vec::new(),
            outs: self.outs,
            red: self.red,
            error: self.error,
            req: 0,
            swap: self.swap,
        }
    }
}

struct Pending {
    id: ReqId,
    /// For a receive: where it goes (its exact length), and the sender.
    recv: Option<(Reg, Rank)>,
}

/// A compiled collective running in the engine; it views user buffers borrowed for `'a`.
pub(crate) struct Schedule<'a> {
    user: PhantomData<&'a mut [u8]>,
    name: &'static str,
    ctx: u32,
    ranks: std::sync::Arc<Vec<u32>>,
    mem: Vec<Mem>,
    steps: Vec<Step>,
    /// End of every round in `steps`.
    ends: Vec<usize>,
    /// The next round to start.
    next: usize,
    pending: Vec<Pending>,
    outs: Vec<Out<'a>>,
    red: Option<Reduction>,
    error: Option<Error>,
    req: ReqId,
    swap: Option<Arc<TypeMap>>,
}

impl Drop for Schedule<'_> {
    fn drop(&mut self) {
        give_spare(Spare {
            mem: std::mem::take(&mut self.mem),
            steps: std::mem::take(&mut self.steps),
            ends: std::mem::take(&mut self.ends),
        });
    }
}

impl<'a> Schedule<'a> {
    /// The same schedule, its borrow of user buffers no longer tracked by the compiler: for
    /// the engine, which keeps running schedules beside every call.
    ///
    /// # Safety
    /// The schedule must be done (completed, and dropped or no longer advanced) before `'a`
    /// ends.
    unsafe fn erase(self) -> Schedule<'static> {
        // SAFETY: only the lifetime parameter, which is a marker, changes; the caller keeps
        // the buffers alive for as long as the schedule is used.
        unsafe { std::mem::transmute::<Schedule<'a>, Schedule<'static>>(self) }
    }
    fn fail(&mut self, e: Error) {
        self.error.get_or_insert(e);
    }

    fn world(&self, r: Rank) -> u32 {
        self.ranks[r as usize]
    }

    /// Collects finished messages, then starts rounds while nothing is in
    /// flight. Returns whether anything happened; `done` tells the end.
    fn advance(&mut self, core: &mut Core, links: &mut Links) -> bool {
        let mut moved = false;
        loop {
            let mut i = 0;
            while i < self.pending.len() {
                let p = &self.pending[i];
                let Some(c) = core.take(p.id) else {
                    i += 1;
                    continue;
                };
                let recv = p.recv;
                self.pending.swap_remove(i);
                moved = true;
                if let (Some(tm), Some((dst, _)), Ok(())) = (&self.swap, recv, &c.result) {
                    if c.status.big_endian != cfg!(target_endian = "big") {
                        let len = c.status.len.min(dst.len);
                        // SAFETY: the receive into `dst` has completed and no
                        // other step touches it before the next round.
                        let bytes = unsafe { self.mem[dst.buf].bytes_mut(dst.at(0, len)) };
                        swap_packed(tm, bytes);
                    }
                }
                let recv = recv.map(|(dst, from)| (dst.len, from));
                match (c.result, recv) {
                    (Err(e), Some((want, from))) if e.class() == ErrorClass::Truncate => {
                        self.fail(Error::new(
                            ErrorClass::Count,
                            format!(
                                "collective message from rank {from} is longer than the {want} bytes \
                                 expected: the ranks' arguments differ"
                            ),
                        ))
                    }
                    (Err(e), _) => self.fail(e),
                    (Ok(()), Some((want, from))) if c.status.len != want => {
                        self.fail(Error::new(
                            ErrorClass::Count,
                            format!(
                                "collective message from rank {from} has {} bytes where {want} \
                                 were expected: the ranks' arguments differ",
                                c.status.len
                            ),
                        ))
                    }
                    _ => {}
                }
            }
            if !self.pending.is_empty() {
                return moved;
            }
            let Some(&end) = self.ends.get(self.next) else {
                return moved;
            };
            let start = match self.next {
                0 => 0,
                k => self.ends[k - 1],
            };
            self.next += 1;
            moved = true;
            for i in start..end {
                let s = self.steps[i];
                self.exec(s, core, links);
            }
        }
    }

    /// Whether the schedule sends and receives nothing.
    fn local_only(&self) -> bool {
        !self
            .steps
            .iter()
            .any(|s| matches!(s, Step::Send { .. } | Step::Recv { .. }))
    }

    fn done(&self) -> bool {
        self.pending.is_empty() && self.next == self.ends.len()
    }

    fn exec(&mut self, s: Step, core: &mut Core, links: &mut Links) {
        match s {
            Step::Send { to, tag, src } => {
                let w = self.world(to);
                // SAFETY: the builder's round checks keep `src` unwritten
                // until this send completes (the round waits for it).
                let bytes = unsafe { self.mem[src.buf].bytes(src) };
                if let Some(tm) = self.swap.as_ref().filter(|_| shared().info.swap_to(w)) {
                    let mut v = bytes.to_vec();
                    swap_packed(tm, &mut v);
                    if links.try_send_now(core, w, self.ctx, tag, &v) {
                        return;
                    }
                    let id = core.new_send(w, SendBuf::Owned(v));
                    links.post_send(core, id, w, self.ctx, tag, false);
                    self.pending.push(Pending { id, recv: None });
                    return;
                }
                if links.try_send_now(core, w, self.ctx, tag, bytes) {
                    return;
                }
                // SAFETY: as above; the memory outlives the request because
                // the schedule waits for it before moving on or completing.
                let id = core.new_send(w, SendBuf::Borrowed(unsafe { SendPtr::new(bytes) }));
                links.post_send(core, id, w, self.ctx, tag, false);
                self.pending.push(Pending { id, recv: None });
            }
            Step::Recv { from, tag, dst } => {
                let pat = Pattern {
                    ctx: self.ctx,
                    src: Some(self.world(from)),
                    tag: Some(tag),
                };
                // SAFETY: nothing else touches `dst` until the receive
                // completes (builder round checks); the memory outlives it.
                let buf = unsafe { RecvPtr::new(self.mem[dst.buf].bytes_mut(dst)) };
                let id = core.post_recv(pat, RecvBuf::Borrowed(buf));
                self.pending.push(Pending {
                    id,
                    recv: Some((dst, from)),
                });
            }
            Step::Apply { lower, upper } => {
                let Some(red) = &self.red else {
                    self.fail(Error::new(ErrorClass::Other, "schedule has no operation"));
                    return;
                };
                // SAFETY: the builder checked that the operands do not
                // overlap and that no message of this round touches them.
                let (lo, up) = unsafe {
                    (
                        self.mem[lower.buf].bytes(lower),
                        self.mem[upper.buf].bytes_mut(upper),
                    )
                };
                if let Err(e) = red.op.apply(lo, up, red.prim, red.dt) {
                    self.fail(e);
                }
            }
            Step::Copy { from, to } => {
                // SAFETY: disjoint regions, not in flight (builder checks).
                let (a, b) = unsafe {
                    (
                        self.mem[from.buf].bytes(from),
                        self.mem[to.buf].bytes_mut(to),
                    )
                };
                crate::sys::copy::copy(b, a);
            }
            Step::Unpack { from, out } => {
                // SAFETY: `from` is not in flight (builder checks).
                let data = unsafe { self.mem[from.buf].bytes(from) };
                let cap = self.outs[out].0.capacity();
                if data.len() > cap {
                    self.fail(crate::error::truncate(data.len(), cap));
                    return;
                }
                self.outs[out].0.unpack(data);
            }
            Step::Expect { got, want, what } => {
                // SAFETY: neither region is in flight (builder checks).
                let same =
                    unsafe { self.mem[got.buf].bytes(got) == self.mem[want.buf].bytes(want) };
                if !same {
                    self.fail(Error::new(
                        ErrorClass::Count,
                        format!("{what} differ: the ranks' arguments differ"),
                    ));
                }
            }
        }
    }

    fn complete(mut self, core: &mut Core) {
        match self.error.take() {
            Some(e) => core.fail(self.req, e),
            None => core.complete_send(self.req),
        }
    }
}

/// The schedules a process is running (a field of the engine).
#[derive(Default)]
pub(crate) struct Schedules {
    active: Vec<Schedule<'static>>,
}

impl Schedules {
    /// Starts `s` and returns the request that completes with it.
    pub(crate) fn start(
        &mut self,
        mut s: Schedule<'static>,
        core: &mut Core,
        links: &mut Links,
    ) -> ReqId {
        s.req = core.new_send(NO_PEER, SendBuf::Owned(Vec::new()));
        let id = s.req;
        s.advance(core, links);
        if s.done() {
            s.complete(core);
        } else {
            self.active.push(s);
        }
        id
    }

    /// The name and context of the schedule whose request is `id`, for a hang report.
    fn describe(&self, id: ReqId) -> Option<(&'static str, u32)> {
        self.active
            .iter()
            .find(|s| s.req == id)
            .map(|s| (s.name, s.ctx))
    }

    /// Takes over a schedule already started (and not finished) by the
    /// caller; returns the request that completes with it.
    fn adopt(&mut self, mut s: Schedule<'static>, core: &mut Core) -> ReqId {
        s.req = core.new_send(NO_PEER, SendBuf::Owned(Vec::new()));
        let id = s.req;
        self.active.push(s);
        id
    }

    fn advance_active(&mut self, core: &mut Core, links: &mut Links) -> bool {
        let mut moved = false;
        let mut i = 0;
        while i < self.active.len() {
            moved |= self.active[i].advance(core, links);
            if self.active[i].done() {
                let s = self.active.swap_remove(i);
                s.complete(core);
            } else {
                i += 1;
            }
        }
        moved
    }
}

/// The engine advances the running schedules on each of its progress passes.
impl PassWork for Schedules {
    fn advance(&mut self, core: &mut Core, links: &mut Links) -> (bool, bool) {
        let moved = !self.active.is_empty() && self.advance_active(core, links);
        (moved, !self.active.is_empty())
    }

    fn describe(&self, id: ReqId) -> Option<(&'static str, u32)> {
        Schedules::describe(self, id)
    }
}

/// Starts a schedule; the returned request completes with it.
///
/// # Safety
/// The buffers the schedule views (`'a`) must outlive the request: it must be waited for (or
/// complete) before `'a` ends, as a [`crate::request::Scope`] makes sure.
pub(crate) unsafe fn start(s: Schedule<'_>) -> ReqId {
    // SAFETY: the caller's contract: the engine is done with the schedule once its request
    // has completed, and that happens before the buffers go.
    let s = unsafe { s.erase() };
    shared().with(|e| {
        let (colls, core, links) = e.pass_work::<Schedules>();
        colls.start(s, core, links)
    })
}

/// Runs a schedule to its end (the blocking collectives); traced as a
/// region named after the collective.
///
/// The calling thread starts the schedule itself; one that finishes at once
/// (a single rank; every message already in) returns without an engine
/// request or a wait loop. Otherwise the engine takes it over and the thread
/// waits for its request like any other. The progress pass after the start
/// stays where there are messages: without it, two ranks measured 0.3–0.5 µs slower per small
/// barrier or all-reduce (a wait loop that starts the schedule itself after
/// its first pass was tried).
pub(crate) fn run(s: Schedule<'_>) -> Result<(), Error> {
    // SAFETY: this call returns only when the schedule is done: it finishes here, or the
    // engine adopts it and the wait below returns when its request completes, which is
    // when the engine has let go of it. The borrowed buffers outlive the call.
    let mut s = unsafe { s.erase() };
    let t = crate::trace::start();
    let (name, ctx) = (s.name, s.ctx);
    let sh = shared();
    // Without messages (a single rank) there is nothing to progress.
    let local = s.local_only();
    let go = |e: &mut crate::engine::Engine| {
        s.advance(&mut e.core, &mut e.links);
        if s.done() {
            Ok(s.error.take())
        } else {
            let (colls, core, _) = e.pass_work::<Schedules>();
            Err(colls.adopt(s, core))
        }
    };
    let started = if local { sh.quick(go) } else { sh.with(go) };
    let r = match started {
        Ok(None) => Ok(()),
        Ok(Some(e)) => Err(e),
        Err(id) => sh.wait(id).result,
    };
    crate::trace::record(t, crate::trace::Kind::Collective, name, -1, 0, 0, ctx);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch buffer given back serves the next request of about its
    /// size (the same allocation, its bytes as the last user left them),
    /// not one of less than half its size; the pool's limits hold.
    #[test]
    fn scratch_buffers_are_reused() {
        // Sizes no other test asks for: the pool is the process's.
        let len = (3 << 20) + 4321;
        let mut v = Scratch::take(len);
        assert!(v.len() >= len);
        v[0] = 7;
        let at = v.as_ptr();
        Scratch::give(v);
        let again = Scratch::take(len - 1000);
        assert_eq!(
            again.as_ptr(),
            at,
            "a kept buffer of the right size was not reused"
        );
        assert_eq!(again[0], 7);
        Scratch::give(again);
        let small = Scratch::take(len / 2 - 1);
        assert_ne!(
            small.as_ptr(),
            at,
            "a buffer more than twice the request was handed out"
        );
        drop(small);
        Scratch::give(vec![0; SCRATCH_KEEP + 1]);
        for _ in 0..2 * SCRATCH_BUFFERS {
            Scratch::give(vec![0; SCRATCH_MIN]);
        }
        let p = SCRATCH.lock().unwrap();
        assert!(p.free.len() <= SCRATCH_BUFFERS && p.bytes <= SCRATCH_KEEP);
        assert_eq!(p.bytes, p.free.iter().map(Vec::len).sum::<usize>());
    }
}
