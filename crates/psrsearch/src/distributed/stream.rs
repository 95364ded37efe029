//! Streaming search (the SC99 paper's future work): an ordered DADA stream processed as it
//! arrives by a master and a two-stage pipeline over metampi ranks.
//!
//! - **Master** (world rank 0 of the private communicator): reads the stream's header,
//!   broadcasts band and settings, then cuts the stream into overlap-save blocks as their
//!   last sample arrives and deals them round robin to the stage-1 ranks (at most
//!   [`IN_FLIGHT`] unfinished sends each, so a slow stage holds the stream back instead of
//!   filling memory). Where the search splits channels
//!   ([`PlanConfig::subchannels`](crate::PlanConfig::subchannels)) the
//!   master splits the stream as it arrives ([`SubchannelStream`]) and deals blocks of the
//!   sub-channels. A second thread takes stage 2's acknowledgements: the **lag** of a
//!   block is the time from the arrival of its last input byte to the acknowledgement that
//!   its result is reassembled in order, both on the master's clock.
//! - **Stage 1** (every other rank but one): forward FFT of the block, chirp and inverse FFT
//!   at every trial DM, detection — [`DedispersionPlan::process_block`], the unit of the
//!   distributed search — and the power to stage 2.
//! - **Stage 2** (the lowest other rank on the master's meta host): puts results back in
//!   order, acknowledges each, keeps the series growing, and every `search_every` blocks runs
//!   the periodicity search, sifting and folding on what has arrived so far, on a thread of
//!   its own so that reassembly never waits for it. At the end of the stream it searches the
//!   whole series: the blocks and their assembly are exactly those of
//!   [`search_file`](crate::search::search_file) on the same data, so the final candidates
//!   equal the non-streaming search's bit for bit.

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

use metampi::point_to_point::SendFuture;
use metampi::topology::{Communicator, SimpleCommunicator};
use metampi::traits::*;
use metampi::Rank;
use serde::{Deserialize, Serialize};

use super::codec::{Msg, TAG};
use super::{broadcast_bytes, error_chain, DistError};
use crate::assemble::PowerAssembler;
use crate::band::Band;
use crate::dedisperse::{BlockPower, DedispersionPlan};
use crate::filterbank::{choose_subchannels, Filterbank, SampleStream, SubchannelStream};
use crate::format::stream::{BasebandStream, StreamFormat};
use crate::format::Metadata;
use crate::search::{search_series, split_plan, SearchConfig, SearchError, SearchOutcome};
use crate::voltages::Voltages;

/// Unfinished block sends the master allows per stage-1 rank.
pub const IN_FLIGHT: usize = 3;

/// Settings of a streaming search.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamConfig {
    /// The search itself.
    pub search: SearchConfig,
    /// Run the interim search every this many blocks (0: only at the end).
    pub search_every: u64,
    /// The input's format.
    #[serde(default)]
    pub format: StreamFormat,
    /// Text of the side-car a VDIF stream needs (FREQ, SAMPLE_RATE, ...).
    #[serde(default)]
    pub vdif_sidecar: Option<String>,
    /// Let the master choose the sub-channels per channel from the stream's band and the
    /// largest DM ([`choose_subchannels`]) in place of `search.plan.subchannels`.
    #[serde(default)]
    pub subchannels_auto: bool,
}

/// One block's passage through the pipeline, on the master's clock (s since the first
/// header byte).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockLag {
    /// Block index.
    pub block: u64,
    /// When its last input sample arrived.
    pub arrival_s: f64,
    /// When stage 2 acknowledged it in order.
    pub result_s: f64,
    /// Index (into [`StreamReport::stage1_hosts`]) of the stage-1 rank that processed it.
    #[serde(default)]
    pub stage1: usize,
}

impl BlockLag {
    /// Seconds from arrival to result.
    pub fn lag_s(&self) -> f64 {
        self.result_s - self.arrival_s
    }
}

