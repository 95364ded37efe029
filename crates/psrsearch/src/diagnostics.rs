//! What a person needs to judge a candidate, as numbers: prepfold's panels. The pulse in
//! sub-integrations (does it last the whole observation?), in groups of frequency channels
//! (is it dispersed as a pulsar is, and broadband?), and the folded S/N over a small grid of
//! period and period derivative around the candidate (is the candidate at the peak?).
//! [`crate::plot`] draws them.
//!
//! Everything is folded at the candidate's own frequency, its drift taken out as the search
//! did ([`fold::dedrift`]), with its profile's number of bins, so the sub-integrations add up
//! to the candidate's profile bin for bin. The P-Pdot plane is prepfold's: each trial
//! `(δf, δḟ)` shifts every sub-integration's profile by the phase that trial accumulates,
//! `δf·t + δḟ·t²/2` (`t` from the middle of the observation), and sums them; no refold of
//! the series is needed.

use serde::{Deserialize, Serialize};

use crate::assemble::{DmSeries, PowerAssembler};
use crate::fold;
use crate::search::CandidateDetail;

/// Sub-integrations at most (fewer where one would span under two turns of the pulsar).
pub const MAX_SUBINTS: usize = 32;
/// Groups of adjacent channels at most.
pub const MAX_SUBBANDS: usize = 32;
/// Trials along each axis of the P-Pdot plane: odd, so that the candidate is the centre.
pub const PPDOT_STEPS: usize = 33;

/// The folds behind one candidate's plot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FoldDiagnostics {
    /// The candidate's rank.
    pub rank: usize,
    /// Mean of each phase bin in each sub-integration, `[subint][bin]`.
    pub subints: Vec<Vec<f64>>,
    /// Duration of a sub-integration, s.
    pub subint_s: f64,
    /// Mean of each phase bin in each group of adjacent channels, `[group][bin]`, in the
    /// input's channel order; empty for one channel, or where channels were not kept.
    pub subbands: Vec<Vec<f64>>,
    /// Centre frequency of each group, MHz.
    pub subband_mhz: Vec<f64>,
    /// Folded S/N around the candidate's period and period derivative.
    pub ppdot: PpdotPlane,
}

/// Folded S/N over a grid of period and period derivative centred on a candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PpdotPlane {
    /// Period offset of each column from the candidate's period, s.
    pub dp_s: Vec<f64>,
    /// Period-derivative offset of each row from the candidate's, s/s.
    pub dpdot: Vec<f64>,
    /// S/N of the fold at each trial, `[row][column]`, with the candidate's pulse width.
    pub snr: Vec<Vec<f64>>,
}

impl PpdotPlane {
    /// Row, column and S/N of the best trial.
    pub fn best(&self) -> (usize, usize, f64) {
        let mut best = (0, 0, f64::NEG_INFINITY);
        for (r, row) in self.snr.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                if *v > best.2 {
                    best = (r, c, *v);
                }
            }
        }
        best
    }
}

/// Per-channel series behind the assembled ones, for the frequency panel.
#[derive(Clone, Copy)]
pub struct Channels<'a> {
    /// The assembler the series came from ([`PowerAssembler::filterbank`]).
    pub assembler: &'a PowerAssembler,
    /// Centre frequency of each channel, MHz.
    pub centre_mhz: &'a [f64],
}

/// The folds for the first `count` of `candidates`, found in `series` (the search's, in DM
/// order) at each candidate's DM; `channels` adds the frequency panel. A candidate whose
/// DM is not among the series is skipped.
pub fn diagnose(
    series: &[DmSeries],
    channels: Option<Channels<'_>>,
    candidates: &[CandidateDetail],
    count: usize,
) -> Vec<FoldDiagnostics> {
    candidates
        .iter()
        .take(count)
        .filter_map(|c| diagnose_one(series, channels, c))
        .collect()
}

