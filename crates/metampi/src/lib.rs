//! metampi: MPI-style message passing for Rust, in pure Rust, with the API
//! shape of the `mpi` crate (rsmpi 0.8).
//!
//! One `COMM_WORLD` spans the processes started by `metampi run`: processes
//! on one machine talk through lock-free shared-memory rings (ScaMPI's
//! remote-write/local-read design) with single-copy transfer of large
//! messages; processes on different machines talk over TCP. MPI's rules hold
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

// `unsafe` is refused everywhere except the modules marked `allow(unsafe_code)` below
// and, inside `engine` and `collective`, the files marked there: the islands where
// shared memory, system calls and views of user buffers live (each block has a
// `// SAFETY:` comment).
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod attribute;
pub mod auth;
mod bootstrap;
#[allow(unsafe_code)]
pub mod collective;
#[allow(unsafe_code)]
pub mod datatype;
mod engine;
#[allow(unsafe_code)]
pub mod environment;
pub mod log;
/// C-interface names that rsmpi programs use; there is no C library behind them.
pub mod ffi {
    /// The handle of a datatype, as [`crate::collective::UnsafeUserFunction`] receives it
    /// (compare with `UncommittedDatatype::type_id`).
    #[allow(non_camel_case_types)]
    pub type MPI_Datatype = u32;
}
#[cfg(feature = "test-counters")]
#[doc(hidden)]
pub mod counters;
mod error;
#[allow(unsafe_code)]
mod lend;
pub mod point_to_point;
#[doc(hidden)]
pub mod pvars;
#[allow(unsafe_code)]
pub mod request;
#[allow(unsafe_code)]
pub mod topology;
#[allow(unsafe_code)]
pub mod trace;
pub mod tuning;

// The system layer (shared memory, rings, pipes, `poll`, fences; `metampi-sys`, shared with
// the router) under the names the library's modules use.
use metampi_sys as sys;
/// The library's settings from the environment (`METAMPI_*`): how each is read and checked.
pub use metampi_sys::knobs;
use metampi_sys::{envelope, hash};

pub use crate::environment::{
    initialize, initialize_with_threading, is_finalized, is_initialized, processor_name, time,
    time_resolution, Threading,
};
pub use crate::error::{Error, ErrorClass};
/// rsmpi's name for the error of a fallible call (such as
/// [`Root::spawn`](collective::Root::spawn)).
pub type MpiError = Error;

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
    pub use crate::attribute::{AnyCommunicator, CommAttribute};
    pub use crate::collective::{CommunicatorCollectives, Operation, Root};
    pub use crate::datatype::{
        AsDatatype, Buffer, BufferMut, Collection, Datatype, Equivalence, Partitioned,
        PartitionedBuffer, PartitionedBufferMut, Pointer, PointerMut, UncommittedDatatype,
    };
    pub use crate::point_to_point::{Destination, MatchedReceiveVec, Source};
    pub use crate::topology::{AsCommunicator, Communicator, Group};
    pub use metampi_derive::Equivalence;
}

/// Entry points for the fuzz targets in `fuzz/` and the hostile-input tests: the decoders
/// of bytes that peers send, which are private otherwise. Not part of the API.
#[doc(hidden)]
#[allow(unsafe_code)]
pub mod fuzzing {
    use std::io::Write;
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::os::unix::net::UnixDatagram;

    use crate::engine::core::{Core, Pattern, RecvBuf, SendBuf};
    use crate::engine::links::{Link, Links};
    use crate::envelope::{Envelope, ENV_LEN};
    use crate::sys::rawbuf::RecvPtr;

    /// Length of the rank-side envelope.
    pub const ENVELOPE_LEN: usize = ENV_LEN;

    /// Decodes the front of `bytes` as a 64-byte envelope: its kind, message length and
    /// the payload bytes that follow it on a stream; `None` when the decoder refuses it.
    /// What it accepts must survive a re-encoding unchanged.
    ///
    /// # Panics
    /// When an accepted envelope does not round-trip (a decoder bug).
    pub fn decode_envelope(bytes: &[u8]) -> Option<(u8, u64, u64)> {
        let env = Envelope::decode(bytes)?;
        let inline = env.is_inline().then(|| &bytes[32..32 + env.len as usize]);
        let again = Envelope::decode(&env.encode(inline));
        assert_eq!(again, Some(env), "envelope does not round-trip");
        Some((env.kind as u8, env.len, env.trailing_len() as u64))
    }

