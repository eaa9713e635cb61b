//! Issue 16, the whole system on one machine: a two-node [`LocalCluster`]
//! (test API server and control plane, weir-kubelet on real containerd per
//! node, weir-agent from the chart through `kubectl apply` and the
//! DaemonSet controller) and the drills users run on a kube-proxy
//! replacement, with real kubectl and busybox clients in pods. Each drill
//! prints its figure. Root only.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use serde_json::json;
use weir_integration::{
    cluster::{AGENT_NAMESPACE, LocalCluster, OUTSIDE_IP, Options, SAMPLE_IMAGE, SAMPLE_PORT},
    eventually,
};

/// Tolerations that let the drill-4 pods go 5 s after their node is lost
/// (300 s by default, from the DefaultTolerationSeconds admission).
fn short_tolerations() -> serde_json::Value {
    json!({"tolerations": [
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
         "effect": "NoExecute", "tolerationSeconds": 5},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
         "effect": "NoExecute", "tolerationSeconds": 5}]})
}

/// A preStop pause keeps a deleted pod serving while the endpoint change
/// reaches every node, as in any zero-downtime Deployment.
fn pre_stop() -> serde_json::Value {
    json!({"lifecycle": {"preStop": {"exec": {"command": ["sleep", "2"]}}}})
}

#[test]
fn drills() -> Result<()> {
    let mut c = LocalCluster::up(&Options::default(), |s| println!("==> {s}"))?;
    scale_spreads_traffic(&c)?;
    agent_pod_deleted_under_load(&c)?;
    kubelet_sigkilled_and_restarted(&mut c)?;
    nodeports_from_outside(&c)?;
    apiserver_restarted(&c)?;
    drain_with_pdb(&c)?;
    node_lost(&mut c)?;
    bad_input(&c)?;
    Ok(())
}

/// Drill 1: `web` with 3 replicas, a client on node-2, then `kubectl scale
/// --replicas=5`: the client reaches all five.
fn scale_spreads_traffic(c: &LocalCluster) -> Result<()> {
    let vip = c.deploy_web("web", 3, json!({}), pre_stop())?;
    let url = format!("http://{vip}/");
    c.start_client("client-2", "node-2", &url)?;
    c.wait_all_answer("client-2", "web")?;
    let (first, after) = c.scale_until_served("web", 5, "client-2")?;
    let five = c.pods_on_nodes("app=web")?;
    let nodes: std::collections::BTreeSet<&str> = five.iter().map(|p| p.1.as_str()).collect();

    println!(
        "drill 1 (scale 3→5): new pods first answered {:?} after the scale; pods on {nodes:?}; \
         {} attempts, {} failed, per backend {:?}",
        first.values().collect::<Vec<_>>(),
        after.attempts(),
        after.failed,
        after.ok
    );
    ensure!(
        after.failed == 0,
        "failed attempts while scaling: {after:?}"
    );
    ensure!(nodes.len() == 2, "replicas on one node only: {five:?}");
    Ok(())
}

