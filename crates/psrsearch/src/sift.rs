//! Sifting: merging the per-DM, per-harmonic-stage detections of one signal into one
//! candidate, and removing candidates that are harmonics of stronger ones.

use serde::{Deserialize, Serialize};

use crate::periodicity::SpectralCandidate;

/// Detections of one spin frequency across DM trials and harmonic stages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// The most significant detection.
    pub best: SpectralCandidate,
    /// The most significant detection at each DM where there was one, by DM index.
    pub hits: Vec<SpectralCandidate>,
}

/// Group detections whose frequencies agree within `tol_hz`, strongest first. The result is
/// ordered by decreasing significance and does not depend on the input order.
pub fn cluster(mut cands: Vec<SpectralCandidate>, tol_hz: f64) -> Vec<Cluster> {
    cands.sort_by(|a, b| {
        b.sigma
            .total_cmp(&a.sigma)
            .then(a.freq_hz.total_cmp(&b.freq_hz))
            .then(a.dm_index.cmp(&b.dm_index))
            .then(a.nharm.cmp(&b.nharm))
    });
    let mut clusters: Vec<Cluster> = Vec::new();
    // (frequency of the cluster's best detection, cluster index), sorted by frequency.
    let mut by_freq: Vec<(f64, usize)> = Vec::new();
    for c in cands {
        let at = by_freq.partition_point(|(f, _)| *f < c.freq_hz - tol_hz);
        let mut home = None;
        let mut best_gap = f64::INFINITY;
        for &(f, idx) in &by_freq[at..] {
            if f > c.freq_hz + tol_hz {
                break;
            }
            let gap = (f - c.freq_hz).abs();
            // Of several clusters in reach, join the strongest (lowest index), then nearest.
            if home.is_none_or(|h| idx < h || (idx == h && gap < best_gap)) {
                home = Some(idx);
                best_gap = gap;
            }
        }
        match home {
            Some(idx) => {
                let cl = &mut clusters[idx];
                if !cl.hits.iter().any(|h| h.dm_index == c.dm_index) {
                    cl.hits.push(c);
                }
            }
            None => {
                let idx = clusters.len();
                clusters.push(Cluster {
                    best: c.clone(),
                    hits: vec![c.clone()],
                });
                let at = by_freq.partition_point(|(f, _)| *f < c.freq_hz);
                by_freq.insert(at, (c.freq_hz, idx));
            }
        }
    }
    for cl in &mut clusters {
        cl.hits.sort_by_key(|h| h.dm_index);
    }
    clusters
}

/// The simplest ratio `m/n` (both at most `max`) within `tol_hz` of explaining `f` as a
/// harmonic of `fundamental`: `|n·f − m·fundamental| ≤ (n + m)·tol_hz`.
pub fn harmonic_ratio(f: f64, fundamental: f64, max: usize, tol_hz: f64) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for n in 1..=max {
        for m in 1..=max {
            if gcd(m, n) != 1 {
                continue;
            }
            let err = (n as f64 * f - m as f64 * fundamental).abs();
            if err <= (n + m) as f64 * tol_hz && best.is_none_or(|(bm, bn)| m + n < bm + bn) {
                best = Some((m, n));
            }
        }
    }
    best
}

/// The harmonic number `k ≤ max` for which `f` is `k·fundamental` within `(k + 1)·tol_hz`.
pub fn integer_multiple(f: f64, fundamental: f64, max: usize, tol_hz: f64) -> Option<usize> {
    let k = (f / fundamental).round();
    (k >= 1.0 && k <= max as f64 && (f - k * fundamental).abs() <= (k + 1.0) * tol_hz)
        .then_some(k as usize)
}

/// Whether some harmonic `h ≤ max_h` of `f` falls on a harmonic `k` of `fundamental`:
/// `|h·f − k·fundamental| ≤ tol_hz + k·fundamental_tol_hz`.
pub fn shares_harmonic(
    f: f64,
    fundamental: f64,
    max_h: usize,
    tol_hz: f64,
    fundamental_tol_hz: f64,
) -> bool {
    (1..=max_h).any(|h| {
        let k = (h as f64 * f / fundamental).round();
        k >= 1.0 && (h as f64 * f - k * fundamental).abs() <= tol_hz + k * fundamental_tol_hz
    })
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(dm: usize, f: f64, sigma: f64) -> SpectralCandidate {
        SpectralCandidate {
            dm_index: dm,
            freq_hz: f,
            nharm: 1,
            power: 0.0,
            sigma,
            z: 0.0,
        }
    }

    #[test]
    fn clusters_merge_across_dms_and_are_order_independent() {
        let cands = vec![
            c(0, 30.00, 5.0),
            c(1, 30.01, 9.0),
            c(2, 29.99, 7.0),
            c(1, 30.02, 4.0),
            c(1, 71.5, 6.0),
        ];
        let a = cluster(cands.clone(), 0.05);
        let mut rev = cands;
        rev.reverse();
        assert_eq!(a, cluster(rev, 0.05));
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].best, c(1, 30.01, 9.0));
        assert_eq!(
            a[0].hits.iter().map(|h| h.dm_index).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(a[1].best.freq_hz, 71.5);
    }

    #[test]
    fn harmonic_ratios() {
        assert_eq!(harmonic_ratio(60.0, 30.0, 16, 0.01), Some((2, 1)));
        assert_eq!(harmonic_ratio(10.0, 30.0, 16, 0.01), Some((1, 3)));
        assert_eq!(harmonic_ratio(45.001, 30.0, 16, 0.01), Some((3, 2)));
        assert_eq!(harmonic_ratio(30.0, 30.0, 16, 0.01), Some((1, 1)));
        // 134.9 Hz against 30 Hz: 9/2 would need 135 ± 0.055.
        assert_eq!(harmonic_ratio(134.9, 30.0, 16, 0.005), None);
        assert_eq!(gcd(12, 18), 6);
        // 3/16 of 134.83 Hz: its 16th harmonic is the 3rd of the fundamental.
        assert!(shares_harmonic(25.2806, 134.83, 16, 0.1, 0.0));
        assert!(!shares_harmonic(25.2806, 134.83, 8, 0.1, 0.0));
        assert!(!shares_harmonic(0.3, 134.83, 16, 0.1, 0.0));
        assert_eq!(
            integer_multiple(17.0 * 3.1 + 0.01, 3.1, 64, 0.001),
            Some(17)
        );
        assert_eq!(integer_multiple(17.0 * 3.1 + 0.1, 3.1, 64, 0.001), None);
        assert_eq!(integer_multiple(65.0 * 3.1, 3.1, 64, 0.001), None);
        assert_eq!(integer_multiple(1.0, 3.1, 64, 0.001), None);
    }
}
