//! The distributed search from the command line: the driver that starts a meta job, the rank
//! body it relaunches this executable as, the progress display, and `psrsearch plan`.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use metampi::traits::*;
use psrsearch::balance::{self, BalanceInput, HostModel};
use psrsearch::distributed::{self, DistConfig, Progress, ServiceMode};
use psrsearch::metajob::{self, MetaJob};
use psrsearch::search::{dm_grid, Candidate, SearchConfig};
use psrsearch::{BasebandReader, DedispersionPlan, PlanConfig};

use crate::progress::Phases;

const PROGRESS_ENV: &str = "PSRSEARCH_PROGRESS";

/// Arguments of the hidden `rank` subcommand (one rank of a distributed search).
#[derive(Debug, Args)]
pub struct RankArgs {
    /// Baseband file (read by the servers on the data host).
    pub file: PathBuf,
    /// The search settings as JSON (written by the driver).
    #[arg(long)]
    pub config_json: String,
    /// Service mode: request, scheduled or dynamic.
    #[arg(long, default_value = "request")]
    pub mode: ServiceMode,
    /// Meta-computer description (host names, link bandwidths).
    #[arg(long)]
    pub description: Option<PathBuf>,
    /// Where the root writes tables, plots and the report.
    #[arg(long)]
    pub out_dir: PathBuf,
    /// Clients per server.
    #[arg(long, default_value_t = distributed::MAX_CLIENTS_PER_SERVER)]
    pub clients_per_server: usize,
    /// Skip the plots.
    #[arg(long)]
    pub no_plots: bool,
    /// Probe every link at start-up and plan with the lower of the described and the
    /// measured bandwidth (without it the description's BANDWIDTH is taken as it is).
    #[arg(long)]
    pub measure_links: bool,
    /// Make one meta host's clients sleep after every unit: `NAME:SECONDS`.
    #[arg(long, value_parser = parse_slow_host)]
    pub slow_host: Option<(String, f64)>,
}

/// `NAME:SECONDS` of `--slow-host` (and of `PSRSEARCH_SLOW_HOST`).
fn parse_slow_host(s: &str) -> Result<(String, f64), String> {
    let (name, secs) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("`{s}`: expected NAME:SECONDS"))?;
    let secs: f64 = secs
        .parse()
        .map_err(|e| format!("`{s}`: bad seconds: {e}"))?;
    if !(0.0..=10.0).contains(&secs) {
        return Err(format!("`{s}`: seconds must be within 0..=10"));
    }
    Ok((name.to_string(), secs))
}

