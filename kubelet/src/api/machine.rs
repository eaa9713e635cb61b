//! What the node is, read from the machine: the numbers behind the Node's
//! capacity, allocatable, nodeInfo and pressure conditions. Everything here
//! degrades to a neutral value when a file is unreadable (a container without
//! /sys, a test sandbox), because a missing detail must not keep the node from
//! registering.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket},
    path::Path,
};

/// The kubelet's default hard eviction threshold `memory.available<100Mi`
/// (pkg/kubelet/apis/config/v1beta1/defaults_linux.go): below it the node
/// reports MemoryPressure, and it is held back from allocatable.
pub const MEMORY_EVICTION_BYTES: u64 = 100 * 1024 * 1024;
/// `nodefs.available<10%`, the default disk threshold.
pub const NODEFS_EVICTION_PERCENT: u64 = 10;
/// The kubelet has no default PID threshold; this one (10% of `pid_max`
/// left) only keeps PIDPressure meaningful instead of always False.
pub const PID_EVICTION_PERCENT: u64 = 10;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Machine {
    pub cpus: u32,
    pub memory_total: u64,
    pub memory_available: u64,
    pub fs_capacity: u64,
    pub fs_available: u64,
    pub pid_max: u64,
    pub pids: u64,
    pub kernel_version: String,
    pub os_image: String,
    /// Go's GOARCH spelling (`amd64`, `arm64`), as nodeInfo and the
    /// `kubernetes.io/arch` label use it.
    pub architecture: String,
    pub machine_id: String,
    pub boot_id: String,
    pub system_uuid: String,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

impl Machine {
    /// Reads the machine now; `root` is the filesystem pods write to (the
    /// kubelet's root directory, or `/`).
    pub fn read(root: &Path) -> Self {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let (memory_total, memory_available) = parse_meminfo(&meminfo);
        let (fs_capacity, fs_available) = statvfs(root)
            .or_else(|| statvfs(Path::new("/")))
            .unwrap_or_default();
        Self {
            cpus: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
            memory_total,
            memory_available,
            fs_capacity,
            fs_available,
            pid_max: read_trim("/proc/sys/kernel/pid_max")
                .parse()
                .unwrap_or(32768),
            pids: parse_loadavg_tasks(&read_trim("/proc/loadavg")),
            kernel_version: read_trim("/proc/sys/kernel/osrelease"),
            os_image: os_image(&std::fs::read_to_string("/etc/os-release").unwrap_or_default()),
            architecture: go_arch(std::env::consts::ARCH).to_owned(),
            machine_id: read_trim("/etc/machine-id"),
            boot_id: read_trim("/proc/sys/kernel/random/boot_id"),
            // Readable by root only; the kubelet leaves it empty too then.
            system_uuid: read_trim("/sys/class/dmi/id/product_uuid"),
        }
    }

    pub fn memory_pressure(&self) -> bool {
        self.memory_total > 0 && self.memory_available < MEMORY_EVICTION_BYTES
    }

    pub fn disk_pressure(&self) -> bool {
        self.fs_capacity > 0 && self.fs_available * 100 < self.fs_capacity * NODEFS_EVICTION_PERCENT
    }

    pub fn pid_pressure(&self) -> bool {
        self.pid_max > 0
            && self.pid_max.saturating_sub(self.pids) * 100 < self.pid_max * PID_EVICTION_PERCENT
    }
}

/// `(MemTotal, MemAvailable)` in bytes. The kubelet's `memory.available` is
/// computed from the cgroup working set; MemAvailable is the kernel's own
/// estimate of the same thing and needs no cgroup walk.
pub fn parse_meminfo(text: &str) -> (u64, u64) {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    let total = field("MemTotal").unwrap_or(0);
    let available = field("MemAvailable")
        .or_else(|| field("MemFree"))
        .unwrap_or(total);
    (total, available)
}

/// The number of tasks (threads) from `/proc/loadavg`'s `running/total` field:
/// what a PID limit counts.
pub fn parse_loadavg_tasks(text: &str) -> u64 {
    text.split_whitespace()
        .nth(3)
        .and_then(|f| f.split('/').nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// `PRETTY_NAME` from os-release, as cAdvisor reports the OS image.
pub fn os_image(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .unwrap_or_else(|| "Linux".to_owned())
}

pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// `(capacity, available)` bytes of the filesystem holding `path`.
// The statvfs field widths differ between targets (32-bit c_ulong).
#[allow(clippy::unnecessary_cast)]
fn statvfs(path: &Path) -> Option<(u64, u64)> {
    crate::eviction::observe::fs_stats(path).map(|f| (f.capacity, f.available))
}

/// The node's primary IP: an explicit override, else the source address the
/// kernel would use for the default route. Connecting a UDP socket only asks
/// the routing table; no packet leaves the host.
pub fn primary_ip(override_ip: Option<IpAddr>) -> IpAddr {
    if let Some(ip) = override_ip {
        return ip;
    }
    let probe = |bind: IpAddr, dest: IpAddr| -> Option<IpAddr> {
        let s = UdpSocket::bind((bind, 0)).ok()?;
        s.connect((dest, 53)).ok()?;
        let ip = s.local_addr().ok()?.ip();
        (!ip.is_unspecified() && !ip.is_loopback()).then_some(ip)
    };
    probe(
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
    )
    .or_else(|| {
        probe(
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        )
    })
    .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_in_bytes() {
        let t = "MemTotal:       16323804 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(parse_meminfo(t), (16323804 * 1024, 8000000 * 1024));
        assert_eq!(
            parse_meminfo("MemTotal: 4 kB\nMemFree: 2 kB\n"),
            (4096, 2048)
        );
        assert_eq!(parse_meminfo(""), (0, 0));
    }

    #[test]
    fn loadavg_tasks() {
        assert_eq!(parse_loadavg_tasks("0.10 0.20 0.30 2/345 6789"), 345);
        assert_eq!(parse_loadavg_tasks("garbage"), 0);
    }

    #[test]
    fn os_release_pretty_name() {
        let t = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\n";
        assert_eq!(os_image(t), "Debian GNU/Linux 13 (trixie)");
        assert_eq!(os_image(""), "Linux");
    }

    #[test]
    fn pressure_thresholds() {
        let m = Machine {
            memory_total: 1 << 30,
            memory_available: MEMORY_EVICTION_BYTES - 1,
            fs_capacity: 1000,
            fs_available: 99,
            pid_max: 1000,
            pids: 950,
            ..Default::default()
        };
        assert!(m.memory_pressure() && m.disk_pressure() && m.pid_pressure());
        let m = Machine {
            memory_available: MEMORY_EVICTION_BYTES,
            fs_available: 100,
            pids: 900,
            ..m
        };
        assert!(!m.memory_pressure() && !m.disk_pressure() && !m.pid_pressure());
    }

    #[test]
    fn reads_this_machine() {
        let m = Machine::read(Path::new("/"));
        assert!(m.cpus >= 1);
        assert!(m.memory_total > 0);
        assert!(m.fs_capacity > 0);
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(
            primary_ip(Some("10.1.2.3".parse().unwrap())).to_string(),
            "10.1.2.3"
        );
    }
}
