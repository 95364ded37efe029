//! Syntax of the MetaMPICH description language: tokens to a syntax tree that keeps the
//! position of everything, so the resolver can report semantic errors precisely.
//!
//! The parser is a hand-written recursive descent with no recursion on input structure (the
//! language has no nesting beyond one block level), so hostile input cannot exhaust the stack.

use crate::error::{ErrorKind, Pos};
use crate::lexer::{Tok, Token};

type PResult<T> = Result<T, (Pos, ErrorKind)>;

/// Keywords that start a top-level statement.
pub(crate) const TOP_KEYWORDS: &[&str] = &[
    "NUMHOSTS",
    "OPTIONS",
    "CONNECTIONS",
    "METAHOST",
    "PAIR",
    "NICDEF",
    "AUTO_ROUTER",
    "PORTBASE",
    "ROUTERTIMEOUT",
    "SPLITSIZE",
    "ISEND_NUM",
    "HETERO",
    "EXCHANGE_ORDER",
    "SECRET_FILE",
    "LAUNCH",
    "BYTEORDER",
    "BANDWIDTH",
    "LATENCY",
    "COMPRESSION",
    "CHECKSUM",
    "TLS",
    "TLSCERT",
    "TLSKEY",
    "TLSCA",
    "TLSPIN",
    "BUNDLE_DEADLINE",
];

/// Top-level keywords that can never be a setting inside a block: seeing one there means a
/// `}` is missing.
const SECTION_KEYWORDS: &[&str] = &[
    "NUMHOSTS",
    "OPTIONS",
    "CONNECTIONS",
    "METAHOST",
    "PAIR",
    "NICDEF",
    "AUTO_ROUTER",
];

/// Settings of a METAHOST block.
pub(crate) const METAHOST_KEYS: &[&str] = &[
    "TYPE",
    "NODES",
    "ROUTERS",
    "NPROCS",
    "FRONTEND",
    "USER",
    "EXECPATH",
    "EXECNAME",
    "EXECARGS",
    "ENVFILE",
    "ENV",
    "MPIROOT",
    "ROUTEREXEC",
    "DEVOPTS",
    "CONFPATH",
    "CONFNAME",
    "METAKEY",
    "LAUNCH",
    "BYTEORDER",
    "TLSCERT",
    "TLSKEY",
    "TLSCA",
    "TLSPIN",
    "TLSNAME",
];

/// Settings of a PAIR (header block or inline) and of a link.
pub(crate) const LINK_KEYS: &[&str] = &[
    "PORT",
    "BANDWIDTH",
    "LATENCY",
    "COMPRESSION",
    "CHECKSUM",
    "TLS",
    "BUNDLE_DEADLINE",
];

/// TLS credentials are properties of a meta host (one site, one identity), not of a link:
/// a link has two ends, and one `CERT` could not say whose certificate it is.
const HOST_TLS_KEYS: &[&str] = &["TLSCERT", "TLSKEY", "TLSCA", "TLSPIN", "TLSNAME"];

/// Per-node attributes.
const NODE_KEYS: &[&str] = &["MAXPROCS", "SLOTS"];

#[derive(Debug, Default)]
pub(crate) struct Ast {
    pub numhosts: Option<NumHosts>,
    pub globals: Vec<Setting>,
    pub nicdefs: Vec<NicDef>,
    pub metahosts: Vec<MetaHostAst>,
    pub pairs: Vec<PairAst>,
    pub auto_router: Option<(Pos, Option<String>)>,
    pub eof: Pos,
}

#[derive(Debug)]
pub(crate) struct NumHosts {
    pub pos: Pos,
    pub hosts: Vec<HostDecl>,
}

