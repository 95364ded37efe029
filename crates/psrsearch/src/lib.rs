//! `psrsearch`: phase-coherent dedispersion and periodicity search of baseband data, after
//! the Jodrell Bank search that ran on an intercontinental metacomputer at SC99.
//!
//! Pipeline and key types:
//! - [`BasebandReader`] reads PSRDADA and GUPPI RAW files (8-bit or float, one or two
//!   polarisations, any number of channels, either sideband) into [`Voltages`] blocks;
//! - [`DedispersionPlan`] holds FFT plans and chirps for a set of trial DMs; each block is
//!   forward-transformed once and inverse-transformed once per DM (overlap-save), then
//!   detected and downsampled ([`DedispersionPlan::process_block`]);
//! - [`Filterbank`] first splits wide channels into sub-channels where asked
//!   ([`PlanConfig::subchannels`], dspsr's `-F`), so that every DM uses short FFTs;
//! - [`PowerAssembler`] aligns channels and gives one [`DmSeries`] per DM;
//! - [`PeriodicityPlan`] whitens, harmonic-sums and scores each series;
//!   [`rank_candidates`](search::rank_candidates) sifts, folds and ranks;
//! - [`simulate`](simulate::simulate) makes test data with injected pulsars;
//! - [`format`](mod@format) writes SIGPROC, PRESTO, `.npy`, candidate tables and ACCEL files,
//!   each carrying the observation's [`Metadata`] (source, position, telescope, start);
//!   [`diagnostics`] folds the top candidates as prepfold does and [`plot`] draws PNGs;
//! - [`distributed::search_distributed`] runs the same search over a metampi job spanning
//!   several meta hosts (servers on the data host, clients everywhere, the SC99 static
//!   [`balance`], request/reply or scheduled service); [`metajob`] starts such a job.
//! - [`distributed::stream::stream_search`] searches an ordered DADA stream
//!   ([`format::stream::DadaStream`]) as it arrives: a master and a two-stage pipeline of
//!   ranks, with the lag from block arrival to result.
//!
//! Plans are `Send + Sync` and blocks are independent, so work can be split by DM and by
//! data chunk without changing a single bit of the result.
//!
//! ```
//! use psrsearch::{simulate::{simulate, Pulsar, SimConfig}, DedispersionPlan, PlanConfig,
//!                 PowerAssembler};
//! let obs = SimConfig { nchan: 2, npol: 1, bandwidth_mhz: 2.0, nsamples: 1 << 16,
//!                       pulsars: vec![Pulsar { period_s: 0.01, dm: 5.0, duty_cycle: 0.05,
//!                                              amplitude: 1.0, orbit: None }],
//!                       ..SimConfig::default() };
//! let (band, data) = simulate(&obs)?;
//! let plan = DedispersionPlan::new(&band, &[0.0, 5.0], &PlanConfig::default().downsample(16))?;
//! let nsamples = obs.nsamples as u64;
//! let mut assembler = PowerAssembler::for_input(&plan, nsamples);
//! let mut ws = plan.workspace();
//! let mut block = psrsearch::Voltages::zeros(2, 1, plan.fft_len());
//! for b in 0..plan.num_blocks(nsamples) {
//!     // The last block reaches past the end of the data: zeros fill it.
//!     block.fill_window(&data, plan.block_start(b) as usize);
//!     assembler.insert(&plan.process_block(&mut ws, b, &block))?;
//! }
//! let series = assembler.finish()?;
//! assert_eq!(series.len(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod accel;
pub mod assemble;
pub mod balance;
pub mod band;
pub mod chirp;
pub mod dedisperse;
pub mod demo;
pub mod diagnostics;
pub mod distributed;
pub mod dm;
pub mod filterbank;
pub mod fold;
pub mod format;
pub mod fourier_props;
pub mod metajob;
pub mod periodicity;
pub mod plot;
pub mod products;
pub mod rfi;
pub mod search;
pub mod sift;
pub mod simulate;
pub mod single_pulse;
pub mod stats;
mod voltages;

pub use assemble::{AssembleError, DmSeries, PowerAssembler, VoltageAssembler};
pub use band::{Band, Sideband};
pub use dedisperse::{BlockPower, DedispersionPlan, PlanConfig, PlanError, Workspace};
pub use dm::{Dispersion, DEFAULT_DISPERSION_CONSTANT};
pub use filterbank::{Filterbank, FilterbankConfig, FilterbankError};
pub use format::{BasebandFormat, BasebandReader, HeaderError, Metadata, ReadError};
pub use periodicity::{PeriodicityConfig, PeriodicityPlan, SpectralCandidate};
pub use search::{
    search_file, Candidate, CandidateDetail, SearchConfig, SearchError, SearchOutcome,
};
pub use voltages::Voltages;
