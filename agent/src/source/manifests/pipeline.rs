//! A cold start's reads as a pipeline: every core reads and parses files
//! ahead, while the scanning thread folds what they parsed into the
//! directory's index, chunk by chunk and in order, and hands each chunk on.
//!
//! ```text
//!   worker 1 ─┐  batches of BATCH files,
//!   worker 2 ─┼─ taken in order, returned  ──▶ fold chunk k ──▶ emit
//!   …        ─┘  in any order                  (in order)
//! ```
//!
//! Nothing waits on a whole chunk's slowest file, and the fold of one
//! chunk overlaps the parse of the next.
use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed},
        mpsc,
    },
};

use super::{FileName, Objects, Outcome, read_one};

/// A file to read, and the objects it held (kept for those that fail to
/// validate now).
pub(super) type Job = (FileName, Objects);

/// Files a worker takes at a time: enough to make taking them cheap, few
/// enough that the workers finish together.
const BATCH: usize = 64;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Reads and parses `jobs` on every core and hands their outcomes to `fold`
/// on this thread, in order, about `chunk` files at a time. `fold` returns
/// false to stop; the workers then stop after the batch they hold.
pub(super) fn parse_ahead(
    dir: &Path,
    jobs: Vec<Job>,
    chunk: usize,
    mut fold: impl FnMut(Vec<(FileName, Outcome)>) -> bool,
) {
    // Threads only pay off for a batch, such as a cold start.
    if cores() < 2 || jobs.len() < BATCH {
        for part in jobs.chunks(chunk.max(1)) {
            let items = part
                .iter()
                .map(|(name, previous)| (Arc::clone(name), read_one(dir, name, previous)))
                .collect();
            if !fold(items) {
                return;
            }
        }
        return;
    }
    let batches: Vec<&[Job]> = jobs.chunks(BATCH).collect();
    let per_chunk = chunk.div_ceil(BATCH).max(1);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // How far the workers may get ahead of the fold: a chunk. More kept
    // more parsed files waiting without syncing any sooner.
    let (tx, rx) = mpsc::sync_channel::<(usize, Vec<Outcome>)>(per_chunk);
    std::thread::scope(|scope| {
        for _ in 0..cores() {
            let tx = tx.clone();
            let (batches, next, stop) = (&batches, &next, &stop);
            scope.spawn(move || {
                while !stop.load(Relaxed) {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(batch) = batches.get(i) else { break };
                    let out = batch
                        .iter()
                        .map(|(name, previous)| read_one(dir, name, previous))
                        .collect();
                    if tx.send((i, out)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        fold_in_order(&batches, per_chunk, rx, &mut fold, &stop);
    });
}

/// Receives the workers' batches and folds them a chunk at a time, in
/// order. Takes `rx` so that returning drops it: a worker blocked on a full
/// channel then fails its send and ends, and the scope can join it.
fn fold_in_order(
    batches: &[&[Job]],
    per_chunk: usize,
    rx: mpsc::Receiver<(usize, Vec<Outcome>)>,
    fold: &mut impl FnMut(Vec<(FileName, Outcome)>) -> bool,
    stop: &AtomicBool,
) {
    let mut ready: Vec<Option<Vec<Outcome>>> = (0..batches.len()).map(|_| None).collect();
    let mut done = 0;
    while done < batches.len() {
        let end = (done + per_chunk).min(batches.len());
        while ready[done..end].iter().any(Option::is_none) {
            // Every worker gone with batches missing: one panicked, and the
            // scope passes its panic on.
            let Ok((i, out)) = rx.recv() else { return };
            ready[i] = Some(out);
        }
        let mut items = Vec::with_capacity((end - done) * BATCH);
        for (batch, out) in batches[done..end].iter().zip(&mut ready[done..end]) {
            let names = batch.iter().map(|(name, _)| Arc::clone(name));
            items.extend(names.zip(out.take().into_iter().flatten()));
        }
        done = end;
        if !fold(items) {
            stop.store(true, Relaxed);
            return;
        }
    }
}
