//! Heterogeneous data across meta hosts: site `b` declares big-endian data
//! on this little-endian machine, so typed point-to-point payloads between
//! `a` and `b` cross the routers in big-endian order and the receiver makes
//! them right. Values of every primitive width, a derived struct, a strided
//! vector type, every send form, the send-receive exchanges and the
//! fallible/matched/nonblocking receive forms all arrive intact; a `u32`
//! received as raw bytes shows the order on the wire.
//! Collectives convert the same way: every operation with every algorithm
//! across three meta hosts of mixed order against sequential references,
//! and a broadcast received as raw bytes shows the sender's declared order.

mod coll_common;

use coll_common::*;
use metampi::collective::{Collective, SystemOperation};
use metampi::datatype::{UserDatatype, View};
use metampi::topology::SimpleCommunicator;
use metampi::traits::*;
use metampi_testkit::Ranks;

const CONFIG: &str = "PORTBASE 23900\n\
     METAHOST a { LAUNCH = local; NPROCS = 2; NODES = a0; }\n\
     METAHOST b { LAUNCH = local; NPROCS = 2; NODES = b0; BYTEORDER = big; }\n\
     PAIR a b 1\na0 <-> b0\n";

#[derive(Equivalence, Clone, Copy, Debug, PartialEq, Default)]
struct Mixed {
    a: u8,
    b: i16,
    c: f64,
    d: [u32; 3],
    e: bool,
}

fn mixed(i: u32) -> Mixed {
    Mixed {
        a: i as u8,
        b: -(i as i16) * 300,
        c: i as f64 * 1.25e9,
        d: [i, i << 8, 0xdead_beef ^ i],
        e: i % 2 == 0,
    }
}

