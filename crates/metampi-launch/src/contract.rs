//! The launcher-to-rank contract as typed values: what a launcher ([`run`](crate::run),
//! `metampi_launch::meta`, `MPI_Comm_spawn`) tells each rank through its environment, written with
//! [`RankEnv::vars`] and [`SiteEnv::vars`] and read back, by the rank library, with
//! [`Contract::parse`] only. A missing or malformed variable is a [`ContractError`] naming it.
//!
//! The variables themselves are listed in the crate's documentation; a rank started with
//! none of them (no `METAMPI_PMI`) is a world of its own.

use std::net::IpAddr;

/// `host:port` (or `unix:PATH`) of the job's key-value server.
pub const PMI: &str = "METAMPI_PMI";
/// The job id.
pub const JOB: &str = "METAMPI_JOB";
/// The rank in the job.
pub const RANK: &str = "METAMPI_RANK";
/// Ranks in the job.
pub const SIZE: &str = "METAMPI_SIZE";
/// The rank's MIMD application.
pub const APPNUM: &str = "METAMPI_APPNUM";
/// The node the rank is placed on.
pub const NODE: &str = "METAMPI_NODE";
/// The rank's index among those of its node.
pub const LOCAL_RANK: &str = "METAMPI_LOCAL_RANK";
/// Ranks on its node.
pub const LOCAL_SIZE: &str = "METAMPI_LOCAL_SIZE";
/// The address the rank's listeners bind to and are reached at.
pub const TCP_IP: &str = "METAMPI_TCP_IP";
/// Ranks per site, in site order (`2,1,1`).
pub const SITES: &str = "METAMPI_SITES";
/// Router endpoints: `from>to@host:port,...`.
pub const ROUTERS: &str = "METAMPI_ROUTERS";
/// Pairs of sites whose ranks connect directly: `a-b,...`.
pub const DIRECT: &str = "METAMPI_DIRECT";
/// Byte order per site: `native`, `big` or `little`, comma-separated.
pub const SITE_ORDERS: &str = "METAMPI_SITE_ORDERS";

/// A variable of the contract that is missing or says something the rank cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}{}: {problem}", value.as_ref().map(|v| format!("=`{v}`")).unwrap_or_default())]
pub struct ContractError {
    /// The variable.
    pub var: &'static str,
    /// Its value, where it has one.
    pub value: Option<String>,
    /// What is wrong with it.
    pub problem: String,
}

impl ContractError {
    /// `var` is not set, and `problem` says why that matters.
    pub(crate) fn missing(var: &'static str, problem: impl Into<String>) -> ContractError {
        ContractError {
            var,
            value: None,
            problem: problem.into(),
        }
    }

    pub(crate) fn bad(var: &'static str, value: &str, problem: impl Into<String>) -> ContractError {
        ContractError {
            var,
            value: Some(value.to_string()),
            problem: problem.into(),
        }
    }
}

/// Who a rank is: the part every launcher writes for every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnv {
    /// [`PMI`].
    pub pmi: String,
    /// [`JOB`].
    pub job: String,
    /// [`RANK`], below [`RankEnv::size`].
    pub rank: u32,
    /// [`SIZE`].
    pub size: u32,
    /// [`APPNUM`] (0 where unset).
    pub appnum: u32,
    /// [`NODE`] (the host name where unset).
    pub node: Option<String>,
    /// [`LOCAL_RANK`] and [`LOCAL_SIZE`], for programs; the library finds its node's ranks
    /// from [`NODE`].
    pub local: Option<(u32, u32)>,
}

impl RankEnv {
    /// The variables that say this, for a launcher to set.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            (PMI, self.pmi.clone()),
            (JOB, self.job.clone()),
            (RANK, self.rank.to_string()),
            (SIZE, self.size.to_string()),
            (APPNUM, self.appnum.to_string()),
        ];
        if let Some(node) = &self.node {
            v.push((NODE, node.clone()));
        }
        if let Some((r, n)) = self.local {
            v.push((LOCAL_RANK, r.to_string()));
            v.push((LOCAL_SIZE, n.to_string()));
        }
        v
    }

    /// Reads the rank's part through `get` (a variable's value); `None` without [`PMI`].
    ///
    /// # Errors
    /// A missing [`RANK`] or [`SIZE`], a value that is not a number, or a rank not below the
    /// size.
    pub fn parse(get: &impl Fn(&str) -> Option<String>) -> Result<Option<RankEnv>, ContractError> {
        let Some(pmi) = get(PMI) else {
            return Ok(None);
        };
        let rank: u32 = required(get, RANK)?;
        let size: u32 = required(get, SIZE)?;
        if rank >= size {
            return Err(ContractError::bad(
                RANK,
                &rank.to_string(),
                format!("not below {SIZE} {size}"),
            ));
        }
        let local = match (
            optional::<u32>(get, LOCAL_RANK)?,
            optional(get, LOCAL_SIZE)?,
        ) {
            (Some(r), Some(n)) => Some((r, n)),
            _ => None,
        };
        Ok(Some(RankEnv {
            pmi,
            job: get(JOB).unwrap_or_else(|| "0".into()),
            rank,
            size,
            appnum: optional(get, APPNUM)?.unwrap_or(0),
            node: get(NODE),
            local,
        }))
    }
}

