//! Start-up: how a process joins its job and becomes a [`Shared`] engine.
//!
//! [`Shared::init`] reads the launcher's contract once ([`Contract`]) and runs these steps in
//! order, each a function below:
//! 1. [`Boot::connect`]: the launcher's key-value server, the wake-up socket, the TCP listener
//!    and the address others reach this rank at;
//! 2. [`PeerTable::exchange`]: every rank's node, machine, pid, cores and TCP address;
//! 3. [`ShmMesh::build`]: the shared-memory rings with the ranks of this node;
//! 4. [`tcp_mesh`]: authenticated TCP connections with the other ranks of this site and of
//!    directly paired sites (lower ranks connect, higher ones accept);
//! 5. [`router_channels`]: the connections to this site's routers, and which router carries
//!    the traffic to each rank of another site;
//! 6. [`meet_parents`]: a spawned process's links to its parents;
//! 7. [`Placement::measure`]: cores against processes, which sets spinning and help.
//!
//! A process without a launcher is a world of one ([`Shared::singleton`]). Both end in the one
//! constructor, [`Shared::new`].

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr as InetAddr, TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use metampi_launch::contract::Contract;

use super::coop::{self, PeerSlots, Table};
use super::core::Core;
use super::links::{Link, Links, ShmLink, SleepFlag};
use super::{join, other, JobInfo, Parts, Shared};
use crate::bootstrap::Pmi;
use crate::sys::ring::{Consumer, Producer, CTL_BYTES};
use crate::sys::shm::Segment;
use crate::sys::spin;
use crate::sys::{cma, poll};
use metampi_launch::pmi_wire::WireClient;

/// Bytes of the control block at the start of a rank's inbound segment.
pub(crate) const SEG_CTL: usize = 64;

/// Bytes of each shared-memory ring between two ranks (see [`crate::tuning`]).
pub(crate) fn ring_cap() -> usize {
    crate::tuning::current().shm_ring
}

