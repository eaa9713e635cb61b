//! Endpoint changes under live traffic: a long TCP stream survives its
//! endpoint becoming terminating while new flows avoid it; new flows never
//! reach a removed backend; a tracked UDP flow leaves a removed backend;
//! conntrack lists the flows. Each stream's own backend is the one changed,
//! per family, so neither family's half can pass without being exercised.
use std::{
    io::{BufRead as _, BufReader, Read as _},
    net::IpAddr,
    process::{Child, Stdio},
};

use anyhow::{Context as _, Result, bail};
use weir_abi::{CT_DIR_FORWARD, PROTO_TCP};
use weir_integration::{
    packet_topology::{
        CLIENT4, CLIENT6, LPOD, NODE_EXT4, NODE_EXT6, Ns, PacketAgent, PacketTopology, Pod, RPOD,
        clients::target,
        manifests::{DNS_PORT, ECHO_PORT, Ep, HTTP_PORT, READY, Svc, TERMINATING},
    },
    topology::ChildGuard,
};

use crate::support::{
    UdpStream, alive, pod_of_dns, publish, publish_per_family, remove_each_streams_backend,
    serving, wait_backends, who,
};

pub const LB4: &str = "192.168.70.50";
pub const LB6: &str = "fd00:70::50";
pub const NP: u16 = 30380;
pub const NP_ECHO: u16 = 30653;
const NP_DNS: u16 = 30353;
const LINES: usize = 80;

pub fn svc() -> Svc {
    Svc::load_balancer(
        "churn",
        "10.96.4.10",
        "fd00:96::4:10",
        [NP, NP_ECHO, NP_DNS],
        &[LB4, LB6],
    )
}