    /// Feeds `bytes` to a rank's matching engine as the stream a TCP peer (world rank 1)
    /// sent, through the real stream reader, until the peer's end of stream closes the
    /// link. Rank 0 has posted receives into fixed buffers and into a vector of the
    /// message's size, and holds an owned send, so eager
    /// delivery, rendezvous, data fragments and acknowledgements all find a target.
    ///
    /// # Errors
    /// Only when the loopback sockets cannot be set up.
    pub fn rank_stream(bytes: &[u8]) -> std::io::Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let mut peer = TcpStream::connect(listener.local_addr()?)?;
        let (mine, _) = listener.accept()?;
        mine.set_nonblocking(true)?;
        let (wake, _wake_peer) = UnixDatagram::pair()?;
        wake.set_nonblocking(true)?;
        // Declared before the engine so that they outlive every request that points at them.
        let mut bufs = Targets::default();
        let mut core = Core::new(0, 2);
        bufs.post(&mut core);
        let mut links = Links::new(0, vec![Link::Local, Links::tcp(mine)], wake);
        // Loopback takes a fuzz input whole; a longer one only has its tail cut off.
        peer.set_nonblocking(true)?;
        let _ = peer.write_all(bytes);
        let _ = peer.shutdown(Shutdown::Write);
        for _ in 0..64 {
            if !links.progress(&mut core) && !links.has_pending() {
                break;
            }
        }
        drop(links);
        drop(core);
        Ok(())
    }

    /// Receive buffers for the posted receives of the stream entries.
    struct Targets {
        small: [u8; 48],
        exact: [u8; 8],
        large: Vec<u8>,
    }

    impl Default for Targets {
        fn default() -> Self {
            Targets {
                small: [0; 48],
                exact: [0; 8],
                large: vec![0; 96 << 10],
            }
        }
    }

    impl Targets {
        /// Posts receives into the buffers (a wildcard small and large one, one that
        /// matches a single envelope exactly, one into a vector of the message's size) and
        /// an owned send, so that eager delivery, rendezvous, data fragments and
        /// acknowledgements all find a target. The buffers must outlive `core`.
        fn post(&mut self, core: &mut Core) {
            let any = |ctx| Pattern {
                ctx,
                src: None,
                tag: None,
            };
            // SAFETY: the caller declares the targets before `core`, so they are dropped
            // after it; each backs one request, and nothing else touches them while the
            // requests live.
            let (small, exact, large) = unsafe {
                (
                    RecvPtr::new(&mut self.small),
                    RecvPtr::new(&mut self.exact),
                    RecvPtr::new(&mut self.large),
                )
            };
            core.post_recv(any(0), RecvBuf::Borrowed(small));
            core.post_recv(any(0), RecvBuf::Borrowed(large));
            core.post_recv(
                Pattern {
                    ctx: 2,
                    src: Some(1),
                    tag: Some(7),
                },
                RecvBuf::Borrowed(exact),
            );
            core.post_recv(any(4), RecvBuf::Owned(Vec::new()));
            core.new_send(1, SendBuf::Owned(vec![0x5a; 70 << 10]));
        }
    }

    /// Bytes in chunks of the sizes the input's first byte picks, with nothing there at
    /// every third read.
    struct Chunks<'a> {
        rest: &'a [u8],
        sizes: [usize; 4],
        turn: usize,
    }

    impl crate::engine::stream::ByteSource for Chunks<'_> {
        fn read_into(&mut self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
            self.turn += 1;
            if self.rest.is_empty() {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if self.turn % 3 == 0 {
                return Ok(None);
            }
            let k = self.sizes[self.turn % 4]
                .min(buf.len())
                .min(self.rest.len());
            buf[..k].copy_from_slice(&self.rest[..k]);
            self.rest = &self.rest[k..];
            Ok(Some(k))
        }

        fn short_read_drains(&self) -> bool {
            self.turn % 2 == 0
        }
    }

    /// Feeds `bytes[1..]` to a rank's matching engine through the stream codec alone, with
    /// no socket: the codec reads it in chunks whose sizes `bytes[0]` picks, as a peer's
    /// stream (world rank 1) would arrive, until it ends or the codec refuses it. The
    /// engine has the receives [`rank_stream`] posts.
    pub fn stream_codec(bytes: &[u8]) {
        let Some((&pick, rest)) = bytes.split_first() else {
            return;
        };
        let size =
            |bits: u8| [1, 7, 64, 100, 4096, 65 << 10, 1 << 20, usize::MAX][bits as usize & 7];
        let mut src = Chunks {
            rest,
            sizes: [
                size(pick),
                size(pick >> 3),
                size(pick >> 5),
                size(pick >> 2),
            ],
            turn: 0,
        };
        let mut bufs = Targets::default();
        let mut core = Core::new(0, 2);
        bufs.post(&mut core);
        let mut rx = crate::engine::stream::StreamRx::default();
        // Every pump takes at least one chunk or meets a stall, so this ends.
        while !src.rest.is_empty() {
            let mut got = false;
            if rx.pump(&mut src, &mut core, |w| w, &mut got).is_err() {
                break;
            }
        }
        drop(core);
    }
}
