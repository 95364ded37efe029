//! Datatypes and buffers (MPI-1.2 §3.12), in the shape of rsmpi's `datatype` module.
//!
//! A datatype is a *type map*: the byte blocks one element occupies inside its
//! extent. Buffers whose type map is one dense block travel straight from and
//! into user memory; others are packed into their type signature order and
//! unpacked at the receiver, so sender and receiver may use different layouts
//! with the same signature (as MPI allows).

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock, RwLock};

use crate::{Address, Count};

pub use crate::collective::{DynBuffer, DynBufferMut};

/// The predefined element kinds, for reductions (and byte-order conversion).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prim {
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    I128,
    U128,
    F32,
    F64,
    Bool,
}

impl Prim {
    const ALL: [Prim; 13] = [
        Prim::I8,
        Prim::U8,
        Prim::I16,
        Prim::U16,
        Prim::I32,
        Prim::U32,
        Prim::I64,
        Prim::U64,
        Prim::I128,
        Prim::U128,
        Prim::F32,
        Prim::F64,
        Prim::Bool,
    ];

    pub(crate) fn size(self) -> usize {
        match self {
            Prim::I8 | Prim::U8 | Prim::Bool => 1,
            Prim::I16 | Prim::U16 => 2,
            Prim::I32 | Prim::U32 | Prim::F32 => 4,
            Prim::I64 | Prim::U64 | Prim::F64 => 8,
            Prim::I128 | Prim::U128 => 16,
        }
    }
}

/// One element's layout: byte blocks `(offset, len)` in signature order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TypeMap {
    /// Set when every data byte belongs to elements of one predefined kind.
    pub prim: Option<Prim>,
    pub blocks: Vec<(isize, usize)>,
    /// Bytes of data per element (sum of block lengths).
    pub size: usize,
    /// Distance between consecutive elements.
    pub extent: usize,
    /// Lower bound (smallest offset), usually 0.
    pub lb: isize,
    /// The values of one element in packed order, as runs of (value size,
    /// count): what a byte-order conversion reverses.
    pub units: Vec<(u8, usize)>,
}

impl TypeMap {
    fn primitive(p: Prim) -> TypeMap {
        let size = p.size();
        TypeMap {
            prim: Some(p),
            blocks: vec![(0, size)],
            size,
            extent: size,
            lb: 0,
            units: vec![(size as u8, 1)],
        }
    }

    fn from_blocks(
        prim: Option<Prim>,
        mut blocks: Vec<(isize, usize)>,
        extent_hint: Option<(isize, usize)>,
        units: Vec<(u8, usize)>,
    ) -> TypeMap {
        blocks.retain(|b| b.1 > 0);
        // Merge neighbours so dense layouts become one block.
        let mut merged: Vec<(isize, usize)> = Vec::with_capacity(blocks.len());
        for b in blocks {
            match merged.last_mut() {
                Some(last) if last.0 + last.1 as isize == b.0 => last.1 += b.1,
                _ => merged.push(b),
            }
        }
        let size = merged.iter().map(|b| b.1).sum();
        let (lb, extent) = extent_hint.unwrap_or_else(|| {
            let lo = merged.iter().map(|b| b.0).min().unwrap_or(0);
            let hi = merged.iter().map(|b| b.0 + b.1 as isize).max().unwrap_or(0);
            (lo, (hi - lo) as usize)
        });
        TypeMap {
            prim,
            blocks: merged,
            size,
            extent,
            lb,
            units,
        }
    }

    /// Appends `times` copies of this map's value runs to `out`.
    fn push_units(&self, times: usize, out: &mut Vec<(u8, usize)>) {
        let mut push = |(s, c): (u8, usize)| match out.last_mut() {
            Some(last) if last.0 == s => last.1 += c,
            _ if c > 0 => out.push((s, c)),
            _ => {}
        };
        match self.units[..] {
            // An empty struct has no values to repeat.
            [] => {}
            [one] => push((one.0, one.1 * times)),
            [first, ..] if self.units.iter().all(|u| u.0 == first.0) => {
                // Values of one size: one run, however many copies (2^31 of them from C).
                let per: usize = self.units.iter().map(|u| u.1).sum();
                push((first.0, per * times));
            }
            _ => {
                for _ in 0..times {
                    for &u in &self.units {
                        push(u);
                    }
                }
            }
        }
    }

    /// Whether `count` elements are one dense run of bytes starting at the pointer.
    pub(crate) fn is_dense(&self) -> bool {
        self.lb == 0
            && self.size == self.extent
            && (self.blocks.len() == 1 && self.blocks[0].0 == 0 || self.size == 0)
    }

    /// Repeats this map `count` times at `stride` bytes.
    fn repeat(&self, count: usize, stride: isize, offset0: isize) -> Vec<(isize, usize)> {
        // A dense element repeated at its own extent is one block, kept as one: a
        // contiguous type of 2^31 elements must not list them one by one.
        if let [(o, l)] = self.blocks[..] {
            if l == self.extent && stride == self.extent as isize && count > 0 {
                return vec![(offset0 + o, l * count)];
            }
        }
        let mut out = Vec::with_capacity(count * self.blocks.len());
        for i in 0..count {
            for &(o, l) in &self.blocks {
                out.push((offset0 + i as isize * stride + o, l));
            }
        }
        out
    }
}

fn registry() -> &'static RwLock<Vec<Arc<TypeMap>>> {
    static REG: OnceLock<RwLock<Vec<Arc<TypeMap>>>> = OnceLock::new();
    REG.get_or_init(|| {
        RwLock::new(
            Prim::ALL
                .iter()
                .map(|&p| Arc::new(TypeMap::primitive(p)))
                .collect(),
        )
    })
}

/// Predefined types are registered first, in `Prim::ALL` order.
fn prim_id(p: Prim) -> u32 {
    Prim::ALL.iter().position(|&q| q == p).unwrap_or(0) as u32
}

fn register(tm: TypeMap) -> u32 {
    let mut reg = registry().write().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = reg.iter().position(|t| **t == tm) {
        return i as u32;
    }
    reg.push(Arc::new(tm));
    (reg.len() - 1) as u32
}

