//! Processes on other machines: how each host's processes are started ([`HostLaunch`]),
//! helpers that start a process there the way ranks are started ([`spawn_remote`]), and the
//! command a user runs by hand on a machine the launcher cannot reach ([`manual_command`]).
//!
//! # The job secret
//! A process started through ssh or a template gets the job secret as the first line of its
//! standard input, never in a command line: `ps` on either machine shows every argument, and
//! `/proc/PID/environ` only to the same user. A command printed for a user to run by hand
//! reads the secret from a file both machines hold ([`SecretSource::File`]) or, when the job
//! has none, carries it as a shell assignment (no process's argument list shows it, but the
//! printed text and the shell's history hold it).

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::command::{self, RemoteStdin};

/// How the processes placed on one [`Host`](crate::Host) are started, when that differs from
/// the job's [`LaunchMethod`](crate::LaunchMethod): a meta job mixes meta hosts started on this
/// machine, through ssh, through a site's own command, and by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostLaunch {
    /// On this machine; the host name only labels the node (`METAMPI_NODE`).
    Local,
    /// `ssh -o BatchMode=yes ARGS... 'sh -c ...'`: `ARGS` are further options and the
    /// destination, e.g. `["-p", "2222", "me@node7"]` (see [`HostLaunch::ssh`]).
    Ssh(Vec<String>),
    /// A command template, split into words like a shell would; `{cmd}` becomes the process's
    /// shell command line (one word) and every `(placeholder, value)` of `vars` is replaced
    /// by its value, e.g. `("{node}", "n3")`.
    Template {
        /// The template as the user wrote it.
        template: String,
        /// Placeholders besides `{cmd}` and their values.
        vars: Vec<(String, String)>,
    },
    /// A one-task Slurm step each (`srun OPTIONS... sh -c CMD`), run here or, with `ssh`
    /// (options and destination of a login node), through ssh there; see [`HostLaunch::srun`].
    Srun {
        /// ssh options and destination of the login node where srun runs; `None`: here.
        ssh: Option<Vec<String>>,
        /// `srun` and its options ([`srun_words`](crate::slurm::srun_words)).
        srun: Vec<String>,
    },
    /// Nobody starts them: the launcher prints one command for the host (see
    /// [`manual_command`]) for the user to run there, and waits for its ranks and helpers to
    /// join. Such a host may have no slots: then only its helpers run there (a meta job's node
    /// with routers but no ranks), and its command is printed before those of hosts with
    /// ranks.
    Manual {
        /// Processes the command starts before the ranks (each prints one line on stdout when
        /// it is ready, and nothing after it); a meta job's routers on that node. The launcher
        /// adds `METAMPI_PMI`, `METAMPI_JOB` and [`HELPER_ENV`](crate::HELPER_ENV) to their
        /// variables: each must join the key-value server as that helper once it runs
        /// ([`PmiClient::helper_from_env`](crate::PmiClient::helper_from_env); the launcher
        /// names those that do not within the join timeout and ends the job when one leaves)
        /// and end when the server says the job is over or its connection closes
        /// ([`PmiClient::wait_for_end`](crate::PmiClient::wait_for_end)).
        helpers: Vec<ManualProcess>,
        /// A file holding the job secret on that machine (`~/` allowed), read by the command
        /// instead of carrying the secret in its text.
        secret_file: Option<String>,
    },
}

impl HostLaunch {
    /// ssh to `dest` (`host`, `user@host`, `host:port`, `user@[v6addr]:port`), or, when
    /// `node` is another machine than `dest`, to `node` with `dest` as the jump host
    /// (`ssh -J dest node`): the way into a cluster whose nodes are reached from its login
    /// node. The user of `dest` is used for `node` too.
    ///
    /// # Errors
    /// A destination or node name that ssh would misread (empty, starting with `-`, blanks or
    /// shell characters, a port that is not a number).
    pub fn ssh(dest: &str, node: Option<&str>) -> Result<HostLaunch, String> {
        let (user, host, port) = split_destination(dest)?;
        let login = |h: &str| match user {
            Some(u) => format!("{u}@{h}"),
            None => h.to_string(),
        };
        match node {
            Some(node) if node != host => {
                check_name(node, "node name")?;
                Ok(HostLaunch::Ssh(vec![
                    "-J".into(),
                    dest.to_string(),
                    login(node),
                ]))
            }
            _ => {
                let mut args = Vec::new();
                if let Some(port) = port {
                    args.extend(["-p".to_string(), port.to_string()]);
                }
                args.push(login(host));
                Ok(HostLaunch::Ssh(args))
            }
        }
    }

