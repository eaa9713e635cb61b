//! NodePort, ExternalIP and LB IP over TCP and UDP, both families;
//! externalTrafficPolicy Cluster (SNAT) against Local (client source kept, only
//! local endpoints, drop without one); the health-check NodePort.
use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use weir_abi::{STAT_DROP_NO_BACKEND, STAT_NEW_FLOW, STAT_PROG_TC_INGRESS};
use weir_integration::packet_topology::{
    CLIENT4, CLIENT6, LPOD, NODE_LINK4, NODE_LINK6, NODE_POD4, NODE_POD6, Ns, PacketAgent,
    PacketTopology, RPOD,
    clients::target,
    manifests::{Ep, READY, Svc},
};

use crate::support::{
    Frontend, SETTLE, alive, external_frontends, frontend_view, frontend_views, has_flag,
    is_external_scope, pod_of_dns, poll, publish, serving, who,
};

const HC_PORT: u16 = 32100;

fn cluster_svc() -> Svc {
    let mut s = Svc::load_balancer(
        "web-cluster",
        "10.96.1.10",
        "fd00:96::1:10",
        [30080, 30353, 30053],
        &["192.168.70.10", "fd00:70::10"],
    );
    s.external_ips = vec!["192.168.60.10".into(), "fd00:60::10".into()];
    s
}

fn local_svc() -> Svc {
    let mut s = Svc::load_balancer(
        "web-local",
        "10.96.1.20",
        "fd00:96::1:20",
        [31080, 31353, 31053],
        &["192.168.70.20", "fd00:70::20"],
    );
    s.external_ips = vec!["192.168.60.20".into(), "fd00:60::20".into()];
    s.etp_local = true;
    s.health_check_node_port = Some(HC_PORT);
    s
}

/// The address the node uses towards `pod`: what a SNATed flow shows it.
fn snat_addr(pod: &str, v6: bool) -> &'static str {
    match (pod, v6) {
        ("lpod", false) => NODE_POD4,
        ("lpod", true) => NODE_POD6,
        (_, false) => NODE_LINK4,
        (_, true) => NODE_LINK6,
    }
}

fn client(v6: bool) -> &'static str {
    if v6 { CLIENT6 } else { CLIENT4 }
}

/// Every request through `f` over TCP (curl), UDP (weir-testsrv's echo) and
/// DNS (dig against dnsmasq): `(backend, source it saw)` for TCP and UDP, the
/// backend for DNS. Returns the backends seen.
fn exercise(
    topo: &PacketTopology,
    f: &Frontend,
    tries: usize,
    check_source: &dyn Fn(&str, &str) -> Result<()>,
) -> Result<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    for _ in 0..tries {
        let (name, peer) = who(topo, Ns::Client, &f.ip, f.ports[0])?;
        check_source(&name, &peer)?;
        seen.insert(name);
        let udp = topo.who_udp(Ns::Client, &f.ip, f.ports[1])?;
        let Some((name, peer)) = udp else {
            anyhow::bail!(
                "{} {} UDP echo: no answer",
                f.kind,
                target(&f.ip, f.ports[1])
            );
        };
        check_source(&name, &peer)?;
        seen.insert(name);
        let dns = topo.dig(Ns::Client, &f.ip, f.ports[2], "A")?;
        let name = dns
            .as_deref()
            .and_then(|a| pod_of_dns(a, &[LPOD, RPOD]))
            .ok_or_else(|| {
                anyhow::anyhow!("{} {} dig: {dns:?}", f.kind, target(&f.ip, f.ports[2]))
            })?;
        seen.insert(name.to_owned());
    }
    Ok(seen)
}

