//! The search distributed over a metampi job, as the Jodrell Bank group ran it at SC99 (seed
//! 000), with their hindsight built in.
//!
//! Roles come from the topology API, not from rank order: the meta host of world rank 0 holds
//! the data; its lowest ranks are servers, one per 128 clients (at most), and every other
//! rank on every meta host is a client. A work unit is one dedispersion block (the paper's
//! record) at every trial DM, so the unit's cost is `n_slopes · τ`. Where the search splits
//! channels into sub-channels ([`PlanConfig::subchannels`](crate::PlanConfig::subchannels)),
//! every rank plans for the sub-channels' band as the single-process search does, and a unit
//! is a block of sub-channel samples, which the servers make from the file through the
//! filterbank (each serving thread with its own buffers; decision 0065).
//!
//! 1. **Set-up.** The root server (lowest rank of the data host) opens the file and
//!    broadcasts the band and search settings; everyone builds the same
//!    [`DedispersionPlan`]. All clients then compute synthetic units together for a short
//!    window (`calibrate`): each measures the CPU a unit costs and the share of a core it got
//!    while every client computed, and says which computer it runs on, so the plan knows the
//!    cost of a unit (the paper's `τ·n_slopes·p_1/p_i`), the cores the job gets on each
//!    machine and which meta hosts share them. The root measures what it spends per unit
//!    (reading, encoding, taking results) and what a byte through a socket costs (routers).
//!    Link bandwidths come from the meta-computer description (`BANDWIDTH` on the PAIRs) or,
//!    where it gives none, from a probe: the root times a small and then a train of large
//!    messages to one client of each remote host.
//! 2. **Pilot and static balance.** Every client's first units are served for real
//!    (scheduled service) and measure what a unit costs a client and the servers on its
//!    path; then [`crate::balance`] shares the remaining units per host and per client, with
//!    the hosts that share a computer sharing its cores. Blocks are dealt in contiguous runs,
//!    host after host.
//! 3. **Service**, in one of three [`ServiceMode`]s: request/reply (a client asks for each
//!    unit; request type in the message body, one tag for everything), scheduled service (no
//!    requests at all: the server pushes each meta host's planned units, in order, to
//!    whichever of that host's clients has a receive posted for one), or
//!    dynamic (the plan's units as per-client queues, all kept by the root; a client with an
//!    empty queue takes the last unit of the client, of any server, predicted to finish last,
//!    when its measured rate and link say it will finish it sooner).
//!    A server has a sender thread per client it serves, so slow links do not hold up
//!    fast ones, and each client asks for (or is sent) its next unit while it computes the
//!    current one. Results (detected power, `[dm][chan][sample]`) go back to the server,
//!    which forwards other servers' to the root.
//! 4. **Search.** The root assembles the series ([`PowerAssembler`] sums channels in channel
//!    order, so arrival order does not matter), hands DMs round robin to the ranks of the
//!    data host for the periodicity search, concatenates their detections in DM order and
//!    sifts and folds exactly as [`search_series`](crate::search::search_series) does. The
//!    candidates are bit-for-bit those of the single-process search.

mod calibrate;
mod codec;
mod service;
pub mod stream;

use std::path::Path;
use std::time::Instant;

use metampi::topology::{Communicator, SimpleCommunicator};
use metampi::traits::*;
use metampi::Rank;
use serde::{Deserialize, Serialize};

pub use codec::DecodeError;

use crate::assemble::PowerAssembler;
use crate::balance::{self, Allocation, BalanceError, BalanceInput, HostModel, MachineModel};
use crate::band::Band;
use crate::dedisperse::{BlockPower, DedispersionPlan};
use crate::filterbank::{Filterbank, SubchannelReader};
use crate::format::BasebandReader;
use crate::search::{
    outcome_from_detections, BlockSource, SearchConfig, SearchError, SearchOutcome, SearchPlan,
};
use crate::voltages::Voltages;
use codec::Msg;

/// At most this many clients per server (the SC99 cure for a sender running out of buffers).
pub const MAX_CLIENTS_PER_SERVER: usize = 128;

/// How servers hand out units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceMode {
    /// The client asks for each unit; the server answers requests first come, first served.
    RequestReply,
    /// No requests: the server sends the units the plan gave each meta host, in order, to
    /// that host's clients, each unit to whichever client has room for it (a client keeps
    /// three receives posted, and on the data host the server's synchronous send completes
    /// when one matches; elsewhere the routers' flow control paces standard sends),
    /// so a client slower than its neighbours computes fewer units than the plan gave it.
    Scheduled,
    /// Starts from the static plan, then rebalances while running: clients ask for "a next
    /// unit", and the root server keeps every client's queue from the plan (other servers ask
    /// it). A client whose queue is empty takes the last unit of the client, of any host and
    /// any server, predicted to finish last, when its measured rate and link say it will
    /// finish that unit sooner; a client slower than the others declines its own queue once
    /// they could finish the job without it (`docs/psrsearch.md`, "Dynamic mode").
    Dynamic,
}

impl std::str::FromStr for ServiceMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "request" | "request-reply" | "rr" => Ok(ServiceMode::RequestReply),
            "scheduled" | "schedule" | "push" => Ok(ServiceMode::Scheduled),
            "dynamic" | "steal" => Ok(ServiceMode::Dynamic),
            _ => Err(format!(
                "unknown service mode `{s}`: expected `request`, `scheduled` or `dynamic`"
            )),
        }
    }
}

impl std::fmt::Display for ServiceMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ServiceMode::RequestReply => "request/reply",
            ServiceMode::Scheduled => "scheduled service",
            ServiceMode::Dynamic => "dynamic (work stealing)",
        })
    }
}

/// Settings of a distributed search.
#[derive(Clone, Debug)]
pub struct DistConfig {
    /// The search itself (identical to a single-process run's).
    pub search: SearchConfig,
    /// Request/reply or scheduled service.
    pub mode: ServiceMode,
    /// Clients per server (at most [`MAX_CLIENTS_PER_SERVER`]).
    pub clients_per_server: usize,
    /// The meta-computer description: host names and link bandwidths. Hosts it gives no
    /// bandwidth for (or all, without one) are measured.
    pub description: Option<metampi_config::Layout>,
    /// Probe every link at start-up even where the description gives a bandwidth, and plan
    /// with the lower of the described and the measured rate.
    pub measure_links: bool,
    /// Make the clients of one meta host (by name) sleep this many seconds after every unit,
    /// after calibration, so the host is slower than the plan believes (for testing the
    /// dynamic mode). Only the root's setting counts.
    pub slow_host: Option<(String, f64)>,
    /// Make one client (by world rank) sleep this many seconds after every unit, as
    /// `slow_host` does for a whole meta host (for testing how the scheduled service shares a
    /// meta host's units between its clients). Only the root's setting counts.
    pub slow_rank: Option<(Rank, f64)>,
}

impl DistConfig {
    /// Defaults for `search`: request/reply, 128 clients per server, links measured.
    pub fn new(search: SearchConfig) -> Self {
        DistConfig {
            search,
            mode: ServiceMode::RequestReply,
            clients_per_server: MAX_CLIENTS_PER_SERVER,
            description: None,
            measure_links: false,
            slow_host: None,
            slow_rank: None,
        }
    }
}

