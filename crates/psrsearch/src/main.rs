//! `psrsearch`: simulate, dedisperse and search baseband pulsar data.

use std::path::PathBuf;
use std::process::ExitCode;

mod dist_cli;
mod progress;
mod stream_cli;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use psrsearch::demo;
use psrsearch::distributed::ServiceMode;
use psrsearch::format::{Metadata, SkyPosition};
use psrsearch::rfi::Birdie;
use psrsearch::search::{dm_grid, dm_step_for, search_file, Candidate, DmStepPlan, SearchConfig};
use psrsearch::simulate::{write_simulation, Pulsar, SimConfig, SimFormat};
use psrsearch::{Band, BasebandReader, PlanConfig, Sideband, DEFAULT_DISPERSION_CONSTANT};

#[derive(Debug, Parser)]
#[command(
    name = "psrsearch",
    version,
    about = "Coherent-dedispersion pulsar search of DADA, GUPPI RAW and VDIF baseband data"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a DADA, GUPPI or VDIF file of Gaussian noise with injected, dispersed pulsars.
    Simulate(SimulateArgs),
    /// Print the layout a baseband file's headers describe, and the observation: source,
    /// telescope, position, start.
    Info {
        /// DADA, GUPPI or VDIF file (VDIF needs FILE.hdr beside it: FREQ, and BW, NPOL, SAMPLE_RATE, THREADS where the headers lack them).
        file: PathBuf,
    },
    /// Coherently dedisperse at one DM and write time series, filterbank or voltages.
    Dedisperse(DedisperseArgs),
    /// Search many DMs for periodic signals; write a ranked table and plots.
    Search(SearchArgs),
    /// Simulate two pulsars, search for them over an emulated 3-site metacomputer on this
    /// machine, print the table and draw the plots.
    Demo {
        /// Directory for the simulated file, tables and plots.
        #[arg(long, default_value = "psrsearch-demo")]
        out_dir: PathBuf,
        /// Random seed of the simulation.
        #[arg(long, default_value_t = 2024)]
        seed: u64,
        /// Search in this process only (no metacomputer).
        #[arg(long)]
        single: bool,
        /// Service mode of the distributed search: request, scheduled (no requests; each
        /// meta host's planned units go to whichever of its clients has room) or dynamic.
        #[arg(long, default_value = "scheduled")]
        mode: ServiceMode,
        /// Use this meta-computer description instead of the embedded one.
        #[arg(long)]
        meta: Option<PathBuf>,
    },
    /// Search an ordered DADA, GUPPI RAW or VDIF stream (stdin, one TCP connection with --listen, or VDIF
    /// datagrams with --listen-udp) as it
    /// arrives: a master rank cuts it into blocks, stage-1 ranks dedisperse them at every
    /// trial DM, a stage-2 rank reassembles them in order, searches what has arrived every
    /// --search-every blocks and the whole stream at its end; reports each block's lag from
    /// arrival to result.
    Stream(stream_cli::StreamArgs),
    /// One rank of a streaming search (started by `stream`).
    #[command(hide = true)]
    StreamRank(stream_cli::StreamRankArgs),
    /// Print the static load balance: units per meta host, predicted times, dead time, and
    /// the fewest clients that saturate each link.
    Plan(dist_cli::PlanArgs),
    /// One rank of a distributed search (started by `demo` and `search --meta`).
    #[command(hide = true)]
    Rank(dist_cli::RankArgs),
    /// A router between meta hosts (started by `demo` and `search --meta`).
    #[command(hide = true)]
    Router,
    /// Measure dedispersion throughput on one core.
    Bench {
        /// Samples per channel to process (the demo band: 4 channels, 2 polarisations).
        #[arg(long, default_value_t = 1 << 20)]
        nsamples: usize,
        /// DMs sharing each forward FFT in the second measurement.
        #[arg(long, default_value_t = 32)]
        ndm: usize,
        /// FFT length (default: chosen from the smear; of the sub-channels with
        /// --subchannels).
        #[arg(long)]
        fft_len: Option<usize>,
        /// Band: demo (4 × 2 MHz complex channels at 820 MHz, 2 pol) or wide16 (one 16 MHz
        /// complex channel at 820 MHz, 2 pol).
        #[arg(long, value_enum, default_value = "demo")]
        band: BenchBandArg,
        /// Split each channel into N sub-channels first (the filterbank's time included);
        /// `auto` as for search, at the largest of the DMs.
        #[arg(long, value_name = "N|auto", default_value = "1")]
        subchannels: Subchannels,
        /// Detected input samples per output sample (a multiple of --subchannels).
        #[arg(long, default_value_t = 32)]
        downsample: usize,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BenchBandArg {
    /// 4 × 2 MHz complex channels at 820 MHz, 2 polarisations.
    Demo,
    /// One 16 MHz complex channel at 820 MHz, 2 polarisations.
    Wide16,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    /// DADA, 8-bit.
    Dada,
    /// DADA, 16-bit integers.
    Dada16,
    /// DADA, 32-bit floats.
    Dada32,
    /// GUPPI RAW, 8-bit.
    Guppi,
    /// GUPPI RAW, 16-bit.
    Guppi16,
    /// VDIF, 8-bit, one thread per channel and polarisation, plus the FILE.hdr side-car.
    Vdif,
}

#[derive(Debug, Args)]
struct SimulateArgs {
    /// Output file.
    #[arg(long, short)]
    out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "dada")]
    format: FormatArg,
    /// Band centre, MHz.
    #[arg(long, default_value_t = 820.0)]
    freq: f64,
    /// Total bandwidth, MHz (negative: lower sideband).
    #[arg(long, default_value_t = 8.0, allow_negative_numbers = true)]
    bw: f64,
    /// Channels.
    #[arg(long, default_value_t = 4)]
    nchan: usize,
    /// Polarisations (1 or 2).
    #[arg(long, default_value_t = 2)]
    npol: usize,
    /// Real (not complex) samples; DADA only.
    #[arg(long)]
    real: bool,
    /// Duration, s.
    #[arg(long, default_value_t = 1.0)]
    duration: f64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Pulsar as period_ms:dm:duty:amplitude[:orbit_s:asini_lts[:orbit_phase]] (repeatable),
    /// e.g. 33.1:26.8:0.05:0.05, or 10:15.3:0.04:0.3:10:1:0.224 in a circular 10 s orbit.
    #[arg(long = "pulsar")]
    pulsars: Vec<Pulsar>,
    /// Noise RMS per component in output units (8-bit quantisation level).
    #[arg(long, default_value_t = 10.0)]
    rms: f32,
    /// GUPPI samples per block.
    #[arg(long, default_value_t = 65536)]
    block_samples: usize,
    /// Dispersion constant, s MHz² cm³/pc.
    #[arg(long, default_value_t = DEFAULT_DISPERSION_CONSTANT)]
    dispersion_constant: f64,
    /// Source name written into the headers (and so into every product).
    #[arg(long, default_value = "SIMULATED")]
    source: String,
    /// Telescope written into the headers: a name SIGPROC knows (Effelsberg, Arecibo,
    /// Parkes, Jodrell, GBT, GMRT, LOFAR, ...) gets its telescope_id in .fil/.tim files;
    /// others become 0, SIGPROC's "Fake".
    #[arg(long, default_value = "Fake")]
    telescope: String,
    /// J2000 right ascension, hh:mm:ss.s (the default position is arbitrary, there so that
    /// products show one).
    #[arg(long, default_value = "12:00:00.0", allow_hyphen_values = true)]
    ra: String,
    /// J2000 declination, [+-]dd:mm:ss.s.
    #[arg(long, default_value = "+30:00:00.0", allow_hyphen_values = true)]
    dec: String,
    /// Start of the first sample, MJD (UTC); VDIF frames start on the whole second before.
    #[arg(long, default_value_t = 51544.0)]
    mjd: f64,
}

