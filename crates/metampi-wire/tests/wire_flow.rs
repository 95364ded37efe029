//! Credit-based flow control: memory stays within the configured windows whatever the
//! sender does, senders get back-pressure, and nothing deadlocks.

mod common;

use std::time::{Duration, Instant};

use common::{config, pair_bundles, pair_links, test_message, Faults, Net, PipeConfig};
use metampi_wire::{Envelope, Event, Link, Message, SendError, INITIAL_CREDIT};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn flood(net: &mut Net<impl common::Endpoint>, seed: u64, n: u32, max_len: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..n {
        let len = rng.gen_range(0..=max_len);
        net.queue(0, net.start, test_message(&mut rng, 0, i, len));
    }
}

#[test]
fn a_slow_receiver_holds_at_most_its_window() {
    let t0 = Instant::now();
    let window = 256 << 10;
    let cfg = config()
        .window(window)
        .send_buffer(window)
        .max_message_len(100_000)
        .build()
        .unwrap();
    let mut net = Net::new(t0, pair_links(t0, &cfg), vec![PipeConfig::default()], 1);
    // The application on side 1 looks at its messages only every 50 ms.
    net.side[1].drain_every = Some(Duration::from_millis(50));
    flood(&mut net, 1, 400, 100_000);
    net.run(Duration::from_secs(60));
    net.check_delivery();
    let (tx, rx) = (&net.side[0], &net.side[1]);
    assert!(
        rx.max_receive_buffered <= window,
        "{}",
        rx.max_receive_buffered
    );
    // The window was the limit that mattered, not something else.
    assert!(
        rx.max_receive_buffered > window / 2,
        "{}",
        rx.max_receive_buffered
    );
    assert!(tx.max_send_buffered <= window);
    assert!(tx.would_block > 0);
    assert!(tx.events.contains(&Event::Writable));
}

#[test]
fn striped_receiver_holds_at_most_one_window_per_link() {
    let t0 = Instant::now();
    let window = 128 << 10;
    let cfg = config()
        .window(window)
        .send_buffer(4 * window)
        .max_message_len(60_000)
        .build()
        .unwrap();
    let pipes = vec![
        PipeConfig {
            latency: Duration::from_millis(1),
            ..PipeConfig::default()
        },
        PipeConfig {
            latency: Duration::from_millis(30),
            ..PipeConfig::default()
        },
        PipeConfig::default(),
    ];
    let mut net = Net::new(t0, pair_bundles(t0, &cfg, 3), pipes, 2);
    net.side[1].drain_every = Some(Duration::from_millis(20));
    flood(&mut net, 2, 500, 60_000);
    net.run(Duration::from_secs(60));
    net.check_delivery();
    assert!(net.side[1].max_receive_buffered <= 3 * window);
    assert!(net.side[0].max_send_buffered <= 4 * window);
}

#[test]
fn would_block_gives_the_message_back_and_writable_follows() {
    let t0 = Instant::now();
    let cfg = config()
        .window(INITIAL_CREDIT)
        .send_buffer(INITIAL_CREDIT)
        .max_message_len(30_000)
        .build()
        .unwrap();
    let mut a = Link::new(t0, cfg.clone());
    let big = |tag| {
        Message::new(
            Envelope {
                tag,
                ..Envelope::default()
            },
            vec![1u8; 30_000],
        )
    };
    a.send_message(t0, big(1)).unwrap();
    a.send_message(t0, big(2)).unwrap();
    assert_eq!(
        a.send_message(t0, big(3)),
        Err(SendError::WouldBlock(big(3)))
    );
    let too_large = Message::new(Envelope::default(), vec![0u8; 30_001]);
    assert_eq!(
        a.send_message(t0, too_large.clone()),
        Err(SendError::TooLarge(too_large))
    );
    // Deliver and acknowledge; the sender then says it has room.
    let mut net = Net::new(t0, [a, Link::new(t0, cfg)], vec![PipeConfig::default()], 3);
    while net.ep[0].send_buffered() > 0 {
        net.step();
        assert!(net.now < t0 + Duration::from_secs(5));
    }
    assert_eq!(net.side[1].delivered.len(), 2);
    assert_eq!(net.side[0].events, vec![Event::Writable]);
    assert!(net.ep[0].send_message(net.now, big(3)).is_ok());
}

#[test]
fn before_any_credit_update_the_sender_stays_within_the_initial_credit() {
    let t0 = Instant::now();
    let cfg = config().build().unwrap();
    let mut a = Link::new(t0, cfg.clone());
    let mut b = Link::new(t0, cfg);
    for i in 0..4 {
        let m = Message::new(
            Envelope {
                tag: i,
                ..Envelope::default()
            },
            vec![0u8; 30_000],
        );
        a.send_message(t0, m).unwrap();
    }
    // b's credit announcement has not reached a: only the initial credit may be used.
    let now = t0 + Duration::from_millis(1);
    a.handle_timeout(now);
    while let Some(bytes) = a.poll_transmit(now) {
        b.handle_bytes(now, &bytes);
    }
    assert!(b.close_reason().is_none());
    let mut delivered = 0;
    while let Some(e) = b.poll_event() {
        assert!(matches!(e, Event::Delivered(_)), "{e:?}");
        delivered += 1;
    }
    assert_eq!(
        delivered, 2,
        "two 30 kB messages fit 64 KiB, a third does not"
    );
    assert_eq!(a.stats().queued_messages, 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(64)))]

    /// Over random windows, message sizes, application speeds and faults: the receiver
    /// never holds more than its window, the sender never buffers more than its send
    /// buffer, and everything arrives.
    #[test]
    fn windows_bound_memory(
        seed in any::<u64>(),
        window_kib in 64u64..1024,
        send_kib in 64u64..1024,
        msg_frac in 0.05..1.0f64,
        n in 1u32..300,
        drain_ms in proptest::option::of(1u64..40),
        drop in 0.0..0.03f64,
        corrupt in 0.0..0.03f64,
    ) {
        let t0 = Instant::now();
        let window = window_kib << 10;
        let send_buffer = send_kib << 10;
        let max_msg = ((window.min(send_buffer) - 64) as f64 * msg_frac) as u64;
        let cfg = config()
            .window(window)
            .send_buffer(send_buffer)
            .max_message_len(max_msg)
            .build()
            .unwrap();
        let pipe = PipeConfig {
            latency: Duration::from_millis(3),
            bandwidth: Some(50_000_000),
            faults: Faults { drop, corrupt, ..Faults::default() },
        };
        let mut net = Net::new(t0, pair_links(t0, &cfg), vec![pipe], seed);
        net.side[1].drain_every = drain_ms.map(Duration::from_millis);
        flood(&mut net, seed, n, max_msg as usize);
        net.run(Duration::from_secs(300));
        net.check_delivery();
        prop_assert!(net.side[1].max_receive_buffered <= window);
        prop_assert!(net.side[0].max_send_buffered <= send_buffer);
    }
}
