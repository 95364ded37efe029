//! Hosts and slots (`--hosts a,b:4`, hostfiles) and the placement of ranks on them.

use std::ffi::OsString;
use std::fmt;

use thiserror::Error;

use crate::remote::HostLaunch;

/// A machine ranks can be placed on, with the number of ranks it takes before placement moves
/// on to the next host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Host name as given (also what ssh connects to, unless [`Host::launch`] says otherwise,
    /// and what `METAMPI_NODE` says).
    pub name: String,
    /// Ranks placed here in the first pass; at least 1, except for a host where only helpers
    /// are started by hand ([`HostLaunch::Manual`] with helpers), which may have 0 and then
    /// gets no rank.
    pub slots: usize,
    /// How ranks placed here start, overriding the job's
    /// [`LaunchMethod`](crate::LaunchMethod); `None` follows it.
    pub launch: Option<HostLaunch>,
    /// Variables for the ranks placed here, over the job's ([`JobSpec::env`](crate::JobSpec::env)
    /// and what it exports); a later entry wins over an earlier one of the same name.
    pub env: Vec<(OsString, OsString)>,
}

impl Host {
    /// A host with `slots` slots.
    pub fn new(name: impl Into<String>, slots: usize) -> Self {
        Host {
            name: name.into(),
            slots,
            launch: None,
            env: Vec::new(),
        }
    }

    /// Sets `name=value` for the ranks placed here (after any set before), over the job's
    /// own variables: a site's settings in a meta job. Ranks on this machine still inherit
    /// the launcher's environment underneath; remote ranks get these on their command line.
    #[must_use]
    pub fn with_env<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Starts the ranks placed here with `launch`, whatever the job's launch method.
    #[must_use]
    pub fn with_launch(mut self, launch: HostLaunch) -> Self {
        self.launch = Some(launch);
        self
    }

    /// Parses a comma-separated host list as given to `--hosts`: `a,b:4` means `a` with one slot
    /// and `b` with four.
    ///
    /// # Errors
    /// An empty list, an empty entry (`a,,b`), an empty name (`:4`), a slot count that is not a
    /// positive integer (`a:0`, `a:x`), or a name that is not a plain host name.
    pub fn parse_list(spec: &str) -> Result<Vec<Host>, HostSpecError> {
        if spec.trim().is_empty() {
            return Err(HostSpecError::new(None, spec, HostSpecErrorKind::NoHosts));
        }
        spec.split(',')
            .map(|entry| parse_entry(entry.trim(), None))
            .collect()
    }

    /// Parses a hostfile: one host per line as `host`, `host:N` or `host slots=N`; `#` starts a
    /// comment; blank lines are ignored.
    ///
    /// # Errors
    /// As [`Host::parse_list`], with the 1-based line number; also unknown `key=value` options
    /// and a file with no host at all.
    pub fn parse_hostfile(text: &str) -> Result<Vec<Host>, HostSpecError> {
        let mut hosts = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line_no = Some(index + 1);
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            // Invariant: `line` is non-empty after trim, so there is a first word.
            let first = words.next().unwrap_or(line);
            let mut host = parse_entry(first, line_no)?;
            for option in words {
                let (key, value) = option.split_once('=').unwrap_or((option, ""));
                match key {
                    "slots" => host.slots = parse_slots(value, option, line_no)?,
                    _ => {
                        return Err(HostSpecError::new(
                            line_no,
                            line,
                            HostSpecErrorKind::UnknownOption(option.to_string()),
                        ))
                    }
                }
            }
            hosts.push(host);
        }
        if hosts.is_empty() {
            return Err(HostSpecError::new(None, "", HostSpecErrorKind::NoHosts));
        }
        Ok(hosts)
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.slots)
    }
}

/// A malformed host list entry or hostfile line.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}", self.describe())]
#[non_exhaustive]
pub struct HostSpecError {
    /// 1-based hostfile line, `None` for `--hosts` lists.
    pub line: Option<usize>,
    /// The offending entry or line.
    pub entry: String,
    /// What is wrong with it.
    pub kind: HostSpecErrorKind,
}

impl HostSpecError {
    fn describe(&self) -> String {
        if self.kind == HostSpecErrorKind::NoHosts {
            // Nothing to quote: the list is empty, or the file holds only blanks and comments.
            return "no host named (an empty list, or only blank lines and comments)".into();
        }
        let at = self
            .line
            .map(|l| format!("hostfile line {l}: "))
            .unwrap_or_default();
        format!("{at}bad host entry `{}`: {}", self.entry, self.kind)
    }

    pub(crate) fn new(line: Option<usize>, entry: &str, kind: HostSpecErrorKind) -> Self {
        HostSpecError {
            line,
            entry: entry.to_string(),
            kind,
        }
    }
}

