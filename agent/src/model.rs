//! Domain types: what the agent wants the datapath to do, free of Kubernetes wire
//! types and of map layouts. Sources convert into these at the edge; the planner
//! converts them into map entries.
use std::{fmt, net::Ipv4Addr};

/// Namespace and name of a Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceId {
    pub namespace: String,
    pub name: String,
}

impl ServiceId {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

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

/// `VIP:port/proto`: what a client connects to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frontend {
    pub addr: Ipv4Addr,
    pub port: u16,
    pub proto: Protocol,
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}/{}", self.addr, self.port, self.proto)
    }
}

/// Whether a backend takes new connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BackendState {
    /// Ready: chosen for new connections.
    Active,
    /// Terminating but still serving: chosen only when no backend is active.
    Terminating,
}

impl BackendState {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Terminating => "terminating",
        }
    }
}

/// One backend of a frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend {
    pub addr: Ipv4Addr,
    pub port: u16,
    pub state: BackendState,
}

/// What one frontend should look like in the datapath.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    pub frontend: Frontend,
    /// Usable backends only: endpoints that are not serving never get here.
    pub backends: Vec<Backend>,
}

/// A validated Service, as far as load balancing cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    pub id: ServiceId,
    /// IPv4 cluster IPs. Empty for Services that get no frontend (headless).
    pub cluster_ips: Vec<Ipv4Addr>,
    pub ports: Vec<ServicePortSpec>,
    /// `spec.internalTrafficPolicy`: which endpoints ClusterIP traffic may use.
    pub internal_policy: TrafficPolicy,
    /// `spec.externalTrafficPolicy`: kept for the NodePort/LoadBalancer
    /// frontends of the packet datapath; ClusterIP ignores it.
    pub external_policy: TrafficPolicy,
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortSpec {
    /// Empty for the single unnamed port.
    pub name: String,
    pub port: u16,
    pub proto: Protocol,
}

/// Namespace and name of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SliceId {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for SliceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A validated IPv4 EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceSpec {
    pub id: SliceId,
    /// The Service named by the `kubernetes.io/service-name` label.
    pub service: ServiceId,
    pub ports: Vec<SlicePortSpec>,
    pub endpoints: Vec<EndpointSpec>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePortSpec {
    /// Matches [`ServicePortSpec::name`].
    pub name: String,
    pub port: u16,
    pub proto: Protocol,
}

/// One endpoint with its conditions resolved as the API defines their defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSpec {
    pub addrs: Vec<Ipv4Addr>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// `nodeName`: the endpoint is local when it names this agent's node.
    pub node_name: Option<String>,
    /// `hints.forZones[].name`, set by the EndpointSlice controller for
    /// topology-aware routing and `trafficDistribution: PreferClose`.
    pub zone_hints: Vec<String>,
    /// `hints.forNodes[].name` (`trafficDistribution: PreferSameNode`).
    pub node_hints: Vec<String>,
}

impl EndpointSpec {
    /// The state the datapath gives this endpoint, or `None` when it must never be
    /// chosen (`serving: false`).
    pub const fn backend_state(&self) -> Option<BackendState> {
        // As kube-proxy: ready endpoints serve; without any, the ones that are
        // serving while terminating do (KEP-1669).
        // `serving: false` never gets traffic, whatever `ready` says.
        if !self.serving {
            None
        } else if self.ready {
            Some(BackendState::Active)
        } else if self.terminating {
            Some(BackendState::Terminating)
        } else {
            None
        }
    }
}
