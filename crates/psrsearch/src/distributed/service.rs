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

use super::calibrate::{thread_cpu_s, CpuMeter};
use super::codec::{Msg, TAG};
use super::{DistError, Progress, Roles, Served, ServiceMode, SiteCost};
use crate::assemble::DmSeries;
use crate::dedisperse::{BlockPower, DedispersionPlan, Workspace};
use crate::filterbank::{self, Filterbank, FilterbankWorkspace};
use crate::format::{BasebandReader, ReadError};
use crate::periodicity::{PeriodicityPlan, SpectralCandidate};
use crate::search::{periodicity_plan, SearchConfig, SearchError};
use crate::voltages::Voltages;

/// What a server knows about the job.
pub(crate) struct ServerJob<'a> {
    pub roles: &'a Roles,
    pub assignment: &'a [Vec<u64>],
    pub file: &'a Path,
    pub plan: &'a DedispersionPlan,
    /// Where channels are split: the plan's blocks are of the file's sub-channels.
    pub filterbank: Option<&'a Filterbank>,
    pub mode: ServiceMode,
    pub t0: Instant,
    /// Meta host names, in `roles.site_list` order.
    pub names: &'a [String],
    /// The plan's per-unit costs, in `roles.site_list` order (dynamic mode only).
    pub costs: &'a [SiteCost],
    /// Name of the phase in progress reports (`pilot`, `dedispersing`).
    pub phase: &'static str,
}

/// How one client's run went.
#[derive(Clone, Debug)]
pub(crate) struct ClientStats {
    pub rank: Rank,
    /// When its server had its last result and its sign-off, s after the service started.
    pub finish_s: f64,
    pub busy_s: f64,
    pub idle_s: f64,
    /// Units whose results it returned.
    pub units: u64,
    /// CPU seconds its thread spent on its units (waits not counted; 0 where the OS does not
    /// say).
    pub cpu_s: f64,
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
/// the current one is processed, so transfer and computation overlap. The sign-off reports
/// the CPU this thread spent on its units ([`WorkCpu`]): the pilot measures the cost of a
/// unit with it.
///
/// # Errors
/// Communication failures and malformed messages.
pub(crate) fn client(
    comm: &SimpleCommunicator,
    plan: &DedispersionPlan,
    ws: &mut Workspace,
    server: Rank,
    units: &[u64],
    mode: ServiceMode,
    slow_s: f64,
) -> Result<(), DistError> {
    match mode {
        ServiceMode::Dynamic => return client_pull(comm, plan, ws, server, slow_s, true),
        ServiceMode::Scheduled => return client_pull(comm, plan, ws, server, slow_s, false),
        ServiceMode::RequestReply => {}
    }
    let mut cpu = WorkCpu::default();
    let to_server = comm.try_process_at_rank(server)?;
    let (mut busy, mut idle) = (0.0, 0.0);
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
        let work = thread_cpu_s();
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
        let out = compute(plan, ws, block, &voltages, slow_s);
        busy += t.elapsed().as_secs_f64();
        cpu.add(work);
        if let Some(s) = sending.take() {
            s.wait()?;
        }
        let work = thread_cpu_s();
        sending = Some(to_server.try_immediate_send_owned(out, TAG)?);
        cpu.add(work);
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
            cpu_s: cpu.0,
        },
    )
}

/// CPU seconds of a client's work on its units — receiving (the part after the wait),
/// decoding, computing, encoding, posting the result — without its waits for data or for a
/// send to complete. A wait spins briefly before it blocks, and a client behind a slow link
/// waits much: counted, the spinning would make its units look dearer than they are (and
/// the pilot, whose first units all wait, more so than the service), while a spinning rank
/// yields its core to any other that can run.
#[derive(Debug, Default)]
struct WorkCpu(f64);

impl WorkCpu {
    /// Add this thread's CPU since `from` (nothing where the OS gives no thread CPU time).
    fn add(&mut self, from: Option<f64>) {
        if let (Some(a), Some(b)) = (from, thread_cpu_s()) {
            self.0 += (b - a).max(0.0);
        }
    }
}

/// Dedisperse one unit (then sleep `slow_s`, the emulated slower host) and encode its result.
fn compute(
    plan: &DedispersionPlan,
    ws: &mut Workspace,
    block: u64,
    voltages: &Voltages,
    slow_s: f64,
) -> Vec<u8> {
    let power = plan.process_block(ws, block, voltages);
    if slow_s > 0.0 {
        std::thread::sleep(std::time::Duration::from_secs_f64(slow_s));
    }
    Msg::Result {
        block,
        power: power.data,
    }
    .encode()
}

