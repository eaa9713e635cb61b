//! The load generator of `cargo xtask bench datapath`: blocking worker threads
//! hammer `weir-benchsrv` targets and one JSON report goes to stdout.
//!
//! Blocking sockets keep the per-request client cost at the bare syscalls
//! (socket, connect, send, recv, close) with no event loop in between, so what
//! varies between runs is the kernel datapath, not the client. Each worker owns
//! its histogram and counters; they are merged once, after the run.
//!
//! Wire protocol, shared with `weir-benchsrv` (each binary keeps its own copy of
//! the constants): a [`REQ_LEN`]-byte request starting with a [`SEQ_LEN`]-byte
//! sequence number; a [`RESP_LEN`]-byte response echoing it, then the server's
//! name padded with spaces.
use std::{
    collections::{BTreeMap, HashMap},
    io::{self, Read as _, Write as _},
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const REQ_LEN: usize = 32;
const SEQ_LEN: usize = 8;
const RESP_LEN: usize = 32;
const NAME_LEN: usize = RESP_LEN - SEQ_LEN;
/// Latencies are recorded in nanoseconds; anything slower saturates here.
const MAX_LATENCY_NS: u64 = 100_000_000_000;

#[derive(Parser)]
#[command(about = "Load generator for the datapath benchmark; prints one JSON report")]
struct Args {
    #[arg(long, value_enum)]
    mode: Mode,
    /// One target `ip:port`.
    #[arg(long, conflicts_with = "targets", required_unless_present = "targets")]
    target: Option<SocketAddr>,
    /// A file with one `ip:port` per line (blank lines and `#` comments skipped).
    #[arg(long)]
    targets: Option<PathBuf>,
    /// Which target each request (crr, udp) or connection (rr) goes to.
    #[arg(long, value_enum, default_value_t = Pick::Random)]
    pick: Pick,
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=4096))]
    threads: u16,
    /// Length of the measured window.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    duration_ms: u64,
    /// Load runs this long before the measured window and is not counted.
    #[arg(long, default_value_t = 1_000)]
    warmup_ms: u64,
    /// Bounds each blocking step (connect, send, receive) of a request.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
    /// udp: connect each worker's socket (re-connecting whenever the picked
    /// target changes) instead of using sendto/recvfrom.
    #[arg(long)]
    udp_connected: bool,
    /// crr: how the client ends each connection.
    #[arg(long, value_enum, default_value_t = Close::Rst)]
    close: Close,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    /// A new TCP connection per request: connect, request, response, close;
    /// the latency spans socket() to close().
    Crr,
    /// One keep-alive TCP connection per worker, request/response in turn;
    /// the target is picked per connection, and latency excludes connecting.
    Rr,
    /// Request/response datagrams, one socket per worker.
    Udp,
}

#[derive(Clone, Copy, ValueEnum)]
enum Pick {
    Random,
    First,
    Last,
    /// Each worker draws one target at random and keeps it: what socket LB
    /// does for each unconnected UDP socket, so `direct` spreads its
    /// sockets over the backends the same way.
    PerWorker,
}

