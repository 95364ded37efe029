//! VDIF read in order from a pipe or a socket, as e-VLBI recorders and correlator feeds send
//! it: frames of every thread, frame set after frame set. The side-car text (see
//! [`super::vdif`]) comes from the caller, since a stream has no file beside it.
//!
//! Frames are gathered into frame sets by their time (second and frame number). A set is
//! handed on once every thread's frame is in, or once a frame [`REORDER`] sets newer
//! arrives, so frames of different threads may come a little out of order. What never came
//! (a missing frame, a gap in time, a frame marked invalid) reads as zeros, as in the file
//! reader; a frame dated before what was already handed on, or implausibly far ahead (a
//! damaged header), is dropped and counted. Framing rests on the first frame's length: a
//! later frame whose header is unreadable or describes another stream is skipped whole.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Read;
use std::path::{Path, PathBuf};

use rustfft::num_complex::Complex32;

use super::vdif::{band_of, decode_bits, frames_per_second, levels, VdifHeader, VdifSidecar};
use super::{read_up_to, HeaderError, Metadata, ReadError};
use crate::band::Band;
use crate::voltages::Voltages;

/// Frame sets a frame may arrive behind the newest one and still be used.
pub const REORDER: u64 = 4;

/// Channels a stream may have at most (the headers could claim billions).
const MAX_CHANNELS: usize = 1 << 16;

/// This many frames in a row dated implausibly far ahead are taken as a jump of the
/// stream itself, which ends it with an error rather than zeros for the whole gap.
const FAR_RUN_LIMIT: u32 = 64;

/// One frame set being gathered: each thread slot's payload, and how many slots were seen
/// (a frame marked invalid is seen but has no payload).
#[derive(Debug)]
struct Set {
    payload: Vec<Option<Vec<u8>>>,
    seen: usize,
}

/// Frame sets handed on to be read.
#[derive(Debug)]
enum Ready {
    /// One set: each thread slot's payload (`None`: zeros).
    Set(Vec<Option<Vec<u8>>>),
    /// This many sets of zeros (a gap in time), kept as a count so that a damaged date
    /// cannot make a large allocation.
    Gap(u64),
}

/// What the stream had to repair so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VdifStreamCounts {
    /// Frame slots read as zeros: missing, in a gap, or marked invalid.
    pub zero_frames: u64,
    /// Frames dated before sets already handed on.
    pub late: u64,
    /// Frames skipped: unreadable or foreign headers, frame numbers beyond the rate, dates far
    /// ahead.
    pub damaged: u64,
    /// Frames of threads the stream does not read.
    pub other_threads: u64,
}

/// An ordered VDIF stream; see the module documentation.
#[derive(Debug)]
pub struct VdifStream<R> {
    input: R,
    name: PathBuf,
    first: VdifHeader,
    threads: Vec<u16>,
    npol: usize,
    fps: u64,
    band: Band,
    level: Vec<f32>,
    header_text: String,
    metadata: Metadata,
    /// Time (frame sets since the epoch) of the next set to hand on.
    next: u64,
    pending: BTreeMap<u64, Set>,
    /// Sets handed on but not yet read, oldest first; `used` samples of the front are read.
    ready: VecDeque<Ready>,
    used: usize,
    /// A frame read while learning the threads, not yet placed.
    held: Vec<(VdifHeader, Vec<u8>)>,
    far_run: u32,
    offset: u64,
    samples: u64,
    counts: VdifStreamCounts,
}

