//! The search distributed over a metampi job, as the Jodrell Bank group ran it at SC99 (seed
//! 000), with their hindsight built in.
//!
//! Roles come from the topology API, not from rank order: the meta host of world rank 0 holds
//! the data; its lowest ranks are servers, one per 128 clients (at most), and every other
//! rank on every meta host is a client. A work unit is one dedispersion block (the paper's
//! record) at every trial DM, so the unit's cost is `n_slopes · τ`.
//!
//! 1. **Set-up.** The root server (lowest rank of the data host) opens the file and
//!    broadcasts the band and search settings; everyone builds the same
//!    [`DedispersionPlan`]. All clients dedisperse a synthetic block at the same moment, so
//!    each host's time per unit is measured under the load the run will have (`t_proc(i)`,
//!    the paper's `τ·n_slopes·p_1/p_i`). Link bandwidths come from the meta-computer
//!    description (`BANDWIDTH` on the PAIRs) or, where it gives none, from a probe: the root
//!    times a small and a large message to one client of each remote host.
//! 2. **Static balance** ([`crate::balance`]): units per host and per client; blocks are dealt
//!    in contiguous runs, host after host.
//! 3. **Service**, in one of three [`ServiceMode`]s: request/reply (a client asks for each
//!    unit; request type in the message body, one tag for everything), scheduled service (the
//!    server pushes each client's units in a fixed round-robin order; no requests at all), or
//!    dynamic (the plan's units as per-client queues; a client with an empty queue takes the
//!    last unit of the client predicted to finish last, when its measured rate and link say
//!    it will finish it sooner).
//!    A server has one sender thread per meta host it serves, so slow links do not hold up
//!    fast ones, and each client asks for (or is sent) its next unit while it computes the
//!    current one. Results (detected power, `[dm][chan][sample]`) go back to the server,
//!    which forwards other servers' to the root.
//! 4. **Search.** The root assembles the series ([`PowerAssembler`] sums channels in channel
//!    order, so arrival order does not matter), hands DMs round robin to the ranks of the
//!    data host for the periodicity search, concatenates their detections in DM order and
//!    sifts and folds exactly as [`search_series`](crate::search::search_series) does. The
//!    candidates are bit-for-bit those of the single-process search.

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
use crate::balance::{self, Allocation, BalanceError, BalanceInput, HostModel};
use crate::band::Band;
use crate::dedisperse::{BlockPower, DedispersionPlan};
use crate::format::BasebandReader;
use crate::search::{outcome_from_detections, SearchConfig, SearchError, SearchOutcome};
use crate::voltages::Voltages;
use codec::Msg;

/// At most this many clients per server (the SC99 cure for a sender running out of buffers).
pub const MAX_CLIENTS_PER_SERVER: usize = 128;

