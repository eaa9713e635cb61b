//! `weir-lab`: the heavy half of `cargo xtask`. xtask itself must compile on a
//! machine that has nothing `cargo xtask setup` installs (no protoc, no
//! bpf-linker), so it links none of the workspace; the demos and benches link the
//! test harness (and through it weir-kubelet's CRI client, whose build needs
//! protoc) and live here. xtask runs setup, builds this binary with the agent
//! and the kubelet, and runs it with `WEIR_BIN_DIR` pointing at them.
mod bench;
mod cluster;
mod demo;
mod demo_cluster;
mod demo_kubelet;
mod demo_packet;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Weir's demos and benchmarks (run through cargo xtask)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The whole system: a two-node cluster (weir-kubelet on containerd,
    /// weir-agent from the chart), a Deployment scaled from 3 to 5 and the
    /// traffic spreading.
    Demo,
    /// A ClusterIP load balanced across backends in a throwaway namespace
    /// topology, then the per-packet datapath.
    DemoDatapath,
    /// weir-kubelet standalone on a private containerd: a static pod Running
    /// with its IP, then reached through a ClusterIP.
    DemoKubelet,
    /// Benchmarks that print tables.
    Bench {
        #[command(subcommand)]
        bench: bench::Bench,
    },
    /// The weir-agent and weir-kubelet images as OCI image-layout tarballs
    /// (`ctr -n k8s.io images import FILE`), from the release binaries in
    /// `WEIR_BIN_DIR` and Debian packages.
    Images {
        /// Where the tarballs go.
        #[arg(long, default_value = "target/images")]
        out: PathBuf,
    },
    /// A whole cluster on this machine: the test API server and control
    /// plane, N nodes running weir-kubelet, weir-agent from the chart.
    Cluster {
        #[command(subcommand)]
        cmd: cluster::ClusterCmd,
    },
    /// Remove what killed test and demo runs left behind (namespaces,
    /// containerds, mounts, cgroups, temp dirs).
    Sweep,
}

/// The workspace root, where xtask starts this binary; relative output
/// paths are taken from there.
pub fn root() -> PathBuf {
    std::env::current_dir().unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Demo => demo_cluster::run(),
        Command::DemoDatapath => demo::run(),
        Command::DemoKubelet => demo_kubelet::run(),
        Command::Bench { bench } => bench::run(bench),
        Command::Cluster { cmd } => cluster::run(cmd),
        Command::Images { out } => images(&out),
        Command::Sweep => {
            weir_integration::sweep::sweep();
            Ok(())
        }
    }
}

fn images(out: &std::path::Path) -> anyhow::Result<()> {
    let built = weir_integration::release_images::build_from_harness_bins(&root().join(out))?;
    for b in built {
        println!("{}  {}  {}", b.name, b.digest, b.file.display());
    }
    println!(
        "load one into a node's containerd with `ctr -n k8s.io images import FILE`, \
         or push it to a registry (helm/weir/README.md)"
    );
    Ok(())
}
