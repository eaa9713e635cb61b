//! The Node object: registration (pkg/kubelet/kubelet_node_status.go
//! `registerWithAPIServer`) and the periodic status update
//! (`updateNodeStatus`). Since node Leases carry the heartbeat, the status is
//! patched only when it changed, or every `nodeStatusReportFrequency`, as the
//! kubelet does; the check runs every `nodeStatusUpdateFrequency`.
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{
    api::core::v1::{
        DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus,
        NodeSystemInfo,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, Time},
    },
    jiff::Timestamp,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

use super::{
    ApiError, Backoff, Shared,
    machine::{self, Machine},
    status_code,
};
use crate::{
    config::Config,
    cri::RuntimeVersion,
    health::{NodeHealth, aggregate},
};

pub(crate) struct NodeReporter {
    shared: Arc<Shared>,
    port: u16,
    max_pods: u32,
    update_every: Duration,
    runtime_version: String,
    /// The runtime's and the PLEG's health: the Ready condition.
    health: Arc<NodeHealth>,
    /// What was last reported (heartbeat times cleared) and when, to decide
    /// whether the next check must patch.
    last: Option<(NodeStatus, Instant)>,
}

impl NodeReporter {
    pub(crate) fn new(
        shared: Arc<Shared>,
        config: &Config,
        runtime: &RuntimeVersion,
        health: Arc<NodeHealth>,
    ) -> Self {
        Self {
            health,
            shared,
            port: config.port,
            max_pods: config.max_pods,
            update_every: config.node_status_update_frequency,
            runtime_version: format!("{}://{}", runtime.runtime_name, runtime.runtime_version),
            last: None,
        }
    }

    fn api(&self) -> Api<Node> {
        Api::all(self.shared.client.clone())
    }

    fn name(&self) -> &str {
        &self.shared.node_name
    }

