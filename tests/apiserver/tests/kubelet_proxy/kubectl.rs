//! The real kubectl through the proxy (skipped, loudly, when it is absent):
//! `logs -f` prints each line as the kubelet writes it, `exec` goes over a
//! websocket, and falls back to SPDY when the kubelet refuses the upgrade.
use std::{
    path::Path,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    sync::mpsc,
};

use super::{Cluster, Reply};

use super::common::{KUBECTL, kubectl as run, kubectl_cmd as kubectl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_follow_and_exec_through_the_kubelet() {
    if !Path::new(KUBECTL).exists() {
        eprintln!("SKIPPED: {KUBECTL} is not installed; kubectl logs/exec are untested");
        return;
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let rx = Arc::new(Mutex::new(Some(rx)));
    let c = Cluster::start(move |s| {
        let websocket = s.header_values("upgrade").iter().any(|u| u == "websocket");
        if s.uri.starts_with("/containerLogs/") {
            Reply::Stream(rx.lock().unwrap().take().expect("one follow"))
        } else if s.uri.starts_with("/exec/default/p/") && websocket {
            Reply::WebSocketExec {
                stdout: "hello from c\n".into(),
            }
        } else {
            Reply::Text {
                status: 400,
                headers: vec![],
                body: "no streams here".into(),
            }
        }
    })
    .await;

    let mut follow = kubectl(&c.server, &["logs", "-f", "p"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a line in time")
            .unwrap()
    };
    tx.send(Bytes::from_static(b"first\n")).await.unwrap();
    assert_eq!(next().await.as_deref(), Some("first"));
    tx.send(Bytes::from_static(b"second\n")).await.unwrap();
    assert_eq!(next().await.as_deref(), Some("second"));
    // The container's log ends: so does kubectl.
    drop(tx);
    assert_eq!(next().await, None);
    let status = tokio::time::timeout(Duration::from_secs(30), follow.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    assert_eq!(c.kubelet.uris(), ["/containerLogs/default/p/c?follow=true"]);

    let (ok, stdout, stderr) = run(&c.server, &["exec", "p", "--", "echo", "hi"]).await;
    assert!(ok, "kubectl exec failed: {stderr}");
    assert_eq!(stdout, "hello from c\n");
    let exec = c.kubelet.seen().pop().unwrap();
    assert_eq!(
        (exec.method.as_str(), exec.uri.as_str()),
        (
            "GET",
            "/exec/default/p/c?command=echo&command=hi&error=1&output=1"
        )
    );

    // A kubelet that refuses the websocket: kubectl tries SPDY next, and
    // reports the kubelet's refusal of that too.
    c.pod("p2", Some("n1"), &[], &["c"]).await;
    let (ok, _, stderr) = run(&c.server, &["exec", "p2", "--", "true"]).await;
    assert!(!ok);
    assert!(stderr.contains("no streams here"), "{stderr}");
    let tries: Vec<(String, String)> = c
        .kubelet
        .seen()
        .into_iter()
        .filter(|s| s.uri.starts_with("/exec/default/p2/"))
        .map(|s| (s.method.clone(), s.header_values("upgrade").join(",")))
        .collect();
    assert_eq!(
        tries,
        [
            ("GET".to_string(), "websocket".to_string()),
            ("POST".to_string(), "SPDY/3.1".to_string())
        ]
    );
}
