//! Service-account tokens as kube-apiserver issues and accepts them: the
//! TokenRequest subresource (`serviceaccounts/{name}/token`, upstream's
//! `pkg/registry/core/serviceaccount/storage/token.go`), ES256 JWTs with the
//! claims of `pkg/serviceaccount/claims.go`, and the authenticator that
//! accepts a token only while the objects it names still exist.
use std::time::Duration;

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use ring::{
    rand::SystemRandom,
    signature::{self, EcdsaKeyPair, KeyPair as _},
};
use serde_json::{Value, json};

use crate::{
    error::{ApiError, Error},
    resources::{self, ResourceDef},
    semantics,
    store::Inner,
};

/// `--service-account-issuer`, and the only API audience (kube-apiserver's
/// `--api-audiences` defaults to the issuer).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// go-jose's `DefaultLeeway`: kube-apiserver allows it on exp, nbf and iat,
/// and for a bound object's deletionTimestamp, to absorb clock skew between
/// servers.
const LEEWAY: i64 = 60;
const MIN_EXPIRATION: i64 = 600;
const DEFAULT_EXPIRATION: i64 = 3600;
const MAX_EXPIRATION: i64 = 1 << 32;
/// What the admission plugin's projected volume asks for. Upstream
/// (`--service-account-extend-token-expiration`, on by default) signs such
/// pod-bound tokens for a year and adds `warnafter`, so that workloads that
/// never reread the file keep working while the server logs them.
pub const WARN_ONLY_EXPIRATION: i64 = 3607;
const EXTENDED_EXPIRATION: i64 = 365 * 24 * 60 * 60;

/// The DER SubjectPublicKeyInfo header of an uncompressed P-256 point, which
/// the key id is a hash of.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The service-account signing key (`--service-account-signing-key-file`).
pub struct SigningKey {
    pair: EcdsaKeyPair,
    rng: SystemRandom,
    kid: String,
}

impl SigningKey {
    pub fn generate() -> Result<Self, Error> {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).map_err(|_| Error::SigningKey)?;
        let pair =
            EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).map_err(|_| Error::SigningKey)?;
        let mut key = SigningKey {
            pair,
            rng,
            kid: String::new(),
        };
        // Upstream's key id: clients pick the verification key by it.
        let digest = ring::digest::digest(&ring::digest::SHA256, &key.public_key_der());
        key.kid = URL_SAFE_NO_PAD.encode(digest);
        Ok(key)
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a DER SubjectPublicKeyInfo.
    pub fn public_key_der(&self) -> Vec<u8> {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(self.pair.public_key().as_ref());
        der
    }

    /// The public key as PEM, as `--service-account-key-file` holds it.
    pub fn public_key_pem(&self) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(self.public_key_der());
        let mut pem = String::from("-----BEGIN PUBLIC KEY-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).unwrap_or_default());
            pem.push('\n');
        }
        pem.push_str("-----END PUBLIC KEY-----\n");
        pem
    }

    /// A compact JWS of `claims`.
    pub fn sign(&self, claims: &Value) -> Result<String, ApiError> {
        let header = json!({"alg": "ES256", "kid": self.kid, "typ": "JWT"});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = self
            .pair
            .sign(&self.rng, input.as_bytes())
            .map_err(|_| ApiError::Internal("cannot sign the service account token".into()))?;
        Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref())))
    }

    /// The claims of a token this key signed; why not otherwise.
    pub fn verify(&self, token: &str) -> Result<Value, &'static str> {
        let (input, sig) = token.rsplit_once('.').ok_or("not a JWT")?;
        let (header, payload) = input.split_once('.').ok_or("not a JWT")?;
        let decode = |part: &str| -> Result<Value, &'static str> {
            let raw = URL_SAFE_NO_PAD.decode(part).map_err(|_| "not base64url")?;
            serde_json::from_slice(&raw).map_err(|_| "not JSON")
        };
        if decode(header)?["alg"] != "ES256" {
            return Err("not signed with ES256");
        }
        let sig = URL_SAFE_NO_PAD
            .decode(sig)
            .map_err(|_| "signature is not base64url")?;
        signature::UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            self.pair.public_key().as_ref(),
        )
        .verify(input.as_bytes(), &sig)
        .map_err(|_| "invalid signature")?;
        decode(payload)
    }
}