/// The maps of the predefined types, which never change: looked up without
/// the registry's lock, on every send and receive of plain data.
fn prim_maps() -> &'static [Arc<TypeMap>] {
    static PRIMS: OnceLock<Vec<Arc<TypeMap>>> = OnceLock::new();
    PRIMS.get_or_init(|| {
        let reg = registry().read().unwrap_or_else(|p| p.into_inner());
        reg[..Prim::ALL.len()].to_vec()
    })
}

pub(crate) fn type_map(id: u32) -> Arc<TypeMap> {
    if let Some(tm) = prim_maps().get(id as usize) {
        return Arc::clone(tm);
    }
    let reg = registry().read().unwrap_or_else(|p| p.into_inner());
    // Ids only come from `register`, so they are always in range.
    Arc::clone(&reg[id as usize])
}

/// Converts a user count into an element count: negative counts are refused
/// where the caller checks; here they count as zero.
fn ucount(c: Count) -> usize {
    c.max(0) as usize
}

// ---- datatype handles -------------------------------------------------------

/// Implemented by every datatype handle.
pub trait UncommittedDatatype {
    /// The type `dup` returns.
    type DuplicatedDatatype;
    /// A duplicate of this datatype (`MPI_Type_dup`).
    fn dup(&self) -> Self::DuplicatedDatatype;
    #[doc(hidden)]
    fn type_id(&self) -> u32;
}

/// A committed datatype usable in communication.
pub trait Datatype: UncommittedDatatype {}

impl<D: UncommittedDatatype + ?Sized> UncommittedDatatype for &D {
    type DuplicatedDatatype = D::DuplicatedDatatype;
    fn dup(&self) -> Self::DuplicatedDatatype {
        (**self).dup()
    }
    fn type_id(&self) -> u32 {
        (**self).type_id()
    }
}
impl<D: Datatype + ?Sized> Datatype for &D {}

/// A borrowed reference to a committed datatype.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DatatypeRef<'a> {
    id: u32,
    phantom: PhantomData<&'a ()>,
}

/// A predefined datatype.
pub type SystemDatatype = DatatypeRef<'static>;

impl DatatypeRef<'_> {
    fn new(id: u32) -> Self {
        DatatypeRef {
            id,
            phantom: PhantomData,
        }
    }
}

impl UncommittedDatatype for DatatypeRef<'_> {
    type DuplicatedDatatype = UserDatatype;
    fn dup(&self) -> UserDatatype {
        UserDatatype(self.id)
    }
    fn type_id(&self) -> u32 {
        self.id
    }
}
impl Datatype for DatatypeRef<'_> {}

/// A borrowed reference to a datatype that may not be committed yet.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UncommittedDatatypeRef<'a> {
    id: u32,
    phantom: PhantomData<&'a ()>,
}

impl UncommittedDatatype for UncommittedDatatypeRef<'_> {
    type DuplicatedDatatype = UncommittedUserDatatype;
    fn dup(&self) -> UncommittedUserDatatype {
        UncommittedUserDatatype(self.id)
    }
    fn type_id(&self) -> u32 {
        self.id
    }
}

impl<'a> From<DatatypeRef<'a>> for UncommittedDatatypeRef<'a> {
    fn from(d: DatatypeRef<'a>) -> Self {
        UncommittedDatatypeRef {
            id: d.id,
            phantom: PhantomData,
        }
    }
}
impl<'a> From<&'a UserDatatype> for DatatypeRef<'a> {
    fn from(d: &'a UserDatatype) -> Self {
        DatatypeRef::new(d.0)
    }
}
impl<'a> From<&'a UserDatatype> for UncommittedDatatypeRef<'a> {
    fn from(d: &'a UserDatatype) -> Self {
        DatatypeRef::new(d.0).into()
    }
}
impl<'a> From<&'a UncommittedUserDatatype> for UncommittedDatatypeRef<'a> {
    fn from(d: &'a UncommittedUserDatatype) -> Self {
        UncommittedDatatypeRef {
            id: d.0,
            phantom: PhantomData,
        }
    }
}

/// A derived datatype (committed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserDatatype(u32);

/// A derived datatype before `commit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UncommittedUserDatatype(u32);

impl UncommittedDatatype for UserDatatype {
    type DuplicatedDatatype = UserDatatype;
    fn dup(&self) -> UserDatatype {
        self.clone()
    }
    fn type_id(&self) -> u32 {
        self.0
    }
}
impl Datatype for UserDatatype {}

impl UncommittedDatatype for UncommittedUserDatatype {
    type DuplicatedDatatype = UncommittedUserDatatype;
    fn dup(&self) -> UncommittedUserDatatype {
        self.clone()
    }
    fn type_id(&self) -> u32 {
        self.0
    }
}

fn hvector(count: usize, blocklength: usize, stride_bytes: isize, old: &TypeMap) -> TypeMap {
    let mut blocks = Vec::new();
    for i in 0..count {
        blocks.extend(old.repeat(blocklength, old.extent as isize, i as isize * stride_bytes));
    }
    let extent = if count == 0 {
        0
    } else {
        ((count - 1) as isize * stride_bytes).unsigned_abs() + blocklength * old.extent
    };
    let mut units = Vec::new();
    old.push_units(count * blocklength, &mut units);
    TypeMap::from_blocks(old.prim, blocks, Some((0, extent)), units)
}

fn hindexed(blocklengths: &[Count], displs_bytes: &[isize], old: &TypeMap) -> TypeMap {
    assert_eq!(
        blocklengths.len(),
        displs_bytes.len(),
        "blocklengths and displacements differ in length"
    );
    let mut blocks = Vec::new();
    let mut units = Vec::new();
    for (&bl, &d) in blocklengths.iter().zip(displs_bytes) {
        blocks.extend(old.repeat(ucount(bl), old.extent as isize, d));
        old.push_units(ucount(bl), &mut units);
    }
    TypeMap::from_blocks(old.prim, blocks, None, units)
}

