//! Reduction operations (MPI-1.2 §4.9): predefined ones, max-loc/min-loc on
//! [`ValueIndex`] pairs, and user operations from closures.

use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::{OnceLock, RwLock};

use crate::datatype::{
    pack, register_distinct, type_map, AsDatatype, Buffer, BufferMut, Collection, DatatypeRef,
    Equivalence, Pointer, PointerMut, Prim, RecvLayout, TypeMap, UncommittedDatatype,
};
use crate::environment::OrAbort;
use crate::error::{Error, ErrorClass};
use crate::Count;

#[doc(hidden)]
pub trait OpApply {
    /// `upper = lower ∘ upper`, element-wise over values of datatype `dt`
    /// given as signature bytes; `prim` is `dt`'s predefined kind, if any.
    fn apply(
        &self,
        lower: &[u8],
        upper: &mut [u8],
        prim: Option<Prim>,
        dt: u32,
    ) -> Result<(), Error>;

    /// Whether the operation is defined on datatype `dt`; checked when a
    /// collective starts, so that every rank reports the same error.
    fn check(&self, _prim: Option<Prim>, _dt: u32) -> Result<(), Error> {
        Ok(())
    }
}

/// A reduction operation (MPI-1.2 §4.9).
///
/// Operations are `Send`: a nonblocking collective keeps its operation until
/// it completes, and whichever thread drives the library's progress may apply
/// it. [`SystemOperation`] and `&UserOperation` qualify (a user closure must be
/// `Sync`, as in rsmpi).
pub trait Operation: OpApply + Send {
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
    fn check(&self, prim: Option<Prim>, dt: u32) -> Result<(), Error> {
        (**self).check(prim, dt)
    }
}
impl<T: Operation + Sync + ?Sized> Operation for &T {
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
    MaxLoc,
    MinLoc,
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
    /// The largest value and the smallest index that holds it (`MPI_MAXLOC`,
    /// MPI-1.2 §4.9.3), on buffers of [`ValueIndex`]. Not in rsmpi.
    ///
    /// Which pair wins when a value is NaN is unspecified.
    pub fn max_loc() -> Self {
        SystemOperation(SysOp::MaxLoc)
    }
    /// The smallest value and the smallest index that holds it
    /// (`MPI_MINLOC`), on buffers of [`ValueIndex`]. Not in rsmpi.
    pub fn min_loc() -> Self {
        SystemOperation(SysOp::MinLoc)
    }
}

/// Plain numeric types: every bit pattern is a value, so bytes may be viewed
/// as them.
///
/// # Safety
/// Only for types without padding or invalid bit patterns.
unsafe trait Plain: Copy {}
macro_rules! plain {
    ($($t:ty),*) => {$(
        // SAFETY: primitive integers and floats have neither padding nor invalid values.
        unsafe impl Plain for $t {}
    )*};
}
plain!(i8, u8, i16, u16, i32, u32, i64, u64, i128, u128, f32, f64);

/// `upper[i] = f(lower[i], upper[i])` over the whole elements of both.
///
/// The operation is chosen before the loop, one loop per operation and type,
/// so the compiler can vectorise it: with the choice inside the loop, a 2-rank
/// 4 MiB `f32` sum all-reduce spent a quarter of its time here.
fn zip_with<T: Plain>(lower: &[u8], upper: &mut [u8], f: impl Fn(T, T) -> T) {
    let n = std::mem::size_of::<T>();
    let len = lower.len().min(upper.len()) / n * n;
    let (lower, upper) = (&lower[..len], &mut upper[..len]);
    let align = std::mem::align_of::<T>();
    if lower.as_ptr() as usize % align == 0 && upper.as_ptr() as usize % align == 0 {
        // SAFETY: both ranges are aligned for T and hold `len / n` whole
        // values; T has no invalid bit patterns (`Plain`); the views keep the
        // borrows they come from (shared and exclusive, so they do not overlap).
        let (lo, up) = unsafe {
            (
                std::slice::from_raw_parts(lower.as_ptr() as *const T, len / n),
                std::slice::from_raw_parts_mut(upper.as_mut_ptr() as *mut T, len / n),
            )
        };
        for (x, y) in lo.iter().zip(up.iter_mut()) {
            *y = f(*x, *y);
        }
    } else {
        for (a, b) in lower.chunks_exact(n).zip(upper.chunks_exact_mut(n)) {
            // SAFETY: `a` and `b` are `n` bytes each, read and written
            // unaligned; T has no invalid bit patterns.
            unsafe {
                let x = std::ptr::read_unaligned(a.as_ptr() as *const T);
                let y = std::ptr::read_unaligned(b.as_ptr() as *const T);
                std::ptr::write_unaligned(b.as_mut_ptr() as *mut T, f(x, y));
            }
        }
    }
}

