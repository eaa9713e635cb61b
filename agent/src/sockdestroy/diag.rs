//! A minimal NETLINK_SOCK_DIAG client: dump connected UDP sockets and destroy
//! some of them (`SOCK_DESTROY`, the interface Android's netd and Cilium use).
//!
//! Hand-written on libc because the maintained netlink crates do not speak
//! `SOCK_DESTROY`, and the two messages involved are small fixed structs
//! (`include/uapi/linux/inet_diag.h`). A netlink socket belongs to the network
//! namespace of the thread that creates it, so callers create one per
//! namespace after `setns()`.
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

/// `SOCK_DIAG_BY_FAMILY` (`linux/sock_diag.h`).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `SOCK_DESTROY` (`linux/sock_diag.h`).
const SOCK_DESTROY: u16 = 21;
/// `TCP_ESTABLISHED`: the state a UDP socket is in once connect()ed, so the
/// dump skips every unconnected socket in the kernel already.
const TCP_ESTABLISHED: u32 = 1;

const NLMSG_HDRLEN: usize = 16;
/// `struct inet_diag_sockid`.
const SOCKID_LEN: usize = 48;
/// `struct inet_diag_req_v2`.
const REQ_LEN: usize = 8 + SOCKID_LEN;
/// `struct inet_diag_msg` up to and including `idiag_inode`.
const MSG_LEN: usize = 4 + SOCKID_LEN + 20;

#[derive(Debug, thiserror::Error)]
pub enum DiagError {
    #[error("cannot open a NETLINK_SOCK_DIAG socket")]
    Socket(#[source] io::Error),
    #[error("sock_diag {op} failed")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("sock_diag {op}: the kernel answered {errno}")]
    Kernel { op: &'static str, errno: io::Error },
    #[error("sock_diag {op}: malformed reply ({what})")]
    Malformed {
        op: &'static str,
        what: &'static str,
    },
}

/// A socket as the dump reports it: the exact id `SOCK_DESTROY` wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiagSocket {
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// `struct inet_diag_sockid`, verbatim (ports and addresses in network
    /// order, interface and cookie in host order).
    pub id: [u8; SOCKID_LEN],
}

impl DiagSocket {
    /// The connected peer. IPv6 sockets that talk to an IPv4 peer report it
    /// as `::ffff:a.b.c.d`; that stays a v6 address here.
    pub fn peer(&self) -> SocketAddr {
        let port = u16::from_be_bytes([self.id[2], self.id[3]]);
        let dst: [u8; 16] = self.id[20..36].try_into().unwrap_or([0; 16]);
        let ip = if i32::from(self.family) == libc::AF_INET {
            IpAddr::V4(Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]))
        } else {
            IpAddr::V6(Ipv6Addr::from(dst))
        };
        SocketAddr::new(ip, port)
    }

    /// `idiag_cookie`: the socket's cookie, the value
    /// `bpf_get_socket_cookie()` returns for it (two host-order `u32`s,
    /// low word first).
    pub fn cookie(&self) -> u64 {
        let w = |i: usize| {
            u64::from(u32::from_ne_bytes([
                self.id[i],
                self.id[i + 1],
                self.id[i + 2],
                self.id[i + 3],
            ]))
        };
        w(40) | (w(44) << 32)
    }
}

