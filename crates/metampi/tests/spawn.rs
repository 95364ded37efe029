//! Dynamic processes (MPI-2 §5.3): a group spawns children of one or two
//! programs, each side sees the other as the remote group of an
//! intercommunicator (ranks, statuses, order, long and synchronous
//! messages, any source), the two merge into one intracommunicator whose
//! collectives run across both worlds, and the errors of bad requests and
//! of a child that fails. The children are this test executable again,
//! told apart by `parent()`.

use std::process::Command;

use metampi::collective::SystemOperation;
use metampi::topology::{InterCommunicator, MergeOrder, SimpleCommunicator};
use metampi::traits::*;
use metampi::ErrorClass;
use metampi_testkit::Ranks;

/// This test executable running test `name` alone (as `Ranks` runs it).
fn myself(name: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("the test has a path"));
    c.args([name, "--exact", "--nocapture", "--test-threads=1", "-q"]);
    c
}

/// What both sides do on the intercommunicator; `child` says which side.
fn talk(inter: &InterCommunicator, child: bool) {
    // One machine: the two worlds share memory, unless TCP is forced.
    let shm = !metampi::knobs::flag("METAMPI_FORCE_TCP", false);
    for r in 0..inter.remote_size() {
        assert_eq!(
            metampi_testkit::reaches_over_shared_memory(inter, r),
            shm,
            "remote rank {r}"
        );
    }
    exchange(inter, child);
}

/// [`talk`] without its look at the transports.
fn exchange(inter: &InterCommunicator, child: bool) {
    let me = inter.rank();
    let side = i32::from(child);
    // Three tagged messages to every remote process, received in order
    // and naming their sender.
    for r in 0..inter.remote_size() {
        for k in 0..3 {
            inter
                .process_at_rank(r)
                .send_with_tag(&[side, me, r, k][..], 10 + k);
        }
    }
    for r in 0..inter.remote_size() {
        for k in 0..3 {
            let (v, st) = inter.process_at_rank(r).receive_vec_with_tag::<i32>(10 + k);
            assert_eq!(st.source_rank(), r);
            assert_eq!(st.tag(), 10 + k);
            assert_eq!(v, vec![1 - side, r, me, k]);
        }
    }
    // Any source: the status names the remote rank.
    inter.process_at_rank(0).send_with_tag(&[me][..], 20);
    if me == 0 {
        for _ in 0..inter.remote_size() {
            let (v, st) = inter.any_process().receive_vec_with_tag::<i32>(20);
            assert_eq!(v[0], st.source_rank());
        }
    }
    // A long message each way between the two rank 0s (rendezvous), then a
    // synchronous one.
    if me == 0 {
        let long: Vec<u64> = (0..(1u64 << 17)).map(|i| i * 7 + side as u64).collect();
        let peer = inter.process_at_rank(0);
        if child {
            peer.send_with_tag(&long[..], 30);
            let (v, _) = peer.receive_vec_with_tag::<u64>(30);
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 7));
            peer.synchronous_send_with_tag(&[5u8][..], 31);
        } else {
            let (v, _) = peer.receive_vec_with_tag::<u64>(30);
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 7 + 1));
            peer.send_with_tag(&long[..], 30);
            let (v, _) = peer.receive_vec_with_tag::<u8>(31);
            assert_eq!(v, vec![5]);
        }
    }
}

/// What both sides do on the merged communicator: `first` says whether
/// this side's processes come first, `parents` is the parents' count.
fn merged_collectives(merged: &SimpleCommunicator, child: bool, first: bool, parents: i32) {
    let n = merged.size();
    let world = SimpleCommunicator::world();
    let offset = if first { 0 } else { n - world.size() };
    assert_eq!(merged.rank(), offset + world.rank());
    // Every member's (side, world rank), gathered: the same on all.
    let mine = [i32::from(child), world.rank()];
    let mut all = vec![0i32; 2 * n as usize];
    merged.all_gather_into(&mine[..], &mut all[..]);
    let parents_first = all[0] == 0;
    for r in 0..n {
        let (is_child, rank) = (all[2 * r as usize], all[2 * r as usize + 1]);
        let (want_child, want_rank) = match (parents_first, r < parents, r < n - parents) {
            (true, true, _) => (0, r),
            (true, false, _) => (1, r - parents),
            (false, _, true) => (1, r),
            (false, _, false) => (0, r - (n - parents)),
        };
        assert_eq!(
            (is_child, rank),
            (want_child, want_rank),
            "member {r} of {all:?}"
        );
    }
    let mut sum = 0;
    merged.all_reduce_into(&merged.rank(), &mut sum, SystemOperation::sum());
    assert_eq!(sum, n * (n - 1) / 2);
    // A broadcast from the last member, long enough to be split up.
    let mut data: Vec<u32> = if merged.rank() == n - 1 {
        (0..50_000).collect()
    } else {
        vec![0; 50_000]
    };
    merged.process_at_rank(n - 1).broadcast_into(&mut data[..]);
    assert!(data.iter().enumerate().all(|(i, &x)| x == i as u32));
    merged.barrier();
}

