//! The backend of `cargo xtask bench datapath`: a request/response server that
//! costs as little CPU per request as possible, since several of them share two
//! cores with the load generator and the datapath under test.
//!
//! Wire protocol, shared with `weir-loadgen` (the two binaries keep their own
//! copies of these constants, so keep them in step): a request is [`REQ_LEN`]
//! bytes of which the first [`SEQ_LEN`] are an opaque sequence number; the
//! response is [`RESP_LEN`] bytes: that sequence number echoed, then the
//! server's `--name` padded with spaces. Over TCP a connection carries any
//! number of requests until the peer closes, which serves both
//! connect-request-close and keep-alive clients; over UDP each datagram is a
//! request.
//!
//! Each thread owns a single-threaded tokio runtime with its own `SO_REUSEPORT`
//! listener and UDP socket, so the kernel spreads connections and datagrams
//! over threads and no connection ever crosses threads.
use std::{
    io,
    net::{Ipv4Addr, SocketAddr},
};

use anyhow::{Context as _, Result};
use clap::Parser;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream, UdpSocket},
};

const REQ_LEN: usize = 32;
const SEQ_LEN: usize = 8;
const RESP_LEN: usize = 32;
const NAME_LEN: usize = RESP_LEN - SEQ_LEN;

#[derive(Parser)]
#[command(about = "Request/response server for the datapath benchmark")]
struct Args {
    /// TCP port (all addresses).
    #[arg(long, default_value_t = 8080)]
    tcp: u16,
    /// UDP port (all addresses).
    #[arg(long, default_value_t = 5353)]
    udp: u16,
    /// Worker threads, each with its own listener and UDP socket.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Carried in every response (at most 24 bytes), so a client can tell
    /// which backend answered.
    #[arg(long, default_value = "benchsrv", value_parser = parse_name)]
    name: String,
}

fn parse_name(s: &str) -> Result<String, String> {
    if s.len() > NAME_LEN {
        return Err(format!("at most {NAME_LEN} bytes"));
    }
    Ok(s.to_owned())
}

fn main() -> Result<()> {
    let args = Args::parse();
    raise_fd_limit();
    let mut template = [b' '; RESP_LEN];
    template[SEQ_LEN..SEQ_LEN + args.name.len()].copy_from_slice(args.name.as_bytes());

    // Bind everything before announcing readiness, so `ready` means every
    // thread's sockets accept traffic.
    let mut sockets = Vec::new();
    for _ in 0..args.threads {
        let tcp = reuseport_socket(Type::STREAM, Protocol::TCP, args.tcp)
            .with_context(|| format!("binding TCP port {}", args.tcp))?;
        // The namespace's somaxconn (4096 by default) caps this; a short queue
        // would turn bursts of connects into SYN drops that look like datapath
        // latency.
        tcp.listen(4096)?;
        let udp = reuseport_socket(Type::DGRAM, Protocol::UDP, args.udp)
            .with_context(|| format!("binding UDP port {}", args.udp))?;
        sockets.push((tcp, udp));
    }
    let mut threads = Vec::new();
    for (tcp, udp) in sockets {
        threads.push(std::thread::spawn(move || run_thread(tcp, udp, template)));
    }
    println!("ready");
    for t in threads {
        match t.join() {
            Ok(r) => r?,
            Err(_) => anyhow::bail!("a server thread panicked"),
        }
    }
    Ok(())
}

/// Keep-alive clients hold a descriptor each for the whole run; the soft limit
/// (often 1024) is the only thing that would stop thousands of them.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the kernel to fill and then read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn reuseport_socket(ty: Type, proto: Protocol, port: u16) -> io::Result<Socket> {
    let s = Socket::new(Domain::IPV4, ty, Some(proto))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())?;
    Ok(s)
}

fn run_thread(tcp: Socket, udp: Socket, template: [u8; RESP_LEN]) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    rt.block_on(async move {
        let tcp = TcpListener::from_std(tcp.into())?;
        let udp = UdpSocket::from_std(udp.into())?;
        tokio::spawn(serve_udp(udp, template));
        loop {
            match tcp.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(serve_tcp(stream, template));
                }
                // Out of descriptors, or the like: the listener itself is fine,
                // so keep accepting rather than dying mid-bench. Blocking the
                // thread briefly beats spinning on an error that persists.
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
    })
}

/// Answers every complete request in each read with one write, so a client
/// that pipelines still gets one response per request.
async fn serve_tcp(mut s: TcpStream, template: [u8; RESP_LEN]) {
    let mut buf = [0u8; 64 * REQ_LEN];
    let mut filled = 0;
    let mut out = Vec::with_capacity(buf.len() / REQ_LEN * RESP_LEN);
    loop {
        match s.read(&mut buf[filled..]).await {
            // EOF or a reset: a load generator closing with SO_LINGER 0 shows
            // up here as ECONNRESET, which is the normal end of a connection.
            Ok(0) | Err(_) => return,
            Ok(n) => filled += n,
        }
        let whole = filled / REQ_LEN * REQ_LEN;
        out.clear();
        for req in buf[..whole].chunks_exact(REQ_LEN) {
            let mut resp = template;
            resp[..SEQ_LEN].copy_from_slice(&req[..SEQ_LEN]);
            out.extend_from_slice(&resp);
        }
        buf.copy_within(whole..filled, 0);
        filled -= whole;
        if !out.is_empty() && s.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn serve_udp(s: UdpSocket, template: [u8; RESP_LEN]) {
    let mut buf = [0u8; 2048];
    loop {
        let Ok((n, from)) = s.recv_from(&mut buf).await else {
            // ECONNREFUSED from an earlier reply's ICMP error, and the like:
            // the socket stays usable.
            continue;
        };
        let mut resp = template;
        let seq = n.min(SEQ_LEN);
        resp[..seq].copy_from_slice(&buf[..seq]);
        let _ = s.send_to(&resp, from).await;
    }
}
