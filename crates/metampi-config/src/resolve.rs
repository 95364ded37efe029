//! Semantics: the syntax tree to the validated [`MetaConfig`] and its [`Layout`].
//!
//! Order of work: global settings and NICDEFs, then meta hosts (order, nodes, process
//! counts), then PAIRs (endpoints resolved against the nodes of each side, `<->` links
//! mirrored, AUTO_ROUTER filling the gaps), then ports, then the rank layout.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use crate::error::{ConfigError, ErrorKind, Pos};
use crate::layout::{HostLayout, Layout, LinkLayout, Listen, NodeLayout, RouterLayout};
use crate::model::{
    Address, ByteOrder, Checksum, Compression, Device, Format, Globals, HostTls, Launch, Link,
    LinkOptions, MetaConfig, MetaHost, Node, Pair, PairOrigin, PortOrigin, Router, Tls,
};
use crate::parser::{
    AddrAst, AddrKind, Ast, EndpointAst, HostDecl, MetaHostAst, NodeEntry, NodeSpec, PairAst,
    ProcCount, Setting,
};
use crate::units::{parse_bandwidth, parse_duration, parse_port, parse_port_list, Bandwidth};

type RResult<T> = Result<T, (Pos, ErrorKind)>;

/// At most this many nodes in one `a - b` range.
pub(crate) const MAX_RANGE_NODES: u64 = 65_536;
/// At most this many nodes in one meta host (keeps hostile input from exhausting memory).
const MAX_HOST_NODES: usize = 1 << 20;
/// MPI ranks are `int`s.
const MAX_WORLD: u64 = i32::MAX as u64;

pub(crate) fn resolve(file: &str, ast: &Ast, format: Format) -> Result<MetaConfig, ConfigError> {
    resolve_inner(ast, format, file).map_err(|(pos, kind)| ConfigError::new(file, pos, kind))
}

fn resolve_inner(ast: &Ast, format: Format, file: &str) -> RResult<MetaConfig> {
    let g = resolve_globals(ast)?;
    let nicdefs = resolve_nicdefs(ast)?;
    let mut hosts = resolve_hosts(ast, &g, &nicdefs, format)?;
    let specs = resolve_pairs(ast, &g, &nicdefs, &mut hosts)?;
    let mut config = build(format, g, hosts, specs)?;
    file.clone_into(&mut config.source);
    Ok(config)
}

// ---------------------------------------------------------------------------------------
// Settings and values

struct GlobalState {
    globals: Globals,
    launch: Option<Launch>,
    byte_order: Option<ByteOrder>,
    /// `TLSCERT`, `TLSKEY`, `TLSCA`, `TLSPIN` at top level: defaults for every meta host.
    tls: HostTls,
    opts: OptLayer,
    auto_pos: Option<Pos>,
}

fn dup_check(seen: &mut HashMap<String, Pos>, s: &Setting, context: &str) -> RResult<()> {
    if let Some(first) = seen.get(&s.key) {
        return Err((
            s.pos,
            ErrorKind::DuplicateKey {
                key: s.key.clone(),
                context: context.to_owned(),
                first: *first,
            },
        ));
    }
    seen.insert(s.key.clone(), s.pos);
    Ok(())
}

fn bad_value(s: &Setting, expected: impl Into<String>) -> (Pos, ErrorKind) {
    (
        s.value_pos,
        ErrorKind::BadValue {
            key: s.key.clone(),
            value: s.value.clone(),
            expected: expected.into(),
        },
    )
}

fn bad_unit(s: &Setting, what: &'static str, reason: String) -> (Pos, ErrorKind) {
    (
        s.value_pos,
        ErrorKind::BadUnit {
            what,
            value: s.value.clone(),
            reason,
        },
    )
}

fn parse_u64(s: &Setting) -> RResult<u64> {
    s.value
        .parse::<u64>()
        .map_err(|_| bad_value(s, "a whole number"))
}

fn parse_launch(s: &Setting) -> RResult<Launch> {
    let v = s.value.trim();
    if v.contains('{') || v.contains('}') {
        check_template(v).map_err(|why| bad_value(s, why))?;
        return Ok(Launch::Command(v.to_owned()));
    }
    let mut words = v.split_whitespace();
    let first = words.next().unwrap_or("").to_ascii_lowercase();
    let rest: Vec<&str> = words.collect();
    let expected = "local, manual, netns NAME, ssh HOST, slurm [via LOGIN] [OPTIONS], or a \
                    quoted command template containing {cmd}";
    if first == "slurm" {
        return parse_slurm(s, v.trim_start()["slurm".len()..].trim_start());
    }
    match (first.as_str(), rest.as_slice()) {
        ("local", []) => Ok(Launch::Local),
        ("manual", []) => Ok(Launch::Manual),
        ("netns", [name]) => Ok(Launch::Netns((*name).to_owned())),
        ("ssh", [host]) => Ok(Launch::Ssh((*host).to_owned())),
        ("netns", _) => Err(bad_value(s, "netns followed by one namespace name")),
        ("ssh", _) => Err(bad_value(
            s,
            "ssh followed by one destination (host, user@host or host:port)",
        )),
        _ => Err(bad_value(s, expected)),
    }
}

/// `slurm [via LOGIN] [OPTIONS...]`, after the word `slurm`: options are split like shell
/// words.
fn parse_slurm(s: &Setting, rest: &str) -> RResult<Launch> {
    let mut words = crate::split_args(rest).map_err(|why| bad_value(s, why))?;
    let login = if words.first().map(String::as_str) == Some("via") {
        if words.len() < 2 || words[1].starts_with('-') {
            return Err(bad_value(
                s,
                "slurm via followed by the login node's ssh destination",
            ));
        }
        let login = words.remove(1);
        words.remove(0);
        Some(login)
    } else {
        None
    };
    // Options may take separate values (`-p debug`), but the first word must be an option:
    // `slurm login` (without `via`) is a mistake to name, not an option to pass on.
    if let Some(w) = words.first().filter(|w| !w.starts_with('-')) {
        return Err(bad_value(
            s,
            format!("slurm [via LOGIN] followed by salloc options, not `{w}`"),
        ));
    }
    Ok(Launch::Slurm {
        login,
        options: words,
    })
}

/// A launch template needs `{cmd}` and knows only `{cmd}`, `{node}` and `{host}`.
fn check_template(t: &str) -> Result<(), String> {
    let mut rest = t;
    let mut has_cmd = false;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err("a template with balanced braces ('}' without '{')".into());
        }
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err("a template with balanced braces ('{' without '}')".into());
        };
        match &after[..close] {
            "cmd" => has_cmd = true,
            "node" | "host" => {}
            other => {
                return Err(format!(
                    "a template whose placeholders are {{cmd}}, {{node}} or {{host}} (found {{{other}}})"
                ))
            }
        }
        rest = &after[close + 1..];
    }
    if has_cmd {
        Ok(())
    } else {
        Err("a command template containing {cmd} (where the process command line goes)".into())
    }
}

fn parse_byte_order(s: &Setting) -> RResult<ByteOrder> {
    match s.value.to_ascii_lowercase().as_str() {
        "little" => Ok(ByteOrder::Little),
        "big" => Ok(ByteOrder::Big),
        "native" => Ok(ByteOrder::Native),
        _ => Err(bad_value(s, "little, big or native")),
    }
}

/// `TLSPIN`: one or more certificate fingerprints, separated by commas (several allow a
/// certificate to be replaced without stopping every site at once).
fn parse_pins(s: &Setting) -> RResult<Vec<[u8; 32]>> {
    let expected = "SHA-256 certificate fingerprints: 'sha256:' and 64 hex digits each (colons between bytes allowed), separated by commas";
    s.value
        .split(',')
        .map(|p| parse_pin(p).ok_or_else(|| bad_value(s, expected)))
        .collect()
}

