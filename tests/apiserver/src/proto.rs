//! Decodes the protobuf request bodies kubectl's typed `create` subcommands
//! send (`kubectl create namespace|configmap|secret|serviceaccount|service|
//! deployment`).
//! kubectl never falls back to JSON for request bodies, so without this those
//! commands would fail. Schemas are field tables copied from the upstream
//! `generated.proto` files for just these kinds; unknown fields are skipped.
use base64::Engine as _;
use serde_json::{Map, Value, json};

/// The `k8s\0` prefix of every Kubernetes protobuf body.
const MAGIC: &[u8] = b"k8s\0";

#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("missing the k8s protobuf magic prefix")]
    Magic,
    #[error("truncated protobuf message")]
    Truncated,
    #[error("unsupported protobuf wire type {0}")]
    WireType(u64),
    #[error("invalid UTF-8 in a protobuf string")]
    Utf8,
    #[error(
        "protobuf bodies are only decoded for Namespace, ConfigMap, Secret, ServiceAccount, Service and Deployment, not {0:?}; send JSON"
    )]
    Kind(String),
}

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Bytes,
    /// A plain int: zero is unset (Go's omitempty).
    Int,
    /// An `*int32`: zero is a value (`replicas: 0`).
    OptInt,
    /// An `*bool`: false is a value.
    Bool,
    /// A plain bool: false is unset.
    Flag,
    Msg(&'static [Field]),
    RepStr,
    RepMsg(&'static [Field]),
    MapStr,
    MapBytes,
    Time,
    IntOrString,
}

type Field = (u64, &'static str, Ty);

const OWNER_REF: &[Field] = &[
    (1, "kind", Ty::Str),
    (3, "name", Ty::Str),
    (4, "uid", Ty::Str),
    (5, "apiVersion", Ty::Str),
    (6, "controller", Ty::Bool),
    (7, "blockOwnerDeletion", Ty::Bool),
];

const OBJECT_META: &[Field] = &[
    (1, "name", Ty::Str),
    (2, "generateName", Ty::Str),
    (3, "namespace", Ty::Str),
    (5, "uid", Ty::Str),
    (6, "resourceVersion", Ty::Str),
    (7, "generation", Ty::Int),
    (8, "creationTimestamp", Ty::Time),
    (9, "deletionTimestamp", Ty::Time),
    (10, "deletionGracePeriodSeconds", Ty::Int),
    (11, "labels", Ty::MapStr),
    (12, "annotations", Ty::MapStr),
    (13, "ownerReferences", Ty::RepMsg(OWNER_REF)),
    (14, "finalizers", Ty::RepStr),
];

const NAMESPACE: &[Field] = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "spec", Ty::Msg(&[(1, "finalizers", Ty::RepStr)])),
];

const CONFIG_MAP: &[Field] = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "data", Ty::MapStr),
    (3, "binaryData", Ty::MapBytes),
    (4, "immutable", Ty::Bool),
];

const SECRET: &[Field] = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "data", Ty::MapBytes),
    (3, "type", Ty::Str),
    (4, "stringData", Ty::MapStr),
    (5, "immutable", Ty::Bool),
];

const SERVICE_ACCOUNT: &[Field] = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (3, "imagePullSecrets", Ty::RepMsg(&[(1, "name", Ty::Str)])),
    (4, "automountServiceAccountToken", Ty::Bool),
];

const SERVICE_PORT: &[Field] = &[
    (1, "name", Ty::Str),
    (2, "protocol", Ty::Str),
    (3, "port", Ty::Int),
    (4, "targetPort", Ty::IntOrString),
    (5, "nodePort", Ty::Int),
    (6, "appProtocol", Ty::Str),
];

const SERVICE_SPEC: &[Field] = &[
    (1, "ports", Ty::RepMsg(SERVICE_PORT)),
    (2, "selector", Ty::MapStr),
    (3, "clusterIP", Ty::Str),
    (4, "type", Ty::Str),
    (5, "externalIPs", Ty::RepStr),
    (7, "sessionAffinity", Ty::Str),
    (8, "loadBalancerIP", Ty::Str),
    (9, "loadBalancerSourceRanges", Ty::RepStr),
    (10, "externalName", Ty::Str),
    (11, "externalTrafficPolicy", Ty::Str),
    (12, "healthCheckNodePort", Ty::Int),
    (13, "publishNotReadyAddresses", Ty::Bool),
    (17, "ipFamilyPolicy", Ty::Str),
    (18, "clusterIPs", Ty::RepStr),
    (19, "ipFamilies", Ty::RepStr),
    (20, "allocateLoadBalancerNodePorts", Ty::Bool),
    (21, "loadBalancerClass", Ty::Str),
    (22, "internalTrafficPolicy", Ty::Str),
    (23, "trafficDistribution", Ty::Str),
];

