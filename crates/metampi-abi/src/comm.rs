//! Groups and communicators (MPI-4 §7): sizes and ranks, duplication with
//! attribute copying, splits (by colour, by shared memory, by metampi site),
//! creation from groups, names, comparison, and the group algebra.

use std::collections::HashSet;
use std::ffi::{c_char, c_int};
use std::sync::atomic::Ordering;

use metampi::topology::{
    Color, Communicator, CommunicatorRelation, InterCommunicator, MergeOrder, SimpleCommunicator,
};

use crate::consts::*;
use crate::err::{Fail, R};
use crate::raw;
use crate::state::{self, group, new_group, CommEntry, WGroup, GROUPS};

/// World ranks of a communicator's group.
fn world_ranks(c: &CommEntry) -> Vec<u32> {
    let g = c.comm.group();
    metampi::topology::Group::world_ranks(&g).to_vec()
}

/// The handle of a split of intercommunicator `c` (with `c`'s error handler), or
/// `MPI_COMM_NULL` where this process got none.
fn inter_handle(c: &CommEntry, split: Option<metampi::topology::InterCommunicator>) -> Handle {
    match split {
        Some(s) => state::new_inter(s, c.errh.load(Ordering::Relaxed)),
        None => COMM_NULL,
    }
}

/// A handle for `new` (a communicator made from `old`), with `old`'s error
/// handler and, for duplicates, its attributes copied by their callbacks.
pub fn register_child(
    old: Handle,
    parent: &CommEntry,
    new: SimpleCommunicator,
    copy_attrs: bool,
) -> R<Handle> {
    let h = state::new_comm(new, parent.errh.load(Ordering::Relaxed));
    if copy_attrs {
        crate::attr::copy_all(old, parent, h)?;
        if let Ok(c) = state::comm(h) {
            c.set_topo(parent.topo());
        }
    }
    Ok(h)
}

fn relation(r: CommunicatorRelation) -> c_int {
    match r {
        CommunicatorRelation::Identical => IDENT,
        CommunicatorRelation::Congruent => CONGRUENT,
        CommunicatorRelation::Similar => SIMILAR,
        CommunicatorRelation::Unequal => UNEQUAL,
    }
}

fn group_relation(a: &[u32], b: &[u32]) -> c_int {
    if a == b {
        IDENT
    } else if a.len() == b.len()
        && a.iter().collect::<HashSet<_>>() == b.iter().collect::<HashSet<_>>()
    {
        SIMILAR
    } else {
        UNEQUAL
    }
}

fn check_group_ranks(g: &WGroup, ranks: &[c_int]) -> R {
    let mut seen = HashSet::new();
    for &r in ranks {
        if r < 0 || r as usize >= g.0.len() {
            return Err(Fail::new(
                ERR_RANK,
                format!("rank {r} is not in a group of {}", g.0.len()),
            ));
        }
        if !seen.insert(r) {
            return Err(Fail::new(ERR_RANK, format!("rank {r} is named twice")));
        }
    }
    Ok(())
}

/// The ranks of `(first, last, stride)` triplets.
fn expand_ranges(ranges: &[[c_int; 3]]) -> R<Vec<c_int>> {
    let mut out = Vec::new();
    for &[first, last, stride] in ranges {
        if stride == 0 {
            return Err(Fail::arg("a range has stride 0"));
        }
        let mut r = first;
        while (stride > 0 && r <= last) || (stride < 0 && r >= last) {
            out.push(r);
            r += stride;
        }
    }
    Ok(out)
}