macro_rules! constructors {
    ($t:ident, $wrap:expr) => {
        impl $t {
            /// `count` contiguous copies of `oldtype` (`MPI_Type_contiguous`).
            pub fn contiguous<D: UncommittedDatatype>(count: Count, oldtype: &D) -> Self {
                let old = type_map(oldtype.type_id());
                $wrap(register(hvector(1, ucount(count), 0, &old)))
            }
            /// Blocks at a stride counted in elements (`MPI_Type_vector`).
            pub fn vector<D: UncommittedDatatype>(
                count: Count,
                blocklength: Count,
                stride: Count,
                oldtype: &D,
            ) -> Self {
                let old = type_map(oldtype.type_id());
                $wrap(register(hvector(
                    ucount(count),
                    ucount(blocklength),
                    stride as isize * old.extent as isize,
                    &old,
                )))
            }
            /// Blocks at a stride counted in bytes (`MPI_Type_create_hvector`).
            pub fn heterogeneous_vector<D: UncommittedDatatype>(
                count: Count,
                blocklength: Count,
                stride: Address,
                oldtype: &D,
            ) -> Self {
                let old = type_map(oldtype.type_id());
                $wrap(register(hvector(
                    ucount(count),
                    ucount(blocklength),
                    stride as isize,
                    &old,
                )))
            }
            /// Blocks at displacements counted in elements (`MPI_Type_indexed`).
            pub fn indexed<D: UncommittedDatatype>(
                blocklengths: &[Count],
                displacements: &[Count],
                oldtype: &D,
            ) -> Self {
                let old = type_map(oldtype.type_id());
                let d: Vec<isize> = displacements
                    .iter()
                    .map(|&x| x as isize * old.extent as isize)
                    .collect();
                $wrap(register(hindexed(blocklengths, &d, &old)))
            }
            /// Blocks at displacements counted in bytes (`MPI_Type_create_hindexed`).
            pub fn heterogeneous_indexed<D: UncommittedDatatype>(
                blocklengths: &[Count],
                displacements: &[Address],
                oldtype: &D,
            ) -> Self {
                let old = type_map(oldtype.type_id());
                let d: Vec<isize> = displacements.iter().map(|&x| x as isize).collect();
                $wrap(register(hindexed(blocklengths, &d, &old)))
            }
            /// Equal blocks at element displacements (`MPI_Type_create_indexed_block`).
            pub fn indexed_block<D: UncommittedDatatype>(
                blocklength: Count,
                displacements: &[Count],
                oldtype: &D,
            ) -> Self {
                let bl = vec![blocklength; displacements.len()];
                Self::indexed(&bl, displacements, oldtype)
            }
            /// Equal blocks at byte displacements (`MPI_Type_create_hindexed_block`).
            pub fn heterogeneous_indexed_block<D: UncommittedDatatype>(
                blocklength: Count,
                displacements: &[Address],
                oldtype: &D,
            ) -> Self {
                let bl = vec![blocklength; displacements.len()];
                Self::heterogeneous_indexed(&bl, displacements, oldtype)
            }
            /// A struct of blocks of different types (`MPI_Type_create_struct`).
            pub fn structured<D: UncommittedDatatype>(
                blocklengths: &[Count],
                displacements: &[Address],
                types: &[D],
            ) -> Self {
                assert!(
                    blocklengths.len() == displacements.len() && displacements.len() == types.len(),
                    "structured: blocklengths, displacements and types differ in length"
                );
                let mut blocks = Vec::new();
                let mut prims = Vec::new();
                let mut units = Vec::new();
                for ((&bl, &d), t) in blocklengths.iter().zip(displacements).zip(types) {
                    let old = type_map(t.type_id());
                    prims.push(old.prim);
                    blocks.extend(old.repeat(ucount(bl), old.extent as isize, d as isize));
                    old.push_units(ucount(bl), &mut units);
                }
                let prim = match prims.first() {
                    Some(&p) if prims.iter().all(|&q| q == p) => p,
                    _ => None,
                };
                $wrap(register(TypeMap::from_blocks(prim, blocks, None, units)))
            }
        }
    };
}
constructors!(UserDatatype, UserDatatype);
constructors!(UncommittedUserDatatype, UncommittedUserDatatype);

impl UserDatatype {
    /// A reference to this datatype.
    pub fn as_ref(&self) -> DatatypeRef<'_> {
        DatatypeRef::new(self.0)
    }
}

impl UncommittedUserDatatype {
    /// Commits the datatype for use in communication.
    pub fn commit(self) -> UserDatatype {
        UserDatatype(self.0)
    }
    /// A reference to this datatype.
    pub fn as_ref(&self) -> UncommittedDatatypeRef<'_> {
        self.into()
    }
}