macro_rules! arith {
    ($op:expr, $lo:expr, $up:expr, $t:ty, int) => {{
        let (lo, up) = ($lo, $up);
        match $op {
            SysOp::Max => zip_with::<$t>(lo, up, |x, y| x.max(y)),
            SysOp::Min => zip_with::<$t>(lo, up, |x, y| x.min(y)),
            SysOp::Sum => zip_with::<$t>(lo, up, |x, y| x.wrapping_add(y)),
            SysOp::Product => zip_with::<$t>(lo, up, |x, y| x.wrapping_mul(y)),
            SysOp::LogicalAnd => zip_with::<$t>(lo, up, |x, y| ((x != 0) && (y != 0)) as $t),
            SysOp::LogicalOr => zip_with::<$t>(lo, up, |x, y| ((x != 0) || (y != 0)) as $t),
            SysOp::LogicalXor => zip_with::<$t>(lo, up, |x, y| ((x != 0) != (y != 0)) as $t),
            SysOp::BitwiseAnd => zip_with::<$t>(lo, up, |x, y| x & y),
            SysOp::BitwiseOr => zip_with::<$t>(lo, up, |x, y| x | y),
            SysOp::BitwiseXor => zip_with::<$t>(lo, up, |x, y| x ^ y),
            SysOp::MaxLoc | SysOp::MinLoc => unreachable!("handled before"),
        }
        Ok(())
    }};
    ($op:expr, $lo:expr, $up:expr, $t:ty, float) => {{
        let (lo, up) = ($lo, $up);
        match $op {
            SysOp::Max => zip_with::<$t>(lo, up, |x, y| x.max(y)),
            SysOp::Min => zip_with::<$t>(lo, up, |x, y| x.min(y)),
            SysOp::Sum => zip_with::<$t>(lo, up, |x, y| x + y),
            SysOp::Product => zip_with::<$t>(lo, up, |x, y| x * y),
            other => {
                return Err(Error::new(
                    ErrorClass::Type,
                    format!("{other:?} is not defined on floating-point values"),
                ))
            }
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
        dt: u32,
    ) -> Result<(), Error> {
        let op = self.0;
        if matches!(op, SysOp::MaxLoc | SysOp::MinLoc) {
            return apply_loc(op == SysOp::MaxLoc, lower, upper, dt);
        }
        if let Some(p) = complex_kind(dt) {
            return apply_complex(op, lower, upper, p);
        }
        let Some(p) = prim else {
            return Err(Error::new(
                ErrorClass::Type,
                "predefined reductions need a datatype of one predefined kind",
            ));
        };
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

    fn check(&self, prim: Option<Prim>, dt: u32) -> Result<(), Error> {
        let op = self.0;
        let ok = match (op, prim) {
            (SysOp::MaxLoc | SysOp::MinLoc, _) => loc_kind(dt).is_some(),
            _ if complex_kind(dt).is_some() => matches!(op, SysOp::Sum | SysOp::Product),
            (_, None) => false,
            (SysOp::Max | SysOp::Min | SysOp::Sum | SysOp::Product, _) => true,
            (_, Some(p)) => !matches!(p, Prim::F32 | Prim::F64),
        };
        if ok {
            return Ok(());
        }
        let what = match (op, prim) {
            (SysOp::MaxLoc | SysOp::MinLoc, _) => {
                "needs buffers of metampi::collective::ValueIndex".to_string()
            }
            _ if complex_kind(dt).is_some() => "is not defined on complex numbers".to_string(),
            (_, None) => "needs a datatype of one predefined kind".to_string(),
            _ => "is not defined on floating-point values".to_string(),
        };
        Err(Error::new(ErrorClass::Type, format!("{op:?} {what}")))
    }
}
impl Operation for SystemOperation {}

// ---- complex numbers ----------------------------------------------------------------

/// `upper = lower ∘ upper` over complex numbers of parts `p`: sums part by
/// part, products as complex numbers; nothing else is defined on them.
fn apply_complex(op: SysOp, lower: &[u8], upper: &mut [u8], p: Prim) -> Result<(), Error> {
    macro_rules! product {
        ($t:ty) => {{
            const S: usize = std::mem::size_of::<$t>();
            let part = |s: &[u8]| <$t>::from_ne_bytes(s.try_into().expect("S bytes"));
            for (a, b) in lower.chunks_exact(2 * S).zip(upper.chunks_exact_mut(2 * S)) {
                let (ar, ai, br, bi) = (part(&a[..S]), part(&a[S..]), part(&b[..S]), part(&b[S..]));
                b[..S].copy_from_slice(&(ar * br - ai * bi).to_ne_bytes());
                b[S..].copy_from_slice(&(ar * bi + ai * br).to_ne_bytes());
            }
        }};
    }
    match (op, p) {
        (SysOp::Sum, Prim::F32) => zip_with::<f32>(lower, upper, |x, y| x + y),
        (SysOp::Sum, _) => zip_with::<f64>(lower, upper, |x, y| x + y),
        (SysOp::Product, Prim::F32) => product!(f32),
        (SysOp::Product, _) => product!(f64),
        (other, _) => {
            return Err(Error::new(
                ErrorClass::Type,
                format!("{other:?} is not defined on complex numbers"),
            ))
        }
    }
    Ok(())
}

/// The part type of complex datatype `dt`, if it is one.
#[cfg(feature = "complex")]
fn complex_kind(dt: u32) -> Option<Prim> {
    let [c32, c64] = complex_types();
    (dt == c32)
        .then_some(Prim::F32)
        .or((dt == c64).then_some(Prim::F64))
}

#[cfg(not(feature = "complex"))]
fn complex_kind(_: u32) -> Option<Prim> {
    None
}

/// The datatypes of `Complex<f32>` and `Complex<f64>`: two parts each,
/// registered as types of their own so that reductions tell them from pairs
/// of plain numbers.
#[cfg(feature = "complex")]
fn complex_types() -> [u32; 2] {
    static IDS: OnceLock<[u32; 2]> = OnceLock::new();
    *IDS.get_or_init(|| {
        [(Prim::F32, 4usize), (Prim::F64, 8)].map(|(p, s)| {
            register_distinct(TypeMap {
                prim: Some(p),
                blocks: vec![(0, 2 * s)],
                size: 2 * s,
                extent: 2 * s,
                lb: 0,
                units: vec![(s as u8, 2)],
            })
        })
    })
}

// SAFETY: `Complex<T>` is `repr(C)` with fields `re` and `im` of `T`: two
// contiguous floats, every byte data and every bit pattern valid.
#[cfg(feature = "complex")]
unsafe impl Equivalence for num_complex::Complex<f32> {
    type Out = DatatypeRef<'static>;
    fn equivalent_datatype() -> DatatypeRef<'static> {
        DatatypeRef::__from_id(complex_types()[0])
    }
}

// SAFETY: as for `Complex<f32>`.
#[cfg(feature = "complex")]
unsafe impl Equivalence for num_complex::Complex<f64> {
    type Out = DatatypeRef<'static>;
    fn equivalent_datatype() -> DatatypeRef<'static> {
        DatatypeRef::__from_id(complex_types()[1])
    }
}

// ---- max-loc / min-loc ------------------------------------------------------------

/// A value with an index, the element type of [`SystemOperation::max_loc`] and
/// [`SystemOperation::min_loc`] (MPI's `MPI_DOUBLE_INT`, `MPI_2INT`, … as one
/// generic type; rsmpi has none).
///
/// `ValueIndex<V, I>` implements [`Equivalence`] for every numeric `V` and
/// integer `I`, so it is a buffer element like any other and may be a field
/// of a `#[derive(Equivalence)]` struct. Its datatype is registered as a type
/// of its own, which is how the reduction recognises it (a user struct with
/// the same layout is not a `ValueIndex`).
///
/// ```no_run
/// use metampi::collective::{SystemOperation, ValueIndex};
/// use metampi::traits::*;
/// let universe = metampi::initialize().unwrap();
/// let world = universe.world();
/// let mine = ValueIndex::new(world.rank() as f64 * 0.5, world.rank());
/// let mut best = ValueIndex::<f64, i32>::default();
/// world.all_reduce_into(&mine, &mut best, SystemOperation::max_loc());
/// assert_eq!(best.index, world.size() - 1);
/// ```
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, PartialOrd)]
pub struct ValueIndex<V, I = i32> {
    /// The value compared.
    pub value: V,
    /// Where it came from (ties go to the smaller index).
    pub index: I,
}

