//! Issue 12 items 6 and 7: weir-kubelet reads only the Secrets and ConfigMaps
//! its pods refer to, one watch per object (`fieldSelector=metadata.name=X`),
//! shows a missing one on the pod (waiting reason, message, Event), and puts
//! Secret volumes on a per-pod tmpfs with the modes asked for, unmounted when
//! the pod goes. Real containerd and the test API server; needs root.
use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::Api;
use serde_json::json;
use weir_integration::{
    api::Cluster,
    images::BUSYBOX,
    kubelet::{ApiNode, ConfigOptions, until},
};

const NODE: &str = "node-s";

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The first container's waiting (reason, message).
fn waiting(p: &Pod) -> Option<(String, String)> {
    let w = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .clone()?;
    Some((w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
}

fn secret(cluster: &Cluster, name: &str) -> Result<()> {
    cluster.upsert(
        &cluster.api::<Secret>("default"),
        // "s3cret"
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": "default"},
               "data": {"token": "czNjcmV0"}}),
    )?;
    Ok(())
}

/// Item 6. Before: the kubelet listed and watched `/api/v1/secrets` and
/// `/api/v1/configmaps` (every namespace), and a pod whose Secret was missing
/// got a waiting message but no Event.
#[test]
fn secrets_are_watched_per_object_and_failures_show_on_the_pod() -> Result<()> {
    let node = ApiNode::start(NODE, &ConfigOptions::default())?;
    let (cluster, kubelet) = (&node.cluster, &node.kubelet);
    secret(cluster, "token")?;
    let pods: Api<Pod> = cluster.api("default");
    for (name, secret) in [("ok", "token"), ("lacks", "absent")] {
        cluster.upsert(
            &pods,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                         "volumes": [{"name": "s", "secret": {"secretName": secret}}],
                         "containers": [{"name": "c", "image": BUSYBOX,
                                          "imagePullPolicy": "IfNotPresent",
                                          "command": ["sleep", "1000"],
                                          "env": [{"name": "T", "valueFrom": {"secretKeyRef":
                                                   {"name": "token", "key": "token"}}}],
                                          "volumeMounts": [{"name": "s", "mountPath": "/s"}]}]},
            }),
        )?;
    }
    until(kubelet, "ok Running", Duration::from_secs(60), || {
        Ok(cluster.block_on(pods.get_opt("ok"))?.filter(running))
    })?;
    let (reason, message) = until(
        kubelet,
        "lacks waits with CreateContainerConfigError",
        Duration::from_secs(60),
        || {
            Ok(cluster
                .block_on(pods.get_opt("lacks"))?
                .and_then(|p| waiting(&p)))
        },
    )?;
    ensure!(
        reason == "CreateContainerConfigError"
            && message.contains("absent")
            && message.contains("not found"),
        "{reason}: {message}"
    );
    let events: Api<Event> = cluster.api("default");
    let ev = until(
        kubelet,
        "a Warning Event on lacks",
        Duration::from_secs(30),
        || {
            let list = cluster.block_on(events.list(&Default::default()))?;
            Ok(list.items.into_iter().find(|e| {
                e.involved_object.name.as_deref() == Some("lacks")
                    && e.type_.as_deref() == Some("Warning")
                    && e.message.as_deref().is_some_and(|m| m.contains("absent"))
            }))
        },
    )?;
    ensure!(ev.reason.as_deref() == Some("Failed"), "{ev:?}");

    let requests: Vec<String> = cluster
        .server
        .requests()
        .into_iter()
        .map(|r| r.replace("%3D", "=").replace("%2C", ","))
        .collect();
    let wide: Vec<&String> = requests
        .iter()
        .filter(|r| r.contains(" /api/v1/secrets") || r.contains(" /api/v1/configmaps"))
        .collect();
    ensure!(wide.is_empty(), "cluster-wide reads: {wide:?}");
    for name in ["token", "absent"] {
        ensure!(
            requests
                .iter()
                .any(|r| r.starts_with("GET /api/v1/namespaces/default/secrets?")
                    && r.contains(&format!("fieldSelector=metadata.name={name}"))
                    && r.contains("watch=true")),
            "no per-object watch of {name}: {requests:#?}"
        );
    }

    // The watch brings the Secret as soon as it exists.
    secret(cluster, "absent")?;
    until(kubelet, "lacks Running", Duration::from_secs(60), || {
        Ok(cluster.block_on(pods.get_opt("lacks"))?.filter(running))
    })?;
    Ok(())
}

