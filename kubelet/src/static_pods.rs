//! The static pod source: every file in `staticPodPath` (but dotfiles and
//! directories) holds one v1 Pod in YAML or JSON, as pkg/kubelet/config/file.go
//! reads them. Each pod gets the kubelet's identity (config/common.go
//! `applyDefaults`): name `<name>-<node>`, namespace `default` when unset, a
//! UID hashed from the file and the node, the `kubernetes.io/config.*`
//! annotations and a NoExecute toleration. A changed file changes the UID, so
//! an update is a kill then a create, as in the kubelet.
use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1 as api, apimachinery::pkg::apis::meta::v1::OwnerReference, jiff::Timestamp,
};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
/// Set on the mirror pod the kubelet creates in the API for a static pod.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// A static pod as the kubelet runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct StaticPod {
    pub path: PathBuf,
    /// The UID (also the config hash): a new one whenever the file changes.
    pub uid: String,
    pub namespace: String,
    /// `<name>-<node>`.
    pub name: String,
    /// The pod with its identity applied; [`crate::pod::PodSpec::from_api`] it.
    pub pod: api::Pod,
}

/// Why one file yielded no pod. Other files are unaffected.
#[derive(Debug, thiserror::Error)]
pub enum StaticPodError {
    #[error("{}: cannot read: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: not valid YAML or JSON: {first_line}", path.display())]
    Syntax { path: PathBuf, first_line: String },
    #[error("{}: {field}: {error}", path.display())]
    Decode {
        path: PathBuf,
        field: String,
        error: serde_json::Error,
    },
    #[error("{}: {api_version}/{kind} is not a v1 Pod", path.display())]
    NotAPod {
        path: PathBuf,
        api_version: String,
        kind: String,
    },
    #[error("{}: metadata.name: is required", path.display())]
    NoName { path: PathBuf },
    /// An identifier that names directories (pod, logs) or cgroups is not
    /// what the API server would accept.
    #[error("{}: {field}: {value:?} is invalid: {reason}", path.display())]
    Invalid {
        path: PathBuf,
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("{}: pod {namespace}/{name} is already defined by {}", path.display(), other.display())]
    Duplicate {
        path: PathBuf,
        namespace: String,
        name: String,
        other: PathBuf,
    },
}

impl StaticPodError {
    pub fn path(&self) -> &Path {
        match self {
            Self::Read { path, .. }
            | Self::Syntax { path, .. }
            | Self::Decode { path, .. }
            | Self::NotAPod { path, .. }
            | Self::NoName { path }
            | Self::Invalid { path, .. }
            | Self::Duplicate { path, .. } => path,
        }
    }
}

/// Parses a manifest as the kubelet's YAML reader (YAML 1.1) would: `0644` is octal.
pub(crate) fn parse_manifest_value(text: &str) -> Result<serde_json::Value, String> {
    if text.trim_start().starts_with('{')
        && let Ok(v) = serde_json::from_str(text)
    {
        return Ok(v);
    }
    let options = serde_saphyr::options! { legacy_octal_numbers: true };
    serde_saphyr::from_str_with_options(text, options)
        .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_owned())
}

