//! A rank that dies, panics or aborts ends the whole job quickly, and the
//! launcher names it.

use std::time::{Duration, Instant};

use metampi::testing::Ranks;
use metampi::traits::*;
use metampi_launch::JobFailure;

fn expect_failure(
    n: usize,
    tcp: bool,
    name: &str,
    body: impl FnOnce(&metampi::topology::SimpleCommunicator),
) -> (JobFailure, Duration) {
    let t0 = Instant::now();
    let outcome = Ranks::new(n)
        .force_tcp(tcp)
        .timeout(Duration::from_secs(60))
        .outcome(name, body);
    match outcome {
        None => std::process::exit(0), // in a rank that got this far: nothing to check
        Some(o) => (o.failure.expect("the job must fail"), t0.elapsed()),
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
}

#[test]
fn panicking_rank_is_named() {
    let (f, took) = expect_failure(3, false, "panicking_rank_is_named", panicking_rank);
    assert!(
        matches!(f, JobFailure::Exited { ref rank, .. } if rank.rank == 2),
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
        world.process_at_rank(0).receive_into(&mut small[..]);
    }
    world.barrier();
}

#[test]
fn fatal_truncation_names_rank_and_cause() {
    let (f, _) = expect_failure(
        2,
        false,
        "fatal_truncation_names_rank_and_cause",
        truncation_in_blocking_receive,
    );
    let text = f.to_string();
    assert!(text.contains("rank 1"), "{text}");
    assert!(text.contains("MPI_ERR_TRUNCATE"), "{text}");
}
