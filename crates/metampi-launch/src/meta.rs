//! Starting a job over several meta hosts from a description file
//! (MetaMPICH's `mpirun -meta`): routers first, then the ranks, with the
//! layout of `metampi-config` (PACX-MPI numbering: meta hosts in file order,
//! ranks contiguous per host).
//!
//! How a meta host's routers and ranks start follows its `LAUNCH`:
//! - `local`: on this machine (sites emulated here, each node a separate
//!   emulated machine);
//! - `netns NAME`: the same inside a Linux network namespace, with the
//!   addresses given there (`ip netns exec NAME` runs its routers and ranks);
//! - `ssh DEST` and command templates: on the node, through ssh (to `DEST`, or
//!   to the node with `DEST` as jump host when the meta host has several
//!   nodes) or through the template, with the environment on the command line
//!   and the job secret on the first line of stdin (see
//!   [`crate::HostLaunch`]); routers listen for their site's ranks on
//!   the node's address and report their port through the launch command's
//!   stdout;
//! - `manual`: the launcher prints one command per node for the user to run
//!   there (nodes with routers but no ranks too: they are hosts without slots in
//!   the plan); its routers listen for ranks on fixed ports (after the highest
//!   link port of the layout), since nobody can read their ready line, and
//!   report to the launcher's key-value server instead: it learns that they are
//!   up (and holds the ranks back until they are), and they leave when it says
//!   that the job is over (see `metampi_router::run_from_env`).
//!
//! PACX-MPI startup commands (`Launch::Verbatim`) are refused: they start the
//! machine's own MPI, whose processes cannot join a metampi job.

use std::ffi::OsString;
use std::io::BufReader;
use std::process::{Child, Command, Stdio};

use crate::{AppSpec, Host};
use metampi_config::{Launch, Layout, Tls};
// Launching meta hosts on other machines.
use crate::contract::{RouterEndpoint, SiteEnv, SiteOrder};
use crate::{HostLaunch, ManualProcess};
use metampi_config::{Address, HostLayout, NodeLayout};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::router_spec::{
    read_ready, Identity, LinkTls, OutLink, PeerCheck, RouterSpec, TLS_AVAILABLE,
};

/// Environment variable that carries a router's spec to a router process.
pub const ROUTER_SPEC_ENV: &str = "METAMPI_ROUTER_SPEC";

/// The running routers of a job, and the Slurm jobs holding the nodes of its `LAUNCH = slurm`
/// meta hosts; the routers are killed and then the Slurm jobs cancelled when dropped.
pub struct Routers {
    children: Vec<Child>,
    /// Per child: what it is, for the message when it dies.
    names: Vec<String>,
    allocations: Vec<crate::slurm::Allocation>,
}

