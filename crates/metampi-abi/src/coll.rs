//! Collective operations (MPI-4 §6): blocking and nonblocking, fixed and
//! varying counts, `MPI_IN_PLACE`, predefined and user reductions. They run
//! the engine's collectives (hierarchical across sites and machines, on a
//! context of their own), the ones the Rust API runs.
//!
//! Nonblocking forms the engine has no schedule for (`MPI_Ireduce_scatter`,
//! `MPI_Ialltoallw`, neighbourhood ones) complete inside the call and return a
//! finished request.

use std::any::Any;
use std::ffi::{c_int, c_void};

use metampi::collective::{CommunicatorCollectives, Root, SystemOperation, UserOperation};
use metampi::datatype::abi as dtabi;
use metampi::datatype::{Partition, PartitionMut};
use metampi::topology::Communicator;

use crate::consts::*;
use crate::err::{Fail, R};
use crate::inter::remote_size;
use crate::neighbor::{placed, row, typed};
use crate::raw::{self, CScope, Kept, Temp};
use crate::req;
use crate::state::{self, CommEntry};
use crate::types::{self, COp};

/// A reduction as a collective call uses it.
enum OpRef {
    Sys(SystemOperation),
    User(Box<UserOperation<'static>>),
}

fn op_for(op: Handle, dt: Handle) -> R<OpRef> {
    Ok(match types::op(op)? {
        COp::Sys(s) => OpRef::Sys(s),
        COp::User { f, commute } => OpRef::User(Box::new(types::user_op(f, commute, dt))),
    })
}

/// Runs `$e` with `$o` bound to the operation as the engine takes it.
macro_rules! with_op {
    ($op:expr, $o:ident => $e:expr) => {
        match &$op {
            OpRef::Sys(s) => {
                let $o = *s;
                $e
            }
            OpRef::User(u) => {
                let $o = &**u;
                $e
            }
        }
    };
}

/// What a nonblocking collective keeps alive until it completes.
fn keep_op(op: OpRef) -> Vec<Box<dyn Any + Send>> {
    match op {
        OpRef::Sys(_) => Vec::new(),
        OpRef::User(u) => vec![Box::new(Kept(u))],
    }
}

pub(crate) fn temp_copy(p: *const c_void, count: usize, dt: Handle) -> R<Temp> {
    let l = dtabi::layout(types::type_id_any(dt)?);
    let span = if count == 0 {
        0
    } else {
        (count - 1) * l.extent + l.true_extent
    };
    let mut mem = vec![0u128; span.div_ceil(16).max(1)];
    let from = raw::offset(p, l.true_lb);
    raw::copy_bytes(from, mem.as_mut_ptr() as *mut c_void, span);
    let base = raw::offset(mem.as_ptr() as *const c_void, -l.true_lb);
    Ok(Temp { _mem: mem, base })
}

/// The send buffer of a reduction: `sbuf`, or for `MPI_IN_PLACE` a copy of the `n`
/// elements in `rbuf` (kept in `keep` until the operation completes).
fn send_side(
    sbuf: *const c_void,
    rbuf: *const c_void,
    n: usize,
    dt: Handle,
    keep: &mut Vec<Box<dyn Any + Send>>,
) -> R<*const c_void> {
    if !raw::in_place(sbuf) {
        return Ok(sbuf);
    }
    let t = temp_copy(rbuf, n, dt)?;
    let p = t.base;
    keep.push(Box::new(t));
    Ok(p)
}

fn ucount(n: c_int, what: &str) -> R<usize> {
    if n < 0 {
        return Err(Fail::new(ERR_COUNT, format!("{what} {n} is negative")));
    }
    Ok(n as usize)
}

pub(crate) fn check_root(c: &CommEntry, root: c_int) -> R {
    if root < 0 || root >= c.comm.size() {
        return Err(Fail::new(
            ERR_ROOT,
            format!(
                "root {root} is not a rank of a communicator of {}",
                c.comm.size()
            ),
        ));
    }
    Ok(())
}

pub(crate) fn extent(dt: Handle) -> R<isize> {
    Ok(dtabi::layout(types::type_id_any(dt)?).extent as isize)
}

/// Elements a varcount buffer spans.
fn span(counts: &[c_int], displs: &[c_int]) -> R<c_int> {
    let mut hi = 0;
    for (&c, &d) in counts.iter().zip(displs) {
        if c < 0 || d < 0 {
            return Err(Fail::new(
                ERR_COUNT,
                format!("count {c} or displacement {d} is negative"),
            ));
        }
        hi = hi.max(c + d);
    }
    Ok(hi)
}

/// Either blocking (`req` null) or the request made into a handle.
pub(crate) fn deliver(
    req: *mut Handle,
    r: Option<(metampi::request::abi::RawRequest, Vec<Box<dyn Any + Send>>)>,
) -> R {
    match r {
        Some((r, keep)) if !req.is_null() => raw::put(req, req::live(r, keep)),
        Some((r, keep)) => {
            let out = r.try_wait();
            drop(keep);
            out.map(|_| ()).map_err(Fail::from)
        }
        None if !req.is_null() => raw::put(req, req::done(req::St::EMPTY)),
        None => Ok(()),
    }
}

// ---- the operations, each once for blocking (`req` null) and nonblocking ----------

pub(crate) fn barrier(comm: Handle, rq: *mut Handle) -> R {
    if let Some(c) = state::as_inter(comm)? {
        return crate::inter::barrier(&c, rq);
    }
    let c = state::intra(comm)?;
    if rq.is_null() {
        return Ok(c.comm.try_barrier()?);
    }
    let r = c.comm.immediate_barrier();
    raw::put(rq, req::live(r, Vec::new()))
}

pub(crate) fn bcast(
    buf: *mut c_void,
    count: c_int,
    dt: Handle,
    root: c_int,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        return crate::inter::bcast(&c, buf, count, dt, root, rq);
    }
    let c = state::intra(comm)?;
    check_root(&c, root)?;
    let mut b = types::buf(buf, count, dt)?;
    let p = c.comm.process_at_rank(root);
    if rq.is_null() {
        return Ok(p.try_broadcast_into(&mut b)?);
    }
    let r = p.immediate_broadcast_into(CScope, &mut b);
    deliver(rq, Some((raw::detach(r), Vec::new())))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: Handle,
    op: Handle,
    root: c_int,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        return crate::inter::reduce(&c, sbuf, rbuf, count, dt, op, root, rq);
    }
    let c = state::intra(comm)?;
    check_root(&c, root)?;
    let n = ucount(count, "count")?;
    let o = op_for(op, dt)?;
    let me = c.comm.rank() == root;
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let sbuf = match me {
        true => send_side(sbuf, rbuf, n, dt, &mut keep)?,
        false => sbuf,
    };
    let s = types::buf(sbuf, count, dt)?;
    let p = c.comm.process_at_rank(root);
    if rq.is_null() {
        if me {
            let mut r = types::buf(rbuf, count, dt)?;
            with_op!(o, x => p.try_reduce_into_root(&s, &mut r, x))?;
        } else {
            with_op!(o, x => p.try_reduce_into(&s, x))?;
        }
        return Ok(());
    }
    let r = if me {
        let mut r = types::buf(rbuf, count, dt)?;
        with_op!(o, x => raw::detach(p.immediate_reduce_into_root(CScope, &s, &mut r, x)))
    } else {
        with_op!(o, x => raw::detach(p.immediate_reduce_into(CScope, &s, x)))
    };
    keep.extend(keep_op(o));
    deliver(rq, Some((r, keep)))
}