/// Rank 0 (site a, little-endian) and rank 2 (site b, declared big-endian)
/// exchange typed data both ways; ranks 1 and 3 check the same-site path.
fn exchange(world: &SimpleCommunicator) {
    let me = world.rank();
    let peer = match me {
        0 => 2,
        2 => 0,
        1 => 3,
        _ => 1,
    };
    let p = world.process_at_rank(peer);
    let ints: Vec<i64> = (0..100).map(|i| i * 0x0102_0304_0506 - 7).collect();
    let floats: Vec<f32> = (0..50).map(|i| i as f32 * 0.5 - 3.0).collect();
    let structs: Vec<Mixed> = (0..20).map(mixed).collect();
    let wide: [u128; 2] = [0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10, 5];
    let shorts: Vec<u16> = (0..9).map(|i| 0x0100 + i).collect();
    // Ranks with the lower number send first.
    let send = |tag| {
        p.send_with_tag(&ints[..], tag);
        p.send_with_tag(&floats[..], tag + 1);
        p.send_with_tag(&structs[..], tag + 2);
        p.send_with_tag(&wide[..], tag + 3);
        p.send_with_tag(&0xA1B2_C3D4u32, tag + 4);
        // Every other element of `shorts` through a strided datatype.
        let strided = UserDatatype::vector(5, 1, 2, &u16::equivalent_datatype());
        // SAFETY: 5 strided u16 values lie inside the 9-element vector.
        let v = unsafe { View::with_count_and_datatype(&shorts[..], 1, &strided) };
        p.send_with_tag(&v, tag + 5);
    };
    let recv = |tag| {
        let (got, _) = p.receive_vec_with_tag::<i64>(tag);
        assert_eq!(got, ints, "i64 vector");
        let mut f = vec![0f32; 50];
        p.receive_into_with_tag(&mut f[..], tag + 1);
        assert_eq!(f, floats, "f32 into a buffer");
        let (got, _) = p.receive_vec_with_tag::<Mixed>(tag + 2);
        assert_eq!(got, structs, "derived struct");
        let (w, _) = p.receive_vec_with_tag::<u128>(tag + 3);
        assert_eq!(w, wide, "u128 values");
        // The raw bytes show the order the value travelled in.
        let (raw, _) = p.receive_vec_with_tag::<u8>(tag + 4);
        let cross_site = (me < 2) != (peer < 2);
        let expect = if cross_site && me < 2 {
            0xA1B2_C3D4u32.to_be_bytes()
        } else {
            0xA1B2_C3D4u32.to_le_bytes()
        };
        assert_eq!(
            raw, expect,
            "u32 as bytes on the wire (cross site: {cross_site})"
        );
        let (s, _) = p.receive_vec_with_tag::<u16>(tag + 5);
        assert_eq!(s, vec![0x100, 0x102, 0x104, 0x106, 0x108], "strided u16");
    };
    if me < peer {
        send(10);
        recv(20);
    } else {
        recv(10);
        send(20);
    }
    // Nonblocking and matched receives convert too.
    if me == 0 {
        let got = p.immediate_receive_vec::<f64>().wait().unwrap().0;
        assert_eq!(got, vec![1.5, -2.25, 1e300]);
        let (msg, _) = p.matched_probe();
        let (v, _) = msg.matched_receive::<i32>();
        assert_eq!(v, -123_456);
    } else if me == 2 {
        p.send(&[1.5f64, -2.25, 1e300][..]);
        p.send(&-123_456i32);
    }
    // Every send form converts, both ways: values tagged with their form.
    let value = |k: u64, from: i32| 0x0102_0304_0506_0708u64 + k * 16 + from as u64;
    let send_forms = || {
        p.send_with_tag(&value(0, me), 30);
        p.synchronous_send_with_tag(&value(1, me), 31);
        let (v2, v3) = (value(2, me), value(3, me));
        metampi::request::scope(|s| {
            p.immediate_send_with_tag(s, &v2, 32).wait();
            p.immediate_synchronous_send_with_tag(s, &v3, 33).wait();
        });
        p.immediate_send_owned(vec![value(4, me)], 34)
            .wait()
            .unwrap();
        p.send_with_tag(&[value(5, me); 3][..], 35);
    };
    let recv_forms = || {
        for k in 0..5 {
            let (v, _) = p.receive_with_tag::<u64>(30 + k as i32);
            assert_eq!(v, value(k, peer), "send form {k}");
        }
        // A nonblocking receive into a buffer whose message already waits completes as
        // it starts: converted all the same.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut got = [0u64; 3];
        metampi::request::scope(|s| {
            p.immediate_receive_into_with_tag(s, &mut got[..], 35)
                .wait();
        });
        assert_eq!(
            got,
            [value(5, peer); 3],
            "immediate receive of a waiting message"
        );
    };
    if me < peer {
        send_forms();
        recv_forms();
    } else {
        recv_forms();
        send_forms();
    }
    // The exchanges: each side sends its value and gets the other's.
    let (v, _): (u64, _) = metampi::point_to_point::send_receive(&value(8, me), &p, &p);
    assert_eq!(v, value(8, peer), "send_receive");
    let mut v = value(6, me);
    metampi::point_to_point::send_receive_replace_into(&mut v, &p, &p);
    assert_eq!(v, value(6, peer), "send_receive_replace_into");
    let mut got = [0u64; 2];
    metampi::point_to_point::send_receive_into(&[value(7, me); 2][..], &p, &mut got[..], &p);
    assert_eq!(got, [value(7, peer); 2], "send_receive_into");
}

#[test]
fn typed_data_between_meta_hosts_of_different_byte_order() {
    Ranks::new(4).meta(CONFIG).run(
        "typed_data_between_meta_hosts_of_different_byte_order",
        exchange,
    );
}

/// Sites `a` and `c` little-endian, `b` (three ranks on two machines)
/// declared big-endian.
const MIXED: &str = "PORTBASE 24000\n\
     METAHOST a { LAUNCH = local; NPROCS = 2; NODES = a0; }\n\
     METAHOST b { LAUNCH = local; NPROCS = 3; NODES = b0, b1; BYTEORDER = big; }\n\
     METAHOST c { LAUNCH = local; NPROCS = 2; NODES = c0; BYTEORDER = little; }\n\
     PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n";

