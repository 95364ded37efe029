//! `metampi bench`: ping-pong, bandwidth and collective curves (OSU/IMB style).
//!
//! Started outside a job, the command launches itself as the ranks of a new
//! job (same arguments); started inside one (`metampi run -n 4 metampi bench`)
//! each process is a rank. Rank 0 prints an aligned table as results come
//! in and writes `--json`, `--csv` and `--plot` files.

mod measure;
mod plot;
mod report;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use metampi_launch::{AppSpec, Host, JobSpec, LaunchMethod, StdinTarget};

use report::BenchReport;

/// Options of `metampi bench`.
#[derive(Debug, Args, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    sub: Option<BenchSub>,
    /// Operations, comma-separated: pingpong, pingping, bw, bibw, barrier, bcast,
    /// reduce, allreduce, gather, scatter, allgather, alltoall; or the groups
    /// `p2p`, `coll`, `all`; and `pingpong_mt` (not in any group): `--threads`
    /// thread pairs ping-pong at once, each on its own tag, the slowest one-way
    /// time per iteration (as OSU's osu_latency_mt).
    #[arg(long, default_value = "all")]
    ops: String,
    /// Thread pairs of `pingpong_mt`.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Number of ranks to launch (ignored inside `metampi run`).
    #[arg(short = 'n', long, default_value_t = 2)]
    ranks: usize,
    /// Message sizes in bytes, `MIN:MAX` in powers of two (suffixes K, M), or a list `8,1K,4M`.
    #[arg(long, default_value = "0:4M")]
    sizes: String,
    /// The two ranks of point-to-point measurements, e.g. `0,3` (one per site to measure the wide-area path).
    #[arg(long, default_value = "0,1")]
    pair: String,
    /// Force TCP between ranks on this machine.
    #[arg(long)]
    tcp: bool,
    /// Emulated machines for the launched ranks, e.g. `m0:2,m1:2` (TCP between them).
    #[arg(long)]
    machines: Option<String>,
    /// Scale all iteration counts (e.g. 0.1 for a quick look).
    #[arg(long, default_value_t = 1.0)]
    iters_scale: f64,
    /// Seconds a point (one operation at one size) may take: after one timed probe
    /// iteration, fewer iterations are run where the default count would take longer (a
    /// wide-area link, large messages); at least 3. `0` turns the limit off
    #[arg(long, default_value_t = 2.0)]
    seconds_per_size: f64,
    /// Start receive buffers this many bytes past a page boundary (send
    /// buffers start on one, as in the OSU benchmarks). 1-31 is the placement
    /// that makes `rep movsb` copies 5-15x slower on AMD Zen, which metampi
    /// copies around (see docs/decisions/0014-copies-where-buffers-fall-badly.md).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..4096))]
    misalign: u16,
    /// Label of this run in the JSON and in plots.
    #[arg(long)]
    label: Option<String>,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the results as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw latency and bandwidth against message size: PNG when FILE ends in `.png`, SVG otherwise.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Debug, Subcommand, Clone)]
enum BenchSub {
    /// Overlay several JSON result files in one figure (PNG when the output ends in `.png`, SVG otherwise).
    Plot {
        /// Result files written by `metampi bench --json` (or bench/c/osu_like).
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// The figure to write (`.png` or `.svg`).
        #[arg(short, long)]
        output: PathBuf,
    },
}

pub fn execute(args: BenchArgs) -> Result<u8> {
    if let Some(BenchSub::Plot { inputs, output }) = &args.sub {
        let mut reports = Vec::new();
        for p in inputs {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let r: BenchReport =
                serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
            reports.push(r);
        }
        plot::write_plot(&reports, output)?;
        println!("wrote {}", output.display());
        return Ok(0);
    }
    let cfg = measure::Config::from_args(&args)?;
    if std::env::var_os("METAMPI_PMI").is_some() {
        return measure::rank_main(&cfg, &args);
    }
    if args.ranks < 1 {
        bail!("-n must be at least 1");
    }
    let exe = std::env::current_exe()?;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut spec = JobSpec::new()
        .app(AppSpec::new(args.ranks, exe).args(argv))
        .stdin(StdinTarget::None)
        .timeout(Duration::from_secs(3600));
    if args.tcp {
        spec = spec.env("METAMPI_FORCE_TCP", "1");
    }
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        spec = spec.env(crate::progress::PROGRESS_ENV, "1");
    }
    if let Some(m) = &args.machines {
        let hosts = Host::parse_list(m).map_err(|e| anyhow::anyhow!("--machines: {e}"))?;
        spec = spec.hosts(hosts).launch(LaunchMethod::Local);
    }
    spec.validate()?;
    let outcome = metampi_launch::run(&spec)?;
    if let Some(f) = &outcome.failure {
        eprintln!("metampi bench: {f}");
    }
    Ok(outcome.exit_code() as u8)
}
