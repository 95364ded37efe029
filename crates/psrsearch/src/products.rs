//! Single-DM dedispersion of a whole file and writing its products in every format, and
//! writing what a search found ([`write_search`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::assemble::{DmSeries, PowerAssembler, VoltageAssembler};
use crate::dedisperse::{BlockPower, DedispersionPlan, PlanConfig};
use crate::filterbank::{self, FilterbankError, SubchannelReader};
use crate::format::accel::{self, AccelCandidate};
use crate::format::candidates;
use crate::format::presto::{write_dat_inf, InfFile};
use crate::format::sigproc::{telescope_id, write_fil, write_tim, SigprocHeader};
use crate::format::{npy, BasebandReader, Metadata};
use crate::plot::PlotError;
use crate::search::{BlockSource, SearchError, SearchOutcome};
use crate::voltages::Voltages;

/// What dedispersing a file at one DM gives.
#[derive(Clone, Debug)]
pub struct Dedispersed {
    /// The plan used.
    pub plan: DedispersionPlan,
    /// Detected, polarisation- and channel-summed, downsampled series.
    pub series: DmSeries,
    /// The same per channel (aligned), `[chan][time]`.
    pub filterbank: Vec<Vec<f32>>,
    /// Complex voltages, aligned, with the input sample they start at (if asked for).
    pub voltages: Option<(i64, Voltages)>,
    /// Metadata of the input.
    pub metadata: Metadata,
}

