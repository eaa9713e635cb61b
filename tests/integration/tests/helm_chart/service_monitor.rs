//! The optional ServiceMonitor and the headless Service it scrapes.
use k8s_openapi::{api::core::v1::Service, apimachinery::pkg::util::intstr::IntOrString};

use crate::{
    parse::typed,
    render::{NS, render_err, render_ok},
};

#[test]
fn service_monitor_scrapes_a_headless_service() {
    let r = render_ok(&[
        "--set",
        "serviceMonitor.enabled=true,metrics.bindAddress=0.0.0.0,serviceMonitor.interval=30s",
        "--set",
        "serviceMonitor.labels.release=prometheus",
    ]);
    assert_eq!(
        r.kinds(),
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "DaemonSet",
            "ServiceMonitor"
        ]
    );
    r.check_all_typed();
    let svc: Service = typed(r.only("Service"));
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    let port = &spec.ports.unwrap()[0];
    assert_eq!(port.name.as_deref(), Some("metrics"));
    assert_eq!(port.port, 10249);
    assert_eq!(
        port.target_port,
        Some(IntOrString::String("metrics".into()))
    );
    let ds_selector = r.ds().spec.unwrap().selector.match_labels.unwrap();
    assert_eq!(spec.selector.unwrap(), ds_selector);
    assert!(
        r.args()
            .contains(&"--metrics-addr=0.0.0.0:10249".to_owned())
    );

    let sm = &r.only("ServiceMonitor").value;
    assert_eq!(sm["metadata"]["namespace"], NS);
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    let svc_labels = svc.metadata.labels.unwrap();
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            svc_labels.get(k).map(String::as_str),
            v.as_str(),
            "selects the Service by {k}"
        );
    }
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"][0], NS);
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["port"], "metrics");
    assert_eq!(ep["path"], "/metrics");
    assert_eq!(ep["interval"], "30s");
}

#[test]
fn service_monitor_needs_reachable_metrics() {
    let e = render_err(&["--set", "serviceMonitor.enabled=true"]);
    assert!(e.contains("metrics.bindAddress"), "{e}");
    let e = render_err(&[
        "--set",
        "serviceMonitor.enabled=true,metrics.enabled=false,metrics.bindAddress=0.0.0.0",
    ]);
    assert!(e.contains("needs metrics.enabled"), "{e}");
}
