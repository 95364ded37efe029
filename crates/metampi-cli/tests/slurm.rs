//! `metampi run` where Slurm gives out the nodes: inside an allocation it starts every rank as a
//! one-task srun step on an allocated node, and a meta host with `LAUNCH = slurm` gets its
//! nodes as a Slurm job of its own for the length of the metampi job, beside a meta host on
//! this machine. Each test starts a private one-node cluster (`metampi_testkit::slurm`: Debian's
//! `slurm-wlm` and `munge`, which `.ci/run` installs) and stops it afterwards; where the daemons
//! cannot start the test says why and passes.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::assert_demo_ok;
use metampi_testkit::slurm::Slurm;

const EXE: &str = env!("CARGO_BIN_EXE_metampi");

fn cluster() -> Option<Slurm> {
    match Slurm::start() {
        Ok(s) => Some(s),
        Err(why) => {
            eprintln!("SKIP: no Slurm daemons here: {why}");
            None
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `salloc -N1 -n TASKS metampi ARGS...` on `slurm`.
fn in_allocation(slurm: &Slurm, tasks: usize, args: &[&str]) -> Output {
    slurm
        .command("salloc")
        .args(["-N1", "-n", &tasks.to_string(), EXE])
        .args(args)
        .output()
        .expect("salloc runs")
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("metampi-slurm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn metampi_run_inside_an_allocation_starts_each_rank_with_srun() {
    let Some(slurm) = cluster() else { return };
    // Five ranks on an allocation of four tasks: each its own step on the allocated node,
    // which is the rank's node; the fifth wraps round as with any host list.
    let out = in_allocation(
        &slurm,
        4,
        &[
            "run",
            "-n",
            "5",
            "sh",
            "-c",
            "echo rank $METAMPI_RANK of $METAMPI_SIZE node $METAMPI_NODE step $SLURM_STEP_ID",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let mut steps: Vec<&str> = Vec::new();
    for r in 0..5 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("rank {r} of 5 node {} step ", slurm.node())))
            .unwrap_or_else(|| panic!("rank {r} missing or not on the node:\n{stdout}"));
        steps.push(line.rsplit(' ').next().unwrap());
    }
    steps.sort_unstable();
    steps.dedup();
    assert_eq!(steps.len(), 5, "one srun step per rank:\n{stdout}");

    // A world of four: shared memory between them, collectives, a ring.
    assert_demo_ok(
        &in_allocation(&slurm, 4, &["run", "-n", "4", EXE, "demo-rank"]),
        4,
    );

    // A C program through metampi's MPICH-ABI library.
    let dir = scratch("run");
    if let Some(suite) = common::build_suite(&dir, "abi_suite", "Slurm allocation test") {
        let suite = suite.to_str().unwrap();
        let out = in_allocation(&slurm, 4, &["run", "--timeout", "120", "-n", "4", suite]);
        assert_suite_ok(&out, 4);
    }

    // A rank that fails ends the job with its code and name; no step is left behind.
    let out = in_allocation(
        &slurm,
        4,
        &[
            "run",
            "-n",
            "3",
            "sh",
            "-c",
            "if [ $METAMPI_RANK = 1 ]; then exit 3; fi; sleep 60",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("rank 1 (pid"), "{stderr}");
    assert!(stderr.contains("exited with code 3"), "{stderr}");
    assert!(slurm.jobs().trim().is_empty() || !slurm.jobs().contains("RUNNING"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn launch_slurm_outside_an_allocation_is_refused_with_the_reason() {
    let out = std::process::Command::new(EXE)
        .args(["run", "--launch", "slurm", "-n", "2", "true"])
        .env_remove("SLURM_JOB_ID")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--launch slurm: not inside a Slurm allocation (SLURM_JOB_ID is not set)"),
        "{stderr}"
    );
}

/// A description of a meta host `a` on this machine and a meta host `s` on the Slurm node.
fn two_sites(dir: &Path, node: &str, portbase: u16) -> PathBuf {
    let cfg = dir.join("sites.cfg");
    std::fs::write(
        &cfg,
        format!(
            "PORTBASE {portbase}\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 2; NODES = a0; }}\n\
             METAHOST s {{ LAUNCH = slurm --time=10 '--comment=metampi test'; NPROCS = 2; \
             NODES = {node}; }}\n\
             PAIR a s 1\na0 <-> {node}\n"
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn a_slurm_meta_host_joins_a_site_on_this_machine() {
    let Some(slurm) = cluster() else { return };
    let dir = scratch("meta");
    let cfg = two_sites(&dir, slurm.node(), 25360);
    let cfg = cfg.to_str().unwrap();
    let meta = |args: &[&str]| {
        slurm
            .command(EXE)
            .args(["run", "--timeout", "120", "--meta", cfg])
            .args(args)
            .output()
            .expect("metampi runs")
    };
    // Ranks 2 and 3 run as steps of the meta host's own Slurm job, 0 and 1 here.
    let out = meta(&[
        "sh",
        "-c",
        "echo rank $METAMPI_RANK step ${SLURM_STEP_ID:-none}",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for r in 0..4 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("rank {r} step ")))
            .unwrap_or_else(|| panic!("rank {r} missing:\n{stdout}"));
        assert_eq!(line.ends_with("none"), r < 2, "{stdout}");
    }
    // The same world across the routers: point to point, collectives, semantics.
    assert_demo_ok(&meta(&[EXE, "demo-rank"]), 4);
    if let Some(suite) = common::build_suite(&dir, "abi_suite", "Slurm meta host test") {
        assert_suite_ok(&meta(&[suite.to_str().unwrap()]), 4);
    }
    // Each job's allocation ended with it.
    let jobs = slurm.jobs();
    assert!(!jobs.contains("RUNNING"), "{jobs}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn assert_suite_ok(out: &Output, ranks: usize) {
    common::assert_suite_ok(
        out.status.code(),
        &text(&out.stdout),
        &text(&out.stderr),
        ranks,
    );
}
