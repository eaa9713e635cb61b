//! The garbage collector: an object whose owners are all gone is deleted
//! (background propagation, what `kubectl delete` asks for). Owners of a
//! kind this control plane does not cache count as alive, so nothing is
//! deleted for want of a cache.
use std::collections::HashSet;

use k8s_openapi::{
    api::{apps::v1::ReplicaSet, core::v1::Pod, discovery::v1::EndpointSlice},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{DeleteParams, PropagationPolicy},
};

use crate::cache::Caches;

/// The owner kinds whose every live object is in the caches.
pub const CACHED_OWNERS: &[&str] = &[
    "DaemonSet",
    "Deployment",
    "ReplicaSet",
    "Service",
    "Node",
    "Pod",
];

/// Whether every owner of `meta` is gone.
pub fn is_orphaned(meta: &ObjectMeta, live: &HashSet<String>) -> bool {
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    !owners.is_empty()
        && meta.deletion_timestamp.is_none()
        && owners
            .iter()
            .all(|o| CACHED_OWNERS.contains(&o.kind.as_str()) && !live.contains(&o.uid))
}

fn uids<K: kube::Resource>(objs: &[std::sync::Arc<K>]) -> impl Iterator<Item = String> + '_ {
    objs.iter().filter_map(|o| o.meta().uid.clone())
}

pub async fn sync(client: &Client, caches: &Caches) -> anyhow::Result<()> {
    let (pods, rss, slices) = (
        caches.pods.state(),
        caches.replicasets.state(),
        caches.slices.state(),
    );
    let (deployments, services, nodes, daemonsets) = (
        caches.deployments.state(),
        caches.services.state(),
        caches.nodes.state(),
        caches.daemonsets.state(),
    );
    let live: HashSet<String> = uids(&pods)
        .chain(uids(&rss))
        .chain(uids(&deployments))
        .chain(uids(&services))
        .chain(uids(&nodes))
        .chain(uids(&daemonsets))
        .collect();
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    for rs in rss.iter().filter(|o| is_orphaned(&o.metadata, &live)) {
        delete::<ReplicaSet>(client, &rs.metadata, &dp).await?;
    }
    for pod in pods.iter().filter(|o| is_orphaned(&o.metadata, &live)) {
        delete::<Pod>(client, &pod.metadata, &dp).await?;
    }
    for s in slices.iter().filter(|o| is_orphaned(&o.metadata, &live)) {
        delete::<EndpointSlice>(client, &s.metadata, &dp).await?;
    }
    Ok(())
}

async fn delete<K>(client: &Client, meta: &ObjectMeta, dp: &DeleteParams) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(
        client.clone(),
        meta.namespace.as_deref().unwrap_or_default(),
    );
    let name = meta.name.as_deref().unwrap_or_default();
    tracing::debug!("garbage-collecting {} {name}", K::kind(&()));
    match api.delete(name, dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The collector until the task is dropped.
pub async fn run(client: Client, caches: Caches) {
    crate::control_loop("garbage-collector", caches, |c| {
        let client = client.clone();
        async move { sync(&client, &c).await }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn meta(owners: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(json!({"name": "x", "ownerReferences": owners})).unwrap()
    }

    #[test]
    fn only_objects_whose_every_known_owner_is_gone() {
        let live = HashSet::from(["alive".to_string()]);
        let owner = |kind: &str, uid: &str| json!({"apiVersion": "v1", "kind": kind, "name": "o", "uid": uid});
        let cases = [
            (json!([]), false),
            (json!([owner("ReplicaSet", "gone")]), true),
            (json!([owner("ReplicaSet", "alive")]), false),
            (
                json!([owner("ReplicaSet", "gone"), owner("Service", "alive")]),
                false,
            ),
            (json!([owner("StatefulSet", "gone")]), false),
        ];
        for (owners, want) in cases {
            assert_eq!(is_orphaned(&meta(owners.clone()), &live), want, "{owners}");
        }
    }
}
