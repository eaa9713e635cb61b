//! loadBalancerSourceRanges: the LB IPs admit clients inside the ranges and
//! drop (and count) the others, in both families, over TCP and UDP.
use anyhow::Result;
use weir_abi::{STAT_DROP_SRC_RANGE, STAT_PROG_TC_INGRESS};
use weir_integration::packet_topology::{
    CLIENT4, CLIENT4_B, CLIENT6, CLIENT6_B, LPOD, Ns, PacketAgent, PacketTopology, RPOD,
    clients::{CurlOpts, target},
    manifests::{DNS_PORT, Ep, HTTP_PORT, READY, Svc},
};

use crate::support::{alive, frontend_view, has_flag, publish, serving_with};

const LB4: &str = "192.168.70.40";
const LB6: &str = "fd00:70::40";

#[test]
fn source_ranges_admit_listed_clients_and_drop_the_others() -> Result<()> {
    let topo = PacketTopology::new()?;
    let mut svc = Svc::load_balancer(
        "ranged",
        "10.96.3.10",
        "fd00:96::3:10",
        [30280, 30553, 30253],
        &[LB4, LB6],
    );
    svc.source_ranges = vec![format!("{CLIENT4}/32"), format!("{CLIENT6}/128")];
    publish(
        &topo,
        &svc,
        &[Ep::local(LPOD, READY), Ep::remote(RPOD, READY)],
    )?;
    let mut agent = PacketAgent::start(&topo, &[])?;

    for lb in [LB4, LB6] {
        let v = frontend_view(&agent, lb, HTTP_PORT, "TCP")?
            .ok_or_else(|| anyhow::anyhow!("{lb} not in inspect services"))?;
        assert!(has_flag(&v, "source-ranges"), "{v}");
    }
    for (lb, allowed, denied) in [(LB4, CLIENT4, CLIENT4_B), (LB6, CLIENT6, CLIENT6_B)] {
        let url = format!("{}/peer", target(lb, HTTP_PORT));
        let from = |src, max_time| {
            topo.curl(
                Ns::Client,
                &url,
                CurlOpts {
                    source: Some(src),
                    max_time,
                    ..Default::default()
                },
            )
        };
        serving_with(
            &topo,
            Ns::Client,
            lb,
            HTTP_PORT,
            CurlOpts {
                source: Some(allowed),
                ..Default::default()
            },
        )?;
        for _ in 0..5 {
            let c = from(allowed, 2.0)?;
            assert!(c.ok(), "{allowed} → {lb} is inside the range: {c:?}");
        }
        let dig = topo.dig_from(Ns::Client, allowed, lb, DNS_PORT)?;
        assert!(dig.is_some(), "{allowed} → {lb} DNS: no answer");

        let before = agent.stat(STAT_PROG_TC_INGRESS, STAT_DROP_SRC_RANGE)?;
        let c = from(denied, 1.5)?;
        assert!(!c.ok(), "{denied} → {lb} is outside the range: {c:?}");
        // Dropped, not refused: curl waits until its timeout (exit 28).
        assert_eq!(c.exit, 28, "{denied} → {lb}: {c:?}");
        let dig = topo.dig_from(Ns::Client, denied, lb, DNS_PORT)?;
        assert!(dig.is_none(), "{denied} → {lb} DNS answered {dig:?}");
        let after = agent.stat(STAT_PROG_TC_INGRESS, STAT_DROP_SRC_RANGE)?;
        assert!(
            after > before,
            "{denied} → {lb}: drop counter stayed at {before}"
        );
        // inspect stats reports the same counter.
        assert!(
            agent.inspect_stat(STAT_PROG_TC_INGRESS, STAT_DROP_SRC_RANGE)? >= after,
            "inspect stats disagrees with the map"
        );
    }
    alive(&mut agent)
}
