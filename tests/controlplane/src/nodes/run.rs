//! Acting on the node lifecycle decisions: node conditions and taints,
//! pods marked not ready on a node that went silent, evictions.
use std::{collections::HashMap, sync::Arc, time::Duration};

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::json;

use super::{decide, eviction_time};
use crate::{cache::Caches, pods::is_ready};

/// Per node, when its NoExecute taints were first seen.
pub type FirstSeen = std::sync::Mutex<HashMap<String, Timestamp>>;

pub async fn sync(
    client: &Client,
    caches: &Caches,
    grace: Duration,
    first_seen: &FirstSeen,
) -> anyhow::Result<()> {
    let now = Timestamp::now();
    let leases = caches.leases.state();
    let pods = caches.pods.state();
    let nodes_api: Api<Node> = Api::all(client.clone());
    for node in caches.nodes.state() {
        let name = node.metadata.name.clone().unwrap_or_default();
        let lease = leases
            .iter()
            .find(|l| l.metadata.name.as_deref() == Some(name.as_str()));
        let d = decide(&node, lease.map(AsRef::as_ref), now, grace);
        let on_node: Vec<&Pod> = pods
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()))
            .collect();
        if d.mark_unknown {
            tracing::info!("node {name}: kubelet stopped posting status; Ready=Unknown");
            mark_unknown(&nodes_api, &name, &node, now).await?;
            for pod in on_node.iter().filter(|p| is_ready(p)) {
                mark_not_ready(client, pod, now).await?;
            }
        }
        let taints = match &d.taints {
            Some(t) => {
                let patch = json!({"spec": {"taints": t}});
                nodes_api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
                t.clone()
            }
            None => node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
        };
        let since = {
            let mut seen = first_seen.lock().unwrap_or_else(|e| e.into_inner());
            if taints.iter().any(|t| t.effect == "NoExecute") {
                *seen.entry(name.clone()).or_insert(now)
            } else {
                seen.remove(&name);
                now
            }
        };
        for pod in on_node
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            if eviction_time(pod, &taints, since, now).is_some_and(|at| at <= now) {
                evict(client, pod, &name).await?;
            }
        }
    }
    Ok(())
}

async fn mark_unknown(
    api: &Api<Node>,
    name: &str,
    node: &Node,
    now: Timestamp,
) -> anyhow::Result<()> {
    let conditions: Vec<serde_json::Value> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"type": c.type_, "status": "Unknown", "reason": "NodeStatusUnknown",
                   "message": "Kubelet stopped posting node status.",
                   "lastTransitionTime": now.to_string()})
        })
        .collect();
    let patch = json!({"status": {"conditions": conditions}});
    api.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    Ok(())
}

/// Upstream's `MarkPodsNotReady`: the node cannot say, so its pods are not
/// ready (and leave the Services' ready endpoints).
async fn mark_not_ready(client: &Client, pod: &Pod, now: Timestamp) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "False",
        "lastTransitionTime": now.to_string()}]}});
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn evict(client: &Client, pod: &Pod, node: &str) -> anyhow::Result<()> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    tracing::info!("taint manager: evicting {name} from {node}");
    let api: Api<Pod> = Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The controller until the task is dropped, checking at least every
/// `period` (upstream's nodeMonitorPeriod).
pub async fn run(client: Client, caches: Caches, grace: Duration, period: Duration) {
    let first_seen: Arc<FirstSeen> = Arc::default();
    crate::control_loop_every("node-lifecycle-controller", caches, period, |c| {
        let (client, first_seen) = (client.clone(), first_seen.clone());
        async move { sync(&client, &c, grace, &first_seen).await }
    })
    .await;
}
