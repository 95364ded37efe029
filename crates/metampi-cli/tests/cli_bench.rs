//! `metampi bench` end to end: a small sweep, its JSON/CSV/SVG outputs, and
//! the overlay plot subcommand.

use std::process::Command;

/// Runs `metampi bench` with `args`, which must succeed; its stdout.
fn bench_ok(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bench_writes_documented_json_csv_and_plot() {
    let dir = std::env::temp_dir().join(format!("metampi-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let csv = dir.join("r.csv");
    let svg = dir.join("r.svg");
    let table = bench_ok(&[
        "-n".as_ref(),
        "3".as_ref(),
        "--ops".as_ref(),
        "pingpong,bw,barrier,allreduce,alltoall".as_ref(),
        "--sizes".as_ref(),
        "0:64".as_ref(),
        "--iters-scale".as_ref(),
        "0.02".as_ref(),
        "--label".as_ref(),
        "t".as_ref(),
        "--json".as_ref(),
        json.as_os_str(),
        "--csv".as_ref(),
        csv.as_os_str(),
        "--plot".as_ref(),
        svg.as_os_str(),
    ]);
    assert!(table.contains("# pingpong (ranks 0 and 1)"), "{table}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["tool"], "metampi bench");
    assert_eq!(v["label"], "t");
    assert_eq!(v["ranks"], 3);
    let rows = v["results"].as_array().unwrap();
    // pingpong, bw, alltoall: sizes 0,1,2,...,64 (8 sizes); barrier once; allreduce only for multiples of 4 (0,4,8,16,32,64).
    assert_eq!(rows.len(), 8 + 8 + 1 + 6 + 8, "{rows:?}");
    for r in rows {
        for k in [
            "op",
            "bytes",
            "iterations",
            "min_us",
            "median_us",
            "p90_us",
            "p99_us",
            "max_us",
            "mean_us",
        ] {
            assert!(!r[k].is_null(), "missing {k} in {r}");
        }
        let (min, med, max) = (
            r["min_us"].as_f64().unwrap(),
            r["median_us"].as_f64().unwrap(),
            r["max_us"].as_f64().unwrap(),
        );
        assert!(min <= med && med <= max, "{r}");
        assert_eq!(r["mbps"].is_null(), r["op"] != "bw", "{r}");
    }
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv_text.lines().count(), rows.len() + 1);
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let overlay = dir.join("o.svg");
    let st = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["bench", "plot"])
        .arg(&json)
        .arg(&json)
        .arg("-o")
        .arg(&overlay)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(std::fs::read_to_string(&overlay)
        .unwrap()
        .contains("t pingpong"));
    // The same overlay as PNG: a valid signature and IHDR of the figure's size.
    let png = dir.join("o.png");
    let st = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["bench", "plot"])
        .arg(&json)
        .arg(&json)
        .arg("-o")
        .arg(&png)
        .status()
        .unwrap();
    assert!(st.success());
    let b = std::fs::read(&png).unwrap();
    assert!(b.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(&b[12..16], b"IHDR");
    assert_eq!(u32::from_be_bytes(b[16..20].try_into().unwrap()), 1120);
    assert_eq!(u32::from_be_bytes(b[20..24].try_into().unwrap()), 420);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pingpong_mt`: thread pairs ping-pong at once, the report says how many.
#[test]
fn bench_pingpong_mt_runs_thread_pairs() {
    let dir = std::env::temp_dir().join(format!("metampi-bench-mt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    bench_ok(&[
        "--ops".as_ref(),
        "pingpong_mt".as_ref(),
        "--threads".as_ref(),
        "3".as_ref(),
        "--sizes".as_ref(),
        "8,64K".as_ref(),
        "--iters-scale".as_ref(),
        "0.05".as_ref(),
        "--json".as_ref(),
        json.as_os_str(),
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["threads"], 3);
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (r, bytes) in rows.iter().zip([8, 65536]) {
        assert_eq!(
            (r["op"].as_str(), r["bytes"].as_u64()),
            (Some("pingpong_mt"), Some(bytes))
        );
        assert!(r["median_us"].as_f64().unwrap() > 0.0, "{r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["bench", "--ops", "pingpong_mt", "--threads", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--threads must be at least 1"));
}

#[test]
fn bench_refuses_bad_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["bench", "--ops", "nonsense"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown operation"));
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["bench", "--sizes", "1M:1K"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// The bench's first line for two ranks started by `metampi run`, each under
/// `taskset -c` with the CPU list `cpus` gives it (`$METAMPI_RANK` in the list
/// is the rank's own number).
fn pinned_header(cpus: &str) -> String {
    let bin = env!("CARGO_BIN_EXE_metampi");
    let script = format!("exec taskset -c {cpus} {bin} bench --ops barrier --iters-scale 0.01");
    let out = Command::new(bin)
        .args(["run", "-n", "2", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().next().unwrap_or_default().to_string()
}

/// Ranks pinned to a core each (as batch systems bind them) each see one core
/// in their own mask; they must still count as having a core per rank, or
/// they would yield while they wait and double their latency (measured:
/// 8-byte shared-memory ping-pong 0.45 µs against 0.20 µs).
#[test]
fn ranks_pinned_to_their_own_cores_are_not_oversubscribed() {
    let two_cpus = Command::new("taskset")
        .args(["-c", "0,1", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !two_cpus {
        eprintln!("skipped: taskset is missing or CPUs 0 and 1 cannot both be used here");
        return;
    }
    let own = pinned_header("$METAMPI_RANK");
    assert!(own.contains("waiting: spin"), "{own}");
    let shared = pinned_header("0");
    assert!(shared.contains("waiting: yield"), "{shared}");
}

/// `--seconds-per-size` cuts the iterations of a slow point (here every point: a limit of a
/// millisecond) down to what fits, never below three; without it the count asked for runs.
#[test]
fn a_time_limit_per_point_cuts_iterations() {
    let dir = std::env::temp_dir().join(format!("metampi-bench-limit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let iterations = |limit: &str| {
        let json = dir.join(format!("limit-{limit}.json"));
        bench_ok(&[
            "--ops".as_ref(),
            "bw".as_ref(),
            "--sizes".as_ref(),
            "1M".as_ref(),
            "--seconds-per-size".as_ref(),
            limit.as_ref(),
            "--json".as_ref(),
            json.as_os_str(),
        ]);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        v["results"][0]["iterations"].as_u64().unwrap()
    };
    // A window of 32 one-MiB messages takes more than a millisecond on any machine.
    assert_eq!(iterations("0.001"), 3);
    // The OSU-style count for 1 MiB: 64 MiB / 1 MiB.
    assert_eq!(iterations("0"), 64);
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["bench", "--seconds-per-size=-1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--seconds-per-size"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
