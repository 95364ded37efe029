//! The resolved, validated model of a meta computer: meta hosts with their nodes, PAIRs with
//! their routers and links, and the global settings. Produced by [`crate::parse_str`] and
//! [`crate::parse_pacx_str`]; every cross reference in it has been checked.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use crate::error::Pos;
use crate::layout::Layout;
use crate::units::{format_duration, Bandwidth};

/// Which language a configuration was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// The MetaMPICH meta-computer description language (with metampi's extensions).
    MetaMpich,
    /// A PACX-MPI hostfile: `host nodes protocol (startup command)` per line.
    Pacx,
}

/// A validated meta-computer configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaConfig {
    /// The name the text was parsed under (usually its path).
    pub source: String,
    /// The language it was written in.
    pub format: Format,
    /// Settings that apply to the whole job.
    pub globals: Globals,
    /// The meta hosts, in rank order (the `NUMHOSTS` header order, else definition order).
    pub hosts: Vec<MetaHost>,
    /// One entry per ordered pair of meta hosts, ordered by (from, to) host index.
    pub pairs: Vec<Pair>,
    pub(crate) layout: Layout,
}

impl MetaConfig {
    /// The resolved placement: global rank ranges, process counts per node, routers and the
    /// links between them. See [`Layout`].
    #[must_use]
    pub fn layout(&self) -> Layout {
        self.layout.clone()
    }

    /// The resolved placement, borrowed.
    #[must_use]
    pub fn layout_ref(&self) -> &Layout {
        &self.layout
    }

    /// The index of the meta host called `name`.
    #[must_use]
    pub fn host_index(&self, name: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.name == name)
    }

    /// The PAIR section for routing from `from` to `to` (host indices).
    #[must_use]
    pub fn pair(&self, from: usize, to: usize) -> Option<&Pair> {
        self.pairs.iter().find(|p| p.from == from && p.to == to)
    }

    /// The number of application processes (the size of `MPI_COMM_WORLD`).
    #[must_use]
    pub fn world_size(&self) -> usize {
        self.layout.world_size
    }
}

/// Job-wide settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Globals {
    /// First TCP port for automatically numbered router ports (`PORTBASE`, default 28000).
    pub port_base: u16,
    /// How long a router waits for its peers (`ROUTERTIMEOUT`; MetaMPICH gives seconds).
    pub router_timeout: Option<Duration>,
    /// MetaMPICH's message split size (`SPLITSIZE`), passed through to the router.
    pub split_size: Option<u64>,
    /// A file holding the job secret that authenticates router links and the bootstrap
    /// (`SECRET_FILE`); a leading `~` is left for the consumer to expand.
    pub secret_file: Option<String>,
    /// Whether `AUTO_ROUTER` was given (routers for PAIRs without a section are generated).
    pub auto_router: bool,
    /// MetaMPICH options that metampi accepts but does not use (`ISEND_NUM`, `HETERO`,
    /// `EXCHANGE_ORDER`, `AUTO_ROUTER` flags), by keyword.
    pub legacy: BTreeMap<String, String>,
}

impl Default for Globals {
    fn default() -> Self {
        Self {
            port_base: DEFAULT_PORT_BASE,
            router_timeout: None,
            split_size: None,
            secret_file: None,
            auto_router: false,
            legacy: BTreeMap::new(),
        }
    }
}

/// The default `PORTBASE`.
pub const DEFAULT_PORT_BASE: u16 = 28000;