impl Drop for Routers {
    fn drop(&mut self) {
        // A router started through a command (ssh, srun, a template) stops when
        // the stdin of that command closes (see `crate::spawn_remote`); it is
        // given the grace period to do so before its command is killed, since a
        // killed srun cannot end its step and a killed ssh may leave the router
        // running until the connection times out. Routers of this machine have
        // no such stdin and are killed at once.
        let mut by_command = Vec::new();
        for (i, c) in self.children.iter_mut().enumerate() {
            if c.stdin.take().is_some() {
                by_command.push(i);
            } else {
                let _ = c.kill();
            }
        }
        let deadline = Instant::now() + crate::KILL_GRACE;
        while Instant::now() < deadline
            && by_command
                .iter()
                .any(|&i| matches!(self.children[i].try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Routers {
    /// The routers' processes this launcher started (for a router on another
    /// machine, its ssh or srun), by pid, with what each is: for
    /// [`JobSpec::watch`](crate::JobSpec::watch), so that a router's death
    /// ends the job at once, whatever the ranks are doing.
    pub fn processes(&self) -> Vec<(u32, String)> {
        self.children
            .iter()
            .map(Child::id)
            .zip(self.names.iter().cloned())
            .collect()
    }

    /// Keeps `child` (stopped when the routers are dropped) and returns its
    /// stdout, where it reports ready.
    fn push(&mut self, mut child: Child, what: &str) -> std::io::Result<std::process::ChildStdout> {
        let out = child.stdout.take();
        self.children.push(child);
        self.names.push(what.to_string());
        out.ok_or_else(|| std::io::Error::other("router stdout is not piped"))
    }
}

/// What a meta launch needs besides the layout.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// The description's `SECRET_FILE`, as written: commands printed for meta
    /// hosts started by hand read the job secret from this file on their
    /// machines instead of carrying it.
    pub secret_file: Option<String>,
    /// How long a router may take to report that it is ready (through ssh,
    /// this includes logging in).
    pub ready_timeout: Duration,
    /// Per router, by id (the order of `Layout::routers`): the command that
    /// runs it instead of the `program args...` given to
    /// [`start_with_options`] (a meta host's `ROUTEREXEC`, say). Empty: every
    /// router runs that one.
    pub router_commands: Vec<RouterCommand>,
    /// Per meta host (the order of `Layout::hosts`): variables for its
    /// routers only (its `ENV` and `ENVFILE`), over the `env` given to
    /// [`start_with_options`]; a later entry wins over an earlier one. Names
    /// starting with `METAMPI_` are refused: those are the launcher's. Empty:
    /// no meta host adds any.
    pub host_env: Vec<Vec<(OsString, OsString)>>,
}

impl Default for StartOptions {
    fn default() -> Self {
        StartOptions {
            secret_file: None,
            ready_timeout: Duration::from_secs(60),
            router_commands: Vec::new(),
            host_env: Vec::new(),
        }
    }
}

/// The program and arguments that run one router; it finds its spec in
/// [`ROUTER_SPEC_ENV`], so it is `metampi router` or a program that ends by
/// running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterCommand {
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// What the ranks of a meta job need: placement and environment.
pub struct MetaPlan {
    /// Ranks in the job, over every site.
    pub world_size: usize,
    /// One emulated machine per node with ranks, and one without slots per node of a meta
    /// host started by hand that runs routers but no ranks (the launcher prints its command
    /// too), in layout order, which is rank order.
    pub hosts: Vec<Host>,
    /// Per entry of `hosts`: its meta host and node (indices into the layout).
    pub nodes: Vec<(usize, usize)>,
    /// Variables for every rank (`METAMPI_SITES`, `METAMPI_ROUTERS`).
    pub env: Vec<(String, String)>,
    /// Per entry of `hosts`: the command that runs a process there
    /// (`ip netns exec NAME`), empty for this machine as it is.
    pub prefixes: Vec<Vec<OsString>>,
}

impl MetaPlan {
    /// The applications that run `program args...` on every rank: one when
    /// every host runs processes as they are, else one per host with ranks,
    /// with its prefix (ranks stay numbered host after host).
    pub fn apps(&self, program: &OsString, args: &[OsString]) -> Vec<AppSpec> {
        if self.prefixes.iter().all(Vec::is_empty) {
            return vec![AppSpec::new(self.world_size, program).args(args)];
        }
        self.hosts
            .iter()
            .zip(&self.prefixes)
            .filter(|(h, _)| h.slots > 0)
            .map(|(h, pre)| match pre.split_first() {
                None => AppSpec::new(h.slots, program).args(args),
                Some((p, rest)) => AppSpec::new(h.slots, p).args(rest).arg(program).args(args),
            })
            .collect()
    }
}

/// How the processes on node `n` of `host` start through a command: ssh, a
/// template, or srun in Slurm job `job` (`None` for local, netns and manual
/// meta hosts).
///
/// # Errors
/// A PACX-MPI startup command, or an ssh destination, template or Slurm node
/// that cannot be used, with a message naming the meta host.
fn node_launch(host: &HostLayout, n: usize, job: &str) -> std::io::Result<Option<HostLaunch>> {
    let node = &host.nodes[n];
    let bad = |why: String| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("meta host `{}`: {why}", host.name),
        )
    };
    match &host.launch {
        Launch::Local | Launch::Netns(_) | Launch::Manual => Ok(None),
        // One node: the destination is that machine. Several: each node is
        // reached through the destination, the meta host's way in.
        Launch::Ssh(dest) => {
            let via = (host.nodes.len() > 1).then_some(node.name.as_str());
            HostLaunch::ssh(dest, via)
                .map(Some)
                .map_err(|e| bad(format!("LAUNCH = ssh {dest}: {e}")))
        }
        Launch::Command(template) => {
            let launch = HostLaunch::Template {
                template: template.clone(),
                vars: vec![
                    ("{node}".into(), node.name.clone()),
                    ("{host}".into(), host.name.clone()),
                ],
            };
            launch
                .argv(b"true")
                .map_err(|e| bad(format!("LAUNCH = {template:?}: {e}")))?;
            Ok(Some(launch))
        }
        Launch::Slurm { login, .. } => {
            HostLaunch::srun(Some(job), &node.name, &[], login.as_deref())
                .map(Some)
                .map_err(|e| bad(format!("LAUNCH = {}: {e}", host.launch)))
        }
        Launch::Verbatim(command) => Err(bad(format!(
            "the PACX-MPI startup command `{command}` starts that machine's own MPI, whose \
             processes cannot join a metampi job; describe the meta host with LAUNCH = ssh HOST \
             (or a template such as \"rsh HOST {{cmd}}\") in the description language, or drop \
             the command from the hostfile line to start it by hand (LAUNCH = manual)"
        ))),
    }
}

/// Where a router on `node` listens for its site's ranks, and the address
/// they use: the node's IP address; for a node known by name, every interface
/// (a name may resolve to a loopback address on the node itself, as Debian's
/// `127.0.1.1` for the machine's own name does), reached by that name.
fn vertical_address(host: &HostLayout, node: &NodeLayout) -> std::io::Result<(String, String)> {
    match &node.address {
        Address::Ip(_) => Ok((node.address.to_string(), node.address.to_string())),
        Address::Host(name) => Ok(("0.0.0.0".into(), name.clone())),
        other => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "meta host `{}`: node {} runs a router but its address `{other}` is not a TCP \
                 address, which its ranks would need to reach the router",
                host.name, node.name
            ),
        )),
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