/// Why a distributed search failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// Reading, planning or assembling.
    #[error(transparent)]
    Search(#[from] SearchError),
    /// The load balance.
    #[error(transparent)]
    Balance(#[from] BalanceError),
    /// A message that does not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A communication call failed.
    #[error("communication failed: {0}")]
    Comm(#[from] metampi::Error),
    /// The job cannot be laid out.
    #[error("cannot distribute the search: {0}")]
    Layout(String),
    /// Rank 0 (the root server, or the stream's master) failed during set-up (its message).
    #[error("rank 0 failed to set up: {0}")]
    Root(String),
    /// A peer sent something the protocol does not allow there.
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// What the root reports while running.
#[derive(Clone, Debug)]
pub struct Progress {
    /// `calibrating`, `dedispersing`, `periodicity` or `folding`.
    pub phase: &'static str,
    /// Units (or DMs) done.
    pub done: u64,
    /// Of how many.
    pub total: u64,
    /// Per meta host: name, units done, units allocated.
    pub hosts: Vec<(String, u64, u64)>,
    /// Seconds since the service started.
    pub elapsed_s: f64,
}

/// Planned against measured, per meta host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    /// Meta host name.
    pub name: String,
    /// Client processes.
    pub clients: usize,
    /// Units the host's clients computed in the pilot, before the plan.
    #[serde(default)]
    pub pilot_units: u64,
    /// Units the plan allocated (after the pilot).
    pub units: u64,
    /// The plan's predicted finish time, s after the service started.
    pub predicted_s: f64,
    /// When the host's last client signed off (its last result received), s.
    pub measured_s: f64,
    /// Mean seconds per client spent dedispersing.
    pub busy_s: f64,
    /// Mean seconds per client spent waiting for data.
    pub idle_s: f64,
    /// Units the host's clients actually computed (differs from `units` in dynamic mode).
    pub done_units: u64,
    /// Mean CPU seconds per client spent on its units during the service (waits not counted;
    /// 0 where the OS does not say).
    #[serde(default)]
    pub cpu_s: f64,
}

/// Planned against done, per client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClientReport {
    /// World rank.
    pub rank: Rank,
    /// Its meta host.
    pub host: String,
    /// The server that served it.
    pub server: Rank,
    /// Units the plan gave it.
    pub units: u64,
    /// Units it computed: in dynamic mode units move between any clients, in scheduled
    /// service between the clients of one meta host (who take its units as they have room).
    pub done_units: u64,
    /// When it signed off, s after the service started.
    pub finish_s: f64,
}

/// What the root gets back.
#[derive(Debug)]
pub struct DistOutcome {
    /// The search result (the same as the single-process one).
    pub outcome: SearchOutcome,
    /// The static allocation used.
    pub allocation: Allocation,
    /// Per meta host, planned and measured.
    pub hosts: Vec<HostReport>,
    /// Per client, planned and done, in rank order.
    pub per_client: Vec<ClientReport>,
    /// The service mode.
    pub mode: ServiceMode,
    /// Servers and clients.
    pub servers: usize,
    /// Client processes.
    pub clients: usize,
    /// Seconds of the service phase (first unit out to last result in), after the pilot.
    pub service_s: f64,
    /// Seconds of the pilot (every client's first units, which measure what a unit costs).
    pub pilot_s: f64,
    /// CPU seconds every server process used during the service, root first (0 where the OS
    /// does not say).
    pub server_cpu_s: Vec<f64>,
    /// Seconds from the start of set-up to the ranked table.
    pub total_s: f64,
    /// Where each host's bandwidth came from, one line per remote host.
    pub link_notes: Vec<String>,
    /// What servers and routers were found to spend per unit.
    pub cost_note: String,
    /// CPU seconds the routers beside the root (emulated sites) used during the service,
    /// and the units remote hosts finished in it: what relaying cost, against the pilot's
    /// estimate in `cost_note`. `None` where the routers run elsewhere.
    pub relay_service: Option<(f64, u64)>,
}

/// Settings every rank needs, broadcast by the root.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Setup {
    band: Band,
    config: SearchConfig,
    nsamples: u64,
    mode: ServiceMode,
    /// Meta host whose clients sleep after every unit, and for how long.
    slow: Option<(usize, f64)>,
    /// One client (world rank) that sleeps after every unit, and for how long.
    #[serde(default)]
    slow_rank: Option<(Rank, f64)>,
}

/// What the plan predicts for one client of a meta host, in `Roles::site_list` order: the
/// dynamic mode's rates before any are measured.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub(crate) struct SiteCost {
    /// Seconds to compute one unit.
    pub unit_s: f64,
    /// Seconds to move one unit over the host's link (bytes / bandwidth + latency).
    pub transfer_s: f64,
}

/// Who does what; the same on every rank.
#[derive(Clone, Debug)]
pub(crate) struct Roles {
    /// Meta host of every rank.
    pub sites: Vec<usize>,
    /// The data host.
    pub data_site: usize,
    /// Server ranks, root first.
    pub servers: Vec<Rank>,
    /// Server of every client (`None` for servers).
    pub server_of: Vec<Option<Rank>>,
    /// Meta hosts in index order that have ranks.
    pub site_list: Vec<usize>,
}

impl Roles {
    fn discover(comm: &SimpleCommunicator, clients_per_server: usize) -> Result<Roles, DistError> {
        let size = comm.size();
        if size < 2 {
            return Err(DistError::Layout(format!(
                "a distributed search needs at least 2 ranks (a server and a client), got {size}"
            )));
        }
        let sites = (0..size)
            .map(|r| comm.meta_host_of(r))
            .collect::<Result<Vec<_>, _>>()?;
        let data_site = sites[0];
        let local: Vec<Rank> = (0..size)
            .filter(|&r| sites[r as usize] == data_site)
            .collect();
        // Servers s and clients c = size − s with s ≥ c / per_server.
        let per = clients_per_server.clamp(1, MAX_CLIENTS_PER_SERVER);
        let nservers = (size as usize).div_ceil(per + 1).max(1);
        if nservers > local.len() || nservers >= size as usize {
            return Err(DistError::Layout(format!(
                "{size} ranks need {nservers} server(s) at {per} clients each, but the data host \
                 has only {} rank(s)",
                local.len()
            )));
        }
        let servers: Vec<Rank> = local[..nservers].to_vec();
        let mut site_list: Vec<usize> = sites.clone();
        site_list.sort_unstable();
        site_list.dedup();
        // Clients in (meta host, rank) order, dealt to the servers round robin so every server
        // gets a share of every host.
        let mut clients: Vec<Rank> = (0..size).filter(|r| !servers.contains(r)).collect();
        clients.sort_by_key(|&r| (sites[r as usize], r));
        let mut server_of = vec![None; size as usize];
        for (k, &c) in clients.iter().enumerate() {
            server_of[c as usize] = Some(servers[k % nservers]);
        }
        Ok(Roles {
            sites,
            data_site,
            servers,
            server_of,
            site_list,
        })
    }

    fn root(&self) -> Rank {
        self.servers[0]
    }

    /// Clients of a meta host, ascending.
    fn clients_on(&self, site: usize) -> Vec<Rank> {
        (0..self.sites.len() as Rank)
            .filter(|&r| self.sites[r as usize] == site && self.server_of[r as usize].is_some())
            .collect()
    }
}