const LABEL_SELECTOR: &[Field] = &[
    (1, "matchLabels", Ty::MapStr),
    (
        2,
        "matchExpressions",
        Ty::RepMsg(&[
            (1, "key", Ty::Str),
            (2, "operator", Ty::Str),
            (3, "values", Ty::RepStr),
        ]),
    ),
];

const CONTAINER: &[Field] = &[
    (1, "name", Ty::Str),
    (2, "image", Ty::Str),
    (3, "command", Ty::RepStr),
    (4, "args", Ty::RepStr),
    (5, "workingDir", Ty::Str),
    (
        6,
        "ports",
        Ty::RepMsg(&[
            (1, "name", Ty::Str),
            (2, "hostPort", Ty::Int),
            (3, "containerPort", Ty::Int),
            (4, "protocol", Ty::Str),
            (5, "hostIP", Ty::Str),
        ]),
    ),
    (
        7,
        "env",
        Ty::RepMsg(&[(1, "name", Ty::Str), (2, "value", Ty::Str)]),
    ),
    (8, "resources", Ty::Msg(&[])),
    (13, "terminationMessagePath", Ty::Str),
    (14, "imagePullPolicy", Ty::Str),
    (16, "stdin", Ty::Flag),
    (17, "stdinOnce", Ty::Flag),
    (18, "tty", Ty::Flag),
    (20, "terminationMessagePolicy", Ty::Str),
];

/// What `kubectl create deployment` fills in of a pod spec.
const POD_SPEC: &[Field] = &[
    (2, "containers", Ty::RepMsg(CONTAINER)),
    (3, "restartPolicy", Ty::Str),
    (6, "dnsPolicy", Ty::Str),
    (8, "serviceAccountName", Ty::Str),
    (10, "nodeName", Ty::Str),
    (11, "hostNetwork", Ty::Flag),
    (19, "schedulerName", Ty::Str),
];

const DEPLOYMENT: &[Field] = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (
        2,
        "spec",
        Ty::Msg(&[
            (1, "replicas", Ty::OptInt),
            (2, "selector", Ty::Msg(LABEL_SELECTOR)),
            (
                3,
                "template",
                Ty::Msg(&[
                    (1, "metadata", Ty::Msg(OBJECT_META)),
                    (2, "spec", Ty::Msg(POD_SPEC)),
                ]),
            ),
            (4, "strategy", Ty::Msg(&[(1, "type", Ty::Str)])),
            (5, "minReadySeconds", Ty::Int),
            (7, "paused", Ty::Flag),
        ]),
    ),
];

const SERVICE: &[Field] = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "spec", Ty::Msg(SERVICE_SPEC)),
];

/// One protobuf field: number, wire type and payload.
enum Raw<'a> {
    Varint(u64),
    Len(&'a [u8]),
    Fixed,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ProtoError> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.buf.split_first().ok_or(ProtoError::Truncated)?;
            self.buf = rest;
            out |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(ProtoError::Truncated)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn next(&mut self) -> Result<Option<(u64, Raw<'a>)>, ProtoError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let raw = match key & 7 {
            0 => Raw::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Raw::Fixed
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| ProtoError::Truncated)?;
                Raw::Len(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Raw::Fixed
            }
            other => return Err(ProtoError::WireType(other)),
        };
        Ok(Some((key >> 3, raw)))
    }
}

fn string(b: &[u8]) -> Result<String, ProtoError> {
    String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Utf8)
}

fn fields(buf: &[u8]) -> Result<Vec<(u64, Raw<'_>)>, ProtoError> {
    let mut r = Reader { buf };
    let mut out = Vec::new();
    while let Some(f) = r.next()? {
        out.push(f);
    }
    Ok(out)
}

