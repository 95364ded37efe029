//! The whole search: dedisperse at many DMs (one forward FFT per block), search each DM's
//! series for periodicities, sift, fold, rank.
//!
//! The stages are separate functions over plain data so that a distributed driver can run
//! [`DedispersionPlan::process_block`] on chunks of the file, periodicity searches on subsets
//! of DMs ([`PeriodicityPlan::search`]) and then [`rank_candidates`] on the gathered results,
//! and get exactly what [`search_file`] gets.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::assemble::{AssembleError, DmSeries, PowerAssembler};
use crate::band::Band;
use crate::dedisperse::{DedispersionPlan, PlanConfig, PlanError};
use crate::diagnostics::{self, Channels, FoldDiagnostics};
use crate::filterbank::{self, FilterbankError, SubchannelReader};
use crate::fold::{self, Profile};
use crate::format::{BasebandReader, Metadata, ReadError};
use crate::periodicity::{PeriodicityConfig, PeriodicityPlan, PowerSpectrum, SpectralCandidate};
use crate::rfi::{self, MaskSummary, RfiConfig};
use crate::sift;
use crate::single_pulse::{self, SinglePulse, SinglePulseConfig};
use crate::voltages::Voltages;

/// Why a search failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SearchError {
    /// Reading the input.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Planning the dedispersion.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Putting blocks together.
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    /// Splitting channels into sub-channels.
    #[error(transparent)]
    Filterbank(#[from] FilterbankError),
    /// Too little data for one dedispersed output sample at the largest DM.
    #[error(
        "the data hold {nsamples} samples per channel ({seconds:.3} s), fewer than the \
         {needed} ({needed_s:.3} s) that dedispersing up to DM {max_dm} needs for one output \
         sample (the dispersive sweep across the band plus the filter's edges), whatever the \
         FFT length: use longer data or a lower DM range"
    )]
    TooShort {
        /// Samples in the data.
        nsamples: u64,
        /// Shortest input that works ([`DedispersionPlan::min_samples`]).
        needed: u64,
        /// The data's duration, s.
        seconds: f64,
        /// The duration needed, s.
        needed_s: f64,
        /// Largest trial DM.
        max_dm: f64,
    },
}

impl SearchError {
    /// The error for `nsamples` samples per channel, too few for `plan`.
    pub fn too_short(plan: &DedispersionPlan, nsamples: u64) -> Self {
        let tsamp = plan.band().tsamp_s();
        let needed = plan.min_samples();
        SearchError::TooShort {
            nsamples,
            needed,
            seconds: nsamples as f64 * tsamp,
            needed_s: needed as f64 * tsamp,
            max_dm: plan.dms().iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// Settings of a search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchConfig {
    /// Trial DMs, pc cm⁻³.
    pub dms: Vec<f64>,
    /// Dedispersion settings (FFT length, reference, downsampling…).
    pub plan: PlanConfig,
    /// Periodicity search settings.
    pub periodicity: PeriodicityConfig,
    /// Candidates below this significance are not reported.
    pub threshold_sigma: f64,
    /// At most this many candidates are reported.
    pub max_candidates: usize,
    /// Largest number of profile bins: a profile has this many, or one per sample of the
    /// period where that is fewer.
    pub fold_bins: usize,
    /// Detections closer than this many Fourier bins (`1/T`) are the same signal.
    pub freq_tolerance_bins: f64,
    /// Interference flagging and clipping.
    #[serde(default)]
    pub rfi: RfiConfig,
    /// Single-pulse search (off by default).
    #[serde(default)]
    pub single_pulse: SinglePulseConfig,
    /// The top candidates folded for prepfold-style plots ([`crate::diagnostics`]).
    #[serde(default = "default_candidate_plots")]
    pub candidate_plots: usize,
}

fn default_candidate_plots() -> usize {
    3
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            dms: dm_grid(0.0, 100.0, 2.0),
            plan: PlanConfig::default().downsample(32),
            periodicity: PeriodicityConfig::default(),
            threshold_sigma: 6.0,
            max_candidates: 10,
            fold_bins: 256,
            freq_tolerance_bins: 1.5,
            rfi: RfiConfig::default(),
            single_pulse: SinglePulseConfig::default(),
            candidate_plots: default_candidate_plots(),
        }
    }
}

