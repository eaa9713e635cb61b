//! API-server mode against the in-process test API server: Node registration,
//! the Lease, the pod watch, status patches, mirror pods and final deletes,
//! and an API-server outage. No root or containerd needed.
use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Container, Node, NodeSpec, Pod, PodSpec, PodStatus, Taint},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{
    Client,
    api::{Api, DeleteParams, PostParams},
};
use tokio::sync::mpsc;
use weir_kubelet::{
    api::{ApiStatusSink, NodeOptions, start_with},
    config::Config,
    cri::{FakeRuntime, RuntimeVersion},
    flow::{PodEvent, PodSource, StatusSink},
    health::NodeHealth,
    static_pods::{self, CONFIG_MIRROR},
};
use weir_test_apiserver::{Options, TestApiServer, eventually};

const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(20);

struct Kubelet {
    server: TestApiServer,
    client: Client,
    sink: Arc<ApiStatusSink>,
    events: mpsc::Receiver<PodEvent>,
    /// The runtime the node's health checks ask.
    runtime: Arc<FakeRuntime>,
}

fn config(lease_secs: u64) -> Config {
    Config {
        node_lease_duration: Duration::from_secs(lease_secs),
        node_status_update_frequency: Duration::from_secs(1),
        port: 10350,
        max_pods: 42,
        ..Config::default()
    }
}

fn runtime() -> RuntimeVersion {
    RuntimeVersion {
        version: "0.1.0".into(),
        runtime_name: "containerd".into(),
        runtime_version: "1.6.20".into(),
        runtime_api_version: "v1".into(),
    }
}

fn options() -> NodeOptions {
    NodeOptions {
        node_ip: Some("10.9.8.7".parse().unwrap()),
        root_dir: std::env::temp_dir(),
        mirror_resync: Duration::from_secs(2),
        ..Default::default()
    }
}

async fn server() -> (TestApiServer, Client) {
    let server = TestApiServer::start(Options::default())
        .await
        .expect("server");
    let client = server.client().await.expect("client");
    (server, client)
}

async fn kubelet_on(server: TestApiServer, client: Client, lease_secs: u64) -> Kubelet {
    kubelet_with(server, client, lease_secs, options()).await
}

async fn kubelet_with(
    server: TestApiServer,
    client: Client,
    lease_secs: u64,
    options: NodeOptions,
) -> Kubelet {
    let (tx, events) = mpsc::channel(64);
    // Real health checks, against a fake runtime that answers them.
    let fake = Arc::new(FakeRuntime::new());
    let health = NodeHealth::new();
    health.check_runtime(&*fake).await;
    health.relist(&*fake).await;
    health.spawn(fake.clone());
    let sink = start_with(
        client.clone(),
        &config(lease_secs),
        NODE.into(),
        runtime(),
        health,
        tx,
        options,
    )
    .await
    .expect("api mode starts");
    Kubelet {
        server,
        client,
        sink,
        events,
        runtime: fake,
    }
}

async fn kubelet(lease_secs: u64) -> Kubelet {
    let (server, client) = server().await;
    kubelet_on(server, client, lease_secs).await
}

fn pod(name: &str, node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pods(client: &Client) -> Api<Pod> {
    Api::namespaced(client.clone(), "default")
}

fn uid_of(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap()
}

fn running(ip: &str) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some(ip.into()),
        ..Default::default()
    }
}

/// The next event about pod `name`/`uid` that matches `pred`, skipping others.
async fn next_event(
    rx: &mut mpsc::Receiver<PodEvent>,
    pred: impl Fn(&PodEvent) -> bool,
) -> PodEvent {
    tokio::time::timeout(WAIT, async {
        loop {
            let ev = rx.recv().await.expect("events open");
            if pred(&ev) {
                return ev;
            }
        }
    })
    .await
    .expect("event in time")
}

fn upsert_of(name: &str) -> impl Fn(&PodEvent) -> bool + '_ {
    move |ev| matches!(ev, PodEvent::Upsert { pod, source: PodSource::Api } if pod.metadata.name.as_deref() == Some(name))
}