/// A site's byte order as a meta job declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SiteOrder {
    /// This machine's.
    #[default]
    Native,
    /// Big-endian.
    Big,
    /// Little-endian.
    Little,
}

impl SiteOrder {
    /// Whether the site's ranks are big-endian, on a machine whose own order is `native_big`.
    pub fn is_big(self, native_big: bool) -> bool {
        match self {
            SiteOrder::Native => native_big,
            SiteOrder::Big => true,
            SiteOrder::Little => false,
        }
    }

    fn word(self) -> &'static str {
        match self {
            SiteOrder::Native => "native",
            SiteOrder::Big => "big",
            SiteOrder::Little => "little",
        }
    }
}

/// One router a site's ranks reach another site through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterEndpoint {
    /// The site whose ranks connect to it.
    pub from: u32,
    /// The site it carries their traffic to.
    pub to: u32,
    /// Where it listens (`host:port`).
    pub addr: String,
}

/// Where the ranks of a meta job are: written once per job by `metampi_launch::meta`, the same for
/// every rank. Empty for a job on one site.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SiteEnv {
    /// Ranks per site, in site order ([`SITES`]); empty: all on site 0.
    pub ranks_per_site: Vec<u32>,
    /// [`ROUTERS`].
    pub routers: Vec<RouterEndpoint>,
    /// [`DIRECT`].
    pub direct: Vec<(u32, u32)>,
    /// [`SITE_ORDERS`]; a site past its end is [`SiteOrder::Native`].
    pub orders: Vec<SiteOrder>,
}

impl SiteEnv {
    /// The variables that say this, for a launcher to set.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let join = |v: Vec<String>| v.join(",");
        vec![
            (
                SITES,
                join(self.ranks_per_site.iter().map(u32::to_string).collect()),
            ),
            (
                ROUTERS,
                join(
                    self.routers
                        .iter()
                        .map(|r| format!("{}>{}@{}", r.from, r.to, r.addr))
                        .collect(),
                ),
            ),
            (
                DIRECT,
                join(
                    self.direct
                        .iter()
                        .map(|(a, b)| format!("{a}-{b}"))
                        .collect(),
                ),
            ),
            (
                SITE_ORDERS,
                join(self.orders.iter().map(|o| o.word().to_string()).collect()),
            ),
        ]
    }

    /// Reads the sites' part through `get`.
    ///
    /// # Errors
    /// An entry of any of its variables that does not have its form.
    pub fn parse(get: &impl Fn(&str) -> Option<String>) -> Result<SiteEnv, ContractError> {
        let mut env = SiteEnv::default();
        // An empty value is what a launcher writes for an empty list.
        let get = |var: &str| get(var).filter(|v| !v.trim().is_empty());
        if let Some(v) = get(SITES) {
            for n in v.split(',') {
                let n = n.trim();
                env.ranks_per_site.push(
                    n.parse()
                        .map_err(|_| ContractError::bad(SITES, &v, format!("bad count `{n}`")))?,
                );
            }
        }
        if let Some(v) = get(ROUTERS) {
            for e in v.split(',').filter(|s| !s.is_empty()) {
                let bad =
                    || ContractError::bad(ROUTERS, &v, format!("`{e}` is not from>to@host:port"));
                let (pair, addr) = e.split_once('@').ok_or_else(bad)?;
                let (from, to) = pair.split_once('>').ok_or_else(bad)?;
                env.routers.push(RouterEndpoint {
                    from: from.parse().map_err(|_| bad())?,
                    to: to.parse().map_err(|_| bad())?,
                    addr: addr.to_string(),
                });
            }
        }
        if let Some(v) = get(DIRECT) {
            for e in v.split(',').filter(|s| !s.is_empty()) {
                let bad = || ContractError::bad(DIRECT, &v, format!("`{e}` is not a-b"));
                let (a, b) = e.split_once('-').ok_or_else(bad)?;
                env.direct
                    .push((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?));
            }
        }
        if let Some(v) = get(SITE_ORDERS) {
            for o in v.split(',') {
                env.orders.push(match o.trim() {
                    "native" | "" => SiteOrder::Native,
                    "big" => SiteOrder::Big,
                    "little" => SiteOrder::Little,
                    o => {
                        return Err(ContractError::bad(
                            SITE_ORDERS,
                            &v,
                            format!("bad order `{o}` (native, big or little)"),
                        ))
                    }
                });
            }
        }
        Ok(env)
    }

    /// The site of each of `size` ranks.
    ///
    /// # Errors
    /// [`SITES`] counts another number of ranks.
    pub fn site_of_ranks(&self, size: u32) -> Result<Vec<u32>, ContractError> {
        if self.ranks_per_site.is_empty() {
            return Ok(vec![0; size as usize]);
        }
        let sites: Vec<u32> = (0u32..)
            .zip(&self.ranks_per_site)
            .flat_map(|(site, &n)| std::iter::repeat_n(site, n as usize))
            .collect();
        if sites.len() != size as usize {
            return Err(ContractError {
                var: SITES,
                value: Some(self.vars()[0].1.clone()),
                problem: format!("counts {} ranks, the job has {size}", sites.len()),
            });
        }
        Ok(sites)
    }

    /// The byte order of `site`.
    pub fn order(&self, site: u32) -> SiteOrder {
        self.orders.get(site as usize).copied().unwrap_or_default()
    }

    /// Whether ranks of sites `a` and `b` connect without a router (the same site, or a
    /// pair in [`DIRECT`]).
    pub fn direct_between(&self, a: u32, b: u32) -> bool {
        a == b || self.direct.contains(&(a, b)) || self.direct.contains(&(b, a))
    }
}

