//! Container log rotation, as the kubelet's `ContainerLogManager` does it:
//! every `containerLogMonitorInterval`, each running container of this
//! kubelet whose log file reached `containerLogMaxSize` has its file renamed
//! to `<log>.<YYYYMMDD-hhmmss>` and the runtime reopens a new one
//! (`ReopenContainerLog`); the oldest rotated files go first so that at
//! most `containerLogMaxFiles` files (the current one included) remain. A
//! chatty container so cannot fill the node's disk. Unlike the kubelet,
//! rotated files are not compressed.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::jiff::Timestamp;

use super::POD_UID_LABEL;
use crate::{
    config::Config,
    cri::{ContainerFilter, ContainerState, Runtime},
};

/// `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMonitorInterval`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRotation {
    pub max_size: u64,
    pub max_files: u32,
    pub interval: Duration,
}

impl LogRotation {
    pub fn from_config(c: &Config) -> Self {
        Self {
            max_size: c.container_log_max_size,
            max_files: c.container_log_max_files,
            interval: c.container_log_monitor_interval,
        }
    }
}

/// What to do with one container's log.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct RotationPlan {
    /// Rotated files to delete first, oldest first.
    pub remove: Vec<PathBuf>,
    /// Where the current file goes.
    pub rotate_to: PathBuf,
}

/// The kubelet's `rotateLog` decision for a log of `size` bytes with the
/// `rotated` files beside it: none below the limit; else keep the newest
/// `max_files - 2` rotated files (the one rotated now and the new current
/// file make `max_files`).
pub(super) fn plan(
    log: &Path,
    size: u64,
    rotated: &[PathBuf],
    policy: &LogRotation,
    now: SystemTime,
) -> Option<RotationPlan> {
    if size < policy.max_size {
        return None;
    }
    // The timestamp suffix sorts by time.
    let mut rotated = rotated.to_vec();
    rotated.sort();
    let keep = policy.max_files.saturating_sub(2) as usize;
    let excess = rotated.len().saturating_sub(keep);
    let stamp = Timestamp::try_from(now)
        .map(|t| t.strftime("%Y%m%d-%H%M%S").to_string())
        .unwrap_or_default();
    let mut name = log.file_name()?.to_os_string();
    name.push(format!(".{stamp}"));
    Some(RotationPlan {
        remove: rotated.drain(..excess).collect(),
        rotate_to: log.with_file_name(name),
    })
}

/// The rotated files of `log`: `<name>.<anything>` beside it.
fn rotated_files(log: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}.", name.to_string_lossy());
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// Checks every running container of this kubelet, then sleeps the
/// interval. Never returns.
pub async fn rotate_logs<R: Runtime + 'static>(rt: Arc<R>, policy: LogRotation) {
    loop {
        tokio::time::sleep(policy.interval).await;
        rotate_once(&*rt, &policy).await;
    }
}

/// One round over the running containers.
pub async fn rotate_once<R: Runtime>(rt: &R, policy: &LogRotation) {
    let filter = ContainerFilter {
        state: Some(ContainerState::Running),
        ..Default::default()
    };
    let Ok(running) = rt.list_containers(&filter).await else {
        return;
    };
    for c in running
        .iter()
        .filter(|c| c.labels.contains_key(POD_UID_LABEL))
    {
        let Ok(status) = rt.container_status(&c.id).await else {
            continue;
        };
        // containerd answers with the full path.
        let Some(log) = status.log_path.filter(|p| p.is_absolute()) else {
            continue;
        };
        let Ok(meta) = std::fs::metadata(&log) else {
            continue;
        };
        let Some(p) = plan(
            &log,
            meta.len(),
            &rotated_files(&log),
            policy,
            SystemTime::now(),
        ) else {
            continue;
        };
        for old in &p.remove {
            if let Err(e) = std::fs::remove_file(old)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %old.display(), error = %e, "cannot remove a rotated log");
            }
        }
        if let Err(e) = std::fs::rename(&log, &p.rotate_to) {
            tracing::warn!(path = %log.display(), error = %e, "cannot rotate the log");
            continue;
        }
        if let Err(e) = rt.reopen_container_log(&c.id).await {
            // Put it back to try again next round, as the kubelet does: the
            // runtime still writes to the renamed file.
            tracing::warn!(container = %c.id, error = %e, "cannot reopen the log after rotation");
            let _ = std::fs::rename(&p.rotate_to, &log);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_files: u32) -> LogRotation {
        LogRotation {
            max_size: 100,
            max_files,
            interval: Duration::from_secs(10),
        }
    }

    #[test]
    fn rotation_keeps_at_most_max_files() {
        let log = Path::new("/logs/c/0.log");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(plan(log, 99, &[], &policy(5), now), None);
        let rotated: Vec<PathBuf> = ["0.log.20231114-000003", "0.log.20231114-000001"]
            .iter()
            .map(|n| log.with_file_name(n))
            .collect();
        let p = plan(log, 100, &rotated, &policy(3), now).unwrap();
        assert_eq!(p.rotate_to, Path::new("/logs/c/0.log.20231114-221320"));
        // max 3: the current file, the one rotated now, one kept.
        assert_eq!(p.remove, [log.with_file_name("0.log.20231114-000001")]);
        let p = plan(log, 100, &rotated, &policy(5), now).unwrap();
        assert!(p.remove.is_empty());
        let p = plan(log, 100, &rotated, &policy(2), now).unwrap();
        assert_eq!(p.remove.len(), 2);
    }
}