/// A DM step chosen from the smearing it causes, as PRESTO's DDplan does for the band.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DmStepPlan {
    /// DM step, pc cm⁻³.
    pub step: f64,
    /// Smearing across the whole band from a DM error of half a step, s: equal to
    /// `resolution_s` (before the step is rounded down to two significant digits).
    pub smear_s: f64,
    /// The time resolution it is matched to: output sampling time and pulse width added
    /// in quadrature, s.
    pub resolution_s: f64,
}

/// `dm` for printing: trial DMs are sums of steps, so `4.1` comes out as
/// `4.1000000000000005`; a millionth of a pc/cm³ is far below any step.
pub fn dm_for_print(dm: f64) -> f64 {
    (dm * 1e6).round() / 1e6
}

impl DmStepPlan {
    /// One line saying what was chosen and why.
    pub fn describe(&self) -> String {
        format!(
            "DM step {} pc/cm³: a DM error of half a step smears the band by {:.1} µs, the \
             time resolution (sampling and pulse width) of {:.1} µs",
            dm_for_print(self.step),
            self.smear_s * 1e6,
            self.resolution_s * 1e6
        )
    }
}

/// The DM step for `band` dedispersed coherently to series of `tsamp_out_s`, searching for
/// pulses at least `width_s` wide: coherent dedispersion removes the smearing within each
/// channel at the trial DM, so a trial off the true DM by `δ` smears the whole band by
/// `k·δ·(f_lo⁻² − f_hi⁻²)`; the step makes that, at half a step, the time resolution.
pub fn dm_step_for(band: &Band, tsamp_out_s: f64, width_s: f64, constant: f64) -> DmStepPlan {
    let (lo, hi) = (band.lowest_mhz(), band.highest_mhz());
    let per_dm = constant * (lo.powi(-2) - hi.powi(-2));
    let resolution_s = tsamp_out_s.hypot(width_s);
    let exact = 2.0 * resolution_s / per_dm;
    // Two significant digits, rounded down so the smearing stays within the resolution.
    let scale = 10f64.powf(exact.log10().floor() - 1.0);
    let step = (exact / scale).floor() * scale;
    DmStepPlan {
        step,
        smear_s: per_dm * step / 2.0,
        resolution_s,
    }
}

/// DMs from `start` to `end` inclusive in steps of `step`.
pub fn dm_grid(start: f64, end: f64, step: f64) -> Vec<f64> {
    if step <= 0.0 || end < start {
        return vec![start];
    }
    let n = ((end - start) / step + 1e-9).floor() as usize + 1;
    (0..n).map(|i| start + i as f64 * step).collect()
}

/// One row of the ranked table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// 1 for the most significant.
    pub rank: usize,
    /// Spin period, s.
    pub period_s: f64,
    /// Spin frequency, Hz.
    pub freq_hz: f64,
    /// DM trial with the highest folded S/N.
    pub dm: f64,
    /// Gaussian-equivalent significance of the best harmonic sum, trials included.
    pub sigma: f64,
    /// S/N of the folded profile at `dm`.
    pub snr: f64,
    /// Harmonics in the best harmonic sum.
    pub nharm: usize,
    /// DM trials where the signal was detected.
    pub dm_hits: usize,
    /// Pulse width as a fraction of the period (best boxcar).
    pub duty: f64,
    /// Why the candidate is probably not a pulsar (empty: no reason known), such as
    /// `zero-DM(97%)`: as bright at DM 0 as at its best DM. Flagged candidates are ranked
    /// after all unflagged ones.
    #[serde(default)]
    pub flag: String,
    /// Drift of the spin frequency, Hz/s (0 without an acceleration search);
    /// `freq_hz` is the frequency at the middle of the observation.
    #[serde(default)]
    pub fdot_hz_s: f64,
    /// The line-of-sight acceleration that drift means, m/s² (`ḟ·c/f`, PRESTO's sign).
    #[serde(default)]
    pub accel_ms2: f64,
}

