//! What the processes of a meta host run and the environment they get, resolved against the
//! command `metampi run` was given: the program of its ranks (`EXECPATH`, `EXECNAME`,
//! `EXECARGS`, node executables), the program of its routers (router executables in PAIR
//! headers, `ROUTEREXEC`, `MPIROOT`), and its variables (`ENV`, `ENVFILE`).
//!
//! Paths are used as written: a relative one is relative to the working directory the
//! processes start in (the directory `metampi run` was started in, on every machine), a
//! program name without `/` is looked up in `PATH` on the machine it runs on, and `~` is not
//! expanded (the processes may run on machines whose home directories the launcher does not
//! know). `ENVFILE` is the exception: the launcher reads it, on its own machine, so `~/` there
//! is the launcher's home.
//!
//! ```
//! use std::ffi::OsString;
//! let cfg = metampi_config::parse_str(
//!     "t.cfg",
//!     "METAHOST a { LAUNCH = local; NODES = a0; }\n\
//!      METAHOST b { LAUNCH = local; NODES = b0; EXECPATH = /opt/app; EXECARGS = -v 'a b';\n\
//!                   ENV = OMP_NUM_THREADS=4; MPIROOT = /opt/metampi; }\n\
//!      PAIR a b 1\na0 <-> b0\n",
//! )?;
//! let b = &cfg.hosts[1];
//! let (program, args) = b.rank_command(0, "./solver".as_ref(), &["x".into()]);
//! assert_eq!(program, "/opt/app/solver");
//! assert_eq!(args, [OsString::from("-v"), OsString::from("a b")]);
//! assert_eq!(b.environment()?, [("OMP_NUM_THREADS".to_string(), "4".to_string())]);
//! assert_eq!(b.router_program(None, "metampi".as_ref()), "/opt/metampi/bin/metampi");
//! // Meta host a runs what the command line says.
//! assert_eq!(cfg.hosts[0].rank_command(0, "./solver".as_ref(), &[]).0, "./solver");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::layout::Table;
use crate::model::{MetaConfig, MetaHost};

/// The prefix of the variables that belong to metampi: the launcher sets several for every
/// process (`METAMPI_RANK`, `METAMPI_SECRET`, `METAMPI_ROUTERS`, ...) and the library reads
/// others, so a description may not set any of them per meta host.
pub const RESERVED_ENV_PREFIX: &str = "METAMPI_";

/// Where the router program lies under `MPIROOT`.
pub const MPIROOT_ROUTER: &str = "bin/metampi";

/// Whether `name` is a variable name a POSIX shell and `env` take: letters, digits and `_`,
/// not starting with a digit.
#[must_use]
pub fn is_env_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && !b[0].is_ascii_digit()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Whether `name` is one of metampi's own variables ([`RESERVED_ENV_PREFIX`]).
#[must_use]
pub fn is_reserved_env(name: &str) -> bool {
    name.starts_with(RESERVED_ENV_PREFIX)
}

/// Splits program arguments (`EXECARGS`, a node's `: 'args'`) into words as a POSIX shell
/// would, without expanding anything: blanks separate words, `'...'` is literal, `"..."` keeps
/// `\"`, `\\`, `` \` `` and `\$` as escapes, and a backslash outside quotes takes the next
/// character literally.
///
/// # Errors
/// An unterminated quote or a backslash at the end, as a short reason.
pub fn split_args(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("unterminated double quote".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => {
                    in_word = true;
                    word.push(c);
                }
                None => return Err("backslash at the end".into()),
            },
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// One variable of an `ENVFILE`, with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvLine {
    /// The variable's name.
    pub name: String,
    /// Its value.
    pub value: String,
    /// The line it is set on.
    pub line: usize,
}