/// Run the search over every rank of `world` (collective). `file` is read on the data host
/// only. The root server gets `Some`; every other rank `None`.
///
/// # Errors
/// On every rank: set-up failures of the root (unreadable file, bad plan), too few ranks.
/// On the rank where it happens: communication failures and malformed messages.
pub fn search_distributed(
    world: &SimpleCommunicator,
    file: &Path,
    config: &DistConfig,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Option<DistOutcome>, DistError> {
    let started = Instant::now();
    // A private context: nothing the caller sends can match our wildcard receives.
    let comm = world.duplicate();
    let roles = Roles::discover(&comm, config.clients_per_server)?;
    let me = comm.rank();
    let is_root = me == roles.root();

    // Set-up: the root reads the header and plans; everyone learns the result.
    let mut blob = Vec::new();
    let mut reader = None;
    if is_root {
        let setup = BasebandReader::open(file)
            .map_err(SearchError::from)
            .and_then(|r| {
                // Planned for this file's length, as every rank's copy of the plan will be.
                let mut search = config.search.clone();
                search.plan.data_len = Some(r.nsamples());
                // The root holds every DM's series until it assembles them: those of the
                // sub-channels where channels are split.
                let p = SearchPlan::new(r.band(), r.nsamples(), &search)?;
                p.plan.check_series_memory(p.nsamples)?;
                Ok((r, search))
            });
        blob = match setup {
            Ok((r, search)) => {
                let slow = config.slow_host.as_ref().and_then(|(name, secs)| {
                    roles
                        .site_list
                        .iter()
                        .find(|&&s| site_name(config.description.as_ref(), s) == *name)
                        .map(|&s| (s, *secs))
                });
                let s = Setup {
                    band: r.band().clone(),
                    config: search,
                    nsamples: r.nsamples(),
                    mode: config.mode,
                    slow,
                    slow_rank: config.slow_rank,
                };
                reader = Some(r);
                let mut b = vec![1u8];
                b.extend(serde_json::to_vec(&s).map_err(|e| DistError::Root(e.to_string()))?);
                b
            }
            Err(e) => {
                let mut b = vec![0u8];
                b.extend(error_chain(&e).into_bytes());
                b
            }
        };
    }
    broadcast_bytes(&comm, roles.root(), &mut blob);
    let setup: Setup = match blob.split_first() {
        Some((1, json)) => serde_json::from_slice(json)
            .map_err(|e| DistError::Protocol(format!("set-up message: {e}")))?,
        Some((_, msg)) => return Err(DistError::Root(String::from_utf8_lossy(msg).into())),
        None => return Err(DistError::Protocol("empty set-up message".into())),
    };
    // Every rank plans as the single-process search does: where channels are split, units are
    // blocks of the sub-channels, which the servers make (decision 0065), and the clients
    // dedisperse them as they would the file's.
    let SearchPlan {
        plan,
        filterbank,
        nsamples,
    } = SearchPlan::new(&setup.band, setup.nsamples, &setup.config)?;
    let nblocks = plan.num_blocks(nsamples);
    if nblocks == 0 {
        return Err(SearchError::too_short(&plan, nsamples).into());
    }
    let is_client = roles.server_of[me as usize].is_some();

    // Calibration: every client computes synthetic units for the same window (warmed up
    // before the barrier), so each sees the contention of the run; every rank says which
    // computer it is on and how many cores it may use.
    if is_root {
        progress(&Progress {
            phase: "calibrating",
            done: 0,
            total: nblocks,
            hosts: Vec::new(),
            elapsed_s: 0.0,
        });
    }
    let mut bench = is_client.then(|| calibrate::UnitBench::new(&plan, filterbank.is_none()));
    // Per window: wall and CPU seconds per unit (NaN CPU where the OS does not say), then
    // this rank's cores.
    let mut mine = Vec::with_capacity(2 * CALIBRATION_WINDOWS + 1);
    for _ in 0..CALIBRATION_WINDOWS {
        comm.barrier();
        let cost = bench
            .as_mut()
            .map(|b| b.run(CALIBRATION_WINDOW_S, CALIBRATION_MIN_UNITS));
        mine.push(cost.map_or(0.0, |c| c.wall_s));
        mine.push(cost.and_then(|c| c.cpu_s).unwrap_or(f64::NAN));
    }
    mine.push(calibrate::cores() as f64);
    let size = comm.size() as usize;
    let per = mine.len();
    let mut measured = vec![0.0f64; per * size];
    comm.all_gather_into(&mine[..], &mut measured[..]);
    let mut keys = vec![0u64; size];
    comm.all_gather_into(&calibrate::machine_key(), &mut keys[..]);
    let calibration: Vec<RankCalibration> = (0..size)
        .map(|r| {
            let m = &measured[per * r..per * (r + 1)];
            let windows: Vec<(f64, f64)> = m[..2 * CALIBRATION_WINDOWS]
                .chunks_exact(2)
                .map(|w| (w[0], w[1]))
                .collect();
            let known = windows.iter().all(|&(_, c)| c.is_finite() && c > 0.0);
            let n = windows.len() as f64;
            RankCalibration {
                wall_s: windows.iter().map(|w| w.0).sum::<f64>() / n,
                cpu_s: known.then(|| windows.iter().map(|w| w.1).sum::<f64>() / n),
                shares: windows
                    .iter()
                    .map(|&(w, c)| {
                        if known {
                            (c / w.max(1e-12)).clamp(0.0, 1.0)
                        } else {
                            0.0
                        }
                    })
                    .collect(),
                cores: m[per - 1],
                machine: keys[r],
            }
        })
        .collect();

    // Links: from the description where it gives a bandwidth; probed where it gives none, and
    // everywhere with `measure_links` (then the description, if any, is the ceiling).
    let (links, notes) = link_models(
        &comm,
        &roles,
        config.description.as_ref(),
        config.measure_links,
    )?;

    // Pilot: every client's first units, served for real (scheduled service), so the plan
    // knows what a unit costs a client and the servers on the path it will take — receiving,
    // decoding, computing, encoding, sending and waiting included — under the load of the run.
    let names: Vec<String> = roles
        .site_list
        .iter()
        .map(|&s| site_name(config.description.as_ref(), s))
        .collect();
    let slow_s = setup
        .slow
        .filter(|&(s, _)| s == roles.sites[me as usize])
        .map_or(0.0, |(_, secs)| secs)
        + setup
            .slow_rank
            .filter(|&(r, _)| r == me)
            .map_or(0.0, |(_, secs)| secs);
    let mut workspace = bench.map(calibrate::UnitBench::into_workspace);
    let run = ServiceRun {
        roles: &roles,
        plan: &plan,
        filterbank: filterbank.as_ref(),
        file,
        names: &names,
        slow_s,
    };
    let pilot_assignment = pilot_assignment(&roles, nblocks);
    let pilot_total: u64 = pilot_assignment.iter().map(|u| u.len() as u64).sum();
    let mut pilot = None;
    // The routers' CPU during the pilot, where they run beside the ranks on this machine
    // (emulated sites): what relaying a unit and its result costs them.
    let routers = if is_root {
        calibrate::sibling_routers()
    } else {
        Vec::new()
    };
    let mut relay_cpu_s = None;
    if pilot_total > 0 {
        if is_root {
            progress(&Progress {
                phase: "pilot",
                done: 0,
                total: pilot_total,
                hosts: Vec::new(),
                elapsed_s: 0.0,
            });
        }
        comm.barrier();
        let t = Instant::now();
        let relay0 = calibrate::processes_cpu_s(&routers);
        let served = run.serve(
            &comm,
            &pilot_assignment,
            ServiceMode::Scheduled,
            &[],
            workspace.as_mut(),
            t,
            "pilot",
            &mut |_| {},
        )?;
        if !routers.is_empty() {
            relay_cpu_s = Some(calibrate::processes_cpu_s(&routers) - relay0);
        }
        pilot = served.map(|s| (s, t.elapsed().as_secs_f64()));
    }

    // The balance of the remaining units, made at the root and broadcast as per-rank lists.
    let mut assignment_blob = Vec::new();
    let mut cost_blob = Vec::new();
    let mut allocation = None;
    let mut cost_note = String::new();
    if is_root {
        let r = reader
            .as_mut()
            .ok_or_else(|| DistError::Protocol("root without its reader".into()))?;
        let reads = match &filterbank {
            None => measure_reads(r, &plan, nblocks)?,
            Some(fb) => measure_reads(&mut SubchannelReader::new(r, fb.clone()), &plan, nblocks)?,
        };
        let bytes = reads.unit_bytes + result_bytes(&plan) as f64;
        let hop_s = calibrate::socket_cost_per_byte().unwrap_or(0.0) * bytes;
        let mut costs = unit_costs(
            &calibration,
            pilot.as_ref().map(|(s, _)| s),
            reads.cpu_s + calibrate::result_decode_s(&plan),
            hop_s,
        );
        let remote_pilot_units = pilot_assignment
            .iter()
            .enumerate()
            .filter(|&(r, _)| roles.sites[r] != roles.data_site)
            .map(|(_, u)| u.len() as u64)
            .sum::<u64>();
        if let Some(cpu) = relay_cpu_s.filter(|_| remote_pilot_units > 0) {
            costs.relay_here_s = Some(cpu / remote_pilot_units as f64);
        }
        cost_note = format!(
            "CPU per unit: servers {:.2} ms ({}), routers {} per unit from a remote host",
            costs.server_s * 1e3,
            if pilot.is_some() {
                "pilot"
            } else {
                "reading and decoding measured"
            },
            match costs.relay_here_s {
                Some(r) => format!(
                    "{:.2} ms (pilot, {} router processes here)",
                    r * 1e3,
                    routers.len()
                ),
                None => format!(
                    "{:.2} ms (a loopback socket hop each)",
                    2.0 * costs.hop_s * 1e3
                ),
            }
        );
        if let Some((p, _)) = &pilot {
            cost_note.push_str(&pilot_note(&roles, &names, &calibration, p));
        }
        let input = balance_input(
            &roles,
            &calibration,
            &links,
            &costs,
            config.description.as_ref(),
            BalanceInput {
                hosts: Vec::new(),
                units: nblocks - pilot_total,
                unit_bytes: reads.unit_bytes,
                result_bytes: result_bytes(&plan) as f64,
                disk_rate: reads.rate,
                n_slopes: plan.dms().len(),
                machines: Vec::new(),
            },
        );
        let alloc = balance::allocate(&input)?;
        let mut units: Vec<Vec<u64>> = vec![Vec::new(); comm.size() as usize];
        let mut next = pilot_total;
        for (k, &s) in roles.site_list.iter().enumerate() {
            for (c, n) in roles.clients_on(s).iter().zip(&alloc.hosts[k].per_client) {
                units[*c as usize] = (next..next + n).collect();
                next += n;
            }
        }
        for u in &units {
            assignment_blob.extend((u.len() as u64).to_le_bytes());
            for b in u {
                assignment_blob.extend(b.to_le_bytes());
            }
        }
        let site_costs: Vec<SiteCost> = alloc
            .input
            .hosts
            .iter()
            .zip(&alloc.hosts)
            .map(|(h, a)| SiteCost {
                unit_s: a.unit_s,
                transfer_s: h.bandwidth.map_or(0.0, |bw| reads.unit_bytes / bw.max(1.0))
                    + h.latency_s,
            })
            .collect();
        cost_blob = serde_json::to_vec(&site_costs).map_err(|e| DistError::Root(e.to_string()))?;
        allocation = Some(alloc);
    }
    broadcast_bytes(&comm, roles.root(), &mut assignment_blob);
    let assignment = decode_assignment(&assignment_blob, comm.size() as usize, nblocks)?;
    broadcast_bytes(&comm, roles.root(), &mut cost_blob);
    let costs: Vec<SiteCost> = serde_json::from_slice(&cost_blob)
        .map_err(|e| DistError::Protocol(format!("plan costs: {e}")))?;

    // Service.
    comm.barrier();
    let t0 = Instant::now();
    let relay0 = calibrate::processes_cpu_s(&routers);
    let served = run.serve(
        &comm,
        &assignment,
        setup.mode,
        &costs,
        workspace.as_mut(),
        t0,
        "dedispersing",
        progress,
    )?;
    let service_s = t0.elapsed().as_secs_f64();
    let relay_s = calibrate::processes_cpu_s(&routers) - relay0;

    // Periodicity search on the data host, DMs dealt round robin; sifting at the root.
    let workers: Vec<Rank> = (0..comm.size())
        .filter(|&r| roles.sites[r as usize] == roles.data_site)
        .collect();
    let Some(served) = served.filter(|_| is_root) else {
        if workers.contains(&me) {
            service::periodicity_worker(&comm, roles.root(), &setup.config)?;
        }
        return Ok(None);
    };
    let mut assembler = PowerAssembler::for_input(&plan, nsamples);
    let pilot_results = pilot.iter().flat_map(|(p, _)| &p.results);
    for b in pilot_results.chain(&served.results) {
        assembler.insert(b).map_err(SearchError::from)?;
    }
    let mut series = assembler.finish().map_err(SearchError::from)?;
    let masked = crate::search::clean_series(&mut series, &setup.config);
    let t_p = Instant::now();
    let detections =
        service::periodicity_root(&comm, &workers, &series, &setup.config, progress, t0)?;
    let periodicity_s = t_p.elapsed().as_secs_f64();
    progress(&Progress {
        phase: "folding",
        done: 0,
        total: 1,
        hosts: Vec::new(),
        elapsed_s: t0.elapsed().as_secs_f64(),
    });
    let mut outcome = outcome_from_detections(&series, detections, &setup.config, periodicity_s);
    outcome.timings.dedisperse_s = service_s;
    outcome.complex_samples = plan.complex_samples(nsamples);
    outcome.masked = masked;
    let metadata = reader
        .as_ref()
        .map(|r| r.metadata().clone())
        .unwrap_or_default();
    outcome.describe(
        &series,
        Some(&assembler),
        plan.band(),
        &metadata,
        &setup.config,
    );
    let allocation =
        allocation.ok_or_else(|| DistError::Protocol("root without its allocation".into()))?;
    let hosts = roles
        .site_list
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            let clients = roles.clients_on(s);
            let stats: Vec<&service::ClientStats> = served
                .clients
                .iter()
                .filter(|c| clients.contains(&c.rank))
                .collect();
            let n = stats.len().max(1) as f64;
            let pilot_units = pilot.as_ref().map_or(0, |(p, _)| {
                p.clients
                    .iter()
                    .filter(|c| clients.contains(&c.rank))
                    .map(|c| c.units)
                    .sum()
            });
            HostReport {
                name: allocation.input.hosts[k].name.clone(),
                clients: clients.len(),
                pilot_units,
                units: allocation.hosts[k].units,
                predicted_s: allocation.hosts[k].predicted_s,
                measured_s: stats.iter().map(|c| c.finish_s).fold(0.0, f64::max),
                busy_s: stats.iter().map(|c| c.busy_s).sum::<f64>() / n,
                idle_s: stats.iter().map(|c| c.idle_s).sum::<f64>() / n,
                done_units: stats.iter().map(|c| c.units).sum(),
                cpu_s: stats.iter().map(|c| c.cpu_s).sum::<f64>() / n,
            }
        })
        .collect();
    let mut per_client: Vec<ClientReport> = served
        .clients
        .iter()
        .map(|c| ClientReport {
            rank: c.rank,
            host: site_name(config.description.as_ref(), roles.sites[c.rank as usize]),
            server: roles.server_of[c.rank as usize].unwrap_or(roles.root()),
            units: assignment[c.rank as usize].len() as u64,
            done_units: c.units,
            finish_s: c.finish_s,
        })
        .collect();
    per_client.sort_by_key(|c| c.rank);
    let mut server_cpu_s = vec![served.cpu_s];
    server_cpu_s.extend(served.server_cpu_s.iter().copied());
    let remote_units = served
        .clients
        .iter()
        .filter(|c| roles.sites[c.rank as usize] != roles.data_site)
        .map(|c| c.units)
        .sum::<u64>();
    Ok(Some(DistOutcome {
        outcome,
        allocation,
        hosts,
        per_client,
        mode: setup.mode,
        servers: roles.servers.len(),
        clients: roles.server_of.iter().filter(|s| s.is_some()).count(),
        service_s,
        pilot_s: pilot.as_ref().map_or(0.0, |(_, t)| *t),
        server_cpu_s,
        total_s: started.elapsed().as_secs_f64(),
        link_notes: notes,
        cost_note,
        relay_service: (!routers.is_empty()).then_some((relay_s, remote_units)),
    }))
}

