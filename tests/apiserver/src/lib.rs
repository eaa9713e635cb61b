//! A Kubernetes API server for tests, faithful enough that kube-rs and kubectl
//! cannot tell it from a real one for what Weir does. See the README for what
//! is served and what is approximated.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use weir_test_apiserver::{Options, TestApiServer};
//!
//! let server = TestApiServer::start(Options::default()).await?;
//! let client = server.client().await?;
//! // A separate process (the agent) gets the same cluster through the file.
//! let kubeconfig = server.kubeconfig_path().to_path_buf();
//! server.stop().await;
//! server.restart().await?;
//! # let _ = (client, kubeconfig);
//! # Ok(())
//! # }
//! ```
mod apps;
mod convert;
mod discovery;
mod error;
mod eventually;
mod evictions;
mod handlers;
mod http;
mod kubelet_proxy;
mod patch;
mod pods;
mod proto;
mod rbac;
mod resources;
mod selectors;
mod semantics;
mod server;
mod serviceaccounts;
mod services;
mod store;
mod table;
mod tls;
mod tokens;
mod watch;

pub use error::{ApiError, Error};
pub use eventually::{WAIT, eventually, eventually_within};
pub use server::{Options, TestApiServer};
