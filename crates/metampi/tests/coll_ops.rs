//! Every blocking collective against a sequential reference on random data
//! (fixed seeds), on 1 to 9 ranks, every root, over shared memory and forced
//! TCP, with the automatic and every forced algorithm; zero-length
//! contributions, non-contiguous datatypes, user operations (a commutative
//! one and the non-commutative 2×2 matrix product), max-loc/min-loc, and the
//! same on communicators made by `split_by_color`.
//!
//! One job per (size, transport) runs the whole battery: jobs spawn
//! processes, checks are cheap.

mod coll_common;

use coll_common::*;
use metampi::collective::{
    reduce_local_into, Algorithm, Collective, SystemOperation, UserOperation, ValueIndex,
};
use metampi::datatype::{Partition, PartitionMut};
use metampi::topology::{Color, SimpleCommunicator};
use metampi::traits::*;
use metampi_testkit::Ranks;

macro_rules! sizes {
    ($($name:ident: $n:expr, $tcp:expr;)*) => {$(
        #[test]
        fn $name() {
            Ranks::new($n).force_tcp($tcp).run(stringify!($name), battery);
        }
    )*};
}

sizes! {
    shm_1: 1, false; shm_2: 2, false; shm_3: 3, false; shm_4: 4, false; shm_5: 5, false;
    shm_6: 6, false; shm_7: 7, false; shm_8: 8, false; shm_9: 9, false;
    tcp_2: 2, true; tcp_3: 3, true; tcp_4: 4, true; tcp_5: 5, true;
    tcp_6: 6, true; tcp_7: 7, true; tcp_8: 8, true; tcp_9: 9, true;
}

/// The shared-memory barrier both ways, whatever this machine's core count picks:
/// dissemination and flat (gathered at member 0), each with every rank late in turn,
/// on the world and on a communicator whose member 0 is another world rank.
fn shared_memory_barriers(world: &SimpleCommunicator) {
    let how = metampi::knobs::text("METAMPI_SHM_BARRIER").unwrap();
    metampi::collective::force_algorithm(Collective::Barrier, Some(Algorithm::SharedMemory))
        .unwrap();
    check_barrier(world, "world");
    let reversed = world
        .split_by_color_with_key(Color::with_value(0), -world.rank())
        .unwrap();
    check_barrier(&reversed, "reversed");
    for (c, what) in [(world, "world"), (&reversed, "reversed")] {
        let (served, kind) = metampi_testkit::shared_memory_barriers(c)
            .unwrap_or_else(|| panic!("{what} has no region"));
        assert_eq!(kind, how, "{what}");
        // Seven blocking barriers each (the immediate one takes the schedules).
        assert_eq!(served, 7, "{what}");
    }
}

#[test]
fn shared_memory_barriers_dissemination() {
    Ranks::new(5)
        .env("METAMPI_SHM_BARRIER", "dissemination")
        .run(
            "shared_memory_barriers_dissemination",
            shared_memory_barriers,
        );
}

#[test]
fn shared_memory_barriers_flat() {
    Ranks::new(5)
        .env("METAMPI_SHM_BARRIER", "flat")
        .run("shared_memory_barriers_flat", shared_memory_barriers);
}

/// Emulated machines with uneven rank counts: shared memory inside each,
/// TCP between them, so every collective mixes both transports.
#[test]
fn mixed_1_3_4() {
    Ranks::new(8)
        .nodes(&[("node-a", 1), ("node-b", 3), ("node-c", 4)])
        .run("mixed_1_3_4", battery);
}

#[test]
fn mixed_2_3() {
    Ranks::new(5)
        .nodes(&[("node-a", 2), ("node-b", 3)])
        .run("mixed_2_3", battery);
}

/// Three emulated sites (1 + 3 + 4 ranks, the last on two machines) joined
/// by routers: collectives over shared memory, TCP and routed links at once.
#[test]
fn three_sites_1_3_4() {
    // Router ports outside the ranges the p2p and topology tests use.
    let config = "PORTBASE 32100\n\
        METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
        METAHOST b { LAUNCH = local; NPROCS = 3; NODES = b0; }\n\
        METAHOST c { LAUNCH = local; NPROCS = 4; NODES = c0, c1; }\n\
        PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n";
    Ranks::new(8).meta(config).run("three_sites_1_3_4", battery);
}

/// The same with sites b and c paired directly (`PAIR b c 0`, no routers)
/// and b declared big-endian: the hierarchical collectives still see three
/// sites, and data between b and c is converted on the direct connections.
#[test]
fn direct_sites_1_3_4() {
    let config = "PORTBASE 32200\n\
        METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
        METAHOST b { LAUNCH = local; NPROCS = 3; NODES = b0; BYTEORDER = big; }\n\
        METAHOST c { LAUNCH = local; NPROCS = 4; NODES = c0, c1; }\n\
        PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 0\n";
    Ranks::new(8)
        .meta(config)
        .run("direct_sites_1_3_4", |world| {
            assert_eq!(world.num_meta_hosts(), 3);
            battery(world);
        });
}

fn battery(world: &SimpleCommunicator) {
    full(world, 11);
    // Two communicators made by split: even and odd world ranks, in reverse
    // order so that communicator ranks differ from world ranks.
    let sub = world
        .split_by_color_with_key(Color::with_value(world.rank() % 2), -world.rank())
        .expect("every rank has a colour");
    assert_eq!(sub.rank(), (sub.size() - 1) - world.rank() / 2);
    quick(&sub, 23);
    world.barrier();
}

