//! Collective operations (MPI-1.2 §4), in rsmpi's shape.
//!
//! Every collective runs on the communicator's collective context (`ctx + 1`)
//! with a per-call tag, so point-to-point receives — even with any source and
//! any tag — can never match collective traffic (the SC99 failure, seed 000).
//! Algorithms: dissemination barrier, binomial-tree broadcast and reduce (in
//! rank order, so non-commutative operations are right), ring all-gather,
//! pairwise all-to-all, chain scans.

use std::sync::atomic::Ordering;

use crate::datatype::{
    pack, type_map, Buffer, BufferMut, DatatypeRef, Prim, RecvLayout, UncommittedDatatype,
};
use crate::engine::core::SendBuf;
use crate::environment::shared;
use crate::error::{Error, ErrorClass, OrAbort};
use crate::point_to_point::{post_send, recv_bytes, recv_vec_bytes, send_bytes, Mode};
use crate::topology::sealed::AsHandle;
use crate::topology::{AsCommunicator, CommInner, Communicator};
use crate::Rank;

// ---- byte-level building blocks --------------------------------------------------

fn exchange(
    comm: &CommInner,
    to: Rank,
    from: Rank,
    tag: i32,
    out: &[u8],
    inbuf: &mut [u8],
) -> Result<usize, Error> {
    // SAFETY: we wait for the send before returning, so `out` outlives it.
    let sid = post_send(
        comm,
        to,
        tag,
        SendBuf::Borrowed(unsafe { crate::sys::rawbuf::SendPtr::new(out) }),
        Mode::Standard,
        true,
    )?;
    let st = recv_bytes(comm, Some(from), Some(tag), inbuf, true);
    let sent = shared().wait(sid).result;
    let st = st?;
    sent?;
    Ok(st.byte_count())
}

/// Dissemination barrier: ⌈log2 n⌉ rounds.
pub(crate) fn barrier_impl<C: Communicator + ?Sized>(c: &C) -> Result<(), Error> {
    let comm = &c.as_handle().0;
    let n = comm.size();
    let base = comm.next_coll_tag();
    let r = comm.rank;
    let mut k = 1;
    let mut round = 0;
    while k < n {
        exchange(
            comm,
            (r + k) % n,
            (r - k + n) % n,
            base + round,
            &[],
            &mut [],
        )?;
        k <<= 1;
        round += 1;
    }
    Ok(())
}

