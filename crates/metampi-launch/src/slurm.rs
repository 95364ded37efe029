//! Slurm as the way processes reach their nodes: `metampi run` inside an allocation and meta
//! hosts with `LAUNCH = slurm` start every rank and router with a one-task `srun` step on its
//! node ([`srun_words`], [`HostLaunch::Srun`](crate::HostLaunch::Srun)), the way MPICH's
//! `mpirun` uses srun instead of ssh there.
//!
//! Inside an allocation the nodes and their task counts come from Slurm's variables
//! ([`allocation_hosts`], with [`expand_hostlist`] and [`expand_counts`] for its compressed
//! lists). A meta host outside any allocation gets one of its own ([`Allocation`]: `salloc
//! --no-shell` on its nodes, cancelled when the job ends), so the site's queue, accounting and
//! limits see one job per meta host.
//!
//! Each step is `--overlap` (steps of one allocation share its CPUs, as the ranks of one node
//! do) and `--cpu-bind=none`: overlapping one-task steps would otherwise all be bound to the
//! first CPU of the node. Binding stays the launcher's (`--bind-to`).

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::command;
use crate::Host;

/// Most names one host list may expand to: a typo such as `n[1-99999999]` is refused rather
/// than allocating millions of names.
const MAX_NAMES: usize = 1 << 20;

/// Expands a Slurm host list (`n[1-3,7],gpu[01-02]-a,login`) into names, in order: commas
/// outside brackets separate entries, each bracket group is a list of numbers and ranges, a
/// range keeps the width of its first bound (`[08-10]` gives `08 09 10`), and several groups in
/// one entry give every combination.
///
/// # Errors
/// Unbalanced brackets, a range that is not `LOW-HIGH` with `LOW <= HIGH`, an empty entry, or
/// more than a million names.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for entry in split_top(list)? {
        if entry.is_empty() {
            return Err(format!("host list `{list}` has an empty entry"));
        }
        let mut partial = vec![String::new()];
        let mut rest = entry;
        while !rest.is_empty() {
            let (literal, group, tail) = match rest.find('[') {
                Some(open) => {
                    let close = rest[open..]
                        .find(']')
                        .map(|c| open + c)
                        .ok_or_else(|| format!("host list `{list}`: `[` without `]`"))?;
                    (
                        &rest[..open],
                        Some(&rest[open + 1..close]),
                        &rest[close + 1..],
                    )
                }
                None => (rest, None, ""),
            };
            if literal.contains(']') {
                return Err(format!("host list `{list}`: `]` without `[`"));
            }
            let suffixes = match group {
                Some(g) => expand_group(g).map_err(|why| format!("host list `{list}`: {why}"))?,
                None => vec![String::new()],
            };
            if partial.len().saturating_mul(suffixes.len()) > MAX_NAMES {
                return Err(format!(
                    "host list `{list}` names more than {MAX_NAMES} hosts"
                ));
            }
            partial = partial
                .iter()
                .flat_map(|p| suffixes.iter().map(move |s| format!("{p}{literal}{s}")))
                .collect();
            rest = tail;
        }
        names.extend(partial);
        if names.len() > MAX_NAMES {
            return Err(format!(
                "host list `{list}` names more than {MAX_NAMES} hosts"
            ));
        }
    }
    Ok(names)
}

/// Splits at commas outside brackets.
fn split_top(list: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("host list `{list}`: nested `[`")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("host list `{list}`: `]` without `[`")),
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("host list `{list}`: `[` without `]`"));
    }
    parts.push(&list[start..]);
    Ok(parts)
}

