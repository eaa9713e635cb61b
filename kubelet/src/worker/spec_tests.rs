//! The CRI configs a node agent's pod gets: host namespaces, privilege,
//! security profiles and mount propagation, as kuberuntime builds them.
use std::path::PathBuf;

use serde_json::json;

use super::*;

fn config(dir: &Path) -> WorkerConfig {
    let mut c = WorkerConfig::new(&crate::config::Config::default(), "node1");
    c.pods_dir = dir.join("pods");
    c.pod_log_dir = dir.join("logs");
    c.resolv_conf = dir.join("resolv.conf");
    c.node_ip = "192.0.2.10".parse().ok();
    c.cluster_dns = vec!["10.96.0.10".parse().unwrap()];
    c.cluster_domain = Some("cluster.local".into());
    c
}

fn pod(spec: serde_json::Value) -> PodSpec {
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": "kube-system", "uid": "u1"},
        "spec": spec,
    }))
    .unwrap();
    PodSpec::from_api(&pod).unwrap_or_else(|e| panic!("{e}"))
}

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("weir-spec-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("resolv.conf"),
            "nameserver 192.0.2.1\nsearch node.example\n",
        )
        .unwrap();
        Self(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn container<'a>(i: &'a ContainerInputs<'a>) -> ContainerConfig {
    container_config(i).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn host_network_privileged_pod() {
    let d = Dir::new("hostnet");
    let cfg = config(&d.0);
    let host = d.0.join("host");
    let spec = pod(json!({
        "hostNetwork": true, "hostPID": true,
        "dnsPolicy": "ClusterFirst",
        "volumes": [{"name": "h", "hostPath": {"path": host, "type": "DirectoryOrCreate"}}],
        "containers": [
            {"name": "priv", "image": "i:1", "securityContext": {"privileged": true},
             "volumeMounts": [
                {"name": "h", "mountPath": "/bidi", "mountPropagation": "Bidirectional"},
                {"name": "h", "mountPath": "/slave", "mountPropagation": "HostToContainer"},
                {"name": "h", "mountPath": "/private"},
             ]},
            {"name": "caps", "image": "i:1", "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"add": ["NET_ADMIN", "BPF"], "drop": ["ALL"]},
                "appArmorProfile": {"type": "Unconfined"},
                "seLinuxOptions": {"type": "spc_t"},
            }},
        ],
    }));
    let sb = sandbox_config(&cfg, &spec, 0);
    let s = &sb.security;
    assert!(s.host_network && s.host_pid && !s.host_ipc);
    assert!(
        s.privileged,
        "a privileged container needs a privileged sandbox"
    );
    assert_eq!(sb.hostname, "", "the runtime keeps the node's hostname");
    // ClusterFirst on the host network falls back to the node's resolver.
    let dns = sb.dns.as_ref().unwrap();
    assert_eq!(dns.servers, ["192.0.2.1"]);
    assert_eq!(dns.searches, ["node.example"]);

    let inputs = |name| ContainerInputs {
        cfg: &cfg,
        pod: &spec,
        container: spec.container(name).unwrap(),
        restart_count: 0,
        pod_ip: cfg.node_ip,
    };
    let priv_ = container(&inputs("priv"));
    assert!(priv_.security.privileged);
    let mounts: Vec<_> = priv_
        .mounts
        .iter()
        .map(|m| (m.container_path.to_str().unwrap(), m.propagation))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/bidi", cri::MountPropagation::Bidirectional),
            ("/slave", cri::MountPropagation::HostToContainer),
            ("/private", cri::MountPropagation::Private),
        ]
    );
    assert!(priv_.mounts.iter().all(|m| m.host_path == host));
    assert!(host.is_dir(), "DirectoryOrCreate made it");

    let caps = container(&inputs("caps")).security;
    assert!(!caps.privileged && caps.no_new_privs);
    assert_eq!(caps.capabilities_add, ["NET_ADMIN", "BPF"]);
    assert_eq!(caps.capabilities_drop, ["ALL"]);
    assert_eq!(caps.apparmor, Some(cri::SecurityProfile::Unconfined));
    assert_eq!(caps.selinux.unwrap().type_, "spc_t");
    // The kubelet's seccompDefault: false.
    assert_eq!(caps.seccomp, Some(cri::SecurityProfile::Unconfined));
}