/// Binomial-tree broadcast of `buf` from `root`.
fn bcast_bytes(comm: &CommInner, root: Rank, buf: &mut [u8]) -> Result<(), Error> {
    let n = comm.size();
    let tag = comm.next_coll_tag();
    let rel = (comm.rank - root + n) % n;
    let mut mask = 1;
    while mask < n {
        if rel & mask != 0 {
            let src = (rel - mask + root) % n;
            let st = recv_bytes(comm, Some(src), Some(tag), buf, true)?;
            if st.byte_count() != buf.len() {
                return Err(Error::new(
                    ErrorClass::Count,
                    "broadcast buffers differ in length between ranks",
                ));
            }
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if rel + mask < n {
            send_bytes(
                comm,
                (rel + mask + root) % n,
                tag,
                buf,
                Mode::Standard,
                true,
            )?;
        }
        mask >>= 1;
    }
    Ok(())
}

/// Reduces `acc` (this rank's contribution, overwritten) to rank 0 in rank
/// order: after the call rank 0's `acc` holds `x0 ∘ x1 ∘ … ∘ x(n-1)`.
fn reduce_to_zero(
    comm: &CommInner,
    acc: &mut Vec<u8>,
    op: &dyn OpApply,
    prim: Option<Prim>,
    dt: u32,
) -> Result<(), Error> {
    let n = comm.size();
    let r = comm.rank;
    let tag = comm.next_coll_tag();
    let mut mask = 1;
    let mut other = vec![0u8; acc.len()];
    while mask < n {
        if r & mask != 0 {
            send_bytes(comm, r - mask, tag, acc, Mode::Standard, true)?;
            return Ok(());
        }
        if r + mask < n {
            let st = recv_bytes(comm, Some(r + mask), Some(tag), &mut other, true)?;
            if st.byte_count() != acc.len() {
                return Err(Error::new(
                    ErrorClass::Count,
                    "reduction buffers differ in length between ranks",
                ));
            }
            // The child's values come from higher ranks: acc ∘ other.
            op.apply(acc, &mut other, prim, dt)?;
            std::mem::swap(acc, &mut other);
        }
        mask <<= 1;
    }
    Ok(())
}

fn reduce_bytes(
    comm: &CommInner,
    root: Rank,
    mut acc: Vec<u8>,
    op: &dyn OpApply,
    prim: Option<Prim>,
    dt: u32,
) -> Result<Option<Vec<u8>>, Error> {
    reduce_to_zero(comm, &mut acc, op, prim, dt)?;
    let tag = comm.next_coll_tag();
    if root == 0 {
        return Ok((comm.rank == 0).then_some(acc));
    }
    if comm.rank == 0 {
        send_bytes(comm, root, tag, &acc, Mode::Standard, true)?;
        return Ok(None);
    }
    if comm.rank == root {
        let (v, _) = recv_vec_bytes(comm, Some(0), Some(tag), true)?;
        return Ok(Some(v));
    }
    Ok(None)
}

/// Agrees on a fresh context id among the members of `comm` (collective).
pub(crate) fn agree_context(comm: &CommInner) -> u32 {
    let sh = shared();
    let mine = sh.next_context.load(Ordering::SeqCst);
    let mut acc = mine.to_le_bytes().to_vec();
    let r = reduce_bytes(
        comm,
        0,
        std::mem::take(&mut acc),
        &SystemOperation::max(),
        Some(Prim::U32),
        0,
    )
    .or_abort();
    let mut b = r.unwrap_or_else(|| vec![0; 4]);
    bcast_bytes(comm, 0, &mut b).or_abort();
    let ctx = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    sh.next_context.fetch_max(ctx + 2, Ordering::SeqCst);
    ctx
}

/// Agrees on a context among `members` (world ranks) only, using point-to-point
/// messages on the parent's collective context with a tag derived from `tag`.
pub(crate) fn agree_context_among(parent: &CommInner, members: &[u32], tag: i32) -> u32 {
    let sh = shared();
    let t = -(tag.rem_euclid(1 << 20) + 2);
    let ranks: Vec<Rank> = members.iter().map(|&w| parent.comm_of(w)).collect();
    let leader = ranks[0];
    let mine = sh.next_context.load(Ordering::SeqCst);
    let ctx = if parent.rank == leader {
        let mut best = mine;
        for &r in &ranks[1..] {
            let mut b = [0u8; 4];
            recv_bytes(parent, Some(r), Some(t), &mut b, true).or_abort();
            best = best.max(u32::from_le_bytes(b));
        }
        for &r in &ranks[1..] {
            send_bytes(parent, r, t, &best.to_le_bytes(), Mode::Standard, true).or_abort();
        }
        best
    } else {
        send_bytes(parent, leader, t, &mine.to_le_bytes(), Mode::Standard, true).or_abort();
        let mut b = [0u8; 4];
        recv_bytes(parent, Some(leader), Some(t), &mut b, true).or_abort();
        u32::from_le_bytes(b)
    };
    sh.next_context.fetch_max(ctx + 2, Ordering::SeqCst);
    ctx
}

/// Ring all-gather of equal-sized blocks; returns all blocks in rank order.
fn all_gather_bytes(comm: &CommInner, mine: &[u8]) -> Result<Vec<u8>, Error> {
    let n = comm.size() as usize;
    let b = mine.len();
    let r = comm.rank as usize;
    let mut out = vec![0u8; n * b];
    out[r * b..(r + 1) * b].copy_from_slice(mine);
    let tag = comm.next_coll_tag();
    let right = ((r + 1) % n) as Rank;
    let left = ((r + n - 1) % n) as Rank;
    for step in 0..n.saturating_sub(1) {
        let send_blk = (r + n - step) % n;
        let recv_blk = (r + n - step - 1) % n;
        let tmp = out[send_blk * b..(send_blk + 1) * b].to_vec();
        let got = exchange(
            comm,
            right,
            left,
            tag,
            &tmp,
            &mut out[recv_blk * b..(recv_blk + 1) * b],
        )?;
        if got != b {
            return Err(Error::new(
                ErrorClass::Count,
                "all-gather contributions differ in length",
            ));
        }
    }
    Ok(out)
}

pub(crate) fn all_gather_i32_pairs(comm: &CommInner, a: i32, b: i32) -> Vec<(i32, i32)> {
    let mut mine = a.to_le_bytes().to_vec();
    mine.extend_from_slice(&b.to_le_bytes());
    let all = all_gather_bytes(comm, &mine).or_abort();
    all.chunks_exact(8)
        .map(|c| {
            (
                i32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                i32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            )
        })
        .collect()
}

// ---- operations ---------------------------------------------------------------------

#[doc(hidden)]
pub trait OpApply {
    /// `upper = lower ∘ upper`, element-wise over `prim` values.
    fn apply(
        &self,
        lower: &[u8],
        upper: &mut [u8],
        prim: Option<Prim>,
        dt: u32,
    ) -> Result<(), Error>;
}

/// A reduction operation (MPI-1.2 §4.9).
pub trait Operation: OpApply {
    /// Whether operands may be combined in any order.
    fn is_commutative(&self) -> bool {
        true
    }
}

impl<T: OpApply + ?Sized> OpApply for &T {
    fn apply(
        &self,
        lower: &[u8],
        upper: &mut [u8],
        prim: Option<Prim>,
        dt: u32,
    ) -> Result<(), Error> {
        (**self).apply(lower, upper, prim, dt)
    }
}
impl<T: Operation + ?Sized> Operation for &T {
    fn is_commutative(&self) -> bool {
        (**self).is_commutative()
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum SysOp {
    Max,
    Min,
    Sum,
    Product,
    LogicalAnd,
    BitwiseAnd,
    LogicalOr,
    BitwiseOr,
    LogicalXor,
    BitwiseXor,
}

/// A predefined reduction operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SystemOperation(SysOp);

impl SystemOperation {
    /// Maximum.
    pub fn max() -> Self {
        SystemOperation(SysOp::Max)
    }
    /// Minimum.
    pub fn min() -> Self {
        SystemOperation(SysOp::Min)
    }
    /// Sum.
    pub fn sum() -> Self {
        SystemOperation(SysOp::Sum)
    }
    /// Product.
    pub fn product() -> Self {
        SystemOperation(SysOp::Product)
    }
    /// Logical and.
    pub fn logical_and() -> Self {
        SystemOperation(SysOp::LogicalAnd)
    }
    /// Bitwise and.
    pub fn bitwise_and() -> Self {
        SystemOperation(SysOp::BitwiseAnd)
    }
    /// Logical or.
    pub fn logical_or() -> Self {
        SystemOperation(SysOp::LogicalOr)
    }
    /// Bitwise or.
    pub fn bitwise_or() -> Self {
        SystemOperation(SysOp::BitwiseOr)
    }
    /// Logical exclusive or.
    pub fn logical_xor() -> Self {
        SystemOperation(SysOp::LogicalXor)
    }
    /// Bitwise exclusive or.
    pub fn bitwise_xor() -> Self {
        SystemOperation(SysOp::BitwiseXor)
    }
}

macro_rules! arith {
    ($op:expr, $lo:expr, $up:expr, $t:ty, int) => {{
        let n = std::mem::size_of::<$t>();
        for (a, b) in $lo.chunks_exact(n).zip($up.chunks_exact_mut(n)) {
            let x = <$t>::from_le_bytes(a.try_into().expect("chunk size"));
            let y = <$t>::from_le_bytes((&*b).try_into().expect("chunk size"));
            let z: $t = match $op {
                SysOp::Max => x.max(y),
                SysOp::Min => x.min(y),
                SysOp::Sum => x.wrapping_add(y),
                SysOp::Product => x.wrapping_mul(y),
                SysOp::LogicalAnd => ((x != 0) && (y != 0)) as $t,
                SysOp::LogicalOr => ((x != 0) || (y != 0)) as $t,
                SysOp::LogicalXor => ((x != 0) != (y != 0)) as $t,
                SysOp::BitwiseAnd => x & y,
                SysOp::BitwiseOr => x | y,
                SysOp::BitwiseXor => x ^ y,
            };
            b.copy_from_slice(&z.to_le_bytes());
        }
        Ok(())
    }};
    ($op:expr, $lo:expr, $up:expr, $t:ty, float) => {{
        let n = std::mem::size_of::<$t>();
        for (a, b) in $lo.chunks_exact(n).zip($up.chunks_exact_mut(n)) {
            let x = <$t>::from_le_bytes(a.try_into().expect("chunk size"));
            let y = <$t>::from_le_bytes((&*b).try_into().expect("chunk size"));
            let z: $t = match $op {
                SysOp::Max => x.max(y),
                SysOp::Min => x.min(y),
                SysOp::Sum => x + y,
                SysOp::Product => x * y,
                other => {
                    return Err(Error::new(
                        ErrorClass::Type,
                        format!("{other:?} is not defined on floating-point values"),
                    ))
                }
            };
            b.copy_from_slice(&z.to_le_bytes());
        }
        Ok(())
    }};
}

impl OpApply for SystemOperation {
    fn apply(
        &self,
        lower: &[u8],
        upper: &mut [u8],
        prim: Option<Prim>,
        _dt: u32,
    ) -> Result<(), Error> {
        let Some(p) = prim else {
            return Err(Error::new(
                ErrorClass::Type,
                "predefined reductions need a datatype of one predefined kind",
            ));
        };
        let op = self.0;
        match p {
            Prim::I8 => arith!(op, lower, upper, i8, int),
            Prim::U8 => arith!(op, lower, upper, u8, int),
            Prim::Bool => arith!(op, lower, upper, u8, int),
            Prim::I16 => arith!(op, lower, upper, i16, int),
            Prim::U16 => arith!(op, lower, upper, u16, int),
            Prim::I32 => arith!(op, lower, upper, i32, int),
            Prim::U32 => arith!(op, lower, upper, u32, int),
            Prim::I64 => arith!(op, lower, upper, i64, int),
            Prim::U64 => arith!(op, lower, upper, u64, int),
            Prim::I128 => arith!(op, lower, upper, i128, int),
            Prim::U128 => arith!(op, lower, upper, u128, int),
            Prim::F32 => arith!(op, lower, upper, f32, float),
            Prim::F64 => arith!(op, lower, upper, f64, float),
        }
    }
}
impl Operation for SystemOperation {}

/// A read-only buffer of a given datatype handed to user operations.
#[derive(Copy, Clone, Debug)]
pub struct DynBuffer<'a> {
    bytes: &'a [u8],
    datatype: DatatypeRef<'a>,
}

impl<'a> DynBuffer<'a> {
    /// Whether the elements are `T`.
    pub fn is<T: crate::datatype::Equivalence>(&self) -> bool {
        T::equivalent_datatype().type_id() == self.datatype.type_id()
    }

    /// The elements as `&[T]` when they are `T` and suitably aligned.
    pub fn downcast<T: crate::datatype::Equivalence>(self) -> Option<&'a [T]> {
        if !self.is::<T>() || self.bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
            return None;
        }
        let n = self.bytes.len() / std::mem::size_of::<T>().max(1);
        // SAFETY: the datatype is T's (checked), the pointer is aligned (checked)
        // and the bytes hold `n` whole values written as T.
        Some(unsafe { std::slice::from_raw_parts(self.bytes.as_ptr() as *const T, n) })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        let s = crate::datatype::size_of_type(self.datatype.type_id());
        self.bytes.len().checked_div(s).unwrap_or(0)
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// A writable buffer handed to user operations.
#[derive(Debug)]
pub struct DynBufferMut<'a> {
    bytes: &'a mut [u8],
    datatype: DatatypeRef<'a>,
}

impl<'a> DynBufferMut<'a> {
    /// Whether the elements are `T`.
    pub fn is<T: crate::datatype::Equivalence>(&self) -> bool {
        T::equivalent_datatype().type_id() == self.datatype.type_id()
    }

    /// The elements as `&mut [T]` when they are `T` and suitably aligned.
    pub fn downcast<T: crate::datatype::Equivalence>(self) -> Option<&'a mut [T]> {
        if !self.is::<T>() || self.bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
            return None;
        }
        let n = self.bytes.len() / std::mem::size_of::<T>().max(1);
        // SAFETY: as in `DynBuffer::downcast`, and the borrow is exclusive.
        Some(unsafe { std::slice::from_raw_parts_mut(self.bytes.as_mut_ptr() as *mut T, n) })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        let s = crate::datatype::size_of_type(self.datatype.type_id());
        self.bytes.len().checked_div(s).unwrap_or(0)
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

type UserFn<'a> = dyn Fn(DynBuffer, DynBufferMut) + Sync + 'a;

/// A reduction operation from a closure `f(invec, inoutvec)` that must set
/// `inoutvec = invec ∘ inoutvec`.
pub struct UserOperation<'a> {
    commute: bool,
    f: Box<UserFn<'a>>,
}

