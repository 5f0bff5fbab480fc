//! WATCH semantics through kube's raw `Api::watch` and kube-runtime's `watcher`/reflector.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::{cm, labels, within};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use weft_fakeapi::{FakeApiConfig, FakeApiServer, Verb};

type Events = std::pin::Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Send>>;

async fn open(api: &Api<ConfigMap>, wp: &WatchParams, rv: &str) -> Events {
    within(api.watch(wp, rv)).await.unwrap().boxed()
}

async fn next(events: &mut Events) -> WatchEvent<ConfigMap> {
    within(events.next()).await.expect("stream ended").expect("watch error")
}

fn summary(ev: &WatchEvent<ConfigMap>) -> (String, String) {
    match ev {
        WatchEvent::Added(o) => ("ADDED".into(), o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Modified(o) => ("MODIFIED".into(), o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Deleted(o) => ("DELETED".into(), o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Bookmark(b) => ("BOOKMARK".into(), b.metadata.resource_version.clone()),
        WatchEvent::Error(e) => ("ERROR".into(), e.code.to_string()),
    }
}

fn rv_of(ev: &WatchEvent<ConfigMap>) -> u64 {
    let rv = match ev {
        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o.metadata.resource_version.clone(),
        WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.clone()),
        WatchEvent::Error(_) => None,
    };
    rv.unwrap().parse().unwrap()
}

fn pair(kind: &str, name: &str) -> (String, String) {
    (kind.to_owned(), name.to_owned())
}

#[tokio::test]
async fn events_replay_in_order_from_a_resource_version_then_go_live() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams::default(), &cm("a", &[]))).await.unwrap();
    let start = server.resource_version();
    within(api.create(&PostParams::default(), &cm("b", &[]))).await.unwrap();
    within(api.patch("a", &PatchParams::default(), &Patch::Merge(json!({ "data": { "x": "1" } })))).await.unwrap();
    within(api.delete("b", &DeleteParams::default())).await.unwrap();
    // A write in another namespace is not seen.
    let other: Api<ConfigMap> = Api::namespaced(server.client(), "other");
    within(other.create(&PostParams::default(), &cm("z", &[]))).await.unwrap();

    let mut events = open(&api, &WatchParams::default().disable_bookmarks(), &start.to_string()).await;
    let mut seen = Vec::new();
    let mut last_rv = start;
    for _ in 0..3 {
        let ev = next(&mut events).await;
        assert!(rv_of(&ev) > last_rv);
        last_rv = rv_of(&ev);
        seen.push(summary(&ev));
    }
    assert_eq!(seen, [pair("ADDED", "b"), pair("MODIFIED", "a"), pair("DELETED", "b")]);

    within(api.create(&PostParams::default(), &cm("c", &[]))).await.unwrap();
    assert_eq!(summary(&next(&mut events).await), pair("ADDED", "c"));
}

#[tokio::test]
async fn watch_without_resource_version_starts_with_current_objects() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams::default(), &cm("a", &[]))).await.unwrap();
    within(api.create(&PostParams::default(), &cm("b", &[]))).await.unwrap();
    let mut events = open(&api, &WatchParams::default().disable_bookmarks(), "0").await;
    assert_eq!(summary(&next(&mut events).await), pair("ADDED", "a"));
    assert_eq!(summary(&next(&mut events).await), pair("ADDED", "b"));
    within(api.delete("a", &DeleteParams::default())).await.unwrap();
    assert_eq!(summary(&next(&mut events).await), pair("DELETED", "a"));
    // A client that goes away closes its watch on the server.
    drop(events);
    within(server.wait_for(|s| s.open_watches() == 0)).await;
}

#[tokio::test]
async fn too_old_resource_version_is_410_gone() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams::default(), &cm("a", &[]))).await.unwrap();
    let old = server.resource_version();
    within(api.create(&PostParams::default(), &cm("b", &[]))).await.unwrap();
    server.compact_history();
    let mut events = open(&api, &WatchParams::default(), &old.to_string()).await;
    match next(&mut events).await {
        WatchEvent::Error(status) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(status.message.contains("too old resource version"), "{}", status.message);
        }
        other => panic!("{other:?}"),
    }
    assert!(within(events.next()).await.is_none(), "the stream ends after the error");
    // From the current resourceVersion it works.
    let mut events = open(&api, &WatchParams::default(), &server.resource_version().to_string()).await;
    within(api.create(&PostParams::default(), &cm("c", &[]))).await.unwrap();
    assert_eq!(summary(&next(&mut events).await), pair("ADDED", "c"));

    // A bounded history compacts by itself.
    let small = FakeApiServer::start_with(FakeApiConfig { history_limit: 2, ..Default::default() }).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(small.client(), "default");
    let start = small.resource_version();
    for name in ["a", "b", "c"] {
        within(api.create(&PostParams::default(), &cm(name, &[]))).await.unwrap();
    }
    let mut events = open(&api, &WatchParams::default(), &start.to_string()).await;
    assert_eq!(summary(&next(&mut events).await), pair("ERROR", "410"));
    let mut events = open(&api, &WatchParams::default(), &(start + 1).to_string()).await;
    assert_eq!(summary(&next(&mut events).await), pair("ADDED", "b"));
}

