//! CRI container log files back to the container's plain output.
//!
//! containerd writes each chunk of output as
//! `<RFC3339Nano time> <stdout|stderr> <tags> <content>\n`, where the first
//! tag is `P` for a partial line (the runtime split a long line, or the
//! container has not finished it yet) and `F` for the chunk that ends one.
//!
//! A request never reads more of the file than it needs, nor more than
//! [`MAX_LOG_READ`]: `tailLines` reads backwards from the end in growing
//! windows until it holds enough lines, `limitBytes` alone reads forwards
//! from the start until it has enough output.
use std::io::{self, Read, Seek, SeekFrom};

/// The most of one log file a request reads. The file itself is rotated at
/// `containerLogMaxSize` (10 MiB by default), so this is its whole current
/// file but for a container that outran a rotation.
pub(super) const MAX_LOG_READ: u64 = 16 << 20;
/// The first window of a bounded read; it doubles until it is enough.
const FIRST_WINDOW: u64 = 64 << 10;

/// The `/containerLogs` query parameters honoured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct LogOptions {
    /// Only the last N lines of output.
    pub tail_lines: Option<usize>,
    /// Prefix each line with the time its first chunk was written.
    pub timestamps: bool,
    /// At most this many bytes of output (the first ones).
    pub limit_bytes: Option<usize>,
    /// Keep sending what the container writes until it stops.
    pub follow: bool,
    /// The previous instance's log (the one before a restart).
    pub previous: bool,
    /// Only lines written at or after this time (`sinceTime`, or now less
    /// `sinceSeconds`), as the kubelet's `ReadLogs` compares each record.
    pub since: Option<k8s_openapi::jiff::Timestamp>,
}

/// A query parameter this endpoint cannot honour.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum QueryError {
    #[error("{name}: {value:?} is not {expected}")]
    Invalid {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl LogOptions {
    /// The query as the kubelet reads it; `now` anchors `sinceSeconds`.
    pub fn from_query(query: Option<&str>) -> Result<Self, QueryError> {
        Self::from_query_at(query, k8s_openapi::jiff::Timestamp::now())
    }

    pub fn from_query_at(
        query: Option<&str>,
        now: k8s_openapi::jiff::Timestamp,
    ) -> Result<Self, QueryError> {
        let mut opts = LogOptions::default();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "tailLines" => {
                    opts.tail_lines = Some(value.parse().map_err(|_| QueryError::Invalid {
                        name: "tailLines",
                        value: value.to_owned(),
                        expected: "a non-negative integer",
                    })?)
                }
                "timestamps" => opts.timestamps = parse_bool("timestamps", value)?,
                "limitBytes" => {
                    opts.limit_bytes = Some(
                        value
                            .parse()
                            .ok()
                            .filter(|&n: &usize| n > 0)
                            .ok_or_else(|| QueryError::Invalid {
                                name: "limitBytes",
                                value: value.to_owned(),
                                expected: "a positive integer",
                            })?,
                    );
                }
                "previous" => opts.previous = parse_bool("previous", value)?,
                "sinceSeconds" => {
                    let secs: i64 = value.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                        QueryError::Invalid {
                            name: "sinceSeconds",
                            value: value.to_owned(),
                            expected: "a positive integer",
                        }
                    })?;
                    opts.since = now
                        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(secs))
                        .ok();
                }
                "sinceTime" => {
                    let text = percent_decode(value);
                    opts.since = Some(text.parse().map_err(|_| QueryError::Invalid {
                        name: "sinceTime",
                        value: text.clone(),
                        expected: "an RFC 3339 time",
                    })?);
                }
                "follow" => opts.follow = parse_bool("follow", value)?,
                _ => {}
            }
        }
        Ok(opts)
    }
}

/// `%XX` escapes (`+` and `:` arrive escaped in `sinceTime`).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, ..) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Go's strconv.ParseBool, which the kubelet's query decoding uses.
fn parse_bool(name: &'static str, value: &str) -> Result<bool, QueryError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(QueryError::Invalid {
            name,
            value: value.to_owned(),
            expected: "a boolean",
        }),
    }
}