#[test]
fn external_frontends_over_tcp_udp_and_dns_with_snat_or_source_preserved() -> Result<()> {
    let topo = PacketTopology::new()?;
    let both = [Ep::local(LPOD, READY), Ep::remote(RPOD, READY)];
    let (cluster, local) = (cluster_svc(), local_svc());
    publish(&topo, &cluster, &both)?;
    publish(&topo, &local, &both)?;
    let mut agent = PacketAgent::start(&topo, &[])?;
    let first = &external_frontends(&cluster)[0];
    serving(&topo, Ns::Client, &first.ip, first.ports[0])?;

    // externalTrafficPolicy: Cluster: both pods serve, and each sees the
    // node's address towards it, never the client's.
    for f in external_frontends(&cluster) {
        let v6 = f.v6;
        let seen = exercise(&topo, &f, 12, &|name, peer| {
            ensure!(
                peer == snat_addr(name, v6),
                "{} {}: {name} saw {peer}, expected the node's {}",
                f.kind,
                f.ip,
                snat_addr(name, v6)
            );
            Ok(())
        })?;
        assert_eq!(
            seen,
            BTreeSet::from(["lpod".to_owned(), "rpod".to_owned()]),
            "{} {} (Cluster) reached {seen:?}",
            f.kind,
            f.ip
        );
    }

    // externalTrafficPolicy: Local: only the local pod, which sees the client.
    for f in external_frontends(&local) {
        let v6 = f.v6;
        let seen = exercise(&topo, &f, 6, &|name, peer| {
            ensure!(
                peer == client(v6),
                "{} {}: {name} saw {peer}, expected the client {}",
                f.kind,
                f.ip,
                client(v6)
            );
            Ok(())
        })?;
        assert_eq!(
            seen,
            BTreeSet::from(["lpod".to_owned()]),
            "{} {} (Local) reached {seen:?}",
            f.kind,
            f.ip
        );
    }
    assert!(agent.stat(STAT_PROG_TC_INGRESS, STAT_NEW_FLOW)? > 0);
    // No frontend has a backend of the other family.
    let views = agent.inspect("services")?;
    for v in views.as_array().into_iter().flatten() {
        let v6 = v["vip"].as_str().is_some_and(|a| a.contains(':'));
        for b in v["backends"].as_array().into_iter().flatten() {
            let b6 = b["ip"].as_str().is_some_and(|a| a.contains(':'));
            assert_eq!(v6, b6, "mixed families in {v}");
        }
    }
    // `inspect services` shows each frontend's kind and policy.
    for (vip, local) in [("192.168.70.10", false), ("fd00:70::20", true)] {
        let v = frontend_view(&agent, vip, 80, "TCP")?
            .ok_or_else(|| anyhow::anyhow!("{vip}:80/TCP not in inspect services"))?;
        assert!(has_flag(&v, "external"), "{v}");
        assert_eq!(has_flag(&v, "local"), local, "{v}");
    }
    let v = frontend_view(&agent, "192.168.50.1", 31080, "TCP")?
        .ok_or_else(|| anyhow::anyhow!("NodePort 31080 not in inspect services"))?;
    assert!(has_flag(&v, "nodeport") && has_flag(&v, "local"), "{v}");
    // What outside clients get: the external-scope view where the agent lists
    // one, else the only view.
    let views = frontend_views(&agent, "192.168.50.1", 31080, "TCP")?;
    let outside = views.iter().find(|v| is_external_scope(v)).unwrap_or(&v);
    assert_eq!(
        outside["backends"].as_array().map(Vec::len),
        Some(1),
        "Local keeps only lpod for outside clients: {views:?}"
    );

    // The health-check NodePort answers as kube-proxy's: 200 and the count.
    for ip in ["192.168.50.1", "[fd00:50::1]"] {
        let (code, headers, body) = health(&topo, ip)?;
        assert_eq!(code, 200, "{ip}: {headers}{body}");
        check_health_body(&body, 1)?;
        let h = headers.to_ascii_lowercase();
        assert!(h.contains("content-type: application/json"), "{headers}");
        assert!(h.contains("x-content-type-options: nosniff"), "{headers}");
    }

    // Without a local endpoint: 503 with 0, and the Local frontends drop.
    publish(&topo, &local, &[Ep::remote(RPOD, READY)])?;
    poll(SETTLE, "health check turning 503", || {
        let (code, _, body) = health(&topo, "192.168.50.1")?;
        Ok(if code == 503 {
            Ok(body)
        } else {
            Err((code, body))
        })
    })
    .and_then(|body| check_health_body(&body, 0))?;
    let (code, _, body) = health(&topo, "[fd00:50::1]")?;
    assert_eq!(code, 503, "{body}");
    let drops = agent.stat(STAT_PROG_TC_INGRESS, STAT_DROP_NO_BACKEND)?;
    for f in external_frontends(&local) {
        let c = topo.curl(
            Ns::Client,
            &format!("{}/peer", f.tcp()),
            weir_integration::packet_topology::clients::CurlOpts {
                max_time: 1.0,
                ..Default::default()
            },
        )?;
        assert!(
            !c.ok(),
            "{} {} (Local, no local endpoint) answered: {c:?}",
            f.kind,
            f.ip
        );
    }
    assert!(
        agent.stat(STAT_PROG_TC_INGRESS, STAT_DROP_NO_BACKEND)? > drops,
        "the drops were not counted"
    );
    // The Cluster Service still serves through every frontend.
    for f in external_frontends(&cluster) {
        who(&topo, Ns::Client, &f.ip, f.ports[0])?;
    }
    alive(&mut agent)
}

