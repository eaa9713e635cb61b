//! Pods reaching the external frontends of Services from inside the cluster,
//! as kube-proxy treats them: externalTrafficPolicy Local does not apply to
//! them (every endpoint serves); a pod reaching itself through a NodePort is
//! SNATed to the node; loadBalancerSourceRanges apply to pods too, even with
//! socket LB on (which leaves such frontends to the TC path).
use anyhow::{Result, ensure};
use weir_abi::{STAT_DROP_SRC_RANGE, STAT_PROG_TC_INGRESS};
use weir_integration::packet_topology::{
    CLIENT4, CLIENT6, LPOD, NODE_EXT4, NODE_EXT6, NODE_POD4, NODE_POD6, Ns, PacketAgent,
    PacketTopology, RPOD,
    clients::{Curl, CurlOpts, target},
    manifests::{Ep, HTTP_PORT, READY, Svc},
};

use crate::support::{alive, publish, serving, serving_with};

/// `GET /peer` on `ip:port` from the local pod, inside the agent's cgroup
/// (socket LB applies when it is on) if `cgroup`.
fn from_lpod(
    topo: &PacketTopology,
    ip: &str,
    port: u16,
    cgroup: bool,
    max_time: f64,
) -> Result<Curl> {
    topo.curl(
        Ns::Lpod,
        &format!("{}/peer", target(ip, port)),
        CurlOpts {
            cgroup,
            max_time,
            ..Default::default()
        },
    )
}

/// Waits for a first answer from the local pod, then asks `n` more times:
/// every `(backend, source seen)`.
fn answers_to_lpod(
    topo: &PacketTopology,
    ip: &str,
    port: u16,
    cgroup: bool,
    n: usize,
) -> Result<Vec<(String, String)>> {
    let first = serving_with(
        topo,
        Ns::Lpod,
        ip,
        port,
        CurlOpts {
            cgroup,
            ..Default::default()
        },
    )?;
    let mut all = vec![first];
    for _ in 0..n {
        let c = from_lpod(topo, ip, port, cgroup, 3.0)?;
        match c.who() {
            Some(w) if c.ok() => all.push(w),
            _ => anyhow::bail!("{} from the local pod: {c:?}", target(ip, port)),
        }
    }
    Ok(all)
}

#[test]
fn pods_reach_every_endpoint_of_a_local_policy_service_that_external_clients_cannot() -> Result<()>
{
    const NP: u16 = 31180;
    let (lb4, lb6) = ("192.168.70.90", "fd00:70::90");
    let topo = PacketTopology::new()?;
    let mut svc = Svc::load_balancer(
        "local-remote",
        "10.96.9.10",
        "fd00:96::9:10",
        [NP, 31153, 31154],
        &[lb4, lb6],
    );
    svc.etp_local = true;
    // The only endpoint is on the other node: nothing local.
    publish(&topo, &svc, &[Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &[])?;
    serving(&topo, Ns::Lpod, "10.96.9.10", HTTP_PORT)?;

    for (ip, port) in [
        (NODE_POD4, NP),
        (NODE_EXT4, NP),
        (lb4, HTTP_PORT),
        (NODE_POD6, NP),
        (NODE_EXT6, NP),
        (lb6, HTTP_PORT),
    ] {
        let seen = answers_to_lpod(&topo, ip, port, true, 5)?;
        ensure!(
            seen.iter().all(|(name, _)| name == "rpod"),
            "{} from the local pod: {seen:?}",
            target(ip, port)
        );
    }
    // From outside the cluster the policy holds: no local endpoint, dropped.
    for (ip, port) in [
        (NODE_EXT4, NP),
        (lb4, HTTP_PORT),
        (NODE_EXT6, NP),
        (lb6, HTTP_PORT),
    ] {
        let c = topo.curl(
            Ns::Client,
            &format!("{}/peer", target(ip, port)),
            CurlOpts {
                max_time: 1.0,
                ..Default::default()
            },
        )?;
        ensure!(
            !c.ok(),
            "{} from the external client (Local, no local endpoint) answered: {c:?}",
            target(ip, port)
        );
    }
    alive(&mut agent)
}

#[test]
fn a_pod_reaching_itself_through_a_node_port_is_snated_to_the_node() -> Result<()> {
    const NP: u16 = 31280;
    let topo = PacketTopology::new()?;
    let svc = Svc::node_port("self", "10.96.9.20", "fd00:96::9:20", [NP, 31253, 31254]);
    publish(&topo, &svc, &[Ep::of(LPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &["--socket-lb=false"])?;
    let node_addrs: Vec<String> = PacketTopology::node_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    // Through the node's address towards the pod and its client-side one.
    for ip in [NODE_POD4, NODE_EXT4, NODE_POD6, NODE_EXT6] {
        let seen = answers_to_lpod(&topo, ip, NP, false, 5)?;
        for (name, peer) in &seen {
            ensure!(
                name == "lpod" && node_addrs.contains(peer),
                "{} from the local pod: {name} saw {peer}, expected lpod seeing a node address",
                target(ip, NP)
            );
        }
    }
    alive(&mut agent)
}

#[test]
fn source_ranges_drop_a_pod_outside_them_even_with_socket_lb() -> Result<()> {
    let (lb4, lb6) = ("192.168.70.95", "fd00:70::95");
    let topo = PacketTopology::new()?;
    let mut svc = Svc::load_balancer(
        "ranged-pods",
        "10.96.9.30",
        "fd00:96::9:30",
        [31380, 31353, 31354],
        &[lb4, lb6],
    );
    svc.source_ranges = vec![format!("{CLIENT4}/32"), format!("{CLIENT6}/128")];
    publish(&topo, &svc, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &[])?;
    // The Service works: its ClusterIP for the pod, its LB IPs for the
    // client inside the ranges.
    serving(&topo, Ns::Lpod, "10.96.9.30", HTTP_PORT)?;
    for lb in [lb4, lb6] {
        serving(&topo, Ns::Client, lb, HTTP_PORT)?;
    }
    for lb in [lb4, lb6] {
        let before = agent.stat(STAT_PROG_TC_INGRESS, STAT_DROP_SRC_RANGE)?;
        let c = from_lpod(&topo, lb, HTTP_PORT, true, 1.5)?;
        // Dropped, not refused and not served: curl waits until its timeout.
        ensure!(
            !c.ok() && c.exit == 28,
            "{lb} from the local pod (outside the ranges) did not time out: {c:?}"
        );
        let after = agent.stat(STAT_PROG_TC_INGRESS, STAT_DROP_SRC_RANGE)?;
        ensure!(
            after > before,
            "{lb} from the local pod: drop counter stayed at {before}"
        );
    }
    alive(&mut agent)
}