/// The body of every rank.
pub fn rank_main(a: RankArgs) -> Result<()> {
    let (universe, _) = metampi::initialize_with_threading(metampi::Threading::Multiple)
        .context("metampi was already initialised")?;
    let world = universe.world();
    let search: SearchConfig =
        serde_json::from_str(&a.config_json).context("parsing --config-json")?;
    let description = match &a.description {
        Some(p) => Some(
            metampi_config::load(p)
                .with_context(|| format!("reading {}", p.display()))?
                .layout(),
        ),
        None => None,
    };
    let config = DistConfig {
        search,
        mode: a.mode,
        clients_per_server: a.clients_per_server,
        description,
        measure_links: a.measure_links,
        slow_host: a.slow_host.clone(),
        slow_rank: None,
    };
    let mut sink = ProgressSink::from_env();
    let result = distributed::search_distributed(&world, &a.file, &config, &mut |p| sink.send(p));
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("psrsearch: rank {}: {e}", world.rank());
            world.abort(2);
        }
    };
    if let Some(d) = report {
        sink.finish();
        crate::write_results(&d.outcome, &a.out_dir, !a.no_plots)?;
        println!(
            "{} over {} meta host(s): {} server(s), {} clients",
            d.mode,
            d.hosts.len(),
            d.servers,
            d.clients
        );
        for n in &d.link_notes {
            println!("link  {n}");
        }
        if let Some((name, secs)) = &a.slow_host {
            println!("slowed host: {name} sleeps {secs} s after every unit (unknown to the plan)");
        }
        if d.pilot_s > 0.0 {
            println!(
                "pilot: {} units ({} per client) in {:.2} s measured what a unit costs",
                d.hosts.iter().map(|h| h.pilot_units).sum::<u64>(),
                d.hosts
                    .iter()
                    .find(|h| h.clients > 0)
                    .map_or(0, |h| h.pilot_units / h.clients as u64),
                d.pilot_s
            );
        }
        println!("{}", d.cost_note);
        println!(
            "static plan (cpu: a client's CPU seconds per unit, the mean of the pilot's and \
             the calibration's; core: share of a core each client gets, from every client \
             computing at once):"
        );
        println!("{}", d.allocation);
        println!("{}", host_table(&d.hosts));
        crate::print_timings(&d.outcome);
        let relay = match d.relay_service {
            Some((cpu, units)) if units > 0 => format!(
                ", routers' {cpu:.2} s: {:.2} ms per remote unit",
                cpu / units as f64 * 1e3
            ),
            _ => String::new(),
        };
        println!(
            "service {:.2} s (servers' CPU {}{relay}), whole distributed search {:.2} s",
            d.service_s,
            d.server_cpu_s
                .iter()
                .map(|c| format!("{c:.2} s"))
                .collect::<Vec<_>>()
                .join(" + "),
            d.total_s
        );
        let report = serde_json::json!({
            "mode": d.mode,
            "service_s": d.service_s,
            "total_s": d.total_s,
            "routers_service_cpu_s": d.relay_service.map(|(cpu, _)| cpu),
            "remote_service_units": d.relay_service.map(|(_, units)| units),
            "hosts": d.hosts,
            "plan": d.allocation.to_string(),
        });
        let path = a.out_dir.join("distributed.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    drop(universe);
    Ok(())
}

fn host_table(hosts: &[distributed::HostReport]) -> String {
    let mut s = format!(
        "{:<12} {:>7} {:>6} {:>5} {:>13} {:>12} {:>8} {:>10} {:>10} {:>9}\n",
        "host",
        "clients",
        "units",
        "done",
        "planned (s)",
        "measured (s)",
        "diff",
        "busy (s)",
        "idle (s)",
        "cpu (s)"
    );
    for h in hosts.iter().filter(|h| h.clients > 0) {
        // A host planned no units has no time to compare with (its measured time is its
        // clients' start and end alone).
        let diff = if h.units > 0 && h.predicted_s > 0.0 {
            format!(
                "{:.0}%",
                100.0 * (h.measured_s - h.predicted_s) / h.predicted_s
            )
        } else {
            "-".to_string()
        };
        s.push_str(&format!(
            "{:<12} {:>7} {:>6} {:>5} {:>13.2} {:>12.2} {:>8} {:>10.2} {:>10.2} {:>9.2}\n",
            h.name,
            h.clients,
            h.units,
            h.done_units,
            h.predicted_s,
            h.measured_s,
            diff,
            h.busy_s,
            h.idle_s,
            h.cpu_s
        ));
    }
    let measured: Vec<f64> = hosts
        .iter()
        .filter(|h| h.units > 0)
        .map(|h| h.measured_s)
        .collect();
    let (lo, hi) = measured
        .iter()
        .fold((f64::MAX, 0.0f64), |(a, b), &m| (a.min(m), b.max(m)));
    if !measured.is_empty() {
        s.push_str(&format!(
            "finish times spread {:.0}% (earliest {:.2} s, latest {:.2} s)",
            100.0 * (hi - lo) / hi.max(1e-9),
            lo,
            hi
        ));
    }
    s
}

/// Where the root's progress goes: to the driver's display over loopback TCP when it gave
/// an address, else to this rank's stderr (a pipe to the launcher, so plain lines).
struct ProgressSink {
    /// The driver's address, until the first report connects to it.
    addr: Option<String>,
    stream: Option<TcpStream>,
    lines: Phases,
}

impl ProgressSink {
    fn from_env() -> Self {
        ProgressSink {
            addr: std::env::var(PROGRESS_ENV).ok(),
            stream: None,
            lines: Phases::default(),
        }
    }

    fn send(&mut self, p: &Progress) {
        // Only the root reports, so only the root connects: the display reads the first
        // connection it accepts, and when every rank connected at start-up another rank's
        // silent one often came first (the display then stayed empty).
        if let Some(addr) = self.addr.take() {
            self.stream = TcpStream::connect(addr).ok();
        }
        let hosts: Vec<String> = p
            .hosts
            .iter()
            .map(|(n, d, t)| format!("{n}={d}/{t}"))
            .collect();
        let hosts = hosts.join(",");
        if let Some(s) = &mut self.stream {
            let line = format!(
                "{} {} {} {:.2} {hosts}\n",
                p.phase, p.done, p.total, p.elapsed_s
            );
            if s.write_all(line.as_bytes()).is_ok() {
                return;
            }
            self.stream = None;
        }
        self.lines
            .update(p.phase, p.done, p.total, &detail(p.elapsed_s, &hosts));
    }

    fn finish(&mut self) {
        self.stream = None;
        self.lines = Phases::default();
    }
}

/// What follows the count: the root's clock and, while units are dealt, each meta host's
/// `name=done/allocated`.
fn detail(elapsed_s: f64, hosts: &str) -> String {
    format!("{elapsed_s:.2} s {}", hosts.replace(',', " "))
        .trim_end()
        .to_string()
}

/// The driver's live display of the root's progress lines, on stderr.
fn spawn_display() -> Result<(String, std::thread::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").context("progress listener")?;
    let addr = listener.local_addr()?.to_string();
    let handle = std::thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        let mut phases = Phases::default();
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 4 {
                continue;
            }
            let (done, total): (u64, u64) = (f[1].parse().unwrap_or(0), f[2].parse().unwrap_or(1));
            let elapsed_s: f64 = f[3].parse().unwrap_or(0.0);
            phases.update(
                f[0],
                done,
                total,
                &detail(elapsed_s, f.get(4).copied().unwrap_or("")),
            );
        }
    });
    Ok((addr, handle))
}