/// Reads one file into a static pod for `node`.
pub fn load_file(path: &Path, node: &str, seen: Timestamp) -> Result<StaticPod, StaticPodError> {
    let bytes = std::fs::read(path).map_err(|source| StaticPodError::Read {
        path: path.to_owned(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let doc = parse_manifest_value(&text).map_err(|first_line| StaticPodError::Syntax {
        path: path.to_owned(),
        first_line,
    })?;
    let text_of = |k: &str| doc.get(k).and_then(|v| v.as_str()).unwrap_or("").to_owned();
    let (api_version, kind) = (text_of("apiVersion"), text_of("kind"));
    if api_version != "v1" || kind != "Pod" {
        return Err(StaticPodError::NotAPod {
            path: path.to_owned(),
            api_version,
            kind,
        });
    }
    let mut pod: api::Pod =
        serde_path_to_error::deserialize(doc).map_err(|e| StaticPodError::Decode {
            path: path.to_owned(),
            field: e.path().to_string(),
            error: e.into_inner(),
        })?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(StaticPodError::NoName {
            path: path.to_owned(),
        });
    }
    let node = node.to_lowercase();
    let uid = match pod.metadata.uid.clone().filter(|u| !u.is_empty()) {
        Some(u) => u,
        None => {
            let mut h = Sha256::new();
            h.update(&bytes);
            h.update(format!("host:{node}").as_bytes());
            h.update(format!("file:{}", path.display()).as_bytes());
            // 32 hex digits, the length of the kubelet's md5 UIDs.
            h.finalize()[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        }
    };
    let name = format!("{name}-{node}");
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    check_identity(path, &uid, &namespace, &name)?;
    let meta = &mut pod.metadata;
    meta.uid = Some(uid.clone());
    meta.name = Some(name.clone());
    meta.namespace = Some(namespace.clone());
    let annotations = meta.annotations.get_or_insert_default();
    annotations.insert(CONFIG_HASH.to_owned(), uid.clone());
    annotations.insert(CONFIG_SOURCE.to_owned(), "file".to_owned());
    annotations.insert(CONFIG_SEEN.to_owned(), seen.to_string());
    let spec = pod.spec.get_or_insert_default();
    spec.node_name = Some(node);
    // Static pods must survive node problems: nothing evicts them.
    let tolerations = spec.tolerations.get_or_insert_default();
    let toleration = api::Toleration {
        operator: Some("Exists".to_owned()),
        effect: Some("NoExecute".to_owned()),
        ..Default::default()
    };
    if !tolerations.contains(&toleration) {
        tolerations.push(toleration);
    }
    Ok(StaticPod {
        path: path.to_owned(),
        uid,
        namespace,
        name,
        pod,
    })
}

/// The API server validates API pods' identity; a static pod's comes from a
/// file, and its UID, namespace and name become directory names (pod
/// directory, log directory) and a cgroup: each must be what the API would
/// accept, or `uid: ../../..` makes teardown remove `/`.
fn check_identity(
    path: &Path,
    uid: &str,
    namespace: &str,
    name: &str,
) -> Result<(), StaticPodError> {
    let invalid = |field, value: &str, reason| StaticPodError::Invalid {
        path: path.to_owned(),
        field,
        value: value.to_owned(),
        reason,
    };
    if let Err(e) = crate::safe_path::uid(uid) {
        return Err(invalid("metadata.uid", uid, e.reason));
    }
    if !crate::config::is_dns_label(namespace) {
        return Err(invalid(
            "metadata.namespace",
            namespace,
            "must be a DNS label",
        ));
    }
    if !crate::config::is_dns_subdomain(name) {
        // The name the kubelet gives it, `<name>-<node>`.
        return Err(invalid("metadata.name", name, "must be a DNS subdomain"));
    }
    Ok(())
}

/// The mirror pod to create in the API for a static pod
/// (pkg/kubelet/pod/mirror_client.go `CreateMirrorPod`): the same pod,
/// annotated with its config hash and owned by the Node, so it disappears with
/// it. The UID is the API server's to assign.
pub fn mirror_pod(p: &StaticPod, node_name: &str, node_uid: &str) -> api::Pod {
    let mut pod = p.pod.clone();
    pod.metadata.uid = None;
    pod.metadata.resource_version = None;
    pod.metadata
        .annotations
        .get_or_insert_default()
        .insert(CONFIG_MIRROR.to_owned(), p.uid.clone());
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: node_name.to_owned(),
        uid: node_uid.to_owned(),
        controller: Some(true),
        ..Default::default()
    }]);
    pod.status = None;
    pod
}

/// Whether `mirror` (read from the API) mirrors this version of the static
/// pod; a stale one (an older file, a deleted one being recreated) must be
/// replaced.
pub fn is_mirror_of(mirror: &api::Pod, p: &StaticPod) -> bool {
    mirror.metadata.deletion_timestamp.is_none()
        && mirror.metadata.namespace.as_deref() == Some(p.namespace.as_str())
        && mirror.metadata.name.as_deref() == Some(p.name.as_str())
        && mirror
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CONFIG_MIRROR))
            == Some(&p.uid)
}

/// Pods added, replaced and removed between two scans, keyed by full name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diff {
    pub added: Vec<StaticPod>,
    /// `(old, new)`: kill the old pod, then create the new one.
    pub updated: Vec<(StaticPod, StaticPod)>,
    pub removed: Vec<StaticPod>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.updated.is_empty() && self.removed.is_empty()
    }
}

type Key = (String, String);

fn by_name<'a>(pods: impl IntoIterator<Item = &'a StaticPod>) -> BTreeMap<Key, &'a StaticPod> {
    pods.into_iter()
        .map(|p| ((p.namespace.clone(), p.name.clone()), p))
        .collect()
}

/// What changed from `old` to `new`. A pod whose UID (content) changed is an update.
pub fn diff<'a>(
    old: impl IntoIterator<Item = &'a StaticPod>,
    new: impl IntoIterator<Item = &'a StaticPod>,
) -> Diff {
    let (old, new) = (by_name(old), by_name(new));
    let mut d = Diff::default();
    for (k, n) in &new {
        match old.get(k) {
            None => d.added.push((*n).clone()),
            Some(o) if o.uid != n.uid => d.updated.push(((*o).clone(), (*n).clone())),
            Some(_) => {}
        }
    }
    d.removed = old
        .iter()
        .filter(|(k, _)| !new.contains_key(*k))
        .map(|(_, o)| (*o).clone())
        .collect();
    d
}

/// One scan's outcome.
#[derive(Debug, Default)]
pub struct Update {
    pub diff: Diff,
    /// Every file that yields no pod right now.
    pub errors: Vec<StaticPodError>,
}