fn family(world: &SimpleCommunicator, name: &str) {
    if let Some(parent) = world.parent() {
        // A child: 2 of the first program, 1 of the second.
        let universe_rank = world.rank();
        assert_eq!(world.size(), 3);
        assert_eq!(parent.size(), 3);
        assert_eq!(parent.remote_size(), 3);
        assert!(parent.test_inter());
        let app = metampi::knobs::text("SPAWN_APP").expect("set per program");
        assert_eq!(app, if universe_rank < 2 { "first" } else { "second" });
        talk(&parent, true);
        // Children ask to come last; a tie (both Low) is settled the same
        // on both sides.
        merged_collectives(&parent.merge(MergeOrder::High), true, false, 3);
        let tie = parent.merge(MergeOrder::Low);
        let first = tie.rank() == world.rank();
        merged_collectives(&tie, true, first, 3);
        // A duplicate keeps its own context.
        let dup = parent.duplicate();
        dup.process_at_rank(0)
            .send_with_tag(&[universe_rank][..], 40);
        parent.process_at_rank(0).send_with_tag(&[-1i32][..], 40);
        return;
    }
    let root = world.process_at_rank(1);
    // Bad requests fail on every member, starting nothing.
    let err = root
        .spawn(&Command::new("/nonexistent/metampi-child"), 1)
        .expect_err("no such program");
    assert_eq!(err.class(), ErrorClass::Spawn, "{err}");
    let err = root.spawn(&myself(name), 0).expect_err("count 0");
    assert_eq!(err.class(), ErrorClass::Arg, "{err}");

    let mut first = myself(name);
    first.env("SPAWN_APP", "first");
    let mut second = myself(name);
    second.env("SPAWN_APP", "second");
    let inter = root
        .spawn_multiple(&[first, second], &[2, 1])
        .expect("children start");
    assert_eq!(inter.size(), 3);
    assert_eq!(inter.remote_size(), 3);
    talk(&inter, false);
    merged_collectives(&inter.merge(MergeOrder::Low), false, true, 3);
    let tie = inter.merge(MergeOrder::Low);
    let first = tie.rank() == world.rank();
    merged_collectives(&tie, false, first, 3);
    let dup = inter.duplicate();
    if world.rank() == 0 {
        // The message on the original context was sent second, yet is
        // matched on its own context.
        for r in 0..3 {
            let (v, st) = inter.process_at_rank(r).receive_vec_with_tag::<i32>(40);
            assert_eq!((v[0], st.source_rank()), (-1, r));
            let (v, st) = dup.process_at_rank(r).receive_vec_with_tag::<i32>(40);
            assert_eq!((v[0], st.source_rank()), (r, r));
        }
    }
}

#[test]
fn spawned_children_talk_and_merge() {
    Ranks::new(3).run("spawned_children_talk_and_merge", |world| {
        family(world, "spawned_children_talk_and_merge")
    });
}

#[test]
fn spawned_children_talk_and_merge_over_tcp() {
    Ranks::new(3)
        .env("METAMPI_FORCE_TCP", "1")
        .run("spawned_children_talk_and_merge_over_tcp", |world| {
            family(world, "spawned_children_talk_and_merge_over_tcp")
        });
}

#[test]
fn a_failing_child_ends_the_job() {
    let name = "a_failing_child_ends_the_job";
    let outcome = Ranks::new(2).outcome(name, |world| {
        if world.parent().is_some() {
            std::process::exit(3);
        }
        let _inter = world.process_at_rank(0).spawn(&myself(name), 2);
        // The job ends while the parents wait here.
        world.barrier();
        std::thread::sleep(std::time::Duration::from_secs(60));
    });
    let Some(outcome) = outcome else { return };
    let failure = outcome.failure.expect("the job fails").to_string();
    assert!(failure.contains("spawned process"), "{failure}");
}

