//! Phase-coherent dedispersion by overlap-save, for one or many trial DMs.
//!
//! Block `b` of the input is samples `[b·step, b·step + fft_len)` of every channel and
//! polarisation. Each is transformed once ([`DedispersionPlan::forward`]); then, per trial
//! DM, multiplied by that DM's chirp and transformed back ([`DedispersionPlan::detect`] or
//! [`DedispersionPlan::voltages`]). Of the `fft_len` outputs, the first `lead` and the last
//! `fft_len − lead − step` are corrupted by the circular wrap-around and discarded; the
//! `step` valid samples of consecutive blocks tile the stream. That is the paper's saving:
//! one forward FFT per block whatever the number of DMs.
//!
//! Every block is a pure function of its input, and a plan is `Send + Sync`, so a driver can
//! hand out blocks (data chunks) and DM subsets to different workers, each with its own
//! [`Workspace`].

use std::sync::Arc;

use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};

use crate::band::{Band, Sideband};
use crate::chirp;
use crate::dm::{Dispersion, DEFAULT_DISPERSION_CONSTANT};
use crate::voltages::Voltages;

/// Largest FFT a default plan will pick before declaring the DM range unreasonable.
const MAX_DEFAULT_FFT: usize = 1 << 24;

/// `(need, have)` in gigabytes where `need` bytes exceed `memory` (`None`: unknown, no
/// check).
fn over_memory(need: u128, memory: Option<u64>) -> Option<(f64, f64)> {
    let have = memory?;
    (need > u128::from(have)).then(|| (need as f64 / 1e9, have as f64 / 1e9))
}

/// Fails where the chirp tables of `ndm` DMs × `nchan` channels × `fft_len` complex
/// samples (8 bytes each) would need more than `memory` bytes (`None`: unknown, no check).
fn check_memory(
    ndm: usize,
    nchan: usize,
    fft_len: usize,
    memory: Option<u64>,
) -> Result<(), PlanError> {
    let need = (ndm as u128) * (nchan as u128) * (fft_len as u128) * 8;
    match over_memory(need, memory) {
        Some((need_gb, have_gb)) => Err(PlanError::TooLarge {
            ndm,
            nchan,
            fft_len,
            need_gb,
            have_gb,
        }),
        None => Ok(()),
    }
}

/// Fails where `ndm` × `nchan` series of `samples` floats would need more than `memory`
/// bytes (`None`: unknown, no check).
fn series_fit(
    ndm: usize,
    nchan: usize,
    samples: u64,
    memory: Option<u64>,
) -> Result<(), PlanError> {
    let need = (ndm as u128) * (nchan as u128) * u128::from(samples) * 4;
    match over_memory(need, memory) {
        Some((need_gb, have_gb)) => Err(PlanError::SeriesTooLarge {
            ndm,
            nchan,
            samples,
            need_gb,
            have_gb,
        }),
        None => Ok(()),
    }
}

/// The machine's memory in bytes (`MemTotal` of `/proc/meminfo`), where it can be read.
fn memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb.saturating_mul(1024))
}

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum PlanError {
    /// No trial DMs.
    #[error("no trial DMs given")]
    NoDms,
    /// A DM is NaN or infinite.
    #[error("trial DM {0} is not a finite number")]
    BadDm(f64),
    /// A parameter out of range.
    #[error("{name} = {value} is not valid: expected {expected}")]
    BadParameter {
        /// The parameter.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// The detected series held until assembly (every DM, every channel, the whole file)
    /// would not fit in this machine's memory.
    #[error(
        "the search holds {need_gb:.1} GB of detected series until it sums the channels \
         ({ndm} trial DMs × {nchan} channels × {samples} samples), more than this machine's \
         {have_gb:.1} GB of memory: use fewer trial DMs (a larger --dm-step or --min-width), \
         more downsampling, fewer sub-channels, or a shorter file"
    )]
    SeriesTooLarge {
        /// Trial DMs.
        ndm: usize,
        /// Channels of the band (sub-channels where the band was split).
        nchan: usize,
        /// Output samples per channel and DM.
        samples: u64,
        /// Gigabytes the series need.
        need_gb: f64,
        /// Gigabytes of memory the machine has.
        have_gb: f64,
    },
    /// The plan's tables would not fit in this machine's memory (a header may claim any
    /// number of channels: that must end in this error, not in a failed allocation).
    #[error(
        "the plan needs {need_gb:.1} GB for its tables ({ndm} trial DMs × {nchan} channels \
         × FFT length {fft_len}), more than this machine's {have_gb:.1} GB of memory: use \
         fewer trial DMs or channels, or a shorter FFT"
    )]
    TooLarge {
        /// Trial DMs.
        ndm: usize,
        /// Channels of the band.
        nchan: usize,
        /// FFT length (a lower bound where the plan had not chosen it yet).
        fft_len: usize,
        /// Gigabytes the tables need.
        need_gb: f64,
        /// Gigabytes of memory the machine has.
        have_gb: f64,
    },
    /// The data are shorter than the dispersive smear at the largest DM plus one output.
    #[error(
        "the data hold {nsamples} samples per channel, fewer than the {needed} that \
         dedispersing up to DM {max_dm} needs for one output sample (the dispersive sweep \
         across the band), whatever the FFT length: use longer data or a lower DM range"
    )]
    DataTooShort {
        /// Samples per channel in the data.
        nsamples: u64,
        /// Shortest length that gives one output sample.
        needed: u64,
        /// Largest trial DM.
        max_dm: f64,
    },
    /// The FFT cannot hold the dispersive smear plus one downsampled output.
    #[error(
        "FFT length {fft_len} is too short: the dispersive smear needs an overlap of {overlap} \
         samples; use at least {suggested}"
    )]
    FftTooShort {
        /// Length asked for.
        fft_len: usize,
        /// Overlap needed.
        overlap: usize,
        /// A length that works (power of two, ≥ 4× the overlap).
        suggested: usize,
    },
}

