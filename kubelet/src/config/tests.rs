//! The file as the kubelet reads it: defaults, validation, messages.
use super::*;

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn parse(body: &str) -> Result<Config, ConfigError> {
    parse_str(&format!("{HEAD}{body}"))
}

fn message(body: &str) -> String {
    parse(body).unwrap_err().to_string()
}

#[test]
fn defaults_are_the_kubelets() {
    let c = parse("").unwrap();
    assert_eq!(c.address, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    assert_eq!(c.port, 10250);
    assert_eq!(c.healthz_port, Some(10248));
    assert_eq!(c.healthz_bind_address, IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(c.static_pod_path, None);
    assert_eq!(c.file_check_frequency, Duration::from_secs(20));
    assert!(c.cluster_dns.is_empty());
    assert_eq!(c.cluster_domain, None);
    assert_eq!(c.resolv_conf, PathBuf::from("/etc/resolv.conf"));
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(c.node_lease_duration, Duration::from_secs(40));
    assert_eq!(c.lease_renew_interval(), Duration::from_secs(10));
    assert_eq!(
        c.container_runtime_endpoint,
        PathBuf::from("/run/containerd/containerd.sock")
    );
    assert_eq!(c.max_pods, 110);
    assert_eq!(c.client_ca_file, None);
    assert_eq!(c.tls, None);
    assert_eq!(c.read_only_port, None);
    assert_eq!(Config::default(), c);
}

#[test]
fn every_honoured_field_is_read() {
    let c = parse(
        "address: 10.0.0.5\nport: 10251\nhealthzPort: 0\nhealthzBindAddress: '::1'\n\
         staticPodPath: /etc/kubernetes/manifests\nfileCheckFrequency: 1m30s\n\
         clusterDNS: [10.96.0.10, 'fd00::a']\nclusterDomain: cluster.local.\n\
         nodeStatusUpdateFrequency: 500ms\nnodeLeaseDurationSeconds: 60\n\
         containerRuntimeEndpoint: unix:///tmp/c.sock\nmaxPods: 20\n\
         authentication:\n  x509:\n    clientCAFile: /ca.crt\n  anonymous:\n    enabled: false\n\
         tlsCertFile: /tls.crt\ntlsPrivateKeyFile: /tls.key\nreadOnlyPort: 10255\n\
         resolvConf: ''\n",
    )
    .unwrap();
    assert_eq!(c.resolv_conf, PathBuf::new());
    assert_eq!(c.address, "10.0.0.5".parse::<IpAddr>().unwrap());
    assert_eq!(c.port, 10251);
    assert_eq!(c.healthz_port, None);
    assert_eq!(c.healthz_bind_address, "::1".parse::<IpAddr>().unwrap());
    assert_eq!(
        c.static_pod_path.as_deref(),
        Some(Path::new("/etc/kubernetes/manifests"))
    );
    assert_eq!(c.file_check_frequency, Duration::from_secs(90));
    assert_eq!(c.cluster_dns.len(), 2);
    assert_eq!(c.cluster_domain.as_deref(), Some("cluster.local"));
    assert_eq!(c.node_status_update_frequency, Duration::from_millis(500));
    assert_eq!(c.lease_renew_interval(), Duration::from_secs(15));
    assert_eq!(c.container_runtime_endpoint, PathBuf::from("/tmp/c.sock"));
    assert_eq!(c.max_pods, 20);
    assert_eq!(c.client_ca_file, Some(PathBuf::from("/ca.crt")));
    assert_eq!(c.tls.unwrap().key_file, PathBuf::from("/tls.key"));
    assert_eq!(c.read_only_port, Some(10255));
}

#[test]
fn container_log_rotation_settings() {
    let c = parse("").unwrap();
    assert_eq!(
        (
            c.container_log_max_size,
            c.container_log_max_files,
            c.container_log_monitor_interval
        ),
        (10 << 20, 5, Duration::from_secs(10))
    );
    let c = parse(
        "containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 2\ncontainerLogMonitorInterval: 3s\n",
    )
    .unwrap();
    assert_eq!(
        (
            c.container_log_max_size,
            c.container_log_max_files,
            c.container_log_monitor_interval
        ),
        (1 << 20, 2, Duration::from_secs(3))
    );
    assert_eq!(
        message("containerLogMaxFiles: 1"),
        "containerLogMaxFiles: 1 is out of range 2-2147483647"
    );
    assert_eq!(
        message("containerLogMaxSize: '0'"),
        "containerLogMaxSize: \"0\" is not a positive quantity of bytes"
    );
    assert_eq!(
        message("containerLogMonitorInterval: 1s"),
        "containerLogMonitorInterval: \"1s\" must be at least 3s"
    );
}

#[test]
fn json_is_accepted() {
    let c = parse_str(
        r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","port":1}"#,
    )
    .unwrap();
    assert_eq!(c.port, 1);
}

#[test]
fn invalid_values_name_their_field() {
    assert_eq!(
        message("port: 70000"),
        "port: 70000 is out of range 1-65535"
    );
    assert_eq!(
        message("fileCheckFrequency: x"),
        r#"fileCheckFrequency: "x" is not a duration"#
    );
    assert_eq!(
        message("clusterDNS: [10.0.0.1, a.b]"),
        r#"clusterDNS[1]: "a.b" is not an IP"#
    );
    assert_eq!(
        message("address: nowhere"),
        r#"address: "nowhere" is not an IP"#
    );
    // Zero is the default (the kubelet's defaulting); below it is not.
    assert_eq!(
        parse("nodeStatusUpdateFrequency: 0s")
            .unwrap()
            .node_status_update_frequency,
        Duration::from_secs(10)
    );
    assert_eq!(
        message("nodeStatusUpdateFrequency: -1s"),
        r#"nodeStatusUpdateFrequency: "-1s" is not a duration"#
    );
    assert_eq!(
        message("maxPods: -1"),
        "maxPods: -1 is out of range 0-2147483647"
    );
    assert!(message("containerRuntimeEndpoint: tcp://x:1").contains("not a unix socket"));
    assert!(message("clusterDomain: Bad_Domain").contains("not a DNS domain"));
    assert_eq!(
        message("tlsCertFile: /a"),
        "tlsPrivateKeyFile: is required when tlsCertFile is set"
    );
    assert!(message("authentication: {anonymous: {enabled: true}}").contains("anonymous"));
}

#[test]
fn all_problems_are_reported_at_once() {
    let e = message("port: 70000\nreadOnlyPort: 99999");
    assert_eq!(
        e,
        "port: 70000 is out of range 1-65535; readOnlyPort: 99999 is out of range 0-65535"
    );
}

#[test]
fn unknown_and_mistyped_fields_are_refused() {
    let e = message("cgroupDriverr: systemd");
    assert!(e.contains("unknown field `cgroupDriverr`"), "{e}");
    let e = message("authentication: {x509: {clientCAFile: /a, extra: 1}}");
    assert!(e.starts_with("authentication.x509"), "{e}");
    assert!(e.contains("unknown field `extra`"), "{e}");
    let e = message("port: ten");
    assert!(e.starts_with("port: invalid type"), "{e}");
}

#[test]
fn wrong_or_missing_type_meta_is_refused() {
    let e = parse_str("apiVersion: v1\nkind: Pod\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with(r#"apiVersion: "v1" is not supported"#), "{e}");
    assert!(e.contains(r#"kind: "Pod" is not supported"#), "{e}");
    let e = parse_str("port: 1\n").unwrap_err().to_string();
    assert!(e.starts_with("apiVersion: is required"), "{e}");
    assert!(matches!(
        parse_str("port: [").unwrap_err(),
        ConfigError::Syntax { .. }
    ));
}

#[test]
fn authorization_mode_and_cache_ttls() {
    use AuthorizationMode::*;
    let d = parse("").unwrap().authorization;
    assert_eq!(d.mode, None);
    assert_eq!(d.cache_authorized_ttl, Duration::from_secs(300));
    assert_eq!(d.cache_unauthorized_ttl, Duration::from_secs(30));
    // Unset: Webhook as the kubelet's default, except standalone.
    assert_eq!(d.mode_for(true).unwrap(), Webhook);
    assert_eq!(d.mode_for(false).unwrap(), AlwaysAllow);
    let a = parse(
        "authorization: {mode: Webhook, webhook: \
         {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: '0'}}",
    )
    .unwrap()
    .authorization;
    assert_eq!(a.mode, Some(Webhook));
    assert_eq!(a.cache_authorized_ttl, Duration::from_secs(60));
    // Zero is unset, as the kubelet's defaulting reads it.
    assert_eq!(a.cache_unauthorized_ttl, Duration::from_secs(30));
    assert!(a.mode_for(false).is_err());
    let allow = parse("authorization: {mode: AlwaysAllow}").unwrap();
    assert_eq!(allow.authorization.mode_for(true).unwrap(), AlwaysAllow);
    assert!(message("authorization: {mode: RBAC}").starts_with("authorization.mode"));
    assert!(message("authorization: {webhook: {cacheAuthorizedTTL: x}}").contains("TTL"));
}

#[test]
fn go_durations() {
    let d = |s| parse_go_duration(s);
    assert_eq!(d("20s"), Some(Duration::from_secs(20)));
    assert_eq!(d("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(d("1.5h"), Some(Duration::from_secs(5400)));
    assert_eq!(d("2h45m"), Some(Duration::from_secs(9900)));
    assert_eq!(d("300ms"), Some(Duration::from_millis(300)));
    assert_eq!(d("1us"), Some(Duration::from_micros(1)));
    assert_eq!(d(".5s"), Some(Duration::from_millis(500)));
    assert_eq!(d("0"), Some(Duration::ZERO));
    for bad in ["", "x", "10", "1x", "-1s", "1..5s", ".s", "s"] {
        assert_eq!(d(bad), None, "{bad}");
    }
}

/// What `kubeadm init` writes to /var/lib/kubelet/config.yaml (1.3x), with
/// its zero durations and the fields this kubelet does not act on.
const KUBEADM: &str = r#"apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: cgroupfs
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
cpuManagerReconcilePeriod: 0s
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
resolvConf: /run/systemd/resolve/resolv.conf
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
"#;

#[test]
fn kubeadms_file_loads_with_one_warning_per_field_not_acted_on() {
    let c = parse_str(KUBEADM).unwrap();
    // Zero values are the kubelet's defaults.
    let d = Config::default();
    assert_eq!(c.sync_frequency, d.sync_frequency);
    assert_eq!(c.file_check_frequency, d.file_check_frequency);
    assert_eq!(
        c.node_status_update_frequency,
        d.node_status_update_frequency
    );
    assert_eq!(c.container_runtime_endpoint, d.container_runtime_endpoint);
    assert_eq!(
        c.authorization.cache_authorized_ttl,
        Duration::from_secs(300)
    );
    assert_eq!(c.authorization.mode, Some(AuthorizationMode::Webhook));
    assert_eq!(c.client_ca_file, Some("/etc/kubernetes/pki/ca.crt".into()));
    assert_eq!(c.static_pod_path, Some("/etc/kubernetes/manifests".into()));
    let ignored: Vec<&str> = c.ignored.iter().map(|i| i.field).collect();
    assert_eq!(
        ignored,
        [
            "authentication.webhook",
            "logging",
            "rotateCertificates",
            "httpCheckFrequency",
            "streamingConnectionIdleTimeout",
            "nodeStatusReportFrequency",
            "imageMinimumGCAge",
            "imageMaximumGCAge",
            "volumeStatsAggPeriod",
            "cpuManagerReconcilePeriod",
            "runtimeRequestTimeout",
            "memorySwap",
        ]
    );
    assert!(c.ignored.iter().all(|i| !i.why.is_empty()));
    // Accepted without a word: they ask for what this kubelet does.
    assert!(!ignored.contains(&"cgroupDriver"));
    assert!(!ignored.contains(&"shutdownGracePeriod"));
}

#[test]
fn settings_this_kubelet_cannot_honour_are_refused_with_the_reason() {
    let e = message(
        "cgroupDriver: systemd\ncpuManagerPolicy: static\nkubeReserved: {cpu: 100m}\n\
         shutdownGracePeriod: 30s\n",
    );
    for (field, why) in [
        ("cgroupDriver: \"systemd\"", "SystemdCgroup = false"),
        ("cpuManagerPolicy: \"static\"", "not pinned"),
        ("kubeReserved: {\"cpu\":\"100m\"}", "allocatable"),
        ("shutdownGracePeriod", "graceful node shutdown"),
    ] {
        assert!(e.contains(field) && e.contains(why), "{field}, {why}: {e}");
    }
    // What kind writes to turn eviction off is what this kubelet does.
    let kind = parse(
        "evictionHard: {imagefs.available: 0%, nodefs.available: 0%, nodefs.inodesFree: 0%}\n\
         cgroupDriver: cgroupfs\ncpuManagerPolicy: none\nkubeReserved: {}\n",
    )
    .unwrap();
    assert!(kind.ignored.is_empty(), "{:?}", kind.ignored);
    // A given map replaces the defaults, so kind's turns eviction off.
    assert!(kind.eviction.thresholds.is_empty());
    assert!(
        message("evictionHard: {memory.available: 100Mi, pid.available: 10%}")
            .contains("evictionHard.pid.available: unsupported eviction signal")
    );
    assert!(
        message("evictionSoft: {memory.available: 1Gi}")
            .contains("evictionSoftGracePeriod.memory.available: a soft threshold needs")
    );
    // A field no kubelet knows is still a typo.
    assert!(message("cgroupDrivers: cgroupfs").contains("unknown field `cgroupDrivers`"));
}
