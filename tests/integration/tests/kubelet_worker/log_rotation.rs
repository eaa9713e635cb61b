//! Issue 12 item 5: a chatty container's log is rotated on a real
//! containerd: the file is renamed away at `containerLogMaxSize`, containerd
//! reopens a new one (`ReopenContainerLog`) and keeps writing to it, and no
//! more than `containerLogMaxFiles` files are ever left.
use std::{path::Path, sync::Arc, time::Duration};

use anyhow::{Context as _, Result, ensure};
use serde_json::json;
use weir_integration::{containerd::Containerd, images};
use weir_kubelet::worker::{LogRotation, rotate_logs};

use super::support::*;

const MIN: Duration = Duration::from_secs(60);

fn files_in(dir: &Path) -> Result<Vec<(String, u64)>> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| {
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect();
    v.sort();
    Ok(v)
}

async fn chatty_container_is_rotated(ctrd: &Containerd, k: &Kubelet) -> Result<()> {
    let p = pod(
        "chatty",
        json!({"containers": [{"name": "c", "image": images::BUSYBOX,
            "command": sh("i=0; while true; do echo \"line $i 0123456789012345678901234567890123456789\"; i=$((i+1)); done")}]}),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    k.rec
        .wait(&uid, MIN, "Running", |s| phase(s) == "Running")
        .await?;
    let log = k
        .worker
        .view()
        .container("default", "chatty", "c")
        .and_then(|c| c.log)
        .context("log path")?;
    let dir = log.parent().context("log dir")?.to_owned();
    let policy = LogRotation {
        max_size: 256 << 10,
        max_files: 3,
        interval: Duration::from_millis(500),
    };
    let rotation = tokio::spawn(rotate_logs(Arc::new(ctrd.runtime()), policy));
    let mut rotations_seen = 0;
    let mut last_rotated = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let files = files_in(&dir)?;
        // The current file, the newest rotated ones: never more than 3.
        ensure!(
            files.len() <= 3,
            "more than containerLogMaxFiles: {files:?}"
        );
        let rotated: Vec<String> = files
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| n.starts_with("0.log."))
            .collect();
        if rotated != last_rotated {
            rotations_seen += 1;
            last_rotated = rotated;
        }
    }
    rotation.abort();
    ensure!(
        rotations_seen >= 2,
        "the log was rotated {rotations_seen} times"
    );
    // containerd writes to the reopened file: it exists and grows, and it
    // holds whole CRI records. Its first record's text may be the tail of a
    // line: containerd hands the container's output to the log writer in
    // chunks that do not follow lines, and a reopen closes the old writer,
    // which flushes its partial line into the old file.
    let before = std::fs::metadata(&log)?.len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = std::fs::metadata(&log)?.len();
    ensure!(
        after > before,
        "the current log does not grow: {before} → {after}"
    );
    let text = String::from_utf8(std::fs::read(&log)?)?;
    // The last line may still be being written.
    let whole = &text[..text.rfind('\n').context("no whole record")?];
    for record in whole.split('\n') {
        ensure!(is_cri_record(record), "not a CRI log record: {record:?}");
    }
    ensure!(
        whole
            .split('\n')
            .skip(1)
            .any(|r| r.contains(" stdout F line ")),
        "no whole line after the first record"
    );
    Ok(())
}

/// `<RFC 3339 time> <stdout|stderr> <F|P> <text>`, as containerd writes.
fn is_cri_record(record: &str) -> bool {
    let mut f = record.splitn(4, ' ');
    let (Some(time), Some(stream), Some(tag)) = (f.next(), f.next(), f.next()) else {
        return false;
    };
    time.len() >= 20
        && time.ends_with('Z')
        && time.as_bytes()[4] == b'-'
        && time.as_bytes()[10] == b'T'
        && matches!(stream, "stdout" | "stderr")
        && matches!(tag, "F" | "P")
}

#[test]
fn chatty_logs_are_rotated() -> Result<()> {
    weir_integration::sweep::sweep();
    let ctrd = Containerd::start()?;
    on_node(&ctrd, || async {
        let k = start_worker(&ctrd);
        chatty_container_is_rotated(&ctrd, &k).await
    })
}
