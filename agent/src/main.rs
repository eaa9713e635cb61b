use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use tokio::sync::mpsc;
use tracing::{error, info};
use weir_agent::{
    cleanup,
    controller::Controller,
    datapath::{Datapath, LoadOptions, pins::Pins},
    inspect,
    maps::{LbMaps as _, pinned::PinnedMaps},
    reconciler::Reconciler,
    source::manifests,
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
    /// Directory of Service and EndpointSlice manifests (standalone mode).
    #[arg(long, value_name = "DIR")]
    manifests: Option<PathBuf>,
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
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
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
    let dir = args
        .manifests
        .clone()
        .context("--manifests DIR is required (the API-server source is not built yet)")?;
    if !dir.is_dir() {
        anyhow::bail!("--manifests {}: not a directory", dir.display());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let opts = LoadOptions {
            pins: Pins::new(&args.bpffs.path),
            cgroup: args.cgroup.clone(),
            max_services: args.max_services,
            max_backends: args.max_backends,
        };
        let datapath = Datapath::load(&opts).context("loading the datapath")?;
        info!(cgroup = %opts.cgroup.display(), bpffs = %opts.pins.root().display(), "datapath attached");
        let reconciler = Reconciler::restore(datapath.maps).context("restoring state from pinned maps")?;
        info!(restored_frontends = reconciler.frontend_count(), "state restored from pinned maps");

        let (tx, rx) = mpsc::channel(64);
        let source = tokio::spawn(manifests::run(dir.clone(), tx));
        let mut controller = Controller::new(reconciler);
        controller.run(rx, shutdown_signal()).await;
        if source.is_finished() {
            match source.await {
                Ok(Err(e)) => {
                    error!(dir = %dir.display(), "manifest source failed: {e}");
                    anyhow::bail!("manifest source failed: {e}");
                }
                Err(e) => anyhow::bail!("manifest source panicked: {e}"),
                Ok(Ok(())) => {}
            }
        }
        // Programs stay attached and maps pinned: the datapath keeps serving
        // until the next agent takes over.
        info!("stopping; datapath left in place");
        Ok(())
    })
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