mpi! {
    fn MPI_Comm_size / PMPI_Comm_size(comm: Handle, size: *mut c_int) {
        let c = state::comm(comm)?;
        raw::put(size, c.comm.size())
    }
    fn MPI_Comm_rank / PMPI_Comm_rank(comm: Handle, rank: *mut c_int) {
        let c = state::comm(comm)?;
        raw::put(rank, c.comm.rank())
    }
    fn MPI_Comm_dup / PMPI_Comm_dup(comm: Handle, new: *mut Handle) {
        raw::put(new, duplicate(comm)?)
    }
    fn MPI_Comm_dup_with_info / PMPI_Comm_dup_with_info(comm: Handle, _info: Handle, new: *mut Handle) {
        raw::put(new, duplicate(comm)?)
    }
    fn MPI_Comm_idup / PMPI_Comm_idup(comm: Handle, new: *mut Handle, req: *mut Handle) {
        // Duplication agrees on a context collectively; it completes here and the
        // request comes back complete (a program waits on it as usual).
        raw::put(new, duplicate(comm)?)?;
        raw::put(req, crate::req::done(crate::req::St::EMPTY))
    }
    fn MPI_Comm_idup_with_info / PMPI_Comm_idup_with_info(comm: Handle, _info: Handle, new: *mut Handle, req: *mut Handle) {
        raw::put(new, duplicate(comm)?)?;
        raw::put(req, crate::req::done(crate::req::St::EMPTY))
    }
    fn MPI_Comm_get_parent / PMPI_Comm_get_parent(parent: *mut Handle) {
        state::check_init()?;
        raw::put(parent, state::parent())
    }
    fn MPI_Comm_split / PMPI_Comm_split(comm: Handle, color: c_int, key: c_int, new: *mut Handle) {
        let c = state::comm(comm)?;
        if color < 0 && color != UNDEFINED {
            return Err(Fail::arg(format!("colour {color} is negative (only MPI_UNDEFINED may be)")));
        }
        let col = if color == UNDEFINED { Color::undefined() } else { Color::with_value(color) };
        if let Some(ic) = &c.inter {
            return raw::put(new, inter_handle(&c, ic.try_split_by_color_with_key(col, key)?));
        }
        let h = match c.comm.split_by_color_with_key(col, key) {
            Some(s) => register_child(comm, &c, s, false)?,
            None => COMM_NULL,
        };
        raw::put(new, h)
    }
    fn MPI_Comm_split_type / PMPI_Comm_split_type(comm: Handle, kind: c_int, key: c_int, info: Handle, new: *mut Handle) {
        let c = state::comm(comm)?;
        if let Some(ic) = &c.inter {
            // An intercommunicator's members that share a machine (or a site) with members
            // of the other group make one of their own.
            let split = match kind {
                UNDEFINED => ic.try_split_by_color_with_key(Color::undefined(), key)?,
                COMM_TYPE_SHARED => ic.try_split_shared(key)?,
                COMM_TYPE_METAMPI_SITE => {
                    let me = state::my_world_rank() as i32;
                    let site = metampi::topology::SimpleCommunicator::world().meta_host_of(me)?;
                    ic.try_split_by_color_with_key(Color::with_value(site as c_int), key)?
                }
                k => {
                    return Err(Fail::arg(format!(
                        "split type {k} on an intercommunicator: metampi splits one by \
                         MPI_COMM_TYPE_SHARED, MPI_COMM_TYPE_METAMPI_SITE or MPI_UNDEFINED"
                    )))
                }
            };
            return raw::put(new, inter_handle(&c, split));
        }
        // The hardware resource an info names: metampi knows shared memory (a machine).
        let resource = match info {
            INFO_NULL => None,
            i => crate::env::with_info(i, |i| i.0.get(HW_RESOURCE).cloned()).ok().flatten(),
        };
        let kind = match kind {
            COMM_TYPE_HW_GUIDED if resource.as_deref() != Some(SHARED_MEMORY) => UNDEFINED,
            k => k,
        };
        let s = match kind {
            UNDEFINED => {
                // Every rank takes part in the split; those with MPI_UNDEFINED get no communicator.
                let _ = c.comm.split_by_color_with_key(Color::undefined(), key);
                return raw::put(new, COMM_NULL);
            }
            COMM_TYPE_SHARED | COMM_TYPE_HW_GUIDED => c.comm.split_shared(key),
            COMM_TYPE_HW_UNGUIDED => {
                // A level of the hierarchy strictly below the communicator, or none.
                let s = c.comm.split_shared(key);
                if s.size() == c.comm.size() {
                    return raw::put(new, COMM_NULL);
                }
                if info != INFO_NULL {
                    crate::env::with_info(info, |i| {
                        i.0.insert(HW_RESOURCE.into(), SHARED_MEMORY.into())
                    })?;
                }
                s
            }
            COMM_TYPE_METAMPI_SITE => {
                let site = c.comm.meta_host_of(c.comm.rank())? as c_int;
                c.comm
                    .split_by_color_with_key(Color::with_value(site), key)
                    .ok_or_else(|| Fail::new(ERR_INTERN, "a site split left this rank out"))?
            }
            k => return Err(Fail::arg(format!("split type {k} is not one metampi knows"))),
        };
        raw::put(new, register_child(comm, &c, s, false)?)
    }
    fn MPI_Comm_create / PMPI_Comm_create(comm: Handle, grp: Handle, new: *mut Handle) {
        let c = state::intra(comm)?;
        let g = group(grp)?;
        let mine: HashSet<u32> = world_ranks(&c).into_iter().collect();
        if g.0.iter().any(|w| !mine.contains(w)) {
            return Err(Fail::new(ERR_GROUP, "the group has members outside the communicator"));
        }
        let h = match c.comm.split_by_subgroup_collective(&g) {
            Some(s) if g.0.contains(&state::my_world_rank()) => register_child(comm, &c, s, false)?,
            _ => COMM_NULL,
        };
        raw::put(new, h)
    }
    fn MPI_Comm_create_group / PMPI_Comm_create_group(comm: Handle, grp: Handle, tag: c_int, new: *mut Handle) {
        let c = state::intra(comm)?;
        let g = group(grp)?;
        let h = match c.comm.split_by_subgroup_with_tag(&g, tag) {
            Some(s) => register_child(comm, &c, s, false)?,
            None => COMM_NULL,
        };
        raw::put(new, h)
    }
    fn MPI_Comm_free / PMPI_Comm_free(comm: *mut Handle) {
        let h = raw::get(comm)?;
        if h == COMM_WORLD || h == COMM_SELF {
            return Err(Fail::new(ERR_COMM, "a predefined communicator cannot be freed"));
        }
        state::comm(h)?;
        release(h);
        raw::put(comm, COMM_NULL)
    }
    fn MPI_Comm_disconnect / PMPI_Comm_disconnect(comm: *mut Handle) {
        let h = raw::get(comm)?;
        // Every message on it is matched once all members have come here (a barrier
        // over both groups where it is an intercommunicator).
        crate::coll::barrier(h, std::ptr::null_mut())?;
        release(h);
        raw::put(comm, COMM_NULL)
    }
    fn MPI_Comm_compare / PMPI_Comm_compare(a: Handle, b: Handle, result: *mut c_int) {
        let (ca, cb) = (state::comm(a)?, state::comm(b)?);
        let r = if a == b { IDENT } else { relation(ca.comm.compare(&cb.comm)) };
        raw::put(result, r)
    }
    fn MPI_Comm_set_name / PMPI_Comm_set_name(comm: Handle, name: *const c_char) {
        let c = state::comm(comm)?;
        c.comm.set_name(&raw::c_str(name)?);
        Ok(())
    }
    fn MPI_Comm_get_name / PMPI_Comm_get_name(comm: Handle, name: *mut c_char, len: *mut c_int) {
        let c = state::comm(comm)?;
        let n = raw::put_str(name, MAX_OBJECT_NAME, &c.comm.get_name())?;
        raw::put(len, n)
    }
    fn MPI_Comm_test_inter / PMPI_Comm_test_inter(comm: Handle, flag: *mut c_int) {
        let c = state::comm(comm)?;
        raw::put(flag, c.comm.test_inter() as c_int)
    }
    fn MPI_Comm_group / PMPI_Comm_group(comm: Handle, grp: *mut Handle) {
        let c = state::comm(comm)?;
        raw::put(grp, new_group(world_ranks(&c)))
    }
    fn MPI_Comm_set_info / PMPI_Comm_set_info(comm: Handle, _info: Handle) {
        state::comm(comm).map(|_| ())
    }
    fn MPI_Comm_get_info / PMPI_Comm_get_info(comm: Handle, info: *mut Handle) {
        state::comm(comm)?;
        raw::put(info, crate::env::INFOS.insert(crate::env::Info::default()))
    }

    // ---- groups ----------------------------------------------------------------
    fn MPI_Group_size / PMPI_Group_size(grp: Handle, size: *mut c_int) {
        raw::put(size, group(grp)?.0.len() as c_int)
    }
    fn MPI_Group_rank / PMPI_Group_rank(grp: Handle, rank: *mut c_int) {
        let g = group(grp)?;
        let me = state::my_world_rank();
        raw::put(rank, g.0.iter().position(|&w| w == me).map_or(UNDEFINED, |p| p as c_int))
    }
    fn MPI_Group_translate_ranks / PMPI_Group_translate_ranks(g1: Handle, n: c_int, r1: *const c_int, g2: Handle, r2: *mut c_int) {
        let (a, b) = (group(g1)?, group(g2)?);
        let ins = raw::slice(r1, n)?;
        let outs = raw::slice_mut(r2, n)?;
        for (i, &r) in ins.iter().enumerate() {
            outs[i] = if r == PROC_NULL {
                PROC_NULL
            } else {
                let w = *a.0.get(r as usize).ok_or_else(|| Fail::new(ERR_RANK, format!("rank {r} is not in the first group")))?;
                b.0.iter().position(|&x| x == w).map_or(UNDEFINED, |p| p as c_int)
            };
        }
        Ok(())
    }
    fn MPI_Group_compare / PMPI_Group_compare(g1: Handle, g2: Handle, result: *mut c_int) {
        let (a, b) = (group(g1)?, group(g2)?);
        raw::put(result, group_relation(&a.0, &b.0))
    }
    fn MPI_Group_union / PMPI_Group_union(g1: Handle, g2: Handle, new: *mut Handle) {
        let (a, b) = (group(g1)?, group(g2)?);
        let mut v = a.0.to_vec();
        v.extend(b.0.iter().filter(|w| !a.0.contains(w)));
        raw::put(new, new_group(v))
    }
    fn MPI_Group_intersection / PMPI_Group_intersection(g1: Handle, g2: Handle, new: *mut Handle) {
        let (a, b) = (group(g1)?, group(g2)?);
        raw::put(new, new_group(a.0.iter().copied().filter(|w| b.0.contains(w)).collect()))
    }
    fn MPI_Group_difference / PMPI_Group_difference(g1: Handle, g2: Handle, new: *mut Handle) {
        let (a, b) = (group(g1)?, group(g2)?);
        raw::put(new, new_group(a.0.iter().copied().filter(|w| !b.0.contains(w)).collect()))
    }
    fn MPI_Group_incl / PMPI_Group_incl(grp: Handle, n: c_int, ranks: *const c_int, new: *mut Handle) {
        let g = group(grp)?;
        let rs = raw::slice(ranks, n)?;
        check_group_ranks(&g, rs)?;
        raw::put(new, new_group(rs.iter().map(|&r| g.0[r as usize]).collect()))
    }
    fn MPI_Group_excl / PMPI_Group_excl(grp: Handle, n: c_int, ranks: *const c_int, new: *mut Handle) {
        let g = group(grp)?;
        let rs = raw::slice(ranks, n)?;
        check_group_ranks(&g, rs)?;
        let out: HashSet<c_int> = rs.iter().copied().collect();
        raw::put(new, new_group((0..g.0.len()).filter(|r| !out.contains(&(*r as c_int))).map(|r| g.0[r]).collect()))
    }
    fn MPI_Group_range_incl / PMPI_Group_range_incl(grp: Handle, n: c_int, ranges: *const [c_int; 3], new: *mut Handle) {
        let g = group(grp)?;
        let rs = expand_ranges(raw::slice(ranges, n)?)?;
        check_group_ranks(&g, &rs)?;
        raw::put(new, new_group(rs.iter().map(|&r| g.0[r as usize]).collect()))
    }
    fn MPI_Group_range_excl / PMPI_Group_range_excl(grp: Handle, n: c_int, ranges: *const [c_int; 3], new: *mut Handle) {
        let g = group(grp)?;
        let rs = expand_ranges(raw::slice(ranges, n)?)?;
        check_group_ranks(&g, &rs)?;
        let out: HashSet<c_int> = rs.into_iter().collect();
        raw::put(new, new_group((0..g.0.len()).filter(|r| !out.contains(&(*r as c_int))).map(|r| g.0[r]).collect()))
    }
    fn MPI_Group_free / PMPI_Group_free(grp: *mut Handle) {
        let h = raw::get(grp)?;
        if h != GROUP_EMPTY && GROUPS.remove(h).is_none() {
            return Err(Fail::new(ERR_GROUP, format!("{h:#x} is not a group")));
        }
        raw::put(grp, GROUP_NULL)
    }
}

