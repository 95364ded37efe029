//! Data, operations and sequential references shared by the `coll_*` tests.
#![allow(dead_code)]

use metampi::collective::{Algorithm, Collective, SystemOperation, UserOperation};
use metampi::datatype::{Partition, PartitionMut};
use metampi::topology::SimpleCommunicator;
use metampi::traits::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A 2×2 integer matrix: its product is associative but not commutative.
#[derive(Equivalence, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mat(pub [i64; 4]);

impl Mat {
    pub fn mul(self, o: Mat) -> Mat {
        let [a, b, c, d] = self.0;
        let [e, f, g, h] = o.0;
        let m = |x: i64, y: i64, z: i64, w: i64| x.wrapping_mul(y).wrapping_add(z.wrapping_mul(w));
        Mat([m(a, e, b, g), m(a, f, b, h), m(c, e, d, g), m(c, f, d, h)])
    }
}

/// `inout = in · inout`, element-wise over matrices.
pub fn matmul() -> UserOperation<'static> {
    UserOperation::associative(|x, y| {
        let x = x.downcast::<Mat>().expect("matrices");
        let y = y.downcast::<Mat>().expect("matrices");
        for (a, b) in x.iter().zip(y.iter_mut()) {
            *b = a.mul(*b);
        }
    })
}

/// A struct with padding: its datatype is not contiguous.
#[derive(Equivalence, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Padded {
    pub a: u8,
    pub b: u32,
    pub c: u16,
}

/// Field-wise wrapping sum, commutative, on `Padded`.
pub fn padded_sum() -> UserOperation<'static> {
    UserOperation::commutative(|x, y| {
        let x = x.downcast::<Padded>().expect("padded");
        let y = y.downcast::<Padded>().expect("padded");
        for (a, b) in x.iter().zip(y.iter_mut()) {
            b.a = b.a.wrapping_add(a.a);
            b.b = b.b.wrapping_add(a.b);
            b.c = b.c.wrapping_add(a.c);
        }
    })
}

fn rng(seed: u64, rank: i32, salt: u64) -> StdRng {
    StdRng::seed_from_u64(seed.wrapping_mul(1_000_003) ^ (rank as u64) << 20 ^ salt)
}

/// Rank `rank`'s integers for test `seed`: every rank can compute anyone's.
pub fn ints(seed: u64, rank: i32, len: usize) -> Vec<i64> {
    let mut r = rng(seed, rank, 1);
    (0..len)
        .map(|_| r.gen_range(-1_000_000..1_000_000))
        .collect()
}

pub fn floats(seed: u64, rank: i32, len: usize) -> Vec<f64> {
    let mut r = rng(seed, rank, 2);
    (0..len).map(|_| r.gen_range(-1000.0..1000.0)).collect()
}

pub fn mats(seed: u64, rank: i32, len: usize) -> Vec<Mat> {
    let mut r = rng(seed, rank, 3);
    (0..len)
        .map(|_| Mat([0; 4].map(|_| r.gen_range(-3..=3))))
        .collect()
}

pub fn padded(seed: u64, rank: i32, len: usize) -> Vec<Padded> {
    let mut r = rng(seed, rank, 4);
    (0..len)
        .map(|_| Padded {
            a: r.gen(),
            b: r.gen(),
            c: r.gen(),
        })
        .collect()
}

/// Element-wise fold of `f` over ranks `0..=last` in rank order.
pub fn fold<T: Clone>(
    per_rank: impl Fn(i32) -> Vec<T>,
    last: i32,
    f: impl Fn(&T, &T) -> T,
) -> Vec<T> {
    let mut acc = per_rank(0);
    for r in 1..=last {
        let x = per_rank(r);
        for (a, b) in acc.iter_mut().zip(&x) {
            *a = f(a, b);
        }
    }
    acc
}

