//! Test harness for Weir's privileged tests and demo.
//!
//! ```text
//!   root namespace: only the harness; no address, route or rule is touched
//!   ┌──────────── wt-<id>-n (node) ───────────────────────────────┐
//!   │ agent's cgroup: clients (curl, dig, weir-testclient)        │
//!   │ br0 10.77.0.1/24 ─┬─ vb1 ─┬─ vb2 ─ …                          │
//!   └───────────────────┼───────┼─────────────────────────────────┘
//!            wt-<id>-b1 eth0 10.77.0.11   wt-<id>-b2 eth0 10.77.0.12   …
//!            weir-testsrv be1              weir-testsrv be2
//! ```
//! The packet-datapath tests use a second, dual-stack topology with an external
//! client, a node, a local pod and a pod behind a second node:
//! [`packet_topology`].
//!
//! Every resource is owned by a guard that removes it on drop, panics included;
//! [`sweep::sweep`] removes what a killed run left behind.
pub mod agent;
pub mod api;
pub mod bench;
pub mod chart_node;
pub mod client_stream;
pub mod cluster;
pub mod containerd;
pub mod debian_rootfs;
pub mod helm;
pub mod images;
pub mod kubelet;
pub mod manifest;
pub mod packet_topology;
pub mod prog_run;
pub mod release_images;
pub mod sweep;
pub mod topology;

use std::path::PathBuf;

pub use agent::{Agent, ServiceView};
pub use topology::Topology;

/// Runs `bpftool -j ARGS` and returns its JSON: the kernel's view, read
/// without going through the agent.
pub fn bpftool(args: &[&std::ffi::OsStr]) -> anyhow::Result<serde_json::Value> {
    let out = std::process::Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "bpftool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// `bpftool map show` of the map pinned at `path`: its `type`, `flags`,
/// `bytes_value` and the rest.
pub fn pinned_map_show(path: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    bpftool(&[
        "map".as_ref(),
        "show".as_ref(),
        "pinned".as_ref(),
        path.as_os_str(),
    ])
}

/// Entries in the map pinned at `path`. The backends array counts the
/// backends it holds: an element of zeros is a free id.
pub fn pinned_map_len(path: &std::path::Path) -> anyhow::Result<usize> {
    use aya::maps::{Array, Map, MapData, MapType};
    use weir_abi::Backend;
    let data = MapData::from_pin(path)?;
    if matches!(data.info()?.map_type(), Ok(MapType::Array)) {
        let a: Array<MapData, Backend> = Array::try_from(Map::Array(data))?;
        return Ok(a
            .iter()
            .filter(|v| v.as_ref().is_ok_and(|b| *b != Backend::default()))
            .count());
    }
    let v = bpftool(&[
        "map".as_ref(),
        "dump".as_ref(),
        "pinned".as_ref(),
        path.as_os_str(),
    ])?;
    Ok(v.as_array().map_or(0, Vec::len))
}

/// The ids of the programs behind the links pinned in `links_dir`, each
/// once (one program can sit behind several links: TC on every device).
pub fn linked_programs(
    links_dir: &std::path::Path,
) -> anyhow::Result<std::collections::BTreeSet<u64>> {
    let mut ids = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(links_dir)? {
        ids.insert(linked_program(&entry?.path())?);
    }
    Ok(ids)
}

/// The id of the program behind the link pinned at `link`.
pub fn linked_program(link: &std::path::Path) -> anyhow::Result<u64> {
    use anyhow::Context as _;
    let v = bpftool(&[
        "link".as_ref(),
        "show".as_ref(),
        "pinned".as_ref(),
        link.as_os_str(),
    ])?;
    v["prog_id"]
        .as_u64()
        .with_context(|| format!("{}: {v}", link.display()))
}

/// Directory with the built binaries: `WEIR_BIN_DIR`, or `target/debug`.
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("WEIR_BIN_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug"),
        PathBuf::from,
    );
    dir.join(name)
}

/// Polls `f` every 250 ms until it yields `Some`; fails after `within` with
/// `f`'s last error. Errors are retried: a call may fail while what is
/// awaited settles. The harness's one `eventually`.
pub fn eventually<T>(
    what: &str,
    within: std::time::Duration,
    mut f: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = std::time::Instant::now() + within;
    let mut last = String::new();
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("{what}: not within {within:?} (last error: {last})");
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}
