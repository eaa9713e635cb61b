//! The manifest directory's inotify watch, asking only for the events that
//! can change what a file holds. notify's inotify backend also asks for
//! `IN_OPEN`, so every file the agent read came back as an event of its
//! own: at a cold start of 100k files perf put those wakeups and their
//! queueing at a tenth of the agent's CPU, for events it then dropped.
use std::{ffi::OsString, io, path::Path};

use futures::{Stream, StreamExt as _};
use inotify::{EventMask, Inotify, WatchMask};

/// What the directory said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum DirEvent {
    /// An entry of the directory changed. `done`: nothing of that write
    /// comes after this event (closed after writing, renamed into place,
    /// removed).
    Entry { name: OsString, done: bool },
    /// Events were lost, a subdirectory changed, or the directory itself was
    /// removed, moved or stopped being watched: only a full scan can tell.
    Rescan,
}

/// Starts watching `dir`; events from now on, including those of writes
/// made while the first scan runs (the kernel queues them; if its queue
/// overflows, a [`DirEvent::Rescan`] says so).
pub(super) fn watch(dir: &Path) -> io::Result<impl Stream<Item = DirEvent> + Unpin + use<>> {
    let inotify = Inotify::init()?;
    inotify.watches().add(
        dir,
        WatchMask::CLOSE_WRITE
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MODIFY
            | WatchMask::ATTRIB
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF,
    )?;
    let stream = inotify.into_event_stream(vec![0u8; 64 * 1024])?;
    Ok(stream.map(|ev| match ev {
        Ok(ev) => classify(ev.mask, ev.name),
        // A read that failed may have lost events.
        Err(_) => DirEvent::Rescan,
    }))
}

fn classify(mask: EventMask, name: Option<OsString>) -> DirEvent {
    match name {
        Some(name)
            if !mask.intersects(EventMask::Q_OVERFLOW | EventMask::IGNORED | EventMask::ISDIR) =>
        {
            let done =
                mask.intersects(EventMask::CLOSE_WRITE | EventMask::MOVED_TO | EventMask::DELETE);
            DirEvent::Entry { name, done }
        }
        _ => DirEvent::Rescan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_classified_as_the_loop_needs() {
        let name = || Some(OsString::from("a.yaml"));
        let entry = |done| DirEvent::Entry {
            name: "a.yaml".into(),
            done,
        };
        assert_eq!(classify(EventMask::CLOSE_WRITE, name()), entry(true));
        assert_eq!(classify(EventMask::MOVED_TO, name()), entry(true));
        assert_eq!(classify(EventMask::DELETE, name()), entry(true));
        assert_eq!(classify(EventMask::CREATE, name()), entry(false));
        assert_eq!(classify(EventMask::MODIFY, name()), entry(false));
        assert_eq!(classify(EventMask::MOVED_FROM, name()), entry(false));
        assert_eq!(classify(EventMask::Q_OVERFLOW, None), DirEvent::Rescan);
        assert_eq!(classify(EventMask::DELETE_SELF, None), DirEvent::Rescan);
        assert_eq!(classify(EventMask::IGNORED, None), DirEvent::Rescan);
        assert_eq!(
            classify(EventMask::CREATE | EventMask::ISDIR, Some("sub".into())),
            DirEvent::Rescan
        );
    }

    #[tokio::test]
    async fn a_write_is_seen_and_reading_is_not() {
        let dir = std::env::temp_dir().join(format!("weir-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("old.yaml"), "x").unwrap();
        let mut events = watch(&dir).unwrap();
        // Our own reads: no event (notify reported an open for each).
        std::fs::read(dir.join("old.yaml")).unwrap();
        std::fs::write(dir.join("new.yaml"), "y").unwrap();
        let mut seen = Vec::new();
        while let Some(ev) = events.next().await {
            let done = matches!(ev, DirEvent::Entry { done: true, .. });
            seen.push(ev);
            if done {
                break;
            }
        }
        assert!(
            seen.iter()
                .all(|e| matches!(e, DirEvent::Entry { name, .. } if name == "new.yaml")),
            "{seen:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
