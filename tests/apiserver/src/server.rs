//! The server's lifecycle: listen, serve TLS connections, stop (dropping every
//! connection and watch, as a crashed server would) and restart on the same
//! address with the same store.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use tokio::{
    net::{TcpListener, TcpSocket},
    sync::watch,
    task::{JoinHandle, JoinSet},
};
use tokio_rustls::TlsAcceptor;

use crate::{error::Error, http, kubelet_proxy::Kubelets, semantics, store::Store, tls::Pki};

/// How to start a [`TestApiServer`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Port 0 picks a free port; [`TestApiServer::restart`] reuses the one picked.
    pub listen: SocketAddr,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Events kept for watches to resume from; older resourceVersions get 410 Gone.
    pub history_limit: usize,
    /// Extra DNS names or IPs for the serving certificate (127.0.0.1, ::1 and
    /// localhost are always there).
    pub extra_sans: Vec<String>,
    /// Where to write the kubeconfig; a fresh temporary directory if `None`.
    pub kubeconfig: Option<PathBuf>,
    /// `--service-account-max-token-expiration`: TokenRequests asking for
    /// longer get this. Any value is taken (kube-apiserver wants at least an
    /// hour), so tests can see tokens rotate.
    pub max_token_expiration: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            bookmark_interval: Duration::from_secs(60),
            history_limit: 10_000,
            extra_sans: Vec::new(),
            kubeconfig: None,
            max_token_expiration: None,
        }
    }
}

struct Running {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// A Kubernetes API server for tests. Dropping it stops it.
pub struct TestApiServer {
    store: Arc<Store>,
    pki: Pki,
    acceptor: TlsAcceptor,
    addr: SocketAddr,
    options: Options,
    kubeconfig_path: PathBuf,
    ca_path: PathBuf,
    /// The temporary directory holding the kubeconfig, removed on drop.
    temp_dir: Option<PathBuf>,
    running: Mutex<Option<Running>>,
    requests: Arc<Mutex<Vec<http::Audit>>>,
    kubelets: Arc<Kubelets>,
}

fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    let listen = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        // Restart binds the same port while old connections sit in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(1024)
    };
    listen().map_err(|source| Error::Listen { addr, source })
}

