//! Neighbourhood collectives (MPI-4 §8.6): each rank receives one block from
//! every source and sends one to every destination its topology names, in the
//! order `MPI_Cart_shift`/`MPI_Graph_neighbors`/`MPI_Dist_graph_neighbors`
//! give them. They run as point-to-point messages on the communicator's private
//! duplicate (made when the topology was attached), so they never match the
//! program's messages, and complete as one request.
//!
//! A Cartesian rank can have the same neighbour in both directions of a
//! dimension (a periodic dimension of size 1 or 2), so each block is tagged
//! with the direction it travels: the block sent towards direction `k` lands in
//! the neighbour's slot for the opposite direction, `k ^ 1`. Graph edges carry
//! one tag and pair up in order, as MPI's non-overtaking rule makes them.

use std::ffi::{c_int, c_void};

use metampi::point_to_point::{Destination, Mode, Source};
use metampi::topology::Communicator;

use crate::consts::*;
use crate::err::{Fail, R};
use crate::persist::{at, own, persist};
use crate::raw::{self, CScope};
use crate::req::{self, Req, St};
use crate::state::{self, CommEntry, Topo};
use crate::topo::neighbors;
use crate::types;

/// One block: where, how many, of which datatype.
pub(crate) type Block = (*const c_void, c_int, Handle);

/// The neighbours of the calling rank: (sources, destinations, Cartesian).
fn hood(c: &CommEntry) -> R<(Vec<c_int>, Vec<c_int>, bool)> {
    let (s, d) = neighbors(c)?;
    Ok((s, d, matches!(c.topo(), Topo::Cart { .. })))
}

/// Starts the receives of `recvs` from the sources and the sends of `sends` to the
/// destinations, as one request.
fn exchange(c: &CommEntry, sends: Vec<Block>, recvs: Vec<Block>) -> R<Req> {
    let (srcs, dsts, cart) = hood(c)?;
    let nc = c
        .neigh
        .get()
        .ok_or_else(|| Fail::new(ERR_TOPOLOGY, "the communicator has no topology"))?;
    let mut parts = Vec::with_capacity(srcs.len() + dsts.len());
    for (i, (&src, &(p, n, dt))) in srcs.iter().zip(&recvs).enumerate() {
        let mut b = types::buf(p, n, dt)?;
        if src == PROC_NULL {
            continue;
        }
        let tag = if cart { (i ^ 1) as c_int } else { 0 };
        let r = nc
            .process_at_rank(src)
            .try_immediate_receive_into(CScope, &mut b, Some(tag))?;
        parts.push((
            false,
            Req::Live {
                r: raw::detach(r),
                keep: Vec::new(),
            },
        ));
    }
    for (j, (&dst, &(p, n, dt))) in dsts.iter().zip(&sends).enumerate() {
        let b = types::buf(p, n, dt)?;
        if dst == PROC_NULL {
            continue;
        }
        let tag = if cart { j as c_int } else { 0 };
        let r = nc
            .process_at_rank(dst)
            .immediate_with_mode(CScope, &b, tag, Mode::Standard)?;
        parts.push((
            false,
            Req::Live {
                r: raw::detach(r),
                keep: Vec::new(),
            },
        ));
    }
    Ok(Req::Multi {
        parts,
        st: St::EMPTY,
        fail: None,
    })
}

/// Blocking (`rq` null) or nonblocking: the exchange waited for or made a request.
fn run(c: &CommEntry, sends: Vec<Block>, recvs: Vec<Block>, rq: *mut Handle) -> R {
    let r = exchange(c, sends, recvs)?;
    match rq.is_null() {
        true => req::wait_now(r).map(|_| ()),
        false => raw::put(rq, req::insert(r)),
    }
}

fn extent(dt: Handle) -> R<isize> {
    crate::coll::extent(dt)
}

fn ints<'a>(p: *const c_int, n: usize) -> R<&'a [c_int]> {
    raw::slice(p, n as c_int)
}

/// `n` blocks of `count` elements of `dt` one after another from `p`.
pub(crate) fn row(p: *const c_void, count: c_int, dt: Handle, n: usize) -> R<Vec<Block>> {
    let step = count as isize * extent(dt)?;
    Ok((0..n)
        .map(|i| {
            (
                raw::offset(p, i as isize * step) as *const c_void,
                count,
                dt,
            )
        })
        .collect())
}

