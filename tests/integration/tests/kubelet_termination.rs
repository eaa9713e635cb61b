//! Issue 15, termination as a state: a pod whose process ignores SIGTERM is
//! deleted with its 60 s grace period, then deleted again with a shorter one
//! (`kubectl delete --grace-period=3`) or force-deleted
//! (`--grace-period=0 --force`). weir-kubelet cuts the stop in flight short,
//! as the kubelet's pod workers do, instead of sitting out the first grace
//! period. The real kubectl, the test API server, real containerd; root.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;
use weir_integration::{
    containerd::block_on,
    images::BUSYBOX,
    kubelet::{ApiNode, ConfigOptions, until},
};
use weir_kubelet::cri::{ContainerFilter, ContainerState, CriRuntime, Runtime as _};

const NODE: &str = "node-t";
const GRACE: i64 = 60;

fn kubectl(node: &ApiNode, args: &[&str]) -> Result<()> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(node.cluster.kubeconfig())
        .args(["--namespace", "default", "--request-timeout", "30s"])
        .args(args)
        .output()?;
    println!(
        "kubectl {}: {:?} {}{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "kubectl {} failed", args.join(" "));
    Ok(())
}

/// A pod whose only process ignores SIGTERM: it stops when the grace period
/// ends and the runtime sends SIGKILL.
fn stubborn(node: &ApiNode, name: &str) -> Result<()> {
    let pods: Api<Pod> = node.cluster.api("default");
    node.cluster.upsert(
        &pods,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": GRACE,
                     "containers": [{"name": "c", "image": BUSYBOX,
                                      "imagePullPolicy": "IfNotPresent",
                                      "command": ["sh", "-c",
                                          "trap '' TERM; while true; do sleep 1; done"]}]},
        }),
    )?;
    until(
        &node.kubelet,
        &format!("{name} Running"),
        Duration::from_secs(90),
        || {
            let p = node.cluster.block_on(pods.get_opt(name))?;
            Ok(
                p.filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                    .map(|_| ()),
            )
        },
    )
}

/// How many of the pod's containers containerd still runs.
fn running(node: &ApiNode, name: &str) -> Result<usize> {
    let filter = ContainerFilter {
        state: Some(ContainerState::Running),
        labels: [("io.kubernetes.pod.name".to_owned(), name.to_owned())].into(),
        ..Default::default()
    };
    let endpoint = node.ctrd.endpoint();
    let listed =
        block_on(async move { CriRuntime::new(&endpoint)?.list_containers(&filter).await });
    Ok(listed?.len())
}

#[test]
fn a_shorter_grace_period_or_a_force_delete_cuts_termination_short() -> Result<()> {
    let node = ApiNode::start(NODE, &ConfigOptions::default())?;
    let pods: Api<Pod> = node.cluster.api("default");

    // 1. A second delete with a shorter grace period: the pod goes from
    //    the API once the kubelet stopped it, 3 s later, not 60.
    stubborn(&node, "shorter")?;
    kubectl(&node, &["delete", "pod", "shorter", "--wait=false"])?;
    std::thread::sleep(Duration::from_secs(2));
    ensure!(
        running(&node, "shorter")? == 1,
        "SIGTERM is ignored: it still runs"
    );
    let asked = Instant::now();
    kubectl(
        &node,
        &[
            "delete",
            "pod",
            "shorter",
            "--grace-period=3",
            "--wait=false",
        ],
    )?;
    until(
        &node.kubelet,
        "shorter gone from the API",
        Duration::from_secs(30),
        || {
            Ok(node
                .cluster
                .block_on(pods.get_opt("shorter"))?
                .is_none()
                .then_some(()))
        },
    )?;
    let took = asked.elapsed();
    println!(
        "second delete with --grace-period=3 → pod gone: {took:.1?} (first grace period: {GRACE} s)"
    );
    ensure!(
        took >= Duration::from_secs(3),
        "gone before its grace period: {took:?}"
    );
    ensure!(took < Duration::from_secs(15), "{took:?}");
    ensure!(running(&node, "shorter")? == 0);

    // 2. A force delete: the object goes at once; the kubelet stops the
    //    container within its minimum grace period of 2 s.
    stubborn(&node, "forced")?;
    kubectl(&node, &["delete", "pod", "forced", "--wait=false"])?;
    std::thread::sleep(Duration::from_secs(2));
    let asked = Instant::now();
    kubectl(
        &node,
        &["delete", "pod", "forced", "--grace-period=0", "--force"],
    )?;
    ensure!(node.cluster.block_on(pods.get_opt("forced"))?.is_none());
    until(
        &node.kubelet,
        "forced container stopped",
        Duration::from_secs(30),
        || Ok((running(&node, "forced")? == 0).then_some(())),
    )?;
    let took = asked.elapsed();
    println!("force delete → container stopped: {took:.1?}");
    ensure!(took < Duration::from_secs(10), "{took:?}");
    // Nothing restarts it: the kubelet's own bookkeeping has it terminated.
    std::thread::sleep(Duration::from_secs(3));
    ensure!(running(&node, "forced")? == 0);
    Ok(())
}
