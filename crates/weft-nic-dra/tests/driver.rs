//! weft's NIC DRA driver against the test kubelet over real gRPC on unix sockets, with claims on
//! the fake API server as the scheduler allocates them and a fake PF for the VLANs: registration,
//! prepare and unprepare, the kubelet's retries (double prepare, unprepare of an unknown claim),
//! cluster-wide IPAM (exhaustion, a crash between allocating the address and recording it), a
//! restart from the checkpoint, and the per-claim errors. Waits are under a hang guard; nothing
//! sleeps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use weft_cni::pf::{PfCall, PfControl, PfVfState, VlanProto};
use weft_fakeapi::Verb;
use weft_nic_dra::api::dra::{Claim, Device, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use weft_nic_dra::api::registration::InfoRequest;
use weft_nic_dra::api::registration::registration_client::RegistrationClient;

fn device(name: &str) -> Device {
    Device {
        request_names: vec!["nic".into()],
        pool_name: NODE.into(),
        device_name: name.into(),
        cdi_device_ids: vec![],
        share_id: None,
    }
}

fn claim_ref(name: &str) -> Claim {
    Claim { namespace: NS.into(), uid: format!("claim-{name}"), name: name.into() }
}

fn vlan(v: u16) -> PfVfState {
    PfVfState { vlan: v, qos: 0, proto: VlanProto::Dot1Q, admin_mac: None }
}

/// Since the last `clear_requests`, the driver neither read a claim (only the kubelet did, once)
/// nor a pod, nor created anything: it answered from its checkpoint.
fn answered_from_the_checkpoint(node: &Node) {
    let requests = node.api.requests();
    let claim_reads = requests.iter().filter(|r| r.resource == "resourceclaims" && r.verb == Verb::Get).count();
    assert_eq!(claim_reads, 1, "only the kubelet reads the claim: {requests:?}");
    assert!(requests.iter().all(|r| r.resource != "pods" && r.verb != Verb::Create), "{requests:?}");
}

#[tokio::test]
async fn registration_answers_what_the_kubelet_checks() {
    let node = Node::start().await;
    let options = node.options();
    assert_eq!(node.kubelet.registered().get(DRIVER), Some(&options.dra_socket()));
    let channel = weft_deviceplugin::server::unix_channel(&options.registration_socket()).await.unwrap();
    let info = RegistrationClient::new(channel).get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "nic.weft.io");
    assert_eq!(info.endpoint, options.dra_socket().display().to_string());
    assert!(info.endpoint.ends_with("plugins/nic.weft.io/dra.sock"), "{}", info.endpoint);
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    assert!(options.registration_socket().ends_with("plugins_registry/nic.weft.io-reg.sock"));
}

#[tokio::test]
async fn stale_sockets_are_replaced_and_removed_on_stop() {
    let mut node = Node::start().await;
    node.stop_driver().await;
    let options = node.options();
    assert!(!options.registration_socket().exists() && !options.dra_socket().exists());
    // A crashed run leaves files where the sockets go: the next run serves anyway.
    std::fs::write(options.registration_socket(), "stale").unwrap();
    std::fs::write(options.dra_socket(), "stale").unwrap();
    node.start_driver().await;
    assert_eq!(node.kubelet.registered().len(), 1);
}

