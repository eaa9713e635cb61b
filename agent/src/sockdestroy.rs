//! Destroys connected UDP sockets pinned to removed backends.
//!
//! The socket hooks translate a UDP socket's destination once, at connect():
//! from then on the socket talks to that backend directly and no hook runs
//! again. When the backend goes away (a DNS pod is replaced, say), such a
//! socket would keep sending into the void forever. Cilium and kube-proxy
//! (which flushes conntrack for the same reason) both clean up; Weir destroys
//! the sockets, as Cilium does with `SOCK_DESTROY`: the application reads
//! `ECONNABORTED` once, and its next connect()/sendmsg() goes through the hooks
//! again and reaches a live backend.
//!
//! Only sockets the socket hooks translated are touched: a socket qualifies
//! when `WEIR_REVSOCK` holds `(its cookie, backend address, backend port)`,
//! which the connect/sendmsg hooks wrote when they sent it to that backend,
//! and names as its frontend the one that dropped the backend. Reaping is per
//! (frontend, backend), as kube-proxy clears conntrack per (ClusterIP,
//! endpoint): another Service that still lists the backend keeps its own
//! sockets, not this one's. A socket an application connected to a pod
//! address on its own is none of Weir's business, even if that pod was once
//! a backend.
//!
//! Sockets live in every pod's network namespace, so a dedicated thread enters
//! each namespace it can see (`<proc-root>/*/ns/net`, deduplicated by inode,
//! and the `ip netns` ones under `/run/netns`) and asks that namespace's
//! sock_diag. setns() moves only the calling thread, which is why this is a
//! std thread of its own and not a Tokio task. The thread opens its own
//! namespace once, at start, and returns to it after each walk; if it ever
//! cannot, it stops reaping rather than go on in a pod's namespace.
mod diag;

use std::{
    collections::{BTreeMap, HashSet},
    fs::File,
    io,
    net::{IpAddr, SocketAddr},
    os::{fd::AsRawFd, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::mpsc,
};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
pub use diag::DiagError;
use diag::{Diag, DiagSocket};
use tracing::{debug, error, info, warn};
use weir_abi::{Addr, RevSockKey, RevSockValue};

/// The pinned `WEIR_REVSOCK`: which backend each translated socket was sent to.
pub type RevSock = BpfHashMap<MapData, RevSockKey, RevSockValue>;

/// Opens the pinned `WEIR_REVSOCK` in `maps_dir`.
pub fn open_revsock(maps_dir: &Path) -> Result<RevSock, aya::maps::MapError> {
    let data = MapData::from_pin(maps_dir.join(weir_abi::MAP_REVSOCK))?;
    RevSock::try_from(Map::from_map_data(data)?)
}

/// The `WEIR_REVSOCK` key of a socket `cookie` sent to `backend`.
pub fn revsock_key(cookie: u64, backend: SocketAddr) -> RevSockKey {
    let addr = match backend.ip() {
        IpAddr::V4(v4) => Addr::from_v4(u32::from_ne_bytes(v4.octets())),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => Addr::from_v4(u32::from_ne_bytes(v4.octets())),
            None => {
                let b = v6.octets();
                let w = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                Addr([w(0), w(4), w(8), w(12)])
            }
        },
    };
    RevSockKey {
        cookie,
        addr,
        port: backend.port().to_be(),
        _pad: [0; 6],
    }
}

