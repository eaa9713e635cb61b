use std::{
    io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::{Array, MapData},
    programs::ProgramError,
};
use tracing::{info, warn};

use super::{
    devices::{Devices, Pattern},
    legacy::Legacy,
    netdev::Acceleration,
    pins::Pins,
    sock,
};
use crate::maps::{MapError, pinned::PinnedMaps};

/// The kernel programs, built by `build.rs` from `ebpf/programs`.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/weir-ebpf"));

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
pub(super) const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub pins: Pins,
    /// cgroup v2 directory of the socket hooks.
    pub cgroup: PathBuf,
    /// Capacity of the services and rev-NAT maps.
    pub max_services: u32,
    /// Capacity of the backends map.
    pub max_backends: u32,
    /// Capacity of each conntrack map.
    pub ct_max: u32,
    /// Capacity of the socket reverse-translation map: sockets open at once
    /// whose peer the hooks translated.
    pub max_revsock: u32,
    /// Capacity of the Maglev map, in chunks (see [`Self::maglev_chunks`]).
    pub max_maglev: u32,
    /// Attach the cgroup socket hooks (`--socket-lb`); when false, hooks a
    /// previous run pinned are detached.
    pub socket_lb: bool,
    /// Devices for `weir_tc_ingress` (and `weir_xdp`): exact names and
    /// `prefix+` patterns.
    pub devices: Vec<Pattern>,
    /// The devices among those that also get `weir_xdp` (when
    /// `acceleration` is not disabled).
    pub acceleration_devices: Vec<Pattern>,
    pub acceleration: Acceleration,
    /// Conntrack timeouts written to `WEIR_CONFIG`; its flags are derived
    /// from the other options.
    pub config: weir_abi::Config,
}

impl LoadOptions {
    /// Options with the ABI's default capacities and timeouts, socket load
    /// balancing on and no devices.
    pub fn new(pins: Pins, cgroup: PathBuf) -> Self {
        Self {
            pins,
            cgroup,
            max_services: weir_abi::DEFAULT_MAX_SERVICES,
            max_backends: weir_abi::DEFAULT_MAX_BACKENDS,
            ct_max: weir_abi::DEFAULT_MAX_CT,
            max_revsock: weir_abi::DEFAULT_MAX_REVSOCK,
            max_maglev: Self::maglev_chunks(
                weir_abi::DEFAULT_MAX_MAGLEV_TABLES,
                weir_abi::maglev::DEFAULT_TABLE_SIZE,
            ),
            socket_lb: true,
            devices: Vec::new(),
            acceleration_devices: Vec::new(),
            acceleration: Acceleration::Disabled,
            config: weir_abi::DEFAULT_CONFIG,
        }
    }

    /// The Maglev map's capacity for `tables` tables of `size` positions.
    pub const fn maglev_chunks(tables: u32, size: u32) -> u32 {
        tables.saturating_mul(weir_abi::maglev::chunks(size))
    }