fn parse_pin(text: &str) -> Option<[u8; 32]> {
    let v = text.trim();
    let v = match (v.get(..7), v.get(7..)) {
        (Some(prefix), Some(rest)) if prefix.eq_ignore_ascii_case("sha256:") => rest,
        _ => v,
    };
    let hex: String = v.chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Whether `name` can be the DNS name (subjectAltName) a certificate is checked for:
/// labels of letters, digits, `-` and `_` (as rustls accepts), not starting or ending with
/// `-`, at most 63 characters each and 253 in all, and not an IPv4 address.
pub(crate) fn is_dns_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.parse::<Ipv4Addr>().is_err()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Sets one of the TLS identity settings of a meta host (or of all of them, at top level);
/// `false` when `s` is not one.
fn set_host_tls(t: &mut HostTls, s: &Setting) -> RResult<bool> {
    let v = s.value.trim();
    let path = || -> RResult<String> {
        if v.is_empty() {
            Err(bad_value(s, "a file path"))
        } else {
            Ok(v.to_owned())
        }
    };
    match s.key.as_str() {
        "TLSCERT" => t.cert = Some(path()?),
        "TLSKEY" => t.key = Some(path()?),
        "TLSCA" => t.ca = Some(path()?),
        "TLSPIN" => t.pins = parse_pins(s)?,
        "TLSNAME" => {
            if !is_dns_name(v) {
                return Err(bad_value(
                    s,
                    "a DNS name, the one the meta host's certificate carries (letters, digits, '-' and '_' in dot-separated labels)",
                ));
            }
            t.name = Some(v.to_owned());
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// A link with `TLS = on` (set at `pos`) between meta hosts `a` and `b`: both need a
/// certificate and key to present, and a way for the other to check it.
fn check_tls_on(pos: Pos, from: &MetaHost, to: &MetaHost) -> RResult<()> {
    let context = format!("TLS = on for the links {} -> {}", from.name, to.name);
    for h in [from, to] {
        let missing = |field: &'static str, help: String| {
            (
                pos,
                ErrorKind::MissingField {
                    field,
                    context: context.clone(),
                    help,
                },
            )
        };
        let n = &h.name;
        if h.tls.cert.is_none() {
            return Err(missing(
                "TLSCERT",
                format!("give meta host '{n}' TLSCERT = <PEM certificate chain> in its METAHOST block (or at top level for every meta host); TLS = auto needs no certificates"),
            ));
        }
        if h.tls.key.is_none() {
            return Err(missing(
                "TLSKEY",
                format!("give meta host '{n}' TLSKEY = <PEM private key of its TLSCERT>"),
            ));
        }
        if h.tls.ca.is_none() && h.tls.pins.is_empty() {
            return Err(missing(
                "TLSCA or TLSPIN",
                format!("say how the other side checks meta host '{n}': TLSCA = <PEM bundle of the CA that signed its certificate> or TLSPIN = sha256:<64 hex digits of its certificate>"),
            ));
        }
        if h.tls.ca.is_some() && !is_dns_name(h.tls.name_or(n)) {
            return Err(missing(
                "TLSNAME",
                format!("its certificate is checked against TLSCA for the meta host's name, and '{n}' is not a DNS name: give meta host '{n}' TLSNAME = <the DNS name in its certificate>"),
            ));
        }
    }
    Ok(())
}

/// Link settings given at one level (global, PAIR, link).
#[derive(Debug, Clone, Default)]
struct OptLayer {
    ports: Option<(Vec<u16>, Pos)>,
    bandwidth: Option<Bandwidth>,
    latency: Option<Duration>,
    compression: Option<Compression>,
    checksum: Option<Checksum>,
    tls: Option<(Tls, Pos)>,
    bundle: Option<Duration>,
}

impl OptLayer {
    fn from_settings<'a>(
        settings: impl IntoIterator<Item = &'a Setting>,
        context: &str,
    ) -> RResult<Self> {
        let mut layer = Self::default();
        let mut seen = HashMap::new();
        for s in settings {
            dup_check(&mut seen, s, context)?;
            layer.set(s)?;
        }
        Ok(layer)
    }

    fn set(&mut self, s: &Setting) -> RResult<()> {
        let v = s.value.trim();
        match s.key.as_str() {
            "PORT" => {
                let ports = parse_port_list(v).map_err(|e| {
                    bad_value(
                        s,
                        format!("a port, list or range of ports in 1..=65535 ({e})"),
                    )
                })?;
                self.ports = Some((ports, s.value_pos));
            }
            "BANDWIDTH" => {
                self.bandwidth =
                    Some(parse_bandwidth(v).map_err(|e| bad_unit(s, "bandwidth", e.0))?);
            }
            "LATENCY" => {
                self.latency = Some(parse_duration(v).map_err(|e| bad_unit(s, "duration", e.0))?)
            }
            "BUNDLE_DEADLINE" => {
                self.bundle = Some(parse_duration(v).map_err(|e| bad_unit(s, "duration", e.0))?);
            }
            "COMPRESSION" => {
                self.compression = Some(match v.to_ascii_lowercase().as_str() {
                    "lz4" => Compression::Lz4,
                    "zstd" => Compression::Zstd,
                    "off" => Compression::Off,
                    "auto" => Compression::Auto,
                    _ => return Err(bad_value(s, "lz4, zstd, off or auto")),
                });
            }
            "CHECKSUM" => {
                self.checksum = Some(match v.to_ascii_lowercase().as_str() {
                    "on" => Checksum::On,
                    "off" => Checksum::Off,
                    "auto" => Checksum::Auto,
                    _ => {
                        return Err(bad_value(
                            s,
                            "on, off or auto (on for plain TCP, off under TLS)",
                        ))
                    }
                });
            }
            "TLS" => {
                let mode = match v.to_ascii_lowercase().as_str() {
                    "off" => Tls::Off,
                    "auto" => Tls::Auto,
                    "on" => Tls::On,
                    _ => return Err(bad_value(s, "off, auto (keys derived from the job secret, no setup) or on (the meta hosts' TLSCERT and TLSKEY)")),
                };
                self.tls = Some((mode, s.pos));
            }
            _ => {
                return Err((
                    s.pos,
                    crate::parser::unknown_keyword(
                        &s.key,
                        "in link options",
                        crate::parser::LINK_KEYS,
                    ),
                ))
            }
        }
        Ok(())
    }

    /// `self` where set, else `base` (ports are per level and never inherited).
    fn over(&self, base: &Self) -> Self {
        Self {
            ports: self.ports.clone(),
            bandwidth: self.bandwidth.or(base.bandwidth),
            latency: self.latency.or(base.latency),
            compression: self.compression.or(base.compression),
            checksum: self.checksum.or(base.checksum),
            tls: self.tls.or(base.tls),
            bundle: self.bundle.or(base.bundle),
        }
    }

    /// The effective options of a link from meta host `from` to `to`.
    fn finish(&self, from: &MetaHost, to: &MetaHost) -> RResult<LinkOptions> {
        let tls = match self.tls {
            Some((Tls::On, pos)) => {
                check_tls_on(pos, from, to)?;
                Tls::On
            }
            Some((mode, _)) => mode,
            None => Tls::Off,
        };
        Ok(LinkOptions {
            bandwidth: self.bandwidth,
            latency: self.latency,
            compression: self.compression.unwrap_or_default(),
            checksum: self.checksum.unwrap_or_default(),
            tls,
            bundle_deadline: self.bundle,
        })
    }
}

fn resolve_globals(ast: &Ast) -> RResult<GlobalState> {
    let mut g = GlobalState {
        globals: Globals::default(),
        launch: None,
        byte_order: None,
        tls: HostTls::default(),
        opts: OptLayer::default(),
        auto_pos: None,
    };
    let mut seen = HashMap::new();
    for s in &ast.globals {
        dup_check(&mut seen, s, "at top level")?;
        let v = s.value.trim();
        match s.key.as_str() {
            "PORTBASE" => {
                g.globals.port_base =
                    parse_port(v).map_err(|_| bad_value(s, "a TCP port in 1..=65535"))?;
            }
            "ROUTERTIMEOUT" => {
                // MetaMPICH gives plain seconds; a unit is welcome too.
                g.globals.router_timeout = Some(if v.bytes().all(|b| b.is_ascii_digit()) {
                    Duration::from_secs(parse_u64(s)?)
                } else {
                    parse_duration(v).map_err(|e| bad_unit(s, "duration", e.0))?
                });
            }
            "SPLITSIZE" => g.globals.split_size = Some(parse_u64(s)?),
            "ISEND_NUM" | "HETERO" | "EXCHANGE_ORDER" => {
                g.globals.legacy.insert(s.key.clone(), v.to_owned());
            }
            "SECRET_FILE" => {
                if v.is_empty() {
                    return Err(bad_value(s, "a file path"));
                }
                g.globals.secret_file = Some(v.to_owned());
            }
            "LAUNCH" => g.launch = Some(parse_launch(s)?),
            "BYTEORDER" => g.byte_order = Some(parse_byte_order(s)?),
            _ => {
                if !set_host_tls(&mut g.tls, s)? {
                    g.opts.set(s)?;
                }
            }
        }
    }
    if let Some((pos, opt)) = &ast.auto_router {
        g.globals.auto_router = true;
        g.auto_pos = Some(*pos);
        if let Some(o) = opt {
            g.globals.legacy.insert("AUTO_ROUTER".into(), o.clone());
        }
    }
    Ok(g)
}

fn resolve_nicdefs(ast: &Ast) -> RResult<HashMap<String, Address>> {
    let mut out = HashMap::new();
    let mut seen: HashMap<String, Pos> = HashMap::new();
    for n in &ast.nicdefs {
        if let Some(first) = seen.get(&n.name) {
            return Err((
                n.pos,
                ErrorKind::DuplicateKey {
                    key: format!("NICDEF {}", n.name),
                    context: "in this file".into(),
                    first: *first,
                },
            ));
        }
        seen.insert(n.name.clone(), n.pos);
        out.insert(n.name.clone(), literal_address(&n.addr, &HashMap::new())?);
    }
    Ok(out)
}

/// An address as written; bare words may name a NICDEF.
fn literal_address(a: &AddrAst, nicdefs: &HashMap<String, Address>) -> RResult<Address> {
    let bad = |v: &str, expected: &str| {
        (
            a.pos,
            ErrorKind::BadValue {
                key: "address".into(),
                value: v.to_owned(),
                expected: expected.to_owned(),
            },
        )
    };
    match &a.kind {
        AddrKind::Word(w) => {
            if let Some(addr) = nicdefs.get(w) {
                return Ok(addr.clone());
            }
            word_address(w).map_err(|e| bad(w, &e))
        }
        AddrKind::Tcp(w) => word_address(w).map_err(|e| bad(w, &e)),
        AddrKind::GetIp(w) => Ok(Address::Host(w.clone())),
        AddrKind::AtmPvc(w) => {
            let parts: Vec<&str> = w.split('.').collect();
            if (2..=3).contains(&parts.len())
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
            {
                Ok(Address::AtmPvc(w.clone()))
            } else {
                Err(bad(w, "an ATM PVC as [interface.]VPI.VCI, e.g. 0.0.42"))
            }
        }
        AddrKind::AtmSvc(w) => {
            let hex: String = w.chars().filter(|c| *c != '.').collect();
            if hex.len() == 40 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(Address::AtmSvc(w.clone()))
            } else {
                Err(bad(w, "a 20-byte ATM NSAP address in hex (dots allowed)"))
            }
        }
    }
}

fn word_address(w: &str) -> Result<Address, String> {
    if let Some(inner) = w.strip_prefix('[') {
        let inner = inner.strip_suffix(']').unwrap_or(inner);
        return inner
            .parse::<std::net::Ipv6Addr>()
            .map(|a| Address::Ip(IpAddr::V6(a)))
            .map_err(|_| "an IPv6 address in brackets, e.g. [::1]".into());
    }
    if w.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return w
            .parse::<Ipv4Addr>()
            .map(|a| Address::Ip(IpAddr::V4(a)))
            .map_err(|_| "an IPv4 address such as 192.168.0.1".into());
    }
    let ok = w
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '-' | '.' | '_'))
        && w.chars().next().is_some_and(char::is_alphanumeric);
    if ok {
        Ok(Address::Host(w.to_owned()))
    } else {
        Err("an IP address or host name".into())
    }
}

