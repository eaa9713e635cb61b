//! kube-proxy's iptables mode: the `iptables-restore` input its sync loop
//! writes (filter and nat tables), and the loaders and cleanup for it.
//!
//! The order of lines follows kube-proxy's: every chain declaration of a table
//! before its rules, per Service the `KUBE-SERVICES` rule, then its
//! `KUBE-SVC-…` chain, then its `KUBE-SEP-…` chains, and the jump to
//! `KUBE-NODEPORTS` last.
use std::{fmt::Write as _, net::Ipv4Addr, path::Path};

use super::{Ipv4Cidr, RulesError, Svc, push_hash, run_in_netns};

/// Above this many endpoints in total kube-proxy enters "large cluster mode"
/// and drops the per-endpoint comments to keep the restore input small.
const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// kube-proxy's own flags: wait for the xtables lock, leave chains that are
/// not in the input alone, keep the counters of the rules that stay.
const RESTORE_ARGS: &[&str] = &["-w", "5", "-W", "100000", "--noflush", "--counters"];

/// kube-proxy installs these with `iptables -I` (prepend) on a full sync;
/// inserting them in this order in the restore input gives the same chains.
const FILTER_JUMPS: &[&str] = &[
    r#"-I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES"#,
    r#"-I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES"#,
    r#"-I INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS"#,
    r#"-I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
    r#"-I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
    r#"-I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD"#,
    r#"-I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL"#,
    r#"-I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL"#,
    r#"-I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL"#,
    // kubelet owns KUBE-FIREWALL; kube-proxy ensures the same jumps.
    "-I INPUT -j KUBE-FIREWALL",
    "-I OUTPUT -j KUBE-FIREWALL",
];

const NAT_JUMPS: &[&str] = &[
    r#"-I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
    r#"-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
    r#"-I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING"#,
];

const FILTER_CHAINS: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-NODEPORTS",
    "KUBE-PROXY-FIREWALL",
    "KUBE-FIREWALL",
];

const NAT_CHAINS: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
];

/// With the default `localhostNodePorts`, kube-proxy (and kubelet) block
/// martian connections to 127/8 that route_localnet would otherwise allow.
const LOCALNET_RULE: &str = r#"-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"#;

/// nf_conntrack_tcp_be_liberal is off by default, so kube-proxy drops INVALID.
const FORWARD_RULES: &str = concat!(
    "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n",
    r#"-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT"#,
    "\n",
    r#"-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"#,
    "\n",
);

/// The default masquerade bit 14; `--random-fully` since iptables ≥ 1.6.2.
const MASQ_RULES: &str = concat!(
    "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n",
    "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n",
    r#"-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully"#,
    "\n",
    "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n",
);

const NODEPORTS_RULE: &str = r#"-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"#;

/// Which iptables backend loads the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// x_tables: every restore replaces the whole table blob in the kernel.
    Legacy,
    /// iptables rules translated to nftables (tables `ip nat` / `ip filter`).
    Nft,
}

impl Variant {
    pub const fn restore_program(self) -> &'static str {
        match self {
            Self::Legacy => "iptables-legacy-restore",
            Self::Nft => "iptables-nft-restore",
        }
    }

    pub const fn save_program(self) -> &'static str {
        match self {
            Self::Legacy => "iptables-legacy-save",
            Self::Nft => "iptables-nft-save",
        }
    }
}

/// How kube-proxy resyncs after a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// Every chain rewritten: at start, after a failure, after the iptables
    /// monitor saw a flush, and (outside large cluster mode) hourly.
    Full,
    /// Only the changed Service's `KUBE-SVC`/`KUBE-SEP` chains are rewritten,
    /// though the top-level chains, with one rule per Service in
    /// `KUBE-SERVICES`, still are. kube-proxy's default since v1.27.
    Partial,
}

/// `KUBE-SVC-<hash>` of a Service port.
pub fn svc_chain(svc: &Svc) -> String {
    svc_chain_of(&svc.port_name_string(), svc.proto.as_str())
}

