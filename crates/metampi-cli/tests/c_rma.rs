//! One-sided communication from C (`crates/metampi-abi/src/win.rs`): `tests/c/rma_suite.c`,
//! built with MPICH's `mpicc`, runs on metampi's MPICH-ABI library on 1 and 3 ranks: fence
//! epochs with puts, gets and accumulates (a strided target datatype among them), passive
//! target on a rank that sleeps without calling MPI, fetch-and-op and compare-and-swap
//! under lock_all, a post-start-complete-wait ring, a dynamic window, a shared-memory window
//! read through `MPI_Win_shared_query`, and errors through window error handlers.
//!
//! Needs `mpicc.mpich` (Debian's `libmpich-dev`) and the built library (`cargo build
//! --release`); where either is missing the test says so and passes, except under CI.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The suite built into `dir`, or `None` (with the reason printed) to skip.
fn build(dir: &Path) -> Option<PathBuf> {
    let lib = Path::new(env!("CARGO_BIN_EXE_metampi"))
        .parent()?
        .join("mpi-abi/libmpi.so.12");
    if !lib.is_file() {
        skip("metampi's C library is not built (cargo build --release -p metampi-abi)");
        return None;
    }
    let exe = dir.join("rma_suite");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/rma_suite.c");
    match Command::new("mpicc.mpich")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
    {
        Ok(o) if o.status.success() => Some(exe),
        Ok(o) => panic!("mpicc.mpich failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(_) => {
            skip("mpicc.mpich is not installed (apt-get install libmpich-dev)");
            None
        }
    }
}

/// A failure under CI (whose `.ci/run` installs what the test needs), a printed SKIP elsewhere.
fn skip(why: &str) {
    let ci = std::env::var_os("CI").is_some_and(|v| v == "true");
    assert!(!ci, "CI must run the one-sided C test: {why}");
    eprintln!("SKIP: {why}");
}

#[test]
fn c_rma_suite_runs_on_one_and_three_ranks() {
    let dir = std::env::temp_dir().join(format!("metampi-c-rma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let Some(exe) = build(&dir) else { return };
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
