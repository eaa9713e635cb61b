//! The agent against an API server: the faithful test API server over HTTPS,
//! driven with kube-rs, and the real kernel datapath in throwaway namespaces.
//! Needs root.
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    events::v1::Event,
};
use kube::Api;
use serde_json::json;
use weir_integration::{
    Agent, Topology,
    agent::backends_of,
    api::{Cluster, Ep, Relay},
    manifest::{READY, TERMINATING},
};

const NODE: &str = "node-a";
const SECOND: Duration = Duration::from_secs(1);

fn ep(topo: &Topology, name: &str) -> Ep {
    Ep::new(topo.backend(name).ip, READY)
}

fn ips(topo: &Topology, names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names
        .iter()
        .map(|n| format!("{}:8080", topo.backend(n).ip))
        .collect();
    v.sort();
    v
}

fn sorted(v: Option<Vec<String>>) -> Option<Vec<String>> {
    v.map(|mut v| {
        v.sort();
        v
    })
}

/// Waits until the TCP backends of `vip` are exactly `names`.
fn wait_backends(
    agent: &Agent,
    topo: &Topology,
    vip: &str,
    names: &[&str],
    within: Duration,
) -> Result<Duration> {
    let want = ips(topo, names);
    agent.wait_for(within, |v| {
        sorted(backends_of(v, vip, 80, "TCP")).as_ref() == Some(&want)
    })
}

/// Service `web` at `vip` with every backend of a 3-backend topology, and
/// the agent seeing all three.
fn web3(cluster: &Cluster, topo: &Topology, agent: &Agent, vip: &str) -> Result<Duration> {
    cluster.service("web", vip, json!({}))?;
    cluster.slice(
        "web-1",
        "web",
        &[ep(topo, "be1"), ep(topo, "be2"), ep(topo, "be3")],
    )?;
    wait_backends(agent, topo, vip, &["be1", "be2", "be3"], SECOND)
}

fn node(name: &str, zone: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}}})
}

#[test]
fn creates_updates_and_deletes_reach_the_datapath_within_a_second() -> Result<()> {
    let topo = Topology::new(3)?;
    let cluster = Cluster::start()?;
    let agent = Agent::start_api(&topo, cluster.kubeconfig(), NODE, &[])?;
    let vip = "10.96.0.10";

    let took = web3(&cluster, &topo, &agent, vip)?;
    eprintln!("create reached the maps in {took:?}");
    let p = topo.probe("tcp", &format!("{vip}:80"), 90)?;
    ensure!(p.ok == 90 && p.peer_mismatch == 0, "{p:?}");
    ensure!(p.backends.len() == 3, "every backend answers: {p:?}");

    // Scale down, and one endpoint starts terminating.
    let mut draining = ep(&topo, "be2");
    draining.cond = TERMINATING;
    cluster.slice("web-1", "web", &[ep(&topo, "be1"), draining])?;
    let want = ips(&topo, &["be1", "be2"]);
    agent.wait_for(SECOND, |v| {
        v.iter()
            .find(|s| s.vip.to_string() == vip && s.port == 80)
            .is_some_and(|s| {
                let mut got: Vec<(String, &str)> = s
                    .backends
                    .iter()
                    .map(|b| (format!("{}:{}", b.ip, b.port), b.state.as_str()))
                    .collect();
                got.sort();
                got == vec![
                    (want[0].clone(), "active"),
                    (want[1].clone(), "terminating"),
                ]
            })
    })?;
    let p = topo.probe("tcp", &format!("{vip}:80"), 30)?;
    ensure!(
        p.ok == 30 && p.backends.keys().collect::<Vec<_>>() == ["be1"],
        "only the ready backend takes new connections: {p:?}"
    );

    // A Service update: the UDP port goes away.
    cluster.upsert(
        &cluster.api::<Service>("default"),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "default"},
               "spec": {"clusterIP": vip, "clusterIPs": [vip],
                        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    )?;
    agent.wait_for(SECOND, |v| backends_of(v, vip, 53, "UDP").is_none())?;

    // Services kube-proxy does not program are not programmed.
    cluster.upsert(
        &cluster.api::<Service>("default"),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "mesh", "namespace": "default",
                            "labels": {"service.kubernetes.io/service-proxy-name": "other"}},
               "spec": {"clusterIP": "10.96.0.30", "ports": [{"port": 80}]}}),
    )?;
    cluster.slice("mesh-1", "mesh", &[ep(&topo, "be3")])?;

    cluster.delete(&cluster.api::<Service>("default"), "web")?;
    agent.wait_for(SECOND, |v| backends_of(v, vip, 80, "TCP").is_none())?;
    ensure!(
        agent.inspect()?.is_empty(),
        "nothing else is programmed: {:?}",
        agent.inspect()?
    );
    Ok(())
}