/// Tuning of a [`DedispersionPlan`]; `Default` plus chainable setters.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlanConfig {
    /// FFT length; `None` picks a power of two of at least four times the overlap.
    pub fft_len: Option<usize>,
    /// Frequency (MHz) the output is referred to; `None` is the band centre.
    pub reference_mhz: Option<f64>,
    /// Overrides the sideband from the file header.
    pub sideband: Option<Sideband>,
    /// Dispersion constant, s MHz² cm³ pc⁻¹.
    pub dispersion_constant: f64,
    /// Detected samples summed into one output sample.
    pub downsample: usize,
    /// Extra samples of overlap beyond the computed smear, split between the start and end
    /// of each block: the chirp's impulse response has tails (diffraction at the band edges)
    /// that decay only as 1/lag, worth about 1% RMS with none.
    pub extra_overlap: usize,
    /// Samples per channel of the data to be dedispersed, where known: a default FFT length
    /// is then no longer than the data need (one padded block covers a short file).
    #[serde(default)]
    pub data_len: Option<u64>,
    /// Sub-channels each channel is split into by a coherent [`Filterbank`] before
    /// dedispersion (dspsr's `-F`; 1: none). Drivers that take it ([`search_file`],
    /// [`dedisperse_file`], [`search_distributed`], [`stream_search`]) make the filterbank
    /// and a plan for its band with [`Filterbank::plan_config`]; [`DedispersionPlan::new`]
    /// itself refuses anything but 1.
    ///
    /// [`Filterbank`]: crate::filterbank::Filterbank
    /// [`Filterbank::plan_config`]: crate::filterbank::Filterbank::plan_config
    /// [`search_file`]: crate::search_file
    /// [`dedisperse_file`]: crate::products::dedisperse_file
    /// [`search_distributed`]: crate::distributed::search_distributed
    /// [`stream_search`]: crate::distributed::stream::stream_search
    #[serde(default = "one")]
    pub subchannels: usize,
}

fn one() -> usize {
    1
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            fft_len: None,
            reference_mhz: None,
            sideband: None,
            dispersion_constant: DEFAULT_DISPERSION_CONSTANT,
            downsample: 1,
            extra_overlap: 0,
            data_len: None,
            subchannels: 1,
        }
    }
}

impl PlanConfig {
    /// Set the FFT length.
    pub fn fft_len(mut self, n: usize) -> Self {
        self.fft_len = Some(n);
        self
    }
    /// Set the reference frequency.
    pub fn reference_mhz(mut self, f: f64) -> Self {
        self.reference_mhz = Some(f);
        self
    }
    /// Override the sideband.
    pub fn sideband(mut self, s: Sideband) -> Self {
        self.sideband = Some(s);
        self
    }
    /// Set the dispersion constant.
    pub fn dispersion_constant(mut self, k: f64) -> Self {
        self.dispersion_constant = k;
        self
    }
    /// Set the downsampling factor.
    pub fn downsample(mut self, d: usize) -> Self {
        self.downsample = d;
        self
    }
    /// Add overlap.
    pub fn extra_overlap(mut self, n: usize) -> Self {
        self.extra_overlap = n;
        self
    }
    /// Say how many samples per channel the data hold (see [`PlanConfig::data_len`]).
    pub fn data_len(mut self, n: u64) -> Self {
        self.data_len = Some(n);
        self
    }
    /// Split each channel into `n` sub-channels first (see [`PlanConfig::subchannels`]).
    pub fn subchannels(mut self, n: usize) -> Self {
        self.subchannels = n;
        self
    }
}

