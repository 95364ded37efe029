//! Nonblocking operations: a halo exchange on a ring that computes the interior while the
//! boundary values travel (requests in a scope, which the borrow checker holds to the
//! buffers' lifetimes), then owned operations awaited as futures.
//!
//! `metampi run -n 4 target/release/examples/nonblocking`

use metampi::request::{scope, WaitGuard};
use metampi::traits::*;

const N: usize = 1000;

fn main() {
    let universe = metampi::initialize().expect("initialize once");
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let left = world.process_at_rank((rank + size - 1) % size);
    let right = world.process_at_rank((rank + 1) % size);

    // This rank's stripe of a field, and one ghost value from each neighbour.
    let field: Vec<f64> = (0..N).map(|i| (rank as usize * N + i) as f64).collect();
    let (mut from_left, mut from_right) = (0.0f64, 0.0f64);
    let mut smoothed = vec![0.0f64; N];
    scope(|sc| {
        let _a = WaitGuard::from(left.immediate_receive_into(sc, &mut from_left));
        let _b = WaitGuard::from(right.immediate_receive_into(sc, &mut from_right));
        let _c = WaitGuard::from(right.immediate_send(sc, &field[N - 1]));
        let _d = WaitGuard::from(left.immediate_send(sc, &field[0]));
        // The interior needs no neighbour: it is computed while the messages travel.
        for i in 1..N - 1 {
            smoothed[i] = (field[i - 1] + field[i] + field[i + 1]) / 3.0;
        }
        // Leaving the scope waits for all four.
    });
    smoothed[0] = (from_left + field[0] + field[1]) / 3.0;
    smoothed[N - 1] = (field[N - 2] + field[N - 1] + from_right) / 3.0;
    let left_end = ((rank + size - 1) % size) as usize * N + N - 1;
    assert_eq!(from_left, left_end as f64);

    // Owned buffers need no scope: the futures own them until they complete.
    let send = right.immediate_send_owned(vec![rank; 3], 7);
    let recv = left.immediate_receive_vec::<i32>();
    // The send's future gives the vector back once it is sent.
    let (sent, (got, status)) = futures_executor::block_on(async {
        let sent = send.await.expect("send");
        (sent, recv.await.expect("receive"))
    });
    assert_eq!(sent, vec![rank; 3]);
    assert_eq!(got, vec![status.source_rank(); 3]);
    if rank == 0 {
        println!(
            "halo exchanged on {size} ranks (ghosts {from_left} and {from_right}); futures done"
        );
    }
}