impl<R: Read> VdifStream<R> {
    /// Read the first frame (and, without a THREADS line in the side-car, the first frame
    /// set, to learn the threads) and describe the band. `name` labels errors;
    /// `sidecar` is the text of the side-car (`FREQ`, optional `BW`, `NPOL`, `SAMPLE_RATE`,
    /// `THREADS`, ...).
    ///
    /// # Errors
    /// I/O errors, an unreadable first header or side-car, no sample rate (neither the
    /// headers nor the side-car give one, and a stream cannot wait a second to count frames),
    /// or threads that do not split into the polarisations.
    pub fn new(input: R, name: impl Into<PathBuf>, sidecar: &str) -> Result<Self, ReadError> {
        let name = name.into();
        let header_err = |source| ReadError::Header {
            path: name.clone(),
            offset: 0,
            source,
        };
        let car = VdifSidecar::parse(sidecar).map_err(header_err)?;
        let mut input = input;
        let mut offset = 0;
        let (first, payload) = match read_frame(&mut input, &name, &mut offset, None)? {
            Some(Ok(f)) => f,
            Some(Err(e)) => return Err(header_err(e)),
            None => {
                return Err(ReadError::Truncated {
                    path: name,
                    detail: "the stream ended before a VDIF frame".into(),
                })
            }
        };
        let mut s = VdifStream {
            input,
            name: name.clone(),
            first: first.clone(),
            threads: Vec::new(),
            npol: car.npol,
            fps: 1,
            band: Band::from_total(1.0, 1.0, 1, 1.0, true, 1),
            level: levels(first.bits),
            header_text: String::new(),
            metadata: Metadata {
                source: car.source.clone(),
                telescope: car.telescope.clone(),
                start_mjd: None,
                position: car.position,
            },
            next: 0,
            pending: BTreeMap::new(),
            ready: VecDeque::new(),
            used: 0,
            held: Vec::new(),
            far_run: 0,
            offset,
            samples: 0,
            counts: VdifStreamCounts::default(),
        };
        let spf = first.samples_per_frame() as f64;
        let rate = car.sample_rate_hz.or(first.sample_rate_hz).ok_or_else(|| {
            header_err(HeaderError::Missing {
                format: "VDIF",
                key: "SAMPLE_RATE (the headers do not give it, and a stream cannot wait \
                          for a second boundary to count frames: add `SAMPLE_RATE <MHz>` to \
                          the side-car)"
                    .into(),
            })
        })?;
        s.fps = frames_per_second(rate, spf).map_err(header_err)?;
        s.next = s.when(&first);
        s.metadata.start_mjd = Some(first.epoch_mjd() + s.next as f64 / s.fps as f64 / 86_400.0);
        s.held.push((first, payload));
        s.threads = match &car.threads {
            Some(t) => t.clone(),
            None => {
                // The threads of the first frame set: frames until one dated later.
                let mut seen = BTreeSet::from([s.held[0].0.thread]);
                loop {
                    match s.next_frame()? {
                        Some(Ok((h, p))) => {
                            let later = s.when(&h) != s.next;
                            if !later {
                                seen.insert(h.thread);
                            }
                            s.held.push((h, p));
                            if later {
                                break;
                            }
                        }
                        Some(Err(_)) => s.counts.damaged += 1,
                        None => break,
                    }
                    // Thread ids are below 1024: more frames than that of one set means
                    // damaged dates; what was seen will do.
                    if s.held.len() > 2048 {
                        break;
                    }
                }
                seen.into_iter().collect()
            }
        };
        let nchan = s.threads.len() / car.npol.max(1) * s.first.nchan;
        if nchan > MAX_CHANNELS {
            return Err(header_err(HeaderError::Inconsistent {
                format: "VDIF",
                detail: format!(
                    "{} threads of {} channels make {nchan} channels, more than the {MAX_CHANNELS} \
                     a stream may have",
                    s.threads.len(),
                    s.first.nchan
                ),
            }));
        }
        if s.threads.len() % car.npol != 0 {
            return Err(header_err(HeaderError::Inconsistent {
                format: "VDIF",
                detail: format!(
                    "{} threads do not split into {} polarisations",
                    s.threads.len(),
                    car.npol
                ),
            }));
        }
        let sample_rate_hz = s.fps as f64 * spf;
        s.band = band_of(
            &s.first,
            &car,
            s.threads.len(),
            sample_rate_hz,
            "the side-car",
        )
        .map_err(header_err)?;
        let h0 = &s.first;
        s.header_text = format!(
            "VDIF stream, version {} EDV {} station {:#06x}: {} threads {:?}, {} channel(s) per \
             frame, {}-bit {}, {} samples in {}-byte frames, {} frame sets a second\n{}",
            h0.version,
            h0.edv
                .map_or("none (legacy)".to_string(), |e| e.to_string()),
            h0.station,
            s.threads.len(),
            s.threads,
            h0.nchan,
            h0.bits,
            if h0.complex { "complex" } else { "real" },
            h0.samples_per_frame(),
            h0.frame_bytes,
            s.fps,
            sidecar
        );
        Ok(s)
    }

    /// The band the first frame and the side-car describe.
    pub fn band(&self) -> &Band {
        &self.band
    }

