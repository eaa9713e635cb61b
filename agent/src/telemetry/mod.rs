//! What the agent tells operators about itself: Prometheus metrics and
//! kube-proxy-compatible health endpoints.
//!
//! ```text
//!  controller ──observe──▶ Metrics ──▶ GET /metrics          (--metrics-addr)
//!      │                                                     
//!      └──queued/updated──▶ Health ◀── Node watch (deleting?)
//!                             └──────▶ GET /healthz, /livez  (--healthz-addr)
//! ```
pub mod conns;
pub mod health;
pub mod http;
pub mod metrics;

pub use health::Health;
pub use metrics::Metrics;
