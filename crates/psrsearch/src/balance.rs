//! The static load balance of the SC99 search (seed 000, "Static Load Balancing"): how many
//! work units each meta host gets so that all hosts finish together, given its client count,
//! compute speed and the bandwidth of its link from the host that holds the data.
//!
//! The model, per host `i` with `n_i` clients:
//!
//! - `t_proc(i) = n_slopes · τ · p_1/p_i`: one unit (one record at every trial DM) on one
//!   client; here measured directly per host ([`HostModel::proc_s`]);
//! - `t_wait(i) = w/β_i + w/r`: a client waits this long for one unit of `w` bytes over the
//!   link of bandwidth `β_i` from a disk read at rate `r` (no link term on the data host);
//! - `t_i = (v_i/n_i)·t_proc(i) + n_i·t_wait(i) + c_i`, where `c_i` (an addition to the
//!   paper) is the one-off latency plus the return of the last unit's result over the link
//!   back, which the paper's clients did not need;
//! - all `t_i` equal and `Σ v_i = v`: a linear system in `(v_1 … v_N, t)`, solved in closed
//!   form. A host whose share comes out negative (its start-up alone outlasts the others) is
//!   left out and the system solved again.
//!
//! Whole units: host `i` gets `⌊v_i⌋`; the units the floors leave over are dealt one each to
//! the hosts with the largest fractional parts (round robin from the most deserving); each
//! host's count is divided by `n_i`, every client gets the quotient and the remainder goes
//! round robin to its first clients.
//!
//! Dead time: the paper's clients fetched a unit only after finishing the previous one, so
//! while one computed, the link served the other `n_i − 1` (`t_else = (n_i − 1)·t_wait`).
//! Ours ask for the next unit before computing the current one, so its own transfer must fit
//! in that time too: a client idles `t_dead(i) = n_i·t_wait(i) − t_proc(i)` between units
//! when that is positive, and a warning names the host. The fewest clients that saturate a
//! link is the smallest `n` with `n·t_wait(i) ≥ t_proc(i)`; more than that only wait.
//!
//! Beyond the paper: its system assumes no host is link-bound. When a share would need more
//! link time than the balanced run lasts (`v_i·t_link(i) + t_proc(i) + c_i > t`), the system
//! is solved again with each host's time the larger of the two, so link-bound hosts get what
//! their link can carry and the others take the rest. `t_link(i)` is the larger of `t_wait(i)`
//! and a result's time on the link back (`result/β_back`): the two directions carry units and
//! results at once, and a result can be far larger than its unit (per-channel power of many
//! sub-channels, decision 0065).
//!
//! Also beyond the paper: hosts that share a machine's cores ([`MachineModel`]). The T3Es of
//! SC99 gave every process a processor of its own; emulated meta hosts on one computer (and
//! any job with more ranks than cores) do not, so `t_proc(i)` is not a property of the host
//! but of how many processes compete while its clients compute. For a host on machine `m`,
//! `proc_s` is the CPU one unit costs a client, and `t_proc(i) = proc_s(i) / f_m`, where the
//! share of a core each computing client gets is
//!
//! `f_m = min(1, (K_m − o_m) / R_m)`:
//!
//! `K_m` the cores the job gets on `m` (measured with every client computing, so other users'
//! load is already off), `o_m = Σ_i v_i·overhead_s(m, i) / t` the cores servers and routers
//! take there, and `R_m = Σ_i min(n_i, v_i·t_proc(i)/t)` the clients computing on average (a
//! link-bound host's clients wait part of the time and leave their share to the others). `f`
//! and the balance depend on each other; they are solved together by fixed-point iteration
//! (geometric damping), which ends when the machine is exactly as busy as its cores allow, or
//! every client has a core of its own.

use std::fmt;

/// One meta host as the balance sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostModel {
    /// Name (from the description file, or `site N`).
    pub name: String,
    /// Client processes `n_i` (servers excluded).
    pub clients: usize,
    /// Without a `machine`: seconds one client of this host needs for one unit as it will run
    /// (`n_slopes · τ · p_1/p_i`, the paper's `t_proc(i)`). With one: the CPU seconds a unit
    /// costs a client; its time then follows from the share of a core it gets.
    pub proc_s: f64,
    /// Index into [`BalanceInput::machines`] of the computer whose cores this host's clients
    /// share, or `None` for the paper's model (a processor per client, `proc_s` as given).
    pub machine: Option<usize>,
    /// Bytes per second from the data host to this one (`β_i`); `None` on the data host.
    pub bandwidth: Option<f64>,
    /// Bytes per second back to the data host (results); `None` on the data host.
    pub return_bandwidth: Option<f64>,
    /// One-way latency of the link, s.
    pub latency_s: f64,
}