/// Dedisperse all of `reader` at `dm`. With [`PlanConfig::subchannels`] above 1 the
/// channels are first split by a [`Filterbank`](crate::Filterbank): the plan, series and
/// filterbank products are then the sub-channels' (detected products only).
///
/// # Errors
/// Plan, filterbank, read and assembly errors; voltages asked for with sub-channels.
pub fn dedisperse_file(
    reader: &mut BasebandReader,
    dm: f64,
    config: &PlanConfig,
    keep_voltages: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Dedispersed, SearchError> {
    let config = config.clone().data_len(reader.nsamples());
    let metadata = reader.metadata().clone();
    match filterbank::for_plan(reader.band(), &config)? {
        None => {
            let plan = DedispersionPlan::new(reader.band(), &[dm], &config)?;
            dedisperse_source(reader, plan, keep_voltages, metadata, progress)
        }
        Some(_) if keep_voltages => Err(FilterbankError::Unsupported(
            "dedispersed voltages (--voltages): only detected products are made from sub-channels",
        )
        .into()),
        Some(fb) => {
            let plan = DedispersionPlan::new(fb.band(), &[dm], &fb.plan_config(&config)?)?;
            let mut source = SubchannelReader::new(reader, fb);
            dedisperse_source(&mut source, plan, false, metadata, progress)
        }
    }
}

fn dedisperse_source(
    reader: &mut impl BlockSource,
    plan: DedispersionPlan,
    keep_voltages: bool,
    metadata: Metadata,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Dedispersed, SearchError> {
    let nsamples = reader.nsamples();
    let nblocks = plan.num_blocks(nsamples);
    if nblocks == 0 {
        return Err(SearchError::too_short(&plan, nsamples));
    }
    let band = plan.band().clone();
    plan.check_series_memory(nsamples)?;
    let mut asm = PowerAssembler::for_input(&plan, nsamples);
    let mut vasm = keep_voltages.then(|| VoltageAssembler::for_input(&plan, 0, nsamples));
    let mut ws = plan.workspace();
    let mut block = Voltages::zeros(band.nchan(), band.npol, plan.fft_len());
    let mut out = Voltages::zeros(band.nchan(), band.npol, plan.step());
    let mut power = BlockPower {
        block: 0,
        data: vec![0.0; band.nchan() * plan.samples_per_block()],
    };
    for b in 0..nblocks {
        reader.read_padded_into(plan.block_start(b), &mut block)?;
        // One forward transform serves both products.
        plan.forward(&mut ws, &block);
        power.block = b;
        plan.detect(&mut ws, 0, &mut power.data);
        asm.insert(&power)?;
        if let Some(v) = vasm.as_mut() {
            plan.voltages(&mut ws, 0, &mut out);
            v.insert(b, &out);
        }
        progress(b + 1, nblocks);
    }
    let voltages = vasm.map(VoltageAssembler::finish).transpose()?;
    let (mut series, filterbank) = asm.filterbank(0)?;
    series.data = vec![0.0; filterbank[0].len()];
    for chan in &filterbank {
        for (s, v) in series.data.iter_mut().zip(chan) {
            *s += v;
        }
    }
    Ok(Dedispersed {
        plan,
        series,
        filterbank,
        voltages,
        metadata,
    })
}

impl Dedispersed {
    /// MJD of the first output sample, if the input had a start time.
    pub fn start_mjd(&self) -> f64 {
        let offset = self.series.start_sample as f64 * self.plan.band().tsamp_s();
        self.metadata.start_mjd.unwrap_or(0.0) + offset / 86400.0
    }

    fn sigproc_header(&self) -> SigprocHeader {
        let mut h = SigprocHeader::time_series(
            &self.metadata.source,
            self.start_mjd(),
            self.series.tsamp_s,
            self.plan.reference_mhz(),
            self.series.dm,
        );
        h.telescope_id = telescope_id(&self.metadata.telescope);
        h.position = self.metadata.position;
        h
    }

    /// Write a SIGPROC `.tim`.
    ///
    /// # Errors
    /// I/O errors.
    pub fn write_tim(&self, path: &Path) -> std::io::Result<()> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
        write_tim(&mut w, &self.sigproc_header(), &self.series.data)?;
        w.flush()
    }

    /// Write a SIGPROC `.fil` of the aligned channels (channel 0 first, as in the input).
    ///
    /// # Errors
    /// I/O errors.
    pub fn write_fil(&self, path: &Path) -> std::io::Result<()> {
        let band = self.plan.band();
        let mut h = self.sigproc_header();
        h.nchans = band.nchan() as i32;
        h.fch1_mhz = band.centre_mhz[0];
        h.foff_mhz = if band.nchan() > 1 {
            band.centre_mhz[1] - band.centre_mhz[0]
        } else {
            band.channel_bandwidth_mhz() * band.sideband.sign()
        };
        let n = self.filterbank[0].len();
        let mut data = Vec::with_capacity(n * band.nchan());
        for t in 0..n {
            data.extend(self.filterbank.iter().map(|c| c[t]));
        }
        let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
        write_fil(&mut w, &h, &data)?;
        w.flush()
    }

    /// Write PRESTO `base.dat` + `base.inf`.
    ///
    /// # Errors
    /// I/O errors.
    pub fn write_presto(&self, base: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        let inf = InfFile::for_series(
            &self.metadata,
            Some(self.plan.band()),
            self.series.data.len() as u64,
            self.series.tsamp_s,
            self.series.dm,
            self.start_mjd(),
            format!(
                "Coherently dedispersed at DM {} with reference frequency {} MHz",
                self.series.dm,
                self.plan.reference_mhz()
            ),
        );
        write_dat_inf(base, &inf, &self.series.data)
    }

    /// Write the time series as `.npy` (`<f4`, one dimension).
    ///
    /// # Errors
    /// I/O errors.
    pub fn write_series_npy(&self, path: &Path) -> std::io::Result<()> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
        npy::write_f32(&mut w, &[self.series.data.len()], &self.series.data)?;
        w.flush()
    }

    /// Write the dedispersed voltages as `.npy` (`<c8`, shape `(nchan, npol, nsamp)`).
    ///
    /// # Errors
    /// I/O errors, or if voltages were not kept.
    pub fn write_voltages_npy(&self, path: &Path) -> std::io::Result<()> {
        let Some((_, v)) = &self.voltages else {
            return Err(std::io::Error::other("voltages were not kept"));
        };
        let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
        npy::write_c64(&mut w, &[v.nchan(), v.npol(), v.nsamp()], v.as_slice())?;
        w.flush()
    }
}

/// A search's results could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// Creating or writing a file.
    #[error("cannot write {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Drawing a plot.
    #[error(transparent)]
    Plot(#[from] PlotError),
}

/// The name ACCEL files of a search start with (`candidates_DM26.80_ACCEL_0`).
pub const ACCEL_BASE: &str = "candidates";

