//! Command lines for ranks started on other machines: shell quoting, the ssh command, and
//! user launch templates.
//!
//! A remote rank's environment cannot be passed through `execve`, so it travels inside the
//! command line as `env VAR=value ... program args`, every word single-quoted where needed so
//! that the remote shell sees exactly the bytes the launcher had. The job secret is the
//! exception: it goes as the first line of the process's standard input ([`remote_line`]), so
//! no command line that `ps` shows on either machine holds it.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use crate::spec::{AppSpec, Start};

/// Quotes one word so that a POSIX shell, csh/tcsh and fish all read it back as the same bytes;
/// words made only of safe characters stay bare so the command stays readable in `ps` and in
/// error messages.
///
/// The outer word of a remote command line is read by the remote user's login shell, which may
/// be csh or fish (see [`remote_line`]), so only what the three read alike is used: single
/// quotes, with `'`, `\` and `!` written outside them as `\'`, `\\` and `\!` (fish takes
/// `\\` and `\'` inside single quotes as escapes; csh expands `!` even there). Not the `shlex`
/// crate: it puts `'` and `\` inside double quotes with `\"` and `\\` escapes, which csh
/// does not honour (decision 0058). A newline inside the word is read by sh and fish, not by
/// csh, which has no quoting of it that sh shares. NUL bytes pass through; `Command::spawn`
/// then refuses the argv with an error.
pub(crate) fn shell_quote(word: &OsStr) -> Vec<u8> {
    let bytes = word.as_bytes();
    let safe = !bytes.is_empty()
        && bytes.iter().all(|&b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'_' | b'-' | b'.' | b'/' | b'=' | b':' | b',' | b'+' | b'@' | b'%'
                )
        });
    if safe {
        return bytes.to_vec();
    }
    let mut out = Vec::with_capacity(bytes.len() + 2);
    out.push(b'\'');
    for &b in bytes {
        match b {
            // Close the quote, write the byte escaped, reopen.
            b'\'' | b'\\' | b'!' => out.extend_from_slice(&[b'\'', b'\\', b, b'\'']),
            _ => out.push(b),
        }
    }
    out.push(b'\'');
    out
}

/// `env VAR=value ... program args`, each word quoted: one shell command line.
pub(crate) fn env_command_line(
    env: &[(OsString, OsString)],
    program: &OsStr,
    args: &[OsString],
) -> Vec<u8> {
    let mut words: Vec<Vec<u8>> = Vec::with_capacity(env.len() + args.len() + 2);
    words.push(b"env".to_vec());
    for (name, value) in env {
        let mut assignment = name.clone();
        assignment.push("=");
        assignment.push(value);
        words.push(shell_quote(&assignment));
    }
    words.push(shell_quote(program));
    words.extend(args.iter().map(|a| shell_quote(a)));
    words.join(&b' ')
}

/// The argv of `ssh -o BatchMode=yes ARGS... COMMAND_LINE`; `args` are the options and the
/// destination (`["node7"]`, `["-p", "2222", "me@node7"]`, `["-J", "login", "node7"]`).
///
/// BatchMode makes a missing key fail at once instead of prompting for a password on a terminal
/// that several ranks share.
pub(crate) fn ssh_argv(args: &[String], command_line: &[u8]) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec!["ssh".into(), "-o".into(), "BatchMode=yes".into()];
    argv.extend(args.iter().map(OsString::from));
    argv.push(OsString::from_vec(command_line.to_vec()));
    argv
}

/// Words quoted for a shell and joined by blanks: one command line.
pub(crate) fn join_quoted(words: &[String]) -> Vec<u8> {
    let quoted: Vec<Vec<u8>> = words.iter().map(|w| shell_quote(OsStr::new(w))).collect();
    quoted.join(&b' ')
}