/// The launcher's contract, read through the one reader of the environment; `None` where
/// no launcher started this process.
pub(crate) fn contract() -> io::Result<Option<Contract>> {
    Contract::parse(&crate::knobs::text)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

impl Shared {
    /// Joins the job described by the launcher's environment, or starts a
    /// world of one when there is no launcher.
    pub(crate) fn init() -> io::Result<Shared> {
        let (c, pm) = match contract()? {
            Some(c) => (c, None),
            None => match Pmi::from_process_manager()? {
                Some(w) => (process_manager_contract(&w)?, Some(w)),
                None => {
                    crate::knobs::check_names();
                    return Self::singleton();
                }
            },
        };
        let (rank, size) = (c.rank.rank, c.rank.size);
        // Every rank sees the same environment: one warning per job is enough.
        if rank == 0 {
            crate::knobs::check_names();
        }
        let tuning = crate::tuning::current();
        let force_tcp = tuning.force_tcp;
        let mut boot = Boot::connect(&c, pm)?;
        let mut table = PeerTable::exchange(&mut boot, &c)?;
        let mut mesh = ShmMesh::build(&mut boot, &table, (&c.rank.job, rank), force_tcp)?;
        let my_site = c.my_site();
        let reaches = |site: u32| c.sites.direct_between(my_site, site);
        // Ranks of this site and of directly paired ones are TCP peers.
        let tcp_peers: Vec<u32> = (0..size)
            .filter(|&r| r != rank && !mesh.shares(r) && reaches(c.site_of[r as usize]))
            .collect();
        let needs_key = !tcp_peers.is_empty() || c.sites.routers.iter().any(|r| r.from == my_site);
        let key = match table.secret.take() {
            Some(k) => needs_key.then_some(k),
            None => needs_key.then(crate::auth::secret_from_env).transpose()?,
        };
        tcp_mesh(
            &boot,
            &table,
            rank,
            &tcp_peers,
            key.as_ref(),
            &mut mesh.peers,
        )?;
        boot.pmi.fence()?;

        let site_ranks = c.site_of.iter().filter(|&&s| s == my_site).count();
        let router_end = RouterEnd::new(&boot.node, force_tcp, site_ranks);
        let mut links = Links::new(rank, std::mem::take(&mut mesh.peers), boot.wake);
        let native_big = cfg!(target_endian = "big");
        links.routed_big_endian = c.sites.order(my_site).is_big(native_big);
        links.sites = c.site_of.clone();
        let swap_routed = links.routed_big_endian != native_big;
        let orders_differ = c
            .site_of
            .iter()
            .any(|&s| c.sites.order(s).is_big(native_big) != native_big);
        router_channels(&c, &router_end, key.as_ref(), &mut links)?;
        mesh.attach_inbound(&mut links);
        let parent = meet_parents(&c, &router_end, force_tcp, &mut links)?;
        mesh.attach_own(&mut links);

        let mut core = Core::new(rank, size as usize);
        for &r in &mesh.ranks {
            core.pids[r as usize] = table.pids[r as usize];
        }
        let place = Placement::measure(&c, &table, &boot.mask, &mesh);
        if let (true, Some(_), Some(min)) = (links.cma, &links.coop, tuning.coop_min) {
            core.coop_min = min;
            // Two copiers need two cores: where processes outnumber cores,
            // help is asked only while few enough are awake (see `Links::pull`).
            links.crowd = place
                .oversubscribed
                .then_some((place.cores, place.unseen_here));
        }
        // From here on the launcher may ask where this rank waits. A launcher that does not
        // know `WATCH` (another version) refuses it, and the job runs without reports.
        let _ = boot.pmi.answer_reports(Box::new(super::report::answer));
        let first = super::FIRST_FREE_CONTEXT;
        let next_context = parent.as_ref().map_or(first, |p| (p.0 + 2).max(first));
        Shared::new(Parts {
            core,
            links,
            spin: place.spin_budget(tuning),
            oversubscribed: place.oversubscribed,
            cores: place.cores,
            unseen_here: place.unseen_here,
            info: JobInfo {
                rank,
                size,
                nodes: table.nodes,
                sites: c.site_of.clone(),
                appnum: c.rank.appnum,
                job: c.rank.job.clone(),
                swap_routed,
                orders_differ,
            },
            pmi: Some(boot.pmi),
            next_context,
            tcp_ip: boot.my_ip,
            listen_ip: boot.listen_ip,
            parent,
        })
    }

    /// A world of one, for a process no launcher started.
    pub(super) fn singleton() -> io::Result<Shared> {
        let job = format!("single{}", std::process::id());
        // Named, so that processes it spawns can wake it (`join`).
        let wake = UnixDatagram::bind_addr(&wake_name(&job, 0)?)?;
        wake.set_nonblocking(true)?;
        let links = Links::new(0, vec![Link::Local], wake);
        Shared::new(Parts {
            core: Core::new(0, 1),
            links,
            spin: spin::SpinBudget::new(Duration::from_micros(50), false, false),
            oversubscribed: false,
            cores: 1,
            unseen_here: 0,
            info: JobInfo {
                rank: 0,
                size: 1,
                nodes: vec![crate::sys::hostname()],
                sites: vec![0],
                appnum: 0,
                job,
                swap_routed: false,
                orders_differ: false,
            },
            pmi: None,
            next_context: super::FIRST_FREE_CONTEXT,
            tcp_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            listen_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            parent: None,
        })
    }
}

/// The contract of a rank Hydra or Slurm started: who it is from their PMI server, its job
/// named after the job's key-value space (the same for all its ranks, and short enough for
/// socket and file names).
fn process_manager_contract(w: &WireClient) -> io::Result<Contract> {
    let job = format!("pm{:016x}", crate::hash::fnv1a(w.job_name().bytes()));
    let pmi = format!("{} of another process manager", w.version());
    Contract::under_process_manager(
        (w.rank(), w.size(), w.appnum()),
        &pmi,
        &job,
        &crate::knobs::text,
    )
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

/// The abstract socket name a rank of `job` is woken at.
pub(super) fn wake_name(job: &str, rank: u32) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("metampi-{job}-{rank}"))
}

/// Step 1: what a rank has before it knows anyone.
struct Boot {
    pmi: Pmi,
    wake: UnixDatagram,
    listener: TcpListener,
    /// Where others reach this rank's listener, and where it is bound.
    my_ip: IpAddr,
    listen_ip: IpAddr,
    /// Its node (`METAMPI_NODE`, else the host name) and its affinity mask.
    node: String,
    mask: String,
}

