//! Collective operations (MPI-1.2 §4, MPI-3 §5.12 nonblocking forms), in
//! rsmpi's shape, plus fallible `try_*` forms and max-loc/min-loc.
//!
//! - Every collective runs on the communicator's collective context
//!   (`ctx + 1`) with tags from a per-communicator call sequence, so
//!   point-to-point receives, even with any source and any tag, never match
//!   collective traffic (the SC99 failure of seed 000), and several
//!   collectives in flight stay apart.
//! - Each call is compiled into a schedule of rounds (`collective/schedule.rs`)
//!   that the engine advances on every progress pass: the blocking forms
//!   start one and wait, the `immediate_*` forms return a [`Request`] over
//!   it. A schedule progresses whenever any thread of the process is inside
//!   the library (a blocked `receive` is enough).
//! - The algorithm is chosen per call by operation, communicator size and
//!   message size ([`algorithm`]); `METAMPI_COLL_ALG` or [`force_algorithm`]
//!   force one. Non-commutative operations always run an order-preserving
//!   algorithm.
//! - Across meta hosts the blocking varcount gather, scatter and all-to-all
//!   run hierarchically: a small collective inside each site first tells
//!   the site's leader its members' counts, then one aggregated message
//!   crosses each wide-area link (`hier`). Their immediate forms stay flat:
//!   a schedule's message sizes are fixed when it starts, so it cannot size
//!   later messages from counts it receives.
//! - Arguments that disagree between ranks (lengths, counts) surface as
//!   [`ErrorClass::Count`] from the `try_*` forms and `Request::try_wait` on
//!   the ranks that notice (in a hierarchical call that can be a leader that
//!   forwards another rank's blocks); the rsmpi-shaped forms end the job
//!   instead, like MPI's default error handler. A schedule with an error
//!   still runs to its end so that other ranks are not left waiting; a
//!   malformed varcount partition runs as one of empty blocks.
//!
//! ```no_run
//! use metampi::collective::SystemOperation;
//! use metampi::traits::*;
//!
//! let universe = metampi::initialize().unwrap();
//! let world = universe.world();
//! let mine = [world.rank() as f64; 4];
//! let mut sum = [0.0; 4];
//! metampi::request::scope(|scope| {
//!     let req = world.immediate_all_reduce_into(scope, &mine[..], &mut sum[..], SystemOperation::sum());
//!     // ... computation or point-to-point traffic meanwhile ...
//!     req.wait();
//! });
//! let root = world.process_at_rank(0);
//! root.broadcast_into(&mut sum[..]);
//! ```

#[deny(unsafe_code)]
mod allgather;
#[deny(unsafe_code)]
mod allreduce;
#[deny(unsafe_code)]
mod alltoall;
#[deny(unsafe_code)]
mod barrier;
#[deny(unsafe_code)]
mod bcast;
mod bracket;
#[deny(unsafe_code)]
mod gather;
#[deny(unsafe_code)]
pub(crate) mod hier;
mod op;
#[deny(unsafe_code)]
mod reduce;
#[deny(unsafe_code)]
mod scan;
pub(crate) mod schedule;
pub(crate) mod shm;

#[deny(unsafe_code)]
pub mod algorithm;

use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use self::algorithm::{
    default_algorithm, force_algorithm, forced_algorithm, Algorithm, Collective,
};
#[doc(hidden)]
pub use self::op::OpApply;
pub use self::op::{
    reduce_local_into, try_reduce_local_into, DynBuffer, DynBufferMut, LocIndex, LocValue,
    Operation, SystemOperation, UnsafeUserFunction, UnsafeUserOperation, UserOperation, ValueIndex,
};

use self::algorithm::choose;
use self::schedule::{run, start, Builder, Reg, Schedule};
use crate::datatype::{
    pack, type_map, Buffer, BufferMut, Packed, PartitionedBuffer, PartitionedBufferMut, RecvLayout,
    TypeMap, UncommittedDatatype,
};
use crate::environment::OrAbort;
use crate::error::{Error, ErrorClass};
use crate::point_to_point::{recv_bytes, send_bytes, Mode};
use crate::request::{Post, Request, Scope};
use crate::topology::{AsCommunicator, CommInner, Communicator};
use crate::{Count, Rank};

// ---- buffers as schedule memory ------------------------------------------------------

/// A send buffer as schedule memory: dense buffers are used in place.
fn input<'a, S: Buffer + ?Sized>(b: &mut Builder<'_, 'a>, s: &'a S) -> Reg {
    b.elements(s.as_datatype().type_id());
    match pack(s) {
        Packed::Dense(d) => b.user_read(d),
        Packed::Packed(v) => b.owned_from(v),
    }
}

/// A writable copy of a send buffer (reductions overwrite their operand).
fn copy_in<S: Buffer + ?Sized>(b: &mut Builder, s: &S) -> Reg {
    b.elements(s.as_datatype().type_id());
    match pack(s) {
        Packed::Dense(d) => b.owned_from(d.to_vec()),
        Packed::Packed(v) => b.owned_from(v),
    }
}

/// Where a rank's result goes: the user's buffer itself when dense,
/// otherwise a packed copy unpacked at the end.
struct Output {
    reg: Reg,
    unpack: Option<usize>,
    /// Bytes per element.
    es: usize,
}

fn output<'a, R: BufferMut + ?Sized>(b: &mut Builder<'_, 'a>, r: &'a mut R, keep: bool) -> Output {
    b.elements(r.as_datatype().type_id());
    let layout = RecvLayout::of(r);
    let es = layout.tm.size;
    match layout.into_dense() {
        Ok(d) => Output {
            reg: b.user_write(d),
            unpack: None,
            es,
        },
        Err(layout) => {
            let reg = if keep {
                b.owned_from(layout.pack())
            } else {
                b.owned(layout.capacity())
            };
            let i = b.out_layout(layout);
            Output {
                reg,
                unpack: Some(i),
                es,
            }
        }
    }
}

/// Moves the result into the user's buffer, after everything else.
fn finish(b: &mut Builder, o: &Output, result: Reg) {
    b.round();
    if result != o.reg {
        b.copy_fit(result, o.reg);
    }
    if let Some(i) = o.unpack {
        b.unpack(o.reg, i);
    }
    b.round();
}

/// Checks a partition's counts and displacements against the communicator.
fn partition(counts: &[Count], displs: &[Count], n: Rank) -> Result<Vec<(usize, usize)>, Error> {
    if counts.len() != n as usize || displs.len() != n as usize {
        return Err(Error::new(
            ErrorClass::Count,
            format!(
                "a partition has {} counts and {} displacements for {n} ranks",
                counts.len(),
                displs.len()
            ),
        ));
    }
    counts
        .iter()
        .zip(displs)
        .map(|(&c, &d)| match (usize::try_from(c), usize::try_from(d)) {
            (Ok(c), Ok(d)) => Ok((c, d)),
            _ => Err(Error::new(
                ErrorClass::Count,
                format!("negative count {c} or displacement {d} in a partition"),
            )),
        })
        .collect()
}

/// The signature bytes of elements `first..first + count` of a buffer.
///
/// # Safety
/// `base` must point at a buffer holding those elements of `tm`.
unsafe fn pack_elems(base: *const u8, tm: &TypeMap, first: usize, count: usize, out: &mut Vec<u8>) {
    for i in first..first + count {
        for &(off, len) in &tm.blocks {
            // SAFETY: the caller's contract; the type map describes element i.
            let s = unsafe {
                std::slice::from_raw_parts(base.offset((i * tm.extent) as isize + off), len)
            };
            out.extend_from_slice(s);
        }
    }
}

