//! Two extender replicas over one API server (the shipped Deployment runs 2): each has its own
//! watch, its own in-process reservations and its own HTTP server, as two processes would, and
//! kube-scheduler's binds (or vc-scheduler's allocations) reach either. The nodes' shared records
//! (Leases written with a resourceVersion precondition) must keep them from giving a GPU twice,
//! through a replica's restart mid-bind and a scheduler's failover as well.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use weft_extender::reservations::NodeRecord;
use weft_extender::{
    ClusterView, ExtenderConfig, ExtenderState, InMemoryView, KubeClusterView, KubePodBinder, PodBinder,
};
use weft_fakeapi::{FakeApiServer, Verb};
use weft_record::GPU_IDS_ANNOTATION;
use weft_record::usage::parse_gpu_ids;

const HANG_GUARD: Duration = Duration::from_secs(60);

async fn guard<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("hung: {what}"))
}

/// The namespace of the record Leases (the extender's, as deploy/ installs it).
const NAMESPACE: &str = "weft-system";

/// One extender replica: its own state and server.
struct Replica {
    base: String,
    state: Arc<ExtenderState>,
    /// Its watch, when it has a real one.
    watch: Option<Arc<KubeClusterView>>,
}

/// Starts a replica over `view` with `binder`.
async fn replica(view: Arc<dyn ClusterView>, binder: Arc<dyn PodBinder>, cfg: ExtenderConfig) -> Replica {
    let state = Arc::new(ExtenderState::new(view, cfg).with_binder(binder));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(weft_extender::serve(listener, state.clone(), Default::default(), std::future::pending()));
    Replica { base, state, watch: None }
}

/// A replica with its own reflector-backed view (its own watch) of `api`.
async fn watching_replica(api: &FakeApiServer) -> Replica {
    let view = Arc::new(KubeClusterView::spawn(api.client()));
    guard("the view to sync", view.wait_until_ready()).await;
    let binder = Arc::new(KubePodBinder::new(api.client()).with_record_namespace(NAMESPACE));
    Replica { watch: Some(view.clone()), ..replica(view, binder, ExtenderConfig::default()).await }
}

/// A view that knows the nodes but never sees a pod bound: a watch lagging behind every bind.
fn lagging_view(nodes: &[(&str, usize)]) -> Arc<InMemoryView> {
    let view = InMemoryView::new();
    for (name, gpus) in nodes {
        view.insert_node(common::node(name, Some(&common::pcie_only(name, *gpus)), *gpus));
    }
    Arc::new(view)
}

/// The fake API server with one PCIe-only node of `gpus` GPUs per `(name, gpus)`.
async fn api_with_nodes(nodes: &[(&str, usize)]) -> FakeApiServer {
    let topologies: Vec<_> = nodes.iter().map(|(name, gpus)| (*name, common::pcie_only(name, *gpus))).collect();
    common::api_with_nodes(&topologies).await
}

async fn pending(api: &FakeApiServer, name: &str, gpus: u32) -> Pod {
    common::create_pending(api, name, gpus, &[]).await
}

async fn post(r: &Replica, verb: &str, body: &Value) -> Value {
    let (status, text) = common::post(&format!("{}/{verb}", r.base), body).await;
    assert_eq!(status, 200, "{verb}: {text}");
    serde_json::from_str(&text).unwrap()
}

async fn bind(r: &Replica, pod: &Pod, node: &str) -> String {
    let answer = post(r, "bind", &common::bind_args(pod, node)).await;
    answer["Error"].as_str().unwrap().to_string()
}