/// Parses the text of an `ENVFILE`: one `NAME=value` per line (an `export ` in front is
/// allowed, blanks around `=` too); blank lines and lines starting with `#` are skipped. The
/// value is the rest of the line without the blanks at its ends; a value in `'...'` is taken
/// literally, one in `"..."` with `\"` and `\\` as escapes (quotes let a value keep blanks at
/// its ends). A `#` inside a value is part of it. Nothing is expanded.
///
/// Not `dotenvy` (decision 0058): it would expand `$VAR` from the launcher's environment, not
/// the meta host's, read other syntax (a blank ends an unquoted value, `#` after it starts a
/// comment), and reports no line number.
///
/// # Errors
/// The first bad line: its 1-based number and what is wrong with it.
pub fn parse_env_file(text: &str) -> Result<Vec<EnvLine>, (usize, String)> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let t = t
            .strip_prefix("export")
            .filter(|rest| rest.starts_with([' ', '\t']))
            .map_or(t, str::trim_start);
        let Some((name, value)) = t.split_once('=') else {
            return Err((line, format!("expected NAME=value, found '{t}'")));
        };
        let name = name.trim_end();
        if !is_env_name(name) {
            return Err((
                line,
                format!(
                    "'{name}' is not an environment variable name (letters, digits and '_', not \
                     starting with a digit)"
                ),
            ));
        }
        let value = unquote(value.trim_start()).map_err(|why| (line, why))?;
        out.push(EnvLine {
            name: name.to_owned(),
            value,
            line,
        });
    }
    Ok(out)
}

/// The value of an `ENVFILE` line: as it is, or the content of `'...'` or `"..."`.
fn unquote(v: &str) -> Result<String, String> {
    let mut chars = v.chars();
    let quote = match chars.next() {
        Some(q @ ('\'' | '"')) => q,
        _ => return Ok(v.to_owned()),
    };
    let mut out = String::new();
    loop {
        match chars.next() {
            None => return Err(format!("unterminated {quote} in the value")),
            Some(c) if c == quote => break,
            Some('\\') if quote == '"' => match chars.next() {
                Some(c @ ('"' | '\\')) => out.push(c),
                Some(c) => {
                    out.push('\\');
                    out.push(c);
                }
                None => return Err(format!("unterminated {quote} in the value")),
            },
            Some(c) => out.push(c),
        }
    }
    let rest = chars.as_str().trim();
    if !rest.is_empty() {
        return Err(format!("'{rest}' after the closing {quote}"));
    }
    Ok(out)
}

/// Why the environment of a meta host could not be put together ([`MetaHost::environment`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// The `ENVFILE` cannot be read.
    #[error("meta host '{host}': cannot read ENVFILE {path}: {source}")]
    Read {
        /// The meta host.
        host: String,
        /// The file as written in the description.
        path: String,
        /// What reading it said.
        source: std::io::Error,
    },
    /// A line of the `ENVFILE` is not `NAME=value`.
    #[error("meta host '{host}': ENVFILE {path}:{line}: {reason}")]
    BadLine {
        /// The meta host.
        host: String,
        /// The file as written in the description.
        path: String,
        /// The 1-based line.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The `ENVFILE` sets one of metampi's own variables.
    #[error(
        "meta host '{host}': ENVFILE {path}:{line} sets {name}: variables named METAMPI_* are \
         metampi's own and cannot be set per meta host (give tuning variables such as \
         METAMPI_SPIN_US to the whole job with `metampi run -x`)"
    )]
    Reserved {
        /// The meta host.
        host: String,
        /// The file as written in the description.
        path: String,
        /// The 1-based line.
        line: usize,
        /// The variable.
        name: String,
    },
}

impl MetaHost {
    /// The variables its processes (ranks and routers) get besides metampi's own: those of
    /// `ENVFILE`, then those of `ENV`, which win over the file's; in a file, a later line
    /// wins. The file is read now (relative to the current directory, `~/` meaning `$HOME`).
    ///
    /// # Errors
    /// An `ENVFILE` that cannot be read, has a line that is not `NAME=value`, or sets a
    /// `METAMPI_*` variable (`ENV` was checked when the description was parsed).
    pub fn environment(&self) -> Result<Vec<(String, String)>, EnvError> {
        let mut vars: Vec<(String, String)> = Vec::new();
        let mut set = |name: String, value: String| {
            vars.retain(|(n, _)| *n != name);
            vars.push((name, value));
        };
        if let Some(file) = &self.env_file {
            let text =
                std::fs::read_to_string(home_path(file)).map_err(|source| EnvError::Read {
                    host: self.name.clone(),
                    path: file.clone(),
                    source,
                })?;
            let lines = parse_env_file(&text).map_err(|(line, reason)| EnvError::BadLine {
                host: self.name.clone(),
                path: file.clone(),
                line,
                reason,
            })?;
            for l in lines {
                if is_reserved_env(&l.name) {
                    return Err(EnvError::Reserved {
                        host: self.name.clone(),
                        path: file.clone(),
                        line: l.line,
                        name: l.name,
                    });
                }
                set(l.name, l.value);
            }
        }
        for (k, v) in &self.env {
            set(k.clone(), v.clone());
        }
        Ok(vars)
    }

