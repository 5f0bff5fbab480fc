//! The extender's test server on loopback and HTTP helpers, beside the shared fixtures of
//! weft-testkit.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use weft_extender::{ExtenderConfig, ExtenderState, InMemoryView, KubeClusterView, KubePodBinder};
use weft_fakeapi::FakeApiServer;
pub use weft_testkit::*;
use weft_topology::NodeTopology;

/// An extender with API access over the fake API server, served on 127.0.0.1.
pub struct BindCluster {
    /// The API server.
    pub api: FakeApiServer,
    /// The extender's base URL.
    pub base: String,
    /// The extender's state.
    pub state: Arc<ExtenderState>,
    /// A client for its routes.
    pub http: reqwest::Client,
}

/// The fake API server with one node per `(name, topology)` (capacity: its GPUs).
pub async fn api_with_nodes(nodes: &[(&str, NodeTopology)]) -> FakeApiServer {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, PostParams};
    let api = FakeApiServer::start().await;
    let node_api: Api<Node> = Api::all(api.client());
    for (name, topology) in nodes {
        let mut n = node(name, Some(topology), topology.gpu_count());
        n.metadata.resource_version = None;
        n.metadata.uid = None;
        node_api.create(&PostParams::default(), &n).await.unwrap();
    }
    api
}

/// The fake API server with one node per `(name, topology)` (capacity: its GPUs), an extender over
/// it with the real reflector-backed view and binder.
pub async fn bind_cluster(nodes: &[(&str, NodeTopology)]) -> BindCluster {
    let api = api_with_nodes(nodes).await;
    let client = api.client();
    let view = KubeClusterView::spawn(client.clone());
    tokio::time::timeout(std::time::Duration::from_secs(60), view.wait_until_ready()).await.expect("the view syncs");
    let state = Arc::new(
        ExtenderState::new(Arc::new(view), ExtenderConfig::default())
            .with_binder(Arc::new(KubePodBinder::new(client).with_record_namespace("weft-system"))),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(weft_extender::serve(listener, state.clone(), Default::default(), std::future::pending()));
    BindCluster { api, base, state, http: reqwest::Client::new() }
}

/// Creates a pending pod in `ml` on `api` asking for `gpus` GPUs and the `extra` limits; returns it
/// as the API server stored it.
pub async fn create_pending(
    api: &FakeApiServer,
    name: &str,
    gpus: u32,
    extra: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Pod {
    use kube::api::{Api, PostParams};
    let mut v = pending_pod_json(name, gpus);
    for k in ["uid", "resourceVersion", "creationTimestamp", "ownerReferences"] {
        v["metadata"].as_object_mut().unwrap().remove(k);
    }
    v["status"] = serde_json::json!({});
    for (resource, amount) in extra {
        v["spec"]["containers"][0]["resources"]["limits"][*resource] = serde_json::json!(amount);
    }
    let pod = serde_json::from_value(v).unwrap();
    Api::namespaced(api.client(), "ml").create(&PostParams::default(), &pod).await.unwrap()
}

/// [`create_pending`] on the cluster's API server.
pub async fn pending(
    c: &BindCluster,
    name: &str,
    gpus: u32,
    extra: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Pod {
    create_pending(&c.api, name, gpus, extra).await
}

/// POSTs `body` to the extender's `verb`; expects 200 and returns the answer.
pub async fn post_verb(c: &BindCluster, verb: &str, body: &Value) -> Value {
    let r = c.http.post(format!("{}/{verb}", c.base)).json(body).send().await.unwrap();
    assert_eq!(r.status(), 200, "{verb}");
    r.json().await.unwrap()
}

/// The `ExtenderBindingArgs` that bind `pod` to `node`.
pub fn bind_args(pod: &k8s_openapi::api::core::v1::Pod, node: &str) -> Value {
    serde_json::json!({"PodName": pod.metadata.name, "PodNamespace": pod.metadata.namespace,
                       "PodUID": pod.metadata.uid, "Node": node})
}

/// An extender served on 127.0.0.1 with an ephemeral port.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The state behind it.
    pub state: Arc<ExtenderState>,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// Start serving `view` with `cfg`.
    pub async fn start(view: Arc<InMemoryView>, cfg: ExtenderConfig) -> TestServer {
        TestServer::start_with(view, cfg, weft_kube::http::ServeOptions::default()).await
    }

    /// Start serving `view` with `cfg` and these connection limits.
    pub async fn start_with(
        view: Arc<InMemoryView>,
        cfg: ExtenderConfig,
        opts: weft_kube::http::ServeOptions,
    ) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(ExtenderState::new(view, cfg));
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(weft_extender::serve(listener, state.clone(), opts, async move {
            let _ = rx.await;
        }));
        TestServer { base, state, shutdown: Some(tx), handle: Some(handle) }
    }

    /// Shut down gracefully and return what `serve` returned.
    pub async fn stop(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.handle.take().unwrap().await.unwrap()
    }
}

/// POST a JSON body; returns status and body text.
pub async fn post(url: &str, body: &Value) -> (u16, String) {
    post_raw(url, serde_json::to_vec(body).unwrap(), &[]).await
}

/// POST raw bytes with extra headers; returns status and body text.
pub async fn post_raw(url: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> (u16, String) {
    let client = reqwest::Client::new();
    let mut req = client.post(url).header("Content-Type", "application/json").body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}
