//! The bind verb on the fake API server, through the extender's HTTP routes as kube-scheduler
//! calls them: filter → prioritize → bind for 50 pods at once onto 4 nodes, a bind whose node
//! filled meanwhile, retried and GPU-less binds. The view is the real reflector-backed one, so the
//! gap between a bind and the watch showing it is real; reservations must cover it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bind_args, post_verb};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use weft_record::usage::parse_gpu_ids;
use weft_record::{GPU_DECISION_ANNOTATION, GPU_IDS_ANNOTATION, GpuDecision};

const HANG_GUARD: Duration = Duration::from_secs(60);

async fn guard<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("hung: {what}"))
}

type Cluster = common::BindCluster;

/// The fake API server with `nodes` (name, GPUs; PCIe-only topology) and an extender over it.
async fn cluster(nodes: &[(&str, usize)]) -> Cluster {
    let topologies: Vec<_> = nodes.iter().map(|(name, gpus)| (*name, common::pcie_only(name, *gpus))).collect();
    common::bind_cluster(&topologies).await
}

/// Creates a pending pod asking for `gpus` GPUs; returns it as the API server stored it.
async fn pending(c: &Cluster, name: &str, gpus: u32) -> Pod {
    common::pending(c, name, gpus, &[]).await
}

/// What kube-scheduler does for one pod with weft as its extender: filter, prioritize, take the
/// best node, bind; a failed bind is a failed attempt and the pod is tried again.
async fn schedule(c: &Cluster, pod: &Pod, nodes: &[&str]) -> Result<String, String> {
    let mut last = String::new();
    for _ in 0..20 {
        let args = json!({"Pod": pod, "NodeNames": nodes});
        let filtered = post_verb(c, "filter", &args).await;
        let passing: Vec<String> = serde_json::from_value(filtered["NodeNames"].clone()).unwrap_or_default();
        if passing.is_empty() {
            return Err(format!("no node passes: {filtered}"));
        }
        let scores = post_verb(c, "prioritize", &json!({"Pod": pod, "NodeNames": passing})).await;
        let best = scores.as_array().unwrap().iter().max_by_key(|h| h["Score"].as_i64()).unwrap()["Host"]
            .as_str()
            .unwrap()
            .to_string();
        let result = post_verb(c, "bind", &bind_args(pod, &best)).await;
        match result["Error"].as_str() {
            Some("") => return Ok(best),
            Some(e) => last = e.to_string(),
            None => panic!("bind answered {result}"),
        }
    }
    Err(last)
}