/// Everything the balance needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BalanceInput {
    /// The meta hosts; index 0 need not be the data host.
    pub hosts: Vec<HostModel>,
    /// Work units `v` (records, i.e. dedispersion blocks).
    pub units: u64,
    /// Bytes of one unit as sent (`w`).
    pub unit_bytes: f64,
    /// Bytes of one unit's result as sent back.
    pub result_bytes: f64,
    /// Rate at which the servers read and encode units, bytes/s (`r`).
    pub disk_rate: f64,
    /// Trial DMs per unit (`n_slopes`), for the report.
    pub n_slopes: usize,
    /// Computers whose cores the hosts share (empty: the paper's model for every host).
    pub machines: Vec<MachineModel>,
}

/// A computer whose cores the clients of one or more meta hosts share, with the servers and
/// routers that run there.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineModel {
    /// Name, for the report.
    pub name: String,
    /// Cores the job's processes get there (`K_m`): at most the machine's cores, less what
    /// other users' work takes.
    pub cores: f64,
    /// Per host (input order): CPU seconds spent on this machine for each unit of that host
    /// by processes other than its clients — servers reading, encoding and taking results,
    /// routers relaying.
    pub overhead_s: Vec<f64>,
}

/// How busy a machine is in the solution.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineLoad {
    /// Clients computing at any moment, on average (`R_m`).
    pub runnable: f64,
    /// Cores taken by servers and routers (`o_m`).
    pub overhead_cores: f64,
    /// Share of a core each computing client gets (`f_m`).
    pub core_share: f64,
}

/// Why no allocation could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BalanceError {
    /// No host has a client.
    #[error("no meta host has a client process to give work to")]
    NoClients,
    /// A rate, time or size that is zero, negative or not a number.
    #[error("{what} of {host} is {value}: expected a positive, finite number")]
    BadValue {
        /// The quantity.
        what: &'static str,
        /// Which host (or `the job`).
        host: String,
        /// Its value.
        value: f64,
    },
}

/// What one host gets and what the model predicts for it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostAllocation {
    /// Real-valued share from the linear system (`v_i`).
    pub share: f64,
    /// Whole units.
    pub units: u64,
    /// Units per client, in client order (quotient plus round-robin remainder).
    pub per_client: Vec<u64>,
    /// `t_proc(i)`: seconds a unit takes one client of this host in the run (`proc_s`, or
    /// `proc_s / core_share` on a modelled machine).
    pub unit_s: f64,
    /// Share of a core each of its clients gets while computing (1 in the paper's model).
    pub core_share: f64,
    /// `t_wait(i)`, s.
    pub wait_s: f64,
    /// `t_dead(i)`: idle time between units when the link cannot keep the clients busy, s.
    pub dead_s: f64,
    /// Fewest clients that saturate the link (or the disk, on the data host).
    pub saturating_clients: usize,
    /// Predicted finish time of the host's last client with whole units, s: the model's
    /// time, or the time the link needs to carry the units if that is longer.
    pub predicted_s: f64,
}

/// The allocation for every host.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    /// The input it was made from.
    pub input: BalanceInput,
    /// Per host, in input order.
    pub hosts: Vec<HostAllocation>,
    /// The common finish time of the real-valued solution, s.
    pub balanced_s: f64,
    /// Per machine of the input, how busy the solution keeps it.
    pub machines: Vec<MachineLoad>,
    /// Dead-time and exclusion warnings, one line each.
    pub warnings: Vec<String>,
}

/// Most fixed-point rounds of the shared-core model; it settles in a few dozen.
const MAX_ROUNDS: usize = 200;

/// Least share of a core a client is assumed to get, so an overloaded machine gives a long
/// but finite time instead of a division by zero.
const MIN_CORE_SHARE: f64 = 1e-3;

/// Solve the balance.
///
/// # Errors
/// No clients anywhere, or a non-positive or non-finite rate, time or size.
pub fn allocate(input: &BalanceInput) -> Result<Allocation, BalanceError> {
    check(input)?;
    if input.hosts.iter().all(|h| h.machine.is_none()) {
        let unit: Vec<f64> = input.hosts.iter().map(|h| h.proc_s).collect();
        return Ok(allocate_with(input, &unit));
    }
    // Start from every client computing at once (the calibration's situation), then let the
    // balance say how many compute on average and the machines how much each then gets.
    let mut share: Vec<f64> = (0..input.machines.len())
        .map(|m| {
            let clients: usize = input
                .hosts
                .iter()
                .filter(|h| h.machine == Some(m))
                .map(|h| h.clients)
                .sum();
            (input.machines[m].cores / clients.max(1) as f64).clamp(MIN_CORE_SHARE, 1.0)
        })
        .collect();
    for _ in 0..MAX_ROUNDS {
        let alloc = allocate_with(input, &unit_times(input, &share));
        let mut change: f64 = 0.0;
        for (f, load) in share.iter_mut().zip(&alloc.machines) {
            change = change.max((load.core_share / *f).ln().abs());
            // Geometric damping: the busy fraction of a link-bound host moves against the
            // share, so undamped steps can oscillate.
            *f = (*f * load.core_share).sqrt();
        }
        if change < 1e-9 {
            break;
        }
    }
    let mut alloc = allocate_with(input, &unit_times(input, &share));
    for (m, load) in input.machines.iter().zip(&alloc.machines) {
        if load.overhead_cores > 0.5 * m.cores {
            alloc.warnings.push(format!(
                "machine {}: servers and routers take {:.2} of its {:.2} cores; clients there \
                 get little",
                m.name, load.overhead_cores, m.cores
            ));
        }
    }
    Ok(alloc)
}

