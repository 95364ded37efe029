//! Candidate tables as CSV (`# key = value` lines describing the observation, one header
//! line, then one row per candidate, numbers in Rust's shortest round-trip form) and JSON
//! (`{"metadata": {...}, "candidates": [...]}`, via serde).

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use super::{HeaderError, Metadata};
use crate::search::Candidate;

const FORMAT: &str = "candidate CSV";
const COLUMNS: [&str; 12] = [
    "rank",
    "period_s",
    "freq_hz",
    "dm",
    "sigma",
    "snr",
    "nharm",
    "dm_hits",
    "duty",
    "flag",
    "fdot_hz_s",
    "accel_ms2",
];
/// Tables written before candidates had a flag column, or a drift, are still read.
const OLD_WIDTHS: [usize; 2] = [9, 10];

/// Write the CSV table, the observation `metadata` describes first as `# key = value`
/// lines (source, telescope, ra, dec, start_mjd; those known).
///
/// # Errors
/// I/O errors.
pub fn write_csv(
    w: &mut impl Write,
    metadata: &Metadata,
    cands: &[Candidate],
) -> std::io::Result<()> {
    for (key, value) in metadata.pairs() {
        // A line break in a name would end the comment early.
        writeln!(w, "# {key} = {}", value.replace(['\n', '\r'], " "))?;
    }
    writeln!(w, "{}", COLUMNS.join(","))?;
    for c in cands {
        writeln!(
            w,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            c.rank,
            c.period_s,
            c.freq_hz,
            c.dm,
            c.sigma,
            c.snr,
            c.nharm,
            c.dm_hits,
            c.duty,
            // A flag is a word with no comma, but nothing may break the table.
            c.flag.replace(',', ";"),
            c.fdot_hz_s,
            c.accel_ms2
        )?;
    }
    Ok(())
}

/// Read the candidates of a table written by [`write_csv`] (or before it wrote metadata).
///
/// # Errors
/// A different header line, or a row that does not parse.
pub fn read_csv(r: &mut impl BufRead) -> Result<Vec<Candidate>, HeaderError> {
    read_csv_table(r).map(|(_, c)| c)
}

/// Read a table written by [`write_csv`]: the observation's metadata and the candidates.
///
/// # Errors
/// A different header line, a metadata line that does not parse, or a row that does not.
pub fn read_csv_table(r: &mut impl BufRead) -> Result<(Metadata, Vec<Candidate>), HeaderError> {
    let mut lines = r.lines();
    let io = |e: std::io::Error| HeaderError::Malformed {
        format: FORMAT,
        detail: e.to_string(),
    };
    let mut comments = Vec::new();
    let head = loop {
        let line = lines
            .next()
            .ok_or_else(|| HeaderError::missing(FORMAT, "header line"))?
            .map_err(io)?;
        match line.strip_prefix('#') {
            Some(c) => comments.push(c.to_string()),
            None => break line,
        }
    };
    let metadata = Metadata::parse_pairs(comments.iter().filter_map(|c| {
        let (k, v) = c.split_once('=')?;
        Some((k.trim(), v.trim()))
    }))
    .map_err(|e| HeaderError::invalid(FORMAT, "metadata", comments.join(";"), e))?;
    let Some(width) = (OLD_WIDTHS.into_iter().chain([COLUMNS.len()]))
        .find(|w| head.trim() == COLUMNS[..*w].join(","))
    else {
        return Err(HeaderError::invalid(
            FORMAT,
            "header line",
            head,
            COLUMNS.join(","),
        ));
    };
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = || {
            HeaderError::invalid(
                FORMAT,
                &format!("row {}", i + 1),
                line.clone(),
                "9 numeric columns, a flag and 2 numeric columns",
            )
        };
        if f.len() != width {
            return Err(bad());
        }
        let u = |s: &str| s.parse::<usize>().map_err(|_| bad());
        let x = |s: &str| s.parse::<f64>().map_err(|_| bad());
        out.push(Candidate {
            rank: u(f[0])?,
            period_s: x(f[1])?,
            freq_hz: x(f[2])?,
            dm: x(f[3])?,
            sigma: x(f[4])?,
            snr: x(f[5])?,
            nharm: u(f[6])?,
            dm_hits: u(f[7])?,
            duty: x(f[8])?,
            flag: f.get(9).map_or_else(String::new, |s| s.to_string()),
            fdot_hz_s: f.get(10).map_or(Ok(0.0), |s| x(s))?,
            accel_ms2: f.get(11).map_or(Ok(0.0), |s| x(s))?,
        });
    }
    Ok((metadata, out))
}

/// The JSON file: the observation and its candidates.
#[derive(Serialize, Deserialize)]
struct JsonTable {
    metadata: Metadata,
    candidates: Vec<Candidate>,
}

/// Write the observation and the candidates as pretty-printed JSON,
/// `{"metadata": {...}, "candidates": [...]}`.
///
/// # Errors
/// I/O errors.
pub fn write_json(
    w: &mut impl Write,
    metadata: &Metadata,
    cands: &[Candidate],
) -> std::io::Result<()> {
    let table = JsonTable {
        metadata: metadata.clone(),
        candidates: cands.to_vec(),
    };
    serde_json::to_writer_pretty(&mut *w, &table).map_err(std::io::Error::other)?;
    writeln!(w)
}

/// Read the candidates of a JSON file [`write_json`] wrote (or a bare array, as it wrote
/// before).
///
/// # Errors
/// Invalid JSON or missing fields.
pub fn read_json(r: &mut impl std::io::Read) -> Result<Vec<Candidate>, HeaderError> {
    read_json_table(r).map(|(_, c)| c)
}

/// Read the observation and the candidates of a JSON file [`write_json`] wrote.
///
/// # Errors
/// Invalid JSON or missing fields.
pub fn read_json_table(
    r: &mut impl std::io::Read,
) -> Result<(Metadata, Vec<Candidate>), HeaderError> {
    let malformed = |e: serde_json::Error| HeaderError::Malformed {
        format: "candidate JSON",
        detail: e.to_string(),
    };
    let value: serde_json::Value = serde_json::from_reader(r).map_err(malformed)?;
    // A bare array is what was written before the metadata was.
    if value.is_array() {
        return Ok((
            Metadata::default(),
            serde_json::from_value(value).map_err(malformed)?,
        ));
    }
    let table: JsonTable = serde_json::from_value(value).map_err(malformed)?;
    Ok((table.metadata, table.candidates))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_errors() {
        let e = read_csv(&mut "rank,period\n".as_bytes()).unwrap_err();
        assert!(e.to_string().contains("header line"), "{e}");
        let text = format!("{}\n1,2,3\n", COLUMNS.join(","));
        let e = read_csv(&mut text.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("row 1"), "{e}");
        assert!(read_json(&mut "[{\"rank\": 1}]".as_bytes()).is_err());
    }
}
