//! Resource quantities ("100m", "1.5Gi", "1e3"). Oracle: `Value` and
//! `MilliValue` round up consistently: ceil(x) == ceil(ceil(1000 x) / 1000).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_kubelet::pod::quantity::Quantity;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(q) = Quantity::parse(text) else {
        return;
    };
    for scale in [-9, -6, -3, 0, 3, 6, 9] {
        let _ = q.scaled(scale);
    }
    if let (Some(v), Some(m)) = (q.value(), q.milli_value()) {
        assert_eq!(
            v.unsigned_abs(),
            m.unsigned_abs().div_ceil(1000),
            "{text:?}: value {v}, milli {m}"
        );
        assert_eq!(v < 0, q.is_negative() && m != 0, "{text:?}: sign");
    }
    assert_eq!(
        q.is_zero(),
        q.value() == Some(0) && q.milli_value() == Some(0)
    );
});