/// The TCP frontends of [`svc`] in one family.
fn tcp_frontends(v6: bool) -> [(&'static str, u16); 2] {
    if v6 {
        [(NODE_EXT6, NP), (LB6, HTTP_PORT)]
    } else {
        [(NODE_EXT4, NP), (LB4, HTTP_PORT)]
    }
}

fn named(name: &str) -> Result<Pod> {
    Pod::named(name).with_context(|| format!("unknown backend {name:?}"))
}

/// Opens `n` new connections from outside to `ip:port` and checks that every
/// one reached `avoided`'s other pod, never `avoided` (`why`: "terminating"
/// or "removed", for the message).
fn new_flows_avoid(
    topo: &PacketTopology,
    ip: &str,
    port: u16,
    n: usize,
    avoided: Pod,
    why: &str,
) -> Result<()> {
    for i in 0..n {
        let (name, _) = who(topo, Ns::Client, ip, port)?;
        assert_eq!(
            name,
            avoided.other().name,
            "{ip}:{port} new flow {i} reached {why} {}",
            avoided.name
        );
    }
    Ok(())
}

/// A slow download: `LINES` lines, one every 100 ms, through `url`.
struct Stream {
    child: ChildGuard,
    out: BufReader<std::process::ChildStdout>,
    first: String,
}

impl Stream {
    fn start(topo: &PacketTopology, url: &str) -> Result<Self> {
        let mut child: Child = topo
            .command(Ns::Client, "curl")
            .args(["-sS", "-g", "--no-buffer", "--max-time", "30"])
            .arg(format!("http://{url}/stream?lines={LINES}&ms=100"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut out = BufReader::new(child.stdout.take().context("stdout")?);
        let child = ChildGuard(child);
        let mut first = String::new();
        out.read_line(&mut first)?;
        let first = first.split_whitespace().next().unwrap_or("").to_owned();
        if first.is_empty() {
            bail!("stream {url} sent nothing");
        }
        Ok(Self { child, out, first })
    }

    /// Waits for the end: every line must come from the first backend, in order.
    fn finish(mut self, url: &str) -> Result<()> {
        let mut rest = String::new();
        self.out.read_to_string(&mut rest)?;
        let status = self.child.0.wait()?;
        let mut err = String::new();
        if let Some(mut e) = self.child.0.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let lines: Vec<&str> = rest.lines().collect();
        let expected: Vec<String> = (1..LINES).map(|i| format!("{} {i}", self.first)).collect();
        if !status.success() || lines != expected {
            bail!(
                "stream {url} on {} broke ({status}, {err}): got {} of {} lines, last {:?}",
                self.first,
                lines.len() + 1,
                LINES,
                lines.last()
            );
        }
        Ok(())
    }
}

#[test]
fn streams_survive_terminating_and_new_flows_avoid_terminating_and_removed_backends() -> Result<()>
{
    let topo = PacketTopology::new()?;
    let svc = svc();
    let both = [Ep::of(LPOD, READY), Ep::of(RPOD, READY)];
    publish(&topo, &svc, &both)?;
    let mut agent = PacketAgent::start(&topo, &[])?;
    let (url4, url6) = (target(NODE_EXT4, NP), target(LB6, HTTP_PORT));
    serving(&topo, Ns::Client, NODE_EXT4, NP)?;

    let s4 = Stream::start(&topo, &url4)?;
    let s6 = Stream::start(&topo, &url6)?;
    // Per family: the backend that family's stream is on.
    let gone = [named(&s4.first)?, named(&s6.first)?];

    // Both flows are in conntrack, read from the maps and by `inspect conntrack`.
    let ct = agent.conntrack()?;
    for client in [CLIENT4, CLIENT6] {
        assert!(
            ct.iter().any(|(k, _)| k.proto == PROTO_TCP
                && k.dir == CT_DIR_FORWARD
                && IpAddr::from(k.saddr).to_string() == client),
            "no forward TCP entry from {client} in {} entries",
            ct.len()
        );
    }
    let listed = agent.inspect("conntrack")?;
    for (client, frontend) in [(CLIENT4.to_owned(), &url4), (format!("[{CLIENT6}]"), &url6)] {
        let found = listed.as_array().is_some_and(|a| {
            a.iter().any(|e| {
                e["direction"] == "forward"
                    && e["protocol"] == "TCP"
                    && e["dst"] == frontend.as_str()
                    && e["src"].as_str().is_some_and(|s| s.starts_with(&client))
                    && e["nat_dst"].as_str().is_some_and(|s| s.ends_with(":8080"))
            })
        });
        assert!(
            found,
            "inspect conntrack lists no {client} → {frontend} flow: {listed:#}"
        );
    }

    // Each stream's endpoint starts terminating (serving, not ready).
    let terminating = |g: Pod| [Ep::of(g, TERMINATING), Ep::of(g.other(), READY)];
    publish_per_family(&topo, &svc, &terminating(gone[0]), &terminating(gone[1]))?;
    for (v6, g) in [(false, gone[0]), (true, gone[1])] {
        for (ip, port) in tcp_frontends(v6) {
            wait_backends(
                &agent,
                ip,
                port,
                "TCP",
                &[(g.addr(v6), "terminating"), (g.other().addr(v6), "active")],
            )?;
        }
    }
    // New flows go to the other backend only.
    for (v6, g) in [(false, gone[0]), (true, gone[1])] {
        for (ip, port) in tcp_frontends(v6) {
            new_flows_avoid(&topo, ip, port, 15, g, "terminating")?;
        }
    }
    // ...while the streams that began before keep their backends to the end.
    s4.finish(&url4)?;
    s6.finish(&url6)?;

    // Both ready again, then each family's `gone` removed from its slice.
    publish(&topo, &svc, &both)?;
    for v6 in [false, true] {
        for (ip, port) in tcp_frontends(v6) {
            wait_backends(
                &agent,
                ip,
                port,
                "TCP",
                &[(LPOD.addr(v6), "active"), (RPOD.addr(v6), "active")],
            )?;
        }
    }
    publish_per_family(
        &topo,
        &svc,
        &[Ep::of(gone[0].other(), READY)],
        &[Ep::of(gone[1].other(), READY)],
    )?;
    for (v6, g) in [(false, gone[0]), (true, gone[1])] {
        for (ip, port) in tcp_frontends(v6) {
            wait_backends(&agent, ip, port, "TCP", &[(g.other().addr(v6), "active")])?;
            new_flows_avoid(&topo, ip, port, 30, g, "removed")?;
        }
    }
    for (ip, port, g) in [(NODE_EXT4, NP_DNS, gone[0]), (LB6, DNS_PORT, gone[1])] {
        for _ in 0..10 {
            let a = topo.dig(Ns::Client, ip, port, "A")?;
            assert_eq!(
                a.as_deref().and_then(|a| pod_of_dns(a, &[LPOD, RPOD])),
                Some(g.other().name),
                "{ip}:{port} DNS answered {a:?}"
            );
        }
    }
    alive(&mut agent)
}

#[test]
fn a_tracked_udp_flow_leaves_its_backend_when_the_backend_is_removed() -> Result<()> {
    let topo = PacketTopology::new()?;
    let svc = svc();
    publish(&topo, &svc, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &[])?;
    serving(&topo, Ns::Client, NODE_EXT4, NP)?;
    // One socket from outside, so one 5-tuple and one conntrack flow per
    // family, through the NodePort (v4) and the LB IP (v6).
    let flows = [(NODE_EXT4, NP_ECHO, false), (LB6, ECHO_PORT, true)];
    let mut streams = Vec::new();
    for (ip, port, _) in flows {
        streams.push(UdpStream::start(
            &topo,
            Ns::Client,
            false,
            &target(ip, port),
            8000,
            0,
        )?);
    }
    // The next packet of each flow finds its backend gone and picks afresh:
    // no error, and at most the one datagram already under way still
    // answered by the removed pod.
    remove_each_streams_backend(&topo, &agent, &svc, streams, flows, 1, 0)?;
    alive(&mut agent)
}
