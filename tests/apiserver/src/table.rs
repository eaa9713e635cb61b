//! `meta.k8s.io/v1` Table output for `Accept: ...;as=Table`, which kubectl asks
//! for to print its default columns.
use serde_json::{Value, json};

use crate::{convert, resources::ResourceDef};

/// The form a read answers in, from the first type in `Accept` (clients list
/// their preference first and plain JSON last as the fallback).
#[derive(Debug, Clone)]
pub enum View {
    Object,
    /// A Table, with the `includeObject` policy for its rows.
    Table(String),
    /// `PartialObjectMetadata`, what kube-rs's metadata API and
    /// `metadata_watcher` ask for.
    Metadata,
}

impl View {
    pub fn from_accept(accept: &str, include_object: Option<&str>) -> Self {
        let first = accept.split(',').next().unwrap_or_default();
        if first.contains("as=Table") {
            View::Table(include_object.unwrap_or("Metadata").to_string())
        } else if first.contains("as=PartialObjectMetadata") {
            View::Metadata
        } else {
            View::Object
        }
    }

    /// A single object (get, or a watch event).
    pub fn one(&self, res: &'static ResourceDef, obj: &Value) -> Value {
        match self {
            View::Object => obj.clone(),
            View::Table(include) => {
                let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"]});
                table(res, std::slice::from_ref(obj), meta, include)
            }
            View::Metadata => partial(obj),
        }
    }

    /// A list; `items` carry no type meta, as list items on the wire do not.
    pub fn list(&self, res: &'static ResourceDef, items: &[Value], meta: Value) -> Value {
        match self {
            View::Object => json!({
                "kind": format!("{}List", res.kind),
                "apiVersion": res.api_version(),
                "metadata": meta,
                "items": items,
            }),
            View::Table(include) => table(res, items, meta, include),
            View::Metadata => json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": meta,
                "items": items.iter().map(partial).collect::<Vec<_>>(),
            }),
        }
    }
}

fn partial(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

fn col(name: &str, ty: &str, format: &str, priority: u8) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": name, "priority": priority})
}

fn columns(res: &'static ResourceDef) -> Vec<Value> {
    let name = col("Name", "string", "name", 0);
    let age = col("Age", "string", "", 0);
    match (res.group, res.plural) {
        ("", "pods") => vec![
            name,
            col("Ready", "string", "", 0),
            col("Status", "string", "", 0),
            col("Restarts", "string", "", 0),
            age,
            col("IP", "string", "", 1),
            col("Node", "string", "", 1),
        ],
        ("", "services") => vec![
            name,
            col("Type", "string", "", 0),
            col("Cluster-IP", "string", "", 0),
            col("External-IP", "string", "", 0),
            col("Port(s)", "string", "", 0),
            age,
        ],
        ("", "namespaces") => vec![name, col("Status", "string", "", 0), age],
        // Upstream's node printer: roles from node-role labels, wide adds
        // the addresses and nodeInfo.
        ("", "nodes") => vec![
            name,
            col("Status", "string", "", 0),
            col("Roles", "string", "", 0),
            age,
            col("Version", "string", "", 0),
            col("Internal-IP", "string", "", 1),
            col("External-IP", "string", "", 1),
            col("OS-Image", "string", "", 1),
            col("Kernel-Version", "string", "", 1),
            col("Container-Runtime", "string", "", 1),
        ],
        ("", "configmaps") => vec![name, col("Data", "integer", "", 0), age],
        ("", "secrets") => vec![
            name,
            col("Type", "string", "", 0),
            col("Data", "integer", "", 0),
            age,
        ],
        ("discovery.k8s.io", "endpointslices") => vec![
            name,
            col("AddressType", "string", "", 0),
            col("Ports", "string", "", 0),
            col("Endpoints", "string", "", 0),
            age,
        ],
        ("coordination.k8s.io", "leases") => vec![name, col("Holder", "string", "", 0), age],
        ("apps", plural) => {
            let (containers, images, selector) = (
                col("Containers", "string", "", 1),
                col("Images", "string", "", 1),
                col("Selector", "string", "", 1),
            );
            let mut cols = vec![name];
            let counts: &[&str] = match plural {
                "deployments" => &["Ready", "Up-to-date", "Available"],
                "replicasets" => &["Desired", "Current", "Ready"],
                _ => &["Desired", "Current", "Ready", "Up-to-date", "Available"],
            };
            cols.extend(counts.iter().map(|c| {
                col(
                    c,
                    if *c == "Ready" && plural == "deployments" {
                        "string"
                    } else {
                        "integer"
                    },
                    "",
                    0,
                )
            }));
            if plural == "daemonsets" {
                cols.push(col("Node Selector", "string", "", 0));
            }
            cols.extend([age, containers, images, selector]);
            cols
        }
        ("policy", "poddisruptionbudgets") => vec![
            name,
            col("Min Available", "string", "", 0),
            col("Max Unavailable", "string", "", 0),
            col("Allowed Disruptions", "integer", "", 0),
            age,
        ],
        // Both Event APIs print alike upstream (one printer for one resource).
        (_, "events") => vec![
            col("Last Seen", "string", "", 0),
            col("Type", "string", "", 0),
            col("Reason", "string", "", 0),
            col("Object", "string", "", 0),
            col("Subobject", "string", "", 1),
            col("Source", "string", "", 1),
            col("Message", "string", "", 0),
            col("First Seen", "string", "", 1),
            col("Count", "integer", "", 1),
            col("Name", "string", "name", 1),
        ],
        _ => vec![name, age],
    }
}