/// The mount points of this mount namespace (the kubelet's: it runs in the
/// test's mount namespace) whose path contains `part`.
fn mounts_with(part: &str) -> Result<Vec<String>> {
    Ok(std::fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.contains(part))
        .map(str::to_owned)
        .collect())
}

/// Item 7. Before: Secret files were written to the node's disk (ext4 or
/// overlay inside the container, `stat -f` not tmpfs) below directories
/// others could read.
#[test]
fn secret_volumes_are_per_pod_tmpfs_with_their_modes() -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let node = ApiNode::start(NODE, &ConfigOptions::default())?;
    let (cluster, kubelet, ctrd) = (&node.cluster, &node.kubelet, &node.ctrd);
    secret(cluster, "token")?;
    let out = ctrd.dir.join("out");
    std::fs::create_dir_all(&out)?;
    let pods: Api<Pod> = cluster.api("default");
    let script = "stat -f -c %T /s1 > /out/r.tmp; stat -L -c %a /s1/token >> /out/r.tmp; \
                  stat -L -c %a /s2/renamed >> /out/r.tmp; mv /out/r.tmp /out/r; exec sleep 1000";
    let pod = cluster.upsert(
        &pods,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "vol", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                     "volumes": [
                        {"name": "s1", "secret": {"secretName": "token", "defaultMode": 0o440}},
                        {"name": "s2", "secret": {"secretName": "token", "defaultMode": 0o644,
                            "items": [{"key": "token", "path": "renamed", "mode": 0o400}]}},
                        {"name": "out", "hostPath": {"path": out.display().to_string(),
                                                      "type": "Directory"}}],
                     "containers": [{"name": "c", "image": BUSYBOX,
                                      "imagePullPolicy": "IfNotPresent",
                                      "command": ["sh", "-c", script],
                                      "volumeMounts": [
                                          {"name": "s1", "mountPath": "/s1"},
                                          {"name": "s2", "mountPath": "/s2"},
                                          {"name": "out", "mountPath": "/out"}]}]},
        }),
    )?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let result = until(
        kubelet,
        "the container's report",
        Duration::from_secs(60),
        || Ok(std::fs::read_to_string(out.join("r")).ok()),
    )?;
    ensure!(result == "tmpfs\n440\n400\n", "{result:?}");

    let plugin = ctrd
        .kubelet_dir()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~secret");
    for d in [
        plugin.clone(),
        plugin.parent().unwrap_or(&plugin).to_owned(),
    ] {
        let mode = std::fs::metadata(&d)?.permissions().mode();
        ensure!(mode & 0o007 == 0, "{} is {mode:o}", d.display());
    }
    // The two Secrets, and the service-account volume the API server's
    // admission added (it holds a token: a tmpfs too).
    let mounts = mounts_with(&uid)?;
    let secrets = mounts
        .iter()
        .filter(|m| m.contains("kubernetes.io~secret/s"))
        .count();
    let projected = mounts
        .iter()
        .filter(|m| m.contains("kubernetes.io~projected/kube-api-access-"))
        .count();
    ensure!(
        secrets == 2 && projected == 1 && mounts.len() == 3,
        "{mounts:?}"
    );

    cluster.block_on(pods.delete("vol", &Default::default()))?;
    until(kubelet, "vol gone", Duration::from_secs(60), || {
        Ok(cluster
            .block_on(pods.get_opt("vol"))?
            .is_none()
            .then_some(()))
    })?;
    until(kubelet, "no mount left", Duration::from_secs(30), || {
        Ok(mounts_with(&uid)?.is_empty().then_some(()))
    })?;
    ensure!(!plugin.exists(), "the pod dir is removed");
    Ok(())
}