/// One NETLINK_SOCK_DIAG socket in the caller's current network namespace.
pub struct Diag {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Diag {
    pub fn open() -> Result<Self, DiagError> {
        // SAFETY: plain socket(2) call; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(DiagError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: socket(2) returned a new descriptor that nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self {
            fd,
            seq: 0,
            // Dump replies come in datagrams of up to 32 KiB.
            buf: vec![0; 64 * 1024],
        })
    }

    /// Every connected UDP socket of `family` (`AF_INET` or `AF_INET6`).
    pub fn connected_udp(&mut self, family: u8) -> Result<Vec<DiagSocket>, DiagError> {
        const OP: &str = "dump";
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
        let seq = self.send(
            SOCK_DIAG_BY_FAMILY,
            flags,
            family,
            1 << TCP_ESTABLISHED,
            &[0; SOCKID_LEN],
            OP,
        )?;
        let mut out = Vec::new();
        loop {
            let n = self.recv(OP)?;
            for msg in messages(&self.buf[..n]) {
                let (ty, msg_seq, payload) =
                    msg.map_err(|what| DiagError::Malformed { op: OP, what })?;
                if msg_seq != seq {
                    continue;
                }
                match i32::from(ty) {
                    libc::NLMSG_DONE => return Ok(out),
                    libc::NLMSG_ERROR => {
                        let errno = error_code(payload).ok_or(DiagError::Malformed {
                            op: OP,
                            what: "short error message",
                        })?;
                        return Err(DiagError::Kernel {
                            op: OP,
                            errno: io::Error::from_raw_os_error(errno),
                        });
                    }
                    _ if ty == SOCK_DIAG_BY_FAMILY => {
                        out.push(parse_msg(payload).ok_or(DiagError::Malformed {
                            op: OP,
                            what: "short inet_diag_msg",
                        })?);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Destroys one socket: it reports `ECONNABORTED` once and is disconnected.
    /// `Ok(false)` when it was gone already.
    pub fn destroy(&mut self, sock: &DiagSocket) -> Result<bool, DiagError> {
        const OP: &str = "destroy";
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
        let seq = self.send(SOCK_DESTROY, flags, sock.family, u32::MAX, &sock.id, OP)?;
        loop {
            let n = self.recv(OP)?;
            for msg in messages(&self.buf[..n]) {
                let (ty, msg_seq, payload) =
                    msg.map_err(|what| DiagError::Malformed { op: OP, what })?;
                if msg_seq != seq || i32::from(ty) != libc::NLMSG_ERROR {
                    continue;
                }
                return match error_code(payload) {
                    Some(0) => Ok(true),
                    // Closed (or reconnected: the cookie no longer matches)
                    // between the dump and now; nothing left to do.
                    Some(libc::ENOENT) => Ok(false),
                    Some(errno) => Err(DiagError::Kernel {
                        op: OP,
                        errno: io::Error::from_raw_os_error(errno),
                    }),
                    None => Err(DiagError::Malformed {
                        op: OP,
                        what: "short error message",
                    }),
                };
            }
        }
    }

    fn send(
        &mut self,
        ty: u16,
        flags: u16,
        family: u8,
        states: u32,
        id: &[u8; SOCKID_LEN],
        op: &'static str,
    ) -> Result<u32, DiagError> {
        self.seq = self.seq.wrapping_add(1);
        let req = request(ty, flags, self.seq, family, states, id);
        // SAFETY: the buffer is valid for its length; the kernel is the
        // default destination of a netlink socket.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if n < 0 {
            return Err(DiagError::Io {
                op,
                source: io::Error::last_os_error(),
            });
        }
        Ok(self.seq)
    }

    fn recv(&mut self, op: &'static str) -> Result<usize, DiagError> {
        loop {
            // SAFETY: the buffer is valid and writable for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    0,
                )
            };
            if n >= 0 {
                return Ok(n.cast_unsigned());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(DiagError::Io { op, source: e });
            }
        }
    }
}

/// `nlmsghdr` + `inet_diag_req_v2` for UDP.
fn request(
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    states: u32,
    id: &[u8; SOCKID_LEN],
) -> Vec<u8> {
    let len = NLMSG_HDRLEN + REQ_LEN;
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    b.extend_from_slice(&ty.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel
    // sdiag_family, sdiag_protocol, idiag_ext, pad
    b.extend_from_slice(&[family, libc::IPPROTO_UDP as u8, 0, 0]);
    b.extend_from_slice(&states.to_ne_bytes());
    b.extend_from_slice(id);
    b
}

/// Splits a datagram into `(type, seq, payload)` messages.
fn messages(mut buf: &[u8]) -> impl Iterator<Item = Result<(u16, u32, &[u8]), &'static str>> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            buf = &[];
            return Some(Err("bad nlmsg_len"));
        }
        let ty = u16::from_ne_bytes(buf[4..6].try_into().ok()?);
        let seq = u32::from_ne_bytes(buf[8..12].try_into().ok()?);
        let payload = &buf[NLMSG_HDRLEN..len];
        // NLMSG_ALIGN: messages start on 4-byte boundaries.
        let next = len.next_multiple_of(4).min(buf.len());
        buf = &buf[next..];
        Some(Ok((ty, seq, payload)))
    })
}

