//! `cargo xtask fuzz`: every cargo-fuzz target in fuzz/ for a while each, and
//! the short run `cargo xtask test` makes. fuzz/README.md says what each
//! target checks.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::util::{exec, root, show};

/// Per target in `cargo xtask test`: enough to replay the corpus and the
/// regressions and to mutate a little, short enough that eight targets add
/// well under a minute after the build.
pub const TEST_SECS: u64 = 5;

/// The same flags for build and run, or `run` rebuilds. `-s none`: the code
/// under test is safe Rust, whose bugs show as panics and overflow checks,
/// so ASan would only double build and run time. 16 codegen units: see
/// fuzz/Cargo.toml's profile.
const FLAGS: &[&str] = &["-s", "none", "--codegen-units", "16"];

/// `cargo +nightly …` through rustup's proxy on PATH: `$CARGO` is the stable
/// toolchain's own cargo, which knows no `+toolchain`.
fn nightly_cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg("+nightly").env_remove("RUSTC");
    cmd
}

fn cargo_fuzz(sub: &str) -> Command {
    let mut cmd = nightly_cargo();
    cmd.args(["fuzz", sub]).args(FLAGS);
    // The agent's build.rs would build the eBPF programs in a nested cargo;
    // the targets never load them, and skipping keeps cargo-fuzz's
    // instrumentation flags out of that build (agent/build.rs).
    cmd.env("AYA_BUILD_SKIP", "1");
    cmd
}

/// The targets, as cargo-fuzz reads them from fuzz/Cargo.toml.
fn targets() -> Result<Vec<String>> {
    let out = nightly_cargo()
        .args(["fuzz", "list"])
        .current_dir(root())
        .output()
        .context("cannot run `cargo fuzz list` (`cargo xtask setup` installs cargo-fuzz)")?;
    if !out.status.success() {
        bail!(
            "cargo fuzz list failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// Builds every target, then runs each for `secs` seconds. The checked-in
/// seeds (fuzz/corpus/T) and crash reproducers (fuzz/regressions/T) are read
/// first, so a regression fails within the first second; what the fuzzer
/// finds goes to target/fuzz/corpus/T, never into the checked-in tree.
pub fn run(secs: u64) -> Result<()> {
    let start = Instant::now();
    exec(&mut cargo_fuzz("build"))?;
    let built = start.elapsed();
    let work = root().join("target/fuzz");
    let mut failed = Vec::new();
    for t in targets()? {
        if let Err(e) = run_one(&t, secs, &work) {
            eprintln!("{e:#}");
            failed.push(t);
        }
    }
    eprintln!(
        "fuzz: built in {:.0}s, all done in {:.0}s",
        built.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        bail!(
            "fuzz targets failed: {} (the crashing inputs are in {}; once fixed, \
             copy each to fuzz/regressions/<target>/)",
            failed.join(", "),
            work.join("artifacts").display()
        );
    }
    Ok(())
}

fn run_one(target: &str, secs: u64, work: &Path) -> Result<()> {
    let fuzz = root().join("fuzz");
    let corpus = work.join("corpus").join(target);
    let artifacts = work.join("artifacts").join(target);
    let log = work.join("logs").join(format!("{target}.log"));
    // The targets that need files write them under TMPDIR: one directory per
    // run, removed after it, so no run leaves anything in /tmp.
    let tmp = work.join("tmp").join(target);
    let _ = std::fs::remove_dir_all(&tmp);
    for d in [&corpus, &artifacts, &tmp] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    std::fs::create_dir_all(work.join("logs"))?;
    let mut cmd = cargo_fuzz("run");
    cmd.arg(target).arg(&corpus);
    // libFuzzer writes new inputs to the first directory only.
    for seeds in [
        fuzz.join("corpus").join(target),
        fuzz.join("regressions").join(target),
    ] {
        if seeds.is_dir() {
            cmd.arg(seeds);
        }
    }
    cmd.arg("--").args([
        format!("-max_total_time={secs}"),
        format!("-artifact_prefix={}/", artifacts.display()),
        // A hang is a finding too; libFuzzer's default waits 20 minutes.
        "-timeout=10".to_owned(),
        "-print_final_stats=1".to_owned(),
    ]);
    eprintln!("+ {}", show(&cmd));
    let file = std::fs::File::create(&log)?;
    let status = cmd
        .env("TMPDIR", &tmp)
        .current_dir(root())
        .stdout(file.try_clone()?)
        .stderr(file)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("cannot start cargo fuzz run {target}"))?;
    let _ = std::fs::remove_dir_all(&tmp);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .map_or("?", str::trim)
            .to_owned()
    };
    if !status.success() {
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "fuzz {target}: FAILED ({status}); last lines of {}:\n{}",
            log.display(),
            tail.join("\n")
        );
    }
    // libFuzzer's last status line: "#N DONE cov: C ft: F corp: K/SIZE ...".
    let done = text
        .lines()
        .rev()
        .find_map(|l| l.split_once("DONE").map(|(_, r)| r))
        .and_then(|r| r.split("lim:").next())
        .unwrap_or("")
        .trim();
    eprintln!(
        "fuzz {target}: {} runs in {secs}s ({}/s), {} new inputs, {done}; no crash",
        stat("number_of_executed_units"),
        stat("average_exec_per_sec"),
        stat("new_units_added"),
    );
    Ok(())
}
