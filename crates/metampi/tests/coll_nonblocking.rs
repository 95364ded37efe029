//! Nonblocking collectives: every `immediate_*` form outstanding at once and
//! interleaved with blocking point-to-point traffic on the same and another
//! communicator; progress while a rank is blocked in a receive; request
//! collections; collectives on two communicators started in different
//! orders.

mod coll_common;

use coll_common::*;
use metampi::collective::{Collective, SystemOperation};
use metampi::datatype::{Partition, PartitionMut};
use metampi::request::{multiple_scope, scope};
use metampi::topology::SimpleCommunicator;
use metampi::traits::*;
use metampi_testkit::Ranks;

macro_rules! sizes {
    ($($name:ident: $n:expr, $tcp:expr;)*) => {$(
        #[test]
        fn $name() {
            Ranks::new($n).force_tcp($tcp).run(stringify!($name), nonblocking);
        }
    )*};
}

sizes! {
    shm_1: 1, false; shm_2: 2, false; shm_3: 3, false; shm_5: 5, false; shm_8: 8, false;
    tcp_2: 2, true; tcp_3: 3, true; tcp_6: 6, true; tcp_9: 9, true;
}

fn nonblocking(world: &SimpleCommunicator) {
    for seed in [1, 2] {
        all_at_once(world, seed);
    }
    progress_while_blocked(world);
    collections(world);
    two_communicators(world);
    world.barrier();
}

