//! The few bpf(2) link commands aya 0.14 keeps private: open a pinned link,
//! read what it is attached to, swap its program atomically
//! (`BPF_LINK_UPDATE`), detach it, and create an XDP link without aya's
//! netlink fallback (which leaves an attachment that cannot be pinned).
use std::{
    ffi::CString,
    io, mem,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_link_info, bpf_link_type};

/// What a pinned cgroup link is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupLinkInfo {
    pub prog_id: u32,
    /// 0 once the cgroup is gone and the link is defunct.
    pub cgroup_id: u64,
    pub attach_type: u32,
}

fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<i64> {
    // SAFETY: attr is a valid, zero-initialised bpf_attr of the size we pass.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            mem::size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn zeroed_attr() -> bpf_attr {
    // SAFETY: bpf_attr is a C union of integers; all zeroes is valid and is what
    // the kernel requires of unused fields.
    unsafe { mem::zeroed() }
}

/// Opens a pinned bpf object (`BPF_OBJ_GET`).
pub fn open_pinned(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_4.pathname = c.as_ptr() as u64;
    let fd = sys_bpf(bpf_cmd::BPF_OBJ_GET, &mut attr)?;
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: BPF_OBJ_GET returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What a pinned link is attached to, for the link types Weir creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkTarget {
    Cgroup(CgroupLinkInfo),
    /// A tcx link; `ifindex` 0 once its device is gone.
    Tcx {
        ifindex: u32,
        attach_type: u32,
    },
    /// An XDP link; `ifindex` 0 once its device is gone.
    Xdp {
        ifindex: u32,
    },
    /// Any other link type (`bpf_link_type`).
    Other(u32),
}

/// Reads what a link is attached to.
pub fn link_target(link: BorrowedFd<'_>) -> io::Result<LinkTarget> {
    // SAFETY: plain C struct/union of integers; zero is valid.
    let mut info: bpf_link_info = unsafe { mem::zeroed() };
    let mut attr = zeroed_attr();
    attr.info.bpf_fd = fd_u32(link);
    attr.info.info_len =
        u32::try_from(mem::size_of::<bpf_link_info>()).map_err(io::Error::other)?;
    attr.info.info = std::ptr::from_mut(&mut info) as u64;
    sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    // SAFETY (all three): the kernel fills the union member of the link's type.
    Ok(match info.type_ {
        t if t == bpf_link_type::BPF_LINK_TYPE_CGROUP as u32 => {
            let cg = unsafe { info.__bindgen_anon_1.cgroup };
            LinkTarget::Cgroup(CgroupLinkInfo {
                prog_id: info.prog_id,
                cgroup_id: cg.cgroup_id,
                attach_type: cg.attach_type,
            })
        }
        t if t == bpf_link_type::BPF_LINK_TYPE_TCX as u32 => {
            let tcx = unsafe { info.__bindgen_anon_1.tcx };
            LinkTarget::Tcx {
                ifindex: tcx.ifindex,
                attach_type: tcx.attach_type,
            }
        }
        t if t == bpf_link_type::BPF_LINK_TYPE_XDP as u32 => {
            let xdp = unsafe { info.__bindgen_anon_1.xdp };
            LinkTarget::Xdp {
                ifindex: xdp.ifindex,
            }
        }
        t => LinkTarget::Other(t),
    })
}

/// Reads a link's info; `None` when it is not a cgroup link.
pub fn cgroup_link_info(link: BorrowedFd<'_>) -> io::Result<Option<CgroupLinkInfo>> {
    Ok(match link_target(link)? {
        LinkTarget::Cgroup(info) => Some(info),
        _ => None,
    })
}

/// `XDP_FLAGS_DRV_MODE`: native (driver) XDP, never the generic fallback,
/// which runs after TC and would only add cost.
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// Attaches `prog` to the device `ifindex` as an XDP link (`BPF_LINK_CREATE`).
pub fn xdp_link_create(prog: BorrowedFd<'_>, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    attr.link_create.__bindgen_anon_1.prog_fd = fd_u32(prog);
    attr.link_create.__bindgen_anon_2.target_ifindex = ifindex;
    attr.link_create.attach_type = bpf_attach_type::BPF_XDP as u32;
    attr.link_create.flags = flags;
    let fd = sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)?;
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: BPF_LINK_CREATE returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Pins a link descriptor at `path` (`BPF_OBJ_PIN`).
pub fn pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_4.pathname = c.as_ptr() as u64;
    attr.__bindgen_anon_4.bpf_fd = fd_u32(fd);
    sys_bpf(bpf_cmd::BPF_OBJ_PIN, &mut attr).map(drop)
}

/// Atomically replaces the program behind `link` (`BPF_LINK_UPDATE`): the hook
/// runs the old program until the instant it runs the new one.
pub fn update_program(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = zeroed_attr();
    attr.link_update.link_fd = fd_u32(link);
    attr.link_update.__bindgen_anon_1.new_prog_fd = fd_u32(prog);
    sys_bpf(bpf_cmd::BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// Detaches a link from its hook even while other descriptors or pins hold it.
pub fn detach(link: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = zeroed_attr();
    attr.link_detach.link_fd = fd_u32(link);
    sys_bpf(bpf_cmd::BPF_LINK_DETACH, &mut attr).map(drop)
}

/// The id the kernel gives a cgroup: the inode number of its cgroup2 directory.
pub fn cgroup_id(path: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    Ok(std::fs::metadata(path)?.ino())
}

fn fd_u32(fd: impl AsFd) -> u32 {
    // Descriptors are non-negative.
    fd.as_fd().as_raw_fd().cast_unsigned()
}
