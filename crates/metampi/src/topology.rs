//! Communicators, groups and process handles (MPI-1.2 §5), in rsmpi's shape.
//!
//! A communicator is a context id plus an ordered group of world ranks. Point
//! to point traffic uses the even context `ctx`, collective traffic `ctx + 1`,
//! so no receive, however wildcarded, can match a collective's messages.
//! Communicators are `Send + Sync`: the same one may be used from many threads.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::collective;
use crate::environment::shared;
use crate::error::{Error, ErrorClass};
pub use crate::Rank;
use crate::{Count, Tag};

use crate::engine::FINALIZE_CONTEXT;

#[deny(unsafe_code)]
mod cartesian;
#[deny(unsafe_code)]
mod inter;
#[deny(unsafe_code)]
mod ports;
#[deny(unsafe_code)]
pub(crate) mod spawn;
pub use cartesian::{dims_create, CartesianCommunicator, CartesianLayout};
pub use inter::{InterCommunicator, MergeOrder};
pub(crate) use ports::{accept as accept_on_port, connect as connect_to_port};
pub use ports::{
    close_port, join as join_socket, lookup_name, open_port, publish_name, unpublish_name,
    MAX_PORT_NAME,
};

/// A key for ordering ranks in `split_by_color_with_key`.
pub type Key = i32;

/// Communicator rank of each engine rank in `ranks` (-1 elsewhere): world
/// ranks, and processes joined later (numbered after the world).
pub(crate) fn inverse_of(ranks: &[u32]) -> Vec<Rank> {
    let n = ranks
        .iter()
        .map(|&w| w as usize + 1)
        .max()
        .unwrap_or(0)
        .max(shared().info.size as usize);
    let mut inverse = vec![-1; n];
    for (i, &w) in ranks.iter().enumerate() {
        inverse[w as usize] = i as Rank;
    }
    inverse
}

/// The members of `ranks` whose (colour, key) in `pairs` has `color`,
/// ordered by (key, position): a split's new group.
pub(crate) fn of_color(pairs: &[(i32, i32)], color: Color, ranks: &[u32]) -> Vec<u32> {
    let mut m: Vec<(i32, usize)> = pairs
        .iter()
        .enumerate()
        .filter(|(_, &(c, _))| c == color.0)
        .map(|(i, &(_, k))| (k, i))
        .collect();
    m.sort_unstable();
    m.iter().map(|&(_, i)| ranks[i]).collect()
}

/// Shared state of one communicator.
pub(crate) struct CommInner {
    pub ctx: u32,
    /// World rank of each member, in communicator rank order.
    pub ranks: Arc<Vec<u32>>,
    /// This process's rank in the communicator.
    pub rank: Rank,
    /// Communicator rank of each world rank (-1 = not a member).
    inverse: Vec<Rank>,
    /// Sequence number of the next collective, identical on every member.
    pub coll_seq: AtomicU32,
    /// Shared-memory region for blocking barriers and small all-reduces.
    pub shm: Mutex<crate::collective::shm::State>,
    name: Mutex<String>,
    /// The grid of a Cartesian communicator (and of its duplicates).
    pub(crate) grid: OnceLock<Arc<cartesian::Grid>>,
    /// Where the members are (`collective::hier::Spread`), once asked.
    pub(crate) spread: OnceLock<crate::collective::hier::Spread>,
    /// Cached attributes (`attribute::AnyCommunicator`).
    pub(crate) attrs: Mutex<crate::attribute::Attributes>,
    /// The remote group of an intercommunicator: ranks given to
    /// point-to-point calls and reported in statuses are its ranks.
    pub(crate) remote: Option<Box<inter::Remote>>,
    /// Some members are processes of another world (spawned ones, or
    /// parents): every member then sees the others as spread one per
    /// machine, since no member knows where all the others are, and the
    /// collectives' choices must be the same on all ([`CommInner::node_of`]).
    pub(crate) mixed: bool,
}

