//! `weir-agent cleanup-kube-proxy`: removes what kube-proxy's iptables and
//! nftables modes leave in the current network namespace once kube-proxy is
//! gone, as its own `--cleanup` would, so no stale DNAT rule competes with
//! Weir's socket load balancing.
//!
//! For each iptables backend (legacy, nft) and family (IPv4, IPv6) whose tools
//! exist: one `iptables-save` dump, a pure plan per table ([`plan`]), and one
//! `iptables-restore --noflush` transaction per table, so each table either
//! loses all of kube-proxy's chains or nothing. Then tables `ip kube-proxy`
//! and `ip6 kube-proxy` are deleted with `nft`. Which chains count as
//! kube-proxy's is documented in [`plan`].
//!
//! Run it after kube-proxy has stopped: a running kube-proxy recreates its
//! rules within seconds.
pub mod plan;
pub mod save;
pub mod tools;

use std::{
    fmt, io,
    path::{Path, PathBuf},
    process::ExitStatus,
};

use plan::TablePlan;
use save::ParseError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Legacy,
    Nft,
}

impl Backend {
    fn suffix(self) -> &'static str {
        match self {
            Self::Legacy => "legacy",
            Self::Nft => "nft",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    fn command(self) -> &'static str {
        match self {
            Self::Ipv4 => "iptables",
            Self::Ipv6 => "ip6tables",
        }
    }

    fn nft(self) -> &'static str {
        match self {
            Self::Ipv4 => "ip",
            Self::Ipv6 => "ip6",
        }
    }
}

/// One iptables backend and family, named like its tools: `ip6tables-nft`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub backend: Backend,
    pub family: Family,
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.family.command(), self.backend.suffix())
    }
}

/// The name of the table kube-proxy's nftables mode creates in `ip` and `ip6`.
pub const NFT_TABLE: &str = "kube-proxy";

#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("cannot run {}", program.display())]
    Spawn {
        program: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} failed reading the {variant} rules ({status}): {stderr}", tool.display())]
    Save {
        tool: PathBuf,
        variant: Variant,
        status: ExitStatus,
        stderr: String,
    },
    #[error("cannot read the {variant} rules that {} printed", tool.display())]
    Parse {
        tool: PathBuf,
        variant: Variant,
        #[source]
        source: ParseError,
    },
    #[error("{} failed on the {variant} table {table} ({status}): {stderr}", tool.display())]
    Restore {
        tool: PathBuf,
        variant: Variant,
        table: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("{} list tables failed ({status}): {stderr}", tool.display())]
    NftList {
        tool: PathBuf,
        status: ExitStatus,
        stderr: String,
    },
    #[error("{} delete table {family} {NFT_TABLE} failed ({status}): {stderr}", tool.display())]
    NftDelete {
        tool: PathBuf,
        family: &'static str,
        status: ExitStatus,
        stderr: String,
    },
}

/// Returned when the cleanup left something behind; the [`Outcome`] says what.
#[derive(Debug, thiserror::Error)]
#[error("{failures} kube-proxy cleanup step(s) failed")]
pub struct Incomplete {
    pub failures: usize,
}

/// One line of the report.
#[derive(Debug)]
pub enum Entry {
    /// kube-proxy's chains in one table; `error` when its transaction failed.
    Table {
        variant: Variant,
        plan: TablePlan,
        error: Option<CleanupError>,
    },
    /// Table `<family> kube-proxy`.
    NftTable {
        family: &'static str,
        error: Option<CleanupError>,
    },
    Skipped {
        what: String,
        why: String,
    },
    /// A dump or listing that failed, so nothing is known about what it holds.
    Failed(CleanupError),
}

#[derive(Debug)]
pub struct Outcome {
    pub dry_run: bool,
    pub entries: Vec<Entry>,
}

impl Outcome {
    pub fn failures(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| match e {
                Entry::Table { error, .. } | Entry::NftTable { error, .. } => error.is_some(),
                Entry::Failed(_) => true,
                Entry::Skipped { .. } => false,
            })
            .count()
    }

    pub fn result(&self) -> Result<(), Incomplete> {
        match self.failures() {
            0 => Ok(()),
            failures => Err(Incomplete { failures }),
        }
    }
}

/// Finds kube-proxy's leftovers and, unless `dry_run`, removes them.
pub fn cleanup(dry_run: bool) -> Outcome {
    let mut out = Outcome {
        dry_run,
        entries: Vec::new(),
    };
    for backend in [Backend::Legacy, Backend::Nft] {
        for family in [Family::Ipv4, Family::Ipv6] {
            xtables(Variant { backend, family }, dry_run, &mut out.entries);
        }
    }
    nft(dry_run, &mut out.entries);
    out
}