/// The blocks of a partitioned send buffer, one region per rank.
fn input_parts<'a, S: PartitionedBuffer + ?Sized>(
    b: &mut Builder<'_, 'a>,
    s: &'a S,
) -> Result<Vec<Reg>, Error> {
    let parts = partition(s.counts(), s.displs(), b.n)?;
    b.elements(s.as_datatype().type_id());
    let tm = type_map(s.as_datatype().type_id());
    let base = s.pointer() as *const u8;
    if tm.is_dense() {
        let span = parts.iter().map(|&(c, d)| c + d).max().unwrap_or(0) * tm.extent;
        // SAFETY: a partitioned buffer holds the elements its counts and displacements name
        // (the contract of the unsafe trait `PartitionedBuffer`), so `span` bytes from `base`
        // are its own, borrowed by `s` for `'a`.
        let all = b.user_read(unsafe { std::slice::from_raw_parts::<'a, u8>(base, span) });
        return Ok(parts
            .iter()
            .map(|&(c, d)| all.at(d * tm.size, c * tm.size))
            .collect());
    }
    let mut v = Vec::new();
    let mut at = Vec::with_capacity(parts.len());
    for &(c, d) in &parts {
        let start = v.len();
        // SAFETY: as above, the partition's elements are the buffer's.
        unsafe { pack_elems(base, &tm, d, c, &mut v) };
        at.push((start, v.len() - start));
    }
    let all = b.owned_from(v);
    Ok(at.into_iter().map(|(o, l)| all.at(o, l)).collect())
}

/// The blocks of a partitioned receive buffer, one region per rank, and the
/// unpacks into the user's buffer (region, output) it needs at the end.
type RecvParts = (Vec<Reg>, Vec<(Reg, usize)>);

/// The blocks of a partitioned receive buffer, and the unpacks it needs.
fn output_parts<'a, R: PartitionedBufferMut + ?Sized>(
    b: &mut Builder<'_, 'a>,
    r: &'a mut R,
) -> Result<RecvParts, Error> {
    let parts = partition(r.counts(), r.displs(), b.n)?;
    b.elements(r.as_datatype().type_id());
    let mut used: Vec<(usize, usize)> = parts.iter().copied().filter(|p| p.0 > 0).collect();
    used.sort_by_key(|p| p.1);
    if used.windows(2).any(|w| w[0].1 + w[0].0 > w[1].1) {
        return Err(Error::new(
            ErrorClass::Arg,
            "the blocks of a receive partition overlap",
        ));
    }
    let dt = r.as_datatype().type_id();
    let tm = type_map(dt);
    let base = r.pointer_mut() as *mut u8;
    if tm.is_dense() {
        let span = parts.iter().map(|&(c, d)| c + d).max().unwrap_or(0) * tm.extent;
        // SAFETY: the partition lies inside the buffer (the contract of the unsafe trait
        // `PartitionedBufferMut`), which `r` borrows exclusively for `'a`.
        let all = b.user_write(unsafe { std::slice::from_raw_parts_mut::<'a, u8>(base, span) });
        let regs = parts
            .iter()
            .map(|&(c, d)| all.at(d * tm.size, c * tm.size))
            .collect();
        return Ok((regs, Vec::new()));
    }
    let total: usize = parts.iter().map(|&(c, _)| c * tm.size).sum();
    let all = b.owned(total);
    let (mut regs, mut unpacks, mut at) = (Vec::new(), Vec::new(), 0);
    for &(c, d) in &parts {
        let reg = all.at(at, c * tm.size);
        at += reg.len;
        // SAFETY: elements `d..d + c` lie inside the buffer (partition contract) that `r`
        // borrows exclusively for `'a`, the schedule's life, and the partition's blocks do
        // not overlap (checked above), so this layout is their only view.
        let layout = unsafe {
            RecvLayout::from_raw(
                crate::datatype::type_map_ref(dt),
                c,
                base.add(d * tm.extent),
            )
        };
        unpacks.push((reg, b.out_layout(layout)));
        regs.push(reg);
    }
    Ok((regs, unpacks))
}

fn finish_parts(b: &mut Builder, unpacks: &[(Reg, usize)]) {
    b.round();
    for &(reg, i) in unpacks {
        b.unpack(reg, i);
    }
    b.round();
}

/// Installs `op` and returns (commutative, element size).
fn set_op<'a, S: Buffer + ?Sized, O: Operation + 'a>(
    b: &mut Builder<'_, 'a>,
    s: &S,
    op: O,
) -> (bool, usize) {
    let dt = s.as_datatype().type_id();
    b.elements(dt);
    let tm = type_map(dt);
    let commutative = op.is_commutative();
    if let Err(e) = op.check(tm.prim, dt) {
        b.fail(e);
    }
    b.reduction(Box::new(op), tm.prim, dt);
    (commutative, tm.size)
}

/// An all-gather-varcount that cannot be planned (a malformed partition)
/// still takes its place in the communicator's call sequence (the ring has
/// one phase), so that later collectives stay matched. The other varcount
/// calls run with empty blocks instead ([`blocks_or_empty`]).
fn skip_phase(b: &mut Builder, e: Error) -> Error {
    b.phase();
    e
}

/// A partition's blocks, or, where it is malformed, a zero-length block per
/// rank with the error recorded: the schedule still runs with them (sending
/// nothing, taking nothing in), so no other rank waits for this one's
/// messages, and completes with the error.
fn blocks_or_empty(b: &mut Builder, parts: Result<Vec<Reg>, Error>) -> Vec<Reg> {
    parts.unwrap_or_else(|e| {
        b.fail(e);
        vec![b.owned(0); b.n as usize]
    })
}

/// [`blocks_or_empty`] for a receive partition.
fn recv_blocks_or_empty(b: &mut Builder, parts: Result<RecvParts, Error>) -> RecvParts {
    parts.unwrap_or_else(|e| (blocks_or_empty(b, Err(e)), Vec::new()))
}

/// Whether a varcount gather, scatter or all-to-all may exchange counts
/// before it plans its data: only a blocking call can wait for that, so the
/// immediate forms stay flat.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    Blocking,
    Immediate,
}

/// The hierarchy a varcount gather, scatter or all-to-all runs on: where
/// `choose` picks the hierarchical form for `op` (so a forced flat
/// algorithm keeps it flat), and for a blocking call only.
fn varcount_tiers(comm: &CommInner, op: Collective, call: Call) -> Option<hier::Tiers> {
    (call == Call::Blocking && choose(comm, op, 0, true) == Algorithm::Hierarchical)
        .then(|| tiers(comm, true))
}

/// Runs the counts exchange of a hierarchical varcount operation
/// (`hier::collect_counts`, a schedule of its own, before the data schedule
/// `b` has started a phase) and returns, on a group's leader, every
/// member's `mine` in member order; elsewhere nothing. With a single group
/// there is nobody to tell, and no rank runs it. A failure is recorded in
/// `b` and leaves the counts zero: the data schedule still runs, so no rank
/// is left waiting.
fn exchange_counts(
    b: &mut Builder,
    comm: &CommInner,
    groups: &[Vec<Rank>],
    skip: Option<usize>,
    mine: &[u64],
) -> Vec<Vec<usize>> {
    if groups.len() < 2 {
        return Vec::new();
    }
    let my = hier::group_of(groups, b.me);
    let members = &groups[my];
    let leads = b.me == members[0] && skip != Some(my);
    let row = mine.len() * 8;
    let mut all = vec![0u8; if leads { members.len() * row } else { 0 }];
    let mut c = Builder::new(comm, "varcount_counts");
    let m = c.owned_from(mine.iter().flat_map(|x| x.to_le_bytes()).collect());
    let a = c.user_write(&mut all);
    hier::collect_counts(&mut c, groups, skip, m, a);
    if let Err(e) = run(c.finish()) {
        b.fail(e);
        all.fill(0);
    }
    let mut rows = Vec::new();
    for j in 0..all.len().checked_div(row).unwrap_or(0) {
        let words = all[j * row..(j + 1) * row].chunks_exact(8);
        let row: Vec<usize> = words
            .map(|w| {
                let v = u64::from_le_bytes(w.try_into().expect("chunks of eight bytes"));
                usize::try_from(v).unwrap_or_else(|_| {
                    b.fail(count_err(format!("a block of {v} bytes in a partition")));
                    0
                })
            })
            .collect();
        rows.push(row);
    }
    rows
}

/// The counts exchange of a hierarchical varcount gather or scatter: each
/// rank's block length (`mine` bytes) goes to its group's leader, except in
/// the root's group (the root knows those counts). Returns the lengths by
/// rank as far as this rank learnt them: its own, and on a leader its
/// members'.
fn block_sizes(
    b: &mut Builder,
    comm: &CommInner,
    groups: &[Vec<Rank>],
    root: Rank,
    mine: usize,
) -> Vec<usize> {
    let skip = hier::group_of(groups, root);
    let rows = exchange_counts(b, comm, groups, Some(skip), &[mine as u64]);
    let mut sizes = vec![0; b.n as usize];
    let members = &groups[hier::group_of(groups, b.me)];
    for (&m, row) in members.iter().zip(&rows) {
        sizes[m as usize] = row[0];
    }
    sizes[b.me as usize] = mine;
    sizes
}

fn count_err(msg: String) -> Error {
    Error::new(ErrorClass::Count, msg)
}

/// Bytes per element of a buffer's datatype signature.
fn elem_size<B: crate::datatype::AsDatatype + ?Sized>(b: &B) -> usize {
    type_map(b.as_datatype().type_id()).size
}

/// The block size in bytes when `len` bytes of `es`-byte elements split
/// into `n` equal blocks of whole elements; otherwise a `Count` error and
/// the largest such block.
fn blocks_of(b: &mut Builder, len: usize, es: usize, what: &str) -> usize {
    let n = b.n as usize;
    let elems = len.checked_div(es).unwrap_or(0);
    if elems % n != 0 {
        b.fail(count_err(format!(
            "{what} of {elems} elements does not split into {n} equal blocks"
        )));
    }
    elems / n * es
}

// ---- plans: one per operation -------------------------------------------------------

/// The hierarchy of `comm` for a call that `choose` sent to the hierarchical
/// algorithms.
fn tiers(comm: &CommInner, commutative: bool) -> hier::Tiers {
    hier::tiers(comm, commutative).expect("`choose` picks Hierarchical only where it is usable")
}
//
// Safety contract of every `plan_*`: the buffers passed must stay valid (the
// receive buffers untouched by others, the send buffers unmodified) until the
// returned schedule completes. Blocking forms wait for it; immediate forms
// tie the buffers to the request's scope.

fn plan_barrier(comm: &CommInner) -> Schedule<'static> {
    let mut b = Builder::new(comm, "barrier");
    match choose(comm, Collective::Barrier, 0, true) {
        Algorithm::Hierarchical => hier::barrier(&mut b, &tiers(comm, true)),
        _ => barrier::dissemination(&mut b),
    }
    b.finish()
}

fn plan_bcast<'a, B: BufferMut + ?Sized>(
    comm: &CommInner,
    root: Rank,
    buf: &'a mut B,
) -> Schedule<'a> {
    let mut b = Builder::new(comm, "bcast");
    let me = b.me;
    let o = output(&mut b, buf, me == root);
    match choose(comm, Collective::Broadcast, o.reg.len, true) {
        Algorithm::ScatterAllGather => bcast::scatter_allgather(&mut b, root, o.reg, o.es),
        Algorithm::Linear => bcast::linear(&mut b, root, o.reg),
        Algorithm::Hierarchical => hier::bcast(&mut b, &tiers(comm, true), root, o.reg),
        _ => bcast::binomial(&mut b, root, o.reg),
    }
    if me != root {
        finish(&mut b, &o, o.reg);
    }
    b.finish()
}