/// What a finished distributed run left in its output directory.
pub struct JobResult {
    pub candidates: Vec<Candidate>,
    pub wall_s: f64,
}

/// Run the distributed search of `file` as a meta job over `description`; the root writes
/// its tables and plots into `out_dir`.
pub fn run_job(
    file: &Path,
    config: &SearchConfig,
    mode: ServiceMode,
    description: &str,
    out_dir: &Path,
    plots: bool,
) -> Result<JobResult> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let cfg_path = out_dir.join("metacomputer.cfg");
    std::fs::write(&cfg_path, description)
        .with_context(|| format!("writing {}", cfg_path.display()))?;
    let _ = std::fs::remove_file(out_dir.join("candidates.json"));
    let (addr, display) = spawn_display()?;
    let mut rank_args: Vec<OsString> = vec![
        "rank".into(),
        file.into(),
        "--config-json".into(),
        serde_json::to_string(config)?.into(),
        "--mode".into(),
        match mode {
            ServiceMode::RequestReply => "request",
            ServiceMode::Scheduled => "scheduled",
            ServiceMode::Dynamic => "dynamic",
        }
        .into(),
        "--description".into(),
        cfg_path.clone().into(),
        "--out-dir".into(),
        out_dir.into(),
    ];
    if !plots {
        rank_args.push("--no-plots".into());
    }
    // The links are probed at start-up and the plan takes the lower of the described and the
    // measured rate; PSRSEARCH_TRUST_LINKS=1 plans with the description's figures unprobed
    // (the paper's way; what a link slower than described then costs is the point).
    if std::env::var_os("PSRSEARCH_TRUST_LINKS").is_none_or(|v| v.is_empty() || v == "0") {
        rank_args.push("--measure-links".into());
    }
    if let Some(slow) = std::env::var_os("PSRSEARCH_SLOW_HOST") {
        let text = slow.to_string_lossy();
        parse_slow_host(&text).map_err(|e| anyhow::anyhow!("PSRSEARCH_SLOW_HOST: {e}"))?;
        rank_args.push("--slow-host".into());
        rank_args.push(slow);
    }
    let slow_link = match std::env::var_os("PSRSEARCH_SLOW_LINK") {
        Some(v) => {
            let text = v.to_string_lossy();
            let (name, factor) = text
                .rsplit_once(':')
                .and_then(|(n, f)| Some((n.to_string(), f.parse::<f64>().ok()?)))
                .ok_or_else(|| {
                    anyhow::anyhow!("PSRSEARCH_SLOW_LINK: `{text}`: expected NAME:FACTOR")
                })?;
            Some((name, factor))
        }
        None => None,
    };
    if let Some((name, factor)) = &slow_link {
        println!(
            "the link to {name} is emulated at {factor} of its described bandwidth (the plan is \
             not told)"
        );
    }
    let t = Instant::now();
    let outcome = metajob::run(&MetaJob {
        description_name: cfg_path.display().to_string(),
        description: description.to_string(),
        rank_args,
        env: vec![(PROGRESS_ENV.into(), addr.clone().into())],
        timeout: Duration::from_secs(600),
        stdin_to_root: false,
        slow_link,
    })?;
    let wall_s = t.elapsed().as_secs_f64();
    // The root has closed its end, or never connected (a job that failed before its first
    // report): a connection of our own then ends the display's wait in `accept`.
    if !display.is_finished() {
        let _ = TcpStream::connect(&addr);
    }
    let _ = display.join();
    if let Some(f) = &outcome.failure {
        bail!("the distributed search failed: {f}");
    }
    let json = out_dir.join("candidates.json");
    let text = std::fs::read_to_string(&json)
        .with_context(|| format!("reading {} written by the root", json.display()))?;
    let candidates = psrsearch::format::candidates::read_json(&mut text.as_bytes())
        .with_context(|| format!("parsing {}", json.display()))?;
    Ok(JobResult { candidates, wall_s })
}