/// Seconds of a calibration window every client computes for (at least
/// [`CALIBRATION_MIN_UNITS`] units): long against the scheduler's time slices, so the share
/// of a core each client gets is an average, short against the run.
const CALIBRATION_WINDOW_S: f64 = 0.2;

/// Calibration windows, a barrier apart; the cores the job gets are those of the best one.
const CALIBRATION_WINDOWS: usize = 2;

/// Units every client computes in the calibration window at the least.
const CALIBRATION_MIN_UNITS: usize = 2;

/// Units of every client in the pilot. One unit's CPU varies by ±20% from unit to unit
/// (10-22 ms on the 2-core machine), so a client's mean over 3 was off by 10-50% from what
/// its units then cost; over 6 the demo's plan met 15% in 25 of 36 runs against 21 of 36,
/// at no cost in total time (the service is shorter by what the pilot adds).
const PILOT_UNITS: usize = 6;

/// Every client's pilot units, [`PILOT_UNITS`] each (`PSRSEARCH_PILOT_UNITS` sets another
/// number) from block 0 in (meta host, rank) order, or none for a job too small to spare them
/// (the pilot may take at most half the blocks).
fn pilot_assignment(roles: &Roles, nblocks: u64) -> Vec<Vec<u64>> {
    let mut out = vec![Vec::new(); roles.sites.len()];
    let per = std::env::var("PSRSEARCH_PILOT_UNITS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(PILOT_UNITS);
    let clients: Vec<Rank> = roles
        .site_list
        .iter()
        .flat_map(|&s| roles.clients_on(s))
        .collect();
    if 2 * (per * clients.len()) as u64 > nblocks {
        return out;
    }
    for (k, &c) in clients.iter().enumerate() {
        let first = (k * per) as u64;
        out[c as usize] = (first..first + per as u64).collect();
    }
    out
}

/// What one service (the pilot or the main one) needs besides its units.
struct ServiceRun<'a> {
    roles: &'a Roles,
    plan: &'a DedispersionPlan,
    /// What the servers read the plan's blocks through, where channels are split.
    filterbank: Option<&'a Filterbank>,
    file: &'a Path,
    /// Meta host names, in `roles.site_list` order.
    names: &'a [String],
    /// Seconds this rank sleeps after every unit (the emulated slow host).
    slow_s: f64,
}

