//! Intercommunicators (MPI-1.2 §5.6): a local and a remote group, disjoint,
//! where the ranks that point-to-point calls take and statuses report are
//! ranks of the remote group. Made by
//! [`Communicator::create_intercommunicator`](super::Communicator::create_intercommunicator),
//! duplicated by [`InterCommunicator::duplicate`], turned into one
//! intracommunicator of both groups by [`InterCommunicator::merge`].
//!
//! Both groups agree on one context pair, free on every member of either:
//! each group takes the largest next context of its members, the two leaders
//! swap theirs and keep the larger, and each leader broadcasts the outcome
//! in its own group. Point-to-point traffic uses the even context; the odd
//! one carries the leaders' own messages (negative tags) and, among the
//! members of one group only, the collectives that merging needs, which run
//! on a private intracommunicator of the local group. The intercommunicator
//! itself has no collective operations (MPI-1 defines none): they fail with
//! `MPI_ERR_COMM` on every member, touching no buffer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{sealed, AsCommunicator, CommInner, Communicator, CommunicatorHandle, UserGroup};
use super::{Color, Key, Rank, SimpleCommunicator};
use crate::collective;
use crate::engine::core::RecvBuf;
use crate::environment::shared;
use crate::error::{Error, ErrorClass};
use crate::point_to_point::{recv_bytes, send_bytes, start_recv, Mode};
use crate::Tag;

/// Leaders' messages while making an intercommunicator: below the tags of
/// `agree_context_among` (which stay above -2^20 - 2), the user's tag
/// folded in so concurrent calls with different tags stay apart.
const CREATE_TAG: Tag = -(1 << 22);
/// Leaders' messages while merging and duplicating (on the
/// intercommunicator's own odd context).
const MERGE_TAG: Tag = -(1 << 21) - 7;
const DUP_TAG: Tag = -(1 << 21) - 8;
const SPLIT_TAG: Tag = -(1 << 21) - 9;
/// A header count that says the leader found an error.
const FAILED: u32 = u32::MAX;
/// The classes a failing leader can report, by index.
const CLASSES: [ErrorClass; 6] = [
    ErrorClass::Other,
    ErrorClass::Rank,
    ErrorClass::Comm,
    ErrorClass::Spawn,
    ErrorClass::Arg,
    ErrorClass::Port,
];

/// The remote side of an intercommunicator.
pub(crate) struct Remote {
    /// World rank of each remote member, in remote rank order.
    pub ranks: Arc<Vec<u32>>,
    /// Remote rank of each world rank (-1: not a remote member).
    pub inverse: Vec<Rank>,
    /// The local group on the intercommunicator's context, for collectives
    /// among the local members.
    pub local: Arc<CommInner>,
}

/// Which group's processes come first in [`InterCommunicator::merge`]
/// (the `high` argument of `MPI_Intercomm_merge`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MergeOrder {
    /// This group first.
    Low,
    /// This group last.
    High,
}

/// A communicator between two disjoint groups: `size` and `rank` are those
/// of the local group, and the ranks given to sends and receives, and
/// reported as message sources, are those of the remote group.
pub struct InterCommunicator(pub(crate) CommunicatorHandle);

impl InterCommunicator {
    fn remote(&self) -> &Remote {
        self.0
             .0
            .remote
            .as_deref()
            .expect("an InterCommunicator has a remote group")
    }

    /// The same communicator as a [`SimpleCommunicator`], for a language binding that keeps
    /// one kind of communicator (`metampi-abi`): point-to-point calls on it reach the remote
    /// group and its collectives fail as this one's do; duplicating, splitting and merging
    /// stay with the `InterCommunicator`.
    #[doc(hidden)]
    pub fn __as_simple(&self) -> SimpleCommunicator {
        SimpleCommunicator(self.0.clone())
    }

    /// Number of processes in the remote group (`MPI_Comm_remote_size`).
    pub fn remote_size(&self) -> Rank {
        self.remote().ranks.len() as Rank
    }

    /// The remote group (`MPI_Comm_remote_group`).
    pub fn remote_group(&self) -> UserGroup {
        UserGroup(Arc::clone(&self.remote().ranks))
    }