#[tokio::test]
async fn prepare_allocates_an_address_sets_the_vlan_and_unprepare_undoes_it() {
    let node = Node::start().await;
    let p = pod("vertex-0", "c1", Some(&[0]));
    node.add(claim("c1", "vf-0000-03-00-2", nic_config("net-a", "10.20.0.0/24", Some(100)), "vertex-0"), &p);

    guard("prepare", node.kubelet.prepare(&p)).await.unwrap();

    let info = node.kubelet.claim(NS, "c1").unwrap();
    assert!(info.prepared);
    assert_eq!(info.devices[DRIVER], [device("vf-0000-03-00-2")]);
    assert_eq!(node.pf.current("ens1f0", 0), vlan(100), "the VLAN is set on the VF through its PF");
    let addresses = node.addresses();
    let obj = &addresses["net-a.10-20-0-1"];
    assert_eq!(obj["spec"]["address"], "10.20.0.1");
    assert_eq!(obj["spec"]["network"], "net-a");
    assert_eq!(obj["spec"]["node"], NODE);
    assert_eq!(obj["spec"]["claim"]["name"], "c1");
    assert_eq!(obj["spec"]["claim"]["uid"], "claim-c1");
    assert_eq!(obj["metadata"]["labels"]["weft.io/network"], "net-a");
    assert_eq!(obj["metadata"]["labels"]["weft.io/claim-uid"], "claim-c1");

    // What the NRI half reads for the pod.
    let nics = node.driver().pod_nics().nics_for_pod("pod-vertex-0");
    assert_eq!(nics.len(), 1);
    let nic = &nics[0];
    assert_eq!((nic.vf_pci.as_str(), nic.pf.as_str(), nic.vf_index), ("0000:03:00.2", "ens1f0", 0));
    assert_eq!(nic.address.to_string(), "10.20.0.1/24");
    assert_eq!((nic.network.as_str(), nic.vlan), ("net-a", Some(100)));
    assert_eq!(nic.aligned, Some(true), "the VF sits under GPU 0's switch");
    assert!(node.driver().pod_nics().nics_for_pod("pod-other").is_empty());

    guard("unprepare", node.kubelet.unprepare(&p)).await.unwrap();
    assert_eq!(node.pf.current("ens1f0", 0), vlan(7), "the VF's original VLAN is back");
    assert!(node.addresses().is_empty(), "the address is released");
    assert!(node.driver().checkpoint().state().claims.is_empty());
    assert!(node.kubelet.claim(NS, "c1").is_none());
    // Every request the driver made is granted by the agent's ClusterRoles (base and nic-dra).
    weft_testkit::rbac::assert_granted(&node.api.requests(), &["base/agent/rbac.yaml", "components/nic-dra/rbac.yaml"]);
}

#[tokio::test]
async fn a_vf_far_from_the_pods_gpus_is_prepared_as_allocated_and_reported_unaligned() {
    let node = Node::start().await;
    // The scheduler gave a VF under GPU 1's switch to a pod whose GPU is GPU 0.
    let p = pod("vertex-1", "c1", Some(&[0]));
    node.add(claim("c1", "vf-0000-83-00-3", nic_config("net-a", "10.20.0.0/24", None), "vertex-1"), &p);
    guard("prepare", node.kubelet.prepare(&p)).await.unwrap();
    assert_eq!(node.kubelet.claim(NS, "c1").unwrap().devices[DRIVER], [device("vf-0000-83-00-3")], "never swapped");
    let nic = &node.driver().pod_nics().nics_for_pod("pod-vertex-1")[0];
    assert_eq!((nic.vf_pci.as_str(), nic.aligned), ("0000:83:00.3", Some(false)));
    assert_eq!(node.pf.current("ens2f0", 1), vlan(0), "an untagged network leaves the VF untagged");
    // A pod without weft's GPU decision gets no verdict.
    let q = pod("vertex-2", "c2", None);
    node.add(claim("c2", "vf-0000-83-00-2", nic_config("net-a", "10.20.0.0/24", None), "vertex-2"), &q);
    guard("prepare", node.kubelet.prepare(&q)).await.unwrap();
    assert_eq!(node.driver().pod_nics().nics_for_pod("pod-vertex-2")[0].aligned, None);
}