/// Everything, with every algorithm.
fn full(c: &SimpleCommunicator, seed: u64) {
    barrier(c);
    bcast(c, seed, true);
    reduce(c, seed + 1, true);
    all_reduce(c, seed + 2, true);
    gather_scatter(c, seed + 3, true);
    varcount_rooted(c, seed + 4);
    all_gather(c, seed + 5, true);
    all_to_all(c, seed + 6, true);
    scans(c, seed + 7, true);
    reduce_scatter(c, seed + 8, true);
    local(seed + 9);
}

/// Every operation once, automatic algorithm, on a derived communicator.
fn quick(c: &SimpleCommunicator, seed: u64) {
    barrier(c);
    bcast(c, seed, false);
    reduce(c, seed + 1, false);
    all_reduce(c, seed + 2, false);
    gather_scatter(c, seed + 3, false);
    varcount_rooted(c, seed + 4);
    all_gather(c, seed + 5, false);
    all_to_all(c, seed + 6, false);
    scans(c, seed + 7, false);
    reduce_scatter(c, seed + 8, false);
}

/// Runs `f` once (automatic algorithm) or with every algorithm of `op`.
fn algs(op: Collective, all: bool, mut f: impl FnMut(String)) {
    if all {
        each_alg(op, |a| f(format!("{a:?}")));
    } else {
        f("auto".into());
    }
}

fn barrier(c: &SimpleCommunicator) {
    algs(Collective::Barrier, true, |alg| check_barrier(c, &alg));
}

fn bcast(c: &SimpleCommunicator, seed: u64, all: bool) {
    // 9000 values are past the eager limits of both transports: rendezvous.
    let mut l = lens(seed, &[0, 1, 13, 700], 3000);
    l.push(9000);
    algs(Collective::Broadcast, all, |alg| {
        check_bcast(c, seed, &alg, &l)
    });
    // A single value.
    let mut one = if c.rank() == 0 { 42u64 } else { 0 };
    c.process_at_rank(0).broadcast_into(&mut one);
    assert_eq!(one, 42);
}

fn reduce(c: &SimpleCommunicator, seed: u64, all: bool) {
    let (n, me) = (c.size(), c.rank());
    let mm = matmul();
    algs(Collective::Reduce, all, |alg| {
        for root in 0..n {
            let p = c.process_at_rank(root);
            for len in [0usize, 1, 13] {
                let mine = ints(seed, me, len);
                let want = fold(|r| ints(seed, r, len), n - 1, |a, b| a.wrapping_add(*b));
                let m = mats(seed, me, len);
                let want_m = fold(|r| mats(seed, r, len), n - 1, |a, b| a.mul(*b));
                if me == root {
                    let mut out = vec![7; len];
                    p.reduce_into_root(&mine[..], &mut out[..], SystemOperation::sum());
                    assert_eq!(out, want, "reduce sum root {root} len {len} {alg}");
                    let mut out = vec![Mat::default(); len];
                    p.reduce_into_root(&m[..], &mut out[..], &mm);
                    assert_eq!(out, want_m, "reduce matmul root {root} len {len} {alg}");
                } else {
                    p.reduce_into(&mine[..], SystemOperation::sum());
                    p.reduce_into(&m[..], &mm);
                }
            }
        }
        let root = n - 1;
        let mine = ints(seed + 50, me, 9000);
        if me == root {
            let mut out = vec![0; 9000];
            let want = fold(
                |r| ints(seed + 50, r, 9000),
                n - 1,
                |a, b| a.wrapping_add(*b),
            );
            c.process_at_rank(root).reduce_into_root(
                &mine[..],
                &mut out[..],
                SystemOperation::sum(),
            );
            assert!(out == want, "long reduce {alg}");
        } else {
            c.process_at_rank(root)
                .reduce_into(&mine[..], SystemOperation::sum());
        }
    });
}

