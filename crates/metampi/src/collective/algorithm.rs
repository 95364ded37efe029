//! Which algorithm runs a collective: chosen by operation, communicator size
//! and message size, or forced per operation with `METAMPI_COLL_ALG` (for
//! example `bcast=binomial,allreduce=rabenseifner`) or [`force_algorithm`].
//!
//! Selection is a pure function of values every rank agrees on (operation,
//! size, bytes per rank, commutativity, the forced table), so all ranks pick
//! the same algorithm. A topology-aware layer (hierarchical collectives across
//! meta hosts) slots in as further [`Algorithm`] variants chosen in
//! `choose` from the communicator's site and machine layout.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{OnceLock, RwLock};

use crate::error::{Error, ErrorClass};
use crate::topology::CommInner;
use crate::Rank;

/// A collective operation, for algorithm selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Collective {
    /// `barrier`
    Barrier,
    /// `broadcast_into`
    Broadcast,
    /// `reduce_into`/`reduce_into_root`
    Reduce,
    /// `all_reduce_into`
    AllReduce,
    /// `gather_into*` (the varcount form: linear, or hierarchical for
    /// blocking calls across meta hosts)
    Gather,
    /// `scatter_into*` (the varcount form: linear, or hierarchical for
    /// blocking calls across meta hosts)
    Scatter,
    /// `all_gather_into` (the varcount form: a ring, or hierarchical across
    /// meta hosts)
    AllGather,
    /// `all_to_all_into` and `all_to_all_varcount_into`
    AllToAll,
    /// `scan_into`
    Scan,
    /// `exclusive_scan_into`
    ExclusiveScan,
    /// `reduce_scatter_block_into`
    ReduceScatterBlock,
}

impl Collective {
    const ALL: [Collective; 11] = [
        Collective::Barrier,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllReduce,
        Collective::Gather,
        Collective::Scatter,
        Collective::AllGather,
        Collective::AllToAll,
        Collective::Scan,
        Collective::ExclusiveScan,
        Collective::ReduceScatterBlock,
    ];

    /// The name used in `METAMPI_COLL_ALG`.
    pub fn name(self) -> &'static str {
        match self {
            Collective::Barrier => "barrier",
            Collective::Broadcast => "bcast",
            Collective::Reduce => "reduce",
            Collective::AllReduce => "allreduce",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::AllGather => "allgather",
            Collective::AllToAll => "alltoall",
            Collective::Scan => "scan",
            Collective::ExclusiveScan => "exscan",
            Collective::ReduceScatterBlock => "reduce_scatter_block",
        }
    }

    fn index(self) -> usize {
        Collective::ALL
            .iter()
            .position(|&c| c == self)
            .expect("ALL lists every variant")
    }

    /// The algorithms that implement this operation.
    pub fn algorithms(self) -> &'static [Algorithm] {
        use Algorithm::*;
        match self {
            Collective::Barrier => &[Dissemination, Hierarchical, SharedMemory],
            Collective::Broadcast => &[
                Binomial,
                ScatterAllGather,
                Linear,
                Hierarchical,
                SharedMemory,
            ],
            Collective::Reduce => &[Binomial, Linear, Hierarchical, SharedMemory],
            Collective::AllReduce => &[
                RecursiveDoubling,
                Rabenseifner,
                ReduceBroadcast,
                Hierarchical,
                SharedMemory,
            ],
            Collective::Gather => &[Binomial, Linear, Hierarchical, SharedMemory],
            Collective::Scatter => &[Binomial, Linear, Hierarchical, SharedMemory],
            Collective::AllGather => &[Bruck, Ring, Hierarchical, SharedMemory],
            Collective::AllToAll => &[Pairwise, Linear, Hierarchical, SharedMemory],
            Collective::Scan | Collective::ExclusiveScan => {
                &[RecursiveDoubling, Linear, Hierarchical]
            }
            Collective::ReduceScatterBlock => &[Pairwise, ReduceThenScatter, Hierarchical],
        }
    }

    /// Parses a name used in `METAMPI_COLL_ALG`.
    pub fn from_name(s: &str) -> Option<Collective> {
        let s = s.trim().to_ascii_lowercase();
        let alias = match s.as_str() {
            "broadcast" => "bcast",
            "all_reduce" => "allreduce",
            "all_gather" => "allgather",
            "all_to_all" => "alltoall",
            "exclusive_scan" => "exscan",
            "reduce_scatter" => "reduce_scatter_block",
            other => other,
        };
        Collective::ALL.into_iter().find(|c| c.name() == alias)
    }
}