/// Runs `f` with the automatic choice and then with every algorithm of `op`
/// forced, and returns to the automatic choice. All ranks call it alike.
pub fn each_alg(op: Collective, mut f: impl FnMut(Option<Algorithm>)) {
    f(None);
    for &a in op.algorithms() {
        metampi::collective::force_algorithm(op, Some(a)).expect("the op's own algorithm");
        f(Some(a));
    }
    metampi::collective::force_algorithm(op, None).expect("clearing is always allowed");
}

/// Counts 0..=3 and displacements with a gap of one element after each
/// block, for a varcount buffer of `n` blocks; returns the total length.
pub fn partition(n: i32, salt: i32) -> (Vec<i32>, Vec<i32>, usize) {
    partition_of(n, salt, 1)
}

/// As [`partition`] with every count multiplied by `unit`.
pub fn partition_of(n: i32, salt: i32, unit: i32) -> (Vec<i32>, Vec<i32>, usize) {
    let counts: Vec<i32> = (0..n).map(|r| (r * 7 + salt * 3 + 1) % 4 * unit).collect();
    // Reverse order of blocks in memory, so displacements are not monotonic.
    let (displs, total) = layout(&counts, (0..n as usize).rev(), 1);
    (counts, displs, total)
}

/// Displacements of blocks of `counts` placed in memory in `order` (block
/// indices), with `gap` elements after each; and the total length.
pub fn layout(counts: &[i32], order: impl Iterator<Item = usize>, gap: i32) -> (Vec<i32>, usize) {
    let mut displs = vec![0; counts.len()];
    let mut at = 0;
    for i in order {
        displs[i] = at;
        at += counts[i] + gap;
    }
    (displs, at as usize)
}

/// `fixed` lengths plus two drawn at random (seeded) below `max`.
pub fn lens(seed: u64, fixed: &[usize], max: usize) -> Vec<usize> {
    let mut r = rng(seed, 0, 5);
    let mut v = fixed.to_vec();
    v.push(r.gen_range(0..max));
    v.push(r.gen_range(0..max));
    v
}

/// Reduce (sum and the non-commutative matrix product) against the sequential
/// reference, every root, each length of `lens`.
pub fn check_reduce(c: &SimpleCommunicator, seed: u64, how: &str, lens: &[usize]) {
    let (n, me) = (c.size(), c.rank());
    let mm = matmul();
    for root in 0..n {
        let p = c.process_at_rank(root);
        for &len in lens {
            let mine = ints(seed, me, len);
            let want = fold(|r| ints(seed, r, len), n - 1, |a, b| a.wrapping_add(*b));
            let m = mats(seed, me, len);
            let want_m = fold(|r| mats(seed, r, len), n - 1, |a, b| a.mul(*b));
            if me == root {
                let mut out = vec![7; len];
                p.reduce_into_root(&mine[..], &mut out[..], SystemOperation::sum());
                assert!(out == want, "reduce sum root {root} len {len} {how}");
                let mut out = vec![Mat::default(); len];
                p.reduce_into_root(&m[..], &mut out[..], &mm);
                assert!(out == want_m, "reduce matmul root {root} len {len} {how}");
            } else {
                p.reduce_into(&mine[..], SystemOperation::sum());
                p.reduce_into(&m[..], &mm);
            }
        }
    }
}

/// All-reduce (sum, matrix product, max of floats, a padded type) against
/// the sequential reference.
pub fn check_all_reduce(c: &SimpleCommunicator, seed: u64, how: &str) {
    let (n, me) = (c.size(), c.rank());
    let mm = matmul();
    for len in [0usize, 1, 13, 5000] {
        let mine = ints(seed, me, len);
        let want = fold(|r| ints(seed, r, len), n - 1, |a, b| a.wrapping_add(*b));
        let mut out = vec![3; len];
        c.all_reduce_into(&mine[..], &mut out[..], SystemOperation::sum());
        assert!(out == want, "allreduce sum len {len} {how}");
        let m = mats(seed, me, len);
        let want_m = fold(|r| mats(seed, r, len), n - 1, |a, b| a.mul(*b));
        let mut out = vec![Mat::default(); len];
        c.all_reduce_into(&m[..], &mut out[..], &mm);
        assert!(out == want_m, "allreduce matmul len {len} {how}");
        let f = floats(seed, me, len);
        let want_f = fold(|r| floats(seed, r, len), n - 1, |a, b| a.max(*b));
        let mut out = vec![0.0; len];
        c.all_reduce_into(&f[..], &mut out[..], SystemOperation::max());
        assert!(out == want_f, "allreduce max len {len} {how}");
    }
    // Padded elements: a packed (non-dense) result buffer.
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
    assert_eq!(out, want, "allreduce padded {how}");
}

