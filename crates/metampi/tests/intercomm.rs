//! Intercommunicators (MPI-1.2 §5.6): made from two disjoint groups of the
//! world by their leaders, point-to-point between the groups (ranks and
//! statuses name the remote group; order, wildcards, long and synchronous
//! messages), collectives refused with `MPI_ERR_COMM`, duplicated, merged back into one
//! intracommunicator in either order, over shared memory and across meta
//! hosts (routers); and the errors of bad leaders.

use metampi::collective::SystemOperation;
use metampi::topology::{Color, InterCommunicator, MergeOrder, SimpleCommunicator};
use metampi::traits::*;
use metampi::ErrorClass;
use metampi_testkit::Ranks;

/// Evens and odds of `world`, joined: (my group, the intercommunicator).
fn evens_and_odds(world: &SimpleCommunicator) -> (SimpleCommunicator, InterCommunicator) {
    let even = world.rank() % 2 == 0;
    let mine = world
        .split_by_color(Color::with_value(i32::from(!even)))
        .expect("every rank has a colour");
    // Leaders: world rank 0 for the evens, world rank 1 for the odds.
    let remote_leader = if even { 1 } else { 0 };
    let inter = mine.create_intercommunicator(0, world, remote_leader, 7);
    (mine, inter)
}

fn battery(world: &SimpleCommunicator) {
    let n = world.size();
    let me = world.rank();
    let even = me % 2 == 0;
    let (mine, inter) = evens_and_odds(world);
    let (evens, odds) = ((n + 1) / 2, n / 2);
    let (local_size, remote_size) = if even { (evens, odds) } else { (odds, evens) };
    assert!(inter.test_inter());
    assert!(!world.test_inter());
    assert_eq!(inter.size(), local_size);
    assert_eq!(inter.rank(), mine.rank());
    assert_eq!(inter.rank(), me / 2);
    assert_eq!(inter.remote_size(), remote_size);
    assert_eq!(inter.target_size(), remote_size);
    // The remote group, in world ranks, is the other parity in order.
    let world_group = world.group();
    let remote_world: Vec<Option<i32>> = (0..remote_size)
        .map(|r| inter.remote_group().translate_rank(r, &world_group))
        .collect();
    let want: Vec<Option<i32>> = (0..remote_size)
        .map(|r| Some(2 * r + i32::from(even)))
        .collect();
    assert_eq!(remote_world, want);

    // Every process sends three tagged messages to each remote process, in
    // order; receives name the remote sender.
    for r in 0..remote_size {
        for k in 0..3 {
            inter
                .process_at_rank(r)
                .send_with_tag(&[me, r, k][..], 10 + k);
        }
    }
    for r in 0..remote_size {
        for k in 0..3 {
            let (v, st) = inter.process_at_rank(r).receive_vec_with_tag::<i32>(10 + k);
            assert_eq!(st.source_rank(), r);
            assert_eq!(v, vec![2 * r + i32::from(even), inter.rank(), k]);
        }
    }
    // Any source: the status names the remote rank, the payload says who
    // sent. (A tag of its own: the leaders' later messages must not match.)
    inter.process_at_rank(0).send_with_tag(&[me][..], 20);
    if inter.rank() == 0 {
        for _ in 0..remote_size {
            let (v, st) = inter.any_process().receive_vec_with_tag::<i32>(20);
            assert_eq!(v[0], 2 * st.source_rank() + i32::from(even));
        }
    }
    // A long message (rendezvous) and a synchronous one, leader to leader.
    if inter.rank() == 0 {
        let long: Vec<u64> = (0..(1u64 << 17)).map(|i| i * 3 + me as u64).collect();
        let peer = inter.process_at_rank(0);
        let other = if even { 1 } else { 0 };
        if even {
            peer.send(&long[..]);
            peer.synchronous_send(&5u32);
        } else {
            let (got, _) = peer.receive_vec::<u64>();
            assert!(got
                .iter()
                .enumerate()
                .all(|(i, &x)| x == i as u64 * 3 + other));
            let (x, st) = peer.receive::<u32>();
            assert_eq!((x, st.source_rank()), (5, 0));
        }
    }
    // A rank outside the remote group is an error, not a local process.
    assert_eq!(
        inter
            .try_process_at_rank(remote_size)
            .err()
            .map(|e| e.class()),
        Some(ErrorClass::Rank)
    );

    // Collectives are refused on every member and leave buffers alone.
    let e = inter.try_barrier().unwrap_err();
    assert_eq!(e.class(), ErrorClass::Comm);
    let mut buf = [me; 4];
    let e = inter
        .process_at_rank(0)
        .try_broadcast_into(&mut buf[..])
        .unwrap_err();
    assert_eq!(e.class(), ErrorClass::Comm);
    assert_eq!(buf, [me; 4]);
    let mut sum = 0;
    assert_eq!(
        inter
            .try_all_reduce_into(&me, &mut sum, SystemOperation::sum())
            .unwrap_err()
            .class(),
        ErrorClass::Comm
    );

    // A duplicate has the same groups and a context of its own: the
    // leaders send on both with one tag and receive in the other order.
    let dup = inter.duplicate();
    assert!(dup.test_inter());
    assert_eq!((dup.size(), dup.rank()), (inter.size(), inter.rank()));
    assert_eq!(dup.remote_size(), remote_size);
    if inter.rank() == 0 {
        inter.process_at_rank(0).send_with_tag(&1i32, 30);
        dup.process_at_rank(0).send_with_tag(&2i32, 30);
        let (x, _) = dup.process_at_rank(0).receive_with_tag::<i32>(30);
        let (y, _) = inter.process_at_rank(0).receive_with_tag::<i32>(30);
        assert_eq!((x, y), (2, 1));
    }
    assert_eq!(dup.try_barrier().unwrap_err().class(), ErrorClass::Comm);

    // Merged, evens low: evens first in world order, then odds.
    let merged = inter.merge(if even {
        MergeOrder::Low
    } else {
        MergeOrder::High
    });
    assert!(!merged.test_inter());
    assert_eq!(merged.size(), n);
    let expect_rank = if even { me / 2 } else { evens + me / 2 };
    assert_eq!(merged.rank(), expect_rank);
    let mut total = 0;
    merged.all_reduce_into(&me, &mut total, SystemOperation::sum());
    assert_eq!(total, n * (n - 1) / 2);
    // Odds low this time.
    let flipped = inter.merge(if even {
        MergeOrder::High
    } else {
        MergeOrder::Low
    });
    assert_eq!(flipped.rank(), if even { odds + me / 2 } else { me / 2 });
    // Both the same: the group whose leader has the lower world rank (the
    // evens, led by world rank 0) comes first.
    let tie = inter.merge(MergeOrder::High);
    assert_eq!(tie.rank(), expect_rank);
    // The merged communicators are independent of each other and of world.
    let mut x = if merged.rank() == 0 { 42 } else { 0 };
    merged.process_at_rank(0).broadcast_into(&mut x);
    assert_eq!(x, 42);
    tie.barrier();
    world.barrier();
}