/// The master's report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamReport {
    /// Every block's lag, in block order.
    pub blocks: Vec<BlockLag>,
    /// Time samples read (per channel).
    pub samples: u64,
    /// Sample rate of the stream, Hz.
    pub sample_rate_hz: f64,
    /// Seconds from the first header byte to the end of the stream.
    pub input_s: f64,
    /// Stage-1 ranks.
    pub stage1_ranks: usize,
    /// Meta host of every stage-1 rank (from the topology API), in dealing order.
    #[serde(default)]
    pub stage1_hosts: Vec<usize>,
    /// What the reader had to repair in the input (VDIF frames lost, late or damaged).
    #[serde(default)]
    pub repairs: Vec<String>,
    /// Sub-channels per channel the master chose for [`StreamConfig::subchannels_auto`].
    #[serde(default)]
    pub subchannels_chosen: Option<usize>,
}

impl StreamReport {
    /// Input rate as a multiple of real time (1: the data came as fast as they were taken).
    pub fn input_real_time_factor(&self) -> f64 {
        self.samples as f64 / self.sample_rate_hz / self.input_s.max(1e-9)
    }

    /// Median lag of up to `n` blocks from the start (`tail` false) or the end.
    pub fn median_lag(&self, n: usize, tail: bool) -> f64 {
        let k = n.min(self.blocks.len());
        let slice = if tail {
            &self.blocks[self.blocks.len() - k..]
        } else {
            &self.blocks[..k]
        };
        let mut v: Vec<f64> = slice.iter().map(BlockLag::lag_s).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
}

/// An interim (or the final) search of the series received so far.
#[derive(Debug)]
pub struct Interim {
    /// Blocks searched (the first `blocks` of the stream).
    pub blocks: u64,
    /// Seconds of data in the series.
    pub data_s: f64,
    /// The search's result.
    pub outcome: SearchOutcome,
}

/// What stage 2 ends with.
#[derive(Debug)]
pub struct StageTwoReport {
    /// The interim searches, in order.
    pub interim: Vec<Interim>,
    /// The search of the whole stream.
    pub last: Interim,
}

/// What a rank of a streaming search ends with.
#[derive(Debug)]
pub enum StreamRole {
    /// The master: block lags.
    Master(StreamReport),
    /// Stage 1: blocks processed.
    StageOne(u64),
    /// Stage 2: the searches.
    StageTwo(Box<StageTwoReport>),
}

/// Set-up broadcast by the master.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Setup {
    band: Band,
    config: StreamConfig,
    /// What the stream's first header says of the observation.
    #[serde(default)]
    metadata: Metadata,
}

/// The ranks' roles: the master is rank 0, stage 2 the lowest other rank on its meta host
/// (or rank 1), stage 1 everyone else.
fn roles(comm: &SimpleCommunicator) -> Result<(Rank, Vec<Rank>), DistError> {
    let size = comm.size();
    if size < 3 {
        return Err(DistError::Layout(format!(
            "a streaming search needs at least 3 ranks (master, stage 1, stage 2), got {size}"
        )));
    }
    let home = comm.meta_host_of(0)?;
    let mut stage2 = 1;
    for r in 1..size {
        if comm.meta_host_of(r)? == home {
            stage2 = r;
            break;
        }
    }
    let stage1 = (1..size).filter(|&r| r != stage2).collect();
    Ok((stage2, stage1))
}

