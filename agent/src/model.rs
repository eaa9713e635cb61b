//! Domain types: what the agent wants the datapath to do, free of Kubernetes wire
//! types and of map layouts. Sources convert into these at the edge; the planner
//! converts them into map entries.
use std::{fmt, net::IpAddr, sync::Arc};

mod names;

pub use names::{QualifiedName, ServiceId, SliceId};

/// Transport protocol of a Service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses the Kubernetes spelling (`TCP`, `UDP`, `SCTP`).
    pub fn from_k8s(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    pub const fn ip_proto(self) -> u8 {
        match self {
            Self::Tcp => weir_abi::PROTO_TCP,
            Self::Udp => weir_abi::PROTO_UDP,
            Self::Sctp => weir_abi::PROTO_SCTP,
        }
    }

    pub const fn from_ip_proto(proto: u8) -> Option<Self> {
        match proto {
            weir_abi::PROTO_TCP => Some(Self::Tcp),
            weir_abi::PROTO_UDP => Some(Self::Udp),
            weir_abi::PROTO_SCTP => Some(Self::Sctp),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which clients a frontend's map entries serve (the services-map key's
/// `scope`).
///
/// An `externalTrafficPolicy: Local` frontend is two frontends in the maps:
/// [`Scope::All`] with every endpoint, for clients inside the cluster (pods and
/// the node itself, which kube-proxy sends to any endpoint even for external
/// destinations), and [`Scope::External`] with only this node's endpoints,
/// which the packet programs use for traffic from outside. Each has its own
/// entries, rev-NAT id and backend ids. Every other frontend is `All` only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    #[default]
    All,
    External,
}

impl Scope {
    /// The ABI value (`weir_abi::SCOPE_*`).
    pub const fn abi(self) -> u8 {
        match self {
            Self::All => weir_abi::SCOPE_ALL,
            Self::External => weir_abi::SCOPE_EXTERNAL,
        }
    }

    pub const fn from_abi(scope: u8) -> Option<Self> {
        match scope {
            weir_abi::SCOPE_ALL => Some(Self::All),
            weir_abi::SCOPE_EXTERNAL => Some(Self::External),
            _ => None,
        }
    }
}

/// `VIP:port/proto` in one scope: what a client connects to, and which view
/// of it the datapath uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frontend {
    /// IPv4 or IPv6; the frontend's family is this address's family.
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Protocol,
    /// Last, so that both scopes of one address sort next to each other.
    pub scope: Scope,
}

impl Frontend {
    /// A [`Scope::All`] frontend.
    pub const fn new(addr: IpAddr, port: u16, proto: Protocol) -> Self {
        Self {
            addr,
            port,
            proto,
            scope: Scope::All,
        }
    }

    /// The same address, port and protocol in `scope`.
    pub const fn in_scope(self, scope: Scope) -> Self {
        Self { scope, ..self }
    }
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `SocketAddr` brackets IPv6 (`[::1]:80`), so the port stays unambiguous.
        write!(
            f,
            "{}/{}",
            std::net::SocketAddr::new(self.addr, self.port),
            self.proto
        )?;
        match self.scope {
            Scope::All => Ok(()),
            Scope::External => f.write_str(" (external scope)"),
        }
    }
}

/// Whether a backend takes new connections. Ordered from most to least
/// usable: an endpoint seen twice (two slices during a rebalance) keeps the
/// smaller state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BackendState {
    /// Ready: chosen for new connections.
    Active,
    /// Terminating but still serving: chosen only when no backend is active.
    Terminating,
    /// Terminating and no longer serving (`serving: false, terminating:
    /// true`, a pod in graceful shutdown): never chosen for anything new, but
    /// kept in the backends map (in no slot, `BACKEND_STATE_DRAINING`) so that
    /// flows conntrack already tracks to it finish instead of being
    /// re-balanced mid-stream. Gone once the endpoint leaves its slice.
    Draining,
}

