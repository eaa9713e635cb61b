//! kube-proxy's nftables mode: the `nft -f` transactions its sync loop sends
//! for table `ip kube-proxy`, and the loaders and cleanup for it.
//!
//! kube-proxy builds its transactions with knftables, which renders one
//! command a line; the commands, and their order, are reproduced here.
use std::{fmt::Write as _, net::Ipv4Addr, path::Path};

use super::{Ipv4Cidr, RulesError, Svc, push_hash, run_in_netns};

const TABLE: &str = "ip kube-proxy";
const ADD_CHAIN: &str = "add chain ip kube-proxy ";
const FLUSH_CHAIN: &str = "flush chain ip kube-proxy ";
const ADD_RULE: &str = "add rule ip kube-proxy ";
const MASQ_JUMP: &str = " jump mark-for-masquerade\n";

/// kube-proxy's chain name bases are capped at 256 - 16 bytes; above that
/// they are cut and end in "...". Kubernetes names never get there.
const NAME_BASE_MAX: usize = 240;

/// Base chains: name, type, hook, priority. Filtering sees the pre-DNAT
/// destination at dstnat-10; the others sit at the standard priorities.
const BASE_CHAINS: &[(&str, &str, &str, i32)] = &[
    ("filter-prerouting-pre-dnat", "filter", "prerouting", -110),
    ("filter-output-pre-dnat", "filter", "output", -110),
    ("filter-input", "filter", "input", 0),
    ("filter-forward", "filter", "forward", 0),
    ("filter-output", "filter", "output", 0),
    ("nat-prerouting", "nat", "prerouting", -100),
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),
];

/// Regular chains jumped to from base chains: target, source, match.
const JUMPS: &[(&str, &str, &str)] = &[
    ("nodeport-endpoints-check", "filter-input", "ct state new "),
    ("service-endpoints-check", "filter-input", "ct state new "),
    ("service-endpoints-check", "filter-forward", "ct state new "),
    ("service-endpoints-check", "filter-output", "ct state new "),
    (
        "firewall-check",
        "filter-prerouting-pre-dnat",
        "ct state new ",
    ),
    ("firewall-check", "filter-output-pre-dnat", "ct state new "),
    ("services", "nat-output", ""),
    ("services", "nat-prerouting", ""),
    ("masquerading", "nat-postrouting", ""),
    ("cluster-ips-check", "filter-forward", "ct state new "),
    ("cluster-ips-check", "filter-output", "ct state new "),
];

/// Everything after the jumps in kube-proxy's setup, for IPv4 with the
/// default masquerade bit and NodePorts on the node's own IPs (the set stays
/// empty: the bench has no NodePorts and no node IP to put there).
const SETUP: &str = r#"add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }
flush set ip kube-proxy nodeport-ips
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
flush chain ip kube-proxy reject-chain
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
flush set ip kube-proxy cluster-ips
flush map ip kube-proxy service-ips
flush map ip kube-proxy firewall-ips
flush map ip kube-proxy no-endpoint-services
flush map ip kube-proxy no-endpoint-nodeports
flush map ip kube-proxy service-nodeports
"#;

/// `service-<hash>-ns/name/proto/port`, the chain `service-ips` jumps to.
pub fn service_chain(svc: &Svc) -> String {
    let base = format!(
        "{}/{}/{}/{}",
        svc.namespace,
        svc.name,
        svc.proto.as_str(),
        svc.port_name
    );
    hashed_name("service-", &base)
}

/// `endpoint-<hash>-ns/name/proto/port__ip/port`, the chain that DNATs to `ep`.
pub fn endpoint_chain(svc: &Svc, ep: (Ipv4Addr, u16)) -> String {
    let base = format!(
        "{}/{}/{}/{}__{}/{}",
        svc.namespace,
        svc.name,
        svc.proto.as_str(),
        svc.port_name,
        ep.0,
        ep.1
    );
    hashed_name("endpoint-", &base)
}