impl Boot {
    /// Connects to `metampi run`'s server, or takes `pm`, the connection to another process
    /// manager's.
    fn connect(c: &Contract, pm: Option<WireClient>) -> io::Result<Boot> {
        let (rank, job) = (c.rank.rank, c.rank.job.as_str());
        // Where the server is, if it is somewhere this rank connected to.
        let (pmi, pmi_addr) = match pm {
            Some(w) => {
                let port = w.port().map(str::to_string);
                (Pmi::Wire(w), port)
            }
            None => (
                Pmi::connect(&c.rank.pmi, job, rank)?,
                Some(c.rank.pmi.clone()),
            ),
        };
        let wake = UnixDatagram::bind_addr(&wake_name(job, rank)?)?;
        wake.set_nonblocking(true)?;

        use std::net::ToSocketAddrs;
        let pmi_ip: IpAddr = match &pmi_addr {
            Some(addr) => addr
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .map(|a| a.ip())
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            // A socket the process manager handed over says nothing about the network.
            None => host_ip(),
        };
        // The launcher names the address where it knows better (a network
        // namespace, whose ranks reach it through a Unix socket).
        let listen_ip = match c.tcp_ip {
            Some(ip) => ip,
            None if pmi_ip.is_loopback() => pmi_ip,
            None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        let listener = TcpListener::bind((listen_ip, 0))?;
        // The address others use is the one this machine uses to reach the launcher.
        let my_ip = match (c.tcp_ip, &pmi_addr) {
            (Some(ip), _) => ip,
            _ if pmi_ip.is_loopback() => pmi_ip,
            (None, Some(addr)) => TcpStream::connect(addr.as_str())?.local_addr()?.ip(),
            (None, None) => pmi_ip,
        };
        Ok(Boot {
            pmi,
            wake,
            listener,
            my_ip,
            listen_ip,
            node: c.rank.node.clone().unwrap_or_else(crate::sys::hostname),
            mask: crate::sys::cpus::affinity_hex().unwrap_or_default(),
        })
    }
}

/// The address this host's name resolves to, one that is not loopback where there is one:
/// where ranks on other hosts reach a rank whose process manager said nothing about the
/// network (`METAMPI_TCP_IP` names it where this guess is wrong).
fn host_ip() -> IpAddr {
    use std::net::ToSocketAddrs;
    let addrs: Vec<IpAddr> = (crate::sys::hostname(), 0)
        .to_socket_addrs()
        .map(|a| a.map(|a| a.ip()).collect())
        .unwrap_or_default();
    let outside = |ip: &&IpAddr| !ip.is_loopback();
    addrs
        .iter()
        .filter(outside)
        .find(|ip| ip.is_ipv4())
        .or_else(|| addrs.iter().find(outside))
        .copied()
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// Step 2: what every rank published about itself.
struct PeerTable {
    /// Node of every rank.
    nodes: Vec<String>,
    pids: Vec<i32>,
    tcp_addrs: Vec<String>,
    /// Affinity masks of the ranks on this physical machine.
    masks: Vec<String>,
    /// Ranks on this physical machine (emulated nodes included).
    on_machine: usize,
    /// The job secret, where the exchange carried it (a process manager that is not
    /// `metampi run` gives ranks none: rank 0 makes one and publishes it).
    secret: Option<crate::auth::Secret>,
}

impl PeerTable {
    fn exchange(boot: &mut Boot, c: &Contract) -> io::Result<PeerTable> {
        let (rank, size) = (c.rank.rank, c.rank.size);
        // Before the pid is out: the ranks of this machine may then copy
        // from our memory under Yama's scope 1 too.
        if !cma::turned_off() {
            cma::let_peers_attach();
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let port = boot.listener.local_addr()?.port();
        let pmi = &mut boot.pmi;
        pmi.put(&format!("n{rank}"), &boot.node)?;
        pmi.put(&format!("m{rank}"), &machine_id())?;
        // The pid, then the affinity mask (see `sys::cpus`).
        pmi.put(&format!("p{rank}"), &format!("{pid}/{}", boot.mask))?;
        pmi.put(
            &format!("t{rank}"),
            &InetAddr::new(boot.my_ip, port).to_string(),
        )?;
        let foreign = pmi.is_foreign();
        if foreign && rank == 0 {
            pmi.put("secret", &crate::auth::Secret::random()?.to_hex())?;
        }
        pmi.fence()?;

        let mut t = PeerTable {
            nodes: Vec::with_capacity(size as usize),
            pids: Vec::with_capacity(size as usize),
            tcp_addrs: Vec::with_capacity(size as usize),
            masks: Vec::new(),
            on_machine: 0,
            secret: None,
        };
        if foreign {
            let hex = pmi.get("secret")?;
            t.secret = Some(crate::auth::Secret::from_hex(&hex).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "rank 0's job secret is malformed",
                )
            })?);
        }
        let me = machine_id();
        for r in 0..size {
            let here = pmi.get(&format!("m{r}"))? == me;
            t.on_machine += usize::from(here);
            t.nodes.push(pmi.get(&format!("n{r}"))?);
            let p = pmi.get(&format!("p{r}"))?;
            let (pid, cpus) = p.split_once('/').unwrap_or((&p, ""));
            t.pids.push(pid.parse::<i32>().unwrap_or(0));
            if here {
                t.masks.push(cpus.to_string());
            }
            t.tcp_addrs.push(pmi.get(&format!("t{r}"))?);
        }
        Ok(t)
    }
}

