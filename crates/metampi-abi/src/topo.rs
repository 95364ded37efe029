//! Process topologies (MPI-4 §8): Cartesian grids, graphs and distributed
//! graphs kept beside the communicator they were made on. Ranks are not
//! reordered (`reorder` is allowed to be ignored).

use std::ffi::c_int;

use metampi::collective::CommunicatorCollectives;
use metampi::datatype::PartitionMut;
use metampi::topology::{Color, Communicator};

use crate::consts::*;
use crate::err::{Fail, R};
use crate::raw::{self, CPtr};
use crate::state::{self, CommEntry, Topo};

/// The sentinel behind `MPI_UNWEIGHTED` and `MPI_WEIGHTS_EMPTY`.
static SENTINELS: [c_int; 2] = [0, 0];

/// `MPI_UNWEIGHTED` (mpi.h declares `extern int * const MPI_UNWEIGHTED`).
#[no_mangle]
pub static MPI_UNWEIGHTED: CPtr = CPtr(&SENTINELS[0]);
/// `MPI_WEIGHTS_EMPTY`.
#[no_mangle]
pub static MPI_WEIGHTS_EMPTY: CPtr = CPtr(&SENTINELS[1]);

#[cfg(not(std_abi))]
fn unweighted(p: *const c_int) -> bool {
    p == MPI_UNWEIGHTED.0
}

#[cfg(not(std_abi))]
fn weights_empty(p: *const c_int) -> bool {
    p == MPI_WEIGHTS_EMPTY.0
}

/// The standard ABI names `MPI_UNWEIGHTED` and `MPI_WEIGHTS_EMPTY` by fixed addresses.
#[cfg(std_abi)]
fn unweighted(p: *const c_int) -> bool {
    p as usize == UNWEIGHTED
}

#[cfg(std_abi)]
fn weights_empty(p: *const c_int) -> bool {
    p as usize == WEIGHTS_EMPTY
}

/// The `n` weights at `p`; `MPI_WEIGHTS_EMPTY` (a weighted graph's empty list) only for none.
fn weights(p: *const c_int, n: c_int) -> R<Vec<c_int>> {
    match (weights_empty(p), n > 0) {
        (true, true) => Err(Fail::arg(format!(
            "MPI_WEIGHTS_EMPTY stands for no weights, but {n} edges are given"
        ))),
        (true, false) => Ok(Vec::new()),
        (false, _) => Ok(raw::slice(p, n)?.to_vec()),
    }
}

fn cart(c: &CommEntry) -> R<(Vec<c_int>, Vec<bool>)> {
    match c.topo() {
        Topo::Cart { dims, periods } => Ok((dims, periods)),
        _ => Err(Fail::new(
            ERR_TOPOLOGY,
            "the communicator has no Cartesian topology",
        )),
    }
}

fn coords_of(dims: &[c_int], mut rank: c_int) -> Vec<c_int> {
    let mut out = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        out[d] = rank % dims[d].max(1);
        rank /= dims[d].max(1);
    }
    out
}

fn rank_of(dims: &[c_int], periods: &[bool], coords: &[c_int]) -> R<c_int> {
    let mut r = 0;
    for d in 0..dims.len() {
        let mut x = coords[d];
        if periods[d] {
            x = x.rem_euclid(dims[d]);
        } else if x < 0 || x >= dims[d] {
            return Err(Fail::new(
                ERR_ARG,
                format!(
                    "coordinate {x} is outside dimension {d} of extent {}",
                    dims[d]
                ),
            ));
        }
        r = r * dims[d] + x;
    }
    Ok(r)
}