impl ServiceRun<'_> {
    /// Clients compute `assignment`, servers serve it; servers get what they collected.
    #[allow(clippy::too_many_arguments)]
    fn serve(
        &self,
        comm: &SimpleCommunicator,
        assignment: &[Vec<u64>],
        mode: ServiceMode,
        costs: &[SiteCost],
        workspace: Option<&mut crate::dedisperse::Workspace>,
        t0: Instant,
        phase: &'static str,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<Option<Served>, DistError> {
        let me = comm.rank();
        if let Some(server) = self.roles.server_of[me as usize] {
            let ws = workspace
                .ok_or_else(|| DistError::Protocol("a client without its workspace".into()))?;
            service::client(
                comm,
                self.plan,
                ws,
                server,
                &assignment[me as usize],
                mode,
                self.slow_s,
            )?;
            return Ok(None);
        }
        Ok(Some(service::server(
            comm,
            &service::ServerJob {
                roles: self.roles,
                assignment,
                file: self.file,
                plan: self.plan,
                filterbank: self.filterbank,
                mode,
                t0,
                names: self.names,
                costs,
                phase,
            },
            progress,
        )?))
    }
}

/// What one rank measured at start-up.
#[derive(Clone, Debug)]
struct RankCalibration {
    /// Wall seconds per unit while every client computed (0 for servers).
    wall_s: f64,
    /// CPU seconds per unit, where the OS says (clients only).
    cpu_s: Option<f64>,
    /// Per calibration window, the share of a core the client got (CPU over wall).
    shares: Vec<f64>,
    /// Cores the rank may run on.
    cores: f64,
    /// Which computer it is on ([`calibrate::machine_key`]).
    machine: u64,
}

/// What a unit costs in CPU, everything included.
struct UnitCosts {
    /// Per rank: CPU seconds per unit of that client, where known.
    client_s: Vec<Option<f64>>,
    /// CPU seconds per unit of all servers together.
    server_s: f64,
    /// CPU seconds of one socket hop for a unit and its result (what a router spends, as a
    /// loopback transfer measures it).
    hop_s: f64,
    /// CPU seconds the routers beside the root (on its machine) spent per remote unit in the
    /// pilot, where they were found: what relaying really costs them, framing, shaping and
    /// wake-ups included (about eight socket hops' worth here).
    relay_here_s: Option<f64>,
}

/// Per meta host, what the pilot and the calibration said a unit costs its clients (CPU
/// seconds, mean over clients) and how long they waited for data in the pilot: the two
/// estimates side by side tell a disturbed measurement from a real difference.
fn pilot_note(roles: &Roles, names: &[String], cal: &[RankCalibration], pilot: &Served) -> String {
    let mut out = String::from(
        "\npilot per host (CPU s per unit: pilot / calibration; wait for data s; other s per unit):",
    );
    for (k, &s) in roles.site_list.iter().enumerate() {
        let stats: Vec<&service::ClientStats> = pilot
            .clients
            .iter()
            .filter(|c| roles.sites[c.rank as usize] == s && c.units > 0)
            .collect();
        if stats.is_empty() {
            continue;
        }
        let n = stats.len() as f64;
        let per_unit = stats.iter().map(|c| c.cpu_s / c.units as f64).sum::<f64>() / n;
        let wait = stats.iter().map(|c| c.idle_s).sum::<f64>() / n;
        let other = stats
            .iter()
            .map(|c| (c.finish_s - c.idle_s - c.cpu_s) / c.units as f64)
            .sum::<f64>()
            / n;
        let synthetic: Vec<f64> = stats
            .iter()
            .filter_map(|c| cal[c.rank as usize].cpu_s)
            .collect();
        let synthetic = if synthetic.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{:.4}",
                synthetic.iter().sum::<f64>() / synthetic.len() as f64
            )
        };
        let name = names.get(k).map_or("?", String::as_str);
        out.push_str(&format!(
            " {name} {per_unit:.4} / {synthetic}; {wait:.3}; {other:.4}"
        ));
    }
    out
}

