//! The node side of the GPU engine end to end through the fake API server over HTTP: a node's
//! topology is published with `publish_topology`, pods are bound, and the extender — fed by the
//! reflector-backed `KubeClusterView` — filters and scores from what it watched. Also: the watches
//! recover from dropped streams and expired resourceVersions, and every request the extender and
//! the publisher made is granted by their RBAC manifests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use weft_extender::kube_view::POD_FIELD_SELECTOR;
use weft_extender::wire::{ExtenderFilterResult, HostPriorityList};
use weft_extender::{ClusterView, ExtenderConfig, ExtenderState, KubeClusterView};
use weft_fakeapi::{FakeApiServer, Verb};
use weft_record::{PublishOutcome, TOPOLOGY_ANNOTATION, publish_topology};

const HANG_GUARD: Duration = Duration::from_secs(30);

/// Wait until `cond` holds, re-checking after every watch event the view applies.
async fn until(view: &KubeClusterView, cond: impl Fn(&KubeClusterView) -> bool) {
    let mut rx = view.changes();
    tokio::time::timeout(HANG_GUARD, rx.wait_for(|_| cond(view)))
        .await
        .expect("condition reached")
        .expect("watch tasks alive");
}

/// A node as the kubelet registers it: capacity, no weft annotation.
fn bare_node(name: &str, gpus: usize) -> Node {
    let mut n = common::node(name, None, gpus);
    n.metadata.resource_version = None;
    n.metadata.uid = None;
    n
}

fn pod(name: &str, node: &str, gpus: u32, ids: Option<&str>) -> Pod {
    let mut p = common::bound_pod(name, node, gpus, ids, "2026-01-05T09:00:00Z");
    p.metadata.resource_version = None;
    p.metadata.uid = None;
    p
}

fn prioritize(state: &ExtenderState, gpus: u32, nodes: &[&str]) -> HostPriorityList {
    let args = serde_json::from_value(common::args_with_names(common::pending_pod_json("new", gpus), nodes)).unwrap();
    state.prioritize(&args, false).unwrap()
}

fn score_of(list: &HostPriorityList, node: &str) -> i64 {
    list.iter().find(|h| h.host == node).map(|h| h.score).unwrap_or_else(|| panic!("{node} scored"))
}

fn filter(state: &ExtenderState, gpus: u32, nodes: &[&str]) -> ExtenderFilterResult {
    let args = serde_json::from_value(common::args_with_names(common::pending_pod_json("new", gpus), nodes)).unwrap();
    state.filter(args)
}

