//! Blocking point-to-point: a token passed round a ring, then every rank reports to rank 0,
//! which takes the reports in whatever order they come (a wildcard receive) and tells them
//! apart by tag.
//!
//! `metampi run -n 4 target/release/examples/point_to_point`

use metampi::traits::*;

const TOKEN: i32 = 1;
const REPORT: i32 = 2;

fn main() {
    let universe = metampi::initialize().expect("initialize once");
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let next = world.process_at_rank((rank + 1) % size);
    let prev = world.process_at_rank((rank + size - 1) % size);

    // The ring: rank 0 starts the token, everyone adds its rank and passes it on.
    if rank == 0 {
        next.send_with_tag(&0u64, TOKEN);
        let (token, _) = prev.receive_with_tag::<u64>(TOKEN);
        let expected = (0..size as u64).sum::<u64>();
        assert_eq!(token, expected);
        println!("token went round {size} ranks: {token}");
    } else {
        let (token, _) = prev.receive_with_tag::<u64>(TOKEN);
        next.send_with_tag(&(token + rank as u64), TOKEN);
    }

    // Reports: a vector of any length from each other rank, in arrival order.
    if rank == 0 {
        let mut seen = vec![false; size as usize];
        for _ in 1..size {
            let (report, status) = world.any_process().receive_vec_with_tag::<f64>(REPORT);
            let from = status.source_rank();
            assert_eq!(report.len(), from as usize);
            seen[from as usize] = true;
        }
        assert!(seen[1..].iter().all(|&s| s));
        println!("reports from {} ranks", size - 1);
    } else {
        let report: Vec<f64> = (0..rank).map(|i| i as f64 * 0.5).collect();
        world.process_at_rank(0).send_with_tag(&report[..], REPORT);
    }
}