/// Per-unit CPU costs. A client's is the mean of two estimates where it has both: the
/// pilot's (its thread CPU over the units it did) and the calibration's (its synthetic units,
/// plus its end of the transfers, `hop_s`). The servers' is the pilot's (their metered
/// threads over the pilot's units), else the root's measured reading (`server_read_s`) plus
/// its end of the transfers.
///
/// Why a client's two estimates are averaged: each is a few units taken in well under a
/// second, and a virtual machine's speed drifts over seconds, the same for every client on
/// it. Over 56 searches of `bench/psr_plan.sh` on the 2-core machine (168 host-runs), the
/// pilot's estimate missed what the service's units then cost by 8.8% on average (at worst
/// 51%: a slow spell during the pilot, after which the plan overloaded the link-bound host and
/// the others finished 24-40% early), the calibration's by 8.7% (worst 30%), their mean by 6.8%
/// (worst 22%), with no bias (+0.4%; pilot +3.4%, calibration -2.6%).
fn unit_costs(
    cal: &[RankCalibration],
    pilot: Option<&Served>,
    server_read_s: f64,
    hop_s: f64,
) -> UnitCosts {
    let synthetic = |r: usize| cal[r].cpu_s.map(|c| c + 0.5 * hop_s);
    let mut client_s: Vec<Option<f64>> = (0..cal.len()).map(synthetic).collect();
    let mut server_s = server_read_s + 0.5 * hop_s;
    if let Some(p) = pilot {
        for c in &p.clients {
            let r = c.rank as usize;
            if c.cpu_s > 0.0 && c.units > 0 && r < cal.len() {
                let measured = c.cpu_s / c.units as f64;
                client_s[r] = Some(synthetic(r).map_or(measured, |s| 0.5 * (measured + s)));
            }
        }
        let units: u64 = p.clients.iter().map(|c| c.units).sum();
        let cpu = p.cpu_s + p.server_cpu_s.iter().sum::<f64>();
        if units > 0 && cpu > 0.0 {
            server_s = cpu / units as f64;
        }
    }
    UnitCosts {
        client_s,
        server_s,
        hop_s,
        relay_here_s: None,
    }
}

/// The balance's view of the job: per meta host its clients, their cost per unit and link;
/// per computer (meta hosts that share one, found from the ranks' machine keys) the cores the
/// job got in the calibration and what servers and routers spend there per unit.
///
/// Where a client's CPU time is unknown its hosts fall back to the paper's model with the
/// wall time per unit under full load as `t_proc`.
fn balance_input(
    roles: &Roles,
    cal: &[RankCalibration],
    links: &[LinkModel],
    costs: &UnitCosts,
    layout: Option<&metampi_config::Layout>,
    mut input: BalanceInput,
) -> BalanceInput {
    let sites = &roles.site_list;
    // Group meta hosts that share a computer: union of hosts whose ranks share a key.
    let mut group: Vec<usize> = (0..sites.len()).collect();
    let find = |g: &[usize], mut i: usize| {
        while g[i] != i {
            i = g[i];
        }
        i
    };
    let site_index = |r: usize| sites.iter().position(|&s| s == roles.sites[r]).unwrap_or(0);
    for a in 0..cal.len() {
        for b in a + 1..cal.len() {
            if cal[a].machine == cal[b].machine {
                let (ra, rb) = (find(&group, site_index(a)), find(&group, site_index(b)));
                if ra != rb {
                    group[ra.max(rb)] = ra.min(rb);
                }
            }
        }
    }
    let roots: Vec<usize> = (0..sites.len())
        .map(|k| find(&group, k))
        .collect::<Vec<_>>();
    let mut machine_roots: Vec<usize> = roots.clone();
    machine_roots.sort_unstable();
    machine_roots.dedup();
    let data_k = sites
        .iter()
        .position(|&s| s == roles.data_site)
        .unwrap_or(0);
    // A machine is modelled when every client on it reported its CPU time.
    let modelled: Vec<bool> = machine_roots
        .iter()
        .map(|&g| {
            (0..cal.len())
                .filter(|&r| roles.server_of[r].is_some() && roots[site_index(r)] == g)
                .all(|r| cal[r].cpu_s.is_some() && costs.client_s[r].is_some())
        })
        .collect();
    let machine_of = |k: usize| machine_roots.iter().position(|&g| g == roots[k]);
    for (k, &s) in sites.iter().enumerate() {
        let clients = roles.clients_on(s);
        let m = machine_of(k).filter(|&m| modelled[m]);
        let mean = |f: &dyn Fn(&RankCalibration) -> f64| {
            clients.iter().map(|&c| f(&cal[c as usize])).sum::<f64>() / clients.len().max(1) as f64
        };
        let proc_s = if clients.is_empty() {
            1.0
        } else if m.is_some() {
            clients
                .iter()
                .map(|&c| costs.client_s[c as usize].unwrap_or(cal[c as usize].wall_s))
                .sum::<f64>()
                / clients.len() as f64
        } else {
            mean(&|c| c.wall_s)
        };
        let l = links.iter().find(|l| l.site == s);
        input.hosts.push(HostModel {
            name: site_name(layout, s),
            clients: clients.len(),
            proc_s,
            bandwidth: l.and_then(|l| l.bandwidth),
            return_bandwidth: l.and_then(|l| l.return_bandwidth),
            latency_s: l.map_or(0.0, |l| l.latency_s),
            machine: m,
        });
    }
    for (m, &g) in machine_roots.iter().enumerate() {
        if !modelled[m] {
            continue;
        }
        // Cores: what every client got while all computed, plus the cores they left idle.
        let mut keys: Vec<u64> = (0..cal.len())
            .filter(|&r| roots[site_index(r)] == g)
            .map(|r| cal[r].machine)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut got = 0.0;
        for key in keys {
            let ranks: Vec<usize> = (0..cal.len()).filter(|&r| cal[r].machine == key).collect();
            let clients: Vec<usize> = ranks
                .iter()
                .copied()
                .filter(|&r| roles.server_of[r].is_some())
                .collect();
            let c = ranks.iter().map(|&r| cal[r].cores).fold(f64::MAX, f64::min);
            // The best window: another user's burst of work during one of them says nothing
            // about the run, and the job never gets more than its cores.
            let used = (0..CALIBRATION_WINDOWS)
                .map(|k| {
                    clients
                        .iter()
                        .map(|&r| cal[r].shares.get(k).copied().unwrap_or(0.0))
                        .sum::<f64>()
                })
                .fold(0.0, f64::max);
            got += (used + (c - clients.len() as f64).max(0.0)).min(c);
        }
        let overhead_s = (0..sites.len())
            .map(|i| {
                let remote = sites[i] != roles.data_site;
                match costs.relay_here_s {
                    // Measured: every router on the data host's machine, whichever side of
                    // the link it serves; a far router elsewhere costs a socket hop there.
                    Some(relay) => {
                        let mut o = 0.0;
                        if roots[data_k] == g {
                            o += costs.server_s + if remote { relay } else { 0.0 };
                        }
                        if remote && roots[i] == g && roots[i] != roots[data_k] {
                            o += costs.hop_s;
                        }
                        o
                    }
                    None => overhead_s(
                        remote,
                        roots[data_k] == g,
                        roots[i] == g,
                        costs.server_s,
                        costs.hop_s,
                    ),
                }
            })
            .collect();
        input.machines.push(MachineModel {
            name: sites
                .iter()
                .enumerate()
                .filter(|&(k, _)| roots[k] == g)
                .map(|(_, &s)| site_name(layout, s))
                .collect::<Vec<_>>()
                .join("+"),
            cores: got.max(1e-3),
            overhead_s,
        });
    }
    // Machine indices were taken among all groups; renumber to the modelled ones.
    let renumber: Vec<Option<usize>> = modelled
        .iter()
        .scan(0usize, |next, &m| {
            Some(if m {
                *next += 1;
                Some(*next - 1)
            } else {
                None
            })
        })
        .collect();
    for h in &mut input.hosts {
        h.machine = h.machine.and_then(|m| renumber[m]);
    }
    input
}

