//! Point-to-point semantics on 2, 4 and 8 ranks (8 oversubscribes a 2-core
//! machine), over shared memory, over forced TCP, and on two emulated
//! machines (both transports in one job).

use std::time::{Duration, Instant};

use metampi::datatype::{MutView, UserDatatype};
use metampi::point_to_point::Status;
use metampi::topology::{Process, SimpleCommunicator};
use metampi::traits::*;
use metampi::ErrorClass;
use metampi_testkit::Ranks;

/// A meta computer of three local sites (1 + 3 + 4 ranks, the last on two
/// machines), with router ports unique to the test so tests can run at once.
fn three_sites(test: &str) -> String {
    let h = test
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    let base = 20_000 + (h % 700) * 16;
    format!(
        "PORTBASE {base}\n\
         METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
         METAHOST b {{ LAUNCH = local; NPROCS = 3; NODES = b0; }}\n\
         METAHOST c {{ LAUNCH = local; NPROCS = 4; NODES = c0, c1; }}\n\
         PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
    )
}

/// As [`three_sites`], with sites a and b paired directly (`PAIR a b 0`:
/// their ranks connect to each other) and b declared big-endian, so typed
/// data on the direct connections is converted too; c is reached through
/// routers.
fn direct_sites(test: &str) -> String {
    three_sites(test)
        .replace("NODES = b0; }", "NODES = b0; BYTEORDER = big; }")
        .replace("PAIR a b 1\na0 <-> b0\n", "PAIR a b 0\n")
}

/// Two meta hosts of 3 ranks, each in a network namespace of its own, and
/// the namespaces (removed when dropped). `None`, after saying why, where
/// namespaces cannot be made; ranks get a placeholder (they do not read it).
fn netns_sites(test: &str) -> Option<(Option<metampi_testkit::NetnsPair>, String)> {
    if metampi_testkit::is_rank() {
        return Some((None, String::new()));
    }
    let ns = metampi_testkit::NetnsPair::create_or_skip(test)?;
    let cfg = ns.description(29500, [3, 3]);
    Some((Some(ns), cfg))
}

/// Two meta hosts in network namespaces paired directly (`PAIR a b 0`):
/// their ranks connect over the veth pair at the namespaces' addresses.
/// Three scenarios in one job (the matrix runs them all through routers).
#[test]
fn direct_netns_sites_6() {
    let name = "direct_netns_sites_6";
    let Some((_ns, cfg)) = netns_sites(name) else {
        return;
    };
    let cfg = cfg.replace("PAIR a b 1\na0 <-> b0\n", "PAIR a b 0\n");
    Ranks::new(6).meta(&cfg).run(name, |world| {
        wildcard_order(world);
        large_messages(world);
        synchronous_send(world);
    });
}

/// This rank's partner in the pair tests (ranks 2k and 2k + 1) and the
/// partner's handle; `None`, after the test's closing barrier, for the last
/// rank of an odd world, which has no partner.
fn pair_peer(world: &SimpleCommunicator) -> Option<(i32, Process<'_>)> {
    let partner = world.rank() ^ 1;
    if partner >= world.size() {
        world.barrier();
        return None;
    }
    Some((partner, world.process_at_rank(partner)))
}

/// Generates one test per (ranks, transport) for a scenario.
macro_rules! matrix {
    ($scenario:ident) => {
        mod $scenario {
            use super::*;
            fn go(n: usize, tcp: bool, name: &str) {
                Ranks::new(n).force_tcp(tcp).run(name, super::$scenario);
            }
            #[test]
            fn shm_2() {
                go(2, false, concat!(stringify!($scenario), "::shm_2"));
            }
            #[test]
            fn shm_4() {
                go(4, false, concat!(stringify!($scenario), "::shm_4"));
            }
            #[test]
            fn shm_8() {
                go(8, false, concat!(stringify!($scenario), "::shm_8"));
            }
            #[test]
            fn tcp_2() {
                go(2, true, concat!(stringify!($scenario), "::tcp_2"));
            }
            #[test]
            fn tcp_4() {
                go(4, true, concat!(stringify!($scenario), "::tcp_4"));
            }
            #[test]
            fn tcp_8() {
                go(8, true, concat!(stringify!($scenario), "::tcp_8"));
            }
            /// Three emulated sites of 1, 3 and 4 ranks joined by routers.
            #[test]
            fn three_sites_8() {
                let name = concat!(stringify!($scenario), "::three_sites_8");
                Ranks::new(8)
                    .meta(&three_sites(name))
                    .run(name, super::$scenario);
            }
            /// The same with two of the sites paired directly (no routers).
            #[test]
            fn direct_sites_8() {
                let name = concat!(stringify!($scenario), "::direct_sites_8");
                Ranks::new(8)
                    .meta(&direct_sites(name))
                    .run(name, super::$scenario);
            }
            /// Two sites of 3 ranks in network namespaces with real addresses,
            /// joined by routers over a veth pair.
            #[test]
            fn two_netns_sites_6() {
                let name = concat!(stringify!($scenario), "::two_netns_sites_6");
                let Some((_ns, cfg)) = netns_sites(name) else {
                    return;
                };
                Ranks::new(6).meta(&cfg).run(name, super::$scenario);
            }
            /// Two emulated machines of 3 ranks: shared memory inside, TCP between.
            #[test]
            fn two_machines_6() {
                Ranks::new(6)
                    .nodes(&[("machineA", 3), ("machineB", 3)])
                    .run(
                        concat!(stringify!($scenario), "::two_machines_6"),
                        super::$scenario,
                    );
            }
        }
    };
}

/// Every non-zero rank sends a numbered stream (small and large messages
/// mixed, several tags); rank 0 receives with any source and any tag and
/// checks that each sender's numbers arrive in order.
fn wildcard_order(world: &SimpleCommunicator) {
    const K: u32 = 300;
    let r = world.rank();
    if r == 0 {
        let mut next = vec![0u32; world.size() as usize];
        for _ in 0..K * (world.size() as u32 - 1) {
            let (v, st): (Vec<u32>, Status) = world.any_process().receive_vec();
            let src = st.source_rank() as usize;
            assert_eq!(v[0], next[src], "message from {src} overtook another");
            assert_eq!(st.tag(), (v[0] % 3) as i32);
            assert!(v[1..].iter().all(|&x| x == v[0]));
            next[src] += 1;
        }
        assert!(next[1..].iter().all(|&c| c == K));
    } else {
        for i in 0..K {
            // Every 37th message is large enough for the rendezvous protocol.
            let len = if i % 37 == 0 {
                40_000
            } else {
                1 + (i as usize % 9)
            };
            world
                .process_at_rank(0)
                .send_with_tag(&vec![i; len][..], (i % 3) as i32);
        }
    }
    world.barrier();
}
matrix!(wildcard_order);

