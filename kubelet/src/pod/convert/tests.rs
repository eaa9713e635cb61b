use std::time::Duration;

use k8s_openapi::api::core::v1 as api;

use super::*;

fn pod(yaml: &str) -> api::Pod {
    let v = crate::static_pods::parse_manifest_value(yaml).unwrap();
    serde_json::from_value(v).unwrap()
}

fn errors(yaml: &str) -> Vec<String> {
    PodSpec::from_api(&pod(yaml))
        .unwrap_err()
        .errors
        .iter()
        .map(ToString::to_string)
        .collect()
}

const FULL: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, uid: u-1, labels: {app: web}, annotations: {a: b}}
spec:
  restartPolicy: OnFailure
  securityContext: {runAsUser: 500, runAsGroup: 600}
  hostPID: true
  hostname: h
  subdomain: s
  nodeName: node-1
  initContainers:
  - name: setup
    image: busybox
    command: [sh, -c, "echo hi"]
  containers:
  - name: app
    image: registry.local:5000/team/app:v1
    args: ["--port=$(PORT)"]
    workingDir: /srv
    env:
    - {name: PORT, value: "8080"}
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    - name: NS
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    - name: CM
      valueFrom: {configMapKeyRef: {name: cfg, key: k, optional: true}}
    ports:
    - {name: http, containerPort: 8080}
    - {containerPort: 53, protocol: UDP, hostPort: 5353}
    resources:
      requests: {cpu: 250m, memory: 64Mi}
      limits: {cpu: "1", memory: 128Mi}
    securityContext:
      runAsUser: 1000
      readOnlyRootFilesystem: true
      capabilities: {add: [NET_ADMIN], drop: [ALL]}
    livenessProbe:
      httpGet: {path: healthz, port: http, httpHeaders: [{name: X-A, value: b}]}
      initialDelaySeconds: 3
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 2
      successThreshold: 2
      failureThreshold: 5
      timeoutSeconds: 4
    startupProbe:
      exec: {command: [cat, /ready]}
    lifecycle:
      preStop: {exec: {command: [sh, -c, "sleep 1"]}}
      postStart: {sleep: {seconds: 2}}
    volumeMounts:
    - {name: data, mountPath: /data}
    - {name: cfg, mountPath: /etc/cfg, readOnly: true, subPath: app.conf}
  - name: side
    image: nginx
  volumes:
  - {name: data, emptyDir: {medium: Memory, sizeLimit: 1Gi}}
  - {name: cfg, configMap: {name: app-config, items: [{key: a, path: app.conf}]}}
  - {name: sec, secret: {secretName: tls, defaultMode: 0400}}
  - {name: host, hostPath: {path: /var/log, type: Directory}}
"#;

