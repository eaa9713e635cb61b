//! One manifest file → the Services and EndpointSlices it defines.
mod fast;
mod lite;

use std::{fmt, path::Path, sync::Arc};

use k8s_openapi::api::core::v1::Service;
use serde_json::Value;
use tracing::{debug, error, warn};

use crate::{
    k8s::{self, ObjectError, SliceOutcome, wire::EndpointSlice},
    model::{ServiceId, ServiceSpec, SliceId, SliceSpec},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Service,
    EndpointSlice,
}

/// The object a document defines, by the id the store knows it by. Once the
/// document converts, the id is the converted object's own (see
/// [`Object::obj_ref`]): the files' index then holds no copy of the name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum ObjRef {
    Service(ServiceId),
    EndpointSlice(SliceId),
}

impl ObjRef {
    fn new(kind: Kind, namespace: &str, name: &str) -> Self {
        match kind {
            Kind::Service => Self::Service(ServiceId::new(namespace, name)),
            Kind::EndpointSlice => Self::EndpointSlice(SliceId::new(namespace, name)),
        }
    }
}

impl fmt::Display for ObjRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Service(id) => write!(f, "Service/{id}"),
            Self::EndpointSlice(id) => write!(f, "EndpointSlice/{id}"),
        }
    }
}

/// An object as one file defines it. Shared with the store, which keeps the
/// same allocation (at 100k Services a second copy is most of the memory).
/// Each knows its own id, so a file's list holds no [`ObjRef`] beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Object {
    Service(Arc<ServiceSpec>),
    Slice(Arc<SliceSpec>),
    /// A valid slice the datapath does not use: defined, but contributes nothing.
    IgnoredSlice(SliceId),
}

impl Object {
    /// The reference the object is indexed by, holding the object's own
    /// copy of its name.
    pub fn obj_ref(&self) -> ObjRef {
        match self {
            Self::Service(s) => ObjRef::Service(s.id.clone()),
            Self::Slice(s) => ObjRef::EndpointSlice(s.id.clone()),
            Self::IgnoredSlice(id) => ObjRef::EndpointSlice(id.clone()),
        }
    }

    /// `self.obj_ref().cmp(r)`, without taking a reference.
    fn cmp_ref(&self, r: &ObjRef) -> std::cmp::Ordering {
        use std::cmp::Ordering::{Greater, Less};
        // ObjRef orders every Service before every EndpointSlice.
        match (self, r) {
            (Self::Service(s), ObjRef::Service(id)) => s.id.cmp(id),
            (Self::Service(_), ObjRef::EndpointSlice(_)) => Less,
            (Self::Slice(_) | Self::IgnoredSlice(_), ObjRef::Service(_)) => Greater,
            (Self::Slice(s), ObjRef::EndpointSlice(id)) => s.id.cmp(id),
            (Self::IgnoredSlice(own), ObjRef::EndpointSlice(id)) => own.cmp(id),
        }
    }
}

/// What is wrong with a file or with one object in it.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    // Display carries the cause inline: these end up as one log line each.
    #[error("cannot read manifest: {0}")]
    Read(std::io::Error),
    #[error("not valid JSON: {0}")]
    Json(serde_json::Error),
    /// Only the parser's first line: it renders a source snippet below it, and
    /// a log pipeline wants one line per problem.
    #[error("not valid YAML: {first_line}")]
    Yaml { first_line: String },
    #[error(
        "the file is {size} bytes, more than the {MAX_MANIFEST_BYTES} bytes a manifest file may hold; split it into several files"
    )]
    TooLarge { size: u64 },
    #[error(
        "refused by the YAML parser's limits ({breach}): anchors and aliases are capped against alias bombs; documents, nodes and text may grow with the file up to {MAX_MANIFEST_BYTES} bytes"
    )]
    Budget { breach: String },
    #[error("{path}: {error}")]
    Decode {
        path: String,
        error: serde_json::Error,
    },
    #[error(transparent)]
    Invalid(#[from] ObjectError),
    #[error("metadata.name: is required")]
    NoName,
}

