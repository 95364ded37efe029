//! A GUPPI RAW stream read in order, from a pipe or a socket: blocks of a card header and
//! `BLOCSIZE` payload bytes, as `hashpipe`-style recorders write them.
//!
//! A `1SFA` block is channel-major, so nothing in it can be decoded before all of it has
//! arrived: the stream holds one block (its latency and its memory). `OVERLAP` is read
//! as the file reader reads it: the last `OVERLAP` samples of a block repeat at the start
//! of the next, so they are held back until the next header shows whether another block
//! follows (then they are dropped) or the stream ends (then they are delivered). A last
//! block cut short is dropped, as the file reader drops it, and reported.

use std::io::Read;
use std::path::PathBuf;

use super::guppi::{GuppiHeader, GuppiParams, LAYOUT_CHANGED};
use super::layout::Layout;
use super::{read_up_to, HeaderError, Metadata, ReadError};
use crate::band::Band;
use crate::voltages::Voltages;

/// Largest block accepted: above it a damaged `BLOCSIZE` would claim all memory.
/// Breakthrough Listen writes 128 MiB blocks.
const MAX_BLOCK: u64 = 1 << 30;

/// One block read from the stream.
struct Block {
    params: GuppiParams,
    /// What the header says of the observation.
    metadata: Metadata,
    /// Header and payload bytes.
    bytes: u64,
}

/// An ordered GUPPI RAW stream; see the module documentation.
#[derive(Debug)]
pub struct GuppiStream<R> {
    input: R,
    name: PathBuf,
    /// The first block's values, which later blocks must keep.
    params: GuppiParams,
    band: Band,
    layout: Layout,
    /// Payload of the current block.
    block: Vec<u8>,
    /// Time samples in the current block, overlap included.
    in_block: usize,
    /// Next sample of the current block to deliver.
    pos: usize,
    /// Samples of the current block that may be delivered: all but its overlap until the
    /// stream is known to end after it.
    usable: usize,
    /// No block follows the current one.
    ended: bool,
    /// Bytes consumed so far, for error offsets.
    offset: u64,
    samples: u64,
    /// A last block cut short and dropped, in words.
    dropped: Option<String>,
    metadata: Metadata,
}

impl<R: Read> GuppiStream<R> {
    /// Read the first block. `name` (`<stdin>`, an address) labels errors.
    ///
    /// # Errors
    /// I/O errors, an invalid header, or a stream that ends before its first block does.
    pub fn new(mut input: R, name: impl Into<PathBuf>) -> Result<Self, ReadError> {
        let name = name.into();
        let mut block = Vec::new();
        let first = match read_block(&mut input, &name, 0, None, &mut block)? {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Err(ReadError::Truncated {
                    path: name,
                    detail: "the stream ended before a GUPPI header".into(),
                })
            }
            Err(detail) => return Err(ReadError::Truncated { path: name, detail }),
        };
        let params = first.params;
        let in_block = params.samples_per_block();
        Ok(GuppiStream {
            input,
            name,
            band: params.band(),
            layout: params.layout(),
            block,
            in_block,
            pos: 0,
            usable: in_block - params.overlap.min(in_block),
            ended: false,
            offset: first.bytes,
            samples: 0,
            dropped: None,
            params,
            metadata: first.metadata,
        })
    }

    /// The band the first header describes.
    pub fn band(&self) -> &Band {
        &self.band
    }

    /// Source, telescope, position and start time the first header gives.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The validated values of the first header.
    pub fn params(&self) -> &GuppiParams {
        &self.params
    }

    /// Time samples delivered so far.
    pub fn samples_read(&self) -> u64 {
        self.samples
    }

    /// A last block that was cut short and dropped, in words.
    pub fn dropped_block(&self) -> Option<&str> {
        self.dropped.as_deref()
    }

    /// Read `n` time samples of every channel and polarisation into `out` from sample
    /// `at` on. Returns how many were read: fewer than `n` only when the stream ended.
    ///
    /// # Errors
    /// I/O errors, and a later header that is invalid or describes a different layout.
    ///
    /// # Panics
    /// If `out` does not have the stream's channels and polarisations or `at + n` samples.
    pub fn read_samples(
        &mut self,
        out: &mut Voltages,
        at: usize,
        n: usize,
    ) -> Result<usize, ReadError> {
        super::check_block(out, self.params.nchan, self.params.npol, at, n);
        let mut done = 0;
        while done < n {
            if self.pos == self.usable {
                if self.ended || !self.advance()? {
                    break;
                }
                continue;
            }
            let k = (n - done).min(self.usable - self.pos);
            self.decode(out, at + done, k);
            self.pos += k;
            done += k;
        }
        self.samples += done as u64;
        Ok(done)
    }

    fn decode(&self, out: &mut Voltages, at: usize, n: usize) {
        let l = &self.layout;
        let elem = l.elem_bytes();
        for c in 0..l.nchan {
            for p in 0..l.npol {
                let base = c * l.stride_c + p * l.stride_p + self.pos * l.stride_t;
                let dst = &mut out.series_mut(c, p)[at..at + n];
                for (t, d) in dst.iter_mut().enumerate() {
                    let i = base + t * l.stride_t;
                    *d = l.decode(&self.block[i..i + elem]);
                }
            }
        }
    }

    /// The current block is used up to its overlap: read the next one (which starts with
    /// the samples held back), or at the end of the stream make the overlap usable.
    /// `false` when nothing is left.
    fn advance(&mut self) -> Result<bool, ReadError> {
        let at = self.offset;
        let next = read_block(
            &mut self.input,
            &self.name,
            at,
            Some(&self.params),
            &mut self.block,
        )?;
        match next {
            Ok(Some(b)) => {
                self.offset += b.bytes;
                self.layout = b.params.layout();
                self.in_block = b.params.samples_per_block();
                self.usable = self.in_block - b.params.overlap.min(self.in_block);
                self.pos = 0;
                Ok(true)
            }
            Ok(None) | Err(_) => {
                if let Err(detail) = next {
                    self.dropped = Some(detail);
                }
                // The current block's payload was overwritten only if the next one was
                // read whole, so its held-back samples are still there.
                self.ended = true;
                let more = self.usable < self.in_block;
                self.usable = self.in_block;
                Ok(more)
            }
        }
    }
}

