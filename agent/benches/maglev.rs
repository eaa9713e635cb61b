//! `cargo xtask bench maglev`: what one Maglev table costs the agent.
//!
//! For each (backends, table size): the userspace build (the paper's
//! permutation fill) and the kernel write (the table's chunks over the
//! previous ones, one batch, into a map of `WEIR_MAGLEV`'s layout), median
//! and maximum over the repetitions; the table's kernel memory (what the
//! map's `memlock` in its fdinfo grew by) and the build's transient
//! userspace memory. The write needs root (CAP_BPF); without it that column
//! says so.
//!
//! Target: build + write of a 1,000-backend table at the default size within
//! 10 ms, so a node re-programs a thousand Maglev frontends in seconds.
use std::{
    net::{IpAddr, Ipv4Addr},
    os::fd::AsRawFd as _,
    sync::Arc,
    time::{Duration, Instant},
};

use weir_abi::Addr;
use weir_agent::{
    maps::maglev::MaglevTables,
    planner::maglev::{Member, TableSpec},
};

const TARGET: Duration = Duration::from_millis(10);

fn members(n: u32) -> Vec<Member> {
    let mut v: Vec<Member> = (0..n)
        .map(|i| Member {
            addr: Addr::from(IpAddr::V4(Ipv4Addr::from(0x0a40_0000 + i + 1))),
            port: 8080u16.to_be(),
            id: i + 1,
        })
        .collect();
    v.sort_unstable();
    v
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort_unstable();
    (v[v.len() / 2], v[v.len() - 1])
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// The `memlock:` line of the map's fdinfo: what the kernel charges for it.
fn memlock(fd: i32) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
}

fn main() {
    // `cargo bench` passes `--bench`; the only option is `--reps N`.
    let args: Vec<String> = std::env::args().collect();
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(20usize);
    println!("Maglev table cost, {reps} repetitions each\n");
    println!(
        "| backends | table size | build p50 ms | build max ms | write p50 ms | write max ms | kernel KiB | build heap KiB |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut verdict = None;
    for n in [10u32, 100, 1000] {
        for m in [weir_abi::maglev::DEFAULT_TABLE_SIZE, 65_521] {
            let ms_ = members(n);
            let mut builds = Vec::with_capacity(reps);
            let mut writes = Vec::with_capacity(reps);
            let mut kernel = None;
            let mut write_err = None;
            let spec = TableSpec {
                rev_nat_id: 1,
                size: m,
                members: Arc::from(ms_.clone()),
            };
            let mut map = MaglevTables::create(spec.chunks())
                .map_err(|e| write_err = Some(format!("{e}")))
                .ok();
            let empty = map.as_ref().and_then(|m| memlock(m.as_fd().as_raw_fd()));
            for _ in 0..reps {
                let t = Instant::now();
                let tbl = std::hint::black_box(spec.padded());
                builds.push(t.elapsed());
                let Some(map) = map.as_mut() else { continue };
                let t = Instant::now();
                match map.write(spec.rev_nat_id, &tbl) {
                    Ok(()) => writes.push(t.elapsed()),
                    Err(e) => write_err = Some(format!("{e}")),
                }
                kernel = memlock(map.as_fd().as_raw_fd())
                    .zip(empty)
                    .map(|(full, e)| full - e);
            }
            let (b50, bmax) = stats(builds);
            let (w50, wmax) = if writes.is_empty() {
                ("n/a".to_owned(), write_err.unwrap_or_default())
            } else {
                let (a, b) = stats(writes.clone());
                (ms(a), ms(b))
            };
            // The table itself, plus each backend's walk state.
            let heap = u64::from(m) * 4 + u64::from(n) * 16;
            println!(
                "| {n} | {m} | {} | {} | {w50} | {wmax} | {} | {} |",
                ms(b50),
                ms(bmax),
                kernel.map_or("n/a".to_owned(), |k| (k / 1024).to_string()),
                heap / 1024
            );
            if n == 1000 && m == weir_abi::maglev::DEFAULT_TABLE_SIZE && !writes.is_empty() {
                let total = b50 + stats(writes).0;
                verdict = Some(total);
            }
        }
    }
    match verdict {
        Some(t) => println!(
            "\n1,000 backends, default size: build + write {} ms (target ≤ {} ms): {}",
            ms(t),
            ms(TARGET),
            if t <= TARGET { "met" } else { "MISSED" }
        ),
        None => println!("\nthe kernel write needs root: no verdict"),
    }
}