impl BackendState {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Terminating => "terminating",
            Self::Draining => "draining",
        }
    }

    /// Whether new connections may use it (it has a slot): active, or
    /// terminating as the fallback. Draining backends do not serve.
    pub const fn serves(self) -> bool {
        matches!(self, Self::Active | Self::Terminating)
    }
}

/// One backend of a frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend {
    /// Always the family of the frontend it belongs to.
    pub addr: IpAddr,
    pub port: u16,
    pub state: BackendState,
}

/// Which of a Service's addresses a frontend serves; decides its datapath flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKind {
    /// A cluster IP: reached from inside the cluster only.
    #[default]
    ClusterIp,
    /// A node address and a `nodePort`.
    NodePort,
    /// A `spec.externalIPs` address.
    ExternalIp,
    /// A `status.loadBalancer.ingress[].ip`.
    LoadBalancer,
}

impl FrontendKind {
    /// Reached from outside the cluster: `externalTrafficPolicy` applies.
    pub const fn is_external(self) -> bool {
        !matches!(self, Self::ClusterIp)
    }
}

/// What one frontend should look like in the datapath.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    pub frontend: Frontend,
    /// Serving backends ([`BackendState::Active`], [`BackendState::Terminating`])
    /// and draining ones ([`BackendState::Draining`]: in the backends map for
    /// their tracked flows, in no slot). Endpoints neither serving nor
    /// terminating never get here.
    pub backends: Vec<Backend>,
    pub kind: FrontendKind,
    /// `externalTrafficPolicy: Local` on an external frontend (flag
    /// `SVC_F_LOCAL`), set on both of its scopes: the [`Scope::All`] one has
    /// the cluster-wide endpoints, for in-cluster clients, and tells the
    /// packet programs to use the [`Scope::External`] one, whose `backends`
    /// are this node's only and where the datapath keeps the client address.
    pub local: bool,
    /// `sessionAffinity: ClientIP` timeout in seconds (1..=86400).
    pub affinity: Option<u32>,
    /// `loadBalancerSourceRanges` of the frontend's family; non-empty only on
    /// load-balancer frontends. Empty means every client is admitted.
    pub source_ranges: Vec<Cidr>,
    /// The Maglev table size when new flows from outside pick by Maglev
    /// (external frontends only; on an eTP=Local frontend only its
    /// [`Scope::External`] view, the one packets pick from).
    pub maglev: Option<u32>,
    /// The Service port's name (empty for a single unnamed port), for the
    /// labels `inspect` shows; nothing in the datapath depends on it.
    pub port_name: Arc<str>,
}

impl DesiredFrontend {
    /// A ClusterIP-like frontend with no options, for tests and refusals.
    pub fn plain(frontend: Frontend, backends: Vec<Backend>) -> Self {
        Self {
            frontend,
            backends,
            kind: FrontendKind::ClusterIp,
            local: false,
            affinity: None,
            source_ranges: Vec::new(),
            maglev: None,
            port_name: Arc::from(""),
        }
    }
}

/// An IP prefix such as `10.0.0.0/8` or `2001:db8::/32`, host bits cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `addr/len` as Go's `net.ParseCIDR` (which kube-proxy uses): host
    /// bits are allowed and cleared; surrounding whitespace is ignored.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, len) = s.trim().split_once('/')?;
        let addr: IpAddr = addr.parse().ok()?;
        // Only plain decimal: `+8` or `08` are not prefix lengths.
        if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let prefix: u8 = len.parse().ok()?;
        Self::new(addr, prefix)
    }

    /// `None` when `prefix` is longer than the address.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let addr = match addr {
            IpAddr::V4(a) if prefix <= 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) if prefix <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
            _ => return None,
        };
        Some(Self { addr, prefix })
    }

    pub const fn addr(&self) -> IpAddr {
        self.addr
    }

    pub const fn prefix(&self) -> u8 {
        self.prefix
    }

    pub const fn family(&self) -> IpFamily {
        IpFamily::of(&self.addr)
    }

    /// Whether `ip` is inside the range (never across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        Self::new(ip, self.prefix).is_some_and(|c| c.addr == self.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// `spec.type`, as far as frontends go (ExternalName Services get none and
