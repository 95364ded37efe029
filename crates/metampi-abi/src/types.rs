//! Datatypes and reduction operations: MPICH's predefined handles mapped onto
//! the engine's type maps, derived datatypes with the envelope C can ask
//! about, packing, and user operations from C functions.

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use metampi::collective::{SystemOperation, UserOperation, ValueIndex};
use metampi::datatype::abi as dtabi;
use metampi::datatype::{DatatypeRef, Equivalence, UncommittedDatatype, UserDatatype};
use metampi::Count;

use crate::consts::*;
use crate::err::{Fail, R};
use crate::raw;
use crate::state::Table;

/// A C reduction function: `(invec, inoutvec, len, datatype)`.
pub type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut Handle);
/// `MPI_User_function_c` (`MPI_Op_create_c`): the length as an `MPI_Count`.
pub type UserFnC = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut i64, *mut Handle);

/// A user reduction function, of either length type.
#[derive(Clone, Copy)]
pub enum UserFnRef {
    Int(UserFn),
    Large(UserFnC),
}

// ---- predefined datatypes --------------------------------------------------------

/// A predefined datatype: its engine id and its name.
#[derive(Clone, Copy)]
struct Named {
    id: u32,
    name: &'static str,
}

/// Predefined handles `0x4c00ssii` by their index `ii`, and the pair types
/// `0x8c00000n` by `n` (after the 0x46 simple ones).
fn predefined() -> &'static [Option<Named>] {
    static TABLE: OnceLock<Vec<Option<Named>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        fn id<T: Equivalence>() -> u32 {
            metampi::datatype::__ref(&T::equivalent_datatype()).type_id()
        }
        let c32 = id::<num_complex::Complex<f32>>();
        let c64 = id::<num_complex::Complex<f64>>();
        let ld = dtabi::opaque(16);
        let ld_c = dtabi::opaque(32);
        let two_f32 = UserDatatype::contiguous(2, &f32::equivalent_datatype())
            .as_ref()
            .type_id();
        let two_f64 = UserDatatype::contiguous(2, &f64::equivalent_datatype())
            .as_ref()
            .type_id();
        let ld_int = dtabi::resized(dtabi::opaque(20), 0, 32);
        let simple: &[(u32, u32, &'static str)] = &[
            (0x01, id::<i8>(), "MPI_CHAR"),
            (0x02, id::<u8>(), "MPI_UNSIGNED_CHAR"),
            (0x03, id::<i16>(), "MPI_SHORT"),
            (0x04, id::<u16>(), "MPI_UNSIGNED_SHORT"),
            (0x05, id::<i32>(), "MPI_INT"),
            (0x06, id::<u32>(), "MPI_UNSIGNED"),
            (0x07, id::<i64>(), "MPI_LONG"),
            (0x08, id::<u64>(), "MPI_UNSIGNED_LONG"),
            (0x09, id::<i64>(), "MPI_LONG_LONG"),
            (0x0a, id::<f32>(), "MPI_FLOAT"),
            (0x0b, id::<f64>(), "MPI_DOUBLE"),
            (0x0c, ld, "MPI_LONG_DOUBLE"),
            (0x0d, id::<u8>(), "MPI_BYTE"),
            (0x0e, id::<i32>(), "MPI_WCHAR"),
            (0x0f, id::<u8>(), "MPI_PACKED"),
            (0x16, id::<ValueIndex<i32, i32>>(), "MPI_2INT"),
            (0x18, id::<i8>(), "MPI_SIGNED_CHAR"),
            (0x19, id::<u64>(), "MPI_UNSIGNED_LONG_LONG"),
            (0x1a, id::<u8>(), "MPI_CHARACTER"),
            (0x1b, id::<i32>(), "MPI_INTEGER"),
            (0x1c, id::<f32>(), "MPI_REAL"),
            (0x1d, id::<i32>(), "MPI_LOGICAL"),
            (0x1e, c32, "MPI_COMPLEX"),
            (0x1f, id::<f64>(), "MPI_DOUBLE_PRECISION"),
            (0x20, id::<ValueIndex<i32, i32>>(), "MPI_2INTEGER"),
            (0x21, two_f32, "MPI_2REAL"),
            (0x22, c64, "MPI_DOUBLE_COMPLEX"),
            (0x23, two_f64, "MPI_2DOUBLE_PRECISION"),
            (0x27, id::<f32>(), "MPI_REAL4"),
            (0x28, c32, "MPI_COMPLEX8"),
            (0x29, id::<f64>(), "MPI_REAL8"),
            (0x2a, c64, "MPI_COMPLEX16"),
            (0x2b, ld, "MPI_REAL16"),
            (0x2c, ld_c, "MPI_COMPLEX32"),
            (0x2d, id::<i8>(), "MPI_INTEGER1"),
            (0x2f, id::<i16>(), "MPI_INTEGER2"),
            (0x30, id::<i32>(), "MPI_INTEGER4"),
            (0x31, id::<i64>(), "MPI_INTEGER8"),
            (0x33, id::<bool>(), "MPI_CXX_BOOL"),
            (0x34, c32, "MPI_CXX_FLOAT_COMPLEX"),
            (0x35, c64, "MPI_CXX_DOUBLE_COMPLEX"),
            (0x36, ld_c, "MPI_CXX_LONG_DOUBLE_COMPLEX"),
            (0x37, id::<i8>(), "MPI_INT8_T"),
            (0x38, id::<i16>(), "MPI_INT16_T"),
            (0x39, id::<i32>(), "MPI_INT32_T"),
            (0x3a, id::<i64>(), "MPI_INT64_T"),
            (0x3b, id::<u8>(), "MPI_UINT8_T"),
            (0x3c, id::<u16>(), "MPI_UINT16_T"),
            (0x3d, id::<u32>(), "MPI_UINT32_T"),
            (0x3e, id::<u64>(), "MPI_UINT64_T"),
            (0x3f, id::<bool>(), "MPI_C_BOOL"),
            (0x40, c32, "MPI_C_FLOAT_COMPLEX"),
            (0x41, c64, "MPI_C_DOUBLE_COMPLEX"),
            (0x42, ld_c, "MPI_C_LONG_DOUBLE_COMPLEX"),
            (0x43, id::<i64>(), "MPI_AINT"),
            (0x44, id::<i64>(), "MPI_OFFSET"),
            (0x45, id::<i64>(), "MPI_COUNT"),
        ];
        let pairs: [(u32, &'static str); 5] = [
            (id::<ValueIndex<f32, i32>>(), "MPI_FLOAT_INT"),
            (id::<ValueIndex<f64, i32>>(), "MPI_DOUBLE_INT"),
            (id::<ValueIndex<i64, i32>>(), "MPI_LONG_INT"),
            (id::<ValueIndex<i16, i32>>(), "MPI_SHORT_INT"),
            (ld_int, "MPI_LONG_DOUBLE_INT"),
        ];
        let mut t = vec![None; PAIR_AT + pairs.len()];
        for &(i, id, name) in simple {
            t[i as usize] = Some(Named { id, name });
        }
        for (n, &(id, name)) in pairs.iter().enumerate() {
            t[PAIR_AT + n] = Some(Named { id, name });
        }
        t
    })
}

const PAIR_AT: usize = 0x46;

/// The index in [`predefined`] of a predefined handle of MPICH's ABI: `0x4c00ssii` (size
/// `ss`, index `ii`), or a pair type `0x8c00000n`.
#[cfg(not(std_abi))]
fn predefined_index(h: Handle) -> Option<usize> {
    let u = h as u32;
    if u & 0xffff_0000 == 0x4c00_0000 {
        Some((u & 0xff) as usize)
    } else if (0x8c00_0000..0x8c00_0005).contains(&u) {
        Some(PAIR_AT + (u & 0xff) as usize)
    } else {
        None
    }
}

