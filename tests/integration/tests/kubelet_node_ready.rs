//! Issue 12 item 9: the Node's Ready condition follows the container
//! runtime. weir-kubelet (the binary, API-server mode) runs a pod on a
//! private containerd; containerd is stopped (the pod's processes live on
//! under their shims) and the Node turns NotReady with the kubelet's reason
//! and message once the runtime has not answered for 30 s; containerd is
//! started again and the Node turns Ready, with the pod's container never
//! restarted. Needs root.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use serde_json::json;
use weir_integration::{
    api::{Cluster, Relay},
    containerd::{self, Containerd},
    images::BUSYBOX,
    kubelet::{ConfigOptions, Kubelet, until, write_config},
};
use weir_kubelet::cri::{ContainerState, CriRuntime, Runtime as _};

const NODE: &str = "node-r";
const API_PORT: u16 = 6443;

/// The Node's Ready condition: (status, reason, message).
fn ready(cluster: &Cluster) -> Result<Option<(String, String, String)>> {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let Some(node) = cluster.block_on(nodes.get_opt(NODE))? else {
        return Ok(None);
    };
    Ok(node
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| {
            (
                c.status,
                c.reason.unwrap_or_default(),
                c.message.unwrap_or_default(),
            )
        }))
}

/// The pod's one container: (CRI id, restart count), once it runs.
fn running_container(pod: &Pod) -> Option<(String, i32)> {
    let st = pod.status.as_ref()?;
    let c = st.container_statuses.as_ref()?.first()?;
    c.state.as_ref()?.running.as_ref()?;
    let id = c.container_id.as_deref()?.strip_prefix("containerd://")?;
    Some((id.to_owned(), c.restart_count))
}

fn cri_state(ctrd: &Containerd, id: &str) -> Result<ContainerState> {
    let (endpoint, id) = (ctrd.endpoint(), id.to_owned());
    let st =
        containerd::block_on(
            async move { CriRuntime::new(&endpoint)?.container_status(&id).await },
        )?;
    Ok(st.state)
}

#[test]
fn node_ready_follows_the_container_runtime() -> Result<()> {
    weir_integration::sweep::sweep();
    let mut ctrd = Containerd::start()?;
    let cluster = Cluster::start()?;
    let _relay = Relay::start_in_netns(&ctrd.node, API_PORT, cluster.server.addr())?;
    let kubeconfig = cluster.kubeconfig_via(
        &format!("https://127.0.0.1:{API_PORT}"),
        &ctrd.dir.join("kc"),
    )?;
    // nodeStatusUpdateFrequency 2 s: the status is checked every 2 s.
    let config = write_config(&ctrd, &ConfigOptions::default())?;
    let kubelet = Kubelet::start(&ctrd, &config, Some(&kubeconfig), NODE)?;

    let (status, reason, message) = until(&kubelet, "Node Ready", Duration::from_secs(60), || {
        Ok(ready(&cluster)?.filter(|r| r.0 == "True"))
    })?;
    ensure!(
        reason == "KubeletReady" && message == "kubelet is posting ready status",
        "{status} {reason} {message}"
    );
    let pods: Api<Pod> = cluster.api("default");
    cluster.upsert(
        &pods,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "survivor", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": BUSYBOX,
                                      "imagePullPolicy": "IfNotPresent",
                                      "command": ["sleep", "100000"]}]},
        }),
    )?;
    let (id, restarts) = until(&kubelet, "pod Running", Duration::from_secs(60), || {
        Ok(running_container(&cluster.block_on(pods.get("survivor"))?))
    })?;
    ensure!(restarts == 0);

    ctrd.stop_runtime()?;
    let stopped = Instant::now();
    let (_, reason, message) = until(&kubelet, "Node NotReady", Duration::from_secs(90), || {
        Ok(ready(&cluster)?.filter(|r| r.0 == "False"))
    })?;
    let took = stopped.elapsed();
    ensure!(
        reason == "KubeletNotReady" && message == "container runtime is down",
        "NotReady with reason {reason:?}, message {message:?}"
    );
    // The last good Status was at most 5 s before the stop: the 30 s
    // threshold, not the first failed call, made it NotReady.
    ensure!(
        took >= Duration::from_secs(20),
        "NotReady after only {took:?}"
    );
    eprintln!("NotReady {took:?} after containerd stopped: {message}");

    ctrd.restart_runtime()?;
    let restarted = Instant::now();
    let (_, reason, message) = until(
        &kubelet,
        "Node Ready again",
        Duration::from_secs(60),
        || Ok(ready(&cluster)?.filter(|r| r.0 == "True")),
    )?;
    ensure!(
        reason == "KubeletReady" && message == "kubelet is posting ready status",
        "{reason} {message}"
    );
    eprintln!("Ready {:?} after containerd restarted", restarted.elapsed());

    // The pod lived through it: same container, never restarted.
    ensure!(
        cri_state(&ctrd, &id)? == ContainerState::Running,
        "container {id} is not running after the restart"
    );
    std::thread::sleep(Duration::from_secs(3));
    let pod = cluster.block_on(pods.get("survivor"))?;
    let after = running_container(&pod).context("pod not running")?;
    ensure!(after == (id.clone(), 0), "{after:?}, before ({id}, 0)");
    Ok(())
}
