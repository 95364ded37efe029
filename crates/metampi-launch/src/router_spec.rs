//! The one line a launcher gives each router process ([`RouterSpec`]), the
//! TLS settings it carries, and the line a router prints once it is ready.
//!
//! The launcher (`meta`) writes these and the router (`metampi-router`)
//! reads them; keeping both ends here lets the launcher build without the
//! router's event loop, and the router without the launcher.

use std::io::{self, BufRead};
use std::time::Duration;

/// The compression names a link may carry (`COMPRESSION` in the description).
pub const COMPRESSIONS: [&str; 4] = ["off", "lz4", "zstd", "auto"];

/// One outgoing link of a router.
#[derive(Clone, Debug, PartialEq)]
pub struct OutLink {
    /// `host:port` of the peer router's listener.
    pub addr: String,
    /// Emulated bandwidth in bytes per second.
    pub bytes_per_sec: Option<u64>,
    /// Emulated one-way latency.
    pub latency: Option<Duration>,
    /// `off`, `lz4`, `zstd` or `auto`.
    pub compression: String,
    /// Link id from the layout (names its statistics files at both ends).
    pub link_id: u32,
    /// The router at the other end: links to the same peer router form one
    /// striped connection.
    pub peer: usize,
    /// TLS on this link (`None`: plain TCP).
    pub tls: Option<LinkTls>,
    /// Frame checksums cover the payload (`CHECKSUM`); where the links to one
    /// peer router disagree, it is checked.
    pub checksum: bool,
}

/// What a router needs to know: written by the meta launcher as one line.
///
/// No key material travels in it: `TLS = auto` keys are derived from the
/// job secret (which reaches the router as before), and `TLS = on` names the
/// meta hosts' files, which the router reads.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterSpec {
    /// The router's index in the layout (names it in messages, statistics and
    /// `TLS = auto` certificates).
    pub id: usize,
    /// Where local ranks connect (`127.0.0.1:0` picks a free port).
    pub vertical: String,
    /// Where the peer site's routers connect.
    pub listen: Vec<String>,
    /// Per entry of `listen`: the TLS a link arriving there must speak
    /// (`None`, and every entry when the list is empty: plain TCP).
    pub listen_tls: Vec<Option<LinkTls>>,
    /// The links it dials, to the peer sites' routers.
    pub out: Vec<OutLink>,
    /// The TLS identities its links present ([`LinkTls::identity`]).
    pub identities: Vec<Identity>,
    /// Why this router cannot run, found by the launcher (TLS links in a
    /// build without the `tls` feature): the router reports it and exits.
    pub error: Option<String>,
    /// The node it runs on, as its ranks' `METAMPI_NODE` names it (`None`:
    /// this machine's host name). Ranks on the same node talk to it through
    /// shared memory.
    pub node: Option<String>,
}

/// Percent-encodes all but unreserved characters, so that paths and messages
/// fit between the spec's separators (`;` `=` `,` `/` `|`).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad escape in `{text}`"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{text}` is not UTF-8"))
}

fn hex32(b: &[u8; 32]) -> String {
    crate::auth::hex(b)
}

fn unhex32(text: &str) -> Option<[u8; 32]> {
    crate::auth::unhex(text)?.try_into().ok()
}

/// `IDENTITY|auto|ROUTER`, `IDENTITY|NAME|CA|PIN+PIN`, or `-` for a plain link.
fn tls_to_text(t: Option<&LinkTls>) -> String {
    let Some(t) = t else {
        return "-".into();
    };
    match &t.peer {
        PeerCheck::Auto { router } => format!("{}|auto|{router}", t.identity),
        PeerCheck::Certificate { name, ca, pins } => {
            let pins: Vec<String> = pins.iter().map(hex32).collect();
            format!(
                "{}|{}|{}|{}",
                t.identity,
                encode(name),
                ca.as_deref().map(encode).unwrap_or_default(),
                pins.join("+")
            )
        }
    }
}

fn tls_from_text(text: &str) -> Result<Option<LinkTls>, String> {
    if text == "-" {
        return Ok(None);
    }
    let parts: Vec<&str> = text.split('|').collect();
    let identity = parts
        .first()
        .and_then(|i| i.parse().ok())
        .ok_or_else(|| format!("bad TLS identity in `{text}`"))?;
    let peer = match parts[1..] {
        ["auto", router] => PeerCheck::Auto {
            router: router
                .parse()
                .map_err(|_| format!("bad peer router in `{text}`"))?,
        },
        [name, ca, pins] => PeerCheck::Certificate {
            name: decode(name)?,
            ca: if ca.is_empty() {
                None
            } else {
                Some(decode(ca)?)
            },
            pins: pins
                .split('+')
                .filter(|p| !p.is_empty())
                .map(|p| unhex32(p).ok_or_else(|| format!("bad pin in `{text}`")))
                .collect::<Result<_, _>>()?,
        },
        _ => return Err(format!("bad TLS setting `{text}`")),
    };
    Ok(Some(LinkTls { identity, peer }))
}