/// Receives posted in another order than their messages came: tags 3, 2,
/// 1, 0 in turn, while the messages came in tag order 0, 1, 2, 3, 0, ... .
/// The first batch waits in the unexpected queue (a probe's pass moved it
/// there), the second in the shared-memory ring (a receive's pass leaves
/// messages that no posted receive wants where they are); each tag's
/// receives must get that tag's messages oldest first across both.
fn posted_out_of_order(world: &SimpleCommunicator) {
    const K: usize = 64;
    let r = world.rank();
    let partner = r ^ 1;
    if partner < world.size() {
        let peer = world.process_at_rank(partner);
        if r % 2 == 0 {
            for v in 0..2 * K as u32 {
                if v == K as u32 {
                    let _go: (u8, Status) = peer.receive_with_tag(99);
                }
                peer.send_with_tag(&v, (v % 4) as i32);
            }
        } else {
            std::thread::sleep(Duration::from_millis(20));
            let _ = peer.probe_with_tag(3);
            peer.send_with_tag(&0u8, 99);
            // The second batch lands while this rank is away.
            std::thread::sleep(Duration::from_millis(20));
            let mut got = vec![u32::MAX; 2 * K];
            metampi::request::scope(|s| {
                let mut cells: Vec<Option<&mut u32>> = got.iter_mut().map(Some).collect();
                let mut reqs = Vec::new();
                for t in (0..4).rev() {
                    for i in (t..2 * K).step_by(4) {
                        let c = cells[i].take().expect("each cell once");
                        reqs.push(peer.immediate_receive_into_with_tag(s, c, t as i32));
                    }
                }
                for q in reqs {
                    q.wait();
                }
            });
            for (i, &v) in got.iter().enumerate() {
                assert_eq!(v as usize, i, "receive {i} got message {v}");
            }
        }
    }
    world.barrier();
}
matrix!(posted_out_of_order);

/// Receives of every kind, posted while their messages wait (in a
/// shared-memory ring or the unexpected queue, where a receive takes a
/// plain eager message at once, without a request slot) and while they
/// have not come yet, in turn: each round the sender sends eight messages
/// (inline, eager, rendezvous and synchronous, on three tags) and the
/// receiver takes them with wildcard and specific, blocking and
/// nonblocking, fixed-buffer and vector receives. An earlier posted receive
/// must get the earlier message, even where a later receive names the
/// sender and the message already waits.
fn receive_paths(world: &SimpleCommunicator) {
    const ROUNDS: u32 = 24;
    // Elements (u32) per message: 4 and 32 bytes go inline in the envelope,
    // 132 and 4000 bytes eagerly, 160 KB by rendezvous.
    const LENS: [usize; 8] = [1, 8, 33, 33, 1000, 40_000, 4, 16];
    const TAGS: [i32; 8] = [0, 1, 0, 1, 0, 1, 7, 1];
    let r = world.rank();
    let Some((partner, peer)) = pair_peer(world) else {
        return;
    };
    let fill = |round: u32, i: usize| vec![round * 8 + i as u32; LENS[i]];
    for round in 0..ROUNDS {
        // Odd rounds: the messages come once the first two receives are posted.
        let late = round % 2 == 1;
        if r % 2 == 0 {
            if late {
                let _go: (u8, Status) = peer.receive_with_tag(99);
            }
            for (i, &tag) in TAGS.iter().enumerate() {
                let v = fill(round, i);
                if tag == 7 {
                    peer.synchronous_send_with_tag(&v[..], tag);
                } else {
                    peer.send_with_tag(&v[..], tag);
                }
            }
            continue;
        }
        if !late {
            // Everything up to the synchronous send waits unread.
            std::thread::sleep(Duration::from_millis(10));
        }
        let check = |i: usize, got: &[u32], st: Status| {
            assert_eq!(st.source_rank(), partner, "round {round}, message {i}");
            assert_eq!(st.tag(), TAGS[i], "round {round}, message {i}");
            assert_eq!(got, &fill(round, i)[..], "round {round}, message {i}");
        };
        let mut b0 = vec![0u32; 64];
        let mut b1 = vec![0u32; 64];
        let mut b2 = vec![0u32; 64];
        let mut w4 = vec![0u32; 1000];
        let mut w5 = vec![0u32; 40_000];
        let mut w6 = vec![0u32; 4];
        let mut w7 = vec![0u32; 100];
        let count = |st: &Status| st.count(u32::equivalent_datatype()) as usize;
        let sts = metampi::request::scope(|s| {
            // Message 0: any tag from the partner; message 1: tag 1 from
            // any source. Both posted before the receives below, which
            // would match them too.
            let r0 = peer.immediate_receive_into(s, &mut b0[..]);
            let mut r1 = world
                .any_process()
                .immediate_receive_into_with_tag(s, &mut b1[..], 1);
            if late {
                // The messages land behind the posted receives, unread.
                peer.send_with_tag(&0u8, 99);
                std::thread::sleep(Duration::from_millis(10));
            }
            let st = peer.receive_into_with_tag(&mut b2[..], 0);
            check(2, &b2[..count(&st)], st);
            let (v3, st) = peer.receive_vec_with_tag::<u32>(1);
            check(3, &v3, st);
            let st1 = loop {
                match r1.test() {
                    Ok(st) => break st,
                    Err(again) => r1 = again,
                }
            };
            let st0 = r0.wait();
            let q4 = peer.immediate_receive_into_with_tag(s, &mut w4[..], 0);
            let q5 = peer.immediate_receive_into_with_tag(s, &mut w5[..], 1);
            let q6 = peer.immediate_receive_into_with_tag(s, &mut w6[..], 7);
            let q7 = peer.immediate_receive_into(s, &mut w7[..]);
            // Completed last to first.
            let st7 = q7.wait();
            let st6 = q6.wait();
            let st5 = q5.wait();
            let st4 = q4.wait();
            [st0, st1, st4, st5, st6, st7]
        });
        check(0, &b0[..count(&sts[0])], sts[0]);
        check(1, &b1[..count(&sts[1])], sts[1]);
        check(4, &w4, sts[2]);
        check(5, &w5, sts[3]);
        check(6, &w6, sts[4]);
        check(7, &w7[..count(&sts[5])], sts[5]);
    }
    world.barrier();
}
matrix!(receive_paths);

