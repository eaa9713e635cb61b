//! The sandbox's DNS config and hostname, as pkg/kubelet/network/dns/dns.go
//! (`GetPodDNS`) and pkg/kubelet/kubelet_pods.go (`GeneratePodHostNameAndDomain`).
use std::net::IpAddr;

use super::{
    DnsPolicy, PodSpec,
    convert::{MAX_NAMESERVERS, MAX_SEARCH_CHARS, MAX_SEARCHES},
};

/// What CRI's `DNSConfig` gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// The node's own resolver config (`/etc/resolv.conf` by default).
pub fn parse_resolv_conf(text: &str) -> DnsConfig {
    let mut c = DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => c.servers.extend(words.next().map(str::to_owned)),
            // The last search line wins, as in the resolver.
            Some("search") => c.searches = words.map(str::to_owned).collect(),
            Some("options") => c.options.extend(words.map(str::to_owned)),
            _ => {}
        }
    }
    c
}

/// The pod's DNS (`GetPodDNS`): the cluster's resolver for ClusterFirst pods
/// (host-network pods only with ClusterFirstWithHostNet), else the node's;
/// nothing for `None`; then `spec.dnsConfig` on top. ClusterFirst without a
/// `clusterDNS` falls back to the node's, as the kubelet does. `host` is `None`
/// when the kubelet's `resolvConf` is empty: host-resolver pods then get the
/// node's loopback, as the kubelet gives them.
pub fn pod_dns(
    pod: &PodSpec,
    cluster_dns: &[IpAddr],
    cluster_domain: Option<&str>,
    host: Option<&DnsConfig>,
    node_ip: Option<IpAddr>,
) -> DnsConfig {
    let cluster = match pod.dns_policy {
        DnsPolicy::ClusterFirst => !pod.host_network,
        DnsPolicy::ClusterFirstWithHostNet => true,
        DnsPolicy::Default | DnsPolicy::None => false,
    };
    let base = host.cloned().unwrap_or_default();
    let mut c = if pod.dns_policy == DnsPolicy::None {
        DnsConfig::default()
    } else if cluster && !cluster_dns.is_empty() {
        let mut searches = Vec::new();
        if let Some(d) = cluster_domain {
            searches.push(format!("{}.svc.{d}", pod.namespace));
            searches.push(format!("svc.{d}"));
            searches.push(d.to_owned());
        }
        DnsConfig {
            servers: cluster_dns.iter().map(ToString::to_string).collect(),
            searches: omit_duplicates(searches.into_iter().chain(base.searches)),
            options: vec!["ndots:5".to_owned()],
        }
    } else if host.is_none() {
        let lo = match node_ip {
            Some(IpAddr::V6(_)) => "::1",
            _ => "127.0.0.1",
        };
        DnsConfig {
            servers: vec![lo.to_owned()],
            searches: vec![".".to_owned()],
            options: base.options,
        }
    } else {
        base
    };
    if let Some(extra) = &pod.dns_config {
        c.servers = omit_duplicates(
            c.servers
                .into_iter()
                .chain(extra.nameservers.iter().map(ToString::to_string)),
        );
        c.searches = omit_duplicates(c.searches.into_iter().chain(extra.searches.iter().cloned()));
        c.options = merge_options(&c.options, &extra.options);
    }
    fit_limits(c)
}

