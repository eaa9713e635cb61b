//! Chart values that change the agent's flags, image, resources and init
//! containers.
use crate::{
    checks::{AGENT_CAPS, AGENT_CAPS_MINIMAL, caps, default_args, set, strs},
    render::{render_err, render_ok},
};

#[test]
fn k8s_service_host_is_passed_to_the_agent() {
    let r = render_ok(&["--set", "k8sServiceHost=10.0.0.1"]);
    r.check_all_typed();
    let mut want = strs(&["--k8s-api-server=10.0.0.1:6443"]);
    want.extend(default_args());
    assert_eq!(r.args(), want);

    let r = render_ok(&["--set", "k8sServiceHost=fd00::1,k8sServicePort=443"]);
    assert_eq!(r.args()[0], "--k8s-api-server=[fd00::1]:443");
    let r = render_ok(&["--set", "k8sServiceHost=api.example.com"]);
    assert_eq!(r.args()[0], "--k8s-api-server=api.example.com:6443");
}

#[test]
fn datapath_options_render_as_flags() {
    let r = render_ok(&[
        "--set",
        "socketLB=false,acceleration=native,nodePortRange=20000-22767",
        "--set",
        "devices={eth0,bond0.100}",
    ]);
    r.check_all_typed();
    let args = r.args();
    for want in [
        "--socket-lb=false",
        "--acceleration=native",
        "--devices=eth0,bond0.100",
        "--nodeport-range=20000-22767",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    assert_eq!(
        args.iter().filter(|a| a.starts_with("--devices")).count(),
        1
    );
    assert!(
        default_args().iter().any(|a| a == "--devices=auto"),
        "--devices=auto by default"
    );
    // An empty list: socket load balancing only, no --devices at all.
    // `--set devices={}` is `[""]` in Helm, which the schema rejects
    // (validation.rs).
    let r = render_ok(&["--set-json", "devices=[]"]);
    r.check_all_typed();
    assert!(
        !r.args().iter().any(|a| a.starts_with("--devices")),
        "{:?}",
        r.args()
    );
    let r = render_ok(&["--set", "devices={auto,lxc+}"]);
    assert!(r.args().contains(&"--devices=auto,lxc+".to_owned()));
    let r = render_ok(&["--set", "acceleration=best-effort"]);
    assert!(r.args().contains(&"--acceleration=best-effort".to_owned()));
    let r = render_ok(&[
        "--set",
        "loadBalancer.algorithm=maglev,loadBalancer.maglevTableSize=65521,loadBalancer.maxMaglevTables=100",
    ]);
    r.check_all_typed();
    for want in [
        "--lb-algorithm=maglev",
        "--maglev-table-size=65521",
        "--max-maglev-tables=100",
    ] {
        assert!(
            r.args().iter().any(|a| a == want),
            "{want} in {:?}",
            r.args()
        );
    }
}

#[test]
fn packet_datapath_values_render_as_flags() {
    let r = render_ok(&[
        "--set",
        "devices={eth0,lxc+},snatPortRange=40000-40999",
        "--set",
        "accelerationDevices={eth0}",
    ]);
    r.check_all_typed();
    let args = r.args();
    for want in [
        "--devices=eth0,lxc+",
        "--acceleration-devices=eth0",
        "--snat-port-range=40000-40999",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    assert!(
        !default_args()
            .iter()
            .any(|a| a.starts_with("--acceleration-devices")),
        "all devices get XDP by default"
    );
}

/// `memlockCapability: false` takes SYS_RESOURCE away and nothing else,
/// with or without pod UDP socket termination.
#[test]
fn memlock_capability_only_narrows() {
    for extra in [&[][..], &["--set", "terminatePodUdpSockets=false"]] {
        let mut args = vec!["--set", "memlockCapability=false"];
        args.extend_from_slice(extra);
        let r = render_ok(&args);
        r.check_all_typed();
        let (add, drop) = caps(&r.agent());
        let full = if extra.is_empty() {
            AGENT_CAPS
        } else {
            AGENT_CAPS_MINIMAL
        };
        let mut want = set(full);
        want.remove("SYS_RESOURCE");
        assert_eq!(add, want, "{args:?}");
        assert_eq!(drop, ["ALL"]);
    }
}

/// `terminatePodUdpSockets: false`: the agent keeps exactly its four
/// capabilities, no host /proc, no --proc-root.
#[test]
fn pod_udp_socket_termination_can_be_turned_off() {
    let r = render_ok(&["--set", "terminatePodUdpSockets=false"]);
    r.check_all_typed();
    let agent = r.agent();
    let (add, drop) = caps(&agent);
    assert_eq!(add, set(AGENT_CAPS_MINIMAL));
    assert_eq!(drop, ["ALL"]);
    let sc = agent.security_context.clone().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let mounts: Vec<String> = agent
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_path)
        .collect();
    assert_eq!(mounts, ["/sys/fs/bpf", "/run/weir/cgroupv2"]);
    let want: Vec<String> = default_args()
        .into_iter()
        .filter(|a| !a.starts_with("--proc-root"))
        .collect();
    assert_eq!(r.args(), want);
}

#[test]
fn metrics_disabled_passes_empty_address() {
    let r = render_ok(&["--set", "metrics.enabled=false"]);
    r.check_all_typed();
    let args = r.args();
    assert!(args.contains(&"--metrics-addr=".to_owned()), "{args:?}");
    assert_eq!(
        args.iter()
            .filter(|a| a.starts_with("--metrics-addr"))
            .count(),
        1
    );
    let ports: Vec<String> = r
        .agent()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| p.name.unwrap())
        .collect();
    assert_eq!(ports, ["healthz"]);

    let r = render_ok(&["--set", "metrics.bindAddress=::,metrics.port=9100"]);
    assert!(r.args().contains(&"--metrics-addr=[::]:9100".to_owned()));
}

