//! Per-frame compression: ratios per mode, `Auto` giving up on data that does not shrink
//! and coming back when it does, and ends with different settings talking.

mod common;

use std::time::{Duration, Instant};

use common::{config, Net, PipeConfig};
use metampi_wire::{Compression, Envelope, Link, Message, Stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const WORDS: [&str; 12] = [
    "pulsar ",
    "dispersion ",
    "measure ",
    "candidate ",
    "router ",
    "frame ",
    "0.0031 ",
    "site ",
    "rank ",
    "17 ",
    "beam ",
    "\n",
];

fn text(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 16);
    while v.len() < len {
        v.extend_from_slice(WORDS[rng.gen_range(0..WORDS.len())].as_bytes());
    }
    v.truncate(len);
    v
}

fn noise(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// Sends `payloads` from side 0 one per millisecond (one frame each) and returns the
/// sender's statistics.
fn send_all(a: Compression, b: Compression, payloads: Vec<Vec<u8>>) -> Stats {
    let t0 = Instant::now();
    let ca = config().compression(a).build().unwrap();
    let cb = config().compression(b).build().unwrap();
    let mut net = Net::new(
        t0,
        [Link::new(t0, ca), Link::new(t0, cb)],
        vec![PipeConfig::default()],
        1,
    );
    for (i, p) in payloads.into_iter().enumerate() {
        let env = Envelope {
            tag: i as i32,
            ..Envelope::default()
        };
        net.queue(
            0,
            t0 + Duration::from_millis(i as u64),
            Message::new(env, p),
        );
    }
    net.run(Duration::from_secs(30));
    net.check_delivery();
    let s = net.ep[0].stats();
    assert_eq!(net.ep[1].stats().payload_raw_in, s.payload_raw_out);
    s
}

#[test]
fn modes_compress_as_configured() {
    let mut rng = StdRng::seed_from_u64(1);
    let payloads: Vec<_> = (0..50).map(|_| text(&mut rng, 8000)).collect();
    let off = send_all(Compression::Off, Compression::Off, payloads.clone());
    assert_eq!(off.compressed_frames_out, 0);
    assert_eq!(off.compression_ratio_out(), 1.0);
    let lz4 = send_all(Compression::Lz4, Compression::Off, payloads.clone());
    assert!(
        lz4.compression_ratio_out() < 0.5,
        "{}",
        lz4.compression_ratio_out()
    );
    if !cfg!(feature = "zstd") {
        return;
    }
    let zstd = send_all(Compression::Zstd, Compression::Lz4, payloads);
    assert!(
        zstd.compression_ratio_out() < lz4.compression_ratio_out(),
        "zstd {} lz4 {}",
        zstd.compression_ratio_out(),
        lz4.compression_ratio_out()
    );
}

#[test]
fn incompressible_frames_go_raw_even_when_compression_is_on() {
    let mut rng = StdRng::seed_from_u64(2);
    let payloads: Vec<_> = (0..30).map(|_| noise(&mut rng, 8000)).collect();
    let lz4 = send_all(Compression::Lz4, Compression::Lz4, payloads);
    assert_eq!(lz4.compressed_frames_out, 0);
    assert_eq!(lz4.compression_ratio_out(), 1.0);
}

#[test]
fn auto_stops_on_noise_and_resumes_on_text() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut payloads: Vec<_> = (0..300).map(|_| noise(&mut rng, 4000)).collect();
    let noise_stats = send_all(Compression::Auto, Compression::Off, payloads.clone());
    // After three misses Auto pauses 16, 32, 64, 128 frames...: of 300 noise frames it
    // tries only a handful (and sends a window of them raw as a probe).
    assert_eq!(noise_stats.compressed_frames_out, 0);
    assert!(
        noise_stats.compression_skipped >= 250,
        "skipped only {} of 300",
        noise_stats.compression_skipped
    );

    payloads.extend((0..300).map(|_| text(&mut rng, 4000)));
    let mixed = send_all(Compression::Auto, Compression::Off, payloads);
    // After a miss each, pauses of 16, 32, 64 and 128 frames follow; the last one
    // runs from frame 118. From frame 200, 200 frames go raw as Auto's probe of the
    // other mode (one window, 200 ms at a frame per ms; the application offers the
    // same either way, so it stays with compressing), which holds the pause where it
    // was: it ends at frame 446, about 150 frames into the text. The try then finds
    // text and Auto stays on for the remaining ~150.
    assert!(
        (140..=165).contains(&mixed.compressed_frames_out),
        "{mixed:?}"
    );
    assert_eq!((mixed.auto_probes, mixed.auto_switches), (1, 0));
    assert!(
        mixed.compression_ratio_out() < 0.95,
        "{}",
        mixed.compression_ratio_out()
    );
}

