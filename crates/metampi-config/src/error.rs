//! The one error type of this crate: where in which file, and what was expected.

use std::fmt;

/// A position in a source text: 1-based line and column (columns count characters, a tab is
/// one column). Line 0 means "no position" (for example an I/O error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Pos {
    /// 1-based line number, 0 when the error has no position.
    pub line: u32,
    /// 1-based column number (in characters), 0 when the error has no position.
    pub col: u32,
}

impl Pos {
    /// A position at `line`:`col`.
    #[must_use]
    pub const fn new(line: u32, col: u32) -> Self {
        Self { line, col }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A configuration error: the file, line and column it was found at, and what went wrong.
///
/// Displays as `file:line:col: message`, for example
/// `cluster.cfg:12:9: expected '}' to close METAHOST block 'A' opened at 4:1, found 'PAIR'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The name the text was parsed under (usually the path of the file).
    pub file: String,
    /// 1-based line, or 0 when the error has no position (I/O errors).
    pub line: u32,
    /// 1-based column in characters, or 0 when the error has no position.
    pub col: u32,
    /// What went wrong.
    pub kind: ErrorKind,
}

impl ConfigError {
    pub(crate) fn new(file: &str, pos: Pos, kind: ErrorKind) -> Self {
        Self {
            file: file.to_owned(),
            line: pos.line,
            col: pos.col,
            kind,
        }
    }

    /// The position of the error.
    #[must_use]
    pub fn pos(&self) -> Pos {
        Pos::new(self.line, self.col)
    }

    /// The offending source line of `text` with a caret under the error column, for tools
    /// such as `metampi check` that show the context. `None` when the error has no position
    /// or `text` has no such line.
    #[must_use]
    pub fn snippet(&self, text: &str) -> Option<String> {
        if self.line == 0 {
            return None;
        }
        let line = text.lines().nth(usize::try_from(self.line - 1).ok()?)?;
        let pad: String = line
            .chars()
            .take(usize::try_from(self.col.saturating_sub(1)).ok()?)
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        Some(format!("{line}\n{pad}^"))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.kind)
        } else {
            write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.kind)
        }
    }
}

impl std::error::Error for ConfigError {}

