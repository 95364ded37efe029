//! SIGTERM to the launcher is forwarded and the job cleaned up. Alone in its test binary:
//! the signal goes to the whole test process.

mod common;

use std::time::{Duration, Instant};

use common::{captured, sh, TempDir};
use metampi_launch::{run, JobFailure};

#[test]
fn sigterm_to_the_launcher_stops_the_job() {
    let dir = TempDir::new("signal");
    let marker = dir.0.clone();
    let script = format!("touch {}/started.$METAMPI_RANK; sleep 30", marker.display());
    let job = std::thread::spawn(move || run(&captured(sh(2, &script))));

    // The handlers are in place before any rank starts, so once both markers exist the
    // signal is sure to be caught and forwarded.
    let wait_until = Instant::now() + Duration::from_secs(10);
    while !(marker.join("started.0").exists() && marker.join("started.1").exists()) {
        assert!(Instant::now() < wait_until, "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let start = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let outcome = job.join().unwrap().unwrap();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(
        outcome.failure,
        Some(JobFailure::Interrupted {
            signal: libc::SIGTERM
        })
    );
    assert_eq!(outcome.exit_code(), 128 + libc::SIGTERM);
}
