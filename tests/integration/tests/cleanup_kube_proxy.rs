//! `weir-agent cleanup-kube-proxy` against kube-proxy's real rulesets: in a
//! throwaway namespace holding kube-proxy's iptables chains in both backends
//! and both families, its nftables tables, the kubelet's chains and unrelated
//! rules, a dry run changes nothing, a real run removes exactly kube-proxy's
//! part and a second run finds nothing. Needs root. Every tool runs in the
//! namespace through `nsenter --net`; the root namespace is never touched.
use std::{
    io::Write as _,
    net::Ipv4Addr,
    path::Path,
    process::{Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, Result, ensure};
use weir_integration::{
    bench::rules::{self, Ipv4Cidr, Variant, iptables_restore_input, load_iptables, load_nft},
    bin,
    topology::{NETNS_PREFIX, Netns},
};

/// The iptables backends and families, named like their tools.
const XTABLES: [&str; 4] = [
    "iptables-legacy",
    "ip6tables-legacy",
    "iptables-nft",
    "ip6tables-nft",
];

/// The kubelet's chains, which the cleanup keeps, and a kube-router-style
/// chain that only shares the prefix.
const KEPT_KUBE_CHAINS: [&str; 4] = [
    "KUBE-FIREWALL",
    "KUBE-KUBELET-CANARY",
    "KUBE-MARK-DROP",
    "KUBE-ROUTER-INPUT",
];
const KUBELET_CHAINS: [&str; 3] = ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-MARK-DROP"];

/// Rules that are nobody's business but the node admin's, including a comment
/// that mentions a kube-proxy chain and a chain with kube-proxy's prefix.
fn user_rules(v6: bool) -> String {
    let (pods, admin) = if v6 {
        ("fd00:10:244::/48", "2001:db8::/32")
    } else {
        ("10.244.0.0/16", "192.0.2.0/24")
    };
    format!(
        r#"*mangle
-A PREROUTING -p tcp -m tcp --dport 9999 -j MARK --set-xmark 0x1/0xffffffff
COMMIT
*filter
:MYCHAIN - [0:0]
:KUBE-ROUTER-INPUT - [0:0]
-A INPUT -j MYCHAIN
-A INPUT -p tcp -m tcp --dport 22 -m comment --comment "ssh, not -j KUBE-SERVICES" -j ACCEPT
-A INPUT -j KUBE-ROUTER-INPUT
-A MYCHAIN -s {admin} -j ACCEPT
-A KUBE-ROUTER-INPUT -s {pods} -m comment --comment "kube-router's, not kube-proxy's" -j RETURN
COMMIT
*nat
:MYCHAIN - [0:0]
-A PREROUTING -j MYCHAIN
-A POSTROUTING -s {pods} ! -d {pods} -j MASQUERADE
-A MYCHAIN -p tcp -m tcp --dport 8080 -j REDIRECT --to-ports 80
COMMIT
"#
    )
}

/// What the bench's IPv4 ruleset lacks: the canaries of kube-proxy and the
/// kubelet, and the kubelet's KUBE-MARK-DROP.
const V4_EXTRAS: &str = "*mangle
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*filter
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*nat
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-DROP - [0:0]
-A KUBE-MARK-DROP -j MARK --or-mark 0x8000
COMMIT
";

/// An IPv6 kube-proxy ruleset in kube-proxy's layout, with a NodePort Service
/// whose external traffic policy is Local (`KUBE-EXT`, `KUBE-SVL`), a
/// firewall chain and a Service without endpoints.
const V6_KUBE_PROXY: &str = r#"*mangle
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-FIREWALL - [0:0]
-I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-I INPUT -j KUBE-FIREWALL
-I OUTPUT -j KUBE-FIREWALL
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-SERVICES -d fd00:10:96::20/128 -p tcp -m comment --comment "ns2/svc2:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp6-port-unreachable
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-MARK-DROP - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SVL-XPGD46QRK7WJZT7O - [0:0]
:KUBE-EXT-XPGD46QRK7WJZT7O - [0:0]
:KUBE-FW-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-MARK-DROP -j MARK --or-mark 0x8000
-A KUBE-SERVICES -d fd00:10:96::10/128 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns1/svc1:p80" -m tcp --dport 30080 -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-FW-XPGD46QRK7WJZT7O
-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVL-XPGD46QRK7WJZT7O
-A KUBE-FW-XPGD46QRK7WJZT7O -j KUBE-MARK-DROP
-A KUBE-SVL-XPGD46QRK7WJZT7O -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SVC-XPGD46QRK7WJZT7O ! -s fd00:10:244::/48 -d fd00:10:96::10/128 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -s fd00:10:244::1/128 -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -p tcp -m tcp -j DNAT --to-destination [fd00:10:244::1]:80
COMMIT
"#;

/// The start of kube-proxy's IPv6 nftables table; the cleanup deletes the
/// table whole, so its contents matter less than for IPv4.
const V6_NFT: &str = r#"add table ip6 kube-proxy { comment "rules for kube-proxy" ; }
add chain ip6 kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip6 kube-proxy services
add rule ip6 kube-proxy nat-prerouting jump services
"#;

const USER_NFT: &str = "add table inet mytable
add chain inet mytable input { type filter hook input priority 0 ; policy accept ; }
add rule inet mytable input tcp dport 22 accept
";

fn netns() -> Result<Netns> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Netns::create(format!("{NETNS_PREFIX}{}-kpc{n}", std::process::id()))
}

