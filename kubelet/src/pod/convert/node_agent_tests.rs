//! What a node agent's pod needs: the Helm chart's own pod, host network and
//! DNS policies, security contexts and mount propagation, checked as the API
//! server would.
use k8s_openapi::api::core::v1 as api;
use serde_json::json;

use super::*;

fn from_json(spec: serde_json::Value) -> Result<PodSpec, Vec<String>> {
    let pod: api::Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": spec,
    }))
    .unwrap();
    PodSpec::from_api(&pod).map_err(|e| e.errors.iter().map(ToString::to_string).collect())
}

fn container(extra: serde_json::Value) -> serde_json::Value {
    let mut c = json!({"name": "c", "image": "busybox:1"});
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c
}

const CHART_POD: &str = include_str!("testdata/chart_pod.yaml");

/// The chart's DaemonSet pod converts whole: nothing in it is refused, and
/// what a node agent depends on comes through.
#[test]
fn the_charts_pod_converts() {
    let v = crate::static_pods::parse_manifest_value(CHART_POD).unwrap();
    let pod: api::Pod = serde_json::from_value(v).unwrap();
    let p = PodSpec::from_api(&pod).unwrap_or_else(|e| panic!("{e}"));
    assert!(p.host_network);
    assert_eq!(p.dns_policy, DnsPolicy::Default);
    assert_eq!(p.service_account_name, "release-name-weir");
    assert_eq!(p.node_name.as_deref(), Some("node1"));
    assert!(
        !p.has_privileged_container(),
        "capabilities, not privileged"
    );

    let mount = p.container("mount-bpf-cgroup").unwrap();
    assert_eq!(mount.image_pull_policy, PullPolicy::IfNotPresent);
    let s = &mount.security;
    assert_eq!(s.app_armor, Some(SecurityProfile::Unconfined));
    let se = s.se_linux.as_ref().unwrap();
    assert_eq!((se.type_.as_str(), se.level.as_str()), ("spc_t", "s0"));
    assert_eq!(
        s.capabilities_add,
        ["SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE"]
    );
    assert_eq!(s.capabilities_drop, ["ALL"]);
    assert!(!s.no_new_privs() && s.read_only_root_filesystem);
    let cleanup = p.container("cleanup-kube-proxy").unwrap();
    assert!(cleanup.security.no_new_privs());

    let agent = p.container("weir-agent").unwrap();
    let env: Vec<_> = agent.env.iter().map(|e| &e.value).collect();
    assert_eq!(
        env,
        [
            &EnvValue::Field(FieldRef::NodeName),
            &EnvValue::Field(FieldRef::PodNamespace)
        ]
    );
    for probe in [&agent.liveness, &agent.readiness] {
        let ProbeAction::HttpGet(h) = &probe.as_ref().unwrap().action else {
            panic!("httpGet")
        };
        assert_eq!(h.port, 10256, "the named port healthz");
    }
    // On the host network the node's port is the container's.
    assert!(
        agent
            .ports
            .iter()
            .all(|p| p.host_port == Some(p.container_port))
    );
    assert_eq!(agent.resources.memory_limit, Some(512 << 20));
    assert_eq!(agent.resources.cpu_request_milli, Some(100));
    let mounts: Vec<_> = agent
        .volume_mounts
        .iter()
        .map(|m| (m.name.as_str(), m.propagation, m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            ("bpf-maps", MountPropagation::HostToContainer, false),
            ("cgroup-root", MountPropagation::HostToContainer, true),
            ("hostproc", MountPropagation::None, true),
        ]
    );
    let types: Vec<_> = p
        .volumes
        .iter()
        .map(|v| match &v.source {
            VolumeSource::HostPath { path, kind } => (path.as_str(), *kind),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        types,
        [
            ("/sys/fs/bpf", HostPathType::DirectoryOrCreate),
            ("/run/weir/cgroupv2", HostPathType::DirectoryOrCreate),
            ("/proc", HostPathType::Directory),
            ("/run/xtables.lock", HostPathType::FileOrCreate),
        ]
    );
}

#[test]
fn mount_propagation_values() {
    let pod = |privileged: bool, mode: serde_json::Value| {
        from_json(json!({
            "volumes": [{"name": "bpf", "hostPath": {"path": "/sys/fs/bpf"}}],
            "containers": [container(json!({
                "securityContext": {"privileged": privileged},
                "volumeMounts": [{"name": "bpf", "mountPath": "/sys/fs/bpf", "mountPropagation": mode}],
            }))],
        }))
        .map(|p| p.containers[0].volume_mounts[0].propagation)
    };
    use MountPropagation as M;
    let table = [
        (false, json!(null), Ok(M::None)),
        (false, json!("None"), Ok(M::None)),
        (false, json!("HostToContainer"), Ok(M::HostToContainer)),
        (true, json!("HostToContainer"), Ok(M::HostToContainer)),
        (true, json!("Bidirectional"), Ok(M::Bidirectional)),
    ];
    for (privileged, mode, want) in table {
        assert_eq!(
            pod(privileged, mode.clone()),
            want,
            "{mode} privileged={privileged}"
        );
    }
    assert_eq!(
        pod(false, json!("Bidirectional")).unwrap_err(),
        [
            "spec.containers[0].volumeMounts[0].mountPropagation: forbidden: Bidirectional mount \
             propagation is available only to privileged containers (container \"c\", volume \
             mount \"bpf\" at /sys/fs/bpf)"
        ]
    );
    assert_eq!(
        pod(true, json!("rshared")).unwrap_err(),
        [
            "spec.containers[0].volumeMounts[0].mountPropagation: \"rshared\" is invalid: must be \
             Bidirectional, HostToContainer or None"
        ]
    );
}

#[test]
fn dns_policies_and_config() {
    let pod = |spec: serde_json::Value| {
        let mut s = json!({"containers": [container(json!({}))]});
        s.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        from_json(s)
    };
    for (policy, want) in [
        ("ClusterFirst", DnsPolicy::ClusterFirst),
        (
            "ClusterFirstWithHostNet",
            DnsPolicy::ClusterFirstWithHostNet,
        ),
        ("Default", DnsPolicy::Default),
    ] {
        let p = pod(json!({"hostNetwork": true, "dnsPolicy": policy})).unwrap();
        assert_eq!(p.dns_policy, want);
    }
    let p = pod(json!({"dnsPolicy": "None", "dnsConfig": {
        "nameservers": ["192.0.2.53"], "searches": ["a.example."],
        "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}],
    }}))
    .unwrap();
    assert_eq!(p.dns_policy, DnsPolicy::None);
    let c = p.dns_config.unwrap();
    assert_eq!(
        c.nameservers,
        ["192.0.2.53".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(c.options[1], ("edns0".to_owned(), None));

    let errors = |spec| pod(spec).unwrap_err();
    assert_eq!(
        errors(json!({"dnsPolicy": "None"})),
        ["spec.dnsConfig: forbidden: is required when dnsPolicy is None"]
    );
    assert_eq!(
        errors(json!({"dnsPolicy": "None", "dnsConfig": {"searches": ["a"]}})),
        [
            "spec.dnsConfig.nameservers: forbidden: must have at least one nameserver when dnsPolicy is None"
        ]
    );
    let e = errors(json!({"dnsConfig": {
        "nameservers": ["1.1.1.1", "1.1.1.2", "1.1.1.3", "x"],
        "searches": ["Bad_Domain"], "options": [{"value": "1"}],
    }}));
    assert_eq!(
        e,
        [
            "spec.dnsConfig.nameservers: \"1.1.1.1 1.1.1.2 1.1.1.3 x\" is invalid: must not have more than 3 nameservers",
            "spec.dnsConfig.nameservers[3]: \"x\" is invalid: must be an IP",
            "spec.dnsConfig.searches[0]: \"Bad_Domain\" is invalid: must be a DNS subdomain",
            "spec.dnsConfig.options[0].name: is required",
        ]
    );
    assert_eq!(
        errors(json!({"dnsPolicy": "Sometimes"})),
        [
            "spec.dnsPolicy: \"Sometimes\" is invalid: must be ClusterFirst, ClusterFirstWithHostNet, Default or None"
        ]
    );
}

#[test]
fn security_contexts_merge_and_validate() {
    let p = from_json(json!({
        "serviceAccountName": "agent",
        "shareProcessNamespace": true,
        "hostIPC": true,
        "securityContext": {
            "runAsUser": 1, "runAsGroup": 2, "supplementalGroups": [5],
            "seLinuxOptions": {"type": "pod_t"},
            "appArmorProfile": {"type": "Localhost", "localhostProfile": "weir"},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            container(json!({"name": "inherits"})),
            container(json!({"name": "own", "securityContext": {
                "runAsGroup": 3, "privileged": true,
                "seLinuxOptions": {"type": "spc_t", "level": "s0"},
                "appArmorProfile": {"type": "Unconfined"},
                "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/a.json"},
            }})),
        ],
    }))
    .unwrap();
    assert_eq!(p.service_account_name, "agent");
    assert!(p.share_process_namespace && p.host_ipc && p.has_privileged_container());
    assert_eq!(p.security.supplemental_groups, [5]);
    let inherits = &p.container("inherits").unwrap().security;
    assert_eq!(
        (inherits.run_as_user, inherits.run_as_group),
        (Some(1), Some(2))
    );
    assert_eq!(inherits.se_linux.as_ref().unwrap().type_, "pod_t");
    assert_eq!(
        inherits.app_armor,
        Some(SecurityProfile::Localhost("weir".into()))
    );
    assert_eq!(inherits.seccomp, Some(SecurityProfile::RuntimeDefault));
    assert_eq!(inherits.supplemental_groups, [5]);
    let own = &p.container("own").unwrap().security;
    assert_eq!((own.run_as_user, own.run_as_group), (Some(1), Some(3)));
    assert_eq!(own.se_linux.as_ref().unwrap().type_, "spc_t");
    assert_eq!(own.app_armor, Some(SecurityProfile::Unconfined));
    assert_eq!(
        own.seccomp,
        Some(SecurityProfile::Localhost("profiles/a.json".into()))
    );
    assert_eq!(
        from_json(json!({"containers": [container(json!({}))]}))
            .unwrap()
            .service_account_name,
        "default"
    );

    let errors = |sc: serde_json::Value| {
        from_json(json!({"containers": [container(json!({"securityContext": sc}))]})).unwrap_err()
    };
    let at = "spec.containers[0].securityContext";
    #[rustfmt::skip]
    let table = [
        (json!({"allowPrivilegeEscalation": false, "privileged": true}),
         format!("{at}.allowPrivilegeEscalation: forbidden: cannot be false when privileged is true")),
        (json!({"allowPrivilegeEscalation": false, "capabilities": {"add": ["SYS_ADMIN"]}}),
         format!("{at}.allowPrivilegeEscalation: forbidden: cannot be false when capabilities.add has SYS_ADMIN")),
        (json!({"appArmorProfile": {"type": "Localhost"}}),
         format!("{at}.appArmorProfile.localhostProfile: is required")),
        (json!({"appArmorProfile": {"type": "Unconfined", "localhostProfile": "x"}}),
         format!("{at}.appArmorProfile.localhostProfile: \"x\" is invalid: can only be set when type is Localhost")),
        (json!({"appArmorProfile": {"type": "Strict"}}),
         format!("{at}.appArmorProfile.type: \"Strict\" is invalid: must be Localhost, RuntimeDefault or Unconfined")),
        (json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "../etc/x"}}),
         format!("{at}.seccompProfile.localhostProfile: \"../etc/x\" is invalid: must be a relative path without '..'")),
    ];
    for (sc, want) in table {
        assert_eq!(errors(sc.clone()), [want], "{sc}");
    }
}