/// One site of the meta computer: a cluster, an SMP server, a cloud region.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaHost {
    /// Its name.
    pub name: String,
    /// Where it was declared (the `NUMHOSTS` line, the `METAHOST` keyword, or the hostfile line).
    pub pos: Pos,
    /// The number of application processes (world ranks) it runs.
    pub nprocs: usize,
    /// The native device (`TYPE`).
    pub device: Device,
    /// How its processes are started (`LAUNCH`).
    pub launch: Launch,
    /// The byte order its processes use on the wire (`BYTEORDER`).
    pub byte_order: ByteOrder,
    /// Its TLS identity for links with `TLS = on` (`TLSCERT`, `TLSKEY`, `TLSCA`, `TLSPIN`,
    /// `TLSNAME`).
    pub tls: HostTls,
    /// Its nodes, in file order (MetaMPICH sorted them by name; metampi keeps the order given).
    pub nodes: Vec<Node>,
    /// `LAUNCH = local` was written (for it or globally): nodes without an address are
    /// reached at 127.0.0.1.
    pub(crate) loopback: bool,
    /// The node or machine sub-launches start from (`FRONTEND`).
    pub frontend: Option<String>,
    /// The remote user name (`USER`).
    pub user: Option<String>,
    /// Directory of the program its ranks run (`EXECPATH`); see [`MetaHost::rank_command`].
    pub exec_path: Option<String>,
    /// File name of the program its ranks run (`EXECNAME`).
    pub exec_name: Option<String>,
    /// The arguments of its ranks' program as written (`EXECARGS`, or the quoted text on a
    /// `NUMHOSTS` line), split like shell words when used ([`crate::split_args`]; checked to
    /// split when parsed).
    pub exec_args: Option<String>,
    /// A file of `NAME=value` lines for its processes' environment (`ENVFILE`), read by
    /// [`MetaHost::environment`].
    pub env_file: Option<String>,
    /// Environment variables for its processes (`ENV = NAME=value, ...`), in file order; each
    /// name is a valid variable name, given once, and not `METAMPI_*`.
    pub env: Vec<(String, String)>,
    /// The metampi installation root on this meta host's machines (`MPIROOT`): its routers
    /// run `MPIROOT/bin/metampi` unless a router executable is given.
    pub mpi_root: Option<String>,
    /// Router executable for this host's routers (`ROUTEREXEC`); see
    /// [`MetaHost::router_program`].
    pub router_exec: Option<String>,
    /// Options for the native device (`DEVOPTS`).
    pub dev_opts: Option<String>,
    /// MetaMPICH settings kept verbatim but unused (`CONFPATH`, `CONFNAME`, `METAKEY`).
    pub legacy: BTreeMap<String, String>,
}

/// One machine of a meta host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its name (a host name for `ssh`, or just a label for `LAUNCH = local`).
    pub name: String,
    /// Its network addresses, as listed in parentheses or used by link endpoints. When the
    /// list is empty the node is reached by its name, or at 127.0.0.1 when its meta host says
    /// `LAUNCH = local` explicitly ([`crate::NodeLayout::address`] has the result).
    pub addresses: Vec<Address>,
    /// The most application processes it may run (`node 2`, `MAXPROCS = 2`, `SLOTS = 2`);
    /// `None` is unlimited. Routers do not count against it.
    pub max_procs: Option<u32>,
    /// A node-specific program for its ranks (`node : /path/to/exe`).
    pub executable: Option<String>,
    /// Its arguments as written (`node : /path/to/exe : 'args'`), split like shell words.
    pub exec_args: Option<String>,
}

/// A network address of a node or a link endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Address {
    /// An IPv4 or IPv6 address (`192.168.0.1`, `[::1]`, `TCP 10.0.0.1`).
    Ip(IpAddr),
    /// A host name, resolved when the job starts (also `GETIP(name)` of a `NICDEF`).
    Host(String),
    /// An ATM permanent virtual circuit (`ATM_PVC 0.0.42`), as in the MetaMPICH paper.
    AtmPvc(String),
    /// An ATM switched virtual circuit by NSAP address (`ATM_SVC 47.00...`).
    AtmSvc(String),
}

impl Address {
    /// Whether a TCP router can use it (ATM circuits are described but cannot be driven).
    #[must_use]
    pub fn is_tcp(&self) -> bool {
        matches!(self, Self::Ip(_) | Self::Host(_))
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Self::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Self::Host(h) => f.write_str(h),
            Self::AtmPvc(p) => write!(f, "ATM_PVC {p}"),
            Self::AtmSvc(s) => write!(f, "ATM_SVC {s}"),
        }
    }
}

/// The native MPICH device of a meta host (`TYPE`). metampi picks its transports per
/// destination (shared memory on one machine, TCP inside a site), so this is descriptive,
/// except that `ch_shmem` requires a single node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Not given: metampi decides.
    #[default]
    Auto,
    /// `ch_shmem`: one SMP machine.
    Shmem,
    /// `ch_p4`: TCP.
    P4,
    /// `ch_smi`: SCI shared memory.
    Smi,
    /// `ch_usock`: user sockets.
    Usock,
    /// `ch_gm`: Myrinet GM.
    Gm,
    /// `ch_mpx`.
    Mpx,
}

impl Device {
    pub(crate) const CHOICES: &'static str =
        "ch_shmem, ch_p4, ch_smi, ch_usock, ch_gm, ch_mpx or auto";

    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "auto" => Self::Auto,
            "ch_shmem" => Self::Shmem,
            "ch_p4" => Self::P4,
            "ch_smi" => Self::Smi,
            "ch_usock" => Self::Usock,
            "ch_gm" => Self::Gm,
            "ch_mpx" => Self::Mpx,
            _ => return None,
        })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Shmem => "ch_shmem",
            Self::P4 => "ch_p4",
            Self::Smi => "ch_smi",
            Self::Usock => "ch_usock",
            Self::Gm => "ch_gm",
            Self::Mpx => "ch_mpx",
        })
    }
}