/// A client that takes whatever units its server sends: with [`PREFETCH`] receives posted
/// (in dynamic mode each with a `Next` request sent), compute each unit as it comes, stop
/// posting (and asking) after the first `Drained`, sign off once every posted receive has its
/// message. In scheduled service the server sends [`PREFETCH`] `Drained` after the host's
/// units run out, one for each receive its client has posted then.
fn client_pull(
    comm: &SimpleCommunicator,
    plan: &DedispersionPlan,
    ws: &mut Workspace,
    server: Rank,
    slow_s: f64,
    ask: bool,
) -> Result<(), DistError> {
    let mut cpu = WorkCpu::default();
    let to_server = comm.try_process_at_rank(server)?;
    let (mut busy, mut idle) = (0.0, 0.0);
    let mut pending = VecDeque::new();
    for _ in 0..PREFETCH {
        if ask {
            send(comm, server, &Msg::Next)?;
        }
        pending.push_back(to_server.try_immediate_receive_vec::<u8>(Some(TAG))?);
    }
    let mut drained = false;
    let mut sending: Option<SendFuture<u8>> = None;
    while let Some(recv) = pending.pop_front() {
        let t = Instant::now();
        let (bytes, _) = recv.wait()?;
        idle += t.elapsed().as_secs_f64();
        let work = thread_cpu_s();
        match Msg::decode(&bytes)? {
            Msg::Data { block, voltages } => {
                if !drained {
                    if ask {
                        send(comm, server, &Msg::Next)?;
                    }
                    pending.push_back(to_server.try_immediate_receive_vec::<u8>(Some(TAG))?);
                }
                let t = Instant::now();
                let out = compute(plan, ws, block, &voltages, slow_s);
                busy += t.elapsed().as_secs_f64();
                cpu.add(work);
                if let Some(s) = sending.take() {
                    s.wait()?;
                }
                let work = thread_cpu_s();
                sending = Some(to_server.try_immediate_send_owned(out, TAG)?);
                cpu.add(work);
            }
            Msg::Drained => drained = true,
            m => {
                return Err(DistError::Protocol(format!(
                    "expected a unit or `drained` from server {server}, got {}",
                    describe(&m)
                )))
            }
        }
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
            cpu_s: cpu.0,
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
    let reader = BasebandReader::open(job.file).map_err(SearchError::from)?;
    let file = UnitFile {
        nsamples: reader.nsamples(),
        reader: Mutex::new(reader),
        filterbank: job.filterbank,
    };
    let dynamic = job.mode == ServiceMode::Dynamic;
    // Dynamic mode: the root keeps every client's queue, its own clients' and the other
    // servers', so a unit can move to any client of any server; the other servers ask it.
    let all: Vec<Rank> = (0..comm.size())
        .filter(|&r| roles.server_of[r as usize].is_some())
        .collect();
    let pool = Mutex::new(Pool::new(
        job,
        if dynamic && is_root { &all[..] } else { &[] },
    ));
    let mut grant_routes = std::collections::HashMap::new();
    let mut grant_inboxes = std::collections::HashMap::new();
    if dynamic && !is_root {
        for &c in &mine {
            let (gtx, grx) = mpsc::channel::<Option<u64>>();
            grant_routes.insert(c, gtx);
            grant_inboxes.insert(c, grx);
        }
    }
    // Scheduled service: one queue per meta host of this server's clients, holding the units
    // the plan gave its clients (interleaved, each client's in order), which every client of
    // the host takes from as its window has room.
    let hosts = HostQueues::new(job, roles, &mine);
    let (tx, rx) = mpsc::channel::<Event>();
    // Every thread of this server adds its CPU: the pilot measures what serving a unit costs.
    let meter = CpuMeter::default();
    let meter = &meter;
    std::thread::scope(|sc| {
        if dynamic && !is_root {
            sc.spawn(move || {
                meter.track(|| {
                    if let Err(e) = dispatch_grants(comm, root, &grant_routes) {
                        fatal(comm, "taking the root's answers", &e);
                    }
                })
            });
        }
        for &c in &mine {
            let tx = tx.clone();
            let file = &file;
            let pool = &pool;
            match job.mode {
                ServiceMode::Dynamic => {
                    let decider = match grant_inboxes.remove(&c) {
                        Some(inbox) => Decider::Root {
                            root,
                            inbox,
                            granted: Vec::new(),
                        },
                        None => Decider::Pool(pool),
                    };
                    sc.spawn(move || {
                        meter.track(|| {
                            if let Err(e) = serve_dynamic(comm, job, file.reader(), decider, c, &tx)
                            {
                                fatal(comm, "serving a client", &e);
                            }
                        })
                    });
                }
                ServiceMode::RequestReply => {
                    sc.spawn(move || {
                        meter.track(|| {
                            if let Err(e) = serve_requests(comm, job, file.reader(), c, &tx) {
                                fatal(comm, "serving a client", &e);
                            }
                        })
                    });
                }
                ServiceMode::Scheduled => {
                    let host = hosts.of(roles, c);
                    sc.spawn(move || {
                        meter.track(|| {
                            if let Err(e) = push_units(comm, job, file.reader(), c, host) {
                                fatal(comm, "serving a client", &e);
                            }
                        })
                    });
                    sc.spawn(move || {
                        meter.track(|| {
                            if let Err(e) = take_results(comm, job, c, host, &tx) {
                                fatal(comm, "receiving from a client", &e);
                            }
                        })
                    });
                }
            }
        }
        if is_root {
            for &s in roles.servers.iter().filter(|&&s| s != me) {
                let tx = tx.clone();
                let pool = dynamic.then_some(&pool);
                sc.spawn(move || {
                    meter.track(|| {
                        if let Err(e) = take_forwarded(comm, job, s, pool, &tx) {
                            fatal(comm, "receiving from a server", &e);
                        }
                    })
                });
            }
        }
        drop(tx);
        match meter.track(|| collect(comm, job, rx, progress, meter)) {
            Ok(mut s) => {
                // The scope's threads have not all ended yet (the dispatcher waits for the
                // root's last word); their CPU so far is nearly all of it.
                s.cpu_s = meter.total();
                Ok(s)
            }
            Err(e) => fatal(comm, "collecting results", &e),
        }
    })
}

/// The file a server reads its units from: blocks of its channels, or of their sub-channels
/// where the search splits them. One serving thread reads the file at a time, but each
/// splits its own blocks ([`UnitFile::reader`]): the filterbank runs on as many cores as
/// serve, and the thread's cache of filterbank blocks serves the overlap of its units.
struct UnitFile<'a> {
    reader: Mutex<BasebandReader>,
    /// Input samples per channel.
    nsamples: u64,
    filterbank: Option<&'a Filterbank>,
}

