//! `pods/log`, `exec`, `attach` and `portforward` proxied to the pod's
//! kubelet, here a fake one over real HTTPS that demands the server's
//! kubelet client certificate; reached through kube-rs, raw HTTP/1.1
//! upgrades, a WebSocket client in `v5.channel.k8s.io` and in the
//! port-forward tunnel (translated to SPDY for the kubelet, whose remote
//! command server `kubelet_proxy/spdy.rs` stands in for), and kubectl.
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use futures::{AsyncBufReadExt as _, StreamExt as _};
use http::{Method, Request, Response};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    core::v1::{Node, Pod, ServiceAccount},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{LogParams, Patch, PatchParams, PostParams},
};
use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    sync::mpsc,
};
use tokio_rustls::TlsConnector;
use weir_test_apiserver::{TestApiServer, eventually};

mod common;
#[path = "kubelet_proxy/fake.rs"]
mod fake;
#[path = "kubelet_proxy/spdy.rs"]
mod spdy;

use common::start;
use fake::{FakeKubelet, Reply, Seen, pem_to_der};

const PODS: &str = "/api/v1/namespaces/default/pods";

struct Cluster {
    server: TestApiServer,
    client: Client,
    kubelet: FakeKubelet,
}

impl Cluster {
    /// A server, a fake kubelet answering with `handler`, Node `n1` whose
    /// addresses no one can reach but whose route leads to the fake, and
    /// pod `p` (container `c`) on it.
    async fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Self {
        let (server, client) = start().await;
        let kubelet = FakeKubelet::start(server.ca_pem(), handler).await;
        let c = Cluster {
            server,
            client,
            kubelet,
        };
        c.node(
            "n1",
            json!({
                "addresses": [
                    {"type": "InternalIP", "address": "10.255.0.1"},
                    {"type": "Hostname", "address": "n1"},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            }),
        )
        .await;
        c.server.route_kubelet("n1", c.kubelet.addr);
        c.pod("p", Some("n1"), &[], &["c"]).await;
        c
    }

    async fn node(&self, name: &str, status: Value) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap();
    }