fn plan_reduce<'a, S, R, O>(
    comm: &CommInner,
    root: Rank,
    send: &'a S,
    recv: Option<&'a mut R>,
    op: O,
) -> Schedule<'a>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation + 'a,
{
    let mut b = Builder::new(comm, "reduce");
    let (commutative, _) = set_op(&mut b, send, op);
    let acc = copy_in(&mut b, send);
    let r = match choose(comm, Collective::Reduce, acc.len, commutative) {
        Algorithm::Linear => reduce::linear(&mut b, root, acc),
        Algorithm::Hierarchical => {
            let spare = b.owned(acc.len);
            hier::reduce(&mut b, &tiers(comm, commutative), root, acc, spare)
        }
        _ => {
            let spare = b.owned(acc.len);
            reduce::binomial(&mut b, root, acc, spare, commutative)
        }
    };
    if let Some(recv) = recv.filter(|_| b.me == root) {
        let o = output(&mut b, recv, false);
        finish(&mut b, &o, r);
    }
    b.finish()
}

fn plan_all_reduce<'a, S, R, O>(
    comm: &CommInner,
    send: &'a S,
    recv: &'a mut R,
    op: O,
) -> Schedule<'a>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation + 'a,
{
    let mut b = Builder::new(comm, "allreduce");
    let (commutative, es) = set_op(&mut b, send, op);
    let o = output(&mut b, recv, false);
    let mine = input(&mut b, send);
    let l = mine.len;
    // Work in the user's buffer when it can hold the vector as it is.
    let acc = if o.unpack.is_none() && o.reg.len == l {
        o.reg
    } else {
        b.owned(l)
    };
    b.copy(mine, acc);
    let tmp = b.owned(l);
    let r = match choose(comm, Collective::AllReduce, l, commutative) {
        Algorithm::Rabenseifner if es > 0 => allreduce::rabenseifner(&mut b, acc, tmp, es),
        Algorithm::ReduceBroadcast => allreduce::reduce_bcast(&mut b, acc, tmp, commutative),
        Algorithm::Hierarchical => hier::all_reduce(&mut b, &tiers(comm, commutative), acc, tmp),
        _ => allreduce::recursive_doubling(&mut b, acc, tmp, commutative),
    };
    finish(&mut b, &o, r);
    b.finish()
}

fn plan_reduce_scatter_block<'a, S, R, O>(
    comm: &CommInner,
    send: &'a S,
    recv: &'a mut R,
    op: O,
) -> Schedule<'a>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation + 'a,
{
    let mut b = Builder::new(comm, "reduce_scatter_block");
    let (commutative, _) = set_op(&mut b, send, op);
    let o = output(&mut b, recv, false);
    let n = b.n as usize;
    match choose(comm, Collective::ReduceScatterBlock, o.reg.len, commutative) {
        Algorithm::Hierarchical => {
            let acc = copy_in(&mut b, send);
            let bs = blocks_of(&mut b, acc.len, elem_size(send), "the reduce-scatter input");
            let acc = acc.at(0, bs * n);
            let spare = b.owned(acc.len);
            let out = if o.reg.len == bs { o.reg } else { b.owned(bs) };
            hier::reduce_scatter_block(&mut b, &tiers(comm, commutative), acc, spare, bs, out);
            finish(&mut b, &o, out);
        }
        Algorithm::ReduceThenScatter => {
            let acc = copy_in(&mut b, send);
            let bs = blocks_of(&mut b, acc.len, elem_size(send), "the reduce-scatter input");
            let acc = acc.at(0, bs * n);
            let spare = b.owned(acc.len);
            let out = if o.reg.len == bs { o.reg } else { b.owned(bs) };
            reduce::reduce_then_scatter(&mut b, acc, spare, bs, out, commutative);
            finish(&mut b, &o, out);
        }
        _ => {
            let mine = input(&mut b, send);
            let bs = blocks_of(
                &mut b,
                mine.len,
                elem_size(send),
                "the reduce-scatter input",
            );
            let r = reduce::pairwise(&mut b, mine, bs);
            finish(&mut b, &o, r);
        }
    }
    b.finish()
}

fn plan_scan<'a, S, R, O>(
    comm: &CommInner,
    send: &'a S,
    recv: &'a mut R,
    op: O,
    exclusive: bool,
) -> Schedule<'a>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation + 'a,
{
    let mut b = Builder::new(comm, if exclusive { "exscan" } else { "scan" });
    let (commutative, _) = set_op(&mut b, send, op);
    let o = output(&mut b, recv, false);
    let mine = input(&mut b, send);
    let l = mine.len;
    let kind = if exclusive {
        Collective::ExclusiveScan
    } else {
        Collective::Scan
    };
    let alg = choose(comm, kind, l, commutative);
    // Across sites the scan needs every site's ranks consecutive, whatever
    // the operation (a prefix is a run of ranks); otherwise it runs flat.
    let hierarchy = match alg {
        Algorithm::Hierarchical => hier::tiers(comm, false),
        _ => None,
    };
    // The result goes straight to the user's buffer where it can.
    let result_reg = |b: &mut Builder| {
        if o.unpack.is_none() && o.reg.len == l {
            o.reg
        } else {
            b.owned(l)
        }
    };
    let result = match (alg, hierarchy) {
        (_, Some(t)) => {
            let result = result_reg(&mut b);
            hier::scan(&mut b, &t.groups, mine, result, commutative, exclusive).then_some(result)
        }
        (Algorithm::Linear, None) => {
            let (acc, tmp) = (b.owned(l), b.owned(l));
            b.copy(mine, acc);
            scan::linear(&mut b, acc, tmp, exclusive)
        }
        _ => {
            let result = result_reg(&mut b);
            if !exclusive {
                b.copy(mine, result);
            }
            let partial = b.owned(l);
            b.copy(mine, partial);
            let tmp = b.owned(l);
            scan::recursive_doubling(&mut b, partial, result, tmp, commutative, exclusive)
                .then_some(result)
        }
    };
    if let Some(r) = result {
        finish(&mut b, &o, r);
    }
    b.finish()
}

fn plan_gather<'a, S, R>(
    comm: &CommInner,
    root: Rank,
    send: &'a S,
    recv: Option<&'a mut R>,
) -> Schedule<'a>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
{
    let mut b = Builder::new(comm, "gather");
    let n = b.n as usize;
    let mine = input(&mut b, send);
    let o = recv.map(|r| output(&mut b, r, false));
    let bs = match &o {
        Some(o) => blocks_of(&mut b, o.reg.len, o.es, "the gather receive buffer"),
        None => mine.len,
    };
    let dst = o.as_ref().map(|o| o.reg.at(0, n * bs));
    let blocks = || dst.map(|d| (0..n).map(|r| d.at(r * bs, bs)).collect::<Vec<Reg>>());
    match choose(comm, Collective::Gather, bs, true) {
        Algorithm::Linear => gather::gather_linear(&mut b, root, mine, blocks().as_deref()),
        Algorithm::Hierarchical => {
            let groups = &tiers(comm, true).groups;
            hier::gather(
                &mut b,
                groups,
                root,
                mine,
                &|_| bs,
                blocks().as_deref(),
                false,
            )
        }
        _ => gather::gather_binomial(&mut b, root, mine, bs, dst),
    }
    if let Some(o) = &o {
        finish(&mut b, o, o.reg);
    }
    b.finish()
}