#[derive(Debug, Args)]
struct DedispersionOpts {
    /// FFT length (default: a power of two ≥ 4× the overlap the smear needs, or the data's length rounded up to a power of two where that is shorter; the last block is padded with zeros so every sample between the edges reaches the output).
    #[arg(long)]
    fft_len: Option<usize>,
    /// Reference frequency, MHz (default: band centre).
    #[arg(long)]
    ref_freq: Option<f64>,
    /// Override the header's sideband: upper or lower.
    #[arg(long)]
    sideband: Option<Sideband>,
    /// Dispersion constant, s MHz² cm³/pc (default 1/2.41e-4, as dspsr, PRESTO, baseband-tasks).
    #[arg(long, default_value_t = DEFAULT_DISPERSION_CONSTANT)]
    dispersion_constant: f64,
    /// Detected samples summed per output sample.
    #[arg(long)]
    downsample: Option<usize>,
    /// Split each channel into N sub-channels with a coherent filterbank before
    /// dedispersing (dspsr's -F), so that the many-DM stage uses short FFTs; --fft-len then
    /// counts sub-channel samples, and --downsample must be a multiple of N (2N for real
    /// data; search and dedisperse raise a default one to that). `auto`: the smallest power
    /// of two whose smear at the largest DM fits an FFT of 2048, the downsampling factor
    /// permitting (printed; by stream's master, which reads the band, at the end). Not
    /// with --voltages.
    #[arg(long, value_name = "N|auto", default_value = "1")]
    subchannels: Subchannels,
}

/// `--subchannels`: a count, or chosen from the band and DMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subchannels {
    Count(usize),
    Auto,
}

impl std::str::FromStr for Subchannels {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(Subchannels::Auto);
        }
        s.parse()
            .map(Subchannels::Count)
            .map_err(|_| format!("expected a number of sub-channels or `auto`, not {s:?}"))
    }
}

impl Subchannels {
    /// Whether channels are (or may be) split.
    fn splits(self) -> bool {
        self != Subchannels::Count(1)
    }

    /// The count for `band` dedispersed up to `max_dm` with `cfg`, saying what `auto` chose.
    fn resolve(self, band: &Band, max_dm: f64, cfg: &PlanConfig) -> usize {
        match self {
            Subchannels::Count(n) => n,
            Subchannels::Auto => {
                let n = psrsearch::filterbank::choose_subchannels(band, max_dm, cfg);
                println!("{}", Self::describe_choice(n, max_dm, cfg.downsample));
                n
            }
        }
    }

    /// What `auto` chose, in words.
    fn describe_choice(n: usize, max_dm: f64, downsample: usize) -> String {
        format!(
            "--subchannels auto: {n} per channel (the smallest power of two whose smear at DM \
             {} fits an FFT of 2048 points, downsampling by {downsample} permitting)",
            psrsearch::search::dm_for_print(max_dm),
        )
    }
}