/// What went wrong, without the position. Messages say what was expected and what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A generic syntax error.
    #[error("expected {expected}, found {found}")]
    Expected {
        /// What the grammar allows here.
        expected: String,
        /// A description of the token found instead.
        found: String,
    },
    /// A character that starts no token.
    #[error("unexpected character {0:?}")]
    UnexpectedChar(char),
    /// A quoted string runs to the end of the line.
    #[error("unterminated string: expected a closing {0} on the same line")]
    UnterminatedString(char),
    /// A `{` block was not closed.
    #[error("expected '}}' to close {block} block '{name}' opened at {opened}, found {found}")]
    UnclosedBlock {
        /// `METAHOST` or `PAIR`.
        block: &'static str,
        /// The name of the block (meta host, or `A B` for a PAIR).
        name: String,
        /// Where the block was opened.
        opened: Pos,
        /// What was found instead of `}`.
        found: String,
    },
    /// A keyword that is not allowed (or not known) where it stands.
    #[error("unknown keyword '{keyword}' {context} (expected one of {}){hint}", .expected.join(", "))]
    UnknownKeyword {
        /// The word found.
        keyword: String,
        /// `at top level`, `in METAHOST block`, `in link options`...
        context: &'static str,
        /// The keywords allowed here.
        expected: &'static [&'static str],
        /// `; did you mean 'X'?` or empty.
        hint: String,
    },
    /// A MetaMPICH feature metampi does not implement.
    #[error("'{keyword}' is not supported by metampi: {reason}")]
    Unsupported {
        /// The keyword.
        keyword: String,
        /// Why, and what to do instead.
        reason: &'static str,
    },
    /// The same setting given twice in one block or scope.
    #[error("{key} is already set {context} (first at {first})")]
    DuplicateKey {
        /// The setting.
        key: String,
        /// Where (for example `in METAHOST block 'A'`).
        context: String,
        /// Where it was first set.
        first: Pos,
    },
    /// A meta host declared or defined twice.
    #[error("duplicate meta host '{name}' (first {what} at {first})")]
    DuplicateHost {
        /// The meta host.
        name: String,
        /// `declared` or `defined`.
        what: &'static str,
        /// Where it was first declared or defined.
        first: Pos,
    },
    /// A name that is no meta host of this configuration.
    #[error("{context} names unknown meta host '{name}' (known: {known})")]
    UnknownHost {
        /// The name.
        name: String,
        /// `PAIR`, ...
        context: &'static str,
        /// The meta hosts that exist.
        known: String,
    },
    /// `NUMHOSTS` and the hosts listed or defined disagree.
    #[error("{0}")]
    HostCount(String),
    /// `PAIR A A`.
    #[error("PAIR connects meta host '{0}' with itself; a PAIR needs two different meta hosts")]
    SelfPair(String),
    /// A direct PAIR (0 routers) with a router program or link settings.
    #[error(
        "PAIR {from} {to} 0 is direct (the ranks of the two meta hosts connect to each other, \
         no routers): it takes no router program and no link settings; give the PAIR \
         routers to emulate or configure its links"
    )]
    DirectPairOptions {
        /// Sending meta host.
        from: String,
        /// Receiving meta host.
        to: String,
    },
    /// One direction of a pair of meta hosts is direct, the other has routers.
    #[error(
        "PAIR {from} {to} has routers but PAIR {to} {from} (at {direct}) is direct (0 routers): \
         a direct pair is direct both ways; write `PAIR {from} {to} 0` or give both routers"
    )]
    DirectOneWay {
        /// The meta host whose PAIR has routers.
        from: String,
        /// The other one.
        to: String,
        /// Where the direct PAIR is.
        direct: Pos,
    },
    /// The number of router lines differs from the count in the PAIR header.
    #[error("PAIR {from} {to} declares {declared} router(s) but {found}")]
    RouterCount {
        /// Sending meta host.
        from: String,
        /// Receiving meta host.
        to: String,
        /// Count in the header.
        declared: u64,
        /// What was found instead.
        found: String,
    },
    /// Two sections for the same ordered pair.
    #[error("PAIR {from} {to} is already defined (at {first}{how})")]
    DuplicatePair {
        /// Sending meta host.
        from: String,
        /// Receiving meta host.
        to: String,
        /// The earlier definition.
        first: Pos,
        /// Empty, or `, implied by a '<->' link`.
        how: &'static str,
    },
    /// No PAIR section for an ordered pair of meta hosts.
    #[error(
        "no PAIR section for {from} -> {to}: every ordered pair of meta hosts needs one \
         (write 'PAIR {from} {to} 1 -' and a link line, use '<->' links in 'PAIR {to} {from}', \
         or add AUTO_ROUTER)"
    )]
    MissingPair {
        /// Sending meta host.
        from: String,
        /// Receiving meta host.
        to: String,
    },
    /// A malformed node range such as `p4-10 - p4-03`.
    #[error("bad node range '{range}': {reason}")]
    BadNodeRange {
        /// The range as written.
        range: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A node that is not in the meta host's node list.
    #[error("{what} '{node}' is not a node of meta host '{host}' (its nodes: {nodes})")]
    UnknownNode {
        /// `excluded node`, `FRONTEND`, ...
        what: &'static str,
        /// The node name.
        node: String,
        /// The meta host.
        host: String,
        /// Some of its nodes.
        nodes: String,
    },
    /// A link endpoint that does not belong to the meta host of its side.
    #[error(
        "link endpoint '{endpoint}' is not a node or node address of meta host '{host}' ({detail})"
    )]
    EndpointNotInHost {
        /// The endpoint as written.
        endpoint: String,
        /// The meta host it must belong to.
        host: String,
        /// Its nodes and addresses, or why it is ambiguous.
        detail: String,
    },
    /// A link whose receiving end runs no router of the reverse PAIR.
    #[error("link endpoint {endpoint} is served by no router of PAIR {pair} (its routers run on: {routers})")]
    EndpointNotServed {
        /// The endpoint as written, and the node it resolved to when that differs.
        endpoint: String,
        /// The reverse PAIR, `B A` for a link from A to B.
        pair: String,
        /// Nodes that run routers of the reverse PAIR.
        routers: String,
    },
    /// Two listeners on one address and port.
    #[error("port {port} on {address} is already used by the link at {first}")]
    DuplicatePort {
        /// The address listened on.
        address: String,
        /// The port.
        port: u16,
        /// The other link.
        first: Pos,
    },
    /// A quantity with a missing, unknown or misused unit.
    #[error("bad {what} '{value}': {reason}")]
    BadUnit {
        /// `bandwidth`, `duration`...
        what: &'static str,
        /// The text as written.
        value: String,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// A value that is not one of the allowed ones.
    #[error("bad value '{value}' for {key}: expected {expected}")]
    BadValue {
        /// The setting.
        key: String,
        /// The text as written.
        value: String,
        /// What is allowed.
        expected: String,
    },
    /// A required setting is missing.
    #[error("{context} is missing {field}: {help}")]
    MissingField {
        /// The setting.
        field: &'static str,
        /// Where it is missing.
        context: String,
        /// What to write.
        help: String,
    },
    /// An `ENV` name that a shell would not take as a variable name.
    #[error(
        "'{name}' is not an environment variable name (letters, digits and '_', not starting \
         with a digit)"
    )]
    BadEnvName {
        /// The name as written.
        name: String,
    },
    /// An `ENV` variable that metampi sets itself.
    #[error(
        "ENV of meta host '{host}' sets {name}: variables named METAMPI_* are metampi's own \
         and cannot be set per meta host (give tuning variables such as METAMPI_SPIN_US to the \
         whole job with `metampi run -x`)"
    )]
    ReservedEnv {
        /// The meta host.
        host: String,
        /// The variable.
        name: String,
    },
    /// More processes than the nodes allow, or too many in all.
    #[error("{0}")]
    Capacity(String),
    /// The file could not be read.
    #[error("cannot read file: {message}")]
    Io {
        /// The I/O error kind.
        kind: std::io::ErrorKind,
        /// The I/O error message.
        message: String,
    },
}
