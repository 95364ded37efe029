//! Messages of the distributed search as byte vectors: a kind byte, then little-endian
//! fields. Every message between client and server travels on one tag; the kind in the body
//! says what it is (the SC99 fix for a wildcard receive swallowing other traffic).
//!
//! Voltage blocks read from 8-bit files hold small integers; they travel as one signed byte
//! per component when every value converts back to exactly the same `f32` bits, otherwise as
//! `f32`. The client's block is therefore bit-for-bit the server's.

use rustfft::num_complex::Complex32;

use crate::periodicity::SpectralCandidate;
use crate::voltages::Voltages;

/// The single tag every service message uses.
pub(crate) const TAG: i32 = 6;

/// One message.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Msg {
    /// Client → server: send me this unit (request/reply mode).
    Request { block: u64 },
    /// Server → client: a unit's input.
    Data { block: u64, voltages: Voltages },
    /// Client → server (or server → root): a unit's detected power, `[dm][chan][sample]`.
    Result { block: u64, power: Vec<f32> },
    /// Client → server: all units done. Seconds computing, waiting for data, and of CPU
    /// during the service.
    SignOff {
        busy_s: f64,
        idle_s: f64,
        cpu_s: f64,
    },
    /// Server → root: my clients are done. My CPU seconds during the service; per client
    /// `(world rank, finish s, busy s, idle s, units computed, CPU s)`.
    ServerDone {
        cpu_s: f64,
        clients: Vec<(u64, f64, f64, f64, u64, f64)>,
    },
    /// Root → client: bandwidth probe of `len` bytes (answer with `Echo`).
    Probe { payload: Vec<u8> },
    /// Client → root: probe received.
    Echo,
    /// Root → client: probing over.
    ProbeEnd,
    /// Root → worker: a DM's series to search for periodicities.
    Series {
        dm_index: u64,
        tsamp_s: f64,
        data: Vec<f32>,
    },
    /// Root → worker: no more series.
    SeriesEnd,
    /// Worker → root: the detections of one DM, in the order the search made them.
    Detections {
        dm_index: u64,
        list: Vec<SpectralCandidate>,
    },
    /// Streaming master → stage ranks: the input ended after `blocks` blocks holding
    /// `samples` samples per channel (sub-channel samples where the master splits channels;
    /// the last block padded with zeros where the data did not fill it; 0 where not known).
    StreamEnd { blocks: u64, samples: u64 },
    /// Streaming stage 2 → master: `block` is reassembled in order (its result is out).
    Ack { block: u64 },
    /// Client → server (dynamic mode): send me whichever unit you choose.
    Next,
    /// Server → client (dynamic mode): no unit for you; ask no more.
    Drained,
    /// Server → root (dynamic mode): which unit should `client` compute next? The root holds
    /// every client's queue, so units move between servers' clients too.
    Want { client: u64 },
    /// Root → server (dynamic mode): the answer to a `Want`: a unit, or none (drained).
    Grant { client: u64, block: Option<u64> },
    /// Root → server (dynamic mode): every `Want` of yours is answered; the service is over.
    ServiceOver,
}

/// A message that does not decode.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("malformed service message: {0}")]
pub struct DecodeError(pub String);

