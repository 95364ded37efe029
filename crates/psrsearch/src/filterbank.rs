//! A coherent filterbank (dspsr's `-F`): each channel split into `nsub` critically sampled
//! complex sub-channels, so that the many-DM stage dedisperses narrow channels with short
//! FFTs.
//!
//! Why: coherent dedispersion needs an FFT overlap of the dispersive smear *within* a
//! channel, which grows with the square of the channel's width in samples. A 16 MHz channel
//! at 820 MHz and DM 62 smears over 2.4 × 10⁵ samples, so every trial DM costs a 2²⁰-point
//! FFT pair; split into 16 sub-channels of 1 MHz, the smear is 930 samples and FFTs of 4096
//! do. The split costs one forward FFT and `nsub` short inverse FFTs per block, once,
//! whatever the number of DMs.
//!
//! How (overlap-save, as the dedispersion itself):
//! - a block is `fft_len = D·m` input samples, `D` the decimation (`nsub` for complex
//!   channels, `2·nsub` for real ones, whose positive half-band of `R/2` is split) and `m` the
//!   sub-channel samples it gives;
//! - its spectrum (RustFFT forward, unnormalised) is cut into `nsub` contiguous pieces of `m`
//!   bins; each piece, centred on its sub-channel's middle, is inverse-transformed (length
//!   `m`), which mixes it down by that frequency and decimates by `D`;
//! - the cut is a brick wall, whose impulse response is a sinc decaying only as 1/lag: the
//!   first and last `margin` outputs of each block, where the circular wrap-around matters
//!   most, are discarded, and consecutive blocks' `m − 2·margin` valid outputs tile the
//!   stream. The residual error is what the sinc has beyond the margin and what the block's
//!   finite length leaks across each cut; it falls with the block length more than with the
//!   margin (`docs/decisions/0062-coherent-filterbank.md` has its measured size);
//! - the mix-down phase is referred to the stream's first sample, not the block's, so the
//!   sub-channel series are continuous across blocks.
//!
//! Conventions:
//! - sub-channel sample `j` stands for input samples `[j·D, j·D + D)`: it is the filtered
//!   signal at their middle, `j·D + (D − 1)/2` (a linear phase across the spectrum, exact for
//!   a band-limited signal), so `D` detected input samples and one detected sub-channel
//!   sample cover the same time and detected series line up with the unsplit ones;
//! - sub-channel `k` of input channel `c` is channel `c·nsub + k` of the derived [`Band`],
//!   `k` counting up in *baseband* frequency. Its centre is the input channel's sky frequency
//!   at the piece's middle ([`Band::sky_mhz`]) and its sideband the input's, so a lower
//!   sideband (channels numbered from the top down, each spectrally inverted) gives
//!   sub-channels descending in sky frequency, as its channels are;
//! - amplitudes are kept: a complex tone `A·e^{2πift}` becomes `A` times the mixed-down tone;
//!   a real tone `A·cos(2πft)` becomes its analytic signal `A·e^{i…}` (positive frequencies
//!   counted twice);
//! - coverage: the stream is read as zeros before its first and after its last sample; the
//!   derived stream has `⌈N/D⌉` samples for `N` input ones, so every input sample reaches it.
//!   Its first and last few samples hold the sinc's response to the data's edges (the same
//!   rule as the rest of `psrsearch`: data are zero outside the file);
//! - the Nyquist bin of real data belongs to no sub-channel.

use std::collections::VecDeque;
use std::sync::Arc;

use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};

use crate::band::Band;
use crate::dedisperse::PlanConfig;
use crate::format::{BasebandReader, ReadError};
use crate::voltages::Voltages;

/// Sub-channel samples per filterbank block when not chosen: long enough that the margin
/// costs a quarter of each block at most and its error is small, short enough to stay in
/// cache.
const DEFAULT_SUB_LEN: usize = 1024;

/// Longest dedispersion FFT the automatic choice of sub-channels aims for: at 32 DMs the
/// shortest FFTs measured fastest (decision record 0062).
const AUTO_MAX_FFT: f64 = 2048.0;

