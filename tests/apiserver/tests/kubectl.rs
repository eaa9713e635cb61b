//! The server through the real kubectl (skipped, loudly, when it is absent).
use std::{path::Path, process::Stdio, time::Duration};

use tokio::io::{AsyncBufReadExt as _, BufReader};
use weir_test_apiserver::{Options, TestApiServer};

mod common;

use common::{KUBECTL, kubectl, kubectl_cmd};

/// A server, or `None` (said loudly) when kubectl is not installed.
async fn server_for_kubectl() -> Option<TestApiServer> {
    if !Path::new(KUBECTL).exists() {
        eprintln!("SKIPPED: {KUBECTL} is not installed; kubectl compatibility is untested");
        return None;
    }
    Some(TestApiServer::start(Options::default()).await.unwrap())
}

async fn ok(server: &TestApiServer, args: &[&str]) -> String {
    let (success, stdout, stderr) = kubectl(server, args).await;
    assert!(success, "kubectl {args:?} failed: {stderr}");
    stdout
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

const MANIFEST_V1: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: app
  namespace: demo
  labels: {app: web}
data:
  greeting: hello
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Pod
metadata:
  name: p
  namespace: demo
spec:
  containers:
  - {name: a, image: "nginx:1"}
  - {name: b, image: "busybox:1"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_apply_get_watch_patch_delete() {
    let Some(server) = server_for_kubectl().await else {
        return;
    };
    let dir = server.kubeconfig_path().parent().unwrap().to_path_buf();

    assert!(
        ok(&server, &["create", "ns", "demo"])
            .await
            .contains("namespace/demo created")
    );
    let (success, _, stderr) = kubectl(&server, &["create", "ns", "demo"]).await;
    assert!(!success && stderr.contains("AlreadyExists"), "{stderr}");

    // apply: create, then change one object and re-apply.
    let manifest = dir.join("manifest.yaml");
    std::fs::write(&manifest, MANIFEST_V1).unwrap();
    let out = ok(&server, &["apply", "-f", manifest.to_str().unwrap()]).await;
    assert!(
        out.contains("configmap/app created")
            && out.contains("service/web created")
            && out.contains("pod/p created"),
        "{out}"
    );
    std::fs::write(
        &manifest,
        MANIFEST_V1.replace("greeting: hello", "greeting: bonjour"),
    )
    .unwrap();
    let out = ok(&server, &["apply", "-f", manifest.to_str().unwrap()]).await;
    assert!(
        out.contains("configmap/app configured") && out.contains("service/web unchanged"),
        "{out}"
    );
    let cm = json(
        &ok(
            &server,
            &["-n", "demo", "get", "configmap", "app", "-o", "json"],
        )
        .await,
    );
    assert_eq!(cm["data"]["greeting"], "bonjour");
    assert!(
        cm["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );

    // Default table output.
    let table = ok(&server, &["-n", "demo", "get", "services"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ]
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..2], ["web", "ClusterIP"]);
    assert!(row[2].starts_with("10."), "{table}");
    assert_eq!(row[4], "80/TCP");
    let list = json(&ok(&server, &["get", "namespaces", "-o", "json"]).await);
    assert!(list["items"].as_array().unwrap().len() >= 5);

    // get -w sees an update arrive.
    let mut watch = kubectl_cmd(&server, &["-n", "demo", "get", "configmap", "app", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(watch.stdout.take().unwrap()).lines();
    let read = async |out: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>| {
        tokio::time::timeout(Duration::from_secs(30), out.next_line())
            .await
            .expect("watch output")
            .unwrap()
            .expect("a line")
    };
    assert!(read(&mut out).await.starts_with("NAME"));
    let first: Vec<String> = read(&mut out)
        .await
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(&first[..2], ["app", "1"]);
    // Patch, --type merge: a second key arrives on the watch.
    ok(
        &server,
        &[
            "-n",
            "demo",
            "patch",
            "configmap",
            "app",
            "--type",
            "merge",
            "-p",
            r#"{"data":{"extra":"1"}}"#,
        ],
    )
    .await;
    let second: Vec<String> = read(&mut out)
        .await
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(&second[..2], ["app", "2"]);
    watch.kill().await.unwrap();

    // Default (strategic) patch merges containers by name.
    ok(
        &server,
        &[
            "-n",
            "demo",
            "patch",
            "pod",
            "p",
            "-p",
            r#"{"spec":{"containers":[{"name":"b","image":"busybox:2"}]}}"#,
        ],
    )
    .await;
    let pod = json(&ok(&server, &["-n", "demo", "get", "pod", "p", "-o", "json"]).await);
    let containers = pod["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0]["image"], "nginx:1");
    assert_eq!(containers[1]["image"], "busybox:2");

    // delete, then the object is gone.
    assert!(
        ok(&server, &["-n", "demo", "delete", "configmap", "app"])
            .await
            .contains("deleted")
    );
    let (success, _, stderr) = kubectl(&server, &["-n", "demo", "get", "configmap", "app"]).await;
    assert!(!success && stderr.contains("NotFound"), "{stderr}");
    ok(&server, &["delete", "namespace", "demo"]).await;
    let (success, _, stderr) = kubectl(&server, &["get", "namespace", "demo"]).await;
    assert!(!success && stderr.contains("NotFound"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_typed_create_subcommands() {
    let Some(server) = server_for_kubectl().await else {
        return;
    };
    // These send protobuf bodies.
    ok(
        &server,
        &[
            "-n",
            "default",
            "create",
            "configmap",
            "c",
            "--from-literal=k=v",
        ],
    )
    .await;
    ok(
        &server,
        &[
            "-n",
            "default",
            "create",
            "secret",
            "generic",
            "s",
            "--from-literal=k=v",
        ],
    )
    .await;
    ok(
        &server,
        &[
            "-n",
            "default",
            "create",
            "service",
            "nodeport",
            "np",
            "--tcp=80:8080",
        ],
    )
    .await;
    let cm = json(
        &ok(
            &server,
            &["-n", "default", "get", "configmap", "c", "-o", "json"],
        )
        .await,
    );
    assert_eq!(cm["data"]["k"], "v");
    let secret = json(
        &ok(
            &server,
            &["-n", "default", "get", "secret", "s", "-o", "json"],
        )
        .await,
    );
    assert_eq!(
        (secret["data"]["k"].as_str(), secret["type"].as_str()),
        (Some("dg=="), Some("Opaque"))
    );
    let svc = json(
        &ok(
            &server,
            &["-n", "default", "get", "service", "np", "-o", "json"],
        )
        .await,
    );
    let port = &svc["spec"]["ports"][0];
    assert_eq!(
        (port["port"].as_i64(), port["targetPort"].as_i64()),
        (Some(80), Some(8080))
    );
    assert!(
        port["nodePort"]
            .as_i64()
            .is_some_and(|p| (30000..=32767).contains(&p))
    );
    assert_eq!(svc["spec"]["sessionAffinity"], "None");
}

/// What `kubectl get -o yaml` and many generators write.
const LIST: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: listed, namespace: default}
  data: {a: "1"}
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: default}
  spec:
    selector: {app: web}
    ports: [{port: 80, targetPort: 8080}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_a_list() {
    let Some(server) = server_for_kubectl().await else {
        return;
    };
    let dir = server.kubeconfig_path().parent().unwrap().to_path_buf();
    let list = dir.join("list.yaml");
    std::fs::write(&list, LIST).unwrap();
    let list = list.to_str().unwrap();
    // Validation of a List goes through /openapi/v2 (see `discovery`).
    let out = ok(&server, &["apply", "-f", list]).await;
    assert!(
        out.contains("configmap/listed created") && out.contains("service/web created"),
        "{out}"
    );
    let out = ok(&server, &["apply", "-f", list]).await;
    assert!(
        out.contains("configmap/listed unchanged") && out.contains("service/web unchanged"),
        "{out}"
    );
    let out = ok(&server, &["apply", "--server-side", "-f", list]).await;
    assert!(out.contains("configmap/listed serverside-applied"), "{out}");
    // A dump of the cluster, server fields and all, applies back.
    let dump = dir.join("dump.yaml");
    let yaml = ok(&server, &["-n", "default", "get", "cm,svc", "-o", "yaml"]).await;
    assert!(yaml.contains("kind: List"), "{yaml}");
    std::fs::write(&dump, yaml).unwrap();
    ok(&server, &["apply", "-f", dump.to_str().unwrap()]).await;
    let (success, _, stderr) = kubectl(&server, &["apply", "--validate=strict", "-f", list]).await;
    assert!(success, "{stderr}");
}

/// The agent's Events go through kube-rs's `Recorder`, which writes
/// events.k8s.io/v1; users read them through core/v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_from_kube_rs_recorder_show_in_kubectl_get_events_and_describe() {
    use futures::{StreamExt as _, TryStreamExt as _};
    use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference, Service};
    use kube::{
        Api,
        api::WatchParams,
        core::WatchEvent,
        runtime::events::{Event, EventType, Recorder, Reporter},
    };

    let Some(server) = server_for_kubectl().await else {
        return;
    };
    let client = server.client().await.unwrap();
    ok(
        &server,
        &[
            "-n",
            "default",
            "create",
            "service",
            "clusterip",
            "web",
            "--tcp=80:8080",
        ],
    )
    .await;
    let uid = Api::<Service>::namespaced(client.clone(), "default")
        .get("web")
        .await
        .unwrap()
        .metadata
        .uid;
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let mut watch = core
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "weir-agent".into(),
            instance: Some("node-1".into()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some("default".into()),
        name: Some("web".into()),
        uid: uid.clone(),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: "MapFull".into(),
        note: Some("services map is full".into()),
        action: "Program".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();

    // A core/v1 watch sees it, decoded by k8s-openapi's core type.
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match watch.try_next().await.unwrap() {
                Some(WatchEvent::Added(e)) => break e,
                Some(_) => continue,
                None => panic!("watch ended"),
            }
        }
    })
    .await
    .expect("the core watch sees the Event");
    assert_eq!(seen.involved_object.name.as_deref(), Some("web"));
    assert_eq!(seen.involved_object.uid, uid);
    assert_eq!(seen.message.as_deref(), Some("services map is full"));
    assert_eq!(seen.reporting_component.as_deref(), Some("weir-agent"));

    // Repeats become a series (the recorder patches through events.k8s.io).
    recorder.publish(&event, &reference).await.unwrap();
    let listed = core.list(&Default::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1, "{listed:?}");

    let table = ok(&server, &["-n", "default", "get", "events", "-o", "wide"]).await;
    let row = table
        .lines()
        .find(|l| l.contains("MapFull"))
        .unwrap_or_else(|| panic!("no MapFull row in:\n{table}"));
    let cells: Vec<&str> = row
        .split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert!(
        cells.contains(&"Warning")
            && cells.contains(&"service/web")
            && cells.contains(&"weir-agent, node-1")
            && cells.contains(&"services map is full"),
        "{table}"
    );
    let series = listed[0].series.as_ref().expect("a repeat makes a series");
    assert_eq!(series.count, Some(2));
    assert!(
        cells.contains(&"2"),
        "the count column is the series' count:\n{table}"
    );
    let describe = ok(&server, &["-n", "default", "describe", "service", "web"]).await;
    let events = describe
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("no Events section:\n{describe}"));
    assert!(
        events.contains("MapFull")
            && events.contains("weir-agent")
            && events.contains("services map is full"),
        "{describe}"
    );
}

const DRAINED: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: default, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: c, image: busybox}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: default, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: c, image: busybox}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}
"#;

