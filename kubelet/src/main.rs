//! weir-kubelet: a minimal kubelet on containerd's CRI.
//!
//! `weir-kubelet [--config FILE] [--kubeconfig FILE] [--hostname-override NAME]`,
//! the real kubelet's flag names.
//! Without a kubeconfig it runs standalone: the static pods of
//! `staticPodPath` only. Stopping the kubelet leaves its pods running; the
//! next start adopts them.
use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use clap::Parser;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::mpsc;
use weir_kubelet::{
    cli::{Args, Command, node_name, write_completions},
    config::{self, Config},
    cri::{CriRuntime, Runtime as _, RuntimeVersion},
    flow::{PodEvent, PodSource, StatusSink},
    health::NodeHealth,
    static_pods::{self, StaticPodSource},
    worker::{Worker, WorkerConfig},
};

#[derive(Debug, thiserror::Error)]
enum MainError {
    #[error("{}: {source}", path.display())]
    Config {
        path: PathBuf,
        source: config::ConfigError,
    },
    #[error("{0}")]
    Flag(config::FieldError),
    #[error("containerRuntimeEndpoint: {0}")]
    Runtime(#[from] weir_kubelet::cri::CriError),
    #[error("kubeconfig {}: {message}", path.display())]
    Kubeconfig { path: PathBuf, message: String },
    #[error("API-server mode: {0}")]
    Api(#[from] weir_kubelet::api::ApiError),
    #[error("kubelet endpoints: {0}")]
    Server(#[from] weir_kubelet::server::ServerError),
    #[error("cannot start the Tokio runtime: {0}")]
    Tokio(std::io::Error),
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a container's log is a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    if let Some(Command::Completions { shell }) = args.command {
        return match write_completions(shell, &mut std::io::stdout().lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("writing the completion script: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let result = load_config(&args).and_then(|config| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(MainError::Tokio)?
            .block_on(run(args, config))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// The file (or the defaults), with the flags that override it, as the
/// kubelet's flag precedence has it.
fn load_config(args: &Args) -> Result<Config, MainError> {
    let path = args.config.clone().unwrap_or_default();
    let err = |source| MainError::Config {
        path: path.clone(),
        source,
    };
    let mut config = match &args.config {
        Some(p) => config::load(p).map_err(err)?,
        None => Config::default(),
    };
    if let Some(endpoint) = &args.container_runtime_endpoint {
        config.container_runtime_endpoint =
            config::unix_endpoint("--container-runtime-endpoint", endpoint)
                .map_err(MainError::Flag)?;
    }
    for i in &config.ignored {
        tracing::warn!(field = i.field, "accepted but not acted on: {}", i.why);
    }
    Ok(config)
}

async fn run(args: Args, config: Config) -> Result<(), MainError> {
    let node_name = node_name(&args);
    // Refused before anything starts, as the kubelet does.
    config
        .authorization
        .mode_for(args.kubeconfig.is_some())
        .map_err(weir_kubelet::server::ServerError::from)?;
    // The node's InternalIP, hostIP, and host-network pods' IP: --node-ip,
    // else the environment's override, else the default route's address.
    let node_ip = match args.node_ip {
        Some(ip) => ip,
        None => weir_kubelet::api::machine::primary_ip(
            weir_kubelet::api::NodeOptions::from_env()?.node_ip,
        ),
    };
    let mut api_server = None;
    let endpoint = format!("unix://{}", config.container_runtime_endpoint.display());
    let runtime = Arc::new(CriRuntime::new(&endpoint)?);
    let version = wait_for_runtime(&runtime, &endpoint).await;
    let (tx, rx) = mpsc::channel(256);

    let mut objects: Option<Arc<dyn weir_kubelet::worker::ApiObjects>> = None;
    let mut api_listed = None;
    let mut node_health = None;
    let sink: Arc<dyn StatusSink> = match &args.kubeconfig {
        Some(path) => {
            let client = kube_client(path).await?;
            api_server = Some(weir_kubelet::server::ApiServer {
                client: client.clone(),
                node_name: node_name.clone(),
            });
            objects = Some(Arc::new(weir_kubelet::api::objects::ApiObjectCache::start(
                client.clone(),
            )));
            // The first checks run before the Node registers, so that a
            // healthy node is Ready from its first status on.
            let health = NodeHealth::new();
            health.check_runtime(&*runtime).await;
            health.relist(&*runtime).await;
            health.spawn(runtime.clone());
            node_health = Some(health.clone());
            let options = weir_kubelet::api::NodeOptions {
                node_ip: Some(node_ip),
                root_dir: args.root_dir.clone(),
                ..weir_kubelet::api::NodeOptions::default()
            };
            let sink = weir_kubelet::api::start_with(
                client,
                &config,
                node_name.clone(),
                version,
                health,
                tx.clone(),
                options,
            )
            .await?;
            api_listed = Some(sink.pods_listed());
            sink
        }
        None => Arc::new(LogSink),
    };

    let mut worker_config = WorkerConfig::new(&config, &node_name);
    worker_config.pods_dir = args.root_dir.join("pods");
    worker_config.seccomp_dir = args.root_dir.join("seccomp");
    worker_config.pod_log_dir = args.pod_logs_dir.clone();
    worker_config.cgroup_root = args.cgroup_root.clone();
    worker_config.objects = objects;
    worker_config.node_ip = Some(node_ip);
    worker_config.health = node_health.clone();
    tokio::spawn(weir_kubelet::worker::rotate_logs(
        runtime.clone(),
        weir_kubelet::worker::LogRotation::from_config(&config),
    ));
    let stream_runtime: Arc<dyn weir_kubelet::server::StreamRuntime> = runtime.clone();
    let image_fs = weir_kubelet::eviction::observe::image_fs(&*runtime).await;
    let worker = Worker::spawn(runtime, worker_config, sink, rx);
    weir_kubelet::eviction::EvictionManager {
        config: config.eviction.clone(),
        pods: worker.eviction_handle(),
        health: node_health.clone(),
        root_dir: args.root_dir.clone(),
        image_fs,
    }
    .spawn();
    weir_kubelet::server::serve(config.clone(), worker.view(), stream_runtime, api_server).await?;

    let files_read = if let Some(dir) = &config.static_pod_path {
        tracing::info!(dir = %dir.display(), every = ?config.file_check_frequency, "watching static pods");
        let source = StaticPodSource::new(dir, &node_name);
        let (synced_tx, synced) = tokio::sync::oneshot::channel();
        tokio::spawn(feed_static_pods(
            source,
            config.file_check_frequency,
            tx,
            synced_tx,
        ));
        let first_scan = tokio::time::timeout(config.file_check_frequency * 3, synced);
        matches!(first_scan.await, Ok(Ok(())))
    } else {
        drop(tx);
        true
    };
    // A labelled sandbox of a pod no source wants (its file went, or it was
    // force-deleted from the API while no kubelet ran) is an orphan, but
    // only once every source delivered its first complete state: the
    // kubelet's HandlePodCleanups waits for sourcesReady the same way.
    if files_read {
        worker.reap_orphans_when(async move {
            match api_listed {
                None => true,
                Some(mut listed) => listed.wait_for(|l| *l).await.is_ok(),
            }
        });
    }

    shutdown_signal().await;
    // The pods keep running: the next kubelet adopts them.
    tracing::info!("shutting down; pods keep running");
    drop(worker);
    Ok(())
}

/// containerd may start after the kubelet: keep asking, with backoff.
async fn wait_for_runtime(runtime: &CriRuntime, endpoint: &str) -> RuntimeVersion {
    let mut delay = Duration::from_millis(500);
    loop {
        match runtime.version().await {
            Ok(v) => {
                tracing::info!(
                    endpoint,
                    runtime = %v.runtime_name, version = %v.runtime_version, api = %v.runtime_api_version,
                    "container runtime is ready"
                );
                return v;
            }
            Err(e) => {
                tracing::warn!(endpoint, error = %e, retry_in = ?delay, "container runtime not ready");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

async fn kube_client(path: &std::path::Path) -> Result<kube::Client, MainError> {
    let err = |message: String| MainError::Kubeconfig {
        path: path.to_owned(),
        message,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(cfg).map_err(|e| err(e.to_string()))
}

/// Static pod scans → pod events. A changed file is a kill then a create.
async fn feed_static_pods(
    source: StaticPodSource,
    every: Duration,
    events: mpsc::Sender<PodEvent>,
    synced: tokio::sync::oneshot::Sender<()>,
) {
    let mut synced = Some(synced);
    let mut reported = std::collections::BTreeSet::new();
    let (tx, mut rx) = mpsc::channel(16);
    tokio::spawn(static_pods::watch(source, every, tx));
    while let Some(update) = rx.recv().await {
        // Each update lists every bad file: log a problem once, not per scan.
        let now: std::collections::BTreeSet<String> =
            update.errors.iter().map(ToString::to_string).collect();
        for e in &update.errors {
            if !reported.contains(&e.to_string()) {
                tracing::error!(path = %e.path().display(), "static pod file: {e}");
            }
        }
        reported = now;
        let d = update.diff;
        let mut out = Vec::new();
        for p in d.removed {
            tracing::info!(path = %p.path.display(), pod = %p.name, "static pod removed");
            out.push(PodEvent::Remove {
                uid: p.uid,
                grace: None,
            });
        }
        for (old, new) in d.updated {
            tracing::info!(path = %new.path.display(), pod = %new.name, "static pod changed");
            out.push(PodEvent::Remove {
                uid: old.uid,
                grace: None,
            });
            out.push(upsert(new));
        }
        for p in d.added {
            tracing::info!(path = %p.path.display(), pod = %p.name, "static pod added");
            out.push(upsert(p));
        }
        for ev in out {
            if events.send(ev).await.is_err() {
                return;
            }
        }
        if let Some(s) = synced.take() {
            let _ = s.send(());
        }
    }
}

fn upsert(p: static_pods::StaticPod) -> PodEvent {
    PodEvent::Upsert {
        pod: Box::new(p.pod),
        source: PodSource::File(p.path),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Standalone mode has no API server: phase changes go to the log.
struct LogSink;

impl StatusSink for LogSink {
    fn publish(&self, pod: &Pod, _: &PodSource, status: &PodStatus) {
        tracing::info!(
            pod = %format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            ),
            phase = status.phase.as_deref().unwrap_or_default(),
            ip = status.pod_ip.as_deref().unwrap_or_default(),
            "pod status"
        );
    }

    fn terminated(&self, pod: &Pod, _: &PodSource) {
        tracing::info!(
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            "pod terminated"
        );
    }
}
