//! `metampi trace DIR`: merge the rank and router traces into one
//! Chrome/Perfetto trace file (one track per rank and per router link), print
//! a summary, and draw a timeline picture.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use metampi::trace::{LINK_HEADER, LINK_MAGIC, LINK_RECEIVED, LINK_RECORD};
use serde::Deserialize;

use crate::png::Canvas;
use crate::progress::Progress;

/// Options of `metampi trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The directory given to `metampi run --trace`.
    dir: PathBuf,
    /// How many of the slowest calls to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
}

#[derive(Deserialize)]
struct Header {
    rank: u32,
    /// Meta host index (PACX numbering); absent in traces of older builds.
    #[serde(default)]
    site: Option<usize>,
    epoch_unix_ns: u64,
    host: String,
    dropped: u64,
}

#[derive(Deserialize, Clone)]
struct Ev {
    k: String,
    n: String,
    p: i32,
    t: i32,
    b: u64,
    c: u32,
    s: u64,
    e: u64,
}

struct RankTrace {
    h: Header,
    events: Vec<Ev>,
}

/// Header of a router's trace file for one connection to a peer router.
#[derive(Deserialize)]
struct LinkHeader {
    router: usize,
    /// `out`: the connection this router dials; `in`: one the peer dialled.
    dir: String,
    peer: usize,
    epoch_unix_ns: u64,
}

/// One record of a router link: bytes written to, or read from, a link.
#[derive(Clone, Copy)]
struct LinkRec {
    t_ns: u64,
    bytes: u64,
    link: u32,
    received: bool,
}

struct RouterTrace {
    h: LinkHeader,
    dropped: u64,
    recs: Vec<LinkRec>,
}

/// `sites.json`, written by `metampi run --meta --trace`.
#[derive(Deserialize, Default)]
struct Sites {
    sites: Vec<String>,
    /// Meta host of every router, by router id.
    routers: Vec<usize>,
}

/// The trace files of a directory whose names start with `prefix`.
fn trace_files(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(prefix) && name.ends_with(".trace") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

fn load_rank(path: &Path) -> Result<RankTrace> {
    let text = std::fs::read_to_string(path)?;
    let mut lines = text.lines();
    let h: Header = serde_json::from_str(lines.next().unwrap_or(""))
        .with_context(|| format!("{}: bad header", path.display()))?;
    let events = lines
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{}:{}: bad event", path.display(), i + 2))
        })
        .collect::<Result<Vec<Ev>>>()?;
    Ok(RankTrace { h, events })
}

/// Reads a router link file (format in `metampi::trace`): the records up to
/// the count in its header.
fn load_router(path: &Path) -> Result<RouterTrace> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut head = vec![0u8; LINK_HEADER];
    let bad = || anyhow::anyhow!("{}: not a router trace file", path.display());
    if f.read_exact(&mut head).is_err() || &head[..8] != LINK_MAGIC {
        return Err(bad());
    }
    // Only the used part: the file is sized (sparsely) for the maximum.
    let n = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
    let mut b = head;
    f.take(n.saturating_mul(LINK_RECORD as u64))
        .read_to_end(&mut b)
        .with_context(|| format!("reading {}", path.display()))?;
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
    let n = u64_at(8) as usize;
    let dropped = u64_at(16);
    let text = &b[24..LINK_HEADER];
    let end = text.iter().position(|&c| c == 0).unwrap_or(text.len());
    let h: LinkHeader = serde_json::from_slice(&text[..end])
        .with_context(|| format!("{}: bad header", path.display()))?;
    let avail = (b.len() - LINK_HEADER) / LINK_RECORD;
    let recs = b[LINK_HEADER..]
        .chunks_exact(LINK_RECORD)
        .take(n.min(avail))
        .map(|r| {
            let link = u32::from_le_bytes([r[12], r[13], r[14], r[15]]);
            LinkRec {
                t_ns: u64::from_le_bytes(r[..8].try_into().unwrap_or_default()),
                bytes: u32::from_le_bytes([r[8], r[9], r[10], r[11]]) as u64,
                link: link & !LINK_RECEIVED,
                received: link & LINK_RECEIVED != 0,
            }
        })
        .collect();
    Ok(RouterTrace { h, dropped, recs })
}

fn is_comm(k: &str) -> bool {
    k != "region"
}

/// One router link as seen by one router: the Perfetto track and timeline lane.
struct LinkTrack {
    router: usize,
    peer: usize,
    outgoing: bool,
    link: u32,
    epoch_unix_ns: u64,
    recs: Vec<LinkRec>,
}

