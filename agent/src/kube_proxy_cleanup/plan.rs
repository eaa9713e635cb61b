//! Which chains and rules are kube-proxy's, and the `iptables-restore`
//! transaction that removes them. Pure.
//!
//! Ownership follows kube-proxy's own `--cleanup` (its iptables proxier's
//! `CleanupLeftovers`) rather than the `KUBE-` prefix, because other
//! components use that prefix too:
//!
//! - kube-proxy's, removed: in `nat` `KUBE-SERVICES`, `KUBE-NODEPORTS`,
//!   `KUBE-POSTROUTING`, `KUBE-MARK-MASQ` and the per-Service chains
//!   (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-SEP-`, `KUBE-EXT-`, `KUBE-FW-` and the
//!   pre-1.24 `KUBE-XLB-`); in `filter` `KUBE-SERVICES`,
//!   `KUBE-EXTERNAL-SERVICES`, `KUBE-FORWARD`, `KUBE-NODEPORTS` and
//!   `KUBE-PROXY-FIREWALL`; `KUBE-PROXY-CANARY` in `nat`, `filter` and `mangle`.
//! - the kubelet's, kept: `KUBE-FIREWALL` (the localnet guard, which kube-proxy
//!   only duplicates), `KUBE-KUBELET-CANARY`, `KUBE-MARK-DROP` and
//!   `KUBE-IPTABLES-HINT`. The kubelet recreates them anyway.
//! - anyone else's, kept: kube-router's `KUBE-ROUTER-*`, `KUBE-POD-FW-*`,
//!   `KUBE-NWPLCY-*` and so on.
//!
//! kube-proxy's IPVS mode (`KUBE-LOAD-BALANCER`, `KUBE-NODE-PORT`, ipsets, the
//! `kube-ipvs0` device) is not covered.
use std::collections::HashSet;

use super::save::SavedTable;

/// The tables kube-proxy writes to; the others are never touched.
pub const TABLES: [&str; 3] = ["nat", "filter", "mangle"];

const CANARY: &str = "KUBE-PROXY-CANARY";

const NAT: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    CANARY,
];

const FILTER: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-NODEPORTS",
    "KUBE-PROXY-FIREWALL",
    CANARY,
];

/// Per-Service chains: a 16-character hash follows each prefix.
const SERVICE_PREFIXES: &[&str] = &[
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-SEP-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-XLB-",
];

/// Whether kube-proxy's iptables mode created chain `chain` in table `table`.
pub fn kube_proxy_owns(table: &str, chain: &str) -> bool {
    match table {
        "nat" => {
            NAT.contains(&chain)
                || SERVICE_PREFIXES
                    .iter()
                    .any(|p| chain.strip_prefix(p).is_some_and(is_hash))
        }
        "filter" => FILTER.contains(&chain),
        "mangle" => chain == CANARY,
        _ => false,
    }
}

/// kube-proxy's `base32(sha256(…))[:16]`.
fn is_hash(s: &str) -> bool {
    s.len() == 16
        && s.bytes()
            .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
}

/// What to remove from one table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TablePlan {
    pub table: String,
    /// kube-proxy's chains, in the order the dump declared them.
    pub chains: Vec<String>,
    /// Rules in chains that stay (built-in ones, normally) that jump to a
    /// chain in `chains`.
    pub unlinks: Vec<Unlink>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unlink {
    pub chain: String,
    pub spec: String,
}

impl std::fmt::Display for Unlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "-A {} {}", self.chain, self.spec)
    }
}

impl TablePlan {
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.unlinks.is_empty()
    }

    /// One `iptables-restore --noflush` transaction: the chain lines flush
    /// kube-proxy's chains (dropping their jumps to each other), the `-D`s
    /// remove every other reference, and only then can `-X` delete them. If
    /// anything changed since the dump, the whole transaction fails and the
    /// table stays as it was.
    pub fn restore_input(&self) -> String {
        let mut out = format!("*{}\n", self.table);
        for c in &self.chains {
            out.push_str(&format!(":{c} - [0:0]\n"));
        }
        for u in &self.unlinks {
            out.push_str(&format!("-D {} {}\n", u.chain, u.spec));
        }
        for c in &self.chains {
            out.push_str(&format!("-X {c}\n"));
        }
        out.push_str("COMMIT\n");
        out
    }
}

