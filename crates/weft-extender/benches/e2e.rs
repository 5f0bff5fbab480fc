//! One pod's scheduling cycle end to end, as kube-scheduler drives the extender: `POST /filter`,
//! then `POST /prioritize` with the nodes that passed, then `POST /bind` on the best of them, over
//! one keep-alive HTTP/1.1 connection on loopback to the extender's own server (the `weft
//! scheduler-extender` router and serve loop).
//!
//! The cluster is the one `weft scheduler-extender --cluster-file default` serves, scaled:
//! `ClusterSpec::embedded_default().scaled(N)`, the 8 built-in node types, each node annotated with
//! its topology (SR-IOV VFs included). About 40% of the nodes run pods that hold 1–4 GPUs (recorded
//! in `weft.io/gpu-ids`). The pod asks for 4 GPUs.
//!
//! Bodies follow kube-scheduler's `HTTPExtender` (pkg/scheduler/extender.go): `ExtenderArgs` with
//! the pod and either `NodeNames` (`nodeCacheCapable: true`) or `Nodes`, a v1 NodeList of complete
//! Node objects (`nodeCacheCapable: false`: labels as GPU feature discovery and the cloud set them,
//! capacity and allocatable, conditions, addresses, node info, images, taints and weft's topology
//! annotation); prioritize gets the nodes filter passed, bind an `ExtenderBindingArgs`. Building the
//! bodies (kube-scheduler's `json.Marshal`) and reading the answers (its decode) are the
//! scheduler's work and are not timed: each verb is timed from sending its request to the last byte
//! of its answer.
//!
//! Bind writes through an in-memory [`PodBinder`] (the pod read and the Binding, the node's record
//! Lease read and written, all answered at once): what is timed is weft's own work, not an API
//! server's round trips. After each cycle the pod's reservation is released (untimed), so every
//! cycle sees the same cluster.
//!
//! The `gang64-*` cases schedule a member of a 64-member gang (`weft.io/gang`, 4 GPUs each) over
//! nodes labelled with a leaf (32 nodes) and a spine (512 nodes): its filter plans the whole gang
//! over every node (docs/gang.md "In the scheduler"). The plan is held for 1 ns, so every cycle's
//! filter plans anew: these are the planning member's cycles, the costliest a gang member has.
//!
//! Run: `cargo bench -p weft-extender --bench e2e` (prints median and p99 per case; `E2E_CYCLES`
//! sets the cycles per case, `E2E_CASES` a comma-separated subset such as `names-5000`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use weft_extender::gang::NetworkLevels;
use weft_extender::{ExtenderConfig, ExtenderState, InMemoryView};
use weft_sim::cluster::{Cluster, ClusterSpec};

#[path = "../tests/common/mod.rs"]
mod common;

const POD: &str = "trainer-0";
const NAMESPACE: &str = "ml";
const UID: &str = "3f1e9c2a-7b4d-4e8f-9a61-0c5d2b7e8f10";
const GPUS: u32 = 4;

/// Deterministic GPUs in use on node `i` of `gpus`: none on 3 nodes of 5, else 1 to 4.
fn used_gpus(i: usize, gpus: usize) -> Vec<usize> {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    if x % 5 < 3 {
        return Vec::new();
    }
    let k = (1 + (x >> 8) % 4) as usize;
    let mut used = Vec::new();
    while used.len() < k.min(gpus) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let g = (x % gpus as u64) as usize;
        if !used.contains(&g) {
            used.push(g);
        }
    }
    used.sort_unstable();
    used
}

/// The network labels of node `i`: 32 nodes per leaf, 16 leaves per spine.
const SPINE: &str = "example.com/spine";
const LEAF: &str = "example.com/leaf";

/// The pending pod as kube-scheduler sends it (from its informer: no apiVersion/kind); a member of
/// a 64-member gang when `gang`.
fn pod_json(gang: bool) -> Value {
    let mut pod = plain_pod_json();
    if gang {
        pod["metadata"]["annotations"]["weft.io/gang"] = json!("train");
        pod["metadata"]["annotations"]["weft.io/gang-size"] = json!("64");
    }
    pod
}

