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
    // tries only a handful.
    assert_eq!(noise_stats.compressed_frames_out, 0);
    assert!(
        noise_stats.compression_skipped >= 250,
        "skipped only {} of 300",
        noise_stats.compression_skipped
    );

    payloads.extend((0..300).map(|_| text(&mut rng, 4000)));
    let mixed = send_all(Compression::Auto, Compression::Off, payloads);
    // The pauses so far add up to about 250 frames, so the pause running when the text
    // starts ends about 200 frames into it; the probe then finds it compressible and
    // Auto stays on for the remaining ~100.
    assert!(
        (80..=110).contains(&mixed.compressed_frames_out),
        "{mixed:?}"
    );
    assert!(
        mixed.compression_ratio_out() < 0.95,
        "{}",
        mixed.compression_ratio_out()
    );
}
