//! The chart README's migration from kube-proxy, walked on a node
//! ([`ChartNode`]) where a kube-proxy stand-in holds what kube-proxy holds:
//! its iptables ruleset (kube-proxy's layout) and ports 10249 and 10256.
//!
//! 0. Installed without the migration mode, the agent cannot bind 10256: it
//!    exits naming the port and the fix, and crash-loops (before, it retried
//!    forever while its probe reached kube-proxy's /healthz and said Ready).
//! 1. Installed with `kubeProxyCoexistence.enabled`: Ready on its own ports.
//! 2. Services work through Weir: kube-proxy's rules send the ClusterIP to
//!    an endpoint that does not exist, so only Weir's socket LB can answer.
//! 3. The stand-in stops (its DaemonSet deleted); its rules stay behind.
//! 4. The upgrade with the mode off and `cleanupKubeProxy.enabled`: the init
//!    container removes kube-proxy's rules from the node.
//! 5. Weir serves /healthz on 10256 and the Service keeps working.
use std::{net::Ipv4Addr, path::Path, process::Stdio, time::Duration};

use anyhow::{Context as _, Result, ensure};
use serde_json::json;
use weir_integration::{
    bench::rules::{
        Ipv4Cidr, Proto, Svc, Variant, iptables_restore_input, iptables_save, load_iptables,
    },
    chart_node::{ChartNode, NAMESPACE},
    containerd::POD_SUBNET,
    topology::{ChildGuard, Netns},
};

const VIP: &str = "10.96.0.88";
const STAND_IN_BODY: &str = "kube-proxy-stand-in";

/// kube-proxy as the node has it: busybox httpd on kube-proxy's healthz
/// (0.0.0.0:10256) and metrics (127.0.0.1:10249) addresses, answering
/// `/healthz` and `/metrics` with its name.
struct StandIn {
    _servers: Vec<ChildGuard>,
}

