//! `-o json` for lists too long to encode on one core: at 100k Services the
//! services view is 100 MiB of JSON, and encoding it took as long as
//! reading the maps.
use std::{
    io::{self, Write},
    sync::mpsc,
};

use serde::Serialize;

/// Items a thread encodes at a time: enough that a chunk's bookkeeping is
/// noise, few enough that the chunks in flight hold a few MiB.
const CHUNK: usize = 1024;

/// Writes `items` as one pretty-printed JSON array, byte for byte what
/// `serde_json::to_writer_pretty` writes, encoded by two threads: this one
/// takes the even chunks and a helper the odd ones, and this one writes
/// them in order.
pub fn write_array<T: Serialize + Sync>(out: &mut impl Write, items: &[T]) -> io::Result<()> {
    write_chunked(out, items, CHUNK)
}

fn write_chunked<T: Serialize + Sync>(
    out: &mut impl Write,
    items: &[T],
    chunk: usize,
) -> io::Result<()> {
    if items.len() <= chunk {
        return Ok(serde_json::to_writer_pretty(out, items)?);
    }
    let chunks: Vec<&[T]> = items.chunks(chunk).collect();
    std::thread::scope(|s| {
        // Two in flight keep the helper a chunk ahead. If this thread
        // fails, `rx` is dropped before the scope joins, and the helper's
        // next send fails and ends it.
        let (tx, rx) = mpsc::sync_channel(2);
        let odd = &chunks;
        s.spawn(move || {
            for c in odd.iter().skip(1).step_by(2) {
                if tx.send(encode(c, Vec::new())).is_err() {
                    return;
                }
            }
        });
        let mut own = Vec::new();
        out.write_all(b"[\n")?;
        for (i, c) in chunks.iter().enumerate() {
            if i > 0 {
                out.write_all(b",\n")?;
            }
            let buf = if i % 2 == 0 {
                own = encode(c, std::mem::take(&mut own))?;
                &own
            } else {
                &rx.recv()
                    .map_err(|_| io::Error::other("JSON encoder thread ended"))??
            };
            out.write_all(elements(buf))?;
        }
        out.write_all(b"\n]")
    })
}

/// `items` as a pretty-printed array, in `buf` (cleared first).
fn encode<T: Serialize>(items: &[T], mut buf: Vec<u8>) -> io::Result<Vec<u8>> {
    buf.clear();
    serde_json::to_writer_pretty(&mut buf, items)?;
    Ok(buf)
}

/// The elements of a non-empty pretty-printed array, without its opening
/// `[\n` and closing `\n]`: what joins with `,\n` into a longer one.
fn elements(array: &[u8]) -> &[u8] {
    &array[2..array.len() - 2]
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    #[derive(Serialize)]
    struct Item {
        n: usize,
        name: String,
        tags: Vec<&'static str>,
    }

    #[test]
    fn chunked_output_is_what_one_encoder_writes() {
        let items: Vec<Item> = (0..23)
            .map(|n| Item {
                n,
                name: format!("item-{n}"),
                tags: if n % 3 == 0 { vec![] } else { vec!["a", "b"] },
            })
            .collect();
        for len in [0, 1, 2, 4, 5, 9, 23] {
            for chunk in [1, 2, 4, 1024] {
                let mut got = Vec::new();
                super::write_chunked(&mut got, &items[..len], chunk).unwrap();
                let want = serde_json::to_vec_pretty(&items[..len]).unwrap();
                assert_eq!(
                    String::from_utf8(got).unwrap(),
                    String::from_utf8(want).unwrap(),
                    "{len} items in chunks of {chunk}"
                );
            }
        }
    }

    /// A writer that fails after a few writes, as a closed pipe does.
    struct Failing(usize);

    impl std::io::Write for Failing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            self.0 -= 1;
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failed_write_ends_both_threads_with_the_error() {
        let items: Vec<usize> = (0..10_000).collect();
        let err = super::write_chunked(&mut Failing(5), &items, 8).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
    }
}
