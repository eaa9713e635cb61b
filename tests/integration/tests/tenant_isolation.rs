//! One tenant's Service can neither take the node's health down nor take
//! another Service's frontends (issue 12, items 11 and 12). Needs root.
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use serde_json::json;
use weir_integration::{
    Agent, Topology,
    agent::backends_of,
    api::{Cluster, Ep},
    manifest::{self, READY},
};

const NODE: &str = "node-a";

fn ep(topo: &Topology, name: &str) -> Ep {
    Ep::new(topo.backend(name).ip, READY)
}

fn be(topo: &Topology, name: &str) -> String {
    format!("{}:8080", topo.backend(name).ip)
}

/// Polls `/healthz` and `/livez` for `period`: every answer must be 200.
fn healthy_throughout(agent: &Agent, period: Duration) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < period {
        for path in ["/healthz", "/livez"] {
            let (code, body) = agent.get(agent.healthz_addr, path)?;
            ensure!(
                code == 200,
                "{path} answered {code} {body} after {:?}; agent log:\n{}",
                start.elapsed(),
                agent.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

/// Item 11: a Service whose external IP is another Service's cluster IP, and
/// one that does not fit the maps, exist for three times `--healthz-timeout`:
/// health stays 200 and the other Service keeps working.
#[test]
fn a_conflicting_or_oversized_service_never_fails_the_nodes_health() -> Result<()> {
    let topo = Topology::new(3)?;
    let cluster = Cluster::start()?;
    // A two-port Service takes a backend id per port and endpoint: victim
    // (two endpoints) 4, evil (one) 2, toobig (three) 6, which does not fit.
    let mut agent = Agent::start_api(
        &topo,
        cluster.kubeconfig(),
        NODE,
        &["--max-backends", "8", "--healthz-timeout", "2s"],
    )?;
    cluster.service("victim", "10.96.0.10", json!({}))?;
    cluster.slice("victim-1", "victim", &[ep(&topo, "be1"), ep(&topo, "be2")])?;
    agent.wait_for(Duration::from_secs(2), |v| {
        backends_of(v, "10.96.0.10", 80, "TCP").is_some_and(|b| b.len() == 2)
    })?;
    cluster.service(
        "aaa-evil",
        "10.96.0.20",
        json!({"externalIPs": ["10.96.0.10"]}),
    )?;
    cluster.slice("aaa-evil-1", "aaa-evil", &[ep(&topo, "be3")])?;
    cluster.service("toobig", "10.96.0.16", json!({}))?;
    cluster.slice(
        "toobig-1",
        "toobig",
        &[ep(&topo, "be1"), ep(&topo, "be2"), ep(&topo, "be3")],
    )?;
    let start = Instant::now();
    while agent
        .metric("weir_sync_errors_total{reason=\"MapFull\"}")?
        .is_none()
    {
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "toobig never failed to fit; log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    healthy_throughout(&agent, Duration::from_secs(6))?;
    let p = topo.probe("tcp", "10.96.0.10:80", 40)?;
    ensure!(p.ok == 40, "{p:?}");
    ensure!(
        p.backends.keys().all(|b| b == "be1" || b == "be2"),
        "the victim's cluster IP reaches only its own backends: {p:?}"
    );
    ensure!(agent.is_running());
    Ok(())
}

/// Item 12, API mode: the refused external IP is an Event on the tenant's
/// Service naming the field and the Service it belongs to.
#[test]
fn an_external_ip_on_another_services_cluster_ip_is_refused_with_an_event() -> Result<()> {
    let topo = Topology::new(2)?;
    let cluster = Cluster::start()?;
    let agent = Agent::start_api(&topo, cluster.kubeconfig(), NODE, &[])?;
    cluster.service("victim", "10.96.0.10", json!({}))?;
    cluster.slice("victim-1", "victim", &[ep(&topo, "be1")])?;
    cluster.service(
        "aaa-evil",
        "10.96.0.20",
        json!({"externalIPs": ["10.96.0.10"]}),
    )?;
    cluster.slice("aaa-evil-1", "aaa-evil", &[ep(&topo, "be2")])?;
    // Evil keeps its own cluster IP: only the stolen address is refused.
    agent.wait_for(Duration::from_secs(3), |v| {
        backends_of(v, "10.96.0.20", 80, "TCP") == Some(vec![be(&topo, "be2")])
    })?;
    let views = agent.inspect()?;
    ensure!(
        backends_of(&views, "10.96.0.10", 80, "TCP") == Some(vec![be(&topo, "be1")]),
        "{views:?}"
    );

    let events: Api<Event> = cluster.api("default");
    let start = Instant::now();
    let ev = loop {
        let found = cluster
            .block_on(events.list(&Default::default()))?
            .items
            .into_iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("aaa-evil")
                    && e.reason.as_deref() == Some("FrontendRefused")
            });
        if let Some(ev) = found {
            break ev;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "no FrontendRefused event; log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let note = ev.note.unwrap_or_default();
    for want in ["spec.externalIPs[0]", "10.96.0.10", "default/victim"] {
        ensure!(note.contains(want), "{want:?} missing from {note:?}");
    }
    ensure!(ev.type_.as_deref() == Some("Warning"));
    let p = topo.probe("tcp", "10.96.0.10:80", 20)?;
    ensure!(p.ok == 20 && p.backends.keys().all(|b| b == "be1"), "{p:?}");
    Ok(())
}

/// A Service manifest on TCP 80 only, created at `created` (RFC 3339).
fn service(name: &str, vip: &str, created: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default, creationTimestamp: \"{created}\"}}\nspec:\n  clusterIP: {vip}\n  ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080}}]\n{extra}"
    )
}

/// Item 12, across restarts: `aaa-evil` (older, first by name) lists the
/// victim's cluster IP and load-balancer IP as external IPs, and `aaa-young`
/// shares an external IP with the older `zzz-old`. The victim and the
/// oldest keep their frontends while running and after every restart, which
/// syncs Services by name.
#[test]
fn frontend_conflicts_are_settled_the_same_after_every_restart() -> Result<()> {
    let topo = Topology::new(2)?;
    let lb = "  type: LoadBalancer\n  allocateLoadBalancerNodePorts: false\n  loadBalancerSourceRanges: [\"10.0.0.0/8\"]\nstatus:\n  loadBalancer:\n    ingress: [{ip: \"198.51.100.10\"}]\n";
    topo.write_manifest(
        "victim.yaml",
        &service("victim", "10.96.0.10", "2024-01-01T00:00:00Z", lb),
    )?;
    topo.write_manifest(
        "zzz-old.yaml",
        &service(
            "zzz-old",
            "10.96.0.30",
            "2021-01-01T00:00:00Z",
            "  externalIPs: [\"192.0.2.50\"]\n",
        ),
    )?;
    let be1 = topo.backend("be1").ip;
    let be2 = topo.backend("be2").ip;
    for (name, ip) in [
        ("victim", be1),
        ("zzz-old", be1),
        ("aaa-evil", be2),
        ("aaa-young", be2),
    ] {
        topo.write_manifest(
            &format!("{name}-slice.yaml"),
            &manifest::slice(&format!("{name}-1"), name, &[(ip, READY)]),
        )?;
    }
    let mut agent = Agent::start(&topo, &[])?;
    // Both arrive while the victim and the older Service are programmed.
    topo.write_manifest(
        "aaa-evil.yaml",
        &service(
            "aaa-evil",
            "10.96.0.20",
            "2020-01-01T00:00:00Z",
            "  externalIPs: [\"10.96.0.10\", \"198.51.100.10\"]\n",
        ),
    )?;
    topo.write_manifest(
        "aaa-young.yaml",
        &service(
            "aaa-young",
            "10.96.0.31",
            "2023-01-01T00:00:00Z",
            "  externalIPs: [\"192.0.2.50\"]\n",
        ),
    )?;
    // Manifests apply within a second.
    std::thread::sleep(Duration::from_secs(2));
    let owner =
        |views: &[weir_integration::ServiceView], vip: &str| backends_of(views, vip, 80, "TCP");
    let victims_keep_theirs = |views: &[weir_integration::ServiceView], when: &str| {
        for vip in ["10.96.0.10", "198.51.100.10", "192.0.2.50"] {
            ensure!(
                owner(views, vip) == Some(vec![format!("{be1}:8080")]),
                "{when}: {vip}:80 must stay with its owner (be1), maps hold {:?}",
                owner(views, vip)
            );
        }
        Ok(())
    };
    victims_keep_theirs(&agent.inspect()?, "while running")?;
    for round in 1..=2 {
        agent.restart()?;
        victims_keep_theirs(&agent.inspect()?, &format!("after restart {round}"))?;
        let p = topo.probe("tcp", "10.96.0.10:80", 20)?;
        ensure!(p.ok == 20 && p.backends.keys().all(|b| b == "be1"), "{p:?}");
    }
    // A refusal costs the tenants only the contested addresses: their own
    // cluster IPs are programmed.
    let views = agent.inspect()?;
    for vip in ["10.96.0.20", "10.96.0.31"] {
        ensure!(
            owner(&views, vip) == Some(vec![format!("{be2}:8080")]),
            "{vip}:80 is its Service's own, maps hold {:?}",
            owner(&views, vip)
        );
    }
    let log = agent.log_text();
    ensure!(
        log.lines().any(|l| l.contains("default/aaa-evil")
            && l.contains("spec.externalIPs[0]")
            && l.contains("default/victim")),
        "the refusal is logged with the object and the field:\n{log}"
    );
    Ok(())
}
