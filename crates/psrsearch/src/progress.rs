//! Progress of long runs on stderr: an `indicatif` bar when stderr is a terminal, else a
//! plain line now and then and the last one, never a `\r`, so that a redirected log reads
//! as lines (decision 0055).
//!
//! [`Progress`] counts one task (`searching` blocks); [`Phases`] follows the distributed
//! root's reports, one bar or run of lines per phase.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Least time between two plain lines: a log of a long run gets a line every few seconds to
/// show it is alive, not one per block.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// The bar's layout. Fixed widths keep consecutive phases aligned under each other.
/// `wide_msg` is cut to the terminal's width, so a long list of hosts never wraps.
const TEMPLATE: &str = "{prefix:>13} [{bar:30}] {pos:>4}/{len:<4} {elapsed:>3} {wide_msg}";

/// One counted task, shown until [`Progress::finish`] (or drop).
pub struct Progress {
    label: String,
    unit: &'static str,
    view: View,
}

enum View {
    /// Made by the first report, which brings the total (a bar drawn before would show 0/0).
    Bar(Option<ProgressBar>, fn() -> ProgressDrawTarget),
    Lines(Lines),
    Closed,
}

/// Plain lines: the first report, then at most one per `every`, and the last one.
struct Lines {
    out: Box<dyn Write + Send>,
    every: Duration,
    last: Option<Instant>,
    /// The newest report not written yet: written when the task ends, so a log always shows
    /// where it ended.
    pending: Option<String>,
}

impl Progress {
    /// A task called `label` counting `unit`s (`blocks`; empty for none), drawn on stderr.
    pub fn new(label: &str, unit: &'static str) -> Progress {
        let view = if std::io::stderr().is_terminal() {
            View::Bar(None, ProgressDrawTarget::stderr)
        } else {
            View::Lines(Lines {
                out: Box::new(std::io::stderr()),
                every: LINE_EVERY,
                last: None,
                pending: None,
            })
        };
        Progress {
            label: label.to_string(),
            unit,
            view,
        }
    }

    /// `done` of `total`, with `detail` after the count (may be empty).
    pub fn update(&mut self, done: u64, total: u64, detail: &str) {
        match &mut self.view {
            View::Bar(shown, target) => {
                let b = shown.get_or_insert_with(|| bar(&self.label, total, target()));
                b.set_length(total);
                b.set_position(done);
                b.set_message(join(self.unit, detail));
            }
            View::Lines(l) => {
                let pct = (100 * done.min(total)).checked_div(total).unwrap_or(100);
                let mut line = format!("{}: {done}/{total}", self.label);
                if !self.unit.is_empty() {
                    line.push(' ');
                    line.push_str(self.unit);
                }
                line.push_str(&format!(" ({pct}%)"));
                if !detail.is_empty() {
                    line.push(' ');
                    line.push_str(detail);
                }
                let due = l.last.is_none_or(|t| t.elapsed() >= l.every);
                if due || done >= total {
                    l.write(&line);
                } else {
                    l.pending = Some(line);
                }
            }
            View::Closed => {}
        }
    }

    /// Leaves the bar drawn in its final state, or writes the last line not yet written.
    pub fn finish(mut self) {
        self.close();
    }

    fn close(&mut self) {
        match std::mem::replace(&mut self.view, View::Closed) {
            // `abandon` keeps the count where it is; `finish` would fill the bar, and a phase
            // the root leaves early would read as complete.
            View::Bar(Some(b), _) => b.abandon(),
            View::Bar(None, _) => {}
            View::Lines(mut l) => {
                if let Some(line) = l.pending.take() {
                    l.write(&line);
                }
            }
            View::Closed => {}
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.close();
    }
}

impl Lines {
    fn write(&mut self, line: &str) {
        self.pending = None;
        self.last = Some(Instant::now());
        // Progress is a courtesy: a closed stderr must not fail the search.
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
    }
}

fn bar(label: &str, total: u64, target: ProgressDrawTarget) -> ProgressBar {
    // The template is a constant that parses; the default style would only look plainer.
    let style = ProgressStyle::with_template(TEMPLATE)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#>.");
    ProgressBar::with_draw_target(Some(total), target)
        .with_style(style)
        .with_prefix(label.to_string())
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a} {b}"),
    }
}

