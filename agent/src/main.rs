mod cli;

use std::sync::Arc;

use anyhow::{Context as _, Result};
use cli::{Cli, Command, Inspect, LogFormat, Output, RunArgs};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use kube::runtime::events::{Recorder, Reporter};
use weir_agent::{
    cleanup,
    controller::{Controller, Hooks},
    ct_gc::{self, CtGc},
    datapath::{Datapath, LoadOptions, devices, kernel, lock, pins::Pins},
    healthcheck::{self, HealthChecks},
    inspect,
    maps::pinned::PinnedMaps,
    model::{LbOptions, NodeInfo, NodePortAddresses},
    node_addrs,
    reconciler::Reconciler,
    report::{Reports, events, lease},
    sockdestroy::{self, SocketReaper},
    source::SourceMsg,
    source::kube::{Connection, KubeSource},
    source::manifests,
    store::{Change, Store, StoreOptions},
    telemetry::{
        Health, Metrics, conns,
        http::{self, Routes},
        status::{SourceInfo, StatusBoard},
    },
};

fn main() -> Result<()> {
    weir_agent::heap::tune();
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let mut cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let config_warnings = match cli.run.config.clone() {
        Some(path) => cli::apply_config(&path, &mut cli.run, &matches)?,
        None => Vec::new(),
    };
    init_logging(cli.run.log_format, cli.run.verbosity);
    for w in config_warnings {
        warn!("{w}");
    }
    match cli.command {
        Some(Command::Inspect { what }) => {
            // `inspect conntrack | head` should end quietly, as any Unix
            // filter does, not panic in `print!`: restore SIGPIPE's default,
            // which Rust's runtime sets to ignored.
            // SAFETY: called before any other thread exists.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            run_inspect(what)
        }
        Some(Command::Cleanup { bpffs, force }) => {
            let done = cleanup::cleanup_unless_running(&Pins::new(&bpffs.path), force)?;
            println!("detached {} links, removed {} pins", done.links, done.pins);
            Ok(())
        }
        Some(Command::CleanupKubeProxy { dry_run }) => {
            let outcome = weir_agent::kube_proxy_cleanup::cleanup(dry_run);
            print!("{outcome}");
            Ok(outcome.result()?)
        }
        Some(Command::Completions { shell }) => Ok(cli::write_completions(
            shell,
            &mut std::io::stdout().lock(),
        )?),
        None => run(cli.run),
    }
}

fn run_inspect(what: Inspect) -> Result<()> {
    fn print<T: serde::Serialize + Sync>(
        views: &[T],
        output: Output,
        table: impl Fn(&[T]) -> String,
    ) -> Result<()> {
        use std::io::Write as _;
        // Written as it is encoded: at 100k Services the JSON is over 100
        // MiB, and building it as one String first cost a third of the
        // command's time in page faults.
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        match output {
            Output::Table => write!(out, "{}", table(views))?,
            Output::Json => {
                inspect::json::write_array(&mut out, views)?;
                writeln!(out)?;
            }
        }
        out.flush()?;
        Ok(())
    }
    match what {
        Inspect::Services { bpffs, output } => {
            let pins = Pins::new(bpffs.path);
            let maps = PinnedMaps::open(&pins.maps())
                .with_context(|| format!("no Weir maps pinned under {}", pins.maps().display()))?;
            let views = inspect::read_services(&maps)?;
            print(&views, output, inspect::render_table)
        }
        Inspect::Conntrack { bpffs, output } => {
            let maps = Pins::new(bpffs.path).maps();
            let entries = inspect::read_conntrack(&maps)
                .with_context(|| format!("no conntrack maps pinned under {}", maps.display()))?;
            let views = inspect::conntrack::conntrack(&entries, ct_gc::monotonic_secs());
            print(&views, output, inspect::conntrack::render_table)
        }
        Inspect::Status {
            bpffs,
            agent,
            output,
        } => {
            let addr = inspect::status::agent_address(&agent)
                .with_context(|| format!("--agent {agent:?} is not ip:port or an IP"))?;
            let view = inspect::status::read(&Pins::new(bpffs.path), addr);
            match output {
                Output::Table => print!("{}", inspect::status::render(&view)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&view)?),
            }
            Ok(())
        }
        Inspect::Stats { bpffs, output } => {
            let maps = Pins::new(bpffs.path).maps();
            let views = inspect::read_stats(&maps)
                .with_context(|| format!("no stats map pinned under {}", maps.display()))?;
            print(&views, output, inspect::stats::render_table)
        }
    }
}

