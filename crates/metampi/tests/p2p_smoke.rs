use metampi::testing::Ranks;
use metampi::traits::*;

#[test]
fn p2p_smoke_ring() {
    Ranks::new(2).run("p2p_smoke_ring", |world| {
        let r = world.rank();
        let n = world.size();
        let next = world.process_at_rank((r + 1) % n);
        let prev = world.process_at_rank((r + n - 1) % n);
        let (got, st) = metampi::point_to_point::send_receive::<i32, _, _, _>(&(r * 7), &next, &prev);
        assert_eq!(got, ((r + n - 1) % n) * 7);
        assert_eq!(st.source_rank(), (r + n - 1) % n);
        let big: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
        if r == 0 {
            world.process_at_rank(1).send(&big[..]);
        } else {
            let (v, _) = world.process_at_rank(0).receive_vec::<u8>();
            assert_eq!(v, big);
        }
        world.barrier();
    });
}
