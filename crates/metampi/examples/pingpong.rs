//! Ping-pong latency and streaming bandwidth between ranks 0 and 1.
//!
//! `metampi run -n 2 target/release/examples/pingpong [LAT_BYTES] [BW_BYTES]`
//! prints one line per measurement: `latency_us <bytes> <one-way µs>` and
//! `bandwidth_MBps <bytes> <MB/s>` (the same format as `bench/c/pingpong.c`).

use metampi::traits::*;

fn main() {
    let universe = metampi::initialize().expect("initialize once");
    let world = universe.world();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let lat_bytes = args.first().copied().unwrap_or(8);
    let bw_bytes = args.get(1).copied().unwrap_or(4 << 20);
    if world.size() < 2 {
        eprintln!("pingpong needs 2 ranks");
        return;
    }
    let r = world.rank();
    if r > 1 {
        // Match the three barriers of ranks 0 and 1.
        for _ in 0..3 {
            world.barrier();
        }
        return;
    }
    let peer = world.process_at_rank(1 - r);

    // Latency: half the round-trip time, median of repeated batches.
    let mut buf = vec![0u8; lat_bytes];
    let iters = 20_000;
    let mut samples = Vec::new();
    world.barrier();
    for batch in 0..6 {
        let t0 = metampi::time();
        for _ in 0..iters {
            if r == 0 {
                peer.send(&buf[..]);
                peer.receive_into(&mut buf[..]);
            } else {
                peer.receive_into(&mut buf[..]);
                peer.send(&buf[..]);
            }
        }
        let dt = metampi::time() - t0;
        if batch > 0 {
            samples.push(dt / iters as f64 / 2.0 * 1e6);
        }
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    if r == 0 {
        println!("latency_us {lat_bytes} {:.3}", samples[samples.len() / 2]);
    }

    // Bandwidth: a window of nonblocking sends, then a one-byte acknowledgement.
    let window = 16;
    let data = vec![1u8; bw_bytes];
    let mut sink = vec![vec![0u8; bw_bytes]; window];
    let reps = (256 << 20) / bw_bytes.max(1) / window + 2;
    let mut best = 0f64;
    world.barrier();
    for rep in 0..reps {
        let t0 = metampi::time();
        if r == 0 {
            metampi::request::scope(|scope| {
                let reqs: Vec<_> = (0..window)
                    .map(|_| peer.immediate_send(scope, &data[..]))
                    .collect();
                for q in reqs {
                    q.wait();
                }
            });
            let _ = peer.receive::<u8>();
        } else {
            metampi::request::scope(|scope| {
                let reqs: Vec<_> = sink
                    .iter_mut()
                    .map(|b| peer.immediate_receive_into(scope, &mut b[..]))
                    .collect();
                for q in reqs {
                    q.wait();
                }
            });
            peer.send(&0u8);
        }
        let dt = metampi::time() - t0;
        if rep > 0 {
            best = best.max((window * bw_bytes) as f64 / dt / 1e6);
        }
    }
    if r == 0 {
        println!("bandwidth_MBps {bw_bytes} {best:.1}");
    }
    world.barrier();
}