/// The reductions whose every rank gets a result of `count` elements.
#[derive(Clone, Copy)]
pub(crate) enum Elementwise {
    All,
    Scan,
    Exscan,
}

pub(crate) fn elementwise(
    kind: Elementwise,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: Handle,
    op: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let (Elementwise::All, Some(c)) = (kind, state::as_inter(comm)?) {
        return crate::inter::allreduce(&c, sbuf, rbuf, count, dt, op, rq);
    }
    let c = state::intra(comm)?;
    let n = ucount(count, "count")?;
    let o = op_for(op, dt)?;
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let sbuf = send_side(sbuf, rbuf, n, dt, &mut keep)?;
    let s = types::buf(sbuf, count, dt)?;
    let mut r = types::buf(rbuf, count, dt)?;
    let cm = &c.comm;
    if rq.is_null() {
        return Ok(match kind {
            Elementwise::All => with_op!(o, x => cm.try_all_reduce_into(&s, &mut r, x)),
            Elementwise::Scan => with_op!(o, x => cm.try_scan_into(&s, &mut r, x)),
            Elementwise::Exscan => with_op!(o, x => cm.try_exclusive_scan_into(&s, &mut r, x)),
        }?);
    }
    let h = match kind {
        Elementwise::All => {
            with_op!(o, x => raw::detach(cm.immediate_all_reduce_into(CScope, &s, &mut r, x)))
        }
        Elementwise::Scan => {
            with_op!(o, x => raw::detach(cm.immediate_scan_into(CScope, &s, &mut r, x)))
        }
        Elementwise::Exscan => {
            with_op!(o, x => raw::detach(cm.immediate_exclusive_scan_into(CScope, &s, &mut r, x)))
        }
    };
    keep.extend(keep_op(o));
    deliver(rq, Some((h, keep)))
}