#[test]
fn cleanup_kube_proxy_init_container() {
    let r = render_ok(&["--set", "cleanupKubeProxy.enabled=true"]);
    r.check_all_typed();
    let pod = r.pod();
    let inits = pod.init_containers.unwrap();
    assert_eq!(
        inits.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["mount-bpf-cgroup", "cleanup-kube-proxy"]
    );
    let c = &inits[1];
    assert_eq!(c.command.as_deref(), Some(&strs(&["weir-agent"])[..]));
    assert_eq!(c.args.as_deref(), Some(&strs(&["cleanup-kube-proxy"])[..]));
    assert_eq!(c.image, r.agent().image);
    let (add, drop) = caps(c);
    assert_eq!(add, set(&["NET_ADMIN", "NET_RAW"]));
    assert_eq!(drop, ["ALL"]);
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let m = &c.volume_mounts.clone().unwrap()[0];
    assert_eq!(
        (m.name.as_str(), m.mount_path.as_str()),
        ("xtables-lock", "/run/xtables.lock")
    );
    let lock = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "xtables-lock")
        .unwrap()
        .host_path
        .unwrap();
    assert_eq!(
        (lock.path.as_str(), lock.type_.as_deref()),
        ("/run/xtables.lock", Some("FileOrCreate"))
    );
    // The agent's own capabilities do not grow.
    assert_eq!(caps(&r.agent()).0, set(AGENT_CAPS));

    let r = render_ok(&[
        "--set",
        "cleanupKubeProxy.enabled=true,cleanupKubeProxy.dryRun=true",
    ]);
    let inits = r.pod().init_containers.unwrap();
    assert_eq!(
        inits[1].args.as_deref(),
        Some(&strs(&["cleanup-kube-proxy", "--dry-run"])[..])
    );
}