/// `len` bytes of `file` from `start`, from its first whole record on
/// (unless `start` is 0) and up to its last whole one.
fn window(file: &mut (impl Read + Seek), start: u64, len: u64) -> io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(len).read_to_end(&mut buf)?;
    if start > 0 {
        let first = buf
            .iter()
            .position(|&b| b == b'\n')
            .map_or(buf.len(), |i| i + 1);
        buf.drain(..first);
    }
    Ok(buf)
}

/// Records that end a line (`F`): how many whole lines `buf` holds at most.
fn line_ends(buf: &[u8]) -> usize {
    buf.split(|&b| b == b'\n')
        .filter(|r| {
            r.splitn(4, |&b| b == b' ')
                .nth(2)
                .is_some_and(|t| t.starts_with(b"F"))
        })
        .count()
}

/// What `opts` asks of a CRI log file of `len` bytes, as plain output.
/// Reads at most `max` bytes of it: the end for `tailLines` (and without
/// options, as a `kubectl logs` of a big file wants the newest), the start
/// for `limitBytes` alone.
pub(super) fn read_log(
    file: &mut (impl Read + Seek),
    len: u64,
    opts: &LogOptions,
    max: u64,
) -> io::Result<Vec<u8>> {
    let max = max.min(len);
    let mut out = match (opts.tail_lines, opts.limit_bytes) {
        (Some(n), _) => {
            let mut w = FIRST_WINDOW.min(max);
            loop {
                let buf = window(file, len - w, w)?;
                // One more line end than asked: the first line may have
                // begun before the window.
                if w >= max || line_ends(&buf) > n {
                    break to_plain(&buf, opts);
                }
                w = (w * 2).min(max);
            }
        }
        (None, Some(limit)) => {
            let mut w = FIRST_WINDOW.max((limit as u64).saturating_mul(2)).min(max);
            loop {
                let mut buf = window(file, 0, w)?;
                if w < len {
                    // A record cut by the window's end waits for a larger one.
                    let end = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                    buf.truncate(end);
                }
                let out = to_plain(&buf, opts);
                if w >= max || out.len() >= limit {
                    break out;
                }
                w = (w * 2).min(max);
            }
        }
        (None, None) => to_plain(&window(file, len - max, max)?, opts),
    };
    if let Some(limit) = opts.limit_bytes {
        out.truncate(limit);
    }
    Ok(out)
}

struct Line<'a> {
    timestamp: &'a [u8],
    content: Vec<u8>,
    complete: bool,
}