/// Step 3: the shared-memory rings between the ranks of this node. Each rank owns one
/// segment: a control block (its sleep flag first), one ring per sender of the node, then
/// its cooperative-copy slots.
struct ShmMesh {
    /// The ranks that share memory with this one, itself included (only itself with
    /// `METAMPI_FORCE_TCP`).
    ranks: Vec<u32>,
    /// Ranks on this node, whatever the transport.
    on_node: usize,
    /// One link per world rank: itself, its shared-memory peers, placeholders for the rest.
    peers: Vec<Link>,
    /// The ring each shared-memory peer writes to in this rank's segment.
    inbound: Vec<(u32, Consumer)>,
    /// The peers' segments, alive as long as the links.
    segments: Vec<Segment>,
    own: Option<Segment>,
    coop_at: usize,
}

impl ShmMesh {
    fn build(
        boot: &mut Boot,
        table: &PeerTable,
        (job, rank): (&str, u32),
        force_tcp: bool,
    ) -> io::Result<ShmMesh> {
        let size = table.nodes.len() as u32;
        let node = &boot.node;
        let local: Vec<u32> = (0..size)
            .filter(|&r| table.nodes[r as usize] == *node)
            .collect();
        let ranks: Vec<u32> = if force_tcp { vec![rank] } else { local.clone() };
        let index = |r: u32| ranks.iter().position(|&x| x == r).unwrap_or(0);
        let ring_cap = ring_cap();
        let ring_bytes = CTL_BYTES + ring_cap;
        // The cooperative-copy slots follow the rings.
        let coop_at = SEG_CTL + ranks.len() * ring_bytes;
        let seg_len = coop_at + coop::TABLE_BYTES;
        let shared = ranks.len() > 1;
        if shared && ranks[0] == rank {
            // Rings take pages as they are used; a tmpfs that runs out kills
            // the rank that touches the next page with SIGBUS. Say so before.
            let need = ranks.len() * seg_len;
            if let Some(w) =
                crate::sys::shm::free_bytes().and_then(|free| shm_space_warning(need as u64, free))
            {
                tracing::warn!("metampi: rank {rank}: {w}");
            }
        }
        let mut own = None;
        if shared {
            let path = crate::sys::shm::dir().join(format!("metampi-{job}-{rank}"));
            let _ = std::fs::remove_file(&path);
            let seg = Segment::create(&path, seg_len)?;
            boot.pmi
                .put(&format!("s{rank}"), &path.display().to_string())?;
            own = Some(seg);
        }
        boot.pmi.fence()?;

        let mut mesh = ShmMesh {
            on_node: local.len(),
            peers: Vec::with_capacity(size as usize),
            inbound: Vec::new(),
            segments: Vec::new(),
            own,
            coop_at,
            ranks: Vec::new(),
        };
        for r in 0..size {
            if r == rank || !(shared && ranks.contains(&r)) {
                // Itself, or a placeholder that `tcp_mesh` or the routers replace.
                mesh.peers.push(Link::Local);
                continue;
            }
            let own = mesh.own.as_ref().expect("created above for local peers");
            let path = PathBuf::from(boot.pmi.get(&format!("s{r}"))?);
            let seg = Segment::open(&path, seg_len)?;
            // SAFETY: ring `index(rank)` of the peer's segment is written
            // only by us (one producer per ring), and the segment lives in
            // `segments` for as long as the links.
            let prod = unsafe {
                Producer::new(seg.base().add(SEG_CTL + index(rank) * ring_bytes), ring_cap)
            };
            // SAFETY: ring `index(r)` of our segment is read only by us.
            let cons =
                unsafe { Consumer::new(own.base().add(SEG_CTL + index(r) * ring_bytes), ring_cap) };
            // SAFETY: the first word of the peer's segment is its sleep flag,
            // aligned and alive as long as `seg`.
            let peer_sleep = unsafe { SleepFlag::new(seg.base() as *const AtomicU32) };
            // SAFETY: the slot table sits at `coop_at`, 64-byte aligned (the
            // segment is page aligned, `SEG_CTL` and `ring_bytes` are lines),
            // alive as long as `seg`.
            let peer_coop = unsafe { PeerSlots::new(seg.base().add(coop_at)) };
            mesh.peers.push(Link::Shm(ShmLink {
                prod,
                peer_sleep,
                peer_coop,
                peer_wake: wake_name(job, r)?,
            }));
            mesh.inbound.push((r, cons));
            mesh.segments.push(seg);
        }
        mesh.ranks = ranks;
        Ok(mesh)
    }

    /// Whether rank `r` is reached through shared memory.
    fn shares(&self, r: u32) -> bool {
        self.ranks.len() > 1 && self.ranks.contains(&r)
    }

    /// Hands the rings the peers write to over to `links`.
    fn attach_inbound(&mut self, links: &mut Links) {
        for (r, c) in self.inbound.drain(..) {
            links.add_inbound(r, c);
        }
    }

