//! Ranks started by another process manager join one world through its PMI server
//! (`metampi_launch::pmi_wire`): MPICH's Hydra (`mpiexec.mpich`, Debian's `mpich`, which
//! `.ci/run` installs) over PMI-2 and PMI-1, through the socket it hands over (`PMI_FD`) and
//! through a port (`-pmi-port`). Each rank checks the world's size and its rank against
//! Hydra's, reaches the ranks of its machine over shared memory, and runs a collective and a
//! point-to-point ring. Where `mpiexec.mpich` is missing the tests say so and pass, except
//! under CI, where they fail.
//!
//! The same ranks under Slurm (`srun --mpi=pmi2`): the test starts its own `slurmctld` and
//! `slurmd` (Debian's `slurm-wlm` and `munge`, one node declaring 8 CPUs, private ports and
//! directories) and stops them afterwards; where they are not installed or cannot start
//! (not root, no munge key), it says so and passes.

use std::process::Command;
use std::time::{Duration, Instant};

use metampi::traits::*;
use metampi_testkit::slurm::Slurm;

/// Set in the ranks this test starts.
const CHILD: &str = "METAMPI_TEST_PM_CHILD";
/// What the ranks do: `world`, `abort` or `crash`.
const ROLE: &str = "METAMPI_TEST_PM_ROLE";

const HYDRA: &str = "mpiexec.mpich";

fn hydra_present() -> bool {
    let found = Command::new(HYDRA)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        let ci = metampi::knobs::os("CI").is_some_and(|v| v == "true");
        assert!(
            !ci,
            "CI must run the Hydra tests: {HYDRA} is missing (apt-get install mpich)"
        );
        eprintln!("SKIP: {HYDRA} is not installed (apt-get install mpich)");
    }
    found
}

/// Exit code, stdout and stderr of a finished job.
fn status_and_output(out: &std::process::Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Ends the process manager's command `c` with this test binary's `child` as the program,
/// with `env` set.
fn run_child(c: &mut Command, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().expect("the test binary");
    c.arg(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env_remove("METAMPI_PMI");
    for (k, v) in env {
        c.env(k, v);
    }
}

/// Runs `n` ranks of this test binary's `child` under Hydra with `hydra_args` and `env`;
/// exit status, stdout and stderr.
fn hydra(n: usize, hydra_args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut c = Command::new(HYDRA);
    c.args(hydra_args).args(["-n", &n.to_string()]);
    run_child(&mut c, env);
    let start = Instant::now();
    let out = c.output().expect("mpiexec runs");
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "the job took {:?}",
        start.elapsed()
    );
    status_and_output(&out)
}

#[test]
fn child() {
    if metampi::knobs::os(CHILD).is_none() {
        return;
    }
    let universe = metampi::initialize().expect("initialized once");
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let pmi_rank: i32 = metampi::knobs::text("PMI_RANK").map_or(-1, |r| r.parse().unwrap());
    if pmi_rank >= 0 {
        assert_eq!(rank, pmi_rank, "the rank is Hydra's");
    }
    if metampi::knobs::text(ROLE).as_deref() == Some("crash") {
        if rank == 1 {
            std::process::exit(3);
        }
        let _ = world.process_at_rank(1).receive::<u64>();
        return;
    }
    if metampi::knobs::text(ROLE).as_deref() == Some("abort") {
        if rank == 1 {
            world.abort(7);
        }
        // The others wait for a message that never comes: the abort must end them.
        let _ = world.process_at_rank(1).receive::<u64>();
        return;
    }
    // Every other rank of this machine over shared memory (all of them: one machine).
    let shm = (0..size)
        .filter(|&r| r != rank && metampi::counters::reaches_over_shared_memory(&world, r))
        .count();
    let mut sum = 0u64;
    world.all_reduce_into(
        &(rank as u64 + 1),
        &mut sum,
        metampi::collective::SystemOperation::sum(),
    );
    let n = size as u64;
    assert_eq!(sum, n * (n + 1) / 2);
    // A ring: each rank sends its rank to the next and receives from the previous.
    let next = world.process_at_rank((rank + 1) % size);
    let prev = world.process_at_rank((rank + size - 1) % size);
    let sreq_data = vec![rank as u64; 1000];
    let (got, _) = metampi::request::scope(|scope| {
        let s = next.immediate_send(scope, &sreq_data[..]);
        let got = prev.receive_vec::<u64>();
        s.wait();
        got
    });
    assert_eq!(got, vec![((rank + size - 1) % size) as u64; 1000]);
    println!("rank {rank} of {size}: shm peers {shm}, sum {sum}");
}

fn check_world(n: usize, hydra_args: &[&str], env: &[(&str, &str)]) {
    if !hydra_present() {
        return;
    }
    let (code, out, err) = hydra(n, hydra_args, env);
    check_ranks(n, code, &out, &err);
}

/// The job ended well and each of its `n` ranks said it had the right world.
fn check_ranks(n: usize, code: Option<i32>, out: &str, err: &str) {
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    for r in 0..n {
        let want = format!(
            "rank {r} of {n}: shm peers {}, sum {}",
            n - 1,
            n * (n + 1) / 2
        );
        assert!(
            out.contains(&want),
            "no `{want}` in:\n{out}\nstderr:\n{err}"
        );
    }
}

#[test]
fn hydra_pmi_2_through_its_socket() {
    check_world(4, &[], &[("METAMPI_PMI_VERSION", "2")]);
}

#[test]
fn hydra_pmi_1_through_its_socket() {
    check_world(3, &[], &[("METAMPI_PMI_VERSION", "1")]);
}

#[test]
fn hydra_through_a_port() {
    check_world(2, &["-pmi-port"], &[]);
}

#[test]
fn hydra_with_more_ranks_than_cores() {
    check_world(6, &[], &[]);
}

#[test]
fn an_abort_ends_the_hydra_job_with_its_code() {
    if !hydra_present() {
        return;
    }
    let (code, out, err) = hydra(3, &[], &[(ROLE, "abort")]);
    assert_eq!(code, Some(7), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("rank 1: MPI_Abort called with error code 7"),
        "no abort message in:\n{err}"
    );
}

/// `srun ARGS` of this test binary's `child` on `slurm`, `env` set: exit status, stdout,
/// stderr.
fn srun(slurm: &Slurm, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut c = slurm.command("srun");
    c.args(args);
    run_child(&mut c, env);
    let out = c.output().expect("srun runs");
    status_and_output(&out)
}

#[test]
fn slurm_srun_pmi_2_and_pmi_1() {
    let slurm = match Slurm::start() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIP: no Slurm daemons here: {why}");
            return;
        }
    };
    for (n, version) in [(4usize, ""), (3, "1")] {
        let (code, out, err) = srun(
            &slurm,
            &["-n", &n.to_string(), "--mpi=pmi2"],
            &[("METAMPI_PMI_VERSION", version)],
        );
        check_ranks(n, code, &out, &err);
        assert!(!err.contains("error"), "srun complained:\n{err}");
    }
    // A rank that exits without finalizing ends the step (`-K`: kill the others, as MPICH
    // users ask Slurm to), named by srun.
    let start = Instant::now();
    let (code, out, err) = srun(
        &slurm,
        &["-n", "3", "--mpi=pmi2", "--kill-on-bad-exit=1"],
        &[(ROLE, "crash")],
    );
    assert_ne!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("task 1: Exited with exit code 3"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}
