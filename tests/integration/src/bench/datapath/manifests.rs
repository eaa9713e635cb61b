//! The Weir labs' manifests: one file per Service, as a GitOps tree would
//! hold them.
use std::{fmt::Write as _, net::Ipv4Addr, path::Path};

use anyhow::Result;

use crate::bench::rules::{Proto, Svc};

/// How a Service presents the VIP the lab's clients connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frontend {
    /// As its cluster IP.
    ClusterIp,
    /// As an external IP (the cluster IP moves to 100.x.y.z), so the
    /// per-packet programs treat the traffic as from outside: SNAT, and
    /// Maglev when asked for.
    ExternalIp { maglev: bool },
}

pub fn write_all(dir: &Path, svcs: &[Svc], frontend: Frontend) -> Result<()> {
    let mut out = String::new();
    for (i, s) in svcs.iter().enumerate() {
        out.clear();
        text(&mut out, s, &s.endpoints, frontend);
        std::fs::write(dir.join(format!("svc-{i:06}.yaml")), &out)?;
    }
    Ok(())
}

pub fn text(out: &mut String, s: &Svc, endpoints: &[(Ipv4Addr, u16)], frontend: Frontend) {
    let proto = match s.proto {
        Proto::Tcp => "TCP",
        Proto::Udp => "UDP",
    };
    let port = endpoints.first().map_or(s.port, |e| e.1);
    let (cluster_ip, extra, annotations) = match frontend {
        Frontend::ClusterIp => (s.vip, String::new(), ""),
        Frontend::ExternalIp { maglev } => {
            let [_, b, c, d] = s.vip.octets();
            (
                Ipv4Addr::new(100, b, c, d),
                format!("  externalIPs: [\"{}\"]\n", s.vip),
                if maglev {
                    ", annotations: {weir.dev/lb-algorithm: maglev}"
                } else {
                    ""
                },
            )
        }
    };
    let _ = write!(
        out,
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}{annotations}}}\nspec:\n  clusterIP: {cluster_ip}\n{extra}  ports: [{{name: {pn}, port: {p}, protocol: {proto}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: {pn}, port: {port}, protocol: {proto}}}]\nendpoints:\n",
        name = s.name,
        ns = s.namespace,
        pn = s.port_name,
        p = s.port,
    );
    for (ip, _) in endpoints {
        let _ = writeln!(out, "- addresses: [\"{ip}\"]");
    }
}