/// Everything fixed about dedispersing one band at a set of DMs: FFT plans, chirps,
/// channel shifts and block geometry. Immutable and shareable between threads.
#[derive(Clone)]
pub struct DedispersionPlan {
    band: Band,
    dms: Vec<f64>,
    reference_mhz: f64,
    constant: f64,
    fft_len: usize,
    lead: usize,
    tail: usize,
    step: usize,
    downsample: usize,
    data_len: Option<u64>,
    chirps: Vec<Arc<[Complex32]>>,
    shifts: Vec<i64>,
    forward: Arc<dyn Fft<f32>>,
    inverse: Arc<dyn Fft<f32>>,
}

impl std::fmt::Debug for DedispersionPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedispersionPlan")
            .field("dms", &self.dms)
            .field("reference_mhz", &self.reference_mhz)
            .field("fft_len", &self.fft_len)
            .field("lead", &self.lead)
            .field("step", &self.step)
            .field("downsample", &self.downsample)
            .finish_non_exhaustive()
    }
}

/// Per-worker buffers for [`DedispersionPlan`]: block spectra and FFT scratch.
#[derive(Clone, Debug)]
pub struct Workspace {
    spectra: Vec<Complex32>,
    work: Vec<Complex32>,
    scratch: Vec<Complex32>,
}

/// Detected, downsampled power of one block for every DM and channel (polarisations
/// summed), not yet aligned across channels: `[dm][chan][step / downsample]`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockPower {
    /// Block index.
    pub block: u64,
    /// `[dm][chan][sample]`.
    pub data: Vec<f32>,
}

