//! UDP through the socket hooks: what a socket keeps across datagrams, what
//! it leaves behind when it closes, and which sockets a Service's change
//! reaps. Real sockets in a namespace, the real kernel programs, the agent
//! in standalone mode. Needs root.
use std::time::Duration;

use anyhow::Result;
use weir_integration::{
    Agent, Topology,
    agent::ServiceView,
    bin,
    client_stream::ClientStream,
    manifest::{self, NOT_SERVING, READY},
};

const VIP: &str = "10.96.0.10";
const UDP_TARGET: &str = "10.96.0.10:53";
const SETTLE: Duration = Duration::from_secs(10);

/// Writes Service `name` on `vip` and one slice of `eps` (name, conditions).
fn publish(topo: &Topology, name: &str, vip: &str, eps: &[(&str, manifest::Cond)]) -> Result<()> {
    let eps: Vec<_> = eps.iter().map(|(n, c)| (topo.backend(n).ip, *c)).collect();
    topo.write_manifest(
        &format!("{name}-slice.yaml"),
        &manifest::slice(&format!("{name}-1"), name, &eps),
    )?;
    topo.write_manifest(&format!("{name}.yaml"), &manifest::service(name, vip))
}

/// The states of the UDP frontend `vip:53`'s backends, by backend address.
fn udp_states(views: &[ServiceView], vip: &str) -> Vec<(String, String)> {
    views
        .iter()
        .find(|v| v.vip.to_string() == vip && v.port == 53 && v.protocol == "UDP")
        .map(|v| {
            v.backends
                .iter()
                .map(|b| (b.ip.to_string(), b.state.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A `weir-testclient` streaming mode run in the agent's cgroup.
fn stream(
    topo: &Topology,
    mode: &str,
    target: &str,
    ms: u64,
    interval: u64,
) -> Result<ClientStream> {
    let mut cmd = topo.client(bin("weir-testclient"));
    cmd.args([mode, "--target", target])
        .args(["--duration-ms", &ms.to_string()])
        .args(["--interval-ms", &interval.to_string()]);
    ClientStream::spawn(cmd)
}

#[test]
fn an_unconnected_udp_socket_keeps_its_backend_and_sees_the_vip() -> Result<()> {
    let topo = Topology::new(3)?;
    publish(
        &topo,
        "web",
        VIP,
        &[("be1", READY), ("be2", READY), ("be3", READY)],
    )?;
    let _agent = Agent::start(&topo, &[])?;
    // 1,000 datagrams on one socket, back to back: one backend answers all,
    // and every answer's source is the ClusterIP (recvmsg's translation).
    // Fresh sockets still spread (socket_lb's uniformity test).
    for _ in 0..3 {
        let p = topo.probe_with("udp-one-socket", UDP_TARGET, 1000, &["--interval-ms", "0"])?;
        assert_eq!(p.ok, 1000, "{p:?}");
        assert_eq!(p.backends.len(), 1, "one socket, several backends: {p:?}");
        assert_eq!(p.peer_mismatch, 0, "{p:?}");
    }
    Ok(())
}

#[test]
fn a_socket_moves_off_a_draining_backend_once_and_sticks_to_the_next() -> Result<()> {
    let topo = Topology::new(3)?;
    let all = [("be1", READY), ("be2", READY), ("be3", READY)];
    publish(&topo, "web", VIP, &all)?;
    let agent = Agent::start(&topo, &[])?;

    let s = stream(&topo, "udp-one-socket", UDP_TARGET, 4000, 20)?;
    let first = s.backend(SETTLE)?;
    // Its backend stops serving (terminating, serving: false): the socket's
    // next datagram goes elsewhere, and stays there.
    let eps: Vec<_> = all
        .iter()
        .map(|&(n, c)| (n, if n == first { NOT_SERVING } else { c }))
        .collect();
    publish(&topo, "web", VIP, &eps)?;
    let drained = topo.backend(&first).ip.to_string();
    agent.wait_for(SETTLE, |v| {
        udp_states(v, VIP)
            .iter()
            .any(|(ip, st)| *ip == drained && st == "draining")
    })?;
    let p = s.finish()?;
    assert_eq!(p.peer_mismatch, 0, "{p:?}");
    assert!(p.errors.is_empty(), "{p:?}");
    let moved = p
        .sequence
        .iter()
        .position(|b| *b != first)
        .unwrap_or_else(|| panic!("never left {first}: {:?}", p.sequence));
    let after = &p.sequence[moved..];
    assert!(
        after.iter().all(|b| *b == after[0]),
        "after leaving {first} the socket went to several backends: {after:?}"
    );
    assert!(after.len() >= 10, "too few answers after the move: {p:?}");
    Ok(())
}

#[test]
fn closed_sockets_leave_the_reverse_map_and_a_live_udp_socket_keeps_the_vip() -> Result<()> {
    let topo = Topology::new(2)?;
    publish(&topo, "web", VIP, &[("be1", READY), ("be2", READY)])?;
    // A small map, so that the connections below are twenty times what it
    // holds: without the release hook it would be full of closed sockets.
    // The collector's sweep counts it for the pressure metric.
    let agent = Agent::start(&topo, &["--max-revsock", "1024", "--ct-gc-interval", "1s"])?;
    let revsock = topo.pin_dir().join("maps").join(weir_abi::MAP_REVSOCK);
    let info = weir_integration::bpftool(&[
        "map".as_ref(),
        "show".as_ref(),
        "pinned".as_ref(),
        revsock.as_os_str(),
    ])?;
    assert_eq!(info["max_entries"], 1024, "{info}");

    // A long-lived unconnected socket, one datagram every 50 ms throughout.
    let s = stream(&topo, "udp-one-socket", UDP_TARGET, 15_000, 50)?;
    s.backend(SETTLE)?;
    let p = topo.probe("tcp", &format!("{VIP}:80"), 20_000)?;
    assert_eq!(p.ok, 20_000, "{p:?}");
    assert_eq!(p.peer_mismatch, 0, "{p:?}");
    // The TCP client has exited: what is left is the UDP socket's entry.
    let left = weir_integration::pinned_map_len(&revsock)?;
    assert!(
        left <= 2,
        "{left} entries left in {} after 20,000 closed connections",
        weir_abi::MAP_REVSOCK
    );
    // The operator sees the same through the metrics.
    let series = |m: &str| format!("weir_{m}{{map=\"{}\"}}", weir_abi::MAP_REVSOCK);
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let entries = agent.metric(&series("map_entries"))?;
        let capacity = agent.metric(&series("map_capacity"))?;
        if capacity == Some(1024.0) && entries.is_some_and(|e| e <= 2.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metrics: entries {entries:?}, capacity {capacity:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let u = s.finish()?;
    assert!(u.ok > 50, "{u:?}");
    assert_eq!(u.peer_mismatch, 0, "answers not from the ClusterIP: {u:?}");
    assert_eq!(u.backends.len(), 1, "{u:?}");
    Ok(())
}

#[test]
fn dropping_a_backend_reaps_that_services_sockets_only() -> Result<()> {
    const OTHER_VIP: &str = "10.96.0.11";
    let topo = Topology::new(2)?;
    // Two Services over the same pod be1.
    publish(&topo, "a", VIP, &[("be1", READY)])?;
    publish(&topo, "b", OTHER_VIP, &[("be1", READY)])?;
    let agent = Agent::start(&topo, &[])?;

    let sa = stream(&topo, "udp-stream", UDP_TARGET, 5000, 100)?;
    let sb = stream(&topo, "udp-stream", &format!("{OTHER_VIP}:53"), 5000, 100)?;
    assert_eq!(sa.backend(SETTLE)?, "be1");
    assert_eq!(sb.backend(SETTLE)?, "be1");
    // Service a moves to be2; b keeps be1.
    publish(&topo, "a", VIP, &[("be2", READY)])?;
    let be2 = topo.backend("be2").ip.to_string();
    agent.wait_for(SETTLE, |v| {
        udp_states(v, VIP)
            .iter()
            .map(|(ip, _)| ip.as_str())
            .eq([be2.as_str()])
    })?;

    let a = sa.finish()?;
    let b = sb.finish()?;
    // a's connected socket was destroyed, reconnected, and reached be2;
    // nothing from be1 after that. A socket destroyed while it waits for an
    // answer reads ECONNABORTED; one destroyed between two sends has lost
    // its peer, and its next send fails with EDESTADDRREQ.
    let err = a
        .sequence
        .iter()
        .position(|x| x.starts_with("error:"))
        .unwrap_or_else(|| panic!("a's socket on be1 was not reaped: {:?}", a.sequence));
    assert!(
        ["error:ECONNABORTED", "error:EDESTADDRREQ"].contains(&a.sequence[err].as_str()),
        "{a:?}"
    );
    assert!(
        a.sequence[err + 1..].iter().all(|x| x == "be2") && a.sequence.len() > err + 3,
        "{a:?}"
    );
    // b's socket to the same pod is b's business: untouched.
    assert!(b.errors.is_empty(), "{b:?}");
    assert!(b.sequence.iter().all(|x| x == "be1"), "{b:?}");
    Ok(())
}