    /// Hands this rank's own segment (its sleep flag and copy slots) and the peers'
    /// segments over to `links`, which keeps them alive.
    fn attach_own(&mut self, links: &mut Links) {
        if let Some(seg) = self.own.take() {
            seg.unlink();
            // SAFETY: the first word of our segment is our sleep flag; the
            // segment lives in `links.segments`.
            links
                .my_sleep
                .push(unsafe { SleepFlag::new(seg.base() as *const AtomicU32) });
            // SAFETY: our slot table (see `build`); only we open slots in it.
            links.coop = Some(unsafe { Table::new(seg.base().add(self.coop_at)) });
            links.segments.push(seg);
        }
        links.segments.append(&mut self.segments);
        links.cma = self.ranks.len() > 1 && !cma::turned_off() && cma::available();
    }
}

/// Step 4: TCP connections with `tcp_peers`, the ranks of this site and of directly paired
/// ones that share no memory with this one. Lower ranks connect to higher ones; the listen
/// backlog holds early connects. Each connection proves the job's secret.
fn tcp_mesh(
    boot: &Boot,
    table: &PeerTable,
    rank: u32,
    tcp_peers: &[u32],
    key: Option<&crate::auth::Secret>,
    peers: &mut [Link],
) -> io::Result<()> {
    if tcp_peers.is_empty() {
        return Ok(());
    }
    let key = key.expect("made when there are TCP peers");
    for &r in tcp_peers.iter().filter(|&&r| r > rank) {
        let addr = &table.tcp_addrs[r as usize];
        let mut s = TcpStream::connect(addr.as_str())
            .map_err(|e| other(format!("connecting to rank {r} at {addr}: {e}")))?;
        crate::auth::connect(&mut s, key, RANK_CTX, &rank.to_le_bytes())
            .map_err(|e| other(format!("authenticating with rank {r} at {addr}: {e}")))?;
        peers[r as usize] = Links::tcp(s);
    }
    let expected: Vec<u32> = tcp_peers.iter().copied().filter(|&r| r < rank).collect();
    if !expected.is_empty() {
        for (r, s) in accept_peers(rank, &boot.listener, key, RANK_CTX, expected)? {
            peers[r as usize] = Links::tcp(s);
        }
    }
    for p in peers.iter() {
        if let Link::Stream(t) = p {
            configure_stream(&t.stream)?;
        }
    }
    Ok(())
}

/// Step 5: connections to this site's routers, and for each rank of a site this one does
/// not reach directly, the router connection its traffic takes.
fn router_channels(
    c: &Contract,
    router_end: &RouterEnd<'_>,
    key: Option<&crate::auth::Secret>,
    links: &mut Links,
) -> io::Result<()> {
    let (rank, my_site) = (c.rank.rank, c.my_site());
    let mut by_site: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for r in c.sites.routers.iter().filter(|r| r.from == my_site) {
        let key = key.expect("made when there are routers");
        let (s, vchan) = router_end.connect(&r.addr, key, rank)?;
        let chan = links.add_channel(Links::stream(s, vchan));
        by_site.entry(r.to).or_default().push(chan);
    }
    for (r, &site) in (0u32..).zip(&c.site_of) {
        if c.sites.direct_between(my_site, site) {
            continue;
        }
        let chans = by_site.get(&site).ok_or_else(|| {
            other(format!(
                "no router from site {my_site} to site {site} (rank {r})"
            ))
        })?;
        // One fixed router per pair of ranks keeps their messages in order.
        links.route_via(r, chans[(r as usize + rank as usize) % chans.len()]);
    }
    Ok(())
}

/// Step 6: a spawned process meets its parents before its start-up ends,
/// over shared memory with those on its machine, and through the
/// routers of its parents' root's meta host with those on others.
/// Returns the parent intercommunicator's context and the parents' engine ranks.
fn meet_parents(
    c: &Contract,
    router_end: &RouterEnd<'_>,
    force_tcp: bool,
    links: &mut Links,
) -> io::Result<Option<(u32, Vec<u32>)>> {
    let Some(spec) = super::parents::parent_spec()? else {
        return Ok(None);
    };
    let (rank, job) = (c.rank.rank, c.rank.job.as_str());
    let mut by_site: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    let me = spec.wire_id(rank);
    if let Some(me) = me {
        let key = crate::auth::secret_from_env()?;
        for (to, addr) in spec.routers() {
            let (s, vchan) = router_end.connect(addr, &key, me)?;
            let chan = links.add_channel(Links::stream(s, vchan));
            by_site.entry(*to).or_default().push(chan);
        }
        links.set_wire_self(me);
    }
    let mut streams = super::parents::connect_parents(&spec, rank)?;
    let own = (!force_tcp)
        .then(|| join::JoinSegment::create(job, rank, streams.len()).ok())
        .flatten();
    let joined = join::join_all(&mut streams, own.as_ref(), job, rank)?;
    let mut direct = join::add_peers(links, streams, joined, own)?.into_iter();
    let mut ranks = Vec::with_capacity(spec.len());
    for i in 0..spec.len() {
        let r = match spec.routed(i) {
            None => direct
                .next()
                .ok_or_else(|| other("a parent went missing".into()))?,
            Some((wire, site)) => {
                let chans = by_site.get(&site).ok_or_else(|| {
                    other(format!("no router to meta host {site} for parent {i}"))
                })?;
                let chan = chans[(wire as usize + me.unwrap_or(0) as usize) % chans.len()];
                links.add_routed(wire, chan)
            }
        };
        ranks.push(r);
    }
    Ok(Some((spec.ctx, ranks)))
}

