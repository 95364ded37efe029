//! Server and client loops, the link probe, and the periodicity stage.
//!
//! A failure in the middle of the service cannot be reported to peers that are blocked in a
//! receive, so the rank that meets it prints the error and aborts the job (`MPI_Abort`);
//! failures before the service starts are returned on every rank.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{mpsc, Mutex};
use std::time::Instant;

use metampi::point_to_point::SendFuture;
use metampi::topology::{Communicator, SimpleCommunicator};
use metampi::traits::*;
use metampi::Rank;

use super::codec::{Msg, TAG};
use super::{DistError, Progress, Roles, Served, ServiceMode};
use crate::assemble::DmSeries;
use crate::dedisperse::{BlockPower, DedispersionPlan};
use crate::format::BasebandReader;
use crate::periodicity::{PeriodicityPlan, SpectralCandidate};
use crate::search::{periodicity_plan, SearchConfig, SearchError};
use crate::voltages::Voltages;

/// What a server knows about the job.
pub(crate) struct ServerJob<'a> {
    pub roles: &'a Roles,
    pub assignment: &'a [Vec<u64>],
    pub file: &'a Path,
    pub plan: &'a DedispersionPlan,
    pub mode: ServiceMode,
    pub t0: Instant,
    /// Meta host names, in `roles.site_list` order.
    pub names: &'a [String],
}

/// How one client's run went.
#[derive(Clone, Debug)]
pub(crate) struct ClientStats {
    pub rank: Rank,
    /// When its server had its last result and its sign-off, s after the service started.
    pub finish_s: f64,
    pub busy_s: f64,
    pub idle_s: f64,
}

fn recv(p: &impl Source) -> Result<(Msg, Rank), DistError> {
    let (bytes, st) = p.try_receive_vec_with_tag::<u8>(Some(TAG))?;
    Ok((Msg::decode(&bytes)?, st.source_rank()))
}

fn send(comm: &SimpleCommunicator, to: Rank, m: &Msg) -> Result<(), DistError> {
    comm.try_process_at_rank(to)?
        .try_send_with_tag(&m.encode()[..], TAG)?;
    Ok(())
}

/// Print and abort: the peers of a broken service are blocked in receives.
fn fatal(comm: &SimpleCommunicator, what: &str, e: &DistError) -> ! {
    eprintln!(
        "psrsearch: rank {}: {what}: {e}; aborting the job",
        comm.rank()
    );
    comm.abort(3)
}

/// Units a client has asked for (or has receives posted for) beyond the one it computes.
const PREFETCH: usize = 3;

/// A client: receive each unit (asking for it first in request/reply mode), dedisperse it at
/// every DM, send the power back. The next unit is asked for, and its receive posted, before
/// the current one is processed, so transfer and computation overlap.
///
/// # Errors
/// Communication failures and malformed messages.
pub(crate) fn client(
    comm: &SimpleCommunicator,
    plan: &DedispersionPlan,
    server: Rank,
    units: &[u64],
    mode: ServiceMode,
) -> Result<(), DistError> {
    let to_server = comm.try_process_at_rank(server)?;
    let (mut busy, mut idle) = (0.0, 0.0);
    let mut ws = plan.workspace();
    let ask = |block: u64| -> Result<(), DistError> {
        if mode == ServiceMode::RequestReply {
            send(comm, server, &Msg::Request { block })?;
        }
        Ok(())
    };
    // Receives posted ahead (and, in request/reply mode, requests sent ahead): with several
    // units in flight the rendezvous handshakes of a long link overlap.
    let mut pending = VecDeque::new();
    let mut next = 0;
    let mut post_more = |pending: &mut VecDeque<_>| -> Result<(), DistError> {
        while next < units.len() && pending.len() < PREFETCH {
            ask(units[next])?;
            pending.push_back(to_server.try_immediate_receive_vec::<u8>(Some(TAG))?);
            next += 1;
        }
        Ok(())
    };
    post_more(&mut pending)?;
    let mut sending: Option<SendFuture<u8>> = None;
    for &expect in units {
        let t = Instant::now();
        let Some(recv) = pending.pop_front() else {
            return Err(DistError::Protocol("no receive posted for a unit".into()));
        };
        let (bytes, _) = recv.wait()?;
        idle += t.elapsed().as_secs_f64();
        post_more(&mut pending)?;
        let (block, voltages) = match Msg::decode(&bytes)? {
            Msg::Data { block, voltages } if block == expect => (block, voltages),
            Msg::Data { block, .. } => {
                return Err(DistError::Protocol(format!(
                    "expected unit {expect} from server {server}, got unit {block}"
                )))
            }
            m => {
                return Err(DistError::Protocol(format!(
                    "expected unit {expect} from server {server}, got {m:?}"
                )))
            }
        };
        let t = Instant::now();
        let power = plan.process_block(&mut ws, block, &voltages);
        busy += t.elapsed().as_secs_f64();
        let out = Msg::Result {
            block,
            power: power.data,
        }
        .encode();
        if let Some(s) = sending.take() {
            s.wait()?;
        }
        sending = Some(to_server.try_immediate_send_owned(out, TAG)?);
    }
    if let Some(s) = sending.take() {
        s.wait()?;
    }
    send(
        comm,
        server,
        &Msg::SignOff {
            busy_s: busy,
            idle_s: idle,
        },
    )
}

