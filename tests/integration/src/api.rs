//! The agent's API-server mode in tests: the faithful test API server, a
//! kube-rs client to drive it as any controller would, and a TCP relay that
//! can cut the agent off from the API server without stopping it.
use std::{
    io,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result};
use k8s_openapi::{
    NamespaceResourceScope,
    api::{core::v1::Service, discovery::v1::EndpointSlice},
};
use kube::{Api, Client, api::PostParams};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};
use weir_test_apiserver::{Options, TestApiServer};

use crate::{
    manifest::Cond,
    topology::{BACKEND_TCP_PORT, BACKEND_UDP_PORT},
};

/// A test API server on loopback with a client for it, and the runtime both
/// run on (the tests themselves are synchronous).
pub struct Cluster {
    pub rt: tokio::runtime::Runtime,
    pub server: TestApiServer,
    pub client: Client,
}

impl Cluster {
    pub fn start() -> Result<Self> {
        Self::start_with_names(&[])
    }

    /// Like [`Self::start`], with extra DNS names in the serving certificate,
    /// for clients that reach the server by a name.
    pub fn start_with_names(names: &[&str]) -> Result<Self> {
        Self::start_with(Options {
            extra_sans: names.iter().map(|n| (*n).to_owned()).collect(),
            ..Options::default()
        })
    }

    /// Like [`Self::start`] with server options of the test's own (the
    /// bookmark interval is always 1 s).
    pub fn start_with(options: Options) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let (server, client) = rt.block_on(async {
            let server = TestApiServer::start(Options {
                bookmark_interval: Duration::from_secs(1),
                ..options
            })
            .await?;
            let client = server.client().await?;
            anyhow::Ok((server, client))
        })?;
        Ok(Self { rt, server, client })
    }

    pub fn kubeconfig(&self) -> &Path {
        self.server.kubeconfig_path()
    }

    /// Writes a kubeconfig whose server is `url` instead (for the relay).
    pub fn kubeconfig_via(&self, url: &str, path: &Path) -> Result<PathBuf> {
        let text = self.server.kubeconfig().replace(&self.server.url(), url);
        std::fs::write(path, text)?;
        Ok(path.to_path_buf())
    }

    pub fn block_on<T>(&self, f: impl Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    pub fn api<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Creates `obj` or replaces the current version with it.
    pub fn upsert<K>(&self, api: &Api<K>, obj: Value) -> Result<K>
    where
        K: kube::Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    {
        let mut obj: K = serde_json::from_value(obj)?;
        let name = obj.meta().name.clone().context("object without a name")?;
        self.block_on(async {
            match api.get_opt(&name).await? {
                Some(cur) => {
                    obj.meta_mut().resource_version = cur.meta().resource_version.clone();
                    Ok(api.replace(&name, &PostParams::default(), &obj).await?)
                }
                None => Ok(api.create(&PostParams::default(), &obj).await?),
            }
        })
    }

    pub fn delete<K>(&self, api: &Api<K>, name: &str) -> Result<()>
    where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        self.block_on(api.delete(name, &Default::default()))?;
        Ok(())
    }

    /// A Service like [`crate::manifest::service`] with `spec` merged in.
    pub fn service(&self, name: &str, vip: &str, spec: Value) -> Result<Service> {
        let mut v = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": vip, "clusterIPs": [vip], "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": BACKEND_TCP_PORT},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": BACKEND_UDP_PORT},
            ]},
        });
        merge(&mut v["spec"], spec);
        self.upsert(&self.api::<Service>("default"), v)
    }

    /// An EndpointSlice for [`Self::service`]'s ports.
    pub fn slice(&self, name: &str, service: &str, eps: &[Ep]) -> Result<EndpointSlice> {
        let endpoints: Vec<Value> = eps.iter().map(Ep::to_json).collect();
        let v = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kubernetes.io/service-name": service},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time":
                             k8s_openapi::jiff::Timestamp::now().to_string()}},
            "addressType": "IPv4",
            "ports": [
                {"name": "http", "port": BACKEND_TCP_PORT, "protocol": "TCP"},
                {"name": "dns", "port": BACKEND_UDP_PORT, "protocol": "UDP"},
            ],
            "endpoints": endpoints,
        });
        self.upsert(&self.api::<EndpointSlice>("default"), v)
    }
}

