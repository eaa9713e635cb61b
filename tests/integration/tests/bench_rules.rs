//! The kube-proxy rulesets of the datapath bench, loaded for real into a
//! throwaway node namespace: connections from there to a ClusterIP are DNAT'd
//! by the OUTPUT hook to the backends, an endpoint swap takes effect, and the
//! cleanup leaves nothing behind. Needs root.
use std::net::Ipv4Addr;

use anyhow::{Context as _, Result};
use weir_integration::{
    Topology,
    bench::rules::{
        self, Ipv4Cidr, Svc, Sync, Variant, flush_iptables, flush_nft, iptables_restore_input,
        iptables_save, iptables_update_input, load_iptables, load_nft, nft_endpoint_update,
        nft_input, nft_list_ruleset,
    },
    bin,
    topology::{BACKEND_TCP_PORT, Probe},
};

const SERVICES: usize = 10;
const ATTEMPTS: u32 = 50;

/// The node namespace is not in it, so its connections get masqueraded as
/// off-cluster traffic would, exercising the KUBE-POSTROUTING path too.
fn cluster_cidr() -> Ipv4Cidr {
    Ipv4Cidr::new(Ipv4Addr::new(10, 244, 0, 0), 16).expect("valid CIDR")
}

/// Three backends; the Services use be1 and be2, and the update swaps be2 for
/// be3 in the last one, so it both removes and adds an endpoint.
fn setup() -> Result<(Topology, Vec<Svc>)> {
    let topo = Topology::new(3)?;
    // A node routes the Service range somewhere; without a route connect()
    // fails before the OUTPUT hook gets the packet to DNAT.
    topo.node.sh("ip route add 10.96.0.0/12 dev br0")?;
    let eps = [endpoint(&topo, "be1"), endpoint(&topo, "be2")];
    Ok((topo, rules::synthetic(SERVICES, &eps)))
}

fn endpoint(topo: &Topology, name: &str) -> (Ipv4Addr, u16) {
    (topo.backend(name).ip, BACKEND_TCP_PORT)
}

fn swapped(topo: &Topology, services: &[Svc]) -> Vec<Svc> {
    let mut after = services.to_vec();
    let last = after.last_mut().expect("services");
    last.endpoints[1] = endpoint(topo, "be3");
    after
}

fn probe(topo: &Topology, svc: &Svc, count: u32) -> Result<Probe> {
    let out = topo
        .node
        .command(&bin("weir-testclient"))
        .args(["tcp", "--target", &format!("{}:{}", svc.vip, svc.port)])
        .args(["--count", &count.to_string()])
        .output()
        .context("running weir-testclient (build it: cargo build -p weir-integration --bins)")?;
    Probe::parse(&out)
}

/// Every attempt answered, by exactly `names`.
fn assert_reaches(p: &Probe, names: &[&str], what: &str) {
    assert_eq!(p.ok, p.attempts, "{what}: {p:?}");
    let got: Vec<&str> = p.backends.keys().map(String::as_str).collect();
    assert_eq!(got, names, "{what}: {p:?}");
}

/// After the cleanup the ClusterIP is just an address nobody has.
fn assert_untranslated(topo: &Topology, svc: &Svc) -> Result<()> {
    let p = probe(topo, svc, 1)?;
    assert_eq!(p.ok, 0, "{p:?}");
    Ok(())
}

fn iptables_round_trip(variant: Variant) -> Result<()> {
    let (topo, services) = setup()?;
    let ns = topo.node.path();
    let last = services.last().expect("services");

    load_iptables(
        &ns,
        variant,
        &iptables_restore_input(&services, cluster_cidr()),
    )?;
    assert_reaches(&probe(&topo, last, ATTEMPTS)?, &["be1", "be2"], "loaded");

    // The full resync kube-proxy writes after be2 gave way to be3.
    let after = swapped(&topo, &services);
    let new_last = after.last().expect("services");
    let full = iptables_update_input(&after, cluster_cidr(), last, Sync::Full);
    load_iptables(&ns, variant, &full)?;
    assert_reaches(
        &probe(&topo, last, ATTEMPTS)?,
        &["be1", "be3"],
        "full resync",
    );
    let saved = iptables_save(&ns, variant)?;
    let gone = rules::iptables::sep_chain(last, endpoint(&topo, "be2"));
    assert!(!saved.contains(&gone), "stale {gone} left:\n{saved}");

    // And back with the partial sync kube-proxy does by default.
    let partial = iptables_update_input(&services, cluster_cidr(), new_last, Sync::Partial);
    load_iptables(&ns, variant, &partial)?;
    assert_reaches(
        &probe(&topo, last, ATTEMPTS)?,
        &["be1", "be2"],
        "partial sync",
    );
    assert_reaches(
        &probe(&topo, &services[0], 20)?,
        &["be1", "be2"],
        "a Service the partial sync did not rewrite",
    );

    flush_iptables(&ns, variant)?;
    let saved = iptables_save(&ns, variant)?;
    assert!(!saved.contains("KUBE-"), "{saved}");
    assert!(!saved.lines().any(|l| l.starts_with("-A ")), "{saved}");
    if variant == Variant::Nft {
        let ruleset = nft_list_ruleset(&ns)?;
        assert!(ruleset.trim().is_empty(), "{ruleset}");
    }
    assert_untranslated(&topo, last)
}

#[test]
fn iptables_legacy_ruleset_balances_updates_and_cleans_up() -> Result<()> {
    iptables_round_trip(Variant::Legacy)
}

#[test]
fn iptables_nft_ruleset_balances_updates_and_cleans_up() -> Result<()> {
    iptables_round_trip(Variant::Nft)
}

#[test]
fn nftables_ruleset_balances_updates_incrementally_and_cleans_up() -> Result<()> {
    let (topo, services) = setup()?;
    let ns = topo.node.path();
    let last = services.last().expect("services");

    load_nft(&ns, &nft_input(&services, cluster_cidr()))?;
    assert_reaches(&probe(&topo, last, ATTEMPTS)?, &["be1", "be2"], "loaded");

    let after = swapped(&topo, &services);
    let new_last = after.last().expect("services");
    load_nft(&ns, &nft_endpoint_update(last, new_last, cluster_cidr()))?;
    assert_reaches(&probe(&topo, last, ATTEMPTS)?, &["be1", "be3"], "update");
    let ruleset = nft_list_ruleset(&ns)?;
    let gone = rules::nftables::endpoint_chain(last, endpoint(&topo, "be2"));
    let added = rules::nftables::endpoint_chain(new_last, endpoint(&topo, "be3"));
    assert!(!ruleset.contains(&gone), "stale {gone} left:\n{ruleset}");
    assert!(ruleset.contains(&added), "{ruleset}");
    assert_reaches(
        &probe(&topo, &services[0], 20)?,
        &["be1", "be2"],
        "a Service the update did not touch",
    );

    flush_nft(&ns)?;
    let ruleset = nft_list_ruleset(&ns)?;
    assert!(ruleset.trim().is_empty(), "{ruleset}");
    // Cleaning up twice is fine, as kube-proxy's --cleanup is.
    flush_nft(&ns)?;
    assert_untranslated(&topo, last)
}