/// The hash in front keeps names unique when cut and tells apart chains that
/// differ in one digit; the readable rest is for people.
fn hashed_name(prefix: &str, base: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + 9 + base.len());
    s.push_str(prefix);
    push_hash::<8>(&mut s, &[base]);
    s.push('-');
    if 9 + base.len() > NAME_BASE_MAX {
        let mut cut = NAME_BASE_MAX - 9 - 3;
        while !base.is_char_boundary(cut) {
            cut -= 1;
        }
        s.push_str(&base[..cut]);
        s.push_str("...");
    } else {
        s.push_str(base);
    }
    s
}

/// The chains a Service port owns: its service chain, then one per endpoint.
struct Chains {
    service: String,
    endpoints: Vec<String>,
}

impl Chains {
    fn of(svc: &Svc) -> Self {
        Self {
            service: service_chain(svc),
            endpoints: svc
                .endpoints
                .iter()
                .map(|&ep| endpoint_chain(svc, ep))
                .collect(),
        }
    }

    /// Without endpoints kube-proxy creates none of them.
    fn live(&self) -> impl Iterator<Item = &str> {
        let any = !self.endpoints.is_empty();
        self.endpoints
            .iter()
            .map(String::as_str)
            .chain(any.then_some(self.service.as_str()))
    }
}

/// One element of a set or map in the table.
#[derive(PartialEq, Eq)]
struct Element {
    container: &'static str,
    key: String,
    comment: Option<String>,
    value: Option<String>,
}

impl Element {
    fn add(&self, out: &mut String) {
        push!(out, "add element ", TABLE, " ", self.container);
        push!(out, " { ", &self.key);
        if let Some(c) = &self.comment {
            push!(out, " comment \"", c, "\"");
        }
        if let Some(v) = &self.value {
            push!(out, " : ", v);
        }
        out.push_str(" }\n");
    }

    fn delete(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "delete element {TABLE} {} {{ {} }}",
            self.container, self.key
        );
    }
}

fn elements(svc: &Svc, chains: &Chains) -> [Element; 2] {
    let key = format!("{} . {} . {}", svc.vip, svc.proto.as_str(), svc.port);
    let cluster_ip = Element {
        container: "cluster-ips",
        key: svc.vip.to_string(),
        comment: None,
        value: None,
    };
    let dispatch = if svc.endpoints.is_empty() {
        Element {
            container: "no-endpoint-services",
            key,
            comment: Some(svc.port_name_string()),
            value: Some("goto reject-chain".to_owned()),
        }
    } else {
        Element {
            container: "service-ips",
            key,
            comment: None,
            value: Some(format!("goto {}", chains.service)),
        }
    };
    [cluster_ip, dispatch]
}

/// kube-proxy's `ensureChain`: create it if missing and empty it either way.
fn ensure(out: &mut String, chain: &str) {
    push!(out, ADD_CHAIN, chain, "\n", FLUSH_CHAIN, chain, "\n");
}

fn ensure_chains(out: &mut String, chains: &Chains) {
    for c in chains.live() {
        ensure(out, c);
    }
}

fn write_rules(out: &mut String, svc: &Svc, chains: &Chains, cidr: Ipv4Cidr) {
    if svc.endpoints.is_empty() {
        return;
    }
    let sc = &chains.service;
    let n = chains.endpoints.len();
    // Off-cluster sources reaching a ClusterIP (via a route to a node) may be
    // answered from another node, so kube-proxy masquerades them.
    push!(out, ADD_RULE, sc, " ip daddr ", &svc.vip.to_string());
    push!(out, " ip saddr != ", &cidr.to_string(), MASQ_JUMP);
    push!(out, ADD_RULE, sc, " numgen random mod ");
    push!(out, &n.to_string(), " vmap { ");
    for (i, ec) in chains.endpoints.iter().enumerate() {
        let sep = if i + 1 < n { " , " } else { " " };
        push!(out, &i.to_string(), " : goto ", ec, sep);
    }
    out.push_str("}\n");
    let proto = svc.proto.as_str();
    for (&(ip, port), ec) in svc.endpoints.iter().zip(&chains.endpoints) {
        let ip = ip.to_string();
        // Hairpin: a pod reaching itself through the Service must see the
        // node as the source, or it would answer itself directly.
        push!(out, ADD_RULE, ec, " ip saddr ", &ip, MASQ_JUMP);
        push!(out, ADD_RULE, ec, " meta l4proto ", proto);
        push!(out, " dnat to ", &ip, ":", &port.to_string(), "\n");
    }
}