impl CommInner {
    pub(crate) fn new(ctx: u32, ranks: Vec<u32>, name: String) -> Option<Arc<CommInner>> {
        let sh = shared();
        let me = sh.info.rank;
        let inverse = inverse_of(&ranks);
        let rank = inverse[me as usize];
        let mixed = ranks.iter().any(|&w| w >= sh.info.size);
        if rank < 0 {
            return None;
        }
        Some(Arc::new(CommInner {
            ctx,
            ranks: Arc::new(ranks),
            rank,
            inverse,
            coll_seq: AtomicU32::new(0),
            shm: Mutex::default(),
            name: Mutex::new(name),
            grid: OnceLock::new(),
            spread: OnceLock::new(),
            attrs: Mutex::default(),
            remote: None,
            mixed,
        }))
    }

    /// The machine name of engine rank `w` as collectives and topology
    /// queries see it: `None` for a process of another world, and for
    /// every member of a mixed communicator (see [`CommInner::mixed`]).
    pub(crate) fn node_of(&self, w: u32) -> Option<&'static str> {
        if self.mixed {
            return None;
        }
        shared().info.nodes.get(w as usize).map(String::as_str)
    }

    /// The communicator's name.
    pub(crate) fn name(&self) -> String {
        self.name.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Number of members (of the local group, for an intercommunicator).
    pub(crate) fn size(&self) -> Rank {
        self.ranks.len() as Rank
    }

    /// Whether this is an intercommunicator.
    pub(crate) fn is_inter(&self) -> bool {
        self.remote.is_some()
    }

    /// The group that point-to-point ranks name: the members, or the
    /// remote group of an intercommunicator.
    pub(crate) fn targets(&self) -> &Arc<Vec<u32>> {
        self.remote.as_ref().map_or(&self.ranks, |r| &r.ranks)
    }

    /// World rank of the process that point-to-point rank `r` names.
    #[inline]
    pub(crate) fn world_of(&self, r: Rank) -> Result<u32, Error> {
        usize::try_from(r)
            .ok()
            .and_then(|i| self.targets().get(i).copied())
            .ok_or_else(|| self.rank_outside(r))
    }

    /// The error for rank `r` outside the targets (out of line: every
    /// point-to-point call looks its rank up).
    #[cold]
    #[inline(never)]
    fn rank_outside(&self, r: Rank) -> Error {
        let what = if self.is_inter() {
            "the remote group of an intercommunicator"
        } else {
            "a communicator"
        };
        Error::new(
            ErrorClass::Rank,
            format!(
                "rank {r} is outside {what} of size {}",
                self.targets().len()
            ),
        )
    }

    /// Point-to-point rank of world rank `world` (-1: none).
    pub(crate) fn comm_of(&self, world: u32) -> Rank {
        let inverse = self.remote.as_ref().map_or(&self.inverse, |r| &r.inverse);
        inverse.get(world as usize).copied().unwrap_or(-1)
    }

    /// Tag base for the next collective: unique per call on this communicator.
    pub(crate) fn next_coll_tag(&self) -> Tag {
        ((self.coll_seq.fetch_add(1, Ordering::Relaxed) & 0x7f_ffff) << 8) as Tag
    }
}

/// The handle every communicator-like value wraps.
#[derive(Clone)]
pub struct CommunicatorHandle(pub(crate) Arc<CommInner>);

pub(crate) mod sealed {
    /// Gives the library access to the communicator behind a value.
    pub trait AsHandle {
        /// The underlying handle.
        fn as_handle(&self) -> &super::CommunicatorHandle;
    }
}

/// Things that dereference to a communicator.
pub trait AsCommunicator {
    /// The communicator type.
    type Out: Communicator;
    /// The communicator.
    fn as_communicator(&self) -> &Self::Out;
}

/// How two communicators relate (`MPI_Comm_compare`).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum CommunicatorRelation {
    /// The same communicator.
    Identical,
    /// Same members in the same order, different context.
    Congruent,
    /// Same members, different order.
    Similar,
    /// Otherwise.
    Unequal,
}

