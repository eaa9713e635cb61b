//! The command line, with the real kubelet's flag names.
use std::{net::IpAddr, path::PathBuf};

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "weir-kubelet",
    version,
    about = "A minimal kubelet on containerd's CRI",
    args_conflicts_with_subcommands = true
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// A kubelet.config.k8s.io/v1beta1 KubeletConfiguration file; without
    /// one, the kubelet's defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// API-server mode; without it the kubelet runs its static pods only.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The node name; the lower-cased hostname by default.
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// Per-pod state (emptyDir volumes) goes under `<root-dir>/pods`.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub root_dir: PathBuf,
    /// Container logs: `<pod-logs-dir>/<ns>_<name>_<uid>/<container>/<n>.log`.
    #[arg(long, default_value = "/var/log/pods")]
    pub pod_logs_dir: PathBuf,
    /// The cgroupfs parent of every pod's cgroup.
    #[arg(long, default_value = "/kubepods")]
    pub cgroup_root: String,
    /// The node's InternalIP (and host-network pods' IP); by default the
    /// address of the default route's interface.
    #[arg(long)]
    pub node_ip: Option<IpAddr>,
    /// The CRI socket, `unix:///path`; overrides containerRuntimeEndpoint.
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Print a completion script for the shell, e.g.
    /// `weir-kubelet completions bash > /etc/bash_completion.d/weir-kubelet`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Writes the completion script of `weir-kubelet` for `shell`: for bash
/// under `weir_kubelet`, registered for `weir-kubelet`, because
/// clap_complete's bash script completes nothing past a subcommand of a
/// hyphenated binary (clap-rs/clap#6421).
pub fn write_completions(
    shell: clap_complete::Shell,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    let mut cmd = <Args as clap::CommandFactory>::command();
    if shell != clap_complete::Shell::Bash {
        clap_complete::generate(shell, &mut cmd, "weir-kubelet", out);
        return Ok(());
    }
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "weir_kubelet", &mut script);
    let script = String::from_utf8_lossy(&script).replace(" weir_kubelet\n", " weir-kubelet\n");
    out.write_all(script.as_bytes())
}

/// The node name: `--hostname-override`, else the lower-cased hostname.
pub fn node_name(args: &Args) -> String {
    let name = args.hostname_override.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into())
    });
    name.trim().to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_flag_names_parse_and_config_is_optional() {
        let a = Args::try_parse_from([
            "weir-kubelet",
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            "--node-ip",
            "10.0.0.7",
            "--hostname-override",
            "Node-A",
            "--container-runtime-endpoint",
            "unix:///run/containerd/containerd.sock",
            "--root-dir",
            "/var/lib/weir",
        ])
        .unwrap();
        assert_eq!(a.config, None);
        assert_eq!(a.node_ip, Some("10.0.0.7".parse().unwrap()));
        assert_eq!(node_name(&a), "node-a");
        assert_eq!(a.root_dir, PathBuf::from("/var/lib/weir"));
        assert!(Args::try_parse_from(["weir-kubelet", "--node-ip", "ten"]).is_err());
        let v = Args::try_parse_from(["weir-kubelet", "--version"]).unwrap_err();
        assert_eq!(v.kind(), clap::error::ErrorKind::DisplayVersion);
    }
}
