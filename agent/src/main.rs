use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::{net::SocketAddr, sync::Arc};
use tokio::sync::mpsc;
use tracing::{error, info};

use kube::runtime::{
    events::{Recorder, Reporter},
    reflector,
};
use weir_agent::{
    cleanup,
    controller::{Controller, Hooks},
    datapath::{Datapath, LoadOptions, pins::Pins},
    inspect,
    maps::{LbMaps as _, pinned::PinnedMaps},
    model::NodeInfo,
    reconciler::Reconciler,
    report::{Reports, events, lease},
    source::kube::{Connection, KubeSource},
    source::manifests,
    store::Store,
    telemetry::{self, Health, Metrics, http::Routes},
};

/// Weir's node agent: replaces kube-proxy with eBPF socket load balancing.
#[derive(Parser, Debug)]
#[command(name = "weir-agent", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Directory of Service and EndpointSlice manifests (standalone mode, no API server).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kubeconfig", "k8s_api_server"])]
    manifests: Option<PathBuf>,
    /// kubeconfig for the API server. Without it (and without --manifests) the
    /// pod's service account is used.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The API server as host:port, replacing the configured address. Needed in
    /// a cluster without kube-proxy: the `kubernetes` ClusterIP only works once
    /// this agent has programmed it.
    #[arg(long, value_name = "HOST:PORT")]
    k8s_api_server: Option<String>,
    /// This node's name: endpoints with this nodeName are local.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node_name: Option<String>,
    /// Namespace of the agent's Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    namespace: String,
    /// Prometheus metrics address (kube-proxy's default); empty to disable.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:10249")]
    metrics_addr: String,
    /// /healthz and /livez address (kube-proxy's default, which cloud load
    /// balancers probe); empty to disable.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:10256")]
    healthz_addr: String,
    /// /healthz fails when a change has waited this long to reach the maps.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    healthz_timeout: humantime::Duration,
    /// cgroup v2 directory the socket programs attach to; sockets of processes
    /// in it and below are load balanced.
    #[arg(long, value_name = "PATH", default_value = "/sys/fs/cgroup")]
    cgroup: PathBuf,
    #[command(flatten)]
    bpffs: BpffsArg,
    /// Capacity of the services map: master entries plus one slot per backend of
    /// every frontend.
    #[arg(long, value_name = "N", default_value_t = weir_abi::DEFAULT_MAX_SERVICES)]
    max_services: u32,
    /// Capacity of the backends map.
    #[arg(long, value_name = "N", default_value_t = weir_abi::DEFAULT_MAX_BACKENDS)]
    max_backends: u32,
    #[command(flatten)]
    packet: PacketArgs,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// Settings of the per-packet (TC/XDP) datapath. This build has only the
/// socket datapath: the defaults are accepted, anything that needs TC/XDP is
/// refused at start rather than silently ignored.
#[derive(clap::Args, Debug)]
struct PacketArgs {
    /// Load balance ClusterIP traffic at the socket (connect/sendmsg).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    socket_lb: bool,
    /// Devices for the TC/XDP programs (external devices and pod veths).
    #[arg(long, value_name = "DEV,...", value_delimiter = ',')]
    devices: Vec<String>,
    /// NodePort range.
    #[arg(long, value_name = "FROM-TO", default_value = "30000-32767", value_parser = parse_port_range)]
    nodeport_range: (u16, u16),
    #[arg(long, value_enum, default_value_t = Acceleration::Disabled)]
    acceleration: Acceleration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Acceleration {
    Disabled,
    Native,
    BestEffort,
}

fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?} is not FROM-TO"))?;
    let a: u16 = a
        .trim()
        .parse()
        .map_err(|_| format!("{a:?} is not a port"))?;
    let b: u16 = b
        .trim()
        .parse()
        .map_err(|_| format!("{b:?} is not a port"))?;
    if a == 0 || a > b {
        return Err(format!("{s:?}: FROM must be 1 or more and not above TO"));
    }
    Ok((a, b))
}

impl PacketArgs {
    fn check(&self) -> Result<()> {
        let needs = if !self.socket_lb {
            Some("--socket-lb=false")
        } else if !self.devices.is_empty() {
            Some("--devices")
        } else if self.acceleration != Acceleration::Disabled {
            Some("--acceleration")
        } else {
            None
        };
        if let Some(flag) = needs {
            anyhow::bail!(
                "{flag} needs the per-packet TC/XDP datapath, which this build of weir-agent does not have yet; \
                 ClusterIP is served by socket load balancing (--socket-lb=true, no --devices, --acceleration=disabled)"
            );
        }
        Ok(())
    }
}