/// The largest manifest file read: 100k Services with their EndpointSlices
/// in one `kubectl get -o yaml` fit several times over.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// The parser's limits for a file of `len` bytes. Its defaults (1,024
/// documents, 250,000 nodes) refuse a generated file of a few thousand
/// Services. Documents, nodes and events cost time in proportion to the
/// text, so they may grow with it; only what can amplify the input
/// (aliases, anchors, merge keys, nesting) keeps its fixed cap.
fn budget_for(len: usize) -> serde_saphyr::Budget {
    let mut b = serde_saphyr::Budget::default();
    // "---\n" is the smallest document, one byte the smallest node.
    b.max_documents = b.max_documents.max(len / 4 + 1);
    b.max_nodes = b.max_nodes.max(len + 1);
    b.max_events = b.max_events.max(2 * len + 16);
    b.max_total_scalar_bytes = b.max_total_scalar_bytes.max(len);
    b.max_reader_input_bytes = Some(MAX_MANIFEST_BYTES as usize);
    b
}

/// Where the lite reader takes `text`, serde-saphyr must read the same:
/// the oracle of the `manifest` fuzz target. `Err` shows both readings.
#[doc(hidden)]
pub fn lite_agrees(text: &str) -> Result<(), String> {
    let Some(lite) = fast::lite_yaml(text) else {
        return Ok(());
    };
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget_for(text.len()));
    let Some(full) = fast::saphyr_yaml(text, options) else {
        return Err("the lite reader took a text that serde-saphyr refuses".to_owned());
    };
    let (lite, full) = (fast::seen(lite), fast::seen(full));
    if lite == full {
        Ok(())
    } else {
        Err(format!("lite reader: {lite:?}\nserde-saphyr: {full:?}"))
    }
}

/// A file's objects, sorted by [`ObjRef`]. A sorted slice rather than a
/// `BTreeMap`: most files define two objects, and a B-tree node has room
/// for eleven (kilobytes per file, at 100k files most of the source's
/// memory).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Objects(Box<[Object]>);

impl Objects {
    /// From objects in file order: a later definition of the same object in
    /// the same file wins, as it would with `kubectl apply` of the file.
    fn from_file_order(mut v: Vec<Object>) -> Self {
        // Stable, so among equal refs the later one stays last.
        v.sort_by(|a, b| a.cmp_ref(&b.obj_ref()));
        let mut out: Vec<Object> = Vec::with_capacity(v.len());
        for o in v {
            match out.last_mut() {
                Some(last) if last.cmp_ref(&o.obj_ref()).is_eq() => *last = o,
                _ => out.push(o),
            }
        }
        Self(out.into_boxed_slice())
    }

    pub fn get(&self, r: &ObjRef) -> Option<&Object> {
        self.0
            .binary_search_by(|o| o.cmp_ref(r))
            .ok()
            .map(|i| &self.0[i])
    }

    /// The objects' references, in order.
    pub fn keys(&self) -> impl Iterator<Item = ObjRef> + '_ {
        self.0.iter().map(Object::obj_ref)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Points each slice's Service name at one copy already held: the
    /// Service's own, in this file or through `known` (the directory's
    /// index). A slice is not shared yet when this runs, so nothing is
    /// copied.
    pub fn share_service_names(&mut self, known: impl Fn(&ServiceId) -> Option<ServiceId>) {
        let here: Vec<ServiceId> = self
            .0
            .iter()
            .filter_map(|o| match o {
                Object::Service(s) => Some(s.id.clone()),
                Object::Slice(_) | Object::IgnoredSlice(_) => None,
            })
            .collect();
        for obj in &mut self.0 {
            let Object::Slice(slice) = obj else {
                continue;
            };
            let Some(spec) = Arc::get_mut(slice) else {
                continue;
            };
            let shared = match here.binary_search(&spec.service) {
                Ok(i) => Some(here[i].clone()),
                Err(_) => known(&spec.service),
            };
            if let Some(id) = shared {
                spec.service = id;
            }
        }
    }
}

/// A file's objects, and whether anything in it was rejected.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    pub objects: Objects,
    pub had_errors: bool,
}

