//! `metampi trace DIR`: merge the rank and router traces into one
//! Chrome/Perfetto trace file (one track per rank and per router link), print
//! a summary, and draw a timeline picture.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use metampi::trace::{LINK_HEADER, LINK_MAGIC, LINK_RECEIVED, LINK_RECORD};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Deserialize;

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
    timeline(&ranks, &tracks, &sites.sites, (t0, t1), &out_png)?;
    println!(
        "\nwrote {} (open in ui.perfetto.dev or chrome://tracing) and {}",
        out_json.display(),
        out_png.display()
    );
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

/// Width of the timeline picture; its height grows with the rows.
const WIDTH: u32 = 1400;
/// Heights of a rank's row and of a router link's row, in pixels, while the rows fit in
/// [`MAX_ROWS_PX`]; past it every row shrinks alike (to 3 pixels at least) and only every
/// few rows keep a label.
const RANK_ROW: f64 = 28.0;
const LINK_ROW: f64 = 18.0;
const MAX_ROWS_PX: f64 = 2400.0;
/// A row's label needs about this many pixels of height to be read.
const LABEL_PX: f64 = 13.0;
/// Caption above the rows; time axis and legend strip below them.
const TOP_PX: f64 = 44.0;
const BOTTOM_PX: f64 = 96.0;
const LEGEND_PX: u32 = 34;

const SEND: RGBColor = RGBColor(214, 39, 40);
const RECV: RGBColor = RGBColor(31, 119, 180);
const WAIT: RGBColor = RGBColor(148, 103, 189);
const COLLECTIVE: RGBColor = RGBColor(255, 127, 14);
const REGION: RGBColor = RGBColor(44, 160, 44);
const OTHER: RGBColor = RGBColor(127, 127, 127);
const LINK_LANE: RGBColor = RGBColor(232, 232, 232);
const STRIPE: RGBColor = RGBColor(246, 246, 246);

/// The colour of an event kind (the kinds of `metampi::trace`).
fn kind_colour(kind: &str) -> RGBColor {
    match kind {
        "send" | "isend" => SEND,
        "recv" => RECV,
        "wait" => WAIT,
        "collective" => COLLECTIVE,
        "region" => REGION,
        _ => OTHER,
    }
}

/// The unit of the time axis, chosen from the span so that ticks read as short numbers.
fn time_unit(span_ns: u64) -> (&'static str, f64) {
    match span_ns {
        s if s < 2_000_000 => ("µs", 1e3),
        s if s < 20_000_000_000 => ("ms", 1e6),
        _ => ("s", 1e9),
    }
}

/// A tick label: at most three decimals, trailing zeros dropped, never `-0`.
fn tick(v: f64) -> String {
    let s = plotters::data::float::FloatPrettyPrinter {
        allow_scientific: false,
        min_decimal: 0,
        max_decimal: 3,
    }
    .print(v);
    match s.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_string(),
        _ => s,
    }
}