/// Sets the extent of a type map explicitly (used by the derive for padding at the end).
#[doc(hidden)]
pub fn __resized(dt: DatatypeRef<'static>, extent: usize) -> DatatypeRef<'static> {
    let mut tm = (*type_map(dt.id)).clone();
    tm.lb = 0;
    tm.extent = extent;
    DatatypeRef::new(register(tm))
}

/// Byte address of a value (`MPI_Get_address`).
pub fn address_of<T>(x: &T) -> Address {
    x as *const T as Address
}

// ---- Equivalence --------------------------------------------------------------

/// A Rust type with an equivalent MPI datatype.
///
/// # Safety
/// `equivalent_datatype` must describe exactly the bytes of `Self` that carry
/// data (no bytes outside the value, and every byte pattern it can receive
/// must be a valid `Self`).
pub unsafe trait Equivalence {
    /// The datatype handle type.
    type Out: Datatype;
    /// The datatype that describes `Self`.
    fn equivalent_datatype() -> Self::Out;
}

macro_rules! prim {
    ($($t:ty => $p:ident),*) => {$(
        // SAFETY: every byte pattern of these plain numbers is valid and their
        // whole size is data.
        unsafe impl Equivalence for $t {
            type Out = SystemDatatype;
            fn equivalent_datatype() -> SystemDatatype {
                DatatypeRef::new(prim_id(Prim::$p))
            }
        }
    )*};
}
prim!(i8 => I8, u8 => U8, i16 => I16, u16 => U16, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
      i128 => I128, u128 => U128, f32 => F32, f64 => F64);
#[cfg(target_pointer_width = "64")]
prim!(isize => I64, usize => U64);
#[cfg(target_pointer_width = "32")]
prim!(isize => I32, usize => U32);

// SAFETY: bool is one byte; receivers only ever get bools that a sender sent as
// bool (MPI's type-matching rule); see `check_bools` for the defensive fix-up.
unsafe impl Equivalence for bool {
    type Out = SystemDatatype;
    fn equivalent_datatype() -> SystemDatatype {
        DatatypeRef::new(prim_id(Prim::Bool))
    }
}

// ---- buffers ------------------------------------------------------------------

/// Something with a count of elements.
///
/// # Safety
/// `count` must not exceed the number of elements behind the buffer's pointer.
pub unsafe trait Collection {
    /// Number of elements.
    fn count(&self) -> Count;
}

/// Something with a base address for reading.
///
/// # Safety
/// The pointer must be valid for reads of `count` elements of the datatype.
pub unsafe trait Pointer {
    /// Base address.
    fn pointer(&self) -> *const std::ffi::c_void;
}

/// Something with a base address for writing.
///
/// # Safety
/// The pointer must be valid for writes of `count` elements of the datatype.
pub unsafe trait PointerMut {
    /// Base address.
    fn pointer_mut(&mut self) -> *mut std::ffi::c_void;
}

/// Something with a datatype.
///
/// # Safety
/// The datatype must describe the elements behind the pointer.
pub unsafe trait AsDatatype {
    /// The datatype handle type.
    type Out: Datatype;
    /// The datatype of one element.
    fn as_datatype(&self) -> Self::Out;
}

/// A readable buffer.
///
/// # Safety
/// See the supertraits.
pub unsafe trait Buffer: Pointer + Collection + AsDatatype {}
/// A writable buffer.
///
/// # Safety
/// See the supertraits.
pub unsafe trait BufferMut: PointerMut + Collection + AsDatatype {}

macro_rules! buffer_impls {
    ($([$($g:tt)*] $t:ty, $count:expr, $ptr:expr, $ptr_mut:expr;)*) => {$(
        // SAFETY: the count is the number of `T` in the value.
        unsafe impl<$($g)*> Collection for $t { fn count(&self) -> Count { ($count)(self) as Count } }
        // SAFETY: points at the first `T` of the value.
        unsafe impl<$($g)*> Pointer for $t { fn pointer(&self) -> *const std::ffi::c_void { ($ptr)(self) } }
        // SAFETY: points at the first `T` of the value, exclusively borrowed.
        unsafe impl<$($g)*> PointerMut for $t { fn pointer_mut(&mut self) -> *mut std::ffi::c_void { ($ptr_mut)(self) } }
        // SAFETY: the elements are `T`.
        unsafe impl<$($g)*> AsDatatype for $t { type Out = T::Out; fn as_datatype(&self) -> T::Out { T::equivalent_datatype() } }
        // SAFETY: see the impls above.
        unsafe impl<$($g)*> Buffer for $t {}
        // SAFETY: see the impls above.
        unsafe impl<$($g)*> BufferMut for $t {}
    )*};
}
buffer_impls! {
    [T: Equivalence] T, |_: &T| 1, |s: &T| s as *const T as *const _, |s: &mut T| s as *mut T as *mut _;
    [T: Equivalence] [T], |s: &[T]| s.len(), |s: &[T]| s.as_ptr() as *const _, |s: &mut [T]| s.as_mut_ptr() as *mut _;
    [T: Equivalence] Vec<T>, |s: &Vec<T>| s.len(), |s: &Vec<T>| s.as_ptr() as *const _, |s: &mut Vec<T>| s.as_mut_ptr() as *mut _;
    [T: Equivalence, const D: usize] [T; D], |_: &[T; D]| D, |s: &[T; D]| s.as_ptr() as *const _, |s: &mut [T; D]| s.as_mut_ptr() as *mut _;
}

/// A buffer described by an explicit count and datatype (`View` in rsmpi).
pub struct View<'d, 'b, D, B: ?Sized>
where
    D: 'd + Datatype,
    B: 'b + Pointer,
{
    datatype: &'d D,
    count: Count,
    buffer: &'b B,
}

impl<'d, 'b, D: 'd + Datatype, B: 'b + Pointer + ?Sized> View<'d, 'b, D, B> {
    /// # Safety
    /// `buffer` must hold `count` elements of `datatype`.
    pub unsafe fn with_count_and_datatype(buffer: &'b B, count: Count, datatype: &'d D) -> Self {
        View {
            datatype,
            count,
            buffer,
        }
    }
}

/// A writable buffer described by an explicit count and datatype.
pub struct MutView<'d, 'b, D, B: ?Sized>
where
    D: 'd + Datatype,
    B: 'b + PointerMut,
{
    datatype: &'d D,
    count: Count,
    buffer: &'b mut B,
}

impl<'d, 'b, D: 'd + Datatype, B: 'b + PointerMut + ?Sized> MutView<'d, 'b, D, B> {
    /// # Safety
    /// `buffer` must hold `count` elements of `datatype`.
    pub unsafe fn with_count_and_datatype(
        buffer: &'b mut B,
        count: Count,
        datatype: &'d D,
    ) -> Self {
        MutView {
            datatype,
            count,
            buffer,
        }
    }
}

// SAFETY: the constructor's contract makes count and datatype describe the buffer.
unsafe impl<D: Datatype, B: Pointer + ?Sized> Collection for View<'_, '_, D, B> {
    fn count(&self) -> Count {
        self.count
    }
}
// SAFETY: as above.
unsafe impl<D: Datatype, B: Pointer + ?Sized> Pointer for View<'_, '_, D, B> {
    fn pointer(&self) -> *const std::ffi::c_void {
        self.buffer.pointer()
    }
}
// SAFETY: as above.
unsafe impl<'d, D: Datatype, B: Pointer + ?Sized> AsDatatype for View<'d, '_, D, B> {
    type Out = &'d D;
    fn as_datatype(&self) -> &'d D {
        self.datatype
    }
}
// SAFETY: as above.
unsafe impl<D: Datatype, B: Pointer + ?Sized> Buffer for View<'_, '_, D, B> {}
// SAFETY: as above.
unsafe impl<D: Datatype, B: PointerMut + ?Sized> Collection for MutView<'_, '_, D, B> {
    fn count(&self) -> Count {
        self.count
    }
}
// SAFETY: as above.
unsafe impl<D: Datatype, B: PointerMut + ?Sized> PointerMut for MutView<'_, '_, D, B> {
    fn pointer_mut(&mut self) -> *mut std::ffi::c_void {
        self.buffer.pointer_mut()
    }
}
// SAFETY: as above.
unsafe impl<'d, D: Datatype, B: PointerMut + ?Sized> AsDatatype for MutView<'d, '_, D, B> {
    type Out = &'d D;
    fn as_datatype(&self) -> &'d D {
        self.datatype
    }
}
// SAFETY: as above.
unsafe impl<D: Datatype, B: PointerMut + ?Sized> BufferMut for MutView<'_, '_, D, B> {}

