//! Gangs end to end on the fake API server: a group's members are planned as one decision and each
//! lands in the plan's domain, through kube-scheduler's extender verbs (filter, prioritize, bind)
//! and through vc-scheduler's (predicate, batch node order, allocate). The cluster: one spine over
//! leaf `a` (nodes a1, a2) and leaf `b` (b1, b2, b3), every node with 8 PCIe GPUs. A Volcano
//! PodGroup is created as Volcano's job controller creates it for a Job (`minMember` = the Job's
//! `minAvailable`, `networkTopology` copied; reference/job-topology.md §2.2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use weft_extender::gang::{
    GANG_ANNOTATION, GANG_PLAN_ANNOTATION, GANG_SIZE_ANNOTATION, GangNote, VOLCANO_GROUP_ANNOTATION,
};
use weft_extender::{ExtenderConfig, ExtenderState, KubeClusterView, KubePodBinder};
use weft_fakeapi::FakeApiServer;
use weft_gang::{LabelLevels, TierConstraint};

const SPINE: &str = "example.com/spine";
const LEAF: &str = "example.com/leaf";
const NODES: [(&str, &str); 5] = [("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b"), ("b3", "b")];

async fn guard<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f).await.unwrap_or_else(|_| panic!("hung: {what}"))
}

struct Cluster {
    api: FakeApiServer,
    base: String,
    http: reqwest::Client,
    view: Arc<KubeClusterView>,
}

/// How the test cluster describes its network.
#[derive(Clone, Copy, PartialEq)]
enum Network {
    /// Spine and leaf node labels, read with `--network-levels example.com/spine,example.com/leaf`.
    Labels,
    /// Volcano HyperNodes (leaf-a, leaf-b at tier 1 named `leaf`, spine-1 at tier 2 over both), no
    /// network labels, and the extender's default network source.
    HyperNodes,
}

async fn cluster() -> Cluster {
    cluster_with(Network::Labels).await
}

