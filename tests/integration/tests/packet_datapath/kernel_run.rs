//! The packet programs in the kernel without traffic: `BPF_PROG_TEST_RUN`
//! of the agent's own `weir_tc_ingress` and `weir_xdp` on crafted frames,
//! over the maps its reconciler wrote from the manifests. Verdicts and
//! rewritten frames are exact, and every emitted checksum is verified
//! (`weir_integration::prog_run::decode`): no timing, no sockets, no
//! retries, so a failure here is the program's.
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context as _, Result, ensure};
use weir_integration::{
    packet_topology::{
        CLIENT4, CLIENT4_B, CLIENT6, LPOD, NODE_EXT4, NODE_EXT6, NODE_LINK4, NODE_POD4, NODE_POD6,
        PacketAgent, PacketTopology, RPOD,
        manifests::{Ep, READY, Svc},
    },
    prog_run::{
        Macs, Outcome, Packet, Programs, TC_NEXT, TC_REDIRECT, TC_SHOT, Tcp, XDP_DROP, XDP_PASS,
        echo_frame, mac_of, tcp_frame, udp_frame,
    },
    topology::in_netns,
};

use crate::support::publish;

/// Frontends, one Service each (LB IPs on the client's side of the node).
const LB_LOCAL: &str = "192.168.70.60"; // eTP=Cluster, lpod only
const LB_REMOTE: &str = "192.168.70.61"; // eTP=Cluster, rpod only
const LB_KEEP: &str = "192.168.70.62"; // eTP=Local, lpod only
const LB_NONE: &str = "192.168.70.63"; // eTP=Local, rpod only
const LB_RANGES: &str = "192.168.70.64"; // source range CLIENT4_B/32
const LB_AFFINITY: &str = "192.168.70.65"; // ClientIP affinity, both pods
const NODE_PORT: u16 = 30600;
/// `weir_xdp` hands a translated packet to TC with this word in front.
const XDP_MARK: u32 = 0x5745_4952;
/// The agent's default `--snat-port-range`.
const SNAT_PORTS: std::ops::RangeInclusive<u16> = 61_000..=65_535;

fn lb(name: &str, ip: &'static str, ports: u16) -> Svc {
    let last = ip.rsplit('.').next().unwrap_or("0");
    let v6 = format!("fd00:70::{last}");
    let mut s = Svc::load_balancer(
        name,
        &format!("10.96.6.{last}"),
        &format!("fd00:96::6:{last}"),
        [ports, ports + 1, ports + 2],
        &[ip],
    );
    s.lb_ingress.push(v6);
    s
}

fn sa(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().expect("an address"), port)
}

/// The node's programs on `wext` (client side) and `wpod` (local pod side),
/// with the agent that attached them.
/// Fields drop in order: the agent first, which holds its lock file in the
/// topology's bpffs; unmounting that under a live agent fails ("target is
/// busy") and leaves the mount behind.
struct Fixture {
    agent: PacketAgent,
    topo: PacketTopology,
}

impl Fixture {
    fn new() -> Result<Self> {
        let topo = PacketTopology::new()?;
        let local = [Ep::local(LPOD, READY)];
        let remote = [Ep::remote(RPOD, READY)];
        publish(&topo, &lb("run-local", LB_LOCAL, NODE_PORT), &local)?;
        publish(&topo, &lb("run-remote", LB_REMOTE, 30610), &remote)?;
        let mut keep = lb("run-keep", LB_KEEP, 30620);
        keep.etp_local = true;
        keep.health_check_node_port = Some(30629);
        publish(&topo, &keep, &local)?;
        let mut none = lb("run-none", LB_NONE, 30630);
        none.etp_local = true;
        none.health_check_node_port = Some(30639);
        publish(&topo, &none, &remote)?;
        let mut ranges = lb("run-ranges", LB_RANGES, 30640);
        ranges.source_ranges = vec![format!("{CLIENT4_B}/32")];
        publish(&topo, &ranges, &local)?;
        let mut aff = lb("run-affinity", LB_AFFINITY, 30650);
        aff.affinity_timeout = Some(600);
        publish(&topo, &aff, &[local[0], remote[0]])?;
        let agent = PacketAgent::start(&topo, &["--acceleration=native"])?;
        Ok(Self { topo, agent })
    }