fn diagnose_one(
    series: &[DmSeries],
    channels: Option<Channels<'_>>,
    c: &CandidateDetail,
) -> Option<FoldDiagnostics> {
    let k = series.iter().position(|s| s.dm == c.candidate.dm)?;
    let s = &series[k];
    let tsamp = s.tsamp_s;
    let f0 = c.profile.freq_hz;
    let fdot = c.candidate.fdot_hz_s;
    let nbins = c.profile.means.len();
    if s.data.is_empty() || nbins < 2 {
        return None;
    }
    let undrift = |x: &[f32]| {
        if fdot == 0.0 {
            x.to_vec()
        } else {
            fold::dedrift(x, tsamp, f0, fdot)
        }
    };
    let data = undrift(&s.data);
    // Each sub-integration spans at least two turns, so that every bin has samples.
    let turns = data.len() as f64 * tsamp * f0;
    let nsub = ((turns / 2.0).floor() as usize).clamp(1, MAX_SUBINTS);
    let parts = fold::fold_subints(&data, tsamp, f0, nbins, nsub);
    let subints = parts.iter().map(|(s, n, _)| means(s, n)).collect();
    let (subbands, subband_mhz) = channels
        .filter(|ch| ch.centre_mhz.len() > 1)
        .and_then(|ch| {
            let (_, chans) = ch.assembler.filterbank(k).ok()?;
            Some(subbands(
                &chans,
                ch.centre_mhz,
                |x| undrift(x),
                tsamp,
                f0,
                nbins,
            ))
        })
        .unwrap_or_default();
    let ppdot = ppdot_plane(
        &parts,
        tsamp,
        f0,
        c.profile.width_bins,
        fold::std_dev(&data),
        c.candidate.duty,
    );
    Some(FoldDiagnostics {
        rank: c.candidate.rank,
        subints,
        subint_s: data.len() as f64 * tsamp / parts.len() as f64,
        subbands,
        subband_mhz,
        ppdot,
    })
}

fn means(sums: &[f64], counts: &[u64]) -> Vec<f64> {
    sums.iter()
        .zip(counts)
        .map(|(s, n)| if *n > 0 { s / *n as f64 } else { 0.0 })
        .collect()
}

/// Channels folded at `f0` and put into at most [`MAX_SUBBANDS`] groups of adjacent ones.
fn subbands(
    chans: &[Vec<f32>],
    centre_mhz: &[f64],
    undrift: impl Fn(&[f32]) -> Vec<f32>,
    tsamp: f64,
    f0: f64,
    nbins: usize,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let n = chans.len().min(centre_mhz.len());
    let groups = n.min(MAX_SUBBANDS);
    (0..groups)
        .map(|g| {
            let range = g * n / groups..(g + 1) * n / groups;
            let mut sums = vec![0.0; nbins];
            let mut counts = vec![0u64; nbins];
            for ch in &chans[range.clone()] {
                let (s, c) = fold::fold(&undrift(ch), tsamp, f0, nbins);
                for b in 0..nbins {
                    sums[b] += s[b];
                    counts[b] += c[b];
                }
            }
            let mhz = centre_mhz[range.clone()].iter().sum::<f64>() / range.len() as f64;
            (means(&sums, &counts), mhz)
        })
        .unzip()
}