#[tokio::test]
async fn bookmarks_on_an_interval_and_on_demand() {
    let fast =
        FakeApiServer::start_with(FakeApiConfig { bookmark_interval: Duration::from_millis(50), ..Default::default() })
            .await
            .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(fast.client(), "default");
    within(api.create(&PostParams::default(), &cm("a", &[]))).await.unwrap();
    let now = fast.resource_version();
    let mut events = open(&api, &WatchParams::default(), &now.to_string()).await;
    let ev = next(&mut events).await;
    assert_eq!(summary(&ev), pair("BOOKMARK", &now.to_string()));
    match ev {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.types.kind, "ConfigMap");
            assert!(b.metadata.annotations.is_empty());
        }
        other => panic!("{other:?}"),
    }

    // Default interval (seconds): an on-demand bookmark arrives at once.
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut with = open(&api, &WatchParams::default(), &server.resource_version().to_string()).await;
    let mut without =
        open(&api, &WatchParams::default().disable_bookmarks(), &server.resource_version().to_string()).await;
    within(server.wait_for(|s| s.open_watches() == 2)).await;
    within(api.create(&PostParams::default(), &cm("x", &[]))).await.unwrap();
    server.send_bookmarks();
    assert_eq!(summary(&next(&mut with).await), pair("ADDED", "x"));
    let bm = next(&mut with).await;
    assert_eq!(summary(&bm), pair("BOOKMARK", &server.resource_version().to_string()));
    // The watch without bookmarks got none: its next event is the next write.
    assert_eq!(summary(&next(&mut without).await), pair("ADDED", "x"));
    within(api.create(&PostParams::default(), &cm("y", &[]))).await.unwrap();
    assert_eq!(summary(&next(&mut without).await), pair("ADDED", "y"));
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut events =
        open(&api, &WatchParams::default().timeout(1).disable_bookmarks(), &server.resource_version().to_string())
            .await;
    assert!(within(events.next()).await.is_none());
    within(server.wait_for(|s| s.open_watches() == 0)).await;
}

#[tokio::test]
async fn objects_leaving_the_selection_are_sent_as_deleted() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut events = open(
        &api,
        &WatchParams::default().labels("app=web").disable_bookmarks(),
        &server.resource_version().to_string(),
    )
    .await;
    let mut web = cm("a", &[]);
    web.metadata.labels = labels(&[("app", "web")]);
    within(api.create(&PostParams::default(), &web)).await.unwrap();
    assert_eq!(summary(&next(&mut events).await), pair("ADDED", "a"));

    let relabel = |app: &'static str| json!({ "metadata": { "labels": { "app": app } } });
    let moved = within(api.patch("a", &PatchParams::default(), &Patch::Merge(relabel("db")))).await.unwrap();
    let ev = next(&mut events).await;
    assert_eq!(summary(&ev), pair("DELETED", "a"));
    assert_eq!(rv_of(&ev).to_string(), moved.metadata.resource_version.unwrap());
    if let WatchEvent::Deleted(o) = &ev {
        assert_eq!(o.metadata.labels, labels(&[("app", "web")]), "the last matching state is sent");
    }
    // Changes while outside the selection are invisible; coming back is ADDED.
    within(api.patch("a", &PatchParams::default(), &Patch::Merge(json!({ "data": { "k": "v" } })))).await.unwrap();
    let mut other = cm("b", &[]);
    other.metadata.labels = labels(&[("app", "db")]);
    within(api.create(&PostParams::default(), &other)).await.unwrap();
    within(api.patch("a", &PatchParams::default(), &Patch::Merge(relabel("web")))).await.unwrap();
    assert_eq!(summary(&next(&mut events).await), pair("ADDED", "a"));
    within(api.patch("a", &PatchParams::default(), &Patch::Merge(json!({ "data": { "k": "w" } })))).await.unwrap();
    assert_eq!(summary(&next(&mut events).await), pair("MODIFIED", "a"));
    within(api.delete("a", &DeleteParams::default())).await.unwrap();
    assert_eq!(summary(&next(&mut events).await), pair("DELETED", "a"));

    // Field selectors too.
    let mut by_name = open(&api, &WatchParams::default().fields("metadata.name=b").disable_bookmarks(), "0").await;
    assert_eq!(summary(&next(&mut by_name).await), pair("ADDED", "b"));
}