fn plain_pod_json() -> Value {
    json!({
        "metadata": {
            "name": POD, "generateName": "trainer-", "namespace": NAMESPACE, "uid": UID,
            "resourceVersion": "88123451", "creationTimestamp": "2026-01-05T11:00:00Z",
            "labels": {"app.kubernetes.io/name": "trainer", "batch.kubernetes.io/job-name": "train",
                "batch.kubernetes.io/controller-uid": "9b2c0e4f-1d7a-4c3b-8e5f-2a6d9c1b7e30",
                "job-name": "train", "batch.kubernetes.io/job-completion-index": "0"},
            "annotations": {"batch.kubernetes.io/job-completion-index": "0"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                "uid": "9b2c0e4f-1d7a-4c3b-8e5f-2a6d9c1b7e30", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                    "fieldPath": "metadata.namespace"}}]}}], "defaultMode": 420}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}],
            "containers": [{
                "name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                "command": ["torchrun", "--nproc-per-node=4", "train.py"],
                "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "OMP_NUM_THREADS", "value": "8"}],
                "resources": {
                    "limits": {"nvidia.com/gpu": GPUS.to_string(), "cpu": "32", "memory": "256Gi"},
                    "requests": {"nvidia.com/gpu": GPUS.to_string(), "cpu": "32", "memory": "256Gi"}
                },
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                    {"name": "shm", "mountPath": "/dev/shm"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"
            }],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
            "schedulerName": "weft-scheduler",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"}
    })
}

/// One case's cluster: the extender's view (as `--cluster-file` builds it, plus the bound pods)
/// and, per node, its name and its complete Node JSON.
struct Fixture {
    view: Arc<InMemoryView>,
    names: Vec<String>,
    nodes: Vec<String>,
}

fn fixture(cluster: &Cluster) -> Fixture {
    let view = Arc::new(InMemoryView::new());
    let mut names = Vec::new();
    let mut nodes = Vec::new();
    let annotations: Vec<String> =
        cluster.types.iter().map(|t| weft_topology::inventory::to_json(&t.topology)).collect();
    for (i, node) in cluster.nodes.iter().enumerate() {
        let kind = &cluster.types[node.node_type];
        let gpus = kind.topology.gpu_count();
        let annotation = &annotations[node.node_type];
        let full = common::kube_node_json(&node.name, i, &kind.name, gpus, kind.topology.vfs().len(), annotation);
        // What `local_view` inserts: the name, a resourceVersion and the annotation.
        view.insert_node(k8s_openapi::api::core::v1::Node {
            metadata: kube::api::ObjectMeta {
                name: Some(node.name.clone()),
                resource_version: full["metadata"]["resourceVersion"].as_str().map(str::to_string),
                annotations: Some(BTreeMap::from([(weft_record::TOPOLOGY_ANNOTATION.to_string(), annotation.clone())])),
                labels: Some(BTreeMap::from([
                    (SPINE.to_string(), format!("spine-{}", i / 512)),
                    (LEAF.to_string(), format!("leaf-{}", i / 32)),
                ])),
                ..Default::default()
            },
            ..Default::default()
        });
        let used = used_gpus(i, gpus);
        if !used.is_empty() {
            let ids = used.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
            let pod = common::bound_pod(
                &format!("job-{i}"),
                &node.name,
                used.len() as u32,
                Some(&ids),
                "2026-01-05T09:00:00Z",
            );
            view.insert_pod(pod);
        }
        names.push(node.name.clone());
        nodes.push(serde_json::to_string(&full).unwrap());
    }
    Fixture { view, names, nodes }
}

/// `ExtenderArgs` JSON for the pod over `which` nodes, by name or as full objects.
fn args_body(pod: &str, f: &Fixture, which: &[usize], by_name: bool) -> Vec<u8> {
    let mut out = String::with_capacity(if by_name { which.len() * 24 } else { which.len() * 12_000 });
    out.push_str("{\"Pod\":");
    out.push_str(pod);
    if by_name {
        out.push_str(",\"Nodes\":null,\"NodeNames\":[");
        for (k, &i) in which.iter().enumerate() {
            if k > 0 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(&f.names[i]).unwrap());
        }
        out.push_str("]}");
    } else {
        out.push_str(",\"Nodes\":{\"metadata\":{},\"items\":[");
        for (k, &i) in which.iter().enumerate() {
            if k > 0 {
                out.push(',');
            }
            out.push_str(&f.nodes[i]);
        }
        out.push_str("]},\"NodeNames\":null}");
    }
    out.into_bytes()
}

/// What the bench reads of a filter answer (kube-scheduler reads `Nodes` too; passing nodes are
/// the ones not failed, which is the same set).
#[derive(Deserialize)]
struct FilterAnswer {
    #[serde(rename = "FailedNodes", default)]
    failed: Option<BTreeMap<String, String>>,
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    unresolvable: Option<BTreeMap<String, String>>,
    #[serde(rename = "Error", default)]
    error: String,
}

#[derive(Deserialize)]
struct Priority {
    #[serde(rename = "Host")]
    host: String,
    #[serde(rename = "Score")]
    score: i64,
}

#[derive(Deserialize)]
struct BindAnswer {
    #[serde(rename = "Error", default)]
    error: String,
}

