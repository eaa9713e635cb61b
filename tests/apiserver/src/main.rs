//! `weir-test-apiserver --listen ADDR --kubeconfig FILE`: serve until killed.
use std::{
    net::{SocketAddr, ToSocketAddrs as _},
    path::PathBuf,
    time::Duration,
};

use clap::Parser;
use weir_test_apiserver::{Options, TestApiServer};

#[derive(Parser)]
#[command(
    name = "weir-test-apiserver",
    about = "A Kubernetes API server for tests and development"
)]
struct Cli {
    /// Address to listen on (port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write the kubeconfig for clients.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 60)]
    bookmark_interval: u64,
    /// Events kept for watches to resume from.
    #[arg(long, default_value_t = 10_000)]
    history_limit: usize,
    /// Extra DNS names or IPs for the serving certificate.
    #[arg(long = "san")]
    sans: Vec<String>,
    /// Longest lifetime, in seconds, of a service-account token from a
    /// TokenRequest (any value; kube-apiserver wants at least 3600).
    #[arg(long = "service-account-max-token-expiration", value_name = "SECS")]
    max_token_expiration: Option<u64>,
    /// Dial NODE's kubelet at HOST:PORT instead of the address its Node
    /// reports (for logs, exec, attach, port-forward); repeatable.
    #[arg(long = "kubelet-route", value_name = "NODE=HOST:PORT", value_parser = parse_route)]
    kubelet_routes: Vec<(String, SocketAddr)>,
}

fn parse_route(s: &str) -> Result<(String, SocketAddr), String> {
    let (node, target) = s
        .split_once('=')
        .filter(|(n, _)| !n.is_empty())
        .ok_or_else(|| format!("{s:?} is not NODE=HOST:PORT"))?;
    let addr = target
        .to_socket_addrs()
        .map_err(|e| format!("kubelet route of {node}: {target:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("kubelet route of {node}: {target:?} has no address"))?;
    Ok((node.to_string(), addr))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let server = TestApiServer::start(Options {
        listen: cli.listen,
        bookmark_interval: Duration::from_secs(cli.bookmark_interval.max(1)),
        history_limit: cli.history_limit,
        extra_sans: cli.sans,
        kubeconfig: Some(cli.kubeconfig.clone()),
        max_token_expiration: cli.max_token_expiration.map(Duration::from_secs),
    })
    .await?;
    for (node, addr) in &cli.kubelet_routes {
        server.route_kubelet(node, *addr);
    }
    eprintln!(
        "weir-test-apiserver: serving {} ; kubeconfig {} ; CA {}",
        server.url(),
        server.kubeconfig_path().display(),
        server.ca_path().display()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.stop().await;
    Ok(())
}