/// The handle MPICH's ABI gives the predefined datatype at `idx` in [`predefined`], of
/// `size` bytes (a pair type's handle has no size in it).
#[cfg(not(std_abi))]
fn predefined_handle(idx: u32, size: c_int) -> Handle {
    match idx.checked_sub(PAIR_AT as u32) {
        Some(n) => (0x8c00_0000 | n) as Handle,
        None => (0x4c00_0000 | ((size as u32) << 8) | idx) as Handle,
    }
}

/// The standard ABI's predefined datatypes (`0x2xx`) and their index in [`predefined`].
#[cfg(std_abi)]
const STANDARD_TYPES: [(usize, u8); 60] = [
    (0x243, 0x01),
    (0x245, 0x02),
    (0x208, 0x03),
    (0x20c, 0x04),
    (0x209, 0x05),
    (0x20d, 0x06),
    (0x20a, 0x07),
    (0x20e, 0x08),
    (0x20b, 0x09),
    (0x210, 0x0a),
    (0x214, 0x0b),
    (0x220, 0x0c),
    (0x247, 0x0d),
    (0x23c, 0x0e),
    (0x207, 0x0f),
    (0x22b, 0x16),
    (0x244, 0x18),
    (0x20f, 0x19),
    (0x21e, 0x1a),
    (0x219, 0x1b),
    (0x21a, 0x1c),
    (0x218, 0x1d),
    (0x21b, 0x1e),
    (0x21c, 0x1f),
    (0x232, 0x20),
    (0x230, 0x21),
    (0x21d, 0x22),
    (0x231, 0x23),
    (0x2d2, 0x27),
    (0x2db, 0x28),
    (0x2da, 0x29),
    (0x2e3, 0x2a),
    (0x2e2, 0x2b),
    (0x2eb, 0x2c),
    (0x2c1, 0x2d),
    (0x2c9, 0x2f),
    (0x2d1, 0x30),
    (0x2d9, 0x31),
    (0x239, 0x33),
    (0x213, 0x34),
    (0x217, 0x35),
    (0x225, 0x36),
    (0x240, 0x37),
    (0x248, 0x38),
    (0x250, 0x39),
    (0x258, 0x3a),
    (0x241, 0x3b),
    (0x249, 0x3c),
    (0x251, 0x3d),
    (0x259, 0x3e),
    (0x238, 0x3f),
    (0x212, 0x40),
    (0x216, 0x41),
    (0x224, 0x42),
    (0x201, 0x43),
    (0x203, 0x44),
    (0x202, 0x45),
    (0x228, PAIR_AT as u8),
    (0x229, PAIR_AT as u8 + 1),
    (0x22a, PAIR_AT as u8 + 2),
];

/// [`STANDARD_TYPES`] by handle - 0x200 (0: none), for a lookup without a search.
#[cfg(std_abi)]
const STANDARD_INDEX: [u8; 256] = {
    let mut a = [0u8; 256];
    let mut i = 0;
    while i < STANDARD_TYPES.len() {
        a[STANDARD_TYPES[i].0 - 0x200] = STANDARD_TYPES[i].1;
        i += 1;
    }
    a[0x22c - 0x200] = PAIR_AT as u8 + 3;
    a[0x22d - 0x200] = PAIR_AT as u8 + 4;
    a
};

#[cfg(std_abi)]
fn predefined_index(h: Handle) -> Option<usize> {
    match STANDARD_INDEX.get(h.wrapping_sub(0x200)) {
        Some(&i) if i != 0 => Some(i as usize),
        _ => None,
    }
}

#[cfg(std_abi)]
fn predefined_handle(idx: u32, _size: c_int) -> Handle {
    (0..STANDARD_INDEX.len())
        .find(|&i| STANDARD_INDEX[i] as u32 == idx)
        .map_or(DATATYPE_NULL, |i| 0x200 + i)
}

/// `MPI_CHAR`'s handle in this library's ABI.
pub fn predefined_char() -> Handle {
    predefined_handle(0x01, 1)
}

/// `MPI_UNSIGNED_LONG_LONG`'s handle in this library's ABI.
pub fn predefined_ull() -> Handle {
    predefined_handle(0x19, 8)
}

fn predefined_of(h: Handle) -> Option<Named> {
    predefined().get(predefined_index(h)?).copied().flatten()
}

// ---- derived datatypes ----------------------------------------------------------

/// How a derived datatype was made (`MPI_Type_get_envelope`/`get_contents`).
#[derive(Clone, Default)]
pub struct Envelope {
    pub combiner: c_int,
    pub ints: Vec<c_int>,
    pub aints: Vec<isize>,
    pub types: Vec<Sub>,
}

/// A datatype a derived one was made of: kept alive here, since the program may free its
/// handle while the derived type lives on (and `MPI_Type_get_contents` must still name it).
#[derive(Clone)]
pub enum Sub {
    Named(Handle),
    Derived(Arc<DtEntry>),
}

/// What the datatypes `hs` are, for an envelope.
fn subs(hs: &[Handle]) -> Vec<Sub> {
    hs.iter()
        .map(|&h| TYPES.get(h).map_or(Sub::Named(h), Sub::Derived))
        .collect()
}

/// A derived datatype.
pub struct DtEntry {
    pub id: u32,
    pub committed: bool,
    pub name: Mutex<String>,
    pub env: Envelope,
}

pub static TYPES: Table<Arc<DtEntry>> = Table::new(DATATYPE_BASE);

/// The engine's datatype behind handle `h`, committed.
#[inline]
pub fn dtype(h: Handle) -> R<DatatypeRef<'static>> {
    if let Some(n) = predefined_of(h) {
        return Ok(DatatypeRef::__from_id(n.id));
    }
    match TYPES.get(h) {
        Some(e) if e.committed => Ok(DatatypeRef::__from_id(e.id)),
        Some(_) => Err(Fail::new(
            ERR_TYPE,
            format!("datatype {h:#x} is not committed (MPI_Type_commit)"),
        )),
        None => Err(bad_type(h)),
    }
}

/// The engine id of the committed datatype behind `h` (for packing).
pub fn committed_id(h: Handle) -> R<u32> {
    Ok(dtype(h)?.type_id())
}

/// The engine id of any datatype handle, committed or not (for constructors and queries).
pub fn type_id_any(h: Handle) -> R<u32> {
    if let Some(n) = predefined_of(h) {
        return Ok(n.id);
    }
    TYPES.get(h).map(|e| e.id).ok_or_else(|| bad_type(h))
}

fn bad_type(h: Handle) -> Fail {
    if h == DATATYPE_NULL {
        Fail::new(ERR_TYPE, "MPI_DATATYPE_NULL is not a datatype")
    } else {
        Fail::new(ERR_TYPE, format!("{h:#x} is not a datatype"))
    }
}

fn new_type(id: u32, env: Envelope) -> Handle {
    TYPES.insert(Arc::new(DtEntry {
        id,
        committed: false,
        name: Mutex::new(String::new()),
        env,
    }))
}

/// Most blocks a derived datatype may list (8 M): a larger layout is refused, not allocated.
const MAX_BLOCKS: usize = 1 << 23;

/// Refuses a constructor whose type map would list more than [`MAX_BLOCKS`] blocks.
fn blocks_ok(old: Handle, count: usize, blocklength: usize) -> R {
    let n = dtabi::blocks_for(type_id_any(old)?, count, blocklength);
    if n > MAX_BLOCKS {
        return Err(Fail::new(
            ERR_COUNT,
            format!(
                "the datatype would have {n} separate blocks; metampi keeps at most {MAX_BLOCKS}"
            ),
        ));
    }
    Ok(())
}