/// What is wrong with a host entry.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum HostSpecErrorKind {
    /// The list or file names no host.
    #[error("no host given")]
    NoHosts,
    /// `a,,b` or a stray comma.
    #[error("empty entry")]
    EmptyEntry,
    /// `:4`.
    #[error("host name is empty")]
    EmptyName,
    /// A name that would not survive ssh or shell quoting as a host name; a leading `-` would
    /// even turn into an ssh option.
    #[error("`{0}` is not a valid host name (letters, digits, `.`, `-`, `_`, `@`; not starting with `-`)")]
    BadName(String),
    /// `a:x`.
    #[error("slot count `{0}` is not a positive integer")]
    BadSlots(String),
    /// `a:0`.
    #[error("slot count must be at least 1")]
    ZeroSlots,
    /// `host cpus=4` and the like.
    #[error("unknown option `{0}` (only `slots=N` is understood)")]
    UnknownOption(String),
}

/// Where one rank goes: the result of [`place`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Placement {
    /// Global rank.
    pub rank: usize,
    /// Index of the MIMD application this rank runs.
    pub app: usize,
    /// Index into the host list, `None` when no hosts were given (everything on this machine).
    pub host: Option<usize>,
    /// The value of `METAMPI_NODE`.
    pub node: String,
    /// Index among the ranks with the same `node`, in rank order.
    pub local_rank: usize,
    /// Number of ranks with the same `node`.
    pub local_size: usize,
}

/// Places the ranks of apps with `app_sizes` ranks each on `hosts`.
///
/// Ranks are numbered contiguously, app after app. The first pass fills each host's slots in
/// host order; ranks beyond the total slot count wrap round-robin over the hosts that have
/// slots, one rank per host per round. With no hosts every rank goes to `local_node`. Host names `localhost`,
/// `127.0.0.1` and `::1` are reported as `local_node`, so that they share a node with ranks
/// placed on the machine's own name.
pub fn place(app_sizes: &[usize], hosts: &[Host], local_node: &str) -> Vec<Placement> {
    let size: usize = app_sizes.iter().sum();
    let total_slots = hosts
        .iter()
        .fold(0usize, |acc, h| acc.saturating_add(h.slots));
    // Hosts without slots (helpers only) take no rank in the wrap-around either, unless no
    // host has any.
    let open: Vec<usize> = (0..hosts.len()).filter(|&h| hosts[h].slots > 0).collect();
    let host_of = |rank: usize| -> Option<usize> {
        if hosts.is_empty() {
            return None;
        }
        if rank >= total_slots {
            return Some(match open.len() {
                0 => (rank - total_slots) % hosts.len(),
                n => open[(rank - total_slots) % n],
            });
        }
        let mut remaining = rank;
        for (index, host) in hosts.iter().enumerate() {
            if remaining < host.slots {
                return Some(index);
            }
            remaining -= host.slots;
        }
        // Unreachable: rank < total_slots means some host's slots cover it.
        Some(hosts.len() - 1)
    };

    let mut placements = Vec::with_capacity(size);
    let mut rank = 0;
    for (app, &n) in app_sizes.iter().enumerate() {
        for _ in 0..n {
            let host = host_of(rank);
            let node = match host {
                None => local_node.to_string(),
                Some(h) if is_loopback_name(&hosts[h].name) => local_node.to_string(),
                Some(h) => hosts[h].name.clone(),
            };
            placements.push(Placement {
                rank,
                app,
                host,
                node,
                local_rank: 0,
                local_size: 0,
            });
            rank += 1;
        }
    }

    let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for p in &mut placements {
        let count = counts.entry(p.node.clone()).or_insert(0);
        p.local_rank = *count;
        *count += 1;
    }
    for p in &mut placements {
        p.local_size = counts[&p.node];
    }
    placements
}

/// Names that always mean "this machine", whatever it is called.
pub(crate) fn is_loopback_name(name: &str) -> bool {
    matches!(name, "localhost" | "127.0.0.1" | "::1")
}

fn parse_entry(entry: &str, line: Option<usize>) -> Result<Host, HostSpecError> {
    if entry.is_empty() {
        return Err(HostSpecError::new(
            line,
            entry,
            HostSpecErrorKind::EmptyEntry,
        ));
    }
    let (name, slots) = match entry.split_once(':') {
        Some((name, slots)) => (name, Some(slots)),
        None => (entry, None),
    };
    if name.is_empty() {
        return Err(HostSpecError::new(
            line,
            entry,
            HostSpecErrorKind::EmptyName,
        ));
    }
    let valid = !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'));
    if !valid {
        return Err(HostSpecError::new(
            line,
            entry,
            HostSpecErrorKind::BadName(name.to_string()),
        ));
    }
    let slots = match slots {
        Some(text) => parse_slots(text, entry, line)?,
        None => 1,
    };
    Ok(Host::new(name, slots))
}