/// A world over three meta hosts (routers between each pair) spawns from the whole
/// world, rooted on each meta host in turn: children start on the root's
/// machine, meet the parents there directly and the others through the
/// routers, and both groups talk (rendezvous and synchronous messages
/// included), merge and run collectives across both worlds.
#[test]
fn a_world_over_meta_hosts_spawns_children() {
    let name = "a_world_over_meta_hosts_spawns_children";
    spawn_across_meta_hosts(name, &local_sites(25650), 4, false);
}

/// The same with TCP everywhere: between ranks, to the routers (the
/// children's too) and between parents and children.
#[test]
fn a_world_over_meta_hosts_spawns_children_over_tcp() {
    let name = "a_world_over_meta_hosts_spawns_children_over_tcp";
    spawn_across_meta_hosts(name, &local_sites(25680), 4, true);
}

/// The same with the meta hosts in network namespaces of their own, joined by
/// a veth pair (skipped, saying so, where namespaces cannot be made): the
/// children start in the root's namespace.
#[test]
fn meta_hosts_in_network_namespaces_spawn_children() {
    let name = "meta_hosts_in_network_namespaces_spawn_children";
    if metampi_testkit::is_rank() || metampi::knobs::os("METAMPI_PARENT").is_some() {
        // The launcher's description is not read here.
        return spawn_across_meta_hosts(name, "", 3, false);
    }
    let Some(ns) = metampi_testkit::NetnsPair::create_or_skip(name) else {
        return;
    };
    spawn_across_meta_hosts(name, &ns.description(25670, [1, 2]), 3, false);
}

/// Meta hosts `a` (1 rank), `b` (2 ranks) and `c` (1 rank) on this machine,
/// each pair joined by routers.
fn local_sites(portbase: u16) -> String {
    format!(
        "PORTBASE {portbase}\n\
         METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
         METAHOST b {{ LAUNCH = local; NPROCS = 2; NODES = b0; }}\n\
         METAHOST c {{ LAUNCH = local; NPROCS = 1; NODES = c0; }}\n\
         PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
    )
}

/// The `n` ranks of `sites` (1 on meta host `a`, 2 on `b`, and 1 on `c` where
/// `n` is 4) spawn from the whole world, rooted on each meta host in turn (the
/// children's side too): a child reaches the parents of two other meta hosts
/// through two routers where there are three.
fn spawn_across_meta_hosts(name: &str, sites: &str, n: usize, tcp: bool) {
    if metampi::knobs::os("METAMPI_PARENT").is_some() {
        let universe = metampi::initialize().expect("child initializes");
        let world = universe.world();
        assert_eq!(world.num_meta_hosts(), 1);
        let parent = world.parent().expect("spawned");
        let parents = parent.remote_size();
        assert_eq!(parent.size(), 2);
        exchange(&parent, true);
        let merged = parent.merge(MergeOrder::High);
        merged_collectives(&merged, true, false, parents);
        refused_across_worlds(&merged, name);
        return;
    }
    let mut ranks = Ranks::new(n);
    if tcp {
        ranks = ranks
            .env("METAMPI_FORCE_TCP", "1")
            .env("METAMPI_NO_ROUTER_SHM", "1");
    }
    ranks.meta(sites).run(name, |world| {
        let roots: &[i32] = if world.size() == 4 {
            &[0, 2, 3]
        } else {
            &[0, 2]
        };
        for &root in roots {
            let inter = world
                .process_at_rank(root)
                .spawn(&myself(name), 2)
                .expect("children");
            assert_eq!(inter.remote_size(), 2);
            // Parents of another meta host than the root's reach the
            // children through the routers, the others directly.
            let routed = world.meta_host_of(world.rank()) != world.meta_host_of(root);
            for c in 0..2 {
                assert_eq!(
                    metampi_testkit::reaches_over_shared_memory(&inter, c),
                    !routed && !tcp
                );
            }
            exchange(&inter, false);
            let merged = inter.merge(MergeOrder::Low);
            merged_collectives(&merged, false, true, world.size());
            refused_across_worlds(&merged, name);
        }
        // The world still works across the sites afterwards.
        let mut sum = 0;
        world.all_reduce_into(&1, &mut sum, SystemOperation::sum());
        assert_eq!(sum, world.size());
    });
}

