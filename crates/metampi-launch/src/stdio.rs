//! Rank output forwarding (line-atomic) and stdin distribution.
//!
//! Every rank's stdout and stderr pipe has its own reader thread. A reader writes only whole
//! lines, all complete lines of one read in a single write under the stream's lock, so lines
//! of different ranks never mix inside a line. A chunk that has no newline yet is held back
//! until it gets one, up to [`MAX_PARTIAL`] bytes; at EOF (or past that size) it is forwarded
//! with a newline added, so the next rank's line still starts at a line start.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::command;
use crate::sys;

/// Longest line held back waiting for its newline.
pub(crate) const MAX_PARTIAL: usize = 64 * 1024;

const READ_CHUNK: usize = 16 * 1024;
const IO_THREAD_STACK: usize = 128 * 1024;

/// Which of the launcher's streams a rank stream goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// Where forwarded lines are written.
#[derive(Debug, Clone)]
pub(crate) enum Sink {
    /// The launcher's own stdout/stderr, through std's handles so the lock is shared with any
    /// `println!` elsewhere in the process.
    Terminal(Stream),
    /// Memory, for [`OutputMode::Capture`](crate::OutputMode::Capture).
    Capture(Arc<Mutex<Vec<u8>>>),
}

impl Sink {
    /// Writes `bytes`; false where the launcher's stdout is a pipe whose reader has gone
    /// (`metampi run ... | head`). Other write errors are dropped: the draining goes on
    /// whatever happens to the output, or ranks would block on a full pipe.
    fn write_lines(&self, bytes: &[u8]) -> bool {
        match self {
            Sink::Terminal(Stream::Stdout) => {
                let stdout = io::stdout();
                let mut lock = stdout.lock();
                let r = lock.write_all(bytes).and_then(|()| lock.flush());
                return !matches!(r, Err(e) if e.kind() == io::ErrorKind::BrokenPipe);
            }
            Sink::Terminal(Stream::Stderr) => {
                let _ = io::stderr().lock().write_all(bytes);
            }
            Sink::Capture(buffer) => buffer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(bytes),
        }
        true
    }
}

/// Splits a byte stream into whole lines and prefixes each one.
#[derive(Debug)]
pub(crate) struct LineSplitter {
    prefix: Vec<u8>,
    partial: Vec<u8>,
}

impl LineSplitter {
    pub(crate) fn new(prefix: Vec<u8>) -> Self {
        LineSplitter {
            prefix,
            partial: Vec::new(),
        }
    }

    /// Feeds bytes; returns the complete (prefixed) lines now available, possibly empty.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            out.extend_from_slice(&self.prefix);
            out.append(&mut self.partial);
            out.extend_from_slice(&rest[..=pos]);
            rest = &rest[pos + 1..];
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() >= MAX_PARTIAL {
            out.extend_from_slice(&self.finish());
        }
        out
    }

    /// The held-back partial line, terminated, or nothing.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        if self.partial.is_empty() {
            return Vec::new();
        }
        let mut out = self.prefix.clone();
        out.append(&mut self.partial);
        out.push(b'\n');
        out
    }
}

/// What a forwarder calls, once, when the reader of the launcher's stdout has gone.
pub(crate) type OnClosed = Box<dyn FnOnce() + Send>;

/// Starts a thread forwarding `source` to `sink`; it reports on `done` when the pipe closes,
/// and calls `closed` when the sink's reader has gone.
pub(crate) fn spawn_forwarder(
    name: String,
    source: impl Read + Send + 'static,
    prefix: Vec<u8>,
    sink: Sink,
    done: Sender<()>,
    closed: Option<OnClosed>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name)
        .stack_size(IO_THREAD_STACK)
        .spawn(move || {
            forward(source, LineSplitter::new(prefix), &sink, closed);
            let _ = done.send(());
        })
}

/// Starts a thread copying `source` to this process's stdout (`stderr`: its
/// stderr) line by line, each line after `prefix`, as the launcher forwards a
/// rank's output; the thread ends when `source` closes. For processes a rank
/// starts itself (spawned children) under `--tag-output` ([`TAG_OUTPUT_ENV`]).
///
/// # Errors
/// The thread could not be started.
pub fn forward_lines(
    name: String,
    source: impl Read + Send + 'static,
    prefix: Vec<u8>,
    stderr: bool,
) -> io::Result<JoinHandle<()>> {
    let sink = Sink::Terminal(if stderr {
        Stream::Stderr
    } else {
        Stream::Stdout
    });
    std::thread::Builder::new()
        .name(name)
        .stack_size(IO_THREAD_STACK)
        .spawn(move || forward(source, LineSplitter::new(prefix), &sink, None))
}

