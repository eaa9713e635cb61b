//! Legacy discovery (`/api`, `/apis`, resource lists) and just enough OpenAPI
//! for kubectl: v3 has a PATCH operation per kind that lists the
//! `fieldValidation` parameter, so `kubectl apply` leaves validation to the
//! server instead of downloading schemas. Aggregated discovery is not offered;
//! kubectl falls back to the legacy documents when the response is plain
//! `application/json`.
//!
//! v2 is a document without definitions. kubectl reads it for one thing: a
//! `kind: List` cannot be checked through v3 (kubectl's query-parameter
//! verifier refuses `v1/List` outright), so `apply --validate=strict` checks
//! each item against v2's definitions, and skips an item whose kind has none.
//! Without v2, `kubectl apply -f` of a List failed on the 404.
use serde_json::{Value, json};

use crate::resources::{self, RESOURCES, ResourceDef};

pub const SERVER_VERSION: &str = "v1.35.0";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "emulationMajor": "1",
        "emulationMinor": "35",
        "gitVersion": format!("{SERVER_VERSION}-weir-test"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub fn api_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}],
    })
}

fn group(name: &str) -> Value {
    let gv = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
    json!({"name": name, "versions": [gv], "preferredVersion": gv})
}

pub fn api_group_list() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": resources::groups().into_iter().map(group).collect::<Vec<_>>(),
    })
}

pub fn api_group(name: &str) -> Option<Value> {
    resources::groups().contains(&name).then(|| {
        let mut g = group(name);
        g["kind"] = json!("APIGroup");
        g["apiVersion"] = json!("v1");
        g
    })
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn entry(r: &ResourceDef) -> Value {
    let mut e = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": VERBS,
    });
    if !r.short_names.is_empty() {
        e["shortNames"] = json!(r.short_names);
    }
    if matches!(
        (r.group, r.plural),
        ("", "pods" | "services") | ("apps", "deployments" | "replicasets" | "daemonsets")
    ) {
        e["categories"] = json!(["all"]);
    }
    e
}

pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut list = Vec::new();
    for r in resources::in_group_version(group, version) {
        list.push(entry(r));
        if r.status_subresource {
            list.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if crate::apps::has_scale(r) {
            list.push(json!({
                "name": format!("{}/scale", r.plural), "singularName": "", "namespaced": true,
                "group": "autoscaling", "version": "v1", "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
        if r.group.is_empty() && r.plural == "pods" {
            // `kubectl drain` evicts only when it finds `pods/eviction` here
            // (with its group and version); otherwise it deletes, ignoring
            // PodDisruptionBudgets.
            list.push(json!({
                "name": "pods/binding", "singularName": "", "namespaced": true,
                "kind": "Binding", "verbs": ["create"],
            }));
            list.push(json!({
                "name": "pods/eviction", "singularName": "", "namespaced": true,
                "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"],
            }));
            // Served by the pod's kubelet (`kubelet_proxy`).
            for (sub, kind, verbs) in [
                ("attach", "PodAttachOptions", json!(["create", "get"])),
                ("exec", "PodExecOptions", json!(["create", "get"])),
                ("log", "Pod", json!(["get"])),
                (
                    "portforward",
                    "PodPortForwardOptions",
                    json!(["create", "get"]),
                ),
            ] {
                list.push(json!({
                    "name": format!("pods/{sub}"), "singularName": "", "namespaced": true,
                    "kind": kind, "verbs": verbs,
                }));
            }
        }
        if r.group.is_empty() && r.plural == "serviceaccounts" {
            list.push(json!({
                "name": "serviceaccounts/token", "singularName": "", "namespaced": true,
                "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest",
                "verbs": ["create"],
            }));
        }
    }
    if list.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}),
    )
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

pub fn openapi_root() -> Value {
    let mut paths = serde_json::Map::new();
    let mut seen = Vec::new();
    for r in RESOURCES {
        let p = gv_path(r.group, r.version);
        if !seen.contains(&p) {
            let url = format!("/openapi/v3/{p}?hash={}", SERVER_VERSION.replace('.', ""));
            paths.insert(p.clone(), json!({"serverRelativeURL": url}));
            seen.push(p);
        }
    }
    json!({"paths": paths})
}

/// The OpenAPI v3 document for one group/version: operations only, no schemas.
pub fn openapi_gv(path: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for r in RESOURCES
        .iter()
        .filter(|r| gv_path(r.group, r.version) == path)
    {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let item = if r.namespaced {
            format!("/{path}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("/{path}/{}/{{name}}", r.plural)
        };
        let params = json!([
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            {"name": "force", "in": "query", "schema": {"type": "boolean"}},
        ]);
        let op = |verb: &str| {
            json!({
                "operationId": format!("{verb}{}", r.kind),
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": verb,
                "x-kubernetes-group-version-kind": gvk,
            })
        };
        paths.insert(item, json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION},
        "paths": paths,
        "components": {},
    }))
}

/// The media types of `/openapi/v2` as protobuf: kubectl asks for the first
/// (and accepts nothing else), which is not a valid media type, so the real
/// server answers with the second; Go's client fails on the first.
pub const OPENAPI_V2_PROTOBUF_ASKED: &str =
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
pub const OPENAPI_V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// `/openapi/v2` as JSON: no paths, no definitions (see the module docs).
pub fn openapi_v2_json() -> Value {
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION},
        "paths": {},
        "definitions": {},
    })
}

/// [`openapi_v2_json`] as gnostic's `openapi.v2.Document` protobuf: `swagger`
/// is field 1, `info` 2 (its `title` 1, `version` 2), `paths` 8 and
/// `definitions` 9 (both empty messages).
pub fn openapi_v2_protobuf() -> Vec<u8> {
    let mut info = Vec::new();
    proto_bytes(&mut info, 1, b"Kubernetes");
    proto_bytes(&mut info, 2, SERVER_VERSION.as_bytes());
    let mut doc = Vec::new();
    proto_bytes(&mut doc, 1, b"2.0");
    proto_bytes(&mut doc, 2, &info);
    proto_bytes(&mut doc, 8, &[]);
    proto_bytes(&mut doc, 9, &[]);
    doc
}

/// A length-delimited field (wire type 2).
fn proto_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    proto_varint(out, (field << 3) | 2);
    proto_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn proto_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_v2_protobuf_is_the_json_document() {
        // Hand-decoded: tag, length, bytes for each field in order.
        let v = SERVER_VERSION.len() as u8;
        let want: Vec<u8> = [
            &[0x0a, 3][..],
            b"2.0",
            &[0x12, 2 + 10 + 2 + v, 0x0a, 10],
            b"Kubernetes",
            &[0x12, v],
            SERVER_VERSION.as_bytes(),
            &[0x42, 0, 0x4a, 0],
        ]
        .concat();
        assert_eq!(openapi_v2_protobuf(), want);
        assert_eq!(openapi_v2_json()["info"]["version"], SERVER_VERSION);
    }

    #[test]
    fn varints_carry_into_more_bytes() {
        let mut out = Vec::new();
        proto_varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }
}
