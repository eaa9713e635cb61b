//! This node's addresses: those of the `--devices` interfaces.
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
};

#[derive(Debug, thiserror::Error)]
pub enum NodeAddrError {
    #[error("cannot list the network interfaces (getifaddrs)")]
    List(#[source] io::Error),
    #[error("device {device} does not exist (given in --devices)")]
    NoDevice { device: String },
}

/// The usable addresses of `devices`, sorted and deduplicated. A device that
/// has no usable address is fine (it may get one later); one that does not
/// exist is an error naming it.
pub fn addresses_of(devices: &[String]) -> Result<Vec<IpAddr>, NodeAddrError> {
    let all = interface_addresses()?;
    let mut out = BTreeSet::new();
    for dev in devices {
        if !all.iter().any(|(name, _)| name == dev) && !device_exists(dev) {
            return Err(NodeAddrError::NoDevice {
                device: dev.clone(),
            });
        }
        out.extend(
            all.iter()
                .filter(|(name, ip)| name == dev && ip.is_some_and(usable))
                .filter_map(|(_, ip)| *ip),
        );
    }
    Ok(out.into_iter().collect())
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
    fn loopback_has_no_node_address() {
        assert_eq!(
            addresses_of(&["lo".to_owned()]).unwrap(),
            Vec::<IpAddr>::new()
        );
    }

    #[test]
    fn missing_device_is_named() {
        let e = addresses_of(&["weir-nope0".to_owned()]).unwrap_err();
        assert!(e.to_string().contains("weir-nope0"), "{e}");
    }
}
