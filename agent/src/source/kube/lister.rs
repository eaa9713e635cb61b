//! List, then watch: kube-runtime's `watcher` (its `ListWatch` strategy,
//! event for event), except that each page of the list asks for the next one
//! as soon as its own metadata is decoded.
//!
//! kube-runtime requests page N+1 only once page N is decoded. At 100k
//! EndpointSlices that made the list a relay: the server built a page while
//! the agent waited, then the agent decoded it while the server waited, 200
//! times over, and the list was the cold sync's critical path. The API
//! server writes `metadata` (with `continue`) before `items`, so the next
//! request goes out after a few hundred bytes of a page, and the server
//! builds it while the rest is decoded. Only one page is ever ahead: memory
//! stays at two pages, and a failed page drops its successor.
//!
//! The watch half is the same as kube-runtime's: bookmarks, the server's
//! timeout plus a margin as the idle limit, a resumed watch when the stream
//! ends, and a relist on `410 Gone`. Errors go out as [`watcher::Error`]s,
//! so the caller's backoff and classification do not know which one ran.
use std::{fmt, marker::PhantomData, time::Duration};

use futures::{Stream, StreamExt as _, stream::BoxStream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::{
    Api, Client, Resource,
    api::{ListParams, WatchEvent, WatchParams},
    core::Request,
    runtime::watcher::{self, Event},
};
use serde::{
    Deserialize,
    de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, Visitor},
};
use tokio::task::JoinHandle;

/// client-go's page size, and kube-runtime's.
pub const PAGE_SIZE: u32 = 500;
/// The watch timeout the server is asked for, as kube-runtime does.
const WATCH_TIMEOUT_SECS: u32 = 290;
/// How long past that timeout a silent watch is taken for a dead connection.
const IDLE_MARGIN: Duration = Duration::from_secs(5);
/// The most a page's `Content-Length` reserves at once: a 500-slice page is
/// about 1.4 MB.
const MAX_RESERVE: usize = 64 << 20;

/// The objects of kind `K` matching `labels`, then their changes, forever.
pub fn list_watch<K>(
    client: Client,
    labels: &str,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + use<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + fmt::Debug + Send + Sync + 'static,
{
    let ctx = Ctx {
        api: Api::all(client.clone()),
        client,
        request: Request::new(K::url_path(&(), None)),
        labels: labels.to_owned(),
    };
    futures::stream::unfold((ctx, State::Empty), |(ctx, mut state)| async move {
        loop {
            let (event, next) = step(&ctx, state).await;
            state = next;
            if let Some(event) = event {
                return Some((event, (ctx, state)));
            }
        }
    })
}

struct Ctx<K> {
    api: Api<K>,
    client: Client,
    request: Request,
    labels: String,
}

enum State<K> {
    Empty,
    /// Handing out a page's objects; `next` is the following page in flight.
    /// `spare` is the buffer the page before this one was read into: the
    /// page after `next` is read into it.
    Page {
        objects: std::vec::IntoIter<K>,
        next: Option<Pending>,
        resource_version: Option<String>,
        spare: Vec<u8>,
    },
    Listed {
        resource_version: String,
    },
    Watching {
        resource_version: String,
        stream: BoxStream<'static, kube::Result<WatchEvent<K>>>,
    },
}

/// The body of a successful response, read into `buf`; an error response
/// as kube-client reports it (`Error::Api`, with the server's `Status` when
/// the body is one).
///
/// Not `Client::request_text`: that gathers the body, copies it into one
/// buffer and copies that into a `String`. At 1.4 MB a page, fresh each time,
/// the copies and the kernel zeroing their pages were a twentieth of a cold
/// sync's CPU; here the body is copied once, into one of two buffers that
/// take turns (see [`State::Page`]).
async fn read_body(
    client: &Client,
    req: http::Request<Vec<u8>>,
    mut buf: Vec<u8>,
) -> kube::Result<String> {
    use http_body_util::BodyExt as _;
    let res = client.send(req.map(kube::client::Body::from)).await?;
    let code = res.status();
    let len = res
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let mut body = res.into_body();
    buf.clear();
    // The header is the server's word, not a promise: beyond a bound the
    // buffer grows with what really arrives.
    if let Some(len) = len {
        buf.reserve(len.min(MAX_RESERVE));
    }
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            buf.extend_from_slice(&data);
        }
    }
    let text = String::from_utf8(buf).map_err(kube::Error::FromUtf8)?;
    if code.is_client_error() || code.is_server_error() {
        let status = serde_json::from_str::<kube::core::Status>(&text).unwrap_or_else(|_| {
            kube::core::Status::failure(text.trim(), "Failed to parse error data")
                .with_code(code.as_u16())
        });
        return Err(kube::Error::Api(status.boxed()));
    }
    Ok(text)
}

