//! The node agent's publish loop against the fake API server: it publishes at start, writes the
//! annotation back when someone removes it, and refuses to publish "no GPUs" for a node whose
//! status advertises GPUs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use weft_testkit as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use weft_fakeapi::FakeApiServer;
use weft_kube::write::RetryPolicy;
use weft_record::TOPOLOGY_ANNOTATION;
use weft_record::node_agent::{Discover, PublisherConfig, PublisherMetrics, keep_topology_published};
use weft_topology::inventory;

const HANG_GUARD: Duration = Duration::from_secs(30);

fn config(node: &str) -> PublisherConfig {
    PublisherConfig {
        node: node.to_string(),
        field_manager: "weft-agent".into(),
        // Long enough that only the start-up tick and the watch drive these tests.
        interval: Duration::from_secs(3600),
        retry: RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
        },
    }
}

async fn node_with_capacity(server: &FakeApiServer, name: &str, gpus: usize) {
    let mut n = common::node(name, None, gpus);
    n.metadata.resource_version = None;
    n.metadata.uid = None;
    Api::<Node>::all(server.client()).create(&PostParams::default(), &n).await.unwrap();
}

#[tokio::test]
async fn publishes_at_start_and_restores_a_removed_annotation() {
    let server = FakeApiServer::start().await;
    node_with_capacity(&server, "a", 8).await;
    server.clear_requests();
    let topo = common::a100_nvswitch("a");
    let expected = inventory::to_json(&topo);
    let discover: Discover = Arc::new(move || Ok(topo.clone()));
    let (metrics, ready, stop) =
        (PublisherMetrics::default(), Arc::new(AtomicBool::new(false)), CancellationToken::new());
    let task = tokio::spawn(keep_topology_published(
        server.client(),
        config("a"),
        discover,
        metrics.clone(),
        ready.clone(),
        stop.clone(),
    ));
    let has = |want: &str| {
        let want = json!(want);
        move |v: &serde_json::Value| v["metadata"]["annotations"][TOPOLOGY_ANNOTATION] == want
    };
    tokio::time::timeout(HANG_GUARD, server.wait_for_object("nodes", None, "a", has(&expected))).await.unwrap();
    tokio::time::timeout(HANG_GUARD, server.wait_for(|_| ready.load(Ordering::Acquire))).await.unwrap();

    // Someone strips the annotation: the agent sees it on its node watch and writes it back.
    Api::<Node>::all(server.client())
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {TOPOLOGY_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    tokio::time::timeout(HANG_GUARD, server.wait_for_object("nodes", None, "a", has(&expected))).await.unwrap();
    stop.cancel();
    tokio::time::timeout(HANG_GUARD, task).await.unwrap().unwrap();
    assert_eq!(metrics.count("updated"), 2, "the first publish and the restore");
    // Everything but the test's own stripping patch was the agent's.
    let agent: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.verb != weft_fakeapi::Verb::Patch || r.field_manager.as_deref() == Some("weft-agent"))
        .collect();
    common::rbac::assert_granted(&agent, &["base/agent/rbac.yaml"]);
}

#[tokio::test]
async fn an_empty_discovery_is_not_published_on_a_node_that_advertises_gpus() {
    let server = FakeApiServer::start().await;
    node_with_capacity(&server, "gpu-node", 8).await;
    let discover: Discover = Arc::new(|| Ok(common::sys_only("gpu-node", 0)));
    let (metrics, ready, stop) =
        (PublisherMetrics::default(), Arc::new(AtomicBool::new(false)), CancellationToken::new());
    let task = tokio::spawn(keep_topology_published(
        server.client(),
        config("gpu-node"),
        discover,
        metrics.clone(),
        ready.clone(),
        stop.clone(),
    ));
    // The refusal reads the node (GET) and counts a discovery error; wait for that GET.
    tokio::time::timeout(
        HANG_GUARD,
        server.wait_for(|s| s.requests().iter().any(|r| r.verb == weft_fakeapi::Verb::Get && r.resource == "nodes")),
    )
    .await
    .unwrap();
    stop.cancel();
    tokio::time::timeout(HANG_GUARD, task).await.unwrap().unwrap();
    assert_eq!(metrics.count("discovery_error"), 1);
    assert_eq!(metrics.count("updated"), 0);
    assert!(!ready.load(Ordering::Acquire), "not ready without a publish");
    let node = server.get("nodes", None, "gpu-node").unwrap();
    assert!(node["metadata"]["annotations"].get(TOPOLOGY_ANNOTATION).is_none(), "nothing written");
}