    /// Source, telescope and position from the side-car, start time from the first frame.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// A description of the stream (first header and side-car).
    pub fn header_text(&self) -> &str {
        &self.header_text
    }

    /// Time samples delivered so far.
    pub fn samples_read(&self) -> u64 {
        self.samples
    }

    /// What had to be repaired so far.
    pub fn counts(&self) -> VdifStreamCounts {
        self.counts
    }

    /// Read `n` time samples of every channel and polarisation into `out` from sample `at`
    /// on. Returns how many were read: fewer than `n` only when the stream ended.
    ///
    /// # Errors
    /// I/O errors, and a stream that jumps far ahead in time (see the module documentation).
    ///
    /// # Panics
    /// If `out` does not have the stream's channels and polarisations or `at + n` samples.
    pub fn read_samples(
        &mut self,
        out: &mut Voltages,
        at: usize,
        n: usize,
    ) -> Result<usize, ReadError> {
        super::check_block(out, self.band.nchan(), self.npol, at, n);
        let h = self.first.clone();
        let spf = h.samples_per_frame();
        let bpt = h.bits_per_time();
        let mut done = 0;
        while done < n {
            if self.ready.is_empty() && !self.fill()? {
                break;
            }
            let Some(front) = self.ready.front() else {
                break;
            };
            let (len, set) = match front {
                Ready::Set(set) => (spf, Some(set)),
                Ready::Gap(k) => ((*k as usize).saturating_mul(spf), None),
            };
            let take = (len - self.used).min(n - done);
            let first_bit = self.used * bpt;
            for k in 0..self.threads.len() {
                let pol = k % self.npol;
                let chan0 = k / self.npol * h.nchan;
                match set.and_then(|s| s[k].as_ref()) {
                    Some(p) => {
                        let b0 = first_bit / 8;
                        decode_bits(
                            &h,
                            &self.level,
                            &p[b0..],
                            first_bit - b0 * 8,
                            take,
                            out,
                            chan0,
                            pol,
                            at + done,
                        );
                    }
                    None => {
                        for j in 0..h.nchan {
                            out.series_mut(chan0 + j, pol)[at + done..at + done + take]
                                .fill(Complex32::new(0.0, 0.0));
                        }
                    }
                }
            }
            self.used += take;
            done += take;
            if self.used == len {
                self.ready.pop_front();
                self.used = 0;
            }
        }
        self.samples += done as u64;
        Ok(done)
    }

    /// Frame sets since the epoch of frame `h`.
    fn when(&self, h: &VdifHeader) -> u64 {
        u64::from(h.seconds)
            .saturating_mul(self.fps)
            .saturating_add(u64::from(h.frame_nr))
    }

    /// Read frames until a set is ready to hand on; `false` once the stream has ended and
    /// nothing is left.
    fn fill(&mut self) -> Result<bool, ReadError> {
        while self.ready.is_empty() {
            let frame = if self.held.is_empty() {
                self.next_frame()?
            } else {
                Some(Ok(self.held.remove(0)))
            };
            match frame {
                None => {
                    // The end: hand on what was gathered, gaps between as zeros.
                    let Some(&last) = self.pending.keys().next_back() else {
                        return Ok(false);
                    };
                    self.hand_on(last + 1);
                }
                Some(Err(_)) => self.counts.damaged += 1,
                Some(Ok((h, p))) => self.place(h, p)?,
            }
        }
        Ok(true)
    }

    fn place(&mut self, h: VdifHeader, payload: Vec<u8>) -> Result<(), ReadError> {
        let Some(k) = self.threads.iter().position(|&t| t == h.thread) else {
            self.counts.other_threads += 1;
            return Ok(());
        };
        if u64::from(h.frame_nr) >= self.fps {
            self.counts.damaged += 1;
            return Ok(());
        }
        let t = self.when(&h);
        if t < self.next {
            self.counts.late += 1;
            return Ok(());
        }
        let reach = self.fps.saturating_mul(4).max(1024);
        if t - self.next >= reach {
            self.counts.damaged += 1;
            self.far_run += 1;
            if self.far_run >= FAR_RUN_LIMIT {
                return Err(ReadError::Header {
                    path: self.name.clone(),
                    offset: self.offset,
                    source: HeaderError::Inconsistent {
                        format: "VDIF",
                        detail: format!(
                            "{FAR_RUN_LIMIT} frames in a row are dated {} s or more after \
                             the stream's position: it jumped in time; restart the search \
                             there",
                            reach / self.fps
                        ),
                    },
                });
            }
            return Ok(());
        }
        self.far_run = 0;
        let nt = self.threads.len();
        let set = self.pending.entry(t).or_insert_with(|| Set {
            payload: vec![None; nt],
            seen: 0,
        });
        if set.payload[k].is_none() {
            set.seen += 1;
            if !h.invalid {
                set.payload[k] = Some(payload);
            }
        }
        // Hand on every set that is complete or that frames this much newer have passed.
        let mut upto = t.saturating_sub(REORDER - 1).max(self.next);
        while self.pending.get(&upto).is_some_and(|s| s.seen == nt) {
            upto += 1;
        }
        self.hand_on(upto);
        Ok(())
    }