/// How two groups relate (`MPI_Group_compare`).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum GroupRelation {
    /// Same members, same order.
    Identical,
    /// Same members, different order.
    Similar,
    /// Otherwise.
    Unequal,
}

/// The colour argument of `split_by_color`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Color(i32);

impl Color {
    /// No colour: the process gets no new communicator.
    pub fn undefined() -> Color {
        Color(-1)
    }

    /// A colour; must not be negative.
    ///
    /// # Panics
    /// If `value` is negative.
    pub fn with_value(value: i32) -> Color {
        assert!(value >= 0, "color must be non-negative, got {value}");
        Color(value)
    }
}

/// A communicator (MPI-1.2 §5.4). Object safe: `&dyn Communicator` works.
pub trait Communicator: sealed::AsHandle {
    /// Number of processes a message can be addressed to (the remote
    /// group's size for an intercommunicator).
    fn target_size(&self) -> Rank {
        self.as_handle().0.targets().len() as Rank
    }

    /// Number of processes in the communicator.
    fn size(&self) -> Rank {
        self.as_handle().0.size()
    }

    /// This process's rank.
    fn rank(&self) -> Rank {
        self.as_handle().0.rank
    }

    /// The process with rank `r`.
    ///
    /// # Panics
    /// If `r` is out of range (use [`Communicator::try_process_at_rank`] to get an error).
    fn process_at_rank(&self, r: Rank) -> Process<'_> {
        match self.try_process_at_rank(r) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    /// The process with rank `r`, or `ErrorClass::Rank`.
    fn try_process_at_rank(&self, r: Rank) -> Result<Process<'_>, Error> {
        self.as_handle().0.world_of(r)?;
        Ok(Process {
            comm: AnyProcess(self.as_handle()),
            rank: r,
        })
    }

    /// Any process (a wildcard source).
    fn any_process(&self) -> AnyProcess<'_> {
        AnyProcess(self.as_handle())
    }

    /// This process.
    fn this_process(&self) -> Process<'_> {
        Process {
            comm: AnyProcess(self.as_handle()),
            rank: self.rank(),
        }
    }

    /// How this communicator relates to `other`.
    fn compare(&self, other: &dyn Communicator) -> CommunicatorRelation {
        let a = &self.as_handle().0;
        let b = &other.as_handle().0;
        if a.ctx == b.ctx && a.ranks == b.ranks {
            CommunicatorRelation::Identical
        } else if a.ranks == b.ranks {
            CommunicatorRelation::Congruent
        } else {
            let mut x = a.ranks.to_vec();
            let mut y = b.ranks.to_vec();
            x.sort_unstable();
            y.sort_unstable();
            if x == y {
                CommunicatorRelation::Similar
            } else {
                CommunicatorRelation::Unequal
            }
        }
    }

    /// A new communicator with the same group and a new context (collective).
    fn duplicate(&self) -> SimpleCommunicator {
        let h = &self.as_handle().0;
        let ctx = collective::agree_context(h);
        let name = format!("{} (dup)", self.get_name());
        let inner = CommInner::new(ctx, h.ranks.to_vec(), name).expect("a member of the parent");
        // A duplicate keeps the topology and the attributes that ask to be copied
        // (MPI_Comm_dup).
        if let Some(g) = h.grid.get() {
            let _ = inner.grid.set(Arc::clone(g));
        }
        let attrs = h
            .attrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .for_duplicate();
        *inner.attrs.lock().unwrap_or_else(|p| p.into_inner()) = attrs;
        SimpleCommunicator(CommunicatorHandle(inner))
    }

    /// A communicator whose ranks are the cells of a `dims` grid, periodic where `periods`
    /// says (`MPI_Cart_create`; collective). With `reorder`, processes are placed so that
    /// few grid edges cross sites and machines (see [`CartesianCommunicator`]); without,
    /// rank `r` takes cell `r`. `None` for a process without a cell.
    ///
    /// # Panics
    /// On invalid arguments; see [`Communicator::try_create_cartesian_communicator`].
    fn create_cartesian_communicator(
        &self,
        dims: &[Count],
        periods: &[bool],
        reorder: bool,
    ) -> Option<CartesianCommunicator> {
        self.try_create_cartesian_communicator(dims, periods, reorder)
            .unwrap_or_else(|e| panic!("create_cartesian_communicator: {e}"))
    }

    /// As [`Communicator::create_cartesian_communicator`].
    ///
    /// # Errors
    /// `Arg` when `dims` and `periods` differ in length or the grid has more cells than the
    /// communicator has processes, `Dims` for an extent under 1. The arguments are checked
    /// before anything is sent, so every member, given the same ones, returns the same error.
    fn try_create_cartesian_communicator(
        &self,
        dims: &[Count],
        periods: &[bool],
        reorder: bool,
    ) -> Result<Option<CartesianCommunicator>, Error> {
        let h = &self.as_handle().0;
        let grid = cartesian::Grid::new(dims, periods, h.size())?;
        let members = cartesian::members_of_cells(h, &grid, reorder);
        let ctx = collective::agree_context(h);
        let name = format!("cartesian {dims:?} of {}", self.get_name());
        Ok(CartesianCommunicator::make(h, ctx, grid, &members, name))
    }

    /// The rank this process would have in
    /// [`Communicator::create_cartesian_communicator`] with `reorder` (`MPI_Cart_map`;
    /// local), or `None` if it would have no cell.
    ///
    /// # Panics
    /// On invalid arguments; see [`Communicator::try_cartesian_map`].
    fn cartesian_map(&self, dims: &[Count], periods: &[bool]) -> Option<Rank> {
        self.try_cartesian_map(dims, periods)
            .unwrap_or_else(|e| panic!("cartesian_map: {e}"))
    }

    /// As [`Communicator::cartesian_map`].
    ///
    /// # Errors
    /// As [`Communicator::try_create_cartesian_communicator`].
    fn try_cartesian_map(&self, dims: &[Count], periods: &[bool]) -> Result<Option<Rank>, Error> {
        let h = &self.as_handle().0;
        let grid = cartesian::Grid::new(dims, periods, h.size())?;
        let members = cartesian::members_of_cells(h, &grid, true);
        Ok(members
            .iter()
            .position(|&m| m == h.rank as usize)
            .map(|cell| cell as Rank))
    }

    /// Splits by colour, ordering by old rank (collective).
    fn split_by_color(&self, color: Color) -> Option<SimpleCommunicator> {
        self.split_by_color_with_key(color, 0)
    }

    /// Splits by colour, ordering by `(key, old rank)` (collective, `MPI_Comm_split`).
    fn split_by_color_with_key(&self, color: Color, key: Key) -> Option<SimpleCommunicator> {
        let h = &self.as_handle().0;
        let all = collective::all_gather_i32_pairs(h, color.0, key);
        let ctx = collective::agree_context(h);
        if color.0 < 0 {
            return None;
        }
        let ranks = of_color(&all, color, &h.ranks);
        CommInner::new(ctx, ranks, format!("split of {}", self.get_name()))
            .map(|c| SimpleCommunicator(CommunicatorHandle(c)))
    }

    /// The processes that share this machine's memory (`MPI_COMM_TYPE_SHARED`).
    fn split_shared(&self, key: i32) -> SimpleCommunicator {
        let h = &self.as_handle().0;
        let sh = shared();
        // A process of another world shares no memory with this one here.
        let my_node = h.node_of(sh.info.rank);
        let color = h
            .ranks
            .iter()
            .position(|&w| w == sh.info.rank || (my_node.is_some() && h.node_of(w) == my_node))
            .unwrap_or(0) as i32;
        self.split_by_color_with_key(Color(color), key)
            .expect("every process has a node colour")
    }

    /// A communicator of the members of `group` (collective over this communicator).
    fn split_by_subgroup_collective(&self, group: &dyn Group) -> Option<SimpleCommunicator> {
        let h = &self.as_handle().0;
        let ctx = collective::agree_context(h);
        CommInner::new(ctx, group.world_ranks().to_vec(), "subgroup".into())
            .map(|c| SimpleCommunicator(CommunicatorHandle(c)))
    }

    /// A communicator of `group`, called only by its members (`MPI_Comm_create_group`).
    fn split_by_subgroup(&self, group: &dyn Group) -> Option<SimpleCommunicator> {
        self.split_by_subgroup_with_tag(group, 0)
    }

    /// As [`Communicator::split_by_subgroup`], with a tag to tell concurrent calls apart.
    fn split_by_subgroup_with_tag(
        &self,
        group: &dyn Group,
        tag: Tag,
    ) -> Option<SimpleCommunicator> {
        let ranks = group.world_ranks().to_vec();
        if !ranks.contains(&shared().info.rank) {
            return None;
        }
        let h = &self.as_handle().0;
        let ctx = collective::agree_context_among(h, &ranks, tag);
        CommInner::new(ctx, ranks, "subgroup".into())
            .map(|c| SimpleCommunicator(CommunicatorHandle(c)))
    }

    /// The group of this communicator.
    fn group(&self) -> UserGroup {
        UserGroup(Arc::clone(&self.as_handle().0.ranks))
    }

    /// Ends the whole job with `errorcode` (`MPI_Abort`).
    fn abort(&self, errorcode: i32) -> ! {
        crate::environment::abort_job(
            errorcode,
            &format!("MPI_Abort called with error code {errorcode}"),
        )
    }

    /// Whether this is an intercommunicator (`MPI_Comm_test_inter`).
    fn test_inter(&self) -> bool {
        self.as_handle().0.is_inter()
    }

    /// An intercommunicator between this communicator's group and another,
    /// disjoint group (`MPI_Intercomm_create`; collective over both groups).
    /// `local_leader` is the rank here that speaks for this group; at that
    /// process alone, `peer_comm` is a communicator it shares with the
    /// other group's leader and `remote_leader` that leader's rank in it
    /// (other processes pass anything). Both leaders pass the same `tag`.
    ///
    /// # Panics
    /// On invalid arguments; see
    /// [`Communicator::try_create_intercommunicator`].
    fn create_intercommunicator(
        &self,
        local_leader: Rank,
        peer_comm: &dyn Communicator,
        remote_leader: Rank,
        tag: Tag,
    ) -> InterCommunicator {
        match self.try_create_intercommunicator(local_leader, peer_comm, remote_leader, tag) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// As [`Communicator::create_intercommunicator`], with errors:
    /// `ErrorClass::Rank` for a leader outside its communicator,
    /// `ErrorClass::Comm` where this is an intercommunicator or the two
    /// groups share a process (reported by every member of both groups).
    fn try_create_intercommunicator(
        &self,
        local_leader: Rank,
        peer_comm: &dyn Communicator,
        remote_leader: Rank,
        tag: Tag,
    ) -> Result<InterCommunicator, Error> {
        inter::create(
            &self.as_handle().0,
            local_leader,
            &peer_comm.as_handle().0,
            remote_leader,
            tag,
        )
    }

    /// The intercommunicator to the processes that spawned this one
    /// (`MPI_Comm_get_parent`); `None` in a process that was not spawned
    /// (see [`Root::spawn`](crate::collective::Root::spawn)). Its local
    /// group is this process's world, its remote group the spawning
    /// communicator's members in their order.
    fn parent(&self) -> Option<InterCommunicator> {
        spawn::parent()
    }

    /// Sets the communicator's name.
    fn set_name(&self, name: &str) {
        *self
            .as_handle()
            .0
            .name
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = name.to_string();
    }

    /// The communicator's name (`MPI_COMM_WORLD` for the world).
    fn get_name(&self) -> String {
        self.as_handle()
            .0
            .name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Bytes `count` elements of `datatype` take when packed (`MPI_Pack_size`).
    fn pack_size<Dt: crate::datatype::Datatype>(
        &self,
        incount: crate::Count,
        datatype: &Dt,
    ) -> crate::Count
    where
        Self: Sized,
    {
        (incount.max(0) as usize
            * crate::datatype::size_of_type(crate::datatype::UncommittedDatatype::type_id(
                datatype,
            ))) as crate::Count
    }

    /// Packs a buffer into its signature bytes (`MPI_Pack`).
    fn pack<Buf: crate::datatype::Buffer + ?Sized>(&self, inbuf: &Buf) -> Vec<u8>
    where
        Self: Sized,
    {
        crate::datatype::pack(inbuf).bytes().to_vec()
    }

    /// Packs into `outbuf` at `position`; returns the new position.
    ///
    /// # Panics
    /// If `outbuf` is too small.
    fn pack_into<Buf: crate::datatype::Buffer + ?Sized>(
        &self,
        inbuf: &Buf,
        outbuf: &mut [u8],
        position: crate::Count,
    ) -> crate::Count
    where
        Self: Sized,
    {
        let p = crate::datatype::pack(inbuf);
        let b = p.bytes();
        let start = position.max(0) as usize;
        outbuf[start..start + b.len()].copy_from_slice(b);
        (start + b.len()) as crate::Count
    }

    /// Unpacks bytes at `position` into `outbuf`; returns the new position.
    ///
    /// # Safety
    /// The bytes must hold valid values of `outbuf`'s element type.
    unsafe fn unpack_into<Buf: crate::datatype::BufferMut + ?Sized>(
        &self,
        inbuf: &[u8],
        outbuf: &mut Buf,
        position: crate::Count,
    ) -> crate::Count
    where
        Self: Sized,
    {
        let mut layout = crate::datatype::RecvLayout::of(outbuf);
        let start = position.max(0) as usize;
        let n = layout.capacity().min(inbuf.len().saturating_sub(start));
        // The caller vouches that the bytes are valid values (this function's contract).
        layout.unpack(&inbuf[start..start + n]);
        (start + n) as crate::Count
    }

    /// Index of the meta host (site) of a rank of this communicator. On a job
    /// launched without a meta-computer description every machine is one site.
    fn meta_host_of(&self, r: Rank) -> Result<usize, Error> {
        let w = self.as_handle().0.world_of(r)?;
        Ok(crate::topology::site_of_world(w))
    }

    /// Number of meta hosts (sites) with members in this communicator.
    fn num_meta_hosts(&self) -> usize {
        let mut s: Vec<usize> = self
            .as_handle()
            .0
            .ranks
            .iter()
            .map(|&w| site_of_world(w))
            .collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    }

    /// The members on this process's meta host (MetaMPICH's `MPI_COMM_LOCAL`), collective.
    fn split_meta_host(&self) -> SimpleCommunicator {
        let me = shared().info.rank;
        self.split_by_color(Color(site_of_world(me) as i32))
            .expect("every process has a site colour")
    }

    /// Number of distinct machines (shared-memory nodes) in this communicator.
    /// Processes of another world (spawned, parents) count one machine each.
    fn num_nodes(&self) -> usize {
        let h = &self.as_handle().0;
        let mut names: Vec<&str> = h.ranks.iter().filter_map(|&w| h.node_of(w)).collect();
        let unknown = h.ranks.len() - names.len();
        names.sort_unstable();
        names.dedup();
        names.len() + unknown
    }
}

/// The meta host of a world rank.
pub(crate) fn site_of_world(w: u32) -> usize {
    shared().info.sites.get(w as usize).copied().unwrap_or(0) as usize
}

/// A communicator value of its own (world, duplicates, splits).
pub struct SimpleCommunicator(pub(crate) CommunicatorHandle);

/// The kind of process topology a communicator carries (`MPI_Topo_test`).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Topology {
    /// A Cartesian grid.
    Cartesian,
    /// None.
    Undefined,
}