/// The command prefix that starts the ranks of `node`: [`prefix`], and in a
/// network namespace the node's address for the ranks' own listeners
/// (`METAMPI_TCP_IP`): they reach the launcher through a Unix socket, which
/// tells them no address that ranks of a directly paired meta host could use.
fn rank_prefix(host: &HostLayout, node: &NodeLayout) -> Vec<OsString> {
    let mut pre = prefix(&host.launch);
    if let (Launch::Netns(_), Address::Ip(ip)) = (&host.launch, &node.address) {
        pre.push("env".into());
        pre.push(format!("{}={ip}", crate::contract::TCP_IP).into());
    }
    pre
}

/// The router spec for every router in the layout.
///
/// A link with `TLS = auto` gets, at both ends, the identity each router
/// derives from the job secret and a pin of the one its peer derives (no key
/// is written anywhere); a link with `TLS = on` names the meta hosts' own
/// files, which the routers read on their machines, and how each end checks
/// the other (`TLSCA` with the name, `TLSPIN`). A build without the `tls`
/// feature cannot run such links: the routers that have them carry the
/// reason in [`RouterSpec::error`] and report it when started;
/// [`try_router_specs`] returns it instead.
pub fn router_specs(layout: &Layout) -> Vec<RouterSpec> {
    let mut specs = plain_router_specs(layout);
    if let Err(e) = add_tls(layout, &mut specs) {
        for r in &layout.routers {
            let uses_tls = layout
                .links
                .iter()
                .any(|l| l.options.tls != Tls::Off && (l.router == r.id || l.peer_router == r.id));
            if uses_tls {
                specs[r.id].error = Some(format!("TLS for router links: {e}"));
            }
        }
    }
    specs
}

/// [`router_specs`], failing at once when the links' TLS cannot be set up.
///
/// # Errors
/// Without the `tls` feature when a link asks for TLS.
pub fn try_router_specs(layout: &Layout) -> std::io::Result<Vec<RouterSpec>> {
    let mut specs = plain_router_specs(layout);
    add_tls(layout, &mut specs)?;
    Ok(specs)
}

fn plain_router_specs(layout: &Layout) -> Vec<RouterSpec> {
    layout
        .routers
        .iter()
        .map(|r| RouterSpec {
            id: r.id,
            // As the ranks placed there are named (`Host::new` below).
            node: Some(format!(
                "{}.{}",
                layout.hosts[r.host].name, layout.hosts[r.host].nodes[r.node].name
            )),
            vertical: "127.0.0.1:0".into(),
            listen: r
                .listen
                .iter()
                .map(|l| format!("{}:{}", l.address, l.port))
                .collect(),
            listen_tls: Vec::new(),
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
                        tls: None,
                        checksum: link.options.payload_checksum(),
                    }
                })
                .collect(),
            identities: Vec::new(),
            error: None,
        })
        .collect()
}

