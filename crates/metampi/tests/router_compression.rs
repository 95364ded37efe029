//! `COMPRESSION = auto` between routers: on an emulated 100 Mbit/s line with
//! compressible data it keeps compressing and beats the line rate; on loopback
//! it measures both modes and says so in the link statistics. And
//! `CHECKSUM = off`: frames whose checksum leaves the payload out carry every
//! message intact, and the receiving router says it took them unchecked.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use metampi::traits::*;
use metampi_testkit::{link_stats, stats_number, Ranks, StatsDir};

/// Jobs of this file run one at a time: they measure rates, which another
/// job on the same cores would spoil.
static JOBS: Mutex<()> = Mutex::new(());

fn config(portbase: u16, link: &str) -> String {
    format!(
        "PORTBASE {portbase}\n\
         METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
         METAHOST b {{ LAUNCH = local; NPROCS = 1; NODES = b0; }}\n\
         PAIR a b 1 - {{ {link} }}\na0 <-> b0\n"
    )
}

/// Message `i`: text that LZ4 shrinks about threefold.
fn message(i: usize, len: usize) -> Vec<u8> {
    const WORDS: [&str; 8] = [
        "pulsar ",
        "dispersion ",
        "candidate ",
        "0.0031 ",
        "beam ",
        "17 ",
        "site ",
        "\n",
    ];
    let mut x = i as u64 + 1;
    let mut v = Vec::with_capacity(len + 16);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(WORDS[(x % 8) as usize].as_bytes());
    }
    v.truncate(len);
    v
}

/// The statistics of the link end on `side` (`"out"`, `"in"`) that carried
/// the most (`key`).
fn busiest(dir: &std::path::Path, side: &str, key: &str) -> String {
    link_stats(dir, side)
        .into_iter()
        .map(|(_, text)| text)
        .max_by_key(|text| number(text, key))
        .unwrap_or_default()
}

/// The statistics of the sending router's link (the one that carried data).
fn sender_stats(dir: &std::path::Path) -> String {
    busiest(dir, "out", "payload_raw_out")
}

/// The statistics of the receiving end of the link that carried data.
fn receiver_stats(dir: &std::path::Path) -> String {
    busiest(dir, "in", "frames_in")
}

fn number(json: &str, key: &str) -> u64 {
    stats_number(json, key).unwrap_or(0)
}

fn text(json: &str, key: &str) -> String {
    let key = format!("\"{key}\":\"");
    json.find(&key)
        .map(|at| {
            json[at + key.len()..]
                .chars()
                .take_while(|&c| c != '"')
                .collect()
        })
        .unwrap_or_default()
}

/// Rank 0 streams `count` messages of `len` bytes to rank 1, sixteen at a
/// time (as a bandwidth benchmark does), and rank 1 checks them; rank 0
/// returns the time from the first send to rank 1's reply, and the sending
/// router's statistics, read after they were last rewritten.
fn stream(
    world: &metampi::topology::SimpleCommunicator,
    dir: &std::path::Path,
    count: usize,
    len: usize,
) -> Option<(Duration, String)> {
    let data: Vec<Vec<u8>> = (0..16).map(|i| message(i, len)).collect();
    world.barrier();
    let other = world.process_at_rank(1 - world.rank());
    if world.rank() == 1 {
        for i in 0..count {
            let (m, _) = other.receive_vec::<u8>();
            assert!(m == data[i % 16], "message {i} damaged");
        }
        other.send(&[1u8][..]);
        world.barrier();
        return None;
    }
    let t0 = Instant::now();
    for round in 0..count.div_ceil(16) {
        let sends: Vec<_> = (round * 16..count.min(round * 16 + 16))
            .map(|i| other.immediate_send_owned(data[i % 16].clone(), 0))
            .collect();
        for s in sends {
            s.wait().expect("send completes");
        }
    }
    let _ = other.receive_vec::<u8>();
    let elapsed = t0.elapsed();
    world.barrier();
    // Statistics are rewritten twice a second.
    std::thread::sleep(Duration::from_millis(1200));
    Some((elapsed, sender_stats(dir)))
}

