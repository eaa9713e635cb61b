use std::{
    cell::RefCell,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt as _;
use serde_json::json;
use tokio::sync::oneshot;

use super::*;

thread_local! {
    static ORDER: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// An item that notes when it is decoded.
struct Noted;

impl<'de> Deserialize<'de> for Noted {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d)?;
        ORDER.with(|o| o.borrow_mut().push("item".into()));
        Ok(Self)
    }
}

fn decode_noting(body: &str) -> serde_json::Result<(ListMeta, Vec<Noted>)> {
    ORDER.with(|o| o.borrow_mut().clear());
    decode_page::<Noted>(body, |m| {
        let token = m.continue_.clone().unwrap_or_default();
        ORDER.with(|o| o.borrow_mut().push(format!("meta {token}")));
    })
}

fn order() -> Vec<String> {
    ORDER.with(|o| o.borrow().clone())
}

#[test]
fn a_page_announces_its_continuation_before_its_items_are_decoded() {
    let body = r#"{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"c1","remainingItemCount":3},"items":[{"a":1},{"b":[2]}]}"#;
    let (meta, items) = decode_noting(body).unwrap();
    assert_eq!(order(), ["meta c1", "item", "item"]);
    assert_eq!(items.len(), 2);
    assert_eq!(meta.resource_version.as_deref(), Some("7"));
    assert_eq!(meta.remaining_item_count, Some(3));
}

#[test]
fn a_page_in_another_order_still_decodes() {
    // Metadata last: the continuation is known only at the end.
    let (meta, items) =
        decode_noting(r#"{"items":[{}],"metadata":{"resourceVersion":"7","continue":"c"}}"#)
            .unwrap();
    assert_eq!(order(), ["item", "meta c"]);
    assert_eq!((items.len(), meta.continue_.as_deref()), (1, Some("c")));
    // No metadata at all, and null items: an empty page without a version,
    // which the lister then refuses as kube-runtime does.
    let (meta, items) = decode_noting(r#"{"items":null}"#).unwrap();
    assert_eq!(order(), ["meta "]);
    assert!(items.is_empty() && meta.resource_version.is_none());
}

#[test]
fn a_malformed_page_is_an_error() {
    for bad in [
        r#"{"metadata":{},"items":[{}]} x"#,
        r#"{"metadata":{},"metadata":{}}"#,
        r#"{"metadata":{},"items":{}}"#,
        r#"["not a list"]"#,
    ] {
        assert!(decode_noting(bad).is_err(), "{bad}");
    }
}

/// A server with two pages of Services, a watch from their version that
/// adds one and bookmarks, and a `410 Gone` for a watch from the bookmark.
/// It notes each request, and tells `second_page` when the second page is
/// asked for.
fn fake_server(log: Arc<Mutex<Vec<String>>>, second_page: oneshot::Sender<()>) -> kube::Client {
    let second_page = Arc::new(Mutex::new(Some(second_page)));
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let log = log.clone();
        let second_page = second_page.clone();
        async move {
            assert_eq!(req.uri().path(), "/api/v1/services");
            let q: std::collections::HashMap<String, String> =
                form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                    .into_owned()
                    .collect();
            assert_eq!(q["labelSelector"], "a!=b");
            let svc = |name: &str, rv: &str| json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}});
            let body = if q.get("watch").is_some_and(|w| w == "true") {
                let rv = &q["resourceVersion"];
                log.lock().unwrap().push(format!("watch {rv}"));
                let events = match rv.as_str() {
                    "10" => vec![
                        json!({"type": "ADDED", "object": svc("d", "11")}),
                        json!({"type": "BOOKMARK", "object": {"kind": "Service", "apiVersion": "v1", "metadata": {"resourceVersion": "12"}}}),
                    ],
                    _ => vec![
                        json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}}),
                    ],
                };
                events.iter().map(|e| format!("{e}\n")).collect::<String>()
            } else {
                assert_eq!(q["limit"], PAGE_SIZE.to_string());
                match q.get("continue") {
                    None => {
                        log.lock().unwrap().push("list".into());
                        json!({"metadata": {"resourceVersion": "10", "continue": "c1"}, "items": [svc("a", "3"), svc("b", "4")]}).to_string()
                    }
                    Some(c) => {
                        assert_eq!(c, "c1");
                        log.lock().unwrap().push("list c1".into());
                        if let Some(tx) = second_page.lock().unwrap().take() {
                            let _ = tx.send(());
                        }
                        json!({"metadata": {"resourceVersion": "10"}, "items": [svc("c", "5")]})
                            .to_string()
                    }
                }
            };
            Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::from(
                body.into_bytes(),
            )))
        }
    });
    kube::Client::new(svc, "default")
}