/// Set to `1` for every rank of a job run with [`JobSpec::tag_output`](crate::JobSpec::tag_output),
/// so that a rank labels the output of processes it starts itself.
pub const TAG_OUTPUT_ENV: &str = "METAMPI_TAG_OUTPUT";

/// Set for every rank of a job whose output goes to files
/// ([`OutputMode::Directory`](crate::OutputMode::Directory)): the directory,
/// as an absolute path, so that a rank puts the output of processes it starts
/// itself in files of their own there (named after [`OUTPUT_NAME_ENV`]).
pub const OUTPUT_DIR_ENV: &str = "METAMPI_OUTPUT_DIR";

/// With [`OUTPUT_DIR_ENV`]: the stem of this process's own files in that
/// directory, `rank.R` for rank R (whose files are `rank.R.stdout` and
/// `rank.R.stderr`).
pub const OUTPUT_NAME_ENV: &str = "METAMPI_OUTPUT_NAME";

/// The stem of rank `rank`'s files under an output directory.
pub(crate) fn output_stem(rank: usize) -> String {
    format!("rank.{rank}")
}

fn forward(
    mut source: impl Read,
    mut splitter: LineSplitter,
    sink: &Sink,
    mut closed: Option<OnClosed>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut write = |bytes: &[u8]| {
        if !sink.write_lines(bytes) {
            if let Some(f) = closed.take() {
                f();
            }
        }
    };
    loop {
        match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let lines = splitter.push(&buf[..n]);
                if !lines.is_empty() {
                    write(&lines);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let tail = splitter.finish();
    if !tail.is_empty() {
        write(&tail);
    }
}

/// Waits until `count` forwarders have reported on `done`, or `deadline` passes.
/// Returns how many are still running.
pub(crate) fn wait_forwarders(done: &Receiver<()>, mut count: usize, deadline: Instant) -> usize {
    while count > 0 {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match done.recv_timeout(deadline - now) {
            Ok(()) => count -= 1,
            Err(_) => break,
        }
    }
    count
}

/// The stdin of a rank that reads the launcher's.
pub(crate) struct PumpTarget {
    pub(crate) stdin: std::process::ChildStdin,
    /// A rank on another machine: the data goes as frames, and the end of the data is an end
    /// frame, not the end of the pipe, which stays open until the pump stops (see
    /// [`RemoteStdin::Forward`](crate::command::RemoteStdin::Forward)).
    pub(crate) framed: bool,
}

/// Pipes of framed targets whose data has ended, held open until the pump stops; `None` once
/// it has.
type Held = Arc<Mutex<Option<Vec<std::process::ChildStdin>>>>;

/// Copies stdin (the launcher's or given bytes) to one or more ranks.
///
/// Each target has its own writer thread, so a rank that never reads its stdin cannot stall
/// the others. Reading the launcher's stdin is cancellable (poll on a cancel pipe), so that a
/// job run inside a longer-lived process (a test) does not keep consuming that process's
/// stdin after it ends.
pub(crate) struct StdinPump {
    cancel: Option<OwnedFd>,
    reader: Option<JoinHandle<()>>,
    held: Held,
}

impl StdinPump {
    /// Starts pumping `data` (or, if `None`, the launcher's fd 0) to `targets`.
    pub(crate) fn start(data: Option<Vec<u8>>, targets: Vec<PumpTarget>) -> io::Result<StdinPump> {
        let held: Held = Arc::new(Mutex::new(Some(Vec::new())));
        let mut senders = Vec::with_capacity(targets.len());
        for (index, target) in targets.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Arc<[u8]>>();
            let held = Arc::clone(&held);
            std::thread::Builder::new()
                .name(format!("metampi-stdin-{index}"))
                .stack_size(IO_THREAD_STACK)
                .spawn(move || write_chunks(target, &rx, &held))?;
            senders.push(tx);
        }
        match data {
            Some(data) => {
                let chunk: Arc<[u8]> = data.into();
                for tx in &senders {
                    let _ = tx.send(Arc::clone(&chunk));
                }
                // Dropping the senders ends each rank's stdin once its copy is written.
                Ok(StdinPump {
                    cancel: None,
                    reader: None,
                    held,
                })
            }
            None => {
                let (cancel_read, cancel_write) = sys::pipe()?;
                let reader = std::thread::Builder::new()
                    .name("metampi-stdin".into())
                    .stack_size(IO_THREAD_STACK)
                    .spawn(move || pump_launcher_stdin(&cancel_read, senders))?;
                Ok(StdinPump {
                    cancel: Some(cancel_write),
                    reader: Some(reader),
                    held,
                })
            }
        }
    }

    /// Stops reading the launcher's stdin and closes the framed targets' pipes (a remote
    /// process still reading them is stopped); returns once the reader thread has ended.
    pub(crate) fn stop(mut self) {
        // Closing the write end makes the cancel pipe readable (EOF) for poll.
        drop(self.cancel.take());
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        // A writer still busy closes its pipe itself when it is done.
        drop(
            self.held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }
}

fn pump_launcher_stdin(cancel: &OwnedFd, mut senders: Vec<Sender<Arc<[u8]>>>) {
    let stdin_fd = io::stdin().as_raw_fd();
    let mut buf = vec![0u8; READ_CHUNK];
    while !senders.is_empty() {
        match sys::poll_either(stdin_fd, cancel.as_raw_fd()) {
            Ok(sys::Ready::First) => {}
            Ok(sys::Ready::Second) | Err(_) => return,
        }
        let n = match sys::read_fd(stdin_fd, &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk: Arc<[u8]> = buf[..n].into();
        // A writer that has gone (its rank closed stdin or died) is simply dropped.
        senders.retain(|tx| tx.send(Arc::clone(&chunk)).is_ok());
    }
}

fn write_chunks(target: PumpTarget, chunks: &Receiver<Arc<[u8]>>, held: &Held) {
    let PumpTarget { mut stdin, framed } = target;
    let mut frames = Vec::new();
    for chunk in chunks {
        let bytes = if framed {
            frames.clear();
            command::stdin_frames(&chunk, &mut frames);
            &frames[..]
        } else {
            &chunk[..]
        };
        if stdin.write_all(bytes).is_err() {
            return;
        }
    }
    if framed && stdin.write_all(command::STDIN_END).is_ok() {
        if let Some(open) = held.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            open.push(stdin);
        }
    }
}

/// How long the launcher keeps waiting for output after every rank has exited, before it
/// assumes a leftover child process is holding a pipe open.
pub(crate) const OUTPUT_GRACE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitter_emits_only_whole_prefixed_lines() {
        let mut s = LineSplitter::new(b"[3] ".to_vec());
        assert_eq!(s.push(b"hel"), b"");
        assert_eq!(s.push(b"lo\nwor"), b"[3] hello\n");
        assert_eq!(s.push(b"ld\n\nx\n"), b"[3] world\n[3] \n[3] x\n");
        assert_eq!(s.push(b"tail"), b"");
        assert_eq!(s.finish(), b"[3] tail\n");
        assert_eq!(s.finish(), b"");
    }

    #[test]
    fn splitter_without_prefix_is_transparent_for_whole_lines() {
        let mut s = LineSplitter::new(Vec::new());
        assert_eq!(s.push(b"a\nb\n"), b"a\nb\n");
        assert_eq!(s.finish(), b"");
    }

    #[test]
    fn splitter_bounds_a_line_without_newline() {
        let mut s = LineSplitter::new(b"> ".to_vec());
        let big = vec![b'x'; MAX_PARTIAL + 5];
        let out = s.push(&big);
        assert_eq!(out.len(), 2 + MAX_PARTIAL + 5 + 1);
        assert!(out.starts_with(b"> xxx") && out.ends_with(b"x\n"));
        assert_eq!(s.finish(), b"");
    }

    #[test]
    fn forwarder_adds_newline_at_eof_and_reports_done() {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let source = io::Cursor::new(b"one\ntwo".to_vec());
        let handle = spawn_forwarder(
            "t".into(),
            source,
            b"[0] ".to_vec(),
            Sink::Capture(buffer.clone()),
            tx,
            None,
        )
        .unwrap();
        handle.join().unwrap();
        assert_eq!(
            wait_forwarders(&rx, 1, Instant::now() + Duration::from_secs(5)),
            0
        );
        assert_eq!(&*buffer.lock().unwrap(), b"[0] one\n[0] two\n");
    }
}