/// A candidate with what the plots need.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateDetail {
    /// The table row.
    pub candidate: Candidate,
    /// Folded profile at the best DM.
    pub profile: Profile,
    /// Folded S/N at every trial DM.
    pub snr_vs_dm: Vec<f64>,
    /// Whitened spectral power (unit mean for noise) at each of the first `nharm`
    /// harmonics of the frequency, in the spectrum of the series at `dm` with any drift
    /// taken out: what an ACCEL file lists per harmonic.
    #[serde(default)]
    pub harmonic_powers: Vec<f64>,
    /// Raw power, phase, centroid and purity at each of those harmonics, from the series
    /// itself ([`crate::fourier_props`]).
    #[serde(default)]
    pub harmonic_props: Vec<crate::fourier_props::HarmonicProps>,
}

/// Wall-clock time spent in each stage, s.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Reading and dedispersing.
    pub dedisperse_s: f64,
    /// Spectra, whitening, harmonic sums.
    pub periodicity_s: f64,
    /// Sifting and folding.
    pub fold_s: f64,
}

/// Everything a search produced.
#[derive(Clone, Debug)]
pub struct SearchOutcome {
    /// Ranked candidates above threshold.
    pub candidates: Vec<CandidateDetail>,
    /// Trial DMs.
    pub dms: Vec<f64>,
    /// Sample interval of the dedispersed series, s.
    pub tsamp_s: f64,
    /// Length of each series.
    pub nsamples: usize,
    /// Whitened spectrum at the top candidate's DM (or DM index 0 without candidates).
    pub spectrum: PowerSpectrum,
    /// DM of `spectrum`.
    pub spectrum_dm: f64,
    /// Stage timings.
    pub timings: Timings,
    /// Complex samples (all channels and polarisations) dedispersed per DM.
    pub complex_samples: u64,
    /// What interference clipping removed from the series.
    pub masked: MaskSummary,
    /// Single pulses at every DM, brightest first (`None`: the search was not asked for).
    pub single_pulses: Option<Vec<SinglePulse>>,
    /// What the input's headers say of the observation (empty where nothing does).
    pub metadata: Metadata,
    /// The band searched, where known: the input's, or its sub-channels' where channels were
    /// split ([`PlanConfig::subchannels`]).
    pub band: Option<Band>,
    /// Time from the input's first sample to the series' first, at the reference
    /// frequency, s.
    pub start_offset_s: f64,
    /// Largest drift the acceleration search tried, Fourier bins (0: none).
    pub zmax: f64,
    /// The top candidates' folds for their plots, in rank order.
    pub diagnostics: Vec<FoldDiagnostics>,
}

impl SearchOutcome {
    /// MJD of the searched series' first sample, where the input gave a start time.
    pub fn series_start_mjd(&self) -> Option<f64> {
        self.metadata
            .start_mjd
            .map(|m| m + self.start_offset_s / 86_400.0)
    }

    /// Record what the input says of the observation, and fold the top
    /// [`SearchConfig::candidate_plots`] candidates for their plots: what every search
    /// mode does once its candidates are ranked. `channels` (the assembler the series
    /// came from) adds the frequency panel.
    pub fn describe(
        &mut self,
        series: &[DmSeries],
        channels: Option<&PowerAssembler>,
        band: &Band,
        metadata: &Metadata,
        config: &SearchConfig,
    ) {
        let t0 = Instant::now();
        self.metadata = metadata.clone();
        self.band = Some(band.clone());
        let channels = channels.map(|assembler| Channels {
            assembler,
            centre_mhz: &band.centre_mhz,
        });
        self.diagnostics =
            diagnostics::diagnose(series, channels, &self.candidates, config.candidate_plots);
        self.timings.fold_s += t0.elapsed().as_secs_f64();
    }
}