/// The agent pod on `node`.
fn agent_pod(c: &LocalCluster, node: &str) -> Result<String> {
    let out = c.kubectl_ok(&[
        "-n",
        AGENT_NAMESPACE,
        "get",
        "pods",
        "--field-selector",
        &format!("spec.nodeName={node}"),
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .with_context(|| format!("no agent pod on {node}"))
}

/// Drill 5: the agent pod on node-2 deleted under the client's loop: the
/// DaemonSet recreates it, and no attempt fails meanwhile (the datapath is
/// pinned and outlives the agent).
fn agent_pod_deleted_under_load(c: &LocalCluster) -> Result<()> {
    let old = agent_pod(c, "node-2")?;
    let before = c.tally("client-2")?;
    let start = Instant::now();
    c.kubectl_ok(&["-n", AGENT_NAMESPACE, "delete", "pod", &old, "--wait=true"])?;
    eventually("a new agent pod on node-2", Duration::from_secs(60), || {
        Ok(agent_pod(c, "node-2").ok().filter(|p| *p != old))
    })?;
    c.wait_agents_ready(Duration::from_secs(90))?;
    let back = start.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let t = c.tally("client-2")?.since(&before);
    println!(
        "drill 5 (agent pod deleted): replaced and Ready in {:.1} s; {} attempts, {} failed",
        back.as_secs_f64(),
        t.attempts(),
        t.failed
    );
    ensure!(t.failed == 0 && t.attempts() > 10, "{t:?}");
    Ok(())
}

/// Each container's restart count and id on `node`, by pod/container.
fn containers_on(c: &LocalCluster, node: &str) -> Result<Vec<String>> {
    let out = c.kubectl_ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        &format!("spec.nodeName={node}"),
        "-o",
        "jsonpath={range .items[*]}{range .status.containerStatuses[*]}{.name} {.restartCount} {.containerID}{\"\\n\"}{end}{end}",
    ])?;
    let mut v: Vec<String> = out.lines().map(str::to_owned).collect();
    v.sort();
    Ok(v)
}