// ---------------------------------------------------------------------------------------
// Meta hosts

fn list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let all: Vec<&str> = names.into_iter().collect();
    let mut s = all.iter().take(8).copied().collect::<Vec<_>>().join(", ");
    if all.len() > 8 {
        s.push_str(&format!(", ... ({} in all)", all.len()));
    }
    if s.is_empty() {
        s.push_str("none");
    }
    s
}

fn resolve_hosts(
    ast: &Ast,
    g: &GlobalState,
    nicdefs: &HashMap<String, Address>,
    format: Format,
) -> RResult<Vec<MetaHost>> {
    let mut blocks: HashMap<&str, &MetaHostAst> = HashMap::new();
    for mh in &ast.metahosts {
        if let Some(first) = blocks.get(mh.name.as_str()) {
            return Err((
                mh.name_pos,
                ErrorKind::DuplicateHost {
                    name: mh.name.clone(),
                    what: "defined",
                    first: first.name_pos,
                },
            ));
        }
        blocks.insert(&mh.name, mh);
    }
    let mut order: Vec<(&str, Option<&HostDecl>, Option<&MetaHostAst>)> = Vec::new();
    if let Some(nh) = &ast.numhosts {
        let mut seen: HashMap<&str, Pos> = HashMap::new();
        for d in &nh.hosts {
            if let Some(first) = seen.get(d.name.as_str()) {
                return Err((
                    d.pos,
                    ErrorKind::DuplicateHost {
                        name: d.name.clone(),
                        what: "declared",
                        first: *first,
                    },
                ));
            }
            seen.insert(&d.name, d.pos);
            order.push((&d.name, Some(d), blocks.get(d.name.as_str()).copied()));
        }
        for mh in &ast.metahosts {
            if !seen.contains_key(mh.name.as_str()) {
                return Err((
                    mh.name_pos,
                    ErrorKind::HostCount(format!(
                        "meta host '{}' is defined but not declared in the NUMHOSTS header at {} (declared: {})",
                        mh.name,
                        nh.pos,
                        list(nh.hosts.iter().map(|d| d.name.as_str()))
                    )),
                ));
            }
        }
    } else {
        order.extend(
            ast.metahosts
                .iter()
                .map(|mh| (mh.name.as_str(), None, Some(mh))),
        );
    }
    if order.is_empty() {
        if let Some(pa) = ast.pairs.first() {
            return Err((
                pa.from_pos,
                ErrorKind::UnknownHost {
                    name: pa.from.clone(),
                    context: "PAIR",
                    known: "none".into(),
                },
            ));
        }
        return Err((
            ast.eof,
            ErrorKind::HostCount(
                "no meta hosts: expected a METAHOST block or a NUMHOSTS header".into(),
            ),
        ));
    }
    let mut hosts = Vec::with_capacity(order.len());
    let mut world: u64 = 0;
    for (name, decl, block) in order {
        let h = resolve_host(name, decl, block, g, nicdefs, format)?;
        world += h.nprocs as u64;
        if world > MAX_WORLD {
            let pos = block.map_or_else(|| decl.map_or(Pos::default(), |d| d.pos), |b| b.pos);
            return Err((
                pos,
                ErrorKind::Capacity(format!(
                    "more than {MAX_WORLD} processes in all (MPI ranks are C ints)"
                )),
            ));
        }
        hosts.push(h);
    }
    Ok(hosts)
}

/// Checks the `ENV` variables of meta host `host`: names a shell and `env` accept, each
/// given once, none of metampi's own (`METAMPI_*`).
fn resolve_env(
    host: &str,
    env: &[(String, String, Pos)],
    context: &str,
) -> RResult<Vec<(String, String)>> {
    let mut seen: HashMap<&str, Pos> = HashMap::new();
    for (k, _, pos) in env {
        if !crate::process::is_env_name(k) {
            return Err((*pos, ErrorKind::BadEnvName { name: k.clone() }));
        }
        if crate::process::is_reserved_env(k) {
            return Err((
                *pos,
                ErrorKind::ReservedEnv {
                    host: host.to_owned(),
                    name: k.clone(),
                },
            ));
        }
        if let Some(first) = seen.insert(k, *pos) {
            return Err((
                *pos,
                ErrorKind::DuplicateKey {
                    key: format!("ENV variable {k}"),
                    context: context.to_owned(),
                    first,
                },
            ));
        }
    }
    Ok(env.iter().map(|(k, v, _)| (k.clone(), v.clone())).collect())
}

