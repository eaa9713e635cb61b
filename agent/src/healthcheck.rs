//! healthCheckNodePort servers for `externalTrafficPolicy: Local` Services.
//!
//! A cloud load balancer in front of an eTP=Local Service must only send
//! traffic to nodes that have a local endpoint, because such nodes drop (rather
//! than forward) traffic for which they have none. It learns which ones from
//! an HTTP probe on the Service's `healthCheckNodePort`, answered by the node's
//! proxy. This is kube-proxy's `ServiceHealthServer` (pkg/proxy/healthcheck):
//! one listener per port, any method and path, the same JSON body and headers,
//! 200 with local endpoints and 503 without, so load balancers configured for
//! kube-proxy keep working unchanged.
//!
//! Listeners come and go with the Services. A port that cannot be bound
//! (another process holds it, e.g. kube-proxy when both run on one node) is
//! retried every few seconds and reported where the Service's owner looks: a
//! Warning Event on the Service with kube-proxy's reason
//! (`FailedToStartServiceHealthcheck`), a gauge per listener and the log. It
//! never touches the agent's own health: one Service's port must not take
//! the whole node out of every load balancer. Next to kube-proxy, which
//! serves these ports itself, the agent runs with
//! `--health-check-node-ports=false` and has no listeners at all.
use std::{
    collections::HashMap,
    convert::Infallible,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use http_body_util::Full;
use hyper::{Response, StatusCode, body::Bytes, header};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, runtime::Handle, task::JoinHandle};
use tracing::{debug, info, warn};

use crate::{
    model::ServiceId,
    report::{Reason, Report, Reports, Stage},
    telemetry::{
        Health, Metrics,
        conns::{self, Conns},
        metrics::ListenerLabel,
    },
};

/// How long to wait before binding a port again: the holder may be an old
/// agent or kube-proxy still shutting down.
const BIND_RETRY: Duration = Duration::from_secs(5);

/// Where listeners that cannot bind are reported.
#[derive(Clone, Default)]
pub struct Sink {
    pub reports: Reports,
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink").finish_non_exhaustive()
    }
}

/// The healthCheckNodePort listeners of this node.
///
/// [`HealthChecks::default`] is inert (it remembers nothing and binds
/// nothing), which is what unit tests of the controller want.
#[derive(Debug, Default)]
pub struct HealthChecks {
    server: Option<Server>,
}

#[derive(Debug)]
struct Server {
    /// Addresses every port is served on (0.0.0.0 and :: in the agent).
    bind: Vec<IpAddr>,
    rt: Handle,
    /// The agent's own health: an unhealthy agent reports
    /// `serviceProxyHealthy: false` and 503, as kube-proxy ≥ 1.28 does.
    health: Arc<Health>,
    sink: Sink,
    services: Mutex<HashMap<ServiceId, Served>>,
    /// Open connections of every listener together: one Service's port
    /// flooded with idle connections costs no more than the budget.
    conns: Arc<Conns>,
}

/// One Service's listeners. Dropping it stops them and closes their
/// connections (each listener task owns its connections' tasks).
#[derive(Debug)]
struct Served {
    port: u16,
    state: Arc<ServiceHealth>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What a probe of one Service reads; shared with its listeners so a new
/// endpoint count needs no restart.
#[derive(Debug)]
struct ServiceHealth {
    id: ServiceId,
    local_endpoints: AtomicUsize,
    /// Listeners (0.0.0.0 and `[::]`) currently reported as unbound: the
    /// Service's failure is withdrawn only when the last one recovers.
    unbound_listeners: AtomicUsize,
    proxy: Arc<Health>,
    sink: Sink,
}

impl HealthChecks {
    /// Health checks served on 0.0.0.0 and `[::]`, as kube-proxy does with
    /// its default (empty) `--nodeport-addresses`. `health` is the agent's
    /// own (what `/healthz` reports); ports that cannot be bound go to `sink`.
    pub fn serve_all(health: Arc<Health>, sink: Sink) -> Self {
        Self::serve(
            vec![
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            ],
            health,
            sink,
        )
    }

    /// Health checks served on each of `bind`. Must be called from inside a
    /// Tokio runtime, which then runs the listeners.
    pub fn serve(bind: Vec<IpAddr>, health: Arc<Health>, sink: Sink) -> Self {
        Self {
            server: Some(Server {
                bind,
                rt: Handle::current(),
                health,
                sink,
                services: Mutex::default(),
                conns: Conns::new(conns::HEALTH_CHECK_CONNS),
            }),
        }
    }