fn count_ok(n: c_int, what: &str) -> R<usize> {
    if n < 0 {
        return Err(Fail::new(ERR_COUNT, format!("{what} {n} is negative")));
    }
    Ok(n as usize)
}

/// `count` of old type `old` as a buffer at `p`.
pub fn buf(p: *const c_void, count: c_int, dt: Handle) -> R<raw::CBuf> {
    if count < 0 {
        return Err(Fail::new(ERR_COUNT, format!("count {count} is negative")));
    }
    Ok(raw::CBuf::new(p, count as Count, dtype(dt)?))
}

/// Bytes of data in one element of `h`.
pub fn size_of(h: Handle) -> R<usize> {
    Ok(dtabi::layout(type_id_any(h)?).size)
}

pub fn layout(h: Handle) -> R<dtabi::Layout> {
    Ok(dtabi::layout(type_id_any(h)?))
}

fn dref(id: u32) -> DatatypeRef<'static> {
    DatatypeRef::__from_id(id)
}

mpi! {
    fn MPI_Type_size / PMPI_Type_size(dt: Handle, size: *mut c_int) {
        let s = size_of(dt)?;
        raw::put(size, c_int::try_from(s).unwrap_or(UNDEFINED))
    }
    fn MPI_Type_size_x / PMPI_Type_size_x(dt: Handle, size: *mut i64) {
        raw::put(size, size_of(dt)? as i64)
    }
    fn MPI_Type_size_c / PMPI_Type_size_c(dt: Handle, size: *mut i64) {
        raw::put(size, size_of(dt)? as i64)
    }
    fn MPI_Type_get_extent / PMPI_Type_get_extent(dt: Handle, lb: *mut isize, extent: *mut isize) {
        let l = layout(dt)?;
        raw::put(lb, l.lb)?;
        raw::put(extent, l.extent as isize)
    }
    fn MPI_Type_get_extent_x / PMPI_Type_get_extent_x(dt: Handle, lb: *mut i64, extent: *mut i64) {
        let l = layout(dt)?;
        raw::put(lb, l.lb as i64)?;
        raw::put(extent, l.extent as i64)
    }
    fn MPI_Type_get_true_extent / PMPI_Type_get_true_extent(dt: Handle, lb: *mut isize, extent: *mut isize) {
        let l = layout(dt)?;
        raw::put(lb, l.true_lb)?;
        raw::put(extent, l.true_extent as isize)
    }
    fn MPI_Type_get_true_extent_x / PMPI_Type_get_true_extent_x(dt: Handle, lb: *mut i64, extent: *mut i64) {
        let l = layout(dt)?;
        raw::put(lb, l.true_lb as i64)?;
        raw::put(extent, l.true_extent as i64)
    }
    fn MPI_Type_contiguous / PMPI_Type_contiguous(count: c_int, old: Handle, new: *mut Handle) {
        blocks_ok(old, 1, count_ok(count, "count")?)?;
        let t = UserDatatype::contiguous(count, &dref(type_id_any(old)?));
        raw::put(new, new_type(t.as_ref().type_id(), Envelope {
            combiner: COMBINER_CONTIGUOUS, ints: vec![count], aints: vec![], types: subs(&[old]),
        }))
    }
    fn MPI_Type_vector / PMPI_Type_vector(count: c_int, bl: c_int, stride: c_int, old: Handle, new: *mut Handle) {
        blocks_ok(old, count_ok(count, "count")?, count_ok(bl, "block length")?)?;
        let t = UserDatatype::vector(count, bl, stride, &dref(type_id_any(old)?));
        raw::put(new, new_type(t.as_ref().type_id(), Envelope {
            combiner: COMBINER_VECTOR, ints: vec![count, bl, stride], aints: vec![], types: subs(&[old]),
        }))
    }
    fn MPI_Type_create_hvector / PMPI_Type_create_hvector(count: c_int, bl: c_int, stride: isize, old: Handle, new: *mut Handle) {
        blocks_ok(old, count_ok(count, "count")?, count_ok(bl, "block length")?)?;
        let t = UserDatatype::heterogeneous_vector(count, bl, stride, &dref(type_id_any(old)?));
        raw::put(new, new_type(t.as_ref().type_id(), Envelope {
            combiner: COMBINER_HVECTOR, ints: vec![count, bl], aints: vec![stride], types: subs(&[old]),
        }))
    }
    fn MPI_Type_indexed / PMPI_Type_indexed(count: c_int, bls: *const c_int, displs: *const c_int, old: Handle, new: *mut Handle) {
        count_ok(count, "count")?;
        let (b, d) = (raw::slice(bls, count)?, raw::slice(displs, count)?);
        if let Some(x) = b.iter().find(|&&x| x < 0) {
            return Err(Fail::new(ERR_ARG, format!("block length {x} is negative")));
        }
        let t = UserDatatype::indexed(b, d, &dref(type_id_any(old)?));
        let mut ints = vec![count];
        ints.extend_from_slice(b);
        ints.extend_from_slice(d);
        raw::put(new, new_type(t.as_ref().type_id(), Envelope {
            combiner: COMBINER_INDEXED, ints, aints: vec![], types: subs(&[old]),
        }))
    }
    fn MPI_Type_create_hindexed / PMPI_Type_create_hindexed(count: c_int, bls: *const c_int, displs: *const isize, old: Handle, new: *mut Handle) {
        count_ok(count, "count")?;
        let (b, d) = (raw::slice(bls, count)?, raw::slice(displs, count)?);
        if let Some(x) = b.iter().find(|&&x| x < 0) {
            return Err(Fail::new(ERR_ARG, format!("block length {x} is negative")));
        }
        let t = UserDatatype::heterogeneous_indexed(b, d, &dref(type_id_any(old)?));
        let mut ints = vec![count];
        ints.extend_from_slice(b);
        raw::put(new, new_type(t.as_ref().type_id(), Envelope {
            combiner: COMBINER_HINDEXED, ints, aints: d.to_vec(), types: subs(&[old]),
        }))
    }
    fn MPI_Type_create_indexed_block / PMPI_Type_create_indexed_block(count: c_int, bl: c_int, displs: *const c_int, old: Handle, new: *mut Handle) {
        count_ok(count, "count")?;
        count_ok(bl, "block length")?;
        let d = raw::slice(displs, count)?;
        let t = UserDatatype::indexed_block(bl, d, &dref(type_id_any(old)?));
        let mut ints = vec![count, bl];
        ints.extend_from_slice(d);
        raw::put(new, new_type(t.as_ref().type_id(), Envelope {
            combiner: COMBINER_INDEXED_BLOCK, ints, aints: vec![], types: subs(&[old]),
        }))
    }
    fn MPI_Type_create_hindexed_block / PMPI_Type_create_hindexed_block(count: c_int, bl: c_int, displs: *const isize, old: Handle, new: *mut Handle) {
        count_ok(count, "count")?;
        count_ok(bl, "block length")?;
        let d = raw::slice(displs, count)?;
        let t = UserDatatype::heterogeneous_indexed_block(bl, d, &dref(type_id_any(old)?));
        raw::put(new, new_type(t.as_ref().type_id(), Envelope {
            combiner: COMBINER_HINDEXED_BLOCK, ints: vec![count, bl], aints: d.to_vec(), types: subs(&[old]),
        }))
    }
    fn MPI_Type_create_struct / PMPI_Type_create_struct(count: c_int, bls: *const c_int, displs: *const isize, types: *const Handle, new: *mut Handle) {
        count_ok(count, "count")?;
        let (b, d, t) = (raw::slice(bls, count)?, raw::slice(displs, count)?, raw::slice(types, count)?);
        if let Some(x) = b.iter().find(|&&x| x < 0) {
            return Err(Fail::new(ERR_ARG, format!("block length {x} is negative")));
        }
        let refs = t.iter().map(|&h| type_id_any(h).map(dref)).collect::<R<Vec<_>>>()?;
        let s = UserDatatype::structured(b, d, &refs);
        let mut ints = vec![count];
        ints.extend_from_slice(b);
        raw::put(new, new_type(s.as_ref().type_id(), Envelope {
            combiner: COMBINER_STRUCT, ints, aints: d.to_vec(), types: subs(t),
        }))
    }
    fn MPI_Type_create_resized / PMPI_Type_create_resized(old: Handle, lb: isize, extent: isize, new: *mut Handle) {
        if extent < 0 {
            return Err(Fail::new(ERR_ARG, format!("extent {extent} is negative")));
        }
        let id = dtabi::resized(type_id_any(old)?, lb, extent as usize);
        raw::put(new, new_type(id, Envelope {
            combiner: COMBINER_RESIZED, ints: vec![], aints: vec![lb, extent], types: subs(&[old]),
        }))
    }
    fn MPI_Type_create_subarray / PMPI_Type_create_subarray(ndims: c_int, sizes: *const c_int, subsizes: *const c_int, starts: *const c_int, order: c_int, old: Handle, new: *mut Handle) {
        let n = count_ok(ndims, "ndims")?;
        let (sz, sub, st) = (raw::slice(sizes, ndims)?, raw::slice(subsizes, ndims)?, raw::slice(starts, ndims)?);
        let id = subarray(sz, sub, st, order, type_id_any(old)?)?;
        let mut ints = vec![ndims];
        ints.extend_from_slice(sz);
        ints.extend_from_slice(sub);
        ints.extend_from_slice(st);
        ints.push(order);
        debug_assert_eq!(ints.len(), 3 * n + 2);
        raw::put(new, new_type(id, Envelope {
            combiner: COMBINER_SUBARRAY, ints, aints: vec![], types: subs(&[old]),
        }))
    }
    fn MPI_Type_create_darray / PMPI_Type_create_darray(size: c_int, rank: c_int, ndims: c_int, gsizes: *const c_int, distribs: *const c_int,
        dargs: *const c_int, psizes: *const c_int, order: c_int, old: Handle, new: *mut Handle) {
        let n = count_ok(ndims, "ndims")?;
        let (g, di, da, p) = (raw::slice(gsizes, ndims)?, raw::slice(distribs, ndims)?, raw::slice(dargs, ndims)?, raw::slice(psizes, ndims)?);
        let id = darray(size, rank, g, di, da, p, order, type_id_any(old)?)?;
        let mut ints = vec![size, rank, ndims];
        for a in [g, di, da, p] {
            ints.extend_from_slice(a);
        }
        ints.push(order);
        debug_assert_eq!(ints.len(), 4 * n + 4);
        raw::put(new, new_type(id, Envelope {
            combiner: COMBINER_DARRAY, ints, aints: vec![], types: subs(&[old]),
        }))
    }
    fn MPI_Type_dup / PMPI_Type_dup(old: Handle, new: *mut Handle) {
        let id = type_id_any(old)?;
        let committed = predefined_of(old).is_some() || TYPES.get(old).is_some_and(|e| e.committed);
        let h = TYPES.insert(Arc::new(DtEntry {
            id,
            committed,
            name: Mutex::new(String::new()),
            env: Envelope { combiner: COMBINER_DUP, ints: vec![], aints: vec![], types: subs(&[old]) },
        }));
        crate::attr::type_copy_all(old, h)?;
        raw::put(new, h)
    }
    fn MPI_Type_commit / PMPI_Type_commit(dt: *mut Handle) {
        let h = raw::get(dt)?;
        if predefined_of(h).is_some() {
            return Ok(());
        }
        let e = TYPES.get(h).ok_or_else(|| bad_type(h))?;
        if !e.committed {
            let name = e.name.lock().unwrap_or_else(|p| p.into_inner()).clone();
            TYPES.set(h, Arc::new(DtEntry { id: e.id, committed: true, name: Mutex::new(name), env: e.env.clone() }));
        }
        Ok(())
    }
    fn MPI_Type_free / PMPI_Type_free(dt: *mut Handle) {
        let h = raw::get(dt)?;
        if predefined_of(h).is_some() || is_f90(h) {
            return Err(Fail::new(ERR_TYPE, "a predefined datatype cannot be freed"));
        }
        TYPES.remove(h).ok_or_else(|| bad_type(h))?;
        crate::attr::type_delete_all(h);
        raw::put(dt, DATATYPE_NULL)
    }
    fn MPI_Type_get_envelope / PMPI_Type_get_envelope(dt: Handle, ni: *mut c_int, na: *mut c_int, nt: *mut c_int, combiner: *mut c_int) {
        let env = envelope(dt)?;
        raw::put(ni, env.ints.len() as c_int)?;
        raw::put(na, env.aints.len() as c_int)?;
        raw::put(nt, env.types.len() as c_int)?;
        raw::put(combiner, env.combiner)
    }
    fn MPI_Type_get_contents / PMPI_Type_get_contents(dt: Handle, ni: c_int, na: c_int, nt: c_int, ints: *mut c_int, aints: *mut isize, types: *mut Handle) {
        let env = envelope(dt)?;
        if env.combiner == COMBINER_NAMED {
            return Err(Fail::new(ERR_TYPE, "a predefined datatype has no contents"));
        }
        if (ni as usize) < env.ints.len() || (na as usize) < env.aints.len() || (nt as usize) < env.types.len() {
            return Err(Fail::new(ERR_ARG, "the arrays are shorter than MPI_Type_get_envelope said"));
        }
        raw::slice_mut(ints, env.ints.len() as c_int)?.copy_from_slice(&env.ints);
        raw::slice_mut(aints, env.aints.len() as c_int)?.copy_from_slice(&env.aints);
        // Derived datatypes come back as new handles the caller frees (MPI-4 §5.1.13).
        let out = raw::slice_mut(types, env.types.len() as c_int)?;
        for (o, t) in out.iter_mut().zip(&env.types) {
            *o = match t {
                Sub::Derived(e) => TYPES.insert(Arc::new(DtEntry {
                    id: e.id,
                    committed: e.committed,
                    name: Mutex::new(String::new()),
                    env: e.env.clone(),
                })),
                Sub::Named(h) => *h,
            };
        }
        Ok(())
    }
    fn MPI_Type_set_name / PMPI_Type_set_name(dt: Handle, name: *const c_char) {
        let s = raw::c_str(name)?;
        if predefined_of(dt).is_some() {
            let mut r = RENAMED.lock().unwrap_or_else(|p| p.into_inner());
            r.retain(|e| e.0 != dt);
            r.push((dt, s));
            return Ok(());
        }
        let e = TYPES.get(dt).ok_or_else(|| bad_type(dt))?;
        *e.name.lock().unwrap_or_else(|p| p.into_inner()) = s;
        Ok(())
    }
    fn MPI_Type_get_name / PMPI_Type_get_name(dt: Handle, name: *mut c_char, len: *mut c_int) {
        let renamed = RENAMED.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|e| e.0 == dt).map(|e| e.1.clone());
        let s = match (predefined_of(dt), renamed) {
            (Some(_), Some(r)) => r,
            (Some(n), None) => n.name.to_string(),
            (None, _) => TYPES.get(dt).ok_or_else(|| bad_type(dt))?.name.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        };
        let n = raw::put_str(name, MAX_OBJECT_NAME, &s)?;
        raw::put(len, n)
    }
    fn MPI_Get_address / PMPI_Get_address(location: *const c_void, address: *mut isize) {
        raw::put(address, raw::address(location))
    }
    // MPI-1's names, removed from the standard in MPI-3 and still exported by MPICH: old
    // programs call them. Each is its successor under another name.
    fn MPI_Address / PMPI_Address(location: *const c_void, address: *mut isize) {
        raw::put(address, raw::address(location))
    }
    fn MPI_Type_extent / PMPI_Type_extent(dt: Handle, extent: *mut isize) {
        raw::put(extent, layout(dt)?.extent as isize)
    }
    fn MPI_Type_lb / PMPI_Type_lb(dt: Handle, lb: *mut isize) {
        raw::put(lb, layout(dt)?.lb)
    }
    fn MPI_Type_ub / PMPI_Type_ub(dt: Handle, ub: *mut isize) {
        let l = layout(dt)?;
        raw::put(ub, l.lb + l.extent as isize)
    }

    fn MPI_Pack_size / PMPI_Pack_size(count: c_int, dt: Handle, _comm: Handle, size: *mut c_int) {
        let n = count_ok(count, "count")? * size_of(dt)?;
        raw::put(size, c_int::try_from(n).map_err(|_| Fail::new(ERR_COUNT, "the packed size exceeds an int"))?)
    }
    fn MPI_Pack / PMPI_Pack(inbuf: *const c_void, count: c_int, dt: Handle, outbuf: *mut c_void, outsize: c_int, position: *mut c_int, _comm: Handle) {
        let (n, id, from, to) = packed_span(count as i64, dt, raw::get(position)? as i64, outsize as i64, true)?;
        pack_into(inbuf, n, id, &mut raw::bytes_mut(outbuf, outsize as usize)[from..to]);
        raw::put(position, to as c_int)
    }
    fn MPI_Unpack / PMPI_Unpack(inbuf: *const c_void, insize: c_int, position: *mut c_int, outbuf: *mut c_void, count: c_int, dt: Handle, _comm: Handle) {
        let (n, id, from, to) = packed_span(count as i64, dt, raw::get(position)? as i64, insize as i64, false)?;
        unpack_from(&raw::bytes(inbuf, insize as usize)[from..to], outbuf, n, id);
        raw::put(position, to as c_int)
    }
}