/// Every stored pod's node and GPUs; panics if one GPU of a node is held by two pods.
async fn assert_no_gpu_twice(api: &FakeApiServer) -> BTreeMap<String, BTreeSet<usize>> {
    let stored = Api::<Pod>::namespaced(api.client(), "ml").list(&Default::default()).await.unwrap();
    let mut held: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for pod in &stored.items {
        let name = pod.metadata.name.clone().unwrap();
        let Some(node) = pod.spec.as_ref().unwrap().node_name.clone() else { continue };
        let Some(ids) = pod.metadata.annotations.as_ref().and_then(|a| a.get(GPU_IDS_ANNOTATION)) else { continue };
        for g in parse_gpu_ids(ids).unwrap() {
            assert!(held.entry(node.clone()).or_default().insert(g), "GPU {g} of {node} given twice (to {name})");
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_alternating_between_replicas_whose_watches_lag_never_share_a_gpu() {
    let nodes = [("n1", 8), ("n2", 8)];
    let api = api_with_nodes(&nodes).await;
    let binder = || Arc::new(KubePodBinder::new(api.client()).with_record_namespace(NAMESPACE));
    // Neither replica's view ever shows a bound pod: only the records can tell them apart.
    let a = replica(lagging_view(&nodes), binder(), ExtenderConfig::default()).await;
    let b = replica(lagging_view(&nodes), binder(), ExtenderConfig::default()).await;
    for i in 0..16 {
        let pod = pending(&api, &format!("p{i:02}"), 1).await;
        let (to, node) = (if i % 2 == 0 { &a } else { &b }, if i < 8 { "n1" } else { "n2" });
        assert_eq!(bind(to, &pod, node).await, "", "p{i:02}");
    }
    let held = assert_no_gpu_twice(&api).await;
    assert_eq!(held.values().map(BTreeSet::len).sum::<usize>(), 16, "every pod got its own GPU");
    // A 17th pod on a full node is refused by either replica.
    let extra = pending(&api, "extra", 1).await;
    for r in [&a, &b] {
        let error = bind(r, &extra, "n1").await;
        assert!(error.contains("node n1 has 0 free GPUs now"), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_pods_bound_at_once_through_two_replicas_never_share_a_gpu() {
    let names = ["n1", "n2", "n3", "n4"];
    let api = api_with_nodes(&names.map(|n| (n, 16))).await;
    let replicas = Arc::new([watching_replica(&api).await, watching_replica(&api).await]);
    // 14 pods of 2 GPUs and 36 of 1: exactly the 64 GPUs of the cluster.
    let mut pods = Vec::new();
    for i in 0..50 {
        pods.push(pending(&api, &format!("p{i:02}"), if i < 14 { 2 } else { 1 }).await);
    }
    let mut tasks = Vec::new();
    for (i, pod) in pods.iter().cloned().enumerate() {
        let replicas = replicas.clone();
        // kube-scheduler's cycle: filter, prioritize, bind; each call goes to the replica the
        // Service picks, here alternating; a failed bind is a failed attempt, tried again.
        tasks.push(tokio::spawn(async move {
            let mut last = String::new();
            for attempt in 0..20 {
                let r = &replicas[(i + attempt) % 2];
                let filtered = post(r, "filter", &json!({"Pod": pod, "NodeNames": names})).await;
                let passing: Vec<String> = serde_json::from_value(filtered["NodeNames"].clone()).unwrap_or_default();
                let Some(best) = passing.first() else { return Err(format!("no node passes: {filtered}")) };
                let r = &replicas[(i + attempt + 1) % 2];
                match bind(r, &pod, best).await.as_str() {
                    "" => return Ok(()),
                    e => last = e.to_string(),
                }
            }
            Err(last)
        }));
    }
    for (pod, task) in pods.iter().zip(tasks) {
        let outcome = guard("a pod to schedule", task).await.unwrap();
        assert!(outcome.is_ok(), "{}: {outcome:?}", pod.metadata.name.as_deref().unwrap());
    }
    let held = assert_no_gpu_twice(&api).await;
    assert_eq!(held.values().map(BTreeSet::len).sum::<usize>(), 64);
    // What the replicas did (watches, pod reads, node records, bindings) is what their RBAC grants.
    let made: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| !(r.verb == Verb::Create && r.subresource.is_none() && r.resource != "leases"))
        .collect();
    assert!(made.iter().any(|r| r.resource == "leases" && r.verb == Verb::Update), "the records were used");
    weft_testkit::rbac::assert_granted(&made, &["base/scheduler-extender/rbac.yaml"]);
    for r in replicas.iter() {
        assert!(r.state.reservations().len() <= 50);
    }
}

/// A binder whose process ends while it creates the Binding: everything before it happens, the
/// Binding and whatever would follow never do (the request's future is dropped at its timeout, as
/// a killed process's work stops).
struct DiesAtBinding(KubePodBinder);

#[async_trait]
impl PodBinder for DiesAtBinding {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, String> {
        self.0.pod(namespace, name).await
    }
    async fn resource_claim(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        self.0.resource_claim(namespace, name).await
    }
    async fn bind(&self, _: &str, _: &str, _: &str, _: &str, _: BTreeMap<String, String>) -> Result<(), String> {
        std::future::pending().await
    }
    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        version: Option<&str>,
        annotations: BTreeMap<String, Option<String>>,
    ) -> Result<(), String> {
        self.0.annotate(namespace, name, uid, version, annotations).await
    }
    async fn node_record(&self, node: &str) -> Result<(Option<String>, NodeRecord), String> {
        self.0.node_record(node).await
    }
    async fn write_node_record(&self, node: &str, version: Option<&str>, record: &NodeRecord) -> Result<bool, String> {
        self.0.write_node_record(node, version, record).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_dying_mid_bind_and_a_scheduler_failover_book_no_gpu_twice() {
    let nodes = [("n1", 4)];
    let api = api_with_nodes(&nodes).await;
    let binder = || KubePodBinder::new(api.client()).with_record_namespace(NAMESPACE);
    let a = pending(&api, "a", 2).await;
    let b = pending(&api, "b", 2).await;
    let c = pending(&api, "c", 2).await;

    // Replica 1 decides for a, writes n1's record, and dies creating the Binding: kube-scheduler
    // gets its timeout as the answer.
    let short = ExtenderConfig { request_timeout: Duration::from_millis(300), ..ExtenderConfig::default() };
    let dying = replica(lagging_view(&nodes), Arc::new(DiesAtBinding(binder())), short).await;
    let error = bind(&dying, &a, "n1").await;
    assert!(error.contains("did not finish"), "{error}");
    drop(dying);
    let lease = api.get("leases.coordination.k8s.io", Some(NAMESPACE), "weft-reservations.n1").expect("n1's record");
    let record = NodeRecord::parse(lease["metadata"]["annotations"]["weft.io/node-reservations"].as_str()).unwrap();
    assert_eq!(record.held.len(), 1, "a's decision outlived its replica: {record:?}");
    let a_gpus: BTreeSet<usize> = record.held[0].gpus.iter().copied().collect();

    // Replica 1 restarts (empty memory) and replica 2 was never told: b, bound through the
    // restarted replica, gets the other two GPUs; c, through replica 2, finds n1 full.
    let restarted = replica(lagging_view(&nodes), Arc::new(binder()), ExtenderConfig::default()).await;
    let other = replica(lagging_view(&nodes), Arc::new(binder()), ExtenderConfig::default()).await;
    assert_eq!(bind(&restarted, &b, "n1").await, "");
    let error = bind(&other, &c, "n1").await;
    assert!(error.contains("node n1 has 0 free GPUs now"), "{error}");

    // kube-scheduler fails over; the new leader binds a again, through replica 2: a's own entry is
    // not in its way, b's is.
    assert_eq!(bind(&other, &a, "n1").await, "");
    let held = assert_no_gpu_twice(&api).await;
    assert_eq!(held["n1"].len(), 4);
    let stored = Api::<Pod>::namespaced(api.client(), "ml").get("a").await.unwrap();
    let ids: BTreeSet<usize> =
        parse_gpu_ids(&stored.metadata.annotations.unwrap()[GPU_IDS_ANNOTATION]).unwrap().into_iter().collect();
    assert_eq!(ids, a_gpus, "a gets the GPUs its first decision held");
}

/// vc-scheduler's `api.TaskInfo` with the fields weft reads (tests/volcano.rs sends it whole).
fn task(pod: &Pod, node: &str, status: u32) -> Value {
    json!({"UID": pod.metadata.uid, "Name": pod.metadata.name, "Namespace": "ml", "NodeName": node,
           "Status": status, "Pod": pod})
}

async fn event(r: &Replica, verb: &str, task: Value) -> String {
    let answer = post(r, &format!("volcano/{verb}"), &json!({"task": task})).await;
    answer["errorMessage"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_whose_calls_reach_different_replicas_sees_its_evictions() {
    const PIPELINED: u32 = 1 << 2;
    const RUNNING: u32 = 1 << 5;
    const RELEASING: u32 = 1 << 6;
    let api = api_with_nodes(&[("n1", 4)]).await;
    let victim = api.insert_typed(&common::bound_pod("low", "n1", 4, Some("0,1,2,3"), "2026-01-05T10:00:00Z")).unwrap();
    let (a, b) = (watching_replica(&api).await, watching_replica(&api).await);
    // Both watches show the running victim before the session starts.
    for r in [&a, &b] {
        let view = r.watch.clone().unwrap();
        let mut changes = view.changes();
        guard("the victim in the view", changes.wait_for(|_| !view.pods_on_node("n1").is_empty())).await.unwrap();
    }
    let preemptor = pending(&api, "high", 4).await;
    // Statement.Evict(low) reaches replica a, Pipeline(high) replica b.
    assert_eq!(event(&a, "deallocate", task(&victim, "n1", RELEASING)).await, "");
    assert_eq!(event(&b, "allocate", task(&preemptor, "n1", PIPELINED)).await, "", "b sees a's eviction mark");
    // Discard: unPipeline(high) on a, unevict(low) on b; the victim keeps its GPUs and is untouched.
    assert_eq!(event(&a, "deallocate", task(&preemptor, "n1", 1)).await, "");
    assert_eq!(event(&b, "allocate", task(&victim, "n1", RUNNING)).await, "");
    let stored = Api::<Pod>::namespaced(api.client(), "ml").get("low").await.unwrap();
    assert_eq!(stored.metadata.resource_version, victim.metadata.resource_version, "the victim was not written");
    let again = event(&a, "allocate", task(&preemptor, "n1", PIPELINED)).await;
    assert!(again.contains("0 free GPUs now"), "the eviction was undone for every replica: {again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_watch_caught_up_keeps_the_entries_a_lagging_replica_relies_on() {
    let nodes = [("n1", 4)];
    let api = api_with_nodes(&nodes).await;
    let binder = || Arc::new(KubePodBinder::new(api.client()).with_record_namespace(NAMESPACE));
    // Three replicas (or two, one of them restarted): p is bound through the first.
    let fast_view = lagging_view(&nodes);
    let first = replica(lagging_view(&nodes), binder(), ExtenderConfig::default()).await;
    let fast = replica(fast_view.clone(), binder(), ExtenderConfig::default()).await;
    let slow = replica(lagging_view(&nodes), binder(), ExtenderConfig::default()).await;
    let [p, q, r] = [pending(&api, "p", 1).await, pending(&api, "q", 1).await, pending(&api, "r", 1).await];
    assert_eq!(bind(&first, &p, "n1").await, "");
    // The fast replica's watch shows p bound, with its GPU; the slow one's shows nothing yet.
    fast_view.insert_pod(Api::<Pod>::namespaced(api.client(), "ml").get("p").await.unwrap());
    assert_eq!(bind(&fast, &q, "n1").await, "");
    assert_eq!(bind(&slow, &r, "n1").await, "");
    let held = assert_no_gpu_twice(&api).await;
    assert_eq!(held["n1"].len(), 3);
}

/// A binder whose Binding waits at a gate: the test lets it go on when it chooses (a slow API
/// round trip, long enough for kube-scheduler to give up and try the pod again elsewhere).
struct GatedBinding {
    inner: KubePodBinder,
    reached: tokio::sync::Notify,
    gate: tokio::sync::Semaphore,
}

#[async_trait]
impl PodBinder for GatedBinding {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, String> {
        self.inner.pod(namespace, name).await
    }
    async fn resource_claim(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        self.inner.resource_claim(namespace, name).await
    }
    async fn bind(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        node: &str,
        a: BTreeMap<String, String>,
    ) -> Result<(), String> {
        self.reached.notify_one();
        let _permit = self.gate.acquire().await.unwrap();
        self.inner.bind(ns, name, uid, node, a).await
    }
    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        version: Option<&str>,
        annotations: BTreeMap<String, Option<String>>,
    ) -> Result<(), String> {
        self.inner.annotate(namespace, name, uid, version, annotations).await
    }
    async fn node_record(&self, node: &str) -> Result<(Option<String>, NodeRecord), String> {
        self.inner.node_record(node).await
    }
    async fn write_node_record(&self, node: &str, version: Option<&str>, record: &NodeRecord) -> Result<bool, String> {
        self.inner.write_node_record(node, version, record).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_that_loses_to_its_own_retry_on_another_replica_leaves_the_retry_protected() {
    let nodes = [("n1", 4)];
    let api = api_with_nodes(&nodes).await;
    let plain = || KubePodBinder::new(api.client()).with_record_namespace(NAMESPACE);
    let gated = Arc::new(GatedBinding {
        inner: plain(),
        reached: tokio::sync::Notify::new(),
        gate: tokio::sync::Semaphore::new(0),
    });
    let slow = Arc::new(replica(lagging_view(&nodes), gated.clone(), ExtenderConfig::default()).await);
    let other = replica(lagging_view(&nodes), Arc::new(plain()), ExtenderConfig::default()).await;
    let (p, q) = (pending(&api, "p", 1).await, pending(&api, "q", 1).await);
    // kube-scheduler's first bind of p reaches the slow replica, which decides and then waits
    // on its Binding.
    let first = tokio::spawn({
        let (slow, p) = (slow.clone(), p.clone());
        async move { bind(&slow, &p, "n1").await }
    });
    guard("the slow replica to reach its Binding", gated.reached.notified()).await;
    // The scheduler tries p again through the other replica, which binds it.
    assert_eq!(bind(&other, &p, "n1").await, "");
    // The slow Binding now gets a 409 (p is bound). Both attempts chose the same GPU, so the
    // slow replica finds p bound with its own decision and answers success; had they differed,
    // it would answer the error and end only its own attempt's entry.
    gated.gate.add_permits(1);
    assert_eq!(guard("the first bind", first).await.unwrap(), "");
    // The slow replica, whose watch still shows nothing, binds q: not onto p's GPU.
    gated.gate.add_permits(1);
    assert_eq!(bind(&slow, &q, "n1").await, "");
    let held = assert_no_gpu_twice(&api).await;
    assert_eq!(held["n1"].len(), 2);
}