    /// A one-task srun step on Slurm node `node` in allocation `job` (`None`: the one in
    /// `SLURM_JOB_ID`), with the user's `extra` srun options, run here or through ssh to
    /// `login` (a destination as for [`HostLaunch::ssh`]).
    ///
    /// # Errors
    /// A node name or login destination that the commands would misread.
    pub fn srun(
        job: Option<&str>,
        node: &str,
        extra: &[String],
        login: Option<&str>,
    ) -> Result<HostLaunch, String> {
        check_name(node, "Slurm node name")?;
        let ssh = login.map(ssh_args).transpose()?;
        Ok(HostLaunch::Srun {
            ssh,
            srun: crate::slurm::srun_words(job, node, extra),
        })
    }

    /// The argv that runs `command_line` (a shell command line) this way; `None` for
    /// [`HostLaunch::Local`] and [`HostLaunch::Manual`], which start nothing through a command.
    ///
    /// # Errors
    /// A template that cannot be split into words or has no `{cmd}`.
    pub fn argv(&self, command_line: &[u8]) -> Result<Option<Vec<OsString>>, String> {
        Ok(match self {
            HostLaunch::Ssh(args) => Some(command::ssh_argv(args, command_line)),
            HostLaunch::Template { template, vars } => Some(command::template_argv(
                &command::parse_template(template)?,
                vars,
                command_line,
            )),
            HostLaunch::Srun { ssh, srun } => {
                Some(command::srun_argv(ssh.as_deref(), srun, command_line))
            }
            HostLaunch::Local | HostLaunch::Manual { .. } => None,
        })
    }
}

/// The ssh options and destination that reach `dest` (`[user@]host[:port]`) directly.
pub(crate) fn ssh_args(dest: &str) -> Result<Vec<String>, String> {
    match HostLaunch::ssh(dest, None)? {
        HostLaunch::Ssh(args) => Ok(args),
        other => Err(format!("ssh destination `{dest}` gave {other:?}")),
    }
}

/// Splits `[user@]host[:port]`; an IPv6 host is written in brackets when a port follows.
fn split_destination(dest: &str) -> Result<(Option<&str>, &str, Option<u16>), String> {
    let (user, rest) = match dest.rsplit_once('@') {
        Some((u, r)) => {
            check_name(u, "user name")?;
            (Some(u), r)
        }
        None => (None, dest),
    };
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let (h, tail) = inner
            .split_once(']')
            .ok_or_else(|| format!("ssh destination `{dest}`: `[` without `]`"))?;
        match tail.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if tail.is_empty() => (h, None),
            None => return Err(format!("ssh destination `{dest}`: junk after `]`")),
        }
    } else {
        match rest.split_once(':') {
            // More than one colon: a bare IPv6 address, no port.
            Some((h, p)) if !p.contains(':') => (h, Some(p)),
            _ => (rest, None),
        }
    };
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("ssh destination `{dest}`: port `{p}` is not a port number"))
        })
        .transpose()?;
    if host.contains(':') {
        // IPv6: ssh takes it bare.
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(format!("ssh destination `{dest}`: bad IPv6 address"));
        }
    } else {
        check_name(host, "host name")?;
    }
    Ok((user, host, port))
}

/// A host, user or node name ssh takes as one word and cannot mistake for an option.
fn check_name(name: &str, what: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a usable {what} for ssh (letters, digits, `.`, `-`, `_`; not starting with `-`)"
        ))
    }
}

