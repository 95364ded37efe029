//! Topology-aware (hierarchical) collectives across meta hosts (PACX-MPI's
//! design): the ranks of a communicator are grouped by site, each group has
//! a leader (its lowest rank, or the root for the root's group), and every
//! operation runs in three stages — inside each site, between the leaders,
//! inside each site again — so that the wide-area links carry each piece of
//! data as few times as the operation allows:
//!
//! - broadcast: the root sends once to each remote site's leader, then a
//!   binomial broadcast runs inside every site;
//! - reduce / all-reduce: binomial reduce inside each site (rank order), the
//!   leaders send their partial once to the root (rank 0 for all-reduce), which
//!   folds them in site order; all-reduce then broadcasts as above. With a
//!   non-commutative operation this keeps rank order only when every site's
//!   ranks are consecutive, which [`usable`] checks (otherwise the flat
//!   algorithm runs);
//! - barrier: fan-in inside each site, among the leaders, fan-out;
//! - gather / scatter: the leader of each remote site collects (hands out)
//!   its members' blocks and exchanges one aggregated message with the root;
//! - all-gather: gather at the leaders, one aggregated message between each
//!   pair of leaders, broadcast inside each site.
//!
//! Every rank calls `Builder::phase` the same number of times whatever its
//! role, as the schedule contract requires.

#![forbid(unsafe_code)]

use super::bcast::span;
use super::schedule::{Builder, Reg};
use crate::topology::{site_of_world, CommInner};
use crate::Rank;

/// The communicator's ranks grouped by site: each group ascending, the
/// groups ordered by their lowest rank (so group 0 holds rank 0).
pub(crate) fn groups(comm: &CommInner) -> Vec<Vec<Rank>> {
    let mut by_site: Vec<(usize, Vec<Rank>)> = Vec::new();
    for (r, &w) in comm.ranks.iter().enumerate() {
        let s = site_of_world(w);
        match by_site.iter_mut().find(|(site, _)| *site == s) {
            Some((_, g)) => g.push(r as Rank),
            None => by_site.push((s, vec![r as Rank])),
        }
    }
    by_site.into_iter().map(|(_, g)| g).collect()
}

/// Whether the communicator has members on two sites or more.
pub(crate) fn spans_sites(comm: &CommInner) -> bool {
    let mut it = comm.ranks.iter().map(|&w| site_of_world(w));
    match it.next() {
        Some(first) => it.any(|s| s != first),
        None => false,
    }
}

/// Whether the hierarchical algorithms can serve an operation: always for
/// commutative ones; for the others only when every site's ranks are
/// consecutive, so that site-by-site combining keeps rank order.
pub(crate) fn usable(comm: &CommInner, commutative: bool) -> bool {
    commutative
        || groups(comm)
            .iter()
            .all(|g| (g[g.len() - 1] - g[0]) as usize + 1 == g.len())
}

/// The group that holds rank `r`.
fn group_of(groups: &[Vec<Rank>], r: Rank) -> usize {
    groups
        .iter()
        .position(|g| g.contains(&r))
        .expect("every rank is in a group")
}

/// The leader of group `g` when `root` is the operation's root.
fn leader(groups: &[Vec<Rank>], g: usize, root: Rank) -> Rank {
    if groups[g].contains(&root) {
        root
    } else {
        groups[g][0]
    }
}

/// Binomial broadcast over the ranks of `list` from `list[root]`; ranks
/// outside the list do nothing.
fn list_bcast(b: &mut Builder, list: &[Rank], root: usize, data: Reg) {
    let Some(i) = list.iter().position(|&r| r == b.me) else {
        return;
    };
    let n = list.len() as Rank;
    let root = root as Rank;
    let rel = (i as Rank - root + n) % n;
    let abs = |x: Rank| list[((x + root) % n) as usize];
    let low = span(rel, n);
    if rel != 0 {
        b.recv(abs(rel - low), 0, data);
        b.round();
    }
    let mut m = low >> 1;
    while m > 0 {
        if rel + m < n {
            b.send(abs(rel + m), 0, data);
        }
        m >>= 1;
    }
    b.round();
}

/// Binomial reduction over `list` towards `list[0]`, combining in list
/// order (`combine` false: an empty fan-in). Returns where this rank's
/// (partial) result lies.
fn list_reduce(b: &mut Builder, list: &[Rank], mut acc: Reg, mut tmp: Reg, combine: bool) -> Reg {
    let Some(rel) = list.iter().position(|&r| r == b.me) else {
        return acc;
    };
    let n = list.len() as Rank;
    let rel = rel as Rank;
    let low = span(rel, n);
    let mut pending = false;
    let mut mask = 1;
    while mask < low && rel + mask < n {
        if std::mem::take(&mut pending) && combine {
            b.apply(acc, tmp);
            std::mem::swap(&mut acc, &mut tmp);
        }
        b.recv(list[(rel + mask) as usize], 0, tmp);
        b.round();
        pending = true;
        mask <<= 1;
    }
    if pending && combine {
        b.apply(acc, tmp);
        std::mem::swap(&mut acc, &mut tmp);
    }
    if rel != 0 {
        b.send(list[(rel - low) as usize], 0, acc);
    }
    b.round();
    acc
}