fn plan_gather_varcount<'a, S, R>(
    comm: &CommInner,
    root: Rank,
    send: &'a S,
    recv: Option<&'a mut R>,
    call: Call,
) -> Schedule<'a>
where
    S: Buffer + ?Sized,
    R: PartitionedBufferMut + ?Sized,
{
    let mut b = Builder::new(comm, "gatherv");
    let mine = input(&mut b, send);
    let parts = recv.map(|r| output_parts(&mut b, r));
    let (blocks, unpacks) = match parts {
        Some(p) => {
            let (blocks, unpacks) = recv_blocks_or_empty(&mut b, p);
            (Some(blocks), unpacks)
        }
        None => (None, Vec::new()),
    };
    match varcount_tiers(comm, Collective::Gather, call) {
        Some(t) => {
            let sizes = block_sizes(&mut b, comm, &t.groups, root, mine.len);
            let size = |r: Rank| sizes[r as usize];
            hier::gather(
                &mut b,
                &t.groups,
                root,
                mine,
                &size,
                blocks.as_deref(),
                true,
            );
        }
        None => gather::gather_linear(&mut b, root, mine, blocks.as_deref()),
    }
    finish_parts(&mut b, &unpacks);
    b.finish()
}

fn plan_scatter<'a, S, R>(
    comm: &CommInner,
    root: Rank,
    send: Option<&'a S>,
    recv: &'a mut R,
) -> Schedule<'a>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
{
    let mut b = Builder::new(comm, "scatter");
    let n = b.n as usize;
    let src = send.map(|s| input(&mut b, s));
    let o = output(&mut b, recv, false);
    let bs = match src {
        Some(s) => blocks_of(
            &mut b,
            s.len,
            send.map_or(1, elem_size),
            "the scatter send buffer",
        ),
        None => o.reg.len,
    };
    let out = if o.reg.len == bs {
        o.reg
    } else {
        b.fail(count_err(format!(
            "a scatter block of {bs} bytes does not fit a receive buffer of {} bytes",
            o.reg.len
        )));
        b.owned(bs)
    };
    let src = src.map(|s| s.at(0, n * bs));
    let blocks = || src.map(|s| (0..n).map(|r| s.at(r * bs, bs)).collect::<Vec<Reg>>());
    match choose(comm, Collective::Scatter, bs, true) {
        Algorithm::Linear => gather::scatter_linear(&mut b, root, blocks().as_deref(), out),
        Algorithm::Hierarchical => {
            let groups = &tiers(comm, true).groups;
            hier::scatter(
                &mut b,
                groups,
                root,
                blocks().as_deref(),
                &|_| bs,
                out,
                false,
            )
        }
        _ => gather::scatter_binomial(&mut b, root, src, bs, out),
    }
    finish(&mut b, &o, out);
    b.finish()
}

fn plan_scatter_varcount<'a, S, R>(
    comm: &CommInner,
    root: Rank,
    send: Option<&'a S>,
    recv: &'a mut R,
    call: Call,
) -> Schedule<'a>
where
    S: PartitionedBuffer + ?Sized,
    R: BufferMut + ?Sized,
{
    let mut b = Builder::new(comm, "scatterv");
    let parts = send.map(|s| input_parts(&mut b, s));
    let blocks = parts.map(|p| blocks_or_empty(&mut b, p));
    let o = output(&mut b, recv, false);
    match varcount_tiers(comm, Collective::Scatter, call) {
        Some(t) => {
            let sizes = block_sizes(&mut b, comm, &t.groups, root, o.reg.len);
            let size = |r: Rank| sizes[r as usize];
            hier::scatter(
                &mut b,
                &t.groups,
                root,
                blocks.as_deref(),
                &size,
                o.reg,
                true,
            );
        }
        None => gather::scatter_linear(&mut b, root, blocks.as_deref(), o.reg),
    }
    finish(&mut b, &o, o.reg);
    b.finish()
}

fn plan_all_gather<'a, S, R>(comm: &CommInner, send: &'a S, recv: &'a mut R) -> Schedule<'a>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
{
    let mut b = Builder::new(comm, "allgather");
    let n = b.n as usize;
    let mine = input(&mut b, send);
    let o = output(&mut b, recv, false);
    let bs = blocks_of(&mut b, o.reg.len, o.es, "the all-gather receive buffer");
    match choose(comm, Collective::AllGather, bs, true) {
        Algorithm::Ring => {
            let blocks: Vec<Reg> = (0..n).map(|r| o.reg.at(r * bs, bs)).collect();
            allgather::ring(&mut b, mine, &blocks);
        }
        Algorithm::Hierarchical => {
            let out = o.reg.at(0, n * bs);
            hier::all_gather(&mut b, &tiers(comm, true).groups, mine, bs, out)
        }
        _ => allgather::bruck(&mut b, mine, bs, o.reg.at(0, n * bs)),
    }
    finish(&mut b, &o, o.reg);
    b.finish()
}

fn plan_all_gather_varcount<'a, S, R>(
    comm: &CommInner,
    send: &'a S,
    recv: &'a mut R,
) -> Result<Schedule<'a>, Error>
where
    S: Buffer + ?Sized,
    R: PartitionedBufferMut + ?Sized,
{
    let mut b = Builder::new(comm, "allgatherv");
    let mine = input(&mut b, send);
    let parts = output_parts(&mut b, recv);
    let alg = choose(comm, Collective::AllGather, 0, true);
    let (blocks, unpacks) = parts.map_err(|e| {
        // The hierarchical form takes three phases.
        if alg == Algorithm::Hierarchical {
            b.phase();
            b.phase();
        }
        skip_phase(&mut b, e)
    })?;
    match alg {
        Algorithm::Hierarchical => {
            hier::all_gather_varcount(&mut b, &tiers(comm, true).groups, mine, &blocks)
        }
        _ => allgather::ring(&mut b, mine, &blocks),
    }
    finish_parts(&mut b, &unpacks);
    Ok(b.finish())
}

fn plan_all_to_all<'a, S, R>(comm: &CommInner, send: &'a S, recv: &'a mut R) -> Schedule<'a>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
{
    let mut b = Builder::new(comm, "alltoall");
    let n = b.n as usize;
    let mine = input(&mut b, send);
    let o = output(&mut b, recv, false);
    let sbs = blocks_of(
        &mut b,
        mine.len,
        elem_size(send),
        "the all-to-all send buffer",
    );
    let rbs = blocks_of(&mut b, o.reg.len, o.es, "the all-to-all receive buffer");
    let sends: Vec<Reg> = (0..n).map(|r| mine.at(r * sbs, sbs)).collect();
    let recvs: Vec<Reg> = (0..n).map(|r| o.reg.at(r * rbs, rbs)).collect();
    match choose(comm, Collective::AllToAll, rbs, true) {
        Algorithm::Linear => alltoall::linear(&mut b, &sends, &recvs),
        Algorithm::Hierarchical => hier::all_to_all(
            &mut b,
            &tiers(comm, true).groups,
            &sends,
            &recvs,
            &|_, _| rbs,
            false,
        ),
        _ => alltoall::pairwise(&mut b, &sends, &recvs),
    }
    finish(&mut b, &o, o.reg);
    b.finish()
}

fn plan_all_to_all_varcount<'a, S, R>(
    comm: &CommInner,
    send: &'a S,
    recv: &'a mut R,
    call: Call,
) -> Schedule<'a>
where
    S: PartitionedBuffer + ?Sized,
    R: PartitionedBufferMut + ?Sized,
{
    let mut b = Builder::new(comm, "alltoallv");
    let sends = input_parts(&mut b, send);
    let sends = blocks_or_empty(&mut b, sends);
    let parts = output_parts(&mut b, recv);
    let (recvs, unpacks) = recv_blocks_or_empty(&mut b, parts);
    match varcount_tiers(comm, Collective::AllToAll, call) {
        Some(t) => {
            let my = hier::group_of(&t.groups, b.me);
            let mine = hier::all_to_all_counts(&t.groups, my, &sends, &recvs);
            let rows = exchange_counts(&mut b, comm, &t.groups, None, &mine);
            let sizes = hier::VarSizes::new(&t.groups, b.me, &sends, &recvs, rows);
            let size = |from: Rank, to: Rank| sizes.size(from, to);
            hier::all_to_all(&mut b, &t.groups, &sends, &recvs, &size, true);
        }
        // Block sizes differ between ranks, so only a forced choice applies.
        None => match algorithm::forced_algorithm(Collective::AllToAll) {
            Some(Algorithm::Linear) => alltoall::linear(&mut b, &sends, &recvs),
            _ => alltoall::pairwise(&mut b, &sends, &recvs),
        },
    }
    finish_parts(&mut b, &unpacks);
    b.finish()
}

// ---- library-internal collectives ------------------------------------------------------

pub(crate) fn barrier_impl<C: Communicator + ?Sized>(c: &C) -> Result<(), Error> {
    let comm = &c.as_handle().0;
    if let Some(r) = shm::barrier(comm) {
        return r;
    }
    run(plan_barrier(comm))
}

