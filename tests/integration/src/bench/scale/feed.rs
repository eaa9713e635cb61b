//! Where the scale bench's Services come from: manifest files the agent
//! watches, or the test API server the agent lists and watches. Both hold
//! the same N Services × M endpoints, and both take a change the way a user's
//! tooling would make it: a file renamed into place, or a kube-rs `patch`.
use std::{
    collections::HashMap,
    ffi::OsString,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{POD_BASE, Pod, file_name, generate, push_ip, push_manifest};
use crate::{api::Cluster, bench::rules::Svc};

/// The agent's node in API mode.
const NODE: &str = "bench-node";
/// Creates in flight while loading the API server: enough to keep its two
/// worker threads busy without queueing thousands of requests.
const LOADERS: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// Manifest files in a directory (`--manifests`), one per Service.
    Manifests,
    /// The test API server (`--kubeconfig`), holding every object before
    /// the agent starts; paginated lists, then watches.
    Api,
    /// As `api`, with `--streaming-lists`: the initial state as a watch
    /// stream (`sendInitialEvents`).
    ApiStreaming,
}

impl Source {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Manifests => "manifests",
            Self::Api => "api",
            Self::ApiStreaming => "api-streaming",
        }
    }
}

pub enum Feed {
    Manifests {
        dir: PathBuf,
    },
    // Boxed: the server, its runtime and client dwarf a path.
    Api {
        cluster: Box<Cluster>,
        streaming: bool,
    },
}

impl Feed {
    /// Writes the N Services and their slices where the agent will find
    /// them; returns the feed and a note on what that took.
    pub fn create(source: Source, work: &Path, svcs: &[Svc], m: u32) -> Result<(Self, String)> {
        let started = Instant::now();
        match source {
            Source::Manifests => {
                let dir = work.join("manifests");
                std::fs::create_dir(&dir)?;
                generate(&dir, svcs, m)?;
                let note = format!(
                    "generated {} manifest files ({m} endpoints each) in {:.2} s",
                    svcs.len(),
                    started.elapsed().as_secs_f64()
                );
                Ok((Self::Manifests { dir }, note))
            }
            Source::Api | Source::ApiStreaming => {
                let cluster = Box::new(Cluster::start()?);
                load(&cluster, svcs, m)?;
                let note = format!(
                    "created {} Services and {} EndpointSlices ({m} endpoints each) through the test API server in {:.2} s, before the agent started",
                    svcs.len(),
                    svcs.len(),
                    started.elapsed().as_secs_f64()
                );
                let streaming = source == Source::ApiStreaming;
                Ok((Self::Api { cluster, streaming }, note))
            }
        }
    }

    /// The agent's arguments for this source.
    pub fn agent_args(&self) -> Vec<OsString> {
        match self {
            Self::Manifests { dir } => vec!["--manifests".into(), dir.into()],
            Self::Api { cluster, streaming } => vec![
                "--kubeconfig".into(),
                cluster.kubeconfig().into(),
                "--node-name".into(),
                NODE.into(),
                "--namespace".into(),
                "kube-system".into(),
                format!("--streaming-lists={streaming}").into(),
            ],
        }
    }

    /// Replaces `svc`'s endpoints with `eps`; returns when the write was
    /// issued (the rename, or the start of the PATCH request).
    pub fn write(&self, svc: &Svc, eps: &[u32]) -> Result<Instant> {
        match self {
            Self::Manifests { dir } => {
                let mut text = String::new();
                push_manifest(&mut text, svc, eps.iter().copied());
                let file = file_name(svc);
                let tmp = dir.join(format!(".{file}.tmp"));
                std::fs::write(&tmp, &text)?;
                let at = Instant::now();
                std::fs::rename(&tmp, dir.join(&file))?;
                Ok(at)
            }
            Self::Api { cluster, .. } => {
                let patch = patch_endpoints(cluster, svc, eps);
                let at = Instant::now();
                cluster.block_on(patch)?;
                Ok(at)
            }
        }
    }