fn xtables(variant: Variant, dry_run: bool, entries: &mut Vec<Entry>) {
    let Some(tools) = tools::xtables(variant.backend, variant.family) else {
        entries.push(Entry::Skipped {
            what: variant.to_string(),
            why: format!("no {variant}-save and {variant}-restore found"),
        });
        return;
    };
    let tables = match dump(&tools.save, variant) {
        Ok(text) => text,
        Err(entry) => return entries.push(*entry),
    };
    let tables = match save::parse(&tables) {
        Ok(t) => t,
        Err(source) => {
            let (tool, variant) = (tools.save, variant);
            let e = CleanupError::Parse {
                tool,
                variant,
                source,
            };
            return entries.push(Entry::Failed(e));
        }
    };
    for table in tables.iter().filter(|t| plan::TABLES.contains(&t.name)) {
        let plan = plan::plan(table);
        if plan.is_empty() {
            continue;
        }
        let error = if dry_run {
            None
        } else {
            restore(&tools.restore, variant, &plan).err()
        };
        entries.push(Entry::Table {
            variant,
            plan,
            error,
        });
    }
}

/// Every table of one variant, or the report entry saying why not.
fn dump(tool: &Path, variant: Variant) -> Result<String, Box<Entry>> {
    // A full dump, not `-t TABLE`: asking legacy iptables for a table creates
    // it, and a dry run must not even do that.
    let ran = tools::run(tool, &[], None).map_err(|source| {
        let program = tool.to_owned();
        Box::new(Entry::Failed(CleanupError::Spawn { program, source }))
    })?;
    if ran.status.success() {
        return Ok(ran.stdout);
    }
    if tools::unsupported(&ran.stderr) {
        return Err(Box::new(Entry::Skipped {
            what: variant.to_string(),
            why: format!("not supported here: {}", ran.stderr),
        }));
    }
    Err(Box::new(Entry::Failed(CleanupError::Save {
        tool: tool.to_owned(),
        variant,
        status: ran.status,
        stderr: ran.stderr,
    })))
}

fn restore(tool: &Path, variant: Variant, plan: &TablePlan) -> Result<(), CleanupError> {
    // `-w`: wait for the xtables lock rather than race another writer.
    let ran =
        tools::run(tool, &["-w", "5", "--noflush"], Some(&plan.restore_input())).map_err(|e| {
            CleanupError::Spawn {
                program: tool.to_owned(),
                source: e,
            }
        })?;
    if ran.status.success() {
        return Ok(());
    }
    Err(CleanupError::Restore {
        tool: tool.to_owned(),
        variant,
        table: plan.table.clone(),
        status: ran.status,
        stderr: ran.stderr,
    })
}

fn nft(dry_run: bool, entries: &mut Vec<Entry>) {
    let Some(tool) = tools::find("nft") else {
        entries.push(Entry::Skipped {
            what: "nftables".to_owned(),
            why: "no nft found".to_owned(),
        });
        return;
    };
    let listing = match nft_list(&tool) {
        Ok(text) => text,
        Err(entry) => return entries.push(*entry),
    };
    let present = tools::nft_tables(&listing);
    for family in [Family::Ipv4.nft(), Family::Ipv6.nft()] {
        if !present.contains(&(family, NFT_TABLE)) {
            continue;
        }
        let error = if dry_run {
            None
        } else {
            nft_delete(&tool, family).err()
        };
        entries.push(Entry::NftTable { family, error });
    }
}

/// `nft list tables`, or the report entry saying why not.
fn nft_list(tool: &Path) -> Result<String, Box<Entry>> {
    let ran = tools::run(tool, &["list", "tables"], None).map_err(|source| {
        let program = tool.to_owned();
        Box::new(Entry::Failed(CleanupError::Spawn { program, source }))
    })?;
    if ran.status.success() {
        return Ok(ran.stdout);
    }
    if tools::unsupported(&ran.stderr) {
        return Err(Box::new(Entry::Skipped {
            what: "nftables".to_owned(),
            why: format!("not supported here: {}", ran.stderr),
        }));
    }
    Err(Box::new(Entry::Failed(CleanupError::NftList {
        tool: tool.to_owned(),
        status: ran.status,
        stderr: ran.stderr,
    })))
}

fn nft_delete(tool: &Path, family: &'static str) -> Result<(), CleanupError> {
    let ran = tools::run(tool, &["delete", "table", family, NFT_TABLE], None).map_err(|e| {
        CleanupError::Spawn {
            program: tool.to_owned(),
            source: e,
        }
    })?;
    if ran.status.success() {
        return Ok(());
    }
    Err(CleanupError::NftDelete {
        tool: tool.to_owned(),
        family,
        status: ran.status,
        stderr: ran.stderr,
    })
}