/// How the processes of a meta host are started (`LAUNCH`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Launch {
    /// On this machine (site emulation; nodes without address listen on 127.0.0.1).
    Local,
    /// On this machine inside the named Linux network namespace.
    Netns(String),
    /// Through `ssh` to the given destination (`host`, `user@host`, `host:port`).
    Ssh(String),
    /// Not at all: the user starts them.
    Manual,
    /// Through a command template; `{cmd}` is replaced by the quoted process command line,
    /// `{node}` by the node name and `{host}` by the meta host name.
    Command(String),
    /// Through Slurm (`slurm [via LOGIN] [SALLOC OPTIONS...]`): the meta host's nodes are
    /// allocated as one Slurm job for the length of the metampi job, and each of its
    /// processes runs as a one-task srun step on its node; Slurm's commands run here, or
    /// through ssh on `login`.
    Slurm {
        /// ssh destination of the cluster's login node; `None`: this machine.
        login: Option<String>,
        /// Options for the allocation (`--partition=debug`, `--time=10`), as words.
        options: Vec<String>,
    },
    /// A PACX-MPI startup command, run as written (it starts the whole meta host).
    Verbatim(String),
}

impl fmt::Display for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local => f.write_str("local"),
            Self::Netns(n) => write!(f, "netns {n}"),
            Self::Ssh(h) => write!(f, "ssh {h}"),
            Self::Manual => f.write_str("manual"),
            Self::Slurm { login, options } => {
                f.write_str("slurm")?;
                if let Some(l) = login {
                    write!(f, " via {l}")?;
                }
                options.iter().try_for_each(|o| write!(f, " {o}"))
            }
            Self::Command(c) | Self::Verbatim(c) => write!(f, "{c:?}"),
        }
    }
}

/// The byte order of a meta host's processes (`BYTEORDER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ByteOrder {
    /// Whatever the machine uses.
    #[default]
    Native,
    /// Little endian.
    Little,
    /// Big endian (needs conversion on the wire when meta hosts differ).
    Big,
}

impl fmt::Display for ByteOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Native => "native",
            Self::Little => "little",
            Self::Big => "big",
        })
    }
}

/// The routers that carry traffic from meta host `from` to meta host `to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    /// Sending meta host (index into [`MetaConfig::hosts`]).
    pub from: usize,
    /// Receiving meta host.
    pub to: usize,
    /// Where it was defined (`PAIR` keyword, the `<->` link that implied it, or the
    /// `AUTO_ROUTER` / hostfile line that generated it).
    pub pos: Pos,
    /// How it came to be.
    pub origin: PairOrigin,
    /// Its routers, each on a node of `from`; none for a direct pair (`PAIR A B 0`),
    /// whose ranks connect to each other.
    pub routers: Vec<Router>,
}

/// How a PAIR came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PairOrigin {
    /// Written as a `PAIR` section.
    Explicit,
    /// Implied by `<->` links in the reverse PAIR.
    Bidirectional,
    /// Generated by `AUTO_ROUTER` or from a PACX-MPI hostfile.
    Auto,
}

/// One router process: it runs on a node of the sending meta host and drives one or more
/// links to the receiving meta host. Routers get no world rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Router {
    /// The node it runs on (index into the sending host's [`MetaHost::nodes`]).
    pub node: usize,
    /// The router executable, if not the default (PAIR header or `ROUTEREXEC`).
    pub exec: Option<String>,
    /// Where its line starts.
    pub pos: Pos,
    /// Its outgoing links.
    pub links: Vec<Link>,
}

/// One directed TCP connection from a router to the receiving meta host. The receiving end
/// listens on `dst_address:port`.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// The local address the router sends from.
    pub src_address: Address,
    /// The node of the receiving meta host the link ends on.
    pub dst_node: usize,
    /// The address the receiving end listens on.
    pub dst_address: Address,
    /// The port the receiving end listens on.
    pub port: u16,
    /// Where the port came from.
    pub port_origin: PortOrigin,
    /// Emulation, compression, TLS and bundling settings (global, then PAIR, then link).
    pub options: LinkOptions,
    /// Where the link is written.
    pub pos: Pos,
}

/// Where a link's port came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortOrigin {
    /// `PORT =` on the link or the PAIR.
    Explicit,
    /// `address:N`: `PORTBASE + N`, as in MetaMPICH.
    Offset,
    /// Numbered automatically from `PORTBASE`.
    Auto,
}

