//! Conntrack hardening (issue 12, items 15-17), IPv4: forged packets can
//! neither evict established flows (only a SYN makes a TCP flow) nor close
//! or remove them from a pod or from the backend's side (a reply must come
//! in on the backend's device, and a reply RST must carry the exact
//! sequence number), and a SNAT port is found as long as one is free.
//!
//! Established flows are `weir-flowtool hold` connections to
//! `weir-testsrv`'s `/hold`: idle, each checked by sending a line through it
//! that must come back from the backend it started on. The forged packets
//! come from `weir-flowtool spoof` (a raw socket) in the test's own
//! namespaces, bounded in count and time.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::IpAddr,
    process::{ChildStdin, ChildStdout, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;
use weir_abi::{
    CT_DIR_REPLY, CT_TCP_ESTABLISHED, CtKey, CtValue, PROTO_TCP, STAT_DROP_CT_INVALID,
    STAT_DROP_SNAT_PORTS, STAT_PROG_TC_INGRESS, STAT_PROG_XDP, STAT_REPLY_IGNORED,
};
use weir_integration::{
    bin,
    packet_topology::{
        LPOD, NODE_EXT4, NODE_LINK4, Ns, POD_TCP_PORT, PacketAgent, PacketTopology, RPOD,
        agent::METRICS_ADDR,
        manifests::{Ep, READY, Svc},
    },
    topology::ChildGuard,
};

use crate::support::{SETTLE, alive, poll, publish, serving};

/// `weir-flowtool hold`: connections kept open, driven over stdin/stdout.
struct Holder {
    _child: ChildGuard,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Holder {
    /// Opens `count` connections to `NODE_EXT4:port` from the client;
    /// returns the report of that first batch.
    fn start(topo: &PacketTopology, port: u16, count: usize) -> Result<(Self, Value)> {
        let mut child = topo
            .command(Ns::Client, bin("weir-flowtool"))
            .args([
                "hold",
                "--target",
                &format!("{NODE_EXT4}:{port}"),
                "--count",
                &count.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("weir-flowtool")?;
        let stdin = child.stdin.take().context("stdin")?;
        let out = BufReader::new(child.stdout.take().context("stdout")?);
        let mut h = Self {
            _child: ChildGuard(child),
            stdin,
            out,
        };
        let first = h.read()?;
        Ok((h, first))
    }

    fn read(&mut self) -> Result<Value> {
        let mut line = String::new();
        self.out.read_line(&mut line)?;
        serde_json::from_str(&line).with_context(|| format!("weir-flowtool printed {line:?}"))
    }

    fn cmd(&mut self, c: &str) -> Result<Value> {
        writeln!(self.stdin, "{c}")?;
        self.stdin.flush()?;
        self.read()
    }
}

/// Runs `weir-flowtool spoof` in `ns` with `args` and returns its report.
fn spoof(topo: &PacketTopology, ns: Ns, args: &[&str]) -> Result<Value> {
    let out = topo
        .command(ns, bin("weir-flowtool"))
        .arg("spoof")
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "weir-flowtool spoof {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The reply entries of TCP flows SNATed to the node's address towards
/// `rpod` (`rpod:8080 → NODE_LINK4:port`).
fn snat_replies(agent: &PacketAgent) -> Result<Vec<(CtKey, CtValue)>> {
    let rpod: IpAddr = RPOD.v4.parse()?;
    let node: IpAddr = NODE_LINK4.parse()?;
    Ok(agent
        .conntrack()?
        .into_iter()
        .filter(|(k, _)| {
            k.dir == CT_DIR_REPLY
                && k.proto == PROTO_TCP
                && IpAddr::from(k.saddr) == rpod
                && u16::from_be(k.sport) == POD_TCP_PORT
                && IpAddr::from(k.daddr) == node
        })
        .collect())
}

fn tc_stat(agent: &PacketAgent, reason: u32) -> Result<u64> {
    agent.stat(STAT_PROG_TC_INGRESS, reason)
}

fn ensure_all_answer(r: &Value, n: u64, what: &str) -> Result<()> {
    ensure!(
        r["ok"] == n && r["moved"] == 0 && r["errors"].as_object().is_some_and(|e| e.is_empty()),
        "{what}: of {n} established flows, not all answered from their own backend: {r}"
    );
    Ok(())
}

/// Item 15. Before: each forged ACK made a flow of two LRU entries (with a
/// SNAT port), the table overflowed and evicted the idle established flows,
/// whose next packets made new flows (another SNAT port, maybe another
/// backend) and met an RST. After: only a SYN makes a TCP flow; the ACKs
/// are dropped and counted as `drop-ct-invalid`.
#[test]
fn a_forged_ack_flood_does_not_evict_established_flows() -> Result<()> {
    ack_flood(&[], STAT_PROG_TC_INGRESS)
}

/// Item 15 with native XDP on the devices: the forged ACKs are dropped by
/// `weir_xdp` already, before an skb exists.
#[test]
fn a_forged_ack_flood_at_xdp_does_not_evict_established_flows() -> Result<()> {
    ack_flood(&["--acceleration=native"], STAT_PROG_XDP)
}

/// Holds 1,000 flows, sends 500,000 forged ACKs, checks every flow, and
/// that program `prog` counted the ACKs as `drop-ct-invalid`.
fn ack_flood(extra: &[&str], prog: u32) -> Result<()> {
    const NP: u16 = 30410;
    const FLOWS: u64 = 1_000;
    const FLOOD: u64 = 500_000;
    let topo = PacketTopology::new()?;
    let svc = Svc::node_port("flood", "10.96.15.10", "fd00:96::15:10", [NP, 30411, 30412]);
    publish(
        &topo,
        &svc,
        &[Ep::local(LPOD, READY), Ep::remote(RPOD, READY)],
    )?;
    // A table of 8Ki entries holds the 1,000 flows (2,000 entries) with room
    // to spare, while the flows the flood made before the fix (one per
    // forged tuple until each backend's 4,536 SNAT ports were taken) overflow
    // it. The fix makes no entry at all, whatever the size.
    let mut args = vec!["--ct-max=8192"];
    args.extend_from_slice(extra);
    let mut agent = PacketAgent::start(&topo, &args)?;
    serving(&topo, Ns::Client, NODE_EXT4, NP)?;

    let (mut flows, opened) = Holder::start(&topo, NP, FLOWS as usize)?;
    ensure!(opened["opened"] == FLOWS, "opening {FLOWS} flows: {opened}");
    ensure_all_answer(&flows.cmd("check")?, FLOWS, "before the flood")?;

    // Forged ACKs from random hosts and ports of the client's subnet, all
    // to the NodePort; the client namespace routes them to the node only.
    let sent = spoof(
        &topo,
        Ns::Client,
        &[
            "--src-net",
            "192.168.50.0",
            "--dst",
            NODE_EXT4,
            "--dport",
            &NP.to_string(),
            "--flags",
            "ack",
            "--count",
            &FLOOD.to_string(),
            "--max-secs",
            "120",
        ],
    )?;
    ensure!(sent["sent"] == FLOOD, "the flood: {sent}");
    alive(&mut agent)?;

    ensure_all_answer(&flows.cmd("check")?, FLOWS, "after the flood")?;
    let invalid = agent.stat(prog, STAT_DROP_CT_INVALID)?;
    ensure!(
        invalid >= FLOOD,
        "{FLOOD} forged ACKs sent, {invalid} counted as drop-ct-invalid by {}",
        weir_abi::STAT_PROG_NAMES[prog as usize]
    );
    let fwd_left = agent
        .conntrack()?
        .iter()
        .filter(|(k, _)| k.proto == PROTO_TCP)
        .count() as u64;
    ensure!(
        fwd_left <= 2 * FLOWS + 20,
        "the flood left entries behind: {fwd_left} TCP entries for {FLOWS} flows"
    );
    Ok(())
}

/// Item 16. Before: a pod sending `rpod:8080 → node:61000-65535` RSTs
/// closed other clients' SNAT flows (removed two seconds later, with
/// `--ct-timeout-tcp-fin=2s`) and SYNs removed them at once, and so did
/// anyone sending them over the backend's own link. After: from the pod's
/// veth they are not replies at all; over the backend's link a SYN on an
/// established flow and an RST without the exact sequence number are
/// translated to the client (who ignores them or answers with a challenge
/// ACK) without changing the flow (`reply-ignored`).
#[test]
fn forged_replies_neither_close_nor_remove_snat_flows() -> Result<()> {
    const NP: u16 = 30420;
    const FLOWS: u64 = 50;
    let topo = PacketTopology::new()?;
    let svc = Svc::node_port("spoof", "10.96.16.10", "fd00:96::16:10", [NP, 30421, 30422]);
    // The remote pod only: every flow is SNATed to NODE_LINK4, and its
    // replies come in over wnode2.
    publish(&topo, &svc, &[Ep::remote(RPOD, READY)])?;
    let mut agent = PacketAgent::start(&topo, &["--ct-timeout-tcp-fin=2s", "--ct-gc-interval=1s"])?;
    serving(&topo, Ns::Client, NODE_EXT4, NP)?;
    let (mut flows, opened) = Holder::start(&topo, NP, FLOWS as usize)?;
    ensure!(opened["opened"] == FLOWS, "opening {FLOWS} flows: {opened}");
    // The held flows; `serving`'s closed connection may still be listed.
    let before: Vec<_> = snat_replies(&agent)?
        .into_iter()
        .filter(|(_, v)| v.tcp_state == CT_TCP_ESTABLISHED)
        .collect();
    ensure!(
        before.len() as u64 == FLOWS,
        "expected {FLOWS} established SNAT flows to rpod, conntrack has {}",
        before.len()
    );

    let src = format!("{}:{POD_TCP_PORT}", RPOD.v4);
    // Every port of the default SNAT range, so every flow gets each forged
    // packet once: from the local pod (its veth, wpod), then from the
    // second node (the backend's own link, wnode2).
    for ns in [Ns::Lpod, Ns::Node2] {
        for flags in ["rst", "rst,ack", "syn", "syn,ack"] {
            let sent = spoof(
                &topo,
                ns,
                &[
                    "--src",
                    &src,
                    "--dst",
                    NODE_LINK4,
                    "--dport",
                    "61000-65535",
                    "--flags",
                    flags,
                    "--count",
                    "4536",
                ],
            )?;
            ensure!(sent["sent"] == 4536, "forged {flags} from {ns:?}: {sent}");
        }
        alive(&mut agent)?;
        let after = snat_replies(&agent)?;
        let mut hit = Vec::new();
        for (k, _) in &before {
            let state = after.iter().find(|(a, _)| a == k).map(|(_, v)| v.tcp_state);
            if state != Some(CT_TCP_ESTABLISHED) {
                hit.push((u16::from_be(k.dport), state));
            }
        }
        ensure!(
            hit.is_empty(),
            "after the forged RSTs and SYNs from {ns:?}, {} of {FLOWS} flows were closed or \
             removed (SNAT port, state now; None: removed): {hit:?}",
            hit.len()
        );
    }
    // Past the closing timeout and a collector run: a closed flow would be
    // gone by now.
    std::thread::sleep(Duration::from_secs(4));
    ensure_all_answer(&flows.cmd("check")?, FLOWS, "after the forged replies")?;

    let ignored = tc_stat(&agent, STAT_REPLY_IGNORED)?;
    ensure!(
        ignored >= 4 * FLOWS,
        "per flow two SYNs and two RSTs over wnode2 should count as reply-ignored: {ignored}"
    );
    Ok(())
}

/// Item 17. With a 100-port SNAT range, 90 held flows to one backend, then
/// ten rounds of nine more connections (90% to 99% of the range) that
/// close again. Before: eight random tries, so a new flow found no port
/// with probability 0.9^8 = 43% at 90% use, and more above: SYNs dropped
/// (`drop-snat-ports`), connections a retransmission (1 s) late. After:
/// every connection opens at its first SYN and nothing is dropped until
/// the range is really full, which is then counted in `inspect stats` and
/// in the `weir_datapath_packets_total` metric.
#[test]
fn snat_ports_are_found_while_any_is_free() -> Result<()> {
    const NP: u16 = 30430;
    let topo = PacketTopology::new()?;
    let svc = Svc::node_port("ports", "10.96.17.10", "fd00:96::17:10", [NP, 30431, 30432]);
    publish(&topo, &svc, &[Ep::remote(RPOD, READY)])?;
    let agent = PacketAgent::start(
        &topo,
        &[
            "--snat-port-range=61000-61099",
            "--ct-timeout-tcp-fin=1s",
            "--ct-gc-interval=1s",
        ],
    )?;
    serving(&topo, Ns::Client, NODE_EXT4, NP)?;
    // `serving`'s connections hold ports until the collector removes them.
    let settled = |n: usize| {
        poll(SETTLE, &format!("{n} SNAT flows"), || {
            let got = snat_replies(&agent)?.len();
            Ok(if got == n { Ok(()) } else { Err(got) })
        })
    };
    settled(0)?;
    let (mut flows, opened) = Holder::start(&topo, NP, 90)?;
    ensure!(opened["opened"] == 90, "opening 90 flows: {opened}");
    settled(90)?;
    let dropped = tc_stat(&agent, STAT_DROP_SNAT_PORTS)?;

    for round in 0..10 {
        let r = flows.cmd("open 9")?;
        ensure!(
            r["opened"] == 9 && r["failed"] == 0 && r["slow"] == 0,
            "round {round}: 9 new connections at 90-99% SNAT port use: {r}; drop-snat-ports {}",
            tc_stat(&agent, STAT_DROP_SNAT_PORTS)? - dropped
        );
        flows.cmd("close 9")?;
        settled(90)?;
    }
    let now = tc_stat(&agent, STAT_DROP_SNAT_PORTS)?;
    ensure!(
        now == dropped,
        "{} SYNs dropped for want of a SNAT port while some were free",
        now - dropped
    );
    ensure_all_answer(&flows.cmd("check")?, 90, "the held flows")?;

    // Exhaustion: 100 ports, 101 connections. The last one cannot open
    // (its SYNs are dropped until it gives up), and that is counted.
    let r = flows.cmd("open 11")?;
    ensure!(
        r["opened"] == 10 && r["failed"] == 1,
        "101 connections on 100 ports: {r}"
    );
    let exhausted = tc_stat(&agent, STAT_DROP_SNAT_PORTS)? - now;
    ensure!(exhausted > 0, "exhaustion was not counted");
    let views = agent.inspect("stats")?;
    ensure!(
        views
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["program"] == "tc-ingress"
                && v["reason"] == "drop-snat-ports"
                && v["packets"].as_u64().unwrap_or(0) > 0),
        "inspect stats shows no drop-snat-ports: {views}"
    );
    poll(SETTLE, "drop-snat-ports in the metrics", || {
        let (_, body) = agent.node_get(METRICS_ADDR, "/metrics")?;
        let line = body
            .lines()
            .find(|l| {
                l.starts_with("weir_datapath_packets_total{")
                    && l.contains("program=\"tc-ingress\"")
                    && l.contains("reason=\"drop-snat-ports\"")
            })
            .map(str::to_owned);
        Ok(match &line {
            Some(l)
                if l.rsplit(' ')
                    .next()
                    .and_then(|n| n.parse::<f64>().ok())
                    .is_some_and(|n| n > 0.0) =>
            {
                Ok(())
            }
            _ => Err(line),
        })
    })?;
    Ok(())
}
