//! `weir-agent inspect stats`: the datapath's per-CPU counters, summed.
use std::fmt::Write as _;

use serde::Serialize;
use weir_abi::{
    STAT_PROG_NAMES, STAT_PROGS, STAT_REASON_NAMES, STAT_REASONS, StatValue, stat_index,
};

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct StatView {
    /// `xdp`, `tc-ingress` or `sock` (`weir_abi::STAT_PROG_NAMES`).
    pub program: &'static str,
    /// `weir_abi::STAT_REASON_NAMES`.
    pub reason: &'static str,
    pub packets: u64,
    pub bytes: u64,
}

/// One row per (program, reason), in index order, each the sum over CPUs of
/// `per_cpu(index)`; an index the map cannot give counts as zero.
pub fn stats(per_cpu: impl Fn(u32) -> Vec<StatValue>) -> Vec<StatView> {
    let mut out = Vec::new();
    for prog in 0..STAT_PROGS {
        for reason in 0..STAT_REASONS {
            let (packets, bytes) = per_cpu(stat_index(prog, reason))
                .iter()
                .fold((0u64, 0u64), |(p, b), v| {
                    (p.wrapping_add(v.packets), b.wrapping_add(v.bytes))
                });
            out.push(StatView {
                program: STAT_PROG_NAMES[prog as usize],
                reason: STAT_REASON_NAMES[reason as usize],
                packets,
                bytes,
            });
        }
    }
    out
}

pub fn render_table(views: &[StatView]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<11} {:<18} {:>14} {:>16}",
        "PROGRAM", "REASON", "PACKETS", "BYTES"
    );
    for v in views {
        let _ = writeln!(
            out,
            "{:<11} {:<18} {:>14} {:>16}",
            v.program, v.reason, v.packets, v.bytes
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_over_cpus_with_names() {
        let views = stats(|i| {
            if i == stat_index(weir_abi::STAT_PROG_TC_INGRESS, weir_abi::STAT_REPLY) {
                vec![
                    StatValue {
                        packets: 2,
                        bytes: 100,
                    },
                    StatValue {
                        packets: 3,
                        bytes: 50,
                    },
                ]
            } else {
                Vec::new()
            }
        });
        assert_eq!(views.len(), weir_abi::STAT_ENTRIES as usize);
        let hit: Vec<_> = views.iter().filter(|v| v.packets > 0).collect();
        assert_eq!(
            hit,
            vec![&StatView {
                program: "tc-ingress",
                reason: "reply",
                packets: 5,
                bytes: 150
            }]
        );
        assert!(render_table(&views).contains("tc-ingress  reply"));
    }
}