/// Agrees on a fresh context id among the members of `comm` (collective).
#[track_caller]
pub(crate) fn agree_context(comm: &CommInner) -> u32 {
    let sh = crate::environment::shared();
    let ctx = max_u32(comm, sh.next_context.load(Ordering::SeqCst)).or_abort_in("agree_context");
    sh.next_context.fetch_max(ctx + 2, Ordering::SeqCst);
    ctx
}

/// Agrees on a context among `members` (world ranks) only, using point-to-point
/// messages on the parent's collective context with a tag derived from `tag`
/// (negative, so it never meets the positive tags of collectives).
#[track_caller]
pub(crate) fn agree_context_among(parent: &CommInner, members: &[u32], tag: i32) -> u32 {
    let sh = crate::environment::shared();
    let t = -(tag.rem_euclid(1 << 20) + 2);
    let ranks: Vec<Rank> = members.iter().map(|&w| parent.comm_of(w)).collect();
    let leader = ranks[0];
    let mine = sh.next_context.load(Ordering::SeqCst);
    let ctx = if parent.rank == leader {
        let mut best = mine;
        for &r in &ranks[1..] {
            let mut b = [0u8; 4];
            recv_bytes(parent, Some(r), Some(t), &mut b, true).or_abort_in("agree_context_among");
            best = best.max(u32::from_le_bytes(b));
        }
        for &r in &ranks[1..] {
            send_bytes(parent, r, t, &best.to_le_bytes(), Mode::Standard, true)
                .or_abort_in("agree_context_among");
        }
        best
    } else {
        send_bytes(parent, leader, t, &mine.to_le_bytes(), Mode::Standard, true)
            .or_abort_in("agree_context_among");
        let mut b = [0u8; 4];
        recv_bytes(parent, Some(leader), Some(t), &mut b, true).or_abort_in("agree_context_among");
        u32::from_le_bytes(b)
    };
    sh.next_context.fetch_max(ctx + 2, Ordering::SeqCst);
    ctx
}

/// The largest of the members' `v` (collective over `comm`).
pub(crate) fn max_u32(comm: &CommInner, v: u32) -> Result<u32, Error> {
    let mut out = 0u32;
    run(plan_all_reduce(comm, &v, &mut out, SystemOperation::max()))?;
    Ok(out)
}

/// Broadcasts `buf` from comm rank `root` (collective over `comm`).
pub(crate) fn bcast_bytes(comm: &CommInner, root: Rank, buf: &mut [u8]) -> Result<(), Error> {
    run(plan_bcast(comm, root, buf))
}

#[track_caller]
pub(crate) fn all_gather_i32_pairs(comm: &CommInner, a: i32, b: i32) -> Vec<(i32, i32)> {
    let mine = [a, b];
    let mut all = vec![0i32; 2 * comm.size() as usize];
    let s = plan_all_gather(comm, &mine[..], &mut all[..]);
    run(s).or_abort_in("all_gather_i32_pairs");
    all.chunks_exact(2).map(|c| (c[0], c[1])).collect()
}

fn comm_of<C: Communicator + ?Sized>(c: &C) -> &Arc<CommInner> {
    &c.as_handle().0
}

/// Starts `s` and wraps it in a request over `data`.
fn request<'a, D: ?Sized, Sc: Scope<'a>>(
    comm: &Arc<CommInner>,
    s: Schedule<'a>,
    data: &'a D,
    scope: Sc,
) -> Request<'a, D, Sc> {
    // SAFETY: the schedule views buffers borrowed for `'a`, and the request made here is
    // registered with `scope`, which stops the process rather than let `'a` end before the
    // request (and with it the schedule) has completed (`request::Scope`).
    let id = unsafe { start(s) };
    Request::new(id, comm, data, scope, Post::None)
}

/// Plans a collective over `data`, which the schedule writes, and wraps it in a request that
/// hands `data` back once complete (`Request::wait_for_data`).
fn request_mut<'a, D: ?Sized, Sc: Scope<'a>>(
    comm: &Arc<CommInner>,
    data: &'a mut D,
    scope: Sc,
    plan: impl FnOnce(&'a mut D) -> Schedule<'a>,
) -> Request<'a, D, Sc> {
    let data: *mut D = data;
    // SAFETY: `data` was borrowed exclusively for `'a`. The schedule gets that borrow; the
    // request keeps a shared one that it gives back (or shows) only once it has completed,
    // when the schedule has let go of the buffer, so the two are never used at once.
    let s = plan(unsafe { &mut *data });
    // SAFETY: as in `request`: the request's scope keeps `'a` from ending before it completes.
    let id = unsafe { start(s) };
    // SAFETY: see above.
    Request::new(id, comm, unsafe { &*data }, scope, Post::None)
}

fn not_root(what: &str) -> Error {
    Error::new(
        ErrorClass::Arg,
        format!("{what} is for processes other than the root"),
    )
}

fn only_root(what: &str) -> Error {
    Error::new(ErrorClass::Arg, format!("{what} is for the root process"))
}

// ---- user-facing traits ---------------------------------------------------------------

/// Collective operations over all members of a communicator (rsmpi's
/// `CommunicatorCollectives`), with fallible `try_*` forms.
///
/// Every member must call the same collectives in the same order
/// (MPI-1.2 §4.12), and a blocking call matches only the same blocking call
/// on the other members, an `immediate_*` call only the same immediate call
/// (MPI-3.1 §5.12): blocking barriers and small all-reduces inside one
/// machine run through shared-memory flags that the immediate forms do not
/// use.
pub trait CommunicatorCollectives: Communicator {
    /// Blocks until every member has called it (`MPI_Barrier`, MPI-1.2 §4.3).
    #[track_caller]
    fn barrier(&self) {
        self.try_barrier().or_abort_in("barrier")
    }

    /// Fallible [`barrier`](Self::barrier).
    ///
    /// # Errors
    /// `Other` when a peer is lost.
    fn try_barrier(&self) -> Result<(), Error> {
        barrier_impl(self)
    }

    /// Every member's `sendbuf`, in rank order, into every member's
    /// `recvbuf` (`MPI_Allgather`, §4.7); the receive count per rank is
    /// `recvbuf.count() / size`.
    #[track_caller]
    fn all_gather_into<S, R>(&self, sendbuf: &S, recvbuf: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.try_all_gather_into(sendbuf, recvbuf)
            .or_abort_in("all_gather_into")
    }