impl RouterSpec {
    /// `id=3;vertical=127.0.0.1:0;listen=a:1,b:2;out=host:port/BPS/LATUS/COMPRESSION/LINKID/PEER[/TLS],...`,
    /// and with TLS `;listentls=TLS,...;ids=ID,...`, where a
    /// link's TLS is `-` (plain) or `IDENTITY|NAME|CA|PIN+PIN` (text
    /// percent-encoded, pins in hex) or `IDENTITY|auto|ROUTER`, and an
    /// identity is `auto` or `CERT|KEY`. A plain job's line is what it was
    /// before TLS existed. `;nocrc=I,...` lists (by their place in `out`) the
    /// links whose frames leave the payload out of their checksum.
    pub fn to_line(&self) -> String {
        let out: Vec<String> = self
            .out
            .iter()
            .map(|o| {
                let mut e = format!(
                    "{}/{}/{}/{}/{}/{}",
                    o.addr,
                    o.bytes_per_sec.unwrap_or(0),
                    o.latency.map_or(0, |l| l.as_micros()),
                    o.compression,
                    o.link_id,
                    o.peer
                );
                if o.tls.is_some() {
                    e.push('/');
                    e.push_str(&tls_to_text(o.tls.as_ref()));
                }
                e
            })
            .collect();
        let mut line = format!(
            "id={};vertical={};listen={};out={}",
            self.id,
            self.vertical,
            self.listen.join(","),
            out.join(",")
        );
        if self.listen_tls.iter().any(Option::is_some) {
            let l: Vec<String> = self
                .listen_tls
                .iter()
                .map(|t| tls_to_text(t.as_ref()))
                .collect();
            line.push_str(&format!(";listentls={}", l.join(",")));
        }
        if !self.identities.is_empty() {
            let ids: Vec<String> = self
                .identities
                .iter()
                .map(|i| match i {
                    Identity::Auto => "auto".to_string(),
                    Identity::Files { cert, key } => format!("{}|{}", encode(cert), encode(key)),
                })
                .collect();
            line.push_str(&format!(";ids={}", ids.join(",")));
        }
        if let Some(e) = &self.error {
            line.push_str(&format!(";error={}", encode(e)));
        }
        if let Some(n) = &self.node {
            line.push_str(&format!(";node={}", encode(n)));
        }
        let unchecked: Vec<String> = (0..self.out.len())
            .filter(|&i| !self.out[i].checksum)
            .map(|i| i.to_string())
            .collect();
        if !unchecked.is_empty() {
            line.push_str(&format!(";nocrc={}", unchecked.join(",")));
        }
        line
    }

