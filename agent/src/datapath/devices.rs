//! Which interfaces get the per-packet programs, and keeping that true as
//! interfaces come and go.
//!
//! `--devices` entries are exact names (`eth0`) or prefixes ending in `+`
//! (`lxc+`, `cali+`, as Cilium and Calico write them) that match every
//! interface whose name starts with the rest. Pod veths appear and vanish all
//! the time, and a listed device may be missing at start (a bond still being
//! built) or recreated later (new ifindex, the old link defunct), so the
//! interfaces are listed again whenever the kernel announces a link change
//! ([`crate::link_changes`]), and at the latest every backstop period: new
//! matches get `weir_tc_ingress` (and `weir_xdp` where
//! `--acceleration-devices` says), vanished ones lose their pinned links.
//!
//! `auto` (the chart's default) matches, at every listing, each interface
//! that carries a default route (IPv4 or IPv6, in any routing table: policy
//! routing and VRFs keep theirs outside `main`) in the agent's network
//! namespace, where NodePort and LoadBalancer traffic from outside arrives,
//! and each veth (link kind `veth`): the host side of pods, where the replies
//! of translated flows arrive. Both come from rtnetlink dumps ([`rtnl`]). In `--acceleration-devices` (and its default)
//! `auto` means the default-route devices only, never veths.
//!
//! Only Ethernet devices (`ARPHRD_ETHER`) qualify: the programs parse an
//! Ethernet header first, so on a tunnel or `lo` they would misread every
//! packet.
mod rtnl;

use std::{
    collections::{BTreeMap, HashSet},
    io,
    time::Duration,
};

use aya::Ebpf;
use tracing::{info, warn};

use super::{
    LoadError,
    netdev::{self, Acceleration},
    pins::{DevLink, Pins, dev_pin_name},
};
use crate::link_changes;

/// How often the interfaces are listed when link change notifications are
/// unavailable (with them, `--device-rescan-interval` is the backstop).
const RESCAN_UNWATCHED: Duration = Duration::from_secs(5);

/// `ARPHRD_ETHER`.
const ARPHRD_ETHER: u16 = 1;

/// One `--devices` / `--acceleration-devices` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    Exact(String),
    Prefix(String),
    /// `auto`: default-route devices and veths (see the module docs).
    Auto,
}

impl Pattern {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "auto" {
            Ok(Self::Auto)
        } else if let Some(p) = s.strip_suffix('+') {
            if p.is_empty() {
                return Err("\"+\" alone would match every interface; give a prefix".into());
            }
            Ok(Self::Prefix(p.to_owned()))
        } else if s.is_empty() {
            Err("empty device name".into())
        } else {
            Ok(Self::Exact(s.to_owned()))
        }
    }

    /// Whether `link` matches; `accel` (an `--acceleration-devices` entry)
    /// narrows `auto` to the default-route devices.
    pub fn matches(&self, link: &Link, accel: bool) -> bool {
        match self {
            Self::Exact(n) => *n == link.name,
            Self::Prefix(p) => link.name.starts_with(p.as_str()),
            Self::Auto => link.name != "lo" && (link.default_route || (!accel && link.veth)),
        }
    }
}

/// Parses a list of patterns, naming the bad entry.
pub fn parse_patterns(list: &[String], flag: &str) -> Result<Vec<Pattern>, String> {
    list.iter()
        .map(|s| Pattern::parse(s).map_err(|e| format!("{flag} {s:?}: {e}")))
        .collect()
}

pub fn any_match(patterns: &[Pattern], link: &Link, accel: bool) -> bool {
    patterns.iter().any(|p| p.matches(link, accel))
}

/// An interface of this network namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub ifindex: u32,
    /// `ARPHRD_*` (`dev->type`), `None` if it could not be read.
    pub kind: Option<u16>,
    /// Carries a default route (IPv4 or IPv6) in this namespace.
    pub default_route: bool,
    /// Its driver is `veth`.
    pub veth: bool,
}

