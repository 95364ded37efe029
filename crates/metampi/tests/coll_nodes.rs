//! Hierarchical collectives across machines of one meta host: ranks on
//! emulated machines of uneven size (`Ranks::nodes`; ranks of one machine
//! use shared memory, machines talk TCP). Barrier, broadcast, reduce and
//! all-reduce go hierarchical automatically (machine, machine leaders,
//! machine); gather, scatter, all-gather and all-to-all when forced. Each is
//! checked against a sequential reference on random data for every root, on
//! the world and on communicators made by split: one that keeps every
//! machine's ranks consecutive, one that interleaves them (where a
//! non-commutative reduction must fall back to a flat algorithm) and one
//! that takes half of each machine.

mod coll_common;

use coll_common::*;
use metampi::topology::{Color, SimpleCommunicator};
use metampi::traits::*;
use metampi_testkit::Ranks;

fn splits_and_battery(world: &SimpleCommunicator, seed: u64) {
    auto_and_forced(|how| battery(world, seed, how));
    let n = world.size();
    // Machines keep consecutive ranks: world order reversed.
    let rev = world
        .split_by_color_with_key(Color::with_value(0), -world.rank())
        .expect("every rank has a colour");
    auto_and_forced(|how| battery(&rev, seed + 10, how));
    // Machines interleaved: a rotation by one rank splits the first machine.
    let mixed = world
        .split_by_color_with_key(Color::with_value(0), (world.rank() * 5 + 1) % n)
        .expect("every rank has a colour");
    auto_and_forced(|how| battery(&mixed, seed + 20, how));
    // Half of every machine.
    let half = world
        .split_by_color(Color::with_value(world.rank() % 2))
        .expect("every rank has a colour");
    auto_and_forced(|how| battery(&half, seed + 30, how));
    world.barrier();
}

#[test]
fn machines_3_1_4() {
    Ranks::new(8)
        .nodes(&[("m0", 3), ("m1", 1), ("m2", 4)])
        .run("machines_3_1_4", |world| {
            assert_eq!(world.num_nodes(), 3);
            splits_and_battery(world, 61);
        });
}

#[test]
fn machines_2_3() {
    Ranks::new(5)
        .nodes(&[("m0", 2), ("m1", 3)])
        .run("machines_2_3", |world| {
            assert_eq!(world.num_nodes(), 2);
            splits_and_battery(world, 71);
        });
}

fn battery(c: &SimpleCommunicator, seed: u64, how: &str) {
    check_barrier(c, how);
    check_bcast(c, seed, how, &[0, 1, 13, 9000]);
    check_reduce(c, seed + 1, how, &[0, 1, 2000]);
    check_all_reduce(c, seed + 2, how);
    gather_scatter(c, seed + 3, how);
    all_to_all(c, seed + 4, how);
}

fn gather_scatter(c: &SimpleCommunicator, seed: u64, how: &str) {
    let (n, me) = (c.size(), c.rank());
    check_gather_scatter(c, seed, how, &[0, 7, 1500]);
    for len in [0usize, 11, 4000] {
        let mine = ints(seed, me, len);
        let want: Vec<i64> = (0..n).flat_map(|r| ints(seed, r, len)).collect();
        let mut out = vec![0; len * n as usize];
        c.all_gather_into(&mine[..], &mut out[..]);
        assert!(out == want, "allgather len {len} {how}");
    }
}

/// Block `to` of rank `from`'s all-to-all send buffer.
fn block(seed: u64, from: i32, to: i32, len: usize) -> Vec<i64> {
    ints(seed + 1000 * to as u64, from, len)
}

fn all_to_all(c: &SimpleCommunicator, seed: u64, how: &str) {
    let (n, me) = (c.size(), c.rank());
    for len in [0usize, 1, 5, 700] {
        let send: Vec<i64> = (0..n).flat_map(|to| block(seed, me, to, len)).collect();
        let want: Vec<i64> = (0..n).flat_map(|from| block(seed, from, me, len)).collect();
        let mut out = vec![-1; len * n as usize];
        c.all_to_all_into(&send[..], &mut out[..]);
        assert!(out == want, "alltoall len {len} {how}");
    }
    // Padded elements: packed send and receive buffers.
    let send: Vec<Padded> = (0..n)
        .flat_map(|to| padded(seed + to as u64, me, 3))
        .collect();
    let want: Vec<Padded> = (0..n)
        .flat_map(|from| padded(seed + me as u64, from, 3))
        .collect();
    let mut out = vec![Padded::default(); 3 * n as usize];
    c.all_to_all_into(&send[..], &mut out[..]);
    assert_eq!(out, want, "alltoall padded {how}");
}