/// A communicator as the type of its topology.
pub enum IntoTopology {
    /// A Cartesian grid.
    Cartesian(CartesianCommunicator),
    /// None.
    Undefined(SimpleCommunicator),
}

impl SimpleCommunicator {
    /// The topology this communicator carries (a duplicate of a Cartesian communicator
    /// carries its grid).
    pub fn topology(&self) -> Topology {
        match self.0 .0.grid.get() {
            Some(_) => Topology::Cartesian,
            None => Topology::Undefined,
        }
    }

    /// This communicator as the type of its topology.
    pub fn into_topology(self) -> IntoTopology {
        match self.0 .0.grid.get().cloned() {
            Some(g) => IntoTopology::Cartesian(CartesianCommunicator(self, g)),
            None => IntoTopology::Undefined(self),
        }
    }

    /// The world communicator.
    pub fn world() -> SimpleCommunicator {
        static WORLD: OnceLock<Arc<CommInner>> = OnceLock::new();
        let inner = WORLD.get_or_init(|| {
            let n = shared().info.size;
            CommInner::new(0, (0..n).collect(), "MPI_COMM_WORLD".into())
                .expect("every process is in the world")
        });
        SimpleCommunicator(CommunicatorHandle(Arc::clone(inner)))
    }

    /// The world on a context of its own, for the library's finalization barrier: no
    /// operation of the program can match its messages (a rank that finalizes while the
    /// others sit in a barrier of their own must not complete theirs).
    pub(crate) fn finalizer() -> SimpleCommunicator {
        static FINAL: OnceLock<Arc<CommInner>> = OnceLock::new();
        let inner = FINAL.get_or_init(|| {
            let n = shared().info.size;
            CommInner::new(FINALIZE_CONTEXT, (0..n).collect(), "finalization".into())
                .expect("every process is in the world")
        });
        SimpleCommunicator(CommunicatorHandle(Arc::clone(inner)))
    }