fn message(buf: &[u8], schema: &[Field]) -> Result<Value, ProtoError> {
    let mut out = Map::new();
    for (num, raw) in fields(buf)? {
        let Some(&(_, name, ty)) = schema.iter().find(|f| f.0 == num) else {
            continue;
        };
        let name = name.to_string();
        match (ty, raw) {
            // Go marshals unset scalars as zero values; JSON omits them.
            (Ty::Str, Raw::Len([])) | (Ty::Int | Ty::Flag, Raw::Varint(0)) => {}
            (Ty::Str, Raw::Len(b)) => {
                out.insert(name, json!(string(b)?));
            }
            (Ty::Bytes, Raw::Len(b)) => {
                out.insert(
                    name,
                    json!(base64::engine::general_purpose::STANDARD.encode(b)),
                );
            }
            // int32 and int64 both sign-extend to 64 bits on the wire.
            (Ty::Int | Ty::OptInt, Raw::Varint(v)) => {
                out.insert(name, json!(v as i64));
            }
            (Ty::Bool | Ty::Flag, Raw::Varint(v)) => {
                out.insert(name, json!(v != 0));
            }
            (Ty::Msg(s), Raw::Len(b)) => {
                out.insert(name, message(b, s)?);
            }
            (Ty::RepStr, Raw::Len(b)) => push(&mut out, name, json!(string(b)?)),
            (Ty::RepMsg(s), Raw::Len(b)) => push(&mut out, name, message(b, s)?),
            (Ty::MapStr | Ty::MapBytes, Raw::Len(b)) => {
                let value_ty = if matches!(ty, Ty::MapStr) {
                    Ty::Str
                } else {
                    Ty::Bytes
                };
                let entry = message(b, &[(1, "k", Ty::Str), (2, "v", value_ty)])?;
                let key = entry["k"].as_str().unwrap_or_default().to_string();
                let value = entry.get("v").cloned().unwrap_or(json!(""));
                let map = out.entry(name).or_insert_with(|| json!({}));
                map[key] = value;
            }
            (Ty::Time, Raw::Len(b)) => {
                let t = message(b, &[(1, "s", Ty::Int)])?;
                let secs = t["s"].as_i64().unwrap_or(0);
                if let Ok(ts) = jiff::Timestamp::from_second(secs) {
                    out.insert(name, json!(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()));
                }
            }
            (Ty::IntOrString, Raw::Len(b)) => {
                let v = message(
                    b,
                    &[
                        (1, "type", Ty::Int),
                        (2, "int", Ty::Int),
                        (3, "str", Ty::Str),
                    ],
                )?;
                let value = if v["type"].as_i64() == Some(1) {
                    v["str"].clone()
                } else {
                    json!(v["int"].as_i64().unwrap_or(0))
                };
                out.insert(name, value);
            }
            _ => {}
        }
    }
    Ok(Value::Object(out))
}

fn push(out: &mut Map<String, Value>, name: String, v: Value) {
    if let Value::Array(a) = out.entry(name).or_insert_with(|| json!([])) {
        a.push(v);
    }
}

/// Decodes a `runtime.Unknown`-wrapped protobuf object into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let inner = body.strip_prefix(MAGIC).ok_or(ProtoError::Magic)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (num, f) in fields(inner)? {
        match (num, f) {
            (1, Raw::Len(b)) => {
                let tm = message(b, &[(1, "apiVersion", Ty::Str), (2, "kind", Ty::Str)])?;
                api_version = tm["apiVersion"].as_str().unwrap_or_default().to_string();
                kind = tm["kind"].as_str().unwrap_or_default().to_string();
            }
            (2, Raw::Len(b)) => raw = b,
            _ => {}
        }
    }
    let schema = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Service") => SERVICE,
        ("apps/v1", "Deployment") => DEPLOYMENT,
        _ => return Err(ProtoError::Kind(format!("{api_version}/{kind}"))),
    };
    let mut obj = message(raw, schema)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![(num << 3 | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    /// `kubectl create deployment web --image=busybox:1 --replicas=0
    /// --port=8080 -- httpd -f`, as kubectl 1.32 sent it (zeros and empty
    /// strings included, as Go marshals them), trimmed of unset fields.
    #[test]
    fn decodes_kubectls_deployment() {
        let labels = field(11, &[field(1, b"app"), field(2, b"web")].concat());
        let meta = [
            field(1, b"web"),
            field(2, b""),
            vec![0x38, 0],
            labels.clone(),
        ]
        .concat();
        let port = [field(1, b""), vec![0x10, 0, 0x18, 0x90, 0x3f]].concat();
        let container = [
            field(1, b"busybox"),
            field(2, b"busybox:1"),
            field(3, b"httpd"),
            field(3, b"-f"),
            field(6, &port),
            field(8, b""),
            vec![0x80, 0x01, 0],
        ]
        .concat();
        let pod_spec = [field(2, &container), vec![0x58, 0]].concat();
        let template = [field(1, &labels), field(2, &pod_spec)].concat();
        let selector = field(1, &[field(1, b"app"), field(2, b"web")].concat());
        let spec = [
            vec![0x08, 0],
            field(2, &selector),
            field(3, &template),
            field(4, &field(1, b"")),
            vec![0x38, 0],
        ]
        .concat();
        let dep = [field(1, &meta), field(2, &spec)].concat();
        let type_meta = [field(1, b"apps/v1"), field(2, b"Deployment")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &dep)].concat();
        let obj = decode(&body).unwrap();
        assert_eq!(
            obj,
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{
                            "name": "busybox", "image": "busybox:1", "command": ["httpd", "-f"],
                            "ports": [{"containerPort": 8080}], "resources": {},
                        }]},
                    },
                    "strategy": {},
                },
            })
        );
    }

    #[test]
    fn decodes_a_configmap() {
        let meta = [
            field(1, b"c1"),
            field(11, &[field(1, b"app"), field(2, b"web")].concat()),
        ]
        .concat();
        let cm = [
            field(1, &meta),
            field(2, &[field(1, b"k"), field(2, b"v")].concat()),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &cm)].concat();
        let obj = decode(&body).unwrap();
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "labels": {"app": "web"}}, "data": {"k": "v"}})
        );
    }
}