fn resolve_host(
    name: &str,
    decl: Option<&HostDecl>,
    block: Option<&MetaHostAst>,
    g: &GlobalState,
    nicdefs: &HashMap<String, Address>,
    format: Format,
) -> RResult<MetaHost> {
    let pos = block.map_or_else(|| decl.map_or(Pos::default(), |d| d.pos), |b| b.pos);
    let mut h = MetaHost {
        name: name.to_owned(),
        pos,
        nprocs: 0,
        device: Device::Auto,
        launch: Launch::Local,
        byte_order: g.byte_order.unwrap_or_default(),
        tls: g.tls.clone(),
        nodes: Vec::new(),
        loopback: false,
        frontend: None,
        user: None,
        exec_path: None,
        exec_name: None,
        exec_args: decl.and_then(|d| d.args.clone()),
        env_file: None,
        env: Vec::new(),
        mpi_root: None,
        router_exec: None,
        dev_opts: None,
        legacy: Default::default(),
    };
    if let Some((args, pos)) = decl.and_then(|d| d.args.as_ref().map(|a| (a, d.pos))) {
        crate::process::split_args(args).map_err(|why| {
            (
                pos,
                ErrorKind::BadValue {
                    key: "the program arguments on the NUMHOSTS line".into(),
                    value: args.clone(),
                    expected: format!("arguments split like shell words ({why})"),
                },
            )
        })?;
    }
    let context = format!("in METAHOST block '{name}'");
    let mut launch = None;
    let mut nprocs_setting: Option<(ProcCount, &Setting)> = None;
    let mut type_setting = None;
    if let Some(b) = block {
        let mut seen = HashMap::new();
        for s in &b.settings {
            dup_check(&mut seen, s, &context)?;
            let v = s.value.trim().to_owned();
            match s.key.as_str() {
                "TYPE" => {
                    h.device = Device::parse(&v).ok_or_else(|| bad_value(s, Device::CHOICES))?;
                    type_setting = Some(s);
                }
                "NPROCS" => {
                    let n = if v == "MAX" {
                        ProcCount::Max
                    } else {
                        ProcCount::N(parse_u64(s)?)
                    };
                    nprocs_setting = Some((n, s));
                }
                "FRONTEND" => h.frontend = Some(v),
                "USER" => h.user = Some(v),
                "EXECPATH" => h.exec_path = Some(v),
                "EXECNAME" => h.exec_name = Some(v),
                "EXECARGS" => h.exec_args = Some(v),
                "ENVFILE" => h.env_file = Some(v),
                "MPIROOT" => h.mpi_root = Some(v),
                "ROUTEREXEC" => h.router_exec = Some(v),
                "DEVOPTS" => h.dev_opts = Some(v),
                "LAUNCH" => launch = Some(parse_launch(s)?),
                "BYTEORDER" => h.byte_order = parse_byte_order(s)?,
                _ => {
                    if !set_host_tls(&mut h.tls, s)? {
                        h.legacy.insert(s.key.clone(), v);
                    }
                }
            }
        }
        if let Some(s) = b.settings.iter().find(|s| s.key == "EXECARGS") {
            crate::process::split_args(&s.value).map_err(|why| {
                bad_value(
                    s,
                    format!("program arguments, split like shell words ({why})"),
                )
            })?;
        }
        for e in &b.nodes {
            if let Some((args, pos)) = &e.exec_args {
                crate::process::split_args(args).map_err(|why| {
                    (
                        *pos,
                        ErrorKind::BadValue {
                            key: "the node's program arguments".into(),
                            value: args.clone(),
                            expected: format!("arguments split like shell words ({why})"),
                        },
                    )
                })?;
            }
        }
        h.env = resolve_env(name, &b.env, &context)?;
        h.nodes = resolve_nodes(name, &b.nodes, nicdefs)?;
        if h.nodes.is_empty() && !b.nodes.is_empty() {
            let last_exclusion = b
                .nodes
                .iter()
                .rev()
                .find(|e| e.exclude)
                .map_or(b.pos, |e| e.pos);
            return Err((
                last_exclusion,
                ErrorKind::Capacity(format!(
                    "meta host '{name}' has no nodes left after the exclusions"
                )),
            ));
        }
    }
    if h.nodes.is_empty() {
        // MetaMPICH: a meta host without a node list is one SMP machine of the same name.
        h.nodes.push(Node {
            name: name.to_owned(),
            addresses: Vec::new(),
            max_procs: None,
            executable: None,
            exec_args: None,
        });
    }
    if h.device == Device::Shmem && h.nodes.len() > 1 {
        if let Some(s) = type_setting {
            return Err(bad_value(
                s,
                format!(
                    "a single-node meta host for ch_shmem (this one has {} nodes); use ch_p4, ch_usock or ch_smi",
                    h.nodes.len()
                ),
            ));
        }
    }
    h.loopback = format == Format::MetaMpich
        && launch.as_ref().or(g.launch.as_ref()) == Some(&Launch::Local);
    h.launch = match (format, decl.and_then(|d| d.pacx_startup.clone())) {
        (Format::Pacx, Some(Some(cmd))) => Launch::Verbatim(cmd),
        (Format::Pacx, _) => Launch::Manual,
        _ => launch
            .or_else(|| g.launch.clone())
            .unwrap_or_else(|| match &h.frontend {
                Some(f) => Launch::Ssh(f.clone()),
                None => Launch::Local,
            }),
    };

    // Process count: NUMHOSTS header, NPROCS, or the sum of MAXPROCS.
    let header = decl.map(|d| (d.nprocs, d.nprocs_pos));
    if let (Some((hn, hpos)), Some((bn, s))) = (header, nprocs_setting) {
        if hn != bn {
            return Err(bad_value(
                s,
                format!("the same count as the NUMHOSTS header line at {hpos}"),
            ));
        }
    }
    let count = header.map(|(n, _)| n).or(nprocs_setting.map(|(n, _)| n));
    let caps: Vec<Option<u32>> = h.nodes.iter().map(|n| n.max_procs).collect();
    let capped_sum: Option<u64> = caps.iter().map(|c| c.map(u64::from)).sum();
    let nprocs = match count {
        Some(ProcCount::N(n)) => n,
        Some(ProcCount::Max) => capped_sum.ok_or_else(|| {
            (
                pos,
                ErrorKind::MissingField {
                    field: "MAXPROCS",
                    context: format!("meta host '{name}' (process count MAX)"),
                    help: "MAX means the sum of the nodes' MAXPROCS, so every node needs one (e.g. 'node1 2' or 'node1 MAXPROCS=2')".into(),
                },
            )
        })?,
        // Nothing given: MAXPROCS where a node has it, else one process per node.
        None => caps.iter().map(|c| c.map_or(1, u64::from)).sum(),
    };
    if nprocs == 0 {
        let p = nprocs_setting
            .map(|(_, s)| s.value_pos)
            .or(header.map(|(_, p)| p))
            .unwrap_or(pos);
        return Err((
            p,
            ErrorKind::BadValue {
                key: "process count".into(),
                value: "0".into(),
                expected: format!("at least one process on meta host '{name}'"),
            },
        ));
    }
    if nprocs > MAX_WORLD {
        return Err((
            pos,
            ErrorKind::Capacity(format!(
                "meta host '{name}' asks for {nprocs} processes; at most {MAX_WORLD} are possible"
            )),
        ));
    }
    if let Some(cap) = capped_sum {
        if cap < nprocs {
            return Err((
                pos,
                ErrorKind::Capacity(format!(
                    "meta host '{name}' needs {nprocs} processes but the MAXPROCS of its nodes allow only {cap}"
                )),
            ));
        }
    }
    h.nprocs = usize::try_from(nprocs)
        .map_err(|_| (pos, ErrorKind::Capacity("too many processes".into())))?;
    Ok(h)
}

