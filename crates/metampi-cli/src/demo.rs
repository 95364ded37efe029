//! `metampi demo`: a real multi-rank job on an embedded default.
//!
//! The launcher starts this same executable as every rank (hidden subcommand
//! `demo-rank`). By default 4 ranks are placed on 2 emulated machines, so the
//! job uses shared memory inside a machine and TCP between them.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use metampi::collective::SystemOperation;
use metampi::traits::*;
use metampi_launch::{AppSpec, Host, JobSpec, LaunchMethod, StdinTarget};

/// Options of `metampi demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Number of ranks.
    #[arg(short = 'n', long, default_value_t = 4)]
    ranks: usize,
    /// Emulated machines the ranks are spread over (1 = all shared memory).
    #[arg(long, default_value_t = 2)]
    machines: usize,
}

pub fn execute(args: DemoArgs) -> Result<u8> {
    if args.ranks < 2 {
        bail!("the demo needs at least 2 ranks (got {})", args.ranks);
    }
    if args.machines == 0 || args.machines > args.ranks {
        bail!("--machines must be between 1 and the number of ranks");
    }
    let exe = std::env::current_exe()?;
    let per = args.ranks.div_ceil(args.machines);
    let hosts: Vec<Host> = (0..args.machines)
        .map(|i| Host::new(format!("machine{i}"), per))
        .collect();
    println!(
        "metampi demo: {} ranks on {} emulated machine(s) of this computer (shared memory inside a machine, TCP between)",
        args.ranks, args.machines
    );
    let spec = JobSpec::new()
        .app(AppSpec::new(args.ranks, exe).arg("demo-rank"))
        .hosts(hosts)
        .launch(LaunchMethod::Local)
        .stdin(StdinTarget::None)
        .timeout(Duration::from_secs(300));
    let outcome = metampi_launch::run(&spec)?;
    if let Some(f) = &outcome.failure {
        eprintln!("metampi demo: {f}");
    }
    Ok(outcome.exit_code() as u8)
}

/// The body every rank runs.
pub fn rank_main() -> Result<u8> {
    let universe = metampi::initialize().expect("initialized once");
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let node = world.split_shared(0);

    // 1. A token travels around the ring, each rank adding its rank.
    let next = world.process_at_rank((rank + 1) % size);
    let prev = world.process_at_rank((rank + size - 1) % size);
    let token = if rank == 0 {
        next.send(&0i64);
        prev.receive::<i64>().0
    } else {
        let (t, _) = prev.receive::<i64>();
        next.send(&(t + rank as i64));
        0
    };

    // 2. Numerical integration of 4/(1+x²) over [0,1], split over the ranks.
    let steps = 10_000_000u64;
    let h = 1.0 / steps as f64;
    let local: f64 = (rank as u64..steps)
        .step_by(size as usize)
        .map(|i| 4.0 / (1.0 + ((i as f64 + 0.5) * h).powi(2)))
        .sum::<f64>()
        * h;
    let mut pi = 0.0f64;
    world.all_reduce_into(&local, &mut pi, SystemOperation::sum());

    // 3. Ping-pong between rank 0 and its machine neighbour and a remote rank.
    let local_peer = node
        .size()
        .gt(&1)
        .then(|| world.rank() ^ 1)
        .filter(|&p| p < size);
    let remote_peer =
        (0..size).find(|&r| world.meta_host_of(r).is_ok() && !same_node(&world, &node, r));
    let lat_local = pingpong(&world, local_peer.filter(|_| rank < 2).map(|_| (0, 1)));
    let lat_remote = pingpong(&world, remote_peer.map(|r| (0, r)));

    // 4. Everybody's host name, gathered at rank 0.
    let name = metampi::processor_name().unwrap_or_default();
    let mut nodes = vec![0i32; size as usize];
    world.all_gather_into(&node.size(), &mut nodes[..]);

    if rank == 0 {
        let expect: i64 = (1..size as i64).sum();
        println!("ring token      : {token} (expected {expect})");
        println!(
            "pi              : {pi:.12} (error {:.1e})",
            (pi - std::f64::consts::PI).abs()
        );
        println!("machine sizes   : {nodes:?} (processor {name})");
        if let Some(l) = lat_local {
            println!(
                "latency shm     : {l:.2} µs one-way (8 bytes, rank 0 <-> 1, median of 5 × 1000)"
            );
        }
        if let Some(l) = lat_remote {
            println!("latency tcp     : {l:.2} µs one-way (8 bytes, rank 0 <-> other machine, median of 5 × 1000)");
        }
        let ok = token == expect && (pi - std::f64::consts::PI).abs() < 1e-9;
        println!("{}", if ok { "demo: OK" } else { "demo: WRONG RESULT" });
        drop(universe);
        return Ok(if ok { 0 } else { 1 });
    }
    Ok(0)
}

fn same_node(
    world: &metampi::topology::SimpleCommunicator,
    node: &metampi::topology::SimpleCommunicator,
    r: i32,
) -> bool {
    let g = node.group();
    world.group().translate_rank(r, &g).is_some()
}

/// One-way latency between the pair (a, b) in µs, measured by `a`; every rank calls it.
fn pingpong(
    world: &metampi::topology::SimpleCommunicator,
    pair: Option<(i32, i32)>,
) -> Option<f64> {
    let mut p = [-1i32; 2];
    if let Some((a, b)) = pair {
        p = [a, b];
    }
    world.process_at_rank(0).broadcast_into(&mut p[..]);
    let (a, b) = (p[0], p[1]);
    if a < 0 || a == b {
        return None;
    }
    let me = world.rank();
    // A warm-up batch, then the median of five: the first round trips after
    // start-up can take milliseconds where ranks outnumber cores (the two
    // may share a core until the kernel moves one).
    let iters = 1000;
    let mut x = 0u64;
    let mut batches = Vec::new();
    for _ in 0..6 {
        let t0 = metampi::time();
        if me == a {
            let peer = world.process_at_rank(b);
            for _ in 0..iters {
                peer.send(&x);
                x = peer.receive::<u64>().0;
            }
        } else if me == b {
            let peer = world.process_at_rank(a);
            for _ in 0..iters {
                x = peer.receive::<u64>().0 + 1;
                peer.send(&x);
            }
        }
        batches.push((metampi::time() - t0) / iters as f64 / 2.0 * 1e6);
    }
    world.barrier();
    let mut timed = batches.split_off(1);
    timed.sort_by(f64::total_cmp);
    (me == a).then(|| timed[timed.len() / 2])
}
