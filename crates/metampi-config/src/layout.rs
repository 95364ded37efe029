//! The resolved placement of a meta computer: which world ranks each meta host and node
//! runs, where each router runs, and which links connect the routers.
//!
//! Numbering follows PACX-MPI: ranks are contiguous per meta host, in the order of the
//! configuration; inside a meta host they are contiguous per node, in node order. Routers
//! get no world rank.

use std::fmt;
use std::ops::Range;

use crate::model::{format_pin, Address, ByteOrder, Device, HostTls, Launch, LinkOptions, Tls};

/// The resolved placement. `Display` prints it as aligned tables (what `metampi check`
/// shows).
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Number of application processes (size of `MPI_COMM_WORLD`).
    pub world_size: usize,
    /// Meta hosts in rank order.
    pub hosts: Vec<HostLayout>,
    /// All routers, ordered by (meta host, peer meta host, index in the PAIR).
    pub routers: Vec<RouterLayout>,
    /// All links, ordered like their sending routers.
    pub links: Vec<LinkLayout>,
    /// Pairs of meta hosts (lower index first) whose ranks connect to each
    /// other directly, without routers (`PAIR A B 0`).
    pub direct: Vec<(usize, usize)>,
}

/// One meta host in the layout.
#[derive(Debug, Clone, PartialEq)]
pub struct HostLayout {
    /// Its name.
    pub name: String,
    /// Its world ranks.
    pub ranks: Range<usize>,
    /// Native device.
    pub device: Device,
    /// How its processes are started.
    pub launch: Launch,
    /// Its byte order.
    pub byte_order: ByteOrder,
    /// Its TLS identity for links with `TLS = on`.
    pub tls: HostTls,
    /// Its nodes, in configuration order.
    pub nodes: Vec<NodeLayout>,
}

/// One node in the layout.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeLayout {
    /// Its name.
    pub name: String,
    /// The address routers on it use by default.
    pub address: Address,
    /// Its `MAXPROCS`, if given.
    pub max_procs: Option<u32>,
    /// Application processes placed on it.
    pub nprocs: usize,
    /// Their world ranks.
    pub ranks: Range<usize>,
    /// Routers running on it (indices into [`Layout::routers`]).
    pub routers: Vec<usize>,
}

/// One router process in the layout.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterLayout {
    /// Its index in [`Layout::routers`].
    pub id: usize,
    /// The meta host it runs on.
    pub host: usize,
    /// The node it runs on (index into that host's nodes).
    pub node: usize,
    /// The meta host it sends to (it serves PAIR `host peer`).
    pub peer: usize,
    /// Its index among the routers of that PAIR.
    pub index: usize,
    /// Router executable, if not the default.
    pub exec: Option<String>,
    /// Its outgoing links (indices into [`Layout::links`]).
    pub links_out: Vec<usize>,
    /// Where it accepts incoming links from `peer`'s routers.
    pub listen: Vec<Listen>,
}

/// One listening socket of a router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    /// Address to bind.
    pub address: Address,
    /// Port to bind.
    pub port: u16,
    /// The link that connects to it (index into [`Layout::links`]).
    pub link: usize,
}

/// One directed link in the layout.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkLayout {
    /// Its index in [`Layout::links`].
    pub id: usize,
    /// Sending meta host.
    pub from_host: usize,
    /// Receiving meta host.
    pub to_host: usize,
    /// The router that sends on it.
    pub router: usize,
    /// The router of the reverse PAIR that accepts it and tunnels its messages into `to_host`.
    pub peer_router: usize,
    /// Sending node (index into the sending host's nodes).
    pub src_node: usize,
    /// Sending address.
    pub src_address: Address,
    /// Receiving node (index into the receiving host's nodes).
    pub dst_node: usize,
    /// Receiving address (the peer router listens here).
    pub dst_address: Address,
    /// Receiving port.
    pub port: u16,
    /// Effective settings.
    pub options: LinkOptions,
}

impl Layout {
    /// The meta host that runs world rank `rank`, or `None` if `rank >= world_size`.
    #[must_use]
    pub fn host_of_rank(&self, rank: usize) -> Option<usize> {
        if rank >= self.world_size {
            return None;
        }
        let i = self.hosts.partition_point(|h| h.ranks.end <= rank);
        (i < self.hosts.len()).then_some(i)
    }

