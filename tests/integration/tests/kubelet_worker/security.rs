//! Security contexts on a real containerd, checked from inside the
//! container: a "restricted" Pod Security Standard pod runs as non-root with
//! no_new_privs, seccomp RuntimeDefault, no capabilities, a read-only root,
//! a masked /proc and its emptyDir owned by the fsGroup; `runAsNonRoot`
//! against the image's user refuses root images, `runAsUser: 0` and
//! non-numeric image users with CreateContainerConfigError, and accepts an
//! image whose user is a non-zero uid.
use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context as _, Result, ensure};
use serde_json::json;
use weir_integration::{containerd::Containerd, images};
use weir_kubelet::{
    cri::{ContainerFilter, CriRuntime, Runtime as _},
    worker::POD_UID_LABEL,
};

use super::support::*;

const MIN: Duration = Duration::from_secs(60);
/// busybox whose image config says `USER nobody` / `USER 65534`.
const NAMED_USER: &str = "weir.test/busybox-named-user:1";
const NUMERIC_USER: &str = "weir.test/busybox-numeric-user:1";

fn waiting(s: &k8s_openapi::api::core::v1::PodStatus, name: &str) -> Option<(String, String)> {
    let w = s
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?;
    Some((
        w.reason.clone().unwrap_or_default(),
        w.message.clone().unwrap_or_default(),
    ))
}

/// One `/proc/<pid>/status` field, e.g. `NoNewPrivs`.
fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

async fn containers_of(cri: &CriRuntime, uid: &str) -> Result<usize> {
    let f = ContainerFilter {
        labels: BTreeMap::from([(POD_UID_LABEL.to_owned(), uid.to_owned())]),
        ..Default::default()
    };
    Ok(cri.list_containers(&f).await?.len())
}

async fn restricted_pod(k: &Kubelet, cri: &CriRuntime) -> Result<()> {
    let p = pod(
        "restricted",
        json!({
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
                "fsGroup": 2000, "supplementalGroups": [3000],
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{
                "name": "c", "image": images::BUSYBOX,
                "command": sh("exec sleep 1000"),
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": true,
                },
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
        }),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let s = k
        .rec
        .wait(&uid, MIN, "Running", |s| phase(s) == "Running")
        .await?;
    let id = cri_id(&s, "c");
    // The exec'd shell (`self`) and the container's own process (PID 1 of
    // its PID namespace) alike.
    for who in ["self", "1"] {
        let (_, st) = exec(cri, &id, &format!("cat /proc/{who}/status")).await?;
        for (field, want) in [
            ("NoNewPrivs", "1"),
            // 2: SECCOMP_MODE_FILTER, containerd's RuntimeDefault profile.
            ("Seccomp", "2"),
            ("CapEff", "0000000000000000"),
            ("CapPrm", "0000000000000000"),
            ("CapBnd", "0000000000000000"),
        ] {
            ensure!(
                status_field(&st, field) == Some(want),
                "/proc/{who}/status {field}: {:?}, want {want}\n{st}",
                status_field(&st, field)
            );
        }
    }
    let (_, id_out) = exec(cri, &id, "id").await?;
    let groups: Vec<&str> = id_out
        .split_once("groups=")
        .map(|(_, g)| g.trim().split(',').collect())
        .unwrap_or_default();
    let gid_of = |g: &&str| g.split('(').next().unwrap_or_default().to_owned();
    let groups: Vec<String> = groups.iter().map(gid_of).collect();
    ensure!(
        id_out.starts_with("uid=65534") && id_out.contains(" gid=65534"),
        "id: {id_out}"
    );
    ensure!(
        groups.contains(&"2000".to_owned())
            && groups.contains(&"3000".to_owned())
            && !groups.contains(&"0".to_owned()),
        "fsGroup and supplementalGroups: id says {id_out}"
    );
    let (code, _) = exec(cri, &id, "touch /root-write 2>/dev/null").await?;
    ensure!(code != 0, "readOnlyRootFilesystem: / is writable");
    // The emptyDir belongs to the fsGroup (setgid): uid 65534 writes there,
    // and what it writes gets the group.
    let (code, out) = exec(cri, &id, "touch /data/f && stat -c '%g %a' /data /data/f").await?;
    ensure!(code == 0, "cannot write the fsGroup's emptyDir: {out}");
    let lines: Vec<&str> = out.lines().collect();
    ensure!(
        lines.first().is_some_and(|l| l.starts_with("2000 2"))
            && lines.get(1).is_some_and(|l| l.starts_with("2000 ")),
        "emptyDir ownership (gid mode): {out:?}"
    );
    // procMount Default: /proc/keys masked (runc masks what exists; this
    // kernel has no /proc/kcore), /proc/sys read-only.
    let (_, mounts) = exec(cri, &id, "cat /proc/self/mountinfo").await?;
    ensure!(
        mounts
            .lines()
            .any(|l| l.split(' ').nth(4) == Some("/proc/keys")),
        "/proc/keys not masked:\n{mounts}"
    );
    ensure!(
        mounts.lines().any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.get(4) == Some(&"/proc/sys") && f.get(5).is_some_and(|o| o.starts_with("ro"))
        }),
        "/proc/sys not read-only:\n{mounts}"
    );
    Ok(())
}

