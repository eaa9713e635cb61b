//! The agent's Lease, `<namespace>/weir-agent-<node>`, renewed every 10 s as
//! the kubelet renews its node Lease: a stale `renewTime` shows a dead agent
//! the way a NotReady node shows a dead kubelet.
use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, Client};
use tracing::{debug, info, warn};

pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);
/// Four renewals, as the kubelet's 40 s node lease.
pub const LEASE_DURATION_SECONDS: i32 = 40;
/// The kubelet's lease controller backs off from 200 ms up to 7 s.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(7);

pub fn lease_name(node: &str) -> String {
    format!("weir-agent-{node}")
}

/// Renews forever. Conflicts and outages are retried with backoff; nothing
/// here can stop the agent.
pub async fn run(client: Client, namespace: String, node: String) {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let name = lease_name(&node);
    let mut backoff = BACKOFF_MIN;
    let mut failing = false;
    loop {
        match renew(&api, &name, &node).await {
            Ok(created) => {
                if created {
                    info!(lease = %format!("{namespace}/{name}"), "lease created");
                } else if failing {
                    info!(lease = %format!("{namespace}/{name}"), "lease renewed again");
                }
                failing = false;
                backoff = BACKOFF_MIN;
                tokio::time::sleep(RENEW_INTERVAL).await;
            }
            Err(e) => {
                if failing {
                    debug!(lease = %name, "lease renewal still failing: {e}");
                } else {
                    warn!(lease = %format!("{namespace}/{name}"), "cannot renew lease: {e}; retrying");
                }
                failing = true;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// One renewal; true when the Lease had to be created.
async fn renew(api: &Api<Lease>, name: &str, node: &str) -> Result<bool, kube::Error> {
    let now = MicroTime(Timestamp::now());
    match api.get_opt(name).await? {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(node) {
                spec.holder_identity = Some(node.to_owned());
                spec.acquire_time = Some(now.clone());
            }
            spec.lease_duration_seconds = Some(LEASE_DURATION_SECONDS);
            spec.renew_time = Some(now);
            // Replace carries the resourceVersion we read: a concurrent writer
            // makes this a 409 and the next attempt reads again.
            api.replace(name, &Default::default(), &lease).await?;
            Ok(false)
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    labels: Some(
                        [("app.kubernetes.io/name".to_owned(), "weir-agent".to_owned())].into(),
                    ),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.to_owned()),
                    lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&Default::default(), &lease).await?;
            Ok(true)
        }
    }
}
