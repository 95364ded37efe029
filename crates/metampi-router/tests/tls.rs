//! TLS on router links (`TLS = auto | on` in the description language).
//!
//! Two-site jobs whose router links run through a proxy that records what
//! travels on the wire: ranks exchange messages that carry a known marker,
//! and the marker (and the link hello) must not be on the wire with TLS,
//! while the same job without TLS shows them (so the check can fail). A job
//! with user certificates (made here with rcgen: one site pinned, the other
//! checked against a CA) runs the same traffic. While a TLS job runs,
//! strangers are refused on a link port: plain TCP, a TLS client without a
//! certificate, and one with a certificate that is not pinned even though it
//! knows the job secret. A TLS job whose links are cut and corrupted
//! recovers (reconnect, new handshake, resend).
#![cfg(feature = "tls")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use metampi::traits::*;
use metampi_testkit::traffic::splitmix;
use metampi_testkit::{link_total, Faults, ProxyCounts, Ranks, StatsDir};

/// What every message starts with; must never be seen on a TLS link.
const MARKER: &[u8] = b"METAMPI-PLAINTEXT-MARKER";

/// Message `seq` from `src` to `dst`: the marker, the triple, then seeded
/// filler (mostly small, every tenth 20-200 KiB: several frames and records).
fn message(src: i32, dst: i32, seq: u32) -> Vec<u8> {
    let mut s = (src as u64) << 40 ^ (dst as u64) << 20 ^ seq as u64;
    let r = splitmix(&mut s);
    let n = if r % 10 == 0 {
        (20 << 10) + (r >> 8) as usize % (180 << 10)
    } else {
        (r >> 8) as usize % 3000
    };
    let mut m = MARKER.to_vec();
    m.extend_from_slice(format!("{src}>{dst}#{seq};").as_bytes());
    m.extend((0..n).map(|_| splitmix(&mut s) as u8));
    m
}

/// Every rank sends `per_pair` messages to every rank of the other site and
/// checks what it gets, in order.
fn traffic(world: &metampi::topology::SimpleCommunicator, per_pair: u32) {
    let (me, size) = (world.rank(), world.size());
    let half = size / 2;
    let remote: Vec<i32> = (0..size).filter(|&r| (r < half) != (me < half)).collect();
    let mut sends = Vec::new();
    for seq in 0..per_pair {
        for &dst in &remote {
            sends.push(
                world
                    .process_at_rank(dst)
                    .immediate_send_owned(message(me, dst, seq), 3),
            );
        }
    }
    for seq in 0..per_pair {
        for &src in &remote {
            let (m, _) = world.process_at_rank(src).receive_vec_with_tag::<u8>(3);
            assert!(
                m == message(src, me, seq),
                "message {seq} from {src} to {me} arrived damaged or out of order"
            );
        }
    }
    for s in sends {
        s.wait().expect("send completes");
    }
    world.barrier();
}

fn config(portbase: u16, tls: &str, hosts_extra: [&str; 2]) -> String {
    format!(
        "PORTBASE {portbase}\nTLS = {tls}\nCOMPRESSION = off\n\
         METAHOST a {{ LAUNCH = local; NPROCS = 2; NODES = a0; {} }}\n\
         METAHOST b {{ LAUNCH = local; NPROCS = 2; NODES = b0; {} }}\n\
         PAIR a b 1\na0 <-> b0\n",
        hosts_extra[0], hosts_extra[1]
    )
}

