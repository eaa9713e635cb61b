//! What the running kernel allows: the floor of the per-packet programs, the
//! optional `CFG_F_*` features, and whether the SNAT range stays clear of the
//! node's own ephemeral ports.
use std::io;

use tracing::warn;

/// The oldest kernel the per-packet programs run on: `bpf_fib_lookup` with
/// `BPF_FIB_LOOKUP_SRC` (6.7) picks the SNAT address; tcx links need 6.6.
pub const PACKET_KERNEL: (u32, u32) = (6, 7);
/// `bpf_l4_csum_replace` knows `BPF_F_IPV6` from 6.16.
pub const CSUM_IPV6_KERNEL: (u32, u32) = (6, 16);

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "--devices needs Linux {}.{} or later (BPF_FIB_LOOKUP_SRC, 6.7, picks the SNAT source address; tcx links need 6.6); this kernel is {release}. Run without --devices for socket load balancing only",
        PACKET_KERNEL.0,
        PACKET_KERNEL.1
    )]
    TooOld { release: String },
    #[error("cannot read the kernel release (/proc/sys/kernel/osrelease)")]
    Release(#[source] io::Error),
}

/// The kernel's `major.minor`, from a `uname -r` release string.
pub fn version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()?;
    Some((major, minor))
}

/// Refuses a kernel the per-packet programs cannot run on (only when
/// `devices` asks for them), and returns the `CFG_F_*` the kernel allows.
pub fn flags(release: &str, want_devices: bool) -> Result<u32, KernelError> {
    let v = version(release);
    if want_devices && v.is_none_or(|v| v < PACKET_KERNEL) {
        return Err(KernelError::TooOld {
            release: release.to_owned(),
        });
    }
    Ok(if v.is_some_and(|v| v >= CSUM_IPV6_KERNEL) {
        weir_abi::CFG_F_CSUM_IPV6
    } else {
        0
    })
}

/// The running kernel's release (`uname -r`).
pub fn release() -> Result<String, KernelError> {
    let raw =
        std::fs::read_to_string("/proc/sys/kernel/osrelease").map_err(KernelError::Release)?;
    Ok(raw.trim().to_owned())
}

/// `ip_local_port_range`'s two numbers.
pub fn parse_local_port_range(s: &str) -> Option<(u16, u16)> {
    let mut it = s.split_whitespace().map(str::parse::<u16>);
    match (it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b))) => Some((a, b)),
        _ => None,
    }
}

pub const fn ranges_overlap(a: (u16, u16), b: (u16, u16)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

/// Warns when the SNAT range overlaps the node's ephemeral ports.
pub fn check_snat_range(snat: (u16, u16)) {
    let path = "/proc/sys/net/ipv4/ip_local_port_range";
    let Some(local) = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| parse_local_port_range(&s))
    else {
        warn!("cannot read {path}; make sure --snat-port-range stays outside it");
        return;
    };
    if ranges_overlap(snat, local) {
        warn!(
            "--snat-port-range {}-{} overlaps the node's ephemeral ports (net.ipv4.ip_local_port_range {}-{}): SNATed flows and the node's own connections may pick the same tuple. Move one of them, or reserve the SNAT ports: sysctl -w net.ipv4.ip_local_reserved_ports={}-{}",
            snat.0, snat.1, local.0, local.1, snat.0, snat.1
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_applies_only_with_devices() {
        assert_eq!(version("6.7.0-14-generic"), Some((6, 7)));
        assert_eq!(version("6.16.3+deb13-amd64"), Some((6, 16)));
        assert_eq!(version("5.15.0"), Some((5, 15)));
        assert_eq!(version("6.1rc3"), Some((6, 1)));
        assert_eq!(version("junk"), None);
        let e = flags("6.6.30", true).unwrap_err().to_string();
        assert!(
            e.contains("BPF_FIB_LOOKUP_SRC") && e.contains("6.6.30"),
            "{e}"
        );
        assert!(flags("junk", true).is_err());
        assert_eq!(flags("6.6.30", false).unwrap(), 0);
        assert_eq!(flags("6.7.0", true).unwrap(), 0);
        assert_eq!(flags("6.16.0", true).unwrap(), weir_abi::CFG_F_CSUM_IPV6);
        assert_eq!(flags("7.0.1", false).unwrap(), weir_abi::CFG_F_CSUM_IPV6);
    }

    #[test]
    fn snat_range_overlap() {
        assert_eq!(
            parse_local_port_range("32768\t60999\n"),
            Some((32768, 60999))
        );
        assert_eq!(parse_local_port_range("junk"), None);
        assert!(!ranges_overlap((61000, 65535), (32768, 60999)));
        assert!(ranges_overlap((60999, 65535), (32768, 60999)));
        assert!(ranges_overlap((40000, 40010), (32768, 60999)));
        assert!(ranges_overlap((1024, 65535), (32768, 60999)));
        assert!(!ranges_overlap((1024, 32767), (32768, 60999)));
    }
}
