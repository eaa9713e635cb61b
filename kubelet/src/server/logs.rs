//! CRI container log files back to the container's plain output.
//!
//! containerd writes each chunk of output as
//! `<RFC3339Nano time> <stdout|stderr> <tags> <content>\n`, where the first
//! tag is `P` for a partial line (the runtime split a long line, or the
//! container has not finished it yet) and `F` for the chunk that ends one.

/// The `/containerLogs` query parameters honoured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct LogOptions {
    /// Only the last N lines of output.
    pub tail_lines: Option<usize>,
    /// Prefix each line with the time its first chunk was written.
    pub timestamps: bool,
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
    #[error("{name}={value} is not supported: only the current container's log is kept")]
    Unsupported { name: &'static str, value: String },
}

impl LogOptions {
    /// Parameters the kubelet knows but this one does not honour
    /// (`follow`, `limitBytes`, `sinceSeconds`, ...) are ignored, so a
    /// `kubectl logs -f` still shows what has been written so far.
    pub fn from_query(query: Option<&str>) -> Result<Self, QueryError> {
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
                "previous" if parse_bool("previous", value)? => {
                    return Err(QueryError::Unsupported {
                        name: "previous",
                        value: value.to_owned(),
                    });
                }
                _ => {}
            }
        }
        Ok(opts)
    }
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
        };
        assert_eq!(
            plain(FILE, &opts),
            "2024-01-02T03:04:07Z oops\n2024-01-02T03:04:10Z \n2024-01-02T03:04:11Z with  two  spaces\n"
        );
        let none = LogOptions {
            tail_lines: Some(0),
            timestamps: false,
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

    #[test]
    fn query_parameters() {
        assert_eq!(LogOptions::from_query(None), Ok(LogOptions::default()));
        assert_eq!(
            LogOptions::from_query(Some("tailLines=5&timestamps=true&follow=true")),
            Ok(LogOptions {
                tail_lines: Some(5),
                timestamps: true
            })
        );
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
        assert!(matches!(
            LogOptions::from_query(Some("previous=true")),
            Err(QueryError::Unsupported { .. })
        ));
        assert_eq!(
            LogOptions::from_query(Some("previous=false")),
            Ok(LogOptions::default())
        );
    }
}