/// Starts `program args` on another machine through `launch` (ssh or a template), the way
/// ranks are started there: in `cwd`, with `env` on the command line (except
/// `METAMPI_SECRET`) and `secret` as the first line of its stdin. The child's stdin stays
/// open (in [`Child::stdin`]): the remote side stops the process, SIGTERM then SIGKILL, once
/// it closes, so drop it (or kill the child) to stop the process. Its stdout is piped, its
/// stderr is this process's.
///
/// # Errors
/// `launch` is local or manual, its template is unusable, or spawning fails.
pub fn spawn_remote(
    launch: &HostLaunch,
    cwd: &Path,
    env: &[(OsString, OsString)],
    secret: &str,
    program: &OsStr,
    args: &[OsString],
) -> io::Result<Child> {
    let line = command::remote_line(cwd, env, program, args, RemoteStdin::Watch);
    let argv = launch
        .argv(&line)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "spawn_remote needs an ssh or template launch",
            )
        })?;
    let (exe, rest) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty launch command"))?;
    let mut child = Command::new(exe)
        .args(rest)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    write_secret_line(&mut child, secret);
    Ok(child)
}

/// Writes the secret line a remote command reads first; 65 bytes into a fresh pipe never block.
/// A failure means the command has already exited (ssh could not connect, say): its exit status
/// and its own message on stderr tell why better than the broken pipe would.
pub(crate) fn write_secret_line(child: &mut Child, secret: &str) {
    if let Some(stdin) = child.stdin.as_mut() {
        let _ = stdin.write_all(format!("{secret}\n").as_bytes());
    }
}

/// One process of a command run by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManualProcess {
    /// What it is, for messages (`rank 3`, `router 5`).
    pub name: String,
    /// Its environment, on its command line (`METAMPI_SECRET` is left out: the command sets
    /// it once).
    pub env: Vec<(OsString, OsString)>,
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// Where a command run by hand gets the job secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// The secret itself, set as a shell variable by the command.
    Inline(String),
    /// A file on the machine the command runs on; a leading `~/` means that user's home.
    File(String),
}

/// The one-line shell command a user runs on a machine to start `helpers` and then `ranks`
/// there (in `cwd`, with the secret from `secret`): `( ... )`, a subshell, so that it can be
/// pasted into an interactive POSIX shell (sh, bash, dash, ksh, zsh) without touching that
/// shell's state, or given to `sh -c`.
///
/// Each helper starts in the background and the command waits until it prints its ready
/// line (through a FIFO in a fresh `mktemp -d` directory, whose reader is gone afterwards: a
/// helper writes nothing more on stdout); a helper that exits first stops the command with a
/// message. Then the ranks start in the background with stdin from `/dev/null`; the command
/// waits for all of them. If they all succeeded it then waits for the helpers, which end by
/// themselves when the job is over (the launcher tells them, see
/// [`HostLaunch::Manual`]), since they may still pass on what other machines' ranks send;
/// after a failure it stops them at once. It exits with the last non-zero status among the
/// ranks, else among the helpers (0 if all succeeded); with no ranks, with the helpers'.
/// Ctrl-C, SIGTERM or SIGHUP stop everything it started (background processes of a
/// non-interactive shell ignore SIGINT, so the command forwards it as SIGTERM).
pub fn manual_command(
    cwd: &Path,
    secret: &SecretSource,
    helpers: &[ManualProcess],
    ranks: &[ManualProcess],
) -> String {
    let q = |w: &OsStr| String::from_utf8_lossy(&command::shell_quote(w)).into_owned();
    let mut s = String::from("( cd ");
    s += &q(cwd.as_os_str());
    s += " || exit 1; ";
    match secret {
        SecretSource::Inline(hex) => {
            s += "METAMPI_SECRET=";
            s += &q(OsStr::new(hex));
        }
        SecretSource::File(path) => {
            s += "METAMPI_SECRET=$(cat ";
            s += &match path.strip_prefix("~/") {
                Some(rest) => format!("\"$HOME\"/{}", q(OsStr::new(rest))),
                None => q(OsStr::new(path)),
            };
            s += ") || exit 1";
        }
    }
    s += "; export METAMPI_SECRET; helpers=; ranks=; \
          trap 'kill $helpers $ranks 2>/dev/null; exit 130' INT TERM HUP; ";
    for h in helpers {
        let started = command::env_command_line(&without_secret(&h.env), &h.program, &h.args);
        let failed = q(OsStr::new(&format!(
            "metampi: {} exited before it was ready",
            h.name
        )));
        s += "d=$(mktemp -d) && mkfifo \"$d/ready\" || exit 1; ";
        s += &String::from_utf8_lossy(&started);
        s += " </dev/null >\"$d/ready\" & helpers=\"$helpers $!\"; \
              read -r _ <\"$d/ready\" || { echo ";
        s += &failed;
        s += " >&2; rm -rf \"$d\"; kill $helpers 2>/dev/null; exit 1; }; rm -rf \"$d\"; ";
    }
    for r in ranks {
        let started = command::env_command_line(&without_secret(&r.env), &r.program, &r.args);
        s += &String::from_utf8_lossy(&started);
        s += " </dev/null & ranks=\"$ranks $!\"; ";
    }
    s += "s=0; for p in $ranks; do wait $p || s=$?; done; if [ $s = 0 ]; then \
          for p in $helpers; do wait $p || s=$?; done; else kill $helpers 2>/dev/null; fi; \
          exit $s )";
    s
}

