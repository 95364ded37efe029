//! A failing rank, a killed rank, a timeout: the job stops promptly and says why.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::{captured, sh};
use metampi_launch::{run, JobFailure, KILL_GRACE, TIMEOUT_EXIT_CODE};

/// Far below the 30 s the surviving ranks would sleep, far above any plausible scheduling delay.
const PROMPT: Duration = Duration::from_secs(10);

#[test]
fn a_rank_exiting_with_3_stops_the_sleepers_and_is_named() {
    let start = Instant::now();
    let outcome = run(&captured(sh(
        4,
        "if [ \"$METAMPI_RANK\" = 2 ]; then exit 3; fi; sleep 30",
    )))
    .unwrap();
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    match &outcome.failure {
        Some(JobFailure::Exited { rank, code: 3 }) => {
            assert_eq!(rank.rank, 2);
            assert_eq!(rank.pid, outcome.ranks[2].id.pid);
            assert!(rank.pid > 1);
        }
        other => panic!("unexpected failure {other:?}"),
    }
    assert_eq!(outcome.exit_code(), 3);
    let message = outcome.failure.as_ref().unwrap().to_string();
    assert!(
        message.starts_with("rank 2 (pid ") && message.ends_with("exited with code 3"),
        "{message}"
    );
    for (rank, result) in outcome.ranks.iter().enumerate() {
        let status = result.status.expect("every rank reaped");
        if rank == 2 {
            assert_eq!(status.code(), Some(3));
        } else {
            assert_eq!(
                status.signal(),
                Some(libc::SIGTERM),
                "rank {rank}: {status:?}"
            );
        }
    }
}

#[test]
fn a_rank_killed_by_sigkill_is_reported_by_name() {
    let start = Instant::now();
    let outcome = run(&captured(sh(
        3,
        "if [ \"$METAMPI_RANK\" = 1 ]; then kill -KILL $$; fi; sleep 30",
    )))
    .unwrap();
    assert!(start.elapsed() < PROMPT);
    let failure = outcome.failure.clone().expect("failure");
    assert!(
        matches!(failure, JobFailure::Signaled { ref rank, signal: 9 } if rank.rank == 1),
        "{failure:?}"
    );
    assert!(
        failure
            .to_string()
            .ends_with("was killed by signal SIGKILL (9)"),
        "{failure}"
    );
    assert_eq!(outcome.exit_code(), 128 + 9);
}

#[test]
fn the_timeout_ends_a_job_with_124() {
    let start = Instant::now();
    let outcome = run(&captured(sh(2, "sleep 30")).timeout(Duration::from_millis(500))).unwrap();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < PROMPT,
        "took {took:?}"
    );
    assert_eq!(
        outcome.failure,
        Some(JobFailure::Timeout {
            after: Duration::from_millis(500)
        })
    );
    assert_eq!(outcome.exit_code(), TIMEOUT_EXIT_CODE);
}

#[test]
fn a_rank_ignoring_sigterm_is_killed_after_the_grace_period() {
    let start = Instant::now();
    // Rank 0 fails only once rank 1 has had time to ignore SIGTERM (a loaded
    // machine may otherwise deliver the signal before the trap is set).
    let script = "if [ \"$METAMPI_RANK\" = 0 ]; then sleep 0.5; exit 1; fi; trap '' TERM; sleep 30";
    let outcome = run(&captured(sh(2, script))).unwrap();
    let took = start.elapsed();
    assert!(
        took >= KILL_GRACE && took < PROMPT + KILL_GRACE,
        "took {took:?}"
    );
    assert!(matches!(
        outcome.failure,
        Some(JobFailure::Exited { code: 1, .. })
    ));
    assert_eq!(outcome.ranks[1].id.rank, 1);
    assert_eq!(
        outcome.ranks[1].status.unwrap().signal(),
        Some(libc::SIGKILL)
    );
}

#[test]
fn background_children_of_a_failed_rank_are_killed_too() {
    // The rank's own process exits at once but leaves a child holding its stdout; the launcher
    // signals whole process groups, so the child dies and the output stream closes.
    let start = Instant::now();
    let outcome = run(&captured(sh(
        2,
        "sleep 30 & if [ \"$METAMPI_RANK\" = 1 ]; then exit 4; fi; wait",
    )))
    .unwrap();
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    assert_eq!(outcome.exit_code(), 4);
}

#[test]
fn all_ranks_exiting_zero_is_success() {
    let outcome = run(&captured(sh(3, "exit 0"))).unwrap();
    assert!(outcome.success());
    assert_eq!(outcome.exit_code(), 0);
    assert!(outcome
        .ranks
        .iter()
        .all(|r| r.status.is_some_and(|s| s.success())));
}

/// A rank that dies before unlinking its shared-memory segment leaves it
/// behind (here the ranks just leave a file of that name); the launcher
/// removes it when the job ends, and nothing of another job's.
#[test]
fn segments_a_dead_job_left_are_swept() {
    let other = std::path::Path::new("/dev/shm").join(format!(
        "metampi-0000000000000000-sweep-test-{}",
        std::process::id()
    ));
    if std::fs::write(&other, b"x").is_err() {
        eprintln!("skipped: /dev/shm cannot be written here");
        return;
    }
    let script = "f=/dev/shm/metampi-$METAMPI_JOB-$METAMPI_RANK; : > $f && echo $f";
    let outcome = run(&captured(sh(2, script))).unwrap();
    let left: Vec<String> = outcome.stdout_text().lines().map(String::from).collect();
    assert_eq!(left.len(), 2, "{}", outcome.stderr_text());
    for f in &left {
        assert!(!std::path::Path::new(f).exists(), "{f} is still there");
    }
    assert!(other.exists(), "another job's file was removed");
    std::fs::remove_file(&other).unwrap();
}
