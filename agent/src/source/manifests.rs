//! Standalone source: a directory of Service and EndpointSlice manifests, the way
//! the kubelet runs static pods from `staticPodPath`.
//!
//! Files ending in `.yaml`, `.yml` or `.json` (not starting with a dot) are read;
//! YAML may hold several documents and `kind: List`. Bad input never costs other
//! objects their state: a file that does not parse keeps its previous objects,
//! and an object that fails validation keeps its previous version.
//!
//! inotify events name the files to re-read, so one changed file costs one
//! parse however large the directory is. A full rescan, comparing each file's
//! (mtime, size, inode), runs whenever an event does not name a manifest file
//! (a ConfigMap volume swapping its `..data` link, an inotify queue
//! overflow), when the directory's own stamp changed since the last one
//! (checked every [`RESCAN`]), and every [`FULL_RESCAN`] regardless. An idle
//! directory of 100k files so costs one `stat` every 10 s: a full rescan
//! `stat`s every file, about 0.4 s of CPU at that size.
mod parse;
mod pipeline;
mod watch;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

pub use parse::{ManifestError, lite_agrees};
use parse::{ObjRef, Object, Objects, Opened};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use self::watch::DirEvent;
use super::SourceMsg;
use crate::{
    hash::{
        HashMap as FastMap, HashSet as FastSet, IndexMap as FastIndexMap, IndexSet as FastIndexSet,
    },
    small_set::SmallSet,
    store::Change,
};

/// How long to wait for more events after the first one, so a burst (an
/// editor's write-then-rename, `kubectl` writing several files) lands as one
/// update. inotify delivers a burst within microseconds; this only has to
/// outlast the gaps inside it. An event that ends a write (see
/// [`completes_a_write`]) is not waited on.
const DEBOUNCE: Duration = Duration::from_millis(2);
/// How often the directory's own stamp is compared, as the kubelet checks
/// its static pod path: an entry created, removed or renamed without an
/// event we saw changes it.
const RESCAN: Duration = Duration::from_secs(10);
/// How often every file's stamp is compared even so: the backstop for
/// in-place writes inotify cannot see (a network file system).
const FULL_RESCAN: Duration = Duration::from_secs(300);
/// Files a cold start folds in before it sends what they hold: the
/// controller starts after the first chunk and ends one chunk after the
/// last file is parsed, and each chunk is one sync of about a thousand
/// Services, enough for its writes to batch.
const SCAN_CHUNK: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    ino: u64,
}

#[derive(Debug, Default)]
struct FileState {
    stamp: Option<Stamp>,
    objects: Objects,
    /// The last read failed, or rejected an object.
    had_errors: bool,
}

/// The parsed contents of a manifest directory.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    /// Keyed by one shared copy of each file's name (relative to `dir`),
    /// which the index below holds too: two objects per file at 100k files
    /// made copies of whole paths a large part of a manifest agent's memory.
    files: FastMap<FileName, FileState>,
    /// Which files define each object, so resolving one object never walks
    /// every file. Hashed: a B-tree compared names some 20 times an insert,
    /// a tenth of a cold start's CPU at 100k files.
    defined_in: FastMap<ObjRef, SmallSet<FileName>>,
    /// The directory's stamp when the last scan began.
    dir_stamp: Option<Stamp>,
}

/// A manifest's name within the directory: a single path component.
type FileName = Arc<Path>;

/// What a scan does with one file.
enum Todo {
    /// Read it (again); the read takes its stamp.
    Read,
    /// It is gone: withdraw its objects.
    Forget,
}

/// What reading one file came to.
enum Outcome {
    Gone,
    /// It could not be opened.
    Failed(ManifestError),
    Read {
        stamp: Stamp,
        parsed: Result<parse::Parsed, ManifestError>,
    },
}

/// What one scan needs to look at.
enum Scope<'a> {
    All,
    Paths(&'a BTreeSet<PathBuf>),
}