    /// Whether this serves anything ([`HealthChecks::default`] does not).
    pub const fn is_serving(&self) -> bool {
        self.server.is_some()
    }

    /// The Service wants a health check on `node_port` reporting `local_endpoints`.
    pub fn set(&self, svc: &ServiceId, node_port: u16, local_endpoints: usize) {
        let Some(server) = &self.server else {
            return;
        };
        if node_port == 0 {
            // Not allocated (yet): nothing a load balancer could probe.
            self.remove(svc);
            return;
        }
        let mut services = server.lock();
        if let Some(s) = services.get(svc)
            && s.port == node_port
        {
            s.state
                .local_endpoints
                .store(local_endpoints, Ordering::Relaxed);
            return;
        }
        // New Service or a changed port: the old listeners (if any) close
        // before the new ones bind, so a Service moving to a port another
        // one freed in the same sync is not refused.
        services.remove(svc);
        let state = Arc::new(ServiceHealth {
            id: svc.clone(),
            local_endpoints: AtomicUsize::new(local_endpoints),
            unbound_listeners: AtomicUsize::new(0),
            proxy: server.health.clone(),
            sink: server.sink.clone(),
        });
        let tasks = server
            .bind
            .iter()
            .map(|ip| {
                let addr = SocketAddr::new(*ip, node_port);
                server
                    .rt
                    .spawn(listen(addr, state.clone(), server.conns.clone()))
            })
            .collect();
        services.insert(
            svc.clone(),
            Served {
                port: node_port,
                state,
                tasks,
            },
        );
    }

    /// The Service no longer has a health check.
    pub fn remove(&self, svc: &ServiceId) {
        if let Some(server) = &self.server
            && let Some(s) = server.lock().remove(svc)
        {
            info!(service = %svc, port = s.port, "stopped health check server");
        }
    }
}

impl Server {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ServiceId, Served>> {
        // The map stays consistent even if a holder panicked: every change is
        // a single insert or remove.
        self.services.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Binds `addr` (retrying while it is taken) and answers probes until
/// aborted, within the connection budget all health checks share.
async fn listen(addr: SocketAddr, state: Arc<ServiceHealth>, budget: Arc<Conns>) {
    let mut unbound = Unbound {
        state: &state,
        addr,
        reported: false,
    };
    let listener = loop {
        match bind(addr) {
            Ok(l) => break l,
            // No IPv6 on this node: nothing will ever probe [::] either.
            Err(e) if addr.is_ipv6() && e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
                debug!(%addr, "no IPv6 here; health check served on IPv4 only");
                return;
            }
            Err(e) => {
                unbound.failed(&e);
                tokio::time::sleep(BIND_RETRY).await;
            }
        }
    };
    drop(unbound);
    info!(service = %state.id, %addr, "serving health check");
    // The loop owns the connections: when the listener task is aborted
    // (Service removed, port moved) every keep-alive connection closes.
    let what = format!("health check {addr}");
    conns::accept_loop(listener, &what, budget, move |stream, peer| {
        let state = state.clone();
        async move {
            let svc = hyper::service::service_fn(move |_req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(answer(&state)) }
            });
            if let Err(e) = conns::http1()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                debug!(%peer, "health check connection: {e}");
            }
        }
    })
    .await;
}

/// A listener that has not bound yet. Once it reported a failure, dropping it
/// (bound at last, or aborted because the Service went) withdraws the report.
struct Unbound<'a> {
    state: &'a ServiceHealth,
    addr: SocketAddr,
    reported: bool,
}

