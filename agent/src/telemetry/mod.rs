//! What the agent tells operators about itself: Prometheus metrics and
//! kube-proxy-compatible health endpoints.
//!
//! ```text
//!  controller ──observe──▶ Metrics ──▶ GET /metrics, /proxyMode, /configz (--metrics-addr)
//!  kube client ──requests──▶  │  ◀── /proc/self (process_*, at each scrape)
//!                             └─ last sync, API contact ─▶ StatusBoard ─▶ GET /statusz
//!      │
//!      └──queued/updated──▶ Health ◀── Node watch (deleting?)
//!                             └──────▶ GET /healthz, /livez  (--healthz-addr)
//! ```
pub mod conns;
pub mod health;
pub mod http;
pub mod kube_proxy;
pub mod metrics;
pub mod process;
pub mod rest_client;
pub mod status;

pub use health::Health;
pub use metrics::Metrics;
