//! `follow=true`: the rest of a container's log, sent as the container
//! writes it, until it stops or the client goes.
//!
//! ```text
//!  initial read (logs::read_log, bounded) ──▶ body
//!  then, from the end of its last whole record:
//!    read new bytes ─▶ whole lines (F records) ─▶ to_plain ─▶ body
//!    at EOF: rotated? reopen the path from 0 · stopped? flush, end · else wait
//! ```
//!
//! The file is polled, not watched: one `stat` and one `read` per follower
//! every [`POLL`], which costs nothing next to a connection, and works the
//! same on every filesystem the log directory may be on.
use std::{
    io::{self, SeekFrom},
    os::unix::fs::MetadataExt as _,
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use hyper::body::Bytes;
use tokio::{
    io::{AsyncReadExt as _, AsyncSeekExt as _},
    sync::mpsc,
};

use super::logs::{self, LogOptions};
use crate::flow::PodsView;

/// How long new output may wait before a follower sees it.
const POLL: Duration = Duration::from_millis(200);
/// Bytes read from the file per step.
const CHUNK: usize = 64 << 10;
/// A run of partial records longer than this is sent without waiting for
/// the record that ends its line, so that a line without end cannot grow a
/// follower's memory without bound.
const MAX_CARRY: usize = 1 << 20;

/// The container whose log is followed, and where its file stands.
pub(super) struct Follow {
    pub view: Arc<dyn PodsView>,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The instance followed: a restart ends the follow, as the kubelet's
    /// does (the client asks again for the new one).
    pub id: String,
    pub path: PathBuf,
    /// Where the initial read stopped: the end of its last whole record.
    pub offset: u64,
    pub opts: LogOptions,
    /// What `limitBytes` still allows after the initial read.
    pub remaining: Option<usize>,
}

/// The end of the last whole record of a file of `len` bytes (a record
/// still being written at its end is left to the follower).
pub(super) fn whole_records_end(file: &mut std::fs::File, len: u64) -> io::Result<u64> {
    use std::io::{Read as _, Seek as _};
    let mut end = len;
    let mut buf = vec![0; CHUNK];
    while end > 0 {
        let start = end.saturating_sub(CHUNK as u64);
        let n = usize::try_from(end - start).unwrap_or(CHUNK);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..n])?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Sends `first`, then what follows it, into `tx` until the container
/// stops, `limitBytes` is reached, or the receiver is dropped.
pub(super) async fn run(mut f: Follow, first: Vec<u8>, tx: mpsc::Sender<io::Result<Bytes>>) {
    if !first.is_empty() && tx.send(Ok(first.into())).await.is_err() {
        return;
    }
    if f.remaining == Some(0) {
        return;
    }
    if let Err(e) = follow(&mut f, &tx).await {
        tracing::debug!(path = %f.path.display(), "following a container log: {e}");
        // The status line has been sent: an error can only cut the body.
        let _ = tx.send(Err(e)).await;
    }
}

async fn follow(f: &mut Follow, tx: &mpsc::Sender<io::Result<Bytes>>) -> io::Result<()> {
    let mut file = tokio::fs::File::open(&f.path).await?;
    let mut ino = file.metadata().await?.ino();
    file.seek(SeekFrom::Start(f.offset)).await?;
    let mut carry = Vec::new();
    let mut buf = vec![0; CHUNK];
    loop {
        let n = file.read(&mut buf).await?;
        if n > 0 {
            carry.extend_from_slice(&buf[..n]);
            let cut = if carry.len() > MAX_CARRY {
                records_end(&carry)
            } else {
                lines_end(&carry)
            };
            if !send(f, tx, carry.drain(..cut).as_slice()).await {
                return Ok(());
            }
            continue;
        }
        // At the end of the file: it was rotated (renamed away and
        // reopened by the runtime), the container stopped, or it is quiet.
        match tokio::fs::metadata(&f.path).await {
            Ok(m) if m.ino() != ino => {
                file = tokio::fs::File::open(&f.path).await?;
                ino = file.metadata().await?.ino();
                continue;
            }
            _ => {}
        }
        if !running(f) {
            // It may have written more between the read above and its exit:
            // read on to the end, a chunk at a time as above, so that what
            // is held stays bounded; its last partial line goes out too.
            loop {
                let n = file.read(&mut buf).await?;
                if n == 0 {
                    return Ok(());
                }
                carry.extend_from_slice(&buf[..n]);
                let cut = records_end(&carry);
                if !send(f, tx, carry.drain(..cut).as_slice()).await {
                    return Ok(());
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = tx.closed() => return Ok(()),
        }
    }
}

fn running(f: &Follow) -> bool {
    f.view
        .container(&f.namespace, &f.pod, &f.container)
        .is_some_and(|c| c.id == f.id && c.running)
}

/// Converts and sends `records`; false once nothing more is to be sent.
async fn send(f: &mut Follow, tx: &mpsc::Sender<io::Result<Bytes>>, records: &[u8]) -> bool {
    if records.is_empty() {
        return true;
    }
    let mut out = logs::to_plain(records, &f.opts);
    if let Some(left) = &mut f.remaining {
        out.truncate(*left);
        *left -= out.len();
    }
    if !out.is_empty() && tx.send(Ok(out.into())).await.is_err() {
        return false;
    }
    f.remaining != Some(0)
}

/// The end of the last whole record (one ending in a newline).
fn records_end(buf: &[u8]) -> usize {
    buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

/// The end of the last record that ends a line (tag `F`): partial records
/// after it wait for theirs, so that a line split by the runtime is sent
/// once, with one timestamp.
fn lines_end(buf: &[u8]) -> usize {
    let mut end = records_end(buf);
    while end > 0 {
        let start = buf[..end - 1]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let tag = buf[start..end - 1].splitn(4, |&b| b == b' ').nth(2);
        if tag.is_some_and(|t| t.starts_with(b"F")) {
            return end;
        }
        end = start;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_records_wait_for_the_end_of_their_line() {
        let buf = b"t stdout F a\nt stdout P b\nt stdout P c\nt std";
        assert_eq!(lines_end(buf), 13);
        assert_eq!(records_end(buf), 39);
        assert_eq!(lines_end(b"t stdout P b\n"), 0);
        assert_eq!(lines_end(b"t stdout P b\nt stdout F c\n"), 26);
        assert_eq!(lines_end(b""), 0);
    }

    #[test]
    fn the_initial_read_ends_at_the_last_whole_record() {
        let path = std::env::temp_dir().join(format!("weir-follow-{}", std::process::id()));
        let text = format!(
            "t stdout F {}\nt stdout F b\nt stdout F unfin",
            "x".repeat(70_000)
        );
        std::fs::write(&path, &text).unwrap();
        let mut file = std::fs::File::open(&path).unwrap();
        let len = text.len() as u64;
        assert_eq!(
            whole_records_end(&mut file, len).unwrap(),
            (text.len() - "t stdout F unfin".len()) as u64
        );
        // No newline in the last window: the search goes on before it.
        assert_eq!(whole_records_end(&mut file, 70_000).unwrap(), 0);
        std::fs::remove_file(&path).unwrap();
    }
}
