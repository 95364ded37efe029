//! Topology-aware (hierarchical) collectives (PACX-MPI's design), on two
//! levels: meta hosts (sites, joined by routers over wide-area links) and,
//! inside each, machines (nodes, joined by TCP; ranks of one machine talk
//! over shared memory). The communicator's ranks are grouped by site; each
//! site is split further by machine ([`Tiers`]). When every member lies on
//! one site the machines themselves are the top-level groups. Each group
//! has a leader (its lowest rank, or the root in the root's group), and every
//! operation runs in stages — inside each machine, among the machine leaders
//! of a site, among the site leaders, and back down — so that each slower
//! link carries each piece of data as few times as the operation allows:
//!
//! - broadcast: the root sends once to each remote site's leader, then inside
//!   every site a binomial tree over its machine leaders and a binomial tree
//!   inside each machine;
//! - reduce / all-reduce: binomial reduce inside each machine (rank order),
//!   among the machine leaders of each site, then the site leaders send
//!   their partial once to the root (for all-reduce: to each other), which
//!   folds them in site order; all-reduce then broadcasts inside each site
//!   as above. With a non-commutative operation this keeps rank order only
//!   when every group's ranks are consecutive, which [`tiers`] checks: it
//!   drops the machine level when machines interleave, and gives up (the
//!   flat algorithm runs) when sites do;
//! - barrier: fan-in inside machines, machine leaders, site leaders; fan-out
//!   the same way back;
//! - gather / scatter: the leader of each remote top-level group collects
//!   (hands out) its members' blocks and exchanges one aggregated message
//!   with the root; also with varying counts (below);
//! - all-gather: gather at the leaders, one aggregated message between each
//!   pair of leaders, broadcast inside each group;
//! - all-to-all: members of a group exchange directly; blocks for other
//!   groups go in one message to the leader, the leaders exchange one
//!   aggregated message per ordered pair of groups, and each leader hands
//!   every member one message holding all its blocks from other groups;
//!   also with varying counts (below);
//! - scan / exclusive scan (sites with consecutive ranks only, whatever the
//!   operation): recursive doubling inside each site, then only the sites'
//!   last ranks trade totals across sites and hand the prefix down;
//! - reduce-scatter-block: reduce inside each site, each leader sends every
//!   other leader only the blocks of that site's members, then scatters;
//! - all-gather-varcount: as all-gather, on a packed copy of the blocks
//!   (every rank knows every count), so gaps in the user's buffer stay as
//!   they were;
//! - gather, scatter and all-to-all with varying counts (blocking calls
//!   only): a leader does not know its members' counts, and a schedule's
//!   message sizes are fixed when it is built, so a small schedule of its
//!   own runs first, inside each group only ([`collect_counts`]: every
//!   member's block length, for all-to-all what it sends to and receives
//!   from each rank outside the group, to the leader); the data schedule is
//!   then the fixed-count one with those sizes ([`gather`], [`scatter`],
//!   [`all_to_all`] take the sizes as a function). The root knows every
//!   count from its partition, and a receiving leader the size of what
//!   arrives from its members' receive counts. Immediate forms stay flat.
//!
//! Every rank calls `Builder::phase` the same number of times whatever its
//! role, as the schedule contract requires.

#![forbid(unsafe_code)]

use std::sync::OnceLock;

use super::bcast::span;
use super::scan;
use super::schedule::{Builder, Reg};
use crate::environment::shared;
use crate::topology::{site_of_world, CommInner};
use crate::Rank;

/// A communicator's hierarchy, identical on every member.
pub(crate) struct Tiers {
    /// Top-level groups (sites; machines when the communicator lies on one
    /// site): each ascending, ordered by lowest rank, so group 0 holds rank 0.
    pub groups: Vec<Vec<Rank>>,
    /// For each top-level group its machines, each ascending and ordered by
    /// lowest rank (one entry, the group itself, where the machine level is
    /// not used).
    pub nodes: Vec<Vec<Vec<Rank>>>,
}

/// The machine index of every world rank (equal names, equal index).
fn node_ids() -> &'static [u32] {
    static IDS: OnceLock<Vec<u32>> = OnceLock::new();
    IDS.get_or_init(|| {
        let names = &shared().info.nodes;
        let mut seen: Vec<&str> = Vec::new();
        names
            .iter()
            .map(|n| match seen.iter().position(|s| *s == n.as_str()) {
                Some(i) => i as u32,
                None => {
                    seen.push(n.as_str());
                    (seen.len() - 1) as u32
                }
            })
            .collect()
    })
}

