//! The extender over real HTTP on loopback, with bodies shaped as kube-scheduler sends them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{TestServer, post, post_raw};
use serde_json::{Value, json};
use weft_alloc::{PreparedNode, ScoreConfig, score_node};
use weft_extender::decision::spread;
use weft_extender::wire::{ExtenderFilterResult, HostPriority};
use weft_extender::{ExtenderConfig, InMemoryView, MAX_EXTENDER_PRIORITY};
use weft_record::TOPOLOGY_ANNOTATION;
use weft_topology::NodeTopology;

/// The extender score weft-alloc's `score_node` gives `topology` for `count` GPUs with all free.
/// weft-alloc's raw score of an empty node.
fn raw_score(topology: &NodeTopology, count: usize) -> u8 {
    let p = PreparedNode::new(topology).unwrap();
    let free: Vec<usize> = (0..p.len()).collect();
    score_node(&p, &free, count, &ScoreConfig::default()).unwrap().score
}

/// The extender priority of an empty node alone among the candidates.
fn expected_priority(topology: &NodeTopology, count: usize) -> i64 {
    let raw = raw_score(topology, count);
    spread(raw, raw, raw)
}

fn scores(body: &str) -> Vec<(String, i64)> {
    let list: Vec<HostPriority> = serde_json::from_str(body).unwrap();
    list.into_iter().map(|h| (h.host, h.score)).collect()
}

fn view_with(nodes: &[weft_extender::wire::WireNode]) -> Arc<InMemoryView> {
    let view = Arc::new(InMemoryView::new());
    for n in nodes {
        view.insert_node(n.to_node().unwrap());
    }
    view
}

fn wire(v: Value) -> weft_extender::wire::WireNode {
    serde_json::from_str(&v.to_string()).unwrap()
}