impl ManifestDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: FastMap::default(),
            defined_in: FastMap::default(),
            dir_stamp: None,
        }
    }

    /// An entry was added, removed or renamed (or the directory itself
    /// replaced) since the last scan began, and no event said so: only a
    /// full scan can see what.
    ///
    /// Every scan, full or of the files events named, takes the stamp first.
    /// A change after that comes with an event of its own (the watch is up
    /// before the first scan), which scans again; so, unlike git's index,
    /// a change within the same timestamp tick is never missed, and a
    /// rename-based write costs no full scan afterwards.
    pub fn dir_changed(&self) -> bool {
        self.dir_stamp.is_none() || dir_stamp(&self.dir) != self.dir_stamp
    }

    /// Takes the directory's stamp again without scanning: for events that
    /// name only files that cannot hold a manifest (a writer's temporary
    /// file). Their entries change the directory's stamp, and a check that
    /// found it changed would scan all of it, stalling the rename that
    /// follows; everything before these events was seen through events.
    pub fn restamp(&mut self) {
        let now = dir_stamp(&self.dir);
        // The same directory only: one put in its place (a link to it
        // swapped) is not the one watched, and only a full scan sees it.
        if let (Some(old), Some(new)) = (&self.dir_stamp, &now)
            && old.ino == new.ino
        {
            self.dir_stamp = now;
        }
    }

    /// Re-reads every file whose stamp changed and forgets removed ones.
    pub fn scan(&mut self) -> std::io::Result<Vec<Change>> {
        self.scan_scope(Scope::All)
    }

    /// Re-reads exactly `paths` (files named by inotify), whatever their stamps.
    pub fn scan_paths(&mut self, paths: &BTreeSet<PathBuf>) -> std::io::Result<Vec<Change>> {
        self.scan_scope(Scope::Paths(paths))
    }

    /// Every file loaded without errors: the view is complete enough to delete
    /// restored state nobody claims.
    pub fn is_clean(&self) -> bool {
        self.files.values().all(|f| !f.had_errors)
    }

    /// As [`Self::scan`], handing each [`SCAN_CHUNK`] files' changes to
    /// `emit` as soon as they are read: at a cold start the controller
    /// programs the first Services while the rest are still being parsed.
    /// `emit` returns false to stop.
    ///
    /// Reading is a pipeline: every core parses ahead (see
    /// [`pipeline::parse_ahead`]) while this thread folds the chunks in and
    /// `emit` hands them on. Parsing a chunk on every core and then folding
    /// it in left a core idle during each fold and at each chunk's uneven
    /// end: a cold start of 100k files kept 1.55 of two cores busy.
    pub fn scan_in_chunks(
        &mut self,
        mut emit: impl FnMut(Vec<Change>) -> bool,
    ) -> std::io::Result<()> {
        let candidates = self.candidates(Scope::All)?;
        let (reads, forgets): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .partition(|(_, todo)| matches!(todo, Todo::Read));
        if !forgets.is_empty() {
            let changes = self.fold(forgets, Vec::new());
            if !changes.is_empty() && !emit(changes) {
                return Ok(());
            }
        }
        let jobs = self.jobs(reads.into_iter().map(|(name, _)| name));
        let dir = self.dir.clone();
        pipeline::parse_ahead(&dir, jobs, SCAN_CHUNK, |chunk| {
            let (names, outcomes): (Vec<_>, Vec<_>) = chunk.into_iter().unzip();
            let candidates = names.into_iter().map(|n| (n, Todo::Read)).collect();
            let changes = self.fold(candidates, outcomes);
            changes.is_empty() || emit(changes)
        });
        Ok(())
    }

    fn scan_scope(&mut self, scope: Scope<'_>) -> std::io::Result<Vec<Change>> {
        let candidates = self.candidates(scope)?;
        Ok(self.read_candidates(candidates))
    }

    /// The files to read again, and the ones to forget.
    fn candidates(&mut self, scope: Scope<'_>) -> std::io::Result<Vec<(FileName, Todo)>> {
        // Before reading: a change made during the scan shows next time.
        self.dir_stamp = dir_stamp(&self.dir);
        let mut candidates = Vec::new();
        match scope {
            Scope::All => {
                // Shared copies, and none at a cold start (nothing to miss):
                // 100k owned paths were most of a cold start's peak.
                let mut seen: FastSet<FileName> =
                    FastSet::with_capacity_and_hasher(self.files.len(), Default::default());
                for entry in std::fs::read_dir(&self.dir)? {
                    let entry = entry?;
                    let name = entry.file_name();
                    let name = Path::new(&name);
                    if !is_manifest(name) {
                        continue;
                    }
                    // A regular file not seen before is read whatever its
                    // stamp, and reading takes the stamp: at a cold start a
                    // `stat` here was 100k path walks before the first
                    // parse. The entry's type comes with the listing; a
                    // link (a ConfigMap's files) is followed by a `stat`
                    // first, so nothing but a regular file is opened.
                    let regular = entry.file_type().is_ok_and(|t| t.is_file());
                    let known = self.files.get_key_value(name);
                    if known.is_none() && regular {
                        candidates.push((Arc::from(name), Todo::Read));
                        continue;
                    }
                    let Some(now) = stamp(&entry.path()) else {
                        continue;
                    };
                    let Some((known, state)) = known else {
                        candidates.push((Arc::from(name), Todo::Read));
                        continue;
                    };
                    seen.insert(Arc::clone(known));
                    if state.stamp.as_ref() != Some(&now) {
                        candidates.push((Arc::clone(known), Todo::Read));
                    }
                }
                for name in self.files.keys().filter(|p| !seen.contains(*p)) {
                    candidates.push((Arc::clone(name), Todo::Forget));
                }
            }
            // Named by inotify: re-read whatever the stamp says, as two writes
            // within one timestamp tick can leave it unchanged.
            Scope::Paths(paths) => {
                for path in paths.iter().filter(|p| is_manifest(p)) {
                    // Events name entries of this directory; anything else
                    // is not one of its manifests.
                    let Ok(name) = path.strip_prefix(&self.dir) else {
                        continue;
                    };
                    // Only a regular file is opened (a FIFO would block the
                    // read, a device is no manifest); anything else is gone.
                    let todo = match stamp(path) {
                        Some(_) => Todo::Read,
                        None => Todo::Forget,
                    };
                    candidates.push((self.shared(name), todo));
                }
            }
        }
        Ok(candidates)
    }

    /// The copy of `name` the index holds, or a new one.
    fn shared(&self, name: &Path) -> FileName {
        self.files
            .get_key_value(name)
            .map_or_else(|| Arc::from(name), |(k, _)| Arc::clone(k))
    }

    /// Reads `candidates` and folds them in; the changes that made.
    fn read_candidates(&mut self, candidates: Vec<(FileName, Todo)>) -> Vec<Change> {
        if candidates.is_empty() {
            return Vec::new();
        }
        let reads = candidates
            .iter()
            .filter(|(_, todo)| matches!(todo, Todo::Read))
            .map(|(name, _)| Arc::clone(name));
        let jobs = self.jobs(reads);
        let n = jobs.len();
        let mut outcomes = Vec::with_capacity(n);
        pipeline::parse_ahead(&self.dir, jobs, n, |read| {
            outcomes.extend(read.into_iter().map(|(_, outcome)| outcome));
            true
        });
        self.fold(candidates, outcomes)
    }

    /// The files `names` to read, each with the objects it held.
    fn jobs(&self, names: impl Iterator<Item = FileName>) -> Vec<pipeline::Job> {
        names
            .map(|name| {
                let previous = self.files.get(&*name).map(|f| f.objects.clone());
                (name, previous.unwrap_or_default())
            })
            .collect()
    }

    /// Folds in `candidates`, whose reads came to `outcomes` (one for each
    /// [`Todo::Read`], in order); the changes that made.
    fn fold(&mut self, candidates: Vec<(FileName, Todo)>, outcomes: Vec<Outcome>) -> Vec<Change> {
        // Only objects of the files that changed can change; resolve just those.
        // Hashed and in reading order: a B-tree here compared names some
        // 40 times an object, a fifth of a cold start's fold.
        let mut touched: FastIndexSet<ObjRef> = FastIndexSet::default();
        for (name, _) in &candidates {
            if let Some(f) = self.files.get(&**name) {
                touched.extend(f.objects.keys());
            }
        }
        let before = self.effective(&touched);
        let mut parse_jobs = Vec::new();
        for (name, todo) in candidates {
            match todo {
                Todo::Read => parse_jobs.push(name),
                Todo::Forget => self.forget(&name),
            }
        }
        debug_assert_eq!(parse_jobs.len(), outcomes.len());
        for (name, outcome) in parse_jobs.into_iter().zip(outcomes) {
            let parsed = match outcome {
                Outcome::Gone => {
                    self.forget(&name);
                    continue;
                }
                Outcome::Failed(e) => Err(e),
                Outcome::Read { stamp, parsed } => {
                    let state = self.files.entry(Arc::clone(&name)).or_default();
                    let empty = stamp.len == 0;
                    state.stamp = Some(stamp);
                    if empty && !state.objects.is_empty() {
                        // A writer that truncates before it writes: wait for
                        // content rather than withdraw every object of the
                        // file for a moment. Deleting the file is how to
                        // withdraw them.
                        debug!(file = %self.dir.join(&name).display(), "manifest is empty, keeping its objects until it has content");
                        continue;
                    }
                    parsed
                }
            };
            match parsed {
                Ok(mut parsed) => {
                    let index = &self.defined_in;
                    parsed.objects.share_service_names(|id| {
                        let r = ObjRef::Service(id.clone());
                        match index.get_key_value(&r)?.0 {
                            ObjRef::Service(known) => Some(known.clone()),
                            ObjRef::EndpointSlice(_) => None,
                        }
                    });
                    let state = self.files.entry(Arc::clone(&name)).or_default();
                    let old = std::mem::replace(&mut state.objects, parsed.objects);
                    state.had_errors = parsed.had_errors;
                    let new: Vec<ObjRef> = state.objects.keys().collect();
                    self.unindex(&name, old.keys());
                    for r in new {
                        self.defined_in
                            .entry(r.clone())
                            .or_default()
                            .insert(Arc::clone(&name));
                        touched.insert(r);
                    }
                }
                Err(e) => {
                    error!(file = %self.dir.join(&name).display(), "{e}; keeping its previous objects");
                    self.files.entry(Arc::clone(&name)).or_default().had_errors = true;
                }
            }
        }
        let after = self.effective(&touched);
        diff(&before, &after)
    }

    /// Withdraws a file that is gone, if it was known.
    fn forget(&mut self, name: &Path) {
        if let Some(old) = self.files.remove(name) {
            info!(file = %self.dir.join(name).display(), "manifest removed");
            self.unindex(name, old.objects.keys());
        }
    }

    fn unindex(&mut self, path: &Path, refs: impl Iterator<Item = ObjRef>) {
        for r in refs {
            if let Some(files) = self.defined_in.get_mut(&r) {
                files.remove(path);
                if files.is_empty() {
                    self.defined_in.remove(&r);
                }
            }
        }
    }

    /// Each of `refs` as the first file (in path order) that defines it says.
    fn effective(&self, refs: &FastIndexSet<ObjRef>) -> FastIndexMap<ObjRef, Object> {
        let mut out = FastIndexMap::with_capacity_and_hasher(refs.len(), Default::default());
        for r in refs {
            let mut files = self.defined_in.get(r).into_iter().flatten();
            let Some(first) = files
                .next()
                .and_then(|p| self.files.get(&**p)?.objects.get(r))
            else {
                continue;
            };
            if let Some(path) = files.next() {
                warn!(file = %self.dir.join(&**path).display(), object = %r, "defined in more than one file; the first file in name order wins");
            }
            out.insert(r.clone(), first.clone());
        }
        out
    }
}

