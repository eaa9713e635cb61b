//! What `--devices auto` finds: the interfaces that carry a default route in
//! this network namespace, and veths (the host side of pods).
//!
//! `/proc/net/route` and `/proc/net/ipv6_route` show the namespace of the
//! reading task, so they are right under `nsenter --net` (sysfs might not be).
use std::{collections::BTreeSet, io};

/// `RTF_UP`.
const RTF_UP: u32 = 0x0001;
/// `RTF_REJECT` (unreachable/prohibit routes, e.g. IPv6's default on `lo`).
const RTF_REJECT: u32 = 0x0200;

/// Devices with an IPv4 default route in `/proc/net/route` text
/// (`Destination` and `Mask` `00000000`, route up, not a reject route).
pub fn parse_route(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
        let (Some(dev), Some(dst), Some(flags)) = (f.first(), f.get(1), f.get(3)) else {
            continue;
        };
        let mask = f.get(7).copied().unwrap_or("00000000");
        let Ok(flags) = u32::from_str_radix(flags, 16) else {
            continue;
        };
        if is_zero(dst) && is_zero(mask) && usable(flags) && *dev != "lo" && *dev != "*" {
            out.insert((*dev).to_owned());
        }
    }
    out
}

/// Devices with an IPv6 default route (`::/0`) in `/proc/net/ipv6_route`
/// text: `dst dst_len src src_len nexthop metric refcnt use flags dev`.
pub fn parse_ipv6_route(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let Ok(flags) = u32::from_str_radix(f[8], 16) else {
            continue;
        };
        let dev = f[9];
        if f[0].len() == 32 && is_zero(f[0]) && f[1] == "00" && usable(flags) && dev != "lo" {
            out.insert(dev.to_owned());
        }
    }
    out
}

fn is_zero(hex: &str) -> bool {
    !hex.is_empty() && hex.bytes().all(|b| b == b'0')
}

fn usable(flags: u32) -> bool {
    flags & RTF_UP != 0 && flags & RTF_REJECT == 0
}

/// Devices that carry a default route (IPv4 or IPv6) in the calling task's
/// network namespace. A missing table (IPv6 disabled) counts as empty.
pub fn default_route_devices() -> io::Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for (path, parse) in [
        (
            "/proc/net/route",
            parse_route as fn(&str) -> BTreeSet<String>,
        ),
        ("/proc/net/ipv6_route", parse_ipv6_route),
    ] {
        match std::fs::read_to_string(path) {
            Ok(t) => out.extend(parse(&t)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{path}: {e}"))),
        }
    }
    Ok(out)
}

/// `SIOCETHTOOL`.
const SIOCETHTOOL: libc::c_ulong = 0x8946;
/// `ETHTOOL_GDRVINFO`.
const ETHTOOL_GDRVINFO: u32 = 0x3;

/// `struct ethtool_drvinfo`.
#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// The driver name of `name` (`ETHTOOL_GDRVINFO`, asked in this namespace),
/// `None` if the device has no ethtool driver info or is gone.
pub fn driver(fd: std::os::fd::BorrowedFd<'_>, name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: plain data; zero is valid.
    let mut info: DrvInfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // SAFETY: ifreq is plain data; zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&raw mut info).cast();
    // SAFETY: SIOCETHTOOL with ETHTOOL_GDRVINFO writes at most
    // sizeof(struct ethtool_drvinfo) into the buffer ifru_data points to,
    // which lives until after the call.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            SIOCETHTOOL as _,
            &raw mut req,
        )
    };
    if rc != 0 {
        return None;
    }
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Some(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_default_routes() {
        let text = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
            eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
            eth1\t00000000\t010300C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
            eth2\t0000000A\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n\
            eth3\t00000000\t00000000\t0201\t0\t0\t0\t00000000\t0\t0\t0\n\
            garbage\n";
        assert_eq!(
            parse_route(text).into_iter().collect::<Vec<_>>(),
            ["eth0", "eth1"]
        );
        assert!(parse_route("Iface\tDestination\n").is_empty());
    }

    #[test]
    fn ipv6_default_routes() {
        let text = "\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     bond0
00000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth5
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 00000400 00000001 00000000 00000001    wg0
";
        assert_eq!(
            parse_ipv6_route(text).into_iter().collect::<Vec<_>>(),
            ["bond0", "wg0"]
        );
    }

    #[test]
    fn loopback_has_no_veth_driver() {
        // SAFETY: plain socket(2); checked and owned below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0);
        // SAFETY: new descriptor nobody else owns.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        use std::os::fd::AsFd;
        assert_ne!(driver(fd.as_fd(), "lo").as_deref(), Some("veth"));
        assert_eq!(driver(fd.as_fd(), "no-such-dev0"), None);
    }
}