/// `t_proc(i)` of every host for the machines' core shares.
fn unit_times(input: &BalanceInput, share: &[f64]) -> Vec<f64> {
    input
        .hosts
        .iter()
        .map(|h| match h.machine.and_then(|m| share.get(m)) {
            Some(f) => h.proc_s / f,
            None => h.proc_s,
        })
        .collect()
}

/// How busy the real-valued solution `shares` (finishing at `t`) keeps each machine, and the
/// core share that load implies (`f_m = min(1, (K_m − o_m)/R_m)`).
fn machine_loads(input: &BalanceInput, unit: &[f64], shares: &[f64], t: f64) -> Vec<MachineLoad> {
    let t = t.max(1e-12);
    input
        .machines
        .iter()
        .enumerate()
        .map(|(m, mm)| {
            let mut runnable = 0.0;
            let mut overhead = 0.0;
            for (i, h) in input.hosts.iter().enumerate() {
                let v = shares[i].max(0.0);
                if h.machine == Some(m) {
                    runnable += (v * unit[i] / t).min(h.clients as f64);
                }
                overhead += v * mm.overhead_s.get(i).copied().unwrap_or(0.0) / t;
            }
            let free = (mm.cores - overhead).max(0.0);
            let core_share = if runnable > 1e-12 {
                (free / runnable).clamp(MIN_CORE_SHARE, 1.0)
            } else {
                1.0
            };
            MachineLoad {
                runnable,
                overhead_cores: overhead,
                core_share,
            }
        })
        .collect()
}

/// The balance for given `t_proc(i)` (`unit`).
fn allocate_with(input: &BalanceInput, unit: &[f64]) -> Allocation {
    let n = input.hosts.len();
    let wait: Vec<f64> = input.hosts.iter().map(|h| wait_s(input, h)).collect();
    let fixed: Vec<f64> = input.hosts.iter().map(|h| fixed_s(input, h)).collect();
    let link: Vec<f64> = input
        .hosts
        .iter()
        .zip(&wait)
        .map(|(h, &w)| w.max(back_s(input, h)))
        .collect();
    let mut active: Vec<bool> = input.hosts.iter().map(|h| h.clients > 0).collect();
    let mut warnings = Vec::new();
    // Solve; drop the most negative share and solve again until every share is ≥ 0.
    let (shares, balanced) = loop {
        let (shares, t) = solve(input, unit, &wait, &fixed, &active);
        let worst = (0..n)
            .filter(|&i| active[i] && shares[i] < 0.0)
            .min_by(|&a, &b| shares[a].total_cmp(&shares[b]));
        match worst {
            Some(i) if active.iter().filter(|a| **a).count() > 1 => {
                active[i] = false;
                warnings.push(format!(
                    "{}: left out; its start-up ({:.3} s) outlasts the balanced run",
                    input.hosts[i].name,
                    input.hosts[i].clients as f64 * wait[i] + fixed[i]
                ));
            }
            _ => break (shares, t),
        }
    };
    // The paper's system assumes every link keeps its clients busy. Where a share would need
    // more than the link can carry in the balanced time, the host is link-bound: its time is
    // `v_i·t_link(i) + t_proc(i) + c_i`. Solve again with each host's time the larger of the
    // two (monotone in v_i, so bisection on the common time).
    let link_bound = (0..n)
        .any(|i| active[i] && shares[i] * link[i] + unit[i] + fixed[i] > balanced * (1.0 + 1e-9));
    let (shares, balanced) = if link_bound {
        let limited = solve_link_aware(input, unit, &wait, &link, &fixed, &active);
        for (i, h) in input.hosts.iter().enumerate() {
            if active[i] && limited.0[i] + 1e-9 < shares[i] {
                warnings.push(format!(
                    "{}: link-bound; its share is cut from {:.1} to {:.1} units so that the link \
                     can carry them{} in time",
                    h.name,
                    shares[i],
                    limited.0[i],
                    if link[i] > wait[i] {
                        " (their results back)"
                    } else {
                        ""
                    }
                ));
            }
        }
        limited
    } else {
        (shares, balanced)
    };
    let units = whole_units(input.units, &shares, &active);
    let machines = machine_loads(input, unit, &shares, balanced);
    let mut hosts = Vec::with_capacity(n);
    for (i, h) in input.hosts.iter().enumerate() {
        let per_client = split_among(units[i], h.clients);
        let max_units = per_client.iter().copied().max().unwrap_or(0);
        let dead = dead_time(h.clients, unit[i], wait[i]);
        let compute = max_units as f64 * unit[i] + h.clients as f64 * wait[i] + fixed[i];
        let link_bound = if units[i] > 0 {
            units[i] as f64 * link[i] + unit[i] + fixed[i]
        } else {
            0.0
        };
        let predicted = if units[i] == 0 {
            0.0
        } else {
            compute.max(link_bound)
        };
        if dead > 0.0 && units[i] > 0 {
            warnings.push(format!(
                "{}: dead time {:.3} s between units per client ({} clients, link saturated by {}); \
                 fewer clients, a faster link or more DMs per unit would remove it",
                h.name,
                dead,
                h.clients,
                saturating(unit[i], wait[i])
            ));
        }
        hosts.push(HostAllocation {
            share: if active[i] { shares[i] } else { 0.0 },
            units: units[i],
            per_client,
            unit_s: unit[i],
            core_share: if h.proc_s > 0.0 {
                h.proc_s / unit[i]
            } else {
                1.0
            },
            wait_s: wait[i],
            dead_s: dead,
            saturating_clients: saturating(unit[i], wait[i]),
            predicted_s: predicted,
        });
    }
    Allocation {
        input: input.clone(),
        hosts,
        balanced_s: balanced,
        machines,
        warnings,
    }
}

