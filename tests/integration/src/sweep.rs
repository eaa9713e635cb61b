//! Removes what an earlier run left behind when it was killed before its guards
//! ran: only resources with the harness's own prefixes are touched.
use std::process::Command;

use crate::topology::{DIR_PREFIX, NETNS_PREFIX, cgroup2_root};

/// Whether a resource named `<prefix><pid>-…` belongs to a process that is gone.
fn orphaned(name: &str, prefix: &str) -> bool {
    let pid = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.split('-').next())
        .and_then(|p| p.parse::<u32>().ok());
    pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}

pub fn sweep() {
    crate::containerd::sweep_orphans();
    let list = Command::new("ip").args(["netns", "list"]).output();
    let names = list
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for name in names.lines().filter_map(|l| l.split_whitespace().next()) {
        if !orphaned(name, NETNS_PREFIX) {
            continue;
        }
        if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
            for pid in String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|p| p.trim().parse::<i32>().ok())
            {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        eprintln!("sweep: removing leftover netns {name}");
        let _ = Command::new("ip").args(["netns", "del", name]).status();
    }
    if let Ok(entries) = cgroup2_root().and_then(|r| Ok(std::fs::read_dir(r)?)) {
        for e in entries.flatten() {
            if orphaned(&e.file_name().to_string_lossy(), DIR_PREFIX) {
                eprintln!("sweep: removing leftover cgroup {}", e.path().display());
                crate::topology::Cgroup { path: e.path() }.kill_all();
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let tmp = std::env::temp_dir();
    let tmp_prefix = tmp.join(DIR_PREFIX).display().to_string();
    for m in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
        if let Some(rest) = m.strip_prefix(&tmp_prefix)
            && orphaned(rest, "")
        {
            let _ = Command::new("umount").arg(m).status();
        }
    }
    if let Ok(entries) = std::fs::read_dir(&tmp) {
        for e in entries.flatten() {
            if orphaned(&e.file_name().to_string_lossy(), DIR_PREFIX) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