    /// The program and arguments its ranks on node `node` (an index into
    /// [`MetaHost::nodes`]) run, when `metampi run` was given `program args`:
    ///
    /// - a node executable (`node : /path/exe : 'args'`) runs with its own arguments, else
    ///   with `EXECARGS`, else with `args`;
    /// - otherwise the program is `EXECPATH` joined with `EXECNAME`, each taken from `program`
    ///   when not given (its directory, its file name: `EXECPATH` alone runs the command's
    ///   file from that directory, `EXECNAME` alone runs that name from the command's
    ///   directory, or through `PATH` when the command has none), with `EXECARGS` instead of
    ///   `args` when given.
    ///
    /// Argument text that does not split ([`split_args`]; only possible when the field was
    /// changed after parsing) is passed as one argument.
    #[must_use]
    pub fn rank_command(
        &self,
        node: usize,
        program: &OsStr,
        args: &[OsString],
    ) -> (OsString, Vec<OsString>) {
        let split = |text: &str| -> Vec<OsString> {
            split_args(text)
                .unwrap_or_else(|_| vec![text.to_owned()])
                .into_iter()
                .map(OsString::from)
                .collect()
        };
        let node = self.nodes.get(node);
        if let Some(exe) = node.and_then(|n| n.executable.as_ref()) {
            let args = node
                .and_then(|n| n.exec_args.as_deref())
                .or(self.exec_args.as_deref())
                .map_or_else(|| args.to_vec(), split);
            return (exe.into(), args);
        }
        let args = self
            .exec_args
            .as_deref()
            .map_or_else(|| args.to_vec(), split);
        if self.exec_path.is_none() && self.exec_name.is_none() {
            return (program.to_owned(), args);
        }
        let given = Path::new(program);
        let name: &OsStr = match &self.exec_name {
            Some(n) => n.as_ref(),
            None => given.file_name().unwrap_or(program),
        };
        let dir = match &self.exec_path {
            Some(d) => Some(Path::new(d)),
            None => given.parent().filter(|p| !p.as_os_str().is_empty()),
        };
        let program = match dir {
            Some(d) => d.join(name).into_os_string(),
            None => name.to_owned(),
        };
        (program, args)
    }

    /// Whether its ranks may run something other than the command `metampi run` was given:
    /// `EXECPATH`, `EXECNAME`, `EXECARGS` (or NUMHOSTS arguments) or a node executable is set.
    #[must_use]
    pub fn sets_rank_command(&self) -> bool {
        self.exec_path.is_some()
            || self.exec_name.is_some()
            || self.exec_args.is_some()
            || self.nodes.iter().any(|n| n.executable.is_some())
    }

    /// The program that starts its router whose executable in the layout is `exec`
    /// ([`crate::RouterLayout::exec`]: from the PAIR header, else `ROUTEREXEC`): that
    /// executable, else `MPIROOT/bin/metampi`, else `default` (the launcher's own metampi).
    /// It is run as `PROGRAM router` with the router's spec in its environment, so it is a
    /// metampi binary or a program that ends by running one (`exec metampi "$@"`).
    #[must_use]
    pub fn router_program(&self, exec: Option<&str>, default: &OsStr) -> OsString {
        match (exec, &self.mpi_root) {
            (Some(e), _) => e.into(),
            (None, Some(root)) => Path::new(root).join(MPIROOT_ROUTER).into_os_string(),
            (None, None) => default.to_owned(),
        }
    }
}

/// `~/rest` as `$HOME/rest`; anything else as it is (the description's file paths, and
/// every tool that reads one).
pub fn home_path(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

impl MetaConfig {
    /// The settings that change what a meta host's processes run or their environment, per
    /// meta host, as a table for `metampi check` (empty when no meta host has any).
    #[must_use]
    pub fn process_settings(&self) -> ProcessSettings<'_> {
        ProcessSettings(self)
    }
}

