//! Every path under the bpffs directory, in one place.
//!
//! ```text
//! <bpffs>/maps/WEIR_SVC …         pinned maps (weir_abi::MAP_*)
//! <bpffs>/links/connect4 …        pinned cgroup links, one per socket hook
//! <bpffs>/links/tc-<dev>          pinned tcx ingress link of a --devices device
//! <bpffs>/links/xdp-<dev>         pinned XDP link of a --devices device
//! ```
//!
//! Pinned links are what lets a restarted agent swap the program behind each
//! hook atomically instead of detaching and reattaching (a window in which
//! traffic would go untranslated).
use std::path::{Path, PathBuf};

use aya_obj::generated::bpf_attach_type;

#[derive(Clone, Debug)]
pub struct Pins {
    root: PathBuf,
}

/// Prefix of every staging pin: a replacement link lives here between being
/// attached and being renamed over the old pin. A prefix (not a suffix) so no
/// device name can produce a staging name.
const STAGING: &str = "new-";

impl Pins {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn maps(&self) -> PathBuf {
        self.root.join("maps")
    }

    pub fn links(&self) -> PathBuf {
        self.root.join("links")
    }

    pub fn link(&self, hook: Hook) -> PathBuf {
        self.links().join(hook.pin_name())
    }

    /// Where a replacement link is pinned before it is renamed over
    /// [`Self::link`]. bpffs refuses names with a dot.
    pub fn staging_link(&self, hook: Hook) -> PathBuf {
        self.links().join(format!("{}_new", hook.pin_name()))
    }

    /// The pin of a device link (`kind` is [`DevLink`]).
    pub fn dev_link(&self, kind: DevLink, device: &str) -> PathBuf {
        self.links().join(dev_pin_name(kind, device))
    }

    /// Where a replacement device link waits before it is renamed over
    /// [`Self::dev_link`].
    pub fn staging_dev_link(&self, kind: DevLink, device: &str) -> PathBuf {
        self.links()
            .join(format!("{STAGING}{}", dev_pin_name(kind, device)))
    }
}

/// The per-device programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevLink {
    /// `weir_tc_ingress` on tcx ingress.
    Tc,
    /// `weir_xdp` in driver mode.
    Xdp,
}

impl DevLink {
    pub const fn prefix(self) -> &'static str {
        match self {
            Self::Tc => "tc-",
            Self::Xdp => "xdp-",
        }
    }

    /// The function name in `weir-ebpf`.
    pub const fn program(self) -> &'static str {
        match self {
            Self::Tc => "weir_tc_ingress",
            Self::Xdp => "weir_xdp",
        }
    }
}

/// `tc-eth0`. Interface names may hold dots (VLANs: `eth0.100`), which bpffs
/// refuses in names, so `.` becomes `%2e` and `%` itself `%25`.
pub fn dev_pin_name(kind: DevLink, device: &str) -> String {
    let mut out = String::from(kind.prefix());
    for c in device.chars() {
        match c {
            '.' => out.push_str("%2e"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
    out
}

/// The device and program of a device link's pin name ([`dev_pin_name`]
/// reversed); `None` for any other name, staging pins included.
pub fn dev_of_pin_name(name: &str) -> Option<(DevLink, String)> {
    let (kind, rest) = [DevLink::Tc, DevLink::Xdp]
        .into_iter()
        .find_map(|k| name.strip_prefix(k.prefix()).map(|r| (k, r)))?;
    let mut out = String::new();
    let mut rest = rest;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let c = match rest.get(i..i + 3)? {
            "%2e" => '.',
            "%25" => '%',
            _ => return None,
        };
        out.push(c);
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    (!out.is_empty()).then_some((kind, out))
}

/// The socket hooks, with the program that serves each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Connect4,
    Sendmsg4,
    Recvmsg4,
    Getpeername4,
    Connect6,
    Sendmsg6,
    Recvmsg6,
    Getpeername6,
    /// A `cgroup/sock_release` program, not a sock_addr one.
    SockRelease,
}

impl Hook {
    pub const ALL: [Self; 9] = [
        Self::Connect4,
        Self::Sendmsg4,
        Self::Recvmsg4,
        Self::Getpeername4,
        Self::Connect6,
        Self::Sendmsg6,
        Self::Recvmsg6,
        Self::Getpeername6,
        Self::SockRelease,
    ];

    pub const fn pin_name(self) -> &'static str {
        match self {
            Self::Connect4 => "connect4",
            Self::Sendmsg4 => "sendmsg4",
            Self::Recvmsg4 => "recvmsg4",
            Self::Getpeername4 => "getpeername4",
            Self::Connect6 => "connect6",
            Self::Sendmsg6 => "sendmsg6",
            Self::Recvmsg6 => "recvmsg6",
            Self::Getpeername6 => "getpeername6",
            Self::SockRelease => "sock_release",
        }
    }

    /// The function name in `weir-ebpf`.
    pub const fn program(self) -> &'static str {
        match self {
            Self::Connect4 => "weir_connect4",
            Self::Sendmsg4 => "weir_sendmsg4",
            Self::Recvmsg4 => "weir_recvmsg4",
            Self::Getpeername4 => "weir_getpeername4",
            Self::Connect6 => "weir_connect6",
            Self::Sendmsg6 => "weir_sendmsg6",
            Self::Recvmsg6 => "weir_recvmsg6",
            Self::Getpeername6 => "weir_getpeername6",
            Self::SockRelease => "weir_sock_release",
        }
    }

    pub const fn attach_type(self) -> bpf_attach_type {
        match self {
            Self::Connect4 => bpf_attach_type::BPF_CGROUP_INET4_CONNECT,
            Self::Sendmsg4 => bpf_attach_type::BPF_CGROUP_UDP4_SENDMSG,
            Self::Recvmsg4 => bpf_attach_type::BPF_CGROUP_UDP4_RECVMSG,
            Self::Getpeername4 => bpf_attach_type::BPF_CGROUP_INET4_GETPEERNAME,
            Self::Connect6 => bpf_attach_type::BPF_CGROUP_INET6_CONNECT,
            Self::Sendmsg6 => bpf_attach_type::BPF_CGROUP_UDP6_SENDMSG,
            Self::Recvmsg6 => bpf_attach_type::BPF_CGROUP_UDP6_RECVMSG,
            Self::Getpeername6 => bpf_attach_type::BPF_CGROUP_INET6_GETPEERNAME,
            Self::SockRelease => bpf_attach_type::BPF_CGROUP_INET_SOCK_RELEASE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_pin_names_have_no_dots_and_do_not_collide() {
        assert_eq!(dev_pin_name(DevLink::Tc, "eth0"), "tc-eth0");
        assert_eq!(dev_pin_name(DevLink::Xdp, "eth0.100"), "xdp-eth0%2e100");
        assert_ne!(
            dev_pin_name(DevLink::Tc, "a%2eb"),
            dev_pin_name(DevLink::Tc, "a.b")
        );
        for (kind, dev) in [
            (DevLink::Tc, "eth0.100"),
            (DevLink::Xdp, "a%2eb"),
            (DevLink::Tc, "%"),
        ] {
            let name = dev_pin_name(kind, dev);
            assert_eq!(dev_of_pin_name(&name), Some((kind, dev.to_owned())));
        }
        for other in ["connect4", "new-tc-eth0", "tc-", "tc-a%2", "xdp-a%41"] {
            assert_eq!(dev_of_pin_name(other), None, "{other}");
        }
        let p = Pins::new("/x");
        assert_eq!(
            p.staging_dev_link(DevLink::Tc, "eth0"),
            Path::new("/x/links/new-tc-eth0")
        );
    }
}