fn s<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

/// kubectl's STATUS of a pod, as upstream's printPod derives it: the
/// phase (or status.reason), then the first unfinished init container's
/// state, else the last container with a waiting or terminated reason
/// (ImagePullBackOff, CrashLoopBackOff, Completed, Error, …); Terminating
/// once deleted.
fn pod_status(obj: &Value) -> String {
    let list = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let exit = |t: &Value| -> String {
        match t["signal"].as_i64().filter(|s| *s != 0) {
            Some(sig) => format!("Signal:{sig}"),
            None => format!("ExitCode:{}", t["exitCode"].as_i64().unwrap_or(0)),
        }
    };
    let mut reason = match s(obj, "/status/reason") {
        "" => s(obj, "/status/phase").to_owned(),
        r => r.to_owned(),
    };
    let inits = list("/status/initContainerStatuses");
    let total_inits = list("/spec/initContainers").len();
    let mut initializing = false;
    for (i, c) in inits.iter().enumerate() {
        let (t, w) = (&c["state"]["terminated"], &c["state"]["waiting"]);
        if t.is_object() && t["exitCode"].as_i64() == Some(0) {
            continue;
        }
        initializing = true;
        reason = if t.is_object() {
            match t["reason"].as_str().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None => format!("Init:{}", exit(t)),
            }
        } else {
            match w["reason"].as_str() {
                Some(r) if !r.is_empty() && r != "PodInitializing" => format!("Init:{r}"),
                _ => format!("Init:{i}/{total_inits}"),
            }
        };
        break;
    }
    if !initializing {
        let mut running = false;
        for c in list("/status/containerStatuses").iter().rev() {
            let (t, w) = (&c["state"]["terminated"], &c["state"]["waiting"]);
            if let Some(r) = w["reason"].as_str().filter(|r| !r.is_empty()) {
                reason = r.to_owned();
            } else if let Some(r) = t["reason"].as_str().filter(|r| !r.is_empty()) {
                reason = r.to_owned();
            } else if t.is_object() {
                reason = exit(t);
            } else if c["ready"] == json!(true) && c["state"]["running"].is_object() {
                running = true;
            }
        }
        if reason == "Completed" && running {
            reason = "Running".to_owned();
        }
    }
    if !obj
        .pointer("/metadata/deletionTimestamp")
        .is_none_or(Value::is_null)
    {
        reason = if s(obj, "/status/reason") == "NodeLost" {
            "Unknown".to_owned()
        } else {
            "Terminating".to_owned()
        };
    }
    reason
}

fn or_none(v: String) -> String {
    if v.is_empty() { "<none>".into() } else { v }
}