/// The machine of engine rank `w` of `comm`, and its site, as every member
/// sees them: in a communicator with processes of another world
/// (`CommInner::mixed`) one machine per member on one site, since no
/// member knows where all the others are.
fn node_in(comm: &CommInner, w: u32) -> u32 {
    if comm.mixed {
        return w;
    }
    node_ids().get(w as usize).copied().unwrap_or(u32::MAX - w)
}

fn site_in(comm: &CommInner, w: u32) -> usize {
    if comm.mixed {
        0
    } else {
        site_of_world(w)
    }
}

/// `ranks` (ascending communicator ranks) grouped by `key`: each group
/// ascending, the groups ordered by their lowest rank.
fn group_by<K: PartialEq>(
    ranks: impl Iterator<Item = Rank>,
    key: impl Fn(Rank) -> K,
) -> Vec<Vec<Rank>> {
    let mut by: Vec<(K, Vec<Rank>)> = Vec::new();
    for r in ranks {
        let k = key(r);
        match by.iter_mut().find(|(x, _)| *x == k) {
            Some((_, g)) => g.push(r),
            None => by.push((k, vec![r])),
        }
    }
    by.into_iter().map(|(_, g)| g).collect()
}

fn consecutive(g: &[Rank]) -> bool {
    (g[g.len() - 1] - g[0]) as usize + 1 == g.len()
}

/// The communicator's hierarchy, or `None` when it cannot keep rank order
/// for a non-commutative operation (the sites' ranks interleave; with a
/// single site, the machines' ranks do). For a non-commutative operation a
/// site whose machines interleave is treated as one machine.
pub(crate) fn tiers(comm: &CommInner, commutative: bool) -> Option<Tiers> {
    let n = comm.size();
    let site = |r: Rank| site_in(comm, comm.ranks[r as usize]);
    let node = |r: Rank| node_in(comm, comm.ranks[r as usize]);
    let sites = group_by(0..n, site);
    if sites.len() > 1 {
        if !commutative && !sites.iter().all(|g| consecutive(g)) {
            return None;
        }
        let nodes = sites
            .iter()
            .map(|g| {
                let m = group_by(g.iter().copied(), node);
                if commutative || m.iter().all(|x| consecutive(x)) {
                    m
                } else {
                    vec![g.clone()]
                }
            })
            .collect();
        return Some(Tiers {
            groups: sites,
            nodes,
        });
    }
    let machines = group_by(0..n, node);
    if !commutative && !machines.iter().all(|g| consecutive(g)) {
        return None;
    }
    let nodes = machines.iter().map(|g| vec![g.clone()]).collect();
    Some(Tiers {
        groups: machines,
        nodes,
    })
}

/// Whether the hierarchical algorithms can serve an operation on `comm`
/// (see [`tiers`]).
pub(crate) fn usable(comm: &CommInner, commutative: bool) -> bool {
    commutative || tiers(comm, commutative).is_some()
}

/// Where a communicator's members are, as the choice of algorithm asks on
/// every collective call: worked out once per communicator (an 8-rank
/// broadcast spent some 400 instructions a call on it).
pub(crate) struct Spread {
    /// The members are on several sites.
    sites: bool,
    /// On several machines, one at least with two of them or more (with one
    /// rank per machine a hierarchy saves nothing).
    shared_machines: bool,
    /// All on one machine.
    one_machine: bool,
}

fn spread(comm: &CommInner) -> &Spread {
    comm.spread.get_or_init(|| {
        let all_equal = |key: &dyn Fn(u32) -> u32| {
            let mut it = comm.ranks.iter().map(|&w| key(w));
            match it.next() {
                Some(first) => it.all(|k| k == first),
                None => true,
            }
        };
        let one_machine = all_equal(&|w| node_in(comm, w));
        let mut seen: Vec<u32> = Vec::new();
        let repeated = comm.ranks.iter().any(|&w| {
            let k = node_in(comm, w);
            let again = seen.contains(&k);
            seen.push(k);
            again
        });
        Spread {
            sites: !all_equal(&|w| site_in(comm, w) as u32),
            shared_machines: !one_machine && repeated,
            one_machine,
        }
    })
}

/// Whether the communicator spans several sites.
pub(crate) fn spans_sites(comm: &CommInner) -> bool {
    spread(comm).sites
}

