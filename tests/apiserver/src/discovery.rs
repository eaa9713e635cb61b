//! Legacy discovery (`/api`, `/apis`, resource lists) and just enough OpenAPI
//! v3 for kubectl: a PATCH operation per kind that lists the `fieldValidation`
//! parameter, so `kubectl apply` leaves validation to the server instead of
//! downloading schemas. Aggregated discovery is not offered; kubectl falls back
//! to the legacy documents when the response is plain `application/json`.
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
    if matches!(r.plural, "pods" | "services") && r.group.is_empty() {
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