impl DedispersionOpts {
    /// The settings for `band` (where known): a default downsampling factor is raised to a
    /// whole number of sub-channel samples, with a note saying so.
    fn config_for(&self, default_downsample: usize, band: Option<&Band>) -> PlanConfig {
        let mut cfg = self.config(default_downsample);
        if let (None, Some(b), Subchannels::Count(n)) = (self.downsample, band, self.subchannels) {
            if n > 1 {
                let d = if b.complex { n } else { 2 * n };
                let fitted = cfg.downsample.next_multiple_of(d);
                if fitted != cfg.downsample {
                    eprintln!(
                        "--subchannels {n}: downsampling by {fitted} input samples, not the \
                         default {}, so that an output sample is a whole number of \
                         sub-channel samples",
                        cfg.downsample
                    );
                    cfg.downsample = fitted;
                }
            }
        }
        cfg
    }

    fn config(&self, default_downsample: usize) -> PlanConfig {
        PlanConfig {
            fft_len: self.fft_len,
            reference_mhz: self.ref_freq,
            sideband: self.sideband,
            dispersion_constant: self.dispersion_constant,
            downsample: self.downsample.unwrap_or(default_downsample),
            extra_overlap: 0,
            data_len: None,
            subchannels: match self.subchannels {
                Subchannels::Count(n) => n,
                // Chosen once the band and the DMs are known (`Subchannels::resolve`).
                Subchannels::Auto => 1,
            },
        }
    }
}

#[derive(Debug, Args)]
struct DedisperseArgs {
    /// DADA, GUPPI or VDIF file (VDIF needs FILE.hdr beside it: FREQ, and BW, NPOL, SAMPLE_RATE, THREADS where the headers lack them).
    file: PathBuf,
    /// Dispersion measure, pc cm⁻³.
    #[arg(long)]
    dm: f64,
    #[command(flatten)]
    opts: DedispersionOpts,
    /// Write a SIGPROC time series (header: source_name, telescope_id, src_raj/src_dej,
    /// tstart, as the input's headers give them).
    #[arg(long)]
    tim: Option<PathBuf>,
    /// Write a SIGPROC filterbank of the aligned channels (header as for --tim).
    #[arg(long)]
    fil: Option<PathBuf>,
    /// Write PRESTO BASE.dat and BASE.inf (telescope, object, RA/Dec and epoch from the
    /// input's headers).
    #[arg(long)]
    dat: Option<PathBuf>,
    /// Write the time series as .npy (float32).
    #[arg(long)]
    npy: Option<PathBuf>,
    /// Write the dedispersed complex voltages as .npy (complex64, nchan × npol × nsamp).
    #[arg(long)]
    voltages: Option<PathBuf>,
}

/// Trial DMs, dedispersion and periodicity settings shared by `search` and `stream`.
#[derive(Debug, Args)]
struct SearchOpts {
    /// First trial DM.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    dm_start: f64,
    /// Last trial DM.
    #[arg(long, allow_negative_numbers = true, default_value_t = 100.0)]
    dm_end: f64,
    /// DM step (default: chosen from the band, as PRESTO's DDplan, so that half a step
    /// smears the band by the time resolution; 2 where the band is not known beforehand).
    #[arg(long)]
    dm_step: Option<f64>,
    /// Narrowest pulse searched for, ms: a wider one allows a coarser chosen DM step.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    min_width: f64,
    /// Explicit trial DMs (comma-separated), instead of the grid.
    #[arg(long, value_delimiter = ',')]
    dms: Vec<f64>,
    #[command(flatten)]
    opts: DedispersionOpts,
    /// Report candidates at or above this significance (Gaussian sigma, trials included).
    #[arg(long, allow_negative_numbers = true, default_value_t = 6.0)]
    threshold: f64,
    /// Most candidates reported.
    #[arg(long, default_value_t = 10)]
    max_candidates: usize,
    /// Most harmonics summed (1, 2, 4, 8 or 16).
    #[arg(long, default_value_t = 16)]
    nharm: usize,
    /// Lowest spin frequency searched, Hz.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    min_freq: f64,
    /// Highest spin frequency searched, Hz.
    #[arg(long, allow_negative_numbers = true, default_value_t = 2000.0)]
    max_freq: f64,
    /// Also search every DM for single pulses (boxcars of 1 to 64 samples) and write
    /// single_pulses.csv and single_pulses.png.
    #[arg(long)]
    single_pulse: bool,
    /// S/N threshold of the single-pulse search.
    #[arg(long, default_value_t = 6.0, allow_negative_numbers = true)]
    sp_threshold: f64,
    /// Most bins of a folded profile (a profile has one bin per sample of the period where
    /// that is fewer).
    #[arg(long, default_value_t = 256)]
    nbins: usize,
    /// Periodic interference removed from every spectrum (repeatable): FREQ[:WIDTH[:HARMONICS]]
    /// in Hz (width 0.05 Hz, growing with the harmonic; 1 harmonic; 0: all), or `mains` for
    /// 50 and 60 Hz with all harmonics.
    #[arg(long = "birdie", value_name = "SPEC")]
    birdies: Vec<String>,
    /// File of birdies, one per line as FREQ [WIDTH [HARMONICS]] or `mains`; # comments.
    #[arg(long, value_name = "FILE")]
    birdie_file: Option<PathBuf>,
    /// Flag candidates whose S/N at DM 0 is at least this fraction of their best as probable
    /// interference, ranked after the rest (0: never).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.85)]
    zero_dm_fraction: f64,
    /// Clip detected samples beyond this many robust standard deviations (median absolute
    /// deviation) from each DM series' median, and report how many (0: no clipping).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    clip: f64,
    /// Acceleration search for binary pulsars: largest drift of the highest harmonic's
    /// frequency over the observation, in Fourier bins (PRESTO's -zmax; planes every 2 bins
    /// from -ZMAX to ZMAX; 0: none). Candidates then carry fdot_hz_s and accel_ms2.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    zmax: f64,
    /// Draw a prepfold-style plot, candidate_N.png, for each of the top N candidates:
    /// profile, sub-integrations and channels against phase, S/N against DM, the P-Pdot
    /// plane, and the observation and candidate in words (0: none).
    #[arg(long, value_name = "N", default_value_t = 3)]
    plots: usize,
}

