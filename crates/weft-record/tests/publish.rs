//! Publishing the topology annotation: exact request shapes against a tower-test mock API server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use weft_testkit as common;

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};
use weft_kube::{RetryPolicy, client_from};
use weft_record::{PublishError, PublishOutcome, TOPOLOGY_ANNOTATION, publish_topology_with};
use weft_topology::inventory;

type MockHandle = Handle<Request<Body>, Response<Body>>;

const NO_WAIT: RetryPolicy =
    RetryPolicy { max_attempts: 3, initial_backoff: Duration::ZERO, max_backoff: Duration::ZERO };

fn mock_client() -> (Client, MockHandle) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "default"), handle)
}

fn node_with(annotation: Option<&str>) -> Vec<u8> {
    let mut n = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-1", "resourceVersion": "77", "annotations": {"other": "x"}}});
    if let Some(a) = annotation {
        n["metadata"]["annotations"][TOPOLOGY_ANNOTATION] = json!(a);
    }
    serde_json::to_vec(&n).unwrap()
}

fn status(code: u16, reason: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{reason} for test"), "reason": reason, "code": code});
    Response::builder().status(code).body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap()
}

fn ok(body: Vec<u8>) -> Response<Body> {
    Response::builder().status(StatusCode::OK).body(Body::from(body)).unwrap()
}

/// Expect a GET of the node; answer `resp`.
async fn expect_get(handle: &mut MockHandle, resp: Response<Body>) {
    let (req, send) = handle.next_request().await.expect("a GET");
    assert_eq!(req.method(), Method::GET);
    assert_eq!(req.uri().path(), "/api/v1/nodes/gpu-1");
    send.send_response(resp);
}

/// Expect the merge PATCH carrying `value`; answer `resp`.
async fn expect_patch(handle: &mut MockHandle, value: &str, resp: Response<Body>) {
    let (req, send) = handle.next_request().await.expect("a PATCH");
    assert_eq!(req.method(), Method::PATCH);
    assert_eq!(req.uri().path(), "/api/v1/nodes/gpu-1");
    let query: Vec<(String, String)> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    assert!(query.contains(&("fieldManager".into(), "weft-agent".into())), "{query:?}");
    assert_eq!(req.headers()["content-type"], "application/merge-patch+json");
    let body: Value = serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(body, json!({"metadata": {"annotations": {TOPOLOGY_ANNOTATION: value}}}));
    send.send_response(resp);
}

/// Expect no further request: the handle ends when the client is dropped.
async fn expect_no_more(handle: &mut MockHandle) {
    assert!(handle.next_request().await.is_none(), "unexpected extra request");
}

async fn run<F: std::future::Future<Output = ()> + Send + 'static>(verifier: F) -> tokio::task::JoinHandle<()> {
    tokio::spawn(verifier)
}

async fn finish(verifier: tokio::task::JoinHandle<()>) {
    // A guard against a hung exchange, not a timing assertion.
    tokio::time::timeout(Duration::from_secs(30), verifier).await.expect("mock exchange finished").unwrap();
}

#[tokio::test]
async fn writes_the_inventory_json_with_a_get_then_a_merge_patch() {
    let topo = common::dgx1_v100("gpu-1");
    let value = inventory::to_json(&topo);
    let (client, mut handle) = mock_client();
    let v = value.clone();
    let verifier = run(async move {
        expect_get(&mut handle, ok(node_with(None))).await;
        expect_patch(&mut handle, &v, ok(node_with(Some(&v)))).await;
        expect_no_more(&mut handle).await;
    })
    .await;
    let out = publish_topology_with(client, "gpu-1", &topo, "weft-agent", &NO_WAIT).await.unwrap();
    assert_eq!(out, PublishOutcome::Updated { attempts: 1 });
    finish(verifier).await;
}

#[tokio::test]
async fn a_conflict_is_retried_after_reading_the_node_again() {
    let topo = common::a100_nvswitch("gpu-1");
    let value = inventory::to_json(&topo);
    let (client, mut handle) = mock_client();
    let v = value.clone();
    let verifier = run(async move {
        expect_get(&mut handle, ok(node_with(Some("{\"old\":1}")))).await;
        expect_patch(&mut handle, &v, status(409, "Conflict")).await;
        expect_get(&mut handle, ok(node_with(Some("{\"old\":1}")))).await;
        expect_patch(&mut handle, &v, ok(node_with(Some(&v)))).await;
        expect_no_more(&mut handle).await;
    })
    .await;
    let out = publish_topology_with(client, "gpu-1", &topo, "weft-agent", &NO_WAIT).await.unwrap();
    assert_eq!(out, PublishOutcome::Updated { attempts: 2 });
    finish(verifier).await;
}

