//! Maps an older agent pinned in a layout this build replaced, carried over
//! so that an upgrade keeps every connection, as Cilium migrates its maps:
//! the old pin is moved aside before the load, the load pins a map of the
//! new layout, its contents are copied over before any new program runs,
//! and the old pin goes. A failed load puts the old pin back.
//!
//! One map so far: `WEIR_BACKEND` was a hash of backend id → [`Backend`]
//! until it became an array (2026-12); the ids and values are the same.
use std::{io, path::PathBuf};

use aya::maps::{HashMap, Map, MapData, MapType};
use tracing::{info, warn};
use weir_abi::Backend;

use super::{loader::LoadError, pins::Pins};
use crate::maps::array::MmapArray;

/// Where the old pin waits while the new map is loaded. If the agent dies
/// in between, the next one finds it here and carries it over then.
// bpffs refuses names with a dot.
const ASIDE: &str = "WEIR_BACKEND_LEGACY";

/// The contents of an older agent's backends hash, its pin moved aside.
pub struct LegacyBackends {
    entries: Vec<(u32, Backend)>,
    pin: PathBuf,
    aside: PathBuf,
}

impl LegacyBackends {
    /// Moves a hash pinned as `WEIR_BACKEND` aside and reads it; `None` if
    /// the pin is absent or already an array.
    pub fn take(pins: &Pins) -> Result<Option<Self>, LoadError> {
        let pin = pins.maps().join(weir_abi::MAP_BACKENDS);
        let aside = pins.maps().join(ASIDE);
        let err = |source: io::Error| LoadError::Legacy {
            path: pin.clone(),
            source,
        };
        let pinned_type = MapData::from_pin(&pin)
            .ok()
            .and_then(|d| d.info().ok())
            .and_then(|i| i.map_type().ok());
        if matches!(pinned_type, Some(MapType::Hash)) {
            std::fs::rename(&pin, &aside).map_err(err)?;
        }
        if !aside.exists() {
            return Ok(None);
        }
        let read = || -> Result<Vec<(u32, Backend)>, aya::maps::MapError> {
            let map: HashMap<MapData, u32, Backend> =
                HashMap::try_from(Map::HashMap(MapData::from_pin(&aside)?))?;
            map.iter().collect()
        };
        let mut entries = match read() {
            Ok(e) => e,
            Err(e) => {
                // Not one this agent can read (another layout): back where
                // it was, for the type check to refuse with its remedy.
                warn!(path = %aside.display(), "cannot read an older agent's backends map: {e}");
                if !pin.exists() {
                    std::fs::rename(&aside, &pin).map_err(err)?;
                }
                return Ok(None);
            }
        };
        entries.sort_unstable_by_key(|&(id, _)| id);
        Ok(Some(Self {
            entries,
            pin,
            aside,
        }))
    }

    /// After the load pinned the new array, before a program is attached:
    /// writes the backends into it and removes the old pin. On failure the
    /// old pin is back in place.
    pub fn finish(self) -> Result<(), LoadError> {
        let written = MmapArray::open(&self.pin)
            .map_err(io::Error::other)
            .and_then(|mut a| a.write(&self.entries).map_err(|(_, e)| e));
        if let Err(source) = written {
            let path = self.pin.clone();
            // The new array holds nothing yet that another agent needs.
            let _ = std::fs::remove_file(&self.pin);
            self.restore();
            return Err(LoadError::Legacy { path, source });
        }
        if let Err(e) = std::fs::remove_file(&self.aside) {
            warn!(path = %self.aside.display(), "cannot remove the carried-over map: {e}");
        }
        info!(
            backends = self.entries.len(),
            "carried the backends of an older agent's hash map over to the array"
        );
        Ok(())
    }

    /// Puts the old pin back, for a load that failed.
    pub fn restore(self) {
        if let Err(e) = std::fs::rename(&self.aside, &self.pin) {
            warn!(path = %self.aside.display(), "cannot put the older agent's map back: {e}");
        }
    }
}