#[test]
fn intercommunicator_shared_memory_5() {
    Ranks::new(5).run("intercommunicator_shared_memory_5", battery);
}

#[test]
fn intercommunicator_tcp_4() {
    Ranks::new(4)
        .force_tcp(true)
        .run("intercommunicator_tcp_4", battery);
}

/// One group per meta host, coupled through the routers (the coupled
/// codes PACX-MPI ran across sites).
#[test]
fn intercommunicator_between_meta_hosts() {
    const SITES: &str = "\
        METAHOST a { LAUNCH = local; NPROCS = 2; NODES = a0; }\n\
        METAHOST b { LAUNCH = local; NPROCS = 3; NODES = b0; }\n\
        PAIR a b 1\na0 <-> b0\n";
    Ranks::new(5)
        .meta(SITES)
        .run("intercommunicator_between_meta_hosts", |world| {
            let site = world.split_meta_host();
            let on_a = world.meta_host_of(world.rank()).unwrap() == 0;
            // Leaders: world rank 0 on a, world rank 2 on b.
            let inter = site.create_intercommunicator(0, world, if on_a { 2 } else { 0 }, 3);
            assert_eq!(inter.remote_size(), if on_a { 3 } else { 2 });
            for r in 0..inter.remote_size() {
                inter.process_at_rank(r).send(&(world.rank() * 100 + r));
            }
            for r in 0..inter.remote_size() {
                let (v, st) = inter.process_at_rank(r).receive::<i32>();
                assert_eq!(st.source_rank(), r);
                let sender = if on_a { 2 + r } else { r };
                assert_eq!(v, sender * 100 + inter.rank());
            }
            let merged = inter.merge(if on_a {
                MergeOrder::Low
            } else {
                MergeOrder::High
            });
            assert_eq!(merged.rank(), world.rank());
            let mut total = 0;
            merged.all_reduce_into(&world.rank(), &mut total, SystemOperation::sum());
            assert_eq!(total, 10);
        });
}

