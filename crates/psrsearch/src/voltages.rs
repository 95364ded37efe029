//! Blocks of complex voltages, laid out channel by channel and polarisation by polarisation
//! so that each (channel, polarisation) series is one contiguous slice ready for an FFT.

use rustfft::num_complex::Complex32;

/// `nchan × npol × nsamp` complex samples; real data are stored with a zero imaginary part.
#[derive(Clone, Debug, PartialEq)]
pub struct Voltages {
    nchan: usize,
    npol: usize,
    nsamp: usize,
    data: Vec<Complex32>,
}

impl Voltages {
    /// All-zero block.
    pub fn zeros(nchan: usize, npol: usize, nsamp: usize) -> Self {
        Voltages {
            nchan,
            npol,
            nsamp,
            data: vec![Complex32::new(0.0, 0.0); nchan * npol * nsamp],
        }
    }

    /// Wrap existing data laid out `[chan][pol][time]`.
    ///
    /// # Panics
    /// If `data.len() != nchan * npol * nsamp`.
    pub fn from_vec(nchan: usize, npol: usize, nsamp: usize, data: Vec<Complex32>) -> Self {
        assert_eq!(data.len(), nchan * npol * nsamp, "voltage block shape");
        Voltages {
            nchan,
            npol,
            nsamp,
            data,
        }
    }

    /// Number of channels.
    pub fn nchan(&self) -> usize {
        self.nchan
    }

    /// Number of polarisations.
    pub fn npol(&self) -> usize {
        self.npol
    }

    /// Samples per (channel, polarisation) series.
    pub fn nsamp(&self) -> usize {
        self.nsamp
    }

    /// One (channel, polarisation) series.
    pub fn series(&self, chan: usize, pol: usize) -> &[Complex32] {
        let start = (chan * self.npol + pol) * self.nsamp;
        &self.data[start..start + self.nsamp]
    }

    /// One (channel, polarisation) series, mutable.
    pub fn series_mut(&mut self, chan: usize, pol: usize) -> &mut [Complex32] {
        let start = (chan * self.npol + pol) * self.nsamp;
        &mut self.data[start..start + self.nsamp]
    }

    /// All samples, `[chan][pol][time]`.
    pub fn as_slice(&self) -> &[Complex32] {
        &self.data
    }

    /// All samples, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [Complex32] {
        &mut self.data
    }

    /// Consume into the flat `[chan][pol][time]` vector.
    pub fn into_vec(self) -> Vec<Complex32> {
        self.data
    }

    /// A sample by index.
    pub fn get(&self, chan: usize, pol: usize, t: usize) -> Complex32 {
        self.data[(chan * self.npol + pol) * self.nsamp + t]
    }

    /// Fill this block with `src`'s samples `[start, start + nsamp)`, zeros where that
    /// window reaches past the end of `src`: a block of a dedispersion read from memory.
    ///
    /// # Panics
    /// If the channel or polarisation counts differ.
    pub fn fill_window(&mut self, src: &Voltages, start: usize) {
        assert_eq!(
            (src.nchan, src.npol),
            (self.nchan, self.npol),
            "channels and polarisations must match"
        );
        let n = self.nsamp;
        let have = src.nsamp.saturating_sub(start).min(n);
        let from = start.min(src.nsamp);
        for c in 0..self.nchan {
            for p in 0..self.npol {
                let dst = self.series_mut(c, p);
                dst[..have].copy_from_slice(&src.series(c, p)[from..from + have]);
                dst[have..].fill(Complex32::new(0.0, 0.0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_past_the_end_are_zero_filled() {
        let src = Voltages::from_vec(
            1,
            2,
            3,
            (0..6).map(|i| Complex32::new(i as f32, 0.0)).collect(),
        );
        let mut w = Voltages::zeros(1, 2, 2);
        w.fill_window(&src, 2);
        assert_eq!(
            w.series(0, 0),
            &[Complex32::new(2.0, 0.0), Complex32::new(0.0, 0.0)]
        );
        assert_eq!(
            w.series(0, 1),
            &[Complex32::new(5.0, 0.0), Complex32::new(0.0, 0.0)]
        );
        w.fill_window(&src, 9);
        assert!(w.as_slice().iter().all(|z| z.norm() == 0.0));
    }
}
