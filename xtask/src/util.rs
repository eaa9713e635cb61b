use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Runs a command from the workspace root, echoing it, and fails if it fails.
pub fn exec(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {}", show(cmd));
    let status = cmd
        .current_dir(root())
        .status()
        .with_context(|| format!("cannot start {}", show(cmd)))?;
    if !status.success() {
        bail!("{} failed: {status}", show(cmd));
    }
    Ok(())
}

/// Test totals summed over `cargo test`'s "test result:" lines.
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

/// Runs `cargo test …`, passing its output through, and adds up its results.
pub fn exec_tests(cmd: &mut Command, totals: &mut Totals) -> Result<()> {
    use std::io::{BufRead as _, BufReader};
    eprintln!("+ {}", show(cmd));
    let mut child = cmd
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", show(cmd)))?;
    let stdout = child.stdout.take().context("no stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(what), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let n: u64 = n.trim_start_matches("ok.").trim().parse().unwrap_or(0);
                match what {
                    "passed" => totals.passed += n,
                    "failed" => totals.failed += n,
                    "ignored" => totals.ignored += n,
                    _ => {}
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{} failed: {status}", show(cmd));
    }
    Ok(())
}

/// Runs quietly and returns stdout, or `None` if the command fails or is missing.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Builds the agent, the kubelet and the harness's binaries (servers, clients, load
/// generator, `weir-lab`), points the harness at them and clears what a killed
/// run left. Returns the directory they are in.
pub fn prepare_harness(release: bool) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "-p",
        "weir-agent",
        "-p",
        "weir-kubelet",
        "-p",
        "weir-integration",
        "--bins",
    ]);
    if release {
        cmd.arg("--release");
    }
    exec(&mut cmd)?;
    let dir = root().join(if release {
        "target/release"
    } else {
        "target/debug"
    });
    // SAFETY: xtask has no other threads at this point; the harness reads the
    // variable when it spawns binaries.
    unsafe { std::env::set_var("WEIR_BIN_DIR", &dir) };
    exec(Command::new(dir.join("weir-lab")).arg("sweep"))?;
    Ok(dir)
}

/// Builds the release binaries and runs `weir-lab ARGS` (a demo or a bench).
pub fn lab<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Result<()> {
    let dir = prepare_harness(true)?;
    exec(Command::new(dir.join("weir-lab")).args(args))
}
