//! The VIF records weft-cni leaves on the node, published on the pods through the fake API server:
//! `weft.io/vifs` with every attachment of the pod, network-status with weft's interfaces added
//! beside the cluster network's entry, nothing written when the pod already says it, and a write
//! computed from a stale copy of the pod refused instead of undoing another writer's change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use weft_cni::state::{Applied, AttachedVf, Attachment, OriginalState, PodRef, StateDir};
use weft_fakeapi::FakeApiServer;
use weft_net::vif::{NETWORK_STATUS_ANNOTATION, VIFS_ANNOTATION, Vif, VifRecord};
use weft_sriov_plugin::vifs::{KubeVifWriter, publish_once};

const CLUSTER_NET: &str = r#"[{"name":"cbr0","interface":"eth0","ips":["10.244.1.5"],"default":true}]"#;

fn attachment(uid: &str, ifname: &str, physnet: &str, pci: &str, ip: &str) -> Attachment {
    Attachment {
        format: weft_cni::state::ATTACHMENT_FORMAT.into(),
        container_id: format!("c-{uid}"),
        ifname: ifname.into(),
        netns: "/var/run/netns/x".into(),
        network: physnet.into(),
        pod: PodRef { namespace: Some("ml".into()), name: Some("trainer".into()), uid: Some(uid.into()) },
        vfs: vec![AttachedVf {
            pci_address: pci.into(),
            vf_index: 0,
            pf_netdev: Some("ens1f0".into()),
            ifname: ifname.into(),
            original: OriginalState { host_ifname: "ens1f0v0".into(), mac: None, mtu: 1500, up: false, pf: None },
            applied: Applied::default(),
            vif: Vif {
                physnet: physnet.into(),
                pci_address: pci.into(),
                pf_pci_address: Some("0000:3b:00.0".into()),
                mac: Some("02:00:00:aa:bb:cc".into()),
                ips: vec![ip.into()],
                gateways: vec![],
                vlan: Some(100),
                mtu: Some(9000),
                rdma_device: None,
                // weft-cni names the network after its CNI configuration's `name`.
                network: Some(physnet.into()),
            },
        }],
    }
}

async fn cluster() -> (FakeApiServer, Api<Pod>, String) {
    let api = FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(api.client(), "ml");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "trainer", "namespace": "ml",
                     "annotations": {NETWORK_STATUS_ANNOTATION: CLUSTER_NET}},
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "trainer"}]}
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    (api, pods, uid)
}

/// The kubelet's copy of the node's pods, as the test sets it.
fn kubelet_copy(pods: Arc<Mutex<Vec<Pod>>>) -> impl Fn() -> Result<Vec<Pod>, String> + Send + Sync + 'static {
    move || Ok(pods.lock().unwrap().clone())
}

fn annotation(pod: &Pod, key: &str) -> String {
    pod.metadata.annotations.as_ref().unwrap().get(key).cloned().unwrap_or_default()
}

#[tokio::test]
async fn every_attachment_of_a_pod_lands_in_one_record_beside_the_cluster_network() {
    let (api, pods, uid) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    state.save(&attachment(&uid, "net1", "physnet2", "0000:3b:02.0", "10.56.0.7/24")).unwrap();
    state.save(&attachment(&uid, "net2", "physnet3", "0000:3b:02.1", "10.57.0.7/24")).unwrap();
    state.save(&attachment("gone", "net1", "physnet2", "0000:3b:02.2", "10.56.0.8/24")).unwrap();
    let copy = Arc::new(Mutex::new(vec![pods.get("trainer").await.unwrap()]));
    let writer = KubeVifWriter::new(api.client(), "weft-agent");

    let done = publish_once(&state, &kubelet_copy(copy.clone()), &writer).await.unwrap();
    assert_eq!(done.written, ["ml/trainer"], "{done:?}");
    let pod = pods.get("trainer").await.unwrap();
    let record = VifRecord::parse(&annotation(&pod, VIFS_ANNOTATION)).unwrap();
    let names: Vec<&str> = record.vifs.keys().map(String::as_str).collect();
    assert_eq!(names, ["net1", "net2"]);
    assert_eq!(record.vifs["net2"].pci_address, "0000:3b:02.1");
    let status: Vec<Value> = serde_json::from_str(&annotation(&pod, NETWORK_STATUS_ANNOTATION)).unwrap();
    let interfaces: Vec<&str> = status.iter().map(|s| s["interface"].as_str().unwrap()).collect();
    assert_eq!(interfaces, ["eth0", "net1", "net2"], "the cluster network's entry stays first");
    assert_eq!(status[1]["ips"], json!(["10.56.0.7"]));
    assert_eq!(status[1]["device-info"]["pci"]["pci-address"], "0000:3b:02.0");

    // The kubelet's copy catches up: the pod already says it, nothing is written.
    *copy.lock().unwrap() = vec![pod];
    let again = publish_once(&state, &kubelet_copy(copy), &writer).await.unwrap();
    assert!(again.written.is_empty() && again.failed.is_empty(), "{again:?}");
}