    /// Fallible [`all_gather_into`](Self::all_gather_into).
    ///
    /// # Errors
    /// `Count` when contributions and blocks differ in length.
    fn try_all_gather_into<S, R>(&self, sendbuf: &S, recvbuf: &mut R) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        if let Some(r) = shm::gather(comm_of(self), None, sendbuf, Some(&mut *recvbuf)) {
            return r;
        }
        run(plan_all_gather(comm_of(self), sendbuf, recvbuf))
    }

    /// All-gather with a count and displacement per rank (`MPI_Allgatherv`).
    #[track_caller]
    fn all_gather_varcount_into<S, R>(&self, sendbuf: &S, recvbuf: &mut R)
    where
        S: Buffer + ?Sized,
        R: PartitionedBufferMut + ?Sized,
    {
        self.try_all_gather_varcount_into(sendbuf, recvbuf)
            .or_abort_in("all_gather_varcount_into")
    }

    /// Fallible [`all_gather_varcount_into`](Self::all_gather_varcount_into).
    ///
    /// # Errors
    /// `Count` for a partition of the wrong size or a contribution of the
    /// wrong length, `Arg` for overlapping receive blocks.
    fn try_all_gather_varcount_into<S, R>(&self, sendbuf: &S, recvbuf: &mut R) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: PartitionedBufferMut + ?Sized,
    {
        run(plan_all_gather_varcount(comm_of(self), sendbuf, recvbuf)?)
    }

    /// Block `j` of member `i`'s `sendbuf` goes to block `i` of member `j`'s
    /// `recvbuf` (`MPI_Alltoall`, §4.8).
    #[track_caller]
    fn all_to_all_into<S, R>(&self, sendbuf: &S, recvbuf: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.try_all_to_all_into(sendbuf, recvbuf)
            .or_abort_in("all_to_all_into")
    }

    /// Fallible [`all_to_all_into`](Self::all_to_all_into).
    ///
    /// # Errors
    /// `Count` when the buffers do not split into equal blocks or blocks
    /// differ in length between ranks.
    fn try_all_to_all_into<S, R>(&self, sendbuf: &S, recvbuf: &mut R) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        if let Some(r) = shm::all_to_all(comm_of(self), sendbuf, &mut *recvbuf) {
            return r;
        }
        run(plan_all_to_all(comm_of(self), sendbuf, recvbuf))
    }

    /// All-to-all with a count and displacement per rank on both sides
    /// (`MPI_Alltoallv`). Hierarchical across meta hosts (module docs).
    #[track_caller]
    fn all_to_all_varcount_into<S, R>(&self, sendbuf: &S, recvbuf: &mut R)
    where
        S: PartitionedBuffer + ?Sized,
        R: PartitionedBufferMut + ?Sized,
    {
        self.try_all_to_all_varcount_into(sendbuf, recvbuf)
            .or_abort_in("all_to_all_varcount_into")
    }

    /// Fallible [`all_to_all_varcount_into`](Self::all_to_all_varcount_into).
    ///
    /// # Errors
    /// As [`try_all_gather_varcount_into`](Self::try_all_gather_varcount_into).
    fn try_all_to_all_varcount_into<S, R>(&self, sendbuf: &S, recvbuf: &mut R) -> Result<(), Error>
    where
        S: PartitionedBuffer + ?Sized,
        R: PartitionedBufferMut + ?Sized,
    {
        run(plan_all_to_all_varcount(
            comm_of(self),
            sendbuf,
            recvbuf,
            Call::Blocking,
        ))
    }

    /// Reduction of every member's `sendbuf` into every member's `recvbuf`
    /// (`MPI_Allreduce`, §4.9.5).
    #[track_caller]
    fn all_reduce_into<S, R, O>(&self, sendbuf: &S, recvbuf: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.try_all_reduce_into(sendbuf, recvbuf, op)
            .or_abort_in("all_reduce_into")
    }

    /// Fallible [`all_reduce_into`](Self::all_reduce_into).
    ///
    /// # Errors
    /// `Count` when vectors differ in length, `Type` when the operation is
    /// not defined on the datatype.
    fn try_all_reduce_into<S, R, O>(&self, sendbuf: &S, recvbuf: &mut R, op: O) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let op = match shm::reduce(comm_of(self), None, sendbuf, Some(&mut *recvbuf), op) {
            Ok(r) => return r,
            Err(op) => op,
        };
        run(plan_all_reduce(comm_of(self), sendbuf, recvbuf, op))
    }

    /// Reduction, then block `i` of the result to member `i`
    /// (`MPI_Reduce_scatter_block`, MPI-2.2 §5.10.1).
    #[track_caller]
    fn reduce_scatter_block_into<S, R, O>(&self, sendbuf: &S, recvbuf: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.try_reduce_scatter_block_into(sendbuf, recvbuf, op)
            .or_abort_in("reduce_scatter_block_into")
    }

    /// Fallible [`reduce_scatter_block_into`](Self::reduce_scatter_block_into).
    ///
    /// # Errors
    /// As [`try_all_reduce_into`](Self::try_all_reduce_into).
    fn try_reduce_scatter_block_into<S, R, O>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
        op: O,
    ) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        run(plan_reduce_scatter_block(
            comm_of(self),
            sendbuf,
            recvbuf,
            op,
        ))
    }

    /// Inclusive prefix reduction in rank order (`MPI_Scan`, §4.9.7).
    #[track_caller]
    fn scan_into<S, R, O>(&self, sendbuf: &S, recvbuf: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.try_scan_into(sendbuf, recvbuf, op)
            .or_abort_in("scan_into")
    }

    /// Fallible [`scan_into`](Self::scan_into).
    ///
    /// # Errors
    /// As [`try_all_reduce_into`](Self::try_all_reduce_into).
    fn try_scan_into<S, R, O>(&self, sendbuf: &S, recvbuf: &mut R, op: O) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        run(plan_scan(comm_of(self), sendbuf, recvbuf, op, false))
    }

    /// Exclusive prefix reduction (`MPI_Exscan`, MPI-2.2 §5.11.2); rank 0's
    /// `recvbuf` is left unchanged.
    #[track_caller]
    fn exclusive_scan_into<S, R, O>(&self, sendbuf: &S, recvbuf: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.try_exclusive_scan_into(sendbuf, recvbuf, op)
            .or_abort_in("exclusive_scan_into")
    }

    /// Fallible [`exclusive_scan_into`](Self::exclusive_scan_into).
    ///
    /// # Errors
    /// As [`try_all_reduce_into`](Self::try_all_reduce_into).
    fn try_exclusive_scan_into<S, R, O>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
        op: O,
    ) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        run(plan_scan(comm_of(self), sendbuf, recvbuf, op, true))
    }

    /// Starts a barrier (`MPI_Ibarrier`, MPI-3 §5.12.1).
    fn immediate_barrier(&self) -> Request<'static, ()> {
        let comm = comm_of(self);
        request(comm, plan_barrier(comm), &(), crate::request::StaticScope)
    }

    /// Starts an all-gather (`MPI_Iallgather`).
    fn immediate_all_gather_into<'a, S, R, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self);
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_all_gather(comm, sendbuf, recvbuf)
        })
    }

    /// Starts a varcount all-gather (`MPI_Iallgatherv`).
    #[track_caller]
    fn immediate_all_gather_varcount_into<'a, S, R, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + PartitionedBufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self);
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_all_gather_varcount(comm, sendbuf, recvbuf)
                .or_abort_in("immediate_all_gather_varcount_into")
        })
    }

    /// Starts an all-to-all (`MPI_Ialltoall`).
    fn immediate_all_to_all_into<'a, S, R, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self);
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_all_to_all(comm, sendbuf, recvbuf)
        })
    }

    /// Starts a varcount all-to-all (`MPI_Ialltoallv`). Flat across meta
    /// hosts, unlike the blocking form (module docs).
    fn immediate_all_to_all_varcount_into<'a, S, R, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + PartitionedBuffer + ?Sized,
        R: 'a + PartitionedBufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self);
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_all_to_all_varcount(comm, sendbuf, recvbuf, Call::Immediate)
        })
    }

    /// Starts an all-reduce (`MPI_Iallreduce`).
    fn immediate_all_reduce_into<'a, S, R, O, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self);
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_all_reduce(comm, sendbuf, recvbuf, op)
        })
    }

    /// Starts a reduce-scatter-block (`MPI_Ireduce_scatter_block`).
    fn immediate_reduce_scatter_block_into<'a, S, R, O, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self);
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_reduce_scatter_block(comm, sendbuf, recvbuf, op)
        })
    }

    /// Starts an inclusive scan (`MPI_Iscan`).
    fn immediate_scan_into<'a, S, R, O, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self);
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_scan(comm, sendbuf, recvbuf, op, false)
        })
    }

    /// Starts an exclusive scan (`MPI_Iexscan`).
    fn immediate_exclusive_scan_into<'a, S, R, O, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self);
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_scan(comm, sendbuf, recvbuf, op, true)
        })
    }
}

impl<C: Communicator + ?Sized> CommunicatorCollectives for C {}

/// Collective operations with a root process (rsmpi's `Root`), with
/// fallible `try_*` forms.
///
/// The non-root `_into` forms panic when called at the root and the `_root`
/// forms panic elsewhere, as in rsmpi; the `try_*` forms return `Arg` instead.
pub trait Root: AsCommunicator {
    /// The root's rank.
    fn root_rank(&self) -> Rank;

    /// Starts `maxprocs` processes of `command` and returns the
    /// intercommunicator to them (`MPI_Comm_spawn`, MPI-2 §5.3.2;
    /// collective over the communicator, whose root's arguments alone
    /// count). The children form a world of their own, started on the
    /// root's machine with the command's arguments, environment and
    /// directory, standard input closed and output shared with the root;
    /// they reach this group through
    /// [`Communicator::parent`]. A child
    /// that aborts, or ends without finalizing or with a failing status, ends
    /// the whole job; the root's finalize waits for the children.
    ///
    /// # Errors
    /// `ErrorClass::Spawn` where a program cannot be started, or the
    /// communicator spans meta hosts (children could not reach parents
    /// behind a router); `ErrorClass::Arg` for a count below 1;
    /// `ErrorClass::Comm` on an intercommunicator. Every member returns the
    /// same error.
    fn spawn(
        &self,
        command: &std::process::Command,
        maxprocs: Rank,
    ) -> Result<crate::topology::InterCommunicator, Error> {
        let comm = comm_of(self.as_communicator());
        crate::topology::spawn::spawn(comm, self.root_rank(), &[(command, maxprocs)])
    }

    /// As [`Root::spawn`], with several programs (`MPI_Comm_spawn_multiple`):
    /// `maxprocs[i]` processes of `commands[i]`, numbered in that order in
    /// the children's world, whose `Universe::appnum` is `i`.
    ///
    /// # Errors
    /// As for [`Root::spawn`]; `ErrorClass::Arg` also where the two slices
    /// differ in length.
    fn spawn_multiple(
        &self,
        commands: &[std::process::Command],
        maxprocs: &[Rank],
    ) -> Result<crate::topology::InterCommunicator, Error> {
        let comm = comm_of(self.as_communicator());
        let apps: Vec<(&std::process::Command, Rank)> = if commands.len() == maxprocs.len() {
            commands.iter().zip(maxprocs.iter().copied()).collect()
        } else {
            Vec::new()
        };
        crate::topology::spawn::spawn(comm, self.root_rank(), &apps)
    }

