//! SR-IOV VFs in the extender's decisions, on the fake API server through the HTTP routes as
//! kube-scheduler calls them: the filter counts free VFs per physnet, prioritize prefers the node
//! where the pod's GPUs and VFs share a PCIe switch, bind records the VFs beside the GPUs and
//! reserves them so back-to-back binds never share one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bind_args, post_verb};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use weft_record::vf_usage::{VF_IDS_ANNOTATION, parse_vf_ids};
use weft_record::{GPU_DECISION_ANNOTATION, GPU_IDS_ANNOTATION, GpuDecision};
use weft_topology::{NodeTopology, PcieRelation};

fn topology(name: &str, aligned: bool, per_nic: usize) -> NodeTopology {
    let nic = if aligned { PcieRelation::Pix } else { PcieRelation::Node };
    common::two_switches(name, nic, per_nic)
}

type Cluster = common::BindCluster;

async fn cluster(nodes: &[(&str, Option<NodeTopology>)]) -> Cluster {
    let topologies: Vec<_> =
        nodes.iter().map(|(name, t)| (*name, t.clone().unwrap_or_else(|| common::pcie_only(name, 4)))).collect();
    common::bind_cluster(&topologies).await
}

/// A pending pod asking for `gpus` GPUs and `vfs` VFs of physnet `fabric`.
async fn pending(c: &Cluster, name: &str, gpus: u32, vfs: u32) -> Pod {
    common::pending(c, name, gpus, &[("sriov.weft.io/fabric", &vfs.to_string())]).await
}

async fn stored(c: &Cluster, name: &str) -> Pod {
    Api::<Pod>::namespaced(c.api.client(), "ml").get(name).await.unwrap()
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a String> {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(key))
}

#[tokio::test]
async fn the_filter_counts_vfs_per_physnet() {
    let c = cluster(&[("aligned", Some(topology("aligned", true, 1))), ("plain", None)]).await;
    let one = pending(&c, "one", 2, 1).await;
    let filtered = post_verb(&c, "filter", &json!({"Pod": one, "NodeNames": ["aligned", "plain"]})).await;
    assert_eq!(filtered["NodeNames"], json!(["aligned"]), "{filtered}");
    let why = filtered["FailedAndUnresolvableNodes"]["plain"].as_str().unwrap();
    assert_eq!(why, "node has 0 VFs of physnet fabric; pod asks for 1");
    let three = pending(&c, "three", 1, 3).await;
    let filtered = post_verb(&c, "filter", &json!({"Pod": three, "NodeNames": ["aligned"]})).await;
    assert_eq!(filtered["NodeNames"], json!([]), "{filtered}");
    assert_eq!(
        filtered["FailedAndUnresolvableNodes"]["aligned"],
        json!("node has 2 VFs of physnet fabric; pod asks for 3")
    );
}

#[tokio::test]
async fn prioritize_prefers_the_node_where_gpus_and_vfs_share_a_switch() {
    let c = cluster(&[("far", Some(topology("far", false, 2))), ("aligned", Some(topology("aligned", true, 2)))]).await;
    let pod = pending(&c, "p", 2, 1).await;
    let scores = post_verb(&c, "prioritize", &json!({"Pod": pod, "NodeNames": ["far", "aligned"]})).await;
    let score = |host: &str| scores.as_array().unwrap().iter().find(|h| h["Host"] == host).unwrap()["Score"].as_i64();
    assert!(score("aligned") > score("far"), "{scores}");
    // The same pod without VFs: the two nodes are alike for GPUs alone.
    let gpus_only = pending(&c, "q", 2, 0).await;
    let scores = post_verb(&c, "prioritize", &json!({"Pod": gpus_only, "NodeNames": ["far", "aligned"]})).await;
    let all: Vec<i64> = scores.as_array().unwrap().iter().map(|h| h["Score"].as_i64().unwrap()).collect();
    assert_eq!(all[0], all[1], "{scores}");
}