    async fn pod(&self, name: &str, node: Option<&str>, init: &[&str], containers: &[&str]) {
        let list = |names: &[&str]| -> Value {
            names
                .iter()
                .map(|n| json!({"name": n, "image": "busybox:1"}))
                .collect()
        };
        let mut spec = json!({"containers": list(containers)});
        if !init.is_empty() {
            spec["initContainers"] = list(init);
        }
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        let pod =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    fn pods(&self) -> Api<Pod> {
        Api::default_namespaced(self.client.clone())
    }

    async fn send(&self, req: Request<Empty<Bytes>>) -> Response<Incoming> {
        send(&self.server, self.server.token(), req).await
    }
}

/// One request over a fresh HTTP/1.1 connection, with a bearer token.
async fn send(
    server: &TestApiServer,
    token: &str,
    mut req: Request<Empty<Bytes>>,
) -> Response<Incoming> {
    let mut roots = RootCertStore::empty();
    roots.add(pem_to_der(server.ca_pem()).into()).unwrap();
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = TcpStream::connect(server.addr()).await.unwrap();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    let headers = req.headers_mut();
    headers.insert("host", "localhost".parse().unwrap());
    headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
    sender.send_request(req).await.unwrap()
}

fn plain(method: Method, uri: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .method(method)
        .uri(uri)
        .body(Empty::new())
        .unwrap()
}

/// A websocket handshake offering `protocols` (RFC 6455's example key).
fn websocket(method: Method, uri: &str, protocols: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-protocol", protocols)
        .body(Empty::new())
        .unwrap()
}

/// A websocket handshake in `v4.channel.k8s.io` (kube-rs's): passed through
/// to the kubelet as it is.
fn upgrade(method: Method, uri: &str) -> Request<Empty<Bytes>> {
    let mut req = websocket(method, uri, "v4.channel.k8s.io");
    for v in ["v4.channel.k8s.io", "v3.channel.k8s.io"] {
        req.headers_mut()
            .append("x-stream-protocol-version", v.parse().unwrap());
    }
    req
}

async fn text(resp: Response<Incoming>) -> String {
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

/// (code, message) of a Status answer.
async fn status(resp: Response<Incoming>) -> (u16, String) {
    let code = resp.status().as_u16();
    let body: Value = serde_json::from_str(&text(resp).await).unwrap();
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["code"], code, "{body}");
    (
        code,
        body["message"].as_str().unwrap_or_default().to_string(),
    )
}

fn api_error(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn echo() -> Reply {
    Reply::Echo(vec![
        ("upgrade", "websocket".into()),
        ("connection", "Upgrade".into()),
        (
            "sec-websocket-accept",
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=".into(),
        ),
        ("sec-websocket-protocol", "v4.channel.k8s.io".into()),
        ("x-stream-protocol-version", "v4.channel.k8s.io".into()),
    ])
}

#[tokio::test]
async fn logs_come_from_the_pods_kubelet_with_the_query_translated() {
    let c = Cluster::start(|s| Reply::Text {
        status: 200,
        headers: vec![],
        body: format!("log of {}\n", s.uri),
    })
    .await;
    let lp = LogParams {
        previous: true,
        since_seconds: Some(60),
        tail_lines: Some(5),
        timestamps: true,
        limit_bytes: Some(100),
        ..Default::default()
    };
    let got = c.pods().logs("p", &lp).await.unwrap();
    let want = "/containerLogs/default/p/c?limitBytes=100&previous=true&sinceSeconds=60&tailLines=5&timestamps=true";
    assert_eq!(got, format!("log of {want}\n"));

    let seen = c.kubelet.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].uri.as_str()),
        ("GET", want)
    );
    // The preferred address type (Hostname) and the node's kubelet port.
    assert_eq!(seen[0].header_values("host"), ["n1:10250"]);
    assert!(seen[0].headers.get("authorization").is_none());
    let cert = &seen[0].peer_cert;
    assert!(contains(cert, b"kube-apiserver-kubelet-client"), "CN");
    assert!(contains(cert, b"system:masters"), "O");
    assert!(c.server.requests_by_user().iter().any(|(user, r)| {
        user == "weir-test-admin" && r.starts_with(&format!("GET {PODS}/p/log?"))
    }));
}