/// Everything a rank reads from its launcher: who it is, where it listens, and where the
/// other sites are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contract {
    /// Who the rank is.
    pub rank: RankEnv,
    /// [`TCP_IP`]: set where the launcher knows the rank's address better than the rank.
    pub tcp_ip: Option<IpAddr>,
    /// The sites, with the site of each rank checked against the size.
    pub sites: SiteEnv,
    /// The site of each rank.
    pub site_of: Vec<u32>,
}

impl Contract {
    /// Reads the whole contract through `get`; `None` where no launcher started the rank.
    ///
    /// # Errors
    /// The first variable missing or malformed, named.
    pub fn parse(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Contract>, ContractError> {
        let Some(rank) = RankEnv::parse(get)? else {
            return Ok(None);
        };
        let tcp_ip = tcp_ip(get)?;
        let sites = SiteEnv::parse(get)?;
        let site_of = sites.site_of_ranks(rank.size)?;
        Ok(Some(Contract {
            rank,
            tcp_ip,
            sites,
            site_of,
        }))
    }

    /// The contract of a rank another process manager started (Hydra, Slurm; see
    /// [`crate::pmi_wire`]): who it is comes from that manager, `pmi` says which protocol
    /// (for messages), and the job is one site. [`NODE`] and [`TCP_IP`] are still read
    /// through `get`, so that a user can name them where the host name misleads.
    ///
    /// # Errors
    /// A malformed [`TCP_IP`].
    pub fn under_process_manager(
        who: (u32, u32, u32),
        pmi: &str,
        job: &str,
        get: &impl Fn(&str) -> Option<String>,
    ) -> Result<Contract, ContractError> {
        let (rank, size, appnum) = who;
        let tcp_ip = tcp_ip(get)?;
        Ok(Contract {
            rank: RankEnv {
                pmi: pmi.to_string(),
                job: job.to_string(),
                rank,
                size,
                appnum,
                node: get(NODE),
                local: None,
            },
            tcp_ip,
            sites: SiteEnv::default(),
            site_of: vec![0; size as usize],
        })
    }

    /// This rank's site.
    pub fn my_site(&self) -> u32 {
        self.site_of[self.rank.rank as usize]
    }
}

fn tcp_ip(get: &impl Fn(&str) -> Option<String>) -> Result<Option<IpAddr>, ContractError> {
    get(TCP_IP)
        .map(|v| {
            v.parse()
                .map_err(|_| ContractError::bad(TCP_IP, &v, "not an IP address"))
        })
        .transpose()
}

pub(crate) fn optional<T: std::str::FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<T>, ContractError> {
    match get(var) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| ContractError::bad(var, &v, "not a whole number")),
    }
}

