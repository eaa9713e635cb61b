//! `cargo xtask`: the only entry points a user or CI needs.
//!
//! xtask links no workspace crate and nothing whose build needs a tool that
//! `setup` installs (protoc, bpf-linker, clang), so `cargo xtask setup` compiles
//! on a fresh machine; `fresh_machine.rs` guards that. The demos and
//! benches link the test harness and live in the `weir-lab` binary, which xtask
//! builds and runs after setup.
mod dev_apiserver;
#[cfg(test)]
mod fresh_machine;
mod fuzz;
mod helm;
mod setup;
mod test;
mod tools;
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
    /// Build Weir and run the whole system on this machine: a two-node cluster
    /// (weir-kubelet on containerd, weir-agent from the Helm chart), a Deployment
    /// scaled from 3 to 5 replicas and its traffic spreading.
    Demo,
    /// Build Weir and show a ClusterIP load balanced across backends in a throwaway
    /// namespace topology, then the per-packet datapath.
    DemoDatapath,
    /// Build Weir and run weir-kubelet standalone on a private containerd: a static
    /// pod Running with its IP, then reached through a ClusterIP.
    DemoKubelet,
    /// Benchmarks that print tables: `cargo xtask bench datapath|scale|kubelet|maglev`
    /// (`cargo xtask bench --help` lists their options).
    #[command(disable_help_flag = true)]
    Bench {
        /// Passed to `weir-lab bench`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the weir-agent and weir-kubelet images as OCI image-layout
    /// tarballs from the release binaries and Debian packages (no registry).
    Images {
        /// Where the tarballs go (relative to the workspace root).
        #[arg(long, default_value = "target/images")]
        out: std::path::PathBuf,
    },
    /// Render the Helm chart (helm/weir) with Helm's own engine, as `helm
    /// template` would (helm/template.py); needs `cargo xtask setup` once.
    HelmTemplate(helm::HelmTemplate),
    /// Serve the test Kubernetes API server (tests/apiserver) until interrupted,
    /// writing a kubeconfig for kubectl and the agent.
    DevApiserver(dev_apiserver::DevApiserver),
    /// Run every cargo-fuzz target in fuzz/ (parsers, conversions, the planner)
    /// for SECS seconds each, from the checked-in corpus; crashes land in
    /// target/fuzz/artifacts/<target>/.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        secs: u64,
    },
    /// A whole cluster on this machine: `cargo xtask cluster up [--nodes N]
    /// [--kubeconfig FILE]`, `down`, `status` (`cargo xtask cluster --help`).
    #[command(disable_help_flag = true)]
    Cluster {
        /// Passed to `weir-lab cluster`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run formatting and lint checks, unit tests, a short run of every fuzz
    /// target and the privileged integration tests.
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
            util::lab(&["demo"])
        }
        Command::DemoDatapath => {
            setup::run()?;
            util::lab(&["demo-datapath"])
        }
        Command::DemoKubelet => {
            setup::run()?;
            util::lab(&["demo-kubelet"])
        }
        Command::Bench { args } if args.first().is_some_and(|a| a == "maglev") => {
            setup::run()?;
            // A table's cost is the agent's own code: its bench target, not the lab.
            util::exec(
                util::cargo()
                    .current_dir(util::root())
                    .args(["bench", "-p", "weir-agent", "--bench", "maglev", "--"])
                    .args(&args[1..]),
            )
        }
        Command::Bench { args } => {
            setup::run()?;
            let mut all = vec!["bench".to_owned()];
            all.extend(args);
            util::lab(&all)
        }
        Command::Images { out } => {
            setup::run()?;
            let out = std::path::absolute(out)?;
            util::lab(&["images".as_ref(), "--out".as_ref(), out.as_os_str()])
        }
        Command::Cluster { args } => {
            // `up` builds images and starts containerd: it needs what setup
            // installs; `down` and `status` must work even if setup cannot.
            if args.first().is_some_and(|a| a == "up") {
                setup::run()?;
            }
            let mut all = vec!["cluster".to_owned()];
            all.extend(args);
            util::lab(&all)
        }
        Command::HelmTemplate(args) => helm::run(args),
        Command::DevApiserver(args) => dev_apiserver::run(args),
        Command::Fuzz { secs } => {
            setup::run()?;
            fuzz::run(secs)
        }
        Command::Test { filter } => {
            setup::run()?;
            test::run(filter.as_deref())
        }
    }
}
