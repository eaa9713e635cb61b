//! Rulesets that reproduce kube-proxy's iptables and nftables layouts, so the
//! datapath bench compares Weir against the exact chains kube-proxy would have
//! programmed for the same Services. Generation is pure string building; the
//! loaders only ever run the tools inside a network namespace given by path.
//!
//! The layouts are those of recent kube-proxy releases, checked against the
//! expected dumps of its unit tests (see README.md beside `bench/mod.rs` for
//! what is and is not reproduced).

/// Appends string slices: at a million lines, `write!` with addresses costs
/// more than everything else together, so hot lines are built from pieces
/// formatted once per Service.
macro_rules! push {
    ($out:expr, $($piece:expr),+ $(,)?) => {{
        $($out.push_str($piece);)+
    }};
}

pub mod iptables;
pub mod nftables;

use std::{
    fmt,
    io::{self, Write as _},
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
};

use data_encoding::BASE32;
use sha2::{Digest as _, Sha256};

pub use iptables::{
    Sync, Variant, flush_iptables, iptables_restore_input, iptables_save, iptables_update_input,
    load_iptables,
};
pub use nftables::{flush_nft, load_nft, nft_endpoint_update, nft_input, nft_list_ruleset};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    /// Lower case, as kube-proxy puts it into chain names and rules.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

/// One Service port with its ready endpoints, in the order kube-proxy would
/// list them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Svc {
    pub namespace: String,
    pub name: String,
    /// The port's name; empty for an unnamed port.
    pub port_name: String,
    pub vip: Ipv4Addr,
    pub port: u16,
    pub proto: Proto,
    pub endpoints: Vec<(Ipv4Addr, u16)>,
}

impl Svc {
    /// kube-proxy's `ServicePortName.String()`: `ns/name:port`, or `ns/name`
    /// for an unnamed port. Hashes and comments are built from it.
    pub fn port_name_string(&self) -> String {
        if self.port_name.is_empty() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}:{}", self.namespace, self.name, self.port_name)
        }
    }

    /// Same Service port: chain names depend on nothing else.
    pub fn same_port(&self, other: &Self) -> bool {
        self.namespace == other.namespace
            && self.name == other.name
            && self.port_name == other.port_name
            && self.proto == other.proto
    }

    /// Same Service object: the unit kube-proxy's partial syncs rewrite.
    fn same_service(&self, other: &Self) -> bool {
        self.namespace == other.namespace && self.name == other.name
    }
}