#[tokio::test]
async fn containers_nodes_and_options_are_checked_before_the_kubelet() {
    let c = Cluster::start(|s| {
        if s.uri.contains("previous=true") {
            Reply::Text {
                status: 400,
                headers: vec![],
                body: "previous terminated container \"a\" in pod \"multi\" not found".into(),
            }
        } else {
            Reply::Text {
                status: 200,
                headers: vec![],
                body: "ok".into(),
            }
        }
    })
    .await;
    c.pod("multi", Some("n1"), &["setup"], &["a", "b"]).await;
    let pods = c.pods();
    let logs = |container: Option<&str>, previous: bool| LogParams {
        container: container.map(String::from),
        previous,
        ..Default::default()
    };
    assert_eq!(
        api_error(pods.logs("multi", &logs(None, false)).await.unwrap_err()),
        (
            400,
            "a container name must be specified for pod multi, choose one of: [setup a b]".into()
        )
    );
    assert_eq!(
        api_error(
            pods.logs("multi", &logs(Some("zz"), false))
                .await
                .unwrap_err()
        ),
        (400, "container zz is not valid for pod multi".into())
    );
    assert_eq!(
        pods.logs("multi", &logs(Some("setup"), false))
            .await
            .unwrap(),
        "ok"
    );
    // The kubelet's 400 becomes the server's.
    assert_eq!(
        api_error(
            pods.logs("multi", &logs(Some("a"), true))
                .await
                .unwrap_err()
        ),
        (
            400,
            "previous terminated container \"a\" in pod \"multi\" not found".into()
        )
    );
    assert_eq!(
        c.kubelet.uris(),
        [
            "/containerLogs/default/multi/setup",
            "/containerLogs/default/multi/a?previous=true"
        ]
    );

    // Validated as PodLogOptions.
    let resp = c
        .send(plain(Method::GET, &format!("{PODS}/p/log?tailLines=-1")))
        .await;
    assert_eq!(
        status(resp).await,
        (
            422,
            "PodLogOptions \"p\" is invalid: tailLines: Invalid value: -1: must be greater than or equal to 0"
                .into()
        )
    );

    // Not scheduled: no log yet; nothing to exec in.
    c.pod("idle", None, &[], &["c"]).await;
    assert_eq!(pods.logs("idle", &LogParams::default()).await.unwrap(), "");
    let resp = c
        .send(upgrade(
            Method::GET,
            &format!("{PODS}/idle/exec?command=ls&stdout=1"),
        ))
        .await;
    assert_eq!(
        status(resp).await,
        (400, "pod idle does not have a host assigned".into())
    );

    // The node must exist and have an address, even with a route.
    c.pod("lost", Some("ghost"), &[], &["c"]).await;
    assert_eq!(
        api_error(pods.logs("lost", &LogParams::default()).await.unwrap_err()),
        (404, "nodes \"ghost\" not found".into())
    );
    c.node("bare", json!({"addresses": []})).await;
    c.server.route_kubelet("bare", c.kubelet.addr);
    c.pod("stray", Some("bare"), &[], &["c"]).await;
    assert_eq!(
        api_error(pods.logs("stray", &LogParams::default()).await.unwrap_err()),
        (
            500,
            "no preferred addresses found; known addresses: []".into()
        )
    );

    // A kubelet that does not answer.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    c.node(
        "down",
        json!({"addresses": [{"type": "InternalIP", "address": "10.255.0.9"}]}),
    )
    .await;
    c.server.route_kubelet("down", dead);
    c.pod("orphan", Some("down"), &[], &["c"]).await;
    let (code, message) = api_error(
        pods.logs("orphan", &LogParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert_eq!(
        message,
        format!(
            "Get \"https://10.255.0.9:10250/containerLogs/default/orphan/c\": dial tcp {dead}: connect: connection refused"
        )
    );
    let resp = c
        .send(upgrade(
            Method::POST,
            &format!("{PODS}/orphan/exec?command=ls&stdout=1"),
        ))
        .await;
    assert_eq!(
        status(resp).await,
        (
            500,
            format!("error dialing backend: dial tcp {dead}: connect: connection refused")
        )
    );
    assert_eq!(c.kubelet.uris().len(), 2, "no other request reached it");
}

#[tokio::test]
async fn follow_passes_each_chunk_on_at_once_and_hangs_up_with_the_client() {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let rx = Mutex::new(Some(rx));
    let c = Cluster::start(move |_| Reply::Stream(rx.lock().unwrap().take().expect("one follow")))
        .await;
    let lp = LogParams {
        follow: true,
        ..Default::default()
    };
    let mut lines = c.pods().log_stream("p", &lp).await.unwrap().lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), lines.next())
            .await
            .expect("a line in time")
            .unwrap()
            .unwrap()
    };
    tx.send(Bytes::from_static(b"one\n")).await.unwrap();
    // Read before the kubelet has written anything more.
    assert_eq!(next().await, "one");
    tx.send(Bytes::from_static(b"two\n")).await.unwrap();
    assert_eq!(next().await, "two");
    assert_eq!(c.kubelet.uris(), ["/containerLogs/default/p/c?follow=true"]);

    drop(lines);
    // The server closes its kubelet connection once its client is gone:
    // the fake's body is dropped and its channel closes.
    eventually("the kubelet connection to close", || {
        let _ = tx.try_send(Bytes::from_static(b"tick\n"));
        std::future::ready(tx.is_closed().then_some(()))
    })
    .await;
}

#[tokio::test]
async fn exec_attach_and_portforward_reach_the_kubelet_at_its_paths() {
    let c = Cluster::start(|_| echo()).await;
    let cases = [
        (
            Method::POST,
            "p/exec?command=sh&command=-c&command=echo%20hi&stdin=true&stdout=true&tty=true",
            "/exec/default/p/c?command=sh&command=-c&command=echo+hi&input=1&output=1&tty=1",
        ),
        (
            Method::GET,
            "p/attach?stdout=1&stderr=true&container=c",
            "/attach/default/p/c?error=1&output=1",
        ),
        (
            Method::GET,
            "p/portforward?ports=8080&ports=9090",
            "/portForward/default/p?port=8080%2C9090",
        ),
    ];
    for (method, path, want) in cases {
        let resp = c
            .send(upgrade(method.clone(), &format!("{PODS}/{path}")))
            .await;
        assert_eq!(resp.status(), 101, "{path}");
        let seen = c.kubelet.seen().pop().unwrap();
        assert_eq!(
            (seen.method.as_str(), seen.uri.as_str()),
            (method.as_str(), want)
        );
    }
}