    /// One intracommunicator of both groups (`MPI_Intercomm_merge`;
    /// collective over both): the group that passes [`MergeOrder::Low`]
    /// comes first; where both pass the same, the group whose leader has
    /// the lower world rank does.
    ///
    /// # Panics
    /// Where the agreement fails; see [`InterCommunicator::try_merge`].
    pub fn merge(&self, order: MergeOrder) -> SimpleCommunicator {
        match self.try_merge(order) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// As [`InterCommunicator::merge`], with the error of a failed message.
    pub fn try_merge(&self, order: MergeOrder) -> Result<SimpleCommunicator, Error> {
        let inner = &self.0 .0;
        let remote = self.remote();
        let low = order == MergeOrder::Low;
        let (ctx, their_low, keys) = self.agree(MERGE_TAG, u32::from(low))?;
        let first = if low != (their_low != 0) {
            low
        } else {
            keys.0 < keys.1
        };
        let (a, b) = if first {
            (&inner.ranks, &remote.ranks)
        } else {
            (&remote.ranks, &inner.ranks)
        };
        let ranks: Vec<u32> = a.iter().chain(b.iter()).copied().collect();
        let name = format!("merge of {}", self.get_name());
        let merged = CommInner::new(ctx, ranks, name).expect("a member of one of the groups");
        Ok(SimpleCommunicator(CommunicatorHandle(merged)))
    }

    /// The same two groups on a new context (`MPI_Comm_dup`; collective
    /// over both groups).
    ///
    /// # Panics
    /// Where the agreement fails; see [`InterCommunicator::try_duplicate`].
    pub fn duplicate(&self) -> InterCommunicator {
        match self.try_duplicate() {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// As [`InterCommunicator::duplicate`], with the error of a failed message.
    pub fn try_duplicate(&self) -> Result<InterCommunicator, Error> {
        let (ctx, _, _) = self.agree(DUP_TAG, 0)?;
        let name = format!("{} (dup)", self.get_name());
        Ok(assemble(
            ctx,
            &self.0 .0,
            self.remote().ranks.to_vec(),
            name,
        ))
    }

    /// Splits both groups by colour (`MPI_Comm_split` on an
    /// intercommunicator, MPI-2; collective over both groups): this group's
    /// members of `color`, ordered by `(key, rank)`, are the local group of
    /// the new intercommunicator and the other group's members of that
    /// colour, in their order, its remote group. `None` for
    /// [`Color::undefined`], and where the other group has no member of
    /// this colour.
    ///
    /// # Panics
    /// Where the agreement fails; see
    /// [`InterCommunicator::try_split_by_color_with_key`].
    pub fn split_by_color(&self, color: Color) -> Option<InterCommunicator> {
        self.split_by_color_with_key(color, 0)
    }

    /// As [`InterCommunicator::split_by_color`], ordering by `(key, rank)`.
    ///
    /// # Panics
    /// As for [`InterCommunicator::split_by_color`].
    pub fn split_by_color_with_key(&self, color: Color, key: Key) -> Option<InterCommunicator> {
        match self.try_split_by_color_with_key(color, key) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// Splits by shared memory (`MPI_Comm_split_type` with `MPI_COMM_TYPE_SHARED`): an
    /// intercommunicator between the members of each group that share this process's
    /// machine, or `None` where the other group has none there. Collective over both
    /// groups. A process of another world (a spawned one) shares memory with no one.
    pub fn try_split_shared(&self, key: Key) -> Result<Option<InterCommunicator>, Error> {
        let inner = &self.0 .0;
        let sh = shared();
        let me = sh.info.rank;
        // The colour is the lowest engine rank on this machine, the same in both groups.
        let color = match inner.node_of(me) {
            Some(node) => sh
                .info
                .nodes
                .iter()
                .position(|n| n == node)
                .unwrap_or(me as usize),
            None => me as usize,
        };
        self.try_split_by_color_with_key(Color(color as i32), key)
    }

    /// As [`InterCommunicator::split_by_color_with_key`], with the error of a
    /// failed message (the same on every member of both groups).
    pub fn try_split_by_color_with_key(
        &self,
        color: Color,
        key: Key,
    ) -> Result<Option<InterCommunicator>, Error> {
        let inner = &self.0 .0;
        let remote = self.remote();
        let local = &remote.local;
        let sh = shared();
        let mine = collective::max_u32(local, sh.next_context.load(Ordering::SeqCst))?;
        let ours = collective::all_gather_i32_pairs(local, color.0, key);
        // The leaders swap their group's largest next context and colours
        // and keys; each tells its group the context and the other's list.
        let mut offer = vec![mine];
        offer.extend(ours.iter().flat_map(|&(c, k)| [c as u32, k as u32]));
        let n = remote.ranks.len();
        let mut body = Vec::new();
        let outcome = (inner.rank == 0).then(|| match swap_with(inner, 0, SPLIT_TAG, &offer) {
            Ok(theirs) if theirs.len() == 1 + 2 * n => {
                body = to_bytes(&theirs[1..]);
                Ok(pack2(mine.max(theirs[0]), 0))
            }
            Ok(_) => Err(Error::new(
                ErrorClass::Other,
                "the remote leader's message is malformed",
            )),
            Err(e) => Err(e),
        });
        let (ctx, _) = tell_group(local, 0, outcome)?;
        body.resize(8 * n, 0);
        collective::bcast_bytes(local, 0, &mut body)?;
        sh.next_context.fetch_max(ctx + 2, Ordering::SeqCst);
        if color.0 < 0 {
            return Ok(None);
        }
        let theirs: Vec<(i32, i32)> = from_bytes(&body)
            .chunks_exact(2)
            .map(|c| (c[0] as i32, c[1] as i32))
            .collect();
        let other = super::of_color(&theirs, color, &remote.ranks);
        if other.is_empty() {
            return Ok(None);
        }
        let name = format!("split of {}", self.get_name());
        let group = CommInner::new(
            ctx,
            super::of_color(&ours, color, &inner.ranks),
            name.clone(),
        )
        .expect("a member of its colour");
        Ok(Some(assemble(ctx, &group, other, name)))
    }

    /// A context free on every member of both groups (collective over
    /// both), the `flag` the other group's leader passed, and the two
    /// leaders' [`leader_key`]s (ours, theirs): each group takes its
    /// members' largest next context, the leaders swap theirs, their flags
    /// and keys, and each broadcasts the outcome in its group.
    fn agree(&self, tag: Tag, flag: u32) -> Result<(u32, u32, (u64, u64)), Error> {
        let inner = &self.0 .0;
        let local = &self.remote().local;
        let sh = shared();
        let mine = collective::max_u32(local, sh.next_context.load(Ordering::SeqCst))?;
        let key = leader_key(inner);
        let offer = [mine, flag, (key >> 32) as u32, key as u32];
        let mut keys = [0u8; 16];
        let outcome = (inner.rank == 0).then(|| match swap_with(inner, 0, tag, &offer) {
            Ok(theirs) if theirs.len() == 4 && theirs[1] != FAILED => {
                keys[..8].copy_from_slice(&key.to_le_bytes());
                keys[8..].copy_from_slice(&pack2(theirs[3], theirs[2]));
                Ok(pack2(mine.max(theirs[0]), theirs[1]))
            }
            Ok(_) => Err(Error::new(
                ErrorClass::Other,
                "the remote leader's message is malformed",
            )),
            Err(e) => Err(e),
        });
        let (ctx, their_flag) = tell_group(local, 0, outcome)?;
        collective::bcast_bytes(local, 0, &mut keys)?;
        let word = |i: usize| u64::from_le_bytes(keys[i..i + 8].try_into().expect("8 bytes"));
        sh.next_context.fetch_max(ctx + 2, Ordering::SeqCst);
        Ok((ctx, their_flag, (word(0), word(8))))
    }
}

impl sealed::AsHandle for InterCommunicator {
    fn as_handle(&self) -> &CommunicatorHandle {
        &self.0
    }
}
impl Communicator for InterCommunicator {}
impl AsCommunicator for InterCommunicator {
    type Out = InterCommunicator;
    fn as_communicator(&self) -> &InterCommunicator {
        self
    }
}

impl std::fmt::Debug for InterCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "InterCommunicator(size {}, rank {}, remote size {})",
            self.size(),
            self.rank(),
            self.remote_size()
        )
    }
}

pub(super) fn pack2(a: u32, b: u32) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&a.to_le_bytes());
    h[4..].copy_from_slice(&b.to_le_bytes());
    h
}

