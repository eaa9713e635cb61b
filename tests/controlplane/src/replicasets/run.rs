//! Acting on the ReplicaSet controller's decisions.
use std::sync::{Arc, Mutex};

use k8s_openapi::{
    api::{apps::v1::ReplicaSet, core::v1::Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{Decision, decide, owner, pod_for};
use crate::{
    cache::Caches,
    expectations::{Expectations, write_pods},
};

pub async fn sync(
    client: &Client,
    caches: &Caches,
    expect: &Mutex<Expectations>,
) -> anyhow::Result<()> {
    let pods = caches.pods.state();
    let now = Timestamp::now();
    for rs in caches.replicasets.state() {
        let ns = rs.metadata.namespace.clone().unwrap_or_default();
        let uid = rs.metadata.uid.clone().unwrap_or_default();
        let here: Vec<&Pod> = pods
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
            .collect();
        let ready = expect
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .satisfied_by(&uid, &here);
        if !ready {
            continue;
        }
        let d = decide(&rs, &here, now);
        act(client, &rs, &ns, &uid, d, expect).await?;
    }
    Ok(())
}

async fn act(
    client: &Client,
    rs: &ReplicaSet,
    ns: &str,
    uid: &str,
    d: Decision,
    expect: &Mutex<Expectations>,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let rs_name = rs.metadata.name.clone().unwrap_or_default();
    for name in &d.adopt {
        let patch = json!({"metadata": {"ownerReferences": [owner(rs)]}});
        pods.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    let creates: Vec<Pod> = (0..d.create).map(|_| pod_for(rs)).collect();
    write_pods(&pods, expect, uid, creates, &d.delete).await?;
    let s = &d.status;
    let unchanged = rs.status.as_ref().is_some_and(|c| {
        c.replicas == s.replicas
            && c.fully_labeled_replicas.unwrap_or(0) == s.fully_labeled
            && c.ready_replicas.unwrap_or(0) == s.ready
            && c.available_replicas.unwrap_or(0) == s.available
            && c.observed_generation.unwrap_or(0) == s.observed_generation
    });
    if !unchanged {
        let status = json!({"status": {
            "replicas": s.replicas, "fullyLabeledReplicas": s.fully_labeled,
            "readyReplicas": s.ready, "availableReplicas": s.available,
            "observedGeneration": s.observed_generation,
        }});
        let api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
        let patched = api
            .patch_status(&rs_name, &PatchParams::default(), &Patch::Merge(status))
            .await;
        match patched {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The controller until the task is dropped.
pub async fn run(client: Client, caches: Caches) {
    let expect = Arc::new(Mutex::new(Expectations::default()));
    crate::control_loop("replicaset-controller", caches, |c| {
        let (client, expect) = (client.clone(), expect.clone());
        async move { sync(&client, &c, &expect).await }
    })
    .await;
}
