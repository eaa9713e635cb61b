use std::{fs, time::Duration};

use super::*;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("weir-kubelet-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        // Write then rename, as a careful editor would: never half a file.
        let tmp = self.0.join(format!(".{name}.tmp"));
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, &p).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const WEB: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: httpd\n    image: busybox\n";
const JSON: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"api","namespace":"kube-system","annotations":{"x":"y"}},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;

fn now() -> Timestamp {
    Timestamp::from_second(1_700_000_000).unwrap()
}

fn names(pods: &[StaticPod]) -> Vec<String> {
    pods.iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect()
}

#[test]
fn applies_the_kubelets_identity() {
    let dir = TempDir::new("identity");
    let path = dir.write("web.yaml", WEB);
    let p = load_file(&path, "Node-1", now()).unwrap();
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str()),
        ("default", "web-node-1")
    );
    assert_eq!(p.uid.len(), 32);
    let meta = &p.pod.metadata;
    assert_eq!(meta.uid.as_deref(), Some(p.uid.as_str()));
    let ann = meta.annotations.as_ref().unwrap();
    assert_eq!(ann[CONFIG_SOURCE], "file");
    assert_eq!(ann[CONFIG_HASH], p.uid);
    assert_eq!(ann[CONFIG_SEEN], "2023-11-14T22:13:20Z");
    let spec = p.pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("node-1"));
    assert_eq!(
        spec.tolerations.as_ref().unwrap()[0].effect.as_deref(),
        Some("NoExecute")
    );
    // Deterministic: same file, same node → same UID; another node → another.
    assert_eq!(load_file(&path, "node-1", now()).unwrap().uid, p.uid);
    assert_ne!(load_file(&path, "node-2", now()).unwrap().uid, p.uid);
    // The domain conversion accepts it.
    let spec = crate::pod::PodSpec::from_api(&p.pod).unwrap();
    assert_eq!(spec.uid, p.uid);
}

#[test]
fn mirror_pods() {
    let dir = TempDir::new("mirror");
    let p = load_file(&dir.write("web.yaml", WEB), "n", now()).unwrap();
    let m = mirror_pod(&p, "n", "node-uid");
    assert_eq!(m.metadata.uid, None);
    assert_eq!(m.metadata.name.as_deref(), Some("web-n"));
    assert_eq!(
        m.metadata.annotations.as_ref().unwrap()[CONFIG_MIRROR],
        p.uid
    );
    let owner = &m.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "n", "node-uid")
    );
    assert!(is_mirror_of(&m, &p));
    let changed = load_file(
        &dir.write("web.yaml", &WEB.replace("busybox", "nginx")),
        "n",
        now(),
    )
    .unwrap();
    assert!(!is_mirror_of(&m, &changed), "stale after the file changed");
    let mut deleting = m.clone();
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    assert!(!is_mirror_of(&deleting, &p));
}

#[test]
fn json_manifests_and_explicit_uids() {
    let dir = TempDir::new("json");
    let p = load_file(&dir.write("api.json", JSON), "n", now()).unwrap();
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str()),
        ("kube-system", "api-n")
    );
    assert_eq!(p.pod.metadata.annotations.as_ref().unwrap()["x"], "y");
    let with_uid = WEB.replace("  name: web\n", "  name: web\n  uid: fixed\n");
    assert_eq!(
        load_file(&dir.write("u.yaml", &with_uid), "n", now())
            .unwrap()
            .uid,
        "fixed"
    );
}

#[test]
fn yaml_octal_modes_are_octal() {
    let dir = TempDir::new("octal");
    let text =
        format!("{WEB}  volumes:\n  - name: s\n    secret: {{secretName: s, defaultMode: 0400}}\n");
    let p = load_file(&dir.write("o.yaml", &text), "n", now()).unwrap();
    let vol = &p.pod.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0];
    assert_eq!(vol.secret.as_ref().unwrap().default_mode, Some(0o400));
}

#[test]
fn per_file_errors_name_the_file() {
    let dir = TempDir::new("errors");
    let bad = dir.write("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: [\n");
    let e = load_file(&bad, "n", now()).unwrap_err();
    assert!(matches!(e, StaticPodError::Syntax { .. }));
    assert!(e.to_string().starts_with(&bad.display().to_string()), "{e}");
    let svc = dir.write(
        "svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
    );
    assert_eq!(
        load_file(&svc, "n", now()).unwrap_err().to_string(),
        format!("{}: v1/Service is not a v1 Pod", svc.display())
    );
    let typo = dir.write(
        "typo.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: t}\nspec: {containers: 3}\n",
    );
    let e = load_file(&typo, "n", now()).unwrap_err().to_string();
    assert!(e.contains("spec.containers: invalid type"), "{e}");
    let anon = dir.write("anon.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {}\n");
    assert!(matches!(
        load_file(&anon, "n", now()),
        Err(StaticPodError::NoName { .. })
    ));
}

