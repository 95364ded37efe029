//! PNG plots of a search: S/N against DM, folded profiles, the periodogram, single pulses,
//! and for each top candidate a prepfold-style page ([`candidate_plot`]).
//!
//! Text uses a subset of DejaVu Sans (ASCII and a few symbols, 24 kB) compiled into the
//! binary, so plotting needs no system fonts; its licence is in `assets/`.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::diagnostics::FoldDiagnostics;
use crate::format::metadata::utc_text;
use crate::format::sigproc::{canonical_telescope, telescope_id};
use crate::search::{CandidateDetail, SearchOutcome};

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
    for d in &outcome.diagnostics {
        let Some(c) = outcome
            .candidates
            .iter()
            .find(|c| c.candidate.rank == d.rank)
        else {
            continue;
        };
        let p = dir.join(format!("candidate_{}.png", d.rank));
        candidate_plot(outcome, c, d, &p)?;
        written.push(p);
    }
    Ok(written)
}

/// Size of a [`candidate_plot`], pixels.
pub const CANDIDATE_PLOT_SIZE: (u32, u32) = (1500, 1000);

/// One candidate on one page, as prepfold draws it: a header in words (the observation:
/// source, telescope, position, start, length; the candidate: period, frequency, DM,
/// sigma, S/N, drift and acceleration), the profile twice over phase, sub-integrations
/// against phase, channel groups against phase (where there are several channels), S/N
/// against DM, S/N against period at the best period derivative, and the P-Pdot plane.
///
/// # Errors
/// If the file cannot be written.
pub fn candidate_plot(
    outcome: &SearchOutcome,
    c: &CandidateDetail,
    d: &FoldDiagnostics,
    path: &Path,
) -> Result<(), PlotError> {
    register_font();
    draw_candidate(outcome, c, d, path).map_err(|detail| PlotError {
        path: path.to_path_buf(),
        detail,
    })
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// A chart's text sizes and margins (pixels).
#[derive(Clone, Copy)]
struct Look {
    caption: u32,
    margin: u32,
    x_area: u32,
    y_area: u32,
    labels: u32,
}

/// A panel of a candidate page.
const PANEL: Look = Look {
    caption: 18,
    margin: 8,
    x_area: 35,
    y_area: 60,
    labels: 13,
};

/// A picture of its own.
const PAGE: Look = Look {
    caption: 24,
    margin: 12,
    x_area: 45,
    y_area: 60,
    labels: 15,
};

type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Axes over `range` (x, y) on `area`, captioned and described (`desc`: x, y), their labels
/// through [`axis_label`]; `grid`: mesh lines, which an image panel leaves out.
fn chart<'a, 'b>(
    area: &'a Area<'b>,
    look: Look,
    caption: &str,
    range: (std::ops::Range<f64>, std::ops::Range<f64>),
    desc: (&str, &str),
    grid: bool,
) -> Result<Chart<'a, 'b>, String> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", look.caption))
        .margin(look.margin)
        .x_label_area_size(look.x_area)
        .y_label_area_size(look.y_area)
        .build_cartesian_2d(range.0, range.1)
        .map_err(|e| e.to_string())?;
    let mut mesh = chart.configure_mesh();
    if !grid {
        mesh.disable_mesh();
    }
    mesh.x_desc(desc.0)
        .y_desc(desc.1)
        .label_style(("sans-serif", look.labels))
        .x_label_formatter(&|v| axis_label(*v))
        .y_label_formatter(&|v| axis_label(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(chart)
}

fn draw_candidate(
    outcome: &SearchOutcome,
    c: &CandidateDetail,
    d: &FoldDiagnostics,
    path: &Path,
) -> Result<(), String> {
    let root = BitMapBackend::new(path, CANDIDATE_PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (head, body) = root.split_vertically(165);
    header(&head, outcome, c, d)?;
    let columns = body.split_evenly((1, 3));
    let (profile_area, time_area) = columns[0].split_vertically(280);
    let (dm_area, freq_area) = columns[1].split_vertically(280);
    let (period_area, ppdot_area) = columns[2].split_vertically(280);
    profile_panel(&profile_area, &c.profile.means)?;
    let tobs = d.subint_s * d.subints.len() as f64;
    let rows: Vec<(f64, f64)> = (0..d.subints.len())
        .map(|i| (i as f64 * d.subint_s, (i + 1) as f64 * d.subint_s))
        .collect();
    phase_image(
        &time_area,
        "Sub-integrations",
        "Time (s)",
        &d.subints,
        &rows,
        (0.0, tobs.max(1e-9)),
        false,
    )?;
    snr_dm_panel(&dm_area, &outcome.dms, &c.snr_vs_dm, c.candidate.dm)?;
    if d.subbands.len() > 1 {
        let width = (d.subband_mhz[1] - d.subband_mhz[0]).abs();
        let rows: Vec<(f64, f64)> = d
            .subband_mhz
            .iter()
            .map(|f| (f - width / 2.0, f + width / 2.0))
            .collect();
        let lo = rows.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        let hi = rows.iter().map(|r| r.1).fold(f64::NEG_INFINITY, f64::max);
        phase_image(
            &freq_area,
            "Channels (each row normalised)",
            "Frequency (MHz)",
            &d.subbands,
            &rows,
            (lo, hi),
            true,
        )?;
    } else {
        let style = TextStyle::from(("sans-serif", 17).into_font()).color(&BLACK);
        freq_area
            .draw_text(
                "One frequency channel: no frequency panel",
                &style,
                (40, 200),
            )
            .map_err(|e| e.to_string())?;
    }
    period_panel(&period_area, d, c.candidate.period_s)?;
    ppdot_panel(&ppdot_area, d)?;
    root.present().map_err(|e| e.to_string())
}

fn header(
    area: &Area<'_>,
    outcome: &SearchOutcome,
    c: &CandidateDetail,
    d: &FoldDiagnostics,
) -> Result<(), String> {
    let m = &outcome.metadata;
    let k = &c.candidate;
    let unknown = |s: &str| {
        if s.is_empty() {
            "unknown".to_string()
        } else {
            s.to_string()
        }
    };
    let position = m.position.map_or_else(
        || "position unknown".to_string(),
        |p| format!("RA {}  Dec {} (J2000)", p.ra_text(), p.dec_text()),
    );
    let start = outcome.series_start_mjd().map_or_else(
        || "start unknown".to_string(),
        |mjd| format!("epoch MJD {mjd:.9} ({} UTC)", utc_text(mjd)),
    );
    let tobs = outcome.nsamples as f64 * outcome.tsamp_s;
    let band = outcome.band.as_ref().map_or_else(String::new, |b| {
        format!(
            ";  {:.3}-{:.3} MHz in {} channel(s)",
            b.lowest_mhz(),
            b.highest_mhz(),
            b.nchan()
        )
    });
    let pdot = -k.fdot_hz_s / (k.freq_hz * k.freq_hz);
    let drift = if outcome.zmax > 0.0 {
        format!(
            "fdot {:.6e} Hz/s   Pdot {pdot:.4e} s/s   acceleration {:.3} m/s^2   (zmax {})",
            k.fdot_hz_s, k.accel_ms2, outcome.zmax
        )
    } else {
        "no acceleration search: fdot, Pdot and acceleration 0".to_string()
    };
    let (best_row, best_col, best) = d.ppdot.best();
    let lines = [
        (
            format!(
                "Candidate {}   P = {:.9} ms   f = {:.8} Hz   DM = {:.3} pc cm^-3",
                k.rank,
                k.period_s * 1e3,
                k.freq_hz,
                k.dm
            ),
            22,
        ),
        (
            format!(
                "sigma {:.2}   folded S/N {:.2}   {} harmonic(s)   duty cycle {:.3}   found at {} DM(s){}",
                k.sigma,
                k.snr,
                k.nharm,
                k.duty,
                k.dm_hits,
                if k.flag.is_empty() {
                    String::new()
                } else {
                    format!("   flag {}", k.flag)
                }
            ),
            18,
        ),
        (drift, 18),
        (
            format!(
                "Source {}   telescope {} (SIGPROC id {})   {position}",
                unknown(&m.source),
                unknown(&canonical_telescope(&m.telescope)),
                telescope_id(&m.telescope)
            ),
            18,
        ),
        (
            format!(
                "{start};  {tobs:.3} s of {} samples of {:.3} us{band};  best P-Pdot trial S/N {best:.2} at dP {:.4e} s, dPdot {:.3e}",
                outcome.nsamples,
                outcome.tsamp_s * 1e6,
                d.ppdot.dp_s[best_col],
                d.ppdot.dpdot[best_row]
            ),
            16,
        ),
    ];
    let mut y = 12;
    for (text, size) in lines {
        let style = TextStyle::from(("sans-serif", size).into_font()).color(&BLACK);
        area.draw_text(&text, &style, (16, y))
            .map_err(|e| e.to_string())?;
        y += size + 12;
    }
    Ok(())
}

fn profile_panel(area: &Area<'_>, means: &[f64]) -> Result<(), String> {
    let nb = means.len();
    let mut sorted = means.to_vec();
    sorted.sort_by(f64::total_cmp);
    let base = sorted[nb / 2];
    let pts: Vec<(f64, f64)> = (0..2 * nb)
        .flat_map(|i| {
            let (x, y) = (i as f64 / nb as f64, means[i % nb] - base);
            [(x, y), (x + 1.0 / nb as f64, y)]
        })
        .collect();
    let (lo, hi) = range(pts.iter().map(|p| p.1));
    let mut chart = chart(
        area,
        PANEL,
        "Profile",
        (0.0..2.0, lo..hi),
        ("Phase (turns)", "Power above median"),
        true,
    )?;
    chart
        .draw_series(LineSeries::new(pts, BLACK.stroke_width(2)))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Phase bins of an image at most: finer bins hold too few samples each for a pulse to
/// stand out of the noise by eye.
const IMAGE_BINS: usize = 64;

/// `row` with adjacent bins averaged in groups, to at most `max` bins (the last group may
/// be smaller).
fn coarser(row: &[f64], max: usize) -> Vec<f64> {
    let k = row.len().div_ceil(max.max(1)).max(1);
    row.chunks(k)
        .map(|g| g.iter().sum::<f64>() / g.len() as f64)
        .collect()
}

/// Rows of a profile against phase as a greyscale image, two turns wide, darker for more
/// power, in at most [`IMAGE_BINS`] bins a turn. Each row's median is taken off (a slow change of the baseline would hide the
/// pulse); `own_scale` also divides each row by its spread (channels differ in gain).
fn phase_image(
    area: &Area<'_>,
    title: &str,
    y_desc: &str,
    rows: &[Vec<f64>],
    bounds: &[(f64, f64)],
    y_range: (f64, f64),
    own_scale: bool,
) -> Result<(), String> {
    let cleaned: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| coarser(r, IMAGE_BINS))
        .map(|r| {
            let mut sorted = r.clone();
            sorted.sort_by(f64::total_cmp);
            let med = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
            let spread = if own_scale {
                let var = r.iter().map(|v| (v - med).powi(2)).sum::<f64>() / r.len().max(1) as f64;
                var.sqrt().max(1e-300)
            } else {
                1.0
            };
            r.iter().map(|v| (v - med) / spread).collect()
        })
        .collect();
    let lo = cleaned
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let hi = cleaned
        .iter()
        .flatten()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let span = (hi - lo).max(1e-300);
    let mut chart = chart(
        area,
        PANEL,
        title,
        (0.0..2.0, y_range.0..y_range.1),
        ("Phase (turns)", y_desc),
        false,
    )?;
    let cells = cleaned.iter().zip(bounds).flat_map(|(row, &(y0, y1))| {
        let nb = row.len();
        (0..2 * nb).map(move |i| {
            let x0 = i as f64 / nb as f64;
            let level = 255.0 * (1.0 - (row[i % nb] - lo) / span);
            let g = level.clamp(0.0, 255.0) as u8;
            Rectangle::new(
                [(x0, y0), (x0 + 1.0 / nb as f64, y1)],
                RGBColor(g, g, g).filled(),
            )
        })
    });
    chart.draw_series(cells).map_err(|e| e.to_string())?;
    Ok(())
}

fn snr_dm_panel(area: &Area<'_>, dms: &[f64], snr: &[f64], best_dm: f64) -> Result<(), String> {
    let (dlo, dhi) = range(dms.iter().copied());
    let (slo, shi) = range(snr.iter().copied().chain([0.0]));
    let mut chart = chart(
        area,
        PANEL,
        "S/N against DM",
        (dlo..dhi, slo..shi),
        ("DM (pc cm^-3)", "Folded S/N"),
        true,
    )?;
    let pts: Vec<(f64, f64)> = dms.iter().copied().zip(snr.iter().copied()).collect();
    chart
        .draw_series(LineSeries::new(pts.clone(), COLOURS[0].stroke_width(2)))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(pts.iter().map(|p| Circle::new(*p, 2, COLOURS[0].filled())))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(
            [(best_dm, slo), (best_dm, shi)],
            COLOURS[1].stroke_width(1),
        ))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// A unit for period offsets (`µs` written `us`: the font has ASCII), and the factor to it.
fn period_unit(max_abs_s: f64) -> (&'static str, f64) {
    if max_abs_s >= 1e-3 {
        ("ms", 1e3)
    } else if max_abs_s >= 1e-6 {
        ("us", 1e6)
    } else {
        ("ns", 1e9)
    }
}

/// A power of ten that brings `max_abs` to between 1 and 1000, for an axis of tiny values.
fn decade(max_abs: f64) -> i32 {
    if max_abs > 0.0 && max_abs.is_finite() {
        (max_abs.log10().floor() as i32).div_euclid(3) * 3
    } else {
        0
    }
}

fn period_panel(area: &Area<'_>, d: &FoldDiagnostics, period_s: f64) -> Result<(), String> {
    let (row, _, _) = d.ppdot.best();
    let max = d.ppdot.dp_s.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (unit, k) = period_unit(max);
    let pts: Vec<(f64, f64)> = d
        .ppdot
        .dp_s
        .iter()
        .zip(&d.ppdot.snr[row])
        .map(|(p, s)| (p * k, *s))
        .collect();
    let (xlo, xhi) = range(pts.iter().map(|p| p.0));
    let (ylo, yhi) = range(pts.iter().map(|p| p.1).chain([0.0]));
    let mut chart = chart(
        area,
        PANEL,
        "S/N against period",
        (xlo..xhi, ylo..yhi),
        (
            &format!("P - P0 ({unit}), P0 = {:.6} ms", period_s * 1e3),
            "Folded S/N",
        ),
        true,
    )?;
    chart
        .draw_series(LineSeries::new(pts, COLOURS[0].stroke_width(2)))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// S/N as a colour: dark blue through green to yellow, as viridis runs.
fn heat(v: f64) -> RGBColor {
    const STOPS: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let x = v.clamp(0.0, 1.0) * (STOPS.len() - 1) as f64;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let t = x - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |p: f64, q: f64| (p + (q - p) * t).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

fn ppdot_panel(area: &Area<'_>, d: &FoldDiagnostics) -> Result<(), String> {
    let plane = &d.ppdot;
    let pmax = plane.dp_s.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (unit, k) = period_unit(pmax);
    let dmax = plane.dpdot.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let exp = decade(dmax);
    let kd = 10f64.powi(-exp);
    let half_cell = |v: &[f64], scale: f64| {
        v.get(1)
            .map_or(1.0, |b| (b - v[0]).abs() * scale / 2.0)
            .max(1e-300)
    };
    let (hx, hy) = (half_cell(&plane.dp_s, k), half_cell(&plane.dpdot, kd));
    let xs: Vec<f64> = plane.dp_s.iter().map(|p| p * k).collect();
    let ys: Vec<f64> = plane.dpdot.iter().map(|p| p * kd).collect();
    let (xlo, xhi) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min) - hx,
        xs.iter().copied().fold(f64::NEG_INFINITY, f64::max) + hx,
    );
    let (ylo, yhi) = (
        ys.iter().copied().fold(f64::INFINITY, f64::min) - hy,
        ys.iter().copied().fold(f64::NEG_INFINITY, f64::max) + hy,
    );
    let lo = plane
        .snr
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let hi = plane
        .snr
        .iter()
        .flatten()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let span = (hi - lo).max(1e-300);
    let y_desc = if exp == 0 {
        "Pdot - Pdot0 (s/s)".to_string()
    } else {
        format!("Pdot - Pdot0 (1e{exp} s/s)")
    };
    let mut chart = chart(
        area,
        PANEL,
        &format!("P-Pdot plane: S/N {lo:.1} (dark) to {hi:.1} (light)"),
        (xlo..xhi, ylo..yhi),
        (&format!("P - P0 ({unit})"), &y_desc),
        false,
    )?;
    let cells = ys.iter().zip(&plane.snr).flat_map(|(y, row)| {
        xs.iter().zip(row).map(move |(x, v)| {
            Rectangle::new(
                [(x - hx, y - hy), (x + hx, y + hy)],
                heat((v - lo) / span).filled(),
            )
        })
    });
    chart.draw_series(cells).map_err(|e| e.to_string())?;
    // The candidate itself, at the centre.
    chart
        .draw_series([Cross::new((0.0, 0.0), 6, WHITE.stroke_width(2))])
        .map_err(|e| e.to_string())?;
    Ok(())
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
    let mut chart = chart(
        &root,
        PAGE,
        "Folded S/N against trial DM",
        (dlo..dhi, slo..shi),
        ("DM (pc cm^-3)", "S/N"),
        true,
    )?;
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
    let mut chart = chart(
        &root,
        PAGE,
        &format!("Single pulses ({} events)", events.len()),
        (tlo..thi, dlo..dhi),
        ("time at the reference frequency (s)", "DM (pc cm^-3)"),
        true,
    )?;
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
    let mut chart = chart(
        &root,
        PAGE,
        &format!("Whitened power spectrum at DM {:.2}", outcome.spectrum_dm),
        (0.0..fmax, 0.0..pmax),
        ("Frequency (Hz)", "Normalised power"),
        true,
    )?;
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
    let mut chart = chart(
        &root,
        Look {
            caption: 22,
            margin: 12,
            x_area: 45,
            y_area: 70,
            labels: 15,
        },
        &format!(
            "#{}  P = {:.5} ms  DM = {:.2}  S/N = {:.1}",
            c.candidate.rank,
            c.candidate.period_s * 1e3,
            c.candidate.dm,
            c.candidate.snr
        ),
        (0.0..2.0, lo..hi),
        ("Pulse phase (cycles)", "Power above median"),
        true,
    )?;
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
    fn images_average_bins_in_groups_and_scales_read_well() {
        assert_eq!(coarser(&[1.0, 3.0, 5.0, 7.0, 9.0], 2), vec![3.0, 8.0]);
        assert_eq!(coarser(&[1.0, 2.0], 64), vec![1.0, 2.0]);
        assert_eq!(coarser(&vec![1.0; 256], 64).len(), 64);
        assert_eq!(heat(0.0), RGBColor(68, 1, 84));
        assert_eq!(heat(1.0), RGBColor(253, 231, 37));
        assert_eq!(heat(2.0), heat(1.0));
        assert_eq!(decade(3.6e-4), -6);
        assert_eq!(decade(1.75e-3), -3);
        assert_eq!(decade(0.0), 0);
        assert_eq!(period_unit(4.5e-5), ("us", 1e6));
        assert_eq!(period_unit(2e-3).0, "ms");
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