impl DedispersionPlan {
    /// Plan dedispersion of `band` at each of `dms`.
    ///
    /// # Errors
    /// No or non-finite DMs, a non-positive reference frequency or constant, a zero
    /// downsampling factor, or an FFT too short for the dispersive smear.
    pub fn new(band: &Band, dms: &[f64], config: &PlanConfig) -> Result<Self, PlanError> {
        if dms.is_empty() {
            return Err(PlanError::NoDms);
        }
        if let Some(bad) = dms.iter().find(|d| !d.is_finite()) {
            return Err(PlanError::BadDm(*bad));
        }
        let band = match config.sideband {
            Some(s) => band.clone().with_sideband(s),
            None => band.clone(),
        };
        let reference_mhz = config
            .reference_mhz
            .unwrap_or_else(|| band.band_centre_mhz());
        if !(reference_mhz > 0.0 && reference_mhz.is_finite()) {
            return Err(PlanError::BadParameter {
                name: "reference frequency",
                value: reference_mhz.to_string(),
                expected: "a positive frequency in MHz",
            });
        }
        if !(config.dispersion_constant > 0.0 && config.dispersion_constant.is_finite()) {
            return Err(PlanError::BadParameter {
                name: "dispersion constant",
                value: config.dispersion_constant.to_string(),
                expected: "a positive constant in s MHz² cm³/pc",
            });
        }
        let ds = config.downsample;
        if ds == 0 {
            return Err(PlanError::BadParameter {
                name: "downsample",
                value: "0".into(),
                expected: "an integer ≥ 1",
            });
        }
        if config.subchannels != 1 {
            return Err(PlanError::BadParameter {
                name: "subchannels",
                value: config.subchannels.to_string(),
                expected: "1 here: a plan for sub-channels is made for the filterbank's band, \
                           with Filterbank::plan_config",
            });
        }
        let nchan = band.nchan();
        // Before anything in proportion to DMs × channels is made: with the shortest FFT a
        // default plan picks (or the one asked for).
        let memory = memory_bytes();
        check_memory(dms.len(), nchan, config.fft_len.unwrap_or(1024), memory)?;
        let mut shifts = Vec::with_capacity(dms.len() * nchan);
        let (mut lag_max, mut lag_min) = (0.0f64, 0.0f64);
        for &dm in dms {
            let disp = Dispersion {
                dm,
                constant: config.dispersion_constant,
            };
            for c in 0..nchan {
                let shift = chirp::channel_shift(&band, c, disp, reference_mhz, ds);
                let (lo, hi) = chirp::lag_range(&band, c, disp, reference_mhz, shift);
                lag_min = lag_min.min(lo);
                lag_max = lag_max.max(hi);
                shifts.push(shift);
            }
        }
        // Discard at the start: the largest positive lag (plus half the extra overlap, since
        // the impulse response has tails on both sides), rounded up to whole output samples
        // so that blocks start on downsampled boundaries.
        let extra_lead = config.extra_overlap / 2;
        let lead = (lag_max.ceil() as usize + extra_lead).div_ceil(ds) * ds;
        let tail = (-lag_min).ceil() as usize + config.extra_overlap - extra_lead;
        let overlap = lead + tail;
        if let Some(n) = config.data_len {
            let needed = (lead + tail + ds) as u64;
            if n < needed {
                return Err(PlanError::DataTooShort {
                    nsamples: n,
                    needed,
                    max_dm: dms.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                });
            }
        }
        let suggested = (4 * overlap).max(ds * 4).max(1024).next_power_of_two();
        // Data shorter than the suggested FFT fit in one block (padded at the end) of the
        // next power of two above their length, as long as that block has room for output.
        let fitted = config
            .data_len
            .and_then(|n| usize::try_from(n).ok())
            .map(|n| n.next_power_of_two())
            .filter(|&n| n >= overlap + ds)
            .map_or(suggested, |n| n.min(suggested));
        let fft_len = match config.fft_len {
            Some(n) => n,
            None if fitted <= MAX_DEFAULT_FFT => fitted,
            None => {
                return Err(PlanError::FftTooShort {
                    fft_len: MAX_DEFAULT_FFT,
                    overlap,
                    suggested,
                })
            }
        };
        let step = fft_len.saturating_sub(overlap) / ds * ds;
        if step == 0 {
            return Err(PlanError::FftTooShort {
                fft_len,
                overlap,
                suggested,
            });
        }
        check_memory(dms.len(), nchan, fft_len, memory)?;
        let mut planner = FftPlanner::<f32>::new();
        let forward = planner.plan_fft_forward(fft_len);
        let inverse = planner.plan_fft_inverse(fft_len);
        let scale = 1.0 / fft_len as f32;
        let mut chirps = Vec::with_capacity(shifts.len());
        for (i, &dm) in dms.iter().enumerate() {
            let disp = Dispersion {
                dm,
                constant: config.dispersion_constant,
            };
            for c in 0..nchan {
                let h = chirp::build(
                    &band,
                    c,
                    disp,
                    reference_mhz,
                    shifts[i * nchan + c],
                    fft_len,
                    scale,
                );
                chirps.push(Arc::from(h));
            }
        }
        Ok(DedispersionPlan {
            band,
            dms: dms.to_vec(),
            reference_mhz,
            constant: config.dispersion_constant,
            fft_len,
            lead,
            tail,
            step,
            downsample: ds,
            data_len: config.data_len,
            chirps,
            shifts,
            forward,
            inverse,
        })
    }

    /// The same geometry (FFT length, lead, step, shifts) for a subset of the DMs, given by
    /// index: blocks processed with it are bit-for-bit the matching part of this plan's, so
    /// DMs can be shared out between workers.
    ///
    /// # Panics
    /// If an index is out of range.
    pub fn subset(&self, dm_indices: &[usize]) -> DedispersionPlan {
        let nchan = self.band.nchan();
        let mut plan = self.clone();
        plan.dms = dm_indices.iter().map(|&i| self.dms[i]).collect();
        plan.chirps = dm_indices
            .iter()
            .flat_map(|&i| self.chirps[i * nchan..(i + 1) * nchan].iter().cloned())
            .collect();
        plan.shifts = dm_indices
            .iter()
            .flat_map(|&i| self.shifts[i * nchan..(i + 1) * nchan].iter().copied())
            .collect();
        plan
    }