#[tokio::test]
async fn publish_bind_and_score_end_to_end() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    for n in [bare_node("a", 8), bare_node("b", 8)] {
        nodes.create(&PostParams::default(), &n).await.unwrap();
    }

    // The extender starts before any topology is published.
    server.clear_requests();
    let view = Arc::new(KubeClusterView::spawn(client.clone()));
    tokio::time::timeout(HANG_GUARD, view.wait_until_ready()).await.expect("synced");
    let state = ExtenderState::new(view.clone(), ExtenderConfig::default());
    let before = prioritize(&state, 2, &["a", "b"]);
    assert_eq!((score_of(&before, "a"), score_of(&before, "b")), (0, 0), "no topology yet: score 0");

    // Node agents publish: a is an NVSwitch A100 node, b is PCIe-only.
    let agent = server.client();
    let a_topo = common::a100_nvswitch("a");
    let b_topo = common::pcie_only("b", 8);
    let out = publish_topology(agent.clone(), "a", &a_topo, "weft-agent").await.unwrap();
    assert_eq!(out, PublishOutcome::Updated { attempts: 1 });
    publish_topology(agent.clone(), "b", &b_topo, "weft-agent").await.unwrap();
    assert_eq!(
        publish_topology(agent.clone(), "a", &a_topo, "weft-agent").await.unwrap(),
        PublishOutcome::Unchanged,
        "publishing the same topology again writes nothing"
    );
    until(&view, |v| {
        ["a", "b"].iter().all(|n| v.node(n).is_some_and(|n| n.annotations().contains_key(TOPOLOGY_ANNOTATION)))
    })
    .await;

    let scored = prioritize(&state, 2, &["a", "b"]);
    let (a, b) = (score_of(&scored, "a"), score_of(&scored, "b"));
    assert!(a > b, "NVSwitch node a must outscore PCIe node b for a 2-GPU pod: a={a} b={b}");

    // Bind pods onto a until one GPU is left; the extender must see them through its pod watch.
    pods.create(&PostParams::default(), &pod("p1", "a", 4, Some("0,1,2,3"))).await.unwrap();
    pods.create(&PostParams::default(), &pod("p2", "a", 3, Some("4,5,6"))).await.unwrap();
    until(&view, |v| v.pods_on_node("a").len() == 2).await;
    let filtered = filter(&state, 2, &["a", "b"]);
    assert_eq!(filtered.node_names, Some(vec!["b".to_string()]), "{filtered:?}");
    assert!(filtered.failed_nodes["a"].contains("not enough free GPUs"), "{filtered:?}");

    // A pod that finishes leaves the field selector: the server sends DELETED, GPUs come back.
    pods.patch_status("p2", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Succeeded"}})))
        .await
        .unwrap();
    until(&view, |v| v.pods_on_node("a").len() == 1).await;
    assert_eq!(filter(&state, 2, &["a", "b"]).node_names, Some(vec!["a".to_string(), "b".to_string()]));

    // What the extender asked for: list + watch of nodes and (field-selected) pods, nothing else.
    let extender_requests: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.resource == "nodes" || r.resource == "pods")
        .filter(|r| matches!(r.verb, Verb::List | Verb::Watch))
        .collect();
    assert!(extender_requests.iter().any(|r| r.resource == "pods" && r.verb == Verb::Watch));
    assert!(extender_requests.iter().any(|r| r.resource == "nodes" && r.verb == Verb::Watch));
    common::rbac::assert_granted(&extender_requests, &["base/scheduler-extender/rbac.yaml"]);
}

#[tokio::test]
async fn requests_of_the_extender_and_the_publisher_are_granted_by_their_rbac() {
    let server = FakeApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    nodes.create(&PostParams::default(), &bare_node("a", 8)).await.unwrap();

    server.clear_requests();
    let view = KubeClusterView::spawn(server.client());
    tokio::time::timeout(HANG_GUARD, view.wait_until_ready()).await.expect("synced");
    // Both watches open (they start after the lists), then the view goes away.
    tokio::time::timeout(HANG_GUARD, server.wait_for(|s| s.open_watches() == 2)).await.expect("watching");
    drop(view);
    // Nodes and pods (the PodGroup watch retries on its own: this server has no Volcano CRD).
    let verbs: Vec<Verb> =
        server.requests().iter().filter(|r| ["nodes", "pods"].contains(&r.resource.as_str())).map(|r| r.verb).collect();
    assert_eq!(verbs.iter().filter(|v| **v == Verb::List).count(), 2, "{verbs:?}");
    assert_eq!(verbs.iter().filter(|v| **v == Verb::Watch).count(), 2, "{verbs:?}");
    common::rbac::assert_granted(&server.requests(), &["base/scheduler-extender/rbac.yaml"]);

    server.clear_requests();
    publish_topology(server.client(), "a", &common::a100_nvswitch("a"), "weft-agent").await.unwrap();
    let requests = server.requests();
    assert_eq!(requests.iter().map(|r| r.verb).collect::<Vec<_>>(), [Verb::Get, Verb::Patch]);
    common::rbac::assert_granted(&requests, &["base/agent/rbac.yaml"]);
}

