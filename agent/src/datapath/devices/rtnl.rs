//! The links and default routes of the calling thread's network namespace,
//! from rtnetlink dumps (`RTM_GETLINK`, `RTM_GETROUTE`), as `ip link` and
//! `ip route show table all` read them.
//!
//! `/proc/net/route` shows only the main table, so a default route in
//! another table (policy routing, a VRF) was missed; the route dump covers
//! every table. A link's kind comes from `IFLA_INFO_KIND` (`veth`), its type
//! from the header (`ARPHRD_*`), both from the kernel itself rather than
//! ioctl guesses or a sysfs mount that may belong to another namespace.
use std::{collections::BTreeSet, io};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage},
    route::{RouteAttribute, RouteMessage, RouteType},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// One link as the dump describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RtLink {
    pub name: String,
    pub ifindex: u32,
    /// `ARPHRD_*` (`dev->type`).
    pub link_type: u16,
    /// `IFLA_INFO_KIND` (`veth`, `bridge`, `vrf`, …); none for plain NICs.
    pub kind: Option<String>,
}

pub fn links() -> io::Result<Vec<RtLink>> {
    let mut out = Vec::new();
    for msg in dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))? {
        let RouteNetlinkMessage::NewLink(link) = msg else {
            continue;
        };
        let mut name = None;
        let mut kind = None;
        for a in &link.attributes {
            match a {
                LinkAttribute::IfName(n) => name = Some(n.clone()),
                LinkAttribute::LinkInfo(infos) => {
                    kind = infos.iter().find_map(|i| match i {
                        LinkInfo::Kind(k) => Some(kind_name(k)),
                        _ => None,
                    });
                }
                _ => {}
            }
        }
        if let Some(name) = name {
            out.push(RtLink {
                name,
                ifindex: link.header.index,
                link_type: u16::from(link.header.link_layer_type),
                kind,
            });
        }
    }
    Ok(out)
}

fn kind_name(k: &InfoKind) -> String {
    match k {
        InfoKind::Veth => "veth".into(),
        InfoKind::Other(s) => s.clone(),
        // The crate's Display is the kernel's name for the rest.
        other => other.to_string(),
    }
}

/// The interface indexes that carry a default route (IPv4 or IPv6, any
/// table, unicast: not unreachable, prohibit or blackhole), including each
/// next hop of a multipath one.
pub fn default_route_ifindexes() -> io::Result<BTreeSet<u32>> {
    let mut out = BTreeSet::new();
    for msg in dump(RouteNetlinkMessage::GetRoute(RouteMessage::default()))? {
        let RouteNetlinkMessage::NewRoute(route) = msg else {
            continue;
        };
        if route.header.destination_prefix_length != 0 || route.header.kind != RouteType::Unicast {
            continue;
        }
        for a in &route.attributes {
            match a {
                RouteAttribute::Oif(i) => {
                    out.insert(*i);
                }
                RouteAttribute::MultiPath(hops) => {
                    out.extend(hops.iter().map(|h| h.interface_index));
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Sends one dump request and collects every answer until `NLMSG_DONE`.
fn dump(request: RouteNetlinkMessage) -> io::Result<Vec<RouteNetlinkMessage>> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(request));
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket.send(&buf, 0)?;

    let mut out = Vec::new();
    // A dump answers in datagrams of up to a page or so each; 64 KiB
    // holds any of them.
    let mut rx = vec![0u8; 64 * 1024];
    loop {
        let n = socket.recv(&mut &mut rx[..], 0)?;
        let mut offset = 0;
        while offset < n {
            let msg = parse(&rx[offset..n])?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => {
                    return Err(e.to_io());
                }
                NetlinkPayload::InnerMessage(m) => out.push(m),
                _ => {}
            }
            if len == 0 {
                break;
            }
            offset += len;
        }
    }
}

fn parse<T: NetlinkDeserializable + NetlinkSerializable>(
    bytes: &[u8],
) -> io::Result<NetlinkMessage<T>> {
    NetlinkMessage::<T>::deserialize(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_with_its_type() {
        let links = links().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").expect("lo is listed");
        // ARPHRD_LOOPBACK.
        assert_eq!(lo.link_type, 772);
        assert_eq!(lo.ifindex, 1);
        // The dump answers; the namespace's default routes are not ours to
        // assert on (the policy-routing case is an integration test).
        default_route_ifindexes().unwrap();
    }
}
