//! `cargo xtask`: the only entry points a user or CI needs.
mod demo;
mod setup;
mod test;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install everything the build and tests need (idempotent; run as root on Debian).
    Setup,
    /// Build Weir and show a ClusterIP load balanced across backends in a throwaway
    /// namespace topology.
    Demo,
    /// Run formatting and lint checks, unit tests and the privileged integration tests.
    Test {
        /// Only run integration tests whose name contains this.
        #[arg(long)]
        filter: Option<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::run(),
        Command::Demo => {
            setup::run()?;
            demo::run()
        }
        Command::Test { filter } => {
            setup::run()?;
            test::run(filter.as_deref())
        }
    }
}
