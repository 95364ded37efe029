//! Fallible collectives: arguments that disagree between ranks come back as
//! `Err` with `ErrorClass::Count` on the ranks that notice (and the
//! collective still completes everywhere), operations undefined on a
//! datatype as `Type` on every rank, misuse of root/non-root forms as `Arg`;
//! `METAMPI_COLL_ALG` forces algorithms and a bad value is ignored.

use metampi::collective::{self, Algorithm, Collective, SystemOperation};
use metampi::datatype::PartitionMut;
use metampi::topology::SimpleCommunicator;
use metampi::traits::*;
use metampi::ErrorClass;
use metampi_testkit::Ranks;

#[test]
fn mismatches_shm_4() {
    Ranks::new(4).run("mismatches_shm_4", mismatches);
}

/// The same with barrier, all-reduce and scatter forced onto the shared-memory flags
/// (which otherwise take over from the third call on a communicator).
#[test]
fn mismatches_shm_flags_4() {
    Ranks::new(4)
        .env(
            "METAMPI_COLL_ALG",
            "barrier=shared_memory,allreduce=shared_memory,scatter=shared_memory",
        )
        .run("mismatches_shm_flags_4", mismatches);
}

#[test]
fn mismatches_tcp_5() {
    Ranks::new(5)
        .force_tcp(true)
        .run("mismatches_tcp_5", mismatches);
}

fn class<T>(r: Result<T, metampi::Error>) -> Option<ErrorClass> {
    r.err().map(|e| e.class())
}

