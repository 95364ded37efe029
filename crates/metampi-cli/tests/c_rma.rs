//! One-sided communication from C (`crates/metampi-abi/src/win.rs`): `tests/c/rma_suite.c`,
//! built with MPICH's `mpicc`, runs on metampi's MPICH-ABI library on 1 and 3 ranks: fence
//! epochs with puts, gets and accumulates (a strided target datatype among them), passive
//! target on a rank that sleeps without calling MPI, fetch-and-op and compare-and-swap
//! under lock_all, a post-start-complete-wait ring, a dynamic window, a shared-memory window
//! read through `MPI_Win_shared_query`, and errors through window error handlers.
//!
//! Needs `mpicc.mpich` (Debian's `libmpich-dev`) and the built library (`cargo build
//! --release`); where either is missing the test says so and passes, except under CI.

mod common;

use std::process::Command;

#[test]
fn c_rma_suite_runs_on_one_and_three_ranks() {
    let dir = std::env::temp_dir().join(format!("metampi-c-rma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let Some(exe) = common::build_suite(&dir, "rma_suite", "one-sided C test") else {
        return;
    };
    for n in [1usize, 3] {
        let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
            .args(["run", "--timeout", "120", "-n", &n.to_string()])
            .arg(&exe)
            .output()
            .expect("metampi runs");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success(),
            "rma suite failed on {n} ranks:\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains(&format!(", 0 failed, {n} ranks")),
            "no clean summary on {n} ranks:\n{stdout}\n{stderr}"
        );
        assert!(!stdout.contains("FAIL"), "{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
