//! `metampi check FILE`: validate a meta-computer description and print its layout.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

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
            Ok(0)
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