fn show(e: &watcher::Result<Event<Service>>) -> String {
    match e {
        Ok(Event::Init) => "init".into(),
        Ok(Event::InitApply(s)) => format!("init-apply {}", s.name_any()),
        Ok(Event::InitDone) => "init-done".into(),
        Ok(Event::Apply(s)) => format!("apply {}", s.name_any()),
        Ok(Event::Delete(s)) => format!("delete {}", s.name_any()),
        Err(watcher::Error::WatchError(s)) => format!("error {}", s.code),
        Err(e) => format!("error {e}"),
    }
}

#[tokio::test]
async fn the_next_page_is_asked_for_while_this_one_is_handed_out() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, asked) = oneshot::channel();
    let mut events = list_watch::<Service>(fake_server(log.clone(), tx), "a!=b").boxed();
    assert_eq!(show(&events.next().await.unwrap()), "init");
    assert_eq!(show(&events.next().await.unwrap()), "init-apply a");
    // Not polled again: only a request sent ahead of the consumer arrives.
    tokio::time::timeout(Duration::from_secs(10), asked)
        .await
        .expect("the second page is requested before the first is consumed")
        .unwrap();
    assert_eq!(*log.lock().unwrap(), ["list", "list c1"]);
}

#[tokio::test]
async fn it_lists_then_watches_and_relists_when_the_watch_is_gone() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, _asked) = oneshot::channel();
    let events = list_watch::<Service>(fake_server(log.clone(), tx), "a!=b");
    let seen: Vec<String> = events.take(9).map(|e| show(&e)).collect().await;
    assert_eq!(
        seen,
        [
            "init",
            "init-apply a",
            "init-apply b",
            "init-apply c",
            "init-done",
            "apply d",
            // The first watch ended after its bookmark; the next starts
            // there, and is told that version is gone.
            "error 410",
            "init",
            "init-apply a",
        ]
    );
    assert_eq!(
        log.lock().unwrap()[..5],
        ["list", "list c1", "watch 10", "watch 12", "list"]
    );
}

#[tokio::test]
async fn a_failed_list_reports_the_servers_status_and_starts_over() {
    // A Status body, then a body that is not one (a proxy's page), then a
    // list: each failure is reported as kube-client reports it, and the next
    // poll starts the list again.
    let calls = Arc::new(Mutex::new(0));
    let svc = tower::service_fn(move |_req: http::Request<kube::client::Body>| {
        let calls = calls.clone();
        async move {
            let n = {
                let mut c = calls.lock().unwrap();
                *c += 1;
                *c
            };
            let (code, body) = match n {
                1 => (
                    410,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "expired", "reason": "Expired", "code": 410}).to_string(),
                ),
                2 => (503, "<html>upstream down</html>".to_owned()),
                _ => (200, json!({"metadata": {"resourceVersion": "4"}, "items": []}).to_string()),
            };
            let res = http::Response::builder()
                .status(code)
                .body(kube::client::Body::from(body.into_bytes()))
                .unwrap();
            Ok::<_, std::convert::Infallible>(res)
        }
    });
    let events = list_watch::<Service>(kube::Client::new(svc, "default"), "a!=b");
    let seen: Vec<String> = events
        .take(6)
        .map(|e| match e {
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) => {
                format!("list failed {} {}", s.code, s.message)
            }
            e => show(&e),
        })
        .collect()
        .await;
    assert_eq!(
        seen,
        [
            "init",
            "list failed 410 expired",
            "init",
            "list failed 503 <html>upstream down</html>",
            "init",
            "init-done",
        ]
    );
}
