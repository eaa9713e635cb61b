//! Maglev consistent hashing (Eisenbud et al., NSDI 2016): the flow hash the
//! packet programs index a frontend's lookup table with.
//!
//! The agent fills each table from the frontend's backends alone (their
//! addresses and ports, never node-local ids), and every node hashes a flow
//! the same way, so all nodes send one flow to one backend: a load balancer
//! may spray a connection's packets over several nodes. That makes both this
//! hash and the agent's table fill part of the wire contract between agent
//! versions in one cluster; neither may change without a new flag value.
use crate::Addr;

/// Default table size: a prime well above 100 × the backends of a large
/// Service, which keeps every backend's share within about 1% of the others
/// (the paper's recommendation; Cilium's default too).
pub const DEFAULT_TABLE_SIZE: u32 = 16_381;
/// Smallest table size accepted.
pub const MIN_TABLE_SIZE: u32 = 251;
/// Largest table size accepted: 528 KiB of kernel memory per frontend.
pub const MAX_TABLE_SIZE: u32 = 131_071;

/// Positions per [`MaglevChunk`]. A table is stored as chunks in a plain hash
/// map rather than as an array in a hash of maps: replacing an inner map
/// makes the syscall wait for an RCU grace period (8–18 ms measured), which
/// made a cold sync of 10k Maglev frontends take 84 s. A chunk is written
/// in place, so a reader may see chunks of the old table next to chunks of
/// the new one; each position still names a backend of one of them, and a
/// pick re-checks that backend (`pick::maglev_backend`), so that costs
/// consistency for an instant, never a dropped flow.
///
/// 1000 positions make a 4000-byte value; with the 8-byte key, the hash
/// element's 48-byte header and the allocator's 8-byte link that is 4064
/// bytes, one 4 KiB slab object per chunk. (64 positions would take a
/// 512-byte object for 256 bytes of table.)
pub const CHUNK: u32 = 1_000;

/// Chunks a table of `size` positions takes.
#[inline(always)]
pub const fn chunks(size: u32) -> u32 {
    size.div_ceil(CHUNK)
}

/// Key of [`crate::MAP_MAGLEV`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MaglevKey {
    pub rev_nat_id: u32,
    /// Positions `chunk * CHUNK ..` of the table.
    pub chunk: u32,
}

/// Value of [`crate::MAP_MAGLEV`]: backend ids by position. Positions past
/// the table's size in its last chunk hold 0, which no backend id is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevChunk {
    pub ids: [u32; CHUNK as usize],
}

impl Default for MaglevChunk {
    fn default() -> Self {
        Self {
            ids: [0; CHUNK as usize],
        }
    }
}

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;
/// Fixed, so that every node (and every agent version) agrees.
const SEED: u32 = 0x5745_4952; // "WEIR"

/// MurmurHash3 (x86, 32-bit) of the flow's 40-byte tuple: source and
/// destination address as stored (IPv4-mapped for IPv4), both ports in network
/// order in one word, and the protocol. Words are read in host order; all
/// nodes of a cluster share a byte order.
#[inline(always)]
pub fn flow_hash(saddr: &Addr, daddr: &Addr, sport: u16, dport: u16, proto: u8) -> u32 {
    let words = [
        saddr.0[0],
        saddr.0[1],
        saddr.0[2],
        saddr.0[3],
        daddr.0[0],
        daddr.0[1],
        daddr.0[2],
        daddr.0[3],
        u32::from(sport) | (u32::from(dport) << 16),
        u32::from(proto),
    ];
    let mut h = SEED;
    for w in words {
        h = mix(h, w);
    }
    fmix32(h ^ (words.len() as u32 * 4))
}

#[inline(always)]
const fn mix(h: u32, k: u32) -> u32 {
    let k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

#[inline(always)]
const fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference MurmurHash3_x86_32 over bytes, to check the word version.
    fn murmur3(bytes: &[u8], seed: u32) -> u32 {
        let mut h = seed;
        for c in bytes.chunks_exact(4) {
            h = mix(h, u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        }
        fmix32(h ^ bytes.len() as u32)
    }

    #[test]
    fn the_word_hash_is_murmur3_of_the_tuple_bytes() {
        // Published vectors of MurmurHash3_x86_32.
        assert_eq!(murmur3(b"", 0), 0);
        assert_eq!(murmur3(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3(&[0xff; 4], 0), 0x7629_3b50);
        assert_eq!(murmur3(&[0x21, 0x43, 0x65, 0x87], 0), 0xf55b_516b);

        let s = Addr::from_v4(u32::from_ne_bytes([192, 168, 50, 2]));
        let d = Addr::from_v4(u32::from_ne_bytes([192, 168, 50, 100]));
        let (sport, dport) = (40_000u16.to_be(), 80u16.to_be());
        let mut bytes = [0u8; 40];
        for (i, w) in s.0.iter().chain(d.0.iter()).enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        bytes[32..34].copy_from_slice(&sport.to_ne_bytes());
        bytes[34..36].copy_from_slice(&dport.to_ne_bytes());
        bytes[36] = crate::PROTO_TCP;
        if cfg!(target_endian = "little") {
            assert_eq!(
                flow_hash(&s, &d, sport, dport, crate::PROTO_TCP),
                murmur3(&bytes, SEED)
            );
        }
    }

    #[test]
    fn every_field_moves_the_hash() {
        let a = Addr::from_v4(1);
        let b = Addr::from_v4(2);
        let base = flow_hash(&a, &b, 1, 2, 6);
        assert_ne!(base, flow_hash(&b, &a, 1, 2, 6));
        assert_ne!(base, flow_hash(&a, &b, 2, 1, 6));
        assert_ne!(base, flow_hash(&a, &b, 1, 2, 17));
    }
}
