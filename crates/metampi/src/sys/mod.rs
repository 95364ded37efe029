//! The unsafe islands: shared memory, rings, cross-memory attach, `poll`
//! and reads into uninitialised buffer space.
//!
//! Everything outside this module is safe code. Each item here documents the
//! invariant its callers must keep.

pub(crate) mod cma;
pub(crate) mod cpus;
pub(crate) mod poll;
pub(crate) mod rawbuf;
pub(crate) mod read;
pub(crate) mod ring;
pub(crate) mod shm;
pub(crate) mod vchan;