#[test]
fn traffic_policy_local_and_topology_hints_pick_the_right_endpoints() -> Result<()> {
    let topo = Topology::new(3)?;
    let cluster = Cluster::start()?;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    cluster.upsert(&nodes, node(NODE, "zone-a"))?;
    let agent = Agent::start_api(&topo, cluster.kubeconfig(), NODE, &[])?;

    // internalTrafficPolicy: Local: only be1 runs on this node.
    let local = "10.96.0.11";
    cluster.service("local", local, json!({"internalTrafficPolicy": "Local"}))?;
    cluster.slice(
        "local-1",
        "local",
        &[
            ep(&topo, "be1").on(NODE),
            ep(&topo, "be2").on("node-b"),
            ep(&topo, "be3").on("node-b"),
        ],
    )?;
    wait_backends(&agent, &topo, local, &["be1"], SECOND)?;
    let p = topo.probe("tcp", &format!("{local}:80"), 30)?;
    ensure!(
        p.ok == 30 && p.backends.keys().collect::<Vec<_>>() == ["be1"],
        "{p:?}"
    );

    // Zone hints: be1 and be2 are for zone-a, be3 for zone-b.
    let zoned = "10.96.0.12";
    cluster.service(
        "zoned",
        zoned,
        json!({"trafficDistribution": "PreferClose"}),
    )?;
    let hinted = |no_hint: Option<&str>| -> Vec<Ep> {
        [("be1", "zone-a"), ("be2", "zone-a"), ("be3", "zone-b")]
            .iter()
            .map(|(b, z)| {
                if no_hint == Some(*b) {
                    ep(&topo, b)
                } else {
                    ep(&topo, b).zone(z)
                }
            })
            .collect()
    };
    cluster.slice("zoned-1", "zoned", &hinted(None))?;
    wait_backends(&agent, &topo, zoned, &["be1", "be2"], SECOND)?;
    let p = topo.probe("tcp", &format!("{zoned}:80"), 60)?;
    ensure!(
        p.ok == 60 && p.backends.keys().collect::<Vec<_>>() == ["be1", "be2"],
        "{p:?}"
    );

    // The node moves to zone-b: the agent follows its Node's label.
    cluster.upsert(&nodes, node(NODE, "zone-b"))?;
    wait_backends(&agent, &topo, zoned, &["be3"], SECOND)?;
    // A zone no hint names falls back to every endpoint.
    cluster.upsert(&nodes, node(NODE, "zone-c"))?;
    wait_backends(&agent, &topo, zoned, &["be1", "be2", "be3"], SECOND)?;
    // So does a slice where one ready endpoint has no hints.
    cluster.upsert(&nodes, node(NODE, "zone-a"))?;
    wait_backends(&agent, &topo, zoned, &["be1", "be2"], SECOND)?;
    cluster.slice("zoned-1", "zoned", &hinted(Some("be2")))?;
    wait_backends(&agent, &topo, zoned, &["be1", "be2", "be3"], SECOND)?;
    // Local policy ignores hints and zones.
    wait_backends(&agent, &topo, local, &["be1"], SECOND)?;
    Ok(())
}

