//! Flows for the conntrack-hardening tests, IPv4 only.
//!
//! - `hold --target IP:PORT --count N`: opens N TCP connections to
//!   `weir-testsrv`'s `GET /hold` and keeps them, idle. Then reads commands
//!   from stdin, one a line, each answered by one JSON line on stdout:
//!   `open N` (N more), `close N` (the N opened last, the client closing
//!   first), `check` (a line through every connection, which must come back
//!   from the backend that answered when it opened). The first JSON line
//!   reports the initial N. EOF closes everything.
//! - `spoof --src IP[:PORT] | --src-net A.B.C.0 --dst IP --dport P[-Q]
//!   --flags ack,rst,... --count N`: N forged TCP segments from a raw socket,
//!   random sequence and acknowledgement numbers, from the given source (or
//!   random hosts .10-.250 of the /24 and random ports), to the destination
//!   ports in turn. Bounded by `--count` and `--max-secs`.
//!
//! The tests run both inside their own network namespaces only.
use std::{
    collections::BTreeMap,
    io::{self, BufRead as _, Read as _, Write as _},
    net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpStream},
    time::{Duration, Instant},
};

use clap::{Parser, Subcommand};
use serde::Serialize;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Hold {
        #[arg(long)]
        target: SocketAddrV4,
        #[arg(long)]
        count: usize,
    },
    Spoof {
        /// Fixed source address, with a fixed port or (none) random ones.
        #[arg(long, conflicts_with = "src_net")]
        src: Option<String>,
        /// Random hosts .10-.250 of this /24 (given as A.B.C.0), random ports.
        #[arg(long)]
        src_net: Option<Ipv4Addr>,
        #[arg(long)]
        dst: Ipv4Addr,
        /// A port or a range `LO-HI`, cycled through in order.
        #[arg(long)]
        dport: String,
        /// Comma-separated: syn, ack, rst, fin, psh.
        #[arg(long)]
        flags: String,
        #[arg(long)]
        count: u64,
        #[arg(long, default_value_t = 120)]
        max_secs: u64,
    },
}

/// A connection must open on its first SYN: a dropped SYN is retransmitted
/// after one second.
const SLOW_CONNECT: Duration = Duration::from_millis(900);
const TIMEOUT: Duration = Duration::from_secs(5);

fn main() -> anyhow::Result<()> {
    match Args::parse().cmd {
        Cmd::Hold { target, count } => hold(target, count),
        Cmd::Spoof {
            src,
            src_net,
            dst,
            dport,
            flags,
            count,
            max_secs,
        } => spoof(src, src_net, dst, &dport, &flags, count, max_secs),
    }
}

struct Conn {
    stream: TcpStream,
    backend: String,
}

#[derive(Default, Serialize)]
struct Opened {
    phase: &'static str,
    opened: usize,
    failed: usize,
    /// Connections that needed a retransmitted SYN (or more).
    slow: usize,
    max_connect_ms: u64,
    backends: BTreeMap<String, usize>,
    errors: BTreeMap<String, usize>,
    held: usize,
}

#[derive(Default, Serialize)]
struct Checked {
    phase: &'static str,
    ok: usize,
    /// Answered by another backend than at the start.
    moved: usize,
    errors: BTreeMap<String, usize>,
    held: usize,
}

fn hold(target: SocketAddrV4, count: usize) -> anyhow::Result<()> {
    raise_nofile();
    let mut conns: Vec<Conn> = Vec::new();
    let first = open(target, count, &mut conns);
    emit(&first)?;
    for line in io::stdin().lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let (cmd, n) = (
            words.next().unwrap_or(""),
            words
                .next()
                .and_then(|w| w.parse::<usize>().ok())
                .unwrap_or(0),
        );
        match cmd {
            "open" => {
                let r = open(target, n, &mut conns);
                emit(&r)?;
            }
            "close" => {
                let keep = conns.len().saturating_sub(n);
                let closed = conns.split_off(keep);
                let k = closed.len();
                for c in closed {
                    close(c);
                }
                emit(&serde_json::json!({ "phase": "closed", "closed": k, "held": conns.len() }))?;
            }
            "check" => {
                let r = check(&mut conns);
                emit(&r)?;
            }
            _ => anyhow::bail!("unknown command {line:?}"),
        }
    }
    for c in conns {
        close(c);
    }
    Ok(())
}

