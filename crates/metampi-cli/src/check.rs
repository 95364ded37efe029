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
            let ports = port_warning(&cfg, metampi_launch::ports::ephemeral_ports());
            for w in tls_warnings(&cfg).into_iter().chain(ports) {
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

/// Router ports of meta hosts started on this machine that lie in its ephemeral range
/// `eph`: a connection closed within the last minute can hold such a port, and the router
/// then fails to start ([`metampi_launch::ports`]).
fn port_warning(cfg: &MetaConfig, eph: Option<std::ops::RangeInclusive<u16>>) -> Option<String> {
    let eph = eph?;
    let layout = cfg.layout_ref();
    let ports: Vec<u16> = layout
        .routers
        .iter()
        .filter(|r| matches!(cfg.hosts[r.host].launch, Launch::Local | Launch::Netns(_)))
        .flat_map(|r| r.listen.iter().map(|l| l.port))
        .collect();
    let runs = metampi_launch::ports::in_range(&ports, &eph);
    if runs.is_empty() {
        return None;
    }
    let list: Vec<String> = runs
        .iter()
        .map(|r| match r.start() == r.end() {
            true => r.start().to_string(),
            false => format!("{}-{}", r.start(), r.end()),
        })
        .collect();
    Some(format!(
        "router ports {} lie in this machine's ephemeral range {}-{}: a connection that closed \
         within the last minute can hold one, and its router then cannot start; a PORTBASE \
         (and PORTs) below {} avoids that",
        list.join(", "),
        eph.start(),
        eph.end(),
        eph.start()
    ))
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
    if !tls_links.is_empty() && !metampi_launch::router_spec::TLS_AVAILABLE {
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
            let full = metampi_config::home_path(path);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(portbase: u16) -> MetaConfig {
        let text = format!(
            "PORTBASE {portbase}\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = local; NPROCS = 1; NODES = b0; }}\n\
             METAHOST c {{ LAUNCH = ssh c.example.org; NPROCS = 1; NODES = c0; }}\n\
             PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
        );
        metampi_config::parse_str("t", &text).unwrap()
    }

    #[test]
    fn router_ports_in_the_ephemeral_range_are_warned_of() {
        let eph = Some(32768..=60999);
        assert_eq!(port_warning(&config(28000), eph.clone()), None);
        let w = port_warning(&config(40000), eph.clone()).unwrap();
        // The routers of a and b listen; c's (started by ssh) is another machine's business.
        let a_b: Vec<u16> = config(40000)
            .layout_ref()
            .routers
            .iter()
            .filter(|r| r.host < 2)
            .flat_map(|r| r.listen.iter().map(|l| l.port))
            .collect();
        assert!(!a_b.is_empty());
        for p in &a_b {
            assert!(w.contains(&p.to_string()), "{w} lacks {p}");
        }
        assert!(
            w.contains("32768-60999") && w.contains("below 32768"),
            "{w}"
        );
        assert_eq!(port_warning(&config(40000), None), None);
    }
}