/// `external32` data: each value big-endian. Values keep this machine's sizes, which
/// are the standard's for every type but `MPI_LONG`/`MPI_UNSIGNED_LONG` (8 bytes here)
/// and `long double`: the representation round-trips between metampi processes.
fn check_external32(datarep: *const c_char) -> R {
    match raw::c_str(datarep)?.as_str() {
        "external32" => Ok(()),
        d => Err(Fail::new(
            ERR_UNSUPPORTED_DATAREP,
            format!("data representation {d:?}: MPI_Pack_external knows \"external32\""),
        )),
    }
}

/// Turns `n` packed elements of `id` between this machine's byte order and big-endian.
pub(crate) fn swap_external32(buf: &mut [u8], n: usize, id: u32) {
    if cfg!(target_endian = "big") {
        return;
    }
    let units = dtabi::units(id);
    let mut at = 0;
    for _ in 0..n {
        for &(size, count) in &units {
            let size = (size as usize).max(1);
            for _ in 0..count {
                buf[at..at + size].reverse();
                at += size;
            }
        }
    }
}

/// Where `count` elements of `dt` go in a packed buffer of `size` bytes from position
/// `pos`: (elements, engine type, first byte, end). Packing past the end is a truncation.
fn packed_span(
    count: i64,
    dt: Handle,
    pos: i64,
    size: i64,
    packing: bool,
) -> R<(usize, u32, usize, usize)> {
    let n = usize::try_from(count)
        .map_err(|_| Fail::new(ERR_COUNT, format!("count {count} is negative")))?;
    let id = committed_id(dt)?;
    let need = n * dtabi::layout(id).size;
    if pos < 0 || pos as usize + need > size.max(0) as usize {
        let what = match packing {
            true => format!(
                "packing {need} bytes at position {pos} overruns the {size}-byte output buffer"
            ),
            false => format!(
                "unpacking {need} bytes at position {pos} reads past the {size}-byte input buffer"
            ),
        };
        return Err(Fail::new(ERR_TRUNCATE, what));
    }
    Ok((n, id, pos as usize, pos as usize + need))
}

