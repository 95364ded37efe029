//! The routers' per-link statistics (`METAMPI_ROUTER_STATS=DIR`, rewritten twice a
//! second) as a table: `metampi links DIR`, and `metampi run --meta FILE --monitor SECS`,
//! which prints it while the job runs and once more at its end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::Value;

/// Arguments of `metampi links`.
#[derive(Debug, Args)]
pub struct LinksArgs {
    /// The statistics directory of a running or finished meta job (its routers'
    /// METAMPI_ROUTER_STATS)
    dir: PathBuf,
    /// The job's description: links are named by their meta hosts (`a -> b`)
    #[arg(long, value_name = "FILE")]
    meta: Option<PathBuf>,
    /// Print the table again every SECS seconds, with rates since the last one, until
    /// interrupted
    #[arg(long, value_name = "SECS")]
    every: Option<f64>,
}

/// `metampi links`.
pub fn execute(args: LinksArgs) -> anyhow::Result<u8> {
    let names = match &args.meta {
        Some(path) => Some(link_names(
            &metampi_config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?,
        )),
        None => None,
    };
    let mut before = None;
    loop {
        let now =
            Snapshot::read(&args.dir).with_context(|| format!("reading {}", args.dir.display()))?;
        print!("{}", now.table(before.as_ref(), names.as_ref()));
        let Some(secs) = args.every else {
            return Ok(0);
        };
        before = Some(now);
        std::thread::sleep(Duration::from_secs_f64(secs.max(0.1)));
        println!();
    }
}

/// Names of links and routers by their ids: `l3 a -> b`, `r1 a -> b`.
#[derive(Clone, Debug, Default)]
pub struct Names {
    links: BTreeMap<u64, String>,
    routers: BTreeMap<u64, String>,
}

/// The names of `cfg`'s links and routers.
pub fn link_names(cfg: &metampi_config::MetaConfig) -> Names {
    let layout = cfg.layout();
    let host = |h: usize| layout.hosts.get(h).map_or("?", |h| h.name.as_str());
    let name = |kind: char, id: usize, from: usize, to: usize| {
        (
            id as u64,
            format!("{kind}{id} {} -> {}", host(from), host(to)),
        )
    };
    Names {
        links: (layout.links.iter())
            .map(|l| name('l', l.id, l.from_host, l.to_host))
            .collect(),
        routers: (layout.routers.iter())
            .map(|r| name('r', r.id, r.host, r.peer))
            .collect(),
    }
}

/// The sending side of every link, and every router, as the routers last wrote them.
pub struct Snapshot {
    at: Instant,
    /// By link id: the `router-R-link-L-out.json` object.
    links: BTreeMap<u64, Value>,
    /// By router id: the `router-R.json` object.
    routers: BTreeMap<u64, Value>,
}