/// `Auto` on a slow line kept busy with compressible data: it measures both modes (a
/// raw probe now and then) and keeps compressing, which gets several times the line
/// rate through; the statistics say so.
#[test]
fn auto_keeps_compressing_where_it_beats_a_slow_line() {
    let t0 = Instant::now();
    let mut rng = StdRng::seed_from_u64(4);
    let line = 12_500_000; // 100 Mbit/s
                           // As routers do: a raw frame takes 2.5 times as long on the line as a compressed
                           // one, which a tight retransmission timer would take for a loss when the mode
                           // changes.
    let cfg = config()
        .compression(Compression::Auto)
        .min_rto(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut net = Net::new(
        t0,
        [Link::new(t0, cfg.clone()), Link::new(t0, cfg)],
        vec![PipeConfig {
            latency: Duration::from_millis(10),
            bandwidth: Some(line),
            ..PipeConfig::default()
        }],
        5,
    );
    // 48 MB queued at once: the application never lets the link idle.
    let total: usize = 48_000_000;
    for i in 0..total / 100_000 {
        let env = Envelope {
            tag: i as i32,
            ..Envelope::default()
        };
        net.queue(0, t0, Message::new(env, text(&mut rng, 100_000)));
    }
    let done = net.run(Duration::from_secs(60));
    net.check_delivery();
    let elapsed = (done - t0).as_secs_f64();
    let s = net.ep[0].stats();
    eprintln!(
        "{total} bytes in {elapsed:.2} s: ratio {:.3}, mode {:?}, goodput compressed {} raw {} B/s, {} probes",
        s.compression_ratio_out(),
        s.auto_mode,
        s.auto_goodput_compressed,
        s.auto_goodput_raw,
        s.auto_probes
    );
    assert_eq!(s.auto_mode, metampi_wire::AutoMode::Compress);
    assert_eq!(s.auto_switches, 0);
    assert!(s.auto_probes >= 1, "{s:?}");
    // The run ends when everything is acknowledged, a keepalive after the last
    // delivery: still well above the line rate.
    assert!(
        total as f64 / elapsed > 1.3 * line as f64,
        "{:.0} B/s",
        total as f64 / elapsed
    );
    assert_eq!(s.retransmits, 0);
    // Each mode was measured while backlogged: raw at the line rate, compressed above.
    let raw = s.auto_goodput_raw as f64;
    assert!((raw / line as f64 - 1.0).abs() < 0.15, "raw {raw}");
    assert!(s.auto_goodput_compressed as f64 > 2.0 * raw, "{s:?}");
}

/// With the application sending a message now and then over a line whose speed does
/// not depend on the bytes (the simulated one has latency only), both modes get each
/// message through as soon: `Auto` measures that and keeps compressing.
#[test]
fn auto_keeps_its_mode_where_both_deliver_alike() {
    let mut rng = StdRng::seed_from_u64(5);
    let t0 = Instant::now();
    let cfg = config().compression(Compression::Auto).build().unwrap();
    let mut net = Net::new(
        t0,
        [Link::new(t0, cfg.clone()), Link::new(t0, cfg)],
        vec![PipeConfig::default()],
        1,
    );
    for i in 0..100u32 {
        let env = Envelope {
            tag: i as i32,
            ..Envelope::default()
        };
        // One every 50 ms; each is acknowledged about 10 ms later.
        let at = t0 + Duration::from_millis(50 * u64::from(i));
        net.queue(0, at, Message::new(env, text(&mut rng, 20_000)));
    }
    net.run(Duration::from_secs(30));
    net.check_delivery();
    let s = net.ep[0].stats();
    assert_eq!(s.auto_mode, metampi_wire::AutoMode::Compress, "{s:?}");
    assert_eq!(s.auto_switches, 0, "{s:?}");
    assert!(s.auto_probes >= 1, "{s:?}");
    assert!(s.auto_busy_percent < 50, "{s:?}");
    let (c, r) = (s.auto_goodput_compressed as f64, s.auto_goodput_raw as f64);
    assert!((c / r - 1.0).abs() < 0.05, "{s:?}");
    // Only the probe's frames went raw.
    assert!(s.compressed_frames_out >= 100 - 8 * s.auto_probes, "{s:?}");
}