fn pack_external(
    datarep: *const c_char,
    inbuf: *const c_void,
    count: i64,
    dt: Handle,
    outbuf: *mut c_void,
    outsize: i64,
    position: *mut i64,
) -> R {
    check_external32(datarep)?;
    let (n, id, from, to) = packed_span(count, dt, raw::get(position)?, outsize, true)?;
    let out = &mut raw::bytes_mut(outbuf, outsize as usize)[from..to];
    pack_into(inbuf, n, id, out);
    swap_external32(out, n, id);
    raw::put(position, to as i64)
}

fn unpack_external(
    datarep: *const c_char,
    inbuf: *const c_void,
    insize: i64,
    position: *mut i64,
    outbuf: *mut c_void,
    count: i64,
    dt: Handle,
) -> R {
    check_external32(datarep)?;
    let (n, id, from, to) = packed_span(count, dt, raw::get(position)?, insize, false)?;
    let mut tmp = raw::bytes(inbuf, insize as usize)[from..to].to_vec();
    swap_external32(&mut tmp, n, id);
    unpack_from(&tmp, outbuf, n, id);
    raw::put(position, to as i64)
}

mpi! {
    fn MPI_Pack_external / PMPI_Pack_external(datarep: *const c_char, inbuf: *const c_void, count: c_int, dt: Handle,
        outbuf: *mut c_void, outsize: isize, position: *mut isize) {
        let mut p = raw::get(position)? as i64;
        pack_external(datarep, inbuf, count as i64, dt, outbuf, outsize as i64, &mut p)?;
        raw::put(position, p as isize)
    }
    fn MPI_Pack_external_c / PMPI_Pack_external_c(datarep: *const c_char, inbuf: *const c_void, count: i64, dt: Handle,
        outbuf: *mut c_void, outsize: i64, position: *mut i64) {
        pack_external(datarep, inbuf, count, dt, outbuf, outsize, position)
    }
    fn MPI_Unpack_external / PMPI_Unpack_external(datarep: *const c_char, inbuf: *const c_void, insize: isize, position: *mut isize,
        outbuf: *mut c_void, count: c_int, dt: Handle) {
        let mut p = raw::get(position)? as i64;
        unpack_external(datarep, inbuf, insize as i64, &mut p, outbuf, count as i64, dt)?;
        raw::put(position, p as isize)
    }
    fn MPI_Unpack_external_c / PMPI_Unpack_external_c(datarep: *const c_char, inbuf: *const c_void, insize: i64, position: *mut i64,
        outbuf: *mut c_void, count: i64, dt: Handle) {
        unpack_external(datarep, inbuf, insize, position, outbuf, count, dt)
    }
    fn MPI_Pack_external_size / PMPI_Pack_external_size(datarep: *const c_char, count: c_int, dt: Handle, size: *mut isize) {
        check_external32(datarep)?;
        if count < 0 {
            return Err(Fail::new(ERR_COUNT, format!("count {count} is negative")));
        }
        raw::put(size, count as isize * size_of(dt)? as isize)
    }
    fn MPI_Pack_external_size_c / PMPI_Pack_external_size_c(datarep: *const c_char, count: i64, dt: Handle, size: *mut i64) {
        check_external32(datarep)?;
        if count < 0 {
            return Err(Fail::new(ERR_COUNT, format!("count {count} is negative")));
        }
        raw::put(size, count * size_of(dt)? as i64)
    }
}

