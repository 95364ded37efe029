//! The routed backend: a rank of another site is reached through the router
//! connection of that site (a [`Link::Via`] naming the channel; the channel
//! itself is a byte stream). Frames keep the sender's and receiver's ranks, or
//! wire ids where processes of another world are addressed ([`WireIds`]);
//! payloads to other meta hosts are in their declared byte order; long
//! messages go in fragments of [`ROUTER_FRAGMENT`], as routers hold whole
//! frames. A lost router connection ends the job ([`Links::fail_channel`]).

use std::collections::{HashMap, VecDeque};

use super::{Link, Links};
use crate::envelope::{ENV_LEN, F_BIG_ENDIAN};

/// Largest `Data` fragment sent through a router.
pub(super) const ROUTER_FRAGMENT: usize = 256 << 10;

/// Processes of another world reached through routers ([`Links::add_routed`]):
/// each one's id on the wire by its engine rank here, and back (routers know
/// processes by their wire id); and this process's own wire id, where it is not
/// its world rank (a child that meets parents through routers).
#[derive(Default)]
pub(super) struct WireIds {
    pub(super) dst: HashMap<u32, u32>,
    pub(super) src: HashMap<u32, u32>,
    pub(super) me: Option<u32>,
}

impl Links {
    /// Adds a process of another world reached through router channel
    /// `chan` by its wire id `wire`; returns the engine rank it gets here.
    /// Frames to it are addressed to `wire`, and frames from it (naming
    /// `wire` as their sender) are read as coming from that rank.
    pub(crate) fn add_routed(&mut self, wire: u32, chan: usize) -> u32 {
        let r = self.peers.len() as u32;
        self.peers.push(Link::Via(chan));
        self.outq.push(VecDeque::new());
        self.tcp.stale = true;
        let ids = self.wire.get_or_insert_default();
        ids.dst.insert(r, wire);
        ids.src.insert(wire, r);
        r
    }

    /// Names this process `wire` in what it sends through routers.
    pub(crate) fn set_wire_self(&mut self, wire: u32) {
        self.wire.get_or_insert_default().me = Some(wire);
    }

    /// Rewrites an envelope bound for channel `d` into wire ids where `d` is a
    /// router connection: the destination's, and this process's own.
    #[inline]
    pub(super) fn to_wire(&self, d: usize, env: &mut [u8; ENV_LEN]) {
        let Some(ids) = &self.wire else {
            return;
        };
        if !self.is_router(d) {
            return;
        }
        let dst = u32::from_le_bytes([env[4], env[5], env[6], env[7]]);
        if let Some(w) = ids.dst.get(&dst) {
            env[4..8].copy_from_slice(&w.to_le_bytes());
        }
        if let Some(me) = ids.me {
            env[8..12].copy_from_slice(&me.to_le_bytes());
        }
    }

    /// The router channel that carries frames to world rank `w`, if one does.
    pub(crate) fn channel_to(&self, w: u32) -> Option<usize> {
        match self.peers.get(w as usize) {
            Some(Link::Via(c)) => Some(*c),
            _ => None,
        }
    }

    /// Adds a channel (a router connection) after the world ranks; returns
    /// its index. Router connections all come before any process added by
    /// [`Links::add_process`].
    pub(crate) fn add_channel(&mut self, link: Link) -> usize {
        debug_assert_eq!(self.peers.len(), self.world + self.routers);
        self.peers.push(link);
        self.outq.push(VecDeque::new());
        self.routers += 1;
        self.tcp.stale = true;
        self.peers.len() - 1
    }

    /// Sends frames for world rank `dst` through channel `chan`.
    pub(crate) fn route_via(&mut self, dst: u32, chan: usize) {
        self.peers[dst as usize] = Link::Via(chan);
        self.tcp.stale = true;
    }

    /// The byte-order flag of a message on channel `d`: traffic to another
    /// meta host (through a router, or straight to a rank of a directly
    /// paired one) is in this meta host's declared order (typed
    /// point-to-point data and collective schedules convert before sending;
    /// receivers of untyped bytes ignore the flag), everything else in this
    /// machine's.
    pub(super) fn order_flag(&self, d: usize) -> u8 {
        let native = cfg!(target_endian = "big");
        // Where the declared order is this machine's (nearly always), the
        // channel does not matter: one comparison on the send path.
        let big = if self.routed_big_endian == native {
            native
        } else if self.is_router(d)
            || (d < self.world
                && self
                    .sites
                    .get(d)
                    .is_some_and(|s| Some(s) != self.sites.get(self.rank as usize)))
        {
            self.routed_big_endian
        } else {
            native
        };
        if big {
            F_BIG_ENDIAN
        } else {
            0
        }
    }

    /// The meta hosts whose ranks channel `c` carries, as a list.
    pub(super) fn sites_via(&self, c: usize) -> String {
        let mut v: Vec<u32> = (0..self.world())
            .filter(|&p| self.chan(p as u32) == c)
            .filter_map(|p| self.sites.get(p).copied())
            .collect();
        v.dedup();
        v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    }
}
