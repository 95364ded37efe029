//! Topology-aware (hierarchical) collectives across three emulated meta
//! hosts of uneven size (1 + 3 + 4 ranks): every hierarchical operation
//! against a sequential reference on random data, every root, automatic and
//! forced choice, on the world and on communicators made by split (one whose
//! sites keep consecutive ranks, one that interleaves them, where a
//! non-commutative reduction must fall back to a flat algorithm); and the
//! bytes that cross the inter-site links for a 1 MiB broadcast and a 1 MiB
//! all-reduce, flat versus hierarchical, read from the routers' statistics
//! files.

mod coll_common;

use std::sync::Mutex;
use std::time::Duration;

use coll_common::*;
use metampi::collective::{Algorithm, Collective, SystemOperation};
use metampi::testing::Ranks;
use metampi::topology::{Color, SimpleCommunicator};
use metampi::traits::*;

fn config(portbase: u16) -> String {
    format!(
        "PORTBASE {portbase}\n\
         METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
         METAHOST b {{ LAUNCH = local; NPROCS = 3; NODES = b0, b1; }}\n\
         METAHOST c {{ LAUNCH = local; NPROCS = 4; NODES = c0, c1; }}\n\
         PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
    )
}

/// Jobs of this file run one at a time: the statistics test sets an
/// environment variable that the routers of any job started meanwhile
/// would inherit.
static JOBS: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    JOBS.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn hierarchical_ops_1_3_4() {
    let _g = lock();
    Ranks::new(8)
        .meta(&config(22700))
        .timeout(Duration::from_secs(90))
        .run("hierarchical_ops_1_3_4", |world| {
            assert_eq!(world.num_meta_hosts(), 3);
            auto_and_forced(|how| battery(world, 41, how));
            // Sites keep consecutive ranks: world order reversed.
            let rev = world
                .split_by_color_with_key(Color::with_value(world.rank() % 2), -world.rank())
                .expect("every rank has a colour");
            auto_and_forced(|how| battery(&rev, 43, how));
            // Sites interleaved: communicator ranks alternate between
            // sites, so the matrix product must fall back to rank order.
            let key = [3, 0, 4, 1, 5, 2, 6, 7][world.rank() as usize];
            let mixed = world
                .split_by_color_with_key(Color::with_value(0), key)
                .expect("every rank has a colour");
            assert_eq!(mixed.rank(), key);
            auto_and_forced(|how| battery(&mixed, 47, how));
            world.barrier();
        });
}

fn battery(c: &SimpleCommunicator, seed: u64, how: &str) {
    check_barrier(c, how);
    check_bcast(c, seed, how, &[0, 1, 13, 3000, 9000]);
    check_reduce(c, seed + 1, how, &[0, 1, 13, 2000]);
    check_all_reduce(c, seed + 2, how);
    check_gather_scatter(c, seed + 3, how, &[0, 1, 7, 1500]);
    all_gather(c, seed + 4, how);
    all_to_all(c, seed + 5, how);
    check_scan(c, seed + 6, false, how);
    check_scan(c, seed + 7, true, how);
    check_reduce_scatter(c, seed + 8, &[0, 1, 3, 300], how);
    check_all_gather_varcount(c, seed + 9, how);
}

fn all_gather(c: &SimpleCommunicator, seed: u64, how: &str) {
    let (n, me) = (c.size(), c.rank());
    for len in [0usize, 1, 11, 4000] {
        let mine = ints(seed, me, len);
        let want: Vec<i64> = (0..n).flat_map(|r| ints(seed, r, len)).collect();
        let mut out = vec![0; len * n as usize];
        c.all_gather_into(&mine[..], &mut out[..]);
        assert!(out == want, "allgather len {len} {how}");
    }
    let p = padded(seed, me, 3);
    let want: Vec<Padded> = (0..n).flat_map(|r| padded(seed, r, 3)).collect();
    let mut out = vec![Padded::default(); 3 * n as usize];
    c.all_gather_into(&p[..], &mut out[..]);
    assert_eq!(out, want, "allgather padded {how}");
}