/// Ephemeral ports are what a crr run at 20-50k connections/s runs out of: a
/// client that closes first holds its port in TIME_WAIT for 60 s, which caps the
/// default 28k-port range at ~470 connections/s per destination, and connect()
/// spends ever longer searching for a free port on the way there. With
/// `net.ipv4.tcp_tw_reuse=1` a TIME_WAIT port is reusable towards the same
/// destination after `tcp_tw_reuse_delay` (1 s), so the cap becomes the size of
/// `ip_local_port_range` per second. `rst` (SO_LINGER 0) aborts instead: no
/// TIME_WAIT, the port is free at close, and no sysctl is needed; SO_REUSEADDR
/// would not help, since it only affects explicit binds. The cost is a teardown
/// of one RST instead of the FIN/ACK exchange; connection setup, which is what
/// the datapaths differ in, is unchanged. `fin` is the realistic teardown and
/// needs `tcp_tw_reuse=1` and `ip_local_port_range="1024 65535"` in the
/// client's namespace.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Close {
    Rst,
    Fin,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let targets = match load_targets(&args) {
        Ok(t) => t,
        Err(msg) => {
            eprintln!("weir-loadgen: {msg}");
            return ExitCode::from(2);
        }
    };
    match run(&args, targets).and_then(|r| serde_json::to_string(&r).map_err(io::Error::other)) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir-loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load_targets(args: &Args) -> Result<Vec<SocketAddr>, String> {
    let Some(path) = &args.targets else {
        return Ok(args.target.into_iter().collect());
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let targets = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            l.parse()
                .map_err(|e| format!("{}: {l:?}: {e}", path.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if targets.is_empty() {
        return Err(format!("{} lists no target", path.display()));
    }
    Ok(targets)
}

/// The measured window: requests that start in `[start, end)` are counted.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

#[derive(Serialize)]
struct Report {
    mode: Mode,
    threads: u16,
    duration_s: f64,
    requests: u64,
    errors: BTreeMap<String, u64>,
    rate_per_s: f64,
    latency_us: Latency,
    client_cpu_s: f64,
    /// None where /proc/stat is unreadable.
    softirq_s: Option<f64>,
    /// Successful requests per server name, from the responses.
    backends: BTreeMap<String, u64>,
    targets: usize,
    close: Close,
    udp_connected: bool,
}

#[derive(Serialize)]
struct Latency {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

fn run(args: &Args, targets: Vec<SocketAddr>) -> io::Result<Report> {
    let start = Instant::now() + Duration::from_millis(args.warmup_ms);
    let window = Window {
        start,
        end: start + Duration::from_millis(args.duration_ms),
    };
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    std::thread::scope(|scope| -> io::Result<Report> {
        let mut workers = Vec::new();
        for i in 0..args.threads {
            let seed = seed ^ u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut w = Worker::new(args, &targets, seed);
            let handle = std::thread::Builder::new()
                .name(format!("loadgen-{i}"))
                .spawn_scoped(scope, move || {
                    w.run(window);
                    w
                })?;
            workers.push(handle);
        }
        sleep_until(window.start);
        let cpu0 = cpu_seconds();
        let softirq0 = softirq_ticks();
        sleep_until(window.end);
        let cpu1 = cpu_seconds();
        let softirq1 = softirq_ticks();

        let mut total = Worker::new(args, &targets, 0);
        for h in workers {
            match h.join() {
                Ok(w) => total.absorb(w),
                Err(_) => *total.errors.entry(Fail::WorkerPanic).or_default() += 1,
            }
        }
        let duration_s = window.end.duration_since(window.start).as_secs_f64();
        // SAFETY: sysconf has no preconditions.
        let user_hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let q = |q: f64| us(total.hist.value_at_quantile(q));
        Ok(Report {
            mode: args.mode,
            threads: args.threads,
            duration_s,
            requests: total.ok,
            errors: total.errors.iter().map(|(k, v)| (k.name(), *v)).collect(),
            rate_per_s: (total.ok as f64 / duration_s * 10.0).round() / 10.0,
            latency_us: Latency {
                p50: q(0.5),
                p90: q(0.9),
                p99: q(0.99),
                max: us(total.hist.max()),
            },
            // getrusage counts microseconds; drop the float noise below that.
            client_cpu_s: ((cpu1 - cpu0) * 1e6).round() / 1e6,
            softirq_s: softirq0
                .zip(softirq1)
                .map(|(a, b)| b.saturating_sub(a) as f64 / user_hz),
            backends: total
                .backends
                .iter()
                .map(|(k, v)| (String::from_utf8_lossy(k).trim_end().to_owned(), *v))
                .collect(),
            targets: targets.len(),
            close: args.close,
            udp_connected: args.udp_connected,
        })
    })
}

fn us(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// User plus system CPU of the whole process, all threads.
fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data; getrusage only writes into it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// System-wide softirq time in USER_HZ ticks: it is where the receive path of
/// every namespace's packets is accounted, whichever process caused them.
fn softirq_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    // cpu user nice system idle iowait irq softirq ...
    line.split_whitespace().nth(7)?.parse().ok()
}

/// Why a request failed; named only when the report is written, so that
/// counting a failure on the hot path allocates nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fail {
    Os(i32),
    /// A step ran out of `--timeout-ms`.
    Timeout,
    /// The server closed before a whole response arrived.
    Eof,
    /// A response that did not echo the request's sequence number.
    BadResponse,
    Other,
    WorkerPanic,
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            // Sockets are blocking with SO_RCVTIMEO/SO_SNDTIMEO: EAGAIN is a
            // receive timing out, EINPROGRESS a connect timing out.
            Some(libc::EAGAIN | libc::EINPROGRESS) => Self::Timeout,
            Some(n) => Self::Os(n),
            None => match e.kind() {
                io::ErrorKind::UnexpectedEof => Self::Eof,
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Self::Timeout,
                _ => Self::Other,
            },
        }
    }
}

impl Fail {
    fn name(self) -> String {
        match self {
            Self::Os(n) => ERRNO_NAMES
                .iter()
                .find(|(e, _)| *e == n)
                .map_or_else(|| format!("errno_{n}"), |(_, name)| (*name).to_owned()),
            Self::Timeout => "timeout".into(),
            Self::Eof => "eof".into(),
            Self::BadResponse => "bad_response".into(),
            Self::Other => "other".into(),
            Self::WorkerPanic => "worker_panic".into(),
        }
    }
}

/// The errnos a socket request/response can plausibly end in; others are
/// reported by number.
#[rustfmt::skip]
const ERRNO_NAMES: &[(i32, &str)] = &[
    (libc::ECONNREFUSED, "ECONNREFUSED"), (libc::ECONNRESET, "ECONNRESET"),
    (libc::ECONNABORTED, "ECONNABORTED"), (libc::ETIMEDOUT, "ETIMEDOUT"),
    (libc::EADDRNOTAVAIL, "EADDRNOTAVAIL"), (libc::EADDRINUSE, "EADDRINUSE"),
    (libc::EHOSTUNREACH, "EHOSTUNREACH"), (libc::ENETUNREACH, "ENETUNREACH"),
    (libc::ENETDOWN, "ENETDOWN"), (libc::EPERM, "EPERM"), (libc::EACCES, "EACCES"),
    (libc::EPIPE, "EPIPE"), (libc::EMFILE, "EMFILE"), (libc::ENFILE, "ENFILE"),
    (libc::ENOBUFS, "ENOBUFS"), (libc::ENOMEM, "ENOMEM"), (libc::EINVAL, "EINVAL"),
    (libc::EINTR, "EINTR"),
];

struct Worker<'a> {
    args: &'a Args,
    targets: &'a [SocketAddr],
    timeout: Duration,
    rng: u64,
    /// `--pick per-worker`: the target drawn on the first pick.
    kept: Option<usize>,
    seq: u64,
    ok: u64,
    hist: Histogram<u64>,
    errors: HashMap<Fail, u64>,
    backends: HashMap<[u8; NAME_LEN], u64>,
}

