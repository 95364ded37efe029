//! `metampi`: run message-passing jobs and drive the metampi tools.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod check;
mod demo;
mod font;
mod info;
mod links;
mod progress;
mod run;
mod tracecmd;
mod web;

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
    /// Run a demonstration job: 4 ranks on 2 emulated machines of this computer.
    Demo(demo::DemoArgs),
    /// Measure ping-pong, bandwidth and collectives over message sizes (OSU-style table, JSON, CSV, SVG/PNG plot).
    Bench(bench::BenchArgs),
    /// Merge the rank and router traces of `metampi run --trace DIR` into a Perfetto file, summary and timeline.
    Trace(tracecmd::TraceArgs),
    /// Validate a meta-computer description (or PACX hostfile) and print the resolved layout.
    Check(check::CheckArgs),
    /// Print the library's versions and what this machine offers it: shared memory, single-copy transfer, fences, CPUs, link features, METAMPI_* variables.
    Info(info::InfoArgs),
    /// Print the per-link statistics of a meta job's routers (METAMPI_ROUTER_STATS=DIR): bytes, rate, frames, compression, queues, round trip, resends.
    Links(links::LinksArgs),
    #[command(hide = true)]
    DemoRank,
    /// A router between meta hosts (started by `metampi run --meta`).
    #[command(hide = true)]
    Router,
}

fn main() -> ExitCode {
    // Diagnostics of the launcher and of routers started as `metampi router` (METAMPI_LOG).
    metampi::log::init();
    let argv = match run::hydra_spellings(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("metampi run: error: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(argv);
    let result = match cli.command {
        Command::Run(args) => run::execute(args),
        Command::Demo(args) => demo::execute(args),
        Command::Check(args) => check::execute(args),
        Command::Info(args) => info::execute(args),
        Command::Links(args) => links::execute(args),
        Command::Bench(args) => bench::execute(args),
        Command::Trace(args) => tracecmd::execute(args),
        Command::DemoRank => demo::rank_main(),
        Command::Router => {
            if metampi_router::run_from_env() {
                Ok(0)
            } else {
                Err(anyhow::anyhow!(
                    "`metampi router` is started by `metampi run --meta FILE`"
                ))
            }
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("metampi: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