/// Whether every member of the communicator is on one machine.
pub(crate) fn on_one_machine(comm: &CommInner) -> bool {
    spread(comm).one_machine
}

/// Whether the communicator spans several machines, one at least with two
/// of its ranks or more.
pub(crate) fn spans_shared_machines(comm: &CommInner) -> bool {
    spread(comm).shared_machines
}

/// The group that holds rank `r`.
pub(super) fn group_of(groups: &[Vec<Rank>], r: Rank) -> usize {
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

/// Reduction inside one top-level group whose machines are `nodes`:
/// binomial inside this rank's machine, then among the machine leaders (the
/// lowest rank of each), towards the group's lowest rank. Two phases.
fn group_reduce(b: &mut Builder, nodes: &[Vec<Rank>], acc: Reg, tmp: Reg, combine: bool) -> Reg {
    let me = b.me;
    b.phase();
    let mine = group_of(nodes, me);
    let r = list_reduce(b, &nodes[mine], acc, tmp, combine);
    let spare = if r == acc { tmp } else { acc };
    b.phase();
    if nodes.len() > 1 && me == nodes[mine][0] {
        let leaders: Vec<Rank> = nodes.iter().map(|m| m[0]).collect();
        return list_reduce(b, &leaders, r, spare, combine);
    }
    r
}

/// Broadcast inside one top-level group whose machines are `nodes`, from
/// `from` (a member): binomial among the machine leaders (`from` leads its
/// own machine), then binomial inside each machine. Two phases.
fn group_bcast(b: &mut Builder, nodes: &[Vec<Rank>], from: Rank, data: Reg) {
    let me = b.me;
    b.phase();
    if nodes.len() > 1 {
        let leaders: Vec<Rank> = (0..nodes.len()).map(|m| leader(nodes, m, from)).collect();
        let at = group_of(nodes, from);
        list_bcast(b, &leaders, at, data);
    }
    b.phase();
    let mine = group_of(nodes, me);
    let l = leader(nodes, mine, from);
    let at = nodes[mine]
        .iter()
        .position(|&r| r == l)
        .expect("the leader is a member");
    list_bcast(b, &nodes[mine], at, data);
}

/// Broadcast: once from the root to each remote group's leader, then inside
/// each group (machine leaders, then machines).
pub(super) fn bcast(b: &mut Builder, t: &Tiers, root: Rank, data: Reg) {
    let groups = &t.groups;
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
    group_bcast(b, &t.nodes[mine], leader(groups, mine, root), data);
}

/// Reduce to `root`: rank-order reduce inside each group to its lowest rank,
/// one partial per group to the root, folded in group order. `acc` holds
/// this rank's contribution, `spare` scratch of the same length; returns
/// where the root's result lies.
pub(super) fn reduce(b: &mut Builder, t: &Tiers, root: Rank, acc: Reg, spare: Reg) -> Reg {
    let groups = &t.groups;
    let me = b.me;
    let mine = group_of(groups, me);
    let r = group_reduce(b, &t.nodes[mine], acc, spare, true);
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

/// All-reduce: rank-order reduce inside each group to its lowest rank; the
/// leaders exchange their partials all at once (one wide-area phase instead
/// of reduce-then-broadcast's two) and each folds them in group order, so
/// all get the same result; then a broadcast inside each group.
pub(super) fn all_reduce(b: &mut Builder, t: &Tiers, acc: Reg, spare: Reg) -> Reg {
    let groups = &t.groups;
    let me = b.me;
    let mine = group_of(groups, me);
    let r = group_reduce(b, &t.nodes[mine], acc, spare, true);
    b.phase();
    let mut res = r;
    if me == groups[mine][0] && groups.len() > 1 {
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
    group_bcast(b, &t.nodes[mine], groups[mine][0], res);
    res
}

/// Barrier: fan-in inside each group (machines, then machine leaders),
/// fan-in and fan-out among the group leaders, fan-out inside each group.
pub(super) fn barrier(b: &mut Builder, t: &Tiers) {
    let groups = &t.groups;
    let mine = group_of(groups, b.me);
    let (e1, e2) = (b.owned(0), b.owned(0));
    let leaders: Vec<Rank> = groups.iter().map(|g| g[0]).collect();
    group_reduce(b, &t.nodes[mine], e1, e2, false);
    b.phase();
    list_reduce(b, &leaders, e1, e2, false);
    b.phase();
    list_bcast(b, &leaders, 0, e1);
    group_bcast(b, &t.nodes[mine], groups[mine][0], e1);
}

/// The ranks outside group `my`, group by group, each in rank order: the
/// order in which a member packs its blocks for other groups.
fn outside(groups: &[Vec<Rank>], my: usize) -> impl Iterator<Item = Rank> + '_ {
    groups
        .iter()
        .enumerate()
        .filter(move |&(g, _)| g != my)
        .flat_map(|(_, m)| m.iter().copied())
}

/// A buffer of the library's holding blocks of `sizes` back to back, and
/// every block's region in it.
fn packed(b: &mut Builder, sizes: impl IntoIterator<Item = usize>) -> (Reg, Vec<Reg>) {
    let sizes: Vec<usize> = sizes.into_iter().collect();
    let whole = b.owned(sizes.iter().sum());
    let mut at = 0;
    let parts = sizes
        .iter()
        .map(|&s| {
            at += s;
            whole.at(at - s, s)
        })
        .collect();
    (whole, parts)
}

/// Inside `members` (this rank's group): every member sends `mine` to `l`,
/// which receives member j's into `slot(j)` and copies its own there. Ends
/// no round.
fn collect(b: &mut Builder, members: &[Rank], l: Rank, mine: Reg, slot: impl Fn(usize) -> Reg) {
    let me = b.me;
    if me != l {
        b.send(l, 0, mine);
        return;
    }
    for (j, &m) in members.iter().enumerate() {
        if m == me {
            b.copy_fit(mine, slot(j));
        } else {
            b.recv(m, 0, slot(j));
        }
    }
}

/// The reverse of [`collect`]: `l` sends member j `slot(j)` (its own it
/// copies to `out`), every other member receives into `out`. Ends no round.
fn hand_out(b: &mut Builder, members: &[Rank], l: Rank, out: Reg, slot: impl Fn(usize) -> Reg) {
    let me = b.me;
    if me != l {
        b.recv(l, 0, out);
        return;
    }
    for (j, &m) in members.iter().enumerate() {
        if m == me {
            b.copy_fit(slot(j), out);
        } else {
            b.send(m, 0, slot(j));
        }
    }
}

/// The counts exchange that comes before a hierarchical gather, scatter or
/// all-to-all with varying counts, run as a schedule of its own: every
/// member of each group but `skip` (the root's, whose counts the root
/// knows) sends its `mine` (one length across a group) to the group's
/// lowest rank, which receives them into `all` in member order. Nothing
/// crosses between groups. One phase.
pub(super) fn collect_counts(
    b: &mut Builder,
    groups: &[Vec<Rank>],
    skip: Option<usize>,
    mine: Reg,
    all: Reg,
) {
    let my = group_of(groups, b.me);
    b.phase();
    if skip != Some(my) {
        let (members, len) = (&groups[my], mine.len);
        collect(b, members, members[0], mine, |j| all.at(j * len, len));
    }
    b.round();
}

/// What a member of group `my` tells its leader before a hierarchical
/// all-to-all with varying counts: the bytes it sends to each rank outside
/// the group (`send[r].len`), then those it receives from each (in
/// [`outside`] order).
pub(super) fn all_to_all_counts(
    groups: &[Vec<Rank>],
    my: usize,
    send: &[Reg],
    recv: &[Reg],
) -> Vec<u64> {
    let len = |r: Rank, regs: &[Reg]| regs[r as usize].len as u64;
    outside(groups, my)
        .map(|r| len(r, send))
        .chain(outside(groups, my).map(|r| len(r, recv)))
        .collect()
}

/// The block sizes of a hierarchical all-to-all with varying counts as a
/// rank of group `my` knows them: its own from its partitions, and on the
/// group's leader every member's row of [`all_to_all_counts`] (`rows`, in
/// member order).
pub(super) struct VarSizes<'a> {
    me: Rank,
    send: &'a [Reg],
    recv: &'a [Reg],
    rows: Vec<Vec<usize>>,
    /// Each rank's index in its group.
    index: Vec<usize>,
    /// Each outside rank's place in [`outside`] order.
    place: Vec<usize>,
    group: Vec<usize>,
    my: usize,
}

impl<'a> VarSizes<'a> {
    pub(super) fn new(
        groups: &[Vec<Rank>],
        me: Rank,
        send: &'a [Reg],
        recv: &'a [Reg],
        rows: Vec<Vec<usize>>,
    ) -> VarSizes<'a> {
        let n = send.len();
        let my = group_of(groups, me);
        let (mut index, mut group, mut place) = (vec![0; n], vec![0; n], vec![0; n]);
        for (g, members) in groups.iter().enumerate() {
            for (j, &m) in members.iter().enumerate() {
                index[m as usize] = j;
                group[m as usize] = g;
            }
        }
        for (i, r) in outside(groups, my).enumerate() {
            place[r as usize] = i;
        }
        VarSizes {
            me,
            send,
            recv,
            rows,
            index,
            place,
            group,
            my,
        }
    }

    /// Bytes from `from` to `to`, one of them in this rank's group, the
    /// other outside it (0 where this rank cannot know).
    pub(super) fn size(&self, from: Rank, to: Rank) -> usize {
        let (f, t) = (from as usize, to as usize);
        if from == self.me {
            return self.send[t].len;
        }
        if to == self.me {
            return self.recv[f].len;
        }
        let (member, other, recv) = if self.group[f] == self.my {
            (f, t, false)
        } else {
            (t, f, true)
        };
        let width = self.rows.first().map_or(0, |r| r.len() / 2);
        let at = self.place[other] + if recv { width } else { 0 };
        self.rows
            .get(self.index[member])
            .and_then(|row| row.get(at))
            .copied()
            .unwrap_or(0)
    }
}