#[derive(Debug)]
pub(crate) struct HostDecl {
    pub name: String,
    pub pos: Pos,
    pub nprocs: ProcCount,
    pub nprocs_pos: Pos,
    pub args: Option<String>,
    /// PACX-MPI hostfiles only: `Some(None)` no startup command, `Some(Some(c))` command.
    pub pacx_startup: Option<Option<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProcCount {
    N(u64),
    Max,
}

#[derive(Debug, Clone)]
pub(crate) struct Setting {
    pub key: String,
    pub pos: Pos,
    pub value: String,
    pub value_pos: Pos,
}

#[derive(Debug)]
pub(crate) struct NicDef {
    pub name: String,
    pub pos: Pos,
    pub addr: AddrAst,
}

#[derive(Debug, Clone)]
pub(crate) struct AddrAst {
    pub pos: Pos,
    pub kind: AddrKind,
}

#[derive(Debug, Clone)]
pub(crate) enum AddrKind {
    /// A bare word: an IP address, a host name, a NICDEF name or a node name.
    Word(String),
    /// `TCP x`.
    Tcp(String),
    /// `ATM_PVC x`.
    AtmPvc(String),
    /// `ATM_SVC x`.
    AtmSvc(String),
    /// `GETIP(name)`.
    GetIp(String),
}

impl AddrAst {
    pub(crate) fn text(&self) -> String {
        match &self.kind {
            AddrKind::Word(w) => w.clone(),
            AddrKind::Tcp(w) => format!("TCP {w}"),
            AddrKind::AtmPvc(w) => format!("ATM_PVC {w}"),
            AddrKind::AtmSvc(w) => format!("ATM_SVC {w}"),
            AddrKind::GetIp(w) => format!("GETIP({w})"),
        }
    }
}

#[derive(Debug)]
pub(crate) struct MetaHostAst {
    pub name: String,
    pub pos: Pos,
    pub name_pos: Pos,
    pub settings: Vec<Setting>,
    pub nodes: Vec<NodeEntry>,
    pub env: Vec<(String, String, Pos)>,
}

#[derive(Debug)]
pub(crate) struct NodeEntry {
    pub exclude: bool,
    pub pos: Pos,
    pub spec: NodeSpec,
    pub count: Option<(u64, Pos)>,
    pub addrs: Vec<AddrAst>,
    pub attrs: Vec<Setting>,
    pub exec: Option<String>,
    /// `: 'args'` after the node's executable, and where the string starts.
    pub exec_args: Option<(String, Pos)>,
}

#[derive(Debug)]
pub(crate) enum NodeSpec {
    Single(String),
    Range { lo: String, hi: String },
}

#[derive(Debug)]
pub(crate) struct PairAst {
    pub from: String,
    pub from_pos: Pos,
    pub to: String,
    pub to_pos: Pos,
    pub pos: Pos,
    pub exec: Option<String>,
    pub settings: Vec<Setting>,
    pub lines: Vec<RouterLine>,
}

#[derive(Debug)]
pub(crate) struct RouterLine {
    pub pos: Pos,
    pub bidir: bool,
    pub links: Vec<LinkAst>,
}

#[derive(Debug)]
pub(crate) struct LinkAst {
    pub pos: Pos,
    pub src: EndpointAst,
    pub dst: EndpointAst,
    pub settings: Vec<Setting>,
}

#[derive(Debug, Clone)]
pub(crate) struct EndpointAst {
    pub pos: Pos,
    pub node: Option<String>,
    pub addr: Option<AddrAst>,
    pub port_offset: Option<(u64, Pos)>,
}

impl EndpointAst {
    pub(crate) fn text(&self) -> String {
        let mut s = match (&self.node, &self.addr) {
            (Some(n), Some(a)) => format!("{n}({})", a.text()),
            (Some(n), None) => n.clone(),
            (None, Some(a)) => a.text(),
            (None, None) => String::new(),
        };
        if let Some((p, _)) = self.port_offset {
            s.push_str(&format!(":{p}"));
        }
        s
    }
}

/// Parses the token stream of a whole file.
pub(crate) fn parse(src: &str, toks: &[Token]) -> PResult<Ast> {
    let mut p = Parser { src, toks, i: 0 };
    p.file()
}

struct Parser<'a> {
    src: &'a str,
    toks: &'a [Token],
    i: usize,
}

fn expected(expected: impl Into<String>, found: &Token) -> (Pos, ErrorKind) {
    (
        found.pos,
        ErrorKind::Expected {
            expected: expected.into(),
            found: found.describe(),
        },
    )
}

fn is_number(t: &Token) -> bool {
    t.kind == Tok::Word && !t.text.is_empty() && t.text.bytes().all(|b| b.is_ascii_digit())
}

/// `; did you mean 'X'?` when `word` is close to one of `choices`.
pub(crate) fn suggestion(word: &str, choices: &[&str]) -> String {
    closest(&word.to_ascii_uppercase(), choices)
        .map_or_else(String::new, |c| format!("; did you mean '{c}'?"))
}

/// The choice within two edits of `word` (fewest first), for "did you mean" hints: in
/// description files and on the command line.
pub fn closest<'a>(word: &str, choices: &[&'a str]) -> Option<&'a str> {
    if word.len() > 64 {
        return None;
    }
    choices
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, c)| *d <= 2 && *d < c.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

pub(crate) fn unknown_keyword(
    word: &str,
    context: &'static str,
    choices: &'static [&'static str],
) -> ErrorKind {
    let in_link = std::ptr::eq(choices, LINK_KEYS);
    let hint = match word {
        "CERT" | "KEY" | "CA" | "PIN" => format!(
            "; TLS credentials belong to meta hosts: TLS{word} in a METAHOST block, or at top level for every meta host"
        ),
        w if in_link && HOST_TLS_KEYS.contains(&w) => format!(
            "; {w} describes a meta host: put it in the METAHOST block of the meta host it belongs to (or at top level for every meta host); links only choose TLS = off, auto or on"
        ),
        "TLSNAME" if !in_link => {
            "; TLSNAME names one meta host's certificate: put it in that METAHOST block".to_owned()
        }
        _ => suggestion(word, choices),
    };
    ErrorKind::UnknownKeyword {
        keyword: word.to_owned(),
        context,
        expected: choices,
        hint,
    }
}