impl<'a> UserOperation<'a> {
    /// A non-commutative (but associative) operation: applied in rank order.
    pub fn associative<F: Fn(DynBuffer, DynBufferMut) + Sync + 'a>(function: F) -> Self {
        Self::new(false, function)
    }
    /// A commutative operation.
    pub fn commutative<F: Fn(DynBuffer, DynBufferMut) + Sync + 'a>(function: F) -> Self {
        Self::new(true, function)
    }
    /// An operation with explicit commutativity.
    pub fn new<F: Fn(DynBuffer, DynBufferMut) + Sync + 'a>(commute: bool, function: F) -> Self {
        UserOperation {
            commute,
            f: Box::new(function),
        }
    }
}

impl std::fmt::Debug for UserOperation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserOperation {{ commute: {} }}", self.commute)
    }
}

impl OpApply for UserOperation<'_> {
    fn apply(
        &self,
        lower: &[u8],
        upper: &mut [u8],
        _prim: Option<Prim>,
        dt: u32,
    ) -> Result<(), Error> {
        // Copy to aligned storage so closures can downcast to their element type.
        let lo: Vec<u128> = aligned_copy(lower);
        let mut up: Vec<u128> = aligned_copy(upper);
        let n = upper.len();
        {
            let lo_b = &bytemuck_u128(&lo)[..n];
            let up_b = &mut bytemuck_u128_mut(&mut up)[..n];
            let datatype = crate::datatype::DatatypeRef::__from_id(dt);
            (self.f)(
                DynBuffer {
                    bytes: lo_b,
                    datatype,
                },
                DynBufferMut {
                    bytes: up_b,
                    datatype,
                },
            );
        }
        upper.copy_from_slice(&bytemuck_u128(&up)[..n]);
        Ok(())
    }
}
impl Operation for UserOperation<'_> {
    fn is_commutative(&self) -> bool {
        self.commute
    }
}