#[tokio::test]
async fn view_slims_objects_and_uses_the_pod_field_selector() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let nv = common::a100_nvswitch("n1");
    let mut n1 = bare_node("n1", 8);
    n1.metadata.annotations =
        Some([(TOPOLOGY_ANNOTATION.to_string(), weft_topology::inventory::to_json(&nv))].into_iter().collect());
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &n1).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    pods.create(&PostParams::default(), &pod("p1", "n1", 2, Some("0,1"))).await.unwrap();
    // Not bound: outside the field selector, never seen.
    let mut pending = pod("pending", "n1", 1, None);
    pending.spec.as_mut().unwrap().node_name = None;
    pods.create(&PostParams::default(), &pending).await.unwrap();

    let view = KubeClusterView::spawn(client);
    tokio::time::timeout(HANG_GUARD, view.wait_until_ready()).await.expect("synced");
    tokio::time::timeout(HANG_GUARD, server.wait_for(|s| s.open_watches() == 2)).await.expect("watching");
    let node = view.node("n1").expect("node n1");
    let ann = node.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann.keys().collect::<Vec<_>>(), [TOPOLOGY_ANNOTATION], "other annotations dropped");
    assert!(node.status.is_none() && node.metadata.managed_fields.is_none(), "node slimmed");
    let on_n1 = view.pods_on_node("n1");
    assert_eq!(on_n1.len(), 1, "only the bound pod");
    let c = &on_n1[0].spec.as_ref().unwrap().containers[0];
    assert!(c.image.is_none() && c.resources.is_some(), "container slimmed to its resources");
    assert!(server.requests().iter().any(|r| r.resource == "pods" && r.verb == Verb::Watch));
    // The selector the view asked for is the one documented.
    assert_eq!(POD_FIELD_SELECTOR, "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed");
}

#[tokio::test]
async fn node_labels_stay_in_the_view_and_only_their_changes_move_the_network_revision() {
    let server = FakeApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    let mut n1 = bare_node("n1", 8);
    n1.metadata.labels = Some([("example.com/leaf".to_string(), "l1".to_string())].into());
    nodes.create(&PostParams::default(), &n1).await.unwrap();
    let view = KubeClusterView::spawn(server.client());
    tokio::time::timeout(HANG_GUARD, view.wait_until_ready()).await.expect("synced");
    let leaf =
        |v: &KubeClusterView| v.node("n1").and_then(|n| n.metadata.labels.clone()?.get("example.com/leaf").cloned());
    assert_eq!(leaf(&view).as_deref(), Some("l1"), "labels are kept (they describe the network)");
    let before = view.network_revision().unwrap();
    let version = view.node("n1").unwrap().metadata.resource_version.clone();
    // An annotation change (a heartbeat, a new topology) is not a network change.
    let annotate = json!({"metadata": {"annotations": {"example.com/note": "x"}}});
    nodes.patch("n1", &PatchParams::default(), &Patch::Merge(&annotate)).await.unwrap();
    until(&view, |v| v.node("n1").is_some_and(|n| n.metadata.resource_version != version)).await;
    assert_eq!(view.network_revision(), Some(before));
    // A label change is.
    let relabel = json!({"metadata": {"labels": {"example.com/leaf": "l2"}}});
    nodes.patch("n1", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    until(&view, |v| leaf(v).as_deref() == Some("l2")).await;
    assert_ne!(view.network_revision(), Some(before));
}

#[tokio::test]
async fn watches_recover_from_dropped_streams_and_expired_resource_versions() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &bare_node("a", 8)).await.unwrap();
    let view = KubeClusterView::spawn(client.clone());
    tokio::time::timeout(HANG_GUARD, view.wait_until_ready()).await.expect("synced");

    // The connection drops; changes made while no watch is open must still arrive.
    tokio::time::timeout(HANG_GUARD, server.wait_for(|s| s.open_watches() == 2)).await.expect("watching");
    let watches_before = count(&server, Verb::Watch);
    server.drop_watches();
    pods.create(&PostParams::default(), &pod("during-drop", "a", 1, Some("0"))).await.unwrap();
    until(&view, |v| v.pods_on_node("a").len() == 1).await;
    tokio::time::timeout(HANG_GUARD, server.wait_for(|s| count(s, Verb::Watch) >= watches_before + 2))
        .await
        .expect("both watches re-opened");

    // History compacted and the stream dropped: the re-watch gets 410 Gone, the view relists and
    // still converges (including a deletion it never saw as an event).
    let lists_before = count(&server, Verb::List);
    server.compact_history();
    server.expire_next_watches(2);
    server.drop_watches();
    pods.delete("during-drop", &DeleteParams::default()).await.unwrap();
    pods.create(&PostParams::default(), &pod("after-expiry", "a", 2, Some("1,2"))).await.unwrap();
    until(&view, |v| {
        v.pods_on_node("a").iter().map(|p| p.metadata.name.clone().unwrap()).eq(["after-expiry".to_string()])
    })
    .await;
    assert!(count(&server, Verb::List) > lists_before, "a 410 makes the watcher relist");
}

