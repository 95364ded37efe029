//! Gather and scatter (MPI-1.2 §4.5, §4.6): binomial trees for short blocks,
//! linear for long ones and for the varcount forms. Across meta hosts
//! `hier` serves both, the blocking varcount forms included.

#![forbid(unsafe_code)]

use super::bcast::{span, subtree};
use super::schedule::{Builder, Reg};
use crate::Rank;

/// Binomial gather of `bs`-byte blocks to `root`: each rank collects its
/// subtree's blocks (consecutive relative ranks) and sends them up at once.
/// `out` is the root's destination (`n * bs` bytes in rank order).
pub(super) fn gather_binomial(b: &mut Builder, root: Rank, mine: Reg, bs: usize, out: Option<Reg>) {
    let (n, me) = (b.n, b.me);
    b.phase();
    let rel = (me - root + n) % n;
    let abs = |x: Rank| (x + root) % n;
    let low = span(rel, n);
    let sub = subtree(rel, n) as usize;
    if rel != 0 && sub == 1 {
        b.send(abs(rel - low), 0, mine);
        b.round();
        return;
    }
    let out = out.filter(|_| rel == 0);
    // The root with rank 0 collects in place; others need relative order.
    let space = match out {
        Some(o) if root == 0 => o.at(0, sub * bs),
        _ => b.owned(sub * bs),
    };
    b.copy_fit(mine, space.at(0, bs));
    let mut m = 1;
    while m < low && rel + m < n {
        let c = rel + m;
        b.recv(
            abs(c),
            0,
            space.at(m as usize * bs, subtree(c, n) as usize * bs),
        );
        m <<= 1;
    }
    b.round();
    if rel != 0 {
        b.send(abs(rel - low), 0, space);
        b.round();
    } else if let Some(o) = out.filter(|_| root != 0) {
        // Relative block i belongs to rank (i + root) mod n.
        let (r, k) = (root as usize * bs, (n - root) as usize * bs);
        b.copy(space.at(0, k), o.at(r, k));
        b.copy(space.at(k, r), o.at(0, r));
        b.round();
    }
}

/// Binomial scatter of `bs`-byte blocks from `root` (`src`, at the root:
/// `n * bs` bytes in rank order); this rank's block lands in `out`.
pub(super) fn scatter_binomial(b: &mut Builder, root: Rank, src: Option<Reg>, bs: usize, out: Reg) {
    let (n, me) = (b.n, b.me);
    b.phase();
    let rel = (me - root + n) % n;
    let abs = |x: Rank| (x + root) % n;
    let low = span(rel, n);
    let sub = subtree(rel, n) as usize;
    let space = if rel == 0 {
        let src = match src {
            Some(s) => s.at(0, n as usize * bs),
            None => b.owned(n as usize * bs),
        };
        if root == 0 {
            src
        } else {
            let t = b.owned(n as usize * bs);
            let (r, k) = (root as usize * bs, (n - root) as usize * bs);
            b.copy(src.at(r, k), t.at(0, k));
            b.copy(src.at(0, r), t.at(k, r));
            t
        }
    } else if sub == 1 {
        b.recv(abs(rel - low), 0, out);
        b.round();
        return;
    } else {
        let t = b.owned(sub * bs);
        b.recv(abs(rel - low), 0, t);
        b.round();
        t
    };
    b.copy_fit(space.at(0, bs), out);
    let mut m = low >> 1;
    while m > 0 {
        let c = rel + m;
        if c < n {
            b.send(
                abs(c),
                0,
                space.at(m as usize * bs, subtree(c, n) as usize * bs),
            );
        }
        m >>= 1;
    }
    b.round();
}

/// Every rank sends its block to the root, which receives them all at once
/// into `blocks` (one region per rank, sizes may differ).
pub(super) fn gather_linear(b: &mut Builder, root: Rank, mine: Reg, blocks: Option<&[Reg]>) {
    let (n, me) = (b.n, b.me);
    b.phase();
    match blocks.filter(|_| me == root) {
        Some(blocks) => {
            for r in 0..n {
                if r == me {
                    b.copy_fit(mine, blocks[r as usize]);
                } else {
                    b.recv(r, 0, blocks[r as usize]);
                }
            }
        }
        None => b.send(root, 0, mine),
    }
    b.round();
}

/// The root sends each rank its block (`blocks`, one region per rank).
pub(super) fn scatter_linear(b: &mut Builder, root: Rank, blocks: Option<&[Reg]>, out: Reg) {
    let (n, me) = (b.n, b.me);
    b.phase();
    match blocks.filter(|_| me == root) {
        Some(blocks) => {
            for r in 0..n {
                if r == me {
                    b.copy_fit(blocks[r as usize], out);
                } else {
                    b.send(r, 0, blocks[r as usize]);
                }
            }
        }
        None => b.recv(root, 0, out),
    }
    b.round();
}
