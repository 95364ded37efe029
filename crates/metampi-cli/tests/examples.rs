//! The programs in the repository's `examples/` run as their README says, under
//! `metampi run`, and print what they promise (each also checks its own results and exits
//! non-zero where one is wrong).

mod common;

use std::path::PathBuf;
use std::process::Command;

/// An example's binary: cargo builds a package's examples for its tests, beside `deps/`.
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().expect("the test has a path");
    deps.parent()
        .and_then(|d| d.parent())
        .expect("target/PROFILE/deps")
        .join("examples")
        .join(name)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `metampi run ARGS`: exit status and stdout, the test failing with stderr shown.
fn run(args: &[&str], program: &PathBuf) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .arg("run")
        .args(["--timeout", "120"])
        .args(args)
        .arg(program)
        .current_dir(root())
        .output()
        .expect("metampi runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\n{stdout}\n{}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn hello_names_every_rank() {
    let out = run(&["-n", "3"], &example("hello"));
    for r in 0..3 {
        assert!(
            out.contains(&format!("hello from rank {r} of 3 on ")),
            "{out}"
        );
    }
}

#[test]
fn point_to_point_ring_and_reports() {
    let out = run(&["-n", "4"], &example("point_to_point"));
    assert!(out.contains("token went round 4 ranks: 6"), "{out}");
    assert!(out.contains("reports from 3 ranks"), "{out}");
}

#[test]
fn collectives_add_up() {
    let out = run(&["-n", "3"], &example("collectives"));
    assert!(out.contains("sum of 1..=1000000 = 500000500000"), "{out}");
    assert!(
        out.contains("scatter and all-to-all checked on 3 ranks"),
        "{out}"
    );
}

#[test]
fn derived_types_arrive_whole_and_in_place() {
    let out = run(&["-n", "2"], &example("derived_types"));
    assert!(out.contains("received 3 particles"), "{out}");
    assert!(
        out.contains("column 2 arrived in place: [2.0, 7.0, 12.0, 17.0]"),
        "{out}"
    );
}

#[test]
fn nonblocking_halo_and_futures() {
    let out = run(&["-n", "3"], &example("nonblocking"));
    assert!(
        out.contains("halo exchanged on 3 ranks (ghosts 2999 and 1000)"),
        "{out}"
    );
}

#[test]
fn threads_keep_to_their_tags() {
    let out = run(&["-n", "2"], &example("threads"));
    assert!(
        out.contains("4 threads exchanged 100 messages each"),
        "{out}"
    );
}

#[test]
fn sites_reduce_across_two_meta_hosts() {
    let out = run(&["--meta", "examples/two-sites.cfg"], &example("sites"));
    assert_eq!(out.lines().count(), 5, "{out}");
    assert!(
        out.contains("rank 4: site 1 of 2 (3 ranks there), site sum 9, world sum 10"),
        "{out}"
    );
    assert!(
        out.contains("rank 0: site 0 of 2 (2 ranks there), site sum 1, world sum 10"),
        "{out}"
    );
}

/// `examples/hello.c` built with MPICH's wrapper into a fresh folder, or `None` (skipped,
/// except under CI) where the wrapper or metampi's C library is missing.
fn hello_c(tag: &str) -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::temp_dir().join(format!("metampi-example-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = common::build_c(
        &dir,
        &root().join("examples/hello.c"),
        "hello_c",
        "C example",
    )?;
    Some((dir, exe))
}

#[test]
fn hello_in_c_on_the_c_library() {
    let Some((dir, exe)) = hello_c("c") else {
        return;
    };
    let out = run(&["-n", "3"], &exe);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.matches("ranks add up to 3").count(), 3, "{out}");
}

/// An installed `metampi` (no `mpi-abi/` beside it, no `METAMPI_ABI_DIR`) refuses a program
/// built against MPICH's ABI, naming the library and the setting, instead of letting it load
/// another MPI and start as separate worlds of one.
#[test]
fn a_c_program_without_metampis_c_library_is_refused() {
    let Some((dir, exe)) = hello_c("refused") else {
        return;
    };
    let installed = dir.join("metampi");
    std::fs::copy(env!("CARGO_BIN_EXE_metampi"), &installed).unwrap();
    let out = Command::new(&installed)
        .args(["run", "-n", "2"])
        .arg(&exe)
        .env_remove("METAMPI_ABI_DIR")
        .output()
        .expect("metampi runs");
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "ran:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains("libmpich.so.12") && err.contains("METAMPI_ABI_DIR"),
        "{err}"
    );
}
