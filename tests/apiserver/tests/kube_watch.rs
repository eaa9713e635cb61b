//! Watches through kube-rs: raw `Api::watch`, bookmarks, 410 Gone, and
//! kube-runtime's watcher and reflector across a server outage.
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{
    core::v1::{ConfigMap, ObjectReference},
    events::v1::Event as EventV1,
};
use kube::{
    Api, Resource as _,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    runtime::{
        WatchStreamExt as _,
        events::{Event, EventType, Recorder, Reporter},
        reflector, watcher,
    },
};
use serde_json::json;
mod common;

use common::{cm, start_with};
use weir_test_apiserver::{Options, WAIT, eventually};

/// A condition checked at once, for [`eventually`].
fn ready(holds: bool) -> std::future::Ready<Option<()>> {
    std::future::ready(holds.then_some(()))
}

#[tokio::test]
async fn raw_watch_sees_changes_in_order_from_a_resource_version() {
    let (_server, client) = start_with(Options::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &cm("a", "1", &[]))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match tokio::time::timeout(WAIT, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(c) => seen.push(("ADDED", c.data.unwrap()["k"].clone())),
            WatchEvent::Modified(c) => seen.push(("MODIFIED", c.data.unwrap()["k"].clone())),
            WatchEvent::Deleted(c) => seen.push(("DELETED", c.data.unwrap()["k"].clone())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    let seen: Vec<(&str, &str)> = seen.iter().map(|(t, v)| (*t, v.as_str())).collect();
    assert_eq!(seen, [("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "2")]);
}

#[tokio::test]
async fn watch_with_selector_turns_relabels_into_added_and_deleted() {
    let (_server, client) = start_with(Options::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("a", "1", &[("app", "x")]))
        .await
        .unwrap();
    let rv = api
        .get("a")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default().labels("app=y").timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "y"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "z"}}})),
    )
    .await
    .unwrap();
    let first = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(first, WatchEvent::Added(_)), "{first:?}");
    let second = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(second, WatchEvent::Deleted(_)), "{second:?}");
}

#[tokio::test]
async fn bookmarks_arrive_at_the_configured_interval() {
    let options = Options {
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    };
    let (_server, client) = start_with(options).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let WatchEvent::Bookmark(b) = ev else {
        panic!("{ev:?}")
    };
    assert!(b.metadata.resource_version.parse::<u64>().unwrap() >= rv.parse::<u64>().unwrap());
}

#[tokio::test]
async fn compacted_resource_versions_are_gone() {
    let (server, client) = start_with(Options::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("a", "1", &[]))
        .await
        .unwrap();
    let old = api
        .get("a")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &cm("b", "1", &[]))
        .await
        .unwrap();
    server.compact();
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &old)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
    let err = api
        .list(&ListParams::default().limit(1).at(&old))
        .await
        .unwrap_err();
    let kube::Error::Api(s) = err else {
        panic!("{err:?}")
    };
    assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn reflector_follows_changes_and_survives_an_outage() {
    let (server, client) = start_with(Options::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("before", "1", &[]))
        .await
        .unwrap();
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    let value = |name: &str| {
        reader
            .get(&kube::runtime::reflector::ObjectRef::new(name).within("default"))
            .map(|c| c.data.clone().unwrap()["k"].clone())
    };

    eventually("initial list", || {
        ready(value("before").as_deref() == Some("1"))
    })
    .await;
    api.create(&PostParams::default(), &cm("a", "1", &[]))
        .await
        .unwrap();
    eventually("create", || ready(value("a").as_deref() == Some("1"))).await;
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    eventually("update", || ready(value("a").as_deref() == Some("2"))).await;
    api.delete("before", &DeleteParams::default())
        .await
        .unwrap();
    eventually("delete", || ready(value("before").is_none())).await;

    server.stop().await;
    assert!(
        api.list(&ListParams::default()).await.is_err(),
        "stopped server still answers"
    );
    server.restart().await.unwrap();
    api.create(&PostParams::default(), &cm("after", "1", &[]))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "3"}})),
    )
    .await
    .unwrap();
    eventually("convergence after restart", || {
        ready(value("after").as_deref() == Some("1") && value("a").as_deref() == Some("3"))
    })
    .await;
    let mut names: Vec<String> = reader
        .state()
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "after", "kube-root-ca.crt"]);
    task.abort();
}