#[tokio::test]
async fn a_second_prepare_answers_the_same_without_allocating_twice() {
    let node = Node::start().await;
    let p = pod("vertex-0", "c1", None);
    node.add(claim("c1", "vf-0000-03-00-4", nic_config("net-a", "10.20.0.0/24", Some(5)), "vertex-0"), &p);
    guard("prepare", node.kubelet.prepare(&p)).await.unwrap();
    let first = node.kubelet.claim(NS, "c1").unwrap().devices;
    let creates = |node: &Node| {
        node.api.requests().iter().filter(|r| r.verb == Verb::Create && r.resource == "networkaddresses").count()
    };
    assert_eq!(creates(&node), 1);

    // The kubelet crashed before recording the prepare: it prepares again.
    node.kubelet.forget_prepared(NS, "c1");
    node.api.clear_requests();
    guard("prepare again", node.kubelet.prepare(&p)).await.unwrap();
    assert_eq!(node.kubelet.claim(NS, "c1").unwrap().devices, first);
    // The driver answered from its checkpoint; only the kubelet read the claim.
    answered_from_the_checkpoint(&node);
    // And straight at the socket, as a retry after a timeout arrives.
    let mut plugin = node.kubelet.plugin(DRIVER).await.unwrap();
    let again = plugin
        .node_prepare_resources(NodePrepareResourcesRequest { claims: vec![claim_ref("c1")] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["claim-c1"].devices, first[DRIVER]);
    assert_eq!(again.claims["claim-c1"].error, "");
    assert_eq!(node.addresses().len(), 1);
    assert_eq!(creates(&node), 0);
    let sets = |node: &Node| node.pf.calls().iter().filter(|c| matches!(c, PfCall::SetVlan { .. })).count();
    let before = sets(&node);
    plugin.node_prepare_resources(NodePrepareResourcesRequest { claims: vec![claim_ref("c1")] }).await.unwrap();
    assert_eq!(sets(&node), before, "no write when the VLAN is as it should be");
    // A VLAN that drifted since (someone ran `ip link set ens1f0 vf 2 vlan 9`) is set again.
    let host = weft_cni::net::Links::here().unwrap();
    node.pf.set_vlan(&host, "ens1f0", 2, 9, 0, VlanProto::Dot1Q).await.unwrap();
    plugin.node_prepare_resources(NodePrepareResourcesRequest { claims: vec![claim_ref("c1")] }).await.unwrap();
    assert_eq!(node.pf.current("ens1f0", 2), vlan(5));
}

#[tokio::test]
async fn unprepare_of_an_unknown_claim_is_success() {
    let node = Node::start().await;
    let mut plugin = node.kubelet.plugin(DRIVER).await.unwrap();
    let answer = guard(
        "unprepare",
        plugin.node_unprepare_resources(NodeUnprepareResourcesRequest { claims: vec![claim_ref("never-seen")] }),
    )
    .await
    .unwrap()
    .into_inner();
    assert_eq!(answer.claims.len(), 1);
    assert_eq!(answer.claims["claim-never-seen"].error, "");
    assert!(node.pf.calls().iter().all(|c| !matches!(c, PfCall::SetVlan { .. })), "{:?}", node.pf.calls());
    // Twice over a prepared one: the second is a no-op success too.
    let p = pod("vertex-0", "c1", None);
    node.add(claim("c1", "vf-0000-03-00-2", nic_config("net-a", "10.20.0.0/24", None), "vertex-0"), &p);
    guard("prepare", node.kubelet.prepare(&p)).await.unwrap();
    for _ in 0..2 {
        let answer = plugin
            .node_unprepare_resources(NodeUnprepareResourcesRequest { claims: vec![claim_ref("c1")] })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.claims["claim-c1"].error, "");
    }
    assert!(node.addresses().is_empty());
}

#[tokio::test]
async fn an_exhausted_range_is_a_per_claim_error_until_an_address_is_released() {
    // Allocating from the watch cache (a released address may still be in it) and by listing.
    exhaustion(Node::start().await).await;
    exhaustion(Node::start_listing().await).await;
}

async fn exhaustion(node: Node) {
    // A /30 has two usable addresses.
    let config = || nic_config("net-small", "10.30.0.0/30", None);
    let pods: Vec<_> = (0..3).map(|i| pod(&format!("v{i}"), &format!("c{i}"), None)).collect();
    for (i, p) in pods.iter().enumerate() {
        node.add(claim(&format!("c{i}"), &format!("vf-0000-03-00-{}", i + 2), config(), &format!("v{i}")), p);
    }
    guard("prepare v0", node.kubelet.prepare(&pods[0])).await.unwrap();
    guard("prepare v1", node.kubelet.prepare(&pods[1])).await.unwrap();
    let e = guard("prepare v2", node.kubelet.prepare(&pods[2])).await.unwrap_err();
    assert!(e.contains("NodePrepareResources failed for ResourceClaim c2"), "{e}");
    assert!(e.contains("network net-small: no free address in 10.30.0.0/30 (all 2 usable addresses are held)"), "{e}");
    let held: Vec<String> = node.addresses().into_keys().collect();
    assert_eq!(held, ["net-small.10-30-0-1", "net-small.10-30-0-2"]);
    assert!(node.driver().checkpoint().get("claim-c2").is_none(), "a failed prepare records nothing");

    guard("unprepare v0", node.kubelet.unprepare(&pods[0])).await.unwrap();
    guard("prepare v2 again", node.kubelet.prepare(&pods[2])).await.unwrap();
    let nic = &node.driver().pod_nics().nics_for_pod("pod-v2")[0];
    assert_eq!(nic.address.to_string(), "10.30.0.1/30", "the released address, lowest first");
}

#[tokio::test]
async fn an_address_taken_by_another_node_is_skipped() {
    taken_elsewhere(Node::start().await).await;
    taken_elsewhere(Node::start_listing().await).await;
}

