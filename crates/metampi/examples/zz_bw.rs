use metampi::traits::*;
fn main() {
    let universe = metampi::initialize().unwrap();
    let world = universe.world();
    let me = world.rank();
    let peer = world.process_at_rank(1 - me);
    let sbuf = [1u8; 8];
    let mut wins = vec![[0u8; 8]; 32];
    let iters: usize = std::env::var("IT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    for _ in 0..iters {
        if me == 0 {
            metampi::request::scope(|s| {
                let reqs: Vec<_> = (0..32).map(|_| peer.immediate_send(s, &sbuf[..])).collect();
                for r in reqs {
                    r.wait();
                }
            });
            let _ = peer.receive::<u8>();
        } else {
            metampi::request::scope(|s| {
                let reqs: Vec<_> = wins
                    .iter_mut()
                    .map(|w| peer.immediate_receive_into(s, &mut w[..]))
                    .collect();
                for r in reqs {
                    r.wait();
                }
            });
            peer.send(&0u8);
        }
    }
}
