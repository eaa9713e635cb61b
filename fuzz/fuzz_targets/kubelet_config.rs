//! KubeletConfiguration parsing and validation (`config::parse_str`), YAML or
//! JSON. Oracle: no panic; an accepted config answers the questions the
//! kubelet asks of it at start-up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_kubelet::config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match config::parse_str(text) {
        Ok(c) => drop(c.lease_renew_interval()),
        Err(e) => drop(e.to_string()),
    }
    // The duration grammar on its own: every config duration goes through it.
    let _ = config::parse_go_duration(text);
});