    /// A communicator of this process alone (`MPI_COMM_SELF`).
    pub fn self_comm() -> SimpleCommunicator {
        static SELF: OnceLock<Arc<CommInner>> = OnceLock::new();
        let inner = SELF.get_or_init(|| {
            let me = shared().info.rank;
            CommInner::new(2, vec![me], "MPI_COMM_SELF".into())
                .expect("this process is in its own group")
        });
        SimpleCommunicator(CommunicatorHandle(Arc::clone(inner)))
    }
}

impl sealed::AsHandle for SimpleCommunicator {
    fn as_handle(&self) -> &CommunicatorHandle {
        &self.0
    }
}
impl Communicator for SimpleCommunicator {}
impl AsCommunicator for SimpleCommunicator {
    type Out = SimpleCommunicator;
    fn as_communicator(&self) -> &SimpleCommunicator {
        self
    }
}

impl std::fmt::Debug for SimpleCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SimpleCommunicator(size {}, rank {})",
            self.size(),
            self.rank()
        )
    }
}

/// A wildcard source: any process of a communicator.
#[derive(Copy, Clone)]
pub struct AnyProcess<'a>(pub(crate) &'a CommunicatorHandle);

impl sealed::AsHandle for AnyProcess<'_> {
    fn as_handle(&self) -> &CommunicatorHandle {
        self.0
    }
}
impl Communicator for AnyProcess<'_> {}
impl AsCommunicator for AnyProcess<'_> {
    type Out = Self;
    fn as_communicator(&self) -> &Self {
        self
    }
}