/// Every immediate collective in flight together, a point-to-point ring
/// with wildcard receives running meanwhile on the same communicator and on
/// a duplicate, the requests completed in reverse order.
fn all_at_once(c: &SimpleCommunicator, seed: u64) {
    let (n, me) = (c.size(), c.rank());
    let nu = n as usize;
    let dup = c.duplicate();
    let root = (seed as i32) % n;
    let mm = matmul();
    let len = 9000; // past the eager limits: rendezvous inside the schedules

    let mut bc = if me == root {
        ints(seed, root, len)
    } else {
        vec![0; len]
    };
    let a = ints(seed + 1, me, len);
    let mut ar = vec![0; len];
    let m = mats(seed, me, 7);
    let mut arm = vec![Mat::default(); 7];
    let g = ints(seed + 2, me, 3);
    let mut gr = vec![0; 3 * nu];
    let sc: Vec<i64> = (0..n).flat_map(|r| ints(seed + 3, r, 4)).collect();
    let mut scr = vec![0; 4];
    let (counts, displs, total) = partition(n, seed as i32);
    let gv = ints(seed + 4, me, counts[me as usize] as usize);
    let mut gvr = vec![-1; total];
    let mut svs = vec![0; total];
    for r in 0..nu {
        let (d, k) = (displs[r] as usize, counts[r] as usize);
        svs[d..d + k].copy_from_slice(&ints(seed + 5, r as i32, k));
    }
    let mut svr = vec![0; counts[me as usize] as usize];
    let ag = padded(seed, me, 5);
    let mut agr = vec![Padded::default(); 5 * nu];
    let mut agvr = vec![-1; total];
    let at: Vec<i64> = (0..n)
        .flat_map(|to| ints(seed + 6 + to as u64, me, 2))
        .collect();
    let mut atr = vec![0; 2 * nu];
    let scounts: Vec<i32> = (0..n).map(|to| (me + to) % 3).collect();
    let sdispls: Vec<i32> = (0..n).map(|to| to * 3).collect();
    let rcounts: Vec<i32> = (0..n).map(|from| (from + me) % 3).collect();
    let at_v: Vec<i64> = (0..3 * n).map(|i| (me * 1000 + i) as i64).collect();
    let mut atvr = vec![-1; 3 * nu];
    let rd = ints(seed + 7, me, 5);
    let mut rdr = vec![0; 5];
    let sn = ints(seed + 8, me, 6);
    let mut snr = vec![0; 6];
    let mut exr = vec![-3; 6];
    let rs = ints(seed + 9, me, 2 * nu);
    let mut rsr = [0; 2];

    let mut gv_part = PartitionMut::new(&mut gvr[..], &counts[..], &displs[..]);
    let sv_part = Partition::new(&svs[..], &counts[..], &displs[..]);
    let mut agv_part = PartitionMut::new(&mut agvr[..], &counts[..], &displs[..]);
    let at_part = Partition::new(&at_v[..], &scounts[..], &sdispls[..]);
    let mut atv_part = PartitionMut::new(&mut atvr[..], &rcounts[..], &sdispls[..]);
    scope(|s| {
        let r_bar = c.immediate_barrier();
        let p = c.process_at_rank(root);
        let r_bc = p.immediate_broadcast_into(s, &mut bc[..]);
        let r_ar = c.immediate_all_reduce_into(s, &a[..], &mut ar[..], SystemOperation::sum());
        let r_arm = c.immediate_all_reduce_into(s, &m[..], &mut arm[..], &mm);
        let r_g = if me == root {
            p.immediate_gather_into_root(s, &g[..], &mut gr[..])
        } else {
            p.immediate_gather_into(s, &g[..])
        };
        let r_sc = if me == root {
            p.immediate_scatter_into_root(s, &sc[..], &mut scr[..])
        } else {
            p.immediate_scatter_into(s, &mut scr[..])
        };
        let (r_gv, r_gv_leaf) = if me == root {
            let r = p.immediate_gather_varcount_into_root(s, &gv[..], &mut gv_part);
            (Some(r), None)
        } else {
            (None, Some(p.immediate_gather_varcount_into(s, &gv[..])))
        };
        let r_sv = if me == root {
            p.immediate_scatter_varcount_into_root(s, &sv_part, &mut svr[..])
        } else {
            p.immediate_scatter_varcount_into(s, &mut svr[..])
        };
        let r_ag = c.immediate_all_gather_into(s, &ag[..], &mut agr[..]);
        let r_agv = c.immediate_all_gather_varcount_into(s, &gv[..], &mut agv_part);
        let r_at = c.immediate_all_to_all_into(s, &at[..], &mut atr[..]);
        let r_atv = c.immediate_all_to_all_varcount_into(s, &at_part, &mut atv_part);
        let (r_rd, r_rd_leaf) = if me == root {
            let r = p.immediate_reduce_into_root(s, &rd[..], &mut rdr[..], SystemOperation::sum());
            (Some(r), None)
        } else {
            (
                None,
                Some(p.immediate_reduce_into(s, &rd[..], SystemOperation::sum())),
            )
        };
        let r_sn = c.immediate_scan_into(s, &sn[..], &mut snr[..], SystemOperation::sum());
        let r_ex =
            c.immediate_exclusive_scan_into(s, &sn[..], &mut exr[..], SystemOperation::sum());
        let r_rs =
            c.immediate_reduce_scatter_block_into(s, &rs[..], &mut rsr[..], SystemOperation::sum());

        // Point-to-point meanwhile: a ring on `c` received with any source
        // and any tag (collective traffic must never match), and one on `dup`.
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        for k in 0..20 {
            for comm in [c, &dup] {
                comm.process_at_rank(next).send(&[me, k, 99][..]);
                let (v, st) = comm.any_process().receive_vec::<i32>();
                assert_eq!((v, st.source_rank()), (vec![prev, k, 99], prev));
            }
        }

        r_rs.wait();
        r_ex.wait();
        r_sn.wait();
        if let Some(r) = r_rd {
            r.wait();
        }
        if let Some(r) = r_rd_leaf {
            r.wait();
        }
        r_atv.wait();
        r_at.wait();
        r_agv.wait();
        r_ag.wait();
        r_sv.wait();
        if let Some(r) = r_gv {
            r.wait();
        }
        if let Some(r) = r_gv_leaf {
            r.wait();
        }
        r_sc.wait();
        r_g.wait();
        r_arm.wait();
        r_ar.wait();
        r_bc.wait();
        r_bar.wait();
    });

    assert!(bc == ints(seed, root, len), "ibcast");
    let sum =
        |s: u64, l: usize, last: i32| fold(|r| ints(s, r, l), last, |a, b| a.wrapping_add(*b));
    assert!(ar == sum(seed + 1, len, n - 1), "iallreduce");
    assert_eq!(
        arm,
        fold(|r| mats(seed, r, 7), n - 1, |a, b| a.mul(*b)),
        "iallreduce matmul"
    );
    if me == root {
        let want: Vec<i64> = (0..n).flat_map(|r| ints(seed + 2, r, 3)).collect();
        assert_eq!(gr, want, "igather");
        assert_eq!(rdr, sum(seed + 7, 5, n - 1), "ireduce");
        for r in 0..nu {
            let (d, k) = (displs[r] as usize, counts[r] as usize);
            assert_eq!(gvr[d..d + k], ints(seed + 4, r as i32, k)[..], "igatherv");
        }
    }
    assert_eq!(scr, ints(seed + 3, me, 4), "iscatter");
    assert_eq!(svr, ints(seed + 5, me, svr.len()), "iscatterv");
    let want: Vec<Padded> = (0..n).flat_map(|r| padded(seed, r, 5)).collect();
    assert_eq!(agr, want, "iallgather");
    for r in 0..nu {
        let (d, k) = (displs[r] as usize, counts[r] as usize);
        assert_eq!(
            agvr[d..d + k],
            ints(seed + 4, r as i32, k)[..],
            "iallgatherv"
        );
    }
    let want: Vec<i64> = (0..n)
        .flat_map(|from| ints(seed + 6 + me as u64, from, 2))
        .collect();
    assert_eq!(atr, want, "ialltoall");
    for from in 0..n {
        for i in 0..3 {
            let got = atvr[(from * 3 + i) as usize];
            let want = if i < (from + me) % 3 {
                (from * 1000 + me * 3 + i) as i64
            } else {
                -1
            };
            assert_eq!(got, want, "ialltoallv");
        }
    }
    assert_eq!(snr, sum(seed + 8, 6, me), "iscan");
    if me == 0 {
        assert_eq!(exr, vec![-3; 6], "iexscan rank 0");
    } else {
        assert_eq!(exr, sum(seed + 8, 6, me - 1), "iexscan");
    }
    let all = sum(seed + 9, 2 * nu, n - 1);
    assert_eq!(
        rsr[..],
        all[2 * me as usize..][..2],
        "ireduce_scatter_block"
    );
    // The ring's receives take any source and any tag, so nobody may send
    // the next phase's messages on `c` before every rank has had all of its
    // ring's: the collectives above can finish on one rank while another
    // still waits in the ring (seen: a later phase's one-byte message taken
    // by a ring receive on 9 ranks over TCP).
    c.barrier();
}

