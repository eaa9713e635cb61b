//! Authorization of the kubelet API, as the kubelet's `server/auth.go`: every
//! authenticated request becomes an attribute set on the `nodes` resource
//! named after this node (verb from the method, subresource from the path),
//! and `authorization.mode` decides it: AlwaysAllow, or Webhook with a
//! SubjectAccessReview to the API server, remembered for
//! `cacheAuthorizedTTL` / `cacheUnauthorizedTTL`.
use std::{collections::HashMap, sync::Mutex, time::Duration};

use hyper::Method;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use rustls::pki_types::CertificateDer;
use tokio::time::Instant;

use crate::config;

/// Who a client certificate says the client is, as the API server's x509
/// authenticator reads it: the subject's CN is the user, each O a group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    /// `None` for a certificate that does not parse; the TLS layer verified
    /// it already, so that does not happen in practice.
    pub fn from_certificate(cert: &CertificateDer<'_>) -> Option<User> {
        let (_, cert) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let subject = cert.subject();
        let name = subject
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .unwrap_or_default()
            .to_owned();
        let groups = subject
            .iter_organization()
            .filter_map(|a| a.as_str().ok())
            .map(str::to_owned)
            .collect();
        Some(User { name, groups })
    }
}

/// What one request asks to do, in the API server's terms.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub user: User,
    pub verb: &'static str,
    /// Always of `nodes`, named after this node.
    pub node: String,
    pub subresource: &'static str,
}

impl Attributes {
    pub fn new(user: User, method: &Method, path: &str, node: &str) -> Self {
        Attributes {
            user,
            verb: verb(method),
            node: node.to_owned(),
            subresource: subresource(path),
        }
    }

    /// The kubelet's 403 body (`http.Error` adds the newline).
    pub fn forbidden(&self) -> String {
        format!(
            "Forbidden (user={}, verb={}, resource=nodes, subresource={})\n",
            self.user.name, self.verb, self.subresource
        )
    }

    /// The kubelet's 500 body when the decision could not be made.
    pub fn error(&self) -> String {
        format!(
            "Authorization error (user={}, verb={}, resource=nodes, subresource={})\n",
            self.user.name, self.verb, self.subresource
        )
    }
}

/// The kubelet's `GetRequestVerb`: other methods get no verb, which no rule
/// grants.
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// The kubelet's path → subresource table, so that access can be granted
/// per area: reading stats or metrics need not allow exec or logs.
pub fn subresource(path: &str) -> &'static str {
    const AREAS: [(&str, &str); 5] = [
        ("/stats", "stats"),
        ("/metrics", "metrics"),
        ("/logs", "log"),
        ("/spec", "spec"),
        ("/checkpoint", "checkpoint"),
    ];
    AREAS
        .iter()
        .find(|(prefix, _)| is_subpath(path, prefix))
        .map_or("proxy", |(_, sub)| sub)
}

