//! Multi-rank tests of metampi programs under plain `cargo test`.
//!
//! [`Ranks::run`] re-runs the current test executable `n` times, filtered to
//! the calling test, as the ranks of one job; in those child processes the
//! same call runs the body on the world communicator instead.
//!
//! ```no_run
//! use metampi_testkit::Ranks;
//! use metampi::traits::*;
//!
//! #[test]
//! fn ring() {
//!     Ranks::new(4).run("ring", |world| {
//!         let next = (world.rank() + 1) % world.size();
//!         let prev = (world.rank() + world.size() - 1) % world.size();
//!         let (got, _) = metampi::point_to_point::send_receive::<i32, _, _, _>(
//!             &world.rank(), &world.process_at_rank(next), &world.process_at_rank(prev));
//!         assert_eq!(got, prev);
//!     });
//! }
//! ```

#![forbid(unsafe_code)]

pub mod slurm;
pub mod traffic;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use metampi_launch::{AppSpec, Host, JobSpec, LaunchMethod, OutputMode, StdinTarget};

use metampi::topology::SimpleCommunicator;

/// Engine counters and introspection (`chunks_helped`, `socket_looks`, ...).
pub use metampi::counters::*;

const CHILD_ENV: &str = "METAMPI_TEST_RANK_OF";

/// The counts of every fault proxy of a job, filled as the proxies start.
pub type ProxyCounts = Arc<std::sync::Mutex<Vec<Arc<FaultCounts>>>>;

/// A multi-rank test job.
#[derive(Debug, Clone)]
pub struct Ranks {
    n: usize,
    env: Vec<(OsString, OsString)>,
    nodes: Vec<(String, usize)>,
    meta: Option<String>,
    timeout: Duration,
    stall: Option<Duration>,
    faults: Option<(Faults, ProxyCounts)>,
    bind: metampi_launch::Binding,
    capture_tagged: bool,
    output_dir: Option<std::path::PathBuf>,
}

impl Ranks {
    /// `n` ranks on this machine.
    pub fn new(n: usize) -> Ranks {
        Ranks {
            n,
            env: Vec::new(),
            nodes: Vec::new(),
            meta: None,
            timeout: Duration::from_secs(120),
            stall: None,
            faults: None,
            bind: metampi_launch::Binding::None,
            capture_tagged: false,
            output_dir: None,
        }
    }

    /// Writes every rank's output to files in `dir` (`metampi run
    /// --output-dir`): `rank.R.stdout` and `rank.R.stderr`.
    pub fn output_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Ranks {
        self.output_dir = Some(dir.into());
        self
    }

    /// Labels every output line with its rank (`metampi run --tag-output`)
    /// and keeps the output in the [`Ranks::outcome`] instead of showing it.
    pub fn capture_tagged(mut self) -> Ranks {
        self.capture_tagged = true;
        self
    }

    /// Binds the ranks to CPUs as `metampi run --bind-to` does.
    pub fn bind(mut self, binding: metampi_launch::Binding) -> Ranks {
        self.bind = binding;
        self
    }