/// Requests with `verb` on nodes or pods.
fn count(server: &FakeApiServer, verb: Verb) -> usize {
    server.requests().iter().filter(|r| r.verb == verb).count()
}

#[tokio::test]
async fn publish_retries_injected_conflicts_and_server_errors_with_a_fresh_read() {
    use weft_fakeapi::RequestMatcher;
    let server = FakeApiServer::start().await;
    Api::<Node>::all(server.client()).create(&PostParams::default(), &bare_node("a", 8)).await.unwrap();
    server.fail_next(RequestMatcher::new(Verb::Patch, "nodes"), 409, 1);
    server.fail_next(RequestMatcher::new(Verb::Patch, "nodes"), 500, 1);
    server.clear_requests();
    let retry = weft_kube::RetryPolicy {
        max_attempts: 5,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
    };
    let t = common::a100_nvswitch("a");
    let out = weft_record::publish_topology_with(server.client(), "a", &t, "weft-agent", &retry).await.unwrap();
    assert_eq!(out, PublishOutcome::Updated { attempts: 3 });
    let verbs: Vec<Verb> = server.requests().iter().map(|r| r.verb).collect();
    assert_eq!(verbs, [Verb::Get, Verb::Patch, Verb::Get, Verb::Patch, Verb::Get, Verb::Patch], "read again each time");
    let stored = server.get("nodes", None, "a").unwrap();
    assert_eq!(stored["metadata"]["annotations"][TOPOLOGY_ANNOTATION], json!(weft_topology::inventory::to_json(&t)));
}

/// The batch lookups a request makes (`nodes`, `pods_revisions`, each under one lock) answer what
/// the per-name lookups answer, through creates, a pod change, a node deletion and a relist after
/// expired history (a node deleted while no watch was open must be gone from the batch too).
#[tokio::test]
async fn batch_lookups_agree_with_the_per_name_ones_through_changes_and_a_relist() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    for n in ["a", "b", "c"] {
        nodes.create(&PostParams::default(), &bare_node(n, 8)).await.unwrap();
    }
    let view = KubeClusterView::spawn(client.clone());
    tokio::time::timeout(HANG_GUARD, view.wait_until_ready()).await.expect("synced");
    let names: Vec<String> = ["a", "b", "c", "nope"].iter().map(|s| s.to_string()).collect();
    let agree = |view: &KubeClusterView| {
        let batch = view.nodes(&names);
        let revisions = view.pods_revisions(&names);
        assert_eq!(batch.len(), names.len());
        assert_eq!(revisions.len(), names.len());
        for ((name, node), revision) in names.iter().zip(&batch).zip(&revisions) {
            let single = view.node(name);
            assert_eq!(node.is_some(), single.is_some(), "{name}");
            if let (Some(a), Some(b)) = (node, &single) {
                assert!(Arc::ptr_eq(a, b), "{name}: the batch hands out the view's own object");
            }
            assert_eq!(*revision, view.pods_revision(name), "{name}");
        }
        batch.iter().map(Option::is_some).collect::<Vec<_>>()
    };
    assert_eq!(agree(&view), [true, true, true, false]);

    let before = view.pods_revisions(&names);
    pods.create(&PostParams::default(), &pod("p", "b", 1, Some("0"))).await.unwrap();
    until(&view, |v| v.pods_on_node("b").len() == 1).await;
    let after = view.pods_revisions(&names);
    assert_ne!(before[1], after[1], "a pod bound to b changes b's revision");
    assert_eq!((before[0], before[2]), (after[0], after[2]), "and no other node's");
    agree(&view);

    nodes.delete("a", &DeleteParams::default()).await.unwrap();
    until(&view, |v| v.node("a").is_none()).await;
    assert_eq!(agree(&view), [false, true, true, false]);

    // A deletion the watch never sees as an event: the relist must drop c from the batch too.
    tokio::time::timeout(HANG_GUARD, server.wait_for(|s| s.open_watches() == 2)).await.expect("watching");
    server.compact_history();
    server.expire_next_watches(2);
    server.drop_watches();
    nodes.delete("c", &DeleteParams::default()).await.unwrap();
    until(&view, |v| v.node("c").is_none()).await;
    assert_eq!(agree(&view), [false, true, false, false]);
}
