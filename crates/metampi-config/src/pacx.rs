//! PACX-MPI hostfiles (Resch et al., "Clustering T3Es for Metacomputing Applications"):
//!
//! ```text
//! #machine number of nodes protocol start-up command
//! host1 100 tcp
//! host2 100 tcp (rsh host2 mpirun -np 102 ./exename)
//! ```
//!
//! Each line is one meta host: its name, its number of application processes, the protocol
//! between machines (only `tcp`), and optionally the command that starts it. The lines
//! become the same syntax tree as a MetaMPICH file with a `NUMHOSTS` header, single-node
//! meta hosts and `AUTO_ROUTER`, so both formats share one resolver.

use crate::error::{ErrorKind, Pos};
use crate::parser::{Ast, HostDecl, NumHosts, ProcCount};

/// Parses a PACX-MPI hostfile into a syntax tree.
pub(crate) fn parse(text: &str) -> Result<Ast, (Pos, ErrorKind)> {
    let mut hosts = Vec::new();
    let mut last_line = 1u32;
    for (i, line) in text.lines().enumerate() {
        let lineno = u32::try_from(i + 1).unwrap_or(u32::MAX);
        last_line = lineno;
        if let Some(decl) = parse_line(line, lineno)? {
            hosts.push(decl);
        }
    }
    let Some(first) = hosts.first() else {
        return Err((
            Pos::new(last_line, 1),
            ErrorKind::HostCount(
                "no hosts: expected lines of the form 'host nodes protocol (startup command)'"
                    .into(),
            ),
        ));
    };
    let first_pos = first.pos;
    Ok(Ast {
        numhosts: Some(NumHosts {
            pos: first_pos,
            hosts,
        }),
        auto_router: Some((first_pos, None)),
        eof: Pos::new(last_line, 1),
        ..Ast::default()
    })
}

/// A cursor over one line that knows the column (in characters) of each byte offset.
struct Line<'a> {
    text: &'a str,
    line: u32,
    at: usize,
}

impl Line<'_> {
    fn pos(&self) -> Pos {
        let col = self.text.get(..self.at).map_or(0, |s| s.chars().count());
        Pos::new(self.line, u32::try_from(col + 1).unwrap_or(u32::MAX))
    }

    fn rest(&self) -> &str {
        self.text.get(self.at..).unwrap_or("")
    }

    fn skip_blanks(&mut self) {
        let r = self.rest();
        self.at += r.len() - r.trim_start().len();
    }

    /// True at end of line or at a comment.
    fn at_end(&self) -> bool {
        let r = self.rest();
        r.is_empty() || r.starts_with('#')
    }

    fn word(&mut self) -> &str {
        let r = self.rest();
        let n = r
            .find(|c: char| c.is_whitespace() || c == '(' || c == '#')
            .unwrap_or(r.len());
        let start = self.at;
        self.at += n;
        self.text.get(start..self.at).unwrap_or("")
    }

    fn found(&self) -> String {
        match self.rest().chars().next() {
            None => "end of line".into(),
            Some('#') => "a comment".into(),
            Some(_) => {
                let w: String = self
                    .rest()
                    .chars()
                    .take_while(|c| !c.is_whitespace())
                    .take(40)
                    .collect();
                format!("'{w}'")
            }
        }
    }
}

fn parse_line(text: &str, line: u32) -> Result<Option<HostDecl>, (Pos, ErrorKind)> {
    let mut l = Line { text, line, at: 0 };
    l.skip_blanks();
    if l.at_end() {
        return Ok(None);
    }
    let expected = |l: &Line<'_>, what: &str| {
        (
            l.pos(),
            ErrorKind::Expected {
                expected: what.to_owned(),
                found: l.found(),
            },
        )
    };

    let pos = l.pos();
    if l.rest().starts_with('(') {
        return Err(expected(&l, "a host name at the start of the line"));
    }
    let name = l.word().to_owned();
    if !name
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err((
            pos,
            ErrorKind::BadValue {
                key: "host".into(),
                value: name,
                expected: "a host name (letters, digits, '-', '.', '_')".into(),
            },
        ));
    }

    l.skip_blanks();
    let nprocs_pos = l.pos();
    if l.at_end() || l.rest().starts_with('(') {
        return Err(expected(
            &l,
            "the number of application nodes after the host name",
        ));
    }
    let nodes = l.word().to_owned();
    let n = match nodes.parse::<u64>() {
        Ok(n) if n > 0 => n,
        _ => {
            return Err((
                nprocs_pos,
                ErrorKind::BadValue {
                    key: "number of nodes".into(),
                    value: nodes,
                    expected: "a positive whole number".into(),
                },
            ))
        }
    };

    l.skip_blanks();
    let proto_pos = l.pos();
    if l.at_end() || l.rest().starts_with('(') {
        return Err(expected(&l, "the protocol (tcp) after the number of nodes"));
    }
    let proto = l.word().to_owned();
    if !proto.eq_ignore_ascii_case("tcp") {
        return Err((
            proto_pos,
            ErrorKind::BadValue {
                key: "protocol".into(),
                value: proto,
                expected: "tcp".into(),
            },
        ));
    }

    l.skip_blanks();
    let mut startup = None;
    if l.rest().starts_with('(') {
        let open = l.pos();
        // The command runs to the last ')' on the line, so it may contain parentheses.
        let r = l.rest();
        let Some(close) = r.rfind(')') else {
            return Err((
                open,
                ErrorKind::Expected {
                    expected: "')' to close the startup command on the same line".into(),
                    found: "end of line".into(),
                },
            ));
        };
        let cmd = r.get(1..close).unwrap_or("").trim().to_owned();
        if cmd.is_empty() {
            return Err((
                open,
                ErrorKind::Expected {
                    expected: "a startup command inside ( )".into(),
                    found: "'()'".into(),
                },
            ));
        }
        l.at += close + 1;
        startup = Some(cmd);
        l.skip_blanks();
    }
    if !l.at_end() {
        return Err(expected(&l, "'(startup command)' or end of line"));
    }
    Ok(Some(HostDecl {
        name,
        pos,
        nprocs: ProcCount::N(n),
        nprocs_pos,
        args: None,
        pacx_startup: Some(startup),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_hostfile() {
        let ast = parse(
            "#machine number of nodes protocol start-up command\nhost1 100 tcp\nhost2 100 tcp (rsh host2 mpirun -np 102 ./exename)\n",
        )
        .expect("parses");
        let hosts = &ast.numhosts.as_ref().expect("hosts").hosts;
        assert_eq!(hosts.len(), 2);
        assert_eq!(
            hosts[1].pacx_startup,
            Some(Some("rsh host2 mpirun -np 102 ./exename".into()))
        );
        assert_eq!(hosts[0].pacx_startup, Some(None));
    }

    #[test]
    fn errors() {
        let e = |s: &str| parse(s).expect_err("fails");
        assert_eq!(e("h 0 tcp").0, Pos::new(1, 3));
        assert_eq!(e("h 4 udp").0, Pos::new(1, 5));
        assert_eq!(e("h 4 tcp (rsh x").0, Pos::new(1, 9));
        assert_eq!(e("h 4 tcp (x) y").0, Pos::new(1, 13));
        assert_eq!(e("h").0, Pos::new(1, 2));
        assert_eq!(e("# only a comment\n").0, Pos::new(1, 1));
    }
}