/// Reads and parses the file `name` of `dir`; `previous` is what it held.
fn read_one(dir: &Path, name: &Path, previous: &Objects) -> Outcome {
    let path = dir.join(name);
    match parse::open(&path) {
        Ok(Opened::Gone) => Outcome::Gone,
        Ok(Opened::File(meta, text)) => Outcome::Read {
            stamp: Stamp::of(&meta),
            parsed: text.and_then(|text| parse::parse_file(&path, &text, previous)),
        },
        Err(e) => Outcome::Failed(e),
    }
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        Self {
            modified: meta.modified().ok(),
            len: meta.len(),
            ino: meta.ino(),
        }
    }
}

/// The directory's stamp, following a link to it.
fn dir_stamp(dir: &Path) -> Option<Stamp> {
    Some(Stamp::of(&std::fs::metadata(dir).ok()?))
}

/// The stamp of a manifest, following symlinks (ConfigMap volumes are links).
fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_file)?;
    Some(Stamp::of(&meta))
}

fn is_manifest(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    !name.starts_with('.')
        && matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        )
}

fn diff(
    before: &FastIndexMap<ObjRef, Object>,
    after: &FastIndexMap<ObjRef, Object>,
) -> Vec<Change> {
    let mut changes = Vec::new();
    for (r, old) in before {
        let gone = matches!(after.get(r), None | Some(Object::IgnoredSlice(_)));
        if gone && !matches!(old, Object::IgnoredSlice(_)) {
            changes.push(delete(r));
        }
    }
    for (r, new) in after {
        if before.get(r) == Some(new) {
            continue;
        }
        match new {
            Object::Service(s) => changes.push(Change::UpsertService(Arc::clone(s))),
            Object::Slice(s) => changes.push(Change::UpsertSlice(Arc::clone(s))),
            Object::IgnoredSlice(_) => {}
        }
    }
    changes
}