#[test]
fn scans_diff_and_keep_good_pods() {
    let dir = TempDir::new("scan");
    dir.write("web.yaml", WEB);
    dir.write("api.json", JSON);
    dir.write(".hidden.yaml", &WEB.replace("web", "hidden"));
    fs::create_dir(dir.0.join("sub")).unwrap();
    dir.write("broken.yaml", "{{{");
    let mut src = StaticPodSource::new(&dir.0, "n");
    let u = src.rescan(now()).unwrap();
    assert_eq!(names(&u.diff.added), ["default/web-n", "kube-system/api-n"]);
    assert!(u.diff.updated.is_empty() && u.diff.removed.is_empty());
    assert_eq!(u.errors.len(), 1);
    assert!(u.errors[0].path().ends_with("broken.yaml"));

    // Nothing changed: empty diff, and the seen time stays the first one.
    let later = Timestamp::from_second(1_800_000_000).unwrap();
    let u = src.rescan(later).unwrap();
    assert!(u.diff.is_empty());
    let web = src.pods().find(|p| p.name == "web-n").unwrap();
    assert_eq!(
        web.pod.metadata.annotations.as_ref().unwrap()[CONFIG_SEEN],
        "2023-11-14T22:13:20Z"
    );
    let old_uid = web.uid.clone();

    // A changed file: an update with a new UID (kill, then recreate).
    dir.write("web.yaml", &WEB.replace("busybox", "busybox:1.36"));
    let u = src.rescan(later).unwrap();
    assert_eq!(u.diff.updated.len(), 1);
    let (old, new) = &u.diff.updated[0];
    assert_eq!(old.uid, old_uid);
    assert_ne!(new.uid, old_uid);

    // A file that breaks keeps its last good pod; the others are untouched.
    dir.write("web.yaml", "apiVersion: v1\nkind: Pod\nmetadata: [");
    let u = src.rescan(later).unwrap();
    assert!(u.diff.is_empty());
    assert_eq!(u.errors.len(), 2);
    assert_eq!(src.pods().count(), 2);

    // A removed file removes its pod.
    fs::remove_file(dir.0.join("api.json")).unwrap();
    let u = src.rescan(later).unwrap();
    assert_eq!(names(&u.diff.removed), ["kube-system/api-n"]);
}

#[test]
fn duplicate_names_keep_the_first_file() {
    let dir = TempDir::new("dup");
    dir.write("a.yaml", WEB);
    dir.write("b.yaml", &WEB.replace("httpd", "other"));
    let mut src = StaticPodSource::new(&dir.0, "n");
    let u = src.rescan(now()).unwrap();
    assert_eq!(u.diff.added.len(), 1);
    assert!(u.diff.added[0].path.ends_with("a.yaml"));
    assert!(
        matches!(&u.errors[0], StaticPodError::Duplicate { other, .. } if other.ends_with("a.yaml"))
    );
}

#[test]
fn missing_directory_has_no_pods() {
    let mut src = StaticPodSource::new("/nonexistent/weir-kubelet-test", "n");
    let u = src.rescan(now()).unwrap();
    assert!(u.diff.is_empty() && u.errors.is_empty());
}

#[test]
fn diff_by_full_name() {
    let dir = TempDir::new("diff");
    let a = load_file(&dir.write("a.yaml", WEB), "n", now()).unwrap();
    let b = load_file(&dir.write("b.yaml", JSON), "n", now()).unwrap();
    let a2 = load_file(
        &dir.write("a.yaml", &WEB.replace("busybox", "nginx")),
        "n",
        now(),
    )
    .unwrap();
    let d = diff([&a, &b], [&a2]);
    assert_eq!(names(&d.removed), ["kube-system/api-n"]);
    assert_eq!(d.updated.len(), 1);
    assert!(diff([&a], [&a]).is_empty());
    assert_eq!(names(&diff([], [&a]).added), ["default/web-n"]);
}

