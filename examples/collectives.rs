//! Collectives: a broadcast of parameters, each rank's share of a sum, the total on every
//! rank, the parts gathered at the root, a scatter of work and an all-to-all exchange.
//!
//! `metampi run -n 4 target/release/examples/collectives`

use metampi::collective::SystemOperation;
use metampi::traits::*;

fn main() {
    let universe = metampi::initialize().expect("initialize once");
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size() as usize);
    let root = world.process_at_rank(0);

    // Rank 0 decides the problem; everyone learns it.
    let mut n = if rank == 0 { 1_000_000u64 } else { 0 };
    root.broadcast_into(&mut n);

    // Each rank sums its stripe of 1..=n; the total lands on every rank.
    let mine: u64 = (1..=n).skip(rank as usize).step_by(size).sum();
    let mut total = 0u64;
    world.all_reduce_into(&mine, &mut total, SystemOperation::sum());
    assert_eq!(total, n * (n + 1) / 2);

    // The root sees every share.
    if rank == 0 {
        let mut shares = vec![0u64; size];
        root.gather_into_root(&mine, &mut shares[..]);
        assert_eq!(shares.iter().sum::<u64>(), total);
        println!("sum of 1..={n} = {total}, shares {shares:?}");
    } else {
        root.gather_into(&mine);
    }

    // The root hands out one work item per rank.
    let mut item = 0u32;
    if rank == 0 {
        let items: Vec<u32> = (0..size as u32).map(|i| 100 + i).collect();
        root.scatter_into_root(&items[..], &mut item);
    } else {
        root.scatter_into(&mut item);
    }
    assert_eq!(item, 100 + rank as u32);

    // Every rank sends rank*100+j to rank j.
    let out: Vec<u32> = (0..size as u32).map(|j| rank as u32 * 100 + j).collect();
    let mut got = vec![0u32; size];
    world.all_to_all_into(&out[..], &mut got[..]);
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, &v)| v == i as u32 * 100 + rank as u32));
    if rank == 0 {
        println!("scatter and all-to-all checked on {size} ranks");
    }
}