#[tokio::test]
async fn an_upgraded_connection_carries_bytes_both_ways_with_half_close() {
    let c = Cluster::start(|_| echo()).await;
    let resp = c
        .send(upgrade(
            Method::GET,
            &format!("{PODS}/p/exec?command=cat&stdin=1&stdout=1"),
        ))
        .await;
    assert_eq!(resp.status(), 101);
    let h = resp.headers();
    assert_eq!(h["upgrade"], "websocket");
    assert_eq!(h["sec-websocket-accept"], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_eq!(h["sec-websocket-protocol"], "v4.channel.k8s.io");
    assert_eq!(h["x-stream-protocol-version"], "v4.channel.k8s.io");

    let seen = c.kubelet.seen().pop().unwrap();
    assert_eq!(seen.header_values("upgrade"), ["websocket"]);
    assert_eq!(
        seen.header_values("sec-websocket-key"),
        ["dGhlIHNhbXBsZSBub25jZQ=="]
    );
    assert_eq!(
        seen.header_values("x-stream-protocol-version"),
        ["v4.channel.k8s.io", "v3.channel.k8s.io"]
    );
    assert!(seen.headers.get("authorization").is_none());

    let mut io = TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    io.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    io.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    // Our end of input reaches the kubelet, which answers and closes.
    io.shutdown().await.unwrap();
    let mut rest = Vec::new();
    io.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"bye");
}

#[tokio::test]
async fn stopping_the_server_cuts_upgraded_connections() {
    let c = Cluster::start(|_| echo()).await;
    let resp = c
        .send(upgrade(Method::GET, &format!("{PODS}/p/attach?stdout=1")))
        .await;
    let mut io = TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    io.write_all(b"x").await.unwrap();
    let mut buf = [0u8; 1];
    io.read_exact(&mut buf).await.unwrap();
    c.server.stop().await;
    // The fake would echo forever; the end comes from the server.
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(20), io.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "still open after stop");
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test]
async fn refused_upgrades_go_back_as_the_kubelet_sent_them() {
    let c = Cluster::start(|s| {
        if s.uri.starts_with("/exec/") {
            Reply::Text {
                status: 403,
                headers: vec![("x-kubelet", "said-no"), ("content-type", "text/plain")],
                body: "Forbidden (user=x, verb=create, resource=nodes, subresource=proxy)\n".into(),
            }
        } else {
            Reply::Text {
                status: 200,
                headers: vec![],
                body: "not an upgrade".into(),
            }
        }
    })
    .await;
    let resp = c
        .send(upgrade(
            Method::GET,
            &format!("{PODS}/p/exec?command=ls&stdout=1"),
        ))
        .await;
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.headers()["x-kubelet"], "said-no");
    assert_eq!(
        text(resp).await,
        "Forbidden (user=x, verb=create, resource=nodes, subresource=proxy)\n"
    );
    let resp = c
        .send(upgrade(Method::GET, &format!("{PODS}/p/attach?stdout=1")))
        .await;
    assert_eq!(
        status(resp).await,
        (500, "invalid upgrade response: status code 200".into())
    );
    // No upgrade asked: refused here, before any kubelet is dialled.
    let resp = c
        .send(plain(
            Method::POST,
            &format!("{PODS}/p/exec?command=ls&stdout=1"),
        ))
        .await;
    assert_eq!(status(resp).await, (400, "Upgrade request required".into()));
    assert_eq!(c.kubelet.seen().len(), 2);
}

