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
            addr: Addr::from(vip.into()),
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