async fn next(rx: &mut mpsc::Receiver<Update>) -> Update {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an update within 10 s")
        .expect("watcher running")
}

#[tokio::test]
async fn watcher_reacts_to_inotify_and_rescans() {
    let dir = TempDir::new("watch");
    dir.write("web.yaml", WEB);
    let (tx, mut rx) = mpsc::channel(8);
    // A long period: anything quick below comes from inotify.
    let task = tokio::spawn(watch(
        StaticPodSource::new(&dir.0, "n"),
        Duration::from_secs(3600),
        tx,
    ));
    let first = next(&mut rx).await;
    assert_eq!(names(&first.diff.added), ["default/web-n"]);

    dir.write("api.json", JSON);
    let u = next(&mut rx).await;
    assert_eq!(names(&u.diff.added), ["kube-system/api-n"]);

    fs::remove_file(dir.0.join("web.yaml")).unwrap();
    let u = next(&mut rx).await;
    assert_eq!(names(&u.diff.removed), ["default/web-n"]);

    // A new error is reported even though no pod changed.
    dir.write("bad.yaml", "{{{");
    let u = next(&mut rx).await;
    assert!(u.diff.is_empty());
    assert_eq!(u.errors.len(), 1);

    drop(rx);
    dir.write("more.yaml", &WEB.replace("web", "more"));
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn watcher_rescans_periodically_without_inotify() {
    let base = TempDir::new("late");
    let dir = base.0.join("manifests");
    let (tx, mut rx) = mpsc::channel(8);
    let _task = tokio::spawn(watch(
        StaticPodSource::new(&dir, "n"),
        Duration::from_millis(200),
        tx,
    ));
    let first = next(&mut rx).await;
    assert!(first.diff.is_empty());
    // The directory appears later: the periodic scan finds it.
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("web.yaml"), WEB).unwrap();
    let u = next(&mut rx).await;
    assert_eq!(names(&u.diff.added), ["default/web-n"]);
}

#[tokio::test]
async fn watcher_stays_idle_when_nothing_changes() {
    // Our own reads of the files come back as inotify access events; a
    // watcher that rescans on them never stops reading (it once burnt a
    // whole core with no pods at all).
    let dir = TempDir::new("idle");
    dir.write("web.yaml", WEB);
    dir.write("api.json", JSON);
    let source = StaticPodSource::new(&dir.0, "n");
    let scans = source.scan_counter();
    let (tx, mut rx) = mpsc::channel(8);
    let _task = tokio::spawn(watch(source, Duration::from_secs(3600), tx));
    next(&mut rx).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let n = scans.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n <= 2, "{n} scans in 1.5 s with nothing changing");
}

/// Issue 12 item 1: every identifier of a static pod that becomes a path (the
/// UID names the pod directory teardown removes; namespace, name and UID name
/// the log directory) is refused with its file and field, so a manifest with
/// `uid: ../../..` never reaches the worker.
#[test]
fn identifiers_that_would_escape_a_directory_are_refused() {
    let dir = TempDir::new("escape");
    let with_meta = |meta: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{{meta}}}\nspec:\n  containers: [{{name: c, image: i}}]\n"
        )
    };
    for (file, meta, field) in [
        ("uid.yaml", "name: web, uid: ../../..", "metadata.uid"),
        ("uid2.yaml", "name: web, uid: a/b", "metadata.uid"),
        ("name.yaml", "name: ../web", "metadata.name"),
        ("name2.yaml", "name: Web_1", "metadata.name"),
        (
            "ns.yaml",
            "name: web, namespace: ../..",
            "metadata.namespace",
        ),
        (
            "ns2.yaml",
            "name: web, namespace: a.b",
            "metadata.namespace",
        ),
    ] {
        let path = dir.write(file, &with_meta(meta));
        match load_file(&path, "node1", now()) {
            Ok(p) => panic!(
                "{file}: accepted as {}/{} uid {:?}",
                p.namespace, p.name, p.uid
            ),
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains(field), "{file}: {text}");
                assert_eq!(e.path(), path, "{file}: names the file");
            }
        }
    }
    // What the API allows still loads.
    let ok = dir.write(
        "ok.yaml",
        &with_meta("name: etcd.main, namespace: kube-system, uid: 0f4e9c1a-5c5b"),
    );
    let p = load_file(&ok, "node1", now()).unwrap();
    assert_eq!(
        (p.name.as_str(), p.uid.as_str()),
        ("etcd.main-node1", "0f4e9c1a-5c5b")
    );
}
