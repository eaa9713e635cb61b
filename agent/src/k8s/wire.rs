//! The EndpointSlice as the agent reads it off the wire.
//!
//! k8s-openapi's `EndpointSlice` holds every field as owned strings: about
//! nine heap blocks per endpoint (the address list and its string, the node
//! name, `targetRef`'s five strings, the zone), built by the decoder only to
//! be freed after conversion. With a million endpoints perf put malloc and
//! free at about 30% of the agent's CPU in a cold sync from the API server.
//!
//! This type has the same JSON names and defaults (a missing or null field
//! is its empty value, as in k8s-openapi), but keeps
//! only what the datapath reads:
//! - an address is parsed as it is read, and its text kept only when it does
//!   not parse as it stands (the conversion then reports it as before);
//! - the first address is held inline: endpoints almost always have one;
//! - node names are the shared copies of [`crate::intern`];
//! - metadata keeps its name, namespace, UID, resource version, the
//!   `kubernetes.io/service-name` label and the trigger-time annotation;
//! - `targetRef`, `zone`, `hostname`, `deprecatedTopology` and
//!   `managedFields` are skipped without being built.
//!
//! Both sources decode into it, so both convert through one function.
use std::{collections::BTreeMap, fmt, marker::PhantomData, net::IpAddr, sync::Arc};

use k8s_openapi::{
    api::discovery::v1::{EndpointHints, EndpointPort},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::{
    Deserialize, Deserializer,
    de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor},
};

use super::LABEL_SERVICE_NAME;
use crate::source::kube::TRIGGER_TIME;

mod service;
pub use service::Service;

type Api = k8s_openapi::api::discovery::v1::EndpointSlice;

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(default, deserialize_with = "lean_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "or_default")]
    pub address_type: String,
    #[serde(default, deserialize_with = "or_default")]
    pub endpoints: Vec<Endpoint>,
    #[serde(default)]
    pub ports: Option<Vec<EndpointPort>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default, deserialize_with = "or_default")]
    pub addresses: Addresses,
    #[serde(default)]
    pub conditions: Option<Conditions>,
    /// `None` for an empty name too: it names no node.
    #[serde(default, deserialize_with = "node_name")]
    pub node_name: Option<Arc<str>>,
    #[serde(default)]
    pub hints: Option<Box<EndpointHints>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Conditions {
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
}

/// One entry of `addresses`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// Text that parsed, and that canonicalization would not change.
    Ip(IpAddr),
    /// Anything else, as written: the conversion decides what it is.
    Text(Box<str>),
}

impl Address {
    pub fn parse(text: &str) -> Self {
        match text.parse::<IpAddr>() {
            Ok(ip) if ip.to_canonical() == ip => Self::Ip(ip),
            _ => Self::Text(text.into()),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(ip) => ip.fmt(f),
            Self::Text(t) => f.write_str(t),
        }
    }
}

/// `addresses`, with the first one inline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    first: Option<Address>,
    rest: Vec<Address>,
}

impl Addresses {
    pub fn iter(&self) -> impl Iterator<Item = &Address> {
        self.first.iter().chain(&self.rest)
    }
}

impl FromIterator<Address> for Addresses {
    fn from_iter<I: IntoIterator<Item = Address>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        Self {
            first: iter.next(),
            rest: iter.collect(),
        }
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrWith(Address::parse))
    }
}

impl<'de> Deserialize<'de> for Addresses {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Seq;
        impl<'de> Visitor<'de> for Seq {
            type Value = Addresses;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of addresses")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Addresses, A::Error> {
                let first = seq.next_element()?;
                let mut rest = Vec::new();
                if first.is_some() {
                    while let Some(a) = seq.next_element()? {
                        rest.push(a);
                    }
                }
                Ok(Addresses { first, rest })
            }
        }
        d.deserialize_seq(Seq)
    }
}

