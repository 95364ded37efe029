//! Units survive the round trip text -> value -> text -> value, inside a configuration too.

use std::time::Duration;

use metampi_config::units::{format_duration, parse_bandwidth, parse_duration};
use metampi_config::{parse_str, Bandwidth};

fn link_options(opts: &str) -> metampi_config::LinkOptions {
    let text = format!(
        "METAHOST a {{ LAUNCH = local; }}\nMETAHOST b {{ LAUNCH = local; }}\nPAIR a b 1 - {{ {opts} }}\na <-> b\n"
    );
    let cfg = parse_str("units.cfg", &text).unwrap_or_else(|e| panic!("{e}"));
    cfg.layout().links[0].options.clone()
}

#[test]
fn bandwidth_spellings_agree() {
    let expect = Bandwidth::from_bits_per_sec(100_000_000);
    for s in [
        "100Mbit",
        "100 Mbit/s",
        "100Mbps",
        "100Mb/s",
        "0.1Gbit",
        "100000kbit",
        "12.5MB/s",
        "12.5MByte/s",
        "12.5 MBps",
        "12500KB/s",
    ] {
        assert_eq!(parse_bandwidth(s).ok(), expect, "{s}");
        assert_eq!(
            link_options(&format!("BANDWIDTH = {s};")).bandwidth,
            expect,
            "{s} in a PAIR"
        );
    }
    // Binary prefixes are powers of 1024.
    assert_eq!(
        parse_bandwidth("1MiB/s").map(Bandwidth::bits_per_sec),
        Ok(8 * 1024 * 1024)
    );
    assert_eq!(
        parse_bandwidth("1Mibit").map(Bandwidth::bits_per_sec),
        Ok(1024 * 1024)
    );
    // Bits and bytes are told apart by case: b is a bit, B a byte.
    assert_eq!(
        parse_bandwidth("8Mb").map(Bandwidth::bits_per_sec),
        Ok(8_000_000)
    );
    assert_eq!(
        parse_bandwidth("8MB").map(Bandwidth::bits_per_sec),
        Ok(64_000_000)
    );
}

#[test]
fn bandwidth_round_trip() {
    let mut v: u64 = 1;
    loop {
        for x in [
            Some(v),
            v.checked_add(1),
            v.checked_mul(3),
            v.checked_mul(1000),
            v.checked_mul(1024),
        ]
        .into_iter()
        .flatten()
        {
            let b = Bandwidth::from_bits_per_sec(x).expect("nonzero");
            let text = b.to_string();
            assert_eq!(parse_bandwidth(&text), Ok(b), "{x} -> {text}");
        }
        match v.checked_mul(7).and_then(|x| x.checked_add(3)) {
            Some(next) => v = next,
            None => break,
        }
    }
    for (bits, text) in [
        (100_000_000, "100Mbit/s"),
        (2_000_000, "2Mbit/s"),
        (1_500_000, "1500kbit/s"),
        (155_520_000, "155520kbit/s"),
        (999, "999bit/s"),
    ] {
        assert_eq!(
            Bandwidth::from_bits_per_sec(bits)
                .map(|b| b.to_string())
                .as_deref(),
            Some(text)
        );
    }
}

#[test]
fn duration_round_trip() {
    let mut ns: u64 = 1;
    while ns < u64::MAX / 11 {
        let candidates = [
            Some(ns),
            ns.checked_mul(1000),
            ns.checked_mul(1_000_000),
            ns.checked_mul(10).and_then(|x| x.checked_add(7)),
        ];
        for x in candidates.into_iter().flatten() {
            let d = Duration::from_nanos(x);
            let text = format_duration(d);
            assert_eq!(parse_duration(&text), Ok(d), "{x} -> {text}");
        }
        ns = ns * 11 + 1;
    }
    for (s, d) in [
        ("20ms", Duration::from_millis(20)),
        ("200us", Duration::from_micros(200)),
        ("0.25s", Duration::from_millis(250)),
        ("1.5ms", Duration::from_micros(1500)),
    ] {
        assert_eq!(parse_duration(s), Ok(d), "{s}");
        let o = link_options(&format!("LATENCY = {s}; BUNDLE_DEADLINE = {s};"));
        assert_eq!((o.latency, o.bundle_deadline), (Some(d), Some(d)));
        assert_eq!(parse_duration(&format_duration(d)), Ok(d));
    }
    assert_eq!(format_duration(Duration::from_micros(1500)), "1500us");
}

#[test]
fn link_level_units_override_the_pair() {
    let text = "METAHOST a { LAUNCH = local; }\nMETAHOST b { LAUNCH = local; }\n\
                BANDWIDTH = 10Mbit\n\
                PAIR a b 1 - { LATENCY = 20ms; }\n\
                a <-> b LATENCY=1ms BUNDLE_DEADLINE=50us\n";
    let cfg = parse_str("units.cfg", text).unwrap_or_else(|e| panic!("{e}"));
    let o = &cfg.layout().links[0].options;
    assert_eq!(
        o.bandwidth.map(Bandwidth::bits_per_sec),
        Some(10_000_000),
        "global default"
    );
    assert_eq!(o.latency, Some(Duration::from_millis(1)), "link beats PAIR");
    assert_eq!(o.bundle_deadline, Some(Duration::from_micros(50)));
}

#[test]
fn tls_settings_resolve() {
    // Links choose the mode; credentials are per meta host (see config_tls.rs).
    assert_eq!(link_options("TLS = auto;").tls, metampi_config::Tls::Auto);
    assert_eq!(link_options("TLS = OFF;").tls, metampi_config::Tls::Off);
    assert_eq!(link_options("").tls, metampi_config::Tls::Off);
}