fn aligned_copy(b: &[u8]) -> Vec<u128> {
    let mut v = vec![0u128; b.len().div_ceil(16)];
    bytemuck_u128_mut(&mut v)[..b.len()].copy_from_slice(b);
    v
}

fn bytemuck_u128(v: &[u128]) -> &[u8] {
    // SAFETY: u128 has no padding; any u128 memory is valid bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 16) }
}

fn bytemuck_u128_mut(v: &mut [u128]) -> &mut [u8] {
    // SAFETY: as above, and every byte pattern is a valid u128.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 16) }
}

/// Applies `op` locally: `inoutbuf = inbuf ∘ inoutbuf` (`MPI_Reduce_local`).
pub fn reduce_local_into<S, R, O>(inbuf: &S, inoutbuf: &mut R, op: O)
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    let lower = pack(inbuf).bytes().to_vec();
    let dt = inbuf.as_datatype().type_id();
    let prim = type_map(dt).prim;
    let layout = RecvLayout::of(inoutbuf);
    // SAFETY: `inoutbuf` is exclusively borrowed for this call.
    let Some(upper) = (unsafe { layout.dense() }) else {
        crate::error::fatal(&Error::new(
            ErrorClass::Type,
            "reduce_local_into needs a contiguous buffer",
        ));
    };
    if upper.len() != lower.len() {
        crate::error::fatal(&Error::new(
            ErrorClass::Count,
            "reduce_local_into buffers differ in length",
        ));
    }
    op.apply(&lower, upper, prim, dt).or_abort();
}