/// Write what a search found into `dir` (created if needed): `candidates.csv` and
/// `candidates.json` (the observation's metadata, then the ranked candidates), one
/// PRESTO ACCEL file per DM the candidates were found at (ACCEL files of an earlier
/// search there are removed first, so that sifting does not mix the two),
/// `single_pulses.csv` where the search looked for single pulses, and with `plots` the
/// PNGs ([`crate::plot::plot_outcome`]). Returns the files written.
///
/// # Errors
/// Files that cannot be written, plots that cannot be drawn.
pub fn write_search(
    outcome: &SearchOutcome,
    dir: &Path,
    plots: bool,
) -> Result<Vec<PathBuf>, WriteError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let table: Vec<_> = outcome
        .candidates
        .iter()
        .map(|c| c.candidate.clone())
        .collect();
    let mut written = Vec::new();
    let csv = dir.join("candidates.csv");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&csv).map_err(io(&csv))?);
    candidates::write_csv(&mut w, &outcome.metadata, &table)
        .and_then(|()| w.flush())
        .map_err(io(&csv))?;
    written.push(csv);
    let json = dir.join("candidates.json");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&json).map_err(io(&json))?);
    candidates::write_json(&mut w, &outcome.metadata, &table)
        .and_then(|()| w.flush())
        .map_err(io(&json))?;
    written.push(json);
    written.extend(write_accel_files(outcome, dir)?);
    if let Some(events) = &outcome.single_pulses {
        let path = dir.join("single_pulses.csv");
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path).map_err(io(&path))?);
        crate::single_pulse::write_csv(&mut w, &outcome.metadata, events)
            .and_then(|()| w.flush())
            .map_err(io(&path))?;
        written.push(path);
    }
    if plots {
        written.extend(crate::plot::plot_outcome(outcome, dir)?);
    }
    Ok(written)
}

/// One ACCEL file per DM with candidates, each holding those found at that DM.
fn write_accel_files(outcome: &SearchOutcome, dir: &Path) -> Result<Vec<PathBuf>, WriteError> {
    let stale = format!("{ACCEL_BASE}_DM");
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&stale) && name.contains("_ACCEL_") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let tobs = outcome.nsamples as f64 * outcome.tsamp_s;
    let mut dms: Vec<f64> = outcome.candidates.iter().map(|c| c.candidate.dm).collect();
    dms.sort_by(f64::total_cmp);
    dms.dedup();
    let mut written = Vec::new();
    for dm in dms {
        let name = accel::file_name(ACCEL_BASE, dm, outcome.zmax);
        let cands: Vec<AccelCandidate> = outcome
            .candidates
            .iter()
            .filter(|c| c.candidate.dm == dm)
            .map(|d| {
                let c = &d.candidate;
                let summed: f64 = d.harmonic_powers.iter().sum();
                AccelCandidate {
                    number: c.rank,
                    sigma: c.sigma,
                    summed_power: summed,
                    coherent_power: summed,
                    nharm: d.harmonic_powers.len(),
                    period_s: c.period_s,
                    freq_hz: c.freq_hz,
                    r: c.freq_hz * tobs,
                    fdot_hz_s: c.fdot_hz_s,
                    z: c.fdot_hz_s * tobs * tobs,
                    accel_ms2: c.accel_ms2,
                    note: c.flag.clone(),
                    harmonic_powers: d.harmonic_powers.clone(),
                    harmonic_props: d.harmonic_props.clone(),
                }
            })
            .collect();
        let mut inf = InfFile::for_series(
            &outcome.metadata,
            outcome.band.as_ref(),
            outcome.nsamples as u64,
            outcome.tsamp_s,
            dm,
            outcome.series_start_mjd().unwrap_or(0.0),
            format!("psrsearch candidates at DM {dm}"),
        );
        inf.name = name
            .rsplit_once("_ACCEL")
            .map_or(name.as_str(), |(base, _)| base)
            .to_string();
        let path = dir.join(&name);
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path).map_err(|source| {
            WriteError::Io {
                path: path.clone(),
                source,
            }
        })?);
        accel::write_accel(&mut w, &cands, &inf)
            .and_then(|()| w.flush())
            .map_err(|source| WriteError::Io {
                path: path.clone(),
                source,
            })?;
        written.push(path);
    }
    Ok(written)
}