#[test]
fn converts_a_full_pod() {
    let p = PodSpec::from_api(&pod(FULL)).unwrap();
    assert_eq!(
        (p.uid.as_str(), p.namespace.as_str(), p.name.as_str()),
        ("u-1", "default", "web")
    );
    assert_eq!(p.full_name(), "default/web");
    assert_eq!(p.restart_policy, RestartPolicy::OnFailure);
    assert_eq!(p.termination_grace_period, Duration::from_secs(30));
    assert_eq!(p.dns_policy, DnsPolicy::ClusterFirst);
    assert_eq!(p.hostname.as_deref(), Some("h"));
    assert_eq!(p.node_name.as_deref(), Some("node-1"));
    assert_eq!(p.labels["app"], "web");
    assert!(!p.host_network && !p.deleting);
    assert!(p.is_init_container("setup") && !p.is_init_container("app"));
    assert_eq!(p.qos_class(), QosClass::Burstable);

    let init = &p.init_containers[0];
    assert_eq!(init.image_pull_policy, PullPolicy::Always, "untagged");
    let app = p.container("app").unwrap();
    assert_eq!(app.image_pull_policy, PullPolicy::IfNotPresent);
    assert_eq!(app.working_dir.as_deref(), Some("/srv"));
    assert_eq!(app.env[0].value, EnvValue::Literal("8080".into()));
    assert_eq!(app.env[1].value, EnvValue::Field(FieldRef::PodIp));
    assert_eq!(app.env[2].value, EnvValue::Field(FieldRef::PodNamespace));
    assert!(matches!(
        &app.env[3].value,
        EnvValue::ConfigMapKey { optional: true, .. }
    ));
    assert_eq!(app.ports[1].protocol, Protocol::Udp);
    assert_eq!(app.ports[1].host_port, Some(5353));
    assert_eq!(
        app.linux_resources(),
        LinuxResources {
            cpu_shares: 256,
            cpu_period: 100_000,
            cpu_quota: 100_000,
            memory_limit_in_bytes: 128 << 20,
        }
    );
    assert_eq!(app.security.run_as_user, Some(1000));
    assert_eq!(app.security.run_as_group, Some(600), "from the pod");
    assert_eq!(init.security.run_as_user, Some(500), "from the pod");
    assert!(p.host_pid && !p.host_ipc);
    assert!(app.security.read_only_root_filesystem && !app.security.privileged);
    assert_eq!(app.security.capabilities_add, ["NET_ADMIN"]);
    assert_eq!(app.security.capabilities_drop, ["ALL"]);

    let live = app.liveness.as_ref().unwrap();
    assert_eq!(
        live.action,
        ProbeAction::HttpGet(HttpGet {
            scheme: Scheme::Http,
            host: None,
            port: 8080,
            path: "/healthz".into(),
            headers: vec![("X-A".into(), "b".into())],
        })
    );
    assert_eq!(live.initial_delay, Duration::from_secs(3));
    assert_eq!(
        (live.period, live.timeout),
        (Duration::from_secs(10), Duration::from_secs(1))
    );
    assert_eq!((live.success_threshold, live.failure_threshold), (1, 3));
    let ready = app.readiness.as_ref().unwrap();
    assert_eq!(
        ready.action,
        ProbeAction::TcpSocket {
            host: None,
            port: 8080
        }
    );
    assert_eq!((ready.success_threshold, ready.failure_threshold), (2, 5));
    assert_eq!(ready.timeout, Duration::from_secs(4));
    assert!(
        matches!(&app.startup.as_ref().unwrap().action, ProbeAction::Exec { command } if command[0] == "cat")
    );
    assert!(matches!(app.pre_stop, Some(Handler::Exec { .. })));
    assert_eq!(app.post_start, Some(Handler::Sleep(Duration::from_secs(2))));
    assert_eq!(app.volume_mounts[1].sub_path.as_deref(), Some("app.conf"));
    assert!(app.volume_mounts[1].read_only);

    assert_eq!(p.containers[1].image_pull_policy, PullPolicy::Always);
    assert_eq!(
        p.volumes[0].source,
        VolumeSource::EmptyDir {
            memory: true,
            size_limit: Some(1 << 30)
        }
    );
    assert!(
        matches!(&p.volumes[1].source, VolumeSource::ConfigMap { name, items, default_mode: 0o644, .. } if name == "app-config" && items.len() == 1)
    );
    assert!(
        matches!(&p.volumes[2].source, VolumeSource::Secret { name, default_mode: 0o400, .. } if name == "tls")
    );
    assert_eq!(
        p.volumes[3].source,
        VolumeSource::HostPath {
            path: "/var/log".into(),
            kind: HostPathType::Directory
        }
    );
}

#[test]
fn pull_policy_defaults() {
    for (image, want) in [
        ("busybox", PullPolicy::Always),
        ("busybox:latest", PullPolicy::Always),
        ("busybox:1.36", PullPolicy::IfNotPresent),
        ("localhost:5000/busybox", PullPolicy::Always),
        ("localhost:5000/busybox:v2", PullPolicy::IfNotPresent),
        ("busybox@sha256:0123", PullPolicy::IfNotPresent),
    ] {
        assert_eq!(default_pull_policy(image), want, "{image}");
    }
}