// ---- user-facing traits ---------------------------------------------------------------

fn dense_out<R: BufferMut + ?Sized>(buf: &mut R) -> Result<(RecvLayout, usize), Error> {
    let layout = RecvLayout::of(buf);
    let cap = layout.capacity();
    Ok((layout, cap))
}

fn write_out(layout: &RecvLayout, data: &[u8]) -> Result<(), Error> {
    if data.len() > layout.capacity() {
        return Err(crate::error::truncate(data.len(), layout.capacity()));
    }
    // SAFETY: the receive buffer is exclusively borrowed by the calling collective.
    unsafe { layout.unpack(data) };
    Ok(())
}

fn reduce_setup<S: Buffer + ?Sized>(sendbuf: &S) -> (Vec<u8>, Option<Prim>, u32) {
    let dt = sendbuf.as_datatype().type_id();
    (pack(sendbuf).bytes().to_vec(), type_map(dt).prim, dt)
}

/// Collective operations over all members of a communicator.
pub trait CommunicatorCollectives: Communicator {
    /// Blocks until every member has called it (`MPI_Barrier`).
    fn barrier(&self) {
        barrier_impl(self).or_abort()
    }

    /// Every member's `sendbuf`, in rank order, into every member's `recvbuf`.
    fn all_gather_into<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
    ) {
        let comm = &self.as_handle().0;
        let all = all_gather_bytes(comm, pack(sendbuf).bytes()).or_abort();
        let (l, _) = dense_out(recvbuf).or_abort();
        write_out(&l, &all).or_abort();
    }

    /// Block `j` of member `i`'s `sendbuf` goes to block `i` of member `j`'s `recvbuf`.
    fn all_to_all_into<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
    ) {
        let comm = &self.as_handle().0;
        let n = comm.size() as usize;
        let data = pack(sendbuf).bytes().to_vec();
        if data.len() % n != 0 {
            crate::error::fatal(&Error::new(
                ErrorClass::Count,
                "all_to_all send buffer is not a multiple of the communicator size",
            ));
        }
        let b = data.len() / n;
        let r = comm.rank as usize;
        let mut out = vec![0u8; n * b];
        out[r * b..(r + 1) * b].copy_from_slice(&data[r * b..(r + 1) * b]);
        let tag = comm.next_coll_tag();
        for step in 1..n {
            let to = (r + step) % n;
            let from = (r + n - step) % n;
            let got = exchange(
                comm,
                to as Rank,
                from as Rank,
                tag,
                &data[to * b..(to + 1) * b],
                &mut out[from * b..(from + 1) * b],
            )
            .or_abort();
            if got != b {
                crate::error::fatal(&Error::new(
                    ErrorClass::Count,
                    "all_to_all blocks differ in length",
                ));
            }
        }
        let (l, _) = dense_out(recvbuf).or_abort();
        write_out(&l, &out).or_abort();
    }

    /// Reduction of every member's `sendbuf` into every member's `recvbuf`.
    fn all_reduce_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
        op: O,
    ) {
        let comm = &self.as_handle().0;
        let (acc, prim, dt) = reduce_setup(sendbuf);
        let len = acc.len();
        let mut res = reduce_bytes(comm, 0, acc, &op, prim, dt)
            .or_abort()
            .unwrap_or_else(|| vec![0; len]);
        bcast_bytes(comm, 0, &mut res).or_abort();
        let (l, _) = dense_out(recvbuf).or_abort();
        write_out(&l, &res).or_abort();
    }

    /// Reduction, then block `i` of the result to member `i`.
    fn reduce_scatter_block_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
        op: O,
    ) {
        let comm = &self.as_handle().0;
        let (acc, prim, dt) = reduce_setup(sendbuf);
        let n = comm.size() as usize;
        let b = acc.len() / n;
        let res = reduce_bytes(comm, 0, acc, &op, prim, dt).or_abort();
        let tag = comm.next_coll_tag();
        let (l, _) = dense_out(recvbuf).or_abort();
        if comm.rank == 0 {
            let res = res.unwrap_or_default();
            for i in 1..n {
                send_bytes(
                    comm,
                    i as Rank,
                    tag,
                    &res[i * b..(i + 1) * b],
                    Mode::Standard,
                    true,
                )
                .or_abort();
            }
            write_out(&l, &res[..b]).or_abort();
        } else {
            let (v, _) = recv_vec_bytes(comm, Some(0), Some(tag), true).or_abort();
            write_out(&l, &v).or_abort();
        }
    }

    /// Inclusive prefix reduction in rank order.
    fn scan_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
        op: O,
    ) {
        let comm = &self.as_handle().0;
        let (mut acc, prim, dt) = reduce_setup(sendbuf);
        let tag = comm.next_coll_tag();
        if comm.rank > 0 {
            let (prev, _) = recv_vec_bytes(comm, Some(comm.rank - 1), Some(tag), true).or_abort();
            op.apply(&prev, &mut acc, prim, dt).or_abort();
        }
        if comm.rank + 1 < comm.size() {
            send_bytes(comm, comm.rank + 1, tag, &acc, Mode::Standard, true).or_abort();
        }
        let (l, _) = dense_out(recvbuf).or_abort();
        write_out(&l, &acc).or_abort();
    }

    /// Exclusive prefix reduction; rank 0's `recvbuf` is left unchanged.
    fn exclusive_scan_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
        op: O,
    ) {
        let comm = &self.as_handle().0;
        let (mine, prim, dt) = reduce_setup(sendbuf);
        let tag = comm.next_coll_tag();
        let prev = if comm.rank > 0 {
            Some(
                recv_vec_bytes(comm, Some(comm.rank - 1), Some(tag), true)
                    .or_abort()
                    .0,
            )
        } else {
            None
        };
        if comm.rank + 1 < comm.size() {
            let mut next = mine.clone();
            if let Some(p) = &prev {
                op.apply(p, &mut next, prim, dt).or_abort();
            }
            send_bytes(comm, comm.rank + 1, tag, &next, Mode::Standard, true).or_abort();
        }
        if let Some(p) = prev {
            let (l, _) = dense_out(recvbuf).or_abort();
            write_out(&l, &p).or_abort();
        }
    }
}