impl SearchOpts {
    /// The search's settings, and the DM step plan where the step was chosen from `band`.
    fn config(&self, band: Option<&Band>) -> Result<(SearchConfig, Option<DmStepPlan>)> {
        let plan = self.opts.config_for(32, band);
        if !(self.min_width >= 0.0 && self.min_width.is_finite()) {
            bail!(
                "--min-width must be a width in ms ≥ 0, not {}",
                self.min_width
            );
        }
        let step_plan = match (self.dm_step, band) {
            (None, Some(b)) if self.dms.is_empty() => Some(dm_step_for(
                b,
                b.tsamp_s() * plan.downsample.max(1) as f64,
                self.min_width * 1e-3,
                plan.dispersion_constant,
            )),
            _ => None,
        };
        let dms = if self.dms.is_empty() {
            let step = step_plan
                .as_ref()
                .map_or(self.dm_step.unwrap_or(2.0), |p| p.step);
            let (start, end) = (self.dm_start, self.dm_end);
            if !(start.is_finite() && end.is_finite() && step.is_finite()) {
                bail!("--dm-start, --dm-end and --dm-step must be numbers");
            }
            if end < start {
                bail!(
                    "--dm-end {end} is below --dm-start {start}: the DM range is inverted \
                     (did you mean --dm-start {end} --dm-end {start}?)"
                );
            }
            if step <= 0.0 {
                bail!("--dm-step must be above 0, not {step}");
            }
            dm_grid(start, end, step)
        } else {
            self.dms.clone()
        };
        if ![1, 2, 4, 8, 16].contains(&self.nharm) {
            bail!("--nharm must be 1, 2, 4, 8 or 16, not {}", self.nharm);
        }
        let mut plan = plan;
        if let Some(b) = band {
            let max_dm = dms.iter().fold(0.0f64, |m, d| m.max(d.abs()));
            plan.subchannels = self.opts.subchannels.resolve(b, max_dm, &plan);
        }
        let mut config = SearchConfig {
            dms,
            plan,
            threshold_sigma: self.threshold,
            max_candidates: self.max_candidates,
            ..SearchConfig::default()
        };
        for spec in &self.birdies {
            config
                .periodicity
                .birdies
                .extend(Birdie::parse_list(spec).map_err(|e| anyhow::anyhow!("--birdie: {e}"))?);
        }
        if let Some(path) = &self.birdie_file {
            config
                .periodicity
                .birdies
                .extend(Birdie::read_file(path).map_err(|e| anyhow::anyhow!("{e}"))?);
        }
        if !(0.0..=1.0).contains(&self.zero_dm_fraction) {
            bail!(
                "--zero-dm-fraction must be between 0 (off) and 1, not {}",
                self.zero_dm_fraction
            );
        }
        if !(self.clip >= 0.0 && self.clip.is_finite()) {
            bail!(
                "--clip must be a number of sigma ≥ 0 (0: off), not {}",
                self.clip
            );
        }
        if !(8..=4096).contains(&self.nbins) {
            bail!("--nbins must be between 8 and 4096, not {}", self.nbins);
        }
        config.fold_bins = self.nbins;
        config.single_pulse.enabled = self.single_pulse;
        config.single_pulse.threshold_sigma = self.sp_threshold;
        config.rfi.zero_dm_fraction = self.zero_dm_fraction;
        config.rfi.clip_sigma = self.clip;
        config.periodicity.max_harmonics = self.nharm;
        config.periodicity.min_freq_hz = self.min_freq;
        config.periodicity.max_freq_hz = self.max_freq;
        if !(0.0..=MAX_ZMAX).contains(&self.zmax) {
            bail!(
                "--zmax must be a drift in Fourier bins from 0 (no acceleration search) to \
                 {MAX_ZMAX}, not {}",
                self.zmax
            );
        }
        config.periodicity.zmax = self.zmax;
        config.candidate_plots = self.plots;
        Ok((config, step_plan))
    }
}

/// Largest `--zmax` taken: PRESTO's own limit is of this order, and the planes of a longer
/// drift would not fit in memory for usual series.
const MAX_ZMAX: f64 = 1200.0;

