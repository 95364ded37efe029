//! Reading a socket into a buffer's spare capacity without zeroing it first.

use std::io;
use std::os::fd::AsRawFd;

use bytes::BytesMut;

/// Reads at most `max` bytes from `src` onto the end of `buf` and returns how
/// many came (`Ok(0)` at the end of the stream). Unlike `resize` + `read`,
/// nothing is written before the kernel writes: zeroing a 256 KiB chunk per
/// read cost a router more than a tenth of its time while streaming.
pub fn read_append(src: &impl AsRawFd, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let n = max.min(spare.len());
    loop {
        // SAFETY: `spare` is `n` or more bytes of writable memory owned by
        // `buf`; read(2) writes at most `n` bytes there and nothing reads them
        // before `set_len` marks exactly the written ones initialised.
        let r = unsafe { libc::read(src.as_raw_fd(), spare.as_mut_ptr().cast(), n) };
        if r >= 0 {
            let r = r as usize;
            // SAFETY: the kernel initialised the first `r` (≤ `n`) spare bytes.
            unsafe { buf.set_len(buf.len() + r) };
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn appends_what_arrives_and_sees_the_end() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"hello world").unwrap();
        let mut buf = BytesMut::from(&b"> "[..]);
        assert_eq!(read_append(&b, &mut buf, 5).unwrap(), 5);
        assert_eq!(&buf[..], b"> hello");
        assert_eq!(read_append(&b, &mut buf, 100).unwrap(), 6);
        assert_eq!(&buf[..], b"> hello world");
        drop(a);
        assert_eq!(read_append(&b, &mut buf, 100).unwrap(), 0);
        b.set_nonblocking(true).unwrap();
        assert_eq!(buf.len(), 13);
    }

    /// The same through a pipe, which Miri runs (its sockets cannot make a
    /// `UnixStream` pair, `.ci/miri.sh`): the bytes land in the spare
    /// capacity and the length covers them and no more (Miri reports a read
    /// of a byte the kernel did not write as uninitialised).
    #[test]
    fn appends_from_a_pipe_into_spare_capacity() {
        use std::os::fd::{FromRawFd, OwnedFd};
        let mut fds = [0; 2];
        // SAFETY: pipe(2) writes two descriptors into the array it is given.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors are new and owned by nothing else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut w = std::fs::File::from(w);
        w.write_all(b"hello world").unwrap();
        let mut buf = BytesMut::with_capacity(8);
        buf.extend_from_slice(b"> ");
        assert_eq!(read_append(&r, &mut buf, 5).unwrap(), 5);
        assert_eq!(&buf[..], b"> hello");
        assert_eq!(read_append(&r, &mut buf, 100).unwrap(), 6);
        assert_eq!(&buf[..], b"> hello world");
        drop(w);
        assert_eq!(read_append(&r, &mut buf, 100).unwrap(), 0);
        assert_eq!(buf.len(), 13);
    }

    #[test]
    fn would_block_is_an_error_and_leaves_the_buffer() {
        let (_a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut buf = BytesMut::new();
        let e = read_append(&b, &mut buf, 64).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(buf.is_empty());
    }
}
