//! The large-count (`_c`, MPI-4 §3.2.2) forms: counts as `MPI_Count` and displacements as
//! `MPI_Aint`. They take counts that fit in an `int` to the `int` forms and refuse larger
//! ones with `MPI_ERR_COUNT` naming the call (messages of 2^31 elements and more are not
//! supported yet). mpi4py 4 calls these forms for everything.

use std::ffi::{c_int, c_void};

use crate::consts::*;
use crate::err::{self, Fail};
use crate::raw;
use crate::req::CStatus;

/// `n` as an `int` count, or the error for `func`.
fn narrow(func: &str, n: i64) -> Result<c_int, c_int> {
    c_int::try_from(n).map_err(|_| {
        err::raise(
            func,
            Fail::new(
                ERR_COUNT,
                format!("count {n} does not fit in an int: metampi takes up to 2^31-1 elements"),
            ),
        )
    })
}

/// `n` counts (`MPI_Count`) or displacements (`MPI_Aint`) at `p` as `int`s.
fn narrow_all<T: Copy + TryInto<i64>>(
    func: &str,
    p: *const T,
    n: c_int,
) -> Result<Vec<c_int>, c_int> {
    let v = raw::slice(p, n).map_err(|f| err::raise(func, f))?;
    v.iter()
        .map(|&x| narrow(func, x.try_into().unwrap_or(i64::MAX)))
        .collect()
}

/// Runs `f` with the narrowed values, or returns the narrowing error's code.
macro_rules! narrowed {
    ($func:expr, [$($n:ident),*], $call:expr) => {{
        $(let $n = match narrow($func, $n) { Ok(v) => v, Err(code) => return code };)*
        $call
    }};
}

/// Defines `MPI_X_c` and `PMPI_X_c` as the `int` form `$int` with the `MPI_Count`
/// arguments `$n` narrowed.
macro_rules! large {
    ($(fn $name:ident / $pname:ident ($($a:ident : $t:ty),*) [$($n:ident),*] => $int:path;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $pname($($a: $t),*) -> c_int {
            narrowed!(stringify!($name), [$($n),*], $int($($a),*))
        }
        #[no_mangle]
        pub extern "C" fn $name($($a: $t),*) -> c_int {
            $pname($($a),*)
        }
    )*};
}

type Count = i64;

