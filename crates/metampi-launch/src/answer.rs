//! A rank's answer to the launcher's `REPORT` (see [`crate::pmi`], "Reports"): one line,
//!
//! ```text
//! STATE <waited> <text>[TAB io <sent> <sent-bytes> <received> <received-bytes>][TAB calls <left-out> <call>;<call>;...]
//! ```
//!
//! `<waited>` and `<text>` are the hang report's: the oldest wait in milliseconds (`-` when
//! no thread waits) and what the rank waits in, free text without control characters. The
//! sections after a tab came later, and a reader skips one it does not know or cannot read:
//! a launcher that reads them takes an answer without them for a rank that does not count,
//! and one that predates them shows them as part of the text.
//!
//! - `io`: messages and bytes the rank's point-to-point and collective traffic has sent and
//!   received since it started (its engine counts them; see `metampi`'s
//!   `engine/traffic.rs`).
//! - `calls`: only in answer to `REPORT CALLS`; `calls off` from a rank that records no
//!   trace, else (`--trace`) the calls it completed since its previous such answer, newest
//!   first, at most [`CALLS_BYTES`] of them (`<left-out>` more were not sent). A call is
//!   `<kind>[:<name>],<peer>,<bytes>,<ended>,<took>`: the kind (`send`, `recv`, `isend`,
//!   `wait`, `collective`, `region`), the name of a collective or region, the peer's world
//!   rank or `-`, the bytes, how many microseconds before the answer it ended, and how many
//!   it took. Times are relative so that the launcher needs no clock of the rank's.
//!
//! The launcher asks `REPORT CALLS` ([`Ask::WaitAndCalls`]) only of a rank whose earlier
//! answer had `io`: a rank that knows only `REPORT` would take the longer line for a reply.

use std::fmt::Write as _;
use std::time::Duration;

/// The most bytes of calls one answer carries, well inside [`crate::MAX_LINE`] next to the
/// text: 200 calls of 80 bytes.
pub const CALLS_BYTES: usize = 16 * 1024;

/// The most characters of a collective's or region's name an answer keeps.
const NAME_CHARS: usize = 48;

/// What the launcher asks a rank for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// `REPORT`: where it waits, and its traffic counters.
    Wait,
    /// `REPORT CALLS`: also the calls it completed since it was last asked so (the live
    /// view's timeline).
    WaitAndCalls,
}

impl Ask {
    /// The line that asks, with its newline.
    pub(crate) fn line(self) -> &'static [u8] {
        match self {
            Ask::Wait => b"REPORT\n",
            Ask::WaitAndCalls => b"REPORT CALLS\n",
        }
    }

    /// A line the launcher wrote (without its newline), if it asks.
    pub(crate) fn parse(line: &str) -> Option<Ask> {
        match line {
            "REPORT" => Some(Ask::Wait),
            "REPORT CALLS" => Some(Ask::WaitAndCalls),
            _ => None,
        }
    }
}

/// What a rank answers to `REPORT`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// How long its oldest current wait has lasted; `None`: no thread of it waits.
    pub waited: Option<Duration>,
    /// What it waits in.
    pub text: String,
    /// Its traffic so far; `None` from a rank that does not count.
    pub traffic: Option<Traffic>,
    /// The calls it completed since it was last asked for them; `None` where it was not
    /// asked (or does not know the question).
    pub calls: Option<RecentCalls>,
}

/// Messages and bytes a rank has sent and received, point-to-point and collective, since
/// it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Messages sent.
    pub sent: u64,
    /// Their bytes.
    pub sent_bytes: u64,
    /// Messages received.
    pub received: u64,
    /// Their bytes.
    pub received_bytes: u64,
}

/// Calls a rank completed since its previous answer with calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecentCalls {
    /// Whether it records its calls at all (`--trace`); without, the rest is empty.
    pub recording: bool,
    /// Newest first.
    pub calls: Vec<CallSpan>,
    /// Calls there were besides, older than these, that the answer left out.
    pub left_out: u64,
}

impl RecentCalls {
    /// What a rank that records no trace says.
    pub fn not_recording() -> RecentCalls {
        RecentCalls {
            recording: false,
            calls: Vec::new(),
            left_out: 0,
        }
    }

    /// What a rank that records says: `calls`, newest first, and how many more it left out.
    pub fn recorded(calls: Vec<CallSpan>, left_out: u64) -> RecentCalls {
        RecentCalls {
            recording: true,
            calls,
            left_out,
        }
    }
}

