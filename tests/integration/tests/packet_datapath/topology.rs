//! The topology alone, without the agent: routing, servers and cleanup.
use anyhow::Result;

use crate::support;
use weir_integration::packet_topology::{
    CLIENT4, CLIENT6, LPOD, NODE_EXT4, NODE_EXT6, Ns, POD_DNS_PORT, POD_TCP_PORT, POD_UDP_PORT,
    PacketTopology, RPOD,
};

#[test]
fn topology_routes_every_path_without_the_agent() -> Result<()> {
    let topo = PacketTopology::new()?;
    let names: Vec<String> = topo.all_names();
    for ip in [NODE_EXT4, NODE_EXT6] {
        assert!(topo.ping(Ns::Client, ip), "client cannot ping {ip}");
    }
    for pod in [LPOD, RPOD] {
        for v6 in [false, true] {
            let ip = pod.addr(v6);
            assert!(topo.ping(Ns::Node, ip), "node cannot ping {ip}");
            assert!(topo.ping(Ns::Client, ip), "client cannot ping {ip}");
            // Straight to the pod: routed, not translated, so the pod sees the
            // client's own address.
            let c = topo.who_tcp(Ns::Client, ip, POD_TCP_PORT)?;
            let client = if v6 { CLIENT6 } else { CLIENT4 };
            assert_eq!(
                c.who(),
                Some((pod.name.to_owned(), client.to_owned())),
                "curl {ip}: {c:?}"
            );
            assert_eq!(
                topo.who_udp(Ns::Client, ip, POD_UDP_PORT)?,
                Some((pod.name.to_owned(), client.to_owned()))
            );
            assert_eq!(
                topo.dig(Ns::Client, ip, POD_DNS_PORT, "A")?.as_deref(),
                Some(pod.v4)
            );
            assert_eq!(
                topo.dig(Ns::Client, ip, POD_DNS_PORT, "AAAA")?.as_deref(),
                Some(pod.v6)
            );
        }
    }
    // A slow stream and a UDP stream work over the plain routes.
    let s = topo.curl(
        Ns::Client,
        &format!("{}:{POD_TCP_PORT}/stream?lines=5&ms=20", LPOD.v4),
        Default::default(),
    )?;
    assert!(s.ok(), "{s:?}");
    assert_eq!(s.body.lines().count(), 5, "{s:?}");
    let p = topo.probe(
        Ns::Node,
        true,
        "udp-stream",
        &format!("[{}]:{POD_UDP_PORT}", RPOD.v6),
        0,
        &["--duration-ms", "500", "--interval-ms", "50"],
    )?;
    assert!(p.ok >= 5 && p.backends.keys().eq(["rpod"]), "{p:?}");

    let cgroup = topo.cgroup.path.clone();
    let pin = topo.bpffs.dir.clone();
    let dir = topo.dir.clone();
    drop(topo);
    let left = support::leftovers(&names, &cgroup, &pin, &dir);
    assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}