/// Run the streaming search over every rank of `world` (collective). `open_input` runs on
/// the master only and gives the stream and its name; `report` is called on stage 2 after
/// each interim search.
///
/// # Errors
/// Set-up failures (on every rank: a bad header, a bad plan, too few ranks); later failures
/// on the rank that meets them (the others are then aborted by the caller's `abort`).
pub fn stream_search<R: Read>(
    world: &SimpleCommunicator,
    open_input: impl FnOnce() -> std::io::Result<(R, String)>,
    config: &StreamConfig,
    report: &mut dyn FnMut(&Interim),
) -> Result<StreamRole, DistError> {
    let comm = world.duplicate();
    let (stage2, stage1) = roles(&comm)?;
    let me = comm.rank();
    let t0 = Instant::now();
    let mut blob = Vec::new();
    let mut stream = None;
    let mut chosen = None;
    if me == 0 {
        let opened = open_input()
            .map_err(|e| e.to_string())
            .and_then(|(r, name)| {
                BasebandStream::open(r, name, config.format, config.vdif_sidecar.as_deref())
                    .map_err(|e| error_chain(&e))
            })
            .and_then(|s| {
                let mut config = config.clone();
                if config.subchannels_auto {
                    let max_dm = config.search.dms.iter().fold(0.0f64, |m, d| m.max(d.abs()));
                    let n = choose_subchannels(s.band(), max_dm, &config.search.plan);
                    config.search.plan.subchannels = n;
                    config.subchannels_auto = false;
                    chosen = Some(n);
                }
                split_plan(s.band(), &config.search.dms, &config.search.plan)
                    .map_err(|e| e.to_string())?;
                Ok((s, config))
            });
        blob = match opened {
            Ok((s, config)) => {
                let setup = Setup {
                    band: s.band().clone(),
                    config,
                    metadata: s.metadata().clone(),
                };
                stream = Some(s);
                let mut b = vec![1u8];
                b.extend(serde_json::to_vec(&setup).map_err(|e| DistError::Root(e.to_string()))?);
                b
            }
            Err(e) => {
                let mut b = vec![0u8];
                b.extend(e.into_bytes());
                b
            }
        };
    }
    broadcast_bytes(&comm, 0, &mut blob);
    let setup: Setup = match blob.split_first() {
        Some((1, json)) => serde_json::from_slice(json)
            .map_err(|e| DistError::Protocol(format!("set-up message: {e}")))?,
        Some((_, msg)) => return Err(DistError::Root(String::from_utf8_lossy(msg).into())),
        None => return Err(DistError::Protocol("empty set-up message".into())),
    };
    // Where channels are split the master splits the stream as it arrives, and the blocks it
    // deals are the sub-channels', those a file search of the same samples dedisperses.
    let (plan, filterbank) = split_plan(
        &setup.band,
        &setup.config.search.dms,
        &setup.config.search.plan,
    )?;
    if let Some(s) = stream {
        let mut r = master(&comm, s, filterbank, &plan, stage2, &stage1, t0)?;
        r.subchannels_chosen = chosen;
        Ok(StreamRole::Master(r))
    } else if me == stage2 {
        let r = stage_two(
            &comm,
            &plan,
            &setup.config,
            &setup.metadata,
            stage1.len(),
            report,
        )?;
        Ok(StreamRole::StageTwo(Box::new(r)))
    } else {
        Ok(StreamRole::StageOne(stage_one(&comm, &plan, stage2)?))
    }
}

impl<R: Read> SampleStream for BasebandStream<R> {
    fn read_samples(
        &mut self,
        out: &mut Voltages,
        at: usize,
        n: usize,
    ) -> Result<usize, crate::format::ReadError> {
        BasebandStream::read_samples(self, out, at, n)
    }
}

fn send(comm: &SimpleCommunicator, to: Rank, m: &Msg) -> Result<(), DistError> {
    comm.try_process_at_rank(to)?
        .try_send_with_tag(&m.encode()[..], TAG)?;
    Ok(())
}

