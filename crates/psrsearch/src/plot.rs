//! PNG plots of a search: S/N against DM, folded profiles, the periodogram, single pulses.
//!
//! Text uses a subset of DejaVu Sans (ASCII and a few symbols, 24 kB) compiled into the
//! binary, so plotting needs no system fonts; its licence is in `assets/`.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::search::SearchOutcome;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");
static REGISTER: Once = Once::new();

/// A plot could not be drawn or saved.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {detail}")]
pub struct PlotError {
    /// File being drawn.
    pub path: PathBuf,
    /// What went wrong.
    pub detail: String,
}

fn register_font() {
    REGISTER.call_once(|| {
        // The font is compiled in and known to parse; a failure would only lose the labels.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

const COLOURS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// Draw all plots for `outcome` into `dir` (created if needed); returns the files written.
///
/// # Errors
/// If the directory cannot be created or a plot cannot be drawn.
pub fn plot_outcome(outcome: &SearchOutcome, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    register_font();
    std::fs::create_dir_all(dir).map_err(|e| PlotError {
        path: dir.to_path_buf(),
        detail: e.to_string(),
    })?;
    let mut written = Vec::new();
    let p = dir.join("snr_vs_dm.png");
    snr_vs_dm(outcome, &p).map_err(|detail| PlotError {
        path: p.clone(),
        detail,
    })?;
    written.push(p);
    let p = dir.join("periodogram.png");
    periodogram(outcome, &p).map_err(|detail| PlotError {
        path: p.clone(),
        detail,
    })?;
    written.push(p);
    if let Some(events) = &outcome.single_pulses {
        let p = dir.join("single_pulses.png");
        single_pulses(events, &outcome.dms, &p).map_err(|detail| PlotError {
            path: p.clone(),
            detail,
        })?;
        written.push(p);
    }
    for c in outcome.candidates.iter().take(5) {
        let p = dir.join(format!("profile_{}.png", c.candidate.rank));
        profile(c, &p).map_err(|detail| PlotError {
            path: p.clone(),
            detail,
        })?;
        written.push(p);
    }
    Ok(written)
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
        (l.min(v), h.max(v))
    });
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo <= 1e-9 * lo.abs().max(1.0) {
        // One value (an empty plot's lone zero): a unit either side, so the ticks are
        // distinct numbers rather than a column of the same rounded one.
        return (lo - 1.0, hi + 1.0);
    }
    let pad = (hi - lo) * 0.05;
    (lo - pad, hi + pad)
}

/// An axis tick label as plotters writes it (one to five decimals), except that a value
/// that rounds to zero is `0.0`, never `-0.0`.
fn axis_label(v: f64) -> String {
    let s = plotters::data::float::FloatPrettyPrinter {
        allow_scientific: false,
        min_decimal: 1,
        max_decimal: 5,
    }
    .print(v);
    match s.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_string(),
        _ => s,
    }
}

