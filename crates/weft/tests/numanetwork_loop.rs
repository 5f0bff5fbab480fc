//! The whole loop of a NumaNetwork (issue #15), in one process, each piece real and talking to the
//! next through the API server, the kubelet's sockets, the kernel or etcd:
//!
//! NumaNetwork `fast` → the NumaNetwork controller → a Numaflow Pipeline in the seed's shape
//! admitted through weft's Pipeline webhook → the controller's ResourceClaimTemplate `fast-rct` →
//! one vertex pod built as Numaflow builds it → its ResourceClaim (this test plays the
//! resource-claim controller and kube-scheduler) → weft's NIC DRA driver prepares it over the
//! kubelet's gRPC (the test kubelet), allocating an address from the network's range → the NRI
//! hooks move the VF into the pod's network namespace and write `networkData` on the claim → the
//! pod turns Ready → the DNS registrar puts the vertex domain's record in etcd → the pod is
//! deleted: the record goes, the VF comes back to the host, the address is released.
//!
//! Real: the fake API server over HTTP (kube clients, watches, server-side apply), the NumaNetwork
//! controller and the DNS registrar on weft's controller skeleton, the webhook's decision on an
//! AdmissionReview and the JSON Patch it answers, the driver's DRA and registration gRPC on unix
//! sockets, the NRI protocol (weft's plugin runtime against the containerd-like harness), a
//! network namespace and a veth standing in for the VF (no machine here has SR-IOV; a fake sysfs
//! names the veth as the VF), an `etcd` process. Fake: the PF's VLAN calls (`FakePfControl`).
//!
//! Needs root and iproute2 (the namespace) and `/usr/bin/etcd` (Debian `etcd-server`); without
//! them the test skips through `weft_testkit::require` (a failure under `WEFT_TEST_REQUIRE_ALL=1`). Every wait is on a condition (the fake API server's change notifications, NRI harness
//! events, etcd state polled) under a hang guard; nothing asserts on time. Namespaces, links, the
//! etcd process and temporary files are removed by guards, pass or fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// A real etcd on loopback and a lookup that reads it as CoreDNS's etcd plugin does.
#[path = "../../weft-dns/tests/support/mod.rs"]
mod dns_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use weft_admission::webhook::{
    AdmissionPath, InMemoryJobs, KubeNumaNetworks, NetworkOptions, WebhookState, WiringOptions, typed_validator,
};
use weft_cni::net::{Link, Netns};
use weft_cni::pf::{FakePfControl, PfVfState};
use weft_crds::{NumaNetwork, numanetwork_controller};
use weft_dns::record::Prefix;
use weft_dns::{DnsSettings, EtcdStore, RecordStore};
use weft_fakeapi::{FakeApiServer, ResourceSpec};
use weft_jobs::admission::AdmissionOptions;
use weft_kube::controller::{Context, ControllerMetrics};
use weft_kubelet_harness::dra::DraKubelet;
use weft_net::config::PhysnetConfig;
use weft_net::nic_claim::{DRIVER, device_name};
use weft_nic_dra::attach::{AttachConfig, NicAttacher, PLUGIN_INDEX, PLUGIN_NAME};
use weft_nic_dra::status::KubeClaimStatus;
use weft_nic_dra::{Checkpoint, NicDriver, NicInventory, PfVlan, ServeOptions, Serving};
use weft_nri::api;
use weft_nri::plugin::{self as nri_plugin, PluginOptions, RuntimeHandle, SocketSource};
use weft_nri_harness::{Runtime, RuntimeOptions};
use weft_pipeline::{VERTEX_DOMAIN_ENV, VERTEX_DOMAIN_TARGETS_ENV, VERTEX_DOMAINS_ANNOTATION, VertexDomainEntry};
use weft_testkit::controller::{fast_settings, guard};
use weft_testkit::netns::{NetnsGuard, VethGuard, have, ip, is_root, unique};
use weft_testkit::numaflow;
use weft_testkit::{require, require_ok};
use weft_topology::discover::{FakeSriovTree, read_sriov};

