//! Topology-aware (hierarchical) collectives across three emulated meta
//! hosts of uneven size (1 + 3 + 4 ranks): every hierarchical operation
//! against a sequential reference on random data, every root, automatic and
//! forced choice, on the world and on communicators made by split (one whose
//! sites keep consecutive ranks, one that interleaves them, where a
//! non-commutative reduction must fall back to a flat algorithm); the
//! varcount gather, scatter and all-to-all also forced flat, between sites
//! of different byte order, and with malformed or disagreeing arguments (an
//! error where they are noticed, no rank left waiting); and the bytes that
//! cross the inter-site links, flat versus hierarchical, read from the
//! routers' statistics files.

mod coll_common;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use coll_common::*;
use metampi::collective::{Algorithm, Collective, SystemOperation};
use metampi::datatype::{Partition, PartitionMut};
use metampi::topology::{Color, SimpleCommunicator};
use metampi::traits::*;
use metampi::ErrorClass;
use metampi_testkit::{Ranks, StatsDir};

fn config(portbase: u16) -> String {
    format!(
        "PORTBASE {portbase}\n\
         METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
         METAHOST b {{ LAUNCH = local; NPROCS = 3; NODES = b0, b1; }}\n\
         METAHOST c {{ LAUNCH = local; NPROCS = 4; NODES = c0, c1; }}\n\
         PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
    )
}

/// Jobs of this file run one at a time: eight ranks and six routers each,
/// on two cores.
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
            // The varcount forms forced flat, and their immediate forms
            // (flat in any case) on the same data.
            for op in VARCOUNT_OPS {
                metampi::collective::force_algorithm(op, Some(Algorithm::Linear)).unwrap();
            }
            varcount(world, 53, "forced linear");
            for op in VARCOUNT_OPS {
                metampi::collective::force_algorithm(op, None).unwrap();
            }
            immediate_varcount(world, 59);
            malformed_varcount(world, "auto");
            for op in VARCOUNT_OPS {
                metampi::collective::force_algorithm(op, Some(Algorithm::Linear)).unwrap();
            }
            malformed_varcount(world, "forced linear");
            for op in VARCOUNT_OPS {
                metampi::collective::force_algorithm(op, None).unwrap();
            }
            world.barrier();
        });
}

/// Site b declared big-endian: the varcount forms, hierarchical and forced
/// flat, convert every block that crosses to or from it (random integers
/// and a padded struct, so a block left unconverted shows).
#[test]
fn varcount_between_byte_orders() {
    let _g = lock();
    let config = config(23100).replace("NODES = b0, b1; }", "NODES = b0, b1; BYTEORDER = big; }");
    assert!(config.contains("BYTEORDER = big"));
    Ranks::new(8)
        .meta(&config)
        .timeout(Duration::from_secs(90))
        .run("varcount_between_byte_orders", |world| {
            varcount(world, 71, "auto");
            for op in VARCOUNT_OPS {
                metampi::collective::force_algorithm(op, Some(Algorithm::Linear)).unwrap();
            }
            varcount(world, 73, "forced linear");
            for op in VARCOUNT_OPS {
                metampi::collective::force_algorithm(op, None).unwrap();
            }
            world.barrier();
        });
}

/// The operations whose varcount forms go hierarchical.
const VARCOUNT_OPS: [Collective; 3] = [
    Collective::Gather,
    Collective::Scatter,
    Collective::AllToAll,
];

/// Varcount gather, scatter (every root) and all-to-all; counts up to 900
/// elements make some messages inside a site rendezvous ones.
fn varcount(c: &SimpleCommunicator, seed: u64, how: &str) {
    check_varcount_rooted(c, seed, how, &[1, 300]);
    check_all_to_all_varcount(c, seed + 1, how, &[1, 200, 3000]);
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
    varcount(c, seed + 10, how);
}

