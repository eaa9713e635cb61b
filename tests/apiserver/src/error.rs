//! Errors: [`Error`] for starting and running the server, [`ApiError`] for what a
//! request gets back as a `metav1.Status`.
use serde_json::{Value, json};

use crate::resources::ResourceDef;

/// Why the server could not start, stop or write its files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot generate certificates: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("cannot generate the service-account signing key")]
    SigningKey,
    #[error("cannot build the TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot build the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create a temporary directory: {0}")]
    TempDir(std::io::Error),
    #[error("cannot read the kubeconfig back: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("cannot build a client: {0}")]
    Client(#[from] kube::Error),
    #[error("the server is not running")]
    NotRunning,
    #[error("the server is already running")]
    AlreadyRunning,
}

/// A failed request, rendered as the `metav1.Status` a real API server sends.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{resource} \"{name}\" not found")]
    NotFound {
        group: String,
        resource: String,
        name: String,
    },
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists {
        group: String,
        resource: String,
        name: String,
    },
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": {reason}")]
    Conflict {
        group: String,
        resource: String,
        name: String,
        reason: String,
    },
    #[error("{kind} \"{name}\" is invalid: {field}: {detail}")]
    Invalid {
        group: String,
        kind: String,
        name: String,
        field: String,
        detail: String,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("{resource} \"{name}\" is forbidden: {reason}")]
    Forbidden {
        resource: String,
        name: String,
        reason: String,
    },
    #[error("{0}")]
    Gone(String),
    #[error("the server could not find the requested resource")]
    NoRoute,
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    #[error(
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
    )]
    UnsupportedPatchType,
    #[error(
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml"
    )]
    UnsupportedMediaType,
    #[error("Unauthorized")]
    Unauthorized,
    /// 429, with the causes upstream's eviction gives (`DisruptionBudget`).
    #[error("{message}")]
    TooManyRequests {
        message: String,
        causes: Vec<(String, String)>,
    },
    #[error("Internal error occurred: {0}")]
    Internal(String),
    #[error(
        "the request has been made before all known HTTP paths have been installed, or the server is stopping"
    )]
    Unavailable,
    /// A Status built field by field, as upstream does for errors it relays
    /// (a kubelet's answer) or that are no Status at all (reason "").
    #[error("{message}")]
    Other {
        code: u16,
        reason: &'static str,
        message: String,
        details: Option<Value>,
    },
}

impl ApiError {
    pub fn not_found(res: &ResourceDef, name: &str) -> Self {
        ApiError::NotFound {
            group: res.group.to_string(),
            resource: res.plural.to_string(),
            name: name.to_string(),
        }
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        ApiError::NotFound {
            group: String::new(),
            resource: "namespaces".into(),
            name: ns.to_string(),
        }
    }

    pub fn already_exists(res: &ResourceDef, name: &str) -> Self {
        ApiError::AlreadyExists {
            group: res.group.to_string(),
            resource: res.plural.to_string(),
            name: name.to_string(),
        }
    }

    pub fn conflict(res: &ResourceDef, name: &str, reason: impl Into<String>) -> Self {
        ApiError::Conflict {
            group: res.group.to_string(),
            resource: res.plural.to_string(),
            name: name.to_string(),
            reason: reason.into(),
        }
    }

    pub fn modified(res: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(res: &ResourceDef, name: &str, field: &str, detail: impl Into<String>) -> Self {
        ApiError::Invalid {
            group: res.group.to_string(),
            kind: res.kind.to_string(),
            name: name.to_string(),
            field: field.to_string(),
            detail: detail.into(),
        }
    }

    pub fn expired() -> Self {
        ApiError::Gone("too old resource version".into())
    }

    pub fn code(&self) -> u16 {
        match self {
            ApiError::NotFound { .. } | ApiError::NoRoute => 404,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } => 409,
            ApiError::Invalid { .. } => 422,
            ApiError::BadRequest(_) => 400,
            ApiError::Forbidden { .. } => 403,
            ApiError::Gone(_) => 410,
            ApiError::MethodNotAllowed => 405,
            ApiError::UnsupportedMediaType | ApiError::UnsupportedPatchType => 415,
            ApiError::Unauthorized => 401,
            ApiError::Unavailable => 503,
            ApiError::TooManyRequests { .. } => 429,
            ApiError::Internal(_) => 500,
            ApiError::Other { code, .. } => *code,
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound { .. } | ApiError::NoRoute => "NotFound",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict { .. } => "Conflict",
            ApiError::Invalid { .. } => "Invalid",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::Forbidden { .. } => "Forbidden",
            ApiError::Gone(_) => "Expired",
            ApiError::MethodNotAllowed => "MethodNotAllowed",
            ApiError::UnsupportedMediaType | ApiError::UnsupportedPatchType => {
                "UnsupportedMediaType"
            }
            ApiError::Unauthorized => "Unauthorized",
            ApiError::Unavailable => "ServiceUnavailable",
            ApiError::TooManyRequests { .. } => "TooManyRequests",
            ApiError::Internal(_) => "InternalError",
            ApiError::Other { reason, .. } => reason,
        }
    }

    /// The `metav1.Status` body, with `details` shaped like the real server's.
    pub fn status(&self) -> Value {
        let details = match self {
            ApiError::NotFound {
                group,
                resource,
                name,
            }
            | ApiError::AlreadyExists {
                group,
                resource,
                name,
            }
            | ApiError::Conflict {
                group,
                resource,
                name,
                ..
            } => Some(details(name, group, resource)),
            ApiError::Invalid {
                group,
                kind,
                name,
                field,
                detail,
            } => {
                let mut d = details(name, group, kind);
                d["causes"] =
                    json!([{"reason": "FieldValueInvalid", "message": detail, "field": field}]);
                Some(d)
            }
            ApiError::Forbidden { resource, name, .. } => Some(details(name, "", resource)),
            ApiError::TooManyRequests { causes, .. } => Some(json!({
                "causes": causes
                    .iter()
                    .map(|(reason, message)| json!({"reason": reason, "message": message}))
                    .collect::<Vec<_>>(),
                "retryAfterSeconds": 0,
            })),
            ApiError::Internal(message) => Some(json!({"causes": [{"message": message}]})),
            ApiError::Other { details, .. } => details.clone(),
            _ => None,
        };
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if let Some(d) = details {
            status["details"] = d;
        }
        // StatusReasonUnknown is the empty string, left out on the wire.
        if self.reason().is_empty()
            && let Some(s) = status.as_object_mut()
        {
            s.remove("reason");
        }
        status
    }
}

fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = json!({"name": name, "kind": kind});
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}