/// A page request in flight, cancelled when dropped: a list that fails or is
/// abandoned does not leave its successor running.
struct Pending(JoinHandle<kube::Result<String>>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<K> Ctx<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + fmt::Debug + Send + 'static,
{
    fn list_params(&self, continue_token: Option<String>) -> ListParams {
        // As kube-runtime's: resourceVersion 0 (kube-core leaves it out of a
        // paginated request, which the server then serves consistently).
        ListParams {
            label_selector: Some(self.labels.clone()),
            resource_version: Some("0".into()),
            version_match: Some(kube::api::VersionMatch::NotOlderThan),
            limit: Some(PAGE_SIZE),
            continue_token,
            ..ListParams::default()
        }
    }

    /// Sends the request for one page now; its body is read in the task,
    /// into `buf`.
    fn request_page(&self, continue_token: Option<String>, buf: Vec<u8>) -> Pending {
        let req = self.request.list(&self.list_params(continue_token));
        let client = self.client.clone();
        Pending(tokio::spawn(async move {
            let mut req = req.map_err(kube::Error::BuildRequest)?;
            // The verb kube-client's own list names the request by.
            req.extensions_mut().insert("list");
            read_body(&client, req, buf).await
        }))
    }

    fn watch_params(&self) -> WatchParams {
        WatchParams {
            label_selector: Some(self.labels.clone()),
            timeout: Some(WATCH_TIMEOUT_SECS),
            ..WatchParams::default()
        }
    }
}

async fn step<K>(ctx: &Ctx<K>, state: State<K>) -> (Option<watcher::Result<Event<K>>>, State<K>)
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + fmt::Debug + Send + 'static,
{
    use watcher::Error as E;
    match state {
        State::Empty => (
            Some(Ok(Event::Init)),
            State::Page {
                objects: Vec::new().into_iter(),
                next: Some(ctx.request_page(None, Vec::new())),
                resource_version: None,
                spare: Vec::new(),
            },
        ),
        State::Page {
            mut objects,
            next,
            resource_version,
            mut spare,
        } => {
            if let Some(obj) = objects.next() {
                let state = State::Page {
                    objects,
                    next,
                    resource_version,
                    spare,
                };
                return (Some(Ok(Event::InitApply(obj))), state);
            }
            let Some(mut pending) = next else {
                return match resource_version {
                    Some(resource_version) => (
                        Some(Ok(Event::InitDone)),
                        State::Listed { resource_version },
                    ),
                    None => (Some(Err(E::NoResourceVersion)), State::Empty),
                };
            };
            let body = match (&mut pending.0).await {
                Ok(Ok(body)) => body,
                Ok(Err(e)) => return (Some(Err(E::InitialListFailed(e))), State::Empty),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Cancelled, which only a runtime shutting down does here:
                // a failed list, retried if anything still polls.
                Err(e) => {
                    let e = kube::Error::Service(Box::new(e));
                    return (Some(Err(E::InitialListFailed(e))), State::Empty);
                }
            };
            let mut next = None;
            let decoded = decode_page::<K>(&body, |meta| {
                if let Some(token) = meta.continue_.clone().filter(|t| !t.is_empty()) {
                    next = Some(ctx.request_page(Some(token), std::mem::take(&mut spare)));
                }
            });
            let spare = body.into_bytes();
            match decoded {
                Ok((meta, items)) => {
                    let resource_version = meta.resource_version.filter(|rv| !rv.is_empty());
                    if resource_version.is_none() && next.is_none() {
                        return (Some(Err(E::NoResourceVersion)), State::Empty);
                    }
                    let state = State::Page {
                        objects: items.into_iter(),
                        next,
                        resource_version,
                        spare,
                    };
                    (None, state)
                }
                Err(e) => (
                    Some(Err(E::InitialListFailed(kube::Error::SerdeError(e)))),
                    State::Empty,
                ),
            }
        }
        State::Listed { resource_version } => {
            match ctx.api.watch(&ctx.watch_params(), &resource_version).await {
                Ok(stream) => (
                    None,
                    State::Watching {
                        resource_version,
                        stream: stream.boxed(),
                    },
                ),
                Err(e) => (
                    Some(Err(E::WatchStartFailed(e))),
                    State::Listed { resource_version },
                ),
            }
        }
        State::Watching {
            resource_version,
            mut stream,
        } => {
            let idle = Duration::from_secs(WATCH_TIMEOUT_SECS.into()) + IDLE_MARGIN;
            let event = tokio::time::timeout(idle, stream.next())
                .await
                .ok()
                .flatten();
            match event {
                Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                    applied(obj, Event::Apply, stream)
                }
                Some(Ok(WatchEvent::Deleted(obj))) => applied(obj, Event::Delete, stream),
                Some(Ok(WatchEvent::Bookmark(bm))) => (
                    None,
                    State::Watching {
                        resource_version: bm.metadata.resource_version,
                        stream,
                    },
                ),
                // Gone: the history this watch needs is compacted; relist.
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                    (Some(Err(E::WatchError(status))), State::Empty)
                }
                Some(Ok(WatchEvent::Error(status))) => (
                    Some(Err(E::WatchError(status))),
                    State::Watching {
                        resource_version,
                        stream,
                    },
                ),
                Some(Err(e)) => (
                    Some(Err(E::WatchFailed(e))),
                    State::Watching {
                        resource_version,
                        stream,
                    },
                ),
                // Ended (the server's timeout) or silent too long: resume.
                None => (None, State::Listed { resource_version }),
            }
        }
    }
}

