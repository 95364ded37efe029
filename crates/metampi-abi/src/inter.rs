//! Collectives on intercommunicators (MPI-4 §6.2.2): data moves between the two
//! groups. They run as point-to-point messages on the intercommunicator's
//! private duplicate (made with it, a collective moment), so they never match
//! the program's messages. Every process talks to each process of the other
//! group directly: these are the plain algorithms, correct at any size.
//!
//! Rooted operations name the root as MPI does: `MPI_ROOT` at the root,
//! `MPI_PROC_NULL` at the other members of its group, and the root's rank in
//! the remote group at the members of the other group. Reductions combine the
//! other group's contributions in rank order; they and the other nonblocking
//! forms with a reduction complete inside the call.

use std::ffi::{c_int, c_void};

use metampi::point_to_point::{Destination, Mode, Source};
use metampi::topology::{Communicator, SimpleCommunicator};

use crate::consts::*;
use crate::err::{Fail, R};
use crate::neighbor::Block;
use crate::raw::{self, CScope};
use crate::req::{self, Req, St};
use crate::state::CommEntry;
use crate::types;

/// The private duplicate and the size of the remote group.
fn hidden(c: &CommEntry) -> R<(&SimpleCommunicator, c_int)> {
    let ic = c
        .inter
        .as_ref()
        .ok_or_else(|| Fail::new(ERR_COMM, "not an intercommunicator"))?;
    let nc = c
        .neigh
        .get()
        .ok_or_else(|| Fail::new(ERR_INTERN, "the intercommunicator has no private duplicate"))?;
    Ok((nc, ic.remote_size()))
}

fn recv(nc: &SimpleCommunicator, from: c_int, p: *mut c_void, n: c_int, dt: Handle) -> R<Req> {
    let mut b = types::buf(p, n, dt)?;
    let r = nc
        .process_at_rank(from)
        .try_immediate_receive_into(CScope, &mut b, Some(0))?;
    Ok(Req::Live {
        r: raw::detach(r),
        keep: Vec::new(),
    })
}

fn send(nc: &SimpleCommunicator, to: c_int, p: *const c_void, n: c_int, dt: Handle) -> R<Req> {
    let b = types::buf(p, n, dt)?;
    let r = nc
        .process_at_rank(to)
        .immediate_with_mode(CScope, &b, 0, Mode::Standard)?;
    Ok(Req::Live {
        r: raw::detach(r),
        keep: Vec::new(),
    })
}

/// Waits for `parts` (blocking, `rq` null) or makes them one request.
fn finish(parts: Vec<Req>, rq: *mut Handle) -> R {
    let r = Req::Multi {
        parts: parts.into_iter().map(|p| (false, p)).collect(),
        st: St::EMPTY,
        fail: None,
    };
    match rq.is_null() {
        true => req::wait_now(r).map(|_| ()),
        false => raw::put(rq, req::insert(r)),
    }
}

/// What a rooted operation's `root` says this process does.
enum Part {
    /// The root: it talks to every process of the other group.
    Root,
    /// Another member of the root's group: nothing.
    Idle,
    /// A member of the other group, whose root is this remote rank.
    Leaf(c_int),
}

fn part(root: c_int, remote: c_int) -> R<Part> {
    match root {
        ROOT => Ok(Part::Root),
        PROC_NULL => Ok(Part::Idle),
        r if (0..remote).contains(&r) => Ok(Part::Leaf(r)),
        r => Err(Fail::new(
            ERR_ROOT,
            format!(
                "root {r} on an intercommunicator: MPI_ROOT, MPI_PROC_NULL or a rank of the \
                 remote group of {remote}"
            ),
        )),
    }
}

pub(crate) fn barrier(c: &CommEntry, rq: *mut Handle) -> R {
    let (nc, n) = hidden(c)?;
    let mut parts = Vec::new();
    // A process leaves once every process of the other group has entered.
    for i in 0..n {
        parts.push(recv(nc, i, std::ptr::null_mut(), 0, DATATYPE_BYTE)?);
    }
    for i in 0..n {
        parts.push(send(nc, i, std::ptr::null(), 0, DATATYPE_BYTE)?);
    }
    finish(parts, rq)
}

pub(crate) fn bcast(
    c: &CommEntry,
    buf: *mut c_void,
    count: c_int,
    dt: Handle,
    root: c_int,
    rq: *mut Handle,
) -> R {
    let (nc, n) = hidden(c)?;
    let parts = match part(root, n)? {
        Part::Root => (0..n)
            .map(|i| send(nc, i, buf, count, dt))
            .collect::<R<_>>()?,
        Part::Idle => Vec::new(),
        Part::Leaf(r) => vec![recv(nc, r, buf, count, dt)?],
    };
    finish(parts, rq)
}

/// Gather and gatherv: the root receives remote process `i`'s data into `blocks[i]`, the
/// other group's processes send `mine`.
pub(crate) fn gather(
    c: &CommEntry,
    mine: Block,
    root: c_int,
    blocks: Vec<Block>,
    rq: *mut Handle,
) -> R {
    let (nc, n) = hidden(c)?;
    let parts = match part(root, n)? {
        Part::Root => blocks
            .into_iter()
            .enumerate()
            .map(|(i, (p, k, t))| recv(nc, i as c_int, p as *mut c_void, k, t))
            .collect::<R<_>>()?,
        Part::Idle => Vec::new(),
        Part::Leaf(r) => vec![send(nc, r, mine.0, mine.1, mine.2)?],
    };
    finish(parts, rq)
}