/// `KUBE-SEP-<hash>` of one endpoint of a Service port.
pub fn sep_chain(svc: &Svc, ep: (Ipv4Addr, u16)) -> String {
    sep_chain_of(
        &svc.port_name_string(),
        svc.proto.as_str(),
        &format!("{}:{}", ep.0, ep.1),
    )
}

fn svc_chain_of(port_name: &str, proto: &str) -> String {
    let mut s = String::with_capacity(25);
    s.push_str("KUBE-SVC-");
    push_hash::<16>(&mut s, &[port_name, proto]);
    s
}

fn sep_chain_of(port_name: &str, proto: &str, endpoint: &str) -> String {
    let mut s = String::with_capacity(25);
    s.push_str("KUBE-SEP-");
    push_hash::<16>(&mut s, &[port_name, proto, endpoint]);
    s
}

/// The nat chains of one Service port; none without endpoints.
fn chains_of(svc: &Svc) -> Vec<String> {
    if svc.endpoints.is_empty() {
        return Vec::new();
    }
    let mut v = vec![svc_chain(svc)];
    v.extend(svc.endpoints.iter().map(|&ep| sep_chain(svc, ep)));
    v
}

/// kube-proxy's first sync: both tables, plus the jumps from the built-in
/// chains that it installs with separate `iptables` calls before it (here in
/// the same transaction). Load it with [`load_iptables`].
pub fn iptables_restore_input(services: &[Svc], cluster_cidr: Ipv4Cidr) -> String {
    render(services, cluster_cidr, true, None, &[])
}

/// The resync kube-proxy writes after one Service port changed from `old` to
/// its counterpart in `services` (the state after the change; absent when the
/// port was removed). Chains that only `old` had are flushed and deleted, as
/// kube-proxy's stale-chain cleanup does.
pub fn iptables_update_input(
    services: &[Svc],
    cluster_cidr: Ipv4Cidr,
    old: &Svc,
    sync: Sync,
) -> String {
    let keep = services
        .iter()
        .find(|s| s.same_port(old))
        .map(chains_of)
        .unwrap_or_default();
    let stale: Vec<String> = chains_of(old)
        .into_iter()
        .filter(|c| !keep.contains(c))
        .collect();
    let rewrite = match sync {
        Sync::Full => None,
        Sync::Partial => Some(old),
    };
    render(services, cluster_cidr, false, rewrite, &stale)
}

/// One endpoint's pieces, formatted once.
struct Endpoint {
    ip: String,
    addr: String,
    chain: String,
}

/// kube-proxy caches "1/n" to ten decimals, as `%0.10f` prints it.
#[derive(Default)]
struct Probabilities(Vec<String>);

impl Probabilities {
    fn get(&mut self, n: usize) -> &str {
        while self.0.len() <= n {
            let i = self.0.len();
            self.0.push(format!("{:.10}", 1.0 / i as f64));
        }
        &self.0[n]
    }
}