large! {
    fn MPI_Send_c / PMPI_Send_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle) [n] => crate::p2p::PMPI_Send;
    fn MPI_Ssend_c / PMPI_Ssend_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle) [n] => crate::p2p::PMPI_Ssend;
    fn MPI_Bsend_c / PMPI_Bsend_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle) [n] => crate::p2p::PMPI_Bsend;
    fn MPI_Rsend_c / PMPI_Rsend_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle) [n] => crate::p2p::PMPI_Rsend;
    fn MPI_Isend_c / PMPI_Isend_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Isend;
    fn MPI_Issend_c / PMPI_Issend_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Issend;
    fn MPI_Ibsend_c / PMPI_Ibsend_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Ibsend;
    fn MPI_Irsend_c / PMPI_Irsend_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Irsend;
    fn MPI_Send_init_c / PMPI_Send_init_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Send_init;
    fn MPI_Ssend_init_c / PMPI_Ssend_init_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Ssend_init;
    fn MPI_Bsend_init_c / PMPI_Bsend_init_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Bsend_init;
    fn MPI_Rsend_init_c / PMPI_Rsend_init_c(b: *const c_void, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Rsend_init;
    fn MPI_Recv_c / PMPI_Recv_c(b: *mut c_void, n: Count, dt: Handle, s: c_int, t: c_int, c: Handle, st: *mut CStatus) [n] => crate::p2p::PMPI_Recv;
    fn MPI_Irecv_c / PMPI_Irecv_c(b: *mut c_void, n: Count, dt: Handle, s: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Irecv;
    fn MPI_Recv_init_c / PMPI_Recv_init_c(b: *mut c_void, n: Count, dt: Handle, s: c_int, t: c_int, c: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Recv_init;
    fn MPI_Mrecv_c / PMPI_Mrecv_c(b: *mut c_void, n: Count, dt: Handle, m: *mut Handle, st: *mut CStatus) [n] => crate::p2p::PMPI_Mrecv;
    fn MPI_Imrecv_c / PMPI_Imrecv_c(b: *mut c_void, n: Count, dt: Handle, m: *mut Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Imrecv;
    fn MPI_Sendrecv_c / PMPI_Sendrecv_c(sb: *const c_void, sn: Count, sdt: Handle, d: c_int, stg: c_int, rb: *mut c_void, rn: Count, rdt: Handle, s: c_int, rtg: c_int, c: Handle, st: *mut CStatus) [sn, rn] => crate::p2p::PMPI_Sendrecv;
    fn MPI_Psend_init_c / PMPI_Psend_init_c(b: *const c_void, p: c_int, n: Count, dt: Handle, d: c_int, t: c_int, c: Handle, i: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Psend_init;
    fn MPI_Precv_init_c / PMPI_Precv_init_c(b: *mut c_void, p: c_int, n: Count, dt: Handle, s: c_int, t: c_int, c: Handle, i: Handle, r: *mut Handle) [n] => crate::p2p::PMPI_Precv_init;
    fn MPI_Isendrecv_c / PMPI_Isendrecv_c(sb: *const c_void, sn: Count, sdt: Handle, d: c_int, stg: c_int, rb: *mut c_void, rn: Count, rdt: Handle, s: c_int, rtg: c_int, c: Handle, q: *mut Handle) [sn, rn] => crate::p2p::PMPI_Isendrecv;
    fn MPI_Isendrecv_replace_c / PMPI_Isendrecv_replace_c(b: *mut c_void, n: Count, dt: Handle, d: c_int, stg: c_int, s: c_int, rtg: c_int, c: Handle, q: *mut Handle) [n] => crate::p2p::PMPI_Isendrecv_replace;
    fn MPI_Sendrecv_replace_c / PMPI_Sendrecv_replace_c(b: *mut c_void, n: Count, dt: Handle, d: c_int, stg: c_int, s: c_int, rtg: c_int, c: Handle, st: *mut CStatus) [n] => crate::p2p::PMPI_Sendrecv_replace;
    fn MPI_Bcast_c / PMPI_Bcast_c(b: *mut c_void, n: Count, dt: Handle, root: c_int, c: Handle) [n] => crate::coll::PMPI_Bcast;
    fn MPI_Ibcast_c / PMPI_Ibcast_c(b: *mut c_void, n: Count, dt: Handle, root: c_int, c: Handle, r: *mut Handle) [n] => crate::coll::PMPI_Ibcast;
    fn MPI_Reduce_c / PMPI_Reduce_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, root: c_int, c: Handle) [n] => crate::coll::PMPI_Reduce;
    fn MPI_Ireduce_c / PMPI_Ireduce_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, root: c_int, c: Handle, q: *mut Handle) [n] => crate::coll::PMPI_Ireduce;
    fn MPI_Allreduce_c / PMPI_Allreduce_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle) [n] => crate::coll::PMPI_Allreduce;
    fn MPI_Iallreduce_c / PMPI_Iallreduce_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle, q: *mut Handle) [n] => crate::coll::PMPI_Iallreduce;
    fn MPI_Scan_c / PMPI_Scan_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle) [n] => crate::coll::PMPI_Scan;
    fn MPI_Iscan_c / PMPI_Iscan_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle, q: *mut Handle) [n] => crate::coll::PMPI_Iscan;
    fn MPI_Exscan_c / PMPI_Exscan_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle) [n] => crate::coll::PMPI_Exscan;
    fn MPI_Iexscan_c / PMPI_Iexscan_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle, q: *mut Handle) [n] => crate::coll::PMPI_Iexscan;
    fn MPI_Reduce_scatter_block_c / PMPI_Reduce_scatter_block_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle) [n] => crate::coll::PMPI_Reduce_scatter_block;
    fn MPI_Ireduce_scatter_block_c / PMPI_Ireduce_scatter_block_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle, q: *mut Handle) [n] => crate::coll::PMPI_Ireduce_scatter_block;
    fn MPI_Reduce_local_c / PMPI_Reduce_local_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle) [n] => crate::coll::PMPI_Reduce_local;
    fn MPI_Gather_c / PMPI_Gather_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, root: c_int, c: Handle) [sn, rn] => crate::coll::PMPI_Gather;
    fn MPI_Igather_c / PMPI_Igather_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, root: c_int, c: Handle, q: *mut Handle) [sn, rn] => crate::coll::PMPI_Igather;
    fn MPI_Scatter_c / PMPI_Scatter_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, root: c_int, c: Handle) [sn, rn] => crate::coll::PMPI_Scatter;
    fn MPI_Iscatter_c / PMPI_Iscatter_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, root: c_int, c: Handle, q: *mut Handle) [sn, rn] => crate::coll::PMPI_Iscatter;
    fn MPI_Allgather_c / PMPI_Allgather_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle) [sn, rn] => crate::coll::PMPI_Allgather;
    fn MPI_Iallgather_c / PMPI_Iallgather_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle, q: *mut Handle) [sn, rn] => crate::coll::PMPI_Iallgather;
    fn MPI_Alltoall_c / PMPI_Alltoall_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle) [sn, rn] => crate::coll::PMPI_Alltoall;
    fn MPI_Ialltoall_c / PMPI_Ialltoall_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle, q: *mut Handle) [sn, rn] => crate::coll::PMPI_Ialltoall;
    fn MPI_Type_contiguous_c / PMPI_Type_contiguous_c(n: Count, old: Handle, new: *mut Handle) [n] => crate::types::PMPI_Type_contiguous;
}