fn all_reduce(c: &SimpleCommunicator, seed: u64, all: bool) {
    let (n, me) = (c.size(), c.rank());
    let mm = matmul();
    let add = UserOperation::commutative(|x, y| {
        let x = x.downcast::<i64>().expect("i64");
        for (a, b) in x.iter().zip(y.downcast::<i64>().expect("i64")) {
            *b = b.wrapping_add(*a);
        }
    });
    algs(Collective::AllReduce, all, |alg| {
        for len in lens(seed, &[0, 1, 13, 3000], 6000) {
            let mine = ints(seed, me, len);
            let want = fold(|r| ints(seed, r, len), n - 1, |a, b| a.wrapping_add(*b));
            let mut out = vec![0; len];
            c.all_reduce_into(&mine[..], &mut out[..], SystemOperation::sum());
            assert!(out == want, "allreduce sum len {len} {alg}");
            let mut out = vec![0; len];
            c.all_reduce_into(&mine[..], &mut out[..], &add);
            assert!(out == want, "allreduce user sum len {len} {alg}");

            let m = mats(seed, me, len.min(100));
            let want = fold(|r| mats(seed, r, len.min(100)), n - 1, |a, b| a.mul(*b));
            let mut out = vec![Mat::default(); m.len()];
            c.all_reduce_into(&m[..], &mut out[..], &mm);
            assert!(out == want, "allreduce matmul len {len} {alg}");

            let f = floats(seed, me, len);
            let want = fold(|r| floats(seed, r, len), n - 1, |a, b| a.max(*b));
            let mut out = vec![0.0; len];
            c.all_reduce_into(&f[..], &mut out[..], SystemOperation::max());
            assert!(out == want, "allreduce max len {len} {alg}");
            // A float sum: close to the sequential one, and identical on
            // every rank.
            let want = fold(|r| floats(seed, r, len), n - 1, |a, b| a + b);
            let mut out = vec![0.0; len];
            c.all_reduce_into(&f[..], &mut out[..], SystemOperation::sum());
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-9 * (1.0 + b.abs()), "float sum {alg}");
            }
            let first = out.first().copied().unwrap_or(0.0).to_bits();
            let mut firsts = vec![0u64; n as usize];
            c.all_gather_into(&first, &mut firsts[..]);
            assert!(firsts.iter().all(|&x| x == first), "ranks disagree {alg}");
        }
        // max-loc / min-loc with ties (smallest index wins).
        let len = 5;
        let pairs = |r: i32| -> Vec<ValueIndex<f64, i32>> {
            (0..len)
                .map(|i| ValueIndex::new(((r * 7 + i) % 3) as f64, r))
                .collect()
        };
        let mine = pairs(me);
        let mut out = vec![ValueIndex::default(); len as usize];
        c.all_reduce_into(&mine[..], &mut out[..], SystemOperation::max_loc());
        let best = |i: i32, max: bool| {
            let v = (0..n).map(|r| (r * 7 + i) % 3);
            let v = if max { v.max() } else { v.min() }.expect("n >= 1");
            ValueIndex::new(
                v as f64,
                (0..n).find(|r| (r * 7 + i) % 3 == v).expect("some rank"),
            )
        };
        for i in 0..len {
            assert_eq!(out[i as usize], best(i, true), "max_loc {alg}");
        }
        c.all_reduce_into(&mine[..], &mut out[..], SystemOperation::min_loc());
        for i in 0..len {
            assert_eq!(out[i as usize], best(i, false), "min_loc {alg}");
        }
    });
    // Logical and bitwise operations, and a user operation on a padded struct.
    let flags = (me % 3 == 0, me % 2 == 0);
    let mut and_or = [false; 2];
    c.all_reduce_into(&flags.0, &mut and_or[0], SystemOperation::logical_and());
    c.all_reduce_into(&flags.1, &mut and_or[1], SystemOperation::logical_or());
    assert_eq!(and_or, [n == 1, true]);
    let bits = 1u32 << (me % 32);
    let mut x = 0u32;
    c.all_reduce_into(&bits, &mut x, SystemOperation::bitwise_xor());
    assert_eq!(x, (0..n).fold(0, |a, r| a ^ (1u32 << (r % 32))));
    let p = padded(seed, me, 9);
    let mut out = vec![Padded::default(); 9];
    c.all_reduce_into(&p[..], &mut out[..], &padded_sum());
    let want = fold(
        |r| padded(seed, r, 9),
        n - 1,
        |a, b| Padded {
            a: a.a.wrapping_add(b.a),
            b: a.b.wrapping_add(b.b),
            c: a.c.wrapping_add(b.c),
        },
    );
    assert_eq!(out, want);
}

fn gather_scatter(c: &SimpleCommunicator, seed: u64, all: bool) {
    let (n, me) = (c.size(), c.rank());
    algs(Collective::Gather, all, |alg| {
        for root in 0..n {
            for len in [0usize, 1, 5] {
                let mine = ints(seed, me, len);
                let p = c.process_at_rank(root);
                if me == root {
                    let mut out = vec![-1; n as usize * len];
                    p.gather_into_root(&mine[..], &mut out[..]);
                    let want: Vec<i64> = (0..n).flat_map(|r| ints(seed, r, len)).collect();
                    assert_eq!(out, want, "gather root {root} len {len} {alg}");
                } else {
                    p.gather_into(&mine[..]);
                }
            }
        }
        let root = n / 3;
        let mine = padded(seed, me, 2000);
        if me == root {
            let mut out = vec![Padded::default(); 2000 * n as usize];
            c.process_at_rank(root)
                .gather_into_root(&mine[..], &mut out[..]);
            let want: Vec<Padded> = (0..n).flat_map(|r| padded(seed, r, 2000)).collect();
            assert!(out == want, "long padded gather {alg}");
        } else {
            c.process_at_rank(root).gather_into(&mine[..]);
        }
    });
    algs(Collective::Scatter, all, |alg| {
        for root in 0..n {
            for len in [0usize, 1, 5] {
                let p = c.process_at_rank(root);
                let mut out = vec![-1; len];
                if me == root {
                    let all: Vec<i64> = (0..n).flat_map(|r| ints(seed, r, len)).collect();
                    p.scatter_into_root(&all[..], &mut out[..]);
                } else {
                    p.scatter_into(&mut out[..]);
                }
                assert_eq!(
                    out,
                    ints(seed, me, len),
                    "scatter root {root} len {len} {alg}"
                );
            }
        }
        let root = n - 1;
        let mut out = vec![0; 6000];
        if me == root {
            let all: Vec<i64> = (0..n).flat_map(|r| ints(seed + 9, r, 6000)).collect();
            c.process_at_rank(root)
                .scatter_into_root(&all[..], &mut out[..]);
        } else {
            c.process_at_rank(root).scatter_into(&mut out[..]);
        }
        assert!(out == ints(seed + 9, me, 6000), "long scatter {alg}");
    });
}

fn varcount_rooted(c: &SimpleCommunicator, seed: u64) {
    check_varcount_rooted(c, seed, "auto", &[1]);
}

