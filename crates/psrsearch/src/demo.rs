//! The demonstration: simulate an observation with two pulsars, search it, show that the
//! injected pulsars come out on top. Also a throughput measurement on simulated data.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::dedisperse::{DedispersionPlan, PlanConfig};
use crate::format::{BasebandReader, Metadata};
use crate::search::{dm_grid, search_file, Candidate, SearchConfig, SearchError, SearchOutcome};
use crate::simulate::{simulate, write_simulation, Pulsar, SimConfig, SimError, SimFormat};

/// Why the demo failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// Simulating.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// Searching.
    #[error(transparent)]
    Search(#[from] SearchError),
    /// Writing results.
    #[error("cannot write results: {0}")]
    Io(#[from] std::io::Error),
    /// Writing the candidates and plots.
    #[error(transparent)]
    Write(#[from] crate::products::WriteError),
}

/// The demo observation: 8 MHz at 820 MHz in four 2 MHz complex channels, two
/// polarisations, 2²¹ samples (1.05 s), two pulsars.
pub fn demo_observation(seed: u64) -> SimConfig {
    SimConfig {
        centre_mhz: 820.0,
        bandwidth_mhz: 8.0,
        nchan: 4,
        npol: 2,
        complex: true,
        nsamples: 1 << 21,
        seed,
        pulsars: vec![
            Pulsar {
                period_s: 0.033_13,
                dm: 26.8,
                duty_cycle: 0.02,
                amplitude: 0.08,
                orbit: None,
            },
            Pulsar {
                period_s: 0.007_417,
                dm: 48.2,
                duty_cycle: 0.08,
                amplitude: 0.04,
                orbit: None,
            },
        ],
        metadata: Metadata {
            source: "DEMO".into(),
            ..SimConfig::default_metadata()
        },
        ..SimConfig::default()
    }
}

/// The demo search: DMs 0–64 in steps of 2, 16 µs resolution.
pub fn demo_search() -> SearchConfig {
    SearchConfig {
        dms: dm_grid(0.0, 64.0, 2.0),
        plan: PlanConfig::default().downsample(32),
        ..SearchConfig::default()
    }
}

/// Whether `c` recovers `p`: period within 0.1%, DM within one trial step.
pub fn recovers(p: &Pulsar, c: &Candidate, dm_step: f64) -> bool {
    ((c.period_s - p.period_s) / p.period_s).abs() < 1e-3 && (c.dm - p.dm).abs() <= dm_step * 1.0001
}

/// What the demo did.
#[derive(Debug)]
pub struct DemoReport {
    /// The simulated observation.
    pub observation: SimConfig,
    /// The simulated file.
    pub file: PathBuf,
    /// The search.
    pub outcome: SearchOutcome,
    /// For each injected pulsar, the rank of the candidate that recovers it.
    pub recovered: Vec<Option<usize>>,
    /// Files written (tables and plots).
    pub written: Vec<PathBuf>,
    /// Seconds spent simulating.
    pub simulate_s: f64,
}

/// Run the demo in `dir`.
///
/// # Errors
/// Simulation, search, plotting or I/O failures.
pub fn run_demo(
    dir: &Path,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DemoReport, DemoError> {
    std::fs::create_dir_all(dir)?;
    let observation = demo_observation(seed);
    let file = dir.join("demo.dada");
    let t0 = Instant::now();
    write_simulation(&observation, SimFormat::Dada8, &file)?;
    let simulate_s = t0.elapsed().as_secs_f64();
    let mut reader = BasebandReader::open(&file).map_err(SearchError::from)?;
    let config = demo_search();
    let outcome = search_file(&mut reader, &config, progress)?;
    let step = config.dms[1] - config.dms[0];
    let recovered = observation
        .pulsars
        .iter()
        .map(|p| {
            outcome
                .candidates
                .iter()
                .find(|c| recovers(p, &c.candidate, step))
                .map(|c| c.candidate.rank)
        })
        .collect();
    let written = crate::products::write_search(&outcome, dir, true)?;
    Ok(DemoReport {
        observation,
        file,
        outcome,
        recovered,
        written,
        simulate_s,
    })
}

/// A ranked table for the terminal; rows matching an injected pulsar are marked.
pub fn format_table(cands: &[Candidate], injected: &[Pulsar], dm_step: f64) -> String {
    let mut s = format!(
        "{:>4}  {:>12}  {:>10}  {:>7}  {:>8}  {:>7}  {:>5}  {:>6}  {}\n",
        "rank", "period (ms)", "freq (Hz)", "DM", "sigma", "S/N", "harm", "DMhits", "note"
    );
    for c in cands {
        let hit = injected
            .iter()
            .position(|p| recovers(p, c, dm_step))
            .map(|i| {
                format!(
                    "injected #{} (P {:.4} ms, DM {})",
                    i + 1,
                    injected[i].period_s * 1e3,
                    injected[i].dm
                )
            })
            .unwrap_or_default();
        let hit = match (hit.is_empty(), c.flag.is_empty()) {
            (_, true) => hit,
            (true, false) => format!("probable interference: {}", c.flag),
            (false, false) => format!("{hit}; flagged {}", c.flag),
        };
        // An acceleration search's candidate: its drift, as the acceleration it means.
        let hit = match (c.fdot_hz_s == 0.0, hit.is_empty()) {
            (true, _) => hit,
            (false, true) => format!("accel {:.3e} m/s²", c.accel_ms2),
            (false, false) => format!("accel {:.3e} m/s²; {hit}", c.accel_ms2),
        };
        s.push_str(&format!(
            "{:>4}  {:>12.6}  {:>10.4}  {:>7.2}  {:>8.1}  {:>7.1}  {:>5}  {:>6}  {}\n",
            c.rank,
            c.period_s * 1e3,
            c.freq_hz,
            c.dm,
            c.sigma,
            c.snr,
            c.nharm,
            c.dm_hits,
            hit
        ));
    }
    s
}

/// Throughput of the dedispersion kernels on one core.
#[derive(Clone, Debug)]
pub struct Throughput {
    /// FFT length used (of the sub-channels where the band was split).
    pub fft_len: usize,
    /// Overlap of each FFT at the largest DM (samples discarded, of the sub-channels where
    /// split).
    pub overlap: usize,
    /// Complex samples per second for one DM (forward FFT, chirp, inverse FFT, detection).
    pub one_dm_samples_per_s: f64,
    /// Sample-DM trials per second with `ndm` DMs sharing each forward FFT.
    pub many_dm_trials_per_s: f64,
    /// DMs in the second measurement.
    pub ndm: usize,
    /// The band measured (the input's, before any split).
    pub band: crate::Band,
    /// The filterbank's geometry where the band was split: sub-channels, FFT length,
    /// margin.
    pub filterbank: Option<(usize, usize, usize)>,
}

impl Throughput {
    /// Complex samples per second the band delivers (all channels and polarisations).
    pub fn band_rate(&self) -> f64 {
        self.band.sample_rate_hz * (self.band.nchan() * self.band.npol) as f64
    }
}

/// The band `psrsearch bench` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchBand {
    /// The demo's: 8 MHz at 820 MHz in four 2 MHz complex channels, two polarisations.
    Demo,
    /// One 16 MHz complex channel at 820 MHz, two polarisations: the wide channel that needs
    /// a huge FFT unless it is split.
    Wide16,
}

impl BenchBand {
    /// The simulated observation of this band (noise only, `nsamples` per channel).
    pub fn observation(self, nsamples: usize) -> SimConfig {
        let mut obs = demo_observation(3);
        if self == BenchBand::Wide16 {
            obs.bandwidth_mhz = 16.0;
            obs.nchan = 1;
        }
        obs.nsamples = nsamples;
        obs.pulsars.clear();
        obs
    }

    /// The band's layout.
    pub fn band(self) -> crate::Band {
        self.observation(0).band()
    }
}

/// What `psrsearch bench` measures; `Default` is the demo band at 32 DMs.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Samples per channel.
    pub nsamples: usize,
    /// DMs of the second measurement (0, 2, 4, …).
    pub ndm: usize,
    /// FFT length of the dedispersion (of the sub-channels where split).
    pub fft_len: Option<usize>,
    /// The band.
    pub band: BenchBand,
    /// Sub-channels per channel (1: no split).
    pub subchannels: usize,
    /// Detected input samples per output sample.
    pub downsample: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            nsamples: 1 << 20,
            ndm: 32,
            fft_len: None,
            band: BenchBand::Demo,
            subchannels: 1,
            downsample: 32,
        }
    }
}