impl LinkTrack {
    fn name(&self) -> String {
        let arrow = if self.outgoing { "to" } else { "from" };
        format!(
            "router {} link {} ({arrow} router {})",
            self.router, self.link, self.peer
        )
    }
}

pub fn execute(args: TraceArgs) -> Result<u8> {
    let rank_files = trace_files(&args.dir, "rank-")?;
    let router_files = trace_files(&args.dir, "router-")?;
    if rank_files.is_empty() {
        bail!(
            "no rank-*.trace files in {} (run the job with `metampi run --trace {}`)",
            args.dir.display(),
            args.dir.display()
        );
    }
    let nfiles = (rank_files.len() + router_files.len()) as u64;
    let mut progress = Progress::for_stderr("metampi trace", nfiles + 1);
    let mut ranks = Vec::new();
    for (i, p) in rank_files.iter().enumerate() {
        progress.update(i as u64, "reading rank traces", false);
        ranks.push(load_rank(p)?);
    }
    ranks.sort_by_key(|r| r.h.rank);
    let mut routers = Vec::new();
    for (i, p) in router_files.iter().enumerate() {
        progress.update(
            (rank_files.len() + i) as u64,
            "reading router traces",
            false,
        );
        routers.push(load_router(p)?);
    }
    let sites: Sites = match std::fs::read_to_string(args.dir.join("sites.json")) {
        Ok(t) => serde_json::from_str(&t).context("parsing sites.json")?,
        Err(_) => Sites::default(),
    };
    // One track per (router, link): a router's connection to a peer router
    // stripes over several links.
    let mut tracks: BTreeMap<(usize, bool, usize, u32), LinkTrack> = BTreeMap::new();
    for r in &routers {
        let outgoing = r.h.dir == "out";
        for rec in &r.recs {
            tracks
                .entry((r.h.router, !outgoing, r.h.peer, rec.link))
                .or_insert_with(|| LinkTrack {
                    router: r.h.router,
                    peer: r.h.peer,
                    outgoing,
                    link: rec.link,
                    epoch_unix_ns: r.h.epoch_unix_ns,
                    recs: Vec::new(),
                })
                .recs
                .push(*rec);
        }
    }
    let tracks: Vec<LinkTrack> = tracks.into_values().collect();

    // The job's span is the ranks' (routers start earlier and record their
    // connection set-up); the Perfetto file starts at the earliest record.
    let span = |times: &mut dyn Iterator<Item = u64>| {
        let (lo, hi) = times.fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
        (lo.min(hi), hi)
    };
    let (t0, t1) = span(&mut ranks.iter().flat_map(|r| {
        r.events
            .iter()
            .flat_map(move |e| [r.h.epoch_unix_ns + e.s, r.h.epoch_unix_ns + e.e])
    }));
    let (first_link, _) = span(
        &mut tracks
            .iter()
            .flat_map(|t| t.recs.iter().map(move |x| t.epoch_unix_ns + x.t_ns)),
    );
    let json_t0 = if tracks.is_empty() {
        t0
    } else {
        t0.min(first_link)
    };
    let host_of: BTreeMap<i32, String> = ranks
        .iter()
        .map(|r| (r.h.rank as i32, r.h.host.clone()))
        .collect();
    let site_of: BTreeMap<i32, usize> = ranks
        .iter()
        .filter_map(|r| Some((r.h.rank as i32, r.h.site?)))
        .collect();

    progress.update(nfiles, "writing trace.json", true);
    let out_json = args.dir.join("trace.json");
    std::fs::write(&out_json, perfetto_json(&ranks, &tracks, json_t0))?;
    drop(progress);

    // Summary.
    println!(
        "trace of {} ranks, {:.3} ms",
        ranks.len(),
        (t1 - t0) as f64 / 1e6
    );
    println!(
        "{:>6} {:>12} {:>12} {:>12} {:>8} {:>9}",
        "rank", "span(ms)", "comm(ms)", "compute(ms)", "comm%", "events"
    );
    for r in &ranks {
        let span = r
            .events
            .iter()
            .map(|e| e.e)
            .max()
            .unwrap_or(0)
            .saturating_sub(r.events.iter().map(|e| e.s).min().unwrap_or(0));
        let comm: u64 = r
            .events
            .iter()
            .filter(|e| is_comm(&e.k))
            .map(|e| e.e - e.s)
            .sum();
        let pct = if span > 0 {
            100.0 * comm as f64 / span as f64
        } else {
            0.0
        };
        println!(
            "{:>6} {:>12.3} {:>12.3} {:>12.3} {:>7.1}% {:>9}{}",
            r.h.rank,
            span as f64 / 1e6,
            comm as f64 / 1e6,
            span.saturating_sub(comm) as f64 / 1e6,
            pct,
            r.events.len(),
            if r.h.dropped > 0 {
                format!(" ({} dropped)", r.h.dropped)
            } else {
                String::new()
            }
        );
    }
    let mut pairs: BTreeMap<(u32, i32), (u64, u64)> = BTreeMap::new();
    let mut machines: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    // Per pair of meta hosts: messages and payload bytes sent by ranks, wire
    // bytes written by routers.
    let mut site_pairs: BTreeMap<(usize, usize), (u64, u64, u64)> = BTreeMap::new();
    for r in &ranks {
        for e in r.events.iter().filter(|e| e.k == "send" || e.k == "isend") {
            let p = pairs.entry((r.h.rank, e.p)).or_default();
            p.0 += 1;
            p.1 += e.b;
            let dst_host = host_of.get(&e.p).cloned().unwrap_or_else(|| "?".into());
            let m = machines.entry((r.h.host.clone(), dst_host)).or_default();
            m.0 += 1;
            m.1 += e.b;
            if let (Some(a), Some(&b)) = (r.h.site, site_of.get(&e.p)) {
                let s = site_pairs.entry((a, b)).or_default();
                s.0 += 1;
                s.1 += e.b;
            }
        }
    }
    let router_site = |r: usize| sites.routers.get(r).copied();
    for t in &tracks {
        if let (Some(a), Some(b)) = (router_site(t.router), router_site(t.peer)) {
            let sent: u64 = t.recs.iter().filter(|x| !x.received).map(|x| x.bytes).sum();
            site_pairs.entry((a, b)).or_default().2 += sent;
        }
    }
    println!("\nmessages by rank pair (point-to-point sends)");
    println!(
        "{:>6} {:>6} {:>10} {:>14}",
        "from", "to", "messages", "bytes"
    );
    for ((a, b), (n, bytes)) in &pairs {
        println!("{a:>6} {b:>6} {n:>10} {bytes:>14}");
    }
    println!("\nmessages by machine pair");
    for ((a, b), (n, bytes)) in &machines {
        println!("  {a} -> {b}: {n} messages, {bytes} bytes");
    }
    if site_pairs.keys().any(|(a, b)| a != b) {
        let name = |s: usize| {
            sites
                .sites
                .get(s)
                .cloned()
                .unwrap_or_else(|| format!("site{s}"))
        };
        println!("\nbytes by meta-host pair (payload: point-to-point sends of ranks; wire: written by routers on links)");
        println!(
            "{:>12} {:>12} {:>10} {:>14} {:>14}",
            "from", "to", "messages", "payload", "wire"
        );
        for ((a, b), (n, payload, wire)) in &site_pairs {
            println!(
                "{:>12} {:>12} {n:>10} {payload:>14} {wire:>14}",
                name(*a),
                name(*b)
            );
        }
    }
    if !tracks.is_empty() {
        println!("\nrouter links");
        println!(
            "{:<36} {:>9} {:>14} {:>9} {:>14}",
            "link", "frames", "bytes out", "reads", "bytes in"
        );
        for t in &tracks {
            let (mut f, mut bo, mut rd, mut bi) = (0u64, 0u64, 0u64, 0u64);
            for x in &t.recs {
                if x.received {
                    rd += 1;
                    bi += x.bytes;
                } else {
                    f += 1;
                    bo += x.bytes;
                }
            }
            println!("{:<36} {f:>9} {bo:>14} {rd:>9} {bi:>14}", t.name());
        }
        let dropped: u64 = routers.iter().map(|r| r.dropped).sum();
        if dropped > 0 {
            println!("  ({dropped} link records dropped: the files were full)");
        }
    }
    let mut all: Vec<(u32, &Ev)> = ranks
        .iter()
        .flat_map(|r| {
            r.events
                .iter()
                .filter(|e| is_comm(&e.k))
                .map(move |e| (r.h.rank, e))
        })
        .collect();
    all.sort_by_key(|(_, e)| std::cmp::Reverse(e.e - e.s));
    println!("\nslowest calls");
    for (rank, e) in all.iter().take(args.top) {
        println!(
            "  rank {rank:>3} {:>8} peer {:>4} tag {:>6} {:>10} bytes  {:>10.1} us",
            e.k,
            e.p,
            e.t,
            e.b,
            (e.e - e.s) as f64 / 1e3
        );
    }

    let out_png = args.dir.join("timeline.png");
    timeline(&ranks, &tracks, t0, t1).write(&out_png)?;
    println!(
        "\nwrote {} (open in ui.perfetto.dev or chrome://tracing) and {}",
        out_json.display(),
        out_png.display()
    );
    println!("timeline colours: send red, recv blue, wait purple, collectives orange, user regions green; router link lanes (grey) mark bytes written red, read blue");
    Ok(0)
}

