//! One manifest file → the Services and EndpointSlices it defines.
use std::{collections::BTreeMap, fmt, path::Path};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::Value;
use tracing::{debug, error, warn};

use crate::{
    k8s::{self, ObjectError, SliceOutcome},
    model::{ServiceSpec, SliceSpec},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Kind {
    Service,
    EndpointSlice,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ObjRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
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
pub(super) enum Object {
    Service(ServiceSpec),
    Slice(SliceSpec),
    /// A valid slice the datapath does not use: defined, but contributes nothing.
    IgnoredSlice,
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

/// A file's objects, and whether anything in it was rejected.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    pub objects: BTreeMap<ObjRef, Object>,
    pub had_errors: bool,
}

/// Parses one file. `Err` when it cannot be read or parsed at all; the caller
/// then keeps the file's previous objects. An object that fails validation keeps
/// its version from `previous`, as an API server would reject the update.
pub(super) fn parse_file(
    path: &Path,
    previous: &BTreeMap<ObjRef, Object>,
) -> Result<Parsed, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(ManifestError::Read)?;
    let docs: Vec<Value> = if path.extension().is_some_and(|e| e == "json") {
        vec![serde_json::from_str(&text).map_err(ManifestError::Json)?]
    } else {
        serde_saphyr::from_multiple(&text).map_err(|e| ManifestError::Yaml {
            first_line: e.to_string().lines().next().unwrap_or_default().to_owned(),
        })?
    };
    let file = path.display();
    let mut out = Parsed::default();
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
        let kind = match (api.as_str(), kind.as_str()) {
            ("v1", "Service") => Kind::Service,
            ("discovery.k8s.io/v1", "EndpointSlice") => Kind::EndpointSlice,
            _ => {
                warn!(%file, %at, "unsupported object {api}/{kind}; only v1 Service and discovery.k8s.io/v1 EndpointSlice are read");
                continue;
            }
        };
        let meta = doc.get("metadata");
        let name = text_of(meta.and_then(|m| m.get("name")));
        let namespace = Some(text_of(meta.and_then(|m| m.get("namespace"))))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        if name.is_empty() {
            error!(%file, %at, "invalid, skipped: {}", ManifestError::NoName);
            out.had_errors = true;
            continue;
        }
        let r = ObjRef {
            kind,
            namespace,
            name,
        };
        match convert(kind, doc, &r, path) {
            Ok(obj) => {
                out.objects.insert(r, obj);
            }
            Err(e) => {
                out.had_errors = true;
                match previous.get(&r) {
                    Some(prev) => {
                        error!(%file, object = %r, "invalid, keeping its previous version: {e}");
                        out.objects.insert(r, prev.clone());
                    }
                    None => error!(%file, object = %r, "invalid, skipped: {e}"),
                }
            }
        }
    }
    debug!(%file, objects = out.objects.len(), "manifest loaded");
    Ok(out)
}

fn convert(kind: Kind, doc: Value, r: &ObjRef, path: &Path) -> Result<Object, ManifestError> {
    let file = path.display();
    match kind {
        Kind::Service => {
            let c = k8s::service(&typed::<Service>(doc)?)?;
            for w in c.warnings {
                warn!(%file, object = %r, "{w}");
            }
            Ok(Object::Service(c.value))
        }
        Kind::EndpointSlice => match k8s::slice(&typed::<EndpointSlice>(doc)?)? {
            SliceOutcome::Ip(c) => {
                for w in c.warnings {
                    warn!(%file, object = %r, "{w}");
                }
                Ok(Object::Slice(c.value))
            }
            SliceOutcome::Ignored { reason } => {
                warn!(%file, object = %r, "EndpointSlice skipped: {reason}");
                Ok(Object::IgnoredSlice)
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
