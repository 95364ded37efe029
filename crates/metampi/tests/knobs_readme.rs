//! The README's tuning paragraph and the library's list of settings
//! (`metampi::knobs::KNOBS`) describe the same variables.

use metampi::knobs::{Kind, KNOBS};

fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    std::fs::read_to_string(path).expect("README.md beside the workspace")
}

/// Every `METAMPI_*` word in `text`.
fn names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("METAMPI_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].trim_end_matches('_').to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn every_user_setting_is_in_the_readme() {
    let text = readme();
    let named = names(&text);
    let missing: Vec<_> = KNOBS
        .iter()
        .filter(|k| !matches!(k.kind, Kind::Launcher))
        .filter(|k| !k.name.contains("SECRET") && k.name != "METAMPI_ABI_DIR")
        .filter(|k| !named.iter().any(|n| n == k.name))
        .map(|k| k.name)
        .collect();
    assert!(
        missing.is_empty(),
        "settings the README does not mention: {missing:?}"
    );
}

#[test]
fn every_readme_setting_exists() {
    let unknown: Vec<_> = names(&readme())
        .into_iter()
        .filter(|n| n != "METAMPI" && metampi::knobs::known(n).is_none())
        .filter(|n| !n.starts_with("METAMPI_TEST"))
        .collect();
    assert!(
        unknown.is_empty(),
        "the README names settings nobody reads: {unknown:?}"
    );
}