/// What orders two groups that both ask for the same place in a merge, the
/// same from either side: the leader's world rank, after a hash of its
/// world's job id (the groups of a spawn are two worlds, whose ranks both
/// start at 0; within one world the lower leader comes first).
fn leader_key(comm: &CommInner) -> u64 {
    let sh = shared();
    let job = crate::hash::fnv1a(sh.info.job.bytes()) as u32;
    let leader = comm.ranks[0];
    (u64::from(job) << 32) | u64::from(leader)
}

fn unpack2(h: &[u8; 8]) -> (u32, u32) {
    let w = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    (w(0), w(4))
}

fn to_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Sends `mine` to point-to-point rank `other` of `comm` and returns what
/// it sent back (a count, then the values, on the collective context). Each
/// side posts the receive of the values before sending its own, so two
/// long lists cannot wait on each other, whichever side is faster and
/// however the two number each other (two worlds of a spawn do not agree).
fn swap_with(comm: &CommInner, other: Rank, tag: Tag, mine: &[u32]) -> Result<Vec<u32>, Error> {
    let me = shared().info.rank;
    if comm.world_of(other)? == me {
        return Err(Error::new(
            ErrorClass::Comm,
            "the two groups' leaders are the same process",
        ));
    }
    send_bytes(
        comm,
        other,
        tag,
        &(mine.len() as u32).to_le_bytes(),
        Mode::Standard,
        true,
    )?;
    let mut n = [0u8; 4];
    recv_bytes(comm, Some(other), Some(tag), &mut n, true)?;
    let body = vec![0u8; 4 * u32::from_le_bytes(n) as usize];
    let posted = start_recv(
        comm,
        Some(other),
        Some(tag),
        RecvBuf::Owned(body),
        true,
        false,
    )?;
    send_bytes(comm, other, tag, &to_bytes(mine), Mode::Standard, true)?;
    let done = posted.wait();
    done.result?;
    Ok(from_bytes(&done.data.unwrap_or_default()))
}