async fn apply_role(client: &Client, rules: Value) {
    let roles: Api<Role> = Api::default_namespaced(client.clone());
    let role: Role =
        serde_json::from_value(json!({"metadata": {"name": "viewer"}, "rules": rules})).unwrap();
    roles
        .patch(
            "viewer",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&role),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn rbac_decides_who_reaches_the_kubelet() {
    let c = Cluster::start(|s| {
        if s.uri.starts_with("/containerLogs/") {
            Reply::Text {
                status: 200,
                headers: vec![],
                body: "log".into(),
            }
        } else {
            echo()
        }
    })
    .await;
    let accounts: Api<ServiceAccount> = Api::default_namespaced(c.client.clone());
    let sa = serde_json::from_value(json!({"metadata": {"name": "viewer"}})).unwrap();
    accounts.create(&PostParams::default(), &sa).await.unwrap();
    apply_role(
        &c.client,
        json!([
            {"apiGroups": [""], "resources": ["pods/log", "pods/exec"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods/attach"], "verbs": ["create"]},
        ]),
    )
    .await;
    let binding = serde_json::from_value::<RoleBinding>(json!({
        "metadata": {"name": "viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer"}],
    }))
    .unwrap();
    Api::<RoleBinding>::default_namespaced(c.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let token = accounts
        .create_token_request("viewer", &PostParams::default(), &TokenRequest::default())
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let as_viewer = async |req| send(&c.server, &token, req).await;
    let user = "system:serviceaccount:default:viewer";
    let denied = |verb: &str, sub: &str| {
        (
            403,
            format!(
                "pods \"p\" is forbidden: User \"{user}\" cannot {verb} resource \"pods/{sub}\" in API group \"\" in the namespace \"default\""
            ),
        )
    };

    let resp = as_viewer(plain(Method::GET, &format!("{PODS}/p/log"))).await;
    assert_eq!(text(resp).await, "log");
    // A websocket GET needs create as well as get.
    let exec = format!("{PODS}/p/exec?command=ls&stdout=1");
    let resp = as_viewer(upgrade(Method::GET, &exec)).await;
    assert_eq!(status(resp).await, denied("create", "exec"));
    let resp = as_viewer(upgrade(Method::POST, &exec)).await;
    assert_eq!(status(resp).await, denied("create", "exec"));
    let resp = as_viewer(upgrade(Method::POST, &format!("{PODS}/p/attach?stdout=1"))).await;
    assert_eq!(resp.status(), 101);
    let resp = as_viewer(upgrade(Method::GET, &format!("{PODS}/p/attach?stdout=1"))).await;
    assert_eq!(status(resp).await, denied("get", "attach"));
    let resp = as_viewer(upgrade(
        Method::GET,
        &format!("{PODS}/p/portforward?ports=80"),
    ))
    .await;
    assert_eq!(status(resp).await, denied("get", "portforward"));

    apply_role(
        &c.client,
        json!([{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]}]),
    )
    .await;
    let resp = as_viewer(upgrade(Method::GET, &exec)).await;
    assert_eq!(resp.status(), 101);
    // Denied or not, every request is in the audit log.
    let audit = c.server.requests_by_user();
    let by_viewer: Vec<&String> = audit
        .iter()
        .filter(|(u, _)| u == user)
        .map(|(_, r)| r)
        .collect();
    assert_eq!(by_viewer.len(), 7, "{by_viewer:?}");
    assert_eq!(by_viewer[6], &format!("GET {exec}"));
    // Only the log, the allowed attach and the allowed exec reached it.
    assert_eq!(c.kubelet.seen().len(), 3);

    // What a kubelet's webhook authorizer asks about this server's user.
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": "kube-apiserver-kubelet-client",
            "groups": ["system:masters", "system:authenticated"],
            "resourceAttributes": {"verb": "create", "resource": "nodes", "subresource": "proxy", "name": "n1"},
        },
    });
    let req = Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&review).unwrap())
        .unwrap();
    let answer: Value = c.client.request(req).await.unwrap();
    assert_eq!(answer["status"]["allowed"], true, "{answer}");
}

#[path = "kubelet_proxy/translated.rs"]
mod translated;

#[path = "kubelet_proxy/kubectl.rs"]
mod kubectl;