/// One process of a communicator.
#[derive(Copy, Clone)]
pub struct Process<'a> {
    comm: AnyProcess<'a>,
    rank: Rank,
}

impl Process<'_> {
    /// The process's rank in its communicator.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Whether this is the calling process.
    pub fn is_self(&self) -> bool {
        self.comm.0 .0.rank == self.rank
    }
}

impl sealed::AsHandle for Process<'_> {
    fn as_handle(&self) -> &CommunicatorHandle {
        self.comm.0
    }
}
impl Communicator for Process<'_> {}
impl<'a> AsCommunicator for Process<'a> {
    type Out = AnyProcess<'a>;
    fn as_communicator(&self) -> &AnyProcess<'a> {
        &self.comm
    }
}

// ---- groups -------------------------------------------------------------------

/// A group of processes (MPI-1.2 §5.3). Object safe for its non-generic methods.
pub trait Group {
    #[doc(hidden)]
    fn world_ranks(&self) -> &[u32];

    /// Members of either group, `self`'s first.
    fn union<G: Group>(&self, other: &G) -> UserGroup
    where
        Self: Sized,
    {
        let mut v = self.world_ranks().to_vec();
        v.extend(
            other
                .world_ranks()
                .iter()
                .filter(|r| !self.world_ranks().contains(r)),
        );
        UserGroup(Arc::new(v))
    }

