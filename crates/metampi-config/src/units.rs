//! Quantities with units: bandwidths (bit/s vs byte/s, SI and binary prefixes), durations
//! (ns, us, ms, s), and port lists. Parsing is exact (decimal arithmetic, no floats), and
//! formatting is chosen so that `parse(format(x)) == x` for every value.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Why a quantity did not parse; the parser turns it into [`ErrorKind::BadUnit`](crate::ErrorKind).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitError(pub String);

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UnitError {}

/// A link bandwidth in bits per second (always greater than zero).
///
/// Parses `100Mbit`, `100 Mbit/s`, `100Mbps`, `1Gbit`, `12.5MB/s`, `12.5MByte/s`, `64KiB/s`:
/// `bit`, `bits`, `b`, `bps` count bits; `B`, `Byte`, `Bytes`, `Bps` count bytes (8 bits);
/// prefixes `k`/`K`, `M`, `G`, `T` are powers of 1000 and `Ki`, `Mi`, `Gi`, `Ti` powers of
/// 1024; `/s` is optional. A bare number is rejected: `100M` could be bits or bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bandwidth {
    bits_per_sec: u64,
}

impl Bandwidth {
    /// A bandwidth of `bits_per_sec` bits per second; `None` for zero.
    #[must_use]
    pub const fn from_bits_per_sec(bits_per_sec: u64) -> Option<Self> {
        if bits_per_sec == 0 {
            None
        } else {
            Some(Self { bits_per_sec })
        }
    }

    /// Bits per second.
    #[must_use]
    pub const fn bits_per_sec(self) -> u64 {
        self.bits_per_sec
    }

    /// Bytes per second, rounded down.
    #[must_use]
    pub const fn bytes_per_sec(self) -> u64 {
        self.bits_per_sec / 8
    }
}

impl fmt::Display for Bandwidth {
    /// The largest SI prefix that divides exactly: `100Mbit/s`, `1500kbit/s`, `12bit/s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const STEPS: [(u64, &str); 4] = [
            (1_000_000_000_000, "T"),
            (1_000_000_000, "G"),
            (1_000_000, "M"),
            (1_000, "k"),
        ];
        let v = self.bits_per_sec;
        for (factor, prefix) in STEPS {
            if v % factor == 0 {
                return write!(f, "{}{prefix}bit/s", v / factor);
            }
        }
        write!(f, "{v}bit/s")
    }
}

impl FromStr for Bandwidth {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, UnitError> {
        parse_bandwidth(s)
    }
}

/// Parses a bandwidth; see [`Bandwidth`] for the accepted forms.
///
/// # Errors
/// A missing or unknown unit, a zero value, a value below 1 bit/s resolution, or overflow.
pub fn parse_bandwidth(s: &str) -> Result<Bandwidth, UnitError> {
    let (num, unit) = split_number(s)?;
    if unit.is_empty() {
        return Err(UnitError(
            "missing unit: say whether it counts bits or bytes, e.g. 100Mbit, 1Gbit/s or 12.5MB/s"
                .into(),
        ));
    }
    let (multiplier, bytes) = bandwidth_unit(unit).ok_or_else(|| {
        UnitError(format!(
            "unknown unit '{unit}' (expected bit/s or byte/s with an optional k, M, G, T, Ki, \
             Mi, Gi or Ti prefix, e.g. 100Mbit, 1Gbit/s, 12.5MB/s, 64KiB/s)"
        ))
    })?;
    let factor = if bytes { multiplier * 8 } else { multiplier };
    let bits = num
        .times(factor)
        .ok_or_else(|| UnitError("not a whole number of bits per second, or too large".into()))?;
    let bits = u64::try_from(bits).map_err(|_| UnitError("too large".into()))?;
    Bandwidth::from_bits_per_sec(bits)
        .ok_or_else(|| UnitError("a bandwidth must be greater than zero".into()))
}

/// Parses a duration such as `20ms`, `0.5ms`, `200us`, `200µs`, `3s`, `1500ns`, `2min`.
/// A bare `0` is accepted; any other number needs a unit.
///
/// # Errors
/// A missing or unknown unit, a value that is not a whole number of nanoseconds, or overflow.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let (num, unit) = split_number(s)?;
    let factor: u128 = match unit {
        "" if num.is_zero() => 1,
        "" => {
            return Err(UnitError(
                "missing unit (expected ns, us, ms, s, min or h, e.g. 20ms or 200us)".into(),
            ))
        }
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        other => {
            return Err(UnitError(format!(
                "unknown unit '{other}' (expected ns, us, ms, s, min or h)"
            )))
        }
    };
    let ns = num
        .times(factor)
        .ok_or_else(|| UnitError("not a whole number of nanoseconds, or too large".into()))?;
    let ns = u64::try_from(ns).map_err(|_| UnitError("too large".into()))?;
    Ok(Duration::from_nanos(ns))
}