/// The table of [`MetaConfig::process_settings`].
pub struct ProcessSettings<'a>(&'a MetaConfig);

impl ProcessSettings<'_> {
    fn rows(&self) -> Vec<Vec<String>> {
        let cfg = self.0;
        let mut rows = Vec::new();
        for (i, h) in cfg.hosts.iter().enumerate() {
            let mut row = |key: String, value: String| {
                rows.push(vec![h.name.clone(), key, value]);
            };
            let plain = [
                ("EXECPATH", &h.exec_path),
                ("EXECNAME", &h.exec_name),
                ("EXECARGS", &h.exec_args),
            ];
            for (key, v) in plain {
                if let Some(v) = v {
                    row(key.into(), v.clone());
                }
            }
            for n in &h.nodes {
                if let Some(exe) = &n.executable {
                    let args = n
                        .exec_args
                        .as_ref()
                        .map(|a| format!(" (arguments: {a})"))
                        .unwrap_or_default();
                    row(format!("node {}", n.name), format!("{exe}{args}"));
                }
            }
            if let Some(f) = &h.env_file {
                row("ENVFILE".into(), f.clone());
            }
            for (k, v) in &h.env {
                row("ENV".into(), format!("{k}={}", display_value(v)));
            }
            if let Some(root) = &h.mpi_root {
                let router = Path::new(root).join(MPIROOT_ROUTER);
                row(
                    "MPIROOT".into(),
                    format!("{root} (routers run {})", router.display()),
                );
            }
            if let Some(e) = &h.router_exec {
                row("ROUTEREXEC".into(), e.clone());
            }
            for p in cfg.pairs.iter().filter(|p| p.from == i) {
                let mut execs: Vec<&str> = p
                    .routers
                    .iter()
                    .filter_map(|r| r.exec.as_deref())
                    .filter(|e| Some(*e) != h.router_exec.as_deref())
                    .collect();
                execs.dedup();
                for e in execs {
                    row(
                        format!("PAIR {} {}", h.name, cfg.hosts[p.to].name),
                        format!("router executable {e}"),
                    );
                }
            }
        }
        rows
    }
}

impl fmt::Display for ProcessSettings<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = self.rows();
        if rows.is_empty() {
            return Ok(());
        }
        writeln!(f, "\nprograms and environment")?;
        let mut t = Table::new(&["HOST", "SETTING", "VALUE"]);
        for r in rows {
            t.row(r);
        }
        t.write(f)
    }
}

