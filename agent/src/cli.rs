//! The agent's command line: the flags of a run (named and documented as
//! users meet them in `--help`), the subcommands, and the checks that turn
//! flags into the datapath's settings.
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use weir_agent::{
    datapath::{Acceleration, devices},
    model::{Cidr, LbAlgorithm},
};

mod config_file;
pub(crate) use config_file::{apply_config, configz};

/// Weir's node agent: replaces kube-proxy with eBPF socket load balancing.
#[derive(Parser, Debug)]
#[command(name = "weir-agent", version, args_conflicts_with_subcommands = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// kube-proxy's configuration file (KubeProxyConfiguration,
    /// kubeproxy.config.k8s.io/v1alpha1). Its fields fill the settings not
    /// given on the command line or in the environment; fields Weir does
    /// not act on are logged once each, and ones asking for behaviour it
    /// lacks (masqueradeAll) are refused.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Directory of Service and EndpointSlice manifests (standalone mode, no API server).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kubeconfig", "k8s_api_server"])]
    pub(crate) manifests: Option<PathBuf>,
    /// kubeconfig for the API server. Without it (and without --manifests) the
    /// pod's service account is used.
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The API server as host:port, replacing the configured address. Needed in
    /// a cluster without kube-proxy: the `kubernetes` ClusterIP only works once
    /// this agent has programmed it.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) k8s_api_server: Option<String>,
    /// Take the initial Services and EndpointSlices as a watch stream
    /// (`sendInitialEvents`) instead of paginated lists: no page of 500
    /// objects buffered at a time, and one request per kind. Needs an API
    /// server with the WatchList feature (beta from Kubernetes 1.32); one
    /// without it refuses the watch, and the agent then never syncs.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub(crate) streaming_lists: bool,
    /// This node's name: endpoints with this nodeName are local.
    #[arg(
        long,
        env = "NODE_NAME",
        value_name = "NAME",
        visible_alias = "hostname-override"
    )]
    pub(crate) node_name: Option<String>,
    /// Namespace of the agent's Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    pub(crate) namespace: String,
    /// Prometheus metrics address (kube-proxy's default); an IP alone means
    /// port 10249, as in kube-proxy; empty to disable.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:10249",
        visible_alias = "metrics-bind-address"
    )]
    pub(crate) metrics_addr: String,
    /// /healthz and /livez address (kube-proxy's default, which cloud load
    /// balancers probe); an IP alone means port 10256; empty to disable.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "0.0.0.0:10256",
        visible_alias = "healthz-bind-address"
    )]
    pub(crate) healthz_addr: String,
    /// kube-proxy's cluster CIDRs, accepted so its manifests and runbooks
    /// keep working. Weir has no use for them: kube-proxy needs them to
    /// tell pod traffic from outside traffic in netfilter, and Weir load
    /// balances pods at their sockets. Given, they are checked and logged.
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',', value_parser = parse_cidr)]
    pub(crate) cluster_cidr: Vec<Cidr>,
    /// Log verbosity as kube-proxy's `-v`/`--v`: 0–2 info, 3–4 debug, 5 and
    /// more trace. Without it, RUST_LOG decides (info by default).
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    pub(crate) verbosity: Option<u8>,
    /// /healthz fails when a change has waited this long to reach the maps.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub(crate) healthz_timeout: humantime::Duration,
    /// Serve the healthCheckNodePorts of externalTrafficPolicy: Local
    /// Services. false where another component serves them, e.g. kube-proxy
    /// on the same node during a migration (both would want the same ports).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) health_check_node_ports: bool,
    /// cgroup v2 directory the socket programs attach to; sockets of processes
    /// in it and below are load balanced.
    #[arg(long, value_name = "PATH", default_value = "/sys/fs/cgroup")]
    pub(crate) cgroup: PathBuf,
    /// The node's /proc, where the network namespaces of its processes are
    /// found (to destroy pods' UDP sockets connected to removed backends).
    /// In a container, mount the host's /proc (e.g. at /host/proc) and give
    /// that; the container's own /proc only shows its own processes.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub(crate) proc_root: PathBuf,
    #[command(flatten)]
    pub(crate) bpffs: BpffsArg,
    /// Capacity of the services map: a master entry per frontend, which holds
    /// its first 11 backends, plus a slot per 11 backends past those.
    #[arg(long, value_name = "N", default_value_t = weir_abi::DEFAULT_MAX_SERVICES)]
    pub(crate) max_services: u32,
    /// Capacity of the backends map.
    #[arg(long, value_name = "N", default_value_t = weir_abi::DEFAULT_MAX_BACKENDS)]
    pub(crate) max_backends: u32,
    #[command(flatten)]
    pub(crate) packet: PacketArgs,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// Settings of the per-packet (TC/XDP) datapath and its connection tracking.