impl<V, I> ValueIndex<V, I> {
    /// A pair.
    pub fn new(value: V, index: I) -> Self {
        ValueIndex { value, index }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Value types of a [`ValueIndex`]: the predefined numbers.
pub trait LocValue: Equivalence + Copy + 'static + sealed::Sealed {
    #[doc(hidden)]
    const PRIM: Prim;
}

/// Index types of a [`ValueIndex`]: the predefined integers.
pub trait LocIndex: Equivalence + Copy + 'static + sealed::Sealed {
    #[doc(hidden)]
    const PRIM: Prim;
}

macro_rules! loc_kinds {
    (value: $($t:ty => $p:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl LocValue for $t { const PRIM: Prim = Prim::$p; }
    )*};
    (index: $($t:ty => $p:ident),*) => {$(
        impl LocIndex for $t { const PRIM: Prim = Prim::$p; }
    )*};
}
loc_kinds!(value: i8 => I8, u8 => U8, i16 => I16, u16 => U16, i32 => I32, u32 => U32,
    i64 => I64, u64 => U64, f32 => F32, f64 => F64);
loc_kinds!(index: i8 => I8, u8 => U8, i16 => I16, u16 => U16, i32 => I32, u32 => U32,
    i64 => I64, u64 => U64);
#[cfg(target_pointer_width = "64")]
loc_kinds!(value: isize => I64, usize => U64);
#[cfg(target_pointer_width = "64")]
loc_kinds!(index: isize => I64, usize => U64);
#[cfg(target_pointer_width = "32")]
loc_kinds!(value: isize => I32, usize => U32);
#[cfg(target_pointer_width = "32")]
loc_kinds!(index: isize => I32, usize => U32);

