//! `psrsearch stream`: the driver that starts the streaming pipeline as a metampi job, and
//! the rank body it relaunches this executable as (`psrsearch stream-rank`).

use std::ffi::OsString;
use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use metampi::traits::*;
use psrsearch::demo;
use psrsearch::distributed::stream::{stream_search, Interim, StreamConfig, StreamRole};
use psrsearch::format::stream::StreamFormat;
use psrsearch::format::vdif_stream::UdpFrames;
use psrsearch::metajob::{self, MetaJob};
use psrsearch::search::Candidate;

/// Arguments of `psrsearch stream`.
#[derive(Debug, Args)]
pub struct StreamArgs {
    /// Accept one TCP connection on this address (e.g. 127.0.0.1:9000) and read the stream
    /// from it; without it (or --listen-udp) the stream is read from standard input.
    #[arg(long, conflicts_with = "listen_udp")]
    pub listen: Option<String>,
    /// Receive VDIF frames as UDP datagrams on this address, one frame each, with or without
    /// an 8-byte sequence number before it (VTP); lost datagrams read as zeros. For high
    /// rates raise the kernel's receive buffer (sysctl net.core.rmem_default).
    #[arg(long, value_name = "ADDR")]
    pub listen_udp: Option<String>,
    /// With --listen-udp: the stream ends when no datagram has come for this many seconds.
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub udp_idle_s: f64,
    /// Ranks of the single-machine job: a master, a stage-2 rank and the rest stage 1 (at
    /// least 3).
    #[arg(long, default_value_t = 3)]
    pub ranks: usize,
    /// Run over the meta computer this description defines instead (world rank 0, on its
    /// first meta host, reads the stream).
    #[arg(long)]
    pub meta: Option<PathBuf>,
    /// Search the series received so far every this many blocks (0: only at the end).
    #[arg(long, default_value_t = 16)]
    pub search_every: u64,
    #[command(flatten)]
    pub search: crate::SearchOpts,
    /// Directory for the candidates of the whole stream (candidates.csv and .json, ACCEL
    /// files), plots and stream_lag.json.
    #[arg(long, default_value = "psrsearch-stream")]
    pub out_dir: PathBuf,
    /// Skip the plots.
    #[arg(long)]
    pub no_plots: bool,
    /// The stream's format: auto tells a DADA header from a VDIF frame by its first bytes.
    #[arg(long, value_enum, default_value_t = InputFormat::Auto)]
    pub format: InputFormat,
    /// For VDIF: the side-car text file (FREQ and SAMPLE_RATE in MHz, optionally BW, NPOL,
    /// THREADS, SOURCE, TELESCOPE, RA, DEC), as the file reader takes from FILE.vdif.hdr.
    #[arg(long, value_name = "FILE")]
    pub vdif_header: Option<PathBuf>,
}

/// `--format` of `psrsearch stream`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum InputFormat {
    /// DADA, GUPPI or VDIF, told by the first bytes.
    Auto,
    /// PSRDADA.
    Dada,
    /// GUPPI RAW (a block is processed once it has arrived whole).
    Guppi,
    /// VDIF (needs --vdif-header).
    Vdif,
}

/// Arguments of the hidden `stream-rank` subcommand.
#[derive(Debug, Args)]
pub struct StreamRankArgs {
    /// The stream settings as JSON (written by the driver).
    #[arg(long)]
    pub config_json: String,
    /// Address to accept the stream on (master only); stdin otherwise.
    #[arg(long)]
    pub listen: Option<String>,
    /// Address to receive VDIF datagrams on (master only).
    #[arg(long)]
    pub listen_udp: Option<String>,
    /// Seconds without a datagram that end a UDP stream.
    #[arg(long, default_value_t = 2.0)]
    pub udp_idle_s: f64,
    /// Where stage 2 writes candidates and plots, and the master the lags.
    #[arg(long)]
    pub out_dir: PathBuf,
    /// Skip the plots.
    #[arg(long)]
    pub no_plots: bool,
}

