//! Bytes lost *inside* a frame (issue 7, item 1). The receiver holds a valid header that
//! announces more payload than will come; before the partial-frame timeout existed it
//! waited until the sender's retransmission timeout, whose resend was then swallowed as
//! the missing payload, which cost another (backed-off) timeout. Now a partly received
//! frame that gets no byte for `partial_frame_timeout` is given up and a resend asked for.
//!
//! Each scenario runs with the give-up and without it (a timeout of a day behaves as the
//! code did before) and prints both recovery times in virtual time:
//! `cargo test -p metampi-wire --release --test wire_stall -- --nocapture`.

mod common;

use std::cell::Cell;
use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{config, pair_bundles, pair_links, test_message, Endpoint, Faults, Net, PipeConfig};
use metampi_wire::frame::{self, Decoded, FrameKind, HEADER_LEN};
use metampi_wire::record;
use metampi_wire::{Compression, ConfigBuilder, Stats};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The give-up switched off: the behaviour before it existed.
const DISABLED: Duration = Duration::from_secs(24 * 3600);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The router's settings for fast links (`wire_config` in `crates/metampi/src/router.rs`),
/// uncompressed so that byte offsets inside frames are known.
fn router_config() -> ConfigBuilder {
    config()
        .max_frame_payload(256 << 10)
        .flush_delay(Duration::ZERO)
        .ack_delay(Duration::from_micros(2000))
        .window(8 << 20)
        .send_buffer(8 << 20)
        .initial_rto(Duration::from_secs(1))
        .min_rto(ms(500))
        .compression(Compression::Off)
}

/// Message id of the first record in `bytes`, if they are exactly one raw `Data` frame.
fn first_message(bytes: &[u8]) -> Option<u64> {
    match frame::decode(bytes, frame::MAX_PAYLOAD) {
        Ok(Decoded::Frame {
            header, payload, ..
        }) if header.kind == FrameKind::Data => {
            let records = record::decode_payload(&Bytes::copy_from_slice(payload)).ok()?;
            records.first().map(|r| r.id)
        }
        _ => None,
    }
}