    /// Waits for a group to connect to `port` and returns the intercommunicator to it
    /// (`MPI_Comm_accept`, MPI-2 §5.4.2; collective, the port read at the root, which
    /// opened it with [`open_port`](crate::topology::open_port)). The other group may be
    /// of this job or of another one; its members must reach this group's over TCP.
    ///
    /// # Errors
    /// `ErrorClass::Port` for a port the root did not open, or a meeting that failed;
    /// `ErrorClass::Comm` on an intercommunicator. Every member returns the same error.
    fn accept(&self, port: &str) -> Result<crate::topology::InterCommunicator, Error> {
        let comm = comm_of(self.as_communicator());
        crate::topology::accept_on_port(comm, self.root_rank(), port)
    }

    /// Connects this group to the group accepting on `port` (`MPI_Comm_connect`;
    /// collective, the port read at the root) and returns the intercommunicator.
    ///
    /// # Errors
    /// `ErrorClass::Port` for a malformed name, a port nobody listens on or whose token
    /// is refused, or a meeting that failed; `ErrorClass::Comm` on an intercommunicator.
    fn connect(&self, port: &str) -> Result<crate::topology::InterCommunicator, Error> {
        let comm = comm_of(self.as_communicator());
        crate::topology::connect_to_port(comm, self.root_rank(), port)
    }

    /// The root's `buffer` into every member's `buffer` (`MPI_Bcast`, §4.4).
    #[track_caller]
    fn broadcast_into<Buf>(&self, buffer: &mut Buf)
    where
        Buf: BufferMut + ?Sized,
    {
        self.try_broadcast_into(buffer)
            .or_abort_in("broadcast_into")
    }

    /// Fallible [`broadcast_into`](Self::broadcast_into).
    ///
    /// # Errors
    /// `Count` when buffers differ in length between ranks.
    fn try_broadcast_into<Buf>(&self, buffer: &mut Buf) -> Result<(), Error>
    where
        Buf: BufferMut + ?Sized,
    {
        let comm = comm_of(self.as_communicator());
        if let Some(r) = shm::bcast(comm, self.root_rank() as u32, &mut *buffer) {
            return r;
        }
        run(plan_bcast(comm, self.root_rank(), buffer))
    }

    /// Sends `sendbuf` to the root (non-root side of `MPI_Gather`, §4.5).
    #[track_caller]
    fn gather_into<S>(&self, sendbuf: &S)
    where
        S: Buffer + ?Sized,
    {
        assert_ne!(self.as_communicator().rank(), self.root_rank());
        self.try_gather_into(sendbuf).or_abort_in("gather_into")
    }