fn mismatches(world: &SimpleCommunicator) {
    let (n, me) = (world.size(), world.rank());

    // Broadcast into a shorter buffer on rank 1 (a leaf of the binomial tree
    // from rank 0): Count there, correct data everywhere else.
    collective::force_algorithm(Collective::Broadcast, Some(Algorithm::Binomial)).unwrap();
    let mut buf = if me == 0 {
        vec![3u32; 10]
    } else {
        vec![0u32; 10]
    };
    let len = if me == 1 { 5 } else { 10 };
    let r = world.process_at_rank(0).try_broadcast_into(&mut buf[..len]);
    if me == 1 {
        assert_eq!(class(r), Some(ErrorClass::Count));
    } else {
        r.unwrap();
        assert_eq!(buf, vec![3u32; 10]);
    }
    collective::force_algorithm(Collective::Broadcast, None).unwrap();

    // All-reduce with a receive buffer of the wrong length on rank 1 only.
    let mine = [me as i64; 10];
    let mut out = [0i64; 10];
    let k = if me == 1 { 9 } else { 10 };
    let r = world.try_all_reduce_into(&mine[..], &mut out[..k], SystemOperation::sum());
    let total: i64 = (0..n as i64).sum();
    if me == 1 {
        assert_eq!(class(r), Some(ErrorClass::Count));
    } else {
        r.unwrap();
        assert_eq!(out, [total; 10]);
    }

    // All-reduce where rank 2 contributes a shorter vector: Count on rank 2
    // (and possibly on the ranks it exchanges with), never anything else.
    let len = if me == 2 { 6 } else { 10 };
    let mut out = [0i64; 10];
    let r = world.try_all_reduce_into(&mine[..len], &mut out[..len], SystemOperation::sum());
    match class(r) {
        None => assert_ne!(me, 2),
        Some(c) => assert_eq!(c, ErrorClass::Count),
    }

    // An all-gather receive buffer that does not split into n blocks.
    let mut all = vec![0i32; 2 * n as usize + usize::from(me == 0)];
    let r = world.try_all_gather_into(&[me, me][..], &mut all[..]);
    if me == 0 {
        assert_eq!(class(r), Some(ErrorClass::Count));
    } else {
        r.unwrap();
        let want: Vec<i32> = (0..n).flat_map(|r| [r, r]).collect();
        assert_eq!(all, want);
    }

    // A scatter whose send buffer does not split into n blocks: Count at the
    // root; the others get their block of the whole ones, or Count.
    let root = world.process_at_rank(0);
    let mut got = [0i32; 2];
    let r = if me == 0 {
        let all: Vec<i32> = (0..2 * n + 1).collect();
        root.try_scatter_into_root(&all[..], &mut got[..])
    } else {
        root.try_scatter_into(&mut got[..])
    };
    match (me, class(r)) {
        (0, c) => assert_eq!(c, Some(ErrorClass::Count)),
        (_, None) => assert_eq!(got, [2 * me, 2 * me + 1]),
        (_, Some(c)) => assert_eq!(c, ErrorClass::Count),
    }

    // A scatter into a shorter buffer on rank 1: Count there, the right
    // block everywhere else.
    let k = if me == 1 { 1 } else { 2 };
    let mut got = [0i32; 2];
    let r = if me == 0 {
        let all: Vec<i32> = (0..2 * n).collect();
        root.try_scatter_into_root(&all[..], &mut got[..])
    } else {
        root.try_scatter_into(&mut got[..k])
    };
    if me == 1 {
        assert_eq!(class(r), Some(ErrorClass::Count));
    } else {
        r.unwrap();
        assert_eq!(got, [2 * me, 2 * me + 1]);
    }

    // Operations not defined on the datatype: Type on every rank.
    let f = [1.5f64; 3];
    let mut g = [0.0f64; 3];
    let r = world.try_all_reduce_into(&f[..], &mut g[..], SystemOperation::bitwise_and());
    assert_eq!(class(r), Some(ErrorClass::Type));
    let r = if me == 0 {
        world.process_at_rank(0).try_reduce_into_root(
            &[1i32][..],
            &mut [0i32][..],
            SystemOperation::max_loc(),
        )
    } else {
        world
            .process_at_rank(0)
            .try_reduce_into(&[1i32][..], SystemOperation::max_loc())
    };
    assert_eq!(class(r), Some(ErrorClass::Type));

    // Root and non-root forms swapped, on every rank alike: Arg, and no
    // communication happens.
    let root = world.process_at_rank(n - 1);
    let r = if me == n - 1 {
        root.try_gather_into(&me)
    } else {
        root.try_gather_into_root(&me, &mut [0i32; 8][..])
    };
    assert_eq!(class(r), Some(ErrorClass::Arg));
    let r = if me == n - 1 {
        root.try_scatter_into(&mut [0i32][..])
    } else {
        root.try_reduce_into_root(&me, &mut 0, SystemOperation::sum())
    };
    assert_eq!(class(r), Some(ErrorClass::Arg));

    // A varcount gather whose partition has the wrong number of blocks at
    // the root: Count there; the senders' short messages complete.
    let counts = vec![1; n as usize + 1];
    let displs: Vec<i32> = (0..=n).collect();
    if me == 0 {
        let mut buf = vec![0i32; n as usize + 1];
        let mut part = PartitionMut::new(&mut buf[..], counts, &displs[..]);
        let r = world
            .process_at_rank(0)
            .try_gather_varcount_into_root(&me, &mut part);
        assert_eq!(class(r), Some(ErrorClass::Count));
    } else {
        world
            .process_at_rank(0)
            .try_gather_varcount_into(&me)
            .unwrap();
    }

    // After all that, collectives still line up.
    let mut s = 0;
    world.all_reduce_into(&1, &mut s, SystemOperation::sum());
    assert_eq!(s, n);
    world.barrier();
}

#[test]
fn env_forces_algorithms() {
    Ranks::new(3)
        .env(
            "METAMPI_COLL_ALG",
            "bcast=linear, allreduce=reduce_bcast,alltoall=pairwise",
        )
        .run("env_forces_algorithms", |world| {
            assert_eq!(
                collective::forced_algorithm(Collective::Broadcast),
                Some(Algorithm::Linear)
            );
            assert_eq!(
                collective::forced_algorithm(Collective::AllReduce),
                Some(Algorithm::ReduceBroadcast)
            );
            assert_eq!(collective::forced_algorithm(Collective::Gather), None);
            let mut v = if world.rank() == 2 { [9u8; 3] } else { [0; 3] };
            world.process_at_rank(2).broadcast_into(&mut v[..]);
            assert_eq!(v, [9; 3]);
            let mut s = 0;
            world.all_reduce_into(&world.rank(), &mut s, SystemOperation::sum());
            assert_eq!(s, 3);
        });
}

#[test]
fn env_bad_value_is_ignored() {
    Ranks::new(2)
        .env("METAMPI_COLL_ALG", "bcast=ring")
        .run("env_bad_value_is_ignored", |world| {
            assert_eq!(collective::forced_algorithm(Collective::Broadcast), None);
            let err = collective::force_algorithm(Collective::Barrier, Some(Algorithm::Ring));
            assert_eq!(class(err), Some(ErrorClass::Arg));
            world.barrier();
        });
}