/// Step 7: how crowded this machine is.
struct Placement {
    /// The cores this machine's ranks were given together: ranks pinned to
    /// a core each are not oversubscribed, though each sees one core.
    cores: usize,
    oversubscribed: bool,
    /// Processes on this machine whose sleep this rank cannot see (see `Shared`).
    unseen_here: usize,
}

impl Placement {
    fn measure(c: &Contract, table: &PeerTable, mask: &str, mesh: &ShmMesh) -> Placement {
        let cores = crate::sys::cpus::machine_cores(
            crate::sys::cpus::union_count([mask]),
            crate::sys::cpus::union_count(table.masks.iter().map(String::as_str)),
        );
        // Emulated nodes, sites and their routers share this machine's cores:
        // count every rank on the machine, and the routers it reaches on loopback.
        let routers_here = c
            .sites
            .routers
            .iter()
            .filter(|r| r.addr.starts_with("127.") || r.addr.starts_with("[::1]"))
            .count();
        let on_machine = table.on_machine.max(mesh.on_node);
        Placement {
            cores,
            oversubscribed: on_machine + routers_here > cores,
            unseen_here: on_machine - mesh.ranks.len() + routers_here,
        }
    }

    /// Oversubscribed ranks yield while they spin, which hands the core to a peer
    /// that has work; blocking early costs a wake-up per message (decision 0015).
    /// The budget learns (see `spin`), unless set.
    fn spin_budget(&self, tuning: &crate::tuning::Tuning) -> spin::SpinBudget {
        let default = if self.oversubscribed {
            crate::tuning::SPIN_CROWDED
        } else {
            crate::tuning::SPIN_DEFAULT
        };
        spin::SpinBudget::new(
            tuning.spin.unwrap_or(default),
            tuning.spin_learn,
            self.oversubscribed,
        )
    }
}

/// Context of the handshake between two ranks (see `auth`).
const RANK_CTX: &str = "metampi rank-rank";

/// Names the physical machine (the kernel's boot id), so ranks on emulated
/// nodes of one machine know they share its cores.
fn machine_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The warning for a node whose ranks' rings may need `need` bytes of a
/// shared-memory file system with `free` bytes left, if they may not fit.
fn shm_space_warning(need: u64, free: u64) -> Option<String> {
    (need > free).then(|| {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        format!(
            "the shared-memory rings of this node's ranks may take {:.0} MiB, and {} has {:.0} MiB \
             free: a rank that fills its rings past that dies with SIGBUS. Make it larger \
             (docker run --shm-size), or the rings smaller (METAMPI_SHM_RING, bytes per sender), \
             or use TCP (METAMPI_FORCE_TCP=1)",
            mib(need),
            crate::sys::shm::dir().display(),
            mib(free)
        )
    })
}

/// How a process connects to a router of its meta host.
struct RouterEnd<'a> {
    /// Shared-memory pipes may be offered.
    pipes: bool,
    /// This process's node (the router gives pipes only on its own).
    node: &'a str,
    pipe_bytes: usize,
}

impl RouterEnd<'_> {
    /// The end of a rank whose routers serve `site_ranks` ranks each.
    fn new(node: &str, force_tcp: bool, site_ranks: usize) -> RouterEnd<'_> {
        let tuning = crate::tuning::current();
        RouterEnd {
            pipes: !force_tcp && tuning.router_pipes,
            node,
            // Reserved at once (see `VChan::create`): as small as streaming allows, and
            // within the routers' memory budget.
            pipe_bytes: tuning.router_pipe_bytes_among(site_ranks),
        }
    }

    /// Connects to the router at `addr`, proves the job's `key`, names this
    /// process `id` (its wire id: routers deliver by it) and settles the
    /// channel (pipes or the TCP connection itself).
    fn connect(
        &self,
        addr: &str,
        key: &crate::auth::Secret,
        id: u32,
    ) -> io::Result<(TcpStream, Option<crate::sys::vchan::VChan>)> {
        let mut s = TcpStream::connect(addr)
            .map_err(|e| other(format!("connecting to the router at {addr}: {e}")))?;
        crate::auth::connect(&mut s, key, crate::auth::VERTICAL_CTX, &id.to_le_bytes())
            .map_err(|e| other(format!("authenticating with the router at {addr}: {e}")))?;
        let vchan = offer_pipes(&mut s, self.pipes, self.node, self.pipe_bytes).map_err(|e| {
            other(format!(
                "setting up the channel to the router at {addr}: {e}"
            ))
        })?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        Ok((s, vchan))
    }
}

