//! Run time per program of a Weir lab, from the kernel's own counters
//! (`run_time_ns`, `run_cnt` of `bpf_prog_info`), for the datapath report:
//! what each hook costs per call, next to what the client measured.
use std::{
    collections::BTreeMap,
    os::fd::{FromRawFd as _, OwnedFd},
    path::Path,
};

use anyhow::Result;

/// The report's metric for each program, by the kernel's 15-character name.
const METRICS: &[(&str, &str)] = &[
    ("weir_connect4", "connect4_ns"),
    ("weir_connect6", "connect6_ns"),
    ("weir_sendmsg4", "sendmsg4_ns"),
    ("weir_sendmsg6", "sendmsg6_ns"),
    ("weir_recvmsg4", "recvmsg4_ns"),
    ("weir_recvmsg6", "recvmsg6_ns"),
    ("weir_getpeernam", "getpeername_ns"),
    ("weir_sock_relea", "sock_release_ns"),
    ("weir_tc_ingress", "tc_ingress_ns"),
    ("weir_xdp", "xdp_ns"),
];

/// Counters per metric: total run time (ns) and runs.
pub type Counters = BTreeMap<&'static str, (u64, u64)>;

/// Turns the kernel's run-time accounting on while the returned fd lives
/// (`BPF_ENABLE_STATS`), rather than through the global
/// `kernel.bpf_stats_enabled`, so nothing stays switched on after the
/// bench, even when it fails. `None` (with a note on stderr) where the
/// kernel refuses: the report then has no per-program rows.
pub fn enable() -> Result<Option<OwnedFd>> {
    const BPF_ENABLE_STATS: libc::c_long = 32;
    const BPF_STATS_RUN_TIME: u32 = 0;
    // `union bpf_attr`'s enable_stats member: one u32, padded.
    let attr: [u32; 2] = [BPF_STATS_RUN_TIME, 0];
    // SAFETY: the attr is valid for the size passed; the kernel reads it only.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_ENABLE_STATS,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        eprintln!(
            "bench: no per-program run time: BPF_ENABLE_STATS failed: {}",
            std::io::Error::last_os_error()
        );
        return Ok(None);
    }
    // SAFETY: a new fd the kernel just returned, owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

/// The counters of the programs behind the links pinned under `pins`
/// (`<pins>/links`); empty for a lab without Weir.
pub fn read(pins: Option<&Path>) -> Result<Counters> {
    let mut out = Counters::new();
    let Some(pins) = pins else {
        return Ok(out);
    };
    let ids = crate::linked_programs(&pins.join("links"))?;
    for p in aya::programs::loaded_programs().filter_map(Result::ok) {
        if !ids.contains(&u64::from(p.id())) {
            continue;
        }
        let name = p.name_as_str().unwrap_or_default();
        if let Some(&(_, metric)) = METRICS.iter().find(|(n, _)| *n == name) {
            let e = out.entry(metric).or_default();
            e.0 += u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX);
            e.1 += p.run_count();
        }
    }
    Ok(out)
}

/// Nanoseconds per run of each program that ran between the two readings.
pub fn per_run(before: &Counters, after: &Counters) -> Vec<(&'static str, f64)> {
    after
        .iter()
        .filter_map(|(metric, &(ns, runs))| {
            let (ns0, runs0) = before.get(metric).copied().unwrap_or_default();
            let runs = runs.checked_sub(runs0).filter(|&r| r > 0)?;
            Some((*metric, ns.saturating_sub(ns0) as f64 / runs as f64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_run_counts_only_what_ran_between_the_readings() {
        let before = Counters::from([("sendmsg4_ns", (1_000, 10)), ("recvmsg4_ns", (50, 5))]);
        let after = Counters::from([
            ("sendmsg4_ns", (3_000, 30)),
            ("recvmsg4_ns", (50, 5)),
            ("tc_ingress_ns", (900, 3)),
        ]);
        assert_eq!(
            per_run(&before, &after),
            [("sendmsg4_ns", 100.0), ("tc_ingress_ns", 300.0)]
        );
    }
}
