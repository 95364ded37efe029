//! Single-pulse search: boxcar matched filters of 1, 2, 4, … samples over every dedispersed
//! series, for pulses too few or too irregular for a periodicity search (giant pulses,
//! rotating radio transients, fast radio bursts).
//!
//! Each series is normalised by its median and robust standard deviation (1.4826 × the
//! median absolute deviation), so interference and the pulses themselves do not inflate the
//! noise estimate. A boxcar of `w` samples starting at `j` has S/N `Σ(x − median) / (σ·√w)`.
//! Per DM, every boxcar above threshold is an event; events whose boxcars overlap are one,
//! kept at the width and start of the highest S/N. [`group`] then joins the events of one
//! pulse seen at neighbouring DMs, keeping the DM where it is brightest.

use serde::{Deserialize, Serialize};

use crate::assemble::DmSeries;

/// Settings of the single-pulse search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SinglePulseConfig {
    /// Whether to run it.
    pub enabled: bool,
    /// Events below this S/N are not reported.
    pub threshold_sigma: f64,
    /// Widest boxcar, output samples (widths are the powers of two up to this).
    pub max_width: usize,
    /// At most this many events are kept (the brightest).
    pub max_events: usize,
}

impl Default for SinglePulseConfig {
    fn default() -> Self {
        SinglePulseConfig {
            enabled: false,
            threshold_sigma: 6.0,
            max_width: 64,
            max_events: 10_000,
        }
    }
}

/// One pulse at one DM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SinglePulse {
    /// Trial DM.
    pub dm: f64,
    /// Matched-filter S/N.
    pub sigma: f64,
    /// Time of the pulse's centre at the reference frequency, s from the start of the data.
    pub time_s: f64,
    /// Output sample of the boxcar's start within the series.
    pub sample: usize,
    /// Boxcar width, output samples.
    pub width: usize,
    /// Boxcar width, s.
    pub width_s: f64,
}

/// Events of one series; `input_tsamp_s` is the sampling time of the data before
/// downsampling (the unit of `start_sample`).
pub fn search_series(
    s: &DmSeries,
    input_tsamp_s: f64,
    config: &SinglePulseConfig,
) -> Vec<SinglePulse> {
    let n = s.data.len();
    if n < 4 {
        return Vec::new();
    }
    let (median, sigma) = crate::rfi::robust_stats(&s.data);
    let median = f64::from(median);
    if sigma <= 0.0 {
        return Vec::new();
    }
    let mut prefix = Vec::with_capacity(n + 1);
    prefix.push(0.0f64);
    for v in &s.data {
        let last = prefix[prefix.len() - 1];
        prefix.push(last + (f64::from(*v) - median) / sigma);
    }
    // (start, width, S/N) of every boxcar above threshold, then merged where they overlap.
    let mut hits: Vec<(usize, usize, f64)> = Vec::new();
    let mut w = 1;
    while w <= config.max_width.max(1) && w <= n {
        let norm = (w as f64).sqrt();
        for j in 0..=n - w {
            let snr = (prefix[j + w] - prefix[j]) / norm;
            if snr >= config.threshold_sigma {
                hits.push((j, w, snr));
            }
        }
        w *= 2;
    }
    hits.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    let mut kept: Vec<(usize, usize, f64)> = Vec::new();
    for h in hits {
        let overlaps = kept.iter().any(|k| h.0 < k.0 + k.1 && k.0 < h.0 + h.1);
        if !overlaps {
            kept.push(h);
        }
    }
    let t0 = s.start_sample as f64 * input_tsamp_s;
    kept.into_iter()
        .map(|(j, w, snr)| SinglePulse {
            dm: s.dm,
            sigma: snr,
            time_s: t0 + (j as f64 + w as f64 / 2.0) * s.tsamp_s,
            sample: j,
            width: w,
            width_s: w as f64 * s.tsamp_s,
        })
        .collect()
}

/// Events of every series, brightest first, at most `config.max_events`.
pub fn search(
    series: &[DmSeries],
    input_tsamp_s: f64,
    config: &SinglePulseConfig,
) -> Vec<SinglePulse> {
    let mut all: Vec<SinglePulse> = series
        .iter()
        .flat_map(|s| search_series(s, input_tsamp_s, config))
        .collect();
    all.sort_by(|a, b| {
        b.sigma
            .total_cmp(&a.sigma)
            .then(a.time_s.total_cmp(&b.time_s))
            .then(a.dm.total_cmp(&b.dm))
    });
    all.truncate(config.max_events);
    all
}

