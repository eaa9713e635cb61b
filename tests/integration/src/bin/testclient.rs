//! A load-balancing probe for tests: makes fresh connections (or sends fresh
//! datagrams) to a target and reports, as JSON, which backend answered each,
//! which errors occurred, and whether the socket showed the target as its peer.
use std::{
    collections::BTreeMap,
    io::{self, Read as _, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use clap::{Parser, ValueEnum};
use serde::Serialize;

#[derive(Parser)]
struct Args {
    #[arg(value_enum)]
    mode: Mode,
    #[arg(long)]
    target: SocketAddr,
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Keep going for this long instead of `count` attempts.
    #[arg(long)]
    duration_ms: Option<u64>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Tcp,
    Udp,
    UdpConnected,
}

#[derive(Default, Serialize)]
struct Report {
    attempts: u32,
    ok: u32,
    backends: BTreeMap<String, u32>,
    errors: BTreeMap<String, u32>,
    /// Successful attempts whose socket showed another peer than the target.
    peer_mismatch: u32,
    /// The slowest failed attempt, to tell refusals from timeouts.
    max_error_ms: u64,
}

const TIMEOUT: Duration = Duration::from_secs(2);

fn main() {
    let args = Args::parse();
    let mut report = Report::default();
    let start = Instant::now();
    let deadline = args.duration_ms.map(|ms| start + Duration::from_millis(ms));
    loop {
        match deadline {
            Some(d) if Instant::now() >= d => break,
            None if report.attempts >= args.count => break,
            _ => {}
        }
        report.attempts += 1;
        let t = Instant::now();
        let res = match args.mode {
            Mode::Tcp => tcp(args.target),
            Mode::Udp => udp(args.target, false),
            Mode::UdpConnected => udp(args.target, true),
        };
        match res {
            Ok((name, peer)) => {
                report.ok += 1;
                *report.backends.entry(name).or_default() += 1;
                if peer != args.target {
                    report.peer_mismatch += 1;
                }
            }
            Err(e) => {
                *report.errors.entry(errno_name(&e)).or_default() += 1;
                report.max_error_ms = report.max_error_ms.max(t.elapsed().as_millis() as u64);
            }
        }
    }
    println!("{}", serde_json::to_string(&report).unwrap_or_default());
}

fn tcp(target: SocketAddr) -> io::Result<(String, SocketAddr)> {
    let mut s = TcpStream::connect_timeout(&target, TIMEOUT)?;
    let peer = s.peer_addr()?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let body = resp
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or("")
        .trim()
        .to_owned();
    if body.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "empty response"));
    }
    Ok((body, peer))
}

fn udp(target: SocketAddr, connected: bool) -> io::Result<(String, SocketAddr)> {
    let s = UdpSocket::bind("0.0.0.0:0")?;
    s.set_read_timeout(Some(TIMEOUT))?;
    let mut buf = [0u8; 512];
    let (n, peer) = if connected {
        s.connect(target)?;
        let peer = s.peer_addr()?;
        s.send(b"who")?;
        (s.recv(&mut buf)?, peer)
    } else {
        s.send_to(b"who", target)?;
        s.recv_from(&mut buf)?
    };
    Ok((String::from_utf8_lossy(&buf[..n]).trim().to_owned(), peer))
}

fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "ECONNREFUSED".into(),
        Some(libc::ENETUNREACH) => "ENETUNREACH".into(),
        Some(libc::EHOSTUNREACH) => "EHOSTUNREACH".into(),
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::ETIMEDOUT | libc::EAGAIN) => "timeout".into(),
        Some(n) => format!("errno {n}"),
        None => format!("{:?}", e.kind()),
    }
}