/// The length of a varying-count form's arrays: the communicator's size, or for an
/// intercommunicator the size of the remote group.
fn comm_size(comm: Handle) -> Result<c_int, c_int> {
    let (mut n, mut inter) = (0, 0);
    if crate::comm::PMPI_Comm_test_inter(comm, &mut inter) != SUCCESS {
        inter = 0;
    }
    let rc = match inter {
        0 => crate::comm::PMPI_Comm_size(comm, &mut n),
        _ => crate::comm::PMPI_Comm_remote_size(comm, &mut n),
    };
    match rc {
        SUCCESS => Ok(n),
        rc => Err(rc),
    }
}

/// Defines a varying-count `_c` form: the arrays named are narrowed to `int` arrays over
/// the communicator's size, the counts named too, then the `int` form runs.
macro_rules! large_v {
    ($(fn $name:ident / $pname:ident ($($a:ident : $t:ty),*) on $comm:ident arrays [$($v:ident),*] counts [$($n:ident),*] => $int:path;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $pname($($a: $t),*) -> c_int {
            let f = stringify!($name);
            let size = match comm_size($comm) { Ok(n) => n, Err(code) => return code };
            // Arrays a rank does not use (the root's, elsewhere) may be null: they stay null.
            $(let $v = match $v.is_null() {
                true => None,
                false => match narrow_all(f, $v, size) { Ok(v) => Some(v), Err(code) => return code },
            };)*
            $(let $v = $v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());)*
            narrowed!(f, [$($n),*], $int($($a),*))
        }
        #[no_mangle]
        pub extern "C" fn $name($($a: $t),*) -> c_int {
            $pname($($a),*)
        }
    )*};
}

large_v! {
    fn MPI_Gatherv_c / PMPI_Gatherv_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rcs: *const Count, ds: *const isize, rdt: Handle, root: c_int, comm: Handle)
        on comm arrays [rcs, ds] counts [sn] => crate::coll::PMPI_Gatherv;
    fn MPI_Scatterv_c / PMPI_Scatterv_c(s: *const c_void, scs: *const Count, ds: *const isize, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, root: c_int, comm: Handle)
        on comm arrays [scs, ds] counts [rn] => crate::coll::PMPI_Scatterv;
    fn MPI_Allgatherv_c / PMPI_Allgatherv_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rcs: *const Count, ds: *const isize, rdt: Handle, comm: Handle)
        on comm arrays [rcs, ds] counts [sn] => crate::coll::PMPI_Allgatherv;
    fn MPI_Alltoallv_c / PMPI_Alltoallv_c(s: *const c_void, scs: *const Count, sds: *const isize, sdt: Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rdt: Handle, comm: Handle)
        on comm arrays [scs, sds, rcs, rds] counts [] => crate::coll::PMPI_Alltoallv;
    fn MPI_Reduce_scatter_c / PMPI_Reduce_scatter_c(s: *const c_void, r: *mut c_void, rcs: *const Count, dt: Handle, op: Handle, comm: Handle)
        on comm arrays [rcs] counts [] => crate::coll::PMPI_Reduce_scatter;
    fn MPI_Ireduce_scatter_c / PMPI_Ireduce_scatter_c(s: *const c_void, r: *mut c_void, rcs: *const Count, dt: Handle, op: Handle, comm: Handle, q: *mut Handle)
        on comm arrays [rcs] counts [] => crate::coll::PMPI_Ireduce_scatter;
    fn MPI_Alltoallw_c / PMPI_Alltoallw_c(s: *const c_void, scs: *const Count, sds: *const isize, sts: *const Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rts: *const Handle, comm: Handle)
        on comm arrays [scs, sds, rcs, rds] counts [] => crate::coll::PMPI_Alltoallw;
    fn MPI_Ialltoallw_c / PMPI_Ialltoallw_c(s: *const c_void, scs: *const Count, sds: *const isize, sts: *const Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rts: *const Handle, comm: Handle, q: *mut Handle)
        on comm arrays [scs, sds, rcs, rds] counts [] => crate::coll::PMPI_Ialltoallw;
}