    /// The `WEIR_CONFIG` value these options ask for.
    pub fn datapath_config(&self) -> weir_abi::Config {
        let mut flags = self.config.flags & !weir_abi::CFG_F_SOCKET_LB;
        if self.socket_lb {
            flags |= weir_abi::CFG_F_SOCKET_LB;
        }
        weir_abi::Config {
            flags,
            ..self.config
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path} is not on a bpf filesystem; mount one first: mount -t bpf bpf {path}")]
    NotBpffs { path: PathBuf },
    #[error("cannot create {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "pinned map {path} has {what} {found}, this agent expects {expected}; it was made by an incompatible agent version, run `weir-agent cleanup` first"
    )]
    IncompatiblePin {
        path: PathBuf,
        what: &'static str,
        found: u32,
        expected: u32,
    },
    #[error("carrying over {path}, which an older agent pinned, failed")]
    Legacy {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("loading the eBPF object failed")]
    Load(#[source] EbpfError),
    #[error("program {name} failed")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("the eBPF object of this build has no program {name}")]
    MissingProgram { name: &'static str },
    #[error(
        "{path} is not a cgroup v2 directory (on hybrid hosts cgroup2 is often at /sys/fs/cgroup/unified)"
    )]
    NotCgroup2 { path: PathBuf },
    #[error("cannot open cgroup {path}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{hook} link at {path} failed")]
    Link {
        hook: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("attaching weir_tc_ingress to {device} failed")]
    TcAttach {
        device: String,
        #[source]
        source: ProgramError,
    },
    #[error("link {link} of device {device} failed")]
    DevLink {
        link: String,
        device: String,
        #[source]
        source: io::Error,
    },
    #[error("the eBPF object of this build has no map {name}")]
    MissingMap { name: &'static str },
    #[error("writing {map} failed")]
    Config {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error(transparent)]
    Maps(#[from] MapError),
}

/// The loaded datapath. Dropping it leaves programs attached and maps pinned.
pub struct Datapath {
    pub maps: PinnedMaps,
    /// The per-packet programs; [`Devices::spawn`] keeps them on the devices
    /// that come and go.
    pub devices: Devices,
}

/// Whether XDP programs may call `bpf_xdp_adjust_meta`. Some kernel builds
/// refuse it (6.18.44 here); the XDP program then loads without its
/// hand-off to TC (see `WEIR_XDP_META` in the programs) rather than not at
/// all, which took the whole datapath down with it.
fn xdp_meta_supported() -> bool {
    use aya::{
        programs::ProgramType,
        sys::{BpfHelper, is_helper_supported},
    };
    match is_helper_supported(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_adjust_meta) {
        Ok(true) => true,
        Ok(false) => {
            warn!(
                "this kernel refuses bpf_xdp_adjust_meta to XDP programs: flows XDP would hand to TC after SNAT are passed untranslated, and TC translates them"
            );
            false
        }
        // The probe itself failed (no BPF at all): the load says why.
        Err(_) => true,
    }
}

impl Datapath {
    pub fn load(opts: &LoadOptions) -> Result<Self, LoadError> {
        let pins = &opts.pins;
        prepare_dirs(pins)?;
        let legacy = Legacy::take(pins)?;
        if let Err(e) = check_pins(pins, opts) {
            legacy.restore();
            return Err(e);
        }
        // Devices and the cgroup are checked before anything is loaded, so a
        // typo in a flag changes nothing.
        if opts.socket_lb {
            sock::check_cgroup(&opts.cgroup)?;
        }

        // Only devices run the XDP program: without any, nothing to probe
        // or warn about.
        let xdp_meta = opts.devices.is_empty() || xdp_meta_supported();
        let ebpf = EbpfLoader::new()
            .override_global("WEIR_XDP_META", &u8::from(xdp_meta), true)
            .default_map_pin_directory(pins.maps())
            .map_max_entries(weir_abi::MAP_SERVICES, opts.max_services)
            .map_max_entries(weir_abi::MAP_REVNAT, opts.max_services)
            .map_max_entries(weir_abi::MAP_SVC_LABELS, opts.max_services)
            .map_max_entries(weir_abi::MAP_BACKENDS, backend_elements(opts))
            .map_max_entries(weir_abi::MAP_CT_TCP, opts.ct_max)
            .map_max_entries(weir_abi::MAP_CT_UDP, opts.ct_max)
            .map_max_entries(weir_abi::MAP_AFFINITY, weir_abi::DEFAULT_MAX_AFFINITY)
            .map_max_entries(weir_abi::MAP_SRC_RANGES, weir_abi::DEFAULT_MAX_SRC_RANGES)
            .map_max_entries(weir_abi::MAP_REVSOCK, opts.max_revsock)
            .map_max_entries(weir_abi::MAP_MAGLEV, opts.max_maglev)
            // BTF map definitions carry no pinning; name the pin here.
            .map_pin_path(
                weir_abi::MAP_SOCK_PICKS,
                pins.maps().join(weir_abi::MAP_SOCK_PICKS),
            )
            .load(PROGRAMS);
        let mut ebpf = match ebpf {
            Ok(e) => e,
            Err(e) => {
                legacy.restore();
                return Err(LoadError::Load(e));
            }
        };
        // Before any new program can read the new maps.
        legacy.finish()?;

        // Timeouts first: the programs read them for the first flow.
        write_config(&mut ebpf, opts.datapath_config())?;

        if opts.socket_lb {
            sock::attach(&mut ebpf, pins, &opts.cgroup)?;
        } else {
            sock::detach_pinned(pins)?;
        }
        let mut devices = Devices::new(
            ebpf,
            pins.clone(),
            opts.devices.clone(),
            opts.acceleration_devices.clone(),
            opts.acceleration,
        );
        devices.initial()?;

        let maps = PinnedMaps::open(&pins.maps())?;
        Ok(Self { maps, devices })
    }
}

fn write_config(ebpf: &mut Ebpf, config: weir_abi::Config) -> Result<(), LoadError> {
    let map = weir_abi::MAP_CONFIG;
    let err = |source| LoadError::Config { map, source };
    let m = ebpf
        .map_mut(map)
        .ok_or(LoadError::MissingMap { name: map })?;
    let mut array: Array<_, weir_abi::Config> = Array::try_from(m).map_err(err)?;
    array.set(0, config, 0).map_err(err)?;
    info!(
        tcp_syn = config.ct_tcp_syn,
        tcp = config.ct_tcp_established,
        tcp_fin = config.ct_tcp_closing,
        udp = config.ct_udp,
        socket_lb = config.flags & weir_abi::CFG_F_SOCKET_LB != 0,
        csum_ipv6 = config.flags & weir_abi::CFG_F_CSUM_IPV6 != 0,
        snat_ports = %format_args!("{}-{}", config.snat_port_min, config.snat_port_max),
        "datapath configuration written"
    );
    Ok(())
}

/// Where bpffs lives by convention; the agent mounts it there if nobody has,
/// as Cilium does. Any other `--bpffs` location must already be a bpffs mount.
const BPFFS_DEFAULT_MOUNT: &str = "/sys/fs/bpf";

/// Mounts bpffs at its usual place if needed and makes the pin directories.
pub fn prepare_dirs(pins: &Pins) -> Result<(), LoadError> {
    let root = pins.root();
    let default_mount = Path::new(BPFFS_DEFAULT_MOUNT);
    if root.starts_with(default_mount) && !is_bpffs(default_mount) {
        mount_bpffs(default_mount);
    }
    let probe = if root.exists() {
        root
    } else {
        root.parent().unwrap_or(root)
    };
    if !is_bpffs(probe) {
        return Err(LoadError::NotBpffs {
            path: probe.to_path_buf(),
        });
    }
    for dir in [pins.maps(), pins.links()] {
        std::fs::create_dir_all(&dir)
            .map_err(|source| LoadError::CreateDir { path: dir, source })?;
    }
    Ok(())
}

fn mount_bpffs(at: &Path) {
    let Ok(target) = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: all pointers are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        info!(path = %at.display(), "mounted bpffs");
    } else {
        warn!(path = %at.display(), "cannot mount bpffs: {}", io::Error::last_os_error());
    }
}