fn master<R: Read>(
    comm: &SimpleCommunicator,
    mut stream: BasebandStream<R>,
    filterbank: Option<Filterbank>,
    plan: &DedispersionPlan,
    stage2: Rank,
    stage1: &[Rank],
    t0: Instant,
) -> Result<StreamReport, DistError> {
    let keep = plan.fft_len() - plan.step();
    let mut arrivals: Vec<f64> = Vec::new();
    let mut ended = 0.0;
    let acks = std::thread::scope(|s| -> Result<Vec<(u64, f64)>, DistError> {
        // Acknowledgements from stage 2, until it says the stream is done.
        let taker = s.spawn(|| -> Result<Vec<(u64, f64)>, DistError> {
            let from = comm.try_process_at_rank(stage2)?;
            let mut got = Vec::new();
            loop {
                let (bytes, _) = from.try_receive_vec_with_tag::<u8>(Some(TAG))?;
                match Msg::decode(&bytes)? {
                    Msg::Ack { block } => got.push((block, t0.elapsed().as_secs_f64())),
                    Msg::StreamEnd { .. } => return Ok(got),
                    m => return Err(DistError::Protocol(format!("master got {m:?}"))),
                }
            }
        });
        let dealt = match filterbank {
            None => deal(comm, &mut stream, plan, stage1, &mut arrivals, t0, keep),
            Some(fb) => {
                let mut split = SubchannelStream::new(&mut stream, fb);
                deal(comm, &mut split, plan, stage1, &mut arrivals, t0, keep)
            }
        };
        ended = t0.elapsed().as_secs_f64();
        // Whatever happened, tell the stages the stream is over so nobody waits forever.
        let blocks = arrivals.len() as u64;
        let samples = *dealt.as_ref().unwrap_or(&0);
        for &r in stage1.iter().chain([&stage2]) {
            send(comm, r, &Msg::StreamEnd { blocks, samples })?;
        }
        let acks = taker
            .join()
            .map_err(|_| DistError::Protocol("the acknowledgement thread panicked".into()))??;
        dealt?;
        Ok(acks)
    })?;
    let mut blocks: Vec<BlockLag> = arrivals
        .iter()
        .enumerate()
        .map(|(b, &a)| BlockLag {
            block: b as u64,
            arrival_s: a,
            result_s: f64::NAN,
            // `deal` hands block b to stage-1 rank b mod n.
            stage1: b % stage1.len().max(1),
        })
        .collect();
    for (b, t) in acks {
        if let Some(x) = blocks.get_mut(b as usize) {
            x.result_s = t;
        }
    }
    if let Some(x) = blocks.iter().find(|x| x.result_s.is_nan()) {
        return Err(DistError::Protocol(format!(
            "block {} was never acknowledged",
            x.block
        )));
    }
    Ok(StreamReport {
        blocks,
        samples: stream.samples_read(),
        sample_rate_hz: stream.band().sample_rate_hz,
        input_s: ended,
        stage1_ranks: stage1.len(),
        stage1_hosts: stage1
            .iter()
            .map(|&r| comm.meta_host_of(r))
            .collect::<Result<_, _>>()?,
        repairs: stream.repairs(),
        subchannels_chosen: None,
    })
}

