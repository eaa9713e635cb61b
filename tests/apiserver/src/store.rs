//! The object store: JSON objects keyed by resource, namespace and name, one
//! global resourceVersion counter, and a bounded event history that watches
//! replay from, like etcd with its compaction window.
use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::{convert, resources::ResourceDef, selectors::LabelSet};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// One change, as stored in the history and sent to watches: `res` is the
/// storage's resource and `object` is in its form (see `convert`).
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventKind,
    pub res: &'static ResourceDef,
    pub namespace: String,
    pub object: Value,
    /// The object before the change, so a selector watch can turn a MODIFIED
    /// into ADDED or DELETED when the object enters or leaves the selection.
    pub prev: Option<Value>,
}

type Objects = BTreeMap<(String, String), Stored>;

/// A stored object with its JSON as a list item (without `kind` and
/// `apiVersion`), encoded once per write. Encoding a 100k-object list from
/// the `Value` trees on every request made this server, not the client,
/// what the scale bench timed; lists and initial watch events now copy bytes.
#[derive(Clone, Debug)]
pub struct Stored {
    pub value: Value,
    item: Bytes,
    /// The type meta's fields (`"kind":…,"apiVersion":…`), for whole
    /// objects: encoded per object at each watch start, they were half of
    /// the time a 100k-object streaming list waited before its first event.
    type_meta: Bytes,
    pub labels: LabelSet,
}

impl Stored {
    fn new(value: Value) -> Self {
        let item = match value.as_object() {
            Some(m) => serde_json::to_vec(&Fields(
                m.iter().filter(|(k, _)| !is_type_meta(k)).collect(),
            )),
            None => serde_json::to_vec(&value),
        };
        // Only string keys and JSON values: encoding cannot fail.
        let item = Bytes::from(item.unwrap_or_default());
        let mut type_meta = Vec::new();
        for key in ["kind", "apiVersion"] {
            if let Some(v) = value.get(key) {
                if !type_meta.is_empty() {
                    type_meta.push(b',');
                }
                let _ = serde_json::to_writer(&mut type_meta, key);
                type_meta.push(b':');
                let _ = serde_json::to_writer(&mut type_meta, v);
            }
        }
        let labels = LabelSet::of(&value);
        Self {
            value,
            item,
            type_meta: Bytes::from(type_meta),
            labels,
        }
    }

    /// The JSON of a list item.
    pub fn item(&self) -> &[u8] {
        &self.item
    }

    /// The JSON of the whole object (the type meta, then the item's
    /// fields), in parts that outlive the store's lock: a watch takes its
    /// initial events' parts under the lock and writes them as the client
    /// reads (see `watch::Initial`).
    pub fn object_parts(&self) -> ObjectParts {
        ObjectParts {
            meta: self.type_meta.clone(),
            item: self.item.clone(),
        }
    }
}

/// An object's JSON in two parts: its type meta's fields, and the item
/// (shared with the store, not copied).
pub struct ObjectParts {
    meta: Bytes,
    item: Bytes,
}

impl ObjectParts {
    pub fn write(&self, out: &mut Vec<u8>) {
        let Some(fields) = self
            .item
            .strip_prefix(b"{")
            .and_then(|f| f.strip_suffix(b"}"))
        else {
            out.extend_from_slice(&self.item);
            return;
        };
        out.push(b'{');
        out.extend_from_slice(&self.meta);
        if !fields.is_empty() && !self.meta.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(fields);
        out.push(b'}');
    }
}

/// An object's fields, borrowed, serialized as a JSON object in their order.
struct Fields<'a>(Vec<(&'a String, &'a Value)>);

impl serde::Serialize for Fields<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().copied())
    }
}

pub fn is_type_meta(key: &str) -> bool {
    key == "kind" || key == "apiVersion"
}

pub type Subscription = broadcast::Receiver<Arc<Event>>;

/// Every Service's ClusterIPs and NodePorts, so allocation does not scan.
#[derive(Default, Clone)]
pub struct Allocations {
    pub ips: HashSet<String>,
    pub ports: HashSet<u64>,
}