/// The (positive) errno of an `NLMSG_ERROR` payload; 0 is an ACK.
fn error_code(payload: &[u8]) -> Option<i32> {
    let raw = i32::from_ne_bytes(payload.get(0..4)?.try_into().ok()?);
    Some(-raw)
}

fn parse_msg(payload: &[u8]) -> Option<DiagSocket> {
    if payload.len() < MSG_LEN {
        return None;
    }
    Some(DiagSocket {
        family: payload[0],
        id: payload[4..4 + SOCKID_LEN].try_into().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_is_the_last_two_words_of_the_id() {
        let mut id = [0u8; SOCKID_LEN];
        id[40..44].copy_from_slice(&0x1122_3344u32.to_ne_bytes());
        id[44..48].copy_from_slice(&0x5566_7788u32.to_ne_bytes());
        let s = DiagSocket {
            family: libc::AF_INET as u8,
            id,
        };
        assert_eq!(s.cookie(), 0x5566_7788_1122_3344);
    }

    #[test]
    fn request_layout_matches_the_uapi_structs() {
        let id = [7u8; SOCKID_LEN];
        let r = request(SOCK_DESTROY, 5, 9, libc::AF_INET6 as u8, 2, &id);
        assert_eq!(r.len(), 72);
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 72);
        assert_eq!(u16::from_ne_bytes(r[4..6].try_into().unwrap()), 21);
        assert_eq!(u16::from_ne_bytes(r[6..8].try_into().unwrap()), 5);
        assert_eq!(u32::from_ne_bytes(r[8..12].try_into().unwrap()), 9);
        assert_eq!(&r[16..20], &[libc::AF_INET6 as u8, 17, 0, 0]);
        assert_eq!(u32::from_ne_bytes(r[20..24].try_into().unwrap()), 2);
        assert_eq!(&r[24..], &id);
    }

    #[test]
    fn parses_a_dump_datagram() {
        let mut msg = vec![0u8; MSG_LEN];
        msg[0] = libc::AF_INET as u8;
        msg[4 + 2..4 + 4].copy_from_slice(&53u16.to_be_bytes()); // dport
        msg[4 + 20..4 + 24].copy_from_slice(&[10, 0, 0, 9]); // dst
        let mut dgram = Vec::new();
        for (ty, payload) in [(SOCK_DIAG_BY_FAMILY, msg.clone()), (3u16, vec![0; 4])] {
            let len = NLMSG_HDRLEN + payload.len();
            dgram.extend_from_slice(&(len as u32).to_ne_bytes());
            dgram.extend_from_slice(&ty.to_ne_bytes());
            dgram.extend_from_slice(&0u16.to_ne_bytes());
            dgram.extend_from_slice(&1u32.to_ne_bytes());
            dgram.extend_from_slice(&0u32.to_ne_bytes());
            dgram.extend_from_slice(&payload);
        }
        let got: Vec<_> = messages(&dgram).collect::<Result<_, _>>().unwrap();
        assert_eq!(got.len(), 2);
        let sock = parse_msg(got[0].2).unwrap();
        assert_eq!(sock.peer(), "10.0.0.9:53".parse().unwrap());
        assert_eq!(got[1].0, 3);
    }

    #[test]
    fn v6_socket_reports_mapped_peer() {
        let mut id = [0u8; SOCKID_LEN];
        id[2..4].copy_from_slice(&9u16.to_be_bytes());
        id[20..36].copy_from_slice(&"::ffff:127.0.0.2".parse::<Ipv6Addr>().unwrap().octets());
        let s = DiagSocket {
            family: libc::AF_INET6 as u8,
            id,
        };
        assert_eq!(s.peer(), "[::ffff:127.0.0.2]:9".parse().unwrap());
    }

    #[test]
    fn truncated_datagram_is_an_error() {
        let mut d = vec![0u8; NLMSG_HDRLEN];
        d[0..4].copy_from_slice(&100u32.to_ne_bytes());
        assert!(messages(&d).next().unwrap().is_err());
    }
}