    /// Hand on every set before time `upto` (absent ones as zeros).
    fn hand_on(&mut self, upto: u64) {
        let nt = self.threads.len() as u64;
        while self.next < upto {
            if let Some(set) = self.pending.remove(&self.next) {
                self.counts.zero_frames +=
                    set.payload.iter().filter(|p| p.is_none()).count() as u64;
                self.ready.push_back(Ready::Set(set.payload));
                self.next += 1;
                continue;
            }
            let end = self
                .pending
                .range(self.next..)
                .next()
                .map_or(upto, |(&t, _)| t.min(upto));
            self.counts.zero_frames += (end - self.next) * nt;
            self.ready.push_back(Ready::Gap(end - self.next));
            self.next = end;
        }
    }

    /// The next frame of the stream (see [`read_frame`]).
    #[allow(clippy::type_complexity)]
    fn next_frame(
        &mut self,
    ) -> Result<Option<Result<(VdifHeader, Vec<u8>), HeaderError>>, ReadError> {
        read_frame(
            &mut self.input,
            &self.name,
            &mut self.offset,
            Some(&self.first),
        )
    }
}

/// The next frame of `input`: `None` at a clean end of stream (a frame cut short by the end counts
/// as the end); `Some(Err)` for a frame whose header cannot be read or, given `like`,
/// does not belong to the same stream (its bytes, as long as `like`'s frames, are
/// skipped).
#[allow(clippy::type_complexity)]
fn read_frame(
    input: &mut impl Read,
    name: &Path,
    offset: &mut u64,
    like: Option<&VdifHeader>,
) -> Result<Option<Result<(VdifHeader, Vec<u8>), HeaderError>>, ReadError> {
    let io = |e| ReadError::io(name, e);
    let mut head = [0u8; 32];
    let got = read_up_to(input, &mut head[..16]).map_err(io)?;
    if got < 16 {
        return Ok(None);
    }
    let legacy = head[3] >> 6 & 1 == 1;
    let hlen = match like {
        Some(f) => f.header_bytes(),
        None if legacy => 16,
        None => 32,
    };
    if hlen == 32 && read_up_to(input, &mut head[16..]).map_err(io)? < 16 {
        return Ok(None);
    }
    let parsed = VdifHeader::parse(&head[..hlen]).and_then(|h| match like {
        Some(f) if !f.same_stream(&h) => Err(HeaderError::Inconsistent {
            format: "VDIF",
            detail: "a frame changes length, channels, sample size or station".into(),
        }),
        _ => Ok(h),
    });
    let payload_len = match (&parsed, like) {
        (_, Some(f)) => f.payload_bytes(),
        (Ok(h), None) => h.payload_bytes(),
        (Err(e), None) => return Ok(Some(Err(e.clone()))),
    };
    let mut payload = vec![0u8; payload_len];
    let n = read_up_to(input, &mut payload).map_err(io)?;
    *offset += (hlen + n) as u64;
    if n < payload_len {
        return Ok(None);
    }
    Ok(Some(parsed.map(|h| (h, payload))))
}