/// Dedisperse every block of `reader` at every DM of `plan`. `progress(done, total)` is
/// called after each block.
///
/// # Errors
/// Read errors, or a file too short for one output sample.
pub fn dedisperse_reader(
    reader: &mut BasebandReader,
    plan: &DedispersionPlan,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PowerAssembler, SearchError> {
    dedisperse_source(reader, plan, progress)
}

/// Where a driver's blocks come from: a file, or a file through a filterbank.
pub(crate) trait BlockSource {
    /// Samples per series.
    fn nsamples(&self) -> u64;
    /// Samples `[start, start + out.nsamp())`, zeros past the end.
    fn read_padded_into(&mut self, start: u64, out: &mut Voltages) -> Result<(), ReadError>;
}

impl BlockSource for BasebandReader {
    fn nsamples(&self) -> u64 {
        BasebandReader::nsamples(self)
    }
    fn read_padded_into(&mut self, start: u64, out: &mut Voltages) -> Result<(), ReadError> {
        BasebandReader::read_padded_into(self, start, out)
    }
}

impl BlockSource for SubchannelReader<'_> {
    fn nsamples(&self) -> u64 {
        SubchannelReader::nsamples(self)
    }
    fn read_padded_into(&mut self, start: u64, out: &mut Voltages) -> Result<(), ReadError> {
        SubchannelReader::read_padded_into(self, start, out)
    }
}

