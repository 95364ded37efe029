//! Many senders drain into one receiver: the SC99 case (seed 000), where 256
//! clients on one site sent through a slow wide-area link and a router ran
//! out of buffer space. Every rank but the last sends `MESSAGES` messages of
//! `BYTES` bytes (arguments 1 and 2; default 4 of 16 KiB) to the last rank,
//! which receives them from any source and checks every sender's count.
//!
//! ```sh
//! bash bench/sc99.sh          # 256 senders through an emulated 2 Mbit/s link
//! ```

use metampi as mpi;
use mpi::traits::*;

fn main() {
    let universe = mpi::initialize().expect("initialized once");
    let world = universe.world();
    let mut args = std::env::args().skip(1);
    let messages: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let bytes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(16 << 10);
    let (rank, size) = (world.rank(), world.size());
    let sink = size - 1;
    let t0 = mpi::time();
    if rank == sink {
        let mut got = vec![0usize; size as usize];
        for _ in 0..messages * (size as usize - 1) {
            let (m, st) = world.any_process().receive_vec::<u8>();
            assert_eq!(m.len(), bytes);
            assert!(m.iter().all(|&b| b == st.source_rank() as u8));
            got[st.source_rank() as usize] += 1;
        }
        assert!(got[..sink as usize].iter().all(|&c| c == messages));
        let secs = mpi::time() - t0;
        let total = messages * bytes * (size as usize - 1);
        println!(
            "fanin: {} senders x {messages} x {bytes} B = {:.1} MB in {secs:.1} s ({:.3} MB/s)",
            size - 1,
            total as f64 / 1e6,
            total as f64 / 1e6 / secs
        );
    } else {
        let m = vec![rank as u8; bytes];
        for _ in 0..messages {
            world.process_at_rank(sink).send(&m[..]);
        }
    }
    world.barrier();
}