#[tokio::test]
async fn a_current_value_is_not_written_again() {
    let topo = common::a100_nvswitch("gpu-1");
    let value = inventory::to_json(&topo);
    let (client, mut handle) = mock_client();
    let verifier = run(async move {
        expect_get(&mut handle, ok(node_with(Some(&value)))).await;
        expect_no_more(&mut handle).await;
    })
    .await;
    let out = publish_topology_with(client, "gpu-1", &topo, "weft-agent", &NO_WAIT).await.unwrap();
    assert_eq!(out, PublishOutcome::Unchanged);
    finish(verifier).await;
}

#[tokio::test]
async fn server_errors_are_retried_a_bounded_number_of_times() {
    let topo = common::a100_nvswitch("gpu-1");
    let (client, mut handle) = mock_client();
    let verifier = run(async move {
        for _ in 0..3 {
            expect_get(&mut handle, status(503, "ServiceUnavailable")).await;
        }
        expect_no_more(&mut handle).await;
    })
    .await;
    let err = publish_topology_with(client, "gpu-1", &topo, "weft-agent", &NO_WAIT).await.unwrap_err();
    assert!(matches!(err, PublishError::RetriesExhausted { attempts: 3, .. }), "{err}");
    finish(verifier).await;
}

#[tokio::test]
async fn missing_node_and_forbidden_are_not_retried() {
    let topo = common::a100_nvswitch("gpu-1");
    for (code, reason) in [(404, "NotFound"), (403, "Forbidden")] {
        let (client, mut handle) = mock_client();
        let verifier = run(async move {
            expect_get(&mut handle, status(code, reason)).await;
            expect_no_more(&mut handle).await;
        })
        .await;
        let err = publish_topology_with(client, "gpu-1", &topo, "weft-agent", &NO_WAIT).await.unwrap_err();
        match code {
            404 => assert!(matches!(&err, PublishError::NotFound { node } if node == "gpu-1"), "{err}"),
            _ => assert!(matches!(&err, PublishError::Api { .. }) && err.to_string().contains("gpu-1"), "{err}"),
        }
        finish(verifier).await;
    }
}

#[tokio::test]
async fn empty_field_manager_is_rejected_before_any_request() {
    let (client, mut handle) = mock_client();
    let verifier = run(async move { expect_no_more(&mut handle).await }).await;
    let err = publish_topology_with(client, "gpu-1", &common::a100_nvswitch("x"), "", &NO_WAIT).await.unwrap_err();
    assert!(matches!(err, PublishError::BadFieldManager(_)));
    finish(verifier).await;
}

const KUBECONFIG: &str = r#"apiVersion: v1
kind: Config
clusters:
- name: c1
  cluster: {server: "http://127.0.0.1:9"}
- name: c2
  cluster: {server: "http://127.0.0.1:10"}
users:
- name: u1
  user: {token: abc}
contexts:
- name: one
  context: {cluster: c1, user: u1, namespace: ml}
- name: two
  context: {cluster: c2, user: u1}
current-context: one
"#;

#[tokio::test]
async fn client_from_reads_a_kubeconfig_and_its_contexts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    std::fs::write(&path, KUBECONFIG).unwrap();
    let client = client_from(Some(path.clone()), None).await.unwrap();
    assert_eq!(client.default_namespace(), "ml");
    let client = client_from(Some(path.clone()), Some("two".into())).await.unwrap();
    assert_eq!(client.default_namespace(), "default");
    let Err(err) = client_from(Some(path.clone()), Some("three".into())).await else { panic!("unknown context") };
    let err = err.to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    let missing = dir.path().join("nope");
    let Err(err) = client_from(Some(missing.clone()), None).await else { panic!("missing file") };
    let err = err.to_string();
    assert!(err.contains(&missing.display().to_string()), "{err}");
}