/// Missing and null read as the empty value, as k8s-openapi reads them.
fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A string handed to `f` as borrowed text, so that nothing is allocated for
/// it unless `f` does.
struct StrWith<F>(F);

impl<'de, T, F: FnOnce(&str) -> T> Visitor<'de> for StrWith<F> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        Ok((self.0)(v))
    }
}

fn node_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Arc<str>>, D::Error> {
    let name: Option<Interned> = Deserialize::deserialize(d)?;
    Ok(name.and_then(|n| n.0))
}

struct Interned(Option<Arc<str>>);

impl<'de> Deserialize<'de> for Interned {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrWith(|s: &str| {
            Interned((!s.is_empty()).then(|| crate::intern::name(s)))
        }))
    }
}

/// Metadata with only the fields the agent reads (see the module comment).
fn lean_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        #[serde(default)]
        labels: Option<OneEntry<ServiceName>>,
        #[serde(default)]
        annotations: Option<OneEntry<TriggerTime>>,
    }
    let m = Option::<Meta>::deserialize(d)?;
    Ok(m.map_or_else(ObjectMeta::default, |m| ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels.map(|l| l.0),
        annotations: m.annotations.map(|a| a.0),
        ..ObjectMeta::default()
    }))
}

trait Key {
    const KEY: &'static str;
}
struct ServiceName;
impl Key for ServiceName {
    const KEY: &'static str = LABEL_SERVICE_NAME;
}
struct TriggerTime;
impl Key for TriggerTime {
    const KEY: &'static str = TRIGGER_TIME;
}

/// A string map of which only the entry `K::KEY` is kept; the others are
/// checked to be strings and dropped unbuilt.
struct OneEntry<K>(BTreeMap<String, String>, PhantomData<K>);

impl<'de, K: Key> Deserialize<'de> for OneEntry<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Map<K>(PhantomData<K>);
        impl<'de, K: Key> Visitor<'de> for Map<K> {
            type Value = OneEntry<K>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OneEntry<K>, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(wanted) = map.next_key_seed(IsKey::<K>(PhantomData))? {
                    if wanted {
                        kept.insert(K::KEY.to_owned(), map.next_value()?);
                    } else {
                        map.next_value::<StrOnly>()?;
                    }
                }
                Ok(OneEntry(kept, PhantomData))
            }
        }
        d.deserialize_map(Map(PhantomData))
    }
}

struct IsKey<K>(PhantomData<K>);

impl<'de, K: Key> DeserializeSeed<'de> for IsKey<K> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(StrWith(|s: &str| s == K::KEY))
    }
}

/// A string, checked and dropped.
struct StrOnly;

impl<'de> Deserialize<'de> for StrOnly {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrWith(|_: &str| StrOnly))
    }
}

/// Makes a lean wire type a resource of its own, with the API type's names
/// and paths, so kube's `Api` and the lister take it in the API type's place.
macro_rules! resource_as {
    ($ty:ty, $api:ty) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = <$api as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$api as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$api as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$api as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str =
                <$api as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$api as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = <$api as k8s_openapi::ListableResource>::LIST_KIND;
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }
    };
}
use resource_as;

