//! Render tests for the Helm chart (`helm/weir`), unprivileged.
//!
//! The chart is rendered by `helm/render`, a Go program made of the parts Helm
//! renders with (text/template, sprig, ghodss/yaml, gojsonschema); it is built
//! here, offline, against the Go libraries `cargo xtask setup` installs. Every
//! rendered document is parsed into its k8s-openapi type, and serialised back:
//! k8s-openapi ignores fields it does not know, so anything lost on the round
//! trip is a field the API server would reject or drop. Then the properties
//! that make the agent work and keep it least-privileged are asserted.
//!
//! Not covered: an API server's admission (PodSecurity, validation beyond the
//! OpenAPI types), the ServiceMonitor CRD's schema, and helm itself (see the
//! chart README, "Rendering without helm").
//!
//! The pieces, in `helm_chart/`: `render.rs` builds and runs the renderer and
//! splits its output; `parse.rs` parses documents into their types (the round
//! trip); `checks.rs` holds the expected flags and the capability and RBAC
//! helpers; the tests are grouped by what they cover in `defaults.rs`,
//! `options.rs`, `service_monitor.rs` and `validation.rs`.

// `#[path]`: for the crate root a plain `mod render;` would be tests/render.rs,
// which cargo would build as a test target of its own. helm_chart/ has no
// main.rs, so cargo does not make it a target either.
#[path = "helm_chart/checks.rs"]
mod checks;
#[path = "helm_chart/defaults.rs"]
mod defaults;
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