/// `GET /` on the health-check NodePort from the client: code, headers, body.
fn health(topo: &PacketTopology, ip: &str) -> Result<(u16, String, String)> {
    let out = topo
        .command(Ns::Client, "curl")
        .args(["-sS", "-g", "-i", "--max-time", "3"])
        .arg(format!("http://{ip}:{HC_PORT}/"))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let (headers, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let code = headers
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, format!("{headers}\n"), body.to_owned()))
}

fn check_health_body(body: &str, local: u64) -> Result<()> {
    let v: serde_json::Value = serde_json::from_str(body.trim())
        .map_err(|e| anyhow::anyhow!("health body {body:?}: {e}"))?;
    ensure!(
        v["service"]["namespace"] == "default" && v["service"]["name"] == "web-local",
        "{v}"
    );
    ensure!(
        v["localEndpoints"] == local,
        "expected {local} local endpoints: {v}"
    );
    ensure!(v["serviceProxyHealthy"] == true, "{v}");
    Ok(())
}

/// `--nodeport-addresses` as kube-proxy's nodePortAddresses: NodePorts
/// listen only on the node addresses inside the ranges, a family without a
/// range gets none, and ClusterIPs are untouched.
#[test]
fn node_port_addresses_restrict_where_node_ports_listen() -> Result<()> {
    use weir_integration::packet_topology::{NODE_EXT4, NODE_EXT6};
    let topo = PacketTopology::new()?;
    let svc = Svc::node_port("np", "10.96.1.30", "fd00:96::1:30", [30090, 30391, 30091]);
    publish(
        &topo,
        &svc,
        &[Ep::local(LPOD, READY), Ep::remote(RPOD, READY)],
    )?;
    let agent = PacketAgent::start(&topo, &["--nodeport-addresses=192.168.50.0/24"])?;
    serving(&topo, Ns::Client, NODE_EXT4, 30090)?;

    let all = agent.inspect("services")?;
    let node_port_vips: BTreeSet<String> = all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["port"] == 30090 && v["protocol"] == "TCP")
        .filter_map(|v| v["vip"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        node_port_vips == BTreeSet::from([NODE_EXT4.to_owned()]),
        "NodePort 30090 is programmed on {node_port_vips:?}, not only {NODE_EXT4}"
    );
    ensure!(
        !crate::support::frontend_views(&agent, "10.96.1.30", 80, "TCP")?.is_empty(),
        "the ClusterIP lost its frontend"
    );
    // No range for IPv6: the node does not answer the NodePort there.
    let url = format!("{}/peer", target(NODE_EXT6, 30090));
    let c = topo.curl(Ns::Client, &url, Default::default())?;
    ensure!(!c.ok(), "{url} answered: {c:?}");
    Ok(())
}
