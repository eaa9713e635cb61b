//! The kubelet's HTTP endpoints:
//!
//! - `/healthz` in plain HTTP on `healthzBindAddress:healthzPort`;
//! - the kubelet API on `address:port` over HTTPS (`/pods`, `/containerLogs`,
//!   `/exec`, `/attach`, `/portForward`, `/healthz`), where every request must carry a client certificate signed
//!   by `authentication.x509.clientCAFile` and anonymous ones get 401, and is
//!   then authorized by `authorization.mode` ([`authz`]);
//! - `/pods` and `/healthz` in plain HTTP, without authentication, on
//!   `address:readOnlyPort` when that port is set.
use std::{
    convert::Infallible, fmt, io, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration,
};

use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    task::{JoinHandle, JoinSet},
};
use tokio_rustls::TlsAcceptor;

use crate::{
    config::{AuthorizationMode, Config, WebhookWithoutApiServer},
    flow::PodsView,
};

pub mod authz;
mod follow;
mod logs;
mod routes;
mod streaming;
mod tls;

pub use streaming::StreamRuntime;

/// The CRI log reader for the fuzz targets (fuzz/), which cannot reach the
/// private `logs` module; nothing else uses it.
#[doc(hidden)]
pub mod fuzzing {
    use std::io::Cursor;

    /// What one `/containerLogs` request returns, and what it asked for.
    pub struct Logs {
        /// As the route reads it: at most `max` bytes of the file.
        pub read: Vec<u8>,
        /// The whole file converted at once, with the same options.
        pub whole: Vec<u8>,
        pub tail_lines: Option<usize>,
        pub limit_bytes: Option<usize>,
    }

    /// `/containerLogs?{query}` over a log file holding `file`; `None` when
    /// the route would refuse the query.
    pub fn container_logs(query: &str, file: &[u8], max: u64) -> Option<Logs> {
        let opts = super::logs::LogOptions::from_query(Some(query)).ok()?;
        let len = file.len() as u64;
        let read = super::logs::read_log(&mut Cursor::new(file), len, &opts, max)
            .expect("reading from memory cannot fail");
        Some(Logs {
            read,
            whole: super::logs::to_plain(file, &opts),
            tail_lines: opts.tail_lines,
            limit_bytes: opts.limit_bytes,
        })
    }
}

/// A client that opens a connection and never finishes the TLS handshake or
/// its request headers must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Which of the kubelet's listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `healthzBindAddress:healthzPort`, plain HTTP.
    Healthz,
    /// `address:port`, HTTPS with client certificates.
    Api,
    /// `address:readOnlyPort`, plain HTTP without authentication.
    ReadOnly,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Endpoint::Healthz => "healthz endpoint (healthzBindAddress:healthzPort)",
            Endpoint::Api => "kubelet API (address:port)",
            Endpoint::ReadOnly => "read-only endpoint (address:readOnlyPort)",
        })
    }
}

/// Which PEM file of the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PemFile {
    /// `authentication.x509.clientCAFile`
    ClientCa,
    /// `tlsCertFile`
    Certificate,
    /// `tlsPrivateKeyFile`
    PrivateKey,
}

impl fmt::Display for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PemFile::ClientCa => "authentication.x509.clientCAFile",
            PemFile::Certificate => "tlsCertFile",
            PemFile::PrivateKey => "tlsPrivateKeyFile",
        })
    }
}