/// A watched object goes out, and its version is where a resumed watch
/// starts; one without a version cannot be resumed from, so the list starts
/// over.
fn applied<K: Resource>(
    obj: K,
    event: fn(K) -> Event<K>,
    stream: BoxStream<'static, kube::Result<WatchEvent<K>>>,
) -> (Option<watcher::Result<Event<K>>>, State<K>) {
    match obj
        .meta()
        .resource_version
        .clone()
        .filter(|rv| !rv.is_empty())
    {
        Some(resource_version) => (
            Some(Ok(event(obj))),
            State::Watching {
                resource_version,
                stream,
            },
        ),
        None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
    }
}

/// Decodes one list page, calling `on_meta` as soon as its `metadata` is
/// read: before its items when the server writes them in that order, as the
/// API server does. Written in the other order, the page still decodes, and
/// `on_meta` is called at its end.
pub fn decode_page<K: DeserializeOwned>(
    body: &str,
    on_meta: impl FnOnce(&ListMeta),
) -> serde_json::Result<(ListMeta, Vec<K>)> {
    let mut de = serde_json::Deserializer::from_str(body);
    let page = PageSeed {
        on_meta,
        items: PhantomData,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(page)
}

struct PageSeed<F, K> {
    on_meta: F,
    items: PhantomData<K>,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Field {
    Metadata,
    Items,
    #[serde(other)]
    Other,
}

impl<'de, F: FnOnce(&ListMeta), K: DeserializeOwned> DeserializeSeed<'de> for PageSeed<F, K> {
    type Value = (ListMeta, Vec<K>);

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnOnce(&ListMeta), K: DeserializeOwned> Visitor<'de> for PageSeed<F, K> {
    type Value = (ListMeta, Vec<K>);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut on_meta = Some(self.on_meta);
        let mut meta = None;
        let mut items = None;
        while let Some(key) = map.next_key::<Field>()? {
            match key {
                Field::Metadata if meta.is_none() => {
                    let m: ListMeta = map.next_value()?;
                    if let Some(f) = on_meta.take() {
                        f(&m);
                    }
                    meta = Some(m);
                }
                Field::Items if items.is_none() => {
                    items = Some(map.next_value_seed(Items(PhantomData))?);
                }
                Field::Metadata => return Err(de::Error::duplicate_field("metadata")),
                Field::Items => return Err(de::Error::duplicate_field("items")),
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let meta = meta.unwrap_or_default();
        if let Some(f) = on_meta {
            f(&meta);
        }
        Ok((meta, items.unwrap_or_default()))
    }
}

/// A page's `items` (null is none), in a vector sized for a full page
/// from the start: grown from empty, the 500 objects of a page (up to
/// 800 bytes each) were copied once more on the way, and the copies
/// showed in profiles.
struct Items<K>(PhantomData<K>);

impl<'de, K: DeserializeOwned> DeserializeSeed<'de> for Items<K> {
    type Value = Vec<K>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, K: DeserializeOwned> Visitor<'de> for Items<K> {
    type Value = Vec<K>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of objects")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(PAGE_SIZE as usize));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(items)
    }
}

#[cfg(test)]
mod tests;