/// The P-Pdot plane from sub-integration folds (`(sums, counts, first sample)` as
/// [`fold::fold_subints`] gives them) of a series of `tsamp` samples folded at `f0`. The
/// grid reaches a phase drift of ±`reach` cycles over the observation along either axis,
/// `reach` six duty cycles (at least four bins, at most a turn), so a pulse's peak spans
/// several trials.
fn ppdot_plane(
    parts: &[(Vec<f64>, Vec<u64>, usize)],
    tsamp: f64,
    f0: f64,
    width_bins: usize,
    sigma: f64,
    duty: f64,
) -> PpdotPlane {
    let nbins = parts[0].0.len();
    let n: u64 = parts.iter().map(|p| p.1.iter().sum::<u64>()).sum();
    let tobs = n as f64 * tsamp;
    let reach = (6.0 * duty).clamp(4.0 / nbins as f64, 1.0);
    let half = (PPDOT_STEPS / 2) as f64;
    let axis = |scale: f64| -> Vec<f64> {
        (0..PPDOT_STEPS)
            .map(|i| (i as f64 - half) / half * scale)
            .collect()
    };
    // A frequency offset δf drifts by δf·T/2 from the middle to either end; a drift δḟ by
    // δḟ·(T/2)²/2.
    let dfs = axis(2.0 * reach / tobs);
    let dfdots = axis(8.0 * reach / (tobs * tobs));
    // Each part's middle, s from the middle of the observation.
    let mids: Vec<f64> = parts
        .iter()
        .map(|(_, c, first)| {
            let len = c.iter().sum::<u64>() as f64;
            (*first as f64 + 0.5 * len) * tsamp - 0.5 * tobs
        })
        .collect();
    let snr = dfdots
        .iter()
        .map(|dfdot| {
            dfs.iter()
                .map(|df| {
                    let (mut sums, mut counts) = (vec![0.0; nbins], vec![0.0; nbins]);
                    for ((s, c, _), t) in parts.iter().zip(&mids) {
                        let shift = (df * t + 0.5 * dfdot * t * t) * nbins as f64;
                        add_shifted(&mut sums, s.iter().copied(), shift);
                        add_shifted(&mut counts, c.iter().map(|&v| v as f64), shift);
                    }
                    boxcar_at_width(&sums, &counts, width_bins, sigma)
                })
                .collect()
        })
        .collect();
    // Periods fall as frequencies rise: δP = −δf/f², δṖ = −δḟ/f² (adding 0 makes the
    // centre's −0 a 0).
    let f2 = f0 * f0;
    PpdotPlane {
        dp_s: dfs.iter().map(|df| -df / f2 + 0.0).collect(),
        dpdot: dfdots.iter().map(|d| -d / f2 + 0.0).collect(),
        snr,
    }
}

/// Add `profile` moved later in phase by `shift` bins (cyclically, linearly interpolated)
/// to `into`: a pulse that a trial says arrives `shift` bins early lands where it belongs.
fn add_shifted(into: &mut [f64], profile: impl Iterator<Item = f64>, shift: f64) {
    let n = into.len();
    let whole = shift.floor();
    let frac = shift - whole;
    let start = (whole as i64).rem_euclid(n as i64) as usize;
    for (b, v) in profile.enumerate() {
        let to = (b + start) % n;
        into[to] += v * (1.0 - frac);
        into[(to + 1) % n] += v * frac;
    }
}

