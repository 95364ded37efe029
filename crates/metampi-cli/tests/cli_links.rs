//! `metampi run --meta FILE --monitor SECS` and `metampi links DIR`: the routers'
//! per-link statistics as a table while a job runs, at its end, and afterwards.

use std::path::PathBuf;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_metampi");

/// Two meta hosts of one rank each over an emulated 100 Mbit/s line (12.5 MB/s), their
/// routers' ports from `portbase`.
fn description(dir: &std::path::Path, portbase: u16) -> PathBuf {
    let path = dir.join("sites.meta");
    std::fs::write(
        &path,
        format!(
            "PORTBASE {portbase}\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = local; NPROCS = 1; NODES = b0; }}\n\
             PAIR a b 1 - {{ BANDWIDTH = 100Mbit; LATENCY = 5ms; COMPRESSION = off; }}\n\
             a0 <-> b0\n"
        ),
    )
    .unwrap();
    path
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("metampi-cl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The row of link `a -> b` in a table: sent MB and the rest, split on spaces.
fn row(table: &str) -> Vec<String> {
    let line = table
        .lines()
        .rev()
        .find(|l| l.starts_with("l0 a -> b"))
        .unwrap_or_else(|| panic!("no row for l0 a -> b in:\n{table}"));
    line.split_whitespace()
        .skip(4)
        .map(str::to_string)
        .collect()
}

#[test]
fn monitor_prints_link_tables_while_the_job_runs_and_at_its_end() {
    let dir = scratch("monitor");
    let stats = dir.join("stats");
    std::fs::create_dir_all(&stats).unwrap();
    let out = Command::new(EXE)
        .args(["run", "--meta"])
        .arg(description(&dir, 26930))
        .args([
            "--monitor",
            "0.2",
            EXE,
            "bench",
            "--ops",
            "bw",
            "--sizes",
            "64K",
        ])
        .args(["--iters-scale", "0.002"])
        .env("METAMPI_ROUTER_STATS", &stats)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let (during, end) = err
        .split_once("links at the end of the job:")
        .unwrap_or_else(|| panic!("no final table:\n{err}"));
    assert!(during.contains("sent MB"), "no table while running:\n{err}");
    // All the bench sent crossed the link, in a little over a second: 32 messages
    // of 64 KiB per iteration, 5 and 2 of warm-up (routers write their statistics
    // again when a rank leaves, so the last table is complete).
    let sent: f64 = row(end)[0].parse().unwrap();
    assert!(sent >= 7.0 * 32.0 * 65536.0 / 1e6, "{end}");
    assert!(row(end).contains(&"off".to_string()), "{end}");
    // The directory given stays, and `metampi links` reads it afterwards.
    let out = Command::new(EXE)
        .args(["links"])
        .arg(&stats)
        .arg("--meta")
        .arg(description(&dir, 26930))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert_eq!(row(&table)[0], format!("{sent:.2}"), "{table}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn monitor_needs_a_meta_job_and_links_a_directory() {
    let out = Command::new(EXE)
        .args(["run", "-n", "1", "--monitor", "1", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--meta"));
    let out = Command::new(EXE)
        .args(["links", "/nonexistent/metampi-stats"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/metampi-stats"));
}

/// `METAMPI_ROUTER_STATS` naming a directory that is not there yet: the routers make it.
#[test]
fn routers_make_the_statistics_directory() {
    let dir = scratch("make");
    let stats = dir.join("not").join("yet");
    let cfg = description(&dir, 26950);
    let out = Command::new(EXE)
        .args(["run", "--meta"])
        .arg(&cfg)
        .args([EXE, "bench", "--ops", "bw", "--sizes", "1K"])
        .args(["--iters-scale", "0.002"])
        .env("METAMPI_ROUTER_STATS", &stats)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stats.join("router-0.json").exists(),
        "no statistics in {}",
        stats.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