/// Converts a CRI log file to what the container wrote. Partial chunks are
/// joined per stream, so stdout and stderr interleaving mid-line do not mix
/// into one line. Malformed lines are skipped, as the kubelet does.
pub(super) fn to_plain(file: &[u8], opts: &LogOptions) -> Vec<u8> {
    let mut lines: Vec<Line<'_>> = Vec::new();
    // The line each stream (stdout, stderr) is in the middle of, if any.
    let mut open: [Option<usize>; 2] = [None, None];
    for raw in file.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let mut fields = raw.splitn(4, |&b| b == b' ');
        let (Some(timestamp), Some(stream), Some(tags)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let content = fields.next().unwrap_or_default();
        let stream = match stream {
            b"stdout" => 0,
            b"stderr" => 1,
            _ => continue,
        };
        let complete = match tags.split(|&b| b == b':').next() {
            Some(b"F") => true,
            Some(b"P") => false,
            _ => continue,
        };
        match open[stream] {
            Some(i) => {
                lines[i].content.extend_from_slice(content);
                lines[i].complete = complete;
            }
            None => lines.push(Line {
                timestamp,
                content: content.to_vec(),
                complete,
            }),
        }
        open[stream] = if complete {
            None
        } else {
            Some(open[stream].unwrap_or(lines.len() - 1))
        };
    }

    if let Some(since) = opts.since {
        // A line counts from its first chunk, so no half line is shown (the
        // kubelet compares each chunk). A timestamp that does not parse is
        // kept: a line is not dropped for it.
        let before = |l: &Line<'_>| {
            std::str::from_utf8(l.timestamp)
                .ok()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some_and(|t| t < since)
        };
        lines.retain(|l| !before(l));
    }
    let skip = opts.tail_lines.map_or(0, |n| lines.len().saturating_sub(n));
    let last = lines.len().saturating_sub(1);
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate().skip(skip) {
        if opts.timestamps {
            out.extend_from_slice(line.timestamp);
            out.push(b' ');
        }
        out.extend_from_slice(&line.content);
        // A line still being written at the end of the file is shown as the
        // container has written it so far; one cut off earlier by the other
        // stream still ends its own line.
        if line.complete || i != last {
            out.push(b'\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
2024-01-02T03:04:05.000000001Z stdout F first
2024-01-02T03:04:06.5Z stdout P sec
2024-01-02T03:04:07Z stderr F oops
2024-01-02T03:04:08Z stdout P on
2024-01-02T03:04:09Z stdout F d line
not a cri line
2024-01-02T03:04:10Z stdout F 
2024-01-02T03:04:11Z stdout F with  two  spaces
";

    fn plain(file: &str, opts: &LogOptions) -> String {
        String::from_utf8(to_plain(file.as_bytes(), opts)).unwrap()
    }

    #[test]
    fn partial_lines_are_joined_per_stream() {
        assert_eq!(
            plain(FILE, &LogOptions::default()),
            "first\nsecond line\noops\n\nwith  two  spaces\n"
        );
    }

    #[test]
    fn tail_and_timestamps() {
        let opts = LogOptions {
            tail_lines: Some(3),
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(
            plain(FILE, &opts),
            "2024-01-02T03:04:07Z oops\n2024-01-02T03:04:10Z \n2024-01-02T03:04:11Z with  two  spaces\n"
        );
        let none = LogOptions {
            tail_lines: Some(0),
            ..Default::default()
        };
        assert_eq!(plain(FILE, &none), "");
    }

    #[test]
    fn unfinished_line_at_the_end_has_no_newline() {
        let file = "t stdout F a\nt stdout P b\nt stdout P c\n";
        assert_eq!(plain(file, &LogOptions::default()), "a\nbc");
        let cut = "t stdout P a\nt stderr F b\n";
        assert_eq!(plain(cut, &LogOptions::default()), "a\nb\n");
    }

    /// A big file: line `i` is `line <i>` on stdout, each its own record.
    fn big_file(lines: usize) -> Vec<u8> {
        let mut f = Vec::new();
        for i in 0..lines {
            f.extend_from_slice(format!("2024-01-02T03:04:05Z stdout F line {i}\n").as_bytes());
        }
        f
    }

    /// Reads `file` through a reader that counts the bytes it hands out.
    fn read_counting(file: &[u8], opts: &LogOptions, max: u64) -> (String, u64) {
        struct Counting<'a>(std::io::Cursor<&'a [u8]>, u64);
        impl Read for Counting<'_> {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                let n = self.0.read(b)?;
                self.1 += n as u64;
                Ok(n)
            }
        }
        impl Seek for Counting<'_> {
            fn seek(&mut self, p: SeekFrom) -> io::Result<u64> {
                self.0.seek(p)
            }
        }
        let mut r = Counting(std::io::Cursor::new(file), 0);
        let out = read_log(&mut r, file.len() as u64, opts, max).unwrap();
        (String::from_utf8(out).unwrap(), r.1)
    }

    #[test]
    fn tail_reads_backwards_only_what_it_needs() {
        let file = big_file(200_000); // ~7 MB
        let opts = LogOptions {
            tail_lines: Some(3),
            ..Default::default()
        };
        let (out, read) = read_counting(&file, &opts, MAX_LOG_READ);
        assert_eq!(out, "line 199997\nline 199998\nline 199999\n");
        assert!(read <= FIRST_WINDOW, "read {read} bytes for 3 lines");
        // More lines than the first window holds: it grows, and stays bounded.
        let opts = LogOptions {
            tail_lines: Some(5000),
            ..Default::default()
        };
        let (out, read) = read_counting(&file, &opts, MAX_LOG_READ);
        assert_eq!(out.lines().count(), 5000);
        assert!(out.starts_with("line 195000\n"), "{}", &out[..20]);
        assert!(read < 4 * 5000 * 40, "read {read} bytes for 5000 lines");
        // Never more than `max`, however many lines are asked for.
        let opts = LogOptions {
            tail_lines: Some(1_000_000),
            ..Default::default()
        };
        let (_, read) = read_counting(&file, &opts, 1 << 20);
        assert!(read <= 2 << 20, "read {read}");
    }

    #[test]
    fn since_drops_lines_written_before_and_combines_with_tail() {
        let now: k8s_openapi::jiff::Timestamp = "2024-01-02T03:04:10Z".parse().unwrap();
        let at = |q: &str| LogOptions::from_query_at(Some(q), now).unwrap();
        // From 03:04:07: "oops" on; "second line" began before it, and a
        // line counts from its first chunk, so none of it is shown (the
        // kubelet compares each chunk and would print its tail "ond line").
        assert_eq!(
            plain(FILE, &at("sinceTime=2024-01-02T03%3A04%3A07Z")),
            "oops\n\nwith  two  spaces\n"
        );
        assert_eq!(plain(FILE, &at("sinceSeconds=1")), "\nwith  two  spaces\n");
        assert_eq!(
            plain(FILE, &at("sinceSeconds=3&tailLines=1")),
            "with  two  spaces\n"
        );
        for bad in ["sinceSeconds=0", "sinceSeconds=x", "sinceTime=yesterday"] {
            assert!(LogOptions::from_query_at(Some(bad), now).is_err(), "{bad}");
        }
    }

    #[test]
    fn limit_bytes_reads_from_the_start_and_cuts() {
        let file = big_file(200_000);
        let opts = LogOptions {
            limit_bytes: Some(12),
            ..Default::default()
        };
        let (out, read) = read_counting(&file, &opts, MAX_LOG_READ);
        assert_eq!(out, "line 0\nline ");
        assert!(read <= FIRST_WINDOW, "read {read}");
        // With tailLines, the limit applies to the tail's output.
        let opts = LogOptions {
            tail_lines: Some(2),
            limit_bytes: Some(8),
            ..Default::default()
        };
        assert_eq!(read_counting(&file, &opts, MAX_LOG_READ).0, "line 199");
        // A small file, whole.
        let small = big_file(3);
        assert_eq!(
            read_counting(&small, &LogOptions::default(), MAX_LOG_READ).0,
            "line 0\nline 1\nline 2\n"
        );
    }

    #[test]
    fn query_parameters() {
        assert_eq!(LogOptions::from_query(None), Ok(LogOptions::default()));
        assert_eq!(
            LogOptions::from_query(Some("tailLines=5&timestamps=true&follow=true")),
            Ok(LogOptions {
                tail_lines: Some(5),
                timestamps: true,
                limit_bytes: None,
                follow: true,
                ..LogOptions::default()
            })
        );
        assert_eq!(
            LogOptions::from_query(Some("limitBytes=10")).map(|o| o.limit_bytes),
            Ok(Some(10))
        );
        assert!(matches!(
            LogOptions::from_query(Some("limitBytes=0")),
            Err(QueryError::Invalid {
                name: "limitBytes",
                ..
            })
        ));
        assert!(matches!(
            LogOptions::from_query(Some("tailLines=-1")),
            Err(QueryError::Invalid {
                name: "tailLines",
                ..
            })
        ));
        assert!(matches!(
            LogOptions::from_query(Some("timestamps=yes")),
            Err(QueryError::Invalid { .. })
        ));
        assert!(LogOptions::from_query(Some("previous=true")).is_ok_and(|o| o.previous));
        assert_eq!(
            LogOptions::from_query(Some("previous=false")),
            Ok(LogOptions::default())
        );
    }
}