/// Why the endpoints could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {address} for the {endpoint}: {source}")]
    Bind {
        endpoint: Endpoint,
        address: SocketAddr,
        source: io::Error,
    },
    #[error("{file} {}: {source}", path.display())]
    Pem {
        file: PemFile,
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{} {}: {source}", PemFile::ClientCa, path.display())]
    ClientCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("{} {}: {source}", PemFile::ClientCa, path.display())]
    ClientVerifier {
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
    #[error("serving certificate {} with key {}: {source}", cert.display(), key.display())]
    ServingCertificate {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("cannot self-sign a serving certificate for {hostname:?}: {source}")]
    SelfSign {
        hostname: String,
        source: rcgen::Error,
    },
    #[error("TLS setup: {0}")]
    Tls(#[source] rustls::Error),
    #[error(transparent)]
    Authorization(#[from] WebhookWithoutApiServer),
}

/// The API server the Webhook authorizer asks, and the node it asks about.
#[derive(Clone)]
pub struct ApiServer {
    pub client: kube::Client,
    pub node_name: String,
}

/// What the API listener's connections share.
struct ApiAccess {
    authorizer: authz::Authorizer,
    /// The `nodes` object requests are authorized against.
    node_name: String,
    /// What `/exec`, `/attach` and `/portForward` ask for streaming URLs.
    runtime: Option<Arc<dyn StreamRuntime>>,
}

/// Where each listener ended up (port 0 in [`Config`] binds an ephemeral port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub api: SocketAddr,
    pub healthz: Option<SocketAddr>,
    pub read_only: Option<SocketAddr>,
}

/// The running listeners. Dropping this stops them (and their connections);
/// [`Server::detach`] lets them run for the life of the runtime instead.
pub struct Server {
    endpoints: Endpoints,
    tasks: Vec<JoinHandle<()>>,
}

/// Binds every configured endpoint and serves them in the background for the
/// life of the tokio runtime; returns once they all listen.
pub async fn serve(
    config: Config,
    pods: Arc<dyn PodsView>,
    runtime: Arc<dyn StreamRuntime>,
    api_server: Option<ApiServer>,
) -> Result<(), ServerError> {
    let server = Server::start_streaming(&config, pods, Some(runtime), api_server).await?;
    let e = server.endpoints();
    tracing::info!(
        api = %e.api,
        healthz = ?e.healthz,
        read_only = ?e.read_only,
        "kubelet endpoints listening"
    );
    server.detach();
    Ok(())
}

impl Server {
    /// Binds and starts the endpoints. Unlike the configuration file, a
    /// [`Config`] built in code may say port 0 (including `Some(0)` for
    /// `healthz_port` and `read_only_port`): the port is then ephemeral, and
    /// [`Server::endpoints`] tells which.
    ///
    /// Without an API server, as standalone: see
    /// [`crate::config::Authorization::mode_for`].
    pub async fn start(config: &Config, pods: Arc<dyn PodsView>) -> Result<Self, ServerError> {
        Self::start_with(config, pods, None).await
    }

    /// [`Server::start`], with the API server Webhook authorization asks.
    pub async fn start_with(
        config: &Config,
        pods: Arc<dyn PodsView>,
        api_server: Option<ApiServer>,
    ) -> Result<Self, ServerError> {
        Self::start_streaming(config, pods, None, api_server).await
    }

    /// [`Server::start_with`], with the runtime that serves `/exec`,
    /// `/attach` and `/portForward` (without one they answer 501).
    pub async fn start_streaming(
        config: &Config,
        pods: Arc<dyn PodsView>,
        runtime: Option<Arc<dyn StreamRuntime>>,
        api_server: Option<ApiServer>,
    ) -> Result<Self, ServerError> {
        let mode = config.authorization.mode_for(api_server.is_some())?;
        let hostname = tls::node_hostname();
        let access = Arc::new(match (mode, api_server) {
            (AuthorizationMode::Webhook, Some(api)) => ApiAccess {
                authorizer: authz::Authorizer::webhook(api.client, &config.authorization),
                node_name: api.node_name,
                runtime,
            },
            (_, api) => {
                if config.authorization.mode.is_none() {
                    tracing::warn!(
                        "authorization.mode is not set and there is no API server: \
                         every authenticated client may use the kubelet API (AlwaysAllow)"
                    );
                }
                ApiAccess {
                    authorizer: authz::Authorizer::AlwaysAllow,
                    node_name: api.map(|a| a.node_name).unwrap_or(hostname.clone()),
                    runtime,
                }
            }
        });
        // Certificates first: a bad file should fail before any port is taken.
        let acceptor = TlsAcceptor::from(tls::server_config(config, &hostname)?);

        let (api, api_addr) =
            bind(Endpoint::Api, SocketAddr::new(config.address, config.port)).await?;
        let healthz = match config.healthz_port {
            Some(port) => Some(
                bind(
                    Endpoint::Healthz,
                    SocketAddr::new(config.healthz_bind_address, port),
                )
                .await?,
            ),
            None => None,
        };
        let read_only = match config.read_only_port {
            Some(port) => {
                Some(bind(Endpoint::ReadOnly, SocketAddr::new(config.address, port)).await?)
            }
            None => None,
        };
        let endpoints = Endpoints {
            api: api_addr,
            healthz: healthz.as_ref().map(|(_, a)| *a),
            read_only: read_only.as_ref().map(|(_, a)| *a),
        };

        let mut tasks = vec![tokio::spawn(accept_loop(
            api,
            Endpoint::Api,
            Some(acceptor),
            pods.clone(),
            access.clone(),
        ))];
        if let Some((l, _)) = healthz {
            tasks.push(tokio::spawn(accept_loop(
                l,
                Endpoint::Healthz,
                None,
                pods.clone(),
                access.clone(),
            )));
        }
        if let Some((l, _)) = read_only {
            tasks.push(tokio::spawn(accept_loop(
                l,
                Endpoint::ReadOnly,
                None,
                pods,
                access,
            )));
        }
        Ok(Server { endpoints, tasks })
    }

    pub fn endpoints(&self) -> Endpoints {
        self.endpoints
    }

    /// Keeps the endpoints running after this handle is gone.
    pub fn detach(mut self) {
        // A dropped JoinHandle leaves its task running; only Drop aborts them.
        self.tasks.clear();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Returns the listener and the address it really got (port 0 → ephemeral).
async fn bind(
    endpoint: Endpoint,
    address: SocketAddr,
) -> Result<(TcpListener, SocketAddr), ServerError> {
    let err = |source| ServerError::Bind {
        endpoint,
        address,
        source,
    };
    let listener = TcpListener::bind(address).await.map_err(err)?;
    let local = listener.local_addr().map_err(err)?;
    Ok((listener, local))
}

async fn accept_loop(
    listener: TcpListener,
    endpoint: Endpoint,
    tls: Option<TlsAcceptor>,
    pods: Arc<dyn PodsView>,
    access: Arc<ApiAccess>,
) {
    // Owning the connections here means aborting this task (Server's Drop)
    // closes them too.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    conns.spawn(connection(
                        tcp,
                        peer,
                        endpoint,
                        tls.clone(),
                        pods.clone(),
                        access.clone(),
                    ));
                }
                Err(e) => {
                    // Typically EMFILE: retrying at once would spin on the same error.
                    tracing::warn!(%endpoint, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    endpoint: Endpoint,
    tls: Option<TlsAcceptor>,
    pods: Arc<dyn PodsView>,
    access: Arc<ApiAccess>,
) {
    let _ = tcp.set_nodelay(true);
    let Some(acceptor) = tls else {
        // Plain HTTP listeners neither authenticate nor authorize.
        return serve_http(TokioIo::new(tcp), peer, endpoint, None, pods, access).await;
    };
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!(%peer, "TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    // The verifier accepts a missing certificate (so anonymous clients get a
    // proper 401) but refuses one that does not chain to the client CA; a
    // certificate present here is therefore an authenticated one.
    let user = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(authz::User::from_certificate);
    serve_http(TokioIo::new(stream), peer, endpoint, user, pods, access).await;
}

async fn serve_http<I>(
    io: TokioIo<I>,
    peer: SocketAddr,
    endpoint: Endpoint,
    user: Option<authz::User>,
    pods: Arc<dyn PodsView>,
    access: Arc<ApiAccess>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Plain listeners serve everyone; on the API listener only a certificate
    // authenticates.
    let authenticated = endpoint != Endpoint::Api || user.is_some();
    let service = service_fn(move |req| {
        let (pods, access, user) = (pods.clone(), access.clone(), user.clone());
        async move {
            // After authentication (anonymous clients get 401 in `routes`),
            // before routing, as the kubelet's auth filter.
            if let (Endpoint::Api, Some(user)) = (endpoint, user)
                && let Some(refused) = authorize(&access, user, &req).await
            {
                return Ok(refused);
            }
            let runtime = access
                .runtime
                .as_ref()
                .filter(|_| endpoint == Endpoint::Api);
            Ok::<_, Infallible>(routes::handle(&pods, runtime, endpoint, authenticated, req).await)
        }
    });
    if let Err(e) = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(io, service)
        // Streaming requests become spliced connections after their 101.
        .with_upgrades()
        .await
    {
        tracing::debug!(%peer, %endpoint, "connection ended: {e}");
    }
}

/// `None` when the request may go on, else the kubelet's 403 (or 500 when
/// the API server could not be asked).
async fn authorize(
    access: &ApiAccess,
    user: authz::User,
    req: &hyper::Request<hyper::body::Incoming>,
) -> Option<hyper::Response<routes::Body>> {
    let attrs = authz::Attributes::new(user, req.method(), req.uri().path(), &access.node_name);
    match access.authorizer.allowed(&attrs).await {
        Ok(true) => None,
        Ok(false) => {
            tracing::debug!(user = %attrs.user.name, verb = attrs.verb, subresource = attrs.subresource, "forbidden");
            Some(routes::text(
                hyper::StatusCode::FORBIDDEN,
                attrs.forbidden(),
            ))
        }
        Err(e) => {
            tracing::warn!(user = %attrs.user.name, "authorization failed: {e}");
            Some(routes::text(
                hyper::StatusCode::INTERNAL_SERVER_ERROR,
                attrs.error(),
            ))
        }
    }
}