/// Every interface of the calling thread's network namespace, from an
/// rtnetlink dump (the kernel's own view, not a sysfs mount that may belong
/// to another namespace).
pub fn list_links() -> io::Result<Vec<Link>> {
    // Only `auto` needs the routes; an unreadable route table must not stop
    // the explicit devices from being attached.
    let routes = rtnl::default_route_ifindexes().unwrap_or_else(|e| {
        tracing::warn!("cannot read the default routes for --devices=auto: {e}");
        Default::default()
    });
    Ok(rtnl::links()?
        .into_iter()
        .map(|l| Link {
            kind: Some(l.link_type),
            default_route: routes.contains(&l.ifindex) && l.name != "lo",
            veth: l.kind.as_deref() == Some("veth"),
            name: l.name,
            ifindex: l.ifindex,
        })
        .collect())
}

/// Whether `dev` still exists with `ifindex`.
fn still_there(dev: &str, ifindex: u32) -> bool {
    let Ok(c) = std::ffi::CString::new(dev) else {
        return false;
    };
    // SAFETY: NUL-terminated string that outlives the call.
    unsafe { libc::if_nametoindex(c.as_ptr()) == ifindex }
}

/// What one listing decides.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Devices that get `weir_tc_ingress`: matching Ethernet links, by name.
    pub tc: BTreeMap<String, u32>,
    /// Matching links that are not Ethernet: refused.
    pub refused: Vec<(String, Option<u16>)>,
    /// Exact `--devices` names with no interface.
    pub missing: Vec<String>,
}

/// Pure: which of `links` the per-packet programs go on.
pub fn plan(patterns: &[Pattern], links: &[Link]) -> Plan {
    let mut p = Plan::default();
    for l in links {
        if !any_match(patterns, l, false) {
            continue;
        }
        if l.kind == Some(ARPHRD_ETHER) {
            p.tc.insert(l.name.clone(), l.ifindex);
        } else {
            p.refused.push((l.name.clone(), l.kind));
        }
    }
    for pat in patterns {
        if let Pattern::Exact(n) = pat
            && !links.iter().any(|l| &l.name == n)
        {
            p.missing.push(n.clone());
        }
    }
    p
}

/// The loaded programs and what they are attached to; [`Self::rescan`]
/// brings the attachments in line with the interfaces present now.
pub struct Devices {
    ebpf: Ebpf,
    pins: Pins,
    devices: Vec<Pattern>,
    accel_devices: Vec<Pattern>,
    acceleration: Acceleration,
    /// Device → ifindex the link was put on.
    tc: BTreeMap<String, u32>,
    xdp: BTreeMap<String, u32>,
    /// Things already warned about, `(device, ifindex, what)`, so a scan
    /// every few seconds does not repeat itself.
    warned: HashSet<(String, u32, &'static str)>,
}

impl Devices {
    pub(super) fn new(
        ebpf: Ebpf,
        pins: Pins,
        devices: Vec<Pattern>,
        accel_devices: Vec<Pattern>,
        acceleration: Acceleration,
    ) -> Self {
        Self {
            ebpf,
            pins,
            devices,
            accel_devices,
            acceleration,
            tc: BTreeMap::new(),
            xdp: BTreeMap::new(),
            warned: HashSet::new(),
        }
    }

    /// The first scan, at start: attach failures (and a driver without XDP
    /// under `--acceleration=native`) are errors. Later scans only warn.
    pub(super) fn initial(&mut self) -> Result<(), LoadError> {
        self.scan(true)
    }

    /// Lists the interfaces again and attaches/detaches accordingly.
    pub fn rescan(&mut self) {
        if let Err(e) = self.scan(false) {
            warn!("device scan failed: {}", netdev::chain(&e));
        }
    }

    /// Devices that currently have `weir_tc_ingress`.
    pub fn attached(&self) -> Vec<String> {
        self.tc.keys().cloned().collect()
    }

    /// Rescans on a thread of its own, forever: on every announced link (or,
    /// for `auto`, route) change, and at the latest every `backstop`.
    pub fn spawn(mut self, backstop: Duration) -> io::Result<()> {
        // Only `auto` depends on routes.
        let mut groups = libc::RTMGRP_LINK;
        if self.devices.contains(&Pattern::Auto) {
            groups |= libc::RTMGRP_IPV4_ROUTE | libc::RTMGRP_IPV6_ROUTE;
        }
        link_changes::spawn_rescans(
            "weir-devices",
            "devices",
            groups,
            backstop,
            RESCAN_UNWATCHED.min(backstop),
            move || {
                self.rescan();
                true
            },
        )
    }

