//! Putting blocks back together: aligning channels by their integer shifts and summing them.
//!
//! Blocks may arrive in any order and from any worker; each is stored per channel, and
//! channels are summed only in [`PowerAssembler::finish`], always in channel order, so the
//! result is bit-for-bit the same however the blocks were shared out.

use rustfft::num_complex::Complex32;
use serde::{Deserialize, Serialize};

use crate::dedisperse::{BlockPower, DedispersionPlan};
use crate::voltages::Voltages;

/// Why blocks cannot be assembled.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum AssembleError {
    /// A block index beyond those planned.
    #[error("block {block} is outside the {nblocks} blocks planned")]
    BlockOutOfRange {
        /// The block.
        block: u64,
        /// Blocks planned.
        nblocks: u64,
    },
    /// A block of the wrong size.
    #[error("block {block} holds {got} values, expected {expected}")]
    WrongSize {
        /// The block.
        block: u64,
        /// Values found.
        got: usize,
        /// Values expected.
        expected: usize,
    },
    /// Blocks never delivered.
    #[error("{missing} of {nblocks} blocks were never delivered (first missing: {first})")]
    Missing {
        /// How many.
        missing: u64,
        /// Of how many.
        nblocks: u64,
        /// The first absent block.
        first: u64,
    },
    /// The shifts between channels eat the whole series.
    #[error(
        "the data are too short for this DM range: the channels' relative delays span more \
         than the {available} dedispersed samples"
    )]
    TooShort {
        /// Samples available before alignment.
        available: u64,
    },
}

/// A dedispersed, detected time series at one DM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DmSeries {
    /// Dispersion measure.
    pub dm: f64,
    /// Sample interval, s.
    pub tsamp_s: f64,
    /// Input sample (at the reference frequency) that output sample 0 starts at.
    pub start_sample: i64,
    /// Power, polarisations and channels summed.
    pub data: Vec<f32>,
}

/// Collects [`BlockPower`]s and aligns them into one [`DmSeries`] per DM.
#[derive(Clone, Debug)]
pub struct PowerAssembler {
    dms: Vec<f64>,
    nchan: usize,
    per_block: usize,
    nblocks: u64,
    out_len: usize,
    /// Per block, leading outputs the block before already gave ([`DedispersionPlan::block_skip`]).
    skip_out: Vec<usize>,
    lead_out: i64,
    shifts_out: Vec<i64>,
    downsample: usize,
    tsamp_s: f64,
    data: Vec<f32>,
    have: Vec<bool>,
}

impl PowerAssembler {
    /// An empty assembler for all of `nsamples` input samples per channel, in
    /// [`DedispersionPlan::num_blocks`] blocks: a shifted last block gives only what the one
    /// before did not, and whatever lies beyond [`DedispersionPlan::valid_end`] is cut off.
    pub fn for_input(plan: &DedispersionPlan, nsamples: u64) -> Self {
        let mut a = Self::new(plan, plan.num_blocks(nsamples));
        a.out_len = plan.output_len(nsamples);
        a
    }

    /// An empty assembler for `nblocks` whole blocks of `plan`, every output of which is
    /// kept (a stream's blocks so far, for example).
    pub fn new(plan: &DedispersionPlan, nblocks: u64) -> Self {
        let nchan = plan.band().nchan();
        let per_block = plan.samples_per_block();
        let ds = plan.downsample() as i64;
        let ndm = plan.dms().len();
        let shifts_out = (0..ndm)
            .flat_map(|d| (0..nchan).map(move |c| (d, c)))
            .map(|(d, c)| plan.shift(d, c) / ds)
            .collect();
        PowerAssembler {
            dms: plan.dms().to_vec(),
            nchan,
            per_block,
            nblocks,
            out_len: per_block * nblocks as usize,
            skip_out: (0..nblocks)
                .map(|b| plan.block_skip(b) / plan.downsample())
                .collect(),
            lead_out: plan.lead() as i64 / ds,
            shifts_out,
            downsample: plan.downsample(),
            tsamp_s: plan.band().tsamp_s() * plan.downsample() as f64,
            data: vec![0.0; ndm * nchan * per_block * nblocks as usize],
            have: vec![false; nblocks as usize],
        }
    }

    fn series_len(&self) -> usize {
        self.per_block * self.nblocks as usize
    }

