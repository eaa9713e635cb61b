//! API-server mode: the Node and its Lease, the pods bound to this node, and
//! the statuses (and mirror pods) the worker reports back.
//!
//! ```text
//!  start() ─┬─ node.rs   register/reconcile the Node, patch its status
//!           ├─ lease.rs  renew kube-node-lease/<node> every duration/4
//!           ├─ pods.rs   watch spec.nodeName=<node> ──PodEvent──▶ worker
//!           ├─ sink.rs   StatusSink: status patches, mirror pods, final deletes
//!           └─ objects.rs ConfigMaps/Secrets for volumes and env (worker lookups)
//! ```
//!
//! Every task retries with backoff and never panics: an API-server outage
//! only delays what the API sees, the pods keep running.
mod lease;
pub mod machine;
mod node;
pub mod objects;
mod pods;
mod sink;
pub mod tokens;

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Notify, mpsc, watch};

use crate::{config::Config, cri::RuntimeVersion, flow::PodEvent, health::NodeHealth};

pub use sink::ApiStatusSink;

/// The version this kubelet reports in nodeInfo.
pub const KUBELET_VERSION: &str = "v1.35.0-weir";
/// The namespace node Leases live in.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How long `start` waits for the first registration attempt.
const FIRST_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Overrides the node's InternalIP (tests, multi-homed hosts).
pub const NODE_IP_ENV: &str = "WEIR_KUBELET_NODE_IP";

/// Why API-server mode could not start, or an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API server refused the Node for good (invalid, forbidden): retrying
    /// would not help. Outages are retried in the background instead.
    #[error("registering node {node}: {source}")]
    Register { node: String, source: kube::Error },
    #[error("{verb} {kind} {name}: {source}")]
    Call {
        verb: &'static str,
        kind: &'static str,
        name: String,
        source: kube::Error,
    },
    #[error("{kind} {name}: still conflicting after {tries} tries")]
    Conflicts {
        kind: &'static str,
        name: String,
        tries: usize,
    },
    #[error("node {node} is not registered yet")]
    NotRegistered { node: String },
    #[error("{env}={value:?} is not an IP address")]
    BadNodeIp { env: &'static str, value: String },
}

impl ApiError {
    fn call(
        verb: &'static str,
        kind: &'static str,
        name: &str,
    ) -> impl FnOnce(kube::Error) -> Self {
        let name = name.to_owned();
        move |source| Self::Call {
            verb,
            kind,
            name,
            source,
        }
    }
}

/// The HTTP status of an API error, `None` for transport failures.
pub(crate) fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// What the machine cannot tell, and the timings tests shorten.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// InternalIP; `None` reads the default route's source address.
    pub node_ip: Option<IpAddr>,
    /// The filesystem measured for ephemeral-storage.
    pub root_dir: PathBuf,
    /// The kubelet's `nodeStatusReportFrequency` (5 m): the status is patched
    /// at least this often even when nothing changed.
    pub status_report_frequency: Duration,
    /// First and last retry delay of the Lease (the kubelet's 200 ms doubling
    /// to 7 s, component-helpers/apimachinery/lease/controller.go).
    pub lease_retry: (Duration, Duration),
    /// How often mirror pods are checked even without a watch event.
    pub mirror_resync: Duration,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            node_ip: None,
            root_dir: PathBuf::from("/var/lib/kubelet"),
            status_report_frequency: Duration::from_secs(300),
            lease_retry: (Duration::from_millis(200), Duration::from_secs(7)),
            mirror_resync: Duration::from_secs(10),
        }
    }
}

impl NodeOptions {
    /// The defaults, with [`NODE_IP_ENV`] applied.
    pub fn from_env() -> Result<Self, ApiError> {
        let mut o = Self::default();
        if let Ok(v) = std::env::var(NODE_IP_ENV)
            && !v.is_empty()
        {
            o.node_ip = Some(v.parse().map_err(|_| ApiError::BadNodeIp {
                env: NODE_IP_ENV,
                value: v,
            })?);
        }
        Ok(o)
    }
}

/// Doubling delays from `initial` up to `max`, each drawn from the upper
/// half of its step (so never above `max`): kubelets that lost the API
/// server together do not retry in lockstep when it returns.
///
/// backon adds a jitter of up to one more delay on top, so its bounds are
/// halved here to keep `max` a ceiling.
#[derive(Debug)]
pub(crate) struct Backoff {
    builder: backon::ExponentialBuilder,
    delays: backon::ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        use backon::BackoffBuilder as _;
        let builder = backon::ExponentialBuilder::default()
            .with_min_delay(initial / 2)
            .with_max_delay(max / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self {
            delays: builder.build(),
            builder,
            max,
        }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        // Endless without max_times; the fallback is never taken.
        self.delays.next().unwrap_or(self.max)
    }

    pub(crate) fn reset(&mut self) {
        use backon::BackoffBuilder as _;
        self.delays = self.builder.build();
    }
}

/// The pods bound to this node as last seen by the watch, by namespace/name;
/// mirror pods included (the sink needs their UIDs).
pub(crate) type PodCache = Mutex<BTreeMap<(String, String), Pod>>;