impl Unbound<'_> {
    fn label(&self) -> ListenerLabel {
        ListenerLabel {
            namespace: self.state.id.namespace().to_owned(),
            service: self.state.id.name().to_owned(),
            address: self.addr.to_string(),
        }
    }

    fn failed(&mut self, e: &io::Error) {
        let (id, port) = (&self.state.id, self.addr.port());
        warn!(service = %id, port, addr = %self.addr, "cannot serve health check: {e}; retrying in {BIND_RETRY:?}");
        let sink = &self.state.sink;
        sink.metrics
            .health_check_unbound
            .get_or_create(&self.label())
            .set(1);
        if !self.reported {
            self.state.unbound_listeners.fetch_add(1, Ordering::SeqCst);
        }
        self.reported = true;
        // Without the address: the IPv4 and IPv6 listeners of one port fail
        // alike, and the Event filter keeps one Event per distinct message.
        let holder = if e.kind() == io::ErrorKind::AddrInUse {
            "; another process holds the port (kube-proxy, if it still runs on this node: \
             there, run the agent with --health-check-node-ports=false)"
        } else {
            ""
        };
        sink.reports.send(Report::Failed {
            service: id.clone(),
            reason: Reason::FailedToStartServiceHealthcheck,
            message: format!(
                "healthCheckNodePort {port} cannot be served: {e}{holder}. Load balancers \
                 probing this node for the Service get no answer; retrying every {}s",
                BIND_RETRY.as_secs()
            ),
        });
    }
}

impl Drop for Unbound<'_> {
    fn drop(&mut self) {
        if self.reported {
            let sink = &self.state.sink;
            sink.metrics.health_check_unbound.remove(&self.label());
            // The other family's listener may still fail: only the last
            // listener to recover withdraws the Service's report.
            if self.state.unbound_listeners.fetch_sub(1, Ordering::SeqCst) == 1 {
                sink.reports.send(Report::Recovered {
                    service: self.state.id.clone(),
                    stage: Stage::HealthCheck,
                });
            }
        }
    }
}

/// A listening socket on `addr`. IPv6 listeners are v6-only, because the IPv4
/// wildcard has its own listener and a dual-stack one would collide with it.
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    // As Go's net.Listen: a restarted agent rebinds despite TIME_WAIT sockets.
    sock.set_reuse_address(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    TcpListener::from_std(sock.into())
}

/// kube-proxy's answer, to the byte: the body is its dedented template.
/// 200 only with local endpoints and a healthy agent (kube-proxy ≥ 1.28:
/// a proxy that cannot program its rules, or whose node is going away, must
/// not attract load-balancer traffic).
fn answer(state: &ServiceHealth) -> Response<Full<Bytes>> {
    let count = state.local_endpoints.load(Ordering::Relaxed);
    let s = state.proxy.status();
    let healthy = s.healthy && s.node_eligible;
    let code = if count > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .header("X-Content-Type-Options", "nosniff")
        // kube-proxy ≥ 1.28 also tells weighted load balancers how much
        // traffic this node can take.
        .header("X-Load-Balancing-Endpoint-Weight", count.to_string())
        .body(Full::new(Bytes::from(body(&state.id, count, healthy))))
        .unwrap_or_default()
}

