//! Heterogeneous data across meta hosts: site `b` declares big-endian data
//! on this little-endian machine, so typed point-to-point payloads between
//! `a` and `b` cross the routers in big-endian order and the receiver makes
//! them right. Values of every primitive width, a derived struct, a strided
//! vector type and the fallible/matched/nonblocking receive forms all arrive
//! intact; a `u32` received as raw bytes shows the order on the wire.

use metampi::datatype::{UserDatatype, View};
use metampi::testing::Ranks;
use metampi::topology::SimpleCommunicator;
use metampi::traits::*;

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
}

#[test]
fn typed_data_between_meta_hosts_of_different_byte_order() {
    Ranks::new(4).meta(CONFIG).run(
        "typed_data_between_meta_hosts_of_different_byte_order",
        exchange,
    );
}
