//! Starting a job over several meta hosts from a description file
//! (MetaMPICH's `mpirun -meta`): routers first, then the ranks, with the
//! layout of `metampi-config` (PACX-MPI numbering: meta hosts in file order,
//! ranks contiguous per host).
//!
//! This launcher starts meta hosts whose `LAUNCH` is `local` (sites emulated on
//! this machine, each node a separate emulated machine) or `netns NAME` (the
//! same inside a Linux network namespace, with the addresses given there:
//! `ip netns exec NAME` runs its routers and ranks).

use std::ffi::OsString;
use std::io::BufReader;
use std::process::{Child, Command, Stdio};

use metampi_config::{Launch, Layout};
use metampi_launch::{AppSpec, Host};

use crate::router::{read_ready, OutLink, RouterSpec};

/// Environment variable that carries a router's spec to a router process.
pub const ROUTER_SPEC_ENV: &str = "METAMPI_ROUTER_SPEC";

/// The running routers of a job; killed when dropped.
pub struct Routers {
    children: Vec<Child>,
}

impl Drop for Routers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What the ranks of a meta job need: placement and environment.
pub struct MetaPlan {
    pub world_size: usize,
    /// One emulated machine per node, in rank order.
    pub hosts: Vec<Host>,
    /// Variables for every rank (`METAMPI_SITES`, `METAMPI_ROUTERS`).
    pub env: Vec<(String, String)>,
    /// Per entry of `hosts`: the command that runs a process there
    /// (`ip netns exec NAME`), empty for this machine as it is.
    pub prefixes: Vec<Vec<OsString>>,
}

impl MetaPlan {
    /// The applications that run `program args...` on every rank: one when
    /// every host runs processes as they are, else one per host with its
    /// prefix (ranks stay numbered host after host).
    pub fn apps(&self, program: &OsString, args: &[OsString]) -> Vec<AppSpec> {
        if self.prefixes.iter().all(Vec::is_empty) {
            return vec![AppSpec::new(self.world_size, program).args(args)];
        }
        self.hosts
            .iter()
            .zip(&self.prefixes)
            .map(|(h, pre)| match pre.split_first() {
                None => AppSpec::new(h.slots, program).args(args),
                Some((p, rest)) => AppSpec::new(h.slots, p).args(rest).arg(program).args(args),
            })
            .collect()
    }
}

/// The command prefix that starts a process on meta host `launch`.
fn prefix(launch: &Launch) -> Vec<OsString> {
    match launch {
        Launch::Netns(ns) => ["ip", "netns", "exec", ns.as_str()]
            .iter()
            .map(OsString::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// The router spec for every router in the layout.
pub fn router_specs(layout: &Layout) -> Vec<RouterSpec> {
    layout
        .routers
        .iter()
        .map(|r| RouterSpec {
            id: r.id,
            vertical: "127.0.0.1:0".into(),
            listen: r
                .listen
                .iter()
                .map(|l| format!("{}:{}", l.address, l.port))
                .collect(),
            out: r
                .links_out
                .iter()
                .map(|&l| {
                    let link = &layout.links[l];
                    OutLink {
                        addr: format!("{}:{}", link.dst_address, link.port),
                        bytes_per_sec: link.options.bandwidth.map(|b| b.bytes_per_sec()),
                        latency: link.options.latency,
                        compression: match link.options.compression {
                            metampi_config::Compression::Off => "off",
                            metampi_config::Compression::Lz4 => "lz4",
                            metampi_config::Compression::Zstd => "zstd",
                            _ => "auto",
                        }
                        .into(),
                        link_id: link.id as u32,
                        peer: link.peer_router,
                    }
                })
                .collect(),
        })
        .collect()
}

/// Starts every router as `program args...` (with the spec in the
/// environment) and returns the plan for the ranks.
pub fn start(
    layout: &Layout,
    program: &OsString,
    args: &[OsString],
    env: &[(OsString, OsString)],
) -> std::io::Result<(Routers, MetaPlan)> {
    start_with_dial(layout, program, args, env, &mut |a| Ok(a.to_string()))
}

/// Like [`start`], but routers dial `dial(addr)` instead of each link's
/// `addr`: a proxy in between can watch or disturb the link (tests use it to
/// inject faults).
pub fn start_with_dial(
    layout: &Layout,
    program: &OsString,
    args: &[OsString],
    env: &[(OsString, OsString)],
    dial: &mut dyn FnMut(&str) -> std::io::Result<String>,
) -> std::io::Result<(Routers, MetaPlan)> {
    for h in &layout.hosts {
        if !matches!(h.launch, Launch::Local | Launch::Netns(_)) {
            return Err(std::io::Error::other(format!(
                "meta host `{}`: LAUNCH = {} is not supported by this launcher yet (local and netns are)",
                h.name, h.launch
            )));
        }
    }
    let mut routers = Routers {
        children: Vec::new(),
    };
    // Routers and ranks of the job prove this secret to each other.
    let secret = match std::env::var("METAMPI_SECRET") {
        Ok(s) => s,
        Err(_) => crate::auth::Secret::random()?.to_hex(),
    };
    let mut endpoints = Vec::new();
    for mut spec in router_specs(layout) {
        for o in &mut spec.out {
            o.addr = dial(&o.addr)?;
        }
        let r = &layout.routers[spec.id];
        let pre = prefix(&layout.hosts[r.host].launch);
        let mut cmd = match pre.split_first() {
            Some((p, rest)) => {
                let mut c = Command::new(p);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        let mut child = cmd
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env(ROUTER_SPEC_ENV, spec.to_line())
            .env("METAMPI_SECRET", &secret)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("router stdout"))?;
        routers.children.push(child);
        let port = read_ready(&mut BufReader::new(out))?;
        endpoints.push(format!("{}>{}@127.0.0.1:{port}", r.host, r.peer));
    }
    let hosts = layout
        .hosts
        .iter()
        .flat_map(|h| {
            h.nodes
                .iter()
                .filter(|n| n.nprocs > 0)
                .map(move |n| Host::new(format!("{}.{}", h.name, n.name), n.nprocs))
        })
        .collect();
    let prefixes = layout
        .hosts
        .iter()
        .flat_map(|h| {
            h.nodes
                .iter()
                .filter(|n| n.nprocs > 0)
                .map(move |_| prefix(&h.launch))
        })
        .collect();
    let sites: Vec<String> = layout
        .hosts
        .iter()
        .map(|h| h.ranks.len().to_string())
        .collect();
    let plan = MetaPlan {
        world_size: layout.world_size,
        hosts,
        env: vec![
            ("METAMPI_SITES".into(), sites.join(",")),
            ("METAMPI_ROUTERS".into(), endpoints.join(",")),
            ("METAMPI_SECRET".into(), secret),
            (
                "METAMPI_SITE_ORDERS".into(),
                layout
                    .hosts
                    .iter()
                    .map(|h| match h.byte_order {
                        metampi_config::ByteOrder::Big => "big",
                        metampi_config::ByteOrder::Little => "little",
                        _ => "native",
                    })
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ],
        prefixes,
    };
    Ok((routers, plan))
}

/// Runs a router from [`ROUTER_SPEC_ENV`] if this process was started as one.
/// Returns `false` when the variable is not set.
pub fn run_router_from_env() -> bool {
    let Some(line) = std::env::var_os(ROUTER_SPEC_ENV) else {
        return false;
    };
    let spec = match RouterSpec::parse(&line.to_string_lossy()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("metampi router: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = crate::router::run(&spec) {
        eprintln!("metampi router {}: {e}", spec.id);
        std::process::exit(1);
    }
    true
}
