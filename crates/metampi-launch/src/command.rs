//! Command lines for ranks started on other machines: POSIX shell quoting, the ssh command, and
//! user launch templates.
//!
//! A remote rank's environment cannot be passed through `execve`, so it travels inside the
//! command line as `env VAR=value ... program args`, every word single-quoted where needed so
//! that the remote shell sees exactly the bytes the launcher had.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use crate::spec::{AppSpec, Start};

/// Quotes one word for a POSIX shell; words made only of safe characters stay bare so the
/// command stays readable in `ps` and in error messages.
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
        if b == b'\'' {
            // Close the quote, emit an escaped quote, reopen: the only way to get `'` inside
            // single quotes.
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
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

/// The argv of `ssh -o BatchMode=yes HOST 'cd CWD && env ... program args'`.
///
/// BatchMode makes a missing key fail at once instead of prompting for a password on a terminal
/// that several ranks share.
pub(crate) fn ssh_argv(host: &str, cwd: &Path, command_line: &[u8]) -> Vec<OsString> {
    let mut remote = b"cd ".to_vec();
    remote.extend_from_slice(&shell_quote(cwd.as_os_str()));
    remote.extend_from_slice(b" && ");
    remote.extend_from_slice(command_line);
    vec![
        "ssh".into(),
        "-o".into(),
        "BatchMode=yes".into(),
        host.into(),
        OsString::from_vec(remote),
    ]
}

/// The argv that starts one rank: the program itself, the program under `gdbserver` on a
/// loopback port, or the ssh / template command carrying `env` (the rank's whole environment,
/// which `execve` cannot carry to another machine).
pub(crate) fn rank_argv(
    start: &Start,
    debug_port: Option<u16>,
    app: &AppSpec,
    env: &[(OsString, OsString)],
    cwd: &Path,
    template: &[String],
) -> Vec<OsString> {
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
            argv
        }
        Start::Ssh { host } => ssh_argv(host, cwd, &env_command_line(env, &app.program, &app.args)),
        Start::Template { host } => template_argv(
            template,
            host,
            &env_command_line(env, &app.program, &app.args),
        ),
    }
}

/// Splits a launch template into words the way a shell would (quotes and backslashes honoured,
/// nothing expanded), and checks it has a `{cmd}` placeholder.
///
/// # Errors
/// An unterminated quote, a trailing backslash, no words, or no `{cmd}`.
pub(crate) fn parse_template(template: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = template.chars();
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
                None => return Err("trailing backslash".into()),
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
    if words.is_empty() {
        return Err("it is empty".into());
    }
    if !words.iter().any(|w| w.contains("{cmd}")) {
        return Err("it has no `{cmd}` placeholder for the rank's command".into());
    }
    Ok(words)
}

/// Substitutes `{host}` and `{cmd}` in template words.
///
/// `{cmd}` becomes one argv word holding a shell command line, which is what ssh-like tools
/// expect (`ssh {host} {cmd}`, `sh -c {cmd}`). A template that is just `{cmd}` is run as
/// `sh -c CMD`, since a command line is not a program name.
pub(crate) fn template_argv(words: &[String], host: &str, command_line: &[u8]) -> Vec<OsString> {
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
            while !rest.is_empty() {
                if let Some(tail) = rest.strip_prefix(b"{host}") {
                    out.extend_from_slice(host.as_bytes());
                    rest = tail;
                } else if let Some(tail) = rest.strip_prefix(b"{cmd}") {
                    out.extend_from_slice(command_line);
                    rest = tail;
                } else {
                    out.push(rest[0]);
                    rest = &rest[1..];
                }
            }
            OsString::from_vec(out)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn ssh_command_changes_directory_then_runs() {
        let line = env_command_line(&[], OsStr::new("prog"), &["x y".into()]);
        let argv = ssh_argv("node7", Path::new("/home/me/my dir"), &line);
        assert_eq!(
            argv,
            [
                "ssh",
                "-o",
                "BatchMode=yes",
                "node7",
                "cd '/home/me/my dir' && env prog 'x y'"
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn rank_argv_for_each_way_of_starting() {
        let app = AppSpec::new(1, "prog").args(["a b"]);
        let env = vec![(OsString::from("METAMPI_RANK"), OsString::from("0"))];
        let cwd = Path::new("/w");
        let argv = |start: Start, port: Option<u16>, template: &[String]| {
            rank_argv(&start, port, &app, &env, cwd, template)
                .into_iter()
                .map(|w| w.into_string().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(argv(Start::Local, None, &[]), ["prog", "a b"]);
        assert_eq!(
            argv(Start::Local, Some(4711), &[]),
            ["gdbserver", "127.0.0.1:4711", "prog", "a b"]
        );
        assert_eq!(
            argv(Start::Ssh { host: "n1".into() }, None, &[]),
            [
                "ssh",
                "-o",
                "BatchMode=yes",
                "n1",
                "cd /w && env METAMPI_RANK=0 prog 'a b'"
            ]
        );
        let words = parse_template("rsh {host} {cmd}").unwrap();
        assert_eq!(
            argv(Start::Template { host: "n2".into() }, None, &words),
            ["rsh", "n2", "env METAMPI_RANK=0 prog 'a b'"]
        );
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
        let words = parse_template("ssh -p 2222 user@{host} {cmd}").unwrap();
        assert_eq!(
            template_argv(&words, "n1", &line),
            ["ssh", "-p", "2222", "user@n1", "env prog 'a b'"].map(OsString::from)
        );
        let words = parse_template("{cmd}").unwrap();
        assert_eq!(
            template_argv(&words, "n1", &line),
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
        let argv = template_argv(&parse_template("sh -c {cmd}").unwrap(), "h", &line);
        let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "it's here");
    }
}