/// kube-proxy's first sync into an empty namespace, as one `nft -f` transaction.
pub fn nft_input(services: &[Svc], cluster_cidr: Ipv4Cidr) -> String {
    let eps: usize = services.iter().map(|s| s.endpoints.len()).sum();
    let mut out = String::with_capacity(8192 + services.len() * 700 + eps * 500);
    let _ = writeln!(
        out,
        "add table {TABLE} {{ comment \"rules for kube-proxy\" ; }}"
    );
    // The first sync deletes the base chains once, so it can recreate them
    // even if an older kube-proxy left them with other properties.
    for (name, ..) in BASE_CHAINS {
        let _ = writeln!(out, "add chain {TABLE} {name}\ndelete chain {TABLE} {name}");
    }
    for (name, kind, hook, prio) in BASE_CHAINS {
        let _ = writeln!(
            out,
            "add chain {TABLE} {name} {{ type {kind} hook {hook} priority {prio} ; }}\nflush chain {TABLE} {name}"
        );
    }
    let mut created: Vec<&str> = Vec::new();
    let top = [
        "services",
        "cluster-ips-check",
        "masquerading",
        "mark-for-masquerade",
    ];
    for (to, from, cond) in JUMPS {
        if !created.contains(to) {
            created.push(to);
            ensure(&mut out, to);
        }
        let _ = writeln!(out, "add rule {TABLE} {from} {cond}jump {to}");
    }
    for chain in top.iter().filter(|c| !created.contains(c)) {
        ensure(&mut out, chain);
    }
    out.push_str(SETUP);

    for svc in services {
        let chains = Chains::of(svc);
        ensure_chains(&mut out, &chains);
        for e in elements(svc, &chains) {
            e.add(&mut out);
        }
        write_rules(&mut out, svc, &chains, cluster_cidr);
    }
    out
}

/// The partial-sync transaction kube-proxy sends when one Service port goes
/// from `old` to `new` (typically one endpoint swapped): the Service's chains
/// re-created and refilled, map elements touched only where they changed, and
/// the chains only `old` had flushed and deleted.
///
/// kube-proxy deletes those chains in a later transaction, at least a second
/// after the flush, for kernels before 6.2; here the delete ends the same one.
pub fn nft_endpoint_update(old: &Svc, new: &Svc, cluster_cidr: Ipv4Cidr) -> String {
    let (was, now) = (Chains::of(old), Chains::of(new));
    let mut out = String::with_capacity(1024 + new.endpoints.len() * 600);
    ensure_chains(&mut out, &now);
    let (before, after) = (elements(old, &was), elements(new, &now));
    for e in before.iter().filter(|e| !after.contains(e)) {
        e.delete(&mut out);
    }
    for e in after.iter().filter(|e| !before.contains(e)) {
        e.add(&mut out);
    }
    write_rules(&mut out, new, &now, cluster_cidr);
    let live: Vec<&str> = now.live().collect();
    let stale: Vec<&str> = was.live().filter(|c| !live.contains(c)).collect();
    for c in &stale {
        let _ = writeln!(out, "flush chain {TABLE} {c}");
    }
    for c in &stale {
        let _ = writeln!(out, "delete chain {TABLE} {c}");
    }
    out
}