#[test]
fn reports_every_problem_with_its_field() {
    let errs = errors(
        r#"
metadata: {name: bad, uid: u}
spec:
  restartPolicy: Sometimes
  initContainers:
  - {name: app, image: busybox}
  containers:
  - name: app
    ports: [{name: http, containerPort: 70000}]
    livenessProbe: {httpGet: {port: metrics}}
    readinessProbe: {tcpSocket: {port: 0}}
    volumeMounts: [{name: missing, mountPath: /m}]
  volumes:
  - {name: nfs-vol, nfs: {server: s, path: /x}}
"#,
    );
    let want = [
        r#"spec.restartPolicy: "Sometimes" is invalid: must be Always, OnFailure or Never"#,
        r#"spec.volumes[0]: volume type "nfs" is not supported (emptyDir, hostPath, configMap, secret, projected, downwardAPI are)"#,
        r#"spec.containers[0].name: duplicate value "app""#,
        "spec.containers[0].image: is required",
        "spec.containers[0].ports[0].containerPort: port 70000 is out of range 1-65535",
        r#"spec.containers[0].livenessProbe.httpGet.port: no container port named "metrics""#,
        "spec.containers[0].readinessProbe.tcpSocket.port: port 0 is out of range 1-65535",
        r#"spec.containers[0].volumeMounts[0].name: no volume named "missing" in spec.volumes"#,
    ];
    for w in want {
        assert!(errs.iter().any(|e| e == w), "missing {w:?} in {errs:#?}");
    }
    assert_eq!(errs.len(), want.len(), "{errs:#?}");
}

#[test]
fn refuses_what_it_does_not_support() {
    let errs = errors(
        r#"
metadata: {name: p, uid: u}
spec:
  containers:
  - name: c
    image: i
    env:
    - name: L
      valueFrom: {fieldRef: {fieldPath: "metadata.labels['a']"}}
    - name: R
      valueFrom: {resourceFieldRef: {resource: limits.cpu}}
    livenessProbe: {grpc: {port: 70000}}
    readinessProbe: {httpGet: {port: 80, scheme: FTP}}
    startupProbe: {exec: {command: [x]}, successThreshold: 2}
    lifecycle: {preStop: {tcpSocket: {port: 80}}}
"#,
    );
    for w in [
        r#"spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: field path "metadata.labels['a']" is not supported by this kubelet"#,
        "spec.containers[0].env[1].valueFrom.resourceFieldRef: resourceFieldRef is not supported by this kubelet",
        "spec.containers[0].livenessProbe.grpc.port: port 70000 is out of range 1-65535",
        r#"spec.containers[0].readinessProbe.httpGet.scheme: "FTP" is invalid: must be HTTP or HTTPS"#,
        r#"spec.containers[0].startupProbe.successThreshold: "2" is invalid: must be 1"#,
        "spec.containers[0].lifecycle.preStop.tcpSocket: tcpSocket lifecycle hooks is not supported by this kubelet",
    ] {
        assert!(errs.iter().any(|e| e == w), "missing {w:?} in {errs:#?}");
    }
}