/// All-to-all (`send[r]`/`recv[r]`: the blocks for and from rank r;
/// `size(from, to)`: the bytes of the block `from` sends `to`, asked only
/// for pairs across groups with one end in this rank's group, and on a
/// member only for its own blocks): members of a group exchange directly;
/// each member sends its blocks for all other groups in one message to its
/// group's leader; leaders exchange one message per ordered pair of groups
/// (for each member of the receiving group, the blocks from each member of
/// the sending group); each leader sends every member one message with all
/// its blocks from other groups. Three phases.
pub(super) fn all_to_all(
    b: &mut Builder,
    groups: &[Vec<Rank>],
    send: &[Reg],
    recv: &[Reg],
    size: &dyn Fn(Rank, Rank) -> usize,
    check: bool,
) {
    let me = b.me;
    let my = group_of(groups, me);
    let members = &groups[my];
    let l = members[0];
    let away = b.n as usize > members.len();
    let others: Vec<usize> = (0..groups.len()).filter(|&g| g != my).collect();
    // Phase 1: exchange inside the group; outward blocks to the leader.
    b.phase();
    let (pack, at) = packed(b, outside(groups, my).map(|r| size(me, r)));
    for (r, &dst) in outside(groups, my).zip(&at) {
        b.copy_fit(send[r as usize], dst);
    }
    b.copy_fit(send[me as usize], recv[me as usize]);
    b.round();
    for &m in members.iter().filter(|&&m| m != me) {
        b.recv(m, 0, recv[m as usize]);
        b.send(m, 0, send[m as usize]);
    }
    // On the leader, every member's outward pack and its blocks (in
    // `outside` order).
    let mut inbox = Vec::new();
    if me == l {
        for &m in members {
            if m == me || !away {
                inbox.push((pack, at.clone()));
            } else {
                let (p, parts) = packed(b, outside(groups, my).map(|r| size(m, r)));
                b.recv(m, 1, p);
                inbox.push((p, parts));
            }
        }
    } else if away {
        b.send(l, 1, pack);
    }
    b.round();
    // Phase 2: leaders exchange one message per ordered pair of groups,
    // destination-major: for each member of the receiving group, the blocks
    // from each member of the sending group in rank order.
    b.phase();
    // On the leader, from each other group (in order) the part for each
    // member.
    let mut from_groups: Vec<Vec<Reg>> = Vec::new();
    let mut checks = Vec::new();
    if me == l {
        let mut aggs = Vec::new();
        let mut first = 0;
        for &g in &others {
            let grp = &groups[g];
            let lens: Vec<usize> = grp
                .iter()
                .flat_map(|&k| members.iter().map(move |&from| (from, k)))
                .map(|(from, k)| size(from, k))
                .collect();
            // With `check`, the sizes go along: a receiving member's total
            // can be right while its blocks from two senders are not.
            let (agg, parts) = packed(b, with_trailer(&lens, check));
            if check {
                let t = b.owned_from(trailer(lens.iter().copied()));
                b.copy(t, parts[lens.len()]);
            }
            for ki in 0..grp.len() {
                for (mi, (_, blocks)) in inbox.iter().enumerate() {
                    b.copy(blocks[first + ki], parts[ki * members.len() + mi]);
                }
            }
            first += grp.len();
            aggs.push((grp[0], agg));
        }
        b.round();
        for &g in &others {
            let grp = &groups[g];
            // Member mi's part: the blocks from each member of group g.
            let sums: Vec<usize> = members
                .iter()
                .map(|&m| grp.iter().map(|&j| size(j, m)).sum::<usize>())
                .collect();
            let (q, parts) = packed(b, with_trailer(&sums, check));
            b.recv(grp[0], 2, q);
            if check {
                let sizes = members
                    .iter()
                    .flat_map(|&m| grp.iter().map(move |&j| size(j, m)));
                checks.push((parts[members.len()], trailer(sizes)));
            }
            from_groups.push(parts);
        }
        for (to, agg) in aggs {
            b.send(to, 2, agg);
        }
        b.round();
        for (got, want) in checks {
            let want = b.owned_from(want);
            b.expect(got, want, SIZES_DIFFER);
        }
    }
    // Phase 3: each leader hands every member its blocks from other groups.
    b.phase();
    let (mine_in, from_at) = packed(b, outside(groups, my).map(|r| size(r, me)));
    if me == l {
        let mut packs = Vec::new();
        for (mi, &m) in members.iter().enumerate() {
            let dst = if m == me {
                mine_in
            } else {
                packed(b, from_groups.iter().map(|parts| parts[mi].len)).0
            };
            let mut at = 0;
            for parts in &from_groups {
                let w = parts[mi].len;
                b.copy(parts[mi], dst.at(at, w));
                at += w;
            }
            if m != me && away {
                packs.push((m, dst));
            }
        }
        b.round();
        for (m, p) in packs {
            b.send(m, 3, p);
        }
    } else if away {
        b.recv(l, 3, mine_in);
    }
    b.round();
    for (r, &src) in outside(groups, my).zip(&from_at) {
        b.copy_fit(src, recv[r as usize]);
    }
    b.round();
}

