//! weir-kubelet: a minimal kubelet on containerd's CRI.
pub mod api;
pub mod cli;
pub mod config;
pub mod cri;
pub mod eviction;
pub mod flow;
pub mod health;
pub mod pod;
pub mod safe_path;
pub mod server;
pub mod static_pods;
pub mod worker;