/// Why a filterbank cannot be made or used.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum FilterbankError {
    /// Zero sub-channels.
    #[error("the number of sub-channels must be at least 1, not 0")]
    NoSubchannels,
    /// The forward FFT length does not split into `nsub` pieces of an even number of bins.
    #[error(
        "a filterbank FFT of {fft_len} points cannot be cut into {nsub} sub-channels: it must \
         be a multiple of {multiple} (the decimation {decimation} times an even number of \
         sub-channel samples), e.g. {suggested}"
    )]
    FftLen {
        /// FFT length asked for.
        fft_len: usize,
        /// Sub-channels asked for.
        nsub: usize,
        /// Input samples per sub-channel sample.
        decimation: usize,
        /// What the length must be a multiple of.
        multiple: usize,
        /// A length that works.
        suggested: usize,
    },
    /// The margin leaves no valid output in a block.
    #[error(
        "a filterbank margin of {margin} sub-channel samples at each end leaves nothing of \
         blocks of {sub_len}: use a margin below {}",
        sub_len / 2
    )]
    Margin {
        /// Margin asked for.
        margin: usize,
        /// Sub-channel samples per block.
        sub_len: usize,
    },
    /// A downsampling factor that is not a whole number of sub-channel samples.
    #[error(
        "downsampling by {downsample} input samples is not a whole number of sub-channel \
         samples: with {nsub} sub-channels each sub-channel sample is {decimation} input \
         samples, so the downsampling factor must be a multiple of {decimation}"
    )]
    Downsample {
        /// Downsampling factor asked for (input samples).
        downsample: usize,
        /// Sub-channels.
        nsub: usize,
        /// Input samples per sub-channel sample.
        decimation: usize,
    },
    /// Something this driver cannot do with sub-channels.
    #[error("sub-channels (--subchannels) cannot be used with {0}")]
    Unsupported(&'static str),
}

/// The geometry of a [`Filterbank`]; `Default` plus chainable setters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilterbankConfig {
    /// Forward FFT length (input samples per block); `None`: the decimation times 1024.
    pub fft_len: Option<usize>,
    /// Sub-channel samples discarded at each end of a block; `None`: an eighth of a block.
    pub margin: Option<usize>,
}

impl FilterbankConfig {
    /// Set the forward FFT length.
    pub fn fft_len(mut self, n: usize) -> Self {
        self.fft_len = Some(n);
        self
    }
    /// Set the margin.
    pub fn margin(mut self, n: usize) -> Self {
        self.margin = Some(n);
        self
    }
}

/// Splits every channel of a band into sub-channels. Immutable and shareable between
/// threads; each worker uses its own [`FilterbankWorkspace`].
#[derive(Clone)]
pub struct Filterbank {
    input: Band,
    band: Band,
    nsub: usize,
    decimation: usize,
    fft_len: usize,
    sub_len: usize,
    margin: usize,
    /// Per sub-channel: the forward bin of its middle, and the parity that its mix-down
    /// phase at a block starting on sub-channel sample `j0` has (`j0·parity` odd: −1).
    centre_bin: Vec<usize>,
    parity: Vec<i64>,
    /// Per forward bin: the delay of `(D − 1)/2` input samples and the normalisation.
    delay: Vec<Complex32>,
    forward: Arc<dyn Fft<f32>>,
    inverse: Arc<dyn Fft<f32>>,
}

impl std::fmt::Debug for Filterbank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filterbank")
            .field("nsub", &self.nsub)
            .field("decimation", &self.decimation)
            .field("fft_len", &self.fft_len)
            .field("margin", &self.margin)
            .finish_non_exhaustive()
    }
}

/// Per-worker buffers of a [`Filterbank`].
#[derive(Clone, Debug)]
pub struct FilterbankWorkspace {
    input: Voltages,
    spectrum: Vec<Complex32>,
    sub: Vec<Complex32>,
    scratch: Vec<Complex32>,
    /// The valid outputs of the blocks last computed, by block index: consecutive windows
    /// of a dedispersion overlap, and a window rarely starts on a block's start, so without
    /// them each block would be computed two or three times.
    blocks: VecDeque<(u64, Voltages)>,
    spare: Vec<Voltages>,
}

