//! A spawned process's side of meeting its parents at start-up: where they are (from the
//! environment `Root::spawn` gave it) and the authenticated connections to those reached
//! directly. The spawning side, and the intercommunicator both sides build, are
//! `topology::spawn`'s.

use std::net::{SocketAddr, TcpStream};

/// Where a spawned process finds its parents: `CTX;PARENT,PARENT,...`, each
/// parent an address to connect to or `@W/S`, world rank `W` of the parents'
/// job on meta host `S`, reached through routers.
pub(crate) const PARENT_ENV: &str = "METAMPI_PARENT";
/// For children with parents behind routers: `BASE;S@ADDR,...`, the wire id
/// of the first child and the routers of the root's meta host (towards meta
/// host `S`), which the children join as their meta host's ranks do.
pub(crate) const PARENT_ROUTERS_ENV: &str = "METAMPI_PARENT_ROUTERS";
/// Handshake context of a child's connection to a parent.
pub(crate) const SPAWN_CTX: &str = "metampi spawn";

/// How a child reaches one parent.
enum ParentAt {
    /// Connects to this address.
    Direct(String),
    /// Through routers: the parent's world rank (its wire id) and meta host.
    Routed(u32, u32),
}

/// A spawned process's view of its parents, from its environment.
pub(crate) struct ParentSpec {
    pub ctx: u32,
    parents: Vec<ParentAt>,
    /// With routed parents: the first child's wire id, and the routers to
    /// join (towards which meta host, and where).
    routed: Option<(u32, Vec<(u32, String)>)>,
}

impl ParentSpec {
    /// Number of parents.
    pub(crate) fn len(&self) -> usize {
        self.parents.len()
    }

    /// Parent `i`'s wire id and meta host where it is reached through routers.
    pub(crate) fn routed(&self, i: usize) -> Option<(u32, u32)> {
        match self.parents.get(i)? {
            ParentAt::Routed(w, s) => Some((*w, *s)),
            ParentAt::Direct(_) => None,
        }
    }

    /// The wire id of child `rank` where some parent is behind a router.
    pub(crate) fn wire_id(&self, rank: u32) -> Option<u32> {
        self.routed.as_ref().map(|(base, _)| base + rank)
    }

    /// The routers to join: meta host each leads to, and its address.
    pub(crate) fn routers(&self) -> &[(u32, String)] {
        self.routed.as_ref().map_or(&[], |(_, r)| r)
    }
}

/// The parents this process was spawned by, if it was.
pub(crate) fn parent_spec() -> std::io::Result<Option<ParentSpec>> {
    let Some(text) = crate::knobs::text(PARENT_ENV) else {
        return Ok(None);
    };
    let bad = || std::io::Error::other(format!("{PARENT_ENV} `{text}` is malformed"));
    let (ctx, addrs) = text.split_once(';').ok_or_else(bad)?;
    let ctx = ctx.parse().map_err(|_| bad())?;
    let parents = addrs
        .split(',')
        .map(|a| match a.strip_prefix('@') {
            Some(ws) => {
                let (w, s) = ws.split_once('/')?;
                Some(ParentAt::Routed(w.parse().ok()?, s.parse().ok()?))
            }
            None => a
                .parse::<SocketAddr>()
                .ok()
                .map(|_| ParentAt::Direct(a.to_string())),
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?;
    let routed = match crate::knobs::text(PARENT_ROUTERS_ENV) {
        Some(text) => {
            let bad =
                || std::io::Error::other(format!("{PARENT_ROUTERS_ENV} `{text}` is malformed"));
            let (base, list) = text.split_once(';').ok_or_else(bad)?;
            let routers = list
                .split(',')
                .filter(|e| !e.is_empty())
                .map(|e| {
                    let (to, addr) = e.split_once('@')?;
                    Some((to.parse().ok()?, addr.to_string()))
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(bad)?;
            Some((base.parse().map_err(|_| bad())?, routers))
        }
        None => None,
    };
    if routed.is_none() && parents.iter().any(|p| matches!(p, ParentAt::Routed(..))) {
        return Err(std::io::Error::other(format!(
            "{PARENT_ENV} names parents behind routers but {PARENT_ROUTERS_ENV} is not set"
        )));
    }
    Ok(Some(ParentSpec {
        ctx,
        parents,
        routed,
    }))
}

/// Connects to every parent reached directly, in their group's order,
/// naming this process by its world rank.
pub(crate) fn connect_parents(spec: &ParentSpec, rank: u32) -> std::io::Result<Vec<TcpStream>> {
    let key = crate::auth::secret_from_env()?;
    spec.parents
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            ParentAt::Direct(a) => Some((i, a)),
            ParentAt::Routed(..) => None,
        })
        .map(|(i, addr)| {
            let mut s = TcpStream::connect(addr.as_str()).map_err(|e| {
                std::io::Error::other(format!("connecting to parent {i} at {addr}: {e}"))
            })?;
            crate::auth::connect(&mut s, &key, SPAWN_CTX, &rank.to_le_bytes()).map_err(|e| {
                std::io::Error::other(format!("authenticating with parent {i} at {addr}: {e}"))
            })?;
            Ok(s)
        })
        .collect()
}