/// No rank leaves a barrier before every rank has entered it.
/// Immediate: rank 0 enters only after every other rank has seen its
/// barrier incomplete. Blocking (several calls, so that shared-memory flags
/// serve them too): the other ranks report leaving each barrier to rank 0,
/// which waits a while before entering and must find no report.
pub fn check_barrier(c: &SimpleCommunicator, how: &str) {
    let (n, me) = (c.size(), c.rank());
    if me == 0 {
        for _ in 1..n {
            let (seen, _) = c.any_process().receive::<u8>();
            assert_eq!(seen, 1, "{how}");
        }
        c.immediate_barrier().wait();
    } else {
        let req = match c.immediate_barrier().test() {
            Ok(_) => panic!("barrier completed before rank 0 entered it ({how})"),
            Err(r) => r,
        };
        c.process_at_rank(0).send(&1u8);
        req.wait();
    }
    // Each rank in turn comes late (rank 0 twice): nobody may leave before it entered.
    for round in 0..(n + 1) as u8 {
        let late = i32::from(round) % n;
        if me == late {
            std::thread::sleep(std::time::Duration::from_millis(3));
            assert!(
                c.any_process().immediate_probe().is_none(),
                "a rank left blocking barrier {round} before rank {late} entered it ({how})"
            );
            c.barrier();
            for _ in 1..n {
                let (seen, _) = c.any_process().receive::<u8>();
                assert_eq!(seen, round + 2, "{how}");
            }
        } else {
            c.barrier();
            c.process_at_rank(late).send(&(round + 2));
        }
    }
    c.barrier();
}

/// Broadcast from every root, each length of `lens`, and a non-contiguous datatype.
pub fn check_bcast(c: &SimpleCommunicator, seed: u64, how: &str, lens: &[usize]) {
    let (n, me) = (c.size(), c.rank());
    for root in 0..n {
        for &len in lens {
            let expect = ints(seed, root, len);
            let mut buf = if me == root {
                expect.clone()
            } else {
                vec![-1; len]
            };
            c.process_at_rank(root).broadcast_into(&mut buf[..]);
            assert!(buf == expect, "bcast root {root} len {len} {how}");
        }
    }
    // A non-contiguous datatype.
    let root = n - 1;
    let expect = padded(seed, root, 33);
    let mut buf = if me == root {
        expect.clone()
    } else {
        vec![Padded::default(); 33]
    };
    c.process_at_rank(root).broadcast_into(&mut buf[..]);
    assert_eq!(buf, expect, "padded bcast {how}");
}

/// Inclusive or exclusive scan (sum and the non-commutative matrix
/// product) against the sequential reference; an exclusive scan must leave
/// rank 0's buffer alone.
pub fn check_scan(c: &SimpleCommunicator, seed: u64, exclusive: bool, how: &str) {
    let me = c.rank();
    let mm = matmul();
    for len in [0usize, 1, 13] {
        let mine = ints(seed, me, len);
        let m = mats(seed, me, len);
        let mut out = vec![-77i64; len];
        let mut outm = vec![Mat([5; 4]); len];
        if exclusive {
            c.exclusive_scan_into(&mine[..], &mut out[..], SystemOperation::sum());
            c.exclusive_scan_into(&m[..], &mut outm[..], &mm);
        } else {
            c.scan_into(&mine[..], &mut out[..], SystemOperation::sum());
            c.scan_into(&m[..], &mut outm[..], &mm);
        }
        let last = if exclusive { me - 1 } else { me };
        if last < 0 {
            assert_eq!(out, vec![-77; len], "exscan touched rank 0 {how}");
            assert_eq!(outm, vec![Mat([5; 4]); len], "exscan touched rank 0 {how}");
        } else {
            let want = fold(|r| ints(seed, r, len), last, |a, b| a.wrapping_add(*b));
            assert_eq!(out, want, "scan sum len {len} {how} exclusive {exclusive}");
            let want = fold(|r| mats(seed, r, len), last, |a, b| a.mul(*b));
            assert_eq!(
                outm, want,
                "scan matmul len {len} {how} exclusive {exclusive}"
            );
        }
    }
}

