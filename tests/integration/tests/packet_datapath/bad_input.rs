//! Bad input of the packet datapath's fields: each bad Service is skipped with
//! an error naming the object and the field, and the good ones applied with
//! them keep working, whether the bad input is there at start, arrives while
//! the agent runs, or a good Service turns bad.
use anyhow::{Result, ensure};
use serde_json::json;
use weir_integration::packet_topology::{
    LPOD, NODE_EXT4, Ns, PacketAgent, PacketTopology, RPOD,
    manifests::{Ep, READY, Svc, service_with},
};

use crate::support::{SETTLE, alive, serving};

fn np(name: &str, n: u8, ports: [u16; 3]) -> Svc {
    Svc::node_port(
        name,
        &format!("10.96.8.{n}"),
        &format!("fd00:96::8:{n}"),
        ports,
    )
}

/// Writes `svc` with a creationTimestamp `ts`, so "first wins" is defined.
fn write(topo: &PacketTopology, svc: &Svc, ts: &str) -> Result<()> {
    let eps = [Ep::local(LPOD, READY), Ep::remote(RPOD, READY)];
    let text = service_with(svc, &eps);
    let mut v = svc.to_json();
    v["metadata"]["creationTimestamp"] = json!(ts);
    let text = text.replacen(&svc.manifest(), &v.to_string(), 1);
    topo.write_manifest(&format!("{}.yaml", svc.name), &text)
}

#[test]
fn bad_packet_datapath_fields_are_named_and_the_rest_keeps_working() -> Result<()> {
    let topo = PacketTopology::new()?;
    let t0 = "2026-01-01T00:00:00Z";
    let t1 = "2026-01-02T00:00:00Z";
    // The good ones.
    write(&topo, &np("good", 1, [30080, 30353, 30053]), t0)?;
    write(&topo, &np("dup-first", 2, [30500, 30501, 30502]), t0)?;
    // nodePort outside --nodeport-range (30000-32767 by default).
    write(&topo, &np("np-range", 3, [29999, 30601, 30602]), t1)?;
    // nodePort already used by an older Service (same port and protocol).
    write(&topo, &np("dup-second", 4, [30500, 30701, 30702]), t1)?;
    // externalIP equal to a node address.
    let mut ext = Svc::cluster_ip("ext-node", "10.96.8.5", "fd00:96::8:5");
    ext.external_ips = vec![NODE_EXT4.into()];
    write(&topo, &ext, t1)?;
    // Affinity timeouts 0 and above 86400.
    for (n, (name, t)) in [("aff-zero", 0), ("aff-big", 86401)]
        .into_iter()
        .enumerate()
    {
        let mut s = Svc::cluster_ip(
            name,
            &format!("10.96.8.{}", 6 + n),
            &format!("fd00:96::8:{}", 6 + n),
        );
        s.affinity_timeout = Some(t);
        write(&topo, &s, t1)?;
    }
    // A malformed source range.
    let mut ranged = Svc::load_balancer(
        "bad-range",
        "10.96.8.8",
        "fd00:96::8:8",
        [30801, 30802, 30803],
        &["192.168.70.80"],
    );
    ranged.source_ranges = vec!["192.168.50.0/33".into()];
    write(&topo, &ranged, t1)?;

    let mut agent = PacketAgent::start(&topo, &[])?;
    for (name, field, value) in [
        ("np-range", "spec.ports[0].nodePort", "29999"),
        ("dup-second", "spec.ports[0].nodePort", "30500"),
        ("ext-node", "spec.externalIPs[0]", NODE_EXT4),
        (
            "aff-zero",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            "0",
        ),
        (
            "aff-big",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            "86401",
        ),
        (
            "bad-range",
            "spec.loadBalancerSourceRanges[0]",
            "192.168.50.0/33",
        ),
    ] {
        agent.wait_for_log_line(0, &[&format!("default/{name}"), field, value], SETTLE)?;
    }

    // Skipped: none of the bad Services' frontends is programmed.
    let services = agent.inspect("services")?.to_string();
    for vip in [
        "10.96.8.3",
        "10.96.8.4",
        "10.96.8.5",
        "10.96.8.6",
        "10.96.8.7",
        "10.96.8.8",
    ] {
        assert!(
            !services.contains(&format!("\"{vip}\"")),
            "{vip} is programmed: {services}"
        );
    }
    // The good ones serve through their NodePorts, both families.
    for (ip, port) in [
        ("192.168.50.1", 30080),
        ("fd00:50::1", 30080),
        ("192.168.50.1", 30500),
        ("fd00:50::1", 30500),
    ] {
        serving(&topo, Ns::Client, ip, port)?;
    }
    alive(&mut agent)
}