/// Parses the text of the file at `path`. `Err` when it cannot be parsed at
/// all; the caller then keeps the file's previous objects. An object that
/// fails validation keeps its version from `previous`, as an API server
/// would reject the update.
pub(super) fn parse_file(
    path: &Path,
    text: &str,
    previous: &Objects,
) -> Result<Parsed, ManifestError> {
    let docs = if path.extension().is_some_and(|e| e == "json") {
        match fast::json(text) {
            Some(docs) => docs,
            None => general(vec![
                serde_json::from_str(text).map_err(ManifestError::Json)?,
            ]),
        }
    } else {
        let options = || {
            let mut o = serde_saphyr::Options::default();
            o.budget = Some(budget_for(text.len()));
            o
        };
        match fast::yaml(text, options()) {
            Some(docs) => docs,
            None => general(
                serde_saphyr::from_multiple_with_options(text, options()).map_err(yaml_error)?,
            ),
        }
    };
    let file = path.display();
    let mut out = Parsed::default();
    let mut objects = Vec::with_capacity(docs.len());
    for doc in docs {
        let Doc {
            at,
            api,
            kind,
            name,
            namespace,
            body,
        } = doc;
        let kind = match (api.as_str(), kind.as_str()) {
            ("v1", "Service") => Kind::Service,
            ("discovery.k8s.io/v1", "EndpointSlice") => Kind::EndpointSlice,
            _ => {
                warn!(%file, %at, "unsupported object {api}/{kind}; only v1 Service and discovery.k8s.io/v1 EndpointSlice are read");
                continue;
            }
        };
        let namespace = namespace
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        if name.is_empty() {
            error!(%file, %at, "invalid, skipped: {}", ManifestError::NoName);
            out.had_errors = true;
            continue;
        }
        let r = ObjRef::new(kind, &namespace, &name);
        let converted = match body {
            Some(Ok(body)) => convert(*body, &r, path),
            Some(Err(e)) => Err(e),
            None => unreachable!("a supported kind always has a body"),
        };
        match converted {
            Ok(obj) => objects.push(obj),
            Err(e) => {
                out.had_errors = true;
                match previous.get(&r) {
                    Some(prev) => {
                        error!(%file, object = %r, "invalid, keeping its previous version: {e}");
                        objects.push(prev.clone());
                    }
                    None => error!(%file, object = %r, "invalid, skipped: {e}"),
                }
            }
        }
    }
    out.objects = Objects::from_file_order(objects);
    debug!(%file, objects = out.objects.len(), "manifest loaded");
    Ok(out)
}

/// One document as read: its kind and name, and its typed object (`None`
/// for a kind that is not read; `Err` when it does not fit its type).
pub(super) struct Doc {
    at: String,
    api: String,
    kind: String,
    name: String,
    namespace: Option<String>,
    body: Option<Result<Box<Body>, ManifestError>>,
}

// Boxed as a whole where it is held (`Doc::body`); the variants' sizes
// differ, but each value lives only until it is converted.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq)]
pub(super) enum Body {
    Service(Service),
    Slice(EndpointSlice),
}

/// The general path: from generic documents, each checked on its own, so a
/// bad one costs only itself and its error names the field.
fn general(docs: Vec<Value>) -> Vec<Doc> {
    let mut out = Vec::with_capacity(docs.len());
    let mut queue: Vec<(String, Value)> = docs
        .into_iter()
        .enumerate()
        .map(|(i, d)| (format!("document {i}"), d))
        .rev()
        .collect();
    while let Some((at, doc)) = queue.pop() {
        if doc.is_null() {
            continue;
        }
        let text_of = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
        let kind = text_of(doc.get("kind"));
        let api = text_of(doc.get("apiVersion"));
        if kind.ends_with("List") {
            if let Some(Value::Array(items)) = doc.get("items") {
                for (j, item) in items.iter().enumerate().rev() {
                    queue.push((format!("{at} items[{j}]"), item.clone()));
                }
            }
            continue;
        }
        let meta = doc.get("metadata");
        let name = text_of(meta.and_then(|m| m.get("name")));
        let namespace =
            Some(text_of(meta.and_then(|m| m.get("namespace")))).filter(|n| !n.is_empty());
        let body = match (api.as_str(), kind.as_str()) {
            ("v1", "Service") => Some(typed::<Service>(doc).map(|s| Box::new(Body::Service(s)))),
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                Some(typed::<EndpointSlice>(doc).map(|s| Box::new(Body::Slice(s))))
            }
            _ => None,
        };
        out.push(Doc {
            at,
            api,
            kind,
            name,
            namespace,
            body,
        });
    }
    out
}