/// `rewrite`: `None` writes the chains of every Service; `Some(s)` only those
/// of the Service object `s` belongs to (a partial sync).
fn render(
    services: &[Svc],
    cidr: Ipv4Cidr,
    jumps: bool,
    rewrite: Option<&Svc>,
    stale: &[String],
) -> String {
    let total: usize = services.iter().map(|s| s.endpoints.len()).sum();
    let large = total > LARGE_CLUSTER_ENDPOINTS;
    let mut probs = Probabilities::default();

    let mut filter = String::with_capacity(4096);
    filter.push_str("*filter\n");
    for c in FILTER_CHAINS {
        let _ = writeln!(filter, ":{c} - [0:0]");
    }
    if jumps {
        for j in FILTER_JUMPS {
            filter.push_str(j);
            filter.push('\n');
        }
    }
    filter.push_str(LOCALNET_RULE);
    filter.push('\n');

    let written = rewrite.map_or(services.len(), |r| {
        services.iter().filter(|s| s.same_service(r)).count()
    });
    let written_eps = if rewrite.is_none() { total } else { 64 };
    let mut chains = String::with_capacity(256 + (written + written_eps + stale.len()) * 32);
    let mut rules =
        String::with_capacity(1024 + services.len() * 200 + written * 200 + written_eps * 400);
    chains.push_str("*nat\n");
    for c in NAT_CHAINS {
        let _ = writeln!(chains, ":{c} - [0:0]");
    }
    if jumps {
        for j in NAT_JUMPS {
            rules.push_str(j);
            rules.push('\n');
        }
    }
    rules.push_str(MASQ_RULES);

    let not_cluster = format!(" ! -s {cidr} -j KUBE-MARK-MASQ\n");
    for svc in services {
        let spn = svc.port_name_string();
        let p = svc.proto.as_str();
        let l4 = format!(" -m {p} -p {p}");
        let dest = format!("{l4} -d {} --dport {}", svc.vip, svc.port);
        if svc.endpoints.is_empty() {
            let _ = writeln!(
                filter,
                r#"-A KUBE-SERVICES -m comment --comment "{spn} has no endpoints"{dest} -j REJECT"#
            );
            continue;
        }
        let svc_chain = svc_chain_of(&spn, p);
        let cluster_ip = format!(" -m comment --comment \"{spn} cluster IP\"{dest}");
        push!(rules, "-A KUBE-SERVICES", &cluster_ip);
        push!(rules, " -j ", &svc_chain, "\n");
        if rewrite.is_some_and(|r| !svc.same_service(r)) {
            continue;
        }
        push!(chains, ":", &svc_chain, " - [0:0]\n");
        // Off-cluster sources reaching a ClusterIP (via a route to a node) may
        // be answered from another node, so kube-proxy masquerades them.
        push!(rules, "-A ", &svc_chain, &cluster_ip, &not_cluster);
        let eps: Vec<Endpoint> = svc
            .endpoints
            .iter()
            .map(|&(ip, port)| {
                let ip = ip.to_string();
                let addr = format!("{ip}:{port}");
                let chain = sep_chain_of(&spn, p, &addr);
                Endpoint { ip, addr, chain }
            })
            .collect();
        // Each rule takes 1/k of what the rules before it left over, so every
        // endpoint ends up with 1/n; the last one needs no match at all.
        let n = eps.len();
        for (i, ep) in eps.iter().enumerate() {
            push!(rules, "-A ", &svc_chain);
            if !large {
                let _ = write!(rules, r#" -m comment --comment "{spn} -> {}""#, ep.addr);
            }
            if i + 1 < n {
                push!(rules, " -m statistic --mode random --probability ");
                push!(rules, probs.get(n - i));
            }
            push!(rules, " -j ", &ep.chain, "\n");
        }
        let comment = if large {
            String::new()
        } else {
            format!(" -m comment --comment {spn}")
        };
        for ep in &eps {
            push!(chains, ":", &ep.chain, " - [0:0]\n");
            // Hairpin: a pod reaching itself through the Service must see the
            // node as the source, or it would answer itself directly.
            push!(rules, "-A ", &ep.chain, &comment, " -s ", &ep.ip);
            push!(rules, " -j KUBE-MARK-MASQ\n-A ", &ep.chain, &comment, &l4);
            push!(rules, " -j DNAT --to-destination ", &ep.addr, "\n");
        }
    }
    for c in stale {
        // A chain line flushes the chain, so nothing references it by `-X`.
        let _ = writeln!(chains, ":{c} - [0:0]");
        let _ = writeln!(rules, "-X {c}");
    }
    rules.push_str(NODEPORTS_RULE);
    rules.push_str("\nCOMMIT\n");

    filter.push_str(FORWARD_RULES);
    filter.push_str("COMMIT\n");
    let mut out = String::with_capacity(filter.len() + chains.len() + rules.len());
    out.push_str(&filter);
    out.push_str(&chains);
    out.push_str(&rules);
    out
}

/// Loads a restore input into the namespace at `netns` as one transaction,
/// with the flags kube-proxy uses.
pub fn load_iptables(
    netns: impl AsRef<Path>,
    variant: Variant,
    input: &str,
) -> Result<(), RulesError> {
    run_in_netns(
        netns.as_ref(),
        variant.restore_program(),
        RESTORE_ARGS,
        Some(input),
    )
    .map(drop)
}

/// `iptables-save` of every table in the namespace at `netns`.
pub fn iptables_save(netns: impl AsRef<Path>, variant: Variant) -> Result<String, RulesError> {
    run_in_netns(netns.as_ref(), variant.save_program(), &[], None)
}

/// Removes every `KUBE-*` chain and every jump to one, as kube-proxy's
/// `--cleanup` does. With [`Variant::Nft`] the `nat` and `filter` tables are
/// deleted too once nothing is left in them, so no empty NAT hook lingers to
/// slow the next contender in the namespace; legacy tables cannot be removed.
pub fn flush_iptables(netns: impl AsRef<Path>, variant: Variant) -> Result<(), RulesError> {
    let netns = netns.as_ref();
    let cleanup = cleanup_input(&iptables_save(netns, variant)?);
    if !cleanup.is_empty() {
        load_iptables(netns, variant, &cleanup)?;
    }
    if variant == Variant::Nft {
        let saved = iptables_save(netns, variant)?;
        for table in idle_tables(&saved) {
            run_in_netns(netns, "nft", &["delete", "table", "ip", table], None)?;
        }
    }
    Ok(())
}

/// A restore input that unlinks and deletes the `KUBE-*` chains in `saved`.
fn cleanup_input(saved: &str) -> String {
    let mut out = String::new();
    let mut table = "";
    let mut chains: Vec<&str> = Vec::new();
    let mut unlinks: Vec<&str> = Vec::new();
    for line in saved.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t;
        } else if let Some(c) = line.strip_prefix(':') {
            let name = c.split(' ').next().unwrap_or_default();
            if name.starts_with("KUBE-") {
                chains.push(name);
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split(' ').next().unwrap_or_default();
            if !chain.starts_with("KUBE-") && jumps_to_kube(rule) {
                unlinks.push(rule);
            }
        } else if line == "COMMIT" {
            if !chains.is_empty() || !unlinks.is_empty() {
                let _ = writeln!(out, "*{table}");
                // Chain lines flush first, so `-X` finds nothing referencing them.
                for c in &chains {
                    let _ = writeln!(out, ":{c} - [0:0]");
                }
                for r in &unlinks {
                    let _ = writeln!(out, "-D {r}");
                }
                for c in &chains {
                    let _ = writeln!(out, "-X {c}");
                }
                out.push_str("COMMIT\n");
            }
            chains.clear();
            unlinks.clear();
        }
    }
    out
}