impl<'a> UnitFile<'a> {
    /// A reader for one serving thread.
    fn reader(&self) -> UnitReader<'_, 'a> {
        UnitReader {
            file: self,
            ws: self.filterbank.map(Filterbank::workspace),
        }
    }
}

/// One serving thread's view of a [`UnitFile`], with its own filterbank buffers.
struct UnitReader<'f, 'a> {
    file: &'f UnitFile<'a>,
    ws: Option<FilterbankWorkspace>,
}

impl UnitReader<'_, '_> {
    /// The plan's samples `[start, start + out.nsamp())` (sub-channel samples where split),
    /// zeros past the end: bit for bit what the single-process search reads.
    fn read_padded_into(&mut self, start: u64, out: &mut Voltages) -> Result<(), ReadError> {
        let file = self.file;
        let lock = || file.reader.lock().unwrap_or_else(|p| p.into_inner());
        match (file.filterbank, self.ws.as_mut()) {
            (Some(fb), Some(ws)) => {
                let n = file.nsamples;
                let mut read = |first: i64, input: &mut Voltages| -> Result<(), ReadError> {
                    filterbank::read_signed(&mut lock(), n, first, input)
                };
                fb.read_into(ws, n, start, out, &mut read)
            }
            _ => lock().read_padded_into(start, out),
        }
    }
}

/// What the serving threads tell the collecting one.
enum Event {
    Result(Vec<u8>, BlockPower),
    Done(ClientStats),
    /// Another server's CPU seconds during the service.
    ServerCpu(f64),
}

/// The units of one meta host in scheduled service, shared by its clients' serving threads.
struct HostQueue {
    /// Units not yet sent to any client.
    queue: Mutex<VecDeque<u64>>,
    /// Every unit of the host, sorted: a result for another unit is a protocol error.
    units: Vec<u64>,
}

/// Per meta host of a server's clients, its [`HostQueue`].
struct HostQueues(Vec<(usize, HostQueue)>);

impl HostQueues {
    fn new(job: &ServerJob<'_>, roles: &Roles, mine: &[Rank]) -> HostQueues {
        let mut out: Vec<(usize, HostQueue)> = Vec::new();
        let mut sites: Vec<usize> = mine.iter().map(|&c| roles.sites[c as usize]).collect();
        sites.sort_unstable();
        sites.dedup();
        for site in sites {
            let lists: Vec<&Vec<u64>> = mine
                .iter()
                .filter(|&&c| roles.sites[c as usize] == site)
                .map(|&c| &job.assignment[c as usize])
                .collect();
            let longest = lists.iter().map(|l| l.len()).max().unwrap_or(0);
            let queue: VecDeque<u64> = (0..longest)
                .flat_map(|i| lists.iter().filter_map(move |l| l.get(i).copied()))
                .collect();
            let mut units: Vec<u64> = queue.iter().copied().collect();
            units.sort_unstable();
            out.push((
                site,
                HostQueue {
                    queue: Mutex::new(queue),
                    units,
                },
            ));
        }
        HostQueues(out)
    }

    /// The queue of `client`'s meta host (`client` is one of this server's clients).
    fn of(&self, roles: &Roles, client: Rank) -> &HostQueue {
        let site = roles.sites[client as usize];
        &self
            .0
            .iter()
            .find(|(s, _)| *s == site)
            .expect("every client's meta host has a queue")
            .1
    }
}

impl HostQueue {
    fn next(&self) -> Option<u64> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    fn owns(&self, block: u64) -> bool {
        self.units.binary_search(&block).is_ok()
    }
}

/// Scheduled service: send the client units of its meta host's queue, at most [`PREFETCH`]
/// in flight (to the server's own meta host synchronous sends: one completes when the
/// client has matched it with one of its [`PREFETCH`] posted receives), then [`PREFETCH`]
/// `Drained` behind them. A client takes the next unit of its host when it has taken one,
/// so within a meta host a client slower than the plan thought (a busier core) computes
/// fewer units and its neighbours more, with no request sent: the host finishes when its
/// clients' mean speed says, not when its slowest client's does.
fn push_units(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    mut source: UnitReader<'_, '_>,
    client: Rank,
    host: &HostQueue,
) -> Result<(), DistError> {
    // Synchronous to the server's own meta host, whose clients compute rather than wait for a
    // link; standard (eager through routers up to 512 KiB, paced by the routers' flow
    // control) to another: a synchronous send there waits a wide-area round trip per unit,
    // and on the 2-core machine the plan then missed the data host by 30-60% in most runs.
    let local = job.roles.sites[client as usize] == job.roles.sites[comm.rank() as usize];
    let mut in_flight = VecDeque::new();
    loop {
        if in_flight.len() >= PREFETCH {
            if let Some(s) = in_flight.pop_front() {
                let s: SendFuture<u8> = s;
                s.wait()?;
            }
        }
        let Some(b) = host.next() else { break };
        in_flight.push_back(start_unit(comm, job, &mut source, client, b, local)?);
    }
    // At once, not after the last units are matched: messages between two ranks arrive in
    // order, and across a long link waiting would add a round trip to the client's end.
    for _ in 0..PREFETCH {
        send(comm, client, &Msg::Drained)?;
    }
    for s in in_flight {
        s.wait()?;
    }
    Ok(())
}