/// The best S/N of a boxcar of `width` bins over a profile given as sums and (fractional)
/// counts: [`fold::boxcar_snr`]'s measure at one width.
fn boxcar_at_width(sums: &[f64], counts: &[f64], width: usize, sigma: f64) -> f64 {
    let n = sums.len();
    let width = width.clamp(1, n.saturating_sub(1).max(1));
    let means: Vec<f64> = sums
        .iter()
        .zip(counts)
        .map(|(s, c)| if *c > 0.0 { s / c } else { 0.0 })
        .collect();
    let inv: Vec<f64> = counts.iter().map(|c| 1.0 / c.max(1e-300)).collect();
    let total: f64 = means.iter().sum();
    if sigma <= 0.0 || n < 2 {
        return 0.0;
    }
    let (mut on, mut var) = (0.0, 0.0);
    for k in 0..width {
        on += means[k];
        var += inv[k];
    }
    let mut best = f64::NEG_INFINITY;
    for start in 0..n {
        let mu_off = (total - on) / (n - width) as f64;
        best = best.max((on - width as f64 * mu_off) / (sigma * var.sqrt()));
        // Slide the window one bin on.
        let (out, inn) = (start, (start + width) % n);
        on += means[inn] - means[out];
        var += inv[inn] - inv[out];
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Noise with a narrow pulse whose frequency is `f` at the middle and drifts by `fdot`.
    fn pulsed(n: usize, tsamp: f64, f: f64, fdot: f64, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        let normal = rand_distr::Normal::new(0.0f32, 1.0).unwrap();
        let tmid = 0.5 * n as f64 * tsamp;
        (0..n)
            .map(|i| {
                let t = (i as f64 + 0.5) * tsamp - tmid;
                let phase = (f * t + 0.5 * fdot * t * t).rem_euclid(1.0);
                let d = phase.min(1.0 - phase);
                rng.sample(normal) + 3.0 * (-(d / 0.01).powi(2)).exp() as f32
            })
            .collect()
    }

    #[test]
    fn the_plane_peaks_at_the_true_period_and_its_centre_is_the_fold() {
        let (n, tsamp, f0, nbins) = (200_000, 5e-5, 25.0, 64);
        let tobs = n as f64 * tsamp;
        // Folded 0.1 cycles of drift off in frequency (half a step-grid's reach from the
        // middle), and 0.05 cycles off in drift at the ends.
        let (df, dfdot) = (0.2 / tobs, -0.4 / (tobs * tobs));
        let x = pulsed(n, tsamp, f0 + df, dfdot, 1);
        let parts = fold::fold_subints(&x, tsamp, f0, nbins, 32);
        let sigma = fold::std_dev(&x);
        let plane = ppdot_plane(&parts, tsamp, f0, 2, sigma, 0.02);
        let (r, c, best) = plane.best();
        let want_dp = -df / (f0 * f0);
        let want_dpdot = -dfdot / (f0 * f0);
        let step_p = plane.dp_s[1] - plane.dp_s[0];
        let step_pdot = plane.dpdot[1] - plane.dpdot[0];
        assert!(
            (plane.dp_s[c] - want_dp).abs() <= step_p.abs(),
            "{c} {:?}",
            plane.dp_s
        );
        assert!(
            (plane.dpdot[r] - want_dpdot).abs() <= 1.5 * step_pdot.abs(),
            "{r}"
        );
        let centre = plane.snr[PPDOT_STEPS / 2][PPDOT_STEPS / 2];
        assert!(best > 1.5 * centre, "best {best}, centre {centre}");
        // Unshifted, the plane's centre is the whole fold's boxcar at that width.
        let (sums, counts) = fold::fold(&x, tsamp, f0, nbins);
        let fcounts: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
        let direct = boxcar_at_width(&sums, &fcounts, 2, sigma);
        assert!(
            (centre - direct).abs() < 1e-9 * direct.abs().max(1.0),
            "{centre} {direct}"
        );
        let means: Vec<f64> = means(&sums, &counts);
        let (all_widths, w, _) = fold::boxcar_snr(&means, &counts, sigma);
        if w == 2 {
            assert!((direct - all_widths).abs() < 1e-9 * direct.abs());
        }
    }

    #[test]
    fn a_shift_moves_a_profile_cyclically() {
        let mut into = vec![0.0; 8];
        add_shifted(
            &mut into,
            [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0].into_iter(),
            1.25,
        );
        // Bin 7 wraps to 0 and 1, bin 0 moves to 1 and 2.
        let want = [1.5, 1.25, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0];
        for (a, b) in into.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{into:?}");
        }
        let mut into = vec![0.0; 4];
        add_shifted(&mut into, [0.0, 1.0, 0.0, 0.0].into_iter(), -1.0);
        assert_eq!(into, vec![1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn boxcar_at_one_width_against_the_direct_formula() {
        let mut rng = StdRng::seed_from_u64(5);
        let means: Vec<f64> = (0..16).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let counts: Vec<u64> = (0..16).map(|_| rng.gen_range(50..60)).collect();
        let sums: Vec<f64> = means
            .iter()
            .zip(&counts)
            .map(|(m, c)| m * *c as f64)
            .collect();
        let fc: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
        for w in [1, 3, 8] {
            let mut want = f64::NEG_INFINITY;
            for start in 0..16 {
                let on: f64 = (0..w).map(|k| means[(start + k) % 16]).sum();
                let var: f64 = (0..w).map(|k| 1.0 / fc[(start + k) % 16]).sum();
                let off = (means.iter().sum::<f64>() - on) / (16 - w) as f64;
                want = want.max((on - w as f64 * off) / (0.7 * var.sqrt()));
            }
            let got = boxcar_at_width(&sums, &fc, w, 0.7);
            assert!((got - want).abs() < 1e-9, "width {w}: {got} {want}");
        }
    }
}