async fn cluster_with(network: Network) -> Cluster {
    let topologies: Vec<_> = NODES.iter().map(|(n, _)| (*n, common::pcie_only(n, 8))).collect();
    let api = common::api_with_nodes(&topologies).await;
    let nodes: Api<Node> = Api::all(api.client());
    if network == Network::Labels {
        for (name, leaf) in NODES {
            let labels = json!({"metadata": {"labels": {SPINE: "s1", LEAF: leaf}}});
            nodes.patch(name, &PatchParams::default(), &Patch::Merge(&labels)).await.unwrap();
        }
    } else {
        create_hypernodes(&api).await;
    }
    serve_crd(&api, &weft_extender::kube_view::volcano_pod_group_resource(), "Namespaced").await;
    let view = Arc::new(KubeClusterView::spawn(api.client()));
    guard("the view to sync", view.wait_until_ready()).await;
    let cfg = match network {
        Network::Labels => ExtenderConfig {
            network_levels: weft_extender::gang::NetworkLevels::Levels(LabelLevels::new(&[SPINE, LEAF])),
            ..ExtenderConfig::default()
        },
        Network::HyperNodes => {
            let mut changes = view.changes();
            guard("the HyperNodes in the view", async {
                use weft_extender::ClusterView;
                while view.hypernodes().len() < 3 {
                    changes.changed().await.unwrap();
                }
            })
            .await;
            ExtenderConfig::default()
        }
    };
    let state = Arc::new(
        ExtenderState::new(view.clone(), cfg)
            .with_binder(Arc::new(KubePodBinder::new(api.client()).with_record_namespace("weft-system"))),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(weft_extender::serve(listener, state, Default::default(), std::future::pending()));
    Cluster { api, base, http: reqwest::Client::new(), view }
}

/// A CRD serving `resource` (only what the fake API server needs to serve it: the names, one
/// version, any object).
async fn serve_crd(api: &FakeApiServer, resource: &kube::api::ApiResource, scope: &str) {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{}", resource.plural, resource.group)},
        "spec": {"group": resource.group, "scope": scope,
            "names": {"plural": resource.plural, "singular": resource.kind.to_lowercase(), "kind": resource.kind,
                "listKind": format!("{}List", resource.kind)},
            "versions": [{"name": resource.version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(api.client()).create(&PostParams::default(), &crd).await.unwrap();
}

/// Volcano's HyperNode CRD and the test cluster's three HyperNodes, as Volcano's docs write them.
async fn create_hypernodes(api: &FakeApiServer) {
    let resource = weft_extender::kube_view::volcano_hypernode_resource();
    serve_crd(api, &resource, "Cluster").await;
    let hypernodes: Api<DynamicObject> = Api::all_with(api.client(), &resource);
    let member = |kind: &str, name: &str| json!({"type": kind, "selector": {"exactMatch": {"name": name}}});
    for (name, tier, tier_name, members) in [
        ("leaf-a", 1, "leaf", vec![member("Node", "a1"), member("Node", "a2")]),
        ("leaf-b", 1, "leaf", vec![member("Node", "b1"), member("Node", "b2"), member("Node", "b3")]),
        ("spine-1", 2, "spine", vec![member("HyperNode", "leaf-a"), member("HyperNode", "leaf-b")]),
    ] {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode", "metadata": {"name": name},
            "spec": {"tier": tier, "tierName": tier_name, "members": members}
        }))
        .unwrap();
        hypernodes.create(&PostParams::default(), &obj).await.unwrap();
    }
}

impl Cluster {
    async fn post(&self, verb: &str, body: &Value) -> Value {
        let r = self.http.post(format!("{}/{verb}", self.base)).json(body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{verb}");
        r.json().await.unwrap()
    }

    /// A pending pod in `ml` asking `gpus` GPUs with these annotations.
    async fn pod(&self, name: &str, gpus: u32, annotations: &[(&str, &str)], scheduler: Option<&str>) -> Pod {
        let mut v = common::pending_pod_json(name, gpus);
        for k in ["uid", "resourceVersion", "creationTimestamp", "ownerReferences"] {
            v["metadata"].as_object_mut().unwrap().remove(k);
        }
        for (k, val) in annotations {
            v["metadata"]["annotations"][*k] = json!(val);
        }
        if let Some(s) = scheduler {
            v["spec"]["schedulerName"] = json!(s);
        }
        v["status"] = json!({});
        let pod: Pod = serde_json::from_value(v).unwrap();
        Api::<Pod>::namespaced(self.api.client(), "ml").create(&PostParams::default(), &pod).await.unwrap()
    }

    async fn get(&self, name: &str) -> Pod {
        Api::<Pod>::namespaced(self.api.client(), "ml").get(name).await.unwrap()
    }

    /// A Volcano PodGroup in `ml`, as the job controller makes it; waits until the view has it.
    async fn pod_group(&self, name: &str, min_member: i64, network_topology: Value) {
        let resource = weft_extender::kube_view::volcano_pod_group_resource();
        let api: Api<DynamicObject> = Api::namespaced_with(self.api.client(), "ml", &resource);
        let mut spec = json!({"minMember": min_member, "queue": "default"});
        if !network_topology.is_null() {
            spec["networkTopology"] = network_topology;
        }
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ml"}, "spec": spec
        }))
        .unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
        let mut changes = self.view.changes();
        let view = self.view.clone();
        let name = name.to_string();
        guard("the PodGroup in the view", async move {
            use weft_extender::ClusterView;
            while view.pod_group("ml", &name).is_none() {
                changes.changed().await.unwrap();
            }
        })
        .await;
    }

    /// kube-scheduler's cycle for one pod: filter over every node, prioritize the ones that pass,
    /// the best score wins (ties: `last` picks the last of them, to be adversarial), bind.
    async fn schedule(&self, pod: &Pod, last: bool) -> Result<String, Value> {
        let names: Vec<&str> = NODES.iter().map(|(n, _)| *n).collect();
        let args = json!({"Pod": pod, "NodeNames": names});
        let filtered = self.post("filter", &args).await;
        let passed: Vec<String> = serde_json::from_value(filtered["NodeNames"].clone()).unwrap_or_default();
        if passed.is_empty() {
            return Err(filtered);
        }
        let scores = self.post("prioritize", &json!({"Pod": pod, "NodeNames": passed})).await;
        let scores: Vec<(String, i64)> = scores
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h["Host"].as_str().unwrap().to_string(), h["Score"].as_i64().unwrap()))
            .collect();
        let best = scores.iter().map(|s| s.1).max().unwrap();
        let mut tied = scores.iter().filter(|s| s.1 == best);
        let node = if last { tied.next_back() } else { tied.next() }.unwrap().0.clone();
        let bound = self.post("bind", &common::bind_args(pod, &node)).await;
        assert_eq!(bound["Error"].as_str().unwrap_or(""), "", "bind {node}: {bound}");
        Ok(node)
    }
}

