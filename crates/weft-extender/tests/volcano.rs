//! vc-scheduler's `extender` plugin protocol against weft over HTTP, on the fake API server: the
//! request bodies are shaped as Volcano's Go code marshals them (`api.TaskInfo` and `api.NodeInfo`
//! have no JSON tags, so their fields travel under their Go names, with everything weft ignores),
//! and the answers are read back the way Volcano's structs decode them. The verbs and URL prefix
//! come from the shipped vc-scheduler configuration (deploy/examples/volcano).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use weft_extender::{ClusterView, ExtenderConfig, ExtenderState, KubeClusterView, KubePodBinder};
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
    view: Arc<KubeClusterView>,
}

async fn cluster(nodes: &[(&str, usize)]) -> Cluster {
    let topologies: Vec<_> = nodes.iter().map(|(name, gpus)| (*name, common::pcie_only(name, *gpus))).collect();
    let api = common::api_with_nodes(&topologies).await;
    let view = Arc::new(KubeClusterView::spawn(api.client()));
    guard("the view to sync", view.wait_until_ready()).await;
    let state = Arc::new(
        ExtenderState::new(view.clone(), ExtenderConfig::default())
            .with_binder(Arc::new(KubePodBinder::new(api.client()).with_record_namespace("weft-system"))),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(weft_extender::serve(listener, state.clone(), Default::default(), std::future::pending()));
    let verbs = shipped_arguments();
    let prefix = verbs["extender.urlPrefix"].as_str().unwrap();
    let path = prefix.splitn(4, '/').nth(3).map(|p| format!("/{p}")).unwrap_or_default();
    Cluster { api, url: format!("http://{addr}{path}"), verbs, http: reqwest::Client::new(), state, view }
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
    let extender: Vec<_> = c
        .api
        .requests()
        .into_iter()
        .filter(|r| r.verb != weft_fakeapi::Verb::Create || r.resource == "leases")
        .collect();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_pod_name_is_not_a_kubernetes_name_is_refused_before_any_api_request() {
    let c = cluster(&[("n1", 8)]).await;
    let pod = c.create_pod("gp3", 2).await;
    let before = c.api.requests().len();
    for (field, value) in
        [("name", "gp3?dryRun=All&x="), ("name", "../../nodes/n1"), ("namespace", "ml/../kube-system")]
    {
        let mut t = task(&pod, "n1");
        t["Pod"]["metadata"][field] = json!(value);
        t[if field == "name" { "Name" } else { "Namespace" }] = json!(value);
        for verb in ["extender.allocateFuncVerb", "extender.deallocateFuncVerb"] {
            let answer = c.send(verb, &json!({"task": t})).await;
            let error = answer["errorMessage"].as_str().unwrap();
            assert!(error.contains(&format!("{field} \"{value}\" is not a valid")), "{verb} {value}: {error}");
        }
    }
    let made: Vec<_> =
        c.api.requests().into_iter().skip(before).filter(|r| r.verb != weft_fakeapi::Verb::Watch).collect();
    assert_eq!(made, [], "nothing reached the API server");
    assert_eq!(decision_of(&c.pod("gp3").await), None, "gp3 carries no decision");
    assert_eq!(c.state.reservations().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_uid_differs_from_its_pods_is_refused_and_nothing_is_recorded() {
    // Volcano's TaskInfo.UID is its pod's UID (api.NewTaskInfo); the record's write is conditioned
    // on the task's UID, so a task that disagrees with its own pod is malformed.
    let c = cluster(&[("n1", 8)]).await;
    let pod = c.create_pod("worker-0", 2).await;
    let mut t = task(&pod, "n1");
    t["UID"] = json!("uid-of-another-pod");
    let answer = c.send("extender.allocateFuncVerb", &json!({"task": t})).await;
    let error = answer["errorMessage"].as_str().unwrap();
    assert!(error.contains("uid-of-another-pod") && error.contains(pod.metadata.uid.as_deref().unwrap()), "{error}");
    assert_eq!(decision_of(&c.pod("worker-0").await), None);
    assert_eq!(c.state.reservations().len(), 0);
}

// ----- Volcano's actions as their Statements call the event handlers -----
//
// volcano-sh/volcano pkg/scheduler/framework/statement.go: `Evict(victim)` marks the victim
// Releasing and calls DeallocateFunc for it (the pod still runs); `Pipeline(task, node)` marks the
// task Pipelined and calls AllocateFunc; `Discard` undoes the operations last first: `unPipeline`
// calls DeallocateFunc for the task, `unevict` marks the victim Running again and calls
// AllocateFunc for it. `Commit` deletes the victims (`cache.Evict`). actions/preempt
// (`normalPreempt`) and actions/reclaim (`reclaimForTask`) run Evict for each victim on a node, then
// Pipeline for the preemptor, on a per-node statement that is discarded when Pipeline fails and
// merged into the job's statement otherwise; the job's statement is committed when the job is
// pipelined, else discarded.

/// Volcano's `api.TaskStatus` bits.
const PENDING: u32 = 1;
const PIPELINED: u32 = 1 << 2;
const RUNNING: u32 = 1 << 5;
const RELEASING: u32 = 1 << 6;

/// The task as the statement hands it to the event handler: on `node`, in `status`.
fn task_in(pod: &Pod, node: &str, status: u32) -> Value {
    let mut t = task(pod, node);
    t["Status"] = json!(status);
    t
}

impl Cluster {
    /// A running pod bound to `node` holding GPUs `ids`, once the extender's watch shows it.
    async fn running(&self, name: &str, node: &str, ids: &str) -> Pod {
        let gpus = ids.split(',').count() as u32;
        let pod =
            self.api.insert_typed(&common::bound_pod(name, node, gpus, Some(ids), "2026-01-05T10:00:00Z")).unwrap();
        let uid = pod.metadata.uid.clone().unwrap();
        let view = self.view.clone();
        let mut rx = view.changes();
        let shown = |v: &KubeClusterView| v.pods_on_node(node).iter().any(|p| p.metadata.uid.as_deref() == Some(&uid));
        guard("the watch to show the pod", rx.wait_for(|_| shown(&view))).await.unwrap();
        pod
    }

    /// Statement.Evict(victim): DeallocateFunc for the running victim, marked Releasing.
    async fn evict(&self, victim: &Pod, node: &str) {
        let answer = self.send("extender.deallocateFuncVerb", &json!({"task": task_in(victim, node, RELEASING)})).await;
        assert_eq!(answer, json!({"errorMessage": ""}), "evict {:?}", victim.metadata.name);
    }

    /// Statement.Pipeline(task, node): AllocateFunc for the task, marked Pipelined; its answer.
    async fn pipeline(&self, task: &Pod, node: &str) -> String {
        let answer = self.send("extender.allocateFuncVerb", &json!({"task": task_in(task, node, PIPELINED)})).await;
        answer["errorMessage"].as_str().unwrap().to_string()
    }

    /// Statement.unPipeline(task): DeallocateFunc for the task (its status back to Pending).
    async fn unpipeline(&self, task: &Pod, node: &str) {
        let answer = self.send("extender.deallocateFuncVerb", &json!({"task": task_in(task, node, PENDING)})).await;
        assert_eq!(answer, json!({"errorMessage": ""}));
    }

    /// Statement.unevict(victim): AllocateFunc for the victim, marked Running again.
    async fn unevict(&self, victim: &Pod, node: &str) {
        let answer = self.send("extender.allocateFuncVerb", &json!({"task": task_in(victim, node, RUNNING)})).await;
        assert_eq!(answer, json!({"errorMessage": ""}), "unevict {:?}", victim.metadata.name);
    }

    /// Whether the extender wrote to the pod `name` (any PATCH, PUT or Binding).
    fn written(&self, name: &str) -> bool {
        use weft_fakeapi::Verb::{Create, Patch, Update};
        self.api.requests().iter().any(|r| {
            r.name.as_deref() == Some(name)
                && (matches!(r.verb, Patch | Update) || (r.verb == Create && r.subresource.is_some()))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempt_pipelines_the_preemptor_onto_the_gpus_of_the_victims_it_evicted() {
    let c = cluster(&[("n1", 8)]).await;
    let victim = c.running("low-0", "n1", "0,1").await;
    let bystander = c.running("low-1", "n1", "2,3").await;
    let preemptor = c.create_pod("high-0", 4).await;
    // Without evictions n1 has 4 free GPUs (4-7): an Allocated 6-GPU task would not fit, and the
    // preemptor pipelined without evicting anyone gets exactly those.
    let big = c.create_pod("high-1", 6).await;
    let error = c.pipeline(&big, "n1").await;
    assert!(error.contains("4 free GPUs now; the pod asks for 6"), "{error}");

    // normalPreempt on n1: Evict(low-0), Pipeline(high-1): 4 free + low-0's 2 = 6.
    c.evict(&victim, "n1").await;
    assert_eq!(c.pipeline(&big, "n1").await, "", "the victim's GPUs count for the pipelined preemptor");
    let (ids, decision) = decision_of(&c.pod("high-1").await).expect("recorded");
    assert_eq!((decision.node.as_str(), ids.clone()), ("n1", vec![0, 1, 4, 5, 6, 7]), "never the bystander's 2,3");
    // Until the victim is gone, everyone else still sees its GPUs held: n1 is full.
    let other = c.send("extender.predicateVerb", &json!({"task": task(&preemptor, ""), "node": node_info("n1")})).await;
    assert_eq!(other["code"], 2, "{other}");
    // Commit: the victim is deleted; neither it nor the bystander was written to.
    Api::<Pod>::namespaced(c.api.client(), "ml").delete("low-0", &Default::default()).await.unwrap();
    assert!(!c.written("low-0") && !c.written("low-1"), "victims and bystanders are never written");
    assert_eq!(c.pod("low-1").await.metadata.annotations.unwrap()[GPU_IDS_ANNOTATION], "2,3");
    let _ = bystander;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discarded_preemption_leaves_the_running_victim_and_its_gpus_as_they_were() {
    let c = cluster(&[("n1", 8)]).await;
    let victim = c.running("low-0", "n1", "0,1").await;
    let preemptor = c.create_pod("high-0", 8).await;
    let victim_before = c.pod("low-0").await;

    // normalPreempt: Evict(low-0), Pipeline(high-0) succeeds on n1; the job is not pipelined, so
    // the statement is discarded: unPipeline(high-0), then unevict(low-0).
    c.evict(&victim, "n1").await;
    assert_eq!(c.pipeline(&preemptor, "n1").await, "", "6 free GPUs and low-0's 2");
    assert_eq!(decision_of(&c.pod("high-0").await).unwrap().0, [0, 1, 2, 3, 4, 5, 6, 7]);
    c.unpipeline(&preemptor, "n1").await;
    c.unevict(&victim, "n1").await;

    let victim_after = c.pod("low-0").await;
    assert_eq!(
        victim_after.metadata.annotations, victim_before.metadata.annotations,
        "low-0's GPU record is unchanged"
    );
    assert_eq!(
        victim_after.metadata.resource_version, victim_before.metadata.resource_version,
        "low-0 was not written"
    );
    assert!(!c.written("low-0"));
    assert_eq!(decision_of(&c.pod("high-0").await), None);
    assert_eq!(c.state.reservations().len(), 0);
    // The eviction was undone: a later pipelined 7-GPU task cannot take low-0's GPUs.
    let seven = c.create_pod("high-1", 7).await;
    let error = c.pipeline(&seven, "n1").await;
    assert!(error.contains("6 free GPUs now; the pod asks for 7"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_whose_pipeline_fails_discards_and_the_victims_keep_their_gpus() {
    let c = cluster(&[("n1", 8)]).await;
    let v0 = c.running("other-queue-0", "n1", "0,1").await;
    let v1 = c.running("other-queue-1", "n1", "2,3").await;
    let _kept = c.running("own-queue-0", "n1", "4,5,6,7").await;
    let task8 = c.create_pod("starved-0", 8).await;

    // reclaimForTask on n1: Evict each reclaimee, then Pipeline, which fails (4 of 8 GPUs can be
    // freed); Pipeline rolls itself back (unPipeline), then the node statement is discarded
    // (unevict, last first).
    c.evict(&v0, "n1").await;
    c.evict(&v1, "n1").await;
    let error = c.pipeline(&task8, "n1").await;
    assert!(error.contains("4 free GPUs now; the pod asks for 8"), "{error}");
    c.unpipeline(&task8, "n1").await;
    c.unevict(&v1, "n1").await;
    c.unevict(&v0, "n1").await;
    for (name, ids) in [("other-queue-0", "0,1"), ("other-queue-1", "2,3")] {
        assert!(!c.written(name), "{name} was written");
        assert_eq!(c.pod(name).await.metadata.annotations.unwrap()[GPU_IDS_ANNOTATION], ids);
    }
    assert_eq!(decision_of(&c.pod("starved-0").await), None);

    // The next session reclaims for a 4-GPU task: Evict both, Pipeline succeeds, Commit.
    let task4 = c.create_pod("starved-1", 4).await;
    c.evict(&v0, "n1").await;
    c.evict(&v1, "n1").await;
    assert_eq!(c.pipeline(&task4, "n1").await, "");
    let (ids, _) = decision_of(&c.pod("starved-1").await).unwrap();
    assert_eq!(ids, [0, 1, 2, 3], "the reclaimed GPUs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_never_decides_again_for_a_bound_pod() {
    let c = cluster(&[("n1", 8), ("n2", 8)]).await;
    let running = c.running("r-0", "n1", "0,1").await;
    // AllocateFunc for a pod bound to that node (unevict, or a retry): nothing decided or written.
    for status in [RUNNING, 2, PIPELINED] {
        let answer = c.send("extender.allocateFuncVerb", &json!({"task": task_in(&running, "n1", status)})).await;
        assert_eq!(answer, json!({"errorMessage": ""}));
    }
    // For another node: refused, nothing written.
    let answer = c.send("extender.allocateFuncVerb", &json!({"task": task_in(&running, "n2", 2)})).await;
    assert!(answer["errorMessage"].as_str().unwrap().contains("bound to n1, not n2"), "{answer}");
    assert!(!c.written("r-0"));
    assert_eq!(c.state.reservations().len(), 0);
}
