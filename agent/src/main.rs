use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use kube::runtime::events::{Recorder, Reporter};
use weir_agent::{
    cleanup,
    controller::{Controller, Hooks},
    ct_gc::{self, CtGc},
    datapath::{Acceleration, Datapath, LoadOptions, devices, kernel, lock, pins::Pins},
    healthcheck::{self, HealthChecks},
    inspect,
    maps::pinned::PinnedMaps,
    model::NodeInfo,
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
    },
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
    /// Take the initial Services and EndpointSlices as a watch stream
    /// (`sendInitialEvents`) instead of paginated lists: no page of 500
    /// objects buffered at a time, and one request per kind. Needs an API
    /// server with the WatchList feature (beta from Kubernetes 1.32); one
    /// without it refuses the watch, and the agent then never syncs.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    streaming_lists: bool,
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
    /// Serve the healthCheckNodePorts of externalTrafficPolicy: Local
    /// Services. false where another component serves them, e.g. kube-proxy
    /// on the same node during a migration (both would want the same ports).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    health_check_node_ports: bool,
    /// cgroup v2 directory the socket programs attach to; sockets of processes
    /// in it and below are load balanced.
    #[arg(long, value_name = "PATH", default_value = "/sys/fs/cgroup")]
    cgroup: PathBuf,
    /// The node's /proc, where the network namespaces of its processes are
    /// found (to destroy pods' UDP sockets connected to removed backends).
    /// In a container, mount the host's /proc (e.g. at /host/proc) and give
    /// that; the container's own /proc only shows its own processes.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    proc_root: PathBuf,
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

/// Settings of the per-packet (TC/XDP) datapath and its connection tracking.
#[derive(clap::Args, Debug)]
struct PacketArgs {
    /// Load balance ClusterIP traffic at the socket (connect/sendmsg), in
    /// every cgroup below --cgroup. When false, hooks left by an earlier run
    /// are detached.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    socket_lb: bool,
    /// Capacity of the socket hooks' reverse-translation map: open sockets
    /// (and unconnected UDP socket × backend pairs) whose peer they
    /// translated. Closed sockets leave it at once. When more are open, the
    /// least recently used lose their entry, and those sockets then show
    /// the backend, not the ClusterIP, as their peer; watch
    /// weir_map_entries{map="WEIR_REVSOCK"} against weir_map_capacity.
    #[arg(long, value_name = "N", default_value_t = weir_abi::DEFAULT_MAX_REVSOCK)]
    max_revsock: u32,
    /// Devices for the per-packet TC program (external devices and pod
    /// veths): exact names, prefixes ending in '+' (`lxc+`, `cali+`) that
    /// match every interface starting so, or `auto`: every interface that
    /// carries a default route (IPv4 or IPv6) in the agent's network
    /// namespace plus every veth (the host side of pods). Interfaces are
    /// re-listed as soon as the kernel announces a link (for `auto`, also a
    /// route) change, so new and recreated devices get the program and
    /// vanished ones lose it; a listed device missing at start is attached
    /// when it appears. Only Ethernet devices qualify. Needs Linux 6.7+.
    /// None: socket load balancing only.
    #[arg(long, value_name = "DEV,...", value_delimiter = ',')]
    devices: Vec<String>,
    /// How often --devices are re-listed even when the kernel announced no
    /// change (a backstop; without link notifications they are re-listed
    /// every 5 s).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    device_rescan_interval: humantime::Duration,
    /// The --devices that also get XDP when --acceleration is on (same
    /// syntax, but `auto` here means the default-route devices only, never
    /// veths; default: all of --devices, so `--devices=auto` accelerates the
    /// default-route devices). XDP goes only where the TC
    /// program is too (it hands SNAT flows to TC on the same device). Do not
    /// give pod veths (`lxc+`, `cali+`) XDP: frames from pods reach a veth's
    /// XDP as CHECKSUM_PARTIAL, and native XDP on a veth disables GSO on its
    /// peer; list the external NICs only.
    #[arg(long, value_name = "DEV,...", value_delimiter = ',')]
    acceleration_devices: Vec<String>,
    /// Source ports the per-packet datapath uses when it SNATs (NodePort,
    /// externalIP and LoadBalancer traffic forwarded to another node). Must
    /// stay outside net.ipv4.ip_local_port_range (or be reserved with
    /// net.ipv4.ip_local_reserved_ports): the programs cannot see the node's
    /// own sockets.
    #[arg(long, value_name = "FROM-TO", default_value = "61000-65535", value_parser = parse_port_range)]
    snat_port_range: (u16, u16),
    /// NodePort range.
    #[arg(long, value_name = "FROM-TO", default_value = "30000-32767", value_parser = parse_port_range)]
    nodeport_range: (u16, u16),
    /// XDP acceleration of NodePort/external traffic on --devices: native
    /// (required on every device), best-effort (where the driver supports it)
    /// or disabled.
    #[arg(long, value_enum, default_value_t = AccelerationArg::Disabled)]
    acceleration: AccelerationArg,
    /// Conntrack timeout of a TCP flow before the backend answers.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    ct_timeout_tcp_syn: humantime::Duration,
    /// Conntrack timeout of an established TCP flow.
    #[arg(long, value_name = "DURATION", default_value = "6h")]
    ct_timeout_tcp: humantime::Duration,
    /// Conntrack timeout of a TCP flow after FIN or RST.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    ct_timeout_tcp_fin: humantime::Duration,
    /// Conntrack timeout of a UDP (and SCTP) flow.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    ct_timeout_udp: humantime::Duration,
    /// How often expired conntrack entries are removed.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    ct_gc_interval: humantime::Duration,
    /// Capacity of each conntrack map (TCP, UDP); a flow takes two entries.
    #[arg(long, value_name = "N", default_value_t = weir_abi::DEFAULT_MAX_CT)]
    ct_max: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum AccelerationArg {
    Disabled,
    Native,
    BestEffort,
}

impl From<AccelerationArg> for Acceleration {
    fn from(a: AccelerationArg) -> Self {
        match a {
            AccelerationArg::Disabled => Self::Disabled,
            AccelerationArg::Native => Self::Native,
            AccelerationArg::BestEffort => Self::BestEffort,
        }
    }
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
    /// The conntrack timeouts as `WEIR_CONFIG` holds them (whole seconds).
    fn datapath_config(&self) -> Result<weir_abi::Config> {
        let secs = |d: humantime::Duration, flag: &str| -> Result<u32> {
            let s = d.as_secs();
            if s == 0 {
                anyhow::bail!("{flag} must be at least 1s");
            }
            u32::try_from(s).with_context(|| format!("{flag} is too long"))
        };
        Ok(weir_abi::Config {
            ct_tcp_syn: secs(self.ct_timeout_tcp_syn, "--ct-timeout-tcp-syn")?,
            ct_tcp_established: secs(self.ct_timeout_tcp, "--ct-timeout-tcp")?,
            ct_tcp_closing: secs(self.ct_timeout_tcp_fin, "--ct-timeout-tcp-fin")?,
            ct_udp: secs(self.ct_timeout_udp, "--ct-timeout-udp")?,
            // LoadOptions sets CFG_F_SOCKET_LB from --socket-lb; run() adds
            // the kernel's.
            flags: 0,
            snat_port_min: self.snat_port_range.0,
            snat_port_max: self.snat_port_range.1,
        })
    }