/// Whether any frontend in the maps has `vip` as its address or `port` as
/// its port.
fn programmed(agent: &PacketAgent, vip: &str, port: u16) -> Result<bool> {
    let all = agent.inspect("services")?;
    Ok(all
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| v["vip"] == vip || v["port"] == port))
}

#[test]
fn bad_services_arriving_at_runtime_are_named_and_the_rest_keeps_working() -> Result<()> {
    let topo = PacketTopology::new()?;
    let t0 = "2026-01-01T00:00:00Z";
    let t1 = "2026-01-02T00:00:00Z";
    write(&topo, &np("good", 1, [30080, 30353, 30053]), t0)?;
    write(&topo, &np("turns-bad", 2, [30900, 30901, 30902]), t0)?;
    let mut agent = PacketAgent::start(&topo, &[])?;
    let good = [
        ("192.168.50.1", 30080),
        ("fd00:50::1", 30080),
        ("192.168.50.1", 30900),
        ("fd00:50::1", 30900),
    ];
    for (ip, port) in good {
        serving(&topo, Ns::Client, ip, port)?;
    }

    // A new Service with a nodePort outside the range, and one with a
    // malformed source range, written while the agent runs.
    let from = agent.log_text().len();
    write(&topo, &np("late-range", 3, [29999, 30601, 30602]), t1)?;
    let mut ranged = Svc::load_balancer(
        "late-cidr",
        "10.96.8.4",
        "fd00:96::8:4",
        [30701, 30702, 30703],
        &["192.168.70.81"],
    );
    ranged.source_ranges = vec!["192.168.50.0/33".into()];
    write(&topo, &ranged, t1)?;
    agent.wait_for_log_line(
        from,
        &["default/late-range", "spec.ports[0].nodePort", "29999"],
        SETTLE,
    )?;
    agent.wait_for_log_line(
        from,
        &[
            "default/late-cidr",
            "spec.loadBalancerSourceRanges[0]",
            "192.168.50.0/33",
        ],
        SETTLE,
    )?;
    ensure!(
        !programmed(&agent, "10.96.8.3", 29999)?,
        "late-range is programmed"
    );
    ensure!(
        !programmed(&agent, "10.96.8.4", 30701)?,
        "late-cidr is programmed"
    );
    for (ip, port) in good {
        serving(&topo, Ns::Client, ip, port)?;
    }

    // A running good Service turns bad: its nodePort leaves the range.
    let from = agent.log_text().len();
    write(&topo, &np("turns-bad", 2, [29998, 30901, 30902]), t0)?;
    agent.wait_for_log_line(
        from,
        &["default/turns-bad", "spec.ports[0].nodePort", "29998"],
        SETTLE,
    )?;
    ensure!(
        !programmed(&agent, "", 29998)?,
        "the bad nodePort 29998 is programmed"
    );
    // The others are untouched, and the agent keeps applying changes: a
    // good Service added after all this serves too.
    for (ip, port) in &good[..2] {
        serving(&topo, Ns::Client, ip, *port)?;
    }
    write(&topo, &np("after", 5, [31000, 31001, 31002]), t1)?;
    for ip in ["192.168.50.1", "fd00:50::1"] {
        serving(&topo, Ns::Client, ip, 31000)?;
    }
    alive(&mut agent)
}