/// Scatter and scatterv: the root sends `blocks[i]` to remote process `i`, the other
/// group's processes receive into `mine`.
pub(crate) fn scatter(
    c: &CommEntry,
    mine: (*mut c_void, c_int, Handle),
    root: c_int,
    blocks: Vec<Block>,
    rq: *mut Handle,
) -> R {
    let (nc, n) = hidden(c)?;
    let parts = match part(root, n)? {
        Part::Root => blocks
            .into_iter()
            .enumerate()
            .map(|(i, (p, k, t))| send(nc, i as c_int, p, k, t))
            .collect::<R<_>>()?,
        Part::Idle => Vec::new(),
        Part::Leaf(from) => vec![recv(nc, from, mine.0, mine.1, mine.2)?],
    };
    finish(parts, rq)
}

/// All-to-all exchanges: remote process `i` gets `sends[i]`, and its data lands at `recvs[i]`.
pub(crate) fn exchange(c: &CommEntry, sends: Vec<Block>, recvs: Vec<Block>, rq: *mut Handle) -> R {
    let (nc, _) = hidden(c)?;
    let mut parts = Vec::with_capacity(sends.len() + recvs.len());
    for (i, (p, k, t)) in recvs.into_iter().enumerate() {
        parts.push(recv(nc, i as c_int, p as *mut c_void, k, t)?);
    }
    for (i, (p, k, t)) in sends.into_iter().enumerate() {
        parts.push(send(nc, i as c_int, p, k, t)?);
    }
    finish(parts, rq)
}

/// The size of the remote group of intercommunicator `c`.
pub(crate) fn remote_size(c: &CommEntry) -> c_int {
    c.inter.as_ref().map_or(0, |ic| ic.remote_size())
}

/// The `count` elements at `r` become the reduction, in rank order, of what every
/// process of the other group sends: the last one is received in place, each earlier
/// one into a copy and combined in front.
fn reduce_from_all(
    nc: &SimpleCommunicator,
    n: c_int,
    r: *mut c_void,
    count: c_int,
    dt: Handle,
    op: Handle,
) -> R<Vec<Req>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut temps = Vec::with_capacity(n as usize - 1);
    let mut parts = Vec::with_capacity(n as usize);
    for i in 0..n - 1 {
        let t = crate::coll::temp_copy(r, count.max(0) as usize, dt)?;
        parts.push(recv(nc, i, t.base as *mut c_void, count, dt)?);
        temps.push(t);
    }
    parts.push(recv(nc, n - 1, r, count, dt)?);
    req::wait_now(Req::Multi {
        parts: parts.into_iter().map(|p| (false, p)).collect(),
        st: St::EMPTY,
        fail: None,
    })?;
    for t in temps.iter().rev() {
        crate::coll::reduce_local(t.base, r, count, dt, op)?;
    }
    Ok(Vec::new())
}

/// `MPI_Reduce_scatter` and `_block` on an intercommunicator (MPI-4 §6.9): the other group's
/// vectors, reduced, are split among this group's members by `counts` (one per member, the
/// same on all); this group's are split by the other's, which its rank 0 sends first.
pub(crate) fn reduce_scatter(
    c: &CommEntry,
    s: *const c_void,
    r: *mut c_void,
    counts: &[c_int],
    dt: Handle,
    op: Handle,
) -> R {
    let (nc, n) = hidden(c)?;
    if raw::in_place(s) {
        return Err(Fail::arg(
            "MPI_IN_PLACE is not allowed on an intercommunicator",
        ));
    }
    let me = c.comm.rank() as usize;
    let int = std::mem::size_of::<c_int>() as c_int;
    let mut sends = Vec::new();
    if me == 0 {
        for j in 0..n {
            let p = counts.as_ptr() as *const c_void;
            sends.push(send(nc, j, p, counts.len() as c_int * int, DATATYPE_BYTE)?);
        }
    }
    let mut theirs: Vec<c_int> = vec![0; n as usize];
    let p = theirs.as_mut_ptr() as *mut c_void;
    req::wait_now(recv(nc, 0, p, n * int, DATATYPE_BYTE)?)?;
    if let Some(bad) = theirs.iter().find(|&&k| k < 0) {
        return Err(Fail::new(
            ERR_COUNT,
            format!("the other group's counts include {bad}"),
        ));
    }
    let ext = crate::coll::extent(dt)?;
    let mut at = 0isize;
    for (j, &k) in theirs.iter().enumerate() {
        sends.push(send(nc, j as c_int, raw::offset(s, at * ext), k, dt)?);
        at += k as isize;
    }
    reduce_from_all(nc, n, r, counts[me], dt, op)?;
    finish(sends, std::ptr::null_mut())
}

pub(crate) fn reduce(
    c: &CommEntry,
    s: *const c_void,
    r: *mut c_void,
    count: c_int,
    dt: Handle,
    op: Handle,
    root: c_int,
    rq: *mut Handle,
) -> R {
    let (nc, n) = hidden(c)?;
    let parts = match part(root, n)? {
        Part::Root => reduce_from_all(nc, n, r, count, dt, op)?,
        Part::Idle => Vec::new(),
        Part::Leaf(to) => vec![send(nc, to, s, count, dt)?],
    };
    finish(parts, rq)
}

pub(crate) fn allreduce(
    c: &CommEntry,
    s: *const c_void,
    r: *mut c_void,
    count: c_int,
    dt: Handle,
    op: Handle,
    rq: *mut Handle,
) -> R {
    let (nc, n) = hidden(c)?;
    if raw::in_place(s) {
        return Err(Fail::arg(
            "MPI_IN_PLACE is not allowed on an intercommunicator",
        ));
    }
    // The sends go first, so the other group's reductions can complete while this one waits.
    let sends = (0..n)
        .map(|i| send(nc, i, s, count, dt))
        .collect::<R<Vec<_>>>()?;
    reduce_from_all(nc, n, r, count, dt, op)?;
    finish(sends, rq)
}