type Outcome = Result<[u8; NAME_LEN], Fail>;

impl<'a> Worker<'a> {
    fn new(args: &'a Args, targets: &'a [SocketAddr], seed: u64) -> Self {
        Self {
            args,
            targets,
            timeout: Duration::from_millis(args.timeout_ms),
            // xorshift must not start at zero.
            rng: splitmix(seed) | 1,
            kept: None,
            seq: 0,
            ok: 0,
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .expect("constant, valid histogram bounds"),
            errors: HashMap::new(),
            backends: HashMap::new(),
        }
    }

    fn run(&mut self, window: Window) {
        match self.args.mode {
            Mode::Crr => self.run_crr(window),
            Mode::Rr => self.run_rr(window),
            Mode::Udp => self.run_udp(window),
        }
    }

    fn run_crr(&mut self, window: Window) {
        loop {
            let t = Instant::now();
            if t >= window.end {
                return;
            }
            let target = self.pick();
            let out = self.crr_once(target);
            self.record(window, t, out);
        }
    }

    fn crr_once(&mut self, target: SocketAddr) -> Outcome {
        let s = self.socket(target, Type::STREAM, Protocol::TCP)?;
        if self.args.close == Close::Rst {
            s.set_linger(Some(Duration::ZERO))?;
        }
        // A blocking connect honours SO_SNDTIMEO (set by `socket`) and
        // fails with EINPROGRESS when it runs out; no poll() round trip.
        s.connect(&SockAddr::from(target))?;
        self.exchange(&s)
    }

    fn run_rr(&mut self, window: Window) {
        let mut conn: Option<Socket> = None;
        loop {
            let t = Instant::now();
            if t >= window.end {
                return;
            }
            let s = match conn.take() {
                Some(s) => s,
                None => match self.rr_connect() {
                    Ok(s) => s,
                    Err(f) => {
                        self.record(window, t, Err(f));
                        continue;
                    }
                },
            };
            // Timed from here: connection setup is crr's business.
            let t = Instant::now();
            let out = self.exchange(&s);
            // A failed connection is dropped and a new one made next time.
            if out.is_ok() {
                conn = Some(s);
            }
            self.record(window, t, out);
        }
    }

    fn rr_connect(&mut self) -> Result<Socket, Fail> {
        let target = self.pick();
        let s = self.socket(target, Type::STREAM, Protocol::TCP)?;
        s.connect(&SockAddr::from(target))?;
        // Nagle never holds back a lone request, but this is paid once per
        // connection and rules out any interplay with delayed ACKs.
        s.set_tcp_nodelay(true)?;
        Ok(s)
    }

    fn socket(&self, target: SocketAddr, ty: Type, proto: Protocol) -> io::Result<Socket> {
        let s = Socket::new(Domain::for_address(target), ty, Some(proto))?;
        s.set_write_timeout(Some(self.timeout))?;
        s.set_read_timeout(Some(self.timeout))?;
        Ok(s)
    }

