//! `metampi`: run message-passing jobs and drive the metampi tools.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod run;

#[derive(Debug, Parser)]
#[command(
    name = "metampi",
    version,
    about = "Run and inspect metampi message-passing jobs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    // No doc comment here: it would replace the long help that RunArgs carries.
    Run(run::RunArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::execute(args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("metampi: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