fn body(id: &ServiceId, count: usize, healthy: bool) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned());
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {count},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
        q(id.namespace()),
        q(id.name()),
    )
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    fn synced() -> Arc<Health> {
        let h = Arc::new(Health::new(Duration::from_secs(60)));
        h.updated(true);
        h
    }

    fn free_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    /// One HTTP/1.0 GET; the whole response as text, or None if refused.
    async fn get(port: u16) -> Option<String> {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"GET /anything HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    }

    async fn get_eventually(port: u16) -> String {
        for _ in 0..100 {
            if let Some(r) = get(port).await {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("nothing listens on {port}");
    }

    #[test]
    fn body_is_kube_proxys_template() {
        assert_eq!(
            body(&ServiceId::new("ns", "web"), 2, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&body(&ServiceId::new("a", "b"), 0, false)).unwrap();
        assert_eq!(v["service"]["name"], "b");
        assert_eq!(v["localEndpoints"], 0);
        assert_eq!(v["serviceProxyHealthy"], false);
    }

    #[tokio::test]
    async fn default_is_inert() {
        let hc = HealthChecks::default();
        assert!(!hc.is_serving());
        let port = free_port();
        hc.set(&ServiceId::new("a", "b"), port, 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(get(port).await.is_none(), "nothing listens on {port}");
        hc.remove(&ServiceId::new("a", "b"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_counts_and_stops() {
        let hc = HealthChecks::serve(
            vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            synced(),
            Sink::default(),
        );
        let id = ServiceId::new("default", "lb");
        let port = free_port();

        hc.set(&id, port, 0);
        let r = get_eventually(port).await;
        assert!(r.starts_with("HTTP/1.0 503"), "{r}");
        assert!(r.contains("content-type: application/json"), "{r}");
        assert!(r.contains("x-content-type-options: nosniff"), "{r}");
        assert!(r.contains("\"localEndpoints\": 0"), "{r}");

        // Same port, new count: the listener stays, the answer changes.
        hc.set(&id, port, 3);
        let r = get(port).await.unwrap();
        assert!(r.starts_with("HTTP/1.0 200"), "{r}");
        assert!(r.contains("\"localEndpoints\": 3"), "{r}");
        assert!(r.contains("\"namespace\": \"default\""), "{r}");

        // A new port: the old one closes.
        let port2 = free_port();
        hc.set(&id, port2, 1);
        assert!(get_eventually(port2).await.starts_with("HTTP/1.0 200"));
        refused_eventually(port).await;

        hc.remove(&id);
        refused_eventually(port2).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unhealthy_agent_fails_every_check() {
        let health = synced();
        let hc = HealthChecks::serve(
            vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            health.clone(),
            Sink::default(),
        );
        let id = ServiceId::new("default", "sick");
        let port = free_port();
        hc.set(&id, port, 2);
        assert!(get_eventually(port).await.starts_with("HTTP/1.0 200"));
        // The node is being deleted: /healthz fails, so do the Services.
        health.set_node_eligible(false);
        let r = get(port).await.unwrap();
        assert!(r.starts_with("HTTP/1.0 503"), "{r}");
        assert!(r.contains("\"serviceProxyHealthy\": false"), "{r}");
        assert!(r.contains("\"localEndpoints\": 2"), "{r}");
        health.set_node_eligible(true);
        assert!(get(port).await.unwrap().starts_with("HTTP/1.0 200"));
        hc.remove(&id);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn removing_a_service_closes_its_keepalive_connections() {
        let hc = HealthChecks::serve(
            vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            synced(),
            Sink::default(),
        );
        let id = ServiceId::new("default", "ka");
        let port = free_port();
        hc.set(&id, port, 1);
        get_eventually(port).await;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        hc.remove(&id);
        // The server side closes: the read ends (EOF or reset) promptly.
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0) | Err(_))), "{closed:?}");
    }

    async fn refused_eventually(port: u16) {
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{port} still listens");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn busy_port_is_reported_on_the_service_not_the_node() {
        let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = blocker.local_addr().unwrap().port();
        let (reports, mut rx) = Reports::channel(16);
        let sink = Sink {
            reports,
            metrics: Arc::default(),
        };
        let health = synced();
        let hc = HealthChecks::serve(
            vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            health.clone(),
            sink.clone(),
        );
        let id = ServiceId::new("default", "busy");
        hc.set(&id, port, 1);

        let report = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a report")
            .unwrap();
        let Report::Failed {
            service,
            reason,
            message,
        } = report
        else {
            panic!("{report:?}");
        };
        assert_eq!(service, id);
        assert_eq!(reason, Reason::FailedToStartServiceHealthcheck);
        assert!(
            message.contains(&format!("healthCheckNodePort {port}")),
            "{message}"
        );
        assert!(
            message.contains("--health-check-node-ports=false"),
            "{message}"
        );
        let gauge = format!(
            "weir_health_check_node_port_unbound{{namespace=\"default\",service=\"busy\",address=\"127.0.0.1:{port}\"}} 1"
        );
        assert!(sink.metrics.encode().contains(&gauge), "{gauge}");
        // The node stays healthy, and the other Service gets its listener.
        assert!(health.status().healthy);
        let other = free_port();
        hc.set(&ServiceId::new("default", "free"), other, 1);
        assert!(get_eventually(other).await.starts_with("HTTP/1.0 200"));

        // The Service goes: its failure is withdrawn with it.
        hc.remove(&id);
        let recovered = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a report")
            .unwrap();
        assert_eq!(
            recovered,
            Report::Recovered {
                service: id,
                stage: Stage::HealthCheck
            }
        );
        assert!(!sink.metrics.encode().contains("service=\"busy\""));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn v6_listener_is_v6_only() {
        // Both wildcards on one port must coexist (needs IPv6 on the host).
        let port = free_port();
        let v4 = bind(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port));
        let v6 = bind(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port));
        if let Err(e) = &v6
            && e.raw_os_error() == Some(libc::EAFNOSUPPORT)
        {
            return;
        }
        v4.unwrap();
        v6.unwrap();
    }
}