/// The demo's metacomputer with a free port base.
pub fn demo_description() -> Result<String> {
    let probe = metajob::demo_description(40000);
    let links = metampi_config::parse_str("demo", &probe)?
        .layout()
        .links
        .len();
    Ok(metajob::demo_description(metajob::free_port_base(links)?))
}

/// Arguments of `psrsearch plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Baseband file to plan for (default: the demo observation, not simulated).
    pub file: Option<PathBuf>,
    /// Meta-computer description with BANDWIDTH (and LATENCY) on its PAIRs (default: the
    /// demo's).
    #[arg(long)]
    pub description: Option<PathBuf>,
    /// First trial DM (default: the demo's 0–64 in steps of 2).
    #[arg(long, default_value_t = 0.0)]
    pub dm_start: f64,
    /// Last trial DM.
    #[arg(long, default_value_t = 64.0)]
    pub dm_end: f64,
    /// DM step.
    #[arg(long, default_value_t = 2.0)]
    pub dm_step: f64,
    /// FFT length (default: chosen from the smear).
    #[arg(long)]
    pub fft_len: Option<usize>,
    /// Downsampling factor.
    #[arg(long, default_value_t = 32)]
    pub downsample: usize,
    /// Seconds per unit on one idle core (default: measured here on a synthetic block).
    #[arg(long)]
    pub tau_s: Option<f64>,
    /// Cores shared by the meta hosts with LAUNCH = local (default: this machine's).
    #[arg(long)]
    pub cores: Option<usize>,
    /// Read rate of the servers, MB/s.
    #[arg(long, default_value_t = 500.0)]
    pub disk_rate: f64,
    /// Clients per server.
    #[arg(long, default_value_t = distributed::MAX_CLIENTS_PER_SERVER)]
    pub clients_per_server: usize,
}