/// One completed call, timed from the moment the answer was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSpan {
    /// `send`, `recv`, `isend`, `wait`, `collective` or `region`.
    pub kind: String,
    /// A collective's or region's name; empty for the others.
    pub name: String,
    /// The peer's world rank, if the call had one.
    pub peer: Option<u32>,
    /// Bytes it moved.
    pub bytes: u64,
    /// How long before the answer it ended.
    pub ended_ago: Duration,
    /// How long it took.
    pub took: Duration,
}

impl Answer {
    /// The `STATE` line, with its newline. Calls that do not fit in [`CALLS_BYTES`] are left
    /// out (and counted as such).
    pub fn line(&self) -> String {
        let waited = self
            .waited
            .map_or_else(|| "-".into(), |w| w.as_millis().to_string());
        let mut line = format!("STATE {waited} {}", clean(&self.text, usize::MAX, ' '));
        if let Some(t) = &self.traffic {
            let _ = write!(
                line,
                "\tio {} {} {} {}",
                t.sent, t.sent_bytes, t.received, t.received_bytes
            );
        }
        match &self.calls {
            Some(c) if !c.recording => line.push_str("\tcalls off"),
            Some(c) => {
                let mut items = String::new();
                let mut sent = 0;
                for call in &c.calls {
                    let item = call.item();
                    if items.len() + item.len() + 1 > CALLS_BYTES {
                        break;
                    }
                    if !items.is_empty() {
                        items.push(';');
                    }
                    items.push_str(&item);
                    sent += 1;
                }
                let left_out = c.left_out + (c.calls.len() - sent) as u64;
                let _ = write!(line, "\tcalls {left_out} {items}");
            }
            None => {}
        }
        line.push('\n');
        line
    }
}

impl CallSpan {
    fn item(&self) -> String {
        let mut s = clean(&self.kind, NAME_CHARS, '_');
        if !self.name.is_empty() {
            s.push(':');
            s.push_str(&clean(&self.name, NAME_CHARS, '_'));
        }
        let peer = self.peer.map_or_else(|| "-".into(), |p| p.to_string());
        let _ = write!(
            s,
            ",{peer},{},{},{}",
            self.bytes,
            self.ended_ago.as_micros(),
            self.took.as_micros()
        );
        s
    }