/// A UDP frontend (as clients address it) and a backend it served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UdpPair {
    pub frontend: SocketAddr,
    pub backend: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    #[error(transparent)]
    Diag(#[from] DiagError),
    #[error("cannot open network namespace {path}")]
    OpenNetns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot enter network namespace {path}")]
    Setns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Hands (frontend, backend) pairs that ended to the reaper thread.
///
/// [`SocketReaper::default`] is inert, which is what unit tests of the
/// controller want.
#[derive(Debug, Default)]
pub struct SocketReaper {
    tx: Option<mpsc::Sender<Vec<UdpPair>>>,
}

impl SocketReaper {
    /// Starts the reaper thread. `revsock` is the pinned `WEIR_REVSOCK`
    /// (only sockets it names are destroyed); `proc_root` is where the
    /// node's processes are listed (`/proc`, or the host's mounted
    /// elsewhere). If the thread cannot be started, sockets are not reaped
    /// (applications see stale backends until they reconnect) but load
    /// balancing is unaffected, so that is a warning, not a failure.
    pub fn spawn(revsock: RevSock, proc_root: PathBuf) -> Self {
        let (tx, rx) = mpsc::channel();
        match std::thread::Builder::new()
            .name("weir-sockdestroy".into())
            .spawn(move || run(&rx, &revsock, &proc_root))
        {
            Ok(_) => Self { tx: Some(tx) },
            Err(e) => {
                warn!(
                    "cannot start the UDP socket reaper: {e}; stale UDP sockets are not destroyed"
                );
                Self::default()
            }
        }
    }

    /// UDP backends a sync just took from these frontends; never blocks.
    pub fn backends_removed(&self, gone: Vec<UdpPair>) {
        if gone.is_empty() {
            return;
        }
        if let Some(tx) = &self.tx
            && tx.send(gone).is_err()
        {
            warn!("the UDP socket reaper thread is gone; stale UDP sockets are not destroyed");
        }
    }
}

fn run(rx: &mpsc::Receiver<Vec<UdpPair>>, revsock: &RevSock, proc_root: &Path) {
    // Opened once: after every walk the thread must get back exactly here.
    let own = match File::open("/proc/thread-self/ns/net") {
        Ok(f) => f,
        Err(e) => {
            error!(
                "cannot open the agent's network namespace: {e}; stale UDP sockets are not destroyed"
            );
            return;
        }
    };
    // The frontend the hooks sent this socket through to `backend`, as the
    // client addressed it.
    let translated = |s: &DiagSocket, backend: SocketAddr| {
        revsock
            .get(&revsock_key(s.cookie(), backend), 0)
            .ok()
            .map(|v| canonical(SocketAddr::new(IpAddr::from(v.addr), u16::from_be(v.port))))
    };
    while let Ok(mut gone) = rx.recv() {
        // Syncs come in bursts; one walk over the namespaces serves them all.
        while let Ok(more) = rx.try_recv() {
            gone.extend(more);
        }
        gone.sort_unstable();
        gone.dedup();
        let counts = reap_everywhere(&gone, proc_root, &translated);
        // SAFETY: setns on a descriptor we own; moves only this thread.
        if unsafe { libc::setns(own.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            error!(
                "cannot return to the agent's network namespace: {}; stale UDP sockets are no longer destroyed",
                io::Error::last_os_error()
            );
            return;
        }
        for p in &gone {
            let n = counts.get(p).copied().unwrap_or(0);
            info!(frontend = %p.frontend, backend = %p.backend, sockets = n, "destroyed connected UDP sockets of a removed backend");
        }
    }
}

/// Destroys the connected UDP sockets of the calling thread's current network
/// namespace whose peer is `addr` (for IPv4 also `::ffff:addr` on IPv6
/// sockets), whether or not the socket hooks translated them. Returns how
/// many it destroyed. For integration tests and tools; the agent itself goes
/// through [`SocketReaper`], which also asks `WEIR_REVSOCK`.
pub fn destroy_udp_sockets_to(addr: SocketAddr) -> Result<usize, ReapError> {
    let any = UdpPair {
        frontend: addr,
        backend: addr,
    };
    let counts = reap_here(&[any], &|_: &DiagSocket, _| Some(canonical(addr)))?;
    Ok(counts.values().sum())
}

/// The frontend through which the socket hooks sent this socket to this
/// backend, in [`canonical`] form; `None` if they did not.
type Translated<'a> = dyn Fn(&DiagSocket, SocketAddr) -> Option<SocketAddr> + 'a;

/// Every namespace, one after the other; a namespace that fails is logged and
/// skipped. Counts per removed backend. Leaves the thread in whatever
/// namespace it visited last: the caller returns it home.
fn reap_everywhere(
    gone: &[UdpPair],
    proc_root: &Path,
    translated: &Translated<'_>,
) -> BTreeMap<UdpPair, usize> {
    let mut counts = BTreeMap::new();
    let mut failed = 0usize;
    for path in namespaces(proc_root) {
        match reap_in(&path, gone, translated) {
            Ok(found) => {
                for (addr, n) in found {
                    *counts.entry(addr).or_insert(0) += n;
                }
            }
            // The process exited since the listing: its namespace may be gone.
            Err(ReapError::OpenNetns { source, .. })
                if source.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                failed += 1;
                debug!(netns = %path.display(), "cannot reap UDP sockets: {e}");
            }
        }
    }
    if failed > 0 {
        warn!(
            namespaces = failed,
            "could not look for stale UDP sockets in some network namespaces (debug logs say why)"
        );
    }
    counts
}

/// Enters `netns` (this thread only) and reaps there.
fn reap_in(
    netns: &Path,
    gone: &[UdpPair],
    translated: &Translated<'_>,
) -> Result<BTreeMap<UdpPair, usize>, ReapError> {
    let f = File::open(netns).map_err(|source| ReapError::OpenNetns {
        path: netns.to_path_buf(),
        source,
    })?;
    // SAFETY: setns on a descriptor we own; moves only this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(ReapError::Setns {
            path: netns.to_path_buf(),
            source: io::Error::last_os_error(),
        });
    }
    reap_here(gone, translated)
}

