//! XDP acceleration: used when asked for (its counters rise and its flows are
//! marked), and best-effort falls back to TC on a device without native XDP.
use std::time::Duration;

use anyhow::Result;
use weir_abi::{CT_DIR_FORWARD, CT_F_XDP, STAT_NEW_FLOW, STAT_PROG_XDP};
use weir_integration::packet_topology::{
    CLIENT4, CLIENT6, LPOD, Ns, PacketAgent, PacketTopology, RPOD,
    agent::ip_of,
    manifests::{Ep, READY, Svc},
};

use crate::support::{alive, external_frontends, pod_of_dns, poll, publish, who};

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
    publish(
        &topo,
        &svc,
        &[Ep::local(LPOD, READY), Ep::remote(RPOD, READY)],
    )?;
    let mut agent = PacketAgent::start(&topo, &["--acceleration=native"])?;
    poll(Duration::from_secs(5), "first answer", || {
        Ok(topo
            .who_tcp(Ns::Client, "192.168.50.1", 30480)?
            .who()
            .ok_or(()))
    })?;
    let before = agent.stat(STAT_PROG_XDP, STAT_NEW_FLOW)?;
    traffic(&topo, &svc)?;
    let after = agent.stat(STAT_PROG_XDP, STAT_NEW_FLOW)?;
    assert!(after > before, "xdp new-flow stayed at {before}");
    assert!(agent.inspect_stat(STAT_PROG_XDP, STAT_NEW_FLOW)? >= after);
    // XDP made flows of both families (their entries carry CT_F_XDP).
    let ct = agent.conntrack()?;
    for client in [CLIENT4, CLIENT6] {
        assert!(
            ct.iter().any(|(k, v)| v.flags & CT_F_XDP != 0
                && k.dir == CT_DIR_FORWARD
                && ip_of(&k.saddr).to_string() == client),
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
    publish(
        &topo,
        &svc,
        &[Ep::local(LPOD, READY), Ep::remote(RPOD, READY)],
    )?;
    let mut agent = PacketAgent::start(
        &topo,
        &[
            "--acceleration=best-effort",
            "--devices",
            "wext,wpod,wnode2,wnoxdp",
        ],
    )?;
    // It says so, names the device, and keeps running.
    agent.wait_for_log_line(0, &["WARN", "wnoxdp"], Duration::from_secs(5))?;
    poll(Duration::from_secs(5), "first answer", || {
        Ok(topo
            .who_tcp(Ns::Client, "192.168.50.1", 30480)?
            .who()
            .ok_or(()))
    })?;
    traffic(&topo, &svc)?;
    // The veths that can still run XDP natively.
    assert!(agent.stat(STAT_PROG_XDP, STAT_NEW_FLOW)? > 0);
    // No XDP program on the bridge (the TC program serves it).
    let out = topo
        .command(Ns::Node, "ip")
        .args(["-d", "link", "show", "wnoxdp"])
        .output()?;
    let link = String::from_utf8_lossy(&out.stdout);
    assert!(!link.contains("prog/xdp"), "wnoxdp got XDP: {link}");
    alive(&mut agent)
}