/// Cut the stream into blocks as they complete and deal them out; returns the samples per
/// series the stream held (sub-channel samples where it is split).
fn deal(
    comm: &SimpleCommunicator,
    stream: &mut impl SampleStream,
    plan: &DedispersionPlan,
    stage1: &[Rank],
    arrivals: &mut Vec<f64>,
    t0: Instant,
    keep: usize,
) -> Result<u64, DistError> {
    let band = plan.band();
    let n = plan.fft_len();
    let mut block = Voltages::zeros(band.nchan(), band.npol, n);
    let mut sending: Vec<VecDeque<SendFuture<u8>>> =
        (0..stage1.len()).map(|_| VecDeque::new()).collect();
    let mut filled = 0;
    let mut b = 0u64;
    // The block sent last, whose samples a shifted last block may need.
    let mut previous: Option<Voltages> = None;
    let samples = loop {
        let got = stream
            .read_samples(&mut block, filled, n - filled)
            .map_err(SearchError::from)?;
        filled += got;
        let mut end = None;
        if filled < n {
            // The end: one more block for the samples after the last whole one, as a file
            // search of the same samples makes it (see `DedispersionPlan::num_blocks`):
            // shifted back to end with the data, or padded with zeros when the whole
            // stream is shorter than one FFT.
            let samples = b * plan.step() as u64 + filled as u64;
            let whole = plan.with_data_len(samples);
            if whole.num_blocks(samples) <= b {
                break Ok(samples);
            }
            let start = whole.block_start(b);
            let here = b * plan.step() as u64;
            for (k, series) in block.as_mut_slice().chunks_exact_mut(n).enumerate() {
                // Samples before this block's start are in the block sent last, which began
                // one step (n − keep) earlier.
                let before = (here - start) as usize;
                let take = filled.min(n - before);
                series.copy_within(..take, before);
                if let Some(prev) = &previous {
                    let from = (n - keep) - before;
                    series[..before]
                        .copy_from_slice(&prev.as_slice()[k * n..][from..from + before]);
                }
                series[before + take..].fill(Default::default());
            }
            end = Some(samples);
        }
        arrivals.push(t0.elapsed().as_secs_f64());
        let k = (b % stage1.len() as u64) as usize;
        if sending[k].len() >= IN_FLIGHT {
            if let Some(f) = sending[k].pop_front() {
                f.wait()?;
            }
        }
        let bytes = Msg::Data {
            block: b,
            voltages: block.clone(),
        }
        .encode();
        previous = Some(block.clone());
        sending[k].push_back(
            comm.try_process_at_rank(stage1[k])?
                .try_immediate_send_owned(bytes, TAG)?,
        );
        if let Some(samples) = end {
            break Ok(samples);
        }
        // The next block starts `step` samples on: keep the overlap.
        for series in block.as_mut_slice().chunks_exact_mut(n) {
            series.copy_within(n - keep.., 0);
        }
        filled = keep;
        b += 1;
    };
    for q in sending {
        for f in q {
            f.wait()?;
        }
    }
    samples
}

fn stage_one(
    comm: &SimpleCommunicator,
    plan: &DedispersionPlan,
    stage2: Rank,
) -> Result<u64, DistError> {
    let from = comm.try_process_at_rank(0)?;
    let to = comm.try_process_at_rank(stage2)?;
    let mut ws = plan.workspace();
    let mut sending: Option<SendFuture<u8>> = None;
    let mut done = 0;
    let mut pending = from.try_immediate_receive_vec::<u8>(Some(TAG))?;
    loop {
        let (bytes, _) = pending.wait()?;
        let msg = Msg::decode(&bytes)?;
        let Msg::Data { block, voltages } = msg else {
            if let Msg::StreamEnd { .. } = msg {
                break;
            }
            return Err(DistError::Protocol(format!("stage 1 got {msg:?}")));
        };
        // Post the next receive before computing, so the master's send can complete.
        pending = from.try_immediate_receive_vec::<u8>(Some(TAG))?;
        let power = plan.process_block(&mut ws, block, &voltages);
        let out = Msg::Result {
            block,
            power: power.data,
        }
        .encode();
        if let Some(s) = sending.take() {
            s.wait()?;
        }
        sending = Some(to.try_immediate_send_owned(out, TAG)?);
        done += 1;
    }
    if let Some(s) = sending.take() {
        s.wait()?;
    }
    send(
        comm,
        stage2,
        &Msg::SignOff {
            busy_s: 0.0,
            idle_s: 0.0,
            cpu_s: 0.0,
        },
    )?;
    Ok(done)
}

/// Search the first `blocks.len()` blocks as one observation; `samples`: they are the
/// whole stream, which held that many input samples per channel. With `metadata` (the
/// final search), the outcome records it and folds the top candidates for their plots.
fn search_prefix(
    plan: &DedispersionPlan,
    blocks: &[Arc<BlockPower>],
    config: &SearchConfig,
    samples: Option<u64>,
    metadata: Option<&Metadata>,
) -> Result<Interim, SearchError> {
    let n = blocks.len() as u64;
    let mut asm = match samples {
        Some(samples) => PowerAssembler::for_input(plan, samples),
        None => PowerAssembler::new(plan, n),
    };
    for b in blocks {
        asm.insert(b)?;
    }
    let mut series = asm.finish()?;
    let masked = crate::search::clean_series(&mut series, config);
    let data_s = series[0].data.len() as f64 * series[0].tsamp_s;
    let mut outcome = search_series(&series, config);
    outcome.masked = masked;
    if let Some(m) = metadata {
        outcome.describe(&series, Some(&asm), plan.band(), m, config);
    }
    outcome.complex_samples = match samples {
        Some(samples) => plan.complex_samples(samples),
        None => n * plan.complex_samples(plan.fft_len() as u64),
    };
    Ok(Interim {
        blocks: n,
        data_s,
        outcome,
    })
}