// ---- packing ------------------------------------------------------------------

/// The bytes a buffer sends: borrowed when dense, packed otherwise.
pub(crate) enum Packed<'a> {
    Dense(&'a [u8]),
    Packed(Vec<u8>),
}

impl Packed<'_> {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Packed::Dense(b) => b,
            Packed::Packed(v) => v,
        }
    }
}

/// Converts packed data of whole `tm` elements between byte orders by
/// reversing every multi-byte value (a trailing partial element is left alone).
pub(crate) fn swap_packed(tm: &TypeMap, data: &mut [u8]) {
    if tm.size == 0 || tm.units.iter().all(|u| u.0 <= 1) {
        return;
    }
    for elem in data.chunks_exact_mut(tm.size) {
        let mut at = 0;
        for &(s, c) in &tm.units {
            let s = s as usize;
            for v in elem[at..at + s * c].chunks_exact_mut(s.max(1)) {
                v.reverse();
            }
            at += s * c;
        }
    }
}

/// Size in bytes of one element of `dt`'s signature.
pub(crate) fn size_of_type(id: u32) -> usize {
    type_map(id).size
}

/// The signature bytes of a buffer.
#[inline]
pub(crate) fn pack<B: Buffer + ?Sized>(buf: &B) -> Packed<'_> {
    let id = buf.as_datatype().type_id();
    let count = ucount(buf.count());
    let base = buf.pointer() as *const u8;
    // The predefined types are registered first, in `Prim::ALL`'s order.
    if let Some(p) = Prim::ALL.get(id as usize) {
        // SAFETY: `Buffer` guarantees `count` elements of `size` bytes at
        // `base`, and a predefined type's elements are dense.
        return Packed::Dense(unsafe { std::slice::from_raw_parts(base, count * p.size()) });
    }
    let tm = type_map(id);
    if tm.is_dense() {
        // SAFETY: `Buffer` guarantees `count` dense elements of `extent` bytes at `base`.
        return Packed::Dense(unsafe { std::slice::from_raw_parts(base, count * tm.extent) });
    }
    let mut out = Vec::with_capacity(count * tm.size);
    for i in 0..count {
        for &(off, len) in &tm.blocks {
            // SAFETY: the datatype describes element `i` inside the buffer (Buffer contract).
            let src = unsafe {
                std::slice::from_raw_parts(base.offset(i as isize * tm.extent as isize + off), len)
            };
            out.extend_from_slice(src);
        }
    }
    Packed::Packed(out)
}

/// A type map held by a layout: a predefined type's is borrowed for the
/// whole run (no reference count to touch on every receive), a derived
/// type's shared.
pub(crate) enum TmRef {
    Prim(&'static TypeMap),
    Derived(Arc<TypeMap>),
}

impl std::ops::Deref for TmRef {
    type Target = TypeMap;
    fn deref(&self) -> &TypeMap {
        match self {
            TmRef::Prim(t) => t,
            TmRef::Derived(t) => t,
        }
    }
}

/// The type map of datatype `id`, as a layout holds it.
#[inline]
pub(crate) fn type_map_ref(id: u32) -> TmRef {
    match prim_maps().get(id as usize) {
        Some(t) => TmRef::Prim(t),
        None => TmRef::Derived(type_map(id)),
    }
}

/// How a receive lands in a `BufferMut`: a view of the buffer, borrowed exclusively for
/// `'b`, that knows its element layout. Its methods are safe because the borrow lasts as
/// long as the view; it holds a raw address only so that a request can keep it while the
/// engine writes the buffer (see `crate::lend`).
pub(crate) struct RecvLayout<'b> {
    pub tm: TmRef,
    pub count: usize,
    base: *mut u8,
    buf: PhantomData<&'b mut [u8]>,
}

impl<'b> RecvLayout<'b> {
    #[inline]
    pub(crate) fn of<B: BufferMut + ?Sized>(buf: &'b mut B) -> RecvLayout<'b> {
        RecvLayout {
            tm: type_map_ref(buf.as_datatype().type_id()),
            count: ucount(buf.count()),
            base: buf.pointer_mut() as *mut u8,
            buf: PhantomData,
        }
    }

    /// A view of `count` elements of `tm` at `base`.
    ///
    /// # Safety
    /// The `count` elements (each `tm.extent` bytes, holding its blocks) from `base` must be
    /// writable, and reached by nothing else, for `'b`.
    pub(crate) unsafe fn from_raw(tm: TmRef, count: usize, base: *mut u8) -> RecvLayout<'b> {
        RecvLayout {
            tm,
            count,
            base,
            buf: PhantomData,
        }
    }