#[derive(Debug, Args)]
struct SearchArgs {
    /// DADA, GUPPI or VDIF file (VDIF needs FILE.hdr beside it: FREQ, and BW, NPOL, SAMPLE_RATE, THREADS where the headers lack them).
    file: PathBuf,
    #[command(flatten)]
    search: SearchOpts,
    /// Directory for candidates.csv and candidates.json (the observation's source, telescope,
    /// position and start, then the ranked candidates), PRESTO ACCEL files
    /// (candidates_DM<dm>_ACCEL_<zmax>, one per DM with candidates, for PRESTO's sifting)
    /// and PNG plots.
    #[arg(long, default_value = "psrsearch-out")]
    out_dir: PathBuf,
    /// Skip the plots (and the folds behind the candidate plots).
    #[arg(long)]
    no_plots: bool,
    /// Search distributed over the meta computer this description defines (meta hosts with
    /// LAUNCH = local, emulated on this machine).
    #[arg(long)]
    meta: Option<PathBuf>,
    /// Service mode with --meta: request (clients ask for their planned units), scheduled
    /// (no requests: the server pushes each meta host's planned units to whichever of its
    /// clients has room) or dynamic (units move between any clients while running).
    #[arg(long, default_value = "request")]
    mode: ServiceMode,
}

