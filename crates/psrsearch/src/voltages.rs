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
}
