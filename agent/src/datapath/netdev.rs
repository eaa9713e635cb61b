//! The per-packet programs on the `--devices` interfaces: `weir_tc_ingress`
//! on tcx ingress of every device, and `weir_xdp` (driver mode) when
//! `--acceleration` asks for it, on the `--acceleration-devices` among them.
//! Which devices those are, over time, is [`super::devices`]' business.
//!
//! Every attachment is a bpf link pinned under `<bpffs>/links`, so that a
//! restarted agent swaps the program in place (`BPF_LINK_UPDATE`: no packet
//! sees a device without a program), and so that links of devices no longer
//! listed can be found and detached.
use std::{
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::Path,
};

use aya::{
    Ebpf,
    programs::{
        LinkOrder, Program, ProgramError, ProgramFd, SchedClassifier, TcAttachType, Xdp,
        links::FdLink, tc::TcAttachOptions,
    },
};
use aya_obj::generated::bpf_attach_type;
use tracing::info;

use super::{
    LoadError, links,
    links::LinkTarget,
    pins::{DevLink, Pins, dev_pin_name},
};

/// `--acceleration`: whether NodePort traffic is translated in XDP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Acceleration {
    /// TC only; pinned XDP links of earlier runs are detached.
    #[default]
    Disabled,
    /// XDP in driver mode on every device, or the agent does not start.
    Native,
    /// XDP in driver mode where the driver supports it, TC elsewhere.
    BestEffort,
}

/// Attaches (or takes over) `weir_tc_ingress` on `dev`, loading the program
/// the first time.
pub(super) fn attach_tc_one(
    ebpf: &mut Ebpf,
    pins: &Pins,
    dev: &str,
    ifindex: u32,
) -> Result<(), LoadError> {
    let kind = DevLink::Tc;
    let name = kind.program();
    let (prog, prog_fd) = loaded(ebpf, name, SchedClassifier::load, SchedClassifier::fd)?;
    install(pins, kind, dev, prog_fd.as_fd(), ifindex, |staging| {
        let attach_err = |source: ProgramError| LoadError::TcAttach {
            device: dev.to_owned(),
            source,
        };
        let id = prog
            .attach_with_options(
                dev,
                TcAttachType::Ingress,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(attach_err)?;
        let link = FdLink::try_from(prog.take_link(id).map_err(attach_err)?)
            .map_err(|e| dev_err(kind, dev, io::Error::other(e)))?;
        link.pin(staging)
            .map_err(|e| dev_err(kind, dev, io::Error::other(e)))?;
        Ok(())
    })
}

/// Attaches (or takes over) `weir_xdp` in driver mode on `dev`, loading the
/// program the first time.
pub(super) fn attach_xdp_one(
    ebpf: &mut Ebpf,
    pins: &Pins,
    dev: &str,
    ifindex: u32,
) -> Result<(), LoadError> {
    let kind = DevLink::Xdp;
    let name = kind.program();
    let (_, prog_fd) = loaded(ebpf, name, Xdp::load, Xdp::fd)?;
    install(pins, kind, dev, prog_fd.as_fd(), ifindex, |staging| {
        // Not aya's Xdp::attach: on EINVAL it falls back to a netlink
        // attachment, which cannot be pinned and so would outlive this
        // agent unmanaged.
        let link = links::xdp_link_create(prog_fd.as_fd(), ifindex, links::XDP_FLAGS_DRV_MODE)
            .map_err(|e| dev_err(kind, dev, e))?;
        links::pin(link.as_fd(), staging).map_err(|e| dev_err(kind, dev, e))
    })
}

/// Puts a device link in place: the pinned link of an earlier run on the same
/// device gets the new program atomically; otherwise `create` attaches a new
/// link and pins it at the staging path, the old one (whose device was
/// recreated or which is of another type) is detached, and the new pin is
/// renamed over the old.
fn install(
    pins: &Pins,
    kind: DevLink,
    dev: &str,
    prog: BorrowedFd<'_>,
    ifindex: u32,
    create: impl FnOnce(&Path) -> Result<(), LoadError>,
) -> Result<(), LoadError> {
    let path = pins.dev_link(kind, dev);
    let old = match links::open_pinned(&path) {
        Ok(fd) => Some(fd),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(dev_err(kind, dev, e)),
    };
    if let Some(old) = &old {
        let target = links::link_target(old.as_fd()).map_err(|e| dev_err(kind, dev, e))?;
        let same = match (kind, target) {
            (
                DevLink::Tc,
                LinkTarget::Tcx {
                    ifindex: i,
                    attach_type,
                },
            ) => i == ifindex && attach_type == bpf_attach_type::BPF_TCX_INGRESS as u32,
            (DevLink::Xdp, LinkTarget::Xdp { ifindex: i }) => i == ifindex,
            _ => false,
        };
        if same {
            links::update_program(old.as_fd(), prog).map_err(|e| dev_err(kind, dev, e))?;
            info!(
                device = dev,
                link = dev_pin_name(kind, dev),
                "took over pinned link"
            );
            return Ok(());
        }
        if kind == DevLink::Xdp {
            // A device has one XDP slot: the old link must go first (it is
            // defunct anyway when its device was recreated).
            let _ = links::detach(old.as_fd());
        }
    }
    let staging = pins.staging_dev_link(kind, dev);
    let _ = std::fs::remove_file(&staging);
    create(&staging)?;
    if let Some(old) = old {
        let _ = links::detach(old.as_fd());
    }
    std::fs::rename(&staging, &path).map_err(|e| dev_err(kind, dev, e))?;
    info!(
        device = dev,
        link = dev_pin_name(kind, dev),
        "attached and pinned link"
    );
    Ok(())
}

/// Detaches and unpins every `kind` link whose device is not in `keep`
/// (and any staging leftover of a crashed run).
pub(super) fn prune(pins: &Pins, kind: DevLink, keep: &[String]) -> Result<(), LoadError> {
    let keep: Vec<String> = keep.iter().map(|d| dev_pin_name(kind, d)).collect();
    let Ok(entries) = std::fs::read_dir(pins.links()) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let bare = name.strip_prefix("new-").unwrap_or(&name);
        if !bare.starts_with(kind.prefix()) || (bare.len() == name.len() && keep.contains(&name)) {
            continue;
        }
        let path = entry.path();
        if detach_and_unpin(&path).map_err(|e| dev_err(kind, bare, e))? {
            info!(link = %name, "detached link of a device no longer configured");
        }
    }
    Ok(())
}

