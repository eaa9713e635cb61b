//! `weir-test-controlplane --kubeconfig FILE`: the scheduler and controllers
//! against that API server, until SIGINT or SIGTERM.
use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use weir_test_controlplane::{ControlPlane, Options};

#[derive(Parser)]
#[command(
    name = "weir-test-controlplane",
    about = "A minimal Kubernetes control plane for tests and demos"
)]
struct Cli {
    /// The API server's kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Seconds a node's kubelet may stay silent before the node is Unknown.
    #[arg(long, default_value_t = 40.0)]
    node_monitor_grace_period: f64,
    /// Seconds between node checks when nothing changes.
    #[arg(long, default_value_t = 5.0)]
    node_monitor_period: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let kubeconfig = Kubeconfig::read_from(&cli.kubeconfig)
        .with_context(|| format!("reading {}", cli.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("loading the kubeconfig")?;
    let client = kube::Client::try_from(config).context("building the client")?;
    let seconds = |s: f64, flag: &str| {
        Duration::try_from_secs_f64(s).with_context(|| format!("--{flag}: not a duration: {s}"))
    };
    let options = Options {
        node_monitor_grace_period: seconds(
            cli.node_monitor_grace_period,
            "node-monitor-grace-period",
        )?,
        node_monitor_period: seconds(cli.node_monitor_period, "node-monitor-period")?,
    };
    let _running = ControlPlane::start_with(client, options).await;
    eprintln!("weir-test-controlplane: running");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