fn resolve_nodes(
    host: &str,
    entries: &[NodeEntry],
    nicdefs: &HashMap<String, Address>,
) -> RResult<Vec<Node>> {
    let mut nodes: Vec<Option<Node>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for e in entries {
        let names = match &e.spec {
            // A '|' number mark means nothing outside a range: `pc-|04|` is `pc-04`.
            NodeSpec::Single(n) => vec![n.replace('|', "")],
            NodeSpec::Range { lo, hi } => expand_range(lo, hi).map_err(|reason| {
                (
                    e.pos,
                    ErrorKind::BadNodeRange {
                        range: format!("{lo} - {hi}"),
                        reason,
                    },
                )
            })?,
        };
        if e.exclude {
            for n in &names {
                match index.remove(n) {
                    Some(i) => nodes[i] = None,
                    None => {
                        return Err((
                            e.pos,
                            ErrorKind::UnknownNode {
                                what: "excluded node",
                                node: n.clone(),
                                host: host.to_owned(),
                                nodes: list(nodes.iter().flatten().map(|n| n.name.as_str())),
                            },
                        ))
                    }
                }
            }
            continue;
        }
        let mut max_procs = e.count;
        for a in &e.attrs {
            if let Some((_, first)) = max_procs {
                return Err((
                    a.pos,
                    ErrorKind::DuplicateKey {
                        key: "MAXPROCS".into(),
                        context: "for this node".into(),
                        first,
                    },
                ));
            }
            max_procs = Some((a.value.parse::<u64>().unwrap_or(u64::MAX), a.value_pos));
        }
        let max_procs = match max_procs {
            Some((c, p)) => Some(u32::try_from(c).map_err(|_| {
                (
                    p,
                    ErrorKind::BadValue {
                        key: "MAXPROCS".into(),
                        value: c.to_string(),
                        expected: "at most 4294967295".into(),
                    },
                )
            })?),
            None => None,
        };
        let mut addrs = Vec::with_capacity(e.addrs.len());
        for a in &e.addrs {
            addrs.push(literal_address(a, nicdefs)?);
        }
        let per_node: Vec<Vec<Address>> = if names.len() > 1 && !addrs.is_empty() {
            // MetaMPICH: an address on a range is the first node's; it counts up per node.
            let start = match addrs.as_slice() {
                [Address::Ip(IpAddr::V4(a))] => u32::from(*a),
                _ => {
                    return Err((
                        e.addrs[0].pos,
                        ErrorKind::BadNodeRange {
                            range: describe_spec(&e.spec),
                            reason: "an address on a node range must be one IPv4 address (the first node's; it counts up per node)".into(),
                        },
                    ))
                }
            };
            let mut v = Vec::with_capacity(names.len());
            for i in 0..names.len() {
                let a = u32::try_from(i)
                    .ok()
                    .and_then(|i| start.checked_add(i))
                    .ok_or_else(|| {
                        (
                            e.addrs[0].pos,
                            ErrorKind::BadNodeRange {
                                range: describe_spec(&e.spec),
                                reason: "the addresses run past 255.255.255.255".into(),
                            },
                        )
                    })?;
                v.push(vec![Address::Ip(IpAddr::V4(Ipv4Addr::from(a)))]);
            }
            v
        } else {
            vec![addrs; names.len()]
        };
        for (n, addrs) in names.into_iter().zip(per_node) {
            if let Some(&i) = index.get(&n) {
                // Listing a node again updates it (MetaMPICH: `p3-|01| - p3-|64|, p3-04 (nic)`).
                if let Some(node) = nodes[i].as_mut() {
                    if !addrs.is_empty() {
                        node.addresses = addrs;
                    }
                    if max_procs.is_some() {
                        node.max_procs = max_procs;
                    }
                    if e.exec.is_some() {
                        node.executable.clone_from(&e.exec);
                        node.exec_args = e.exec_args.as_ref().map(|(a, _)| a.clone());
                    }
                }
            } else {
                if index.len() >= MAX_HOST_NODES {
                    return Err((
                        e.pos,
                        ErrorKind::Capacity(format!(
                            "meta host '{host}' has more than {MAX_HOST_NODES} nodes"
                        )),
                    ));
                }
                index.insert(n.clone(), nodes.len());
                nodes.push(Some(Node {
                    name: n,
                    addresses: addrs,
                    max_procs,
                    executable: e.exec.clone(),
                    exec_args: e.exec_args.as_ref().map(|(a, _)| a.clone()),
                }));
            }
        }
    }
    Ok(nodes.into_iter().flatten().collect())
}

fn describe_spec(s: &NodeSpec) -> String {
    match s {
        NodeSpec::Single(n) => n.clone(),
        NodeSpec::Range { lo, hi } => format!("{lo} - {hi}"),
    }
}

/// Expands `p4-00 - p4-63` or `p3-|01|xy - p3-|04|xy` to node names.
pub(crate) fn expand_range(lo: &str, hi: &str) -> Result<Vec<String>, String> {
    let split = |s: &str| -> Result<(String, String, String), String> {
        if s.contains('|') {
            let parts: Vec<&str> = s.split('|').collect();
            if parts.len() != 3 {
                return Err(format!(
                    "'{s}' needs exactly two '|' around its number, as in p4-|01|"
                ));
            }
            if parts[1].is_empty() || !parts[1].bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("'{s}' has no number between its '|' marks"));
            }
            Ok((
                parts[0].to_owned(),
                parts[1].to_owned(),
                parts[2].to_owned(),
            ))
        } else {
            let digits = s.bytes().rev().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(format!(
                    "'{s}' does not end in a number (a range is <prefix><number> - <prefix><number>, e.g. p4-00 - p4-63)"
                ));
            }
            let (p, d) = s.split_at(s.len() - digits);
            Ok((p.to_owned(), d.to_owned(), String::new()))
        }
    };
    if lo.contains('|') != hi.contains('|') {
        return Err("both bounds must mark their number with '|' or neither may".into());
    }
    let (p1, d1, s1) = split(lo)?;
    let (p2, d2, s2) = split(hi)?;
    if p1 != p2 {
        return Err(format!(
            "the bounds have different prefixes '{p1}' and '{p2}'"
        ));
    }
    if s1 != s2 {
        return Err(format!(
            "the bounds have different suffixes '{s1}' and '{s2}'"
        ));
    }
    let width = if d1.len() == d2.len() {
        d1.len()
    } else if !d1.starts_with('0') || d1 == "0" {
        0
    } else {
        return Err(format!(
            "the bounds' numbers {d1} and {d2} differ in width; pad both the same way"
        ));
    };
    let start: u64 = d1
        .parse()
        .map_err(|_| format!("number {d1} is too large"))?;
    let end: u64 = d2
        .parse()
        .map_err(|_| format!("number {d2} is too large"))?;
    if start > end {
        return Err(format!("it runs backwards: {start} is greater than {end}"));
    }
    if end - start >= MAX_RANGE_NODES {
        return Err(format!(
            "it covers {} nodes; one range may cover at most {MAX_RANGE_NODES}",
            u128::from(end - start) + 1
        ));
    }
    Ok((start..=end)
        .map(|i| format!("{p1}{i:0width$}{s1}"))
        .collect())
}

// ---------------------------------------------------------------------------------------
// PAIRs, routers, links

struct RouterSpec {
    host: usize,
    peer: usize,
    node: usize,
    exec: Option<String>,
    pos: Pos,
    links: Vec<LinkSpec>,
}

struct LinkSpec {
    src_address: Address,
    dst_node: usize,
    dst_address: Address,
    dst_text: String,
    dst_pos: Pos,
    /// A port fixed by the link itself.
    port: Option<(u16, PortOrigin)>,
    options: LinkOptions,
    pos: Pos,
}

struct PairSpec {
    from: usize,
    to: usize,
    pos: Pos,
    origin: PairOrigin,
    routers: Vec<RouterSpec>,
}

fn host_index(hosts: &[MetaHost], name: &str, pos: Pos) -> RResult<usize> {
    hosts.iter().position(|h| h.name == name).ok_or_else(|| {
        (
            pos,
            ErrorKind::UnknownHost {
                name: name.to_owned(),
                context: "PAIR",
                known: list(hosts.iter().map(|h| h.name.as_str())),
            },
        )
    })
}

fn node_summary(h: &MetaHost) -> String {
    let items: Vec<String> = h
        .nodes
        .iter()
        .map(|n| {
            if n.addresses.is_empty() {
                n.name.clone()
            } else {
                let a: Vec<String> = n.addresses.iter().map(ToString::to_string).collect();
                format!("{}({})", n.name, a.join(", "))
            }
        })
        .collect();
    format!("its nodes: {}", list(items.iter().map(String::as_str)))
}