/// `t_dead` for `n` prefetching clients: `n·t_wait − t_proc` when positive.
pub fn dead_time(clients: usize, proc_s: f64, wait_s: f64) -> f64 {
    (clients as f64 * wait_s - proc_s).max(0.0)
}

/// Fewest clients that saturate a link: the smallest `n ≥ 1` with `n·t_wait ≥ t_proc`
/// (capped at 1 000 000; `usize::MAX` for a link that takes no time).
pub fn saturating(proc_s: f64, wait_s: f64) -> usize {
    if wait_s <= 0.0 {
        return usize::MAX;
    }
    // Start near the closed form and step to the exact boundary (floating point).
    let mut n = ((proc_s / wait_s).floor() as usize).clamp(1, 1_000_000);
    while n > 1 && (n - 1) as f64 * wait_s >= proc_s {
        n -= 1;
    }
    while (n as f64 * wait_s) < proc_s && n < 1_000_000 {
        n += 1;
    }
    n
}

/// `q = units / clients` each, the remainder one each to the first clients.
pub fn split_among(units: u64, clients: usize) -> Vec<u64> {
    if clients == 0 {
        return Vec::new();
    }
    let q = units / clients as u64;
    let rem = (units % clients as u64) as usize;
    (0..clients).map(|j| q + u64::from(j < rem)).collect()
}

/// Floors of the shares, then the left-over units one each to the active hosts in order of
/// decreasing fractional part (ties: lower index first), round after round.
pub fn whole_units(total: u64, shares: &[f64], active: &[bool]) -> Vec<u64> {
    let mut units: Vec<u64> = shares
        .iter()
        .zip(active)
        .map(|(s, a)| if *a { s.max(0.0).floor() as u64 } else { 0 })
        .collect();
    let mut given: u64 = units.iter().sum();
    // Shares sum to `total` up to rounding; never give more than there is.
    while given > total {
        if let Some(i) = (0..units.len()).filter(|&i| units[i] > 0).max_by(|&a, &b| {
            (units[a] as f64 - shares[a])
                .total_cmp(&(units[b] as f64 - shares[b]))
                .then(b.cmp(&a))
        }) {
            units[i] -= 1;
            given -= 1;
        } else {
            break;
        }
    }
    let mut order: Vec<usize> = (0..shares.len()).filter(|&i| active[i]).collect();
    order.sort_by(|&a, &b| {
        let fa = shares[a] - shares[a].floor();
        let fb = shares[b] - shares[b].floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let mut k = 0;
    while given < total && !order.is_empty() {
        units[order[k % order.len()]] += 1;
        given += 1;
        k += 1;
    }
    units
}

impl Allocation {
    /// The predicted time of the slowest host, s.
    pub fn predicted_makespan_s(&self) -> f64 {
        self.hosts.iter().map(|h| h.predicted_s).fold(0.0, f64::max)
    }
}

impl fmt::Display for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inp = &self.input;
        writeln!(
            f,
            "{} units of {:.1} kB (results {:.1} kB), {} DMs per unit, read rate r = {:.1} MB/s",
            inp.units,
            inp.unit_bytes / 1e3,
            inp.result_bytes / 1e3,
            inp.n_slopes,
            inp.disk_rate / 1e6
        )?;
        writeln!(
            f,
            "{:<10} {:>7} {:>9} {:>9} {:>6} {:>11} {:>7} {:>8} {:>9} {:>6}  {:>9} {:>8} {:>10}  units per client",
            "host",
            "clients",
            "β (MB/s)",
            "cpu (s)",
            "core",
            "t_proc (s)",
            "p1/p_i",
            "v_i",
            "t_wait(s)",
            "units",
            "t_pred(s)",
            "t_dead(s)",
            "saturate@"
        )?;
        let base = inp
            .hosts
            .iter()
            .position(|h| h.bandwidth.is_none())
            .or(if inp.hosts.is_empty() { None } else { Some(0) })
            .and_then(|i| self.hosts.get(i))
            .map(|a| a.unit_s)
            .unwrap_or(1.0);
        for (h, a) in inp.hosts.iter().zip(&self.hosts) {
            let beta = h
                .bandwidth
                .map(|b| format!("{:.2}", b / 1e6))
                .unwrap_or_else(|| "local".into());
            let sat = if a.saturating_clients >= 1_000_000 {
                "-".to_string()
            } else {
                a.saturating_clients.to_string()
            };
            let (cpu, core) = if h.machine.is_some() {
                (format!("{:.4}", h.proc_s), format!("{:.2}", a.core_share))
            } else {
                ("-".to_string(), "-".to_string())
            };
            writeln!(
                f,
                "{:<10} {:>7} {:>9} {:>9} {:>6} {:>11.4} {:>7.3} {:>8.2} {:>9.4} {:>6}  {:>9.3} {:>8.3} {:>10}  {}",
                h.name,
                h.clients,
                beta,
                cpu,
                core,
                a.unit_s,
                a.unit_s / base,
                a.share,
                a.wait_s,
                a.units,
                a.predicted_s,
                a.dead_s,
                sat,
                compact_counts(&a.per_client)
            )?;
        }
        for (m, load) in inp.machines.iter().zip(&self.machines) {
            writeln!(
                f,
                "machine {}: {:.2} cores for the job, servers and routers take {:.2}, {:.2} \
                 clients computing on average get {:.2} of a core each",
                m.name, m.cores, load.overhead_cores, load.runnable, load.core_share
            )?;
        }
        write!(
            f,
            "balanced finish time {:.3} s; slowest host with whole units {:.3} s",
            self.balanced_s,
            self.predicted_makespan_s()
        )?;
        for w in &self.warnings {
            write!(f, "\nwarning: {w}")?;
        }
        Ok(())
    }
}

