//! Service-account tokens for projected volumes, as the kubelet's token
//! manager (pkg/kubelet/token) keeps them: one TokenRequest per (pod,
//! service account, audience, lifetime), bound to the pod, renewed once 80%
//! of its life has passed (or after 24 hours), and dropped with the pod.
//!
//! Each token has a task of its own that requests it as soon as the pod
//! registers and then sleeps until it is due; a volume write reads the
//! latest token from here and never waits on the API server. A failed
//! request is retried with backoff while the previous token, if still
//! valid, keeps being served.
use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{Pod, ServiceAccount},
};
use kube::{Api, Client, api::PostParams};

use crate::pod::{PodSpec, ProjectedSource, TokenProjection, VolumeSource};

/// Renewal after this long whatever the lifetime (`maxTTL` in the kubelet).
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What identifies one token.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenKey {
    pub namespace: String,
    pub service_account: String,
    pub audience: Option<String>,
    pub expiration_seconds: i64,
    pub pod_name: String,
    pub pod_uid: String,
}

#[derive(Default)]
struct State {
    token: Option<(String, SystemTime)>,
    error: Option<String>,
}

struct Entry {
    state: Arc<Mutex<State>>,
    task: tokio::task::AbortHandle,
}

pub struct TokenManager {
    client: Client,
    entries: Mutex<HashMap<TokenKey, Entry>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TokenManager {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            entries: Mutex::default(),
        }
    }

    /// Starts fetching every token `pod`'s projected volumes ask for, and
    /// stops those of its previous version that it no longer asks for.
    pub fn register_pod(&self, pod: &Pod) {
        let keys = pod_tokens(pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut entries = lock(&self.entries);
        entries.retain(|k, e| {
            let keep = k.pod_uid != uid || keys.contains(k);
            if !keep {
                e.task.abort();
            }
            keep
        });
        for key in keys {
            entries.entry(key.clone()).or_insert_with(|| {
                let state = Arc::new(Mutex::new(State::default()));
                let task = tokio::spawn(keep_fresh(self.client.clone(), key, state.clone()));
                Entry {
                    state,
                    task: task.abort_handle(),
                }
            });
        }
    }

    pub fn unregister_pod(&self, uid: &str) {
        lock(&self.entries).retain(|k, e| {
            let keep = k.pod_uid != uid;
            if !keep {
                e.task.abort();
            }
            keep
        });
    }

    /// The current token for `key`, or why there is none.
    pub fn token(&self, key: &TokenKey) -> Result<String, String> {
        let entries = lock(&self.entries);
        let Some(e) = entries.get(key) else {
            return Err("the pod's tokens are not registered yet".into());
        };
        let st = lock(&e.state);
        match (&st.token, &st.error) {
            (Some((t, exp)), _) if SystemTime::now() < *exp => Ok(t.clone()),
            (_, Some(err)) => Err(err.clone()),
            (Some(_), None) => Err("the token expired and no new one was issued yet".into()),
            (None, None) => Err("waiting for the API server to issue a token".into()),
        }
    }

    /// How many tokens are kept, for tests.
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl TokenKey {
    /// The token `pod` asks for with `t`, under its service account
    /// (`default` when the spec names none, as admission would set it).
    pub fn for_pod(pod: &PodSpec, t: &TokenProjection) -> Self {
        let account = if pod.service_account_name.is_empty() {
            "default"
        } else {
            &pod.service_account_name
        };
        Self {
            namespace: pod.namespace.clone(),
            service_account: account.to_owned(),
            audience: t.audience.clone(),
            expiration_seconds: t.expiration_seconds,
            pod_name: pod.name.clone(),
            pod_uid: pod.uid.clone(),
        }
    }
}

/// The tokens `pod`'s projected volumes ask for, read through the same
/// conversion (and so the same defaults and checks) that writes them. A
/// pod whose spec is invalid starts no container and asks for none.
fn pod_tokens(pod: &Pod) -> BTreeSet<TokenKey> {
    let Ok(spec) = PodSpec::from_api(pod) else {
        return BTreeSet::new();
    };
    spec.volumes
        .iter()
        .filter_map(|v| match &v.source {
            VolumeSource::Projected { sources, .. } => Some(sources),
            _ => None,
        })
        .flatten()
        .filter_map(|s| match s {
            ProjectedSource::ServiceAccountToken(t) => Some(TokenKey::for_pod(&spec, t)),
            _ => None,
        })
        .collect()
}

/// Requests the token, then again whenever it is due, until aborted.
async fn keep_fresh(client: Client, key: TokenKey, state: Arc<Mutex<State>>) {
    let api: Api<ServiceAccount> = Api::namespaced(client, &key.namespace);
    let mut retry = RETRY_MIN;
    loop {
        match request(&api, &key).await {
            Ok((token, expires, lifetime)) => {
                let due = refresh_at(expires, lifetime);
                tracing::debug!(pod = %format!("{}/{}", key.namespace, key.pod_name), service_account = %key.service_account, ?lifetime, "service-account token issued");
                *lock(&state) = State {
                    token: Some((token, expires)),
                    error: None,
                };
                retry = RETRY_MIN;
                let wait = due
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", key.namespace, key.pod_name), service_account = %key.service_account, error = %e, "cannot get a service-account token; retrying");
                lock(&state).error = Some(e);
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

/// When a token issued with `lifetime` and expiring at `expires` is
/// renewed: at 80% of its life, or after [`MAX_AGE`], whichever is first
/// (the kubelet's `requiresRefresh`).
pub fn refresh_at(expires: SystemTime, lifetime: Duration) -> SystemTime {
    let issued = expires.checked_sub(lifetime).unwrap_or(expires);
    let at_80 = expires.checked_sub(lifetime / 5).unwrap_or(expires);
    at_80.min(issued + MAX_AGE)
}

/// One TokenRequest: the token, when it expires, and the lifetime the
/// server granted (it may cap what was asked).
async fn request(
    api: &Api<ServiceAccount>,
    key: &TokenKey,
) -> Result<(String, SystemTime, Duration), String> {
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: key.audience.iter().cloned().collect(),
            expiration_seconds: Some(key.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(key.pod_name.clone()),
                uid: Some(key.pod_uid.clone()),
            }),
        },
        ..Default::default()
    };
    let got = api
        .create_token_request(&key.service_account, &PostParams::default(), &tr)
        .await
        .map_err(|e| e.to_string())?;
    let status = got
        .status
        .ok_or_else(|| "the TokenRequest came back without a status".to_owned())?;
    let expires = SystemTime::UNIX_EPOCH
        + Duration::from_secs(
            u64::try_from(status.expiration_timestamp.0.as_second())
                .map_err(|_| "the token expires before 1970".to_owned())?,
        );
    let lifetime = got
        .spec
        .expiration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs)
        .or_else(|| expires.duration_since(SystemTime::now()).ok())
        .unwrap_or_default();
    Ok((status.token, expires, lifetime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_renewed_at_80_percent_or_after_a_day() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3600);
        assert_eq!(refresh_at(t0 + hour, hour), t0 + hour * 4 / 5);
        let year = Duration::from_secs(365 * 24 * 3600);
        assert_eq!(refresh_at(t0 + year, year), t0 + MAX_AGE);
    }

    #[test]
    fn a_pods_tokens_take_the_api_defaults() {
        let pod = |extra: Vec<serde_json::Value>| -> Pod {
            let mut sources = vec![
                serde_json::json!({"serviceAccountToken": {"path": "token"}}),
                serde_json::json!({"serviceAccountToken": {"path": "vault", "audience": "vault", "expirationSeconds": 7200}}),
            ];
            sources.extend(extra);
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                "spec": {"containers": [{"name": "c", "image": "i:1"}], "volumes": [
                    {"name": "a", "projected": {"sources": sources}}
                ]}
            }))
            .unwrap()
        };
        // Too short a lifetime: the spec check refuses the pod, which then
        // asks for no token at all.
        let short =
            serde_json::json!({"serviceAccountToken": {"path": "short", "expirationSeconds": 60}});
        assert!(pod_tokens(&pod(vec![short])).is_empty());
        let keys = pod_tokens(&pod(vec![]));
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(
            keys.iter()
                .all(|k| k.service_account == "default" && k.pod_uid == "u")
        );
        assert!(
            keys.iter()
                .any(|k| k.audience.is_none() && k.expiration_seconds == 3600)
        );
        assert!(keys.iter().any(|k| k.audience.as_deref() == Some("vault")));
    }
}
