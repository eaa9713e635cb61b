//! XDP acceleration: used when asked for (its counters rise and its flows are
//! marked), and best-effort falls back to TC on a device without native XDP
//! (a bridge), which then handles that device's traffic.
use std::net::IpAddr;

use anyhow::{Result, ensure};
use weir_abi::{CT_DIR_FORWARD, CT_F_XDP, STAT_NEW_FLOW, STAT_PROG_TC_INGRESS, STAT_PROG_XDP};
use weir_integration::packet_topology::{
    BRIDGE_CLIENT4, BRIDGE_CLIENT6, BRIDGE_NODE4, BRIDGE_NODE6, CLIENT4, CLIENT6, LPOD, NODE_EXT4,
    Ns, PacketAgent, PacketTopology, RPOD,
    manifests::{Ep, READY, Svc},
};

use crate::support::{
    SETTLE, alive, external_frontends, linked_program, pod_of_dns, publish, serving, who,
};

fn svc() -> Svc {
    let mut s = Svc::load_balancer(
        "fast",
        "10.96.5.10",
        "fd00:96::5:10",
        [30480, 30753, 30453],
        &["192.168.70.60", "fd00:70::60"],
    );
    s.external_ips = vec!["192.168.60.60".into(), "fd00:60::60".into()];
    s
}

/// TCP, UDP echo and DNS through every external frontend, both families.
fn traffic(topo: &PacketTopology, svc: &Svc) -> Result<()> {
    for f in external_frontends(svc) {
        for _ in 0..3 {
            who(topo, Ns::Client, &f.ip, f.ports[0])?;
            let udp = topo.who_udp(Ns::Client, &f.ip, f.ports[1])?;
            assert!(udp.is_some(), "{} {} UDP: no answer", f.kind, f.ip);
            let dns = topo.dig(Ns::Client, &f.ip, f.ports[2], "A")?;
            assert!(
                dns.as_deref()
                    .and_then(|a| pod_of_dns(a, &[LPOD, RPOD]))
                    .is_some(),
                "{} {} DNS: {dns:?}",
                f.kind,
                f.ip
            );
        }
    }
    Ok(())
}

#[test]
fn native_xdp_translates_new_flows_as_its_counters_show() -> Result<()> {
    let topo = PacketTopology::new()?;
    let svc = svc();
    publish(&topo, &svc, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &["--acceleration=native"])?;
    serving(&topo, Ns::Client, NODE_EXT4, 30480)?;
    // These frontends SNAT: without `bpf_xdp_adjust_meta` XDP sees each
    // new flow and hands it to TC, which translates it.
    let meta = crate::support::xdp_meta();
    let counter = crate::support::xdp_snat_flow_counter();
    let before = agent.stat(STAT_PROG_XDP, counter)?;
    traffic(&topo, &svc)?;
    let after = agent.stat(STAT_PROG_XDP, counter)?;
    assert!(after > before, "xdp counter {counter} stayed at {before}");
    assert!(agent.inspect_stat(STAT_PROG_XDP, counter)? >= after);
    // XDP made flows of both families (their entries carry CT_F_XDP).
    let ct = agent.conntrack()?;
    for client in [CLIENT4, CLIENT6].into_iter().filter(|_| meta) {
        assert!(
            ct.iter().any(|(k, v)| v.flags & CT_F_XDP != 0
                && k.dir == CT_DIR_FORWARD
                && IpAddr::from(k.saddr).to_string() == client),
            "no XDP-made flow from {client} among {} entries",
            ct.len()
        );
    }
    // The program is attached in driver mode on wext, not generic (skb) mode.
    let out = topo
        .command(Ns::Node, "ip")
        .args(["-d", "link", "show", "wext"])
        .output()?;
    let link = String::from_utf8_lossy(&out.stdout);
    assert!(
        link.contains("prog/xdp") && !link.contains("xdpgeneric"),
        "wext: {link}"
    );
    alive(&mut agent)
}