/// Measure dedispersion throughput of `config.nsamples` simulated samples (noise) of the
/// chosen band; where it is split into sub-channels the filterbank's time is included.
///
/// # Errors
/// Simulation, filterbank or planning failures.
pub fn measure_throughput(config: &BenchConfig) -> Result<Throughput, DemoError> {
    let (band, data) = simulate(&config.band.observation(config.nsamples))?;
    let nsamples = config.nsamples as u64;
    let plan_config = PlanConfig {
        fft_len: config.fft_len,
        downsample: config.downsample,
        subchannels: config.subchannels,
        ..PlanConfig::default()
    }
    .data_len(nsamples);
    let filterbank = crate::filterbank::for_plan(&band, &plan_config).map_err(SearchError::from)?;
    let time = |dms: &[f64]| -> Result<(usize, usize, f64, u64), SearchError> {
        let Some(fb) = &filterbank else {
            let plan = DedispersionPlan::new(&band, dms, &plan_config)?;
            let mut ws = plan.workspace();
            let mut block = crate::Voltages::zeros(band.nchan(), band.npol, plan.fft_len());
            let start = Instant::now();
            for b in 0..plan.num_blocks(nsamples) {
                block.fill_window(&data, plan.block_start(b) as usize);
                std::hint::black_box(plan.process_block(&mut ws, b, &block));
            }
            let samples = plan.complex_samples(nsamples);
            let t = start.elapsed().as_secs_f64();
            return Ok((plan.fft_len(), plan.overlap(), t, samples));
        };
        // The split as a search does it: block by block, through the filterbank.
        let plan = DedispersionPlan::new(fb.band(), dms, &fb.plan_config(&plan_config)?)?;
        let sub_n = fb.output_len(nsamples);
        let mut ws = plan.workspace();
        let mut fws = fb.workspace();
        let mut block = crate::Voltages::zeros(fb.band().nchan(), band.npol, plan.fft_len());
        let mut read = |first: i64, b: &mut crate::Voltages| -> Result<(), SearchError> {
            crate::filterbank::fill_signed(&data, first, b);
            Ok(())
        };
        let start = Instant::now();
        for b in 0..plan.num_blocks(sub_n) {
            fb.read_into(
                &mut fws,
                nsamples,
                plan.block_start(b),
                &mut block,
                &mut read,
            )?;
            std::hint::black_box(plan.process_block(&mut ws, b, &block));
        }
        let samples = plan.complex_samples(sub_n);
        let t = start.elapsed().as_secs_f64();
        Ok((plan.fft_len(), plan.overlap(), t, samples))
    };
    let (_, _, t1, s1) = time(&[48.2])?;
    let dms = dm_grid(0.0, 2.0 * (config.ndm.max(1) - 1) as f64, 2.0);
    let (n, overlap, tn, sn) = time(&dms)?;
    Ok(Throughput {
        fft_len: n,
        overlap,
        one_dm_samples_per_s: s1 as f64 / t1,
        many_dm_trials_per_s: sn as f64 * dms.len() as f64 / tn,
        ndm: dms.len(),
        band,
        filterbank: filterbank.map(|f| (f.nsub(), f.fft_len(), f.margin())),
    })
}