/// After the handshake with a router: offers it shared-memory pipes (when
/// `want`), and returns them if it runs on this rank's node and took them.
/// The router answers one byte: 1 for "mapped", 0 for "keep TCP".
fn offer_pipes(
    s: &mut TcpStream,
    want: bool,
    node: &str,
    bytes: usize,
) -> io::Result<Option<crate::sys::vchan::VChan>> {
    use crate::sys::vchan::{node_hash, Offer, VChan};
    use std::io::{Read, Write};
    // A segment that cannot be made (no /dev/shm, full) leaves TCP.
    let made = if want {
        VChan::create(node_hash(node), bytes).ok()
    } else {
        None
    };
    let offer = made.as_ref().map_or_else(Offer::none, |(_, o)| o.encode());
    let mut answer = [0u8; 1];
    let got = s
        .write_all(&offer)
        .and_then(|()| s.set_read_timeout(Some(Duration::from_secs(30))))
        .and_then(|()| s.read_exact(&mut answer))
        .and_then(|()| s.set_read_timeout(None));
    // The router has mapped the segment or never will: its name goes either way.
    let vchan = made.map(|(v, _)| {
        v.unlink();
        v
    });
    got?;
    let mut vchan = vchan.filter(|_| answer[0] == 1);
    if let Some(v) = &mut vchan {
        v.probe_loans(!crate::knobs::flag("METAMPI_NO_ROUTER_LOANS", false));
    }
    Ok(vchan)
}

/// Connections at most in the middle of their handshake at once while a rank accepts its
/// peers (at least; twice the peers expected where that is more): a stranger holding more
/// open pushes out its own oldest, and costs the rank a socket each, no thread.
const PENDING_MIN: usize = 64;

/// Accepts one authenticated connection (context `ctx`, a 4-byte hello
/// naming the peer) from each of `expected`, refusing strangers. The handshakes run side by
/// side on this thread, so silent connections do not hold up the peers.
pub(crate) fn accept_peers(
    rank: u32,
    listener: &TcpListener,
    key: &crate::auth::Secret,
    ctx: &'static str,
    expected: Vec<u32>,
) -> io::Result<Vec<(u32, TcpStream)>> {
    accept_peers_until(rank, listener, key, ctx, expected, None)
}