#[test]
fn collectives_between_meta_hosts_of_different_byte_order() {
    Ranks::new(7).meta(MIXED).run(
        "collectives_between_meta_hosts_of_different_byte_order",
        |world| {
            assert_eq!(world.num_meta_hosts(), 3);
            let lens = [0, 1, 7, 300];
            each_alg(Collective::Broadcast, |a| {
                check_bcast(world, 3, &format!("{a:?}"), &[1, 13, 3001])
            });
            each_alg(Collective::Reduce, |a| {
                check_reduce(world, 5, &format!("{a:?}"), &lens)
            });
            each_alg(Collective::AllReduce, |a| {
                check_all_reduce(world, 7, &format!("{a:?}"))
            });
            for (op, excl) in [(Collective::Scan, false), (Collective::ExclusiveScan, true)] {
                each_alg(op, |a| check_scan(world, 9, excl, &format!("{a:?}")));
            }
            each_alg(Collective::ReduceScatterBlock, |a| {
                check_reduce_scatter(world, 11, &[1, 5, 40], &format!("{a:?}"))
            });
            each_alg(Collective::AllGather, |a| {
                let how = format!("{a:?}");
                check_all_gather_varcount(world, 13, &how);
                let (n, me) = (world.size(), world.rank());
                let mine = mats(15, me, 3);
                let mut out = vec![Mat::default(); 3 * n as usize];
                world.all_gather_into(&mine[..], &mut out[..]);
                let want: Vec<Mat> = (0..n).flat_map(|r| mats(15, r, 3)).collect();
                assert_eq!(out, want, "allgather {how}");
            });
            each_alg(Collective::AllToAll, |a| {
                let (n, me) = (world.size(), world.rank());
                let send: Vec<f64> = (0..n).map(|to| me as f64 * 1e3 + to as f64 + 0.5).collect();
                let mut out = vec![0f64; n as usize];
                world.all_to_all_into(&send[..], &mut out[..]);
                let want: Vec<f64> = (0..n)
                    .map(|from| from as f64 * 1e3 + me as f64 + 0.5)
                    .collect();
                assert_eq!(out, want, "alltoall {a:?}");
            });
            each_alg(Collective::Gather, |a| {
                let (n, me) = (world.size(), world.rank());
                for root in 0..n {
                    let p = world.process_at_rank(root);
                    let mine = padded(17, me, 2);
                    if me == root {
                        let mut out = vec![Padded::default(); 2 * n as usize];
                        p.gather_into_root(&mine[..], &mut out[..]);
                        let want: Vec<Padded> = (0..n).flat_map(|r| padded(17, r, 2)).collect();
                        assert_eq!(out, want, "gather root {root} {a:?}");
                    } else {
                        p.gather_into(&mine[..]);
                    }
                }
            });
        },
    );
}

/// One rank per site: a broadcast's single message crosses once, so a
/// receiver that takes the `u32` as bytes sees the order it travelled in.
const PAIR: &str = "PORTBASE 24050\n\
     METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
     METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; BYTEORDER = big; }\n\
     PAIR a b 1\na0 <-> b0\n";

#[test]
fn collective_data_travels_in_the_senders_declared_order() {
    Ranks::new(2).meta(PAIR).run(
        "collective_data_travels_in_the_senders_declared_order",
        |world| {
            let me = world.rank();
            for root in 0..2 {
                let p = world.process_at_rank(root);
                if me == root {
                    let mut v = 0xA1B2_C3D4u32;
                    p.broadcast_into(&mut v);
                } else {
                    let mut raw = [0u8; 4];
                    p.broadcast_into(&mut raw[..]);
                    // Site b (rank 1) declares big-endian data.
                    let expect = if root == 1 {
                        0xA1B2_C3D4u32.to_be_bytes()
                    } else {
                        0xA1B2_C3D4u32.to_le_bytes()
                    };
                    assert_eq!(raw, expect, "bytes from rank {root}");
                }
            }
            // Typed on both ends, the values come out right either way.
            let mut sum = 0u64;
            world.all_reduce_into(
                &(0x0102_0304_0506_0708u64 + me as u64),
                &mut sum,
                SystemOperation::sum(),
            );
            assert_eq!(sum, 2 * 0x0102_0304_0506_0708u64 + 1);
        },
    );
}
