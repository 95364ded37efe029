//! Candidates as PRESTO `accelsearch` writes them, `NAME_DM26.80_ACCEL_0`, so that PRESTO's
//! sifting (`presto.sifting.read_candidates`, `ACCEL_sift.py`) reads psrsearch's results.
//!
//! The file is text: a table of candidates, one line each, starting with the candidate's
//! number in the first column (`Cand Sigma SummedPower CoherentPower NumHarm Period(ms)
//! Frequency(Hz) r(bin) fdot(Hz/s) z(bins) Accel(m/s^2) Notes`); a table of harmonics,
//! the first line of each candidate starting with a blank and its number, the others with
//! blanks only (`Cand Harm Sigma Power RawPower r Pred-r z Pred-z Phase Centroid Purity`);
//! then the `.inf` of the series searched, from which sifting takes the observation's
//! length. Sifting reads columns by position, so no field holds a blank. The DM is in the
//! file name (`DM` and two decimals), as sifting finds it.
//!
//! Each harmonic's raw power, phase, centroid and purity are measured on the series itself
//! (`crate::fourier_props`, with the drift taken out, at the power's peak nearest the folded
//! frequency's harmonic, which is the `FFT 'r'` column; `Pred 'r'` is the harmonic number
//! times the candidate's `r`). Centroid and purity mean something for harmonics well above the
//! noise (`docs/psrsearch.md` gives figures); at a few times the mean power they scatter
//! widely, and off a peak (no maximum within reach) purity reads 0. The coherent
//! power column holds the summed power: psrsearch sums harmonics incoherently only. A
//! candidate read back from a file, or made without the series, has no measured properties;
//! its harmonics are then written as PRESTO would for a perfect signal (raw power as the
//! normalised one, phase 0, centroid 0.5, purity 1). `r` and `z` are the frequency and drift
//! at the middle of the observation in Fourier bins (`f·T`, `ḟ·T²`).

use std::io::Write;

use super::presto::InfFile;
use super::HeaderError;
use crate::fourier_props::HarmonicProps;
use crate::stats::harmonic_sigma;

const FORMAT: &str = "ACCEL";

/// One candidate of an ACCEL file.
#[derive(Clone, Debug, PartialEq)]
pub struct AccelCandidate {
    /// Number in the file, from 1.
    pub number: usize,
    /// Significance (psrsearch's, trials included).
    pub sigma: f64,
    /// Sum of the harmonics' normalised powers.
    pub summed_power: f64,
    /// Coherently summed power (here: the summed power).
    pub coherent_power: f64,
    /// Harmonics summed.
    pub nharm: usize,
    /// Spin period, s.
    pub period_s: f64,
    /// Spin frequency, Hz.
    pub freq_hz: f64,
    /// Frequency in Fourier bins, `f·T`.
    pub r: f64,
    /// Frequency drift, Hz/s.
    pub fdot_hz_s: f64,
    /// Drift in Fourier bins, `ḟ·T²`.
    pub z: f64,
    /// Line-of-sight acceleration, m/s².
    pub accel_ms2: f64,
    /// Notes (no blanks; empty for none).
    pub note: String,
    /// Normalised power of each harmonic, fundamental first.
    pub harmonic_powers: Vec<f64>,
    /// Measured properties of each harmonic, fundamental first (empty: not measured).
    pub harmonic_props: Vec<HarmonicProps>,
}

/// The file name accelsearch gives candidates of `base` at `dm` searched up to `zmax`:
/// `BASE_DM26.80_ACCEL_0`.
pub fn file_name(base: &str, dm: f64, zmax: f64) -> String {
    format!("{base}_DM{dm:.2}_ACCEL_{}", zmax.round() as i64)
}

const TITLES: [&str; 2] = [
    "                   Summed      Coherent    Num         Period               Frequency           FFT 'r'         Freq Deriv        FFT 'z'        Accel",
    "Cand    Sigma       Power       Power      Harm         (ms)                  (Hz)              (bin)            (Hz/s)          (bins)        (m/s^2)       Notes",
];
const HARMONIC_TITLES: [&str; 2] = [
    "                         Power /      Raw         FFT 'r'         Pred 'r'        FFT 'z'      Pred 'z'       Phase    Centroid    Purity",
    " Cand   Harm   Sigma     Loc Pow     Power         (bin)           (bin)          (bins)        (bins)        (rad)     (0-1)      <p> = 1",
];