/// `psrsearch stream`.
pub fn stream_main(a: StreamArgs) -> Result<()> {
    let vdif_sidecar = match &a.vdif_header {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading the VDIF side-car {}", p.display()))?;
            // Refuse a bad side-car here, with its line, rather than after the job starts.
            psrsearch::format::vdif::VdifSidecar::parse(&text)
                .with_context(|| format!("in {}", p.display()))?;
            Some(text)
        }
        None => None,
    };
    if a.listen_udp.is_some() {
        if matches!(a.format, InputFormat::Dada | InputFormat::Guppi) {
            bail!(
                "--listen-udp receives VDIF frames; DADA and GUPPI streams come on stdin or \
                 --listen"
            );
        }
        if vdif_sidecar.is_none() {
            bail!("--listen-udp needs --vdif-header FILE (VDIF headers give no sky frequency)");
        }
        if !(a.udp_idle_s > 0.0 && a.udp_idle_s.is_finite()) {
            bail!("--udp-idle-s must be a positive number of seconds");
        }
    }
    if matches!(a.format, InputFormat::Vdif) && vdif_sidecar.is_none() {
        bail!("--format vdif needs --vdif-header FILE (VDIF headers give no sky frequency)");
    }
    let mut search = a.search.config(None)?.0;
    if a.no_plots {
        // Nothing will draw the candidates' folds.
        search.candidate_plots = 0;
    }
    let config = StreamConfig {
        search,
        search_every: a.search_every,
        format: match a.format {
            InputFormat::Auto => StreamFormat::Auto,
            InputFormat::Dada => StreamFormat::Dada,
            InputFormat::Guppi => StreamFormat::Guppi,
            InputFormat::Vdif => StreamFormat::Vdif,
        },
        vdif_sidecar,
        // The band is known once the master has the stream's header: it chooses.
        subchannels_auto: a.search.opts.subchannels == crate::Subchannels::Auto,
    };
    let (name, description) = match &a.meta {
        Some(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        ),
        None => {
            if a.ranks < 3 {
                bail!("--ranks must be at least 3 (master, stage 1, stage 2)");
            }
            let base = metajob::free_port_base(1)?;
            (
                "the single-machine streaming job".into(),
                format!(
                    "PORTBASE {base}\nMETAHOST local {{ LAUNCH = local; NPROCS = {}; NODES = n0; }}\n",
                    a.ranks
                ),
            )
        }
    };
    std::fs::create_dir_all(&a.out_dir)
        .with_context(|| format!("creating {}", a.out_dir.display()))?;
    let out_dir = std::fs::canonicalize(&a.out_dir)?;
    let mut rank_args: Vec<OsString> = vec![
        "stream-rank".into(),
        "--config-json".into(),
        serde_json::to_string(&config)?.into(),
        "--out-dir".into(),
        out_dir.into(),
    ];
    if let Some(l) = &a.listen {
        rank_args.push("--listen".into());
        rank_args.push(l.into());
    }
    if let Some(l) = &a.listen_udp {
        rank_args.push("--listen-udp".into());
        rank_args.push(l.into());
        rank_args.push("--udp-idle-s".into());
        rank_args.push(a.udp_idle_s.to_string().into());
    }
    if a.no_plots {
        rank_args.push("--no-plots".into());
    }
    let t = Instant::now();
    let outcome = metajob::run(&MetaJob {
        description_name: name,
        description,
        rank_args,
        env: Vec::new(),
        timeout: Duration::from_secs(24 * 3600),
        stdin_to_root: a.listen.is_none() && a.listen_udp.is_none(),
        slow_link: None,
    })?;
    if let Some(f) = &outcome.failure {
        bail!("the streaming search failed: {f}");
    }
    println!("streaming job took {:.2} s", t.elapsed().as_secs_f64());
    Ok(())
}

fn open_input(
    listen: Option<&str>,
    udp: Option<(&str, f64)>,
) -> std::io::Result<(Box<dyn Read>, String)> {
    if let Some((addr, idle)) = udp {
        let socket = std::net::UdpSocket::bind(addr)?;
        let local = socket.local_addr()?;
        eprintln!("stream: receiving VDIF datagrams on udp:{local}");
        let frames = UdpFrames::new(socket, Duration::from_secs_f64(idle))?;
        return Ok((Box::new(frames), format!("udp:{local}")));
    }
    match listen {
        Some(addr) => {
            let l = TcpListener::bind(addr)?;
            eprintln!("stream: listening on {}", l.local_addr()?);
            let (s, peer) = l.accept()?;
            Ok((Box::new(s), format!("tcp:{peer}")))
        }
        None => Ok((Box::new(std::io::stdin()), "<stdin>".into())),
    }
}