/// The kubelet's `isSubpath`: the path itself or below it, so `/metricsfoo`
/// is not under `/metrics`.
fn is_subpath(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// At most this many decisions are remembered (the webhook authorizer's
/// LRU size); each distinct user and subresource is one entry.
const CACHE_ENTRIES: usize = 8192;

/// Decisions remembered until their TTL runs out, on tokio's clock so tests
/// can move it.
#[derive(Debug)]
pub struct DecisionCache {
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    entries: HashMap<Attributes, (bool, Instant)>,
}

impl DecisionCache {
    pub fn new(authorized_ttl: Duration, unauthorized_ttl: Duration) -> Self {
        DecisionCache {
            authorized_ttl,
            unauthorized_ttl,
            entries: HashMap::new(),
        }
    }

    pub fn get(&mut self, attrs: &Attributes, now: Instant) -> Option<bool> {
        match self.entries.get(attrs) {
            Some(&(allowed, expires)) if now < expires => Some(allowed),
            Some(_) => {
                self.entries.remove(attrs);
                None
            }
            None => None,
        }
    }

    pub fn put(&mut self, attrs: Attributes, allowed: bool, now: Instant) {
        let ttl = if allowed {
            self.authorized_ttl
        } else {
            self.unauthorized_ttl
        };
        if ttl.is_zero() {
            return;
        }
        if self.entries.len() >= CACHE_ENTRIES {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= CACHE_ENTRIES {
                // Not an LRU: forgetting everything only costs reviews.
                self.entries.clear();
            }
        }
        self.entries.insert(attrs, (allowed, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("SubjectAccessReview: {0}")]
pub struct ReviewError(#[from] kube::Error);

/// Decides requests for `authorization.mode`.
pub enum Authorizer {
    AlwaysAllow,
    Webhook {
        client: kube::Client,
        cache: Mutex<DecisionCache>,
    },
}

impl Authorizer {
    pub fn webhook(client: kube::Client, config: &config::Authorization) -> Self {
        Authorizer::Webhook {
            client,
            cache: Mutex::new(DecisionCache::new(
                config.cache_authorized_ttl,
                config.cache_unauthorized_ttl,
            )),
        }
    }

    /// Whether `attrs` is allowed. Errors are not remembered: the next
    /// request asks again.
    pub async fn allowed(&self, attrs: &Attributes) -> Result<bool, ReviewError> {
        let (client, cache) = match self {
            Authorizer::AlwaysAllow => return Ok(true),
            Authorizer::Webhook { client, cache } => (client, cache),
        };
        let lock = || cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(allowed) = lock().get(attrs, Instant::now()) {
            return Ok(allowed);
        }
        let review = Api::<SubjectAccessReview>::all(client.clone())
            .create(&PostParams::default(), &review(attrs))
            .await?;
        let allowed = review.status.is_some_and(|s| s.allowed);
        lock().put(attrs.clone(), allowed, Instant::now());
        Ok(allowed)
    }
}

/// The review the kubelet's webhook authorizer sends.
pub fn review(attrs: &Attributes) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(attrs.user.name.clone()),
            groups: Some(attrs.user.groups.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(attrs.verb.to_owned()),
                version: Some("v1".to_owned()),
                resource: Some("nodes".to_owned()),
                subresource: Some(attrs.subresource.to_owned()),
                name: Some(attrs.node.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_the_kubelets_subresources() {
        for (path, want) in [
            ("/stats", "stats"),
            ("/stats/summary", "stats"),
            ("/metrics", "metrics"),
            ("/metrics/cadvisor", "metrics"),
            ("/metricsfoo", "proxy"),
            ("/logs/", "log"),
            ("/logs/syslog", "log"),
            ("/spec/", "spec"),
            ("/checkpoint/ns/pod/c", "checkpoint"),
            ("/pods", "proxy"),
            ("/containerLogs/ns/pod/c", "proxy"),
            ("/exec/ns/pod/c", "proxy"),
            ("/run/ns/pod/c", "proxy"),
            ("/healthz", "proxy"),
            ("/", "proxy"),
        ] {
            assert_eq!(subresource(path), want, "{path}");
        }
    }

    #[test]
    fn methods_map_to_verbs() {
        assert_eq!(verb(&Method::GET), "get");
        assert_eq!(verb(&Method::HEAD), "get");
        assert_eq!(verb(&Method::POST), "create");
        assert_eq!(verb(&Method::PUT), "update");
        assert_eq!(verb(&Method::PATCH), "patch");
        assert_eq!(verb(&Method::DELETE), "delete");
        assert_eq!(verb(&Method::OPTIONS), "");
    }

    fn attrs(user: &str, path: &str) -> Attributes {
        let user = User {
            name: user.into(),
            groups: vec!["g".into()],
        };
        Attributes::new(user, &Method::GET, path, "node-1")
    }

    #[test]
    fn forbidden_message_is_the_kubelets() {
        assert_eq!(
            attrs("bob", "/pods").forbidden(),
            "Forbidden (user=bob, verb=get, resource=nodes, subresource=proxy)\n"
        );
    }

    #[test]
    fn review_names_the_node_and_subresource() {
        let r = review(&attrs("bob", "/stats/summary"));
        assert_eq!(r.spec.user.as_deref(), Some("bob"));
        assert_eq!(r.spec.groups, Some(vec!["g".to_owned()]));
        let ra = r.spec.resource_attributes.unwrap();
        assert_eq!(ra.resource.as_deref(), Some("nodes"));
        assert_eq!(ra.subresource.as_deref(), Some("stats"));
        assert_eq!(ra.name.as_deref(), Some("node-1"));
        assert_eq!(ra.verb.as_deref(), Some("get"));
    }

    #[tokio::test(start_paused = true)]
    async fn decisions_expire_after_their_ttl() {
        let mut cache = DecisionCache::new(Duration::from_secs(300), Duration::from_secs(30));
        let (yes, no) = (attrs("alice", "/pods"), attrs("bob", "/pods"));
        let t0 = Instant::now();
        assert_eq!(cache.get(&yes, t0), None);
        cache.put(yes.clone(), true, t0);
        cache.put(no.clone(), false, t0);
        // Another subresource is another decision.
        assert_eq!(cache.get(&attrs("alice", "/stats/summary"), t0), None);

        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(cache.get(&yes, Instant::now()), Some(true));
        assert_eq!(cache.get(&no, Instant::now()), Some(false));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(cache.get(&no, Instant::now()), None, "denials last 30s");
        assert_eq!(cache.get(&yes, Instant::now()), Some(true));
        tokio::time::advance(Duration::from_secs(270)).await;
        assert_eq!(cache.get(&yes, Instant::now()), None, "grants last 5m");
        assert!(cache.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_ttl_remembers_nothing() {
        let mut cache = DecisionCache::new(Duration::ZERO, Duration::from_secs(30));
        cache.put(attrs("alice", "/pods"), true, Instant::now());
        assert!(cache.is_empty());
        cache.put(attrs("bob", "/pods"), false, Instant::now());
        assert_eq!(cache.len(), 1);
    }
}