/// The argv that runs `command_line` (a shell command line) as a one-task srun step: `srun
/// OPTIONS... sh -c COMMAND_LINE`, here, or through ssh on a login node (`ssh`: its options
/// and destination) as one command line for that node's shell.
pub(crate) fn srun_argv(
    ssh: Option<&[String]>,
    srun: &[String],
    command_line: &[u8],
) -> Vec<OsString> {
    let mut argv: Vec<OsString> = srun.iter().map(OsString::from).collect();
    argv.extend([
        "sh".into(),
        "-c".into(),
        OsString::from_vec(command_line.to_vec()),
    ]);
    match ssh {
        None => argv,
        Some(ssh) => {
            let mut line = join_quoted(srun);
            line.extend_from_slice(b" sh -c ");
            line.extend(shell_quote(OsStr::from_bytes(command_line)));
            ssh_argv(ssh, &line)
        }
    }
}

/// The variable the job secret travels in; remote command lines never carry it.
pub(crate) const SECRET_ENV: &str = "METAMPI_SECRET";

/// How a process started on another machine uses its standard input after the secret line.
///
/// Either way the end of stdin means that the launcher is gone or has ended the job (ssh
/// closed), so the process is stopped: SIGTERM, then SIGKILL after two seconds; the command
/// then ends with status 0 and says nothing, since the stop was asked for. Without a
/// terminal, sshd signals nothing to a remote command whose client went away, so this is the
/// only way such a process learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RemoteStdin {
    /// The process reads the launcher's stdin, which comes framed after the secret line
    /// ([`stdin_frames`], then [`STDIN_END`]) so that the end of the data (the process's
    /// stdin closes) is told apart from the end of the connection.
    Forward,
    /// The process gets `/dev/null`.
    Watch,
}

/// Largest frame of forwarded stdin: what the remote side reads with one `dd` block.
pub(crate) const MAX_STDIN_FRAME: usize = 64 * 1024;

/// The frame that ends forwarded stdin (a frame of length 0); the connection stays open.
pub(crate) const STDIN_END: &[u8] = b"0\n";