/// A collective algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Barrier in ⌈log2 n⌉ rounds of messages at distance 2^k (Hensgen et al.).
    Dissemination,
    /// Binomial tree: ⌈log2 n⌉ steps (broadcast, reduce, gather, scatter).
    Binomial,
    /// Broadcast as binomial scatter plus ring all-gather (van de Geijn):
    /// about 2 × the message per rank instead of log2 n × the message.
    ScatterAllGather,
    /// Recursive doubling: log2 n exchanges of the whole vector (all-reduce,
    /// scans); order-preserving, with a fold for sizes that are not powers of two.
    RecursiveDoubling,
    /// Rabenseifner's all-reduce: reduce-scatter by recursive halving, then
    /// all-gather by recursive doubling. Commutative operations only.
    Rabenseifner,
    /// All-reduce as binomial reduce to rank 0 and binomial broadcast.
    ReduceBroadcast,
    /// Bruck's all-gather: ⌈log2 n⌉ steps for any n, then a local rotation.
    Bruck,
    /// Ring all-gather: n − 1 steps, each rank sends and receives one block.
    Ring,
    /// Pairwise exchange: in step s, send to rank + s and receive from rank − s.
    Pairwise,
    /// Everything posted at once (root to all, all to root, all to all; for
    /// scans the chain rank by rank).
    Linear,
    /// Reduce-scatter as binomial reduce to rank 0 and binomial scatter.
    ReduceThenScatter,
    /// Topology-aware: inside each machine, among the machines of a meta
    /// host, between one leader per meta host, and back down, so that each
    /// inter-site and inter-machine link carries the data as few times as
    /// the operation allows (barrier, broadcast, reduce, all-reduce, gather,
    /// scatter, all-gather, all-to-all). Chosen automatically when a
    /// communicator spans several meta hosts; for barrier, broadcast, reduce
    /// and all-reduce also when it spans several machines of which one holds
    /// two of its ranks or more.
    Hierarchical,
    /// Flags and slots in a shared-memory region of the communicator's own
    /// (barrier; broadcast, reduce, all-reduce, gather and all-gather up to
    /// 8 KiB per member, scatter and all-to-all up to 8 KiB of send buffer): one cache-line transfer per step
    /// instead of a message. Chosen automatically for blocking calls when
    /// every member shares this machine's memory, from the third call on a
    /// communicator; the `immediate_*` forms keep the message algorithms.
    SharedMemory,
}

impl Algorithm {
    const ALL: [Algorithm; 13] = [
        Algorithm::Dissemination,
        Algorithm::Binomial,
        Algorithm::ScatterAllGather,
        Algorithm::RecursiveDoubling,
        Algorithm::Rabenseifner,
        Algorithm::ReduceBroadcast,
        Algorithm::Bruck,
        Algorithm::Ring,
        Algorithm::Pairwise,
        Algorithm::Linear,
        Algorithm::ReduceThenScatter,
        Algorithm::Hierarchical,
        Algorithm::SharedMemory,
    ];

    /// The name used in `METAMPI_COLL_ALG`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Dissemination => "dissemination",
            Algorithm::Binomial => "binomial",
            Algorithm::ScatterAllGather => "scatter_allgather",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::Rabenseifner => "rabenseifner",
            Algorithm::ReduceBroadcast => "reduce_bcast",
            Algorithm::Bruck => "bruck",
            Algorithm::Ring => "ring",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Linear => "linear",
            Algorithm::ReduceThenScatter => "reduce_then_scatter",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::SharedMemory => "shared_memory",
        }
    }

    /// Parses a name used in `METAMPI_COLL_ALG`.
    pub fn from_name(s: &str) -> Option<Algorithm> {
        let s = s.trim().to_ascii_lowercase();
        let alias = match s.as_str() {
            "van_de_geijn" | "scatter_ring" => "scatter_allgather",
            "rd" => "recursive_doubling",
            "chain" => "linear",
            "hier" | "topology" => "hierarchical",
            "shm" | "flags" => "shared_memory",
            other => other,
        };
        Algorithm::ALL.into_iter().find(|a| a.name() == alias)
    }
}