/// Broadcast: once from the root to each remote site's leader, then a
/// binomial tree inside each site.
pub(super) fn bcast(b: &mut Builder, groups: &[Vec<Rank>], root: Rank, data: Reg) {
    let me = b.me;
    let mine = group_of(groups, me);
    b.phase();
    if me == root {
        for g in (0..groups.len()).filter(|&g| g != mine) {
            b.send(leader(groups, g, root), 0, data);
        }
    } else if me == leader(groups, mine, root) {
        b.recv(root, 0, data);
    }
    b.round();
    b.phase();
    let l = leader(groups, mine, root);
    let at = groups[mine]
        .iter()
        .position(|&r| r == l)
        .expect("the leader is a member");
    list_bcast(b, &groups[mine], at, data);
}

/// Reduce to `root`: rank-order reduce inside each site to its lowest rank,
/// one partial per site to the root, folded in site order. `acc` holds this
/// rank's contribution, `spare` scratch of the same length; returns where
/// the root's result lies.
pub(super) fn reduce(
    b: &mut Builder,
    groups: &[Vec<Rank>],
    root: Rank,
    acc: Reg,
    spare: Reg,
) -> Reg {
    let me = b.me;
    let mine = group_of(groups, me);
    b.phase();
    let r = list_reduce(b, &groups[mine], acc, spare, true);
    b.phase();
    if me == root {
        let parts: Vec<Reg> = groups
            .iter()
            .map(|g| {
                if g[0] == me {
                    r
                } else {
                    let p = b.owned(r.len);
                    b.recv(g[0], 0, p);
                    p
                }
            })
            .collect();
        b.round();
        let mut res = parts[0];
        for &p in &parts[1..] {
            b.apply(res, p);
            res = p;
        }
        b.round();
        res
    } else {
        if groups[mine][0] == me {
            b.send(root, 0, r);
        }
        b.round();
        r
    }
}

/// All-reduce: rank-order reduce inside each site to its lowest rank; the
/// leaders exchange their partials all at once (one wide-area phase instead
/// of reduce-then-broadcast's two) and each folds them in site order, so all
/// get the same result; then a broadcast inside each site.
pub(super) fn all_reduce(b: &mut Builder, groups: &[Vec<Rank>], acc: Reg, spare: Reg) -> Reg {
    let me = b.me;
    let mine = group_of(groups, me);
    b.phase();
    let r = list_reduce(b, &groups[mine], acc, spare, true);
    b.phase();
    let mut res = r;
    if me == groups[mine][0] {
        let parts: Vec<Reg> = groups
            .iter()
            .enumerate()
            .map(|(g, grp)| {
                if g == mine {
                    r
                } else {
                    let p = b.owned(r.len);
                    b.recv(grp[0], 0, p);
                    p
                }
            })
            .collect();
        for (g, grp) in groups.iter().enumerate() {
            if g != mine {
                b.send(grp[0], 0, r);
            }
        }
        b.round();
        let mut folded = parts[0];
        for &p in &parts[1..] {
            b.apply(folded, p);
            folded = p;
        }
        b.round();
        res = folded;
    }
    b.phase();
    list_bcast(b, &groups[mine], 0, res);
    res
}

/// Barrier: fan-in inside each site, fan-in and fan-out among the leaders,
/// fan-out inside each site.
pub(super) fn barrier(b: &mut Builder, groups: &[Vec<Rank>]) {
    let mine = group_of(groups, b.me);
    let (e1, e2) = (b.owned(0), b.owned(0));
    let leaders: Vec<Rank> = groups.iter().map(|g| g[0]).collect();
    b.phase();
    list_reduce(b, &groups[mine], e1, e2, false);
    b.phase();
    list_reduce(b, &leaders, e1, e2, false);
    b.phase();
    list_bcast(b, &leaders, 0, e1);
    b.phase();
    list_bcast(b, &groups[mine], 0, e1);
}