/// The static pods of one directory, across scans.
#[derive(Debug)]
pub struct StaticPodSource {
    dir: PathBuf,
    node: String,
    /// By file.
    pods: BTreeMap<PathBuf, StaticPod>,
    last_errors: Vec<String>,
    /// Directory scans so far; shared so a test can see `watch` stay idle.
    scans: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl StaticPodSource {
    pub fn new(dir: impl Into<PathBuf>, node: &str) -> Self {
        Self {
            dir: dir.into(),
            node: node.to_owned(),
            pods: BTreeMap::new(),
            last_errors: Vec::new(),
            scans: std::sync::Arc::default(),
        }
    }

    pub fn pods(&self) -> impl Iterator<Item = &StaticPod> {
        self.pods.values()
    }

    /// Re-reads the directory. A file that no longer parses keeps its last
    /// good pod (an editor's half-written save must not kill it) and is
    /// reported; a removed file removes its pod. A missing directory holds no
    /// pods, as in the kubelet.
    /// How many scans this source has made, readable after it moved into [`watch`].
    pub fn scan_counter(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.scans.clone()
    }

    pub fn rescan(&mut self, now: Timestamp) -> io::Result<Update> {
        self.scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.is_file()))
                .map(|e| e.path())
                .collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        files.sort();
        let mut next: BTreeMap<PathBuf, StaticPod> = BTreeMap::new();
        let mut errors = Vec::new();
        let mut owners: BTreeMap<Key, PathBuf> = BTreeMap::new();
        for path in files {
            let pod = match load_file(&path, &self.node, now) {
                Ok(mut p) => {
                    // Unchanged: keep the time it was first seen.
                    if let Some(old) = self.pods.get(&path).filter(|o| o.uid == p.uid) {
                        p = old.clone();
                    }
                    p
                }
                Err(e) => {
                    errors.push(e);
                    match self.pods.get(&path) {
                        Some(old) => old.clone(),
                        None => continue,
                    }
                }
            };
            let key = (pod.namespace.clone(), pod.name.clone());
            if let Some(other) = owners.get(&key) {
                errors.push(StaticPodError::Duplicate {
                    path,
                    namespace: key.0,
                    name: key.1,
                    other: other.clone(),
                });
                continue;
            }
            owners.insert(key, path.clone());
            next.insert(path, pod);
        }
        let d = diff(self.pods.values(), next.values());
        self.pods = next;
        self.last_errors = errors.iter().map(ToString::to_string).collect();
        Ok(Update { diff: d, errors })
    }
}

/// What to wait for after an inotify event before rescanning: an editor's
/// save is several events within microseconds.
const DEBOUNCE: Duration = Duration::from_millis(100);

type Events = mpsc::UnboundedReceiver<notify::Result<notify::Event>>;

fn start_watch(dir: &Path) -> Option<(notify::RecommendedWatcher, Events)> {
    use notify::{RecursiveMode, Watcher as _};
    let (tx, rx) = mpsc::unbounded_channel();
    let mut w = notify::recommended_watcher(move |ev| {
        let _ = tx.send(ev);
    })
    .ok()?;
    w.watch(dir, RecursiveMode::NonRecursive).ok()?;
    Some((w, rx))
}

/// Scans `source` now, then every `every` and on inotify events, sending
/// each update that changes pods or errors (the first always). Returns when
/// the receiver is gone. Without inotify (the directory does not exist yet)
/// the periodic rescan still works, and the watch starts once it appears.
pub async fn watch(mut source: StaticPodSource, every: Duration, tx: mpsc::Sender<Update>) {
    let mut watch = start_watch(&source.dir);
    let mut first = true;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let before = source.last_errors.clone();
        if let Ok(update) = source.rescan(crate::pod::timestamp_now())
            && (first || !update.diff.is_empty() || source.last_errors != before)
        {
            first = false;
            if tx.send(update).await.is_err() {
                return;
            }
        }
        if watch.is_none() {
            watch = start_watch(&source.dir);
        }
        // Wait for a reason to scan again: the period, or an event that is
        // not our own reads echoing back. Rescanning on those echoes would
        // read the files again and raise more of them: a loop burning a core.
        loop {
            tokio::select! {
                _ = tick.tick() => break,
                ev = async { watch.as_mut().expect("guarded").1.recv().await }, if watch.is_some() => {
                    match ev {
                        None => {
                            watch = None;
                            break;
                        }
                        Some(ev) if matters(&ev) => {
                            tokio::time::sleep(DEBOUNCE).await;
                            if let Some((_, rx)) = watch.as_mut() {
                                while rx.try_recv().is_ok() {}
                            }
                            break;
                        }
                        Some(_) => {}
                    }
                }
                () = tx.closed() => return,
            }
        }
    }
}

/// Our own reads come back as access events; only a writer closing a file
/// (or anything that is not an access) says something changed.
fn matters(ev: &notify::Result<notify::Event>) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    match ev {
        Ok(ev) => {
            !matches!(ev.kind, EventKind::Access(_))
                || ev.kind == EventKind::Access(AccessKind::Close(AccessMode::Write))
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests;
