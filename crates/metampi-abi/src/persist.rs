//! Persistent collectives (MPI-4 §6.13): `MPI_Bcast_init` and kin make an
//! inactive persistent request; each `MPI_Start` begins the matching nonblocking
//! collective over the arguments given at init, so a started persistent
//! collective is exactly the nonblocking one (same schedules, same context).
//!
//! The argument arrays of the varying-count forms are copied at init: the
//! `_c` forms pass arrays narrowed into temporaries that end with the call.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use metampi::topology::Communicator;

use crate::coll::{self, Elementwise};
use crate::consts::*;
use crate::err::R;
use crate::raw;
use crate::req::{self, Req, Spec};
use crate::state;

/// A persistent request whose every start runs `start`, which begins the
/// nonblocking operation and writes its handle where it is told.
pub(crate) fn persistent(
    rq: *mut Handle,
    start: impl Fn(*mut Handle) -> R + Send + Sync + 'static,
) -> R {
    coll::req_out(rq)?;
    let op = move || {
        let mut h = REQUEST_NULL;
        start(&mut h)?;
        req::take_out(h)
    };
    let spec = Spec::Op(Arc::new(op));
    raw::put(rq, req::insert(Req::Persistent { spec, active: None }))
}

/// Binds the pointers named to copies the closure may hold, and makes the request.
macro_rules! persist {
    ($rq:expr, [$($p:ident),*], |$r:ident| $body:expr) => {{
        $(let $p = $crate::raw::Shared($p);)*
        $crate::persist::persistent($rq, move |$r| {
            $(let $p = $p.get();)*
            $body
        })
    }};
}
pub(crate) use persist;

/// A copy of the `n` values at `p` (none for a null pointer: arrays a rank does not
/// use, such as a non-root's counts, may be null).
pub(crate) fn own<T: Copy>(p: *const T, n: c_int) -> R<Option<Vec<T>>> {
    match p.is_null() {
        true => Ok(None),
        false => Ok(Some(raw::slice(p, n)?.to_vec())),
    }
}

/// Where an owned copy is, for the call that reads it.
pub(crate) fn at<T>(v: &Option<Vec<T>>) -> *const T {
    v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr())
}

/// The size of an intracommunicator, checked at init.
fn size(comm: Handle) -> R<c_int> {
    Ok(state::intra(comm)?.comm.size())
}