#[test]
fn localhost_seccomp_profiles_are_files_below_the_root_dir() {
    let d = Dir::new("seccomp");
    let mut cfg = config(&d.0);
    cfg.seccomp_dir = PathBuf::from("/var/lib/kubelet/seccomp");
    let spec = pod(json!({
        "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "pod.json"}},
        "containers": [{"name": "c", "image": "i:1", "securityContext": {
            "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/c.json"}}}],
    }));
    let local = |p: &str| Some(cri::SecurityProfile::Localhost(p.into()));
    let sb = sandbox_config(&cfg, &spec, 0);
    assert_eq!(
        sb.security.seccomp,
        local("/var/lib/kubelet/seccomp/pod.json")
    );
    let c = container(&ContainerInputs {
        cfg: &cfg,
        pod: &spec,
        container: spec.container("c").unwrap(),
        restart_count: 0,
        pod_ip: None,
    });
    assert_eq!(
        c.security.seccomp,
        local("/var/lib/kubelet/seccomp/profiles/c.json")
    );
}

#[test]
fn dns_of_host_network_pods_by_policy() {
    let d = Dir::new("dns");
    let mut cfg = config(&d.0);
    let dns_of = |cfg: &WorkerConfig, policy: &str, extra: serde_json::Value| {
        let mut spec = json!({"hostNetwork": true, "dnsPolicy": policy,
            "containers": [{"name": "c", "image": "i:1"}]});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let d = sandbox_config(cfg, &pod(spec), 0).dns.unwrap();
        (d.servers, d.searches)
    };
    let node = (
        vec!["192.0.2.1".to_owned()],
        vec!["node.example".to_owned()],
    );
    assert_eq!(dns_of(&cfg, "Default", json!({})), node);
    assert_eq!(dns_of(&cfg, "ClusterFirst", json!({})), node);
    let (servers, searches) = dns_of(&cfg, "ClusterFirstWithHostNet", json!({}));
    assert_eq!(servers, ["10.96.0.10"]);
    assert_eq!(searches[0], "kube-system.svc.cluster.local");
    let none = json!({"dnsConfig": {"nameservers": ["198.51.100.1"], "searches": ["x.example"]}});
    assert_eq!(
        dns_of(&cfg, "None", none),
        (
            vec!["198.51.100.1".to_owned()],
            vec!["x.example".to_owned()]
        )
    );
    cfg.resolv_conf = PathBuf::new();
    assert_eq!(
        dns_of(&cfg, "Default", json!({})),
        (vec!["127.0.0.1".to_owned()], vec![".".to_owned()])
    );
}

#[test]
fn pod_network_pods_keep_their_namespaces_and_hostname() {
    let d = Dir::new("podnet");
    let cfg = config(&d.0);
    let spec = pod(json!({"shareProcessNamespace": true,
        "containers": [{"name": "c", "image": "i:1"}]}));
    let sb = sandbox_config(&cfg, &spec, 0);
    assert_eq!(sb.hostname, "agent");
    let s = &sb.security;
    assert!(!s.host_network && !s.privileged && s.share_process_namespace);
}

#[test]
fn host_path_type_failures_name_the_volume() {
    let d = Dir::new("hostpath");
    let cfg = config(&d.0);
    let spec = pod(json!({
        "volumes": [{"name": "sock", "hostPath": {"path": d.0.join("resolv.conf"), "type": "Socket"}}],
        "containers": [{"name": "c", "image": "i:1",
            "volumeMounts": [{"name": "sock", "mountPath": "/run/x.sock"}]}],
    }));
    let i = ContainerInputs {
        cfg: &cfg,
        pod: &spec,
        container: &spec.containers[0],
        restart_count: 0,
        pod_ip: None,
    };
    let e = container_config(&i).unwrap_err().to_string();
    assert!(
        e.starts_with("volume \"sock\": hostPath type check failed: ")
            && e.ends_with("is not a socket file"),
        "{e}"
    );
}