    fn parse(item: &str) -> Option<CallSpan> {
        let mut f = item.split(',');
        let (what, peer, bytes, ended, took) =
            (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        if f.next().is_some() {
            return None;
        }
        let (kind, name) = what.split_once(':').unwrap_or((what, ""));
        if kind.is_empty() {
            return None;
        }
        let us = |s: &str| s.parse::<u64>().ok().map(Duration::from_micros);
        Some(CallSpan {
            kind: kind.chars().take(NAME_CHARS).collect(),
            name: name.chars().take(NAME_CHARS).collect(),
            peer: match peer {
                "-" => None,
                p => Some(p.parse().ok()?),
            },
            bytes: bytes.parse().ok()?,
            ended_ago: us(ended)?,
            took: us(took)?,
        })
    }
}

/// Reads the sections that follow the text of a `STATE` line (everything after its first
/// tab; empty when there is none). What does not read is skipped: an `io` section with a
/// field that is not a number counts as none, a call that does not read is left out.
pub(crate) fn read_sections(more: &str) -> (Option<Traffic>, Option<RecentCalls>) {
    let (mut traffic, mut calls) = (None, None);
    for section in more.split('\t') {
        let (name, rest) = section.split_once(' ').unwrap_or((section, ""));
        match name {
            "io" => {
                let n: Vec<u64> = rest.split(' ').map_while(|f| f.parse().ok()).collect();
                if let [sent, sent_bytes, received, received_bytes] = n[..] {
                    traffic = Some(Traffic {
                        sent,
                        sent_bytes,
                        received,
                        received_bytes,
                    });
                }
            }
            "calls" if rest == "off" => calls = Some(RecentCalls::not_recording()),
            "calls" => {
                let (left_out, items) = rest.split_once(' ').unwrap_or((rest, ""));
                let Ok(left_out) = left_out.parse::<u64>() else {
                    continue;
                };
                let mut c = RecentCalls::recorded(Vec::new(), left_out);
                for item in items.split(';').filter(|i| !i.is_empty()) {
                    match CallSpan::parse(item) {
                        Some(call) => c.calls.push(call),
                        None => c.left_out += 1,
                    }
                }
                calls = Some(c);
            }
            _ => {}
        }
    }
    (traffic, calls)
}

/// `s` without control characters (each becomes `with`, as do the separators of the calls
/// section where `with` is not a space), at most `max` characters.
fn clean(s: &str, max: usize, with: char) -> String {
    s.chars()
        .take(max)
        .map(|c| {
            let separator = with != ' ' && matches!(c, ',' | ';' | ':' | ' ');
            if c.is_control() || separator {
                with
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: &str, name: &str, peer: Option<u32>, ago_us: u64) -> CallSpan {
        CallSpan {
            kind: kind.into(),
            name: name.into(),
            peer,
            bytes: 1000,
            ended_ago: Duration::from_micros(ago_us),
            took: Duration::from_micros(17),
        }
    }

    /// The part of a line after its `STATE <waited> <text>`, as the server hands it on.
    fn sections(line: &str) -> (Option<Traffic>, Option<RecentCalls>) {
        let line = line.strip_suffix('\n').unwrap();
        read_sections(line.split_once('\t').map_or("", |(_, more)| more))
    }

    #[test]
    fn answers_read_back_whole() {
        let answer = Answer {
            waited: Some(Duration::from_millis(1500)),
            text: "a receive\tfrom rank 1".into(),
            traffic: Some(Traffic {
                sent: 3,
                sent_bytes: 3000,
                received: 2,
                received_bytes: 8,
            }),
            calls: Some(RecentCalls::recorded(
                vec![
                    call("collective", "allreduce", None, 5),
                    call("send", "", Some(2), 900),
                    call("region", "fft, then; a:b", None, 1_000_000),
                ],
                4,
            )),
        };
        let line = answer.line();
        assert!(line.starts_with("STATE 1500 a receive from rank 1\tio 3 3000 2 8\tcalls 4 "));
        assert_eq!(line.matches('\n').count(), 1);
        let (traffic, calls) = sections(&line);
        assert_eq!(traffic, answer.traffic);
        let calls = calls.unwrap();
        assert_eq!(calls.left_out, 4);
        assert_eq!(calls.calls[..2], answer.calls.as_ref().unwrap().calls[..2]);
        assert_eq!(calls.calls[2].name, "fft__then__a_b");
    }

    #[test]
    fn older_and_damaged_answers_still_read() {
        // A rank that does not count: no sections, nothing to show.
        let plain = Answer {
            waited: None,
            text: "computing".into(),
            ..Answer::default()
        };
        assert_eq!(plain.line(), "STATE - computing\n");
        assert_eq!(sections(&plain.line()), (None, None));
        // Unknown sections are skipped; a bad `io` counts as none; bad calls are left out.
        let (traffic, calls) = read_sections(
            "later 1 2\tio 1 2 x 4\tcalls 0 send,1,8,5,1;send,one,8,5,1;;wait,-,0,3,2",
        );
        assert_eq!(traffic, None);
        let calls = calls.unwrap();
        assert_eq!(calls.left_out, 1);
        assert_eq!(calls.calls.len(), 2);
        assert_eq!(calls.calls[1].peer, None);
        // A tracing rank with nothing new since it was last asked, and one that does not trace.
        let (_, calls) = read_sections("io 0 0 0 0\tcalls 0 ");
        assert_eq!(calls, Some(RecentCalls::recorded(Vec::new(), 0)));
        let off = Answer {
            calls: Some(RecentCalls::not_recording()),
            ..Answer::default()
        };
        assert_eq!(off.line(), "STATE - \tcalls off\n");
        assert_eq!(sections(&off.line()).1, Some(RecentCalls::not_recording()));
    }

    #[test]
    fn calls_past_the_budget_are_left_out_and_counted() {
        let many: Vec<CallSpan> = (0..2000).map(|i| call("recv", "", Some(1), i)).collect();
        let answer = Answer {
            calls: Some(RecentCalls::recorded(many, 7)),
            ..Answer::default()
        };
        let line = answer.line();
        assert!(line.len() < CALLS_BYTES + 100, "{}", line.len());
        let calls = sections(&line).1.unwrap();
        assert!(calls.calls.len() > 100);
        assert_eq!(calls.calls.len() as u64 + calls.left_out, 2007);
        // The newest are the ones kept.
        assert_eq!(calls.calls[0].ended_ago, Duration::ZERO);
    }

    #[test]
    fn asks_are_lines_of_their_own() {
        for ask in [Ask::Wait, Ask::WaitAndCalls] {
            let line = std::str::from_utf8(ask.line()).unwrap();
            assert_eq!(Ask::parse(line.trim_end()), Some(ask));
        }
        assert_eq!(Ask::parse("VAL x"), None);
    }
}
