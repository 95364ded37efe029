//! Log-log SVG figures of bench results: latency (median) and bandwidth
//! against message size, one line per (run, operation), as in seed 001
//! Figs. 10–11. Plain SVG text, so it needs no fonts or graphics libraries.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::report::BenchReport;

const W: f64 = 560.0;
const H: f64 = 420.0;
const M: (f64, f64, f64, f64) = (70.0, 20.0, 40.0, 60.0); // left, right, top, bottom
const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    (a..=b).map(|e| 10f64.powi(e)).collect()
}

fn fmt_bytes(b: f64) -> String {
    match b {
        x if x >= 1048576.0 => format!("{}M", x / 1048576.0),
        x if x >= 1024.0 => format!("{}K", x / 1024.0),
        x => format!("{x}"),
    }
}

fn panel(svg: &mut String, x0: f64, title: &str, ylabel: &str, series: &[Series]) {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|p| p.0 > 0.0 && p.1 > 0.0)
        .collect();
    let _ = write!(
        svg,
        r#"<g transform="translate({x0},0)"><text x="{}" y="24" font-size="15" text-anchor="middle">{title}</text>"#,
        W / 2.0
    );
    if pts.is_empty() {
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" font-size="13" text-anchor="middle">no data</text></g>"#,
            W / 2.0,
            H / 2.0
        );
        return;
    }
    let (xmin, xmax) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
    let (ymin, ymax) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.1), a.1.max(p.1)));
    let (lx0, lx1) = (
        xmin.log2().floor(),
        xmax.log2().ceil().max(xmin.log2().floor() + 1.0),
    );
    let (ly0, ly1) = (
        ymin.log10().floor(),
        ymax.log10().ceil().max(ymin.log10().floor() + 1.0),
    );
    let pw = W - M.0 - M.1;
    let ph = H - M.2 - M.3;
    let sx = |x: f64| M.0 + (x.log2() - lx0) / (lx1 - lx0) * pw;
    let sy = |y: f64| M.2 + ph - (y.log10() - ly0) / (ly1 - ly0) * ph;
    let _ = write!(
        svg,
        r##"<rect x="{}" y="{}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##,
        M.0, M.2
    );
    let mut e = lx0;
    let step = ((lx1 - lx0) / 8.0).ceil().max(1.0);
    while e <= lx1 {
        let x = sx(2f64.powf(e));
        let _ = write!(
            svg,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" font-size="11" text-anchor="middle">{}</text>"##,
            M.2,
            M.2 + ph,
            M.2 + ph + 15.0,
            fmt_bytes(2f64.powf(e))
        );
        e += step;
    }
    for t in log_ticks(10f64.powf(ly0), 10f64.powf(ly1)) {
        let y = sy(t);
        let _ = write!(
            svg,
            r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" font-size="11" text-anchor="end">{t}</text>"##,
            M.0,
            M.0 + pw,
            M.0 - 5.0,
            y + 4.0
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">message size (bytes)</text>"#,
        M.0 + pw / 2.0,
        H - 25.0
    );
    let _ = write!(
        svg,
        r#"<text x="16" y="{}" font-size="12" text-anchor="middle" transform="rotate(-90 16 {})">{ylabel}</text>"#,
        M.2 + ph / 2.0,
        M.2 + ph / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if path.is_empty() {
            continue;
        }
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for p in &path {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(svg, r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{c}"/>"#);
        }
        let ly = M.2 + 14.0 + i as f64 * 15.0;
        let _ = write!(
            svg,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{c}" stroke-width="2"/><text x="{}" y="{}" font-size="11">{}</text>"#,
            M.0 + 8.0,
            ly - 4.0,
            M.0 + 26.0,
            ly - 4.0,
            M.0 + 30.0,
            ly,
            escape(&s.name)
        );
    }
    svg.push_str("</g>");
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Writes a two-panel figure: latency of non-bandwidth operations, bandwidth of the others.
pub fn write_svg(reports: &[BenchReport], path: &Path) -> Result<()> {
    let mut lat = Vec::new();
    let mut bw = Vec::new();
    for r in reports {
        let mut ops: Vec<&str> = r.results.iter().map(|x| x.op.as_str()).collect();
        ops.dedup();
        for op in ops {
            let rows: Vec<_> = r.results.iter().filter(|x| x.op == op).collect();
            let name = if reports.len() > 1 {
                format!("{} {op}", r.label)
            } else {
                op.to_string()
            };
            if rows.iter().any(|x| x.mbps.is_some()) {
                bw.push(Series {
                    name,
                    points: rows
                        .iter()
                        .map(|x| (x.bytes as f64, x.mbps.unwrap_or(0.0)))
                        .collect(),
                });
            } else if rows.len() > 1 {
                lat.push(Series {
                    name,
                    points: rows.iter().map(|x| (x.bytes as f64, x.median_us)).collect(),
                });
            }
        }
    }
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{H}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"#,
        2.0 * W
    );
    panel(&mut svg, 0.0, "latency (median)", "microseconds", &lat);
    panel(&mut svg, W, "bandwidth", "MB/s", &bw);
    svg.push_str("</svg>\n");
    std::fs::write(path, svg)?;
    Ok(())
}
