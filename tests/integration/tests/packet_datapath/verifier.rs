//! What the kernel verified of each program, against a budget. Programs
//! that grow towards the verifier's limits are how eBPF projects break on
//! the next kernel or compiler; this fails first, with the numbers.
use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use weir_integration::packet_topology::{PacketAgent, PacketTopology};

/// `verified_insns` (instructions the verifier processed, over every path)
/// allowed per program, by the kernel's 15-character program name (both
/// getpeername programs share one). Set from what this kernel (6.18)
/// processed when the budget was written, in parentheses: about twice that
/// for the socket programs and XDP, so that ordinary changes fit and a path
/// explosion does not. TC already takes 44% of the verifier's limit of a
/// million, so its budget stops it at 60%, before a compiler or kernel
/// update can push it over. Raise a budget only with the reason.
const BUDGETS: &[(&str, u64)] = &[
    ("weir_tc_ingress", 600_000), // 440,989
    ("weir_xdp", 400_000),        // 187,046
    ("weir_connect4", 3_000),     // 1,360
    ("weir_connect6", 3_000),     // 1,401
    ("weir_sendmsg4", 8_000),     // 4,100
    ("weir_sendmsg6", 10_000),    // 4,934
    ("weir_recvmsg4", 500),       // 119
    ("weir_recvmsg6", 500),       // 125
    ("weir_getpeernam", 500),     // 119, 125
    ("weir_sock_relea", 2_000),   // 799
];

/// One loaded program as the kernel's `bpf_prog_info` reports it.
#[derive(Debug)]
struct Verified {
    insns: u64,
    xlated: u64,
    jited: u64,
}

#[test]
fn every_program_stays_within_its_verifier_budget() -> Result<()> {
    let topo = PacketTopology::new()?;
    let agent = PacketAgent::start(&topo, &["--acceleration=native"])?;
    // The programs the agent attached: behind its pinned links.
    // By program id: one program can sit behind several links (TC on every
    // device), and two programs can share a truncated name.
    let mut progs: BTreeMap<u64, (String, Verified)> = BTreeMap::new();
    for id in weir_integration::linked_programs(&agent.pin_dir().join("links"))? {
        // Debian's bpftool does not print verified_insns; the kernel's
        // bpf_prog_info has it (5.16+), and aya reads that.
        let info = aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .find(|p| u64::from(p.id()) == id)
            .with_context(|| format!("program {id}"))?;
        progs.insert(
            id,
            (
                info.name_as_str().context("name")?.to_owned(),
                Verified {
                    insns: info
                        .verified_instruction_count()
                        .context("verified_insns (Linux 5.16+)")?
                        .into(),
                    xlated: info.size_translated().unwrap_or(0).into(),
                    jited: info.size_jitted().into(),
                },
            ),
        );
    }
    // The table a reader of a failure needs, in the test's output.
    for (name, v) in progs.values() {
        println!(
            "{name:16} verified {:>8} insns  xlated {:>7} B  jited {:>7} B",
            v.insns, v.xlated, v.jited
        );
    }
    for (name, v) in progs.values() {
        let budget = BUDGETS
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, b)| b)
            .with_context(|| format!("{name} has no budget"))?;
        assert!(
            v.insns <= budget,
            "{name}: the verifier processed {} instructions, over its budget of {budget}",
            v.insns
        );
    }
    for (name, _) in BUDGETS {
        assert!(
            progs.values().any(|(n, _)| n == name),
            "{name} not attached: {progs:?}"
        );
    }
    // Nine socket programs (getpeername4 and 6 share a name), TC and XDP.
    assert_eq!(progs.len(), 11, "{progs:?}");
    Ok(())
}
