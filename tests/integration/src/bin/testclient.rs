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
    /// What UDP datagrams carry: weir-testsrv answers `who` with its name and
    /// `peer` with its name and the source address it saw.
    #[arg(long, default_value = "who")]
    payload: String,
    /// UDP modes: bind this source port (0: any), so a test knows the flow's
    /// tuple in conntrack.
    #[arg(long, default_value_t = 0)]
    source_port: u16,
    /// `udp-stream`, `udp-one-socket`: pause between two sends on the one socket.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Tcp,
    Udp,
    UdpConnected,
    /// One unconnected UDP socket for the whole run, as a QUIC or DTLS
    /// client keeps: every attempt a `sendto` to the target and a
    /// `recvfrom`, whose source must be the target; one every
    /// `--interval-ms` (0: back to back), each outcome also on stderr.
    UdpOneSocket,
    /// One connected UDP socket for the whole run, as a DNS stub resolver
    /// keeps: a send every `--interval-ms`; after an error (a destroyed socket
    /// reports ECONNABORTED) it connects again, as such a client does. Each
    /// outcome is also printed on stderr as it happens.
    UdpStream,
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
    /// `udp-stream`: answers to earlier attempts, read (and dropped) after
    /// those attempts had timed out.
    late: u32,
    /// `udp-stream`, `udp-one-socket`: every attempt in order, the
    /// backend's answer or the error.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    sequence: Vec<String>,
}

const TIMEOUT: Duration = Duration::from_secs(2);