    /// Capacity in signature bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.count * self.tm.size
    }

    /// Bytes the elements span where the type map is dense (no gaps): `None` otherwise.
    fn dense_len(&self) -> Option<usize> {
        self.tm.is_dense().then_some(self.count * self.tm.extent)
    }

    /// The buffer as one dense slice, when its type map allows.
    pub(crate) fn dense(&mut self) -> Option<&mut [u8]> {
        let n = self.dense_len()?;
        if n == 0 {
            return Some(&mut []);
        }
        // SAFETY: `of`/`from_raw`: `n` writable bytes at `base`, ours for `'b`; `&mut self`
        // makes this the only view of them for the slice's life.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base, n) })
    }

    /// [`RecvLayout::dense`] for the whole of `'b`, or the layout back where it is not dense.
    pub(crate) fn into_dense(self) -> Result<&'b mut [u8], RecvLayout<'b>> {
        match self.dense_len() {
            Some(0) => Ok(&mut []),
            // SAFETY: as in `dense`; the layout is consumed, so the slice is the only view.
            Some(n) => Ok(unsafe { std::slice::from_raw_parts_mut(self.base, n) }),
            None => Err(self),
        }
    }

    /// The dense buffer's address and length, for a raw view that the engine writes while a
    /// request is in flight (`crate::lend` only).
    pub(crate) fn dense_raw(&self) -> Option<(*mut u8, usize)> {
        self.dense_len().map(|n| (self.base, n))
    }

    /// Converts the first `len` received bytes of a dense buffer (at most its size) from the
    /// other byte order, in place.
    pub(crate) fn swap_received(&mut self, len: usize) {
        let Some(n) = self.dense_len() else { return };
        if n == 0 {
            return;
        }
        // SAFETY: as in `dense`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.base, n.min(len)) };
        swap_packed(&self.tm, bytes);
    }

    /// The buffer's current contents as signature bytes (packed, gaps left out).
    pub(crate) fn pack(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.capacity());
        for i in 0..self.count {
            for &(off, len) in &self.tm.blocks {
                // SAFETY: `of`/`from_raw`: element `i` and its blocks lie in the buffer that
                // is ours for `'b`; `&self` keeps it from being written meanwhile.
                let s = unsafe {
                    std::slice::from_raw_parts(
                        self.base.offset(i as isize * self.tm.extent as isize + off),
                        len,
                    )
                };
                out.extend_from_slice(s);
            }
        }
        out
    }

    /// Scatters signature bytes into the buffer (as many whole blocks as `data` holds).
    pub(crate) fn unpack(&mut self, data: &[u8]) {
        if self.tm.is_dense() {
            // One copy of the whole elements `data` holds: element by element, a byte type
            // went one byte per call (0.36 GB/s for a received `Vec<u8>`).
            let n = data
                .len()
                .checked_div(self.tm.size)
                .map_or(0, |whole| self.count.min(whole) * self.tm.size);
            // SAFETY: `of`/`from_raw`: a dense buffer of `count` elements holds `n` bytes,
            // ours for `'b`, and `&mut self` excludes any other view of them.
            unsafe { crate::sys::copy::copy_raw(data.as_ptr(), self.base, n) };
            return;
        }
        let mut pos = 0;
        'outer: for i in 0..self.count {
            for &(off, len) in &self.tm.blocks {
                if pos + len > data.len() {
                    break 'outer;
                }
                // SAFETY: as above; the datatype describes element `i`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data[pos..].as_ptr(),
                        self.base.offset(i as isize * self.tm.extent as isize + off),
                        len,
                    );
                }
                pos += len;
            }
        }
    }
}

/// Received signature bytes as `n` values of `T` (the caller has converted their byte order
/// and checked that `data` holds `n` whole elements of `T`'s datatype).
pub(crate) fn vec_from_packed<T: Equivalence>(data: Vec<u8>, n: usize) -> Vec<T> {
    let dt = T::equivalent_datatype().type_id();
    if std::mem::size_of::<T>() == 1
        && std::mem::align_of::<T>() == 1
        && matches!(type_map_ref(dt).prim, Some(Prim::U8 | Prim::I8))
    {
        // Bytes are the values: hand the received vector over instead of copying it.
        let mut data = std::mem::ManuallyDrop::new(data);
        // SAFETY: `T` is a one-byte integer type (its datatype is `u8` or `i8`, and its size
        // and alignment are 1), for which every byte is a valid value, so the allocation
        // (same size and alignment) and its `len` initialised bytes are `len` values of `T`.
        return unsafe {
            Vec::from_raw_parts(data.as_mut_ptr().cast::<T>(), data.len(), data.capacity())
        };
    }
    let mut v: Vec<T> = Vec::with_capacity(n);
    // SAFETY: the vector has room for `n` elements of `T`, and nothing else reaches its
    // spare capacity while the layout lives.
    let mut layout = unsafe { RecvLayout::from_raw(type_map_ref(dt), n, v.as_mut_ptr().cast()) };
    layout.unpack(&data);
    // SAFETY: `data` holds `n` whole elements, and the datatype describes every data byte of
    // `T` (the `Equivalence` contract), so the unpack initialised all `n` of them.
    unsafe { v.set_len(n) };
    v
}

/// One value of `T`, received as its bytes by `fill` straight into its storage where `T`'s
/// datatype covers it densely; `Ok(None)` where it does not (the caller receives packed
/// bytes instead). `fill` returns how many bytes it wrote; fewer than `T` needs is a count
/// error naming both.
pub(crate) fn value_from<T: Equivalence, R>(
    fill: impl FnOnce(&mut [u8]) -> Result<(usize, R), crate::Error>,
) -> Result<Option<(T, R)>, crate::Error> {
    let dt = T::equivalent_datatype().type_id();
    let size = size_of_type(dt);
    if !(type_map_ref(dt).is_dense() && size == std::mem::size_of::<T>()) {
        return Ok(None);
    }
    // Zeroed, so that the bytes handed to `fill` are initialised whatever it writes.
    let mut slot = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: `size` is `T`'s size, and the zeroed slot is `size` initialised bytes that
    // only this slice reaches while it lives.
    let bytes = unsafe { std::slice::from_raw_parts_mut(slot.as_mut_ptr().cast::<u8>(), size) };
    let (got, r) = fill(bytes)?;
    if got != size {
        return Err(crate::Error::new(
            crate::ErrorClass::Count,
            format!("expected one value of {size} bytes, received {got} bytes"),
        ));
    }
    // SAFETY: a dense datatype of `T`'s size covers every byte of `T`, and all of them were
    // received as a value of that datatype (the `Equivalence` contract makes it a valid `T`).
    Ok(Some((unsafe { slot.assume_init() }, r)))
}

impl DatatypeRef<'_> {
    #[doc(hidden)]
    pub fn __from_id(id: u32) -> Self {
        DatatypeRef::new(id)
    }
}