/// `(Rust type, datatype id, value kind, index kind)` of every `ValueIndex`
/// instantiation used so far.
type LocEntry = (TypeId, u32, Prim, Prim);

fn loc_types() -> &'static RwLock<Vec<LocEntry>> {
    static T: OnceLock<RwLock<Vec<LocEntry>>> = OnceLock::new();
    T.get_or_init(|| RwLock::new(Vec::new()))
}

fn loc_kind(dt: u32) -> Option<(Prim, Prim)> {
    let t = loc_types().read().unwrap_or_else(|p| p.into_inner());
    t.iter().find(|e| e.1 == dt).map(|&(_, _, v, i)| (v, i))
}

// SAFETY: the datatype describes exactly the `value` and `index` fields at
// their offsets in the `repr(C)` struct (padding excluded), both plain
// numbers for which every byte pattern is valid.
unsafe impl<V: LocValue, I: LocIndex> Equivalence for ValueIndex<V, I> {
    type Out = DatatypeRef<'static>;

    fn equivalent_datatype() -> DatatypeRef<'static> {
        let key = TypeId::of::<Self>();
        {
            let t = loc_types().read().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = t.iter().find(|e| e.0 == key) {
                return DatatypeRef::__from_id(e.1);
            }
        }
        let mut t = loc_types().write().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = t.iter().find(|e| e.0 == key) {
            return DatatypeRef::__from_id(e.1);
        }
        let (sv, si) = (V::PRIM.size(), I::PRIM.size());
        let oi = std::mem::offset_of!(Self, index) as isize;
        let mut blocks = vec![(0isize, sv)];
        if oi == sv as isize {
            blocks[0].1 += si;
        } else {
            blocks.push((oi, si));
        }
        let tm = TypeMap {
            prim: (V::PRIM == I::PRIM).then_some(V::PRIM),
            blocks,
            size: sv + si,
            extent: std::mem::size_of::<Self>(),
            lb: 0,
            units: vec![(sv as u8, 1), (si as u8, 1)],
        };
        let id = register_distinct(tm);
        t.push((key, id, V::PRIM, I::PRIM));
        DatatypeRef::__from_id(id)
    }
}

#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Num {
    Int(i128),
    Float(f64),
}

fn read_num(p: Prim, b: &[u8]) -> Num {
    macro_rules! rd {
        ($t:ty) => {
            <$t>::from_ne_bytes(b.try_into().expect("field size matches its kind"))
        };
    }
    match p {
        Prim::I8 => Num::Int(rd!(i8) as i128),
        Prim::U8 | Prim::Bool => Num::Int(rd!(u8) as i128),
        Prim::I16 => Num::Int(rd!(i16) as i128),
        Prim::U16 => Num::Int(rd!(u16) as i128),
        Prim::I32 => Num::Int(rd!(i32) as i128),
        Prim::U32 => Num::Int(rd!(u32) as i128),
        Prim::I64 => Num::Int(rd!(i64) as i128),
        Prim::U64 => Num::Int(rd!(u64) as i128),
        Prim::I128 => Num::Int(rd!(i128)),
        Prim::U128 => Num::Int(rd!(u128) as i128),
        Prim::F32 => Num::Float(rd!(f32) as f64),
        Prim::F64 => Num::Float(rd!(f64)),
    }
}

fn apply_loc(max: bool, lower: &[u8], upper: &mut [u8], dt: u32) -> Result<(), Error> {
    let Some((pv, pi)) = loc_kind(dt) else {
        return Err(Error::new(
            ErrorClass::Type,
            "max_loc and min_loc need buffers of metampi::collective::ValueIndex",
        ));
    };
    let (sv, es) = (pv.size(), pv.size() + pi.size());
    for (a, b) in lower.chunks_exact(es).zip(upper.chunks_exact_mut(es)) {
        let (va, vb) = (read_num(pv, &a[..sv]), read_num(pv, &b[..sv]));
        let better = if max { va > vb } else { va < vb };
        let take = better || (va == vb && read_num(pi, &a[sv..]) < read_num(pi, &b[sv..]));
        if take {
            b.copy_from_slice(a);
        }
    }
    Ok(())
}