/// One pulse per group of events, brightest first: events are of one pulse where they are
/// at the same or neighbouring trial DMs (`dms`, the trials searched) and their boxcars
/// overlap in time, and chains of such pairs join (a bright pulse drifts in time across the
/// DMs it is seen at). Each group is reported by its brightest event.
pub fn group(events: &[SinglePulse], dms: &[f64]) -> Vec<SinglePulse> {
    let index = |dm: f64| dms.iter().position(|d| *d == dm).unwrap_or(usize::MAX);
    // Per trial DM, (time, event) sorted by time.
    let mut by_dm: std::collections::BTreeMap<usize, Vec<(f64, usize)>> = Default::default();
    for (i, e) in events.iter().enumerate() {
        by_dm.entry(index(e.dm)).or_default().push((e.time_s, i));
    }
    for list in by_dm.values_mut() {
        list.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let widest = events.iter().map(|e| e.width_s).fold(0.0, f64::max);
    let mut parent: Vec<usize> = (0..events.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for (&k, list) in &by_dm {
        for &(t, i) in list {
            for other in [Some(k), k.checked_add(1)].into_iter().flatten() {
                let Some(near) = by_dm.get(&other) else {
                    continue;
                };
                let from = near.partition_point(|(u, _)| *u < t - widest);
                for &(u, j) in &near[from..] {
                    if u > t + widest {
                        break;
                    }
                    if (u - t).abs() <= 0.5 * (events[i].width_s + events[j].width_s) {
                        let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                        parent[a] = b;
                    }
                }
            }
        }
    }
    let mut best: std::collections::HashMap<usize, usize> = Default::default();
    for i in 0..events.len() {
        let r = root(&mut parent, i);
        let e = best.entry(r).or_insert(i);
        if events[i].sigma > events[*e].sigma {
            *e = i;
        }
    }
    let mut out: Vec<SinglePulse> = best.values().map(|&i| events[i].clone()).collect();
    out.sort_by(|a, b| {
        b.sigma
            .total_cmp(&a.sigma)
            .then(a.time_s.total_cmp(&b.time_s))
    });
    out
}

/// Write events as CSV: `dm,sigma,time_s,sample,width` (as PRESTO's `.singlepulse` files,
/// with the width in samples), after the observation `metadata` describes as `# key = value`
/// lines, as the candidate table has them.
///
/// # Errors
/// I/O errors.
pub fn write_csv(
    w: &mut impl std::io::Write,
    metadata: &crate::format::Metadata,
    events: &[SinglePulse],
) -> std::io::Result<()> {
    for (key, value) in metadata.pairs() {
        writeln!(w, "# {key} = {}", value.replace(['\n', '\r'], " "))?;
    }
    writeln!(w, "dm,sigma,time_s,sample,width")?;
    for e in events {
        writeln!(
            w,
            "{},{},{},{},{}",
            e.dm, e.sigma, e.time_s, e.sample, e.width
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn series(dm: f64, data: Vec<f32>) -> DmSeries {
        DmSeries {
            dm,
            tsamp_s: 1e-3,
            start_sample: 1000,
            data,
        }
    }

    #[test]
    fn a_boxcar_pulse_is_found_at_its_time_and_width() {
        let mut rng = StdRng::seed_from_u64(4);
        let normal = rand_distr::Normal::new(0.0f32, 1.0).unwrap();
        let mut data: Vec<f32> = (0..20_000).map(|_| rng.sample(normal)).collect();
        for v in &mut data[5000..5008] {
            *v += 4.0;
        }
        let config = SinglePulseConfig::default();
        let events = search_series(&series(3.0, data.clone()), 1e-6, &config);
        assert_eq!(events.len(), 1, "{events:?}");
        let e = &events[0];
        assert_eq!((e.sample, e.width), (5000, 8));
        // 8 samples of 4σ: S/N 4·√8 = 11.3, plus noise.
        assert!((e.sigma - 11.3).abs() < 3.0, "{e:?}");
        // Start 1000 input samples of 1 µs, then 5004 samples of 1 ms.
        assert!((e.time_s - (1e-3 + 5.004)).abs() < 1e-9, "{e:?}");
        // Pure noise: nothing above 6σ in 20 000 samples × 7 widths.
        let noise: Vec<f32> = (0..20_000).map(|_| rng.sample(normal)).collect();
        assert!(search_series(&series(0.0, noise), 1e-6, &config).is_empty());
    }

    #[test]
    fn events_of_one_pulse_at_neighbouring_dms_group_into_one() {
        let mk = |dm: f64, sigma: f64, sample: usize| SinglePulse {
            dm,
            sigma,
            time_s: (sample as f64 + 2.0) * 1e-3,
            sample,
            width: 4,
            width_s: 4e-3,
        };
        // A chain across three DMs drifting in time, an unrelated pulse, and one at a DM two
        // trials away that is not joined.
        let events = vec![
            mk(10.0, 8.0, 500),
            mk(11.0, 12.0, 503),
            mk(12.0, 7.0, 506),
            mk(11.0, 9.0, 3000),
            mk(14.0, 6.5, 508),
        ];
        let g = group(&events, &[10.0, 11.0, 12.0, 13.0, 14.0]);
        assert_eq!(g.len(), 3, "{g:?}");
        assert_eq!((g[0].dm, g[0].sample), (11.0, 503));
        assert_eq!((g[1].sample, g[2].sample), (3000, 508));
        let mut out = Vec::new();
        write_csv(&mut out, &crate::format::Metadata::default(), &g).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .starts_with("dm,sigma,time_s,sample,width\n11,12,"));
        let mut out = Vec::new();
        let meta = crate::format::Metadata {
            source: "FRB".into(),
            ..Default::default()
        };
        write_csv(&mut out, &meta, &g).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .starts_with("# source = FRB\ndm,sigma,"));
    }
}