/// VDIF frames arriving as UDP datagrams, one frame each, as e-VLBI systems send them,
/// optionally after an 8-byte packet sequence number (the VTP form), read as an ordered byte
/// stream of frames for [`VdifStream`]. Which form is told from each datagram: a frame whose
/// header's length is the datagram's, or one 8 bytes in whose length is the rest. A datagram
/// of neither form is dropped and counted. The stream ends when no datagram has come for
/// `idle` after the first.
///
/// A capture thread does nothing but take datagrams off the socket into a queue (at most
/// [`UDP_QUEUE_BYTES`]), so that a reader busy elsewhere for a while does not make the
/// kernel's socket buffer overflow.
#[derive(Debug)]
pub struct UdpFrames {
    queue: std::sync::mpsc::Receiver<Datagram>,
    queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    counts: std::sync::Arc<std::sync::Mutex<(u64, u64, u64)>>,
    frame: Vec<u8>,
    at: usize,
    ended: bool,
}

/// Bytes of datagrams the capture thread holds for the reader at most; more are dropped.
pub const UDP_QUEUE_BYTES: usize = 256 << 20;

#[derive(Debug)]
enum Datagram {
    Frame(Vec<u8>),
    End(Option<std::io::Error>),
}

impl UdpFrames {
    /// Read frames from `socket` (bound by the caller), ending after `idle` without one.
    ///
    /// # Errors
    /// If the socket's timeout cannot be set or the capture thread cannot start.
    pub fn new(socket: std::net::UdpSocket, idle: std::time::Duration) -> std::io::Result<Self> {
        use std::sync::atomic::Ordering;
        socket.set_read_timeout(None)?;
        let idle = idle.max(std::time::Duration::from_millis(1));
        let (tx, queue) = std::sync::mpsc::channel();
        let queued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counts = std::sync::Arc::new(std::sync::Mutex::new((0, 0, 0)));
        let (q, c) = (queued.clone(), counts.clone());
        std::thread::Builder::new()
            .name("udp-capture".into())
            .spawn(move || {
                let mut buf = vec![0u8; 65536];
                let mut started = false;
                let end = loop {
                    let n = match socket.recv(&mut buf) {
                        Ok(n) => n,
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            break None
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => break Some(e),
                    };
                    if !started {
                        started = true;
                        if let Err(e) = socket.set_read_timeout(Some(idle)) {
                            break Some(e);
                        }
                    }
                    let mut counts = c.lock().unwrap_or_else(|p| p.into_inner());
                    match UdpFrames::frame_start(&buf, n) {
                        Some(skip) if q.load(Ordering::Relaxed) + n <= UDP_QUEUE_BYTES => {
                            counts.0 += 1;
                            counts.2 += u64::from(skip > 0);
                            q.fetch_add(n - skip, Ordering::Relaxed);
                            if tx.send(Datagram::Frame(buf[skip..n].to_vec())).is_err() {
                                return; // the reader is gone
                            }
                        }
                        _ => counts.1 += 1,
                    }
                };
                let _ = tx.send(Datagram::End(end));
            })?;
        Ok(UdpFrames {
            queue,
            queued,
            counts,
            frame: Vec::new(),
            at: 0,
            ended: false,
        })
    }

    /// Frames taken, datagrams dropped (neither a frame nor a numbered frame, or the queue
    /// full), and frames that came with a sequence number.
    pub fn counts(&self) -> (u64, u64, u64) {
        *self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the frame of a datagram of `n` bytes in `buf` starts, if it holds one.
    fn frame_start(buf: &[u8], n: usize) -> Option<usize> {
        [0, 8].into_iter().find(|&skip| {
            n > skip && VdifHeader::parse(&buf[skip..n]).is_ok_and(|h| h.frame_bytes == n - skip)
        })
    }
}

impl Read for UdpFrames {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.frame.len() {
            if self.ended {
                return Ok(0);
            }
            match self.queue.recv() {
                Ok(Datagram::Frame(f)) => {
                    self.queued
                        .fetch_sub(f.len(), std::sync::atomic::Ordering::Relaxed);
                    self.frame = f;
                    self.at = 0;
                }
                Ok(Datagram::End(None)) | Err(_) => self.ended = true,
                Ok(Datagram::End(Some(e))) => {
                    self.ended = true;
                    return Err(e);
                }
            }
        }
        let k = out.len().min(self.frame.len() - self.at);
        out[..k].copy_from_slice(&self.frame[self.at..self.at + k]);
        self.at += k;
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::BasebandReader;