/// Receives into a non-contiguous buffer (every other element: a vector
/// type), nonblocking and blocking, with the message already waiting or
/// arriving behind the posted receive: the packed bytes are unpacked at the
/// wait, and a message longer than the strided buffer is `Truncate` there.
fn strided_receives(world: &SimpleCommunicator) {
    // Elements per message: inline, eager, too long for 4 slots, rendezvous.
    const LENS: [usize; 4] = [4, 1000, 5, 40_000];
    let r = world.rank();
    let Some((_, peer)) = pair_peer(world) else {
        return;
    };
    let fill = |round: u32, i: usize| -> Vec<u32> {
        (0..LENS[i] as u32)
            .map(|k| round * 100_000 + k + 1)
            .collect()
    };
    for round in 0..6 {
        let late = round % 2 == 1;
        if r % 2 == 0 {
            if late {
                let _go: (u8, Status) = peer.receive_with_tag(99);
            }
            for i in 0..LENS.len() {
                peer.send_with_tag(&fill(round, i)[..], 0);
            }
            continue;
        }
        if !late {
            std::thread::sleep(Duration::from_millis(10));
        }
        let u32t = u32::equivalent_datatype();
        let every_other = |n: usize| UserDatatype::vector(n as i32, 1, 2, &u32t);
        let check = |i: usize, buf: &[u32]| {
            let want = fill(round, i);
            for (k, &v) in buf.iter().enumerate() {
                let expect = if k % 2 == 0 { want[k / 2] } else { 0 };
                assert_eq!(v, expect, "round {round}, message {i}, element {k}");
            }
        };
        let mut b0 = [0u32; 8];
        let mut b1 = vec![0u32; 2000];
        let mut b2 = [0u32; 8];
        let mut b3 = vec![0u32; 80_000];
        let (t4, t1000, t40k) = (every_other(4), every_other(1000), every_other(40_000));
        {
            // SAFETY: n values every other element lie inside each 2n-element buffer.
            let mut v0 = unsafe { MutView::with_count_and_datatype(&mut b0[..], 1, &t4) };
            // SAFETY: as above.
            let mut v1 = unsafe { MutView::with_count_and_datatype(&mut b1[..], 1, &t1000) };
            // SAFETY: as above.
            let mut v2 = unsafe { MutView::with_count_and_datatype(&mut b2[..], 1, &t4) };
            // SAFETY: as above.
            let mut v3 = unsafe { MutView::with_count_and_datatype(&mut b3[..], 1, &t40k) };
            metampi::request::scope(|s| {
                let q0 = peer.immediate_receive_into(s, &mut v0);
                if late {
                    peer.send_with_tag(&0u8, 99);
                    std::thread::sleep(Duration::from_millis(10));
                }
                let st = peer.receive_into(&mut v1);
                assert_eq!(st.count(u32t), 1000);
                let q2 = peer.immediate_receive_into(s, &mut v2);
                let q3 = peer.immediate_receive_into(s, &mut v3);
                let err = q2.try_wait().expect_err("5 values into 4 slots");
                assert_eq!(err.class(), ErrorClass::Truncate, "round {round}");
                assert_eq!(q3.wait().count(u32t), 40_000);
                assert_eq!(q0.wait().count(u32t), 4);
            });
        }
        check(0, &b0);
        check(1, &b1);
        check(3, &b3);
    }
    world.barrier();
}
matrix!(strided_receives);

/// Probe does not consume; matched probe takes exactly the probed message.
fn probe_and_matched_probe(world: &SimpleCommunicator) {
    let r = world.rank();
    let partner = r ^ 1;
    if partner >= world.size() {
        return;
    }
    let peer = world.process_at_rank(partner);
    if r % 2 == 0 {
        peer.send_with_tag(&[1.5f64, 2.5, 3.5][..], 7);
        peer.send_with_tag(&42u16, 8);
    } else {
        let st = peer.probe_with_tag(7);
        assert_eq!(st.count(f64::equivalent_datatype()), 3);
        let st2 = world.any_process().probe();
        assert_eq!(st2.tag(), 7, "probe must not consume the message");
        let (msg, st3) = peer.matched_probe_with_tag(8);
        assert_eq!(st3.tag(), 8);
        let (v, _) = msg.matched_receive::<u16>();
        assert_eq!(v, 42);
        let (vals, _) = peer.receive_vec_with_tag::<f64>(7);
        assert_eq!(vals, vec![1.5, 2.5, 3.5]);
        assert!(world.any_process().immediate_probe().is_none());
    }
    world.barrier();
}
matrix!(probe_and_matched_probe);

/// A message longer than the receive buffer is a truncation error, on the
/// eager and the rendezvous path, and the job carries on afterwards.
fn truncation(world: &SimpleCommunicator) {
    let r = world.rank();
    let Some((_, peer)) = pair_peer(world) else {
        return;
    };
    if r % 2 == 0 {
        peer.send(&[1i32; 10][..]);
        peer.send(&vec![2u8; 1 << 20][..]);
        // Eager through routers, and longer than what one read brings in.
        peer.send(&vec![3u8; 300_000][..]);
        peer.synchronous_send(&vec![4u8; 300_000][..]);
        peer.send(&5i32);
    } else {
        let mut small = [0i32; 5];
        let e = peer
            .try_receive_into_with_tag(&mut small[..], None)
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Truncate);
        let mut kb = vec![0u8; 1024];
        let e = peer
            .try_receive_into_with_tag(&mut kb[..], None)
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Truncate);
        let e = peer
            .try_receive_into_with_tag(&mut kb[..], None)
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Truncate);
        // A buffer that fits, posted by a wildcard receive.
        let mut big = vec![0u8; 400_000];
        let st = world.any_process().receive_into(&mut big[..]);
        assert_eq!(st.count(u8::equivalent_datatype()), 300_000);
        assert!(big[..300_000].iter().all(|&b| b == 4) && big[300_000..].iter().all(|&b| b == 0));
        let (v, _) = peer.receive::<i32>();
        assert_eq!(v, 5);
        let e = peer
            .try_receive_into_with_tag(&mut kb[..], Some(-3))
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Tag);
        assert_eq!(
            world
                .try_process_at_rank(world.size())
                .err()
                .map(|e| e.class()),
            Some(ErrorClass::Rank)
        );
    }
    world.barrier();
}
matrix!(truncation);

