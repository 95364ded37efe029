//! Long links soaked: three sites over emulated wide-area lines of different rates and
//! latencies (one pair striped over two links; compression off, lz4, zstd and auto), every
//! link cut on a schedule and dialled again by its router, a few bits flipped on the way.
//! Every rank sends checked messages (`metampi_testkit::traffic`) to every other rank round
//! after round, and broadcasts between rounds, for `METAMPI_TEST_SOAK_SECS` seconds; any
//! lost, duplicated, reordered or corrupted message, any rank that loses its router and any
//! hang (a stall report after 120 s, `METAMPI_TEST_SOAK_STALL`) fails it. A second soak
//! runs the same traffic between two network namespaces whose line the kernel shapes to
//! 40 Mbit/s (`tc tbf`, which drops what overflows its queue: TCP's own recovery on the
//! routers' links), the setting in which a job once lost a router after 127 s. Not in the
//! default suite:
//!
//! ```sh
//! METAMPI_TEST_SOAK_SECS=600 cargo test --release -p metampi --test soak -- --nocapture --test-threads=1
//! ```

use std::time::{Duration, Instant};

use metampi::traits::*;
use metampi_testkit::traffic::{check, message};
use metampi_testkit::{is_rank, Faults, NetnsPair, Ranks};

const NAME: &str = "long_links_soak";
/// The largest messages: several frames, and on the slowest line most of a second.
const LARGE: usize = 600 << 10;
/// Tag of round `round`'s messages. The root of the broadcast between rounds runs a round
/// ahead, so a receive from any source could take its next round's message in place of a
/// late sender's, whose rendezvous send then waits for a receive posted only after our own
/// sends complete: each round receives its own tag.
fn tag(round: u32) -> i32 {
    100 + (round % 1000) as i32
}

const CONFIG: &str = "PORTBASE 28400\n\
     METAHOST a { LAUNCH = local; NPROCS = 2; NODES = a0; }\n\
     METAHOST b { LAUNCH = local; NPROCS = 2; NODES = b0; }\n\
     METAHOST c { LAUNCH = local; NPROCS = 2; NODES = c0; }\n\
     PAIR a b 1 - { BANDWIDTH = 40Mbit; LATENCY = 20ms; COMPRESSION = lz4; }\n\
     a0 -> b0 \\\n  a0 -> b0\n\
     PAIR b a 1 - { BANDWIDTH = 40Mbit; LATENCY = 20ms; COMPRESSION = off; }\n\
     b0 -> a0\n\
     PAIR a c 1 - { BANDWIDTH = 10Mbit; LATENCY = 60ms; COMPRESSION = zstd; }\n\
     a0 <-> c0\n\
     PAIR b c 1 - { BANDWIDTH = 100Mbit; LATENCY = 5ms; COMPRESSION = auto; }\n\
     b0 <-> c0\n";

/// Checked traffic for `secs` on `ranks`, then the totals printed by rank 0.
fn soak(ranks: Ranks, name: &str, secs: u64) {
    ranks.run(name, move |world| {
        let (rounds, messages, bytes) = rounds(world, secs);
        let mut total = [0u64; 2];
        world.all_reduce_into(
            &[messages, bytes][..],
            &mut total[..],
            metampi::collective::SystemOperation::sum(),
        );
        if world.rank() == 0 {
            println!(
                "soak: {rounds} rounds, {} messages, {:.1} MB checked, none lost, duplicated, \
                 reordered or corrupted",
                total[0],
                total[1] as f64 / 1e6
            );
        }
    });
}

/// How long nothing may move before the job ends with a hang report
/// (`METAMPI_TEST_SOAK_STALL`, seconds; default 120).
fn stall() -> Duration {
    Duration::from_secs(metampi::knobs::number("METAMPI_TEST_SOAK_STALL").unwrap_or(120))
}

fn soak_secs() -> Option<u64> {
    metampi::knobs::number("METAMPI_TEST_SOAK_SECS")
}

