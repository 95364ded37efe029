//! # metampi-config
//!
//! The meta-computer description language of MetaMPICH (Pöppe, Schuch, Bemmerl: *A Message
//! Passing Interface Library for Inhomogeneous Coupled Clusters*, Figs. 3–4), with the
//! extensions metampi needs, and the PACX-MPI hostfile format (`host nodes protocol (startup
//! command)`). Both parse into one validated model, [`MetaConfig`], whose [`Layout`] says
//! which world ranks each meta host and node runs (contiguous per meta host, PACX-MPI
//! numbering), where each router runs, and which links connect the routers.
//!
//! Key items: [`parse_str`], [`parse_pacx_str`], [`parse_auto`], [`load`]; [`MetaConfig`],
//! [`Layout`]; [`ConfigError`], which displays as `file:line:col: message`; what a meta
//! host's processes run and their environment: [`MetaHost::rank_command`],
//! [`MetaHost::router_program`], [`MetaHost::environment`]. The grammar and
//! every keyword are documented in `docs/description-language.md`.
//!
//! No input makes these functions panic; errors name the position and what was expected.
//!
//! ```
//! let cfg = metampi_config::parse_str(
//!     "two-sites.cfg",
//!     "METAHOST a { LAUNCH = local; NPROCS = 2; NODES = a0; }\n\
//!      METAHOST b { LAUNCH = local; NPROCS = 3; NODES = b0; }\n\
//!      PAIR a b 1 - { BANDWIDTH = 100Mbit; LATENCY = 20ms; }\n\
//!      a0 <-> b0\n",
//! )?;
//! let layout = cfg.layout();
//! assert_eq!(layout.world_size, 5);
//! assert_eq!(layout.host_of_rank(1), Some(0));
//! assert_eq!(layout.host_of_rank(2), Some(1));
//! assert_eq!(layout.routers.len(), 2); // one per direction; routers have no world rank
//! println!("{layout}");
//!
//! let err = metampi_config::parse_str("bad.cfg", "METAHOST a {\n  NODES = p4-10 - p4-03;\n}\n")
//!     .unwrap_err();
//! assert_eq!(err.to_string(), "bad.cfg:2:11: bad node range 'p4-10 - p4-03': it runs backwards: 10 is greater than 3");
//! # Ok::<(), metampi_config::ConfigError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod layout;
mod lexer;
mod model;
mod pacx;
mod parser;
mod process;
mod resolve;
pub mod units;

use std::path::Path;

pub use error::{ConfigError, ErrorKind, Pos};
pub use layout::{HostLayout, Layout, LinkLayout, Listen, NodeLayout, RouterLayout};
pub use model::{
    format_pin, Address, ByteOrder, Checksum, Compression, Device, Format, Globals, HostTls,
    Launch, Link, LinkOptions, MetaConfig, MetaHost, Node, Pair, PairOrigin, PortOrigin, Router,
    Tls, DEFAULT_PORT_BASE,
};
pub use parser::closest;
pub use process::{
    home_path, is_env_name, is_reserved_env, parse_env_file, split_args, EnvError, EnvLine,
    ProcessSettings, MPIROOT_ROUTER, RESERVED_ENV_PREFIX,
};
pub use units::Bandwidth;

/// Parses and validates a text in the MetaMPICH description language. `name` is used in
/// error messages (usually the file's path).
///
/// # Errors
/// The first syntax or validation error, with its line and column.
pub fn parse_str(name: &str, text: &str) -> Result<MetaConfig, ConfigError> {
    let text = strip_bom(text);
    let toks = lexer::lex(text).map_err(|(p, k)| ConfigError::new(name, p, k))?;
    let ast = parser::parse(text, &toks).map_err(|(p, k)| ConfigError::new(name, p, k))?;
    resolve::resolve(name, &ast, Format::MetaMpich)
}

