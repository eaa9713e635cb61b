//! Writing PodDisruptionBudgets' status.
use std::collections::HashSet;

use k8s_openapi::{
    api::{core::v1::Pod, policy::v1::PodDisruptionBudget},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Map, Value, json};

use super::{Status, covers, decide};
use crate::{cache::Caches, replicasets::controller_of};

/// The desired replicas of the controllers of `pods`, each counted once,
/// through their scale: a Deployment's for its ReplicaSets' pods. `None`
/// when a pod has no controller, or one without a scale (a DaemonSet), as
/// upstream's finders fail.
fn scale(caches: &Caches, pods: &[&Pod]) -> Option<i32> {
    let (rss, deployments) = (caches.replicasets.state(), caches.deployments.state());
    let mut seen = HashSet::new();
    let mut total = 0;
    for pod in pods {
        let owner = controller_of(&pod.metadata)?;
        if owner.kind != "ReplicaSet" {
            return None;
        }
        let rs = rss
            .iter()
            .find(|r| r.metadata.uid.as_deref() == Some(&owner.uid))?;
        let (uid, replicas) = match controller_of(&rs.metadata).filter(|o| o.kind == "Deployment") {
            Some(d) => {
                let d = deployments
                    .iter()
                    .find(|x| x.metadata.uid.as_deref() == Some(&d.uid))?;
                (
                    d.metadata.uid.clone(),
                    d.spec.as_ref().and_then(|s| s.replicas),
                )
            }
            None => (
                rs.metadata.uid.clone(),
                rs.spec.as_ref().and_then(|s| s.replicas),
            ),
        };
        if seen.insert(uid) {
            total += replicas.unwrap_or(1);
        }
    }
    Some(total)
}

pub async fn sync(client: &Client, caches: &Caches) -> anyhow::Result<()> {
    let pods = caches.pods.state();
    let now = Timestamp::now();
    for pdb in caches.budgets.state() {
        let ns = pdb.metadata.namespace.clone().unwrap_or_default();
        let here: Vec<&Pod> = pods
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
            .collect();
        let covered: Vec<&Pod> = here.iter().copied().filter(|p| covers(&pdb, p)).collect();
        let status = decide(&pdb, &here, scale(caches, &covered), now);
        write(client, &pdb, &ns, &status).await?;
    }
    Ok(())
}

async fn write(
    client: &Client,
    pdb: &PodDisruptionBudget,
    ns: &str,
    s: &Status,
) -> anyhow::Result<()> {
    let current = pdb.status.clone().unwrap_or_default();
    let old = current.disrupted_pods.clone().unwrap_or_default();
    let same = current.expected_pods == s.expected
        && current.desired_healthy == s.desired_healthy
        && current.current_healthy == s.current_healthy
        && current.disruptions_allowed == s.disruptions_allowed
        && current.observed_generation == Some(s.observed_generation)
        && old == s.disrupted;
    if same {
        return Ok(());
    }
    // A merge patch removes map keys only when sent as null.
    let mut disrupted: Map<String, Value> = old.keys().map(|k| (k.clone(), Value::Null)).collect();
    for (k, t) in &s.disrupted {
        disrupted.insert(k.clone(), json!(t.0.to_string()));
    }
    let (allowed, reason) = if s.disruptions_allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    // The resourceVersion makes the write conditional: the API server's
    // Eviction spends the same status, and a stale pass must not give back
    // a disruption it spent.
    let status = json!({"metadata": {"resourceVersion": pdb.metadata.resource_version},
        "status": {
        "expectedPods": s.expected, "desiredHealthy": s.desired_healthy,
        "currentHealthy": s.current_healthy, "disruptionsAllowed": s.disruptions_allowed,
        "observedGeneration": s.observed_generation, "disruptedPods": disrupted,
        "conditions": [{"type": "DisruptionAllowed", "status": allowed, "reason": reason, "message": "",
                        "observedGeneration": s.observed_generation,
                        "lastTransitionTime": Timestamp::now().to_string()}],
    }});
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let name = pdb.metadata.name.clone().unwrap_or_default();
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await
    {
        Ok(_) => Ok(()),
        // Changed since the cache saw it: the change wakes the next pass.
        Err(kube::Error::Api(e)) if e.is_not_found() || e.is_conflict() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The controller until the task is dropped.
pub async fn run(client: Client, caches: Caches) {
    crate::control_loop("disruption-controller", caches, |c| {
        let client = client.clone();
        async move { sync(&client, &c).await }
    })
    .await;
}