    /// The band (with any sideband override applied).
    pub fn band(&self) -> &Band {
        &self.band
    }
    /// Trial DMs.
    pub fn dms(&self) -> &[f64] {
        &self.dms
    }
    /// Reference frequency, MHz.
    pub fn reference_mhz(&self) -> f64 {
        self.reference_mhz
    }
    /// Dispersion constant.
    pub fn dispersion_constant(&self) -> f64 {
        self.constant
    }
    /// FFT length.
    pub fn fft_len(&self) -> usize {
        self.fft_len
    }
    /// Valid output samples per block (a multiple of the downsampling factor).
    pub fn step(&self) -> usize {
        self.step
    }
    /// Samples discarded at the start of each inverse transform.
    pub fn lead(&self) -> usize {
        self.lead
    }
    /// Samples shared by consecutive blocks.
    pub fn overlap(&self) -> usize {
        self.fft_len - self.step
    }
    /// Downsampling factor.
    pub fn downsample(&self) -> usize {
        self.downsample
    }
    /// Integer delay in input samples applied by indexing to channel `chan` at DM index `dm`.
    pub fn shift(&self, dm: usize, chan: usize) -> i64 {
        self.shifts[dm * self.band.nchan() + chan]
    }
    /// The (scaled) chirp of a DM index and channel.
    pub fn chirp(&self, dm: usize, chan: usize) -> &[Complex32] {
        &self.chirps[dm * self.band.nchan() + chan]
    }
    /// Samples discarded at the end of each inverse transform, at least: the largest
    /// negative lag plus the rest of the extra overlap.
    pub fn tail(&self) -> usize {
        self.tail
    }
    /// The data length the plan was made for ([`PlanConfig::data_len`]), if any.
    pub fn data_len(&self) -> Option<u64> {
        self.data_len
    }
    /// The same plan for data of `nsamples` samples per channel (a stream, once it ended).
    pub fn with_data_len(&self, nsamples: u64) -> DedispersionPlan {
        let mut plan = self.clone();
        plan.data_len = Some(nsamples);
        plan
    }
    /// Whether `nsamples` is the data length the plan knows and holds at least one FFT: the
    /// samples after the last whole block are then covered by one more block shifted back to
    /// end within the data (as baseband-tasks does). Otherwise the last block reaches past
    /// the end and is padded with zeros.
    fn shifted_tail(&self, nsamples: u64) -> bool {
        self.data_len == Some(nsamples) && nsamples >= self.fft_len as u64
    }
    /// End (exclusive, in input samples) of the dedispersed output of `nsamples` input
    /// samples. With the data length known and at least one FFT of data, the last block
    /// ends within the data: the output stops less than `tail` plus two output samples
    /// before their end. Otherwise (a stream, or less than one FFT) the last block is padded
    /// and the output stops where later outputs would need samples after the end: less
    /// than `tail` plus one output sample before it.
    pub fn valid_end(&self, nsamples: u64) -> u64 {
        let ds = self.downsample as u64;
        if self.shifted_tail(nsamples) {
            (nsamples - self.fft_len as u64) / ds * ds + (self.lead + self.step) as u64
        } else {
            nsamples.saturating_sub(self.tail as u64) / ds * ds
        }
    }
    /// Downsampled output samples per channel (before channels are aligned) that
    /// `nsamples` input samples give: input samples `[lead, valid_end)`, the whole input less
    /// the documented edges.
    pub fn output_len(&self, nsamples: u64) -> usize {
        let end = self.valid_end(nsamples);
        (end.saturating_sub(self.lead as u64) / self.downsample as u64) as usize
    }
    /// Complex input samples (all channels and polarisations) that reach the output when
    /// `nsamples` per channel are dedispersed at one DM: the throughput figures' unit.
    pub fn complex_samples(&self, nsamples: u64) -> u64 {
        (self.output_len(nsamples) * self.downsample * self.band.nchan() * self.band.npol) as u64
    }
    /// Shortest input (samples per channel) that gives one output sample.
    pub fn min_samples(&self) -> u64 {
        (self.lead + self.tail + self.downsample) as u64
    }
    /// Number of blocks that cover `nsamples` input samples between the edges: the whole
    /// blocks and, where samples remain, one more (see [`valid_end`](Self::valid_end)):
    /// shifted back ([`block_start`](Self::block_start)) or reaching past the end of the
    /// data, which is then read as zeros (see
    /// [`BasebandReader::read_padded_into`](crate::BasebandReader::read_padded_into)).
    /// The assemblers keep each output sample once, so every input sample between the
    /// edges reaches the output.
    pub fn num_blocks(&self, nsamples: u64) -> u64 {
        (self.output_len(nsamples) * self.downsample).div_ceil(self.step) as u64
    }
    /// First input sample of a block: `block × step`, except for the last block of the data
    /// length the plan knows, which is shifted back to end within the data.
    pub fn block_start(&self, block: u64) -> u64 {
        let plain = block * self.step as u64;
        match self.data_len {
            Some(n) if self.shifted_tail(n) && block > 0 && block + 1 == self.num_blocks(n) => {
                let ds = self.downsample as u64;
                plain.min((n - self.fft_len as u64) / ds * ds)
            }
            _ => plain,
        }
    }
    /// Valid output samples (not downsampled) at the start of `block` that the block before
    /// it already gave: non-zero only for a shifted last block. Assemblers skip them, so
    /// every output comes from exactly one block whatever order blocks arrive in.
    pub fn block_skip(&self, block: u64) -> usize {
        (block * self.step as u64 - self.block_start(block)) as usize
    }
    /// Output samples (downsampled) each block yields per channel.
    pub fn samples_per_block(&self) -> usize {
        self.step / self.downsample
    }