/// Parses and validates a PACX-MPI hostfile. Each line `host nodes tcp (command)` becomes a
/// single-node meta host with `nodes` processes, started by `command` (run as written) or by
/// hand when there is none; one router per ordered pair of hosts is generated.
///
/// # Errors
/// The first syntax or validation error, with its line and column.
pub fn parse_pacx_str(name: &str, text: &str) -> Result<MetaConfig, ConfigError> {
    let text = strip_bom(text);
    let ast = pacx::parse(text).map_err(|(p, k)| ConfigError::new(name, p, k))?;
    resolve::resolve(name, &ast, Format::Pacx)
}

/// Guesses the format of `text`: a MetaMPICH keyword first means MetaMPICH; a first line of
/// the form `word number word ...` means a PACX-MPI hostfile; anything else is treated as
/// MetaMPICH (whose errors are the more helpful).
#[must_use]
pub fn detect_format(text: &str) -> Format {
    for line in strip_bom(text).lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("/*") {
            continue;
        }
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        let key = first.split(['=', '{', ';']).next().unwrap_or("");
        if parser::TOP_KEYWORDS.contains(&key) {
            return Format::MetaMpich;
        }
        let second = words.next().unwrap_or("");
        let third = words.next().unwrap_or("");
        let numeric = !second.is_empty() && second.bytes().all(|b| b.is_ascii_digit());
        let word = !third.is_empty() && third.chars().all(char::is_alphanumeric);
        return if numeric && word {
            Format::Pacx
        } else {
            Format::MetaMpich
        };
    }
    Format::MetaMpich
}

/// Parses `text` in the format [`detect_format`] finds.
///
/// # Errors
/// The first syntax or validation error, with its line and column.
pub fn parse_auto(name: &str, text: &str) -> Result<MetaConfig, ConfigError> {
    match detect_format(text) {
        Format::MetaMpich => parse_str(name, text),
        Format::Pacx => parse_pacx_str(name, text),
    }
}

/// Reads a configuration file, detects its format ([`detect_format`]) and parses it.
///
/// # Errors
/// A [`ConfigError`] with [`ErrorKind::Io`] (line 0) when the file cannot be read or is not
/// UTF-8, else the first syntax or validation error.
pub fn load(path: impl AsRef<Path>) -> Result<MetaConfig, ConfigError> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            &name,
            Pos::default(),
            ErrorKind::Io {
                kind: e.kind(),
                message: e.to_string(),
            },
        )
    })?;
    parse_auto(&name, &text)
}

/// Editors on some systems start UTF-8 files with a byte order mark; it is not content.
fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_formats() {
        assert_eq!(detect_format("# c\nhost1 100 tcp\n"), Format::Pacx);
        assert_eq!(detect_format("NUMHOSTS 2\na 1\n"), Format::MetaMpich);
        assert_eq!(detect_format("METAHOST a {}"), Format::MetaMpich);
        assert_eq!(detect_format("LAUNCH=local\n"), Format::MetaMpich);
        assert_eq!(detect_format(""), Format::MetaMpich);
        assert_eq!(detect_format("\u{feff}host1 100 tcp\r\n"), Format::Pacx);
    }

    #[test]
    fn windows_files() {
        let cfg = parse_str(
            "w.cfg",
            "\u{feff}METAHOST a {\r\n  NODES = a0, a1;\r\n}\r\n",
        )
        .expect("parses");
        assert_eq!(cfg.world_size(), 2);
        let cfg =
            parse_pacx_str("h", "\u{feff}h1 2 tcp\r\nh2 3 tcp (ssh h2 start)\r\n").expect("parses");
        assert_eq!(cfg.hosts[1].launch, Launch::Verbatim("ssh h2 start".into()));
    }

    #[test]
    fn load_missing_file() {
        let e = load("/nonexistent/metampi.cfg").unwrap_err();
        assert_eq!(e.line, 0);
        assert!(e
            .to_string()
            .starts_with("/nonexistent/metampi.cfg: cannot read file: "));
    }
}