/// Reduce-scatter-block (sum, and the matrix product on blocks of at most 6)
/// against the sequential reference, for each block length of `lens`.
pub fn check_reduce_scatter(c: &SimpleCommunicator, seed: u64, lens: &[usize], how: &str) {
    let (n, me) = (c.size(), c.rank());
    let mm = matmul();
    for &bs in lens {
        let mine = ints(seed, me, n as usize * bs);
        let mut out = vec![-1; bs];
        c.reduce_scatter_block_into(&mine[..], &mut out[..], SystemOperation::sum());
        let want = fold(
            |r| ints(seed, r, n as usize * bs),
            n - 1,
            |a, b| a.wrapping_add(*b),
        );
        assert!(
            out[..] == want[me as usize * bs..][..bs],
            "reduce_scatter bs {bs} {how}"
        );
        let bs = bs.min(6);
        let m = mats(seed, me, n as usize * bs);
        let mut out = vec![Mat::default(); bs];
        c.reduce_scatter_block_into(&m[..], &mut out[..], &mm);
        let want = fold(|r| mats(seed, r, n as usize * bs), n - 1, |a, b| a.mul(*b));
        assert_eq!(
            out[..],
            want[me as usize * bs..][..bs],
            "reduce_scatter matmul {how}"
        );
    }
}

/// All-gather-varcount into a partition with gaps and blocks in reverse
/// order (gaps must stay untouched), plain and with a padded type.
pub fn check_all_gather_varcount(c: &SimpleCommunicator, seed: u64, how: &str) {
    let (n, me) = (c.size(), c.rank());
    let (counts, displs, total) = partition(n, 2);
    let mine = ints(seed + 3, me, counts[me as usize] as usize);
    let mut buf = vec![-1i64; total];
    let mut part = PartitionMut::new(&mut buf[..], counts.clone(), &displs[..]);
    c.all_gather_varcount_into(&mine[..], &mut part);
    for r in 0..n as usize {
        let (d, k) = (displs[r] as usize, counts[r] as usize);
        assert_eq!(
            buf[d..d + k],
            ints(seed + 3, r as i32, k)[..],
            "allgatherv {how}"
        );
        assert_eq!(buf[d + k], -1, "allgatherv wrote a gap {how}");
    }
    let mine = padded(seed, me, counts[me as usize] as usize);
    let mut buf = vec![Padded::default(); total];
    let mut part = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
    c.all_gather_varcount_into(&mine[..], &mut part);
    for r in 0..n as usize {
        let (d, k) = (displs[r] as usize, counts[r] as usize);
        assert_eq!(
            buf[d..d + k],
            padded(seed, r as i32, k)[..],
            "padded allgatherv {how}"
        );
    }
}

/// Gather to and scatter from every root, each length of `lens`, against the
/// blocks the ranks hold.
pub fn check_gather_scatter(c: &SimpleCommunicator, seed: u64, how: &str, lens: &[usize]) {
    let (n, me) = (c.size(), c.rank());
    for root in 0..n {
        let p = c.process_at_rank(root);
        for &len in lens {
            let mine = ints(seed + root as u64, me, len);
            let want: Vec<i64> = (0..n)
                .flat_map(|r| ints(seed + root as u64, r, len))
                .collect();
            if me == root {
                let mut out = vec![9; len * n as usize];
                p.gather_into_root(&mine[..], &mut out[..]);
                assert!(out == want, "gather root {root} len {len} {how}");
            } else {
                p.gather_into(&mine[..]);
            }
            let mut out = vec![-5; len];
            if me == root {
                p.scatter_into_root(&want[..], &mut out[..]);
            } else {
                p.scatter_into(&mut out[..]);
            }
            assert!(out == mine, "scatter root {root} len {len} {how}");
        }
    }
}

