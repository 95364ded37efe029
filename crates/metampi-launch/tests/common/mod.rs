//! Helpers shared by the launch integration tests.

#![allow(dead_code)]

use std::path::PathBuf;

use metampi_launch::{AppSpec, JobSpec, OutputMode, StdinTarget};

/// `n` ranks of `/bin/sh -c script`.
pub fn sh(n: usize, script: &str) -> AppSpec {
    AppSpec::new(n, "/bin/sh").args(["-c", script])
}

/// A job of one app whose output is captured and whose stdin is /dev/null, so tests neither
/// print nor read the test runner's terminal.
pub fn captured(app: AppSpec) -> JobSpec {
    JobSpec::new()
        .app(app)
        .stdin(StdinTarget::None)
        .output(OutputMode::Capture)
}

/// Lines of `text`, sorted: ranks run concurrently, so only the set of lines is stable.
pub fn sorted_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines.sort();
    lines
}

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "metampi-launch-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