fn all_gather(c: &SimpleCommunicator, seed: u64, all: bool) {
    let (n, me) = (c.size(), c.rank());
    algs(Collective::AllGather, all, |alg| {
        for len in lens(seed, &[0, 1, 5, 1200], 600) {
            let mine = ints(seed, me, len);
            let mut out = vec![-1; n as usize * len];
            c.all_gather_into(&mine[..], &mut out[..]);
            let want: Vec<i64> = (0..n).flat_map(|r| ints(seed, r, len)).collect();
            assert!(out == want, "allgather len {len} {alg}");
        }
        let mine = padded(seed, me, 3);
        let mut out = vec![Padded::default(); 3 * n as usize];
        c.all_gather_into(&mine[..], &mut out[..]);
        let want: Vec<Padded> = (0..n).flat_map(|r| padded(seed, r, 3)).collect();
        assert_eq!(out, want, "padded allgather {alg}");
    });
    check_all_gather_varcount(c, seed, "auto");
}

/// The value rank `from` sends to rank `to` in all-to-all block `i`.
fn a2a(seed: u64, from: i32, to: i32, i: usize) -> i64 {
    (seed as i64) * 1_000_000 + (from as i64) * 10_000 + (to as i64) * 100 + i as i64
}

fn all_to_all(c: &SimpleCommunicator, seed: u64, all: bool) {
    let (n, me) = (c.size(), c.rank());
    algs(Collective::AllToAll, all, |alg| {
        for len in lens(seed, &[0, 1, 5, 300], 400) {
            let send: Vec<i64> = (0..n)
                .flat_map(|to| (0..len).map(move |i| a2a(seed, me, to, i)))
                .collect();
            let mut out = vec![-1; n as usize * len];
            c.all_to_all_into(&send[..], &mut out[..]);
            let want: Vec<i64> = (0..n)
                .flat_map(|from| (0..len).map(move |i| a2a(seed, from, me, i)))
                .collect();
            assert!(out == want, "alltoall len {len} {alg}");
        }
        // Varcount: rank i sends (i + j) % 3 values to rank j.
        let cnt = |from: i32, to: i32| (from + to) % 3;
        let scounts: Vec<i32> = (0..n).map(|to| cnt(me, to)).collect();
        let sdispls: Vec<i32> = (0..n).map(|to| to * 4).collect();
        let mut sbuf = vec![-5i64; 4 * n as usize];
        for to in 0..n {
            for i in 0..cnt(me, to) as usize {
                sbuf[(to * 4) as usize + i] = a2a(seed, me, to, i);
            }
        }
        let rcounts: Vec<i32> = (0..n).map(|from| cnt(from, me)).collect();
        let rdispls: Vec<i32> = (0..n).map(|from| (n - 1 - from) * 3).collect();
        let mut rbuf = vec![-1i64; 3 * n as usize];
        let spart = Partition::new(&sbuf[..], scounts, &sdispls[..]);
        let mut rpart = PartitionMut::new(&mut rbuf[..], rcounts, &rdispls[..]);
        c.all_to_all_varcount_into(&spart, &mut rpart);
        for from in 0..n {
            for i in 0..3 {
                let got = rbuf[((n - 1 - from) * 3) as usize + i as usize];
                let want = if i < cnt(from, me) {
                    a2a(seed, from, me, i as usize)
                } else {
                    -1
                };
                assert_eq!(got, want, "alltoallv from {from} {alg}");
            }
        }
    });
    // Non-contiguous elements.
    let send: Vec<Padded> = (0..n)
        .flat_map(|to| padded(seed + to as u64, me, 2))
        .collect();
    let mut out = vec![Padded::default(); 2 * n as usize];
    c.all_to_all_into(&send[..], &mut out[..]);
    let want: Vec<Padded> = (0..n)
        .flat_map(|from| padded(seed + me as u64, from, 2))
        .collect();
    assert_eq!(out, want);
}

fn scans(c: &SimpleCommunicator, seed: u64, all: bool) {
    for (op, exclusive) in [(Collective::Scan, false), (Collective::ExclusiveScan, true)] {
        algs(op, all, |alg| check_scan(c, seed, exclusive, &alg));
    }
}

fn reduce_scatter(c: &SimpleCommunicator, seed: u64, all: bool) {
    algs(Collective::ReduceScatterBlock, all, |alg| {
        check_reduce_scatter(c, seed, &lens(seed, &[0, 1, 5, 700], 400), &alg)
    });
}

fn local(seed: u64) {
    let a = mats(seed, 0, 4);
    let mut b = mats(seed, 1, 4);
    let want: Vec<Mat> = a.iter().zip(&b).map(|(x, y)| x.mul(*y)).collect();
    reduce_local_into(&a[..], &mut b[..], &matmul());
    assert_eq!(b, want);
    let x = [0b1100u16, 0xff00];
    let mut y = [0b1010u16, 0x0ff0];
    reduce_local_into(&x[..], &mut y[..], SystemOperation::bitwise_and());
    assert_eq!(y, [0b1000, 0x0f00]);
    reduce_local_into(&x[..], &mut y[..], SystemOperation::bitwise_or());
    assert_eq!(y, [0b1100, 0xff00]);
    reduce_local_into(&x[..], &mut y[..], SystemOperation::bitwise_xor());
    assert_eq!(y, [0, 0]);
}

/// The datatype handle the C-style function below last saw.
static SEEN_DATATYPE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// `inoutvec += invec` over `i64`s, written as for C MPI's `MPI_Op_create`.
unsafe extern "C" fn c_add(
    invec: *mut std::ffi::c_void,
    inoutvec: *mut std::ffi::c_void,
    len: *mut std::ffi::c_int,
    datatype: *mut metampi::ffi::MPI_Datatype,
) {
    // SAFETY: the library hands over `*len` aligned i64s at each pointer (the operation is
    // only used on i64 buffers), `inoutvec` exclusively.
    unsafe {
        SEEN_DATATYPE.store(*datatype, std::sync::atomic::Ordering::Relaxed);
        let x = std::slice::from_raw_parts(invec as *const i64, *len as usize);
        let y = std::slice::from_raw_parts_mut(inoutvec as *mut i64, *len as usize);
        for (a, b) in x.iter().zip(y) {
            *b = b.wrapping_add(*a);
        }
    }
}