fn dedisperse_source(
    source: &mut impl BlockSource,
    plan: &DedispersionPlan,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PowerAssembler, SearchError> {
    let nsamples = source.nsamples();
    let nblocks = plan.num_blocks(nsamples);
    if nblocks == 0 {
        return Err(SearchError::too_short(plan, nsamples));
    }
    plan.check_series_memory(nsamples)?;
    let mut assembler = PowerAssembler::for_input(plan, nsamples);
    let mut ws = plan.workspace();
    let mut block = Voltages::zeros(plan.band().nchan(), plan.band().npol, plan.fft_len());
    for b in 0..nblocks {
        source.read_padded_into(plan.block_start(b), &mut block)?;
        let power = plan.process_block(&mut ws, b, &block);
        assembler.insert(&power)?;
        progress(b + 1, nblocks);
    }
    Ok(assembler)
}

/// What a search of a file dedisperses: the plan, made for the file's length, and where
/// [`PlanConfig::subchannels`] splits channels, the filterbank and a plan for its band. Every
/// search mode over a file makes it here, so the distributed search's blocks are the
/// single-process search's.
pub(crate) struct SearchPlan {
    /// The dedispersion plan (for the sub-channels' band where channels are split).
    pub plan: DedispersionPlan,
    /// The filterbank the plan's blocks are read through, if any.
    pub filterbank: Option<filterbank::Filterbank>,
    /// Samples per series the plan dedisperses (sub-channel samples where split).
    pub nsamples: u64,
}

impl SearchPlan {
    /// The plan for `nsamples` input samples of `band` searched with `config`.
    ///
    /// # Errors
    /// Plan and filterbank errors (a bad count of sub-channels, a downsampling factor that
    /// is not a whole number of sub-channel samples).
    pub(crate) fn new(
        band: &Band,
        nsamples: u64,
        config: &SearchConfig,
    ) -> Result<SearchPlan, SearchError> {
        let (plan, filterbank) =
            split_plan(band, &config.dms, &config.plan.clone().data_len(nsamples))?;
        Ok(SearchPlan {
            plan,
            nsamples: filterbank
                .as_ref()
                .map_or(nsamples, |fb| fb.output_len(nsamples)),
            filterbank,
        })
    }
}

/// The plan for `band` at `dms` with `config`, and where [`PlanConfig::subchannels`] splits
/// channels, the filterbank whose band the plan is made for
/// ([`Filterbank::plan_config`](filterbank::Filterbank::plan_config)).
///
/// # Errors
/// Plan and filterbank errors.
pub(crate) fn split_plan(
    band: &Band,
    dms: &[f64],
    config: &PlanConfig,
) -> Result<(DedispersionPlan, Option<filterbank::Filterbank>), SearchError> {
    Ok(match filterbank::for_plan(band, config)? {
        None => (DedispersionPlan::new(band, dms, config)?, None),
        Some(fb) => (
            DedispersionPlan::new(fb.band(), dms, &fb.plan_config(config)?)?,
            Some(fb),
        ),
    })
}

/// Search a file: plan, dedisperse, search each DM, rank. With
/// [`PlanConfig::subchannels`] above 1 the channels are first split by a
/// [`Filterbank`](crate::Filterbank) and the plan is made for its band.
///
/// # Errors
/// Read, plan, filterbank and assembly errors.
pub fn search_file(
    reader: &mut BasebandReader,
    config: &SearchConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SearchOutcome, SearchError> {
    let t0 = Instant::now();
    let SearchPlan {
        plan,
        filterbank,
        nsamples,
    } = SearchPlan::new(reader.band(), reader.nsamples(), config)?;
    let assembler = match filterbank {
        None => dedisperse_source(reader, &plan, progress)?,
        Some(fb) => dedisperse_source(&mut SubchannelReader::new(reader, fb), &plan, progress)?,
    };
    let mut series = assembler.finish()?;
    let masked = clean_series(&mut series, config);
    let dedisperse_s = t0.elapsed().as_secs_f64();
    let complex_samples = plan.complex_samples(nsamples);
    let mut outcome = search_series(&series, config);
    outcome.masked = masked;
    outcome.timings.dedisperse_s = dedisperse_s;
    outcome.complex_samples = complex_samples;
    outcome.describe(
        &series,
        Some(&assembler),
        plan.band(),
        reader.metadata(),
        config,
    );
    Ok(outcome)
}

/// Interference clipping of freshly assembled series, as every search mode does before its
/// periodicity search (see [`rfi::clip`]).
pub fn clean_series(series: &mut [DmSeries], config: &SearchConfig) -> MaskSummary {
    rfi::clip(series, config.rfi.clip_sigma)
}

/// Periodicity search, sifting and folding of already dedispersed series (all of one length
/// and sample interval, in the order of `config.dms`).
///
/// # Panics
/// If `series` is empty or the series differ in length.
pub fn search_series(series: &[DmSeries], config: &SearchConfig) -> SearchOutcome {
    let t0 = Instant::now();
    let plan = periodicity_plan(series, config);
    let detections: Vec<SpectralCandidate> = series
        .iter()
        .enumerate()
        .flat_map(|(k, s)| plan.search(&s.data, k))
        .collect();
    let periodicity_s = t0.elapsed().as_secs_f64();
    outcome_from_detections(series, detections, config, periodicity_s)
}

/// The periodicity plan [`search_series`] uses for these series.
///
/// # Panics
/// If `series` is empty or the series differ in length.
pub fn periodicity_plan(series: &[DmSeries], config: &SearchConfig) -> PeriodicityPlan {
    assert!(!series.is_empty(), "no series to search");
    let len = series[0].data.len();
    assert!(
        series.iter().all(|s| s.data.len() == len),
        "series lengths differ"
    );
    PeriodicityPlan::new(len, series[0].tsamp_s, config.periodicity.clone())
}

/// Sifting, folding and ranking of detections already made, as [`search_series`] does after
/// its periodicity search: `detections` must be in the order that search produces them (DM
/// index order, each DM's list as [`PeriodicityPlan::search`] returns it). A distributed
/// search that gathers per-DM lists and concatenates them in DM order gets the same outcome.
///
/// # Panics
/// If `series` is empty.
pub fn outcome_from_detections(
    series: &[DmSeries],
    detections: Vec<SpectralCandidate>,
    config: &SearchConfig,
    periodicity_s: f64,
) -> SearchOutcome {
    let plan = periodicity_plan(series, config);
    let len = series[0].data.len();
    let tsamp = series[0].tsamp_s;
    let t1 = Instant::now();
    let mut candidates = rank_candidates(series, detections, config);
    for c in &mut candidates {
        (c.harmonic_powers, c.harmonic_props) = harmonics(series, &plan, c);
    }
    let spectrum_index = candidates
        .first()
        .and_then(|c| series.iter().position(|s| s.dm == c.candidate.dm))
        .unwrap_or(0);
    let spectrum = plan.spectrum(&series[spectrum_index].data);
    let single_pulses = config
        .single_pulse
        .enabled
        .then(|| single_pulse::search(series, input_tsamp(series, config), &config.single_pulse));
    SearchOutcome {
        candidates,
        dms: series.iter().map(|s| s.dm).collect(),
        tsamp_s: tsamp,
        nsamples: len,
        spectrum,
        spectrum_dm: series[spectrum_index].dm,
        timings: Timings {
            dedisperse_s: 0.0,
            periodicity_s,
            fold_s: t1.elapsed().as_secs_f64(),
        },
        complex_samples: 0,
        masked: MaskSummary::default(),
        single_pulses,
        metadata: Metadata::default(),
        band: None,
        start_offset_s: series[0].start_sample as f64 * input_tsamp(series, config),
        zmax: config.periodicity.zmax,
        diagnostics: Vec::new(),
    }
}

/// Sample interval of the input the series were dedispersed from, s.
fn input_tsamp(series: &[DmSeries], config: &SearchConfig) -> f64 {
    series[0].tsamp_s / config.plan.downsample.max(1) as f64
}

/// For each of `c`'s first `nharm` harmonics, in its best DM's series with its drift taken
/// out: the whitened power in the spectrum (the highest of the two half-bins either side of
/// the harmonic and the one on it), and its Fourier properties at the folded frequency.
fn harmonics(
    series: &[DmSeries],
    plan: &PeriodicityPlan,
    c: &CandidateDetail,
) -> (Vec<f64>, Vec<crate::fourier_props::HarmonicProps>) {
    let Some(s) = series.iter().find(|s| s.dm == c.candidate.dm) else {
        return (Vec::new(), Vec::new());
    };
    let f0 = c.profile.freq_hz;
    let x = without_drift(s, f0, c.candidate.fdot_hz_s);
    let spectrum = plan.spectrum(&x);
    let power = &spectrum.power;
    let tobs = x.len() as f64 * s.tsamp_s;
    (1..=c.candidate.nharm.max(1))
        .map(|h| {
            let at = (h as f64 * f0 / spectrum.df_hz).round() as usize;
            let p = (at.saturating_sub(1)..=at + 1)
                .filter_map(|i| power.get(i))
                .fold(0.0f64, |m, p| m.max(f64::from(*p)));
            (
                p,
                crate::fourier_props::harmonic_props(&x, h as f64 * f0 * tobs),
            )
        })
        .unzip()
}

/// The samples of `s` as a pulse of frequency `f_start` at the start and drift `fdot` folds
/// them at the constant `f_start` (the series itself without drift).
fn without_drift(s: &DmSeries, f_start: f64, fdot: f64) -> std::borrow::Cow<'_, [f32]> {
    if fdot == 0.0 {
        std::borrow::Cow::Borrowed(&s.data[..])
    } else {
        std::borrow::Cow::Owned(fold::dedrift(&s.data, s.tsamp_s, f_start, fdot))
    }
}

/// Speed of light, m/s.
pub const SPEED_OF_LIGHT_M_S: f64 = 299_792_458.0;

/// A weaker candidate at up to this many times a stronger one's frequency is a harmonic of
/// it where the stronger one's profile has power at that harmonic: a narrow pulse has strong
/// harmonics far beyond the 16 summed.
pub const MAX_HARMONIC_RATIO: usize = 64;

/// Tolerance of that comparison, in parts of `1/T`: the resolution of folding at 64 bins,
/// whatever the number of bins a profile has.
const HARMONIC_TOLERANCE_BINS: f64 = 64.0;

/// Sift detections from all DMs, fold the strongest, drop harmonics and weak ones, rank.
pub fn rank_candidates(
    series: &[DmSeries],
    detections: Vec<SpectralCandidate>,
    config: &SearchConfig,
) -> Vec<CandidateDetail> {
    let len = series[0].data.len();
    let tsamp = series[0].tsamp_s;
    let tobs = len as f64 * tsamp;
    let clusters = sift::cluster(detections, config.freq_tolerance_bins / tobs);
    let sigmas: Vec<f64> = series.iter().map(|s| fold::std_dev(&s.data)).collect();
    // (candidate, spectral frequency, standard deviation of its best DM's series)
    let mut refined: Vec<(CandidateDetail, f64, f64)> = Vec::new();
    let spectral_df = 1.0 / (crate::periodicity::padded_len(len) as f64 * tsamp);
    let budget = (3 * config.max_candidates).max(20);
    let dms: Vec<f64> = series.iter().map(|s| s.dm).collect();
    for cl in clusters
        .iter()
        .filter(|c| c.best.sigma >= config.threshold_sigma)
        .take(budget)
    {
        let best = &cl.best;
        // An accelerated candidate is folded on series resampled to take its drift out,
        // starting from its frequency at the start of the observation.
        let fdot = best.z / (tobs * tobs);
        let f_start = best.freq_hz - 0.5 * fdot * tobs;
        let view = |s| without_drift(s, f_start, fdot);
        let first = view(&series[best.dm_index]);
        // The harmonic sum pins the fundamental to about 1/(n·T).
        let half = 1.0 / (best.nharm as f64 * tobs);
        let coarse = fold::refine(&first, tsamp, f_start, half, config.fold_bins);
        let nbins = coarse.means.len();
        let snr_vs_dm: Vec<f64> = series
            .iter()
            .zip(&sigmas)
            .map(|(s, sigma)| fold::profile(&view(s), tsamp, coarse.freq_hz, nbins, *sigma).snr)
            .collect();
        let best_dm = dm_peak(&snr_vs_dm).unwrap_or(best.dm_index);
        let flag = rfi::zero_dm_flag(&dms, &snr_vs_dm, &config.rfi);
        let profile = fold::refine(
            &view(&series[best_dm]),
            tsamp,
            coarse.freq_hz,
            1.0 / (nbins as f64 * tobs),
            config.fold_bins,
        );
        // Folding moved the start frequency a little; the drift scales with it.
        let fdot = fdot * profile.freq_hz / f_start;
        let f_mid = profile.freq_hz + 0.5 * fdot * tobs;
        refined.push((
            CandidateDetail {
                candidate: Candidate {
                    rank: 0,
                    period_s: 1.0 / f_mid,
                    freq_hz: f_mid,
                    dm: series[best_dm].dm,
                    sigma: best.sigma,
                    snr: profile.snr,
                    nharm: best.nharm,
                    dm_hits: cl.hits.len(),
                    duty: profile.equivalent_width_bins() / profile.means.len() as f64,
                    flag,
                    fdot_hz_s: fdot,
                    accel_ms2: fdot * SPEED_OF_LIGHT_M_S / f_mid,
                },
                profile,
                snr_vs_dm,
                harmonic_powers: Vec::new(),
                harmonic_props: Vec::new(),
            },
            best.freq_hz,
            sigmas[best_dm],
        ));
    }
    // Drop what a stronger candidate explains: a duplicate or simple-ratio harmonic of its
    // refined frequency (tolerance: the folding resolution), or a peak whose spectral
    // frequency puts one of its first 16 harmonics on a harmonic of the stronger pulsar
    // (tolerance: the half-bin spectral grid) and which folding does not confirm. A strong
    // pulsar's harmonics make such peaks at many ratios k/h; a real, independent pulsar
    // folds to an S/N comparable to its spectral significance, they do not.
    let fold_tol = 1.0 / (HARMONIC_TOLERANCE_BINS * tobs);
    let mut kept: Vec<CandidateDetail> = Vec::new();
    let mut kept_sigma: Vec<f64> = Vec::new();
    for (c, spectral_freq, sigma) in refined {
        let explained = kept.iter().zip(&kept_sigma).any(|(k, ksigma)| {
            let fa = k.candidate.freq_hz;
            let simple = sift::harmonic_ratio(
                c.candidate.freq_hz,
                fa,
                config.periodicity.max_harmonics.max(2),
                fold_tol,
            )
            .is_some();
            // A high harmonic of the stronger pulsar's profile, where that profile still
            // has power (a narrow pulse).
            let high =
                sift::integer_multiple(c.candidate.freq_hz, fa, MAX_HARMONIC_RATIO, fold_tol)
                    .is_some_and(|h| fold::harmonic_snr(&k.profile, *ksigma, h) >= 3.0);
            // Low-order ratios (subharmonics, 2f, 3f/2…) within the spectral resolution,
            // judged on either frequency estimate of the weaker candidate.
            let low_order = [c.candidate.freq_hz, spectral_freq]
                .iter()
                .any(|f| sift::harmonic_ratio(*f, fa, 4, 0.25 * spectral_df + fold_tol).is_some());
            let unconfirmed = c.candidate.snr < 0.8 * c.candidate.sigma;
            simple
                || high
                || low_order
                || (unconfirmed
                    && sift::shares_harmonic(spectral_freq, fa, 16, 0.5 * spectral_df, fold_tol))
        });
        if !explained {
            kept.push(c);
            kept_sigma.push(sigma);
        }
    }
    // Probable interference after every candidate without a flag (a stable sort keeps the
    // order of significance within each group).
    kept.sort_by_key(|c| !c.candidate.flag.is_empty());
    kept.truncate(config.max_candidates);
    for (i, c) in kept.iter_mut().enumerate() {
        c.candidate.rank = i + 1;
    }
    kept
}

/// Index of the trial DM at the centre of the peak of an S/N-against-DM curve: the centroid
/// of the contiguous region within 10% of the maximum. A broad pulse gives a flat-topped
/// curve whose highest point is set by noise; its centre is not.
pub fn dm_peak(snr: &[f64]) -> Option<usize> {
    let (k, &max) = snr
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))?;
    if max <= 0.0 {
        return Some(k);
    }
    let floor = 0.9 * max;
    let (mut lo, mut hi) = (k, k);
    while lo > 0 && snr[lo - 1] >= floor {
        lo -= 1;
    }
    while hi + 1 < snr.len() && snr[hi + 1] >= floor {
        hi += 1;
    }
    let (mut num, mut den) = (0.0, 0.0);
    for (i, v) in snr.iter().enumerate().take(hi + 1).skip(lo) {
        let w = v - floor;
        num += i as f64 * w;
        den += w;
    }
    Some(if den > 0.0 {
        (num / den).round() as usize
    } else {
        k
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dm_peak_is_the_centre_of_a_flat_top() {
        assert_eq!(dm_peak(&[]), None);
        assert_eq!(dm_peak(&[1.0, 5.0, 2.0]), Some(1));
        // Highest point at index 2, but the plateau is centred on 4.
        assert_eq!(
            dm_peak(&[1.0, 9.5, 10.0, 9.8, 9.8, 9.7, 9.6, 9.5, 2.0]),
            Some(4)
        );
        assert_eq!(dm_peak(&[-1.0, -0.5]), Some(1));
    }

    #[test]
    fn dm_step_matches_the_smearing_to_the_resolution() {
        // 430 MHz, 2 MHz wide: one DM unit smears the band by k·(429⁻² − 431⁻²) = 209 µs.
        let band = Band::from_total(430.0, 2.0, 2, 1e6, true, 1);
        let k = crate::DEFAULT_DISPERSION_CONSTANT;
        let plan = dm_step_for(&band, 16e-6, 0.0, k);
        // 2 × 16 µs / 209 µs = 0.153…, rounded down to 0.15.
        assert!((plan.step - 0.15).abs() < 1e-12, "{plan:?}");
        assert!(plan.smear_s <= plan.resolution_s && plan.smear_s > 0.95 * plan.resolution_s);
        // A wider pulse allows a coarser step; a wider band needs a finer one.
        assert_eq!(dm_step_for(&band, 16e-6, 1e-3, k).step, 9.5);
        let wide = Band::from_total(430.0, 20.0, 2, 1e7, true, 1);
        assert!(dm_step_for(&wide, 16e-6, 0.0, k).step < plan.step / 5.0);
        assert!(
            plan.describe().contains("DM step 0.15"),
            "{}",
            plan.describe()
        );
    }

    #[test]
    fn grid() {
        assert_eq!(dm_grid(0.0, 10.0, 2.5), vec![0.0, 2.5, 5.0, 7.5, 10.0]);
        assert_eq!(dm_grid(5.0, 5.0, 1.0), vec![5.0]);
        assert_eq!(dm_grid(5.0, 1.0, 1.0), vec![5.0]);
        assert_eq!(dm_grid(0.0, 0.3, 0.1).len(), 4);
    }
}
