//! The second part of `cargo xtask demo`: the per-packet datapath. An external
//! client reaches a NodePort and a LoadBalancer IP of the node; the agent's TC
//! (and, where the driver has it, XDP) programs pick a backend, keep the flow
//! in conntrack and SNAT it (externalTrafficPolicy Cluster) or keep the
//! client's address (Local). Everything lives in the harness's
//! [`PacketTopology`], torn down by its guards, errors included.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use weir_integration::packet_topology::{
    CLIENT4, CLIENT6, LPOD, NODE_EXT4, NODE_LINK4, NODE_LINK6, NODE_POD4, NODE_POD6, Ns,
    PacketAgent, PacketTopology, RPOD,
    clients::target,
    manifests::{Ep, READY, Svc, service_with},
};

/// The Cluster Service's NodePort (http) and LB IPs.
const CLUSTER_NODEPORT: u16 = 30080;
const CLUSTER_LB6: &str = "fd00:70::10";
/// The Local Service's NodePort (http) and LB IPs.
const LOCAL_NODEPORT: u16 = 31080;
const LOCAL_LB6: &str = "fd00:70::20";

pub fn run() -> Result<()> {
    step("Per-packet datapath: building an external client, a node, a local and a remote pod");
    let topo = PacketTopology::new()?;
    println!("    client   {CLIENT4}, {CLIENT6}  (outside, routes via the node)");
    println!("    node     {NODE_EXT4} on wext, {NODE_POD4} on wpod, {NODE_LINK4} on wnode2");
    println!(
        "    lpod     {}, {}  (on this node)   rpod {}, {}  (behind node2)",
        LPOD.v4, LPOD.v6, RPOD.v4, RPOD.v6
    );

    step(
        "Publishing two LoadBalancer Services, each with endpoints lpod (local) and rpod (remote)",
    );
    let mut cluster = Svc::load_balancer(
        "web-cluster",
        "10.96.1.10",
        "fd00:96::1:10",
        [CLUSTER_NODEPORT, 30353, 30053],
        &["192.168.70.10", CLUSTER_LB6],
    );
    cluster.etp_local = false;
    let mut local = Svc::load_balancer(
        "web-local",
        "10.96.1.20",
        "fd00:96::1:20",
        [LOCAL_NODEPORT, 31353, 31053],
        &["192.168.70.20", LOCAL_LB6],
    );
    local.etp_local = true;
    local.health_check_node_port = Some(32100);
    let both = [Ep::local(LPOD, READY), Ep::remote(RPOD, READY)];
    for svc in [&cluster, &local] {
        topo.write_manifest(&format!("{}.yaml", svc.name), &service_with(svc, &both))?;
        println!(
            "    {:<12} externalTrafficPolicy {:<7} NodePort {}  LB IPs {}",
            svc.name,
            if svc.etp_local { "Local" } else { "Cluster" },
            svc.node_ports.map_or(0, |p| p[0]),
            svc.lb_ingress.join(", ")
        );
    }

    step("Starting weir-agent on wext,wpod,wnode2 with --acceleration=best-effort");
    let agent = PacketAgent::start(&topo, &["--acceleration=best-effort"])?;
    println!("    agent log: {}", agent.log.display());
    wait_serving(&topo, NODE_EXT4, CLUSTER_NODEPORT)?;

    step("externalTrafficPolicy Cluster: curl from the client; the pod sees a node address (SNAT)");
    show_curls(&topo, NODE_EXT4, CLUSTER_NODEPORT, 4, "NodePort")?;
    show_curls(&topo, CLUSTER_LB6, 80, 4, "LB IP")?;

    step("externalTrafficPolicy Local: only the local pod answers, and it sees the client");
    show_curls(&topo, NODE_EXT4, LOCAL_NODEPORT, 3, "NodePort")?;
    show_curls(&topo, LOCAL_LB6, 80, 3, "LB IP")?;

    step("weir-agent inspect services (the four frontends used above)");
    // Only the four frontends the client used; the ClusterIPs, the other
    // node addresses and the UDP ports are listed too, left out here.
    let shown = [
        format!("{NODE_EXT4}:{CLUSTER_NODEPORT}/TCP"),
        format!("[{CLUSTER_LB6}]:80/TCP"),
        format!("{NODE_EXT4}:{LOCAL_NODEPORT}/TCP"),
        format!("[{LOCAL_LB6}]:80/TCP"),
    ];
    let services = inspect(&topo, "services")?;
    let mut keep = true;
    for line in services.lines() {
        // A frontend's first line names it; its other backends follow on
        // lines that start with blanks.
        if !line.starts_with(' ') {
            keep = line.starts_with("FRONTEND")
                || shown
                    .iter()
                    .any(|f| line.split_whitespace().next() == Some(f.as_str()));
        }
        if keep {
            println!("    {line}");
        }
    }

    step("weir-agent inspect conntrack (TCP flows above: forward and reply entries)");
    for line in inspect(&topo, "conntrack")?.lines() {
        if line.starts_with("PROTO") || line.starts_with("TCP") || line.starts_with("tcp") {
            println!("    {line}");
        }
    }

    step("weir-agent inspect stats (non-zero counters of the xdp, tc-ingress and sock programs)");
    for (i, line) in inspect(&topo, "stats")?.lines().enumerate() {
        let packets = line.split_whitespace().nth(2).unwrap_or("0");
        if i == 0 || packets != "0" {
            println!("    {line}");
        }
    }

    step("Tearing down (agent, five namespaces, cgroup, bpffs)");
    drop(agent);
    drop(topo);
    Ok(())
}

fn step(s: &str) {
    println!("\n==> {s}");
}

/// `weir-agent inspect WHAT --bpffs PIN`, as a person would type it.
fn inspect(topo: &PacketTopology, what: &str) -> Result<String> {
    let out = Command::new(weir_integration::bin("weir-agent"))
        .args(["inspect", what, "--bpffs"])
        .arg(topo.pin_dir())
        .output()
        .context("running weir-agent inspect")?;
    if !out.status.success() {
        bail!(
            "weir-agent inspect {what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until the first frontend answers: the agent's first sync has landed.
fn wait_serving(topo: &PacketTopology, ip: &str, port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = topo.who_tcp(Ns::Client, ip, port)?;
        if c.ok() && c.who().is_some() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{} never answered from the client: {c:?}", target(ip, port));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `tries` `curl http://ip:port/peer` from the client namespace, each line
/// naming the pod that answered and the source address it saw.
fn show_curls(topo: &PacketTopology, ip: &str, port: u16, tries: usize, kind: &str) -> Result<()> {
    let url = target(ip, port);
    for _ in 0..tries {
        let c = topo.who_tcp(Ns::Client, ip, port)?;
        let Some((pod, peer)) = c.who().filter(|_| c.ok()) else {
            bail!("curl http://{url}/peer from the client failed: {c:?}");
        };
        println!(
            "    {kind:<8} {url:<22} answered by {pod}, which saw {peer:<12} ({})",
            describe(&peer)
        );
    }
    Ok(())
}

fn describe(peer: &str) -> &'static str {
    match peer {
        NODE_POD4 | NODE_POD6 => "SNAT to the node's address towards lpod",
        NODE_LINK4 | NODE_LINK6 => "SNAT to the node's address towards node2",
        CLIENT4 | CLIENT6 => "the client's own address",
        _ => "?",
    }
}
