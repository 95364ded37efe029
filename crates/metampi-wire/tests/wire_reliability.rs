//! Exactly-once, in-order, intact delivery over a faulty simulated network.

mod common;

use std::time::{Duration, Instant};

use common::{config, mixed_len, pair_links, test_message, Faults, Net, PipeConfig};
use metampi_wire::{CloseReason, Compression, Event, Link, Message, SendError};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn workload(net: &mut Net<Link>, seed: u64, per_side: u32, max_len: usize, spread: Duration) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    for side in 0..2u32 {
        for i in 0..per_side {
            let at =
                net.start + spread.mul_f64(rng.gen::<f64>() * f64::from(i) / f64::from(per_side));
            let len = mixed_len(&mut rng, max_len);
            let m = test_message(&mut rng, side, i, len);
            net.queue(side as usize, at, m);
        }
    }
}

fn faulty(faults: Faults) -> PipeConfig {
    PipeConfig {
        latency: Duration::from_millis(3),
        bandwidth: Some(20_000_000),
        faults,
    }
}

fn run_with(faults: Faults, seed: u64) -> Net<Link> {
    let t0 = Instant::now();
    let cfg = config().build().unwrap();
    let mut net = Net::new(t0, pair_links(t0, &cfg), vec![faulty(faults)], seed);
    workload(&mut net, seed, 300, 60_000, Duration::from_millis(200));
    net.run(Duration::from_secs(60));
    net.check_delivery();
    net
}

#[test]
fn clean_network_delivers_both_ways_without_resends() {
    let net = run_with(Faults::default(), 1);
    for s in 0..2 {
        let st = net.ep[s].stats();
        assert_eq!(st.retransmits, 0);
        assert_eq!(st.corrupt_in + st.duplicates_in + st.out_of_order_in, 0);
        assert_eq!(st.records_in, net.ep[1 - s].stats().records_out);
        assert!(st.frames_out < 300, "small messages were bundled: {st:?}");
    }
}

#[test]
fn dropped_chunks_are_resent() {
    let net = run_with(
        Faults {
            drop: 0.05,
            ..Faults::default()
        },
        2,
    );
    let st = net.ep[0].stats();
    assert!(
        st.retransmits > 0 && st.skipped_bytes_in + st.out_of_order_in > 0,
        "{st:?}"
    );
}

#[test]
fn duplicated_chunks_are_dropped() {
    let net = run_with(
        Faults {
            duplicate: 0.2,
            ..Faults::default()
        },
        3,
    );
    assert!(net.ep[1].stats().duplicates_in > 0);
}

#[test]
fn reordered_chunks_are_put_right() {
    let net = run_with(
        Faults {
            reorder: 0.2,
            ..Faults::default()
        },
        4,
    );
    let st = net.ep[1].stats();
    assert!(st.out_of_order_in + st.skipped_bytes_in > 0, "{st:?}");
}

#[test]
fn bit_flips_are_caught_and_resent() {
    let net = run_with(
        Faults {
            corrupt: 0.1,
            split: true,
            ..Faults::default()
        },
        5,
    );
    let (a, b) = (net.ep[0].stats(), net.ep[1].stats());
    assert!(a.corrupt_in + b.corrupt_in > 0);
    assert!(a.retransmits + b.retransmits > 0);
    assert!(
        a.nacks_in + b.nacks_in > 0,
        "gaps were reported, not only timed out"
    );
}

#[test]
fn everything_at_once() {
    run_with(
        Faults {
            drop: 0.03,
            duplicate: 0.05,
            reorder: 0.05,
            corrupt: 0.03,
            split: true,
            lose_bytes: 0.03,
        },
        6,
    );
}

#[test]
fn lost_tail_is_recovered_without_further_traffic() {
    // One message, its only frame lost: nothing else will ever reveal the gap, so the
    // retransmission timer must.
    let t0 = Instant::now();
    let cfg = config().build().unwrap();
    let mut net = Net::new(t0, pair_links(t0, &cfg), vec![PipeConfig::default()], 7);
    let mut rng = StdRng::seed_from_u64(7);
    net.queue(0, t0, test_message(&mut rng, 0, 0, 100));
    // Let the credit announcements pass, then lose the data frame.
    while net.ep[0].stats().records_out == 0 {
        net.step();
    }
    net.lose_in_flight(0, 0);
    net.run(Duration::from_secs(5));
    net.check_delivery();
    assert_eq!(net.ep[0].stats().timeouts, 1);
    assert_eq!(net.ep[0].stats().retransmits, 1);
}

#[test]
fn reconnect_resumes_without_loss_or_duplicates() {
    let t0 = Instant::now();
    let cfg = config().build().unwrap();
    let mut net = Net::new(t0, pair_links(t0, &cfg), vec![faulty(Faults::default())], 8);
    workload(&mut net, 8, 400, 100_000, Duration::from_millis(300));
    for (ms, outage) in [(20, 5), (90, 50), (150, 1), (151, 30), (260, 200)] {
        net.cuts.push((
            t0 + Duration::from_millis(ms),
            0,
            Duration::from_millis(outage),
        ));
    }
    net.run(Duration::from_secs(30));
    net.check_delivery();
    let st = net.ep[0].stats();
    assert!(st.reconnects >= 4, "{st:?}");
    assert!(st.retransmits > 0);
}