/// The name of meta host `site`: from the description, else `site N`.
fn site_name(layout: Option<&metampi_config::Layout>, site: usize) -> String {
    layout
        .and_then(|l| l.hosts.get(site))
        .map_or_else(|| format!("site {site}"), |h| h.name.clone())
}

/// One remote host's link as the balance uses it.
#[derive(Clone, Debug)]
struct LinkModel {
    site: usize,
    bandwidth: Option<f64>,
    return_bandwidth: Option<f64>,
    latency_s: f64,
}

/// Bandwidths and latencies of every remote host's links: from the description where it gives
/// a `BANDWIDTH` for every link of the PAIR, otherwise measured (collective). With `measure`,
/// every link is probed, and where the description gives a bandwidth the plan takes the lower
/// of the two: a link never carries more than it is built for, and may carry less (a slower
/// route than described, other traffic, a router short of CPU).
fn link_models(
    comm: &SimpleCommunicator,
    roles: &Roles,
    layout: Option<&metampi_config::Layout>,
    measure: bool,
) -> Result<(Vec<LinkModel>, Vec<String>), DistError> {
    let mut models = Vec::new();
    let mut notes = Vec::new();
    let mut to_probe: Vec<Rank> = Vec::new();
    let mut ceilings: Vec<LinkModel> = Vec::new();
    for &s in &roles.site_list {
        if s == roles.data_site {
            continue;
        }
        let described = layout.and_then(|l| {
            let sum = |from, to| -> Option<(f64, f64)> {
                let links: Vec<_> = l.links_between(from, to).collect();
                if links.is_empty() {
                    return None;
                }
                let mut bw = 0.0;
                let mut lat: f64 = 0.0;
                for k in links {
                    bw += k.options.bandwidth?.bytes_per_sec() as f64;
                    lat = lat.max(k.options.latency.map_or(0.0, |d| d.as_secs_f64()));
                }
                Some((bw, lat))
            };
            let (bw, lat) = sum(roles.data_site, s)?;
            let back = sum(s, roles.data_site).map(|(b, _)| b);
            Some(LinkModel {
                site: s,
                bandwidth: Some(bw),
                return_bandwidth: back.or(Some(bw)),
                latency_s: lat,
            })
        });
        match described {
            Some(m) if !measure => {
                notes.push(format!(
                    "{}: {:.2} MB/s out, {:.2} MB/s back, latency {:.1} ms (description)",
                    site_name(layout, s),
                    m.bandwidth.unwrap_or(0.0) / 1e6,
                    m.return_bandwidth.unwrap_or(0.0) / 1e6,
                    m.latency_s * 1e3
                ));
                models.push(m);
            }
            _ => {
                if let Some(m) = described {
                    ceilings.push(m);
                }
                if let Some(&c) = roles.clients_on(s).first() {
                    to_probe.push(c);
                }
            }
        }
    }
    // Everyone learns whom the root probes (the same on every rank already, but the root is
    // the one that decides, so broadcast it).
    let mut list: Vec<u8> = to_probe.iter().flat_map(|r| r.to_le_bytes()).collect();
    broadcast_bytes(comm, roles.root(), &mut list);
    let probed: Vec<Rank> = list
        .chunks_exact(4)
        .map(|c| Rank::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let me = comm.rank();
    if me == roles.root() {
        for &c in &probed {
            let (bw, lat) = service::probe(comm, c)?;
            let s = roles.sites[c as usize];
            let m = match ceilings.iter().find(|m| m.site == s) {
                Some(d) => {
                    let cap = d.bandwidth.unwrap_or(f64::INFINITY);
                    notes.push(format!(
                        "{}: {:.2} MB/s measured with rank {c} (described {:.2}), latency {:.1} \
                         ms measured (described {:.1})",
                        site_name(layout, s),
                        bw / 1e6,
                        cap / 1e6,
                        lat * 1e3,
                        d.latency_s * 1e3
                    ));
                    LinkModel {
                        site: s,
                        bandwidth: Some(bw.min(cap)),
                        return_bandwidth: Some(bw.min(d.return_bandwidth.unwrap_or(f64::INFINITY))),
                        latency_s: lat.max(d.latency_s),
                    }
                }
                None => {
                    notes.push(format!(
                        "{}: {:.2} MB/s, latency {:.1} ms (measured with rank {c})",
                        site_name(layout, s),
                        bw / 1e6,
                        lat * 1e3
                    ));
                    LinkModel {
                        site: s,
                        bandwidth: Some(bw),
                        return_bandwidth: Some(bw),
                        latency_s: lat,
                    }
                }
            };
            models.push(m);
        }
    } else if probed.contains(&me) {
        service::echo(comm, roles.root())?;
    }
    Ok((models, notes))
}

/// CPU seconds per unit of a host spent on one machine by others than its clients. Servers
/// (`server_s`: reading, encoding, taking results, their end of each transfer) run on the
/// data host's machine (`data_here`); a remote host's units also pass two routers, a full
/// socket hop of CPU each (`hop_s`: one end reads, the other writes): the data host's router
/// runs by the servers, the far one on the host's own machine (`host_here`).
fn overhead_s(remote: bool, data_here: bool, host_here: bool, server_s: f64, hop_s: f64) -> f64 {
    let mut o = 0.0;
    if data_here {
        o += server_s;
        if remote {
            o += hop_s;
        }
    }
    if remote && host_here {
        o += hop_s;
    }
    o
}

/// Put every meta host of `input` on one machine whose cores the job gets `cores` of (an
/// emulated metacomputer, for `psrsearch plan`): each host's `proc_s` (CPU per unit) gains its
/// clients' end of each transfer, and the machine carries the servers' `server_unit_s` per
/// unit and the routers' hops (`socket_s_per_byte`, see [`socket_cost_per_byte`]). The data
/// host is the one without a link (`bandwidth: None`).
pub fn share_one_machine(
    input: &mut BalanceInput,
    cores: f64,
    server_unit_s: f64,
    socket_s_per_byte: f64,
) {
    let socket_s = socket_s_per_byte * (input.unit_bytes + input.result_bytes);
    let server_s = server_unit_s + 0.5 * socket_s;
    let overheads = input
        .hosts
        .iter()
        .map(|h| overhead_s(h.bandwidth.is_some(), true, true, server_s, socket_s))
        .collect();
    for h in &mut input.hosts {
        h.proc_s += 0.5 * socket_s;
        h.machine = Some(0);
    }
    input.machines = vec![MachineModel {
        name: "this machine".into(),
        cores,
        overhead_s: overheads,
    }];
}

/// CPU seconds per byte through one loopback socket hop, writer and reader together, measured
/// here (`None` where the OS gives no thread CPU time).
pub fn socket_cost_per_byte() -> Option<f64> {
    calibrate::socket_cost_per_byte()
}

/// CPU seconds a server spends per unit of `plan` besides reading it: encoding a synthetic
/// 8-bit unit and decoding its result.
pub fn server_unit_cpu_s(plan: &DedispersionPlan) -> f64 {
    let block = calibrate::synthetic_block(plan, true);
    let (_, encode) = calibrate::cpu_of(|| {
        for b in 0..3 {
            std::hint::black_box(
                Msg::Data {
                    block: b,
                    voltages: block.clone(),
                }
                .encode(),
            );
        }
    });
    encode / 3.0 + calibrate::result_decode_s(plan)
}

/// CPU seconds a client spends on one unit of `plan` — decoding it, dedispersing it at every
/// DM, encoding the result — after a warm-up unit (wall seconds where the OS gives no CPU
/// time, which include whatever else runs on this core).
pub fn calibrate(plan: &DedispersionPlan) -> f64 {
    let c = calibrate::UnitBench::new(plan, true).run(0.0, 3);
    c.cpu_s.unwrap_or(c.wall_s)
}

/// What reading units costs the root.
struct Reads {
    /// Bytes of one encoded unit.
    unit_bytes: f64,
    /// Bytes per second read and encoded (the paper's `r`).
    rate: f64,
    /// CPU seconds per unit read and encoded.
    cpu_s: f64,
}

/// Read and encode the first few blocks.
fn measure_reads(
    reader: &mut impl BlockSource,
    plan: &DedispersionPlan,
    nblocks: u64,
) -> Result<Reads, DistError> {
    let band = plan.band();
    let mut block = Voltages::zeros(band.nchan(), band.npol, plan.fft_len());
    let n = nblocks.min(4);
    let t = Instant::now();
    let (bytes, cpu) = calibrate::cpu_of(|| -> Result<usize, DistError> {
        let mut bytes = 0usize;
        for b in 0..n {
            reader
                .read_padded_into(plan.block_start(b), &mut block)
                .map_err(SearchError::from)?;
            bytes += Msg::Data {
                block: b,
                voltages: block.clone(),
            }
            .encode()
            .len();
        }
        Ok(bytes)
    });
    let bytes = bytes?;
    let dt = t.elapsed().as_secs_f64().max(1e-6);
    Ok(Reads {
        unit_bytes: bytes as f64 / n as f64,
        rate: bytes as f64 / dt,
        cpu_s: cpu / n as f64,
    })
}

fn decode_assignment(b: &[u8], size: usize, nblocks: u64) -> Result<Vec<Vec<u64>>, DistError> {
    let mut words = b
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
    let bad = || DistError::Protocol("malformed unit assignment".into());
    let mut out = Vec::with_capacity(size);
    for _ in 0..size {
        let n = words.next().ok_or_else(bad)?;
        if n > nblocks {
            return Err(bad());
        }
        let units: Vec<u64> = (0..n)
            .map(|_| words.next().ok_or_else(bad))
            .collect::<Result<_, _>>()?;
        if units.iter().any(|&u| u >= nblocks) {
            return Err(bad());
        }
        out.push(units);
    }
    Ok(out)
}

/// Broadcast a byte vector of any length from `root`.
fn broadcast_bytes(comm: &SimpleCommunicator, root: Rank, data: &mut Vec<u8>) {
    let mut len = data.len() as u64;
    comm.process_at_rank(root).broadcast_into(&mut len);
    data.resize(len as usize, 0);
    if len > 0 {
        comm.process_at_rank(root).broadcast_into(&mut data[..]);
    }
}

/// Results the root server collected, with per-client statistics.
pub(crate) struct Served {
    pub results: Vec<BlockPower>,
    pub clients: Vec<service::ClientStats>,
    /// CPU seconds of the other servers during the service.
    pub server_cpu_s: Vec<f64>,
    /// CPU seconds of this server's threads during the service.
    pub cpu_s: f64,
}

/// Bytes of one unit of `plan` on the wire when its samples are 8-bit integers.
pub fn unit_bytes_8bit(plan: &DedispersionPlan) -> usize {
    codec::packed_block_bytes(plan.band().nchan(), plan.band().npol, plan.fft_len())
}

/// Bytes of one unit's result on the wire.
pub fn result_bytes(plan: &DedispersionPlan) -> usize {
    1 + 8 + 8 + 4 * plan.dms().len() * plan.band().nchan() * plan.samples_per_block()
}

/// `e` and its causes, as one line: the root's set-up failure travels to every rank as text,
/// and a bad header's reason is in its cause.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calibration(cpu_s: Option<f64>) -> RankCalibration {
        RankCalibration {
            wall_s: 0.05,
            cpu_s,
            shares: vec![0.3, 0.3],
            cores: 2.0,
            machine: 1,
        }
    }

    fn client(rank: Rank, units: u64, cpu_s: f64) -> service::ClientStats {
        service::ClientStats {
            rank,
            finish_s: 1.0,
            busy_s: 0.5,
            idle_s: 0.1,
            units,
            cpu_s,
        }
    }

    #[test]
    fn a_clients_cost_is_the_mean_of_its_pilot_and_its_calibration() {
        // Rank 0 serves; rank 1 has both estimates, rank 2 no CPU time from the calibration,
        // rank 3 no pilot units.
        let cal = vec![
            calibration(None),
            calibration(Some(0.010)),
            calibration(None),
            calibration(Some(0.014)),
        ];
        let pilot = Served {
            results: Vec::new(),
            clients: vec![client(1, 6, 6.0 * 0.020), client(2, 6, 6.0 * 0.018)],
            server_cpu_s: vec![0.01],
            cpu_s: 0.11,
        };
        let hop_s = 0.002;
        let costs = unit_costs(&cal, Some(&pilot), 0.001, hop_s);
        let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-12);
        assert!(near(costs.client_s[1], 0.5 * (0.020 + 0.010 + 0.5 * hop_s)));
        assert!(near(costs.client_s[2], 0.018), "{:?}", costs.client_s[2]);
        assert!(near(costs.client_s[3], 0.014 + 0.5 * hop_s));
        assert_eq!(costs.client_s[0], None);
        // Servers: the pilot's CPU (this server's and the others') over its 12 units.
        assert!((costs.server_s - 0.12 / 12.0).abs() < 1e-12);
        // Without a pilot, the calibration alone.
        let costs = unit_costs(&cal, None, 0.001, hop_s);
        assert!(near(costs.client_s[1], 0.010 + 0.5 * hop_s));
        assert!((costs.server_s - (0.001 + 0.5 * hop_s)).abs() < 1e-12);
    }
}
