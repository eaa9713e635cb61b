//! Finding and running `iptables-save`/`-restore` and `nft`.
use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
};

use super::{Backend, Family};

/// Where distributions install the tools, for a `PATH` without sbin (sudo,
/// minimal images).
const SBIN: &[&str] = &["/usr/sbin", "/sbin", "/usr/local/sbin"];

pub fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SBIN.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The save and restore programs of one backend and family.
#[derive(Clone, Debug)]
pub struct Xtables {
    pub save: PathBuf,
    pub restore: PathBuf,
}

/// `iptables-legacy-save` and friends; else the unsuffixed `iptables-save` if
/// its `--version` names this backend (images with a single variant, and
/// iptables before 1.8, which only had legacy and printed no backend).
pub fn xtables(backend: Backend, family: Family) -> Option<Xtables> {
    let base = family.command();
    let suffix = backend.suffix();
    let explicit =
        find(&format!("{base}-{suffix}-save")).zip(find(&format!("{base}-{suffix}-restore")));
    if let Some((save, restore)) = explicit {
        return Some(Xtables { save, restore });
    }
    let (save, restore) = find(&format!("{base}-save")).zip(find(&format!("{base}-restore")))?;
    let out = Command::new(&save).arg("--version").output().ok()?;
    let version = String::from_utf8_lossy(&out.stdout);
    let is = match backend {
        Backend::Legacy => version.contains("(legacy)") || !version.contains('('),
        Backend::Nft => version.contains("(nf_tables)"),
    };
    is.then_some(Xtables { save, restore })
}

/// What a finished program left.
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `program` with `input` on stdin. The input can be tens of megabytes
/// for a large cluster, so a thread feeds it while the output is collected,
/// and a program that stops reading early cannot deadlock us.
pub fn run(program: &Path, args: &[&str], input: Option<&str>) -> std::io::Result<Ran> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdin = child.stdin.take();
    let (output, written) = std::thread::scope(|s| {
        let writer = stdin
            .zip(input)
            .map(|(mut pipe, text)| s.spawn(move || pipe.write_all(text.as_bytes())));
        let output = child.wait_with_output();
        let written = writer.map_or(Ok(()), |w| w.join().unwrap_or(Ok(())));
        (output, written)
    });
    let output = output?;
    // A program that failed explains itself better than the broken pipe does.
    if output.status.success() {
        written?;
    }
    Ok(Ran {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

/// A kernel or build without this backend: a reason to skip, not to fail.
pub fn unsupported(stderr: &str) -> bool {
    ["Protocol not supported", "Operation not supported"]
        .iter()
        .any(|m| stderr.contains(m))
}

/// The `(family, name)` of each table in `nft list tables` output.
pub fn nft_tables(listing: &str) -> Vec<(&str, &str)> {
    listing
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("table"), Some(family), Some(name)) => Some((family, name)),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nft_table_listings() {
        let listing =
            "table ip filter\ntable ip kube-proxy\ntable ip6 kube-proxy\ntable inet mytable\n";
        assert_eq!(
            nft_tables(listing),
            [
                ("ip", "filter"),
                ("ip", "kube-proxy"),
                ("ip6", "kube-proxy"),
                ("inet", "mytable")
            ]
        );
        assert!(nft_tables("").is_empty());
    }

    #[test]
    fn feeds_input_and_collects_output() {
        let ran = run(Path::new("/bin/cat"), &[], Some("hello\n")).expect("cat runs");
        assert!(ran.status.success());
        assert_eq!(ran.stdout, "hello\n");
        let ran = run(
            Path::new("/bin/sh"),
            &["-c", "echo no >&2; exit 3"],
            Some("x"),
        )
        .expect("sh runs");
        assert_eq!(ran.status.code(), Some(3));
        assert_eq!(ran.stderr, "no");
    }
}
