//! Acting on the DaemonSet controller's decisions.
use std::sync::{Arc, Mutex};

use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{Node, Pod},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{Decision, decide, pod_for};
use crate::{
    cache::Caches,
    expectations::{Expectations, write_pods},
    replicasets::controller_of,
};

pub async fn sync(
    client: &Client,
    caches: &Caches,
    expect: &Mutex<Expectations>,
) -> anyhow::Result<()> {
    let (pods, nodes) = (caches.pods.state(), caches.nodes.state());
    let nodes: Vec<&Node> = nodes.iter().map(AsRef::as_ref).collect();
    let now = Timestamp::now();
    for ds in caches.daemonsets.state() {
        let uid = ds.metadata.uid.clone().unwrap_or_default();
        let all_owned: Vec<&Pod> = pods
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| controller_of(&p.metadata).is_some_and(|o| o.uid == uid))
            .collect();
        let ready = expect
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .satisfied_by(&uid, &all_owned);
        if !ready || ds.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let owned: Vec<&Pod> = all_owned
            .iter()
            .copied()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        act(client, &ds, &uid, decide(&ds, &nodes, &owned, now), expect).await?;
    }
    Ok(())
}

async fn act(
    client: &Client,
    ds: &DaemonSet,
    uid: &str,
    d: Decision,
    expect: &Mutex<Expectations>,
) -> anyhow::Result<()> {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let creates: Vec<Pod> = d.create.iter().map(|node| pod_for(ds, node)).collect();
    write_pods(&pods, expect, uid, creates, &d.delete).await?;
    let s = &d.status;
    let c = ds.status.clone().unwrap_or_default();
    let same = c.desired_number_scheduled == s.desired
        && c.current_number_scheduled == s.current
        && c.number_misscheduled == s.misscheduled
        && c.number_ready == s.ready
        && c.updated_number_scheduled.unwrap_or(0) == s.updated
        && c.number_available.unwrap_or(0) == s.available
        && c.number_unavailable.unwrap_or(0) == s.unavailable
        && c.observed_generation.unwrap_or(0) == s.observed_generation;
    if same {
        return Ok(());
    }
    let status = json!({"status": {
        "desiredNumberScheduled": s.desired, "currentNumberScheduled": s.current,
        "numberMisscheduled": s.misscheduled, "numberReady": s.ready,
        "updatedNumberScheduled": s.updated, "numberAvailable": s.available,
        "numberUnavailable": s.unavailable, "observedGeneration": s.observed_generation,
    }});
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let name = ds.metadata.name.clone().unwrap_or_default();
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The controller until the task is dropped.
pub async fn run(client: Client, caches: Caches) {
    let expect = Arc::new(Mutex::new(Expectations::default()));
    crate::control_loop("daemonset-controller", caches, |c| {
        let (client, expect) = (client.clone(), expect.clone());
        async move { sync(&client, &c, &expect).await }
    })
    .await;
}
