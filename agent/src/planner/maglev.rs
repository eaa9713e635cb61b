//! Maglev lookup tables (Eisenbud et al., "Maglev: A Fast and Reliable
//! Software Network Load Balancer", NSDI 2016, §3.4): each backend walks its
//! own permutation of the table's positions and takes the next free one in
//! turn, so every backend ends up with `M/N` positions (±1), and a change of
//! one backend moves few positions of the others.
//!
//! A backend's permutation comes from its address and port only, never from
//! this node's backend ids, and the backends are taken in address order: two
//! nodes with the same endpoints build the same table (in ids of their own),
//! which with [`weir_abi::maglev::flow_hash`] sends a flow to the same
//! backend whichever node it reaches.
use std::sync::Arc;

use weir_abi::{Addr, ServiceValue};

use super::FrontendImage;

/// One backend of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    /// Address as in the backends map.
    pub addr: Addr,
    /// Port, network order, as in the backends map.
    pub port: u16,
    /// This node's backend id: what the table holds.
    pub id: u32,
}

/// What one table is built from: writing it is [`crate::maps::MapOp::SetMaglev`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    pub rev_nat_id: u32,
    pub size: u32,
    /// Sorted by address and port (see [`members`]).
    pub members: Arc<[Member]>,
}

impl TableSpec {
    pub fn build(&self) -> Vec<u32> {
        table(&self.members, self.size)
    }

    /// The table as the map stores it: whole chunks, 0 past its end.
    pub fn padded(&self) -> Vec<u32> {
        let mut t = self.build();
        t.resize(self.chunks() as usize * weir_abi::maglev::CHUNK as usize, 0);
        t
    }

    /// The map entries the table takes.
    pub const fn chunks(&self) -> u32 {
        weir_abi::maglev::chunks(self.size)
    }
}

/// The backends a frontend's table spreads flows over: those a new flow may
/// pick (the active ones, or the terminating ones while none is active, as
/// `weir_abi::pick`), in address order. Empty when the frontend has none.
pub fn members(image: &FrontendImage) -> Vec<Member> {
    let Some(master) = image.services.get(0) else {
        return Vec::new();
    };
    let n = if master.count > 0 {
        master.count
    } else {
        master.qcount
    };
    let mut out: Vec<Member> = (0..usize::from(n))
        .filter_map(|position| {
            let id = image.services.position(position)?;
            let b = image.backends.get(id)?;
            Some(Member {
                addr: b.addr,
                port: b.port,
                id,
            })
        })
        .collect();
    out.sort_unstable();
    out
}

/// The table size the master asks for, if it has a table (`SVC_F_MAGLEV`).
pub const fn size_of(master: &ServiceValue) -> Option<u32> {
    if master.flags & weir_abi::SVC_F_MAGLEV != 0 && master.table_size != 0 {
        Some(master.table_size)
    } else {
        None
    }
}

/// The table `image`'s master and slots call for, if its master has the
/// flag. The image's own `maglev` field says what the map holds.
pub fn wanted(image: &FrontendImage) -> Option<TableSpec> {
    let size = size_of(&image.services.get(0)?)?;
    Some(TableSpec {
        rev_nat_id: image.rev_nat_id,
        size,
        members: members(image).into(),
    })
}

/// Position → backend id, `size` positions (a prime, so every skip visits
/// every position). `members` must be sorted; empty gives an empty table.
pub fn table(members: &[Member], size: u32) -> Vec<u32> {
    let m = size as usize;
    if members.is_empty() || m == 0 {
        return Vec::new();
    }
    // (next position to try, skip) per member.
    let mut walk: Vec<(usize, usize)> = members
        .iter()
        .map(|b| {
            let offset = backend_hash(b, SEED_OFFSET) % m as u64;
            let skip = backend_hash(b, SEED_SKIP) % (m as u64 - 1) + 1;
            (offset as usize, skip as usize)
        })
        .collect();
    const FREE: u32 = u32::MAX;
    let mut entry = vec![FREE; m];
    let mut filled = 0;
    'fill: loop {
        for (i, (next, skip)) in walk.iter_mut().enumerate() {
            let mut c = *next;
            while entry[c] != FREE {
                c = (c + *skip) % m;
            }
            entry[c] = i as u32;
            *next = (c + *skip) % m;
            filled += 1;
            if filled == m {
                break 'fill;
            }
        }
    }
    for e in &mut entry {
        *e = members[*e as usize].id;
    }
    entry
}

const SEED_OFFSET: u64 = 0x5745_4952_4f46_4653; // "WEIROFFS"
const SEED_SKIP: u64 = 0x5745_4952_534b_4950; // "WEIRSKIP"

/// A backend's place in the permutation space: splitmix64 over its address
/// words and port. Part of the contract between nodes (module docs).
fn backend_hash(b: &Member, seed: u64) -> u64 {
    let mut h = seed;
    for w in b.addr.0.iter().copied().chain([u32::from(b.port)]) {
        h = splitmix64(h ^ u64::from(w));
    }
    h
}

const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
