//! NumPy `.npy` version 1.0: magic `\x93NUMPY`, version bytes `1 0`, a little-endian `u16`
//! header length, a Python dict literal (`descr`, `fortran_order`, `shape`) padded with
//! spaces and a newline so the data start on a 64-byte boundary, then C-order data.
//!
//! The header is byte for byte the one NumPy writes. Not the `npyz` crate (decision 0058): its
//! header parser brings 13 crates, among them a PEG parser generator and stack-switching
//! assembly, for these two dtypes.

use std::io::{Read, Write};

use rustfft::num_complex::Complex32;

use super::HeaderError;

const FORMAT: &str = "npy";
const MAGIC: &[u8] = b"\x93NUMPY";

/// Data of an `.npy` file this crate understands.
#[derive(Clone, Debug, PartialEq)]
pub enum NpyData {
    /// `<f4`.
    F32(Vec<f32>),
    /// `<c8`.
    C64(Vec<Complex32>),
}

/// An array read from `.npy`.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray {
    /// C-order shape.
    pub shape: Vec<usize>,
    /// The values.
    pub data: NpyData,
}

fn header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let dims = match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    let unpadded = MAGIC.len() + 2 + 2 + dict.len() + 1;
    dict.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    dict.push('\n');
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + dict.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

fn check_shape(shape: &[usize], len: usize) -> std::io::Result<()> {
    if shape.iter().product::<usize>() != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("shape {shape:?} does not hold {len} values"),
        ));
    }
    Ok(())
}

/// Write `data` with `shape` as `<f4`.
///
/// # Errors
/// I/O errors, or a shape whose product is not `data.len()`.
pub fn write_f32(w: &mut impl Write, shape: &[usize], data: &[f32]) -> std::io::Result<()> {
    check_shape(shape, data.len())?;
    w.write_all(&header("<f4", shape))?;
    let mut buf = Vec::with_capacity(data.len() * 4);
    for v in data {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&buf)
}

/// Write `data` with `shape` as `<c8` (complex64).
///
/// # Errors
/// I/O errors, or a shape whose product is not `data.len()`.
pub fn write_c64(w: &mut impl Write, shape: &[usize], data: &[Complex32]) -> std::io::Result<()> {
    check_shape(shape, data.len())?;
    w.write_all(&header("<c8", shape))?;
    let mut buf = Vec::with_capacity(data.len() * 8);
    for v in data {
        buf.extend_from_slice(&v.re.to_le_bytes());
        buf.extend_from_slice(&v.im.to_le_bytes());
    }
    w.write_all(&buf)
}

/// Read a version 1.0 `.npy` of `<f4` or `<c8` in C order.
///
/// # Errors
/// Anything else, or a file shorter than its shape.
pub fn read(r: &mut impl Read) -> Result<NpyArray, HeaderError> {
    let bad = |detail: String| HeaderError::Malformed {
        format: FORMAT,
        detail,
    };
    let mut pre = [0u8; 10];
    r.read_exact(&mut pre).map_err(|e| bad(e.to_string()))?;
    if &pre[..6] != MAGIC {
        return Err(bad("no \\x93NUMPY magic".into()));
    }
    if pre[6] != 1 {
        return Err(HeaderError::invalid(
            FORMAT,
            "version",
            format!("{}.{}", pre[6], pre[7]),
            "1.0",
        ));
    }
    let hlen = u16::from_le_bytes([pre[8], pre[9]]) as usize;
    let mut dict = vec![0u8; hlen];
    r.read_exact(&mut dict).map_err(|e| bad(e.to_string()))?;
    let dict = String::from_utf8_lossy(&dict).into_owned();
    let field = |name: &str| -> Result<String, HeaderError> {
        let key = format!("'{name}':");
        let at = dict
            .find(&key)
            .ok_or_else(|| HeaderError::missing(FORMAT, name))?;
        Ok(dict[at + key.len()..].trim_start().to_string())
    };
    let descr_rest = field("descr")?;
    let descr = descr_rest
        .trim_start_matches('\'')
        .split('\'')
        .next()
        .unwrap_or("")
        .to_string();
    if field("fortran_order")?.starts_with("True") {
        return Err(HeaderError::invalid(
            FORMAT,
            "fortran_order",
            "True",
            "False",
        ));
    }
    let shape_rest = field("shape")?;
    let inner = shape_rest
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| HeaderError::invalid(FORMAT, "shape", &shape_rest, "a tuple"))?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| HeaderError::invalid(FORMAT, "shape", inner, "a tuple of integers"))?;
    let count: usize = shape.iter().product();
    let width = match descr.as_str() {
        "<f4" => 4,
        "<c8" => 8,
        other => {
            return Err(HeaderError::invalid(
                FORMAT,
                "descr",
                other,
                "'<f4' or '<c8'",
            ))
        }
    };
    let mut bytes = vec![0u8; count * width];
    r.read_exact(&mut bytes)
        .map_err(|e| bad(format!("data shorter than shape {shape:?}: {e}")))?;
    let f = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    let data = if width == 4 {
        NpyData::F32(bytes.chunks_exact(4).map(f).collect())
    } else {
        NpyData::C64(
            bytes
                .chunks_exact(8)
                .map(|c| Complex32::new(f(&c[..4]), f(&c[4..])))
                .collect(),
        )
    };
    Ok(NpyArray { shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_numpy_shaped() {
        let h = header("<c8", &[2, 1, 5]);
        assert_eq!(h.len() % 64, 0);
        let text = String::from_utf8_lossy(&h[10..]);
        assert!(text.starts_with("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 1, 5), }"));
        assert!(text.ends_with('\n'));
        let h1 = header("<f4", &[7]);
        assert!(String::from_utf8_lossy(&h1).contains("'shape': (7,)"));
    }

    #[test]
    fn rejects_other_dtypes_and_short_data() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&header("<f8", &[1]));
        buf.extend_from_slice(&[0; 8]);
        let e = read(&mut buf.as_slice()).unwrap_err();
        assert!(e.to_string().contains("descr"), "{e}");
        let mut buf = Vec::new();
        write_f32(&mut buf, &[4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        buf.truncate(buf.len() - 1);
        assert!(read(&mut buf.as_slice()).is_err());
        assert!(write_f32(&mut Vec::new(), &[3], &[1.0]).is_err());
    }
}
