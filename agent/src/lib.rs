//! weir-agent: compiles Services and EndpointSlices into the BPF maps that Weir's
//! kernel programs read.
//!
//! ```text
//!  sources ──Change──▶ store ──DesiredFrontend──▶ planner ──MapOp──▶ reconciler ──▶ pinned maps
//! (manifests)        (tables)                     (pure)             (one writer)     ▲
//!                                                                                     │
//!                                         connect4 / sendmsg4 / recvmsg4 / getpeername4
//! ```
pub mod cleanup;
pub mod controller;
pub mod ct_gc;
pub mod datapath;
pub mod hash;
pub mod healthcheck;
pub mod heap;
pub mod inspect;
pub mod intern;
pub mod k8s;
pub mod kube_proxy_cleanup;
pub mod kube_proxy_config;
pub mod link_changes;
pub mod maps;
pub mod model;
pub mod node_addrs;
pub mod parallel;
pub mod planner;
pub mod reconciler;
pub mod report;
pub mod small_set;
pub mod sockdestroy;
pub mod source;
pub mod store;
pub mod telemetry;