fn snr_vs_dm(outcome: &SearchOutcome, path: &Path) -> Result<(), String> {
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let shown = &outcome.candidates[..outcome.candidates.len().min(5)];
    let (dlo, dhi) = range(outcome.dms.iter().copied());
    let (slo, shi) = range(
        shown
            .iter()
            .flat_map(|c| c.snr_vs_dm.iter().copied())
            .chain([0.0]),
    );
    let mut chart = ChartBuilder::on(&root)
        .caption("Folded S/N against trial DM", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(dlo..dhi, slo..shi)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("DM (pc cm^-3)")
        .y_desc("S/N")
        .label_style(("sans-serif", 15))
        .x_label_formatter(&|v| axis_label(*v))
        .y_label_formatter(&|v| axis_label(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, c) in shown.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<(f64, f64)> = outcome
            .dms
            .iter()
            .copied()
            .zip(c.snr_vs_dm.iter().copied())
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(format!(
                "#{} P = {:.4} ms",
                c.candidate.rank,
                c.candidate.period_s * 1e3
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, colour.filled())))
            .map_err(|e| e.to_string())?;
    }
    if !shown.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// Single-pulse events as DM against time, each a circle whose size grows with its S/N.
fn single_pulses(
    events: &[crate::single_pulse::SinglePulse],
    dms: &[f64],
    path: &Path,
) -> Result<(), String> {
    let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (tlo, thi) = range(events.iter().map(|e| e.time_s).chain([0.0]));
    let (dlo, dhi) = range(dms.iter().copied());
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Single pulses ({} events)", events.len()),
            ("sans-serif", 24),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(tlo..thi, dlo..dhi)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("time at the reference frequency (s)")
        .y_desc("DM (pc cm^-3)")
        .label_style(("sans-serif", 15))
        .x_label_formatter(&|v| axis_label(*v))
        .y_label_formatter(&|v| axis_label(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    let floor = events.iter().map(|e| e.sigma).fold(f64::INFINITY, f64::min);
    let top = events
        .iter()
        .map(|e| e.sigma)
        .fold(f64::NEG_INFINITY, f64::max);
    let span = (top - floor).max(1e-9);
    chart
        .draw_series(events.iter().map(|e| {
            let r = (2.0 + 18.0 * (e.sigma - floor) / span) as i32;
            Circle::new((e.time_s, e.dm), r, COLOURS[0].mix(0.6).stroke_width(2))
        }))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

fn periodogram(outcome: &SearchOutcome, path: &Path) -> Result<(), String> {
    let root = BitMapBackend::new(path, (1000, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let full = &outcome.spectrum.power;
    let df = outcome.spectrum.df_hz;
    // Show up to a little past the highest harmonic summed for the candidates shown.
    let top = outcome
        .candidates
        .iter()
        .take(5)
        .map(|c| c.candidate.freq_hz * c.candidate.nharm.max(1) as f64 * 1.25)
        .fold(0.0, f64::max);
    let all = full.len() as f64 * df;
    let fmax = if top > 0.0 { top.min(all) } else { all };
    let power = &full[..((fmax / df) as usize)
        .clamp(1, full.len().max(1))
        .min(full.len())];
    // Keep the plot to ~2000 points: the maximum of each group keeps narrow peaks visible.
    let group = power.len().div_ceil(2000).max(1);
    let pts: Vec<(f64, f64)> = power
        .chunks(group)
        .enumerate()
        .map(|(i, g)| {
            let m = g.iter().copied().fold(0.0f32, f32::max);
            ((i * group) as f64 * df, m as f64)
        })
        .collect();
    let pmax = pts.iter().map(|p| p.1).fold(1.0, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Whitened power spectrum at DM {:.2}", outcome.spectrum_dm),
            ("sans-serif", 24),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..fmax, 0.0..pmax)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("Frequency (Hz)")
        .y_desc("Normalised power")
        .label_style(("sans-serif", 15))
        .x_label_formatter(&|v| axis_label(*v))
        .y_label_formatter(&|v| axis_label(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(pts, COLOURS[0].stroke_width(1)))
        .map_err(|e| e.to_string())?;
    for (i, c) in outcome.candidates.iter().take(5).enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let f = c.candidate.freq_hz;
        chart
            .draw_series(
                (1..=c.candidate.nharm.max(1))
                    .filter(|h| *h as f64 * f < fmax)
                    .map(|h| TriangleMarker::new((h as f64 * f, pmax * 0.97), 5, colour.filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

fn profile(c: &crate::search::CandidateDetail, path: &Path) -> Result<(), String> {
    let root = BitMapBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let means = &c.profile.means;
    let nb = means.len();
    let mut sorted = means.clone();
    sorted.sort_by(f64::total_cmp);
    let base = sorted[nb / 2];
    // Two rotations, as pulsar astronomers draw them.
    let pts: Vec<(f64, f64)> = (0..2 * nb)
        .map(|i| ((i as f64 + 0.5) / nb as f64, means[i % nb] - base))
        .collect();
    let (lo, hi) = range(pts.iter().map(|p| p.1));
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "#{}  P = {:.5} ms  DM = {:.2}  S/N = {:.1}",
                c.candidate.rank,
                c.candidate.period_s * 1e3,
                c.candidate.dm,
                c.candidate.snr
            ),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..2.0, lo..hi)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("Pulse phase (cycles)")
        .y_desc("Power above median")
        .label_style(("sans-serif", 15))
        .x_label_formatter(&|v| axis_label(*v))
        .y_label_formatter(&|v| axis_label(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    let step: Vec<(f64, f64)> = pts
        .iter()
        .flat_map(|(x, y)| {
            let w = 0.5 / nb as f64;
            [(x - w, *y), (x + w, *y)]
        })
        .collect();
    chart
        .draw_series(LineSeries::new(step, BLACK.stroke_width(2)))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_never_read_negative_zero() {
        // plotters' own printer writes `-0.0` for -1e-9 and -5e-10, the lowest ticks of the
        // ±1e-9 range an empty S/N plot had.
        for zero in [0.0, -0.0, -1e-9, -4e-17, 1e-12] {
            assert_eq!(axis_label(zero), "0.0", "{zero:e}");
        }
        assert_eq!(axis_label(-0.5), "-0.5");
        assert_eq!(axis_label(-3.0), "-3.0");
        assert_eq!(axis_label(2.25), "2.25");
        assert_eq!(axis_label(12.0), "12.0");
    }

    #[test]
    fn a_lone_value_gets_a_unit_either_side() {
        assert_eq!(range([0.0].into_iter()), (-1.0, 1.0));
        assert_eq!(range([5.0, 5.0].into_iter()), (4.0, 6.0));
        assert_eq!(range(std::iter::empty()), (0.0, 1.0));
        let (lo, hi) = range([0.0, 10.0].into_iter());
        assert!((lo + 0.5).abs() < 1e-12 && (hi - 10.5).abs() < 1e-12);
    }
}