/// `1-3,7,08-10` inside brackets.
fn expand_group(group: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in group.split(',') {
        let (low, high) = item.split_once('-').unwrap_or((item, item));
        let number = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("`[{group}]`: `{item}` is not a number or a range"));
            }
            s.parse::<u64>()
                .map_err(|_| format!("`[{group}]`: `{s}` is too large"))
        };
        let (lo, hi) = (number(low)?, number(high)?);
        if lo > hi {
            return Err(format!("`[{group}]`: the range `{item}` runs backwards"));
        }
        if (hi - lo) as usize >= MAX_NAMES {
            return Err(format!("`[{group}]` names more than {MAX_NAMES} hosts"));
        }
        let width = low.len();
        out.extend((lo..=hi).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// Expands Slurm's per-node counts (`SLURM_TASKS_PER_NODE`: `4(x2),1` is 4, 4, 1).
///
/// # Errors
/// An entry that is neither `N` nor `N(xK)`.
pub fn expand_counts(list: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for item in list.split(',') {
        let bad = || format!("`{list}`: `{item}` is neither N nor N(xK)");
        let (n, times) = match item.split_once("(x") {
            Some((n, rest)) => {
                let k = rest.strip_suffix(')').ok_or_else(bad)?;
                (n, k.parse::<usize>().map_err(|_| bad())?)
            }
            None => (item, 1),
        };
        let n = n.parse::<usize>().map_err(|_| bad())?;
        if out.len().saturating_add(times) > MAX_NAMES {
            return Err(format!("`{list}` counts more than {MAX_NAMES} nodes"));
        }
        out.extend(std::iter::repeat_n(n, times));
    }
    Ok(out)
}

/// The nodes of the Slurm allocation this process runs in, each with its number of tasks as
/// slots, every one started through srun ([`HostLaunch::Srun`](crate::HostLaunch::Srun)).
/// `get` reads a variable (`std::env::var`, or a map in tests).
///
/// # Errors
/// Not inside an allocation (`SLURM_JOB_ID` unset), or a node list or task count that cannot
/// be read, named with its variable.
pub fn allocation_hosts(get: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Host>, String> {
    let job = get("SLURM_JOB_ID")
        .filter(|j| !j.is_empty())
        .ok_or("not inside a Slurm allocation (SLURM_JOB_ID is not set)")?;
    let (var, list) = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .into_iter()
        .find_map(|v| get(v).filter(|l| !l.is_empty()).map(|l| (v, l)))
        .ok_or_else(|| format!("inside Slurm job {job}, but SLURM_JOB_NODELIST is not set"))?;
    let nodes = expand_hostlist(&list).map_err(|e| format!("{var}: {e}"))?;
    let counts = match get("SLURM_TASKS_PER_NODE").filter(|c| !c.is_empty()) {
        Some(c) => {
            let counts = expand_counts(&c).map_err(|e| format!("SLURM_TASKS_PER_NODE: {e}"))?;
            if counts.len() != nodes.len() {
                return Err(format!(
                    "SLURM_TASKS_PER_NODE `{c}` counts {} nodes, {var} names {}",
                    counts.len(),
                    nodes.len()
                ));
            }
            counts
        }
        // Allocated by nodes alone: one rank per node before wrapping round.
        None => vec![1; nodes.len()],
    };
    nodes
        .into_iter()
        .zip(counts)
        .map(|(node, slots)| {
            let launch = crate::HostLaunch::srun(Some(&job), &node, &[], None)?;
            Ok(Host::new(node, slots).with_launch(launch))
        })
        .collect()
}

/// `srun` and its options for one process on `node`, in allocation `job` (`None`: the one in
/// `SLURM_JOB_ID`), followed by `extra` options of the user's.
pub fn srun_words(job: Option<&str>, node: &str, extra: &[String]) -> Vec<String> {
    let mut words: Vec<String> = ["srun", "--overlap", "--nodes=1", "--ntasks=1"]
        .map(String::from)
        .into();
    if let Some(job) = job {
        words.push(format!("--jobid={job}"));
    }
    words.extend([
        format!("--nodelist={node}"),
        "--cpu-bind=none".into(),
        "--mpi=none".into(),
        "--quiet".into(),
    ]);
    words.extend(extra.iter().cloned());
    words
}

/// A Slurm job holding a meta host's nodes for the length of a metampi job (`salloc
/// --no-shell`); cancelled when dropped.
#[derive(Debug)]
pub struct Allocation {
    id: String,
    /// ssh options and destination of the login node where Slurm's commands run, if not here.
    login: Option<Vec<String>>,
}

impl Allocation {
    /// Asks Slurm for `nodes` (by name, `per_node` tasks each) with the user's `options`
    /// (which come last, so they win), on this machine or through ssh with `login` (options
    /// and destination), and waits until it is granted. salloc's own messages while it waits
    /// (queued, pending) go to stderr.
    ///
    /// # Errors
    /// salloc cannot run, refuses, or ends without granting.
    pub fn request(
        name: &str,
        nodes: &[String],
        per_node: usize,
        options: &[String],
        login: Option<&[String]>,
    ) -> io::Result<Allocation> {
        let mut words = vec![
            "salloc".to_string(),
            "--no-shell".into(),
            format!("--job-name={name}"),
            format!("--nodes={}", nodes.len()),
            format!("--nodelist={}", nodes.join(",")),
            format!("--ntasks-per-node={}", per_node.max(1)),
        ];
        words.extend(options.iter().cloned());
        let argv = slurm_argv(&words, login);
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| io::Error::other("no salloc"))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run {program:?}: {e}")))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| io::Error::other("salloc stderr is not piped"))?;
        let mut granted = None;
        let mut said = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let line = line?;
            match line.split_once("Granted job allocation ") {
                Some((_, id)) if granted.is_none() => granted = Some(id.trim().to_string()),
                _ => {
                    eprintln!("{line}");
                    said.push(line);
                }
            }
        }
        let status = child.wait()?;
        match granted {
            Some(id) if status.success() && !id.is_empty() => Ok(Allocation {
                id,
                login: login.map(<[String]>::to_vec),
            }),
            Some(id) => Err(io::Error::other(format!(
                "salloc granted job {id} but then failed ({status})"
            ))),
            None => Err(io::Error::other(format!(
                "salloc did not grant the nodes {} ({status}){}",
                nodes.join(","),
                said.last().map(|l| format!(": {l}")).unwrap_or_default()
            ))),
        }
    }

    /// The Slurm job id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        let argv = slurm_argv(
            &["scancel".to_string(), self.id.clone()],
            self.login.as_deref(),
        );
        if let Some((program, args)) = argv.split_first() {
            let done = Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .status();
            if !done.is_ok_and(|s| s.success()) {
                eprintln!(
                    "metampi: could not cancel Slurm job {}; `scancel {}` ends it",
                    self.id, self.id
                );
            }
        }
    }
}

