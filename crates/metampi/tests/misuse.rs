//! API misuse comes back from the `try_*` forms as the documented error class
//! (`ErrorClass`, MPI-1.2 §7.3) instead of a panic, an abort or a hang: ranks out of
//! range (`Rank`), negative tags (`Tag`), receive buffers too small (`Truncate`),
//! messages that are not a whole number of values (`Type`, `Count`), collective
//! arguments that cannot fit (`Count`), root forms on the wrong rank (`Arg`). A failed
//! call sends nothing, and the job carries on normally afterwards.
//!
//! Not expressible, so not tested: an operation on a freed communicator (a
//! communicator is freed when its last handle is dropped, and the borrow checker
//! rejects any use after that) and reserved tags (collectives run on a context of
//! their own, so every tag in `0..=i32::MAX` is the user's). Mismatched collective
//! lengths between ranks are in `coll_errors.rs`.

use metampi::collective::{self, SystemOperation};
use metampi::request;
use metampi::topology::{Color, SimpleCommunicator};
use metampi::traits::*;
use metampi::{Error, ErrorClass};
use metampi_testkit::Ranks;

fn class<T>(r: Result<T, Error>) -> Option<ErrorClass> {
    r.err().map(|e| e.class())
}

#[test]
fn ranks_and_tags_shm_3() {
    Ranks::new(3).run("ranks_and_tags_shm_3", ranks_and_tags);
}

#[test]
fn ranks_and_tags_tcp_2() {
    Ranks::new(2)
        .force_tcp(true)
        .run("ranks_and_tags_tcp_2", ranks_and_tags);
}

#[test]
fn short_buffers_shm_2() {
    Ranks::new(2).run("short_buffers_shm_2", short_buffers);
}

#[test]
fn short_buffers_tcp_2() {
    Ranks::new(2)
        .force_tcp(true)
        .run("short_buffers_tcp_2", short_buffers);
}

#[test]
fn sub_communicators_4() {
    Ranks::new(4).run("sub_communicators_4", sub_communicators);
}

#[test]
fn collective_arguments_3() {
    Ranks::new(3).run("collective_arguments_3", collective_arguments);
}

/// Nothing is waiting for this rank: the failed calls above sent nothing.
fn assert_quiet(world: &SimpleCommunicator) {
    world.barrier();
    assert!(world.any_process().immediate_probe().is_none());
    world.barrier();
}

fn ranks_and_tags(world: &SimpleCommunicator) {
    let (n, me) = (world.size(), world.rank());
    for r in [-1, -2, n, n + 1, i32::MAX, i32::MIN] {
        assert_eq!(
            class(world.try_process_at_rank(r)),
            Some(ErrorClass::Rank),
            "{r}"
        );
        assert_eq!(class(world.meta_host_of(r)), Some(ErrorClass::Rank), "{r}");
    }
    let next = world.process_at_rank((me + 1) % n);
    let prev = world.process_at_rank((me + n - 1) % n);

    for tag in [-1, -7, i32::MIN] {
        assert_eq!(
            class(next.try_send_with_tag(&me, tag)),
            Some(ErrorClass::Tag)
        );
        assert_eq!(
            class(next.try_immediate_send_owned(vec![me; 3], tag)),
            Some(ErrorClass::Tag)
        );
        assert_eq!(
            class(prev.try_receive_with_tag::<i32>(Some(tag))),
            Some(ErrorClass::Tag)
        );
        let mut buf = [0i32; 4];
        assert_eq!(
            class(prev.try_receive_into_with_tag(&mut buf[..], Some(tag))),
            Some(ErrorClass::Tag)
        );
        assert_eq!(
            class(
                world
                    .any_process()
                    .try_receive_vec_with_tag::<i32>(Some(tag))
            ),
            Some(ErrorClass::Tag)
        );
        assert_eq!(
            class(prev.try_probe_with_tag(Some(tag))),
            Some(ErrorClass::Tag)
        );
        assert_eq!(
            class(world.any_process().try_matched_probe(Some(tag))),
            Some(ErrorClass::Tag)
        );
        assert_eq!(
            class(prev.try_immediate_receive_vec::<i32>(Some(tag))),
            Some(ErrorClass::Tag)
        );
        request::scope(|scope| {
            assert_eq!(
                class(prev.try_immediate_receive_into(scope, &mut buf[..], Some(tag))),
                Some(ErrorClass::Tag)
            );
        });
    }
    assert_quiet(world);

    // The whole non-negative range is the user's, up to the largest tag.
    next.try_send_with_tag(&me, i32::MAX).unwrap();
    let (got, st) = prev.try_receive_with_tag::<i32>(Some(i32::MAX)).unwrap();
    assert_eq!((got, st.tag()), ((me + n - 1) % n, i32::MAX));
    assert_quiet(world);
}