impl Filterbank {
    /// A filterbank splitting each channel of `band` into `nsub` sub-channels.
    ///
    /// # Errors
    /// `nsub` of 0, an FFT length that is not a multiple of twice the decimation, or a
    /// margin of half a block or more.
    pub fn new(
        band: &Band,
        nsub: usize,
        config: &FilterbankConfig,
    ) -> Result<Self, FilterbankError> {
        if nsub == 0 {
            return Err(FilterbankError::NoSubchannels);
        }
        let decimation = if band.complex { nsub } else { 2 * nsub };
        let fft_len = config.fft_len.unwrap_or(decimation * DEFAULT_SUB_LEN);
        // Each piece must be a whole, even number of bins so that its middle is a bin.
        let multiple = 2 * decimation;
        if fft_len == 0 || fft_len % multiple != 0 {
            return Err(FilterbankError::FftLen {
                fft_len,
                nsub,
                decimation,
                multiple,
                suggested: decimation * DEFAULT_SUB_LEN,
            });
        }
        let sub_len = fft_len / decimation;
        let margin = config.margin.unwrap_or(sub_len / 8);
        if 2 * margin >= sub_len {
            return Err(FilterbankError::Margin { margin, sub_len });
        }
        let rate = band.sample_rate_hz;
        let width = rate / decimation as f64;
        let first_hz = if band.complex { -rate / 2.0 } else { 0.0 };
        let mut centres = Vec::with_capacity(band.nchan() * nsub);
        for c in 0..band.nchan() {
            for k in 0..nsub {
                centres.push(band.sky_mhz(c, first_hz + (k as f64 + 0.5) * width));
            }
        }
        let derived = Band {
            sample_rate_hz: rate / decimation as f64,
            complex: true,
            npol: band.npol,
            centre_mhz: centres,
            sideband: band.sideband,
        };
        // Middle of piece k in bins: first_hz·M/R + (k + ½)·m, taken modulo M.
        let first_bin = if band.complex { fft_len / 2 } else { 0 };
        let centre_bin = (0..nsub)
            .map(|k| (first_bin + k * sub_len + sub_len / 2) % fft_len)
            .collect();
        // The middle of piece k is (2k + 1 − c)/2 cycles per sub-channel sample, c = nsub for
        // complex and 0 for real data: a half-integer flips the sign of odd blocks' starts.
        let c = if band.complex { nsub as i64 } else { 0 };
        let parity = (0..nsub as i64)
            .map(|k| (2 * k + 1 - c).rem_euclid(2))
            .collect();
        // Normalisation: 1/M for RustFFT's unnormalised pair; twice that for real data, whose
        // positive frequencies carry half a tone's amplitude.
        let scale = if band.complex { 1.0 } else { 2.0 } / fft_len as f64;
        let delay_samples = (decimation as f64 - 1.0) / 2.0;
        let delay = (0..fft_len)
            .map(|bin| {
                let f = if band.complex && bin >= fft_len / 2 {
                    bin as f64 - fft_len as f64
                } else {
                    bin as f64
                };
                let turns = (f * delay_samples / fft_len as f64).rem_euclid(1.0);
                let (sin, cos) = (std::f64::consts::TAU * turns).sin_cos();
                Complex32::new((cos * scale) as f32, (sin * scale) as f32)
            })
            .collect();
        let mut planner = FftPlanner::<f32>::new();
        Ok(Filterbank {
            input: band.clone(),
            band: derived,
            nsub,
            decimation,
            fft_len,
            sub_len,
            margin,
            centre_bin,
            parity,
            delay,
            forward: planner.plan_fft_forward(fft_len),
            inverse: planner.plan_fft_inverse(sub_len),
        })
    }

    /// The band of the sub-channels: `nchan·nsub` complex channels at `1/D` of the rate.
    pub fn band(&self) -> &Band {
        &self.band
    }
    /// The band split.
    pub fn input_band(&self) -> &Band {
        &self.input
    }
    /// Sub-channels per input channel.
    pub fn nsub(&self) -> usize {
        self.nsub
    }
    /// Input samples per sub-channel sample: `nsub` for complex, `2·nsub` for real data.
    pub fn decimation(&self) -> usize {
        self.decimation
    }
    /// Forward FFT length (input samples per block).
    pub fn fft_len(&self) -> usize {
        self.fft_len
    }
    /// Sub-channel samples discarded at each end of a block.
    pub fn margin(&self) -> usize {
        self.margin
    }
    /// Valid sub-channel samples per block.
    pub fn step(&self) -> usize {
        self.sub_len - 2 * self.margin
    }
    /// Sub-channel samples that `nsamples` input samples give: `⌈nsamples / D⌉`.
    pub fn output_len(&self, nsamples: u64) -> u64 {
        nsamples.div_ceil(self.decimation as u64)
    }

    /// The dedispersion settings for the sub-channels of data of `nsamples` input samples
    /// dedispersed with `config` (input units): downsampling in sub-channel samples, the
    /// data length in them, the sideband already applied to the input band, no further
    /// split. FFT length and extra overlap are taken as sub-channel samples.
    ///
    /// # Errors
    /// A downsampling factor that is not a multiple of the decimation.
    pub fn plan_config(&self, config: &PlanConfig) -> Result<PlanConfig, FilterbankError> {
        let d = self.decimation;
        if config.downsample % d != 0 || config.downsample == 0 {
            return Err(FilterbankError::Downsample {
                downsample: config.downsample,
                nsub: self.nsub,
                decimation: d,
            });
        }
        let mut out = config.clone();
        out.downsample = config.downsample / d;
        out.data_len = config.data_len.map(|n| self.output_len(n));
        out.sideband = None;
        out.subchannels = 1;
        Ok(out)
    }