/// A recording proxy in every link (no faults).
fn recording() -> Faults {
    Faults {
        record: 256 << 20,
        ..Default::default()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Whether a router link's hello is in `r`: `MPLK`, then a router (u32), a link and a link
/// count (u16 each) as small as this job's. The four letters alone turn up by chance in
/// about one of a thousand runs' 4.5 MB of ciphertext.
fn has_link_hello(r: &[u8]) -> bool {
    r.windows(12).any(|w| {
        w[..4] == *b"MPLK"
            && w[4] < 16
            && w[5..8] == [0, 0, 0]
            && w[8] < 16
            && w[9] == 0
            && (1..=16).contains(&w[10])
            && w[11] == 0
    })
}

/// What the proxies saw: (bytes in all, marker seen, link hello seen, every
/// connection starts as TLS would).
fn wire(counts: &ProxyCounts) -> (usize, bool, bool, bool) {
    let counts = counts.lock().unwrap();
    assert_eq!(counts.len(), 2, "one proxy per link");
    let (mut bytes, mut marker, mut hello, mut tls) = (0, false, false, true);
    for c in counts.iter() {
        for dir in 0..2 {
            let r = c.recorded(dir);
            bytes += r.len();
            marker |= contains(&r, MARKER);
            hello |= has_link_hello(&r);
            // A TLS handshake record (type 22, version 3.x), client or server.
            tls &= r.len() > 5 && r[0] == 0x16 && r[1] == 0x03;
        }
    }
    eprintln!(
        "on the wire: {bytes} bytes; marker seen {marker}, link hello seen {hello}, TLS {tls}"
    );
    (bytes, marker, hello, tls)
}

/// Also: TLS authenticates every byte, so the frames' own checksums leave the
/// payload to it (`CHECKSUM = auto`), as the receiving routers' statistics say.
#[test]
fn tls_auto_hides_the_payload() {
    let stats = StatsDir::new("tls_auto_hides_the_payload");
    let (ranks, counts) = Ranks::new(4)
        .meta(&config(25600, "auto", ["", ""]))
        .router_stats(&stats)
        .timeout(Duration::from_secs(180))
        .faulty_links(recording());
    ranks.run("tls_auto_hides_the_payload", |w| {
        traffic(w, 120);
        // Statistics are rewritten twice a second.
        w.barrier();
        std::thread::sleep(Duration::from_millis(1200));
    });
    if metampi_testkit::is_rank() {
        return;
    }
    let unchecked = link_total(stats.path(), "in", "unchecked_frames_in");
    assert!(
        unchecked > 0,
        "frames on TLS links leave the payload to TLS"
    );
    let (bytes, marker, hello, tls) = wire(&counts);
    assert!(
        bytes > 2 << 20,
        "the traffic went through the proxies ({bytes} bytes)"
    );
    assert!(tls, "every link connection starts with a TLS handshake");
    assert!(!marker, "message plaintext is visible on a TLS link");
    assert!(!hello, "the link hello is visible on a TLS link");
}

/// The same job without TLS: the check above can fail.
#[test]
fn plain_links_show_the_payload() {
    let (ranks, counts) = Ranks::new(4)
        .meta(&config(25620, "off", ["", ""]))
        .timeout(Duration::from_secs(180))
        .faulty_links(recording());
    ranks.run("plain_links_show_the_payload", |w| traffic(w, 40));
    if metampi_testkit::is_rank() {
        return;
    }
    let (bytes, marker, hello, tls) = wire(&counts);
    assert!(bytes > 500 << 10, "{bytes} bytes");
    assert!(marker && hello && !tls, "plain links carry plaintext");
}

/// A CA, a certificate for `b` signed by it, and a self-signed one for `a`,
/// in a fresh directory; returns the directory and `a`'s fingerprint.
fn user_certificates() -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("metampi-tls-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "metampi test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let b_key = rcgen::KeyPair::generate().unwrap();
    // The name rule: a CA-checked meta host's certificate names the meta host.
    let b = rcgen::CertificateParams::new(vec!["b".to_string()])
        .unwrap()
        .signed_by(&b_key, &ca, &ca_key)
        .unwrap();
    let a = rcgen::generate_simple_self_signed(vec!["a-site.example.org".to_string()]).unwrap();
    let write = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
    write("ca.pem", ca.pem());
    write("b.pem", b.pem());
    write("b.key", b_key.serialize_pem());
    write("a.pem", a.cert.pem());
    write("a.key", a.key_pair.serialize_pem());
    let fp = metampi_router::tls::fingerprint(a.cert.der());
    (dir, metampi_config::format_pin(&fp))
}

#[test]
fn user_certificates_pinned_and_ca() {
    let mut cfg = String::new();
    let mut dir = None;
    if !metampi_testkit::is_rank() {
        let (d, pin_a) = user_certificates();
        let p = |f: &str| d.join(f).display().to_string();
        cfg = config(
            25640,
            "on",
            [
                &format!(
                    "TLSCERT = \"{}\"; TLSKEY = \"{}\"; TLSPIN = {pin_a};",
                    p("a.pem"),
                    p("a.key")
                ),
                &format!(
                    "TLSCERT = \"{}\"; TLSKEY = \"{}\"; TLSCA = \"{}\";",
                    p("b.pem"),
                    p("b.key"),
                    p("ca.pem")
                ),
            ],
        );
        dir = Some(d);
    }
    let (ranks, counts) = Ranks::new(4)
        .meta(&cfg)
        .timeout(Duration::from_secs(180))
        .faulty_links(recording());
    ranks.run("user_certificates_pinned_and_ca", |w| traffic(w, 60));
    if metampi_testkit::is_rank() {
        return;
    }
    if let Some(d) = dir {
        // The routers read the user's files and leave them alone.
        assert!(d.join("a.key").exists() && d.join("b.key").exists());
        std::fs::remove_dir_all(d).unwrap();
    }
    let (bytes, marker, hello, tls) = wire(&counts);
    assert!(bytes > 1 << 20, "{bytes} bytes");
    assert!(tls && !marker && !hello);
}

/// Accepts any server certificate: the stranger wants to get as far as it can.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS client to `addr` that trusts anything and presents `cert` (a fresh
/// self-signed certificate) or none; runs the job-secret handshake inside as
/// a router would. `Err` with what went wrong, `Ok` if it got in.
fn tls_stranger(addr: &str, with_cert: bool) -> Result<(), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    let config = if with_cert {
        let ck =
            rcgen::generate_simple_self_signed(vec!["router-9.metampi.invalid".into()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
        builder
            .with_client_auth_cert(vec![ck.cert.der().clone()], key)
            .unwrap()
    } else {
        builder.with_no_client_auth()
    };
    let name = rustls::pki_types::ServerName::try_from("router-1.metampi.invalid").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut s = rustls::Stream::new(&mut conn, &mut sock);
    // This process knows the job secret: it answers the challenge correctly,
    // with a link hello (router 0, link 0 of 1, layout link 0).
    let key = metampi::auth::secret_from_env().unwrap();
    let mut na = [0u8; metampi::auth::NONCE];
    s.read_exact(&mut na)
        .map_err(|e| format!("no challenge: {e}"))?;
    let nc = metampi::auth::nonce().unwrap();
    let mut hello = b"MPLK".to_vec();
    hello.extend_from_slice(&0u32.to_le_bytes());
    hello.extend_from_slice(&0u16.to_le_bytes());
    hello.extend_from_slice(&1u16.to_le_bytes());
    hello.extend_from_slice(&0u32.to_le_bytes());
    let mut msg = nc.to_vec();
    msg.extend_from_slice(&key.connector_tag("metampi router-router", &na, &nc, &hello));
    msg.extend_from_slice(&hello);
    s.write_all(&msg).map_err(|e| format!("refused: {e}"))?;
    let mut proof = [0u8; metampi::auth::TAG];
    s.read_exact(&mut proof)
        .map_err(|e| format!("no proof: {e}"))?;
    Ok(())
}

/// Rank 0 (site a) attacks site b's router on the TLS link a -> b (layout
/// link 0 listens on PORTBASE).
fn attacks(addr: &str) {
    // 1. Plain TCP, answering as a plain router would: TLS rejects the bytes
    //    at once (an alert, then the connection closes), no challenge comes.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0x5a; 64]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let closed = match s.read_to_end(&mut got) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed, "a plain stranger was not refused within 5 s");
    assert!(
        got.len() <= 7 && got.first().is_none_or(|&b| b == 0x15),
        "a plain stranger got more than a TLS alert: {got:?}"
    );
    // 2. Plain TCP waiting for the challenge a plain router expects: none comes.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut b = [0u8; 16];
    assert!(
        !matches!(s.read(&mut b), Ok(n) if n > 0),
        "a plain connection to a TLS port got an answer"
    );
    drop(s);
    // 3. TLS without a client certificate.
    let e = tls_stranger(addr, false).expect_err("a TLS client without certificate got in");
    eprintln!("stranger without certificate: {e}");
    // 4. TLS with a certificate that is not pinned, and the job secret.
    let e = tls_stranger(addr, true).expect_err("an unpinned certificate got in");
    eprintln!("stranger with an unpinned certificate: {e}");
}

#[test]
fn strangers_are_refused_on_tls_links() {
    const PORTBASE: u16 = 25660;
    Ranks::new(4)
        .meta(&config(PORTBASE, "auto", ["", ""]))
        .timeout(Duration::from_secs(180))
        .run("strangers_are_refused_on_tls_links", |world| {
            if world.rank() == 0 {
                attacks(&format!("127.0.0.1:{PORTBASE}"));
            }
            // The job's own links are unharmed.
            traffic(world, 20);
        });
}

#[test]
fn tls_links_recover_from_cuts_and_corruption() {
    let faults = Faults {
        flip: 0.01,
        cut: 0.004,
        drop: 0.004,
        seed: 7,
        ..Default::default()
    };
    let (ranks, counts) = Ranks::new(4)
        .meta(&config(25680, "auto", ["", ""]))
        .env("METAMPI_LINK_TIMEOUT", "60")
        .timeout(Duration::from_secs(240))
        .faulty_links(faults);
    ranks.run("tls_links_recover_from_cuts_and_corruption", |w| {
        traffic(w, 80)
    });
    if metampi_testkit::is_rank() {
        return;
    }
    let counts = counts.lock().unwrap();
    let injected: u64 = counts.iter().map(|c| c.injected()).sum();
    eprintln!("faults injected on TLS links: {injected}: {counts:?}");
    assert!(injected > 5, "the proxies must have disturbed the links");
}
