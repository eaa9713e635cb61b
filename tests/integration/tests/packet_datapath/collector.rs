//! The conntrack collector: with short timeouts it removes the entries of
//! idle flows (a closed TCP connection, a quiet UDP exchange) while a flow
//! that keeps sending keeps its entries. Flows are told apart by the client
//! ports the test binds, never by counting entries, so other traffic (and
//! parallel tests) cannot make it pass or fail.
use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use weir_abi::{CT_DIR_FORWARD, CT_DIR_REPLY, CtKey, CtValue};
use weir_integration::packet_topology::{
    CLIENT4, CLIENT6, LPOD, NODE_EXT4, Ns, PacketAgent, PacketTopology, RPOD,
    clients::{CurlOpts, target},
    manifests::{ECHO_PORT, Ep, READY},
};

use crate::{
    lifecycle::{LB6, NP, NP_ECHO, svc},
    support::{SETTLE, UdpStream, alive, poll, publish, serving},
};

/// A flow by its client end.
#[derive(Clone, Copy, Debug)]
struct Flow {
    what: &'static str,
    client: &'static str,
    port: u16,
}

/// The forward entry (client → frontend) and the reply entry (backend →
/// client after translation) of `flow`.
fn entries(ct: &[(CtKey, CtValue)], flow: Flow) -> (Option<CtValue>, Option<CtValue>) {
    let client: IpAddr = flow.client.parse().expect("valid");
    let fwd = ct.iter().find(|(k, _)| {
        k.dir == CT_DIR_FORWARD
            && IpAddr::from(k.saddr) == client
            && u16::from_be(k.sport) == flow.port
    });
    let reply = ct.iter().find(|(k, v)| {
        k.dir == CT_DIR_REPLY
            && IpAddr::from(v.nat_daddr) == client
            && u16::from_be(v.nat_dport) == flow.port
    });
    (fwd.map(|e| e.1), reply.map(|e| e.1))
}

/// Fails unless `live` has both entries, and its forward entry is the one
/// seen before (its packet count never goes back, which a collected and
/// recreated entry's would).
fn check_live(ct: &[(CtKey, CtValue)], live: Flow, last_packets: &mut u64) -> Result<()> {
    let (fwd, reply) = entries(ct, live);
    let (Some(fwd), Some(_)) = (fwd, reply) else {
        bail!(
            "the collector removed the entries of {live:?}, which keeps sending: forward {fwd:?}, reply {reply:?}"
        );
    };
    ensure!(
        fwd.packets >= *last_packets,
        "the forward entry of {live:?} was recreated: {} packets after {}",
        fwd.packets,
        last_packets
    );
    *last_packets = fwd.packets;
    Ok(())
}

#[test]
fn the_collector_removes_expired_conntrack_entries_and_keeps_live_ones() -> Result<()> {
    let topo = PacketTopology::new()?;
    let svc = svc();
    publish(&topo, &svc, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(
        &topo,
        &[
            "--ct-timeout-udp=2s",
            "--ct-timeout-tcp-fin=2s",
            "--ct-timeout-tcp-syn=2s",
            "--ct-gc-interval=1s",
        ],
    )?;
    serving(&topo, Ns::Client, NODE_EXT4, NP)?;

    let live = Flow {
        what: "UDP stream",
        client: CLIENT4,
        port: 41001,
    };
    let idle_udp = Flow {
        what: "one UDP exchange",
        client: CLIENT6,
        port: 41002,
    };
    let idle_tcp = Flow {
        what: "closed TCP connection",
        client: CLIENT4,
        port: 41003,
    };
    // A send every 100 ms, far inside the 2 s timeout, for as long as the
    // test watches.
    let stream = UdpStream::start(
        &topo,
        Ns::Client,
        false,
        &target(NODE_EXT4, NP_ECHO),
        20_000,
        live.port,
    )?;
    let backend = stream.backend()?;
    let p = topo.probe(
        Ns::Client,
        false,
        "udp",
        &target(LB6, ECHO_PORT),
        1,
        &[
            "--payload",
            "peer",
            "--source-port",
            &idle_udp.port.to_string(),
        ],
    )?;
    ensure!(p.ok == 1, "{}: {p:?}", idle_udp.what);
    let c = topo.curl(
        Ns::Client,
        &format!("{}/peer", target(NODE_EXT4, NP)),
        CurlOpts {
            local_port: Some(idle_tcp.port),
            ..Default::default()
        },
    )?;
    ensure!(c.ok(), "{}: {c:?}", idle_tcp.what);

    // Every flow has both entries to begin with.
    poll(SETTLE, "entries of all three flows", || {
        let ct = agent.conntrack()?;
        let missing: Vec<Flow> = [live, idle_udp, idle_tcp]
            .into_iter()
            .filter(|f| !matches!(entries(&ct, *f), (Some(_), Some(_))))
            .collect();
        Ok(if missing.is_empty() {
            Ok(())
        } else {
            Err(missing)
        })
    })?;

    // The idle flows' entries go within timeout + a few collector rounds;
    // the live flow's stay all along.
    let mut last_packets = 0;
    poll(Duration::from_secs(15), "idle flows collected", || {
        let ct = agent.conntrack()?;
        check_live(&ct, live, &mut last_packets)?;
        let left: Vec<(&str, bool, bool)> = [idle_udp, idle_tcp]
            .into_iter()
            .map(|f| {
                let (a, b) = entries(&ct, f);
                (f.what, a.is_some(), b.is_some())
            })
            .filter(|(_, a, b)| *a || *b)
            .collect();
        Ok(if left.is_empty() { Ok(()) } else { Err(left) })
    })?;
    // Three more collector rounds, past the live flow's own timeout had it
    // stopped being refreshed.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        check_live(&agent.conntrack()?, live, &mut last_packets)?;
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every send so far was answered, all by the first backend: the flow was
    // never torn down and picked afresh. (Dropping the stream stops it.)
    let seen = stream.seen();
    ensure!(
        seen.len() >= 30 && seen.iter().all(|x| *x == backend),
        "the live UDP flow was disturbed: {seen:?}"
    );
    alive(&mut agent)
}