/// Block `to` of rank `from`'s all-to-all send buffer.
fn a2a_block(seed: u64, from: i32, to: i32, len: usize) -> Vec<i64> {
    ints(seed + 1000 * to as u64, from, len)
}

fn all_to_all(c: &SimpleCommunicator, seed: u64, how: &str) {
    let (n, me) = (c.size(), c.rank());
    for len in [0usize, 1, 5, 700] {
        let send: Vec<i64> = (0..n).flat_map(|to| a2a_block(seed, me, to, len)).collect();
        let want: Vec<i64> = (0..n)
            .flat_map(|from| a2a_block(seed, from, me, len))
            .collect();
        let mut out = vec![-1; len * n as usize];
        c.all_to_all_into(&send[..], &mut out[..]);
        assert!(out == want, "alltoall len {len} {how}");
    }
}

/// Sum of `payload_raw_out` over every router link's statistics file.
fn link_bytes(dir: &std::path::Path) -> u64 {
    link_stat(dir, "payload_raw_out")
}

/// Sum of statistic `key` over every router link's statistics file.
fn link_stat(dir: &std::path::Path, key: &str) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir)
        .expect("the statistics directory")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("router-") && name.ends_with("-out.json")) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let key = format!("\"{key}\":");
        let at = text.find(&key).expect("the key in the statistics") + key.len();
        let digits: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        total += digits.parse::<u64>().expect("a byte count");
    }
    total
}

/// Inter-site bytes of `f`, measured by rank 0 between two barriers from
/// the routers' statistics (rewritten twice a second).
fn crossing(world: &SimpleCommunicator, dir: &std::path::Path, f: impl FnOnce()) -> u64 {
    crossing_stats(world, dir, f).0
}

/// Inter-site (payload bytes, frames) of `f`, as [`crossing`].
fn crossing_stats(
    world: &SimpleCommunicator,
    dir: &std::path::Path,
    f: impl FnOnce(),
) -> (u64, u64) {
    world.barrier();
    std::thread::sleep(Duration::from_millis(1200));
    let before = (link_bytes(dir), link_stat(dir, "frames_out"));
    world.barrier();
    f();
    world.barrier();
    std::thread::sleep(Duration::from_millis(1200));
    let after = (link_bytes(dir), link_stat(dir, "frames_out"));
    world.barrier();
    (after.0 - before.0, after.1 - before.1)
}

