//! The node the driver tests (and the bench) run on: a fake sysfs tree with two PFs under two
//! PCIe switches (a GPU beside each), the fake API server holding claims as the scheduler writes
//! them, a fake PF for the VLANs, the driver serving its sockets, and the test kubelet registered
//! with it.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::CustomResourceExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use weft_cni::pf::{FakePfControl, PfVfState, VlanProto};
use weft_fakeapi::FakeApiServer;
use weft_ipam::network_address::NetworkAddress;
use weft_kubelet_harness::dra::DraKubelet;
use weft_net::config::PhysnetConfig;
use weft_nic_dra::{Checkpoint, NicDriver, NicInventory, PfVlan, ServeOptions, Serving};
use weft_record::GpuDecision;
use weft_topology::NodeTopology;
use weft_topology::discover::{FakeSriovTree, SriovInventory, read_sriov};

pub const HANG_GUARD: Duration = Duration::from_secs(20);
pub const NODE: &str = "node-1";
pub const NS: &str = "video";
pub const DRIVER: &str = "nic.weft.io";

pub async fn guard<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("hung waiting for {what}"))
}

/// Switch A (root pci0000:00, NUMA 0): PF ens1f0 at 03:00.0 with four RDMA VFs 03:00.2-5, GPU 0
/// at 04:00.0. Switch B (root pci0000:80, NUMA 1): PF ens2f0 at 83:00.0 with four plain VFs
/// 83:00.2-5, GPU 1 at 84:00.0.
pub fn sysfs(dir: &Path) -> SriovInventory {
    let tree = FakeSriovTree::new(dir);
    let a = ["0000:00:01.0", "0000:01:00.0"];
    let b = ["0000:80:01.0", "0000:81:00.0"];
    tree.pf("0000:03:00.0", &[a[0], a[1], "0000:02:00.0"], "ens1f0", 0).link("ens1f0", "up", 200_000).rdma("mlx5_0");
    tree.pf("0000:83:00.0", &[b[0], b[1], "0000:82:00.0"], "ens2f0", 1).link("ens2f0", "up", 100_000);
    for i in 0..4 {
        let f = i + 2;
        tree.vf("0000:03:00.0", i, &format!("0000:03:00.{f}"), None).rdma(&format!("mlx5_{f}"));
        tree.vf("0000:83:00.0", i, &format!("0000:83:00.{f}"), None);
    }
    tree.pci_device("0000:04:00.0", &[a[0], a[1], "0000:02:01.0"], 0);
    tree.pci_device("0000:84:00.0", &[b[0], b[1], "0000:82:01.0"], 1);
    let mut notes = Vec::new();
    let inventory = read_sriov(&tree.root(), &mut notes);
    assert!(notes.is_empty(), "{notes:?}");
    inventory
}

pub fn physnets() -> PhysnetConfig {
    PhysnetConfig::from_seed("fabric:ens1f0,fabric:ens2f0", "", "").unwrap()
}

/// GPU0 and NIC0 (ens1f0) under one switch, GPU1 and NIC1 (ens2f0) under the other, with the
/// VFs of physnet `fabric`.
pub fn topology(sriov: &SriovInventory) -> NodeTopology {
    let text = "\tGPU0\tGPU1\tNIC0\tNIC1\n\
                GPU0\t X \tSYS\tPIX\tSYS\n\
                GPU1\tSYS\t X \tSYS\tPIX\n\
                NIC0\tPIX\tSYS\t X \tSYS\n\
                NIC1\tSYS\tPIX\tSYS\t X \n";
    let mut node = weft_topology::parse_node(text, NODE).unwrap();
    node.nics[0].pci_bus_id = Some("0000:03:00.0".into());
    node.nics[1].pci_bus_id = Some("0000:83:00.0".into());
    let mut notes = Vec::new();
    let vfs = physnets().topology_vfs(&node, sriov, &mut notes);
    assert_eq!(vfs.len(), 8, "{notes:?}");
    node.set_vfs(vfs).unwrap();
    node
}

pub fn inventory(sriov: &SriovInventory) -> NicInventory {
    let mut notes = Vec::new();
    let assigned = physnets().assign(sriov, &mut notes);
    let inv = NicInventory::from_physnets(&assigned, &mut notes);
    assert!(notes.is_empty(), "{notes:?}");
    inv
}

/// A NicConfig for `network` over `range`.
pub fn nic_config(network: &str, range: &str, vlan: Option<u16>) -> Value {
    let mut v =
        json!({"apiVersion": "nic.weft.io/v1alpha1", "kind": "NicConfig", "network": network, "ipRange": range});
    if let Some(vlan) = vlan {
        v["vlan"] = json!(vlan);
    }
    v
}

/// A claim `name` (UID `claim-<name>`) allocated as the scheduler writes it: `device` of this
/// node's pool for request `nic`, the DeviceClass's `config` for this driver, reserved for pod
/// `pod` (UID `pod-<pod>`).
pub fn claim(name: &str, device: &str, config: Value, pod: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "uid": format!("claim-{name}")},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.weft.io"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "nic", "driver": DRIVER, "pool": NODE, "device": device}],
                    "config": [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": config}}]
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("pod-{pod}")}]
        }
    })
}