/// A communicator over meta hosts that also holds processes of another world
/// cannot spawn (they have no wire id for the routers): every member, in
/// either world, gets `MPI_ERR_SPAWN`, and none is left waiting.
fn refused_across_worlds(merged: &SimpleCommunicator, name: &str) {
    let e = merged
        .process_at_rank(0)
        .spawn(&myself(name), 1)
        .expect_err("another world's processes over meta hosts");
    assert_eq!(e.class(), ErrorClass::Spawn, "{e}");
    merged.barrier();
}

/// In a world over two meta hosts (routers between them), each site spawns
/// from its own communicator (`split_meta_host`): children start on the
/// site's machine and meet only parents there.
#[test]
fn each_site_spawns_its_own_children() {
    const SITES: &str = "PORTBASE 25500\n\
        METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
        METAHOST b { LAUNCH = local; NPROCS = 2; NODES = b0; }\n\
        PAIR a b 1\na0 <-> b0\n";
    let name = "each_site_spawns_its_own_children";
    if metampi::knobs::os("METAMPI_PARENT").is_some() {
        // A child: a world of its own on one machine.
        let universe = metampi::initialize().expect("child initializes");
        let world = universe.world();
        let parent = world.parent().expect("spawned");
        assert_eq!(world.num_meta_hosts(), 1);
        for r in 0..parent.remote_size() {
            let (site, st) = parent.process_at_rank(r).receive::<i32>();
            assert_eq!(st.source_rank(), r);
            parent.process_at_rank(r).send(&(site * 100 + world.rank()));
        }
        return;
    }
    Ranks::new(3).meta(SITES).run(name, |world| {
        let site = world.split_meta_host();
        let me = world
            .meta_host_of(world.rank())
            .expect("a rank of the world") as i32;
        let inter = site
            .process_at_rank(0)
            .spawn(&myself(name), 2)
            .expect("children");
        assert_eq!(inter.remote_size(), 2);
        for c in 0..2 {
            inter.process_at_rank(c).send(&me);
        }
        for c in 0..2 {
            let (v, _) = inter.process_at_rank(c).receive::<i32>();
            assert_eq!(v, me * 100 + c);
        }
        // The world still works across the sites afterwards.
        let mut sum = 0;
        world.all_reduce_into(&1, &mut sum, SystemOperation::sum());
        assert_eq!(sum, 3);
    });
}

/// The parents' side of the output tests: rank 1 spawns two children of
/// this test twice, rank 0 takes a message from each child, and rank 1
/// prints a line of its own after each spawn.
fn rank_1_spawns_twice(world: &SimpleCommunicator, name: &str) {
    for spawn in 1..=2 {
        let inter = world
            .process_at_rank(1)
            .spawn(&myself(name), 2)
            .expect("children");
        if world.rank() == 0 {
            for _ in 0..2 {
                inter.any_process().receive::<i32>();
            }
        }
        if world.rank() == 1 {
            println!("parent after spawn {spawn}");
        }
    }
}

/// Under `--tag-output`, the root labels its children's lines, stdout and
/// stderr, with the spawn and the child's rank, after its own `[rank] `.
#[test]
fn spawned_output_is_labelled_under_tag_output() {
    let name = "spawned_output_is_labelled_under_tag_output";
    let outcome = Ranks::new(2).capture_tagged().outcome(name, |world| {
        if let Some(parent) = world.parent() {
            println!("out of child {}", world.rank());
            eprintln!("err of child {}", world.rank());
            parent.process_at_rank(0).send(&world.rank());
            return;
        }
        rank_1_spawns_twice(world, name);
    });
    let Some(outcome) = outcome else { return };
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    let out = String::from_utf8_lossy(&outcome.stdout);
    let err = String::from_utf8_lossy(&outcome.stderr);
    for spawn in 1..=2 {
        for r in 0..2 {
            let line = format!("[1] [spawn {spawn}.{r}] out of child {r}\n");
            assert!(out.contains(&line), "no `{line}` in:\n{out}");
            let line = format!("[1] [spawn {spawn}.{r}] err of child {r}\n");
            assert!(err.contains(&line), "no `{line}` in:\n{err}");
        }
        assert!(
            out.contains(&format!("[1] parent after spawn {spawn}\n")),
            "{out}"
        );
    }
    assert!(!out.contains("[0] [spawn"), "{out}");
}