fn pods() -> &'static ResourceDef {
    resources::find("", "v1", "pods").expect("served")
}

fn nodes() -> &'static ResourceDef {
    resources::find("", "v1", "nodes").expect("served")
}

pub fn service_accounts() -> &'static ResourceDef {
    resources::find("", "v1", "serviceaccounts").expect("served")
}

fn token_request_invalid(name: &str, field: &str, detail: String) -> ApiError {
    ApiError::Invalid {
        group: "authentication.k8s.io".into(),
        kind: "TokenRequest".into(),
        name: name.into(),
        field: field.into(),
        detail,
    }
}

/// A `{name, uid}` claim.
fn object_ref(obj: &Value) -> Value {
    json!({"name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"]})
}

/// `POST serviceaccounts/{name}/token`: the TokenRequest echoed with
/// `status.token` and `status.expirationTimestamp`. `max` is
/// `--service-account-max-token-expiration`.
pub fn request(
    inner: &Inner,
    key: &SigningKey,
    max: Option<Duration>,
    ns: &str,
    name: &str,
    mut req: Value,
) -> Result<Value, ApiError> {
    if !req.is_object() {
        return Err(ApiError::BadRequest(
            "the body must be a JSON object".into(),
        ));
    }
    if let Some(kind) = req["kind"].as_str()
        && kind != "TokenRequest"
    {
        return Err(ApiError::BadRequest(format!(
            "the body must be a TokenRequest of authentication.k8s.io/v1, not a {kind}"
        )));
    }
    req["kind"] = json!("TokenRequest");
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    if !req["metadata"].is_object() {
        req["metadata"] = json!({});
    }
    for (field, want, what) in [("name", name, "name"), ("namespace", ns, "namespace")] {
        let got = req["metadata"][field].as_str().unwrap_or_default();
        if !got.is_empty() && got != want {
            return Err(token_request_invalid(
                name,
                &format!("metadata.{field}"),
                format!(
                    "Invalid value: {got:?}: must match the service account {what} if specified"
                ),
            ));
        }
    }
    let sa = inner
        .get(service_accounts(), ns, name)
        .ok_or_else(|| ApiError::not_found(service_accounts(), name))?
        .into_owned();
    if !req["spec"].is_object() {
        req["spec"] = json!({});
    }
    let spec = &mut req["spec"];
    if spec["audiences"].as_array().is_none_or(Vec::is_empty) {
        spec["audiences"] = json!([ISSUER]);
    }
    let audiences: Vec<String> = match spec["audiences"].as_array() {
        Some(a) if a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect(),
        _ => {
            return Err(ApiError::BadRequest(
                "spec.audiences must be a list of strings".into(),
            ));
        }
    };
    let requested = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT_EXPIRATION,
        v => v.as_i64().ok_or_else(|| {
            ApiError::BadRequest(format!(
                "spec.expirationSeconds must be an integer, not {v}"
            ))
        })?,
    };
    if requested < MIN_EXPIRATION {
        return Err(token_request_invalid(
            "",
            "spec.expirationSeconds",
            format!("Invalid value: {requested}: may not specify a duration less than 10 minutes"),
        ));
    }
    if requested > MAX_EXPIRATION {
        return Err(token_request_invalid(
            "",
            "spec.expirationSeconds",
            format!(
                "Invalid value: {requested}: may not specify a duration larger than 2^32 seconds"
            ),
        ));
    }
    let (pod, node) = match &spec["boundObjectRef"] {
        Value::Null => (None, None),
        r => {
            let (pod, node) = bound_pod(inner, ns, name, r)?;
            (Some(pod), node)
        }
    };
    if spec["boundObjectRef"].is_null() {
        // Not omitempty upstream.
        spec["boundObjectRef"] = Value::Null;
    }
    let mut expiration = requested;
    if let Some(max) = max {
        // Unlike kube-apiserver, which wants at least an hour here, any cap
        // goes: tests use a short one to see tokens rotate.
        expiration = expiration.min(i64::try_from(max.as_secs()).unwrap_or(i64::MAX).max(1));
    }
    spec["expirationSeconds"] = json!(expiration);
    let (exp, warn_after) = if pod.is_some()
        && expiration == WARN_ONLY_EXPIRATION
        && audiences.iter().all(|a| a == ISSUER)
    {
        (EXTENDED_EXPIRATION, Some(expiration))
    } else {
        (expiration, None)
    };
    let now = jiff::Timestamp::now();
    let at = now.as_second();
    let mut k8s = json!({"namespace": ns, "serviceaccount": object_ref(&sa)});
    if let Some(pod) = &pod {
        k8s["pod"] = object_ref(pod);
    }
    if let Some(node) = &node {
        k8s["node"] = object_ref(node);
    }
    if let Some(w) = warn_after {
        k8s["warnafter"] = json!(at + w);
    }
    let claims = json!({
        "aud": audiences,
        "exp": at + exp,
        "iat": at,
        "iss": ISSUER,
        "jti": uuid::Uuid::new_v4().to_string(),
        "kubernetes.io": k8s,
        "nbf": at,
        "sub": format!("system:serviceaccount:{ns}:{name}"),
    });
    let token = key.sign(&claims)?;
    let expires = now + jiff::SignedDuration::from_secs(expiration);
    req["metadata"] =
        json!({"name": name, "namespace": ns, "creationTimestamp": semantics::timestamp(now)});
    req["status"] = json!({"token": token, "expirationTimestamp": semantics::timestamp(expires)});
    Ok(req)
}

