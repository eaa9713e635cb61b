//! The real kubectl through the proxy (skipped, loudly, when it is absent):
//! `logs -f` prints each line as the kubelet writes it, `exec` goes over a
//! WebSocket in `v5.channel.k8s.io` that the server translates to SPDY for
//! the kubelet (no fallback), and falls back to SPDY itself when the
//! kubelet refuses the upgrade.
use std::{
    path::Path,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    sync::mpsc,
};

use super::{
    Cluster, Reply,
    spdy::{Script, Transcript},
};

use super::common::{KUBECTL, kubectl as run, kubectl_cmd as kubectl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_follow_and_exec_through_the_kubelet() {
    if !Path::new(KUBECTL).exists() {
        eprintln!("SKIPPED: {KUBECTL} is not installed; kubectl logs/exec are untested");
        return;
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let rx = Arc::new(Mutex::new(Some(rx)));
    let transcript: Arc<Mutex<Transcript>> = Arc::default();
    let script = Script {
        greeting: "hello from c\n".into(),
        exit: 0,
        transcript: transcript.clone(),
    };
    let c = Cluster::start(move |s| {
        let spdy = s.header_values("upgrade") == ["SPDY/3.1"];
        if s.uri.starts_with("/containerLogs/") {
            Reply::Stream(rx.lock().unwrap().take().expect("one follow"))
        } else if s.uri.starts_with("/exec/default/p/") && spdy {
            Reply::Spdy(script.clone())
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

    // kubectl's WebSocket in v5 is translated: no fallback to SPDY.
    let started = Instant::now();
    let (ok, stdout, stderr) = run(&c.server, &["exec", "-v=6", "p", "--", "echo", "hi"]).await;
    println!("kubectl exec over WebSocket v5: {:?}", started.elapsed());
    assert!(ok, "kubectl exec failed: {stderr}");
    assert_eq!(stdout, "hello from c\n");
    assert!(!stderr.contains("fallback"), "{stderr}");
    let exec = c.kubelet.seen().pop().unwrap();
    assert_eq!(
        (exec.method.as_str(), exec.uri.as_str()),
        (
            "POST",
            "/exec/default/p/c?command=echo&command=hi&error=1&output=1"
        )
    );
    assert_eq!(
        transcript.lock().unwrap().streams,
        ["error", "stdout", "stderr"]
    );

    // exec -i: stdin, and its end (the v5 close signal), reach the command.
    let mut child = kubectl(&c.server, &["exec", "-i", "p", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"typed\n").await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("kubectl exec -i ends with its input")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl exec -i failed: {stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from c\ntyped\n"
    );
    let t = transcript.lock().unwrap().clone();
    assert_eq!(t.streams[3..], ["error", "stdin", "stdout", "stderr"]);
    assert!(t.stdin_fin && t.pong, "{t:?}");

    // A kubelet that refuses the upgrade: kubectl's WebSocket, translated,
    // gets the refusal and kubectl tries SPDY itself, refused the same.
    c.pod("p2", Some("n1"), &[], &["c"]).await;
    let (ok, _, stderr) = run(&c.server, &["exec", "-v=6", "p2", "--", "true"]).await;
    assert!(!ok);
    assert!(stderr.contains("no streams here"), "{stderr}");
    // What the log shows when kubectl does fall back.
    assert!(stderr.contains("RemoteCommand fallback"), "{stderr}");
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
            ("POST".to_string(), "SPDY/3.1".to_string()),
            ("POST".to_string(), "SPDY/3.1".to_string())
        ]
    );
}