/// `inoutvec = invec`: associative, not commutative, so a reduce in rank order yields the
/// first rank's values.
unsafe extern "C" fn c_first(
    invec: *mut std::ffi::c_void,
    inoutvec: *mut std::ffi::c_void,
    len: *mut std::ffi::c_int,
    _datatype: *mut metampi::ffi::MPI_Datatype,
) {
    // SAFETY: as in `c_add`.
    unsafe {
        std::ptr::copy_nonoverlapping(invec as *const i64, inoutvec as *mut i64, *len as usize);
    }
}

/// rsmpi's `UnsafeUserOperation`: C-style functions as reduction operations, commutative and
/// not, blocking and nonblocking, with the datatype handle passed through.
#[test]
fn c_style_user_operations() {
    use metampi::collective::UnsafeUserOperation;
    Ranks::new(4).run("c_style_user_operations", |world| {
        let (n, me) = (world.size() as i64, world.rank() as i64);
        // SAFETY: `c_add` and `c_first` keep to `*len` i64s and are used on i64 buffers only.
        let (add, first) = unsafe {
            (
                UnsafeUserOperation::commutative(c_add),
                UnsafeUserOperation::associative(c_first),
            )
        };
        let mine: Vec<i64> = (0..1000).map(|i| i * (me + 1)).collect();
        let mut sum = vec![0i64; 1000];
        world.all_reduce_into(&mine[..], &mut sum[..], add);
        let total: i64 = (1..=n).sum();
        assert!(sum.iter().enumerate().all(|(i, &v)| v == i as i64 * total));
        assert_eq!(
            SEEN_DATATYPE.load(std::sync::atomic::Ordering::Relaxed),
            i64::equivalent_datatype().type_id(),
            "the function saw i64's handle"
        );
        let root = world.process_at_rank(n as i32 - 1);
        if me == n - 1 {
            let mut out = vec![0i64; 1000];
            root.reduce_into_root(&mine[..], &mut out[..], first);
            assert_eq!(
                out,
                (0..1000).collect::<Vec<i64>>(),
                "rank 0's values first"
            );
        } else {
            root.reduce_into(&mine[..], first);
        }
        let mut out = 0i64;
        metampi::request::scope(|s| {
            world
                .immediate_all_reduce_into(s, &me, &mut out, add)
                .wait();
        });
        assert_eq!(out, (0..n).sum::<i64>());
    });
}

/// Buffers made with `DynBuffer::from_raw` / `DynBufferMut::from_raw` (rsmpi's
/// type-erased buffers) work wherever a buffer does: a broadcast of a
/// duplicated `i32` type, and a send of every other element (a vector type)
/// received densely.
#[test]
fn raw_dyn_buffers_in_collectives_and_point_to_point() {
    use metampi::datatype::{DynBuffer, DynBufferMut, UserDatatype};
    Ranks::new(3).run(
        "raw_dyn_buffers_in_collectives_and_point_to_point",
        |world| {
            let me = world.rank();
            let int_type = i32::equivalent_datatype().dup();
            let mut ints = if me == 0 { [1i32, 2, 3, 4] } else { [0; 4] };
            // SAFETY: `ints` holds 4 i32s and is used only through `buffer` meanwhile.
            let mut buffer = unsafe {
                DynBufferMut::from_raw(ints.as_mut_ptr(), ints.count(), int_type.as_ref())
            };
            assert_eq!(buffer.len(), 4);
            world.process_at_rank(0).broadcast_into(&mut buffer);
            assert_eq!(ints, [1, 2, 3, 4]);

            // Elements 0, 2, 4 of six: a vector of 3 blocks of 1 with stride 2.
            let every_other = UserDatatype::vector(3, 1, 2, &i64::equivalent_datatype());
            if me == 1 {
                let six: Vec<i64> = (10..16).collect();
                // SAFETY: `six` holds one element of `every_other` (it spans 5 i64s).
                let send = unsafe { DynBuffer::from_raw(six.as_ptr(), 1, every_other.as_ref()) };
                world.process_at_rank(2).send(&send);
            } else if me == 2 {
                let (got, _) = world.process_at_rank(1).receive_vec::<i64>();
                assert_eq!(got, [10, 12, 14]);
            }
            world.barrier();
        },
    );
}

/// `Complex32` and `Complex64` (feature `complex`, on by default) as buffer
/// elements: broadcast, a sum and a product all-reduce that multiply as complex
/// numbers, and `Type` for an operation complex numbers do not have.
#[cfg(feature = "complex")]
#[test]
fn complex_numbers_reduce_as_complex_numbers() {
    use num_complex::{Complex32, Complex64};
    Ranks::new(3).run("complex_numbers_reduce_as_complex_numbers", |world| {
        let me = world.rank();
        let mut data = if me == 0 {
            vec![Complex64::new(1.0, 2.0), Complex64::new(2.0, 3.0)]
        } else {
            vec![Complex64::new(0.0, 0.0); 2]
        };
        world.process_at_rank(0).broadcast_into(&mut data[..]);
        assert_eq!(data, [Complex64::new(1.0, 2.0), Complex64::new(2.0, 3.0)]);

        // Rank r contributes 1 + r·i: the product over 3 ranks is
        // (1)(1 + i)(1 + 2i) = -1 + 3i, the sum 3 + 3i.
        let mine = Complex64::new(1.0, me as f64);
        let mut prod = Complex64::default();
        world.all_reduce_into(&mine, &mut prod, SystemOperation::product());
        assert_eq!(prod, Complex64::new(-1.0, 3.0));
        let mut sum = Complex64::default();
        world.all_reduce_into(&mine, &mut sum, SystemOperation::sum());
        assert_eq!(sum, Complex64::new(3.0, 3.0));
        let small = [Complex32::new(0.0, 1.0); 4];
        let mut p32 = [Complex32::default(); 4];
        world.all_reduce_into(&small[..], &mut p32[..], SystemOperation::product());
        // i³ = -i.
        assert_eq!(p32, [Complex32::new(0.0, -1.0); 4]);

        let r = world.try_all_reduce_into(&mine, &mut prod, SystemOperation::max());
        assert_eq!(
            r.err().map(|e| e.class()),
            Some(metampi::ErrorClass::Type),
            "max of complex numbers"
        );
    });
}