/// A values file, as `helm install -f`: YAML numbers are float64 in Helm, so
/// large map sizes must still render as integers.
#[test]
fn values_file_customises_image_resources_and_maps() {
    let dir = std::env::temp_dir().join(format!("weir-helm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("values.yaml");
    std::fs::write(
        &file,
        r#"
image:
  repository: registry.example.com/net/weir-agent
  tag: v9.8.7
  digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  pullPolicy: Always
resources:
  requests: {cpu: 250m, memory: 256Mi}
  limits: {memory: 1Gi}
maps:
  maxServices: 1048576
  maxBackends: 4194304
logFormat: json
extraArgs: ["--foo=bar", "--verbose"]
extraEnv:
  - name: RUST_LOG
    value: debug
podAnnotations:
  example.com/team: net
nodeSelector:
  kubernetes.io/os: linux
  node-role.example.com/lb: "true"
"#,
    )
    .unwrap();
    let r = render_ok(&["--values", file.to_str().unwrap()]);
    // --set goes over the file key by key, as in helm's values.Options.
    let over = render_ok(&[
        "--values",
        file.to_str().unwrap(),
        "--set",
        "maps.maxBackends=8,maps.maxRevSock=4096,logFormat=text",
    ]);
    std::fs::remove_dir_all(&dir).ok();
    let args = over.args();
    for want in [
        "--max-services=1048576",
        "--max-backends=8",
        "--max-revsock=4096",
        "--log-format=text",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} in {args:?}");
    }
    r.check_all_typed();
    let agent = r.agent();
    let image = "registry.example.com/net/weir-agent:v9.8.7@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert_eq!(agent.image.as_deref(), Some(image));
    assert_eq!(agent.image_pull_policy.as_deref(), Some("Always"));
    let init = &r.pod().init_containers.unwrap()[0];
    assert_eq!(
        init.image.as_deref(),
        Some(image),
        "init containers use the same image"
    );
    let res = agent.resources.clone().unwrap();
    assert_eq!(res.requests.unwrap()["cpu"].0, "250m");
    assert_eq!(res.limits.unwrap()["memory"].0, "1Gi");
    let args = r.args();
    let n = args.len();
    assert_eq!(&args[n - 2..], ["--foo=bar", "--verbose"], "extraArgs last");
    for want in [
        "--max-services=1048576",
        "--max-backends=4194304",
        "--log-format=json",
    ] {
        assert!(args.contains(&want.to_owned()), "{want} in {args:?}");
    }
    let env = agent.env.unwrap();
    assert!(
        env.iter()
            .any(|e| e.name == "RUST_LOG" && e.value.as_deref() == Some("debug"))
    );
    let ds = r.ds();
    let meta = ds.spec.unwrap().template.metadata.unwrap();
    assert_eq!(meta.annotations.unwrap()["example.com/team"], "net");
    assert_eq!(
        r.pod().node_selector.unwrap()["node-role.example.com/lb"],
        "true"
    );

    // --set integers are int64, as in Helm.
    let r = render_ok(&["--set", "maps.maxServices=1000000"]);
    assert!(r.args().contains(&"--max-services=1000000".to_owned()));
}

/// Nodes whose bpffs or cgroup2 live elsewhere, and a kubeconfig mounted
/// from the host: the volumes and the init container follow the values,
/// while the agent's paths inside the container stay fixed.
#[test]
fn host_paths_and_extra_volumes_follow_the_values() {
    let r = render_ok(&[
        "--set",
        "bpf.root=/run/bpffs",
        "--set",
        "cgroup.hostRoot=/sys/fs/cgroup",
        "--set-json",
        r#"extraVolumes=[{"name":"kc","hostPath":{"path":"/etc/weir/kc","type":"File"}}]"#,
        "--set-json",
        r#"extraVolumeMounts=[{"name":"kc","mountPath":"/etc/weir/kubeconfig","readOnly":true}]"#,
        "--set-json",
        r#"extraArgs=["--kubeconfig=/etc/weir/kubeconfig"]"#,
    ]);
    r.check_all_typed();
    let pod = r.pod();
    let host_paths: Vec<(String, String)> = pod
        .volumes
        .clone()
        .unwrap()
        .into_iter()
        .filter_map(|v| Some((v.name, v.host_path?.path)))
        .collect();
    assert_eq!(
        host_paths,
        [
            ("bpf-maps".to_owned(), "/run/bpffs".to_owned()),
            ("cgroup-root".to_owned(), "/sys/fs/cgroup".to_owned()),
            ("hostproc".to_owned(), "/proc".to_owned()),
            ("kc".to_owned(), "/etc/weir/kc".to_owned()),
        ]
    );
    let env: Vec<(String, Option<String>)> = pod.init_containers.unwrap()[0]
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    assert_eq!(
        env,
        [
            ("BPF_ROOT".to_owned(), Some("/run/bpffs".to_owned())),
            ("CGROUP_ROOT".to_owned(), Some("/sys/fs/cgroup".to_owned())),
        ]
    );
    let agent = r.agent();
    let mounts: Vec<String> = agent
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_path)
        .collect();
    assert_eq!(
        mounts,
        [
            "/sys/fs/bpf",
            "/run/weir/cgroupv2",
            "/host/proc",
            "/etc/weir/kubeconfig"
        ]
    );
    let args = r.args();
    assert!(
        args.contains(&"--bpffs=/sys/fs/bpf/weir".to_owned()),
        "{args:?}"
    );
    assert_eq!(
        args.last().map(String::as_str),
        Some("--kubeconfig=/etc/weir/kubeconfig")
    );
}

#[test]
fn host_paths_must_be_absolute() {
    for (set, field) in [
        ("bpf.root=sys/fs/bpf", "/bpf/root"),
        ("cgroup.hostRoot=cgroup", "/cgroup/hostRoot"),
    ] {
        let e = render_err(&["--set", set]);
        assert!(e.contains(field) && e.contains("pattern"), "{set}: {e}");
    }
}
