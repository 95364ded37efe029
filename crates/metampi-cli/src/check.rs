//! `metampi check FILE`: validate a meta-computer description and print its layout.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use metampi_config::{Launch, MetaConfig, Tls};

/// Options of `metampi check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A MetaMPICH description file or a PACX-MPI hostfile (detected by content).
    file: PathBuf,
}

pub fn execute(args: CheckArgs) -> Result<u8> {
    match metampi_config::load(&args.file) {
        Ok(cfg) => {
            print!("{}", cfg.layout());
            print!("{}", cfg.process_settings());
            for w in tls_warnings(&cfg) {
                eprintln!("warning: {w}");
            }
            // `metampi run` reads every ENVFILE on this machine before it starts anything.
            let mut status = 0;
            for h in &cfg.hosts {
                if let Err(e) = h.environment() {
                    eprintln!("error: {e}");
                    status = 1;
                }
            }
            Ok(status)
        }
        Err(e) => {
            eprintln!("{e}");
            if let Ok(text) = std::fs::read_to_string(&args.file) {
                if let Some(s) = e.snippet(&text) {
                    eprintln!("{s}");
                }
            }
            Ok(1)
        }
    }
}

/// What would stop TLS links at start-up and can be seen from here: a build
/// without TLS, and certificate files of meta hosts started on this machine
/// that cannot be read (the routers read them; paths of remote meta hosts
/// are not checked).
fn tls_warnings(cfg: &MetaConfig) -> Vec<String> {
    let layout = cfg.layout_ref();
    let mut out = Vec::new();
    let tls_links: Vec<String> = layout
        .links
        .iter()
        .filter(|l| l.options.tls != Tls::Off)
        .map(|l| format!("l{}", l.id))
        .collect();
    if !tls_links.is_empty() && !metampi::router::tls::AVAILABLE {
        out.push(format!(
            "this metampi was built without TLS (cargo feature `tls`); links {} ask for it",
            tls_links.join(" ")
        ));
    }
    for (i, h) in cfg.hosts.iter().enumerate() {
        let on = layout
            .links
            .iter()
            .any(|l| l.options.tls == Tls::On && (l.from_host == i || l.to_host == i));
        if !on || !matches!(h.launch, Launch::Local | Launch::Netns(_)) {
            continue;
        }
        let files = [
            ("TLSCERT", &h.tls.cert),
            ("TLSKEY", &h.tls.key),
            ("TLSCA", &h.tls.ca),
        ];
        for (key, path) in files {
            let Some(path) = path else { continue };
            let full = match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
                (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
                _ => PathBuf::from(path),
            };
            if let Err(e) = std::fs::File::open(&full) {
                out.push(format!(
                    "meta host '{}': {key} {path} cannot be read here: {e}",
                    h.name
                ));
            }
        }
    }
    out
}