    /// Fresh buffers for one worker.
    pub fn workspace(&self) -> FilterbankWorkspace {
        let scratch = self
            .forward
            .get_inplace_scratch_len()
            .max(self.inverse.get_inplace_scratch_len());
        let zero = Complex32::new(0.0, 0.0);
        FilterbankWorkspace {
            input: Voltages::zeros(self.input.nchan(), self.input.npol, self.fft_len),
            spectrum: vec![zero; self.fft_len],
            sub: vec![zero; self.sub_len],
            scratch: vec![zero; scratch],
            blocks: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// Sub-channel samples `[start, start + out.nsamp())` of a stream of `nsamples` input
    /// samples, which `read(first, block)` supplies: it fills `block` with input samples
    /// from `first` on (which may be negative), zeros outside `[0, nsamples)`. Samples at
    /// or after [`output_len`](Self::output_len) are zero, as input past the end is.
    ///
    /// # Errors
    /// Whatever `read` returns.
    ///
    /// # Panics
    /// If `out` does not have the derived band's channels and polarisations.
    pub fn read_into<E>(
        &self,
        ws: &mut FilterbankWorkspace,
        nsamples: u64,
        start: u64,
        out: &mut Voltages,
        read: &mut dyn FnMut(i64, &mut Voltages) -> Result<(), E>,
    ) -> Result<(), E> {
        assert_eq!(
            (out.nchan(), out.npol()),
            (self.band.nchan(), self.band.npol),
            "sub-channel block shape"
        );
        let len = out.nsamp() as u64;
        let valid_to = self.output_len(nsamples).min(start + len);
        out.as_mut_slice().fill(Complex32::new(0.0, 0.0));
        if start >= valid_to {
            return Ok(());
        }
        let step = self.step() as u64;
        let (first, last) = (start / step, (valid_to - 1) / step);
        // Windows move forward: blocks before this one are done with.
        while ws.blocks.front().is_some_and(|(b, _)| *b < first) {
            if let Some((_, v)) = ws.blocks.pop_front() {
                ws.spare.push(v);
            }
        }
        for block in first..=last {
            let have = ws.blocks.iter().position(|(b, _)| *b == block);
            let at_cache = match have {
                Some(i) => i,
                None => {
                    // Block `block` gives sub-channel samples [block·step, (block + 1)·step)
                    // from the input starting `margin` sub-channel samples before them.
                    let j0 = (block * step) as i64 - self.margin as i64;
                    read(j0 * self.decimation as i64, &mut ws.input)?;
                    let mut buf = ws.spare.pop().unwrap_or_else(|| {
                        Voltages::zeros(self.band.nchan(), self.band.npol, self.step())
                    });
                    self.split_block(ws, j0, &mut buf);
                    ws.blocks.push_back((block, buf));
                    ws.blocks.len() - 1
                }
            };
            let lo = (block * step).max(start);
            let hi = ((block + 1) * step).min(valid_to);
            let (from, to) = ((lo - block * step) as usize, (hi - block * step) as usize);
            let at = (lo - start) as usize;
            let cached = &ws.blocks[at_cache].1;
            for c in 0..self.band.nchan() {
                for p in 0..self.band.npol {
                    out.series_mut(c, p)[at..at + to - from]
                        .copy_from_slice(&cached.series(c, p)[from..to]);
                }
            }
        }
        // Out-of-order reads leave blocks behind: keep no more than a window's worth.
        let keep = (last - first) as usize + 2;
        while ws.blocks.len() > keep {
            if let Some((_, v)) = ws.blocks.pop_front() {
                ws.spare.push(v);
            }
        }
        Ok(())
    }

    /// The sub-channels of a whole stream held in memory: `⌈N/D⌉` samples per series.
    pub fn channelise(&self, data: &Voltages) -> Voltages {
        let n = data.nsamp() as u64;
        let mut out = Voltages::zeros(
            self.band.nchan(),
            self.band.npol,
            self.output_len(n) as usize,
        );
        let mut ws = self.workspace();
        let mut read = |first: i64, block: &mut Voltages| -> Result<(), std::convert::Infallible> {
            fill_signed(data, first, block);
            Ok(())
        };
        match self.read_into(&mut ws, n, 0, &mut out, &mut read) {
            Ok(()) => out,
            Err(never) => match never {},
        }
    }

    /// Transform the block in `ws.input` (starting at sub-channel sample `j0`) and write its
    /// `step` valid outputs to `out`.
    fn split_block(&self, ws: &mut FilterbankWorkspace, j0: i64, out: &mut Voltages) {
        let (m, big) = (self.sub_len, self.fft_len);
        let half = m / 2;
        for c in 0..self.input.nchan() {
            for p in 0..self.input.npol {
                ws.spectrum.copy_from_slice(ws.input.series(c, p));
                self.forward
                    .process_with_scratch(&mut ws.spectrum, &mut ws.scratch);
                for k in 0..self.nsub {
                    // Offsets 0..m/2 above the middle go first, then the m/2 below it: the
                    // inverse FFT's order, so bin `middle + d` becomes sub-channel bin d.
                    let mid = self.centre_bin[k];
                    for (d, z) in ws.sub.iter_mut().enumerate() {
                        let offset = if d < half { d } else { big + d - m };
                        let bin = (mid + offset) % big;
                        *z = ws.spectrum[bin] * self.delay[bin];
                    }
                    self.inverse
                        .process_with_scratch(&mut ws.sub, &mut ws.scratch);
                    let flip = (j0.rem_euclid(2) * self.parity[k]) % 2 == 1;
                    let scale = if flip { -1.0 } else { 1.0 };
                    let dst = out.series_mut(c * self.nsub + k, p);
                    let src = &ws.sub[self.margin..self.margin + dst.len()];
                    for (o, z) in dst.iter_mut().zip(src) {
                        *o = z * scale;
                    }
                }
            }
        }
    }
}

/// Fill `dst` with `src`'s samples from `first` (which may be negative) on, zeros outside
/// `src`.
pub fn fill_signed(src: &Voltages, first: i64, dst: &mut Voltages) {
    if first >= 0 {
        dst.fill_window(src, first as usize);
        return;
    }
    let skip = first.unsigned_abs() as usize;
    let n = dst.nsamp();
    for c in 0..dst.nchan() {
        for p in 0..dst.npol() {
            let d = dst.series_mut(c, p);
            let s = src.series(c, p);
            d.fill(Complex32::new(0.0, 0.0));
            if skip < n {
                let have = (n - skip).min(s.len());
                d[skip..skip + have].copy_from_slice(&s[..have]);
            }
        }
    }
}

/// The filterbank [`PlanConfig::subchannels`] asks for on `band` (with the configuration's
/// sideband override applied first: it decides the sub-channels' order), or `None` for 1.
///
/// # Errors
/// As [`Filterbank::new`].
pub fn for_plan(band: &Band, config: &PlanConfig) -> Result<Option<Filterbank>, FilterbankError> {
    if config.subchannels == 1 {
        return Ok(None);
    }
    let band = match config.sideband {
        Some(s) => band.clone().with_sideband(s),
        None => band.clone(),
    };
    Filterbank::new(&band, config.subchannels, &FilterbankConfig::default()).map(Some)
}

/// The number of sub-channels for dedispersing `band` up to `max_dm` with `config`: the
/// smallest power of two whose sub-channels' dispersive smear fits a default FFT of 2048
/// points or fewer (four times the smear), as long as the downsampling factor stays a
/// whole number of sub-channel samples; 1 where the channels need no split.
pub fn choose_subchannels(band: &Band, max_dm: f64, config: &PlanConfig) -> usize {
    let per = if band.complex { 1 } else { 2 };
    let mut nsub = 1;
    while 4.0 * smear_samples(band, max_dm, nsub, config.dispersion_constant) > AUTO_MAX_FFT
        && config.downsample % (2 * nsub * per) == 0
    {
        nsub *= 2;
    }
    nsub
}

/// The dispersive smear at `dm` across the lowest of `nsub` sub-channels of `band` (the
/// widest smear), in sub-channel samples.
fn smear_samples(band: &Band, dm: f64, nsub: usize, constant: f64) -> f64 {
    let width = band.channel_bandwidth_mhz() / nsub as f64;
    let lo = band.lowest_mhz();
    let seconds = constant * dm.abs() * (lo.powi(-2) - (lo + width).powi(-2));
    let decimation = if band.complex { nsub } else { 2 * nsub };
    seconds * band.sample_rate_hz / decimation as f64
}

/// A [`BasebandReader`] seen through a [`Filterbank`]: reads give sub-channel samples.
pub struct SubchannelReader<'r> {
    reader: &'r mut BasebandReader,
    filterbank: Filterbank,
    ws: FilterbankWorkspace,
}

impl<'r> SubchannelReader<'r> {
    /// Split `reader`'s channels (the band `filterbank` was made for).
    pub fn new(reader: &'r mut BasebandReader, filterbank: Filterbank) -> Self {
        let ws = filterbank.workspace();
        SubchannelReader {
            reader,
            filterbank,
            ws,
        }
    }