impl TestApiServer {
    /// Generates a CA and certificates, writes the kubeconfig and starts serving.
    pub async fn start(options: Options) -> Result<Self, Error> {
        let pki = Pki::generate(&options.extra_sans)?;
        let acceptor = TlsAcceptor::from(pki.server_config()?);
        let listener = bind(options.listen)?;
        let addr = listener.local_addr().map_err(|source| Error::Listen {
            addr: options.listen,
            source,
        })?;
        let store = Arc::new(Store::new(options.history_limit));
        {
            let mut inner = store.lock();
            inner.set_root_ca(&pki.ca_pem);
            semantics::bootstrap(&mut inner);
        }
        let (kubeconfig_path, temp_dir) = match &options.kubeconfig {
            Some(p) => (p.clone(), None),
            None => {
                let dir = std::env::temp_dir().join(format!(
                    "weir-test-apiserver-{}",
                    uuid::Uuid::new_v4().simple()
                ));
                std::fs::create_dir_all(&dir).map_err(Error::TempDir)?;
                (dir.join("kubeconfig"), Some(dir))
            }
        };
        let kubelets = Arc::new(Kubelets::new(pki.kubelet_client_config()?));
        let server = TestApiServer {
            store,
            pki,
            acceptor,
            addr,
            options,
            ca_path: kubeconfig_path.with_file_name("ca.crt"),
            kubeconfig_path,
            temp_dir,
            running: Mutex::new(None),
            requests: Arc::default(),
            kubelets,
        };
        // The CA first: a process that waits for the kubeconfig may then
        // read both.
        if let Some(dir) = server
            .ca_path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            let _ = std::fs::create_dir_all(dir);
        }
        std::fs::write(&server.ca_path, &server.pki.ca_pem).map_err(|source| Error::Write {
            path: server.ca_path.clone(),
            source,
        })?;
        server.write_kubeconfig(&server.kubeconfig_path)?;
        server.serve(listener);
        Ok(server)
    }

    fn serve(&self, listener: TcpListener) {
        let (shutdown, rx) = watch::channel(false);
        let state = Arc::new(http::State {
            store: self.store.clone(),
            token: self.pki.token.clone(),
            service_account_key: self.pki.service_account_key.clone(),
            max_token_expiration: self.options.max_token_expiration,
            bookmark_interval: self.options.bookmark_interval,
            server_addr: self.addr.to_string(),
            shutdown: rx.clone(),
            requests: self.requests.clone(),
            kubelets: self.kubelets.clone(),
        });
        let task = tokio::spawn(accept_loop(listener, self.acceptor.clone(), state, rx));
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running { shutdown, task });
    }

    /// Every authenticated request so far as `METHOD path?query`, oldest
    /// first (an audit log, for tests that check what a client asked).
    pub fn requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|a| a.request.clone())
            .collect()
    }

    /// [`requests`](Self::requests) with who made each: `(user, request)`.
    /// The user is `weir-test-admin` for the client certificate,
    /// `weir-test-token` for the static token and
    /// `system:serviceaccount:NS:NAME` for a service-account token.
    pub fn requests_by_user(&self) -> Vec<(String, String)> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|a| (a.user.clone(), a.request.clone()))
            .collect()
    }

    /// The address actually listened on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://host:port`, with loopback in place of an unspecified address.
    pub fn url(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("https://{}", SocketAddr::new(ip, self.addr.port()))
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// `ca.crt` beside the kubeconfig: the PEM of [`ca_pem`](Self::ca_pem),
    /// which also signs the certificate this server shows kubelets (user
    /// `kube-apiserver-kubelet-client`, group `system:masters`). A kubelet
    /// takes it as `authentication.x509.clientCAFile`.
    pub fn ca_path(&self) -> &Path {
        &self.ca_path
    }

    /// Dials `node`'s kubelet at `addr` instead of the address its Node
    /// reports, as an egress selector would (tests run kubelets where this
    /// server cannot reach their addresses). The Node must still exist with
    /// an address, as upstream needs one; the latest route for a node wins.
    pub fn route_kubelet(&self, node: &str, addr: SocketAddr) {
        self.kubelets.route(node, addr);
    }

    /// The kubeconfig text: CA data, the server URL, a client certificate
    /// (current context) and a bearer token (context `weir-test-token`).
    pub fn kubeconfig(&self) -> String {
        self.pki.kubeconfig(&self.url())
    }

    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(path, self.kubeconfig())
        };
        write().map_err(|source| Error::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    pub fn token(&self) -> &str {
        &self.pki.token
    }

    /// The PEM of the CA that signs the serving certificate: what the
    /// kubeconfig trusts and every namespace's `kube-root-ca.crt` holds.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// The public half of the service-account signing key, PEM (what
    /// `--service-account-key-file` would hold), for checking tokens.
    pub fn service_account_public_key_pem(&self) -> String {
        self.pki.service_account_key.public_key_pem()
    }

    /// The `kid` in the header of the service-account tokens this server signs.
    pub fn service_account_key_id(&self) -> &str {
        self.pki.service_account_key.kid()
    }

    /// The `iss` of those tokens, also their default audience.
    pub fn service_account_issuer(&self) -> &'static str {
        crate::tokens::ISSUER
    }

    /// A kube-rs client built from the kubeconfig, over HTTPS with the client
    /// certificate, like any out-of-process client.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        self.client_for_context("weir-test").await
    }

    /// Like [`client`](Self::client) for a kubeconfig context (`weir-test-token`
    /// authenticates with the bearer token).
    pub async fn client_for_context(&self, context: &str) -> Result<kube::Client, Error> {
        // kube builds its rustls config from the process-wide provider, which
        // rustls cannot pick on its own if the build graph enables both ring
        // and aws-lc-rs; install the one this crate uses if none is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig())?;
        let options = kube::config::KubeConfigOptions {
            context: Some(context.to_string()),
            ..Default::default()
        };
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store.lock().rv()
    }

    /// Drops the whole event history, so every earlier resourceVersion is too
    /// old: watches and paged lists from them get 410 Gone.
    pub fn compact(&self) {
        self.store.lock().compact();
    }

    pub fn is_running(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Closes the listener and every open connection and watch; clients see
    /// connection resets and refused connections until [`restart`](Self::restart).
    pub async fn stop(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(r) = running {
            let _ = r.shutdown.send(true);
            let _ = r.task.await;
        }
    }

    /// Listens again on the same address with the same store, certificates and
    /// resourceVersion counter.
    pub async fn restart(&self) -> Result<(), Error> {
        if self.is_running() {
            return Err(Error::AlreadyRunning);
        }
        // The port may take a moment to come free after stop().
        let mut attempt = 0;
        let listener = loop {
            match bind(self.addr) {
                Ok(l) => break l,
                Err(e) if attempt >= 50 => return Err(e),
                Err(_) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        self.serve(listener);
        Ok(())
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        if let Some(r) = self
            .running
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = r.shutdown.send(true);
            r.task.abort();
        }
        if let Some(dir) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    state: Arc<http::State>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                conns.spawn(connection(tcp, acceptor.clone(), state.clone()));
            }
        }
    }
    drop(listener);
    // Aborting drops each connection, which closes its socket mid-stream.
    conns.shutdown().await;
}

async fn connection(tcp: tokio::net::TcpStream, acceptor: TlsAcceptor, state: Arc<http::State>) {
    let Ok(tls) = acceptor.accept(tcp).await else {
        return;
    };
    let client_cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .is_some_and(|c| !c.is_empty());
    let service = service_fn(move |req| http::handle(state.clone(), client_cert, req));
    // With upgrades, or exec, attach and port-forward could not be proxied.
    if let Err(e) = auto::Builder::new(TokioExecutor::new())
        .serve_connection_with_upgrades(TokioIo::new(tls), service)
        .await
    {
        tracing::debug!("connection ended: {e}");
    }
}
