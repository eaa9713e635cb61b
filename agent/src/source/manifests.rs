//! Standalone source: a directory of Service and EndpointSlice manifests, the way
//! the kubelet runs static pods from `staticPodPath`.
//!
//! Files ending in `.yaml`, `.yml` or `.json` (not starting with a dot) are read;
//! YAML may hold several documents and `kind: List`. Bad input never costs other
//! objects their state: a file that does not parse keeps its previous objects,
//! and an object that fails validation keeps its previous version.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::SourceMsg;
use crate::{
    k8s::{self, SliceOutcome},
    model::{ServiceId, ServiceSpec, SliceId, SliceSpec},
    store::Change,
};

/// How long to wait for more events after a change, so an editor's
/// write-then-rename lands as one update.
const DEBOUNCE: Duration = Duration::from_millis(30);
/// Rescan even without events, as the kubelet does for static pods, in case an
/// event was lost.
const RESCAN: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    Service,
    EndpointSlice,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct ObjRef {
    kind: Kind,
    namespace: String,
    name: String,
}

impl fmt::Display for ObjRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
        };
        write!(f, "{kind}/{}/{}", self.namespace, self.name)
    }
}

/// An object as one file defines it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Object {
    Service(ServiceSpec),
    Slice(SliceSpec),
    /// A valid slice the datapath does not use: defined, but contributes nothing.
    IgnoredSlice,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    ino: u64,
}

#[derive(Debug, Default)]
struct FileState {
    stamp: Option<Stamp>,
    objects: BTreeMap<ObjRef, Object>,
}

/// The parsed contents of a manifest directory.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
}

impl ManifestDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
        }
    }

    /// Reads files that are new or changed since the last scan and forgets
    /// removed ones; returns the resulting changes to effective objects.
    pub fn scan(&mut self) -> std::io::Result<Vec<Change>> {
        let mut present = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            if !is_manifest(&path) {
                continue;
            }
            if let Ok(meta) = entry.metadata()
                && meta.is_file()
            {
                use std::os::unix::fs::MetadataExt as _;
                let stamp = Stamp {
                    modified: meta.modified().ok(),
                    len: meta.len(),
                    ino: meta.ino(),
                };
                present.insert(path, stamp);
            }
        }

        // Only objects of files that changed can change; resolve just those.
        let mut touched: BTreeSet<ObjRef> = BTreeSet::new();
        let mut changed_files = Vec::new();
        for (path, state) in &self.files {
            if present.get(path) != state.stamp.as_ref() {
                touched.extend(state.objects.keys().cloned());
                changed_files.push(path.clone());
            }
        }
        changed_files.extend(
            present
                .keys()
                .filter(|p| !self.files.contains_key(*p))
                .cloned(),
        );
        if changed_files.is_empty() {
            return Ok(Vec::new());
        }
        let before = self.effective(&touched);
        for path in changed_files {
            let Some(stamp) = present.remove(&path) else {
                info!(file = %path.display(), "manifest removed");
                self.files.remove(&path);
                continue;
            };
            let state = self.files.entry(path.clone()).or_default();
            state.stamp = Some(stamp);
            if let Some(objects) = load_file(&path, &state.objects) {
                state.objects = objects;
            }
            touched.extend(state.objects.keys().cloned());
        }
        let after = self.effective(&touched);
        Ok(diff(&before, &after))
    }

    /// Each of `refs` as the first file (in path order) that defines it says.
    fn effective(&self, refs: &BTreeSet<ObjRef>) -> BTreeMap<ObjRef, Object> {
        let mut out: BTreeMap<ObjRef, Object> = BTreeMap::new();
        for r in refs {
            let mut defs = self
                .files
                .iter()
                .filter_map(|(p, s)| s.objects.get(r).map(|o| (p, o)));
            let Some((_, first)) = defs.next() else {
                continue;
            };
            if let Some((path, _)) = defs.next() {
                warn!(file = %path.display(), object = %r, "defined in more than one file; the first file in name order wins");
            }
            out.insert(r.clone(), first.clone());
        }
        out
    }
}

fn is_manifest(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    !name.starts_with('.')
        && matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        )
}

fn diff(before: &BTreeMap<ObjRef, Object>, after: &BTreeMap<ObjRef, Object>) -> Vec<Change> {
    let mut changes = Vec::new();
    for (r, old) in before {
        let gone = matches!(after.get(r), None | Some(Object::IgnoredSlice));
        if gone && !matches!(old, Object::IgnoredSlice) {
            changes.push(delete(r));
        }
    }
    for (r, new) in after {
        if before.get(r) == Some(new) {
            continue;
        }
        match new {
            Object::Service(s) => changes.push(Change::UpsertService(s.clone())),
            Object::Slice(s) => changes.push(Change::UpsertSlice(s.clone())),
            Object::IgnoredSlice => {}
        }
    }
    changes
}

fn delete(r: &ObjRef) -> Change {
    match r.kind {
        Kind::Service => Change::DeleteService(ServiceId::new(&r.namespace, &r.name)),
        Kind::EndpointSlice => Change::DeleteSlice(SliceId {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        }),
    }
}