mpi! {
    fn MPI_Get_count_c / PMPI_Get_count_c(status: *const CStatus, dt: Handle, count: *mut i64) {
        let s = raw::get(status)?;
        let size = crate::types::size_of(dt)? as u64;
        let bytes = crate::req::status_bytes(&s);
        let n = match size {
            0 => 0,
            s if bytes % s != 0 => UNDEFINED as i64,
            s => (bytes / s) as i64,
        };
        raw::put(count, n)
    }
    fn MPI_Get_elements_c / PMPI_Get_elements_c(status: *const CStatus, dt: Handle, count: *mut i64) {
        let s = raw::get(status)?;
        let id = crate::types::type_id_any(dt)?;
        let n = metampi::datatype::abi::elements(id, crate::req::status_bytes(&s) as usize)
            .map_or(UNDEFINED as i64, |n| n as i64);
        raw::put(count, n)
    }
    fn MPI_Type_get_extent_c / PMPI_Type_get_extent_c(dt: Handle, lb: *mut i64, extent: *mut i64) {
        let l = crate::types::layout(dt)?;
        raw::put(lb, l.lb as i64)?;
        raw::put(extent, l.extent as i64)
    }
    fn MPI_Type_get_true_extent_c / PMPI_Type_get_true_extent_c(dt: Handle, lb: *mut i64, extent: *mut i64) {
        let l = crate::types::layout(dt)?;
        raw::put(lb, l.true_lb as i64)?;
        raw::put(extent, l.true_extent as i64)
    }
    fn MPI_Pack_size_c / PMPI_Pack_size_c(count: i64, dt: Handle, _comm: Handle, size: *mut i64) {
        if count < 0 {
            return Err(Fail::new(ERR_COUNT, format!("count {count} is negative")));
        }
        raw::put(size, count * crate::types::size_of(dt)? as i64)
    }
}

large! {
    fn MPI_Type_vector_c / PMPI_Type_vector_c(n: Count, bl: Count, stride: Count, old: Handle, new: *mut Handle) [n, bl, stride] => crate::types::PMPI_Type_vector;
    fn MPI_Type_create_hvector_c / PMPI_Type_create_hvector_c(n: Count, bl: Count, stride: isize, old: Handle, new: *mut Handle) [n, bl] => crate::types::PMPI_Type_create_hvector;
    fn MPI_Type_create_resized_c / PMPI_Type_create_resized_c(old: Handle, lb: isize, extent: isize, new: *mut Handle) [] => crate::types::PMPI_Type_create_resized;
    fn MPI_Buffer_attach_c / PMPI_Buffer_attach_c(b: *mut c_void, size: Count) [size] => crate::env::PMPI_Buffer_attach;
    fn MPI_Status_set_elements_x / PMPI_Status_set_elements_x(st: *mut CStatus, dt: Handle, n: Count) [n] => crate::p2p::PMPI_Status_set_elements;
    fn MPI_Status_set_elements_c / PMPI_Status_set_elements_c(st: *mut CStatus, dt: Handle, n: Count) [n] => crate::p2p::PMPI_Status_set_elements;
}

large_v! {
    fn MPI_Igatherv_c / PMPI_Igatherv_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rcs: *const Count, ds: *const isize, rdt: Handle, root: c_int, comm: Handle, q: *mut Handle)
        on comm arrays [rcs, ds] counts [sn] => crate::coll::PMPI_Igatherv;
    fn MPI_Iscatterv_c / PMPI_Iscatterv_c(s: *const c_void, scs: *const Count, ds: *const isize, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, root: c_int, comm: Handle, q: *mut Handle)
        on comm arrays [scs, ds] counts [rn] => crate::coll::PMPI_Iscatterv;
    fn MPI_Iallgatherv_c / PMPI_Iallgatherv_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rcs: *const Count, ds: *const isize, rdt: Handle, comm: Handle, q: *mut Handle)
        on comm arrays [rcs, ds] counts [sn] => crate::coll::PMPI_Iallgatherv;
    fn MPI_Ialltoallv_c / PMPI_Ialltoallv_c(s: *const c_void, scs: *const Count, sds: *const isize, sdt: Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rdt: Handle, comm: Handle, q: *mut Handle)
        on comm arrays [scs, sds, rcs, rds] counts [] => crate::coll::PMPI_Ialltoallv;
}

