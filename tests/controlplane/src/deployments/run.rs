//! Acting on the Deployment controller's decisions.
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, ReplicaSet};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use super::{Decision, Status, decide};
use crate::cache::Caches;

pub async fn sync(client: &Client, caches: &Caches) -> anyhow::Result<()> {
    let all = caches.replicasets.state();
    for d in caches.deployments.state() {
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let here: Vec<&ReplicaSet> = all
            .iter()
            .map(AsRef::as_ref)
            .filter(|rs| rs.metadata.namespace.as_deref() == Some(ns.as_str()))
            .collect();
        if d.metadata.deletion_timestamp.is_some() {
            continue;
        }
        act(client, &d, &ns, decide(&d, &here)).await?;
    }
    Ok(())
}

fn ignore_gone(r: Result<(), kube::Error>) -> anyhow::Result<()> {
    match r {
        Err(kube::Error::Api(e)) if e.is_not_found() || e.is_already_exists() => Ok(()),
        other => Ok(other?),
    }
}

async fn act(client: &Client, d: &Deployment, ns: &str, out: Decision) -> anyhow::Result<()> {
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    if let Some(rs) = &out.create {
        ignore_gone(rss.create(&PostParams::default(), rs).await.map(drop))?;
    }
    for (name, replicas) in &out.scale {
        let patch = json!({
            "metadata": {"annotations": {"deployment.kubernetes.io/desired-replicas": want.to_string()}},
            "spec": {"replicas": replicas},
        });
        let r = rss
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await;
        ignore_gone(r.map(drop))?;
    }
    for name in &out.delete {
        ignore_gone(rss.delete(name, &DeleteParams::default()).await.map(drop))?;
    }
    write_status(client, d, ns, &out.status).await
}

/// The status, written only when it changed (conditions keep their
/// transition times while their status holds).
async fn write_status(client: &Client, d: &Deployment, ns: &str, s: &Status) -> anyhow::Result<()> {
    let current = d.status.clone().unwrap_or_default();
    let conditions = current.conditions.clone().unwrap_or_default();
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let available = if s.minimum_available { "True" } else { "False" };
    let same = current.replicas.unwrap_or(0) == s.replicas
        && current.updated_replicas.unwrap_or(0) == s.updated
        && current.ready_replicas.unwrap_or(0) == s.ready
        && current.available_replicas.unwrap_or(0) == s.available
        && current.unavailable_replicas.unwrap_or(0) == s.unavailable
        && current.observed_generation.unwrap_or(0) == s.observed_generation
        && find("Available").is_some_and(|c| c.status == available)
        && find("Progressing").is_some_and(|c| c.reason.as_deref() == Some(s.progress));
    if same {
        return Ok(());
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let since = |c: Option<&DeploymentCondition>, status: &str| {
        c.filter(|c| c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .map_or(now.clone(), |t| t.0.to_string())
    };
    let (reason, message) = if s.minimum_available {
        (
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
        )
    } else {
        (
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
        )
    };
    let name = d.metadata.name.clone().unwrap_or_default();
    let progress_message = format!("ReplicaSet progress of Deployment {name:?}: {}", s.progress);
    let status = json!({"status": {
        "replicas": s.replicas, "updatedReplicas": s.updated, "readyReplicas": s.ready,
        "availableReplicas": s.available, "unavailableReplicas": s.unavailable,
        "observedGeneration": s.observed_generation,
        "conditions": [
            {"type": "Available", "status": available, "reason": reason, "message": message,
             "lastUpdateTime": now, "lastTransitionTime": since(find("Available"), available)},
            {"type": "Progressing", "status": "True", "reason": s.progress, "message": progress_message,
             "lastUpdateTime": now, "lastTransitionTime": since(find("Progressing"), "True")},
        ],
    }});
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let r = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await;
    ignore_gone(r.map(drop))
}

/// The controller until the task is dropped.
pub async fn run(client: Client, caches: Caches) {
    crate::control_loop("deployment-controller", caches, |c| {
        let client = client.clone();
        async move { sync(&client, &c).await }
    })
    .await;
}