/// Per-link settings. Unset fields mean "no emulation" / "router default".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LinkOptions {
    /// Emulated bandwidth limit (`BANDWIDTH`).
    pub bandwidth: Option<Bandwidth>,
    /// Emulated one-way latency (`LATENCY`).
    pub latency: Option<Duration>,
    /// Payload compression (`COMPRESSION`).
    pub compression: Compression,
    /// Transport security (`TLS`).
    pub tls: Tls,
    /// Payload checksums in the router's frames (`CHECKSUM`).
    pub checksum: Checksum,
    /// How long the router may hold small messages to bundle them (`BUNDLE_DEADLINE`).
    pub bundle_deadline: Option<Duration>,
}

impl LinkOptions {
    /// A short one-line summary, as the layout table prints it.
    #[must_use]
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(b) = self.bandwidth {
            parts.push(b.to_string());
        }
        if let Some(l) = self.latency {
            parts.push(format!("+{}", format_duration(l)));
        }
        parts.push(format!("compress={}", self.compression));
        parts.push(format!("tls={}", self.tls));
        if !self.payload_checksum() {
            parts.push("checksum=off".into());
        }
        if let Some(d) = self.bundle_deadline {
            parts.push(format!("bundle={}", format_duration(d)));
        }
        parts.join(" ")
    }

    /// Whether the routers' frame checksums on this link cover the payload: `CHECKSUM`,
    /// where `auto` means yes on plain TCP and no under TLS, whose record
    /// authentication already rejects any changed byte.
    #[must_use]
    pub fn payload_checksum(&self) -> bool {
        match self.checksum {
            Checksum::On => true,
            Checksum::Off => false,
            Checksum::Auto => self.tls == Tls::Off,
        }
    }
}

/// Payload checksums in a link's frames (`CHECKSUM`). Frame headers are always checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Checksum {
    /// On for plain TCP, off under TLS.
    #[default]
    Auto,
    /// A CRC-32C over every frame's payload: a changed byte is found and the frame
    /// sent again.
    On,
    /// Headers only: the payload is as safe as TCP's 16-bit checksum leaves it. Saves
    /// both routers a pass over every byte.
    Off,
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

/// Payload compression on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// The router decides from the measured link speed.
    #[default]
    Auto,
    /// Never.
    Off,
    /// LZ4 (fast).
    Lz4,
    /// Zstandard (smaller).
    Zstd,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Off => "off",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        })
    }
}

/// Transport security of a link (`TLS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tls {
    /// Plain TCP, authenticated by the job secret (HMAC challenge and response), not
    /// encrypted.
    #[default]
    Off,
    /// TLS 1.3 with a key and self-signed certificate that every router derives from the job
    /// secret and its id; each end pins the certificate the other derives. Needs no setup;
    /// authenticates as much as the job secret does, and encrypts.
    Auto,
    /// TLS 1.3 with the meta hosts' own certificates (`TLSCERT`, `TLSKEY`), each end
    /// checking the other by `TLSCA` and/or `TLSPIN` (see [`HostTls`]).
    On,
}

impl fmt::Display for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Off => "off",
            Self::Auto => "auto",
            Self::On => "on",
        })
    }
}

/// A meta host's TLS identity for links with `TLS = on`: what its routers present, and how
/// the routers of other meta hosts recognise it. Each field comes from the `METAHOST` block,
/// else from the top level (a default for every meta host). Paths are read by the routers,
/// on the machines they run on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct HostTls {
    /// PEM certificate chain its routers present (`TLSCERT`), leaf first.
    pub cert: Option<String>,
    /// PEM private key of that certificate (`TLSKEY`).
    pub key: Option<String>,
    /// PEM bundle of the certificate authorities that vouch for its certificate (`TLSCA`):
    /// a peer accepts its certificate when it chains to one of them and names
    /// [`HostTls::name`].
    pub ca: Option<String>,
    /// SHA-256 fingerprints of the certificates it may present (`TLSPIN`); a peer accepts
    /// only these when any are given.
    pub pins: Vec<[u8; 32]>,
    /// The DNS name its certificate must carry when checked against `TLSCA` (`TLSNAME`);
    /// `None` means the meta host's name.
    pub name: Option<String>,
}

impl HostTls {
    /// Whether nothing is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The name a CA-checked certificate must carry: `TLSNAME`, else `host_name`.
    #[must_use]
    pub fn name_or<'a>(&'a self, host_name: &'a str) -> &'a str {
        self.name.as_deref().unwrap_or(host_name)
    }
}

/// Formats a certificate fingerprint as `TLSPIN` takes it: `sha256:` and 64 hex digits.
#[must_use]
pub fn format_pin(pin: &[u8; 32]) -> String {
    let hex: String = pin.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
