//! Endpoint changes under live traffic: a long TCP stream survives its
//! endpoint becoming terminating while new flows avoid it; new flows never
//! reach a removed backend; conntrack lists the flows.
use std::{
    io::{BufRead as _, BufReader, Read as _},
    process::{Child, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use weir_abi::{CT_DIR_FORWARD, PROTO_TCP};
use weir_integration::{
    packet_topology::{
        CLIENT4, CLIENT6, LPOD, Ns, PacketAgent, PacketTopology, Pod, RPOD,
        agent::ip_of,
        clients::target,
        manifests::{DNS_PORT, ECHO_PORT, Ep, HTTP_PORT, READY, Svc, TERMINATING},
    },
    topology::ChildGuard as Killed,
};

use crate::support::{UdpStream, alive, pod_of_dns, poll, publish, who};

const LB4: &str = "192.168.70.50";
const LB6: &str = "fd00:70::50";
const NP: u16 = 30380;
const LINES: usize = 80;

fn svc() -> Svc {
    Svc::load_balancer(
        "churn",
        "10.96.4.10",
        "fd00:96::4:10",
        [NP, 30653, 30353],
        &[LB4, LB6],
    )
}

fn ep(pod: Pod, cond: weir_integration::packet_topology::manifests::Cond) -> Ep {
    if pod.name == "lpod" {
        Ep::local(pod, cond)
    } else {
        Ep::remote(pod, cond)
    }
}

fn pod(name: &str) -> Pod {
    if name == "lpod" { LPOD } else { RPOD }
}

/// A slow download: `LINES` lines, one every 100 ms, through `url`.
struct Stream {
    child: Killed,
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
        let child = Killed(child);
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
    publish(&topo, &svc, &[ep(LPOD, READY), ep(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &[])?;
    let (url4, url6) = (target("192.168.50.1", NP), target(LB6, HTTP_PORT));
    poll(Duration::from_secs(5), "first answer", || {
        Ok(topo
            .who_tcp(Ns::Client, "192.168.50.1", NP)?
            .who()
            .ok_or(()))
    })?;

    let s4 = Stream::start(&topo, &url4)?;
    let s6 = Stream::start(&topo, &url6)?;
    let gone = s4.first.clone();
    let other = if gone == "lpod" { "rpod" } else { "lpod" };

    // Both flows are in conntrack, read from the maps and by `inspect conntrack`.
    let ct = agent.conntrack()?;
    for client in [CLIENT4, CLIENT6] {
        assert!(
            ct.iter().any(|(k, _)| k.proto == PROTO_TCP
                && k.dir == CT_DIR_FORWARD
                && ip_of(&k.saddr).to_string() == client),
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

    // The stream's endpoint starts terminating (serving, not ready).
    publish(
        &topo,
        &svc,
        &[ep(pod(&gone), TERMINATING), ep(pod(other), READY)],
    )?;
    poll(
        Duration::from_secs(5),
        "terminating state in the maps",
        || {
            let s = agent.inspect("services")?.to_string();
            Ok(if s.contains("erminating") {
                Ok(())
            } else {
                Err(s)
            })
        },
    )?;
    // New flows, both families, go to the other backend only.
    for (ip, port) in [
        ("192.168.50.1", NP),
        (LB4, HTTP_PORT),
        ("fd00:50::1", NP),
        (LB6, HTTP_PORT),
    ] {
        for i in 0..15 {
            let (name, _) = who(&topo, Ns::Client, ip, port)?;
            assert_eq!(
                name, other,
                "{ip}:{port} new flow {i} went to terminating {gone}"
            );
        }
    }
    // ...while the streams that began before keep their backends to the end.
    s4.finish(&url4)?;
    s6.finish(&url6)?;

    // Both ready again, then `gone` removed from the slices altogether.
    publish(&topo, &svc, &[ep(LPOD, READY), ep(RPOD, READY)])?;
    poll(Duration::from_secs(5), "both backends active", || {
        let s = agent.inspect("services")?.to_string();
        Ok(if s.contains("erminating") {
            Err(s)
        } else {
            Ok(())
        })
    })?;
    publish(&topo, &svc, &[ep(pod(other), READY)])?;
    let gone_addr = pod(&gone).v4;
    poll(
        Duration::from_secs(5),
        "removed backend gone from the maps",
        || {
            let s = agent.inspect("services")?.to_string();
            Ok(if s.contains(gone_addr) {
                Err(s)
            } else {
                Ok(())
            })
        },
    )?;
    for (ip, port) in [
        ("192.168.50.1", NP),
        (LB4, HTTP_PORT),
        ("fd00:50::1", NP),
        (LB6, HTTP_PORT),
    ] {
        for i in 0..30 {
            let (name, _) = who(&topo, Ns::Client, ip, port)?;
            assert_eq!(
                name, other,
                "{ip}:{port} new flow {i} reached removed {gone}"
            );
        }
    }
    for ip in ["192.168.50.1", LB6] {
        let port = if ip == LB6 { DNS_PORT } else { 30353 };
        for _ in 0..10 {
            let a = topo.dig(Ns::Client, ip, port, "A")?;
            assert_eq!(
                a.as_deref().and_then(|a| pod_of_dns(a, &[LPOD, RPOD])),
                Some(other),
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
    publish(&topo, &svc, &[ep(LPOD, READY), ep(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &[])?;
    poll(Duration::from_secs(5), "first answer", || {
        Ok(topo
            .who_tcp(Ns::Client, "192.168.50.1", NP)?
            .who()
            .ok_or(()))
    })?;
    // One socket from outside, so one 5-tuple and one conntrack flow per
    // family, through the NodePort (v4) and the LB IP (v6).
    let streams = [
        UdpStream::start(
            &topo,
            Ns::Client,
            false,
            &target("192.168.50.1", 30653),
            6000,
        )?,
        UdpStream::start(&topo, Ns::Client, false, &target(LB6, ECHO_PORT), 6000)?,
    ];
    let gone = streams[0].first_backend()?;
    streams[1].first_backend()?;
    let other = if gone == "lpod" { RPOD } else { LPOD };
    publish(&topo, &svc, &[ep(other, READY)])?;
    let gone_addr = pod(&gone).v4;
    poll(
        Duration::from_secs(5),
        "removed backend gone from the maps",
        || {
            let s = agent.inspect("services")?.to_string();
            Ok(if s.contains(gone_addr) {
                Err(s)
            } else {
                Ok(())
            })
        },
    )?;
    // The next packet of each flow finds its backend gone and picks afresh.
    let cut: Vec<usize> = streams.iter().map(|s| s.seen().len() + 1).collect();
    for (s, cut) in streams.into_iter().zip(cut) {
        let p = s.finish()?;
        let seq = &p.sequence;
        if seq.len() <= cut + 10 {
            bail!("too few sends after the removal: {p:?}");
        }
        assert!(
            !seq[cut..].contains(&gone),
            "removed {gone} answered again: {seq:?}"
        );
        assert!(
            seq[seq.len() - 10..].iter().all(|x| x == other.name),
            "the flow did not move to {}: {seq:?}",
            other.name
        );
    }
    alive(&mut agent)
}

#[test]
fn the_collector_removes_expired_conntrack_entries() -> Result<()> {
    let topo = PacketTopology::new()?;
    let svc = svc();
    publish(&topo, &svc, &[ep(LPOD, READY), ep(RPOD, READY)])?;
    let mut agent = PacketAgent::start(
        &topo,
        &[
            "--ct-timeout-udp=2s",
            "--ct-timeout-tcp-fin=2s",
            "--ct-timeout-tcp-syn=2s",
            "--ct-gc-interval=1s",
        ],
    )?;
    poll(Duration::from_secs(5), "first answer", || {
        Ok(topo
            .who_tcp(Ns::Client, "192.168.50.1", NP)?
            .who()
            .ok_or(()))
    })?;
    who(&topo, Ns::Client, LB6, HTTP_PORT)?;
    assert!(topo.dig(Ns::Client, "192.168.50.1", 30353, "A")?.is_some());
    let from_client = |agent: &PacketAgent| -> Result<usize> {
        Ok(agent
            .conntrack()?
            .iter()
            .filter(|(k, v)| {
                let (s, d) = (ip_of(&k.saddr).to_string(), ip_of(&v.nat_daddr).to_string());
                [CLIENT4, CLIENT6].iter().any(|c| s == *c || d == *c)
            })
            .count())
    };
    // A forward and a reply entry for each of the three flows.
    let n = from_client(&agent)?;
    assert!(
        n >= 6,
        "expected 6 entries of the client's flows, found {n}"
    );
    // Closed TCP flows and quiet UDP flows expire after 2 s and are collected.
    poll(Duration::from_secs(10), "expired entries collected", || {
        let n = from_client(&agent)?;
        Ok(if n == 0 { Ok(()) } else { Err(n) })
    })?;
    alive(&mut agent)
}
