//! vc-scheduler's `extender` plugin protocol against weft over HTTP, on the fake API server: the
//! request bodies are shaped as Volcano's Go code marshals them (`api.TaskInfo` and `api.NodeInfo`
//! have no JSON tags, so their fields travel under their Go names, with everything weft ignores),
//! and the answers are read back the way Volcano's structs decode them. The verbs and URL prefix
//! come from the shipped vc-scheduler configuration (deploy/examples/volcano).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use weft_extender::{ExtenderConfig, ExtenderState, KubeClusterView, KubePodBinder};
use weft_fakeapi::FakeApiServer;
use weft_record::usage::parse_gpu_ids;
use weft_record::{GPU_DECISION_ANNOTATION, GPU_IDS_ANNOTATION, GpuDecision};

const HANG_GUARD: Duration = Duration::from_secs(60);

async fn guard<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("hung: {what}"))
}

/// The extender plugin's arguments in the shipped vc-scheduler configuration.
fn shipped_arguments() -> serde_json::Map<String, Value> {
    let path = weft_testkit::rbac::deploy_dir().join("examples/volcano/volcano-scheduler.conf");
    let text = std::fs::read_to_string(&path).unwrap();
    let conf: Value = serde_saphyr::from_str(&text).unwrap();
    for tier in conf["tiers"].as_array().unwrap() {
        for plugin in tier["plugins"].as_array().unwrap() {
            if plugin["name"] == "extender" {
                return plugin["arguments"].as_object().unwrap().clone();
            }
        }
    }
    panic!("no extender plugin in {}", path.display());
}

struct Cluster {
    api: FakeApiServer,
    /// `http://127.0.0.1:PORT` + the path of the shipped urlPrefix.
    url: String,
    verbs: serde_json::Map<String, Value>,
    http: reqwest::Client,
    state: Arc<ExtenderState>,
}