// ---- user operations ----------------------------------------------------------------

/// A read-only buffer of elements of a datatype known at run time: what user
/// operations receive, and (built with [`DynBuffer::from_raw`]) a buffer for
/// any operation, as in rsmpi.
#[derive(Copy, Clone, Debug)]
pub struct DynBuffer<'a> {
    ptr: *const u8,
    /// Bytes from `ptr` the elements span.
    bytes: usize,
    len: usize,
    datatype: DatatypeRef<'a>,
    _data: PhantomData<&'a [u8]>,
}

/// Bytes `len` elements of `datatype` span from their first one.
fn span(len: usize, datatype: DatatypeRef<'_>) -> usize {
    len.saturating_mul(type_map(datatype.type_id()).extent)
}

impl<'a> DynBuffer<'a> {
    fn new(bytes: &'a [u8], len: usize, datatype: DatatypeRef<'a>) -> Self {
        DynBuffer {
            ptr: bytes.as_ptr(),
            bytes: bytes.len(),
            len,
            datatype,
            _data: PhantomData,
        }
    }

    /// A buffer of `len` elements of `datatype` at `ptr` (rsmpi's
    /// `DynBuffer::from_raw`). A negative `len` counts as none.
    ///
    /// # Safety
    /// `ptr` must point to `len` elements of `datatype` that live, unchanged
    /// by anything else, for `'a`.
    pub unsafe fn from_raw<T>(ptr: *const T, len: Count, datatype: DatatypeRef<'a>) -> Self {
        let len = usize::try_from(len).unwrap_or(0);
        DynBuffer {
            ptr: ptr.cast(),
            bytes: span(len, datatype),
            len,
            datatype,
            _data: PhantomData,
        }
    }

    /// The elements as `&[T]` when they are `T`.
    pub fn downcast<T: Equivalence>(self) -> Option<&'a [T]> {
        if !self.is::<T>() || !holds::<T>(self.ptr, self.bytes, self.len) {
            return None;
        }
        // SAFETY: the datatype is T's (checked) and describes every data byte
        // of T (Equivalence contract); the bytes hold `len` whole values laid
        // out as T (`UserOperation::apply` unpacks into element storage;
        // `from_raw`'s contract), live for 'a, are aligned and long enough
        // (checked).
        Some(unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.len) })
    }
}

/// A writable buffer of elements of a datatype known at run time (see
/// [`DynBuffer`]).
#[derive(Debug)]
pub struct DynBufferMut<'a> {
    ptr: *mut u8,
    bytes: usize,
    len: usize,
    datatype: DatatypeRef<'a>,
    _data: PhantomData<&'a mut [u8]>,
}

impl<'a> DynBufferMut<'a> {
    fn new(bytes: &'a mut [u8], len: usize, datatype: DatatypeRef<'a>) -> Self {
        DynBufferMut {
            ptr: bytes.as_mut_ptr(),
            bytes: bytes.len(),
            len,
            datatype,
            _data: PhantomData,
        }
    }

    /// A writable buffer of `len` elements of `datatype` at `ptr` (rsmpi's
    /// `DynBufferMut::from_raw`). A negative `len` counts as none.
    ///
    /// # Safety
    /// `ptr` must point to `len` elements of `datatype` that live for `'a`,
    /// with no other reference to them meanwhile.
    pub unsafe fn from_raw<T>(ptr: *mut T, len: Count, datatype: DatatypeRef<'a>) -> Self {
        let len = usize::try_from(len).unwrap_or(0);
        DynBufferMut {
            ptr: ptr.cast(),
            bytes: span(len, datatype),
            len,
            datatype,
            _data: PhantomData,
        }
    }

    /// The elements as `&mut [T]` when they are `T`.
    pub fn downcast<T: Equivalence>(self) -> Option<&'a mut [T]> {
        if !self.is::<T>() || !holds::<T>(self.ptr, self.bytes, self.len) {
            return None;
        }
        // SAFETY: as in `DynBuffer::downcast`, and the borrow is exclusive.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len) })
    }

    /// Where the elements start, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut std::ffi::c_void {
        self.ptr.cast()
    }
}

