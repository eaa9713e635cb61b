//! `cargo xtask test`: format and lint checks, unit tests, a short fuzz run,
//! then the privileged integration tests against the real kernel datapath in throwaway namespaces.
use std::process::Command;

use anyhow::Result;

use crate::util::{Totals, cargo, exec, exec_tests, prepare_harness, root};

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
        // Every failing test binary reported, not only the first.
        cargo().args([
            "test",
            "--workspace",
            "--exclude",
            "weir-integration",
            "--no-fail-fast",
        ]),
        &mut totals,
    )?;

    // Every fuzz target briefly, replaying the checked-in corpus and crash
    // reproducers: a fixed crash that comes back fails here.
    crate::fuzz::run(crate::fuzz::TEST_SECS)?;

    // Also clears what an earlier run left when it was killed before its own
    // cleanup ran.
    let bin = prepare_harness(false)?;
    // The images the chart tests run, built the way users build them
    // (`cargo xtask images`), here from the debug binaries just built.
    let images = root().join("target/images-test");
    exec(
        Command::new(bin.join("weir-lab"))
            .args(["images", "--out"])
            .arg(&images),
    )?;
    let mut test = cargo();
    test.args([
        "test",
        "-p",
        "weir-integration",
        "--tests",
        "--no-fail-fast",
        "--",
        "--test-threads=1",
    ])
    .env("WEIR_BIN_DIR", &bin)
    .env("WEIR_IMAGES_DIR", &images);
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