/// Drops communicator `h` (freed or disconnected): its attributes' delete callbacks run,
/// and it is no longer the parent `MPI_Comm_get_parent` answers.
fn release(h: Handle) {
    crate::attr::delete_all(h);
    state::forget_parent(h);
    state::COMMS.remove(h);
}

/// `MPI_Comm_dup` of an intra- or intercommunicator: same groups, a new context, the
/// error handler and (through their callbacks) the attributes copied.
fn duplicate(comm: Handle) -> R<Handle> {
    let c = state::comm(comm)?;
    match &c.inter {
        Some(ic) => {
            let h = state::new_inter(ic.try_duplicate()?, c.errh.load(Ordering::Relaxed));
            crate::attr::copy_all(comm, &c, h)?;
            Ok(h)
        }
        None => register_child(comm, &c, c.comm.duplicate(), true),
    }
}

/// `f` of the intercommunicator behind `h` (and its entry), or `MPI_ERR_COMM`.
fn with_inter<T>(h: Handle, f: impl FnOnce(&CommEntry, &InterCommunicator) -> R<T>) -> R<T> {
    let c = state::comm(h)?;
    match &c.inter {
        Some(ic) => f(&c, ic),
        None => Err(Fail::new(
            ERR_COMM,
            format!("{h:#x} is not an intercommunicator"),
        )),
    }
}

