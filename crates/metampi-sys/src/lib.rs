//! The system layer under the `metampi` library and its router process: shared memory,
//! rings, the rank-router pipes, cross-memory attach, `poll`, reads into uninitialised buffer
//! space, fences and CPU facts; and what both processes must read alike: the message
//! envelope, the settings read from the environment (`knobs`), a stable hash. Not an API for
//! programs: `metampi` re-exports what they use (`metampi::knobs`).
//!
//! This crate holds the library's unsafe islands of system code; `envelope`, `hash` and
//! `knobs` are safe code. Each unsafe item documents the invariant its callers must keep,
//! and every `unsafe` block has a `// SAFETY:` comment.

#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod cma;
#[allow(unsafe_code)]
pub mod copy;
#[allow(unsafe_code)]
pub mod cpus;
pub mod envelope;
#[allow(unsafe_code)]
mod fence;
pub mod hash;
#[allow(unsafe_code)]
mod host;
pub mod knobs;
#[allow(unsafe_code)]
pub mod linklog;
#[allow(unsafe_code)]
pub mod poll;
#[allow(unsafe_code)]
pub mod rawbuf;
#[allow(unsafe_code)]
pub mod read;
#[allow(unsafe_code)]
pub mod ring;
#[allow(unsafe_code)]
pub mod shm;
#[allow(unsafe_code)]
pub mod sleep_flag;
#[allow(unsafe_code)]
pub mod spin;
#[allow(unsafe_code)]
pub mod vchan;

pub use fence::{asymmetric_fences, publish_fence, sleep_fence, store_load_fence};
pub use host::hostname;
