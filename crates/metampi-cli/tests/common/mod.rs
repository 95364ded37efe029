//! What the CLI's test files share: building `tests/c/<name>.c` with MPICH's `mpicc`
//! against metampi's built C library, skipping (except under CI) where either is missing, and
//! judging the output of the C suite and of `metampi demo-rank`.

// Each test file uses only some of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `tests/c/<name>.c` built into `dir`, or `None` (with the reason printed) to skip.
/// `what` names the test in the message CI fails with.
pub fn build_suite(dir: &Path, name: &str, what: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    build_c(dir, &src, name, what)
}

/// C source `src` built with MPICH's `mpicc` into `dir/name`, or `None` (with the reason
/// printed) to skip where the wrapper or metampi's C library is missing.
pub fn build_c(dir: &Path, src: &Path, name: &str, what: &str) -> Option<PathBuf> {
    let lib = Path::new(env!("CARGO_BIN_EXE_metampi"))
        .parent()?
        .join("mpi-abi/libmpi.so.12");
    if !lib.is_file() {
        skip(
            what,
            "metampi's C library is not built (cargo build --release -p metampi-abi)",
        );
        return None;
    }
    let exe = dir.join(name);
    match Command::new("mpicc.mpich")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-lm")
        .output()
    {
        Ok(o) if o.status.success() => Some(exe),
        Ok(o) => panic!("mpicc.mpich failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(_) => {
            skip(
                what,
                "mpicc.mpich is not installed (apt-get install libmpich-dev)",
            );
            None
        }
    }
}

/// A failure under CI (whose `.ci/run` installs what the test needs), a printed SKIP elsewhere.
pub fn skip(what: &str, why: &str) {
    let ci = std::env::var_os("CI").is_some_and(|v| v == "true");
    assert!(!ci, "CI must run the {what}: {why}");
    eprintln!("SKIP: {why}");
}

/// A C suite's run: exit code 0 and the summary line of `ranks` ranks with nothing failed.
pub fn assert_suite_ok(code: Option<i32>, stdout: &str, stderr: &str, ranks: usize) {
    assert_eq!(
        code,
        Some(0),
        "suite failed on {ranks} ranks:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!(", 0 failed, {ranks} ranks")),
        "no clean summary on {ranks} ranks:\n{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

/// A `metampi demo-rank` job of `ranks` ranks: success, the ring token, `demo: OK`.
pub fn assert_demo_ok(out: &Output, ranks: usize) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let token: usize = (1..ranks).sum();
    assert!(
        stdout.contains(&format!("ring token      : {token} (expected {token})")),
        "{stdout}"
    );
    assert!(stdout.contains("demo: OK"), "{stdout}");
}