/// Gather-varcount and scatter-varcount to and from every root, for each
/// count scale of `units` (counts 0..=3 times the unit, so some are zero),
/// blocks in reverse order with a one-element gap after each (gaps must
/// stay untouched); then with a padded (non-contiguous) type.
pub fn check_varcount_rooted(c: &SimpleCommunicator, seed: u64, how: &str, units: &[i32]) {
    let (n, me) = (c.size(), c.rank());
    for root in 0..n {
        let p = c.process_at_rank(root);
        for &unit in units {
            let (counts, displs, total) = partition_of(n, root, unit);
            let s = seed + root as u64 * 100 + unit as u64;
            let mine = ints(s, me, counts[me as usize] as usize);
            if me == root {
                let mut buf = vec![-1i64; total];
                let mut part = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
                p.gather_varcount_into_root(&mine[..], &mut part);
                for r in 0..n as usize {
                    let (d, k) = (displs[r] as usize, counts[r] as usize);
                    assert!(
                        buf[d..d + k] == ints(s, r as i32, k)[..],
                        "gatherv root {root} unit {unit} from {r} {how}"
                    );
                    assert_eq!(buf[d + k], -1, "gatherv wrote a gap {how}");
                }
            } else {
                p.gather_varcount_into(&mine[..]);
            }
            let mut out = vec![-1i64; counts[me as usize] as usize];
            if me == root {
                let mut buf = vec![-9i64; total];
                for r in 0..n as usize {
                    let (d, k) = (displs[r] as usize, counts[r] as usize);
                    buf[d..d + k].copy_from_slice(&ints(s + 1, r as i32, k));
                }
                let part = Partition::new(&buf[..], &counts[..], &displs[..]);
                p.scatter_varcount_into_root(&part, &mut out[..]);
            } else {
                p.scatter_varcount_into(&mut out[..]);
            }
            assert!(
                out == ints(s + 1, me, out.len()),
                "scatterv root {root} unit {unit} {how}"
            );
        }
        // Non-contiguous elements.
        let (counts, displs, total) = partition_of(n, root + 1, 2);
        let mine = padded(seed + root as u64, me, counts[me as usize] as usize);
        if me == root {
            let mut buf = vec![Padded::default(); total];
            let mut part = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            p.gather_varcount_into_root(&mine[..], &mut part);
            for r in 0..n as usize {
                let (d, k) = (displs[r] as usize, counts[r] as usize);
                let want = padded(seed + root as u64, r as i32, k);
                assert_eq!(buf[d..d + k], want[..], "padded gatherv root {root} {how}");
            }
            let part = Partition::new(&buf[..], &counts[..], &displs[..]);
            let mut out = vec![Padded::default(); counts[me as usize] as usize];
            p.scatter_varcount_into_root(&part, &mut out[..]);
            assert_eq!(out, mine, "padded scatterv root {root} {how}");
        } else {
            p.gather_varcount_into(&mine[..]);
            let mut out = vec![Padded::default(); mine.len()];
            p.scatter_varcount_into(&mut out[..]);
            assert_eq!(out, mine, "padded scatterv root {root} {how}");
        }
    }
}

/// Elements rank `from` sends rank `to` in [`check_all_to_all_varcount`]:
/// 0..=3 times `unit`.
pub fn a2av_count(from: i32, to: i32, salt: i32, unit: i32) -> i32 {
    (from * 3 + to * 5 + salt) % 4 * unit
}