/// A synchronous send completes only after the receiver has matched it.
fn synchronous_send(world: &SimpleCommunicator) {
    let r = world.rank();
    let Some((_, peer)) = pair_peer(world) else {
        return;
    };
    if r % 2 == 0 {
        let x = 9u64;
        metampi::request::scope(|scope| {
            let mut req = peer.immediate_synchronous_send(scope, &x);
            let until = Instant::now() + Duration::from_millis(200);
            while Instant::now() < until {
                req = match req.test() {
                    Ok(_) => panic!("synchronous send completed before the receive was posted"),
                    Err(req) => req,
                };
                std::thread::sleep(Duration::from_millis(5));
            }
            peer.send_with_tag(&1u8, 99);
            req.wait();
        });
        // The owned form too, for an eager-sized vector (a standard send of it would
        // complete at once).
        let mut send = peer.immediate_synchronous_send_owned(vec![7u32; 100], 98);
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            assert!(
                send.test().is_none(),
                "owned synchronous send completed before the receive was posted"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        peer.send_with_tag(&2u8, 99);
        assert_eq!(
            send.wait().unwrap(),
            vec![7u32; 100],
            "the vector comes back"
        );
    } else {
        let _ = peer.receive_with_tag::<u8>(99);
        let (v, _) = peer.receive::<u64>();
        assert_eq!(v, 9);
        let _ = peer.receive_with_tag::<u8>(99);
        let (v, _) = peer.receive_vec_with_tag::<u32>(98);
        assert_eq!(v, vec![7u32; 100]);
    }
    world.barrier();
}
matrix!(synchronous_send);

/// 64 MiB from rank 0 to the last rank and back.
fn large_messages(world: &SimpleCommunicator) {
    let n = 64 << 20;
    let last = world.size() - 1;
    let r = world.rank();
    if r == 0 {
        let data: Vec<u8> = (0..n).map(|i| (i * 31 % 253) as u8).collect();
        world.process_at_rank(last).send(&data[..]);
        let mut back = vec![0u8; n];
        world.process_at_rank(last).receive_into(&mut back[..]);
        assert!(back == data, "64 MiB came back different");
    } else if r == last {
        let (v, st) = world.process_at_rank(0).receive_vec::<u8>();
        assert_eq!(st.count(u8::equivalent_datatype()) as usize, n);
        world.process_at_rank(0).send(&v[..]);
    }
    world.barrier();
}
matrix!(large_messages);

/// Buffers where copies hit the slow `rep movsb` case (the destination 1-31
/// bytes past the source within a page; `sys/copy.rs`) and elsewhere, on
/// every path (rings, single-copy pulls and helpers, staging, routers): each
/// byte arrives where it belongs, and so does an all-to-all whose receive
/// blocks lie 16 bytes past its send blocks.
fn placements(world: &SimpleCommunicator) {
    if let Some((partner, peer)) = pair_peer(world) {
        let first = world.rank() < partner;
        let byte = |i: usize, len: usize, d: usize| (i * 13 + len + d + i / 4099) as u8;
        for len in [1500usize, 5000, 40_000, 100_000, 700_000, 3 << 20] {
            for d in [0usize, 1, 16, 31, 33, 4080] {
                // Each of the pair sends once and receives once per case.
                for sending in [first, !first] {
                    if sending {
                        let mut store = vec![0u8; len + 4096];
                        let at = (d * 7 + len) % 4096;
                        store[at..at + len]
                            .iter_mut()
                            .enumerate()
                            .for_each(|(i, b)| *b = byte(i, len, d));
                        let src = &store[at..at + len];
                        peer.send(&((src.as_ptr() as usize & 4095) as u64));
                        peer.send(src);
                    } else {
                        let (off, _) = peer.receive::<u64>();
                        let mut store = vec![0u8; len + 8192];
                        let want = (off as usize + d) & 4095;
                        let at = want.wrapping_sub(store.as_ptr() as usize) & 4095;
                        peer.receive_into(&mut store[at..at + len]);
                        let bad = (0..len).find(|&i| store[at + i] != byte(i, len, d));
                        assert_eq!(bad, None, "{len} bytes at +{d}: first wrong byte");
                        assert!(store[..at]
                            .iter()
                            .chain(&store[at + len..])
                            .all(|&b| b == 0));
                    }
                }
            }
        }
    }
    world.barrier();
    let n = world.size() as usize;
    let me = world.rank() as usize;
    let block = 100_003;
    let send: Vec<u8> = (0..n * block)
        .map(|i| (i / block * 31 + me * 7 + i) as u8)
        .collect();
    let mut store = vec![0u8; n * block + 8192];
    let at = ((send.as_ptr() as usize + 16).wrapping_sub(store.as_ptr() as usize)) & 4095;
    world.all_to_all_into(&send[..], &mut store[at..at + n * block]);
    for from in 0..n {
        let got = &store[at + from * block..at + (from + 1) * block];
        let bad = (0..block).find(|&i| got[i] != (me * 31 + from * 7 + me * block + i) as u8);
        assert_eq!(bad, None, "all-to-all block from {from}: first wrong byte");
    }
}
matrix!(placements);

/// Long shared-memory messages are copied by both sides: a sender waiting
/// for its send writes chunks into the receiver's buffer, and every byte
/// still lands where it belongs.
#[test]
fn waiting_senders_help_copy() {
    Ranks::new(2).run("waiting_senders_help_copy", |world| {
        const N: usize = 32 << 20;
        let pattern = |k: usize, i: usize| ((i * 13 + k) % 251) as u8;
        let peer = world.process_at_rank(1 - world.rank());
        if world.rank() == 0 {
            for k in 0..8 {
                let data: Vec<u8> = (0..N).map(|i| pattern(k, i)).collect();
                peer.send(&data[..]);
            }
            peer.send(&metampi_testkit::chunks_helped().map_or(-1, |h| h as i64));
        } else {
            let mut buf = vec![0u8; N];
            for k in 0..8 {
                buf.fill(0);
                peer.receive_into(&mut buf[..]);
                let bad = (0..N).find(|&i| buf[i] != pattern(k, i));
                assert_eq!(bad, None, "message {k}: first wrong byte");
            }
            let (helped, _) = peer.receive::<i64>();
            if helped < 0 {
                eprintln!(
                    "skipped: this machine does not copy cooperatively (more ranks than cores?)"
                );
            } else {
                assert!(
                    helped > 0,
                    "the sender never helped with 8 messages of 32 MiB"
                );
            }
        }
    });
}

/// With `METAMPI_ASYMMETRIC_FENCE=0` every writer fences for itself
/// instead of relying on the sleeper's `membarrier`: eight ranks on two
/// cores keep falling asleep, and streams, synchronous sends and barriers
/// must still wake them.
#[test]
fn symmetric_fences_wake_sleepers() {
    Ranks::new(8).env("METAMPI_ASYMMETRIC_FENCE", "0").run(
        "symmetric_fences_wake_sleepers",
        |world| {
            wildcard_order(world);
            synchronous_send(world);
            large_messages(world);
        },
    );
}

/// A burst of small messages to a receiver that has fallen asleep waiting
/// for something else wakes it once per sleep, not once per message (a
/// `sendto` each, 1.5-4 µs, for as long as its flag stayed up), and the
/// burst arrives whole and in order. The same the other way: a receiver
/// taking queued messages from the ring while their sender sleeps wakes it
/// for the freed space once per sleep.
#[test]
fn sleepers_are_woken_once_per_sleep() {
    Ranks::new(2).run("sleepers_are_woken_once_per_sleep", |world| {
        const BURST: usize = 2000;
        // One datagram per message (the old rule) sent all 2000 here.
        const MANY: u64 = BURST as u64 / 4;
        let peer = world.process_at_rank(1 - world.rank());
        let msg = |k: usize| (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        if !metampi_testkit::reaches_over_shared_memory(world, 1 - world.rank()) {
            eprintln!("skipped: the two ranks do not share memory");
            return;
        }
        let wakes = metampi_testkit::wake_ups_sent;
        // Long enough for a waiting rank to spin out its budget and sleep.
        let nap = || std::thread::sleep(Duration::from_millis(60));
        for round in 0..3 {
            world.barrier();
            // Rank 1 sleeps in a receive of tag 99; rank 0 sends the burst.
            if world.rank() == 0 {
                nap();
                let before = wakes();
                for k in 0..BURST {
                    peer.send(&msg(k));
                }
                peer.send_with_tag(&(wakes() - before), 99);
            } else {
                let (sent, _) = peer.receive_with_tag::<u64>(99);
                for k in 0..BURST {
                    let (v, st) = peer.receive::<u64>();
                    assert_eq!((v, st.tag()), (msg(k), 0), "round {round}, message {k}");
                }
                // One per sleep of the receiver, and a sleep follows a spin
                // budget (200 µs or more) without progress: a burst of 0.3 ms
                // meets one or two, one slowed down by a loaded machine more
                // (78 seen in CI), one per message far more.
                assert!(
                    sent < MANY,
                    "round {round}: {sent} wake-ups for a burst of {BURST}"
                );
            }
            world.barrier();
            // Rank 0 sends the burst into the ring while rank 1 is away,
            // then sleeps in a receive while rank 1 takes it from the ring.
            if world.rank() == 0 {
                for k in 0..BURST {
                    peer.send(&msg(k + 1));
                }
                let (freed, _) = peer.receive_with_tag::<u64>(98);
                assert!(
                    freed < MANY,
                    "round {round}: {freed} wake-ups taking {BURST}"
                );
            } else {
                nap();
                let before = wakes();
                for k in 0..BURST {
                    let (v, _) = peer.receive::<u64>();
                    assert_eq!(v, msg(k + 1), "round {round}, message {k} from the ring");
                }
                peer.send_with_tag(&(wakes() - before), 98);
            }
        }
    });
}

/// A rank that keeps waiting about a millisecond for its peer learns to
/// spin through such waits instead of sleeping (a wake-up costs hundreds of
/// microseconds in a virtual machine), where the machine has a core for each
/// runnable thread.
#[test]
fn spin_budget_learns_a_rhythm() {
    Ranks::new(2).run("spin_budget_learns_a_rhythm", |world| {
        let peer = world.process_at_rank(1 - world.rank());
        // Waits short enough to learn from (a loaded machine may stretch
        // them past the 5 ms that lower the budget instead).
        let mut short = 0;
        for k in 0..30u32 {
            if world.rank() == 0 {
                // Asleep, not computing: the machine keeps a core free.
                std::thread::sleep(Duration::from_millis(1));
                peer.send(&k);
            } else {
                let t = Instant::now();
                assert_eq!(peer.receive::<u32>().0, k);
                short += usize::from(t.elapsed() < Duration::from_millis(4));
            }
        }
        if world.rank() == 1 {
            match metampi_testkit::spin_budget() {
                None => eprintln!("skipped: this rank's spin budget is fixed"),
                Some((base, now, 0, busy)) if busy > 0 || short == 0 => eprintln!(
                    "skipped: the machine was busy at each of {busy} looks, or no wait was \
                     short ({short}) (budget {now:?}, base {base:?})"
                ),
                Some((base, now, grown, _)) => assert!(
                    grown > 0,
                    "30 waits of about 1 ms never raised the budget ({now:?}, base {base:?})"
                ),
            }
        }
    });
}

/// Rank 0 waits for a message from rank `from`, which sends it after 30 ms,
/// and counts its looks at its TCP sockets and the passes that skipped one;
/// the message arrives either way.
fn socket_looks_waiting_for(world: &SimpleCommunicator, from: i32) -> Option<(u64, u64)> {
    // All are there before the 30 ms start (ranks can start that far apart
    // on a loaded machine).
    world.barrier();
    if world.rank() == 0 {
        let before = metampi_testkit::socket_looks();
        let mut x = 0u64;
        metampi::request::scope(|s| {
            let mut req = world
                .process_at_rank(from)
                .immediate_receive_into(s, &mut x);
            // Each test is a progress pass.
            while let Err(r) = req.test() {
                req = r;
            }
        });
        assert_eq!(x, 42);
        let after = metampi_testkit::socket_looks();
        world.barrier();
        Some((after.0 - before.0, after.1 - before.1))
    } else {
        if world.rank() == from {
            std::thread::sleep(Duration::from_millis(30));
            world.process_at_rank(0).send(&42u64);
        }
        world.barrier();
        None
    }
}

/// Runs a job on emulated machines `nodes` in which rank 0 waits for rank
/// `from` ([`socket_looks_waiting_for`]); `ok` judges its looks and skips.
fn socket_looks_job(name: &str, nodes: &[(&str, usize)], from: i32, ok: fn(u64, u64) -> bool) {
    let n = nodes.iter().map(|&(_, k)| k).sum();
    Ranks::new(n).nodes(nodes).run(name, |world| {
        if let Some((looks, skips)) = socket_looks_waiting_for(world, from) {
            assert!(
                ok(looks, skips),
                "{looks} passes looked at the socket, {skips} skipped the look"
            );
        }
    });
}

/// A rank waiting for its shared-memory peer (rank 1) looks at the socket
/// of its quiet TCP peer (rank 2, on another emulated machine) on some of
/// its passes, not on each: after a look that found nothing the next waits
/// twice as long as that one took.
#[test]
fn quiet_tcp_peers_are_looked_at_now_and_then() {
    socket_looks_job(
        "quiet_tcp_peers_are_looked_at_now_and_then",
        &[("a", 2), ("b", 1)],
        1,
        |looks, skips| looks > 0 && skips > 2 * looks,
    );
}

/// The same rank waiting for the TCP peer's message looks at its socket in
/// every pass (but perhaps the first few, left from a gap set before): the
/// look is what it waits for.
#[test]
fn an_awaited_socket_is_looked_at_every_pass() {
    socket_looks_job(
        "an_awaited_socket_is_looked_at_every_pass",
        &[("a", 2), ("b", 1)],
        2,
        |looks, skips| looks > 100 && skips * 10 < looks,
    );
}

/// A rank whose only links are TCP sockets has nothing to do between two
/// looks: it looks in every pass, and sees a message as soon as it is there.
#[test]
fn sockets_alone_are_looked_at_every_pass() {
    socket_looks_job(
        "sockets_alone_are_looked_at_every_pass",
        &[("a", 1), ("b", 1)],
        1,
        |looks, skips| looks > 100 && skips == 0,
    );
}

/// A rendezvous over TCP: once the receiver has answered `Cts`, its reads
/// wait for the data's envelope with a small staging read, so the payload
/// goes straight into the receive buffer; only the few KiB read with the
/// envelope are copied twice (a full staging read took 256 KiB of every
/// message).
#[test]
fn rendezvous_data_is_read_straight_into_the_buffer() {
    const N: usize = 1 << 20;
    const ROUNDS: usize = 8;
    Ranks::new(2).force_tcp(true).run(
        "rendezvous_data_is_read_straight_into_the_buffer",
        |world| {
            let peer = world.process_at_rank(1 - world.rank());
            let before = metampi_testkit::staged_payload_bytes();
            let mut buf = vec![0u8; N];
            for k in 0..ROUNDS {
                if world.rank() == 0 {
                    buf.iter_mut()
                        .enumerate()
                        .for_each(|(i, b)| *b = (i + k) as u8);
                    peer.send(&buf[..]);
                    peer.receive_into(&mut buf[..1]);
                } else {
                    peer.receive_into(&mut buf[..]);
                    assert!(buf.iter().enumerate().all(|(i, &b)| b == (i + k) as u8));
                    peer.send(&buf[..1]);
                }
            }
            if world.rank() == 1 {
                let staged = metampi_testkit::staged_payload_bytes() - before;
                assert!(
                    staged <= (ROUNDS * (8 << 10)) as u64,
                    "{staged} bytes of {ROUNDS} messages of {N} went through the staging buffer"
                );
            }
        },
    );
}

/// `METAMPI_SPIN_LEARN=0` keeps the starting budget through the same
/// rhythm (`psrsearch` sets it for its ranks).
#[test]
fn spin_learn_off_keeps_the_budget() {
    Ranks::new(2)
        .env("METAMPI_SPIN_LEARN", "0")
        .run("spin_learn_off_keeps_the_budget", |world| {
            let peer = world.process_at_rank(1 - world.rank());
            for k in 0..10u32 {
                if world.rank() == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                    peer.send(&k);
                } else {
                    assert_eq!(peer.receive::<u32>().0, k);
                }
            }
            assert_eq!(
                metampi_testkit::spin_budget(),
                None,
                "METAMPI_SPIN_LEARN=0 left the budget learning"
            );
        });
}

/// Eight threads of one rank, each blocked in a receive of its own tag while
/// the messages come one at a time a millisecond apart (waits that do not
/// spin, so every thread sleeps): a thread is woken for its own message, or
/// to poll in place of one that left, not whenever any message moves.
#[test]
fn blocked_threads_are_woken_for_their_own_message() {
    const THREADS: u32 = 8;
    const EACH: u32 = 20;
    Ranks::new(2).env("METAMPI_SPIN_US", "0").run(
        "blocked_threads_are_woken_for_their_own_message",
        |world| {
            let peer = world.process_at_rank(1 - world.rank());
            world.barrier();
            if world.rank() == 1 {
                for i in 0..EACH {
                    for t in 0..THREADS {
                        std::thread::sleep(Duration::from_millis(1));
                        peer.send_with_tag(&(t * 1000 + i), t as i32);
                    }
                }
            } else {
                let (woken0, idle0) = metampi_testkit::thread_wake_ups();
                std::thread::scope(|s| {
                    for t in 0..THREADS {
                        s.spawn(move || {
                            for i in 0..EACH {
                                let (v, st) = peer.receive_with_tag::<u32>(t as i32);
                                assert_eq!((v, st.tag()), (t * 1000 + i, t as i32));
                            }
                        });
                    }
                });
                let (woken, idle) = metampi_testkit::thread_wake_ups();
                let (woken, idle) = (woken - woken0, idle - idle0);
                let messages = u64::from(THREADS * EACH);
                // Each message wakes its own thread and at most one more (to poll), where
                // waking every sleeper gave about THREADS - 1 idle wake-ups a message.
                assert!(
                    idle <= 2 * messages,
                    "{idle} of {woken} wake-ups found their wait not over, for {messages} messages"
                );
            }
            world.barrier();
        },
    );
}

/// Collectives on one thread while another thread of every rank is blocked
/// in a receive that comes only at the end: the blocked thread holds the
/// poller's role, and the collective's waits (shared-memory flags that other
/// processes write, which no progress pass of this rank reports) must still
/// end.
#[test]
fn collectives_beside_a_blocked_thread() {
    Ranks::new(3).run("collectives_beside_a_blocked_thread", |world| {
        let (r, n) = (world.rank(), world.size());
        let dup = world.duplicate();
        world.barrier();
        std::thread::scope(|s| {
            s.spawn(|| {
                let (v, _) = world
                    .process_at_rank((r + 1) % n)
                    .receive_with_tag::<i32>(99);
                assert_eq!(v, (r + 1) % n);
            });
            std::thread::sleep(Duration::from_millis(20));
            for k in 0..60 {
                dup.barrier();
                let mut sum = 0i64;
                dup.all_reduce_into(
                    &(i64::from(r) + k),
                    &mut sum,
                    metampi::collective::SystemOperation::sum(),
                );
                assert_eq!(sum, 3 * k + 3);
            }
            world.process_at_rank((r + n - 1) % n).send_with_tag(&r, 99);
        });
    });
}

/// Two threads of one rank waiting by turns for messages a millisecond
/// apart must not learn to spin through the waits: both would spin, and
/// threads outnumbering the cores wait a time slice to see their message.
#[test]
fn waiting_threads_keep_the_spin_budget() {
    Ranks::new(2).run("waiting_threads_keep_the_spin_budget", |world| {
        const N: u32 = 40;
        if world.rank() == 0 {
            std::thread::scope(|s| {
                for t in 0..2 {
                    s.spawn(move || {
                        let peer = world.process_at_rank(1);
                        for i in 0..N {
                            assert_eq!(peer.receive_with_tag::<u32>(t).0, i);
                        }
                    });
                }
            });
            // (One raise would be enough to stop the sleeps that could lower
            // it again.)
            if let Some((base, now, grown, _)) = metampi_testkit::spin_budget() {
                assert_eq!(now, base, "raised {grown} times with two threads waiting");
            }
        } else {
            let peer = world.process_at_rank(0);
            // Both threads are waiting before the first message.
            std::thread::sleep(Duration::from_millis(50));
            for i in 0..N {
                for t in 0..2 {
                    std::thread::sleep(Duration::from_millis(1));
                    peer.send_with_tag(&i, t);
                }
            }
        }
    });
}

/// 10,000 receives and 10,000 sends outstanding at once.
fn many_requests(world: &SimpleCommunicator) {
    const N: usize = 10_000;
    let r = world.rank();
    let Some((partner, peer)) = pair_peer(world) else {
        return;
    };
    let out: Vec<u64> = (0..N as u64).map(|i| i * 3 + r as u64).collect();
    let mut inb = vec![0u64; N];
    metampi::request::multiple_scope(2 * N, |scope, coll| {
        for slot in inb.chunks_mut(1) {
            coll.add(peer.immediate_receive_into(scope, slot));
        }
        for x in out.chunks(1) {
            coll.add(peer.immediate_send(scope, x));
        }
        let mut done = Vec::new();
        coll.wait_all(&mut done);
        assert_eq!(done.len(), 2 * N);
    });
    for (i, &v) in inb.iter().enumerate() {
        assert_eq!(v, i as u64 * 3 + partner as u64);
    }
    world.barrier();
}
matrix!(many_requests);

/// Four threads share one communicator; each thread talks to the same thread
/// of the partner on its own tag, and order per tag holds.
fn four_threads(world: &SimpleCommunicator) {
    let r = world.rank();
    let partner = r ^ 1;
    if partner >= world.size() {
        world.barrier();
        return;
    }
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                let peer = world.process_at_rank(partner);
                for i in 0..300u32 {
                    if r % 2 == 0 {
                        peer.send_with_tag(&[t, i], t as i32);
                        let (v, _) = peer.receive_with_tag::<u32>(t as i32 + 10);
                        assert_eq!(v, i);
                    } else {
                        let (v, _) = peer.receive_vec_with_tag::<u32>(t as i32);
                        assert_eq!(v, vec![t, i]);
                        peer.send_with_tag(&i, t as i32 + 10);
                    }
                }
            });
        }
    });
    world.barrier();
}
matrix!(four_threads);