impl Snapshot {
    /// No router has written anything yet.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty() && self.routers.is_empty()
    }

    /// Reads `router-R-link-L-out.json` of `dir` (files being rewritten are skipped
    /// this time).
    pub fn read(dir: &Path) -> std::io::Result<Snapshot> {
        let (mut links, mut routers) = (BTreeMap::new(), BTreeMap::new());
        for e in std::fs::read_dir(dir)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(stem) = name
                .strip_prefix("router-")
                .and_then(|s| s.strip_suffix(".json"))
            else {
                continue;
            };
            let (map, id) = match stem.split_once("-link-") {
                Some((_, l)) => match l.strip_suffix("-out") {
                    Some(l) => (&mut links, l.parse::<u64>()),
                    None => continue,
                },
                None => (&mut routers, stem.parse::<u64>()),
            };
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            if let (Ok(id), Ok(v)) = (id, serde_json::from_str::<Value>(&text)) {
                map.insert(id, v);
            }
        }
        Ok(Snapshot {
            at: Instant::now(),
            links,
            routers,
        })
    }

    /// One line per link: what it sent, at what rate since `before`, how, and what
    /// waits; then one per router: its memory, its ranks, and what it holds for them
    /// and for its links.
    pub fn table(&self, before: Option<&Snapshot>, names: Option<&Names>) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<16} {:>10} {:>9} {:>9} {:>6} {:<15} {:>9} {:>10} {:>8} {:>7} {:>5}",
            "link",
            "sent MB",
            "MB/s",
            "frames",
            "ratio",
            "compression",
            "queue KB",
            "unacked KB",
            "srtt ms",
            "resent",
            "recon"
        );
        if self.links.is_empty() {
            let _ = writeln!(out, "(no link statistics yet)");
        }
        let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        for (id, v) in &self.links {
            let name = names
                .and_then(|m| m.links.get(id).cloned())
                .unwrap_or_else(|| format!("l{id}"));
            let sent = n(v, "bytes_out");
            let rate = before
                .and_then(|b| Some((b.links.get(id)?, self.at.duration_since(b.at))))
                .filter(|(_, dt)| !dt.is_zero())
                .map_or("-".to_string(), |(b, dt)| {
                    format!(
                        "{:.2}",
                        (sent - n(b, "bytes_out")).max(0.0) / dt.as_secs_f64() / 1e6
                    )
                });
            let mut mode = v
                .get("compression_mode")
                .and_then(Value::as_str)
                .unwrap_or("-")
                .to_string();
            // `CHECKSUM = off` (or TLS): the frames' CRC leaves the payload out.
            if v.get("payload_checksum_out").and_then(Value::as_bool) == Some(false) {
                mode.push_str("/nocrc");
            }
            let _ = writeln!(
                out,
                "{:<16} {:>10.2} {:>9} {:>9} {:>6.3} {:<15} {:>9.1} {:>10.1} {:>8.2} {:>7} {:>5}",
                name,
                sent / 1e6,
                rate,
                n(v, "frames_out"),
                n(v, "compression_ratio_out"),
                mode,
                n(v, "queued_bytes") / 1e3,
                n(v, "unacked_bytes") / 1e3,
                n(v, "srtt_us") / 1e3,
                n(v, "retransmits"),
                n(v, "reconnects"),
            );
        }
        for (id, v) in &self.routers {
            let name = names
                .and_then(|m| m.routers.get(id).cloned())
                .unwrap_or_else(|| format!("r{id}"));
            let _ = writeln!(
                out,
                "{name:<16} rss {:.1} MB (peak {:.1}; private {:.1}, peak {:.1}), \
                 messages {:.1} MB (peak {:.1} of {:.0}), \
                 {} ranks ({} through pipes), {} loans, {:.1} KB for ranks, {:.1} KB for links",
                n(v, "rss_kb") / 1e3,
                n(v, "peak_rss_kb") / 1e3,
                n(v, "anon_kb") / 1e3,
                n(v, "peak_anon_kb") / 1e3,
                n(v, "held_bytes") / 1e6,
                n(v, "peak_held_bytes") / 1e6,
                n(v, "budget_bytes") / 1e6,
                n(v, "ranks"),
                n(v, "pipe_ranks"),
                n(v, "loans"),
                n(v, "to_ranks_bytes") / 1e3,
                n(v, "send_buffered") / 1e3,
            );
        }
        out
    }
}

impl Snapshot {
    /// The same as [`Snapshot::table`], as JSON for `metampi run --web`: `links` (the sending
    /// side of each, with its rate since `before` in MB/s, `null` without one) and `routers`.
    pub fn json(&self, before: Option<&Snapshot>, names: Option<&Names>) -> Value {
        let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let links: Vec<Value> = (self.links.iter())
            .map(|(id, v)| {
                let rate = before
                    .and_then(|b| Some((b.links.get(id)?, self.at.duration_since(b.at))))
                    .filter(|(_, dt)| !dt.is_zero())
                    .map(|(b, dt)| {
                        (n(v, "bytes_out") - n(b, "bytes_out")).max(0.0) / dt.as_secs_f64() / 1e6
                    });
                serde_json::json!({
                    "id": id,
                    "name": names.and_then(|m| m.links.get(id).cloned())
                        .unwrap_or_else(|| format!("l{id}")),
                    "bytes_out": n(v, "bytes_out"),
                    "rate_mb_s": rate,
                    "frames_out": n(v, "frames_out"),
                    "compression_ratio": n(v, "compression_ratio_out"),
                    "compression_mode": v.get("compression_mode").and_then(Value::as_str).unwrap_or("-"),
                    "queued_bytes": n(v, "queued_bytes"),
                    "unacked_bytes": n(v, "unacked_bytes"),
                    "srtt_ms": n(v, "srtt_us") / 1e3,
                    "retransmits": n(v, "retransmits"),
                    "reconnects": n(v, "reconnects"),
                })
            })
            .collect();
        let routers: Vec<Value> = (self.routers.iter())
            .map(|(id, v)| {
                serde_json::json!({
                    "id": id,
                    "name": names.and_then(|m| m.routers.get(id).cloned())
                        .unwrap_or_else(|| format!("r{id}")),
                    "rss_mb": n(v, "rss_kb") / 1e3,
                    "held_mb": n(v, "held_bytes") / 1e6,
                    "budget_mb": n(v, "budget_bytes") / 1e6,
                    "ranks": n(v, "ranks"),
                    "loans": n(v, "loans"),
                    "to_ranks_kb": n(v, "to_ranks_bytes") / 1e3,
                    "for_links_kb": n(v, "send_buffered") / 1e3,
                })
            })
            .collect();
        serde_json::json!({ "links": links, "routers": routers })
    }

    /// When it was read.
    pub fn at(&self) -> Instant {
        self.at
    }
}

/// The routers' and links' part of a hang report: the table of what `dir` holds now,
/// empty where nothing can be read.
pub fn report(dir: &Path, names: &Names) -> String {
    match Snapshot::read(dir) {
        Ok(now) if !now.is_empty() => {
            format!("routers and links:\n{}", now.table(None, Some(names)))
        }
        _ => String::new(),
    }
}