    /// Sets an environment variable for every rank.
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Ranks {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Has the routers of a [`Ranks::meta`] job write their statistics to
    /// `dir` (`METAMPI_ROUTER_STATS`), and tells the ranks where.
    pub fn router_stats(self, dir: &StatsDir) -> Ranks {
        self.env("METAMPI_ROUTER_STATS", dir.path())
    }

    /// Forces TCP between ranks on this machine (no shared memory).
    pub fn force_tcp(self, yes: bool) -> Ranks {
        if yes {
            self.env("METAMPI_FORCE_TCP", "1")
        } else {
            self
        }
    }

    /// Emulates several machines: `(name, slots)` per machine; ranks on
    /// different names talk over TCP on loopback.
    pub fn nodes(mut self, nodes: &[(&str, usize)]) -> Ranks {
        self.nodes = nodes.iter().map(|&(h, s)| (h.to_string(), s)).collect();
        self
    }

    /// Runs the ranks as the meta computer described by `config` (the
    /// description language of `metampi-config`, meta hosts with
    /// `LAUNCH = local`): routers between the sites, the rank count from the
    /// file (the `n` given to [`Ranks::new`] is ignored).
    pub fn meta(mut self, config: &str) -> Ranks {
        self.meta = Some(config.to_string());
        self
    }

    /// Puts a [`FaultProxy`] with `faults` in every router link of a
    /// [`Ranks::meta`] job; the returned list fills with their counts.
    pub fn faulty_links(mut self, faults: Faults) -> (Ranks, ProxyCounts) {
        let counts = Arc::new(std::sync::Mutex::new(Vec::new()));
        self.faults = Some((faults, Arc::clone(&counts)));
        (self, counts)
    }

    /// Time limit for the whole job (default 120 s).
    pub fn timeout(mut self, t: Duration) -> Ranks {
        self.timeout = t;
        self
    }

    /// Ends the job when nothing in it moves for `limit` (`metampi run --stall-timeout`).
    pub fn stall_timeout(mut self, limit: Duration) -> Ranks {
        self.stall = Some(limit);
        self
    }

    /// Runs `body` on every rank. `test_name` is the test's name as `cargo
    /// test` lists it (the function name for an integration test).
    ///
    /// # Panics
    /// In the parent, when any rank fails (the message names it).
    pub fn run(self, test_name: &str, body: impl FnOnce(&SimpleCommunicator)) {
        let n = self.n;
        if let Some(outcome) = self.outcome(test_name, body) {
            if let Some(f) = &outcome.failure {
                panic!("{test_name} on {n} ranks failed: {f}");
            }
        }
    }

    /// Like [`Ranks::run`], but hands the job's outcome to the parent instead
    /// of panicking on failure (for tests of failures). `None` in the ranks.
    pub fn outcome(
        self,
        test_name: &str,
        body: impl FnOnce(&SimpleCommunicator),
    ) -> Option<metampi_launch::JobOutcome> {
        if metampi::knobs::text(CHILD_ENV).as_deref() == Some(test_name)
            && metampi_router::run_from_env()
        {
            return None;
        }
        if metampi::knobs::text(CHILD_ENV).as_deref() == Some(test_name) {
            let universe = metampi::initialize().expect("a test rank initializes once");
            let world = universe.world();
            let body = std::panic::AssertUnwindSafe(|| body(&world));
            if std::panic::catch_unwind(body).is_err() {
                // The panic's message is on stderr already. The rank leaves as a panicking one
                // does (no finalization, the panic's exit code) without libtest's `FAILED`
                // report, which in the log of a test that expects the panic reads as a failure
                // of the suite. The parent judges the job.
                std::process::exit(101);
            }
            drop(universe);
            return None;
        }
        // The ranks run this executable filtered to `test_name`: a name that is not this
        // test's would run no test there, and the job would pass having run nothing.
        // libtest names a test's thread after the test.
        if let Some(thread) = std::thread::current().name() {
            assert!(
                thread == "main" || thread == test_name,
                "Ranks::run(\"{test_name}\") is called from test `{thread}`: the ranks would \
                 run no test"
            );
        }
        let exe = std::env::current_exe().expect("the test executable has a path");
        let args: Vec<OsString> = [
            test_name,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let mut n = self.n;
        let mut meta = None;
        if let Some(text) = &self.meta {
            let cfg =
                metampi_config::parse_str("test.meta", text).unwrap_or_else(|e| panic!("{e}"));
            // The routers are this executable too, started with the child
            // marker; they get the job's variables as well.
            let mut marker = vec![(OsString::from(CHILD_ENV), OsString::from(test_name))];
            marker.extend(self.env.iter().cloned());
            let exe_os = exe.clone().into_os_string();
            let mut proxies = Vec::new();
            let mut dial = |addr: &str| -> std::io::Result<String> {
                let Some((f, counts)) = &self.faults else {
                    return Ok(addr.to_string());
                };
                let mut f = *f;
                f.seed ^= proxies.len() as u64;
                // A router link's handshake passes untouched: challenge (16
                // bytes) and proof (32) back, answer (48) and hello (16) forth.
                let p = FaultProxy::start(addr, f, (64, 48))?;
                counts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Arc::clone(&p.counts));
                let a = p.addr().to_string();
                proxies.push(p);
                Ok(a)
            };
            let (routers, plan) = metampi_launch::meta::start_with_dial(
                cfg.layout_ref(),
                &exe_os,
                &args,
                &marker,
                &mut dial,
            )
            .unwrap_or_else(|e| panic!("starting routers: {e}"));
            n = plan.world_size;
            meta = Some((routers, plan, proxies));
        }
        let app = AppSpec::new(n, &exe).args(&args);
        let mut spec = JobSpec::new()
            .app(app)
            .env(CHILD_ENV, test_name)
            .stdin(StdinTarget::None)
            .output(match (self.output_dir, self.capture_tagged) {
                (Some(dir), _) => OutputMode::Directory(dir),
                (None, true) => OutputMode::Capture,
                (None, false) => OutputMode::Terminal,
            })
            .tag_output(self.capture_tagged)
            .timeout(self.timeout)
            .bind(self.bind);
        for (k, v) in self.env {
            spec = spec.env(k, v);
        }
        if let Some(limit) = self.stall {
            spec = spec.stall_timeout(limit);
        }
        if !self.nodes.is_empty() {
            spec = spec
                .hosts(self.nodes.iter().map(|(h, s)| Host::new(h.clone(), *s)))
                .launch(LaunchMethod::Local);
        }
        if let Some((_, plan, _)) = &meta {
            let exe = exe.clone().into_os_string();
            spec = spec
                .replace_apps(plan.apps(&exe, &args))
                .hosts(plan.hosts.clone())
                .launch(LaunchMethod::Local);
            for (k, v) in &plan.env {
                spec = spec.env(k, v);
            }
        }
        Some(
            metampi_launch::run(&spec)
                .unwrap_or_else(|e| panic!("launching {test_name} failed: {e}")),
        )
    }
}

/// Processes (routers or ranks) of the test `name` started by [`Ranks`], found by the
/// marker they carry in their environment; `with` narrows them to those whose environment
/// also holds a variable starting so (`METAMPI_ROUTER_SPEC=` for routers).
pub fn processes_of(name: &str, with: Option<&str>) -> Vec<u32> {
    let marker = format!("{CHILD_ENV}={name}");
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        let has = |v: &str| vars.iter().any(|x| x.starts_with(v.as_bytes()));
        if has(&marker) && with.is_none_or(has) {
            found.push(pid);
        }
    }
    found
}