fn main() {
    let args = Args::parse();
    let mut report = Report::default();
    if matches!(args.mode, Mode::UdpStream) {
        udp_stream(&args, &mut report);
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
        return;
    }
    let start = Instant::now();
    let deadline = args.duration_ms.map(|ms| start + Duration::from_millis(ms));
    let one_socket = match args.mode {
        Mode::UdpOneSocket => match UdpSocket::bind(any_addr(args.target, args.source_port))
            .and_then(|s| s.set_read_timeout(Some(TIMEOUT)).map(|()| s))
        {
            Ok(s) => Some(s),
            Err(e) => {
                *report.errors.entry(errno_name(&e)).or_default() += 1;
                println!("{}", serde_json::to_string(&report).unwrap_or_default());
                return;
            }
        },
        _ => None,
    };
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
            Mode::Udp => udp(args.target, args.source_port, false, &args.payload),
            Mode::UdpConnected | Mode::UdpStream => {
                udp(args.target, args.source_port, true, &args.payload)
            }
            Mode::UdpOneSocket => {
                let s = one_socket.as_ref().expect("bound above");
                exchange(s, args.target, &args.payload)
            }
        };
        let streaming = one_socket.is_some();
        match res {
            Ok((name, peer)) => {
                report.ok += 1;
                if peer != args.target {
                    report.peer_mismatch += 1;
                }
                if streaming {
                    eprintln!("{name}");
                    report.sequence.push(name.clone());
                }
                *report.backends.entry(name).or_default() += 1;
            }
            Err(e) => {
                let err = errno_name(&e);
                if streaming {
                    eprintln!("error:{err}");
                    report.sequence.push(format!("error:{err}"));
                }
                *report.errors.entry(err).or_default() += 1;
                report.max_error_ms = report.max_error_ms.max(t.elapsed().as_millis() as u64);
            }
        }
        if streaming {
            std::thread::sleep(Duration::from_millis(args.interval_ms).saturating_sub(t.elapsed()));
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

fn udp_stream(args: &Args, report: &mut Report) {
    let deadline = Instant::now() + Duration::from_millis(args.duration_ms.unwrap_or(5000));
    let interval = Duration::from_millis(args.interval_ms);
    let mut sock: Option<UdpSocket> = None;
    let mut buf = [0u8; 512];
    while Instant::now() < deadline {
        report.attempts += 1;
        let t = Instant::now();
        let res = (|| -> io::Result<String> {
            if sock.is_none() {
                let s = UdpSocket::bind(any_addr(args.target, args.source_port))?;
                s.set_read_timeout(Some(interval.max(Duration::from_millis(200))))?;
                s.connect(args.target)?;
                sock = Some(s);
            }
            let s = sock.as_ref().expect("just set");
            // Tagged with the attempt, as a resolver tags queries with an ID:
            // an answer to an earlier attempt that timed out (still under
            // way, or queued behind neighbour discovery) is read and dropped,
            // never counted as this attempt's answer.
            let tag = format!(" #{}", report.attempts);
            s.send(format!("{}{tag}", args.payload).as_bytes())?;
            loop {
                let n = s.recv(&mut buf)?;
                let answer = String::from_utf8_lossy(&buf[..n]).trim().to_owned();
                if let Some(name) = answer.strip_suffix(&tag) {
                    return Ok(name.to_owned());
                }
                report.late += 1;
            }
        })();
        match res {
            Ok(name) => {
                report.ok += 1;
                *report.backends.entry(name.clone()).or_default() += 1;
                eprintln!("{name}");
                report.sequence.push(name);
            }
            Err(e) => {
                let err = errno_name(&e);
                // A timeout keeps the socket, as a stuck client would; any other
                // error makes it connect again.
                if err != "timeout" {
                    sock = None;
                }
                *report.errors.entry(err.clone()).or_default() += 1;
                eprintln!("error:{err}");
                report.sequence.push(format!("error:{err}"));
                report.max_error_ms = report.max_error_ms.max(t.elapsed().as_millis() as u64);
            }
        }
        std::thread::sleep(interval.saturating_sub(t.elapsed()));
    }
}

/// The wildcard address of `target`'s family, port `port`.
fn any_addr(target: SocketAddr, port: u16) -> SocketAddr {
    let ip: std::net::IpAddr = if target.is_ipv6() {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    SocketAddr::new(ip, port)
}

fn udp(
    target: SocketAddr,
    port: u16,
    connected: bool,
    payload: &str,
) -> io::Result<(String, SocketAddr)> {
    let s = UdpSocket::bind(any_addr(target, port))?;
    s.set_read_timeout(Some(TIMEOUT))?;
    let mut buf = [0u8; 512];
    let (n, peer) = if connected {
        s.connect(target)?;
        let peer = s.peer_addr()?;
        s.send(payload.as_bytes())?;
        (s.recv(&mut buf)?, peer)
    } else {
        s.send_to(payload.as_bytes(), target)?;
        s.recv_from(&mut buf)?
    };
    Ok((String::from_utf8_lossy(&buf[..n]).trim().to_owned(), peer))
}

/// One datagram to `target` on an unconnected socket and its answer, with
/// the answer's source. Answers to earlier, timed-out attempts are skipped
/// by their payload: each attempt sends its own number.
fn exchange(s: &UdpSocket, target: SocketAddr, payload: &str) -> io::Result<(String, SocketAddr)> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let tag = format!(" #{}", SEQ.fetch_add(1, Ordering::Relaxed));
    s.send_to(format!("{payload}{tag}").as_bytes(), target)?;
    let mut buf = [0u8; 512];
    loop {
        let (n, from) = s.recv_from(&mut buf)?;
        let answer = String::from_utf8_lossy(&buf[..n]).trim().to_owned();
        if let Some(name) = answer.strip_suffix(&tag) {
            return Ok((name.to_owned(), from));
        }
    }
}

fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "ECONNREFUSED".into(),
        Some(libc::ENETUNREACH) => "ENETUNREACH".into(),
        Some(libc::EHOSTUNREACH) => "EHOSTUNREACH".into(),
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::ECONNABORTED) => "ECONNABORTED".into(),
        Some(libc::EDESTADDRREQ) => "EDESTADDRREQ".into(),
        Some(libc::ETIMEDOUT | libc::EAGAIN) => "timeout".into(),
        Some(n) => format!("errno {n}"),
        None => format!("{:?}", e.kind()),
    }
}