/// What `DynBuffer` and `DynBufferMut` share: the element queries and the
/// read-side buffer traits.
macro_rules! dyn_buffer_common {
    ($($t:ident),*) => {$(
        impl $t<'_> {
            /// Whether the elements are `T`.
            pub fn is<T: Equivalence>(&self) -> bool {
                T::equivalent_datatype().type_id() == self.datatype.type_id()
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether there are no elements.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Where the elements start.
            pub fn as_ptr(&self) -> *const std::ffi::c_void {
                self.ptr.cast()
            }
        }

        // SAFETY: `len` elements of `datatype` at `ptr`, borrowed as the type
        // says (the constructors' contracts).
        unsafe impl Collection for $t<'_> {
            fn count(&self) -> Count {
                Count::try_from(self.len).unwrap_or(Count::MAX)
            }
        }
        // SAFETY: as above.
        unsafe impl Pointer for $t<'_> {
            fn pointer(&self) -> *const std::ffi::c_void {
                self.ptr.cast()
            }
        }
        // SAFETY: as above.
        unsafe impl<'a> AsDatatype for $t<'a> {
            type Out = DatatypeRef<'a>;
            fn as_datatype(&self) -> DatatypeRef<'a> {
                self.datatype
            }
        }
        // SAFETY: as above.
        unsafe impl Buffer for $t<'_> {}
    )*};
}
dyn_buffer_common!(DynBuffer, DynBufferMut);

// SAFETY: `DynBufferMut`'s elements are borrowed exclusively (its
// constructors' contracts).
unsafe impl PointerMut for DynBufferMut<'_> {
    fn pointer_mut(&mut self) -> *mut std::ffi::c_void {
        self.ptr.cast()
    }
}
// SAFETY: as above.
unsafe impl BufferMut for DynBufferMut<'_> {}

/// Whether `bytes` bytes at `ptr` hold `len` aligned values of `T`.
fn holds<T>(ptr: *const u8, bytes: usize, len: usize) -> bool {
    ptr.align_offset(std::mem::align_of::<T>()) == 0
        && len
            .checked_mul(std::mem::size_of::<T>())
            .is_some_and(|n| n <= bytes)
}

type UserFn<'a> = dyn Fn(DynBuffer, DynBufferMut) + Sync + 'a;

/// A reduction operation from a closure `f(invec, inoutvec)` that must set
/// `inoutvec = invec ∘ inoutvec`. Pass it by reference (`&op`), as in rsmpi.
///
/// The closure runs inside the library with its progress lock held, possibly
/// on another thread than the caller's (for nonblocking collectives): it must
/// not call metampi.
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

/// Whether values of `tm` can be laid out in element storage (every block
/// inside `[0, extent)`), which is what closures downcast.
fn has_element_storage(tm: &TypeMap) -> bool {
    tm.size > 0
        && tm.lb >= 0
        && tm
            .blocks
            .iter()
            .all(|&(o, l)| o >= 0 && o as usize + l <= tm.extent)
}

/// Aligned scratch for `len` bytes.
fn aligned(len: usize) -> Vec<u128> {
    vec![0u128; len.div_ceil(16)]
}

fn as_bytes(v: &[u128]) -> &[u8] {
    // SAFETY: u128 has no padding; any initialised u128 memory is valid bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 16) }
}

fn as_bytes_mut(v: &mut [u128]) -> &mut [u8] {
    // SAFETY: as above, and every byte pattern is a valid u128.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 16) }
}

impl OpApply for UserOperation<'_> {
    fn apply(
        &self,
        lower: &[u8],
        upper: &mut [u8],
        _prim: Option<Prim>,
        dt: u32,
    ) -> Result<(), Error> {
        on_elements(lower, upper, dt, |x, y| (self.f)(x, y))
    }
}

/// Calls `f` with the first `bytes` of the scratch `lo` and `up`, `count` elements each.
fn hand_over(
    f: &impl Fn(DynBuffer, DynBufferMut),
    lo: &[u128],
    up: &mut [u128],
    bytes: usize,
    count: usize,
    datatype: DatatypeRef<'_>,
) {
    f(
        DynBuffer::new(&as_bytes(lo)[..bytes], count, datatype),
        DynBufferMut::new(&mut as_bytes_mut(up)[..bytes], count, datatype),
    );
}