/// `MPI_Intercomm_create`, see
/// [`Communicator::try_create_intercommunicator`](super::Communicator::try_create_intercommunicator).
pub(crate) fn create(
    local: &Arc<CommInner>,
    local_leader: Rank,
    peer: &Arc<CommInner>,
    remote_leader: Rank,
    tag: Tag,
) -> Result<InterCommunicator, Error> {
    check_rooted(
        local,
        local_leader,
        "the local communicator of a new intercommunicator is itself an intercommunicator",
        "local leader",
    )?;
    let sh = shared();
    let mine = collective::max_u32(local, sh.next_context.load(Ordering::SeqCst))?;
    // The leader learns the other group and the context, or an error that
    // every member must return alike (nobody is left waiting).
    let mut remote = Vec::new();
    let outcome = (local.rank == local_leader).then(|| {
        let t = CREATE_TAG - tag.rem_euclid(1 << 20);
        let mut offer = vec![mine];
        offer.extend_from_slice(&local.ranks);
        let theirs = swap_with(peer, remote_leader, t, &offer)?;
        let (&their_ctx, group) = theirs.split_first().unwrap_or((&0, &[]));
        let world = sh.info.size;
        let mut seen = group.to_vec();
        seen.sort_unstable();
        seen.dedup();
        if let Some(w) = group.iter().find(|w| local.ranks.contains(w)) {
            return Err(overlap(*w));
        }
        if group.is_empty() || seen.len() != group.len() || group.iter().any(|&w| w >= world) {
            return Err(Error::new(
                ErrorClass::Other,
                "the remote leader sent an invalid group",
            ));
        }
        remote = group.to_vec();
        Ok(pack2(mine.max(their_ctx), group.len() as u32))
    });
    let (ctx, n) = tell_group(local, local_leader, outcome)?;
    let mut body = to_bytes(&remote);
    body.resize(4 * n as usize, 0);
    collective::bcast_bytes(local, local_leader, &mut body)?;
    let remote = from_bytes(&body);
    sh.next_context.fetch_max(ctx + 2, Ordering::SeqCst);
    let name = format!("intercommunicator of {}", local.name());
    Ok(assemble(ctx, local, remote, name))
}