/// Finds the node of meta host `h` an endpoint names, and the address to use there.
fn resolve_endpoint(
    h: &mut MetaHost,
    ep: &EndpointAst,
    nicdefs: &HashMap<String, Address>,
) -> RResult<(usize, Address)> {
    let not_in = |h: &MetaHost, detail: String| {
        (
            ep.pos,
            ErrorKind::EndpointNotInHost {
                endpoint: ep.text(),
                host: h.name.clone(),
                detail,
            },
        )
    };
    let Some(addr_ast) = &ep.addr else {
        return Err(not_in(h, "no address".into()));
    };
    if let Some(node_name) = &ep.node {
        let Some(i) = h.nodes.iter().position(|n| &n.name == node_name) else {
            let d = format!("no node named '{node_name}'; {}", node_summary(h));
            return Err(not_in(h, d));
        };
        let addr = literal_address(addr_ast, nicdefs)?;
        if !h.nodes[i].addresses.contains(&addr) {
            h.nodes[i].addresses.push(addr.clone());
        }
        return Ok((i, addr));
    }
    if let AddrKind::Word(w) = &addr_ast.kind {
        if !nicdefs.contains_key(w) {
            if let Some(i) = h.nodes.iter().position(|n| &n.name == w) {
                let a = primary_address(h, i);
                return Ok((i, a));
            }
            // A word a letter or two from a node's name is a typo of it, not a host name
            // (it would only fail later, when it is looked up at run time).
            let names: Vec<&str> = h.nodes.iter().map(|n| n.name.as_str()).collect();
            let known = (h.nodes.iter()).any(|n| n.addresses.iter().any(|a| a.to_string() == *w));
            if let (false, Some(near)) = (known, crate::parser::closest(w, &names)) {
                let d = format!(
                    "no node named '{w}' (did you mean {near}?); a host name that is no node's \
                     is written node(address)"
                );
                return Err(not_in(h, d));
            }
        }
    }
    let addr = literal_address(addr_ast, nicdefs)?;
    let owners: Vec<usize> = h
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.addresses.contains(&addr))
        .map(|(i, _)| i)
        .collect();
    match owners.as_slice() {
        [i] => Ok((*i, addr)),
        [] if h.nodes.len() == 1 => {
            // MetaMPICH: on a single-node (SMP) meta host every address is that node's.
            h.nodes[0].addresses.push(addr.clone());
            Ok((0, addr))
        }
        [] => {
            let d = node_summary(h);
            Err(not_in(h, d))
        }
        many => {
            let names: Vec<&str> = many.iter().map(|&i| h.nodes[i].name.as_str()).collect();
            Err(not_in(
                h,
                format!(
                    "the address belongs to several nodes ({}); write node(address)",
                    names.join(", ")
                ),
            ))
        }
    }
}

fn resolve_pairs(
    ast: &Ast,
    g: &GlobalState,
    nicdefs: &HashMap<String, Address>,
    hosts: &mut [MetaHost],
) -> RResult<Vec<PairSpec>> {
    // Pass 1: which ordered pairs are written out.
    let mut defined: HashMap<(usize, usize), Pos> = HashMap::new();
    let mut keyed: Vec<(usize, usize, &PairAst)> = Vec::new();
    for pa in &ast.pairs {
        let from = host_index(hosts, &pa.from, pa.from_pos)?;
        let to = host_index(hosts, &pa.to, pa.to_pos)?;
        if from == to {
            return Err((pa.to_pos, ErrorKind::SelfPair(pa.from.clone())));
        }
        if let Some(first) = defined.get(&(from, to)) {
            return Err((
                pa.pos,
                ErrorKind::DuplicatePair {
                    from: pa.from.clone(),
                    to: pa.to.clone(),
                    first: *first,
                    how: "",
                },
            ));
        }
        defined.insert((from, to), pa.pos);
        keyed.push((from, to, pa));
    }
    // Pass 2: `<->` lines may only imply a reverse PAIR nobody wrote.
    let mut implied: HashMap<(usize, usize), Pos> = HashMap::new();
    for (from, to, pa) in &keyed {
        if let Some(line) = pa.lines.iter().find(|l| l.bidir) {
            if let Some(first) = defined.get(&(*to, *from)) {
                return Err((
                    line.pos,
                    ErrorKind::DuplicatePair {
                        from: pa.to.clone(),
                        to: pa.from.clone(),
                        first: *first,
                        how: "",
                    },
                ));
            }
            implied.insert((*to, *from), line.pos);
        }
    }

    let mut specs: Vec<PairSpec> = Vec::new();
    for (from, to, pa) in &keyed {
        let (from, to) = (*from, *to);
        if pa.lines.is_empty() {
            // Direct (0 routers), both ways unless the reverse is written.
            for (a, b, origin) in [
                (from, to, PairOrigin::Explicit),
                (to, from, PairOrigin::Bidirectional),
            ] {
                if origin == PairOrigin::Bidirectional && defined.contains_key(&(a, b)) {
                    continue;
                }
                specs.push(PairSpec {
                    from: a,
                    to: b,
                    pos: pa.pos,
                    origin,
                    routers: Vec::new(),
                });
            }
            continue;
        }
        let context = format!("in PAIR {} {}", pa.from, pa.to);
        let pair_layer = OptLayer::from_settings(&pa.settings, &context)?;
        let base = pair_layer.over(&g.opts);
        let mut fwd = Vec::new();
        let mut rev = Vec::new();
        // Directed links that take their port from the PAIR's PORT list, in order.
        let mut list_users: Vec<(bool, usize, usize)> = Vec::new();
        for line in &pa.lines {
            let mut fr = RouterSpec {
                host: from,
                peer: to,
                node: 0,
                exec: pa.exec.clone().or_else(|| hosts[from].router_exec.clone()),
                pos: line.pos,
                links: Vec::new(),
            };
            let mut rr = RouterSpec {
                host: to,
                peer: from,
                node: 0,
                exec: hosts[to].router_exec.clone(),
                pos: line.pos,
                links: Vec::new(),
            };
            for (k, link) in line.links.iter().enumerate() {
                let (sn, sa) = resolve_endpoint(&mut hosts[from], &link.src, nicdefs)?;
                let (dn, da) = resolve_endpoint(&mut hosts[to], &link.dst, nicdefs)?;
                if k == 0 {
                    fr.node = sn;
                    rr.node = dn;
                }
                same_node(&hosts[from], fr.node, sn, &link.src)?;
                if line.bidir {
                    same_node(&hosts[to], rr.node, dn, &link.dst)?;
                } else if let Some((_, p)) = link.src.port_offset {
                    return Err((
                        p,
                        ErrorKind::Expected {
                            expected: "no port on the sending end of '->' (the receiving end listens; put ':N' on the right-hand endpoint)".into(),
                            found: format!("'{}'", link.src.text()),
                        },
                    ));
                }
                let link_layer = OptLayer::from_settings(&link.settings, "on this link")?;
                let options = link_layer.over(&base).finish(&hosts[from], &hosts[to])?;
                let link_port = match &link_layer.ports {
                    Some((ports, p)) if ports.len() == 1 => Some((ports[0], *p)),
                    Some((ports, p)) => {
                        return Err((
                            *p,
                            ErrorKind::BadValue {
                                key: "PORT".into(),
                                value: format!("{} ports", ports.len()),
                                expected: "one port on a link (port lists belong on the PAIR)"
                                    .into(),
                            },
                        ))
                    }
                    None => None,
                };
                let port_for = |offset: Option<(u64, Pos)>| -> RResult<Option<(u16, PortOrigin)>> {
                    match (link_port, offset) {
                        (Some(_), Some((_, p))) => Err((
                            p,
                            ErrorKind::Expected {
                                expected: "either PORT= or ':N' on a link, not both".into(),
                                found: "both".into(),
                            },
                        )),
                        (Some((port, _)), None) => Ok(Some((port, PortOrigin::Explicit))),
                        (None, Some((n, p))) => {
                            let port = u64::from(g.globals.port_base).saturating_add(n);
                            u16::try_from(port).map(|v| Some((v, PortOrigin::Offset))).map_err(|_| (
                                p,
                                ErrorKind::BadValue {
                                    key: "port offset".into(),
                                    value: n.to_string(),
                                    expected: format!("an offset that keeps PORTBASE ({}) + offset within 65535", g.globals.port_base),
                                },
                            ))
                        }
                        (None, None) => Ok(None),
                    }
                };
                let fport = port_for(link.dst.port_offset)?;
                if fport.is_none() {
                    list_users.push((false, fwd.len(), fr.links.len()));
                }
                fr.links.push(LinkSpec {
                    src_address: sa.clone(),
                    dst_node: dn,
                    dst_address: da.clone(),
                    dst_text: link.dst.text(),
                    dst_pos: link.dst.pos,
                    port: fport,
                    options: options.clone(),
                    pos: link.pos,
                });
                if line.bidir {
                    let rport = port_for(link.src.port_offset)?;
                    if rport.is_none() {
                        list_users.push((true, rev.len(), rr.links.len()));
                    }
                    rr.links.push(LinkSpec {
                        src_address: da,
                        dst_node: sn,
                        dst_address: sa,
                        dst_text: link.src.text(),
                        dst_pos: link.src.pos,
                        port: rport,
                        options,
                        pos: link.pos,
                    });
                }
            }
            fwd.push(fr);
            if line.bidir {
                rev.push(rr);
            }
        }
        if let Some((ports, p)) = &pair_layer.ports {
            if ports.len() != list_users.len() {
                return Err((
                    *p,
                    ErrorKind::BadValue {
                        key: "PORT".into(),
                        value: format!("{} port(s)", ports.len()),
                        expected: format!(
                            "one port per link of PAIR {} {} without its own port ({} link(s), '<->' links count twice)",
                            pa.from,
                            pa.to,
                            list_users.len()
                        ),
                    },
                ));
            }
            for ((is_rev, r, l), port) in list_users.iter().zip(ports) {
                let routers = if *is_rev { &mut rev } else { &mut fwd };
                routers[*r].links[*l].port = Some((*port, PortOrigin::Explicit));
            }
        }
        specs.push(PairSpec {
            from,
            to,
            pos: pa.pos,
            origin: PairOrigin::Explicit,
            routers: fwd,
        });
        if !rev.is_empty() {
            let pos = implied.get(&(to, from)).copied().unwrap_or(pa.pos);
            specs.push(PairSpec {
                from: to,
                to: from,
                pos,
                origin: PairOrigin::Bidirectional,
                routers: rev,
            });
        }
    }

    // A direct pair is direct both ways.
    for s in specs.iter().filter(|s| !s.routers.is_empty()) {
        if let Some(d) = specs
            .iter()
            .find(|d| d.routers.is_empty() && (d.from, d.to) == (s.to, s.from))
        {
            return Err((
                s.pos,
                ErrorKind::DirectOneWay {
                    from: hosts[s.from].name.clone(),
                    to: hosts[s.to].name.clone(),
                    direct: d.pos,
                },
            ));
        }
    }
    // Every ordered pair needs routers (written, implied, or generated by
    // AUTO_ROUTER) or is direct.
    let have: BTreeSet<(usize, usize)> = specs.iter().map(|s| (s.from, s.to)).collect();
    for a in 0..hosts.len() {
        for b in 0..hosts.len() {
            if a == b || have.contains(&(a, b)) {
                continue;
            }
            let Some(auto_pos) = g.auto_pos else {
                return Err((
                    hosts[a].pos,
                    ErrorKind::MissingPair {
                        from: hosts[a].name.clone(),
                        to: hosts[b].name.clone(),
                    },
                ));
            };
            let auto_options = g.opts.finish(&hosts[a], &hosts[b])?;
            let src_node = gateway_node(&hosts[a]);
            // If the reverse direction is written out, aim at its first router's node.
            let dst_node = specs
                .iter()
                .find(|s| s.from == b && s.to == a)
                .and_then(|s| s.routers.first())
                .map_or_else(|| gateway_node(&hosts[b]), |r| r.node);
            let src_address = primary_address(&hosts[a], src_node);
            let dst_address = primary_address(&hosts[b], dst_node);
            specs.push(PairSpec {
                from: a,
                to: b,
                pos: auto_pos,
                origin: PairOrigin::Auto,
                routers: vec![RouterSpec {
                    host: a,
                    peer: b,
                    node: src_node,
                    exec: hosts[a].router_exec.clone(),
                    pos: auto_pos,
                    links: vec![LinkSpec {
                        src_address,
                        dst_node,
                        dst_text: hosts[b].nodes[dst_node].name.clone(),
                        dst_address,
                        dst_pos: auto_pos,
                        port: None,
                        options: auto_options,
                        pos: auto_pos,
                    }],
                }],
            });
        }
    }
    specs.sort_by_key(|s| (s.from, s.to));
    Ok(specs)
}

