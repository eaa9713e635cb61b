//! The EndpointSlice controller's decision, as upstream's
//! (`pkg/controller/endpointslice` and its reconciler): which endpoints a
//! Service has, grouped by their resolved ports, at most 100 per slice,
//! and which creates, updates and deletes turn the existing slices into
//! those. IPv4 only: test clusters have one address family.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{ObjectReference, Pod, Service, ServicePort},
        discovery::v1::{
            Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForZone,
        },
    },
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};

use crate::pods::is_ready;

pub mod run;

pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// What a slice holds, the part the controller compares.
#[derive(Debug, Clone, PartialEq)]
pub struct Content {
    pub ports: Vec<EndpointPort>,
    pub endpoints: Vec<Endpoint>,
}

impl Content {
    fn of(slice: &EndpointSlice) -> Self {
        Content {
            ports: slice.ports.clone().unwrap_or_default(),
            endpoints: slice.endpoints.clone(),
        }
    }
}

/// The selector of a Service whose slices this controller manages: a
/// Service without one has hand-written slices.
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

pub fn selects(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Upstream's `ShouldPodBeInEndpoints` with terminating pods included: an
/// address, and not finished for good.
pub fn has_endpoint(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let ip = status.and_then(|s| s.pod_ip.as_deref()).unwrap_or_default();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or_default();
    let restart = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let terminal = match restart {
        "Never" => matches!(phase, "Succeeded" | "Failed"),
        "OnFailure" => phase == "Succeeded",
        _ => false,
    };
    !ip.is_empty() && ip.parse::<std::net::Ipv4Addr>().is_ok() && !terminal
}

/// The pod's port for a Service port: a number as it is, a name looked up
/// among the containers' ports of the same protocol.
fn target_port(sp: &ServicePort, pod: &Pod) -> Option<i32> {
    let protocol = sp.protocol.as_deref().unwrap_or("TCP");
    match &sp.target_port {
        None => Some(sp.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| {
                p.name.as_deref() == Some(name)
                    && p.protocol.as_deref().unwrap_or("TCP") == protocol
            })
            .map(|p| p.container_port),
    }
}

/// The endpoint of a pod: `ready` only when serving and not terminating,
/// unless the Service publishes not-ready addresses.
fn endpoint(svc: &Service, pod: &Pod, zones: &BTreeMap<String, String>) -> Endpoint {
    let spec = pod.spec.as_ref();
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        == Some(true);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let serving = publish || is_ready(pod);
    let node = spec.and_then(|s| s.node_name.clone());
    let hostname = spec
        .filter(|s| s.subdomain.is_some() && s.subdomain == svc.metadata.name)
        .and_then(|s| s.hostname.clone());
    Endpoint {
        addresses: vec![
            pod.status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_default(),
        ],
        conditions: Some(EndpointConditions {
            ready: Some(publish || (serving && !terminating)),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname,
        zone: node.as_ref().and_then(|n| zones.get(n).cloned()),
        node_name: node,
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

/// The slices a Service should have: endpoints grouped by their ports,
/// sorted by address, cut into slices of 100; one empty slice when there
/// are none, as upstream keeps a placeholder.
pub fn desired(svc: &Service, pods: &[&Pod], zones: &BTreeMap<String, String>) -> Vec<Content> {
    let service_ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    // Ports as (name, port, protocol, appProtocol): EndpointPort is not Ord.
    type Key = Vec<(Option<String>, Option<i32>, Option<String>, Option<String>)>;
    let mut groups: BTreeMap<Key, Vec<Endpoint>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| has_endpoint(p)) {
        let key: Key = service_ports
            .iter()
            .filter_map(|sp| {
                let port = target_port(sp, pod)?;
                Some((
                    sp.name.clone(),
                    Some(port),
                    Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                    sp.app_protocol.clone(),
                ))
            })
            .collect();
        groups
            .entry(key)
            .or_default()
            .push(endpoint(svc, pod, zones));
    }
    let hints = hints_wanted(svc) && groups.values().flatten().all(|e| e.zone.is_some());
    let mut out = Vec::new();
    for (key, mut endpoints) in groups {
        endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
        if hints {
            for e in &mut endpoints {
                e.hints = Some(EndpointHints {
                    for_zones: Some(vec![ForZone {
                        name: e.zone.clone().unwrap_or_default(),
                    }]),
                    ..EndpointHints::default()
                });
            }
        }
        let ports: Vec<EndpointPort> = key
            .into_iter()
            .map(|(name, port, protocol, app_protocol)| EndpointPort {
                name,
                port,
                protocol,
                app_protocol,
            })
            .collect();
        for chunk in endpoints.chunks(MAX_ENDPOINTS_PER_SLICE) {
            out.push(Content {
                ports: ports.clone(),
                endpoints: chunk.to_vec(),
            });
        }
    }
    if out.is_empty() {
        out.push(Content {
            ports: Vec::new(),
            endpoints: Vec::new(),
        });
    }
    out
}

/// `trafficDistribution: PreferClose` (or its newer name) asks for zone
/// hints.
fn hints_wanted(svc: &Service) -> bool {
    matches!(
        svc.spec
            .as_ref()
            .and_then(|s| s.traffic_distribution.as_deref()),
        Some("PreferClose" | "PreferSameZone")
    )
}

/// A slice's labels: the Service's own (except the two the controller
/// owns), its name and the controller's.
pub fn labels(svc: &Service) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = svc
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k != MANAGED_BY_LABEL && k != SERVICE_NAME_LABEL)
        .collect();
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        out.insert("service.kubernetes.io/headless".into(), String::new());
    }
    out.insert(
        SERVICE_NAME_LABEL.into(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    out.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    out
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Create(EndpointSlice),
    /// The existing slice, rewritten (its resourceVersion kept).
    Update(EndpointSlice),
    Delete(String),
}

/// The writes that turn `existing` (this Service's slices) into `desired`.
/// A slice that already holds a desired content is left alone; the rest
/// are rewritten in name order before any is created or deleted, so an
/// endpoint change is one update. `trigger` is the time of the change that
/// caused this (the trigger-time annotation on written slices).
pub fn plan(
    svc: &Service,
    existing: &[&EndpointSlice],
    desired: Vec<Content>,
    trigger: &str,
) -> Vec<Action> {
    let labels = labels(svc);
    let mut existing: Vec<&EndpointSlice> = existing.to_vec();
    existing.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut left: Vec<Content> = Vec::new();
    for want in desired {
        let same = existing
            .iter()
            .position(|s| Content::of(s) == want && s.metadata.labels.as_ref() == Some(&labels));
        match same {
            Some(i) => {
                existing.remove(i);
            }
            None => left.push(want),
        }
    }
    let mut reuse = existing.into_iter();
    let mut actions = Vec::new();
    for want in left {
        match reuse.next() {
            Some(old) => {
                let mut slice = old.clone();
                slice.metadata.labels = Some(labels.clone());
                slice
                    .metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(TRIGGER_TIME.into(), trigger.into());
                slice.ports = Some(want.ports);
                slice.endpoints = want.endpoints;
                actions.push(Action::Update(slice));
            }
            None => actions.push(Action::Create(new_slice(svc, &labels, want, trigger))),
        }
    }
    actions.extend(reuse.map(|s| Action::Delete(s.metadata.name.clone().unwrap_or_default())));
    actions
}

fn new_slice(
    svc: &Service,
    labels: &BTreeMap<String, String>,
    content: Content,
    trigger: &str,
) -> EndpointSlice {
    let name = svc.metadata.name.clone().unwrap_or_default();
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: svc.metadata.namespace.clone(),
            labels: Some(labels.clone()),
            annotations: Some(BTreeMap::from([(TRIGGER_TIME.into(), trigger.into())])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name,
                uid: svc.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints: content.endpoints,
        ports: Some(content.ports),
    }
}

#[cfg(test)]
mod tests;
