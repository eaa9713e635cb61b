//! The migration from kube-proxy (chart README, "Migrating from kube-proxy"):
//! `kubeProxyCoexistence` keeps the agent off the ports kube-proxy holds on the
//! host network, and turning it off gives them back to Weir. Also the pod's
//! DNS policy, which must not depend on a ClusterIP the agent has not
//! programmed yet.
use k8s_openapi::{api::core::v1::Container, apimachinery::pkg::util::intstr::IntOrString};

use crate::{
    checks::default_args,
    parse::Rendered,
    render::{render_err, render_ok},
};

const ON: &str = "kubeProxyCoexistence.enabled=true";

/// The container port a probe's named port resolves to.
fn probe_port(c: &Container, probe: &str) -> i32 {
    let p = match probe {
        "readiness" => c.readiness_probe.as_ref(),
        _ => c.liveness_probe.as_ref(),
    };
    let get = p
        .and_then(|p| p.http_get.as_ref())
        .unwrap_or_else(|| panic!("{probe} probe: no httpGet"));
    match &get.port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("{probe} probe: no container port named {name}"))
                .container_port
        }
    }
}

fn container_port(c: &Container, name: &str) -> Option<i32> {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
}

/// The agent's flags with kube-proxy's ports, its healthCheckNodePorts and
/// the per-packet datapath: Weir in kube-proxy's place.
fn assert_replaces_kube_proxy(r: &Rendered) {
    let args = r.args();
    for want in [
        "--metrics-addr=127.0.0.1:10249",
        "--healthz-addr=0.0.0.0:10256",
        "--devices=auto",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--health-check-node-ports")),
        "healthCheckNodePorts are served by default: {args:?}"
    );
    let agent = r.agent();
    assert_eq!(probe_port(&agent, "readiness"), 10256);
    assert_eq!(probe_port(&agent, "liveness"), 10256);
}

#[test]
fn coexistence_moves_off_every_port_kube_proxy_holds() {
    let r = render_ok(&["--set", ON]);
    r.check_all_typed();
    // Exactly the default flags, but for the ports, the health checks and
    // the devices.
    let want: Vec<String> = default_args()
        .into_iter()
        .filter(|a| !a.starts_with("--devices"))
        .flat_map(|a| match a.as_str() {
            "--metrics-addr=127.0.0.1:10249" => vec!["--metrics-addr=127.0.0.1:10349".to_owned()],
            "--healthz-addr=0.0.0.0:10256" => vec![
                "--healthz-addr=0.0.0.0:10356".to_owned(),
                "--health-check-node-ports=false".to_owned(),
            ],
            _ => vec![a],
        })
        .collect();
    assert_eq!(r.args(), want);

    // The kubelet probes the agent's own server, not kube-proxy's on 10256.
    let agent = r.agent();
    assert_eq!(container_port(&agent, "healthz"), Some(10356));
    assert_eq!(container_port(&agent, "metrics"), Some(10349));
    assert_eq!(probe_port(&agent, "readiness"), 10356);
    assert_eq!(probe_port(&agent, "liveness"), 10356);
}