    /// The labels the kubelet owns (`updateDefaultLabels`); others' labels
    /// are left alone.
    fn default_labels(&self, arch: &str) -> BTreeMap<String, String> {
        [
            ("kubernetes.io/hostname", self.name()),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", arch),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", arch),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Creates the Node, or reconciles the existing one: our labels merged
    /// in, the status replaced, taints and other labels untouched. A node
    /// that restarts finds its Node already there (krustlet#127), which is
    /// the normal case, not an error.
    pub(crate) async fn register(&mut self) -> Result<(), ApiError> {
        let m = Machine::read(&self.shared.options.root_dir);
        let labels = self.default_labels(&m.architecture);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(self.name().to_owned()),
                labels: Some(labels.clone()),
                annotations: Some(BTreeMap::from([(
                    "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
                    "true".to_owned(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        let name = self.name().to_owned();
        let created = match self.api().create(&PostParams::default(), &node).await {
            Ok(n) => n,
            Err(e) if status_code(&e) == Some(409) => {
                let patch = json!({"metadata": {"labels": labels}});
                self.api()
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(ApiError::call("reconcile", "node", &name))?
            }
            Err(e) => return Err(ApiError::call("create", "node", &name)(e)),
        };
        let uid = created.metadata.uid.clone().unwrap_or_default();
        tracing::info!(node = %name, %uid, "node registered");
        // The existing conditions' transition times carry over.
        self.last = created.status.map(|s| (s, Instant::now()));
        let not_ready = self.health.not_ready();
        self.patch_status(m, &not_ready).await?;
        self.shared.node_uid.send_replace(Some(uid));
        Ok(())
    }

    /// Registers (if not yet), then checks the status every
    /// `nodeStatusUpdateFrequency`. Never returns.
    pub(crate) async fn run(mut self, mut registered: bool) {
        let mut backoff = Backoff::new(
            Duration::from_millis(500),
            self.update_every.max(Duration::from_secs(1)),
        );
        loop {
            let delay = if !registered {
                match self.register().await {
                    Ok(()) => {
                        registered = true;
                        backoff.reset();
                        self.update_every
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "node registration failed");
                        backoff.next_delay()
                    }
                }
            } else {
                match self.update().await {
                    Ok(()) => self.update_every,
                    Err(ApiError::Call { source, .. }) if status_code(&source) == Some(404) => {
                        // Someone deleted the Node: register it again, as a
                        // restarted kubelet would.
                        tracing::warn!(node = %self.name(), "node vanished, registering it again");
                        registered = false;
                        Duration::ZERO
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "node status update failed");
                        self.update_every
                    }
                }
            };
            tokio::time::sleep(delay).await;
        }
    }

    async fn update(&mut self) -> Result<(), ApiError> {
        // Read the Node as tryUpdateNodeStatus does: a Node deleted behind our
        // back (404) is noticed and registered again, and a UID change (deleted
        // and recreated by someone else) re-owns the Lease and mirror pods.
        let name = self.name().to_owned();
        let node = self
            .api()
            .get(&name)
            .await
            .map_err(ApiError::call("get", "node", &name))?;
        if node.metadata.uid.is_some() && node.metadata.uid != self.shared.node_uid() {
            self.shared.node_uid.send_replace(node.metadata.uid.clone());
        }
        let m = Machine::read(&self.shared.options.root_dir);
        let not_ready = self.health.not_ready();
        let due = match &self.last {
            None => true,
            Some((last, at)) => {
                self.status(&m, None, &not_ready).with_transitions(last) != *last
                    || at.elapsed() >= self.shared.options.status_report_frequency
            }
        };
        if due {
            self.patch_status(m, &not_ready).await?;
        }
        Ok(())
    }

    /// Patches the full status. Strategic merge keeps conditions other
    /// components own (NetworkUnavailable) while ours are replaced by type.
    async fn patch_status(&mut self, m: Machine, not_ready: &[String]) -> Result<(), ApiError> {
        let previous = self.last.as_ref().map(|(s, _)| s.clone());
        let now = Time(Timestamp::now());
        let status = self.status(&m, Some((&now, previous.as_ref())), not_ready);
        let was_ready = previous.as_ref().map(|p| ready(p) == Some("True"));
        if was_ready.is_some_and(|r| r != not_ready.is_empty()) {
            if not_ready.is_empty() {
                tracing::info!(node = %self.name(), "node is Ready");
            } else {
                tracing::warn!(node = %self.name(), message = %aggregate(not_ready), "node is NotReady");
            }
        }
        let name = self.name().to_owned();
        self.api()
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(json!({ "status": status })),
            )
            .await
            .map_err(ApiError::call("patch status", "node", &name))?;
        // Kept with heartbeats but with the transition times it was sent
        // with, so the next comparison sees only real changes.
        self.last = Some((
            self.status(&m, None, not_ready).with_transitions(&status),
            Instant::now(),
        ));
        Ok(())
    }

    /// The status for `m`, Ready unless `not_ready` gives reasons. With
    /// `times`, conditions carry the heartbeat `now` and keep the previous
    /// transition time unless their value changed.
    pub(crate) fn status(
        &self,
        m: &Machine,
        times: Option<(&Time, Option<&NodeStatus>)>,
        not_ready: &[String],
    ) -> NodeStatus {
        let ki = |bytes: u64| Quantity(format!("{}Ki", bytes / 1024));
        let capacity = BTreeMap::from([
            ("cpu".to_owned(), Quantity(m.cpus.to_string())),
            ("memory".to_owned(), ki(m.memory_total)),
            ("ephemeral-storage".to_owned(), ki(m.fs_capacity)),
            ("pods".to_owned(), Quantity(self.max_pods.to_string())),
        ]);
        // Allocatable holds back the hard eviction thresholds, as the
        // kubelet's container manager does (no system/kube reservations here).
        let allocatable = BTreeMap::from([
            ("cpu".to_owned(), Quantity(m.cpus.to_string())),
            (
                "memory".to_owned(),
                ki(m.memory_total
                    .saturating_sub(machine::MEMORY_EVICTION_BYTES)),
            ),
            (
                "ephemeral-storage".to_owned(),
                Quantity(
                    (m.fs_capacity - m.fs_capacity * machine::NODEFS_EVICTION_PERCENT / 100)
                        .to_string(),
                ),
            ),
            ("pods".to_owned(), Quantity(self.max_pods.to_string())),
        ]);
        let ip = machine::primary_ip(self.shared.options.node_ip);
        let condition = |kind: &str, on: bool, yes: (&str, &str), no: (&str, &str)| {
            let (reason, message) = if on { yes } else { no };
            let status = if on { "True" } else { "False" };
            let (heartbeat, transition) = match times {
                None => (None, None),
                Some((now, previous)) => {
                    let before = previous
                        .and_then(|p| p.conditions.as_ref())
                        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
                        .filter(|c| c.status == status)
                        .and_then(|c| c.last_transition_time.clone());
                    (
                        Some(now.clone()),
                        Some(before.unwrap_or_else(|| now.clone())),
                    )
                }
            };
            NodeCondition {
                type_: kind.to_owned(),
                status: status.to_owned(),
                reason: Some(reason.to_owned()),
                message: Some(message.to_owned()),
                last_heartbeat_time: heartbeat,
                last_transition_time: transition,
            }
        };
        let not_ready_message = aggregate(not_ready);
        // The eviction manager's conditions when it runs (with the
        // configured thresholds and the transition period); otherwise the
        // default thresholds read here.
        let (memory_pressure, disk_pressure) = match self.health.state().pressure {
            Some(p) => (p.memory, p.disk),
            None => (m.memory_pressure(), m.disk_pressure()),
        };
        // Reasons and messages as pkg/kubelet/nodestatus/setters.go writes them.
        let conditions = vec![
            condition(
                "MemoryPressure",
                memory_pressure,
                (
                    "KubeletHasInsufficientMemory",
                    "kubelet has insufficient memory available",
                ),
                (
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
            ),
            condition(
                "DiskPressure",
                disk_pressure,
                ("KubeletHasDiskPressure", "kubelet has disk pressure"),
                ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ),
            condition(
                "PIDPressure",
                m.pid_pressure(),
                (
                    "KubeletHasInsufficientPID",
                    "kubelet has insufficient PID available",
                ),
                (
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
            ),
            // setters.go `ReadyCondition`: the runtime's and the PLEG's
            // errors, aggregated, are the message.
            condition(
                "Ready",
                not_ready.is_empty(),
                ("KubeletReady", "kubelet is posting ready status"),
                ("KubeletNotReady", not_ready_message.as_str()),
            ),
        ];
        NodeStatus {
            capacity: Some(capacity),
            allocatable: Some(allocatable),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".to_owned(),
                    address: ip.to_string(),
                },
                NodeAddress {
                    type_: "Hostname".to_owned(),
                    address: self.name().to_owned(),
                },
            ]),
            conditions: Some(conditions),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(self.port),
                }),
            }),
            node_info: Some(NodeSystemInfo {
                architecture: m.architecture.clone(),
                boot_id: m.boot_id.clone(),
                container_runtime_version: self.runtime_version.clone(),
                kernel_version: m.kernel_version.clone(),
                kube_proxy_version: String::new(),
                kubelet_version: super::KUBELET_VERSION.to_owned(),
                machine_id: m.machine_id.clone(),
                operating_system: "linux".to_owned(),
                os_image: m.os_image.clone(),
                system_uuid: m.system_uuid.clone(),
                swap: None,
            }),
            ..Default::default()
        }
    }
}