impl Parser<'_> {
    fn peek(&self) -> &Token {
        // The token list always ends with Eof and `i` never passes it.
        &self.toks[self.i.min(self.toks.len() - 1)]
    }

    fn peek_at(&self, k: usize) -> &Token {
        &self.toks[(self.i + k).min(self.toks.len() - 1)]
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if t.kind != Tok::Eof {
            self.i += 1;
        }
        t
    }

    fn skip_nl(&mut self) {
        while self.peek().kind == Tok::Newline {
            self.i += 1;
        }
    }

    fn at(&self, k: &Tok) -> bool {
        &self.peek().kind == k
    }

    fn expect(&mut self, k: &Tok, what: &str) -> PResult<Token> {
        if self.at(k) {
            Ok(self.bump())
        } else {
            Err(expected(what, self.peek()))
        }
    }

    fn word(&mut self, what: &str) -> PResult<Token> {
        self.expect(&Tok::Word, what)
    }

    fn number(&mut self, what: &str) -> PResult<(u64, Pos)> {
        let t = self.peek().clone();
        if !is_number(&t) {
            return Err(expected(what, &t));
        }
        self.bump();
        let v = t.text.parse::<u64>().map_err(|_| {
            (
                t.pos,
                ErrorKind::BadValue {
                    key: what.into(),
                    value: t.text.clone(),
                    expected: "a smaller number".into(),
                },
            )
        })?;
        Ok((v, t.pos))
    }

    fn is_section_keyword(t: &Token) -> bool {
        t.kind == Tok::Word && SECTION_KEYWORDS.contains(&t.text.as_str())
    }

    fn is_top_keyword(t: &Token) -> bool {
        t.kind == Tok::Word && TOP_KEYWORDS.contains(&t.text.as_str())
    }

    /// Joins the source text of tokens `from..to`; adjacent tokens are concatenated and any
    /// gap (blanks, newlines, comments) becomes one space.
    fn join(&self, from: usize, to: usize) -> String {
        let mut out = String::new();
        let mut prev_end: Option<usize> = None;
        for t in &self.toks[from..to] {
            if t.kind == Tok::Newline {
                continue;
            }
            if let Some(e) = prev_end {
                if t.start != e {
                    out.push(' ');
                }
            }
            if to - from == 1 && t.kind == Tok::Str {
                return t.text.clone();
            }
            out.push_str(self.src.get(t.start..t.end).unwrap_or(""));
            prev_end = Some(t.end);
        }
        out
    }

    fn file(&mut self) -> PResult<Ast> {
        let mut ast = Ast::default();
        // True right after a PAIR section: a stray link line means too many router lines.
        let mut last_pair: Option<usize> = None;
        loop {
            while matches!(self.peek().kind, Tok::Newline | Tok::Semi) {
                self.bump();
            }
            let t = self.peek().clone();
            match t.kind {
                Tok::Eof => break,
                Tok::Word => {}
                _ => {
                    return Err(expected(
                        "a keyword such as NUMHOSTS, METAHOST, PAIR or a global setting",
                        &t,
                    ))
                }
            }
            let pair_before = last_pair.take();
            match t.text.as_str() {
                "NUMHOSTS" => {
                    if let Some(n) = &ast.numhosts {
                        return Err((
                            t.pos,
                            ErrorKind::DuplicateKey { key: "NUMHOSTS".into(), context: "in this file".into(), first: n.pos },
                        ));
                    }
                    ast.numhosts = Some(self.numhosts()?);
                }
                "OPTIONS" | "CONNECTIONS" => {
                    self.bump();
                }
                "METAHOST" => ast.metahosts.push(self.metahost()?),
                "PAIR" => {
                    ast.pairs.push(self.pair()?);
                    last_pair = Some(ast.pairs.len() - 1);
                }
                "NICDEF" => ast.nicdefs.push(self.nicdef()?),
                "AUTO_ROUTER" => {
                    self.bump();
                    let opt = if self.peek().is_word("NO_DNS") || self.peek().is_word("ONLY_DNS") {
                        Some(self.bump().text)
                    } else {
                        None
                    };
                    if let Some((first, _)) = ast.auto_router {
                        return Err((
                            t.pos,
                            ErrorKind::DuplicateKey { key: "AUTO_ROUTER".into(), context: "in this file".into(), first },
                        ));
                    }
                    ast.auto_router = Some((t.pos, opt));
                    self.end_of_statement()?;
                }
                "NET" => {
                    return Err((
                        t.pos,
                        ErrorKind::Unsupported {
                            keyword: "NET".into(),
                            reason: "multi-device network definitions are MetaMPICH-specific; metampi picks shared memory or TCP per destination by itself",
                        },
                    ))
                }
                "SECONDARY_DEVICE" => {
                    return Err((
                        t.pos,
                        ErrorKind::Unsupported {
                            keyword: "SECONDARY_DEVICE".into(),
                            reason: "metampi chooses the transport between meta hosts itself (routers over TCP)",
                        },
                    ))
                }
                w if TOP_KEYWORDS.contains(&w) => ast.globals.push(self.global_setting()?),
                "PORT" => {
                    return Err((
                        t.pos,
                        ErrorKind::Expected {
                            expected: "PORT inside a PAIR or on a link (PORTBASE sets the base for automatic ports)".into(),
                            found: "PORT at top level".into(),
                        },
                    ))
                }
                w => {
                    if let Some(pi) = pair_before {
                        if self.line_has_arrow() {
                            let pa = &ast.pairs[pi];
                            return Err((
                                t.pos,
                                ErrorKind::RouterCount {
                                    from: pa.from.clone(),
                                    to: pa.to.clone(),
                                    declared: pa.lines.len() as u64,
                                    found: "another router line follows".into(),
                                },
                            ));
                        }
                    }
                    if ast.numhosts.is_some()
                        && ast.metahosts.is_empty()
                        && ast.pairs.is_empty()
                        && (is_number(self.peek_at(1)) || self.peek_at(1).is_word("MAX"))
                    {
                        let n = ast.numhosts.as_ref().map_or(0, |n| n.hosts.len());
                        return Err((
                            t.pos,
                            ErrorKind::HostCount(format!(
                                "NUMHOSTS declares {n} meta host(s) but more are listed ('{w}')"
                            )),
                        ));
                    }
                    return Err((t.pos, unknown_keyword(w, "at top level", TOP_KEYWORDS)));
                }
            }
        }
        ast.eof = self.peek().pos;
        Ok(ast)
    }

    /// Whether the rest of the current line holds `->` or `<->`.
    fn line_has_arrow(&self) -> bool {
        self.toks[self.i..]
            .iter()
            .take_while(|t| !matches!(t.kind, Tok::Newline | Tok::Eof))
            .any(|t| matches!(t.kind, Tok::Arrow | Tok::BiArrow))
    }

    fn end_of_statement(&mut self) -> PResult<()> {
        match self.peek().kind {
            Tok::Newline | Tok::Semi => {
                self.bump();
                Ok(())
            }
            Tok::Eof => Ok(()),
            _ => Err(expected("end of line", self.peek())),
        }
    }

    fn numhosts(&mut self) -> PResult<NumHosts> {
        let kw = self.bump();
        let (count, count_pos) = self.number("the number of meta hosts after NUMHOSTS")?;
        if count == 0 {
            return Err((
                count_pos,
                ErrorKind::HostCount("NUMHOSTS 0: expected at least one meta host".into()),
            ));
        }
        self.end_of_statement()?;
        let mut hosts = Vec::new();
        while (hosts.len() as u64) < count {
            self.skip_nl();
            let t = self.peek().clone();
            if t.kind == Tok::Eof || Self::is_top_keyword(&t) {
                return Err((
                    t.pos,
                    ErrorKind::HostCount(format!(
                        "NUMHOSTS declares {count} meta host(s) but only {} {} listed before {}",
                        hosts.len(),
                        if hosts.len() == 1 { "is" } else { "are" },
                        t.describe()
                    )),
                ));
            }
            let name = self.word("a meta host name and its process count (e.g. 'clusterA 16')")?;
            let np = self.peek().clone();
            let nprocs = if np.is_word("MAX") {
                self.bump();
                ProcCount::Max
            } else {
                ProcCount::N(
                    self.number("a process count or MAX after the meta host name")?
                        .0,
                )
            };
            let args = if self.at(&Tok::Str) {
                Some(self.bump().text)
            } else {
                None
            };
            self.end_of_statement()?;
            hosts.push(HostDecl {
                name: name.text,
                pos: name.pos,
                nprocs,
                nprocs_pos: np.pos,
                args,
                pacx_startup: None,
            });
        }
        Ok(NumHosts { pos: kw.pos, hosts })
    }

    fn nicdef(&mut self) -> PResult<NicDef> {
        self.bump();
        let name = self.word("a name for the NICDEF")?;
        let t = self.peek().clone();
        let addr = if t.is_word("GETIP") {
            self.bump();
            self.expect(&Tok::LParen, "'(' after GETIP")?;
            let n = self.word("a host name inside GETIP( )")?;
            self.expect(&Tok::RParen, "')' to close GETIP(")?;
            AddrAst {
                pos: t.pos,
                kind: AddrKind::GetIp(n.text),
            }
        } else {
            self.address(
                "an address after the NICDEF name (TCP a.b.c.d, ATM_PVC x.y.z, GETIP(host))",
            )?
        };
        self.end_of_statement()?;
        Ok(NicDef {
            name: name.text,
            pos: name.pos,
            addr,
        })
    }

    /// `TCP w` | `ATM_PVC w` | `ATM_SVC w` | `w`.
    fn address(&mut self, what: &str) -> PResult<AddrAst> {
        let t = self.peek().clone();
        if t.kind != Tok::Word {
            return Err(expected(what, &t));
        }
        self.bump();
        let kind = match t.text.as_str() {
            "TCP" => AddrKind::Tcp(self.word("an IP address or host name after TCP")?.text),
            "ATM_PVC" => {
                AddrKind::AtmPvc(self.word("a PVC address (e.g. 0.0.42) after ATM_PVC")?.text)
            }
            "ATM_SVC" => AddrKind::AtmSvc(self.word("an NSAP address after ATM_SVC")?.text),
            _ => AddrKind::Word(t.text),
        };
        Ok(AddrAst { pos: t.pos, kind })
    }

    fn global_setting(&mut self) -> PResult<Setting> {
        let key = self.bump();
        if self.at(&Tok::Eq) {
            self.bump();
        }
        let start = self.i;
        while !matches!(self.peek().kind, Tok::Newline | Tok::Semi | Tok::Eof) {
            if matches!(self.peek().kind, Tok::LBrace | Tok::RBrace) {
                return Err(expected(
                    format!("a value for {} and then end of line", key.text),
                    self.peek(),
                ));
            }
            self.bump();
        }
        if start == self.i {
            return Err(expected(format!("a value for {}", key.text), self.peek()));
        }
        let value = self.join(start, self.i);
        let value_pos = self.toks[start].pos;
        self.end_of_statement()?;
        Ok(Setting {
            key: key.text,
            pos: key.pos,
            value,
            value_pos,
        })
    }

    fn metahost(&mut self) -> PResult<MetaHostAst> {
        let kw = self.bump();
        let name = self.word("a meta host name after METAHOST")?;
        self.skip_nl();
        self.expect(
            &Tok::LBrace,
            &format!("'{{' to open METAHOST block '{}'", name.text),
        )?;
        let mut mh = MetaHostAst {
            name: name.text.clone(),
            pos: kw.pos,
            name_pos: name.pos,
            settings: Vec::new(),
            nodes: Vec::new(),
            env: Vec::new(),
        };
        let unclosed = |t: &Token| {
            (
                t.pos,
                ErrorKind::UnclosedBlock {
                    block: "METAHOST",
                    name: name.text.clone(),
                    opened: kw.pos,
                    found: t.describe(),
                },
            )
        };
        loop {
            while matches!(self.peek().kind, Tok::Newline | Tok::Semi) {
                self.bump();
            }
            let t = self.peek().clone();
            match t.kind {
                Tok::RBrace => {
                    self.bump();
                    break;
                }
                Tok::Eof => return Err(unclosed(&t)),
                Tok::Word if Self::is_section_keyword(&t) => return Err(unclosed(&t)),
                Tok::Word => {}
                _ => return Err(expected("a setting such as 'TYPE = ch_smi;' or '}'", &t)),
            }
            if t.text == "EXTRAPROCS" {
                return Err((
                    t.pos,
                    ErrorKind::Unsupported {
                        keyword: "EXTRAPROCS".into(),
                        reason: "extra non-MPI processes are not started by metampi; start them yourself or give the node its own executable with 'node : /path'",
                    },
                ));
            }
            if !METAHOST_KEYS.contains(&t.text.as_str()) {
                return Err((
                    t.pos,
                    unknown_keyword(&t.text, "in METAHOST block", METAHOST_KEYS),
                ));
            }
            self.bump();
            self.skip_nl();
            self.expect(&Tok::Eq, &format!("'=' after {}", t.text))?;
            self.skip_nl();
            match t.text.as_str() {
                "NODES" | "ROUTERS" => self.node_list(&mut mh.nodes)?,
                "ENV" => self.env_list(&mut mh.env)?,
                _ => {
                    let s = self.block_value(&t)?;
                    mh.settings.push(s);
                }
            }
            self.skip_nl();
            match self.peek().kind {
                Tok::Semi => {
                    self.bump();
                }
                Tok::RBrace => {}
                Tok::Eof => return Err(unclosed(self.peek())),
                Tok::Word if Self::is_section_keyword(self.peek()) => {
                    return Err(unclosed(self.peek()))
                }
                _ => {
                    return Err(expected(
                        format!("';' after the value of {}", t.text),
                        self.peek(),
                    ))
                }
            }
        }
        Ok(mh)
    }

    /// The value of `KEY = value` in a block: tokens up to `;` or `}`.
    fn block_value(&mut self, key: &Token) -> PResult<Setting> {
        let start = self.i;
        loop {
            let t = self.peek();
            match t.kind {
                Tok::Semi | Tok::RBrace | Tok::Eof => break,
                Tok::LBrace => {
                    return Err(expected(format!("';' after the value of {}", key.text), t))
                }
                Tok::Word
                    if (METAHOST_KEYS.contains(&t.text.as_str())
                        || LINK_KEYS.contains(&t.text.as_str()))
                        && self.peek_at(1).kind == Tok::Eq
                        && self.i > start =>
                {
                    return Err(expected(format!("';' after the value of {}", key.text), t));
                }
                Tok::Word if Self::is_section_keyword(t) => break,
                _ => {
                    self.bump();
                }
            }
        }
        if start == self.i {
            return Err(expected(format!("a value for {}", key.text), self.peek()));
        }
        Ok(Setting {
            key: key.text.clone(),
            pos: key.pos,
            value: self.join(start, self.i),
            value_pos: self.toks[start].pos,
        })
    }

    fn node_list(&mut self, out: &mut Vec<NodeEntry>) -> PResult<()> {
        loop {
            self.skip_nl();
            out.push(self.node_entry()?);
            self.skip_nl();
            if self.at(&Tok::Comma) {
                self.bump();
            } else {
                return Ok(());
            }
        }
    }

    fn node_entry(&mut self) -> PResult<NodeEntry> {
        let pos = self.peek().pos;
        let exclude = if self.at(&Tok::Bang) {
            self.bump();
            true
        } else {
            false
        };
        let lo = self.word("a node name (or a range such as p4-00 - p4-63)")?;
        self.skip_nl();
        let spec = if self.at(&Tok::Minus) {
            self.bump();
            self.skip_nl();
            let hi = self.word("the upper bound of the node range")?;
            NodeSpec::Range {
                lo: lo.text,
                hi: hi.text,
            }
        } else {
            NodeSpec::Single(lo.text)
        };
        self.skip_nl();
        let count = if is_number(self.peek()) {
            Some(self.number("a process count")?)
        } else {
            None
        };
        self.skip_nl();
        let mut addrs = Vec::new();
        if self.at(&Tok::LParen) {
            self.bump();
            loop {
                self.skip_nl();
                addrs.push(self.address("a network address (e.g. 192.168.0.1 or ATM_PVC 0.0.42)")?);
                self.skip_nl();
                if self.at(&Tok::Colon) {
                    return Err(expected(
                        "',' or ')' (a port belongs on a link endpoint in a PAIR, not on a node address)",
                        self.peek(),
                    ));
                }
                if self.at(&Tok::Comma) {
                    self.bump();
                    continue;
                }
                self.expect(&Tok::RParen, "',' or ')' in the address list")?;
                break;
            }
        }
        self.skip_nl();
        let mut attrs = Vec::new();
        while self.peek().kind == Tok::Word
            && NODE_KEYS.contains(&self.peek().text.as_str())
            && self.peek_at(1).kind == Tok::Eq
        {
            let key = self.bump();
            self.bump();
            let (v, vpos) = self.number(&format!("a number after {} =", key.text))?;
            attrs.push(Setting {
                key: key.text,
                pos: key.pos,
                value: v.to_string(),
                value_pos: vpos,
            });
            self.skip_nl();
        }
        let mut exec = None;
        let mut exec_args = None;
        if self.at(&Tok::Colon) {
            self.bump();
            self.skip_nl();
            let t = self.peek().clone();
            if !matches!(t.kind, Tok::Word | Tok::Str) {
                return Err(expected("the path of the node's executable after ':'", &t));
            }
            self.bump();
            exec = Some(t.text);
            self.skip_nl();
            // MetaMPICH also allows `: 'args'` after the path: the node's program arguments.
            if self.at(&Tok::Colon) && self.peek_at(1).kind == Tok::Str {
                self.bump();
                let args = self.bump();
                exec_args = Some((args.text, args.pos));
            }
        }
        Ok(NodeEntry {
            exclude,
            pos,
            spec,
            count,
            addrs,
            attrs,
            exec,
            exec_args,
        })
    }

    fn env_list(&mut self, out: &mut Vec<(String, String, Pos)>) -> PResult<()> {
        loop {
            self.skip_nl();
            let name = self.word("an environment variable name (ENV = NAME=value, ...)")?;
            self.expect(
                &Tok::Eq,
                &format!("'=' after the variable name {}", name.text),
            )?;
            let value = self
                .adjacent_value(&format!("a value for the variable {}", name.text))?
                .0;
            out.push((name.text, value, name.pos));
            self.skip_nl();
            if self.at(&Tok::Comma) {
                self.bump();
            } else {
                return Ok(());
            }
        }
    }

    /// A value written without blanks: `100Mbit/s`, `sha256:ab:cd`, `"quoted text"`.
    fn adjacent_value(&mut self, what: &str) -> PResult<(String, Pos)> {
        let first = self.peek().clone();
        if !matches!(first.kind, Tok::Word | Tok::Str) {
            return Err(expected(what, &first));
        }
        if first.kind == Tok::Str {
            self.bump();
            return Ok((first.text, first.pos));
        }
        let start = self.i;
        self.bump();
        loop {
            let prev_end = self.toks[self.i - 1].end;
            let t = self.peek();
            if t.start != prev_end || !matches!(t.kind, Tok::Word | Tok::Colon | Tok::Minus) {
                break;
            }
            self.bump();
        }
        Ok((self.join(start, self.i), first.pos))
    }

    /// `KEY=VALUE` settings of a PAIR header or a link, while the next word is followed by '='.
    fn inline_settings(&mut self, out: &mut Vec<Setting>, context: &'static str) -> PResult<()> {
        while self.peek().kind == Tok::Word && self.peek_at(1).kind == Tok::Eq {
            let key = self.bump();
            if !LINK_KEYS.contains(&key.text.as_str()) {
                return Err((key.pos, unknown_keyword(&key.text, context, LINK_KEYS)));
            }
            self.bump();
            let (value, value_pos) = self.adjacent_value(&format!("a value for {}", key.text))?;
            out.push(Setting {
                key: key.text,
                pos: key.pos,
                value,
                value_pos,
            });
        }
        Ok(())
    }

    fn pair(&mut self) -> PResult<PairAst> {
        let kw = self.bump();
        let from = self.word("the sending meta host after PAIR")?;
        let to = self.word("the receiving meta host after the sending one")?;
        let (count, count_pos) = self.number("the number of routers (PAIR A B <n> -)")?;
        let mut exec = None;
        let t = self.peek().clone();
        match t.kind {
            Tok::Minus => {
                self.bump();
            }
            Tok::Word if self.peek_at(1).kind != Tok::Eq => {
                self.bump();
                exec = Some(t.text);
            }
            Tok::Str => {
                self.bump();
                exec = Some(t.text);
            }
            _ => {}
        }
        let mut settings = Vec::new();
        self.inline_settings(&mut settings, "in PAIR options")?;
        if self.at(&Tok::LBrace) {
            let open = self.bump();
            let name = format!("{} {}", from.text, to.text);
            loop {
                while matches!(self.peek().kind, Tok::Newline | Tok::Semi) {
                    self.bump();
                }
                let t = self.peek().clone();
                match t.kind {
                    Tok::RBrace => {
                        self.bump();
                        break;
                    }
                    Tok::Eof => {
                        return Err((
                            t.pos,
                            ErrorKind::UnclosedBlock {
                                block: "PAIR",
                                name,
                                opened: open.pos,
                                found: t.describe(),
                            },
                        ))
                    }
                    Tok::Word if Self::is_section_keyword(&t) => {
                        return Err((
                            t.pos,
                            ErrorKind::UnclosedBlock {
                                block: "PAIR",
                                name,
                                opened: open.pos,
                                found: t.describe(),
                            },
                        ))
                    }
                    Tok::Word if LINK_KEYS.contains(&t.text.as_str()) => {}
                    Tok::Word => {
                        return Err((
                            t.pos,
                            unknown_keyword(&t.text, "in PAIR options", LINK_KEYS),
                        ))
                    }
                    _ => {
                        return Err(expected(
                            "a setting such as 'BANDWIDTH = 100Mbit;' or '}'",
                            &t,
                        ))
                    }
                }
                self.bump();
                self.skip_nl();
                self.expect(&Tok::Eq, &format!("'=' after {}", t.text))?;
                self.skip_nl();
                settings.push(self.block_value(&t)?);
                self.skip_nl();
                match self.peek().kind {
                    Tok::Semi => {
                        self.bump();
                    }
                    Tok::RBrace => {}
                    Tok::Eof => {
                        return Err((
                            self.peek().pos,
                            ErrorKind::UnclosedBlock {
                                block: "PAIR",
                                name,
                                opened: open.pos,
                                found: self.peek().describe(),
                            },
                        ))
                    }
                    Tok::Word if Self::is_section_keyword(self.peek()) => {
                        return Err((
                            self.peek().pos,
                            ErrorKind::UnclosedBlock {
                                block: "PAIR",
                                name,
                                opened: open.pos,
                                found: self.peek().describe(),
                            },
                        ))
                    }
                    _ => {
                        return Err(expected(
                            format!("';' after the value of {}", t.text),
                            self.peek(),
                        ))
                    }
                }
            }
        }
        match self.peek().kind {
            Tok::Newline | Tok::Eof => {}
            _ => {
                return Err(expected(
                    "end of line after the PAIR header (then one line per router)",
                    self.peek(),
                ))
            }
        }
        // 0 routers: the meta hosts' ranks connect to each other directly.
        if count == 0 && (exec.is_some() || !settings.is_empty()) {
            return Err((
                count_pos,
                ErrorKind::DirectPairOptions {
                    from: from.text,
                    to: to.text,
                },
            ));
        }
        let mut lines = Vec::new();
        while (lines.len() as u64) < count {
            self.skip_nl();
            let t = self.peek().clone();
            if t.kind == Tok::Eof || Self::is_top_keyword(&t) {
                let n = lines.len();
                return Err((
                    t.pos,
                    ErrorKind::RouterCount {
                        from: from.text,
                        to: to.text,
                        declared: count,
                        found: format!(
                            "{} router line{} before {}",
                            if n == 0 {
                                "no".to_owned()
                            } else {
                                format!("only {n}")
                            },
                            if n == 1 { " follows" } else { "s follow" },
                            t.describe()
                        ),
                    },
                ));
            }
            lines.push(self.router_line()?);
        }
        Ok(PairAst {
            from: from.text,
            from_pos: from.pos,
            to: to.text,
            to_pos: to.pos,
            pos: kw.pos,
            exec,
            settings,
            lines,
        })
    }

    fn router_line(&mut self) -> PResult<RouterLine> {
        let pos = self.peek().pos;
        let mut links = Vec::new();
        let mut bidir: Option<bool> = None;
        loop {
            let src = self.endpoint()?;
            let arrow = self.peek().clone();
            let this_bidir = match arrow.kind {
                Tok::Arrow => false,
                Tok::BiArrow => true,
                _ => {
                    return Err(expected(
                        "'->' or '<->' between the two ends of a link",
                        &arrow,
                    ))
                }
            };
            self.bump();
            if bidir.is_some_and(|b| b != this_bidir) {
                return Err(expected(
                    "the same arrow as the other links of this router line (a router line is either all '->' or all '<->')",
                    &arrow,
                ));
            }
            bidir = Some(this_bidir);
            let dst = self.endpoint()?;
            let mut settings = Vec::new();
            self.inline_settings(&mut settings, "in link options")?;
            links.push(LinkAst {
                pos: src.pos,
                src,
                dst,
                settings,
            });
            if self.at(&Tok::Comma) || self.at(&Tok::Semi) {
                self.bump();
            }
            if matches!(self.peek().kind, Tok::Newline | Tok::Eof) {
                break;
            }
        }
        Ok(RouterLine {
            pos,
            bidir: bidir.unwrap_or(false),
            links,
        })
    }

    fn endpoint(&mut self) -> PResult<EndpointAst> {
        let t = self.peek().clone();
        if t.kind != Tok::Word {
            return Err(expected(
                "a link endpoint (an address, a node name, or node(address))",
                &t,
            ));
        }
        let (node, addr) = if self.peek_at(1).kind == Tok::LParen
            && !matches!(t.text.as_str(), "TCP" | "ATM_PVC" | "ATM_SVC")
        {
            self.bump();
            self.bump();
            let a = self.address("an address inside node( )")?;
            self.expect(&Tok::RParen, "')' after the node's address")?;
            (Some(t.text.clone()), Some(a))
        } else {
            (None, Some(self.address("a link endpoint")?))
        };
        let port_offset = if self.at(&Tok::Colon) {
            self.bump();
            Some(self.number("a port offset after ':' (added to PORTBASE)")?)
        } else {
            None
        };
        Ok(EndpointAst {
            pos: t.pos,
            node,
            addr,
            port_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lexer::lex;

    fn parse_ok(src: &str) -> Ast {
        let toks = lex(src).expect("lexes");
        parse(src, &toks).unwrap_or_else(|(p, e)| panic!("{p}: {e}"))
    }

    fn parse_err(src: &str) -> (Pos, String) {
        let toks = lex(src).expect("lexes");
        let (p, e) = parse(src, &toks).expect_err("should fail");
        (p, e.to_string())
    }

    #[test]
    fn fig3_nodes() {
        let ast = parse_ok(
            "METAHOST metahost_A {\n    TYPE=ch_smi;\n    NODES= node_a,\n           node_b (192.168.0.1),\n           node_c,\n           node_d (ATM_PVC 0.0.42);\n}\n",
        );
        let mh = &ast.metahosts[0];
        assert_eq!(mh.nodes.len(), 4);
        assert!(matches!(&mh.nodes[3].addrs[0].kind, AddrKind::AtmPvc(p) if p == "0.0.42"));
        assert_eq!(mh.settings[0].value, "ch_smi");
    }

    #[test]
    fn fig4_lines() {
        let ast = parse_ok(
            "PAIR metahost_A metahost_B 2 -\n192.168.0.1 -> 192.168.0.2\nATM_PVC 0.0.42 -> ATM_PVC 0.0.42\n\nPAIR metahost_B metahost_A 1 -\n192.168.0.2 -> 192.168.0.1 \\\n  ATM_PVC 0.0.42 -> ATM_PVC 0.0.42\n",
        );
        assert_eq!(ast.pairs.len(), 2);
        assert_eq!(ast.pairs[0].lines.len(), 2);
        assert_eq!(ast.pairs[1].lines.len(), 1);
        assert_eq!(ast.pairs[1].lines[0].links.len(), 2);
    }

    #[test]
    fn settings_join_tokens() {
        let ast = parse_ok("METAHOST a { LAUNCH = ssh me@host:22; TLSPIN = sha256:AB:cd; }\nPAIR a b 1 - { LATENCY = 1 ms; }\nx -> y PORT=7000\n");
        assert_eq!(ast.metahosts[0].settings[0].value, "ssh me@host:22");
        assert_eq!(ast.metahosts[0].settings[1].value, "sha256:AB:cd");
        assert_eq!(ast.pairs[0].settings[0].value, "1 ms");
        assert_eq!(ast.pairs[0].lines[0].links[0].settings[0].value, "7000");
    }

    #[test]
    fn missing_semicolon() {
        let (p, m) = parse_err("METAHOST a {\n TYPE = ch_smi\n NODES = x; }");
        assert_eq!(p, Pos::new(3, 2));
        assert_eq!(m, "expected ';' after the value of TYPE, found 'NODES'");
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggestion("NODE", METAHOST_KEYS), "; did you mean 'NODES'?");
        assert_eq!(
            suggestion("metahost", TOP_KEYWORDS),
            "; did you mean 'METAHOST'?"
        );
        assert_eq!(suggestion("XYZZY", TOP_KEYWORDS), "");
    }
}
