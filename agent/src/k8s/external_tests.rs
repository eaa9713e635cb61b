//! Conversion of the external parts of a Service: types, node ports, external
//! and load-balancer IPs, source ranges, affinity and IP families. Every bad
//! input rejects the object with an error that names the field.
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use super::*;
use crate::model::{Cidr, ServiceType, TrafficPolicy};

fn svc(v: Value) -> Service {
    serde_json::from_value(v).expect("a Service")
}

fn lb() -> Value {
    json!({
        "metadata": {"name": "web", "namespace": "shop",
                     "creationTimestamp": "2024-01-02T03:04:05Z"},
        "spec": {
            "type": "LoadBalancer",
            "clusterIPs": ["10.96.0.10", "fd00::10"],
            "ipFamilies": ["IPv4", "IPv6"],
            "ports": [
                {"name": "http", "port": 80, "nodePort": 30080},
                {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
            ],
            "externalIPs": ["192.0.2.7", "2001:db8::7"],
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 32000,
            "sessionAffinity": "ClientIP",
            "loadBalancerSourceRanges": ["203.0.113.0/24", "2001:db8:1::/48"],
        },
        "status": {"loadBalancer": {"ingress": [
            {"ip": "198.51.100.1"},
            {"hostname": "lb.example.com"},
            {"ip": "198.51.100.2", "ipMode": "Proxy"},
            {"ip": "2001:db8::1"},
        ]}},
    })
}

/// The fields of a rejection: the object is skipped as a whole.
fn rejected(v: Value) -> Vec<String> {
    let e = service(&svc(v)).expect_err("rejected");
    e.errors.iter().map(|e| e.field.clone()).collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn load_balancer_converts_every_external_part() {
    let s = service(&svc(lb())).unwrap().value;
    assert_eq!(s.kind, ServiceType::LoadBalancer);
    assert_eq!(s.created, Some(1_704_164_645));
    assert_eq!(*s.cluster_ips, [ip("10.96.0.10"), ip("fd00::10")]);
    assert_eq!(
        s.ports.iter().map(|p| p.node_port).collect::<Vec<_>>(),
        [Some(30080), Some(30053)]
    );
    assert_eq!(*s.external_ips, [ip("192.0.2.7"), ip("2001:db8::7")]);
    // Hostname-only and ipMode: Proxy ingress entries are not programmed.
    assert_eq!(*s.lb_ips, [ip("198.51.100.1"), ip("2001:db8::1")]);
    assert_eq!(s.external_policy, TrafficPolicy::Local);
    assert_eq!(s.health_check_node_port, Some(32000));
    assert_eq!(s.affinity, Some(DEFAULT_AFFINITY_TIMEOUT));
    assert_eq!(
        *s.source_ranges,
        [
            Cidr::parse("203.0.113.0/24").unwrap(),
            Cidr::parse("2001:db8:1::/48").unwrap()
        ]
    );
}

#[test]
fn cluster_ip_services_drop_node_ports_and_lb_ips_and_keep_local_policy_with_external_ips() {
    let mut v = lb();
    v["spec"]["type"] = json!("ClusterIP");
    let s = service(&svc(v.clone())).unwrap().value;
    assert_eq!(s.kind, ServiceType::ClusterIp);
    assert!(s.ports.iter().all(|p| p.node_port.is_none()));
    assert!(s.lb_ips.is_empty());
    // A ClusterIP Service with external IPs is externally accessible in
    // kube-proxy's sense (ExternalPolicyLocal), so eTP=Local holds for its
    // external IPs.
    assert_eq!(s.external_policy, TrafficPolicy::Local);
    // The health check is for load balancers only.
    assert_eq!(s.health_check_node_port, None);
    // External IPs work on any type.
    assert_eq!(s.external_ips.len(), 2);

    // Without external IPs it has no external frontend: the policy is moot
    // and reads as Cluster.
    v["spec"]["externalIPs"] = json!([]);
    let s = service(&svc(v)).unwrap().value;
    assert!(s.external_ips.is_empty());
    assert_eq!(s.external_policy, TrafficPolicy::Cluster);

    let mut v = lb();
    v["spec"]["type"] = json!("NodePort");
    let s = service(&svc(v)).unwrap().value;
    assert!(s.lb_ips.is_empty());
    assert_eq!(s.health_check_node_port, None);
    assert_eq!(s.ports[0].node_port, Some(30080));
}

#[test]
fn bad_node_ports_name_the_port() {
    let mut v = lb();
    v["spec"]["ports"][1]["nodePort"] = json!(70000);
    assert_eq!(rejected(v), ["spec.ports[1].nodePort"]);

    let mut v = lb();
    v["spec"]["ports"][1]["protocol"] = json!("TCP");
    v["spec"]["ports"][1]["nodePort"] = json!(30080);
    assert_eq!(rejected(v), ["spec.ports[1].nodePort"]);

    // The same number for TCP and UDP is two node ports.
    let mut v = lb();
    v["spec"]["ports"][1]["nodePort"] = json!(30080);
    assert!(service(&svc(v)).is_ok());
}

#[test]
fn bad_external_and_ingress_ips_name_their_index() {
    let mut v = lb();
    v["spec"]["externalIPs"][1] = json!("2001:db8::zz");
    assert_eq!(rejected(v), ["spec.externalIPs[1]"]);

    let mut v = lb();
    v["status"]["loadBalancer"]["ingress"][3]["ip"] = json!("300.1.1.1");
    assert_eq!(rejected(v), ["status.loadBalancer.ingress[3].ip"]);
}

#[test]
fn malformed_source_range_names_its_index() {
    let mut v = lb();
    v["spec"]["loadBalancerSourceRanges"] = json!(["10.0.0.0/8", "10.0.0.0/33", "nope"]);
    let e = service(&svc(v)).unwrap_err();
    assert_eq!(
        fields(&e),
        [
            "spec.loadBalancerSourceRanges[1]",
            "spec.loadBalancerSourceRanges[2]"
        ]
    );
    assert_eq!(
        e.errors[0].problem,
        Problem::InvalidCidr {
            value: "10.0.0.0/33".into()
        }
    );
}

#[test]
fn source_range_annotation_applies_when_the_field_is_empty() {
    let mut v = lb();
    v["spec"]["loadBalancerSourceRanges"] = json!([]);
    v["metadata"]["annotations"] = json!({ANNOTATION_SOURCE_RANGES: "10.0.0.0/8, 192.168.1.1/24"});
    let s = service(&svc(v.clone())).unwrap().value;
    assert_eq!(
        *s.source_ranges,
        [
            Cidr::parse("10.0.0.0/8").unwrap(),
            Cidr::parse("192.168.1.0/24").unwrap()
        ]
    );
    v["metadata"]["annotations"] = json!({ANNOTATION_SOURCE_RANGES: "10.0.0.0/8,bad"});
    assert_eq!(
        rejected(v),
        [format!("metadata.annotations[{ANNOTATION_SOURCE_RANGES}]")]
    );
}

#[test]
fn affinity_timeout_bounds_name_the_field() {
    for (timeout, want) in [(json!(1), Some(1)), (json!(86_400), Some(86_400))] {
        let mut v = lb();
        v["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": timeout}});
        assert_eq!(service(&svc(v)).unwrap().value.affinity, want);
    }
    for bad in [0, 86_401, -5] {
        let mut v = lb();
        v["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": bad}});
        let e = service(&svc(v)).unwrap_err();
        assert_eq!(
            fields(&e),
            ["spec.sessionAffinityConfig.clientIP.timeoutSeconds"]
        );
        assert_eq!(
            e.errors[0].problem,
            Problem::AffinityTimeoutOutOfRange {
                value: i64::from(bad)
            }
        );
    }
    let mut v = lb();
    v["spec"]["sessionAffinity"] = json!("None");
    assert_eq!(service(&svc(v)).unwrap().value.affinity, None);
    let mut v = lb();
    v["spec"]["sessionAffinity"] = json!("Sticky");
    assert_eq!(rejected(v), ["spec.sessionAffinity"]);
}