/// Whether this process is a rank started by [`Ranks`] (not the test that
/// launches them), so set-up that belongs to the launching side can be skipped.
pub fn is_rank() -> bool {
    metampi::knobs::os(CHILD_ENV).is_some()
}

/// A directory for the router statistics of one test job: made fresh in the
/// test itself (named after the test and the process), found again, the same
/// path, in the job's ranks and routers through `METAMPI_ROUTER_STATS`
/// (which [`Ranks::router_stats`] gives them). Removed when the test's own
/// copy is dropped.
#[derive(Debug)]
pub struct StatsDir {
    path: std::path::PathBuf,
    owner: bool,
}

impl StatsDir {
    /// # Panics
    /// When the directory cannot be made.
    pub fn new(test_name: &str) -> StatsDir {
        if let (true, Some(d)) = (is_rank(), metampi::knobs::os("METAMPI_ROUTER_STATS")) {
            return StatsDir {
                path: d.into(),
                owner: false,
            };
        }
        let path = std::env::temp_dir().join(format!(
            "metampi-stats-{}-{}",
            test_name.replace("::", "-"),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("making {}: {e}", path.display()));
        StatsDir { path, owner: true }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// The routers' per-link statistics files in `dir` (a [`StatsDir`]) on one
/// side, `"out"` (the sending ends) or `"in"` (the receiving ends): each
/// file's name and text. Files being rewritten are read as they are.
pub fn link_stats(dir: &std::path::Path, side: &str) -> Vec<(String, String)> {
    let suffix = format!("-{side}.json");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(String, String)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours =
                name.starts_with("router-") && name.contains("-link-") && name.ends_with(&suffix);
            ours.then(|| {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                (name, text)
            })
        })
        .collect();
    files.sort();
    files
}

/// A whole-number field (`"key":123`) of a statistics file's JSON text.
pub fn stats_number(json: &str, key: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(json)
        .ok()?
        .get(key)?
        .as_u64()
}

/// The sum of field `key` over the link statistics of one side (see
/// [`link_stats`]).
pub fn link_total(dir: &std::path::Path, side: &str, key: &str) -> u64 {
    link_stats(dir, side)
        .iter()
        .filter_map(|(_, text)| stats_number(text, key))
        .sum()
}

impl Drop for StatsDir {
    fn drop(&mut self) {
        if self.owner {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Two Linux network namespaces joined by a veth pair, with addresses
/// `10.77.0.1` and `10.77.0.2`: two sites with real addresses on one
/// machine. Removed again when dropped.
#[derive(Debug)]
pub struct NetnsPair {
    /// Namespace names.
    pub names: [String; 2],
    /// The address of each namespace's end of the veth pair.
    pub addrs: [&'static str; 2],
    /// The veth pair's ends, in `names` order.
    veth: [String; 2],
}

impl NetnsPair {
    /// Creates the pair; names derive from `tag` and this process, so
    /// concurrent tests do not collide. Fails (with the reason) where
    /// namespaces cannot be made, for example without root. Pairs left by
    /// test processes that are gone (killed before their drop) are removed
    /// first: the names carry the owner's pid.
    pub fn create(tag: &str) -> Result<NetnsPair, String> {
        let pid = std::process::id();
        let h = tag
            .bytes()
            .chain(pid.to_le_bytes())
            .fold(0x811c_9dc5u32, |h, b| {
                (h ^ b as u32).wrapping_mul(0x0100_0193)
            });
        sweep_orphan_netns();
        let names = [format!("mpt{pid}-{h:08x}a"), format!("mpt{pid}-{h:08x}b")];
        let veth = [format!("mv{h:08x}a"), format!("mv{h:08x}b")];
        let pair = NetnsPair {
            names,
            addrs: ["10.77.0.1", "10.77.0.2"],
            veth: veth.clone(),
        };
        let [a, b] = &pair.names;
        run_ip(&["netns", "add", a])?;
        run_ip(&["netns", "add", b])?;
        run_ip(&[
            "link", "add", &veth[0], "type", "veth", "peer", "name", &veth[1],
        ])?;
        for ((ns, addr), dev) in pair.names.iter().zip(pair.addrs).zip(&veth) {
            let cidr = format!("{addr}/24");
            run_ip(&["link", "set", dev, "netns", ns])?;
            run_ip(&["-n", ns, "addr", "add", &cidr, "dev", dev])?;
            run_ip(&["-n", ns, "link", "set", dev, "up"])?;
            run_ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    /// As [`NetnsPair::create`], or `None` after saying on stderr that `test`
    /// is skipped and why.
    pub fn create_or_skip(test: &str) -> Option<NetnsPair> {
        NetnsPair::create(test)
            .map_err(|e| eprintln!("SKIPPED {test}: cannot create network namespaces here ({e})"))
            .ok()
    }

    /// A description of two meta hosts `a` and `b`, one in each namespace at
    /// its address with `procs` ranks, joined by one pair of routers whose
    /// links take ports from `portbase`.
    pub fn description(&self, portbase: u16, procs: [usize; 2]) -> String {
        format!(
            "PORTBASE {portbase}\n\
             METAHOST a {{ LAUNCH = netns {}; NPROCS = {}; NODES = a0 ({}); }}\n\
             METAHOST b {{ LAUNCH = netns {}; NPROCS = {}; NODES = b0 ({}); }}\n\
             PAIR a b 1\na0 <-> b0\n",
            self.names[0], procs[0], self.addrs[0], self.names[1], procs[1], self.addrs[1]
        )
    }

    /// Limits the line to `rate` (as `tc` writes it, e.g. `20mbit`) each way
    /// with a token bucket: a real kernel-shaped slow line, whose queue and
    /// drops TCP has to live with (unlike the routers' own emulation).
    pub fn limit(&self, rate: &str) -> Result<(), String> {
        for (ns, dev) in self.names.iter().zip(&self.veth) {
            let args = [
                "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                "burst", "64kb", "latency", "50ms",
            ];
            run_ip(&args)?;
        }
        Ok(())
    }
}

/// Removes the namespaces of [`NetnsPair`]s whose test process is gone.
fn sweep_orphan_netns() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if netns_owner(&name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = run_ip(&["netns", "del", &name]);
        }
    }
}

/// The pid in a [`NetnsPair`] namespace's name (`mpt<pid>-<hash><a|b>`).
fn netns_owner(name: &str) -> Option<u32> {
    let (pid, rest) = name.strip_prefix("mpt")?.split_once('-')?;
    (rest.len() == 9).then_some(())?;
    pid.parse().ok()
}

/// Runs `ip ARGS`; the error quotes the command and what it printed.
fn run_ip(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", n])
                .output();
        }
    }
}

/// Faults a [`FaultProxy`] injects, as probabilities per forwarded chunk.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Flip one bit.
    pub flip: f64,
    /// Drop the chunk.
    pub drop: f64,
    /// Send the chunk twice.
    pub duplicate: f64,
    /// Hold the chunk back and send it after the next one.
    pub swap: f64,
    /// Pause a few milliseconds before sending.
    pub delay: f64,
    /// Cut the connection (both directions).
    pub cut: f64,
    /// Cut each connection this long after it was made (its router dials again): a link
    /// cut and restored on a schedule. Zero: never.
    pub cut_every: Duration,
    /// After this many chunks (all connections together) the link goes down
    /// for good: connections are cut and new ones refused. 0: never.
    pub down_after: u64,
    /// The first connection of each proxy forwards nothing, in either direction, for
    /// `freeze.1` from `freeze.0` after it was made, and stays open: what the ends of a
    /// TCP connection see while it backs off after repeated losses (a stream that neither
    /// delivers nor breaks). Zero `freeze.1`: never.
    pub freeze: (Duration, Duration),
    /// Seed of the proxy's random choices.
    pub seed: u64,
    /// Keep up to this many of the bytes forwarded in each direction (all
    /// connections together) in [`FaultCounts::recorded`], to inspect what
    /// travels on the wire. 0: keep none.
    pub record: usize,
}

/// Counts of what a [`FaultProxy`] did.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub chunks: AtomicU64,
    pub flipped: AtomicU64,
    pub dropped: AtomicU64,
    pub duplicated: AtomicU64,
    pub swapped: AtomicU64,
    pub delayed: AtomicU64,
    pub cut: AtomicU64,
    /// Directions of connections held frozen ([`Faults::freeze`]).
    pub frozen: AtomicU64,
    /// The proxy went down for good ([`Faults::down_after`]).
    pub down: AtomicBool,
    /// The bytes forwarded towards the target (`[0]`) and back (`[1]`), as
    /// they were sent on (up to [`Faults::record`] each).
    pub recorded: [std::sync::Mutex<Vec<u8>>; 2],
}

impl FaultCounts {
    /// A copy of the bytes recorded in direction `dir` (0: towards the
    /// target, 1: back).
    pub fn recorded(&self, dir: usize) -> Vec<u8> {
        self.recorded[dir]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn record(&self, dir: usize, limit: usize, bytes: &[u8]) {
        if limit == 0 {
            return;
        }
        let mut r = self.recorded[dir].lock().unwrap_or_else(|p| p.into_inner());
        let room = limit.saturating_sub(r.len());
        r.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Faults injected in all.
    pub fn injected(&self) -> u64 {
        [
            &self.flipped,
            &self.dropped,
            &self.duplicated,
            &self.swapped,
            &self.cut,
            &self.frozen,
        ]
        .iter()
        .map(|c| c.load(AtomicOrdering::Relaxed))
        .sum()
    }
}

/// A TCP proxy on loopback that forwards every connection to `target` and
/// disturbs the bytes: flipped bits, lost, duplicated and reordered chunks,
/// pauses and cut connections, chosen by a seeded generator. The first
/// `skip.0` bytes towards the target and `skip.1` bytes back (a router
/// link's handshake) pass untouched.
pub struct FaultProxy {
    addr: std::net::SocketAddr,
    /// What was done so far.
    pub counts: Arc<FaultCounts>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// Starts the proxy for `target` (`host:port`).
    pub fn start(
        target: &str,
        faults: Faults,
        skip: (usize, usize),
    ) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let counts = Arc::new(FaultCounts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, target) = (Arc::clone(&counts), Arc::clone(&stop), target.to_string());
        std::thread::spawn(move || {
            let mut conn_no = 0u64;
            while !s.load(AtomicOrdering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if c.down.load(AtomicOrdering::Relaxed) {
                            drop(client);
                            continue;
                        }
                        conn_no += 1;
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        let _ = client.set_nonblocking(false);
                        let seed = faults.seed ^ conn_no.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                        let mut f = faults;
                        if conn_no > 1 {
                            f.freeze = (Duration::ZERO, Duration::ZERO);
                        }
                        pump_pair(client, server, f, seed, skip, &c, &s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(FaultProxy { addr, counts, stop })
    }

    /// Where to connect instead of the target.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, AtomicOrdering::Relaxed);
    }
}

/// Forwards both directions of one proxied connection on two threads.
fn pump_pair(
    client: TcpStream,
    server: TcpStream,
    faults: Faults,
    seed: u64,
    skip: (usize, usize),
    counts: &Arc<FaultCounts>,
    stop: &Arc<AtomicBool>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (k1, k2) = (Arc::clone(counts), Arc::clone(counts));
    let (st1, st2) = (Arc::clone(stop), Arc::clone(stop));
    std::thread::spawn(move || pump(client, server, faults, seed, (0, skip.0), &k1, &st1));
    std::thread::spawn(move || pump(s2, c2, faults, seed ^ 1, (1, skip.1), &k2, &st2));
}

/// Copies `from` to `to` chunk by chunk, applying `faults`; `dir` is the
/// direction (0 towards the target) for [`Faults::record`].
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    mut f: Faults,
    seed: u64,
    (dir, mut skip): (usize, usize),
    n: &FaultCounts,
    stop: &AtomicBool,
) {
    use rand_core_lite::Rng64;
    let mut rng = Rng64::new(seed);
    let mut buf = vec![0u8; 16 << 10];
    let mut held: Option<Vec<u8>> = None;
    let made = std::time::Instant::now();
    let cut = |a: &TcpStream, b: &TcpStream| {
        let _ = a.shutdown(std::net::Shutdown::Both);
        let _ = b.shutdown(std::net::Shutdown::Both);
    };
    loop {
        if stop.load(AtomicOrdering::Relaxed) {
            return cut(&from, &to);
        }
        let got = match from.read(&mut buf) {
            Ok(0) | Err(_) => return cut(&from, &to),
            Ok(k) => k,
        };
        let mut chunk = buf[..got].to_vec();
        if skip > 0 {
            // The hello passes as it is; faults start after it.
            let k = skip.min(chunk.len());
            skip -= k;
            n.record(dir, f.record, &chunk[..k]);
            if to.write_all(&chunk[..k]).is_err() {
                return cut(&from, &to);
            }
            chunk.drain(..k);
            if chunk.is_empty() {
                continue;
            }
        }
        let seen = n.chunks.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        if f.down_after > 0 && seen >= f.down_after {
            n.down.store(true, AtomicOrdering::Relaxed);
        }
        if n.down.load(AtomicOrdering::Relaxed) {
            return cut(&from, &to);
        }
        if !f.freeze.1.is_zero() && made.elapsed() >= f.freeze.0 {
            // Once per direction: the chunk in hand waits with the rest.
            n.frozen.fetch_add(1, AtomicOrdering::Relaxed);
            std::thread::sleep(f.freeze.1);
            f.freeze.1 = Duration::ZERO;
        }
        let due = !f.cut_every.is_zero() && made.elapsed() >= f.cut_every;
        if due || rng.chance(f.cut) {
            n.cut.fetch_add(1, AtomicOrdering::Relaxed);
            return cut(&from, &to);
        }
        if rng.chance(f.delay) {
            n.delayed.fetch_add(1, AtomicOrdering::Relaxed);
            std::thread::sleep(Duration::from_millis(1 + rng.below(5)));
        }
        if rng.chance(f.drop) {
            n.dropped.fetch_add(1, AtomicOrdering::Relaxed);
            continue;
        }
        if rng.chance(f.flip) {
            n.flipped.fetch_add(1, AtomicOrdering::Relaxed);
            let bit = rng.below(chunk.len() as u64 * 8);
            chunk[(bit / 8) as usize] ^= 1 << (bit % 8);
        }
        let mut out = Vec::new();
        if held.is_none() && rng.chance(f.swap) {
            n.swapped.fetch_add(1, AtomicOrdering::Relaxed);
            held = Some(chunk);
            continue;
        }
        out.push(chunk.clone());
        if rng.chance(f.duplicate) {
            n.duplicated.fetch_add(1, AtomicOrdering::Relaxed);
            out.push(chunk);
        }
        if let Some(h) = held.take() {
            out.push(h);
        }
        for c in out {
            n.record(dir, f.record, &c);
            if to.write_all(&c).is_err() {
                return cut(&from, &to);
            }
        }
    }
}

/// A small deterministic generator for the proxy (splitmix64), so the
/// library needs no random-number dependency.
mod rand_core_lite {
    pub struct Rng64(u64);

    impl Rng64 {
        pub fn new(seed: u64) -> Rng64 {
            Rng64(seed)
        }

        pub fn next(&mut self) -> u64 {
            crate::traffic::splitmix(&mut self.0)
        }

        pub fn chance(&mut self, p: f64) -> bool {
            let x = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
            p > 0.0 && x < p
        }

        pub fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }
}

#[cfg(test)]
mod netns_tests {
    use super::*;

    #[test]
    fn a_namespace_name_gives_its_owner() {
        assert_eq!(netns_owner("mpt123-0badcafea"), Some(123));
        assert_eq!(netns_owner("mpt123-0badcafeb"), Some(123));
        // The names of earlier versions carry no pid; other names are not ours.
        assert_eq!(netns_owner("mpt0badcafea"), None);
        assert_eq!(netns_owner("mpt12-x"), None);
        assert_eq!(netns_owner("site-a"), None);
    }

    /// A pair left by a process that is gone is removed when the next pair is made.
    #[test]
    fn a_dead_owners_namespace_is_swept() {
        let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4 << 20);
        // Above pid_max: never a live process.
        let orphan = format!("mpt{}-0000beefa", pid_max + 1);
        if let Err(e) = run_ip(&["netns", "add", &orphan]) {
            eprintln!("SKIPPED a_dead_owners_namespace_is_swept: cannot create network namespaces here ({e})");
            return;
        }
        let pair = NetnsPair::create("sweep");
        let left = Path::new("/run/netns").join(&orphan).exists();
        if left {
            let _ = run_ip(&["netns", "del", &orphan]);
        }
        assert!(pair.is_ok(), "{pair:?}");
        drop(pair);
        assert!(!left, "the orphan namespace {orphan} is still there");
    }
}