    /// The (meta host, node) that runs world rank `rank`.
    #[must_use]
    pub fn locate(&self, rank: usize) -> Option<(usize, usize)> {
        let h = self.host_of_rank(rank)?;
        let nodes = &self.hosts[h].nodes;
        let n = nodes.partition_point(|n| n.ranks.end <= rank);
        (n < nodes.len()).then_some((h, n))
    }

    /// The routers of PAIR `from to`, in PAIR order.
    pub fn routers_between(&self, from: usize, to: usize) -> impl Iterator<Item = &RouterLayout> {
        self.routers
            .iter()
            .filter(move |r| r.host == from && r.peer == to)
    }

    /// The links from meta host `from` to meta host `to`.
    pub fn links_between(&self, from: usize, to: usize) -> impl Iterator<Item = &LinkLayout> {
        self.links
            .iter()
            .filter(move |l| l.from_host == from && l.to_host == to)
    }

    fn node_name(&self, host: usize, node: usize) -> &str {
        self.hosts
            .get(host)
            .and_then(|h| h.nodes.get(node))
            .map_or("?", |n| n.name.as_str())
    }

    fn host_name(&self, host: usize) -> &str {
        self.hosts.get(host).map_or("?", |h| h.name.as_str())
    }
}

fn ranks(r: &Range<usize>) -> String {
    match r.len() {
        0 => "-".into(),
        1 => r.start.to_string(),
        _ => format!("{}-{}", r.start, r.end - 1),
    }
}

/// Left-aligned columns separated by two spaces; no trailing blanks.
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|s| (*s).to_owned()).collect()],
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0usize; cols];
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i].saturating_sub(cell.chars().count());
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            writeln!(f, "  {}", line.trim_end())?;
        }
        Ok(())
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: usize = self.hosts.iter().map(|h| h.nodes.len()).sum();
        writeln!(
            f,
            "meta computer: {} meta host{}, {} node{}, {} rank{}, {} router{}, {} link{}",
            self.hosts.len(),
            plural(self.hosts.len()),
            nodes,
            plural(nodes),
            self.world_size,
            plural(self.world_size),
            self.routers.len(),
            plural(self.routers.len()),
            self.links.len(),
            plural(self.links.len()),
        )?;

        writeln!(f, "\nmeta hosts")?;
        let mut t = Table::new(&[
            "#",
            "HOST",
            "RANKS",
            "PROCS",
            "NODES",
            "TYPE",
            "BYTEORDER",
            "LAUNCH",
        ]);
        for (i, h) in self.hosts.iter().enumerate() {
            t.row(vec![
                i.to_string(),
                h.name.clone(),
                ranks(&h.ranks),
                h.ranks.len().to_string(),
                h.nodes.len().to_string(),
                h.device.to_string(),
                h.byte_order.to_string(),
                h.launch.to_string(),
            ]);
        }
        t.write(f)?;

        writeln!(f, "\nnodes")?;
        let mut t = Table::new(&[
            "HOST", "NODE", "ADDRESS", "MAXPROCS", "PROCS", "RANKS", "ROUTERS",
        ]);
        for h in &self.hosts {
            for n in &h.nodes {
                let routers: Vec<String> = n.routers.iter().map(|r| format!("r{r}")).collect();
                t.row(vec![
                    h.name.clone(),
                    n.name.clone(),
                    n.address.to_string(),
                    n.max_procs.map_or_else(|| "-".into(), |m| m.to_string()),
                    n.nprocs.to_string(),
                    ranks(&n.ranks),
                    if routers.is_empty() {
                        "-".into()
                    } else {
                        routers.join(" ")
                    },
                ]);
            }
        }
        t.write(f)?;

        if !self.routers.is_empty() {
            writeln!(f, "\nrouters (no world rank)")?;
            let mut t = Table::new(&["ROUTER", "PAIR", "HOST", "NODE", "LINKS OUT", "LISTENS ON"]);
            for r in &self.routers {
                let out: Vec<String> = r.links_out.iter().map(|l| format!("l{l}")).collect();
                let listen: Vec<String> = r
                    .listen
                    .iter()
                    .map(|l| format!("{}:{} (l{})", l.address, l.port, l.link))
                    .collect();
                t.row(vec![
                    format!("r{}", r.id),
                    format!(
                        "{} -> {} #{}",
                        self.host_name(r.host),
                        self.host_name(r.peer),
                        r.index
                    ),
                    self.host_name(r.host).to_owned(),
                    self.node_name(r.host, r.node).to_owned(),
                    out.join(" "),
                    if listen.is_empty() {
                        "-".into()
                    } else {
                        listen.join(", ")
                    },
                ]);
            }
            t.write(f)?;
        }

        if !self.links.is_empty() {
            writeln!(f, "\nlinks")?;
            let mut t = Table::new(&["LINK", "ROUTERS", "FROM", "TO", "PORT", "OPTIONS"]);
            for l in &self.links {
                t.row(vec![
                    format!("l{}", l.id),
                    format!("r{} -> r{}", l.router, l.peer_router),
                    format!(
                        "{}/{} {}",
                        self.host_name(l.from_host),
                        self.node_name(l.from_host, l.src_node),
                        l.src_address
                    ),
                    format!(
                        "{}/{} {}",
                        self.host_name(l.to_host),
                        self.node_name(l.to_host, l.dst_node),
                        l.dst_address
                    ),
                    l.port.to_string(),
                    l.options.summary(),
                ]);
            }
            t.write(f)?;
        }

        if !self.direct.is_empty() {
            writeln!(
                f,
                "
direct pairs (ranks connect to each other, no routers)"
            )?;
            let mut t = Table::new(&["PAIR", "RANKS", "RANKS"]);
            for &(a, b) in &self.direct {
                t.row(vec![
                    format!("{} <-> {}", self.host_name(a), self.host_name(b)),
                    ranks(&self.hosts[a].ranks),
                    ranks(&self.hosts[b].ranks),
                ]);
            }
            t.write(f)?;
        }
        self.write_tls(f)
    }
}