    /// Fallible [`gather_into`](Self::gather_into).
    ///
    /// # Errors
    /// `Arg` at the root; `Count` when blocks differ in length.
    fn try_gather_into<S>(&self, sendbuf: &S) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank == self.root_rank() {
            return Err(not_root("gather_into"));
        }
        let root = Some(self.root_rank() as u32);
        if let Some(r) = shm::gather(comm, root, sendbuf, None::<&mut [u8]>) {
            return r;
        }
        run(plan_gather(
            comm,
            self.root_rank(),
            sendbuf,
            None::<&mut [u8]>,
        ))
    }

    /// Collects every member's `sendbuf` in rank order (root side of
    /// `MPI_Gather`); the receive count per rank is `recvbuf.count() / size`.
    #[track_caller]
    fn gather_into_root<S, R>(&self, sendbuf: &S, recvbuf: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        assert_eq!(self.as_communicator().rank(), self.root_rank());
        self.try_gather_into_root(sendbuf, recvbuf)
            .or_abort_in("gather_into_root")
    }

    /// Fallible [`gather_into_root`](Self::gather_into_root).
    ///
    /// # Errors
    /// `Arg` away from the root; `Count` when blocks differ in length.
    fn try_gather_into_root<S, R>(&self, sendbuf: &S, recvbuf: &mut R) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank != self.root_rank() {
            return Err(only_root("gather_into_root"));
        }
        let root = Some(self.root_rank() as u32);
        if let Some(r) = shm::gather(comm, root, sendbuf, Some(&mut *recvbuf)) {
            return r;
        }
        run(plan_gather(comm, self.root_rank(), sendbuf, Some(recvbuf)))
    }

    /// Sends `sendbuf` to the root (non-root side of `MPI_Gatherv`).
    /// Hierarchical across meta hosts (module docs).
    #[track_caller]
    fn gather_varcount_into<S>(&self, sendbuf: &S)
    where
        S: Buffer + ?Sized,
    {
        assert_ne!(self.as_communicator().rank(), self.root_rank());
        self.try_gather_varcount_into(sendbuf)
            .or_abort_in("gather_varcount_into")
    }

    /// Fallible [`gather_varcount_into`](Self::gather_varcount_into).
    ///
    /// # Errors
    /// `Arg` at the root.
    fn try_gather_varcount_into<S>(&self, sendbuf: &S) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank == self.root_rank() {
            return Err(not_root("gather_varcount_into"));
        }
        run(plan_gather_varcount(
            comm,
            self.root_rank(),
            sendbuf,
            None::<&mut crate::datatype::PartitionMut<'_, [u8], Vec<Count>, Vec<Count>>>,
            Call::Blocking,
        ))
    }

    /// Collects every member's `sendbuf` into the blocks of `recvbuf` (root
    /// side of `MPI_Gatherv`). Hierarchical across meta hosts (module docs).
    #[track_caller]
    fn gather_varcount_into_root<S, R>(&self, sendbuf: &S, recvbuf: &mut R)
    where
        S: Buffer + ?Sized,
        R: PartitionedBufferMut + ?Sized,
    {
        assert_eq!(self.as_communicator().rank(), self.root_rank());
        self.try_gather_varcount_into_root(sendbuf, recvbuf)
            .or_abort_in("gather_varcount_into_root")
    }

    /// Fallible [`gather_varcount_into_root`](Self::gather_varcount_into_root).
    ///
    /// # Errors
    /// `Arg` away from the root or for overlapping blocks; `Count` for a
    /// partition of the wrong size or a contribution of the wrong length.
    fn try_gather_varcount_into_root<S, R>(&self, sendbuf: &S, recvbuf: &mut R) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: PartitionedBufferMut + ?Sized,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank != self.root_rank() {
            return Err(only_root("gather_varcount_into_root"));
        }
        run(plan_gather_varcount(
            comm,
            self.root_rank(),
            sendbuf,
            Some(recvbuf),
            Call::Blocking,
        ))
    }

    /// Receives this member's block from the root (non-root side of
    /// `MPI_Scatter`, §4.6).
    #[track_caller]
    fn scatter_into<R>(&self, recvbuf: &mut R)
    where
        R: BufferMut + ?Sized,
    {
        assert_ne!(self.as_communicator().rank(), self.root_rank());
        self.try_scatter_into(recvbuf).or_abort_in("scatter_into")
    }

    /// Fallible [`scatter_into`](Self::scatter_into).
    ///
    /// # Errors
    /// `Arg` at the root; `Count` when blocks differ in length.
    fn try_scatter_into<R>(&self, recvbuf: &mut R) -> Result<(), Error>
    where
        R: BufferMut + ?Sized,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank == self.root_rank() {
            return Err(not_root("scatter_into"));
        }
        let root = self.root_rank() as u32;
        if let Some(r) = shm::scatter(comm, root, None::<&[u8]>, &mut *recvbuf) {
            return r;
        }
        run(plan_scatter(comm, self.root_rank(), None::<&[u8]>, recvbuf))
    }

    /// Sends block `i` of `sendbuf` to member `i` (root side of
    /// `MPI_Scatter`); the send count per rank is `sendbuf.count() / size`.
    #[track_caller]
    fn scatter_into_root<S, R>(&self, sendbuf: &S, recvbuf: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        assert_eq!(self.as_communicator().rank(), self.root_rank());
        self.try_scatter_into_root(sendbuf, recvbuf)
            .or_abort_in("scatter_into_root")
    }

    /// Fallible [`scatter_into_root`](Self::scatter_into_root).
    ///
    /// # Errors
    /// `Arg` away from the root; `Count` when blocks differ in length.
    fn try_scatter_into_root<S, R>(&self, sendbuf: &S, recvbuf: &mut R) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank != self.root_rank() {
            return Err(only_root("scatter_into_root"));
        }
        let root = self.root_rank() as u32;
        if let Some(r) = shm::scatter(comm, root, Some(sendbuf), &mut *recvbuf) {
            return r;
        }
        run(plan_scatter(comm, self.root_rank(), Some(sendbuf), recvbuf))
    }

    /// Receives this member's block from the root (non-root side of
    /// `MPI_Scatterv`). Hierarchical across meta hosts (module docs).
    #[track_caller]
    fn scatter_varcount_into<R>(&self, recvbuf: &mut R)
    where
        R: BufferMut + ?Sized,
    {
        assert_ne!(self.as_communicator().rank(), self.root_rank());
        self.try_scatter_varcount_into(recvbuf)
            .or_abort_in("scatter_varcount_into")
    }

    /// Fallible [`scatter_varcount_into`](Self::scatter_varcount_into).
    ///
    /// # Errors
    /// `Arg` at the root; `Count` when the block does not fit.
    fn try_scatter_varcount_into<R>(&self, recvbuf: &mut R) -> Result<(), Error>
    where
        R: BufferMut + ?Sized,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank == self.root_rank() {
            return Err(not_root("scatter_varcount_into"));
        }
        run(plan_scatter_varcount(
            comm,
            self.root_rank(),
            None::<&crate::datatype::Partition<'_, [u8], Vec<Count>, Vec<Count>>>,
            recvbuf,
            Call::Blocking,
        ))
    }

    /// Sends the blocks of `sendbuf` to the members (root side of
    /// `MPI_Scatterv`). Hierarchical across meta hosts (module docs).
    #[track_caller]
    fn scatter_varcount_into_root<S, R>(&self, sendbuf: &S, recvbuf: &mut R)
    where
        S: PartitionedBuffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        assert_eq!(self.as_communicator().rank(), self.root_rank());
        self.try_scatter_varcount_into_root(sendbuf, recvbuf)
            .or_abort_in("scatter_varcount_into_root")
    }

    /// Fallible [`scatter_varcount_into_root`](Self::scatter_varcount_into_root).
    ///
    /// # Errors
    /// `Arg` away from the root; `Count` for a partition of the wrong size
    /// or a block that does not fit.
    fn try_scatter_varcount_into_root<S, R>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
    ) -> Result<(), Error>
    where
        S: PartitionedBuffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank != self.root_rank() {
            return Err(only_root("scatter_varcount_into_root"));
        }
        run(plan_scatter_varcount(
            comm,
            self.root_rank(),
            Some(sendbuf),
            recvbuf,
            Call::Blocking,
        ))
    }

    /// Contributes `sendbuf` to a reduction at the root (non-root side of
    /// `MPI_Reduce`, §4.9.1).
    #[track_caller]
    fn reduce_into<S, O>(&self, sendbuf: &S, op: O)
    where
        S: Buffer + ?Sized,
        O: Operation,
    {
        assert_ne!(self.as_communicator().rank(), self.root_rank());
        self.try_reduce_into(sendbuf, op).or_abort_in("reduce_into")
    }

    /// Fallible [`reduce_into`](Self::reduce_into).
    ///
    /// # Errors
    /// `Arg` at the root; as [`CommunicatorCollectives::try_all_reduce_into`].
    fn try_reduce_into<S, O>(&self, sendbuf: &S, op: O) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        O: Operation,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank == self.root_rank() {
            return Err(not_root("reduce_into"));
        }
        let root = self.root_rank() as u32;
        let op = match shm::reduce(comm, Some(root), sendbuf, None::<&mut [u8]>, op) {
            Ok(r) => return r,
            Err(op) => op,
        };
        run(plan_reduce(
            comm,
            self.root_rank(),
            sendbuf,
            None::<&mut [u8]>,
            op,
        ))
    }

    /// Reduces every member's `sendbuf` into the root's `recvbuf`.
    #[track_caller]
    fn reduce_into_root<S, R, O>(&self, sendbuf: &S, recvbuf: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        assert_eq!(self.as_communicator().rank(), self.root_rank());
        self.try_reduce_into_root(sendbuf, recvbuf, op)
            .or_abort_in("reduce_into_root")
    }

    /// Fallible [`reduce_into_root`](Self::reduce_into_root).
    ///
    /// # Errors
    /// `Arg` away from the root; as [`CommunicatorCollectives::try_all_reduce_into`].
    fn try_reduce_into_root<S, R, O>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
        op: O,
    ) -> Result<(), Error>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let comm = comm_of(self.as_communicator());
        if comm.rank != self.root_rank() {
            return Err(only_root("reduce_into_root"));
        }
        let root = self.root_rank() as u32;
        let op = match shm::reduce(comm, Some(root), sendbuf, Some(&mut *recvbuf), op) {
            Ok(r) => return r,
            Err(op) => op,
        };
        run(plan_reduce(
            comm,
            self.root_rank(),
            sendbuf,
            Some(recvbuf),
            op,
        ))
    }

    /// Starts a broadcast (`MPI_Ibcast`, MPI-3 §5.12.2).
    fn immediate_broadcast_into<'a, Buf, Sc>(
        &self,
        scope: Sc,
        buf: &'a mut Buf,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        request_mut(comm, buf, scope, |buf| {
            plan_bcast(comm, self.root_rank(), buf)
        })
    }

    /// Starts the non-root side of a gather (`MPI_Igather`); the request is
    /// over the send buffer.
    fn immediate_gather_into<'a, S, Sc>(&self, scope: Sc, sendbuf: &'a S) -> Request<'a, S, Sc>
    where
        S: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_ne!(comm.rank, self.root_rank());
        let s = plan_gather(comm, self.root_rank(), sendbuf, None::<&mut [u8]>);
        request(comm, s, sendbuf, scope)
    }

    /// Starts the root side of a gather.
    fn immediate_gather_into_root<'a, S, R, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_eq!(comm.rank, self.root_rank());
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_gather(comm, self.root_rank(), sendbuf, Some(recvbuf))
        })
    }

    /// Starts the non-root side of a varcount gather (`MPI_Igatherv`). Flat
    /// across meta hosts, unlike the blocking form (module docs).
    fn immediate_gather_varcount_into<'a, Sc, S>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
    ) -> Request<'a, S, Sc>
    where
        S: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_ne!(comm.rank, self.root_rank());
        let s = plan_gather_varcount(
            comm,
            self.root_rank(),
            sendbuf,
            None::<&mut crate::datatype::PartitionMut<'_, [u8], Vec<Count>, Vec<Count>>>,
            Call::Immediate,
        );
        request(comm, s, sendbuf, scope)
    }

    /// Starts the root side of a varcount gather (flat, as the non-root
    /// side).
    fn immediate_gather_varcount_into_root<'a, Sc, S, R>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + PartitionedBufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_eq!(comm.rank, self.root_rank());
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_gather_varcount(
                comm,
                self.root_rank(),
                sendbuf,
                Some(recvbuf),
                Call::Immediate,
            )
        })
    }

    /// Starts the non-root side of a scatter (`MPI_Iscatter`).
    fn immediate_scatter_into<'a, Sc, R>(&self, scope: Sc, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_ne!(comm.rank, self.root_rank());
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_scatter(comm, self.root_rank(), None::<&[u8]>, recvbuf)
        })
    }

    /// Starts the root side of a scatter.
    fn immediate_scatter_into_root<'a, Sc, S, R>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_eq!(comm.rank, self.root_rank());
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_scatter(comm, self.root_rank(), Some(sendbuf), recvbuf)
        })
    }

    /// Starts the non-root side of a varcount scatter (`MPI_Iscatterv`).
    /// Flat across meta hosts, unlike the blocking form (module docs).
    fn immediate_scatter_varcount_into<'a, Sc, R>(
        &self,
        scope: Sc,
        recvbuf: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_ne!(comm.rank, self.root_rank());
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_scatter_varcount(
                comm,
                self.root_rank(),
                None::<&crate::datatype::Partition<'_, [u8], Vec<Count>, Vec<Count>>>,
                recvbuf,
                Call::Immediate,
            )
        })
    }

    /// Starts the root side of a varcount scatter (flat, as the non-root
    /// side).
    fn immediate_scatter_varcount_into_root<'a, Sc, S, R>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + PartitionedBuffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_eq!(comm.rank, self.root_rank());
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_scatter_varcount(
                comm,
                self.root_rank(),
                Some(sendbuf),
                recvbuf,
                Call::Immediate,
            )
        })
    }

    /// Starts the non-root side of a reduction (`MPI_Ireduce`); the request
    /// is over the send buffer.
    fn immediate_reduce_into<'a, Sc, S, O>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        op: O,
    ) -> Request<'a, S, Sc>
    where
        S: 'a + Buffer + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_ne!(comm.rank, self.root_rank());
        let s = plan_reduce(comm, self.root_rank(), sendbuf, None::<&mut [u8]>, op);
        request(comm, s, sendbuf, scope)
    }

    /// Starts the root side of a reduction.
    fn immediate_reduce_into_root<'a, Sc, S, R, O>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        let comm = comm_of(self.as_communicator());
        assert_eq!(comm.rank, self.root_rank());
        request_mut(comm, recvbuf, scope, |recvbuf| {
            plan_reduce(comm, self.root_rank(), sendbuf, Some(recvbuf), op)
        })
    }
}

impl Root for crate::topology::Process<'_> {
    fn root_rank(&self) -> Rank {
        self.rank()
    }
}