fn main() -> ExitCode {
    // Warnings and notes of the launcher and library it runs in-process (METAMPI_LOG).
    metampi::log::init();
    // Routers of a meta job are this executable with their spec in the environment.
    if metampi_router::run_from_env() {
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(a) => simulate_cmd(a),
        Command::Info { file } => info_cmd(file),
        Command::Dedisperse(a) => dedisperse_cmd(a),
        Command::Search(a) => search_cmd(a),
        Command::Demo {
            out_dir,
            seed,
            single,
            mode,
            meta,
        } => demo_cmd(out_dir, seed, single, mode, meta),
        Command::Plan(a) => dist_cli::plan_main(a),
        Command::Rank(a) => dist_cli::rank_main(a),
        Command::Stream(a) => stream_cli::stream_main(a),
        Command::StreamRank(a) => stream_cli::stream_rank_main(a),
        Command::Router => Err(anyhow::anyhow!(
            "`psrsearch router` is started by `psrsearch demo` and `search --meta`"
        )),
        Command::Bench {
            nsamples,
            ndm,
            fft_len,
            band,
            subchannels,
            downsample,
        } => {
            let band = match band {
                BenchBandArg::Demo => demo::BenchBand::Demo,
                BenchBandArg::Wide16 => demo::BenchBand::Wide16,
            };
            let cfg = PlanConfig::default().downsample(downsample);
            let max_dm = 2.0 * (ndm.max(1) - 1) as f64;
            bench_cmd(&demo::BenchConfig {
                nsamples,
                ndm,
                fft_len,
                band,
                subchannels: subchannels.resolve(&band.band(), max_dm.max(48.2), &cfg),
                downsample,
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("psrsearch: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `work` with its count of blocks shown as `label` (see [`progress`]).
fn with_progress<T>(label: &str, work: impl FnOnce(&mut dyn FnMut(u64, u64)) -> T) -> T {
    let mut shown = progress::Progress::new(label, "blocks");
    let out = work(&mut |done, total| shown.update(done, total, ""));
    shown.finish();
    out
}

fn simulate_cmd(a: SimulateArgs) -> Result<()> {
    let complex = !a.real;
    let rate = a.bw.abs() * 1e6 / a.nchan.max(1) as f64 * if complex { 1.0 } else { 2.0 };
    let cfg = SimConfig {
        centre_mhz: a.freq,
        bandwidth_mhz: a.bw,
        nchan: a.nchan,
        npol: a.npol,
        complex,
        nsamples: (a.duration * rate).round() as usize,
        seed: a.seed,
        pulsars: a.pulsars,
        dispersion_constant: a.dispersion_constant,
        reference_mhz: None,
        rms: a.rms,
        metadata: Metadata {
            source: a.source,
            telescope: a.telescope,
            start_mjd: Some(a.mjd),
            position: Some(
                SkyPosition::parse(&a.ra, &a.dec)
                    .map_err(|e| anyhow::anyhow!("--ra/--dec: {e}"))?,
            ),
        },
    };
    if !(a.mjd.is_finite() && a.mjd >= 0.0) {
        bail!("--mjd must be a date as an MJD ≥ 0, not {}", a.mjd);
    }
    let format = match a.format {
        FormatArg::Dada => SimFormat::Dada8,
        FormatArg::Dada16 => SimFormat::Dada16,
        FormatArg::Dada32 => SimFormat::Dada32,
        FormatArg::Guppi => SimFormat::Guppi {
            block_samples: a.block_samples,
        },
        FormatArg::Guppi16 => SimFormat::Guppi16 {
            block_samples: a.block_samples,
        },
        FormatArg::Vdif => SimFormat::Vdif8,
    };
    let band = write_simulation(&cfg, format, &a.out)
        .with_context(|| format!("simulating {}", a.out.display()))?;
    println!(
        "wrote {}: {} samples × {} channels × {} pol at {} MHz ({} Hz per channel), {} pulsar(s)",
        a.out.display(),
        cfg.nsamples,
        band.nchan(),
        band.npol,
        band.band_centre_mhz(),
        band.sample_rate_hz,
        cfg.pulsars.len()
    );
    Ok(())
}

fn info_cmd(file: PathBuf) -> Result<()> {
    let r = BasebandReader::open(&file).with_context(|| format!("opening {}", file.display()))?;
    let b = r.band();
    println!("format      {:?}", r.format());
    println!("source      {}", r.metadata().source);
    println!("telescope   {}", r.metadata().telescope);
    if let Some(p) = r.metadata().position {
        println!(
            "position    RA {}  Dec {} (J2000)",
            p.ra_text(),
            p.dec_text()
        );
    }
    if let Some(m) = r.metadata().start_mjd {
        println!(
            "start MJD   {m:.12} ({} UTC)",
            psrsearch::format::metadata::utc_text(m)
        );
    }
    println!(
        "samples     {} per channel in {} frame(s)",
        r.nsamples(),
        r.nframes()
    );
    println!(
        "data        {}, {} pol, {} channel(s), {}-bit components",
        if b.complex { "complex" } else { "real" },
        b.npol,
        b.nchan(),
        r.bits_per_component()
    );
    println!(
        "rate        {} Hz ({} µs)",
        b.sample_rate_hz,
        1e6 / b.sample_rate_hz
    );
    println!(
        "band        {} – {} MHz, {:?} sideband",
        b.lowest_mhz(),
        b.highest_mhz(),
        b.sideband
    );
    println!("channels    {:?} MHz", b.centre_mhz);
    for w in r.warnings() {
        println!("warning     {w}");
    }
    Ok(())
}

fn dedisperse_cmd(a: DedisperseArgs) -> Result<()> {
    let mut reader =
        BasebandReader::open(&a.file).with_context(|| format!("opening {}", a.file.display()))?;
    if a.voltages.is_some() && a.opts.subchannels.splits() {
        bail!(
            "--voltages cannot be used with --subchannels: only detected products (--tim, \
             --fil, --dat, --npy) are made from sub-channels"
        );
    }
    let mut cfg = a.opts.config_for(1, Some(reader.band()));
    cfg.subchannels = a.opts.subchannels.resolve(reader.band(), a.dm, &cfg);
    print_split(reader.band(), &cfg)?;
    let out = with_progress("dedispersing", |progress| {
        psrsearch::products::dedisperse_file(
            &mut reader,
            a.dm,
            &cfg,
            a.voltages.is_some(),
            progress,
        )
    })
    .with_context(|| format!("dedispersing {}", a.file.display()))?;
    let p = &out.plan;
    eprintln!(
        "DM {} at reference {} MHz: FFT {} samples, overlap {}, lead {}, {} valid per block; {} output samples of {} µs",
        a.dm,
        p.reference_mhz(),
        p.fft_len(),
        p.overlap(),
        p.lead(),
        p.step(),
        out.series.data.len(),
        out.series.tsamp_s * 1e6
    );
    if let Some((start, _)) = &out.voltages {
        // Where the voltages sit in time, for comparisons with other dedispersers.
        eprintln!("voltages start at input sample {start} (at the reference frequency)");
    }
    let mut wrote = false;
    if let Some(path) = &a.tim {
        out.write_tim(path)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
        wrote = true;
    }
    if let Some(path) = &a.fil {
        out.write_fil(path)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
        wrote = true;
    }
    if let Some(path) = &a.dat {
        let (d, i) = out
            .write_presto(path)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} and {}", d.display(), i.display());
        wrote = true;
    }
    if let Some(path) = &a.npy {
        out.write_series_npy(path)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
        wrote = true;
    }
    if let Some(path) = &a.voltages {
        out.write_voltages_npy(path)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
        wrote = true;
    }
    if !wrote {
        let d = &out.series.data;
        let mean = d.iter().map(|v| *v as f64).sum::<f64>() / d.len() as f64;
        let peak = d.iter().copied().fold(f32::MIN, f32::max);
        println!("no output file requested; series mean {mean:.4}, peak {peak:.4} (use --tim/--fil/--dat/--npy/--voltages)");
    }
    Ok(())
}

fn search_cmd(a: SearchArgs) -> Result<()> {
    // The description is checked first, so that a mistake is named in the user's file (the
    // job runs a copy in the output directory).
    let meta_text = match &a.meta {
        Some(meta) => {
            let text = std::fs::read_to_string(meta)
                .with_context(|| format!("reading {}", meta.display()))?;
            metampi_config::parse_auto(&meta.display().to_string(), &text)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Some(text)
        }
        None => None,
    };
    let band = BasebandReader::open(&a.file)
        .with_context(|| format!("opening {}", a.file.display()))?
        .band()
        .clone();
    let (mut config, step_plan) = a.search.config(Some(&band))?;
    if a.no_plots {
        // Nothing will draw the candidates' folds.
        config.candidate_plots = 0;
    }
    print_split(&band, &config.plan)?;
    if let Some(p) = &step_plan {
        println!(
            "{}; {} trial DMs from {} to {}",
            p.describe(),
            config.dms.len(),
            psrsearch::search::dm_for_print(config.dms[0]),
            psrsearch::search::dm_for_print(config.dms[config.dms.len() - 1])
        );
    }
    if let Some(text) = meta_text {
        let file = std::fs::canonicalize(&a.file)
            .with_context(|| format!("opening {}", a.file.display()))?;
        let r = dist_cli::run_job(&file, &config, a.mode, &text, &a.out_dir, !a.no_plots)?;
        println!("distributed search took {:.2} s", r.wall_s);
        return Ok(());
    }
    let mut reader =
        BasebandReader::open(&a.file).with_context(|| format!("opening {}", a.file.display()))?;
    let outcome = with_progress("searching", |progress| {
        search_file(&mut reader, &config, progress)
    })
    .with_context(|| format!("searching {}", a.file.display()))?;
    let table: Vec<Candidate> = outcome
        .candidates
        .iter()
        .map(|c| c.candidate.clone())
        .collect();
    let step = if config.dms.len() > 1 {
        config.dms[1] - config.dms[0]
    } else {
        0.0
    };
    print!("{}", demo::format_table(&table, &[], step));
    if table.is_empty() {
        println!("(no candidate at or above {} sigma)", a.search.threshold);
    }
    write_results(&outcome, &a.out_dir, !a.no_plots)?;
    print_timings(&outcome);
    Ok(())
}

pub(crate) fn write_results(
    outcome: &psrsearch::SearchOutcome,
    dir: &std::path::Path,
    plots: bool,
) -> Result<()> {
    let files = psrsearch::products::write_search(outcome, dir, plots)?;
    let (pngs, tables): (Vec<_>, Vec<_>) = files
        .iter()
        .partition(|f| f.extension().is_some_and(|e| e == "png"));
    println!(
        "wrote {}",
        tables
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(events) = &outcome.single_pulses {
        let path = dir.join("single_pulses.csv");
        let pulses = psrsearch::single_pulse::group(events, &outcome.dms);
        println!(
            "single pulses: {} events at all DMs, {} pulses (all in {}); brightest:",
            events.len(),
            pulses.len(),
            path.display()
        );
        for p in pulses.iter().take(5) {
            println!(
                "  t = {:.6} s  DM {:.2}  S/N {:.1}  width {:.3} ms",
                p.time_s,
                p.dm,
                p.sigma,
                p.width_s * 1e3
            );
        }
    }
    if !pngs.is_empty() {
        println!(
            "plots: {}",
            pngs.iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

pub(crate) fn print_timings(o: &psrsearch::SearchOutcome) {
    let t = &o.timings;
    let rate = o.complex_samples as f64 * o.dms.len() as f64 / t.dedisperse_s.max(1e-9);
    println!(
        "time: dedispersion {:.2} s ({:.3e} sample-DM trials/s over {} DMs), periodicity {:.2} s, sifting+folding {:.2} s",
        t.dedisperse_s,
        rate,
        o.dms.len(),
        t.periodicity_s,
        t.fold_s
    );
    if o.masked.sigma > 0.0 {
        println!("interference: {}", o.masked.describe());
    }
}

fn demo_cmd(
    out_dir: PathBuf,
    seed: u64,
    single: bool,
    mode: ServiceMode,
    meta: Option<PathBuf>,
) -> Result<()> {
    let t_start = std::time::Instant::now();
    let obs = demo::demo_observation(seed);
    println!(
        "Simulating {:.2} s of 8 MHz at 820 MHz (4 channels, 2 pol) with injected pulsars:",
        obs.nsamples as f64 / 2e6
    );
    for (i, p) in obs.pulsars.iter().enumerate() {
        println!(
            "  #{}: P = {:.4} ms, DM = {}, duty {}, amplitude {}",
            i + 1,
            p.period_s * 1e3,
            p.dm,
            p.duty_cycle,
            p.amplitude
        );
    }
    let step = demo::demo_search().dms[1] - demo::demo_search().dms[0];
    let table: Vec<Candidate> = if single {
        let report = with_progress("searching", |progress| {
            demo::run_demo(&out_dir, seed, progress)
        })
        .context("running the demo")?;
        println!(
            "simulated in {:.2} s; searched {} DMs in this process",
            report.simulate_s,
            report.outcome.dms.len()
        );
        print_timings(&report.outcome);
        println!(
            "files: {}",
            report
                .written
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        report
            .outcome
            .candidates
            .iter()
            .map(|c| c.candidate.clone())
            .collect()
    } else {
        std::fs::create_dir_all(&out_dir)
            .with_context(|| format!("creating {}", out_dir.display()))?;
        let file = std::fs::canonicalize(&out_dir)?.join("demo.dada");
        let t = std::time::Instant::now();
        write_simulation(&obs, SimFormat::Dada8, &file)
            .with_context(|| format!("simulating {}", file.display()))?;
        println!(
            "simulated {} in {:.2} s",
            file.display(),
            t.elapsed().as_secs_f64()
        );
        let description = match &meta {
            Some(p) => {
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
            }
            None => dist_cli::demo_description()?,
        };
        println!(
            "starting an emulated metacomputer on this machine ({mode}):\n{}",
            description
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .map(|l| format!("  | {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let dir = std::fs::canonicalize(&out_dir)?;
        let r = dist_cli::run_job(&file, &demo::demo_search(), mode, &description, &dir, true)?;
        println!(
            "distributed search (routers, ranks, set-up, search) took {:.2} s",
            r.wall_s
        );
        r.candidates
    };
    print!("{}", demo::format_table(&table, &obs.pulsars, step));
    println!("demo wall time {:.1} s", t_start.elapsed().as_secs_f64());
    let ranks: Vec<Option<usize>> = obs
        .pulsars
        .iter()
        .map(|p| {
            table
                .iter()
                .find(|c| demo::recovers(p, c, step))
                .map(|c| c.rank)
        })
        .collect();
    let top = ranks.iter().all(|r| r.is_some_and(|r| r <= ranks.len()));
    if top {
        println!("both injected pulsars recovered at the top of the table");
        Ok(())
    } else {
        bail!("injected pulsars not all at the top: ranks {ranks:?}")
    }
}

fn bench_cmd(config: &demo::BenchConfig) -> Result<()> {
    let t = demo::measure_throughput(config)?;
    let b = &t.band;
    println!(
        "band {} × {} MHz complex at {} MHz, {} pol ({:.3e} complex samples/s), downsample {}",
        b.nchan(),
        b.channel_bandwidth_mhz(),
        b.band_centre_mhz(),
        b.npol,
        t.band_rate(),
        config.downsample
    );
    if let Some((nsub, fft, margin)) = t.filterbank {
        println!(
            "filterbank {nsub} sub-channels per channel (FFT {fft}, margin {margin} each side), included in the times"
        );
    }
    println!(
        "FFT length {} (overlap {} at the largest of {} DMs)",
        t.fft_len, t.overlap, t.ndm
    );
    println!("one DM:   {:.3e} complex samples/s (forward FFT + chirp + inverse FFT + detection, one core)", t.one_dm_samples_per_s);
    println!(
        "{} DMs:  {:.3e} sample-DM trials/s (one forward FFT per block shared by all DMs)",
        t.ndm, t.many_dm_trials_per_s
    );
    let realtime = t.many_dm_trials_per_s / t.ndm as f64 / t.band_rate();
    println!(
        "real time at {} DMs: {realtime:.3}x on one core; cores for real time {:.1}",
        t.ndm,
        1.0 / realtime
    );
    Ok(())
}

/// Say how channels are split, where they are: sub-channels, their width and the
/// filterbank's FFT; errors of the split (a bad count) before any file is read.
fn print_split(band: &Band, cfg: &PlanConfig) -> Result<()> {
    if let Some(fb) = psrsearch::filterbank::for_plan(band, cfg)? {
        fb.plan_config(cfg)?;
        println!(
            "filterbank: {} channel(s) split into {} sub-channels each ({} in all) of {} MHz, \
             {} µs sampling; FFT {} with {} sub-channel samples discarded at each end of a block",
            band.nchan(),
            fb.nsub(),
            fb.band().nchan(),
            fb.band().channel_bandwidth_mhz(),
            fb.band().tsamp_s() * 1e6,
            fb.fft_len(),
            fb.margin()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search_config(args: &[&str]) -> Result<SearchConfig> {
        let cli = Cli::try_parse_from(["psrsearch", "search", "in.dada"].iter().chain(args))
            .expect("the options parse");
        match cli.command {
            Command::Search(a) => a.search.config(None).map(|(c, _)| c),
            _ => unreachable!("a search command"),
        }
    }

    #[test]
    fn the_dm_step_is_chosen_from_the_band_unless_given() {
        let parse = |args: &[&str]| -> SearchOpts {
            let cli = Cli::try_parse_from(["psrsearch", "search", "in.dada"].iter().chain(args))
                .expect("the options parse");
            match cli.command {
                Command::Search(a) => a.search,
                _ => unreachable!("a search command"),
            }
        };
        let band = Band::from_total(430.0, 2.0, 2, 1e6, true, 1);
        let (c, p) = parse(&["--dm-end", "3", "--downsample", "16"])
            .config(Some(&band))
            .unwrap();
        let p = p.expect("a chosen step");
        assert_eq!(c.dms.len(), 21, "{:?}", c.dms);
        assert!((c.dms[1] - p.step).abs() < 1e-12 && p.step < 0.2, "{p:?}");
        let (c, p) = parse(&["--dm-end", "4", "--dm-step", "2"])
            .config(Some(&band))
            .unwrap();
        assert_eq!((c.dms, p), (vec![0.0, 2.0, 4.0], None));
        // Negative numbers are values, not options.
        let (c, _) = parse(&["--threshold", "-10", "--dm-start", "-1", "--dm-end", "1"])
            .config(Some(&band))
            .unwrap();
        assert_eq!((c.threshold_sigma, c.dms[0]), (-10.0, -1.0));
        let e = parse(&["--min-width", "-1"])
            .config(Some(&band))
            .unwrap_err();
        assert!(e.to_string().contains("--min-width"), "{e}");
    }

    #[test]
    fn an_inverted_or_empty_dm_range_is_refused_by_name() {
        let e = search_config(&["--dm-start", "50", "--dm-end", "10"]).unwrap_err();
        assert!(e.to_string().contains("inverted"), "{e}");
        assert!(e.to_string().contains("--dm-start 10 --dm-end 50"), "{e}");
        let e = search_config(&["--dm-step", "0"]).unwrap_err();
        assert!(e.to_string().contains("--dm-step"), "{e}");
        let ok = search_config(&["--dm-start", "10", "--dm-end", "14", "--dm-step", "2"]).unwrap();
        assert_eq!(ok.dms, vec![10.0, 12.0, 14.0]);
    }
}