/// Blocks at element displacements `displs` with counts `counts`.
pub(crate) fn placed(
    p: *const c_void,
    counts: &[c_int],
    displs: &[c_int],
    dt: Handle,
) -> R<Vec<Block>> {
    let ext = extent(dt)?;
    Ok(counts
        .iter()
        .zip(displs)
        .map(|(&n, &d)| (raw::offset(p, d as isize * ext) as *const c_void, n, dt))
        .collect())
}

pub(crate) fn allgather(
    s: *const c_void,
    sc: c_int,
    sdt: Handle,
    r: *mut c_void,
    rc: c_int,
    rdt: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    let c = state::intra(comm)?;
    let (srcs, dsts, _) = hood(&c)?;
    let sends = vec![(s, sc, sdt); dsts.len()];
    run(&c, sends, row(r, rc, rdt, srcs.len())?, rq)
}

pub(crate) fn allgatherv(
    s: *const c_void,
    sc: c_int,
    sdt: Handle,
    r: *mut c_void,
    rcs: *const c_int,
    ds: *const c_int,
    rdt: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    let c = state::intra(comm)?;
    let (srcs, dsts, _) = hood(&c)?;
    let sends = vec![(s, sc, sdt); dsts.len()];
    let n = srcs.len();
    let recvs = placed(r, ints(rcs, n)?, ints(ds, n)?, rdt)?;
    run(&c, sends, recvs, rq)
}

pub(crate) fn alltoall(
    s: *const c_void,
    sc: c_int,
    sdt: Handle,
    r: *mut c_void,
    rc: c_int,
    rdt: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    let c = state::intra(comm)?;
    let (srcs, dsts, _) = hood(&c)?;
    let sends = row(s, sc, sdt, dsts.len())?;
    run(&c, sends, row(r, rc, rdt, srcs.len())?, rq)
}

pub(crate) fn alltoallv(
    s: *const c_void,
    scs: *const c_int,
    sds: *const c_int,
    sdt: Handle,
    r: *mut c_void,
    rcs: *const c_int,
    rds: *const c_int,
    rdt: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    let c = state::intra(comm)?;
    let (srcs, dsts, _) = hood(&c)?;
    let (ni, no) = (srcs.len(), dsts.len());
    let sends = placed(s, ints(scs, no)?, ints(sds, no)?, sdt)?;
    let recvs = placed(r, ints(rcs, ni)?, ints(rds, ni)?, rdt)?;
    run(&c, sends, recvs, rq)
}

/// Blocks at byte displacements, each with its own datatype.
pub(crate) fn typed(
    p: *const c_void,
    counts: &[c_int],
    displs: &[isize],
    types_: &[Handle],
) -> Vec<Block> {
    counts
        .iter()
        .zip(displs)
        .zip(types_)
        .map(|((&n, &d), &t)| (raw::offset(p, d) as *const c_void, n, t))
        .collect()
}

pub(crate) fn alltoallw(
    s: *const c_void,
    scs: *const c_int,
    sds: *const isize,
    sts: *const Handle,
    r: *mut c_void,
    rcs: *const c_int,
    rds: *const isize,
    rts: *const Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    let c = state::intra(comm)?;
    let (srcs, dsts, _) = hood(&c)?;
    let (ni, no) = (srcs.len() as c_int, dsts.len() as c_int);
    let sends = typed(
        s,
        raw::slice(scs, no)?,
        raw::slice(sds, no)?,
        raw::slice(sts, no)?,
    );
    let recvs = typed(
        r,
        raw::slice(rcs, ni)?,
        raw::slice(rds, ni)?,
        raw::slice(rts, ni)?,
    );
    run(&c, sends, recvs, rq)
}

/// (in-degree, out-degree) of the calling rank in `comm`'s topology.
pub(crate) fn degrees(comm: Handle) -> R<(c_int, c_int)> {
    let c = state::intra(comm)?;
    let (s, d, _) = hood(&c)?;
    Ok((s.len() as c_int, d.len() as c_int))
}

const NULL: *mut Handle = std::ptr::null_mut();

