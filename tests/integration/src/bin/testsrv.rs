//! A backend for tests and the demo: answers every TCP connection with a minimal
//! HTTP response and every UDP datagram with a datagram, both carrying its name.
use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket},
    time::Duration,
};

use clap::Parser;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    name: String,
    #[arg(long, default_value_t = 8080)]
    tcp: u16,
    #[arg(long, default_value_t = 5353)]
    udp: u16,
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let tcp = TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.tcp))?;
    let udp = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, args.udp))?;
    let name = args.name.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(name.as_bytes(), from);
        }
    });
    println!("ready");
    for stream in tcp.incoming().flatten() {
        let name = args.name.clone();
        std::thread::spawn(move || serve(stream, &name));
    }
    Ok(())
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
    let body = format!("{name}\n");
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