    /// Store one block.
    ///
    /// # Errors
    /// A block index or size that does not fit the plan.
    pub fn insert(&mut self, block: &BlockPower) -> Result<(), AssembleError> {
        if block.block >= self.nblocks {
            return Err(AssembleError::BlockOutOfRange {
                block: block.block,
                nblocks: self.nblocks,
            });
        }
        let expected = self.dms.len() * self.nchan * self.per_block;
        if block.data.len() != expected {
            return Err(AssembleError::WrongSize {
                block: block.block,
                got: block.data.len(),
                expected,
            });
        }
        let len = self.series_len();
        let at = block.block as usize * self.per_block;
        let skip = self.skip_out[block.block as usize];
        for (i, src) in block.data.chunks_exact(self.per_block).enumerate() {
            let dst = i * len + at;
            self.data[dst..dst + self.per_block - skip].copy_from_slice(&src[skip..]);
        }
        self.have[block.block as usize] = true;
        Ok(())
    }

    /// Take over the blocks another assembler (for the same plan) received.
    ///
    /// # Errors
    /// If the two were made for different plans.
    pub fn merge(&mut self, other: &PowerAssembler) -> Result<(), AssembleError> {
        if other.data.len() != self.data.len() {
            return Err(AssembleError::WrongSize {
                block: 0,
                got: other.data.len(),
                expected: self.data.len(),
            });
        }
        let len = self.series_len();
        for (b, _) in other.have.iter().enumerate().filter(|(_, h)| **h) {
            let at = b * self.per_block;
            for s in 0..self.dms.len() * self.nchan {
                let r = s * len + at..s * len + at + self.per_block;
                self.data[r.clone()].copy_from_slice(&other.data[r]);
            }
            self.have[b] = true;
        }
        Ok(())
    }

    /// Output index range `[j0, j1)` (in downsampled samples of reference time) where every
    /// channel of every DM has data.
    fn common_range(&self) -> Result<(i64, i64), AssembleError> {
        let u0 = self.lead_out;
        let u1 = u0 + self.out_len as i64;
        let lo = self.shifts_out.iter().copied().min().unwrap_or(0);
        let hi = self.shifts_out.iter().copied().max().unwrap_or(0);
        let (j0, j1) = (u0 - lo, u1 - hi);
        if j1 <= j0 {
            return Err(AssembleError::TooShort {
                available: self.out_len as u64,
            });
        }
        Ok((j0, j1))
    }

    fn check_complete(&self) -> Result<(), AssembleError> {
        let missing = self.have.iter().filter(|h| !**h).count() as u64;
        if missing > 0 {
            return Err(AssembleError::Missing {
                missing,
                nblocks: self.nblocks,
                first: self.have.iter().position(|h| !*h).unwrap_or(0) as u64,
            });
        }
        Ok(())
    }

    /// One aligned series per channel for DM index `dm`: a filterbank, `[chan][time]`.
    ///
    /// # Errors
    /// Missing blocks, or too little data for the spread of channel delays.
    pub fn filterbank(&self, dm: usize) -> Result<(DmSeries, Vec<Vec<f32>>), AssembleError> {
        self.check_complete()?;
        let (j0, j1) = self.common_range()?;
        let len = self.series_len();
        let chans = (0..self.nchan)
            .map(|c| {
                let q = self.shifts_out[dm * self.nchan + c];
                let from = (j0 + q - self.lead_out) as usize;
                let base = (dm * self.nchan + c) * len;
                self.data[base + from..base + from + (j1 - j0) as usize].to_vec()
            })
            .collect::<Vec<_>>();
        let header = DmSeries {
            dm: self.dms[dm],
            tsamp_s: self.tsamp_s,
            start_sample: j0 * self.downsample as i64,
            data: Vec::new(),
        };
        Ok((header, chans))
    }

    /// The aligned, channel-summed series of every DM, all on the same time grid.
    ///
    /// # Errors
    /// Missing blocks, or too little data for the spread of channel delays.
    pub fn finish(&self) -> Result<Vec<DmSeries>, AssembleError> {
        self.check_complete()?;
        (0..self.dms.len())
            .map(|dm| {
                let (mut series, chans) = self.filterbank(dm)?;
                let mut sum = chans[0].clone();
                for chan in &chans[1..] {
                    for (s, v) in sum.iter_mut().zip(chan) {
                        *s += v;
                    }
                }
                series.data = sum;
                Ok(series)
            })
            .collect()
    }
}

/// Collects dedispersed voltages block by block and aligns channels.
#[derive(Clone, Debug)]
pub struct VoltageAssembler {
    nchan: usize,
    npol: usize,
    step: usize,
    nblocks: u64,
    out_len: usize,
    skip: Vec<usize>,
    lead: i64,
    shifts: Vec<i64>,
    data: Voltages,
}

impl VoltageAssembler {
    /// An empty assembler for all of `nsamples` input samples per channel at DM index
    /// `dm`, as [`PowerAssembler::for_input`].
    pub fn for_input(plan: &DedispersionPlan, dm: usize, nsamples: u64) -> Self {
        let mut a = Self::new(plan, dm, plan.num_blocks(nsamples));
        a.out_len = plan.output_len(nsamples) * plan.downsample();
        a
    }

