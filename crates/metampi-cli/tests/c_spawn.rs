//! Dynamic processes from C: `tests/c/spawn.c`, built with MPICH's `mpicc`, spawns copies of
//! itself through metampi's C library (`MPI_Comm_spawn`, `MPI_Comm_spawn_multiple`,
//! `MPI_Comm_get_parent`, `MPI_APPNUM`, the `wdir` and `env` info keys, a failed spawn) on
//! one machine, under MPICH's `mpiexec`, and from a world over two emulated sites; the same source built with
//! `mpicc_abi` does it on the standard-ABI library. `tests/c/ports.c` meets through ports
//! and published names: two halves of one job, two jobs started apart, `MPI_Comm_join`.
//! Skips as `c_abi.rs` does where MPICH's wrappers or the built library are missing (fails
//! under CI).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const WHAT: &str = "C spawn tests";

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("metampi-c-spawn-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `metampi run ARGS` in `dir`, published names kept in `dir/names`.
fn metampi(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metampi"));
    c.current_dir(dir)
        .env("METAMPI_NAME_DIR", dir.join("names"))
        .args(["run", "--timeout", "120"])
        .args(args);
    c
}

/// Asserts a clean exit and the program's verdict line `verdict`.
fn assert_ok(out: &std::process::Output, args: &[&str], verdict: &str) {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains(verdict),
        "{args:?}: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert!(!stderr.contains("not a metampi setting"), "{stderr}");
}

/// `metampi run ARGS` of `spawn.c` in `dir`: a clean exit, `parents` parents.
fn run_ok(dir: &Path, args: &[&str], parents: usize) {
    let out = metampi(dir, args).output().expect("metampi runs");
    assert_ok(&out, args, &format!("spawn: ok, {parents} parents"));
}

#[test]
fn a_c_program_spawns_children_on_one_machine() {
    let d = dir("one");
    let Some(exe) = common::build_suite(&d, "spawn", WHAT) else {
        return;
    };
    run_ok(&d, &["-n", "1", exe.to_str().unwrap()], 1);
    // A relative program name: the children find it although one of them runs in `/`.
    run_ok(&d, &["-n", "3", "./spawn"], 3);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_c_program_started_by_hydra_spawns_children() {
    // MPICH's launcher gives the job no secret: every parent must prove the root's to the
    // children, not one of its own.
    let d = dir("hydra");
    if common::build_suite(&d, "spawn", WHAT).is_none() {
        return;
    }
    let abi = Path::new(env!("CARGO_BIN_EXE_metampi"))
        .parent()
        .unwrap()
        .join("mpi-abi");
    let args = ["-n", "3", "./spawn"];
    let out = Command::new("mpiexec.mpich")
        .current_dir(&d)
        .args(args)
        .env("LD_LIBRARY_PATH", &abi)
        .output()
        .expect("mpiexec.mpich runs (installed with libmpich-dev)");
    assert_ok(&out, &args, "spawn: ok, 3 parents");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_c_world_over_two_sites_spawns_children() {
    let d = dir("sites");
    if common::build_suite(&d, "spawn", WHAT).is_none() {
        return;
    }
    let cfg = d.join("two.cfg");
    std::fs::write(
        &cfg,
        "PORTBASE 25300\n\
         METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
         METAHOST b { LAUNCH = local; NPROCS = 2; NODES = b0; }\n\
         PAIR a b 1\na0 <-> b0\n",
    )
    .unwrap();
    run_ok(&d, &["--meta", "two.cfg", "./spawn"], 3);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_standard_abi_program_spawns_children() {
    let lib = Path::new(env!("CARGO_BIN_EXE_metampi"))
        .parent()
        .unwrap()
        .join("mpi-abi/libmpi_abi.so.1");
    // The wheel's folder as .ci/fetch-mpich-wheel.sh leaves it (version as in c_abi.rs).
    let wheel = std::env::temp_dir().join("metampi-mpich-wheel-5.0.2/mpich-5.0.2.data/data");
    let cc = wheel.join("bin/mpicc_abi");
    if !lib.is_file() || !cc.is_file() {
        common::skip(
            WHAT,
            "the standard-ABI library or MPICH's mpicc_abi is missing \
             (cargo build --release; bash .ci/fetch-mpich-wheel.sh)",
        );
        return;
    }
    let d = dir("std");
    let exe = d.join("spawn_std");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/spawn.c");
    let o = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("mpicc_abi runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    run_ok(&d, &["-n", "2", "./spawn_std"], 2);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn two_halves_of_a_job_meet_through_a_published_port_and_a_socket() {
    let d = dir("ports");
    if common::build_suite(&d, "ports", WHAT).is_none() {
        return;
    }
    for n in ["2", "3"] {
        let args = ["-n", n, "./ports", "split"];
        assert_ok(&metampi(&d, &args).output().unwrap(), &args, "ports: ok");
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn two_jobs_started_apart_meet_through_a_published_name() {
    let d = dir("jobs");
    if common::build_suite(&d, "ports", WHAT).is_none() {
        return;
    }
    let server_args = ["-n", "2", "./ports", "server", "metampi-test-service"];
    let server = metampi(&d, &server_args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("metampi runs");
    // The client looks the name up until the server has published it.
    let client_args = ["-n", "3", "./ports", "client", "metampi-test-service"];
    let client = metampi(&d, &client_args).output().unwrap();
    let server = server.wait_with_output().unwrap();
    assert_ok(&client, &client_args, "client: ok");
    assert_ok(&server, &server_args, "server: ok");
    // The server withdrew its name.
    let left: Vec<_> = std::fs::read_dir(d.join("names")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&d);
}
