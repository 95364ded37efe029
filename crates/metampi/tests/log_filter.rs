//! The library's diagnostics go through `tracing` and `METAMPI_LOG` filters them: a misspelt
//! setting is named on stderr by default, and not with `METAMPI_LOG=off` (or `error`).

use metampi::traits::*;
use metampi_testkit::Ranks;

fn stderr_of(test: &str, log: Option<&str>) -> Option<String> {
    let mut ranks = Ranks::new(2)
        .capture_tagged()
        .env("METAMPI_EAGER_LIMT", "4096");
    if let Some(filter) = log {
        ranks = ranks.env("METAMPI_LOG", filter);
    }
    let outcome = ranks.outcome(test, |world| world.barrier())?;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    Some(String::from_utf8_lossy(&outcome.stderr).into_owned())
}

#[test]
fn a_misspelt_setting_is_named_by_default() {
    let Some(err) = stderr_of("a_misspelt_setting_is_named_by_default", None) else {
        return;
    };
    assert!(
        err.contains(
            "METAMPI_EAGER_LIMT is not a metampi setting (did you mean METAMPI_EAGER_LIMIT?)"
        ),
        "{err}"
    );
}

#[test]
fn metampi_log_silences_the_warnings_it_filters_out() {
    for filter in ["off", "error"] {
        let name = "metampi_log_silences_the_warnings_it_filters_out";
        let Some(err) = stderr_of(name, Some(filter)) else {
            return;
        };
        assert!(
            !err.contains("METAMPI_EAGER_LIMT"),
            "METAMPI_LOG={filter}: {err}"
        );
    }
}

#[test]
fn a_malformed_metampi_log_is_named() {
    let Some(err) = stderr_of("a_malformed_metampi_log_is_named", Some("metampi=loud")) else {
        return;
    };
    assert!(
        err.contains("METAMPI_LOG `metampi=loud` is not a filter"),
        "{err}"
    );
    // And the default filter is used instead.
    assert!(err.contains("METAMPI_EAGER_LIMT"), "{err}");
}