/// Gather of `bs`-byte blocks to `root` into `dst` (n blocks, root only):
/// the root's site members send to the root, every remote site's leader
/// collects its members' blocks and sends them in one message.
pub(super) fn gather(
    b: &mut Builder,
    groups: &[Vec<Rank>],
    root: Rank,
    mine: Reg,
    bs: usize,
    dst: Option<Reg>,
) {
    let me = b.me;
    let my = group_of(groups, me);
    let l = leader(groups, my, root);
    b.phase();
    if me == root {
        let dst = match dst {
            Some(d) => d,
            None => b.owned(b.n as usize * bs),
        };
        let block = |r: Rank| dst.at(r as usize * bs, bs);
        b.copy_fit(mine, block(me));
        let mut packs = Vec::new();
        for (g, members) in groups.iter().enumerate() {
            if g == my {
                for &m in members.iter().filter(|&&m| m != me) {
                    b.recv(m, 0, block(m));
                }
            } else {
                let p = b.owned(members.len() * bs);
                b.recv(leader(groups, g, root), 1, p);
                packs.push((g, p));
            }
        }
        b.round();
        for (g, p) in packs {
            for (j, &m) in groups[g].iter().enumerate() {
                b.copy(p.at(j * bs, bs), block(m));
            }
        }
        b.round();
    } else if me == l {
        let members = &groups[my];
        let p = b.owned(members.len() * bs);
        for (j, &m) in members.iter().enumerate() {
            if m == me {
                b.copy_fit(mine, p.at(j * bs, bs));
            } else {
                b.recv(m, 0, p.at(j * bs, bs));
            }
        }
        b.round();
        b.send(root, 1, p);
        b.round();
    } else {
        b.send(l, 0, mine);
        b.round();
    }
}

/// Scatter of `bs`-byte blocks from `root`'s `src` (n blocks, root only)
/// into `out`: one aggregated message from the root to each remote site's
/// leader, which hands out its members' blocks.
pub(super) fn scatter(
    b: &mut Builder,
    groups: &[Vec<Rank>],
    root: Rank,
    src: Option<Reg>,
    bs: usize,
    out: Reg,
) {
    let me = b.me;
    let my = group_of(groups, me);
    let l = leader(groups, my, root);
    b.phase();
    if me == root {
        let src = match src {
            Some(s) => s,
            None => b.owned(b.n as usize * bs),
        };
        let block = |r: Rank| src.at(r as usize * bs, bs);
        let mut packs = Vec::new();
        for (g, members) in groups.iter().enumerate().filter(|&(g, _)| g != my) {
            let p = b.owned(members.len() * bs);
            for (j, &m) in members.iter().enumerate() {
                b.copy(block(m), p.at(j * bs, bs));
            }
            packs.push((g, p));
        }
        b.copy_fit(block(me), out);
        b.round();
        for (g, p) in packs {
            b.send(leader(groups, g, root), 1, p);
        }
        for &m in groups[my].iter().filter(|&&m| m != me) {
            b.send(m, 0, block(m));
        }
        b.round();
    } else if me == l {
        let members = &groups[my];
        let p = b.owned(members.len() * bs);
        b.recv(root, 1, p);
        b.round();
        for (j, &m) in members.iter().enumerate() {
            if m == me {
                b.copy_fit(p.at(j * bs, bs), out);
            } else {
                b.send(m, 0, p.at(j * bs, bs));
            }
        }
        b.round();
    } else {
        b.recv(l, 0, out);
        b.round();
    }
}

/// All-gather of `bs`-byte blocks into `out` (n blocks): gather at each
/// site's lowest rank, one aggregated message between every pair of leaders,
/// broadcast of the whole result inside each site.
pub(super) fn all_gather(b: &mut Builder, groups: &[Vec<Rank>], mine: Reg, bs: usize, out: Reg) {
    let me = b.me;
    let my = group_of(groups, me);
    let l = groups[my][0];
    b.phase();
    let mut own = None;
    if me == l {
        let p = b.owned(groups[my].len() * bs);
        for (j, &m) in groups[my].iter().enumerate() {
            if m == me {
                b.copy_fit(mine, p.at(j * bs, bs));
            } else {
                b.recv(m, 0, p.at(j * bs, bs));
            }
        }
        own = Some(p);
    } else {
        b.send(l, 0, mine);
    }
    b.round();
    b.phase();
    if let Some(p) = own {
        let mut packs = vec![(my, p)];
        for (g, members) in groups.iter().enumerate().filter(|&(g, _)| g != my) {
            b.send(members[0], 0, p);
            let q = b.owned(members.len() * bs);
            b.recv(members[0], 0, q);
            packs.push((g, q));
        }
        b.round();
        for (g, p) in packs {
            for (j, &m) in groups[g].iter().enumerate() {
                b.copy(p.at(j * bs, bs), out.at(m as usize * bs, bs));
            }
        }
        b.round();
    }
    b.phase();
    list_bcast(b, &groups[my], 0, out);
}