/// What to remove from `table`; empty for tables kube-proxy does not use.
///
/// A rule that stays cannot jump to a chain that goes, so every such rule is
/// unlinked, not only kube-proxy's own jumps from the built-in chains: one
/// left behind would make the whole transaction fail. The dry run lists them.
pub fn plan(table: &SavedTable<'_>) -> TablePlan {
    let chains: Vec<String> = table
        .chains
        .iter()
        .filter(|c| !c.builtin && kube_proxy_owns(table.name, c.name))
        .map(|c| c.name.to_owned())
        .collect();
    let gone: HashSet<&str> = chains.iter().map(String::as_str).collect();
    let unlinks = table
        .rules
        .iter()
        .filter(|r| !gone.contains(r.chain))
        .filter(|r| r.target.as_deref().is_some_and(|t| gone.contains(t)))
        .map(|r| Unlink {
            chain: r.chain.to_owned(),
            spec: r.spec.to_owned(),
        })
        .collect();
    TablePlan {
        table: table.name.to_owned(),
        chains,
        unlinks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_proxy_cleanup::save::parse;

    #[test]
    fn ownership_is_kube_proxys_not_the_prefix() {
        for c in [
            "KUBE-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
            "KUBE-PROXY-CANARY",
            "KUBE-SVC-XPGD46QRK7WJZT7O",
            "KUBE-SEP-SXIVWICOYRO3J4NJ",
            "KUBE-SVL-4SW47YFZTEDKD3PK",
            "KUBE-EXT-4SW47YFZTEDKD3PK",
            "KUBE-FW-4SW47YFZTEDKD3PK",
            "KUBE-XLB-4SW47YFZTEDKD3PK",
        ] {
            assert!(kube_proxy_owns("nat", c), "{c}");
        }
        for c in [
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-NODEPORTS",
            "KUBE-PROXY-FIREWALL",
            "KUBE-PROXY-CANARY",
        ] {
            assert!(kube_proxy_owns("filter", c), "{c}");
        }
        assert!(kube_proxy_owns("mangle", "KUBE-PROXY-CANARY"));
        // The kubelet's, other components' and lookalikes.
        for (t, c) in [
            ("filter", "KUBE-FIREWALL"),
            ("nat", "KUBE-MARK-DROP"),
            ("nat", "KUBE-KUBELET-CANARY"),
            ("mangle", "KUBE-IPTABLES-HINT"),
            ("filter", "KUBE-ROUTER-INPUT"),
            ("filter", "KUBE-POD-FW-ABCDEFGHIJKLMNOP"),
            ("nat", "KUBE-SVC-mine"),
            ("nat", "KUBE-SEP-ABCDEFGHIJKLMNOP1"),
            ("filter", "KUBE-SVC-XPGD46QRK7WJZT7O"),
            ("mangle", "KUBE-SERVICES"),
            ("raw", "KUBE-PROXY-CANARY"),
            ("nat", "MYCHAIN"),
        ] {
            assert!(!kube_proxy_owns(t, c), "{t} {c}");
        }
    }

    const NAT: &str = r#"*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-DROP - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:MYCHAIN - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -o eth0 -j MASQUERADE
-A POSTROUTING -j MYCHAIN
-A KUBE-MARK-DROP -j MARK --set-xmark 0x8000/0x8000
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -d 172.30.0.41/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SVC-XPGD46QRK7WJZT7O -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -s 10.180.0.1/32 -j KUBE-MARK-MASQ
-A MYCHAIN -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A MYCHAIN -m comment --comment "-j KUBE-SERVICES" -j RETURN
COMMIT
"#;

    #[test]
    fn plans_chains_and_every_reference_from_chains_that_stay() {
        let t = parse(NAT).expect("parses");
        let p = plan(&t[0]);
        assert_eq!(
            p.chains,
            [
                "KUBE-MARK-MASQ",
                "KUBE-SERVICES",
                "KUBE-SVC-XPGD46QRK7WJZT7O",
                "KUBE-SEP-SXIVWICOYRO3J4NJ"
            ]
        );
        let unlinks: Vec<String> = p.unlinks.iter().map(ToString::to_string).collect();
        assert_eq!(
            unlinks,
            [
                r#"-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
                r#"-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
                "-A MYCHAIN -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
            ]
        );
        assert_eq!(
            p.restore_input(),
            r#"*nat
:KUBE-MARK-MASQ - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D MYCHAIN -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-X KUBE-MARK-MASQ
-X KUBE-SERVICES
-X KUBE-SVC-XPGD46QRK7WJZT7O
-X KUBE-SEP-SXIVWICOYRO3J4NJ
COMMIT
"#
        );
    }

    #[test]
    fn kubelet_chains_and_their_jumps_stay() {
        let text = "*filter\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n-A INPUT -j KUBE-FIREWALL\n-A OUTPUT -j KUBE-FIREWALL\n-A KUBE-FIREWALL -d 127.0.0.0/8 ! -s 127.0.0.0/8 -j DROP\nCOMMIT\n";
        let p = plan(&parse(text).expect("parses")[0]);
        assert_eq!(p.chains, ["KUBE-PROXY-CANARY"]);
        assert!(p.unlinks.is_empty());
    }

    #[test]
    fn nothing_to_do_without_kube_proxy_or_outside_its_tables() {
        let text = "*filter\n:INPUT ACCEPT [0:0]\n:MYCHAIN - [0:0]\n-A INPUT -j MYCHAIN\nCOMMIT\n*raw\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n";
        for t in parse(text).expect("parses") {
            assert!(plan(&t).is_empty(), "{}", t.name);
        }
    }
}
