//! KubeProxyConfiguration files as kubeadm and operators write them.
use super::*;

/// The ConfigMap kubeadm writes for kube-proxy (1.31), with the fields it
/// leaves to the defaults as zeros and nulls.
const KUBEADM: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

#[test]
fn kubeadms_file_is_taken_without_a_warning() {
    let p = parse(KUBEADM).unwrap();
    assert_eq!(p.warnings, Vec::<String>::new());
    assert_eq!(
        p.settings,
        Settings {
            cluster_cidr: Some("10.244.0.0/16".into()),
            kubeconfig: Some("/var/lib/kube-proxy/kubeconfig.conf".into()),
            verbosity: Some(0),
            ..Settings::default()
        }
    );
}

#[test]
fn honoured_fields_map_and_others_warn_once_each() {
    let p = parse(
        r#"{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "hostnameOverride": "node-7",
            "metricsBindAddress": "0.0.0.0:10249", "healthzBindAddress": "0.0.0.0",
            "nodePortAddresses": ["192.168.0.0/16", "fd00::/8"],
            "conntrack": {"tcpEstablishedTimeout": "24h0m0s", "udpStreamTimeout": "2m0s",
                          "maxPerCore": 65536, "tcpCloseWaitTimeout": "1h0m0s"},
            "logging": {"verbosity": 4, "format": "json"},
            "mode": "ipvs", "ipvs": {"strictARP": true, "scheduler": "rr"},
            "iptables": {"syncPeriod": "30s", "minSyncPeriod": "10s"},
            "featureGates": {"SomeGate": true},
            "colour": "blue"}"#,
    )
    .unwrap();
    let s = &p.settings;
    assert_eq!(s.hostname_override.as_deref(), Some("node-7"));
    assert_eq!(s.metrics_bind_address.as_deref(), Some("0.0.0.0:10249"));
    assert_eq!(s.healthz_bind_address.as_deref(), Some("0.0.0.0"));
    assert_eq!(
        s.node_port_addresses.as_deref(),
        Some(&["192.168.0.0/16".to_owned(), "fd00::/8".to_owned()][..])
    );
    assert_eq!(s.ct_tcp_established, Some(Duration::from_secs(86_400)));
    assert_eq!(s.ct_udp, Some(Duration::from_secs(120)));
    assert_eq!(
        (s.verbosity, s.log_format.as_deref()),
        (Some(4), Some("json"))
    );
    let mut w = p.warnings.clone();
    w.sort();
    assert_eq!(
        w,
        [
            "colour: unknown field, ignored",
            "conntrack.maxPerCore: 65536 has no effect: size Weir's own tables with --ct-max",
            "featureGates.SomeGate: true has no effect: Weir has no feature gates",
            "iptables.minSyncPeriod: \"10s\" has no effect: Weir syncs each change as it comes",
            "ipvs.scheduler: \"rr\" has no effect: Weir does not use IPVS",
            "ipvs.strictARP: true has no effect: Weir does not use IPVS",
            "mode: \"ipvs\" has no effect: Weir's datapath is always eBPF",
        ],
        "kube-proxy's defaults (syncPeriod 30s, tcpCloseWaitTimeout 1h) are not warned about"
    );
}

#[test]
fn behaviour_weir_lacks_and_bad_values_are_refused_by_field() {
    let doc = |body: &str| {
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{body}"
        )
    };
    let err = |body: &str| parse(&doc(body)).unwrap_err().to_string();
    assert_eq!(
        err("iptables: {masqueradeAll: true}"),
        "iptables.masqueradeAll: true is not supported: Weir does not SNAT traffic to ClusterIPs: backends see the client's address"
    );
    assert_eq!(
        err("conntrack: {tcpEstablishedTimeout: soon}"),
        "conntrack.tcpEstablishedTimeout: \"soon\" is not a duration such as 1h0m0s"
    );
    assert_eq!(
        err("logging: {verbosity: -1}"),
        "logging.verbosity: -1 is not 0-255"
    );
    assert_eq!(
        err("logging: {format: xml}"),
        "logging.format: \"xml\" is not text or json"
    );
    assert_eq!(
        err("nodePortAddresses: primary"),
        "nodePortAddresses: \"primary\" is not a list"
    );
    assert_eq!(
        parse("apiVersion: v1\nkind: ConfigMap\n")
            .unwrap_err()
            .to_string(),
        "apiVersion/kind must be kubeproxy.config.k8s.io/v1alpha1/KubeProxyConfiguration, not \"v1\"/\"ConfigMap\""
    );
    assert!(matches!(parse("a: [").unwrap_err(), ConfigError::Syntax(_)));
}

#[test]
fn go_durations() {
    let d = |s| go_duration(s);
    assert_eq!(d("24h0m0s"), Some(Duration::from_secs(86_400)));
    assert_eq!(d("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(d("1.5h"), Some(Duration::from_secs(5_400)));
    assert_eq!(d("300ms"), Some(Duration::from_millis(300)));
    assert_eq!(d("0"), Some(Duration::ZERO));
    for bad in ["", "5", "1d", "h", "-1s"] {
        assert_eq!(d(bad), None, "{bad}");
    }
}

#[test]
fn configz_has_kube_proxys_shape_and_go_durations() {
    let s = Settings {
        hostname_override: Some("n1".into()),
        metrics_bind_address: Some("127.0.0.1:10249".into()),
        ct_tcp_established: Some(Duration::from_secs(6 * 3600)),
        ct_udp: Some(Duration::from_secs(60)),
        node_port_addresses: Some(vec!["primary".into()]),
        ..Settings::default()
    };
    let v: Value = serde_json::from_str(&configz(&s, true)).unwrap();
    let c = &v["kubeproxy.config.k8s.io"];
    assert_eq!(c["kind"], "KubeProxyConfiguration");
    assert_eq!(c["mode"], "ebpf");
    assert_eq!(c["hostnameOverride"], "n1");
    assert_eq!(c["conntrack"]["tcpEstablishedTimeout"], "6h0m0s");
    assert_eq!(c["conntrack"]["udpStreamTimeout"], "1m0s");
    assert_eq!(c["nodePortAddresses"][0], "primary");
    assert_eq!(c["bindAddressHardFail"], true);
    // What /configz shows reads back as a file.
    let back = parse(&c.to_string()).unwrap();
    assert_eq!(back.settings.ct_tcp_established, s.ct_tcp_established);
    assert_eq!(format_go_duration(Duration::from_secs(10)), "10s");
    assert_eq!(format_go_duration(Duration::from_millis(500)), "500ms");
}