/// `n` values at `p` (`MPI_Count` arrays) narrowed to `int`s, `n` itself narrowed first.
fn ints(func: &str, p: *const Count, n: Count) -> Result<Vec<c_int>, c_int> {
    narrow_all(func, p, narrow(func, n)?)
}

/// `n` displacements at `p` as addresses.
fn addrs(func: &str, p: *const Count, n: Count) -> Result<Vec<isize>, c_int> {
    let v = raw::slice(p, narrow(func, n)?).map_err(|f| err::raise(func, f))?;
    Ok(v.iter().map(|&x| x as isize).collect())
}

/// Runs a body returning `Result<c_int, c_int>` (an error code either way) as a `c_int`.
macro_rules! codes {
    ($body:block) => {{
        let run = || -> Result<c_int, c_int> { $body };
        run().unwrap_or_else(|code| code)
    }};
}

/// Defines `MPI_X` and `PMPI_X` with a body that returns an MPI code.
macro_rules! coded {
    ($(fn $name:ident / $pname:ident ($($a:ident : $t:ty),*) $body:block)*) => {$(
        #[no_mangle]
        pub extern "C" fn $pname($($a: $t),*) -> c_int {
            codes!($body)
        }
        #[no_mangle]
        pub extern "C" fn $name($($a: $t),*) -> c_int {
            $pname($($a),*)
        }
    )*};
}