/// Packs `n` elements of datatype `id` at `inbuf` into `out` (`n` times the type's size).
pub fn pack_into(inbuf: *const c_void, n: usize, id: u32, out: &mut [u8]) {
    let extent = dtabi::layout(id).extent as isize;
    let blocks = dtabi::blocks(id);
    let mut at = 0;
    for i in 0..n {
        for &(off, len) in &blocks {
            out[at..at + len].copy_from_slice(raw::bytes(
                raw::offset(inbuf, i as isize * extent + off),
                len,
            ));
            at += len;
        }
    }
}

/// Writes `n` elements of datatype `id` at `outbuf` from the packed bytes `inb` (as
/// [`pack_into`] laid them out); the bytes read.
pub fn unpack_from(inb: &[u8], outbuf: *mut c_void, n: usize, id: u32) -> usize {
    let extent = dtabi::layout(id).extent as isize;
    let blocks = dtabi::blocks(id);
    let mut at = 0;
    for i in 0..n {
        for &(off, len) in &blocks {
            let dst = raw::bytes_mut(raw::offset(outbuf, i as isize * extent + off), len);
            dst.copy_from_slice(&inb[at..at + len]);
            at += len;
        }
    }
    at
}

/// `MPI_Aint_add`: address arithmetic as the standard defines it.
#[no_mangle]
pub extern "C" fn PMPI_Aint_add(base: isize, disp: isize) -> isize {
    base.wrapping_add(disp)
}
#[no_mangle]
pub extern "C" fn MPI_Aint_add(base: isize, disp: isize) -> isize {
    base.wrapping_add(disp)
}
/// `MPI_Aint_diff`.
#[no_mangle]
pub extern "C" fn PMPI_Aint_diff(a: isize, b: isize) -> isize {
    a.wrapping_sub(b)
}
#[no_mangle]
pub extern "C" fn MPI_Aint_diff(a: isize, b: isize) -> isize {
    a.wrapping_sub(b)
}

fn envelope(dt: Handle) -> R<Envelope> {
    if predefined_of(dt).is_some() {
        return Ok(Envelope {
            combiner: COMBINER_NAMED,
            ..Envelope::default()
        });
    }
    Ok(TYPES.get(dt).ok_or_else(|| bad_type(dt))?.env.clone())
}

/// The type map of `MPI_Type_create_subarray`: nested strided blocks moved to
/// the start corner, resized to the whole array.
fn subarray(sizes: &[c_int], subs: &[c_int], starts: &[c_int], order: c_int, old: u32) -> R<u32> {
    let n = sizes.len();
    if n == 0 {
        return Err(Fail::new(
            ERR_ARG,
            "a subarray needs at least one dimension",
        ));
    }
    for d in 0..n {
        if sizes[d] <= 0 || subs[d] <= 0 || starts[d] < 0 || starts[d] + subs[d] > sizes[d] {
            return Err(Fail::new(
                ERR_ARG,
                format!(
                    "dimension {d}: size {}, subsize {}, start {} do not fit",
                    sizes[d], subs[d], starts[d]
                ),
            ));
        }
    }
    // Dimensions from fastest-varying to slowest.
    let dims: Vec<usize> = match order {
        ORDER_C => (0..n).rev().collect(),
        ORDER_FORTRAN => (0..n).collect(),
        _ => {
            return Err(Fail::new(
                ERR_ARG,
                format!("order {order} is neither MPI_ORDER_C nor MPI_ORDER_FORTRAN"),
            ))
        }
    };
    let ext = dtabi::layout(old).extent as isize;
    let mut t = UserDatatype::contiguous(subs[dims[0]], &dref(old))
        .as_ref()
        .type_id();
    let mut stride = ext * sizes[dims[0]] as isize;
    let mut disp = starts[dims[0]] as isize * ext;
    for &d in &dims[1..] {
        t = UserDatatype::heterogeneous_vector(subs[d], 1, stride, &dref(t))
            .as_ref()
            .type_id();
        disp += starts[d] as isize * stride;
        stride *= sizes[d] as isize;
    }
    let moved = UserDatatype::heterogeneous_indexed(&[1], &[disp], &dref(t))
        .as_ref()
        .type_id();
    Ok(dtabi::resized(moved, 0, stride as usize))
}

/// The indices of one dimension of a distributed array that process coordinate `c` of
/// `p` owns (MPI-4 §5.1.4), as runs `(first, length)`.
fn darray_runs(
    gsize: c_int,
    distrib: c_int,
    darg: c_int,
    p: c_int,
    c: c_int,
) -> R<Vec<(c_int, c_int)>> {
    let bad = |what: String| Err(Fail::arg(what));
    match distrib {
        DISTRIBUTE_NONE => {
            if p != 1 {
                return bad(format!(
                    "an undistributed dimension runs over {p} processes, not 1"
                ));
            }
            Ok(vec![(0, gsize)])
        }
        DISTRIBUTE_BLOCK => {
            let b = match darg {
                DISTRIBUTE_DFLT_DARG => (gsize + p - 1) / p,
                b if b > 0 && (b as i64) * (p as i64) >= gsize as i64 => b,
                b => {
                    return bad(format!(
                        "block size {b} cannot cover {gsize} elements on {p} processes"
                    ))
                }
            };
            let lo = (c as i64 * b as i64).min(gsize as i64) as c_int;
            let hi = ((c as i64 + 1) * b as i64).min(gsize as i64) as c_int;
            Ok(if hi > lo { vec![(lo, hi - lo)] } else { vec![] })
        }
        DISTRIBUTE_CYCLIC => {
            let b = match darg {
                DISTRIBUTE_DFLT_DARG => 1,
                b if b > 0 => b,
                b => return bad(format!("cyclic block size {b} is not positive")),
            };
            let mut runs = Vec::new();
            let mut lo = c as i64 * b as i64;
            while lo < gsize as i64 {
                let len = (b as i64).min(gsize as i64 - lo);
                runs.push((lo as c_int, len as c_int));
                lo += b as i64 * p as i64;
            }
            Ok(runs)
        }
        d => bad(format!("distribution {d} is not BLOCK, CYCLIC or NONE")),
    }
}

/// `MPI_Type_create_darray`: the elements of a `gsizes` array of `old` (in `order`) that
/// process `rank` of a row-major `psizes` grid owns, with the whole array's extent.
#[allow(clippy::too_many_arguments)]
fn darray(
    size: c_int,
    rank: c_int,
    gsizes: &[c_int],
    distribs: &[c_int],
    dargs: &[c_int],
    psizes: &[c_int],
    order: c_int,
    old: u32,
) -> R<u32> {
    let n = gsizes.len();
    if psizes.iter().map(|&p| p as i64).product::<i64>() != size as i64
        || !(0..size).contains(&rank)
    {
        return Err(Fail::arg(format!(
            "a process grid {psizes:?} for rank {rank} of {size} processes"
        )));
    }
    if gsizes.iter().chain(psizes).any(|&x| x <= 0) {
        return Err(Fail::arg("array and grid sizes must be positive"));
    }
    // The rank's coordinates in the process grid, which MPI numbers in row-major order.
    let mut coords = vec![0; n];
    let mut r = rank;
    for d in (0..n).rev() {
        coords[d] = r % psizes[d];
        r /= psizes[d];
    }
    let dims: Vec<usize> = match order {
        ORDER_C => (0..n).rev().collect(),
        ORDER_FORTRAN => (0..n).collect(),
        _ => {
            return Err(Fail::arg(format!(
                "order {order} is neither MPI_ORDER_C nor MPI_ORDER_FORTRAN"
            )))
        }
    };
    // Built from the fastest-varying dimension out: each level places runs of the level
    // below, whose extent is resized to one step of its dimension.
    let mut t = old;
    let mut stride = dtabi::layout(old).extent as isize;
    for &d in &dims {
        let runs = darray_runs(gsizes[d], distribs[d], dargs[d], psizes[d], coords[d])?;
        let lens: Vec<c_int> = runs.iter().map(|r| r.1).collect();
        let disps: Vec<isize> = runs.iter().map(|r| r.0 as isize * stride).collect();
        let step = dtabi::resized(t, 0, stride as usize);
        t = UserDatatype::heterogeneous_indexed(&lens, &disps, &dref(step))
            .as_ref()
            .type_id();
        stride *= gsizes[d] as isize;
    }
    Ok(dtabi::resized(t, 0, stride as usize))
}

