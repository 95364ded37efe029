//! The papers' mini-applications in `apps/` (plain C, built once with MPICH's `mpicc`) give
//! the same answers on MPICH, on metampi on one site and on metampi over two emulated sites;
//! the pipelined solver converges to the blocking one's solution.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `apps/NAME.c` built into a fresh folder, or `None` (skipped, except under CI).
fn build(name: &str) -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::temp_dir().join(format!("metampi-apps-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = root().join(format!("apps/{name}.c"));
    let exe = common::build_c(&dir, &src, name, "papers' mini-applications test")?;
    Some((dir, exe))
}

/// Two emulated sites of two ranks each over a 100 Mbit/s, 2 ms line.
fn two_sites(dir: &Path, portbase: u16) -> PathBuf {
    let cfg = dir.join("two.cfg");
    std::fs::write(
        &cfg,
        format!(
            "PORTBASE {portbase}\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 2; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = local; NPROCS = 2; NODES = b0; }}\n\
             PAIR a b 1 - {{ BANDWIDTH = 100Mbit; LATENCY = 2ms; }}\na0 <-> b0\n"
        ),
    )
    .unwrap();
    cfg
}

/// The program's `key=value` line (rank 0's), the test failing with its output otherwise.
fn result(mut cmd: Command, what: &str) -> HashMap<String, String> {
    let out = cmd.output().expect("the launcher starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("ranks="))
        .unwrap_or_else(|| panic!("{what}: no result line in:\n{stdout}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn mpich(exe: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("mpiexec.mpich");
    cmd.args(["-n", "4"]).arg(exe).args(args);
    cmd
}

fn metampi(exe: &Path, meta: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_metampi"));
    cmd.args(["run", "--timeout", "120"]);
    match meta {
        Some(cfg) => cmd.arg("--meta").arg(cfg),
        None => cmd.args(["-n", "4"]),
    };
    cmd.arg(exe).args(args);
    cmd
}

/// `program ARGS`'s results on MPICH, on metampi on one site and over the sites of `cfg`.
fn everywhere(
    exe: &Path,
    cfg: &Path,
    args: &[&str],
    program: &str,
) -> [(&'static str, HashMap<String, String>); 3] {
    [
        (
            "MPICH",
            result(mpich(exe, args), &format!("{program} on MPICH")),
        ),
        (
            "one site",
            result(metampi(exe, None, args), &format!("{program} on metampi")),
        ),
        (
            "two sites",
            result(
                metampi(exe, Some(cfg), args),
                &format!("{program} over two sites"),
            ),
        ),
    ]
}

fn number(r: &HashMap<String, String>, key: &str) -> f64 {
    r[key]
        .parse()
        .unwrap_or_else(|_| panic!("{key}={} is no number", r[key]))
}

/// Equal to 1e-10 of the value: sums over ranks may be added in another order.
fn assert_close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-10 * a.abs().max(b.abs()),
        "{what}: {a:e} against {b:e}"
    );
}

#[test]
fn uranus_answers_alike_on_mpich_and_on_one_and_two_sites() {
    let Some((dir, exe)) = build("uranus") else {
        return;
    };
    let cfg = two_sites(&dir, 23700);
    let args = ["--grid", "24x20x16", "--iters", "15"];
    let mut seen = Vec::new();
    for variant in ["blocking", "overlap"] {
        let mut a = args.to_vec();
        a.extend(["--variant", variant]);
        let runs = everywhere(&exe, &cfg, &a, "uranus");
        for (name, r) in &runs {
            assert_eq!(r["iters"], "15", "{variant} on {name}");
            assert_eq!(r["dims"], "2x2x1", "{variant} on {name}");
            for key in ["checksum", "residual"] {
                assert_close(
                    number(r, key),
                    number(&runs[0].1, key),
                    &format!("{variant} {key} on {name}"),
                );
            }
        }
        seen.push(number(&runs[0].1, "checksum"));
    }
    // The overlapped exchange does the same arithmetic as the blocking one.
    assert_close(seen[0], seen[1], "overlap against blocking");

    // Pipelined halos are older, so it takes more sweeps, to the same solution. Its sweeps
    // are made to cost about a millisecond: with sweeps much shorter than the line's delay
    // the halos are dozens of sweeps old and it needs many times more of them.
    let tol = [
        "--grid",
        "16x12x12",
        "--tol",
        "1e-5",
        "--work",
        "100",
        "--max-iters",
        "20000",
    ];
    let blocking = result(
        metampi(
            &exe,
            Some(&cfg),
            &[&tol[..], &["--variant", "blocking"]].concat(),
        ),
        "blocking to a tolerance",
    );
    let pipelined = result(
        metampi(
            &exe,
            Some(&cfg),
            &[&tol[..], &["--variant", "pipelined"]].concat(),
        ),
        "pipelined to a tolerance",
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(number(&pipelined, "residual") < 1e-5, "{pipelined:?}");
    let (b, p) = (
        number(&blocking, "checksum"),
        number(&pipelined, "checksum"),
    );
    assert!(
        (b - p).abs() < 1e-4 * b.abs(),
        "pipelined {p:e} against {b:e}"
    );
    assert!(
        number(&pipelined, "iters") >= number(&blocking, "iters"),
        "{pipelined:?} against {blocking:?}"
    );
}

#[test]
fn dsmc_answers_alike_on_mpich_and_on_one_and_two_sites() {
    let Some((dir, exe)) = build("dsmc") else {
        return;
    };
    let cfg = two_sites(&dir, 23750);
    for exchange in ["overlap", "blocking"] {
        let a = [
            "--steps",
            "40",
            "--particles",
            "1000",
            "--exchange",
            exchange,
        ];
        let runs = everywhere(&exe, &cfg, &a, "dsmc");
        let first = &runs[0].1;
        assert_eq!(first["particles"], "4000", "{first:?}");
        assert!(number(first, "migrated") > 0.0, "{first:?}");
        assert_close(
            number(first, "energy"),
            number(first, "energy0"),
            "energy kept",
        );
        for (name, r) in &runs {
            for key in ["particles", "collisions", "migrated"] {
                assert_eq!(r[key], first[key], "{exchange} {key} on {name}");
            }
            for key in ["energy", "hot_half"] {
                assert_close(
                    number(r, key),
                    number(first, key),
                    &format!("{exchange} {key} on {name}"),
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
