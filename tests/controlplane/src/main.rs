//! `weir-test-controlplane --kubeconfig FILE`: the scheduler and controllers
//! against that API server, until SIGINT or SIGTERM.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use weir_test_controlplane::ControlPlane;

#[derive(Parser)]
#[command(
    name = "weir-test-controlplane",
    about = "A minimal Kubernetes control plane for tests and demos"
)]
struct Cli {
    /// The API server's kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
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
    let _running = ControlPlane::start(client).await;
    eprintln!("weir-test-controlplane: running");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