#[test]
fn hierarchical_bcast_crosses_each_site_once() {
    let _g = lock();
    // The ranks and routers of the job run this function too, with the
    // variable already set by the parent.
    let dir = match std::env::var_os("METAMPI_ROUTER_STATS") {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            let d = std::env::temp_dir().join(format!("metampi-coll-hier-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            // The routers are started by this process and inherit it.
            std::env::set_var("METAMPI_ROUTER_STATS", &d);
            d
        }
    };
    let d = dir.clone();
    let outcome = Ranks::new(8)
        .meta(&config(22800))
        .env("METAMPI_ROUTER_STATS", &dir)
        .timeout(Duration::from_secs(60))
        .outcome("hierarchical_bcast_crosses_each_site_once", move |world| {
            const MIB: usize = 1 << 20;
            let me = world.rank();
            let root = world.process_at_rank(0);
            let expect: Vec<u8> = (0..MIB).map(|i| (i * 7 % 251) as u8).collect();
            let run = |alg: Option<Algorithm>| {
                metampi::collective::force_algorithm(Collective::Broadcast, alg).unwrap();
                let mut buf = if me == 0 {
                    expect.clone()
                } else {
                    vec![0; MIB]
                };
                let bytes = crossing(world, &d, || root.broadcast_into(&mut buf[..]));
                assert!(buf == expect, "bcast {alg:?}");
                bytes
            };
            let flat = run(Some(Algorithm::Binomial));
            let flat_sag = run(Some(Algorithm::ScatterAllGather));
            let auto = run(None);
            let hier = run(Some(Algorithm::Hierarchical));
            metampi::collective::force_algorithm(Collective::Broadcast, None).unwrap();
            // All-reduce of 1 MiB (sum of i64): hierarchically two partials
            // come in to site a and two results go out.
            let reduce = |alg: Option<Algorithm>| {
                metampi::collective::force_algorithm(Collective::AllReduce, alg).unwrap();
                let mine: Vec<i64> = (0..MIB / 8).map(|i| (i % 97) as i64 + me as i64).collect();
                let want: Vec<i64> = (0..MIB / 8).map(|i| 8 * (i % 97) as i64 + 28).collect();
                let mut out = vec![0i64; MIB / 8];
                let bytes = crossing(world, &d, || {
                    world.all_reduce_into(&mine[..], &mut out[..], SystemOperation::sum())
                });
                assert!(out == want, "allreduce {alg:?}");
                bytes
            };
            let ar_flat = reduce(Some(Algorithm::Rabenseifner));
            let ar_hier = reduce(None);
            metampi::collective::force_algorithm(Collective::AllReduce, None).unwrap();
            // All-to-all of 4 KiB blocks: 38 of the 64 blocks go between
            // sites (1 x 3 + 1 x 4 + 3 x 4 ordered pairs, both ways).
            const BS: usize = 4096;
            let a2a = |alg: Option<Algorithm>| {
                metampi::collective::force_algorithm(Collective::AllToAll, alg).unwrap();
                let send: Vec<u8> = (0..8 * BS)
                    .map(|i| (i / BS * 16 + me as usize) as u8)
                    .collect();
                let want: Vec<u8> = (0..8 * BS)
                    .map(|i| (me as usize * 16 + i / BS) as u8)
                    .collect();
                let mut out = vec![0u8; 8 * BS];
                let s =
                    crossing_stats(world, &d, || world.all_to_all_into(&send[..], &mut out[..]));
                assert!(out == want, "alltoall {alg:?}");
                s
            };
            // Reduce-scatter of 16 KiB blocks: pairwise sends the 38 blocks
            // whose owner is on another site; hierarchically each site
            // leader sends every other leader only that site's blocks,
            // 7 + 5 + 4 = 16 in all.
            const RS: usize = 16 << 10;
            let rs = |alg: Option<Algorithm>| {
                metampi::collective::force_algorithm(Collective::ReduceScatterBlock, alg).unwrap();
                let mine: Vec<i64> = (0..RS).map(|i| (i % 89) as i64 * (me as i64 + 1)).collect();
                let mut out = vec![0i64; RS / 8];
                let bytes = crossing(world, &d, || {
                    world.reduce_scatter_block_into(&mine[..], &mut out[..], SystemOperation::sum())
                });
                let want: Vec<i64> = (0..RS / 8)
                    .map(|i| ((me as usize * RS / 8 + i) % 89) as i64 * 36)
                    .collect();
                assert!(out == want, "reduce_scatter {alg:?}");
                bytes
            };
            let rs_flat = rs(Some(Algorithm::Pairwise));
            let rs_hier = rs(None);
            metampi::collective::force_algorithm(Collective::ReduceScatterBlock, None).unwrap();
            // Inclusive scan of 128 KiB: only the last ranks of the three
            // sites (0, 3, 7) trade totals across sites, four messages.
            const SC: usize = 128 << 10;
            let scan = |alg: Option<Algorithm>| {
                metampi::collective::force_algorithm(Collective::Scan, alg).unwrap();
                let mine: Vec<i64> = (0..SC / 8).map(|i| (i % 13) as i64 + me as i64).collect();
                let mut out = vec![0i64; SC / 8];
                let bytes = crossing(world, &d, || {
                    world.scan_into(&mine[..], &mut out[..], SystemOperation::sum())
                });
                let k = me as i64 + 1;
                let want: Vec<i64> = (0..SC / 8)
                    .map(|i| (i % 13) as i64 * k + k * (k - 1) / 2)
                    .collect();
                assert!(out == want, "scan {alg:?}");
                bytes
            };
            let scan_flat = scan(Some(Algorithm::RecursiveDoubling));
            let scan_hier = scan(None);
            metampi::collective::force_algorithm(Collective::Scan, None).unwrap();
            if me == 0 {
                println!(
                    "reduce-scatter of 16 KiB blocks over inter-site links: pairwise {rs_flat} \
                     bytes, automatic (hierarchical) {rs_hier}; 128 KiB scan: recursive \
                     doubling {scan_flat}, automatic (hierarchical) {scan_hier}"
                );
                let rs_data = 16 * RS as u64;
                assert!(rs_hier >= rs_data, "reduce-scatter {rs_hier} < {rs_data}");
                assert!(rs_hier <= rs_data + 8 * 1024, "reduce-scatter {rs_hier}");
                assert!(
                    rs_flat >= 38 * RS as u64,
                    "pairwise reduce-scatter {rs_flat}"
                );
                let sc_data = 4 * SC as u64;
                assert!(scan_hier >= sc_data, "scan {scan_hier} < {sc_data}");
                assert!(scan_hier <= sc_data + 8 * 1024, "scan {scan_hier}");
                assert!(scan_hier < scan_flat, "scan {scan_hier} vs {scan_flat}");
            }
            let (a2a_flat, a2a_flat_msgs) = a2a(Some(Algorithm::Pairwise));
            let (a2a_hier, a2a_hier_msgs) = a2a(None);
            metampi::collective::force_algorithm(Collective::AllToAll, None).unwrap();
            if me == 0 {
                println!(
                    "all-to-all of 4 KiB blocks, over inter-site links: pairwise {a2a_flat} bytes \
                     in {a2a_flat_msgs} frames, automatic (hierarchical) {a2a_hier} bytes in \
                     {a2a_hier_msgs} frames"
                );
                // Every block crosses once, in one message per ordered pair
                // of sites (6 envelopes instead of 38), plus the barrier
                // that ends the measurement.
                let data = 38 * BS as u64;
                assert!(a2a_hier >= data, "all-to-all {a2a_hier} < {data}");
                assert!(a2a_hier <= data + 4 * 1024, "all-to-all {a2a_hier}");
                assert!(a2a_hier < a2a_flat, "all-to-all {a2a_hier} vs {a2a_flat}");
            }
            if me == 0 {
                println!(
                    "1 MiB all-reduce, bytes over inter-site links: rabenseifner {ar_flat}, \
                     automatic (hierarchical) {ar_hier}"
                );
                // The three leaders swap partials: each of the six directed
                // inter-site links carries exactly one 1 MiB partial, all in
                // one wide-area phase.
                assert!(
                    ar_hier <= 6 * MIB as u64 + 64 * 1024,
                    "all-reduce {ar_hier}"
                );
                assert!(ar_hier < ar_flat, "all-reduce {ar_hier} vs {ar_flat}");
                println!(
                    "1 MiB bcast from site a, bytes over inter-site links: binomial {flat}, \
                     scatter_allgather {flat_sag}, automatic {auto}, hierarchical {hier}"
                );
                // Two remote sites: the data crosses exactly two links.
                let limit = 2 * MIB as u64 + 64 * 1024;
                assert!(hier >= 2 * MIB as u64, "hierarchical {hier} < 2 MiB");
                assert!(hier <= limit, "hierarchical {hier} > {limit}");
                assert!(auto <= limit, "automatic {auto} > {limit}");
                assert!(flat > limit, "binomial {flat} should cross more");
            }
        });
    let Some(outcome) = outcome else {
        return; // a rank or a router of the job
    };
    std::env::remove_var("METAMPI_ROUTER_STATS");
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(f) = &outcome.failure {
        panic!("hierarchical_bcast_crosses_each_site_once failed: {f}");
    }
}
