//! MPI-IO from C (`crates/metampi-abi/src/io.rs`): `tests/c/io_suite.c`, built with MPICH's
//! `mpicc`, runs on metampi's MPICH-ABI library on 1 and 3 ranks with its files in a
//! temporary directory: offsets, views over a vector filetype, collective writes read back,
//! the shared file pointer, error classes and file error handlers.
//!
//! Needs `mpicc.mpich` (Debian's `libmpich-dev`) and the built library (`cargo build
//! --release`); where either is missing the test says so and passes, except under CI.

mod common;

use std::process::Command;

#[test]
fn c_io_suite_runs_on_one_and_three_ranks() {
    let dir = std::env::temp_dir().join(format!("metampi-c-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let Some(exe) = common::build_suite(&dir, "io_suite", "MPI-IO C test") else {
        return;
    };
    for n in [1usize, 3] {
        let files = dir.join(format!("files-{n}"));
        std::fs::create_dir_all(&files).expect("a directory for the suite's files");
        let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
            .args(["run", "--timeout", "120", "-n", &n.to_string()])
            .arg(&exe)
            .arg(&files)
            .output()
            .expect("metampi runs");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success(),
            "io suite failed on {n} ranks:\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains(&format!(", 0 failed, {n} ranks")),
            "no clean summary on {n} ranks:\n{stdout}\n{stderr}"
        );
        assert!(!stdout.contains("FAIL"), "{stdout}");
        // Files opened MPI_MODE_DELETE_ON_CLOSE, deleted ones and the shared pointers'
        // side files are all gone.
        let left: Vec<_> = std::fs::read_dir(&files)
            .expect("the files' directory")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "files left behind on {n} ranks: {left:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
