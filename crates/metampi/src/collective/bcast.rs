//! Broadcast (MPI-1.2 §4.4): binomial tree, scatter + ring all-gather (van de
//! Geijn) for long messages, and linear as a baseline.

#![forbid(unsafe_code)]

use super::schedule::{Builder, Reg};
use crate::Rank;

/// The size of the block of relative ranks a binomial tree gives `rel`:
/// its lowest set bit, or the power of two at or above `n` for the root.
/// `rel`'s children are `rel + m` for the powers of two `m` below it.
pub(super) fn span(rel: Rank, n: Rank) -> Rank {
    if rel == 0 {
        (n.max(1) as u32).next_power_of_two() as Rank
    } else {
        rel & rel.wrapping_neg()
    }
}

/// Number of ranks in `rel`'s subtree (itself included).
pub(super) fn subtree(rel: Rank, n: Rank) -> Rank {
    span(rel, n).min(n - rel)
}

/// Binomial tree from `root`: receive from the parent, then send to the
/// children, largest subtree first.
pub(super) fn binomial(b: &mut Builder, root: Rank, data: Reg) {
    let (n, me) = (b.n, b.me);
    b.phase();
    let rel = (me - root + n) % n;
    let abs = |x: Rank| (x + root) % n;
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

/// Van de Geijn's broadcast: a binomial scatter of n chunks, then a ring
/// all-gather of the chunks. Each rank moves about twice the message instead
/// of log2 n times. Chunks are whole `es`-byte elements (a message between
/// meta hosts of different byte order is converted element by element).
pub(super) fn scatter_allgather(b: &mut Builder, root: Rank, data: Reg, es: usize) {
    let (n, me) = (b.n, b.me);
    b.phase();
    let rel = (me - root + n) % n;
    let abs = |x: Rank| (x + root) % n;
    let len = data.len;
    let es = es.max(1);
    let cs = len.div_ceil(es).div_ceil(n as usize) * es;
    let at = |c: Rank| (c as usize * cs).min(len);
    let chunks = |a: Rank, z: Rank| data.at(at(a), at(z) - at(a));
    let low = span(rel, n);
    if rel != 0 {
        b.recv(abs(rel - low), 0, chunks(rel, rel + subtree(rel, n)));
        b.round();
    }
    let mut m = low >> 1;
    while m > 0 {
        let c = rel + m;
        if c < n {
            b.send(abs(c), 0, chunks(c, c + subtree(c, n)));
        }
        m >>= 1;
    }
    b.round();
    let (left, right) = (abs((rel + n - 1) % n), abs((rel + 1) % n));
    for s in 0..n - 1 {
        let sc = (rel - s + n) % n;
        let rc = (rel - s - 1 + 2 * n) % n;
        b.send(right, 1 + s as u32, chunks(sc, sc + 1));
        b.recv(left, 1 + s as u32, chunks(rc, rc + 1));
        b.round();
    }
}

/// The root sends to every rank itself.
pub(super) fn linear(b: &mut Builder, root: Rank, data: Reg) {
    let (n, me) = (b.n, b.me);
    b.phase();
    if me == root {
        for r in (0..n).filter(|&r| r != root) {
            b.send(r, 0, data);
        }
    } else {
        b.recv(root, 0, data);
    }
    b.round();
}