    /// Parses [`RouterSpec::to_line`].
    pub fn parse(line: &str) -> Result<RouterSpec, String> {
        let mut spec = RouterSpec {
            id: 0,
            vertical: "127.0.0.1:0".into(),
            listen: Vec::new(),
            listen_tls: Vec::new(),
            out: Vec::new(),
            identities: Vec::new(),
            error: None,
            node: None,
        };
        let mut nocrc = Vec::new();
        let list = |v: &str| -> Vec<String> {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        for field in line.trim().split(';') {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| format!("router spec field `{field}` has no `=`"))?;
            match k {
                "id" => spec.id = v.parse().map_err(|_| format!("bad router id `{v}`"))?,
                "vertical" => spec.vertical = v.to_string(),
                "node" => spec.node = Some(decode(v)?),
                "listen" => spec.listen = list(v),
                "listentls" => {
                    spec.listen_tls = list(v)
                        .iter()
                        .map(|t| tls_from_text(t))
                        .collect::<Result<_, _>>()?;
                }
                "ids" => {
                    for i in list(v) {
                        let parts: Vec<&str> = i.split('|').collect();
                        spec.identities.push(match parts[..] {
                            ["auto"] => Identity::Auto,
                            [cert, key] => Identity::Files {
                                cert: decode(cert)?,
                                key: decode(key)?,
                            },
                            _ => return Err(format!("bad TLS identity `{i}`")),
                        });
                    }
                }
                "error" => spec.error = Some(decode(v)?),
                "nocrc" => {
                    for i in list(v) {
                        nocrc.push(
                            i.parse::<usize>()
                                .map_err(|_| format!("bad link index `{i}` in nocrc"))?,
                        );
                    }
                }
                "out" => {
                    for o in list(v) {
                        let parts: Vec<&str> = o.split('/').collect();
                        let (addr, bps, lat, comp, id, peer, tls) = match parts[..] {
                            [a, b, l, c, i, p] => (a, b, l, c, i, p, None),
                            [a, b, l, c, i, p, t] => (a, b, l, c, i, p, tls_from_text(t)?),
                            _ => {
                                return Err(format!(
                                    "bad link `{o}` (expected addr/bytes_per_sec/latency_us/compression/id/peer[/tls])"
                                ))
                            }
                        };
                        let peer: usize = peer
                            .parse()
                            .map_err(|_| format!("bad peer router in `{o}`"))?;
                        if !COMPRESSIONS.contains(&comp) {
                            return Err(format!("bad compression `{comp}` in `{o}`"));
                        }
                        let link_id: u32 =
                            id.parse().map_err(|_| format!("bad link id in `{o}`"))?;
                        let bps: u64 =
                            bps.parse().map_err(|_| format!("bad bandwidth in `{o}`"))?;
                        let lat: u64 = lat.parse().map_err(|_| format!("bad latency in `{o}`"))?;
                        spec.out.push(OutLink {
                            addr: addr.to_string(),
                            bytes_per_sec: (bps > 0).then_some(bps),
                            latency: (lat > 0).then(|| Duration::from_micros(lat)),
                            compression: comp.to_string(),
                            link_id,
                            peer,
                            tls,
                            checksum: true,
                        });
                    }
                }
                other => return Err(format!("unknown router spec field `{other}`")),
            }
        }
        if spec.out.is_empty() {
            return Err("a router needs at least one outgoing link".into());
        }
        for i in nocrc {
            spec.out
                .get_mut(i)
                .ok_or_else(|| format!("nocrc names link {i}, which is not in the spec"))?
                .checksum = false;
        }
        if spec.listen_tls.len() > spec.listen.len() {
            return Err("more listener TLS settings than listeners".into());
        }
        let ids = spec.identities.len();
        let named = spec
            .out
            .iter()
            .filter_map(|o| o.tls.as_ref())
            .chain(spec.listen_tls.iter().flatten());
        for t in named {
            if t.identity >= ids {
                return Err(format!("TLS identity {} is not in the spec", t.identity));
            }
        }
        Ok(spec)
    }
}

/// A router's TLS identity: what it presents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// `TLS = auto`: the key and certificate derived from the job secret and
    /// the router's id (`metampi_router::tls::auto_identity`).
    Auto,
    /// `TLS = on`: PEM files of the meta host's certificate chain (leaf
    /// first) and private key (PKCS#8, PKCS#1 or SEC1), read by the router.
    Files {
        /// Path of the certificate chain; `~/` is the home directory.
        cert: String,
        /// Path of the private key.
        key: String,
    },
}

/// How one end of a link checks the certificate of the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerCheck {
    /// `TLS = auto`: exactly the certificate router `router` derives.
    Auto {
        /// The router at the other end.
        router: usize,
    },
    /// `TLS = on`: the peer meta host's `TLSPIN`s and/or `TLSCA` with its
    /// name; every check given must pass.
    Certificate {
        /// The DNS name the peer's certificate must carry when it is checked
        /// against `ca`; the dialling side also sends it as server name.
        name: String,
        /// PEM bundle of the certificate authorities that vouch for the peer.
        ca: Option<String>,
        /// SHA-256 fingerprints of the certificates the peer may present.
        pins: Vec<[u8; 32]>,
    },
}

/// TLS on one link, as one of its ends sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkTls {
    /// Which of the router's identities it presents (index into
    /// `RouterSpec::identities`).
    pub identity: usize,
    /// How it checks the other end.
    pub peer: PeerCheck,
}

/// The DNS name in `TLS = auto` certificates (not checked: those links pin
/// the certificate itself).
pub fn auto_name(router: usize) -> String {
    format!("router-{router}.metampi.invalid")
}

/// Whether the routers of this build can run TLS links: `metampi-router`'s
/// `tls` feature turns on this crate's, so a launcher never hands out a spec
/// that its router would refuse.
pub const TLS_AVAILABLE: bool = cfg!(feature = "tls");

