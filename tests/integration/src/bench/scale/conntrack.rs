//! The conntrack collector at full tables: both maps filled with live flows,
//! then the agent's CPU over several sweeps. No traffic is sent; the entries
//! are written from here, as the datapath would have left them.
use std::{
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::maps::{HashMap, Map, MapData};
use weir_abi::{Addr, CtKey, CtValue, PROTO_TCP, PROTO_UDP};

use super::agent::AgentProc;

/// How often the bench's agent sweeps (`--ct-gc-interval`), so a short
/// window holds several sweeps.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// The agent's default `--ct-gc-interval`, to express the cost per sweep as
/// a share of a core in a default deployment.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

pub struct GcCost {
    pub entries: u64,
    pub sweeps: f64,
    pub cpu: f64,
}

impl GcCost {
    /// Per sweep, as a share of one core at the default interval.
    pub fn pct_of_core_at_default(&self) -> f64 {
        100.0 * self.per_sweep() / DEFAULT_INTERVAL.as_secs_f64()
    }

    pub fn per_sweep(&self) -> f64 {
        self.cpu / self.sweeps
    }
}

const TABLES: [(&str, u8); 2] = [
    (weir_abi::MAP_CT_TCP, PROTO_TCP),
    (weir_abi::MAP_CT_UDP, PROTO_UDP),
];

/// Fills both conntrack tables to capacity with flows that expire in an
/// hour, measures the agent over `window`, and empties the tables again:
/// left full, every later phase (`inspect`, the restart) would share the
/// cores with a sweep of a million entries every [`SWEEP_EVERY`], six
/// times as often as a default deployment sweeps.
pub fn measure(pins: &Path, agent: &AgentProc, window: Duration) -> Result<GcCost> {
    let mut entries = 0;
    for (map, proto) in TABLES {
        entries += fill(&pins.join("maps").join(map), proto)?;
    }
    // Sweeps land at their own pace: count whole intervals in the window.
    let (before, started) = (agent.cpu_seconds()?, Instant::now());
    std::thread::sleep(window);
    let cpu = agent.cpu_seconds()? - before;
    let sweeps = (started.elapsed().as_secs_f64() / SWEEP_EVERY.as_secs_f64()).floor();
    for (map, proto) in TABLES {
        empty(&pins.join("maps").join(map), proto)?;
    }
    Ok(GcCost {
        entries,
        sweeps: sweeps.max(1.0),
        cpu,
    })
}

type CtMap = HashMap<MapData, CtKey, CtValue>;

fn open(path: &Path) -> Result<(CtMap, u32)> {
    let data = MapData::from_pin(path).with_context(|| format!("opening {}", path.display()))?;
    let capacity = data.info()?.max_entries();
    Ok((HashMap::try_from(Map::LruHashMap(data))?, capacity))
}

/// The `i`th flow [`fill`] writes.
fn flow(i: u32, proto: u8) -> CtKey {
    let client = Ipv4Addr::from(u32::from_be_bytes([10, 200, 0, 0]) + (i >> 8));
    CtKey {
        saddr: Addr::from(std::net::IpAddr::V4(client)),
        daddr: Addr::from(std::net::IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10))),
        sport: (1024 + (i & 0xff) as u16).to_be(),
        dport: 80u16.to_be(),
        proto,
        dir: 0,
        _pad: [0; 2],
    }
}

fn fill(path: &Path, proto: u8) -> Result<u64> {
    let (mut map, capacity) = open(path)?;
    let expires = monotonic_secs() + 3600;
    for i in 0..capacity {
        let value = CtValue {
            expires,
            ..CtValue::default()
        };
        map.insert(flow(i, proto), value, 0)
            .with_context(|| format!("filling {}", path.display()))?;
    }
    Ok(u64::from(capacity))
}

/// Removes what [`fill`] wrote (the agent removed none: they expire in an
/// hour).
fn empty(path: &Path, proto: u8) -> Result<()> {
    let (mut map, capacity) = open(path)?;
    for i in 0..capacity {
        match map.remove(&flow(i, proto)) {
            Ok(()) => {}
            // An LRU map may have evicted it.
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e).with_context(|| format!("emptying {}", path.display())),
        }
    }
    Ok(())
}

/// CLOCK_MONOTONIC seconds, the datapath's and the collector's clock.
fn monotonic_secs() -> u32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u32::try_from(ts.tv_sec).unwrap_or(u32::MAX)
}