fn parse_slots(text: &str, entry: &str, line: Option<usize>) -> Result<usize, HostSpecError> {
    match text.parse::<usize>() {
        Ok(0) => Err(HostSpecError::new(
            line,
            entry,
            HostSpecErrorKind::ZeroSlots,
        )),
        Ok(n) => Ok(n),
        Err(_) => Err(HostSpecError::new(
            line,
            entry,
            HostSpecErrorKind::BadSlots(text.to_string()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(p: &[Placement]) -> Vec<&str> {
        p.iter().map(|p| p.node.as_str()).collect()
    }

    #[test]
    fn list_with_and_without_slots() {
        let hosts = Host::parse_list("a,b:4, c:2").unwrap();
        assert_eq!(
            hosts,
            vec![Host::new("a", 1), Host::new("b", 4), Host::new("c", 2)]
        );
    }

    #[test]
    fn list_errors() {
        let kind = |s: &str| Host::parse_list(s).unwrap_err().kind;
        assert_eq!(kind("a:0"), HostSpecErrorKind::ZeroSlots);
        assert_eq!(kind("a:x"), HostSpecErrorKind::BadSlots("x".into()));
        assert_eq!(kind("a:-1"), HostSpecErrorKind::BadSlots("-1".into()));
        assert_eq!(kind("a:"), HostSpecErrorKind::BadSlots("".into()));
        assert_eq!(kind(":3"), HostSpecErrorKind::EmptyName);
        assert_eq!(kind("a,,b"), HostSpecErrorKind::EmptyEntry);
        assert_eq!(kind(""), HostSpecErrorKind::NoHosts);
        assert_eq!(
            kind("-oProxyCommand=x"),
            HostSpecErrorKind::BadName("-oProxyCommand=x".into())
        );
        assert_eq!(kind("a b"), HostSpecErrorKind::BadName("a b".into()));
        assert_eq!(kind("a;rm"), HostSpecErrorKind::BadName("a;rm".into()));
        let msg = Host::parse_list("a,b:0").unwrap_err().to_string();
        assert!(msg.contains("`b:0`") && msg.contains("at least 1"), "{msg}");
    }

    #[test]
    fn hostfile_forms_and_comments() {
        let text = "# cluster\nnode1\nnode2 slots=4   # big one\n\n  node3:2\nuser@node4 slots=1\n";
        let hosts = Host::parse_hostfile(text).unwrap();
        assert_eq!(
            hosts,
            vec![
                Host::new("node1", 1),
                Host::new("node2", 4),
                Host::new("node3", 2),
                Host::new("user@node4", 1),
            ]
        );
    }

    #[test]
    fn hostfile_errors_carry_line_numbers() {
        let e = Host::parse_hostfile("a\nb slots=0\n").unwrap_err();
        assert_eq!(
            (e.line, e.kind.clone()),
            (Some(2), HostSpecErrorKind::ZeroSlots)
        );
        assert!(e.to_string().starts_with("hostfile line 2:"), "{e}");
        let e = Host::parse_hostfile("a\n\nb cpus=2").unwrap_err();
        assert_eq!(e.line, Some(3));
        assert_eq!(e.kind, HostSpecErrorKind::UnknownOption("cpus=2".into()));
        let e = Host::parse_hostfile("# only a comment\n\n").unwrap_err();
        assert_eq!(e.kind, HostSpecErrorKind::NoHosts);
        let e = Host::parse_hostfile("x slots=many").unwrap_err();
        assert_eq!(e.kind, HostSpecErrorKind::BadSlots("many".into()));
    }

    #[test]
    fn placement_fills_slots_in_order() {
        let hosts = Host::parse_list("a,b:4").unwrap();
        let p = place(&[5], &hosts, "me");
        assert_eq!(nodes(&p), ["a", "b", "b", "b", "b"]);
        assert_eq!(p[0].host, Some(0));
        assert_eq!(p[4].host, Some(1));
        assert_eq!(
            p.iter()
                .map(|p| (p.local_rank, p.local_size))
                .collect::<Vec<_>>(),
            [(0, 1), (0, 4), (1, 4), (2, 4), (3, 4)]
        );
    }

    #[test]
    fn placement_wraps_round_robin_when_oversubscribed() {
        let hosts = Host::parse_list("a,b:2").unwrap();
        let p = place(&[7], &hosts, "me");
        assert_eq!(nodes(&p), ["a", "b", "b", "a", "b", "a", "b"]);
        let a: Vec<_> = p
            .iter()
            .filter(|p| p.node == "a")
            .map(|p| p.local_rank)
            .collect();
        assert_eq!(a, [0, 1, 2]);
        assert!(p
            .iter()
            .filter(|p| p.node == "a")
            .all(|p| p.local_size == 3));
        assert!(p
            .iter()
            .filter(|p| p.node == "b")
            .all(|p| p.local_size == 4));
    }

    #[test]
    fn placement_numbers_mimd_apps_contiguously() {
        let p = place(&[2, 3], &[], "me");
        assert_eq!(
            p.iter().map(|p| (p.rank, p.app)).collect::<Vec<_>>(),
            [(0, 0), (1, 0), (2, 1), (3, 1), (4, 1)]
        );
        assert!(p
            .iter()
            .all(|p| p.node == "me" && p.local_size == 5 && p.host.is_none()));
        assert_eq!(
            p.iter().map(|p| p.local_rank).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
    }

    #[test]
    fn loopback_names_share_the_local_node() {
        let hosts = Host::parse_list("localhost,me:1,other").unwrap();
        let p = place(&[3], &hosts, "me");
        assert_eq!(nodes(&p), ["me", "me", "other"]);
        assert_eq!((p[1].local_rank, p[1].local_size), (1, 2));
    }
}