    /// Checks that the detected series a search of `nsamples` input samples holds until
    /// assembly ([`crate::assemble::PowerAssembler::for_input`]: 4 bytes per DM, channel
    /// and output sample) fit in this machine's memory, before they are allocated.
    ///
    /// # Errors
    /// [`PlanError::SeriesTooLarge`] with the sizes.
    pub fn check_series_memory(&self, nsamples: u64) -> Result<(), PlanError> {
        series_fit(
            self.dms.len(),
            self.band.nchan(),
            self.num_blocks(nsamples) * self.samples_per_block() as u64,
            memory_bytes(),
        )
    }

    /// Fresh buffers for one worker.
    pub fn workspace(&self) -> Workspace {
        let n = self.fft_len;
        let scratch = self
            .forward
            .get_inplace_scratch_len()
            .max(self.inverse.get_inplace_scratch_len());
        Workspace {
            spectra: vec![Complex32::new(0.0, 0.0); self.band.nchan() * self.band.npol * n],
            work: vec![Complex32::new(0.0, 0.0); n],
            scratch: vec![Complex32::new(0.0, 0.0); scratch],
        }
    }

    /// Transform one block of input (`fft_len` samples per series) into `ws`.
    ///
    /// # Panics
    /// If the block's shape does not match the plan.
    pub fn forward(&self, ws: &mut Workspace, input: &Voltages) {
        assert_eq!(
            input.nsamp(),
            self.fft_len,
            "block length must equal the FFT length"
        );
        assert_eq!(input.nchan(), self.band.nchan(), "channel count");
        assert_eq!(input.npol(), self.band.npol, "polarisation count");
        ws.spectra.copy_from_slice(input.as_slice());
        for series in ws.spectra.chunks_exact_mut(self.fft_len) {
            self.forward.process_with_scratch(series, &mut ws.scratch);
        }
    }