/// Pod `name` (UID `pod-<name>`) using claim `claim`, with weft's GPU decision `gpus` on this node
/// when given.
pub fn pod(name: &str, claim: &str, gpus: Option<&[usize]>) -> Pod {
    let mut annotations = BTreeMap::new();
    if let Some(gpus) = gpus {
        let d = GpuDecision {
            node: NODE.into(),
            gpus: gpus.to_vec(),
            vfs: BTreeMap::new(),
            decided_at: "2026-11-25T10:00:00Z".into(),
            by: "weft-extender".into(),
        };
        annotations.insert(weft_record::GPU_DECISION_ANNOTATION.to_string(), d.to_annotation());
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": format!("pod-{name}"), "annotations": annotations},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "udf", "image": "x", "resources": {"claims": [{"name": "nic"}]}}],
            "resourceClaims": [{"name": "nic", "resourceClaimName": claim}]
        }
    }))
    .unwrap()
}

/// The cluster, the node's hardware and the test kubelet; the driver comes and goes.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub api: FakeApiServer,
    pub sriov: SriovInventory,
    pub pf: Arc<FakePfControl>,
    pub kubelet: DraKubelet,
    pub driver: Option<Running>,
    /// Whether the driver allocates from a watch cache of the NetworkAddresses (as the agent
    /// runs it) or lists the network on every prepare.
    pub cached: bool,
}

/// One run of the driver.
pub struct Running {
    pub driver: Arc<NicDriver>,
    pub serving: Option<Serving>,
    pub stop: CancellationToken,
    pub cache: Option<tokio::task::JoinHandle<()>>,
}

impl Node {
    /// The cluster and node, with VF 0 of ens1f0 at VLAN 7 before anything (to see it restored),
    /// and the driver started and registered, allocating from a watch cache as the agent runs it.
    pub async fn start() -> Node {
        Self::start_with(true).await
    }

    /// [`Node::start`] with a driver that lists the network on every allocation.
    pub async fn start_listing() -> Node {
        Self::start_with(false).await
    }

    async fn start_with(cached: bool) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let sriov = sysfs(&dir.path().join("host"));
        let api = FakeApiServer::start().await;
        api.insert_typed(&NetworkAddress::crd()).unwrap();
        let pf = Arc::new(FakePfControl::new().with_state(
            "ens1f0",
            0,
            PfVfState { vlan: 7, qos: 0, proto: VlanProto::Dot1Q, admin_mac: None },
        ));
        let kubelet = DraKubelet::new(api.client());
        let mut node = Node { dir, api, sriov, pf, kubelet, driver: None, cached };
        node.start_driver().await;
        node
    }

    pub fn checkpoint_path(&self) -> PathBuf {
        self.dir.path().join("nic-dra-checkpoint.json")
    }

    pub fn options(&self) -> ServeOptions {
        ServeOptions {
            plugins_dir: self.dir.path().join("plugins"),
            registry_dir: self.dir.path().join("plugins_registry"),
        }
    }

    /// A fresh driver process: the checkpoint read from disk, the sockets served, registered with
    /// the kubelet.
    pub async fn start_driver(&mut self) {
        let checkpoint = Arc::new(Checkpoint::open(self.checkpoint_path()).unwrap());
        let vlan = Arc::new(PfVlan::new(self.pf.clone()).unwrap());
        let mut driver = NicDriver::new(
            NODE,
            self.api.client(),
            inventory(&self.sriov),
            Some(topology(&self.sriov)),
            vlan,
            checkpoint,
        );
        let mut cache = None;
        if self.cached {
            let (store, run) = weft_nic_dra::driver::address_cache(self.api.client());
            driver = driver.with_address_cache(store.clone());
            cache = Some(tokio::spawn(run));
            guard("the address cache", store.wait_until_ready()).await.unwrap();
        }
        let driver = Arc::new(driver);
        let stop = CancellationToken::new();
        let serving = weft_nic_dra::start(driver.clone(), &self.options(), stop.clone()).unwrap();
        let info = guard("registration", self.kubelet.register(serving.registration_socket())).await.unwrap();
        assert_eq!(info.name, DRIVER);
        let mut status = serving.registration();
        guard("the registration status", status.wait_for(|s| s.as_ref().is_some_and(|s| s.plugin_registered)))
            .await
            .unwrap();
        self.driver = Some(Running { driver, serving: Some(serving), stop, cache });
    }

    /// Stops the driver as a crash or a restart does (the sockets go, the checkpoint stays).
    pub async fn stop_driver(&mut self) {
        let mut run = self.driver.take().expect("a running driver");
        run.stop.cancel();
        guard("the driver to stop", run.serving.take().unwrap().wait()).await.unwrap();
        if let Some(cache) = run.cache.take() {
            cache.abort();
        }
        self.kubelet.deregister(DRIVER);
    }

    pub fn driver(&self) -> &Arc<NicDriver> {
        &self.driver.as_ref().expect("a running driver").driver
    }

    /// Stores a claim and its pod in the API server as the scheduler leaves them.
    pub fn add(&self, claim: Value, pod: &Pod) {
        self.api.insert(claim).unwrap();
        self.api.insert_typed(pod).unwrap();
    }

    /// The NetworkAddress objects, by name.
    pub fn addresses(&self) -> BTreeMap<String, Value> {
        self.api
            .list("networkaddresses.weft.io", None)
            .into_iter()
            .map(|o| (o["metadata"]["name"].as_str().unwrap().to_string(), o))
            .collect()
    }
}
