//! Chart tests for `helm/weir`, unprivileged, with Helm's own engine.
//!
//! The chart is rendered and linted by Helm v4 itself: `helm/template.py` runs
//! PyPI's `helm-python-sdk` (Helm's Go SDK as a shared library) from the venv
//! `cargo xtask setup` makes, the same action `helm template` runs (client-only
//! dry-run install). Every rendered document is parsed into its k8s-openapi
//! type, and serialised back: k8s-openapi ignores fields it does not know, so
//! anything lost on the round trip is a field the API server would reject or
//! drop. Then the properties that make the agent work and keep it
//! least-privileged are asserted, and `helm lint` must pass.
//!
//! Not covered: an API server's admission (PodSecurity, validation beyond the
//! OpenAPI types), the ServiceMonitor CRD's schema, and what needs a cluster
//! (`helm install`'s release handling).
//!
//! The pieces, in `helm_chart/`: `render.rs` runs the engine and splits its
//! output; `parse.rs` parses documents into their types (the round trip);
//! `checks.rs` holds the expected flags and the capability and RBAC helpers;
//! the tests are grouped by what they cover in `defaults.rs`, `options.rs`,
//! `service_monitor.rs`, `validation.rs` and `lint.rs`.

// `#[path]`: for the crate root a plain `mod render;` would be tests/render.rs,
// which cargo would build as a test target of its own. helm_chart/ has no
// main.rs, so cargo does not make it a target either.
#[path = "helm_chart/checks.rs"]
mod checks;
#[path = "helm_chart/defaults.rs"]
mod defaults;
#[path = "helm_chart/lint.rs"]
mod lint;
#[path = "helm_chart/migration.rs"]
mod migration;
#[path = "helm_chart/options.rs"]
mod options;
#[path = "helm_chart/parse.rs"]
mod parse;
#[path = "helm_chart/render.rs"]
mod render;
#[path = "helm_chart/service_monitor.rs"]
mod service_monitor;
#[path = "helm_chart/validation.rs"]
mod validation;
