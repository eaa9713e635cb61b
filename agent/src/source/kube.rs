//! The Kubernetes API source: watchers for Services and EndpointSlices in all
//! namespaces and for this agent's own Node, converted at the edge and fed to
//! the same store, planner and reconciler as the manifest source.
//!
//! When the API server goes away the watchers back off and retry; nothing is
//! sent, so the datapath stays exactly as it is. A shared probe wakes them
//! within a second of its return ([`reconnect`]). Back (or after a `410
//! Gone`) they relist, and [`tracker::Tracker`] turns the relist into the
//! difference against what the controller already has: no flush.
pub mod lister;
pub mod reconnect;
pub mod tracker;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, Config, Resource as _, ResourceExt as _,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::watcher::{self, Event},
};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use self::{
    reconnect::{Outage, Retry},
    tracker::{Outcome, Tracker},
};
use super::{Batch, SourceMsg};
use crate::{
    k8s::{
        self, LABEL_SERVICE_NAME, SliceOutcome,
        wire::{EndpointSlice, Service},
    },
    model::{NodeInfo, ServiceId, SliceId},
    report::{Reason, Report, Reports, Stage, events::Uids},
    store::Change,
    telemetry::{
        Health, Metrics,
        metrics::KindLabel,
        rest_client::{self, RestClientMetrics},
    },
};