/// Refuses an intercommunicator (`MPI_ERR_COMM`, saying `not_intra`) and
/// a `role` rank (leader, root) outside `comm` (`MPI_ERR_RANK`): the checks
/// every member makes alike before a rooted call that builds an
/// intercommunicator.
pub(super) fn check_rooted(
    comm: &CommInner,
    r: Rank,
    not_intra: &str,
    role: &str,
) -> Result<(), Error> {
    if comm.is_inter() {
        return Err(Error::new(ErrorClass::Comm, not_intra));
    }
    if !(0..comm.size()).contains(&r) {
        return Err(Error::new(
            ErrorClass::Rank,
            format!(
                "{role} {r} is outside a communicator of size {}",
                comm.size()
            ),
        ));
    }
    Ok(())
}

/// Broadcasts a leader's outcome in its group (collective over `local`,
/// whose rank `leader` passes `Some`): two words, or the leader's error,
/// class and text, which every member then returns alike.
pub(super) fn tell_group(
    local: &CommInner,
    leader: Rank,
    outcome: Option<Result<[u8; 8], Error>>,
) -> Result<(u32, u32), Error> {
    let mut head = pack2(0, FAILED);
    let mut told = Vec::new();
    let mut leader_error = None;
    match outcome {
        Some(Ok(h)) => head = h,
        Some(Err(e)) => {
            let code = CLASSES.iter().position(|&c| c == e.class()).unwrap_or(0);
            told.push(code as u8);
            told.extend_from_slice(e.message().as_bytes());
            head = pack2(told.len() as u32, FAILED);
            leader_error = Some(e);
        }
        None => {}
    }
    collective::bcast_bytes(local, leader, &mut head)?;
    let (a, b) = unpack2(&head);
    if b != FAILED {
        return Ok((a, b));
    }
    told.resize(a as usize, 0);
    collective::bcast_bytes(local, leader, &mut told)?;
    Err(leader_error.unwrap_or_else(|| {
        let class = CLASSES
            .get(told.first().copied().unwrap_or(0) as usize)
            .copied()
            .unwrap_or(ErrorClass::Other);
        let why = String::from_utf8_lossy(told.get(1..).unwrap_or_default());
        Error::new(
            class,
            format!("the local leader (rank {leader}) failed: {why}"),
        )
    }))
}

/// The root's `secret` (read at the root only) on every member of `local`: `None` where the
/// root had none.
pub(super) fn bcast_secret(
    local: &CommInner,
    root: Rank,
    secret: Option<&crate::auth::Secret>,
) -> Result<Option<crate::auth::Secret>, Error> {
    let mut hex = [0u8; 64];
    if let Some(s) = secret.filter(|_| local.rank == root) {
        hex.copy_from_slice(s.to_hex().as_bytes());
    }
    collective::bcast_bytes(local, root, &mut hex)?;
    Ok(std::str::from_utf8(&hex)
        .ok()
        .and_then(crate::auth::Secret::from_hex))
}

fn overlap(w: u32) -> Error {
    Error::new(
        ErrorClass::Comm,
        format!("world rank {w} is in both groups of an intercommunicator"),
    )
}

/// The intercommunicator on context `ctx` between `local`'s group and `remote`.
pub(super) fn assemble(
    ctx: u32,
    local: &CommInner,
    remote: Vec<u32>,
    name: String,
) -> InterCommunicator {
    let private = CommInner::new(ctx, local.ranks.to_vec(), format!("{name} (local group)"))
        .expect("a member of the local group");
    let mut inner =
        CommInner::new(ctx, local.ranks.to_vec(), name).expect("a member of the local group");
    let inverse = super::inverse_of(&remote);
    Arc::get_mut(&mut inner)
        .expect("made just now, not yet shared")
        .remote = Some(Box::new(Remote {
        ranks: Arc::new(remote),
        inverse,
        local: private,
    }));
    InterCommunicator(CommunicatorHandle(inner))
}
