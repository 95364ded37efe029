//! Vertical traffic over shared memory: ranks on their router's node reach it
//! through pipes in a shared segment, ranks on other nodes through TCP, and
//! both carry every message intact and in order, however small the pipes.

use std::sync::Mutex;
use std::time::Duration;

use metampi::traits::*;
use metampi_testkit::{link_stats, stats_number as number, Ranks, StatsDir};

/// Jobs of this file run one at a time (six ranks and two routers each).
static JOBS: Mutex<()> = Mutex::new(());

/// Site a: two nodes of two ranks, its router on a0; site b: one node of two.
fn config(portbase: u16) -> String {
    format!(
        "PORTBASE {portbase}\n\
         METAHOST a {{ LAUNCH = local; NPROCS = 4; NODES = a0, a1; }}\n\
         METAHOST b {{ LAUNCH = local; NPROCS = 2; NODES = b0; }}\n\
         PAIR a b 1\na0 <-> b0\n"
    )
}

/// Message `i` from `src` to `dst`: sizes from empty to 3 MiB, bytes that
/// tell where they belong.
fn message(src: usize, dst: usize, i: usize) -> Vec<u8> {
    const SIZES: [usize; 7] = [0, 1, 63, 4000, 70_000, 600_000, 3 << 20];
    let len = SIZES[i % SIZES.len()];
    (0..len)
        .map(|k| (src * 31 + dst * 7 + i * 13 + k) as u8)
        .collect()
}

/// Every rank sends a numbered mix of sizes to every rank of the other site
/// and checks what it receives from each, in order; then the routers'
/// statistics say how many ranks each serves through pipes.
fn exchange(world: &metampi::topology::SimpleCommunicator) {
    const COUNT: usize = 21;
    let me = world.rank() as usize;
    let others: Vec<usize> = if me < 4 { vec![4, 5] } else { vec![0, 1, 2, 3] };
    let mut sends = Vec::new();
    for i in 0..COUNT {
        for &o in &others {
            sends.push(
                world
                    .process_at_rank(o as i32)
                    .immediate_send_owned(message(me, o, i), i as i32),
            );
        }
    }
    for i in 0..COUNT {
        for &o in &others {
            let (m, st) = world.process_at_rank(o as i32).receive_vec::<u8>();
            assert_eq!(st.tag(), i as i32, "from {o}: out of order");
            assert!(m == message(o, me, i), "message {i} from {o} damaged");
        }
    }
    for s in sends {
        s.wait().expect("send completes");
    }
    world.barrier();
}

/// Runs [`exchange`] on 6 ranks with `env` for the ranks; then rank 0
/// checks, while every rank is still connected, that router `r` serves
/// `want[r]` ranks (all, through pipes) and whether it lent long messages
/// to the ranks on its node (`sys::vchan`'s loans) rather than copying them.
fn run(test: &str, portbase: u16, env: &[(&str, &str)], want: [(u64, u64, bool); 2]) {
    run_checked(test, portbase, env, want, false);
}

/// [`run`], and with `in_order` also checks that no link resent a frame:
/// TCP loses nothing here, so a resend means a router wrote a link's frames
/// out of order (the receiving end asks again for the ones it skipped).
fn run_checked(
    test: &str,
    portbase: u16,
    env: &[(&str, &str)],
    want: [(u64, u64, bool); 2],
    in_order: bool,
) {
    let _g = JOBS.lock().unwrap_or_else(|p| p.into_inner());
    let dir = StatsDir::new(test);
    let mut ranks = Ranks::new(6)
        .meta(&config(portbase))
        .router_stats(&dir)
        .timeout(Duration::from_secs(120));
    for (k, v) in env {
        ranks = ranks.env(*k, *v);
    }
    let d = dir.path();
    // Incoming links are read by threads of their own only where asked for.
    let readers = env.contains(&("METAMPI_ROUTER_READER", "1"));
    let outcome = ranks.outcome(test, move |world| {
        exchange(world);
        if world.rank() == 0 {
            // Statistics are rewritten twice a second.
            std::thread::sleep(Duration::from_millis(1200));
            for (r, (all, pipes, lends)) in want.iter().enumerate() {
                let text =
                    std::fs::read_to_string(d.join(format!("router-{r}.json"))).unwrap_or_default();
                assert_eq!(number(&text, "ranks"), Some(*all), "router {r}: {text}");
                assert_eq!(
                    number(&text, "pipe_ranks"),
                    Some(*pipes),
                    "router {r}: {text}"
                );
                let loans = number(&text, "loans").unwrap_or(0);
                assert_eq!(loans > 0, *lends, "router {r}'s loans: {text}");
            }
            for (name, text) in link_stats(d, "in") {
                let chunks = number(&text, "reader_chunks_in").unwrap_or(0);
                assert_eq!(chunks > 0, readers, "{name}: {text}");
            }
            if in_order {
                for (name, text) in link_stats(d, "out") {
                    assert_eq!(number(&text, "retransmits"), Some(0), "{name}: {text}");
                }
            }
        }
        world.barrier();
    });
    let Some(outcome) = outcome else {
        return; // a rank or a router of the job
    };
    if let Some(f) = &outcome.failure {
        panic!("{test} failed: {f}");
    }
}