/// kube-proxy's selector: Services (and their slices) that belong to another
/// proxy, and headless ones, are not even watched.
pub const SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
/// The EndpointSlice controller's stamp of when the change that produced a
/// slice happened; network programming latency is measured from it.
pub const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// The cluster autoscaler's taint on a node it is about to remove.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";
/// Events decoded ahead of the conversion: a page of a list and then some.
const WATCH_BUFFER: usize = 1024;
/// How often a persisting watch failure is logged again.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("reading kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error(
        "no kubeconfig given and no in-cluster service account found (pass --kubeconfig, or run in a pod)"
    )]
    InCluster(#[source] kube::config::InClusterError),
    #[error("--k8s-api-server {value:?} is not host:port")]
    ApiServer { value: String },
    #[error("building the API client")]
    Client(#[source] kube::Error),
}

/// How to reach the API server.
#[derive(Clone, Debug, Default)]
pub struct Connection {
    pub kubeconfig: Option<PathBuf>,
    /// `host:port` that replaces the configured server, as Cilium's
    /// `k8sServiceHost`/`k8sServicePort`: without kube-proxy the `kubernetes`
    /// ClusterIP only works once this agent has programmed it.
    pub api_server: Option<String>,
    /// Where the client's requests are counted (client-go's
    /// `rest_client_*`); none in tests that do not look.
    pub metrics: Option<RestClientMetrics>,
}

impl Connection {
    pub async fn client(&self) -> Result<Client, ConnectError> {
        let mut config = match &self.kubeconfig {
            Some(path) => {
                let kc =
                    Kubeconfig::read_from(path).map_err(|source| ConnectError::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?;
                Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                    .await
                    .map_err(|source| ConnectError::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?
            }
            // The service account's token and CA; the address comes from the
            // environment, or from --k8s-api-server below.
            None if self.api_server.is_some() => {
                Config::incluster_dns().map_err(ConnectError::InCluster)?
            }
            None => Config::incluster().map_err(ConnectError::InCluster)?,
        };
        if let Some(hp) = &self.api_server {
            config.cluster_url =
                api_server_url(hp).ok_or_else(|| ConnectError::ApiServer { value: hp.clone() })?;
        }
        let host = rest_client::host_label(&config.cluster_url);
        let builder = ClientBuilder::try_from(config).map_err(ConnectError::Client)?;
        Ok(match &self.metrics {
            Some(m) => builder.with_layer(&m.layer(host)).build(),
            None => builder.build(),
        })
    }
}

fn api_server_url(host_port: &str) -> Option<http::Uri> {
    let (host, port) = host_port.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    if host.is_empty() {
        return None;
    }
    format!("https://{host}:{port}").parse().ok()
}

pub struct KubeSource {
    pub client: Client,
    pub node: String,
    /// Kept as the Services are watched, for the Event writer.
    pub uids: Uids,
    /// Initial state from a watch with `sendInitialEvents` rather than lists.
    pub streaming_lists: bool,
    pub reports: Reports,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

// Boxed: a Node is over a kilobyte, and most items are slices.
enum Item {
    Service(Box<watcher::Result<Event<Service>>>),
    Slice(Box<watcher::Result<Event<EndpointSlice>>>),
    Node(Box<watcher::Result<Event<Node>>>),
}

impl Item {
    fn failure(&self) -> Option<reconnect::Failure> {
        let e = match self {
            Self::Service(r) => r.as_ref().as_ref().err(),
            Self::Slice(r) => r.as_ref().as_ref().err(),
            Self::Node(r) => r.as_ref().as_ref().err(),
        };
        e.map(reconnect::classify)
    }
}

impl KubeSource {
    /// Runs until the controller goes away.
    pub async fn run(self, tx: mpsc::Sender<SourceMsg>) {
        let Self {
            client,
            node,
            uids,
            streaming_lists,
            reports,
            metrics,
            health,
        } = self;
        let outage = Outage::default();
        let (svc, eps) = if streaming_lists {
            let cfg = watcher::Config::default()
                .labels(SELECTOR)
                .streaming_lists();
            (
                watcher(Api::<Service>::all(client.clone()), cfg.clone()).boxed(),
                watcher(Api::<EndpointSlice>::all(client.clone()), cfg).boxed(),
            )
        } else {
            (
                lister::list_watch::<Service>(client.clone(), SELECTOR).boxed(),
                lister::list_watch::<EndpointSlice>(client.clone(), SELECTOR).boxed(),
            )
        };
        let svc = svc.map(|e| Item::Service(Box::new(e)));
        let eps = eps.map(|e| Item::Slice(Box::new(e)));
        let nodes = watcher(
            Api::<Node>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={node}")),
        )
        .map(|e| Item::Node(Box::new(e)));
        // Each watcher in a task of its own: a page is decoded where its
        // watcher is polled, and one task for all of them decoded the
        // Services' pages and the slices' pages one after the other.
        let (items_tx, mut items) = mpsc::channel(WATCH_BUFFER);
        // Dropped when this returns, which stops the watchers and the probe.
        let mut watchers = tokio::task::JoinSet::new();
        for mut stream in [
            svc.boxed() as std::pin::Pin<Box<dyn Stream<Item = Item> + Send>>,
            eps.boxed(),
            nodes.boxed(),
        ] {
            let tx = items_tx.clone();
            let mut retry = Retry::new(outage.clone());
            watchers.spawn(async move {
                while let Some(item) = stream.next().await {
                    // Classified before it goes: the error is handled, and
                    // counted, by the state below.
                    let failure = item.failure();
                    if tx.send(item).await.is_err() {
                        return;
                    }
                    match failure {
                        // kube's watcher retries at the next poll; this is
                        // its backoff.
                        Some(f) => retry.failed(f).await,
                        None => retry.succeeded(),
                    }
                }
            });
        }
        watchers.spawn(async move { outage.probe(|| reconnect::readyz(&client)).await });
        drop(items_tx);
        let mut state = State {
            node,
            started: SystemTime::now(),
            services: Tracker::new(|id| Change::DeleteService(id.clone())),
            slices: Tracker::new(|id| Change::DeleteSlice(id.clone())),
            node_seen: false,
            synced_sent: false,
            uids,
            reports,
            metrics,
            health,
            last_error: HashMap::new(),
            reported_invalid: HashSet::default(),
        };
        while let Some(item) = items.recv().await {
            // What is already decoded goes out in one message: one per
            // object kept the controller waking (and the two threads
            // trading the core) 200k times for a 100k-Service list.
            let mut batch = Batch::default();
            state.handle_into(item, &mut batch);
            for _ in 1..WATCH_BUFFER {
                match items.try_recv() {
                    Ok(item) => state.handle_into(item, &mut batch),
                    Err(_) => break,
                }
            }
            for msg in batch.into_messages() {
                if tx.send(msg).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn watcher<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    kube::runtime::watcher(api, cfg)
}

struct State {
    node: String,
    started: SystemTime,
    services: Tracker<ServiceId>,
    slices: Tracker<SliceId>,
    node_seen: bool,
    synced_sent: bool,
    uids: Uids,
    reports: Reports,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    last_error: HashMap<&'static str, Instant>,
    /// Services this source reported invalid (or whose slice it did): only
    /// their next valid version is news. A recovery sent for every valid
    /// Service filled the report queue during a large list, and the
    /// failures queued behind it were dropped.
    reported_invalid: HashSet<ServiceId>,
}

impl State {
    /// One event's messages; for tests.
    #[cfg(test)]
    fn handle(&mut self, item: Item) -> Vec<SourceMsg> {
        let mut batch = Batch::default();
        self.handle_into(item, &mut batch);
        batch.into_messages()
    }

    fn handle_into(&mut self, item: Item, batch: &mut Batch) {
        match item {
            Item::Service(e) => match *e {
                Ok(ev) => self.on_service(ev, batch.changes()),
                Err(e) => self.watch_failed("Service", &e),
            },
            Item::Slice(e) => match *e {
                Ok(ev) => {
                    let (changes, triggers) = batch.both();
                    self.on_slice(ev, changes, triggers);
                }
                Err(e) => self.watch_failed("EndpointSlice", &e),
            },
            Item::Node(e) => match *e {
                Ok(ev) => self.on_node(ev, batch.changes()),
                Err(e) => self.watch_failed("Node", &e),
            },
        }
        if !self.synced_sent && self.services.synced() && self.slices.synced() {
            self.synced_sent = true;
            info!("API source: initial list of Services and EndpointSlices complete");
            batch.synced(true);
        }
    }

    fn watch_failed(&mut self, kind: &'static str, e: &watcher::Error) {
        self.metrics
            .watch_errors
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
        let now = Instant::now();
        let due = self
            .last_error
            .get(kind)
            .is_none_or(|t| now.duration_since(*t) >= ERROR_LOG_EVERY);
        if due {
            self.last_error.insert(kind, now);
            warn!(
                kind,
                "watching the API server failed ({e}); the datapath stays as it is, retrying with backoff"
            );
        } else {
            debug!(kind, "watch still failing: {e}");
        }
    }

    fn on_service(&mut self, ev: Event<Service>, out: &mut Vec<Change>) {
        match ev {
            Event::Init => self.services.init(),
            Event::InitDone => {
                let changes = self.services.init_done();
                for c in &changes {
                    if let Change::DeleteService(id) = c {
                        self.uids.set(id, None);
                    }
                }
                out.extend(changes);
            }
            Event::Apply(svc) | Event::InitApply(svc) => {
                let id = ServiceId::new(svc.namespace().unwrap_or_default(), svc.name_any());
                // One copy of the name for the tracker, the UIDs, the store
                // and the slices that name this Service.
                let id = self.services.shared(id);
                // Invalid ones too: their Events need it most.
                self.uids.set(&id, svc.metadata.uid.as_deref());
                let outcome = match k8s::service(&svc.into()) {
                    Ok(mut c) => {
                        debug_assert_eq!(c.value.id, id);
                        c.value.id = id.clone();
                        for w in &c.warnings {
                            debug!(service = %id, "{w}");
                        }
                        if self.reported_invalid.remove(&id) {
                            self.reports.send(Report::Recovered {
                                service: id.clone(),
                                stage: Stage::Validation,
                            });
                        }
                        Outcome::Upsert(Change::service(c.value))
                    }
                    Err(e) => {
                        self.invalid("Service", &id, Reason::InvalidService, e.to_string());
                        Outcome::Keep
                    }
                };
                out.extend(self.services.apply(id, outcome));
            }
            Event::Delete(svc) => {
                let id = ServiceId::new(svc.namespace().unwrap_or_default(), svc.name_any());
                self.uids.set(&id, None);
                self.reported_invalid.remove(&id);
                out.extend(self.services.delete(&id));
            }
        }
    }

    fn on_slice(
        &mut self,
        ev: Event<EndpointSlice>,
        out: &mut Vec<Change>,
        triggers: &mut Vec<(ServiceId, SystemTime)>,
    ) {
        match ev {
            Event::Init => self.slices.init(),
            Event::InitDone => out.extend(self.slices.init_done()),
            Event::Apply(eps) | Event::InitApply(eps) => {
                let id = SliceId::new(eps.namespace().unwrap_or_default(), eps.name_any());
                let id = self.slices.shared(id);
                let outcome = match k8s::slice(&eps) {
                    Ok(SliceOutcome::Ip(mut c)) => {
                        debug_assert_eq!(c.value.id, id);
                        c.value.id = id.clone();
                        c.value.service = self.services.shared(c.value.service);
                        if let Some(t) = trigger_time(&eps).filter(|t| *t > self.started) {
                            triggers.push((c.value.service.clone(), t));
                        }
                        Outcome::Upsert(Change::slice(c.value))
                    }
                    Ok(SliceOutcome::Ignored { reason }) => {
                        debug!(slice = %id, "{reason}");
                        Outcome::Withdraw
                    }
                    Err(e) => {
                        let service = eps
                            .labels()
                            .get(LABEL_SERVICE_NAME)
                            .map(|s| ServiceId::new(id.namespace(), s));
                        let msg = format!("EndpointSlice {id}: {e}");
                        match service {
                            Some(svc) => self.invalid(
                                "EndpointSlice",
                                &svc,
                                Reason::InvalidEndpointSlice,
                                msg,
                            ),
                            None => {
                                self.count_invalid("EndpointSlice");
                                warn!(slice = %id, "invalid EndpointSlice skipped: {e}");
                            }
                        }
                        Outcome::Keep
                    }
                };
                out.extend(self.slices.apply(id, outcome));
            }
            Event::Delete(eps) => {
                let id = SliceId::new(eps.namespace().unwrap_or_default(), eps.name_any());
                out.extend(self.slices.delete(&id));
            }
        }
    }

    fn on_node(&mut self, ev: Event<Node>, out: &mut Vec<Change>) {
        match ev {
            Event::Init => self.node_seen = false,
            Event::Apply(node) | Event::InitApply(node) => {
                self.node_seen = true;
                let zone = node.labels().get(LABEL_ZONE).cloned();
                let deleting = node.meta().deletion_timestamp.is_some();
                let draining = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == TAINT_TO_BE_DELETED));
                self.health.set_node_eligible(!(deleting || draining));
                // Addresses come from the node's interfaces, not the API: the
                // store keeps its own on a Node change. The Node's primary
                // IPs only select among them (--nodeport-addresses primary).
                out.push(Change::Node(NodeInfo {
                    name: self.node.clone(),
                    zone,
                    primary_ips: k8s::node::primary_ips(&node),
                    ..NodeInfo::default()
                }));
            }
            Event::Delete(_) => {
                self.health.set_node_eligible(false);
            }
            // A Node that is not there yet (an agent that starts before its
            // kubelet registers) is eligible and has no zone.
            Event::InitDone if !self.node_seen => {
                self.health.set_node_eligible(true);
                out.push(Change::Node(NodeInfo {
                    name: self.node.clone(),
                    ..NodeInfo::default()
                }));
            }
            Event::InitDone => {}
        }
    }

    fn invalid(&mut self, kind: &'static str, service: &ServiceId, reason: Reason, msg: String) {
        self.count_invalid(kind);
        warn!(%service, "invalid {kind}, keeping its last good version: {msg}");
        self.reported_invalid.insert(service.clone());
        self.reports.send(Report::Failed {
            service: service.clone(),
            reason,
            message: msg,
        });
    }

    fn count_invalid(&self, kind: &'static str) {
        self.metrics
            .invalid_objects
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }
}

fn trigger_time(eps: &EndpointSlice) -> Option<SystemTime> {
    let v = eps.annotations().get(TRIGGER_TIME)?;
    humantime::parse_rfc3339_weak(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(reports: Reports) -> State {
        State {
            node: "node-a".into(),
            started: SystemTime::now(),
            services: Tracker::new(|id| Change::DeleteService(id.clone())),
            slices: Tracker::new(|id| Change::DeleteSlice(id.clone())),
            node_seen: false,
            synced_sent: false,
            uids: Uids::default(),
            reports,
            metrics: Arc::default(),
            health: Arc::new(Health::new(Duration::from_secs(60))),
            last_error: HashMap::new(),
            reported_invalid: HashSet::default(),
        }
    }

    fn svc(name: &str, port: i64) -> Item {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}")},
            "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                     "ports": [{"port": port, "protocol": "TCP"}]},
        }))
        .unwrap();
        Item::Service(Box::new(Ok(Event::InitApply(svc))))
    }

    #[test]
    fn a_large_list_of_valid_services_leaves_room_for_a_failure_report() {
        let (reports, mut rx) = Reports::channel(16);
        let mut state = state(reports);
        state.handle(Item::Service(Box::new(Ok(Event::Init))));
        for i in 0..1000 {
            state.handle(svc(&format!("ok-{i}"), 80));
        }
        state.handle(svc("bad", 70_000));
        let Ok(Report::Failed {
            service, reason, ..
        }) = rx.try_recv()
        else {
            panic!("the failure was not reported first");
        };
        assert_eq!((service.name(), reason), ("bad", Reason::InvalidService));
        // Fixed, it is reported recovered, once.
        state.handle(svc("bad", 80));
        state.handle(svc("bad", 81));
        assert!(matches!(
            rx.try_recv(),
            Ok(Report::Recovered {
                stage: Stage::Validation,
                ..
            })
        ));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn api_server_override_is_host_and_port() {
        assert_eq!(
            api_server_url("10.0.0.1:6443").unwrap().to_string(),
            "https://10.0.0.1:6443/"
        );
        assert_eq!(
            api_server_url("api.example.com:443").unwrap().host(),
            Some("api.example.com")
        );
        assert!(api_server_url("10.0.0.1").is_none());
        assert!(api_server_url(":6443").is_none());
        assert!(api_server_url("h:notaport").is_none());
    }
}