/// Runs `f(invec, inoutvec)` over `lower` and `upper` (signature bytes of datatype `dt`)
/// laid out as element storage, aligned, and writes the result back into `upper`.
fn on_elements(
    lower: &[u8],
    upper: &mut [u8],
    dt: u32,
    f: impl Fn(DynBuffer, DynBufferMut),
) -> Result<(), Error> {
    let tm = type_map(dt);
    let datatype = DatatypeRef::__from_id(dt);
    if !has_element_storage(&tm) || tm.is_dense() {
        // Signature bytes are the element layout: copy them to aligned storage.
        let count = upper.len().checked_div(tm.size).unwrap_or(0);
        let n = upper.len();
        let mut lo = aligned(n);
        let mut up = aligned(n);
        as_bytes_mut(&mut lo)[..n].copy_from_slice(lower);
        as_bytes_mut(&mut up)[..n].copy_from_slice(upper);
        hand_over(&f, &lo, &mut up, n, count, datatype);
        upper.copy_from_slice(&as_bytes(&up)[..n]);
        return Ok(());
    }
    // Elements with gaps (padding): unpack into element storage so the
    // closure sees real values of its type, then pack the result back.
    let count = upper.len() / tm.size;
    let span = count * tm.extent;
    let mut lo = aligned(span);
    let mut up = aligned(span);
    // SAFETY: the scratch holds `count` elements of `extent` bytes, every block lies inside
    // its element (`has_element_storage`), and the layout is its only view while it lives.
    let layout = |v: &mut [u128]| unsafe {
        RecvLayout::from_raw(
            crate::datatype::type_map_ref(dt),
            count,
            v.as_mut_ptr().cast(),
        )
    };
    layout(&mut lo).unpack(lower);
    layout(&mut up).unpack(upper);
    hand_over(&f, &lo, &mut up, span, count, datatype);
    let src = as_bytes(&up);
    let mut pos = 0;
    for i in 0..count {
        for &(o, l) in &tm.blocks {
            let at = i * tm.extent + o as usize;
            upper[pos..pos + l].copy_from_slice(&src[at..at + l]);
            pos += l;
        }
    }
    Ok(())
}

impl Operation for &UserOperation<'_> {
    fn is_commutative(&self) -> bool {
        self.commute
    }
}

/// A C-style reduction function, as rsmpi's: `(invec, inoutvec, len, datatype)`, setting
/// `inoutvec[i] = invec[i] ∘ inoutvec[i]` for `*len` elements of `*datatype`.
pub type UnsafeUserFunction = unsafe extern "C" fn(
    *mut std::ffi::c_void,
    *mut std::ffi::c_void,
    *mut std::ffi::c_int,
    *mut crate::ffi::MPI_Datatype,
);

/// A reduction operation from a C-style function, as rsmpi's `UnsafeUserOperation`: for
/// code written against C MPI's `MPI_Op_create`. [`UserOperation`] with a closure is the
/// safe form. The elements are handed over as [`UserOperation`]'s closures see them
/// (aligned element storage of the datatype).
#[derive(Clone, Copy)]
pub struct UnsafeUserOperation {
    commute: bool,
    f: UnsafeUserFunction,
}

impl UnsafeUserOperation {
    /// A non-commutative (but associative) operation: applied in rank order.
    ///
    /// # Safety
    /// `function` must read at most `*len` elements of `*datatype` at `invec` (and never
    /// write there), write at most that many at `inoutvec`, and touch nothing else; it may
    /// run on another thread, with the library's progress lock held, so it must not call
    /// metampi.
    pub unsafe fn associative(function: UnsafeUserFunction) -> Self {
        // SAFETY: the caller's promise is passed on.
        unsafe { Self::new(false, function) }
    }

    /// A commutative operation.
    ///
    /// # Safety
    /// As [`UnsafeUserOperation::associative`].
    pub unsafe fn commutative(function: UnsafeUserFunction) -> Self {
        // SAFETY: the caller's promise is passed on.
        unsafe { Self::new(true, function) }
    }

    /// An operation with explicit commutativity.
    ///
    /// # Safety
    /// As [`UnsafeUserOperation::associative`].
    pub unsafe fn new(commute: bool, function: UnsafeUserFunction) -> Self {
        UnsafeUserOperation {
            commute,
            f: function,
        }
    }
}

impl std::fmt::Debug for UnsafeUserOperation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UnsafeUserOperation {{ commute: {} }}", self.commute)
    }
}

impl OpApply for UnsafeUserOperation {
    fn apply(
        &self,
        lower: &[u8],
        upper: &mut [u8],
        _prim: Option<Prim>,
        dt: u32,
    ) -> Result<(), Error> {
        on_elements(lower, upper, dt, |x, y| {
            let mut len = std::ffi::c_int::try_from(x.len).unwrap_or(std::ffi::c_int::MAX);
            let mut datatype: crate::ffi::MPI_Datatype = dt;
            // SAFETY: `x` and `y` hold `x.len` elements of `dt` each (`on_elements`), `y`
            // exclusively borrowed; the constructor's caller promised that the function
            // reads only those at `invec`, writes only those at `inoutvec`.
            unsafe {
                (self.f)(
                    x.ptr as *mut std::ffi::c_void,
                    y.ptr.cast(),
                    &mut len,
                    &mut datatype,
                )
            }
        })
    }
}

impl Operation for UnsafeUserOperation {
    fn is_commutative(&self) -> bool {
        self.commute
    }
}

/// Applies `op` locally: `inoutbuf = inbuf ∘ inoutbuf` (`MPI_Reduce_local`).
///
/// # Panics
/// Ends the job (as MPI's fatal error handler) when the buffers differ in
/// length or the operation is not defined on the datatype.
#[track_caller]
pub fn reduce_local_into<S, R, O>(inbuf: &S, inoutbuf: &mut R, op: O)
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    try_reduce_local_into(inbuf, inoutbuf, op).or_abort_in("reduce_local_into")
}

