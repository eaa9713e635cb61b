//! Helpers shared by the packet-datapath tests.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use weir_integration::{
    bin,
    client_stream::ClientStream,
    packet_topology::{
        NODE_EXT4, NODE_EXT6, Ns, PacketAgent, PacketTopology, Pod,
        clients::{Curl, CurlOpts, Probe, target},
        manifests::{
            DNS_PORT, ECHO_PORT, Ep, HTTP_PORT, READY, Svc, service_per_family, service_with,
        },
    },
};

/// How long a change may take to reach the maps, or a path to start
/// answering. Generous: the tests run in parallel on few cores.
pub const SETTLE: Duration = Duration::from_secs(10);

/// Whether this kernel lets XDP programs call `bpf_xdp_adjust_meta`, as the
/// agent's loader probes it. Without it, XDP hands the flows it would mark
/// for TC (SNAT) to TC untranslated, and TC translates them.
pub fn xdp_meta() -> bool {
    use aya::{
        programs::ProgramType,
        sys::{BpfHelper, is_helper_supported},
    };
    is_helper_supported(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_adjust_meta).unwrap_or(true)
}

/// The XDP counter a new SNAT flow through XDP adds to: its own new flow,
/// or, without `bpf_xdp_adjust_meta`, the hand-off to TC.
pub fn xdp_snat_flow_counter() -> u32 {
    if xdp_meta() {
        weir_abi::STAT_NEW_FLOW
    } else {
        weir_abi::STAT_XDP_TO_TC
    }
}

/// What is still there of a dropped topology: namespaces, the cgroup, the
/// bpffs mount or the work directory.
pub fn leftovers(netns: &[String], cgroup: &Path, pin: &Path, dir: &Path) -> Vec<String> {
    let mut left = Vec::new();
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for n in netns {
        if list.lines().any(|l| l.split_whitespace().next() == Some(n)) {
            left.push(format!("netns {n}"));
        }
    }
    if cgroup.exists() {
        left.push(format!("cgroup {}", cgroup.display()));
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == pin.to_str())
    {
        left.push(format!("mount {}", pin.display()));
    }
    if dir.exists() {
        left.push(format!("dir {}", dir.display()));
    }
    left
}