#[derive(clap::Args, Debug)]
pub(crate) struct PacketArgs {
    /// Load balance ClusterIP traffic at the socket (connect/sendmsg), in
    /// every cgroup below --cgroup. When false, hooks left by an earlier run
    /// are detached.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) socket_lb: bool,
    /// Capacity of the socket hooks' reverse-translation map: open sockets
    /// (and unconnected UDP socket × backend pairs) whose peer they
    /// translated. Closed sockets leave it at once. When more are open, the
    /// least recently used lose their entry, and those sockets then show
    /// the backend, not the ClusterIP, as their peer; watch
    /// weir_map_entries{map="WEIR_REVSOCK"} against weir_map_capacity.
    #[arg(long, value_name = "N", default_value_t = weir_abi::DEFAULT_MAX_REVSOCK)]
    pub(crate) max_revsock: u32,
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
    pub(crate) devices: Vec<String>,
    /// How often --devices are re-listed even when the kernel announced no
    /// change (a backstop; without link notifications they are re-listed
    /// every 5 s).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub(crate) device_rescan_interval: humantime::Duration,
    /// The --devices that also get XDP when --acceleration is on (same
    /// syntax, but `auto` here means the default-route devices only, never
    /// veths; default: all of --devices, so `--devices=auto` accelerates the
    /// default-route devices). XDP goes only where the TC
    /// program is too (it hands SNAT flows to TC on the same device). Do not
    /// give pod veths (`lxc+`, `cali+`) XDP: frames from pods reach a veth's
    /// XDP as CHECKSUM_PARTIAL, and native XDP on a veth disables GSO on its
    /// peer; list the external NICs only.
    #[arg(long, value_name = "DEV,...", value_delimiter = ',')]
    pub(crate) acceleration_devices: Vec<String>,
    /// Source ports the per-packet datapath uses when it SNATs (NodePort,
    /// externalIP and LoadBalancer traffic forwarded to another node). Must
    /// stay outside net.ipv4.ip_local_port_range (or be reserved with
    /// net.ipv4.ip_local_reserved_ports): the programs cannot see the node's
    /// own sockets.
    #[arg(long, value_name = "FROM-TO", default_value = "61000-65535", value_parser = parse_port_range)]
    pub(crate) snat_port_range: (u16, u16),
    /// NodePort range.
    #[arg(long, value_name = "FROM-TO", default_value = "30000-32767", value_parser = parse_port_range)]
    pub(crate) nodeport_range: (u16, u16),
    /// Which node addresses NodePorts listen on, as kube-proxy's
    /// nodePortAddresses: CIDRs (a family without one gets no NodePorts),
    /// or `primary`, the Node object's primary IPs (first InternalIP per
    /// family; API mode only). Default: every address of the node.
    #[arg(long, value_name = "CIDR,...|primary", value_delimiter = ',')]
    pub(crate) nodeport_addresses: Vec<String>,
    /// How the per-packet programs pick a backend for a new flow to a
    /// NodePort, externalIP or LoadBalancer frontend: random, or maglev
    /// (consistent hashing of the flow's addresses, ports and protocol,
    /// so every node sends a flow to the same backend, and a backend change
    /// moves few other flows). A Service's annotation
    /// weir.dev/lb-algorithm: random|maglev overrides it. Sockets and
    /// ClusterIP traffic always pick at random.
    #[arg(long, value_enum, default_value_t = LbAlgorithmArg::Random)]
    pub(crate) lb_algorithm: LbAlgorithmArg,
    /// Positions in each Maglev table: a prime from 251 to 131071, about
    /// 100 times the backends of the largest Service or more (each
    /// backend's share of flows is then within about 1% of the others).
    /// Every node must use the same size. A table takes about 4 bytes a
    /// position of kernel memory (in 4 KiB chunks of 1000 positions) per
    /// Maglev frontend: 68 KiB at the default.
    #[arg(long, value_name = "PRIME", default_value_t = weir_abi::maglev::DEFAULT_TABLE_SIZE, value_parser = parse_maglev_table_size)]
    pub(crate) maglev_table_size: u32,
    /// Maglev tables the map holds: one per NodePort (per node address),
    /// externalIP or LoadBalancer frontend that uses Maglev. The kernel
    /// reserves 16 bytes per 1000 positions of capacity up front (2 MiB at
    /// the defaults); the tables take their memory as they are written. A
    /// Service whose tables do not fit is refused with a MapFull Event.
    #[arg(long, value_name = "N", default_value_t = weir_abi::DEFAULT_MAX_MAGLEV_TABLES, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub(crate) max_maglev_tables: u32,
    /// XDP acceleration of NodePort/external traffic on --devices: native
    /// (required on every device), best-effort (where the driver supports it)
    /// or disabled.
    #[arg(long, value_enum, default_value_t = AccelerationArg::Disabled)]
    pub(crate) acceleration: AccelerationArg,
    /// Conntrack timeout of a TCP flow before the backend answers.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub(crate) ct_timeout_tcp_syn: humantime::Duration,
    /// Conntrack timeout of an established TCP flow.
    #[arg(long, value_name = "DURATION", default_value = "6h")]
    pub(crate) ct_timeout_tcp: humantime::Duration,
    /// Conntrack timeout of a TCP flow after FIN or RST.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub(crate) ct_timeout_tcp_fin: humantime::Duration,
    /// Conntrack timeout of a UDP (and SCTP) flow.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub(crate) ct_timeout_udp: humantime::Duration,
    /// How often expired conntrack entries are removed.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub(crate) ct_gc_interval: humantime::Duration,
    /// Capacity of each conntrack map (TCP, UDP); a flow takes two entries.
    #[arg(long, value_name = "N", default_value_t = weir_abi::DEFAULT_MAX_CT)]
    pub(crate) ct_max: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LbAlgorithmArg {
    Random,
    Maglev,
}

impl From<LbAlgorithmArg> for LbAlgorithm {
    fn from(a: LbAlgorithmArg) -> Self {
        match a {
            LbAlgorithmArg::Random => Self::Random,
            LbAlgorithmArg::Maglev => Self::Maglev,
        }
    }
}

pub(crate) fn parse_maglev_table_size(s: &str) -> Result<u32, String> {
    use weir_abi::maglev::{MAX_TABLE_SIZE, MIN_TABLE_SIZE};
    let n: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !(MIN_TABLE_SIZE..=MAX_TABLE_SIZE).contains(&n) {
        return Err(format!("{n} is outside {MIN_TABLE_SIZE}-{MAX_TABLE_SIZE}"));
    }
    // A prime, so that every backend's permutation visits every position.
    if (2..)
        .take_while(|d| d * d <= n)
        .any(|d| n.is_multiple_of(d))
    {
        return Err(format!("{n} is not a prime (16381, 32749 and 65521 are)"));
    }
    Ok(n)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum AccelerationArg {
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

pub(crate) fn parse_cidr(s: &str) -> Result<Cidr, String> {
    Cidr::parse(s).ok_or_else(|| format!("{s:?} is not a CIDR such as 10.244.0.0/16"))
}

pub(crate) fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
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
    pub(crate) fn datapath_config(&self) -> Result<weir_abi::Config> {
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
    pub(crate) fn device_patterns(&self) -> Result<(Vec<devices::Pattern>, Vec<devices::Pattern>)> {
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
pub(crate) struct BpffsArg {
    /// Directory on a bpf filesystem where maps and links are pinned.
    #[arg(long = "bpffs", value_name = "DIR", default_value = "/sys/fs/bpf/weir")]
    pub(crate) path: PathBuf,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
    /// Print a completion script for the shell, e.g.
    /// `weir-agent completions bash > /etc/bash_completion.d/weir-agent`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Writes the completion script of `weir-agent` for `shell`.
///
/// clap_complete's bash script completes nothing past a subcommand when the
/// binary's name has a hyphen (clap-rs/clap#6421, open): its dispatch loop
/// and its case arms spell the state differently. The script is generated
/// for `weir_agent` and registered for `weir-agent`.
pub(crate) fn write_completions(
    shell: clap_complete::Shell,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    const BIN: &str = "weir-agent";
    const SPELLED: &str = "weir_agent";
    let mut cmd = <Cli as clap::CommandFactory>::command();
    if shell != clap_complete::Shell::Bash {
        clap_complete::generate(shell, &mut cmd, BIN, out);
        return Ok(());
    }
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, SPELLED, &mut script);
    let script = String::from_utf8_lossy(&script);
    out.write_all(
        script
            .replace(&format!(" {SPELLED}\n"), &format!(" {BIN}\n"))
            .as_bytes(),
    )
}

#[derive(Subcommand, Debug)]
pub(crate) enum Inspect {
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
    /// One screen: the agent's health, last sync and API server contact
    /// (asked of the running agent), the hooks and devices it attached and
    /// each map's pressure (read from the pins).
    Status {
        #[command(flatten)]
        bpffs: BpffsArg,
        /// The agent's --metrics-addr, where it serves /statusz; an IP
        /// alone means port 10249, and an unspecified address (0.0.0.0,
        /// ::) is reached on loopback.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:10249")]
        agent: String,
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The flags of a run, as `weir-agent <extra>` parses them.
    pub(crate) fn run_args(extra: &[&str]) -> RunArgs {
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
    fn lb_algorithm_and_maglev_table_size() {
        let a = run_args(&[]);
        assert_eq!(
            LbAlgorithm::from(a.packet.lb_algorithm),
            LbAlgorithm::Random
        );
        assert_eq!(a.packet.maglev_table_size, 16_381);
        assert_eq!(a.packet.max_maglev_tables, 4_096);
        let zero = ["weir-agent", "--max-maglev-tables=0"];
        assert!(Cli::try_parse_from(zero).is_err());
        let a = run_args(&["--lb-algorithm=maglev", "--maglev-table-size=65521"]);
        assert_eq!(
            LbAlgorithm::from(a.packet.lb_algorithm),
            LbAlgorithm::Maglev
        );
        assert_eq!(a.packet.maglev_table_size, 65_521);
        for bad in ["16383", "250", "131101", "x"] {
            assert!(parse_maglev_table_size(bad).is_err(), "{bad}");
        }
        assert!(
            parse_maglev_table_size("16383")
                .unwrap_err()
                .contains("not a prime")
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

    #[test]
    fn kube_proxy_flag_names_are_accepted() {
        let a = run_args(&[
            "--hostname-override=node-1",
            "--metrics-bind-address=0.0.0.0",
            "--healthz-bind-address",
            "[::]:10256",
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            "-v=4",
        ]);
        assert_eq!(a.node_name.as_deref(), Some("node-1"));
        assert_eq!(a.metrics_addr, "0.0.0.0");
        assert_eq!(a.healthz_addr, "[::]:10256");
        assert_eq!(a.cluster_cidr.len(), 2);
        assert_eq!(a.verbosity, Some(4));
        assert_eq!(run_args(&["--v=2"]).verbosity, Some(2));
        assert_eq!(run_args(&["-v", "5"]).verbosity, Some(5));
        let e = Cli::try_parse_from(["weir-agent", "--cluster-cidr=10.244.0.0"]).unwrap_err();
        assert!(e.to_string().contains("is not a CIDR"), "{e}");
    }

    /// What bash offers after `line` once the script is sourced, as the
    /// shell calls the completion function on a TAB.
    fn bash_completes(script: &std::path::Path, words: &[&str]) -> String {
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let cword = words.len() - 1;
        let prev = words[cword.saturating_sub(1)];
        let cur = words[cword];
        let body = format!(
            "source {script} || exit 1; f=$(complete -p weir-agent | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p'); \
             COMP_WORDS=({words}); COMP_CWORD={cword}; \
             $f weir-agent '{cur}' '{prev}'; echo \"${{COMPREPLY[*]}}\"",
            script = script.display(),
            words = quoted.join(" "),
        );
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(body)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    #[test]
    fn bash_completes_flags_subcommands_and_their_flags() {
        let mut script = Vec::new();
        write_completions(clap_complete::Shell::Bash, &mut script).unwrap();
        let dir = std::env::temp_dir().join(format!("weir-completion-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("weir-agent.bash");
        std::fs::write(&file, &script).unwrap();
        let got = [
            bash_completes(&file, &["weir-agent", "--hostname-o"]),
            bash_completes(&file, &["weir-agent", "insp"]),
            bash_completes(&file, &["weir-agent", "inspect", "con"]),
            bash_completes(&file, &["weir-agent", "inspect", "services", "--bp"]),
            bash_completes(&file, &["weir-agent", "completions", "fi"]),
        ];
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            got,
            [
                "--hostname-override",
                "inspect",
                "conntrack",
                "--bpffs",
                "fish"
            ]
        );
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