/// Bytes below which broadcast stays binomial.
const BCAST_LONG: usize = 128 << 10;
/// Ranks below which broadcast stays binomial (MPICH's choice too).
const BCAST_MIN_RANKS: Rank = 8;
/// Bytes from which commutative all-reduce uses Rabenseifner.
const ALLREDUCE_LONG: usize = 16 << 10;
/// The same on two ranks, where halving the data saves no round: it pays
/// from 64 KiB (2 ranks pinned, alternating runs: 64 KiB 7-14 µs against
/// 17-30, 4 MiB 1016-1116 against 1267-1456; 16-32 KiB and 128 KiB alike).
const ALLREDUCE_LONG_PAIR: usize = 64 << 10;
/// Total bytes (all blocks) from which gather/scatter go linear.
const GATHER_LONG: usize = 256 << 10;
/// Total bytes from which all-gather uses the ring instead of Bruck.
const ALLGATHER_LONG: usize = 64 << 10;
/// Bytes per block up to which all-to-all posts everything at once.
const ALLTOALL_SHORT: usize = 1 << 10;
/// Total bytes below which reduce-scatter goes through rank 0.
const REDSCAT_SHORT: usize = 16 << 10;

/// The algorithm metampi picks when nothing is forced, for an operation on
/// `size` ranks moving `bytes` per rank (the block size for the
/// gather/scatter/all-to-all family, the vector for reductions).
///
/// | operation | choice |
/// |---|---|
/// | barrier | dissemination |
/// | broadcast | binomial; scatter + ring all-gather from 128 KiB on ≥ 8 ranks |
/// | reduce | binomial (rank order to rank 0 then the root, when not commutative) |
/// | all-reduce | recursive doubling; Rabenseifner when commutative from 16 KiB on ≥ 3 ranks, from 64 KiB on 2 |
/// | gather, scatter | binomial; linear from 256 KiB in total |
/// | all-gather | Bruck; ring from 64 KiB in total |
/// | all-to-all | linear up to 1 KiB per block; pairwise above |
/// | scan, exclusive scan | recursive doubling |
/// | reduce-scatter-block | reduce then scatter below 16 KiB on > 4 ranks; pairwise otherwise |
///
/// This is the flat choice; a communicator that spans several meta hosts
/// (for barrier, broadcast, reduce and all-reduce also one that spans
/// several machines sharing memory) runs [`Algorithm::Hierarchical`] instead
/// for the operations that have it, and blocking barriers, and broadcasts,
/// reduces, all-reduces, gathers and all-gathers up to 8 KiB per member
/// (scatters and all-to-alls up to 8 KiB of send buffer), on a
/// communicator inside one machine run [`Algorithm::SharedMemory`] once it has
/// been used a few times (the rooted ones not where ranks outnumber cores).
/// A broadcast inside one machine whose ranks outnumber its cores stays
/// binomial at every size.
pub fn default_algorithm(op: Collective, size: Rank, bytes: usize, commutative: bool) -> Algorithm {
    let total = bytes.saturating_mul(size.max(0) as usize);
    match op {
        Collective::Barrier => Algorithm::Dissemination,
        Collective::Broadcast if size >= BCAST_MIN_RANKS && bytes >= BCAST_LONG => {
            Algorithm::ScatterAllGather
        }
        Collective::Broadcast | Collective::Reduce => Algorithm::Binomial,
        Collective::AllReduce
            if commutative
                && ((size >= 3 && bytes >= ALLREDUCE_LONG)
                    || (size == 2 && bytes >= ALLREDUCE_LONG_PAIR)) =>
        {
            Algorithm::Rabenseifner
        }
        Collective::AllReduce => Algorithm::RecursiveDoubling,
        Collective::Gather | Collective::Scatter if total >= GATHER_LONG => Algorithm::Linear,
        Collective::Gather | Collective::Scatter => Algorithm::Binomial,
        Collective::AllGather if total >= ALLGATHER_LONG => Algorithm::Ring,
        Collective::AllGather => Algorithm::Bruck,
        Collective::AllToAll if bytes <= ALLTOALL_SHORT => Algorithm::Linear,
        Collective::AllToAll => Algorithm::Pairwise,
        Collective::Scan | Collective::ExclusiveScan => Algorithm::RecursiveDoubling,
        Collective::ReduceScatterBlock if total < REDSCAT_SHORT && size > 4 => {
            Algorithm::ReduceThenScatter
        }
        Collective::ReduceScatterBlock => Algorithm::Pairwise,
    }
}