/// Owned nonblocking operations are futures that an executor can await; the
/// library wakes them (the sender starts late, so the receiver really sleeps).
fn futures_with_executor(world: &SimpleCommunicator) {
    let r = world.rank();
    let Some((_, peer)) = pair_peer(world) else {
        return;
    };
    if r % 2 == 0 {
        std::thread::sleep(Duration::from_millis(100));
        let sends: Vec<_> = (0..8)
            .map(|t| peer.immediate_send_owned(vec![t as i64; 1000 * t + 1], t as i32))
            .collect();
        let back = futures_executor::block_on(async {
            let mut out = Vec::new();
            for s in sends {
                out.push(s.await.unwrap());
            }
            out
        });
        assert_eq!(back[3].len(), 3001);
    } else {
        let recvs: Vec<_> = (0..8)
            .map(|t| peer.try_immediate_receive_vec::<i64>(Some(t)).unwrap())
            .collect();
        let got = futures_executor::block_on(async {
            let mut out = Vec::new();
            for f in recvs {
                out.push(f.await.unwrap());
            }
            out
        });
        for (t, (v, st)) in got.iter().enumerate() {
            assert_eq!(st.tag(), t as i32);
            assert_eq!(v.len(), 1000 * t + 1);
            assert!(v.iter().all(|&x| x == t as i64));
        }
    }
    world.barrier();
}
matrix!(futures_with_executor);

