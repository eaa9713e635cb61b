//! Issue 15, node-pressure eviction: weir-kubelet's root directory is a
//! 64 MiB tmpfs with `evictionHard: nodefs.available: 50%`. A BestEffort pod
//! fills its emptyDir with 40 MiB; the node reports DiskPressure, the node
//! lifecycle controller taints it `disk-pressure:NoSchedule`, and the kubelet
//! evicts the pod that uses the most beyond its requests: phase Failed,
//! reason Evicted, the kubelet's message, a DisruptionTarget condition and an
//! Event. A pod within its ephemeral-storage request keeps running. The
//! evicted pod's volume is torn down, so the pressure clears after the
//! transition period. Real containerd, the test API server and control plane.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use serde_json::json;
use weir_integration::{
    images::BUSYBOX,
    kubelet::{ApiNode, ConfigOptions, until},
};

const NODE: &str = "node-e";

fn condition(node: &Node, kind: &str) -> Option<String> {
    weir_test_controlplane::nodes::condition(node, kind).map(str::to_owned)
}

fn tainted(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key && t.effect == "NoSchedule"))
}

fn pod(name: &str, command: &str, requests: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                 "volumes": [{"name": "data", "emptyDir": {}}],
                 "containers": [{"name": "c", "image": BUSYBOX,
                                  "imagePullPolicy": "IfNotPresent",
                                  "command": ["sh", "-c", command],
                                  "resources": {"requests": requests},
                                  "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]},
    })
}

#[test]
fn a_pod_filling_the_kubelets_disk_is_evicted_and_the_pressure_clears() -> Result<()> {
    let eviction = "evictionHard: {nodefs.available: \"50%\", nodefs.inodesFree: \"0%\", \
                    imagefs.available: \"0%\", memory.available: 100Mi}\n\
                    evictionPressureTransitionPeriod: 10s\n";
    let node = ApiNode::start_with(
        NODE,
        &ConfigOptions {
            eviction: Some(eviction.into()),
            ..ConfigOptions::default()
        },
        |ctrd| {
            // On the shared bind of the kubelet's directory, so that
            // containerd's copy of the mount table sees it too.
            let dir = ctrd.kubelet_dir();
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "mount -t tmpfs -o size=64m weir-evict '{d}' && mount --make-shared '{d}'",
                    d = dir.display()
                ))
                .output()?;
            ensure!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        },
    )?;
    let _control_plane = node
        .cluster
        .block_on(weir_test_controlplane::ControlPlane::start(
            node.cluster.client.clone(),
        ));
    let pods: Api<Pod> = node.cluster.api("default");
    let nodes: Api<Node> = Api::all(node.cluster.client.clone());
    let get_node = || node.cluster.block_on(nodes.get(NODE)).context("the node");

    node.cluster.upsert(
        &pods,
        pod(
            "steady",
            "sleep 3600",
            json!({"ephemeral-storage": "10Mi", "memory": "16Mi"}),
        ),
    )?;
    node.cluster.upsert(
        &pods,
        pod(
            "filler",
            "sleep 3; dd if=/dev/zero of=/data/fill bs=1M count=40; sleep 3600",
            json!({}),
        ),
    )?;
    let phase = |name: &str| -> Result<Option<String>> {
        Ok(node
            .cluster
            .block_on(pods.get(name))?
            .status
            .and_then(|s| s.phase))
    };
    until(
        &node.kubelet,
        "both pods Running",
        Duration::from_secs(90),
        || {
            Ok((phase("steady")?.as_deref() == Some("Running")
                && phase("filler")?.as_deref() == Some("Running"))
            .then_some(()))
        },
    )?;
    ensure!(condition(&get_node()?, "DiskPressure").as_deref() == Some("False"));

    let filled = Instant::now();
    let evicted = until(
        &node.kubelet,
        "filler evicted",
        Duration::from_secs(90),
        || {
            let p = node.cluster.block_on(pods.get("filler"))?;
            Ok(p.status.filter(|s| s.reason.as_deref() == Some("Evicted")))
        },
    )?;
    println!("filled → evicted: {:.1?}", filled.elapsed());
    println!("status message: {:?}", evicted.message);
    let message = evicted.message.clone().unwrap_or_default();
    ensure!(evicted.phase.as_deref() == Some("Failed"), "{evicted:?}");
    ensure!(
        message
            .starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "),
        "{message}"
    );
    let disruption = evicted
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .context("DisruptionTarget")?;
    ensure!(disruption.reason.as_deref() == Some("TerminationByKubelet"));

    let n = until(
        &node.kubelet,
        "DiskPressure and its taint",
        Duration::from_secs(60),
        || {
            let n = get_node()?;
            Ok((condition(&n, "DiskPressure").as_deref() == Some("True")
                || tainted(&n, "node.kubernetes.io/disk-pressure"))
            .then_some(n))
        },
    )?;
    println!(
        "node: DiskPressure {:?}, disk-pressure taint {}",
        condition(&n, "DiskPressure"),
        tainted(&n, "node.kubernetes.io/disk-pressure")
    );
    until(
        &node.kubelet,
        "the disk-pressure taint",
        Duration::from_secs(30),
        || Ok(tainted(&get_node()?, "node.kubernetes.io/disk-pressure").then_some(())),
    )?;

    let events: Api<Event> = node.cluster.api("default");
    until(
        &node.kubelet,
        "an Evicted Event",
        Duration::from_secs(30),
        || {
            let list = node.cluster.block_on(events.list(&Default::default()))?;
            Ok(list.items.into_iter().find(|e| {
                e.involved_object.name.as_deref() == Some("filler")
                    && e.reason.as_deref() == Some("Evicted")
                    && e.type_.as_deref() == Some("Warning")
            }))
        },
    )?;
    ensure!(
        phase("steady")?.as_deref() == Some("Running"),
        "within its request: kept"
    );

    // The evicted pod's emptyDir is gone: the pressure clears after the
    // transition period, and so does the taint.
    let cleared = until(
        &node.kubelet,
        "DiskPressure False again",
        Duration::from_secs(90),
        || {
            let n = get_node()?;
            Ok((condition(&n, "DiskPressure").as_deref() == Some("False")
                && !tainted(&n, "node.kubernetes.io/disk-pressure"))
            .then_some(()))
        },
    );
    println!("evicted → pressure cleared: {:.1?}", filled.elapsed());
    cleared?;
    ensure!(phase("steady")?.as_deref() == Some("Running"));
    ensure!(
        phase("filler")?.as_deref() == Some("Failed"),
        "an evicted pod stays Failed"
    );
    Ok(())
}
