//! Reduce and reduce-scatter-block (MPI-1.2 §4.9, MPI-2.2 §5.10): binomial
//! trees that combine in rank order, linear baselines, pairwise exchange.

#![forbid(unsafe_code)]

use super::bcast::span;
use super::gather;
use super::schedule::{Builder, Reg};
use crate::Rank;

/// Binomial reduction to `root`; returns where the root's result lies.
/// `acc` holds this rank's contribution (it is overwritten), `spare` is
/// scratch of the same length.
///
/// A binomial tree over relative ranks combines blocks of consecutive
/// relative ranks, so with a non-commutative operation it runs towards rank 0
/// (true rank order) and the result then travels to the root.
pub(super) fn binomial(
    b: &mut Builder,
    root: Rank,
    acc: Reg,
    spare: Reg,
    commutative: bool,
) -> Reg {
    if commutative || root == 0 {
        return tree(b, root, acc, spare);
    }
    let r = tree(b, 0, acc, spare);
    b.phase();
    if b.me == 0 {
        b.send(root, 0, r);
    } else if b.me == root {
        b.recv(0, 0, acc);
    }
    b.round();
    if b.me == root {
        acc
    } else {
        r
    }
}

/// After each child's block arrives, `acc = acc ∘ child` (the child holds
/// the higher relative ranks); then the whole block goes to the parent.
fn tree(b: &mut Builder, root: Rank, mut acc: Reg, mut tmp: Reg) -> Reg {
    let (n, me) = (b.n, b.me);
    b.phase();
    let rel = (me - root + n) % n;
    let abs = |x: Rank| (x + root) % n;
    let mut pending = false;
    let low = span(rel, n);
    let mut mask = 1;
    while mask < low && rel + mask < n {
        fold(b, &mut pending, &mut acc, &mut tmp);
        b.recv(abs(rel + mask), 0, tmp);
        b.round();
        pending = true;
        mask <<= 1;
    }
    fold(b, &mut pending, &mut acc, &mut tmp);
    if rel != 0 {
        b.send(abs(rel - low), 0, acc);
    }
    b.round();
    acc
}

/// Folds a child's block that has arrived in `tmp` into `acc`.
fn fold(b: &mut Builder, pending: &mut bool, acc: &mut Reg, tmp: &mut Reg) {
    if std::mem::take(pending) {
        b.apply(*acc, *tmp);
        std::mem::swap(acc, tmp);
    }
}

/// The root receives every contribution and folds them in rank order.
pub(super) fn linear(b: &mut Builder, root: Rank, mine: Reg) -> Reg {
    let (n, me) = (b.n, b.me);
    b.phase();
    if me != root {
        b.send(root, 0, mine);
        b.round();
        return mine;
    }
    let l = mine.len;
    let all = b.owned(n as usize * l);
    let blk = |r: Rank| all.at(r as usize * l, l);
    for r in 0..n {
        if r == me {
            b.copy(mine, blk(r));
        } else {
            b.recv(r, 0, blk(r));
        }
    }
    b.round();
    for j in (0..n - 1).rev() {
        b.apply(blk(j), blk(n - 1));
    }
    b.round();
    blk(n - 1)
}

/// Reduce-scatter by pairwise exchange: in step s each rank sends block
/// `rank + s` of its input to that rank; then it folds the n contributions to
/// its own block in rank order. Returns the region with this rank's block.
pub(super) fn pairwise(b: &mut Builder, mine: Reg, bs: usize) -> Reg {
    let (n, me) = (b.n, b.me);
    b.phase();
    let all = b.owned(n as usize * bs);
    let blk = |r: Rank| all.at(r as usize * bs, bs);
    b.copy(mine.at(me as usize * bs, bs), blk(me));
    for s in 1..n {
        let (to, from) = ((me + s) % n, (me - s + n) % n);
        b.send(to, s as u32, mine.at(to as usize * bs, bs));
        b.recv(from, s as u32, blk(from));
        b.round();
    }
    for j in (0..n - 1).rev() {
        b.apply(blk(j), blk(n - 1));
    }
    b.round();
    blk(n - 1)
}

/// Reduce-scatter as a rank-order binomial reduction to rank 0 and a
/// binomial scatter of the blocks. `acc` is a writable copy of the input,
/// `spare` scratch of its length; this rank's block lands in `out`.
pub(super) fn reduce_then_scatter(
    b: &mut Builder,
    acc: Reg,
    spare: Reg,
    bs: usize,
    out: Reg,
    commutative: bool,
) {
    let r = binomial(b, 0, acc, spare, commutative);
    gather::scatter_binomial(b, 0, (b.me == 0).then_some(r), bs, out);
}