/// Windows of concurrent rendezvous-sized messages in both directions between
/// every rank and the next: exercises request-to-send, clear-to-send and data
/// fragments on every transport, many in flight at once.
fn rendezvous_window(world: &SimpleCommunicator) {
    const W: usize = 12;
    const LEN: usize = 300_000;
    let r = world.rank();
    let n = world.size();
    let next = world.process_at_rank((r + 1) % n);
    let prev = world.process_at_rank((r + n - 1) % n);
    let out: Vec<Vec<u8>> = (0..W)
        .map(|w| {
            (0..LEN)
                .map(|i| ((i + w * 7 + r as usize) % 251) as u8)
                .collect()
        })
        .collect();
    let mut inb = vec![vec![0u8; LEN]; W];
    metampi::request::scope(|scope| {
        let recvs: Vec<_> = inb
            .iter_mut()
            .enumerate()
            .map(|(w, b)| prev.immediate_receive_into_with_tag(scope, &mut b[..], w as i32))
            .collect();
        let sends: Vec<_> = out
            .iter()
            .enumerate()
            .map(|(w, b)| next.immediate_send_with_tag(scope, &b[..], w as i32))
            .collect();
        for s in sends {
            s.wait();
        }
        for q in recvs {
            q.wait();
        }
    });
    let p = ((r + n - 1) % n) as usize;
    for (w, b) in inb.iter().enumerate() {
        assert!(
            b.iter()
                .enumerate()
                .all(|(i, &x)| x == ((i + w * 7 + p) % 251) as u8),
            "window {w} from {p} corrupted"
        );
    }
    world.barrier();
}
matrix!(rendezvous_window);

