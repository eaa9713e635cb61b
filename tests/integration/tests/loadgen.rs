//! The benchmark's load generator and server against each other, through the
//! harness's bridge, with no agent and no rules: each mode really moves
//! requests, the report adds up, and failures are counted rather than fatal.
//! Needs root.
use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    process::{Child, Output, Stdio},
};

use anyhow::{Context as _, Result, ensure};
use serde::Deserialize;
use weir_integration::{Topology, bin};

const TCP_PORT: u16 = 9080;
const UDP_PORT: u16 = 9053;

/// A `weir-benchsrv`, killed on drop so a failed assertion leaves no process.
struct Server(Child);

impl Server {
    fn start(topo: &Topology, i: usize) -> Result<Self> {
        let b = &topo.backends[i];
        let mut child = Server(
            b.ns.command(&bin("weir-benchsrv"))
                .args(["--name", &b.name, "--threads", "1"])
                .args([
                    "--tcp",
                    &TCP_PORT.to_string(),
                    "--udp",
                    &UDP_PORT.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .context("starting weir-benchsrv (cargo build -p weir-integration --bins)")?,
        );
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().context("server stdout")?).read_line(&mut line)?;
        ensure!(line.trim() == "ready", "weir-benchsrv said {line:?}");
        Ok(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)] // Read through Debug in assertion messages.
struct Report {
    mode: String,
    threads: u16,
    duration_s: f64,
    requests: u64,
    errors: BTreeMap<String, u64>,
    rate_per_s: f64,
    latency_us: Latency,
    client_cpu_s: f64,
    softirq_s: Option<f64>,
    backends: BTreeMap<String, u64>,
}

#[derive(Debug, Deserialize)]
struct Latency {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

/// Runs `weir-loadgen` in the node namespace for a 1 s window. The timeout is
/// long enough that a busy two-core machine does not turn slowness into errors,
/// unless the caller brings its own.
fn loadgen(topo: &Topology, args: &[&str]) -> Result<(Output, Option<Report>)> {
    let mut cmd = topo.node.command(&bin("weir-loadgen"));
    if !args.contains(&"--timeout-ms") {
        cmd.args(["--timeout-ms", "2000"]);
    }
    let out = cmd
        .args([
            "--threads",
            "2",
            "--duration-ms",
            "1000",
            "--warmup-ms",
            "200",
        ])
        .args(args)
        .output()
        .context("starting weir-loadgen")?;
    let report = serde_json::from_slice(&out.stdout).ok();
    Ok((out, report))
}

fn report(topo: &Topology, args: &[&str]) -> Result<Report> {
    let (out, report) = loadgen(topo, args)?;
    ensure!(out.status.success(), "weir-loadgen {args:?}: {out:?}");
    report.with_context(|| format!("weir-loadgen {args:?} printed no report: {out:?}"))
}

fn tcp(topo: &Topology, i: usize) -> String {
    format!("{}:{TCP_PORT}", topo.backends[i].ip)
}

fn udp(topo: &Topology, i: usize) -> String {
    format!("{}:{UDP_PORT}", topo.backends[i].ip)
}

fn assert_clean(r: &Report, what: &str) {
    assert!(r.requests > 0, "{what}: {r:?}");
    assert!(r.errors.is_empty(), "{what}: {r:?}");
    let l = &r.latency_us;
    assert!(
        0.0 < l.p50 && l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.max,
        "{what}: {r:?}"
    );
    // Even a loaded two-core machine answers most requests over a bridge in
    // well under 100 ms.
    assert!(l.p50 < 100_000.0, "{what}: {r:?}");
    assert!((r.duration_s - 1.0).abs() < 1e-9, "{what}: {r:?}");
    let rate = r.requests as f64 / r.duration_s;
    assert!(
        (r.rate_per_s - rate).abs() <= 0.05 + 1e-9 * rate,
        "{what}: {r:?}"
    );
    assert!(r.client_cpu_s > 0.0, "{what}: {r:?}");
    assert!(r.softirq_s.is_some_and(|s| s >= 0.0), "{what}: {r:?}");
}

#[test]
fn every_mode_moves_requests_without_errors_and_reports_consistently() -> Result<()> {
    let topo = Topology::new(1)?;
    let _srv = Server::start(&topo, 0)?;
    let (t, u) = (tcp(&topo, 0), udp(&topo, 0));
    // What the benchmark's client namespace gets, so `--close fin` at full rate
    // does not run out of ports (see `Close` in loadgen.rs).
    topo.node.sh(
        "sysctl -qw net.ipv4.tcp_tw_reuse=1 && sysctl -qw net.ipv4.ip_local_port_range='1024 65535'",
    )?;
    let runs: [(&str, &[&str]); 5] = [
        ("crr", &["--mode", "crr", "--target", &t]),
        (
            "crr fin",
            &["--mode", "crr", "--close", "fin", "--target", &t],
        ),
        ("rr", &["--mode", "rr", "--target", &t]),
        ("udp", &["--mode", "udp", "--target", &u]),
        (
            "udp connected",
            &["--mode", "udp", "--udp-connected", "--target", &u],
        ),
    ];
    let mut rates = BTreeMap::new();
    for (what, args) in runs {
        let r = report(&topo, args)?;
        assert_clean(&r, what);
        assert_eq!(r.threads, 2, "{what}: {r:?}");
        assert_eq!(r.mode, args[1], "{what}: {r:?}");
        assert_eq!(
            r.backends,
            BTreeMap::from([("be1".to_owned(), r.requests)]),
            "{what}"
        );
        rates.insert(what, r.rate_per_s);
    }
    // Keep-alive skips the handshake and teardown each crr request pays for.
    assert!(rates["rr"] > rates["crr"], "{rates:?}");
    Ok(())
}

#[test]
fn random_pick_spreads_over_servers_and_first_last_stick_to_one() -> Result<()> {
    let topo = Topology::new(2)?;
    let _servers = [Server::start(&topo, 0)?, Server::start(&topo, 1)?];
    let tcp_file = topo.dir.join("tcp-targets");
    let udp_file = topo.dir.join("udp-targets");
    std::fs::write(
        &tcp_file,
        format!("# two backends\n{}\n\n{}\n", tcp(&topo, 0), tcp(&topo, 1)),
    )?;
    std::fs::write(&udp_file, format!("{}\n{}\n", udp(&topo, 0), udp(&topo, 1)))?;
    let (tf, uf) = (
        tcp_file.to_str().context("path")?,
        udp_file.to_str().context("path")?,
    );

    for (mode, file, extra) in [
        ("crr", tf, None),
        ("udp", uf, None),
        ("udp", uf, Some("--udp-connected")),
    ] {
        let mut args = vec!["--mode", mode, "--targets", file, "--pick", "random"];
        args.extend(extra);
        let r = report(&topo, &args)?;
        assert_clean(&r, mode);
        // Uniform picks over thousands of requests: each side is near half.
        for name in ["be1", "be2"] {
            let got = r.backends.get(name).copied().unwrap_or(0) as f64;
            assert!(got > 0.4 * r.requests as f64, "{args:?}: {r:?}");
        }
        for (pick, only) in [("first", "be1"), ("last", "be2")] {
            let mut args = vec!["--mode", mode, "--targets", file, "--pick", pick];
            args.extend(extra);
            let r = report(&topo, &args)?;
            assert_clean(&r, mode);
            assert_eq!(r.backends.keys().collect::<Vec<_>>(), [only], "{args:?}");
        }
    }
    // rr picks per connection: with 2 workers both sides are likely but not
    // certain, so only require that every answer came from a listed server.
    let r = report(
        &topo,
        &["--mode", "rr", "--targets", tf, "--pick", "random"],
    )?;
    assert_clean(&r, "rr");
    assert!(r.backends.keys().all(|k| k == "be1" || k == "be2"), "{r:?}");
    Ok(())
}

#[test]
fn failures_are_counted_by_errno_and_bad_arguments_exit_nonzero() -> Result<()> {
    let topo = Topology::new(1)?;
    let _srv = Server::start(&topo, 0)?;
    let closed_tcp = format!("{}:9999", topo.backends[0].ip);
    let closed_udp = format!("{}:9998", topo.backends[0].ip);
    // The backend's ICMP rate limits (one port unreachable per second per
    // peer) would turn most refusals into timeouts; lift them in its namespace.
    topo.backends[0].ns.sh(
        "sysctl -qw net.ipv4.icmp_ratelimit=0 net.ipv4.icmp_msgs_per_sec=1000000 net.ipv4.icmp_msgs_burst=1000000",
    )?;

    let cases: [(&[&str], &str); 4] = [
        (&["--mode", "crr", "--target", &closed_tcp], "ECONNREFUSED"),
        (&["--mode", "rr", "--target", &closed_tcp], "ECONNREFUSED"),
        // An ICMP port unreachable reaches only a connected UDP socket.
        (
            &["--mode", "udp", "--udp-connected", "--target", &closed_udp],
            "ECONNREFUSED",
        ),
        // Nothing answers an unconnected socket: each request times out.
        (
            &[
                "--mode",
                "udp",
                "--timeout-ms",
                "100",
                "--target",
                &closed_udp,
            ],
            "timeout",
        ),
    ];
    for (args, errno) in cases {
        let r = report(&topo, args)?;
        assert_eq!(r.requests, 0, "{args:?}: {r:?}");
        assert!(
            r.errors.get(errno).is_some_and(|&n| n > 0),
            "{args:?}: {r:?}"
        );
        assert_eq!(r.errors.len(), 1, "{args:?}: {r:?}");
    }

    let empty = topo.dir.join("no-targets");
    std::fs::write(&empty, "# nothing\n")?;
    let garbage = topo.dir.join("bad-targets");
    std::fs::write(&garbage, "10.77.0.11\n")?;
    let bad: [&[&str]; 6] = [
        &["--mode", "tcp", "--target", "10.77.0.11:9080"],
        &["--mode", "crr"],
        &["--mode", "crr", "--target", "10.77.0.11"],
        &[
            "--mode",
            "crr",
            "--targets",
            empty.to_str().context("path")?,
        ],
        &[
            "--mode",
            "crr",
            "--targets",
            garbage.to_str().context("path")?,
        ],
        &[
            "--mode",
            "crr",
            "--target",
            "10.77.0.11:9080",
            "--threads",
            "0",
        ],
    ];
    for args in bad {
        let (out, report) = loadgen(&topo, args)?;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(report.is_none(), "{args:?}: {out:?}");
    }
    Ok(())
}
