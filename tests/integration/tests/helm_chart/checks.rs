//! What the tests expect: the chart's default agent flags, and helpers that
//! reduce capabilities and RBAC rules to comparable sets.
use std::collections::BTreeSet;

use k8s_openapi::api::{core::v1::Container, rbac::v1::PolicyRule};
use serde_json::Value;

use crate::render::root;

pub(crate) fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

pub(crate) fn caps(c: &Container) -> (BTreeSet<String>, Vec<String>) {
    let sc = c
        .security_context
        .as_ref()
        .unwrap_or_else(|| panic!("{}: no securityContext", c.name));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    (
        caps.add.clone().unwrap_or_default().into_iter().collect(),
        caps.drop.clone().unwrap_or_default(),
    )
}

pub(crate) fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

pub(crate) fn app_version() -> String {
    let chart: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join("helm/weir/Chart.yaml")).unwrap(),
    )
    .unwrap();
    chart["appVersion"].as_str().unwrap().to_owned()
}

pub(crate) fn default_args() -> Vec<String> {
    strs(&[
        "--node-name=$(NODE_NAME)",
        "--namespace=$(POD_NAMESPACE)",
        "--cgroup=/run/weir/cgroupv2",
        "--bpffs=/sys/fs/bpf/weir",
        "--max-services=65536",
        "--max-backends=262144",
        "--max-revsock=262144",
        "--metrics-addr=127.0.0.1:10249",
        "--healthz-addr=0.0.0.0:10256",
        "--socket-lb=true",
        "--devices=auto",
        "--nodeport-range=30000-32767",
        "--snat-port-range=61000-65535",
        "--acceleration=disabled",
        "--lb-algorithm=random",
        "--maglev-table-size=16381",
        "--max-maglev-tables=4096",
        "--proc-root=/host/proc",
        "--log-format=text",
    ])
}

/// The agent's capabilities by default (`terminatePodUdpSockets: true`).
pub(crate) const AGENT_CAPS: &[&str] = &[
    "BPF",
    "NET_ADMIN",
    "PERFMON",
    "SYS_RESOURCE",
    "SYS_ADMIN",
    "SYS_PTRACE",
];

/// The agent's capabilities with `terminatePodUdpSockets: false`.
pub(crate) const AGENT_CAPS_MINIMAL: &[&str] = &["BPF", "NET_ADMIN", "PERFMON", "SYS_RESOURCE"];

/// (apiGroup, resource, verb) triples a rule list grants; fails on anything
/// broader than that (resourceNames, nonResourceURLs, wildcards).
pub(crate) fn grants(rules: &[PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        assert!(r.resource_names.is_none(), "resourceNames in {r:?}");
        assert!(r.non_resource_urls.is_none(), "nonResourceURLs in {r:?}");
        for g in r.api_groups.as_deref().unwrap_or_default() {
            for res in r.resources.as_deref().unwrap_or_default() {
                for v in &r.verbs {
                    assert!(g != "*" && res != "*" && v != "*", "wildcard in {r:?}");
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

pub(crate) fn triples(
    group: &str,
    resources: &[&str],
    verbs: &[&str],
) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for r in resources {
        for v in verbs {
            out.push((group.to_owned(), (*r).to_owned(), (*v).to_owned()));
        }
    }
    out
}