/// A blocking receive whose message comes while it watches the sender's ring
/// (each round the receiver asks for the message, then receives at once):
/// every kind of message lands as through a posted receive, an earlier
/// nonblocking receive still takes the first message, a message the pattern
/// refuses is passed by, and small ones are taken on the watching path.
#[test]
fn blocking_receives_waiting_on_the_ring() {
    Ranks::new(2).run("blocking_receives_waiting_on_the_ring", |world| {
        let peer = world.process_at_rank(1 - world.rank());
        let bytes = |n: usize, k: u8| {
            (0..n)
                .map(|i| (i as u8).wrapping_mul(7) ^ k)
                .collect::<Vec<u8>>()
        };
        const SMALL: usize = 300;
        if world.rank() == 0 {
            let go = || peer.receive::<u8>().0;
            // Small messages for as long as the receiver asks for more.
            let mut k = 0;
            while go() == 1 {
                peer.send_with_tag(&bytes(8, k as u8)[..], 1);
                k += 1;
            }
            go();
            peer.send_with_tag(&bytes(16 << 10, 2)[..], 2);
            go();
            peer.send_with_tag(&bytes(1 << 20, 3)[..], 3);
            go();
            peer.synchronous_send_with_tag(&bytes(8, 4)[..], 4);
            go();
            peer.send_with_tag(&bytes(100, 5)[..], 5);
            go();
            peer.send_with_tag(&bytes(8, 6)[..], 6);
            peer.send_with_tag(&bytes(8, 7)[..], 6);
            go();
            peer.send_with_tag(&bytes(8, 8)[..], 7);
            peer.send_with_tag(&bytes(8, 9)[..], 8);
        } else {
            let go = || peer.send(&1u8);
            let mut b8 = [0u8; 8];
            // At least SMALL rounds; more while none took the watching path
            // (a loaded machine may run the sender late every time), for
            // at most 20 s.
            let t = Instant::now();
            let mut k = 0;
            loop {
                let watched = metampi_testkit::spin_receives().is_none_or(|n| n > 0);
                let more = k < SMALL || (!watched && t.elapsed() < Duration::from_secs(20));
                peer.send(&u8::from(more));
                if !more {
                    break;
                }
                let st = peer.receive_into_with_tag(&mut b8[..], 1);
                assert_eq!(
                    (st.tag(), &b8[..]),
                    (1, &bytes(8, k as u8)[..]),
                    "small {k}"
                );
                k += 1;
            }
            let mut big = vec![0u8; 1 << 20];
            go();
            let st = peer.receive_into(&mut big[..]);
            assert_eq!(st.count(u8::equivalent_datatype()), 16 << 10);
            assert!(big[..16 << 10] == bytes(16 << 10, 2)[..], "16 KiB eager");
            go();
            peer.receive_into(&mut big[..]);
            assert!(big == bytes(1 << 20, 3), "1 MiB rendezvous");
            go();
            let st = peer.receive_into(&mut b8[..]);
            assert_eq!((st.tag(), &b8[..]), (4, &bytes(8, 4)[..]), "synchronous");
            go();
            let e = peer
                .try_receive_into_with_tag(&mut b8[..], None)
                .unwrap_err();
            assert_eq!(e.class(), ErrorClass::Truncate, "100 bytes into 8");
            let mut first = [0u8; 8];
            metampi::request::scope(|s| {
                let r = peer.immediate_receive_into(s, &mut first[..]);
                go();
                peer.receive_into(&mut b8[..]);
                r.wait();
            });
            assert_eq!(
                first,
                bytes(8, 6)[..],
                "the earlier receive takes the first message"
            );
            assert_eq!(b8, bytes(8, 7)[..], "the blocking receive the second");
            go();
            let st = peer.receive_into_with_tag(&mut b8[..], 8);
            assert_eq!(
                (st.tag(), &b8[..]),
                (8, &bytes(8, 9)[..]),
                "tag 8 passes tag 7"
            );
            let st = peer.receive_into(&mut b8[..]);
            assert_eq!((st.tag(), &b8[..]), (7, &bytes(8, 8)[..]), "then tag 7");
            match metampi_testkit::spin_receives() {
                None => eprintln!("skipped the watching-path count: more ranks than cores here"),
                Some(n) => assert!(n > 0, "none of {k} small receives took the watching path"),
            }
        }
    });
}