    /// The filterbank.
    pub fn filterbank(&self) -> &Filterbank {
        &self.filterbank
    }

    /// Sub-channel samples per series.
    pub fn nsamples(&self) -> u64 {
        self.filterbank.output_len(self.reader.nsamples())
    }

    /// Sub-channel samples `[start, start + out.nsamp())`, zeros past the end.
    ///
    /// # Errors
    /// Read errors of the underlying file.
    pub fn read_padded_into(&mut self, start: u64, out: &mut Voltages) -> Result<(), ReadError> {
        let n = self.reader.nsamples();
        let reader = &mut *self.reader;
        let mut read = |first: i64, block: &mut Voltages| -> Result<(), ReadError> {
            read_signed(reader, n, first, block)
        };
        self.filterbank
            .read_into(&mut self.ws, n, start, out, &mut read)
    }
}

/// Input samples in time order, as a stream delivers them.
pub trait SampleStream {
    /// Read `n` time samples of every channel and polarisation into `out` from sample `at`
    /// on. Returns how many were read: fewer than `n` only where the stream ended.
    ///
    /// # Errors
    /// The stream's read errors.
    fn read_samples(&mut self, out: &mut Voltages, at: usize, n: usize)
        -> Result<usize, ReadError>;
}

/// A [`SampleStream`] seen through a [`Filterbank`]: reads give sub-channel samples, bit for
/// bit those a [`SubchannelReader`] gives for a file of the same samples, and the stream ends
/// after `⌈N/D⌉` of them for `N` input samples.
///
/// The input is read only as far as the filterbank blocks of the samples asked for need it
/// (up to a block's step and margin beyond them, `(step + margin)·D` input samples), and kept
/// only from the first of those blocks on.
pub struct SubchannelStream<'s, S: SampleStream> {
    input: &'s mut S,
    filterbank: Filterbank,
    ws: FilterbankWorkspace,
    /// Input samples `[base, base + held)`; `base + held` were read.
    buffer: Voltages,
    base: u64,
    held: usize,
    /// Input samples in the stream, once it has ended.
    total: Option<u64>,
    /// The next sub-channel sample to deliver.
    next: u64,
}

