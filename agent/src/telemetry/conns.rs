//! What keeps the agent's HTTP listeners answering when a peer opens
//! connections and sends nothing: `/healthz` on 0.0.0.0:10256 and the
//! healthCheckNodePorts are reachable from every pod, and the metrics port
//! from the node.
//!
//! - A request's headers must arrive within [`HEADER_READ_TIMEOUT`], which
//!   also bounds the idle time of a keep-alive connection (hyper restarts it
//!   whenever it waits for a request head).
//! - A listener (or a group of them) keeps at most a fixed number of
//!   connections open; one more closes the oldest. Refusing the new one
//!   instead would let whoever holds the cap keep every prober out, and
//!   leaving it in the kernel's accept queue would have the same effect. A
//!   legitimate probe is answered within microseconds of arriving, so only a
//!   peer that opens thousands of connections per millisecond could evict one
//!   before its answer.
//! - An accept that fails (out of descriptors, mostly) is retried after a
//!   growing pause: the pending connection stays queued, so retrying at once
//!   spins a core at 100%.
//!
//! The caps keep every listener together well below 1,024 descriptors, the
//! soft `RLIMIT_NOFILE` a container gets from a containerd started by systemd
//! without `LimitNOFILE` (containerd 2.x dropped it from its unit), and
//! [`raise_nofile_limit`] lifts the soft limit to the hard one at start, as
//! Go's runtime does for kube-proxy.
use std::{
    collections::BTreeMap,
    future::Future,
    io,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use hyper::server::conn::http1::Builder as Http1;
use hyper_util::rt::TokioTimer;
use tokio::{
    net::{TcpListener, TcpStream},
    task::{AbortHandle, JoinSet},
};
use tracing::{debug, warn};

/// How long a connection may take to send a request's headers, and how long
/// a keep-alive connection may sit idle between requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Open connections of `--metrics-addr`: one Prometheus, a person with curl.
pub const METRICS_CONNS: usize = 64;
/// Open connections of `--healthz-addr`: the kubelet, load balancers'
/// probers (a few per load balancer) and monitoring.
pub const HEALTHZ_CONNS: usize = 256;
/// Open connections of all healthCheckNodePort listeners together: however
/// many eTP=Local Services there are, they share one budget.
pub const HEALTH_CHECK_CONNS: usize = 256;

/// The shortest and longest pause after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// An HTTP/1 server connection with the header timeout.
pub fn http1() -> Http1 {
    let mut b = Http1::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    b
}

/// The open connections of one or more listeners, at most `cap`.
#[derive(Debug)]
pub struct Conns {
    cap: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// By age. `None` while its task is being spawned.
    open: BTreeMap<u64, Option<AbortHandle>>,
}

impl Conns {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change is one insert or remove: a panicking holder leaves
        // nothing half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }

    /// Closes the oldest connection; false when there is none.
    fn evict_oldest(&self) -> bool {
        let oldest = self.lock().open.pop_first();
        match oldest {
            Some((_, handle)) => {
                if let Some(h) = handle {
                    h.abort();
                }
                true
            }
            None => false,
        }
    }

    /// Runs `conn` in `tasks` as a counted connection, closing the oldest
    /// ones first if the cap is reached.
    fn admit(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        conn: impl Future<Output = ()> + Send + 'static,
    ) {
        let id = {
            let mut s = self.lock();
            let id = s.next;
            s.next += 1;
            s.open.insert(id, None);
            id
        };
        while self.open() > self.cap && self.evict_oldest() {}
        let guard = Counted {
            conns: self.clone(),
            id,
        };
        let handle = tasks.spawn(async move {
            let _counted = guard;
            conn.await;
        });
        // The task may already be done (its guard then removed the entry).
        if let Some(slot) = self.lock().open.get_mut(&id) {
            *slot = Some(handle);
        }
    }
}

/// Uncounts its connection however the task ends: done, failed or evicted.
struct Counted {
    conns: Arc<Conns>,
    id: u64,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.conns.lock().open.remove(&self.id);
    }
}

/// Accepts on `listener` until dropped and runs `serve` for each connection,
/// within `conns`' cap. Dropping this future closes its connections.
pub async fn accept_loop<F, Fut>(listener: TcpListener, what: &str, conns: Arc<Conns>, serve: F)
where
    F: Fn(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    let mut backoff = Duration::ZERO;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            // Reap finished connections so the set does not grow.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = Duration::ZERO;
                conns.admit(&mut tasks, serve(stream, peer));
            }
            Err(e) => {
                let first = backoff.is_zero();
                backoff = (backoff * 2).clamp(ACCEPT_BACKOFF.0, ACCEPT_BACKOFF.1);
                // Out of descriptors: closing the oldest connection lets the
                // queued one in.
                let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                if out_of_fds {
                    conns.evict_oldest();
                }
                if first {
                    warn!(
                        open = conns.open(),
                        "{what}: cannot accept a connection: {e}; retrying with backoff"
                    );
                } else {
                    debug!("{what} accept: {e}; next try in {backoff:?}");
                }
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (Go does this for every
/// program, kube-proxy included) and returns the limits now in force.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the kernel to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            ..lim
        };
        // SAFETY: `raised` is a valid rlimit for the kernel to read.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A server that answers each line with "ok" and otherwise waits.
    async fn server(cap: usize) -> (SocketAddr, Arc<Conns>, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let conns = Conns::new(cap);
        let task = tokio::spawn(accept_loop(
            l,
            "test",
            conns.clone(),
            |mut s, _| async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(b"ok\n").await.is_err() {
                        return;
                    }
                }
            },
        ));
        (addr, conns, task)
    }

    async fn wait_open(conns: &Conns, n: usize) {
        for _ in 0..500 {
            if conns.open() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("{} open, wanted {n}", conns.open());
    }

    #[tokio::test]
    async fn past_the_cap_the_oldest_connection_closes_and_the_new_one_is_served() {
        let (addr, conns, task) = server(3).await;
        let mut idle = Vec::new();
        for _ in 0..3 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        wait_open(&conns, 3).await;
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        fresh.write_all(b"hi\n").await.unwrap();
        let mut buf = [0u8; 3];
        fresh.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ok\n");
        wait_open(&conns, 3).await;
        // The oldest was closed by the server; the others still are open.
        let mut b = [0u8; 1];
        assert_eq!(idle[0].read(&mut b).await.unwrap(), 0, "oldest closed");
        idle[2].write_all(b"x\n").await.unwrap();
        assert_eq!(idle[2].read(&mut buf).await.unwrap(), 3);
        task.abort();
    }

    #[tokio::test]
    async fn closed_connections_are_uncounted_and_dropping_the_loop_closes_all() {
        let (addr, conns, task) = server(8).await;
        let a = TcpStream::connect(addr).await.unwrap();
        let mut b = TcpStream::connect(addr).await.unwrap();
        wait_open(&conns, 2).await;
        drop(a);
        wait_open(&conns, 1).await;
        task.abort();
        let _ = task.await;
        let mut buf = [0u8; 1];
        assert_eq!(b.read(&mut buf).await.unwrap(), 0);
        assert_eq!(conns.open(), 0);
    }

    #[test]
    fn nofile_soft_limit_is_raised_to_the_hard_one() {
        let (soft, hard) = raise_nofile_limit().unwrap();
        assert_eq!(soft, hard);
    }
}
