//! Resource quantities (`100m`, `1.5`, `128Mi`, `1G`, `2e3`) as the scheduler
//! compares them: CPU in millicores, everything else in units, rounded up as
//! upstream's `MilliValue`/`Value` do.

/// A quantity times 1000 (millicores for CPU), or `None` when it does not
/// parse.
pub fn milli(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number: f64 = number.parse().ok()?;
    if number < 0.0 {
        return None;
    }
    let scale: f64 = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    // Rounded up: 0.1m of CPU still asks for 1m.
    Some((number * scale * 1000.0).ceil() as u64)
}

/// Whole units, rounded up (bytes of memory, pods).
pub fn units(q: &str) -> Option<u64> {
    milli(q).map(|m| m.div_ceil(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_like_upstream() {
        for (q, m) in [
            ("100m", Some(100)),
            ("1", Some(1000)),
            ("1.5", Some(1500)),
            ("2e3", Some(2_000_000)),
            ("1k", Some(1_000_000)),
            ("0.1m", Some(1)),
            ("-1", None),
            ("1Zi", None),
            ("", None),
        ] {
            assert_eq!(milli(q), m, "{q}");
        }
        assert_eq!(units("128Mi"), Some(128 << 20));
        assert_eq!(units("1G"), Some(1_000_000_000));
        assert_eq!(units("110"), Some(110));
    }
}