/// A `'static` reference to a derived datatype (datatypes live for the whole run).
#[doc(hidden)]
pub fn __leak(d: UserDatatype) -> DatatypeRef<'static> {
    DatatypeRef::new(d.0)
}

/// A `'static` reference to any datatype handle (used by the derive).
#[doc(hidden)]
pub fn __ref<D: UncommittedDatatype>(d: &D) -> DatatypeRef<'static> {
    DatatypeRef::new(d.type_id())
}

/// Registers a type map under an id of its own even when an equal map exists,
/// for types that operations must tell apart by datatype
/// (`collective::ValueIndex`).
pub(crate) fn register_distinct(tm: TypeMap) -> u32 {
    let mut reg = registry().write().unwrap_or_else(|p| p.into_inner());
    reg.push(Arc::new(tm));
    (reg.len() - 1) as u32
}

// ---- partitioned buffers (varcount collectives) ---------------------------------

/// A buffer split into one block per rank: `counts[i]` elements starting at
/// element `displs[i]` (rsmpi's `Partitioned`).
pub trait Partitioned {
    /// The number of elements in each block.
    fn counts(&self) -> &[Count];
    /// The offset, in elements, of each block from the start of the buffer.
    fn displs(&self) -> &[Count];
}

/// A partitioned buffer to send from.
///
/// The library reads `counts()[i]` elements at element `displs()[i]` from
/// `pointer()`: an implementation of `Pointer` for a partitioned type vouches
/// for that range.
pub trait PartitionedBuffer: Partitioned + Pointer + AsDatatype {}

/// A partitioned buffer to receive into (same contract, for writing).
pub trait PartitionedBufferMut: Partitioned + PointerMut + AsDatatype {}

/// Adds a partitioning to a `Buffer` (for `scatter_varcount_into_root` and
/// `all_to_all_varcount_into`).
pub struct Partition<'b, B: 'b + ?Sized, C, D> {
    buf: &'b B,
    counts: C,
    displs: D,
}

impl<'b, B, C, D> Partition<'b, B, C, D>
where
    B: 'b + Buffer + ?Sized,
    C: std::borrow::Borrow<[Count]>,
    D: std::borrow::Borrow<[Count]>,
{
    /// Partitions `buf` into blocks of `counts` elements at `displs`.
    ///
    /// # Panics
    /// When a count or displacement is negative or a block reaches past the
    /// end of `buf` (as rsmpi asserts).
    pub fn new(buf: &'b B, counts: C, displs: D) -> Self {
        check_partition(buf.count(), counts.borrow(), displs.borrow());
        Partition {
            buf,
            counts,
            displs,
        }
    }
}

/// Adds a partitioning to a `BufferMut` (for the varcount gathers and
/// `scatter`'s counterpart on the receiving side of all-to-all).
pub struct PartitionMut<'b, B: 'b + ?Sized, C, D> {
    buf: &'b mut B,
    counts: C,
    displs: D,
}

impl<'b, B, C, D> PartitionMut<'b, B, C, D>
where
    B: 'b + BufferMut + ?Sized,
    C: std::borrow::Borrow<[Count]>,
    D: std::borrow::Borrow<[Count]>,
{
    /// Partitions `buf` into blocks of `counts` elements at `displs`.
    ///
    /// # Panics
    /// As [`Partition::new`].
    pub fn new(buf: &'b mut B, counts: C, displs: D) -> Self {
        check_partition(buf.count(), counts.borrow(), displs.borrow());
        PartitionMut {
            buf,
            counts,
            displs,
        }
    }
}

fn check_partition(n: Count, counts: &[Count], displs: &[Count]) {
    assert!(
        counts
            .iter()
            .zip(displs)
            .all(|(&c, &d)| c >= 0 && d >= 0 && c.checked_add(d).is_some_and(|e| e <= n)),
        "a partition block lies outside its buffer of {n} elements"
    );
}

// SAFETY: the datatype is the partitioned buffer's own.
unsafe impl<B: AsDatatype + ?Sized, C, D> AsDatatype for Partition<'_, B, C, D> {
    type Out = B::Out;
    fn as_datatype(&self) -> B::Out {
        self.buf.as_datatype()
    }
}
// SAFETY: the pointer of the partitioned buffer; `new` checked that every
// block lies inside it.
unsafe impl<B: Pointer + ?Sized, C, D> Pointer for Partition<'_, B, C, D> {
    fn pointer(&self) -> *const std::ffi::c_void {
        self.buf.pointer()
    }
}
impl<B: ?Sized, C: std::borrow::Borrow<[Count]>, D: std::borrow::Borrow<[Count]>> Partitioned
    for Partition<'_, B, C, D>
{
    fn counts(&self) -> &[Count] {
        self.counts.borrow()
    }
    fn displs(&self) -> &[Count] {
        self.displs.borrow()
    }
}
impl<
        B: Pointer + AsDatatype + ?Sized,
        C: std::borrow::Borrow<[Count]>,
        D: std::borrow::Borrow<[Count]>,
    > PartitionedBuffer for Partition<'_, B, C, D>
{
}

// SAFETY: as for `Partition`.
unsafe impl<B: AsDatatype + ?Sized, C, D> AsDatatype for PartitionMut<'_, B, C, D> {
    type Out = B::Out;
    fn as_datatype(&self) -> B::Out {
        self.buf.as_datatype()
    }
}
// SAFETY: as for `Partition`, and the buffer is exclusively borrowed.
unsafe impl<B: PointerMut + ?Sized, C, D> PointerMut for PartitionMut<'_, B, C, D> {
    fn pointer_mut(&mut self) -> *mut std::ffi::c_void {
        self.buf.pointer_mut()
    }
}
impl<B: ?Sized, C: std::borrow::Borrow<[Count]>, D: std::borrow::Borrow<[Count]>> Partitioned
    for PartitionMut<'_, B, C, D>
{
    fn counts(&self) -> &[Count] {
        self.counts.borrow()
    }
    fn displs(&self) -> &[Count] {
        self.displs.borrow()
    }
}
impl<
        B: PointerMut + AsDatatype + ?Sized,
        C: std::borrow::Borrow<[Count]>,
        D: std::borrow::Borrow<[Count]>,
    > PartitionedBufferMut for PartitionMut<'_, B, C, D>
{
}