    /// Frames of a VDIF file written by `write_vdif`, with their headers parsed.
    fn frames_of(bytes: &[u8]) -> Vec<(VdifHeader, &[u8])> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            let h = VdifHeader::parse(&bytes[pos..]).unwrap();
            out.push((h.clone(), &bytes[pos..pos + h.frame_bytes]));
            pos += h.frame_bytes;
        }
        out
    }

    fn write(dir: &std::path::Path, sidecar: &str) -> (PathBuf, Vec<u8>) {
        let file = dir.join("s.vdif");
        let cfg = crate::simulate::SimConfig {
            nchan: 2,
            npol: 2,
            bandwidth_mhz: 2.0,
            nsamples: 8192,
            ..Default::default()
        };
        crate::simulate::write_simulation(&cfg, crate::simulate::SimFormat::Vdif8, &file).unwrap();
        if !sidecar.is_empty() {
            std::fs::write(VdifSidecar::path_of(&file), sidecar).unwrap();
        }
        let bytes = std::fs::read(&file).unwrap();
        (file, bytes)
    }

    fn read_all<R: Read>(s: &mut VdifStream<R>, nsamp: usize) -> Voltages {
        let b = s.band().clone();
        let mut out = Voltages::zeros(b.nchan(), b.npol, nsamp + 100);
        let mut at = 0;
        for chunk in [1, 777, 4000, 10000] {
            at += s
                .read_samples(&mut out, at, chunk.min(nsamp + 100 - at))
                .unwrap();
        }
        assert_eq!(at, nsamp, "samples read");
        out
    }

    #[test]
    fn a_stream_reads_what_the_file_reader_reads_with_frames_reordered_lost_and_damaged() {
        let dir = std::env::temp_dir().join(format!("psr-vdif-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (file, bytes) = write(&dir, "");
        let car = std::fs::read_to_string(VdifSidecar::path_of(&file)).unwrap();
        let mut reader = BasebandReader::open(&file).unwrap();
        let n = reader.band().nchan();
        let whole = reader.read(0, reader.nsamples() as usize).unwrap();
        let total = reader.nsamples() as usize;

        // In order: the same samples.
        let mut s = VdifStream::new(&bytes[..], "<test>", &car).unwrap();
        assert_eq!(s.band(), reader.band());
        let got = read_all(&mut s, total);
        for c in 0..n {
            for p in 0..2 {
                assert_eq!(&got.series(c, p)[..total], whole.series(c, p), "c{c} p{p}");
            }
        }
        assert_eq!(s.counts(), VdifStreamCounts::default());

        // Threads of each set reversed, frame 5 of thread 0 lost, frame 9 damaged (its
        // header claims 1-bit samples), a stale copy of frame 0 late, and a frame
        // dated 10^6 s ahead.
        let frames = frames_of(&bytes);
        let nt = frames
            .iter()
            .map(|f| f.0.thread)
            .collect::<BTreeSet<_>>()
            .len();
        let mut mixed: Vec<u8> = Vec::new();
        for (i, set) in frames.chunks(nt).enumerate() {
            for (j, (h, f)) in set.iter().enumerate().rev() {
                if i == 5 && j == 0 {
                    continue;
                }
                if i == 9 && j == 1 {
                    let mut bad = h.clone();
                    bad.bits = 1;
                    mixed.extend(bad.to_bytes());
                    mixed.extend(&f[bad.header_bytes()..]);
                    continue;
                }
                mixed.extend(*f);
            }
            if i == 12 {
                mixed.extend(frames[0].1);
                let mut far = frames[1].0.clone();
                far.seconds += 1_000_000;
                mixed.extend(far.to_bytes());
                mixed.extend(&frames[1].1[far.header_bytes()..]);
            }
        }
        let mut s = VdifStream::new(&mixed[..], "<test>", &car).unwrap();
        let got = read_all(&mut s, total);
        let spf = frames[0].0.samples_per_frame();
        let (lost_k, damaged_k) = (0usize, 1usize);
        for k in 0..nt {
            let (c, p) = (k / 2, k % 2);
            for t in 0..total {
                let set = t / spf;
                let zero = (set == 5 && k == lost_k) || (set == 9 && k == damaged_k);
                let want = if zero {
                    Complex32::new(0.0, 0.0)
                } else {
                    whole.series(c, p)[t]
                };
                assert_eq!(got.series(c, p)[t], want, "thread slot {k} sample {t}");
            }
        }
        assert_eq!(
            s.counts(),
            VdifStreamCounts {
                zero_frames: 2,
                late: 1,
                damaged: 2,
                other_threads: 0
            }
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_stream_needs_a_sample_rate_and_a_frequency() {
        let dir = std::env::temp_dir().join(format!("psr-vdif-stream-e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (file, bytes) = write(&dir, "");
        let car = std::fs::read_to_string(VdifSidecar::path_of(&file)).unwrap();
        let no_rate: String = car
            .lines()
            .filter(|l| !l.starts_with("SAMPLE_RATE"))
            .map(|l| format!("{l}\n"))
            .collect();
        let e = VdifStream::new(&bytes[..], "<test>", &no_rate).unwrap_err();
        assert!(format!("{e:#}").contains("bad header"), "{e:#}");
        assert!(
            format!("{:?}", e).contains("SAMPLE_RATE"),
            "the error names SAMPLE_RATE: {e:?}"
        );
        let no_freq: String = car
            .lines()
            .filter(|l| !l.starts_with("FREQ"))
            .map(|l| format!("{l}\n"))
            .collect();
        let e = VdifStream::new(&bytes[..], "<test>", &no_freq).unwrap_err();
        assert!(format!("{:?}", e).contains("FREQ"), "{e:?}");
        let e = VdifStream::new(&bytes[..0], "<test>", &car).unwrap_err();
        assert!(e.to_string().contains("ended before a VDIF frame"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Damaged bytes anywhere after the first frame, and random first bytes, give errors
    /// or zeros, never a panic or a runaway allocation.
    #[test]
    fn damaged_streams_never_panic() {
        use rand::{Rng, SeedableRng};
        let dir = std::env::temp_dir().join(format!("psr-vdif-stream-f-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (file, bytes) = write(&dir, "");
        let car = std::fs::read_to_string(VdifSidecar::path_of(&file)).unwrap();
        let frame = VdifHeader::parse(&bytes).unwrap().frame_bytes;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..300 {
            let mut b = bytes.clone();
            let from = if round % 10 == 0 { 0 } else { frame };
            for _ in 0..rng.gen_range(1..40) {
                let i = rng.gen_range(from..b.len());
                // Mostly header bytes, where damage changes framing and dates.
                let i = if rng.gen_bool(0.7) {
                    i - i % frame + i % 32
                } else {
                    i
                };
                b[i] = rng.gen();
            }
            b.truncate(rng.gen_range(b.len() / 2..=b.len()));
            let Ok(mut s) = VdifStream::new(&b[..], "<fuzz>", &car) else {
                continue;
            };
            let band = s.band().clone();
            if band.nchan() > 64 {
                // A damaged first header with many channels: too big a test buffer.
                continue;
            }
            let mut out = Voltages::zeros(band.nchan(), band.npol, 4096);
            let mut total = 0u64;
            loop {
                match s.read_samples(&mut out, 0, 4096) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n as u64,
                }
                // A damaged date may add up to 4 s of zeros, not more per frame.
                assert!(total < 1 << 26, "round {round}: {total} samples");
            }
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        for _ in 0..300 {
            let junk: Vec<u8> = (0..rng.gen_range(0..4096)).map(|_| rng.gen()).collect();
            if let Ok(s) = VdifStream::new(&junk[..], "<junk>", &car) {
                assert!(s.band().nchan() <= MAX_CHANNELS);
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Datagrams with and without a sequence number become one stream of frames; a datagram
    /// of neither form is dropped; the stream ends once they stop.
    #[test]
    fn udp_datagrams_become_frames() {
        let dir = std::env::temp_dir().join(format!("psr-vdif-udp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (_, bytes) = write(&dir, "");
        let frames = frames_of(&bytes);
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let mut want = Vec::new();
        for (i, (_, f)) in frames.iter().take(40).enumerate() {
            if i % 2 == 0 {
                tx.send(f).unwrap();
            } else {
                let mut d = (i as u64).to_le_bytes().to_vec();
                d.extend_from_slice(f);
                tx.send(&d).unwrap();
            }
            want.extend_from_slice(f);
            if i == 10 {
                tx.send(&f[..50]).unwrap();
            }
        }
        let mut udp = UdpFrames::new(rx, std::time::Duration::from_millis(200)).unwrap();
        let mut got = Vec::new();
        udp.read_to_end(&mut got).unwrap();
        assert_eq!(got, want);
        assert_eq!(udp.counts(), (40, 1, 20));
        std::fs::remove_dir_all(&dir).ok();
    }
}