/// Part sizes of an aggregated message: the blocks', then with `check` a
/// trailer that sums up their sizes ([`trailer`]).
fn with_trailer(lens: &[usize], check: bool) -> Vec<usize> {
    let mut v = lens.to_vec();
    if check {
        v.push(8);
    }
    v
}

/// A hash of the block sizes in order (FNV-1a over each as eight
/// little-endian bytes): eight bytes whatever the number of blocks, and
/// equal at both ends exactly when the sizes are (but for a chance of 2^-64).
fn trailer(lens: impl IntoIterator<Item = usize>) -> Vec<u8> {
    let h = crate::hash::fnv1a(lens.into_iter().flat_map(|l| (l as u64).to_le_bytes()));
    h.to_le_bytes().to_vec()
}

/// What a failed trailer check says.
const SIZES_DIFFER: &str =
    "the block sizes that the ranks of two sites give (hierarchical varcount)";

/// Gather to `root` (`size(r)`: the bytes of rank r's block, asked on a
/// remote group's leader for its members; the root takes the sizes of
/// `dst`, its block per rank): the root's group members send to the root,
/// every remote group's leader collects its members' blocks and sends them
/// in one message. With `check` (varying counts) the message ends with the
/// sizes the leader put in, which the root compares with its own: a site's
/// total can match while its ranks' blocks do not, and the data would land
/// in the wrong places without a word.
pub(super) fn gather(
    b: &mut Builder,
    groups: &[Vec<Rank>],
    root: Rank,
    mine: Reg,
    size: &dyn Fn(Rank) -> usize,
    dst: Option<&[Reg]>,
    check: bool,
) {
    let me = b.me;
    let my = group_of(groups, me);
    let l = leader(groups, my, root);
    b.phase();
    if me == root {
        let n = b.n;
        let blocks = match dst {
            Some(d) => d.to_vec(),
            None => packed(b, (0..n).map(size)).1,
        };
        let block = |r: Rank| blocks[r as usize];
        collect(b, &groups[my], me, mine, |j| block(groups[my][j]));
        let mut packs = Vec::new();
        for (g, members) in groups.iter().enumerate().filter(|&(g, _)| g != my) {
            let lens: Vec<usize> = members.iter().map(|&m| block(m).len).collect();
            let (p, parts) = packed(b, with_trailer(&lens, check));
            b.recv(leader(groups, g, root), 1, p);
            packs.push((g, parts, lens));
        }
        b.round();
        for (g, parts, lens) in packs {
            if check {
                let want = b.owned_from(trailer(lens.iter().copied()));
                b.expect(parts[lens.len()], want, SIZES_DIFFER);
            }
            for (&m, &part) in groups[g].iter().zip(&parts) {
                b.copy(part, block(m));
            }
        }
        b.round();
    } else {
        let members = &groups[my];
        let (p, parts) = if me == l {
            let lens: Vec<usize> = members.iter().map(|&m| size(m)).collect();
            let (p, parts) = packed(b, with_trailer(&lens, check));
            if check {
                let t = b.owned_from(trailer(lens.iter().copied()));
                b.copy(t, parts[lens.len()]);
            }
            (p, parts)
        } else {
            (mine, Vec::new())
        };
        collect(b, members, l, mine, |j| parts[j]);
        b.round();
        if me == l {
            b.send(root, 1, p);
            b.round();
        }
    }
}