fn remove_of(uid: &str) -> impl Fn(&PodEvent) -> bool + '_ {
    move |ev| matches!(ev, PodEvent::Remove { uid: u, .. } if u == uid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_registers_with_machine_status() {
    let k = kubelet(40).await;
    let nodes: Api<Node> = Api::all(k.client.clone());
    let node = nodes.get(NODE).await.expect("node registered");
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], NODE);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert!(!labels["kubernetes.io/arch"].is_empty());
    let st = node.status.expect("status");
    let cap = st.capacity.unwrap();
    let alloc = st.allocatable.unwrap();
    assert_eq!(cap["pods"].0, "42");
    assert_eq!(alloc["pods"].0, "42");
    assert!(cap["cpu"].0.parse::<u32>().unwrap() >= 1);
    assert!(cap["memory"].0.ends_with("Ki"));
    assert!(cap.contains_key("ephemeral-storage") && alloc.contains_key("ephemeral-storage"));
    assert_ne!(
        cap["memory"], alloc["memory"],
        "eviction threshold held back"
    );
    let addrs: Vec<(String, String)> = st
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(addrs.contains(&("InternalIP".into(), "10.9.8.7".into())));
    assert!(addrs.contains(&("Hostname".into(), NODE.into())));
    let info = st.node_info.unwrap();
    assert_eq!(info.container_runtime_version, "containerd://1.6.20");
    assert_eq!(info.kubelet_version, weir_kubelet::api::KUBELET_VERSION);
    assert_eq!(info.operating_system, "linux");
    assert!(!info.kernel_version.is_empty() && !info.architecture.is_empty());
    assert_eq!(
        st.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port,
        10350
    );
    let conds: BTreeMap<String, (String, String)> = st
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| {
            assert!(c.last_heartbeat_time.is_some() && c.last_transition_time.is_some());
            (c.type_, (c.status, c.reason.unwrap_or_default()))
        })
        .collect();
    assert_eq!(conds["Ready"], ("True".into(), "KubeletReady".into()));
    for t in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert!(conds.contains_key(t), "{t} reported");
    }
}