// ---- operations ------------------------------------------------------------------

/// A reduction operation as C names it.
#[derive(Clone)]
pub enum COp {
    Sys(SystemOperation),
    User { f: UserFnRef, commute: bool },
}

pub static OPS: Table<COp> = Table::new(OP_BASE);

pub fn op(h: Handle) -> R<COp> {
    let s = match h {
        OP_MAX => SystemOperation::max(),
        OP_MIN => SystemOperation::min(),
        OP_SUM => SystemOperation::sum(),
        OP_PROD => SystemOperation::product(),
        OP_LAND => SystemOperation::logical_and(),
        OP_BAND => SystemOperation::bitwise_and(),
        OP_LOR => SystemOperation::logical_or(),
        OP_BOR => SystemOperation::bitwise_or(),
        OP_LXOR => SystemOperation::logical_xor(),
        OP_BXOR => SystemOperation::bitwise_xor(),
        OP_MINLOC => SystemOperation::min_loc(),
        OP_MAXLOC => SystemOperation::max_loc(),
        OP_REPLACE | OP_NO_OP => {
            return Err(Fail::new(
                ERR_OP,
                "MPI_REPLACE and MPI_NO_OP are for one-sided accumulates only",
            ))
        }
        _ => {
            return OPS
                .get(h)
                .ok_or_else(|| Fail::new(ERR_OP, format!("{h:#x} is not an operation")))
        }
    };
    Ok(COp::Sys(s))
}

/// A user operation calling C function `f` with datatype handle `dt` (what the
/// function sees, as the program named it).
pub fn user_op(f: UserFnRef, commute: bool, dt: Handle) -> UserOperation<'static> {
    UserOperation::new(commute, move |a, mut b| match f {
        UserFnRef::Int(f) => raw::call_user_op(f, a.as_ptr(), b.as_mut_ptr(), b.len() as c_int, dt),
        UserFnRef::Large(f) => {
            raw::call_user_op_c(f, a.as_ptr(), b.as_mut_ptr(), b.len() as i64, dt)
        }
    })
}

mpi! {
    fn MPI_Op_create / PMPI_Op_create(f: Option<UserFn>, commute: c_int, op: *mut Handle) {
        let f = f.ok_or_else(|| Fail::arg("the user function is null"))?;
        raw::put(op, OPS.insert(COp::User { f: UserFnRef::Int(f), commute: commute != 0 }))
    }
    fn MPI_Op_create_c / PMPI_Op_create_c(f: Option<UserFnC>, commute: c_int, op: *mut Handle) {
        let f = f.ok_or_else(|| Fail::arg("the user function is null"))?;
        raw::put(op, OPS.insert(COp::User { f: UserFnRef::Large(f), commute: commute != 0 }))
    }
    fn MPI_Op_free / PMPI_Op_free(op: *mut Handle) {
        let h = raw::get(op)?;
        OPS.remove(h).ok_or_else(|| Fail::new(ERR_OP, "only a user operation can be freed"))?;
        raw::put(op, OP_NULL)
    }
    fn MPI_Op_commutative / PMPI_Op_commutative(op_h: Handle, commute: *mut c_int) {
        // The one-sided-only operations keep the order of their arguments.
        if op_h == OP_REPLACE || op_h == OP_NO_OP {
            return raw::put(commute, 0);
        }
        let c = match op(op_h)? {
            COp::Sys(_) => true,
            COp::User { commute, .. } => commute,
        };
        raw::put(commute, c as c_int)
    }
}

/// The predefined Fortran datatype of type class `class` (`MPI_TYPECLASS_*`) and `size`
/// bytes, as MPICH answers `MPI_Type_match_size` (ScaLAPACK's BLACS asks for it at start).
fn matching_type(class: c_int, size: c_int) -> Option<Handle> {
    let idx = match (class, size) {
        (TYPECLASS_REAL, 4) => 0x27,
        (TYPECLASS_REAL, 8) => 0x29,
        (TYPECLASS_REAL, 16) => 0x2b,
        (TYPECLASS_INTEGER, 1) => 0x2d,
        (TYPECLASS_INTEGER, 2) => 0x2f,
        (TYPECLASS_INTEGER, 4) => 0x30,
        (TYPECLASS_INTEGER, 8) => 0x31,
        (TYPECLASS_COMPLEX, 8) => 0x28,
        (TYPECLASS_COMPLEX, 16) => 0x2a,
        (TYPECLASS_COMPLEX, 32) => 0x2c,
        _ => return None,
    };
    Some(predefined_handle(idx, size))
}

/// Predefined datatypes the program renamed (`MPI_Type_set_name`).
static RENAMED: Mutex<Vec<(Handle, String)>> = Mutex::new(Vec::new());

/// The types `MPI_Type_create_f90_*` made, by (combiner, p, r): each is made once and is
/// predefined (the program may not free it).
static F90: Mutex<Vec<(F90Key, Handle)>> = Mutex::new(Vec::new());

/// (combiner, precision, range) of an `MPI_Type_create_f90_*` call.
type F90Key = (c_int, c_int, c_int);

fn is_f90(h: Handle) -> bool {
    F90.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|e| e.1 == h)
}

/// The predefined type with at least decimal precision `p` and exponent range `r`
/// (`MPI_UNDEFINED`: any) of Fortran kind `class`, as `MPI_Type_create_f90_*` finds it.
fn f90_type(combiner: c_int, p: c_int, r: c_int) -> R<Handle> {
    let want = |v: c_int| if v == UNDEFINED { 0 } else { v };
    let (p0, r0) = (want(p), want(r));
    if p0 < 0 || r0 < 0 {
        return Err(Fail::arg(format!(
            "precision {p} and range {r} must not be negative"
        )));
    }
    // (precision, range, bytes) of what the machine has, smallest first.
    let (class, kinds): (c_int, &[(c_int, c_int, c_int)]) = match combiner {
        COMBINER_F90_INTEGER => (
            TYPECLASS_INTEGER,
            &[(0, 2, 1), (0, 4, 2), (0, 9, 4), (0, 18, 8)],
        ),
        COMBINER_F90_REAL => (TYPECLASS_REAL, &[(6, 37, 4), (15, 307, 8), (18, 4931, 16)]),
        _ => (
            TYPECLASS_COMPLEX,
            &[(6, 37, 8), (15, 307, 16), (18, 4931, 32)],
        ),
    };
    let size = kinds
        .iter()
        .find(|k| p0 <= k.0 && r0 <= k.1)
        .map(|k| k.2)
        .ok_or_else(|| Fail::arg(format!("no Fortran type has precision {p} and range {r}")))?;
    let base = matching_type(class, size).ok_or_else(|| Fail::new(ERR_INTERN, "no base type"))?;
    let mut made = F90.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = made.iter().find(|e| e.0 == (combiner, p, r)) {
        return Ok(e.1);
    }
    let ints = if combiner == COMBINER_F90_INTEGER {
        vec![r]
    } else {
        vec![p, r]
    };
    let h = TYPES.insert(Arc::new(DtEntry {
        id: type_id_any(base)?,
        committed: true,
        name: Mutex::new(String::new()),
        env: Envelope {
            combiner,
            ints,
            aints: vec![],
            types: vec![],
        },
    }));
    made.push(((combiner, p, r), h));
    Ok(h)
}

