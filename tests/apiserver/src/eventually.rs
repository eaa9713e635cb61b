//! The one polling helper the API-level tests share: a condition that
//! becomes true through other processes' work (controllers, kubelets,
//! watches) is polled, never slept for.
use std::{future::Future, time::Duration};

/// How long [`eventually`] waits: generous, since CI has two noisy cores.
pub const WAIT: Duration = Duration::from_secs(20);

/// Polls `f` every 50 ms until it yields `Some`, or panics naming `what`
/// after [`WAIT`].
pub async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, f: impl FnMut() -> F) -> T {
    eventually_within(WAIT, what, f).await
}

/// [`eventually`] with its own limit.
pub async fn eventually_within<T, F: Future<Output = Option<T>>>(
    wait: Duration,
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {wait:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