fn cells(res: &'static ResourceDef, obj: &Value) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let age = json!(age(s(obj, "/metadata/creationTimestamp")));
    let arr = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    match (res.group, res.plural) {
        ("", "pods") => {
            let total = arr("/spec/containers").len();
            let statuses = arr("/status/containerStatuses");
            let ready = statuses
                .iter()
                .filter(|c| c["ready"] == json!(true))
                .count();
            let restarts: i64 = statuses
                .iter()
                .filter_map(|c| c["restartCount"].as_i64())
                .sum();
            let status = pod_status(obj);
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts.to_string()),
                age,
                json!(or_none(s(obj, "/status/podIP").into())),
                json!(or_none(s(obj, "/spec/nodeName").into())),
            ]
        }
        ("", "services") => {
            let ports: Vec<String> = arr("/spec/ports")
                .iter()
                .map(|p| match p["nodePort"].as_u64() {
                    Some(np) => format!(
                        "{}:{np}/{}",
                        p["port"],
                        p["protocol"].as_str().unwrap_or("TCP")
                    ),
                    None => format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP")),
                })
                .collect();
            let external: Vec<String> = arr("/status/loadBalancer/ingress")
                .iter()
                .filter_map(|i| {
                    i["ip"]
                        .as_str()
                        .or(i["hostname"].as_str())
                        .map(String::from)
                })
                .collect();
            vec![
                name,
                json!(s(obj, "/spec/type")),
                json!(or_none(s(obj, "/spec/clusterIP").into())),
                json!(or_none(external.join(","))),
                json!(or_none(ports.join(","))),
                age,
            ]
        }
        ("", "namespaces") => vec![name, json!(s(obj, "/status/phase")), age],
        ("", "nodes") => {
            let mut status = match arr("/status/conditions")
                .iter()
                .find(|c| c["type"] == "Ready")
                .and_then(|c| c["status"].as_str())
            {
                Some("True") => "Ready",
                Some("False") => "NotReady",
                _ => "Unknown",
            }
            .to_owned();
            if obj.pointer("/spec/unschedulable") == Some(&json!(true)) {
                status.push_str(",SchedulingDisabled");
            }
            let mut roles: Vec<&str> = obj["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
                .filter(|r| !r.is_empty())
                .collect();
            roles.sort_unstable();
            let address = |kind: &str| {
                arr("/status/addresses")
                    .iter()
                    .find(|a| a["type"] == kind)
                    .and_then(|a| a["address"].as_str())
                    .unwrap_or("<none>")
                    .to_owned()
            };
            vec![
                name,
                json!(status),
                json!(or_none(roles.join(","))),
                age,
                json!(s(obj, "/status/nodeInfo/kubeletVersion")),
                json!(address("InternalIP")),
                json!(address("ExternalIP")),
                json!(or_none(s(obj, "/status/nodeInfo/osImage").into())),
                json!(or_none(s(obj, "/status/nodeInfo/kernelVersion").into())),
                json!(or_none(
                    s(obj, "/status/nodeInfo/containerRuntimeVersion").into()
                )),
            ]
        }
        ("", "configmaps") => {
            let n = obj["data"].as_object().map_or(0, |m| m.len())
                + obj["binaryData"].as_object().map_or(0, |m| m.len());
            vec![name, json!(n), age]
        }
        ("", "secrets") => {
            let n = obj["data"].as_object().map_or(0, |m| m.len());
            vec![name, json!(s(obj, "/type")), json!(n), age]
        }
        ("discovery.k8s.io", "endpointslices") => {
            let ports: Vec<String> = arr("/ports")
                .iter()
                .map(|p| p["port"].to_string())
                .collect();
            let eps: Vec<String> = arr("/endpoints")
                .iter()
                .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                .filter_map(|a| a.as_str().map(String::from))
                .collect();
            vec![
                name,
                json!(s(obj, "/addressType")),
                json!(or_none(ports.join(","))),
                json!(or_none(eps.join(","))),
                age,
            ]
        }
        ("coordination.k8s.io", "leases") => {
            vec![
                name,
                json!(or_none(s(obj, "/spec/holderIdentity").into())),
                age,
            ]
        }
        ("apps", plural) => apps_cells(plural, obj, name, age),
        ("policy", "poddisruptionbudgets") => {
            // An int or a percentage; N/A when unset.
            let bound = |v: &Value| match v {
                Value::Null => "N/A".to_string(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            vec![
                name,
                json!(bound(&obj["spec"]["minAvailable"])),
                json!(bound(&obj["spec"]["maxUnavailable"])),
                json!(obj["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
                age,
            ]
        }
        (_, "events") => event_cells(&convert::to_storage(res, obj.clone())),
        _ => vec![name, age],
    }
}

/// Upstream's `printDeployment`, `printReplicaSet`, `printDaemonSet`.
fn apps_cells(plural: &str, obj: &Value, name: Value, age: Value) -> Vec<Value> {
    let n = |p: &str| json!(obj.pointer(p).and_then(Value::as_i64).unwrap_or(0));
    let mut cells = vec![name];
    match plural {
        "deployments" => cells.extend([
            json!(format!(
                "{}/{}",
                n("/status/readyReplicas"),
                n("/spec/replicas")
            )),
            n("/status/updatedReplicas"),
            n("/status/availableReplicas"),
        ]),
        "replicasets" => cells.extend([
            n("/spec/replicas"),
            n("/status/replicas"),
            n("/status/readyReplicas"),
        ]),
        _ => {
            cells.extend([
                n("/status/desiredNumberScheduled"),
                n("/status/currentNumberScheduled"),
                n("/status/numberReady"),
                n("/status/updatedNumberScheduled"),
                n("/status/numberAvailable"),
            ]);
            let node_selector: Vec<String> = obj
                .pointer("/spec/template/spec/nodeSelector")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            cells.push(json!(or_none(node_selector.join(","))));
        }
    }
    let containers: Vec<&Value> = obj
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let joined = |field: &str| {
        containers
            .iter()
            .filter_map(|c| c[field].as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    let selector = crate::apps::scale_of(obj)["status"]["selector"].clone();
    cells.extend([age, json!(joined("name")), json!(joined("image")), selector]);
    cells
}

/// An Event's cells from its core/v1 form, as upstream's `printEvent`: the
/// events.k8s.io API leaves the deprecated timestamps and count unset, so
/// `eventTime` and `series` stand in for them.
fn event_cells(ev: &Value) -> Vec<Value> {
    let first = match s(ev, "/firstTimestamp") {
        "" => age(s(ev, "/eventTime")),
        t => age(t),
    };
    let mut last = match s(ev, "/lastTimestamp") {
        "" => first.clone(),
        t => age(t),
    };
    let mut count = ev["count"].as_i64().unwrap_or(0);
    if ev["series"].is_object() {
        last = age(s(ev, "/series/lastObservedTime"));
        count = ev["series"]["count"].as_i64().unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let kind = s(ev, "/involvedObject/kind").to_lowercase();
    let target = match s(ev, "/involvedObject/name") {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let non_empty = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            a.to_string()
        }
    };
    let component = non_empty(s(ev, "/source/component"), s(ev, "/reportingComponent"));
    let instance = non_empty(s(ev, "/source/host"), s(ev, "/reportingInstance"));
    let source = match (component.is_empty(), instance.is_empty()) {
        (true, _) => "<unknown>".to_string(),
        (false, true) => component,
        (false, false) => format!("{component}, {instance}"),
    };
    vec![
        json!(last),
        json!(s(ev, "/type")),
        json!(s(ev, "/reason")),
        json!(target),
        json!(s(ev, "/involvedObject/fieldPath")),
        json!(source),
        json!(s(ev, "/message").trim()),
        json!(first),
        json!(count),
        json!(s(ev, "/metadata/name")),
    ]
}

/// One row; `include` is the `includeObject` parameter (default Metadata).
fn row(res: &'static ResourceDef, obj: &Value, include: &str) -> Value {
    let mut row = json!({"cells": cells(res, obj)});
    match include {
        "None" => {}
        "Object" => row["object"] = obj.clone(),
        _ => {
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            })
        }
    }
    row
}

fn table(res: &'static ResourceDef, objs: &[Value], list_meta: Value, include: &str) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": columns(res),
        "rows": objs.iter().map(|o| row(res, o, include)).collect::<Vec<_>>(),
    })
}

/// kubectl's `duration.HumanDuration`.
pub fn age(created: &str) -> String {
    let Ok(t) = created.parse::<jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - t.as_second()).max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    match secs {
        _ if secs < 120 => format!("{secs}s"),
        _ if m < 10 => format!("{m}m{}s", secs % 60),
        _ if m < 180 => format!("{m}m"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if h < 48 => format!("{h}h"),
        _ if h < 192 => format!("{d}d{}h", h % 24),
        _ if d < 730 => format!("{d}d"),
        _ => format!("{}y{}d", d / 365, d % 365),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::pod_status;

    #[test]
    fn pod_status_follows_upstreams_printer() {
        let waiting = |r: &str| json!({"state": {"waiting": {"reason": r}}});
        let cases = [
            (json!({"status": {"phase": "Pending"}}), "Pending"),
            (
                json!({"status": {"phase": "Pending",
                                  "containerStatuses": [waiting("ImagePullBackOff")]}}),
                "ImagePullBackOff",
            ),
            (
                json!({"status": {"phase": "Running", "containerStatuses": [
                    {"ready": true, "state": {"running": {}}},
                    waiting("CrashLoopBackOff")]}}),
                "CrashLoopBackOff",
            ),
            (
                json!({"spec": {"initContainers": [{}, {}]},
                       "status": {"phase": "Pending", "initContainerStatuses": [
                           {"state": {"terminated": {"exitCode": 0}}},
                           {"state": {"running": {}}}]}}),
                "Init:1/2",
            ),
            (
                json!({"status": {"phase": "Failed", "containerStatuses": [
                    {"state": {"terminated": {"exitCode": 137, "signal": 9}}}]}}),
                "Signal:9",
            ),
            (
                json!({"status": {"phase": "Failed", "reason": "Evicted"}}),
                "Evicted",
            ),
            (
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
                       "status": {"phase": "Running"}}),
                "Terminating",
            ),
        ];
        for (pod, want) in cases {
            assert_eq!(pod_status(&pod), want, "{pod}");
        }
    }
}
