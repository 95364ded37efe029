//! All-to-all (MPI-1.2 §4.8): pairwise exchange, or everything at once for
//! short blocks.

#![forbid(unsafe_code)]

use super::schedule::{Builder, Reg};

/// In step s send block `rank + s` and receive from `rank - s`: each rank
/// talks to one peer at a time, so links are not flooded.
pub(super) fn pairwise(b: &mut Builder, send: &[Reg], recv: &[Reg]) {
    let (n, me) = (b.n, b.me);
    b.phase();
    b.copy_fit(send[me as usize], recv[me as usize]);
    for s in 1..n {
        let (to, from) = ((me + s) % n, (me - s + n) % n);
        b.send(to, s as u32, send[to as usize]);
        b.recv(from, s as u32, recv[from as usize]);
        b.round();
    }
    b.round();
}

/// Every send and receive posted at once: one round of latency.
pub(super) fn linear(b: &mut Builder, send: &[Reg], recv: &[Reg]) {
    let (n, me) = (b.n, b.me);
    b.phase();
    b.copy_fit(send[me as usize], recv[me as usize]);
    for s in 1..n {
        let (to, from) = ((me + s) % n, (me - s + n) % n);
        b.recv(from, 0, recv[from as usize]);
        b.send(to, 0, send[to as usize]);
    }
    b.round();
}