/// A budget breach, wherever the parser wrapped it (with a source snippet,
/// behind the alias it came through), says which limit it hit.
fn yaml_error(e: serde_saphyr::Error) -> ManifestError {
    use serde_saphyr::Error as E;
    let mut inner = &e;
    while let E::WithSnippet { error, .. } | E::AliasError { error, .. } = inner {
        inner = error;
    }
    match inner {
        E::Budget { breach, .. } => ManifestError::Budget {
            breach: format!("{breach:?}"),
        },
        _ => ManifestError::Yaml {
            first_line: e.to_string().lines().next().unwrap_or_default().to_owned(),
        },
    }
}

/// A manifest as [`open`] found it.
// Each value lives only until its file is parsed; boxing the metadata would
// cost an allocation per file.
#[allow(clippy::large_enum_variant)]
pub(super) enum Opened {
    /// No regular file by that name: removed since it was listed, or a
    /// directory.
    Gone,
    /// Its metadata when opened, and its text or why that was not read.
    File(std::fs::Metadata, Result<String, ManifestError>),
}

/// Opens and reads a manifest. The metadata comes from the open file: a
/// scan needs no `stat` of its own for a file it reads, and a write that
/// lands after the open shows as a newer stamp next time. A file over the
/// limit is refused before it is read.
pub(super) fn open(path: &Path) -> Result<Opened, ManifestError> {
    use std::{io::Read as _, os::unix::fs::OpenOptionsExt as _};
    // O_NOATIME: the first read of a file written since it was last read
    // updates its access time, which at a cold start of 100k files was
    // journal work for every one of them. Only the owner (or a process with
    // CAP_FOWNER) may ask; anyone else opens the plain way.
    //
    // O_NONBLOCK: callers open only what was a regular file when listed or
    // `stat`ed, but a FIFO put in its place since would block the open; with
    // the flag it opens at once and the type check below refuses it.
    let open_with = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
    };
    let file = open_with(libc::O_NOATIME | libc::O_NONBLOCK).or_else(|e| match e.raw_os_error() {
        Some(libc::EPERM) => open_with(libc::O_NONBLOCK),
        _ => Err(e),
    });
    let file = match file {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Opened::Gone),
        Err(e) => return Err(ManifestError::Read(e)),
    };
    let meta = file.metadata().map_err(ManifestError::Read)?;
    if !meta.is_file() {
        return Ok(Opened::Gone);
    }
    let size = meta.len();
    if size > MAX_MANIFEST_BYTES {
        return Ok(Opened::File(meta, Err(ManifestError::TooLarge { size })));
    }
    let mut text = String::with_capacity(size as usize);
    // `take`: a file that grows while read still stops at the limit.
    let read = match file.take(MAX_MANIFEST_BYTES + 1).read_to_string(&mut text) {
        Err(e) => Err(ManifestError::Read(e)),
        Ok(n) if n as u64 > MAX_MANIFEST_BYTES => Err(ManifestError::TooLarge { size: n as u64 }),
        Ok(_) => Ok(text),
    };
    Ok(Opened::File(meta, read))
}

fn convert(body: Body, r: &ObjRef, path: &Path) -> Result<Object, ManifestError> {
    let file = path.display();
    match body {
        Body::Service(svc) => {
            let c = k8s::service(&svc)?;
            for w in c.warnings {
                warn!(%file, object = %r, "{w}");
            }
            Ok(Object::Service(Arc::new(c.value)))
        }
        Body::Slice(slice) => match k8s::slice(&slice)? {
            SliceOutcome::Ip(c) => {
                for w in c.warnings {
                    warn!(%file, object = %r, "{w}");
                }
                Ok(Object::Slice(Arc::new(c.value)))
            }
            SliceOutcome::Ignored { reason } => {
                warn!(%file, object = %r, "EndpointSlice skipped: {reason}");
                let ObjRef::EndpointSlice(id) = r else {
                    unreachable!("a slice's body comes with a slice's reference")
                };
                Ok(Object::IgnoredSlice(id.clone()))
            }
        },
    }
}

/// Deserializes into a k8s-openapi type, naming the field that does not fit.
fn typed<T: serde::de::DeserializeOwned>(doc: Value) -> Result<T, ManifestError> {
    serde_path_to_error::deserialize(doc).map_err(|e| ManifestError::Decode {
        path: e.path().to_string(),
        error: e.into_inner(),
    })
}