/// What the tasks share.
pub(crate) struct Shared {
    pub client: kube::Client,
    pub node_name: String,
    /// Set once the Node is registered (and again if it is recreated):
    /// Leases and mirror pods are owned by it.
    pub node_uid: watch::Sender<Option<String>>,
    pub pods: PodCache,
    /// Rung when a mirror pod changed or vanished, so the sink re-checks it.
    pub mirrors_changed: Notify,
    /// Becomes true once the first complete pod list reached the worker:
    /// from then on a sandbox of a pod not listed is an orphan.
    pub pods_listed: watch::Sender<bool>,
    pub options: NodeOptions,
}

impl Shared {
    pub(crate) fn node_uid(&self) -> Option<String> {
        self.node_uid.borrow().clone()
    }

    pub(crate) fn cached(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }
}

/// Registers the Node, starts the Lease, node status, pod watch and status
/// tasks, and returns the sink the worker publishes through. The node IP
/// comes from [`NODE_IP_ENV`] or the default route; the Ready condition
/// from `health`, whose checks the caller runs.
pub async fn start(
    client: kube::Client,
    config: &Config,
    node_name: String,
    runtime: RuntimeVersion,
    health: Arc<NodeHealth>,
    events: mpsc::Sender<PodEvent>,
) -> Result<Arc<ApiStatusSink>, ApiError> {
    let options = NodeOptions::from_env()?;
    let sink = start_with(client, config, node_name, runtime, health, events, options).await?;
    Ok(sink)
}

/// [`start`] with explicit [`NodeOptions`].
pub async fn start_with(
    client: kube::Client,
    config: &Config,
    node_name: String,
    runtime: RuntimeVersion,
    health: Arc<NodeHealth>,
    events: mpsc::Sender<PodEvent>,
    options: NodeOptions,
) -> Result<Arc<ApiStatusSink>, ApiError> {
    // Node names are DNS subdomains: the kubelet lowercases the hostname.
    let node_name = node_name.to_lowercase();
    let shared = Arc::new(Shared {
        client,
        node_name,
        node_uid: watch::channel(None).0,
        pods: Mutex::new(BTreeMap::new()),
        mirrors_changed: Notify::new(),
        pods_listed: watch::channel(false).0,
        options,
    });
    let mut node = node::NodeReporter::new(shared.clone(), config, &runtime, health);
    // One attempt up front so that a Node the API server refuses for good is
    // reported to the caller; an outage is retried by the node task.
    // Bounded, so that an unreachable server (packets dropped, not refused)
    // does not hold the worker back.
    let first = tokio::time::timeout(FIRST_REGISTRATION_TIMEOUT, node.register()).await;
    let registered = match first {
        Err(_) => {
            tracing::warn!("node registration is slow, continuing in the background");
            false
        }
        Ok(Ok(())) => true,
        Ok(Err(ApiError::Call { source, .. })) if is_permanent(&source) => {
            return Err(ApiError::Register {
                node: shared.node_name.clone(),
                source,
            });
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "node registration failed, retrying in the background");
            false
        }
    };
    tokio::spawn(node.run(registered));
    tokio::spawn(lease::run(shared.clone(), config.node_lease_duration));
    tokio::spawn(pods::run(shared.clone(), events));
    Ok(ApiStatusSink::start(shared))
}

/// A refusal no retry can fix (as opposed to an outage, a timeout, 409/429 or 5xx).
fn is_permanent(e: &kube::Error) -> bool {
    matches!(status_code(e), Some(400 | 401 | 403 | 422))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A Shared whose client points at a closed port: for logic that never
    /// reaches the network. Needs a tokio runtime (the client spawns).
    pub(crate) fn shared() -> Arc<Shared> {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
        Arc::new(Shared {
            client: kube::Client::try_from(config).expect("client"),
            node_name: "n1".to_owned(),
            node_uid: watch::channel(None).0,
            pods: Mutex::new(BTreeMap::new()),
            mirrors_changed: Notify::new(),
            pods_listed: watch::channel(false).0,
            options: NodeOptions::default(),
        })
    }

    #[test]
    fn backoff_doubles_to_max_with_jitter_and_resets() {
        let steps = [200, 400, 800, 1600, 3200, 6400, 7000, 7000];
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(7));
        let mut draws = Vec::new();
        for _ in 0..50 {
            b.reset();
            let ds: Vec<u128> = (0..8).map(|_| b.next_delay().as_millis()).collect();
            for (d, step) in ds.iter().zip(steps) {
                assert!((step / 2..=step).contains(d), "{ds:?}");
            }
            draws.push(ds);
        }
        draws.sort();
        draws.dedup();
        assert!(draws.len() > 40, "not jittered: {draws:?}");
    }

    #[test]
    fn permanent_errors() {
        let api = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        assert!(is_permanent(&api(403)) && is_permanent(&api(422)));
        assert!(!is_permanent(&api(409)) && !is_permanent(&api(503)));
        assert_eq!(status_code(&api(404)), Some(404));
    }
}