/// A server: per client, one thread that serves it (request/reply: answers its requests and
/// takes its results; scheduled: pushes its units, with a second thread taking its results),
/// so a slow link or a long handshake with one client holds up no other. The calling thread
/// gathers results and statistics; the root server also takes what the others forward.
///
/// # Errors
/// Failures before the service starts; later ones abort the job.
pub(crate) fn server(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Served, DistError> {
    let me = comm.rank();
    let roles = job.roles;
    let root = roles.root();
    let is_root = me == root;
    let mine: Vec<Rank> = (0..comm.size())
        .filter(|&r| roles.server_of[r as usize] == Some(me))
        .collect();
    let reader = Mutex::new(BasebandReader::open(job.file).map_err(SearchError::from)?);
    let (tx, rx) = mpsc::channel::<Event>();
    std::thread::scope(|sc| {
        for &c in &mine {
            let tx = tx.clone();
            let reader = &reader;
            match job.mode {
                ServiceMode::RequestReply => {
                    sc.spawn(move || {
                        if let Err(e) = serve_requests(comm, job, reader, c, &tx) {
                            fatal(comm, "serving a client", &e);
                        }
                    });
                }
                ServiceMode::Scheduled => {
                    sc.spawn(move || {
                        if let Err(e) = push_units(comm, job, reader, c) {
                            fatal(comm, "serving a client", &e);
                        }
                    });
                    sc.spawn(move || {
                        if let Err(e) = take_results(comm, job, c, &tx) {
                            fatal(comm, "receiving from a client", &e);
                        }
                    });
                }
            }
        }
        if is_root {
            for &s in roles.servers.iter().filter(|&&s| s != me) {
                let tx = tx.clone();
                sc.spawn(move || {
                    if let Err(e) = take_forwarded(comm, s, &tx) {
                        fatal(comm, "receiving from a server", &e);
                    }
                });
            }
        }
        drop(tx);
        match collect(comm, job, rx, progress) {
            Ok(s) => Ok(s),
            Err(e) => fatal(comm, "collecting results", &e),
        }
    })
}

/// What the serving threads tell the collecting one.
enum Event {
    Result(Vec<u8>, BlockPower),
    Done(ClientStats),
}

/// Scheduled service: send the client's units in order, at most [`PREFETCH`] in flight (a
/// send completes when the client has taken the unit, so this also bounds its buffers).
fn push_units(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    reader: &Mutex<BasebandReader>,
    client: Rank,
) -> Result<(), DistError> {
    let mut in_flight = VecDeque::new();
    for &b in &job.assignment[client as usize] {
        if in_flight.len() >= PREFETCH {
            if let Some(s) = in_flight.pop_front() {
                let s: SendFuture<u8> = s;
                s.wait()?;
            }
        }
        in_flight.push_back(start_unit(comm, job, reader, client, b)?);
    }
    for s in in_flight {
        s.wait()?;
    }
    Ok(())
}

/// Read unit `b` and start sending it to `client`.
fn start_unit(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    reader: &Mutex<BasebandReader>,
    client: Rank,
    b: u64,
) -> Result<SendFuture<u8>, DistError> {
    let band = job.plan.band();
    let mut block = Voltages::zeros(band.nchan(), band.npol, job.plan.fft_len());
    reader
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .read_into(job.plan.block_start(b), &mut block)
        .map_err(SearchError::from)?;
    let bytes = Msg::Data {
        block: b,
        voltages: block,
    }
    .encode();
    Ok(comm
        .try_process_at_rank(client)?
        .try_immediate_send_owned(bytes, TAG)?)
}

/// Request/reply: answer each request with its unit, pass results on, until the sign-off.
fn serve_requests(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    reader: &Mutex<BasebandReader>,
    client: Rank,
    tx: &mpsc::Sender<Event>,
) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(client)?;
    let units = &job.assignment[client as usize];
    let mut in_flight: VecDeque<SendFuture<u8>> = VecDeque::new();
    loop {
        let (bytes, _) = p.try_receive_vec_with_tag::<u8>(Some(TAG))?;
        match Msg::decode(&bytes)? {
            Msg::Request { block } if units.contains(&block) => {
                // The client asks at most PREFETCH ahead; finished sends are dropped here.
                while in_flight.len() >= PREFETCH {
                    if let Some(s) = in_flight.pop_front() {
                        s.wait()?;
                    }
                }
                in_flight.push_back(start_unit(comm, job, reader, client, block)?);
            }
            m => {
                if pass_on(job, client, bytes, m, tx)? {
                    for s in in_flight {
                        s.wait()?;
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// Scheduled service: the client's results and sign-off.
fn take_results(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    client: Rank,
    tx: &mpsc::Sender<Event>,
) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(client)?;
    loop {
        let (bytes, _) = p.try_receive_vec_with_tag::<u8>(Some(TAG))?;
        let m = Msg::decode(&bytes)?;
        if pass_on(job, client, bytes, m, tx)? {
            return Ok(());
        }
    }
}

/// Hand a result or sign-off to the collector; `true` after the sign-off.
fn pass_on(
    job: &ServerJob<'_>,
    client: Rank,
    bytes: Vec<u8>,
    m: Msg,
    tx: &mpsc::Sender<Event>,
) -> Result<bool, DistError> {
    let gone = || DistError::Protocol("the collecting thread has stopped".into());
    match m {
        Msg::Result { block, power } if job.assignment[client as usize].contains(&block) => {
            tx.send(Event::Result(bytes, BlockPower { block, data: power }))
                .map_err(|_| gone())?;
            Ok(false)
        }
        Msg::SignOff { busy_s, idle_s } => {
            tx.send(Event::Done(ClientStats {
                rank: client,
                finish_s: job.t0.elapsed().as_secs_f64(),
                busy_s,
                idle_s,
            }))
            .map_err(|_| gone())?;
            Ok(true)
        }
        m => Err(DistError::Protocol(format!(
            "rank {client} sent {} in {} mode",
            describe(&m),
            job.mode
        ))),
    }
}

/// Root: results another server forwards, then its clients' statistics.
fn take_forwarded(
    comm: &SimpleCommunicator,
    server: Rank,
    tx: &mpsc::Sender<Event>,
) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(server)?;
    let gone = || DistError::Protocol("the collecting thread has stopped".into());
    loop {
        let (bytes, _) = p.try_receive_vec_with_tag::<u8>(Some(TAG))?;
        match Msg::decode(&bytes)? {
            Msg::Result { block, power } => tx
                .send(Event::Result(Vec::new(), BlockPower { block, data: power }))
                .map_err(|_| gone())?,
            Msg::ServerDone { clients } => {
                for (r, f, b, i) in clients {
                    tx.send(Event::Done(ClientStats {
                        rank: r as Rank,
                        finish_s: f,
                        busy_s: b,
                        idle_s: i,
                    }))
                    .map_err(|_| gone())?;
                }
                return Ok(());
            }
            m => {
                return Err(DistError::Protocol(format!(
                    "server {server} forwarded {}",
                    describe(&m)
                )))
            }
        }
    }
}

/// Gather what the serving threads pass on until they have all finished; a non-root server
/// forwards results to the root as they come and its statistics at the end.
fn collect(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    rx: mpsc::Receiver<Event>,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Served, DistError> {
    let roles = job.roles;
    let root = roles.root();
    let is_root = comm.rank() == root;
    // Which host each block belongs to, for the progress display.
    let nblocks: usize = job.assignment.iter().map(Vec::len).sum();
    let mut host_of_block = vec![0usize; nblocks];
    let mut totals = vec![0u64; roles.site_list.len()];
    for (c, units) in job.assignment.iter().enumerate() {
        let k = roles
            .site_list
            .iter()
            .position(|&s| s == roles.sites[c])
            .unwrap_or(0);
        for &b in units {
            if let Some(h) = host_of_block.get_mut(b as usize) {
                *h = k;
            }
            totals[k] += 1;
        }
    }
    let mut done = vec![0u64; totals.len()];
    let mut results = Vec::new();
    let mut stats = Vec::new();
    let mut last_report: Option<Instant> = None;
    for ev in rx {
        match ev {
            Event::Result(bytes, power) => {
                if !is_root {
                    comm.try_process_at_rank(root)?
                        .try_send_with_tag(&bytes[..], TAG)?;
                    continue;
                }
                if let Some(&k) = host_of_block.get(power.block as usize) {
                    done[k] += 1;
                }
                results.push(power);
                let all = results.len() as u64;
                if last_report.is_none_or(|t| t.elapsed().as_secs_f64() > 0.1)
                    || all == nblocks as u64
                {
                    last_report = Some(Instant::now());
                    progress(&Progress {
                        phase: "dedispersing",
                        done: all,
                        total: nblocks as u64,
                        hosts: job
                            .names
                            .iter()
                            .zip(done.iter().zip(&totals))
                            .map(|(n, (d, t))| (n.clone(), *d, *t))
                            .collect(),
                        elapsed_s: job.t0.elapsed().as_secs_f64(),
                    });
                }
            }
            Event::Done(s) => stats.push(s),
        }
    }
    if !is_root {
        send(
            comm,
            root,
            &Msg::ServerDone {
                clients: stats
                    .iter()
                    .map(|c| (c.rank as u64, c.finish_s, c.busy_s, c.idle_s))
                    .collect(),
            },
        )?;
    }
    Ok(Served {
        results,
        clients: stats,
    })
}

fn describe(m: &Msg) -> String {
    match m {
        Msg::Request { block } => format!("request for unit {block}"),
        Msg::Data { block, .. } => format!("data of unit {block}"),
        Msg::Result { block, .. } => format!("result of unit {block}"),
        Msg::SignOff { .. } => "sign-off".into(),
        Msg::ServerDone { .. } => "server done".into(),
        Msg::Probe { .. } => "probe".into(),
        Msg::Echo => "echo".into(),
        Msg::ProbeEnd => "probe end".into(),
        Msg::Series { dm_index, .. } => format!("series of DM {dm_index}"),
        Msg::SeriesEnd => "series end".into(),
        Msg::Detections { dm_index, .. } => format!("detections of DM {dm_index}"),
        Msg::StreamEnd { blocks } => format!("end of stream after {blocks} blocks"),
        Msg::Ack { block } => format!("acknowledgement of block {block}"),
    }
}

/// Root side of the link probe: round trips of an empty and of growing messages to
/// `client`; bandwidth from the extra time the payload takes. Returns (bytes/s, one-way
/// latency s).
///
/// # Errors
/// Communication failures and malformed answers.
pub(crate) fn probe(comm: &SimpleCommunicator, client: Rank) -> Result<(f64, f64), DistError> {
    let p = comm.try_process_at_rank(client)?;
    let round = |payload: Vec<u8>| -> Result<f64, DistError> {
        let t = Instant::now();
        send(comm, client, &Msg::Probe { payload })?;
        match recv(&p)? {
            (Msg::Echo, _) => Ok(t.elapsed().as_secs_f64()),
            (m, _) => Err(DistError::Protocol(format!(
                "probe answered with {}",
                describe(&m)
            ))),
        }
    };
    let mut rtt = f64::INFINITY;
    for _ in 0..3 {
        rtt = rtt.min(round(Vec::new())?);
    }
    // Incompressible bytes, so a compressing link shows its real rate.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let mut len = 64 << 10;
    let bw = loop {
        let dt = round(noise(len))? - rtt;
        if dt > 0.1 || len >= 16 << 20 {
            break len as f64 / dt.max(1e-6);
        }
        len *= 4;
    };
    send(comm, client, &Msg::ProbeEnd)?;
    Ok((bw, rtt / 2.0))
}

/// Client side of the probe: echo until told to stop.
///
/// # Errors
/// Communication failures and malformed messages.
pub(crate) fn echo(comm: &SimpleCommunicator, root: Rank) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(root)?;
    loop {
        match recv(&p)? {
            (Msg::Probe { .. }, _) => send(comm, root, &Msg::Echo)?,
            (Msg::ProbeEnd, _) => return Ok(()),
            (m, _) => {
                return Err(DistError::Protocol(format!(
                    "expected a probe, got {}",
                    describe(&m)
                )))
            }
        }
    }
}

/// The root's share of the periodicity search: DM `k` goes to `workers[k % n]` (the root
/// among them); the detections come back per DM and are concatenated in DM order, which is
/// what the single-process search produces.
///
/// # Errors
/// Communication failures and malformed messages.
pub(crate) fn periodicity_root(
    comm: &SimpleCommunicator,
    workers: &[Rank],
    series: &[DmSeries],
    config: &SearchConfig,
    progress: &mut dyn FnMut(&Progress),
    t0: Instant,
) -> Result<Vec<SpectralCandidate>, DistError> {
    let me = comm.rank();
    let n = workers.len().max(1);
    let owner = |k: usize| workers.get(k % n).copied().unwrap_or(me);
    let mut sends = Vec::new();
    for (k, s) in series.iter().enumerate() {
        let w = owner(k);
        if w != me {
            let bytes = Msg::Series {
                dm_index: k as u64,
                tsamp_s: s.tsamp_s,
                data: s.data.clone(),
            }
            .encode();
            sends.push(
                comm.try_process_at_rank(w)?
                    .try_immediate_send_owned(bytes, TAG)?,
            );
        }
    }
    let plan = periodicity_plan(series, config);
    let mut lists: Vec<Option<Vec<SpectralCandidate>>> = vec![None; series.len()];
    let mut have = 0u64;
    let total = series.len() as u64;
    let mut report = |have: u64| {
        progress(&Progress {
            phase: "periodicity",
            done: have,
            total,
            hosts: Vec::new(),
            elapsed_s: t0.elapsed().as_secs_f64(),
        })
    };
    for (k, s) in series.iter().enumerate() {
        if owner(k) == me {
            lists[k] = Some(plan.search(&s.data, k));
            have += 1;
            report(have);
        }
    }
    let any = comm.any_process();
    while have < total {
        match recv(&any)? {
            (Msg::Detections { dm_index, list }, src) => {
                let k = dm_index as usize;
                if k >= lists.len() || owner(k) != src || lists[k].is_some() {
                    return Err(DistError::Protocol(format!(
                        "rank {src} sent detections for DM index {k}, which it was not given"
                    )));
                }
                lists[k] = Some(list);
                have += 1;
                report(have);
            }
            (m, src) => {
                return Err(DistError::Protocol(format!(
                    "expected detections, got {} from rank {src}",
                    describe(&m)
                )))
            }
        }
    }
    for s in sends {
        s.wait()?;
    }
    for &w in workers {
        if w != me {
            send(comm, w, &Msg::SeriesEnd)?;
        }
    }
    Ok(lists.into_iter().flatten().flatten().collect())
}

/// A periodicity worker on the data host: search each series the root sends.
///
/// # Errors
/// Communication failures and malformed messages.
pub(crate) fn periodicity_worker(
    comm: &SimpleCommunicator,
    root: Rank,
    config: &SearchConfig,
) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(root)?;
    let mut plan: Option<PeriodicityPlan> = None;
    loop {
        match recv(&p)? {
            (
                Msg::Series {
                    dm_index,
                    tsamp_s,
                    data,
                },
                _,
            ) => {
                let pl = match &plan {
                    Some(pl) => pl,
                    None => plan.insert(PeriodicityPlan::new(
                        data.len(),
                        tsamp_s,
                        config.periodicity.clone(),
                    )),
                };
                let list = pl.search(&data, dm_index as usize);
                send(comm, root, &Msg::Detections { dm_index, list })?;
            }
            (Msg::SeriesEnd, _) => return Ok(()),
            (m, _) => {
                return Err(DistError::Protocol(format!(
                    "expected a series, got {}",
                    describe(&m)
                )))
            }
        }
    }
}