/// The cluster (pod) CIDR: kube-proxy masquerades Service traffic whose source
/// is outside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Cidr {
    addr: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Cidr {
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Result<Self, RulesError> {
        if prefix > 32 {
            return Err(RulesError::PrefixTooLong { prefix });
        }
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("a prefix length of {prefix} does not fit an IPv4 address")]
    PrefixTooLong { prefix: u8 },
    #[error("cannot start {program} in {}", netns.display())]
    Spawn {
        program: &'static str,
        netns: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the input of {program} in {}", netns.display())]
    Input {
        program: &'static str,
        netns: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{program} in {} failed ({status}): {stderr}", netns.display())]
    Failed {
        program: &'static str,
        netns: PathBuf,
        status: ExitStatus,
        stderr: String,
    },
}

/// `count` Services `bench/svc-<i>` port `http` 80/TCP on consecutive VIPs from
/// 10.96.0.10, all with the same `endpoints`: the shape the bench programs.
///
/// # Panics
/// When `count` Services do not fit 10.96.0.0/12.
pub fn synthetic(count: usize, endpoints: &[(Ipv4Addr, u16)]) -> Vec<Svc> {
    const FIRST: u32 = u32::from_be_bytes([10, 96, 0, 10]);
    const END: u32 = u32::from_be_bytes([10, 112, 0, 0]);
    assert!(
        count <= (END - FIRST) as usize,
        "{count} Services do not fit 10.96.0.0/12"
    );
    (0..count)
        .map(|i| Svc {
            namespace: "bench".to_owned(),
            name: format!("svc-{i}"),
            port_name: "http".to_owned(),
            vip: Ipv4Addr::from(FIRST + i as u32),
            port: 80,
            proto: Proto::Tcp,
            endpoints: endpoints.to_vec(),
        })
        .collect()
}

/// Appends the first `N` characters of base32(sha256(concatenated `parts`)),
/// kube-proxy's way of turning names into short, stable chain names.
fn push_hash<const N: usize>(out: &mut String, parts: &[&str]) {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
    }
    let digest = h.finalize();
    let mut buf = [0u8; N];
    // Five bytes make exactly eight base32 characters, so no padding appears.
    BASE32.encode_mut(&digest[..N * 5 / 8], &mut buf);
    out.push_str(std::str::from_utf8(&buf).expect("base32 is ASCII"));
}

/// Runs `program` inside the network namespace at `netns` with `input` on its
/// stdin and returns its stdout.
fn run_in_netns(
    netns: &Path,
    program: &'static str,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, RulesError> {
    // nsenter rather than `ip netns exec`, which remounts /sys.
    let mut child = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .arg(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| RulesError::Spawn {
            program,
            netns: netns.to_owned(),
            source,
        })?;
    let stdin = child.stdin.take();
    // The input can be hundreds of megabytes: feed it from another thread so a
    // tool that writes while it reads cannot deadlock against us.
    let (output, written) = std::thread::scope(|s| {
        let writer = stdin
            .zip(input)
            .map(|(mut pipe, text)| s.spawn(move || pipe.write_all(text.as_bytes())));
        let output = child.wait_with_output();
        let written = writer.map_or(Ok(()), |w| w.join().expect("stdin writer panicked"));
        (output, written)
    });
    let output = output.map_err(|source| RulesError::Spawn {
        program,
        netns: netns.to_owned(),
        source,
    })?;
    // A tool that rejects its input exits early and breaks the pipe; its own
    // message says more than the broken pipe does.
    if !output.status.success() {
        return Err(RulesError::Failed {
            program,
            netns: netns.to_owned(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    written.map_err(|source| RulesError::Input {
        program,
        netns: netns.to_owned(),
        source,
    })?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A Service port as kube-proxy's own unit tests write them, port "p80".
    pub(crate) fn kube_proxy_svc(ns: &str, name: &str, vip: [u8; 4], eps: &[[u8; 4]]) -> Svc {
        Svc {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            port_name: "p80".to_owned(),
            vip: vip.into(),
            port: 80,
            proto: Proto::Tcp,
            endpoints: eps.iter().map(|&ip| (ip.into(), 80)).collect(),
        }
    }

    /// Endpoint `d` of the bench-shaped test Services: 10.1.0.d:8080.
    pub(crate) fn ep(d: u8) -> (Ipv4Addr, u16) {
        (Ipv4Addr::new(10, 1, 0, d), 8080)
    }

    /// kube-proxy's test pod CIDR.
    pub(crate) fn pod_cidr() -> Ipv4Cidr {
        Ipv4Cidr::new(Ipv4Addr::new(10, 0, 0, 0), 8).expect("valid")
    }

    #[test]
    fn port_name_string_is_kube_proxys() {
        let mut s = synthetic(1, &[]).remove(0);
        assert_eq!(s.port_name_string(), "bench/svc-0:http");
        s.port_name.clear();
        assert_eq!(s.port_name_string(), "bench/svc-0");
    }

    #[test]
    fn synthetic_vips_are_consecutive_and_distinct() {
        let s = synthetic(3, &[(Ipv4Addr::new(10, 0, 0, 1), 80)]);
        let vips: Vec<_> = s.iter().map(|s| s.vip.to_string()).collect();
        assert_eq!(vips, ["10.96.0.10", "10.96.0.11", "10.96.0.12"]);
        assert_eq!(s[2].endpoints.len(), 1);
    }

    #[test]
    fn cidr_rejects_long_prefixes() {
        assert!(matches!(
            Ipv4Cidr::new(Ipv4Addr::UNSPECIFIED, 33),
            Err(RulesError::PrefixTooLong { prefix: 33 })
        ));
        let c = Ipv4Cidr::new(Ipv4Addr::new(10, 0, 0, 0), 8).expect("valid");
        assert_eq!(c.to_string(), "10.0.0.0/8");
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// `cargo test -p weir-integration --release --lib generation_speed -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement, not a check"]
    fn generation_speed_at_100k_services() {
        let eps = [
            (Ipv4Addr::new(10, 77, 0, 11), 8080),
            (Ipv4Addr::new(10, 77, 0, 12), 8080),
        ];
        let cidr = Ipv4Cidr::new(Ipv4Addr::new(10, 244, 0, 0), 16).expect("valid");
        let svcs = synthetic(100_000, &eps);
        let mut new_last = svcs[svcs.len() - 1].clone();
        new_last.endpoints[1] = (Ipv4Addr::new(10, 77, 0, 13), 8080);
        let mut after = svcs.clone();
        *after.last_mut().expect("services") = new_last.clone();
        let old = &svcs[svcs.len() - 1];
        type Gen<'a> = Box<dyn Fn() -> String + 'a>;
        let runs: [(&str, Gen); 5] = [
            (
                "iptables initial",
                Box::new(|| iptables_restore_input(&svcs, cidr)),
            ),
            (
                "iptables full resync",
                Box::new(|| iptables_update_input(&after, cidr, old, Sync::Full)),
            ),
            (
                "iptables partial sync",
                Box::new(|| iptables_update_input(&after, cidr, old, Sync::Partial)),
            ),
            ("nft initial", Box::new(|| nft_input(&svcs, cidr))),
            (
                "nft endpoint update",
                Box::new(|| nft_endpoint_update(old, &new_last, cidr)),
            ),
        ];
        for (what, generate) in runs {
            let t = std::time::Instant::now();
            let s = generate();
            let d = t.elapsed();
            eprintln!(
                "{what}: {d:?}, {} MB, {} lines",
                s.len() / 1_000_000,
                s.lines().count()
            );
        }
    }
}
