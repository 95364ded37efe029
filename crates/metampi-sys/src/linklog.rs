//! Router trace files: each connection of a router to a peer router appends one 16-byte
//! record per frame written and per read into a file mapping
//! (`DIR/router-R-{out,in}-P.trace`, `DIR` from `METAMPI_TRACE`), so that what it recorded
//! survives the `SIGKILL` that ends a router. The format is read by `metampi trace`
//! (`metampi::trace` re-exports it).

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Records per link written in a router's trace file before it counts drops.
pub const LINK_RECORDS: usize = 1 << 20;
/// Router trace files: magic, then record count and dropped count (u64,
/// little-endian), then a JSON header line padded with NULs up to
/// [`LINK_HEADER`], then 16-byte records: nanoseconds since the header's
/// epoch (u64), bytes (u32), layout link id with bit 31 set for received
/// bytes (u32).
pub const LINK_MAGIC: &[u8; 8] = b"MPLKTRC1";
/// Size of the header of a router trace file.
pub const LINK_HEADER: usize = 4096;
/// Size of one record of a router trace file.
pub const LINK_RECORD: usize = 16;
/// Set in a record's link field when the bytes were received.
pub const LINK_RECEIVED: u32 = 1 << 31;

/// Frames of one router connection (to or from a peer router), appended to
/// a shared file mapping: the router process is killed at the end of a job,
/// and the kernel keeps what was written to the mapping.
pub struct LinkLog {
    seg: crate::shm::Segment,
    n: usize,
    dropped: u64,
    epoch: Instant,
}

impl LinkLog {
    /// A log for router `router`'s connection to (`outgoing`) or from peer
    /// router `peer`, or `None` when tracing is off or the file cannot be made.
    pub fn open(router: usize, outgoing: bool, peer: usize) -> Option<LinkLog> {
        let dir = trace_dir()?;
        let side = if outgoing { "out" } else { "in" };
        let path = dir.join(format!("router-{router}-{side}-{peer}.trace"));
        let _ = std::fs::remove_file(&path);
        let len = LINK_HEADER + LINK_RECORDS * LINK_RECORD;
        let seg = match crate::shm::Segment::create(&path, len) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    "metampi router {router}: not tracing {}: {e}",
                    path.display()
                );
                return None;
            }
        };
        let epoch = Instant::now();
        let head = format!(
            r#"{{"router":{router},"dir":"{side}","peer":{peer},"epoch_unix_ns":{},"pid":{},"capacity":{LINK_RECORDS}}}"#,
            unix_ns(),
            std::process::id()
        );
        let mut first = [0u8; LINK_HEADER];
        first[..8].copy_from_slice(LINK_MAGIC);
        let text = head.as_bytes();
        let n = text.len().min(LINK_HEADER - 25);
        first[24..24 + n].copy_from_slice(&text[..n]);
        let log = LinkLog {
            seg,
            n: 0,
            dropped: 0,
            epoch,
        };
        log.put(0, &first);
        Some(log)
    }

    /// Records `bytes` written to (or, with `received`, read from) link
    /// `link_id` at `now`.
    #[inline]
    pub fn record(&mut self, now: Instant, link_id: u32, bytes: usize, received: bool) {
        if self.n == LINK_RECORDS {
            self.dropped += 1;
            self.put(16, &self.dropped.to_le_bytes());
            return;
        }
        let t = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        let mut rec = [0u8; LINK_RECORD];
        rec[..8].copy_from_slice(&t.to_le_bytes());
        rec[8..12].copy_from_slice(&(bytes.min(u32::MAX as usize) as u32).to_le_bytes());
        let link = (link_id & !LINK_RECEIVED) | if received { LINK_RECEIVED } else { 0 };
        rec[12..].copy_from_slice(&link.to_le_bytes());
        self.put(LINK_HEADER + self.n * LINK_RECORD, &rec);
        self.n += 1;
        self.put(8, &(self.n as u64).to_le_bytes());
    }

    /// Copies `bytes` into the mapping at `off`.
    fn put(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= LINK_HEADER + LINK_RECORDS * LINK_RECORD);
        // SAFETY: the range is inside the mapping (checked above), which
        // lives as long as `seg`; only this log writes to it.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.seg.base().add(off), bytes.len());
        }
    }
}

/// The trace directory, `METAMPI_TRACE`, created if needed; `None` (with a message) when
/// unusable. Ranks write their traces there too.
pub fn trace_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(crate::knobs::os("METAMPI_TRACE")?);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(
            "metampi: tracing disabled, cannot create {}: {e}",
            dir.display()
        );
        return None;
    }
    Some(dir)
}

/// Nanoseconds since the Unix epoch: the trace files' common clock.
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_log_records_land_in_the_file() {
        let dir = std::env::temp_dir().join(format!("metampi-linklog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("router-9-out-4.trace");
        // `LinkLog::open` reads the directory from the environment; build it here instead.
        let len = LINK_HEADER + LINK_RECORDS * LINK_RECORD;
        let mut log = LinkLog {
            seg: crate::shm::Segment::create(&path, len).unwrap(),
            n: 0,
            dropped: 0,
            epoch: Instant::now(),
        };
        log.record(Instant::now(), 3, 100, false);
        log.record(Instant::now(), 3, 64, true);
        drop(log);
        let b = std::fs::read(&path).unwrap();
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 2);
        let rec = |i: usize| &b[LINK_HEADER + i * LINK_RECORD..][..LINK_RECORD];
        assert_eq!(u32::from_le_bytes(rec(0)[8..12].try_into().unwrap()), 100);
        assert_eq!(u32::from_le_bytes(rec(0)[12..16].try_into().unwrap()), 3);
        assert_eq!(
            u32::from_le_bytes(rec(1)[12..16].try_into().unwrap()),
            3 | LINK_RECEIVED
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