impl Msg {
    /// The message as bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        match self {
            Msg::Request { block } => {
                w.u8(1);
                w.u64(*block);
            }
            Msg::Data { block, voltages } => {
                w.u8(2);
                w.u64(*block);
                encode_voltages(&mut w, voltages);
            }
            Msg::Result { block, power } => {
                w.u8(3);
                w.u64(*block);
                w.f32s(power);
            }
            Msg::SignOff {
                busy_s,
                idle_s,
                cpu_s,
            } => {
                w.u8(4);
                w.f64(*busy_s);
                w.f64(*idle_s);
                w.f64(*cpu_s);
            }
            Msg::ServerDone { cpu_s, clients } => {
                w.u8(5);
                w.f64(*cpu_s);
                w.u64(clients.len() as u64);
                for &(r, f, b, i, n, c) in clients {
                    w.u64(r);
                    w.f64(f);
                    w.f64(b);
                    w.f64(i);
                    w.u64(n);
                    w.f64(c);
                }
            }
            Msg::Probe { payload } => {
                w.u8(6);
                w.u64(payload.len() as u64);
                w.0.extend_from_slice(payload);
            }
            Msg::Echo => w.u8(7),
            Msg::ProbeEnd => w.u8(8),
            Msg::Series {
                dm_index,
                tsamp_s,
                data,
            } => {
                w.u8(9);
                w.u64(*dm_index);
                w.f64(*tsamp_s);
                w.f32s(data);
            }
            Msg::SeriesEnd => w.u8(10),
            Msg::Detections { dm_index, list } => {
                w.u8(11);
                w.u64(*dm_index);
                w.u64(list.len() as u64);
                for c in list {
                    w.u64(c.dm_index as u64);
                    w.f64(c.freq_hz);
                    w.u64(c.nharm as u64);
                    w.f64(c.power);
                    w.f64(c.sigma);
                    w.f64(c.z);
                }
            }
            Msg::StreamEnd { blocks, samples } => {
                w.u8(12);
                w.u64(*blocks);
                w.u64(*samples);
            }
            Msg::Ack { block } => {
                w.u8(13);
                w.u64(*block);
            }
            Msg::Next => w.u8(14),
            Msg::Drained => w.u8(15),
            Msg::Want { client } => {
                w.u8(16);
                w.u64(*client);
            }
            Msg::Grant { client, block } => {
                w.u8(17);
                w.u64(*client);
                match block {
                    Some(b) => {
                        w.u8(1);
                        w.u64(*b);
                    }
                    None => w.u8(0),
                }
            }
            Msg::ServiceOver => w.u8(18),
        }
        w.0
    }

    /// Decode a message.
    ///
    /// # Errors
    /// An unknown kind, a short or overlong body, or an inconsistent block shape.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Msg, DecodeError> {
        let mut r = Reader { b: bytes, at: 0 };
        let kind = r.u8()?;
        let msg = match kind {
            1 => Msg::Request { block: r.u64()? },
            2 => {
                let block = r.u64()?;
                let voltages = decode_voltages(&mut r)?;
                Msg::Data { block, voltages }
            }
            3 => Msg::Result {
                block: r.u64()?,
                power: r.f32s()?,
            },
            4 => Msg::SignOff {
                busy_s: r.f64()?,
                idle_s: r.f64()?,
                cpu_s: r.f64()?,
            },
            5 => {
                let cpu_s = r.f64()?;
                let n = r.len(48)?;
                let mut clients = Vec::with_capacity(n);
                for _ in 0..n {
                    clients.push((r.u64()?, r.f64()?, r.f64()?, r.f64()?, r.u64()?, r.f64()?));
                }
                Msg::ServerDone { cpu_s, clients }
            }
            6 => {
                let n = r.len(1)?;
                Msg::Probe {
                    payload: r.take(n)?.to_vec(),
                }
            }
            7 => Msg::Echo,
            8 => Msg::ProbeEnd,
            9 => Msg::Series {
                dm_index: r.u64()?,
                tsamp_s: r.f64()?,
                data: r.f32s()?,
            },
            10 => Msg::SeriesEnd,
            11 => {
                let dm_index = r.u64()?;
                let n = r.len(48)?;
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    list.push(SpectralCandidate {
                        dm_index: r.u64()? as usize,
                        freq_hz: r.f64()?,
                        nharm: r.u64()? as usize,
                        power: r.f64()?,
                        sigma: r.f64()?,
                        z: r.f64()?,
                    });
                }
                Msg::Detections { dm_index, list }
            }
            12 => Msg::StreamEnd {
                blocks: r.u64()?,
                samples: r.u64()?,
            },
            13 => Msg::Ack { block: r.u64()? },
            14 => Msg::Next,
            15 => Msg::Drained,
            16 => Msg::Want { client: r.u64()? },
            17 => {
                let client = r.u64()?;
                let block = match r.u8()? {
                    0 => None,
                    1 => Some(r.u64()?),
                    f => return Err(DecodeError(format!("grant flag {f} is neither 0 nor 1"))),
                };
                Msg::Grant { client, block }
            }
            18 => Msg::ServiceOver,
            k => return Err(DecodeError(format!("unknown message kind {k}"))),
        };
        if r.at != bytes.len() {
            return Err(DecodeError(format!(
                "{} bytes left over after a message of kind {kind}",
                bytes.len() - r.at
            )));
        }
        Ok(msg)
    }
}