mpi! {
    fn MPI_Neighbor_allgather / PMPI_Neighbor_allgather(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle) {
        allgather(s, sc, sdt, r, rc, rdt, comm, NULL)
    }
    fn MPI_Ineighbor_allgather / PMPI_Ineighbor_allgather(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle, rq: *mut Handle) {
        crate::coll::req_out(rq)?;
        allgather(s, sc, sdt, r, rc, rdt, comm, rq)
    }
    fn MPI_Neighbor_allgather_init / PMPI_Neighbor_allgather_init(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        degrees(comm)?;
        persist!(rq, [s, r], |q| allgather(s, sc, sdt, r, rc, rdt, comm, q))
    }
    fn MPI_Neighbor_allgatherv / PMPI_Neighbor_allgatherv(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, ds: *const c_int, rdt: Handle, comm: Handle) {
        allgatherv(s, sc, sdt, r, rcs, ds, rdt, comm, NULL)
    }
    fn MPI_Ineighbor_allgatherv / PMPI_Ineighbor_allgatherv(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, ds: *const c_int, rdt: Handle, comm: Handle, rq: *mut Handle) {
        crate::coll::req_out(rq)?;
        allgatherv(s, sc, sdt, r, rcs, ds, rdt, comm, rq)
    }
    fn MPI_Neighbor_allgatherv_init / PMPI_Neighbor_allgatherv_init(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, ds: *const c_int, rdt: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        let (ni, _) = degrees(comm)?;
        let (rcs, ds) = (own(rcs, ni)?, own(ds, ni)?);
        persist!(rq, [s, r], |q| allgatherv(s, sc, sdt, r, at(&rcs), at(&ds), rdt, comm, q))
    }
    fn MPI_Neighbor_alltoall / PMPI_Neighbor_alltoall(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle) {
        alltoall(s, sc, sdt, r, rc, rdt, comm, NULL)
    }
    fn MPI_Ineighbor_alltoall / PMPI_Ineighbor_alltoall(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle, rq: *mut Handle) {
        crate::coll::req_out(rq)?;
        alltoall(s, sc, sdt, r, rc, rdt, comm, rq)
    }
    fn MPI_Neighbor_alltoall_init / PMPI_Neighbor_alltoall_init(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        degrees(comm)?;
        persist!(rq, [s, r], |q| alltoall(s, sc, sdt, r, rc, rdt, comm, q))
    }
    fn MPI_Neighbor_alltoallv / PMPI_Neighbor_alltoallv(s: *const c_void, scs: *const c_int, sds: *const c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, rds: *const c_int, rdt: Handle, comm: Handle) {
        alltoallv(s, scs, sds, sdt, r, rcs, rds, rdt, comm, NULL)
    }
    fn MPI_Ineighbor_alltoallv / PMPI_Ineighbor_alltoallv(s: *const c_void, scs: *const c_int, sds: *const c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, rds: *const c_int, rdt: Handle, comm: Handle, rq: *mut Handle) {
        crate::coll::req_out(rq)?;
        alltoallv(s, scs, sds, sdt, r, rcs, rds, rdt, comm, rq)
    }
    fn MPI_Neighbor_alltoallv_init / PMPI_Neighbor_alltoallv_init(s: *const c_void, scs: *const c_int, sds: *const c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, rds: *const c_int, rdt: Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        let (ni, no) = degrees(comm)?;
        let (scs, sds, rcs, rds) = (own(scs, no)?, own(sds, no)?, own(rcs, ni)?, own(rds, ni)?);
        persist!(rq, [s, r], |q| alltoallv(s, at(&scs), at(&sds), sdt, r, at(&rcs), at(&rds), rdt, comm, q))
    }
    fn MPI_Neighbor_alltoallw / PMPI_Neighbor_alltoallw(s: *const c_void, scs: *const c_int, sds: *const isize, sts: *const Handle, r: *mut c_void, rcs: *const c_int, rds: *const isize, rts: *const Handle, comm: Handle) {
        alltoallw(s, scs, sds, sts, r, rcs, rds, rts, comm, NULL)
    }
    fn MPI_Ineighbor_alltoallw / PMPI_Ineighbor_alltoallw(s: *const c_void, scs: *const c_int, sds: *const isize, sts: *const Handle, r: *mut c_void, rcs: *const c_int, rds: *const isize, rts: *const Handle, comm: Handle, rq: *mut Handle) {
        crate::coll::req_out(rq)?;
        alltoallw(s, scs, sds, sts, r, rcs, rds, rts, comm, rq)
    }
    fn MPI_Neighbor_alltoallw_init / PMPI_Neighbor_alltoallw_init(s: *const c_void, scs: *const c_int, sds: *const isize, sts: *const Handle, r: *mut c_void, rcs: *const c_int, rds: *const isize, rts: *const Handle, comm: Handle, _info: Handle, rq: *mut Handle) {
        let (ni, no) = degrees(comm)?;
        let (scs, sds, sts) = (own(scs, no)?, own(sds, no)?, own(sts, no)?);
        let (rcs, rds, rts) = (own(rcs, ni)?, own(rds, ni)?, own(rts, ni)?);
        persist!(rq, [s, r], |q| alltoallw(s, at(&scs), at(&sds), at(&sts), r, at(&rcs), at(&rds), at(&rts), comm, q))
    }
}