impl<C: Communicator + ?Sized> CommunicatorCollectives for C {}

/// Collective operations with a root process.
pub trait Root: AsCommunicator {
    /// The root's rank.
    fn root_rank(&self) -> Rank;

    /// The root's `buffer` into every member's `buffer` (`MPI_Bcast`).
    fn broadcast_into<Buf: BufferMut + ?Sized>(&self, buffer: &mut Buf) {
        let comm = &self.as_communicator().as_handle().0;
        let layout = RecvLayout::of(buffer);
        // SAFETY: `buffer` is exclusively borrowed for this call.
        match unsafe { layout.dense() } {
            Some(d) => bcast_bytes(comm, self.root_rank(), d).or_abort(),
            None => {
                let mut tmp = vec![0u8; layout.capacity()];
                if comm.rank == self.root_rank() {
                    // The root packs its strided data first.
                    let packed = pack_layout(&layout);
                    tmp.copy_from_slice(&packed);
                }
                bcast_bytes(comm, self.root_rank(), &mut tmp).or_abort();
                write_out(&layout, &tmp).or_abort();
            }
        }
    }

    /// Sends `sendbuf` to the root (non-root side of `MPI_Gather`).
    fn gather_into<S: Buffer + ?Sized>(&self, sendbuf: &S) {
        let comm = &self.as_communicator().as_handle().0;
        assert_ne!(
            comm.rank,
            self.root_rank(),
            "gather_into is for non-root processes"
        );
        let tag = comm.next_coll_tag();
        send_bytes(
            comm,
            self.root_rank(),
            tag,
            pack(sendbuf).bytes(),
            Mode::Standard,
            true,
        )
        .or_abort();
    }