fn omit_duplicates(list: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in list {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// `mergeDNSOptions`: the pod's options replace the base's of the same name.
fn merge_options(base: &[String], extra: &[(String, Option<String>)]) -> Vec<String> {
    let mut merged: Vec<(String, Option<String>)> = Vec::new();
    let parsed = base.iter().map(|o| match o.split_once(':') {
        Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
        None => (o.clone(), None),
    });
    for (name, value) in parsed.chain(extra.iter().cloned()) {
        match merged.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => merged.push((name, value)),
        }
    }
    merged
        .into_iter()
        .map(|(n, v)| match v.filter(|v| !v.is_empty()) {
            Some(v) => format!("{n}:{v}"),
            None => n,
        })
        .collect()
}

/// `formDNSConfigFitsLimits`: what resolv.conf can hold, the rest dropped.
fn fit_limits(mut c: DnsConfig) -> DnsConfig {
    c.servers.truncate(MAX_NAMESERVERS);
    c.searches.truncate(MAX_SEARCHES);
    while c.searches.join(" ").len() > MAX_SEARCH_CHARS {
        c.searches.pop();
    }
    c
}

/// The pod's hostname (`spec.hostname`, else its name cut to 63 characters)
/// and, with a subdomain and a cluster domain, its domain.
pub fn hostname_and_domain(
    pod: &PodSpec,
    cluster_domain: Option<&str>,
) -> (String, Option<String>) {
    let hostname = match &pod.hostname {
        Some(h) => h.clone(),
        None if pod.name.len() > 63 => {
            let cut = &pod.name[..63];
            cut.trim_end_matches(['-', '.']).to_owned()
        }
        None => pod.name.clone(),
    };
    let domain = match (&pod.subdomain, cluster_domain) {
        (Some(sub), Some(d)) => Some(format!("{sub}.{}.svc.{d}", pod.namespace)),
        _ => None,
    };
    (hostname, domain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{PodDnsConfig, PodSecurity, RestartPolicy, Volume};
    use std::{collections::BTreeMap, time::Duration};

    fn pod(policy: DnsPolicy, host_network: bool) -> PodSpec {
        PodSpec {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "p".into(),
            node_name: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            restart_policy: RestartPolicy::Always,
            termination_grace_period: Duration::from_secs(30),
            init_containers: vec![],
            containers: vec![],
            volumes: Vec::<Volume>::new(),
            dns_policy: policy,
            dns_config: None,
            hostname: None,
            subdomain: None,
            host_network,
            host_pid: false,
            host_ipc: false,
            share_process_namespace: false,
            service_account_name: "default".into(),
            security: PodSecurity::default(),
            deleting: false,
        }
    }

    fn host() -> DnsConfig {
        parse_resolv_conf(
            "# comment\nnameserver 1.1.1.1\nnameserver 8.8.8.8\nsearch corp.example\noptions edns0\n",
        )
    }

    fn cluster() -> DnsConfig {
        DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: ["ns.svc.cluster.local", "svc.cluster.local", "cluster.local"]
                .into_iter()
                .chain(["corp.example"])
                .map(String::from)
                .collect(),
            options: vec!["ndots:5".into()],
        }
    }

    #[test]
    fn resolv_conf() {
        let h = host();
        assert_eq!(h.servers, ["1.1.1.1", "8.8.8.8"]);
        assert_eq!(h.searches, ["corp.example"]);
        assert_eq!(h.options, ["edns0"]);
    }

    /// Policy, hostNetwork, clusterDNS, the node's resolv.conf, and the result.
    type Case<'a> = (
        DnsPolicy,
        bool,
        &'a [IpAddr],
        Option<&'a DnsConfig>,
        DnsConfig,
    );

    /// Every policy on and off the host network, with and without a
    /// `clusterDNS`, as `getPodDNSType` and `GetPodDNS` decide.
    #[test]
    fn policies() {
        use DnsPolicy::*;
        let dns: [IpAddr; 1] = ["10.96.0.10".parse().unwrap()];
        let localhost = DnsConfig {
            servers: vec!["127.0.0.1".into()],
            searches: vec![".".into()],
            options: vec![],
        };
        let h = host();
        #[rustfmt::skip]
        let table: [Case<'_>; 10] = [
            (ClusterFirst, false, &dns, Some(&h), cluster()),
            // A host-network pod on ClusterFirst falls back to Default.
            (ClusterFirst, true, &dns, Some(&h), host()),
            (ClusterFirstWithHostNet, true, &dns, Some(&h), cluster()),
            (ClusterFirstWithHostNet, false, &dns, Some(&h), cluster()),
            (Default, false, &dns, Some(&h), host()),
            (Default, true, &dns, Some(&h), host()),
            // No clusterDNS configured: ClusterFirst falls back to the node's.
            (ClusterFirst, false, &[], Some(&h), host()),
            // resolvConf "": the node's loopback for host-resolver pods.
            (Default, true, &dns, Option::None, localhost.clone()),
            (ClusterFirst, false, &[], Option::None, localhost),
            // None starts from nothing (dnsConfig is required with it).
            (None, true, &dns, Some(&h), DnsConfig::default()),
        ];
        for (policy, host_net, cluster_dns, host, want) in table {
            let got = pod_dns(
                &pod(policy, host_net),
                cluster_dns,
                Some("cluster.local"),
                host,
                Option::None,
            );
            assert_eq!(got, want, "{policy:?} hostNetwork={host_net} host={host:?}");
        }
    }

    #[test]
    fn dns_config_is_merged_on_top() {
        let mut p = pod(DnsPolicy::ClusterFirst, false);
        p.dns_config = Some(PodDnsConfig {
            nameservers: vec!["10.96.0.10".parse().unwrap(), "9.9.9.9".parse().unwrap()],
            searches: vec!["svc.cluster.local".into(), "extra.example".into()],
            options: vec![("ndots".into(), Some("2".into())), ("edns0".into(), None)],
        });
        let dns = ["10.96.0.10".parse().unwrap()];
        let c = pod_dns(&p, &dns, Some("cluster.local"), Some(&host()), None);
        assert_eq!(c.servers, ["10.96.0.10", "9.9.9.9"]);
        assert_eq!(
            c.searches,
            [
                "ns.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example",
                "extra.example"
            ]
        );
        assert_eq!(c.options, ["ndots:2", "edns0"]);

        p.dns_policy = DnsPolicy::None;
        p.dns_config = Some(PodDnsConfig {
            nameservers: vec!["192.0.2.53".parse().unwrap()],
            searches: vec!["a.example".into()],
            options: vec![("timeout".into(), Some("1".into()))],
        });
        let c = pod_dns(&p, &dns, Some("cluster.local"), Some(&host()), None);
        assert_eq!(
            c,
            DnsConfig {
                servers: vec!["192.0.2.53".into()],
                searches: vec!["a.example".into()],
                options: vec!["timeout:1".into()],
            }
        );
    }

    #[test]
    fn limits_drop_what_resolv_conf_cannot_hold() {
        let mut p = pod(DnsPolicy::Default, false);
        p.dns_config = Some(PodDnsConfig {
            nameservers: ["9.9.9.9", "9.9.9.10"].map(|s| s.parse().unwrap()).to_vec(),
            searches: (0..40)
                .map(|i| format!("{}{i}.example", "s".repeat(60)))
                .collect(),
            options: vec![],
        });
        let c = pod_dns(&p, &[], None, Some(&host()), None);
        assert_eq!(c.servers, ["1.1.1.1", "8.8.8.8", "9.9.9.9"]);
        assert!(c.searches.len() < 32 && c.searches[0] == "corp.example");
        assert!(c.searches.join(" ").len() <= 2048);
        // IPv6 nodes get the v6 loopback when there is no resolv.conf.
        let v6 = pod_dns(
            &pod(DnsPolicy::Default, true),
            &[],
            None,
            None,
            "fd00::1".parse().ok(),
        );
        assert_eq!(v6.servers, ["::1"]);
    }

    #[test]
    fn hostnames() {
        let mut p = pod(DnsPolicy::ClusterFirst, false);
        assert_eq!(
            hostname_and_domain(&p, Some("cluster.local")),
            ("p".into(), None)
        );
        p.name = format!("{}-{}", "a".repeat(62), "b");
        assert_eq!(hostname_and_domain(&p, None).0, "a".repeat(62));
        p.hostname = Some("h".into());
        p.subdomain = Some("s".into());
        assert_eq!(
            hostname_and_domain(&p, Some("cluster.local")),
            ("h".into(), Some("s.ns.svc.cluster.local".into()))
        );
    }
}