async fn cluster(nodes: &[(&str, usize)]) -> Cluster {
    let api = FakeApiServer::start().await;
    let node_api: Api<Node> = Api::all(api.client());
    for (name, gpus) in nodes {
        let mut n = common::node(name, Some(&common::pcie_only(name, *gpus)), *gpus);
        n.metadata.resource_version = None;
        n.metadata.uid = None;
        node_api.create(&PostParams::default(), &n).await.unwrap();
    }
    let view = KubeClusterView::spawn(api.client());
    guard("the view to sync", view.wait_until_ready()).await;
    let state = Arc::new(
        ExtenderState::new(Arc::new(view), ExtenderConfig::default())
            .with_binder(Arc::new(KubePodBinder::new(api.client()))),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(weft_extender::serve(listener, state.clone(), Default::default(), std::future::pending()));
    let verbs = shipped_arguments();
    let prefix = verbs["extender.urlPrefix"].as_str().unwrap();
    let path = prefix.splitn(4, '/').nth(3).map(|p| format!("/{p}")).unwrap_or_default();
    Cluster { api, url: format!("http://{addr}{path}"), verbs, http: reqwest::Client::new(), state }
}

impl Cluster {
    /// POSTs as Volcano's `send` does: `urlPrefix + "/" + verb`, JSON, 200 expected.
    async fn send(&self, verb_key: &str, body: &Value) -> Value {
        let verb = self.verbs[verb_key].as_str().unwrap();
        let url = format!("{}/{verb}", self.url.trim_end_matches('/'));
        let r = self.http.post(&url).header("Content-Type", "application/json").json(body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{url}");
        r.json().await.unwrap()
    }

    async fn create_pod(&self, name: &str, gpus: u32) -> Pod {
        let mut v = common::pending_pod_json(name, gpus);
        for k in ["uid", "resourceVersion", "creationTimestamp", "ownerReferences"] {
            v["metadata"].as_object_mut().unwrap().remove(k);
        }
        v["spec"]["schedulerName"] = json!("volcano");
        v["status"] = json!({});
        let pod: Pod = serde_json::from_value(v).unwrap();
        Api::<Pod>::namespaced(self.api.client(), "ml").create(&PostParams::default(), &pod).await.unwrap()
    }

    async fn pod(&self, name: &str) -> Pod {
        Api::<Pod>::namespaced(self.api.client(), "ml").get(name).await.unwrap()
    }
}

/// `api.TaskInfo` as encoding/json writes it: every exported field under its Go name.
fn task(pod: &Pod, node_name: &str) -> Value {
    let uid = pod.metadata.uid.clone().unwrap();
    let gpus: f64 = 1000.0;
    json!({
        "UID": uid,
        "Job": "ml/podgroup-train",
        "Name": pod.metadata.name,
        "Namespace": "ml",
        "TaskRole": "worker",
        "Resreq": {"MilliCPU": 8000, "Memory": 68719476736.0, "ScalarResources": {"nvidia.com/gpu": gpus}, "MaxTaskNum": 0},
        "InitResreq": {"MilliCPU": 8000, "Memory": 68719476736.0, "ScalarResources": {"nvidia.com/gpu": gpus}, "MaxTaskNum": 0},
        "DRAResreq": null,
        "ResourceClaimKeys": null,
        "ResourceClaimDRAResreq": null,
        "NodeName": node_name,
        "EvictionOccurred": false,
        "JobAllocatedHyperNode": "",
        "Status": 1,
        "LastTransaction": null,
        "Priority": 0,
        "VolumeReady": false,
        "Preemptable": false,
        "BestEffort": false,
        "HasRestartableInitContainer": false,
        "SchGated": false,
        "RevocableZone": "",
        "NumaInfo": null,
        "Pod": pod,
        "PodAnnotations": pod.metadata.annotations,
        "CustomBindErrHandlerSucceeded": false
    })
}

/// `api.NodeInfo` as encoding/json writes it (weft reads only `Name`).
fn node_info(name: &str) -> Value {
    json!({
        "Name": name,
        "Node": {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}},
        "State": {"Phase": 1, "Reason": ""},
        "Releasing": {"MilliCPU": 0, "Memory": 0, "ScalarResources": null, "MaxTaskNum": 0},
        "Pipelined": {"MilliCPU": 0, "Memory": 0, "ScalarResources": null, "MaxTaskNum": 0},
        "Idle": {"MilliCPU": 64000, "Memory": 5.49e11, "ScalarResources": {"nvidia.com/gpu": 8000.0}, "MaxTaskNum": 110},
        "Used": {"MilliCPU": 0, "Memory": 0, "ScalarResources": null, "MaxTaskNum": 0},
        "Allocatable": {"MilliCPU": 64000, "Memory": 5.49e11, "ScalarResources": {"nvidia.com/gpu": 8000.0}, "MaxTaskNum": 110},
        "Capacity": {"MilliCPU": 64000, "Memory": 5.49e11, "ScalarResources": {"nvidia.com/gpu": 8000.0}, "MaxTaskNum": 110},
        "ResourceUsage": null,
        "Tasks": {},
        "NumaInfo": null,
        "UnassignedNumaPods": null,
        "NumaSchedulerInfo": null,
        "RevocableZone": "",
        "Others": null,
        "OversubscriptionNode": false,
        "OfflineJobEvicting": false,
        "OversubscriptionResource": null,
        "ImageStates": null
    })
}

fn decision_of(pod: &Pod) -> Option<(Vec<usize>, GpuDecision)> {
    let a = pod.metadata.annotations.as_ref()?;
    let ids = parse_gpu_ids(a.get(GPU_IDS_ANNOTATION)?).unwrap();
    Some((ids, GpuDecision::from_annotation(a.get(GPU_DECISION_ANNOTATION)?).unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_predicates_scores_allocates_and_deallocates_through_the_shipped_verbs() {
    let c = cluster(&[("n1", 8), ("n2", 4)]).await;
    let pod = c.create_pod("worker-0", 4).await;

    // PredicateFn per node: both fit a 4-GPU pod.
    for node in ["n1", "n2"] {
        let answer = c.send("extender.predicateVerb", &json!({"task": task(&pod, ""), "node": node_info(node)})).await;
        assert_eq!(answer, json!({"status": "", "code": 0}), "{node}");
    }
    // BatchNodeOrderFn: Volcano's 0-100 scale, every node scored.
    let scores = c
        .send("extender.prioritizeVerb", &json!({"task": task(&pod, ""), "nodes": [node_info("n1"), node_info("n2")]}))
        .await;
    assert_eq!(scores["errorMessage"], "");
    let n1 = scores["nodeScore"]["n1"].as_f64().unwrap();
    let n2 = scores["nodeScore"]["n2"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&n1) && (0.0..=100.0).contains(&n2), "{scores}");
    assert_eq!(n1 % 10.0, 0.0, "weft's 0-10 score times 10: {scores}");

    // AllocateFunc: the session put the task on n2; weft records the GPU set before answering.
    let answer = c.send("extender.allocateFuncVerb", &json!({"task": task(&pod, "n2")})).await;
    assert_eq!(answer, json!({"errorMessage": ""}));
    let (ids, decision) = decision_of(&c.pod("worker-0").await).expect("the decision is on the pod");
    assert_eq!((decision.node.as_str(), ids.len()), ("n2", 4));
    assert_eq!(decision.gpus, ids);

    // The reservation counts: n2 has no GPU left for a second 4-GPU pod, so its predicate fails
    // with Volcano's Unschedulable code and weft's reason.
    let other = c.create_pod("worker-1", 4).await;
    let answer = c.send("extender.predicateVerb", &json!({"task": task(&other, ""), "node": node_info("n2")})).await;
    assert_eq!(answer["code"], 2, "{answer}");
    assert!(answer["status"].as_str().unwrap().contains("GPU"), "{answer}");

    // DeallocateFunc (the gang did not fit): the record and the reservation go.
    let answer = c.send("extender.deallocateFuncVerb", &json!({"task": task(&pod, "n2")})).await;
    assert_eq!(answer, json!({"errorMessage": ""}));
    assert_eq!(decision_of(&c.pod("worker-0").await), None, "the record was removed");
    assert_eq!(c.state.reservations().len(), 0);
    let answer = c.send("extender.predicateVerb", &json!({"task": task(&other, ""), "node": node_info("n2")})).await;
    assert_eq!(answer, json!({"status": "", "code": 0}), "n2's GPUs are free again");

    // Everything the extender did (watches, pod reads, the annotation patches) is what its RBAC
    // grants; the test's own setup writes (nodes, pods) are left out.
    let extender: Vec<_> = c.api.requests().into_iter().filter(|r| r.verb != weft_fakeapi::Verb::Create).collect();
    weft_testkit::rbac::assert_granted(&extender, &["base/scheduler-extender/rbac.yaml"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_for_a_replaced_pod_fails_and_leaves_nothing_reserved() {
    let c = cluster(&[("n1", 8)]).await;
    let pod = c.create_pod("worker-0", 2).await;
    let mut stale = task(&pod, "n1");
    stale["UID"] = json!("uid-of-a-deleted-pod");
    stale["Pod"]["metadata"]["uid"] = json!("uid-of-a-deleted-pod");
    let answer = c.send("extender.allocateFuncVerb", &json!({"task": stale})).await;
    assert_ne!(answer["errorMessage"], "", "{answer}");
    assert_eq!(c.state.reservations().len(), 0, "the failed allocation released its reservation");
    assert_eq!(decision_of(&c.pod("worker-0").await), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_errors_that_name_what_is_wrong() {
    let c = cluster(&[("n1", 8)]).await;
    let pod = c.create_pod("worker-0", 2).await;
    let answer = c.send("extender.predicateVerb", &json!({"task": task(&pod, ""), "node": null})).await;
    assert_eq!(answer["code"], 1, "{answer}");
    assert!(answer["status"].as_str().unwrap().contains("no node"), "{answer}");
    let answer = c.send("extender.allocateFuncVerb", &json!({"task": task(&pod, "")})).await;
    assert!(answer["errorMessage"].as_str().unwrap().contains("NodeName"), "{answer}");
    let answer = c.send("extender.prioritizeVerb", &json!({"task": null, "nodes": null})).await;
    assert!(answer["errorMessage"].as_str().unwrap().contains("no task"), "{answer}");
    // Not JSON at all: HTTP 400, which Volcano reports as a failed call.
    let url = format!("{}/predicate", c.url);
    let r = c.http.post(&url).body("{").send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("volcano predicate"));
}
