//! Multi-rank tests under plain `cargo test`.
//!
//! [`Ranks::run`] re-runs the current test executable `n` times, filtered to
//! the calling test, as the ranks of one job; in those child processes the
//! same call runs the body on the world communicator instead.
//!
//! ```no_run
//! use metampi::testing::Ranks;
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

use std::ffi::OsString;
use std::time::Duration;

use metampi_launch::{AppSpec, Host, JobSpec, LaunchMethod, OutputMode, StdinTarget};

use crate::topology::SimpleCommunicator;

const CHILD_ENV: &str = "METAMPI_TEST_RANK_OF";

/// A multi-rank test job.
#[derive(Debug, Clone)]
pub struct Ranks {
    n: usize,
    env: Vec<(OsString, OsString)>,
    nodes: Vec<(String, usize)>,
    meta: Option<String>,
    timeout: Duration,
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
        }
    }

    /// Sets an environment variable for every rank.
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Ranks {
        self.env.push((k.into(), v.into()));
        self
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

    /// Time limit for the whole job (default 120 s).
    pub fn timeout(mut self, t: Duration) -> Ranks {
        self.timeout = t;
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
        if std::env::var(CHILD_ENV).as_deref() == Ok(test_name)
            && crate::meta::run_router_from_env()
        {
            return None;
        }
        if std::env::var(CHILD_ENV).as_deref() == Ok(test_name) {
            let universe = crate::initialize().expect("a test rank initializes once");
            body(&universe.world());
            drop(universe);
            return None;
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
            // The routers are this executable too, started with the child marker.
            let marker = [(OsString::from(CHILD_ENV), OsString::from(test_name))];
            let exe_os = exe.clone().into_os_string();
            let (routers, plan) = crate::meta::start(cfg.layout_ref(), &exe_os, &args, &marker)
                .unwrap_or_else(|e| panic!("starting routers: {e}"));
            n = plan.world_size;
            meta = Some((routers, plan));
        }
        let app = AppSpec::new(n, &exe).args(&args);
        let mut spec = JobSpec::new()
            .app(app)
            .env(CHILD_ENV, test_name)
            .stdin(StdinTarget::None)
            .output(OutputMode::Terminal)
            .timeout(self.timeout);
        for (k, v) in self.env {
            spec = spec.env(k, v);
        }
        if !self.nodes.is_empty() {
            spec = spec
                .hosts(self.nodes.iter().map(|(h, s)| Host::new(h.clone(), *s)))
                .launch(LaunchMethod::Local);
        }
        if let Some((_, plan)) = &meta {
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

/// Whether this process is a rank started by [`Ranks`] (not the test that
/// launches them), so set-up that belongs to the launching side can be skipped.
pub fn is_rank() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
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
}

impl NetnsPair {
    /// Creates the pair; names derive from `tag` and this process, so
    /// concurrent tests do not collide. Fails (with the reason) where
    /// namespaces cannot be made, for example without root.
    pub fn create(tag: &str) -> Result<NetnsPair, String> {
        let h = tag
            .bytes()
            .chain(std::process::id().to_le_bytes())
            .fold(0x811c_9dc5u32, |h, b| {
                (h ^ b as u32).wrapping_mul(0x0100_0193)
            });
        let names = [format!("mpt{h:08x}a"), format!("mpt{h:08x}b")];
        let veth = [format!("mv{h:08x}a"), format!("mv{h:08x}b")];
        let pair = NetnsPair {
            names,
            addrs: ["10.77.0.1", "10.77.0.2"],
        };
        let ip = |args: &[&str]| -> Result<(), String> {
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
        };
        let [a, b] = &pair.names;
        ip(&["netns", "add", a])?;
        ip(&["netns", "add", b])?;
        ip(&[
            "link", "add", &veth[0], "type", "veth", "peer", "name", &veth[1],
        ])?;
        for ((ns, addr), dev) in pair.names.iter().zip(pair.addrs).zip(&veth) {
            let cidr = format!("{addr}/24");
            ip(&["link", "set", dev, "netns", ns])?;
            ip(&["-n", ns, "addr", "add", &cidr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
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
