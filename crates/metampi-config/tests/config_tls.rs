//! TLS settings: `TLS = off | auto | on` per link (global, PAIR, link), the meta hosts'
//! identities (`TLSCERT`, `TLSKEY`, `TLSCA`, `TLSPIN`, `TLSNAME`, per METAHOST or global),
//! what `metampi check` prints, and every error with its line and column.

use metampi_config::{parse_str, Checksum, Tls};

fn err(text: &str) -> String {
    match parse_str("t.cfg", text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn pin(byte: u8) -> String {
    format!("sha256:{}", format!("{byte:02x}").repeat(32))
}

#[test]
fn modes_per_link_pair_and_global() {
    let cfg = parse_str(
        "t.cfg",
        "TLS = auto\n\
         METAHOST a { LAUNCH = local; }\n\
         METAHOST b { LAUNCH = local; }\n\
         METAHOST c { LAUNCH = local; }\n\
         PAIR a b 1 - { TLS = off; }\n\
         a <-> b\n\
         PAIR a c 1\n\
         a -> c TLS=OFF, a -> c\n\
         PAIR c a 1\n\
         c -> a\n\
         PAIR b c 1\n\
         b <-> c\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let l = cfg.layout();
    let mode = |from: usize, to: usize| -> Vec<Tls> {
        l.links
            .iter()
            .filter(|k| k.from_host == from && k.to_host == to)
            .map(|k| k.options.tls)
            .collect()
    };
    assert_eq!(mode(0, 1), [Tls::Off], "PAIR beats global");
    assert_eq!(
        mode(1, 0),
        [Tls::Off],
        "'<->' gives both directions the PAIR's mode"
    );
    assert_eq!(
        mode(0, 2),
        [Tls::Off, Tls::Auto],
        "link beats PAIR and global"
    );
    assert_eq!(mode(2, 0), [Tls::Auto]);
    assert_eq!(mode(1, 2), [Tls::Auto]);
    let text = l.to_string();
    assert!(text.contains("compress=auto tls=off"), "{text}");
    assert!(text.contains("compress=auto tls=auto"), "{text}");
    assert!(
        text.contains(
            "\ntls=auto: each router derives a key and self-signed certificate from the job secret"
        ),
        "{text}"
    );
    assert!(!text.contains("tls identities"), "{text}");
}

#[test]
fn identities_of_meta_hosts() {
    let text = format!(
        "TLSCA = /etc/metampi/ca.pem\n\
         METAHOST a {{ LAUNCH = local; TLSCERT = a.pem; TLSKEY = a.key; TLSNAME = a.example.org; }}\n\
         METAHOST b {{ LAUNCH = local; TLSCERT = \"b cert.pem\"; TLSKEY = b.key; TLSCA = b-ca.pem; \
                       TLSPIN = {}, {}; }}\n\
         METAHOST c {{ LAUNCH = local; TLSPIN = {}; }}\n\
         PAIR a b 1 - {{ TLS = on; }}\n\
         a <-> b\n\
         PAIR a c 1\n\
         a <-> c\n\
         AUTO_ROUTER\n",
        pin(0xab),
        // OpenSSL writes fingerprints upper case with colons: accepted as they are.
        vec!["CD"; 32].join(":"),
        pin(1),
    );
    let cfg = parse_str("t.cfg", &text).unwrap_or_else(|e| panic!("{e}"));
    let [a, b, c] = &cfg.hosts[..] else {
        panic!("three hosts")
    };
    assert_eq!(a.tls.cert.as_deref(), Some("a.pem"));
    assert_eq!(a.tls.key.as_deref(), Some("a.key"));
    assert_eq!(
        a.tls.ca.as_deref(),
        Some("/etc/metampi/ca.pem"),
        "global default"
    );
    assert_eq!(a.tls.name_or(&a.name), "a.example.org");
    assert!(a.tls.pins.is_empty());
    assert_eq!(b.tls.cert.as_deref(), Some("b cert.pem"), "a quoted path");
    assert_eq!(
        b.tls.ca.as_deref(),
        Some("b-ca.pem"),
        "the block beats the global"
    );
    assert_eq!(b.tls.pins, vec![[0xab; 32], [0xcd; 32]]);
    assert_eq!(b.tls.name_or(&b.name), "b");
    assert_eq!(c.tls.pins, vec![[1; 32]]);
    assert_eq!(
        c.tls.cert, None,
        "c's links are plain: it needs no certificate"
    );
    let layout = cfg.layout();
    assert_eq!(
        layout.hosts[1].tls, b.tls,
        "the layout carries the identities"
    );
    let table = layout.to_string();
    let tail = &table[table.find("tls identities").expect("a TLS section")..];
    assert_eq!(
        tail,
        format!(
            "tls identities (links with tls=on)\n\
             \x20 HOST  TLSCERT     TLSKEY  CHECKED BY\n\
             \x20 a     a.pem       a.key   CA /etc/metampi/ca.pem, name a.example.org\n\
             \x20 b     b cert.pem  b.key   CA b-ca.pem, name b; pin {}; pin {}\n",
            pin(0xab),
            pin(0xcd)
        )
    );
}

#[test]
fn on_needs_both_ends_complete() {
    const AB: &str = "METAHOST A { LAUNCH = local; TLSCERT = a.pem; TLSKEY = a.key; TLSPIN = sha256:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab:ab; }\n";
    let with_b =
        |b: &str, pair: &str| err(&format!("{AB}METAHOST B {{ LAUNCH = local; {b} }}\n{pair}"));
    assert_eq!(
        with_b("", "PAIR A B 1 - { TLS = on; }\nA <-> B\n"),
        "t.cfg:3:16: TLS = on for the links A -> B is missing TLSCERT: give meta host 'B' \
         TLSCERT = <PEM certificate chain> in its METAHOST block (or at top level for every meta \
         host); TLS = auto needs no certificates"
    );
    assert_eq!(
        with_b(
            "TLSCERT = b.pem;",
            "PAIR A B 1 -\nA -> B TLS=on\nPAIR B A 1\nB -> A\n"
        ),
        "t.cfg:4:8: TLS = on for the links A -> B is missing TLSKEY: give meta host 'B' TLSKEY = \
         <PEM private key of its TLSCERT>"
    );
    assert_eq!(
        with_b(
            "TLSCERT = b.pem; TLSKEY = b.key;",
            "TLS = on\nPAIR B A 1\nB <-> A\n"
        ),
        "t.cfg:3:1: TLS = on for the links B -> A is missing TLSCA or TLSPIN: say how the other \
         side checks meta host 'B': TLSCA = <PEM bundle of the CA that signed its certificate> or \
         TLSPIN = sha256:<64 hex digits of its certificate>"
    );
    // A CA-checked certificate is checked for a DNS name; 'B|1' is none.
    assert_eq!(
        err("TLSCERT = c.pem\nTLSKEY = k.pem\nTLSCA = ca.pem\nMETAHOST A { }\nMETAHOST B|1 { }\nPAIR A B|1 1 - TLS=on\nA <-> B|1\n"),
        "t.cfg:6:16: TLS = on for the links A -> B|1 is missing TLSNAME: its certificate is \
         checked against TLSCA for the meta host's name, and 'B|1' is not a DNS name: give meta \
         host 'B|1' TLSNAME = <the DNS name in its certificate>"
    );
    // With TLSNAME, or with TLS = auto, the same meta hosts are fine.
    parse_str(
        "t.cfg",
        "TLSCERT = c.pem\nTLSKEY = k.pem\nTLSCA = ca.pem\nMETAHOST A { }\n\
         METAHOST B|1 { TLSNAME = b1.example.org; }\nPAIR A B|1 1 - TLS=on\nA <-> B|1\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    parse_str(
        "t.cfg",
        "METAHOST A { }\nMETAHOST B|1 { }\nPAIR A B|1 1 - TLS=auto\nA <-> B|1\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn bad_values_and_misplaced_settings() {
    assert_eq!(
        err("METAHOST A {\n  TLSPIN = sha256:abcd;\n}\n"),
        "t.cfg:2:12: bad value 'sha256:abcd' for TLSPIN: expected SHA-256 certificate \
         fingerprints: 'sha256:' and 64 hex digits each (colons between bytes allowed), separated \
         by commas"
    );
    assert_eq!(
        err(&format!(
            "TLSPIN = {}, sha256:zz\nMETAHOST A {{ }}\n",
            pin(1)
        )),
        format!(
            "t.cfg:1:10: bad value '{}, sha256:zz' for TLSPIN: expected SHA-256 certificate \
             fingerprints: 'sha256:' and 64 hex digits each (colons between bytes allowed), \
             separated by commas",
            pin(1)
        )
    );
    assert_eq!(
        err("METAHOST A { TLSNAME = -bad-.example; }"),
        "t.cfg:1:24: bad value '-bad-.example' for TLSNAME: expected a DNS name, the one the meta \
         host's certificate carries (letters, digits, '-' and '_' in dot-separated labels)"
    );
    assert_eq!(
        err("METAHOST A { TLSNAME = 10.0.0.1; }"),
        "t.cfg:1:24: bad value '10.0.0.1' for TLSNAME: expected a DNS name, the one the meta \
         host's certificate carries (letters, digits, '-' and '_' in dot-separated labels)"
    );
    assert_eq!(
        err("METAHOST A { TLSKEY = a.key;\n TLSKEY = b.key; }"),
        "t.cfg:2:2: TLSKEY is already set in METAHOST block 'A' (first at 1:14)"
    );
    assert_eq!(
        err("METAHOST A { TLSCERT = ; }"),
        "t.cfg:1:24: expected a value for TLSCERT, found ';'"
    );
    // Credentials on a link: the old spelling, and the host settings in the wrong place.
    assert_eq!(
        err("METAHOST A { }\nMETAHOST B { }\nPAIR A B 1 - {\n  TLS = on;\n  CERT = a.pem;\n}\nA <-> B\n"),
        "t.cfg:5:3: unknown keyword 'CERT' in PAIR options (expected one of PORT, BANDWIDTH, \
         LATENCY, COMPRESSION, CHECKSUM, TLS, BUNDLE_DEADLINE); TLS credentials belong to meta hosts: \
         TLSCERT in a METAHOST block, or at top level for every meta host"
    );
    assert_eq!(
        err("METAHOST A { }\nMETAHOST B { }\nPAIR A B 1\nA <-> B TLS=on TLSPIN=sha256:00\n"),
        "t.cfg:4:16: unknown keyword 'TLSPIN' in link options (expected one of PORT, BANDWIDTH, \
         LATENCY, COMPRESSION, CHECKSUM, TLS, BUNDLE_DEADLINE); TLSPIN describes a meta host: put it in the \
         METAHOST block of the meta host it belongs to (or at top level for every meta host); \
         links only choose TLS = off, auto or on"
    );
    assert_eq!(
        err("PIN = sha256:00\n"),
        "t.cfg:1:1: unknown keyword 'PIN' at top level (expected one of NUMHOSTS, OPTIONS, \
         CONNECTIONS, METAHOST, PAIR, NICDEF, AUTO_ROUTER, PORTBASE, ROUTERTIMEOUT, SPLITSIZE, \
         ISEND_NUM, HETERO, EXCHANGE_ORDER, SECRET_FILE, LAUNCH, BYTEORDER, BANDWIDTH, LATENCY, \
         COMPRESSION, CHECKSUM, TLS, TLSCERT, TLSKEY, TLSCA, TLSPIN, BUNDLE_DEADLINE); TLS credentials \
         belong to meta hosts: TLSPIN in a METAHOST block, or at top level for every meta host"
    );
    assert!(err("TLSNAME = a.example.org\n")
        .ends_with("; TLSNAME names one meta host's certificate: put it in that METAHOST block"));
}

/// `CHECKSUM` per level like `TLS`; `auto` (the default) checks payloads on plain
/// links and leaves them to TLS where it runs; the table says where payloads are not
/// checked.
#[test]
fn payload_checksums_per_level_and_under_tls() {
    let cfg = parse_str(
        "t.cfg",
        "CHECKSUM = off\n\
         METAHOST a { LAUNCH = local; }\n\
         METAHOST b { LAUNCH = local; }\n\
         METAHOST c { LAUNCH = local; }\n\
         PAIR a b 1 - { CHECKSUM = auto; }\n\
         a <-> b\n\
         PAIR a c 1 - { TLS = auto; CHECKSUM = Auto; }\n\
         a -> c CHECKSUM=on, a -> c\n\
         PAIR c a 1\n\
         c -> a\n\
         PAIR b c 1 - { CHECKSUM = on; }\n\
         b <-> c\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let l = cfg.layout();
    let modes = |from: usize, to: usize| -> Vec<(Checksum, bool)> {
        l.links
            .iter()
            .filter(|k| k.from_host == from && k.to_host == to)
            .map(|k| (k.options.checksum, k.options.payload_checksum()))
            .collect()
    };
    assert_eq!(modes(0, 1), [(Checksum::Auto, true)], "PAIR beats global");
    assert_eq!(modes(1, 0), [(Checksum::Auto, true)]);
    assert_eq!(
        modes(0, 2),
        [(Checksum::On, true), (Checksum::Auto, false)],
        "link beats PAIR; auto leaves payloads to TLS"
    );
    assert_eq!(modes(2, 0), [(Checksum::Off, false)], "global");
    let text = l.to_string();
    assert_eq!(text.matches("checksum=off").count(), 2, "{text}");
    assert!(
        text.contains("compress=auto tls=off checksum=off"),
        "{text}"
    );
    assert!(
        text.contains("compress=auto tls=auto checksum=off"),
        "{text}"
    );
}