#[test]
fn grpc_probes_take_a_port_and_an_optional_service() {
    let p = PodSpec::from_api(&pod(r#"
metadata: {name: p, uid: u}
spec:
  containers:
  - name: c
    image: i
    livenessProbe: {grpc: {port: 9000}}
    readinessProbe: {grpc: {port: 9000, service: shop.Cart}}
"#))
    .unwrap();
    let c = &p.containers[0];
    let grpc = |probe: &Option<crate::pod::Probe>| probe.as_ref().unwrap().action.clone();
    assert_eq!(
        grpc(&c.liveness),
        ProbeAction::Grpc {
            port: 9000,
            service: String::new()
        }
    );
    assert_eq!(
        grpc(&c.readiness),
        ProbeAction::Grpc {
            port: 9000,
            service: "shop.Cart".into()
        }
    );
}

#[test]
fn numeric_port_names_and_quantities() {
    // A port name that matches nothing but is a number is used as one (extractPort).
    let p = PodSpec::from_api(&pod(r#"
metadata: {name: p, uid: u}
spec:
  containers:
  - name: c
    image: i
    livenessProbe: {tcpSocket: {port: "9090"}}
    resources: {limits: {cpu: 500m, memory: 1G}}
"#))
    .unwrap();
    let c = &p.containers[0];
    assert_eq!(
        c.liveness.as_ref().unwrap().action,
        ProbeAction::TcpSocket {
            host: None,
            port: 9090
        }
    );
    // Requests default to limits: Guaranteed.
    assert_eq!(c.resources.cpu_request_milli, Some(500));
    assert_eq!(c.resources.memory_request, Some(1_000_000_000));
    assert_eq!(p.qos_class(), QosClass::Guaranteed);

    let errs = errors(
        r#"
metadata: {name: p, uid: u}
spec:
  containers:
  - name: c
    image: i
    resources: {limits: {cpu: lots, memory: 1Gi}, requests: {memory: 2Gi}}
"#,
    );
    assert!(
        errs[0].starts_with(r#"spec.containers[0].resources.limits.cpu: "lots" is not a quantity"#),
        "{errs:?}"
    );
    assert!(
        errs[1].starts_with("spec.containers[0].resources.requests.memory:"),
        "{errs:?}"
    );
}

#[test]
fn missing_identity_and_containers() {
    let errs = errors("metadata: {}\nspec: {containers: []}\n");
    assert_eq!(
        errs,
        [
            "metadata.name: is required",
            "metadata.uid: is required",
            "spec.containers: is required"
        ]
    );
    let e = PodSpec::from_api(&pod("metadata: {name: a, uid: b}\nspec: {containers: [{name: c}], initContainers: [{name: i, image: x, readinessProbe: {exec: {command: [x]}}}]}\n")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "spec.initContainers[0].readinessProbe: a probe on an init container is not supported by this kubelet; spec.containers[0].image: is required"
    );
}

/// Issue 12 item 1, API pods as static ones: identifiers that become paths
/// (metadata, volume names, `items[].path`) are checked as the API server
/// would, so none can lead a path out of its directory.
#[test]
fn identifiers_that_become_paths_are_validated() {
    let with = |meta: &str, volumes: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{{meta}}}\nspec:\n  volumes: [{volumes}]\n  \
             containers: [{{name: c, image: i}}]\n"
        )
    };
    let ok_meta = "name: web, namespace: ns, uid: u-1";
    for (meta, volumes, field) in [
        ("name: web, uid: ../../..", "", "metadata.uid"),
        ("name: web, uid: 'a b'", "", "metadata.uid"),
        ("name: ../web, uid: u", "", "metadata.name"),
        (
            "name: web, namespace: ../x, uid: u",
            "",
            "metadata.namespace",
        ),
        (
            ok_meta,
            "{name: ../v, emptyDir: {}}",
            "spec.volumes[0].name",
        ),
        (ok_meta, "{name: V, emptyDir: {}}", "spec.volumes[0].name"),
        (
            ok_meta,
            "{name: v, configMap: {name: cm, items: [{key: k, path: ../../x}]}}",
            "spec.volumes[0].configMap.items[0].path",
        ),
        (
            ok_meta,
            "{name: v, secret: {secretName: s, items: [{key: k, path: /etc/x}]}}",
            "spec.volumes[0].secret.items[0].path",
        ),
    ] {
        let yaml = with(meta, volumes);
        let errs = match PodSpec::from_api(&pod(&yaml)) {
            Ok(_) => panic!("accepted: {meta} {volumes}"),
            Err(e) => e.to_string(),
        };
        assert!(
            errs.contains(&format!("{field}:")),
            "{field} not named: {errs}"
        );
    }
    let fine = with(
        ok_meta,
        "{name: cfg, configMap: {name: cm, items: [{key: k, path: conf/app.yaml}]}}",
    );
    assert!(PodSpec::from_api(&pod(&fine)).is_ok());
}

#[test]
fn projected_and_downward_volumes_take_the_api_defaults() {
    let p = PodSpec::from_api(&pod(r#"
metadata: {name: p, uid: u}
spec:
  containers: [{name: c, image: i, envFrom: [{prefix: X_, secretRef: {name: s, optional: true}}]}]
  volumes:
  - name: kube-api-access-abcde
    projected:
      sources:
      - serviceAccountToken: {path: token}
      - serviceAccountToken: {path: vault-token, audience: vault, expirationSeconds: 7200}
      - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
  - name: info
    downwardAPI:
      defaultMode: 0400
      items:
      - {path: labels, fieldRef: {fieldPath: "metadata.labels['app']"}}
      - {path: mem, resourceFieldRef: {containerName: c, resource: limits.memory, divisor: 1Mi}}
"#))
    .unwrap_or_else(|e| panic!("{e}"));
    let VolumeSource::Projected {
        sources,
        default_mode,
    } = &p.volumes[0].source
    else {
        panic!("{:?}", p.volumes[0]);
    };
    assert_eq!(*default_mode, 0o644);
    assert_eq!(
        sources[0],
        ProjectedSource::ServiceAccountToken(TokenProjection {
            audience: None,
            expiration_seconds: 3600,
            path: "token".into(),
        })
    );
    let VolumeSource::DownwardApi {
        items,
        default_mode,
    } = &p.volumes[1].source
    else {
        panic!("{:?}", p.volumes[1]);
    };
    assert_eq!(*default_mode, 0o400);
    assert_eq!(
        items[0].value,
        DownwardValue::Field(DownwardField::Label("app".into()))
    );
    assert_eq!(
        items[1].value,
        DownwardValue::Resource {
            container: "c".into(),
            resource: ResourceName::LimitsMemory,
            divisor: 1 << 20,
        }
    );
    assert_eq!(
        p.containers[0].env_from,
        [EnvFrom {
            kind: EnvFromKind::Secret,
            name: "s".into(),
            prefix: "X_".into(),
            optional: true,
        }]
    );
}

#[test]
fn projected_volumes_are_checked_as_the_api_server_does() {
    let errs = errors(
        r#"
metadata: {name: p, uid: u}
spec:
  containers: [{name: c, image: i, envFrom: [{prefix: "A=", configMapRef: {name: m}}]}]
  volumes:
  - name: a
    projected:
      sources:
      - serviceAccountToken: {path: token, expirationSeconds: 60}
      - configMap: {name: m, items: [{key: k, path: token}]}
      - secret: {name: s, items: [{key: k, path: ..data}]}
      - downwardAPI: {items: [{path: node, fieldRef: {fieldPath: spec.nodeName}}]}
  - name: b
    downwardAPI:
      items:
      - {path: cpu, resourceFieldRef: {resource: limits.cpu}}
      - {path: x, resourceFieldRef: {containerName: nope, resource: requests.cpu}}
"#,
    );
    for w in [
        r#"spec.volumes[0].projected.sources[0].serviceAccountToken.expirationSeconds: "60" is invalid: may not specify a duration less than 10 minutes"#,
        r#"spec.volumes[0].projected.sources[2].secret.items[0].path: "..data" is invalid: must not start with '..'"#,
        "spec.volumes[0].projected.sources[3].downwardAPI.items[0].fieldRef.fieldPath: field path \"spec.nodeName\" in a volume",
        r#"spec.volumes[0].projected.sources: "token" is invalid: conflicting duplicate paths"#,
        "spec.volumes[1].downwardAPI.items[0].resourceFieldRef.containerName: is required",
        r#"spec.volumes[1].downwardAPI.items[1].resourceFieldRef.containerName: "nope" is invalid: must name a container of the pod"#,
        r#"spec.containers[0].envFrom[0].prefix: "A=" is invalid: must not contain '='"#,
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(w)),
            "missing {w:?} in {errs:#?}"
        );
    }
}