/// The info key of `MPI_COMM_TYPE_HW_GUIDED`/`_UNGUIDED`, and the one resource metampi
/// splits by.
const HW_RESOURCE: &str = "mpi_hw_resource_type";
const SHARED_MEMORY: &str = "mpi_shared_memory";

/// A tag for the leaders of `MPI_Intercomm_create_from_groups` from its string tag.
pub(crate) fn string_tag(s: &str) -> c_int {
    // FNV-1a, folded to a non-negative tag: both groups hash the same string alike.
    let h = s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    (h & 0x3fff_ffff) as c_int
}

mpi! {
    fn MPI_Intercomm_create / PMPI_Intercomm_create(local: Handle, local_leader: c_int, peer: Handle, remote_leader: c_int, tag: c_int, new: *mut Handle) {
        let c = state::intra(local)?;
        // The peer communicator matters at the local leader only; elsewhere it may be anything.
        let p = if c.comm.rank() == local_leader { Some(state::comm(peer)?) } else { state::comm(peer).ok() };
        let ic = match &p {
            Some(p) => c.comm.try_create_intercommunicator(local_leader, &p.comm, remote_leader, tag)?,
            None => c.comm.try_create_intercommunicator(local_leader, &c.comm, remote_leader, tag)?,
        };
        raw::put(new, state::new_inter(ic, c.errh.load(Ordering::Relaxed)))
    }
    fn MPI_Intercomm_create_from_groups / PMPI_Intercomm_create_from_groups(lg: Handle, local_leader: c_int, rg: Handle, remote_leader: c_int, stringtag: *const c_char, _info: Handle, errh: Handle, new: *mut Handle) {
        let (l, r) = (group(lg)?, group(rg)?);
        let tag = string_tag(&raw::c_str(stringtag)?);
        let world = state::comm(COMM_WORLD)?;
        let local = world.comm.split_by_subgroup_with_tag(&l, tag).ok_or_else(|| {
            Fail::new(ERR_GROUP, "this process is not in the local group")
        })?;
        let leader = r.0.get(remote_leader.max(0) as usize).copied().ok_or_else(|| {
            Fail::new(ERR_RANK, format!("remote leader {remote_leader} is not a rank of the remote group"))
        })?;
        let ic = local.try_create_intercommunicator(local_leader, &world.comm, leader as c_int, tag)?;
        raw::put(new, state::new_inter(ic, errh))
    }
    fn MPI_Intercomm_merge / PMPI_Intercomm_merge(comm: Handle, high: c_int, new: *mut Handle) {
        let order = if high != 0 { MergeOrder::High } else { MergeOrder::Low };
        let h = with_inter(comm, |c, ic| Ok(state::new_comm(ic.try_merge(order)?, c.errh.load(Ordering::Relaxed))))?;
        raw::put(new, h)
    }
    fn MPI_Comm_remote_size / PMPI_Comm_remote_size(comm: Handle, size: *mut c_int) {
        raw::put(size, with_inter(comm, |_, ic| Ok(ic.remote_size()))?)
    }
    fn MPI_Comm_remote_group / PMPI_Comm_remote_group(comm: Handle, grp: *mut Handle) {
        let ranks = with_inter(comm, |_, ic| Ok(metampi::topology::Group::world_ranks(&ic.remote_group()).to_vec()))?;
        raw::put(grp, new_group(ranks))
    }
}

/// A new communicator handle for `c` inheriting `parent`'s error handler.
pub fn adopt(parent: &CommEntry, c: SimpleCommunicator) -> Handle {
    state::new_comm(c, parent.errh.load(Ordering::Relaxed))
}
