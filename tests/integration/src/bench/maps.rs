//! Reading the agent's pinned services map, to time when a change reaches the
//! kernel rather than when the agent says it did.
use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{HashMap, Map, MapData};
use weir_abi::{Addr, PROTO_TCP, SCOPE_ALL, ServiceKey, ServiceValue};

pub struct ServicesMap(HashMap<MapData, ServiceKey, ServiceValue>);

impl ServicesMap {
    /// Opens `<pin_dir>/maps/WEIR_SVC`.
    pub fn open(pin_dir: &Path) -> Result<Self> {
        let path = pin_dir.join("maps").join(weir_abi::MAP_SERVICES);
        let data =
            MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
        Ok(Self(HashMap::try_from(Map::HashMap(data))?))
    }

    /// Active backends of the TCP frontend `vip:port`, if it exists.
    pub fn count(&self, vip: impl Into<IpAddr>, port: u16) -> Option<u16> {
        let key = ServiceKey {
            addr: abi_addr(vip.into()),
            port: port.to_be(),
            slot: 0,
            proto: PROTO_TCP,
            scope: SCOPE_ALL,
            _pad: [0; 2],
        };
        self.0.get(&key, 0).ok().map(|v| v.count)
    }

    /// Spins until the frontend has `count` active backends; returns how long
    /// after `since` that was.
    pub fn wait_count(
        &self,
        vip: Ipv4Addr,
        port: u16,
        count: u16,
        since: Instant,
        timeout: Duration,
    ) -> Result<Duration> {
        loop {
            if self.count(vip, port) == Some(count) {
                return Ok(since.elapsed());
            }
            if since.elapsed() > timeout {
                bail!("{vip}:{port} did not reach {count} backends within {timeout:?}");
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// An address as the maps hold it: `in6_addr` bytes, IPv4 as `::ffff:a.b.c.d`
/// (the agent's `maps::abi_addr`; this crate does not link the agent).
fn abi_addr(addr: IpAddr) -> Addr {
    let v6 = match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let o = v6.octets();
    let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
    Addr([word(0), word(4), word(8), word(12)])
}