#[test]
fn api_server_down_for_30s_keeps_the_datapath_and_it_converges_after() -> Result<()> {
    let topo = Topology::new(3)?;
    let cluster = Cluster::start()?;
    let agent = Agent::start_api(&topo, cluster.kubeconfig(), NODE, &[])?;
    let vip = "10.96.0.10";
    web3(&cluster, &topo, &agent, vip)?;
    let before = agent.inspect()?;

    cluster.block_on(cluster.server.stop());
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(30) {
        let p = topo.probe("tcp", &format!("{vip}:80"), 30)?;
        ensure!(
            p.ok == 30 && p.backends.len() == 3,
            "serving while the API server is down: {p:?}"
        );
        let (code, body) = agent.get(agent.healthz_addr, "/healthz")?;
        ensure!(
            code == 200,
            "an outage queues nothing, so the node stays healthy: {code} {body}"
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    ensure!(agent.inspect()? == before, "the maps did not move");
    ensure!(
        agent
            .metric("weir_k8s_watch_errors_total{kind=\"Service\"}")?
            .unwrap_or(0.0)
            >= 1.0,
        "the outage was seen"
    );
    // `inspect status` tells the operator the API server is the problem.
    let status = statusz(&agent)?;
    let api = &status["api"];
    ensure!(status["source"]["kind"] == "api", "{status:#}");
    ensure!(api["server"].as_str().is_some(), "{status:#}");
    let failed_at = api["last_error"]["at"].as_f64().unwrap_or(0.0);
    ensure!(
        failed_at > api["last_answer"].as_f64().unwrap_or(0.0),
        "the failure is newer than the last answer: {status:#}"
    );
    let out = std::process::Command::new(weir_integration::bin("weir-agent"))
        .args(["inspect", "status", "--agent"])
        .arg(agent.metrics_addr.to_string())
        .arg("--bpffs")
        .arg(topo.pin_dir())
        .output()?;
    let screen = String::from_utf8_lossy(&out.stdout);
    ensure!(
        screen
            .lines()
            .any(|l| l.starts_with("Source:") && l.contains("FAILING since")),
        "{screen}"
    );

    cluster.block_on(cluster.server.restart())?;
    let returned = Instant::now();
    cluster.slice("web-1", "web", &[ep(&topo, "be1"), ep(&topo, "be2")])?;
    cluster.service("late", "10.96.0.13", json!({}))?;
    cluster.slice("late-1", "late", &[ep(&topo, "be3")])?;
    let written = returned.elapsed();
    // After 30 s of failures each watcher's own backoff sleeps 30-60 s; the
    // shared /readyz probe wakes them all within 0.5 s of the return. The
    // window leaves room for a loaded CI host, and is far below a backoff.
    let back = Duration::from_secs(5);
    let web = wait_backends(&agent, &topo, vip, &["be1", "be2"], back)?;
    let late = wait_backends(&agent, &topo, "10.96.0.13", &["be3"], back)?;
    eprintln!(
        "changes written {written:?} after the API server came back; in the maps \
         {web:?} (changed slice) and {:?} (new Service) after that",
        web + late
    );
    let status = statusz(&agent)?;
    ensure!(
        status["api"]["last_answer"].as_f64().unwrap_or(0.0) > failed_at,
        "answered again: {status:#}"
    );
    Ok(())
}

/// The agent's `/statusz`.
fn statusz(agent: &Agent) -> Result<serde_json::Value> {
    let (code, body) = agent.get(agent.metrics_addr, "/statusz")?;
    ensure!(code == 200, "/statusz answered {code}: {body}");
    Ok(serde_json::from_str(&body)?)
}

#[test]
fn a_relist_after_410_gone_converges_without_rewriting_unchanged_services() -> Result<()> {
    const STEADY: u8 = 40;
    let topo = Topology::new(3)?;
    let cluster = Cluster::start()?;
    let relay = Relay::start(cluster.server.addr())?;
    let kubeconfig = cluster.kubeconfig_via(&relay.url(), &topo.dir.join("kubeconfig-relay"))?;
    for i in 0..STEADY {
        let name = format!("steady-{i}");
        cluster.service(&name, &format!("10.96.1.{i}"), json!({}))?;
        cluster.slice(&format!("{name}-1"), &name, &[ep(&topo, "be3")])?;
    }
    cluster.service("web", "10.96.0.10", json!({}))?;
    cluster.slice(
        "web-1",
        "web",
        &[ep(&topo, "be1"), ep(&topo, "be2"), ep(&topo, "be3")],
    )?;
    cluster.service("gone", "10.96.0.14", json!({}))?;
    cluster.slice("gone-1", "gone", &[ep(&topo, "be1")])?;
    let agent = Agent::start_api(&topo, &kubeconfig, NODE, &[])?;
    wait_backends(&agent, &topo, "10.96.0.14", &["be1"], SECOND)?;
    let steady_before: Vec<_> = agent
        .inspect()?
        .into_iter()
        .filter(|s| matches!(s.vip, std::net::IpAddr::V4(v) if v.octets()[2] == 1))
        .collect();
    ensure!(steady_before.len() == usize::from(STEADY) * 2);
    let ops_before = agent.metric("weir_map_operations_total")?.unwrap_or(0.0);

    // Partition: the agent misses a delete, an update and a create, and the
    // history it would resume from is compacted away.
    relay.cut();
    cluster.delete(&cluster.api::<Service>("default"), "gone")?;
    cluster.delete(&cluster.api::<EndpointSlice>("default"), "gone-1")?;
    cluster.slice("web-1", "web", &[ep(&topo, "be1")])?;
    cluster.service("new", "10.96.0.15", json!({}))?;
    cluster.slice("new-1", "new", &[ep(&topo, "be2")])?;
    cluster.server.compact();
    let p = topo.probe("tcp", "10.96.0.10:80", 30)?;
    ensure!(p.ok == 30, "serving through the partition: {p:?}");
    relay.mend();

    // Each watcher reconnects on its own backoff (up to 30 s after failures).
    let back = Duration::from_secs(45);
    wait_backends(&agent, &topo, "10.96.0.10", &["be1"], back)?;
    wait_backends(&agent, &topo, "10.96.0.15", &["be2"], back)?;
    agent.wait_for(back, |v| backends_of(v, "10.96.0.14", 80, "TCP").is_none())?;
    let steady_after: Vec<_> = agent
        .inspect()?
        .into_iter()
        .filter(|s| matches!(s.vip, std::net::IpAddr::V4(v) if v.octets()[2] == 1))
        .collect();
    ensure!(steady_after == steady_before);
    // Rewriting one steady Service would take at least 6 writes (2 masters, 2
    // slots, a backend, a rev-NAT entry); the three changes need far fewer
    // than the 240 a flush of the steady ones alone would cost.
    let ops = agent.metric("weir_map_operations_total")?.unwrap_or(0.0) - ops_before;
    ensure!(
        ops > 0.0 && ops < 80.0,
        "{ops} map operations for 3 changed Services"
    );
    Ok(())
}

#[test]
fn map_full_writes_one_event_and_the_lease_is_renewed() -> Result<()> {
    let topo = Topology::new(3)?;
    let cluster = Cluster::start()?;
    // 6 backend ids for a Service with two ports and three backends: one
    // fits.
    let agent = Agent::start_api(&topo, cluster.kubeconfig(), NODE, &["--max-backends", "8"])?;
    let all = [ep(&topo, "be1"), ep(&topo, "be2"), ep(&topo, "be3")];
    cluster.service("fits", "10.96.0.10", json!({}))?;
    cluster.slice("fits-1", "fits", &all)?;
    wait_backends(&agent, &topo, "10.96.0.10", &["be1", "be2", "be3"], SECOND)?;
    cluster.service("toobig", "10.96.0.16", json!({}))?;
    cluster.slice("toobig-1", "toobig", &all)?;

    let events: Api<Event> = cluster.api("default");
    let find = || -> Result<Vec<Event>> {
        Ok(cluster
            .block_on(events.list(&Default::default()))?
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("toobig")
                    && e.reason.as_deref() == Some("MapFull")
            })
            .collect())
    };
    let start = Instant::now();
    while find()?.is_empty() {
        ensure!(start.elapsed() < Duration::from_secs(5), "no MapFull event");
        std::thread::sleep(Duration::from_millis(100));
    }
    let ev = &find()?[0];
    let note = ev.note.clone().unwrap_or_default();
    ensure!(
        note.contains("WEIR_BACKEND") && note.contains("default/toobig"),
        "{note}"
    );
    ensure!(ev.type_.as_deref() == Some("Warning"));
    ensure!(ev.reporting_controller.as_deref() == Some("weir-agent"));
    let uid = cluster
        .block_on(cluster.api::<Service>("default").get("toobig"))?
        .metadata
        .uid;
    ensure!(
        ev.regarding.as_ref().and_then(|r| r.uid.clone()) == uid && uid.is_some(),
        "the Event names the Service's UID: {ev:?}"
    );
    // Users read it through core/v1, as `kubectl describe service` asks.
    let core: Api<k8s_openapi::api::core::v1::Event> = cluster.api("default");
    let selector = format!(
        "involvedObject.kind=Service,involvedObject.name=toobig,involvedObject.uid={}",
        uid.as_deref().unwrap_or_default()
    );
    let described = cluster
        .block_on(core.list(&kube::api::ListParams::default().fields(&selector)))?
        .items;
    ensure!(
        described.len() == 1 && described[0].message.as_deref() == Some(note.as_str()),
        "the core/v1 view of the Event: {described:?}"
    );

    // The agent retries every 2 s; the Event is not repeated. Meanwhile the
    // Lease gets at least one renewal.
    let leases: Api<Lease> = cluster.api("kube-system");
    let renew = || -> Result<String> {
        let l = cluster.block_on(leases.get("weir-agent-node-a"))?;
        let spec = l.spec.unwrap_or_default();
        ensure!(spec.holder_identity.as_deref() == Some(NODE));
        ensure!(spec.lease_duration_seconds == Some(40));
        Ok(format!("{:?}", spec.renew_time))
    };
    let first = renew()?;
    let start = Instant::now();
    loop {
        ensure!(
            start.elapsed() < Duration::from_secs(15),
            "lease not renewed within 15 s"
        );
        std::thread::sleep(Duration::from_millis(500));
        if renew()? != first {
            break;
        }
    }
    ensure!(
        start.elapsed() > Duration::from_secs(5),
        "renewed every 10 s, not faster"
    );
    let after = find()?;
    ensure!(
        after.len() == 1 && after[0].series.is_none(),
        "one Event for a failure that persists: {after:?}"
    );
    ensure!(
        agent.metric("weir_map_full_total{map=\"WEIR_BACKEND\"}")? == Some(1.0),
        "counted once"
    );
    // The Service that fits keeps working.
    let p = topo.probe("tcp", "10.96.0.10:80", 30)?;
    ensure!(p.ok == 30, "{p:?}");
    Ok(())
}

