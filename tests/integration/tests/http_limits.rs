//! The agent's HTTP servers under idle connections from a pod (issue 12, item
//! 13). Needs root.
//!
//! ```text
//!  wt-<id>-n (node): weir-agent, /healthz on 0.0.0.0:10256, RLIMIT_NOFILE 1024
//!    br0 10.77.0.1 ── vb1 ── wt-<id>-p (pod) 10.77.0.11: 2,000 idle connections, curl
//! ```
//! The agent runs with 1,024 descriptors, soft and hard: a containerd started
//! by systemd without `LimitNOFILE` (containerd 2.x) passes a soft limit of
//! 1,024 to its containers, and with the hard limit there too the agent
//! cannot raise it. A pod that opens more connections than that must not
//! keep the kubelet's or a load balancer's probe out, nor make the agent spin.
use std::{
    net::{SocketAddr, TcpStream},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use weir_integration::{
    Topology,
    agent::AgentProcess,
    bin,
    topology::{NETNS_PREFIX, NODE_IP, Netns, wire_backend},
};

const HEALTHZ_PORT: u16 = 10256;
const IDLE: usize = 2_000;

/// Opens up to `n` TCP connections to `target` from network namespace
/// `netns` and returns those that connected; gives up after ten connects in
/// a row time out (a server that stopped accepting: its queue is full).
/// Sockets belong to the namespace of the thread that creates them, so a
/// throwaway thread enters it.
fn idle_connections(netns: &Netns, target: SocketAddr, n: usize) -> Result<Vec<TcpStream>> {
    weir_integration::topology::in_netns(&netns.path(), move || {
        let mut held = Vec::with_capacity(n);
        let mut failed_in_a_row = 0;
        while held.len() < n && failed_in_a_row < 10 {
            match TcpStream::connect_timeout(&target, Duration::from_millis(300)) {
                Ok(s) => {
                    held.push(s);
                    failed_in_a_row = 0;
                }
                Err(_) => failed_in_a_row += 1,
            }
        }
        Ok(held)
    })
}

/// CPU seconds (user + system) the process has used.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').context("stat format")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Ok(ticks as f64 / hz as f64)
}

/// `GET /healthz` with curl from the pod: the status and how long it took.
fn healthz_from(pod: &Netns, url: &str) -> Result<(u16, Duration)> {
    let start = Instant::now();
    let out = pod
        .command(std::path::Path::new("curl"))
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            url,
        ])
        .output()?;
    let code = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    Ok((code, start.elapsed()))
}

#[test]
fn idle_connections_from_a_pod_neither_block_healthz_nor_spin_the_agent() -> Result<()> {
    let topo = Topology::new(0)?;
    let pod = Netns::create(format!("{NETNS_PREFIX}{}-p", topo.id))?;
    wire_backend(&topo.node, &pod, 1, std::net::Ipv4Addr::new(10, 77, 0, 11))?;

    let mut agent = AgentProcess::new(topo.dir.join("agent.log"));
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=1024:1024")
        .arg("nsenter")
        .arg(format!("--net={}", topo.node.path()))
        .arg(bin("weir-agent"))
        .arg("--manifests")
        .arg(&topo.manifests)
        .arg("--cgroup")
        .arg(&topo.cgroup.path)
        .arg("--bpffs")
        .arg(topo.pin_dir())
        .args(["--metrics-addr", "127.0.0.1:10249"])
        .arg(format!("--healthz-addr=0.0.0.0:{HEALTHZ_PORT}"));
    agent.launch(cmd)?;
    agent.wait_for_log(0, "initial sync complete", Duration::from_secs(120))?;
    let pid = agent.pid().context("agent pid")?;
    let url = format!("http://{NODE_IP}:{HEALTHZ_PORT}/healthz");
    let (code, _) = healthz_from(&pod, &url)?;
    ensure!(code == 200, "/healthz before the flood: {code}");

    let held = idle_connections(&pod, SocketAddr::from((NODE_IP, HEALTHZ_PORT)), IDLE)?;
    eprintln!("{} of {IDLE} idle connections open", held.len());
    std::thread::sleep(Duration::from_millis(500));

    // Both measured before either is judged, so a failure shows both.
    let probes = (0..3)
        .map(|_| healthz_from(&pod, &url))
        .collect::<Result<Vec<_>>>()?;
    let before = cpu_seconds(pid)?;
    let window = Duration::from_secs(3);
    std::thread::sleep(window);
    let used = cpu_seconds(pid)? - before;
    eprintln!(
        "with {} idle connections held: /healthz {probes:?}, agent CPU {used:.2} s in {window:?}",
        held.len()
    );
    ensure!(
        probes
            .iter()
            .all(|&(code, took)| code == 200 && took < Duration::from_secs(1)),
        "/healthz with {} idle connections held: {probes:?} (status, time); CPU {used:.2} s in \
         {window:?}; agent log:\n{}",
        held.len(),
        agent.log_text()
    );
    ensure!(
        used < 0.1 * window.as_secs_f64(),
        "the agent used {used:.2} s of CPU in {window:?} with idle connections held"
    );
    // Accepting never stopped: every connection the pod asked for got in.
    ensure!(
        held.len() == IDLE,
        "only {} of {IDLE} connected",
        held.len()
    );
    drop(held);
    ensure!(agent.is_running());
    Ok(())
}
