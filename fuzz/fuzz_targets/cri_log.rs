//! The CRI log reader behind `/containerLogs`: the query string (first line
//! of the input) and a log file (the rest). Oracles: `limitBytes` bounds the
//! output, and without options a read of the whole file is the file
//! converted at once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_kubelet::server::fuzzing::container_logs;

fuzz_target!(|data: &[u8]| {
    let (query, file) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    let Ok(query) = std::str::from_utf8(query) else {
        return;
    };
    // The whole file, and a read bounded below its size (the rotation case).
    for max in [file.len() as u64, file.len() as u64 / 2] {
        let Some(logs) = container_logs(query, file, max) else {
            return;
        };
        if let Some(limit) = logs.limit_bytes {
            assert!(
                logs.read.len() <= limit,
                "{} bytes over a limit of {limit}",
                logs.read.len()
            );
        }
        if max == file.len() as u64 && logs.limit_bytes.is_none() && logs.tail_lines.is_none() {
            assert_eq!(logs.read, logs.whole);
        }
    }
});