fn top_line(i: &Interim) -> String {
    match i.outcome.candidates.first() {
        Some(c) => {
            let c = &c.candidate;
            format!(
                "best P = {:.4} ms, DM {}, {:.1} sigma, S/N {:.1} ({} above threshold)",
                c.period_s * 1e3,
                c.dm,
                c.sigma,
                c.snr,
                i.outcome.candidates.len()
            )
        }
        None => "no candidate above threshold".into(),
    }
}

/// The body of every rank of a streaming search.
pub fn stream_rank_main(a: StreamRankArgs) -> Result<()> {
    let (universe, _) = metampi::initialize_with_threading(metampi::Threading::Multiple)
        .context("metampi was already initialised")?;
    let world = universe.world();
    let config: StreamConfig =
        serde_json::from_str(&a.config_json).context("parsing --config-json")?;
    let listen = a.listen.clone();
    let udp = a.listen_udp.clone().map(|l| (l, a.udp_idle_s));
    let mut report = |i: &Interim| {
        println!(
            "interim search after {} blocks ({:.3} s of data): {}",
            i.blocks,
            i.data_s,
            top_line(i)
        );
    };
    let role = match stream_search(
        &world,
        || {
            open_input(
                listen.as_deref(),
                udp.as_ref().map(|(a, i)| (a.as_str(), *i)),
            )
        },
        &config,
        &mut report,
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("psrsearch: stream rank {}: {e}", world.rank());
            world.abort(2);
        }
    };
    match role {
        StreamRole::Master(r) => {
            if let Some(n) = r.subchannels_chosen {
                let max_dm = config.search.dms.iter().fold(0.0f64, |m, d| m.max(d.abs()));
                println!(
                    "{}",
                    crate::Subchannels::describe_choice(n, max_dm, config.search.plan.downsample)
                );
            }
            let lags: Vec<f64> = r.blocks.iter().map(|b| b.lag_s()).collect();
            let max = lags.iter().copied().fold(0.0, f64::max);
            let mean = lags.iter().sum::<f64>() / lags.len().max(1) as f64;
            println!(
                "stream: {} samples per channel in {} blocks over {:.2} s ({:.3}x real time), {} stage-1 rank(s)",
                r.samples,
                r.blocks.len(),
                r.input_s,
                r.input_real_time_factor(),
                r.stage1_ranks
            );
            println!(
                "lag (block arrival to result): first blocks {:.1} ms, last blocks {:.1} ms (medians of 5), mean {:.1} ms, max {:.1} ms",
                r.median_lag(5, false) * 1e3,
                r.median_lag(5, true) * 1e3,
                mean * 1e3,
                max * 1e3
            );
            for line in &r.repairs {
                eprintln!("stream: {line}");
            }
            let mut hosts = r.stage1_hosts.clone();
            hosts.sort_unstable();
            hosts.dedup();
            if hosts.len() > 1 {
                // Over several meta hosts: each host's share of the blocks and its lag.
                for h in hosts {
                    let mut lags: Vec<f64> = r
                        .blocks
                        .iter()
                        .filter(|b| r.stage1_hosts.get(b.stage1) == Some(&h))
                        .map(|b| b.lag_s())
                        .collect();
                    lags.sort_by(f64::total_cmp);
                    println!(
                        "  stage 1 on meta host {h}: {} blocks, median lag {:.1} ms, max {:.1} ms",
                        lags.len(),
                        lags.get(lags.len() / 2).copied().unwrap_or(0.0) * 1e3,
                        lags.last().copied().unwrap_or(0.0) * 1e3
                    );
                }
            }
            let path = a.out_dir.join("stream_lag.json");
            std::fs::write(&path, serde_json::to_vec_pretty(&r)?)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
        StreamRole::StageTwo(r) => {
            let table: Vec<Candidate> = r
                .last
                .outcome
                .candidates
                .iter()
                .map(|c| c.candidate.clone())
                .collect();
            let dms = &r.last.outcome.dms;
            let step = if dms.len() > 1 { dms[1] - dms[0] } else { 0.0 };
            println!(
                "search of the whole stream ({} blocks, {:.3} s of data, {} interim searches before):",
                r.last.blocks,
                r.last.data_s,
                r.interim.len()
            );
            print!("{}", demo::format_table(&table, &[], step));
            crate::write_results(&r.last.outcome, &a.out_dir, !a.no_plots)?;
        }
        StreamRole::StageOne(_) => {}
    }
    drop(universe);
    Ok(())
}