resource_as!(EndpointSlice, Api);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_what_the_api_type_reads_and_skips_the_rest() {
        let v = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": "web-abc", "namespace": "shop", "uid": "u-1",
                "resourceVersion": "42", "generateName": "web-",
                "labels": {LABEL_SERVICE_NAME: "web",
                           "endpointslice.kubernetes.io/managed-by": "x"},
                "annotations": {TRIGGER_TIME: "2026-01-01T00:00:00Z", "other": "y"},
                "managedFields": [{"manager": "m", "fieldsV1": {"f:endpoints": {}}}],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service",
                                     "name": "web", "uid": "u-0"}],
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "nodeName": "node-a", "zone": "z1",
                 "conditions": {"ready": true, "serving": true, "terminating": false},
                 "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "shop",
                               "uid": "p-1"},
                 "hints": {"forZones": [{"name": "z1"}]}},
                {"addresses": ["10.0.0.2", "::ffff:10.0.0.3", "bad"], "nodeName": ""},
            ],
        });
        let s: EndpointSlice = serde_json::from_value(v.clone()).unwrap();
        let full: Api = serde_json::from_value(v).unwrap();

        assert_eq!(s.metadata.name, full.metadata.name);
        assert_eq!(s.metadata.namespace, full.metadata.namespace);
        assert_eq!(s.metadata.uid, full.metadata.uid);
        assert_eq!(s.metadata.resource_version, full.metadata.resource_version);
        let one = |k: &str, v: &str| Some(BTreeMap::from([(k.to_owned(), v.to_owned())]));
        assert_eq!(s.metadata.labels, one(LABEL_SERVICE_NAME, "web"));
        assert_eq!(
            s.metadata.annotations,
            one(TRIGGER_TIME, "2026-01-01T00:00:00Z")
        );
        assert_eq!(s.metadata.managed_fields, None);
        assert_eq!(s.address_type, full.address_type);
        assert_eq!(s.ports, full.ports);

        let [a, b] = &s.endpoints[..] else {
            panic!("two endpoints: {:?}", s.endpoints);
        };
        assert_eq!(a.node_name.as_deref(), Some("node-a"));
        assert_eq!(
            a.conditions,
            Some(Conditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false)
            })
        );
        assert_eq!(a.hints, full.endpoints[0].hints.clone().map(Box::new));
        assert_eq!(b.node_name, None, "an empty node name names no node");
        assert_eq!(b.conditions, None);
        let texts: Vec<String> = b.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(texts, full.endpoints[1].addresses);
        assert!(matches!(b.addresses.iter().next(), Some(Address::Ip(_))));
        assert!(
            b.addresses
                .iter()
                .skip(1)
                .all(|a| matches!(a, Address::Text(_))),
            "text that does not parse as it stands is kept as written"
        );
    }

    #[test]
    fn defaults_and_type_errors_are_those_of_the_api_type() {
        let base = json!({"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}]});
        let cases = [
            ("addressType", None, true),
            ("addressType", Some(json!(null)), true),
            ("endpoints", None, true),
            ("endpoints", Some(json!([{"nodeName": "n"}])), true),
            ("endpoints", Some(json!([{"addresses": null}])), true),
            ("endpoints", Some(json!([{"addresses": [1]}])), false),
            (
                "endpoints",
                Some(json!([{"addresses": [], "nodeName": 1}])),
                false,
            ),
            ("endpoints", Some(json!({})), false),
            ("metadata", Some(json!({"labels": {"a": 1}})), false),
            ("metadata", Some(json!({"name": 1})), false),
        ];
        for (field, value, accepted) in cases {
            let mut v = base.clone();
            match value {
                Some(b) => v[field] = b,
                None => drop(v.as_object_mut().unwrap().remove(field)),
            }
            let api = serde_json::from_value::<Api>(v.clone());
            let ours = serde_json::from_value::<EndpointSlice>(v.clone());
            assert_eq!(api.is_ok(), accepted, "the API type on {v}: {api:?}");
            assert_eq!(ours.is_ok(), accepted, "this type on {v}: {ours:?}");
            if let (Ok(api), Ok(ours)) = (api, ours) {
                assert_eq!(ours.address_type, api.address_type);
                assert_eq!(ours.endpoints.len(), api.endpoints.len());
            }
        }
    }

    #[test]
    fn yaml_reads_the_same() {
        let yaml = "addressType: IPv4\nendpoints:\n- addresses: [10.0.0.1]\n  nodeName: n1\n";
        let s: EndpointSlice = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(s.endpoints[0].node_name.as_deref(), Some("n1"));
        assert_eq!(
            s.endpoints[0].addresses.iter().collect::<Vec<_>>(),
            [&Address::Ip(IpAddr::from([10, 0, 0, 1]))]
        );
    }
}