pub(crate) fn reduce_scatter_block(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: Handle,
    op: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let counts = vec![count; c.comm.size() as usize];
        crate::inter::reduce_scatter(&c, sbuf, rbuf, &counts, dt, op)?;
        return match rq.is_null() {
            true => Ok(()),
            false => deliver(rq, None),
        };
    }
    let c = state::intra(comm)?;
    let n = ucount(count, "count")?;
    let size = c.comm.size() as usize;
    let o = op_for(op, dt)?;
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let sbuf = send_side(sbuf, rbuf, n * size, dt, &mut keep)?;
    let s = types::buf(sbuf, count * size as c_int, dt)?;
    let mut r = types::buf(rbuf, count, dt)?;
    if rq.is_null() {
        return Ok(with_op!(o, x => c.comm.try_reduce_scatter_block_into(&s, &mut r, x))?);
    }
    let h = with_op!(o, x => raw::detach(c.comm.immediate_reduce_scatter_block_into(CScope, &s, &mut r, x)));
    keep.extend(keep_op(o));
    deliver(rq, Some((h, keep)))
}

/// `MPI_Reduce_scatter`: a reduction to rank 0 and a scatter of the blocks (on an
/// intercommunicator, `inter::reduce_scatter`).
pub(crate) fn reduce_scatter(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    counts: *const c_int,
    dt: Handle,
    op: Handle,
    comm: Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let cs = raw::slice(counts, c.comm.size())?.to_vec();
        return crate::inter::reduce_scatter(&c, sbuf, rbuf, &cs, dt, op);
    }
    let c = state::intra(comm)?;
    let size = c.comm.size();
    let cs = raw::slice(counts, size)?.to_vec();
    let total: c_int = cs.iter().sum();
    let me = c.comm.rank() as usize;
    let ext = extent(dt)?;
    let full = temp_copy(
        if raw::in_place(sbuf) { rbuf } else { sbuf },
        ucount(total, "total count")?,
        dt,
    )?;
    let mut out = vec![0u128; ((total.max(0) as isize * ext) as usize).div_ceil(16).max(1)];
    reduce(
        full.base,
        out.as_mut_ptr() as *mut c_void,
        total,
        dt,
        op,
        0,
        comm,
        std::ptr::null_mut(),
    )?;
    let displs: Vec<c_int> = cs
        .iter()
        .scan(0, |a, &x| {
            let d = *a;
            *a += x;
            Some(d)
        })
        .collect();
    let sendv = types::buf(out.as_ptr() as *const c_void, total, dt)?;
    let mut r = types::buf(rbuf, cs[me], dt)?;
    let p = c.comm.process_at_rank(0);
    if me == 0 {
        let part = Partition::new(&sendv, &cs[..], &displs[..]);
        p.try_scatter_varcount_into_root(&part, &mut r)?;
    } else {
        p.try_scatter_varcount_into(&mut r)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn gather(
    sbuf: *const c_void,
    scount: c_int,
    sdt: Handle,
    rbuf: *mut c_void,
    rcount: c_int,
    rdt: Handle,
    root: c_int,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let blocks = match root {
            ROOT => row(rbuf, rcount, rdt, remote_size(&c) as usize)?,
            _ => Vec::new(),
        };
        return crate::inter::gather(&c, (sbuf, scount, sdt), root, blocks, rq);
    }
    let c = state::intra(comm)?;
    check_root(&c, root)?;
    let me = c.comm.rank() == root;
    let size = c.comm.size();
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let (sbuf, scount, sdt) = if me && raw::in_place(sbuf) {
        let at = raw::offset(rbuf, root as isize * rcount as isize * extent(rdt)?);
        let t = temp_copy(at, ucount(rcount, "count")?, rdt)?;
        let p = t.base;
        keep.push(Box::new(t));
        (p, rcount, rdt)
    } else {
        (sbuf, scount, sdt)
    };
    let s = types::buf(sbuf, scount, sdt)?;
    let p = c.comm.process_at_rank(root);
    let r = if me {
        let mut r = types::buf(rbuf, rcount * size, rdt)?;
        if rq.is_null() {
            return Ok(p.try_gather_into_root(&s, &mut r)?);
        }
        raw::detach(p.immediate_gather_into_root(CScope, &s, &mut r))
    } else {
        if rq.is_null() {
            return Ok(p.try_gather_into(&s)?);
        }
        raw::detach(p.immediate_gather_into(CScope, &s))
    };
    deliver(rq, Some((r, keep)))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn gatherv(
    sbuf: *const c_void,
    scount: c_int,
    sdt: Handle,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rdt: Handle,
    root: c_int,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let n = if root == ROOT { remote_size(&c) } else { 0 };
        let (rc, ds) = (raw::slice(rcounts, n)?, raw::slice(displs, n)?);
        let blocks = match root {
            ROOT => placed(rbuf, rc, ds, rdt)?,
            _ => Vec::new(),
        };
        return crate::inter::gather(&c, (sbuf, scount, sdt), root, blocks, rq);
    }
    let c = state::intra(comm)?;
    check_root(&c, root)?;
    let me = c.comm.rank() == root;
    let size = c.comm.size();
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let p = c.comm.process_at_rank(root);
    if !me {
        let s = types::buf(sbuf, scount, sdt)?;
        if rq.is_null() {
            return Ok(p.try_gather_varcount_into(&s)?);
        }
        return deliver(
            rq,
            Some((
                raw::detach(p.immediate_gather_varcount_into(CScope, &s)),
                keep,
            )),
        );
    }
    let cs = raw::slice(rcounts, size)?.to_vec();
    let ds = raw::slice(displs, size)?.to_vec();
    let (sbuf, scount, sdt) = if raw::in_place(sbuf) {
        let r = root as usize;
        let at = raw::offset(rbuf, ds[r] as isize * extent(rdt)?);
        let t = temp_copy(at, ucount(cs[r], "count")?, rdt)?;
        let p = t.base;
        keep.push(Box::new(t));
        (p, cs[r], rdt)
    } else {
        (sbuf, scount, sdt)
    };
    let s = types::buf(sbuf, scount, sdt)?;
    let mut r = types::buf(rbuf, span(&cs, &ds)?, rdt)?;
    let mut part = PartitionMut::new(&mut r, cs, ds);
    if rq.is_null() {
        return Ok(p.try_gather_varcount_into_root(&s, &mut part)?);
    }
    deliver(
        rq,
        Some((
            raw::detach(p.immediate_gather_varcount_into_root(CScope, &s, &mut part)),
            keep,
        )),
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter(
    sbuf: *const c_void,
    scount: c_int,
    sdt: Handle,
    rbuf: *mut c_void,
    rcount: c_int,
    rdt: Handle,
    root: c_int,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let blocks = match root {
            ROOT => row(sbuf, scount, sdt, remote_size(&c) as usize)?,
            _ => Vec::new(),
        };
        return crate::inter::scatter(&c, (rbuf, rcount, rdt), root, blocks, rq);
    }
    let c = state::intra(comm)?;
    check_root(&c, root)?;
    let me = c.comm.rank() == root;
    let size = c.comm.size();
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let p = c.comm.process_at_rank(root);
    let (rbuf, rcount, rdt) = if me && raw::in_place(rbuf) {
        // The root's block stays where it is: receive it into scratch.
        let t = temp_copy(
            raw::offset(sbuf, root as isize * scount as isize * extent(sdt)?),
            ucount(scount, "count")?,
            sdt,
        )?;
        let p = t.base as *mut c_void;
        keep.push(Box::new(t));
        (p, scount, sdt)
    } else {
        (rbuf, rcount, rdt)
    };
    let mut r = types::buf(rbuf, rcount, rdt)?;
    let h = if me {
        let s = types::buf(sbuf, scount * size, sdt)?;
        if rq.is_null() {
            return Ok(p.try_scatter_into_root(&s, &mut r)?);
        }
        raw::detach(p.immediate_scatter_into_root(CScope, &s, &mut r))
    } else {
        if rq.is_null() {
            return Ok(p.try_scatter_into(&mut r)?);
        }
        raw::detach(p.immediate_scatter_into(CScope, &mut r))
    };
    deliver(rq, Some((h, keep)))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn scatterv(
    sbuf: *const c_void,
    scounts: *const c_int,
    displs: *const c_int,
    sdt: Handle,
    rbuf: *mut c_void,
    rcount: c_int,
    rdt: Handle,
    root: c_int,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let n = if root == ROOT { remote_size(&c) } else { 0 };
        let (sc, ds) = (raw::slice(scounts, n)?, raw::slice(displs, n)?);
        let blocks = match root {
            ROOT => placed(sbuf, sc, ds, sdt)?,
            _ => Vec::new(),
        };
        return crate::inter::scatter(&c, (rbuf, rcount, rdt), root, blocks, rq);
    }
    let c = state::intra(comm)?;
    check_root(&c, root)?;
    let me = c.comm.rank() == root;
    let size = c.comm.size();
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let p = c.comm.process_at_rank(root);
    if !me {
        let mut r = types::buf(rbuf, rcount, rdt)?;
        if rq.is_null() {
            return Ok(p.try_scatter_varcount_into(&mut r)?);
        }
        return deliver(
            rq,
            Some((
                raw::detach(p.immediate_scatter_varcount_into(CScope, &mut r)),
                keep,
            )),
        );
    }
    let cs = raw::slice(scounts, size)?.to_vec();
    let ds = raw::slice(displs, size)?.to_vec();
    let (rbuf, rcount, rdt) = if raw::in_place(rbuf) {
        let r = root as usize;
        let t = temp_copy(
            raw::offset(sbuf, ds[r] as isize * extent(sdt)?),
            ucount(cs[r], "count")?,
            sdt,
        )?;
        let p = t.base as *mut c_void;
        keep.push(Box::new(t));
        (p, cs[r], sdt)
    } else {
        (rbuf, rcount, rdt)
    };
    let mut r = types::buf(rbuf, rcount, rdt)?;
    let s = types::buf(sbuf, span(&cs, &ds)?, sdt)?;
    let part = Partition::new(&s, cs, ds);
    if rq.is_null() {
        return Ok(p.try_scatter_varcount_into_root(&part, &mut r)?);
    }
    deliver(
        rq,
        Some((
            raw::detach(p.immediate_scatter_varcount_into_root(CScope, &part, &mut r)),
            keep,
        )),
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn allgather(
    sbuf: *const c_void,
    scount: c_int,
    sdt: Handle,
    rbuf: *mut c_void,
    rcount: c_int,
    rdt: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let n = remote_size(&c);
        let sends = vec![(sbuf, scount, sdt); n as usize];
        return crate::inter::exchange(&c, sends, row(rbuf, rcount, rdt, n as usize)?, rq);
    }
    let c = state::intra(comm)?;
    let size = c.comm.size();
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let (sbuf, scount, sdt) = if raw::in_place(sbuf) {
        let at = raw::offset(
            rbuf,
            c.comm.rank() as isize * rcount as isize * extent(rdt)?,
        );
        let t = temp_copy(at, ucount(rcount, "count")?, rdt)?;
        let p = t.base;
        keep.push(Box::new(t));
        (p, rcount, rdt)
    } else {
        (sbuf, scount, sdt)
    };
    let s = types::buf(sbuf, scount, sdt)?;
    let mut r = types::buf(rbuf, rcount * size, rdt)?;
    if rq.is_null() {
        return Ok(c.comm.try_all_gather_into(&s, &mut r)?);
    }
    deliver(
        rq,
        Some((
            raw::detach(c.comm.immediate_all_gather_into(CScope, &s, &mut r)),
            keep,
        )),
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn allgatherv(
    sbuf: *const c_void,
    scount: c_int,
    sdt: Handle,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rdt: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let n = remote_size(&c);
        let (rc, ds) = (raw::slice(rcounts, n)?, raw::slice(displs, n)?);
        let sends = vec![(sbuf, scount, sdt); n as usize];
        return crate::inter::exchange(&c, sends, placed(rbuf, rc, ds, rdt)?, rq);
    }
    let c = state::intra(comm)?;
    let size = c.comm.size();
    let cs = raw::slice(rcounts, size)?.to_vec();
    let ds = raw::slice(displs, size)?.to_vec();
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let (sbuf, scount, sdt) = if raw::in_place(sbuf) {
        let me = c.comm.rank() as usize;
        let at = raw::offset(rbuf, ds[me] as isize * extent(rdt)?);
        let t = temp_copy(at, ucount(cs[me], "count")?, rdt)?;
        let p = t.base;
        keep.push(Box::new(t));
        (p, cs[me], rdt)
    } else {
        (sbuf, scount, sdt)
    };
    let s = types::buf(sbuf, scount, sdt)?;
    let mut r = types::buf(rbuf, span(&cs, &ds)?, rdt)?;
    let mut part = PartitionMut::new(&mut r, cs, ds);
    if rq.is_null() {
        return Ok(c.comm.try_all_gather_varcount_into(&s, &mut part)?);
    }
    deliver(
        rq,
        Some((
            raw::detach(
                c.comm
                    .immediate_all_gather_varcount_into(CScope, &s, &mut part),
            ),
            keep,
        )),
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn alltoall(
    sbuf: *const c_void,
    scount: c_int,
    sdt: Handle,
    rbuf: *mut c_void,
    rcount: c_int,
    rdt: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let n = remote_size(&c);
        let (sends, recvs) = (
            row(sbuf, scount, sdt, n as usize)?,
            row(rbuf, rcount, rdt, n as usize)?,
        );
        return crate::inter::exchange(&c, sends, recvs, rq);
    }
    let c = state::intra(comm)?;
    let size = c.comm.size();
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let (sbuf, scount, sdt) = if raw::in_place(sbuf) {
        let t = temp_copy(rbuf, ucount(rcount, "count")? * size as usize, rdt)?;
        let p = t.base;
        keep.push(Box::new(t));
        (p, rcount, rdt)
    } else {
        (sbuf, scount, sdt)
    };
    let s = types::buf(sbuf, scount * size, sdt)?;
    let mut r = types::buf(rbuf, rcount * size, rdt)?;
    if rq.is_null() {
        return Ok(c.comm.try_all_to_all_into(&s, &mut r)?);
    }
    deliver(
        rq,
        Some((
            raw::detach(c.comm.immediate_all_to_all_into(CScope, &s, &mut r)),
            keep,
        )),
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn alltoallv(
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    sdt: Handle,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rdt: Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let n = remote_size(&c);
        let (sc, sd) = (raw::slice(scounts, n)?, raw::slice(sdispls, n)?);
        let (rc, rd) = (raw::slice(rcounts, n)?, raw::slice(rdispls, n)?);
        let (sends, recvs) = (placed(sbuf, sc, sd, sdt)?, placed(rbuf, rc, rd, rdt)?);
        return crate::inter::exchange(&c, sends, recvs, rq);
    }
    let c = state::intra(comm)?;
    let size = c.comm.size();
    let rc = raw::slice(rcounts, size)?.to_vec();
    let rd = raw::slice(rdispls, size)?.to_vec();
    let mut keep: Vec<Box<dyn Any + Send>> = Vec::new();
    let (sbuf, sc, sd, sdt) = if raw::in_place(sbuf) {
        let t = temp_copy(rbuf, ucount(span(&rc, &rd)?, "count")?, rdt)?;
        let p = t.base;
        keep.push(Box::new(t));
        (p, rc.clone(), rd.clone(), rdt)
    } else {
        (
            sbuf,
            raw::slice(scounts, size)?.to_vec(),
            raw::slice(sdispls, size)?.to_vec(),
            sdt,
        )
    };
    let s = types::buf(sbuf, span(&sc, &sd)?, sdt)?;
    let mut r = types::buf(rbuf, span(&rc, &rd)?, rdt)?;
    let sp = Partition::new(&s, sc, sd);
    let mut rp = PartitionMut::new(&mut r, rc, rd);
    if rq.is_null() {
        return Ok(c.comm.try_all_to_all_varcount_into(&sp, &mut rp)?);
    }
    deliver(
        rq,
        Some((
            raw::detach(
                c.comm
                    .immediate_all_to_all_varcount_into(CScope, &sp, &mut rp),
            ),
            keep,
        )),
    )
}

/// `MPI_Alltoallw`: a datatype per peer and displacements in bytes. Each block is packed,
/// the bytes go through the engine's varying-count all-to-all, and each received block is
/// unpacked with its own datatype. The nonblocking form completes inside the call.
pub(crate) fn alltoallw(
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stypes: *const Handle,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtypes: *const Handle,
    comm: Handle,
    rq: *mut Handle,
) -> R {
    if let Some(c) = state::as_inter(comm)? {
        let n = remote_size(&c);
        // Displacements are in bytes here.
        let bytes = |p: *const c_int| -> R<Vec<isize>> {
            Ok(raw::slice(p, n)?.iter().map(|&d| d as isize).collect())
        };
        let (sc, st) = (raw::slice(scounts, n)?, raw::slice(stypes, n)?);
        let (rc, rt) = (raw::slice(rcounts, n)?, raw::slice(rtypes, n)?);
        let sends = typed(sbuf, sc, &bytes(sdispls)?, st);
        let recvs = typed(rbuf, rc, &bytes(rdispls)?, rt);
        return crate::inter::exchange(&c, sends, recvs, rq);
    }
    let c = state::intra(comm)?;
    let size = c.comm.size();
    let (rc, rd, rt) = (
        raw::slice(rcounts, size)?,
        raw::slice(rdispls, size)?,
        raw::slice(rtypes, size)?,
    );
    // In place, each block goes out from where its answer will land: all are packed first.
    let (sbuf, sc, sd, st) = if raw::in_place(sbuf) {
        (rbuf as *const c_void, rc, rd, rt)
    } else {
        (
            sbuf,
            raw::slice(scounts, size)?,
            raw::slice(sdispls, size)?,
            raw::slice(stypes, size)?,
        )
    };
    let bytes = |counts: &[c_int], ts: &[Handle]| -> R<Vec<c_int>> {
        counts
            .iter()
            .zip(ts)
            .map(|(&n, &t)| {
                let b = ucount(n, "count")? * types::size_of(t)?;
                c_int::try_from(b)
                    .map_err(|_| Fail::new(ERR_COUNT, format!("a block of {b} bytes is too large")))
            })
            .collect()
    };
    let (sb, rb) = (bytes(sc, st)?, bytes(rc, rt)?);
    let offsets = |b: &[c_int]| -> Vec<c_int> {
        b.iter()
            .scan(0, |at, &n| {
                let o = *at;
                *at += n;
                Some(o)
            })
            .collect()
    };
    let (so, ro) = (offsets(&sb), offsets(&rb));
    let mut out = vec![0u8; sb.iter().map(|&n| n as usize).sum()];
    for i in 0..size as usize {
        let id = types::committed_id(st[i])?;
        let at = so[i] as usize;
        types::pack_into(
            raw::offset(sbuf, sd[i] as isize),
            sc[i] as usize,
            id,
            &mut out[at..at + sb[i] as usize],
        );
    }
    let mut inb = vec![0u8; rb.iter().map(|&n| n as usize).sum()];
    c.comm.try_all_to_all_varcount_into(
        &Partition::new(&out[..], sb, so),
        &mut PartitionMut::new(&mut inb[..], rb.clone(), ro.clone()),
    )?;
    for i in 0..size as usize {
        let id = types::committed_id(rt[i])?;
        let at = ro[i] as usize;
        types::unpack_from(
            &inb[at..at + rb[i] as usize],
            raw::offset(rbuf, rd[i] as isize),
            rc[i] as usize,
            id,
        );
    }
    deliver(rq, None)
}

mpi! {
    fn MPI_Alltoallw / PMPI_Alltoallw(s: *const c_void, scs: *const c_int, sds: *const c_int, sts: *const Handle, r: *mut c_void, rcs: *const c_int, rds: *const c_int, rts: *const Handle, comm: Handle) {
        alltoallw(s, scs, sds, sts, r, rcs, rds, rts, comm, std::ptr::null_mut())
    }
    fn MPI_Ialltoallw / PMPI_Ialltoallw(s: *const c_void, scs: *const c_int, sds: *const c_int, sts: *const Handle, r: *mut c_void, rcs: *const c_int, rds: *const c_int, rts: *const Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        alltoallw(s, scs, sds, sts, r, rcs, rds, rts, comm, rq)
    }
}

mpi! {
    fn MPI_Barrier / PMPI_Barrier(comm: Handle) { barrier(comm, std::ptr::null_mut()) }
    fn MPI_Ibarrier / PMPI_Ibarrier(comm: Handle, rq: *mut Handle) { req_out(rq)?; barrier(comm, rq) }
    fn MPI_Bcast / PMPI_Bcast(buf: *mut c_void, count: c_int, dt: Handle, root: c_int, comm: Handle) {
        bcast(buf, count, dt, root, comm, std::ptr::null_mut())
    }
    fn MPI_Ibcast / PMPI_Ibcast(buf: *mut c_void, count: c_int, dt: Handle, root: c_int, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        bcast(buf, count, dt, root, comm, rq)
    }
    fn MPI_Reduce / PMPI_Reduce(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, root: c_int, comm: Handle) {
        reduce(s, r, count, dt, op, root, comm, std::ptr::null_mut())
    }
    fn MPI_Ireduce / PMPI_Ireduce(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, root: c_int, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        reduce(s, r, count, dt, op, root, comm, rq)
    }
    fn MPI_Allreduce / PMPI_Allreduce(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle) {
        elementwise(Elementwise::All, s, r, count, dt, op, comm, std::ptr::null_mut())
    }
    fn MPI_Iallreduce / PMPI_Iallreduce(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        elementwise(Elementwise::All, s, r, count, dt, op, comm, rq)
    }
    fn MPI_Scan / PMPI_Scan(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle) {
        elementwise(Elementwise::Scan, s, r, count, dt, op, comm, std::ptr::null_mut())
    }
    fn MPI_Iscan / PMPI_Iscan(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        elementwise(Elementwise::Scan, s, r, count, dt, op, comm, rq)
    }
    fn MPI_Exscan / PMPI_Exscan(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle) {
        elementwise(Elementwise::Exscan, s, r, count, dt, op, comm, std::ptr::null_mut())
    }
    fn MPI_Iexscan / PMPI_Iexscan(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        elementwise(Elementwise::Exscan, s, r, count, dt, op, comm, rq)
    }
    fn MPI_Reduce_scatter_block / PMPI_Reduce_scatter_block(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle) {
        reduce_scatter_block(s, r, count, dt, op, comm, std::ptr::null_mut())
    }
    fn MPI_Ireduce_scatter_block / PMPI_Ireduce_scatter_block(s: *const c_void, r: *mut c_void, count: c_int, dt: Handle, op: Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        reduce_scatter_block(s, r, count, dt, op, comm, rq)
    }
    fn MPI_Reduce_scatter / PMPI_Reduce_scatter(s: *const c_void, r: *mut c_void, counts: *const c_int, dt: Handle, op: Handle, comm: Handle) {
        reduce_scatter(s, r, counts, dt, op, comm)
    }
    fn MPI_Ireduce_scatter / PMPI_Ireduce_scatter(s: *const c_void, r: *mut c_void, counts: *const c_int, dt: Handle, op: Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        reduce_scatter(s, r, counts, dt, op, comm)?;
        deliver(rq, None)
    }
    fn MPI_Reduce_local / PMPI_Reduce_local(inbuf: *const c_void, inout: *mut c_void, count: c_int, dt: Handle, op: Handle) {
        state::check_init()?;
        reduce_local(inbuf, inout, count, dt, op)
    }
    fn MPI_Gather / PMPI_Gather(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, root: c_int, comm: Handle) {
        gather(s, sc, sdt, r, rc, rdt, root, comm, std::ptr::null_mut())
    }
    fn MPI_Igather / PMPI_Igather(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, root: c_int, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        gather(s, sc, sdt, r, rc, rdt, root, comm, rq)
    }
    fn MPI_Gatherv / PMPI_Gatherv(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, ds: *const c_int, rdt: Handle, root: c_int, comm: Handle) {
        gatherv(s, sc, sdt, r, rcs, ds, rdt, root, comm, std::ptr::null_mut())
    }
    fn MPI_Igatherv / PMPI_Igatherv(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, ds: *const c_int, rdt: Handle, root: c_int, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        gatherv(s, sc, sdt, r, rcs, ds, rdt, root, comm, rq)
    }
    fn MPI_Scatter / PMPI_Scatter(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, root: c_int, comm: Handle) {
        scatter(s, sc, sdt, r, rc, rdt, root, comm, std::ptr::null_mut())
    }
    fn MPI_Iscatter / PMPI_Iscatter(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, root: c_int, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        scatter(s, sc, sdt, r, rc, rdt, root, comm, rq)
    }
    fn MPI_Scatterv / PMPI_Scatterv(s: *const c_void, scs: *const c_int, ds: *const c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, root: c_int, comm: Handle) {
        scatterv(s, scs, ds, sdt, r, rc, rdt, root, comm, std::ptr::null_mut())
    }
    fn MPI_Iscatterv / PMPI_Iscatterv(s: *const c_void, scs: *const c_int, ds: *const c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, root: c_int, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        scatterv(s, scs, ds, sdt, r, rc, rdt, root, comm, rq)
    }
    fn MPI_Allgather / PMPI_Allgather(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle) {
        allgather(s, sc, sdt, r, rc, rdt, comm, std::ptr::null_mut())
    }
    fn MPI_Iallgather / PMPI_Iallgather(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        allgather(s, sc, sdt, r, rc, rdt, comm, rq)
    }
    fn MPI_Allgatherv / PMPI_Allgatherv(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, ds: *const c_int, rdt: Handle, comm: Handle) {
        allgatherv(s, sc, sdt, r, rcs, ds, rdt, comm, std::ptr::null_mut())
    }
    fn MPI_Iallgatherv / PMPI_Iallgatherv(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, ds: *const c_int, rdt: Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        allgatherv(s, sc, sdt, r, rcs, ds, rdt, comm, rq)
    }
    fn MPI_Alltoall / PMPI_Alltoall(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle) {
        alltoall(s, sc, sdt, r, rc, rdt, comm, std::ptr::null_mut())
    }
    fn MPI_Ialltoall / PMPI_Ialltoall(s: *const c_void, sc: c_int, sdt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        alltoall(s, sc, sdt, r, rc, rdt, comm, rq)
    }
    fn MPI_Alltoallv / PMPI_Alltoallv(s: *const c_void, scs: *const c_int, sds: *const c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, rds: *const c_int, rdt: Handle, comm: Handle) {
        alltoallv(s, scs, sds, sdt, r, rcs, rds, rdt, comm, std::ptr::null_mut())
    }
    fn MPI_Ialltoallv / PMPI_Ialltoallv(s: *const c_void, scs: *const c_int, sds: *const c_int, sdt: Handle, r: *mut c_void, rcs: *const c_int, rds: *const c_int, rdt: Handle, comm: Handle, rq: *mut Handle) {
        req_out(rq)?;
        alltoallv(s, scs, sds, sdt, r, rcs, rds, rdt, comm, rq)
    }
}

/// `inout = inbuf op inout`, element by element.
pub(crate) fn reduce_local(
    inbuf: *const c_void,
    inout: *mut c_void,
    count: c_int,
    dt: Handle,
    op: Handle,
) -> R {
    let o = op_for(op, dt)?;
    let a = types::buf(inbuf, count, dt)?;
    let mut b = types::buf(inout, count, dt)?;
    with_op!(o, x => metampi::collective::try_reduce_local_into(&a, &mut b, x))?;
    Ok(())
}

/// A nonblocking call's request output must be a real pointer.
pub(crate) fn req_out(rq: *mut Handle) -> R {
    if rq.is_null() {
        return Err(Fail::arg("the request output is a null pointer"));
    }
    Ok(())
}