/// A task of several phases (the distributed root's `calibrating`, `pilot`,
/// `dedispersing`, ...): each phase is its own [`Progress`], finished when the next starts.
pub struct Phases {
    current: Option<(String, Progress)>,
    start: fn(&str) -> Progress,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            current: None,
            start: |phase| Progress::new(phase, ""),
        }
    }
}

impl Phases {
    /// A report of `phase`: `done` of `total`, with `detail`.
    pub fn update(&mut self, phase: &str, done: u64, total: u64, detail: &str) {
        if self.current.as_ref().is_none_or(|(p, _)| p != phase) {
            // Replacing the previous phase drops it, which leaves its bar drawn or writes its
            // last line, before the new phase shows anything.
            self.current = None;
            self.current = Some((phase.to_string(), (self.start)(phase)));
        }
        if let Some((_, p)) = &mut self.current {
            p.update(done, total, detail);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn lines(label: &str, unit: &'static str, out: &Shared, every: Duration) -> Progress {
        Progress {
            label: label.to_string(),
            unit,
            view: View::Lines(Lines {
                out: Box::new(out.clone()),
                every,
                last: None,
                pending: None,
            }),
        }
    }

    #[test]
    fn plain_lines_are_the_first_the_due_and_the_last() {
        let out = Shared::default();
        let mut p = lines("searching", "blocks", &out, Duration::from_secs(3600));
        for done in 1..=10 {
            p.update(done, 10, "");
        }
        p.finish();
        assert_eq!(
            out.text(),
            "searching: 1/10 blocks (10%)\nsearching: 10/10 blocks (100%)\n"
        );

        // With no wait between lines, every report is written.
        let out = Shared::default();
        let mut p = lines("x", "", &out, Duration::ZERO);
        p.update(1, 3, "a=1/2");
        p.update(2, 3, "");
        drop(p);
        assert_eq!(out.text(), "x: 1/3 (33%) a=1/2\nx: 2/3 (66%)\n");
    }

    #[test]
    fn a_task_that_stops_short_still_logs_where_it_stopped() {
        let out = Shared::default();
        let mut p = lines("pilot", "", &out, Duration::from_secs(3600));
        p.update(0, 42, "");
        p.update(7, 42, "0.31 s");
        drop(p);
        assert_eq!(out.text(), "pilot: 0/42 (0%)\npilot: 7/42 (16%) 0.31 s\n");
        assert!(!out.text().contains('\r'));
    }

    static PHASE_LOG: Mutex<Option<Shared>> = Mutex::new(None);

    #[test]
    fn each_phase_ends_with_its_last_line_before_the_next_begins() {
        let out = Shared::default();
        *PHASE_LOG.lock().unwrap() = Some(out.clone());
        let mut phases = Phases {
            current: None,
            start: |phase| {
                let out = PHASE_LOG.lock().unwrap().clone().unwrap();
                lines(phase, "", &out, Duration::from_secs(3600))
            },
        };
        phases.update("calibrating", 0, 169, "");
        phases.update("calibrating", 5, 169, "");
        phases.update("dedispersing", 1, 2, "0.10 s a=1/1");
        phases.update("dedispersing", 2, 2, "0.20 s a=1/1");
        drop(phases);
        assert_eq!(
            out.text(),
            "calibrating: 0/169 (0%)\ncalibrating: 5/169 (2%)\n\
             dedispersing: 1/2 (50%) 0.10 s a=1/1\ndedispersing: 2/2 (100%) 0.20 s a=1/1\n"
        );
    }

    #[test]
    fn a_bar_takes_reports_and_finishes() {
        let mut p = Progress {
            label: "searching".into(),
            unit: "blocks",
            view: View::Bar(None, ProgressDrawTarget::hidden),
        };
        p.update(3, 8, "");
        let View::Bar(Some(b), _) = &p.view else {
            panic!("the first report makes the bar")
        };
        assert_eq!((b.position(), b.length()), (3, Some(8)));
        assert_eq!(b.message(), "blocks");
        p.finish();
    }
}