impl Allocations {
    fn update(&mut self, prev: Option<&Value>, next: Option<&Value>) {
        if let Some(p) = prev {
            let (ips, ports) = crate::services::allocated(p);
            ips.iter().for_each(|ip| {
                self.ips.remove(ip);
            });
            ports.iter().for_each(|port| {
                self.ports.remove(port);
            });
        }
        if let Some(n) = next {
            let (ips, ports) = crate::services::allocated(n);
            self.ips.extend(ips);
            self.ports.extend(ports);
        }
    }
}

/// (object uid, field manager, status subresource).
pub type ApplyKey = (String, String, bool);

type Applied = HashMap<String, HashMap<(String, bool), Value>>;

pub struct Inner {
    alloc: Allocations,
    /// What each manager last applied to each object (by uid, so a recreated
    /// object starts fresh).
    applied: Applied,
    rv: u64,
    objects: HashMap<String, Objects>,
    history: VecDeque<Arc<Event>>,
    /// Watches and paged lists may start at any RV >= this one.
    compacted: u64,
    history_limit: usize,
    tx: broadcast::Sender<Arc<Event>>,
    /// The PEM of the CA that signs the serving certificate, which every
    /// namespace's `kube-root-ca.crt` carries.
    root_ca: Arc<str>,
}

pub struct Store {
    inner: Mutex<Inner>,
}

