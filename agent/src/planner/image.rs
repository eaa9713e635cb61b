use std::collections::{BTreeMap, HashMap};

use weir_abi::{
    BACKEND_STATE_ACTIVE, BACKEND_STATE_TERMINATING, Backend4, RevNat4, SCOPE_ALL, Service4Key,
    Service4Value,
};

use super::{Allocated, Ids};
use crate::model::{BackendState, DesiredFrontend, Frontend};

/// Every map entry one frontend owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontendImage {
    /// 0 only in the empty image.
    pub rev_nat_id: u32,
    pub revnat: RevNat4,
    /// Services-map values by slot; slot 0 is the master.
    pub services: BTreeMap<u16, Service4Value>,
    pub backends: BTreeMap<u32, Backend4>,
}

impl FrontendImage {
    /// The image of `desired`, reusing the ids `old` already gave to the same
    /// backends so that unchanged backends are not rewritten.
    pub fn build(
        desired: &DesiredFrontend,
        old: Option<&FrontendImage>,
        ids: &mut Ids,
        allocated: &mut Vec<Allocated>,
    ) -> Self {
        let fe = desired.frontend;
        let rev_nat_id = match old.map(|o| o.rev_nat_id) {
            Some(id) if id != 0 => id,
            _ => {
                let id = ids.revnat.alloc();
                allocated.push(Allocated::RevNat(id));
                id
            }
        };
        let existing: HashMap<(u32, u16), u32> = old
            .map(|o| {
                o.backends
                    .iter()
                    .map(|(&id, b)| ((b.addr, b.port), id))
                    .collect()
            })
            .unwrap_or_default();

        // Active backends take slots 1..=count, terminating ones follow; the
        // sort inside each group keeps plans deterministic.
        let mut ordered: Vec<_> = desired.backends.iter().collect();
        ordered.sort_by_key(|b| (b.state, b.addr, b.port));
        let proto = fe.proto.ip_proto();
        let mut image = Self {
            rev_nat_id,
            revnat: RevNat4 {
                addr: be_addr(fe.addr),
                port: fe.port.to_be(),
                _pad: [0; 2],
            },
            ..Self::default()
        };
        let (mut count, mut qcount) = (0u16, 0u16);
        for (i, b) in ordered.iter().enumerate() {
            let value = Backend4 {
                addr: be_addr(b.addr),
                port: b.port.to_be(),
                proto,
                state: match b.state {
                    BackendState::Active => BACKEND_STATE_ACTIVE,
                    BackendState::Terminating => BACKEND_STATE_TERMINATING,
                },
                rev_nat_id,
            };
            let id = existing
                .get(&(value.addr, value.port))
                .copied()
                .unwrap_or_else(|| {
                    let id = ids.backends.alloc();
                    allocated.push(Allocated::Backend(id));
                    id
                });
            image.backends.insert(id, value);
            let slot = u16::try_from(i + 1).unwrap_or(u16::MAX);
            image.services.insert(
                slot,
                Service4Value {
                    backend_id: id,
                    rev_nat_id,
                    ..Service4Value::default()
                },
            );
            match b.state {
                BackendState::Active => count += 1,
                BackendState::Terminating => qcount += 1,
            }
        }
        image.services.insert(
            0,
            Service4Value {
                count,
                qcount,
                rev_nat_id,
                ..Service4Value::default()
            },
        );
        image
    }
}

pub fn service_key(fe: Frontend, slot: u16) -> Service4Key {
    Service4Key {
        addr: be_addr(fe.addr),
        port: fe.port.to_be(),
        slot,
        proto: fe.proto.ip_proto(),
        scope: SCOPE_ALL,
        _pad: [0; 2],
    }
}

/// An address as the maps hold it: the bytes of `sin_addr`.
pub fn be_addr(addr: std::net::Ipv4Addr) -> u32 {
    u32::from(addr).to_be()
}
