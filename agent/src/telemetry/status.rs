//! `GET /statusz` on the metrics port: what only the running agent knows,
//! for `weir-agent inspect status` (the rest it reads from the pins).
//!
//! Times are Unix seconds, so the reader computes ages with its own clock.
use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{SystemTime, UNIX_EPOCH},
};

use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};

use super::Health;

/// Where the agent reads Services from; in API mode, `api` says where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum SourceInfo {
    Api,
    Manifests { dir: String },
}

/// The API server's last answer and the last failure to reach it, as the
/// kube client's requests see them (the `rest_client` layer reports each).
#[derive(Debug, Default)]
pub struct ApiContact(Mutex<Contact>);

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Contact {
    /// `host:port`, set when the client is built.
    pub server: Option<String>,
    /// Any HTTP answer below 500: the server is serving.
    pub last_answer: Option<f64>,
    pub last_error: Option<ApiError>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub at: f64,
    /// The status code, or client-go's `<error>` when no answer came.
    pub code: String,
}

impl ApiContact {
    pub fn set_server(&self, server: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).server = Some(server.to_owned());
    }

    pub fn observe(&self, code: &str) {
        let now = unix(SystemTime::now());
        let mut c = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match code.parse::<u16>() {
            Ok(status) if status < 500 => c.last_answer = Some(now),
            _ => {
                c.last_error = Some(ApiError {
                    at: now,
                    code: code.to_owned(),
                });
            }
        }
    }

    pub fn get(&self) -> Contact {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The `/statusz` body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    pub version: String,
    pub started: f64,
    pub node: String,
    pub source: SourceInfo,
    /// kube-proxy's `/livez`: the agent keeps the datapath in sync.
    pub healthy: bool,
    /// kube-proxy's `/healthz` adds this: the node takes new traffic.
    pub node_eligible: bool,
    /// The last sync's end; `None` before the first.
    pub last_sync: Option<f64>,
    /// Only in API mode.
    pub api: Option<Contact>,
}

/// What `/statusz` is built from, shared with the HTTP server.
pub struct StatusBoard {
    pub started: SystemTime,
    pub node: String,
    pub source: SourceInfo,
    pub health: Arc<Health>,
    /// The metrics' `weir_last_sync_timestamp_seconds`, shared.
    pub last_sync: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub api: Arc<ApiContact>,
}

impl StatusBoard {
    pub fn status(&self) -> AgentStatus {
        let h = self.health.status();
        let last_sync = self.last_sync.get();
        AgentStatus {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started: unix(self.started),
            node: self.node.clone(),
            source: self.source.clone(),
            healthy: h.healthy,
            node_eligible: h.node_eligible,
            last_sync: (last_sync > 0.0).then_some(last_sync),
            api: (self.source == SourceInfo::Api).then(|| self.api.get()),
        }
    }
}

pub fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_failures_are_kept_apart() {
        let c = ApiContact::default();
        assert_eq!(c.get(), Contact::default());
        // A 403 is an answer: the server serves, the agent lacks a right.
        c.observe("403");
        let answered = c.get().last_answer.unwrap();
        assert!(c.get().last_error.is_none());
        c.observe("<error>");
        c.observe("503");
        let got = c.get();
        assert_eq!(got.last_answer, Some(answered));
        assert_eq!(got.last_error.unwrap().code, "503");
    }

    #[test]
    fn manifests_mode_reports_no_api_and_nothing_synced_yet() {
        let board = StatusBoard {
            started: SystemTime::now(),
            node: "n1".into(),
            source: SourceInfo::Manifests {
                dir: "/etc/weir".into(),
            },
            health: Arc::new(Health::new(std::time::Duration::from_secs(60))),
            last_sync: Gauge::default(),
            api: Arc::default(),
        };
        let s = board.status();
        assert_eq!((s.api, s.last_sync, s.healthy), (None, None, false));
        board.last_sync.set(1.5e9);
        let json = serde_json::to_value(board.status()).unwrap();
        assert_eq!(json["source"]["kind"], "manifests");
        assert_eq!(json["last_sync"], 1.5e9);
    }
}
