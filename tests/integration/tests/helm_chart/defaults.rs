//! The default render: a kube-proxy-like DaemonSet with least privilege.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::{
        core::v1::ServiceAccount,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, Subject},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};

use crate::{
    checks::{AGENT_CAPS, app_version, caps, default_args, grants, set, triples},
    parse::typed,
    render::{NS, RELEASE, render_ok},
};

#[test]
fn defaults_render_kube_proxy_like_daemonset() {
    let r = render_ok(&[]);
    // Helm's install order, by kind.
    assert_eq!(
        r.kinds(),
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "DaemonSet"
        ]
    );
    r.check_all_typed();
    for d in &r.0 {
        let ns = d.value["metadata"]["namespace"].as_str();
        match d.kind.as_str() {
            "ClusterRole" | "ClusterRoleBinding" => assert_eq!(ns, None, "{}", d.kind),
            _ => assert_eq!(ns, Some(NS), "{} namespace", d.kind),
        }
        assert_eq!(d.value["metadata"]["name"], RELEASE, "{} name", d.kind);
    }

    let ds = r.ds();
    let spec = ds.spec.clone().unwrap();
    let strategy = spec.update_strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy.rolling_update.unwrap().max_unavailable,
        Some(IntOrString::Int(1))
    );
    let selector = spec.selector.match_labels.unwrap();
    let labels = spec.template.metadata.unwrap().labels.unwrap();
    for (k, v) in &selector {
        assert_eq!(labels.get(k), Some(v), "pod labels carry selector {k}");
    }

    let pod = r.pod();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("Default"));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(pod.service_account_name.as_deref(), Some(RELEASE));
    assert_eq!(
        pod.host_pid, None,
        "no hostPID: the init container uses the host's /proc"
    );
    assert_eq!(pod.host_ipc, None);
    let tol = pod.tolerations.clone().unwrap();
    assert_eq!(tol.len(), 1);
    assert_eq!(tol[0].operator.as_deref(), Some("Exists"));
    assert_eq!(
        (&tol[0].key, &tol[0].effect),
        (&None, &None),
        "tolerates every taint"
    );
    assert_eq!(
        pod.node_selector.clone().unwrap(),
        BTreeMap::from([("kubernetes.io/os".to_owned(), "linux".to_owned())])
    );

    // The agent: exactly its capabilities (SYS_ADMIN and SYS_PTRACE for
    // entering pods' network namespaces), nothing privileged.
    let agent = r.agent();
    assert_eq!(
        agent.image.as_deref(),
        Some(format!("localhost/weir/weir-agent:{}", app_version()).as_str())
    );
    let (add, drop) = caps(&agent);
    assert_eq!(add, set(AGENT_CAPS));
    assert_eq!(drop, ["ALL"]);
    let sc = agent.security_context.clone().unwrap();
    // Kubernetes rejects false together with SYS_ADMIN.
    assert_eq!(sc.allow_privilege_escalation, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.privileged, None);
    assert_eq!(r.args(), default_args());

    let env: BTreeMap<String, String> = agent
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| {
            let path = e.value_from.unwrap().field_ref.unwrap().field_path;
            (e.name, path)
        })
        .collect();
    assert_eq!(
        env,
        BTreeMap::from([
            ("NODE_NAME".to_owned(), "spec.nodeName".to_owned()),
            ("POD_NAMESPACE".to_owned(), "metadata.namespace".to_owned()),
        ])
    );

    // Probes on the healthz port.
    let ports: BTreeMap<String, i32> = agent
        .ports
        .clone()
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        BTreeMap::from([("healthz".to_owned(), 10256), ("metrics".to_owned(), 10249)])
    );
    for (probe, path) in [
        (agent.liveness_probe.clone(), "/livez"),
        (agent.readiness_probe.clone(), "/healthz"),
    ] {
        let get = probe.unwrap().http_get.unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        let port = match get.port {
            IntOrString::Int(p) => p,
            IntOrString::String(name) => ports[&name],
        };
        assert_eq!(port, 10256, "{path} probe port");
    }

    // Mounts: the host's bpffs and cgroup2, seen through HostToContainer.
    let mounts: BTreeMap<String, (String, Option<String>, bool)> = agent
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| {
            (
                m.mount_path,
                (m.name, m.mount_propagation, m.read_only.unwrap_or(false)),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        BTreeMap::from([
            (
                "/sys/fs/bpf".to_owned(),
                (
                    "bpf-maps".to_owned(),
                    Some("HostToContainer".to_owned()),
                    false
                )
            ),
            (
                "/run/weir/cgroupv2".to_owned(),
                (
                    "cgroup-root".to_owned(),
                    Some("HostToContainer".to_owned()),
                    true
                )
            ),
            ("/host/proc".to_owned(), ("hostproc".to_owned(), None, true)),
        ])
    );
    let volumes: BTreeMap<String, String> = pod
        .volumes
        .clone()
        .unwrap()
        .into_iter()
        .map(|v| (v.name, v.host_path.expect("hostPath volume").path))
        .collect();
    assert_eq!(
        volumes,
        BTreeMap::from([
            ("bpf-maps".to_owned(), "/sys/fs/bpf".to_owned()),
            ("cgroup-root".to_owned(), "/run/weir/cgroupv2".to_owned()),
            ("hostproc".to_owned(), "/proc".to_owned()),
        ])
    );

    // The mount init container alone has SYS_ADMIN, with what setns needs.
    let inits = pod.init_containers.clone().unwrap();
    assert_eq!(
        inits.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["mount-bpf-cgroup"]
    );
    let mount = &inits[0];
    let (add, drop) = caps(mount);
    assert_eq!(add, set(&["SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE"]));
    assert_eq!(drop, ["ALL"]);
    let msc = mount.security_context.clone().unwrap();
    assert_eq!(msc.privileged, None, "no privileged container");
    assert_eq!(msc.app_armor_profile.unwrap().type_, "Unconfined");
    let script = mount.args.clone().unwrap().join("\n");
    assert!(script.contains("nsenter --mount=\"$host/ns/mnt\" -- mount -t bpf bpf \"$BPF_ROOT\""));
    assert!(
        script.contains("--cgroup=\"$host/ns/cgroup\""),
        "cgroup2 from the host's cgroup namespace"
    );
    let mm = mount.volume_mounts.clone().unwrap();
    assert_eq!(mm.len(), 1);
    assert_eq!(
        (mm[0].mount_path.as_str(), mm[0].read_only),
        ("/hostproc", Some(true))
    );
    let env: Vec<(String, Option<String>)> = mount
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    assert_eq!(
        env,
        [
            ("BPF_ROOT".to_owned(), Some("/sys/fs/bpf".to_owned())),
            (
                "CGROUP_ROOT".to_owned(),
                Some("/run/weir/cgroupv2".to_owned())
            ),
        ],
        "mounts bpffs and cgroup2 where the agent's volumes (bpf.root, cgroup.hostRoot) point"
    );
    for c in inits.iter().chain(&pod.containers) {
        for m in c.volume_mounts.as_deref().unwrap_or_default() {
            assert_ne!(
                m.mount_propagation.as_deref(),
                Some("Bidirectional"),
                "{}: Bidirectional needs a privileged container",
                c.name
            );
        }
    }

    // RBAC, exactly least privilege.
    let sa: ServiceAccount = typed(r.only("ServiceAccount"));
    assert_eq!(sa.metadata.name.as_deref(), Some(RELEASE));
    let cr: ClusterRole = typed(r.only("ClusterRole"));
    assert!(cr.aggregation_rule.is_none());
    let mut want: BTreeSet<_> = BTreeSet::new();
    want.extend(triples(
        "",
        &["services", "nodes"],
        &["get", "list", "watch"],
    ));
    want.extend(triples(
        "discovery.k8s.io",
        &["endpointslices"],
        &["get", "list", "watch"],
    ));
    want.extend(triples("", &["events"], &["create", "patch"]));
    want.extend(triples("events.k8s.io", &["events"], &["create", "patch"]));
    assert_eq!(grants(&cr.rules.unwrap()), want);
    let role: Role = typed(r.only("Role"));
    assert_eq!(
        grants(&role.rules.unwrap()),
        triples(
            "coordination.k8s.io",
            &["leases"],
            &["get", "create", "update", "patch"]
        )
        .into_iter()
        .collect()
    );
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: RELEASE.into(),
        namespace: Some(NS.into()),
        api_group: None,
    };
    let crb: ClusterRoleBinding = typed(r.only("ClusterRoleBinding"));
    assert_eq!(
        (crb.role_ref.kind.as_str(), crb.role_ref.name.as_str()),
        ("ClusterRole", RELEASE)
    );
    assert_eq!(crb.subjects.unwrap(), std::slice::from_ref(&subject));
    let rb: RoleBinding = typed(r.only("RoleBinding"));
    assert_eq!(
        (rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()),
        ("Role", RELEASE)
    );
    assert_eq!(rb.subjects.unwrap(), [subject]);
}
