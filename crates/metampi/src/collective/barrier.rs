//! Barrier (MPI-1.2 §4.3): dissemination, ⌈log2 n⌉ rounds.

#![forbid(unsafe_code)]

use super::schedule::Builder;

/// In round k every rank sends an empty message to `rank + 2^k` and waits
/// for one from `rank - 2^k` (Hensgen, Finkel and Manber).
pub(super) fn dissemination(b: &mut Builder) {
    let (n, me) = (b.n, b.me);
    b.phase();
    let empty = b.owned(0);
    let (mut k, mut step) = (1, 0);
    while k < n {
        b.send((me + k) % n, step, empty);
        b.recv((me - k + n) % n, step, empty);
        b.round();
        k <<= 1;
        step += 1;
    }
}
