//! Workloads the demo and the drills put on a [`LocalCluster`], all
//! through kubectl: the sample Deployment behind a Service, and client pods
//! that loop on a URL and log every attempt, which the drills count.
use std::{
    collections::BTreeMap,
    io::Write as _,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use serde_json::{Value, json};

use super::{LocalCluster, SAMPLE_IMAGE, SAMPLE_PORT};

/// What a client pod logged: answers per backend (the pod names the sample
/// image serves) and failed attempts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    pub ok: BTreeMap<String, u32>,
    pub failed: u32,
}

impl Tally {
    /// Parses a client's log: `ok <backend>` or `fail` per attempt.
    pub fn parse(log: &str) -> Self {
        let mut t = Self::default();
        for line in log.lines() {
            match line.split_once(' ') {
                Some(("ok", backend)) => *t.ok.entry(backend.trim().to_owned()).or_default() += 1,
                _ if line.trim() == "fail" => t.failed += 1,
                _ => {}
            }
        }
        t
    }

    pub fn attempts(&self) -> u32 {
        self.ok.values().sum::<u32>() + self.failed
    }

    /// What `self` has that `before` had not: the attempts in between.
    pub fn since(&self, before: &Self) -> Self {
        let ok = self
            .ok
            .iter()
            .map(|(k, v)| (k.clone(), v - before.ok.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect();
        Self {
            ok,
            failed: self.failed - before.failed,
        }
    }
}

impl LocalCluster {
    /// `kubectl apply -f -` of `objects`.
    pub fn apply(&self, objects: &[Value]) -> Result<()> {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        let mut child = self
            .kubectl()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(list.to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }

    /// The sample Deployment `name` with `replicas` and a ClusterIP Service
    /// of the same name on port 80. `pod` is merged into the template's spec
    /// (tolerations), `container` into its container (a preStop hook).
    /// Returns the ClusterIP.
    pub fn deploy_web(
        &self,
        name: &str,
        replicas: u32,
        pod: Value,
        container: Value,
    ) -> Result<String> {
        let mut web = json!({"name": "web", "image": SAMPLE_IMAGE,
                             "imagePullPolicy": "IfNotPresent",
                             "ports": [{"name": "http", "containerPort": SAMPLE_PORT}],
                             "readinessProbe": {"tcpSocket": {"port": SAMPLE_PORT},
                                                "periodSeconds": 1}});
        crate::api::merge(&mut web, container);
        let mut spec = json!({"terminationGracePeriodSeconds": 5, "containers": [web]});
        crate::api::merge(&mut spec, pod);
        self.apply(&[
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": name, "namespace": "default"},
                   "spec": {"replicas": replicas,
                            "selector": {"matchLabels": {"app": name}},
                            "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}),
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": name, "namespace": "default"},
                   "spec": {"selector": {"app": name},
                            "ports": [{"port": 80, "targetPort": "http"}]}}),
        ])?;
        self.wait_ready_replicas(name, replicas, Duration::from_secs(90))?;
        let ip = self.kubectl_ok(&["get", "service", name, "-o", "jsonpath={.spec.clusterIP}"])?;
        ensure!(!ip.is_empty(), "service {name} has no ClusterIP");
        Ok(ip)
    }

    /// Waits until Deployment `name` reports `replicas` ready.
    pub fn wait_ready_replicas(&self, name: &str, replicas: u32, within: Duration) -> Result<()> {
        crate::eventually(&format!("{name}: {replicas} ready"), within, || {
            let out = self.kubectl_ok(&[
                "get",
                "deployment",
                name,
                "-o",
                "jsonpath={.status.readyReplicas} {.status.replicas}",
            ])?;
            let want = replicas.to_string();
            Ok(
                (out.split_whitespace().collect::<Vec<_>>() == [want.as_str(), want.as_str()])
                    .then_some(()),
            )
        })
        .map_err(|e| e.context(self.diagnose()))
    }

    /// A pod on `node` that requests `url` every 100 ms, each attempt with
    /// a 2 s deadline, and logs `ok <answer>` or `fail`. Returns once it
    /// runs.
    pub fn start_client(&self, name: &str, node: &str, url: &str) -> Result<()> {
        // No wget -T: busybox 1.35's wget crashes with it; timeout bounds it.
        let script = format!(
            "while true; do r=$(timeout 2 wget -qO- {url} 2>/dev/null) && echo \"ok $r\" || echo fail; \
             sleep 0.1; done"
        );
        self.apply(&[json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"role": "client"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "client", "image": SAMPLE_IMAGE,
                                     "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", script]}]}})])?;
        crate::eventually(
            &format!("client {name} running"),
            Duration::from_secs(60),
            || {
                let phase =
                    self.kubectl_ok(&["get", "pod", name, "-o", "jsonpath={.status.phase}"])?;
                Ok((phase == "Running").then_some(()))
            },
        )
    }

    /// What client `name` has logged so far.
    pub fn tally(&self, name: &str) -> Result<Tally> {
        Ok(Tally::parse(&self.kubectl_ok(&["logs", name])?))
    }

    /// Waits until client `name` has been answered by each of `backends`
    /// since `before`; returns when each answered first (from `start`).
    pub fn wait_answers(
        &self,
        name: &str,
        backends: &[String],
        before: &Tally,
        start: Instant,
        within: Duration,
    ) -> Result<BTreeMap<String, Duration>> {
        let mut first = BTreeMap::new();
        crate::eventually(&format!("{name} answered by {backends:?}"), within, || {
            let t = self.tally(name)?.since(before);
            for b in backends {
                if t.ok.contains_key(b) {
                    first.entry(b.clone()).or_insert_with(|| start.elapsed());
                }
            }
            Ok((first.len() == backends.len()).then_some(()))
        })?;
        Ok(first)
    }

    /// Pod names of Deployment `name` (label `app=<name>`).
    pub fn web_pods(&self, name: &str) -> Result<Vec<String>> {
        Ok(self
            .pods_on_nodes(&format!("app={name}"))?
            .into_iter()
            .map(|p| p.0)
            .collect())
    }

    /// Waits until `client` has been answered by every pod of Deployment
    /// `name`: the baseline before a change.
    pub fn wait_all_answer(&self, client: &str, name: &str) -> Result<()> {
        let pods = self.web_pods(name)?;
        let start = Instant::now();
        self.wait_answers(
            client,
            &pods,
            &Tally::default(),
            start,
            Duration::from_secs(30),
        )
        .map(drop)
    }

    /// `kubectl scale deployment <name> --replicas=N`, then waits until
    /// `client` has been answered by every new pod. Returns, per new pod, the
    /// time from the scale to its first answer, and the client's tally
    /// since the scale.
    pub fn scale_until_served(
        &self,
        name: &str,
        replicas: u32,
        client: &str,
    ) -> Result<(BTreeMap<String, Duration>, Tally)> {
        let old = self.web_pods(name)?;
        let before = self.tally(client)?;
        let start = Instant::now();
        self.kubectl_ok(&[
            "scale",
            "deployment",
            name,
            &format!("--replicas={replicas}"),
        ])?;
        self.wait_ready_replicas(name, replicas, Duration::from_secs(90))?;
        let new: Vec<String> = self
            .web_pods(name)?
            .into_iter()
            .filter(|p| !old.contains(p))
            .collect();
        let first = self.wait_answers(client, &new, &before, start, Duration::from_secs(60))?;
        Ok((first, self.tally(client)?.since(&before)))
    }

    /// Pod names matching `selector`, with their nodes.
    pub fn pods_on_nodes(&self, selector: &str) -> Result<Vec<(String, String)>> {
        let out = self.kubectl_ok(&[
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ])?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // Terminating pods (a deletionTimestamp) are on their way out.
                (f.len() == 2).then(|| (f[0].to_owned(), f[1].to_owned()))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_answers_and_failures_and_subtracts() {
        let before = Tally::parse("ok web-a\nfail\n");
        let after = Tally::parse("ok web-a\nfail\nok web-b\nok web-a\nfail\ngarbage\n");
        assert_eq!(after.attempts(), 5);
        let d = after.since(&before);
        assert_eq!(d.failed, 1);
        assert_eq!(
            d.ok,
            BTreeMap::from([("web-a".into(), 1), ("web-b".into(), 1)])
        );
    }
}
