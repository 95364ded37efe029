//! Where each (time, channel, polarisation) sample sits in a payload, and decoding of it.
//!
//! Both baseband formats store dense arrays whose axes differ only in order (DADA: time,
//! polarisation, channel by default, or whatever `ORDER` says; GUPPI: channel, time,
//! polarisation), so one stride-based reader serves both.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::ops::Range;

use rustfft::num_complex::Complex32;

use super::{read_up_to, Frame};
use crate::voltages::Voltages;

/// Encoding of one real number (one component of a complex sample).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleFormat {
    /// Two's-complement 8-bit integer.
    Int8,
    /// Two's-complement 16-bit integer, little endian.
    Int16,
    /// IEEE 754 single precision, little endian.
    Float32,
}

impl SampleFormat {
    /// Bytes per component.
    pub fn bytes(self) -> usize {
        match self {
            SampleFormat::Int8 => 1,
            SampleFormat::Int16 => 2,
            SampleFormat::Float32 => 4,
        }
    }

    /// Bits per component, as headers give it.
    pub fn bits(self) -> u32 {
        self.bytes() as u32 * 8
    }
}

/// An axis of a payload array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    /// Time.
    Time,
    /// Frequency channel.
    Chan,
    /// Polarisation.
    Pol,
}

/// Byte strides of a payload, the real/imaginary pair always innermost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Channels.
    pub nchan: usize,
    /// Polarisations.
    pub npol: usize,
    /// Complex (two components per sample) or real.
    pub complex: bool,
    /// Encoding of each component.
    pub sample: SampleFormat,
    /// Bytes between consecutive times.
    pub stride_t: usize,
    /// Bytes between consecutive channels.
    pub stride_c: usize,
    /// Bytes between consecutive polarisations.
    pub stride_p: usize,
}

impl Layout {
    /// A dense layout with axes in `order`, slowest first.
    pub fn dense(
        order: [Axis; 3],
        nsamp: usize,
        nchan: usize,
        npol: usize,
        complex: bool,
        sample: SampleFormat,
    ) -> Layout {
        let elem = sample.bytes() * if complex { 2 } else { 1 };
        let mut layout = Layout {
            nchan,
            npol,
            complex,
            sample,
            stride_t: 0,
            stride_c: 0,
            stride_p: 0,
        };
        let mut stride = elem;
        for axis in order.iter().rev() {
            match axis {
                Axis::Time => {
                    layout.stride_t = stride;
                    stride *= nsamp;
                }
                Axis::Chan => {
                    layout.stride_c = stride;
                    stride *= nchan;
                }
                Axis::Pol => {
                    layout.stride_p = stride;
                    stride *= npol;
                }
            }
        }
        layout
    }

    /// Bytes of one complete sample (all channels and polarisations at one time).
    pub fn bytes_per_time(&self) -> usize {
        self.elem_bytes() * self.nchan * self.npol
    }

    /// Bytes of one (channel, polarisation) sample.
    pub fn elem_bytes(&self) -> usize {
        self.sample.bytes() * if self.complex { 2 } else { 1 }
    }

    pub(crate) fn decode(&self, b: &[u8]) -> Complex32 {
        match (self.sample, self.complex) {
            (SampleFormat::Int8, true) => Complex32::new(b[0] as i8 as f32, b[1] as i8 as f32),
            (SampleFormat::Int8, false) => Complex32::new(b[0] as i8 as f32, 0.0),
            (SampleFormat::Int16, true) => Complex32::new(
                i16::from_le_bytes([b[0], b[1]]) as f32,
                i16::from_le_bytes([b[2], b[3]]) as f32,
            ),
            (SampleFormat::Int16, false) => {
                Complex32::new(i16::from_le_bytes([b[0], b[1]]) as f32, 0.0)
            }
            (SampleFormat::Float32, true) => Complex32::new(
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                f32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            ),
            (SampleFormat::Float32, false) => {
                Complex32::new(f32::from_le_bytes([b[0], b[1], b[2], b[3]]), 0.0)
            }
        }
    }