/// How servers hand out units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceMode {
    /// The client asks for each unit; the server answers requests first come, first served.
    RequestReply,
    /// The server sends every client its planned units in a fixed order; no requests.
    Scheduled,
    /// Starts from the static plan, then rebalances while running: clients ask for "a next
    /// unit", the server keeps the plan's per-client queues and lets a client whose queue is
    /// empty take the last unit of the client predicted to finish last, when the thief's
    /// measured rate and link say it will finish that unit sooner (see [`service`]).
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
    /// Probe every link at start-up even where the description gives a bandwidth.
    pub measure_links: bool,
    /// Make the clients of one meta host (by name) sleep this many seconds after every unit,
    /// after calibration, so the host is slower than the plan believes (for testing the
    /// dynamic mode). Only the root's setting counts.
    pub slow_host: Option<(String, f64)>,
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
    /// The root server failed during set-up (its message).
    #[error("the root server failed: {0}")]
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
    /// Units allocated.
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
    /// The service mode.
    pub mode: ServiceMode,
    /// Servers and clients.
    pub servers: usize,
    /// Client processes.
    pub clients: usize,
    /// Seconds of the service phase (first unit out to last result in).
    pub service_s: f64,
    /// Seconds from the start of set-up to the ranked table.
    pub total_s: f64,
    /// Where each host's bandwidth came from, one line per remote host.
    pub link_notes: Vec<String>,
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
                DedispersionPlan::new(r.band(), &config.search.dms, &config.search.plan)?;
                Ok(r)
            });
        blob = match setup {
            Ok(r) => {
                let slow = config.slow_host.as_ref().and_then(|(name, secs)| {
                    roles
                        .site_list
                        .iter()
                        .find(|&&s| site_name(config.description.as_ref(), s) == *name)
                        .map(|&s| (s, *secs))
                });
                let s = Setup {
                    band: r.band().clone(),
                    config: config.search.clone(),
                    nsamples: r.nsamples(),
                    mode: config.mode,
                    slow,
                };
                reader = Some(r);
                let mut b = vec![1u8];
                b.extend(serde_json::to_vec(&s).map_err(|e| DistError::Root(e.to_string()))?);
                b
            }
            Err(e) => {
                let mut b = vec![0u8];
                b.extend(e.to_string().into_bytes());
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
    let plan = DedispersionPlan::new(&setup.band, &setup.config.dms, &setup.config.plan)
        .map_err(SearchError::from)?;
    let nblocks = plan.num_blocks(setup.nsamples);
    if nblocks == 0 {
        return Err(SearchError::TooShort {
            nsamples: setup.nsamples,
            fft_len: plan.fft_len(),
        }
        .into());
    }
    let is_client = roles.server_of[me as usize].is_some();

    // Calibration: every client dedisperses a synthetic block at the same time.
    if is_root {
        progress(&Progress {
            phase: "calibrating",
            done: 0,
            total: nblocks,
            hosts: Vec::new(),
            elapsed_s: 0.0,
        });
    }
    comm.barrier();
    let my_time = if is_client { calibrate(&plan) } else { 0.0 };
    let mut times = vec![0.0f64; comm.size() as usize];
    comm.all_gather_into(&my_time, &mut times[..]);

    // Links: from the description where it says, measured where it does not.
    let described = config
        .description
        .as_ref()
        .filter(|_| !config.measure_links);
    let (links, notes) = link_models(&comm, &roles, described)?;

    // The balance, made at the root and broadcast as per-rank unit lists.
    let mut assignment_blob = Vec::new();
    let mut cost_blob = Vec::new();
    let mut allocation = None;
    if is_root {
        let r = reader
            .as_mut()
            .ok_or_else(|| DistError::Protocol("root without its reader".into()))?;
        let (unit_bytes, disk_rate) = measure_reads(r, &plan, nblocks)?;
        let result_bytes = result_bytes(&plan) as f64;
        let hosts: Vec<HostModel> = roles
            .site_list
            .iter()
            .map(|&s| {
                let clients = roles.clients_on(s);
                let proc_s = if clients.is_empty() {
                    1.0
                } else {
                    clients.iter().map(|&c| times[c as usize]).sum::<f64>() / clients.len() as f64
                };
                let l = links.iter().find(|l| l.site == s);
                HostModel {
                    name: site_name(config.description.as_ref(), s),
                    clients: clients.len(),
                    proc_s,
                    bandwidth: l.and_then(|l| l.bandwidth),
                    return_bandwidth: l.and_then(|l| l.return_bandwidth),
                    latency_s: l.map_or(0.0, |l| l.latency_s),
                }
            })
            .collect();
        let input = BalanceInput {
            hosts,
            units: nblocks,
            unit_bytes,
            result_bytes,
            disk_rate,
            n_slopes: plan.dms().len(),
        };
        let alloc = balance::allocate(&input)?;
        let mut units: Vec<Vec<u64>> = vec![Vec::new(); comm.size() as usize];
        let mut next = 0u64;
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
        let costs: Vec<SiteCost> = alloc
            .input
            .hosts
            .iter()
            .map(|h| SiteCost {
                unit_s: h.proc_s,
                transfer_s: h.bandwidth.map_or(0.0, |bw| unit_bytes / bw.max(1.0)) + h.latency_s,
            })
            .collect();
        cost_blob = serde_json::to_vec(&costs).map_err(|e| DistError::Root(e.to_string()))?;
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
    let served = if let Some(server) = roles.server_of[me as usize] {
        let slow_s = setup
            .slow
            .filter(|&(s, _)| s == roles.sites[me as usize])
            .map_or(0.0, |(_, secs)| secs);
        service::client(
            &comm,
            &plan,
            server,
            &assignment[me as usize],
            setup.mode,
            slow_s,
        )?;
        None
    } else {
        let names: Vec<String> = roles
            .site_list
            .iter()
            .map(|&s| site_name(config.description.as_ref(), s))
            .collect();
        Some(service::server(
            &comm,
            &service::ServerJob {
                roles: &roles,
                assignment: &assignment,
                file,
                plan: &plan,
                mode: setup.mode,
                t0,
                names: &names,
                costs: &costs,
            },
            progress,
        )?)
    };
    let service_s = t0.elapsed().as_secs_f64();

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
    let mut assembler = PowerAssembler::new(&plan, nblocks);
    for b in &served.results {
        assembler.insert(b).map_err(SearchError::from)?;
    }
    let series = assembler.finish().map_err(SearchError::from)?;
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
    outcome.complex_samples =
        nblocks * plan.step() as u64 * (plan.band().nchan() * plan.band().npol) as u64;
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
            HostReport {
                name: allocation.input.hosts[k].name.clone(),
                clients: clients.len(),
                units: allocation.hosts[k].units,
                predicted_s: allocation.hosts[k].predicted_s,
                measured_s: stats.iter().map(|c| c.finish_s).fold(0.0, f64::max),
                busy_s: stats.iter().map(|c| c.busy_s).sum::<f64>() / n,
                idle_s: stats.iter().map(|c| c.idle_s).sum::<f64>() / n,
                done_units: stats.iter().map(|c| c.units).sum(),
            }
        })
        .collect();
    Ok(Some(DistOutcome {
        outcome,
        allocation,
        hosts,
        mode: setup.mode,
        servers: roles.servers.len(),
        clients: roles.server_of.iter().filter(|s| s.is_some()).count(),
        service_s,
        total_s: started.elapsed().as_secs_f64(),
        link_notes: notes,
    }))
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
/// a `BANDWIDTH` for every link of the PAIR, otherwise measured (collective).
fn link_models(
    comm: &SimpleCommunicator,
    roles: &Roles,
    layout: Option<&metampi_config::Layout>,
) -> Result<(Vec<LinkModel>, Vec<String>), DistError> {
    let mut models = Vec::new();
    let mut notes = Vec::new();
    let mut to_probe: Vec<Rank> = Vec::new();
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
            Some(m) => {
                notes.push(format!(
                    "{}: {:.2} MB/s out, {:.2} MB/s back, latency {:.1} ms (description)",
                    site_name(layout, s),
                    m.bandwidth.unwrap_or(0.0) / 1e6,
                    m.return_bandwidth.unwrap_or(0.0) / 1e6,
                    m.latency_s * 1e3
                ));
                models.push(m);
            }
            None => {
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
            notes.push(format!(
                "{}: {:.2} MB/s, latency {:.1} ms (measured with rank {c})",
                site_name(layout, s),
                bw / 1e6,
                lat * 1e3
            ));
            models.push(LinkModel {
                site: s,
                bandwidth: Some(bw),
                return_bandwidth: Some(bw),
                latency_s: lat,
            });
        }
    } else if probed.contains(&me) {
        service::echo(comm, roles.root())?;
    }
    Ok((models, notes))
}