/// Detaches the link pinned at `path` (if any) and removes the pin.
/// `Ok(false)` when nothing was pinned there.
pub(super) fn detach_and_unpin(path: &Path) -> io::Result<bool> {
    match links::open_pinned(path) {
        Ok(fd) => {
            // A defunct link (its device or cgroup is gone) cannot be
            // detached and needs no detaching.
            let _ = links::detach(fd.as_fd());
            std::fs::remove_file(path)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Program `name` as its type `P`, loaded into the kernel the first time it
/// is asked for (one load serves every device), and a copy of its fd.
fn loaded<'e, P>(
    ebpf: &'e mut Ebpf,
    name: &'static str,
    load: impl FnOnce(&mut P) -> Result<(), ProgramError>,
    fd: impl Fn(&P) -> Result<&ProgramFd, ProgramError>,
) -> Result<(&'e mut P, OwnedFd), LoadError>
where
    &'e mut P: TryFrom<&'e mut Program, Error = ProgramError>,
{
    let err = |source| LoadError::Program { name, source };
    let prog: &mut P = ebpf
        .program_mut(name)
        .ok_or(LoadError::MissingProgram { name })?
        .try_into()
        .map_err(err)?;
    if fd(prog).is_err() {
        load(prog).map_err(err)?;
    }
    let owned = fd(prog)
        .map_err(err)?
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| err(ProgramError::IOError(e)))?;
    Ok((prog, owned))
}

fn dev_err(kind: DevLink, dev: &str, source: io::Error) -> LoadError {
    LoadError::DevLink {
        link: dev_pin_name(kind, dev),
        device: dev.to_owned(),
        source,
    }
}

/// An error with its causes, on one line, for a warning.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