#[tokio::test]
async fn bind_records_the_vfs_beside_the_gpus_and_back_to_back_binds_never_share_one() {
    let c = cluster(&[("aligned", Some(topology("aligned", true, 1)))]).await;
    let a = pending(&c, "a", 2, 1).await;
    let b = pending(&c, "b", 2, 1).await;
    // Both binds before the watch can show either pod: the second must see the first's reservation.
    assert_eq!(post_verb(&c, "bind", &bind_args(&a, "aligned")).await, json!({"Error": ""}));
    assert_eq!(post_verb(&c, "bind", &bind_args(&b, "aligned")).await, json!({"Error": ""}));
    let mut got = Vec::new();
    for name in ["a", "b"] {
        let pod = stored(&c, name).await;
        let decision = GpuDecision::from_annotation(annotation(&pod, GPU_DECISION_ANNOTATION).unwrap()).unwrap();
        let vf_ids = parse_vf_ids(annotation(&pod, VF_IDS_ANNOTATION).unwrap()).unwrap();
        assert_eq!(vf_ids, decision.vfs, "{name}: vf-ids says what the decision says");
        assert_eq!(annotation(&pod, GPU_IDS_ANNOTATION).unwrap().split(',').count(), 2);
        got.push((decision.gpus, decision.vfs["fabric"].clone()));
    }
    // Each pod's VF is the one under its GPU pair's switch: NIC0's beside GPU0–1, NIC1's beside
    // GPU2–3.
    got.sort();
    assert_eq!(got, [(vec![0, 1], vec!["0000:0c:00.2".to_string()]), (vec![2, 3], vec!["0000:8c:00.2".to_string()])]);
    // The node has no free VF now.
    let c2 = pending(&c, "c", 0, 1).await;
    let refused = post_verb(&c, "bind", &bind_args(&c2, "aligned")).await;
    assert!(refused["Error"].as_str().unwrap().contains("physnet fabric: 1 VFs asked for, 0 available"), "{refused}");
}

#[tokio::test]
async fn a_vf_only_pod_gets_a_decision_without_gpus() {
    let c = cluster(&[("aligned", Some(topology("aligned", true, 1)))]).await;
    let p = pending(&c, "p", 0, 2).await;
    assert_eq!(post_verb(&c, "bind", &bind_args(&p, "aligned")).await, json!({"Error": ""}));
    let pod = stored(&c, "p").await;
    assert_eq!(annotation(&pod, GPU_IDS_ANNOTATION), None);
    let decision = GpuDecision::from_annotation(annotation(&pod, GPU_DECISION_ANNOTATION).unwrap()).unwrap();
    assert!(decision.gpus.is_empty());
    assert_eq!(decision.vfs["fabric"], ["0000:0c:00.2", "0000:8c:00.2"], "spread over both PFs");
}

/// A ResourceClaim `name` in `ml` as kube-scheduler's DRA plugin leaves it in PreBind: its request
/// `nic` allocated weft's NIC device `device` from the pool of `node`.
async fn allocated_claim(c: &Cluster, name: &str, node: &str, device: &str) {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use kube::api::{Patch, PatchParams, PostParams};
    let api: Api<ResourceClaim> = Api::namespaced(c.api.client(), "ml");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "weft-nic"}}]}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &claim).await.unwrap();
    let status = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "nic", "driver": "nic.weft.io", "pool": node, "device": device}]}}}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

#[tokio::test]
async fn bind_puts_the_gpus_beside_the_vf_the_scheduler_allocated_through_dra() {
    let c = cluster(&[("left", Some(topology("left", true, 1))), ("right", Some(topology("right", true, 1)))]).await;
    // Two pods asking for 2 GPUs and no device-plugin VF; "beside" holds a claim whose VF the
    // scheduler took from NIC1, under the switch of GPU2–3.
    allocated_claim(&c, "beside-nic", "right", "vf-0000-8c-00-2").await;
    let mut pod = common::pending_pod_json("beside", 2);
    for k in ["uid", "resourceVersion", "creationTimestamp", "ownerReferences"] {
        pod["metadata"].as_object_mut().unwrap().remove(k);
    }
    pod["spec"]["resourceClaims"] = json!([{"name": "nic", "resourceClaimName": "beside-nic"}]);
    pod["status"] = json!({});
    let beside: Pod = Api::namespaced(c.api.client(), "ml")
        .create(&Default::default(), &serde_json::from_value(pod).unwrap())
        .await
        .unwrap();
    let plain = pending(&c, "plain", 2, 0).await;
    let before = c.api.requests().len();
    assert_eq!(post_verb(&c, "bind", &bind_args(&plain, "left")).await, json!({"Error": ""}));
    assert_eq!(post_verb(&c, "bind", &bind_args(&beside, "right")).await, json!({"Error": ""}));
    // What the extender asked of the API server during the binds (the claim read among them) is
    // what its RBAC grants.
    let binds = c.api.requests().split_off(before);
    assert!(binds.iter().any(|r| r.resource == "resourceclaims" && r.name.as_deref() == Some("beside-nic")));
    common::rbac::assert_granted(&binds, &["base/scheduler-extender/rbac.yaml"]);
    let gpus =
        |pod: &Pod| GpuDecision::from_annotation(annotation(pod, GPU_DECISION_ANNOTATION).unwrap()).unwrap().gpus;
    assert_eq!(gpus(&stored(&c, "plain").await), [0, 1], "without a claim: the best-effort pair, lowest first");
    let beside = stored(&c, "beside").await;
    assert_eq!(gpus(&beside), [2, 3], "the equally good pair under the allocated VF's switch");
    assert_eq!(annotation(&beside, VF_IDS_ANNOTATION), None, "a DRA VF is the claim's, not a device-plugin VF");
}
