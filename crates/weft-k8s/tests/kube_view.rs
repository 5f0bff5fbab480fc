//! The reflector-backed cluster view against a small fake API server (list + streaming watch),
//! and the extender served from it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body as AxumBody;
use futures::StreamExt;
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use weft_k8s::kube_view::POD_FIELD_SELECTOR;
use weft_k8s::wire::ExtenderFilterResult;
use weft_k8s::{ClusterView, ExtenderConfig, ExtenderState, KubeClusterView, TOPOLOGY_ANNOTATION};

/// A fake API server for nodes and pods: fixed lists, watches fed from channels.
struct FakeApi {
    nodes: Vec<Value>,
    pods: Vec<Value>,
    node_events: Mutex<Option<mpsc::UnboundedReceiver<Value>>>,
    pod_events: Mutex<Option<mpsc::UnboundedReceiver<Value>>>,
    queries: Mutex<Vec<String>>,
}

impl FakeApi {
    fn respond(&self, req: &Request<Body>) -> Response<AxumBody> {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        self.queries.lock().unwrap().push(format!("{path}?{query}"));
        let (items, events) = match path.as_str() {
            "/api/v1/nodes" => (&self.nodes, &self.node_events),
            "/api/v1/pods" => (&self.pods, &self.pod_events),
            _ => return Response::builder().status(404).body(AxumBody::from("{}")).unwrap(),
        };
        if query.contains("watch=true") {
            // Events as NDJSON, then an open connection (a later re-watch gets only the latter).
            let rx = events.lock().unwrap().take();
            let stream = match rx {
                Some(rx) => tokio_stream_from(rx).boxed(),
                None => futures::stream::pending().boxed(),
            };
            return Response::new(AxumBody::from_stream(stream));
        }
        let list = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "10"}, "items": items});
        Response::new(AxumBody::from(list.to_string()))
    }
}

fn tokio_stream_from(
    mut rx: mpsc::UnboundedReceiver<Value>,
) -> impl futures::Stream<Item = Result<axum::body::Bytes, Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .map(|v| Ok(axum::body::Bytes::from(format!("{v}\n"))))
        .chain(futures::stream::pending())
}

fn fake(
    nodes: Vec<Value>,
    pods: Vec<Value>,
) -> (Client, Arc<FakeApi>, mpsc::UnboundedSender<Value>, mpsc::UnboundedSender<Value>) {
    let (ntx, nrx) = mpsc::unbounded_channel();
    let (ptx, prx) = mpsc::unbounded_channel();
    let api = Arc::new(FakeApi {
        nodes,
        pods,
        node_events: Mutex::new(Some(nrx)),
        pod_events: Mutex::new(Some(prx)),
        queries: Mutex::new(Vec::new()),
    });
    let a = api.clone();
    let svc = tower::service_fn(move |req: Request<Body>| {
        let a = a.clone();
        async move { Ok::<_, Infallible>(a.respond(&req)) }
    });
    (Client::new(svc, "default"), api, ntx, ptx)
}

fn pod_json(name: &str, node: &str, gpus: u32, ids: Option<&str>) -> Value {
    serde_json::to_value(common::bound_pod(name, node, gpus, ids, "2026-01-05T09:00:00Z")).unwrap()
}

/// Wait (bounded, as a hang guard) until `cond` holds, re-checking after every watch event.
async fn until(view: &KubeClusterView, cond: impl Fn(&KubeClusterView) -> bool) {
    let mut rx = view.changes();
    tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|_| cond(view)))
        .await
        .expect("condition reached")
        .expect("watch tasks alive");
}

#[tokio::test]
async fn view_lists_watches_and_slims_nodes_and_pods() {
    let nv = common::a100_nvswitch("n1");
    let (client, api, node_tx, pod_tx) =
        fake(vec![common::node_json("n1", Some(&nv), 8)], vec![pod_json("p1", "n1", 2, Some("0,1"))]);
    let view = KubeClusterView::spawn(client);
    tokio::time::timeout(Duration::from_secs(30), view.wait_until_ready()).await.expect("synced");
    assert!(view.is_ready());

    let node = view.node("n1").expect("node n1");
    let ann = node.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann.keys().collect::<Vec<_>>(), [TOPOLOGY_ANNOTATION], "other annotations dropped");
    assert!(node.status.is_none() && node.metadata.managed_fields.is_none(), "node slimmed");
    let pods = view.pods_on_node("n1");
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(pod.metadata.annotations.as_ref().unwrap()[weft_k8s::GPU_IDS_ANNOTATION], "0,1");
    let c = &pod.spec.as_ref().unwrap().containers[0];
    assert!(c.image.is_none() && c.resources.is_some(), "container slimmed to its resources");
    assert!(view.pods_on_node("n2").is_empty());

    let pod_query = api.queries.lock().unwrap().iter().find(|q| q.starts_with("/api/v1/pods")).cloned().unwrap();
    let selector = url_decode(pod_query.split("fieldSelector=").nth(1).unwrap().split('&').next().unwrap());
    assert_eq!(selector, POD_FIELD_SELECTOR);

    pod_tx.send(json!({"type": "ADDED", "object": pod_json("p2", "n1", 1, None)})).unwrap();
    until(&view, |v| v.pods_on_node("n1").len() == 2).await;
    pod_tx.send(json!({"type": "DELETED", "object": pod_json("p1", "n1", 2, Some("0,1"))})).unwrap();
    until(&view, |v| v.pods_on_node("n1").iter().map(|p| p.metadata.name.clone().unwrap()).eq(["p2".to_string()]))
        .await;

    let mut changed = common::node_json("n1", Some(&common::sys_only("n1", 8)), 8);
    changed["metadata"]["resourceVersion"] = json!("11");
    node_tx.send(json!({"type": "MODIFIED", "object": changed})).unwrap();
    until(&view, |v| v.node("n1").and_then(|n| n.metadata.resource_version.clone()).as_deref() == Some("11")).await;
}

fn url_decode(s: &str) -> String {
    let (b, mut out, mut i) = (s.as_bytes(), Vec::new(), 0);
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn extender_in_node_cache_mode_reads_nodes_and_pods_from_the_view() {
    let (client, _api, _ntx, _ptx) = fake(
        vec![
            common::node_json("free", Some(&common::a100_nvswitch("free")), 8),
            common::node_json("full", Some(&common::a100_nvswitch("full")), 8),
        ],
        vec![pod_json("big", "full", 7, None)],
    );
    let view = Arc::new(KubeClusterView::spawn(client));
    tokio::time::timeout(Duration::from_secs(30), view.wait_until_ready()).await.expect("synced");
    let state = ExtenderState::new(view, ExtenderConfig::default());
    let args = serde_json::from_value(common::args_with_names(common::pending_pod_json("p", 2), &["free", "full"]));
    let result: ExtenderFilterResult = state.filter(args.unwrap());
    assert_eq!(result.node_names, Some(vec!["free".to_string()]));
    assert!(result.failed_nodes["full"].contains("1 of 8 GPUs free"), "{result:?}");
}
