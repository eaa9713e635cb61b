//! Conversion tests: field paths in errors, Services without frontends, and the
//! API's endpoint condition defaults.
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use super::{wire::EndpointSlice, *};
use crate::model::{BackendState, EndpointSpec, Protocol, ServiceId, ServicePortSpec};

fn svc(v: Value) -> Service {
    serde_json::from_value(v).expect("a Service")
}

fn eps(v: Value) -> EndpointSlice {
    serde_json::from_value(v).expect("an EndpointSlice")
}

fn fields(e: &ObjectError) -> Vec<&str> {
    e.errors.iter().map(|e| e.field.as_str()).collect()
}

fn fields_of(errors: &[FieldError]) -> Vec<&str> {
    errors.iter().map(|e| e.field.as_str()).collect()
}

fn good_service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [
            {"name": "http", "port": 80},
            {"name": "dns", "port": 53, "protocol": "UDP"},
        ]},
    })
}

#[test]
fn service_converts_with_defaults() {
    let c = service(&svc(good_service())).unwrap();
    assert_eq!(c.warnings, []);
    assert_eq!(c.value.id, ServiceId::new("shop", "web"));
    assert_eq!(*c.value.cluster_ips, [IpAddr::from([10, 96, 0, 10])]);
    assert_eq!(
        *c.value.ports,
        [
            ServicePortSpec {
                name: "http".into(),
                port: 80,
                proto: Protocol::Tcp,
                node_port: None,
            },
            ServicePortSpec {
                name: "dns".into(),
                port: 53,
                proto: Protocol::Udp,
                node_port: None,
            },
        ]
    );
    let mut v = good_service();
    v["metadata"].as_object_mut().unwrap().remove("namespace");
    assert_eq!(service(&svc(v)).unwrap().value.id.namespace(), "default");
}

#[test]
fn port_names_are_one_shared_copy() {
    // `http` is every other Service's port name, and its slices' too.
    let a = service(&svc(good_service())).unwrap().value;
    let b = service(&svc(good_service())).unwrap().value;
    let s = ipv4(good_slice()).value;
    assert!(std::sync::Arc::ptr_eq(&a.ports[0].name, &b.ports[0].name));
    assert!(std::sync::Arc::ptr_eq(&a.ports[0].name, &s.ports[0].name));
}

