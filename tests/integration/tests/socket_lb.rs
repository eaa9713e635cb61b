//! The ClusterIP socket-LB datapath end to end: real sockets in a namespace, the
//! real kernel programs, the agent in standalone mode. Needs root.
use std::time::{Duration, Instant};

use anyhow::Result;
use weir_integration::{
    Agent, Topology,
    agent::backends_of,
    bin,
    manifest::{self, NOT_SERVING, READY, TERMINATING},
    topology::ChildGuard,
};

const VIP: &str = "10.96.0.10";

fn tcp_target() -> String {
    format!("{VIP}:80")
}

fn udp_target() -> String {
    format!("{VIP}:53")
}

/// Writes the service and a slice of the first `n` backends, all ready.
fn publish(topo: &Topology, names: &[&str]) -> Result<()> {
    let eps: Vec<_> = names.iter().map(|n| (topo.backend(n).ip, READY)).collect();
    topo.write_manifest("web-slice.yaml", &manifest::slice("web-1", "web", &eps))?;
    topo.write_manifest("web.yaml", &manifest::service("web", VIP))
}

/// Each of `names` got a fair share of `total` answers: within ±40% of an even
/// split, about five standard deviations for 3 backends at 300.
fn assert_uniform(backends: &std::collections::BTreeMap<String, u32>, names: &[&str], total: u32) {
    let fair = f64::from(total) / names.len() as f64;
    for n in names {
        let got = f64::from(backends.get(*n).copied().unwrap_or(0));
        assert!(
            (got - fair).abs() <= 0.4 * fair,
            "{n} got {got} of {total} answers, expected about {fair}: {backends:?}"
        );
    }
    let unexpected: Vec<_> = backends
        .keys()
        .filter(|k| !names.contains(&k.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "answers from unexpected backends {unexpected:?}"
    );
}

#[test]
fn tcp_and_udp_reach_every_ready_backend_uniformly_and_peer_is_the_vip() -> Result<()> {
    let topo = Topology::new(3)?;
    publish(&topo, &["be1", "be2", "be3"])?;
    let _agent = Agent::start(&topo, &[])?;
    let all = ["be1", "be2", "be3"];

    for mode in ["tcp", "udp", "udp-connected"] {
        let target = if mode == "tcp" {
            tcp_target()
        } else {
            udp_target()
        };
        let p = topo.probe(mode, &target, 300)?;
        assert_eq!(p.ok, 300, "{mode}: {p:?}");
        // getpeername (TCP, connected UDP) and recvmsg's source (unconnected UDP)
        // show the ClusterIP, not the backend.
        assert_eq!(p.peer_mismatch, 0, "{mode}: {p:?}");
        assert_uniform(&p.backends, &all, 300);
    }

    // A real client: curl sees the VIP as its peer and gets a backend's answer.
    let out = topo
        .client("curl")
        .args([
            "-sS",
            "-m",
            "3",
            "-w",
            "%{remote_ip}:%{remote_port}",
            &format!("http://{VIP}/"),
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let body = lines.next().unwrap_or("");
    assert!(
        all.contains(&body),
        "curl got {text:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines.next(), Some(format!("{VIP}:80").as_str()));

    // Outside the cgroup nothing is translated: the VIP is unroutable there.
    let out = topo
        .node
        .command(&bin("weir-testclient"))
        .args(["tcp", "--target", &tcp_target(), "--count", "1"])
        .output()?;
    let p = weir_integration::topology::Probe::parse(&out)?;
    assert_eq!(p.ok, 0, "{p:?}");
    Ok(())
}

#[test]
fn dns_over_udp_through_the_cluster_ip_with_dnsmasq_and_dig() -> Result<()> {
    let topo = Topology::new(2)?;
    // dnsmasq on each backend answers a TXT query with the backend's name.
    let mut servers = Vec::new();
    for b in &topo.backends {
        servers.push(ChildGuard(
            b.ns.command(std::path::Path::new("dnsmasq"))
                .args([
                    "--no-daemon",
                    "--conf-file=/dev/null",
                    "--no-resolv",
                    "--no-hosts",
                    "--port=5300",
                ])
                .arg(format!("--listen-address={}", b.ip))
                .arg("--bind-interfaces")
                .arg(format!("--txt-record=whoami.weir.test,{}", b.name))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()?,
        ));
    }
    let eps: String = topo
        .backends
        .iter()
        .map(|b| {
            format!(
                "- addresses: [\"{}\"]\n  conditions: {{ready: true}}\n",
                b.ip
            )
        })
        .collect();
    topo.write_manifest(
        "dns.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: dns}}\nspec:\n  clusterIP: 10.96.0.53\n  ports: [{{name: dns, port: 53, protocol: UDP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dns-1\n  labels: {{kubernetes.io/service-name: dns}}\naddressType: IPv4\nports: [{{name: dns, port: 5300, protocol: UDP}}]\nendpoints:\n{eps}"
        ),
    )?;
    let _agent = Agent::start(&topo, &[])?;
    std::thread::sleep(Duration::from_millis(300));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let out = topo
            .client("dig")
            .args([
                "+short",
                "+tries=1",
                "+time=2",
                "@10.96.0.53",
                "TXT",
                "whoami.weir.test",
            ])
            .output()?;
        let answer = String::from_utf8_lossy(&out.stdout)
            .trim()
            .trim_matches('"')
            .to_owned();
        assert!(
            answer == "be1" || answer == "be2",
            "dig answered {answer:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        seen.insert(answer);
    }
    assert_eq!(seen.len(), 2, "30 queries all went to {seen:?}");
    drop(servers);
    Ok(())
}

#[test]
fn scaling_applies_within_a_second_and_removed_backends_are_never_chosen() -> Result<()> {
    let mut topo = Topology::new(3)?;
    topo.add_backend()?;
    topo.add_backend()?;
    publish(&topo, &["be1", "be2", "be3"])?;
    let agent = Agent::start(&topo, &[])?;

    let t = Instant::now();
    publish(&topo, &["be1", "be2", "be3", "be4", "be5"])?;
    agent.wait_for(Duration::from_secs(5), |v| {
        backends_of(v, VIP, 80, "TCP").is_some_and(|b| b.len() == 5)
    })?;
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "3 → 5 endpoints took {took:?}"
    );
    // 500 samples keep the ±40% band at about 4.5 standard deviations for 5.
    let p = topo.probe("tcp", &tcp_target(), 500)?;
    assert_uniform(&p.backends, &["be1", "be2", "be3", "be4", "be5"], 500);

    publish(&topo, &["be1", "be3", "be4", "be5"])?;
    agent.wait_for(Duration::from_secs(5), |v| {
        backends_of(v, VIP, 80, "TCP").is_some_and(|b| b.len() == 4)
    })?;
    for mode in ["tcp", "udp", "udp-connected"] {
        let target = if mode == "tcp" {
            tcp_target()
        } else {
            udp_target()
        };
        let p = topo.probe(mode, &target, 300)?;
        assert_eq!(p.ok, 300, "{mode}: {p:?}");
        assert!(
            !p.backends.contains_key("be2"),
            "{mode}: removed be2 still chosen: {p:?}"
        );
    }
    Ok(())
}

#[test]
fn no_usable_endpoint_refuses_at_once_and_terminating_ones_are_a_fallback() -> Result<()> {
    let topo = Topology::new(2)?;
    let (be1, be2) = (topo.backend("be1").ip, topo.backend("be2").ip);
    topo.write_manifest("web.yaml", &manifest::service("web", VIP))?;
    topo.write_manifest(
        "web-slice.yaml",
        &manifest::slice("web-1", "web", &[(be1, NOT_SERVING)]),
    )?;
    let agent = Agent::start(&topo, &[])?;

    for (mode, target) in [
        ("tcp", tcp_target()),
        ("udp", udp_target()),
        ("udp-connected", udp_target()),
    ] {
        let p = topo.probe(mode, &target, 20)?;
        assert_eq!(p.errors.get("ECONNREFUSED"), Some(&20), "{mode}: {p:?}");
        assert!(
            p.max_error_ms < 100,
            "{mode}: refusal took {} ms",
            p.max_error_ms
        );
    }

    // KEP-1669: with no ready endpoint, serving-and-terminating ones are used...
    topo.write_manifest(
        "web-slice.yaml",
        &manifest::slice("web-1", "web", &[(be1, NOT_SERVING), (be2, TERMINATING)]),
    )?;
    // be1 stays in the backends map as draining (for flows already on it),
    // in no slot; be2 is the one slot.
    agent.wait_for(Duration::from_secs(5), |v| {
        let states: Vec<&str> = v
            .iter()
            .filter(|s| s.vip.to_string() == VIP && s.port == 80 && s.protocol == "TCP")
            .flat_map(|s| s.backends.iter().map(|b| b.state.as_str()))
            .collect();
        states == ["terminating", "draining"]
    })?;
    let p = topo.probe("tcp", &tcp_target(), 50)?;
    assert_eq!(p.backends.get("be2"), Some(&50), "{p:?}");

    // ...and only while no endpoint is ready.
    topo.write_manifest(
        "web-slice.yaml",
        &manifest::slice("web-1", "web", &[(be1, READY), (be2, TERMINATING)]),
    )?;
    agent.wait_for(Duration::from_secs(5), |v| {
        v.iter()
            .any(|s| s.backends.iter().any(|b| b.state == "active"))
    })?;
    let p = topo.probe("tcp", &tcp_target(), 100)?;
    assert_eq!(p.backends.get("be1"), Some(&100), "{p:?}");
    Ok(())
}

#[test]
fn deleting_a_service_removes_every_map_entry_and_the_vip_is_no_longer_translated() -> Result<()> {
    let topo = Topology::new(2)?;
    publish(&topo, &["be1", "be2"])?;
    let agent = Agent::start(&topo, &[])?;
    assert_eq!(topo.probe("tcp", &tcp_target(), 10)?.ok, 10);

    topo.remove_manifest("web.yaml")?;
    agent.wait_for(Duration::from_secs(5), <[_]>::is_empty)?;
    for map in [
        weir_abi::MAP_SERVICES,
        weir_abi::MAP_BACKENDS,
        weir_abi::MAP_REVNAT,
        weir_abi::MAP_SVC_LABELS,
    ] {
        let path = topo.pin_dir().join("maps").join(map);
        let entries = weir_integration::pinned_map_len(&path)?;
        assert_eq!(entries, 0, "{map} still holds {entries} entries");
    }
    // Untranslated, the VIP has no route inside the node namespace.
    let p = topo.probe("tcp", &tcp_target(), 1)?;
    assert_eq!(p.errors.get("ENETUNREACH"), Some(&1), "{p:?}");
    Ok(())
}