    /// `--devices` and `--acceleration-devices` (default: the former) as
    /// patterns, the bad entry named.
    fn device_patterns(&self) -> Result<(Vec<devices::Pattern>, Vec<devices::Pattern>)> {
        let devs =
            devices::parse_patterns(&self.devices, "--devices").map_err(anyhow::Error::msg)?;
        let accel = if self.acceleration_devices.is_empty() {
            devs.clone()
        } else {
            devices::parse_patterns(&self.acceleration_devices, "--acceleration-devices")
                .map_err(anyhow::Error::msg)?
        };
        Ok((devs, accel))
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
    /// Detach every program and remove every pin; refused while an agent runs on them.
    Cleanup {
        #[command(flatten)]
        bpffs: BpffsArg,
        /// Clean up even though an agent holds the pins (it keeps running, unserved).
        #[arg(long)]
        force: bool,
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
    /// Every VIP:port/proto with its flags, backends and their states.
    Services {
        #[command(flatten)]
        bpffs: BpffsArg,
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Every tracked flow of the per-packet datapath, both directions.
    Conntrack {
        #[command(flatten)]
        bpffs: BpffsArg,
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Packet and byte counters per program and outcome, summed over CPUs.
    Stats {
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
    weir_agent::heap::tune();
    let cli = Cli::parse();
    let format = cli.run.log_format;
    init_logging(format);
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
        Inspect::Stats { bpffs, output } => {
            let maps = Pins::new(bpffs.path).maps();
            let views = inspect::read_stats(&maps)
                .with_context(|| format!("no stats map pinned under {}", maps.display()))?;
            print(&views, output, inspect::stats::render_table)
        }
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
    rt.block_on(run_async(args, node))
}

async fn run_async(args: RunArgs, node: String) -> Result<()> {
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new(args.healthz_timeout.into()));
    // Before the datapath loads: an agent that cannot serve what it was told
    // to (kube-proxy holds the ports) exits without having taken any traffic
    // from kube-proxy.
    let (metrics_listener, healthz_listener) = tokio::try_join!(
        http::bind_flag("--metrics-addr", &args.metrics_addr),
        http::bind_flag("--healthz-addr", &args.healthz_addr),
    )?;
    if let Some(l) = metrics_listener {
        tokio::spawn(http::serve(l, Routes::Metrics(metrics.clone())));
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
            zone: None,
            addresses,
        },
        StoreOptions {
            node_port_range: packet.nodeport_range.0..=packet.nodeport_range.1,
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

    fn run_args(extra: &[&str]) -> RunArgs {
        let mut argv = vec!["weir-agent"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).expect("flags parse").run
    }

    #[test]
    fn default_timeouts_are_the_abi_defaults() {
        let cfg = run_args(&[]).packet.datapath_config().unwrap();
        let d = weir_abi::DEFAULT_CONFIG;
        assert_eq!(
            (
                cfg.ct_tcp_syn,
                cfg.ct_tcp_established,
                cfg.ct_tcp_closing,
                cfg.ct_udp
            ),
            (
                d.ct_tcp_syn,
                d.ct_tcp_established,
                d.ct_tcp_closing,
                d.ct_udp
            )
        );
        let a = run_args(&[]);
        assert!(a.packet.socket_lb);
        assert!(a.packet.devices.is_empty());
        assert_eq!(a.packet.nodeport_range, (30000, 32767));
        assert_eq!(
            (cfg.snat_port_min, cfg.snat_port_max),
            (d.snat_port_min, d.snat_port_max)
        );
        assert_eq!(a.proc_root, PathBuf::from("/proc"));
        assert_eq!(a.packet.ct_max, weir_abi::DEFAULT_MAX_CT);
        assert_eq!(
            Acceleration::from(a.packet.acceleration),
            Acceleration::Disabled
        );
    }

    #[test]
    fn packet_flags_parse() {
        let a = run_args(&[
            "--devices=eth0,eth1.100",
            "--acceleration=best-effort",
            "--socket-lb=false",
            "--ct-timeout-udp=2s",
            "--ct-timeout-tcp=1h",
            "--nodeport-range=20000-22767",
            "--snat-port-range=40000-40999",
        ]);
        assert_eq!(a.packet.devices, ["eth0", "eth1.100"]);
        let (devs, accel) = a.packet.device_patterns().unwrap();
        assert_eq!(devs, accel, "acceleration devices default to --devices");
        assert_eq!(
            Acceleration::from(a.packet.acceleration),
            Acceleration::BestEffort
        );
        assert!(!a.packet.socket_lb);
        let cfg = a.packet.datapath_config().unwrap();
        assert_eq!((cfg.ct_udp, cfg.ct_tcp_established), (2, 3600));
        assert_eq!(a.packet.nodeport_range, (20000, 22767));
        assert_eq!((cfg.snat_port_min, cfg.snat_port_max), (40000, 40999));
    }

    #[test]
    fn device_patterns_and_acceleration_devices() {
        let a = run_args(&["--devices=eth0,lxc+", "--acceleration-devices=eth0"]);
        let (devs, accel) = a.packet.device_patterns().unwrap();
        assert_eq!(
            devs,
            [
                devices::Pattern::Exact("eth0".into()),
                devices::Pattern::Prefix("lxc".into())
            ]
        );
        assert_eq!(accel, [devices::Pattern::Exact("eth0".into())]);
        let e = run_args(&["--devices=+"])
            .packet
            .device_patterns()
            .unwrap_err();
        assert!(e.to_string().contains("--devices"), "{e}");
    }

    #[test]
    fn snat_range_is_validated_and_checked_for_overlap() {
        for bad in [
            "--snat-port-range=65000-61000",
            "--snat-port-range=0-10",
            "--snat-port-range=61000",
            "--snat-port-range=61000-70000",
        ] {
            assert!(Cli::try_parse_from(["weir-agent", bad]).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn health_check_node_ports_can_be_left_to_kube_proxy() {
        let health = Arc::new(Health::new(std::time::Duration::from_secs(60)));
        let on = run_args(&[]);
        assert!(on.health_check_node_ports);
        assert!(health_checks(&on, &health, healthcheck::Sink::default()).is_serving());
        let off = run_args(&["--health-check-node-ports=false"]);
        assert!(!health_checks(&off, &health, healthcheck::Sink::default()).is_serving());
    }

    #[test]
    fn zero_timeouts_are_refused_by_name() {
        let e = run_args(&["--ct-timeout-tcp-fin=0s"])
            .packet
            .datapath_config()
            .unwrap_err();
        assert!(e.to_string().contains("--ct-timeout-tcp-fin"), "{e}");
    }
}