/// Seconds to dedisperse one synthetic block at every DM of `plan` (the second of two, so
/// allocation and caches are warm): the time per unit on this core under its present load.
pub fn calibrate(plan: &DedispersionPlan) -> f64 {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let band = plan.band();
    let mut block = Voltages::zeros(band.nchan(), band.npol, plan.fft_len());
    for z in block.as_mut_slice() {
        z.re = rng.gen_range(-20i32..20) as f32;
        z.im = rng.gen_range(-20i32..20) as f32;
    }
    let mut ws = plan.workspace();
    std::hint::black_box(plan.process_block(&mut ws, 0, &block));
    let t = Instant::now();
    std::hint::black_box(plan.process_block(&mut ws, 0, &block));
    t.elapsed().as_secs_f64()
}

/// Bytes of one encoded unit and the rate (bytes/s) at which the root reads and encodes
/// them, from the first few blocks.
fn measure_reads(
    reader: &mut BasebandReader,
    plan: &DedispersionPlan,
    nblocks: u64,
) -> Result<(f64, f64), DistError> {
    let band = plan.band();
    let mut block = Voltages::zeros(band.nchan(), band.npol, plan.fft_len());
    let n = nblocks.min(4);
    let t = Instant::now();
    let mut bytes = 0usize;
    for b in 0..n {
        reader
            .read_into(plan.block_start(b), &mut block)
            .map_err(SearchError::from)?;
        bytes += Msg::Data {
            block: b,
            voltages: block.clone(),
        }
        .encode()
        .len();
    }
    let dt = t.elapsed().as_secs_f64().max(1e-6);
    Ok((bytes as f64 / n as f64, bytes as f64 / dt))
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
}

/// Bytes of one unit of `plan` on the wire when its samples are 8-bit integers.
pub fn unit_bytes_8bit(plan: &DedispersionPlan) -> usize {
    codec::packed_block_bytes(plan.band().nchan(), plan.band().npol, plan.fft_len())
}

/// Bytes of one unit's result on the wire.
pub fn result_bytes(plan: &DedispersionPlan) -> usize {
    1 + 8 + 8 + 4 * plan.dms().len() * plan.band().nchan() * plan.samples_per_block()
}