/// All-to-all-varcount with uneven counts (zeros included) for each count
/// scale of `units`: send blocks in reverse order with one-element gaps,
/// receive blocks in rank order with two-element gaps (gaps must stay
/// untouched); then with a padded (non-contiguous) type.
pub fn check_all_to_all_varcount(c: &SimpleCommunicator, seed: u64, how: &str, units: &[i32]) {
    let (n, me) = (c.size(), c.rank());
    let block = |s: u64, from: i32, to: i32, k: i32| ints(s + 1000 * to as u64, from, k as usize);
    for (salt, &unit) in units.iter().enumerate() {
        let (salt, s) = (salt as i32, seed + unit as u64);
        let scounts: Vec<i32> = (0..n).map(|to| a2av_count(me, to, salt, unit)).collect();
        let rcounts: Vec<i32> = (0..n)
            .map(|from| a2av_count(from, me, salt, unit))
            .collect();
        let (sdispls, stotal) = layout(&scounts, (0..n as usize).rev(), 1);
        let (rdispls, rtotal) = layout(&rcounts, 0..n as usize, 2);
        let mut sbuf = vec![-5i64; stotal];
        for to in 0..n {
            let (d, k) = (sdispls[to as usize] as usize, scounts[to as usize]);
            sbuf[d..d + k as usize].copy_from_slice(&block(s, me, to, k));
        }
        let mut rbuf = vec![-1i64; rtotal];
        let spart = Partition::new(&sbuf[..], &scounts[..], &sdispls[..]);
        let mut rpart = PartitionMut::new(&mut rbuf[..], &rcounts[..], &rdispls[..]);
        c.all_to_all_varcount_into(&spart, &mut rpart);
        for from in 0..n {
            let (d, k) = (rdispls[from as usize] as usize, rcounts[from as usize]);
            assert!(
                rbuf[d..d + k as usize] == block(s, from, me, k)[..],
                "alltoallv unit {unit} from {from} {how}"
            );
            assert_eq!(rbuf[d + k as usize..][..2], [-1, -1], "alltoallv gap {how}");
        }
    }
    // Non-contiguous elements.
    let pblock = |from: i32, to: i32| {
        padded(
            seed + 77 * to as u64,
            from,
            a2av_count(from, to, 3, 2) as usize,
        )
    };
    let send: Vec<Padded> = (0..n).flat_map(|to| pblock(me, to)).collect();
    let scounts: Vec<i32> = (0..n).map(|to| a2av_count(me, to, 3, 2)).collect();
    let rcounts: Vec<i32> = (0..n).map(|from| a2av_count(from, me, 3, 2)).collect();
    let (sdispls, _) = layout(&scounts, 0..n as usize, 0);
    let (rdispls, rtotal) = layout(&rcounts, (0..n as usize).rev(), 1);
    let mut rbuf = vec![Padded::default(); rtotal];
    let spart = Partition::new(&send[..], &scounts[..], &sdispls[..]);
    let mut rpart = PartitionMut::new(&mut rbuf[..], &rcounts[..], &rdispls[..]);
    c.all_to_all_varcount_into(&spart, &mut rpart);
    for from in 0..n {
        let (d, k) = (
            rdispls[from as usize] as usize,
            rcounts[from as usize] as usize,
        );
        assert_eq!(
            rbuf[d..d + k],
            pblock(from, me)[..],
            "padded alltoallv from {from} {how}"
        );
    }
}

/// Operations that have a hierarchical algorithm.
pub const HIER_OPS: [Collective; 11] = [
    Collective::Barrier,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::AllReduce,
    Collective::Gather,
    Collective::Scatter,
    Collective::AllGather,
    Collective::AllToAll,
    Collective::Scan,
    Collective::ExclusiveScan,
    Collective::ReduceScatterBlock,
];

/// Runs `f` with the automatic choice, then with `hierarchical` forced for
/// every operation that has it, then back to automatic.
pub fn auto_and_forced(mut f: impl FnMut(&str)) {
    f("auto");
    for op in HIER_OPS {
        metampi::collective::force_algorithm(op, Some(Algorithm::Hierarchical)).unwrap();
    }
    f("forced hierarchical");
    for op in HIER_OPS {
        metampi::collective::force_algorithm(op, None).unwrap();
    }
}