/// The immediate varcount forms (flat across sites) on rendezvous-sized
/// blocks, in flight while blocking hierarchical varcount calls (with their
/// counts exchanges) run on the same communicator.
fn immediate_varcount(c: &SimpleCommunicator, seed: u64) {
    let (n, me) = (c.size(), c.rank());
    // Rank 6: on site c, not its leader.
    let root = n - 2;
    let (counts, displs, total) = partition_of(n, 4, 5000);
    let k = counts[me as usize] as usize;
    let mine = ints(seed, me, k);
    let mut gathered = vec![-1i64; total];
    let mut src = vec![-9i64; total];
    for r in 0..n as usize {
        let (d, k) = (displs[r] as usize, counts[r] as usize);
        src[d..d + k].copy_from_slice(&ints(seed + 1, r as i32, k));
    }
    let mut out = vec![0i64; k];
    let scounts: Vec<i32> = (0..n).map(|to| a2av_count(me, to, 1, 700)).collect();
    let rcounts: Vec<i32> = (0..n).map(|from| a2av_count(from, me, 1, 700)).collect();
    let (sdispls, stotal) = layout(&scounts, 0..n as usize, 0);
    let (rdispls, rtotal) = layout(&rcounts, (0..n as usize).rev(), 1);
    let a2a: Vec<i64> = (0..stotal as i64).map(|i| i * 10 + me as i64).collect();
    let mut a2a_out = vec![-1i64; rtotal];
    {
        let mut gpart = PartitionMut::new(&mut gathered[..], &counts[..], &displs[..]);
        let spart = Partition::new(&src[..], &counts[..], &displs[..]);
        let apart = Partition::new(&a2a[..], &scounts[..], &sdispls[..]);
        let mut aout = PartitionMut::new(&mut a2a_out[..], &rcounts[..], &rdispls[..]);
        metampi::request::scope(|s| {
            let p = c.process_at_rank(root);
            let ra = c.immediate_all_to_all_varcount_into(s, &apart, &mut aout);
            if me == root {
                let rg = p.immediate_gather_varcount_into_root(s, &mine[..], &mut gpart);
                let rs = p.immediate_scatter_varcount_into_root(s, &spart, &mut out[..]);
                varcount(c, seed + 2, "between immediate calls");
                rs.wait();
                rg.wait();
            } else {
                let rg = p.immediate_gather_varcount_into(s, &mine[..]);
                let rs = p.immediate_scatter_varcount_into(s, &mut out[..]);
                varcount(c, seed + 2, "between immediate calls");
                rs.wait();
                rg.wait();
            }
            ra.wait();
        });
    }
    if me == root {
        for r in 0..n as usize {
            let (d, k) = (displs[r] as usize, counts[r] as usize);
            assert!(
                gathered[d..d + k] == ints(seed, r as i32, k)[..],
                "igatherv from {r}"
            );
            assert_eq!(gathered[d + k], -1, "igatherv wrote a gap");
        }
    }
    assert!(out == ints(seed + 1, me, k), "iscatterv");
    for from in 0..n {
        // Rank `from` sends its elements in rank order, contiguously.
        let first: i32 = (0..me).map(|to| a2av_count(from, to, 1, 700)).sum();
        let (d, k) = (rdispls[from as usize] as usize, rcounts[from as usize]);
        let want: Vec<i64> = (first..first + k)
            .map(|i| i as i64 * 10 + from as i64)
            .collect();
        assert!(
            a2a_out[d..d + k as usize] == want[..],
            "ialltoallv from {from}"
        );
        assert_eq!(a2a_out[d + k as usize], -1, "ialltoallv wrote a gap");
    }
}