#[derive(clap::Args, Debug)]
struct BpffsArg {
    /// Directory on a bpf filesystem where maps and links are pinned.
    #[arg(long = "bpffs", value_name = "DIR", default_value = "/sys/fs/bpf/weir")]
    path: PathBuf,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show what the datapath does, read from the pinned maps.
    Inspect {
        #[command(subcommand)]
        what: Inspect,
    },
    /// Detach every program and remove every pin.
    Cleanup {
        #[command(flatten)]
        bpffs: BpffsArg,
    },
    /// Remove kube-proxy's iptables chains and nftables tables from this
    /// network namespace, after kube-proxy has stopped.
    CleanupKubeProxy {
        /// Print what would be removed and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Subcommand, Debug)]
enum Inspect {
    /// Every VIP:port/proto with its backends and their states.
    Services {
        #[command(flatten)]
        bpffs: BpffsArg,
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let format = cli.run.log_format;
    init_logging(format);
    match cli.command {
        Some(Command::Inspect {
            what: Inspect::Services { bpffs, output },
        }) => {
            let pins = Pins::new(bpffs.path);
            let maps = PinnedMaps::open(&pins.maps())
                .with_context(|| format!("no Weir maps pinned under {}", pins.maps().display()))?;
            let views = inspect::services(&maps.snapshot()?);
            match output {
                Output::Table => print!("{}", inspect::render_table(&views)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
            }
            Ok(())
        }
        Some(Command::Cleanup { bpffs }) => {
            let done = cleanup::cleanup(&Pins::new(&bpffs.path))
                .with_context(|| format!("cleaning up {}", bpffs.path.display()))?;
            println!("detached {} links, removed {} pins", done.links, done.pins);
            Ok(())
        }
        Some(Command::CleanupKubeProxy { dry_run }) => {
            let outcome = weir_agent::kube_proxy_cleanup::cleanup(dry_run);
            print!("{outcome}");
            Ok(outcome.result()?)
        }
        None => run(cli.run),
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run(args: RunArgs) -> Result<()> {
    args.packet.check()?;
    let _ = args.packet.nodeport_range;
    if let Some(dir) = &args.manifests
        && !dir.is_dir()
    {
        anyhow::bail!("--manifests {}: not a directory", dir.display());
    }
    let node = match &args.node_name {
        Some(n) if !n.is_empty() => n.clone(),
        _ => hostname().context("--node-name not given and the hostname cannot be read")?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run_async(args, node))
}

async fn run_async(args: RunArgs, node: String) -> Result<()> {
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new(args.healthz_timeout.into()));
    for (addr, routes, flag) in [
        (
            &args.metrics_addr,
            Routes::Metrics(metrics.clone()),
            "--metrics-addr",
        ),
        (
            &args.healthz_addr,
            Routes::Health(health.clone(), metrics.clone()),
            "--healthz-addr",
        ),
    ] {
        if addr.is_empty() {
            continue;
        }
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("{flag} {addr:?} is not ip:port"))?;
        tokio::spawn(telemetry::http::serve(addr, routes));
    }

    let opts = LoadOptions {
        pins: Pins::new(&args.bpffs.path),
        cgroup: args.cgroup.clone(),
        max_services: args.max_services,
        max_backends: args.max_backends,
    };
    let datapath = Datapath::load(&opts).context("loading the datapath")?;
    info!(cgroup = %opts.cgroup.display(), bpffs = %opts.pins.root().display(), node = %node, "datapath attached");
    let reconciler =
        Reconciler::restore(datapath.maps).context("restoring state from pinned maps")?;
    info!(
        restored_frontends = reconciler.frontend_count(),
        "state restored from pinned maps"
    );

    let (tx, rx) = mpsc::channel(64);
    let store = Store::new(NodeInfo {
        name: node.clone(),
        zone: None,
    });
    let mut hooks = Hooks {
        metrics: metrics.clone(),
        health: health.clone(),
        reports: Reports::none(),
    };
    let source = match &args.manifests {
        Some(dir) => tokio::spawn(manifests::run(dir.clone(), tx)),
        None => {
            let conn = Connection {
                kubeconfig: args.kubeconfig.clone(),
                api_server: args.k8s_api_server.clone(),
            };
            let client = conn
                .client()
                .await
                .context("connecting to the API server")?;
            let (reports, report_rx) = Reports::channel(1024);
            hooks.reports = reports.clone();
            let (services, writer) = reflector::store();
            let recorder = Recorder::new(
                client.clone(),
                Reporter {
                    controller: "weir-agent".into(),
                    instance: Some(node.clone()),
                },
            );
            tokio::spawn(events::run(recorder, services, report_rx));
            tokio::spawn(lease::run(
                client.clone(),
                args.namespace.clone(),
                node.clone(),
            ));
            let source = KubeSource {
                client,
                node: node.clone(),
                services: writer,
                reports,
                metrics: metrics.clone(),
                health: health.clone(),
            };
            tokio::spawn(async move {
                source.run(tx).await;
                Ok(())
            })
        }
    };
    let mut controller = Controller::new(reconciler, store, hooks);
    controller.run(rx, shutdown_signal()).await;
    if source.is_finished() {
        match source.await {
            Ok(Err(e)) => {
                error!("source failed: {e}");
                anyhow::bail!("source failed: {e}");
            }
            Err(e) => anyhow::bail!("source panicked: {e}"),
            Ok(Ok(())) => {}
        }
    }
    // Programs stay attached and maps pinned: the datapath keeps serving
    // until the next agent takes over.
    info!("stopping; datapath left in place");
    Ok(())
}

/// The node name kube-proxy would use: the hostname, lower-cased.
fn hostname() -> Result<String> {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    Ok(raw.trim().to_lowercase())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