fn run(
    test: &str,
    portbase: u16,
    link: &str,
    body: impl FnOnce(&std::path::Path, &metampi::topology::SimpleCommunicator),
) {
    let _g = JOBS.lock().unwrap_or_else(|p| p.into_inner());
    let dir = StatsDir::new(test);
    let d = dir.path();
    let outcome = Ranks::new(2)
        .meta(&config(portbase, link))
        .router_stats(&dir)
        .timeout(Duration::from_secs(120))
        .outcome(test, move |world| body(d, world));
    let Some(outcome) = outcome else {
        return; // a rank or a router of the job
    };
    if let Some(f) = &outcome.failure {
        panic!("{test} failed: {f}");
    }
}

#[test]
fn auto_compresses_where_it_beats_a_slow_line() {
    run(
        "auto_compresses_where_it_beats_a_slow_line",
        24100,
        "BANDWIDTH = 100Mbit; LATENCY = 5ms; COMPRESSION = auto;",
        |dir, world| {
            const COUNT: usize = 48;
            const LEN: usize = 1 << 20;
            let Some((elapsed, stats)) = stream(world, dir, COUNT, LEN) else {
                return;
            };
            let rate = (COUNT * LEN) as f64 / elapsed.as_secs_f64();
            let line = 12.5e6;
            println!(
                "100 Mbit/s line, auto: {:.1} MB/s ({:.2}x the line); {stats}",
                rate / 1e6,
                rate / line
            );
            assert_eq!(text(&stats, "compression"), "auto", "{stats}");
            assert_eq!(text(&stats, "compression_mode"), "compress", "{stats}");
            let (raw, wire) = (
                number(&stats, "payload_raw_out"),
                number(&stats, "payload_wire_out"),
            );
            assert!(wire * 2 < raw, "{stats}");
            assert!(rate > 1.5 * line, "{:.1} MB/s", rate / 1e6);
            // A raw probe, if one was measured, ran at about the line rate.
            let probe = number(&stats, "goodput_raw_bps") as f64;
            assert!(probe < 1.2 * line, "{stats}");
        },
    );
}

#[test]
fn auto_measures_both_modes_on_a_fast_link() {
    run(
        "auto_measures_both_modes_on_a_fast_link",
        24150,
        "COMPRESSION = auto;",
        |dir, world| {
            const COUNT: usize = 512;
            const LEN: usize = 1 << 20;
            let Some((elapsed, stats)) = stream(world, dir, COUNT, LEN) else {
                return;
            };
            let rate = (COUNT * LEN) as f64 / elapsed.as_secs_f64();
            println!("loopback, auto: {:.0} MB/s; {stats}", rate / 1e6);
            let mode = text(&stats, "compression_mode");
            assert!(["compress", "raw"].contains(&mode.as_str()), "{stats}");
            // Both modes were measured while the link was busy: the decision
            // rests on them.
            assert!(number(&stats, "auto_probes") >= 1, "{stats}");
            assert!(number(&stats, "goodput_compressed_bps") > 0, "{stats}");
            assert!(number(&stats, "goodput_raw_bps") > 0, "{stats}");
        },
    );
}

/// Streams 64 messages of 256 KiB through the routers (rank 1 checks every
/// byte) and returns both ends' statistics of the link, on rank 0.
fn checksum_run(test: &str, portbase: u16, link: &str) -> Option<(String, String)> {
    let got = Mutex::new(None);
    run(test, portbase, link, |dir, world| {
        if let Some((_, out)) = stream(world, dir, 64, 256 << 10) {
            *got.lock().unwrap() = Some((out, receiver_stats(dir)));
        }
    });
    got.into_inner().unwrap()
}

#[test]
fn payloads_go_unchecked_only_where_asked() {
    let Some((out, inbound)) = checksum_run(
        "payloads_go_unchecked_only_where_asked",
        24200,
        "COMPRESSION = off; CHECKSUM = off;",
    ) else {
        return;
    };
    assert!(out.contains("\"payload_checksum_out\":false"), "{out}");
    assert!(number(&inbound, "unchecked_frames_in") >= 64, "{inbound}");
    assert_eq!(number(&inbound, "corrupt_in"), 0, "{inbound}");
}

/// The default on a plain link checks every payload.
#[test]
fn payloads_are_checked_by_default() {
    let Some((out, inbound)) = checksum_run(
        "payloads_are_checked_by_default",
        24250,
        "COMPRESSION = off;",
    ) else {
        return;
    };
    assert!(out.contains("\"payload_checksum_out\":true"), "{out}");
    assert!(number(&inbound, "frames_in") >= 64, "{inbound}");
    assert_eq!(number(&inbound, "unchecked_frames_in"), 0, "{inbound}");
}