/// Makes a communicator of the first `n` ranks of `comm` carrying `topo`.
fn with_topo(comm: Handle, n: c_int, topo: Topo) -> R<Handle> {
    let c = state::intra(comm)?;
    if n > c.comm.size() {
        return Err(Fail::arg(format!(
            "the topology has {n} nodes, the communicator {}",
            c.comm.size()
        )));
    }
    let col = if c.comm.rank() < n {
        Color::with_value(0)
    } else {
        Color::undefined()
    };
    match c.comm.split_by_color_with_key(col, c.comm.rank()) {
        Some(s) => {
            let h = crate::comm::adopt(&c, s);
            state::comm(h)?.set_topo(topo);
            Ok(h)
        }
        None => Ok(COMM_NULL),
    }
}

mpi! {
    fn MPI_Dims_create / PMPI_Dims_create(nnodes: c_int, ndims: c_int, dims: *mut c_int) {
        let d = raw::slice_mut(dims, ndims)?;
        metampi::topology::dims_create(nnodes, d)?;
        Ok(())
    }
    fn MPI_Cart_create / PMPI_Cart_create(comm: Handle, ndims: c_int, dims: *const c_int, periods: *const c_int, _reorder: c_int, new: *mut Handle) {
        let d = raw::slice(dims, ndims)?.to_vec();
        if d.iter().any(|&x| x <= 0) {
            return Err(Fail::new(ERR_DIMS, format!("dimensions {d:?} must all be positive")));
        }
        let p: Vec<bool> = raw::slice(periods, ndims)?.iter().map(|&x| x != 0).collect();
        let n = d.iter().product();
        raw::put(new, with_topo(comm, n, Topo::Cart { dims: d, periods: p })?)
    }
    fn MPI_Cart_map / PMPI_Cart_map(comm: Handle, ndims: c_int, dims: *const c_int, _periods: *const c_int, newrank: *mut c_int) {
        let c = state::comm(comm)?;
        let n: c_int = raw::slice(dims, ndims)?.iter().product();
        raw::put(newrank, if c.comm.rank() < n { c.comm.rank() } else { UNDEFINED })
    }
    fn MPI_Topo_test / PMPI_Topo_test(comm: Handle, status: *mut c_int) {
        let c = state::comm(comm)?;
        raw::put(status, match c.topo() {
            Topo::None => UNDEFINED,
            Topo::Cart { .. } => CART,
            Topo::Graph { .. } => GRAPH,
            Topo::DistGraph { .. } => DIST_GRAPH,
        })
    }
    fn MPI_Cartdim_get / PMPI_Cartdim_get(comm: Handle, ndims: *mut c_int) {
        let c = state::comm(comm)?;
        raw::put(ndims, cart(&c)?.0.len() as c_int)
    }
    fn MPI_Cart_get / PMPI_Cart_get(comm: Handle, maxdims: c_int, dims: *mut c_int, periods: *mut c_int, coords: *mut c_int) {
        let c = state::comm(comm)?;
        let (d, p) = cart(&c)?;
        let n = d.len().min(maxdims.max(0) as usize) as c_int;
        let co = coords_of(&d, c.comm.rank());
        raw::slice_mut(dims, n)?.copy_from_slice(&d[..n as usize]);
        for (o, &x) in raw::slice_mut(periods, n)?.iter_mut().zip(&p) {
            *o = x as c_int;
        }
        raw::slice_mut(coords, n)?.copy_from_slice(&co[..n as usize]);
        Ok(())
    }
    fn MPI_Cart_rank / PMPI_Cart_rank(comm: Handle, coords: *const c_int, rank: *mut c_int) {
        let c = state::comm(comm)?;
        let (d, p) = cart(&c)?;
        raw::put(rank, rank_of(&d, &p, raw::slice(coords, d.len() as c_int)?)?)
    }
    fn MPI_Cart_coords / PMPI_Cart_coords(comm: Handle, rank: c_int, maxdims: c_int, coords: *mut c_int) {
        let c = state::comm(comm)?;
        let (d, _) = cart(&c)?;
        if rank < 0 || rank >= c.comm.size() {
            return Err(Fail::new(ERR_RANK, format!("rank {rank} is not in the grid")));
        }
        let co = coords_of(&d, rank);
        let n = d.len().min(maxdims.max(0) as usize);
        raw::slice_mut(coords, n as c_int)?.copy_from_slice(&co[..n]);
        Ok(())
    }
    fn MPI_Cart_shift / PMPI_Cart_shift(comm: Handle, dir: c_int, disp: c_int, src: *mut c_int, dst: *mut c_int) {
        let c = state::comm(comm)?;
        let (d, p) = cart(&c)?;
        if dir < 0 || dir as usize >= d.len() {
            return Err(Fail::new(ERR_DIMS, format!("direction {dir} is not a dimension of the grid")));
        }
        let me = coords_of(&d, c.comm.rank());
        let at = |delta: c_int| {
            let mut co = me.clone();
            co[dir as usize] += delta;
            rank_of(&d, &p, &co).unwrap_or(PROC_NULL)
        };
        raw::put(src, at(-disp))?;
        raw::put(dst, at(disp))
    }
    fn MPI_Cart_sub / PMPI_Cart_sub(comm: Handle, remain: *const c_int, new: *mut Handle) {
        let c = state::comm(comm)?;
        let (d, p) = cart(&c)?;
        let keep: Vec<bool> = raw::slice(remain, d.len() as c_int)?.iter().map(|&x| x != 0).collect();
        let me = coords_of(&d, c.comm.rank());
        let mut color = 0;
        for k in 0..d.len() {
            if !keep[k] {
                color = color * d[k] + me[k];
            }
        }
        let s = c.comm
            .split_by_color_with_key(Color::with_value(color), c.comm.rank())
            .ok_or_else(|| Fail::new(ERR_INTERN, "a Cartesian sub-grid left this rank out"))?;
        let h = crate::comm::adopt(&c, s);
        let dims: Vec<c_int> = (0..d.len()).filter(|&k| keep[k]).map(|k| d[k]).collect();
        let periods: Vec<bool> = (0..d.len()).filter(|&k| keep[k]).map(|k| p[k]).collect();
        state::comm(h)?.set_topo(Topo::Cart { dims, periods });
        raw::put(new, h)
    }
    fn MPI_Graph_create / PMPI_Graph_create(comm: Handle, nnodes: c_int, index: *const c_int, edges: *const c_int, _reorder: c_int, new: *mut Handle) {
        let idx = raw::slice(index, nnodes)?.to_vec();
        let ne = idx.last().copied().unwrap_or(0);
        let e = raw::slice(edges, ne)?.to_vec();
        if e.iter().any(|&x| x < 0 || x >= nnodes) {
            return Err(Fail::new(ERR_TOPOLOGY, "an edge names a node outside the graph"));
        }
        raw::put(new, with_topo(comm, nnodes, Topo::Graph { index: idx, edges: e })?)
    }
    fn MPI_Graphdims_get / PMPI_Graphdims_get(comm: Handle, nnodes: *mut c_int, nedges: *mut c_int) {
        let c = state::comm(comm)?;
        let Topo::Graph { index, edges } = c.topo() else {
            return Err(Fail::new(ERR_TOPOLOGY, "the communicator has no graph topology"));
        };
        raw::put(nnodes, index.len() as c_int)?;
        raw::put(nedges, edges.len() as c_int)
    }
    fn MPI_Graph_get / PMPI_Graph_get(comm: Handle, maxindex: c_int, maxedges: c_int, index: *mut c_int, edges: *mut c_int) {
        let c = state::comm(comm)?;
        let Topo::Graph { index: i, edges: e } = c.topo() else {
            return Err(Fail::new(ERR_TOPOLOGY, "the communicator has no graph topology"));
        };
        let ni = i.len().min(maxindex.max(0) as usize);
        let ne = e.len().min(maxedges.max(0) as usize);
        raw::slice_mut(index, ni as c_int)?.copy_from_slice(&i[..ni]);
        raw::slice_mut(edges, ne as c_int)?.copy_from_slice(&e[..ne]);
        Ok(())
    }
    fn MPI_Graph_neighbors_count / PMPI_Graph_neighbors_count(comm: Handle, rank: c_int, n: *mut c_int) {
        let c = state::comm(comm)?;
        raw::put(n, graph_neighbors(&c, rank)?.len() as c_int)
    }
    fn MPI_Graph_neighbors / PMPI_Graph_neighbors(comm: Handle, rank: c_int, max: c_int, out: *mut c_int) {
        let c = state::comm(comm)?;
        let nb = graph_neighbors(&c, rank)?;
        let n = nb.len().min(max.max(0) as usize);
        raw::slice_mut(out, n as c_int)?.copy_from_slice(&nb[..n]);
        Ok(())
    }
    fn MPI_Graph_map / PMPI_Graph_map(comm: Handle, nnodes: c_int, _index: *const c_int, _edges: *const c_int, newrank: *mut c_int) {
        let c = state::comm(comm)?;
        raw::put(newrank, if c.comm.rank() < nnodes { c.comm.rank() } else { UNDEFINED })
    }
    fn MPI_Dist_graph_create_adjacent / PMPI_Dist_graph_create_adjacent(comm: Handle, indeg: c_int, sources: *const c_int, sweights: *const c_int,
        outdeg: c_int, dests: *const c_int, dweights: *const c_int, _info: Handle, _reorder: c_int, new: *mut Handle) {
        let c = state::comm(comm)?;
        let weighted = !unweighted(sweights) && !unweighted(dweights);
        let topo = Topo::DistGraph {
            sources: raw::slice(sources, indeg)?.to_vec(),
            sweights: if weighted { weights(sweights, indeg)? } else { vec![1; indeg.max(0) as usize] },
            dests: raw::slice(dests, outdeg)?.to_vec(),
            dweights: if weighted { weights(dweights, outdeg)? } else { vec![1; outdeg.max(0) as usize] },
            weighted,
        };
        raw::put(new, with_topo(comm, c.comm.size(), topo)?)
    }
    fn MPI_Dist_graph_create / PMPI_Dist_graph_create(comm: Handle, n: c_int, sources: *const c_int, degrees: *const c_int,
        dests: *const c_int, weights: *const c_int, _info: Handle, _reorder: c_int, new: *mut Handle) {
        let c = state::comm(comm)?;
        let src = raw::slice(sources, n)?;
        let deg = raw::slice(degrees, n)?;
        let total: c_int = deg.iter().sum();
        let dst = raw::slice(dests, total)?;
        let weighted = !unweighted(weights);
        let w = if weighted { self::weights(weights, total)? } else { vec![1; total.max(0) as usize] };
        // Every edge as (source, destination, weight), gathered everywhere.
        let mut mine = Vec::with_capacity(3 * total.max(0) as usize);
        let mut k = 0;
        for (i, &s) in src.iter().enumerate() {
            for _ in 0..deg[i] {
                mine.extend_from_slice(&[s, dst[k], w[k]]);
                k += 1;
            }
        }
        let size = c.comm.size() as usize;
        let mut counts = vec![0 as c_int; size];
        c.comm.try_all_gather_into(&(mine.len() as c_int), &mut counts[..])?;
        let displs: Vec<c_int> = counts.iter().scan(0, |a, &x| { let d = *a; *a += x; Some(d) }).collect();
        let mut all = vec![0 as c_int; counts.iter().sum::<c_int>() as usize];
        {
            let mut part = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            c.comm.try_all_gather_varcount_into(&mine[..], &mut part)?;
        }
        let me = c.comm.rank();
        let (mut s, mut sw, mut d, mut dw) = (vec![], vec![], vec![], vec![]);
        for e in all.chunks_exact(3) {
            if e[1] == me {
                s.push(e[0]);
                sw.push(e[2]);
            }
            if e[0] == me {
                d.push(e[1]);
                dw.push(e[2]);
            }
        }
        let topo = Topo::DistGraph { sources: s, sweights: sw, dests: d, dweights: dw, weighted };
        raw::put(new, with_topo(comm, c.comm.size(), topo)?)
    }
    fn MPI_Dist_graph_neighbors_count / PMPI_Dist_graph_neighbors_count(comm: Handle, indeg: *mut c_int, outdeg: *mut c_int, weighted: *mut c_int) {
        let c = state::comm(comm)?;
        let (s, _, d, _, w) = dist_graph(&c)?;
        raw::put(indeg, s.len() as c_int)?;
        raw::put(outdeg, d.len() as c_int)?;
        raw::put(weighted, w as c_int)
    }
    fn MPI_Dist_graph_neighbors / PMPI_Dist_graph_neighbors(comm: Handle, maxin: c_int, sources: *mut c_int, sweights: *mut c_int,
        maxout: c_int, dests: *mut c_int, dweights: *mut c_int) {
        let c = state::comm(comm)?;
        let (s, sw, d, dw, _) = dist_graph(&c)?;
        let ni = s.len().min(maxin.max(0) as usize);
        let no = d.len().min(maxout.max(0) as usize);
        raw::slice_mut(sources, ni as c_int)?.copy_from_slice(&s[..ni]);
        raw::slice_mut(dests, no as c_int)?.copy_from_slice(&d[..no]);
        if !unweighted(sweights) && !weights_empty(sweights) && !sweights.is_null() {
            raw::slice_mut(sweights, ni as c_int)?.copy_from_slice(&sw[..ni]);
        }
        if !unweighted(dweights) && !weights_empty(dweights) && !dweights.is_null() {
            raw::slice_mut(dweights, no as c_int)?.copy_from_slice(&dw[..no]);
        }
        Ok(())
    }
}

