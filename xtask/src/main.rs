//! `cargo xtask`: the only entry points a user or CI needs.
mod bench;
mod demo;
mod demo_kubelet;
mod dev_apiserver;
mod helm;
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
    /// Build Weir and run weir-kubelet standalone on a private containerd: a static
    /// pod Running with its IP, then reached through a ClusterIP.
    DemoKubelet,
    /// Benchmarks that print tables (see `cargo xtask bench --help`).
    Bench {
        #[command(subcommand)]
        bench: bench::Bench,
    },
    /// Render the Helm chart (helm/weir) with Helm's own engine, as `helm
    /// template` would (helm/template.py); needs `cargo xtask setup` once.
    HelmTemplate(helm::HelmTemplate),
    /// Serve the test Kubernetes API server (tests/apiserver) until interrupted,
    /// writing a kubeconfig for kubectl and the agent.
    DevApiserver(dev_apiserver::DevApiserver),
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
        Command::DemoKubelet => {
            setup::run()?;
            demo_kubelet::run()
        }
        Command::Bench { bench } => {
            setup::run()?;
            bench::run(bench)
        }
        Command::HelmTemplate(args) => helm::run(args),
        Command::DevApiserver(args) => dev_apiserver::run(args),
        Command::Test { filter } => {
            setup::run()?;
            test::run(filter.as_deref())
        }
    }
}
