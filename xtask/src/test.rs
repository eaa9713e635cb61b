//! `cargo xtask test`: format and lint checks, unit tests, then the privileged
//! integration tests against the real kernel datapath in throwaway namespaces.
use anyhow::Result;

use crate::util::{Totals, cargo, exec, exec_tests, prepare_harness};

pub fn run(filter: Option<&str>) -> Result<()> {
    exec(cargo().args(["fmt", "--all", "--check"]))?;
    exec(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    let mut totals = Totals::default();
    exec_tests(
        cargo().args(["test", "--workspace", "--exclude", "weir-integration"]),
        &mut totals,
    )?;

    // Also clears what an earlier run left when it was killed before its own
    // cleanup ran.
    let bin = prepare_harness(false)?;
    let mut test = cargo();
    test.args([
        "test",
        "-p",
        "weir-integration",
        "--tests",
        "--",
        "--test-threads=1",
    ])
    .env("WEIR_BIN_DIR", &bin);
    if let Some(f) = filter {
        test.arg(f);
    }
    exec_tests(&mut test, &mut totals)?;
    // One closing line for the whole run, unit and integration tests together.
    println!(
        "{} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    Ok(())
}