/// An error with its causes, for a report line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The dry run lists every chain and rule it would remove; the real run
/// counts them, so its output stays short on a large cluster.
impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (mut chains, mut rules, mut nft_tables) = (0, 0, 0);
        for e in &self.entries {
            match e {
                Entry::Table {
                    variant,
                    plan,
                    error,
                } => {
                    let what = format!(
                        "{} and {}",
                        count(plan.chains.len(), "chain"),
                        count(plan.unlinks.len(), "jump rule")
                    );
                    let head = format!("{variant}, table {}", plan.table);
                    match (self.dry_run, error) {
                        (true, _) => writeln!(f, "{head}: would remove {what}")?,
                        (false, None) => writeln!(f, "{head}: removed {what}")?,
                        (false, Some(e)) => {
                            writeln!(f, "{head}: FAILED to remove {what}: {}", chain(e))?;
                        }
                    }
                    if self.dry_run {
                        for c in &plan.chains {
                            writeln!(f, "  chain {c}")?;
                        }
                        for u in &plan.unlinks {
                            writeln!(f, "  rule  {u}")?;
                        }
                    }
                    if error.is_none() {
                        chains += plan.chains.len();
                        rules += plan.unlinks.len();
                    }
                }
                Entry::NftTable { family, error } => {
                    let table = format!("table {family} {NFT_TABLE}");
                    match (self.dry_run, error) {
                        (true, _) => writeln!(f, "nftables: would remove {table}")?,
                        (false, None) => writeln!(f, "nftables: removed {table}")?,
                        (false, Some(e)) => {
                            writeln!(f, "nftables: FAILED to remove {table}: {}", chain(e))?;
                        }
                    }
                    if error.is_none() {
                        nft_tables += 1;
                    }
                }
                Entry::Skipped { what, why } => writeln!(f, "skipped {what}: {why}")?,
                Entry::Failed(e) => writeln!(f, "FAILED: {}", chain(e))?,
            }
        }
        let failures = self.failures();
        if chains + rules + nft_tables == 0 && failures == 0 {
            return writeln!(
                f,
                "nothing to do: no kube-proxy iptables chains, jump rules or nftables tables found"
            );
        }
        let totals = format!(
            "{}, {} and {}",
            count(chains, "chain"),
            count(rules, "jump rule"),
            count(nft_tables, "nftables table")
        );
        if self.dry_run {
            writeln!(f, "dry run, nothing changed: would remove {totals}")?;
        } else {
            writeln!(f, "removed {totals}")?;
        }
        if failures > 0 {
            writeln!(f, "{failures} step(s) failed")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    fn outcome(dry_run: bool, error: Option<CleanupError>) -> Outcome {
        let variant = Variant {
            backend: Backend::Nft,
            family: Family::Ipv6,
        };
        let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n";
        let plan = plan::plan(&save::parse(saved).expect("parses")[0]);
        Outcome {
            dry_run,
            entries: vec![
                Entry::Skipped {
                    what: "iptables-legacy".to_owned(),
                    why: "no iptables-legacy-save and iptables-legacy-restore found".to_owned(),
                },
                Entry::Table {
                    variant,
                    plan,
                    error,
                },
                Entry::NftTable {
                    family: "ip",
                    error: None,
                },
            ],
        }
    }

    #[test]
    fn dry_run_lists_everything() {
        let o = outcome(true, None);
        assert_eq!(
            o.to_string(),
            "skipped iptables-legacy: no iptables-legacy-save and iptables-legacy-restore found
ip6tables-nft, table nat: would remove 1 chain and 1 jump rule
  chain KUBE-SERVICES
  rule  -A PREROUTING -j KUBE-SERVICES
nftables: would remove table ip kube-proxy
dry run, nothing changed: would remove 1 chain, 1 jump rule and 1 nftables table
"
        );
        assert!(o.result().is_ok());
    }

    #[test]
    fn failures_are_reported_and_counted() {
        let o = outcome(
            false,
            Some(CleanupError::Restore {
                tool: "/usr/sbin/ip6tables-nft-restore".into(),
                variant: Variant {
                    backend: Backend::Nft,
                    family: Family::Ipv6,
                },
                table: "nat".to_owned(),
                status: ExitStatus::from_raw(1 << 8),
                stderr: "line 3 failed".to_owned(),
            }),
        );
        let text = o.to_string();
        assert!(text.contains("ip6tables-nft, table nat: FAILED to remove 1 chain and 1 jump rule: /usr/sbin/ip6tables-nft-restore failed on the ip6tables-nft table nat (exit status: 1): line 3 failed\n"), "{text}");
        assert!(
            text.contains("nftables: removed table ip kube-proxy\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "removed 0 chains, 0 jump rules and 1 nftables table\n1 step(s) failed\n"
            ),
            "{text}"
        );
        assert_eq!(o.result().map_err(|e| e.failures).err(), Some(1));
    }

    #[test]
    fn nothing_found_says_so() {
        let o = Outcome {
            dry_run: false,
            entries: Vec::new(),
        };
        assert!(o.to_string().starts_with("nothing to do"));
    }
}