/// Write `cands` and the `.inf` of the series they were found in.
///
/// # Errors
/// I/O errors.
pub fn write_accel(
    w: &mut impl Write,
    cands: &[AccelCandidate],
    inf: &InfFile,
) -> std::io::Result<()> {
    for t in TITLES {
        writeln!(w, "{t}")?;
    }
    writeln!(w, "{}", "-".repeat(TITLES[1].len()))?;
    for c in cands {
        let note = c.note.split_whitespace().collect::<Vec<_>>().join("_");
        writeln!(
            w,
            "{:<4}  {:>8.2}  {:>10.2}  {:>10.2}  {:>4}  {:>20.12}  {:>18.12}  {:>16.6}  {:>15.6e}  {:>12.4}  {:>12.4}  {}",
            c.number,
            c.sigma,
            c.summed_power,
            c.coherent_power,
            c.nharm,
            c.period_s * 1e3,
            c.freq_hz,
            c.r,
            c.fdot_hz_s,
            c.z,
            c.accel_ms2,
            note
        )?;
    }
    writeln!(w, "\n")?;
    for t in HARMONIC_TITLES {
        writeln!(w, "{t}")?;
    }
    writeln!(w, "{}", "-".repeat(HARMONIC_TITLES[1].len()))?;
    for c in cands {
        for (k, p) in c.harmonic_powers.iter().enumerate() {
            let h = (k + 1) as f64;
            // The first line of a candidate carries its number after one blank, as
            // sifting's `^[ ]\d` looks for; the others start with blanks only.
            let number = if k == 0 {
                format!(" {:<4}", c.number)
            } else {
                "     ".to_string()
            };
            let (r, raw, phase, centroid, purity) = match c.harmonic_props.get(k) {
                Some(m) => (m.r, m.raw_power, m.phase_rad, m.centroid, m.purity),
                None => (c.r * h, *p, 0.0, 0.5, 1.0),
            };
            writeln!(
                w,
                "{number}  {:<4}  {:>6.2}  {:>10.4}  {:>10.4e}  {:>14.4}  {:>14.4}  {:>10.4}  {:>10.4}  {:>8.4}  {:>8.4}  {:>8.4}",
                k + 1,
                harmonic_sigma(*p, 1, 1.0).max(0.0),
                p,
                raw,
                r,
                c.r * h,
                c.z * h,
                c.z * h,
                phase,
                centroid,
                purity
            )?;
        }
    }
    writeln!(w, "\n")?;
    w.write_all(inf.to_text().as_bytes())
}

/// Read an ACCEL file as PRESTO's sifting does: candidates from lines starting with a digit
/// (columns by position), harmonic powers and properties from the lines after, and the
/// `.inf` at the end (`None` when the file has none).
///
/// # Errors
/// A candidate or harmonic line whose columns do not parse, naming the line.
pub fn read_accel(text: &str) -> Result<(Vec<AccelCandidate>, Option<InfFile>), HeaderError> {
    let mut cands: Vec<AccelCandidate> = Vec::new();
    // Candidate whose harmonics are being read, and how many are still to come.
    let mut reading: Option<(usize, usize)> = None;
    let mut inf_at = None;
    let mut offset = 0;
    for (n, line) in text.lines().enumerate() {
        let here = offset;
        offset += line.len() + 1;
        let bad = |what: &str| {
            HeaderError::invalid(FORMAT, &format!("line {}", n + 1), line, what.to_string())
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<f64, HeaderError> {
            f.get(i)
                .and_then(|v| v.split('(').next())
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad("numeric columns"))
        };
        // A harmonic line's raw power, phase, centroid and purity, its columns shifted by
        // `shift` (1 on a candidate's first line, which starts with its number).
        let props = |shift: usize| -> Result<HarmonicProps, HeaderError> {
            Ok(HarmonicProps {
                r: num(4 + shift)?,
                raw_power: num(3 + shift)?,
                phase_rad: num(8 + shift)?,
                centroid: num(9 + shift)?,
                purity: num(10 + shift)?,
            })
        };
        let bytes = line.as_bytes();
        if line.starts_with(" Data file name without suffix") {
            inf_at = Some(here);
            break;
        }
        if bytes.first().is_some_and(u8::is_ascii_digit) {
            cands.push(AccelCandidate {
                number: num(0)? as usize,
                sigma: num(1)?,
                summed_power: num(2)?,
                coherent_power: num(3)?,
                nharm: num(4)? as usize,
                period_s: num(5)? / 1e3,
                freq_hz: num(6)?,
                r: num(7)?,
                fdot_hz_s: num(8)?,
                z: num(9)?,
                accel_ms2: num(10)?,
                note: f.get(11..).map(|n| n.join(" ")).unwrap_or_default(),
                harmonic_powers: Vec::new(),
                harmonic_props: Vec::new(),
            });
        } else if bytes.len() > 1 && bytes[0] == b' ' && bytes[1].is_ascii_digit() {
            let number = num(0)? as usize;
            let c = cands
                .iter_mut()
                .position(|c| c.number == number)
                .ok_or_else(|| bad("harmonics of a candidate listed above"))?;
            cands[c].harmonic_powers = vec![num(3)?];
            cands[c].harmonic_props = vec![props(1)?];
            reading = (cands[c].nharm > 1).then_some((c, cands[c].nharm - 1));
        } else if let Some((c, left)) = reading {
            cands[c].harmonic_powers.push(num(2)?);
            cands[c].harmonic_props.push(props(0)?);
            reading = (left > 1).then_some((c, left - 1));
        }
    }
    let inf = inf_at.map(|at| InfFile::parse(&text[at..])).transpose()?;
    Ok((cands, inf))
}