/// `kubectl drain` cordons, then evicts through `pods/eviction`, retrying
/// while the budget refuses. The test plays the disruption controller by
/// writing the budget's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drain_evicts_within_the_disruption_budget() {
    let Some(server) = server_for_kubectl().await else {
        return;
    };
    let file = server.kubeconfig_path().with_file_name("drained.yaml");
    std::fs::write(&file, DRAINED).unwrap();
    ok(&server, &["apply", "-f", file.to_str().unwrap()]).await;
    for pod in ["a", "b"] {
        let ready =
            r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#;
        let args = [
            "patch",
            "pod",
            pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            ready,
        ];
        ok(&server, &args).await;
    }
    // What the disruption controller would write: one disruption allowed.
    let allow_one = || async {
        let status = r#"{"status":{"observedGeneration":1,"disruptionsAllowed":1,"currentHealthy":2,"desiredHealthy":1,"expectedPods":2}}"#;
        let args = [
            "patch",
            "pdb",
            "web",
            "--subresource=status",
            "--type=merge",
            "-p",
            status,
        ];
        ok(&server, &args).await;
    };
    allow_one().await;

    let drain = ["drain", "n1", "--force", "--grace-period=0", "--timeout=6s"];
    let (success, stdout, stderr) = kubectl(&server, &drain).await;
    let out = format!("{stdout}{stderr}");
    assert!(!success, "one pod is protected by the budget:\n{out}");
    assert!(out.contains("node/n1 cordoned"), "{out}");
    assert!(
        out.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{out}"
    );
    let pods = ok(&server, &["-n", "default", "get", "pods", "-o", "name"]).await;
    assert_eq!(pods.lines().count(), 1, "one evicted, one kept: {pods}");
    let pdb = json(
        &ok(
            &server,
            &["-n", "default", "get", "pdb", "web", "-o", "json"],
        )
        .await,
    );
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0);
    assert_eq!(
        pdb["status"]["disruptedPods"].as_object().map(|m| m.len()),
        Some(1)
    );
    let node = json(&ok(&server, &["get", "node", "n1", "-o", "json"]).await);
    assert_eq!(node["spec"]["unschedulable"], true);
    // Upstream's node printer: the cordon shows in STATUS; wide adds the
    // addresses and nodeInfo columns.
    let table = ok(&server, &["get", "nodes", "-o", "wide"]).await;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "STATUS",
            "ROLES",
            "AGE",
            "VERSION",
            "INTERNAL-IP",
            "EXTERNAL-IP",
            "OS-IMAGE",
            "KERNEL-VERSION",
            "CONTAINER-RUNTIME"
        ],
        "{table}"
    );
    assert!(table.contains(",SchedulingDisabled"), "{table}");

    // The controller would allow one more once the first is replaced.
    allow_one().await;
    let drain = [
        "drain",
        "n1",
        "--force",
        "--grace-period=0",
        "--timeout=20s",
    ];
    let out = ok(&server, &drain).await;
    assert!(
        out.contains("evicted") && out.contains("node/n1 drained"),
        "{out}"
    );
    let pods = ok(&server, &["-n", "default", "get", "pods", "-o", "name"]).await;
    assert!(pods.trim().is_empty(), "{pods}");
}