/// Rounds of all-to-all checked messages until rank 0's clock says the time is up; returns
/// (rounds, messages, bytes) this rank received.
fn rounds(world: &metampi::topology::SimpleCommunicator, secs: u64) -> (u64, u64, u64) {
    let (me, size) = (world.rank(), world.size());
    let start = Instant::now();
    let (mut round, mut messages, mut bytes) = (0u32, 0u64, 0u64);
    let mut next = vec![0u32; size as usize];
    loop {
        let mut sends = Vec::new();
        for dst in (0..size).filter(|&d| d != me) {
            let m = message(me, dst, round, LARGE);
            sends.push(
                world
                    .process_at_rank(dst)
                    .immediate_send_owned(m, tag(round)),
            );
        }
        for _ in 1..size {
            let (m, st) = world.any_process().receive_vec_with_tag::<u8>(tag(round));
            let src = st.source_rank();
            check(&m, src, me, next[src as usize], LARGE);
            next[src as usize] += 1;
            messages += 1;
            bytes += m.len() as u64;
        }
        for s in sends {
            s.wait().expect("send completes");
        }
        round += 1;
        // Whether to go on is rank 0's to say: a broadcast across the sites.
        let mut go = u8::from(start.elapsed() < Duration::from_secs(secs));
        world.process_at_rank(0).broadcast_into(&mut go);
        if go == 0 {
            return (u64::from(round), messages, bytes);
        }
    }
}

#[test]
fn long_links_soak() {
    let Some(secs) = soak_secs() else {
        eprintln!("SKIPPED {NAME}: a soak of minutes; set METAMPI_TEST_SOAK_SECS to run it");
        return;
    };
    let faults = Faults {
        flip: 0.0005,
        delay: 0.002,
        cut_every: Duration::from_secs(40),
        seed: 43,
        ..Default::default()
    };
    let (ranks, counts) = Ranks::new(6)
        .meta(CONFIG)
        .stall_timeout(stall())
        .timeout(Duration::from_secs(secs + 300))
        .faulty_links(faults);
    let started = Instant::now();
    soak(ranks, NAME, secs);
    if is_rank() {
        return;
    }
    let counts = counts.lock().unwrap_or_else(|p| p.into_inner());
    let load = |f: fn(&metampi_testkit::FaultCounts) -> &std::sync::atomic::AtomicU64| {
        (counts.iter())
            .map(|c| f(c).load(std::sync::atomic::Ordering::Relaxed))
            .sum::<u64>()
    };
    let cuts = load(|c| &c.cut);
    println!(
        "soak: {:.0} s over {} links; {} chunks forwarded, {cuts} cuts, {} bits flipped, \
         {} pauses",
        started.elapsed().as_secs_f64(),
        counts.len(),
        load(|c| &c.chunks),
        load(|c| &c.flipped),
        load(|c| &c.delayed),
    );
    if secs >= 60 {
        assert!(cuts > 0, "the schedule must have cut links");
    }
}

#[test]
fn soak_over_a_kernel_shaped_line() {
    const TC_NAME: &str = "soak_over_a_kernel_shaped_line";
    let Some(secs) = soak_secs() else {
        eprintln!("SKIPPED {TC_NAME}: a soak of minutes; set METAMPI_TEST_SOAK_SECS to run it");
        return;
    };
    let mut _ns = None;
    let cfg = if is_rank() {
        String::new() // ranks do not read it
    } else {
        let made = NetnsPair::create(TC_NAME).and_then(|ns| ns.limit("40mbit").map(|()| ns));
        let ns = match made {
            Ok(ns) => ns,
            Err(e) => {
                eprintln!("SKIPPED {TC_NAME}: cannot make a shaped pair of namespaces ({e})");
                return;
            }
        };
        let cfg = ns.description(28450, [2, 2]);
        _ns = Some(ns);
        cfg
    };
    let ranks = Ranks::new(4)
        .meta(&cfg)
        .stall_timeout(stall())
        .timeout(Duration::from_secs(secs + 300));
    let started = Instant::now();
    soak(ranks, TC_NAME, secs);
    if !is_rank() {
        println!(
            "soak over a 40 Mbit/s tc line: {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
}