#[test]
fn service_errors_name_every_bad_field() {
    let e = service(&svc(json!({
        "metadata": {},
        "spec": {"clusterIP": "10.96.0.999", "ports": [
            {"port": 80},
            {"port": 0},
            {"port": 70000, "protocol": "FOO"},
            {"port": 80, "protocol": "TCP", "name": "again"},
            {"port": 80, "protocol": "UDP"},
        ]},
    })))
    .unwrap_err();
    assert_eq!(
        fields(&e),
        [
            "metadata.name",
            "spec.clusterIP",
            "spec.ports[1].port",
            "spec.ports[2].port",
            "spec.ports[2].protocol",
            "spec.ports[3]",
        ]
    );
    assert_eq!(e.errors[0].problem, Problem::Missing);
    assert_eq!(
        e.errors[1].problem,
        Problem::InvalidIp {
            value: "10.96.0.999".into()
        }
    );
    assert_eq!(e.errors[2].problem, Problem::PortOutOfRange { value: 0 });
    assert_eq!(
        e.errors[3].problem,
        Problem::PortOutOfRange { value: 70000 }
    );
    assert_eq!(
        e.errors[4].problem,
        Problem::UnknownProtocol {
            value: "FOO".into()
        }
    );
    assert_eq!(
        e.errors[5].problem,
        Problem::DuplicatePort {
            port: 80,
            proto: Protocol::Tcp
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("spec.ports[1].port: 0 is out of range 1-65535; "),
        "{msg}"
    );
}

#[test]
fn cluster_ips_are_checked_by_index() {
    let mut v = good_service();
    v["spec"]["clusterIPs"] = json!(["10.96.0.11", "fd00::1", "bogus"]);
    let e = service(&svc(v)).unwrap_err();
    assert_eq!(fields(&e), ["spec.clusterIPs[0]", "spec.clusterIPs[2]"]);
    assert_eq!(
        e.errors[0].problem,
        Problem::ClusterIpMismatch {
            ip: "10.96.0.10".into(),
            ips0: "10.96.0.11".into()
        }
    );

    // Dual stack: both families get frontends, primary first.
    let mut v = good_service();
    v["spec"]["clusterIPs"] = json!(["10.96.0.10", "fd00::1"]);
    let c = service(&svc(v)).unwrap();
    assert_eq!(
        *c.value.cluster_ips,
        [
            IpAddr::from([10, 96, 0, 10]),
            "fd00::1".parse::<IpAddr>().unwrap()
        ]
    );

    // No cluster IP at all: a warning, not an error.
    let mut v = good_service();
    v["spec"].as_object_mut().unwrap().remove("clusterIP");
    let c = service(&svc(v)).unwrap();
    assert!(c.value.cluster_ips.is_empty());
    assert_eq!(
        c.warnings,
        [FieldError::new("spec.clusterIP", Problem::NoClusterIp)]
    );
}

#[test]
fn services_a_kube_proxy_skips_get_no_cluster_ip() {
    let headless = {
        let mut v = good_service();
        v["spec"]["clusterIP"] = json!("None");
        v
    };
    let external = {
        let mut v = good_service();
        v["spec"]["type"] = json!("ExternalName");
        v["spec"]["externalName"] = json!("db.example.com");
        v
    };
    let foreign = {
        let mut v = good_service();
        v["metadata"]["labels"] = json!({LABEL_SERVICE_PROXY_NAME: "other-proxy"});
        v
    };
    // Not even a broken cluster IP matters then.
    let foreign_bad_ip = {
        let mut v = foreign.clone();
        v["spec"]["clusterIP"] = json!("not-an-ip");
        v
    };
    for (what, v) in [
        ("headless", headless),
        ("ExternalName", external),
        ("service-proxy-name", foreign),
        ("service-proxy-name, bad IP", foreign_bad_ip),
    ] {
        let c = service(&svc(v)).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(c.value.cluster_ips.is_empty(), "{what}");
        assert_eq!(c.warnings, [], "{what}");
        assert_eq!(c.value.ports.len(), 2, "{what}: ports are still validated");
    }
}

fn good_slice() -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "shop",
                     "labels": {LABEL_SERVICE_NAME: "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.0.0.1"]}],
    })
}

fn ipv4(v: Value) -> Converted<crate::model::SliceSpec> {
    match slice(&eps(v)) {
        Ok(SliceOutcome::Ip(c)) => c,
        other => panic!("expected an IPv4 slice, got {other:?}"),
    }
}

#[test]
fn slice_errors_name_every_bad_field() {
    let e = slice(&eps(json!({
        "metadata": {"labels": {"app": "web"}},
        "addressType": "IPX",
        "ports": [
            {"port": 0},
            {"port": 8080, "protocol": "FOO"},
            {"name": "no-number"},
        ],
        "endpoints": [],
    })))
    .unwrap_err();
    assert_eq!(
        fields(&e),
        [
            "metadata.name",
            "metadata.labels[kubernetes.io/service-name]",
            "addressType",
            "ports[0].port",
            "ports[1].protocol",
        ]
    );
    assert_eq!(
        e.errors[2].problem,
        Problem::UnknownAddressType {
            value: "IPX".into()
        }
    );

    // An empty label names no Service either.
    let mut v = good_slice();
    v["metadata"]["labels"][LABEL_SERVICE_NAME] = json!("");
    let e = slice(&eps(v)).unwrap_err();
    assert_eq!(fields(&e), ["metadata.labels[kubernetes.io/service-name]"]);
}