mpi! {
    fn MPI_Type_create_f90_integer / PMPI_Type_create_f90_integer(r: c_int, new: *mut Handle) {
        raw::put(new, f90_type(COMBINER_F90_INTEGER, UNDEFINED, r)?)
    }
    fn MPI_Type_create_f90_real / PMPI_Type_create_f90_real(p: c_int, r: c_int, new: *mut Handle) {
        raw::put(new, f90_type(COMBINER_F90_REAL, p, r)?)
    }
    fn MPI_Type_create_f90_complex / PMPI_Type_create_f90_complex(p: c_int, r: c_int, new: *mut Handle) {
        raw::put(new, f90_type(COMBINER_F90_COMPLEX, p, r)?)
    }
}

/// The predefined pair types of `MPI_MINLOC`/`MPI_MAXLOC` (MPI-4.1 §6.9.4), by the indices
/// in [`predefined`] of their value and index types: (value, index, pair, the bytes MPICH's
/// handle of the pair names; 0 for the `0x8c00000n` ones, whose handles name none).
const VALUE_INDEX: [(usize, usize, usize, c_int); 9] = [
    (0x0a, 0x05, PAIR_AT, 0),     // MPI_FLOAT, MPI_INT: MPI_FLOAT_INT
    (0x0b, 0x05, PAIR_AT + 1, 0), // MPI_DOUBLE_INT
    (0x07, 0x05, PAIR_AT + 2, 0), // MPI_LONG_INT
    (0x03, 0x05, PAIR_AT + 3, 0), // MPI_SHORT_INT
    (0x0c, 0x05, PAIR_AT + 4, 0), // MPI_LONG_DOUBLE_INT
    (0x05, 0x05, 0x16, 8),        // MPI_INT, MPI_INT: MPI_2INT
    (0x1c, 0x1c, 0x21, 8),        // MPI_REAL, MPI_REAL: MPI_2REAL
    (0x1f, 0x1f, 0x23, 16),       // MPI_2DOUBLE_PRECISION
    (0x1b, 0x1b, 0x20, 8),        // MPI_INTEGER, MPI_INTEGER: MPI_2INTEGER
];

/// `MPI_Type_get_value_index` (MPI-4.1 §6.9.4): the predefined pair type of a value of
/// type `value` and an index of type `index`, or `MPI_DATATYPE_NULL` where there is none
/// (derived types included, even one that duplicates a type with a pair).
///
/// # Errors
/// `MPI_ERR_TYPE` where either argument is not a datatype.
pub fn value_index(value: Handle, index: Handle) -> R<Handle> {
    for (h, what) in [(value, "value_type"), (index, "index_type")] {
        type_id_any(h).map_err(|f| Fail::new(f.class, format!("{what}: {}", f.msg)))?;
    }
    let (Some(v), Some(i)) = (predefined_index(value), predefined_index(index)) else {
        return Ok(DATATYPE_NULL);
    };
    Ok(VALUE_INDEX
        .iter()
        .find(|e| (e.0, e.1) == (v, i))
        .map_or(DATATYPE_NULL, |e| predefined_handle(e.2 as u32, e.3)))
}

mpi! {
    fn MPI_Type_get_value_index / PMPI_Type_get_value_index(value: Handle, index: Handle, pair: *mut Handle) {
        raw::put(pair, value_index(value, index)?)
    }
    fn MPI_Type_match_size / PMPI_Type_match_size(class: c_int, size: c_int, dt: *mut Handle) {
        let t = matching_type(class, size).ok_or_else(|| {
            Fail::arg(format!("no predefined type of type class {class} has {size} bytes"))
        })?;
        raw::put(dt, t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // MPICH's numbers (the unit tests build this crate for MPICH's ABI), from its mpi.h.
    const INT: Handle = 0x4c00_0405;
    const FLOAT: Handle = 0x4c00_040a;
    const CHAR: Handle = 0x4c00_0101;

    #[test]
    fn value_index_names_the_predefined_pairs() {
        let cases: [((Handle, Handle), u32); 9] = [
            ((FLOAT, INT), 0x8c00_0000),               // MPI_FLOAT_INT
            ((0x4c00_080b, INT), 0x8c00_0001),         // MPI_DOUBLE, MPI_INT: MPI_DOUBLE_INT
            ((0x4c00_0807, INT), 0x8c00_0002),         // MPI_LONG_INT
            ((0x4c00_0203, INT), 0x8c00_0003),         // MPI_SHORT_INT
            ((0x4c00_100c, INT), 0x8c00_0004),         // MPI_LONG_DOUBLE_INT
            ((INT, INT), 0x4c00_0816),                 // MPI_2INT
            ((0x4c00_041c, 0x4c00_041c), 0x4c00_0821), // MPI_2REAL
            ((0x4c00_081f, 0x4c00_081f), 0x4c00_1023), // MPI_2DOUBLE_PRECISION
            ((0x4c00_041b, 0x4c00_041b), 0x4c00_0820), // MPI_2INTEGER
        ];
        for ((v, i), pair) in cases {
            let pair = pair as Handle;
            assert_eq!(value_index(v, i).unwrap(), pair, "{v:#x}, {i:#x}");
            // The pair is a datatype this library knows.
            assert!(type_id_any(pair).is_ok(), "{pair:#x}");
        }
    }

    #[test]
    fn value_index_is_null_without_a_pair_and_refuses_non_types() {
        assert_eq!(value_index(CHAR, INT).unwrap(), DATATYPE_NULL);
        assert_eq!(value_index(INT, FLOAT).unwrap(), DATATYPE_NULL);
        // MPI_REAL with a C int index: the Fortran pairs are of one type twice.
        assert_eq!(value_index(0x4c00_041c, INT).unwrap(), DATATYPE_NULL);
        let e = value_index(DATATYPE_NULL, INT).unwrap_err();
        assert_eq!(e.class, ERR_TYPE);
        assert!(e.msg.starts_with("value_type"), "{}", e.msg);
        let e = value_index(FLOAT, 0x1234).unwrap_err();
        assert_eq!(e.class, ERR_TYPE);
        assert!(e.msg.starts_with("index_type"), "{}", e.msg);
    }

    #[test]
    fn every_predefined_handle_maps_back_to_its_index() {
        for &(_, _, pair, size) in &VALUE_INDEX {
            let h = predefined_handle(pair as u32, size);
            assert_eq!(predefined_index(h), Some(pair), "{h:#x}");
        }
    }
}

/// Defines MPI-1 functions that MPI-2 renamed (same arguments) as calls of their successors,
/// whose errors name the successor.
macro_rules! renamed {
    ($(fn $name:ident / $pname:ident ($($a:ident : $t:ty),*) => $target:ident;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $pname($($a: $t),*) -> c_int {
            $target($($a),*)
        }
        #[no_mangle]
        pub extern "C" fn $name($($a: $t),*) -> c_int {
            $pname($($a),*)
        }
    )*};
}

renamed! {
    fn MPI_Type_hvector / PMPI_Type_hvector(count: c_int, bl: c_int, stride: isize, old: Handle, new: *mut Handle) => PMPI_Type_create_hvector;
    fn MPI_Type_hindexed / PMPI_Type_hindexed(count: c_int, bls: *const c_int, displs: *const isize, old: Handle, new: *mut Handle) => PMPI_Type_create_hindexed;
    fn MPI_Type_struct / PMPI_Type_struct(count: c_int, bls: *const c_int, displs: *const isize, types: *const Handle, new: *mut Handle) => PMPI_Type_create_struct;
}
