//! ClusterIP traffic: per packet with `--socket-lb=false` (including a pod
//! reaching itself through its Service, and internalTrafficPolicy Local), and
//! with socket LB a connected UDP client in a pod whose backend is removed.
use std::collections::BTreeSet;

use anyhow::{Context as _, Result};
use weir_abi::{CT_F_CLUSTERIP, STAT_NEW_FLOW, STAT_PROG_TC_INGRESS};
use weir_integration::packet_topology::{
    LPOD, NODE_POD4, NODE_POD6, Ns, POD_UDP_PORT_PRIVATE, PacketAgent, PacketTopology, RPOD,
    clients::target,
    manifests::{DNS_PORT, ECHO_PORT, Ep, HTTP_PORT, READY, Svc},
};

use crate::support::{
    UdpStream, alive, pod_of_dns, publish, remove_each_streams_backend, serving, who,
};

#[test]
fn per_packet_cluster_ip_from_a_pod_with_hairpin_and_internal_policy_local() -> Result<()> {
    let topo = PacketTopology::new()?;
    let svc = Svc::cluster_ip("inner", "10.96.6.10", "fd00:96::6:10");
    publish(&topo, &svc, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut local = Svc::cluster_ip("inner-local", "10.96.6.20", "fd00:96::6:20");
    local.itp_local = true;
    publish(&topo, &local, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &["--socket-lb=false"])?;
    serving(&topo, Ns::Lpod, "10.96.6.10", HTTP_PORT)?;

    for (vip, v6) in [("10.96.6.10", false), ("fd00:96::6:10", true)] {
        let (me, node) = if v6 {
            (LPOD.v6, NODE_POD6)
        } else {
            (LPOD.v4, NODE_POD4)
        };
        // A pod reaching itself is SNATed to the node (else its reply would
        // never come back through the node); the other pod sees the client pod.
        let expect = |name: &str| if name == "lpod" { node } else { me };
        let mut seen = BTreeSet::new();
        for _ in 0..16 {
            let (name, peer) = who(&topo, Ns::Lpod, vip, HTTP_PORT)?;
            assert_eq!(peer, expect(&name), "{vip} TCP: {name} saw {peer}");
            seen.insert(name);
            let (name, peer) = topo
                .who_udp(Ns::Lpod, vip, ECHO_PORT)?
                .with_context(|| format!("{vip} UDP: no answer"))?;
            assert_eq!(peer, expect(&name), "{vip} UDP: {name} saw {peer}");
            seen.insert(name);
            let a = topo.dig(Ns::Lpod, vip, DNS_PORT, "A")?;
            let name = a
                .as_deref()
                .and_then(|a| pod_of_dns(a, &[LPOD, RPOD]))
                .with_context(|| format!("{vip} DNS: {a:?}"))?;
            seen.insert(name.to_owned());
        }
        assert_eq!(seen.len(), 2, "{vip}: only {seen:?} answered");
    }
    // internalTrafficPolicy: Local keeps the pod on its own node's endpoint.
    for vip in ["10.96.6.20", "fd00:96::6:20"] {
        for _ in 0..10 {
            let (name, _) = who(&topo, Ns::Lpod, vip, HTTP_PORT)?;
            assert_eq!(name, "lpod", "{vip} (internalTrafficPolicy Local)");
        }
    }
    assert!(agent.stat(STAT_PROG_TC_INGRESS, STAT_NEW_FLOW)? > 0);
    assert!(
        agent
            .conntrack()?
            .iter()
            .any(|(_, v)| v.flags & CT_F_CLUSTERIP != 0),
        "no conntrack entry is marked ClusterIP"
    );
    alive(&mut agent)
}

#[test]
fn connected_udp_client_gets_a_fresh_backend_after_its_backend_is_removed() -> Result<()> {
    const V4: &str = "10.96.7.10";
    const V6: &str = "fd00:96::7:10";
    let topo = PacketTopology::new()?;
    let mut svc = Svc::cluster_ip("dns", V4, V6);
    // Backends on a port no other test removes: the agents of tests running
    // alongside destroy sockets to the pod addresses they remove, in every
    // namespace, and the pod addresses are the same in every topology.
    svc.echo_target = POD_UDP_PORT_PRIVATE;
    publish(&topo, &svc, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &[])?;

    // In the local pod, not the node: the agent has to find the sockets in
    // another network namespace than its own.
    let mut streams = Vec::new();
    for vip in [V4, V6] {
        streams.push(UdpStream::start(
            &topo,
            Ns::Lpod,
            true,
            &target(vip, ECHO_PORT),
            10_000,
            0,
        )?);
    }
    // Until the agent has destroyed the socket it still reaches the removed
    // pod (up to a second of sends); destroyed, it fails once, and the
    // client's next send connects afresh.
    remove_each_streams_backend(
        &topo,
        &agent,
        &svc,
        streams,
        [(V4, ECHO_PORT, false), (V6, ECHO_PORT, true)],
        10,
        1,
    )?;
    alive(&mut agent)
}
