//! The labels map's values: which Service port a rev-NAT id's frontend
//! serves, encoded for the kernel map and decoded for `inspect`.
use serde::Serialize;
use weir_abi::{
    SVC_KIND_CLUSTER_IP, SVC_KIND_EXTERNAL_IP, SVC_KIND_LOAD_BALANCER, SVC_KIND_NODE_PORT,
    SVC_LABEL_TEXT, SvcLabel,
};

use crate::model::{FrontendKind, ServiceId};

/// Longest namespace, Service name and port name kept: API validation caps
/// the first two (DNS labels) at 63 bytes and port names (IANA service
/// names) at 15, so only objects a real API server would refuse (from a
/// hand-written manifest) are cut, at a character boundary.
const MAX_PARTS: [usize; 3] = [63, 63, 15];
const _: () = assert!(MAX_PARTS[0] + MAX_PARTS[1] + MAX_PARTS[2] <= SVC_LABEL_TEXT);

/// The label of a frontend of `service`'s port `port_name` of `kind`.
pub fn encode(service: &ServiceId, port_name: &str, kind: FrontendKind) -> SvcLabel {
    let mut label = SvcLabel {
        kind: match kind {
            FrontendKind::ClusterIp => SVC_KIND_CLUSTER_IP,
            FrontendKind::NodePort => SVC_KIND_NODE_PORT,
            FrontendKind::ExternalIp => SVC_KIND_EXTERNAL_IP,
            FrontendKind::LoadBalancer => SVC_KIND_LOAD_BALANCER,
        },
        ..SvcLabel::default()
    };
    let mut at = 0;
    let mut lens = [0u8; 3];
    let parts = [service.namespace(), service.name(), port_name];
    for ((len, part), max) in lens.iter_mut().zip(parts).zip(MAX_PARTS) {
        let part = truncated(part, max);
        label.text[at..at + part.len()].copy_from_slice(part.as_bytes());
        at += part.len();
        // At most 63.
        *len = u8::try_from(part.len()).unwrap_or(u8::MAX);
    }
    [label.namespace_len, label.name_len, label.port_len] = lens;
    label
}

fn truncated(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A label as `inspect` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LabelView {
    pub namespace: String,
    pub name: String,
    /// Empty for a Service's single unnamed port.
    pub port_name: String,
    /// `ClusterIP`, `NodePort`, `ExternalIP` or `LoadBalancer`, as the
    /// Service fields read.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl LabelView {
    /// `None` for bytes no agent writes (lengths past the text, a kind
    /// it does not know): a map from a different build or damaged.
    pub fn decode(l: &SvcLabel) -> Option<Self> {
        let kind = match l.kind {
            SVC_KIND_CLUSTER_IP => "ClusterIP",
            SVC_KIND_NODE_PORT => "NodePort",
            SVC_KIND_EXTERNAL_IP => "ExternalIP",
            SVC_KIND_LOAD_BALANCER => "LoadBalancer",
            _ => return None,
        };
        let (ns, name, port) = (
            usize::from(l.namespace_len),
            usize::from(l.name_len),
            usize::from(l.port_len),
        );
        let text = l.text.get(..ns + name + port)?;
        let part = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Some(Self {
            namespace: part(&text[..ns]),
            name: part(&text[ns..ns + name]),
            port_name: part(&text[ns + name..]),
            kind,
        })
    }

    /// `namespace/name:port` (`namespace/name` for an unnamed port), as
    /// `kubectl get endpoints` names a port.
    pub fn service_port(&self) -> String {
        if self.port_name.is_empty() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}:{}", self.namespace, self.name, self.port_name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_and_overlong_parts_are_cut_at_a_character() {
        let l = encode(
            &ServiceId::new("kube-system", "kube-dns"),
            "dns-tcp",
            FrontendKind::LoadBalancer,
        );
        let v = LabelView::decode(&l).unwrap();
        assert_eq!(v.service_port(), "kube-system/kube-dns:dns-tcp");
        assert_eq!(v.kind, "LoadBalancer");
        let unnamed = encode(&ServiceId::new("a", "b"), "", FrontendKind::NodePort);
        assert_eq!(LabelView::decode(&unnamed).unwrap().service_port(), "a/b");

        // 62 ASCII bytes then a 2-byte character: 64 bytes, cut to 62.
        let long = format!("{}é", "x".repeat(62));
        let v = LabelView::decode(&encode(
            &ServiceId::new(&long, &long),
            &long,
            FrontendKind::ClusterIp,
        ))
        .unwrap();
        assert_eq!(v.namespace, "x".repeat(62));
        assert_eq!((v.name.len(), v.port_name.len()), (62, 15));
    }

    #[test]
    fn bytes_no_agent_writes_decode_to_nothing() {
        let mut l = encode(&ServiceId::new("a", "b"), "p", FrontendKind::ClusterIp);
        l.kind = 9;
        assert_eq!(LabelView::decode(&l), None);
        l.kind = SVC_KIND_CLUSTER_IP;
        [l.namespace_len, l.name_len, l.port_len] = [100, 100, 100];
        assert_eq!(LabelView::decode(&l), None);
    }
}