/// `program args` in the namespace, `input` on stdin; fails unless it succeeds.
fn run_in(ns: &Netns, program: &Path, args: &[&str], input: Option<&str>) -> Result<Output> {
    let mut child = ns
        .command(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(input.unwrap_or_default().as_bytes())?;
    drop(stdin);
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "{} {args:?} failed ({}): {}{}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(out)
}

fn restore(ns: &Netns, tool: &str, input: &str) -> Result<()> {
    run_in(
        ns,
        Path::new(&format!("{tool}-restore")),
        &["--noflush"],
        Some(input),
    )
    .map(drop)
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every ruleset in the namespace as the tools print it.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    /// `iptables-save` per backend and family, without the timestamp
    /// comments and with counters zeroed.
    xtables: Vec<String>,
    nft_tables: String,
    mytable: String,
    nft_ruleset: String,
}

fn snapshot(ns: &Netns) -> Result<Snapshot> {
    let mut xtables = Vec::new();
    for tool in XTABLES {
        let out = run_in(ns, Path::new(&format!("{tool}-save")), &[], None)?;
        xtables.push(normalize(&text(&out)));
    }
    let nft = |args: &[&str]| run_in(ns, Path::new("nft"), args, None).map(|o| text(&o));
    let nft_tables = nft(&["list", "tables"])?;
    let mytable = if nft_tables.contains("table inet mytable\n") {
        nft(&["list", "table", "inet", "mytable"])?
    } else {
        String::new()
    };
    Ok(Snapshot {
        xtables,
        nft_tables,
        mytable,
        nft_ruleset: nft(&["list", "ruleset"])?,
    })
}

fn normalize(saved: &str) -> String {
    let mut out = String::new();
    for l in saved.lines().filter(|l| !l.starts_with('#')) {
        match l.strip_prefix(':').and_then(|c| c.rsplit_once(" [")) {
            Some((decl, _)) => out.push_str(&format!(":{decl} [0:0]")),
            None => out.push_str(l),
        }
        out.push('\n');
    }
    out
}

fn is_kubelet_line(l: &str) -> bool {
    KUBELET_CHAINS.iter().any(|c| {
        l.starts_with(&format!(":{c} "))
            || l.starts_with(&format!("-A {c} "))
            || l.ends_with(&format!(" -j {c}"))
    })
}

fn cleanup(ns: &Netns, args: &[&str]) -> Result<String> {
    let mut all = vec!["cleanup-kube-proxy"];
    all.extend_from_slice(args);
    let out = run_in(ns, &bin("weir-agent"), &all, None)
        .context("running weir-agent (build it: cargo build -p weir-agent)")?;
    Ok(text(&out))
}

#[test]
fn removes_exactly_kube_proxys_rules_in_every_backend_and_family() -> Result<()> {
    let ns = netns()?;
    let path = ns.path();

    for tool in XTABLES {
        restore(&ns, tool, &user_rules(tool.starts_with("ip6")))?;
    }
    run_in(&ns, Path::new("nft"), &["-f", "-"], Some(USER_NFT))?;
    let before = snapshot(&ns)?;

    let cidr = Ipv4Cidr::new(Ipv4Addr::new(10, 244, 0, 0), 16)?;
    let services = rules::synthetic(20, &[(Ipv4Addr::new(10, 244, 1, 5), 8080)]);
    let v4 = iptables_restore_input(&services, cidr);
    for (variant, tool) in [(Variant::Legacy, "legacy"), (Variant::Nft, "nft")] {
        load_iptables(&path, variant, &v4)?;
        restore(&ns, &format!("iptables-{tool}"), V4_EXTRAS)?;
        restore(&ns, &format!("ip6tables-{tool}"), V6_KUBE_PROXY)?;
    }
    load_nft(&path, &rules::nft_input(&services, cidr))?;
    load_nft(&path, V6_NFT)?;
    let loaded = snapshot(&ns)?;

    let dry = cleanup(&ns, &["--dry-run"])?;
    assert_eq!(
        snapshot(&ns)?,
        loaded,
        "the dry run changed something:\n{dry}"
    );
    let svc_chain = rules::iptables::svc_chain(&services[0]);
    for tool in XTABLES {
        for table in ["nat", "filter", "mangle"] {
            let head = format!("{tool}, table {table}: would remove ");
            assert!(dry.contains(&head), "no {head:?} in\n{dry}");
        }
    }
    for listed in [
        format!("  chain {svc_chain}\n"),
        "  chain KUBE-SEP-SXIVWICOYRO3J4NJ\n".to_owned(),
        "  chain KUBE-PROXY-CANARY\n".to_owned(),
        "  rule  -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n".to_owned(),
        "nftables: would remove table ip kube-proxy\n".to_owned(),
        "nftables: would remove table ip6 kube-proxy\n".to_owned(),
    ] {
        assert!(dry.contains(&listed), "no {listed:?} in\n{dry}");
    }
    for kept in KEPT_KUBE_CHAINS.iter().chain(&["MYCHAIN"]) {
        assert!(
            !dry.contains(&format!("chain {kept}\n")),
            "{kept} listed:\n{dry}"
        );
    }

    let removed = cleanup(&ns, &[])?;
    let after = snapshot(&ns)?;
    for (tool, (saved, old)) in XTABLES
        .iter()
        .zip(after.xtables.iter().zip(&before.xtables))
    {
        assert!(
            removed.contains(&format!("{tool}, table nat: removed ")),
            "{removed}"
        );
        for l in saved.lines() {
            let name = l
                .strip_prefix(':')
                .or_else(|| l.rsplit_once(" -j ").map(|(_, t)| t))
                .and_then(|s| s.split(' ').next())
                .unwrap_or_default();
            assert!(
                !name.starts_with("KUBE-") || KEPT_KUBE_CHAINS.contains(&name),
                "{tool}: {l:?} left:\n{saved}"
            );
        }
        for kubelet in [":KUBE-FIREWALL - [0:0]", "-A INPUT -j KUBE-FIREWALL"] {
            assert!(
                saved.contains(kubelet),
                "{tool}: {kubelet:?} gone:\n{saved}"
            );
        }
        // Without the kubelet's chains, exactly what was there before
        // kube-proxy: every unrelated rule, in its place.
        let rest: String = saved
            .lines()
            .filter(|l| !is_kubelet_line(l))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(&rest, old, "{tool}");
    }
    assert_eq!(after.nft_tables, before.nft_tables);
    assert_eq!(after.mytable, before.mytable);
    for family in ["ip", "ip6"] {
        let line = format!("nftables: removed table {family} kube-proxy\n");
        assert!(removed.contains(&line), "{removed}");
    }

    let again = cleanup(&ns, &[])?;
    assert!(again.contains("nothing to do"), "{again}");
    assert_eq!(snapshot(&ns)?, after);
    Ok(())
}

#[test]
fn an_empty_namespace_has_nothing_to_do() -> Result<()> {
    let ns = netns()?;
    let before = snapshot(&ns)?;
    for args in [&["--dry-run"][..], &[]] {
        let out = cleanup(&ns, args)?;
        assert!(out.contains("nothing to do"), "{out}");
    }
    assert_eq!(snapshot(&ns)?, before);
    Ok(())
}
