//! All-gather (MPI-1.2 §4.7): Bruck for short blocks, ring for long ones and
//! for the varcount form.

#![forbid(unsafe_code)]

use super::schedule::{Builder, Reg};

/// Bruck: in step k every rank sends the blocks it has (up to 2^k) to
/// `rank - 2^k` and receives as many from `rank + 2^k`; ⌈log2 n⌉ steps for
/// any n. Blocks arrive rotated by the rank, which a final copy undoes.
pub(super) fn bruck(b: &mut Builder, mine: Reg, bs: usize, out: Reg) {
    let (n, me) = (b.n, b.me);
    b.phase();
    let t = b.owned(n as usize * bs);
    b.copy_fit(mine, t.at(0, bs));
    let (mut d, mut k) = (1, 0);
    while d < n {
        let cnt = d.min(n - d) as usize;
        b.send((me - d + n) % n, k, t.at(0, cnt * bs));
        b.recv((me + d) % n, k, t.at(d as usize * bs, cnt * bs));
        b.round();
        d <<= 1;
        k += 1;
    }
    // Block j of `t` is rank (me + j) mod n's.
    let (r, k) = (me as usize * bs, (n - me) as usize * bs);
    b.copy(t.at(0, k), out.at(r, k));
    b.copy(t.at(k, r), out.at(0, r));
    b.round();
}

/// Ring: in step s every rank passes block `rank - s` to the right and
/// receives block `rank - s - 1` from the left. `blocks` are the
/// destination regions per rank (sizes may differ).
pub(super) fn ring(b: &mut Builder, mine: Reg, blocks: &[Reg]) {
    let (n, me) = (b.n, b.me);
    b.phase();
    b.copy_fit(mine, blocks[me as usize]);
    let (left, right) = ((me + n - 1) % n, (me + 1) % n);
    for s in 0..n - 1 {
        let sb = (me - s + n) % n;
        let rb = (me - s - 1 + 2 * n) % n;
        b.send(right, s as u32, blocks[sb as usize]);
        b.recv(left, s as u32, blocks[rb as usize]);
        b.round();
    }
    b.round();
}