/// A root that runs ahead by 200 broadcasts of 32 KiB while the others
/// start late: past a megabyte queued at a member, the root's messages wait
/// in the ring (flow control) and the root in its broadcast. A receive
/// posted before any broadcast is taken (odd ranks probe first) must lift
/// that hold (the message it wants comes after all 200), and every
/// broadcast must arrive intact and in order.
fn run_ahead(world: &SimpleCommunicator) {
    const N: u32 = 200;
    let root = world.process_at_rank(0);
    let mut buf = vec![0u32; 8192];
    if world.rank() == 0 {
        for k in 0..N {
            for (i, x) in buf.iter_mut().enumerate() {
                *x = k * 100_000 + i as u32;
            }
            root.broadcast_into(&mut buf[..]);
        }
        for r in 1..world.size() {
            world.process_at_rank(r).send_with_tag(&N, 5);
        }
    } else {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if world.rank() % 2 == 1 {
            root.probe_with_tag(5);
        }
        let (n, _) = root.receive_with_tag::<u32>(5);
        assert_eq!(n, N);
        for k in 0..N {
            root.broadcast_into(&mut buf[..]);
            for (i, &x) in buf.iter().enumerate() {
                assert_eq!(x, k * 100_000 + i as u32, "broadcast {k}, element {i}");
            }
        }
    }
    world.barrier();
}

/// Rooted collectives through the shared-memory region, between
/// all-reduces, while members lag by turns: a root leaves once it has
/// published and a member that only contributes leaves at once, so a
/// lagging member must still find each call's data in its slot, never a
/// later call's written over it.
fn rooted_shared_memory_calls_keep_their_slots(world: &SimpleCommunicator) {
    use std::time::Duration;
    let ops = [
        Collective::Broadcast,
        Collective::Reduce,
        Collective::Gather,
        Collective::Scatter,
        Collective::AllReduce,
    ];
    for op in ops {
        metampi::collective::force_algorithm(op, Some(Algorithm::SharedMemory)).unwrap();
    }
    let (n, me) = (world.size(), world.rank());
    let value = |i: i32, r: i32| i64::from(i) * 1000 + i64::from(r);
    let before = metampi_testkit::shared_memory_calls(world);
    const CALLS: i32 = 500;
    for i in 0..CALLS {
        // Blocks of 24 rooted calls (more than a member's slots) with one
        // root, then an all-reduce. In turn a block of broadcasts and
        // scatters, whose root runs ahead while the next member arrives
        // late, and a block of reduces and gathers, whose other members run
        // ahead while the root arrives late.
        let block = i / 25;
        let root_rank = block % n;
        let root = world.process_at_rank(root_rank);
        let giving = (block / n) % 2 == 0;
        let late = if giving {
            (root_rank + 1) % n
        } else {
            root_rank
        };
        if i % 25 == 0 && me == late {
            std::thread::sleep(Duration::from_micros(300));
        }
        let kind = match (i % 25, giving) {
            (24, _) => 4,
            (k, true) => [0, 3][k as usize % 2],
            (k, false) => [1, 2][k as usize % 2],
        };
        match kind {
            0 => {
                let mut v = [if me == root_rank { value(i, me) } else { -1 }; 3];
                root.broadcast_into(&mut v[..]);
                assert_eq!(v, [value(i, root_rank); 3], "broadcast {i}");
            }
            1 => {
                let mine = [value(i, me), 1];
                if me == root_rank {
                    let mut sum = [0i64; 2];
                    root.reduce_into_root(&mine[..], &mut sum[..], SystemOperation::sum());
                    let want: i64 = (0..n).map(|r| value(i, r)).sum();
                    assert_eq!(sum, [want, i64::from(n)], "reduce {i}");
                } else {
                    root.reduce_into(&mine[..], SystemOperation::sum());
                }
            }
            2 => {
                let mine = value(i, me);
                if me == root_rank {
                    let mut all = vec![0i64; n as usize];
                    root.gather_into_root(&mine, &mut all[..]);
                    let want: Vec<i64> = (0..n).map(|r| value(i, r)).collect();
                    assert_eq!(all, want, "gather {i}");
                } else {
                    root.gather_into(&mine);
                }
            }
            3 => {
                let mut got = -1i64;
                if me == root_rank {
                    let all: Vec<i64> = (0..n).map(|r| value(i, r)).collect();
                    root.scatter_into_root(&all[..], &mut got);
                } else {
                    root.scatter_into(&mut got);
                }
                assert_eq!(got, value(i, me), "scatter {i}");
            }
            _ => {
                let mut sum = 0i64;
                world.all_reduce_into(&value(i, me), &mut sum, SystemOperation::sum());
                assert_eq!(
                    sum,
                    (0..n).map(|r| value(i, r)).sum::<i64>(),
                    "all-reduce {i}"
                );
            }
        }
    }
    for op in ops {
        metampi::collective::force_algorithm(op, None).unwrap();
    }
    // Every call went through the region (none took the schedules).
    assert_eq!(
        metampi_testkit::shared_memory_calls(world) - before,
        CALLS as u64
    );
}