    /// Collects every member's `sendbuf` in rank order (root side).
    fn gather_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
    ) {
        let comm = &self.as_communicator().as_handle().0;
        assert_eq!(
            comm.rank,
            self.root_rank(),
            "gather_into_root is for the root process"
        );
        let tag = comm.next_coll_tag();
        let mine = pack(sendbuf).bytes().to_vec();
        let b = mine.len();
        let n = comm.size() as usize;
        let mut out = vec![0u8; n * b];
        for i in 0..n {
            if i as Rank == comm.rank {
                out[i * b..(i + 1) * b].copy_from_slice(&mine);
            } else {
                let st = recv_bytes(
                    comm,
                    Some(i as Rank),
                    Some(tag),
                    &mut out[i * b..(i + 1) * b],
                    true,
                )
                .or_abort();
                if st.byte_count() != b {
                    crate::error::fatal(&Error::new(
                        ErrorClass::Count,
                        "gather contributions differ in length",
                    ));
                }
            }
        }
        let (l, _) = dense_out(recvbuf).or_abort();
        write_out(&l, &out).or_abort();
    }

    /// Receives this member's block from the root (non-root side of `MPI_Scatter`).
    fn scatter_into<R: BufferMut + ?Sized>(&self, recvbuf: &mut R) {
        let comm = &self.as_communicator().as_handle().0;
        assert_ne!(
            comm.rank,
            self.root_rank(),
            "scatter_into is for non-root processes"
        );
        let tag = comm.next_coll_tag();
        let (v, _) = recv_vec_bytes(comm, Some(self.root_rank()), Some(tag), true).or_abort();
        let (l, _) = dense_out(recvbuf).or_abort();
        write_out(&l, &v).or_abort();
    }

    /// Sends block `i` of `sendbuf` to member `i` (root side).
    fn scatter_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
    ) {
        let comm = &self.as_communicator().as_handle().0;
        assert_eq!(
            comm.rank,
            self.root_rank(),
            "scatter_into_root is for the root process"
        );
        let tag = comm.next_coll_tag();
        let data = pack(sendbuf).bytes().to_vec();
        let n = comm.size() as usize;
        let b = data.len() / n;
        for i in 0..n {
            if i as Rank != comm.rank {
                send_bytes(
                    comm,
                    i as Rank,
                    tag,
                    &data[i * b..(i + 1) * b],
                    Mode::Standard,
                    true,
                )
                .or_abort();
            }
        }
        let r = comm.rank as usize;
        let (l, _) = dense_out(recvbuf).or_abort();
        write_out(&l, &data[r * b..(r + 1) * b]).or_abort();
    }

    /// Contributes `sendbuf` to a reduction at the root (non-root side).
    fn reduce_into<S: Buffer + ?Sized, O: Operation>(&self, sendbuf: &S, op: O) {
        let comm = &self.as_communicator().as_handle().0;
        assert_ne!(
            comm.rank,
            self.root_rank(),
            "reduce_into is for non-root processes"
        );
        let (acc, prim, dt) = reduce_setup(sendbuf);
        reduce_bytes(comm, self.root_rank(), acc, &op, prim, dt).or_abort();
    }

    /// Reduces every member's `sendbuf` into the root's `recvbuf`.
    fn reduce_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        sendbuf: &S,
        recvbuf: &mut R,
        op: O,
    ) {
        let comm = &self.as_communicator().as_handle().0;
        assert_eq!(
            comm.rank,
            self.root_rank(),
            "reduce_into_root is for the root process"
        );
        let (acc, prim, dt) = reduce_setup(sendbuf);
        let res = reduce_bytes(comm, self.root_rank(), acc, &op, prim, dt)
            .or_abort()
            .unwrap_or_default();
        let (l, _) = dense_out(recvbuf).or_abort();
        write_out(&l, &res).or_abort();
    }
}

fn pack_layout(l: &RecvLayout) -> Vec<u8> {
    let mut out = Vec::with_capacity(l.capacity());
    for i in 0..l.count {
        for &(off, len) in &l.tm.blocks {
            // SAFETY: the layout describes the caller's exclusively borrowed buffer.
            let s = unsafe {
                std::slice::from_raw_parts(
                    l.base.offset(i as isize * l.tm.extent as isize + off),
                    len,
                )
            };
            out.extend_from_slice(s);
        }
    }
    out
}

impl Root for crate::topology::Process<'_> {
    fn root_rank(&self) -> Rank {
        self.rank()
    }
}