/// `runAsNonRoot` refusals: each container waits with
/// CreateContainerConfigError and the kubelet's message, and nothing is
/// created for it in the runtime.
async fn run_as_non_root_refusals(k: &Kubelet, cri: &CriRuntime) -> Result<()> {
    let cases = [
        (
            "root-image",
            json!({"runAsNonRoot": true}),
            images::BUSYBOX,
            "container has runAsNonRoot and image will run as root",
        ),
        (
            "uid-zero",
            json!({"runAsNonRoot": true, "runAsUser": 0}),
            images::BUSYBOX,
            "container's runAsUser breaks non-root policy",
        ),
        (
            "named-user",
            json!({"runAsNonRoot": true}),
            NAMED_USER,
            "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root",
        ),
    ];
    for (name, sc, image, want) in cases {
        let p = pod(
            name,
            json!({"containers": [{"name": "c", "image": image,
                   "imagePullPolicy": "Never",
                   "command": sh("exec sleep 1000"), "securityContext": sc}]}),
        );
        let uid = uid_of(&p);
        k.events.send(upsert(&p)).await?;
        let s = k
            .rec
            .wait(&uid, MIN, "CreateContainerConfigError", |s| {
                waiting(s, "c").is_some_and(|(r, _)| r == "CreateContainerConfigError")
            })
            .await?;
        let (_, message) = waiting(&s, "c").context("waiting")?;
        ensure!(
            message.starts_with(want) && message.contains(&format!("{name}_default(")),
            "{name}: message {message:?}, want {want:?}"
        );
        ensure!(phase(&s) == "Pending", "{name}: {s:?}");
        ensure!(
            containers_of(cri, &uid).await? == 0,
            "{name}: a container was created"
        );
    }
    Ok(())
}

/// An image whose user is a non-zero uid passes `runAsNonRoot` without a
/// `runAsUser`, and runs as that uid.
async fn image_uid_passes(k: &Kubelet, cri: &CriRuntime) -> Result<()> {
    let p = pod(
        "image-uid",
        json!({"securityContext": {"runAsNonRoot": true},
               "containers": [{"name": "c", "image": NUMERIC_USER,
                   "imagePullPolicy": "Never", "command": sh("exec sleep 1000")}]}),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let s = k
        .rec
        .wait(&uid, MIN, "Running", |s| phase(s) == "Running")
        .await?;
    let (_, id_u) = exec(cri, &cri_id(&s, "c"), "id -u").await?;
    ensure!(id_u.trim() == "65534", "id -u: {id_u:?}");
    Ok(())
}

/// `procMount: Unmasked` needs a user namespace (`hostUsers: false`), which
/// this kubelet refuses: the pod is invalid, as the API server would say.
async fn unmasked_proc_refused(k: &Kubelet) -> Result<()> {
    let p = pod(
        "unmasked",
        json!({"containers": [{"name": "c", "image": images::BUSYBOX,
               "securityContext": {"procMount": "Unmasked"}}]}),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let s = k
        .rec
        .wait(&uid, MIN, "CreateContainerConfigError", |s| {
            waiting(s, "c").is_some_and(|(r, _)| r == "CreateContainerConfigError")
        })
        .await?;
    let (_, message) = waiting(&s, "c").context("waiting")?;
    ensure!(
        message.contains("securityContext.procMount"),
        "message {message:?}"
    );
    Ok(())
}

#[test]
fn security_contexts_are_enforced_in_the_container() -> Result<()> {
    weir_integration::sweep::sweep();
    let ctrd = Containerd::start()?;
    let dir = ctrd.dir.join("images");
    for (name, user) in [(NAMED_USER, "nobody"), (NUMERIC_USER, "65534")] {
        let image = images::busybox_as(name, user)?;
        images::import(&ctrd.socket, ctrd.snapshotter, &dir, &image)?;
    }
    on_node(&ctrd, || async {
        let k = start_worker(&ctrd);
        let cri = ctrd.runtime();
        let r = tokio::join!(
            restricted_pod(&k, &cri),
            run_as_non_root_refusals(&k, &cri),
            image_uid_passes(&k, &cri),
            unmasked_proc_refused(&k),
        );
        let mut failed = Vec::new();
        for (name, r) in [
            ("restricted pod", r.0),
            ("runAsNonRoot refusals", r.1),
            ("image uid", r.2),
            ("procMount Unmasked", r.3),
        ] {
            match r {
                Ok(()) => eprintln!("ok: {name}"),
                Err(e) => {
                    eprintln!("FAILED: {name}: {e:#}");
                    failed.push(name);
                }
            }
        }
        ensure!(failed.is_empty(), "failed: {failed:?}");
        Ok(())
    })
}
