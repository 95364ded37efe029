//! Diagnostics: the library, its routers and its launcher report through `tracing`, and each
//! process of a job installs one subscriber ([`init`]) that prints the messages on stderr as
//! they were printed before (the message alone, no time or level), filtered by
//! `METAMPI_LOG` (`warn`, `off`, `metampi_router=off,info`; default `info`).
//!
//! A program that installed a subscriber of its own before `initialize` keeps it and gets
//! the library's events there. Messages that end the job (an abort, a failed start-up) do
//! not go through here: they are printed whatever the filter.

use std::str::FromStr;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The filter when `METAMPI_LOG` is not set.
const DEFAULT: &str = "info";

/// Installs this process's subscriber (once; later calls and a program's own subscriber
/// win). A malformed `METAMPI_LOG` is named, and the default used.
pub fn init() {
    let (filter, bad) = filter_from(crate::knobs::text("METAMPI_LOG").as_deref());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_ansi(false);
    let installed = tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .try_init()
        .is_ok();
    if let (true, Some(why)) = (installed, bad) {
        tracing::warn!("metampi: {why}");
    }
}

/// The filter `text` asks for, or the default and why `text` was refused.
fn filter_from(text: Option<&str>) -> (Targets, Option<String>) {
    let default = || Targets::from_str(DEFAULT).expect("the default filter parses");
    match text.map(str::trim) {
        None | Some("") => (default(), None),
        Some(t) => match Targets::from_str(t) {
            Ok(f) => (f, None),
            Err(e) => (
                default(),
                Some(format!(
                    "METAMPI_LOG `{t}` is not a filter ({e}); using `{DEFAULT}`"
                )),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::level_filters::LevelFilter;

    #[test]
    fn levels_and_targets_are_understood_and_nonsense_named() {
        let (f, bad) = filter_from(Some("warn"));
        assert!(bad.is_none());
        assert!(f.would_enable("metampi", &tracing::Level::WARN));
        assert!(!f.would_enable("metampi", &tracing::Level::INFO));
        let (f, bad) = filter_from(Some("metampi_router=off,info"));
        assert!(bad.is_none());
        assert!(!f.would_enable("metampi_router", &tracing::Level::ERROR));
        assert!(f.would_enable("metampi", &tracing::Level::INFO));
        let (f, bad) = filter_from(Some("loud=banana"));
        assert!(bad.unwrap().contains("METAMPI_LOG `loud=banana`"));
        assert_eq!(f.default_level(), Some(LevelFilter::INFO));
        let (_, bad) = filter_from(None);
        assert!(bad.is_none());
    }
}
