//! Log-log figures of bench results: latency (median) and bandwidth against
//! message size, one line per (run, operation), as in seed 001 Figs. 10–11.
//! SVG is written as plain text (no fonts or graphics libraries); PNG is drawn
//! with plotters' bitmap backend and the font of [`crate::font`].

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

/// The latency and bandwidth series of `reports`: one line per (run, operation).
fn series(reports: &[BenchReport]) -> (Vec<Series>, Vec<Series>) {
    let mut lat = Vec::new();
    let mut bw = Vec::new();
    for r in reports {
        // Operations in order of first appearance (rows of one file may interleave them).
        let mut ops: Vec<&str> = Vec::new();
        for x in &r.results {
            if !ops.contains(&x.op.as_str()) {
                ops.push(&x.op);
            }
        }
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
                // A ping-pong's bandwidth is its message over the one-way time (as NetPIPE and
                // MetaMPICH's figures draw it): the only bandwidth a run across sites may have.
                if op == "pingpong" {
                    bw.push(Series {
                        name: name.clone(),
                        points: rows
                            .iter()
                            .filter(|x| x.bytes > 0 && x.median_us > 0.0)
                            .map(|x| (x.bytes as f64, x.bytes as f64 / x.median_us))
                            .collect(),
                    });
                }
                lat.push(Series {
                    name,
                    points: rows.iter().map(|x| (x.bytes as f64, x.median_us)).collect(),
                });
            }
        }
    }
    (lat, bw)
}

/// Writes the figure as PNG when `path` ends in `.png`, as SVG otherwise.
pub fn write_plot(reports: &[BenchReport], path: &Path) -> Result<()> {
    let png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if png {
        write_png(reports, path)
    } else {
        write_svg(reports, path)
    }
}

/// Writes a two-panel figure: latency of non-bandwidth operations, bandwidth of the others.
pub fn write_svg(reports: &[BenchReport], path: &Path) -> Result<()> {
    let (lat, bw) = series(reports);
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

/// The same two panels as [`write_svg`], drawn into a PNG with plotters.
pub fn write_png(reports: &[BenchReport], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    crate::font::register();
    let (lat, bw) = series(reports);
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    let root = BitMapBackend::new(path, ((2.0 * W) as u32, H as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(W as u32);
    for (area, title, ylabel, series) in [
        (&left, "latency (median)", "microseconds", &lat),
        (&right, "bandwidth", "MB/s", &bw),
    ] {
        let pts: Vec<(f64, f64)> = series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            .collect();
        if pts.is_empty() {
            area.titled(&format!("{title}: no data"), ("sans-serif", 16))
                .map_err(|e| err(&e))?;
            continue;
        }
        let (xmin, xmax) = pts
            .iter()
            .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
        let (ymin, ymax) = pts
            .iter()
            .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.1), a.1.max(p.1)));
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (xmin.max(1.0) / 1.5..xmax * 1.5).log_scale().base(2.0),
                (ymin / 1.5..ymax * 1.5).log_scale(),
            )
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("message size (bytes)")
            .y_desc(ylabel)
            .x_label_formatter(&|x| fmt_bytes(2f64.powf(x.log2().round())))
            .y_label_formatter(&|y| format!("{y}"))
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, s) in series.iter().enumerate() {
            let hex = COLORS[i % COLORS.len()];
            let rgb = |k: usize| u8::from_str_radix(&hex[k..k + 2], 16).unwrap_or(0);
            let colour = RGBColor(rgb(1), rgb(3), rgb(5));
            let points: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|p| p.0 > 0.0 && p.1 > 0.0)
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(s.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, colour.filled())),
                )
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_and_svg_figures_are_written() {
        let text = r#"{"tool":"metampi bench","version":"0","label":"t","ranks":2,"pair":[0,1],
            "transport":"auto","results":[
            {"op":"pingpong","bytes":8,"iterations":10,"min_us":1.0,"median_us":1.5,"p90_us":2.0,
             "p99_us":2.0,"max_us":3.0,"mean_us":1.6,"mbps":null},
            {"op":"pingpong","bytes":1024,"iterations":10,"min_us":2.0,"median_us":2.5,"p90_us":3.0,
             "p99_us":3.0,"max_us":4.0,"mean_us":2.6,"mbps":null},
            {"op":"bw","bytes":8,"iterations":10,"min_us":1.0,"median_us":1.5,"p90_us":2.0,
             "p99_us":2.0,"max_us":3.0,"mean_us":1.6,"mbps":5.0},
            {"op":"bw","bytes":1024,"iterations":10,"min_us":1.0,"median_us":1.5,"p90_us":2.0,
             "p99_us":2.0,"max_us":3.0,"mean_us":1.6,"mbps":600.0}]}"#;
        let r: BenchReport = serde_json::from_str(text).unwrap();
        // Ping-pong draws latency and its bytes over one-way time; bw draws its own rate.
        let (lat, bw) = series(std::slice::from_ref(&r));
        assert_eq!(lat.len(), 1);
        assert_eq!(bw.len(), 2);
        assert_eq!(bw[0].points, vec![(8.0, 8.0 / 1.5), (1024.0, 1024.0 / 2.5)]);
        let dir = std::env::temp_dir().join(format!("metampi-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let png = dir.join("fig.png");
        write_plot(std::slice::from_ref(&r), &png).unwrap();
        let b = std::fs::read(&png).unwrap();
        assert!(b.starts_with(b"\x89PNG\r\n\x1a\n"));
        // Width and height in the IHDR chunk.
        assert_eq!(
            u32::from_be_bytes(b[16..20].try_into().unwrap()),
            2 * W as u32
        );
        assert_eq!(u32::from_be_bytes(b[20..24].try_into().unwrap()), H as u32);
        let svg = dir.join("fig.svg");
        write_plot(&[r.clone(), r], &svg).unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().contains("<polyline"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