    /// Members of both, in `self`'s order.
    fn intersection<G: Group>(&self, other: &G) -> UserGroup
    where
        Self: Sized,
    {
        UserGroup(Arc::new(
            self.world_ranks()
                .iter()
                .copied()
                .filter(|r| other.world_ranks().contains(r))
                .collect(),
        ))
    }

    /// Members of `self` not in `other`.
    fn difference<G: Group>(&self, other: &G) -> UserGroup
    where
        Self: Sized,
    {
        UserGroup(Arc::new(
            self.world_ranks()
                .iter()
                .copied()
                .filter(|r| !other.world_ranks().contains(r))
                .collect(),
        ))
    }

    /// The listed ranks, in that order.
    ///
    /// # Panics
    /// On a rank outside the group.
    fn include(&self, ranks: &[Rank]) -> UserGroup {
        let w = self.world_ranks();
        UserGroup(Arc::new(
            ranks
                .iter()
                .map(|&r| {
                    *w.get(r as usize)
                        .unwrap_or_else(|| panic!("rank {r} is not in a group of size {}", w.len()))
                })
                .collect(),
        ))
    }

    /// All but the listed ranks.
    fn exclude(&self, ranks: &[Rank]) -> UserGroup {
        let w = self.world_ranks();
        UserGroup(Arc::new(
            w.iter()
                .enumerate()
                .filter(|(i, _)| !ranks.contains(&(*i as Rank)))
                .map(|(_, &r)| r)
                .collect(),
        ))
    }