// ---- what the C ABI library needs (crates/metampi-abi) ----------------------------

/// Datatype queries and constructors that the C ABI library (`metampi-abi`)
/// needs beyond rsmpi's API. Not part of the Rust API.
#[doc(hidden)]
pub mod abi {
    use super::{register, register_distinct, type_map, TypeMap};

    /// The layout facts MPI lets a program ask about a datatype.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Layout {
        /// Bytes of data in one element (`MPI_Type_size`).
        pub size: usize,
        /// Lower bound (`MPI_Type_get_extent`).
        pub lb: isize,
        /// Distance between consecutive elements.
        pub extent: usize,
        /// The smallest data offset (`MPI_Type_get_true_extent`).
        pub true_lb: isize,
        /// The span of the data bytes.
        pub true_extent: usize,
        /// Whether a predefined element kind runs through all data bytes.
        pub uniform: bool,
    }

    /// The layout of datatype `id`.
    pub fn layout(id: u32) -> Layout {
        let tm = type_map(id);
        let lo = tm.blocks.iter().map(|b| b.0).min().unwrap_or(0);
        let hi = tm
            .blocks
            .iter()
            .map(|b| b.0 + b.1 as isize)
            .max()
            .unwrap_or(0);
        Layout {
            size: tm.size,
            lb: tm.lb,
            extent: tm.extent,
            true_lb: lo,
            true_extent: (hi - lo) as usize,
            uniform: tm.prim.is_some(),
        }
    }

    /// Datatype `id` with lower bound `lb` and extent `extent` (`MPI_Type_create_resized`).
    pub fn resized(id: u32, lb: isize, extent: usize) -> u32 {
        let mut tm = (*type_map(id)).clone();
        tm.lb = lb;
        tm.extent = extent;
        register(tm)
    }

    /// A datatype of `size` bytes that no reduction knows (`long double`,
    /// `MPI_PACKED`'s cousins): it travels, but a sum over it is an error.
    pub fn opaque(size: usize) -> u32 {
        register_distinct(TypeMap {
            prim: None,
            blocks: vec![(0, size)],
            size,
            extent: size,
            lb: 0,
            units: vec![(1, size)],
        })
    }

    /// How many basic values `bytes` signature bytes of datatype `id` hold
    /// (`MPI_Get_elements`); `None` when they end inside a value.
    pub fn elements(id: u32, bytes: usize) -> Option<usize> {
        let tm = type_map(id);
        let per: usize = tm.units.iter().map(|u| u.1).sum();
        if tm.size == 0 {
            return Some(0);
        }
        let whole = bytes / tm.size;
        let mut left = bytes % tm.size;
        let mut n = whole * per;
        for &(s, c) in &tm.units {
            let s = (s as usize).max(1);
            let take = (left / s).min(c);
            n += take;
            left -= take * s;
            if take < c {
                break;
            }
        }
        (left == 0).then_some(n)
    }

    /// How many blocks a type of `count` copies of `blocklength` elements of `old`
    /// would list (dense runs count once): what a constructor would allocate.
    pub fn blocks_for(old: u32, count: usize, blocklength: usize) -> usize {
        let tm = type_map(old);
        let dense = matches!(tm.blocks[..], [(_, l)] if l == tm.extent);
        let per = if dense {
            1
        } else {
            blocklength.saturating_mul(tm.blocks.len())
        };
        count.saturating_mul(per)
    }

    /// The data blocks `(offset, len)` of one element of `id`, in signature order.
    pub fn blocks(id: u32) -> Vec<(isize, usize)> {
        type_map(id).blocks.clone()
    }

    /// The values of one packed element of `id`, as runs of (value size, count): what a
    /// byte-order conversion (`MPI_Pack_external`) reverses.
    pub fn units(id: u32) -> Vec<(u8, usize)> {
        type_map(id).units.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strided type (two elements of three blocks of two `i32`, at a stride
    /// of five) packs exactly its blocks, in order, and unpacks into them
    /// alone, leaving the gaps as they were; data that ends inside a block
    /// fills only the whole blocks before it. This is the raw-pointer code of
    /// `pack` and `RecvLayout::unpack` on plain vectors: Miri checks that
    /// every offset stays inside the buffer (`.ci/miri.sh`).
    #[test]
    fn a_strided_type_packs_and_unpacks_only_its_blocks() {
        let vt = UserDatatype::vector(3, 2, 5, &i32::equivalent_datatype());
        // One element spans 12 `i32`, its blocks start at 0, 5 and 10.
        assert_eq!(type_map(vt.type_id()).extent, 12 * 4);
        let picked: Vec<usize> = (0..2)
            .flat_map(|e| [0, 1, 5, 6, 10, 11].map(|j| e * 12 + j))
            .collect();
        let src: Vec<i32> = (0..24).map(|i| 100 + i).collect();
        // SAFETY: 24 `i32` hold two elements of 12.
        let view = unsafe { View::with_count_and_datatype(&src[..], 2, &vt) };
        let want: Vec<u8> = picked.iter().flat_map(|&i| src[i].to_ne_bytes()).collect();
        match pack(&view) {
            Packed::Packed(bytes) => assert_eq!(bytes, want),
            Packed::Dense(_) => panic!("a strided type is not dense"),
        }
        // All the data; all but the last 5 bytes (5 whole blocks of 8); 20 bytes (2).
        for (data, values) in [(want.len(), 12), (want.len() - 5, 10), (20, 4)] {
            let mut dst = [-1i32; 24];
            // SAFETY: as above.
            let mut view = unsafe { MutView::with_count_and_datatype(&mut dst[..], 2, &vt) };
            let mut layout = RecvLayout::of(&mut view);
            assert!(layout.dense().is_none());
            layout.unpack(&want[..data]);
            for (i, &v) in dst.iter().enumerate() {
                let filled = picked[..values].contains(&i);
                assert_eq!(v, if filled { src[i] } else { -1 }, "{data} bytes: i32 {i}");
            }
        }
    }
}