/// A Slurm command run here, or through ssh on the login node (`login`: options and
/// destination), quoted for the login node's shell.
fn slurm_argv(words: &[String], login: Option<&[String]>) -> Vec<OsString> {
    match login {
        None => words.iter().map(OsString::from).collect(),
        Some(ssh) => command::ssh_argv(ssh, &command::join_quoted(words)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_expand_like_slurm() {
        let e = |s: &str| expand_hostlist(s).unwrap();
        assert_eq!(e("login"), ["login"]);
        assert_eq!(e("n[1-3,7]"), ["n1", "n2", "n3", "n7"]);
        assert_eq!(e("n[08-10],m"), ["n08", "n09", "n10", "m"]);
        assert_eq!(
            e("r[1-2]-n[01-02]"),
            ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]
        );
        assert_eq!(e("a[1],b[2-3]x"), ["a1", "b2x", "b3x"]);
        for bad in [
            "n[1-3", "n]1[", "n[3-1]", "n[a-b]", "a,,b", "n[[1]]", "n[1-]", "",
        ] {
            assert!(expand_hostlist(bad).is_err(), "{bad}");
        }
        assert!(expand_hostlist("n[0-99999999]")
            .unwrap_err()
            .contains("more than"));
        assert!(expand_hostlist("a[0-999]b[0-999]c[0-999]").is_err());
    }

    #[test]
    fn task_counts_expand() {
        assert_eq!(expand_counts("4(x2),1").unwrap(), [4, 4, 1]);
        assert_eq!(expand_counts("8").unwrap(), [8]);
        for bad in ["", "x", "2(x)", "2(x3", "-1", "2(x99999999999)"] {
            assert!(expand_counts(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_allocation_becomes_hosts_started_by_srun() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        let hosts = allocation_hosts(&vars(&[
            ("SLURM_JOB_ID", "42"),
            ("SLURM_JOB_NODELIST", "n[1-2],m"),
            ("SLURM_TASKS_PER_NODE", "4(x2),2"),
        ]))
        .unwrap();
        let got: Vec<(&str, usize)> = hosts.iter().map(|h| (h.name.as_str(), h.slots)).collect();
        assert_eq!(got, [("n1", 4), ("n2", 4), ("m", 2)]);
        let argv = hosts[1]
            .launch
            .as_ref()
            .unwrap()
            .argv(b"echo hi")
            .unwrap()
            .unwrap();
        let argv: Vec<String> = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(argv[0], "srun");
        assert!(argv.contains(&"--jobid=42".into()) && argv.contains(&"--nodelist=n2".into()));
        assert_eq!(argv[argv.len() - 3..], ["sh", "-c", "echo hi"]);

        let one = allocation_hosts(&vars(&[("SLURM_JOB_ID", "7"), ("SLURM_NODELIST", "a,b")]));
        assert_eq!(
            one.unwrap().iter().map(|h| h.slots).collect::<Vec<_>>(),
            [1, 1]
        );
        assert!(allocation_hosts(&vars(&[]))
            .unwrap_err()
            .contains("SLURM_JOB_ID"));
        let short = allocation_hosts(&vars(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NODELIST", "a,b"),
            ("SLURM_TASKS_PER_NODE", "3"),
        ]));
        assert!(short.unwrap_err().contains("counts 1 nodes"));
    }

    #[test]
    fn slurm_commands_on_a_login_node_are_quoted_for_its_shell() {
        let words = ["salloc".to_string(), "--comment=a b".into()];
        let here = slurm_argv(&words, None);
        assert_eq!(here, ["salloc", "--comment=a b"]);
        let there = slurm_argv(&words, Some(&["login".to_string()]));
        assert_eq!(there[0], "ssh");
        assert_eq!(there.last().unwrap(), "salloc '--comment=a b'");
    }
}
