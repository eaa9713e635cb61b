//! `--config`: a KubeProxyConfiguration file filling the settings the
//! command line left, and `/configz`, the effective settings in
//! kube-proxy's shape.
use anyhow::{Context as _, Result};

use super::{LogFormat, RunArgs, parse_cidr};

/// Reads `--config` into `run` where the command line and environment left
/// a setting at its default; returns the warnings to log (once logging is
/// set up, which the file may configure).
pub(crate) fn apply_config(
    path: &std::path::Path,
    run: &mut RunArgs,
    matches: &clap::ArgMatches,
) -> Result<Vec<String>> {
    use weir_agent::kube_proxy_config as kpc;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config {}: cannot read it", path.display()))?;
    let parsed = kpc::parse(&text).with_context(|| format!("--config {}", path.display()))?;
    let given = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
        )
    };
    let s = parsed.settings;
    let mut warnings = parsed.warnings;
    let mut set = |id: &str, field: &str, apply: &mut dyn FnMut()| {
        if given(id) {
            warnings.push(format!(
                "{field}: --{} given on the command line or in the environment wins",
                id.replace('_', "-")
            ));
        } else {
            apply();
        }
    };
    if let Some(v) = s.hostname_override {
        set("node_name", "hostnameOverride", &mut || {
            run.node_name = Some(v.trim().to_lowercase())
        });
    }
    if let Some(v) = s.metrics_bind_address {
        set("metrics_addr", "metricsBindAddress", &mut || {
            run.metrics_addr = v.clone()
        });
    }
    if let Some(v) = s.healthz_bind_address {
        set("healthz_addr", "healthzBindAddress", &mut || {
            run.healthz_addr = v.clone()
        });
    }
    if let Some(v) = s.cluster_cidr {
        let cidrs = v
            .split(',')
            .map(|c| parse_cidr(c.trim()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("--config {}: clusterCIDR: {e}", path.display()))?;
        set("cluster_cidr", "clusterCIDR", &mut || {
            run.cluster_cidr = cidrs.clone()
        });
    }
    if let Some(v) = s.node_port_addresses {
        set("nodeport_addresses", "nodePortAddresses", &mut || {
            run.packet.nodeport_addresses = v.clone();
        });
    }
    if let Some(v) = s.kubeconfig.filter(|_| run.manifests.is_none()) {
        set("kubeconfig", "clientConnection.kubeconfig", &mut || {
            run.kubeconfig = Some(v.clone().into());
        });
    }
    if let Some(d) = s.ct_tcp_established {
        set(
            "ct_timeout_tcp",
            "conntrack.tcpEstablishedTimeout",
            &mut || {
                run.packet.ct_timeout_tcp = d.into();
            },
        );
    }
    if let Some(d) = s.ct_udp {
        set("ct_timeout_udp", "conntrack.udpStreamTimeout", &mut || {
            run.packet.ct_timeout_udp = d.into();
        });
    }
    if let Some(v) = s.verbosity {
        set("verbosity", "logging.verbosity", &mut || {
            run.verbosity = Some(v)
        });
    }
    if let Some(f) = s.log_format {
        let format = if f == "json" {
            LogFormat::Json
        } else {
            LogFormat::Text
        };
        set("log_format", "logging.format", &mut || {
            run.log_format = format
        });
    }
    Ok(warnings
        .into_iter()
        .map(|w| format!("--config {}: {w}", path.display()))
        .collect())
}

/// The effective settings as kube-proxy's `/configz` shows them.
pub(crate) fn configz(run: &RunArgs, node: &str) -> String {
    use weir_agent::kube_proxy_config as kpc;
    let p = &run.packet;
    let settings = kpc::Settings {
        hostname_override: Some(node.to_owned()),
        healthz_bind_address: Some(run.healthz_addr.clone()),
        metrics_bind_address: Some(run.metrics_addr.clone()),
        cluster_cidr: Some(
            run.cluster_cidr
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
        node_port_addresses: (!p.nodeport_addresses.is_empty())
            .then(|| p.nodeport_addresses.clone()),
        kubeconfig: run.kubeconfig.as_ref().map(|k| k.display().to_string()),
        ct_tcp_established: Some(p.ct_timeout_tcp.into()),
        ct_udp: Some(p.ct_timeout_udp.into()),
        verbosity: run.verbosity,
        log_format: Some(match run.log_format {
            LogFormat::Text => "text".into(),
            LogFormat::Json => "json".into(),
        }),
    };
    kpc::configz(&settings, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;

    #[test]
    fn config_file_fills_what_the_command_line_left_and_warns() {
        let dir = std::env::temp_dir().join(format!("weir-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("kube-proxy.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             hostnameOverride: Node-7\nmetricsBindAddress: 0.0.0.0:9999\n\
             healthzBindAddress: 0.0.0.0:10256\nclusterCIDR: 10.244.0.0/16,fd00:244::/56\n\
             nodePortAddresses: [192.168.0.0/16]\nmode: ipvs\n\
             conntrack: {tcpEstablishedTimeout: 2h0m0s, udpStreamTimeout: 0s}\n",
        )
        .unwrap();
        let argv = [
            "weir-agent",
            "--config",
            file.to_str().unwrap(),
            "--healthz-addr=127.0.0.1:1",
        ];
        let m = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(argv)
            .unwrap();
        let mut cli = <Cli as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
        let warnings = apply_config(&file, &mut cli.run, &m).unwrap();
        let r = &cli.run;
        assert_eq!(r.node_name.as_deref(), Some("node-7"));
        assert_eq!(r.metrics_addr, "0.0.0.0:9999");
        assert_eq!(r.healthz_addr, "127.0.0.1:1", "the command line wins");
        assert_eq!(r.cluster_cidr.len(), 2);
        assert_eq!(r.packet.nodeport_addresses, ["192.168.0.0/16"]);
        assert_eq!(
            *r.packet.ct_timeout_tcp,
            std::time::Duration::from_secs(7200)
        );
        assert_eq!(
            *r.packet.ct_timeout_udp,
            std::time::Duration::from_secs(60),
            "0s keeps ours"
        );
        let f = file.display();
        assert_eq!(
            warnings,
            [
                format!(
                    "--config {f}: mode: \"ipvs\" has no effect: Weir's datapath is always eBPF"
                ),
                format!(
                    "--config {f}: healthzBindAddress: --healthz-addr given on the command line or in the environment wins"
                ),
            ]
        );
        let configz: serde_json::Value =
            serde_json::from_str(&configz(&cli.run, "node-7")).unwrap();
        assert_eq!(
            configz["kubeproxy.config.k8s.io"]["conntrack"]["tcpEstablishedTimeout"],
            "2h0m0s"
        );
        std::fs::write(
            &file,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             nftables: {masqueradeAll: true}\n",
        )
        .unwrap();
        let e = apply_config(&file, &mut cli.run, &m).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            format!("{e:#}"),
            format!(
                "--config {f}: nftables.masqueradeAll: true is not supported: Weir does not SNAT traffic to ClusterIPs: backends see the client's address"
            )
        );
    }
}