#[tokio::test]
async fn a_record_computed_from_a_stale_copy_is_refused_and_the_other_writers_change_stays() {
    let (api, pods, uid) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    state.save(&attachment(&uid, "net1", "physnet2", "0000:3b:02.0", "10.56.0.7/24")).unwrap();
    let stale = pods.get("trainer").await.unwrap();
    // Multus adds another network's entry meanwhile.
    let theirs = r#"[{"name":"cbr0","interface":"eth0","default":true},{"name":"ml/storage","interface":"net9"}]"#;
    let patch = json!({"metadata": {"annotations": {NETWORK_STATUS_ANNOTATION: theirs}}});
    pods.patch("trainer", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();

    let writer = KubeVifWriter::new(api.client(), "weft-agent");
    let copy = Arc::new(Mutex::new(vec![stale]));
    let done = publish_once(&state, &kubelet_copy(copy.clone()), &writer).await.unwrap();
    assert!(done.written.is_empty(), "{done:?}");
    assert_eq!(done.failed.len(), 1, "{done:?}");
    assert_eq!(annotation(&pods.get("trainer").await.unwrap(), NETWORK_STATUS_ANNOTATION), theirs);

    // From the fresh copy, weft's entry joins theirs.
    *copy.lock().unwrap() = vec![pods.get("trainer").await.unwrap()];
    let done = publish_once(&state, &kubelet_copy(copy), &writer).await.unwrap();
    assert_eq!(done.written, ["ml/trainer"]);
    let status: Vec<Value> =
        serde_json::from_str(&annotation(&pods.get("trainer").await.unwrap(), NETWORK_STATUS_ANNOTATION)).unwrap();
    let interfaces: Vec<&str> = status.iter().map(|s| s["interface"].as_str().unwrap()).collect();
    assert_eq!(interfaces, ["eth0", "net9", "net1"]);
}

#[tokio::test]
async fn the_entry_multus_wrote_keeps_its_attachment_name_and_gets_weft_device_info() {
    let (api, pods, uid) = cluster().await;
    // Multus made net1 for `k8s.v1.cni.cncf.io/networks: physnet2` in namespace ml, naming it after
    // the NetworkAttachmentDefinition (its pkg/types/conf.go), not after weft-cni's conf name.
    let multus = r#"[{"name":"cbr0","interface":"eth0","ips":["10.244.1.5"],"default":true,"dns":{}},
                     {"name":"ml/physnet2","interface":"net1","ips":["10.56.0.7"],"mac":"02:00:00:aa:bb:cc","mtu":9000,"dns":{}}]"#;
    let patch = json!({"metadata": {"annotations": {NETWORK_STATUS_ANNOTATION: multus}}});
    pods.patch("trainer", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    state.save(&attachment(&uid, "net1", "physnet2", "0000:3b:02.0", "10.56.0.7/24")).unwrap();
    let writer = KubeVifWriter::new(api.client(), "weft-agent");
    let copy = Arc::new(Mutex::new(vec![pods.get("trainer").await.unwrap()]));

    let done = publish_once(&state, &kubelet_copy(copy.clone()), &writer).await.unwrap();
    assert_eq!(done.written, ["ml/trainer"], "{done:?}");
    let pod = pods.get("trainer").await.unwrap();
    let status: Vec<Value> = serde_json::from_str(&annotation(&pod, NETWORK_STATUS_ANNOTATION)).unwrap();
    let names: Vec<&str> = status.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["cbr0", "ml/physnet2"], "one entry per interface, Multus' name kept");
    assert_eq!(status[1]["device-info"]["pci"]["pci-address"], "0000:3b:02.0");
    assert_eq!(status[1]["device-info"]["pci"]["pf-pci-address"], "0000:3b:00.0");

    // The next pass finds it said and writes nothing.
    *copy.lock().unwrap() = vec![pod];
    let again = publish_once(&state, &kubelet_copy(copy), &writer).await.unwrap();
    assert!(again.written.is_empty() && again.failed.is_empty(), "{again:?}");
}