#[tokio::test]
async fn stop_breaks_open_watches_and_restart_keeps_state() {
    let (server, client) = start_with(Options::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let created = api
        .create(&PostParams::default(), &cm("a", "1", &[]))
        .await
        .unwrap();
    let rv: u64 = created
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        stream.try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    server.stop().await;
    // The open watch ends (with an error or EOF) instead of hanging.
    let ended = tokio::time::timeout(WAIT, async {
        while let Ok(Some(_)) = stream.try_next().await {}
    })
    .await;
    assert!(ended.is_ok(), "watch survived stop()");
    assert!(api.get("a").await.is_err());
    server.restart().await.unwrap();
    let again = api.get("a").await.unwrap();
    assert_eq!(again.metadata.uid, created.metadata.uid);
    let next = api
        .create(&PostParams::default(), &cm("b", "1", &[]))
        .await
        .unwrap();
    assert!(
        next.metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > rv
    );
    assert_eq!(
        code_of(server.restart().await),
        Some("the server is already running".to_string())
    );
}

fn code_of(r: Result<(), weir_test_apiserver::Error>) -> Option<String> {
    r.err().map(|e| e.to_string())
}

#[tokio::test]
async fn watcher_relists_after_410() {
    // A tiny history and a selector the churn does not match: the watcher's
    // resourceVersion stays old while the history moves past it.
    let options = Options {
        history_limit: 3,
        ..Default::default()
    };
    let (server, client) = start_with(options).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("w0", "1", &[("app", "w")]))
        .await
        .unwrap();
    let config = watcher::Config::default()
        .labels("app=w")
        .disable_bookmarks();
    let mut events = watcher(api.clone(), config).boxed();
    let mut saw_gone = false;
    let mut inits = 0;
    let mut applied = Vec::new();
    let churn = async {
        for i in 0..10 {
            api.create(
                &PostParams::default(),
                &cm(&format!("noise{i}"), "1", &[("app", "noise")]),
            )
            .await
            .unwrap();
        }
    };
    // Initial list, then churn while the watch is up, then an outage.
    while inits == 0 {
        match tokio::time::timeout(WAIT, events.next())
            .await
            .unwrap()
            .unwrap()
        {
            Ok(watcher::Event::InitDone) => inits += 1,
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    churn.await;
    server.stop().await;
    server.restart().await.unwrap();
    api.create(&PostParams::default(), &cm("w1", "1", &[("app", "w")]))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !(saw_gone && inits >= 2 && applied.contains(&"w1".to_string())) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, events.next())
            .await
            .expect("watcher progress")
            .unwrap()
        {
            Err(watcher::Error::WatchError(s)) if s.code == 410 => saw_gone = true,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(watcher::Event::InitDone) => inits += 1,
            Ok(watcher::Event::InitApply(c) | watcher::Event::Apply(c)) => {
                applied.extend(c.metadata.name)
            }
            Ok(_) => {}
        }
    }
}

#[tokio::test]
async fn streaming_list_sends_initial_events_then_a_bookmark() {
    let (_server, client) = start_with(Options::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("a", "1", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("b", "1", &[]))
        .await
        .unwrap();
    let mut events = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::InitApply(c) => initial.extend(c.metadata.name),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    // kube-root-ca.crt is in every namespace.
    assert_eq!(initial, ["a", "b", "kube-root-ca.crt"]);
    api.create(&PostParams::default(), &cm("c", "1", &[]))
        .await
        .unwrap();
    match tokio::time::timeout(WAIT, events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        watcher::Event::Apply(c) => assert_eq!(c.metadata.name.as_deref(), Some("c")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn recorder_publishes_events_k8s_io_events() {
    let (_server, client) = start_with(Options::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let obj = api
        .create(&PostParams::default(), &cm("subject", "1", &[]))
        .await
        .unwrap();
    let reference: ObjectReference = obj.object_ref(&());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "weir-test".into(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "Synced".into(),
        note: Some("first".into()),
        action: "Sync".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    // The same event again becomes a series on the same object.
    recorder.publish(&event, &reference).await.unwrap();
    let events: Api<EventV1> = Api::namespaced(client, "default");
    let list = events
        .list(&ListParams::default().fields("regarding.name=subject"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let ev = &list.items[0];
    assert_eq!(ev.reason.as_deref(), Some("Synced"));
    assert_eq!(ev.reporting_controller.as_deref(), Some("weir-test"));
    assert_eq!(ev.series.as_ref().map(|s| s.count), Some(2));
}