fn same_node(h: &MetaHost, router_node: usize, node: usize, ep: &EndpointAst) -> RResult<()> {
    if router_node == node {
        return Ok(());
    }
    Err((
        ep.pos,
        ErrorKind::Expected {
            expected: format!(
                "an endpoint on node '{}' (all links of one router line start on the node the router runs on)",
                h.nodes.get(router_node).map_or("?", |n| n.name.as_str())
            ),
            found: format!("'{}' on node '{}'", ep.text(), h.nodes.get(node).map_or("?", |n| n.name.as_str())),
        },
    ))
}

/// The address a node is reached at when no address is named: its first address, else
/// 127.0.0.1 for an explicit `LAUNCH = local`, else its name.
fn primary_address(h: &MetaHost, node: usize) -> Address {
    let Some(n) = h.nodes.get(node) else {
        return Address::Host(h.name.clone());
    };
    if let Some(a) = n.addresses.first() {
        a.clone()
    } else if h.loopback {
        Address::Ip(IpAddr::from([127, 0, 0, 1]))
    } else {
        Address::Host(n.name.clone())
    }
}

/// Where generated routers run: the FRONTEND if it is a node, else the first node.
fn gateway_node(h: &MetaHost) -> usize {
    h.frontend
        .as_ref()
        .and_then(|f| h.nodes.iter().position(|n| &n.name == f))
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Ports and layout

fn build(
    format: Format,
    g: GlobalState,
    hosts: Vec<MetaHost>,
    mut specs: Vec<PairSpec>,
) -> RResult<MetaConfig> {
    // Fixed ports must not collide on one address.
    let mut taken: HashMap<(Address, u16), Pos> = HashMap::new();
    let mut used: BTreeSet<u16> = BTreeSet::new();
    for s in &specs {
        for r in &s.routers {
            for l in &r.links {
                if let Some((port, _)) = l.port {
                    let key = (l.dst_address.clone(), port);
                    if let Some(first) = taken.get(&key) {
                        return Err((
                            l.dst_pos,
                            ErrorKind::DuplicatePort {
                                address: l.dst_address.to_string(),
                                port,
                                first: *first,
                            },
                        ));
                    }
                    taken.insert(key, l.dst_pos);
                    used.insert(port);
                }
            }
        }
    }
    // The rest count up from PORTBASE, skipping every fixed port.
    let mut next = u32::from(g.globals.port_base);
    for s in &mut specs {
        for r in &mut s.routers {
            for l in &mut r.links {
                if l.port.is_some() {
                    continue;
                }
                while u16::try_from(next).is_ok_and(|p| used.contains(&p)) {
                    next += 1;
                }
                let port = u16::try_from(next).map_err(|_| {
                    (
                        l.pos,
                        ErrorKind::Capacity(format!(
                            "no free port left above PORTBASE {} for this link",
                            g.globals.port_base
                        )),
                    )
                })?;
                used.insert(port);
                l.port = Some((port, PortOrigin::Auto));
            }
        }
    }

    // Router and link ids in (host, peer, index) order; specs are sorted by (from, to).
    let mut routers: Vec<RouterLayout> = Vec::new();
    let mut links: Vec<LinkLayout> = Vec::new();
    let mut link_src: Vec<(usize, usize, usize)> = Vec::new(); // (spec, router, link) per link
    for (si, s) in specs.iter().enumerate() {
        for (ri, r) in s.routers.iter().enumerate() {
            let id = routers.len();
            let mut out = Vec::new();
            for (lk, l) in r.links.iter().enumerate() {
                out.push(links.len());
                links.push(LinkLayout {
                    id: links.len(),
                    from_host: r.host,
                    to_host: r.peer,
                    router: id,
                    peer_router: usize::MAX,
                    src_node: r.node,
                    src_address: l.src_address.clone(),
                    dst_node: l.dst_node,
                    dst_address: l.dst_address.clone(),
                    port: l.port.map_or(0, |(p, _)| p),
                    options: l.options.clone(),
                });
                link_src.push((si, ri, lk));
            }
            routers.push(RouterLayout {
                id,
                host: r.host,
                node: r.node,
                peer: r.peer,
                index: ri,
                exec: r.exec.clone(),
                links_out: out,
                listen: Vec::new(),
            });
        }
    }
    // Each link ends at a router of the reverse PAIR on the destination node.
    for li in 0..links.len() {
        let (si, ri, lk) = link_src[li];
        let spec_link = &specs[si].routers[ri].links[lk];
        let (to, from, dst_node) = (links[li].to_host, links[li].from_host, links[li].dst_node);
        let candidates: Vec<usize> = routers
            .iter()
            .filter(|r| r.host == to && r.peer == from && r.node == dst_node)
            .map(|r| r.id)
            .collect();
        let preferred = candidates.iter().copied().find(|&rid| {
            routers[rid]
                .links_out
                .iter()
                .any(|&o| links[o].src_address == links[li].dst_address)
        });
        let Some(peer) = preferred.or_else(|| candidates.first().copied()) else {
            let nodes: Vec<&str> = routers
                .iter()
                .filter(|r| r.host == to && r.peer == from)
                .map(|r| hosts[to].nodes[r.node].name.as_str())
                .collect();
            return Err((
                spec_link.dst_pos,
                ErrorKind::EndpointNotServed {
                    endpoint: {
                        let node = &hosts[to].nodes[dst_node].name;
                        if &spec_link.dst_text == node {
                            format!("'{node}'")
                        } else {
                            format!("'{}' (node '{node}')", spec_link.dst_text)
                        }
                    },
                    pair: format!("{} {}", hosts[to].name, hosts[from].name),
                    routers: list(nodes),
                },
            ));
        };
        links[li].peer_router = peer;
        let listen = Listen {
            address: links[li].dst_address.clone(),
            port: links[li].port,
            link: li,
        };
        routers[peer].listen.push(listen);
    }

    // Ranks: contiguous per meta host, then per node.
    let mut host_layouts = Vec::with_capacity(hosts.len());
    let mut base = 0usize;
    for (hi, h) in hosts.iter().enumerate() {
        let caps: Vec<Option<u32>> = h.nodes.iter().map(|n| n.max_procs).collect();
        let counts = distribute(h.nprocs, &caps);
        let mut node_base = base;
        let nodes = h
            .nodes
            .iter()
            .enumerate()
            .zip(counts)
            .map(|((ni, n), c)| {
                let nl = NodeLayout {
                    name: n.name.clone(),
                    address: primary_address(h, ni),
                    max_procs: n.max_procs,
                    nprocs: c,
                    ranks: node_base..node_base + c,
                    routers: routers
                        .iter()
                        .filter(|r| r.host == hi && r.node == ni)
                        .map(|r| r.id)
                        .collect(),
                };
                node_base += c;
                nl
            })
            .collect();
        host_layouts.push(HostLayout {
            name: h.name.clone(),
            ranks: base..base + h.nprocs,
            device: h.device,
            launch: h.launch.clone(),
            byte_order: h.byte_order,
            tls: h.tls.clone(),
            nodes,
        });
        base += h.nprocs;
    }
    let direct = specs
        .iter()
        .filter(|s| s.routers.is_empty() && s.from < s.to)
        .map(|s| (s.from, s.to))
        .collect();
    let layout = Layout {
        world_size: base,
        hosts: host_layouts,
        routers,
        links,
        direct,
    };

    let pairs = specs
        .into_iter()
        .map(|s| Pair {
            from: s.from,
            to: s.to,
            pos: s.pos,
            origin: s.origin,
            routers: s
                .routers
                .into_iter()
                .map(|r| Router {
                    node: r.node,
                    exec: r.exec,
                    pos: r.pos,
                    links: r
                        .links
                        .into_iter()
                        .map(|l| {
                            let (port, port_origin) = l.port.unwrap_or((0, PortOrigin::Auto));
                            Link {
                                src_address: l.src_address,
                                dst_node: l.dst_node,
                                dst_address: l.dst_address,
                                port,
                                port_origin,
                                options: l.options,
                                pos: l.pos,
                            }
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect();
    Ok(MetaConfig {
        source: String::new(),
        format,
        globals: g.globals,
        hosts,
        pairs,
        layout,
    })
}

/// Spreads `n` processes over nodes round-robin in node order, skipping nodes at their cap
/// (`None` = no cap). The caller has checked that the caps allow `n`.
pub(crate) fn distribute(n: usize, caps: &[Option<u32>]) -> Vec<usize> {
    if caps.is_empty() {
        return Vec::new();
    }
    let cap = |c: &Option<u32>, level: usize| c.map_or(level, |c| (c as usize).min(level));
    let filled = |level: usize| {
        caps.iter()
            .map(|c| cap(c, level))
            .fold(0usize, usize::saturating_add)
    };
    // Smallest level L with filled(L) >= n.
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if filled(mid) >= n {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let level = lo;
    if level == 0 {
        return vec![0; caps.len()];
    }
    let mut counts: Vec<usize> = caps.iter().map(|c| cap(c, level - 1)).collect();
    let mut rest = n.saturating_sub(counts.iter().sum());
    for (count, c) in counts.iter_mut().zip(caps) {
        if rest == 0 {
            break;
        }
        if cap(c, level) > *count {
            *count += 1;
            rest -= 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(
            expand_range("p4-00", "p4-03"),
            Ok(vec![
                "p4-00".into(),
                "p4-01".into(),
                "p4-02".into(),
                "p4-03".into()
            ])
        );
        assert_eq!(
            expand_range("n8", "n10"),
            Ok(vec!["n8".into(), "n9".into(), "n10".into()])
        );
        assert_eq!(
            expand_range("p3-|01|xy", "p3-|02|xy"),
            Ok(vec!["p3-01xy".into(), "p3-02xy".into()])
        );
        assert_eq!(expand_range("p4-63", "p4-63").map(|v| v.len()), Ok(1));
        assert!(expand_range("p4-10", "p4-03")
            .unwrap_err()
            .contains("runs backwards: 10 is greater than 3"));
        assert!(expand_range("p4-00", "p3-10")
            .unwrap_err()
            .contains("different prefixes"));
        assert!(expand_range("node_a", "node_d")
            .unwrap_err()
            .contains("does not end in a number"));
        assert!(expand_range("p-001", "p-63")
            .unwrap_err()
            .contains("differ in width"));
        assert!(expand_range("p-|01", "p-|02").is_err());
        assert!(expand_range("p0", "p99999999")
            .unwrap_err()
            .contains("at most"));
        assert!(expand_range("p0", "p99999999999999999999999")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn distribution() {
        assert_eq!(distribute(8, &[None; 4]), vec![2, 2, 2, 2]);
        assert_eq!(distribute(5, &[None, None]), vec![3, 2]);
        assert_eq!(
            distribute(8, &[None, Some(1), None, Some(1)]),
            vec![3, 1, 3, 1]
        );
        assert_eq!(distribute(3, &[Some(0), None]), vec![0, 3]);
        assert_eq!(distribute(4, &[Some(2), Some(2)]), vec![2, 2]);
        assert_eq!(distribute(1, &[None, None, None]), vec![1, 0, 0]);
        assert_eq!(
            distribute(usize::MAX / 2, &[None, None])
                .iter()
                .sum::<usize>(),
            usize::MAX / 2
        );
    }

    #[test]
    fn templates() {
        assert!(check_template("ssh {node} {cmd}").is_ok());
        assert!(check_template("ssh node").is_err());
        assert!(check_template("x {cmd").is_err());
        assert!(check_template("x cmd}").is_err());
        assert!(check_template("x {foo} {cmd}").is_err());
    }
}