/// One row of the picture.
enum Row<'a> {
    Rank(&'a RankTrace),
    Link(&'a LinkTrack),
}

/// Timeline picture (PNG): one labelled row per rank with its calls coloured by kind and
/// user regions as a thin band on top, then a row per router link end with a tick for each
/// frame written or read; a time axis and a legend below.
///
/// `site_names` are the meta hosts' names by index (empty outside `--meta` jobs); `(t0, t1)`
/// the span drawn, in nanoseconds since the Unix epoch.
fn timeline(
    ranks: &[RankTrace],
    tracks: &[LinkTrack],
    site_names: &[String],
    (t0, t1): (u64, u64),
    path: &Path,
) -> Result<()> {
    crate::font::register();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    let rows: Vec<Row> = ranks
        .iter()
        .map(Row::Rank)
        .chain(tracks.iter().map(Row::Link))
        .collect();
    let full_px = RANK_ROW * ranks.len() as f64 + LINK_ROW * tracks.len() as f64;
    let scale = (MAX_ROWS_PX / full_px.max(1.0)).min(1.0);
    let height_of = |r: &Row| match r {
        Row::Rank(_) => (RANK_ROW * scale).max(3.0),
        Row::Link(_) => (LINK_ROW * scale).max(3.0),
    };
    let rows_px: f64 = rows.iter().map(height_of).sum();
    let height = (TOP_PX + rows_px.max(RANK_ROW) + BOTTOM_PX).ceil() as u32;

    let label_of = |r: &Row| match r {
        Row::Rank(t) => match t.h.site.and_then(|s| site_names.get(s)) {
            Some(site) => format!("rank {} ({}, site {site})", t.h.rank, t.h.host),
            None => format!("rank {} ({})", t.h.rank, t.h.host),
        },
        Row::Link(t) => t.name(),
    };
    let label_font = TextStyle::from(("sans-serif", 13).into_font());
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let label_w = rows
        .iter()
        .filter_map(|r| root.estimate_text_size(&label_of(r), &label_font).ok())
        .map(|(w, _)| w)
        .max()
        .unwrap_or(60)
        + 16;
    let (chart_area, legend_area) = root.split_vertically(height - LEGEND_PX);

    let span_ns = t1.saturating_sub(t0).max(1);
    let (unit, ns_per_unit) = time_unit(span_ns);
    let span = span_ns as f64 / ns_per_unit;
    let at = |t_ns: u64| t_ns.saturating_sub(t0) as f64 / ns_per_unit;
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(
            format!(
                "metampi trace: {} rank{}{}, {} {unit}",
                ranks.len(),
                if ranks.len() == 1 { "" } else { "s" },
                if tracks.is_empty() {
                    String::new()
                } else {
                    format!(", {} router link ends", tracks.len())
                },
                tick(span)
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .margin_right(24)
        .x_label_area_size(40)
        .y_label_area_size(label_w)
        .build_cartesian_2d(0.0..span, 0.0..rows_px.max(1.0))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_labels(12)
        .x_label_formatter(&|v| tick(*v))
        .x_desc(format!("time since the first call ({unit})"))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(RGBColor(236, 236, 236))
        .draw()
        .map_err(|e| err(&e))?;

    // Anything shorter than a pixel is drawn a pixel wide, or short calls would vanish.
    let plot_w = chart.plotting_area().dim_in_pixel().0.max(1);
    let pixel = span / plot_w as f64;
    let mut top = rows_px.max(1.0);
    for (i, row) in rows.iter().enumerate() {
        let h = height_of(row);
        let bottom = top - h;
        let band = |from: f64, to: f64| (top - h * from, top - h * to);
        let mut boxes: Vec<Rectangle<(f64, f64)>> = Vec::new();
        match row {
            Row::Rank(r) => {
                if i % 2 == 1 {
                    boxes.push(Rectangle::new(
                        [(0.0, top), (span, bottom)],
                        STRIPE.filled(),
                    ));
                }
                for e in &r.events {
                    let x0 = at(r.h.epoch_unix_ns + e.s);
                    let x1 = at(r.h.epoch_unix_ns + e.e).max(x0 + pixel);
                    let (ya, yb) = if e.k == "region" {
                        band(0.08, 0.3)
                    } else {
                        band(0.35, 0.92)
                    };
                    boxes.push(Rectangle::new(
                        [(x0, ya), (x1, yb)],
                        kind_colour(&e.k).filled(),
                    ));
                }
            }
            Row::Link(t) => {
                let (ya, yb) = band(0.1, 0.9);
                boxes.push(Rectangle::new([(0.0, ya), (span, yb)], LINK_LANE.filled()));
                for x in &t.recs {
                    let t_ns = t.epoch_unix_ns + x.t_ns;
                    if t_ns < t0 || t_ns > t1 {
                        continue;
                    }
                    let x0 = at(t_ns);
                    let colour = if x.received { RECV } else { SEND };
                    boxes.push(Rectangle::new(
                        [(x0, ya), (x0 + pixel, yb)],
                        colour.filled(),
                    ));
                }
            }
        }
        chart.draw_series(boxes).map_err(|e| err(&e))?;
        // Rows too thin for a label each get one every few rows, counted within ranks and
        // within links.
        let index = if i < ranks.len() { i } else { i - ranks.len() };
        if index % (LABEL_PX / h).ceil().max(1.0) as usize == 0 {
            let (px, py) = chart.backend_coord(&(0.0, top - h / 2.0));
            let style = label_font
                .color(&BLACK)
                .pos(Pos::new(HPos::Right, VPos::Center));
            root.draw(&Text::new(label_of(row), (px - 8, py), style))
                .map_err(|e| err(&e))?;
        }
        top = bottom;
    }

    legend(&legend_area, ranks, !tracks.is_empty(), label_w).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// The legend row under the time axis: a swatch and a name per colour in the picture.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    ranks: &[RankTrace],
    links: bool,
    left: u32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let mut entries: Vec<(&str, RGBColor, bool)> = vec![
        ("send", SEND, false),
        ("receive", RECV, false),
        ("wait", WAIT, false),
        ("collective", COLLECTIVE, false),
        ("user region (top band)", REGION, false),
    ];
    let known = ["send", "isend", "recv", "wait", "collective", "region"];
    if ranks
        .iter()
        .any(|r| r.events.iter().any(|e| !known.contains(&e.k.as_str())))
    {
        entries.push(("other", OTHER, false));
    }
    if links {
        entries.push(("link: frame written", SEND, true));
        entries.push(("link: bytes read", RECV, true));
    }
    let font = TextStyle::from(("sans-serif", 13).into_font());
    let mut x = left as i32 + 10;
    let y = 10;
    for (name, colour, tick_mark) in entries {
        if tick_mark {
            area.draw(&Rectangle::new(
                [(x, y), (x + 16, y + 12)],
                LINK_LANE.filled(),
            ))?;
            area.draw(&Rectangle::new(
                [(x + 7, y), (x + 9, y + 12)],
                colour.filled(),
            ))?;
        } else {
            area.draw(&Rectangle::new(
                [(x, y + 2), (x + 16, y + 12)],
                colour.filled(),
            ))?;
        }
        area.draw(&Text::new(
            name.to_string(),
            (x + 22, y + 6),
            font.color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        let w = area.estimate_text_size(name, &font).map_or(80, |(w, _)| w) as i32;
        x += 22 + w + 22;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` ranks each with one call of every kind over 10 ms, and `links` router link ends
    /// with a frame written and one read.
    fn fake(n: u32, links: u32) -> (Vec<RankTrace>, Vec<LinkTrack>) {
        let epoch = 1_700_000_000_000_000_000;
        let ranks = (0..n)
            .map(|rank| RankTrace {
                h: Header {
                    rank,
                    site: Some(rank as usize % 2),
                    epoch_unix_ns: epoch,
                    host: "node".into(),
                    dropped: 0,
                },
                events: ["send", "recv", "wait", "collective", "region"]
                    .iter()
                    .enumerate()
                    .map(|(i, k)| Ev {
                        k: k.to_string(),
                        n: String::new(),
                        p: 0,
                        t: 0,
                        b: 8,
                        c: 0,
                        s: i as u64 * 2_000_000,
                        e: i as u64 * 2_000_000 + 1_500_000,
                    })
                    .collect(),
            })
            .collect();
        let tracks = (0..links)
            .map(|link| LinkTrack {
                router: 0,
                peer: 1,
                outgoing: link % 2 == 0,
                link,
                epoch_unix_ns: epoch,
                recs: [false, true]
                    .iter()
                    .map(|&received| LinkRec {
                        t_ns: 3_000_000,
                        bytes: 128,
                        link,
                        received,
                    })
                    .collect(),
            })
            .collect();
        (ranks, tracks)
    }

    /// Width, height and RGB pixels of a PNG file, decoded.
    fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        pixels.truncate(info.buffer_size());
        (info.width, info.height, pixels)
    }

    fn has_colour(pixels: &[u8], c: RGBColor) -> bool {
        pixels.chunks_exact(3).any(|p| p == [c.0, c.1, c.2])
    }

    #[test]
    fn the_timeline_decodes_and_grows_with_its_rows() {
        let dir = std::env::temp_dir().join(format!("metampi-timeline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sites = vec!["a".to_string(), "b".to_string()];
        let mut sizes = Vec::new();
        for (n, links) in [(1, 0), (2, 0), (8, 0), (8, 4)] {
            let (ranks, tracks) = fake(n, links);
            let path = dir.join(format!("t{n}-{links}.png"));
            let span = (
                ranks[0].h.epoch_unix_ns,
                ranks[0].h.epoch_unix_ns + 10_000_000,
            );
            timeline(&ranks, &tracks, &sites, span, &path).unwrap();
            let (w, h, pixels) = decode(&path);
            for c in [SEND, RECV, WAIT, COLLECTIVE, REGION] {
                assert!(has_colour(&pixels, c), "{n} ranks: {c:?} missing");
            }
            // Link lanes are wide grey bands; text and grid lines may have a grey pixel of
            // that shade here and there.
            let lane = pixels
                .chunks_exact(3)
                .filter(|p| *p == [LINK_LANE.0, LINK_LANE.1, LINK_LANE.2])
                .count();
            assert_eq!(lane > 10_000, links > 0, "{lane} lane pixels");
            sizes.push((w, h));
        }
        assert!(sizes.iter().all(|&(w, _)| w == WIDTH), "{sizes:?}");
        let heights: Vec<u32> = sizes.iter().map(|s| s.1).collect();
        assert!(heights.windows(2).all(|p| p[0] < p[1]), "{heights:?}");
        // Six more rank rows and four link rows add their height, nothing else.
        assert_eq!(heights[2] - heights[1], 6 * RANK_ROW as u32);
        assert_eq!(heights[3] - heights[2], 4 * LINK_ROW as u32);

        // Thousands of ranks stay a picture one can open.
        let (ranks, _) = fake(5000, 0);
        let path = dir.join("many.png");
        let span = (
            ranks[0].h.epoch_unix_ns,
            ranks[0].h.epoch_unix_ns + 10_000_000,
        );
        timeline(&ranks, &[], &[], span, &path).unwrap();
        let (_, h, _) = decode(&path);
        assert!(h <= (TOP_PX + 3.0 * 5000.0 + BOTTOM_PX) as u32, "{h}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_time_unit_follows_the_span_and_ticks_never_read_minus_zero() {
        assert_eq!(time_unit(900_000).0, "µs");
        assert_eq!(time_unit(400_000_000).0, "ms");
        assert_eq!(time_unit(60_000_000_000).0, "s");
        assert_eq!(tick(-0.0), "0");
        assert_eq!(tick(-1e-9), "0");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(-2.5), "-2.5");
        assert_eq!(tick(400.0), "400");
    }
}