coded! {
    fn MPI_Type_indexed_c / PMPI_Type_indexed_c(n: Count, bls: *const Count, ds: *const Count, old: Handle, new: *mut Handle) {
        let f = "MPI_Type_indexed_c";
        let (b, d) = (ints(f, bls, n)?, ints(f, ds, n)?);
        Ok(crate::types::PMPI_Type_indexed(narrow(f, n)?, b.as_ptr(), d.as_ptr(), old, new))
    }
    fn MPI_Type_create_hindexed_c / PMPI_Type_create_hindexed_c(n: Count, bls: *const Count, ds: *const Count, old: Handle, new: *mut Handle) {
        let f = "MPI_Type_create_hindexed_c";
        let (b, d) = (ints(f, bls, n)?, addrs(f, ds, n)?);
        Ok(crate::types::PMPI_Type_create_hindexed(narrow(f, n)?, b.as_ptr(), d.as_ptr(), old, new))
    }
    fn MPI_Type_create_indexed_block_c / PMPI_Type_create_indexed_block_c(n: Count, bl: Count, ds: *const Count, old: Handle, new: *mut Handle) {
        let f = "MPI_Type_create_indexed_block_c";
        let d = ints(f, ds, n)?;
        Ok(crate::types::PMPI_Type_create_indexed_block(narrow(f, n)?, narrow(f, bl)?, d.as_ptr(), old, new))
    }
    fn MPI_Type_create_hindexed_block_c / PMPI_Type_create_hindexed_block_c(n: Count, bl: Count, ds: *const Count, old: Handle, new: *mut Handle) {
        let f = "MPI_Type_create_hindexed_block_c";
        let d = addrs(f, ds, n)?;
        Ok(crate::types::PMPI_Type_create_hindexed_block(narrow(f, n)?, narrow(f, bl)?, d.as_ptr(), old, new))
    }
    fn MPI_Type_create_struct_c / PMPI_Type_create_struct_c(n: Count, bls: *const Count, ds: *const Count, types: *const Handle, new: *mut Handle) {
        let f = "MPI_Type_create_struct_c";
        let (b, d) = (ints(f, bls, n)?, addrs(f, ds, n)?);
        Ok(crate::types::PMPI_Type_create_struct(narrow(f, n)?, b.as_ptr(), d.as_ptr(), types, new))
    }
    fn MPI_Type_create_subarray_c / PMPI_Type_create_subarray_c(nd: c_int, sizes: *const Count, subs: *const Count, starts: *const Count, order: c_int, old: Handle, new: *mut Handle) {
        let f = "MPI_Type_create_subarray_c";
        let (a, b, c) = (narrow_all(f, sizes, nd)?, narrow_all(f, subs, nd)?, narrow_all(f, starts, nd)?);
        Ok(crate::types::PMPI_Type_create_subarray(nd, a.as_ptr(), b.as_ptr(), c.as_ptr(), order, old, new))
    }
    fn MPI_Type_create_darray_c / PMPI_Type_create_darray_c(size: c_int, rank: c_int, nd: c_int, gsizes: *const Count, distribs: *const c_int, dargs: *const c_int, psizes: *const c_int, order: c_int, old: Handle, new: *mut Handle) {
        let f = "MPI_Type_create_darray_c";
        let g = narrow_all(f, gsizes, nd)?;
        Ok(crate::types::PMPI_Type_create_darray(size, rank, nd, g.as_ptr(), distribs, dargs, psizes, order, old, new))
    }
    fn MPI_Buffer_detach_c / PMPI_Buffer_detach_c(b: *mut *mut c_void, size: *mut Count) {
        let mut n: c_int = 0;
        let rc = crate::env::PMPI_Buffer_detach(b, &mut n);
        raw::put_opt(size, n as Count);
        Ok(rc)
    }
    fn MPI_Type_get_envelope_c / PMPI_Type_get_envelope_c(dt: Handle, ni: *mut Count, na: *mut Count, nl: *mut Count, nt: *mut Count, comb: *mut c_int) {
        // The `_c` constructors here make the `int` forms' types: no large counts to report.
        let (mut i, mut a, mut t) = (0, 0, 0);
        let rc = crate::types::PMPI_Type_get_envelope(dt, &mut i, &mut a, &mut t, comb);
        raw::put_opt(ni, i as Count);
        raw::put_opt(na, a as Count);
        raw::put_opt(nl, 0);
        raw::put_opt(nt, t as Count);
        Ok(rc)
    }
    fn MPI_Type_get_contents_c / PMPI_Type_get_contents_c(dt: Handle, ni: Count, na: Count, _nl: Count, nt: Count, is: *mut c_int, as_: *mut isize, _ls: *mut Count, ts: *mut Handle) {
        let f = "MPI_Type_get_contents_c";
        Ok(crate::types::PMPI_Type_get_contents(dt, narrow(f, ni)?, narrow(f, na)?, narrow(f, nt)?, is, as_, ts))
    }
    fn MPI_Pack_c / PMPI_Pack_c(inbuf: *const c_void, n: Count, dt: Handle, out: *mut c_void, outsize: Count, pos: *mut Count, comm: Handle) {
        let f = "MPI_Pack_c";
        let mut p = narrow(f, raw::get(pos).map_err(|e| err::raise(f, e))?)?;
        let rc = crate::types::PMPI_Pack(inbuf, narrow(f, n)?, dt, out, narrow(f, outsize)?, &mut p, comm);
        raw::put_opt(pos, p as Count);
        Ok(rc)
    }
    fn MPI_Unpack_c / PMPI_Unpack_c(inbuf: *const c_void, insize: Count, pos: *mut Count, out: *mut c_void, n: Count, dt: Handle, comm: Handle) {
        let f = "MPI_Unpack_c";
        let mut p = narrow(f, raw::get(pos).map_err(|e| err::raise(f, e))?)?;
        let rc = crate::types::PMPI_Unpack(inbuf, narrow(f, insize)?, &mut p, out, narrow(f, n)?, dt, comm);
        raw::put_opt(pos, p as Count);
        Ok(rc)
    }
}