#[tokio::test]
async fn filter_with_node_objects_echoes_passing_nodes_and_explains_failures() {
    let nv = common::a100_nvswitch("nv");
    let busy = common::a100_nvswitch("busy");
    let small = common::pcie_only("small", 1);
    let view = Arc::new(InMemoryView::new());
    // Nodes come in the request; only the pods come from the view.
    view.insert_pod(common::bound_pod("hog", "busy", 7, Some("0,1,2,3,4,5,6"), "2026-01-05T09:00:00Z"));
    let server = TestServer::start(view, ExtenderConfig::default()).await;

    let mut nv_json = common::node_json("nv", Some(&nv), 8);
    nv_json["status"]["fieldFromANewerKubernetes"] = json!({"x": 1});
    let body = common::args_with_nodes(
        common::pending_pod_json("trainer-0", 2),
        vec![nv_json.clone(), common::node_json("busy", Some(&busy), 8), common::node_json("small", Some(&small), 1)],
    );
    let (status, text) = post(&format!("{}/filter", server.base), &body).await;
    assert_eq!(status, 200, "{text}");
    let raw: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(raw["Nodes"]["items"], json!([nv_json]), "passing node echoed unchanged");
    assert_eq!(raw["NodeNames"], Value::Null);
    assert_eq!(raw["Error"], json!(""));
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    let why = &result.failed_nodes["busy"];
    assert!(why.contains("not enough free GPUs") && why.contains("requests 2"), "{why}");
    assert!(!why.contains("of 8"), "filter reasons do not reveal the node's occupancy: {why}");
    let why = &result.failed_and_unresolvable_nodes["small"];
    assert!(why.contains("1 GPUs") && why.contains("requests 2"), "{why}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn filter_with_node_names_answers_a_subset_in_input_order() {
    let nodes = [
        wire(common::node_json("c", Some(&common::a100_nvswitch("c")), 8)),
        wire(common::node_json("a", Some(&common::dgx1_v100("a")), 8)),
        wire(common::node_json("replayed-full", Some(&common::dgx1_v100("replayed-full")), 8)),
        wire(common::node_json("b", Some(&common::pcie_only("b", 8)), 8)),
    ];
    let view = view_with(&nodes);
    // No annotations: the extender replays them (4 + 3 GPUs), leaving 1 free.
    view.insert_pod(common::bound_pod("p1", "replayed-full", 4, None, "2026-01-05T09:00:00Z"));
    view.insert_pod(common::bound_pod("p2", "replayed-full", 3, None, "2026-01-05T09:01:00Z"));
    let server = TestServer::start(view, ExtenderConfig::default()).await;

    // Exactly what kube-scheduler sends with nodeCacheCapable: true.
    let body = r#"{"Pod":{"metadata":{"name":"trainer-0","namespace":"ml","uid":"u1","creationTimestamp":"2026-01-05T11:00:00Z"},
        "spec":{"containers":[{"name":"trainer","image":"pytorch","resources":{"limits":{"nvidia.com/gpu":"2"},"requests":{"nvidia.com/gpu":"2"}}}],
        "schedulerName":"default-scheduler"},"status":{"phase":"Pending"}},
        "Nodes":null,"NodeNames":["c","a","replayed-full","b"]}"#;
    let (status, text) = post_raw(&format!("{}/filter", server.base), body.as_bytes().to_vec(), &[]).await;
    assert_eq!(status, 200, "{text}");
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(result.node_names, Some(vec!["c".into(), "a".into(), "b".into()]));
    assert_eq!(result.nodes, None);
    assert!(result.failed_nodes["replayed-full"].contains("not enough free GPUs"), "{result:?}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn lowercase_keys_request_is_answered_in_pascal_case() {
    let nodes = [wire(common::node_json("a", Some(&common::a100_nvswitch("a")), 8))];
    let server = TestServer::start(view_with(&nodes), ExtenderConfig::default()).await;
    let body = json!({"pod": common::pending_pod_json("p", 1), "nodes": null, "nodenames": ["a"]});
    let (status, text) = post(&format!("{}/filter", server.base), &body).await;
    assert_eq!(status, 200, "{text}");
    let raw: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(raw["NodeNames"], json!(["a"]));
    assert!(raw.get("FailedNodes").is_some() && raw.get("nodeNames").is_none(), "{raw}");
    let (status, text) = post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(status, 200, "{text}");
    let raw: Value = serde_json::from_str(&text).unwrap();
    assert!(raw[0].get("Host").is_some() && raw[0].get("Score").is_some(), "{raw}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn node_without_annotation_passes_filter_and_scores_zero_with_a_reason() {
    let nodes = [
        wire(common::node_json("bare", None, 8)),
        wire(common::node_json("nv", Some(&common::a100_nvswitch("nv")), 8)),
    ];
    let debug = ExtenderConfig { debug_reasons: true, ..ExtenderConfig::default() };
    let server = TestServer::start(view_with(&nodes), debug).await;
    for body in [
        common::args_with_names(common::pending_pod_json("p", 2), &["bare", "nv"]),
        common::args_with_nodes(
            common::pending_pod_json("p", 2),
            vec![common::node_json("bare", None, 8), common::node_json("nv", Some(&common::a100_nvswitch("nv")), 8)],
        ),
    ] {
        let (status, text) = post(&format!("{}/filter", server.base), &body).await;
        assert_eq!(status, 200, "{text}");
        let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
        assert!(result.failed_nodes.is_empty() && result.failed_and_unresolvable_nodes.is_empty(), "{result:?}");

        let url = format!("{}/prioritize", server.base);
        let (status, text) =
            post_raw(&url, serde_json::to_vec(&body).unwrap(), &[(weft_extender::server::DEBUG_HEADER, "true")]).await;
        assert_eq!(status, 200, "{text}");
        let list: Vec<HostPriority> = serde_json::from_str(&text).unwrap();
        assert_eq!(list[0].host, "bare");
        assert_eq!(list[0].score, 0);
        let reason = list[0].reason.as_deref().unwrap_or("");
        assert!(reason.contains(TOPOLOGY_ANNOTATION), "{reason}");
        assert_eq!(list[1].reason, None);

        let (_, text) = post(&url, &body).await;
        assert!(!text.contains("Reason"), "reasons only on request: {text}");
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn require_topology_rejects_nodes_without_a_readable_annotation() {
    let mut garbled = common::node_json("garbled", None, 8);
    garbled["metadata"]["annotations"][TOPOLOGY_ANNOTATION] = json!("{\"apiVersion\": 7");
    let nodes = [wire(common::node_json("bare", None, 8)), wire(garbled)];
    let cfg = ExtenderConfig { require_topology: true, ..ExtenderConfig::default() };
    let server = TestServer::start(view_with(&nodes), cfg).await;
    let body = common::args_with_names(common::pending_pod_json("p", 1), &["bare", "garbled", "unknown-node"]);
    let (status, text) = post(&format!("{}/filter", server.base), &body).await;
    assert_eq!(status, 200, "{text}");
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(result.node_names, Some(vec![]));
    let u = &result.failed_and_unresolvable_nodes;
    assert!(u["bare"].contains("no weft.io/gpu-topology annotation"), "{u:?}");
    assert!(u["garbled"].contains("garbled") && u["garbled"].contains(TOPOLOGY_ANNOTATION), "{u:?}");
    assert!(u["unknown-node"].contains("not in the extender's node cache"), "{u:?}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn nvlink_node_ranks_above_pcie_node_for_a_two_gpu_pod() {
    let nv = common::a100_nvswitch("nv");
    let pcie = common::sys_only("pcie", 8);
    let nodes = [wire(common::node_json("pcie", Some(&pcie), 8)), wire(common::node_json("nv", Some(&nv), 8))];
    let server = TestServer::start(view_with(&nodes), ExtenderConfig::default()).await;
    let body = common::args_with_names(common::pending_pod_json("p", 2), &["pcie", "nv"]);
    let (status, text) = post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(status, 200, "{text}");
    let got = scores(&text);
    let (lo, hi) = (raw_score(&pcie, 2), raw_score(&nv, 2));
    assert_eq!(got, vec![("pcie".into(), spread(lo, lo, hi)), ("nv".into(), 10)]);
    assert!(got[1].1 > got[0].1, "NVLink node must rank above the PCIe-only one: {got:?}");
    assert!(got.iter().all(|(_, s)| (0..=MAX_EXTENDER_PRIORITY).contains(s)));

    // Same answer when the nodes come as objects.
    let body = common::args_with_nodes(
        common::pending_pod_json("p", 2),
        vec![common::node_json("pcie", Some(&pcie), 8), common::node_json("nv", Some(&nv), 8)],
    );
    let (_, text2) = post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(scores(&text2), got);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn prioritize_scores_the_gpus_left_free_by_bound_pods() {
    let topo = common::dgx1_v100("n");
    let nodes = [wire(common::node_json("n", Some(&topo), 8))];
    let view = view_with(&nodes);
    view.insert_pod(common::bound_pod("a", "n", 4, Some("0,1,2,3"), "2026-01-05T09:00:00Z"));
    view.insert_pod(common::bound_pod("b", "n", 3, Some("4,5,6"), "2026-01-05T09:00:00Z"));
    let debug = ExtenderConfig { debug_reasons: true, ..ExtenderConfig::default() };
    let server = TestServer::start(view, debug).await;
    let body = common::args_with_names(common::pending_pod_json("p", 2), &["n"]);
    let url = format!("{}/prioritize", server.base);
    let (status, text) = post_raw(&url, serde_json::to_vec(&body).unwrap(), &[("X-Weft-Debug", "1")]).await;
    assert_eq!(status, 200, "{text}");
    let list: Vec<HostPriority> = serde_json::from_str(&text).unwrap();
    assert_eq!(list[0].score, 0);
    assert!(list[0].reason.as_deref().unwrap_or("").contains("1 of 8 GPUs free"), "{list:?}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn the_debug_header_is_ignored_unless_the_operator_turned_it_on() {
    let nodes = [wire(common::node_json("n", Some(&common::dgx1_v100("n")), 8))];
    let view = view_with(&nodes);
    view.insert_pod(common::bound_pod("a", "n", 7, Some("0,1,2,3,4,5,6"), "2026-01-05T09:00:00Z"));
    let server = TestServer::start(view, ExtenderConfig::default()).await;
    let body = common::args_with_names(common::pending_pod_json("p", 2), &["n"]);
    let url = format!("{}/prioritize", server.base);
    let (status, text) = post_raw(&url, serde_json::to_vec(&body).unwrap(), &[("X-Weft-Debug", "true")]).await;
    assert_eq!(status, 200, "{text}");
    let list: Vec<HostPriority> = serde_json::from_str(&text).unwrap();
    assert_eq!(list[0].reason, None, "no occupancy for any caller without --debug-reasons: {text}");
    assert!(!text.contains("GPUs free"), "{text}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_request_naming_more_nodes_than_the_cap_is_refused_before_any_work() {
    let nodes = [wire(common::node_json("a", Some(&common::a100_nvswitch("a")), 8))];
    let cfg = ExtenderConfig { max_nodes_per_request: 3, ..ExtenderConfig::default() };
    let server = TestServer::start(view_with(&nodes), cfg).await;
    let names = ["a", "b", "c", "d"];
    let body = common::args_with_names(common::pending_pod_json("p", 2), &names);
    let (status, text) = post(&format!("{}/filter", server.base), &body).await;
    assert_eq!(status, 200, "{text}");
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert!(result.error.contains("4 nodes") && result.error.contains("at most 3"), "{result:?}");
    assert_eq!(result.node_names, None, "no node passes a refused request");
    let (status, text) = post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("at most 3"), "{text}");
    // Within the cap the same request is answered.
    let body = common::args_with_names(common::pending_pod_json("p", 2), &names[..3]);
    let (status, _) = post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(status, 200);
    assert_eq!(server.state.cache().parses(), 1, "the refused requests parsed nothing");
    server.stop().await.unwrap();
}

#[test]
fn decisions_stop_at_the_deadline_instead_of_running_on() {
    // Many nodes whose GPU use must be replayed: work a deadline has to cut short.
    let view = Arc::new(InMemoryView::new());
    let names: Vec<String> = (0..64).map(|i| format!("n{i}")).collect();
    for name in &names {
        view.insert_node(wire(common::node_json(name, Some(&common::dgx1_v100(name)), 8)).to_node().unwrap());
        view.insert_pod(common::bound_pod(&format!("{name}-p"), name, 3, None, "2026-01-05T09:00:00Z"));
    }
    let state = weft_extender::ExtenderState::new(view, ExtenderConfig::default());
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let args: weft_extender::ExtenderArgs =
        serde_json::from_value(common::args_with_names(common::pending_pod_json("p", 2), &refs)).unwrap();
    let passed = weft_extender::decision::Deadline::at(std::time::Instant::now());
    match state.prioritize_until(&args, false, passed) {
        Err(weft_extender::ExtenderError::Expired(e)) => assert_eq!((e.done, e.total), (0, 64)),
        other => panic!("expected the deadline to stop prioritize, got {other:?}"),
    }
    assert!(state.filter_until(args.clone(), passed).is_err(), "filter stops too");
    // Without a deadline the same request completes, every node scored.
    let list = state.prioritize_until(&args, false, weft_extender::decision::Deadline::NEVER).unwrap();
    assert_eq!(list.len(), 64);
    assert!(list.iter().all(|h| h.score > 0), "{list:?}");
}

#[tokio::test]
async fn pod_without_gpus_passes_everywhere_with_one_neutral_score() {
    let nodes = [
        wire(common::node_json("nv", Some(&common::a100_nvswitch("nv")), 8)),
        wire(common::node_json("bare", None, 8)),
    ];
    let cfg = ExtenderConfig { require_topology: true, ..ExtenderConfig::default() };
    let neutral = cfg.neutral_score;
    let server = TestServer::start(view_with(&nodes), cfg).await;
    let body = common::args_with_names(common::pending_pod_json("web", 0), &["nv", "bare"]);
    let (_, text) = post(&format!("{}/filter", server.base), &body).await;
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(result.node_names, Some(vec!["nv".into(), "bare".into()]));
    let (_, text) = post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(scores(&text), vec![("nv".into(), neutral), ("bare".into(), neutral)]);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn malformed_json_gets_a_400_that_says_where() {
    let server = TestServer::start(Arc::new(InMemoryView::new()), ExtenderConfig::default()).await;
    for verb in ["filter", "prioritize"] {
        let url = format!("{}/{verb}", server.base);
        let (status, text) = post_raw(&url, b"{\"Pod\": {\"metadata\": ".to_vec(), &[]).await;
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("not ExtenderArgs JSON") && text.contains("line 1"), "{text}");
        let (status, text) = post_raw(&url, b"[1, 2]".to_vec(), &[]).await;
        assert_eq!(status, 400, "{text}");
        let (status, text) = post_raw(&url, br#"{"Pod": {"spec": {"containers": 7}}}"#.to_vec(), &[]).await;
        assert_eq!(status, 400, "{text}");
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn request_that_cannot_be_answered_sets_error_in_filter_and_400_in_prioritize() {
    let server = TestServer::start(Arc::new(InMemoryView::new()), ExtenderConfig::default()).await;
    let no_nodes = json!({"Pod": common::pending_pod_json("p", 1), "Nodes": null, "NodeNames": null});
    let (status, text) = post(&format!("{}/filter", server.base), &no_nodes).await;
    assert_eq!(status, 200, "{text}");
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(result.error, "request has neither Nodes nor NodeNames");
    let (status, text) = post(&format!("{}/prioritize", server.base), &no_nodes).await;
    assert_eq!(status, 400, "{text}");

    let mut pod = common::pending_pod_json("p", 1);
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("1500m");
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = json!("1500m");
    let (status, text) = post(&format!("{}/filter", server.base), &common::args_with_names(pod, &["a"])).await;
    assert_eq!(status, 200, "{text}");
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert!(result.error.contains("ml/p") && result.error.contains("1500m"), "{}", result.error);

    let (status, text) = post(&format!("{}/filter", server.base), &json!({"NodeNames": ["a"]})).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("request has no Pod"), "{text}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn oversized_body_gets_413() {
    let cfg = ExtenderConfig { max_body_bytes: 1024, ..ExtenderConfig::default() };
    let server = TestServer::start(Arc::new(InMemoryView::new()), cfg).await;
    let body = common::args_with_nodes(common::pending_pod_json("p", 1), vec![common::node_json("n", None, 8)]);
    let (status, text) = post(&format!("{}/filter", server.base), &body).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("1024"), "{text}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn ops_endpoint_reports_readiness_and_request_metrics_and_path_prefix_applies() {
    let view = Arc::new(InMemoryView::new());
    view.set_ready(false);
    let cfg = ExtenderConfig { path_prefix: "weft/".into(), ..ExtenderConfig::default() };
    let server = TestServer::start(view.clone(), cfg).await;
    let mut registry = weft_kube::ops::registry();
    server.state.register_metrics(&mut registry);
    let ops = weft_kube::ops::Ops::new(registry);
    server.state.add_readiness_check(&ops);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ops_base = format!("http://{}", listener.local_addr().unwrap());
    let ops_task = tokio::spawn(weft_kube::ops::serve(listener, ops.clone(), std::future::pending()));

    let client = reqwest::Client::new();
    let get = |path: &str| client.get(format!("{ops_base}{path}")).send();
    assert_eq!(get("/healthz").await.unwrap().status().as_u16(), 200);
    let not_ready = get("/readyz").await.unwrap();
    assert_eq!(not_ready.status().as_u16(), 503);
    assert!(not_ready.text().await.unwrap().contains("[-] cluster-view"), "the failing check is named");
    view.set_ready(true);
    assert_eq!(get("/readyz").await.unwrap().status().as_u16(), 200);

    let body = common::args_with_names(common::pending_pod_json("p", 0), &["a"]);
    let (status, _) = post(&format!("{}/weft/filter", server.base), &body).await;
    assert_eq!(status, 200);
    let (status, _) = post(&format!("{}/filter", server.base), &body).await;
    assert_eq!(status, 404);
    let (status, _) = post(&format!("{}/weft/prioritize", server.base), &serde_json::json!({"bad": 1})).await;
    assert_eq!(status, 400);

    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"weft_extender_requests_total{verb="filter",code="200"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"weft_extender_requests_total{verb="prioritize",code="400"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"weft_extender_request_duration_seconds_count{verb="filter"} 1"#), "{metrics}");
    ops_task.abort();
    server.stop().await.unwrap();
}

#[tokio::test]
async fn topology_annotation_is_parsed_once_per_resource_version() {
    let nodes = [wire(common::node_json("a", Some(&common::a100_nvswitch("a")), 8))];
    let view = view_with(&nodes);
    let server = TestServer::start(view.clone(), ExtenderConfig::default()).await;
    let body = common::args_with_names(common::pending_pod_json("p", 2), &["a"]);
    for _ in 0..3 {
        let (status, _) = post(&format!("{}/prioritize", server.base), &body).await;
        assert_eq!(status, 200);
    }
    assert_eq!(server.state.cache().parses(), 1);
    // A new topology under a new resourceVersion is read again.
    let mut changed = common::node("a", Some(&common::sys_only("a", 8)), 8);
    changed.metadata.resource_version = Some("1002".into());
    view.insert_node(changed);
    let (_, text) = post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(server.state.cache().parses(), 2);
    assert_eq!(scores(&text), vec![("a".into(), expected_priority(&common::sys_only("a", 8), 2))]);
    server.stop().await.unwrap();
}

/// Complete Node objects as kube-scheduler sends them with `nodeCacheCapable: false`, and the same
/// nodes in a view, with pods holding GPUs on some: `(view, the nodes' JSON, their names)`.
fn full_cluster() -> (Arc<InMemoryView>, Vec<Value>, Vec<String>) {
    let kinds: Vec<(&str, Option<NodeTopology>)> = vec![
        ("dgx1", Some(common::dgx1_v100("dgx1"))),
        ("a100", Some(common::a100_nvswitch("a100"))),
        ("vfs", Some(common::two_switches("vfs", weft_topology::PcieRelation::Pix, 4))),
        ("pcie4", Some(common::pcie_only("pcie4", 4))),
        ("sys8", Some(common::sys_only("sys8", 8))),
        ("bare", None),
    ];
    let view = Arc::new(InMemoryView::new());
    let (mut nodes, mut names) = (Vec::new(), Vec::new());
    for i in 0..24 {
        let (kind, topology) = &kinds[i % kinds.len()];
        let name = format!("{kind}-{i}");
        let gpus = topology.as_ref().map_or(8, NodeTopology::gpu_count);
        let vfs = topology.as_ref().map_or(0, |t| t.vfs().len());
        let text = topology.as_ref().map(weft_topology::inventory::to_json).unwrap_or_default();
        let mut node = common::kube_node_json(&name, i, kind, gpus, vfs, &text);
        if topology.is_none() {
            node["metadata"]["annotations"].as_object_mut().unwrap().remove(TOPOLOGY_ANNOTATION);
        }
        view.insert_node(serde_json::from_value(node.clone()).unwrap());
        // Every third node runs a pod holding some of its GPUs.
        let held = ["0", "0,1", "1,2,3"][(i / 3) % 3];
        if i % 3 == 0 && topology.is_some() {
            let pod = format!("job-{i}");
            let count = held.split(',').count() as u32;
            view.insert_pod(common::bound_pod(&pod, &name, count, Some(held), "2026-01-05T09:00:00Z"));
        }
        nodes.push(node);
        names.push(name);
    }
    (view, nodes, names)
}

#[tokio::test]
async fn complete_node_objects_get_the_decisions_their_names_get() {
    let (view, nodes, names) = full_cluster();
    let server = TestServer::start(view, ExtenderConfig::default()).await;
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    for gpus in [1, 2, 4, 8] {
        let pod = common::pending_pod_json("p", gpus);
        let by_nodes = common::args_with_nodes(pod.clone(), nodes.clone());
        let by_names = common::args_with_names(pod, &name_refs);
        let (status, a) = post(&format!("{}/filter", server.base), &by_nodes).await;
        assert_eq!(status, 200, "{a}");
        let (_, b) = post(&format!("{}/filter", server.base), &by_names).await;
        let (a, b): (ExtenderFilterResult, ExtenderFilterResult) =
            (serde_json::from_str(&a).unwrap(), serde_json::from_str(&b).unwrap());
        assert_eq!(a.error, "");
        assert_eq!(a.failed_nodes, b.failed_nodes, "{gpus} GPUs");
        assert_eq!(a.failed_and_unresolvable_nodes, b.failed_and_unresolvable_nodes, "{gpus} GPUs");
        assert!(!a.failed_nodes.is_empty() || gpus < 4, "some nodes are too full for {gpus} GPUs");
        let passed: Vec<&str> = a.nodes.as_ref().unwrap().items.iter().map(|n| n.name()).collect();
        assert_eq!(passed, b.node_names.as_ref().unwrap().iter().map(String::as_str).collect::<Vec<_>>());
        // The passing objects go back exactly as they came.
        for n in &a.nodes.as_ref().unwrap().items {
            let sent = nodes.iter().find(|v| v["metadata"]["name"] == n.name()).unwrap();
            assert_eq!(&serde_json::from_str::<Value>(n.raw_json()).unwrap(), sent);
        }
        let (status, a) = post(&format!("{}/prioritize", server.base), &by_nodes).await;
        assert_eq!(status, 200, "{a}");
        let (_, b) = post(&format!("{}/prioritize", server.base), &by_names).await;
        assert_eq!(scores(&a), scores(&b), "{gpus} GPUs");
        assert!(scores(&a).iter().any(|(_, s)| *s > 0));
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn node_objects_are_read_again_only_at_a_new_resource_version() {
    let (view, mut nodes, _) = full_cluster();
    let server = TestServer::start(view, ExtenderConfig::default()).await;
    let url = format!("{}/prioritize", server.base);
    let body = common::args_with_nodes(common::pending_pod_json("p", 2), nodes.clone());
    let (_, first) = post(&url, &body).await;
    let parsed = server.state.cache().parses();
    assert_eq!(parsed, 5, "one parse per distinct annotation");
    for _ in 0..3 {
        let (_, again) = post(&url, &body).await;
        assert_eq!(again, first);
    }
    assert_eq!(server.state.cache().parses(), parsed);
    // dgx1-0 now publishes an all-SYS topology at a new resourceVersion: read again and scored so.
    let sys = common::sys_only("dgx1-0", 8);
    nodes[0]["metadata"]["resourceVersion"] = json!("99000001");
    nodes[0]["metadata"]["annotations"][TOPOLOGY_ANNOTATION] = json!(weft_topology::inventory::to_json(&sys));
    let (_, changed) = post(&url, &common::args_with_nodes(common::pending_pod_json("p", 2), nodes)).await;
    assert_eq!(server.state.cache().parses(), parsed + 1);
    // dgx1-18 is dgx1-0's twin (same topology, same GPU held): equal before, ahead after.
    let (before, after) = (scores(&first), scores(&changed));
    assert_eq!((before[0].0.as_str(), before[18].0.as_str()), ("dgx1-0", "dgx1-18"));
    assert_eq!(before[0].1, before[18].1);
    assert!(after[0].1 < after[18].1, "all-SYS scores below NVLink: {:?} against {:?}", after[0], after[18]);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_node_field_outside_what_weft_reads_is_echoed_even_when_k8s_openapi_would_refuse_its_type() {
    let t = common::a100_nvswitch("n1");
    let mut node = common::kube_node_json("n1", 1, "a100", 8, 0, &weft_topology::inventory::to_json(&t));
    // A field whose type changed in a newer API (k8s-openapi expects a bool here).
    node["spec"]["unschedulable"] = json!({"since": "2026-01-05T10:00:00Z"});
    let server = TestServer::start(Arc::new(InMemoryView::new()), ExtenderConfig::default()).await;
    let body = common::args_with_nodes(common::pending_pod_json("p", 2), vec![node.clone()]);
    let (status, text) = post(&format!("{}/filter", server.base), &body).await;
    assert_eq!(status, 200, "{text}");
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(serde_json::from_str::<Value>(result.nodes.unwrap().items[0].raw_json()).unwrap(), node);
    let (status, text) = post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(scores(&text), vec![("n1".into(), expected_priority(&t, 2))]);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_topology_annotation_that_is_not_a_string_is_refused_naming_the_node_and_the_annotation() {
    let t = common::a100_nvswitch("n1");
    let good = common::kube_node_json("n0", 0, "a100", 8, 0, &weft_topology::inventory::to_json(&t));
    let mut bad = common::kube_node_json("n1", 1, "a100", 8, 0, "");
    bad["metadata"]["annotations"][TOPOLOGY_ANNOTATION] = json!({"apiVersion": "weft.io/v1alpha1"});
    let server = TestServer::start(Arc::new(InMemoryView::new()), ExtenderConfig::default()).await;
    let body = common::args_with_nodes(common::pending_pod_json("p", 2), vec![good, bad]);
    let (status, text) = post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("Nodes.items[1]"), "{text}");
    assert!(text.contains("metadata.annotations.weft.io/gpu-topology: expected a string"), "{text}");
    server.stop().await.unwrap();
}
