//! Issue 12's attacks on weir-kubelet's paths, against real containerd: a
//! static pod whose UID walks out of the pods directory (the binary), and a
//! subPath through a symlink an init container planted (the worker
//! in-process, as in kubelet_worker). Every "victim" is a directory of the
//! test's own work dir, never a system path. Needs root.
use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use serde_json::json;
use weir_integration::{
    containerd::{Containerd, host_mounts_under},
    images,
    kubelet::{
        ConfigOptions, Kubelet as KubeletProcess, find, running_ip, write_config, write_static_pod,
    },
};
use weir_kubelet::flow::PodEvent;

// The worker tests' helpers; not every one is used here.
#[allow(dead_code)]
#[path = "kubelet_worker/support.rs"]
mod support;
#[allow(clippy::wildcard_imports)]
use support::*;

const MIN: Duration = Duration::from_secs(60);

/// Item 1: a static pod with `uid: ../../victim` would make teardown remove
/// `<root-dir>/pods/../../victim`, here the work dir's `victim`. The file must
/// be refused (and say so), and the directory must survive the pod's removal.
#[test]
fn a_static_pod_uid_cannot_reach_outside_the_pods_dir() -> Result<()> {
    weir_integration::sweep::sweep();
    let ctrd = Containerd::start()?;
    // --root-dir is <dir>/kubelet, so <dir>/kubelet/pods/../../victim is this.
    let victim = ctrd.dir.join("victim");
    std::fs::create_dir_all(&victim)?;
    std::fs::write(victim.join("keep"), "precious")?;
    let manifests = ctrd.dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let config = write_config(
        &ctrd,
        &ConfigOptions {
            static_dir: Some(manifests.clone()),
            read_only_port: Some(weir_integration::kubelet::READ_ONLY_PORT),
            ..ConfigOptions::default()
        },
    )?;
    let mut kubelet = KubeletProcess::start(&ctrd, &config, None, "node1")?;
    kubelet.wait_serving(Duration::from_secs(30))?;
    let pod_yaml = |name: &str, uid: Option<&str>| {
        let uid = uid.map(|u| format!("\n  uid: {u}")).unwrap_or_default();
        // The emptyDir makes the pods directory exist, so `pods/..` resolves.
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}{uid}\nspec:\n  \
             terminationGracePeriodSeconds: 1\n  volumes: [{{name: scratch, emptyDir: {{}}}}]\n  \
             containers:\n  - name: c\n    image: {}\n    command: [sleep, '1000']\n    \
             volumeMounts: [{{name: scratch, mountPath: /scratch}}]\n",
            images::BUSYBOX
        )
    };
    write_static_pod(
        &manifests,
        "evil.yaml",
        &pod_yaml("evil", Some("../../victim")),
    )?;
    write_static_pod(&manifests, "good.yaml", &pod_yaml("good", None))?;
    kubelet.poll(
        "the good static pod Running",
        MIN,
        Duration::from_millis(500),
        |pods| find(pods, "good-node1").and_then(running_ip),
    )?;
    // Long enough for the evil pod to start too, were it accepted.
    std::thread::sleep(Duration::from_secs(3));
    std::fs::remove_file(manifests.join("evil.yaml"))?;
    kubelet.poll(
        "the evil pod gone from /pods",
        MIN,
        Duration::from_millis(500),
        |pods| find(pods, "evil-node1").is_none().then_some(()),
    )?;
    // Teardown runs once the pod task saw the removal.
    std::thread::sleep(Duration::from_secs(3));
    ensure!(
        victim.join("keep").exists(),
        "the kubelet removed {} (outside its pods directory) for static pod uid ../../victim",
        victim.display()
    );
    let log = kubelet.log_text();
    ensure!(
        log.contains("evil.yaml") && log.contains("metadata.uid"),
        "the refusal names the file and field:\n{log}"
    );
    Ok(())
}

fn status_of<'a>(s: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
}

fn waiting_reason(c: &ContainerStatus) -> Option<(&str, &str)> {
    let w = c.state.as_ref()?.waiting.as_ref()?;
    Some((
        w.reason.as_deref().unwrap_or_default(),
        w.message.as_deref().unwrap_or_default(),
    ))
}

