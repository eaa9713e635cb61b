//! Helpers shared by the packet-datapath tests.
use std::{
    io::{BufRead as _, BufReader, Read as _},
    path::Path,
    process::Stdio,
    sync::{Arc, Mutex},
};

/// What is still there of a dropped topology: namespaces, the cgroup, the
/// bpffs mount or the work directory.
pub fn leftovers(netns: &[String], cgroup: &Path, pin: &Path, dir: &Path) -> Vec<String> {
    let mut left = Vec::new();
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for n in netns {
        if list.lines().any(|l| l.split_whitespace().next() == Some(n)) {
            left.push(format!("netns {n}"));
        }
    }
    if cgroup.exists() {
        left.push(format!("cgroup {}", cgroup.display()));
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == pin.to_str())
    {
        left.push(format!("mount {}", pin.display()));
    }
    if dir.exists() {
        left.push(format!("dir {}", dir.display()));
    }
    left
}

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use weir_integration::{
    bin,
    packet_topology::{
        NODE_EXT4, NODE_EXT6, Ns, PacketAgent, PacketTopology, Pod,
        clients::{Curl, Probe, target},
        manifests::{Ep, Svc, service_with},
    },
    topology::ChildGuard,
};

/// Polls `f` every 100 ms until it returns `Some`, or fails after `timeout`
/// with `what` and the last value seen.
pub fn poll<T, D: std::fmt::Debug>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<std::result::Result<T, D>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match f()? {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() > deadline => {
                bail!("{what}: not within {timeout:?}; last: {last:?}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Writes `svc` and its slices of `eps` as `<name>.yaml`.
pub fn publish(topo: &PacketTopology, svc: &Svc, eps: &[Ep]) -> Result<()> {
    topo.write_manifest(&format!("{}.yaml", svc.name), &service_with(svc, eps))
}

/// A frontend a client outside the node can use.
#[derive(Clone, Debug)]
pub struct Frontend {
    /// "NodePort", "ExternalIP" or "LB IP", for messages.
    pub kind: &'static str,
    pub ip: String,
    pub v6: bool,
    /// Ports of http, echo and dns on this frontend.
    pub ports: [u16; 3],
}

impl Frontend {
    pub fn tcp(&self) -> String {
        target(&self.ip, self.ports[0])
    }
}

/// Every external frontend of a dual-stack NodePort/LoadBalancer `svc`, both
/// families: the NodePort on the node's client-side address, each
/// externalIP and each load-balancer IP.
pub fn external_frontends(svc: &Svc) -> Vec<Frontend> {
    let svc_ports = [
        weir_integration::packet_topology::manifests::HTTP_PORT,
        weir_integration::packet_topology::manifests::ECHO_PORT,
        weir_integration::packet_topology::manifests::DNS_PORT,
    ];
    let mut out = Vec::new();
    if let Some(np) = svc.node_ports {
        for (ip, v6) in [(NODE_EXT4, false), (NODE_EXT6, true)] {
            out.push(Frontend {
                kind: "NodePort",
                ip: ip.into(),
                v6,
                ports: np,
            });
        }
    }
    for (kind, ips) in [
        ("ExternalIP", &svc.external_ips),
        ("LB IP", &svc.lb_ingress),
    ] {
        for ip in ips {
            out.push(Frontend {
                kind,
                ip: ip.clone(),
                v6: ip.contains(':'),
                ports: svc_ports,
            });
        }
    }
    out
}

/// `GET /peer` through a frontend from the client, failing with the whole
/// curl run if it did not answer.
pub fn who(topo: &PacketTopology, ns: Ns, ip: &str, port: u16) -> Result<(String, String)> {
    let c: Curl = topo.who_tcp(ns, ip, port)?;
    match c.who() {
        Some(w) if c.ok() => Ok(w),
        _ => bail!("curl {} from {ns:?}: {c:?}", target(ip, port)),
    }
}

/// The pod whose dnsmasq answered `answer` (its IPv4 address).
pub fn pod_of_dns(answer: &str, pods: &[Pod]) -> Option<&'static str> {
    pods.iter().find(|p| p.v4 == answer).map(|p| p.name)
}

/// Asserts the agent is still running and returns it, for chaining.
pub fn alive(agent: &mut PacketAgent) -> Result<()> {
    if !agent.is_running() {
        bail!("weir-agent exited:\n{}", agent.log_text());
    }
    Ok(())
}

/// The frontend `vip:port/protocol` as `inspect services -o json` shows it.
pub fn frontend_view(
    agent: &PacketAgent,
    vip: &str,
    port: u16,
    protocol: &str,
) -> Result<Option<serde_json::Value>> {
    let all = agent.inspect("services")?;
    Ok(all.as_array().and_then(|a| {
        a.iter()
            .find(|v| v["vip"] == vip && v["port"] == port && v["protocol"] == protocol)
            .cloned()
    }))
}

/// Whether `view`'s `flags` list holds `flag`.
pub fn has_flag(view: &serde_json::Value, flag: &str) -> bool {
    view["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == flag))
}

/// A `weir-testclient udp-stream` (one connected UDP socket, a send every
/// 100 ms) whose outcomes are collected as they happen.
pub struct UdpStream {
    child: ChildGuard,
    seen: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

impl UdpStream {
    /// Starts it in `ns`, inside the agent's cgroup if `cgroup`.
    pub fn start(
        topo: &PacketTopology,
        ns: Ns,
        cgroup: bool,
        target: &str,
        ms: u64,
    ) -> Result<Self> {
        let mut child = if cgroup {
            topo.cgroup_command(ns, bin("weir-testclient"))
        } else {
            topo.command(ns, bin("weir-testclient"))
        }
        .args([
            "udp-stream",
            "--target",
            target,
            "--duration-ms",
            &ms.to_string(),
        ])
        .args(["--interval-ms", "100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
        let err = child.stderr.take().context("stderr")?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().expect("not poisoned").push(line);
            }
        });
        Ok(Self {
            child: ChildGuard(child),
            seen,
            reader,
        })
    }

    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("not poisoned").clone()
    }

    /// The first backend that answered.
    pub fn first_backend(&self) -> Result<String> {
        poll(Duration::from_secs(3), "a first answer", || {
            let s = self.seen();
            Ok(s.iter()
                .find(|l| !l.starts_with("error:"))
                .cloned()
                .ok_or(s))
        })
    }

    pub fn finish(mut self) -> Result<Probe> {
        let mut out = String::new();
        if let Some(mut o) = self.child.0.stdout.take() {
            o.read_to_string(&mut out)?;
        }
        self.child.0.wait()?;
        let _ = self.reader.join();
        serde_json::from_str(out.trim()).with_context(|| format!("udp-stream printed {out:?}"))
    }
}