fn leaf_of(node: &str) -> &'static str {
    NODES.iter().find(|(n, _)| *n == node).unwrap().1
}

fn note_of(pod: &Pod) -> GangNote {
    let a = pod.metadata.annotations.as_ref().unwrap();
    serde_json::from_str(a.get(GANG_PLAN_ANNOTATION).expect("the gang note is on the pod")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weft_gang_is_placed_in_the_one_leaf_that_holds_all_its_members_through_kube_scheduler_verbs() {
    let c = cluster().await;
    let gang = [(GANG_ANNOTATION, "train"), (GANG_SIZE_ANNOTATION, "3")];
    let mut nodes = BTreeSet::new();
    for (i, last) in [(0, true), (1, false), (2, true)] {
        let pod = c.pod(&format!("w-{i}"), 8, &gang, None).await;
        let node = c.schedule(&pod, last).await.unwrap_or_else(|f| panic!("w-{i} did not fit: {f}"));
        nodes.insert(node);
    }
    // Leaf a holds two 8-GPU members, leaf b three: the gang goes to b, one member per node.
    assert_eq!(nodes, BTreeSet::from(["b1".to_string(), "b2".into(), "b3".into()]));
    let mut ranks = BTreeSet::new();
    for i in 0..3 {
        let note = note_of(&c.get(&format!("w-{i}")).await);
        assert_eq!((note.group.as_str(), note.members, note.domain.as_str()), ("ml/train", 3, "b"));
        assert!(note.followed, "{note:?}");
        ranks.insert(note.rank);
    }
    assert_eq!(ranks, BTreeSet::from([0, 1, 2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_unplaced_members_keep_their_gpus_from_other_pods_until_they_come() {
    let c = cluster().await;
    let gang = [(GANG_ANNOTATION, "train"), (GANG_SIZE_ANNOTATION, "3")];
    let first = c.pod("w-0", 8, &gang, None).await;
    let node = c.schedule(&first, false).await.unwrap();
    assert_eq!(leaf_of(&node), "b");
    // An 8-GPU pod outside the gang: the two planned nodes left in b are held; a1 and a2 are free.
    let other = c.pod("solo", 8, &[], None).await;
    let filtered = c.post("filter", &json!({"Pod": other, "NodeNames": ["a1", "a2", "b1", "b2", "b3"]})).await;
    assert_eq!(filtered["NodeNames"], json!(["a1", "a2"]), "{filtered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_volcano_podgroup_waits_for_its_podgroup_then_lands_in_one_leaf() {
    let c = cluster().await;
    let annotation = [(VOLCANO_GROUP_ANNOTATION, "pg-1")];
    let pod = c.pod("p-0", 8, &annotation, None).await;
    // The PodGroup is not there yet: every node fails, with the reason.
    let filtered = c.post("filter", &json!({"Pod": pod, "NodeNames": ["a1", "b1"]})).await;
    assert_eq!(filtered["NodeNames"], json!([]), "{filtered}");
    assert!(filtered["FailedNodes"]["a1"].as_str().unwrap().contains("PodGroup ml/pg-1"), "{filtered}");
    // A member that asks no GPUs (a launcher) is not held back: weft places nothing for it.
    let launcher = c.pod("launcher", 0, &annotation, None).await;
    let filtered = c.post("filter", &json!({"Pod": launcher, "NodeNames": ["a1", "b1"]})).await;
    assert_eq!(filtered["NodeNames"], json!(["a1", "b1"]), "{filtered}");
    c.pod_group("pg-1", 2, Value::Null).await;
    let mut leaves = BTreeSet::new();
    for (i, last) in [(0, true), (1, false)] {
        let pod = if i == 0 { c.get("p-0").await } else { c.pod("p-1", 8, &annotation, None).await };
        leaves.insert(leaf_of(&c.schedule(&pod, last).await.unwrap()));
    }
    // Two members: leaf a (two free nodes) is the best fit.
    assert_eq!(leaves, BTreeSet::from(["a"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volcano_job_with_hard_network_topology_lands_in_one_leaf_through_vc_scheduler_verbs() {
    let c = cluster().await;
    // vc-scheduler's shipped verbs.
    let (predicate, prioritize, allocate) = ("volcano/predicate", "volcano/prioritize", "volcano/allocate");
    c.pod_group("job-1-5d2f", 3, json!({"mode": "hard", "highestTierAllowed": 1})).await;
    let annotation = [(VOLCANO_GROUP_ANNOTATION, "job-1-5d2f")];
    let mut placed = Vec::new();
    for i in 0..3 {
        let pod = c.pod(&format!("job-1-worker-{i}"), 8, &annotation, Some("volcano")).await;
        // The session predicates the task on every node, orders the ones that pass, allocates.
        let mut passing = Vec::new();
        for (node, _) in NODES {
            let answer = c.post(predicate, &json!({"task": task(&pod, ""), "node": {"Name": node}})).await;
            if answer["code"] == 0 {
                passing.push(node);
            } else {
                assert_eq!(answer["code"], 2, "{answer}");
            }
        }
        let nodes: Vec<Value> = passing.iter().map(|n| json!({"Name": n})).collect();
        let scores = c.post(prioritize, &json!({"task": task(&pod, ""), "nodes": nodes})).await;
        let best = passing
            .iter()
            .max_by(|a, b| scores["nodeScore"][**a].as_f64().partial_cmp(&scores["nodeScore"][**b].as_f64()).unwrap())
            .unwrap();
        let answer = c.post(allocate, &json!({"task": task(&pod, best)})).await;
        assert_eq!(answer, json!({"errorMessage": ""}));
        placed.push(best.to_string());
    }
    let leaves: BTreeSet<&str> = placed.iter().map(|n| leaf_of(n)).collect();
    assert_eq!(leaves, BTreeSet::from(["b"]), "{placed:?}");
    for i in 0..3 {
        let note = note_of(&c.get(&format!("job-1-worker-{i}")).await);
        assert_eq!((note.domain.as_str(), note.tier.as_str(), note.followed), ("b", LEAF, true), "{note:?}");
    }
    // The extender's requests (the PodGroup watch among them) are granted by its RBAC; the test's
    // own writes (CRD, labels, pods, PodGroups) are left out.
    let extender_requests: Vec<_> = c
        .api
        .requests()
        .into_iter()
        .filter(|r| !(r.verb == weft_fakeapi::Verb::Create && r.resource != "leases" && r.subresource.is_none()))
        .filter(|r| !(r.resource == "nodes" && r.verb == weft_fakeapi::Verb::Patch))
        .filter(|r| r.resource != "customresourcedefinitions")
        .collect();
    assert!(extender_requests.iter().any(|r| r.resource == "podgroups" && r.verb == weft_fakeapi::Verb::Watch));
    common::rbac::assert_granted(&extender_requests, &["base/scheduler-extender/rbac.yaml"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volcano_job_lands_in_one_hypernode_of_its_highest_tier_when_the_cluster_has_hypernodes() {
    let c = cluster_with(Network::HyperNodes).await;
    c.pod_group("job-3", 3, json!({"mode": "hard", "highestTierAllowed": 1})).await;
    let annotation = [(VOLCANO_GROUP_ANNOTATION, "job-3")];
    let mut nodes = BTreeSet::new();
    for (i, last) in [(0, false), (1, true), (2, false)] {
        let pod = c.pod(&format!("j3-{i}"), 8, &annotation, None).await;
        nodes.insert(c.schedule(&pod, last).await.unwrap_or_else(|f| panic!("j3-{i}: {f}")));
    }
    assert_eq!(nodes, BTreeSet::from(["b1".to_string(), "b2".into(), "b3".into()]));
    let note = note_of(&c.get("j3-0").await);
    assert_eq!((note.domain.as_str(), note.tier.as_str()), ("leaf-b", "leaf"), "{note:?}");
    // The HyperNode watch is granted by the extender's RBAC.
    let extender_requests: Vec<_> = c
        .api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "hypernodes" && r.verb != weft_fakeapi::Verb::Create)
        .collect();
    assert!(extender_requests.iter().any(|r| r.verb == weft_fakeapi::Verb::Watch), "{extender_requests:?}");
    common::rbac::assert_granted(&extender_requests, &["base/scheduler-extender/rbac.yaml"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_cannot_follow_a_hard_plan_fails_every_node_instead_of_splitting_the_group() {
    let c = cluster().await;
    c.pod_group("job-2", 3, json!({"mode": "hard", "highestTierAllowed": 1})).await;
    let annotation = [(VOLCANO_GROUP_ANNOTATION, "job-2")];
    let first = c.pod("j-0", 8, &annotation, None).await;
    let node = c.schedule(&first, false).await.unwrap();
    assert_eq!(leaf_of(&node), "b");
    // Something outside weft fills the two other nodes of leaf b.
    for (i, n) in ["b1", "b2", "b3"].into_iter().filter(|n| *n != node).enumerate() {
        let mut v = common::pending_pod_json(&format!("intruder-{i}"), 8);
        for k in ["uid", "resourceVersion", "creationTimestamp", "ownerReferences"] {
            v["metadata"].as_object_mut().unwrap().remove(k);
        }
        v["spec"]["nodeName"] = json!(n);
        v["metadata"]["annotations"][weft_record::usage::GPU_IDS_ANNOTATION] = json!("0,1,2,3,4,5,6,7");
        v["status"] = json!({"phase": "Running"});
        let pod: Pod = serde_json::from_value(v).unwrap();
        Api::<Pod>::namespaced(c.api.client(), "ml").create(&PostParams::default(), &pod).await.unwrap();
    }
    let view = c.view.clone();
    guard("the intruders in the view", async {
        use weft_extender::ClusterView;
        let mut changes = view.changes();
        while ["b1", "b2", "b3"].iter().filter(|n| !view.pods_on_node(n).is_empty()).count() < 3 {
            changes.changed().await.unwrap();
        }
    })
    .await;
    // The second member: nothing left in leaf b, and the constraint forbids the spine.
    let second = c.pod("j-1", 8, &annotation, None).await;
    let failed = c.schedule(&second, false).await.expect_err("no node may take it");
    let why = failed["FailedNodes"]["a1"].as_str().unwrap();
    assert!(why.contains("gang ml/job-2") && why.contains("cannot be placed"), "{why}");
    assert_eq!(
        TierConstraint::from_volcano(&serde_json::from_value(json!({"highestTierAllowed": 1})).unwrap(), "t").unwrap(),
        TierConstraint::hard(weft_gang::TierRef::Number(1)),
        "the test's constraint is a hard one at the leaf tier"
    );
}

/// `api.TaskInfo` as encoding/json writes it (the fields weft reads, and the status).
fn task(pod: &Pod, node_name: &str) -> Value {
    json!({
        "UID": pod.metadata.uid, "Job": "ml/job", "Name": pod.metadata.name, "Namespace": "ml",
        "NodeName": node_name, "Status": 1, "Pod": pod, "PodAnnotations": pod.metadata.annotations
    })
}

/// A node of the in-memory view: 8 PCIe GPUs, in `leaf` under spine `s1`.
fn labelled_node(name: &str, leaf: &str) -> Node {
    let mut n = common::node(name, Some(&common::pcie_only(name, 8)), 8);
    n.metadata.labels = Some([(SPINE.to_string(), "s1".to_string()), (LEAF.to_string(), leaf.to_string())].into());
    n
}

#[test]
fn a_relabelled_node_is_in_its_new_leaf_for_the_next_plan() {
    let view = Arc::new(weft_extender::InMemoryView::new());
    for (name, leaf) in [("n1", "x"), ("n2", "x"), ("n3", "y"), ("n4", "y")] {
        view.insert_node(labelled_node(name, leaf));
    }
    let cfg = ExtenderConfig {
        network_levels: weft_extender::gang::NetworkLevels::Levels(LabelLevels::new(&[SPINE, LEAF])),
        ..ExtenderConfig::default()
    };
    let state = ExtenderState::new(view.clone(), cfg);
    let member = |group: &str| -> Value {
        let mut p = common::pending_pod_json(&format!("{group}-0"), 8);
        p["metadata"]["annotations"] = json!({GANG_ANNOTATION: group, GANG_SIZE_ANNOTATION: "2",
            "weft.io/network-topology": format!("hard:{LEAF}")});
        p
    };
    let filter = |pod: Value| {
        let args = serde_json::from_value(json!({"Pod": pod, "NodeNames": ["n1", "n2", "n3", "n4"]})).unwrap();
        state.filter(args)
    };
    // The first gang takes leaf x (the leaves tie; x by name): n1 and n2 are held for it.
    assert_eq!(filter(member("g1")).node_names, Some(vec!["n1".to_string(), "n2".to_string()]));
    // n3 moves to leaf x: no leaf has two free nodes now, so a second leaf-bound gang cannot be
    // placed (with the network as it was, leaf y would have held it).
    view.insert_node(labelled_node("n3", "x"));
    let answer = filter(member("g2"));
    assert_eq!(answer.node_names, Some(vec![]), "{answer:?}");
    let why = &answer.failed_nodes["n4"];
    assert!(why.contains("gang ml/g2") && why.contains("cannot be placed"), "{why}");
}

#[test]
fn the_pod_policy_lets_the_extender_patch_every_annotation_allocate_records() {
    // vc-scheduler's AllocateFunc records the decision with a pod patch, which the shipped
    // ValidatingAdmissionPolicy confines to a list of annotation keys: the gang note must be in it.
    for file in ["base/scheduler-extender/pod-policy.yaml", "charts/weft/templates/scheduler-extender/pod-policy.yaml"]
    {
        let text = std::fs::read_to_string(common::rbac::deploy_dir().join(file)).unwrap();
        let keys = text.lines().find(|l| l.contains("'weft.io/gpu-ids'")).expect("the policy's keys");
        for annotation in [
            weft_record::usage::GPU_IDS_ANNOTATION,
            weft_record::GPU_DECISION_ANNOTATION,
            weft_record::vf_usage::VF_IDS_ANNOTATION,
            GANG_PLAN_ANNOTATION,
        ] {
            assert!(keys.contains(&format!("'{annotation}'")), "{file}: {annotation} not in {keys}");
        }
    }
}
