//! ClusterIP traffic: per packet with `--socket-lb=false` (including a pod
//! reaching itself through its Service, and internalTrafficPolicy Local), and
//! with socket LB a connected UDP client whose backend is removed.
use std::{collections::BTreeSet, time::Duration};

use anyhow::{Context as _, Result, bail};
use weir_abi::{CT_F_CLUSTERIP, STAT_NEW_FLOW, STAT_PROG_TC_INGRESS};
use weir_integration::packet_topology::{
    LPOD, NODE_POD4, NODE_POD6, Ns, PacketAgent, PacketTopology, RPOD,
    clients::target,
    manifests::{DNS_PORT, ECHO_PORT, Ep, HTTP_PORT, READY, Svc},
};

use crate::support::{UdpStream, alive, pod_of_dns, poll, publish, who};

#[test]
fn per_packet_cluster_ip_from_a_pod_with_hairpin_and_internal_policy_local() -> Result<()> {
    let topo = PacketTopology::new()?;
    let svc = Svc::cluster_ip("inner", "10.96.6.10", "fd00:96::6:10");
    publish(
        &topo,
        &svc,
        &[Ep::local(LPOD, READY), Ep::remote(RPOD, READY)],
    )?;
    let mut local = Svc::cluster_ip("inner-local", "10.96.6.20", "fd00:96::6:20");
    local.itp_local = true;
    publish(
        &topo,
        &local,
        &[Ep::local(LPOD, READY), Ep::remote(RPOD, READY)],
    )?;
    let mut agent = PacketAgent::start(&topo, &["--socket-lb=false"])?;
    poll(Duration::from_secs(5), "first answer", || {
        Ok(topo
            .who_tcp(Ns::Lpod, "10.96.6.10", HTTP_PORT)?
            .who()
            .ok_or(()))
    })?;

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
    let topo = PacketTopology::new()?;
    let svc = Svc::cluster_ip("dns", "10.96.7.10", "fd00:96::7:10");
    publish(
        &topo,
        &svc,
        &[Ep::local(LPOD, READY), Ep::remote(RPOD, READY)],
    )?;
    let mut agent = PacketAgent::start(&topo, &[])?;

    let streams = [
        UdpStream::start(
            &topo,
            Ns::Node,
            true,
            &target("10.96.7.10", ECHO_PORT),
            8000,
        )?,
        UdpStream::start(
            &topo,
            Ns::Node,
            true,
            &target("fd00:96::7:10", ECHO_PORT),
            8000,
        )?,
    ];
    // Remove the v4 client's backend from both families' slices.
    let gone = streams[0].first_backend()?;
    streams[1].first_backend()?;
    let (gone_pod, other) = if gone == "lpod" {
        (LPOD, RPOD)
    } else {
        (RPOD, LPOD)
    };
    let other_ep = if other.name == "lpod" {
        Ep::local(other, READY)
    } else {
        Ep::remote(other, READY)
    };
    publish(&topo, &svc, &[other_ep])?;
    poll(
        Duration::from_secs(5),
        "removed backend gone from the maps",
        || {
            let s = agent.inspect("services")?.to_string();
            Ok(if s.contains(gone_pod.v4) {
                Err(s)
            } else {
                Ok(())
            })
        },
    )?;
    // Every outcome from here on comes after the removal reached the maps;
    // the agent destroys the sockets right after that sync, from its own
    // thread: allow two sends (200 ms) for it.
    let cut: Vec<usize> = streams.iter().map(|s| s.seen().len() + 2).collect();

    for (s, cut) in streams.into_iter().zip(cut) {
        let p = s.finish()?;
        let seq = &p.sequence;
        if seq.len() <= cut + 10 {
            bail!("too few sends after the removal: {p:?}");
        }
        let after = &seq[cut..];
        assert!(
            !after.contains(&gone),
            "removed {gone} answered again after the removal: {seq:?}"
        );
        // A fresh backend answers within a few sends, and for good.
        let tail = &seq[seq.len() - 10..];
        assert!(
            tail.iter().all(|x| x == other.name),
            "the client did not settle on {}: {seq:?}",
            other.name
        );
    }
    alive(&mut agent)
}