#[test]
fn a_port_without_number_is_a_warning() {
    let mut v = good_slice();
    v["ports"] = json!([{"name": "http", "port": 8080}, {"name": "other"}]);
    let c = ipv4(v);
    assert_eq!(c.value.ports.len(), 1);
    assert_eq!(
        c.warnings,
        [FieldError::new("ports[1].port", Problem::NoPortNumber)]
    );
    assert_eq!(c.value.service, ServiceId::new("shop", "web"));
}

#[test]
fn bad_addresses_are_warnings_that_cost_only_themselves() {
    let mut v = good_slice();
    v["endpoints"] = json!([
        {"addresses": ["10.0.0.1", "10.0.0.999", "10.0.0.2"]},
        {"addresses": ["fd00::1"]},
        {"addresses": ["10.0.0.3"]},
    ]);
    let c = ipv4(v);
    let addrs: Vec<Vec<IpAddr>> = c
        .value
        .endpoints
        .iter()
        .map(|e| e.addrs().collect())
        .collect();
    assert_eq!(
        addrs,
        [
            vec![IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2])],
            vec![IpAddr::from([10, 0, 0, 3])],
        ]
    );
    let warned: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        warned,
        ["endpoints[0].addresses[1]", "endpoints[1].addresses[0]"]
    );
    assert_eq!(
        c.warnings[0].problem,
        Problem::InvalidIp {
            value: "10.0.0.999".into()
        }
    );
}

