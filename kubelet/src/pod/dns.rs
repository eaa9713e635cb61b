//! The sandbox's DNS config and hostname, as pkg/kubelet/network/dns/dns.go
//! (`GetPodDNS`) and pkg/kubelet/kubelet_pods.go (`GeneratePodHostNameAndDomain`).
use std::net::IpAddr;

use super::{DnsPolicy, PodSpec};

/// What CRI's `DNSConfig` gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// resolv.conf allows this many search domains (glibc's historical limit as
/// the kubelet enforces it, `MaxDNSSearchPaths`).
const MAX_SEARCHES: usize = 32;

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

/// The pod's DNS: the cluster's resolver for ClusterFirst pods (host-network
/// pods only with ClusterFirstWithHostNet), else the node's. ClusterFirst
/// without a `clusterDNS` falls back to the node's, as the kubelet does.
pub fn pod_dns(
    pod: &PodSpec,
    cluster_dns: &[IpAddr],
    cluster_domain: Option<&str>,
    host: &DnsConfig,
) -> DnsConfig {
    let cluster = match pod.dns_policy {
        DnsPolicy::ClusterFirst => !pod.host_network,
        DnsPolicy::ClusterFirstWithHostNet => true,
        DnsPolicy::Default | DnsPolicy::None => false,
    };
    if !cluster || cluster_dns.is_empty() {
        return host.clone();
    }
    let mut searches = Vec::new();
    if let Some(d) = cluster_domain {
        searches.push(format!("{}.svc.{d}", pod.namespace));
        searches.push(format!("svc.{d}"));
        searches.push(d.to_owned());
    }
    for s in &host.searches {
        if !searches.contains(s) {
            searches.push(s.clone());
        }
    }
    searches.truncate(MAX_SEARCHES);
    DnsConfig {
        servers: cluster_dns.iter().map(ToString::to_string).collect(),
        searches,
        options: vec!["ndots:5".to_owned()],
    }
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
    use crate::pod::{RestartPolicy, Volume};
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
            hostname: None,
            subdomain: None,
            host_network,
            host_pid: false,
            host_ipc: false,
            deleting: false,
        }
    }

    fn host() -> DnsConfig {
        parse_resolv_conf(
            "# comment\nnameserver 1.1.1.1\nnameserver 8.8.8.8\nsearch corp.example\noptions edns0\n",
        )
    }

    #[test]
    fn resolv_conf() {
        let h = host();
        assert_eq!(h.servers, ["1.1.1.1", "8.8.8.8"]);
        assert_eq!(h.searches, ["corp.example"]);
        assert_eq!(h.options, ["edns0"]);
    }

    #[test]
    fn cluster_first_uses_the_cluster_resolver() {
        let dns = ["10.96.0.10".parse().unwrap()];
        let c = pod_dns(
            &pod(DnsPolicy::ClusterFirst, false),
            &dns,
            Some("cluster.local"),
            &host(),
        );
        assert_eq!(c.servers, ["10.96.0.10"]);
        assert_eq!(
            c.searches,
            [
                "ns.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ]
        );
        assert_eq!(c.options, ["ndots:5"]);
        let hn = pod_dns(
            &pod(DnsPolicy::ClusterFirstWithHostNet, true),
            &dns,
            Some("cluster.local"),
            &host(),
        );
        assert_eq!(hn.servers, ["10.96.0.10"]);
    }

    #[test]
    fn host_resolver_otherwise() {
        let dns = ["10.96.0.10".parse().unwrap()];
        assert_eq!(
            pod_dns(&pod(DnsPolicy::ClusterFirst, true), &dns, None, &host()),
            host()
        );
        assert_eq!(
            pod_dns(&pod(DnsPolicy::Default, false), &dns, None, &host()),
            host()
        );
        // No clusterDNS configured: ClusterFirst falls back to the node's.
        assert_eq!(
            pod_dns(&pod(DnsPolicy::ClusterFirst, false), &[], None, &host()),
            host()
        );
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