    /// Runs `f` in the node's namespace with the programs of `wext` and
    /// `wpod` and the frames' MAC addresses.
    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Node) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let scratch = &self.topo.bpffs.dir;
        let wext = Programs::of_device(self.agent.pin_dir(), "wext", scratch)?;
        let wpod = Programs::of_device(self.agent.pin_dir(), "wpod", scratch)?;
        let node = self.topo.node.path();
        let from_client = Macs {
            src: mac_of(&self.topo.client.path(), "eth0")?,
            dst: mac_of(&node, "wext")?,
        };
        let from_lpod = Macs {
            src: mac_of(&self.topo.lpod.path(), "eth0")?,
            dst: mac_of(&node, "wpod")?,
        };
        in_netns(&node, move || {
            let index = |dev: &str| -> Result<u32> {
                let name = std::ffi::CString::new(dev)?;
                // SAFETY: a valid C string; returns 0 when there is no such device.
                let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
                ensure!(i != 0, "no device {dev} in the node");
                Ok(i)
            };
            f(&Node {
                wext,
                wpod,
                wext_index: index("wext")?,
                wpod_index: index("wpod")?,
                from_client,
                from_lpod,
            })
        })
    }
}

struct Node {
    wext: Programs,
    wpod: Programs,
    wext_index: u32,
    wpod_index: u32,
    from_client: Macs,
    from_lpod: Macs,
}

impl Node {
    /// A SYN from the client through TC on wext.
    fn syn(&self, from: SocketAddr, to: SocketAddr) -> Result<Outcome> {
        self.wext.tc(self.wext_index, &self.syn_frame(from, to)?)
    }

    /// A SYN from the client, sequence 1000.
    fn syn_frame(&self, from: SocketAddr, to: SocketAddr) -> Result<Vec<u8>> {
        tcp_frame(self.from_client, from, to, Tcp::Syn { seq: 1000 })
    }
}

/// The verdict is `want` and the frame left is `frame`'s headers with a
/// valid checksum everywhere.
fn expect(o: &Outcome, want: i32) -> Result<Packet> {
    ensure!(
        o.verdict == want,
        "verdict {} (want {want}): {o:?}",
        o.verdict
    );
    o.packet()
}

#[test]
fn tc_translates_new_flows_and_their_replies_exactly() -> Result<()> {
    let fx = Fixture::new()?;
    fx.run(|n| {
        // DNAT of a new flow, SNAT for eTP=Cluster: to the local pod, from
        // the node's address towards it, on a port of the SNAT range.
        let client = sa(CLIENT4, 40_001);
        let out = expect(&n.syn(client, sa(LB_LOCAL, 80))?, TC_REDIRECT)?;
        assert_eq!(out.dst, sa(LPOD.v4, 8080));
        assert_eq!(out.src.ip(), NODE_POD4.parse::<IpAddr>()?);
        assert!(SNAT_PORTS.contains(&out.src.port()), "{out:?}");

        // Rev-NAT of the pod's SYN-ACK, arriving on wpod: back to the
        // client, from the frontend.
        let reply = tcp_frame(
            n.from_lpod,
            out.dst,
            out.src,
            Tcp::SynAck {
                seq: 5000,
                ack: 1001,
            },
        )?;
        let back = expect(&n.wpod.tc(n.wpod_index, &reply)?, TC_REDIRECT)?;
        assert_eq!((back.src, back.dst), (sa(LB_LOCAL, 80), client));

        // SNAT towards the other node: the source is the node's address on
        // that link, and the reply from there is translated back.
        let client = sa(CLIENT4, 40_002);
        let out = expect(&n.syn(client, sa(LB_REMOTE, 80))?, TC_REDIRECT)?;
        assert_eq!(out.dst, sa(RPOD.v4, 8080));
        assert_eq!(out.src.ip(), NODE_LINK4.parse::<IpAddr>()?);

        // UDP, same rule.
        let dgram = udp_frame(n.from_client, sa(CLIENT4, 40_003), sa(LB_LOCAL, 5353), b"q")?;
        let out = expect(&n.wext.tc(n.wext_index, &dgram)?, TC_REDIRECT)?;
        assert_eq!((out.dst, out.proto), (sa(LPOD.v4, 5353), 17));
        assert_eq!(out.src.ip(), NODE_POD4.parse::<IpAddr>()?);

        // A v6 NodePort, SNATed to the node's v6 address towards the pod.
        let client6 = sa(CLIENT6, 40_004);
        let out = expect(&n.syn(client6, sa(NODE_EXT6, NODE_PORT))?, TC_REDIRECT)?;
        assert_eq!(out.dst, sa(LPOD.v6, 8080));
        assert_eq!(out.src.ip(), NODE_POD6.parse::<IpAddr>()?);

        // eTP=Local with a local endpoint: DNAT only, the client's source
        // kept, and the kernel routes it (no redirect).
        let client = sa(CLIENT4, 40_005);
        let out = expect(&n.syn(client, sa(LB_KEEP, 80))?, TC_NEXT)?;
        assert_eq!((out.src, out.dst), (client, sa(LPOD.v4, 8080)));
        Ok(())
    })
}

