//! Threads: with `Threading::Multiple` every thread may call the library at once. Here each
//! of four threads of rank 0 talks to rank 1's thread of the same number, on its own tag.
//!
//! `metampi run -n 2 target/release/examples/threads`

use metampi::traits::*;
use metampi::Threading;

const THREADS: i32 = 4;

fn main() {
    let (universe, level) =
        metampi::initialize_with_threading(Threading::Multiple).expect("initialize once");
    assert_eq!(level, Threading::Multiple);
    let world = universe.world();
    if world.size() < 2 {
        eprintln!("threads needs 2 ranks");
        return;
    }
    let rank = world.rank();
    if rank > 1 {
        return;
    }
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let world = &world;
            s.spawn(move || {
                let peer = world.process_at_rank(1 - rank);
                for round in 0..100u32 {
                    if rank == 0 {
                        peer.send_with_tag(&(round * 10 + t as u32), t);
                        let (back, _) = peer.receive_with_tag::<u32>(t);
                        assert_eq!(back, round * 10 + t as u32 + 1);
                    } else {
                        let (v, _) = peer.receive_with_tag::<u32>(t);
                        assert_eq!(v % 10, t as u32, "thread {t} got another thread's message");
                        peer.send_with_tag(&(v + 1), t);
                    }
                }
            });
        }
    });
    if rank == 0 {
        println!("{THREADS} threads exchanged 100 messages each, none crossed");
    }
}