mpi! {
    fn MPI_Barrier_init / PMPI_Barrier_init(comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persistent(rq, move |r| coll::barrier(comm, r))
    }
    fn MPI_Bcast_init / PMPI_Bcast_init(buf: *mut c_void, count: c_int, dt: Handle, root: c_int, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [buf], |r| coll::bcast(buf, count, dt, root, comm, r))
    }
    fn MPI_Reduce_init / PMPI_Reduce_init(s: *const c_void, rb: *mut c_void, count: c_int, dt: Handle, op: Handle, root: c_int, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [s, rb], |r| coll::reduce(s, rb, count, dt, op, root, comm, r))
    }
    fn MPI_Allreduce_init / PMPI_Allreduce_init(s: *const c_void, rb: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [s, rb], |r| coll::elementwise(Elementwise::All, s, rb, count, dt, op, comm, r))
    }
    fn MPI_Scan_init / PMPI_Scan_init(s: *const c_void, rb: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [s, rb], |r| coll::elementwise(Elementwise::Scan, s, rb, count, dt, op, comm, r))
    }
    fn MPI_Exscan_init / PMPI_Exscan_init(s: *const c_void, rb: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [s, rb], |r| coll::elementwise(Elementwise::Exscan, s, rb, count, dt, op, comm, r))
    }
    fn MPI_Reduce_scatter_block_init / PMPI_Reduce_scatter_block_init(s: *const c_void, rb: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [s, rb], |r| coll::reduce_scatter_block(s, rb, count, dt, op, comm, r))
    }
    fn MPI_Reduce_scatter_init / PMPI_Reduce_scatter_init(s: *const c_void, rb: *mut c_void, counts: *const c_int, dt: Handle, op: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        let counts = own(counts, size(comm)?)?;
        persist!(rq, [s, rb], |r| {
            coll::reduce_scatter(s, rb, at(&counts), dt, op, comm)?;
            coll::deliver(r, None)
        })
    }
    fn MPI_Gather_init / PMPI_Gather_init(s: *const c_void, sc: c_int, sdt: Handle, rb: *mut c_void, rc: c_int, rdt: Handle, root: c_int, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [s, rb], |r| coll::gather(s, sc, sdt, rb, rc, rdt, root, comm, r))
    }
    fn MPI_Gatherv_init / PMPI_Gatherv_init(s: *const c_void, sc: c_int, sdt: Handle, rb: *mut c_void, rcs: *const c_int, ds: *const c_int, rdt: Handle, root: c_int, comm: Handle, _info: Handle, rq: *mut Handle) {
        let n = size(comm)?;
        let (rcs, ds) = (own(rcs, n)?, own(ds, n)?);
        persist!(rq, [s, rb], |r| coll::gatherv(s, sc, sdt, rb, at(&rcs), at(&ds), rdt, root, comm, r))
    }
    fn MPI_Scatter_init / PMPI_Scatter_init(s: *const c_void, sc: c_int, sdt: Handle, rb: *mut c_void, rc: c_int, rdt: Handle, root: c_int, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [s, rb], |r| coll::scatter(s, sc, sdt, rb, rc, rdt, root, comm, r))
    }
    fn MPI_Scatterv_init / PMPI_Scatterv_init(s: *const c_void, scs: *const c_int, ds: *const c_int, sdt: Handle, rb: *mut c_void, rc: c_int, rdt: Handle, root: c_int, comm: Handle, _info: Handle, rq: *mut Handle) {
        let n = size(comm)?;
        let (scs, ds) = (own(scs, n)?, own(ds, n)?);
        persist!(rq, [s, rb], |r| coll::scatterv(s, at(&scs), at(&ds), sdt, rb, rc, rdt, root, comm, r))
    }
    fn MPI_Allgather_init / PMPI_Allgather_init(s: *const c_void, sc: c_int, sdt: Handle, rb: *mut c_void, rc: c_int, rdt: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [s, rb], |r| coll::allgather(s, sc, sdt, rb, rc, rdt, comm, r))
    }
    fn MPI_Allgatherv_init / PMPI_Allgatherv_init(s: *const c_void, sc: c_int, sdt: Handle, rb: *mut c_void, rcs: *const c_int, ds: *const c_int, rdt: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        let n = size(comm)?;
        let (rcs, ds) = (own(rcs, n)?, own(ds, n)?);
        persist!(rq, [s, rb], |r| coll::allgatherv(s, sc, sdt, rb, at(&rcs), at(&ds), rdt, comm, r))
    }
    fn MPI_Alltoall_init / PMPI_Alltoall_init(s: *const c_void, sc: c_int, sdt: Handle, rb: *mut c_void, rc: c_int, rdt: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        size(comm)?;
        persist!(rq, [s, rb], |r| coll::alltoall(s, sc, sdt, rb, rc, rdt, comm, r))
    }
    fn MPI_Alltoallv_init / PMPI_Alltoallv_init(s: *const c_void, scs: *const c_int, sds: *const c_int, sdt: Handle, rb: *mut c_void, rcs: *const c_int, rds: *const c_int, rdt: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        let n = size(comm)?;
        let (scs, sds, rcs, rds) = (own(scs, n)?, own(sds, n)?, own(rcs, n)?, own(rds, n)?);
        persist!(rq, [s, rb], |r| coll::alltoallv(s, at(&scs), at(&sds), sdt, rb, at(&rcs), at(&rds), rdt, comm, r))
    }
    fn MPI_Alltoallw_init / PMPI_Alltoallw_init(s: *const c_void, scs: *const c_int, sds: *const c_int, sts: *const Handle, rb: *mut c_void, rcs: *const c_int, rds: *const c_int, rts: *const Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        let n = size(comm)?;
        let (scs, sds, sts) = (own(scs, n)?, own(sds, n)?, own(sts, n)?);
        let (rcs, rds, rts) = (own(rcs, n)?, own(rds, n)?, own(rts, n)?);
        persist!(rq, [s, rb], |r| coll::alltoallw(s, at(&scs), at(&sds), at(&sts), rb, at(&rcs), at(&rds), at(&rts), comm, r))
    }
}