type Table = [Option<Algorithm>; Collective::ALL.len()];

/// Whether any algorithm may be forced: lets a call skip the table's lock
/// in the usual case where nothing is (set before the table changes).
static ANY_FORCED: AtomicBool = AtomicBool::new(false);

fn forced() -> &'static RwLock<Table> {
    static F: OnceLock<RwLock<Table>> = OnceLock::new();
    F.get_or_init(|| {
        let mut t = [None; Collective::ALL.len()];
        if let Some(spec) = crate::knobs::text("METAMPI_COLL_ALG") {
            match parse_spec(&spec) {
                Ok(v) => {
                    for (c, a) in v {
                        ANY_FORCED.store(true, Ordering::Release);
                        t[c.index()] = Some(a);
                    }
                }
                // A bad setting must not go unnoticed, nor stop the job.
                Err(e) => tracing::warn!("metampi: ignoring METAMPI_COLL_ALG: {e}"),
            }
        }
        RwLock::new(t)
    })
}

/// Parses `op=alg,op=alg` (the `METAMPI_COLL_ALG` syntax).
///
/// # Errors
/// `Arg` for an unknown name or an algorithm that does not implement the
/// operation.
pub fn parse_spec(spec: &str) -> Result<Vec<(Collective, Algorithm)>, Error> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (o, a) = item.split_once('=').ok_or_else(|| {
            Error::new(
                ErrorClass::Arg,
                format!("`{item}` is not of the form op=algorithm"),
            )
        })?;
        let c = Collective::from_name(o)
            .ok_or_else(|| Error::new(ErrorClass::Arg, format!("unknown collective `{o}`")))?;
        let alg = Algorithm::from_name(a)
            .ok_or_else(|| Error::new(ErrorClass::Arg, format!("unknown algorithm `{a}`")))?;
        check(c, alg)?;
        out.push((c, alg));
    }
    Ok(out)
}

fn check(c: Collective, a: Algorithm) -> Result<(), Error> {
    if c.algorithms().contains(&a) {
        return Ok(());
    }
    let names: Vec<&str> = c.algorithms().iter().map(|a| a.name()).collect();
    Err(Error::new(
        ErrorClass::Arg,
        format!(
            "{} does not implement {}; choose one of {}",
            a.name(),
            c.name(),
            names.join(", ")
        ),
    ))
}

/// Forces `alg` for every later `op` in this process (`None` returns to the
/// automatic choice); overrides `METAMPI_COLL_ALG`. Every rank of a
/// communicator must force the same algorithms before its next collective.
/// Where the forced algorithm cannot serve a call (Rabenseifner with a
/// non-commutative operation) the order-preserving default runs instead.
///
/// # Errors
/// `Arg` when `alg` does not implement `op`.
pub fn force_algorithm(op: Collective, alg: Option<Algorithm>) -> Result<(), Error> {
    if let Some(a) = alg {
        check(op, a)?;
        ANY_FORCED.store(true, Ordering::Release);
    }
    forced().write().unwrap_or_else(|p| p.into_inner())[op.index()] = alg;
    Ok(())
}

/// The algorithm forced for `op`, if any.
pub fn forced_algorithm(op: Collective) -> Option<Algorithm> {
    // The table is read from the environment on first use.
    let table = forced();
    if !ANY_FORCED.load(Ordering::Acquire) {
        return None;
    }
    table.read().unwrap_or_else(|p| p.into_inner())[op.index()]
}

