//! One measured value, as the bench's JSON output holds it.
use serde::{Deserialize, Serialize};

/// Dataplane names, as the JSON output spells them.
pub const WEIR_SOCKET: &str = "weir-socket";
pub const WEIR_TC: &str = "weir-tc";
/// `weir-tc` with every Service reached through an external IP (random
/// pick, SNAT), the baseline of [`WEIR_TC_MAGLEV`].
pub const WEIR_TC_EXT: &str = "weir-tc-ext";
/// `weir-tc-ext` with Maglev (`weir.dev/lb-algorithm: maglev`).
pub const WEIR_TC_MAGLEV: &str = "weir-tc-maglev";
pub const IPTABLES: &str = "iptables";
pub const NFTABLES: &str = "nftables";
pub const DIRECT: &str = "direct";

/// A metric over repetitions: median with its spread.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// One of the constants above.
    pub dataplane: String,
    /// Which iptables backend (`legacy`, `nft`); absent for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub services: u32,
    pub endpoints: u32,
    /// e.g. `crr_rate_last`, `crr_p99_last`, `update_latency`.
    pub metric: String,
    /// e.g. `conn/s`, `us`, `ms`, `MiB`.
    pub unit: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Record {
    /// The row label of a dataplane: `iptables-legacy`, `weir-socket`, …
    pub fn label(&self) -> String {
        match &self.variant {
            Some(v) => format!("{}-{v}", self.dataplane),
            None => self.dataplane.clone(),
        }
    }
}

/// Median, minimum and maximum of `samples` (NaN for none).
pub fn summarize(samples: &[f64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        f64::midpoint(v[n / 2 - 1], v[n / 2])
    };
    (median, v[0], v[n - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(summarize(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(summarize(&[4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert!(summarize(&[]).0.is_nan());
    }
}