    /// Issues `writes` evenly over `over`, without waiting for one to finish
    /// before the next is due (an API client pipelines them); returns when
    /// the last one completed.
    pub fn burst(&self, writes: Vec<(Svc, Vec<u32>)>, over: Duration) -> Result<Instant> {
        let gap = over / u32::try_from(writes.len().max(1))?;
        let start = Instant::now();
        match self {
            Self::Manifests { .. } => {
                for (k, (svc, eps)) in writes.iter().enumerate() {
                    let due = start + gap * u32::try_from(k)?;
                    std::thread::sleep(due.saturating_duration_since(Instant::now()));
                    self.write(svc, eps)?;
                }
            }
            Self::Api { cluster, .. } => cluster.block_on(async {
                let mut tasks = tokio::task::JoinSet::new();
                // Two writes to one slice must reach the server in the order
                // they were made, or the slice ends at the earlier one while
                // the bench expects the later: each waits for the one before.
                let mut previous = HashMap::new();
                for (k, (svc, eps)) in writes.into_iter().enumerate() {
                    let due = tokio::time::Instant::from_std(start + gap * u32::try_from(k)?);
                    tokio::time::sleep_until(due).await;
                    let (done, done_rx) = tokio::sync::oneshot::channel::<()>();
                    let before = previous.insert(slice_name(&svc), done_rx);
                    let patch = patch_endpoints(cluster, &svc, &eps);
                    tasks.spawn(async move {
                        if let Some(before) = before {
                            // An error there is reported by its own task.
                            let _ = before.await;
                        }
                        let written = patch.await;
                        drop(done);
                        written
                    });
                }
                while let Some(done) = tasks.join_next().await {
                    done??;
                }
                anyhow::Ok(())
            })?,
        }
        Ok(Instant::now())
    }
}

/// The namespace, this node, then every Service and slice, `LOADERS` at a
/// time.
fn load(cluster: &Cluster, svcs: &[Svc], m: u32) -> Result<()> {
    let pp = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let ns = svcs.first().map_or("default", |s| s.namespace.as_str());
    cluster.block_on(async {
        namespaces
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await?;
        nodes
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": {"name": NODE},
                    "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]},
                }))?,
            )
            .await?;
        anyhow::Ok(())
    })?;
    let svcs: Arc<[Svc]> = svcs.into();
    cluster.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..LOADERS {
            let (svcs, client) = (svcs.clone(), cluster.client.clone());
            tasks.spawn(async move {
                for i in (w..svcs.len()).step_by(LOADERS) {
                    let svc = &svcs[i];
                    let first = POD_BASE + u32::try_from(i)? * m;
                    let services: Api<Service> = Api::namespaced(client.clone(), &svc.namespace);
                    let slices: Api<EndpointSlice> =
                        Api::namespaced(client.clone(), &svc.namespace);
                    services
                        .create(
                            &PostParams::default(),
                            &serde_json::from_value(service_json(svc))?,
                        )
                        .await
                        .with_context(|| format!("creating Service {}", svc.name))?;
                    let eps: Vec<u32> = (first..first + m).collect();
                    slices
                        .create(
                            &PostParams::default(),
                            &serde_json::from_value(slice_json(svc, &eps))?,
                        )
                        .await
                        .with_context(|| format!("creating EndpointSlice {}", slice_name(svc)))?;
                }
                anyhow::Ok(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        anyhow::Ok(())
    })
}

/// The merge PATCH that gives `svc`'s slice the endpoints `eps`, built
/// before it is awaited so that timing it leaves the JSON out.
fn patch_endpoints(
    cluster: &Cluster,
    svc: &Svc,
    eps: &[u32],
) -> impl Future<Output = kube::Result<()>> + Send + 'static {
    let api: Api<EndpointSlice> = cluster.api(&svc.namespace);
    let name = slice_name(svc);
    let patch = Patch::Merge(json!({ "endpoints": endpoints_json(svc, eps) }));
    async move {
        api.patch(&name, &PatchParams::default(), &patch)
            .await
            .map(drop)
    }
}

fn slice_name(svc: &Svc) -> String {
    format!("{}-1", svc.name)
}

/// The same Service as the manifest files hold.
fn service_json(svc: &Svc) -> Value {
    let vip = svc.vip.to_string();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": svc.name, "namespace": svc.namespace},
        "spec": {"clusterIP": vip, "clusterIPs": [vip], "ports": [
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
        ]},
    })
}

fn slice_json(svc: &Svc, eps: &[u32]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": slice_name(svc), "namespace": svc.namespace,
                     "labels": {"kubernetes.io/service-name": svc.name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints_json(svc, eps),
    })
}

fn endpoints_json(svc: &Svc, eps: &[u32]) -> Value {
    eps.iter()
        .map(|&ip| {
            let mut addr = String::with_capacity(15);
            push_ip(&mut addr, ip);
            let pod = Pod::of(svc, ip);
            json!({
                "addresses": [addr],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": pod.node,
                "targetRef": {"kind": "Pod", "namespace": svc.namespace, "name": pod.name, "uid": pod.uid},
            })
        })
        .collect()
}
