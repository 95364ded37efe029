//! The key-value bootstrap across real rank processes: the ranks are this very test
//! executable, re-run with a filter that selects one `rank_*` function, the way the rank-side
//! library's test helper starts multi-rank tests. Run normally (no `METAMPI_RANK`), the
//! `rank_*` functions do nothing.

mod common;

use std::time::{Duration, Instant};

use metampi_launch::{run, AppSpec, JobFailure, JobSpec, OutputMode, PmiClient, StdinTarget};

/// A job of `n` copies of this test executable running only the test `name`.
fn ranks_running(n: usize, name: &str) -> JobSpec {
    let exe = std::env::current_exe().unwrap();
    JobSpec::new()
        .app(AppSpec::new(n, exe).args([name, "--exact", "--nocapture", "--test-threads=1"]))
        .stdin(StdinTarget::None)
        .output(OutputMode::Capture)
        .timeout(Duration::from_secs(30))
}

fn my_rank() -> Option<(usize, usize)> {
    let rank = std::env::var("METAMPI_RANK").ok()?.parse().ok()?;
    let size = std::env::var("METAMPI_SIZE").ok()?.parse().ok()?;
    Some((rank, size))
}

#[test]
fn rank_exchange() {
    let Some((rank, size)) = my_rank() else {
        return;
    };
    let mut pmi = PmiClient::from_env().unwrap();
    for round in 0..3 {
        pmi.put(
            &format!("card-{round}-{rank}"),
            &format!("tcp://10.0.0.{rank}:{}", 5000 + round),
        )
        .unwrap();
        pmi.fence().unwrap();
        for peer in 0..size {
            let value = pmi.get(&format!("card-{round}-{peer}")).unwrap();
            assert_eq!(value, Some(format!("tcp://10.0.0.{peer}:{}", 5000 + round)));
        }
    }
    assert_eq!(pmi.get("never-put").unwrap(), None);
    // A raw garbage line is refused without harm to the connection.
    assert!(pmi.request("PUT only-a-key").unwrap().starts_with("ERR "));
    pmi.fence().unwrap();
    pmi.finalize().unwrap();
    println!("rank {rank} exchanged");
}

#[test]
fn pmi_exchange_and_fences_across_processes() {
    let outcome = run(&ranks_running(4, "rank_exchange")).unwrap();
    assert!(
        outcome.success(),
        "{:?}\n{}\n{}",
        outcome.failure,
        outcome.stdout_text(),
        outcome.stderr_text()
    );
    for rank in 0..4 {
        assert!(outcome
            .stdout_text()
            .contains(&format!("rank {rank} exchanged")));
    }
}

#[test]
fn rank_abort() {
    let Some((rank, _)) = my_rank() else { return };
    let mut pmi = PmiClient::from_env().unwrap();
    if rank == 1 {
        pmi.abort(7, "input file is corrupt").unwrap();
        // Wait to be killed, as MPI_Abort would.
        std::thread::sleep(Duration::from_secs(30));
    } else {
        // Never completes: rank 1 will not join the fence.
        let _ = pmi.fence();
        std::thread::sleep(Duration::from_secs(30));
    }
}

#[test]
fn abort_from_one_rank_ends_the_job_with_its_code() {
    let start = Instant::now();
    let outcome = run(&ranks_running(3, "rank_abort")).unwrap();
    assert!(start.elapsed() < Duration::from_secs(20));
    match &outcome.failure {
        Some(JobFailure::Aborted {
            rank,
            code: 7,
            message,
        }) => {
            assert_eq!(rank.rank, 1);
            assert_eq!(message, "input file is corrupt");
        }
        other => panic!("unexpected failure {other:?}\n{}", outcome.stderr_text()),
    }
    assert_eq!(outcome.exit_code(), 7);
    let line = outcome.failure.unwrap().to_string();
    assert!(
        line.starts_with("rank 1 (pid ")
            && line.ends_with("called abort with code 7: input file is corrupt"),
        "{line}"
    );
}

#[test]
fn rank_forgets_finalize() {
    let Some(_) = my_rank() else { return };
    let mut pmi = PmiClient::from_env().unwrap();
    pmi.put("k", "v").unwrap();
    // Returns (exit 0) without FINALIZE.
}

#[test]
fn exiting_after_hello_without_finalize_is_a_failure() {
    let outcome = run(&ranks_running(1, "rank_forgets_finalize")).unwrap();
    assert!(
        matches!(&outcome.failure, Some(JobFailure::NoFinalize { rank }) if rank.rank == 0),
        "{:?}",
        outcome.failure
    );
    assert_eq!(outcome.exit_code(), 1);
}

#[test]
fn rank_panics() {
    let Some((rank, _)) = my_rank() else { return };
    if rank == 0 {
        panic!("rank 0 gives up");
    }
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn a_panicking_rank_fails_the_job_with_the_test_harness_code() {
    let outcome = run(&ranks_running(2, "rank_panics")).unwrap();
    assert!(
        matches!(&outcome.failure, Some(JobFailure::Exited { rank, code: 101 }) if rank.rank == 0),
        "{:?}",
        outcome.failure
    );
    assert!(
        outcome.stderr_text().contains("rank 0 gives up")
            || outcome.stdout_text().contains("rank 0 gives up")
    );
}