    /// Encode one sample (rounding and clipping to the integer range for integers).
    pub fn encode(&self, v: Complex32, out: &mut Vec<u8>) {
        let q = |x: f32| x.round().clamp(-128.0, 127.0) as i8 as u8;
        let q16 = |x: f32| (x.round().clamp(-32768.0, 32767.0) as i16).to_le_bytes();
        match (self.sample, self.complex) {
            (SampleFormat::Int8, true) => out.extend_from_slice(&[q(v.re), q(v.im)]),
            (SampleFormat::Int8, false) => out.push(q(v.re)),
            (SampleFormat::Int16, true) => {
                out.extend_from_slice(&q16(v.re));
                out.extend_from_slice(&q16(v.im));
            }
            (SampleFormat::Int16, false) => out.extend_from_slice(&q16(v.re)),
            (SampleFormat::Float32, true) => {
                out.extend_from_slice(&v.re.to_le_bytes());
                out.extend_from_slice(&v.im.to_le_bytes());
            }
            (SampleFormat::Float32, false) => out.extend_from_slice(&v.re.to_le_bytes()),
        }
    }
}

/// Decode times `t` (frame-relative) of `frame` into `out` starting at `out_offset`.
pub(crate) fn read_frame_range(
    file: &mut File,
    frame: &Frame,
    t: Range<usize>,
    out: &mut Voltages,
    out_offset: usize,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    let l = &frame.layout;
    let n = t.end - t.start;
    if n == 0 {
        return Ok(());
    }
    // Axes with a stride larger than time's are "outer": each index of them is a separate
    // contiguous run in the file. The others are interleaved within each time step.
    let chan_outer = l.stride_c > l.stride_t;
    let pol_outer = l.stride_p > l.stride_t;
    let span = n * l.stride_t;
    let elem = l.elem_bytes();
    scratch.resize(span, 0);
    for co in 0..if chan_outer { l.nchan } else { 1 } {
        for po in 0..if pol_outer { l.npol } else { 1 } {
            let offset = frame.payload_offset
                + (co * l.stride_c + po * l.stride_p + t.start * l.stride_t) as u64;
            file.seek(SeekFrom::Start(offset))?;
            let got = read_up_to(file, &mut scratch[..span])?;
            if got < span {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("payload ends {} bytes early at offset {offset}", span - got),
                ));
            }
            let chans = if chan_outer { co..co + 1 } else { 0..l.nchan };
            for c in chans {
                let pols = if pol_outer { po..po + 1 } else { 0..l.npol };
                for p in pols {
                    let base = if chan_outer { 0 } else { c * l.stride_c }
                        + if pol_outer { 0 } else { p * l.stride_p };
                    let dst = &mut out.series_mut(c, p)[out_offset..out_offset + n];
                    for (i, d) in dst.iter_mut().enumerate() {
                        let at = base + i * l.stride_t;
                        *d = l.decode(&scratch[at..at + elem]);
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_strides() {
        // GUPPI 1SFA: channel, time, polarisation; complex int8.
        let l = Layout::dense(
            [Axis::Chan, Axis::Time, Axis::Pol],
            1024,
            4,
            2,
            true,
            SampleFormat::Int8,
        );
        assert_eq!((l.stride_p, l.stride_t, l.stride_c), (2, 4, 4096));
        // DADA default: time, polarisation, channel; complex float.
        let l = Layout::dense(
            [Axis::Time, Axis::Pol, Axis::Chan],
            10,
            3,
            2,
            true,
            SampleFormat::Float32,
        );
        assert_eq!((l.stride_c, l.stride_p, l.stride_t), (8, 24, 48));
        assert_eq!(l.bytes_per_time(), 48);
    }

    #[test]
    fn encode_decode_roundtrip_and_clip() {
        let l = Layout::dense(
            [Axis::Time, Axis::Pol, Axis::Chan],
            1,
            1,
            1,
            true,
            SampleFormat::Int8,
        );
        let mut buf = Vec::new();
        l.encode(Complex32::new(-3.4, 300.0), &mut buf);
        assert_eq!(l.decode(&buf), Complex32::new(-3.0, 127.0));
        let w = Layout {
            sample: SampleFormat::Int16,
            ..l
        };
        buf.clear();
        w.encode(Complex32::new(-300.4, 1e6), &mut buf);
        assert_eq!(buf.len(), 4);
        assert_eq!(buf[..2], (-300i16).to_le_bytes());
        assert_eq!(w.decode(&buf), Complex32::new(-300.0, 32767.0));
        let f = Layout {
            sample: SampleFormat::Float32,
            complex: false,
            ..l
        };
        buf.clear();
        f.encode(Complex32::new(1.25, 9.0), &mut buf);
        assert_eq!(f.decode(&buf), Complex32::new(1.25, 0.0));
    }
}