/// Polls `f` every 100 ms until it returns `Ok`, or fails after `timeout`
/// with `what` and the last value seen.
pub fn poll<T, D: std::fmt::Debug>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<std::result::Result<T, D>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match f()? {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() > deadline => {
                bail!("{what}: not within {timeout:?}; last: {last:?}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Writes `svc` and its slices of `eps` as `<name>.yaml`.
pub fn publish(topo: &PacketTopology, svc: &Svc, eps: &[Ep]) -> Result<()> {
    topo.write_manifest(&format!("{}.yaml", svc.name), &service_with(svc, eps))
}

/// As [`publish`], with other endpoints in each family.
pub fn publish_per_family(topo: &PacketTopology, svc: &Svc, v4: &[Ep], v6: &[Ep]) -> Result<()> {
    topo.write_manifest(
        &format!("{}.yaml", svc.name),
        &service_per_family(svc, v4, v6),
    )
}

/// A frontend a client outside the node can use.
#[derive(Clone, Debug)]
pub struct Frontend {
    /// "NodePort", "ExternalIP" or "LB IP", for messages.
    pub kind: &'static str,
    pub ip: String,
    pub v6: bool,
    /// Ports of http, echo and dns on this frontend.
    pub ports: [u16; 3],
}

impl Frontend {
    pub fn tcp(&self) -> String {
        target(&self.ip, self.ports[0])
    }
}

/// Every external frontend of a dual-stack NodePort/LoadBalancer `svc`, both
/// families: the NodePort on the node's client-side address, each
/// externalIP and each load-balancer IP.
pub fn external_frontends(svc: &Svc) -> Vec<Frontend> {
    let mut out = Vec::new();
    if let Some(np) = svc.node_ports {
        for (ip, v6) in [(NODE_EXT4, false), (NODE_EXT6, true)] {
            out.push(Frontend {
                kind: "NodePort",
                ip: ip.into(),
                v6,
                ports: np,
            });
        }
    }
    for (kind, ips) in [
        ("ExternalIP", &svc.external_ips),
        ("LB IP", &svc.lb_ingress),
    ] {
        for ip in ips {
            out.push(Frontend {
                kind,
                ip: ip.clone(),
                v6: ip.contains(':'),
                ports: [HTTP_PORT, ECHO_PORT, DNS_PORT],
            });
        }
    }
    out
}

/// `GET /peer` through a frontend from `ns`: `(backend, source it saw)`,
/// failing with the whole curl run if it did not answer.
pub fn who(topo: &PacketTopology, ns: Ns, ip: &str, port: u16) -> Result<(String, String)> {
    let c: Curl = topo.who_tcp(ns, ip, port)?;
    match c.who() {
        Some(w) if c.ok() => Ok(w),
        _ => bail!("curl {} from {ns:?}: {c:?}", target(ip, port)),
    }
}

/// Waits until `GET /peer` on `ip:port` from `ns` answers: the agent has
/// programmed the frontend (the first sync may still be landing).
pub fn serving(topo: &PacketTopology, ns: Ns, ip: &str, port: u16) -> Result<(String, String)> {
    serving_with(topo, ns, ip, port, CurlOpts::default())
}

/// As [`serving`], with curl options (a source address, the agent's cgroup).
pub fn serving_with(
    topo: &PacketTopology,
    ns: Ns,
    ip: &str,
    port: u16,
    opts: CurlOpts<'_>,
) -> Result<(String, String)> {
    let url = format!("{}/peer", target(ip, port));
    poll(
        SETTLE,
        &format!("an answer on {url} from {ns:?} ({opts:?})"),
        || {
            let c = topo.curl(ns, &url, opts)?;
            Ok(match c.who() {
                Some(w) if c.ok() => Ok(w),
                _ => Err(c),
            })
        },
    )
}

/// The pod whose dnsmasq answered `answer` (its IPv4 address).
pub fn pod_of_dns(answer: &str, pods: &[Pod]) -> Option<&'static str> {
    pods.iter().find(|p| p.v4 == answer).map(|p| p.name)
}

/// Fails with the agent's log if the agent has exited.
pub fn alive(agent: &mut PacketAgent) -> Result<()> {
    if !agent.is_running() {
        bail!("weir-agent exited:\n{}", agent.log_text());
    }
    Ok(())
}

/// Every view of frontend `vip:port/protocol` in `inspect services -o json`:
/// one, or two for an externalTrafficPolicy Local frontend once the agent
/// lists its external-scope entries (`weir_abi::SCOPE_EXTERNAL`) too.
pub fn frontend_views(
    agent: &PacketAgent,
    vip: &str,
    port: u16,
    protocol: &str,
) -> Result<Vec<serde_json::Value>> {
    let all = agent.inspect("services")?;
    Ok(all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["vip"] == vip && v["port"] == port && v["protocol"] == protocol)
        .cloned()
        .collect())
}

/// Whether `view` is the external-scope view of a frontend.
pub fn is_external_scope(view: &serde_json::Value) -> bool {
    matches!(view.get("scope"), Some(s) if *s == "external" || *s == 1)
}

/// The frontend `vip:port/protocol` as in-cluster clients see it (the view
/// that is not the external scope); an error if that is ambiguous.
pub fn frontend_view(
    agent: &PacketAgent,
    vip: &str,
    port: u16,
    protocol: &str,
) -> Result<Option<serde_json::Value>> {
    let mut views: Vec<_> = frontend_views(agent, vip, port, protocol)?
        .into_iter()
        .filter(|v| !is_external_scope(v))
        .collect();
    ensure!(
        views.len() <= 1,
        "{vip}:{port}/{protocol} is listed {} times, not told apart by scope: {views:?}",
        views.len()
    );
    Ok(views.pop())
}

/// Whether `view`'s `flags` list holds `flag`.
pub fn has_flag(view: &serde_json::Value, flag: &str) -> bool {
    view["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == flag))
}

/// The backends of frontend `vip:port/protocol` as `(address, state)`,
/// sorted; `None` without such a frontend.
pub fn backends(
    agent: &PacketAgent,
    vip: &str,
    port: u16,
    protocol: &str,
) -> Result<Option<Vec<(String, String)>>> {
    Ok(frontend_view(agent, vip, port, protocol)?.map(|v| {
        let mut b: Vec<(String, String)> = v["backends"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| {
                (
                    b["ip"].as_str().unwrap_or_default().to_owned(),
                    b["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        b.sort();
        b
    }))
}

/// Waits until frontend `vip:port/protocol` has exactly the backends `want`
/// (`(address, state)` with state `active` or `terminating`).
pub fn wait_backends(
    agent: &PacketAgent,
    vip: &str,
    port: u16,
    protocol: &str,
    want: &[(&str, &str)],
) -> Result<()> {
    let mut want: Vec<(String, String)> = want
        .iter()
        .map(|(a, s)| ((*a).to_owned(), (*s).to_owned()))
        .collect();
    want.sort();
    poll(
        SETTLE,
        &format!("{vip}:{port}/{protocol} with backends {want:?}"),
        || {
            let got = backends(agent, vip, port, protocol)?;
            Ok(if got.as_ref() == Some(&want) {
                Ok(())
            } else {
                Err(got)
            })
        },
    )
}

/// A `weir-testclient udp-stream` (one connected UDP socket, a send every
/// 100 ms) whose outcomes are collected as they happen.
pub struct UdpStream(ClientStream);

impl UdpStream {
    /// Starts it in `ns`, inside the agent's cgroup if `cgroup`, from source
    /// port `source_port` (0: any).
    pub fn start(
        topo: &PacketTopology,
        ns: Ns,
        cgroup: bool,
        target: &str,
        ms: u64,
        source_port: u16,
    ) -> Result<Self> {
        let mut cmd = if cgroup {
            topo.cgroup_command(ns, bin("weir-testclient"))
        } else {
            topo.command(ns, bin("weir-testclient"))
        };
        cmd.args([
            "udp-stream",
            "--target",
            target,
            "--duration-ms",
            &ms.to_string(),
            "--source-port",
            &source_port.to_string(),
        ])
        .args(["--interval-ms", "100"]);
        ClientStream::spawn(cmd).map(Self)
    }

    /// Every outcome so far: a backend's name or `error:<what>`.
    pub fn seen(&self) -> Vec<String> {
        self.0.seen()
    }

    /// The backend the stream's socket is on: its latest answer, once it has one.
    pub fn backend(&self) -> Result<String> {
        self.0.backend(SETTLE)
    }

    pub fn finish(self) -> Result<Probe> {
        self.0.finish()
    }
}

/// Removes, per family, the backend that family's stream is on (so that no
/// stream can pass by never having been on the removed backend), then checks
/// with [`check_moved`] that each stream left it for the other pod: at most
/// `stale` answers from the removed pod after the maps had the removal, then
/// at most `errors` errors. `frontends[i]` is stream i's `(address, port,
/// v6)`; index 0 is the IPv4 family, 1 the IPv6 one.
pub fn remove_each_streams_backend(
    topo: &PacketTopology,
    agent: &PacketAgent,
    svc: &Svc,
    streams: Vec<UdpStream>,
    frontends: [(&str, u16, bool); 2],
    stale: usize,
    errors: usize,
) -> Result<()> {
    let mut gone = Vec::new();
    for s in &streams {
        let name = s.backend()?;
        gone.push(Pod::named(&name).with_context(|| format!("unknown backend {name:?}"))?);
    }
    let pre: Vec<usize> = streams.iter().map(|s| s.seen().len()).collect();
    publish_per_family(
        topo,
        svc,
        &[Ep::of(gone[0].other(), READY)],
        &[Ep::of(gone[1].other(), READY)],
    )?;
    // Counted once the maps are seen to have the removal: every answer after
    // that was sent after it. Counting before the look would blame answers
    // that arrived while `inspect` ran.
    let mut cuts = [None, None];
    poll(SETTLE, "the removals in the maps", || {
        for (i, (ip, port, v6)) in frontends.into_iter().enumerate() {
            let want = vec![(gone[i].other().addr(v6).to_owned(), "active".to_owned())];
            if cuts[i].is_none() && backends(agent, ip, port, "UDP")? == Some(want) {
                cuts[i] = Some(streams[i].seen().len());
            }
        }
        Ok(if cuts.iter().all(Option::is_some) {
            Ok(())
        } else {
            Err(cuts)
        })
    })?;
    for (i, s) in streams.into_iter().enumerate() {
        let p = s.finish()?;
        check_moved(
            &p.sequence,
            pre[i],
            cuts[i].unwrap_or_default(),
            gone[i].name,
            gone[i].other().name,
            stale,
            errors,
        )
        .with_context(|| format!("stream to {}", target(frontends[i].0, frontends[i].1)))?;
    }
    Ok(())
}

/// Checks that a UDP stream left removed backend `gone` for `other`. `pre`
/// is how many outcomes it had when the removal was published, `cut` how many
/// when the removal was seen in the maps. Before `pre` its latest answer came
/// from `gone` (else the check would be vacuous); from there on: answers from
/// `gone`, of which at most `stale` after `cut` (sends already under way, or
/// the agent still destroying the socket), then at most `errors` errors (the
/// destroyed socket), then from the next send on every answer from `other`,
/// at least ten of them.
pub fn check_moved(
    seq: &[String],
    pre: usize,
    cut: usize,
    gone: &str,
    other: &str,
    stale: usize,
    errors: usize,
) -> Result<()> {
    let pre = pre.min(seq.len());
    let last = seq[..pre].iter().rev().find(|x| !x.starts_with("error:"));
    ensure!(
        last.map(String::as_str) == Some(gone),
        "the stream was not on {gone} when it was removed (at {pre}): {seq:?}"
    );
    let after = &seq[pre..];
    let Some(moved) = after.iter().position(|x| x == other) else {
        bail!("{other} never answered after the removal of {gone} (at {pre}): {seq:?}");
    };
    let (before, rest) = after.split_at(moved);
    let n_gone = before.iter().take_while(|x| *x == gone).count();
    let errs = &before[n_gone..];
    let late = (pre + n_gone).saturating_sub(cut.max(pre));
    ensure!(
        late <= stale && errs.len() <= errors && errs.iter().all(|x| x.starts_with("error:")),
        "between the removal of {gone} and the first answer of {other}: {before:?}, of which {late} \
         answers after the maps had it (allowed: {stale}, then up to {errors} errors); \
         published at {pre}, in the maps at {cut}: {seq:?}"
    );
    ensure!(
        rest.iter().all(|x| x == other),
        "after moving to {other} the stream did not stay there (published at {pre}): {seq:?}"
    );
    ensure!(
        rest.len() >= 10,
        "too few sends after moving to {other} (published at {pre}): {seq:?}"
    );
    Ok(())
}

/// The name of the program behind the device link the agent pinned as
/// `links/<pin>`, as the kernel reports it.
pub fn linked_program(agent: &PacketAgent, pin: &str) -> Result<String> {
    let id = weir_integration::linked_program(&agent.pin_dir().join("links").join(pin))?;
    let prog = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| u64::from(p.id()) == id)
        .ok_or_else(|| anyhow::anyhow!("no program {id}"))?;
    prog.name_as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("program {id} has no name"))
}