#[test]
fn metrics_and_health_endpoints_answer_like_kube_proxys() -> Result<()> {
    let topo = Topology::new(1)?;
    let cluster = Cluster::start()?;
    cluster.block_on(cluster.server.stop());
    // kube-proxy's configuration file, as its ConfigMap would hold it, in
    // the topology's own directory (removed with it).
    let config = topo.dir.join("kube-proxy.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         mode: iptables\nconntrack: {tcpEstablishedTimeout: 2h0m0s}\n",
    )?;
    let config_arg = format!("--config={}", config.display());
    let mut agent = Agent::spawn_api(&topo, cluster.kubeconfig(), NODE, &[config_arg.as_str()])?;
    // Never synced: not healthy, not live.
    let start = Instant::now();
    let (code, _) = loop {
        let r = agent.get(agent.healthz_addr, "/healthz")?;
        if r.0 != 0 || start.elapsed() > Duration::from_secs(10) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    ensure!(code == 503, "/healthz before any sync: {code}");
    ensure!(agent.get(agent.healthz_addr, "/livez")?.0 == 503);
    let watch_errors = "weir_k8s_watch_errors_total{kind=\"Service\"}";
    while agent.metric(watch_errors)?.is_none() {
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "no watch error counted while the API server is down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    cluster.block_on(cluster.server.restart())?;
    agent.wait_for_log(0, "initial sync complete", Duration::from_secs(45))?;
    let (code, body) = agent.get(agent.healthz_addr, "/healthz")?;
    ensure!(code == 200, "{code} {body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(v["nodeEligible"] == true, "{body}");
    ensure!(
        v["lastUpdated"].as_str().is_some_and(|s| !s.is_empty()),
        "{body}"
    );
    ensure!(
        v["currentTime"].as_str().is_some_and(|s| s.ends_with('Z')),
        "{body}"
    );

    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let mut n = node(NODE, "zone-a");
    n["metadata"]["finalizers"] = json!(["weir.test/hold"]);
    cluster.upsert(&nodes, n)?;
    cluster.service("web", "10.96.0.10", json!({}))?;
    cluster.slice("web-1", "web", &[ep(&topo, "be1")])?;
    wait_backends(&agent, &topo, "10.96.0.10", &["be1"], SECOND)?;

    let m = |s: &str| -> Result<f64> {
        agent
            .metric(s)?
            .ok_or_else(|| anyhow::anyhow!("{s} missing from /metrics"))
    };
    ensure!(m("weir_services")? == 1.0);
    ensure!(m("weir_frontends")? == 2.0);
    ensure!(m("weir_backends")? == 2.0, "one backend per port");
    ensure!(m("weir_network_programming_duration_seconds_count")? >= 1.0);
    ensure!(m("weir_sync_duration_seconds_count")? >= 1.0);
    // A master each, holding its one backend.
    ensure!(m("weir_map_entries{map=\"WEIR_SVC\"}")? == 2.0);
    let pressure = m("weir_map_pressure{map=\"WEIR_SVC\"}")?;
    ensure!((pressure - 2.0 / 65536.0).abs() < 1e-9, "{pressure}");
    ensure!(m("weir_healthz_total{code=\"503\"}")? >= 1.0);
    // kube-proxy's names for the same series, client-go's request counts
    // against this API server, and the process collector.
    ensure!(m("kubeproxy_proxy_healthz_total{code=\"503\"}")? >= 1.0);
    ensure!(m("kubeproxy_sync_proxy_rules_service_changes_total")? >= 1.0);
    ensure!(m("kubeproxy_sync_proxy_rules_endpoint_changes_total")? >= 1.0);
    ensure!(m("kubeproxy_network_programming_duration_seconds_count")? >= 1.0);
    ensure!(m("kubeproxy_sync_proxy_rules_last_timestamp_seconds")? > 1.7e9);
    let host = cluster.server.addr();
    let ok_gets =
        format!("rest_client_requests_total{{code=\"200\",method=\"GET\",host=\"{host}\"}}");
    ensure!(
        m(&ok_gets)? >= 3.0,
        "lists of Services, slices and the Node"
    );
    ensure!(m("process_resident_memory_bytes")? > 1e6);
    ensure!(m("process_open_fds")? >= 3.0);
    let (code, mode) = agent.get(agent.metrics_addr, "/proxyMode")?;
    ensure!((code, mode.as_str()) == (200, "ebpf"), "{code} {mode:?}");
    let (code, body) = agent.get(agent.metrics_addr, "/configz")?;
    let configz: serde_json::Value = serde_json::from_str(&body)?;
    let c = &configz["kubeproxy.config.k8s.io"];
    ensure!(code == 200 && c["mode"] == "ebpf", "{code} {body}");
    ensure!(
        c["conntrack"]["tcpEstablishedTimeout"] == "2h0m0s",
        "{body}"
    );
    ensure!(c["hostnameOverride"] == NODE, "{body}");
    agent.wait_for_log(
        0,
        "mode: \"iptables\" has no effect",
        Duration::from_secs(1),
    )?;

    // The node is being deleted: load balancers should stop sending new
    // traffic (/healthz), but the agent itself is fine (/livez).
    cluster.delete(&nodes, NODE)?;
    let start = Instant::now();
    loop {
        let (code, body) = agent.get(agent.healthz_addr, "/healthz")?;
        if code == 503 {
            ensure!(body.contains("\"nodeEligible\":false"), "{body}");
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "still {code} {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(agent.get(agent.healthz_addr, "/livez")?.0 == 200);
    ensure!(agent.get(agent.metrics_addr, "/nope")?.0 == 404);
    Ok(())
}