/// The pipeline's namespace.
const NS: &str = "media";
/// The node the pod runs on (and the driver's pool).
const NODE: &str = "node-1";
/// The NumaNetwork.
const NETWORK: &str = "fast";
/// Its ResourceClaimTemplate and the pods' claim entry.
const RCT: &str = "fast-rct";
/// Its range: a /29 has six usable addresses, .1 to .6.
const RANGE: &str = "192.168.77.0/29";
/// Its VLAN.
const VLAN: u16 = 100;
/// The DeviceClass of weft's NIC driver (deploy/components/nic-dra/deviceclass.yaml).
const DEVICE_CLASS: &str = "nic.weft.io";
/// The physnet the VFs belong to on the node.
const PHYSNET: &str = "fabric";
/// The vertex whose pod the test runs: the receiving end of the pipeline's direct edge.
const VERTEX: &str = "inference";
/// The annotation the resource-claim controller puts on a claim it makes for a pod's claim entry.
const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// A network namespace for the pod, or why none can be made here.
fn pod_netns() -> Result<NetnsGuard, String> {
    let name = unique("wln");
    let out = ip(&["netns", "add", &name]);
    if out.status.success() {
        Ok(NetnsGuard { name })
    } else {
        Err(format!("`ip netns add` failed: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn example(name: &str) -> Value {
    let path = format!("{}/../../deploy/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The seed's video pipeline (deploy/examples/numaflow/video-pipeline-field.yaml, the binding in the
/// edges: in → filter-resize →
/// inference → out, filter-resize → inference direct and inference → out through the ISB) on
/// NumaNetwork `fast`. The GPU claims are taken out: this loop is the NIC's, and no GPU driver
/// runs here to prepare them.
fn video_pipeline() -> Value {
    let mut p = example("numaflow/video-pipeline-field.yaml");
    p["metadata"]["namespace"] = json!(NS);
    for v in p["spec"]["vertices"].as_array_mut().unwrap() {
        let v = v.as_object_mut().unwrap();
        v.remove("resourceClaims");
        if let Some(c) = v.get_mut("udf").and_then(|u| u.get_mut("container")).and_then(Value::as_object_mut) {
            c.remove("resources");
        }
    }
    for e in p["spec"]["edges"].as_array_mut().unwrap() {
        if e.get("numaNetwork").is_some() {
            e["numaNetwork"]["name"] = json!(NETWORK);
        }
    }
    p
}

/// An AdmissionReview of a Pipeline CREATE in [`NS`], as the API server sends it.
fn pipeline_review(object: &Value) -> Vec<u8> {
    let gvk = json!({"group": "numaflow.numaproj.io", "version": "v1alpha1", "kind": "Pipeline"});
    let gvr = json!({"group": "numaflow.numaproj.io", "version": "v1alpha1", "resource": "pipelines"});
    serde_json::to_vec(&json!({
        "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "loop-pipeline-video", "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": object["metadata"]["name"], "namespace": NS, "operation": "CREATE",
            "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
            "object": object, "oldObject": null, "dryRun": false
        }
    }))
    .unwrap()
}

/// What the API server does with a Pipeline CREATE: the mutating webhook's JSON Patch applied,
/// then the validating webhook asked.
async fn admit(webhook: &WebhookState, pipeline: &Value) -> Value {
    let answer = webhook.review(AdmissionPath::PipelinesMutate, &pipeline_review(pipeline)).await.unwrap();
    let answer = serde_json::to_value(answer).unwrap();
    let response = &answer["response"];
    assert_eq!(response["allowed"], true, "{answer}");
    assert_eq!(response["patchType"], "JSONPatch", "{answer}");
    let text = base64::engine::general_purpose::STANDARD.decode(response["patch"].as_str().unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&text).unwrap();
    let mut mutated = pipeline.clone();
    json_patch::patch(&mut mutated, &patch).expect("the patch applies to the pipeline it was made for");
    let answer = webhook.review(AdmissionPath::PipelinesValidate, &pipeline_review(&mutated)).await.unwrap();
    assert!(answer.response.allowed, "{answer:?}");
    mutated
}

fn env_value(container: &Value, name: &str) -> Option<String> {
    container["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"].as_str().map(str::to_owned)
}

/// The user container (a native sidecar in Numaflow's pods) of a vertex pod.
fn udf(pod: &Value) -> Value {
    pod["spec"]["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "udf").cloned().expect("udf")
}

fn domain(vertex: &str) -> String {
    format!("{vertex}.{NETWORK}.video.{NS}.vertexdomain.local")
}

/// The pod's sandbox as the runtime hands it to NRI plugins, in the namespace at `netns`.
fn sandbox(pod: &Pod, netns: &str) -> api::PodSandbox {
    let mut p = api::PodSandbox::new();
    p.uid = pod.uid().unwrap();
    p.id = format!("sb-{}", p.uid);
    p.name = pod.name_any();
    p.namespace = NS.to_string();
    let mut linux = api::LinuxPodSandbox::new();
    let mut n = api::LinuxNamespace::new();
    n.type_ = "network".into();
    n.path = netns.to_string();
    linux.namespaces.push(n);
    p.linux = Some(linux).into();
    p
}

/// Link `name` in the namespace at `netns` (the host's with `None`).
async fn link_in(netns: Option<&Path>, name: &str) -> Option<Link> {
    let ns = match netns {
        Some(p) => Netns::open(p).unwrap(),
        None => Netns::current().unwrap(),
    };
    ns.links().unwrap().get(name).await.unwrap()
}

/// The addresses of link `name` in the namespace at `netns`, as text.
async fn addresses_in(netns: &Path, name: &str) -> Vec<String> {
    let links = Netns::open(netns).unwrap().links().unwrap();
    let l = links.get(name).await.unwrap().expect("the link exists");
    links.addresses(l.index).await.unwrap().iter().map(ToString::to_string).collect()
}

fn ready(v: &Value) -> Option<(String, String)> {
    let c = v["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?;
    Some((c["status"].as_str()?.to_owned(), c["reason"].as_str()?.to_owned()))
}

/// A background piece of the cluster: stopped in order at the end, aborted if the test fails.
struct Task {
    what: &'static str,
    stop: CancellationToken,
    handle: Option<JoinHandle<()>>,
}

impl Task {
    fn spawn(what: &'static str, f: impl FnOnce(CancellationToken) -> JoinHandle<()>) -> Task {
        let stop = CancellationToken::new();
        Task { what, handle: Some(f(stop.clone())), stop }
    }

    async fn stop(mut self) {
        self.stop.cancel();
        guard(self.what, self.handle.take().unwrap()).await.unwrap();
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.stop.cancel();
            h.abort();
        }
    }
}

fn context(api: &FakeApiServer) -> Context {
    Context::new(
        api.client(),
        "weft-controller",
        Some("loop-0".into()),
        "weft-controller",
        ControllerMetrics::default(),
    )
}

/// The node: a fake sysfs in which veth host ends are the VFs of PF `wlpf0` (physnet
/// [`PHYSNET`]); PCI addresses unique to this process (the VF's temporary name while it moves
/// comes from its PCI address, and test processes share the host's namespace).
struct Node {
    dir: tempfile::TempDir,
    /// (PCI address, the veth playing the VF).
    vfs: Vec<(String, VethGuard)>,
}

impl Node {
    fn new(n: u32) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let tree = FakeSriovTree::new(&dir.path().join("sysfs"));
        let domain = std::process::id() % 0xffff;
        let pf_pci = format!("{domain:04x}:7a:00.0");
        tree.pf(&pf_pci, &[&format!("{domain:04x}:00:03.0")], "wlpf0", 0).link("wlpf0", "up", 100_000);
        let vfs = (0..n)
            .map(|i| {
                let veth = VethGuard::new("wlv");
                let pci = format!("{domain:04x}:7a:00.{}", i + 2);
                tree.vf(&pf_pci, i, &pci, Some(&veth.name));
                (pci, veth)
            })
            .collect();
        Node { dir, vfs }
    }

    fn sysfs(&self) -> PathBuf {
        self.dir.path().join("sysfs")
    }

    fn inventory(&self) -> NicInventory {
        let mut notes = Vec::new();
        let sriov = read_sriov(&FakeSriovTree::new(&self.sysfs()).root(), &mut notes);
        let physnets = PhysnetConfig::from_seed(&format!("{PHYSNET}:wlpf0"), "", "").unwrap();
        let inventory = NicInventory::from_physnets(&physnets.assign(&sriov, &mut notes), &mut notes);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(inventory.len(), self.vfs.len());
        inventory
    }
}

/// weft's NIC DRA driver as `weft agent --nic-dra` wires it: the VFs published as ResourceSlices,
/// addresses from a watch cache, the DRA and registration sockets served, and the NRI hooks
/// reading the driver's checkpoint.
struct Agent {
    driver: Arc<NicDriver>,
    pf: Arc<FakePfControl>,
    serving: Option<Serving>,
    serve_stop: CancellationToken,
    slices: Task,
    cache: Task,
    nri: Task,
}

impl Agent {
    async fn start(
        api: &FakeApiServer,
        node: &Node,
        kubelet: &DraKubelet,
        runtime: &Runtime,
        nri_socket: &Path,
    ) -> Agent {
        let client = api.client();
        let pf = Arc::new(FakePfControl::new());
        // As the agent does: the checkpoint's directory is made first.
        std::fs::create_dir_all(node.dir.path().join("state")).unwrap();
        let checkpoint = Arc::new(Checkpoint::open(node.dir.path().join("state/nic-dra.json")).unwrap());
        let inventory = node.inventory();
        let devices = inventory.api_devices();
        let (addresses, watch) = weft_nic_dra::driver::address_cache(client.clone());
        let vlan = Arc::new(PfVlan::new(pf.clone()).unwrap());
        let driver = Arc::new(
            NicDriver::new(NODE, client.clone(), inventory, None, vlan, checkpoint).with_address_cache(addresses),
        );
        let cache = Task::spawn("the address cache", |stop| {
            tokio::spawn(async move {
                tokio::select! {
                    () = watch => {}
                    () = stop.cancelled() => {}
                }
            })
        });
        let slices = Task::spawn("the ResourceSlice publisher", |stop| {
            let client = client.clone();
            tokio::spawn(weft_nic_dra::slices::keep_published(client, NODE.into(), devices, stop))
        });
        // The NRI half: its own plugin (weft-nic, index 20) on the runtime's socket.
        let attacher = Arc::new(NicAttacher::new(
            driver.pod_nics(),
            Arc::new(KubeClaimStatus::new(client.clone())),
            AttachConfig {
                state_dir: node.dir.path().join("state/attached"),
                sysfs_root: node.sysfs(),
                status_retry_min: Duration::from_millis(5),
                status_retry_max: Duration::from_millis(50),
            },
        ));
        let nri = Task::spawn("the NIC NRI plugin", |stop| {
            let mut opts = PluginOptions::new(PLUGIN_NAME, PLUGIN_INDEX);
            opts.socket = SocketSource::Path(nri_socket.to_path_buf());
            opts.backoff_min = Duration::from_millis(10);
            opts.backoff_max = Duration::from_millis(50);
            tokio::spawn(async move {
                nri_plugin::run(opts, attacher, RuntimeHandle::new(), stop).await.expect("the NRI plugin");
            })
        });
        guard("the NRI plugin to synchronize", runtime.wait_synchronized(&format!("{PLUGIN_INDEX}-{PLUGIN_NAME}")))
            .await;
        let options = ServeOptions {
            plugins_dir: node.dir.path().join("plugins"),
            registry_dir: node.dir.path().join("plugins_registry"),
        };
        let serve_stop = CancellationToken::new();
        let serving = weft_nic_dra::start(driver.clone(), &options, serve_stop.clone()).unwrap();
        let info = guard("registration", kubelet.register(serving.registration_socket())).await.unwrap();
        assert_eq!(info.name, DRIVER);
        let mut status = serving.registration();
        guard("the registration status", status.wait_for(|s| s.as_ref().is_some_and(|s| s.plugin_registered)))
            .await
            .unwrap();
        Agent { driver, pf, serving: Some(serving), serve_stop, slices, cache, nri }
    }

    async fn stop(mut self) {
        self.serve_stop.cancel();
        guard("the driver's sockets to close", self.serving.take().unwrap().wait()).await.unwrap();
        self.nri.stop().await;
        self.slices.stop().await;
        self.cache.stop().await;
    }
}

/// The resource-claim controller's part for the pod's claim entry `entry` (a template): the
/// ResourceClaim made from the template (generateName `<pod>-<entry>-`, owned by the pod, the
/// template's labels, `resource.kubernetes.io/pod-claim-name`), then its name in the pod's
/// `status.resourceClaimStatuses`.
async fn create_claim(client: &kube::Client, pod: &Pod, entry: &str) -> ResourceClaim {
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    let template = templates.get(entry).await.unwrap();
    let meta = template.spec.metadata.clone().unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(POD_CLAIM_NAME_ANNOTATION.into(), entry.into());
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "generateName": format!("{}-{entry}-", pod.name_any()), "namespace": NS,
            "labels": meta.labels.unwrap_or_default(), "annotations": annotations,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid().unwrap(),
                                 "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": template.spec.spec,
    });
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let claim = claims.create(&PostParams::default(), &serde_json::from_value(claim).unwrap()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let status = json!({"status": {"resourceClaimStatuses": [{"name": entry, "resourceClaimName": claim.name_any()}]}});
    pods.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    claim
}

/// kube-scheduler's part: a device of the class's driver from the node's ResourceSlice, the
/// allocation written as the DRA allocator writes it (results; the claim's own config as
/// `FromClaim`, after the class's, which has none; the node selector), the claim reserved for the
/// pod, and the pod bound to the node. Returns the device's name.
async fn schedule(client: &kube::Client, pod: &Pod, claim: &ResourceClaim) -> String {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slice = slices
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(NODE))
        .expect("the node's slice of nic.weft.io");
    assert_eq!(slice.spec.pool.name, NODE);
    let device = slice.spec.devices.as_deref().unwrap()[0].name.clone();
    let spec = serde_json::to_value(&claim.spec).unwrap();
    let request = spec["devices"]["requests"][0]["name"].as_str().unwrap().to_owned();
    let config: Vec<Value> = spec["devices"]["config"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json!({"source": "FromClaim", "requests": c["requests"], "opaque": c["opaque"]}))
        .collect();
    let status = json!({"status": {
        "allocation": {
            "devices": {"results": [{"request": request, "driver": DRIVER, "pool": NODE, "device": device}], "config": config},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
        },
        "reservedFor": [{"resource": "pods", "name": pod.name_any(), "uid": pod.uid().unwrap()}]
    }});
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    claims.patch_status(&claim.name_any(), &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": pod.name_any(), "namespace": NS, "uid": pod.uid().unwrap()},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}});
    let _: Value = pods.create_subresource("binding", &pod.name_any(), &PostParams::default(), &binding).await.unwrap();
    device
}

/// The addresses CoreDNS would answer for `domain`, read from etcd as its etcd plugin reads them.
async fn answers(store: &EtcdStore, domain: &str) -> Vec<String> {
    dns_support::coredns_lookup(store, "/skydns", domain).await.unwrap().into_iter().map(|a| a.ip.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_numanetwork_vertex_gets_a_nic_an_address_and_a_dns_record_and_gives_them_back() {
    let started = Instant::now();
    if !require(is_root(), "root, to make a network namespace and veth pairs")
        || !require(have("ip"), "iproute2's ip")
        || !require(
            Path::new(dns_support::ETCD_BIN).exists(),
            "/usr/bin/etcd (Debian etcd-server; scripts/test-all.sh installs it)",
        )
    {
        return;
    }
    let Some(netns) = require_ok(pod_netns()) else { return };
    let netns_path = PathBuf::from(netns.path());
    let etcd = dns_support::Etcd::start().await.expect("etcd is installed");
    let store = etcd.store();

    // ----- 1. The cluster: weft's CRDs, Numaflow's, the NIC driver's DeviceClass. -----
    let api = FakeApiServer::start().await;
    let client = api.client();
    let crds: Api<weft_crds::CustomResourceDefinition> = Api::all(client.clone());
    for crd in weft_crds::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    api.register(ResourceSpec::namespaced("numaflow.numaproj.io", "v1alpha1", "pipelines", "Pipeline").with_status());
    api.register(ResourceSpec::namespaced("numaflow.numaproj.io", "v1alpha1", "vertices", "Vertex").with_status());
    api.insert(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}
    }))
    .unwrap();

    // ----- 2. The NumaNetwork controller, and NumaNetwork `fast`. -----
    let controller = Task::spawn("the NumaNetwork controller", |stop| {
        let ctx = context(&api);
        tokio::spawn(numanetwork_controller::run(ctx, fast_settings(numanetwork_controller::NAME), async move {
            stop.cancelled().await
        }))
    });
    let nets: Api<NumaNetwork> = Api::all(client.clone());
    let fast: NumaNetwork = serde_json::from_value(json!({
        "apiVersion": "numaflow.numaproj.io/v1alpha1", "kind": "NumaNetwork", "metadata": {"name": NETWORK},
        "spec": {"refDeviceClass": {"name": DEVICE_CLASS},
                 "refResourceClaimDranet": {"ipRange": RANGE, "ethernetSpeed": 100, "vlanTag": VLAN}}
    }))
    .unwrap();
    nets.create(&PostParams::default(), &fast).await.unwrap();
    let v = guard(
        "NumaNetwork fast accepted and ready",
        api.wait_for_object("numanetworks", None, NETWORK, |v| ready(v).is_some_and(|(s, _)| s == "True")),
    )
    .await;
    assert_eq!(ready(&v), Some(("True".into(), "TemplatesReady".into())), "no pipeline uses it yet: {v}");
    assert!(v["status"].get("namespaces").is_none(), "in no namespace yet: {v}");
    assert_eq!(v["status"]["addresses"], json!({"allocated": 0, "size": 6, "usage": "0/6"}));

    // ----- 3. The Pipeline, admitted through weft's webhook, stored; the template follows. -----
    let networks = Arc::new(KubeNumaNetworks::spawn(client.clone()));
    let rules = typed_validator(|n: &NumaNetwork, old: Option<&NumaNetwork>| {
        let checked = match old {
            None => n.validate(),
            Some(old) => n.validate_update(old),
        };
        checked.err().map(|e| e.errors().iter().map(ToString::to_string).collect()).unwrap_or_default()
    });
    let opts = NetworkOptions { wiring: WiringOptions::default(), max_numa_networks: 0, validator: Some(rules) };
    let webhook = WebhookState::new(Arc::new(InMemoryJobs::new()), AdmissionOptions::default())
        .with_numa_networks(networks.clone(), opts);
    guard("the webhook's NumaNetwork cache", networks.wait_until_synced()).await;
    let admitted = admit(&webhook, &video_pipeline()).await;
    let inference = admitted["spec"]["vertices"].as_array().unwrap().iter().find(|v| v["name"] == VERTEX).unwrap();
    assert_eq!(inference["resourceClaims"], json!([{"name": RCT, "resourceClaimTemplateName": RCT}]));
    let pipelines: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &numaflow::pipelines());
    let stored = pipelines.create(&PostParams::default(), &serde_json::from_value(admitted).unwrap()).await.unwrap();

    let template =
        guard("fast-rct in media", api.wait_for_object("resourceclaimtemplates", Some(NS), RCT, |_| true)).await;
    let devices = &template["spec"]["spec"]["devices"];
    assert_eq!(devices["requests"][0]["name"], "nic");
    assert_eq!(devices["requests"][0]["exactly"]["deviceClassName"], DEVICE_CLASS);
    assert_eq!(devices["requests"][0]["exactly"]["count"], 1);
    assert_eq!(
        devices["config"],
        json!([{"requests": ["nic"], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "nic.weft.io/v1alpha1", "kind": "NicConfig", "network": NETWORK, "ipRange": RANGE, "vlan": VLAN
        }}}]),
        "weft's NicConfig, since the DeviceClass's driver is nic.weft.io"
    );
    assert_eq!(template["metadata"]["labels"]["weft.io/numa-network"], NETWORK);
    assert_eq!(template["spec"]["metadata"]["labels"]["weft.io/numa-network"], NETWORK);
    let nn_uid = api.get("numanetworks", None, NETWORK).unwrap()["metadata"]["uid"].clone();
    assert_eq!(template["metadata"]["ownerReferences"][0]["uid"], nn_uid);
    guard(
        "fast to list media",
        api.wait_for_object("numanetworks", None, NETWORK, |v| v["status"]["namespaces"] == json!([NS])),
    )
    .await;

    // ----- 4. Numaflow's vertices and the inference pod; its claim, allocated and bound. -----
    let stored = serde_json::to_value(&stored).unwrap();
    let vertices: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &numaflow::vertices());
    let mut vertex_pods = std::collections::BTreeMap::new();
    for v in numaflow::build_vertices(&stored) {
        let v = serde_json::to_value(
            vertices.create(&PostParams::default(), &serde_json::from_value(v).unwrap()).await.unwrap(),
        )
        .unwrap();
        vertex_pods.insert(v["spec"]["name"].as_str().unwrap().to_owned(), numaflow::build_pod(&v, 0));
    }
    // What filter-resize is told to send to: inference's domain, the record this loop makes.
    let filter = &vertex_pods["filter-resize"];
    assert_eq!(env_value(&udf(filter), VERTEX_DOMAIN_TARGETS_ENV), Some(domain(VERTEX)));
    let built = &vertex_pods[VERTEX];
    assert_eq!(env_value(&udf(built), VERTEX_DOMAIN_ENV), Some(domain(VERTEX)));
    assert_eq!(udf(built)["resources"]["claims"], json!([{"name": RCT}]));
    let entries: Vec<VertexDomainEntry> =
        serde_json::from_str(built["metadata"]["annotations"][VERTEX_DOMAINS_ANNOTATION].as_str().unwrap()).unwrap();
    assert_eq!(entries, [VertexDomainEntry { network: NETWORK.into(), domain: domain(VERTEX), claim: RCT.into() }]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = pods.create(&PostParams::default(), &serde_json::from_value(built.clone()).unwrap()).await.unwrap();
    let pod_name = pod.name_any();

    // The DNS registrar runs from here on, as `weft controller` does; the pod is not Ready yet.
    let registrar =
        Task::spawn("the DNS registrar", |stop| {
            let ctx = context(&api);
            let dns = DnsSettings {
                endpoints: vec![etcd.endpoint.clone()],
                claim_requeue: Duration::from_millis(50),
                ..DnsSettings::default()
            };
            let store = etcd.store();
            tokio::spawn(async move {
                weft_dns::run_with_store(store, ctx, fast_settings(weft_dns::NAME), dns, async move {
                    stop.cancelled().await
                })
                .await
                .expect("valid DNS settings");
            })
        });

    let claim = create_claim(&client, &pod, RCT).await;
    let claim_name = claim.name_any();
    let claim_uid = claim.uid().unwrap();
    assert!(claim_name.starts_with(&format!("{pod_name}-{RCT}-")), "{claim_name}");
    assert_eq!(claim.labels().get("weft.io/numa-network").map(String::as_str), Some(NETWORK));

    // The node and weft's agent on it, with the test kubelet and the NRI runtime.
    let node = Node::new(2);
    let kubelet = DraKubelet::new(client.clone());
    let nri_socket = node.dir.path().join("nri.sock");
    let runtime = Runtime::start(&nri_socket, RuntimeOptions::default()).await.unwrap();
    let agent = Agent::start(&api, &node, &kubelet, &runtime, &nri_socket).await;
    guard("the node's ResourceSlice", api.wait_for(|a| !a.list("resourceslices", None).is_empty())).await;

    let device = schedule(&client, &pod, &claim).await;
    let (vf_pci, vf) = (&node.vfs[0].0, node.vfs[0].1.name.clone());
    assert_eq!(device, device_name(vf_pci), "the slice's first device is the first VF");
    let pod = pods.get(&pod_name).await.unwrap();
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.clone()).unwrap();
    assert_eq!(statuses[0].resource_claim_name.as_deref(), Some(claim_name.as_str()));

    // ----- 5. The kubelet prepares the claim: an address from the /29, the checkpoint, the VLAN. -----
    guard("NodePrepareResources", kubelet.prepare(&pod)).await.unwrap();
    let prepared = kubelet.claim(NS, &claim_name).expect("in the kubelet's claim cache");
    assert!(prepared.prepared);
    assert_eq!(prepared.devices[DRIVER].len(), 1);
    assert_eq!(prepared.devices[DRIVER][0].device_name, device);
    assert_eq!(prepared.devices[DRIVER][0].pool_name, NODE);
    let addresses = api.list("networkaddresses", None);
    assert_eq!(addresses.len(), 1, "{addresses:?}");
    let address = &addresses[0];
    assert_eq!(address["metadata"]["name"], "fast.192-168-77-1", "the lowest free address of the range");
    assert_eq!(address["spec"]["network"], NETWORK);
    assert_eq!(address["spec"]["address"], "192.168.77.1");
    assert_eq!(address["spec"]["node"], NODE);
    assert_eq!(address["spec"]["claim"]["name"], claim_name);
    assert_eq!(address["spec"]["claim"]["uid"], claim_uid);
    let entry = agent.driver.checkpoint().get(&claim_uid).expect("the checkpoint holds the claim");
    assert_eq!(entry.claim.name, claim_name);
    assert_eq!(entry.nics.len(), 1);
    let nic = &entry.nics[0].nic;
    assert_eq!(
        (nic.device.as_str(), nic.vf_pci.as_str(), nic.network.as_str()),
        (device.as_str(), vf_pci.as_str(), NETWORK)
    );
    assert_eq!(nic.address.to_string(), "192.168.77.1/29");
    assert_eq!(nic.vlan, Some(VLAN));
    assert_eq!(nic.pod_uids, [pod.uid().unwrap()]);
    assert_eq!(agent.pf.current("wlpf0", 0), PfVfState { vlan: VLAN, ..PfVfState::default() }, "the VLAN on the VF");
    assert_eq!(agent.pf.current("wlpf0", 1), PfVfState::default(), "the other VF is untouched");
    guard(
        "fast to count the address",
        api.wait_for_object("numanetworks", None, NETWORK, |v| v["status"]["addresses"]["usage"] == "1/6"),
    )
    .await;

    // ----- 6. RunPodSandbox: the VF into the pod with its address; networkData on the claim. -----
    let before = link_in(None, &vf).await.expect("the VF is in the host");
    let mac = before.mac.as_ref().expect("a veth has a MAC").to_string();
    let sb = sandbox(&pod, &netns.path());
    guard("RunPodSandbox", runtime.run_pod_sandbox(sb.clone())).await.unwrap();
    let inside = link_in(Some(netns_path.as_path()), "net1").await.expect("net1 in the pod");
    assert!(inside.up);
    assert_eq!(inside.mac.as_ref().map(ToString::to_string), Some(mac.clone()), "the VF keeps its MAC");
    assert_eq!(addresses_in(&netns_path, "net1").await, ["192.168.77.1/29"]);
    assert!(link_in(None, &vf).await.is_none(), "the VF left the host");
    let claim_now = guard(
        "networkData on the claim",
        api.wait_for_object("resourceclaims", Some(NS), &claim_name, |c| c["status"]["devices"].is_array()),
    )
    .await;
    let written = &claim_now["status"]["devices"][0];
    assert_eq!((written["driver"].as_str(), written["pool"].as_str()), (Some(DRIVER), Some(NODE)));
    assert_eq!(written["device"], device);
    assert_eq!(
        written["networkData"],
        json!({"interfaceName": "net1", "ips": ["192.168.77.1/29"], "hardwareAddress": mac})
    );
    assert!(claim_now["status"]["allocation"].is_object(), "the status apply keeps the allocation");
    let managers: Vec<(&str, &str, &str)> = claim_now["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let field = |k: &str| m[k].as_str().unwrap_or_default();
            (field("manager"), field("operation"), field("subresource"))
        })
        .collect();
    assert!(managers.contains(&("nic.weft.io", "Apply", "status")), "a server-side apply by the driver: {managers:?}");

    // ----- 7. Ready: the registrar puts the vertex domain's record, as CoreDNS reads it. -----
    let ready_status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(ready_status)).await.unwrap();
    let name = domain(VERTEX);
    dns_support::until("the vertex's DNS record", || async { !answers(&store, &name).await.is_empty() }).await;
    let key = format!("/skydns/local/vertexdomain/{NS}/video/{NETWORK}/{VERTEX}/{pod_name}");
    assert_eq!(key, Prefix::new("/skydns").unwrap().record_key(&name, &pod_name));
    let found = dns_support::coredns_lookup(&store, "/skydns", &name).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].key, key, "under the reversed domain labels, one key per pod");
    assert_eq!(found[0].ip.to_string(), "192.168.77.1", "the address of the claim's networkData");
    assert_ne!(found[0].lease, 0, "on the registrar's lease");
    let record: Value = serde_json::from_slice(&store.get(&key).await.unwrap().unwrap().value).unwrap();
    assert_eq!(record["host"], "192.168.77.1");
    assert_eq!(record["ttl"], 10);
    let has_finalizer =
        |v: &Value| v["metadata"]["finalizers"].as_array().is_some_and(|f| f.iter().any(|x| x == weft_dns::FINALIZER));
    assert!(has_finalizer(&api.get("pods", Some(NS), &pod_name).unwrap()));

    // ----- Teardown as the cluster does it: the pod deleted; the runtime stops its sandbox; the
    // kubelet unprepares the claim; the registrar's cleanup lets the pod go; the claim goes. -----
    let deleting = pods.delete(&pod_name, &DeleteParams::default()).await.unwrap();
    let deleting = deleting.left().expect("the finalizer keeps the pod");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    guard("StopPodSandbox", runtime.stop_pod_sandbox(&sb.id)).await.unwrap();
    guard("RemovePodSandbox", runtime.remove_pod_sandbox(&sb.id)).await.unwrap();
    let back = link_in(None, &vf).await.expect("the VF is back in the host under its name");
    assert_eq!((back.mac.as_ref().map(ToString::to_string), back.mtu, back.up), (Some(mac), before.mtu, before.up));
    assert!(link_in(Some(netns_path.as_path()), "net1").await.is_none());
    guard("NodeUnprepareResources", kubelet.unprepare(&pod)).await.unwrap();
    assert!(api.list("networkaddresses", None).is_empty(), "the address is released");
    assert!(agent.driver.checkpoint().get(&claim_uid).is_none(), "the checkpoint no longer holds the claim");
    assert_eq!(agent.pf.current("wlpf0", 0), PfVfState::default(), "the VF's original VLAN is back");
    assert!(kubelet.claim(NS, &claim_name).is_none());
    guard("the pod to go", api.wait_for(|a| a.get("pods", Some(NS), &pod_name).is_none())).await;
    // The finalizer held the pod until the record was gone.
    assert!(store.get(&key).await.unwrap().is_none(), "the record is gone");
    assert!(answers(&store, &name).await.is_empty());
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    claims.delete(&claim_name, &DeleteParams::default()).await.unwrap();
    guard(
        "fast to count no address",
        api.wait_for_object("numanetworks", None, NETWORK, |v| v["status"]["addresses"]["usage"] == "0/6"),
    )
    .await;

    agent.stop().await;
    registrar.stop().await;
    controller.stop().await;
    eprintln!("the NumaNetwork loop ran in {:?}", started.elapsed());
}