impl StandIn {
    fn start(node: &Netns, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        for f in ["healthz", "livez", "metrics"] {
            std::fs::write(dir.join(f), format!("{STAND_IN_BODY}\n"))?;
        }
        let mut servers = Vec::new();
        for addr in ["0.0.0.0:10256", "127.0.0.1:10249"] {
            let child = node
                .command(Path::new("busybox"))
                .args(["httpd", "-f", "-p", addr, "-h"])
                .arg(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("busybox httpd (busybox-static)")?;
            servers.push(ChildGuard(child));
        }
        let me = Self { _servers: servers };
        for _ in 0..50 {
            if http_get(node, "127.0.0.1:10256", "/healthz")?.contains(STAND_IN_BODY) {
                return Ok(me);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::bail!("the stand-in did not answer on 10256")
    }
}

/// curl in the node namespace; the body, or "" when nothing answers.
fn http_get(node: &Netns, addr: &str, path: &str) -> Result<String> {
    let out = node
        .command(Path::new("curl"))
        .args(["-sS", "-m", "3", &format!("http://{addr}{path}")])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// kube-proxy's ruleset for the Service, in kube-proxy's own layout, whose
/// only endpoint does not exist: a client that gets an answer got it from
/// Weir.
fn kube_proxy_rules() -> Result<String> {
    let svc = Svc {
        namespace: "default".into(),
        name: "web".into(),
        port_name: "http".into(),
        vip: VIP.parse()?,
        port: 80,
        proto: Proto::Tcp,
        endpoints: vec![(Ipv4Addr::new(10, 88, 0, 250), 8080)],
    };
    let (net, prefix) = POD_SUBNET.split_once('/').context("subnet")?;
    let cidr = Ipv4Cidr::new(net.parse()?, prefix.parse()?)?;
    Ok(iptables_restore_input(&[svc], cidr))
}

fn kube_chains(node: &Netns) -> Result<Vec<String>> {
    let saved = iptables_save(node.path(), Variant::Legacy)?;
    Ok(saved
        .lines()
        .filter(|l| l.starts_with(":KUBE-SVC-") || l.starts_with(":KUBE-SERVICES"))
        .map(str::to_owned)
        .collect())
}

#[test]
fn migration_beside_kube_proxy_follows_the_readme() -> Result<()> {
    let mut node = ChartNode::start()?;
    load_iptables(node.ctrd.node.path(), Variant::Legacy, &kube_proxy_rules()?)?;
    ensure!(
        !kube_chains(&node.ctrd.node)?.is_empty(),
        "ruleset not loaded"
    );
    let stand_in = StandIn::start(&node.ctrd.node, &node.ctrd.dir.join("kube-proxy"))?;
    node.web_service(VIP)?;

    // 0. Without the mode the agent cannot bind kube-proxy's ports. It must
    // fail where everyone sees it: exit non-zero naming the port and the fix,
    // and so crash-loop. (Its readiness probe cannot tell: it reaches the
    // stand-in's /healthz on the same port, as it would kube-proxy's.)
    let clash = node.install(&json!({}))?;
    let reason = node.until(
        "the clashing agent crash-looping",
        Duration::from_secs(90),
        || {
            Ok(node.get_pod(NAMESPACE, &clash)?.and_then(|p| {
                let s = p.status?.container_statuses?.into_iter().next()?;
                let exit = s.last_state?.terminated?.exit_code;
                let waiting = s.state?.waiting?.reason?;
                (waiting == "CrashLoopBackOff").then_some((exit, s.restart_count))
            }))
        },
    )?;
    ensure!(
        reason.0 != 0 && reason.1 >= 1,
        "exit {} restarts {}",
        reason.0,
        reason.1
    );
    let log = node.container_log(NAMESPACE, &clash, "weir-agent");
    ensure!(
        log.contains("10256") && log.contains("kubeProxyCoexistence"),
        "the agent's log does not name the port and the fix:\n{log}"
    );
    node.remove_pod(NAMESPACE, &clash)?;

    // 1. The migration mode: Ready on its own ports while kube-proxy keeps its.
    let coexisting = node.install(&json!({"kubeProxyCoexistence": {"enabled": true}}))?;
    node.wait_ready(NAMESPACE, &coexisting, Duration::from_secs(120))?;
    let weir_healthz = http_get(&node.ctrd.node, "127.0.0.1:10356", "/healthz")?;
    ensure!(weir_healthz.contains("lastUpdated"), "{weir_healthz}");
    ensure!(
        http_get(&node.ctrd.node, "127.0.0.1:10256", "/healthz")?.contains(STAND_IN_BODY),
        "kube-proxy lost its port"
    );

    // 2. Services work through Weir (kube-proxy's rules lead nowhere).
    node.client_reaches("client-1", VIP, Duration::from_secs(60))?;

    // 3. kube-proxy's DaemonSet is deleted: the process goes, its rules stay.
    drop(stand_in);
    ensure!(
        !kube_chains(&node.ctrd.node)?.is_empty(),
        "rules vanished early"
    );

    // 4. The README's next upgrade: mode off, cleanup on. The DaemonSet
    // controller replaces the pod.
    node.remove_pod(NAMESPACE, &coexisting)?;
    let takeover = node.install(&json!({"cleanupKubeProxy": {"enabled": true}}))?;
    // 5. Weir answers kube-proxy's healthz port, and the probe that made the
    // pod Ready is the one on 10256.
    node.wait_ready(NAMESPACE, &takeover, Duration::from_secs(120))?;
    let left = kube_chains(&node.ctrd.node)?;
    ensure!(left.is_empty(), "kube-proxy's chains left behind: {left:?}");
    let healthz = http_get(&node.ctrd.node, "127.0.0.1:10256", "/healthz")?;
    ensure!(
        healthz.contains("lastUpdated") && !healthz.contains(STAND_IN_BODY),
        "10256 after the takeover: {healthz}"
    );
    let cleanup_log = node.container_log(NAMESPACE, &takeover, "cleanup-kube-proxy");
    ensure!(
        cleanup_log.contains("iptables-legacy, table nat: removed"),
        "the image's cleanup-kube-proxy did not remove the nat chains:\n{cleanup_log}"
    );
    node.client_reaches("client-2", VIP, Duration::from_secs(60))?;
    Ok(())
}