/// Reads the ready line of a router started as a child process.
pub fn read_ready(out: &mut impl BufRead) -> io::Result<u16> {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "router exited before it was ready",
            ));
        }
        if let Some(p) = line.trim().strip_prefix("METAMPI-ROUTER-READY ") {
            return p
                .parse()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad router ready line"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trip_and_errors() {
        let s = RouterSpec {
            id: 2,
            vertical: "127.0.0.1:0".into(),
            listen: vec!["127.0.0.1:29000".into()],
            listen_tls: Vec::new(),
            out: vec![OutLink {
                addr: "127.0.0.1:29001".into(),
                bytes_per_sec: Some(12_500_000),
                latency: Some(Duration::from_millis(20)),
                compression: "lz4".into(),
                link_id: 4,
                peer: 1,
                tls: None,
                checksum: true,
            }],
            identities: Vec::new(),
            error: None,
            node: None,
        };
        // A plain spec reads as it did before TLS existed.
        assert_eq!(
            s.to_line(),
            "id=2;vertical=127.0.0.1:0;listen=127.0.0.1:29000;out=127.0.0.1:29001/12500000/20000/lz4/4/1"
        );
        assert_eq!(RouterSpec::parse(&s.to_line()).unwrap(), s);
        assert!(RouterSpec::parse("id=x;out=a/0/0").is_err());
        assert!(RouterSpec::parse("id=1").is_err());
        assert!(RouterSpec::parse("id=1;out=a/0").is_err());
        assert!(RouterSpec::parse("id=1;out=a/0/0/gzip/1/0").is_err());
        assert!(RouterSpec::parse("id=1;out=a/0/0/lz4/1").is_err());
        let named = RouterSpec {
            node: Some("site a.n;0".into()),
            ..s.clone()
        };
        assert_eq!(RouterSpec::parse(&named.to_line()).unwrap(), named);
        // Links without payload checksums are listed by their place in `out`.
        let mut unchecked = s;
        unchecked.out.push(OutLink {
            link_id: 5,
            checksum: false,
            ..unchecked.out[0].clone()
        });
        let line = unchecked.to_line();
        assert!(line.ends_with(";nocrc=1"), "{line}");
        assert_eq!(RouterSpec::parse(&line).unwrap(), unchecked);
        assert!(RouterSpec::parse(&line.replace("nocrc=1", "nocrc=2")).is_err());
        assert!(RouterSpec::parse(&line.replace("nocrc=1", "nocrc=x")).is_err());
    }

    #[test]
    fn spec_with_tls_round_trip() {
        let check = LinkTls {
            identity: 1,
            peer: PeerCheck::Certificate {
                name: "site-b.example.org".into(),
                ca: Some("/etc/metampi/ca bundle;1,2/3|x=%.pem".into()),
                pins: vec![[0xab; 32], [7; 32]],
            },
        };
        let s = RouterSpec {
            id: 0,
            vertical: "127.0.0.1:0".into(),
            listen: vec!["127.0.0.1:29000".into(), "127.0.0.1:29002".into()],
            listen_tls: vec![None, Some(check.clone())],
            out: vec![
                OutLink {
                    addr: "127.0.0.1:29001".into(),
                    bytes_per_sec: None,
                    latency: None,
                    compression: "auto".into(),
                    link_id: 0,
                    peer: 1,
                    tls: Some(LinkTls {
                        identity: 0,
                        peer: PeerCheck::Auto { router: 1 },
                    }),
                    checksum: false,
                },
                OutLink {
                    addr: "[::1]:29003".into(),
                    bytes_per_sec: None,
                    latency: None,
                    compression: "off".into(),
                    link_id: 1,
                    peer: 1,
                    tls: None,
                    checksum: true,
                },
            ],
            identities: vec![
                Identity::Auto,
                Identity::Files {
                    cert: "~/certs/a.pem".into(),
                    key: "~/certs/a,b|c.key".into(),
                },
            ],
            error: Some("no key: disk full; retry".into()),
            node: None,
        };
        let line = s.to_line();
        assert!(!line.contains('\n'));
        assert_eq!(RouterSpec::parse(&line).unwrap(), s, "{line}");
        // Links name identities the spec has.
        let bad = line.replace("/0/1/0|auto|1,", "/0/1/5|auto|1,");
        assert_ne!(bad, line);
        assert!(RouterSpec::parse(&bad).is_err());
        assert!(RouterSpec::parse("id=1;out=a/0/0/lz4/1/0/0|n||zz;ids=auto").is_err());
        assert!(RouterSpec::parse("id=1;out=a/0/0/lz4/1/0/0|auto|x;ids=auto").is_err());
        assert!(RouterSpec::parse("id=1;out=a/0/0/lz4/1/0/0|auto|2;ids=auto").is_ok());
        assert!(RouterSpec::parse("id=1;out=a/0/0/lz4/1/0/0|n%G1||").is_err());
    }
}
