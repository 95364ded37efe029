//! The crate's layers stay layered: the engine, its transports and the base modules never
//! name the API modules above them. Read from the sources (the code outside their test
//! modules), so that an import that would close a circle across layers again fails here with
//! the file and the line. The system layer below the engine is a crate of its own
//! (`metampi-sys`), which Cargo keeps from naming anything here.

use std::path::{Path, PathBuf};

/// The API layer: what programs call.
const API: &[&str] = &[
    "attribute",
    "collective",
    "datatype",
    "environment",
    "point_to_point",
    "request",
    "topology",
    "trace",
    "counters",
    "fuzzing",
    "traits",
];

/// Files below the API: the base modules (whole files) and the engine (a folder).
const BASE: &[&str] = &["error.rs", "tuning.rs", "auth.rs", "bootstrap.rs"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The file's lines up to its first test module, without `//` comments.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") || t.starts_with("#[cfg(all(test") {
            break;
        }
        let code = match line.find("//") {
            Some(k) => &line[..k],
            None => line,
        };
        lines.push((i + 1, code.to_string()));
    }
    lines
}

/// Each `crate::NAME` in `code` whose NAME is one of `names`.
fn names_any(code: &str, names: &[&str]) -> Option<String> {
    let mut rest = code;
    while let Some(k) = rest.find("crate::") {
        let after = &rest[k + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if names.contains(&name.as_str()) {
            return Some(name);
        }
        rest = after;
    }
    None
}

#[test]
fn lower_layers_never_name_the_api() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("engine"), &mut files);
    files.extend(BASE.iter().map(|f| src.join(f)));
    assert!(files.len() > 15, "the engine was not found");
    let mut bad = Vec::new();
    for f in &files {
        for (n, code) in code_lines(f) {
            let rel = f.strip_prefix(&src).unwrap().display();
            if let Some(name) = names_any(&code, API) {
                bad.push(format!("src/{rel}:{n}: names the API module `{name}`"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports across layers (API → engine → transports):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_check_finds_a_path_into_the_api() {
    assert_eq!(
        names_any("use crate::topology::Foo;", API).as_deref(),
        Some("topology")
    );
    assert_eq!(
        names_any("let x = crate::knobs::flag(\"A\", true);", API),
        None
    );
    assert_eq!(
        names_any("crate::sys::x(); crate::collective::y()", API).as_deref(),
        Some("collective")
    );
}