#[test]
fn rooted_shared_memory_calls_keep_their_slots_2() {
    stall_checked(
        2,
        "rooted_shared_memory_calls_keep_their_slots_2",
        rooted_shared_memory_calls_keep_their_slots,
    );
}

#[test]
fn rooted_shared_memory_calls_keep_their_slots_7() {
    stall_checked(
        7,
        "rooted_shared_memory_calls_keep_their_slots_7",
        rooted_shared_memory_calls_keep_their_slots,
    );
}

#[test]
fn rooted_shared_memory_calls_keep_their_slots_4() {
    stall_checked(
        4,
        "rooted_shared_memory_calls_keep_their_slots_4",
        rooted_shared_memory_calls_keep_their_slots,
    );
}

/// Empty all-reduces, all-gathers and all-to-alls on the shared-memory
/// flags wait for nobody, as MPICH's and Open MPI's return at once: rank 0
/// finishes each before it sends what the others wait for before they even
/// start theirs (were it to wait for them, the job would stall). A member
/// that expects bytes where another has none still reports `Count`, and
/// the calls after all that still agree.
fn empty_calls_wait_for_nobody(world: &SimpleCommunicator) {
    let ops = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::AllToAll,
    ];
    for op in ops {
        metampi::collective::force_algorithm(op, Some(Algorithm::SharedMemory)).unwrap();
    }
    let me = world.rank();
    let before = metampi_testkit::shared_memory_calls(world);
    // The region is set up collectively by the first call on it.
    let mut x = 0i64;
    world.all_reduce_into(&1i64, &mut x, SystemOperation::sum());
    let empty: [i64; 0] = [];
    for round in 0..20i64 {
        if me != 0 {
            let (k, _) = world.process_at_rank(0).receive::<i64>();
            assert_eq!(k, round);
        }
        let mut out: [i64; 0] = [];
        world.all_reduce_into(&empty[..], &mut out[..], SystemOperation::sum());
        world.all_gather_into(&empty[..], &mut out[..]);
        world.all_to_all_into(&empty[..], &mut out[..]);
        if me == 0 {
            for r in 1..world.size() {
                world.process_at_rank(r).send(&round);
            }
        }
    }
    // Rank 1 expects a vector where the others bring none.
    let mine = [1i64];
    let mut out = [0i64];
    let len = usize::from(me == 1);
    let r = world.try_all_reduce_into(&mine[..len], &mut out[..len], SystemOperation::sum());
    match me {
        1 => assert_eq!(r.err().map(|e| e.class()), Some(metampi::ErrorClass::Count)),
        _ => r.unwrap(),
    }
    let mut sum = 0i64;
    world.all_reduce_into(&i64::from(me), &mut sum, SystemOperation::sum());
    let n = i64::from(world.size());
    assert_eq!(sum, n * (n - 1) / 2);
    for op in ops {
        metampi::collective::force_algorithm(op, None).unwrap();
    }
    assert_eq!(metampi_testkit::shared_memory_calls(world) - before, 63);
}

#[test]
fn empty_calls_wait_for_nobody_3() {
    stall_checked(
        3,
        "empty_calls_wait_for_nobody_3",
        empty_calls_wait_for_nobody,
    );
}

/// Runs `f` on `n` ranks with a timeout short enough that a stall fails
/// the test quickly.
fn stall_checked(n: usize, name: &str, f: fn(&SimpleCommunicator)) {
    Ranks::new(n)
        .timeout(std::time::Duration::from_secs(60))
        .run(name, f);
}

#[test]
fn run_ahead_shm_2() {
    stall_checked(2, "run_ahead_shm_2", run_ahead);
}

#[test]
fn run_ahead_shm_4() {
    stall_checked(4, "run_ahead_shm_4", run_ahead);
}

/// A program that relies on the library buffering a run-ahead root's
/// broadcasts (MPI calls it unsafe; unbounded buffering runs it): rank 0
/// broadcasts 200 × 32 KiB to rank 1 on a communicator of the two, then
/// tells rank 2; rank 2 then tells rank 1, which only then joins the
/// broadcasts. Rank 1 waits on rank 2, not on the root, so no posted
/// receive lifts the hold on the root's messages: the wait must drain them
/// before it sleeps, or the three ranks stall for good.
fn run_ahead_third_party(world: &SimpleCommunicator) {
    const N: u32 = 200;
    let me = world.rank();
    let pair = world
        .split_by_color(Color::with_value(if me < 2 { 0 } else { 1 }))
        .expect("every rank has a color");
    let mut buf = vec![0u32; 8192];
    match me {
        0 => {
            let root = pair.process_at_rank(0);
            for k in 0..N {
                buf.fill(k);
                root.broadcast_into(&mut buf[..]);
            }
            world.process_at_rank(2).send_with_tag(&N, 5);
        }
        1 => {
            let (n, _) = world.process_at_rank(2).receive_with_tag::<u32>(6);
            assert_eq!(n, N);
            let root = pair.process_at_rank(0);
            for k in 0..N {
                root.broadcast_into(&mut buf[..]);
                assert!(buf.iter().all(|&x| x == k), "broadcast {k}");
            }
        }
        _ => {
            let (n, _) = world.process_at_rank(0).receive_with_tag::<u32>(5);
            world.process_at_rank(1).send_with_tag(&n, 6);
        }
    }
    world.barrier();
}