/// `[5×3, 4×2]` for `[5, 5, 5, 4, 4]`.
fn compact_counts(v: &[u64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j < v.len() && v[j] == v[i] {
            j += 1;
        }
        parts.push(if j - i > 1 {
            format!("{}×{}", v[i], j - i)
        } else {
            v[i].to_string()
        });
        i = j;
    }
    format!("[{}]", parts.join(", "))
}

fn check(input: &BalanceInput) -> Result<(), BalanceError> {
    let bad = |what, host: &str, value: f64| BalanceError::BadValue {
        what,
        host: host.to_string(),
        value,
    };
    if !input.hosts.iter().any(|h| h.clients > 0) {
        return Err(BalanceError::NoClients);
    }
    for (what, v) in [
        ("unit size", input.unit_bytes),
        ("read rate", input.disk_rate),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            return Err(bad(what, "the job", v));
        }
    }
    if !(input.result_bytes >= 0.0 && input.result_bytes.is_finite()) {
        return Err(bad("result size", "the job", input.result_bytes));
    }
    for h in &input.hosts {
        if !(h.proc_s > 0.0 && h.proc_s.is_finite()) {
            return Err(bad("time per unit", &h.name, h.proc_s));
        }
        for (what, b) in [
            ("link bandwidth", h.bandwidth),
            ("return bandwidth", h.return_bandwidth),
        ] {
            if let Some(b) = b {
                if !(b > 0.0 && b.is_finite()) {
                    return Err(bad(what, &h.name, b));
                }
            }
        }
        if !(h.latency_s >= 0.0 && h.latency_s.is_finite()) {
            return Err(bad("latency", &h.name, h.latency_s));
        }
        if let Some(m) = h.machine {
            if m >= input.machines.len() {
                return Err(bad("machine index", &h.name, m as f64));
            }
        }
    }
    for m in &input.machines {
        if !(m.cores > 0.0 && m.cores.is_finite()) {
            return Err(bad("core count", &m.name, m.cores));
        }
        if let Some(&o) = m.overhead_s.iter().find(|o| !(**o >= 0.0 && o.is_finite())) {
            return Err(bad("overhead per unit", &m.name, o));
        }
    }
    Ok(())
}

fn wait_s(input: &BalanceInput, h: &HostModel) -> f64 {
    input.unit_bytes / input.disk_rate + h.bandwidth.map_or(0.0, |b| input.unit_bytes / b)
}

/// Seconds one unit's result takes on the link back (0 on the data host).
fn back_s(input: &BalanceInput, h: &HostModel) -> f64 {
    h.bandwidth
        .and(h.return_bandwidth.or(h.bandwidth))
        .map_or(0.0, |b| input.result_bytes / b)
}

fn fixed_s(input: &BalanceInput, h: &HostModel) -> f64 {
    let back = h
        .return_bandwidth
        .or(h.bandwidth)
        .map_or(0.0, |b| input.result_bytes / b);
    2.0 * h.latency_s + back
}

/// The closed form of the linear system over the active hosts: with `a_i = t_proc(i)/n_i`
/// and `b_i = n_i·t_wait(i) + c_i`, `t = (v + Σ b_i/a_i) / Σ 1/a_i` and `v_i = (t − b_i)/a_i`.
fn solve(
    input: &BalanceInput,
    unit: &[f64],
    wait: &[f64],
    fixed: &[f64],
    active: &[bool],
) -> (Vec<f64>, f64) {
    let coeffs: Vec<(f64, f64)> = input
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let a = unit[i] / h.clients.max(1) as f64;
            let b = h.clients as f64 * wait[i] + fixed[i];
            (a, b)
        })
        .collect();
    let (mut num, mut den) = (input.units as f64, 0.0);
    for (i, &(a, b)) in coeffs.iter().enumerate() {
        if active[i] {
            num += b / a;
            den += 1.0 / a;
        }
    }
    let t = num / den;
    let shares = coeffs
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| if active[i] { (t - b) / a } else { 0.0 })
        .collect();
    (shares, t)
}