fn delete(r: &ObjRef) -> Change {
    match r {
        ObjRef::Service(id) => Change::DeleteService(id.clone()),
        ObjRef::EndpointSlice(id) => Change::DeleteSlice(id.clone()),
    }
}

/// What inotify told us since the last scan.
#[derive(Debug, Default)]
struct Pending {
    paths: BTreeSet<PathBuf>,
    full: bool,
    /// Events named entries of the directory that hold no manifest.
    ignored: bool,
}

impl Pending {
    fn add(&mut self, dir: &Path, ev: DirEvent) {
        match ev {
            DirEvent::Entry { name, .. } => {
                let path = dir.join(&name);
                if is_manifest(&path) {
                    self.paths.insert(path);
                } else if name.to_str().is_some_and(|n| n.starts_with("..")) {
                    // A ConfigMap volume swapping its `..data` link: look
                    // at everything.
                    self.full = true;
                } else {
                    // Editor swap files, temporary files, other
                    // extensions: they cannot hold a manifest.
                    self.ignored = true;
                }
            }
            DirEvent::Rescan => self.full = true,
        }
    }
}

/// The event that ends a write of a manifest: a file renamed into place (an
/// atomic save, `kubectl`; a ConfigMap's files are links and never get
/// here), closed after writing, or removed. Nothing of that write comes
/// after it.
fn completes_a_write(dir: &Path, ev: &DirEvent) -> bool {
    matches!(ev, DirEvent::Entry { name, done: true } if is_manifest(&dir.join(name)))
}