    /// Number of members.
    fn size(&self) -> Rank {
        self.world_ranks().len() as Rank
    }

    /// This process's rank in the group, if a member.
    fn rank(&self) -> Option<Rank> {
        let me = shared().info.rank;
        self.world_ranks()
            .iter()
            .position(|&r| r == me)
            .map(|i| i as Rank)
    }

    /// The rank in `other` of this group's `rank`.
    fn translate_rank<G: Group>(&self, rank: Rank, other: &G) -> Option<Rank>
    where
        Self: Sized,
    {
        let w = *self.world_ranks().get(usize::try_from(rank).ok()?)?;
        other
            .world_ranks()
            .iter()
            .position(|&r| r == w)
            .map(|i| i as Rank)
    }

    /// [`Group::translate_rank`] for several ranks.
    fn translate_ranks<G: Group>(&self, ranks: &[Rank], other: &G) -> Vec<Option<Rank>>
    where
        Self: Sized,
    {
        ranks
            .iter()
            .map(|&r| self.translate_rank(r, other))
            .collect()
    }

    /// How this group relates to `other`.
    fn compare<G: Group>(&self, other: &G) -> GroupRelation
    where
        Self: Sized,
    {
        let (a, b) = (self.world_ranks(), other.world_ranks());
        if a == b {
            return GroupRelation::Identical;
        }
        let (mut x, mut y) = (a.to_vec(), b.to_vec());
        x.sort_unstable();
        y.sort_unstable();
        if x == y {
            GroupRelation::Similar
        } else {
            GroupRelation::Unequal
        }
    }
}

/// A group made by the user.
#[derive(Clone, Debug)]
pub struct UserGroup(Arc<Vec<u32>>);

impl Group for UserGroup {
    fn world_ranks(&self) -> &[u32] {
        &self.0
    }
}

/// A predefined group.
#[derive(Copy, Clone, Debug)]
pub struct SystemGroup(());

impl SystemGroup {
    /// The empty group.
    pub fn empty() -> SystemGroup {
        SystemGroup(())
    }
}

impl Group for SystemGroup {
    fn world_ranks(&self) -> &[u32] {
        &[]
    }
}
