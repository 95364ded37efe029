//! `metampi trace DIR`: merge per-rank traces into one Chrome/Perfetto trace
//! file, print a summary, and draw a timeline picture.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;

use crate::png::Canvas;

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

fn load(dir: &Path) -> Result<Vec<RankTrace>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with("rank-") && name.ends_with(".trace")) {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
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
        out.push(RankTrace { h, events });
    }
    if out.is_empty() {
        bail!(
            "no rank-*.trace files in {} (run the job with `metampi run --trace {}`)",
            dir.display(),
            dir.display()
        );
    }
    out.sort_by_key(|r| r.h.rank);
    Ok(out)
}

fn is_comm(k: &str) -> bool {
    k != "region"
}

pub fn execute(args: TraceArgs) -> Result<u8> {
    let ranks = load(&args.dir)?;
    let t0 = ranks
        .iter()
        .flat_map(|r| r.events.iter().map(move |e| r.h.epoch_unix_ns + e.s))
        .min()
        .unwrap_or(0);
    let t1 = ranks
        .iter()
        .flat_map(|r| r.events.iter().map(move |e| r.h.epoch_unix_ns + e.e))
        .max()
        .unwrap_or(t0);
    let host_of: BTreeMap<i32, String> = ranks
        .iter()
        .map(|r| (r.h.rank as i32, r.h.host.clone()))
        .collect();

    // Chrome trace-event JSON: one track (tid) per rank.
    let mut json = String::from("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    let mut first = true;
    for r in &ranks {
        let sep = if first { "" } else { ",\n" };
        first = false;
        let _ = write!(
            json,
            "{sep}{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":\"rank {} ({})\"}}}}",
            r.h.rank,
            r.h.rank,
            r.h.host.replace('"', "")
        );
        for e in &r.events {
            let ts = (r.h.epoch_unix_ns + e.s - t0) as f64 / 1e3;
            let dur = (e.e - e.s) as f64 / 1e3;
            let name = if e.n.is_empty() {
                e.k.clone()
            } else {
                e.n.clone()
            };
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
    json.push_str("\n]}\n");
    let out_json = args.dir.join("trace.json");
    std::fs::write(&out_json, &json)?;

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
    for r in &ranks {
        for e in r.events.iter().filter(|e| e.k == "send" || e.k == "isend") {
            let p = pairs.entry((r.h.rank, e.p)).or_default();
            p.0 += 1;
            p.1 += e.b;
            let dst_host = host_of.get(&e.p).cloned().unwrap_or_else(|| "?".into());
            let m = machines.entry((r.h.host.clone(), dst_host)).or_default();
            m.0 += 1;
            m.1 += e.b;
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

    // Timeline picture: one lane per rank, colour by kind.
    let (w, lane) = (1200usize, 24usize);
    let mut c = Canvas::new(w, lane * ranks.len() + 8, [255, 255, 255]);
    let span = (t1 - t0).max(1) as f64;
    for (i, r) in ranks.iter().enumerate() {
        let y = 4 + i * lane;
        c.rect(0, y + lane / 2, w, y + lane / 2 + 1, [200, 200, 200]);
        for e in &r.events {
            let x0 = ((r.h.epoch_unix_ns + e.s - t0) as f64 / span * w as f64) as usize;
            let x1 =
                (((r.h.epoch_unix_ns + e.e - t0) as f64 / span * w as f64) as usize).max(x0 + 1);
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
    let out_png = args.dir.join("timeline.png");
    c.write(&out_png)?;
    println!(
        "\nwrote {} (open in ui.perfetto.dev or chrome://tracing) and {}",
        out_json.display(),
        out_png.display()
    );
    println!("timeline colours: send red, recv blue, wait purple, collectives orange, user regions green");
    Ok(0)
}