/// Watches `dir` and sends changes until the receiver goes away.
pub async fn run(dir: PathBuf, tx: mpsc::Sender<SourceMsg>) -> std::io::Result<()> {
    use futures::{FutureExt as _, StreamExt as _};
    // Up before the first scan: a write during it comes as an event.
    let mut events = watch::watch(&dir)?;

    // The first scan reads every file: off the runtime, sending as it goes.
    let first_tx = tx.clone();
    let first_dir = dir.clone();
    let (mut md, sent) = tokio::task::spawn_blocking(move || {
        let mut md = ManifestDir::new(&first_dir);
        let mut sent = 0;
        md.scan_in_chunks(|changes| {
            sent += changes.len();
            first_tx.blocking_send(SourceMsg::Changes(changes)).is_ok()
        })
        .map(|()| (md, sent))
    })
    .await
    .map_err(|e| std::io::Error::other(format!("the first manifest scan failed: {e}")))??;
    info!(dir = %dir.display(), changes = sent, clean = md.is_clean(), "manifests loaded");
    let mut clean_sent = md.is_clean();
    let synced = SourceMsg::Synced {
        complete: clean_sent,
    };
    if tx.send(synced).await.is_err() {
        return Ok(());
    }
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rescan.tick().await;
    let mut last_full = tokio::time::Instant::now();
    loop {
        let mut pending = Pending::default();
        tokio::select! {
            ev = events.next() => {
                let Some(ev) = ev else { return Ok(()) };
                // A write's last event needs no wait: what came before it
                // is already queued. Nor does an event that names nothing
                // to read (a temporary file being written).
                let last = completes_a_write(&dir, &ev);
                pending.add(&dir, ev);
                if !last && (pending.full || !pending.paths.is_empty()) {
                    tokio::time::sleep(DEBOUNCE).await;
                }
                // Whatever else is queued: a burst lands as one scan.
                while let Some(Some(ev)) = events.next().now_or_never() {
                    pending.add(&dir, ev);
                }
            }
            _ = rescan.tick() => {
                pending.full = md.dir_changed() || last_full.elapsed() >= FULL_RESCAN;
            }
        }
        if !pending.full && pending.paths.is_empty() {
            if pending.ignored {
                md.restamp();
            }
            continue;
        }
        debug!(
            full = pending.full,
            files = pending.paths.len(),
            "rescanning manifests"
        );
        let changes = if pending.full {
            last_full = tokio::time::Instant::now();
            md.scan()
        } else {
            md.scan_paths(&pending.paths)
        };
        match changes {
            Ok(changes) if changes.is_empty() => {}
            Ok(changes) => {
                if tx.send(SourceMsg::Changes(changes)).await.is_err() {
                    return Ok(());
                }
            }
            Err(e) => error!(dir = %dir.display(), "cannot scan manifests: {e}"),
        }
        if !clean_sent && md.is_clean() {
            clean_sent = true;
            if tx.send(SourceMsg::Synced { complete: true }).await.is_err() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests;
