//! What the agent reads from its own Node beyond labels and taints.
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

/// The Node's primary IPs as kube-proxy takes them (`GetNodeHostIPs`): the
/// InternalIP addresses before the ExternalIP ones, and of those the first
/// of each family, the first found first. Unparsable entries are skipped.
pub fn primary_ips(node: &Node) -> Vec<IpAddr> {
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let by_type = |t: &'static str| {
        addresses
            .iter()
            .filter(move |a| a.type_ == t)
            .filter_map(|a| a.address.parse::<IpAddr>().ok())
    };
    let mut out: Vec<IpAddr> = Vec::with_capacity(2);
    for ip in by_type("InternalIP").chain(by_type("ExternalIP")) {
        if !out.iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
            out.push(ip);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_before_external_and_one_per_family() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"addresses": [
                {"type": "Hostname", "address": "n"},
                {"type": "ExternalIP", "address": "203.0.113.7"},
                {"type": "InternalIP", "address": "not-an-ip"},
                {"type": "InternalIP", "address": "fd00::7"},
                {"type": "InternalIP", "address": "10.0.0.7"},
                {"type": "InternalIP", "address": "10.0.0.8"},
            ]}
        }))
        .unwrap();
        let ips: Vec<String> = primary_ips(&node).iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["fd00::7", "10.0.0.7"]);
        assert!(primary_ips(&Node::default()).is_empty());
    }
}