async fn taken_elsewhere(node: Node) {
    // Another node's driver holds .1 (its object name is the lock).
    node.api
        .insert(serde_json::json!({
            "apiVersion": "weft.io/v1alpha1", "kind": "NetworkAddress",
            "metadata": {"name": "net-a.10-20-0-1", "labels": {"weft.io/network": "net-a", "weft.io/claim-uid": "other"}},
            "spec": {"network": "net-a", "address": "10.20.0.1", "node": "node-2",
                     "claim": {"namespace": NS, "name": "elsewhere", "uid": "other"}}
        }))
        .unwrap();
    let p = pod("vertex-0", "c1", None);
    node.add(claim("c1", "vf-0000-03-00-2", nic_config("net-a", "10.20.0.0/24", None), "vertex-0"), &p);
    guard("prepare", node.kubelet.prepare(&p)).await.unwrap();
    assert_eq!(node.driver().pod_nics().nics_for_pod("pod-vertex-0")[0].address.to_string(), "10.20.0.2/24");
    guard("unprepare", node.kubelet.unprepare(&p)).await.unwrap();
    assert_eq!(node.addresses().into_keys().collect::<Vec<_>>(), ["net-a.10-20-0-1"], "only its own address goes");
    weft_testkit::rbac::assert_granted(&node.api.requests(), &["base/agent/rbac.yaml", "components/nic-dra/rbac.yaml"]);
}

#[tokio::test]
async fn a_crash_between_allocating_the_address_and_recording_it_leaks_nothing() {
    crash_before_checkpoint(Node::start().await).await;
    crash_before_checkpoint(Node::start_listing().await).await;
}