    /// An empty assembler for `nblocks` whole blocks of `plan` at DM index `dm`.
    pub fn new(plan: &DedispersionPlan, dm: usize, nblocks: u64) -> Self {
        let nchan = plan.band().nchan();
        let npol = plan.band().npol;
        VoltageAssembler {
            nchan,
            npol,
            step: plan.step(),
            nblocks,
            out_len: plan.step() * nblocks as usize,
            skip: (0..nblocks).map(|b| plan.block_skip(b)).collect(),
            lead: plan.lead() as i64,
            shifts: (0..nchan).map(|c| plan.shift(dm, c)).collect(),
            data: Voltages::zeros(nchan, npol, plan.step() * nblocks as usize),
        }
    }

    /// Store the output of [`DedispersionPlan::voltages`] for `block`.
    ///
    /// # Panics
    /// If `block` is out of range or the block has the wrong shape.
    pub fn insert(&mut self, block: u64, v: &Voltages) {
        assert!(block < self.nblocks, "block out of range");
        assert_eq!(v.nsamp(), self.step, "block length");
        let at = block as usize * self.step;
        let skip = self.skip[block as usize];
        for c in 0..self.nchan {
            for p in 0..self.npol {
                self.data.series_mut(c, p)[at..at + self.step - skip]
                    .copy_from_slice(&v.series(c, p)[skip..]);
            }
        }
    }

    /// Aligned voltages and the input sample (at the reference frequency) of their start.
    ///
    /// # Errors
    /// Too little data for the spread of channel delays.
    pub fn finish(self) -> Result<(i64, Voltages), AssembleError> {
        let len = self.out_len as i64;
        let lo = self.shifts.iter().copied().min().unwrap_or(0);
        let hi = self.shifts.iter().copied().max().unwrap_or(0);
        let (j0, j1) = (self.lead - lo, self.lead + len - hi);
        if j1 <= j0 {
            return Err(AssembleError::TooShort {
                available: len as u64,
            });
        }
        let n = (j1 - j0) as usize;
        let mut out = Vec::with_capacity(self.nchan * self.npol * n);
        for c in 0..self.nchan {
            let from = (j0 + self.shifts[c] - self.lead) as usize;
            for p in 0..self.npol {
                out.extend_from_slice(&self.data.series(c, p)[from..from + n]);
            }
        }
        let _: &[Complex32] = &out;
        Ok((j0, Voltages::from_vec(self.nchan, self.npol, n, out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::band::Band;
    use crate::dedisperse::PlanConfig;

    #[test]
    fn alignment_by_shift_and_deterministic_merge() {
        let band = Band::from_total(430.0, 2.0, 2, 1e6, true, 1);
        let plan = DedispersionPlan::new(&band, &[0.0, 30.0], &PlanConfig::default().downsample(4))
            .unwrap();
        let nblocks = 3;
        let per = plan.samples_per_block();
        // Fill each block with its (dm, chan, absolute u) so alignment can be checked.
        let blocks: Vec<BlockPower> = (0..nblocks)
            .map(|b| {
                let mut data = Vec::new();
                for dm in 0..2 {
                    for c in 0..2 {
                        for i in 0..per {
                            let u = plan.lead() as i64 / 4 + (b as usize * per + i) as i64;
                            let j = u - plan.shift(dm, c) / 4;
                            data.push(j as f32 + 1000.0 * c as f32);
                        }
                    }
                }
                BlockPower { block: b, data }
            })
            .collect();
        let mut a = PowerAssembler::new(&plan, nblocks);
        for b in blocks.iter().rev() {
            a.insert(b).unwrap();
        }
        let series = a.finish().unwrap();
        for s in &series {
            // Channel 0 contributes j, channel 1 j + 1000: aligned means the sum is 2j + 1000.
            let j0 = s.start_sample / 4;
            for (k, v) in s.data.iter().enumerate() {
                assert_eq!(*v, 2.0 * (j0 + k as i64) as f32 + 1000.0);
            }
        }
        // Two half-filled assemblers merged give the same bits.
        let mut x = PowerAssembler::new(&plan, nblocks);
        let mut y = PowerAssembler::new(&plan, nblocks);
        x.insert(&blocks[0]).unwrap();
        y.insert(&blocks[1]).unwrap();
        y.insert(&blocks[2]).unwrap();
        assert!(matches!(
            x.finish(),
            Err(AssembleError::Missing { missing: 2, .. })
        ));
        x.merge(&y).unwrap();
        assert_eq!(x.finish().unwrap(), series);
        let bad = BlockPower {
            block: 7,
            data: vec![],
        };
        assert!(matches!(
            x.insert(&bad),
            Err(AssembleError::BlockOutOfRange { .. })
        ));
    }
}