fn stage_two(
    comm: &SimpleCommunicator,
    plan: &DedispersionPlan,
    config: &StreamConfig,
    metadata: &Metadata,
    nstage1: usize,
    report: &mut dyn FnMut(&Interim),
) -> Result<StageTwoReport, DistError> {
    let mut waiting: BTreeMap<u64, Arc<BlockPower>> = BTreeMap::new();
    let mut ordered: Vec<Arc<BlockPower>> = Vec::new();
    let mut signed_off = 0;
    let mut total: Option<u64> = None;
    let mut input_samples = 0;
    let mut interim = Vec::new();
    let search = &config.search;
    std::thread::scope(|s| -> Result<(), DistError> {
        let mut running: Option<std::thread::ScopedJoinHandle<'_, Result<Interim, SearchError>>> =
            None;
        let mut last_searched = 0u64;
        let mut collect = |h: std::thread::ScopedJoinHandle<'_, Result<Interim, SearchError>>,
                           interim: &mut Vec<Interim>|
         -> Result<(), DistError> {
            match h.join() {
                Ok(Ok(i)) => {
                    report(&i);
                    interim.push(i);
                }
                // Too little data yet for the DM range: not an error mid-stream.
                Ok(Err(SearchError::Assemble(_))) => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => return Err(DistError::Protocol("an interim search panicked".into())),
            }
            Ok(())
        };
        while signed_off < nstage1 || total.is_none_or(|t| (ordered.len() as u64) < t) {
            let (bytes, st) = comm
                .any_process()
                .try_receive_vec_with_tag::<u8>(Some(TAG))?;
            match Msg::decode(&bytes)? {
                Msg::Result { block, power } => {
                    waiting.insert(block, Arc::new(BlockPower { block, data: power }));
                }
                Msg::SignOff { .. } => signed_off += 1,
                Msg::StreamEnd { blocks, samples } if st.source_rank() == 0 => {
                    total = Some(blocks);
                    input_samples = samples;
                }
                m => return Err(DistError::Protocol(format!("stage 2 got {m:?}"))),
            }
            while let Some(next) = waiting.remove(&(ordered.len() as u64)) {
                let b = next.block;
                ordered.push(next);
                send(comm, 0, &Msg::Ack { block: b })?;
            }
            let due = config.search_every > 0
                && ordered.len() as u64 >= last_searched + config.search_every;
            if due && running.as_ref().is_none_or(|h| h.is_finished()) {
                if let Some(h) = running.take() {
                    collect(h, &mut interim)?;
                }
                let snapshot = ordered.clone();
                last_searched = snapshot.len() as u64;
                running = Some(s.spawn(move || search_prefix(plan, &snapshot, search, None, None)));
            }
        }
        if let Some(h) = running.take() {
            collect(h, &mut interim)?;
        }
        Ok(())
    })?;
    send(
        comm,
        0,
        &Msg::StreamEnd {
            blocks: ordered.len() as u64,
            samples: input_samples,
        },
    )?;
    if ordered.is_empty() {
        return Err(SearchError::too_short(plan, input_samples).into());
    }
    // The whole stream, its last block cut where the data ended, as a file search of the
    // same samples does.
    let whole_plan = plan.with_data_len(input_samples);
    let whole =
        (whole_plan.num_blocks(input_samples) == ordered.len() as u64).then_some(input_samples);
    let last = search_prefix(&whole_plan, &ordered, search, whole, Some(metadata))?;
    Ok(StageTwoReport { interim, last })
}