#[test]
fn coexistence_ports_and_devices_are_settable() {
    let r = render_ok(&[
        "--set",
        &format!(
            "{ON},kubeProxyCoexistence.healthzPort=20256,kubeProxyCoexistence.metricsPort=20249"
        ),
        "--set",
        "kubeProxyCoexistence.devices={eth0,lxc+}",
        "--set",
        "devices={bond0}",
    ]);
    r.check_all_typed();
    let args = r.args();
    for want in [
        "--metrics-addr=127.0.0.1:20249",
        "--healthz-addr=0.0.0.0:20256",
        "--health-check-node-ports=false",
        "--devices=eth0,lxc+",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    // The top-level devices wait until the mode is off.
    assert_eq!(
        args.iter().filter(|a| a.starts_with("--devices")).count(),
        1,
        "{args:?}"
    );
    assert_eq!(probe_port(&r.agent(), "readiness"), 20256);

    // The same values with the mode off: the coexistence ones are ignored.
    let r = render_ok(&[
        "--set",
        "kubeProxyCoexistence.healthzPort=20256,kubeProxyCoexistence.metricsPort=20249",
        "--set",
        "kubeProxyCoexistence.devices={eth0}",
    ]);
    assert_replaces_kube_proxy(&r);
}

#[test]
fn service_monitor_scrapes_the_coexistence_metrics_port() {
    let r = render_ok(&[
        "--set",
        &format!("{ON},serviceMonitor.enabled=true,metrics.bindAddress=0.0.0.0"),
    ]);
    r.check_all_typed();
    let svc = &r.only("Service").value;
    assert_eq!(svc["spec"]["ports"][0]["port"], 10349, "{svc}");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics");
    assert!(
        r.args()
            .contains(&"--metrics-addr=0.0.0.0:10349".to_owned())
    );
}

#[test]
fn metrics_off_in_coexistence_needs_no_metrics_port() {
    // Nothing binds metrics, so kube-proxy's port is no clash.
    let r = render_ok(&[
        "--set",
        &format!("{ON},metrics.enabled=false,kubeProxyCoexistence.metricsPort=10249"),
    ]);
    let agent = r.agent();
    assert!(r.args().contains(&"--metrics-addr=".to_owned()));
    assert_eq!(container_port(&agent, "metrics"), None);
    assert_eq!(container_port(&agent, "healthz"), Some(10356));
}

#[test]
fn coexistence_refuses_what_would_clash_with_kube_proxy() {
    let cases: &[(&str, &str)] = &[
        (
            "kubeProxyCoexistence.healthzPort=10256",
            "kubeProxyCoexistence.healthzPort is 10256",
        ),
        (
            "kubeProxyCoexistence.metricsPort=10249",
            "kubeProxyCoexistence.metricsPort is 10249",
        ),
        (
            "kubeProxyCoexistence.metricsPort=10356",
            "kubeProxyCoexistence.metricsPort and kubeProxyCoexistence.healthzPort are both 10356",
        ),
        // The cleanup would delete the rules of a kube-proxy that still runs.
        (
            "cleanupKubeProxy.enabled=true",
            "cleanupKubeProxy.enabled with kubeProxyCoexistence.enabled",
        ),
    ];
    for (set, want) in cases {
        let e = render_err(&["--set", &format!("{ON},{set}")]);
        assert!(e.contains(want), "{set}: want {want:?} in:\n{e}");
    }
    // The same values are fine with the mode off (kube-proxy gone).
    render_ok(&["--set", "kubeProxyCoexistence.healthzPort=10256"]);
    render_ok(&["--set", "cleanupKubeProxy.enabled=true"]);
}

#[test]
fn schema_names_bad_coexistence_values() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--set", "kubeProxyCoexistence.healthzPort=0"],
            &["kubeProxyCoexistence", "healthzPort"],
        ),
        (
            &["--set", "kubeProxyCoexistence.metricsPort=70000"],
            &["kubeProxyCoexistence", "metricsPort"],
        ),
        (
            &["--set", "kubeProxyCoexistence.enabled=yes"],
            &["kubeProxyCoexistence", "enabled"],
        ),
        (
            &["--set", "kubeProxyCoexistence.port=1"],
            &["kubeProxyCoexistence", "port"],
        ),
        (
            &["--set", "kubeProxyCoexistence.devices={eth 0}"],
            &["kubeProxyCoexistence", "devices"],
        ),
    ];
    for (args, wants) in cases {
        let e = render_err(args);
        assert!(
            e.contains("values don't meet the specifications of the schema(s)"),
            "{args:?}: not a schema error:\n{e}"
        );
        for want in *wants {
            assert!(e.contains(want), "{args:?}: want {want:?} in:\n{e}");
        }
    }
}

/// The README's steps, as the values each `helm install`/`upgrade` ends up
/// with (`--reuse-values` keeps the earlier ones).
#[test]
fn readme_migration_steps_render() {
    let host = "k8sServiceHost=api.example.com";
    // 1. Beside kube-proxy.
    let r = render_ok(&["--set", &format!("{host},{ON}")]);
    r.check_all_typed();
    assert!(
        r.args()
            .contains(&"--health-check-node-ports=false".to_owned())
    );
    assert!(!r.args().iter().any(|a| a.starts_with("--devices")));
    assert_eq!(r.pod().init_containers.unwrap().len(), 1, "mount only");

    // 2. Preview the cleanup while kube-proxy still runs: a dry run changes
    //    nothing, so it is allowed.
    let r = render_ok(&[
        "--set",
        &format!("{host},{ON},cleanupKubeProxy.enabled=true,cleanupKubeProxy.dryRun=true"),
    ]);
    let init = r.pod().init_containers.unwrap();
    let cleanup = init
        .iter()
        .find(|c| c.name == "cleanup-kube-proxy")
        .unwrap();
    assert_eq!(
        cleanup.args.as_deref().unwrap(),
        ["cleanup-kube-proxy", "--dry-run"]
    );

    // 3. kube-proxy deleted; one upgrade cleans its rules and hands Weir its
    //    ports, healthCheckNodePorts and NodePorts, node by node.
    let r = render_ok(&[
        "--set",
        &format!(
            "{host},kubeProxyCoexistence.enabled=false,cleanupKubeProxy.enabled=true,cleanupKubeProxy.dryRun=false"
        ),
    ]);
    r.check_all_typed();
    assert_replaces_kube_proxy(&r);
    let init = r.pod().init_containers.unwrap();
    let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["mount-bpf-cgroup", "cleanup-kube-proxy"]);
    assert_eq!(init[1].args.as_deref().unwrap(), ["cleanup-kube-proxy"]);

    // 4. The init container dropped again.
    let r = render_ok(&["--set", &format!("{host},cleanupKubeProxy.enabled=false")]);
    assert_replaces_kube_proxy(&r);
}

/// After a reboot no ClusterIP works until the agent has programmed it, the
/// cluster DNS Service's included: the agent resolves a DNS-name
/// k8sServiceHost through the node's resolv.conf.
#[test]
fn dns_is_the_nodes_not_the_clusters() {
    for set in ["k8sServiceHost=api.example.com", ON] {
        let pod = render_ok(&["--set", set]).pod();
        assert_eq!(pod.host_network, Some(true));
        assert_eq!(pod.dns_policy.as_deref(), Some("Default"), "{set}");
        assert_eq!(pod.dns_config, None, "{set}");
    }
}
