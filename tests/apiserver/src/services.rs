//! Service defaulting and the ClusterIP / NodePort allocators, as the real
//! registry does them on create and update.
use std::{collections::HashSet, net::Ipv4Addr};

use crate::store::Allocations;

use serde_json::{Value, json};

use crate::{error::ApiError, resources::ResourceDef, store::Inner};

/// 10.96.0.0/12, kubeadm's default service CIDR: room for the 100,000-Service
/// scale tests.
const CIDR_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);
const CIDR_SIZE: u32 = 1 << 20;
pub const CIDR: &str = "10.96.0.0/12";
const NODE_PORTS: std::ops::RangeInclusive<u64> = 30000..=32767;

fn ports(svc: &Value) -> impl Iterator<Item = &Value> {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn in_range(ip: &str) -> bool {
    ip.parse::<Ipv4Addr>()
        .is_ok_and(|a| (u32::from(a).wrapping_sub(CIDR_BASE)) < CIDR_SIZE)
}

/// Defaults and allocates for a Service being created (`old` = None) or
/// updated, carrying allocated values over from `old` when the new spec leaves
/// them unset, like the registry's `patchAllocatedValues`.
pub fn prepare(
    inner: &Inner,
    res: &ResourceDef,
    name: &str,
    svc: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let invalid = |field: &str, detail: String| ApiError::invalid(res, name, field, detail);
    if !svc["spec"].is_object() {
        svc["spec"] = json!({});
    }
    let spec = &mut svc["spec"];
    let ty = spec["type"].as_str().unwrap_or("ClusterIP").to_string();
    spec["type"] = json!(ty);
    if ty == "ExternalName" {
        return Ok(());
    }
    spec.as_object_mut()
        .map(|s| s.entry("sessionAffinity").or_insert(json!("None")));
    spec.as_object_mut()
        .map(|s| s.entry("internalTrafficPolicy").or_insert(json!("Cluster")));
    let node_ports = ty == "NodePort" || ty == "LoadBalancer";
    if node_ports {
        spec.as_object_mut()
            .map(|s| s.entry("externalTrafficPolicy").or_insert(json!("Cluster")));
    }
    if ty == "LoadBalancer" {
        spec.as_object_mut().map(|s| {
            s.entry("allocateLoadBalancerNodePorts")
                .or_insert(json!(true))
        });
    }
    let old_spec = old.map(|o| &o["spec"]);
    // Carry allocated values over first, so a replace without them keeps them.
    if let Some(os) = old_spec {
        if spec["clusterIP"].as_str().unwrap_or_default().is_empty() {
            spec["clusterIP"] = os["clusterIP"].clone();
            spec["clusterIPs"] = os["clusterIPs"].clone();
        }
        for key in ["ipFamilies", "ipFamilyPolicy"] {
            if spec.get(key).is_none_or(Value::is_null) && !os[key].is_null() {
                spec[key] = os[key].clone();
            }
        }
    }
    let alloc: &Allocations = inner.allocations();

    let requested = spec["clusterIP"].as_str().unwrap_or_default().to_string();
    if let Some(os) = old_spec {
        let was = os["clusterIP"].as_str().unwrap_or_default();
        if !was.is_empty() && was != requested {
            return Err(invalid(
                "spec.clusterIPs[0]",
                format!("Invalid value: {requested:?}: may not change once set"),
            ));
        }
    }
    let ip = if requested == "None" {
        "None".to_string()
    } else if requested.is_empty() {
        // Random like the real allocator, probing from there; low addresses
        // are left for the kubernetes and DNS Services by convention.
        let usable = CIDR_SIZE - 12;
        let start = random_u32() % usable;
        (0..usable)
            .map(|i| Ipv4Addr::from(CIDR_BASE + 11 + (start + i) % usable).to_string())
            .find(|ip| !alloc.ips.contains(ip))
            .ok_or_else(|| invalid("spec.clusterIPs", "range is full".into()))?
    } else if old_spec.is_some_and(|os| os["clusterIP"] == json!(requested)) {
        requested
    } else if requested.parse::<Ipv4Addr>().is_err() || !in_range(&requested) {
        return Err(invalid(
            "spec.clusterIPs",
            format!(
                "Invalid value: []string{{{requested:?}}}: failed to allocate IP {requested}: the provided IP ({requested}) is not in the valid range. The range of valid IPs is {CIDR}"
            ),
        ));
    } else if alloc.ips.contains(&requested) {
        return Err(invalid(
            "spec.clusterIPs",
            format!(
                "Invalid value: []string{{{requested:?}}}: failed to allocate IP {requested}: provided IP is already allocated"
            ),
        ));
    } else {
        requested
    };
    spec["clusterIP"] = json!(ip);
    spec["clusterIPs"] = json!([ip]);
    if spec.get("ipFamilies").is_none_or(Value::is_null) {
        spec["ipFamilies"] = json!(["IPv4"]);
    }
    if spec.get("ipFamilyPolicy").is_none_or(Value::is_null) {
        spec["ipFamilyPolicy"] = json!("SingleStack");
    }

    // Ports this request takes; `alloc` has everyone's, including `old`'s.
    let mut taken = HashSet::new();
    let old_ports: Vec<Value> = old_spec
        .and_then(|os| os["ports"].as_array().cloned())
        .unwrap_or_default();
    let headless = spec["clusterIP"] == "None";
    let list = match spec["ports"].as_array_mut() {
        Some(list) if !list.is_empty() => list,
        _ if headless => return Ok(()),
        _ => return Err(invalid("spec.ports", "Required value".into())),
    };
    for (i, p) in list.iter_mut().enumerate() {
        let Some(port) = p["port"].as_u64() else {
            return Err(invalid(
                &format!("spec.ports[{i}].port"),
                "Required value".into(),
            ));
        };
        if p["protocol"].is_null() {
            p["protocol"] = json!("TCP");
        }
        // 0 is how typed clients spell "unset".
        if p["nodePort"].as_u64() == Some(0)
            && let Some(m) = p.as_object_mut()
        {
            m.remove("nodePort");
        }
        if p["targetPort"].is_null() {
            p["targetPort"] = json!(port);
        }
        if !node_ports {
            if let Some(m) = p.as_object_mut() {
                m.remove("nodePort");
            }
            continue;
        }
        if p["nodePort"].as_u64().is_none() {
            let kept = old_ports
                .iter()
                .find(|o| o["port"] == p["port"] && o["protocol"] == p["protocol"])
                .and_then(|o| o["nodePort"].as_u64());
            if let Some(np) = kept {
                p["nodePort"] = json!(np);
            }
        }
        match p["nodePort"].as_u64() {
            Some(np) if old_ports.iter().any(|o| o["nodePort"] == json!(np)) => {
                taken.insert(np);
            }
            Some(np) if !NODE_PORTS.contains(&np) => {
                return Err(invalid(
                    &format!("spec.ports[{i}].nodePort"),
                    format!(
                        "Invalid value: {np}: provided port is not in the valid range. The range of valid ports is 30000-32767"
                    ),
                ));
            }
            Some(np) if alloc.ports.contains(&np) || !taken.insert(np) => {
                return Err(invalid(
                    &format!("spec.ports[{i}].nodePort"),
                    format!("Invalid value: {np}: provided port is already allocated"),
                ));
            }
            Some(_) => {}
            None => {
                let span = NODE_PORTS.end() - NODE_PORTS.start() + 1;
                let start = u64::from(random_u32()) % span;
                let np = (0..span)
                    .map(|i| NODE_PORTS.start() + (start + i) % span)
                    .find(|p| !alloc.ports.contains(p) && !taken.contains(p))
                    .ok_or_else(|| invalid("spec.ports", "node port range is full".into()))?;
                taken.insert(np);
                p["nodePort"] = json!(np);
            }
        }
    }
    Ok(())
}

fn random_u32() -> u32 {
    let b = uuid::Uuid::new_v4().into_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The allocated values of a stored Service, for the store's index.
pub fn allocated(svc: &Value) -> (Vec<String>, Vec<u64>) {
    let ips = svc
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|ip| *ip != "None")
        .map(String::from)
        .collect();
    let ports = ports(svc)
        .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
        .collect();
    (ips, ports)
}