fn required<T: std::str::FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<T, ContractError> {
    optional(get, var)?.ok_or(ContractError {
        var,
        value: None,
        problem: format!("missing (a launcher that sets {PMI} sets it too)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&'static str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn from_vars(v: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = v.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn what_a_launcher_writes_is_what_a_rank_reads() {
        let rank = RankEnv {
            pmi: "127.0.0.1:4000".into(),
            job: "00000000000000ab".into(),
            rank: 2,
            size: 4,
            appnum: 1,
            node: Some("n1".into()),
            local: Some((0, 2)),
        };
        let sites = SiteEnv {
            ranks_per_site: vec![2, 1, 1],
            routers: vec![RouterEndpoint {
                from: 0,
                to: 1,
                addr: "127.0.0.1:5000".into(),
            }],
            direct: vec![(1, 2)],
            orders: vec![SiteOrder::Native, SiteOrder::Big, SiteOrder::Little],
        };
        let mut vars = rank.vars();
        vars.extend(sites.vars());
        vars.push((TCP_IP, "10.0.0.2".into()));
        let c = Contract::parse(&from_vars(vars)).unwrap().unwrap();
        assert_eq!(c.rank, rank);
        assert_eq!(c.sites, sites);
        assert_eq!(c.site_of, [0, 0, 1, 2]);
        assert_eq!(c.my_site(), 1);
        assert_eq!(c.tcp_ip, Some("10.0.0.2".parse().unwrap()));
        assert!(c.sites.direct_between(2, 1) && !c.sites.direct_between(0, 1));
        assert!(c.sites.order(1).is_big(false) && !c.sites.order(2).is_big(true));
        assert_eq!(c.sites.order(7), SiteOrder::Native);
    }

    #[test]
    fn no_launcher_is_no_contract_and_one_site() {
        assert_eq!(Contract::parse(&env(&[])).unwrap(), None);
        let c = Contract::parse(&env(&[(PMI, "x:1"), (RANK, "0"), (SIZE, "3")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.site_of, c.rank.appnum, c.rank.job),
            (vec![0; 3], 0, "0".into())
        );
        // What a one-site launcher writes for the sites' part reads back as one site.
        let c = Contract::parse(&from_vars(
            [(PMI, "x:1".into()), (RANK, "1".into()), (SIZE, "2".into())]
                .into_iter()
                .chain(SiteEnv::default().vars())
                .collect(),
        ))
        .unwrap()
        .unwrap();
        assert_eq!((c.sites, c.site_of), (SiteEnv::default(), vec![0, 0]));
    }

    #[test]
    fn each_malformed_variable_is_named_with_its_value() {
        let base = [(PMI, "x:1"), (RANK, "1"), (SIZE, "2")];
        let with = |extra: (&'static str, &str)| {
            let mut v: Vec<_> = base
                .iter()
                .copied()
                .filter(|(k, _)| *k != extra.0)
                .collect();
            v.push(extra);
            Contract::parse(&env(&v)).unwrap_err().to_string()
        };
        assert_eq!(with((RANK, "x")), "METAMPI_RANK=`x`: not a whole number");
        assert_eq!(
            with((RANK, "2")),
            "METAMPI_RANK=`2`: not below METAMPI_SIZE 2"
        );
        assert_eq!(
            with((APPNUM, "-1")),
            "METAMPI_APPNUM=`-1`: not a whole number"
        );
        assert_eq!(
            with((TCP_IP, "host")),
            "METAMPI_TCP_IP=`host`: not an IP address"
        );
        assert_eq!(with((SITES, "1,x")), "METAMPI_SITES=`1,x`: bad count `x`");
        assert_eq!(
            with((SITES, "1,2")),
            "METAMPI_SITES=`1,2`: counts 3 ranks, the job has 2"
        );
        assert_eq!(
            with((ROUTERS, "0>1@h:1,0-1@h:2")),
            "METAMPI_ROUTERS=`0>1@h:1,0-1@h:2`: `0-1@h:2` is not from>to@host:port"
        );
        assert_eq!(
            with((DIRECT, "0:1")),
            "METAMPI_DIRECT=`0:1`: `0:1` is not a-b"
        );
        assert_eq!(
            with((SITE_ORDERS, "big,middle")),
            "METAMPI_SITE_ORDERS=`big,middle`: bad order `middle` (native, big or little)"
        );
        let missing = Contract::parse(&env(&[(PMI, "x:1"), (RANK, "0")])).unwrap_err();
        assert_eq!(missing.var, SIZE);
        assert!(
            missing.to_string().starts_with("METAMPI_SIZE: missing"),
            "{missing}"
        );
    }
}
