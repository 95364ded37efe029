//! All-reduce (MPI-1.2 §4.9.5): recursive doubling, Rabenseifner's
//! reduce-scatter + all-gather, and reduce + broadcast.

#![forbid(unsafe_code)]

use super::schedule::{Builder, Reg};
use super::{bcast, reduce};
use crate::Rank;

/// Label of the message that returns the result to a folded-out rank.
const UNFOLD: u32 = 255;

pub(super) fn prev_pow2(n: Rank) -> Rank {
    1 << (31 - (n as u32).leading_zeros())
}

/// The non-power-of-two fold (MPICH): of the first `2 * rem` ranks the even
/// ones hand their vector to their odd neighbour and sit out; the others
/// renumber to `0..p2`. Returns this rank's new number, if it takes part.
fn fold_in(b: &mut Builder, acc: Reg, tmp: Reg, rem: Rank) -> Option<Rank> {
    let me = b.me;
    if me >= 2 * rem {
        return Some(me - rem);
    }
    if me % 2 == 0 {
        b.send(me + 1, 0, acc);
        b.round();
        return None;
    }
    b.recv(me - 1, 0, tmp);
    b.round();
    // The even neighbour holds the lower rank: acc = x[me-1] ∘ x[me].
    b.apply(tmp, acc);
    Some(me / 2)
}

fn fold_out(b: &mut Builder, acc: Reg, rem: Rank) {
    let me = b.me;
    if me < 2 * rem {
        if me % 2 == 1 {
            b.send(me - 1, UNFOLD, acc);
        } else {
            b.recv(me + 1, UNFOLD, acc);
        }
        b.round();
    }
}

/// The world rank behind new number `q`.
fn real(q: Rank, rem: Rank) -> Rank {
    if q < rem {
        2 * q + 1
    } else {
        q + rem
    }
}

/// Recursive doubling: log2 p2 exchanges of the whole vector. Each rank's
/// vector always covers a block of consecutive ranks, and the lower block is
/// put first, so non-commutative operations are applied in rank order.
/// Returns where the result lies (`acc` or `tmp`).
pub(super) fn recursive_doubling(
    b: &mut Builder,
    mut acc: Reg,
    mut tmp: Reg,
    commutative: bool,
) -> Reg {
    let n = b.n;
    b.phase();
    let p2 = prev_pow2(n);
    let rem = n - p2;
    if let Some(nr) = fold_in(b, acc, tmp, rem) {
        let mut pending: Option<bool> = None;
        let (mut mask, mut k) = (1, 1);
        while mask < p2 {
            let q = nr ^ mask;
            if let Some(lower) = pending.take() {
                combine(b, &mut acc, &mut tmp, lower, commutative);
            }
            b.send(real(q, rem), k, acc);
            b.recv(real(q, rem), k, tmp);
            b.round();
            pending = Some(q < nr);
            mask <<= 1;
            k += 1;
        }
        if let Some(lower) = pending {
            combine(b, &mut acc, &mut tmp, lower, commutative);
            b.round();
        }
    }
    fold_out(b, acc, rem);
    acc
}

/// Combines the partner's vector (`tmp`) into ours, lower ranks first.
fn combine(b: &mut Builder, acc: &mut Reg, tmp: &mut Reg, partner_lower: bool, commutative: bool) {
    if partner_lower || commutative {
        b.apply(*tmp, *acc);
    } else {
        b.apply(*acc, *tmp);
        std::mem::swap(acc, tmp);
    }
}

/// Rabenseifner: reduce-scatter by recursive halving (each step exchanges
/// half of the remaining range), then all-gather by recursive doubling. Each
/// rank moves about 2 × the vector instead of log2 n × the vector.
/// Commutative operations only (halving pairs ranks that are not adjacent).
/// `es` is the element size: pieces split between elements. Result in `acc`.
pub(super) fn rabenseifner(b: &mut Builder, acc: Reg, tmp: Reg, es: usize) -> Reg {
    let n = b.n;
    b.phase();
    let p2 = prev_pow2(n);
    let rem = n - p2;
    if let Some(nr) = fold_in(b, acc, tmp, rem) {
        let elems = acc.len / es.max(1);
        let off = |i: Rank| (elems * i as usize / p2 as usize) * es;
        let piece = |a: Rank, z: Rank| acc.at(off(a), off(z) - off(a));
        let (mut lo, mut hi) = (0, p2);
        let (mut mask, mut k) = (p2 >> 1, 1);
        let mut pending: Option<Reg> = None;
        while mask > 0 {
            let q = nr ^ mask;
            let mid = (lo + hi) / 2;
            let (keep, give) = if nr & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            if let Some(r) = pending.take() {
                b.apply(tmp.at(0, r.len), r);
            }
            let kept = piece(keep.0, keep.1);
            b.send(real(q, rem), k, piece(give.0, give.1));
            b.recv(real(q, rem), k, tmp.at(0, kept.len));
            b.round();
            pending = Some(kept);
            (lo, hi) = keep;
            mask >>= 1;
            k += 1;
        }
        if let Some(r) = pending.take() {
            b.apply(tmp.at(0, r.len), r);
        }
        let mut mask = 1;
        while mask < p2 {
            let q = nr ^ mask;
            let (mine, theirs) = (nr & !(mask - 1), q & !(mask - 1));
            b.send(real(q, rem), k, piece(mine, mine + mask));
            b.recv(real(q, rem), k, piece(theirs, theirs + mask));
            b.round();
            mask <<= 1;
            k += 1;
        }
        b.round();
    }
    fold_out(b, acc, rem);
    acc
}

/// Binomial reduction to rank 0 (rank order), then binomial broadcast.
pub(super) fn reduce_bcast(b: &mut Builder, acc: Reg, tmp: Reg, commutative: bool) -> Reg {
    let r = reduce::binomial(b, 0, acc, tmp, commutative);
    let target = if b.me == 0 { r } else { acc };
    bcast::binomial(b, 0, target);
    target
}
