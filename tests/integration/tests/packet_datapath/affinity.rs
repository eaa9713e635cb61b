//! sessionAffinity: ClientIP holds within its timeout and is released after,
//! per packet (external client, by address) and per socket (socket LB, by
//! network namespace).
use std::time::Duration;

use anyhow::Result;
use weir_integration::packet_topology::{
    LPOD, Ns, PacketAgent, PacketTopology, RPOD,
    clients::target,
    manifests::{Ep, READY, Svc},
};

use crate::support::{alive, external_frontends, frontend_view, has_flag, publish, serving, who};

const TIMEOUT_S: i64 = 2;

#[test]
fn client_ip_affinity_holds_within_its_timeout_and_is_released_after() -> Result<()> {
    let topo = PacketTopology::new()?;
    let mut svc = Svc::load_balancer(
        "sticky",
        "10.96.2.10",
        "fd00:96::2:10",
        [30180, 30453, 30153],
        &["192.168.70.30", "fd00:70::30"],
    );
    svc.affinity_timeout = Some(TIMEOUT_S);
    publish(&topo, &svc, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &[])?;
    let fronts = external_frontends(&svc);
    serving(&topo, Ns::Client, &fronts[0].ip, fronts[0].ports[0])?;

    let v = frontend_view(&agent, "192.168.70.30", 80, "TCP")?
        .ok_or_else(|| anyhow::anyhow!("LB IP not in inspect services"))?;
    assert!(
        has_flag(&v, "affinity") && v["affinity_timeout"] == TIMEOUT_S,
        "{v}"
    );

    // Within the timeout: every request of a burst lands on one backend, on
    // every frontend and in both families (each frontend has its own entry).
    for f in &fronts {
        let (first, _) = who(&topo, Ns::Client, &f.ip, f.ports[0])?;
        for i in 0..10 {
            let (name, _) = who(&topo, Ns::Client, &f.ip, f.ports[0])?;
            assert_eq!(name, first, "{} {}: request {i} left {first}", f.kind, f.ip);
        }
    }

    // After the timeout the choice is made afresh: waiting longer than the
    // timeout before each request, some request lands elsewhere. Each round
    // moves with an even chance, so a working datapath moves within two
    // rounds on average; ROUNDS only bounds how long a broken one is given.
    // (12 rounds, 2^-12 per frontend, once failed a correct datapath in CI.)
    const ROUNDS: u32 = 30;
    for f in [&fronts[0], &fronts[fronts.len() - 1]] {
        let (first, _) = who(&topo, Ns::Client, &f.ip, f.ports[0])?;
        let mut moved = false;
        for round in 1..=ROUNDS {
            std::thread::sleep(Duration::from_millis(TIMEOUT_S as u64 * 1000 + 1500));
            let (name, _) = who(&topo, Ns::Client, &f.ip, f.ports[0])?;
            if name != first {
                eprintln!("{} {}: left {first} after round {round}", f.kind, f.ip);
                moved = true;
                break;
            }
        }
        assert!(
            moved,
            "{} {}: still on {first} after {ROUNDS} timeouts",
            f.kind, f.ip
        );
    }

    // Socket LB: a client in the agent's cgroup sticks to one backend of the
    // ClusterIP, in both families.
    for vip in ["10.96.2.10", "fd00:96::2:10"] {
        let p = topo.probe(Ns::Node, true, "tcp", &target(vip, 80), 20, &[])?;
        assert_eq!(p.ok, 20, "{vip}: {p:?}");
        assert_eq!(
            p.backends.len(),
            1,
            "{vip} socket LB ignored affinity: {p:?}"
        );
    }
    alive(&mut agent)
}
