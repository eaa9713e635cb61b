//! This node's addresses: those of every interface of the agent's network
//! namespace (the node's), as kube-proxy's default `nodePortAddresses` (all
//! local addresses), whatever `--devices` says.
//!
//! They are where NodePort frontends listen (one frontend per address, as the
//! maps have no wildcard) and what an `externalIP` must not be. Only addresses
//! other nodes and clients can reach count: global scope, so loopback and
//! link-local ones (which every node has, identically) are skipped, as
//! Cilium's and kube-proxy's NodePort address detection do.
use std::{
    collections::BTreeSet,
    ffi::CStr,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use tracing::{info, warn};

use crate::link_changes;

#[derive(Debug, thiserror::Error)]
pub enum NodeAddrError {
    #[error("cannot list the network interfaces (getifaddrs)")]
    List(#[source] io::Error),
}

/// The usable addresses of every interface, sorted and deduplicated.
pub fn node_addresses() -> Result<Vec<IpAddr>, NodeAddrError> {
    let all: BTreeSet<IpAddr> = interface_addresses()?
        .into_iter()
        .filter_map(|(_, ip)| ip)
        .filter(|ip| usable(*ip))
        .collect();
    Ok(all.into_iter().collect())
}

/// Calls `on_change` with the fresh addresses whenever they differ from the
/// last ones seen (`current` at first): checked on every address change the
/// kernel announces and at the latest every `backstop`, on a thread of its
/// own, until `on_change` returns false.
pub fn watch(
    mut current: Vec<IpAddr>,
    backstop: Duration,
    mut on_change: impl FnMut(Vec<IpAddr>) -> bool + Send + 'static,
) -> io::Result<()> {
    link_changes::spawn_rescans(
        "weir-node-addrs",
        "node addresses",
        libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR,
        backstop,
        backstop,
        move || match node_addresses() {
            Ok(fresh) if fresh != current => {
                info!(before = ?current, after = ?fresh, "node addresses changed");
                current.clone_from(&fresh);
                on_change(fresh)
            }
            Ok(_) => true,
            Err(e) => {
                warn!("cannot re-read node addresses: {e}");
                true
            }
        },
    )
}

/// Whether a network interface of this name exists in this namespace.
pub fn device_exists(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: NUL-terminated string that outlives the call.
    unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
}

/// Whether clients on other nodes can reach this node at `ip`.
pub fn usable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback() || v4.is_link_local() || v4.is_unspecified() || v4.is_multicast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_unicast_link_local()
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.to_ipv4_mapped().is_some())
        }
    }
}

/// `(interface, address)` for every entry getifaddrs() lists; the address is
/// `None` for entries without an IP address (the AF_PACKET ones).
fn interface_addresses() -> Result<Vec<(String, Option<IpAddr>)>, NodeAddrError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return Err(NodeAddrError::List(io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until
        // freeifaddrs; its name is a NUL-terminated string and its address,
        // when non-null, a sockaddr of the family it names.
        unsafe {
            let ifa = &*cur;
            let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
            out.push((name, sockaddr_ip(ifa.ifa_addr)));
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// # Safety
/// `sa` is null or points at a sockaddr whose length fits its family.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a valid sockaddr of the family it names.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*sa.cast::<libc::sockaddr_in>();
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))))
            }
            libc::AF_INET6 => {
                let sin6 = &*sa.cast::<libc::sockaddr_in6>();
                Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reachable_addresses_are_usable() {
        for ok in ["192.168.1.10", "10.0.0.1", "2001:db8::1", "fd00::5"] {
            assert!(usable(ok.parse().unwrap()), "{ok}");
        }
        for no in [
            "127.0.0.1",
            "169.254.3.4",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "::",
            "ff02::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!usable(no.parse().unwrap()), "{no}");
        }
    }

    #[test]
    fn node_addresses_are_usable_sorted_and_unique() {
        let a = node_addresses().unwrap();
        assert!(a.iter().all(|ip| usable(*ip)), "{a:?}");
        assert!(a.windows(2).all(|w| w[0] < w[1]), "{a:?}");
    }
}