#[test]
fn run_ahead_third_party_shm_3() {
    stall_checked(3, "run_ahead_third_party_shm_3", run_ahead_third_party);
}

/// A long broadcast inside one machine runs scatter + ring all-gather where
/// every rank has a core, binomial where ranks outnumber cores (each ring
/// step would wait for a peer to be scheduled); either way every member
/// gets the root's bytes.
#[test]
fn long_broadcast_follows_the_cores() {
    Ranks::new(8).run("long_broadcast_follows_the_cores", |world| {
        let crowded = world.size() as usize > metampi::environment::machine_cores();
        let want = if crowded {
            Algorithm::Binomial
        } else {
            Algorithm::ScatterAllGather
        };
        for bytes in [128 << 10, 1 << 20] {
            let got =
                metampi_testkit::collective_algorithm(world, Collective::Broadcast, bytes, true);
            assert_eq!(got, want, "{bytes} bytes, crowded {crowded}");
            let root = world.process_at_rank(3);
            let fill = |i: usize| (i * 7 + bytes) as u8;
            let mut buf: Vec<u8> = if world.rank() == 3 {
                (0..bytes).map(fill).collect()
            } else {
                vec![0; bytes]
            };
            root.broadcast_into(&mut buf[..]);
            assert!(buf.iter().enumerate().all(|(i, &b)| b == fill(i)));
        }
        // Short ones stay binomial everywhere.
        let short = metampi_testkit::collective_algorithm(world, Collective::Broadcast, 64, true);
        assert_eq!(short, Algorithm::Binomial);
    });
}

/// Floating-point sums whose last bits depend on the order of addition: the
/// shared-memory path combines the members' vectors in the order of the
/// schedule it stands in for (recursive doubling for all-reduce, the binomial
/// tree from the root for reduce), so every path and every call gives the
/// same bits, and those of the order written out here.
fn sums_keep_their_bits(world: &SimpleCommunicator) {
    let (n, me) = (world.size() as usize, world.rank());
    let value = |r: usize, i: usize| {
        let x = ((r * 7919 + i * 104_729) % 1000) as f64;
        (1.0 + x / 997.0)
            * 10f64.powi(((r + i) % 5) as i32 * 4 - 8)
            * if (r + i) % 3 == 0 { -1.0 } else { 1.0 }
    };
    let mine: Vec<f64> = (0..16).map(|i| value(me as usize, i)).collect();
    // Recursive doubling over blocks of consecutive members, after the
    // non-power-of-two fold of the first pairs.
    let doubling = |i: usize| {
        let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let rem = n - p2;
        let mut v: Vec<f64> = (0..p2)
            .map(|q| {
                if q < rem {
                    value(2 * q, i) + value(2 * q + 1, i)
                } else {
                    value(q + rem, i)
                }
            })
            .collect();
        let mut mask = 1;
        while mask < p2 {
            for q in (0..p2).step_by(2 * mask) {
                v[q] += v[q + mask];
            }
            mask <<= 1;
        }
        v[0]
    };
    // The binomial tree over ranks relative to the root.
    fn tree(rel: usize, size: usize, n: usize, at: &dyn Fn(usize) -> f64) -> f64 {
        let mut acc = at(rel);
        let mut mask = 1;
        while mask < size && rel + mask < n {
            acc += tree(rel + mask, mask, n, at);
            mask <<= 1;
        }
        acc
    }
    let want: Vec<f64> = (0..16).map(doubling).collect();
    let right: Vec<f64> = (0..16)
        .map(|i| {
            (0..n)
                .rev()
                .map(|r| value(r, i))
                .reduce(|a, b| b + a)
                .unwrap()
        })
        .collect();
    if n == 3 {
        assert_ne!(want, right, "the data must tell the orders apart");
    }
    for alg in [
        None,
        Some(Algorithm::RecursiveDoubling),
        Some(Algorithm::SharedMemory),
    ] {
        metampi::collective::force_algorithm(Collective::AllReduce, alg).unwrap();
        for call in 0..6 {
            let mut out = vec![0f64; 16];
            world.all_reduce_into(&mine[..], &mut out[..], SystemOperation::sum());
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&want), "all-reduce {alg:?} call {call}");
        }
    }
    metampi::collective::force_algorithm(Collective::AllReduce, None).unwrap();
    for alg in [Some(Algorithm::Binomial), Some(Algorithm::SharedMemory)] {
        metampi::collective::force_algorithm(Collective::Reduce, alg).unwrap();
        for root in 0..n {
            let p = world.process_at_rank(root as i32);
            if me as usize == root {
                let mut out = [0f64; 16];
                p.reduce_into_root(&mine[..], &mut out[..], SystemOperation::sum());
                for (i, x) in out.iter().enumerate() {
                    let at = |rel: usize| value((rel + root) % n, i);
                    let want = tree(0, n.next_power_of_two(), n, &at);
                    assert_eq!(
                        x.to_bits(),
                        want.to_bits(),
                        "reduce {alg:?} root {root} element {i}"
                    );
                }
            } else {
                p.reduce_into(&mine[..], SystemOperation::sum());
            }
        }
    }
    metampi::collective::force_algorithm(Collective::Reduce, None).unwrap();
}

#[test]
fn sums_keep_their_bits_3() {
    stall_checked(3, "sums_keep_their_bits_3", sums_keep_their_bits);
}

#[test]
fn sums_keep_their_bits_6() {
    stall_checked(6, "sums_keep_their_bits_6", sums_keep_their_bits);
}
