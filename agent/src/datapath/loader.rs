use std::{
    fs::File,
    io,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::MapData,
    programs::{CgroupAttachMode, CgroupSockAddr, ProgramError, links::FdLink},
};
use tracing::{info, warn};

use super::{
    links,
    pins::{Hook, Pins},
};
use crate::maps::{MapError, pinned::PinnedMaps};

/// The kernel programs, built by `build.rs` from `ebpf/programs`.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/weir-ebpf"));

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub pins: Pins,
    pub cgroup: PathBuf,
    pub max_services: u32,
    pub max_backends: u32,
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
    #[error("loading the eBPF object failed")]
    Load(#[source] EbpfError),
    #[error("program {name} failed")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
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
    #[error(transparent)]
    Maps(#[from] MapError),
}

/// The loaded datapath. Dropping it leaves programs attached and maps pinned.
pub struct Datapath {
    _ebpf: Ebpf,
    pub maps: PinnedMaps,
}

impl Datapath {
    pub fn load(opts: &LoadOptions) -> Result<Self, LoadError> {
        let pins = &opts.pins;
        prepare_dirs(pins)?;
        check_pins(pins, opts)?;

        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(pins.maps())
            .map_max_entries(weir_abi::MAP_SERVICES4, opts.max_services)
            .map_max_entries(weir_abi::MAP_REVNAT4, opts.max_services)
            .map_max_entries(weir_abi::MAP_BACKENDS4, opts.max_backends)
            .load(PROGRAMS)
            .map_err(LoadError::Load)?;

        if fs_magic(&opts.cgroup) != Some(CGROUP2_SUPER_MAGIC) {
            return Err(LoadError::NotCgroup2 {
                path: opts.cgroup.clone(),
            });
        }
        let cgroup = File::open(&opts.cgroup).map_err(|source| LoadError::Cgroup {
            path: opts.cgroup.clone(),
            source,
        })?;
        let cgroup_id = links::cgroup_id(&opts.cgroup).map_err(|source| LoadError::Cgroup {
            path: opts.cgroup.clone(),
            source,
        })?;
        for hook in Hook::ALL {
            let name = hook.program();
            let prog: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or(LoadError::Program {
                    name,
                    source: ProgramError::NotLoaded,
                })?
                .try_into()
                .map_err(|source| LoadError::Program { name, source })?;
            prog.load()
                .map_err(|source| LoadError::Program { name, source })?;
            install(pins, hook, prog, &cgroup, cgroup_id)?;
        }
        let maps = PinnedMaps::open(&pins.maps())?;
        Ok(Self { _ebpf: ebpf, maps })
    }
}

/// Where bpffs lives by convention; the agent mounts it there if nobody has,
/// as Cilium does. Any other `--bpffs` location must already be a bpffs mount.
const BPFFS_DEFAULT_MOUNT: &str = "/sys/fs/bpf";

fn prepare_dirs(pins: &Pins) -> Result<(), LoadError> {
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
fn fs_magic(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs fills the zeroed struct; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        (libc::statfs(c.as_ptr(), &raw mut st) == 0).then_some(st.f_type)
    }
}

/// Refuses pins whose layout differs from this build's ABI, and says when a
/// pinned map keeps a size other than the flags ask for.
fn check_pins(pins: &Pins, opts: &LoadOptions) -> Result<(), LoadError> {
    use std::mem::size_of;

    use weir_abi::{Backend4, RevNat4, RevSock4Key, RevSock4Value, Service4Key, Service4Value};
    let expect = [
        (
            weir_abi::MAP_SERVICES4,
            size_of::<Service4Key>(),
            size_of::<Service4Value>(),
            Some(opts.max_services),
        ),
        (
            weir_abi::MAP_BACKENDS4,
            4,
            size_of::<Backend4>(),
            Some(opts.max_backends),
        ),
        (
            weir_abi::MAP_REVNAT4,
            4,
            size_of::<RevNat4>(),
            Some(opts.max_services),
        ),
        (
            weir_abi::MAP_REVSOCK4,
            size_of::<RevSock4Key>(),
            size_of::<RevSock4Value>(),
            None,
        ),
    ];
    for (name, key, value, max) in expect {
        let path = pins.maps().join(name);
        let Ok(data) = MapData::from_pin(&path) else {
            continue;
        };
        let Ok(info) = data.info() else {
            continue;
        };
        for (what, found, expected) in [
            ("key size", info.key_size(), key as u32),
            ("value size", info.value_size(), value as u32),
        ] {
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
    }
    Ok(())
}

/// Puts `prog` on `hook` of the cgroup. An existing pinned link on the same
/// cgroup gets the new program atomically; otherwise a new link is attached and
/// pinned before any old one is detached.
fn install(
    pins: &Pins,
    hook: Hook,
    prog: &mut CgroupSockAddr,
    cgroup: &File,
    cgroup_id: u64,
) -> Result<(), LoadError> {
    let path = pins.link(hook);
    let link_err = |source: io::Error| LoadError::Link {
        hook: hook.pin_name(),
        path: path.clone(),
        source,
    };
    let prog_fd = prog
        .fd()
        .map_err(|source| LoadError::Program {
            name: hook.program(),
            source,
        })?
        .as_fd()
        .try_clone_to_owned()
        .map_err(link_err)?;

    let old = match links::open_pinned(&path) {
        Ok(fd) => Some(fd),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(link_err(e)),
    };
    if let Some(old) = &old {
        let info = links::cgroup_link_info(old.as_fd()).map_err(link_err)?;
        if let Some(info) = info
            && info.cgroup_id == cgroup_id
            && info.attach_type == hook.attach_type() as u32
        {
            links::update_program(old.as_fd(), prog_fd.as_fd()).map_err(link_err)?;
            info!(hook = hook.pin_name(), "took over pinned link");
            return Ok(());
        }
    }

    let id = prog
        .attach(cgroup, CgroupAttachMode::Single)
        .map_err(|source| LoadError::Program {
            name: hook.program(),
            source,
        })?;
    let link = prog.take_link(id).map_err(|source| LoadError::Program {
        name: hook.program(),
        source,
    })?;
    let link = FdLink::try_from(link).map_err(|e| link_err(io::Error::other(e)))?;
    let staging = pins.staging_link(hook);
    let _ = std::fs::remove_file(&staging);
    link.pin(&staging)
        .map_err(|e| link_err(io::Error::other(e)))?;
    if let Some(old) = old {
        // The old link served another cgroup (or none): retire it only now
        // that the new one is live.
        let _ = links::detach(old.as_fd());
    }
    std::fs::rename(&staging, &path).map_err(link_err)?;
    info!(hook = hook.pin_name(), "attached and pinned link");
    Ok(())
}