#[test]
fn outage_beyond_idle_timeout_closes_the_link() {
    let t0 = Instant::now();
    let cfg = config()
        .keepalive(Duration::from_millis(100))
        .idle_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let mut net = Net::new(t0, pair_links(t0, &cfg), vec![PipeConfig::default()], 9);
    let mut rng = StdRng::seed_from_u64(9);
    net.queue(0, t0, test_message(&mut rng, 0, 0, 10));
    net.run(Duration::from_secs(1));
    net.cut(0, Duration::from_secs(3600));
    let t_cut = net.now;
    while !net.side[0]
        .events
        .iter()
        .any(|e| matches!(e, Event::Closed(_)))
    {
        net.step();
        assert!(net.now < t_cut + Duration::from_secs(2), "no close");
    }
    let died = net.now - t_cut;
    assert!(died <= Duration::from_millis(600), "closed after {died:?}");
    assert_eq!(
        net.side[0].events,
        vec![
            Event::LinkDead {
                link: 0,
                reason: CloseReason::IdleTimeout(Duration::from_millis(500))
            },
            Event::Closed(CloseReason::IdleTimeout(Duration::from_millis(500)))
        ]
    );
    let m = Message::default();
    assert_eq!(
        net.ep[0].send_message(net.now, m.clone()),
        Err(SendError::Closed(m))
    );
    assert_eq!(net.ep[0].poll_timeout(), None);
}

#[test]
fn keepalives_keep_an_idle_link_alive() {
    let t0 = Instant::now();
    let cfg = config()
        .keepalive(Duration::from_millis(100))
        .idle_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let mut net = Net::new(t0, pair_links(t0, &cfg), vec![PipeConfig::default()], 10);
    while net.now < t0 + Duration::from_secs(10) {
        net.step();
    }
    assert!(net.side[0].events.is_empty() && net.side[1].events.is_empty());
    let frames = net.ep[0].stats().frames_out;
    assert!((90..=110).contains(&frames), "{frames} keepalives in 10 s");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(256)))]

    /// Whatever the network does short of a permanent outage, every message arrives
    /// exactly once, in order and intact, both ways.
    #[test]
    fn exactly_once_in_order_under_random_faults(
        seed in any::<u64>(),
        drop in 0.0..0.08f64,
        duplicate in 0.0..0.1f64,
        reorder in 0.0..0.1f64,
        corrupt in 0.0..0.08f64,
        split in any::<bool>(),
        per_side in 1u32..120,
        latency_ms in 0u64..20,
        flush_us in prop_oneof![Just(0u64), Just(200), Just(5000)],
        compression in prop_oneof![
            Just(Compression::Off),
            Just(Compression::Lz4),
            Just(common::zstd_or_lz4()),
            Just(Compression::Auto)
        ],
        cuts in proptest::collection::vec((0u64..400, 0u64..100), 0..4),
    ) {
        let t0 = Instant::now();
        let cfg = config()
            .flush_delay(Duration::from_micros(flush_us))
            .compression(compression)
            .window(256 << 10)
            .send_buffer(256 << 10)
            .max_message_len(100_000)
            .build()
            .unwrap();
        let pipe = PipeConfig {
            latency: Duration::from_millis(latency_ms),
            bandwidth: Some(10_000_000),
            faults: Faults {
                drop, duplicate, reorder, corrupt, split, ..Faults::default()
            },
        };
        let mut net = Net::new(t0, pair_links(t0, &cfg), vec![pipe], seed);
        workload(&mut net, seed, per_side, 100_000, Duration::from_millis(300));
        for (at, outage) in cuts {
            net.cuts.push((t0 + Duration::from_millis(at), 0, Duration::from_millis(outage)));
        }
        net.run(Duration::from_secs(120));
        net.check_delivery();
        prop_assert!(net.side[0].events.iter().chain(&net.side[1].events).all(|e| *e == Event::Writable));
    }
}

/// One end without payload checksums: everything still arrives both ways, its peer
/// counts the frames it took unchecked, and it counts none (its peer checks).
#[test]
fn an_end_without_payload_checksums_is_understood() {
    let t0 = Instant::now();
    let unchecked = config().payload_checksum(false).build().unwrap();
    let checked = config().build().unwrap();
    let links = [Link::new(t0, unchecked), Link::new(t0, checked)];
    let mut net = Net::new(t0, links, vec![faulty(Faults::default())], 9);
    workload(&mut net, 9, 200, 60_000, Duration::from_millis(100));
    net.run(Duration::from_secs(60));
    net.check_delivery();
    let (a, b) = (net.ep[0].stats(), net.ep[1].stats());
    assert!(a.frames_out > 0 && b.frames_out > 0);
    assert!(b.unchecked_frames_in > 0, "{b:?}");
    assert!(
        b.unchecked_frames_in < a.frames_out,
        "acknowledgements are not counted"
    );
    assert_eq!(a.unchecked_frames_in, 0);
    assert_eq!(a.corrupt_in + b.corrupt_in, 0);
}
