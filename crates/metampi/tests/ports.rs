//! Ports (MPI-2 §5.4): two halves of a world meet through a port one of them opened (the
//! connection found through a published name), talk over the intercommunicator (shared
//! memory on one machine, unless TCP is forced), merge, and get `ErrorClass::Port` for
//! ports that are not there. Two jobs started apart meeting the same way are in
//! `crates/metampi-cli/tests/c_spawn.rs`.

use metampi::collective::SystemOperation;
use metampi::topology::{self, Color, InterCommunicator, MergeOrder, SimpleCommunicator};
use metampi::traits::*;
use metampi::ErrorClass;
use metampi_testkit::Ranks;

/// The world's lower half accepts, the upper connects; returns the intercommunicator and
/// whether this process accepted.
fn meet(world: &SimpleCommunicator, service: &str) -> (InterCommunicator, bool) {
    // One name for the whole job: rank 0's process id.
    let mut id = std::process::id();
    world.process_at_rank(0).broadcast_into(&mut id);
    let service = &format!("{service}-{id}");
    let accepting = world.rank() < (world.size() + 1) / 2;
    let half = world
        .split_by_color(Color::with_value(i32::from(accepting)))
        .expect("every rank has a colour");
    if accepting && half.rank() == 0 {
        let port = topology::open_port().expect("a port opens");
        topology::publish_name(service, &port).expect("the name is free");
    }
    world.barrier();
    let inter = if accepting {
        let port = match half.rank() {
            0 => topology::lookup_name(service).expect("published"),
            _ => String::new(),
        };
        let inter = half.process_at_rank(0).accept(&port).expect("accepted");
        if half.rank() == 0 {
            topology::unpublish_name(service, &port).expect("unpublished");
            topology::close_port(&port).expect("closed");
        }
        inter
    } else {
        let port = match half.rank() {
            0 => topology::lookup_name(service).expect("published"),
            _ => String::new(),
        };
        half.process_at_rank(0).connect(&port).expect("connected")
    };
    (inter, accepting)
}

fn talk(world: &SimpleCommunicator, service: &str) {
    let (inter, accepting) = meet(world, service);
    let (me, side) = (inter.rank(), i32::from(accepting));
    let shm = !metampi::knobs::flag("METAMPI_FORCE_TCP", false);
    for r in 0..inter.remote_size() {
        assert_eq!(
            metampi_testkit::reaches_over_shared_memory(&inter, r),
            shm,
            "remote rank {r}"
        );
    }
    // Tagged messages to every remote process, in order, naming their sender, and one long
    // one (a rendezvous): the accepting side sends first, so that the two never both wait
    // in a long send.
    let send = || {
        for r in 0..inter.remote_size() {
            for k in 0..3 {
                inter
                    .process_at_rank(r)
                    .send_with_tag(&[side, me, r, k][..], 10 + k);
            }
            inter
                .process_at_rank(r)
                .send_with_tag(&vec![side * 1000 + me; 300_000][..], 20);
        }
    };
    let receive = || {
        for r in 0..inter.remote_size() {
            for k in 0..3 {
                let (v, st) = inter.process_at_rank(r).receive_vec_with_tag::<i32>(10 + k);
                assert_eq!((st.source_rank(), st.tag()), (r, 10 + k));
                assert_eq!(v, vec![1 - side, r, me, k]);
            }
            let (v, _) = inter.process_at_rank(r).receive_vec_with_tag::<i32>(20);
            assert_eq!(v, vec![(1 - side) * 1000 + r; 300_000]);
        }
    };
    if accepting {
        send();
        receive();
    } else {
        receive();
        send();
    }
    // The accepting side first in the merge.
    let order = match accepting {
        true => MergeOrder::Low,
        false => MergeOrder::High,
    };
    let merged = inter.merge(order);
    assert_eq!(merged.size(), world.size());
    let expect = if accepting {
        me
    } else {
        inter.remote_size() + me
    };
    assert_eq!(merged.rank(), expect);
    let mut sum = 0;
    merged.all_reduce_into(&merged.rank(), &mut sum, SystemOperation::sum());
    assert_eq!(sum, world.size() * (world.size() - 1) / 2);
}

#[test]
fn two_halves_meet_through_a_port() {
    Ranks::new(4).run("two_halves_meet_through_a_port", |world| {
        talk(world, "ports-test-shm")
    });
}

#[test]
fn two_halves_meet_through_a_port_over_tcp() {
    Ranks::new(3)
        .env("METAMPI_FORCE_TCP", "1")
        .run("two_halves_meet_through_a_port_over_tcp", |world| {
            talk(world, "ports-test-tcp")
        });
}

#[test]
fn ports_that_are_not_there_are_port_errors_on_every_member() {
    Ranks::new(2).run(
        "ports_that_are_not_there_are_port_errors_on_every_member",
        |world| {
            // The root's argument alone counts: every member hears of its failure.
            let bad = match world.rank() {
                // Well formed, but nobody listens on port 1.
                0 => "metampi-port/127.0.0.1:1/abababababababababababababababababababababababababababababababab",
                _ => "",
            };
            let e = world.process_at_rank(0).connect(bad).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Port, "{e}");
            let opened = topology::open_port().unwrap();
            topology::close_port(&opened).unwrap();
            let e = world.process_at_rank(0).accept(&opened).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Port, "{e}");
            assert!(e.message().contains("not a port this process opened"), "{e}");
            assert_eq!(
                topology::close_port(&opened).unwrap_err().class(),
                ErrorClass::Port
            );
            world.barrier();
        },
    );
}