/// Fallible [`reduce_local_into`].
///
/// # Errors
/// `Count` when the buffers differ in length, `Type` when the operation is
/// not defined on the datatype.
pub fn try_reduce_local_into<S, R, O>(inbuf: &S, inoutbuf: &mut R, op: O) -> Result<(), Error>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    let lower = pack(inbuf).bytes().to_vec();
    let dt = inbuf.as_datatype().type_id();
    let prim = type_map(dt).prim;
    let mut layout = RecvLayout::of(inoutbuf);
    if layout.capacity() != lower.len() {
        return Err(Error::new(
            ErrorClass::Count,
            "reduce_local_into buffers differ in length",
        ));
    }
    match layout.dense() {
        Some(upper) => op.apply(&lower, upper, prim, dt),
        None => {
            let mut upper = layout.pack();
            op.apply(&lower, &mut upper, prim, dt)?;
            layout.unpack(&upper);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairs with padding (`ValueIndex<f64, i32>`: 12 data bytes in 16) are
    /// packed for the reduction and unpacked after it: by the library's
    /// `max_loc`, and for a user operation, which sees them as values of
    /// their type. Only data bytes are read (Miri, `.ci/miri.sh`, reports a
    /// read of the padding, which is uninitialised, as undefined behaviour).
    #[test]
    fn padded_pairs_reduce_through_packing() {
        type P = ValueIndex<f64, i32>;
        let a: Vec<P> = (0..9).map(|i| P::new(f64::from(i * 7 % 5), i)).collect();
        let b: Vec<P> = (0..9)
            .map(|i| P::new(f64::from(i * 3 % 5), 10 + i))
            .collect();
        let mut best = b.clone();
        reduce_local_into(&a[..], &mut best[..], SystemOperation::max_loc());
        for ((x, y), got) in a.iter().zip(&b).zip(&best) {
            // Ties go to the smaller index: `a`'s.
            let want = if x.value >= y.value { x } else { y };
            assert_eq!(got, want);
        }
        let mut sum = b.clone();
        let add = UserOperation::commutative(|x, y| {
            let (x, y) = (x.downcast::<P>().unwrap(), y.downcast::<P>().unwrap());
            for (x, y) in x.iter().zip(y) {
                y.value += x.value;
                y.index += x.index;
            }
        });
        reduce_local_into(&a[..], &mut sum[..], &add);
        for ((x, y), got) in a.iter().zip(&b).zip(&sum) {
            assert_eq!(*got, P::new(x.value + y.value, x.index + y.index));
        }
    }

    /// Misaligned byte ranges take the unaligned path and give the same
    /// values as aligned ones.
    #[test]
    fn aligned_and_misaligned_ranges_agree() {
        let lower: Vec<f64> = (0..37).map(|i| i as f64 * 1.25 - 7.0).collect();
        let upper: Vec<f64> = (0..37).map(|i| 3.5 - i as f64).collect();
        let bytes = |v: &[f64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let (lo, up) = (bytes(&lower), bytes(&upper));
        for op in [
            SystemOperation::sum(),
            SystemOperation::max(),
            SystemOperation::product(),
        ] {
            let mut aligned = up.clone();
            op.apply(&lo, &mut aligned, Some(Prim::F64), 0).unwrap();
            // Neither range aligned for f64 any more: one or two bytes in,
            // whichever is misaligned where the allocator put the vector
            // (glibc aligns a `Vec<u8>` to 16 bytes; Miri may not).
            let misaligned = |v: &[u8]| {
                let mut out = vec![0u8; v.len() + 2];
                let at = if (out.as_ptr() as usize + 1) % 8 != 0 {
                    1
                } else {
                    2
                };
                out[at..at + v.len()].copy_from_slice(v);
                (out, at)
            };
            let (lo_off, la) = misaligned(&lo);
            let (mut up_off, ua) = misaligned(&up);
            let (lo_off, up_off) = (&lo_off[la..la + lo.len()], &mut up_off[ua..ua + up.len()]);
            assert_ne!(
                lo_off.as_ptr() as usize % 8,
                0,
                "the test needs a misaligned range"
            );
            op.apply(lo_off, up_off, Some(Prim::F64), 0).unwrap();
            assert_eq!(&up_off[..], &aligned[..], "{op:?}");
            let want: Vec<u8> = bytes(
                &lower
                    .iter()
                    .zip(&upper)
                    .map(|(x, y)| match op.0 {
                        SysOp::Sum => x + y,
                        SysOp::Max => x.max(*y),
                        _ => x * y,
                    })
                    .collect::<Vec<f64>>(),
            );
            assert_eq!(aligned, want, "{op:?}");
        }
    }
}