/// Both groups split by colour (MPI-2): a colour's members of each group
/// face each other in a new intercommunicator, ordered by key; an
/// undefined colour, or one the other group lacks, gets none.
#[test]
fn intercommunicator_split() {
    Ranks::new(8).run("intercommunicator_split", |world| {
        let (_, inter) = evens_and_odds(world);
        let me = world.rank();
        // Evens 0, 2 and odds 1, 3, 5 take colour 0; even 4 colour 1 (no
        // odd has it); 6 none; odd 7 colour 2 (no even has it).
        let color = match me {
            0..=3 | 5 => Color::with_value(0),
            4 => Color::with_value(1),
            6 => Color::undefined(),
            _ => Color::with_value(2),
        };
        // Keys reverse world order.
        let split = inter.split_by_color_with_key(color, -me);
        if matches!(me, 4 | 6 | 7) {
            assert!(split.is_none(), "rank {me}");
            world.barrier();
            return;
        }
        let split = split.expect("colour 0 is on both sides");
        let (mine, theirs): (Vec<i32>, Vec<i32>) = if me % 2 == 0 {
            (vec![2, 0], vec![5, 3, 1])
        } else {
            (vec![5, 3, 1], vec![2, 0])
        };
        assert_eq!(split.size(), mine.len() as i32);
        assert_eq!(split.remote_size(), theirs.len() as i32);
        assert_eq!(mine[split.rank() as usize], me);
        for (r, _) in theirs.iter().enumerate() {
            split.process_at_rank(r as i32).send_with_tag(&me, 60);
        }
        for (r, &w) in theirs.iter().enumerate() {
            let (v, st) = split.process_at_rank(r as i32).receive_with_tag::<i32>(60);
            assert_eq!((v, st.source_rank()), (w, r as i32));
        }
        let merged = split.merge(if me % 2 == 0 {
            MergeOrder::Low
        } else {
            MergeOrder::High
        });
        let mut total = 0;
        merged.all_reduce_into(&me, &mut total, SystemOperation::sum());
        assert_eq!(total, 11);
        world.barrier();
    });
}

#[test]
fn bad_leaders_are_errors_on_every_member() {
    Ranks::new(4).run("bad_leaders_are_errors_on_every_member", |world| {
        // A local leader outside the communicator: refused before any message.
        let e = world
            .try_create_intercommunicator(4, world, 0, 0)
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Rank);
        // The world with itself: the leaders are one process; every member
        // learns it from its leader's broadcast.
        let e = world
            .try_create_intercommunicator(0, world, 0, 1)
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Comm);
        // The leaders named in another communicator: world rank 3 is no
        // leader of a group of world, so pass a rank outside `peer_comm`.
        let half = world
            .split_by_color(Color::with_value(world.rank() % 2))
            .expect("every rank has a colour");
        let e = half
            .try_create_intercommunicator(0, world, 9, 2)
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Rank);
        // An intercommunicator is no local communicator for another one.
        let inter = half.create_intercommunicator(0, world, 1 - world.rank() % 2, 4);
        let e = inter
            .try_create_intercommunicator(0, world, 0, 6)
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Comm);
        world.barrier();
    });
}
