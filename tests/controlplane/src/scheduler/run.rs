//! Acting on the scheduler's decisions: bind through `pods/binding`, or
//! record why a pod cannot be placed (the PodScheduled condition and a
//! FailedScheduling Event, as `kubectl describe pod` shows them).
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::{
    Api, Client, Resource as _,
    api::{Patch, PatchParams, PostParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use serde_json::json;

use super::{Candidate, schedule};
use crate::{
    cache::Caches,
    pods::{is_active, is_terminal},
};

pub const NAME: &str = "default-scheduler";

/// Whether the scheduler should place `pod`.
pub fn is_pending(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let unbound = spec
        .and_then(|s| s.node_name.as_deref())
        .is_none_or(str::is_empty);
    let ours = spec
        .and_then(|s| s.scheduler_name.as_deref())
        .is_none_or(|n| n == NAME);
    unbound && ours && is_active(pod)
}

/// One pass: every pending pod, oldest first, against the nodes as they are
/// plus the pods bound earlier in the pass.
pub async fn sync(client: &Client, caches: &Caches, recorder: &Recorder) -> anyhow::Result<()> {
    let mut nodes = caches.nodes.state();
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut candidates: Vec<Candidate<'_>> = nodes.iter().map(|n| Candidate::new(n)).collect();
    let index: BTreeMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.metadata.name.clone().unwrap_or_default(), i))
        .collect();
    let pods = caches.pods.state();
    for p in pods.iter().filter(|p| !is_terminal(p)) {
        let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if let Some(&i) = node.and_then(|n| index.get(n)) {
            candidates[i].assume(p);
        }
    }
    let mut pending: Vec<_> = pods.iter().filter(|p| is_pending(p)).collect();
    pending.sort_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
    });
    for pod in pending {
        match schedule(pod, &candidates) {
            Ok(node) => {
                bind(client, pod, &node).await?;
                if let Some(&i) = index.get(&node) {
                    candidates[i].assume(pod);
                }
                let (ns, name) = (
                    namespace(pod),
                    pod.metadata.name.clone().unwrap_or_default(),
                );
                let note = format!("Successfully assigned {ns}/{name} to {node}");
                publish(recorder, pod, EventType::Normal, "Scheduled", note).await;
            }
            Err(why) => unschedulable(client, recorder, pod, &why.to_string()).await?,
        }
    }
    Ok(())
}

fn namespace(pod: &Pod) -> String {
    pod.metadata.namespace.clone().unwrap_or_default()
}

async fn bind(client: &Client, pod: &Pod, node: &str) -> anyhow::Result<()> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &namespace(pod));
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace(pod), "uid": pod.metadata.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let bound: Result<serde_json::Value, _> = api
        .create_subresource("binding", &name, &PostParams::default(), &binding)
        .await;
    match bound {
        Ok(_) => Ok(()),
        // Bound or deleted since the cache saw it: the next pass sees that.
        Err(kube::Error::Api(e)) if e.is_not_found() || e.is_conflict() => {
            tracing::debug!("binding {name}: {}", e.message);
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Sets PodScheduled=False with the reason, once per distinct message.
async fn unschedulable(
    client: &Client,
    recorder: &Recorder,
    pod: &Pod,
    message: &str,
) -> anyhow::Result<()> {
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled");
    if current.is_some_and(|c| c.status == "False" && c.message.as_deref() == Some(message)) {
        return Ok(());
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &namespace(pod));
    let patch = json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
        "lastProbeTime": null, "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    }]}});
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    publish(
        recorder,
        pod,
        EventType::Warning,
        "FailedScheduling",
        message.to_string(),
    )
    .await;
    Ok(())
}

async fn publish(recorder: &Recorder, pod: &Pod, type_: EventType, reason: &str, note: String) {
    let reference: ObjectReference = pod.object_ref(&());
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Binding".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!("event for pod {:?}: {e}", pod.metadata.name);
    }
}

/// The scheduler until the task is dropped.
pub async fn run(client: Client, caches: Caches) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: NAME.into(),
            instance: None,
        },
    );
    crate::control_loop("scheduler", caches.clone(), |c| {
        let (client, recorder) = (client.clone(), recorder.clone());
        async move { sync(&client, &c, &recorder).await }
    })
    .await;
}