/// Big enough that only a stalled watch lags; a lagging watch gets 410 Gone.
const BROADCAST_CAPACITY: usize = 16 * 1024;

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let (tx, _) = broadcast::channel(BROADCAST_CAPACITY);
        Store {
            inner: Mutex::new(Inner {
                alloc: Allocations::default(),
                applied: HashMap::new(),
                rv: 1,
                objects: HashMap::new(),
                history: VecDeque::new(),
                compacted: 1,
                history_limit: history_limit.max(1),
                tx,
                root_ca: Arc::from(""),
            }),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data: every mutation
        // is a single insert/remove after validation.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// A copy for `dryRun=All`: writes go through every check and are thrown
    /// away, and nobody is notified.
    pub fn scratch(&self) -> Inner {
        Inner {
            alloc: self.alloc.clone(),
            applied: self.applied.clone(),
            rv: self.rv,
            objects: self.objects.clone(),
            history: VecDeque::new(),
            compacted: self.compacted,
            history_limit: self.history_limit,
            tx: broadcast::channel(1).0,
            root_ca: self.root_ca.clone(),
        }
    }

    pub fn set_root_ca(&mut self, pem: &str) {
        self.root_ca = Arc::from(pem);
    }

    pub fn root_ca(&self) -> &str {
        &self.root_ca
    }

    pub fn last_applied(&self, (uid, manager, status): &ApplyKey) -> Option<&Value> {
        self.applied.get(uid)?.get(&(manager.clone(), *status))
    }

    pub fn remember_applied(&mut self, (uid, manager, status): ApplyKey, config: Value) {
        self.applied
            .entry(uid)
            .or_default()
            .insert((manager, status), config);
    }

    pub fn allocations(&self) -> &Allocations {
        &self.alloc
    }

    fn is_service(res: &ResourceDef) -> bool {
        res.group.is_empty() && res.plural == "services"
    }

    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Forgets all history: every RV before now becomes too old.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// An object as `res` reads it.
    pub fn get(&self, res: &'static ResourceDef, ns: &str, name: &str) -> Option<Cow<'_, Value>> {
        self.objects
            .get(&res.id())?
            .get(&(ns.to_string(), name.to_string()))
            .map(|s| convert::to_view(res, &s.value))
    }

    /// Objects of `res` in `ns` (all namespaces if `None`) in key order,
    /// starting after `after`, as `res` reads them.
    pub fn list<'a>(
        &'a self,
        res: &'static ResourceDef,
        ns: Option<&'a str>,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = (&'a (String, String), Cow<'a, Value>)> + 'a {
        self.list_stored(res, ns, after)
            .map(move |(k, s)| (k, convert::to_view(res, &s.value)))
    }

    /// [`Self::list`] as stored, with each object's encoding: in the form of
    /// `convert::storage(res)`.
    pub fn list_stored<'a>(
        &'a self,
        res: &ResourceDef,
        ns: Option<&'a str>,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = (&'a (String, String), &'a Stored)> + 'a {
        use std::ops::Bound;
        let lower = match after {
            Some(k) => Bound::Excluded(k),
            None => match ns {
                Some(ns) => Bound::Included((ns.to_string(), String::new())),
                None => Bound::Unbounded,
            },
        };
        self.objects
            .get(&res.id())
            .into_iter()
            .flat_map(move |m| m.range((lower.clone(), Bound::Unbounded)))
            .take_while(move |((kns, _), _)| ns.is_none_or(|ns| kns == ns))
    }

    pub fn namespace_exists(&self, ns: &str) -> bool {
        self.get(crate::resources::namespaces(), "", ns).is_some()
    }

    /// Stores `obj` (as `res` writes it) under a new resourceVersion and
    /// records the event; returns it as `res` reads it.
    pub fn put(&mut self, res: &'static ResourceDef, ns: &str, name: &str, obj: Value) -> Value {
        let view = res;
        let res = convert::storage(view);
        let mut obj = convert::to_storage(view, obj);
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let key = (ns.to_string(), name.to_string());
        let prev = self
            .objects
            .entry(res.id())
            .or_default()
            .insert(key, Stored::new(obj.clone()))
            .map(|s| s.value);
        if Self::is_service(res) {
            self.alloc.update(prev.as_ref(), Some(&obj));
        }
        let kind = if prev.is_some() {
            EventKind::Modified
        } else {
            EventKind::Added
        };
        let out = convert::to_view(view, &obj).into_owned();
        self.record(res, ns, kind, obj, prev);
        out
    }

    /// Removes an object; the DELETED event carries it (or `last`, its state
    /// as of the removing write, as `res` writes it) at a new
    /// resourceVersion. Returns that as `res` reads it.
    pub fn remove(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        last: Option<Value>,
    ) -> Option<Value> {
        let view = res;
        let res = convert::storage(view);
        let last = last.map(|l| convert::to_storage(view, l));
        let prev = self
            .objects
            .get_mut(&res.id())?
            .remove(&(ns.to_string(), name.to_string()))?
            .value;
        if Self::is_service(res) {
            self.alloc.update(Some(&prev), None);
        }
        if let Some(uid) = prev["metadata"]["uid"].as_str() {
            self.applied.remove(uid);
        }
        self.rv += 1;
        let mut obj = last.unwrap_or_else(|| prev.clone());
        obj["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let out = convert::to_view(view, &obj).into_owned();
        self.record(res, ns, EventKind::Deleted, obj, Some(prev));
        Some(out)
    }

    fn record(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        kind: EventKind,
        object: Value,
        prev: Option<Value>,
    ) {
        let ev = Arc::new(Event {
            rv: self.rv,
            kind,
            res,
            namespace: ns.to_string(),
            object,
            prev,
        });
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        // No receivers is fine: nobody watches.
        let _ = self.tx.send(ev);
    }

    /// Events after `rv` still in the history plus a receiver for later ones,
    /// taken under one lock so nothing falls between them. `None` if `rv` was
    /// compacted.
    pub fn watch_from(&self, rv: u64) -> Option<(Vec<Arc<Event>>, Subscription)> {
        if rv < self.compacted {
            return None;
        }
        let past = self.history.iter().filter(|e| e.rv > rv).cloned().collect();
        Some((past, self.tx.subscribe()))
    }

    pub fn subscribe(&self) -> Subscription {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn stored_encodings_are_the_object_with_and_without_type_meta() {
        for v in [
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {}}),
            json!({"kind": "Service"}),
            json!({"metadata": {"name": "a"}}),
            json!({}),
        ] {
            let s = Stored::new(v.clone());
            let mut item = v.clone();
            item.as_object_mut()
                .unwrap()
                .retain(|k, _| !is_type_meta(k));
            let got: Value = serde_json::from_slice(s.item()).unwrap();
            assert_eq!(got, item, "list item of {v}");
            let mut out = Vec::new();
            s.object_parts().write(&mut out);
            let got: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(got, v, "whole object");
        }
    }
}