/// `psrsearch plan`: the static allocation, predicted time per host, and the fewest clients
/// that saturate each link.
pub fn plan_main(a: PlanArgs) -> Result<()> {
    let (text, name) = match &a.description {
        Some(p) => (
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            p.display().to_string(),
        ),
        None => (
            metajob::demo_description(40000),
            "the demo description".into(),
        ),
    };
    let layout = metampi_config::parse_auto(&name, &text)?.layout();
    let dms = dm_grid(a.dm_start, a.dm_end, a.dm_step);
    let mut pc = PlanConfig::default().downsample(a.downsample);
    pc.fft_len = a.fft_len;
    let (band, nsamples) = match &a.file {
        Some(f) => {
            let r = BasebandReader::open(f).with_context(|| format!("opening {}", f.display()))?;
            (r.band().clone(), r.nsamples())
        }
        None => {
            let o = psrsearch::demo::demo_observation(1);
            let rate = o.bandwidth_mhz.abs() * 1e6 / o.nchan as f64;
            let band = psrsearch::Band::from_total(
                o.centre_mhz,
                o.bandwidth_mhz,
                o.nchan,
                rate,
                o.complex,
                o.npol,
            );
            (band, o.nsamples as u64)
        }
    };
    let plan = DedispersionPlan::new(&band, &dms, &pc)?;
    let units = plan.num_blocks(nsamples);
    if units == 0 {
        bail!("the data hold no whole block of {} samples", plan.fft_len());
    }
    let tau = match a.tau_s {
        Some(t) => t,
        None => distributed::calibrate(&plan),
    };
    // Ranks: servers on the data host (the first), one per `clients_per_server` clients.
    let size: usize = layout.hosts.iter().map(|h| h.ranks.len()).sum();
    let per = a
        .clients_per_server
        .clamp(1, distributed::MAX_CLIENTS_PER_SERVER);
    let servers = size.div_ceil(per + 1).max(1);
    let clients_total = size.saturating_sub(servers);
    let local = layout
        .hosts
        .iter()
        .all(|h| matches!(h.launch, metampi_config::Launch::Local));
    let cores = a
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut hosts = Vec::new();
    for (i, h) in layout.hosts.iter().enumerate() {
        let clients = if i == 0 {
            h.ranks.len().saturating_sub(servers)
        } else {
            h.ranks.len()
        };
        let link = |from: usize, to: usize| -> Result<Option<(f64, f64)>> {
            let links: Vec<_> = layout.links_between(from, to).collect();
            if links.is_empty() {
                return Ok(None);
            }
            let mut bw = 0.0;
            let mut lat: f64 = 0.0;
            for l in links {
                let Some(b) = l.options.bandwidth else {
                    bail!(
                        "the link {} → {} has no BANDWIDTH; give one (or run the search, which measures it)",
                        layout.hosts[from].name,
                        layout.hosts[to].name
                    );
                };
                bw += b.bytes_per_sec() as f64;
                lat = lat.max(l.options.latency.map_or(0.0, |d| d.as_secs_f64()));
            }
            Ok(Some((bw, lat)))
        };
        let (bandwidth, return_bandwidth, latency_s) = if i == 0 {
            (None, None, 0.0)
        } else {
            let out = link(0, i)?.with_context(|| {
                if layout.direct.contains(&(0, i)) {
                    format!(
                        "{} and {} are paired directly (PAIR ... 0): no link with a BANDWIDTH to \
                         plan with; give the PAIR routers and a BANDWIDTH (or run the search, which \
                         measures it)",
                        layout.hosts[0].name, h.name
                    )
                } else {
                    format!("no PAIR from {} to {}", layout.hosts[0].name, h.name)
                }
            })?;
            let back = link(i, 0)?.map(|b| b.0);
            (Some(out.0), back.or(Some(out.0)), out.1)
        };
        hosts.push(HostModel {
            name: h.name.clone(),
            clients,
            proc_s: tau,
            bandwidth,
            return_bandwidth,
            latency_s,
            machine: None,
        });
    }
    let mut input = BalanceInput {
        hosts,
        units,
        unit_bytes: distributed::unit_bytes_8bit(&plan) as f64,
        result_bytes: distributed::result_bytes(&plan) as f64,
        disk_rate: a.disk_rate * 1e6,
        n_slopes: dms.len(),
        machines: Vec::new(),
    };
    // Meta hosts emulated on this machine share its cores with the servers and routers.
    let shared = local && clients_total > 0;
    if shared {
        let server_s = input.unit_bytes / input.disk_rate + distributed::server_unit_cpu_s(&plan);
        let socket = distributed::socket_cost_per_byte().unwrap_or(0.0);
        distributed::share_one_machine(&mut input, cores as f64, server_s, socket);
    }
    let alloc = balance::allocate(&input)?;
    println!(
        "{} DMs, FFT {} (step {}), {} units; τ·n_slopes = {:.4} s of CPU per unit{}",
        dms.len(),
        plan.fft_len(),
        plan.step(),
        units,
        tau,
        if shared {
            format!(
                "; {clients_total} clients, {servers} server(s) and the routers share {cores} \
                 cores here (the machine line below)"
            )
        } else {
            String::new()
        }
    );
    println!(
        "{} server(s) on {}; the data host is {}",
        servers, layout.hosts[0].name, layout.hosts[0].name
    );
    println!("{alloc}");
    for (h, a) in input.hosts.iter().zip(&alloc.hosts).skip(1) {
        println!(
            "fewest clients that saturate the link to {}: {} (it has {})",
            h.name, a.saturating_clients, h.clients
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, units: u64, predicted_s: f64, measured_s: f64) -> distributed::HostReport {
        distributed::HostReport {
            name: name.into(),
            clients: 2,
            pilot_units: 6,
            units,
            predicted_s,
            measured_s,
            busy_s: 0.0,
            idle_s: 0.0,
            done_units: units,
            cpu_s: 0.0,
        }
    }

    #[test]
    fn a_host_planned_nothing_has_no_difference_in_percent() {
        let table = host_table(&[host("near", 130, 1.0, 0.9), host("far", 0, 0.0, 0.11)]);
        let rows: Vec<&str> = table.lines().collect();
        assert!(rows[1].contains("-10%"), "{table}");
        assert!(rows[2].split_whitespace().nth(6) == Some("-"), "{table}");
    }
}
