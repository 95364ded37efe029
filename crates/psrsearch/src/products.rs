//! Single-DM dedispersion of a whole file and writing its products in every format.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::assemble::{DmSeries, PowerAssembler, VoltageAssembler};
use crate::dedisperse::{BlockPower, DedispersionPlan, PlanConfig};
use crate::format::presto::{write_dat_inf, InfFile};
use crate::format::sigproc::{write_fil, write_tim, SigprocHeader};
use crate::format::{npy, BasebandReader, Metadata};
use crate::search::SearchError;
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

/// Dedisperse all of `reader` at `dm`.
///
/// # Errors
/// Plan, read and assembly errors.
pub fn dedisperse_file(
    reader: &mut BasebandReader,
    dm: f64,
    config: &PlanConfig,
    keep_voltages: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Dedispersed, SearchError> {
    let nsamples = reader.nsamples();
    let plan = DedispersionPlan::new(reader.band(), &[dm], &config.clone().data_len(nsamples))?;
    let nblocks = plan.num_blocks(nsamples);
    if nblocks == 0 {
        return Err(SearchError::too_short(&plan, nsamples));
    }
    let band = plan.band().clone();
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
        metadata: reader.metadata().clone(),
    })
}

impl Dedispersed {
    /// MJD of the first output sample, if the input had a start time.
    pub fn start_mjd(&self) -> f64 {
        let offset = self.series.start_sample as f64 * self.plan.band().tsamp_s();
        self.metadata.start_mjd.unwrap_or(0.0) + offset / 86400.0
    }

    fn sigproc_header(&self) -> SigprocHeader {
        SigprocHeader::time_series(
            &self.metadata.source,
            self.start_mjd(),
            self.series.tsamp_s,
            self.plan.reference_mhz(),
            self.series.dm,
        )
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
        let band = self.plan.band();
        let inf = InfFile {
            name: String::new(),
            telescope: self.metadata.telescope.clone(),
            instrument: "psrsearch".into(),
            object: self.metadata.source.clone(),
            ra: "00:00:00.0000".into(),
            dec: "00:00:00.0000".into(),
            observer: "unknown".into(),
            epoch_mjd: self.start_mjd(),
            barycentred: false,
            n: self.series.data.len() as u64,
            dt: self.series.tsamp_s,
            beam_diameter_arcsec: 0.0,
            dm: self.series.dm,
            low_channel_mhz: band.lowest_mhz() + band.channel_bandwidth_mhz() / 2.0,
            total_bw_mhz: band.highest_mhz() - band.lowest_mhz(),
            nchan: band.nchan() as u32,
            chan_bw_mhz: band.channel_bandwidth_mhz(),
            analyzer: "psrsearch".into(),
            notes: format!(
                "Coherently dedispersed at DM {} with reference frequency {} MHz",
                self.series.dm,
                self.plan.reference_mhz()
            ),
        };
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