/// Appends `data` to `out` as frames of forwarded stdin for [`RemoteStdin::Forward`]: its
/// length in decimal and a newline, then the bytes, at most [`MAX_STDIN_FRAME`] at a time.
pub(crate) fn stdin_frames(data: &[u8], out: &mut Vec<u8>) {
    for chunk in data.chunks(MAX_STDIN_FRAME) {
        out.extend_from_slice(format!("{}\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
    }
}

/// The shell command line that runs `program args` with `env` on another machine:
/// `sh -c 'SCRIPT'`. The script reads the job secret from the first line of its standard input
/// (so that it never appears in a command line that `ps` shows, there or here), changes to
/// `cwd`, and runs `env VARS... program args` there.
///
/// The process runs in the background while the script waits for either it to end (its status
/// is the script's) or stdin to close, which stops it (see [`RemoteStdin`]). With
/// [`RemoteStdin::Watch`] the process's stdin is `/dev/null`. With [`RemoteStdin::Forward`] it
/// is a FIFO that a relay fills from the frames on stdin (one `dd` per frame, with
/// `iflag=fullblock` where `dd` has it, else byte by byte: a pipe may return a frame in
/// pieces) and closes at the end frame; the relay then watches stdin for its end like
/// [`RemoteStdin::Watch`]. (A process that stops reading while more input is on its way keeps
/// the relay blocked on the FIFO, and is then stopped only once it ends or writes to the closed
/// connection.) The wrapper is `sh -c` because the remote login shell may be csh or fish, which
/// read neither `&&` lists in this form nor `$!`.
pub(crate) fn remote_line(
    cwd: &Path,
    env: &[(OsString, OsString)],
    program: &OsStr,
    args: &[OsString],
    stdin: RemoteStdin,
) -> Vec<u8> {
    let env: Vec<(OsString, OsString)> = env
        .iter()
        .filter(|(name, _)| name != SECRET_ENV)
        .cloned()
        .collect();
    let command = env_command_line(&env, program, args);
    let mut script = b"trap 'e=1' USR1; IFS= read -r METAMPI_SECRET || { echo 'metampi: no job secret on standard \
input (the launch command must pass stdin on)' >&2; exit 125; }; export METAMPI_SECRET; cd "
        .to_vec();
    script.extend_from_slice(&shell_quote(cwd.as_os_str()));
    script.extend_from_slice(b" || exit 127; ");
    // fd 3 keeps the real stdin for the watcher: an asynchronous list gets /dev/null as its
    // stdin unless redirected explicitly.
    // The watcher tells the wrapper (USR1; `$$` is the wrapper's pid in a subshell too) before
    // it stops the process, so that a stop the launcher asked for ends with status 0 and
    // without the shell's "Terminated", which srun would report as a failed task.
    let stop = b"while read -r _; do :; done; kill -USR1 $$; kill -TERM $p; sleep 2; kill -KILL \
$p; } <&3 >/dev/null 2>&1 & w=$!; exec 3<&- 4>&-; wait $p; s=$?; if [ -n \"$e\" ]; then wait $p \
2>/dev/null; s=0; fi; kill $w 2>/dev/null; exit $s";
    match stdin {
        RemoteStdin::Forward => {
            // The FIFO is opened by both sides before it is removed; the process's end opens
            // first, in the background, so that `$p` is known to the relay.
            script.extend_from_slice(
                b"d=$(mktemp -d) && mkfifo \"$d/i\" || { echo 'metampi: cannot make a FIFO \
for standard input' >&2; exit 125; }; if dd iflag=fullblock count=0 </dev/null 2>/dev/null; \
then c() { dd iflag=fullblock bs=\"$1\" count=1; }; else c() { dd ibs=1 count=\"$1\"; }; fi; ",
            );
            script.extend_from_slice(&command);
            script.extend_from_slice(
                b" <\"$d/i\" & p=$!; exec 3<&0 4>\"$d/i\"; rm -rf \"$d\"; { while IFS= read -r n \
&& [ \"$n\" -gt 0 ]; do c \"$n\" >&4 || break; done; exec 4>&-; ",
            );
        }
        RemoteStdin::Watch => {
            script.extend_from_slice(&command);
            script.extend_from_slice(b" </dev/null & p=$!; exec 3<&0; { ");
        }
    }
    script.extend_from_slice(stop);
    let mut line = b"sh -c ".to_vec();
    line.extend_from_slice(&shell_quote(OsStr::from_bytes(&script)));
    line
}

/// The argv that starts one rank: the program itself, the program under `gdbserver` on a
/// loopback port, or the ssh / template command carrying [`remote_line`] (the rank's whole
/// environment, which `execve` cannot carry to another machine). `None` for a rank started by
/// hand.
pub(crate) fn rank_argv(
    start: &Start,
    debug_port: Option<u16>,
    app: &AppSpec,
    env: &[(OsString, OsString)],
    cwd: &Path,
    stdin: RemoteStdin,
) -> Option<Vec<OsString>> {
    let remote = || remote_line(cwd, env, &app.program, &app.args, stdin);
    match start {
        Start::Local => {
            let mut argv = match debug_port {
                Some(port) => vec![
                    OsString::from("gdbserver"),
                    OsString::from(format!("127.0.0.1:{port}")),
                ],
                None => Vec::new(),
            };
            argv.push(app.program.clone());
            argv.extend(app.args.iter().cloned());
            Some(argv)
        }
        Start::Ssh(args) => Some(ssh_argv(args, &remote())),
        Start::Template { words, vars } => Some(template_argv(words, vars, &remote())),
        Start::Srun { ssh, srun } => Some(srun_argv(ssh.as_deref(), srun, &remote())),
        Start::Manual => None,
    }
}

/// Splits a launch template into words the way a shell would (quotes and backslashes honoured,
/// nothing expanded), and checks it has a `{cmd}` placeholder.
///
/// # Errors
/// An unterminated quote, a trailing backslash, no words, or no `{cmd}`.
pub(crate) fn parse_template(template: &str) -> Result<Vec<String>, String> {
    let words = metampi_config::split_args(template)?;
    if words.is_empty() {
        return Err("it is empty".into());
    }
    if !words.iter().any(|w| w.contains("{cmd}")) {
        return Err("it has no `{cmd}` placeholder for the rank's command".into());
    }
    Ok(words)
}

/// Substitutes `{cmd}` and the placeholders of `vars` (`{host}` for `--launch`; `{node}` and
/// `{host}` for a meta host) in template words.
///
/// `{cmd}` becomes one argv word holding a shell command line, which is what ssh-like tools
/// expect (`ssh {host} {cmd}`, `sh -c {cmd}`). A template that is just `{cmd}` is run as
/// `sh -c CMD`, since a command line is not a program name. Values are inserted as they are,
/// after the template was split into words, so they cannot add words.
pub(crate) fn template_argv(
    words: &[String],
    vars: &[(String, String)],
    command_line: &[u8],
) -> Vec<OsString> {
    if words.len() == 1 && words[0] == "{cmd}" {
        return vec![
            "sh".into(),
            "-c".into(),
            OsString::from_vec(command_line.to_vec()),
        ];
    }
    words
        .iter()
        .map(|word| {
            let mut out = Vec::with_capacity(word.len());
            let mut rest = word.as_bytes();
            'scan: while !rest.is_empty() {
                if let Some(tail) = rest.strip_prefix(b"{cmd}") {
                    out.extend_from_slice(command_line);
                    rest = tail;
                    continue;
                }
                for (name, value) in vars {
                    if let Some(tail) = rest.strip_prefix(name.as_bytes()) {
                        out.extend_from_slice(value.as_bytes());
                        rest = tail;
                        continue 'scan;
                    }
                }
                out.push(rest[0]);
                rest = &rest[1..];
            }
            OsString::from_vec(out)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::process::Command;

    fn q(s: &str) -> String {
        String::from_utf8(shell_quote(OsStr::new(s))).unwrap()
    }

    /// Asks a real shell to split `line` back into words.
    fn sh_words(line: &[u8]) -> Vec<String> {
        let mut script = b"for w in ".to_vec();
        script.extend_from_slice(line);
        script.extend_from_slice(b"; do printf '%s\\0' \"$w\"; done");
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(OsStr::from_bytes(&script))
            .output()
            .unwrap();
        assert!(out.status.success());
        out.stdout
            .split(|&b| b == 0)
            .filter(|w| !w.is_empty())
            .map(|w| String::from_utf8(w.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn quoting_leaves_plain_words_bare() {
        assert_eq!(q("abc"), "abc");
        assert_eq!(q("/usr/bin/prog"), "/usr/bin/prog");
        assert_eq!(q("A=b"), "A=b");
        assert_eq!(q("127.0.0.1:5000"), "127.0.0.1:5000");
    }

    #[test]
    fn quoting_protects_specials() {
        assert_eq!(q(""), "''");
        assert_eq!(q("a b"), "'a b'");
        assert_eq!(q("it's"), "'it'\\''s'");
        assert_eq!(q("$HOME"), "'$HOME'");
        assert_eq!(q("a;rm -rf /"), "'a;rm -rf /'");
        // Outside the quotes, where fish and csh read them as sh does.
        assert_eq!(q("a\\b!"), "'a'\\\\'b'\\!''");
    }

    #[test]
    fn quoted_words_survive_a_real_shell() {
        let nasty = [
            "plain",
            "two words",
            "it's",
            "$HOME `id` $(id)",
            "*",
            "a\nb",
            "\\",
            "\"q\"",
        ];
        let line: Vec<u8> = nasty
            .iter()
            .map(|w| shell_quote(OsStr::new(w)))
            .collect::<Vec<_>>()
            .join(&b' ');
        assert_eq!(sh_words(&line), nasty);
    }

    /// `name` (`bash`, `tcsh`, ...) found in `PATH`, for the tests of login shells besides sh;
    /// a test skips a shell that is not installed, and says so.
    fn installed_shell(name: &str) -> Option<PathBuf> {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join(name))
            .find(|path| path.is_file());
        if found.is_none() {
            eprintln!("{name} is not installed: its case is skipped");
        }
        found
    }

    /// sh always; bash, zsh, tcsh and fish where installed: the login shells a remote line
    /// meets.
    fn login_shells() -> Vec<PathBuf> {
        let mut shells = vec![PathBuf::from("/bin/sh")];
        shells.extend(
            ["bash", "zsh", "tcsh", "fish"]
                .into_iter()
                .filter_map(installed_shell),
        );
        shells
    }

    #[test]
    fn quoted_bytes_survive_every_login_shell() {
        let words: [&[u8]; 12] = [
            b"two words",
            b"it's \"q\" and 'more'",
            b"$HOME `id` $(id) ${x}",
            b"line one\nline two",
            b"not utf-8: \xff\xfe \xc3(",
            b"\\ a\\b a\\\\b a\\'b x\\",
            b"!x ^y {a,b} ~ * ? [a] # ; & | < >",
            b"",
            b"\t tab",
            b"-n",
            b"%s",
            b"caf\xc3\xa9",
        ];
        for shell in login_shells() {
            for word in words {
                // csh has no way to quote a newline that sh reads alike (see shell_quote).
                if word.contains(&b'\n') && shell.ends_with("tcsh") {
                    continue;
                }
                let mut line = b"printf %s ".to_vec();
                line.extend(shell_quote(OsStr::from_bytes(word)));
                let out = Command::new(&shell)
                    .arg("-c")
                    .arg(OsStr::from_bytes(&line))
                    .output()
                    .unwrap();
                assert!(
                    out.status.success() && out.stdout == word,
                    "{}: {:?} came back as {:?} ({})",
                    shell.display(),
                    String::from_utf8_lossy(&line),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }

    #[test]
    fn env_command_line_quotes_each_word() {
        let env = vec![
            (OsString::from("METAMPI_RANK"), OsString::from("3")),
            (OsString::from("MSG"), OsString::from("hello world")),
        ];
        let line = env_command_line(&env, OsStr::new("./prog"), &["-v".into(), "a b".into()]);
        assert_eq!(
            String::from_utf8(line).unwrap(),
            "env METAMPI_RANK=3 'MSG=hello world' ./prog -v 'a b'"
        );
    }

    #[test]
    fn ssh_argv_puts_options_and_destination_before_the_command() {
        let argv = ssh_argv(&["-p".into(), "2222".into(), "me@n7".into()], b"true");
        assert_eq!(
            argv,
            ["ssh", "-o", "BatchMode=yes", "-p", "2222", "me@n7", "true"].map(OsString::from)
        );
    }

    /// Runs a remote command line here with `stdin` as its standard input, which stays open
    /// until the command has ended (as ssh keeps it) unless `close` says to close it at once.
    fn run_remote_line(line: &[u8], stdin: &[u8], close: bool) -> std::process::Output {
        run_remote_line_in(Path::new("/bin/sh"), None, line, stdin, close)
    }

    /// [`run_remote_line`] with `shell` as the login shell and `path` first in `PATH`.
    fn run_remote_line_in(
        shell: &Path,
        path: Option<&Path>,
        line: &[u8],
        stdin: &[u8],
        close: bool,
    ) -> std::process::Output {
        use std::io::{Read, Write};
        let mut cmd = Command::new(shell);
        if let Some(dir) = path {
            let mut paths = vec![dir.to_path_buf()];
            paths.extend(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            ));
            cmd.env("PATH", std::env::join_paths(paths).unwrap());
        }
        let mut child = cmd
            .arg("-c")
            .arg(OsStr::from_bytes(line))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if close {
            input.write_all(stdin).unwrap();
            drop(input);
            return child.wait_with_output().unwrap();
        }
        // Written by another thread, so that output filling its pipe cannot stop the input.
        let stdin = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            input.write_all(&stdin).unwrap();
            input
        });
        let mut stdout = Vec::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_end(&mut stdout)
            .unwrap();
        let mut stderr = Vec::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_end(&mut stderr)
            .unwrap();
        let status = child.wait().unwrap();
        drop(writer.join().unwrap());
        std::process::Output {
            status,
            stdout,
            stderr,
        }
    }

    #[test]
    fn remote_line_takes_the_secret_from_stdin_and_keeps_it_off_the_command_line() {
        let dir = std::env::temp_dir();
        let env = vec![
            (OsString::from("METAMPI_SECRET"), OsString::from("s3cret")),
            (OsString::from("MSG"), OsString::from("it's")),
        ];
        let script = "printf '%s|%s|%s|' \"$METAMPI_SECRET\" \"$MSG\" \"$(pwd)\"; cat";
        let args = ["-c".into(), script.into()];
        let mut framed = b"s3cret\n".to_vec();
        stdin_frames(b"rest\n", &mut framed);
        framed.extend_from_slice(STDIN_END);
        for (mode, input, out) in [
            (RemoteStdin::Forward, &framed[..], "s3cret|it's|DIR|rest\n"),
            (
                RemoteStdin::Watch,
                &b"s3cret\nrest\n"[..],
                "s3cret|it's|DIR|",
            ),
        ] {
            let line = remote_line(&dir, &env, OsStr::new("sh"), &args, mode);
            let text = String::from_utf8(line.clone()).unwrap();
            assert!(text.starts_with("sh -c "), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
            // stdin stays open: the end frame alone ends the process's input.
            let result = run_remote_line(&line, input, false);
            assert!(result.status.success(), "{result:?}");
            let expect = out.replace("DIR", &dir.canonicalize().unwrap().display().to_string());
            assert_eq!(String::from_utf8(result.stdout).unwrap(), expect);
        }
    }

    #[test]
    fn remote_line_reads_the_same_in_every_login_shell() {
        // What the rank gets must not depend on the login shell that reads the line.
        let env = vec![
            (OsString::from("MSG"), OsString::from("it's \"q\" $HOME !x")),
            (OsString::from("B"), OsString::from("a\\b \\' \\")),
        ];
        let args = [
            "-c".into(),
            "printf '%s|%s|%s|' \"$MSG\" \"$B\" \"$1\"; cat".into(),
            "sh".into(),
            OsString::from_vec(b"x \xff y".to_vec()),
        ];
        let mut input = b"k\n".to_vec();
        stdin_frames(b"rest\n", &mut input);
        input.extend_from_slice(STDIN_END);
        let line = remote_line(
            Path::new("/"),
            &env,
            OsStr::new("sh"),
            &args,
            RemoteStdin::Forward,
        );
        for shell in login_shells() {
            let result = run_remote_line_in(&shell, None, &line, &input, false);
            assert!(result.status.success(), "{}: {result:?}", shell.display());
            assert_eq!(
                result.stdout,
                b"it's \"q\" $HOME !x|a\\b \\' \\|x \xff y|rest\n",
                "{}: {}",
                shell.display(),
                String::from_utf8_lossy(&result.stdout)
            );
        }
    }

    #[test]
    fn remote_line_reports_a_missing_secret_and_passes_exit_codes_on() {
        let args = ["-c".into(), "exit 7".into()];
        let line = remote_line(
            Path::new("/"),
            &[],
            OsStr::new("sh"),
            &args,
            RemoteStdin::Watch,
        );
        let result = run_remote_line(&line, b"", true);
        assert_eq!(result.status.code(), Some(125));
        assert!(String::from_utf8_lossy(&result.stderr).contains("no job secret"));
        let result = run_remote_line(&line, b"k\n", false);
        assert_eq!(result.status.code(), Some(7));
    }

    /// `sh -c SCRIPT` inside the remote wrapper with a watched stdin, run here with piped
    /// stdin and stdout (stderr to /dev/null: the shell's own messages are not the test's).
    fn watched_sh(script: &str) -> std::process::Child {
        let args = ["-c".into(), script.into()];
        let line = remote_line(
            Path::new("/"),
            &[],
            OsStr::new("sh"),
            &args,
            RemoteStdin::Watch,
        );
        Command::new("/bin/sh")
            .arg("-c")
            .arg(OsStr::from_bytes(&line))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    #[test]
    fn watched_remote_process_stops_when_stdin_closes() {
        use std::io::{BufRead, Write};
        // The process would sleep for a minute; closing stdin (what a dying ssh does) ends it.
        let mut child = watched_sh("echo started; exec sleep 60");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"k\n").unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert_eq!(first, "started\n");
        let t0 = std::time::Instant::now();
        drop(stdin);
        let status = child.wait().unwrap();
        // Stopped long before the minute, and, since the stop was asked for, with status 0
        // and nothing on stderr.
        assert_eq!(status.code(), Some(0));
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn a_watched_process_killed_by_a_signal_of_its_own_is_reported() {
        // Not a stop the launcher asked for: the shell's 128 + 15 comes back.
        let mut child = watched_sh("kill -TERM $$; sleep 5");
        let mut stdin = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut stdin, b"k\n").unwrap();
        assert_eq!(child.wait().unwrap().code(), Some(143));
    }

    /// A `dd` first in `PATH` that knows no `iflag=`, like some non-GNU ones.
    fn dd_without_iflag() -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("metampi-old-dd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dd = dir.join("dd");
        let real = ["/bin/dd", "/usr/bin/dd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("a dd");
        std::fs::write(
            &dd,
            format!(
                "#!/bin/sh\ncase \"$*\" in *iflag=*) echo 'dd: unknown operand' >&2; exit 1;; esac\n\
                 exec {real} \"$@\"\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&dd, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    #[test]
    fn forwarded_stdin_arrives_byte_for_byte_in_frames_and_ends_with_the_end_frame() {
        // Every byte value, over several frames, one of them longer than a pipe holds.
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect();
        let mut input = b"k\n".to_vec();
        stdin_frames(&data[..3], &mut input);
        stdin_frames(&data[3..], &mut input);
        input.extend_from_slice(STDIN_END);
        let line = remote_line(
            Path::new("/"),
            &[],
            OsStr::new("cat"),
            &[],
            RemoteStdin::Forward,
        );
        let old_dd = dd_without_iflag();
        for path in [None, Some(old_dd.as_path())] {
            let result = run_remote_line_in(Path::new("/bin/sh"), path, &line, &input, false);
            assert!(result.status.success(), "{path:?}: {result:?}");
            assert!(
                result.stdout == data,
                "{path:?}: {} bytes",
                result.stdout.len()
            );
        }
        std::fs::remove_dir_all(old_dd).unwrap();
    }

    #[test]
    fn a_process_reading_forwarded_stdin_stops_when_the_connection_ends() {
        use std::io::{BufRead, Write};
        // It reads one line and would then sleep for a minute, with its input ended (the end
        // frame came) or not yet: either way the end of the connection ends it.
        let args = ["-c".into(), "read l; echo \"got $l\"; exec sleep 60".into()];
        let line = remote_line(
            Path::new("/"),
            &[],
            OsStr::new("sh"),
            &args,
            RemoteStdin::Forward,
        );
        for end_of_data in [false, true] {
            let mut child = Command::new("/bin/sh")
                .arg("-c")
                .arg(OsStr::from_bytes(&line))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut input = b"k\n".to_vec();
            stdin_frames(b"hello\n", &mut input);
            if end_of_data {
                input.extend_from_slice(STDIN_END);
            }
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(&input).unwrap();
            let mut first = String::new();
            std::io::BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut first)
                .unwrap();
            assert_eq!(first, "got hello\n");
            let t0 = std::time::Instant::now();
            drop(stdin);
            let status = child.wait().unwrap();
            assert_eq!(status.code(), Some(0), "end of data: {end_of_data}");
            assert!(t0.elapsed() < std::time::Duration::from_secs(10));
        }
    }

    #[test]
    fn rank_argv_for_each_way_of_starting() {
        let app = AppSpec::new(1, "prog").args(["a b"]);
        let env = vec![(OsString::from("METAMPI_RANK"), OsString::from("0"))];
        let cwd = Path::new("/w");
        let remote = remote_line(
            cwd,
            &env,
            OsStr::new("prog"),
            &["a b".into()],
            RemoteStdin::Forward,
        );
        let remote = String::from_utf8(remote).unwrap();
        let argv = |start: Start, port: Option<u16>| {
            rank_argv(&start, port, &app, &env, cwd, RemoteStdin::Forward).map(|argv| {
                argv.into_iter()
                    .map(|w| w.into_string().unwrap())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(argv(Start::Local, None).unwrap(), ["prog", "a b"]);
        assert_eq!(
            argv(Start::Local, Some(4711)).unwrap(),
            ["gdbserver", "127.0.0.1:4711", "prog", "a b"]
        );
        assert_eq!(
            argv(Start::Ssh(vec!["n1".into()]), None).unwrap(),
            ["ssh", "-o", "BatchMode=yes", "n1", remote.as_str()]
        );
        assert!(
            remote.contains("cd /w ||")
                && remote.contains("env METAMPI_RANK=0 prog ")
                && remote.contains("<\"$d/i\" & p=$'\\!'"),
            "{remote}"
        );
        let words = parse_template("rsh {host} {cmd}").unwrap();
        let vars = vec![("{host}".to_string(), "n2".to_string())];
        assert_eq!(
            argv(Start::Template { words, vars }, None).unwrap(),
            ["rsh", "n2", remote.as_str()]
        );
        assert_eq!(argv(Start::Manual, None), None);
    }

    #[test]
    fn template_splitting() {
        assert_eq!(
            parse_template("ssh {host} {cmd}").unwrap(),
            ["ssh", "{host}", "{cmd}"]
        );
        assert_eq!(
            parse_template(r#"ssh -o 'Opt=a b' "x\"y" {cmd}"#).unwrap(),
            ["ssh", "-o", "Opt=a b", "x\"y", "{cmd}"]
        );
        assert!(parse_template("ssh {host}").unwrap_err().contains("{cmd}"));
        assert!(parse_template("ssh '{cmd}")
            .unwrap_err()
            .contains("unterminated"));
        assert!(parse_template("   ").is_err());
        assert!(parse_template("{cmd} \\")
            .unwrap_err()
            .contains("backslash"));
    }

    #[test]
    fn template_substitution_keeps_cmd_one_word() {
        let line = env_command_line(&[], OsStr::new("prog"), &["a b".into()]);
        let host_n1 = vec![("{host}".to_string(), "n1".to_string())];
        let words = parse_template("ssh -p 2222 user@{host} {cmd}").unwrap();
        assert_eq!(
            template_argv(&words, &host_n1, &line),
            ["ssh", "-p", "2222", "user@n1", "env prog 'a b'"].map(OsString::from)
        );
        let words = parse_template("{cmd}").unwrap();
        assert_eq!(
            template_argv(&words, &host_n1, &line),
            ["sh", "-c", "env prog 'a b'"].map(OsString::from)
        );
    }

    #[test]
    fn template_cmd_runs_through_a_shell() {
        let env = vec![(OsString::from("V"), OsString::from("it's here"))];
        let line = env_command_line(
            &env,
            OsStr::new("sh"),
            &["-c".into(), "printf %s \"$V\"".into()],
        );
        let argv = template_argv(&parse_template("sh -c {cmd}").unwrap(), &[], &line);
        let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "it's here");
    }

    #[test]
    fn meta_placeholders_are_substituted_inside_words() {
        let words = parse_template("srun -w {node} --job-name=mpi-{host} {cmd}").unwrap();
        let vars = vec![
            ("{node}".to_string(), "n3".to_string()),
            ("{host}".to_string(), "beta".to_string()),
        ];
        assert_eq!(
            template_argv(&words, &vars, b"true"),
            ["srun", "-w", "n3", "--job-name=mpi-beta", "true"].map(OsString::from)
        );
    }
}
