//! A rank that dies, panics or aborts ends the whole job quickly, and the
//! launcher names it.

use std::time::{Duration, Instant};

use metampi::traits::*;
use metampi_launch::JobFailure;
use metampi_testkit::{processes_of, Ranks};

fn expect_failure(
    n: usize,
    tcp: bool,
    name: &str,
    body: impl FnOnce(&metampi::topology::SimpleCommunicator),
) -> (JobFailure, Duration) {
    // The ranks' output is kept, not shown: a rank that panics on purpose would print a
    // failed test and a backtrace into the suite's log.
    let (f, took, _) = run_failing(Ranks::new(n).force_tcp(tcp).capture_tagged(), name, body);
    (f, took)
}

/// As [`expect_failure`] on `ranks`, with what the ranks printed on stdout and stderr
/// (when the ranks capture it).
fn run_failing(
    ranks: Ranks,
    name: &str,
    body: impl FnOnce(&metampi::topology::SimpleCommunicator),
) -> (JobFailure, Duration, String) {
    let t0 = Instant::now();
    let outcome = ranks.timeout(Duration::from_secs(60)).outcome(name, body);
    match outcome {
        None => std::process::exit(0), // in a rank that got this far: nothing to check
        Some(o) => {
            let out = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            (o.failure.expect("the job must fail"), t0.elapsed(), out)
        }
    }
}

fn killed_rank(world: &metampi::topology::SimpleCommunicator) {
    if world.rank() == 1 {
        world.process_at_rank(0).send(&1u8);
        std::thread::sleep(Duration::from_millis(100));
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        std::thread::sleep(Duration::from_secs(30));
    } else {
        // Everyone else blocks on a message that never comes.
        let _ = world.process_at_rank(1).receive::<u8>();
        let _ = world.any_process().receive::<u64>();
    }
}