/// The pod a `boundObjectRef` names (and its node, when it is bound to one
/// that exists), checked as upstream's token REST checks it.
fn bound_pod(
    inner: &Inner,
    ns: &str,
    sa: &str,
    r: &Value,
) -> Result<(Value, Option<Value>), ApiError> {
    let api_version = r["apiVersion"].as_str().unwrap_or_default();
    let kind = r["kind"].as_str().unwrap_or_default();
    let name = r["name"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "Pod") => {}
        ("v1", "Secret" | "Node") => {
            return Err(ApiError::BadRequest(format!(
                "spec.boundObjectRef.kind: cannot bind token to a {kind}: this test server binds tokens to Pods only"
            )));
        }
        _ => {
            return Err(ApiError::BadRequest(format!(
                "spec.boundObjectRef: cannot bind token to object of type {api_version}, Kind={kind}"
            )));
        }
    }
    if name.is_empty() {
        return Err(token_request_invalid(
            sa,
            "spec.boundObjectRef.name",
            "Required value".into(),
        ));
    }
    let pod = inner
        .get(pods(), ns, name)
        .ok_or_else(|| ApiError::not_found(pods(), name))?
        .into_owned();
    let runs_as = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or_default();
    if runs_as != sa {
        return Err(ApiError::BadRequest(format!(
            "cannot bind token for serviceaccount {sa:?} to pod running with different serviceaccount name."
        )));
    }
    let want_uid = r["uid"].as_str().unwrap_or_default();
    if !want_uid.is_empty() && pod["metadata"]["uid"].as_str() != Some(want_uid) {
        return Err(ApiError::Conflict {
            group: String::new(),
            resource: "Pod".into(),
            name: name.into(),
            reason: format!(
                "the UID in the bound object reference ({want_uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        });
    }
    let node = pod["spec"]["nodeName"]
        .as_str()
        .filter(|n| !n.is_empty())
        .and_then(|n| inner.get(nodes(), "", n))
        .map(std::borrow::Cow::into_owned);
    Ok((pod, node))
}

/// Who a request is from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// Whether `obj` was deleted long enough ago (past its grace, plus the
/// leeway) that tokens naming it are void.
fn deleted_before(obj: &Value, limit: i64) -> bool {
    obj["metadata"]["deletionTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .is_some_and(|t| t.as_second() < limit)
}

/// The service account a bearer token authenticates, as upstream's JWT
/// authenticator and legacy validator decide; `Err` says why not (logged,
/// as kube-apiserver logs it; the client only sees 401).
pub fn authenticate(inner: &Inner, key: &SigningKey, token: &str) -> Result<User, String> {
    let claims = key.verify(token)?;
    if claims["iss"] != ISSUER {
        return Err(format!("issuer {} is not {ISSUER}", claims["iss"]));
    }
    let now = jiff::Timestamp::now().as_second();
    let time = |c: &str| claims[c].as_i64();
    if time("exp").is_some_and(|exp| now - LEEWAY > exp) {
        return Err("service account token has expired".into());
    }
    if time("nbf").is_some_and(|nbf| now + LEEWAY < nbf) {
        return Err("service account token is not valid yet".into());
    }
    if time("iat").is_some_and(|iat| now + LEEWAY < iat) {
        return Err("service account token is issued in the future".into());
    }
    let audiences = match &claims["aud"] {
        Value::String(a) => vec![a.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !audiences.contains(&ISSUER) {
        return Err(format!(
            "token audiences {audiences:?} is invalid for the target audiences [{ISSUER:?}]"
        ));
    }
    let k8s = &claims["kubernetes.io"];
    let ns = k8s["namespace"].as_str().unwrap_or_default();
    let sa_ref = &k8s["serviceaccount"];
    let sa_name = sa_ref["name"].as_str().unwrap_or_default();
    if ns.is_empty() || sa_name.is_empty() {
        return Err("token names no service account".into());
    }
    let invalid_if_deleted_before = now - LEEWAY;
    let check = |res: &'static ResourceDef, what: &str, claim: &Value| -> Result<(), String> {
        let name = claim["name"].as_str().unwrap_or_default();
        let uid = claim["uid"].as_str().unwrap_or_default();
        let Some(obj) = inner.get(res, ns, name) else {
            return Err(format!("{what} {ns}/{name} has been deleted"));
        };
        if deleted_before(&obj, invalid_if_deleted_before) {
            return Err(format!("{what} {ns}/{name} has been deleted"));
        }
        let actual = obj["metadata"]["uid"].as_str().unwrap_or_default();
        if actual != uid {
            return Err(format!(
                "{what} UID ({actual}) does not match claim ({uid})"
            ));
        }
        Ok(())
    };
    check(service_accounts(), "service account", sa_ref)?;
    if !k8s["pod"].is_null() {
        check(pods(), "pod", &k8s["pod"])?;
    }
    Ok(User {
        name: format!("system:serviceaccount:{ns}:{sa_name}"),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".into(),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(token: &str) -> Value {
        let part = token.split('.').nth(1).unwrap();
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn signed_tokens_verify_and_tampered_ones_do_not() {
        let key = SigningKey::generate().unwrap();
        let claims = json!({"sub": "system:serviceaccount:a:b", "exp": 1});
        let token = key.sign(&claims).unwrap();
        assert_eq!(token.split('.').count(), 3);
        assert!(!token.contains('='), "no padding: {token}");
        let header: Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(token.split('.').next().unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            header,
            json!({"alg": "ES256", "kid": key.kid(), "typ": "JWT"})
        );
        assert_eq!(key.verify(&token), Ok(claims));
        assert_eq!(payload(&token)["sub"], "system:serviceaccount:a:b");

        let (input, sig) = token.rsplit_once('.').unwrap();
        let forged_claims = URL_SAFE_NO_PAD.encode(r#"{"sub":"system:serviceaccount:a:admin"}"#);
        let head = input.split('.').next().unwrap();
        let forged = format!("{head}.{forged_claims}.{sig}");
        assert_eq!(key.verify(&forged), Err("invalid signature"));
        let other = SigningKey::generate().unwrap();
        assert_ne!(other.kid(), key.kid());
        assert_eq!(other.verify(&token), Err("invalid signature"));
        assert!(key.verify("a.b").is_err());
        assert!(key.verify("").is_err());
    }

    #[test]
    fn the_key_id_hashes_the_der_public_key() {
        let key = SigningKey::generate().unwrap();
        let der = key.public_key_der();
        assert_eq!(der.len(), 91);
        let digest = ring::digest::digest(&ring::digest::SHA256, &der);
        assert_eq!(key.kid(), URL_SAFE_NO_PAD.encode(digest));
        assert!(
            key.public_key_pem()
                .starts_with("-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE")
        );
    }
}
