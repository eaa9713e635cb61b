//! Real clients in the topology's namespaces: curl, dig and weir-testclient.
use std::{collections::BTreeMap, net::IpAddr, path::Path, process::Command};

use anyhow::{Context as _, Result};
use serde::Deserialize;

use super::{Ns, PacketTopology};
use crate::bin;

/// `host` as it goes in a URL or a socket address: IPv6 in brackets.
pub fn host(ip: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    }
}

/// `ip:port`, bracketed for IPv6.
pub fn target(ip: &str, port: u16) -> String {
    format!("{}:{port}", host(ip))
}

/// What one curl run gave.
#[derive(Debug, Clone)]
pub struct Curl {
    /// curl's exit status: 0 success, 28 timeout, 7 refused…
    pub exit: i32,
    /// HTTP status, 0 when there was no response.
    pub code: u16,
    pub body: String,
    pub stderr: String,
}

impl Curl {
    pub fn ok(&self) -> bool {
        self.exit == 0 && self.code == 200
    }

    /// `(backend, peer)` of a `/peer` answer.
    pub fn who(&self) -> Option<(String, String)> {
        let (name, peer) = self.body.trim().split_once(' ')?;
        Some((name.to_owned(), peer.to_owned()))
    }
}

/// Options of a curl run.
#[derive(Clone, Copy, Debug)]
pub struct CurlOpts<'a> {
    /// Source address (`--interface`), for the client's second address.
    pub source: Option<&'a str>,
    /// `--max-time`, seconds.
    pub max_time: f64,
    /// Run inside the agent's cgroup (socket LB applies).
    pub cgroup: bool,
    /// `--local-port`, so a test knows the flow's tuple in conntrack.
    pub local_port: Option<u16>,
}

impl Default for CurlOpts<'_> {
    fn default() -> Self {
        Self {
            source: None,
            max_time: 3.0,
            cgroup: false,
            local_port: None,
        }
    }
}

impl PacketTopology {
    /// Runs `program` in `ns`, inside the cgroup if `cgroup`.
    fn run_in(&self, ns: Ns, program: &str, cgroup: bool) -> Command {
        if cgroup {
            self.cgroup_command(ns, program)
        } else {
            self.command(ns, program)
        }
    }

    /// `curl http://<url>` from `ns`; `url` is everything after `http://`.
    pub fn curl(&self, ns: Ns, url: &str, opts: CurlOpts<'_>) -> Result<Curl> {
        let mut cmd = self.run_in(ns, "curl", opts.cgroup);
        cmd.args(["-sS", "-g", "--no-buffer", "-w", "\n%{http_code}"])
            .args(["--max-time", &opts.max_time.to_string()])
            .args(["--connect-timeout", &opts.max_time.to_string()]);
        if let Some(src) = opts.source {
            cmd.args(["--interface", src]);
        }
        if let Some(port) = opts.local_port {
            cmd.args(["--local-port", &port.to_string()]);
        }
        let out = cmd.arg(format!("http://{url}")).output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok(Curl {
            exit: out.status.code().unwrap_or(-1),
            code: code.trim().parse().unwrap_or(0),
            body: body.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// `GET /peer` on `ip:port` from `ns`: the backend's name and the source
    /// address it saw, or the failed run.
    pub fn who_tcp(&self, ns: Ns, ip: &str, port: u16) -> Result<Curl> {
        self.curl(
            ns,
            &format!("{}/peer", target(ip, port)),
            CurlOpts::default(),
        )
    }

    /// `dig +short -p port @server weir.test qtype` from `ns`: the first answer,
    /// which names the pod that served it.
    pub fn dig(&self, ns: Ns, server: &str, port: u16, qtype: &str) -> Result<Option<String>> {
        dig(self, ns, server, port, qtype)
    }

    /// As [`Self::dig`], from source address `source`.
    pub fn dig_from(
        &self,
        ns: Ns,
        source: &str,
        server: &str,
        port: u16,
    ) -> Result<Option<String>> {
        let out = self
            .command(ns, "dig")
            .args(dig_args(server, port, "A"))
            .args(["-b", source])
            .output()?;
        Ok(first_line(&out.stdout))
    }

    /// `weir-testclient MODE --target T --count N [extra]` in `ns`.
    pub fn probe(
        &self,
        ns: Ns,
        cgroup: bool,
        mode: &str,
        target: &str,
        count: u32,
        extra: &[&str],
    ) -> Result<Probe> {
        let program = bin("weir-testclient");
        let mut cmd = if cgroup {
            self.cgroup_command(ns, &program)
        } else {
            self.command(ns, &program)
        };
        let out = cmd
            .args([mode, "--target", target, "--count", &count.to_string()])
            .args(extra)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).with_context(|| {
            format!(
                "weir-testclient output {text:?}, stderr {:?}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// One UDP datagram `peer` to `ip:port` from `ns`: `(backend, source seen)`.
    pub fn who_udp(&self, ns: Ns, ip: &str, port: u16) -> Result<Option<(String, String)>> {
        let p = self.probe(
            ns,
            false,
            "udp",
            &target(ip, port),
            1,
            &["--payload", "peer"],
        )?;
        // The answer must come from the address asked: translated back.
        anyhow::ensure!(
            p.peer_mismatch == 0,
            "UDP answer to {} came from another address: {p:?}",
            target(ip, port)
        );
        Ok(p.backends.keys().next().and_then(|k| {
            let (n, peer) = k.split_once(' ')?;
            Some((n.to_owned(), peer.to_owned()))
        }))
    }

    /// Pings `ip` once from `ns`.
    pub fn ping(&self, ns: Ns, ip: &str) -> bool {
        let ip: IpAddr = match ip.parse() {
            Ok(ip) => ip,
            Err(_) => return false,
        };
        self.command(ns, "ping")
            .args(["-c", "1", "-W", "2"])
            .arg(ip.to_string())
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

fn dig_args(server: &str, port: u16, qtype: &str) -> Vec<String> {
    vec![
        "+short".into(),
        "+tries=1".into(),
        "+time=2".into(),
        "-p".into(),
        port.to_string(),
        format!("@{server}"),
        "weir.test".into(),
        qtype.into(),
    ]
}

fn first_line(stdout: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().next()?.trim();
    // dig +short prints ";; …" comments on failure.
    (!line.is_empty() && !line.starts_with(';')).then(|| line.to_owned())
}

pub(super) fn dig(
    topo: &PacketTopology,
    ns: Ns,
    server: &str,
    port: u16,
    qtype: &str,
) -> Result<Option<String>> {
    let out = topo
        .command(ns, Path::new("dig"))
        .args(dig_args(server, port, qtype))
        .output()?;
    Ok(first_line(&out.stdout))
}

/// What `weir-testclient` reported.
#[derive(Debug, Default, Deserialize)]
pub struct Probe {
    pub attempts: u32,
    pub ok: u32,
    pub backends: BTreeMap<String, u32>,
    pub errors: BTreeMap<String, u32>,
    pub peer_mismatch: u32,
    pub max_error_ms: u64,
    #[serde(default)]
    pub sequence: Vec<String>,
}