    fn exchange(&mut self, mut s: &Socket) -> Outcome {
        let req = self.next_request();
        s.write_all(&req)?;
        let mut resp = [0u8; RESP_LEN];
        s.read_exact(&mut resp)?;
        check(&req, &resp)
    }

    fn run_udp(&mut self, window: Window) {
        let s = match self.socket(self.targets[0], Type::DGRAM, Protocol::UDP) {
            Ok(s) => s,
            Err(e) => {
                self.record(window, window.start, Err(e.into()));
                return;
            }
        };
        let mut connected_to: Option<SocketAddr> = None;
        loop {
            let t = Instant::now();
            if t >= window.end {
                return;
            }
            let target = self.pick();
            let out = self.udp_once(&s, target, &mut connected_to);
            self.record(window, t, out);
        }
    }

    fn udp_once(
        &mut self,
        s: &Socket,
        target: SocketAddr,
        connected_to: &mut Option<SocketAddr>,
    ) -> Outcome {
        let req = self.next_request();
        if self.args.udp_connected {
            if *connected_to != Some(target) {
                *connected_to = None;
                s.connect(&SockAddr::from(target))?;
                *connected_to = Some(target);
            }
            s.send(&req)?;
        } else {
            s.send_to(&req, &SockAddr::from(target))?;
        }
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 512];
        loop {
            // Unconnected, recvfrom with an address as a real resolver does:
            // that is what runs the recvmsg4 hook and conntrack's reverse NAT.
            let n = if self.args.udp_connected {
                s.recv(&mut buf)?
            } else {
                s.recv_from(&mut buf)?.0
            };
            // SAFETY: the receive initialised the first n bytes.
            let got = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
            if let Some(out) = self.udp_answer(&req, got) {
                return out;
            }
        }
    }

    /// None for a stale answer to an earlier, timed-out request: keep waiting.
    fn udp_answer(&self, req: &[u8; REQ_LEN], got: &[u8]) -> Option<Outcome> {
        let Ok(resp) = <&[u8; RESP_LEN]>::try_from(got) else {
            return Some(Err(Fail::BadResponse));
        };
        if resp[..SEQ_LEN] != req[..SEQ_LEN] {
            let seq = u64::from_le_bytes(resp[..SEQ_LEN].try_into().ok()?);
            return (seq >= self.seq).then_some(Err(Fail::BadResponse));
        }
        Some(check(req, resp))
    }

    fn next_request(&mut self) -> [u8; REQ_LEN] {
        self.seq += 1;
        let mut req = [b'.'; REQ_LEN];
        req[..SEQ_LEN].copy_from_slice(&self.seq.to_le_bytes());
        req
    }

    fn pick(&mut self) -> SocketAddr {
        let n = self.targets.len();
        let i = match self.args.pick {
            Pick::First => 0,
            Pick::Last => n - 1,
            Pick::Random if n == 1 => 0,
            Pick::Random => self.random_index(n),
            Pick::PerWorker => match self.kept {
                Some(i) => i,
                None => {
                    let i = self.random_index(n);
                    self.kept = Some(i);
                    i
                }
            },
        };
        self.targets[i]
    }

    /// A uniform index below `n`: xorshift64*, then Lemire's multiply-shift.
    fn random_index(&mut self, n: usize) -> usize {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let x = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((u128::from(x) * n as u128) >> 64) as usize
    }

    fn record(&mut self, window: Window, started: Instant, out: Outcome) {
        if started < window.start {
            return;
        }
        match out {
            Ok(name) => {
                self.ok += 1;
                let ns = started.elapsed().as_nanos().min(u128::from(MAX_LATENCY_NS)) as u64;
                self.hist.saturating_record(ns.max(1));
                *self.backends.entry(name).or_default() += 1;
            }
            Err(f) => *self.errors.entry(f).or_default() += 1,
        }
    }

    fn absorb(&mut self, other: Worker) {
        self.ok += other.ok;
        self.hist
            .add(&other.hist)
            .expect("histograms share their bounds");
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        for (k, v) in other.backends {
            *self.backends.entry(k).or_default() += v;
        }
    }
}

fn check(req: &[u8; REQ_LEN], resp: &[u8; RESP_LEN]) -> Outcome {
    if resp[..SEQ_LEN] != req[..SEQ_LEN] {
        return Err(Fail::BadResponse);
    }
    let mut name = [0u8; NAME_LEN];
    name.copy_from_slice(&resp[SEQ_LEN..]);
    Ok(name)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce5_e9b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d4_9bb4_1ce9_11eb);
    z ^ (z >> 31)
}
