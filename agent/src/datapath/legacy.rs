//! Maps an older agent pinned in a layout this build replaced, carried over
//! so that an upgrade keeps every connection, as Cilium migrates its maps:
//! the old pin is moved aside before the load, the load pins a map of the
//! new layout, its contents are copied over before any new program runs,
//! and the old pin goes. A failed load puts the old pins back.
//!
//! - `WEIR_BACKEND` was a hash of backend id → [`Backend`] until it became
//!   an array (2026-12); the ids and values are the same.
//! - `WEIR_SVC` held one backend per slot in a 20-byte value until each
//!   entry held [`weir_abi::SVC_IDS`] of them (2026-12); the frontends, their
//!   positions and their backend ids are the same.
use std::{
    collections::HashMap as StdHashMap,
    io,
    path::{Path, PathBuf},
};

use aya::maps::{HashMap, Map, MapData, MapError, MapInfo, MapType};
use tracing::{info, warn};
use weir_abi::{Backend, ServiceKey, ServiceValue, ServiceValueV1 as OldServiceValue};

use super::{loader::LoadError, pins::Pins};
use crate::{maps::array::MmapArray, planner::Slots};

/// The older agents' maps found, their pins moved aside.
#[derive(Default)]
pub struct Legacy {
    backends: Option<Carried<(u32, Backend)>>,
    services: Option<Carried<(ServiceKey, ServiceValue)>>,
}

/// One old map's contents in the new layout, and where its pin waits. If
/// the agent dies before the carry-over, the next one finds the pin aside
/// and carries it over then.
struct Carried<E> {
    entries: Vec<E>,
    pin: PathBuf,
    aside: PathBuf,
}

impl Legacy {
    /// Moves every old-layout map aside and reads it.
    pub fn take(pins: &Pins) -> Result<Self, LoadError> {
        let backends = Carried::take(
            pins,
            weir_abi::MAP_BACKENDS,
            |i| matches!(i.map_type(), Ok(MapType::Hash)),
            |data| {
                let map: HashMap<MapData, u32, Backend> = HashMap::try_from(Map::HashMap(data))?;
                let mut entries: Vec<_> = map.iter().collect::<Result<_, _>>()?;
                entries.sort_unstable_by_key(|&(id, _)| id);
                Ok(entries)
            },
        );
        let services = Carried::take(
            pins,
            weir_abi::MAP_SERVICES,
            |i| i.value_size() == OLD_SERVICE_VALUE,
            |data| {
                let map: HashMap<MapData, ServiceKey, OldServiceValue> =
                    HashMap::try_from(Map::HashMap(data))?;
                Ok(regroup(map.iter().collect::<Result<_, _>>()?))
            },
        );
        let (backends, services) = match (backends, services) {
            (Ok(b), Ok(s)) => (b, s),
            (b, s) => {
                // Nothing is half moved: what was taken goes back.
                let err = [b.as_ref().err(), s.as_ref().err()].into_iter().flatten();
                let err = err.map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
                Self {
                    backends: b.ok().flatten(),
                    services: s.ok().flatten(),
                }
                .restore();
                return Err(LoadError::Legacy {
                    path: pins.maps().to_path_buf(),
                    source: io::Error::other(err),
                });
            }
        };
        Ok(Self { backends, services })
    }

    /// After the load pinned the new maps, before a program is attached:
    /// writes the old contents into them and removes the old pins. On
    /// failure the old pins are back in place.
    pub fn finish(self) -> Result<(), LoadError> {
        let Self { backends, services } = self;
        let written = backends.as_ref().map_or(Ok(()), |b| {
            MmapArray::open(&b.pin)
                .map_err(io::Error::other)
                .and_then(|mut a| a.write(&b.entries).map_err(|(_, e)| e))
                .map_err(|e| (b.pin.clone(), e))
        });
        let written = written.and_then(|()| {
            services.as_ref().map_or(Ok(()), |s| {
                write_services(&s.pin, &s.entries).map_err(|e| (s.pin.clone(), e))
            })
        });
        if let Err((path, source)) = written {
            for pin in [
                backends.as_ref().map(|b| &b.pin),
                services.as_ref().map(|s| &s.pin),
            ]
            .into_iter()
            .flatten()
            {
                // The new map holds nothing yet that another agent needs.
                let _ = std::fs::remove_file(pin);
            }
            Self { backends, services }.restore();
            return Err(LoadError::Legacy { path, source });
        }
        if let Some(b) = backends {
            let n = b.remove_aside();
            info!(
                backends = n,
                "carried the backends of an older agent's hash map over to the array"
            );
        }
        if let Some(s) = services {
            let n = s.remove_aside();
            info!(
                entries = n,
                "carried an older agent's services map over to entries of several backends"
            );
        }
        Ok(())
    }

    /// Puts the old pins back, for a load that failed.
    pub fn restore(self) {
        if let Some(b) = self.backends {
            b.restore();
        }
        if let Some(s) = self.services {
            s.restore();
        }
    }
}