/// Router 0 (a -> b, on a0) serves ranks 0-3, of which 0 and 1 share its
/// node; router 1 (b -> a, on b0) serves ranks 4 and 5, both on b0.
#[test]
fn ranks_on_the_router_node_use_pipes() {
    run(
        "ranks_on_the_router_node_use_pipes",
        24300,
        &[],
        [(4, 2, true), (2, 2, true)],
    );
}

/// Ranks that refuse loans get every byte copied into their pipes.
#[test]
fn loans_can_be_turned_off() {
    run(
        "loans_can_be_turned_off",
        24340,
        &[("METAMPI_NO_ROUTER_LOANS", "1")],
        [(4, 2, false), (2, 2, false)],
    );
}

#[test]
fn pipes_can_be_turned_off() {
    run(
        "pipes_can_be_turned_off",
        24310,
        &[("METAMPI_NO_ROUTER_SHM", "1")],
        [(4, 0, false), (2, 0, false)],
    );
}

/// Pipes of 4 KiB: every large message fills them many times over, in both
/// directions, so both sides keep waiting for room and waking each other.
#[test]
fn tiny_pipes_carry_everything() {
    run(
        "tiny_pipes_carry_everything",
        24320,
        &[("METAMPI_ROUTER_PIPE", "4096"), ("METAMPI_SPIN_US", "0")],
        [(4, 2, true), (2, 2, true)],
    );
}

/// Link reader threads forced on (off unless asked for): the incoming links'
/// sockets are read by threads that hand whole frames to the router's loop,
/// which decodes them where they lie. Every message still arrives intact and
/// in order, and the links' statistics show the chunks handed over.
#[test]
fn link_reader_threads_keep_every_message_in_order() {
    run_checked(
        "link_reader_threads_keep_every_message_in_order",
        24350,
        &[("METAMPI_ROUTER_READER", "1")],
        [(4, 2, true), (2, 2, true)],
        true,
    );
}

/// Reader and writer threads together, with pipes of 4 KiB.
#[test]
fn link_reader_and_writer_threads_together() {
    run_checked(
        "link_reader_and_writer_threads_together",
        24360,
        &[
            ("METAMPI_ROUTER_READER", "1"),
            ("METAMPI_ROUTER_WRITER", "1"),
            ("METAMPI_ROUTER_PIPE", "4096"),
        ],
        [(4, 2, true), (2, 2, true)],
        true,
    );
}

/// Link writer threads forced on (they start on their own only on machines
/// of four cores or more): frames of 32 KiB and more are written by a thread,
/// smaller ones by the router's loop unless the thread has frames queued, and
/// the thread reads the acknowledgements while it writes. Every message still
/// arrives intact and in order.
#[test]
fn link_writer_threads_keep_every_message_in_order() {
    run_checked(
        "link_writer_threads_keep_every_message_in_order",
        24330,
        &[("METAMPI_ROUTER_WRITER", "1")],
        [(4, 2, true), (2, 2, true)],
        true,
    );
}

/// `METAMPI_EAGER_LIMIT` above the largest frame a router takes (1 MiB): the routed limit
/// is capped, so a routed message of 1.5 MiB goes by rendezvous and arrives. Before the
/// tuning rules the eager frame reached the router, which closed the rank's connection.
#[test]
fn an_eager_limit_above_a_routers_frame_is_capped() {
    const TEST: &str = "an_eager_limit_above_a_routers_frame_is_capped";
    const LEN: usize = 1_500_000;
    let _g = JOBS.lock().unwrap_or_else(|p| p.into_inner());
    Ranks::new(6)
        .meta(&config(24370))
        .env("METAMPI_EAGER_LIMIT", "2097152")
        .timeout(Duration::from_secs(60))
        .run(TEST, |world| {
            let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
            match world.rank() {
                0 => world.process_at_rank(4).send(&data[..]),
                4 => {
                    let (got, _) = world.process_at_rank(0).receive_vec::<u8>();
                    assert!(got == data, "the routed message arrived damaged");
                }
                _ => {}
            }
            world.barrier();
        });
}
