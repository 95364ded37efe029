//! The coherent filterbank (`--subchannels`): tones land in the right sub-channel at the right
//! sky frequency in both sidebands, the split agrees with an ideal one (one FFT over the
//! whole stream), a dispersed pulsar keeps its S/N and arrival time through the split and
//! dedispersion, every input sample reaches the output, and bad settings are refused.

mod common;
use common::rel_rms;
use psrsearch::filterbank::{Filterbank, FilterbankConfig, FilterbankError};
use psrsearch::simulate::{simulate, write_simulation, Pulsar, SimConfig, SimFormat};
use psrsearch::{
    Band, BasebandReader, DedispersionPlan, DmSeries, PlanConfig, PlanError, PowerAssembler,
    SearchError, Sideband, Voltages,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use rustfft::num_complex::Complex32;
use rustfft::FftPlanner;

/// One complex tone of unit amplitude at sky frequency `sky_mhz` in `chan` of `band`.
fn tone(band: &Band, chan: usize, sky_mhz: f64, n: usize) -> Vec<Complex32> {
    let s = band.sideband.sign();
    let f_hz = s * (sky_mhz - band.centre_mhz[chan]) * 1e6;
    (0..n)
        .map(|t| {
            let cycles = (f_hz * t as f64 / band.sample_rate_hz).rem_euclid(1.0);
            let (sin, cos) = (std::f64::consts::TAU * cycles).sin_cos();
            Complex32::new(cos as f32, sin as f32)
        })
        .collect()
}

/// The sub-channel a tone lands in, its mean amplitude there, the largest power fraction
/// in any other sub-channel, and its frequency there (Hz, from the phase steps).
fn where_it_lands(fb: &Filterbank, out: &Voltages) -> (usize, f64, f64, f64) {
    let power: Vec<f64> = (0..out.nchan())
        .map(|c| {
            out.series(c, 0)
                .iter()
                .map(|z| z.norm_sqr() as f64)
                .sum::<f64>()
        })
        .collect();
    let total: f64 = power.iter().sum();
    let best = (0..power.len())
        .max_by(|&a, &b| power[a].total_cmp(&power[b]))
        .unwrap();
    let others = power
        .iter()
        .enumerate()
        .filter(|&(c, _)| c != best)
        .map(|(_, p)| p / total)
        .fold(0.0, f64::max);
    let s = out.series(best, 0);
    // Away from the stream's edges, where the brick wall rings.
    let mid = &s[s.len() / 4..3 * s.len() / 4];
    let amp = mid.iter().map(|z| z.norm() as f64).sum::<f64>() / mid.len() as f64;
    let step: Complex32 = mid.windows(2).map(|w| w[1] * w[0].conj()).sum();
    // The phase runs on smoothly across blocks: no step differs from the mean one.
    let jump = mid
        .windows(2)
        .map(|w| (w[1] * w[0].conj() * step.conj()).arg().abs())
        .fold(0.0f32, f32::max);
    assert!(jump < 0.1, "a phase jump of {jump} rad between samples");
    let f = step.arg() as f64 / std::f64::consts::TAU * fb.band().sample_rate_hz;
    (best, amp, others, f)
}

#[test]
fn a_tone_lands_in_its_sub_channel_at_its_sky_frequency_in_both_sidebands() {
    for sideband in [Sideband::Upper, Sideband::Lower] {
        // Two 4 MHz channels of 820 ± 4 MHz, each split in 8 sub-channels of 0.5 MHz.
        let bw = 8.0 * sideband.sign();
        let band = Band::from_total(820.0, bw, 2, 4e6, true, 1);
        let fb = Filterbank::new(&band, 8, &FilterbankConfig::default()).unwrap();
        let derived = fb.band();
        assert_eq!(derived.sideband, sideband);
        // Channels keep the band's order: ascending for upper, descending for lower.
        for w in derived.centre_mhz.windows(2) {
            assert!(
                (w[1] - w[0] - 0.5 * sideband.sign()).abs() < 1e-9,
                "{sideband:?}: {:?}",
                derived.centre_mhz
            );
        }
        let n = 1 << 16;
        for sky in [816.3, 818.61, 821.05, 823.9] {
            let chan = (0..2)
                .find(|&c| (sky - band.centre_mhz[c]).abs() < 2.0)
                .unwrap();
            let mut data = Voltages::zeros(2, 1, n);
            data.series_mut(chan, 0)
                .copy_from_slice(&tone(&band, chan, sky, n));
            let out = fb.channelise(&data);
            assert_eq!(out.nsamp(), n / 8);
            let (sub, amp, others, f) = where_it_lands(&fb, &out);
            let centre = derived.centre_mhz[sub];
            assert!(
                (sky - centre).abs() < 0.25,
                "{sideband:?} {sky} MHz landed in {sub} at {centre} MHz"
            );
            assert_eq!(sub / 8, chan, "{sideband:?} {sky} MHz");
            assert!(
                (amp - 1.0).abs() < 0.02,
                "{sideband:?} {sky} MHz: amplitude {amp}"
            );
            assert!(others < 1e-3, "{sideband:?} {sky} MHz: {others} elsewhere");
            // The sub-channel's own sky frequency at that baseband frequency is the tone's.
            let seen = derived.sky_mhz(sub, f);
            assert!(
                (seen - sky).abs() < 1e-4,
                "{sideband:?}: {sky} MHz seen at {seen} MHz"
            );
        }
    }
}

#[test]
fn a_real_tone_becomes_its_analytic_signal_in_its_sub_channel() {
    // MeerKAT-like: real samples at 800 MHz cover 1200-1600 MHz; 4 sub-channels of 100 MHz.
    let band = Band::from_total(1400.0, 400.0, 1, 800e6, false, 1);
    let fb = Filterbank::new(&band, 4, &FilterbankConfig::default().fft_len(8 * 512)).unwrap();
    let n = 1 << 15;
    let f_hz = 1512.3e6 - 1200e6;
    let data: Vec<Complex32> = (0..n)
        .map(|t| {
            let c = (f_hz * t as f64 / 800e6).rem_euclid(1.0);
            Complex32::new((std::f64::consts::TAU * c).cos() as f32, 0.0)
        })
        .collect();
    let out = fb.channelise(&Voltages::from_vec(1, 1, n, data));
    let (sub, amp, others, f) = where_it_lands(&fb, &out);
    assert_eq!(sub, 3);
    assert!((amp - 1.0).abs() < 0.02, "amplitude {amp}");
    assert!(others < 1e-3, "{others}");
    assert!((fb.band().sky_mhz(sub, f) - 1512.3).abs() < 1e-3);
}

/// The ideal split: one FFT over the whole (zero-padded) stream, cut and inverted.
fn ideal_split(series: &[Complex32], nsub: usize) -> Vec<Vec<Complex32>> {
    let n = series.len();
    let mut planner = FftPlanner::<f32>::new();
    let mut spec = series.to_vec();
    planner.plan_fft_forward(n).process(&mut spec);
    // Sub-channel sample j is the middle of input samples [j·nsub, (j + 1)·nsub).
    let delay = (nsub as f64 - 1.0) / 2.0;
    for (k, z) in spec.iter_mut().enumerate() {
        let f = if k < n / 2 {
            k as f64
        } else {
            k as f64 - n as f64
        };
        let turns = (f * delay / n as f64).rem_euclid(1.0);
        *z *= Complex32::from_polar(1.0, (std::f64::consts::TAU * turns) as f32);
    }
    let m = n / nsub;
    let inv = planner.plan_fft_inverse(m);
    (0..nsub)
        .map(|k| {
            let mid = (n / 2 + k * m + m / 2) % n;
            let mut sub: Vec<Complex32> = (0..m)
                .map(|d| {
                    let off = if d < m / 2 { d } else { n + d - m };
                    spec[(mid + off) % n]
                })
                .collect();
            inv.process(&mut sub);
            // The ideal's mix-down is referred to sample 0 too.
            sub.iter().map(|z| z / n as f32).collect()
        })
        .collect()
}

#[test]
fn the_split_agrees_with_one_fft_over_the_whole_stream() {
    // White noise: the worst case for a brick wall (all of the band reaches its edges).
    let nsub = 16;
    let n = 1 << 18;
    let mut rng = StdRng::seed_from_u64(7);
    let data: Vec<Complex32> = (0..n)
        .map(|_| Complex32::new(rng.sample(StandardNormal), rng.sample(StandardNormal)))
        .collect();
    let band = Band::from_total(820.0, 16.0, 1, 16e6, true, 1);
    let ideal = ideal_split(&data, nsub);
    let input = Voltages::from_vec(1, 1, n, data);
    let mut errors = Vec::new();
    for (m, margin) in [
        (256, 16),
        (256, 32),
        (1024, 64),
        (1024, 128),
        (1024, 127),
        (4096, 512),
    ] {
        let cfg = FilterbankConfig::default().fft_len(nsub * m).margin(margin);
        let fb = Filterbank::new(&band, nsub, &cfg).unwrap();
        let out = fb.channelise(&input);
        // The ideal is circular over the stream: compare away from its ends.
        let (lo, hi) = (n / nsub / 8, n / nsub * 7 / 8);
        let worst = (0..nsub)
            .map(|k| rel_rms(&out.series(k, 0)[lo..hi], &ideal[k][lo..hi]))
            .fold(0.0, f64::max);
        println!("sub-channel block {m}, margin {margin}: worst RMS error {worst:.2e}");
        errors.push(worst);
    }
    // The default geometry (1024, an eighth each side); an odd margin starts blocks on odd
    // sub-channel samples, where the mix-down of an even number of sub-channels flips sign.
    assert!(errors[3] < 0.06 && errors[4] < 0.06, "{errors:?}");
    // A wider margin helps, as 1/lag tails say it should.
    assert!(errors[1] < errors[0] && errors[5] < errors[3], "{errors:?}");
}

/// Detected series at `dm` of `data` (one plan, in memory), through `nsub` sub-channels
/// (1: none).
fn dedispersed(band: &Band, data: &Voltages, dm: f64, nsub: usize, ds: usize) -> (DmSeries, f64) {
    let cfg = PlanConfig::default()
        .downsample(ds)
        .data_len(data.nsamp() as u64);
    let (band, data, cfg) = if nsub == 1 {
        (band.clone(), data.clone(), cfg)
    } else {
        let fb = Filterbank::new(band, nsub, &FilterbankConfig::default()).unwrap();
        let sub_cfg = fb.plan_config(&cfg).unwrap();
        (fb.band().clone(), fb.channelise(data), sub_cfg)
    };
    let plan = DedispersionPlan::new(&band, &[dm], &cfg).unwrap();
    let n = data.nsamp() as u64;
    let mut asm = PowerAssembler::for_input(&plan, n);
    let mut ws = plan.workspace();
    let mut block = Voltages::zeros(band.nchan(), band.npol, plan.fft_len());
    for b in 0..plan.num_blocks(n) {
        block.fill_window(&data, plan.block_start(b) as usize);
        asm.insert(&plan.process_block(&mut ws, b, &block)).unwrap();
    }
    let series = asm.finish().unwrap().remove(0);
    let t0 = series.start_sample as f64 * band.tsamp_s();
    (series, t0)
}

/// The folded profile of `series` (starting `t0` s after the data), on absolute time so
/// that series starting at different samples agree, in units of its off-pulse mean.
fn fold_profile(series: &DmSeries, t0: f64, period: f64, nbins: usize) -> Vec<f64> {
    let mut sum = vec![0.0f64; nbins];
    let mut count = vec![0u64; nbins];
    for (i, &v) in series.data.iter().enumerate() {
        let t = t0 + (i as f64 + 0.5) * series.tsamp_s;
        let bin = ((t / period).rem_euclid(1.0) * nbins as f64) as usize % nbins;
        sum[bin] += v as f64;
        count[bin] += 1;
    }
    let prof: Vec<f64> = sum.iter().zip(&count).map(|(s, &c)| s / c as f64).collect();
    let (_, off) = on_off(&prof);
    let mean = off.iter().map(|&b| prof[b]).sum::<f64>() / off.len() as f64;
    prof.iter().map(|v| v / mean).collect()
}

/// Bins of the pulse (the 5 bins in 128 around its peak, its width) and the rest.
fn on_off(prof: &[f64]) -> (Vec<usize>, Vec<usize>) {
    let n = prof.len();
    let peak = (0..n).max_by(|&a, &b| prof[a].total_cmp(&prof[b])).unwrap();
    (0..n).partition(|&b| {
        let d = (b as i64 - peak as i64).rem_euclid(n as i64) as usize;
        d <= n / 64 || d >= n - n / 64
    })
}

/// S/N of the pulse (its summed excess over the off-pulse noise `sigma`, a bin's standard
/// deviation in units of the mean) and its arrival time within the period (the centroid of
/// the excess).
fn pulse(prof: &[f64], on: &[usize], sigma: f64, period: f64) -> (f64, f64) {
    let excess: f64 = on.iter().map(|&b| prof[b] - 1.0).sum();
    let n = prof.len() as f64;
    // Bins counted on from the first of the pulse, so that one wrapping round is not split.
    let first = on
        .iter()
        .copied()
        .find(|&b| !on.contains(&((b + prof.len() - 1) % prof.len())))
        .unwrap();
    let centre: f64 = on
        .iter()
        .map(|&b| ((b + prof.len() - first) % prof.len()) as f64 * (prof[b] - 1.0))
        .sum::<f64>()
        / excess;
    let phase = ((first as f64 + centre + 0.5) / n).rem_euclid(1.0);
    (excess / (sigma * (on.len() as f64).sqrt()), phase * period)
}

fn off_sigma(prof: &[f64]) -> f64 {
    let (_, off) = on_off(prof);
    let m = off.iter().map(|&b| prof[b]).sum::<f64>() / off.len() as f64;
    (off.iter().map(|&b| (prof[b] - m).powi(2)).sum::<f64>() / off.len() as f64).sqrt()
}

fn pulsar_observation(sideband: Sideband) -> SimConfig {
    SimConfig {
        centre_mhz: 820.0,
        bandwidth_mhz: 8.0 * sideband.sign(),
        nchan: 1,
        npol: 2,
        complex: true,
        nsamples: 1 << 21,
        seed: 11,
        pulsars: vec![Pulsar {
            period_s: 0.0213,
            dm: 40.0,
            duty_cycle: 0.03,
            amplitude: 1.0,
            orbit: None,
        }],
        ..SimConfig::default()
    }
}

#[test]
fn a_dispersed_pulsar_keeps_its_snr_and_arrival_time_through_the_split() {
    for sideband in [Sideband::Upper, Sideband::Lower] {
        let obs = pulsar_observation(sideband);
        let (band, data) = simulate(&obs).unwrap();
        let period = obs.pulsars[0].period_s;
        let nbins = 128;
        let (plain, t_plain) = dedispersed(&band, &data, 40.0, 1, 64);
        let plain_prof = fold_profile(&plain, t_plain, period, nbins);
        // One noise level for every profile (the split keeps the noise's statistics; an
        // estimate from 112 bins each would differ by 7% from noise alone).
        let sigma = off_sigma(&plain_prof);
        // And one on-pulse window: the plain profile's.
        let (on, _) = on_off(&plain_prof);
        let (plain_snr, plain_t) = pulse(&plain_prof, &on, sigma, period);
        // Dedispersed at the wrong DM the pulse smears: the check has teeth.
        let (wrong, t_wrong) = dedispersed(&band, &data, 0.0, 1, 64);
        let wrong_prof = fold_profile(&wrong, t_wrong, period, nbins);
        let (wrong_snr, _) = pulse(&wrong_prof, &on_off(&wrong_prof).0, sigma, period);
        assert!(
            plain_snr > 30.0 && wrong_snr < plain_snr * 0.8,
            "{plain_snr} {wrong_snr}"
        );
        for nsub in [4, 16, 64] {
            let (split, t_split) = dedispersed(&band, &data, 40.0, nsub, 64);
            assert_eq!(split.tsamp_s, plain.tsamp_s);
            let prof = fold_profile(&split, t_split, period, nbins);
            let (snr, t) = pulse(&prof, &on, sigma, period);
            println!(
                "{sideband:?}, {nsub} sub-channels: S/N {snr:.2} against {plain_snr:.2} \
                 ({:+.2}%; {:.2} with its own noise estimate), pulse at {:.2} µs against \
                 {:.2} µs",
                100.0 * (snr / plain_snr - 1.0),
                pulse(&prof, &on, off_sigma(&prof), period).0,
                t * 1e6,
                plain_t * 1e6
            );
            assert!(
                (snr / plain_snr - 1.0).abs() < 0.03,
                "{sideband:?} {nsub}: S/N {snr} against {plain_snr}"
            );
            // Within a tenth of an output sample (8 µs).
            assert!(
                (t - plain_t).abs() < 0.8e-6,
                "{sideband:?} {nsub}: pulse at {t} s against {plain_t} s"
            );
        }
    }
}

#[test]
fn every_input_sample_reaches_the_sub_channels() {
    let band = Band::from_total(820.0, 4.0, 1, 4e6, true, 1);
    let fb = Filterbank::new(&band, 8, &FilterbankConfig::default().fft_len(8 * 64)).unwrap();
    assert_eq!(fb.step(), 64 - 2 * 8);
    for n in [1usize, 7, 8, 9, 511, 512, 513, 4000, 4099] {
        assert_eq!(fb.output_len(n as u64), n.div_ceil(8) as u64);
        // An impulse at the first and at the last sample shows at the sub-channels' first and
        // last samples, in every sub-channel (an impulse is white).
        for at in [0, n - 1] {
            let mut data = Voltages::zeros(1, 1, n);
            data.series_mut(0, 0)[at] = Complex32::new(1.0, 0.0);
            let out = fb.channelise(&data);
            assert_eq!(out.nsamp(), n.div_ceil(8), "n {n}");
            let j = at / 8;
            for k in 0..8 {
                let z = out.series(k, 0)[j];
                // Each sub-channel holds 1/8 of the impulse's band, seen at most 3.5 samples
                // from the middle of sub-channel sample j: at least sinc(3.5/8)/8 = 0.089.
                assert!(z.norm() > 0.085, "n {n} at {at} sub {k}: {z}");
            }
        }
        // Away from the edges nothing of an impulse is lost: the sub-channels hold its
        // energy (1/8 of it, at 1/8 of the rate).
        if n >= 512 {
            let mut data = Voltages::zeros(1, 1, n);
            data.series_mut(0, 0)[n / 2] = Complex32::new(1.0, 0.0);
            let out = fb.channelise(&data);
            let energy: f64 = out.as_slice().iter().map(|z| z.norm_sqr() as f64).sum();
            assert!((energy * 8.0 - 1.0).abs() < 0.05, "n {n}: {energy}");
        }
    }
}

#[test]
fn search_and_dedisperse_cover_the_file_through_the_split() {
    let dir = std::env::temp_dir().join(format!("psr_filterbank_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("wide.dada");
    let mut obs = pulsar_observation(Sideband::Upper);
    obs.nsamples = 1 << 20;
    write_simulation(&obs, SimFormat::Dada8, &file).unwrap();
    let n = obs.nsamples as u64;
    let mut reader = BasebandReader::open(&file).unwrap();
    let cfg = PlanConfig::default().downsample(32);
    let plain =
        psrsearch::products::dedisperse_file(&mut reader, 40.0, &cfg, false, &mut |_, _| {})
            .unwrap();
    let split = psrsearch::products::dedisperse_file(
        &mut reader,
        40.0,
        &cfg.clone().subchannels(16),
        false,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(split.plan.band().nchan(), 16);
    assert_eq!(split.filterbank.len(), 16);
    // The unsplit output is the whole file less its plan's edges (the smear across the
    // channel); the split one spans the same input samples within an output sample or two:
    // its sub-channels' own edges and the sweep across them add up to the same smear, and
    // the filterbank adds no edge of its own.
    let p = &plain.plan;
    assert_eq!(plain.series.data.len(), p.output_len(n));
    assert!(p.valid_end(n) + (p.tail() + 2 * p.downsample()) as u64 >= n);
    let span = |d: &psrsearch::products::Dedispersed, decimation: i64| {
        let start = d.series.start_sample * decimation;
        (start, start + (d.series.data.len() * 32) as i64)
    };
    let (a, b) = (span(&plain, 1), span(&split, 16));
    println!("input samples covered: unsplit {a:?}, split {b:?} of {n}");
    assert!(
        (a.0 - b.0).abs() <= 64 && (a.1 - b.1).abs() <= 64,
        "{a:?} {b:?}"
    );
    // The split's edges are its sub-channels' smear, 16² times less than the channel's.
    assert!(
        split.plan.overlap() * 16 < plain.plan.overlap(),
        "{} {}",
        split.plan.overlap(),
        plain.plan.overlap()
    );
    // Voltages are not made from sub-channels.
    let e = psrsearch::products::dedisperse_file(
        &mut reader,
        40.0,
        &cfg.clone().subchannels(16),
        true,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("--voltages"), "{e}");
    // The search finds the pulsar through the split.
    let config = psrsearch::SearchConfig {
        dms: vec![0.0, 20.0, 40.0, 60.0],
        plan: cfg.clone().subchannels(16),
        candidate_plots: 0,
        ..psrsearch::SearchConfig::default()
    };
    let outcome = psrsearch::search_file(&mut reader, &config, &mut |_, _| {}).unwrap();
    let top = &outcome.candidates[0].candidate;
    // 0.13 s of data: a Fourier bin is 7.6 Hz, 16% of the spin frequency.
    assert!(
        ((top.period_s - 0.0213) / 0.0213).abs() < 1e-2 && top.dm == 40.0,
        "{top:?}"
    );
    assert_eq!(outcome.tsamp_s, 32.0 / 8e6);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_sub_channel_settings_are_refused_clearly() {
    let band = Band::from_total(820.0, 16.0, 1, 16e6, true, 2);
    let e = Filterbank::new(&band, 0, &FilterbankConfig::default()).unwrap_err();
    assert_eq!(e, FilterbankError::NoSubchannels);
    // An FFT that 3 sub-channels do not divide into even pieces.
    let e = Filterbank::new(&band, 3, &FilterbankConfig::default().fft_len(4096)).unwrap_err();
    assert!(
        matches!(e, FilterbankError::FftLen { multiple: 6, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("multiple of 6"), "{e}");
    let e = Filterbank::new(
        &band,
        4,
        &FilterbankConfig::default().fft_len(4 * 64).margin(32),
    )
    .unwrap_err();
    assert!(e.to_string().contains("margin"), "{e}");
    // A downsampling factor that is not a whole number of sub-channel samples.
    let fb = Filterbank::new(&band, 16, &FilterbankConfig::default()).unwrap();
    let e = fb
        .plan_config(&PlanConfig::default().downsample(8))
        .unwrap_err();
    assert!(e.to_string().contains("multiple of 16"), "{e}");
    let ok = fb
        .plan_config(&PlanConfig::default().downsample(48))
        .unwrap();
    assert_eq!((ok.downsample, ok.subchannels), (3, 1));
    // A plan is never made for sub-channels it was not given.
    let e =
        DedispersionPlan::new(&band, &[1.0], &PlanConfig::default().subchannels(4)).unwrap_err();
    assert!(
        matches!(
            e,
            PlanError::BadParameter {
                name: "subchannels",
                ..
            }
        ),
        "{e:?}"
    );
    // Through the search, the same errors.
    let err: SearchError = FilterbankError::NoSubchannels.into();
    assert!(err.to_string().contains("at least 1"), "{err}");
}