fn emit(v: &impl Serialize) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(v)?)?;
    out.flush()?;
    Ok(())
}

fn open(target: SocketAddrV4, n: usize, conns: &mut Vec<Conn>) -> Opened {
    let mut r = Opened {
        phase: "opened",
        ..Opened::default()
    };
    for _ in 0..n {
        let t = Instant::now();
        match open_one(target) {
            Ok(c) => {
                let ms = t.elapsed().as_millis() as u64;
                r.max_connect_ms = r.max_connect_ms.max(ms);
                if t.elapsed() >= SLOW_CONNECT {
                    r.slow += 1;
                }
                r.opened += 1;
                *r.backends.entry(c.backend.clone()).or_default() += 1;
                conns.push(c);
            }
            Err(e) => {
                r.failed += 1;
                *r.errors.entry(e.to_string()).or_default() += 1;
            }
        }
    }
    r.held = conns.len();
    r
}

fn open_one(target: SocketAddrV4) -> io::Result<Conn> {
    let mut stream = TcpStream::connect_timeout(&SocketAddr::V4(target), TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_nodelay(true)?;
    stream.write_all(b"GET /hold HTTP/1.1\r\nHost: weir\r\n\r\n")?;
    // The header, then one line: the backend's name.
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        if let Some(end) = find(&got, b"\r\n\r\n")
            && got[end + 4..].contains(&b'\n')
        {
            let body = String::from_utf8_lossy(&got[end + 4..]);
            let backend = body.lines().next().unwrap_or("").trim().to_owned();
            return Ok(Conn { stream, backend });
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        got.extend_from_slice(&buf[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Closes from the client side first and waits for the server's FIN, so
/// the backend ends in CLOSED rather than TIME_WAIT.
fn close(mut c: Conn) {
    let _ = c.stream.shutdown(Shutdown::Write);
    let _ = c.stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = [0u8; 256];
    while matches!(c.stream.read(&mut buf), Ok(n) if n > 0) {}
}

/// A line through every connection: all are sent first, then the answers
/// read against one deadline, so a thousand broken flows cost seconds, not
/// a timeout each.
fn check(conns: &mut [Conn]) -> Checked {
    let mut r = Checked {
        phase: "checked",
        ..Checked::default()
    };
    let sent: Vec<io::Result<()>> = conns
        .iter_mut()
        .map(|c| c.stream.write_all(b"ping\n"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    for (c, s) in conns.iter_mut().zip(sent) {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10));
        let got = s
            .and_then(|()| c.stream.set_read_timeout(Some(left)))
            .and_then(|()| answer(c));
        match got {
            Ok(name) if name == c.backend => r.ok += 1,
            Ok(_) => r.moved += 1,
            Err(e) => *r.errors.entry(e.kind().to_string()).or_default() += 1,
        }
    }
    r.held = conns.len();
    r
}

/// The answer to a `ping` line: the name of the backend that sent it.
fn answer(c: &mut Conn) -> io::Result<String> {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\n") {
        if c.stream.read(&mut b)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        got.push(b[0]);
    }
    let line = String::from_utf8_lossy(&got);
    Ok(line
        .trim()
        .strip_suffix(" ping")
        .unwrap_or(line.trim())
        .to_owned())
}

/// As many descriptors as the hard limit allows: a thousand connections
/// exceed the usual soft limit of 1024 with everything else open.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

const TCP_FLAGS: [(&str, u8); 5] = [
    ("fin", 0x01),
    ("syn", 0x02),
    ("rst", 0x04),
    ("psh", 0x08),
    ("ack", 0x10),
];

#[derive(Serialize)]
struct Sent {
    sent: u64,
    errors: u64,
    secs: f64,
}

fn spoof(
    src: Option<String>,
    src_net: Option<Ipv4Addr>,
    dst: Ipv4Addr,
    dport: &str,
    flags: &str,
    count: u64,
    max_secs: u64,
) -> anyhow::Result<()> {
    let mut tcp_flags = 0u8;
    for f in flags.split(',') {
        let (_, bit) = TCP_FLAGS
            .iter()
            .find(|(n, _)| *n == f)
            .ok_or_else(|| anyhow::anyhow!("unknown flag {f:?}"))?;
        tcp_flags |= bit;
    }
    let (lo, hi) = match dport.split_once('-') {
        Some((a, b)) => (a.parse::<u16>()?, b.parse::<u16>()?),
        None => {
            let p = dport.parse::<u16>()?;
            (p, p)
        }
    };
    anyhow::ensure!(lo <= hi, "empty port range {dport}");
    let (fixed_src, fixed_port): (Option<Ipv4Addr>, Option<u16>) = match &src {
        Some(s) => match s.split_once(':') {
            Some((a, p)) => (Some(a.parse()?), Some(p.parse()?)),
            None => (Some(s.parse()?), None),
        },
        None => (None, None),
    };
    anyhow::ensure!(
        fixed_src.is_some() || src_net.is_some(),
        "--src or --src-net is needed"
    );
    // SAFETY: a plain socket call; the descriptor is closed at the end.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    anyhow::ensure!(fd >= 0, "raw socket: {}", io::Error::last_os_error());
    let mut rng = Rng::seeded();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(max_secs);
    let (mut sent, mut errors) = (0u64, 0u64);
    let mut port = lo;
    let mut pkt = [0u8; 40];
    while sent < count && Instant::now() < deadline {
        let saddr = match fixed_src {
            Some(a) => a,
            None => {
                let net = src_net.unwrap_or(Ipv4Addr::UNSPECIFIED).octets();
                Ipv4Addr::new(net[0], net[1], net[2], 10 + (rng.next() % 241) as u8)
            }
        };
        let sport = fixed_port.unwrap_or(1024 + (rng.next() % 64_000) as u16);
        build(
            &mut pkt,
            saddr,
            dst,
            sport,
            port,
            rng.next(),
            rng.next(),
            tcp_flags,
            rng.next() as u16,
        );
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst.octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: valid buffer and address of the sizes given.
        let rc = unsafe {
            libc::sendto(
                fd,
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                (&raw const to).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            // A full queue: let it drain and send the same packet again.
            errors += 1;
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        sent += 1;
        port = if port >= hi { lo } else { port + 1 };
    }
    // SAFETY: closing our own descriptor.
    unsafe { libc::close(fd) };
    emit(&Sent {
        sent,
        errors,
        secs: start.elapsed().as_secs_f64(),
    })
}

/// An IPv4 + TCP header (no options, no payload) with both checksums.
#[allow(clippy::too_many_arguments)]
fn build(
    p: &mut [u8; 40],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    id: u16,
) {
    *p = [0; 40];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[4..6].copy_from_slice(&id.to_be_bytes());
    p[6] = 0x40; // DF
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let ip = csum(&p[..20], 0);
    p[10..12].copy_from_slice(&ip.to_be_bytes());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&512u16.to_be_bytes());
    let mut pseudo = 0u32;
    for w in [src.octets(), dst.octets()] {
        pseudo += u32::from(u16::from_be_bytes([w[0], w[1]]));
        pseudo += u32::from(u16::from_be_bytes([w[2], w[3]]));
    }
    pseudo += 6 + 20;
    let l4 = csum(&p[20..], pseudo);
    p[36..38].copy_from_slice(&l4.to_be_bytes());
}

fn csum(data: &[u8], init: u32) -> u16 {
    let mut s = init;
    for c in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// xorshift64*: enough to scatter forged tuples.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Self(t | 1)
    }

    fn next(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
}
