//! The cgroup socket hooks (`--socket-lb`): ClusterIP translated once per
//! connect()/sendmsg() instead of per packet.
use std::{
    fs::File,
    io,
    os::fd::{AsFd, OwnedFd},
    path::Path,
};

use aya::{
    Ebpf,
    programs::{CgroupAttachMode, CgroupSock, CgroupSockAddr, ProgramError, links::FdLink},
};
use tracing::info;

use super::{
    LoadError, links,
    loader::{CGROUP2_SUPER_MAGIC, fs_magic},
    pins::{Hook, Pins},
};

/// Refuses a `--cgroup` that is not a cgroup v2 directory; checked before
/// anything is loaded.
pub(super) fn check_cgroup(cgroup_path: &Path) -> Result<(), LoadError> {
    if fs_magic(cgroup_path) == Some(CGROUP2_SUPER_MAGIC) {
        Ok(())
    } else {
        Err(LoadError::NotCgroup2 {
            path: cgroup_path.to_path_buf(),
        })
    }
}

/// Loads the socket programs and puts each on its hook of `cgroup`.
pub(super) fn attach(ebpf: &mut Ebpf, pins: &Pins, cgroup_path: &Path) -> Result<(), LoadError> {
    check_cgroup(cgroup_path)?;
    let cgroup_err = |source| LoadError::Cgroup {
        path: cgroup_path.to_path_buf(),
        source,
    };
    let cgroup = File::open(cgroup_path).map_err(cgroup_err)?;
    let cgroup_id = links::cgroup_id(cgroup_path).map_err(cgroup_err)?;
    for hook in Hook::ALL {
        let name = hook.program();
        let prog_err = |source| LoadError::Program { name, source };
        let prog = ebpf
            .program_mut(name)
            .ok_or(LoadError::MissingProgram { name })?;
        // The release hook is a cgroup sock program; the rest are sock_addr.
        if hook == Hook::SockRelease {
            let prog: &mut CgroupSock = prog.try_into().map_err(prog_err)?;
            prog.load().map_err(prog_err)?;
            install(pins, hook, prog, &cgroup, cgroup_id)?;
        } else {
            let prog: &mut CgroupSockAddr = prog.try_into().map_err(prog_err)?;
            prog.load().map_err(prog_err)?;
            install(pins, hook, prog, &cgroup, cgroup_id)?;
        }
    }
    Ok(())
}

/// What `install` needs of the two cgroup program kinds, whose aya types
/// share the shape but no trait.
trait CgroupProgram {
    fn prog_fd(&self) -> Result<OwnedFd, ProgramError>;
    /// Attaches to `cgroup` and returns the link as an [`FdLink`].
    fn attach_link(&mut self, cgroup: &File) -> Result<FdLink, ProgramError>;
}

fn dup(fd: &aya::programs::ProgramFd) -> Result<OwnedFd, ProgramError> {
    fd.as_fd()
        .try_clone_to_owned()
        .map_err(ProgramError::IOError)
}

// The same two calls on two aya types that have them under the same names
// but share no trait: a macro, since generics cannot name them.
macro_rules! cgroup_program {
    ($($ty:ty),+) => {$(
        impl CgroupProgram for $ty {
            fn prog_fd(&self) -> Result<OwnedFd, ProgramError> {
                dup(self.fd()?)
            }

            fn attach_link(&mut self, cgroup: &File) -> Result<FdLink, ProgramError> {
                let id = self.attach(cgroup, CgroupAttachMode::Single)?;
                let link = self.take_link(id)?;
                FdLink::try_from(link).map_err(|e| ProgramError::IOError(io::Error::other(e)))
            }
        }
    )+};
}

cgroup_program!(CgroupSockAddr, CgroupSock);

/// `--socket-lb=false`: takes the hooks a previous run left pinned off their
/// cgroup, so the setting means what it says after a restart too.
pub(super) fn detach_pinned(pins: &Pins) -> Result<usize, LoadError> {
    let mut n = 0;
    for hook in Hook::ALL {
        for path in [pins.link(hook), pins.staging_link(hook)] {
            if super::netdev::detach_and_unpin(&path).map_err(|source| LoadError::Link {
                hook: hook.pin_name(),
                path: path.clone(),
                source,
            })? {
                info!(
                    hook = hook.pin_name(),
                    "socket load balancing off: detached pinned link"
                );
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Puts `prog` on `hook` of the cgroup. An existing pinned link on the same
/// cgroup gets the new program atomically; otherwise a new link is attached and
/// pinned before any old one is detached.
fn install(
    pins: &Pins,
    hook: Hook,
    prog: &mut impl CgroupProgram,
    cgroup: &File,
    cgroup_id: u64,
) -> Result<(), LoadError> {
    let path = pins.link(hook);
    let link_err = |source: io::Error| LoadError::Link {
        hook: hook.pin_name(),
        path: path.clone(),
        source,
    };
    let prog_err = |source: ProgramError| LoadError::Program {
        name: hook.program(),
        source,
    };
    let prog_fd = prog.prog_fd().map_err(prog_err)?;

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

    let link = prog.attach_link(cgroup).map_err(prog_err)?;
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