/// Read a header and its payload into `payload`. `Ok(Ok(None))` at a clean end of
/// stream, `Ok(Err(why))` for a block cut short by the end of the stream (`payload` then
/// keeps what it held before). `first`: the first block's values, which later blocks must
/// keep.
fn read_block(
    input: &mut impl Read,
    name: &std::path::Path,
    at: u64,
    first: Option<&GuppiParams>,
    payload: &mut Vec<u8>,
) -> Result<Result<Option<Block>, String>, ReadError> {
    let bad = |source| ReadError::Header {
        path: name.to_path_buf(),
        offset: at,
        source,
    };
    let (header, ncards) = match GuppiHeader::read_from(input) {
        Ok(None) => return Ok(Ok(None)),
        Ok(Some(Ok(h))) => h,
        Ok(Some(Err(HeaderError::Malformed { detail, .. }))) if detail.contains("ends inside") => {
            return Ok(Err(format!(
                "the stream ended inside the header at byte {at}"
            )))
        }
        Ok(Some(Err(e))) => return Err(bad(e)),
        Err(e) => return Err(ReadError::io(name, e)),
    };
    let params = header.params().map_err(bad)?;
    if params.blocsize > MAX_BLOCK {
        return Err(bad(HeaderError::invalid(
            "GUPPI",
            "BLOCSIZE",
            params.blocsize.to_string(),
            "at most 1 GiB in a stream",
        )));
    }
    if first.is_some_and(|f| !f.same_layout(&params)) {
        return Err(bad(HeaderError::Inconsistent {
            format: "GUPPI",
            detail: LAYOUT_CHANGED.into(),
        }));
    }
    // The cards are read; DIRECTIO pads the header to 512 bytes.
    let cards = ncards * 80;
    let padding = match cards % 512 {
        r if params.directio && r != 0 => (512 - r) as u64,
        _ => 0,
    };
    let skipped = std::io::copy(&mut input.take(padding), &mut std::io::sink())
        .map_err(|e| ReadError::io(name, e))?;
    let mut data = vec![0u8; params.blocsize as usize];
    let got = read_up_to(input, &mut data).map_err(|e| ReadError::io(name, e))?;
    if skipped < padding || got < data.len() {
        return Ok(Err(format!(
            "the last block, at byte {at}, announces BLOCSIZE {} but the stream ended after \
             {got} payload bytes: dropped",
            params.blocsize
        )));
    }
    *payload = data;
    Ok(Ok(Some(Block {
        bytes: cards as u64 + padding + params.blocsize,
        metadata: super::guppi::metadata_of(&header, &params).0,
        params,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fuzz;
    use crate::format::guppi::write_guppi;
    use rand::{Rng, SeedableRng};

    #[test]
    fn damaged_guppi_streams_never_panic() {
        let mut v = Voltages::zeros(2, 2, 300);
        for c in 0..2 {
            for p in 0..2 {
                for (t, z) in v.series_mut(c, p).iter_mut().enumerate() {
                    *z = rustfft::num_complex::Complex32::new((t % 50) as f32, c as f32);
                }
            }
        }
        let mut t = GuppiHeader::default();
        t.set_num("OBSFREQ", 800.0);
        t.set_num("OBSBW", 2.0);
        t.set_num("TBIN", 1e-6);
        t.set_num("DIRECTIO", 1.0);
        let mut bytes = Vec::new();
        write_guppi(&mut bytes, &t, &v, 100).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let mut opened = 0;
        for _ in 0..400 {
            let b = fuzz::damage(&bytes, &mut rng, 12, |rng| rng.gen_range(0..bytes.len()));
            let Ok(mut s) = GuppiStream::new(&b[..], "<fuzz>") else {
                continue;
            };
            opened += 1;
            let shape = (s.params().nchan, s.params().npol);
            fuzz::drain(shape, 64, b.len(), |out| s.read_samples(out, 0, 64));
        }
        assert!(opened >= 40, "only {opened} of 400 damaged streams opened");
        for _ in 0..300 {
            let junk: Vec<u8> = (0..rng.gen_range(0..3000)).map(|_| rng.gen()).collect();
            let _ = GuppiStream::new(&junk[..], "<junk>");
        }
    }
}