#[test]
fn best_effort_xdp_falls_back_to_tc_on_a_device_without_native_xdp() -> Result<()> {
    let topo = PacketTopology::new()?;
    topo.add_device_without_xdp("wnoxdp")?;
    let svc = svc();
    publish(&topo, &svc, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(
        &topo,
        &[
            "--acceleration=best-effort",
            "--devices",
            "wext,wpod,wnode2,wnoxdp",
        ],
    )?;
    // It says so, names the device, and keeps running.
    agent.wait_for_log_line(
        0,
        &["WARN", "XDP acceleration unavailable on wnoxdp"],
        SETTLE,
    )?;
    // The TC program is on the bridge (the link the agent pinned for it runs
    // weir_tc_ingress; this bpftool predates tcx in `net show`), and no XDP
    // program is.
    let prog = linked_program(&agent, "tc-wnoxdp")?;
    ensure!(prog == "weir_tc_ingress", "tc-wnoxdp runs {prog}");
    let out = topo
        .command(Ns::Node, "ip")
        .args(["-d", "link", "show", "wnoxdp"])
        .output()?;
    let link = String::from_utf8_lossy(&out.stdout);
    ensure!(!link.contains("prog/xdp"), "wnoxdp got XDP: {link}");

    // Real traffic into the node through the bridge: its NodePort, both
    // families, TCP, UDP and DNS. TC translates every new flow; XDP sees none.
    serving(&topo, Ns::Client, BRIDGE_NODE4, 30480)?;
    let (tc, xdp) = (
        agent.stat(STAT_PROG_TC_INGRESS, STAT_NEW_FLOW)?,
        agent.stat(STAT_PROG_XDP, STAT_NEW_FLOW)?,
    );
    const ROUNDS: u64 = 3;
    for ip in [BRIDGE_NODE4, BRIDGE_NODE6] {
        for _ in 0..ROUNDS {
            who(&topo, Ns::Client, ip, 30480)?;
            let udp = topo.who_udp(Ns::Client, ip, 30753)?;
            ensure!(
                udp.is_some(),
                "{ip}:30753 UDP through the bridge: no answer"
            );
            let dns = topo.dig(Ns::Client, ip, 30453, "A")?;
            ensure!(
                dns.as_deref()
                    .and_then(|a| pod_of_dns(a, &[LPOD, RPOD]))
                    .is_some(),
                "{ip}:30453 DNS through the bridge: {dns:?}"
            );
        }
    }
    let (tc_after, xdp_after) = (
        agent.stat(STAT_PROG_TC_INGRESS, STAT_NEW_FLOW)?,
        agent.stat(STAT_PROG_XDP, STAT_NEW_FLOW)?,
    );
    ensure!(
        tc_after >= tc + 2 * 3 * ROUNDS,
        "tc-ingress new-flow went from {tc} to {tc_after} for {} flows through the bridge",
        2 * 3 * ROUNDS
    );
    ensure!(
        xdp_after == xdp,
        "XDP made flows ({xdp} → {xdp_after}) while only the bridge had traffic"
    );
    let ct = agent.conntrack()?;
    for client in [BRIDGE_CLIENT4, BRIDGE_CLIENT6] {
        let fwd: Vec<_> = ct
            .iter()
            .filter(|(k, _)| k.dir == CT_DIR_FORWARD && IpAddr::from(k.saddr).to_string() == client)
            .collect();
        ensure!(!fwd.is_empty(), "no flow from {client} in conntrack");
        ensure!(
            fwd.iter().all(|(_, v)| v.flags & CT_F_XDP == 0),
            "a flow from {client} is marked as made by XDP: {fwd:?}"
        );
    }

    // The veths keep native XDP: it makes the flows through wext, or hands
    // them to TC on a kernel without XDP metadata.
    let counter = crate::support::xdp_snat_flow_counter();
    let seen = agent.stat(STAT_PROG_XDP, counter)?;
    traffic(&topo, &svc)?;
    ensure!(
        agent.stat(STAT_PROG_XDP, counter)? > seen,
        "no XDP new flows through wext"
    );
    alive(&mut agent)
}