/// The statistics directory of `metampi run --monitor`: the user's
/// `METAMPI_ROUTER_STATS`, or one made for the job and removed when dropped
/// (also where the job never starts).
pub struct StatsDir {
    path: PathBuf,
    own: bool,
}

impl StatsDir {
    /// `METAMPI_ROUTER_STATS` where set, else a fresh directory for this job.
    pub fn for_job() -> std::io::Result<StatsDir> {
        if let Some(d) = std::env::var_os("METAMPI_ROUTER_STATS") {
            return Ok(StatsDir {
                path: PathBuf::from(d),
                own: false,
            });
        }
        let path = std::env::temp_dir().join(format!("metampi-links-{}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(StatsDir { path, own: true })
    }

    /// Made for the job (the routers must be told where it is).
    pub fn own(&self) -> bool {
        self.own
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StatsDir {
    fn drop(&mut self) {
        if self.own {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// `metampi run --monitor`: a thread printing the table to stderr every `every`
/// until stopped; [`Monitor::finish`] prints the last one.
pub struct Monitor {
    dir: StatsDir,
    names: Names,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts watching `dir`.
    pub fn start(dir: StatsDir, names: Names, every: Duration) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (dir, names, stop) = (dir.path.clone(), names.clone(), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("metampi-monitor".into())
                .spawn(move || {
                    let mut before: Option<Snapshot> = None;
                    let mut next = Instant::now() + every;
                    while !stop.load(Ordering::Relaxed) {
                        if Instant::now() < next {
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        }
                        next += every;
                        if let Ok(now) = Snapshot::read(&dir) {
                            eprint!("{}", now.table(before.as_ref(), Some(&names)));
                            before = Some(now);
                        }
                    }
                })
                .ok()
        };
        Monitor {
            dir,
            names,
            stop,
            thread,
        }
    }

    /// Stops the thread and prints the links' totals (then a directory made for
    /// the job goes).
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Ok(now) = Snapshot::read(self.dir.path()) {
            eprintln!("metampi run: links at the end of the job:");
            eprint!("{}", now.table(None, Some(&self.names)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_links_and_rates_them_between_snapshots() {
        let dir = std::env::temp_dir().join(format!("metampi-links-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |bytes: u64| {
            std::fs::write(
                dir.join("router-0-link-2-out.json"),
                format!(
                    "{{\"bytes_out\":{bytes},\"frames_out\":10,\"compression_ratio_out\":0.5,\
                     \"compression_mode\":\"raw\",\"queued_bytes\":2048,\"unacked_bytes\":0,\
                     \"srtt_us\":1500,\"retransmits\":1,\"reconnects\":0,\
                     \"payload_checksum_out\":false}}"
                ),
            )
            .unwrap();
        };
        // The receiving side is not a row; a router's own file is one of its own.
        std::fs::write(dir.join("router-1-link-2-in.json"), "{}").unwrap();
        std::fs::write(
            dir.join("router-0.json"),
            "{\"rss_kb\":5000,\"peak_rss_kb\":6000,\"ranks\":2,\"pipe_ranks\":1,\"loans\":7,\
             \"to_ranks_bytes\":0,\"send_buffered\":1500,\"budget_bytes\":134217728,\
             \"held_bytes\":2500000,\"peak_held_bytes\":70000000,\"anon_kb\":3000,\
             \"peak_anon_kb\":4000}",
        )
        .unwrap();
        write(1_000_000);
        let mut a = Snapshot::read(&dir).unwrap();
        write(3_000_000);
        let b = Snapshot::read(&dir).unwrap();
        a.at = b.at - Duration::from_secs(2);
        let names = Names {
            links: BTreeMap::from([(2, "l2 a -> b".to_string())]),
            routers: BTreeMap::from([(0, "r0 a -> b".to_string())]),
        };
        let t = b.table(Some(&a), Some(&names));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert_eq!(
            lines[2],
            "r0 a -> b        rss 5.0 MB (peak 6.0; private 3.0, peak 4.0), \
             messages 2.5 MB (peak 70.0 of 134), \
             2 ranks (1 through pipes), 7 loans, \
             0.0 KB for ranks, 1.5 KB for links"
        );
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(&row[..4], ["l2", "a", "->", "b"], "{t}");
        assert_eq!(
            &row[4..],
            [
                "3.00",
                "1.00",
                "10",
                "0.500",
                "raw/nocrc",
                "2.0",
                "0.0",
                "1.50",
                "1",
                "0"
            ]
        );
        // Without an earlier snapshot there is no rate, and without names the id.
        let t = b.table(None, None);
        assert!(t.lines().nth(1).unwrap().starts_with("l2 "), "{t}");
        assert!(t.contains(" - "), "{t}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(Snapshot::read(&dir).is_err());
    }
}