/// Fills in the TLS of every link that has it, at both ends.
fn add_tls(layout: &Layout, specs: &mut [RouterSpec]) -> std::io::Result<()> {
    let Some(first) = layout.links.iter().find(|l| l.options.tls != Tls::Off) else {
        return Ok(());
    };
    if !TLS_AVAILABLE {
        return Err(std::io::Error::other(format!(
            "link l{} ({} -> {}) has TLS = {}, but this metampi was built without the `tls` \
             feature: rebuild with default features, or set TLS = off",
            first.id,
            layout.hosts[first.from_host].name,
            layout.hosts[first.to_host].name,
            first.options.tls
        )));
    }
    // The index of an identity in its router's spec, added on first use.
    let index =
        |spec: &mut RouterSpec, id: Identity| match spec.identities.iter().position(|i| *i == id) {
            Some(i) => i,
            None => {
                spec.identities.push(id);
                spec.identities.len() - 1
            }
        };
    for link in &layout.links {
        let (a, b) = (link.router, link.peer_router);
        let files = |host: usize| -> std::io::Result<Identity> {
            let h = &layout.hosts[host];
            // metampi-config refuses TLS = on without both.
            match (&h.tls.cert, &h.tls.key) {
                (Some(cert), Some(key)) => Ok(Identity::Files {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                _ => Err(std::io::Error::other(format!(
                    "meta host {} has no TLSCERT or TLSKEY",
                    h.name
                ))),
            }
        };
        let check = |host: usize| {
            let h = &layout.hosts[host];
            PeerCheck::Certificate {
                name: h.tls.name_or(&h.name).to_owned(),
                ca: h.tls.ca.clone(),
                pins: h.tls.pins.clone(),
            }
        };
        // (the sender's identity and check of b, the receiver's of a)
        let (out, listen) = match link.options.tls {
            Tls::Off => continue,
            Tls::Auto => (
                LinkTls {
                    identity: index(&mut specs[a], Identity::Auto),
                    peer: PeerCheck::Auto { router: b },
                },
                LinkTls {
                    identity: index(&mut specs[b], Identity::Auto),
                    peer: PeerCheck::Auto { router: a },
                },
            ),
            Tls::On => (
                LinkTls {
                    identity: index(&mut specs[a], files(link.from_host)?),
                    peer: check(link.to_host),
                },
                LinkTls {
                    identity: index(&mut specs[b], files(link.to_host)?),
                    peer: check(link.from_host),
                },
            ),
        };
        let routers = &layout.routers;
        if let Some(k) = routers[a].links_out.iter().position(|&l| l == link.id) {
            specs[a].out[k].tls = Some(out);
        }
        if let Some(k) = routers[b].listen.iter().position(|l| l.link == link.id) {
            let lt = &mut specs[b].listen_tls;
            lt.resize(routers[b].listen.len(), None);
            lt[k] = Some(listen);
        }
    }
    Ok(())
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
    start_with_options(layout, program, args, env, &StartOptions::default(), dial)
}

/// Like [`start_with_dial`], with [`StartOptions`]: each router may run its
/// own command with its own meta host's variables, however its meta host is
/// launched (here, in a network namespace, through ssh or a template, or by
/// hand), and no router's command line or environment holds another's.
///
/// # Errors
/// A meta host that cannot be launched (a PACX-MPI startup command, an ssh
/// destination or template that cannot be used, a router node without a TCP
/// address) or options that do not fit the layout (one router command or
/// variable list per router or meta host, no `METAMPI_*` variables), before
/// anything starts, as [`std::io::ErrorKind::InvalidInput`]; a router that
/// cannot be started or does not report ready in time (the routers started so
/// far are stopped).
pub fn start_with_options(
    layout: &Layout,
    program: &OsString,
    args: &[OsString],
    env: &[(OsString, OsString)],
    opts: &StartOptions,
    dial: &mut dyn FnMut(&str) -> std::io::Result<String>,
) -> std::io::Result<(Routers, MetaPlan)> {
    check_options(layout, opts)?;
    // How every node is reached, checked before anything starts (a Slurm job
    // id stands in for the allocations asked for next).
    let launches_for = |hi: usize, job: &str| {
        let h = &layout.hosts[hi];
        (0..h.nodes.len())
            .map(|n| node_launch(h, n, job))
            .collect::<std::io::Result<Vec<_>>>()
    };
    let mut launches = Vec::with_capacity(layout.hosts.len());
    for hi in 0..layout.hosts.len() {
        launches.push(launches_for(hi, "0")?);
    }
    let cwd = std::env::current_dir()?;
    let mut routers = Routers {
        children: Vec::new(),
        names: Vec::new(),
        allocations: Vec::new(),
    };
    for (hi, h) in layout.hosts.iter().enumerate() {
        let Launch::Slurm { login, options } = &h.launch else {
            continue;
        };
        let login = match login {
            Some(dest) => Some(
                crate::remote::ssh_args(dest)
                    .map_err(|e| std::io::Error::other(format!("meta host `{}`: {e}", h.name)))?,
            ),
            None => None,
        };
        let nodes: Vec<String> = h.nodes.iter().map(|n| n.name.clone()).collect();
        // Every process of the busiest node gets a task, so that a site that
        // confines steps to their job's CPUs leaves each one a CPU.
        let per_node = (0..h.nodes.len())
            .map(|ni| {
                let routers = layout
                    .routers
                    .iter()
                    .filter(|r| (r.host, r.node) == (hi, ni))
                    .count();
                h.nodes[ni].nprocs + routers
            })
            .max()
            .unwrap_or(1);
        let allocation = crate::slurm::Allocation::request(
            &format!("metampi-{}", h.name),
            &nodes,
            per_node,
            options,
            login.as_deref(),
        )
        .map_err(|e| std::io::Error::other(format!("meta host `{}`: {e}", h.name)))?;
        launches[hi] = launches_for(hi, allocation.id())?;
        routers.allocations.push(allocation);
    }
    // Routers and ranks of the job prove this secret to each other.
    let secret = match std::env::var("METAMPI_SECRET")
        .ok()
        .filter(|s| !s.is_empty())
    {
        Some(s) => s,
        None => crate::auth::Secret::random()?.to_hex(),
    };
    // Routers started by hand listen for their ranks on ports fixed in advance,
    // above every port the layout's links use.
    let mut manual_port = layout
        .routers
        .iter()
        .flat_map(|r| r.listen.iter().map(|l| l.port))
        .max()
        .unwrap_or(metampi_config::DEFAULT_PORT_BASE);
    // Per router: the address its site's ranks use, and its port once known.
    let mut endpoints: Vec<(String, Option<u16>)> = Vec::new();
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut waiting = Vec::new();
    // The routers that the command of a node started by hand starts, by (host, node).
    let mut helpers: Vec<((usize, usize), ManualProcess)> = Vec::new();
    for mut spec in try_router_specs(layout)? {
        for o in &mut spec.out {
            o.addr = dial(&o.addr)?;
        }
        let r = &layout.routers[spec.id];
        let host = &layout.hosts[r.host];
        let node = &host.nodes[r.node];
        let what = format!(
            "router {} of meta host `{}` on node {}",
            r.id, host.name, node.name
        );
        let (program, args) = match opts.router_commands.get(r.id) {
            Some(c) => (&c.program, c.args.as_slice()),
            None => (program, args),
        };
        let own_env = opts.host_env.get(r.host).map_or(&[][..], Vec::as_slice);
        let child = match (&host.launch, &launches[r.host][r.node]) {
            (Launch::Manual, _) => {
                let (bind, addr) = vertical_address(host, node)?;
                manual_port = manual_port.checked_add(1).ok_or_else(|| {
                    std::io::Error::other(format!(
                        "{what}: no port is left above the links' ports for its ranks"
                    ))
                })?;
                spec.vertical = format!("{bind}:{manual_port}");
                endpoints.push((addr, Some(manual_port)));
                helpers.push((
                    (r.host, r.node),
                    ManualProcess {
                        name: format!("router {}", r.id),
                        env: router_env(env, own_env, &spec),
                        program: program.clone(),
                        args: args.to_vec(),
                    },
                ));
                continue;
            }
            (_, Some(launch)) => {
                let (bind, addr) = vertical_address(host, node)?;
                spec.vertical = format!("{bind}:0");
                endpoints.push((addr, None));
                let vars = router_env(env, own_env, &spec);
                crate::spawn_remote(launch, &cwd, &vars, &secret, program, args)
                    .map_err(|e| std::io::Error::other(format!("starting {what}: {e}")))?
            }
            (_, None) => {
                endpoints.push(("127.0.0.1".into(), None));
                let pre = prefix(&host.launch);
                let mut cmd = match pre.split_first() {
                    Some((p, rest)) => {
                        let mut c = Command::new(p);
                        c.args(rest).arg(program);
                        c
                    }
                    None => Command::new(program),
                };
                cmd.args(args)
                    .envs(router_env(env, own_env, &spec))
                    .env("METAMPI_SECRET", &secret)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .spawn()?
            }
        };
        let out = routers.push(child, &what)?;
        let index = endpoints.len() - 1;
        let tx = ready_tx.clone();
        // One reader per router, so that routers (through ssh: logins) start in
        // parallel and a silent one is noticed at the deadline.
        std::thread::Builder::new()
            .name(format!("metampi-ready-{}", r.id))
            .spawn(move || {
                let _ = tx.send((index, read_ready(&mut BufReader::new(out))));
            })?;
        waiting.push((index, what));
    }
    drop(ready_tx);
    let deadline = Instant::now() + opts.ready_timeout;
    while !waiting.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match ready_rx.recv_timeout(left) {
            Ok((index, Ok(port))) => {
                endpoints[index].1 = Some(port);
                waiting.retain(|(i, _)| *i != index);
            }
            Ok((index, Err(e))) => {
                let what = waiting
                    .iter()
                    .find(|(i, _)| *i == index)
                    .map_or("a router", |(_, w)| w.as_str());
                return Err(std::io::Error::other(format!(
                    "{what} did not start: {e} (its messages, and those of ssh or the launch \
                     command, are above)"
                )));
            }
            Err(_) => {
                let names: Vec<&str> = waiting.iter().map(|(_, w)| w.as_str()).collect();
                return Err(std::io::Error::other(format!(
                    "{} did not report ready within {} s",
                    names.join(", "),
                    opts.ready_timeout.as_secs()
                )));
            }
        }
    }
    let site_count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let sites = SiteEnv {
        ranks_per_site: layout
            .hosts
            .iter()
            .map(|h| site_count(h.ranks.len()))
            .collect(),
        routers: layout
            .routers
            .iter()
            .zip(&endpoints)
            .map(|(r, (addr, port))| RouterEndpoint {
                from: site_count(r.host),
                to: site_count(r.peer),
                addr: format!("{addr}:{}", port.unwrap_or(0)),
            })
            .collect(),
        direct: layout
            .direct
            .iter()
            .map(|&(a, b)| (site_count(a), site_count(b)))
            .collect(),
        orders: layout
            .hosts
            .iter()
            .map(|h| match h.byte_order {
                metampi_config::ByteOrder::Big => SiteOrder::Big,
                metampi_config::ByteOrder::Little => SiteOrder::Little,
                _ => SiteOrder::Native,
            })
            .collect(),
    };
    // Nodes with ranks, and nodes started by hand that run routers only: the
    // launcher prints the command for those too.
    let nodes: Vec<(usize, usize)> = layout
        .hosts
        .iter()
        .enumerate()
        .flat_map(|(hi, h)| {
            let helpers = &helpers;
            h.nodes.iter().enumerate().filter_map(move |(ni, n)| {
                let routers_by_hand = matches!(h.launch, Launch::Manual)
                    && helpers.iter().any(|(at, _)| *at == (hi, ni));
                (n.nprocs > 0 || routers_by_hand).then_some((hi, ni))
            })
        })
        .collect();
    let hosts = nodes
        .iter()
        .map(|&(hi, ni)| {
            let (h, n) = (&layout.hosts[hi], &layout.hosts[hi].nodes[ni]);
            let host = Host::new(format!("{}.{}", h.name, n.name), n.nprocs);
            match (&h.launch, &launches[hi][ni]) {
                // Started by hand: the node's command starts its routers
                // first, then its ranks if it has any.
                (Launch::Manual, _) => host.with_launch(HostLaunch::Manual {
                    helpers: helpers
                        .iter()
                        .filter(|(at, _)| *at == (hi, ni))
                        .map(|(_, p)| p.clone())
                        .collect(),
                    secret_file: opts.secret_file.clone(),
                }),
                (_, Some(launch)) => host.with_launch(launch.clone()),
                (_, None) => host,
            }
        })
        .collect();
    let prefixes = nodes
        .iter()
        .map(|&(hi, ni)| rank_prefix(&layout.hosts[hi], &layout.hosts[hi].nodes[ni]))
        .collect();
    let mut env: Vec<(String, String)> = sites
        .vars()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    env.push(("METAMPI_SECRET".into(), secret));
    let plan = MetaPlan {
        world_size: layout.world_size,
        hosts,
        nodes,
        env,
        prefixes,
    };
    Ok((routers, plan))
}

/// Refuses options that do not fit `layout`, before anything starts.
fn check_options(layout: &Layout, opts: &StartOptions) -> std::io::Result<()> {
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
    let (commands, routers) = (opts.router_commands.len(), layout.routers.len());
    if commands != 0 && commands != routers {
        return Err(bad(format!(
            "{commands} router commands for the {routers} routers of the layout"
        )));
    }
    let (lists, hosts) = (opts.host_env.len(), layout.hosts.len());
    if lists != 0 && lists != hosts {
        return Err(bad(format!(
            "router variables for {lists} meta hosts, but the layout has {hosts}"
        )));
    }
    for (host, vars) in layout.hosts.iter().zip(&opts.host_env) {
        for (name, _) in vars {
            let text = name.to_string_lossy();
            let why = if text.is_empty() || text.contains(['=', '\0']) {
                "is not a variable name"
            } else if text.starts_with("METAMPI_") {
                "is the launcher's to set (METAMPI_*)"
            } else {
                continue;
            };
            return Err(bad(format!(
                "meta host `{}`: router variable `{text}` {why}",
                host.name
            )));
        }
    }
    Ok(())
}

/// The variables a router gets besides what it inherits (and the job
/// secret): the job's `env`, its meta host's `own` over them, and its spec.
/// Each name appears once, so a command line that carries them reads plainly.
fn router_env(
    env: &[(OsString, OsString)],
    own: &[(OsString, OsString)],
    spec: &RouterSpec,
) -> Vec<(OsString, OsString)> {
    let mut vars: Vec<(OsString, OsString)> = Vec::with_capacity(env.len() + own.len() + 1);
    for (k, v) in env.iter().chain(own) {
        vars.retain(|(n, _)| n != k);
        vars.push((k.clone(), v.clone()));
    }
    vars.retain(|(n, _)| n != ROUTER_SPEC_ENV);
    vars.push((ROUTER_SPEC_ENV.into(), spec.to_line().into()));
    vars
}

#[cfg(test)]
mod launch_tests {
    use super::*;

    fn layout(text: &str) -> Layout {
        metampi_config::parse_str("t.cfg", text)
            .unwrap_or_else(|e| panic!("{e}"))
            .layout()
    }

    fn refusal(layout: &Layout) -> String {
        let exe = OsString::from("/bin/false");
        match start(layout, &exe, &[], &[]) {
            Ok(_) => panic!("the layout was launched"),
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
                e.to_string()
            }
        }
    }

    #[test]
    fn pacx_startup_commands_are_refused_with_the_way_out() {
        let cfg = metampi_config::parse_pacx_str(
            "hosts",
            "h1 2 tcp\nh2 2 tcp (rsh h2 mpirun -np 4 ./app)\n",
        )
        .unwrap();
        assert_eq!(
            refusal(&cfg.layout()),
            "meta host `h2`: the PACX-MPI startup command `rsh h2 mpirun -np 4 ./app` starts \
             that machine's own MPI, whose processes cannot join a metampi job; describe the \
             meta host with LAUNCH = ssh HOST (or a template such as \"rsh HOST {cmd}\") in the \
             description language, or drop the command from the hostfile line to start it by \
             hand (LAUNCH = manual)"
        );
    }

    #[test]
    fn unusable_ssh_destinations_and_router_addresses_are_refused() {
        let two = |launch: &str, node_b: &str| {
            layout(&format!(
                "METAHOST a {{ LAUNCH = local; NODES = a0; }}\n\
                 METAHOST b {{ LAUNCH = {launch}; NODES = {node_b}; }}\n\
                 PAIR a b 1\na0 -> {}\nPAIR b a 1\n{} -> a0\n",
                node_b.split_whitespace().next().unwrap_or(""),
                node_b.split_whitespace().next().unwrap_or(""),
            ))
        };
        assert_eq!(
            refusal(&two("ssh -login", "b0 (127.0.0.1)")),
            "meta host `b`: LAUNCH = ssh -login: `-login` is not a usable host name for ssh \
             (letters, digits, `.`, `-`, `_`; not starting with `-`)"
        );
        let atm = layout(
            "METAHOST a { LAUNCH = local; NODES = a0; }\n\
             METAHOST b { LAUNCH = manual; NODES = b0 (ATM_PVC 0.0.42); }\n\
             PAIR a b 1\na0 -> ATM_PVC 0.0.42\nPAIR b a 1\nATM_PVC 0.0.42 -> a0\n",
        );
        assert_eq!(
            refusal(&atm),
            "meta host `b`: node b0 runs a router but its address `ATM_PVC 0.0.42` is not a \
             TCP address, which its ranks would need to reach the router"
        );
    }

    #[test]
    fn router_options_that_do_not_fit_the_layout_are_refused() {
        let l = layout(
            "METAHOST a { LAUNCH = local; NODES = a0; }\n\
             METAHOST b { LAUNCH = local; NODES = b0; }\n\
             PAIR a b 1\na0 <-> b0\n",
        );
        let refused = |opts: StartOptions| {
            let exe = OsString::from("/bin/false");
            match start_with_options(&l, &exe, &[], &[], &opts, &mut |a| Ok(a.to_string())) {
                Ok(_) => panic!("the layout was launched"),
                Err(e) => {
                    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
                    e.to_string()
                }
            }
        };
        let command = RouterCommand {
            program: "/bin/false".into(),
            args: Vec::new(),
        };
        assert_eq!(
            refused(StartOptions {
                router_commands: vec![command],
                ..Default::default()
            }),
            "1 router commands for the 2 routers of the layout"
        );
        assert_eq!(
            refused(StartOptions {
                host_env: vec![Vec::new()],
                ..Default::default()
            }),
            "router variables for 1 meta hosts, but the layout has 2"
        );
        let with = |name: &str| StartOptions {
            host_env: vec![
                Vec::new(),
                vec![("A".into(), "1".into()), (name.into(), "x".into())],
            ],
            ..Default::default()
        };
        assert_eq!(
            refused(with("METAMPI_SECRET")),
            "meta host `b`: router variable `METAMPI_SECRET` is the launcher's to set (METAMPI_*)"
        );
        assert_eq!(
            refused(with("A=B")),
            "meta host `b`: router variable `A=B` is not a variable name"
        );
    }

    #[test]
    fn a_router_s_variables_are_the_job_s_under_its_meta_host_s_and_its_spec() {
        let spec = plain_router_specs(&layout(
            "METAHOST a { LAUNCH = local; NODES = a0; }\n\
             METAHOST b { LAUNCH = local; NODES = b0; }\n\
             PAIR a b 1\na0 <-> b0\n",
        ))
        .remove(0);
        let vars = |list: &[(&str, &str)]| -> Vec<(OsString, OsString)> {
            list.iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        let got = router_env(
            &vars(&[("A", "job"), ("B", "job"), (ROUTER_SPEC_ENV, "stale")]),
            &vars(&[("B", "site"), ("C", "site"), ("C", "site again")]),
            &spec,
        );
        let line = spec.to_line();
        assert_eq!(
            got,
            vars(&[
                ("A", "job"),
                ("B", "site"),
                ("C", "site again"),
                (ROUTER_SPEC_ENV, line.as_str())
            ])
        );
    }

    #[test]
    fn a_node_started_by_hand_with_routers_only_is_a_host_without_slots() {
        let l = layout(
            "METAHOST a { LAUNCH = manual; NPROCS = 1; NODES = a0 (127.0.0.1); }\n\
             METAHOST b { LAUNCH = manual; NPROCS = 2; NODES = b0 (127.0.0.1), b1 0 (127.0.0.1); }\n\
             PAIR a b 1\na0 <-> b1\n",
        );
        // Everything is started by hand: nothing runs here.
        let (_routers, plan) = start(&l, &OsString::from("/bin/false"), &[], &[]).unwrap();
        let hosts: Vec<(&str, usize)> = plan
            .hosts
            .iter()
            .map(|h| (h.name.as_str(), h.slots))
            .collect();
        assert_eq!(hosts, [("a.a0", 1), ("b.b0", 2), ("b.b1", 0)]);
        assert_eq!(plan.nodes, [(0, 0), (1, 0), (1, 1)]);
        let helpers = |h: &Host| match &h.launch {
            Some(HostLaunch::Manual { helpers, .. }) => {
                helpers.iter().map(|p| p.name.clone()).collect::<Vec<_>>()
            }
            other => panic!("{}: {other:?}", h.name),
        };
        assert_eq!(helpers(&plan.hosts[0]), ["router 0"]);
        assert!(helpers(&plan.hosts[1]).is_empty());
        assert_eq!(helpers(&plan.hosts[2]), ["router 1"]);
        assert_eq!(plan.apps(&"prog".into(), &[]).len(), 1);
    }

    #[test]
    fn nodes_of_a_cluster_are_reached_through_its_ssh_destination() {
        let l = layout(
            "METAHOST a { LAUNCH = local; NODES = a0; }\n\
             METAHOST b { LAUNCH = ssh me@login:2222; NODES = n1 (10.0.0.1), n2 (10.0.0.2); }\n\
             METAHOST c { LAUNCH = \"srun -w {node} -J {host} {cmd}\"; NODES = c0 (10.1.0.1); }\n\
             METAHOST d { LAUNCH = slurm via me@front -p big; NODES = d0, d1; }\n\
             AUTO_ROUTER\n",
        );
        let b = &l.hosts[1];
        assert_eq!(
            node_launch(b, 1, "").unwrap(),
            Some(HostLaunch::Ssh(vec![
                "-J".into(),
                "me@login:2222".into(),
                "me@n2".into()
            ]))
        );
        let c = &l.hosts[2];
        let argv = node_launch(c, 0, "")
            .unwrap()
            .unwrap()
            .argv(b"CMD")
            .unwrap();
        assert_eq!(
            argv,
            Some(
                ["srun", "-w", "c0", "-J", "c", "CMD"]
                    .map(OsString::from)
                    .to_vec()
            )
        );
        // A Slurm meta host: a step of its job on the node, srun run on the login node.
        let d = &l.hosts[3];
        let argv = node_launch(d, 1, "77")
            .unwrap()
            .unwrap()
            .argv(b"CMD")
            .unwrap();
        let argv: Vec<String> = argv
            .unwrap()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(argv[..3], ["ssh", "-o", "BatchMode=yes"]);
        assert_eq!(argv[3], "me@front");
        assert!(argv[4].starts_with("srun --overlap "), "{argv:?}");
        assert!(argv[4].contains(" --jobid=77 --nodelist=d1 "), "{argv:?}");
        assert!(argv[4].ends_with(" sh -c CMD"), "{argv:?}");
        assert_eq!(
            vertical_address(b, &b.nodes[0]).unwrap(),
            ("10.0.0.1".to_string(), "10.0.0.1".to_string())
        );
    }
}

#[cfg(test)]
mod launcher_tests {
    #[cfg(not(feature = "tls"))]
    use super::RouterSpec;
    use super::{router_specs, try_router_specs};
    #[cfg(feature = "tls")]
    use crate::router_spec::{Identity, PeerCheck};

    fn layout(tls: &str, hosts: [&str; 2]) -> metampi_config::Layout {
        let text = format!(
            "TLS = {tls}\nMETAHOST a {{ LAUNCH = local; {} }}\nMETAHOST b {{ LAUNCH = local; {} }}\n\
             PAIR a b 1\na <-> b\n",
            hosts[0], hosts[1]
        );
        metampi_config::parse_str("t.cfg", &text)
            .unwrap_or_else(|e| panic!("{e}"))
            .layout()
    }

    #[test]
    fn plain_links_carry_no_tls() {
        for s in try_router_specs(&layout("off", ["", ""])).unwrap() {
            assert!(s.identities.is_empty() && s.listen_tls.is_empty() && s.error.is_none());
            assert!(s.out.iter().all(|o| o.tls.is_none()));
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn on_links_use_the_meta_hosts_files() {
        let pin = format!("sha256:{}", "ab".repeat(32));
        let l = layout(
            "on",
            [
                &format!("TLSCERT = ~/a.pem; TLSKEY = ~/a.key; TLSPIN = {pin};"),
                "TLSCERT = b.pem; TLSKEY = b.key; TLSCA = ca.pem; TLSNAME = b.example.org;",
            ],
        );
        let specs = router_specs(&l);
        let (a, b) = (&specs[0], &specs[1]);
        let files = |cert: &str, key: &str| Identity::Files {
            cert: cert.into(),
            key: key.into(),
        };
        assert_eq!(a.identities, [files("~/a.pem", "~/a.key")]);
        assert_eq!(b.identities, [files("b.pem", "b.key")]);
        // a checks b by its CA and name; b checks a by its pin.
        let a_out = a.out[0].tls.as_ref().unwrap();
        assert_eq!(
            a_out.peer,
            PeerCheck::Certificate {
                name: "b.example.org".into(),
                ca: Some("ca.pem".into()),
                pins: vec![]
            }
        );
        let b_in = b.listen_tls[0].as_ref().unwrap();
        assert_eq!(
            b_in.peer,
            PeerCheck::Certificate {
                name: "a".into(),
                ca: None,
                pins: vec![[0xab; 32]]
            }
        );
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_the_feature_tls_is_refused() {
        let l = layout("auto", ["", ""]);
        let e = try_router_specs(&l).unwrap_err().to_string();
        assert!(e.contains("built without the `tls` feature"), "{e}");
        for s in router_specs(&l) {
            let why = s.error.clone().expect("the router reports it");
            assert!(why.contains("TLS = auto"), "{why}");
            assert_eq!(RouterSpec::parse(&s.to_line()).unwrap().error, s.error);
        }
    }
}