fn jumps_to_kube(rule: &str) -> bool {
    let t: Vec<&str> = rule.split_whitespace().collect();
    t.windows(2)
        .any(|w| matches!(w[0], "-j" | "-g") && w[1].starts_with("KUBE-"))
}

/// The `nat` and `filter` tables in `saved` with no rule, no user chain and
/// only ACCEPT policies: removing them changes nothing but the hooks.
fn idle_tables(saved: &str) -> Vec<&'static str> {
    let mut idle = Vec::new();
    let mut table = None;
    let mut busy = false;
    for line in saved.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = ["nat", "filter"].into_iter().find(|&k| k == t);
            busy = false;
        } else if line.starts_with("-A ") {
            busy = true;
        } else if let Some(c) = line.strip_prefix(':') {
            busy |= c.split(' ').nth(1) != Some("ACCEPT");
        } else if line == "COMMIT"
            && let Some(t) = table.take().filter(|_| !busy)
        {
            idle.push(t);
        }
    }
    idle
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::rules::{
        synthetic,
        tests::{ep, kube_proxy_svc, pod_cidr},
    };

    fn nat_rules(input: &str) -> Vec<&str> {
        let nat = input.split("*nat\n").nth(1).expect("nat table");
        nat.lines().filter(|l| l.starts_with("-A ")).collect()
    }

    /// Names from kube-proxy's TestOverallIPTablesRules expected dump.
    #[test]
    fn chain_names_match_kube_proxys_test_data() {
        let svc1 = kube_proxy_svc("ns1", "svc1", [172, 30, 0, 41], &[[10, 180, 0, 1]]);
        assert_eq!(svc_chain(&svc1), "KUBE-SVC-XPGD46QRK7WJZT7O");
        assert_eq!(
            sep_chain(&svc1, svc1.endpoints[0]),
            "KUBE-SEP-SXIVWICOYRO3J4NJ"
        );
        let svc4 = kube_proxy_svc("ns4", "svc4", [172, 30, 0, 44], &[]);
        assert_eq!(svc_chain(&svc4), "KUBE-SVC-4SW47YFZTEDKD3PK");
        let kube_ep = |d| (Ipv4Addr::new(10, 180, 0, d), 80);
        assert_eq!(sep_chain(&svc4, kube_ep(4)), "KUBE-SEP-UKSFD7AGPMPPLUHC");
        assert_eq!(sep_chain(&svc4, kube_ep(5)), "KUBE-SEP-C6EBXVWJJZMIWKLZ");
        // The same endpoint in another Service gets another chain.
        let svc3 = kube_proxy_svc("ns3", "svc3", [172, 30, 0, 43], &[]);
        let svc5 = kube_proxy_svc("ns5", "svc5", [172, 30, 0, 45], &[]);
        assert_eq!(sep_chain(&svc3, kube_ep(3)), "KUBE-SEP-OYPFS5VJICHGATKP");
        assert_eq!(sep_chain(&svc5, kube_ep(3)), "KUBE-SEP-I77PXRDZVX7PMWMN");
    }

    /// The lines kube-proxy's TestOverallIPTablesRules expects for its
    /// two-endpoint ClusterIP service and its service without endpoints; the
    /// fake iptables there lacks `--random-fully`, real ones have it.
    #[test]
    fn rules_match_kube_proxys_expected_dump() {
        let svcs = [
            kube_proxy_svc(
                "ns4",
                "svc4",
                [172, 30, 0, 44],
                &[[10, 180, 0, 4], [10, 180, 0, 5]],
            ),
            kube_proxy_svc("ns6", "svc6", [172, 30, 0, 46], &[]),
        ];
        let input = iptables_restore_input(&svcs, pod_cidr());
        let expected = [
            r#"-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT"#,
            r#"-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"#,
            r#"-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT"#,
            r#"-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK"#,
            r#"-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"#,
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
            "-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ",
            "-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80",
            "-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ",
            "-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80",
            r#"-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ"#,
            r#"-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC"#,
            r#"-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ"#,
        ];
        let lines: Vec<&str> = input.lines().collect();
        for e in expected {
            assert!(lines.contains(&e), "missing {e}\nin\n{input}");
        }
        let last_nat_rule = nat_rules(&input).pop();
        assert!(last_nat_rule.is_some_and(|r| r.contains("-j KUBE-NODEPORTS")));
        // The no-endpoint Service has no nat chains at all.
        assert!(!input.contains("ns6/svc6:p80 cluster IP"));
    }

    #[test]
    fn fan_out_takes_one_over_the_remaining_count() {
        let svc = synthetic(1, &[ep(1), ep(2), ep(3)]).remove(0);
        let input = iptables_restore_input(std::slice::from_ref(&svc), pod_cidr());
        let chain = format!("-A {} ", svc_chain(&svc));
        let fan: Vec<&str> = nat_rules(&input)
            .into_iter()
            .filter(|l| l.starts_with(&chain) && !l.contains("KUBE-MARK-MASQ"))
            .collect();
        assert_eq!(fan.len(), 3, "{fan:#?}");
        assert!(fan[0].contains("--probability 0.3333333333 "));
        assert!(fan[1].contains("--probability 0.5000000000 "));
        assert!(!fan[2].contains("statistic"));
        for (line, &ep) in fan.iter().zip(&svc.endpoints) {
            assert!(line.ends_with(&format!("-j {}", sep_chain(&svc, ep))));
        }
    }

    #[test]
    fn rule_and_chain_counts_scale_as_kube_proxys() {
        let eps = [ep(1), ep(2)];
        let (n, m) = (20, eps.len());
        let input = iptables_restore_input(&synthetic(n, &eps), pod_cidr());
        // KUBE-SERVICES + masquerade + fan-out + 2 per endpoint chain, plus
        // KUBE-POSTROUTING (3), KUBE-MARK-MASQ, the nodeports jump and the 3
        // jumps from built-in chains.
        assert_eq!(nat_rules(&input).len(), n * (2 + 3 * m) + 3 + 1 + 1);
        let nat = input.split("*nat\n").nth(1).expect("nat");
        assert_eq!(
            nat.lines().filter(|l| l.starts_with(':')).count(),
            4 + n * (1 + m)
        );
        assert_eq!(nat.lines().filter(|l| l.starts_with("-I ")).count(), 3);
        let filter = input.split("*nat\n").next().expect("filter");
        assert_eq!(filter.lines().filter(|l| l.starts_with("-I ")).count(), 11);
        assert_eq!(input.matches("COMMIT\n").count(), 2);
    }

    #[test]
    fn large_clusters_drop_the_per_endpoint_comments_only() {
        let eps = [ep(1), ep(2)];
        let small = iptables_restore_input(&synthetic(500, &eps), pod_cidr());
        let large = iptables_restore_input(&synthetic(501, &eps), pod_cidr());
        assert!(small.contains("-m comment --comment bench/svc-0:http -s 10.1.0.1"));
        assert!(large.contains("-A KUBE-SEP-"));
        assert!(!large.contains("-m comment --comment bench/svc-0:http -s"));
        assert!(!large.contains("\"bench/svc-0:http -> "));
        assert!(large.contains("\"bench/svc-0:http cluster IP\""));
    }

    #[test]
    fn updates_delete_stale_chains_and_partial_ones_skip_unchanged_services() {
        let (a, b, c) = (ep(1), ep(2), ep(3));
        let mut svcs = synthetic(3, &[a, b]);
        let old = svcs[2].clone();
        svcs[2].endpoints = vec![a, c];
        let gone = sep_chain(&old, b);
        let fresh = sep_chain(&svcs[2], c);
        let unchanged = sep_chain(&svcs[0], a);

        let full = iptables_update_input(&svcs, pod_cidr(), &old, Sync::Full);
        assert!(full.contains(&format!("\n-X {gone}\n")));
        assert!(full.contains(&format!("\n:{gone} - [0:0]\n")));
        assert!(full.contains(&format!(":{fresh} - [0:0]")));
        assert!(full.contains(&format!(":{unchanged} - [0:0]")));
        assert!(!full.contains("-I "), "jumps exist already");

        let partial = iptables_update_input(&svcs, pod_cidr(), &old, Sync::Partial);
        assert!(partial.contains(&format!("\n-X {gone}\n")));
        assert!(partial.contains(&format!(":{fresh} - [0:0]")));
        assert!(!partial.contains(&unchanged));
        // Every Service keeps its KUBE-SERVICES rule.
        assert_eq!(
            partial.matches(" cluster IP\" -m tcp -p tcp -d ").count(),
            3 + 1
        );
    }

    #[test]
    fn cleanup_removes_only_kube_chains_and_then_idle_tables() {
        let saved = "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:OTHER - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A PREROUTING -j OTHER\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n";
        assert_eq!(
            cleanup_input(saved),
            "*nat\n:KUBE-SERVICES - [0:0]\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-X KUBE-SERVICES\nCOMMIT\n"
        );
        assert!(cleanup_input("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n").is_empty());
        // Only empty, accepting nat and filter tables are left to delete.
        let saved = "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n*filter\n:INPUT DROP [0:0]\nCOMMIT\n*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n";
        assert_eq!(idle_tables(saved), ["nat"]);
        let busy = "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j ACCEPT\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:X - [0:0]\nCOMMIT\n";
        assert!(idle_tables(busy).is_empty());
    }
}