#[test]
fn killed_rank_shm() {
    let (f, took) = expect_failure(4, false, "killed_rank_shm", killed_rank);
    assert!(
        matches!(f, JobFailure::Signaled { ref rank, signal: 9 } if rank.rank == 1),
        "{f}"
    );
    assert!(f.to_string().contains("rank 1"), "{f}");
    assert!(f.to_string().contains("SIGKILL"), "{f}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
}

#[test]
fn killed_rank_tcp() {
    let (f, took) = expect_failure(3, true, "killed_rank_tcp", killed_rank);
    assert!(f.to_string().contains("rank 1"), "{f}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
}

fn panicking_rank(world: &metampi::topology::SimpleCommunicator) {
    if world.rank() == 2 {
        panic!("deliberate panic in rank 2");
    }
    world.barrier();
    println!("rank {} passed the barrier", world.rank());
}

/// The panicking rank's finalization must not complete the others' barrier: they
/// never pass it, and the job ends naming the rank.
#[test]
fn panicking_rank_is_named() {
    let (f, took, out) = run_failing(
        Ranks::new(3).capture_tagged(),
        "panicking_rank_is_named",
        panicking_rank,
    );
    assert!(
        matches!(f, JobFailure::Exited { ref rank, .. } if rank.rank == 2),
        "{f}"
    );
    assert!(!out.contains("passed the barrier"), "{out}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
}

fn panicking_sender(world: &metampi::topology::SimpleCommunicator) {
    if world.rank() == 1 {
        panic!("deliberate panic in rank 1 before it sends");
    }
    let _ = world.process_at_rank(1).receive::<u64>();
}

/// Ranks waiting for a message from a rank that panics do not hold the job: the
/// panicking rank leaves without a finalization barrier, and the launcher ends
/// the job (before, its barrier waited for them and they for its message, until
/// the job's timeout).
#[test]
fn panic_beside_waiting_receivers_ends_the_job() {
    let (f, took) = expect_failure(
        3,
        false,
        "panic_beside_waiting_receivers_ends_the_job",
        panicking_sender,
    );
    assert!(
        matches!(f, JobFailure::Exited { ref rank, .. } if rank.rank == 1),
        "{f}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
}

fn aborting_rank(world: &metampi::topology::SimpleCommunicator) {
    if world.rank() == 0 {
        world.abort(7);
    }
    world.barrier();
}

#[test]
fn abort_ends_job_with_its_code() {
    let (f, _) = expect_failure(2, false, "abort_ends_job_with_its_code", aborting_rank);
    assert_eq!(f.exit_code(), 7, "{f}");
    assert!(f.to_string().contains("rank 0"), "{f}");
}

fn truncation_in_blocking_receive(world: &metampi::topology::SimpleCommunicator) {
    // The infallible API treats truncation as fatal, like rsmpi: the job ends
    // with a message that names the rank and the cause.
    if world.rank() == 0 {
        world.process_at_rank(1).send(&[1u32; 8][..]);
    } else {
        let mut small = [0u32; 2];
        world.process_at_rank(0).receive_into(&mut small[..]); // TRUNCATED HERE
    }
    world.barrier();
}

/// Said once (by the launcher, not again by the rank), naming the call, the program's line
/// that made it, the message's tag and sender, and the cause.
#[test]
fn fatal_truncation_names_rank_call_line_and_cause() {
    let (f, _, out) = run_failing(
        Ranks::new(2).capture_tagged(),
        "fatal_truncation_names_rank_call_line_and_cause",
        truncation_in_blocking_receive,
    );
    assert!(!out.contains("MPI_ERR_TRUNCATE"), "said twice:\n{out}");
    let text = f.to_string();
    assert!(text.contains("rank 1"), "{text}");
    assert!(
        text.contains("MPI_ERR_TRUNCATE in `receive_into`"),
        "{text}"
    );
    let line = include_str!("failures.rs")
        .lines()
        .position(|l| l.contains("// TRUNCATED HERE"))
        .unwrap()
        + 1;
    assert!(text.contains(&format!("failures.rs:{line}:")), "{text}");
    assert!(text.contains("(tag 0, from world rank 0)"), "{text}");
    assert!(text.contains("of 32 bytes"), "{text}");
}

const TWO_SITES: &str = "PORTBASE 24700\n\
     METAHOST a { LAUNCH = local; NPROCS = 2; NODES = a0; }\n\
     METAHOST b { LAUNCH = local; NPROCS = 2; NODES = b0; }\n\
     PAIR a b 1\na0 <-> b0\n";

fn killed_router(world: &metampi::topology::SimpleCommunicator) {
    // Every rank past start-up (its router connection authenticated) before
    // the router dies: a rank still connecting fails start-up instead, with
    // another message. Then one message across, so the routers are known to
    // carry traffic.
    world.barrier();
    if world.rank() == 0 {
        world.process_at_rank(2).send(&7u32);
        for pid in processes_of(
            "killed_router_ends_the_job",
            Some("METAMPI_ROUTER_SPEC=id=0;"),
        ) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    } else if world.rank() == 2 {
        let _ = world.process_at_rank(0).receive::<u32>();
    }
    // Then everyone waits for a message from the other site that never comes.
    let other = (world.rank() + 2) % 4;
    let _ = world.process_at_rank(other).receive::<u64>();
}

#[test]
fn killed_router_ends_the_job() {
    let t0 = Instant::now();
    let outcome = Ranks::new(4)
        .meta(TWO_SITES)
        .timeout(Duration::from_secs(60))
        .outcome("killed_router_ends_the_job", killed_router);
    let Some(o) = outcome else {
        std::process::exit(0);
    };
    let took = t0.elapsed();
    let f = o.failure.expect("the job must fail");
    let text = f.to_string();
    assert!(text.contains("router"), "{text}");
    assert!(text.contains("meta host(s) 1"), "{text}");
    assert!(took < Duration::from_secs(5), "took {took:?}: {text}");
    // Nothing of the job is left: ranks reaped by the launcher, routers by the harness.
    std::thread::sleep(Duration::from_millis(200));
    let left = processes_of("killed_router_ends_the_job", None);
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

fn link_goes_down(world: &metampi::topology::SimpleCommunicator) {
    // Traffic across the sites until the link dies, then a wait that only the
    // link timeout can end.
    let other = (world.rank() + 2) % 4;
    for i in 0..1000u32 {
        let (got, _) = metampi::point_to_point::send_receive::<u32, _, _, _>(
            &i,
            &world.process_at_rank(other),
            &world.process_at_rank(other),
        );
        assert_eq!(got, i);
    }
}

#[test]
fn link_down_past_its_timeout_ends_the_job() {
    let t0 = Instant::now();
    let faults = metampi_testkit::Faults {
        down_after: 40,
        seed: 7,
        ..Default::default()
    };
    let (ranks, _counts) = Ranks::new(4)
        .meta(&TWO_SITES.replace("24700", "24800"))
        .env("METAMPI_LINK_TIMEOUT", "2")
        .timeout(Duration::from_secs(60))
        .faulty_links(faults);
    let Some(o) = ranks.outcome("link_down_past_its_timeout_ends_the_job", link_goes_down) else {
        std::process::exit(0);
    };
    let took = t0.elapsed();
    let f = o.failure.expect("the job must fail");
    let text = f.to_string();
    assert!(text.contains("router"), "{text}");
    // The link timeout (2 s) plus detection, far below the job timeout.
    assert!(took < Duration::from_secs(15), "took {took:?}: {text}");
    let left = processes_of("link_down_past_its_timeout_ends_the_job", None);
    assert!(left.is_empty(), "processes left behind: {left:?}");
}