/// The Ready condition's status in `s`.
fn ready(s: &NodeStatus) -> Option<&str> {
    s.conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.as_str())
}

trait WithTransitions {
    fn with_transitions(self, sent: &NodeStatus) -> Self;
}

impl WithTransitions for NodeStatus {
    /// `self` (computed without times) with the transition times of `sent`:
    /// comparing against it ignores heartbeats, and the next patch can keep
    /// each condition's transition time.
    fn with_transitions(mut self, sent: &NodeStatus) -> Self {
        if let (Some(cs), Some(sent)) = (self.conditions.as_mut(), sent.conditions.as_ref()) {
            for c in cs {
                c.last_transition_time = sent
                    .iter()
                    .find(|s| s.type_ == c.type_)
                    .and_then(|s| s.last_transition_time.clone());
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond<'a>(s: &'a NodeStatus, t: &str) -> &'a NodeCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
    }

    #[tokio::test]
    async fn conditions_keep_transitions_and_changes_are_detected() {
        let runtime = RuntimeVersion {
            version: "0.1.0".into(),
            runtime_name: "containerd".into(),
            runtime_version: "1.6.20".into(),
            runtime_api_version: "v1".into(),
        };
        let r = NodeReporter::new(
            crate::api::tests::shared(),
            &Config::default(),
            &runtime,
            NodeHealth::new(),
        );
        let m = Machine {
            cpus: 2,
            memory_total: 4 << 30,
            memory_available: 2 << 30,
            fs_capacity: 1000 << 20,
            fs_available: 500 << 20,
            pid_max: 1000,
            pids: 10,
            ..Default::default()
        };
        let t1 = Time(Timestamp::from_second(1000).unwrap());
        let s1 = r.status(&m, Some((&t1, None)), &[]);
        assert_eq!(s1.capacity.as_ref().unwrap()["memory"].0, "4194304Ki");
        assert_eq!(s1.allocatable.as_ref().unwrap()["memory"].0, "4091904Ki");
        assert_eq!(s1.capacity.as_ref().unwrap()["pods"].0, "110");
        assert_eq!(
            s1.allocatable.as_ref().unwrap()["ephemeral-storage"].0,
            (900u64 << 20).to_string()
        );
        assert_eq!(
            s1.node_info.as_ref().unwrap().container_runtime_version,
            "containerd://1.6.20"
        );
        assert_eq!(cond(&s1, "MemoryPressure").status, "False");

        let pressed = Machine {
            memory_available: 1,
            ..m.clone()
        };
        let t2 = Time(Timestamp::from_second(2000).unwrap());
        let s2 = r.status(&pressed, Some((&t2, Some(&s1))), &[]);
        let mp = cond(&s2, "MemoryPressure");
        assert_eq!(
            (mp.status.as_str(), mp.last_transition_time.as_ref()),
            ("True", Some(&t2))
        );
        let dp = cond(&s2, "DiskPressure");
        assert_eq!(
            dp.last_transition_time.as_ref(),
            Some(&t1),
            "unchanged: kept"
        );
        assert_eq!(dp.last_heartbeat_time.as_ref(), Some(&t2));

        // What `update` compares: equal while nothing changed, whatever the clock.
        let last = r.status(&m, None, &[]).with_transitions(&s1);
        assert_eq!(r.status(&m, None, &[]).with_transitions(&last), last);
        assert_ne!(r.status(&pressed, None, &[]).with_transitions(&last), last);

        // Ready follows the health checks' errors, with the kubelet's reason.
        let ready = cond(&s1, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("True", Some("KubeletReady"))
        );
        let down = r.status(&m, None, &["container runtime is down".into()]);
        let nr = cond(&down, "Ready");
        assert_eq!(
            (
                nr.status.as_str(),
                nr.reason.as_deref(),
                nr.message.as_deref()
            ),
            (
                "False",
                Some("KubeletNotReady"),
                Some("container runtime is down")
            )
        );
        assert_ne!(down.with_transitions(&last), last, "a flip is due at once");
    }
}