/// Issue 12 item 9: Ready follows the runtime's CRI Status conditions, with
/// the kubelet's reason and message, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_runtime_conditions() {
    use weir_kubelet::cri::{NETWORK_READY, RUNTIME_READY, RuntimeCondition, RuntimeStatus};
    let k = kubelet(40).await;
    let nodes: Api<Node> = Api::all(k.client.clone());
    let ready = || async {
        let n = nodes.get_opt(NODE).await.ok()??;
        let c = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        Some((c.status, c.reason?, c.message?))
    };
    eventually("Ready", || async {
        ready().await.filter(|r| r.0 == "True")
    })
    .await;
    let cond = |type_: &str, status: bool| RuntimeCondition {
        type_: type_.into(),
        status,
        reason: if status { "" } else { "NetworkPluginNotReady" }.into(),
        message: if status {
            ""
        } else {
            "Network plugin returns error: cni plugin not initialized"
        }
        .into(),
    };
    k.runtime.set_status(RuntimeStatus {
        conditions: vec![cond(RUNTIME_READY, true), cond(NETWORK_READY, false)],
    });
    let (_, reason, message) = eventually("NotReady", || async {
        ready().await.filter(|r| r.0 == "False")
    })
    .await;
    assert_eq!(reason, "KubeletNotReady");
    assert_eq!(
        message,
        "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady \
         message:Network plugin returns error: cni plugin not initialized"
    );
    k.runtime.set_status(RuntimeStatus {
        conditions: vec![cond(RUNTIME_READY, true), cond(NETWORK_READY, true)],
    });
    let (_, reason, message) = eventually("Ready again", || async {
        ready().await.filter(|r| r.0 == "True")
    })
    .await;
    assert_eq!(
        (reason.as_str(), message.as_str()),
        ("KubeletReady", "kubelet is posting ready status")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_node_is_reconciled() {
    let (server, client) = server().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let taint = Taint {
        key: "dedicated".into(),
        effect: "NoSchedule".into(),
        value: Some("x".into()),
        ..Default::default()
    };
    let before = nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some(NODE.into()),
                    labels: Some(BTreeMap::from([("team".into(), "blue".into())])),
                    ..Default::default()
                },
                spec: Some(NodeSpec {
                    taints: Some(vec![taint.clone()]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let k = kubelet_on(server, client, 40).await;
    let node = nodes.get(NODE).await.unwrap();
    assert_eq!(
        node.metadata.uid, before.metadata.uid,
        "same Node, not recreated"
    );
    let labels = node.metadata.labels.unwrap();
    assert_eq!(labels["team"], "blue");
    assert_eq!(labels["kubernetes.io/hostname"], NODE);
    assert_eq!(node.spec.unwrap().taints.unwrap(), vec![taint]);
    assert!(node.status.unwrap().node_info.is_some());
    drop(k);
}

async fn lease(client: &Client) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .get_opt(NODE)
        .await
        .ok()
        .flatten()
}

fn renew_time(l: &Lease) -> Timestamp {
    l.spec.as_ref().unwrap().renew_time.as_ref().unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_renews_every_quarter_and_is_recreated() {
    let k = kubelet(4).await;
    let node_uid = Api::<Node>::all(k.client.clone())
        .get(NODE)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let first = eventually("lease with owner", || async {
        lease(&k.client)
            .await
            .filter(|l| l.metadata.owner_references.is_some())
    })
    .await;
    let spec = first.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(NODE));
    assert_eq!(spec.lease_duration_seconds, Some(4));
    let owner = &first.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        ("v1", "Node", NODE)
    );
    assert_eq!(owner.uid, node_uid);

    // Observe renewals for a few seconds: each ~1 s (4 s / 4) after the last.
    let mut renewals = vec![renew_time(&first)];
    let deadline = Instant::now() + Duration::from_millis(4500);
    while Instant::now() < deadline {
        if let Some(l) = lease(&k.client).await {
            let t = renew_time(&l);
            if t != *renewals.last().unwrap() {
                renewals.push(t);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(renewals.len() >= 4, "renewed {} times", renewals.len() - 1);
    // Each gap is the 1 s sleep plus one request; the bound above leaves room
    // for a loaded CI machine, the mean keeps the test honest.
    let gaps: Vec<f64> = renewals
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    for gap in &gaps {
        assert!(
            (0.9..2.5).contains(gap),
            "renewal interval {gap}s in {gaps:?}"
        );
    }
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!((0.9..1.6).contains(&mean), "mean renewal interval {mean}s");

    Api::<Lease>::namespaced(k.client.clone(), "kube-node-lease")
        .delete(NODE, &DeleteParams::default())
        .await
        .unwrap();
    let again = eventually("lease recreated", || async { lease(&k.client).await }).await;
    assert_ne!(again.metadata.uid, first.metadata.uid);
    assert_eq!(again.metadata.owner_references.unwrap()[0].uid, node_uid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_this_node_arrive_and_graceful_delete_ends_in_delete() {
    let mut k = kubelet(40).await;
    let api = pods(&k.client);
    let mine = api
        .create(&PostParams::default(), &pod("mine", NODE))
        .await
        .unwrap();
    api.create(&PostParams::default(), &pod("theirs", "node-b"))
        .await
        .unwrap();
    let ev = next_event(&mut k.events, |ev| matches!(ev, PodEvent::Upsert { .. })).await;
    let PodEvent::Upsert { pod: got, .. } = ev else {
        unreachable!()
    };
    assert_eq!(
        got.metadata.name.as_deref(),
        Some("mine"),
        "only this node's pods"
    );
    assert_eq!(got.metadata.uid, mine.metadata.uid);

    // A graceful delete arrives as an Upsert carrying deletionTimestamp.
    api.delete("mine", &DeleteParams::default()).await.unwrap();
    let ev = next_event(&mut k.events, upsert_of("mine")).await;
    let PodEvent::Upsert {
        pod: terminating, ..
    } = ev
    else {
        unreachable!()
    };
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert!(
        api.get_opt("mine").await.unwrap().is_some(),
        "waits for the kubelet"
    );

    // Final status, then the delete with the UID precondition.
    k.sink.publish(
        &terminating,
        &PodSource::Api,
        &PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        },
    );
    k.sink.terminated(&terminating, &PodSource::Api);
    let uid = uid_of(&mine);
    next_event(&mut k.events, remove_of(&uid)).await;
    assert!(api.get_opt("mine").await.unwrap().is_none());
    assert!(api.get_opt("theirs").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_recreated_under_the_same_name_is_never_touched() {
    let mut k = kubelet(40).await;
    let api = pods(&k.client);
    api.create(&PostParams::default(), &pod("web", NODE))
        .await
        .unwrap();
    next_event(&mut k.events, upsert_of("web")).await;
    api.delete("web", &DeleteParams::default()).await.unwrap();
    let ev = next_event(&mut k.events, upsert_of("web")).await;
    let PodEvent::Upsert { pod: old, .. } = ev else {
        unreachable!()
    };
    assert!(old.metadata.deletion_timestamp.is_some());

    // Someone force-deletes it and creates a new pod under the same name
    // before the kubelet reports: neither the stale status nor the final
    // delete may reach the new pod.
    api.delete(
        "web",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let new = api
        .create(&PostParams::default(), &pod("web", NODE))
        .await
        .unwrap();
    assert_ne!(new.metadata.uid, old.metadata.uid);
    k.sink.publish(&old, &PodSource::Api, &running("10.0.0.9"));
    k.sink.terminated(&old, &PodSource::Api);
    // And with the watch cache telling the same story, through the API's
    // own UID precondition: wait for the new pod's Upsert too.
    next_event(
        &mut k.events,
        |ev| matches!(ev, PodEvent::Upsert { pod, .. } if pod.metadata.uid == new.metadata.uid),
    )
    .await;
    k.sink.publish(&old, &PodSource::Api, &running("10.0.0.10"));
    k.sink.terminated(&old, &PodSource::Api);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = api.get("web").await.expect("new pod still there");
    assert_eq!(now.metadata.uid, new.metadata.uid);
    assert_ne!(
        now.status.and_then(|s| s.pod_ip),
        Some("10.0.0.10".to_owned()),
        "old status not applied"
    );
    assert!(now.metadata.deletion_timestamp.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_reaches_the_pod_status_once() {
    let mut k = kubelet(40).await;
    let api = pods(&k.client);
    api.create(&PostParams::default(), &pod("db", NODE))
        .await
        .unwrap();
    let ev = next_event(&mut k.events, upsert_of("db")).await;
    let PodEvent::Upsert { pod: p, .. } = ev else {
        unreachable!()
    };
    let status = running("10.1.1.1");
    k.sink.publish(&p, &PodSource::Api, &status);
    let seen = eventually("status patched", || async {
        api.get("db")
            .await
            .ok()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some("10.1.1.1"))
    })
    .await;
    assert_eq!(seen.status.unwrap().phase.as_deref(), Some("Running"));
    let rv = seen.metadata.resource_version;
    // The same status again is not sent again.
    k.sink.publish(&p, &PodSource::Api, &status);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(api.get("db").await.unwrap().metadata.resource_version, rv);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_outage_converges() {
    let mut k = kubelet(40).await;
    let api = pods(&k.client);
    let a = api
        .create(&PostParams::default(), &pod("a", NODE))
        .await
        .unwrap();
    let b = api
        .create(&PostParams::default(), &pod("b", NODE))
        .await
        .unwrap();
    next_event(&mut k.events, upsert_of("a")).await;
    next_event(&mut k.events, upsert_of("b")).await;

    k.server.stop().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    k.server.restart().await.unwrap();
    // Deleted while the watch was down, then history compacted: the watch
    // can only resume through a relist (410), which must yield the Remove.
    api.delete(
        "a",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    k.server.compact();
    let c = api
        .create(&PostParams::default(), &pod("c", NODE))
        .await
        .unwrap();
    let (ua, ub) = (uid_of(&a), uid_of(&b));
    let mut removed_a = false;
    let mut saw_c = false;
    tokio::time::timeout(WAIT, async {
        while !(removed_a && saw_c) {
            match k.events.recv().await.unwrap() {
                PodEvent::Remove { uid, .. } => {
                    assert_ne!(uid, ub, "b still exists");
                    removed_a |= uid == ua;
                }
                PodEvent::Upsert { pod, .. } => saw_c |= pod.metadata.uid == c.metadata.uid,
            }
        }
    })
    .await
    .expect("converged after the outage");
}

fn static_pod(dir: &std::path::Path) -> static_pods::StaticPod {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("static.yaml");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: etcd, namespace: kube-system}\nspec:\n  containers: [{name: etcd, image: busybox}]\n",
    )
    .unwrap();
    static_pods::load_file(&path, NODE, Timestamp::now()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_pods_follow_static_pods() {
    let mut k = kubelet(40).await;
    let dir = std::env::temp_dir().join(format!("weir-mirror-{}", std::process::id()));
    let sp = static_pod(&dir);
    let api: Api<Pod> = Api::namespaced(k.client.clone(), "kube-system");
    let node_uid = Api::<Node>::all(k.client.clone())
        .get(NODE)
        .await
        .unwrap()
        .metadata
        .uid;
    k.sink.publish(
        &sp.pod,
        &PodSource::File(sp.path.clone()),
        &running("10.2.2.2"),
    );
    let name = format!("etcd-{NODE}");
    assert_eq!(sp.name, name);
    let mirror = eventually("mirror with status", || async {
        api.get_opt(&name)
            .await
            .ok()
            .flatten()
            .filter(|m| m.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some("10.2.2.2"))
    })
    .await;
    let ann = mirror.metadata.annotations.clone().unwrap();
    assert_eq!(ann[CONFIG_MIRROR], sp.uid);
    let owner = &mirror.metadata.owner_references.clone().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
    assert_eq!(Some(owner.uid.clone()), node_uid);
    assert_ne!(mirror.metadata.uid.as_deref(), Some(sp.uid.as_str()));

    // Deleted by a user (gracefully, as kubectl does): recreated, with status.
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let again = eventually("mirror recreated", || async {
        api.get_opt(&name).await.ok().flatten().filter(|m| {
            m.metadata.uid != mirror.metadata.uid
                && m.metadata.deletion_timestamp.is_none()
                && m.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some("10.2.2.2")
        })
    })
    .await;
    assert_eq!(
        again.metadata.annotations.clone().unwrap()[CONFIG_MIRROR],
        sp.uid
    );

    // The file changes: a new static UID under the same name. The worker
    // stops the old pod and reports the new one; the mirror follows.
    let mut sp2 = sp.clone();
    sp2.uid = "0123456789abcdef0123456789abcdef".into();
    let ann = sp2.pod.metadata.annotations.as_mut().unwrap();
    ann.insert(static_pods::CONFIG_HASH.into(), sp2.uid.clone());
    sp2.pod.metadata.uid = Some(sp2.uid.clone());
    k.sink
        .terminated(&sp.pod, &PodSource::File(sp.path.clone()));
    k.sink.publish(
        &sp2.pod,
        &PodSource::File(sp2.path.clone()),
        &running("10.2.2.3"),
    );
    let updated = eventually("mirror of the new version", || async {
        api.get_opt(&name).await.ok().flatten().filter(|m| {
            m.metadata.annotations.as_ref().unwrap()[CONFIG_MIRROR] == sp2.uid
                && m.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some("10.2.2.3")
        })
    })
    .await;
    assert_ne!(updated.metadata.uid, again.metadata.uid);
    let sp = sp2;

    // Mirror pods never reach the worker as pods to run.
    while let Ok(ev) = k.events.try_recv() {
        assert!(
            !matches!(ev, PodEvent::Upsert { .. }),
            "mirror pod sent to the worker: {ev:?}"
        );
    }

    k.sink
        .terminated(&sp.pod, &PodSource::File(sp.path.clone()));
    eventually("mirror deleted", || async {
        api.get_opt(&name)
            .await
            .ok()
            .and_then(|m| m.is_none().then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(api.get_opt(&name).await.unwrap().is_none(), "stays deleted");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_causes_no_panic_and_the_lease_resumes() {
    let mut k = kubelet(4).await;
    let api = pods(&k.client);
    api.create(&PostParams::default(), &pod("p", NODE))
        .await
        .unwrap();
    let ev = next_event(&mut k.events, upsert_of("p")).await;
    let PodEvent::Upsert { pod: p, .. } = ev else {
        unreachable!()
    };
    eventually("lease", || async { lease(&k.client).await }).await;

    k.server.stop().await;
    // Work queued during the outage lands afterwards.
    k.sink.publish(&p, &PodSource::Api, &running("10.3.3.3"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let back = Timestamp::now();
    k.server.restart().await.unwrap();
    eventually("lease renewed after the outage", || async {
        lease(&k.client).await.filter(|l| renew_time(l) > back)
    })
    .await;
    eventually("status sent after the outage", || async {
        api.get("p")
            .await
            .ok()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some("10.3.3.3"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_during_an_outage_and_registers_later() {
    let (server, client) = server().await;
    server.stop().await;
    // The worker must not wait for the API server: start returns, the Node
    // and Lease appear once it is back.
    let k = tokio::time::timeout(Duration::from_secs(10), kubelet_on(server, client, 4))
        .await
        .expect("start does not block on an outage");
    k.server.restart().await.unwrap();
    let nodes: Api<Node> = Api::all(k.client.clone());
    let node = eventually("node registered after the outage", || async {
        nodes.get_opt(NODE).await.ok().flatten()
    })
    .await;
    let uid = node.metadata.uid.clone().unwrap();
    eventually("owned lease", || async {
        lease(&k.client).await.filter(|l| {
            l.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o[0].uid == uid)
        })
    })
    .await;
    // A deleted Node is registered again (and the Lease follows the new UID).
    nodes.delete(NODE, &DeleteParams::default()).await.unwrap();
    let again = eventually("node re-registered", || async {
        nodes
            .get_opt(NODE)
            .await
            .ok()
            .flatten()
            .filter(|n| n.metadata.uid.as_deref() != Some(uid.as_str()))
    })
    .await;
    let new_uid = again.metadata.uid.unwrap();
    eventually("lease owned by the new node", || async {
        lease(&k.client).await.filter(|l| {
            l.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o[0].uid == new_uid)
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_node_status_is_reported_every_report_frequency() {
    let (server, client) = server().await;
    let opts = NodeOptions {
        status_report_frequency: Duration::from_secs(2),
        ..options()
    };
    // Checked every second (nodeStatusUpdateFrequency), sent every 2 s only.
    let k = kubelet_with(server, client, 40, opts).await;
    let nodes: Api<Node> = Api::all(k.client.clone());
    let ready = |n: Node| {
        n.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")
    };
    let mut beats = Vec::new();
    let mut transitions = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(6500);
    while Instant::now() < deadline {
        let c = ready(nodes.get(NODE).await.unwrap()).expect("Ready");
        let beat = c.last_heartbeat_time.unwrap().0;
        if beats.last() != Some(&beat) {
            beats.push(beat);
        }
        transitions.push(c.last_transition_time.unwrap().0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(beats.len() >= 3, "heartbeats {beats:?}");
    for w in beats.windows(2) {
        // Times have second resolution: a 2 s period shows as 2 or 3 s.
        let gap = w[1].duration_since(w[0]).as_secs_f64();
        assert!(
            (2.0..=4.0).contains(&gap),
            "heartbeat gap {gap}s in {beats:?}"
        );
    }
    transitions.dedup();
    assert_eq!(transitions.len(), 1, "no transition while Ready stays True");
}

/// Issue 12 item 10: an API pod annotated `kubernetes.io/config.source: file`
/// is still an API pod. Its status must reach it (not a mirror pod that the
/// name collision blocks), and its graceful delete must end in the final
/// delete, not leave it Terminating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_pod_cannot_pass_itself_off_as_static() {
    let mut k = kubelet(40).await;
    let api = pods(&k.client);
    let mut p = pod("fake-static", NODE);
    p.metadata.annotations =
        Some([(static_pods::CONFIG_SOURCE.to_owned(), "file".to_owned())].into());
    api.create(&PostParams::default(), &p).await.unwrap();
    let ev = next_event(&mut k.events, upsert_of("fake-static")).await;
    // The source is where the pod came from, whatever it claims.
    let PodEvent::Upsert { pod: got, source } = ev else {
        unreachable!()
    };
    assert_eq!(source, PodSource::Api);
    k.sink.publish(&got, &source, &running("10.4.4.4"));
    eventually("the status on the API pod itself", || async {
        api.get_opt("fake-static")
            .await
            .ok()
            .flatten()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some("10.4.4.4"))
    })
    .await;
    assert!(
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|p| !p
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(CONFIG_MIRROR))),
        "no mirror pod was made for it"
    );
    api.delete("fake-static", &DeleteParams::default())
        .await
        .unwrap();
    // The status patch comes back as an update first: wait for the delete.
    let ev = next_event(&mut k.events, |ev| {
        matches!(ev, PodEvent::Upsert { pod, .. }
            if pod.metadata.name.as_deref() == Some("fake-static")
                && pod.metadata.deletion_timestamp.is_some())
    })
    .await;
    let PodEvent::Upsert {
        pod: terminating, ..
    } = ev
    else {
        unreachable!()
    };
    k.sink.terminated(&terminating, &source);
    eventually("the pod deleted for good", || async {
        api.get_opt("fake-static")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
}