impl<E> Carried<E> {
    /// Moves the pin `name` aside if `is_old` says its map has the old
    /// layout, and reads what is aside with `read`. `None` if nothing is.
    fn take(
        pins: &Pins,
        name: &str,
        is_old: impl Fn(&MapInfo) -> bool,
        read: impl FnOnce(MapData) -> Result<Vec<E>, MapError>,
    ) -> Result<Option<Self>, io::Error> {
        let pin = pins.maps().join(name);
        // bpffs refuses names with a dot.
        let aside = pins.maps().join(format!("{name}_LEGACY"));
        let pinned = MapData::from_pin(&pin).ok().and_then(|d| d.info().ok());
        if pinned.as_ref().is_some_and(is_old) {
            std::fs::rename(&pin, &aside)?;
        }
        if !aside.exists() {
            return Ok(None);
        }
        match MapData::from_pin(&aside).and_then(read) {
            Ok(entries) => Ok(Some(Self {
                entries,
                pin,
                aside,
            })),
            Err(e) => {
                // Not one this agent can read (another layout): back where
                // it was, for the pin check to refuse with its remedy.
                warn!(path = %aside.display(), "cannot read an older agent's map: {e}");
                if !pin.exists() {
                    std::fs::rename(&aside, &pin)?;
                }
                Ok(None)
            }
        }
    }

    /// Entries carried over.
    fn remove_aside(self) -> usize {
        if let Err(e) = std::fs::remove_file(&self.aside) {
            warn!(path = %self.aside.display(), "cannot remove the carried-over map: {e}");
        }
        self.entries.len()
    }

    fn restore(self) {
        if let Err(e) = std::fs::rename(&self.aside, &self.pin) {
            warn!(path = %self.aside.display(), "cannot put the older agent's map back: {e}");
        }
    }
}

const OLD_SERVICE_VALUE: u32 = size_of::<OldServiceValue>() as u32;

/// Old entries (a slot per backend, slot `p + 1` for position `p`) as the
/// new layout writes them. A slot whose master is gone is dropped, as the
/// first sync would drop it; a missing slot leaves 0 at its position, which
/// the datapath reads as no backend.
fn regroup(old: Vec<(ServiceKey, OldServiceValue)>) -> Vec<(ServiceKey, ServiceValue)> {
    let ids: StdHashMap<ServiceKey, u32> = old
        .iter()
        .filter(|(k, _)| k.slot != 0)
        .map(|(k, v)| (*k, v.backend_id))
        .collect();
    let mut out = Vec::new();
    for (k, m) in old.iter().filter(|(k, _)| k.slot == 0) {
        let used = u16::try_from(u32::from(m.count) + u32::from(m.qcount)).unwrap_or(u16::MAX);
        let positions = (1..=used)
            .map(|slot| ids.get(&ServiceKey { slot, ..*k }).copied().unwrap_or(0))
            .collect();
        let master = ServiceValue {
            table_size: m.backend_id,
            count: m.count,
            qcount: m.qcount,
            rev_nat_id: m.rev_nat_id,
            flags: m.flags,
            affinity_timeout: m.affinity_timeout,
            ..ServiceValue::default()
        };
        out.extend(
            Slots::plain(master, positions)
                .iter()
                .map(|(slot, v)| (ServiceKey { slot, ..*k }, v)),
        );
    }
    out
}

fn write_services(pin: &Path, entries: &[(ServiceKey, ServiceValue)]) -> io::Result<()> {
    let data = MapData::from_pin(pin).map_err(io::Error::other)?;
    let mut map: HashMap<MapData, ServiceKey, ServiceValue> =
        HashMap::try_from(Map::HashMap(data)).map_err(io::Error::other)?;
    for (k, v) in entries {
        map.insert(k, v, 0).map_err(io::Error::other)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_slots_become_positions_of_the_new_entries() {
        let fe = ServiceKey {
            port: 80u16.to_be(),
            proto: weir_abi::PROTO_TCP,
            ..ServiceKey::default()
        };
        let at = |slot| ServiceKey { slot, ..fe };
        let slot = |id| OldServiceValue {
            backend_id: id,
            rev_nat_id: 7,
            ..OldServiceValue::default()
        };
        // 12 active and one terminating backend, 101..=113; slot 5 lost.
        let mut old = vec![(
            at(0),
            OldServiceValue {
                backend_id: 251,
                count: 12,
                qcount: 1,
                rev_nat_id: 7,
                flags: weir_abi::SVC_F_MAGLEV,
                ..OldServiceValue::default()
            },
        )];
        old.extend(
            (1..=13)
                .filter(|&s| s != 5)
                .map(|s| (at(s), slot(100 + u32::from(s)))),
        );
        // A slot of a master that is gone.
        old.push((
            ServiceKey {
                slot: 1,
                port: 81u16.to_be(),
                ..fe
            },
            slot(9),
        ));
        let new = regroup(old);
        assert_eq!(new.len(), 2, "{new:?}");
        let (k0, m) = new[0];
        assert_eq!(
            (k0, m.table_size, m.count, m.qcount, m.flags),
            (at(0), 251, 12, 1, weir_abi::SVC_F_MAGLEV)
        );
        assert_eq!(m.ids, [101, 102, 103, 104, 0, 106, 107, 108, 109, 110, 111]);
        let (k1, s) = new[1];
        assert_eq!(
            (k1, s.rev_nat_id, &s.ids[..3]),
            (at(1), 7, &[112, 113, 0][..])
        );
    }
}