/// Formats a duration in the largest of `s`, `ms`, `us`, `ns` that represents it exactly;
/// [`parse_duration`] reads it back to the same value.
#[must_use]
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    for (factor, unit) in [(1_000_000_000u128, "s"), (1_000_000, "ms"), (1_000, "us")] {
        if ns % factor == 0 {
            return format!("{}{unit}", ns / factor);
        }
    }
    format!("{ns}ns")
}

/// Parses a list of TCP ports: `7000`, `7000-7003`, `7000, 7002-7003`.
///
/// # Errors
/// Non-numeric text, a port outside 1..=65535, or a backwards range.
pub fn parse_port_list(s: &str) -> Result<Vec<u16>, UnitError> {
    let mut ports = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(UnitError("empty entry in port list".into()));
        }
        if let Some((lo, hi)) = part.split_once('-') {
            let lo = parse_port(lo.trim())?;
            let hi = parse_port(hi.trim())?;
            if lo > hi {
                return Err(UnitError(format!("port range {lo}-{hi} runs backwards")));
            }
            if usize::from(hi - lo) + ports.len() > 65_535 {
                return Err(UnitError("too many ports".into()));
            }
            ports.extend(lo..=hi);
        } else {
            ports.push(parse_port(part)?);
        }
    }
    Ok(ports)
}

/// Parses one TCP port in 1..=65535.
///
/// # Errors
/// Non-numeric text or a value outside 1..=65535.
pub fn parse_port(s: &str) -> Result<u16, UnitError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(UnitError(format!(
            "'{s}' is not a port number (expected 1..=65535)"
        )));
    }
    match s.parse::<u32>() {
        Ok(p @ 1..=65_535) => u16::try_from(p).map_err(|_| UnitError("port too large".into())),
        _ => Err(UnitError(format!(
            "port {s} is out of range (expected 1..=65535)"
        ))),
    }
}

/// An exact decimal: `digits / 10^scale`.
#[derive(Debug, Clone, Copy)]
struct Decimal {
    digits: u128,
    scale: u32,
}

impl Decimal {
    fn is_zero(self) -> bool {
        self.digits == 0
    }

    /// `self * factor` if that is a whole number that fits.
    fn times(self, factor: u128) -> Option<u128> {
        let product = self.digits.checked_mul(factor)?;
        let div = 10u128.checked_pow(self.scale)?;
        (product % div == 0).then_some(product / div)
    }
}

/// Splits `12.5 MB/s` into the number and the unit text (trimmed).
fn split_number(s: &str) -> Result<(Decimal, &str), UnitError> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    if num.is_empty() {
        return Err(UnitError("expected a number first".into()));
    }
    let mut digits: u128 = 0;
    let mut scale: u32 = 0;
    let mut seen_dot = false;
    let mut seen_digit = false;
    for c in num.chars() {
        if c == '.' {
            if seen_dot {
                return Err(UnitError("more than one decimal point".into()));
            }
            seen_dot = true;
            continue;
        }
        seen_digit = true;
        let d = u128::from(c.to_digit(10).unwrap_or(0));
        digits = digits
            .checked_mul(10)
            .and_then(|v| v.checked_add(d))
            .ok_or_else(|| UnitError("number too large".into()))?;
        if seen_dot {
            scale += 1;
            if scale > 30 {
                return Err(UnitError("too many decimal places".into()));
            }
        }
    }
    if !seen_digit {
        return Err(UnitError("expected a number first".into()));
    }
    Ok((Decimal { digits, scale }, unit.trim()))
}

/// Maps a bandwidth unit to (multiplier, counts bytes).
fn bandwidth_unit(unit: &str) -> Option<(u128, bool)> {
    // `Mbps` / `MBps`: the `ps` suffix belongs to a `b`/`B` base; `/s` may follow anything.
    let base = if let Some(b) = unit.strip_suffix("/s") {
        b
    } else if let Some(b) = unit.strip_suffix("ps") {
        if !(b.ends_with('b') || b.ends_with('B')) {
            return None;
        }
        b
    } else {
        unit
    };
    let (multiplier, rest) = split_prefix(base);
    let bytes = match rest {
        "b" => false,
        "B" => true,
        r if r.eq_ignore_ascii_case("bit") || r.eq_ignore_ascii_case("bits") => false,
        r if r.eq_ignore_ascii_case("byte") || r.eq_ignore_ascii_case("bytes") => true,
        _ => return None,
    };
    Some((multiplier, bytes))
}

