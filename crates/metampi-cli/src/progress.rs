//! A one-line progress display on a terminal, for waits a person sits
//! through (bench sweeps, trace merging).
//!
//! Hand-written rather than `indicatif`: one line redrawn with `\r` and
//! "erase to end of line" is all that is needed, and it has to work from a
//! rank whose stderr is a pipe to the launcher (it then writes to the
//! controlling terminal, see [`Progress::for_rank`]). Nothing is drawn when
//! the output is not a terminal, so logs and `--json`/`--csv` files never see
//! it.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Set by `metampi bench` for the ranks it launches when its own stderr is a
/// terminal: rank output goes through pipes, so a rank cannot tell by itself.
pub const PROGRESS_ENV: &str = "METAMPI_PROGRESS";

/// Redraws at most this often.
const EVERY: Duration = Duration::from_millis(100);

/// A progress line; drawing is a no-op when there is no terminal.
pub struct Progress {
    out: Option<Box<dyn Write + Send>>,
    label: String,
    total: u64,
    last: Option<Instant>,
    shown: bool,
}

impl Progress {
    /// Draws on this process's stderr if it is a terminal.
    pub fn for_stderr(label: &str, total: u64) -> Progress {
        let out: Option<Box<dyn Write + Send>> = if std::io::stderr().is_terminal() {
            Some(Box::new(std::io::stderr()))
        } else {
            None
        };
        Progress::with(out, label, total)
    }

    /// Draws on the controlling terminal when the launcher said its stderr
    /// is one ([`PROGRESS_ENV`]) or this rank's stderr is one itself.
    pub fn for_rank(label: &str, total: u64) -> Progress {
        if std::io::stderr().is_terminal() {
            return Progress::for_stderr(label, total);
        }
        let out: Option<Box<dyn Write + Send>> = std::env::var_os(PROGRESS_ENV)
            .filter(|v| v == "1")
            .and_then(|_| File::options().write(true).open("/dev/tty").ok())
            .map(|f| Box::new(f) as Box<dyn Write + Send>);
        Progress::with(out, label, total)
    }

    fn with(out: Option<Box<dyn Write + Send>>, label: &str, total: u64) -> Progress {
        Progress {
            out,
            label: label.to_string(),
            total,
            last: None,
            shown: false,
        }
    }

    /// Whether anything is drawn at all.
    pub fn active(&self) -> bool {
        self.out.is_some()
    }

    /// Shows `done` of the total and `what` (throttled; `force` draws now).
    pub fn update(&mut self, done: u64, what: &str, force: bool) {
        let Some(out) = self.out.as_mut() else { return };
        let now = Instant::now();
        if !force && self.last.is_some_and(|t| now.duration_since(t) < EVERY) {
            return;
        }
        self.last = Some(now);
        let pct = (100 * done.min(self.total))
            .checked_div(self.total)
            .unwrap_or(0);
        let _ = write!(
            out,
            "\r\x1b[K{}: {done}/{} ({pct}%) {what}",
            self.label, self.total
        );
        let _ = out.flush();
        self.shown = true;
    }

    /// Erases the line (before other output goes to the same terminal).
    pub fn clear(&mut self) {
        if let (Some(out), true) = (self.out.as_mut(), self.shown) {
            let _ = write!(out, "\r\x1b[K");
            let _ = out.flush();
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
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

    #[test]
    fn draws_one_line_throttled_and_erases_it() {
        let buf = Shared::default();
        let mut p = Progress::with(Some(Box::new(buf.clone())), "merge", 4);
        assert!(p.active());
        p.update(1, "reading", false);
        p.update(2, "reading", false); // within 100 ms of the last draw: skipped
        p.update(3, "writing", true);
        drop(p);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "\r\x1b[Kmerge: 1/4 (25%) reading\r\x1b[Kmerge: 3/4 (75%) writing\r\x1b[K"
        );
        assert!(!text.contains('\n'));
    }

    #[test]
    fn nothing_is_drawn_without_a_terminal() {
        let mut p = Progress::with(None, "x", 1);
        p.update(1, "y", true);
        p.clear();
        assert!(!p.active());
    }
}