/// Reaps in the thread's current namespace.
fn reap_here(
    gone: &[UdpPair],
    translated: &Translated<'_>,
) -> Result<BTreeMap<UdpPair, usize>, ReapError> {
    let mut counts = BTreeMap::new();
    let has_v4 = gone.iter().any(|p| p.backend.is_ipv4());
    let mut diag = Diag::open()?;
    let mut families = vec![libc::AF_INET6 as u8];
    if has_v4 {
        families.push(libc::AF_INET as u8);
    }
    for family in families {
        let victims: Vec<(UdpPair, DiagSocket)> = diag
            .connected_udp(family)?
            .into_iter()
            .filter_map(|s| {
                let frontend = translated(&s, s.peer())?;
                matches(gone, frontend, s.peer()).map(|p| (p, s))
            })
            .collect();
        for (pair, sock) in victims {
            if diag.destroy(&sock)? {
                *counts.entry(pair).or_insert(0) += 1;
            }
        }
    }
    Ok(counts)
}

/// The ended pair a socket sent through `frontend` to `peer` belongs to, if
/// any.
fn matches(gone: &[UdpPair], frontend: SocketAddr, peer: SocketAddr) -> Option<UdpPair> {
    let (frontend, peer) = (canonical(frontend), canonical(peer));
    gone.iter()
        .copied()
        .find(|g| canonical(g.backend) == peer && canonical(g.frontend) == frontend)
}

/// An IPv6 socket reports an IPv4 peer as `::ffff:a.b.c.d`; this is the
/// IPv4 form of such an address, and any other address unchanged.
fn canonical(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    }
}

/// Paths of every network namespace visible here, one per namespace: the
/// first process (under `proc_root`) or `ip netns` name found for each
/// `(dev, inode)`.
fn namespaces(proc_root: &Path) -> Vec<PathBuf> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let procs = std::fs::read_dir(proc_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|e| e.path().join("ns/net"));
    let named = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path());
    for path in procs.chain(named) {
        // metadata() follows the magic link to the nsfs inode.
        if let Ok(m) = std::fs::metadata(&path)
            && seen.insert((m.dev(), m.ino()))
        {
            out.push(path);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_socket_matches_by_frontend_and_backend_in_either_form() {
        let gone = [
            UdpPair {
                frontend: sa("10.96.0.10:53"),
                backend: sa("10.0.0.9:53"),
            },
            UdpPair {
                frontend: sa("[fd00:96::10]:53"),
                backend: sa("[fd00::9]:53"),
            },
        ];
        let vip = sa("10.96.0.10:53");
        assert_eq!(
            matches(&gone, vip, sa("[::ffff:10.0.0.9]:53")),
            Some(gone[0])
        );
        assert_eq!(
            matches(&gone, sa("[::ffff:10.96.0.10]:53"), sa("10.0.0.9:53")),
            Some(gone[0])
        );
        assert_eq!(
            matches(&gone, sa("[fd00:96::10]:53"), sa("[fd00::9]:53")),
            Some(gone[1])
        );
        assert_eq!(matches(&gone, vip, sa("10.0.0.9:54")), None);
        assert_eq!(matches(&gone, vip, sa("[fd00::10]:53")), None);
        // The same backend reached through a Service that still has it.
        assert_eq!(matches(&gone, sa("10.96.0.11:53"), sa("10.0.0.9:53")), None);
    }

    #[test]
    fn own_namespace_is_listed_once() {
        let all = namespaces(Path::new("/proc"));
        let own = std::fs::metadata("/proc/self/ns/net").unwrap();
        let hits = all
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .filter(|m| (m.dev(), m.ino()) == (own.dev(), own.ino()))
            .count();
        assert_eq!(hits, 1);
    }

    #[test]
    fn revsock_keys_use_the_abi_layout() {
        let k = revsock_key(7, "10.0.0.9:53".parse().unwrap());
        assert_eq!(k.cookie, 7);
        assert_eq!(k.addr, Addr::from_v4(u32::from_ne_bytes([10, 0, 0, 9])));
        assert_eq!(k.port, 53u16.to_be());
        // An IPv6 socket's mapped peer is the same backend.
        assert_eq!(revsock_key(7, "[::ffff:10.0.0.9]:53".parse().unwrap()), k);
        let v6 = revsock_key(1, "[fd00::9]:53".parse().unwrap());
        let mut bytes = [0u8; 16];
        for (i, w) in v6.addr.0.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        assert_eq!(
            bytes,
            "fd00::9".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
    }

    #[test]
    fn inert_reaper_ignores_everything() {
        SocketReaper::default().backends_removed(vec![UdpPair {
            frontend: sa("10.96.0.10:53"),
            backend: sa("10.0.0.1:53"),
        }]);
    }
}