/// Item 2 (CVE-2017-1002101's class): an init container links `x` in an
/// emptyDir to a directory outside it (here one of the test's, standing in
/// for the node's `/`); a container mounting `subPath: x` must not get it.
/// Subpaths that stay inside (a directory, a relative link, one to create)
/// still work, and teardown leaves no mount behind.
#[test]
fn a_sub_path_cannot_follow_a_symlink_out_of_the_volume() -> Result<()> {
    weir_integration::sweep::sweep();
    let ctrd = Containerd::start()?;
    let outside = ctrd.dir.join("outside");
    std::fs::create_dir_all(&outside)?;
    std::fs::write(outside.join("marker"), "host data")?;
    let pods_dir = ctrd.kubelet_dir().join("pods");
    on_node(&ctrd, || async {
        let k = start_worker(&ctrd);
        let cri = ctrd.runtime();
        let data =
            |path: &str, sub: &str| json!({"name": "data", "mountPath": path, "subPath": sub});
        let plant = format!(
            "ln -s {} /data/x && mkdir -p /data/ok && echo inside > /data/ok/f && ln -s ok /data/rel",
            outside.display()
        );
        let p = pod(
            "subpath",
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "data", "emptyDir": {}}],
                "initContainers": [{"name": "plant", "image": images::BUSYBOX, "command": sh(&plant),
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "containers": [
                    {"name": "escape", "image": images::BUSYBOX, "command": sh("exec sleep 1000"),
                     "volumeMounts": [data("/escaped", "x")]},
                    {"name": "fine", "image": images::BUSYBOX, "command": sh("exec sleep 1000"),
                     "volumeMounts": [data("/sub", "ok"), data("/rel", "rel"), data("/new", "made/here")]},
                ],
            }),
        );
        let uid = uid_of(&p);
        k.events.send(upsert(&p)).await?;
        let s = k
            .rec
            .wait(&uid, MIN, "fine Running and escape decided", |s| {
                let fine = status_of(s, "fine")
                    .is_some_and(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()));
                let escape = status_of(s, "escape").is_some_and(|c| {
                    c.state.as_ref().is_some_and(|st| st.running.is_some())
                        || waiting_reason(c).is_some_and(|(r, _)| r == "CreateContainerConfigError")
                });
                fine && escape
            })
            .await?;
        let escape = status_of(&s, "escape").context("escape status")?;
        if escape.state.as_ref().is_some_and(|st| st.running.is_some()) {
            let (_, seen) = exec(
                &cri,
                &cri_id(&s, "escape"),
                "cat /escaped/marker; ls /escaped",
            )
            .await?;
            bail!(
                "subPath x followed the symlink out of the volume: the container sees {}: {seen:?}",
                outside.display()
            );
        }
        let (_, message) = waiting_reason(escape).context("escape waiting")?;
        ensure!(
            message.contains("subPath") && message.contains("\"x\""),
            "the reason names the subPath: {message}"
        );
        let fine = cri_id(&s, "fine");
        for (cmd, want) in [
            ("cat /sub/f", "inside\n"),
            ("cat /rel/f", "inside\n"),
            ("test -d /new && echo dir", "dir\n"),
        ] {
            let (_, out) = exec(&cri, &fine, cmd).await?;
            ensure!(out == want, "{cmd}: {out:?}");
        }
        let pod_dir = pods_dir.join(&uid);
        ensure!(
            pod_dir
                .join("volumes/kubernetes.io~empty-dir/data/made/here")
                .is_dir(),
            "the missing subPath was created inside the volume"
        );
        k.events
            .send(PodEvent::Remove {
                uid: uid.clone(),
                grace: None,
            })
            .await?;
        let deadline = std::time::Instant::now() + MIN;
        while !k.rec.terminated.lock().unwrap().contains_key(&uid) {
            ensure!(std::time::Instant::now() < deadline, "never terminated");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let left = host_mounts_under(&pods_dir);
        ensure!(left.is_empty(), "mounts left behind: {left:?}");
        ensure!(!pod_dir.exists(), "{} not removed", pod_dir.display());
        ensure!(
            Path::new(&outside).join("marker").exists(),
            "teardown touched what the link pointed at"
        );
        Ok(())
    })
}