/// A value as the description language would take it back: bare when it is one plain word,
/// else in double quotes.
fn display_value(v: &str) -> String {
    let plain = !v.is_empty()
        && v.chars().all(|c| {
            c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ':' | '@' | '%' | '+')
        });
    if plain {
        return v.to_owned();
    }
    let mut out = String::from("\"");
    for c in v.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> MetaConfig {
        crate::parse_str("t.cfg", text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn err(text: &str) -> String {
        crate::parse_str("t.cfg", text).unwrap_err().to_string()
    }

    fn two(b_settings: &str) -> String {
        format!(
            "METAHOST a {{ LAUNCH = local; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = local; NODES = b0, b1 : /opt/b1/prog : '-x \"1 2\"'; {b_settings} }}\n\
             PAIR a b 1\na0 <-> b0\n"
        )
    }

    /// The table with runs of blanks as one blank, so that rows read without the padding.
    fn squash(table: &str) -> String {
        table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn os(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn args_split_like_a_shell() {
        assert_eq!(split_args("").unwrap(), Vec::<String>::new());
        assert_eq!(
            split_args(r#"  -v  'a b' "c \"d\" \x" e\ f '' "#).unwrap(),
            ["-v", "a b", "c \"d\" \\x", "e f", ""]
        );
        assert_eq!(split_args("$HOME *").unwrap(), ["$HOME", "*"]);
        assert!(split_args("'a").unwrap_err().contains("single quote"));
        assert!(split_args("\"a").unwrap_err().contains("double quote"));
        assert!(split_args("a\\").unwrap_err().contains("backslash"));
    }

    #[test]
    fn env_names() {
        assert!(is_env_name("A") && is_env_name("_x1") && is_env_name("OMP_NUM_THREADS"));
        assert!(!is_env_name("") && !is_env_name("1A") && !is_env_name("A-B"));
        assert!(is_reserved_env("METAMPI_RANK") && !is_reserved_env("metampi_rank"));
    }

    #[test]
    fn env_file_lines() {
        let text = "# comment\n\nA=1\n  export B = two words  \nC='  x # y '\nD=\"q\\\"q\\\\\"\nE=\nA=3 # not a comment\n";
        let got: Vec<(String, String, usize)> = parse_env_file(text)
            .unwrap()
            .into_iter()
            .map(|l| (l.name, l.value, l.line))
            .collect();
        let want = [
            ("A", "1", 3),
            ("B", "two words", 4),
            ("C", "  x # y ", 5),
            ("D", "q\"q\\", 6),
            ("E", "", 7),
            ("A", "3 # not a comment", 8),
        ];
        assert_eq!(got, want.map(|(n, v, l)| (n.to_string(), v.to_string(), l)));
        let bad = |t: &str| parse_env_file(t).unwrap_err();
        assert_eq!(
            bad("A=1\noops\n"),
            (2, "expected NAME=value, found 'oops'".into())
        );
        assert!(bad("1X=2")
            .1
            .contains("'1X' is not an environment variable name"));
        assert!(bad("A='x").1.contains("unterminated"));
        assert!(bad("A=\"x\" y").1.contains("'y' after the closing"));
        assert_eq!(bad("exportA B=1").0, 1);
    }

    #[test]
    fn inline_env_is_checked_when_parsed() {
        let e = err(&two("ENV = METAMPI_RANK=3;"));
        assert!(
            e.starts_with("t.cfg:2:")
                && e.contains("ENV of meta host 'b' sets METAMPI_RANK: variables named METAMPI_*"),
            "{e}"
        );
        let e = err(&two("ENV = A=1, B=2; ENV = A=3;"));
        assert!(
            e.contains("ENV variable A is already set in METAHOST block 'b' (first at 2:"),
            "{e}"
        );
        let e = err(&two("ENV = 9A=1;"));
        assert!(
            e.contains("'9A' is not an environment variable name"),
            "{e}"
        );
    }

    #[test]
    fn bad_argument_quoting_is_reported_where_written() {
        let e = err(&two("EXECARGS = \"-v 'a b\";"));
        assert!(
            e.starts_with("t.cfg:2:") && e.contains("for EXECARGS") && e.contains("single quote"),
            "{e}"
        );
        let e = err(
            "METAHOST a { LAUNCH = local; NODES = a0 : /bin/x : 'it\"s'; }\n\
             METAHOST b { LAUNCH = local; NODES = b0; }\nPAIR a b 1\na0 <-> b0\n",
        );
        assert!(
            e.starts_with("t.cfg:1:") && e.contains("unterminated double quote"),
            "{e}"
        );
        let e = err("NUMHOSTS 1\na 2 'x \"y'\n");
        assert!(
            e.starts_with("t.cfg:2:1:") && e.contains("NUMHOSTS line"),
            "{e}"
        );
    }

    #[test]
    fn rank_programs_follow_exec_settings() {
        let cmd = |settings: &str, node: usize, program: &str| {
            let cfg = parse(&two(settings));
            cfg.hosts[1].rank_command(node, OsStr::new(program), &os(&["cli"]))
        };
        let (p, a) = cmd("", 0, "./app");
        assert_eq!((p, a), ("./app".into(), os(&["cli"])));
        assert_eq!(cmd("EXECPATH = /opt/bin;", 0, "./app").0, "/opt/bin/app");
        assert_eq!(cmd("EXECPATH = /opt/bin;", 0, "app").0, "/opt/bin/app");
        assert_eq!(cmd("EXECNAME = big;", 0, "./dir/app").0, "./dir/big");
        assert_eq!(cmd("EXECNAME = big;", 0, "app").0, "big");
        assert_eq!(cmd("EXECNAME = /abs/big;", 0, "./app").0, "/abs/big");
        assert_eq!(
            cmd("EXECPATH = rel; EXECNAME = big;", 0, "/x/app").0,
            "rel/big"
        );
        assert_eq!(
            cmd("EXECARGS = \"-n 1\" 'x y';", 0, "app").1,
            os(&["-n 1", "x y"])
        );
        // A node's own executable wins, with its own arguments.
        let (p, a) = cmd("EXECPATH = /opt/bin; EXECARGS = z;", 1, "app");
        assert_eq!((p, a), ("/opt/b1/prog".into(), os(&["-x", "1 2"])));
        // The quoted text of a NUMHOSTS line is the meta host's arguments.
        let cfg = parse("NUMHOSTS 1\na 2 '--fast \"a b\"'\n");
        assert_eq!(
            cfg.hosts[0].rank_command(0, OsStr::new("p"), &[]).1,
            os(&["--fast", "a b"])
        );
    }

    #[test]
    fn router_programs() {
        let cfg = parse(
            "METAHOST a { LAUNCH = local; NODES = a0; MPIROOT = /opt/mpi; }\n\
             METAHOST b { LAUNCH = local; NODES = b0; ROUTEREXEC = ./wrap; }\n\
             METAHOST c { LAUNCH = local; NODES = c0; }\n\
             PAIR a b 1 /pair/router\na0 -> b0\nPAIR b a 1\nb0 -> a0\n\
             PAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n",
        );
        let l = cfg.layout();
        let me = OsStr::new("/me/metampi");
        let progs: Vec<String> = l
            .routers
            .iter()
            .map(|r| {
                let p = cfg.hosts[r.host].router_program(r.exec.as_deref(), me);
                format!("{}>{} {}", r.host, r.peer, p.to_string_lossy())
            })
            .collect();
        assert_eq!(
            progs,
            [
                "0>1 /pair/router",
                "0>2 /opt/mpi/bin/metampi",
                "1>0 ./wrap",
                "1>2 ./wrap",
                "2>0 /me/metampi",
                "2>1 /me/metampi"
            ]
        );
        let table = squash(&cfg.process_settings().to_string());
        for line in [
            "programs and environment",
            "a MPIROOT /opt/mpi (routers run /opt/mpi/bin/metampi)",
            "a PAIR a b router executable /pair/router",
            "b ROUTEREXEC ./wrap",
        ] {
            assert!(table.contains(line), "{line:?} in\n{table}");
        }
    }

    #[test]
    fn environment_merges_file_and_inline_settings() {
        let dir = std::env::temp_dir().join(format!("metampi-cfg-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("b.env");
        std::fs::write(&file, "A=from file\nB=file\n# c\n").unwrap();
        let cfg = parse(&two(&format!(
            "ENVFILE = {}; ENV = B=inline, C=\"x y\";",
            file.display()
        )));
        assert_eq!(
            cfg.hosts[1].environment().unwrap(),
            [("A", "from file"), ("B", "inline"), ("C", "x y")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        let table = squash(&cfg.process_settings().to_string());
        assert!(table.contains("b ENV C=\"x y\""), "{table}");
        assert!(
            table.contains("b node b1 /opt/b1/prog (arguments: -x \"1 2\")"),
            "{table}"
        );
        assert!(cfg.hosts[0].environment().unwrap().is_empty());

        std::fs::write(&file, "A=1\nMETAMPI_SIZE=9\n").unwrap();
        let e = cfg.hosts[1].environment().unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "meta host 'b': ENVFILE {}:2 sets METAMPI_SIZE: variables named METAMPI_* are \
                 metampi's own and cannot be set per meta host (give tuning variables such as \
                 METAMPI_SPIN_US to the whole job with `metampi run -x`)",
                file.display()
            )
        );
        std::fs::write(&file, "A=1\n\nnot a setting\n").unwrap();
        let e = cfg.hosts[1].environment().unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "meta host 'b': ENVFILE {}:3: expected NAME=value, found 'not a setting'",
                file.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let e = cfg.hosts[1].environment().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "meta host 'b': cannot read ENVFILE {}: ",
                file.display()
            )),
            "{e}"
        );
        assert!(parse(&two(""))
            .process_settings()
            .to_string()
            .contains("node b1"));
        let none = parse(
            "METAHOST a { LAUNCH = local; NODES = a0; }\n\
             METAHOST b { LAUNCH = local; NODES = b0; }\nPAIR a b 1\na0 <-> b0\n",
        );
        assert_eq!(none.process_settings().to_string(), "");
    }
}