#[tokio::test]
async fn streaming_list_sends_initial_events_then_an_end_bookmark() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for name in ["a", "b"] {
        within(api.create(&PostParams::default(), &cm(name, &[]))).await.unwrap();
    }
    let mut events = open(&api, &WatchParams::streaming_lists(), "0").await;
    assert_eq!(summary(&next(&mut events).await), pair("ADDED", "a"));
    assert_eq!(summary(&next(&mut events).await), pair("ADDED", "b"));
    match next(&mut events).await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str), Some("true"));
            assert_eq!(b.metadata.resource_version, server.resource_version().to_string());
        }
        other => panic!("{other:?}"),
    }

    // kube's watcher in streaming-list mode reaches InitDone and then sees live events.
    let mut stream = watcher::watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match within(stream.next()).await.unwrap().unwrap() {
            Event::Init => {}
            Event::InitApply(o) => initial.push(o.metadata.name.unwrap()),
            Event::InitDone => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(initial, ["a", "b"]);
    within(api.create(&PostParams::default(), &cm("c", &[]))).await.unwrap();
    match within(stream.next()).await.unwrap().unwrap() {
        Event::Apply(o) => assert_eq!(o.metadata.name.as_deref(), Some("c")),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.requests().iter().filter(|r| r.verb == Verb::List).count(), 0);
}

/// Drives a watcher until an event satisfies `done`, skipping errors (a dropped stream may
/// surface as one before the watcher resumes).
async fn until<S>(stream: &mut S, mut done: impl FnMut(&Event<ConfigMap>) -> bool)
where
    S: Stream<Item = Result<Event<ConfigMap>, watcher::Error>> + Unpin,
{
    within(async {
        while let Some(item) = stream.next().await {
            if let Ok(ev) = item
                && done(&ev)
            {
                return;
            }
        }
        panic!("watcher ended");
    })
    .await;
}

fn applied(name: &'static str) -> impl FnMut(&Event<ConfigMap>) -> bool {
    move |ev| matches!(ev, Event::Apply(o) if o.metadata.name.as_deref() == Some(name))
}

#[tokio::test]
async fn watcher_resumes_after_dropped_watches_without_relisting() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams::default(), &cm("a", &[]))).await.unwrap();
    let mut stream = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    until(&mut stream, |ev| matches!(ev, Event::InitDone)).await;
    // Poll once more so the watch request is made (the watcher is lazy), racing a write.
    within(api.create(&PostParams::default(), &cm("b", &[]))).await.unwrap();
    until(&mut stream, applied("b")).await;
    assert_eq!(server.open_watches(), 1);

    server.drop_watches();
    within(server.wait_for(|s| s.open_watches() == 0)).await;
    within(api.create(&PostParams::default(), &cm("c", &[]))).await.unwrap();
    until(&mut stream, applied("c")).await;

    let verbs: Vec<Verb> = server.requests().iter().filter(|r| r.resource == "configmaps").map(|r| r.verb).collect();
    assert_eq!(verbs.iter().filter(|v| **v == Verb::List).count(), 1, "{verbs:?}");
    assert_eq!(verbs.iter().filter(|v| **v == Verb::Watch).count(), 2, "{verbs:?}");
}

#[tokio::test]
async fn expired_watches_make_the_watcher_relist() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams::default(), &cm("a", &[]))).await.unwrap();
    let mut stream = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    until(&mut stream, |ev| matches!(ev, Event::InitDone)).await;
    within(api.create(&PostParams::default(), &cm("b", &[]))).await.unwrap();
    until(&mut stream, applied("b")).await;

    server.expire_next_watches(1);
    server.drop_watches();
    // The re-watch gets 410, so the watcher lists again (Init .. InitDone) and goes on.
    until(&mut stream, |ev| matches!(ev, Event::Init)).await;
    until(&mut stream, |ev| matches!(ev, Event::InitDone)).await;
    within(api.create(&PostParams::default(), &cm("c", &[]))).await.unwrap();
    until(&mut stream, applied("c")).await;
    let lists = server.requests().iter().filter(|r| r.verb == Verb::List).count();
    assert_eq!(lists, 2);
}

#[tokio::test]
async fn reflector_store_converges() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for name in ["a", "b"] {
        within(api.create(&PostParams::default(), &cm(name, &[]))).await.unwrap();
    }
    let (store, writer) = reflector::store();
    let mut stream = reflector::reflector(writer, watcher::watcher(api.clone(), watcher::Config::default())).boxed();
    // The reflector is driven here, and the store checked after every event it applies.
    let mut drive_until = async |done: &dyn Fn() -> bool| {
        within(async {
            while !done() {
                stream.next().await.expect("reflector ended").ok();
            }
        })
        .await;
    };
    drive_until(&|| store.state().len() == 2).await;

    within(api.create(&PostParams::default(), &cm("c", &[]))).await.unwrap();
    within(api.delete("a", &DeleteParams::default())).await.unwrap();
    server.drop_watches();
    within(api.patch("b", &PatchParams::default(), &Patch::Merge(json!({ "data": { "k": "v" } })))).await.unwrap();
    let converged = || {
        let mut names: Vec<String> = store.state().iter().map(|c| c.metadata.name.clone().unwrap()).collect();
        names.sort();
        let b = store.state().into_iter().find(|c| c.metadata.name.as_deref() == Some("b"));
        names == ["b", "c"] && b.is_some_and(|b| b.data.is_some())
    };
    drive_until(&converged).await;
}