    /// Multiply the spectrum of (`chan`, `pol`) by the chirp of `dm` and invert, leaving the
    /// full `fft_len` outputs in the workspace; returns the valid `step` of them.
    fn invert<'w>(
        &self,
        ws: &'w mut Workspace,
        dm: usize,
        chan: usize,
        pol: usize,
    ) -> &'w [Complex32] {
        let n = self.fft_len;
        let at = (chan * self.band.npol + pol) * n;
        let spectrum = &ws.spectra[at..at + n];
        let h = self.chirp(dm, chan);
        for ((w, x), h) in ws.work.iter_mut().zip(spectrum).zip(h) {
            *w = x * h;
        }
        self.inverse
            .process_with_scratch(&mut ws.work, &mut ws.scratch);
        &ws.work[self.lead..self.lead + self.step]
    }

    /// Square-law detect, sum polarisations and downsample the block for DM index `dm`;
    /// `out` is `[chan][step / downsample]`, channels not yet aligned (see
    /// [`PowerAssembler`](crate::PowerAssembler)).
    ///
    /// # Panics
    /// If `out` has the wrong length or [`forward`](Self::forward) was not called.
    pub fn detect(&self, ws: &mut Workspace, dm: usize, out: &mut [f32]) {
        let per = self.samples_per_block();
        assert_eq!(out.len(), self.band.nchan() * per, "output length");
        let ds = self.downsample;
        let complex = self.band.complex;
        for (chan, out_c) in out.chunks_exact_mut(per).enumerate() {
            out_c.fill(0.0);
            for pol in 0..self.band.npol {
                let valid = self.invert(ws, dm, chan, pol);
                // Sub-channels are often downsampled by 1 or 2: there a loop per output
                // sample costs more than the detection, so those get loops the compiler
                // vectorises.
                match (complex, ds) {
                    (true, 1) => {
                        for (o, z) in out_c.iter_mut().zip(valid) {
                            *o += z.norm_sqr();
                        }
                    }
                    (true, 2) => {
                        for (o, run) in out_c.iter_mut().zip(valid.chunks_exact(2)) {
                            *o += run[0].norm_sqr() + run[1].norm_sqr();
                        }
                    }
                    (true, _) => {
                        for (o, run) in out_c.iter_mut().zip(valid.chunks_exact(ds)) {
                            *o += run.iter().map(|z| z.norm_sqr()).sum::<f32>();
                        }
                    }
                    (false, _) => {
                        for (o, run) in out_c.iter_mut().zip(valid.chunks_exact(ds)) {
                            *o += run.iter().map(|z| z.re * z.re).sum::<f32>();
                        }
                    }
                }
            }
        }
    }

    /// Forward-transform `input` and detect it at every DM: the whole work of one block.
    pub fn process_block(&self, ws: &mut Workspace, block: u64, input: &Voltages) -> BlockPower {
        self.forward(ws, input);
        let per_dm = self.band.nchan() * self.samples_per_block();
        let mut data = vec![0.0; per_dm * self.dms.len()];
        for (dm, out) in data.chunks_exact_mut(per_dm).enumerate() {
            self.detect(ws, dm, out);
        }
        BlockPower { block, data }
    }

    /// Dedispersed voltages of the block for DM index `dm`: `step` valid samples per
    /// (channel, polarisation), channels not yet aligned (channel `c`'s sample `i` is at
    /// reference time `block_start + lead + i − shift(dm, c)`). Real data come back with a
    /// zero imaginary part.
    ///
    /// # Panics
    /// If `out` does not have `step` samples and the plan's channels and polarisations.
    pub fn voltages(&self, ws: &mut Workspace, dm: usize, out: &mut Voltages) {
        assert_eq!(out.nsamp(), self.step, "output length");
        let complex = self.band.complex;
        for chan in 0..self.band.nchan() {
            for pol in 0..self.band.npol {
                let valid = self.invert(ws, dm, chan, pol);
                let dst = out.series_mut(chan, pol);
                if complex {
                    dst.copy_from_slice(valid);
                } else {
                    for (d, z) in dst.iter_mut().zip(valid) {
                        *d = Complex32::new(z.re, 0.0);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn band() -> Band {
        Band::from_total(430.0, 2.0, 2, 1e6, true, 2)
    }

    #[test]
    fn plan_geometry() {
        let plan = DedispersionPlan::new(
            &band(),
            &[0.0, 10.0, 20.0],
            &PlanConfig::default().downsample(8),
        )
        .unwrap();
        assert_eq!(plan.step() % 8, 0);
        assert_eq!(plan.lead() % 8, 0);
        assert!(plan.fft_len() >= 4 * plan.overlap() / 2);
        assert!(plan.fft_len().is_power_of_two());
        // One output sample needs the edges plus one downsampled sample; past that, blocks
        // cover the data, the last one padded.
        let min = plan.min_samples();
        assert_eq!(min, (plan.lead() + plan.tail() + 8) as u64);
        assert_eq!(plan.num_blocks(min - 1), 0);
        assert_eq!((plan.num_blocks(min), plan.output_len(min)), (1, 1));
        assert_eq!(plan.num_blocks(plan.fft_len() as u64), 1);
        assert_eq!(
            plan.output_len(plan.fft_len() as u64),
            plan.samples_per_block()
        );
        assert_eq!(plan.num_blocks(plan.fft_len() as u64 + 8), 2);
        assert_eq!(plan.num_blocks((plan.fft_len() + plan.step()) as u64), 2);
        // Every input sample between the edges is covered, for any length.
        for n in [min, min + 7, min + 8, 3 * plan.fft_len() as u64 + 5] {
            let end = plan.valid_end(n);
            assert!(end <= n - plan.tail() as u64 && end + 8 > n - plan.tail() as u64);
            let covered =
                plan.block_start(plan.num_blocks(n) - 1) + (plan.lead() + plan.step()) as u64;
            assert!(
                covered >= end,
                "n {n}: blocks end at {covered}, data at {end}"
            );
            assert_eq!(
                plan.output_len(n) as u64 * 8,
                end - plan.lead() as u64,
                "n {n}"
            );
        }
        // At DM 0 there is nothing to shift.
        assert_eq!(plan.shift(0, 0), 0);
        assert!(plan.shift(2, 0) > 0 && plan.shift(2, 1) < 0);
    }

    #[test]
    fn plans_beyond_the_machines_memory_are_refused() {
        // 2 DMs × 4 channels × 1024 × 8 bytes = 64 KiB.
        assert!(check_memory(2, 4, 1024, Some(1 << 16)).is_ok());
        assert!(check_memory(2, 4, 1024, None).is_ok());
        let e = check_memory(2, 4, 1024, Some((1 << 16) - 1)).unwrap_err();
        assert!(matches!(
            e,
            PlanError::TooLarge {
                ndm: 2,
                nchan: 4,
                fft_len: 1024,
                ..
            }
        ));
        assert!(e.to_string().contains("fewer trial DMs"), "{e}");
        // No product overflows.
        assert!(check_memory(usize::MAX, usize::MAX, usize::MAX, Some(u64::MAX)).is_err());
        // The held series: 3876 DMs × 32 sub-channels × 125000 samples, 62 GB.
        assert!(series_fit(3876, 32, 125_000, None).is_ok());
        assert!(series_fit(2, 4, 1024, Some(32 << 10)).is_ok());
        let e = series_fit(3876, 32, 125_000, Some(24 << 30)).unwrap_err();
        assert!(
            e.to_string().contains("62.0 GB of detected series")
                && e.to_string()
                    .contains("3876 trial DMs × 32 channels × 125000 samples"),
            "{e}"
        );
        // A band of ten million channels, as a header may claim: an error before any table.
        if let Some(have) = memory_bytes() {
            let b = Band::from_total(1e7, 1e7, 10_000_000, 1e6, true, 1);
            let need = 64u64 * 10_000_000 * 1024 * 8;
            let e = DedispersionPlan::new(&b, &[0.0; 64], &PlanConfig::default());
            if need > have {
                assert!(matches!(e, Err(PlanError::TooLarge { .. })), "{e:?}");
            }
        }
    }

    #[test]
    fn plan_errors() {
        let b = band();
        assert_eq!(
            DedispersionPlan::new(&b, &[], &PlanConfig::default()).unwrap_err(),
            PlanError::NoDms
        );
        assert!(matches!(
            DedispersionPlan::new(&b, &[f64::NAN], &PlanConfig::default()),
            Err(PlanError::BadDm(_))
        ));
        assert!(matches!(
            DedispersionPlan::new(&b, &[100.0], &PlanConfig::default().fft_len(256)),
            Err(PlanError::FftTooShort { fft_len: 256, .. })
        ));
        let e =
            DedispersionPlan::new(&b, &[1.0], &PlanConfig::default().downsample(0)).unwrap_err();
        assert!(e.to_string().contains("downsample"));
        let e = DedispersionPlan::new(&b, &[1.0], &PlanConfig::default().reference_mhz(-1.0))
            .unwrap_err();
        assert!(e.to_string().contains("reference"));
    }

    #[test]
    fn data_too_short_for_the_dm_are_refused_before_any_table() {
        let b = band();
        let ok = DedispersionPlan::new(&b, &[0.0, 40.0], &PlanConfig::default()).unwrap();
        let need = ok.min_samples();
        let cfg = PlanConfig::default().data_len(need - 1);
        let e = DedispersionPlan::new(&b, &[0.0, 40.0], &cfg).unwrap_err();
        assert_eq!(
            e,
            PlanError::DataTooShort {
                nsamples: need - 1,
                needed: need,
                max_dm: 40.0
            }
        );
        assert!(e.to_string().contains("up to DM 40"), "{e}");
        assert!(DedispersionPlan::new(&b, &[0.0, 40.0], &cfg.data_len(need)).is_ok());
    }

    #[test]
    fn plan_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<DedispersionPlan>();
        check::<Workspace>();
    }

    #[test]
    fn dm_zero_is_identity() {
        let b = Band::from_total(430.0, 1.0, 1, 1e6, true, 1);
        let plan = DedispersionPlan::new(&b, &[0.0], &PlanConfig::default().fft_len(64)).unwrap();
        assert_eq!((plan.lead(), plan.step()), (0, 64));
        let data: Vec<Complex32> = (0..64)
            .map(|i| Complex32::new(i as f32, -(i as f32) / 2.0))
            .collect();
        let input = Voltages::from_vec(1, 1, 64, data.clone());
        let mut ws = plan.workspace();
        plan.forward(&mut ws, &input);
        let mut out = Voltages::zeros(1, 1, 64);
        plan.voltages(&mut ws, 0, &mut out);
        for (a, b) in out.series(0, 0).iter().zip(&data) {
            assert!((a - b).norm() < 1e-4, "{a} {b}");
        }
    }
}