/// Drill 3: weir-kubelet SIGKILLed and restarted on node-1: the Node stays
/// Ready and no container restarts.
fn kubelet_sigkilled_and_restarted(c: &mut LocalCluster) -> Result<()> {
    let before = containers_on(c, "node-1")?;
    let node = c.node_mut("node-1")?;
    node.kubelet.kill9();
    std::thread::sleep(Duration::from_secs(3));
    let start = Instant::now();
    node.kubelet.spawn()?;
    node.kubelet.wait_serving(Duration::from_secs(60))?;
    let serving = start.elapsed();
    // Long enough for a restarted kubelet to have synced every pod twice.
    let mut not_ready = 0;
    for _ in 0..20 {
        let ready = c.kubectl_ok(&[
            "get",
            "node",
            "node-1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])?;
        not_ready += u32::from(ready != "True");
        std::thread::sleep(Duration::from_millis(500));
    }
    let after = containers_on(c, "node-1")?;
    println!(
        "drill 3 (kubelet SIGKILL): serving again {:.1} s after restart; Node not Ready in \
         {not_ready} of 20 checks over 10 s; {} containers, {} changed",
        serving.as_secs_f64(),
        before.len(),
        before.iter().filter(|b| !after.contains(b)).count()
    );
    ensure!(not_ready == 0, "node-1 left Ready");
    ensure!(
        before == after,
        "containers changed:\n{before:#?}\n{after:#?}"
    );
    Ok(())
}

/// `curl` from the outside namespace: what answered, or None.
fn outside_get(c: &LocalCluster, url: &str) -> Option<String> {
    let out = c
        .underlay
        .outside
        .command(std::path::Path::new("curl"))
        .args(["-s", "-m", "2", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Drill 7: NodePort from a host on the underlay that is no node, to either
/// node, with externalTrafficPolicy Cluster and Local.
fn nodeports_from_outside(c: &LocalCluster) -> Result<()> {
    let mut report = Vec::new();
    for (name, policy) in [("web-np", "Cluster"), ("web-np-local", "Local")] {
        c.apply(&[json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "NodePort", "externalTrafficPolicy": policy,
                     "selector": {"app": "web"},
                     "ports": [{"port": 80, "targetPort": SAMPLE_PORT}]}})])?;
        let port = c.kubectl_ok(&[
            "get",
            "service",
            name,
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ])?;
        let pods = c.pods_on_nodes("app=web")?;
        for n in &c.nodes {
            let url = format!("http://{}:{port}/", n.ip);
            eventually(
                &format!("{url} ({policy}) from {OUTSIDE_IP}"),
                Duration::from_secs(20),
                || Ok(outside_get(c, &url)),
            )?;
            let mut answers = std::collections::BTreeMap::<String, u32>::new();
            for _ in 0..20 {
                let a = outside_get(c, &url).unwrap_or_else(|| "failed".into());
                *answers.entry(a).or_default() += 1;
            }
            let local: Vec<&String> = pods
                .iter()
                .filter(|p| p.1 == n.name)
                .map(|p| &p.0)
                .collect();
            if policy == "Local" {
                ensure!(
                    answers.keys().all(|a| local.contains(&a)),
                    "{url} eTP=Local answered from elsewhere: {answers:?}, local {local:?}"
                );
            } else {
                ensure!(!answers.contains_key("failed"), "{url}: {answers:?}");
            }
            report.push(format!("{policy} via {}: {answers:?}", n.name));
        }
    }
    println!("drill 7 (NodePort from outside): {}", report.join("; "));
    Ok(())
}

/// Drill 6: the API server stopped for 10 s and started again: the
/// datapath serves throughout, and afterwards kubelets and agents follow
/// new changes.
fn apiserver_restarted(c: &LocalCluster) -> Result<()> {
    let before = c.tally("client-2")?;
    c.api.block_on(c.api.server.stop());
    std::thread::sleep(Duration::from_secs(10));
    c.api.block_on(c.api.server.restart())?;
    let start = Instant::now();
    let during = c.tally("client-2")?.since(&before);
    c.scale_until_served("web", 6, "client-2")?;
    let converged = start.elapsed();
    c.kubectl_ok(&["scale", "deployment", "web", "--replicas=5"])?;
    c.wait_ready_replicas("web", 5, Duration::from_secs(60))?;
    println!(
        "drill 6 (API server down 10 s): {} attempts while it was down and after, {} failed; \
         a new pod served {:.1} s after the restart",
        during.attempts(),
        during.failed,
        converged.as_secs_f64()
    );
    ensure!(during.failed == 0, "{during:?}");
    Ok(())
}

/// Drill 2: `kubectl drain node-2` with a PDB `minAvailable: 2` while a
/// client on node-1 loops: pods go gracefully, come back on node-1, and no
/// attempt fails.
fn drain_with_pdb(c: &LocalCluster) -> Result<()> {
    c.apply(&[
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}),
    ])?;
    let vip = c.kubectl_ok(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"])?;
    c.start_client("client-1", "node-1", &format!("http://{vip}/"))?;
    eventually("client-1 answered", Duration::from_secs(30), || {
        Ok((c.tally("client-1")?.ok.values().sum::<u32>() > 5).then_some(()))
    })?;
    let before = c.tally("client-1")?;
    let start = Instant::now();
    c.kubectl_ok(&[
        "drain",
        "node-2",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=180s",
    ])?;
    let drained = start.elapsed();
    c.wait_ready_replicas("web", 5, Duration::from_secs(90))?;
    let pods = c.pods_on_nodes("app=web")?;
    std::thread::sleep(Duration::from_secs(2));
    let t = c.tally("client-1")?.since(&before);
    println!(
        "drill 2 (drain node-2, PDB minAvailable 2): drained in {:.1} s; {} attempts, {} failed; \
         web pods now on {:?}",
        drained.as_secs_f64(),
        t.attempts(),
        t.failed,
        pods.iter().map(|p| p.1.as_str()).collect::<Vec<_>>()
    );
    ensure!(pods.iter().all(|p| p.1 == "node-1"), "{pods:?}");
    ensure!(t.failed == 0, "{t:?}");
    c.kubectl_ok(&["uncordon", "node-2"])?;
    Ok(())
}

/// Drill 4: weir-kubelet stopped on node-2: the Node turns NotReady after
/// the grace period, its pods are evicted after their tolerationSeconds and
/// replaced on node-1, and the Service routes only to live pods.
fn node_lost(c: &mut LocalCluster) -> Result<()> {
    c.deploy_web("lost", 4, short_tolerations(), pre_stop())?;
    let on2: Vec<String> = c
        .pods_on_nodes("app=lost")?
        .into_iter()
        .filter(|p| p.1 == "node-2")
        .map(|p| p.0)
        .collect();
    ensure!(!on2.is_empty(), "no lost pod on node-2");
    let vip = c.kubectl_ok(&["get", "service", "lost", "-o", "jsonpath={.spec.clusterIP}"])?;
    c.start_client("client-lost", "node-1", &format!("http://{vip}/"))?;
    c.node_mut("node-2")?.kubelet.stop()?;
    let start = Instant::now();
    eventually("node-2 NotReady", Duration::from_secs(90), || {
        let s = c.kubectl_ok(&[
            "get",
            "node",
            "node-2",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])?;
        Ok((s != "True").then_some(()))
    })?;
    let not_ready = start.elapsed();
    c.wait_ready_replicas("lost", 4, Duration::from_secs(120))?;
    let replaced = start.elapsed();
    let pods = c.pods_on_nodes("app=lost")?;
    ensure!(pods.iter().all(|p| p.1 == "node-1"), "{pods:?}");
    let mark = c.tally("client-lost")?;
    std::thread::sleep(Duration::from_secs(5));
    let t = c.tally("client-lost")?.since(&mark);
    println!(
        "drill 4 (kubelet stopped on node-2): NotReady after {:.1} s, pods replaced on node-1 \
         after {:.1} s; then {} attempts, {} failed, answered by {:?}",
        not_ready.as_secs_f64(),
        replaced.as_secs_f64(),
        t.attempts(),
        t.failed,
        t.ok.keys().collect::<Vec<_>>()
    );
    ensure!(
        t.failed == 0 && t.ok.keys().all(|b| !on2.contains(b)),
        "the Service still routes to node-2's pods: {t:?}"
    );
    let node = c.node_mut("node-2")?;
    node.kubelet.spawn()?;
    Ok(())
}

/// Bad input: an image that does not exist shows ErrImagePull or
/// ImagePullBackOff while the Service keeps serving the old pods; a Service
/// that selects nothing refuses connections at once.
fn bad_input(c: &LocalCluster) -> Result<()> {
    let before = c.tally("client-1")?;
    c.kubectl_ok(&["set", "image", "deployment/web", "web=weir.test/missing:1"])?;
    let reason = eventually("ErrImagePull shown", Duration::from_secs(60), || {
        let out = c.kubectl_ok(&["get", "pods", "-l", "app=web", "--no-headers"])?;
        Ok(out
            .lines()
            .find(|l| l.contains("ErrImagePull") || l.contains("ImagePullBackOff"))
            .map(str::to_owned))
    })?;
    std::thread::sleep(Duration::from_secs(3));
    let t = c.tally("client-1")?.since(&before);
    ensure!(
        t.failed == 0 && t.attempts() > 5,
        "the old pods stopped serving: {t:?}"
    );
    c.kubectl_ok(&[
        "set",
        "image",
        "deployment/web",
        &format!("web={SAMPLE_IMAGE}"),
    ])?;
    c.apply(&[json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "nobody", "namespace": "default"},
        "spec": {"selector": {"app": "nobody"}, "ports": [{"port": 80}]}})])?;
    let vip = c.kubectl_ok(&[
        "get",
        "service",
        "nobody",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    // From a pod: the socket hook answers a Service without endpoints with
    // ECONNREFUSED at connect(), not a timeout.
    let pod = c
        .pods_on_nodes("role=client")?
        .first()
        .context("a client pod")?
        .0
        .clone();
    let start = Instant::now();
    let out = c
        .kubectl()
        .args(["exec", &pod, "--", "sh", "-c"])
        .arg(format!(
            "timeout 5 wget -qO- http://{vip}/ 2>&1; echo rc=$?"
        ))
        .output()?;
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    println!(
        "bad input: `{}` while {} attempts on the old pods all succeeded; selector matching \
         nothing: {:?} after {:.0} ms",
        reason
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        t.attempts(),
        text.trim(),
        took.as_secs_f64() * 1000.0
    );
    ensure!(
        text.contains("refused") && took < Duration::from_secs(3),
        "{text}"
    );
    Ok(())
}