/// Runs `nft -f -` with `input` in the namespace at `netns`: one transaction.
pub fn load_nft(netns: impl AsRef<Path>, input: &str) -> Result<(), RulesError> {
    run_in_netns(netns.as_ref(), "nft", &["-f", "-"], Some(input)).map(drop)
}

/// `nft list ruleset` of the namespace at `netns`.
pub fn nft_list_ruleset(netns: impl AsRef<Path>) -> Result<String, RulesError> {
    run_in_netns(netns.as_ref(), "nft", &["list", "ruleset"], None)
}

/// Deletes table `ip kube-proxy`, as kube-proxy's `--cleanup` does; a no-op
/// when it is not there.
pub fn flush_nft(netns: impl AsRef<Path>) -> Result<(), RulesError> {
    // Adding first makes the delete succeed whether or not the table exists.
    let input = format!("add table {TABLE}\ndelete table {TABLE}\n");
    load_nft(netns, &input)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::rules::{
        synthetic,
        tests::{ep, kube_proxy_svc, pod_cidr},
    };

    /// Names from kube-proxy's TestOverallNFTablesRules expected transaction.
    #[test]
    fn chain_names_match_kube_proxys_test_data() {
        let svc1 = kube_proxy_svc("ns1", "svc1", [172, 30, 0, 41], &[[10, 180, 0, 1]]);
        assert_eq!(service_chain(&svc1), "service-ULMVA6XW-ns1/svc1/tcp/p80");
        assert_eq!(
            endpoint_chain(&svc1, svc1.endpoints[0]),
            "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        let svc4 = kube_proxy_svc("ns4", "svc4", [172, 30, 0, 44], &[]);
        assert_eq!(service_chain(&svc4), "service-LAUZTJTB-ns4/svc4/tcp/p80");
        let kube_ep = |d| (Ipv4Addr::new(10, 180, 0, d), 80);
        assert_eq!(
            endpoint_chain(&svc4, kube_ep(4)),
            "endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80"
        );
        assert_eq!(
            endpoint_chain(&svc4, kube_ep(5)),
            "endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80"
        );
    }

    #[test]
    fn overlong_names_are_cut_behind_the_hash() {
        let long = "n".repeat(300);
        let name = hashed_name("service-", &long);
        assert_eq!(name.len(), "service-".len() + NAME_BASE_MAX);
        assert!(name.ends_with("n..."));
        assert_ne!(name, hashed_name("service-", &format!("{long}x")));
    }

    /// The lines kube-proxy's TestOverallNFTablesRules expects for its
    /// two-endpoint ClusterIP service and its service without endpoints.
    #[test]
    fn rules_match_kube_proxys_expected_transaction() {
        let svcs = [
            kube_proxy_svc(
                "ns4",
                "svc4",
                [172, 30, 0, 44],
                &[[10, 180, 0, 4], [10, 180, 0, 5]],
            ),
            kube_proxy_svc("ns6", "svc6", [172, 30, 0, 46], &[]),
        ];
        let input = nft_input(&svcs, pod_cidr());
        let expected = [
            "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }",
            "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
            "add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }",
            "add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }",
            "add rule ip kube-proxy nat-output jump services",
            "add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check",
            "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
            "add rule ip kube-proxy masquerading masquerade fully-random",
            "add chain ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80",
            "add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 ip daddr 172.30.0.44 ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
            "add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }",
            "add chain ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80",
            "add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 ip saddr 10.180.0.5 jump mark-for-masquerade",
            "add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 meta l4proto tcp dnat to 10.180.0.5:80",
            "add element ip kube-proxy cluster-ips { 172.30.0.44 }",
            "add element ip kube-proxy service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }",
            "add element ip kube-proxy cluster-ips { 172.30.0.46 }",
            "add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment \"ns6/svc6:p80\" : goto reject-chain }",
        ];
        let lines: Vec<&str> = input.lines().collect();
        for e in expected {
            assert!(lines.contains(&e), "missing {e}\nin\n{input}");
        }
        assert!(
            !input.contains("ns6/svc6/tcp"),
            "no chains without endpoints"
        );
        // Every chain is created before anything refers to it.
        let pos = |s: &str| input.find(s).expect(s);
        assert!(
            pos("add chain ip kube-proxy endpoint-UNZV3OEC")
                < pos("add rule ip kube-proxy service-LAUZTJTB")
        );
        assert!(
            pos("add map ip kube-proxy service-ips") < pos("add element ip kube-proxy service-ips")
        );
    }

    #[test]
    fn counts_scale_as_kube_proxys() {
        let eps = [ep(1), ep(2)];
        let (n, m) = (20, eps.len());
        let input = nft_input(&synthetic(n, &eps), pod_cidr());
        let per_svc = |prefix: &str| {
            input
                .lines()
                .filter(|l| l.starts_with(prefix) && l.contains("/tcp/http"))
                .count()
        };
        assert_eq!(per_svc("add chain "), n * (1 + m));
        assert_eq!(per_svc("flush chain "), n * (1 + m));
        assert_eq!(per_svc("add rule "), n * 2 + n * m * 2);
        assert_eq!(
            input
                .lines()
                .filter(|l| l.starts_with("add element "))
                .count(),
            2 * n
        );
        // One rule decides for all Services: a map lookup, not a chain walk.
        assert_eq!(input.matches("vmap @service-ips").count(), 1);
    }

    #[test]
    fn endpoint_update_rewrites_one_service_and_leaves_the_maps() {
        let (a, b, c) = (ep(1), ep(2), ep(3));
        let old = synthetic(1, &[a, b]).remove(0);
        let new = Svc {
            endpoints: vec![a, c],
            ..old.clone()
        };
        let tx = nft_endpoint_update(&old, &new, pod_cidr());
        let (sc, ea, eb, ec) = (
            service_chain(&new),
            endpoint_chain(&new, a),
            endpoint_chain(&old, b),
            endpoint_chain(&new, c),
        );
        for line in [
            format!("add chain ip kube-proxy {ec}"),
            format!("flush chain ip kube-proxy {ea}"),
            format!("flush chain ip kube-proxy {sc}"),
            format!(
                "add rule ip kube-proxy {sc} numgen random mod 2 vmap {{ 0 : goto {ea} , 1 : goto {ec} }}"
            ),
            format!("add rule ip kube-proxy {ec} meta l4proto tcp dnat to 10.1.0.3:8080"),
            format!("flush chain ip kube-proxy {eb}"),
            format!("delete chain ip kube-proxy {eb}"),
        ] {
            assert!(tx.lines().any(|l| l == line), "missing {line}\nin\n{tx}");
        }
        assert!(!tx.contains("element"), "{tx}");
        assert!(
            tx.trim_end()
                .ends_with(&format!("delete chain ip kube-proxy {eb}"))
        );
        assert!(!tx.contains(&format!("add chain ip kube-proxy {eb}")));
    }

    #[test]
    fn update_to_no_endpoints_swaps_the_map_element_and_drops_all_chains() {
        let old = synthetic(1, &[ep(1)]).remove(0);
        let new = Svc {
            endpoints: Vec::new(),
            ..old.clone()
        };
        let tx = nft_endpoint_update(&old, &new, pod_cidr());
        assert!(tx.contains("delete element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 }"));
        assert!(tx.contains("add element ip kube-proxy no-endpoint-services { 10.96.0.10 . tcp . 80 comment \"bench/svc-0:http\" : goto reject-chain }"));
        assert!(!tx.contains("cluster-ips"), "the ClusterIP stays: {tx}");
        assert_eq!(tx.matches("delete chain ").count(), 2, "{tx}");
        assert!(!tx.contains("add rule"));
    }
}