async fn crash_before_checkpoint(mut node: Node) {
    let p = pod("vertex-0", "c1", None);
    node.add(claim("c1", "vf-0000-03-00-2", nic_config("net-a", "10.20.0.0/24", Some(100)), "vertex-0"), &p);
    // The address is allocated, then the checkpoint write fails: the driver dies there.
    node.driver().checkpoint().fail_next_stores(1);
    let e = guard("prepare", node.kubelet.prepare(&p)).await.unwrap_err();
    assert!(e.contains("NodePrepareResources failed for ResourceClaim c1"), "{e}");
    assert!(e.contains("recording the prepared NICs") && e.contains("injected fault"), "{e}");
    assert_eq!(node.addresses().len(), 1, "the address was allocated before the crash");
    assert_eq!(node.pf.current("ens1f0", 0), vlan(7), "the VLAN is set only once the claim is recorded");
    node.stop_driver().await;

    // The restarted driver, asked again by the kubelet, finds the same address.
    node.start_driver().await;
    guard("prepare after the restart", node.kubelet.prepare(&p)).await.unwrap();
    let addresses = node.addresses();
    assert_eq!(addresses.keys().collect::<Vec<_>>(), ["net-a.10-20-0-1"], "one object, the same address");
    assert_eq!(node.driver().pod_nics().nics_for_pod("pod-vertex-0")[0].address.to_string(), "10.20.0.1/24");
    assert_eq!(node.pf.current("ens1f0", 0), vlan(100));

    // Had the kubelet given up instead, unprepare would still have released it.
    node.driver().checkpoint().fail_next_stores(0);
    let q = pod("vertex-1", "c2", None);
    node.add(claim("c2", "vf-0000-03-00-3", nic_config("net-a", "10.20.0.0/24", None), "vertex-1"), &q);
    node.driver().checkpoint().fail_next_stores(1);
    assert!(guard("prepare c2", node.kubelet.prepare(&q)).await.is_err());
    assert_eq!(node.addresses().len(), 2);
    let mut plugin = node.kubelet.plugin(DRIVER).await.unwrap();
    let answer = plugin
        .node_unprepare_resources(NodeUnprepareResourcesRequest { claims: vec![claim_ref("c2")] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims["claim-c2"].error, "");
    assert_eq!(node.addresses().keys().collect::<Vec<_>>(), ["net-a.10-20-0-1"]);
}

#[tokio::test]
async fn a_restarted_driver_serves_and_undoes_from_its_checkpoint() {
    let mut node = Node::start().await;
    let p = pod("vertex-0", "c1", Some(&[0]));
    node.add(claim("c1", "vf-0000-03-00-2", nic_config("net-a", "10.20.0.0/24", Some(100)), "vertex-0"), &p);
    guard("prepare", node.kubelet.prepare(&p)).await.unwrap();
    let before = node.driver().pod_nics().nics_for_pod("pod-vertex-0");
    node.stop_driver().await;

    node.start_driver().await;
    assert_eq!(node.driver().pod_nics().nics_for_pod("pod-vertex-0"), before, "the NRI half sees the same NICs");
    node.kubelet.forget_prepared(NS, "c1");
    node.api.clear_requests();
    guard("prepare after the restart", node.kubelet.prepare(&p)).await.unwrap();
    answered_from_the_checkpoint(&node);
    guard("unprepare", node.kubelet.unprepare(&p)).await.unwrap();
    assert_eq!(node.pf.current("ens1f0", 0), vlan(7), "the original VLAN came from the checkpoint");
    assert!(node.addresses().is_empty());
}

#[tokio::test]
async fn a_bad_opaque_config_is_a_per_claim_error_naming_the_field() {
    let node = Node::start().await;
    let mut config = nic_config("net-a", "10.20.0.0/24", None);
    config["vlanTag"] = serde_json::json!(100);
    let p = pod("vertex-0", "c1", None);
    node.add(claim("c1", "vf-0000-03-00-2", config, "vertex-0"), &p);
    let good = pod("vertex-1", "c2", None);
    node.add(claim("c2", "vf-0000-03-00-3", nic_config("net-a", "10.20.0.0/24", None), "vertex-1"), &good);

    let mut plugin = node.kubelet.plugin(DRIVER).await.unwrap();
    let answer = guard(
        "prepare",
        plugin.node_prepare_resources(NodePrepareResourcesRequest { claims: vec![claim_ref("c1"), claim_ref("c2")] }),
    )
    .await
    .unwrap()
    .into_inner();
    let e = &answer.claims["claim-c1"].error;
    assert!(e.contains("ResourceClaim video/c1, request nic") && e.contains("unknown field `vlanTag`"), "{e}");
    assert!(answer.claims["claim-c1"].devices.is_empty());
    assert_eq!(answer.claims["claim-c2"].error, "", "the other claim is prepared");
    assert_eq!(answer.claims["claim-c2"].devices, [device("vf-0000-03-00-3")]);
    assert_eq!(node.addresses().len(), 1, "no address for the bad claim");

    let e = guard("prepare through the kubelet", node.kubelet.prepare(&p)).await.unwrap_err();
    assert!(e.starts_with("prepare dynamic resources: NodePrepareResources failed for ResourceClaim c1: "), "{e}");
}

#[tokio::test]
async fn a_claim_replaced_under_the_same_name_is_refused() {
    let node = Node::start().await;
    let p = pod("vertex-0", "c1", None);
    node.add(claim("c1", "vf-0000-03-00-2", nic_config("net-a", "10.20.0.0/24", None), "vertex-0"), &p);
    let mut plugin = node.kubelet.plugin(DRIVER).await.unwrap();
    let stale = Claim { namespace: NS.into(), uid: "claim-c1-old".into(), name: "c1".into() };
    let answer = guard("prepare", plugin.node_prepare_resources(NodePrepareResourcesRequest { claims: vec![stale] }))
        .await
        .unwrap()
        .into_inner();
    let e = &answer.claims["claim-c1-old"].error;
    assert!(e.contains("ResourceClaim video/c1 has UID claim-c1, not claim-c1-old"), "{e}");
    let gone = Claim { namespace: NS.into(), uid: "u".into(), name: "missing".into() };
    let answer = plugin.node_prepare_resources(NodePrepareResourcesRequest { claims: vec![gone] }).await.unwrap();
    assert!(answer.into_inner().claims["u"].error.contains("ResourceClaim video/missing does not exist"));
    assert!(node.addresses().is_empty());
}

#[tokio::test]
async fn the_kubelet_refuses_a_pod_the_claim_is_not_reserved_for() {
    let node = Node::start().await;
    let p = pod("vertex-0", "c1", None);
    node.add(claim("c1", "vf-0000-03-00-2", nic_config("net-a", "10.20.0.0/24", None), "someone-else"), &p);
    let e = guard("prepare", node.kubelet.prepare(&p)).await.unwrap_err();
    assert!(e.contains("pod vertex-0 (pod-vertex-0) is not allowed to use ResourceClaim c1 (claim-c1)"), "{e}");
    assert!(node.kubelet.claim(NS, "c1").is_none(), "nothing enters the kubelet's cache");
}