fn decision_of(pod: &Pod) -> Option<(Vec<usize>, GpuDecision)> {
    let a = pod.metadata.annotations.as_ref()?;
    let ids = parse_gpu_ids(a.get(GPU_IDS_ANNOTATION)?).unwrap();
    let decision = GpuDecision::from_annotation(a.get(GPU_DECISION_ANNOTATION)?).unwrap();
    Some((ids, decision))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_pods_bound_at_once_onto_four_nodes_never_share_a_gpu() {
    let names = ["n1", "n2", "n3", "n4"];
    let c = Arc::new(cluster(&names.map(|n| (n, 16))).await);
    // 14 pods of 2 GPUs and 36 of 1: exactly the 64 GPUs of the cluster.
    let mut pods = Vec::new();
    for i in 0..50 {
        pods.push(pending(&c, &format!("p{i:02}"), if i < 14 { 2 } else { 1 }).await);
    }
    let mut tasks = Vec::new();
    for pod in pods.clone() {
        let c = c.clone();
        tasks.push(tokio::spawn(async move { schedule(&c, &pod, &names).await }));
    }
    for (pod, task) in pods.iter().zip(tasks) {
        let node = guard("a pod to schedule", task).await.unwrap();
        assert!(node.is_ok(), "{}: {node:?}", pod.metadata.name.as_deref().unwrap());
    }
    let stored = Api::<Pod>::namespaced(c.api.client(), "ml").list(&Default::default()).await.unwrap();
    let mut held: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for pod in &stored.items {
        let name = pod.metadata.name.clone().unwrap();
        let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap_or_else(|| panic!("{name} is not bound"));
        let (ids, decision) = decision_of(pod).unwrap_or_else(|| panic!("{name} has no GPU decision"));
        let asked = if name.as_str() < "p14" { 2 } else { 1 };
        assert_eq!(ids.len(), asked, "{name}");
        assert_eq!((decision.node.as_str(), &decision.gpus), (node.as_str(), &ids), "{name}: the decision matches");
        for g in ids {
            assert!(held.entry(node.clone()).or_default().insert(g), "GPU {g} of {node} given twice (to {name})");
        }
    }
    assert_eq!(held.values().map(BTreeSet::len).sum::<usize>(), 64);
    // Everything the extender did (watches, pod reads, node records, bindings) is what its RBAC
    // grants; the test's own setup writes (nodes, pods) are left out.
    let extender_requests: Vec<_> = c
        .api
        .requests()
        .into_iter()
        .filter(|r| !(r.verb == weft_fakeapi::Verb::Create && r.resource != "leases" && r.subresource.is_none()))
        .collect();
    common::rbac::assert_granted(&extender_requests, &["base/scheduler-extender/rbac.yaml"]);
}

#[tokio::test]
async fn a_bind_whose_node_filled_meanwhile_writes_and_reserves_nothing() {
    let c = cluster(&[("small", 2)]).await;
    let a = pending(&c, "a", 2).await;
    let b = pending(&c, "b", 2).await;
    // Both passed filter while the node was empty; a binds first.
    assert_eq!(post_verb(&c, "bind", &bind_args(&a, "small")).await, json!({"Error": ""}));
    let refused = post_verb(&c, "bind", &bind_args(&b, "small")).await;
    let error = refused["Error"].as_str().unwrap();
    assert!(error.contains("node small has 0 free GPUs now; the pod asks for 2"), "{error}");
    let b_now = Api::<Pod>::namespaced(c.api.client(), "ml").get("b").await.unwrap();
    assert_eq!(b_now.spec.unwrap().node_name, None, "b is not bound");
    assert!(!b_now.metadata.annotations.unwrap_or_default().contains_key(GPU_IDS_ANNOTATION), "nor annotated");
    // b's failed bind reserved nothing. (a's reservation may already have ended: the watch can show
    // a on the node before b's bind, and its annotation then counts instead.)
    assert!(!c.state.reservations().holds("small", b.metadata.uid.as_deref().unwrap()), "b reserved nothing");
    assert!(c.state.reservations().len() <= 1);
    // Filter now sees the node full, whether or not the watch has shown a yet.
    let filtered = post_verb(&c, "filter", &json!({"Pod": b, "NodeNames": ["small"]})).await;
    assert_eq!(filtered["NodeNames"], json!([]), "{filtered}");
}

#[tokio::test]
async fn a_retried_bind_succeeds_and_a_pod_without_gpus_is_bound_without_a_decision() {
    let c = cluster(&[("n1", 8)]).await;
    let a = pending(&c, "a", 1).await;
    assert_eq!(post_verb(&c, "bind", &bind_args(&a, "n1")).await, json!({"Error": ""}));
    assert_eq!(post_verb(&c, "bind", &bind_args(&a, "n1")).await, json!({"Error": ""}), "the first write went through");
    let elsewhere = post_verb(&c, "bind", &bind_args(&a, "n2")).await;
    assert!(elsewhere["Error"].as_str().unwrap().contains("already bound to n1"), "{elsewhere}");

    let idle = pending(&c, "idle", 0).await;
    assert_eq!(post_verb(&c, "bind", &bind_args(&idle, "n1")).await, json!({"Error": ""}));
    let stored = Api::<Pod>::namespaced(c.api.client(), "ml").get("idle").await.unwrap();
    assert_eq!(stored.spec.as_ref().unwrap().node_name.as_deref(), Some("n1"));
    assert!(decision_of(&stored).is_none());

    let mut replaced = a.clone();
    replaced.metadata.uid = Some("another".into());
    let stale = post_verb(&c, "bind", &bind_args(&replaced, "n1")).await;
    assert!(stale["Error"].as_str().unwrap().contains("was replaced"), "{stale}");
}

/// The API requests the extender made since `from` (its watches' and the test's own setup left out).
fn pod_and_node_requests(c: &Cluster, from: usize) -> Vec<weft_fakeapi::RecordedRequest> {
    c.api.requests().into_iter().skip(from).filter(|r| r.verb != weft_fakeapi::Verb::Watch).collect()
}

#[tokio::test]
async fn names_that_kubernetes_would_refuse_are_refused_before_any_api_request() {
    let c = cluster(&[("n1", 8)]).await;
    let gp3 = pending(&c, "gp3", 1).await;
    let uid = gp3.metadata.uid.clone().unwrap();
    let before = c.api.requests().len();
    // A query smuggled into the name (it made a dry-run write that weft reported as done), a path
    // that climbs to a node, a slash, capitals, an empty name, and the same tricks in the
    // namespace and the node.
    let cases = [
        ("ml", "gp3?dryRun=All&x=", "n1", "pod name \"gp3?dryRun=All&x=\""),
        ("ml", "../../nodes/n1", "n1", "pod name \"../../nodes/n1\""),
        ("ml", "a/b", "n1", "pod name \"a/b\""),
        ("ml", "GP3", "n1", "pod name \"GP3\""),
        ("ml/../kube-system", "gp3", "n1", "namespace \"ml/../kube-system\""),
        ("", "gp3", "n1", "namespace \"\""),
        ("ml", "gp3", "n1/../n2", "node name \"n1/../n2\""),
    ];
    for (namespace, name, node, what) in cases {
        let args = json!({"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": node});
        let answer = post_verb(&c, "bind", &args).await;
        let error = answer["Error"].as_str().unwrap();
        assert!(error.contains(what) && error.contains("not a valid"), "{name}: {error}");
    }
    assert_eq!(pod_and_node_requests(&c, before), [], "nothing reached the API server");
    let stored = Api::<Pod>::namespaced(c.api.client(), "ml").get("gp3").await.unwrap();
    assert_eq!(stored.spec.unwrap().node_name, None, "gp3 is not bound");
    assert!(c.state.reservations().is_empty());
}