impl<'s, S: SampleStream> SubchannelStream<'s, S> {
    /// Split `input`'s channels (the band `filterbank` was made for).
    pub fn new(input: &'s mut S, filterbank: Filterbank) -> Self {
        let ws = filterbank.workspace();
        let band = filterbank.input_band();
        let buffer = Voltages::zeros(band.nchan(), band.npol, filterbank.fft_len());
        SubchannelStream {
            input,
            filterbank,
            ws,
            buffer,
            base: 0,
            held: 0,
            total: None,
            next: 0,
        }
    }

    /// The filterbank.
    pub fn filterbank(&self) -> &Filterbank {
        &self.filterbank
    }

    /// Read the input up to sample `to` (or its end), keeping it from `from` on.
    fn buffer_input(&mut self, from: u64, to: u64) -> Result<(), ReadError> {
        let drop = from.saturating_sub(self.base).min(self.held as u64) as usize;
        if drop > 0 {
            let (c, p) = (self.buffer.nchan(), self.buffer.npol());
            for ch in 0..c {
                for pol in 0..p {
                    self.buffer
                        .series_mut(ch, pol)
                        .copy_within(drop..self.held, 0);
                }
            }
            self.held -= drop;
            self.base += drop as u64;
        }
        let read = self.base + self.held as u64;
        if self.total.is_some() || read >= to {
            return Ok(());
        }
        let want = (to - read) as usize;
        if self.held + want > self.buffer.nsamp() {
            let mut bigger = Voltages::zeros(
                self.buffer.nchan(),
                self.buffer.npol(),
                (self.held + want).next_power_of_two(),
            );
            for ch in 0..bigger.nchan() {
                for pol in 0..bigger.npol() {
                    bigger.series_mut(ch, pol)[..self.held]
                        .copy_from_slice(&self.buffer.series(ch, pol)[..self.held]);
                }
            }
            self.buffer = bigger;
        }
        let got = self.input.read_samples(&mut self.buffer, self.held, want)?;
        self.held += got;
        if got < want {
            self.total = Some(self.base + self.held as u64);
        }
        Ok(())
    }
}

impl<S: SampleStream> SampleStream for SubchannelStream<'_, S> {
    fn read_samples(
        &mut self,
        out: &mut Voltages,
        at: usize,
        n: usize,
    ) -> Result<usize, ReadError> {
        let fb = &self.filterbank;
        assert_eq!(
            (out.nchan(), out.npol()),
            (fb.band().nchan(), fb.band().npol),
            "sub-channel block shape"
        );
        assert!(
            at + n <= out.nsamp(),
            "sub-channel samples beyond the block"
        );
        if n == 0 {
            return Ok(0);
        }
        // Filterbank block k gives sub-channel samples [k·step, (k + 1)·step) from input
        // samples [(k·step − margin)·D, … + fft_len) (see `Filterbank::read_into`).
        let (step, margin, d) = (fb.step() as i64, fb.margin() as i64, fb.decimation() as i64);
        let input_of = |block: i64| (block * step - margin) * d;
        let first = (self.next as i64) / step;
        let last = (self.next as i64 + n as i64 - 1) / step;
        let to = input_of(last) + fb.fft_len() as i64;
        self.buffer_input(input_of(first).max(0) as u64, to.max(0) as u64)?;
        let fb = &self.filterbank;
        let n = match self.total {
            Some(t) => (fb.output_len(t).saturating_sub(self.next) as usize).min(n),
            None => n,
        };
        if n == 0 {
            return Ok(0);
        }
        let mut part = Voltages::zeros(fb.band().nchan(), fb.band().npol, n);
        let (buffer, base, held) = (&self.buffer, self.base as i64, self.held as i64);
        // Zeros outside the stream, as a file's reader gives them: before its start, and
        // after its end once that is known.
        let end = self.total.map_or(i64::MAX, |t| t as i64);
        let mut read = |first: i64, block: &mut Voltages| -> Result<(), ReadError> {
            let len = block.nsamp() as i64;
            let (lo, hi) = (first.max(0), (first + len).min(end));
            assert!(
                lo >= hi || (lo >= base && hi <= base + held),
                "input samples {lo}..{hi} are not buffered ({base}..{})",
                base + held
            );
            for ch in 0..block.nchan() {
                for pol in 0..block.npol() {
                    let dst = block.series_mut(ch, pol);
                    dst.fill(Complex32::new(0.0, 0.0));
                    if lo < hi {
                        dst[(lo - first) as usize..(hi - first) as usize].copy_from_slice(
                            &buffer.series(ch, pol)[(lo - base) as usize..(hi - base) as usize],
                        );
                    }
                }
            }
            Ok(())
        };
        let nsamples = self.total.unwrap_or(u64::MAX);
        fb.read_into(&mut self.ws, nsamples, self.next, &mut part, &mut read)?;
        for ch in 0..out.nchan() {
            for pol in 0..out.npol() {
                out.series_mut(ch, pol)[at..at + n].copy_from_slice(part.series(ch, pol));
            }
        }
        self.next += n as u64;
        Ok(n)
    }
}