/// Every rank but the last starts a collective and then blocks in a receive
/// that the last rank sends only after its own part of the collective has
/// completed: the collective must move on inside the blocked receive.
fn progress_while_blocked(c: &SimpleCommunicator) {
    let (n, me) = (c.size(), c.rank());
    let last = n - 1;
    let unblock = |done: bool| {
        if me == last {
            for r in 0..last {
                c.process_at_rank(r).send(&1u8);
            }
        } else if !done {
            let (x, _) = c.process_at_rank(last).receive::<u8>();
            assert_eq!(x, 1);
        }
    };
    each_alg(Collective::Broadcast, |alg| {
        let mut buf = if me == 0 {
            ints(5, 0, 20_000)
        } else {
            vec![0; 20_000]
        };
        scope(|s| {
            let req = c
                .process_at_rank(0)
                .immediate_broadcast_into(s, &mut buf[..]);
            if me == last {
                req.wait();
                unblock(true);
            } else {
                unblock(false);
                req.wait();
            }
        });
        assert!(buf == ints(5, 0, 20_000), "bcast progress {alg:?}");
    });
    let mm = matmul();
    each_alg(Collective::AllReduce, |alg| {
        let m = mats(6, me, 50);
        let mut out = vec![Mat::default(); 50];
        let x = ints(6, me, 5000);
        let mut xs = vec![0; 5000];
        scope(|s| {
            let r1 = c.immediate_all_reduce_into(s, &m[..], &mut out[..], &mm);
            let r2 = c.immediate_all_reduce_into(s, &x[..], &mut xs[..], SystemOperation::sum());
            if me == last {
                r1.wait();
                r2.wait();
                unblock(true);
            } else {
                unblock(false);
                r2.wait();
                r1.wait();
            }
        });
        assert_eq!(
            out,
            fold(|r| mats(6, r, 50), n - 1, |a, b| a.mul(*b)),
            "{alg:?}"
        );
        assert!(
            xs == fold(|r| ints(6, r, 5000), n - 1, |a, b| a.wrapping_add(*b)),
            "{alg:?}"
        );
    });
}

/// Immediate barriers in a request collection, and a `test` loop.
fn collections(c: &SimpleCommunicator) {
    multiple_scope(6, |_, coll| {
        for _ in 0..6 {
            coll.add(c.immediate_barrier());
        }
        let mut out = Vec::new();
        assert!(coll.wait_any().is_some());
        coll.wait_some(&mut out);
        assert!(!out.is_empty());
        while !coll.test_all(&mut out) {}
        coll.wait_all(&mut out);
        assert_eq!(coll.incomplete(), 0);
    });
    let x = [c.rank() as i64; 4];
    let mut y = [0i64; 4];
    scope(|s| {
        let mut r = c.immediate_all_reduce_into(s, &x[..], &mut y[..], SystemOperation::max());
        loop {
            match r.test() {
                Ok(_) => break,
                Err(again) => r = again,
            }
        }
    });
    assert_eq!(y, [c.size() as i64 - 1; 4]);
}

/// Collectives on two communicators, started in opposite orders by even and
/// odd ranks and completed in opposite orders too.
fn two_communicators(c: &SimpleCommunicator) {
    let (n, me) = (c.size(), c.rank());
    let dup = c.duplicate();
    let a = ints(31, me, 100);
    let b = ints(32, me, 100);
    let (mut ra, mut rb) = (vec![0; 100], vec![0; 100]);
    scope(|s| {
        if me % 2 == 0 {
            let x = c.immediate_all_reduce_into(s, &a[..], &mut ra[..], SystemOperation::sum());
            let y = dup.immediate_all_reduce_into(s, &b[..], &mut rb[..], SystemOperation::sum());
            y.wait();
            x.wait();
        } else {
            let y = dup.immediate_all_reduce_into(s, &b[..], &mut rb[..], SystemOperation::sum());
            let x = c.immediate_all_reduce_into(s, &a[..], &mut ra[..], SystemOperation::sum());
            x.wait();
            y.wait();
        }
    });
    assert_eq!(
        ra,
        fold(|r| ints(31, r, 100), n - 1, |x, y| x.wrapping_add(*y))
    );
    assert_eq!(
        rb,
        fold(|r| ints(32, r, 100), n - 1, |x, y| x.wrapping_add(*y))
    );
}
