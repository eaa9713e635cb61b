//! Acting on the EndpointSlice controller's plans, for every Service.
//! Slices of a deleted Service are the garbage collector's (`gc`), through
//! their ownerReferences, as upstream.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{Pod, Service},
        discovery::v1::EndpointSlice,
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};

use super::{
    Action, MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, desired, plan, selector, selects,
};
use crate::cache::Caches;

/// The time of the newest change among the Service and its pods: creation,
/// a condition's transition, the start of deletion. Upstream tracks the
/// same from its informers.
fn trigger_time(svc: &Service, pods: &[&Pod]) -> String {
    let mut newest: Option<Timestamp> = svc.metadata.creation_timestamp.as_ref().map(|t| t.0);
    for pod in pods {
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        let times = [
            pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            pod.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        ]
        .into_iter()
        .flatten()
        .chain(
            conditions
                .into_iter()
                .flatten()
                .filter_map(|c| c.last_transition_time.as_ref().map(|t| t.0)),
        );
        for t in times {
            newest = Some(newest.map_or(t, |n| n.max(t)));
        }
    }
    newest.unwrap_or_else(Timestamp::now).to_string()
}

pub async fn sync(client: &Client, caches: &Caches) -> anyhow::Result<()> {
    let zones: BTreeMap<String, String> = caches
        .nodes
        .state()
        .iter()
        .filter_map(|n| {
            let zone = n
                .metadata
                .labels
                .as_ref()?
                .get("topology.kubernetes.io/zone")?;
            Some((n.metadata.name.clone()?, zone.clone()))
        })
        .collect();
    let mut slices: BTreeMap<(String, String), Vec<std::sync::Arc<EndpointSlice>>> =
        BTreeMap::new();
    for s in caches.slices.state() {
        let labels = s.metadata.labels.clone().unwrap_or_default();
        if labels.get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY) {
            continue;
        }
        let svc = labels.get(SERVICE_NAME_LABEL).cloned().unwrap_or_default();
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        slices.entry((ns, svc)).or_default().push(s);
    }
    let pods = caches.pods.state();
    let mut first_error = None;
    for svc in caches.services.state() {
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let owned = slices.remove(&(ns.clone(), name)).unwrap_or_default();
        let Some(sel) = selector(&svc) else { continue };
        let selected: Vec<&Pod> = pods
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()) && selects(sel, p))
            .collect();
        let want = desired(&svc, &selected, &zones);
        let owned: Vec<&EndpointSlice> = owned.iter().map(AsRef::as_ref).collect();
        let actions = plan(&svc, &owned, want, &trigger_time(&svc, &selected));
        if let Err(e) = apply(client, &ns, actions).await {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

async fn apply(client: &Client, ns: &str, actions: Vec<Action>) -> anyhow::Result<()> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    for action in actions {
        let done = match &action {
            Action::Create(s) => api.create(&PostParams::default(), s).await.map(drop),
            Action::Update(s) => {
                let name = s.metadata.name.clone().unwrap_or_default();
                api.replace(&name, &PostParams::default(), s)
                    .await
                    .map(drop)
            }
            Action::Delete(name) => api.delete(name, &DeleteParams::default()).await.map(drop),
        };
        match done {
            Ok(()) => {}
            // Gone already: the next pass starts from what is there.
            Err(kube::Error::Api(e)) if e.is_not_found() => {}
            Err(e) => {
                let what = match &action {
                    Action::Create(s) => {
                        format!("creating a slice for {:?}", s.metadata.generate_name)
                    }
                    Action::Update(s) => format!("updating slice {:?}", s.metadata.name),
                    Action::Delete(name) => format!("deleting slice {name:?}"),
                };
                return Err(anyhow::anyhow!("{what} in {ns}: {e}"));
            }
        }
    }
    Ok(())
}

/// The controller until the task is dropped.
pub async fn run(client: Client, caches: Caches) {
    crate::control_loop("endpointslice-controller", caches, |c| {
        let client = client.clone();
        async move { sync(&client, &c).await }
    })
    .await;
}
