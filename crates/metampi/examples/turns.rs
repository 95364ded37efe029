//! Ranks take turns computing for a while before an 8-byte all-reduce, the
//! others waiting in it: the cost of waiting (spinning, or sleeping and being
//! woken) per iteration, for waits of 50 µs to 3 ms. `bench/turns.sh` runs it
//! beside the same program in C under MPICH or Open MPI.
//!
//!     metampi run -n 2 target/release/examples/turns
use metampi::collective::SystemOperation;
use metampi::traits::*;
use std::time::Instant;

fn compute_for(us: f64) {
    let t = Instant::now();
    while t.elapsed().as_secs_f64() * 1e6 < us {
        std::hint::spin_loop();
    }
}

fn main() {
    let universe = metampi::initialize().unwrap();
    let world = universe.world();
    let (me, n) = (world.rank() as usize, world.size() as usize);
    for work in [50.0, 150.0, 300.0, 1000.0, 3000.0] {
        let iters = (200_000.0 / work) as usize;
        world.barrier();
        let t0 = metampi::time();
        for i in 0..iters {
            if i % n == me {
                compute_for(work);
            }
            let mut sum = 0.0f64;
            world.all_reduce_into(&1.0f64, &mut sum, SystemOperation::sum());
            assert_eq!(sum, n as f64);
        }
        let per = (metampi::time() - t0) / iters as f64 * 1e6;
        if me == 0 {
            println!(
                "work {work:6.0} us  iteration {per:8.1} us  overhead {:6.1} us",
                per - work
            );
        }
    }
}