/// Deployments as users make and scale them (protobuf create, `/scale`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_and_scales_deployments() {
    let Some(server) = server_for_kubectl().await else {
        return;
    };
    let create = [
        "-n",
        "default",
        "create",
        "deployment",
        "web",
        "--image=busybox:1",
        "--replicas=3",
        "--port=8080",
        "--",
        "httpd",
        "-f",
    ];
    ok(&server, &create).await;
    let get = ["-n", "default", "get", "deployment", "web", "-o", "json"];
    let d = json(&ok(&server, &get).await);
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["command"], serde_json::json!(["httpd", "-f"]));
    assert_eq!(c["ports"][0]["containerPort"], 8080);

    let out = ok(
        &server,
        &[
            "-n",
            "default",
            "scale",
            "deployment",
            "web",
            "--replicas=5",
        ],
    )
    .await;
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    let d = json(&ok(&server, &get).await);
    assert_eq!(
        (
            d["spec"]["replicas"].as_i64(),
            d["metadata"]["generation"].as_i64()
        ),
        (Some(5), Some(2))
    );
    let scale = [
        "-n",
        "default",
        "scale",
        "deployment",
        "web",
        "--replicas=2",
        "--current-replicas=4",
    ];
    let (success, _, stderr) = kubectl(&server, &scale).await;
    assert!(
        !success && stderr.contains("Expected replicas to be 4, was 5"),
        "{stderr}"
    );

    let table = ok(
        &server,
        &["-n", "default", "get", "deployments", "-o", "wide"],
    )
    .await;
    assert!(
        table.starts_with("NAME   READY   UP-TO-DATE   AVAILABLE   AGE   CONTAINERS   IMAGES"),
        "{table}"
    );
    assert!(
        table.contains("0/5") && table.contains("app=web"),
        "{table}"
    );
    let all = ok(&server, &["-n", "default", "get", "all"]).await;
    assert!(all.contains("deployment.apps/web"), "{all}");

    // A selector that misses the template is refused, naming the field.
    let bad = server.kubeconfig_path().with_file_name("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent, namespace: default}\n\
         spec:\n  selector: {matchLabels: {app: agent}}\n  template:\n    metadata: {labels: {app: other}}\n\
         \x20   spec: {containers: [{name: a, image: x}]}\n",
    )
    .unwrap();
    let (success, _, stderr) = kubectl(&server, &["apply", "-f", bad.to_str().unwrap()]).await;
    assert!(
        !success
            && stderr.contains("spec.template.metadata.labels")
            && stderr.contains("does not match"),
        "{stderr}"
    );
}