/// Chrome trace-event JSON: ranks are threads of process 0, router links
/// threads of process 1 (one per router end of each link).
fn perfetto_json(ranks: &[RankTrace], tracks: &[LinkTrack], t0: u64) -> String {
    let mut json = String::from("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    let _ = write!(
        json,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{{\"name\":\"ranks\"}}}}"
    );
    for r in ranks {
        let _ = write!(
            json,
            ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":\"rank {} ({})\"}}}}",
            r.h.rank,
            r.h.rank,
            r.h.host.replace('"', "")
        );
        for e in &r.events {
            let ts = (r.h.epoch_unix_ns + e.s).saturating_sub(t0) as f64 / 1e3;
            let dur = (e.e - e.s) as f64 / 1e3;
            let name = if e.n.is_empty() { &e.k } else { &e.n };
            let _ = write!(
                json,
                ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{ts:.3},\"dur\":{dur:.3},\"pid\":0,\"tid\":{},\"args\":{{\"peer\":{},\"tag\":{},\"bytes\":{},\"context\":{}}}}}",
                name.replace('"', ""),
                e.k,
                r.h.rank,
                e.p,
                e.t,
                e.b,
                e.c
            );
        }
    }
    if !tracks.is_empty() {
        let _ = write!(
            json,
            ",\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{{\"name\":\"router links\"}}}}"
        );
    }
    for (i, t) in tracks.iter().enumerate() {
        let _ = write!(
            json,
            ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{i},\"args\":{{\"name\":\"{}\"}}}}",
            t.name()
        );
        for x in &t.recs {
            let ts = (t.epoch_unix_ns + x.t_ns).saturating_sub(t0) as f64 / 1e3;
            let (name, cat) = if x.received {
                ("read", "link-in")
            } else {
                ("frame", "link-out")
            };
            let _ = write!(
                json,
                ",\n{{\"name\":\"{name}\",\"cat\":\"{cat}\",\"ph\":\"X\",\"ts\":{ts:.3},\"dur\":0,\"pid\":1,\"tid\":{i},\"args\":{{\"bytes\":{},\"link\":{}}}}}",
                x.bytes, t.link
            );
        }
    }
    json.push_str("\n]}\n");
    json
}

/// Timeline picture: one lane per rank, colour by kind, then a thin lane per
/// router link with a tick for each frame written or read.
fn timeline(ranks: &[RankTrace], tracks: &[LinkTrack], t0: u64, t1: u64) -> Canvas {
    let (w, lane, link_lane) = (1200usize, 24usize, 10usize);
    let h = lane * ranks.len() + link_lane * tracks.len() + 8;
    let mut c = Canvas::new(w, h, [255, 255, 255]);
    let span = (t1 - t0).max(1) as f64;
    let x_of = |t: u64| (t.saturating_sub(t0) as f64 / span * w as f64) as usize;
    for (i, r) in ranks.iter().enumerate() {
        let y = 4 + i * lane;
        c.rect(0, y + lane / 2, w, y + lane / 2 + 1, [200, 200, 200]);
        for e in &r.events {
            let x0 = x_of(r.h.epoch_unix_ns + e.s);
            let x1 = x_of(r.h.epoch_unix_ns + e.e).max(x0 + 1);
            let col = match e.k.as_str() {
                "send" | "isend" => [214, 39, 40],
                "recv" => [31, 119, 180],
                "wait" => [148, 103, 189],
                "region" => [44, 160, 44],
                "collective" => [255, 127, 14],
                _ => [127, 127, 127],
            };
            let (ya, yb) = if e.k == "region" {
                (y + 2, y + 6)
            } else {
                (y + 7, y + lane - 3)
            };
            c.rect(x0, ya, x1, yb, col);
        }
    }
    for (i, t) in tracks.iter().enumerate() {
        let y = 4 + ranks.len() * lane + i * link_lane;
        c.rect(0, y, w, y + link_lane - 2, [235, 235, 235]);
        for x in &t.recs {
            let at = t.epoch_unix_ns + x.t_ns;
            if at < t0 || at > t1 {
                continue;
            }
            let x0 = x_of(at).min(w - 1);
            let col = if x.received {
                [31, 119, 180]
            } else {
                [214, 39, 40]
            };
            c.rect(x0, y + 1, x0 + 1, y + link_lane - 3, col);
        }
    }
    c
}
