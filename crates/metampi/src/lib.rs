//! metampi: MPI-style message passing for Rust, in pure Rust, with the API
//! shape of the `mpi` crate (rsmpi 0.8).
//!
//! One `COMM_WORLD` spans the processes started by `metampi run`: processes
//! on one machine talk through lock-free shared-memory rings (ScaMPI's
//! remote-write/local-read design) with single-copy transfer of large
//! messages; processes on different machines talk over TCP. MPI-1.2 rules hold
//! on every path: contexts per communicator, wildcards, non-overtaking order,
//! truncation errors, synchronous completion only after a match.
//!
//! Key types: [`environment::Universe`], [`topology::SimpleCommunicator`],
//! [`traits::Source`]/[`traits::Destination`], [`request::scope`],
//! [`traits::CommunicatorCollectives`]/[`traits::Root`].
//!
//! ```no_run
//! use metampi::traits::*;
//!
//! let universe = metampi::initialize().unwrap();
//! let world = universe.world();
//! let (rank, size) = (world.rank(), world.size());
//! if rank == 0 {
//!     for r in 1..size {
//!         let (msg, status) = world.any_process().receive::<i32>();
//!         println!("got {msg} from {}", status.source_rank());
//!     }
//! } else {
//!     world.process_at_rank(0).send(&(rank * 10));
//! }
//! ```
//!
//! Run it with `metampi run -n 4 target/debug/examples/...`; started without
//! the launcher a program is a world of one.
//!
//! Differences from rsmpi that users ask for: communicators are `Send + Sync`
//! and `Threading::Multiple` works; `try_*` forms return [`Error`] with an
//! MPI-like [`ErrorClass`]; owned nonblocking operations
//! ([`traits::Destination::immediate_send_owned`],
//! [`traits::Source::immediate_receive_vec`]) need no scope and are real
//! `Future`s woken by the library.

mod bootstrap;
pub mod collective;
pub mod datatype;
mod engine;
mod envelope;
pub mod environment;
mod error;
pub mod meta;
pub mod point_to_point;
pub mod request;
pub mod router;
mod sys;
pub mod testing;
pub mod topology;
pub mod trace;

pub use crate::environment::{
    initialize, initialize_with_threading, is_finalized, is_initialized, processor_name, time,
    time_resolution, Threading,
};
pub use crate::error::{Error, ErrorClass};

/// A rank in a communicator.
pub type Rank = i32;
/// A message tag. User tags are `0..=i32::MAX`.
pub type Tag = i32;
/// A count of elements.
pub type Count = i32;
/// A byte address or displacement.
pub type Address = isize;

/// rsmpi's vocabulary in one import: `use metampi::traits::*;`.
pub mod traits {
    pub use crate::collective::{CommunicatorCollectives, Operation, Root};
    pub use crate::datatype::{
        AsDatatype, Buffer, BufferMut, Collection, Datatype, Equivalence, Partitioned,
        PartitionedBuffer, PartitionedBufferMut, Pointer, PointerMut, UncommittedDatatype,
    };
    pub use crate::point_to_point::{Destination, MatchedReceiveVec, Source};
    pub use crate::topology::{AsCommunicator, Communicator, Group};
    pub use metampi_derive::Equivalence;
}