pub fn is_bpffs(path: &Path) -> bool {
    fs_magic(path) == Some(BPF_FS_MAGIC)
}

/// The filesystem type of `path` (`statfs.f_type`).
pub(super) fn fs_magic(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs fills the zeroed struct; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        (libc::statfs(c.as_ptr(), &raw mut st) == 0).then_some(st.f_type)
    }
}

/// Key size, value size and requested capacity (where a flag sets it) of
/// every map, as this build's ABI lays them out.
fn expected_layouts(opts: &LoadOptions) -> [(&'static str, usize, usize, Option<u32>); 13] {
    use std::mem::size_of;

    use weir_abi::{
        AffinityKey, AffinityValue, Backend, Config, CtKey, CtValue, RevNat, RevSockKey,
        RevSockValue, ServiceKey, ServiceValue, SockPicks, SrcRangeKey, StatValue,
        maglev::{MaglevChunk, MaglevKey},
    };
    [
        (
            weir_abi::MAP_SERVICES,
            size_of::<ServiceKey>(),
            size_of::<ServiceValue>(),
            Some(opts.max_services),
        ),
        (
            weir_abi::MAP_BACKENDS,
            4,
            size_of::<Backend>(),
            Some(backend_elements(opts)),
        ),
        (
            weir_abi::MAP_REVNAT,
            4,
            size_of::<RevNat>(),
            Some(opts.max_services),
        ),
        (
            weir_abi::MAP_SVC_LABELS,
            4,
            size_of::<weir_abi::SvcLabel>(),
            Some(opts.max_services),
        ),
        (
            weir_abi::MAP_REVSOCK,
            size_of::<RevSockKey>(),
            size_of::<RevSockValue>(),
            Some(opts.max_revsock),
        ),
        // Socket storage: keyed by a socket fd, sized by the sockets.
        (weir_abi::MAP_SOCK_PICKS, 4, size_of::<SockPicks>(), None),
        (
            weir_abi::MAP_MAGLEV,
            size_of::<MaglevKey>(),
            size_of::<MaglevChunk>(),
            Some(opts.max_maglev),
        ),
        (
            weir_abi::MAP_CT_TCP,
            size_of::<CtKey>(),
            size_of::<CtValue>(),
            Some(opts.ct_max),
        ),
        (
            weir_abi::MAP_CT_UDP,
            size_of::<CtKey>(),
            size_of::<CtValue>(),
            Some(opts.ct_max),
        ),
        (
            weir_abi::MAP_AFFINITY,
            size_of::<AffinityKey>(),
            size_of::<AffinityValue>(),
            None,
        ),
        // LPM trie keys start with the u32 prefix length.
        (
            weir_abi::MAP_SRC_RANGES,
            4 + size_of::<SrcRangeKey>(),
            1,
            None,
        ),
        (weir_abi::MAP_CONFIG, 4, size_of::<Config>(), None),
        // Per-CPU maps report the size of one CPU's value. A stats map
        // pinned by an agent that knew fewer reasons keeps its size, and
        // the newer reasons go uncounted until a cleanup: say so.
        (
            weir_abi::MAP_STATS,
            4,
            size_of::<StatValue>(),
            Some(weir_abi::STAT_ENTRIES),
        ),
    ]
}

/// Elements of the backends array: one per backend, and id 0, which is
/// never handed out.
const fn backend_elements(opts: &LoadOptions) -> u32 {
    opts.max_backends.saturating_add(1)
}

/// Refuses pins whose type or layout differs from this build's ABI, and says
/// when a pinned map keeps a size other than the flags ask for.
fn check_pins(pins: &Pins, opts: &LoadOptions) -> Result<(), LoadError> {
    let expect = expected_layouts(opts);
    let object = aya_obj::Object::parse(PROGRAMS).map_err(|e| LoadError::Load(e.into()))?;
    for (name, key, value, max) in expect {
        let path = pins.maps().join(name);
        let Ok(data) = MapData::from_pin(&path) else {
            continue;
        };
        let Ok(info) = data.info() else {
            continue;
        };
        let types = object.maps.get(name).map(|m| {
            let found = info.map_type().map_or(u32::MAX, |t| t as u32);
            ("map type (enum bpf_map_type)", found, m.map_type())
        });
        for (what, found, expected) in types.into_iter().chain([
            ("key size", info.key_size(), key as u32),
            ("value size", info.value_size(), value as u32),
        ]) {
            if found != expected {
                return Err(LoadError::IncompatiblePin {
                    path,
                    what,
                    found,
                    expected,
                });
            }
        }
        if let Some(max) = max
            && info.max_entries() != max
        {
            warn!(
                map = name,
                pinned = info.max_entries(),
                requested = max,
                "pinned map keeps its size; run `weir-agent cleanup` and restart to resize it"
            );
        }
        // Pinned by an agent from before the services and backends maps were
        // preallocated: it works, with slower first syncs.
        if preallocated(name) && info.map_flags() & aya_obj::generated::BPF_F_NO_PREALLOC != 0 {
            warn!(
                map = name,
                "pinned map allocates per entry, as older agents made it; run `weir-agent cleanup` and restart to preallocate it"
            );
        }
    }
    Ok(())
}

/// The maps this build creates preallocated (see the eBPF crate's maps.rs).
fn preallocated(name: &str) -> bool {
    name == weir_abi::MAP_SERVICES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_abi_map_is_checked() {
        let opts = LoadOptions::new(Pins::new("/x"), "/y".into());
        let names: Vec<_> = expected_layouts(&opts).iter().map(|e| e.0).collect();
        for m in [
            weir_abi::MAP_SERVICES,
            weir_abi::MAP_BACKENDS,
            weir_abi::MAP_REVNAT,
            weir_abi::MAP_REVSOCK,
            weir_abi::MAP_SOCK_PICKS,
            weir_abi::MAP_MAGLEV,
            weir_abi::MAP_CT_TCP,
            weir_abi::MAP_CT_UDP,
            weir_abi::MAP_AFFINITY,
            weir_abi::MAP_SRC_RANGES,
            weir_abi::MAP_CONFIG,
            weir_abi::MAP_STATS,
        ] {
            assert!(names.contains(&m), "{m}");
        }
    }

    #[test]
    fn config_flags_follow_socket_lb() {
        let mut opts = LoadOptions::new(Pins::new("/x"), "/y".into());
        opts.config.ct_udp = 5;
        assert_eq!(opts.datapath_config().flags, weir_abi::CFG_F_SOCKET_LB);
        assert_eq!(opts.datapath_config().ct_udp, 5);
        opts.socket_lb = false;
        assert_eq!(opts.datapath_config().flags, 0);
        opts.config.flags = weir_abi::CFG_F_CSUM_IPV6;
        opts.config.snat_port_min = 50_000;
        let c = opts.datapath_config();
        assert_eq!(c.flags, weir_abi::CFG_F_CSUM_IPV6);
        assert_eq!(c.snat_port_min, 50_000);
    }
}
