//! The node Lease, as component-helpers/apimachinery/lease/controller.go
//! keeps it: renewed every `nodeLeaseDurationSeconds/4`, created when missing,
//! re-read on a conflict, and retried after an error with a delay doubling
//! from 200 ms to 7 s. Unlike krustlet (which panicked after four failures)
//! an outage of any length only delays the next renewal.
use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference},
    jiff::Timestamp,
};
use kube::api::{Api, PostParams};

use super::{ApiError, Backoff, LEASE_NAMESPACE, Shared, status_code};

/// Updates tried per renewal before backing off (`maxUpdateRetries`).
const MAX_UPDATE_RETRIES: usize = 5;

pub(crate) async fn run(shared: Arc<Shared>, duration: Duration) {
    let (first, max) = shared.options.lease_retry;
    let mut backoff = Backoff::new(first, max);
    let mut lease = LeaseKeeper {
        api: Api::namespaced(shared.client.clone(), LEASE_NAMESPACE),
        duration_seconds: i32::try_from(duration.as_secs()).unwrap_or(i32::MAX),
        shared,
        latest: None,
    };
    let interval = duration / 4;
    loop {
        let delay = match lease.renew().await {
            Ok(()) => {
                backoff.reset();
                interval
            }
            Err(e) => {
                lease.latest = None;
                let d = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?d, "node lease renewal failed");
                d
            }
        };
        tokio::time::sleep(delay).await;
    }
}

struct LeaseKeeper {
    api: Api<Lease>,
    shared: Arc<Shared>,
    duration_seconds: i32,
    /// The Lease as last written: renewing it is an update with its
    /// resourceVersion, so a concurrent writer is noticed (409) not overwritten.
    latest: Option<Lease>,
}

impl LeaseKeeper {
    fn name(&self) -> &str {
        &self.shared.node_name
    }

    /// The Lease as we want it, on top of `base`.
    fn desired(&self, base: Option<Lease>) -> Lease {
        let mut lease = base.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name().to_owned()),
                namespace: Some(LEASE_NAMESPACE.to_owned()),
                ..Default::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.name().to_owned());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        // Owned by the Node so it goes when the Node does (`setNodeOwnerFunc`);
        // added once the Node is known, even on a Lease created before it.
        if let Some(uid) = self.shared.node_uid() {
            lease.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: self.name().to_owned(),
                uid,
                ..Default::default()
            }]);
        }
        lease
    }

    async fn renew(&mut self) -> Result<(), ApiError> {
        let name = self.name().to_owned();
        for _ in 0..MAX_UPDATE_RETRIES {
            let Some(latest) = self.latest.clone() else {
                self.ensure().await?;
                return Ok(());
            };
            match self
                .api
                .replace(&name, &PostParams::default(), &self.desired(Some(latest)))
                .await
            {
                Ok(l) => {
                    self.latest = Some(l);
                    return Ok(());
                }
                // Someone else wrote it (409) or deleted it (404): start
                // again from what is there now.
                Err(e) if matches!(status_code(&e), Some(409 | 404)) => {
                    tracing::debug!(error = %e, "lease changed underneath, re-reading");
                    self.latest = None;
                }
                Err(e) => return Err(ApiError::call("update", "lease", &name)(e)),
            }
        }
        Err(ApiError::Conflicts {
            kind: "lease",
            name,
            tries: MAX_UPDATE_RETRIES,
        })
    }

    /// Reads the Lease, creating it when missing; either way it is renewed.
    async fn ensure(&mut self) -> Result<(), ApiError> {
        let name = self.name().to_owned();
        let current = self
            .api
            .get_opt(&name)
            .await
            .map_err(ApiError::call("get", "lease", &name))?;
        let written = match current {
            Some(l) => self
                .api
                .replace(&name, &PostParams::default(), &self.desired(Some(l)))
                .await
                .map_err(ApiError::call("update", "lease", &name))?,
            None => {
                tracing::info!(lease = %name, "creating the node lease");
                self.api
                    .create(&PostParams::default(), &self.desired(None))
                    .await
                    .map_err(ApiError::call("create", "lease", &name))?
            }
        };
        self.latest = Some(written);
        Ok(())
    }
}