fn without_secret(env: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
    env.iter()
        .filter(|(name, _)| name != command::SECRET_ENV)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read};

    fn args(l: &HostLaunch) -> Vec<String> {
        match l {
            HostLaunch::Ssh(a) => a.clone(),
            other => panic!("not ssh: {other:?}"),
        }
    }

    #[test]
    fn ssh_destinations() {
        let ssh = |d: &str, n: Option<&str>| args(&HostLaunch::ssh(d, n).unwrap());
        assert_eq!(ssh("n1", None), ["n1"]);
        assert_eq!(ssh("me@n1:2222", None), ["-p", "2222", "me@n1"]);
        assert_eq!(ssh("me@n1:2222", Some("n1")), ["-p", "2222", "me@n1"]);
        assert_eq!(ssh("[::1]:22", None), ["-p", "22", "::1"]);
        assert_eq!(ssh("fe80::1", None), ["fe80::1"]);
        // A node behind the login node: ssh jumps through it, as the same user.
        assert_eq!(
            ssh("me@login.example.org:2222", Some("n7")),
            ["-J", "me@login.example.org:2222", "me@n7"]
        );
        let err = |d: &str, n: Option<&str>| HostLaunch::ssh(d, n).unwrap_err();
        assert!(err("-oProxyCommand=x", None).contains("not a usable host name"));
        assert!(err("n1:x", None).contains("not a port number"));
        assert!(err("n1:0", None).contains("not a port number"));
        assert!(err("a b", None).contains("not a usable"));
        assert!(err("me;x@n1", None).contains("user name"));
        assert!(err("login", Some("-x")).contains("node name"));
        assert!(err("[::1", None).contains("without"));
    }

    #[test]
    fn template_argv_substitutes_meta_placeholders() {
        let l = HostLaunch::Template {
            template: "srun -w {node} {cmd}".into(),
            vars: vec![("{node}".into(), "n2".into())],
        };
        assert_eq!(
            l.argv(b"true").unwrap().unwrap(),
            ["srun", "-w", "n2", "true"].map(OsString::from)
        );
        let bad = HostLaunch::Template {
            template: "ssh {node}".into(),
            vars: Vec::new(),
        };
        assert!(bad.argv(b"true").unwrap_err().contains("{cmd}"));
        assert_eq!(HostLaunch::Local.argv(b"true").unwrap(), None);
    }

    #[test]
    fn spawned_remote_process_gets_secret_and_stops_when_stdin_closes() {
        // `sh -c {cmd}` stands in for ssh.
        let launch = HostLaunch::Template {
            template: "sh -c {cmd}".into(),
            vars: Vec::new(),
        };
        let script = "echo \"ready $METAMPI_SECRET $V\"; exec sleep 60";
        let mut child = spawn_remote(
            &launch,
            Path::new("/"),
            &[("V".into(), "x y".into())],
            "k3y",
            OsStr::new("sh"),
            &["-c".into(), script.into()],
        )
        .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready k3y x y\n");
        let t0 = std::time::Instant::now();
        drop(child.stdin.take());
        // Stopped long before the minute, with status 0 since the stop was asked for.
        assert_eq!(child.wait().unwrap().code(), Some(0));
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    }

    fn rank(name: &str, script: &str) -> ManualProcess {
        ManualProcess {
            name: name.into(),
            env: vec![
                ("METAMPI_SECRET".into(), "never-here".into()),
                ("WHO".into(), name.into()),
            ],
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
        }
    }

    fn run_manual(text: &str) -> std::process::Output {
        // A command printed for users must be one line, or pasting it runs half a command.
        assert!(!text.contains('\n'), "{text}");
        std::process::Command::new("sh")
            .arg("-c")
            .arg(text)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    #[test]
    fn manual_command_starts_helpers_first_and_reports_rank_status() {
        let dir = std::env::temp_dir().join(format!("metampi-manual-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key");
        std::fs::write(&key, "abc\n").unwrap();
        // The helper is ready once it has written its mark; the ranks check that it is there.
        // It ends a moment later, as a router does when the launcher says the job is over.
        let helper = ManualProcess {
            name: "router 0".into(),
            env: Vec::new(),
            program: "sh".into(),
            args: vec![
                "-c".into(),
                "touch helper-ran; echo READY; sleep 1; echo helper done >&2".into(),
            ],
        };
        let ok = "test -e helper-ran && echo \"$WHO $METAMPI_SECRET\"";
        let text = manual_command(
            &dir,
            &SecretSource::File(key.display().to_string()),
            std::slice::from_ref(&helper),
            &[rank("rank 0", ok), rank("rank 1", ok)],
        );
        assert!(!text.contains("never-here"), "{text}");
        let out = run_manual(&text);
        assert!(out.status.success(), "{out:?}");
        let mut lines: Vec<_> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        lines.sort();
        assert_eq!(lines, ["rank 0 abc", "rank 1 abc"]);
        // After the ranks succeeded, the command waited for the helper to end by itself.
        assert_eq!(String::from_utf8_lossy(&out.stderr), "helper done\n");

        // Without ranks it waits for its helpers too, and a helper's failure is its status.
        let failing = ManualProcess {
            args: vec!["-c".into(), "echo READY; sleep 1; exit 4".into()],
            ..helper.clone()
        };
        let text = manual_command(
            &dir,
            &SecretSource::Inline("s3".into()),
            &[helper.clone(), failing.clone()],
            &[],
        );
        let out = run_manual(&text);
        assert_eq!(out.status.code(), Some(4), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "helper done\n");

        // After a failing rank, the helpers are stopped at once: the command does not wait
        // the minute this one would sleep.
        let sleeper = ManualProcess {
            args: vec!["-c".into(), "echo READY; exec sleep 60".into()],
            ..helper.clone()
        };
        let t0 = std::time::Instant::now();
        let text = manual_command(
            &dir,
            &SecretSource::Inline("s3".into()),
            &[sleeper],
            &[rank("rank 0", "exit 5")],
        );
        assert_eq!(run_manual(&text).status.code(), Some(5));
        assert!(t0.elapsed() < std::time::Duration::from_secs(30));

        // A failing rank's status is the command's; the secret may also be inline.
        let text = manual_command(
            &dir,
            &SecretSource::Inline("s3".into()),
            &[],
            &[rank("rank 0", "exit 0"), rank("rank 1", "exit 9")],
        );
        assert_eq!(run_manual(&text).status.code(), Some(9));

        // A helper that dies before it is ready stops the command with its name.
        let dead = ManualProcess {
            args: vec!["-c".into(), "exit 3".into()],
            ..helper
        };
        let text = manual_command(
            &dir,
            &SecretSource::Inline("s3".into()),
            &[dead],
            &[rank("rank 0", "echo never")],
        );
        let out = run_manual(&text);
        assert_eq!(out.status.code(), Some(1));
        assert!(out.stdout.is_empty());
        let mut err = String::new();
        out.stderr.as_slice().read_to_string(&mut err).unwrap();
        assert!(err.contains("router 0 exited before it was ready"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