#[test]
fn ipv6_slices_convert_and_drop_addresses_of_the_other_family() {
    let mut v = good_slice();
    v["addressType"] = json!("IPv6");
    v["endpoints"] = json!([{"addresses": ["fd00::1", "10.0.0.1", "fd00::2"]}]);
    let Ok(SliceOutcome::Ip(c)) = slice(&eps(v)) else {
        panic!("IPv6 slice not converted");
    };
    assert_eq!(c.value.family, crate::model::IpFamily::V6);
    let want: Vec<IpAddr> = ["fd00::1", "fd00::2"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    assert_eq!(c.value.endpoints[0].addrs().collect::<Vec<_>>(), want);
    assert_eq!(fields_of(&c.warnings), ["endpoints[0].addresses[1]"]);
    assert!(matches!(
        c.warnings[0].problem,
        Problem::WrongFamily {
            family: crate::model::IpFamily::V6,
            ..
        }
    ));
}

#[test]
fn fqdn_slices_are_ignored_unless_broken() {
    let mut v = good_slice();
    v["addressType"] = json!("FQDN");
    v["endpoints"] = json!([{"addresses": ["db.example.com"]}]);
    assert!(matches!(
        slice(&eps(v.clone())),
        Ok(SliceOutcome::Ignored { .. })
    ));
    v["metadata"]["labels"] = json!({});
    let e = slice(&eps(v)).unwrap_err();
    assert_eq!(fields(&e), ["metadata.labels[kubernetes.io/service-name]"]);
}

#[test]
fn endpoint_conditions_follow_the_api_defaults() {
    let cases = [
        // (conditions, ready, serving, terminating, state)
        (json!(null), true, true, false, Some(BackendState::Active)),
        (json!({}), true, true, false, Some(BackendState::Active)),
        (json!({"ready": false}), false, false, false, None),
        // Ready wins, as in kube-proxy (publishNotReadyAddresses keeps
        // terminating endpoints ready).
        (
            json!({"ready": true, "terminating": true}),
            true,
            true,
            true,
            Some(BackendState::Active),
        ),
        (
            json!({"ready": false, "serving": true, "terminating": true}),
            false,
            true,
            true,
            Some(BackendState::Terminating),
        ),
        // Neither ready nor terminating: kube-proxy uses it for nothing.
        (
            json!({"ready": false, "serving": true}),
            false,
            true,
            false,
            None,
        ),
        // Graceful shutdown after readiness flipped: drains (kept for the
        // flows it has, never picked).
        (
            json!({"ready": false, "serving": false, "terminating": true}),
            false,
            false,
            true,
            Some(BackendState::Draining),
        ),
        (
            json!({"serving": false, "terminating": true}),
            true,
            false,
            true,
            Some(BackendState::Draining),
        ),
    ];
    for (conditions, ready, serving, terminating, state) in cases {
        let mut v = good_slice();
        if !conditions.is_null() {
            v["endpoints"][0]["conditions"] = conditions.clone();
        }
        let c = ipv4(v);
        let want = EndpointSpec {
            addr: IpAddr::from([10, 0, 0, 1]),
            ready,
            serving,
            terminating,
            meta: None,
        };
        assert_eq!(want.backend_state(), state, "{conditions}");
        assert_eq!(*c.value.endpoints, [want], "{conditions}");
    }
}

#[test]
fn traffic_policies_convert_and_unknown_ones_name_the_field() {
    use crate::model::TrafficPolicy;
    let c = service(&svc(good_service())).unwrap();
    assert_eq!(c.value.internal_policy, TrafficPolicy::Cluster);
    assert_eq!(c.value.external_policy, TrafficPolicy::Cluster);
    let mut v = good_service();
    v["spec"]["internalTrafficPolicy"] = json!("Local");
    v["spec"]["externalTrafficPolicy"] = json!("Local");
    // Only Services with node ports honour externalTrafficPolicy.
    let c = service(&svc(v.clone())).unwrap();
    assert_eq!(c.value.internal_policy, TrafficPolicy::Local);
    assert_eq!(c.value.external_policy, TrafficPolicy::Cluster);
    v["spec"]["type"] = json!("NodePort");
    let c = service(&svc(v.clone())).unwrap();
    assert_eq!(c.value.external_policy, TrafficPolicy::Local);
    v["spec"]["internalTrafficPolicy"] = json!("Nearby");
    let e = service(&svc(v)).unwrap_err();
    assert_eq!(fields(&e), ["spec.internalTrafficPolicy"]);
    assert!(e.to_string().contains("\"Nearby\""), "{e}");
}

#[test]
fn endpoint_node_and_hints_are_kept() {
    let mut v = good_slice();
    v["endpoints"] = json!([
        {"addresses": ["10.0.0.1"], "nodeName": "node-a",
         "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "node-a"}]}},
        {"addresses": ["10.0.0.2"]},
    ]);
    let c = ipv4(v);
    let e = &c.value.endpoints;
    assert_eq!(e[0].node_name(), Some("node-a"));
    assert_eq!(e[0].zone_hints(), ["z1"]);
    assert_eq!(e[0].node_hints(), ["node-a"]);
    assert_eq!(e[1].meta, None);
    // Endpoints that say the same share one copy of it.
    let mut v = good_slice();
    v["endpoints"] = json!([
        {"addresses": ["10.0.0.1"], "nodeName": "node-a"},
        {"addresses": ["10.0.0.2"], "nodeName": "node-a"},
    ]);
    let c = ipv4(v);
    let e = &c.value.endpoints;
    assert!(std::sync::Arc::ptr_eq(
        e[0].meta.as_ref().unwrap(),
        e[1].meta.as_ref().unwrap()
    ));
}

#[test]
fn the_lb_algorithm_annotation_overrides_and_a_bad_one_only_warns() {
    use crate::model::{ANNOTATION_LB_ALGORITHM, LbAlgorithm};
    let with = |value: &str| {
        let mut v = good_service();
        v["metadata"]["annotations"] = json!({ ANNOTATION_LB_ALGORITHM: value });
        service(&svc(v)).unwrap()
    };
    assert_eq!(
        service(&svc(good_service())).unwrap().value.lb_algorithm,
        None
    );
    assert_eq!(with("maglev").value.lb_algorithm, Some(LbAlgorithm::Maglev));
    assert_eq!(with("random").value.lb_algorithm, Some(LbAlgorithm::Random));
    let c = with("ring-hash");
    assert_eq!(c.value.lb_algorithm, None, "the agent's default applies");
    assert_eq!(
        fields_of(&c.warnings),
        ["metadata.annotations[weir.dev/lb-algorithm]"]
    );
    assert!(c.warnings[0].to_string().contains("\"ring-hash\""));
}