/// convert to a spec without cluster IPs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceType {
    #[default]
    ClusterIp,
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    /// NodePort and LoadBalancer Services have node ports. (Whether
    /// `externalTrafficPolicy` applies is wider: see
    /// [`ServiceSpec::external_policy`].)
    pub const fn has_node_ports(self) -> bool {
        matches!(self, Self::NodePort | Self::LoadBalancer)
    }
}

/// A validated Service, as far as load balancing cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceSpec {
    // Lists are boxed slices, never grown once converted: a `Vec`'s capacity
    // word is 40 bytes a Service over these five (100k Services, 4 MB).
    pub id: ServiceId,
    /// `metadata.creationTimestamp` in Unix seconds: the older of two Services
    /// that ask for the same node port keeps it.
    pub created: Option<i64>,
    pub kind: ServiceType,
    /// Cluster IPs of either family (`spec.clusterIPs`, primary first). Empty
    /// for Services that get no frontend (headless).
    pub cluster_ips: Box<[IpAddr]>,
    pub ports: Box<[ServicePortSpec]>,
    /// `spec.internalTrafficPolicy`: which endpoints ClusterIP traffic may use.
    pub internal_policy: TrafficPolicy,
    /// `spec.externalTrafficPolicy`: which endpoints the external frontends
    /// (node ports, external IPs, load-balancer IPs) may use for traffic from
    /// outside the cluster. `Cluster` unless the Service is externally
    /// accessible in kube-proxy's sense (`ExternalPolicyLocal`): type NodePort
    /// or LoadBalancer, or a ClusterIP Service with external IPs.
    pub external_policy: TrafficPolicy,
    /// `spec.externalIPs`, in spec order (errors name them by index).
    pub external_ips: Box<[IpAddr]>,
    /// `status.loadBalancer.ingress[].ip` of a LoadBalancer Service, except
    /// `ipMode: Proxy` ones (the load balancer proxies, nodes never see the IP).
    pub lb_ips: Box<[IpAddr]>,
    /// `spec.loadBalancerSourceRanges` (or its annotation): who may use the
    /// load-balancer IPs; empty admits everyone.
    pub source_ranges: Box<[Cidr]>,
    /// `spec.healthCheckNodePort` of a LoadBalancer Service with
    /// `externalTrafficPolicy: Local`.
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP` timeout in seconds (1..=86400).
    pub affinity: Option<u32>,
    /// The [`ANNOTATION_LB_ALGORITHM`] annotation, when it names one; the
    /// agent's `--lb-algorithm` otherwise.
    pub lb_algorithm: Option<LbAlgorithm>,
}

/// Per-Service override of `--lb-algorithm` for the external frontends.
pub const ANNOTATION_LB_ALGORITHM: &str = "weir.dev/lb-algorithm";

/// How the packet programs pick a backend for a new flow from outside.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LbAlgorithm {
    /// Uniformly at random among the usable backends.
    #[default]
    Random,
    /// From the frontend's Maglev table: the same backend for a flow on
    /// every node.
    Maglev,
}

impl LbAlgorithm {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "random" => Some(Self::Random),
            "maglev" => Some(Self::Maglev),
            _ => None,
        }
    }
}

/// The agent's load-balancing settings for external frontends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbOptions {
    /// `--lb-algorithm`: for Services without the annotation.
    pub algorithm: LbAlgorithm,
    /// `--maglev-table-size`: a prime.
    pub maglev_table_size: u32,
}

impl Default for LbOptions {
    fn default() -> Self {
        Self {
            algorithm: LbAlgorithm::Random,
            maglev_table_size: weir_abi::maglev::DEFAULT_TABLE_SIZE,
        }
    }
}

impl ServiceSpec {
    /// The families the Service is served in: those of its cluster IPs. A
    /// family without a cluster IP gets no frontend of any kind, as each of
    /// kube-proxy's per-family proxiers skips a Service without a cluster IP of
    /// its family.
    pub fn families(&self) -> Vec<IpFamily> {
        let mut out = Vec::new();
        for ip in &self.cluster_ips {
            let f = IpFamily::of(ip);
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }
}

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub const fn of(addr: &IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// The Kubernetes spelling (`IPv4`, `IPv6`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `Cluster` (any endpoint) or `Local` (only endpoints on this node).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// What the agent knows of the node it runs on: endpoints on it are local, and
/// its zone decides which topology hints apply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The `topology.kubernetes.io/zone` label, once the Node has been read.
    pub zone: Option<String>,
    /// The node's own addresses (global scope, both families, of every
    /// interface): an external IP must not be one of them.
    pub addresses: Vec<IpAddr>,
    /// The Node object's primary addresses (its first InternalIP per
    /// family, else ExternalIP), once read: `--nodeport-addresses primary`.
    pub primary_ips: Vec<IpAddr>,
    /// Where NodePort frontends live: `addresses` as `--nodeport-addresses`
    /// selects them. The store derives it; a source leaves it empty.
    pub node_ports: Vec<IpAddr>,
}

/// `--nodeport-addresses` (kube-proxy's `nodePortAddresses`): which of the
/// node's addresses NodePorts listen on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every address (kube-proxy's default in iptables and ipvs modes).
    #[default]
    All,
    /// Those inside any of the ranges; a family without a range gets none.
    Cidrs(Vec<Cidr>),
    /// The Node object's primary addresses (kube-proxy's `primary`, the
    /// nftables mode's default).
    Primary,
}

impl NodePortAddresses {
    /// Parses the flag's values as kube-proxy validates them: CIDRs, or
    /// `primary` alone; none means every address.
    pub fn parse(values: &[String]) -> Result<Self, String> {
        if values.is_empty() {
            return Ok(Self::All);
        }
        if values.iter().any(|v| v == "primary") {
            return if values.len() == 1 {
                Ok(Self::Primary)
            } else {
                Err("\"primary\" must be the only value".into())
            };
        }
        values
            .iter()
            .map(|v| {
                Cidr::parse(v).ok_or_else(|| {
                    format!("{v:?} is neither a CIDR such as 10.0.0.0/8 nor \"primary\"")
                })
            })
            .collect::<Result<_, _>>()
            .map(Self::Cidrs)
    }

    /// The addresses of `addresses` NodePorts listen on. `primary` counts
    /// only where the node really has the address: a frontend elsewhere
    /// would never see a packet.
    pub fn select(&self, addresses: &[IpAddr], primary: &[IpAddr]) -> Vec<IpAddr> {
        addresses
            .iter()
            .copied()
            .filter(|ip| match self {
                Self::All => true,
                Self::Cidrs(cidrs) => cidrs.iter().any(|c| c.contains(*ip)),
                Self::Primary => primary.contains(ip),
            })
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortSpec {
    /// Empty for the single unnamed port. Shared ([`crate::intern`]): a
    /// handful of names (`http`, `dns`, …) serve every Service.
    pub name: Arc<str>,
    pub port: u16,
    pub proto: Protocol,
    /// `nodePort`, kept only for NodePort and LoadBalancer Services.
    pub node_port: Option<u16>,
}

/// A validated IPv4 or IPv6 EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceSpec {
    pub id: SliceId,
    /// The Service named by the `kubernetes.io/service-name` label.
    pub service: ServiceId,
    /// `addressType`: every address in `endpoints` is of this family. As in
    /// kube-proxy, a frontend takes backends only from slices of its family.
    pub family: IpFamily,
    pub ports: Box<[SlicePortSpec]>,
    pub endpoints: Box<[EndpointSpec]>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePortSpec {
    /// Matches [`ServicePortSpec::name`]; shared as it is.
    pub name: Arc<str>,
    pub port: u16,
    pub proto: Protocol,
}

/// One endpoint with its conditions resolved as the API defines their defaults.
///
/// Held a million times at 100k Services, so laid out for the common case:
/// one address inline and everything else behind one pointer to a copy
/// shared by every endpoint that says the same (32 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSpec {
    /// The first address; all are of the slice's family.
    pub addr: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Node, further addresses and hints, when there are any: the shared
    /// copy ([`crate::intern`]).
    pub meta: Option<Arc<EndpointMeta>>,
}

// A million of them at 100k Services: every byte here is a megabyte.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<EndpointSpec>() == 32);

/// An endpoint's node, its addresses after the first, and its hints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointMeta {
    /// `nodeName`: the endpoint is local when it names this agent's node.
    pub node_name: Option<Arc<str>>,
    /// Addresses after the first (the API calls them fungible and consumers
    /// may use only the first).
    pub more_addrs: Vec<IpAddr>,
    /// `hints.forZones[].name`, set by the EndpointSlice controller for
    /// topology-aware routing and `trafficDistribution: PreferClose`.
    pub zone_hints: Vec<String>,
    /// `hints.forNodes[].name` (`trafficDistribution: PreferSameNode`).
    pub node_hints: Vec<String>,
}

impl EndpointMeta {
    /// The shared copy, or `None` when there is nothing in it.
    pub fn shared(self) -> Option<Arc<Self>> {
        (self != Self::default()).then(|| crate::intern::endpoint_meta(self))
    }
}

impl EndpointSpec {
    /// A ready endpoint at one address, on no node and without hints.
    pub const fn ready(addr: IpAddr) -> Self {
        Self {
            addr,
            ready: true,
            serving: true,
            terminating: false,
            meta: None,
        }
    }

    /// Every address, the first first.
    pub fn addrs(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let more = self.meta.as_deref().map_or(&[][..], |e| &e.more_addrs);
        std::iter::once(self.addr).chain(more.iter().copied())
    }

    /// Changes what [`Self::meta`] says, keeping it shared.
    pub fn edit_meta(&mut self, edit: impl FnOnce(&mut EndpointMeta)) {
        let mut meta = self.meta.as_deref().cloned().unwrap_or_default();
        edit(&mut meta);
        self.meta = meta.shared();
    }

    pub fn node_name(&self) -> Option<&str> {
        self.meta.as_deref().and_then(|m| m.node_name.as_deref())
    }

    pub fn zone_hints(&self) -> &[String] {
        self.meta.as_deref().map_or(&[], |e| &e.zone_hints)
    }

    pub fn node_hints(&self) -> &[String] {
        self.meta.as_deref().map_or(&[], |e| &e.node_hints)
    }

    /// The state the datapath gives this endpoint, or `None` when it has no
    /// place there at all (not serving and not terminating: a pod that is not
    /// ready yet, or failed its readiness probe).
    pub const fn backend_state(&self) -> Option<BackendState> {
        // As kube-proxy: ready endpoints serve; without any, the ones that are
        // serving while terminating do (KEP-1669).
        // `serving: false` never gets new traffic, whatever `ready` says; if
        // it is terminating it drains: the flows it has keep going (Cilium
        // keeps such backends for existing connections too).
        if !self.serving {
            if self.terminating {
                Some(BackendState::Draining)
            } else {
                None
            }
        } else if self.ready {
            Some(BackendState::Active)
        } else if self.terminating {
            Some(BackendState::Terminating)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parses_like_go_and_clears_host_bits() {
        let c = Cidr::parse(" 10.1.2.3/8 ").unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert_eq!(c.family(), IpFamily::V4);
        assert_eq!(Cidr::parse("0.0.0.0/0").unwrap().prefix(), 0);
        assert_eq!(
            Cidr::parse("2001:db8::1/32").unwrap().to_string(),
            "2001:db8::/32"
        );
        assert!(c.contains("10.200.0.1".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::ffff:10.0.0.1".parse().unwrap()));
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "x/8",
            "::/129",
            "1.2.3.4/8/9",
        ] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
    }
}