/// POSTs `body`; the time from sending to the last byte of the answer, and the answer.
async fn post(client: &reqwest::Client, url: &str, body: Vec<u8>) -> (Duration, axum::body::Bytes) {
    let start = Instant::now();
    let r = client.post(url).header("Content-Type", "application/json").body(body).send().await.unwrap();
    assert_eq!(r.status(), 200, "{url}");
    let bytes = r.bytes().await.unwrap();
    (start.elapsed(), bytes)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

async fn run_case(label: &str, f: &Fixture, by_name: bool, gang: bool, cycles: usize) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let pod: Pod = serde_json::from_value(pod_json(gang)).unwrap();
    let cfg = if gang {
        ExtenderConfig {
            network_levels: NetworkLevels::Levels(weft_gang::LabelLevels::new(&[SPINE, LEAF])),
            gang_plan_ttl: Duration::from_nanos(1),
            ..ExtenderConfig::default()
        }
    } else {
        ExtenderConfig::default()
    };
    let state = Arc::new(ExtenderState::new(f.view.clone(), cfg).with_binder(Arc::new(common::MemoryApi { pod })));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(weft_extender::serve(listener, state.clone(), Default::default(), async move {
        let _ = stopped.await;
    }));
    // One connection, kept alive, as Go's http.Client keeps one per extender host.
    let client = reqwest::Client::builder().http1_only().pool_max_idle_per_host(1).build().unwrap();
    let pod = serde_json::to_string(&pod_json(gang)).unwrap();
    let all: Vec<usize> = (0..f.names.len()).collect();
    let filter_body = args_body(&pod, f, &all, by_name);
    let (mut filter_t, mut prio_t, mut bind_t, mut total_t) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut passed_count = 0;
    // The first cycle warms the topology cache and the accounting, as a running extender's are.
    for cycle in 0..=cycles {
        let (tf, answer) = post(&client, &format!("{base}/filter"), filter_body.clone()).await;
        let answer: FilterAnswer = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer.error, "");
        let failed = |n: &String| {
            answer.failed.as_ref().is_some_and(|m| m.contains_key(n))
                || answer.unresolvable.as_ref().is_some_and(|m| m.contains_key(n))
        };
        let passed: Vec<usize> = all.iter().copied().filter(|&i| !failed(&f.names[i])).collect();
        passed_count = passed.len();
        let (tp, answer) = post(&client, &format!("{base}/prioritize"), args_body(&pod, f, &passed, by_name)).await;
        let scores: Vec<Priority> = serde_json::from_slice(&answer).unwrap();
        let best = scores.iter().max_by_key(|p| p.score).unwrap().host.clone();
        let bind = json!({"PodName": POD, "PodNamespace": NAMESPACE, "PodUID": UID, "Node": best});
        let (tb, answer) = post(&client, &format!("{base}/bind"), serde_json::to_vec(&bind).unwrap()).await;
        let answer: BindAnswer = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer.error, "", "bind");
        // The next cycle sees the cluster this one saw.
        state.reservations().release(&best, UID);
        if cycle > 0 {
            filter_t.push(tf);
            prio_t.push(tp);
            bind_t.push(tb);
            total_t.push(tf + tp + tb);
        }
    }
    for v in [&mut filter_t, &mut prio_t, &mut bind_t, &mut total_t] {
        v.sort();
    }
    let kib = |n: usize| n as f64 / 1024.0;
    println!(
        "{label}: {} nodes ({} pass filter), filter body {:.0} KiB; {cycles} cycles: filter+prioritize+bind median {} p99 {} \
         (filter {} / {}, prioritize {} / {}, bind {} / {}: median / p99)",
        f.names.len(),
        passed_count,
        kib(filter_body.len()),
        ms(percentile(&total_t, 0.5)),
        ms(percentile(&total_t, 0.99)),
        ms(percentile(&filter_t, 0.5)),
        ms(percentile(&filter_t, 0.99)),
        ms(percentile(&prio_t, 0.5)),
        ms(percentile(&prio_t, 0.99)),
        ms(percentile(&bind_t, 0.5)),
        ms(percentile(&bind_t, 0.99)),
    );
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

fn main() {
    let cycles: usize = std::env::var("E2E_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let only: Option<Vec<String>> =
        std::env::var("E2E_CASES").ok().map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let wanted = |case: &str| only.as_ref().is_none_or(|o| o.iter().any(|c| c == case));
    // As the extender serves: tokio's multi-threaded runtime, one worker per CPU.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    for size in [5_000, 500] {
        let cases = [
            (format!("names-{size}"), true, false),
            (format!("nodes-{size}"), false, false),
            (format!("gang64-names-{size}"), true, true),
        ];
        if !cases.iter().any(|(c, _, _)| wanted(c)) {
            continue;
        }
        let cluster = ClusterSpec::embedded_default().scaled(size).build(None).unwrap();
        let f = fixture(&cluster);
        for (case, by_name, gang) in cases {
            if wanted(&case) {
                runtime.block_on(run_case(&case, &f, by_name, gang, cycles));
            }
        }
    }
}