large! {
    fn MPI_Bcast_init_c / PMPI_Bcast_init_c(b: *mut c_void, n: Count, dt: Handle, root: c_int, c: Handle, i: Handle, q: *mut Handle) [n] => crate::persist::PMPI_Bcast_init;
    fn MPI_Reduce_init_c / PMPI_Reduce_init_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, root: c_int, c: Handle, i: Handle, q: *mut Handle) [n] => crate::persist::PMPI_Reduce_init;
    fn MPI_Allreduce_init_c / PMPI_Allreduce_init_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle, i: Handle, q: *mut Handle) [n] => crate::persist::PMPI_Allreduce_init;
    fn MPI_Scan_init_c / PMPI_Scan_init_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle, i: Handle, q: *mut Handle) [n] => crate::persist::PMPI_Scan_init;
    fn MPI_Exscan_init_c / PMPI_Exscan_init_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle, i: Handle, q: *mut Handle) [n] => crate::persist::PMPI_Exscan_init;
    fn MPI_Reduce_scatter_block_init_c / PMPI_Reduce_scatter_block_init_c(s: *const c_void, r: *mut c_void, n: Count, dt: Handle, op: Handle, c: Handle, i: Handle, q: *mut Handle) [n] => crate::persist::PMPI_Reduce_scatter_block_init;
    fn MPI_Gather_init_c / PMPI_Gather_init_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, root: c_int, c: Handle, i: Handle, q: *mut Handle) [sn, rn] => crate::persist::PMPI_Gather_init;
    fn MPI_Scatter_init_c / PMPI_Scatter_init_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, root: c_int, c: Handle, i: Handle, q: *mut Handle) [sn, rn] => crate::persist::PMPI_Scatter_init;
    fn MPI_Allgather_init_c / PMPI_Allgather_init_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle, i: Handle, q: *mut Handle) [sn, rn] => crate::persist::PMPI_Allgather_init;
    fn MPI_Alltoall_init_c / PMPI_Alltoall_init_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle, i: Handle, q: *mut Handle) [sn, rn] => crate::persist::PMPI_Alltoall_init;
    fn MPI_Neighbor_allgather_c / PMPI_Neighbor_allgather_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle) [sn, rn] => crate::neighbor::PMPI_Neighbor_allgather;
    fn MPI_Ineighbor_allgather_c / PMPI_Ineighbor_allgather_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle, q: *mut Handle) [sn, rn] => crate::neighbor::PMPI_Ineighbor_allgather;
    fn MPI_Neighbor_allgather_init_c / PMPI_Neighbor_allgather_init_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle, i: Handle, q: *mut Handle) [sn, rn] => crate::neighbor::PMPI_Neighbor_allgather_init;
    fn MPI_Neighbor_alltoall_c / PMPI_Neighbor_alltoall_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle) [sn, rn] => crate::neighbor::PMPI_Neighbor_alltoall;
    fn MPI_Ineighbor_alltoall_c / PMPI_Ineighbor_alltoall_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle, q: *mut Handle) [sn, rn] => crate::neighbor::PMPI_Ineighbor_alltoall;
    fn MPI_Neighbor_alltoall_init_c / PMPI_Neighbor_alltoall_init_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, c: Handle, i: Handle, q: *mut Handle) [sn, rn] => crate::neighbor::PMPI_Neighbor_alltoall_init;
}

large_v! {
    fn MPI_Gatherv_init_c / PMPI_Gatherv_init_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rcs: *const Count, ds: *const isize, rdt: Handle, root: c_int, comm: Handle, i: Handle, q: *mut Handle)
        on comm arrays [rcs, ds] counts [sn] => crate::persist::PMPI_Gatherv_init;
    fn MPI_Scatterv_init_c / PMPI_Scatterv_init_c(s: *const c_void, scs: *const Count, ds: *const isize, sdt: Handle, r: *mut c_void, rn: Count, rdt: Handle, root: c_int, comm: Handle, i: Handle, q: *mut Handle)
        on comm arrays [scs, ds] counts [rn] => crate::persist::PMPI_Scatterv_init;
    fn MPI_Allgatherv_init_c / PMPI_Allgatherv_init_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rcs: *const Count, ds: *const isize, rdt: Handle, comm: Handle, i: Handle, q: *mut Handle)
        on comm arrays [rcs, ds] counts [sn] => crate::persist::PMPI_Allgatherv_init;
    fn MPI_Alltoallv_init_c / PMPI_Alltoallv_init_c(s: *const c_void, scs: *const Count, sds: *const isize, sdt: Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rdt: Handle, comm: Handle, i: Handle, q: *mut Handle)
        on comm arrays [scs, sds, rcs, rds] counts [] => crate::persist::PMPI_Alltoallv_init;
    fn MPI_Alltoallw_init_c / PMPI_Alltoallw_init_c(s: *const c_void, scs: *const Count, sds: *const isize, sts: *const Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rts: *const Handle, comm: Handle, i: Handle, q: *mut Handle)
        on comm arrays [scs, sds, rcs, rds] counts [] => crate::persist::PMPI_Alltoallw_init;
    fn MPI_Reduce_scatter_init_c / PMPI_Reduce_scatter_init_c(s: *const c_void, r: *mut c_void, rcs: *const Count, dt: Handle, op: Handle, comm: Handle, i: Handle, q: *mut Handle)
        on comm arrays [rcs] counts [] => crate::persist::PMPI_Reduce_scatter_init;
}