type DistGraph = (Vec<c_int>, Vec<c_int>, Vec<c_int>, Vec<c_int>, bool);

fn dist_graph(c: &CommEntry) -> R<DistGraph> {
    match c.topo() {
        Topo::DistGraph {
            sources,
            sweights,
            dests,
            dweights,
            weighted,
        } => Ok((sources, sweights, dests, dweights, weighted)),
        _ => Err(Fail::new(
            ERR_TOPOLOGY,
            "the communicator has no distributed graph topology",
        )),
    }
}

fn graph_neighbors(c: &CommEntry, rank: c_int) -> R<Vec<c_int>> {
    let Topo::Graph { index, edges } = c.topo() else {
        return Err(Fail::new(
            ERR_TOPOLOGY,
            "the communicator has no graph topology",
        ));
    };
    if rank < 0 || rank as usize >= index.len() {
        return Err(Fail::new(
            ERR_RANK,
            format!("rank {rank} is not a node of the graph"),
        ));
    }
    let lo = if rank == 0 {
        0
    } else {
        index[rank as usize - 1]
    } as usize;
    let hi = index[rank as usize] as usize;
    Ok(edges[lo..hi].to_vec())
}

/// The neighbours a neighbourhood collective sends to and receives from, in order.
pub fn neighbors(c: &CommEntry) -> R<(Vec<c_int>, Vec<c_int>)> {
    match c.topo() {
        Topo::Cart { dims, periods } => {
            let me = coords_of(&dims, c.comm.rank());
            let mut out = Vec::new();
            for d in 0..dims.len() {
                for delta in [-1, 1] {
                    let mut co = me.clone();
                    co[d] += delta;
                    out.push(rank_of(&dims, &periods, &co).unwrap_or(PROC_NULL));
                }
            }
            Ok((out.clone(), out))
        }
        Topo::Graph { .. } => {
            let nb = graph_neighbors(c, c.comm.rank())?;
            Ok((nb.clone(), nb))
        }
        Topo::DistGraph { sources, dests, .. } => Ok((sources, dests)),
        Topo::None => Err(Fail::new(ERR_TOPOLOGY, "the communicator has no topology")),
    }
}