/// One endpoint of a slice.
#[derive(Clone, Debug)]
pub struct Ep {
    pub ip: std::net::Ipv4Addr,
    pub cond: Cond,
    pub node: Option<String>,
    pub zones: Vec<String>,
}

impl Ep {
    pub fn new(ip: std::net::Ipv4Addr, cond: Cond) -> Self {
        Self {
            ip,
            cond,
            node: None,
            zones: Vec::new(),
        }
    }

    #[must_use]
    pub fn on(mut self, node: &str) -> Self {
        self.node = Some(node.into());
        self
    }

    #[must_use]
    pub fn zone(mut self, zone: &str) -> Self {
        self.zones.push(zone.into());
        self
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "addresses": [self.ip.to_string()],
            "conditions": {"ready": self.cond.ready, "serving": self.cond.serving,
                           "terminating": self.cond.terminating},
        });
        if let Some(n) = &self.node {
            v["nodeName"] = json!(n);
        }
        if !self.zones.is_empty() {
            let zones: Vec<Value> = self.zones.iter().map(|z| json!({"name": z})).collect();
            v["hints"] = json!({"forZones": zones});
        }
        v
    }
}

/// JSON merge as Helm merges values: maps key by key, anything else replaces.
pub fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// A loopback TCP relay to `upstream`. [`Relay::cut`] resets every relayed
/// connection and refuses new ones, a network partition between the agent and
/// the API server while both keep running; [`Relay::mend`] lets them through
/// again.
pub struct Relay {
    pub addr: SocketAddr,
    open: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    pub fn start(upstream: SocketAddr) -> Result<Self> {
        Self::serve(TcpListener::bind("127.0.0.1:0")?, upstream)
    }

    /// A relay listening on `127.0.0.1:port` inside network namespace `netns`
    /// to `upstream` on the root namespace's loopback: how a kubelet running
    /// in a node namespace reaches an API server on the test's loopback.
    /// Both ends are loopback addresses in their own namespace, so no packet
    /// ever leaves a loopback device.
    pub fn start_in_netns(
        netns: &crate::topology::Netns,
        port: u16,
        upstream: SocketAddr,
    ) -> Result<Self> {
        // Bind inside the namespace, keep connecting upstream (in `serve`)
        // on threads of this one.
        let listener = crate::topology::in_netns(&netns.path(), move || {
            Ok(TcpListener::bind(("127.0.0.1", port))?)
        })?;
        Self::serve(listener, upstream)
    }

    /// A relay on the root namespace's loopback to `127.0.0.1:port` inside
    /// network namespace `netns`: how the API server reaches a kubelet that
    /// listens on its node namespace's loopback (kube-apiserver's egress
    /// selector plays this part in clusters whose nodes it cannot dial).
    pub fn start_into_netns(netns: &crate::topology::Netns, port: u16) -> Result<Self> {
        let path = netns.path();
        let dial = move || -> io::Result<TcpStream> {
            crate::topology::in_netns(&path, move || Ok(TcpStream::connect(("127.0.0.1", port))?))
                .map_err(io::Error::other)
        };
        Self::serve_with(TcpListener::bind("127.0.0.1:0")?, dial)
    }

    fn serve(listener: TcpListener, upstream: SocketAddr) -> Result<Self> {
        Self::serve_with(listener, move || TcpStream::connect(upstream))
    }

    fn serve_with(
        listener: TcpListener,
        dial: impl Fn() -> io::Result<TcpStream> + Send + 'static,
    ) -> Result<Self> {
        let addr = listener.local_addr()?;
        let open = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (o, s, c) = (open.clone(), stop.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if !o.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = dial() else {
                    continue;
                };
                if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
                    let mut g = c.lock().unwrap_or_else(|e| e.into_inner());
                    g.push(c2);
                    g.push(s2);
                }
                pipe(client, server);
            }
        });
        Ok(Self {
            addr,
            open,
            conns,
            stop,
        })
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for c in self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    pub fn mend(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

fn pipe(a: TcpStream, b: TcpStream) {
    let copy = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
    };
    if let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) {
        copy(a, b2);
        copy(b, a2);
    }
}