/// Defines a neighbourhood collective's `_c` form: each array named is narrowed over
/// the calling rank's in-degree (`0`) or out-degree (`1`), the counts named too.
macro_rules! large_n {
    ($(fn $name:ident / $pname:ident ($($a:ident : $t:ty),*) on $comm:ident arrays [$($v:ident : $deg:expr),*] counts [$($n:ident),*] => $int:path;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $pname($($a: $t),*) -> c_int {
            let f = stringify!($name);
            let degs = match crate::neighbor::degrees($comm) {
                Ok((ni, no)) => [ni, no],
                Err(e) => return err::raise(f, e),
            };
            $(let $v = match narrow_all(f, $v, degs[$deg]) { Ok(v) => v, Err(code) => return code };)*
            $(let $v = $v.as_ptr();)*
            narrowed!(f, [$($n),*], $int($($a),*))
        }
        #[no_mangle]
        pub extern "C" fn $name($($a: $t),*) -> c_int {
            $pname($($a),*)
        }
    )*};
}

large_n! {
    fn MPI_Neighbor_allgatherv_c / PMPI_Neighbor_allgatherv_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rcs: *const Count, ds: *const isize, rdt: Handle, comm: Handle)
        on comm arrays [rcs: 0, ds: 0] counts [sn] => crate::neighbor::PMPI_Neighbor_allgatherv;
    fn MPI_Ineighbor_allgatherv_c / PMPI_Ineighbor_allgatherv_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rcs: *const Count, ds: *const isize, rdt: Handle, comm: Handle, q: *mut Handle)
        on comm arrays [rcs: 0, ds: 0] counts [sn] => crate::neighbor::PMPI_Ineighbor_allgatherv;
    fn MPI_Neighbor_allgatherv_init_c / PMPI_Neighbor_allgatherv_init_c(s: *const c_void, sn: Count, sdt: Handle, r: *mut c_void, rcs: *const Count, ds: *const isize, rdt: Handle, comm: Handle, i: Handle, q: *mut Handle)
        on comm arrays [rcs: 0, ds: 0] counts [sn] => crate::neighbor::PMPI_Neighbor_allgatherv_init;
    fn MPI_Neighbor_alltoallv_c / PMPI_Neighbor_alltoallv_c(s: *const c_void, scs: *const Count, sds: *const isize, sdt: Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rdt: Handle, comm: Handle)
        on comm arrays [scs: 1, sds: 1, rcs: 0, rds: 0] counts [] => crate::neighbor::PMPI_Neighbor_alltoallv;
    fn MPI_Ineighbor_alltoallv_c / PMPI_Ineighbor_alltoallv_c(s: *const c_void, scs: *const Count, sds: *const isize, sdt: Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rdt: Handle, comm: Handle, q: *mut Handle)
        on comm arrays [scs: 1, sds: 1, rcs: 0, rds: 0] counts [] => crate::neighbor::PMPI_Ineighbor_alltoallv;
    fn MPI_Neighbor_alltoallv_init_c / PMPI_Neighbor_alltoallv_init_c(s: *const c_void, scs: *const Count, sds: *const isize, sdt: Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rdt: Handle, comm: Handle, i: Handle, q: *mut Handle)
        on comm arrays [scs: 1, sds: 1, rcs: 0, rds: 0] counts [] => crate::neighbor::PMPI_Neighbor_alltoallv_init;
    fn MPI_Neighbor_alltoallw_c / PMPI_Neighbor_alltoallw_c(s: *const c_void, scs: *const Count, sds: *const isize, sts: *const Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rts: *const Handle, comm: Handle)
        on comm arrays [scs: 1, rcs: 0] counts [] => crate::neighbor::PMPI_Neighbor_alltoallw;
    fn MPI_Ineighbor_alltoallw_c / PMPI_Ineighbor_alltoallw_c(s: *const c_void, scs: *const Count, sds: *const isize, sts: *const Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rts: *const Handle, comm: Handle, q: *mut Handle)
        on comm arrays [scs: 1, rcs: 0] counts [] => crate::neighbor::PMPI_Ineighbor_alltoallw;
    fn MPI_Neighbor_alltoallw_init_c / PMPI_Neighbor_alltoallw_init_c(s: *const c_void, scs: *const Count, sds: *const isize, sts: *const Handle, r: *mut c_void, rcs: *const Count, rds: *const isize, rts: *const Handle, comm: Handle, i: Handle, q: *mut Handle)
        on comm arrays [scs: 1, rcs: 0] counts [] => crate::neighbor::PMPI_Neighbor_alltoallw_init;
}