fn init_logging(format: LogFormat, verbosity: Option<u8>) {
    use tracing_subscriber::EnvFilter;
    // kube-proxy's klog levels: 2 is its usual steady-state detail, 4 the
    // per-change detail runbooks ask for when debugging.
    let filter = match verbosity {
        Some(0..=2) => EnvFilter::new("info"),
        Some(3..=4) => EnvFilter::new("debug"),
        Some(_) => EnvFilter::new("trace"),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a container's log is a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run(args: RunArgs) -> Result<()> {
    if let Some(dir) = &args.manifests
        && !dir.is_dir()
    {
        anyhow::bail!("--manifests {}: not a directory", dir.display());
    }
    if args.packet.ct_gc_interval.is_zero() {
        anyhow::bail!("--ct-gc-interval must be more than 0s");
    }
    if args.packet.device_rescan_interval.is_zero() {
        anyhow::bail!("--device-rescan-interval must be more than 0s");
    }
    let node_port_addresses = NodePortAddresses::parse(&args.packet.nodeport_addresses)
        .map_err(|e| anyhow::anyhow!("--nodeport-addresses: {e}"))?;
    if node_port_addresses == NodePortAddresses::Primary && args.manifests.is_some() {
        anyhow::bail!(
            "--nodeport-addresses primary needs the Node object, which --manifests has not: give CIDRs"
        );
    }
    if !args.cluster_cidr.is_empty() {
        let cidrs: Vec<String> = args.cluster_cidr.iter().map(ToString::to_string).collect();
        info!(
            cluster_cidr = cidrs.join(","),
            "--cluster-cidr has no effect: Weir load balances pod traffic at its sockets and needs no cluster CIDR to tell it from outside traffic"
        );
    }
    let node = match &args.node_name {
        Some(n) if !n.is_empty() => n.clone(),
        _ => hostname().context("--node-name not given and the hostname cannot be read")?,
    };
    // First: a second agent on these pins fails here at once, naming the
    // first, before it binds ports (which it would retry for 10 s).
    let _lock = lock::lock_pins(&Pins::new(&args.bpffs.path))?;
    match conns::raise_nofile_limit() {
        Ok((soft, _)) => info!(open_files = soft, "descriptor limit"),
        Err(e) => warn!("cannot raise the descriptor limit: {e}"),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run_async(args, node, node_port_addresses))
}

async fn run_async(
    args: RunArgs,
    node: String,
    node_port_addresses: NodePortAddresses,
) -> Result<()> {
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new(args.healthz_timeout.into()));
    // Before the datapath loads: an agent that cannot serve what it was told
    // to (kube-proxy holds the ports) exits without having taken any traffic
    // from kube-proxy.
    let (metrics_listener, healthz_listener) = tokio::try_join!(
        http::bind_flag("--metrics-addr", &args.metrics_addr, 10249),
        http::bind_flag("--healthz-addr", &args.healthz_addr, 10256),
    )?;
    if let Some(l) = metrics_listener {
        let configz: Arc<str> = cli::configz(&args, &node).into();
        let board = Arc::new(StatusBoard {
            started: std::time::SystemTime::now(),
            node: node.clone(),
            source: match &args.manifests {
                Some(dir) => SourceInfo::Manifests {
                    dir: dir.display().to_string(),
                },
                None => SourceInfo::Api,
            },
            health: health.clone(),
            last_sync: metrics.last_sync.clone(),
            api: metrics.rest_client.contact(),
        });
        let routes = Routes::Metrics(metrics.clone(), configz, board);
        tokio::spawn(http::serve(l, routes));
    }
    if let Some(l) = healthz_listener {
        let routes = Routes::Health(health.clone(), metrics.clone());
        tokio::spawn(http::serve(l, routes));
    }

    let packet = &args.packet;
    // Every flag is checked before anything loads.
    let (mut device_patterns, mut accel_patterns) = packet.device_patterns()?;
    let mut config = packet.datapath_config()?;
    let release = kernel::release();
    // `auto` (the chart's default) is best effort: on a kernel too old for
    // the packet path the agent still replaces kube-proxy for socket traffic
    // and says what is missing. Devices named explicitly are a requirement.
    if let Ok(r) = &release
        && !device_patterns.is_empty()
        && device_patterns.iter().all(|p| *p == devices::Pattern::Auto)
        && let Err(e) = kernel::flags(r, true)
    {
        warn!(
            "{e}; --devices=auto: NodePort, externalIPs and LoadBalancer IPs from outside are not served"
        );
        device_patterns.clear();
        accel_patterns.clear();
    }
    config.flags |= match release {
        Ok(release) => kernel::flags(&release, !device_patterns.is_empty())?,
        // Socket load balancing only: nothing depends on the version.
        Err(e) if device_patterns.is_empty() => {
            warn!("{e:#}");
            0
        }
        Err(e) => return Err(e.into()),
    };
    if !device_patterns.is_empty() {
        kernel::check_snat_range(packet.snat_port_range);
    }
    let addresses = node_addrs::node_addresses()?;
    info!(addresses = ?addresses, "node addresses");
    let opts = LoadOptions {
        max_services: args.max_services,
        max_backends: args.max_backends,
        ct_max: packet.ct_max,
        max_revsock: packet.max_revsock,
        max_maglev: LoadOptions::maglev_chunks(packet.max_maglev_tables, packet.maglev_table_size),
        socket_lb: packet.socket_lb,
        devices: device_patterns,
        acceleration_devices: accel_patterns,
        acceleration: packet.acceleration.into(),
        config,
        ..LoadOptions::new(Pins::new(&args.bpffs.path), args.cgroup.clone())
    };
    // The source starts first: its initial list (seconds at 100k Services)
    // runs while the datapath loads and the pinned maps are read. It
    // collects the list into one batch, so nothing waits on the controller.
    let (tx, rx) = mpsc::channel(64);
    // Weak: the controller stops when the real source is gone, and the node
    // address watcher must not keep it alive.
    let weak = tx.downgrade();
    let (reports, report_rx) = Reports::channel(1024);
    // Standalone mode has no API server to write Events to.
    let reports = if args.manifests.is_some() {
        Reports::none()
    } else {
        reports
    };
    let source = match &args.manifests {
        Some(dir) => tokio::spawn(manifests::run(dir.clone(), tx)),
        None => {
            let conn = Connection {
                kubeconfig: args.kubeconfig.clone(),
                api_server: args.k8s_api_server.clone(),
                metrics: Some(metrics.rest_client.clone()),
            };
            let client = conn
                .client()
                .await
                .context("connecting to the API server")?;
            let uids = events::Uids::default();
            let recorder = Recorder::new(
                client.clone(),
                Reporter {
                    controller: "weir-agent".into(),
                    instance: Some(node.clone()),
                },
            );
            tokio::spawn(events::run(recorder, uids.clone(), report_rx));
            tokio::spawn(lease::run(
                client.clone(),
                args.namespace.clone(),
                node.clone(),
            ));
            let source = KubeSource {
                client,
                node: node.clone(),
                uids,
                streaming_lists: args.streaming_lists,
                reports: reports.clone(),
                metrics: metrics.clone(),
                health: health.clone(),
            };
            tokio::spawn(async move {
                source.run(tx).await;
                Ok(())
            })
        }
    };
    let Datapath { maps, devices } = Datapath::load(&opts).context("loading the datapath")?;
    let attached = devices.attached();
    if !opts.devices.is_empty() {
        devices
            .spawn(packet.device_rescan_interval.into())
            .context("starting the device watcher")?;
    }
    info!(
        cgroup = %opts.cgroup.display(),
        bpffs = %opts.pins.root().display(),
        node = %node,
        socket_lb = opts.socket_lb,
        devices = ?attached,
        "datapath attached"
    );
    let reconciler = Reconciler::restore(maps).context("restoring state from pinned maps")?;
    info!(
        restored_frontends = reconciler.frontend_count(),
        "state restored from pinned maps"
    );
    // Without a packet datapath nothing fills the conntrack maps, but they
    // exist all the same (flows of an earlier run may still be there).
    match CtGc::open(&opts.pins.maps()) {
        Ok(gc) => {
            let (m, ms, mr) = (metrics.clone(), metrics.clone(), metrics.clone());
            gc.with_stats(move |s, n| ms.add_datapath_packets(s.program, s.reason, n))
                .with_revsock(move |n, cap| mr.set_named_map_usage(weir_abi::MAP_REVSOCK, n, cap))
                .spawn(packet.ct_gc_interval.into(), move |r| m.observe_gc(r))
                .context("starting the conntrack collector")?;
        }
        Err(e) => warn!("no conntrack garbage collection: {e}"),
    }

    node_addrs::watch(addresses.clone(), NODE_ADDRESS_BACKSTOP, move |fresh| {
        weak.upgrade().is_some_and(|tx| {
            tx.blocking_send(SourceMsg::Changes(vec![Change::NodeAddresses(fresh)]))
                .is_ok()
        })
    })
    .context("starting the node address watcher")?;
    let sockets = match sockdestroy::open_revsock(&opts.pins.maps()) {
        Ok(revsock) => SocketReaper::spawn(revsock, args.proc_root.clone()),
        Err(e) => {
            warn!(
                "cannot open {}: {e}; stale UDP sockets are not destroyed",
                weir_abi::MAP_REVSOCK
            );
            SocketReaper::default()
        }
    };
    let store = Store::with_options(
        NodeInfo {
            name: node.clone(),
            addresses,
            ..NodeInfo::default()
        },
        StoreOptions {
            node_port_addresses,
            node_port_range: packet.nodeport_range.0..=packet.nodeport_range.1,
            lb: LbOptions {
                algorithm: packet.lb_algorithm.into(),
                maglev_table_size: packet.maglev_table_size,
            },
        },
    );
    let sink = healthcheck::Sink {
        reports: reports.clone(),
        metrics: metrics.clone(),
    };
    let hooks = Hooks {
        metrics: metrics.clone(),
        health: health.clone(),
        reports: reports.clone(),
        health_checks: Arc::new(health_checks(&args, &health, sink)),
        sockets: Arc::new(sockets),
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

/// The healthCheckNodePort listeners, unless another component serves them.
fn health_checks(args: &RunArgs, health: &Arc<Health>, sink: healthcheck::Sink) -> HealthChecks {
    if args.health_check_node_ports {
        HealthChecks::serve_all(health.clone(), sink)
    } else {
        info!(
            "--health-check-node-ports=false: healthCheckNodePorts are left to another component"
        );
        HealthChecks::default()
    }
}

/// How often the node addresses are read again when no change was announced
/// (or change notifications cannot be had).
const NODE_ADDRESS_BACKSTOP: std::time::Duration = std::time::Duration::from_secs(30);

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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_check_node_ports_can_be_left_to_kube_proxy() {
        let health = Arc::new(Health::new(std::time::Duration::from_secs(60)));
        let on = cli::tests::run_args(&[]);
        assert!(on.health_check_node_ports);
        assert!(health_checks(&on, &health, healthcheck::Sink::default()).is_serving());
        let off = cli::tests::run_args(&["--health-check-node-ports=false"]);
        assert!(!health_checks(&off, &health, healthcheck::Sink::default()).is_serving());
    }
}
