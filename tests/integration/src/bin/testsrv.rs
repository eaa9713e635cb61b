//! A backend for tests and the demo: answers every TCP connection with a minimal
//! HTTP response and every UDP datagram with a datagram, both carrying its name.
//!
//! It listens on IPv4 and, where the namespace has IPv6, on IPv6 too. Two
//! requests say more than the name, for the packet-datapath tests:
//! - `GET /peer` answers `<name> <peer ip>`: the source address the server saw,
//!   which tells a preserved client address from a SNAT address; a UDP datagram
//!   `peer` is answered the same way.
//! - `GET /stream?lines=N&ms=M` sends `<name> <i>` lines, one every M ms: a long
//!   TCP stream.
//! - `GET /hold` answers a header and `<name>`, then keeps the connection and
//!   answers every line `x` the client sends with `<name> x`, until the client
//!   closes: a long-lived, idle, established flow (`weir-flowtool hold`).
use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    time::Duration,
};

use clap::Parser;
use socket2::{Domain, Protocol, Socket, Type};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    name: String,
    #[arg(long, default_value_t = 8080)]
    tcp: u16,
    /// UDP ports, each served on v4 and v6.
    #[arg(long, default_values_t = [5353])]
    udp: Vec<u16>,
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let tcp = TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.tcp))?;
    // IPv6 is optional: a namespace without it still gets its IPv4 server.
    let tcp6 = v6_socket(Type::STREAM, args.tcp)
        .map(TcpListener::from)
        .ok();
    for &port in &args.udp {
        let udp = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port))?;
        let udp6 = v6_socket(Type::DGRAM, port).map(UdpSocket::from).ok();
        for udp in std::iter::once(udp).chain(udp6) {
            let name = args.name.clone();
            std::thread::spawn(move || serve_udp(&udp, &name));
        }
    }
    if let Some(tcp6) = tcp6 {
        let name = args.name.clone();
        std::thread::spawn(move || accept(&tcp6, &name));
    }
    println!("ready");
    accept(&tcp, &args.name);
    Ok(())
}

/// An IPv6-only socket on `[::]:port`, so it never collides with the IPv4 one.
fn v6_socket(ty: Type, port: u16) -> std::io::Result<Socket> {
    let proto = if ty == Type::STREAM {
        Protocol::TCP
    } else {
        Protocol::UDP
    };
    let s = Socket::new(Domain::IPV6, ty, Some(proto))?;
    s.set_only_v6(true)?;
    s.set_reuse_address(true)?;
    s.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
    if ty == Type::STREAM {
        s.listen(1024)?;
    }
    Ok(s)
}

fn serve_udp(udp: &UdpSocket, name: &str) {
    let mut buf = [0u8; 1500];
    while let Ok((n, from)) = udp.recv_from(&mut buf) {
        let request = String::from_utf8_lossy(&buf[..n]);
        let mut answer = if request.starts_with("peer") {
            format!("{name} {}", from.ip().to_canonical())
        } else {
            name.to_owned()
        };
        // A request tagged ` #N` (weir-testclient's udp-stream) gets its tag
        // back, so a client can tell a late answer from the one it awaits.
        if let Some((_, tag)) = request.trim_end().rsplit_once(" #") {
            answer.push_str(" #");
            answer.push_str(tag);
        }
        let _ = udp.send_to(answer.as_bytes(), from);
    }
}

fn accept(tcp: &TcpListener, name: &str) {
    for stream in tcp.incoming().flatten() {
        let name = name.to_owned();
        std::thread::spawn(move || serve(stream, &name));
    }
}

fn serve(mut s: TcpStream, name: &str) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut req = Vec::new();
    let mut buf = [0u8; 512];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    let req = String::from_utf8_lossy(&req);
    let path = req.split_whitespace().nth(1).unwrap_or("/");
    if let Some(query) = path.strip_prefix("/stream") {
        stream(s, name, query);
        return;
    }
    if path == "/hold" {
        hold(s, name);
        return;
    }
    let body = if path.starts_with("/peer") {
        let peer = s.peer_addr().map(|p| p.ip().to_canonical().to_string());
        format!("{name} {}\n", peer.unwrap_or_default())
    } else {
        format!("{name}\n")
    };
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// `/hold`: `<name>` after the header, then `<name> x` for every line `x`,
/// until the client closes (the server never closes first, so the backend
/// keeps no TIME_WAIT socket of the tuple).
fn hold(mut s: TcpStream, name: &str) {
    let _ = s.set_nodelay(true);
    if write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n{name}\n"
    )
    .is_err()
    {
        return;
    }
    let _ = s.set_read_timeout(None);
    let mut line = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            if b != b'\n' {
                line.push(b);
                continue;
            }
            let text = String::from_utf8_lossy(&line).into_owned();
            line.clear();
            if writeln!(s, "{name} {text}").is_err() {
                return;
            }
        }
    }
}

/// `?lines=N&ms=M`: N lines `<name> <i>`, one every M milliseconds.
fn stream(mut s: TcpStream, name: &str, query: &str) {
    let param = |key: &str, default: u64| {
        query
            .trim_start_matches('?')
            .split('&')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(default)
    };
    let (lines, ms) = (param("lines", 50), param("ms", 100));
    let _ = s.set_nodelay(true);
    if write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return;
    }
    for i in 0..lines {
        if writeln!(s, "{name} {i}").is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(ms));
    }
}