/// Under `--output-dir`, each spawned process writes files of its own, named
/// after its root's (`rank.1.spawn.N.R`), and so do the children it spawns
/// in turn; nothing of theirs lands in the root's files.
#[test]
fn spawned_output_goes_to_files_of_its_own_under_output_dir() {
    let name = "spawned_output_goes_to_files_of_its_own_under_output_dir";
    let dir = std::env::temp_dir().join(format!("metampi-outdir-{}", std::process::id()));
    let outcome = Ranks::new(2).output_dir(&dir).outcome(name, |world| {
        if let Some(parent) = world.parent() {
            if metampi::knobs::os("OUTDIR_GENERATION").is_some() {
                println!("out of grandchild {}", world.rank());
                eprintln!("err of grandchild {}", world.rank());
                return;
            }
            println!("out of child {}", world.rank());
            eprintln!("err of child {}", world.rank());
            let mut cmd = myself(name);
            cmd.env("OUTDIR_GENERATION", "2");
            let _ = world.process_at_rank(0).spawn(&cmd, 1).expect("grandchild");
            parent.process_at_rank(0).send(&world.rank());
            return;
        }
        rank_1_spawns_twice(world, name);
    });
    let Some(outcome) = outcome else { return };
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    };
    let parent = read("rank.1.stdout");
    for spawn in 1..=2 {
        assert!(
            parent.contains(&format!("parent after spawn {spawn}\n")),
            "{parent}"
        );
        for r in 0..2 {
            let stem = format!("rank.1.spawn.{spawn}.{r}");
            let out = read(&format!("{stem}.stdout"));
            assert!(
                out.contains(&format!("out of child {r}\n")),
                "{stem}: {out}"
            );
            let err = read(&format!("{stem}.stderr"));
            assert!(
                err.contains(&format!("err of child {r}\n")),
                "{stem}: {err}"
            );
        }
    }
    let out = read("rank.1.spawn.1.0.spawn.1.0.stdout");
    assert!(out.contains("out of grandchild 0\n"), "{out}");
    let err = read("rank.1.spawn.1.0.spawn.1.0.stderr");
    assert!(err.contains("err of grandchild 0\n"), "{err}");
    for file in ["rank.0.stdout", "rank.1.stdout", "rank.1.stderr"] {
        let text = read(file);
        assert!(
            !text.contains("of child") && !text.contains("of grandchild"),
            "{file}: {text}"
        );
    }
    assert!(!dir.join("rank.0.spawn.1.0.stdout").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A spawned world spawns in turn from a communicator that mixes both
/// worlds (the merge): the grandchildren's parents are two parents and two
/// children, and all four talk to them.
#[test]
fn a_merged_family_spawns_again() {
    let name = "a_merged_family_spawns_again";
    Ranks::new(2).run(name, |world| {
        let generation = metampi::knobs::text("SPAWN_GENERATION").unwrap_or_default();
        if generation == "2" {
            let parent = world.parent().expect("spawned");
            assert_eq!(parent.remote_size(), 4);
            // Every grandparent greets each grandchild with its merged rank.
            for r in 0..4 {
                let (v, st) = parent.process_at_rank(r).receive_vec_with_tag::<i32>(50);
                assert_eq!((v[0], st.source_rank()), (r, r));
            }
            parent
                .process_at_rank(3)
                .send_with_tag(&[world.rank()][..], 51);
            return;
        }
        let merged = match world.parent() {
            Some(parent) => parent.merge(MergeOrder::High),
            None => {
                let mut child = myself(name);
                child.env("SPAWN_GENERATION", "1");
                let inter = world.process_at_rank(0).spawn(&child, 2).expect("children");
                inter.merge(MergeOrder::Low)
            }
        };
        assert_eq!(merged.size(), 4);
        let mut grandchild = myself(name);
        grandchild.env("SPAWN_GENERATION", "2");
        // Rooted at a child (merged rank 2).
        let inter = merged
            .process_at_rank(2)
            .spawn(&grandchild, 3)
            .expect("grandchildren");
        assert_eq!(inter.remote_size(), 3);
        for r in 0..3 {
            inter
                .process_at_rank(r)
                .send_with_tag(&[merged.rank()][..], 50);
        }
        if merged.rank() == 3 {
            for r in 0..3 {
                let (v, st) = inter.process_at_rank(r).receive_vec_with_tag::<i32>(51);
                assert_eq!((v[0], st.source_rank()), (r, r));
            }
        }
        let mut total = 0;
        merged.all_reduce_into(&1i32, &mut total, SystemOperation::sum());
        assert_eq!(total, 4);
    });
}
