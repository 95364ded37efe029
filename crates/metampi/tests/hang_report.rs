//! The hang report (`metampi run --stall-timeout`): a job in which nothing moves is ended,
//! and the reason names where each rank waits, a stopped rank among them; a job whose ranks
//! compute is left alone.

use std::time::{Duration, Instant};

use metampi::traits::*;
use metampi_launch::{JobFailure, JobOutcome};
use metampi_testkit::Ranks;

const STALL: Duration = Duration::from_secs(2);

/// Runs `body` on `n` ranks with the stall timeout; the outcome and how long it took, in the
/// test (the ranks exit here).
fn run(
    n: usize,
    name: &str,
    body: impl FnOnce(&metampi::topology::SimpleCommunicator),
) -> (JobOutcome, Duration) {
    let t0 = Instant::now();
    let ranks = Ranks::new(n)
        .stall_timeout(STALL)
        .timeout(Duration::from_secs(60));
    match ranks.outcome(name, body) {
        None => std::process::exit(0),
        Some(o) => (o, t0.elapsed()),
    }
}

/// The report's line for `rank`.
fn line(report: &str, rank: usize) -> &str {
    let head = format!("  rank {rank} (");
    report
        .lines()
        .find(|l| l.starts_with(&head))
        .unwrap_or_else(|| panic!("no line for rank {rank} in:\n{report}"))
}

fn stalled(outcome: &JobOutcome) -> String {
    match &outcome.failure {
        Some(f @ JobFailure::Stalled { report, .. }) => {
            assert_eq!(f.exit_code(), 124);
            report.clone()
        }
        other => panic!("the job must end as stalled, not {other:?}"),
    }
}

fn one_rank_stops(world: &metampi::topology::SimpleCommunicator) {
    world.barrier();
    match world.rank() {
        2 => {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-STOP", &pid])
                .status();
            std::thread::sleep(Duration::from_secs(60));
        }
        0 => {
            let _ = world.process_at_rank(2).receive_with_tag::<u32>(5);
        }
        _ => world.barrier(),
    }
}

#[test]
fn a_stopped_rank_is_named_and_the_others_waits_reported() {
    let (o, took) = run(
        3,
        "a_stopped_rank_is_named_and_the_others_waits_reported",
        one_rank_stops,
    );
    let report = stalled(&o);
    assert!(
        line(&report, 0).contains("a receive from rank 2, tag 5, on MPI_COMM_WORLD into 4 bytes"),
        "{report}"
    );
    assert!(
        line(&report, 1).contains("barrier on MPI_COMM_WORLD"),
        "{report}"
    );
    assert!(
        line(&report, 2).contains("its process is stopped"),
        "{report}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

fn deadlock(world: &metampi::topology::SimpleCommunicator) {
    let other = 1 - world.rank();
    let _ = world.process_at_rank(other).receive_with_tag::<u64>(7);
}

#[test]
fn a_deadlock_ends_the_job_with_both_waits_named() {
    let (o, took) = run(2, "a_deadlock_ends_the_job_with_both_waits_named", deadlock);
    let report = stalled(&o);
    assert!(
        line(&report, 0).contains("a receive from rank 1, tag 7"),
        "{report}"
    );
    assert!(
        line(&report, 1).contains("a receive from rank 0, tag 7"),
        "{report}"
    );
    let said = o
        .failure
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(said.contains("nothing in the job moved for 2 s"), "{said}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

fn one_rank_computes(world: &metampi::topology::SimpleCommunicator) {
    if world.rank() == 1 {
        // Longer than the stall timeout, in no MPI call: computing, not hanging.
        std::thread::sleep(STALL * 2);
        world.process_at_rank(0).send(&1u8);
    } else {
        let _ = world.process_at_rank(1).receive::<u8>();
    }
}

#[test]
fn ranks_that_compute_are_not_a_stall() {
    let (o, _) = run(2, "ranks_that_compute_are_not_a_stall", one_rank_computes);
    assert!(o.failure.is_none(), "{:?}", o.failure);
}

/// A receive that waits for a tag its peer did not send: the report shows what did come
/// from that peer (the message with the other tag waits unmatched).
#[test]
fn a_mismatched_tag_shows_what_came_instead() {
    let (o, _) = run(2, "a_mismatched_tag_shows_what_came_instead", |world| {
        if world.rank() == 1 {
            world.process_at_rank(0).send_with_tag(&7u32, 4);
            world.barrier();
        } else {
            let _ = world.process_at_rank(1).receive_with_tag::<u32>(3);
        }
    });
    let report = stalled(&o);
    let l = line(&report, 0);
    assert!(l.contains("a receive from rank 1, tag 3"), "{report}");
    assert!(
        l.contains("from rank 1 wait")
            && l.contains("unmatched here (Eager context 0 tag 4 4 bytes"),
        "{report}"
    );
}