/// Read input samples from `first` (which may be negative) on, zeros outside the data.
pub(crate) fn read_signed(
    reader: &mut BasebandReader,
    nsamples: u64,
    first: i64,
    block: &mut Voltages,
) -> Result<(), ReadError> {
    if first >= 0 {
        let first = first as u64;
        if first >= nsamples {
            block.as_mut_slice().fill(Complex32::new(0.0, 0.0));
            return Ok(());
        }
        return reader.read_padded_into(first, block);
    }
    let skip = first.unsigned_abs();
    let n = block.nsamp() as u64;
    if skip >= n {
        block.as_mut_slice().fill(Complex32::new(0.0, 0.0));
        return Ok(());
    }
    let mut part = Voltages::zeros(block.nchan(), block.npol(), (n - skip) as usize);
    reader.read_padded_into(0, &mut part)?;
    fill_signed(&part, first, block);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::band::Sideband;

    #[test]
    fn fill_signed_pads_before_the_start() {
        let src = Voltages::from_vec(
            1,
            1,
            4,
            (1..=4).map(|i| Complex32::new(i as f32, 0.0)).collect(),
        );
        let mut dst = Voltages::zeros(1, 1, 3);
        fill_signed(&src, -2, &mut dst);
        let re: Vec<f32> = dst.series(0, 0).iter().map(|z| z.re).collect();
        assert_eq!(re, vec![0.0, 0.0, 1.0]);
        fill_signed(&src, -5, &mut dst);
        assert!(dst.as_slice().iter().all(|z| z.norm() == 0.0));
        fill_signed(&src, 3, &mut dst);
        let re: Vec<f32> = dst.series(0, 0).iter().map(|z| z.re).collect();
        assert_eq!(re, vec![4.0, 0.0, 0.0]);
    }

    #[test]
    fn windows_in_any_order_equal_the_whole() {
        let band = Band::from_total(820.0, 4.0, 1, 4e6, true, 2);
        let fb = Filterbank::new(&band, 4, &FilterbankConfig::default().fft_len(4 * 64)).unwrap();
        let n = 4000;
        let data = Voltages::from_vec(
            1,
            2,
            n,
            (0..2 * n)
                .map(|i| Complex32::new((i as f32 * 0.37).sin(), (i as f32 * 0.11).cos()))
                .collect(),
        );
        let whole = fb.channelise(&data);
        let mut ws = fb.workspace();
        let mut read = |first: i64, block: &mut Voltages| -> Result<(), ()> {
            fill_signed(&data, first, block);
            Ok(())
        };
        // Forward with overlaps (as a dedispersion reads), backward, and past the end.
        for (start, len) in [
            (0, 300),
            (200, 500),
            (650, 60),
            (100, 37),
            (990, 40),
            (0, 1000),
        ] {
            let mut out = Voltages::zeros(4, 2, len);
            fb.read_into(&mut ws, n as u64, start, &mut out, &mut read)
                .unwrap();
            for c in 0..4 {
                for p in 0..2 {
                    let end = (start as usize + len).min(1000);
                    let got = &out.series(c, p)[..end - start as usize];
                    assert_eq!(
                        got,
                        &whole.series(c, p)[start as usize..end],
                        "{start} {len}"
                    );
                    assert!(out.series(c, p)[end - start as usize..]
                        .iter()
                        .all(|z| z.norm() == 0.0));
                }
            }
        }
    }

    /// Samples of a block in memory, delivered as a stream.
    struct Memory<'a> {
        data: &'a Voltages,
        at: usize,
    }

    impl SampleStream for Memory<'_> {
        fn read_samples(
            &mut self,
            out: &mut Voltages,
            at: usize,
            n: usize,
        ) -> Result<usize, ReadError> {
            let k = n.min(self.data.nsamp() - self.at);
            for c in 0..out.nchan() {
                for p in 0..out.npol() {
                    out.series_mut(c, p)[at..at + k]
                        .copy_from_slice(&self.data.series(c, p)[self.at..self.at + k]);
                }
            }
            self.at += k;
            Ok(k)
        }
    }

    #[test]
    fn a_stream_split_in_any_chunks_equals_the_whole() {
        let band = Band::from_total(820.0, 4.0, 1, 4e6, true, 2);
        let fb = Filterbank::new(&band, 4, &FilterbankConfig::default().fft_len(4 * 64)).unwrap();
        // A whole number of sub-channel samples and not; shorter than one filterbank block.
        for n in [4000, 4001, 3999, 100] {
            let data = Voltages::from_vec(
                1,
                2,
                n,
                (0..2 * n)
                    .map(|i| Complex32::new((i as f32 * 0.37).sin(), (i as f32 * 0.11).cos()))
                    .collect(),
            );
            let whole = fb.channelise(&data);
            let mut input = Memory { data: &data, at: 0 };
            let mut stream = SubchannelStream::new(&mut input, fb.clone());
            let mut got = Voltages::zeros(4, 2, whole.nsamp() + 100);
            let mut at = 0;
            for chunk in [300, 37, 1, 0, 500].into_iter().cycle() {
                let k = chunk.min(got.nsamp() - at);
                let read = stream.read_samples(&mut got, at, k).unwrap();
                at += read;
                if read < k {
                    break;
                }
            }
            assert_eq!(
                at,
                whole.nsamp(),
                "{n}: the stream ends after ⌈n/D⌉ samples"
            );
            for c in 0..4 {
                for p in 0..2 {
                    assert_eq!(&got.series(c, p)[..at], whole.series(c, p), "{n}");
                }
            }
            // The input is kept from the current filterbank block on, not from its start.
            assert!(stream.buffer.nsamp() <= 4096, "{}", stream.buffer.nsamp());
        }
    }

    #[test]
    fn the_automatic_choice_makes_the_smear_fit_short_ffts() {
        let wide = Band::from_total(820.0, 16.0, 1, 16e6, true, 2);
        let cfg = PlanConfig::default().downsample(32);
        // 16 MHz at 820 MHz and DM 62: 2.4e5 samples of smear; 32 sub-channels of 0.5 MHz
        // smear over 240, which a 1024-point FFT holds.
        assert_eq!(choose_subchannels(&wide, 62.0, &cfg), 32);
        assert!(4.0 * smear_samples(&wide, 62.0, 32, cfg.dispersion_constant) <= 2048.0);
        assert!(4.0 * smear_samples(&wide, 62.0, 16, cfg.dispersion_constant) > 2048.0);
        // Limited by the downsampling factor.
        assert_eq!(
            choose_subchannels(&wide, 62.0, &cfg.clone().downsample(8)),
            8
        );
        assert_eq!(
            choose_subchannels(&wide, 62.0, &cfg.clone().downsample(1)),
            1
        );
        // Nothing to split at DM 0 or in narrow channels at low DM.
        assert_eq!(choose_subchannels(&wide, 0.0, &cfg), 1);
        let narrow = Band::from_total(820.0, 8.0, 4, 2e6, true, 2);
        assert_eq!(choose_subchannels(&narrow, 2.0, &cfg), 1);
        assert_eq!(choose_subchannels(&narrow, 62.0, &cfg), 4);
        // Real data: each sub-channel sample is two input samples per sub-channel.
        let real = Band::from_total(1400.0, 400.0, 1, 800e6, false, 1);
        let n = choose_subchannels(&real, 100.0, &cfg.clone().downsample(64));
        assert!(n > 1 && 64 % (2 * n) == 0, "{n}");
    }

    #[test]
    fn derived_band_geometry() {
        let b = Band::from_total(820.0, 16.0, 1, 16e6, true, 2);
        let fb = Filterbank::new(&b, 4, &FilterbankConfig::default()).unwrap();
        assert_eq!(fb.band().centre_mhz, vec![814.0, 818.0, 822.0, 826.0]);
        assert_eq!(fb.band().sample_rate_hz, 4e6);
        assert_eq!(fb.band().npol, 2);
        assert_eq!(fb.band().band_centre_mhz(), b.band_centre_mhz());
        let lsb = Band::from_total(820.0, -16.0, 2, 8e6, true, 1);
        let fb = Filterbank::new(&lsb, 2, &FilterbankConfig::default()).unwrap();
        assert_eq!(fb.band().centre_mhz, vec![826.0, 822.0, 818.0, 814.0]);
        assert_eq!(fb.band().sideband, Sideband::Lower);
        let real = Band::from_total(1400.0, 400.0, 1, 800e6, false, 1);
        let fb = Filterbank::new(&real, 4, &FilterbankConfig::default()).unwrap();
        assert_eq!(fb.decimation(), 8);
        assert_eq!(fb.band().centre_mhz, vec![1250.0, 1350.0, 1450.0, 1550.0]);
        assert_eq!(fb.band().channel_bandwidth_mhz(), 100.0);
    }
}