/// The algorithm a call will use: the forced one where it applies, else
/// [`Algorithm::Hierarchical`] when `comm` spans several meta hosts and the
/// operation has a hierarchical form (barrier, broadcast, reduce and
/// all-reduce also when it spans several machines sharing memory among some
/// of its ranks), else the default. A non-commutative reduction whose sites'
/// ranks are not consecutive cannot keep rank order hierarchically and
/// takes the flat default instead (forced or not).
pub(crate) fn choose(
    comm: &CommInner,
    op: Collective,
    bytes: usize,
    commutative: bool,
) -> Algorithm {
    let size = comm.size();
    let flat = || default_algorithm(op, size, bytes, commutative);
    match forced_algorithm(op) {
        Some(Algorithm::Rabenseifner) if !commutative => Algorithm::RecursiveDoubling,
        Some(Algorithm::Hierarchical) if !super::hier::usable(comm, commutative) => flat(),
        // Served before planning (`collective::shm`) where it can be; a
        // call that reaches the schedules takes the flat choice.
        Some(Algorithm::SharedMemory) => flat(),
        Some(a) => a,
        None if size > 2
            && op.algorithms().contains(&Algorithm::Hierarchical)
            && auto_hierarchical(comm, op)
            && super::hier::usable(comm, commutative) =>
        {
            Algorithm::Hierarchical
        }
        // Scatter + ring all-gather keeps every core copying at once, which
        // only pays with a core per rank; where ranks outnumber cores its
        // 2(n-1) steps each wait for a peer to be scheduled. Measured (8
        // ranks on 2 cores, 1 MiB): binomial 355-530 µs, scatter + ring
        // 560-820; 16 ranks: 1250-1490 against 2830-3960. Every member sees
        // the same machine, so all choose alike.
        None if op == Collective::Broadcast
            && crate::environment::shared().oversubscribed()
            && super::hier::on_one_machine(comm) =>
        {
            Algorithm::Binomial
        }
        None => flat(),
    }
}

/// Whether `op` on `comm` goes hierarchical when nothing is forced.
fn auto_hierarchical(comm: &CommInner, op: Collective) -> bool {
    if super::hier::spans_sites(comm) {
        return true;
    }
    matches!(
        op,
        Collective::Barrier | Collective::Broadcast | Collective::Reduce | Collective::AllReduce
    ) && super::hier::spans_shared_machines(comm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parses_and_rejects() {
        let v = parse_spec(" bcast=van_de_geijn, allreduce=rabenseifner ,scan=chain").unwrap();
        assert_eq!(
            v,
            vec![
                (Collective::Broadcast, Algorithm::ScatterAllGather),
                (Collective::AllReduce, Algorithm::Rabenseifner),
                (Collective::Scan, Algorithm::Linear)
            ]
        );
        assert_eq!(
            parse_spec("bcast=bruck").unwrap_err().class(),
            ErrorClass::Arg
        );
        assert_eq!(
            parse_spec("nope=ring").unwrap_err().class(),
            ErrorClass::Arg
        );
        assert_eq!(parse_spec("bcast").unwrap_err().class(), ErrorClass::Arg);
        assert!(parse_spec("").unwrap().is_empty());
    }

    #[test]
    fn long_commutative_all_reduce_halves_the_data() {
        let ar = |size, bytes, comm| default_algorithm(Collective::AllReduce, size, bytes, comm);
        assert_eq!(ar(2, 32 << 10, true), Algorithm::RecursiveDoubling);
        assert_eq!(ar(2, 64 << 10, true), Algorithm::Rabenseifner);
        assert_eq!(ar(3, 16 << 10, true), Algorithm::Rabenseifner);
        assert_eq!(ar(4, 8 << 10, true), Algorithm::RecursiveDoubling);
        assert_eq!(ar(2, 4 << 20, false), Algorithm::RecursiveDoubling);
    }

    #[test]
    fn every_name_round_trips() {
        for c in Collective::ALL {
            assert_eq!(Collective::from_name(c.name()), Some(c));
            for &a in c.algorithms() {
                assert_eq!(Algorithm::from_name(a.name()), Some(a));
            }
            // The default is always one of the operation's algorithms.
            for size in 1..20 {
                for bytes in [0, 100, 5000, 100_000, 1 << 20] {
                    for comm in [false, true] {
                        let d = default_algorithm(c, size, bytes, comm);
                        assert!(c.algorithms().contains(&d), "{c:?} {d:?}");
                        if !comm {
                            assert_ne!(d, Algorithm::Rabenseifner);
                        }
                    }
                }
            }
        }
    }
}