/// Scatter from `root` (`size(r)`: the bytes of rank r's block, asked on a
/// remote group's leader for its members; the root takes the sizes of
/// `src`, its block per rank) into `out`: one aggregated message from the
/// root to each remote group's leader, which hands out its members' blocks;
/// with `check` (varying counts) the leader compares the sizes the root put
/// in with its members' (as [`gather`]).
pub(super) fn scatter(
    b: &mut Builder,
    groups: &[Vec<Rank>],
    root: Rank,
    src: Option<&[Reg]>,
    size: &dyn Fn(Rank) -> usize,
    out: Reg,
    check: bool,
) {
    let me = b.me;
    let my = group_of(groups, me);
    let l = leader(groups, my, root);
    b.phase();
    if me == root {
        let n = b.n;
        let blocks = match src {
            Some(s) => s.to_vec(),
            None => packed(b, (0..n).map(size)).1,
        };
        let block = |r: Rank| blocks[r as usize];
        let mut packs = Vec::new();
        for (g, members) in groups.iter().enumerate().filter(|&(g, _)| g != my) {
            let lens: Vec<usize> = members.iter().map(|&m| block(m).len).collect();
            let (p, parts) = packed(b, with_trailer(&lens, check));
            for (&m, &part) in members.iter().zip(&parts) {
                b.copy(block(m), part);
            }
            if check {
                let t = b.owned_from(trailer(lens.iter().copied()));
                b.copy(t, parts[lens.len()]);
            }
            packs.push((g, p));
        }
        b.round();
        for (g, p) in packs {
            b.send(leader(groups, g, root), 1, p);
        }
        hand_out(b, &groups[my], me, out, |j| block(groups[my][j]));
        b.round();
    } else if me == l {
        let members = &groups[my];
        let lens: Vec<usize> = members.iter().map(|&m| size(m)).collect();
        let (p, parts) = packed(b, with_trailer(&lens, check));
        b.recv(root, 1, p);
        b.round();
        if check {
            let want = b.owned_from(trailer(lens.iter().copied()));
            b.expect(parts[lens.len()], want, SIZES_DIFFER);
        }
        hand_out(b, members, me, out, |j| parts[j]);
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
    let own = b.owned(if me == l { groups[my].len() * bs } else { 0 });
    collect(b, &groups[my], l, mine, |j| own.at(j * bs, bs));
    b.round();
    b.phase();
    if me == l {
        let p = own;
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

/// Inclusive or exclusive scan over `groups` whose ranks are consecutive
/// (so group order is rank order): recursive doubling inside each group;
/// the last rank of each group, which then holds its group's total, joins
/// an exclusive scan of the totals among the groups' last ranks (the only
/// wide-area traffic: ⌈log2 groups⌉ rounds); it broadcasts its group's
/// prefix to the members, which fold it in front of their own result.
/// `mine` is this rank's contribution (only read); returns whether
/// `result` was written (an exclusive scan leaves rank 0's alone).
pub(super) fn scan(
    b: &mut Builder,
    groups: &[Vec<Rank>],
    mine: Reg,
    result: Reg,
    commutative: bool,
    exclusive: bool,
) -> bool {
    let me = b.me;
    let g = group_of(groups, me);
    let members = &groups[g];
    let l = mine.len;
    let (partial, tmp) = (b.owned(l), b.owned(l));
    b.copy(mine, partial);
    if !exclusive {
        b.copy(mine, result);
    }
    let mut have =
        scan::list_recursive_doubling(b, members, [partial, result, tmp], commutative, exclusive);
    // The group's total, on its last rank.
    let last = members[members.len() - 1];
    let total = b.owned(l);
    if me == last {
        if exclusive {
            b.copy(mine, total);
            if have {
                b.apply(result, total);
            }
        } else {
            b.copy(result, total);
        }
        b.round();
    }
    let lasts: Vec<Rank> = groups.iter().map(|m| m[m.len() - 1]).collect();
    let (prefix, spare) = (b.owned(l), b.owned(l));
    let got = scan::list_recursive_doubling(b, &lasts, [total, prefix, spare], commutative, true);
    b.phase();
    if g > 0 {
        list_bcast(b, members, members.len() - 1, prefix);
        if have {
            b.apply(prefix, result);
        } else {
            b.copy(prefix, result);
            have = true;
        }
        b.round();
    }
    debug_assert!(me != last || g == 0 || got);
    have
}

/// Reduce-scatter of `bs`-byte blocks (`acc`: this rank's n blocks, which
/// it may overwrite; `spare`: scratch as long): rank-order reduce of the
/// whole vector inside each group to its lowest rank; each leader sends every
/// other leader that group's members' blocks in one message, folds what
/// arrives in group order and hands each member its block (into `out`).
pub(super) fn reduce_scatter_block(
    b: &mut Builder,
    t: &Tiers,
    acc: Reg,
    spare: Reg,
    bs: usize,
    out: Reg,
) {
    let groups = &t.groups;
    let me = b.me;
    let my = group_of(groups, me);
    let r = group_reduce(b, &t.nodes[my], acc, spare, true);
    b.phase();
    let l = groups[my][0];
    if me != l {
        b.recv(l, 1, out);
        b.round();
        return;
    }
    // Group h's members' blocks of this group's partial, packed.
    let mut packs = Vec::with_capacity(groups.len());
    for members in groups {
        let pack = if consecutive(members) {
            r.at(members[0] as usize * bs, members.len() * bs)
        } else {
            let p = b.owned(members.len() * bs);
            for (j, &m) in members.iter().enumerate() {
                b.copy(r.at(m as usize * bs, bs), p.at(j * bs, bs));
            }
            p
        };
        packs.push(pack);
    }
    b.round();
    let mine_len = groups[my].len() * bs;
    let parts: Vec<Reg> = groups
        .iter()
        .enumerate()
        .map(|(h, members)| {
            if h == my {
                packs[h]
            } else {
                let p = b.owned(mine_len);
                b.recv(members[0], 0, p);
                b.send(members[0], 0, packs[h]);
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
    for (j, &m) in groups[my].iter().enumerate() {
        if m == me {
            b.copy(res.at(j * bs, bs), out);
        } else {
            b.send(m, 1, res.at(j * bs, bs));
        }
    }
    b.round();
}

/// All-gather of blocks of different lengths (`blocks[r]`: where rank r's
/// block goes): each group's lowest rank collects its members' blocks, the
/// leaders exchange one message per pair, and each leader broadcasts the
/// whole packed set inside its group, where every rank unpacks it. The
/// packed copy keeps the gaps between the user's blocks untouched.
pub(super) fn all_gather_varcount(
    b: &mut Builder,
    groups: &[Vec<Rank>],
    mine: Reg,
    blocks: &[Reg],
) {
    let me = b.me;
    let my = group_of(groups, me);
    let l = groups[my][0];
    // Offset of every rank's block in the packed set (group after group)
    // and of every group's part.
    let mut at = vec![0; b.n as usize];
    let mut part = Vec::with_capacity(groups.len());
    let mut total = 0;
    for members in groups {
        let start = total;
        for &m in members {
            at[m as usize] = total;
            total += blocks[m as usize].len;
        }
        part.push((start, total - start));
    }
    let all = b.owned(total);
    let slot = |r: Rank| all.at(at[r as usize], blocks[r as usize].len);
    b.phase();
    collect(b, &groups[my], l, mine, |j| slot(groups[my][j]));
    b.round();
    b.phase();
    if me == l {
        let own = all.at(part[my].0, part[my].1);
        for (h, members) in groups.iter().enumerate().filter(|&(h, _)| h != my) {
            b.send(members[0], 0, own);
            b.recv(members[0], 0, all.at(part[h].0, part[h].1));
        }
        b.round();
    }
    b.phase();
    list_bcast(b, &groups[my], 0, all);
    for (r, &blk) in blocks.iter().enumerate() {
        b.copy(slot(r as Rank), blk);
    }
    b.round();
}