/// Parses one file. `None` when it cannot be read or parsed at all, in which case
/// the caller keeps the file's previous objects.
fn load_file(path: &Path, previous: &BTreeMap<ObjRef, Object>) -> Option<BTreeMap<ObjRef, Object>> {
    let file = path.display();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            error!(%file, "cannot read manifest, keeping its previous objects: {e}");
            return None;
        }
    };
    let docs: Vec<Value> = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str::<Value>(&text)
            .map(|v| vec![v])
            .map_err(|e| e.to_string())
    } else {
        // The parser renders a source snippet below its first line; one log
        // line per problem is what log pipelines expect.
        serde_saphyr::from_multiple::<Value>(&text)
            .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_owned())
    }
    .inspect_err(|e| error!(%file, "not valid YAML or JSON, keeping its previous objects: {e}"))
    .ok()?;

    let mut objects = BTreeMap::new();
    let mut queue: Vec<(String, Value)> = docs
        .into_iter()
        .enumerate()
        .map(|(i, d)| (format!("document {i}"), d))
        .collect();
    queue.reverse();
    while let Some((at, doc)) = queue.pop() {
        if doc.is_null() {
            continue;
        }
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let api = doc
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if kind == "List" || kind.ends_with("List") {
            if let Some(Value::Array(items)) = doc.get("items") {
                for (j, item) in items.iter().enumerate().rev() {
                    queue.push((format!("{at} items[{j}]"), item.clone()));
                }
            }
            continue;
        }
        let kind = match (api.as_str(), kind.as_str()) {
            ("v1", "Service") => Kind::Service,
            ("discovery.k8s.io/v1", "EndpointSlice") => Kind::EndpointSlice,
            _ => {
                warn!(%file, %at, "unsupported object {api}/{kind}; only v1 Service and discovery.k8s.io/v1 EndpointSlice are read");
                continue;
            }
        };
        let meta = doc.get("metadata");
        let field = |f: &str| {
            meta.and_then(|m| m.get(f))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let name = field("name");
        let r = name.map(|name| ObjRef {
            kind,
            namespace: field("namespace").unwrap_or_else(|| "default".to_owned()),
            name,
        });
        let object = match kind {
            Kind::Service => typed::<Service>(doc).and_then(|s| {
                k8s::service(&s).map_err(|e| e.to_string()).map(|c| {
                    for w in c.warnings {
                        warn!(%file, object = %ObjRef { kind, namespace: c.value.id.namespace.clone(), name: c.value.id.name.clone() }, "{w}");
                    }
                    Object::Service(c.value)
                })
            }),
            Kind::EndpointSlice => typed::<EndpointSlice>(doc).and_then(|s| {
                match k8s::slice(&s).map_err(|e| e.to_string())? {
                    SliceOutcome::Ipv4(c) => {
                        for w in c.warnings {
                            warn!(%file, object = %ObjRef { kind, namespace: c.value.id.namespace.clone(), name: c.value.id.name.clone() }, "{w}");
                        }
                        Ok(Object::Slice(c.value))
                    }
                    SliceOutcome::Ignored { reason } => {
                        let object = r.as_ref().map_or_else(|| at.clone(), ToString::to_string);
                        warn!(%file, %object, "EndpointSlice skipped: {reason}");
                        Ok(Object::IgnoredSlice)
                    }
                }
            }),
        };
        match (object, r) {
            (Ok(obj), Some(r)) => {
                objects.insert(r, obj);
            }
            (Ok(_), None) => error!(%file, %at, "metadata.name: is required"),
            (Err(e), Some(r)) => match previous.get(&r) {
                Some(prev) => {
                    error!(%file, object = %r, "invalid, keeping its previous version: {e}");
                    objects.insert(r, prev.clone());
                }
                None => error!(%file, object = %r, "invalid, skipped: {e}"),
            },
            (Err(e), None) => error!(%file, %at, "invalid, skipped: {e}"),
        }
    }
    debug!(%file, objects = objects.len(), "manifest loaded");
    Some(objects)
}

/// Deserializes into a k8s-openapi type, naming the field that does not fit.
fn typed<T: serde::de::DeserializeOwned>(doc: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(doc).map_err(|e| {
        let path = e.path().to_string();
        format!("{path}: {}", e.into_inner())
    })
}

/// Watches `dir` and sends changes until the receiver goes away.
pub async fn run(dir: PathBuf, tx: mpsc::Sender<SourceMsg>) -> Result<(), notify::Error> {
    use notify::{RecursiveMode, Watcher as _};
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |_res| {
        let _ = ev_tx.send(());
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;

    let mut md = ManifestDir::new(&dir);
    let first = md.scan().map_err(notify::Error::io)?;
    info!(dir = %dir.display(), changes = first.len(), "manifests loaded");
    if tx.send(SourceMsg::Changes(first)).await.is_err()
        || tx.send(SourceMsg::Synced).await.is_err()
    {
        return Ok(());
    }
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.tick().await;
    loop {
        tokio::select! {
            ev = ev_rx.recv() => {
                if ev.is_none() {
                    return Ok(());
                }
                tokio::time::sleep(DEBOUNCE).await;
                while ev_rx.try_recv().is_ok() {}
            }
            _ = rescan.tick() => {}
        }
        match md.scan() {
            Ok(changes) if changes.is_empty() => {}
            Ok(changes) => {
                if tx.send(SourceMsg::Changes(changes)).await.is_err() {
                    return Ok(());
                }
            }
            Err(e) => error!(dir = %dir.display(), "cannot scan manifests: {e}"),
        }
    }
}

#[cfg(test)]
mod tests;