/// Malformed and disagreeing varcount arguments: the rank with the
/// malformed partition gets its error (`Count`), the others `Count` at
/// most (where they notice), nobody waits for ever, and collectives line up
/// afterwards. Blocks of 10 000 elements go by rendezvous inside sites.
fn malformed_varcount(c: &SimpleCommunicator, how: &str) {
    const K: usize = 10_000;
    let (n, me) = (c.size(), c.rank());
    let nu = n as usize;
    let class = |r: Result<(), metampi::Error>| r.err().map(|e| e.class());
    // How many ranks saw Count; any other error class fails the test.
    let counted = |got: Option<ErrorClass>, what: &str| {
        assert!(
            matches!(got, None | Some(ErrorClass::Count)),
            "{what}: {got:?} on {me} {how}"
        );
        let mut total = 0;
        c.all_reduce_into(
            &i32::from(got.is_some()),
            &mut total,
            SystemOperation::sum(),
        );
        total
    };
    let mine = vec![me as i64; K];
    let even = vec![K as i32; nu];
    let spaced: Vec<i32> = (0..n).map(|r| r * K as i32).collect();
    // Roots on site a, inside site b and inside site c (not leaders).
    for root in [0, 2, 5] {
        let p = c.process_at_rank(root);
        // Gather into a partition with one block too many.
        let got = if me == root {
            let counts = vec![K as i32; nu + 1];
            let displs: Vec<i32> = (0..=n).map(|r| r * K as i32).collect();
            let mut buf = vec![0i64; K * (nu + 1)];
            let mut part = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            class(p.try_gather_varcount_into_root(&mine[..], &mut part))
        } else {
            class(p.try_gather_varcount_into(&mine[..]))
        };
        let want = (me == root).then_some(ErrorClass::Count);
        assert_eq!(got, want, "gatherv, malformed at root {root} {how}");
        // Scatter from a partition with one block too few.
        let mut out = vec![0i64; K];
        let got = if me == root {
            let buf = vec![1i64; K * nu];
            let part = Partition::new(&buf[..], &even[1..], &spaced[1..]);
            class(p.try_scatter_varcount_into_root(&part, &mut out[..]))
        } else {
            class(p.try_scatter_varcount_into(&mut out[..]))
        };
        if me == root {
            assert_eq!(got, Some(ErrorClass::Count), "scatterv root {root} {how}");
        }
        assert!(counted(got, "scatterv") >= 1);
        // Gather where one sender's block is an element longer than the
        // root's partition says: the root notices.
        let bad = (root + 3) % n;
        let longer = vec![me as i64; K + 1];
        let got = if me == root {
            let mut buf = vec![0i64; K * nu];
            let mut part = PartitionMut::new(&mut buf[..], &even[..], &spaced[..]);
            class(p.try_gather_varcount_into_root(&mine[..], &mut part))
        } else {
            let send = if me == bad { &longer[..] } else { &mine[..] };
            class(p.try_gather_varcount_into(send))
        };
        let want = (me == root).then_some(ErrorClass::Count);
        assert_eq!(
            got, want,
            "gatherv, long block from {bad} root {root} {how}"
        );
        // Two ranks of a site without the root move an element from one
        // block to the other: the site's total is right, only the sizes of
        // its blocks tell (hierarchically: the sizes the leader sends along).
        let (x, y) = if root == 2 { (6, 7) } else { (2, 3) };
        let len = |r: i32| K + usize::from(r == x) - usize::from(r == y);
        let shifted = vec![me as i64; len(me)];
        let got = if me == root {
            let mut buf = vec![0i64; K * nu];
            let mut part = PartitionMut::new(&mut buf[..], &even[..], &spaced[..]);
            class(p.try_gather_varcount_into_root(&shifted[..], &mut part))
        } else {
            class(p.try_gather_varcount_into(&shifted[..]))
        };
        let want = (me == root).then_some(ErrorClass::Count);
        assert_eq!(got, want, "gatherv, {x} and {y} shifted, root {root} {how}");
        // The same in a scatter: the root's partition shifts the element.
        let shifted_counts: Vec<i32> = (0..n).map(|r| len(r) as i32).collect();
        let got = if me == root {
            let buf = vec![1i64; K * nu + 1];
            let part = Partition::new(&buf[..], &shifted_counts[..], &spaced[..]);
            class(p.try_scatter_varcount_into_root(&part, &mut out[..]))
        } else {
            class(p.try_scatter_varcount_into(&mut out[..]))
        };
        assert!(
            counted(got, "scatterv shifted") >= 1,
            "scatterv, {x} and {y} shifted, root {root} {how}"
        );
    }
    // All-to-all: a receive partition one block short on rank 2 (inside
    // site b), a send partition with a block too many on rank 4 (site c's
    // leader), then rank 7 expecting an element more from rank 1 than it
    // sends, then ranks 2 and 3 (site b) moving an element between their
    // blocks for rank 5 (site c), whose total stays right.
    let ones = vec![1i64; K * nu];
    let mut recv = vec![0i64; K * (nu + 1)];
    for case in 0..4 {
        let mut scounts = even.clone();
        let mut sdispls = spaced.clone();
        let mut rcounts = even.clone();
        let mut rdispls: Vec<i32> = (0..n).map(|r| r * (K as i32 + 1)).collect();
        match case {
            0 if me == 2 => {
                rcounts.pop();
                rdispls.pop();
            }
            1 if me == 4 => {
                scounts.push(0);
                sdispls.push(0);
            }
            2 if me == 7 => rcounts[1] += 1,
            3 if me == 2 => scounts[5] += 1,
            3 if me == 3 => scounts[5] -= 1,
            _ => {}
        }
        let sp = Partition::new(&ones[..], &scounts[..], &sdispls[..]);
        let mut rp = PartitionMut::new(&mut recv[..], &rcounts[..], &rdispls[..]);
        let got = class(c.try_all_to_all_varcount_into(&sp, &mut rp));
        let culprit = [2, 4, -1, -1][case];
        if me == culprit {
            assert_eq!(got, Some(ErrorClass::Count), "alltoallv case {case} {how}");
        }
        assert!(
            counted(got, "alltoallv") >= 1,
            "alltoallv case {case} {how}"
        );
    }
    // Everything still lines up.
    let mut s = 0;
    c.all_reduce_into(&1, &mut s, SystemOperation::sum());
    assert_eq!(s, n);
    varcount(c, 61, how);
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
fn link_bytes(dir: &Path) -> u64 {
    metampi_testkit::link_total(dir, "out", "payload_raw_out")
}

/// Inter-site bytes of `f`, measured by rank 0 between two barriers from
/// the routers' statistics (rewritten twice a second).
fn crossing(world: &SimpleCommunicator, dir: &Path, f: impl FnOnce()) -> u64 {
    crossing_stats(world, dir, f).0
}

/// Inter-site (payload bytes, frames) of `f`, as [`crossing`].
fn crossing_stats(world: &SimpleCommunicator, dir: &Path, f: impl FnOnce()) -> (u64, u64) {
    world.barrier();
    std::thread::sleep(Duration::from_millis(1200));
    let before = (
        link_bytes(dir),
        metampi_testkit::link_total(dir, "out", "frames_out"),
    );
    world.barrier();
    f();
    world.barrier();
    std::thread::sleep(Duration::from_millis(1200));
    let after = (
        link_bytes(dir),
        metampi_testkit::link_total(dir, "out", "frames_out"),
    );
    world.barrier();
    (after.0 - before.0, after.1 - before.1)
}

/// Runs `body` on the 1 + 3 + 4 sites of `config(portbase)` with router
/// statistics written to a fresh directory, which `body` gets to measure
/// with [`crossing`]. `name` is the test's name.
fn with_router_stats(name: &str, portbase: u16, body: impl FnOnce(&SimpleCommunicator, &Path)) {
    let _g = lock();
    let dir = StatsDir::new(name);
    let d = dir.path();
    let outcome = Ranks::new(8)
        .meta(&config(portbase))
        .router_stats(&dir)
        .timeout(Duration::from_secs(60))
        .outcome(name, move |world| body(world, d));
    let Some(outcome) = outcome else {
        return; // a rank or a router of the job
    };
    if let Some(f) = &outcome.failure {
        panic!("{name} failed: {f}");
    }
}

#[test]
fn hierarchical_bcast_crosses_each_site_once() {
    with_router_stats(
        "hierarchical_bcast_crosses_each_site_once",
        22800,
        |world, d| {
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
                let bytes = crossing(world, d, || root.broadcast_into(&mut buf[..]));
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
                let bytes = crossing(world, d, || {
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
                let s = crossing_stats(world, d, || world.all_to_all_into(&send[..], &mut out[..]));
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
                let bytes = crossing(world, d, || {
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
                let bytes = crossing(world, d, || {
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
        },
    );
}

/// Varcount gather and scatter with root 0 (site a) and all-to-all, counts
/// uneven with zeros among them: flat (forced linear; pairwise), every
/// remote rank's block crosses in a message of its own, hierarchically one
/// aggregated message per remote site (gather, scatter) or per ordered pair
/// of sites (all-to-all). The blocks cross once either way, so the bytes
/// differ by the envelopes of 7 messages against 2 (38 against 6).
#[test]
fn hierarchical_varcount_crosses_each_site_once() {
    with_router_stats(
        "hierarchical_varcount_crosses_each_site_once",
        22900,
        |world, d| {
            let (n, me) = (world.size(), world.rank());
            // Rank r's block: 0, 5000, 3000, 1000, 6000, 4000, 2000, 0 bytes.
            let count = |r: i32| (r * 5 % 7 * 1000) as usize;
            let counts: Vec<i32> = (0..n).map(|r| count(r) as i32).collect();
            let (displs, total) = layout(&counts, 0..n as usize, 0);
            let byte = |r: i32, i: usize| (r as usize * 31 + i % 251) as u8;
            let root = world.process_at_rank(0);
            let force = |alg: Option<Algorithm>| {
                for op in VARCOUNT_OPS {
                    let alg = alg.filter(|a| op.algorithms().contains(a));
                    metampi::collective::force_algorithm(op, alg).unwrap();
                }
            };
            let gatherv = |alg: Option<Algorithm>| {
                force(alg);
                let mine: Vec<u8> = (0..count(me)).map(|i| byte(me, i)).collect();
                let mut buf = vec![0u8; total];
                let stats = if me == 0 {
                    let mut part = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
                    crossing_stats(world, d, || {
                        root.gather_varcount_into_root(&mine[..], &mut part)
                    })
                } else {
                    crossing_stats(world, d, || root.gather_varcount_into(&mine[..]))
                };
                if me == 0 {
                    let want: Vec<u8> = (0..n)
                        .flat_map(|r| (0..count(r)).map(move |i| byte(r, i)))
                        .collect();
                    assert!(buf == want, "gatherv {alg:?}");
                }
                stats
            };
            let scatterv = |alg: Option<Algorithm>| {
                force(alg);
                let all: Vec<u8> = (0..n)
                    .flat_map(|r| (0..count(r)).map(move |i| byte(r, i)))
                    .collect();
                let mut out = vec![0u8; count(me)];
                let stats = if me == 0 {
                    let part = Partition::new(&all[..], &counts[..], &displs[..]);
                    crossing_stats(world, d, || {
                        root.scatter_varcount_into_root(&part, &mut out[..])
                    })
                } else {
                    crossing_stats(world, d, || root.scatter_varcount_into(&mut out[..]))
                };
                let want: Vec<u8> = (0..count(me)).map(|i| byte(me, i)).collect();
                assert!(out == want, "scatterv {alg:?}");
                stats
            };
            // Rank `from` sends rank `to` 0..=3 KiB.
            let a2a_count = |from: i32, to: i32| a2av_count(from, to, 0, 1024);
            let alltoallv = |alg: Option<Algorithm>| {
                force(alg);
                let scounts: Vec<i32> = (0..n).map(|to| a2a_count(me, to)).collect();
                let rcounts: Vec<i32> = (0..n).map(|from| a2a_count(from, me)).collect();
                let (sdispls, stotal) = layout(&scounts, 0..n as usize, 0);
                let (rdispls, rtotal) = layout(&rcounts, 0..n as usize, 0);
                let send: Vec<u8> = (0..n)
                    .flat_map(|to| {
                        (0..a2a_count(me, to) as usize).map(move |i| byte(me * 8 + to, i))
                    })
                    .collect();
                assert_eq!(send.len(), stotal);
                let mut out = vec![0u8; rtotal];
                let sp = Partition::new(&send[..], &scounts[..], &sdispls[..]);
                let mut rp = PartitionMut::new(&mut out[..], &rcounts[..], &rdispls[..]);
                let stats =
                    crossing_stats(world, d, || world.all_to_all_varcount_into(&sp, &mut rp));
                let want: Vec<u8> = (0..n)
                    .flat_map(|from| {
                        (0..a2a_count(from, me) as usize).map(move |i| byte(from * 8 + me, i))
                    })
                    .collect();
                assert!(out == want, "alltoallv {alg:?}");
                stats
            };
            let flat = Some(Algorithm::Linear);
            let figures = [
                ("gatherv", gatherv(flat), gatherv(None)),
                ("scatterv", scatterv(flat), scatterv(None)),
                (
                    "alltoallv",
                    alltoallv(Some(Algorithm::Pairwise)),
                    alltoallv(None),
                ),
            ];
            force(None);
            if me != 0 {
                return;
            }
            // Bytes of blocks between sites: everything off site a for
            // gather and scatter; for all-to-all every block between
            // ranks of different sites.
            let site = |r: i32| match r {
                0 => 0,
                1..=3 => 1,
                _ => 2,
            };
            let remote: u64 = (1..n).map(|r| count(r) as u64).sum();
            let a2a_data: u64 = (0..n)
                .flat_map(|f| (0..n).map(move |t| (f, t)))
                .filter(|&(f, t)| site(f) != site(t))
                .map(|(f, t)| a2a_count(f, t) as u64)
                .sum();
            // Messages between sites: flat, one per remote rank (gather,
            // scatter) or per pair of ranks on different sites, empty ones
            // included; hierarchically one per remote site or ordered pair
            // of sites.
            let messages = [(remote, 7, 2), (remote, 7, 2), (a2a_data, 38, 6)];
            for ((name, (fb, fr), (hb, hr)), (data, fm, hm)) in figures.iter().zip(messages) {
                println!(
                    "{name} over inter-site links: flat {fb} bytes ({fm} messages, {fr} frames), \
                     automatic (hierarchical) {hb} bytes ({hm} messages, {hr} frames); \
                     {data} bytes of blocks"
                );
                assert!(*hb >= data, "{name}: {hb} < {data}");
                assert!(*hb <= data + 4 * 1024, "{name}: {hb} bytes");
                // Each message saved is an envelope (64 bytes at least)
                // saved; frame counts vary with acknowledgements.
                assert!(
                    hb + (fm - hm) * 64 <= *fb,
                    "{name}: {hb} bytes against {fb} flat"
                );
            }
        },
    );
}