fn split_prefix(s: &str) -> (u128, &str) {
    let mut chars = s.chars();
    let power = match chars.next() {
        Some('k' | 'K') => 1,
        Some('M') => 2,
        Some('G') => 3,
        Some('T') => 4,
        _ => return (1, s),
    };
    let rest = chars.as_str();
    if let Some(r) = rest.strip_prefix('i') {
        // `Ki` etc., but not the `i` of a unit word (there is none starting with `i`).
        return (1024u128.pow(power), r);
    }
    (1000u128.pow(power), rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bw(s: &str) -> u64 {
        parse_bandwidth(s)
            .map(Bandwidth::bits_per_sec)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn bandwidth_forms() {
        assert_eq!(bw("100Mbit"), 100_000_000);
        assert_eq!(bw("100 Mbit/s"), 100_000_000);
        assert_eq!(bw("100Mbps"), 100_000_000);
        assert_eq!(bw("100Mb"), 100_000_000);
        assert_eq!(bw("12.5MB/s"), 100_000_000);
        assert_eq!(bw("12.5MByte/s"), 100_000_000);
        assert_eq!(bw("12.5MBps"), 100_000_000);
        assert_eq!(bw("1Gbit"), 1_000_000_000);
        assert_eq!(bw("1Kibit"), 1024);
        assert_eq!(bw("64KiB/s"), 64 * 1024 * 8);
        assert_eq!(bw("10kbit/s"), 10_000);
        assert_eq!(bw("10Kbit/s"), 10_000);
        assert_eq!(bw("155Mbit"), 155_000_000);
        assert_eq!(bw("2bits/s"), 2);
        assert_eq!(bw("3 bytes"), 24);
    }

    #[test]
    fn bandwidth_errors() {
        for bad in [
            "100",
            "100M",
            "100mbit",
            "100Mbt",
            "0Mbit",
            "0.1bit",
            "Mbit",
            "1.2.3Mbit",
        ] {
            assert!(parse_bandwidth(bad).is_err(), "{bad} should fail");
        }
        assert!(parse_bandwidth("99999999999999999999Tbit").is_err());
    }

    #[test]
    fn bandwidth_round_trip() {
        for v in [
            1u64,
            7,
            999,
            1000,
            1500,
            100_000_000,
            155_000_000,
            1 << 40,
            u64::MAX,
        ] {
            let b = Bandwidth::from_bits_per_sec(v).expect("nonzero");
            let text = b.to_string();
            assert_eq!(parse_bandwidth(&text), Ok(b), "{text}");
        }
        assert_eq!(bw("12.5MB/s").to_string(), "100000000");
        assert_eq!(
            parse_bandwidth("12.5MB/s").map(|b| b.to_string()),
            Ok("100Mbit/s".into())
        );
    }

    #[test]
    fn durations() {
        let d = |s: &str| parse_duration(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(d("20ms"), Duration::from_millis(20));
        assert_eq!(d("0.5ms"), Duration::from_micros(500));
        assert_eq!(d("200us"), Duration::from_micros(200));
        assert_eq!(d("200µs"), Duration::from_micros(200));
        assert_eq!(d("3 s"), Duration::from_secs(3));
        assert_eq!(d("2min"), Duration::from_secs(120));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in ["20", "20m", "1.5ns", "ms", "20 parsecs", "99999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn duration_round_trip() {
        for ns in [
            0u64,
            1,
            999,
            1000,
            1500,
            200_000,
            20_000_000,
            3_000_000_000,
            u64::MAX,
        ] {
            let dur = Duration::from_nanos(ns);
            let text = format_duration(dur);
            assert_eq!(parse_duration(&text), Ok(dur), "{text}");
        }
        assert_eq!(format_duration(Duration::from_micros(200)), "200us");
        assert_eq!(format_duration(Duration::from_millis(20)), "20ms");
    }

    #[test]
    fn ports() {
        assert_eq!(parse_port_list("7000"), Ok(vec![7000]));
        assert_eq!(
            parse_port_list("7000-7002, 7010"),
            Ok(vec![7000, 7001, 7002, 7010])
        );
        for bad in ["0", "65536", "7003-7000", "x", "", "7000,,7001"] {
            assert!(parse_port_list(bad).is_err(), "{bad} should fail");
        }
    }
}
