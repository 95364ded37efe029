//! Raw views of user buffers that outlive the call that posted them.
//!
//! A nonblocking operation keeps a pointer to the user's buffer until it
//! completes. The API layer guarantees that the buffer outlives the request
//! (blocking calls wait before returning; scoped requests must be completed
//! before the scope ends, as in rsmpi; owned requests hold the `Vec`).

/// Read-only view of a send buffer.
#[derive(Clone, Copy, Debug)]
pub struct SendPtr {
    ptr: *const u8,
    len: usize,
}

/// Writable view of a receive buffer.
#[derive(Clone, Copy, Debug)]
pub struct RecvPtr {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: these are plain addresses; the owner contract (module docs) makes the
// memory valid for as long as the request that holds them, from any thread.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Send for RecvPtr {}

impl SendPtr {
    /// # Safety
    /// `bytes` must stay valid and unmodified until the request holding this
    /// pointer has completed.
    pub unsafe fn new(bytes: &[u8]) -> SendPtr {
        SendPtr {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    /// The bytes. Valid per the contract of [`SendPtr::new`].
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: contract of `new`: the memory is alive and unmodified.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl RecvPtr {
    /// # Safety
    /// `bytes` must stay valid, and not be accessed by anyone else, until the
    /// request holding this pointer has completed.
    pub unsafe fn new(bytes: &mut [u8]) -> RecvPtr {
        RecvPtr {
            ptr: bytes.as_mut_ptr(),
            len: bytes.len(),
        }
    }

    /// A view of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// As for [`RecvPtr::new`]: the `len` bytes at `ptr` must be writable, stay valid, and
    /// not be accessed by anyone else, until the request holding this pointer has completed.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> RecvPtr {
        RecvPtr { ptr, len }
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole buffer, writable. Valid per the contract of [`RecvPtr::new`];
    /// the engine hands it to one writer at a time.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: contract of `new`: exclusive, live memory of `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