#[test]
fn ip_families_must_match_cluster_ips() {
    let mut v = lb();
    v["spec"]["ipFamilies"] = json!(["IPv6", "IPv4"]);
    assert_eq!(
        rejected(v.clone()),
        ["spec.ipFamilies[0]", "spec.ipFamilies[1]"]
    );
    let e = service(&svc(v)).unwrap_err();
    assert_eq!(
        e.errors[0].problem,
        Problem::FamilyMismatch {
            family: crate::model::IpFamily::V6,
            ip: "10.96.0.10".parse::<IpAddr>().unwrap()
        }
    );
    assert_eq!(
        e.errors[0].to_string(),
        "spec.ipFamilies[0]: is IPv6 but the cluster IP at the same index is 10.96.0.10"
    );

    let mut v = lb();
    v["spec"]["clusterIPs"] = json!(["10.96.0.10", "10.96.0.11"]);
    v["spec"]["ipFamilies"] = json!(["IPv4"]);
    assert_eq!(rejected(v), ["spec.clusterIPs[1]"]);

    let mut v = lb();
    v["spec"]["ipFamilies"] = json!(["IPv4", "IPv5"]);
    assert_eq!(rejected(v), ["spec.ipFamilies[1]"]);

    let mut v = lb();
    v["spec"]["ipFamilies"] = json!(["IPv4", "IPv4"]);
    assert_eq!(rejected(v), ["spec.ipFamilies[1]"]);

    // Single-stack IPv6 is fine, and so is ipFamilies without clusterIPs.
    let mut v = lb();
    v["spec"]["clusterIPs"] = json!(["fd00::10"]);
    v["spec"]["ipFamilies"] = json!(["IPv6"]);
    assert_eq!(
        *service(&svc(v)).unwrap().value.cluster_ips,
        [ip("fd00::10")]
    );
}

#[test]
fn unknown_type_and_bad_health_check_port_name_the_field() {
    let mut v = lb();
    v["spec"]["type"] = json!("Tunnel");
    assert_eq!(rejected(v), ["spec.type"]);
    let mut v = lb();
    v["spec"]["healthCheckNodePort"] = json!(0);
    assert_eq!(rejected(v), ["spec.healthCheckNodePort"]);
    // Without eTP=Local the port means nothing and is not checked.
    let mut v = lb();
    v["spec"]["healthCheckNodePort"] = json!(0);
    v["spec"]["externalTrafficPolicy"] = json!("Cluster");
    assert_eq!(service(&svc(v)).unwrap().value.health_check_node_port, None);
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut v = lb();
    v["spec"]["externalIPs"] = json!(["x"]);
    v["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 0}});
    v["spec"]["loadBalancerSourceRanges"] = json!(["y"]);
    let mut got = rejected(v);
    got.sort();
    assert_eq!(
        got,
        [
            "spec.externalIPs[0]",
            "spec.loadBalancerSourceRanges[0]",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds"
        ]
    );
}

fn fields(e: &ObjectError) -> Vec<&str> {
    e.errors.iter().map(|e| e.field.as_str()).collect()
}