#[test]
fn host_network_ports() {
    let pod = |host_network: bool, port: serde_json::Value| {
        from_json(json!({"hostNetwork": host_network,
            "containers": [container(json!({"ports": [port]}))]}))
        .map(|p| p.containers[0].ports[0].host_port)
    };
    assert_eq!(pod(true, json!({"containerPort": 80})), Ok(Some(80)));
    assert_eq!(
        pod(true, json!({"containerPort": 80, "hostPort": 80})),
        Ok(Some(80))
    );
    assert_eq!(pod(false, json!({"containerPort": 80})), Ok(None));
    assert_eq!(
        pod(true, json!({"containerPort": 80, "hostPort": 8080})),
        Err(vec![
            "spec.containers[0].ports[0].hostPort: \"8080\" is invalid: must match containerPort \
             when hostNetwork is true"
                .to_owned()
        ])
    );
}

/// Issue 12 item 3: fsGroup joins the groups (first, as the kubelet lists
/// them), `procMount: Unmasked` and `hostUsers: false` are refused (no user
/// namespaces here), and the restricted profile's fields come through.
#[test]
fn restricted_profile_fs_group_and_proc_mount() {
    let p = from_json(json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
                            "fsGroup": 2000, "supplementalGroups": [3000],
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container(json!({"securityContext": {
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]}, "procMount": "Default"}}))],
    }))
    .unwrap();
    assert_eq!(p.security.fs_group, Some(2000));
    assert_eq!(p.security.supplemental_groups, [2000, 3000]);
    let sc = &p.containers[0].security;
    assert!(sc.run_as_non_root && sc.no_new_privs() && sc.read_only_root_filesystem);
    assert_eq!(
        (sc.run_as_user, sc.run_as_group),
        (Some(65534), Some(65534))
    );
    assert_eq!(sc.supplemental_groups, [2000, 3000]);
    assert_eq!(sc.capabilities_drop, ["ALL"]);
    assert_eq!(sc.seccomp, Some(SecurityProfile::RuntimeDefault));

    let errs = from_json(json!({"containers": [
        container(json!({"securityContext": {"procMount": "Unmasked"}})),
    ]}))
    .unwrap_err();
    assert_eq!(
        errs,
        [
            "spec.containers[0].securityContext.procMount: forbidden: `hostUsers` must be false to use `Unmasked`"
        ]
    );
    let errs = from_json(json!({"containers": [
        container(json!({"securityContext": {"procMount": "Masked"}})),
    ]}))
    .unwrap_err();
    assert!(errs[0].contains("must be Default or Unmasked"), "{errs:?}");
    let errs =
        from_json(json!({"hostUsers": false, "containers": [container(json!({}))]})).unwrap_err();
    assert_eq!(
        errs,
        ["spec.hostUsers: user namespaces (hostUsers: false) is not supported by this kubelet"]
    );
}