/// Read unit `b` and start sending it to `client`; `synchronous`: the send completes only
/// once the client has matched it with a posted receive (whatever the unit's length: a
/// unit sent eagerly would complete at once, and a window of sends would bound nothing).
fn start_unit(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    source: &mut UnitReader<'_, '_>,
    client: Rank,
    b: u64,
    synchronous: bool,
) -> Result<SendFuture<u8>, DistError> {
    let band = job.plan.band();
    let mut block = Voltages::zeros(band.nchan(), band.npol, job.plan.fft_len());
    source
        .read_padded_into(job.plan.block_start(b), &mut block)
        .map_err(SearchError::from)?;
    let bytes = Msg::Data {
        block: b,
        voltages: block,
    }
    .encode();
    let to = comm.try_process_at_rank(client)?;
    Ok(if synchronous {
        to.try_immediate_synchronous_send_owned(bytes, TAG)?
    } else {
        to.try_immediate_send_owned(bytes, TAG)?
    })
}

/// Request/reply: answer each request with its unit, pass results on, until the sign-off.
fn serve_requests(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    mut source: UnitReader<'_, '_>,
    client: Rank,
    tx: &mpsc::Sender<Event>,
) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(client)?;
    let units = &job.assignment[client as usize];
    let mut in_flight: VecDeque<SendFuture<u8>> = VecDeque::new();
    let mut done = 0;
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
                in_flight.push_back(start_unit(comm, job, &mut source, client, block, false)?);
            }
            m => {
                if pass_on(
                    job,
                    client,
                    bytes,
                    m,
                    tx,
                    &mut |b| units.contains(&b),
                    &mut done,
                )? {
                    for s in in_flight {
                        s.wait()?;
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// Dynamic mode's shared state, kept by the root server for every client of every server:
/// the static plan's queue of each client, who holds which unit, and each client's measured
/// rate. The root's own serving threads use it directly; another server asks the root for
/// each of its clients' units (`Want`, answered by `Grant`) and forwards results, which the
/// root records here too — so a unit can move to a client of any server, and the rates of
/// every host are compared.
///
/// The rule, when client `c` asks:
/// - Its own queue not empty: the queue's next unit, unless the other clients still asking
///   would, at their rates, finish all queued units and what they hold before `c` finished
///   one more, `Σ queued / Σ_v (1 / rate_v) < (outstanding_c + 1) · rate_c` (the sums over
///   every queue and the asking `v ≠ c`, whose outstanding units count too). Then `c` is
///   answered `Drained` and its queue waits for the others: a host slower than planned, or
///   behind a slower link, stops taking its own share once the others could finish the job
///   without it. The last client asking never declines.
/// - Its own queue empty: a unit of a drained client's queue if there is one (nobody else
///   will take it); else find the client `v` with the latest predicted finish,
///   `(outstanding_v + queued_v) · rate_v`, and hand `c` the last unit of `v`'s queue when
///   `c` would finish it sooner, `transfer_c + (outstanding_c + 1) · rate_c <
///   (outstanding_v + queued_v) · rate_v`; else answer `Drained`.
///
/// So every unit is taken: a drained client's units go to whoever asks next, and a client
/// is drained only while another still asks.
///
/// `rate` is the measured interval between a client's results once it has returned two,
/// after one the time from its first unit to that result, before that the plan's
/// `max(unit_s, transfer_s)`, and never less than the time the client
/// has been holding work without returning any (so a host that stalls, or is slower than
/// calibrated, is seen before its second result); `transfer` is the plan's time to move a
/// unit over the client's link, so a slow-link host is not handed a unit it would deliver
/// late.
pub(crate) struct Pool {
    /// Per world rank: units still to hand out, in the plan's order.
    queues: Vec<VecDeque<u64>>,
    /// Per block: the client it was handed to.
    holder: Vec<Option<Rank>>,
    /// Per world rank: units handed out whose result has not come back.
    outstanding: Vec<u64>,
    /// Per world rank: results received, and the times of the first and the last.
    returned: Vec<(u64, f64, f64)>,
    /// Per world rank: since when it has held work without returning a result.
    holding_since: Vec<f64>,
    /// Per world rank: when it was first handed a unit.
    first_given: Vec<Option<f64>>,
    /// Per world rank: the plan's seconds per unit and per transfer of its host.
    planned: Vec<SiteCost>,
    /// Per world rank: a client of this pool that has not been answered `Drained`.
    asking: Vec<bool>,
}

impl Pool {
    fn new(job: &ServerJob<'_>, mine: &[Rank]) -> Pool {
        let size = job.assignment.len();
        // Units are block numbers; a job after a pilot does not start at block 0.
        let nblocks = job
            .assignment
            .iter()
            .flatten()
            .map(|&b| b as usize + 1)
            .max()
            .unwrap_or(0);
        let mut queues = vec![VecDeque::new(); size];
        let mut planned = vec![SiteCost::default(); size];
        let mut asking = vec![false; size];
        for &c in mine {
            asking[c as usize] = true;
            queues[c as usize] = job.assignment[c as usize].iter().copied().collect();
            let k = job
                .roles
                .site_list
                .iter()
                .position(|&s| s == job.roles.sites[c as usize]);
            if let Some(cost) = k.and_then(|k| job.costs.get(k)) {
                planned[c as usize] = *cost;
            }
        }
        Pool {
            queues,
            holder: vec![None; nblocks],
            outstanding: vec![0; size],
            returned: vec![(0, 0.0, 0.0); size],
            holding_since: vec![0.0; size],
            first_given: vec![None; size],
            planned,
            asking,
        }
    }

    /// Seconds per unit of client `c` at `now`: measured between results, else planned; at
    /// least as long as it has now been holding work without a result.
    fn rate(&self, c: usize, now: f64) -> f64 {
        let base = match self.returned[c] {
            (n, first, last) if n >= 2 => (last - first) / (n - 1) as f64,
            // One result: it took at most this long since the client got work.
            (1, first, _) => first - self.first_given[c].unwrap_or(first),
            _ => self.planned[c].unit_s.max(self.planned[c].transfer_s),
        };
        if self.outstanding[c] > 0 {
            base.max(now - self.holding_since[c])
        } else {
            base
        }
    }

    /// The unit to send client `c` at `now`, or `None` when it should stop asking (see
    /// [`Pool`] for the rule).
    fn next_for(&mut self, c: Rank, now: f64) -> Option<u64> {
        let c = c as usize;
        if !self.asking.get(c).copied().unwrap_or(false) {
            return None;
        }
        let b = if self.queues[c].is_empty() {
            self.steal_for(c, now)
        } else if self.better_elsewhere(c, now) {
            None
        } else {
            self.queues[c].pop_front()
        };
        let Some(b) = b else {
            self.asking[c] = false;
            return None;
        };
        self.holder[b as usize] = Some(c as Rank);
        if self.outstanding[c] == 0 {
            self.holding_since[c] = now;
        }
        self.first_given[c].get_or_insert(now);
        self.outstanding[c] += 1;
        Some(b)
    }

    /// When `c` could finish everything it has and one more unit.
    fn finish_with_one_more(&self, c: usize, now: f64) -> f64 {
        (self.outstanding[c] + 1) as f64 * self.rate(c, now)
    }

    /// When `v` would finish what it holds and has queued.
    fn finish(&self, v: usize, now: f64) -> f64 {
        (self.outstanding[v] + self.queues[v].len() as u64) as f64 * self.rate(v, now)
    }

    /// Whether the other clients still asking, at their rates, would finish everything queued
    /// (`c`'s queue included, which they take over if `c` stops) and what they hold before `c`
    /// would finish what it holds and one unit more.
    fn better_elsewhere(&self, c: usize, now: f64) -> bool {
        let (mut work, mut speed) = (0u64, 0.0);
        for v in 0..self.queues.len() {
            work += self.queues[v].len() as u64;
            let r = self.rate(v, now);
            if v != c && self.asking[v] && r > 0.0 {
                work += self.outstanding[v];
                speed += 1.0 / r;
            }
        }
        speed > 0.0 && work as f64 / speed < self.finish_with_one_more(c, now)
    }

    /// A unit for `c`, whose own queue is empty: a drained client's first, else one from the
    /// client predicted to finish last if `c` would finish it sooner.
    fn steal_for(&mut self, c: usize, now: f64) -> Option<u64> {
        let others = || (0..self.queues.len()).filter(move |&v| v != c);
        if let Some(v) = others().find(|&v| !self.asking[v] && !self.queues[v].is_empty()) {
            return self.queues[v].pop_front();
        }
        let victim = others()
            .filter(|&v| !self.queues[v].is_empty())
            .max_by(|&a, &b| self.finish(a, now).total_cmp(&self.finish(b, now)))?;
        let mine = self.planned[c].transfer_s + self.finish_with_one_more(c, now);
        if mine >= self.finish(victim, now) {
            return None;
        }
        self.queues[victim].pop_back()
    }

    /// Record the result for `block` at `now` for whichever client holds it (another
    /// server has checked that its client was given it); `false` if nobody holds it.
    fn returned_by_holder(&mut self, block: u64, now: f64) -> bool {
        match self.holder.get(block as usize).copied().flatten() {
            Some(c) => self.returned(c, block, now),
            None => false,
        }
    }

    /// Record client `c`'s result for `block` at `now`; `false` if `c` was not given it.
    fn returned(&mut self, c: Rank, block: u64, now: f64) -> bool {
        if self.holder.get(block as usize).copied().flatten() != Some(c) {
            return false;
        }
        self.holder[block as usize] = None;
        let c = c as usize;
        self.outstanding[c] = self.outstanding[c].saturating_sub(1);
        let r = &mut self.returned[c];
        if r.0 == 0 {
            r.1 = now;
        }
        r.0 += 1;
        r.2 = now;
        self.holding_since[c] = now;
        true
    }
}

/// Who decides a dynamic-mode client's next unit.
enum Decider<'a> {
    /// The root: its own pool of every client's queue.
    Pool(&'a Mutex<Pool>),
    /// Another server: asks the root (`Want`), whose answer arrives through `inbox`
    /// ([`dispatch_grants`]); remembers which units the client was given.
    Root {
        root: Rank,
        inbox: mpsc::Receiver<Option<u64>>,
        granted: Vec<u64>,
    },
}

impl Decider<'_> {
    fn next_for(
        &mut self,
        comm: &SimpleCommunicator,
        client: Rank,
        now: f64,
    ) -> Result<Option<u64>, DistError> {
        match self {
            Decider::Pool(p) => Ok(lock_pool(p).next_for(client, now)),
            Decider::Root {
                root,
                inbox,
                granted,
            } => {
                send(
                    comm,
                    *root,
                    &Msg::Want {
                        client: client as u64,
                    },
                )?;
                let b = inbox.recv().map_err(|_| {
                    DistError::Protocol("the thread taking the root's answers has stopped".into())
                })?;
                granted.extend(b);
                Ok(b)
            }
        }
    }

    /// Whether `client` was given `block` (and now has returned it).
    fn returned(&mut self, client: Rank, block: u64, now: f64) -> bool {
        match self {
            Decider::Pool(p) => lock_pool(p).returned(client, block, now),
            Decider::Root { granted, .. } => match granted.iter().position(|&b| b == block) {
                Some(k) => {
                    granted.swap_remove(k);
                    true
                }
                None => false,
            },
        }
    }
}

fn lock_pool(p: &Mutex<Pool>) -> std::sync::MutexGuard<'_, Pool> {
    p.lock().unwrap_or_else(|p| p.into_inner())
}

/// Dynamic mode: answer each `Next` with the unit the decider chooses (the client's own
/// queue first, then one taken from the client predicted to finish last, whichever server
/// serves it) or `Drained`; pass results on until the sign-off.
fn serve_dynamic(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    mut source: UnitReader<'_, '_>,
    mut decider: Decider<'_>,
    client: Rank,
    tx: &mpsc::Sender<Event>,
) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(client)?;
    let mut in_flight: VecDeque<SendFuture<u8>> = VecDeque::new();
    let mut done = 0;
    loop {
        let (bytes, _) = p.try_receive_vec_with_tag::<u8>(Some(TAG))?;
        match Msg::decode(&bytes)? {
            Msg::Next => {
                while in_flight.len() >= PREFETCH {
                    if let Some(s) = in_flight.pop_front() {
                        s.wait()?;
                    }
                }
                match decider.next_for(comm, client, job.t0.elapsed().as_secs_f64())? {
                    Some(b) => {
                        in_flight.push_back(start_unit(comm, job, &mut source, client, b, false)?)
                    }
                    None => send(comm, client, &Msg::Drained)?,
                }
            }
            m => {
                let now = job.t0.elapsed().as_secs_f64();
                let mut owns = |b| decider.returned(client, b, now);
                if pass_on(job, client, bytes, m, tx, &mut owns, &mut done)? {
                    for s in in_flight {
                        s.wait()?;
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// Dynamic mode on a server other than the root: hand the root's answers to the threads
/// serving the clients they are for, until the root says the service is over.
fn dispatch_grants(
    comm: &SimpleCommunicator,
    root: Rank,
    routes: &std::collections::HashMap<Rank, mpsc::Sender<Option<u64>>>,
) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(root)?;
    loop {
        match recv(&p)? {
            (Msg::Grant { client, block }, _) => {
                let to = Rank::try_from(client)
                    .ok()
                    .and_then(|c| routes.get(&c))
                    .ok_or_else(|| {
                        DistError::Protocol(format!(
                            "the root answered for client {client}, which this server does not serve"
                        ))
                    })?;
                to.send(block).map_err(|_| {
                    DistError::Protocol(format!("the thread serving client {client} has stopped"))
                })?;
            }
            (Msg::ServiceOver, _) => return Ok(()),
            (m, _) => {
                return Err(DistError::Protocol(format!(
                    "expected an answer from the root, got {}",
                    describe(&m)
                )))
            }
        }
    }
}

/// Scheduled service: the client's results and sign-off.
fn take_results(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    client: Rank,
    host: &HostQueue,
    tx: &mpsc::Sender<Event>,
) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(client)?;
    let mut done = 0;
    loop {
        let (bytes, _) = p.try_receive_vec_with_tag::<u8>(Some(TAG))?;
        let m = Msg::decode(&bytes)?;
        if pass_on(job, client, bytes, m, tx, &mut |b| host.owns(b), &mut done)? {
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
    owns: &mut dyn FnMut(u64) -> bool,
    units: &mut u64,
) -> Result<bool, DistError> {
    let gone = || DistError::Protocol("the collecting thread has stopped".into());
    match m {
        Msg::Result { block, power } if owns(block) => {
            *units += 1;
            tx.send(Event::Result(bytes, BlockPower { block, data: power }))
                .map_err(|_| gone())?;
            Ok(false)
        }
        Msg::SignOff {
            busy_s,
            idle_s,
            cpu_s,
        } => {
            tx.send(Event::Done(ClientStats {
                rank: client,
                finish_s: job.t0.elapsed().as_secs_f64(),
                busy_s,
                idle_s,
                units: *units,
                cpu_s,
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

/// Root: results another server forwards, then its clients' statistics. In dynamic mode
/// (`pool`) also that server's questions about its clients' next units, answered from the
/// root's pool, and the results update the pool's rates.
fn take_forwarded(
    comm: &SimpleCommunicator,
    job: &ServerJob<'_>,
    server: Rank,
    pool: Option<&Mutex<Pool>>,
    tx: &mpsc::Sender<Event>,
) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(server)?;
    let gone = || DistError::Protocol("the collecting thread has stopped".into());
    loop {
        let (bytes, _) = p.try_receive_vec_with_tag::<u8>(Some(TAG))?;
        match Msg::decode(&bytes)? {
            Msg::Result { block, power } => {
                if let Some(pool) = pool {
                    let now = job.t0.elapsed().as_secs_f64();
                    if !lock_pool(pool).returned_by_holder(block, now) {
                        return Err(DistError::Protocol(format!(
                            "server {server} forwarded unit {block}, which no client holds"
                        )));
                    }
                }
                tx.send(Event::Result(Vec::new(), BlockPower { block, data: power }))
                    .map_err(|_| gone())?
            }
            Msg::Want { client } => {
                let c = Rank::try_from(client).ok().filter(|&c| {
                    job.roles.server_of.get(c as usize).copied().flatten() == Some(server)
                });
                let (Some(pool), Some(c)) = (pool, c) else {
                    return Err(DistError::Protocol(format!(
                        "server {server} asked for a unit for client {client} in {} mode",
                        job.mode
                    )));
                };
                let block = lock_pool(pool).next_for(c, job.t0.elapsed().as_secs_f64());
                send(comm, server, &Msg::Grant { client, block })?;
            }
            Msg::ServerDone { cpu_s, clients } => {
                for (r, f, b, i, n, c) in clients {
                    tx.send(Event::Done(ClientStats {
                        rank: r as Rank,
                        finish_s: f,
                        busy_s: b,
                        idle_s: i,
                        units: n,
                        cpu_s: c,
                    }))
                    .map_err(|_| gone())?;
                }
                tx.send(Event::ServerCpu(cpu_s)).map_err(|_| gone())?;
                if pool.is_some() {
                    // Every `Want` of that server came before its `ServerDone` (its clients had
                    // signed off), so all are answered: its dispatcher may stop.
                    send(comm, server, &Msg::ServiceOver)?;
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
    meter: &CpuMeter,
) -> Result<Served, DistError> {
    let cpu0 = thread_cpu_s();
    let roles = job.roles;
    let root = roles.root();
    let is_root = comm.rank() == root;
    // Which host each block belongs to, for the progress display.
    let nblocks: usize = job.assignment.iter().map(Vec::len).sum();
    // Indexed by block number: a job after a pilot does not start at block 0.
    let top = job
        .assignment
        .iter()
        .flatten()
        .map(|&b| b as usize + 1)
        .max()
        .unwrap_or(0);
    let mut host_of_block = vec![0usize; top];
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
    let mut server_cpu_s = Vec::new();
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
                        phase: job.phase,
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
            Event::ServerCpu(c) => server_cpu_s.push(c),
        }
    }
    if !is_root {
        // This thread's CPU joins the meter only when it returns; count it here.
        let own = cpu0
            .and_then(|c0| thread_cpu_s().map(|c1| c1 - c0))
            .unwrap_or(0.0);
        send(
            comm,
            root,
            &Msg::ServerDone {
                cpu_s: meter.total() + own,
                clients: stats
                    .iter()
                    .map(|c| {
                        (
                            c.rank as u64,
                            c.finish_s,
                            c.busy_s,
                            c.idle_s,
                            c.units,
                            c.cpu_s,
                        )
                    })
                    .collect(),
            },
        )?;
    }
    Ok(Served {
        results,
        clients: stats,
        server_cpu_s,
        cpu_s: 0.0,
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
        Msg::StreamEnd { blocks, samples } => {
            format!("end of stream after {blocks} blocks ({samples} samples)")
        }
        Msg::Ack { block } => format!("acknowledgement of block {block}"),
        Msg::Next => "request for any unit".into(),
        Msg::Drained => "no more units".into(),
        Msg::Want { client } => format!("question for client {client}'s next unit"),
        Msg::Grant { client, .. } => format!("answer for client {client}"),
        Msg::ServiceOver => "end of service".into(),
    }
}

/// Root side of the link probe: round trips of an empty message give the latency; then
/// trains of [`PROBE_TRAIN`] messages sent back to back to a client with as many receives
/// posted (as the service keeps several units in flight, so rendezvous handshakes overlap),
/// each echoed, growing until a train takes 0.1 s beyond a round trip, give the rate the
/// link delivers to a stream of units.
/// Returns (bytes/s, one-way latency s).
///
/// # Errors
/// Communication failures and malformed answers.
pub(crate) fn probe(comm: &SimpleCommunicator, client: Rank) -> Result<(f64, f64), DistError> {
    let p = comm.try_process_at_rank(client)?;
    let echo = || -> Result<(), DistError> {
        match recv(&p)? {
            (Msg::Echo, _) => Ok(()),
            (m, _) => Err(DistError::Protocol(format!(
                "probe answered with {}",
                describe(&m)
            ))),
        }
    };
    let mut rtt = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        send(
            comm,
            client,
            &Msg::Probe {
                payload: Vec::new(),
            },
        )?;
        echo()?;
        rtt = rtt.min(t.elapsed().as_secs_f64());
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
    let mut len = 16 << 10;
    let bw = loop {
        let train: Vec<Vec<u8>> = (0..PROBE_TRAIN)
            .map(|_| {
                Msg::Probe {
                    payload: noise(len),
                }
                .encode()
            })
            .collect();
        let t = Instant::now();
        let sends = train
            .into_iter()
            .map(|m| p.try_immediate_send_owned(m, TAG))
            .collect::<Result<Vec<_>, _>>()?;
        for _ in 0..PROBE_TRAIN {
            echo()?;
        }
        let dt = t.elapsed().as_secs_f64() - rtt;
        for s in sends {
            s.wait()?;
        }
        if dt > 0.1 || len >= 4 << 20 {
            break (PROBE_TRAIN * len) as f64 / dt.max(1e-6);
        }
        len *= 4;
    };
    // One end for every receive the echoing client keeps posted.
    for _ in 0..PROBE_TRAIN {
        send(comm, client, &Msg::ProbeEnd)?;
    }
    Ok((bw, rtt / 2.0))
}

/// Messages in one train of the link probe, and receives the echoing client keeps posted:
/// as many units as three clients keep in flight in the service.
const PROBE_TRAIN: usize = 3 * PREFETCH;

/// Client side of the probe: echo until told to stop, with [`PROBE_TRAIN`] receives posted
/// ahead as a client of the service keeps its next units' (a large message waits for its
/// receive, and one posted only after the previous echo would cost a round trip each). The
/// root ends with one `ProbeEnd` per posted receive, so none is left to match a later
/// message.
///
/// # Errors
/// Communication failures and malformed messages.
pub(crate) fn echo(comm: &SimpleCommunicator, root: Rank) -> Result<(), DistError> {
    let p = comm.try_process_at_rank(root)?;
    let mut posted = VecDeque::new();
    for _ in 0..PROBE_TRAIN {
        posted.push_back(p.try_immediate_receive_vec::<u8>(Some(TAG))?);
    }
    let mut ending = false;
    while let Some(r) = posted.pop_front() {
        let (bytes, _) = r.wait()?;
        match Msg::decode(&bytes)? {
            Msg::Probe { .. } if !ending => {
                send(comm, root, &Msg::Echo)?;
                posted.push_back(p.try_immediate_receive_vec::<u8>(Some(TAG))?);
            }
            Msg::ProbeEnd => ending = true,
            m => {
                return Err(DistError::Protocol(format!(
                    "expected a probe, got {}",
                    describe(&m)
                )))
            }
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of clients 0.. with these queues, all planned at `planned_s` per unit.
    fn pool(queues: &[Vec<u64>], planned_s: f64) -> Pool {
        let n = queues.len();
        let nblocks = queues
            .iter()
            .flatten()
            .map(|&b| b as usize + 1)
            .max()
            .unwrap_or(0);
        Pool {
            queues: queues.iter().map(|q| q.iter().copied().collect()).collect(),
            holder: vec![None; nblocks],
            outstanding: vec![0; n],
            returned: vec![(0, 0.0, 0.0); n],
            holding_since: vec![0.0; n],
            first_given: vec![None; n],
            planned: vec![
                SiteCost {
                    unit_s: planned_s,
                    transfer_s: 0.0,
                };
                n
            ],
            asking: vec![true; n],
        }
    }

    /// Runs the pool to the end with clients that take `true_s[c]` seconds per unit and keep
    /// `ahead` units requested; returns the units each computed and the finish time.
    fn simulate(p: &mut Pool, true_s: &[f64], ahead: usize) -> (Vec<Vec<u64>>, f64) {
        let n = true_s.len();
        let mut done = vec![Vec::new(); n];
        // Per client: units received, in order, and when its current one finishes.
        let mut held: Vec<VecDeque<u64>> = vec![VecDeque::new(); n];
        let mut busy_until = vec![0.0f64; n];
        let mut asking = vec![true; n];
        let mut now = 0.0f64;
        for c in 0..n {
            for _ in 0..ahead {
                match p.next_for(c as Rank, now) {
                    Some(b) => held[c].push_back(b),
                    None => asking[c] = false,
                }
            }
            busy_until[c] = true_s[c];
        }
        while let Some(c) = (0..n)
            .filter(|&c| !held[c].is_empty())
            .min_by(|&a, &b| busy_until[a].total_cmp(&busy_until[b]))
        {
            now = busy_until[c];
            let b = held[c].pop_front().unwrap();
            assert!(
                p.returned(c as Rank, b, now),
                "client {c} was not given unit {b}"
            );
            done[c].push(b);
            if asking[c] {
                match p.next_for(c as Rank, now) {
                    Some(b) => held[c].push_back(b),
                    None => asking[c] = false,
                }
            }
            busy_until[c] = now + true_s[c];
        }
        (done, now)
    }

    fn all_once(done: &[Vec<u64>], units: u64) {
        let mut all: Vec<u64> = done.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..units).collect::<Vec<_>>(),
            "every unit exactly once"
        );
    }

    #[test]
    fn a_slow_client_gives_up_its_own_share() {
        // Planned equal; client 2 is really ten times slower.
        let queues = vec![(0..20).collect(), (20..40).collect(), (40..60).collect()];
        let mut p = pool(&queues, 1.0);
        let (done, end) = simulate(&mut p, &[1.0, 1.0, 10.0], 3);
        all_once(&done, 60);
        assert!(
            done[2].len() <= 4,
            "the slow client kept {} units",
            done[2].len()
        );
        // Without declining it would compute its 20 units: 200 s. Declining after its first
        // result (its three units requested ahead done at 30 s), the others' 57 take 28.5 s.
        assert!(end <= 30.0, "finished at {end}");
        // Its units went to the others, who took them although their own rates were known.
        assert!(done[0].iter().chain(&done[1]).any(|&b| b >= 40));
    }

    #[test]
    fn the_last_client_asking_never_declines() {
        let queues = vec![(0..5).collect(), (5..10).collect()];
        let mut p = pool(&queues, 1.0);
        p.asking[0] = false;
        // Client 1 is slow and client 0 no longer asks: client 1 must take everything.
        p.holding_since[1] = 0.0;
        let mut got = Vec::new();
        while let Some(b) = p.next_for(1, 100.0) {
            got.push(b);
            assert!(p.returned(1, b, 100.0));
        }
        got.sort_unstable();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn every_unit_is_handed_out_once_whatever_the_speeds() {
        // Speeds from a fixed little generator: no unit is lost or given twice, and no
        // client is told to stop while units that only it could take remain.
        let mut x = 12345u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..200 {
            let n = 1 + (next() % 6) as usize;
            let mut queues = vec![Vec::new(); n];
            let units = next() % 40;
            for b in 0..units {
                queues[(next() % n as u64) as usize].push(b);
            }
            let true_s: Vec<f64> = (0..n).map(|_| 0.1 + (next() % 100) as f64 / 10.0).collect();
            let mut p = pool(&queues, 1.0);
            let (done, _) = simulate(&mut p, &true_s, 1 + (next() % 3) as usize);
            all_once(&done, units);
        }
    }
}