/// Common finish time `t` with each host's share the largest whose compute-model time and
/// link time both fit in `t`: `v_i(t) = min((t − b_i)/a_i, (t − t_proc(i) − c_i)/t_link(i))`,
/// clamped at 0, with `Σ v_i(t) = v`.
fn solve_link_aware(
    input: &BalanceInput,
    unit: &[f64],
    wait: &[f64],
    link: &[f64],
    fixed: &[f64],
    active: &[bool],
) -> (Vec<f64>, f64) {
    let share = |i: usize, t: f64| -> f64 {
        let h = &input.hosts[i];
        if !active[i] {
            return 0.0;
        }
        let a = unit[i] / h.clients.max(1) as f64;
        let b = h.clients as f64 * wait[i] + fixed[i];
        let compute = (t - b) / a;
        let carried = if link[i] > 0.0 {
            (t - unit[i] - fixed[i]) / link[i]
        } else {
            f64::INFINITY
        };
        compute.min(carried).max(0.0)
    };
    let total = |t: f64| (0..input.hosts.len()).map(|i| share(i, t)).sum::<f64>();
    let v = input.units as f64;
    let mut hi = 1.0;
    while total(hi) < v && hi < 1e12 {
        hi *= 2.0;
    }
    let mut lo = 0.0;
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if total(mid) < v {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let shares: Vec<f64> = (0..input.hosts.len()).map(|i| share(i, hi)).collect();
    // Bisection leaves Σ v_i a hair above v; scale back so the floors deal exactly v.
    let sum: f64 = shares.iter().sum();
    let shares = shares.iter().map(|s| s * v / sum).collect();
    (shares, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, clients: usize, proc_s: f64, bw: Option<f64>) -> HostModel {
        HostModel {
            name: name.into(),
            clients,
            proc_s,
            bandwidth: bw,
            return_bandwidth: bw,
            latency_s: 0.0,
            machine: None,
        }
    }

    fn input(hosts: Vec<HostModel>, units: u64) -> BalanceInput {
        BalanceInput {
            hosts,
            units,
            unit_bytes: 1e6,
            result_bytes: 0.0,
            disk_rate: 1e9,
            n_slopes: 10,
            machines: Vec::new(),
        }
    }

    /// `hosts` all on one machine of `cores` cores with `overhead` CPU s per unit of each.
    fn shared(mut hosts: Vec<HostModel>, units: u64, cores: f64, overhead: f64) -> BalanceInput {
        for h in &mut hosts {
            h.machine = Some(0);
        }
        let n = hosts.len();
        let mut inp = input(hosts, units);
        // Small units from a fast disk: the links matter only where a test makes them slow.
        inp.unit_bytes = 1e3;
        inp.machines = vec![MachineModel {
            name: "m".into(),
            cores,
            overhead_s: vec![overhead; n],
        }];
        inp
    }

    /// CPU the solution uses on machine 0 per second of the run: computing clients times
    /// their share, plus servers and routers. A saturated machine uses exactly its cores.
    fn cores_used(a: &Allocation) -> f64 {
        let l = &a.machines[0];
        l.runnable * l.core_share + l.overhead_cores
    }

    #[test]
    fn compute_bound_hosts_on_one_machine_split_its_cores() {
        // 7 clients on 2 cores, nothing link-bound: each gets 2/7 of a core, and the run lasts
        // the total CPU over the cores (the obviously correct answer for a saturated machine).
        let inp = shared(
            vec![host("a", 3, 0.01, None), host("b", 4, 0.01, Some(1e9))],
            700,
            2.0,
            0.0,
        );
        let a = allocate(&inp).unwrap();
        for h in &a.hosts {
            assert!((h.core_share - 2.0 / 7.0).abs() < 1e-6, "{a}");
            assert!((h.unit_s - 0.035).abs() < 1e-6, "{a}");
        }
        assert!((a.balanced_s - 700.0 * 0.01 / 2.0).abs() < 0.01, "{a}");
        assert!((cores_used(&a) - 2.0).abs() < 1e-6, "{a}");
    }

    #[test]
    fn overhead_takes_cores_from_the_clients() {
        // Servers and routers need 0.005 s of CPU per unit: the run lasts Σ(cpu + overhead)/K.
        let inp = shared(vec![host("a", 4, 0.01, None)], 400, 2.0, 0.005);
        let a = allocate(&inp).unwrap();
        assert!((a.balanced_s - 400.0 * 0.015 / 2.0).abs() < 0.01, "{a}");
        assert!((a.machines[0].overhead_cores - 400.0 * 0.005 / a.balanced_s).abs() < 1e-6);
        assert!((cores_used(&a) - 2.0).abs() < 1e-6, "{a}");
    }

    #[test]
    fn a_link_bound_host_leaves_its_share_of_the_cores_to_the_others() {
        // Host `far`'s clients wait for their link most of the time; the machine stays
        // saturated and the clients that do compute get more than cores/clients each.
        let mut far = host("far", 2, 0.01, Some(2e4));
        far.return_bandwidth = Some(1e9);
        let inp = shared(vec![host("a", 3, 0.01, None), far], 500, 2.0, 0.0);
        let a = allocate(&inp).unwrap();
        assert!(
            a.warnings.iter().any(|w| w.starts_with("far: link-bound")),
            "{a}"
        );
        assert!(a.machines[0].runnable < 5.0 - 0.5, "{a}");
        assert!(a.hosts[0].core_share > 2.0 / 5.0 + 0.05, "{a}");
        assert!((cores_used(&a) - 2.0).abs() < 1e-6, "{a}");
        // Both hosts still finish together (within a unit's time).
        let d = (a.hosts[0].predicted_s - a.hosts[1].predicted_s).abs();
        assert!(d < a.hosts[1].wait_s + a.hosts[0].unit_s, "{a}");
    }

    #[test]
    fn a_core_per_client_is_the_papers_model() {
        let hosts = vec![host("a", 3, 0.2, None), host("b", 5, 0.3, Some(20e6))];
        let paper = allocate(&input(hosts.clone(), 517)).unwrap();
        let mut inp = shared(hosts, 517, 16.0, 0.0);
        inp.unit_bytes = 1e6;
        let a = allocate(&inp).unwrap();
        assert_eq!(
            a.hosts.iter().map(|h| h.units).collect::<Vec<_>>(),
            paper.hosts.iter().map(|h| h.units).collect::<Vec<_>>()
        );
        assert!((a.balanced_s - paper.balanced_s).abs() < 1e-9);
        assert!(a.hosts.iter().all(|h| h.core_share == 1.0));
    }

    /// The naive reference: equal finish times by bisection on t.
    fn bisect(inp: &BalanceInput) -> f64 {
        let share = |t: f64| -> f64 {
            inp.hosts
                .iter()
                .map(|h| {
                    let w = wait_s(inp, h);
                    let b = h.clients as f64 * w + fixed_s(inp, h);
                    ((t - b) * h.clients as f64 / h.proc_s).max(0.0)
                })
                .sum()
        };
        let (mut lo, mut hi) = (0.0, 1e6);
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if share(mid) < inp.units as f64 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    #[test]
    fn equal_hosts_share_equally_and_finish_together() {
        let inp = input(vec![host("a", 4, 1.0, None), host("b", 4, 1.0, None)], 80);
        let a = allocate(&inp).unwrap();
        assert_eq!(a.hosts[0].units, 40);
        assert_eq!(a.hosts[1].units, 40);
        assert_eq!(a.hosts[0].per_client, vec![10; 4]);
        assert!((a.balanced_s - bisect(&inp)).abs() < 1e-6);
    }

    #[test]
    fn solution_matches_bisection_and_sums_to_v() {
        let inp = input(
            vec![
                host("a", 3, 0.2, None),
                host("b", 5, 0.3, Some(20e6)),
                host("c", 2, 0.25, Some(40e6)),
            ],
            517,
        );
        let a = allocate(&inp).unwrap();
        assert!((a.balanced_s - bisect(&inp)).abs() < 1e-6, "{a}");
        let sum: f64 = a.hosts.iter().map(|h| h.share).sum();
        assert!((sum - 517.0).abs() < 1e-6);
        assert_eq!(a.hosts.iter().map(|h| h.units).sum::<u64>(), 517);
        for h in &a.hosts {
            assert_eq!(h.per_client.iter().sum::<u64>(), h.units);
        }
    }

    #[test]
    fn whole_units_floor_then_largest_fractions() {
        // Floors 3 + 2 + 4 + 1 = 10 of 12: the two left over go to the largest fractions.
        let u = whole_units(12, &[3.9, 2.2, 4.5, 1.4], &[true; 4]);
        assert_eq!(u, vec![4, 2, 5, 1]);
        let u = whole_units(13, &[3.9, 2.2, 4.5, 2.4], &[true; 4]);
        assert_eq!(u, vec![4, 2, 5, 2]);
        // Inactive hosts get nothing even with a large fraction.
        let u = whole_units(5, &[2.5, 2.5, 0.9], &[true, true, false]);
        assert_eq!(u, vec![3, 2, 0]);
        assert_eq!(whole_units(7, &[7.0, 0.0], &[true, true]), vec![7, 0]);
    }

    #[test]
    fn remainder_goes_round_robin_to_first_clients() {
        assert_eq!(split_among(17, 5), vec![4, 4, 3, 3, 3]);
        assert_eq!(split_among(3, 5), vec![1, 1, 1, 0, 0]);
        assert_eq!(split_among(10, 5), vec![2; 5]);
        assert!(split_among(4, 0).is_empty());
    }

    #[test]
    fn dead_time_warning_when_link_cannot_feed_clients() {
        // 1 MB units over 1 MB/s: t_wait ≈ 1 s; t_proc 2 s; 6 clients need 6 s of link per 2 s.
        let inp = input(
            vec![host("a", 2, 2.0, None), host("slow", 6, 2.0, Some(1e6))],
            40,
        );
        let a = allocate(&inp).unwrap();
        let slow = &a.hosts[1];
        assert!((slow.dead_s - (6.0 * slow.wait_s - 2.0)).abs() < 1e-9);
        assert_eq!(slow.saturating_clients, 2);
        assert!(
            a.warnings.iter().any(|w| w.starts_with("slow: dead time")),
            "{:?}",
            a.warnings
        );
        // Two clients saturate it (almost exactly): next to no dead time.
        let inp = input(
            vec![host("a", 2, 2.0, None), host("slow", 2, 2.0, Some(1e6))],
            40,
        );
        let a = allocate(&inp).unwrap();
        assert!(a.hosts[1].dead_s < 0.01);
    }

    #[test]
    fn link_bound_host_gets_what_its_link_can_carry() {
        // 1 MB units over 1 MB/s: the slow host can take about t/1.001 units in time t.
        let inp = input(
            vec![host("a", 4, 0.1, None), host("slow", 2, 0.1, Some(1e6))],
            100,
        );
        let a = allocate(&inp).unwrap();
        let slow = &a.hosts[1];
        assert!(a.warnings.iter().any(|w| w.starts_with("slow: link-bound")));
        // The link's time for the slow host's units fits the balanced time.
        assert!(slow.share * slow.wait_s + 0.1 <= a.balanced_s + 1e-6, "{a}");
        // Whole-unit predictions of the two hosts are within one unit's time of each other.
        let d = (a.hosts[0].predicted_s - slow.predicted_s).abs();
        assert!(d < 1.01 + 0.1, "{a}");
    }

    #[test]
    fn results_larger_than_units_bind_the_link_back() {
        // 1 MB units out at 10 MB/s, 8 MB results back at the same rate (sub-channels' power):
        // the far host's link carries a result in 0.8 s, so in the balanced time t it can
        // return about t/0.8 units, whatever the link out could take.
        let mut inp = input(
            vec![host("a", 4, 0.1, None), host("far", 4, 0.1, Some(1e7))],
            100,
        );
        inp.result_bytes = 8e6;
        let a = allocate(&inp).unwrap();
        let far = &a.hosts[1];
        assert!(
            a.warnings
                .iter()
                .any(|w| w.starts_with("far: link-bound") && w.contains("results back")),
            "{a}"
        );
        // Its share's results, its last unit and the last result's return fit the run.
        assert!(far.share * 0.8 + 0.1 + 0.8 <= a.balanced_s + 1e-6, "{a}");
        assert!(far.predicted_s >= far.units as f64 * 0.8, "{a}");
        // Results the size of units leave the link out the binding direction, as before.
        inp.result_bytes = 1e6;
        let before = allocate(&inp).unwrap();
        assert!(before.hosts[1].units > far.units, "{before}");
        assert!(!before.warnings.iter().any(|w| w.contains("results back")));
    }

    #[test]
    fn saturation_boundary() {
        assert_eq!(saturating(2.0, 1.0), 2);
        assert_eq!(saturating(2.5, 1.0), 3);
        assert_eq!(saturating(0.5, 1.0), 1);
        assert_eq!(saturating(1e-9, 1.0), 1);
        assert_eq!(saturating(7.0, 0.5), 14);
        assert_eq!(saturating(1.0, 0.0), usize::MAX);
    }

    #[test]
    fn hopeless_host_is_left_out() {
        // A host whose start-up alone takes longer than everyone else's whole run.
        let inp = input(
            vec![host("a", 4, 0.01, None), host("far", 50, 0.01, Some(1e5))],
            20,
        );
        let a = allocate(&inp).unwrap();
        assert_eq!(a.hosts[1].units, 0);
        assert_eq!(a.hosts[0].units, 20);
        assert!(a.warnings.iter().any(|w| w.starts_with("far: left out")));
    }

    #[test]
    fn errors() {
        let inp = input(vec![host("a", 0, 1.0, None)], 5);
        assert_eq!(allocate(&inp), Err(BalanceError::NoClients));
        let inp = input(vec![host("a", 1, 0.0, None)], 5);
        assert!(matches!(
            allocate(&inp),
            Err(BalanceError::BadValue {
                what: "time per unit",
                ..
            })
        ));
        let inp = input(vec![host("a", 1, 1.0, Some(-3.0))], 5);
        assert!(allocate(&inp).is_err());
        let mut inp = shared(vec![host("a", 1, 1.0, None)], 5, 0.0, 0.0);
        assert!(matches!(
            allocate(&inp),
            Err(BalanceError::BadValue {
                what: "core count",
                ..
            })
        ));
        inp.machines.clear();
        assert!(matches!(
            allocate(&inp),
            Err(BalanceError::BadValue {
                what: "machine index",
                ..
            })
        ));
    }
}