fn short_buffers(world: &SimpleCommunicator) {
    let me = world.rank();
    let other = world.process_at_rank(1 - me);
    // Inline in the envelope on shared memory, eager, and rendezvous.
    for len in [3usize, 300, 300_000] {
        let data: Vec<i32> = (0..len as i32).collect();
        if me == 0 {
            other.try_send_with_tag(&data[..], 0).unwrap();
            other.try_send_with_tag(&(len as u64), 0).unwrap();
        } else {
            let mut short = vec![0i32; len - 1];
            let r = other.try_receive_into_with_tag(&mut short[..], None);
            assert_eq!(class(r), Some(ErrorClass::Truncate), "{len}");
            // The stream is intact: the next message arrives whole.
            let (next, _) = other.try_receive_with_tag::<u64>(None).unwrap();
            assert_eq!(next, len as u64);
        }
    }

    // A synchronous sender completes even though the receiver truncates.
    if me == 0 {
        other.synchronous_send(&[1u8; 100][..]);
    } else {
        let mut short = [0u8; 10];
        let r = other.try_receive_into_with_tag(&mut short[..], None);
        assert_eq!(class(r), Some(ErrorClass::Truncate));
    }

    // Nonblocking receives report it at completion.
    if me == 0 {
        other.try_send_with_tag(&[7u16; 50][..], 0).unwrap();
        other.try_send_with_tag(&[7u8; 12][..], 0).unwrap();
    } else {
        let mut short = [0u16; 49];
        request::scope(|scope| {
            let req = other
                .try_immediate_receive_into(scope, &mut short[..], None)
                .unwrap();
            assert_eq!(class(req.try_wait()), Some(ErrorClass::Truncate));
        });
        let fut = other.try_immediate_receive_vec::<u64>(None).unwrap();
        assert_eq!(class(fut.wait()), Some(ErrorClass::Type));
    }

    // One value expected: more is Truncate, none is Count, a partial one is Type.
    if me == 0 {
        other.try_send_with_tag(&[1i32, 2][..], 0).unwrap();
        other.try_send_with_tag(&[0i32; 0][..], 0).unwrap();
        other.try_send_with_tag(&[1u8; 12][..], 0).unwrap();
        other.try_send_with_tag(&[1u8; 3][..], 0).unwrap();
    } else {
        assert_eq!(
            class(other.try_receive_with_tag::<i32>(None)),
            Some(ErrorClass::Truncate)
        );
        assert_eq!(
            class(other.try_receive_with_tag::<i32>(None)),
            Some(ErrorClass::Count)
        );
        assert_eq!(
            class(other.try_receive_vec_with_tag::<u64>(None)),
            Some(ErrorClass::Type)
        );
        assert_eq!(
            class(other.try_receive_vec_with_tag::<u32>(None)),
            Some(ErrorClass::Type)
        );
    }
    assert_quiet(world);
}

fn sub_communicators(world: &SimpleCommunicator) {
    let me = world.rank();
    let half = world
        .split_by_color(Color::with_value(me % 2))
        .expect("a colour was given");
    assert_eq!(half.size(), 2);
    // World ranks that exist are still out of range in the smaller communicator.
    for r in [2, 3, -1] {
        assert_eq!(class(half.try_process_at_rank(r)), Some(ErrorClass::Rank));
    }
    assert!(world.split_by_color(Color::undefined()).is_none());
    let peer = half.process_at_rank(1 - half.rank());
    assert_eq!(
        class(peer.try_send_with_tag(&me, -1)),
        Some(ErrorClass::Tag)
    );
    peer.try_send_with_tag(&me, 0).unwrap();
    let (got, st) = peer.try_receive_with_tag::<i32>(None).unwrap();
    assert_eq!(got % 2, me % 2);
    assert_eq!(st.source_rank(), 1 - half.rank());
    drop(half);
    assert_quiet(world);
}

fn collective_arguments(world: &SimpleCommunicator) {
    let (n, me) = (world.size() as usize, world.rank());

    // Local checks, no communication.
    let r = collective::try_reduce_local_into(
        &[1i32; 3][..],
        &mut [0i32; 2][..],
        SystemOperation::sum(),
    );
    assert_eq!(class(r), Some(ErrorClass::Count));
    let r = collective::try_reduce_local_into(
        &[1.0f32; 2][..],
        &mut [0.0f32; 2][..],
        SystemOperation::bitwise_or(),
    );
    assert_eq!(class(r), Some(ErrorClass::Type));

    // Buffers that cannot split into one block per rank, the same on every rank.
    let send = vec![me; n + 1];
    let mut recv = vec![0i32; n + 1];
    let r = world.try_all_to_all_into(&send[..], &mut recv[..]);
    assert_eq!(class(r), Some(ErrorClass::Count));
    let r = world.try_reduce_scatter_block_into(&send[..], &mut recv[..1], SystemOperation::sum());
    assert_eq!(class(r), Some(ErrorClass::Count));

    // Root forms at the wrong rank: Arg everywhere, no traffic.
    let root = world.process_at_rank(0);
    let r = if me == 0 {
        root.try_reduce_into(&me, SystemOperation::sum())
    } else {
        root.try_scatter_into_root(&[0i32; 3][..], &mut [0i32][..])
    };
    assert_eq!(class(r), Some(ErrorClass::Arg));
    assert_quiet(world);

    let mut total = 0;
    world.all_reduce_into(&1, &mut total, SystemOperation::sum());
    assert_eq!(total as usize, n);
}
