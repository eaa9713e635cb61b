//! Waking a scan when the kernel announces a change in the agent's network
//! namespace: rtnetlink multicast groups (links, routes, addresses).
//!
//! A pod's first packets leave through its veth right after the CNI plugin
//! creates it; with `--socket-lb=false` those packets are only translated once
//! the veth has `weir_tc_ingress`, and a NodePort only answers on an address
//! once a frontend exists there, so polling alone would leave new pods and
//! addresses unserved for seconds. The messages themselves are not parsed:
//! any of them means "read the state again", which is also what a lost or
//! overflowed notification needs. Callers keep a slow backstop period.
use std::{
    io,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use humantime::format_duration;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tracing::{info, warn};

/// A burst (a veth pair being created, renamed, moved and set up) settles
/// into one scan: wait until the socket has been quiet this long...
const QUIET: Duration = Duration::from_millis(50);
/// ...but never longer than this after the first message.
const MAX_DELAY: Duration = Duration::from_millis(500);

/// Runs `scan` on a thread named `thread`: at once (a change may have come
/// between the caller's own first read and the subscription), then after
/// every change announced on `groups` (`libc::RTMGRP_*` bits), at the latest
/// every `backstop`. Without notifications (no subscription, or it broke) it
/// runs every `fallback` instead, and says so. `scan` returning false ends
/// the thread. `what` names what is re-read, for the logs.
pub fn spawn_rescans(
    thread: &str,
    what: &'static str,
    groups: libc::c_int,
    backstop: Duration,
    fallback: Duration,
    mut scan: impl FnMut() -> bool + Send + 'static,
) -> io::Result<()> {
    let mut changes = match Changes::subscribe(groups) {
        Ok(c) => {
            info!(
                backstop = %format_duration(backstop),
                "re-reading {what} on every change the kernel announces"
            );
            Some(c)
        }
        Err(e) => {
            warn!(
                "cannot subscribe to changes of {what} ({e}); re-reading them every {}",
                format_duration(fallback)
            );
            None
        }
    };
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || {
            while scan() {
                match changes.as_mut().map(|c| c.wait(backstop)) {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        warn!(
                            "change notifications for {what} failed ({e}); re-reading them every {}",
                            format_duration(fallback)
                        );
                        changes = None;
                    }
                    None => std::thread::sleep(fallback),
                }
            }
        })
        .map(drop)
}

/// A netlink socket subscribed to some rtnetlink multicast groups.
struct Changes {
    sock: Socket,
    buf: Vec<u8>,
}

impl Changes {
    /// Subscribes to `groups` (`libc::RTMGRP_*` bits).
    fn subscribe(groups: libc::c_int) -> io::Result<Self> {
        let groups = u32::try_from(groups).map_err(|_| io::ErrorKind::InvalidInput)?;
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind(&SocketAddr::new(0, groups))?;
        sock.set_non_blocking(true)?;
        Ok(Self {
            sock,
            buf: vec![0; 64 * 1024],
        })
    }

    /// Waits up to `timeout` for a change and then for its burst to settle.
    /// `Ok(true)`: something changed (or notifications were lost), scan now;
    /// `Ok(false)`: the timeout passed quietly.
    fn wait(&mut self, timeout: Duration) -> io::Result<bool> {
        if !self.readable(timeout)? {
            return Ok(false);
        }
        let first = Instant::now();
        loop {
            self.drain()?;
            let left = MAX_DELAY.saturating_sub(first.elapsed());
            if left.is_zero() || !self.readable(QUIET.min(left))? {
                return Ok(true);
            }
        }
    }

    /// Reads every queued message. An overflow (`ENOBUFS`) only means some
    /// were dropped, which the scan that follows makes up for.
    fn drain(&mut self) -> io::Result<()> {
        loop {
            let mut b: &mut [u8] = &mut self.buf;
            match self.sock.recv(&mut b, 0) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn readable(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd for the duration of the call.
        match unsafe { libc::poll(&mut pfd, 1, ms) } {
            n if n > 0 => Ok(true),
            0 => Ok(false),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(true)
                } else {
                    Err(e)
                }
            }
        }
    }
}