impl Layout {
    /// What the links' TLS settings mean: who presents which certificate and how it is
    /// checked (`TLS = on`), and a note for `TLS = auto`. Nothing when every link is plain.
    fn write_tls(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let uses = |mode: Tls| self.links.iter().any(|l| l.options.tls == mode);
        if uses(Tls::On) {
            writeln!(f, "\ntls identities (links with tls=on)")?;
            let mut t = Table::new(&["HOST", "TLSCERT", "TLSKEY", "CHECKED BY"]);
            for (i, h) in self.hosts.iter().enumerate() {
                if !self
                    .links
                    .iter()
                    .any(|l| l.options.tls == Tls::On && (l.from_host == i || l.to_host == i))
                {
                    continue;
                }
                let mut checks = Vec::new();
                if let Some(ca) = &h.tls.ca {
                    checks.push(format!("CA {ca}, name {}", h.tls.name_or(&h.name)));
                }
                for p in &h.tls.pins {
                    checks.push(format!("pin {}", format_pin(p)));
                }
                let cell = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
                t.row(vec![
                    h.name.clone(),
                    cell(&h.tls.cert),
                    cell(&h.tls.key),
                    checks.join("; "),
                ]);
            }
            t.write(f)?;
        }
        if uses(Tls::Auto) {
            writeln!(
                f,
                "\ntls=auto: each router derives a key and self-signed certificate from the job secret; the two ends of a link pin each other's certificate"
            )?;
        }
        Ok(())
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, ranks: Range<usize>) -> HostLayout {
        HostLayout {
            name: name.into(),
            ranks: ranks.clone(),
            device: Device::Auto,
            launch: Launch::Local,
            byte_order: ByteOrder::Native,
            tls: HostTls::default(),
            nodes: vec![NodeLayout {
                name: format!("{name}0"),
                address: Address::Host(format!("{name}0")),
                max_procs: None,
                nprocs: ranks.len(),
                ranks,
                routers: vec![],
            }],
        }
    }

    #[test]
    fn rank_lookup() {
        let l = Layout {
            world_size: 7,
            hosts: vec![host("a", 0..3), host("b", 3..7)],
            routers: vec![],
            links: vec![],
            direct: vec![],
        };
        assert_eq!(l.host_of_rank(0), Some(0));
        assert_eq!(l.host_of_rank(2), Some(0));
        assert_eq!(l.host_of_rank(3), Some(1));
        assert_eq!(l.host_of_rank(6), Some(1));
        assert_eq!(l.host_of_rank(7), None);
        assert_eq!(l.locate(4), Some((1, 0)));
        let text = l.to_string();
        assert!(
            text.starts_with("meta computer: 2 meta hosts, 2 nodes, 7 ranks, 0 routers, 0 links")
        );
        assert!(text.lines().all(|line| !line.ends_with(' ')));
    }
}