/// As [`accept_peers`], failing with `TimedOut` where `expected` have not all connected by
/// `deadline`.
pub(crate) fn accept_peers_until(
    rank: u32,
    listener: &TcpListener,
    key: &crate::auth::Secret,
    ctx: &'static str,
    mut expected: Vec<u32>,
    deadline: Option<std::time::Instant>,
) -> io::Result<Vec<(u32, TcpStream)>> {
    use crate::auth::Acceptance;
    use std::os::fd::AsRawFd;
    let mut done = Vec::with_capacity(expected.len());
    let mut pending: Vec<(Acceptance, std::net::SocketAddr)> = Vec::new();
    let cap = PENDING_MIN.max(2 * expected.len());
    // Connections dropped unproven (silent past the deadline, or pushed out).
    let mut dropped = 0u64;
    listener.set_nonblocking(true)?;
    while !expected.is_empty() {
        loop {
            match listener.accept() {
                Ok((s, from)) => {
                    if pending.len() >= cap {
                        pending.remove(0);
                        dropped += 1;
                    }
                    if let Ok(a) = Acceptance::start(s, 4) {
                        pending.push((a, from));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let mut i = 0;
        while i < pending.len() {
            match pending[i].0.advance(key, ctx) {
                Ok(Some(h)) => {
                    let (a, _) = pending.swap_remove(i);
                    let r = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
                    let Some(k) = expected.iter().position(|&x| x == r) else {
                        return Err(other(format!("unexpected TCP hello from rank {r}")));
                    };
                    expected.swap_remove(k);
                    let s = a.into_stream();
                    s.set_nonblocking(false)?;
                    done.push((r, s));
                }
                Ok(None) if pending[i].0.overdue() => {
                    pending.swap_remove(i);
                    dropped += 1;
                }
                Ok(None) => i += 1,
                Err(e) => {
                    let (_, from) = pending.swap_remove(i);
                    // A connection that cannot prove the job secret is logged and dropped;
                    // the job goes on waiting for its real peers.
                    if e.kind() == io::ErrorKind::PermissionDenied {
                        tracing::warn!(
                            "metampi: rank {rank}: refused a connection from {from}: {e}"
                        );
                    } else {
                        dropped += 1;
                    }
                }
            }
        }
        if expected.is_empty() {
            break;
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            listener.set_nonblocking(false)?;
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{} of the peers expected did not connect in time",
                    expected.len()
                ),
            ));
        }
        let mut fds = vec![(listener.as_raw_fd(), false)];
        fds.extend(pending.iter().map(|(a, _)| (a.stream().as_raw_fd(), false)));
        // Wakes for new connections and answers, and now and then for the deadlines.
        poll::wait(&fds, Duration::from_millis(100))?;
    }
    if dropped > 0 {
        tracing::warn!(
            "metampi: rank {rank}: dropped {dropped} connections that did not prove the job \
             secret in time"
        );
    }
    listener.set_nonblocking(false)?;
    Ok(done)
}

/// A connection to a peer as every stream link wants it: no Nagle delay,
/// non-blocking, explicit 4 MiB buffers (they beat loopback autotuning for
/// streaming, measured).
pub(crate) fn configure_stream(s: &TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    let tcp_buf = crate::tuning::current().tcp_buf;
    if tcp_buf > 0 {
        use std::os::fd::AsRawFd;
        poll::set_socket_buffers(s.as_raw_fd(), tcp_buf)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{self, Secret};
    use std::time::Instant;

    #[test]
    fn a_small_shared_memory_file_system_is_reported() {
        assert_eq!(shm_space_warning(64 << 20, 64 << 20), None);
        let w = shm_space_warning(96 << 20, 60 << 20).expect("a warning");
        assert!(w.contains("96 MiB") && w.contains("60 MiB"), "{w}");
        assert!(
            w.contains("--shm-size") && w.contains("METAMPI_SHM_RING"),
            "{w}"
        );
    }

    /// Silent strangers connected first must not hold up the real peers:
    /// each handshake runs on its own, so the two peers get in long before
    /// the strangers' 10-second handshake timeout.
    #[test]
    fn silent_strangers_do_not_delay_peers() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let key = Secret::random().unwrap();
        let strangers: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let peers: Vec<_> = [1u32, 0]
            .into_iter()
            .map(|r| {
                let key = key.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(50));
                    let mut s = TcpStream::connect(addr).unwrap();
                    auth::connect(&mut s, &key, RANK_CTX, &r.to_le_bytes()).unwrap();
                    s
                })
            })
            .collect();
        let t = Instant::now();
        let mut got = accept_peers(2, &listener, &key, RANK_CTX, vec![0, 1]).unwrap();
        let took = t.elapsed();
        got.sort_by_key(|p| p.0);
        assert_eq!(got.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1]);
        assert!(
            took < Duration::from_secs(5),
            "peers waited {took:?} behind strangers"
        );
        for p in peers {
            p.join().unwrap();
        }
        drop(strangers);
    }

    /// A hundred silent connections, more than the rank keeps pending: the oldest make
    /// room, the peer gets in, and none of them cost a thread.
    #[test]
    fn many_silent_strangers_cost_no_threads() {
        let threads = || std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let key = Secret::random().unwrap();
        let strangers: Vec<TcpStream> = (0..100)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let k = key.clone();
        let peer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let mut s = TcpStream::connect(addr).unwrap();
            auth::connect(&mut s, &k, RANK_CTX, &0u32.to_le_bytes()).unwrap();
            s
        });
        let before = threads();
        let got = accept_peers(1, &listener, &key, RANK_CTX, vec![0]).unwrap();
        assert_eq!(got[0].0, 0);
        peer.join().unwrap();
        // Other tests of this binary run beside it: a margin, far below one per stranger.
        assert!(
            threads() < before + 20,
            "{} threads, {before} before",
            threads()
        );
        drop(strangers);
    }

    /// A wrong secret is refused and the real peer still gets in.
    #[test]
    fn wrong_secret_is_refused_and_peer_accepted() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let key = Secret::random().unwrap();
        let bad = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let wrong = Secret::random().unwrap();
            auth::connect(&mut s, &wrong, RANK_CTX, &0u32.to_le_bytes()).unwrap_err()
        });
        let k = key.clone();
        let good = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let mut s = TcpStream::connect(addr).unwrap();
            auth::connect(&mut s, &k, RANK_CTX, &0u32.to_le_bytes()).unwrap();
        });
        let got = accept_peers(1, &listener, &key, RANK_CTX, vec![0]).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 0);
        let e = bad.join().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        good.join().unwrap();
    }
}
