//! Every path under the bpffs directory, in one place.
//!
//! ```text
//! <bpffs>/maps/WEIR_SVC4 …        pinned maps (weir_abi::MAP_*)
//! <bpffs>/links/connect4 …        pinned cgroup links, one per hook
//! ```
use std::path::{Path, PathBuf};

use aya_obj::generated::bpf_attach_type;

#[derive(Clone, Debug)]
pub struct Pins {
    root: PathBuf,
}

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
}

/// The socket hooks, with the program that serves each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Connect4,
    Sendmsg4,
    Recvmsg4,
    Getpeername4,
}

impl Hook {
    pub const ALL: [Self; 4] = [
        Self::Connect4,
        Self::Sendmsg4,
        Self::Recvmsg4,
        Self::Getpeername4,
    ];

    pub const fn pin_name(self) -> &'static str {
        match self {
            Self::Connect4 => "connect4",
            Self::Sendmsg4 => "sendmsg4",
            Self::Recvmsg4 => "recvmsg4",
            Self::Getpeername4 => "getpeername4",
        }
    }

    /// The function name in `weir-ebpf`.
    pub const fn program(self) -> &'static str {
        match self {
            Self::Connect4 => "weir_connect4",
            Self::Sendmsg4 => "weir_sendmsg4",
            Self::Recvmsg4 => "weir_recvmsg4",
            Self::Getpeername4 => "weir_getpeername4",
        }
    }

    pub const fn attach_type(self) -> bpf_attach_type {
        match self {
            Self::Connect4 => bpf_attach_type::BPF_CGROUP_INET4_CONNECT,
            Self::Sendmsg4 => bpf_attach_type::BPF_CGROUP_UDP4_SENDMSG,
            Self::Recvmsg4 => bpf_attach_type::BPF_CGROUP_UDP4_RECVMSG,
            Self::Getpeername4 => bpf_attach_type::BPF_CGROUP_INET4_GETPEERNAME,
        }
    }
}
