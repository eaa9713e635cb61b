//! `cargo xtask bench`: the datapath bench (Weir against kube-proxy's rulesets
//! and direct connections) and the control-plane scale bench. See README.md.
pub mod datapath;
pub mod kubelet;
pub mod lab;
pub mod maps;
pub mod prog_stats;
pub mod progress;
pub mod record;
pub mod report;
pub mod rules;
pub mod scale;