#[test]
fn tc_drops_what_a_service_refuses_and_passes_what_is_not_one() -> Result<()> {
    let fx = Fixture::new()?;
    fx.run(|n| {
        // eTP=Local without a local endpoint.
        let o = n.syn(sa(CLIENT4, 41_001), sa(LB_NONE, 80))?;
        ensure!(o.verdict == TC_SHOT, "eTP=Local, no local endpoint: {o:?}");

        // A source range admits CLIENT4_B only.
        let o = n.syn(sa(CLIENT4, 41_002), sa(LB_RANGES, 80))?;
        ensure!(o.verdict == TC_SHOT, "outside the source ranges: {o:?}");
        let out = expect(
            &n.syn(sa(CLIENT4_B, 41_003), sa(LB_RANGES, 80))?,
            TC_REDIRECT,
        )?;
        assert_eq!(out.dst, sa(LPOD.v4, 8080));

        // Not a Service: the node's own address on another port, an ICMP
        // echo, v6 UDP. Passed on, not a byte changed.
        let to_node = [
            n.syn_frame(sa(CLIENT4, 41_004), sa(NODE_EXT4, 22))?,
            echo_frame(n.from_client, CLIENT4.parse()?, NODE_EXT4.parse()?)?,
            echo_frame(n.from_client, CLIENT6.parse()?, NODE_EXT6.parse()?)?,
            udp_frame(n.from_client, sa(CLIENT6, 41_005), sa(NODE_EXT6, 9), b"x")?,
        ];
        for f in &to_node {
            let o = n.wext.tc(n.wext_index, f)?;
            assert_eq!(o.verdict, TC_NEXT, "{:?}", o.packet());
            assert_eq!(&o.frame, f, "an untranslated frame changed");
        }
        Ok(())
    })
}

#[test]
fn tc_affinity_keeps_a_client_on_one_backend() -> Result<()> {
    let fx = Fixture::new()?;
    fx.run(|n| {
        let mut backends = std::collections::BTreeSet::new();
        for port in 42_000..42_012 {
            let out = expect(&n.syn(sa(CLIENT4, port), sa(LB_AFFINITY, 80))?, TC_REDIRECT)?;
            backends.insert(out.dst);
        }
        // Twelve flows of two backends at random would all agree one time
        // in 2,048.
        assert_eq!(backends.len(), 1, "{backends:?}");
        let pods = [sa(LPOD.v4, 8080), sa(RPOD.v4, 8080)];
        assert!(backends.iter().all(|b| pods.contains(b)), "{backends:?}");
        Ok(())
    })
}

#[test]
fn xdp_translates_for_tc_drops_and_passes() -> Result<()> {
    let fx = Fixture::new()?;
    fx.run(|n| {
        // A new flow: translated, and handed to TC (which redirects it)
        // with the mark in the metadata.
        let f = n.syn_frame(sa(CLIENT4, 43_001), sa(LB_LOCAL, 80))?;
        let o = n.wext.xdp(n.wext_index, &f)?;
        if crate::support::xdp_meta() {
            let out = expect(&o, XDP_PASS)?;
            assert_eq!(out.dst, sa(LPOD.v4, 8080));
            assert_eq!(out.src.ip(), NODE_POD4.parse::<IpAddr>()?);
            let mark = o.meta.get(..4).context("no metadata")?;
            assert_eq!(u32::from_ne_bytes(mark.try_into()?), XDP_MARK);
        } else {
            // No metadata to mark it with: passed as it came, for TC to
            // translate.
            assert_eq!((o.verdict, &o.frame, o.meta.len()), (XDP_PASS, &f, 0));
        }

        // Refused by the source ranges: dropped before the stack sees it.
        let f = n.syn_frame(sa(CLIENT4, 43_002), sa(LB_RANGES, 80))?;
        assert_eq!(n.wext.xdp(n.wext_index, &f)?.verdict, XDP_DROP);

        // Not a Service: passed unchanged, without metadata.
        let f = echo_frame(n.from_client, CLIENT4.parse()?, NODE_EXT4.parse()?)?;
        let o = n.wext.xdp(n.wext_index, &f)?;
        assert_eq!((o.verdict, &o.frame, o.meta.len()), (XDP_PASS, &f, 0));
        Ok(())
    })
}