/// Bytes a block of this shape takes on the wire with 8-bit packing.
pub(crate) fn packed_block_bytes(nchan: usize, npol: usize, nsamp: usize) -> usize {
    1 + 8 + 1 + 3 * 8 + 2 * nchan * npol * nsamp
}

fn encode_voltages(w: &mut Writer, v: &Voltages) {
    w.u64(v.nchan() as u64);
    w.u64(v.npol() as u64);
    w.u64(v.nsamp() as u64);
    let exact_i8 = |x: f32| (x as i8 as f32).to_bits() == x.to_bits();
    let small = v
        .as_slice()
        .iter()
        .all(|z| exact_i8(z.re) && exact_i8(z.im));
    if small {
        w.u8(0);
        w.0.reserve(2 * v.as_slice().len());
        for z in v.as_slice() {
            w.0.push(z.re as i8 as u8);
            w.0.push(z.im as i8 as u8);
        }
    } else {
        w.u8(1);
        w.0.reserve(8 * v.as_slice().len());
        for z in v.as_slice() {
            w.0.extend_from_slice(&z.re.to_le_bytes());
            w.0.extend_from_slice(&z.im.to_le_bytes());
        }
    }
}

fn decode_voltages(r: &mut Reader<'_>) -> Result<Voltages, DecodeError> {
    let (nchan, npol, nsamp) = (r.u64()?, r.u64()?, r.u64()?);
    let count = nchan
        .checked_mul(npol)
        .and_then(|x| x.checked_mul(nsamp))
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| DecodeError(format!("block shape {nchan}×{npol}×{nsamp} overflows")))?;
    let packing = r.u8()?;
    let per = match packing {
        0 => 2,
        1 => 8,
        p => return Err(DecodeError(format!("unknown sample packing {p}"))),
    };
    let bytes = r.take(
        count
            .checked_mul(per)
            .ok_or_else(|| DecodeError(format!("block of {count} samples is too large")))?,
    )?;
    let data: Vec<Complex32> = if packing == 0 {
        bytes
            .chunks_exact(2)
            .map(|c| Complex32::new(c[0] as i8 as f32, c[1] as i8 as f32))
            .collect()
    } else {
        bytes
            .chunks_exact(8)
            .map(|c| {
                Complex32::new(
                    f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                    f32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect()
    };
    // The shape multiplies out to `count` = data.len(), checked above.
    Ok(Voltages::from_vec(
        nchan as usize,
        npol as usize,
        nsamp as usize,
        data,
    ))
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f32s(&mut self, v: &[f32]) {
        self.u64(v.len() as u64);
        self.0.reserve(4 * v.len());
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                DecodeError(format!(
                    "needs {n} bytes at offset {}, only {} left",
                    self.at,
                    self.b.len() - self.at
                ))
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let s = self.take(8)?;
        Ok(u64::from_le_bytes([
            s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7],
        ]))
    }
    fn f64(&mut self) -> Result<f64, DecodeError> {
        Ok(f64::from_bits(self.u64()?))
    }
    /// A count of items of at least `min_bytes` each, checked against what is left.
    fn len(&mut self, min_bytes: usize) -> Result<usize, DecodeError> {
        let n = self.u64()?;
        let left = (self.b.len() - self.at) as u64;
        if n.saturating_mul(min_bytes as u64) > left {
            return Err(DecodeError(format!(
                "announces {n} items but only {left} bytes follow"
            )));
        }
        Ok(n as usize)
    }
    fn f32s(&mut self) -> Result<Vec<f32>, DecodeError> {
        let n = self.len(4)?;
        Ok(self
            .take(4 * n)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(m: Msg) {
        let b = m.encode();
        assert_eq!(Msg::decode(&b).unwrap(), m);
        // Every strict prefix fails cleanly.
        for cut in 0..b.len() {
            assert!(Msg::decode(&b[..cut]).is_err(), "prefix {cut} of {m:?}");
        }
    }

    #[test]
    fn every_kind_round_trips() {
        let mut v = Voltages::zeros(2, 1, 3);
        v.series_mut(1, 0)[2] = Complex32::new(-128.0, 127.0);
        roundtrip(Msg::Data {
            block: 7,
            voltages: v.clone(),
        });
        assert_eq!(
            Msg::Data {
                block: 7,
                voltages: v
            }
            .encode()
            .len(),
            packed_block_bytes(2, 1, 3)
        );
        let mut f = Voltages::zeros(1, 2, 2);
        f.series_mut(0, 1)[0] = Complex32::new(0.5, -0.0);
        roundtrip(Msg::Data {
            block: 1,
            voltages: f,
        });
        roundtrip(Msg::Request { block: 9 });
        roundtrip(Msg::StreamEnd {
            blocks: 17,
            samples: 1 << 40,
        });
        roundtrip(Msg::Ack { block: 5 });
        roundtrip(Msg::Result {
            block: 3,
            power: vec![1.0, f32::MIN_POSITIVE, 3.5],
        });
        roundtrip(Msg::SignOff {
            busy_s: 1.5,
            idle_s: 0.25,
            cpu_s: 1.25,
        });
        roundtrip(Msg::ServerDone {
            cpu_s: 0.5,
            clients: vec![(3, 1.0, 0.5, 0.1, 7, 0.75)],
        });
        roundtrip(Msg::Next);
        roundtrip(Msg::Drained);
        roundtrip(Msg::Want { client: 4 });
        roundtrip(Msg::Grant {
            client: 4,
            block: Some(12),
        });
        roundtrip(Msg::Grant {
            client: 5,
            block: None,
        });
        roundtrip(Msg::ServiceOver);
        roundtrip(Msg::Probe {
            payload: vec![1, 2, 3],
        });
        roundtrip(Msg::Series {
            dm_index: 4,
            tsamp_s: 1.6e-5,
            data: vec![0.0; 5],
        });
        roundtrip(Msg::Detections {
            dm_index: 2,
            list: vec![SpectralCandidate {
                dm_index: 2,
                freq_hz: 30.183_9,
                nharm: 16,
                power: 101.25,
                sigma: 12.0,
                z: -3.5,
            }],
        });
    }

    #[test]
    fn negative_zero_is_not_packed_as_a_byte() {
        // -0.0 as i8 would come back as +0.0: a different bit pattern.
        let mut v = Voltages::zeros(1, 1, 1);
        v.series_mut(0, 0)[0] = Complex32::new(-0.0, 1.0);
        let b = Msg::Data {
            block: 0,
            voltages: v.clone(),
        }
        .encode();
        assert_eq!(b[1 + 8 + 24], 1, "f32 packing");
        match Msg::decode(&b).unwrap() {
            Msg::Data { voltages, .. } => {
                assert_eq!(voltages.as_slice()[0].re.to_bits(), (-0.0f32).to_bits())
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(Msg::decode(&[]).is_err());
        assert!(Msg::decode(&[200]).is_err());
        assert!(Msg::decode(&[7, 0]).is_err());
        // A huge announced length does not allocate.
        let mut b = vec![3u8];
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Msg::decode(&b).is_err());
    }
}