    fn warn_once(&mut self, dev: &str, ifindex: u32, what: &'static str) -> bool {
        self.warned.insert((dev.to_owned(), ifindex, what))
    }

    fn scan(&mut self, strict: bool) -> Result<(), LoadError> {
        let links = list_links().map_err(|source| LoadError::DevLink {
            link: "*".into(),
            device: "*".into(),
            source,
        })?;
        let plan = plan(&self.devices, &links);
        for (dev, kind) in &plan.refused {
            if self.warn_once(dev, 0, "not-ether") {
                warn!(
                    device = %dev,
                    "device {dev} matches --devices but is not an Ethernet device (type {}); the packet programs parse Ethernet frames, skipping it",
                    kind.map_or_else(|| "unknown".to_owned(), |k| k.to_string())
                );
            }
        }
        for dev in &plan.missing {
            if self.warn_once(dev, 0, "missing") {
                warn!(device = %dev, "device {dev} (from --devices) does not exist; attaching when it appears");
            }
        }
        // Devices that reappeared may be warned about again later.
        self.warned
            .retain(|(d, _, what)| *what != "missing" || plan.missing.contains(d));

        let mut tc_now = BTreeMap::new();
        for (dev, &ifindex) in &plan.tc {
            if self.tc.get(dev) == Some(&ifindex) {
                tc_now.insert(dev.clone(), ifindex);
                continue;
            }
            match netdev::attach_tc_one(&mut self.ebpf, &self.pins, dev, ifindex) {
                Ok(()) => {
                    tc_now.insert(dev.clone(), ifindex);
                }
                // Vanished while being attached (a pod going away): the next
                // scan prunes whatever is left.
                Err(_) if !still_there(dev, ifindex) => {}
                Err(e) if strict => return Err(e),
                Err(e) => {
                    if self.warn_once(dev, ifindex, "tc") {
                        warn!(device = %dev, "cannot attach weir_tc_ingress to {dev}: {}; retrying", netdev::chain(&e));
                    }
                }
            }
        }
        // XDP only where TC is: the XDP program leaves SNAT flows to TC on the
        // same device.
        let mut xdp_now = BTreeMap::new();
        if self.acceleration != Acceleration::Disabled {
            for (dev, &ifindex) in &tc_now {
                let accel = links
                    .iter()
                    .any(|l| l.name == *dev && any_match(&self.accel_devices, l, true));
                if !accel {
                    continue;
                }
                if self.xdp.get(dev) == Some(&ifindex) {
                    xdp_now.insert(dev.clone(), ifindex);
                    continue;
                }
                match netdev::attach_xdp_one(&mut self.ebpf, &self.pins, dev, ifindex) {
                    Ok(()) => {
                        xdp_now.insert(dev.clone(), ifindex);
                    }
                    Err(_) if !still_there(dev, ifindex) => {}
                    Err(e) if strict && self.acceleration == Acceleration::Native => {
                        return Err(e);
                    }
                    Err(e) => {
                        if self.warn_once(dev, ifindex, "xdp") {
                            warn!(
                                device = %dev,
                                "XDP acceleration unavailable on {dev}: {}; NodePort traffic there is handled by TC",
                                netdev::chain(&e)
                            );
                        }
                    }
                }
            }
        }
        for (kind, now, before) in [
            (DevLink::Tc, &tc_now, &self.tc),
            (DevLink::Xdp, &xdp_now, &self.xdp),
        ] {
            for gone in before.keys().filter(|d| !now.contains_key(*d)) {
                info!(device = %gone, link = %dev_pin_name(kind, gone), "device gone or no longer matching; detaching");
            }
            let keep: Vec<String> = now.keys().cloned().collect();
            netdev::prune(&self.pins, kind, &keep)?;
        }
        if strict || tc_now != self.tc {
            info!(devices = ?tc_now.keys().collect::<Vec<_>>(), xdp = ?xdp_now.keys().collect::<Vec<_>>(), "per-packet programs attached");
        }
        self.tc = tc_now;
        self.xdp = xdp_now;
        // Forget per-ifindex warnings of devices that are gone.
        let present: HashSet<(&str, u32)> =
            links.iter().map(|l| (l.name.as_str(), l.ifindex)).collect();
        self.warned
            .retain(|(d, i, _)| *i == 0 || present.contains(&(d.as_str(), *i)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, ifindex: u32, kind: u16) -> Link {
        Link {
            name: name.into(),
            ifindex,
            kind: Some(kind),
            default_route: false,
            veth: false,
        }
    }

    #[test]
    fn patterns_parse_and_match() {
        let m = |p: &Pattern, n: &str| p.matches(&link(n, 2, 1), false);
        let p = Pattern::parse("lxc+").unwrap();
        assert!(m(&p, "lxc12ab") && m(&p, "lxc") && !m(&p, "eth0"));
        let e = Pattern::parse("eth0").unwrap();
        assert!(m(&e, "eth0") && !m(&e, "eth0.100") && !m(&e, "eth"));
        assert_eq!(Pattern::parse(" auto").unwrap(), Pattern::Auto);
        assert_eq!(
            Pattern::parse("auto+").unwrap(),
            Pattern::Prefix("auto".into())
        );
        assert!(Pattern::parse("+").is_err());
        assert!(Pattern::parse("").is_err());
        let err = parse_patterns(&["eth0".into(), "+".into()], "--devices").unwrap_err();
        assert!(err.contains("--devices") && err.contains("\"+\""), "{err}");
    }

    #[test]
    fn plan_picks_ethernet_matches_and_names_the_rest() {
        let pats = parse_patterns(
            &["eth0".into(), "cali+".into(), "bond0".into(), "tun+".into()],
            "--devices",
        )
        .unwrap();
        let links = [
            link("lo", 1, 772),
            link("eth0", 2, 1),
            link("cali1", 7, 1),
            link("cali2", 8, 1),
            link("eth1", 3, 1),
            link("tun0", 9, 65534),
        ];
        let p = plan(&pats, &links);
        assert_eq!(
            p.tc.into_iter().collect::<Vec<_>>(),
            [
                ("cali1".to_owned(), 7),
                ("cali2".to_owned(), 8),
                ("eth0".to_owned(), 2)
            ]
        );
        assert_eq!(p.refused, [("tun0".to_owned(), Some(65534))]);
        assert_eq!(p.missing, ["bond0"]);
    }

    #[test]
    fn auto_takes_default_route_devices_and_veths_but_accelerates_only_the_former() {
        let mut eth0 = link("eth0", 2, 1);
        eth0.default_route = true;
        let mut wg0 = link("wg0", 3, 65534);
        wg0.default_route = true;
        let mut lxc1 = link("lxc1", 7, 1);
        lxc1.veth = true;
        let mut lo = link("lo", 1, 772);
        lo.default_route = true;
        lo.veth = true;
        let links = [lo, eth0, link("eth1", 4, 1), wg0, lxc1, link("br0", 5, 1)];
        let auto = [Pattern::Auto];
        let p = plan(&auto, &links);
        assert_eq!(
            p.tc.into_iter().collect::<Vec<_>>(),
            [("eth0".to_owned(), 2), ("lxc1".to_owned(), 7)]
        );
        // Non-Ethernet default-route devices are refused (and named) as before.
        assert_eq!(p.refused, [("wg0".to_owned(), Some(65534))]);
        assert!(p.missing.is_empty());
        let accel: Vec<&str> = links
            .iter()
            .filter(|l| any_match(&auto, l, true))
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(accel, ["eth0", "wg0"]);
        // auto next to explicit entries.
        let pats = parse_patterns(&["auto".into(), "br0".into()], "--devices").unwrap();
        assert_eq!(
            plan(&pats, &links).tc.keys().collect::<Vec<_>>(),
            ["br0", "eth0", "lxc1"]
        );
    }

    #[test]
    fn loopback_is_listed_and_not_ethernet() {
        let links = list_links().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").unwrap();
        assert_eq!(lo.ifindex, 1);
        assert_ne!(lo.kind, Some(ARPHRD_ETHER));
    }
}
