//! `cleanup-kube-proxy`'s reader of `iptables-save` output and the cleanup
//! transaction planned from it. Oracle: the transaction never deletes a
//! chain that a rule it keeps still jumps to (iptables-restore would refuse
//! the whole of it).
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use weir_agent::kube_proxy_cleanup::{plan, save};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(tables) = save::parse(text) else {
        return;
    };
    for table in &tables {
        let p = plan::plan(table);
        let gone: BTreeSet<&str> = p.chains.iter().map(String::as_str).collect();
        let unlinked: BTreeSet<(&str, &str)> = p
            .unlinks
            .iter()
            .map(|u| (u.chain.as_str(), u.spec.as_str()))
            .collect();
        for r in &table.rules {
            if gone.contains(r.chain) {
                continue;
            }
            if r.target.as_deref().is_some_and(|t| gone.contains(t)) {
                assert!(
                    unlinked.contains(&(r.chain, r.spec)),
                    "{r:?} keeps a jump to a deleted chain"
                );
            }
        }
        let input = p.restore_input();
        assert!(input.starts_with(&format!("*{}\n", table.name)));
        assert!(input.ends_with("COMMIT\n"));
    }
});