/// Cuts `range(frame length)` out of the first `times` transmissions of the frame that
/// starts with message `id`, from side 0 to side 1; the count tells how often it did.
fn lose_in_frame(
    net: &mut Net<impl Endpoint>,
    id: u64,
    times: u32,
    range: impl Fn(usize) -> Range<usize> + 'static,
) -> Rc<Cell<u32>> {
    let hits = Rc::new(Cell::new(0));
    let h = Rc::clone(&hits);
    net.filter(0, 0, move |bytes| {
        if h.get() < times && first_message(bytes) == Some(id) {
            h.set(h.get() + 1);
            bytes.drain(range(bytes.len()));
        }
    });
    hits
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Loss {
    /// 1000 bytes from the middle of a 200 kB frame after which the sender goes quiet.
    LastBeforeIdle,
    /// The same, and again from the first resend of that frame.
    LastBeforeIdleTwice,
    /// 16 KiB (one read of the router's fault proxy) from a 200 kB frame followed at once
    /// by three small frames, which end up inside its announced length.
    FollowedByFrames,
    /// Everything after the first two bytes of the magic of the last frame before an
    /// idle period: the receiver does not even see a header.
    InMagic,
}

struct Recovery {
    /// From queueing the damaged message to delivering the last message.
    time: Duration,
    sender: Stats,
    receiver: Stats,
}

/// Runs `loss` on a 1 Gbit/s, 1 ms link with the router's settings and the given
/// partial-frame timeout. `warm`: five messages go first, so the sender has a round-trip
/// estimate (its retransmission timeout is then `min_rto`, else `initial_rto`).
fn recover(loss: Loss, warm: bool, timeout: Duration) -> Recovery {
    let t0 = Instant::now();
    let cfg = router_config()
        .partial_frame_timeout(timeout)
        .build()
        .unwrap();
    let pipe = PipeConfig {
        latency: ms(1),
        bandwidth: Some(125_000_000),
        faults: Faults::default(),
    };
    let mut net = Net::new(t0, pair_links(t0, &cfg), vec![pipe], 1);
    let mut rng = StdRng::seed_from_u64(1);
    let warmup = if warm { 5 } else { 0 };
    for i in 0..warmup {
        net.queue(
            0,
            t0 + ms(10 * u64::from(i)),
            test_message(&mut rng, 0, i, 100_000),
        );
    }
    let at = t0 + ms(100);
    let (len, followers) = match loss {
        Loss::LastBeforeIdle | Loss::LastBeforeIdleTwice => (200_000, 0),
        Loss::FollowedByFrames => (200_000, 3),
        Loss::InMagic => (5_000, 0),
    };
    net.queue(0, at, test_message(&mut rng, 0, warmup, len));
    for k in 1..=followers {
        // Each leaves when the line is free again: a frame of its own.
        let m = test_message(&mut rng, 0, warmup + k, 100);
        net.queue(0, at + ms(2 * u64::from(k)), m);
    }
    let times = if loss == Loss::LastBeforeIdleTwice {
        2
    } else {
        1
    };
    let hits = lose_in_frame(&mut net, u64::from(warmup), times, move |n| match loss {
        Loss::LastBeforeIdle | Loss::LastBeforeIdleTwice => {
            HEADER_LEN + 50_000..HEADER_LEN + 51_000
        }
        Loss::FollowedByFrames => HEADER_LEN + 50_000..HEADER_LEN + 50_000 + (16 << 10),
        Loss::InMagic => 2..n,
    });
    let total = (warmup + 1 + followers) as usize;
    while net.side[1].delivered.len() < total {
        net.step();
        assert!(
            net.now < t0 + Duration::from_secs(60),
            "{loss:?} not recovered"
        );
    }
    let time = net.now - at;
    assert_eq!(hits.get(), times, "the loss was injected");
    net.run(Duration::from_secs(10));
    net.check_delivery();
    Recovery {
        time,
        sender: net.ep[0].stats(),
        receiver: net.ep[1].stats(),
    }
}

/// Recovery of one scenario before and with the give-up, printed.
fn compare(loss: Loss, warm: bool) -> (Recovery, Recovery) {
    let old = recover(loss, warm, DISABLED);
    let new = recover(loss, warm, ms(200));
    println!(
        "{loss:?} (sender {}): recovered after {:?} before, {:?} with the give-up \
         (sender timeouts {} -> {}, frames given up {})",
        if warm { "warm" } else { "cold" },
        old.time,
        new.time,
        old.sender.timeouts,
        new.sender.timeouts,
        new.receiver.stalled_frames_in,
    );
    assert_eq!(old.receiver.stalled_frames_in, 0);
    (old, new)
}

/// One loss: given up once, resent on the NACK without waiting for the sender's timer,
/// within the timeout plus a few round trips, and at least twice as fast as before.
fn recovers_quickly(loss: Loss) {
    for warm in [true, false] {
        let (old, new) = compare(loss, warm);
        assert_eq!(new.receiver.stalled_frames_in, 1, "{:?}", new.receiver);
        assert_eq!(new.sender.timeouts, 0, "the NACK came before the timer");
        assert!(new.time < ms(250), "{:?}", new.time);
        assert!(new.time * 2 < old.time, "{:?} vs {:?}", new.time, old.time);
    }
}

#[test]
fn bytes_lost_inside_the_last_frame_before_idle() {
    recovers_quickly(Loss::LastBeforeIdle);
}

#[test]
fn bytes_lost_inside_a_frame_followed_by_frames_that_do_not_fill_it() {
    recovers_quickly(Loss::FollowedByFrames);
}

#[test]
fn bytes_lost_from_inside_a_header_magic() {
    recovers_quickly(Loss::InMagic);
}

#[test]
fn bytes_lost_inside_the_last_frame_and_again_inside_its_resend() {
    // Before, the resend's own gap happened to be swallowed as the payload missing from
    // the first transmission, so the old path lost little more than with one loss.
    let (old, new) = compare(Loss::LastBeforeIdleTwice, true);
    assert_eq!(new.receiver.stalled_frames_in, 2, "{:?}", new.receiver);
    assert_eq!(new.sender.timeouts, 0);
    assert!(new.time < ms(450) && new.time < old.time, "{:?}", new.time);
    // A sender without a round-trip sample takes a NACK that comes within `min_rto` of
    // a resend for one that crossed it, so the second give-up waits for its timer.
    let (old, new) = compare(Loss::LastBeforeIdleTwice, false);
    assert_eq!(new.receiver.stalled_frames_in, 2, "{:?}", new.receiver);
    assert!(new.time * 2 < old.time, "{:?} vs {:?}", new.time, old.time);
}

#[test]
fn a_keepalive_landing_in_the_gap_does_not_put_off_the_give_up() {
    // A 20 ms keepalive from the sender arrives ten times before the give-up; each lands
    // in the gap (it is taken for payload) but starts with a whole header, so it is not
    // progress of the waiting frame.
    let t0 = Instant::now();
    let cfg = router_config().keepalive(ms(20)).build().unwrap();
    let pipe = PipeConfig {
        latency: ms(1),
        bandwidth: Some(125_000_000),
        faults: Faults::default(),
    };
    let mut net = Net::new(t0, pair_links(t0, &cfg), vec![pipe], 2);
    let mut rng = StdRng::seed_from_u64(2);
    // After the receiver's window has replaced the initial credit: one frame.
    let at = t0 + ms(50);
    net.queue(0, at, test_message(&mut rng, 0, 0, 200_000));
    let hits = lose_in_frame(&mut net, 0, 1, |_| HEADER_LEN + 1000..HEADER_LEN + 30_000);
    while net.side[1].delivered.is_empty() {
        net.step();
        assert!(net.now < t0 + Duration::from_secs(5));
    }
    assert_eq!(hits.get(), 1);
    let took = net.now - at;
    let st = net.ep[1].stats();
    assert_eq!(st.stalled_frames_in, 1, "{st:?}");
    assert!(took < ms(250), "{took:?}");
    // The keepalives were found again in the bytes given up.
    assert!(st.frames_in >= 10, "{st:?}");
}

/// A 2 Mbit/s line with 70 ms latency delivering in segments of `segment` bytes (a
/// 256 KiB frame takes about 1 s); returns the receiver's statistics.
fn slow_line(segment: usize, timeout: Duration) -> (Stats, Stats) {
    let t0 = Instant::now();
    let cfg = router_config()
        .partial_frame_timeout(timeout)
        .build()
        .unwrap();
    let pipe = PipeConfig {
        latency: ms(70),
        bandwidth: Some(250_000),
        faults: Faults::default(),
    };
    let mut net = Net::new(t0, pair_links(t0, &cfg), vec![pipe], 3);
    net.trickle(0, segment);
    let mut rng = StdRng::seed_from_u64(3);
    // A megabyte message (four full frames), then small ones while they are under way.
    net.queue(0, t0, test_message(&mut rng, 0, 0, 1 << 20));
    for i in 1..20 {
        net.queue(
            0,
            t0 + ms(200 * u64::from(i)),
            test_message(&mut rng, 0, i, 300),
        );
    }
    net.run(Duration::from_secs(120));
    net.check_delivery();
    (net.ep[0].stats(), net.ep[1].stats())
}

#[test]
fn a_frame_trickling_in_on_a_slow_line_is_not_given_up() {
    // TCP segments, and bursts with 150 ms of silence between them (below the 200 ms
    // floor, as a window-limited TCP after an idle period makes on this line).
    for segment in [1460, 37_500] {
        let (sender, receiver) = slow_line(segment, ms(200));
        let (old_sender, _) = slow_line(segment, DISABLED);
        assert_eq!(receiver.stalled_frames_in, 0, "{segment}: {receiver:?}");
        assert_eq!(receiver.skipped_bytes_in, 0, "{segment}: {receiver:?}");
        // Nothing at all changed on the wire.
        assert_eq!(sender.bytes_out, old_sender.bytes_out, "{segment}");
    }
}

#[test]
fn a_line_pausing_longer_than_the_timeout_inside_frames_still_delivers() {
    // 300 ms of silence between bursts, above the 200 ms floor: the first frames are
    // given up in vain, the timeout doubles, and once a frame gets through with such
    // pauses it stays long.
    let (sender, receiver) = slow_line(75_000, ms(200));
    let (old_sender, _) = slow_line(75_000, DISABLED);
    println!(
        "pausing line: {} frames given up, {} bytes sent ({} without the give-up)",
        receiver.stalled_frames_in, sender.bytes_out, old_sender.bytes_out
    );
    assert!(receiver.stalled_frames_in >= 1, "{receiver:?}");
    assert!(receiver.stalled_frames_in <= 4, "{receiver:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(64)))]

    /// Runs of bytes lost inside chunks, with the other faults, over one to three links,
    /// with frames arriving whole or in segments: still exactly once and in order, no
    /// livelock (the simulator asserts that timers do not stay in the past), and memory
    /// within the windows.
    #[test]
    fn exactly_once_in_order_when_bytes_go_missing_inside_frames(
        seed in any::<u64>(),
        lose_bytes in 0.0..0.1f64,
        corrupt in 0.0..0.03f64,
        duplicate in 0.0..0.03f64,
        split in any::<bool>(),
        links in 1usize..=3,
        latency_ms in 0u64..20,
        per_side in 1u32..60,
        timeout_ms in prop_oneof![Just(5u64), Just(50), Just(200)],
        // Segments of 128 KiB leave 6.5 ms pauses inside frames: above a 5 ms timeout,
        // so frames are given up in vain too.
        segment in prop_oneof![Just(None), Just(Some(1460usize)), Just(Some(128 << 10))],
    ) {
        let t0 = Instant::now();
        let window = 1 << 20;
        let cfg = config()
            .max_frame_payload(256 << 10)
            .window(window)
            .send_buffer(window)
            .max_message_len(600_000)
            .partial_frame_timeout(ms(timeout_ms))
            .build()
            .unwrap();
        let pipe = PipeConfig {
            latency: ms(latency_ms),
            bandwidth: Some(20_000_000),
            faults: Faults { lose_bytes, corrupt, duplicate, split, ..Faults::default() },
        };
        let mut net = Net::new(t0, pair_bundles(t0, &cfg, links), vec![pipe; links], seed);
        if let Some(segment) = segment {
            for link in 0..links {
                net.trickle(link, segment);
            }
        }
        let mut rng = StdRng::seed_from_u64(seed ^ 0x57a1);
        for side in 0..2u32 {
            for i in 0..per_side {
                let len = match rng.gen_range(0..4) {
                    0 => rng.gen_range(100_000..600_000),
                    _ => rng.gen_range(0..3000),
                };
                let at = t0 + ms(rng.gen_range(0..500));
                net.queue(side as usize, at, test_message(&mut rng, side, i, len));
            }
            // The simulator sends in queue order, so times must not go backwards.
            net.side[side as usize].outbox.make_contiguous().sort_by_key(|m| m.0);
        }
        net.run(Duration::from_secs(300));
        net.check_delivery();
        for s in 0..2 {
            prop_assert!(net.side[s].max_receive_buffered <= window * links as u64 * 2);
        }
    }
}
