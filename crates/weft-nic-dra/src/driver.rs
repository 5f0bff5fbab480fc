//! NodePrepareResources and NodeUnprepareResources: what the driver does for each claim.
//!
//! **Prepare** (per claim, one at a time on the node):
//! 1. A claim already in the checkpoint is answered from it (the kubelet prepares again after a
//!    restart, or when it crashed before recording the answer): its VLANs are set again if they
//!    drifted, and nothing is allocated twice.
//! 2. Otherwise the ResourceClaim is read from the API server (`namespace/name`) and its UID
//!    checked against the kubelet's; each allocated device of this driver in this node's pool is
//!    mapped to its VF, and the opaque [`NicConfig`](weft_net::nic_claim::NicConfig) that applies
//!    to its request is parsed ([`crate::claim::plan`]).
//! 3. When the node's topology is known and the pod has weft's GPU decision for this node, the
//!    VF's nearness to those GPUs is judged ([`crate::align`]): logged, and recorded as `aligned`.
//!    The scheduler's VF is always the one prepared.
//! 4. The VF's PF-side VLAN settings are read (to restore them later), the address is allocated
//!    cluster-wide (`NetworkAddress`, idempotent per claim and request; from a watch cache of the
//!    objects when the driver has one, [`address_cache`]), and the claim is written to
//!    the checkpoint; only then is the VLAN set on the VF through its PF. A crash before the
//!    checkpoint write leaves an address the retry finds again; a crash after it leaves a claim the
//!    retry answers from the checkpoint (setting the VLAN again).
//! 5. The answer: one device per allocated VF (`request_names`, pool, device; no CDI devices: the
//!    NRI half moves the VF into the pod).
//!
//! **Unprepare**: the original VLAN is restored (a VF or PF that is gone is noted, not an error),
//! every address the claim holds is released (also for a claim the checkpoint does not know: a
//! crash between allocation and checkpoint must not leak its address), and the claim is dropped
//! from the checkpoint. A claim the driver does not know is success: the kubelet calls unprepare
//! again after restarts.
//!
//! Errors are per claim, in the answer's `error`, naming the claim and what failed; the kubelet
//! fails the pod's start with them and retries.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use weft_cni::pf::{PfError, PfVfState, VlanProto};
use weft_ipam::Cidr;
use weft_ipam::network_address::{self, AddressClaim, AddressRequest, NetworkAddress};
use weft_record::{GPU_DECISION_ANNOTATION, GpuDecision};
use weft_topology::NodeTopology;

use crate::api::dra::{Claim, Device, NodePrepareResourceResponse, NodeUnprepareResourceResponse};
use crate::checkpoint::{Checkpoint, ClaimEntry, NicEntry};
use crate::claim::{Planned, claim_key, plan, reserved_pods};
use crate::inventory::{NicDevice, NicInventory};
use crate::prepared::{ClaimRef, PodNics, PreparedNic};
use crate::vlan::VfVlan;

/// weft's NIC DRA driver on one node.
pub struct NicDriver {
    node: String,
    client: kube::Client,
    inventory: NicInventory,
    topology: Option<NodeTopology>,
    vlan: Arc<dyn VfVlan>,
    checkpoint: Arc<Checkpoint>,
    /// The NetworkAddress objects, from a watch ([`address_cache`]); without it each allocation
    /// lists its network.
    addresses: Option<Store<NetworkAddress>>,
    /// One claim is prepared or unprepared at a time on the node.
    busy: tokio::sync::Mutex<()>,
}

/// How long an allocation waits for the address cache's first list before listing the network
/// itself.
const CACHE_WAIT: Duration = Duration::from_secs(5);

/// A watch cache of every NetworkAddress, for [`NicDriver::with_address_cache`], and the future
/// that keeps it filled (run it until shutdown).
pub fn address_cache(client: kube::Client) -> (Store<NetworkAddress>, BoxFuture<'static, ()>) {
    let api: Api<NetworkAddress> = Api::all(client);
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default()).default_backoff().reflect(writer);
    let run = Box::pin(async move {
        stream
            .for_each(|event| async move {
                if let Err(e) = event {
                    tracing::debug!(error = %e, "watching NetworkAddresses");
                }
            })
            .await;
    });
    (reader, run)
}

impl std::fmt::Debug for NicDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicDriver")
            .field("node", &self.node)
            .field("devices", &self.inventory.len())
            .field("topology", &self.topology.is_some())
            .field("checkpoint", &self.checkpoint.path())
            .finish()
    }
}

/// The VLAN a prepared NIC's VF gets: the network's, else untagged (as sriov-cni does).
fn wanted_vlan(nic: &PreparedNic) -> PfVfState {
    PfVfState { vlan: nic.vlan.unwrap_or(0), qos: 0, proto: VlanProto::Dot1Q, admin_mac: None }
}

fn same_vlan(a: &PfVfState, b: &PfVfState) -> bool {
    (a.vlan, a.qos, a.proto) == (b.vlan, b.qos, b.proto)
}

/// Whether a PF error says the VF (or its PF) is gone, so there is nothing to restore.
fn vf_gone(e: &PfError) -> bool {
    matches!(e, PfError::NoPf { .. } | PfError::NoVfs { .. } | PfError::NoSuchVf { .. })
}

fn answer(nic: &PreparedNic) -> Device {
    Device {
        request_names: vec![nic.request.clone()],
        pool_name: nic.pool.clone(),
        device_name: nic.device.clone(),
        cdi_device_ids: Vec::new(),
        share_id: None,
    }
}

fn cidr(net: &IpNet) -> Cidr {
    Cidr { addr: net.network(), prefix_len: net.prefix_len() }
}

impl NicDriver {
    /// The driver for `node`: its VFs (`inventory`), the node's topology when known (for the
    /// alignment verdict), the VLAN seam, and the checkpoint; API calls through `client`.
    pub fn new(
        node: impl Into<String>,
        client: kube::Client,
        inventory: NicInventory,
        topology: Option<NodeTopology>,
        vlan: Arc<dyn VfVlan>,
        checkpoint: Arc<Checkpoint>,
    ) -> NicDriver {
        NicDriver {
            node: node.into(),
            client,
            inventory,
            topology,
            vlan,
            checkpoint,
            addresses: None,
            busy: tokio::sync::Mutex::new(()),
        }
    }

    /// Allocates from `cache` ([`address_cache`]) instead of listing the network on every prepare.
    pub fn with_address_cache(mut self, cache: Store<NetworkAddress>) -> NicDriver {
        self.addresses = Some(cache);
        self
    }

    /// The node (and pool) name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The VFs offered.
    pub fn inventory(&self) -> &NicInventory {
        &self.inventory
    }

    /// The checkpoint.
    pub fn checkpoint(&self) -> &Arc<Checkpoint> {
        &self.checkpoint
    }

    /// The prepared NICs by pod, for the NRI half (attach at RunPodSandbox).
    pub fn pod_nics(&self) -> Arc<dyn PodNics> {
        self.checkpoint.clone()
    }

    /// NodePrepareResources: an answer for every claim, by UID.
    pub async fn prepare(&self, claims: &[Claim]) -> HashMap<String, NodePrepareResourceResponse> {
        let mut out = HashMap::new();
        for c in claims {
            let result = {
                let _one = self.busy.lock().await;
                self.prepare_claim(c).await
            };
            let response = match result {
                Ok(nics) => {
                    NodePrepareResourceResponse { devices: nics.iter().map(answer).collect(), error: String::new() }
                }
                Err(error) => {
                    tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, %error, "NodePrepareResources");
                    NodePrepareResourceResponse { devices: Vec::new(), error }
                }
            };
            out.insert(c.uid.clone(), response);
        }
        out
    }

    /// NodeUnprepareResources: an answer for every claim, by UID.
    pub async fn unprepare(&self, claims: &[Claim]) -> HashMap<String, NodeUnprepareResourceResponse> {
        let mut out = HashMap::new();
        for c in claims {
            let result = {
                let _one = self.busy.lock().await;
                self.unprepare_claim(c).await
            };
            let error = result.err().unwrap_or_default();
            if !error.is_empty() {
                tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, %error, "NodeUnprepareResources");
            }
            out.insert(c.uid.clone(), NodeUnprepareResourceResponse { error });
        }
        out
    }

    async fn prepare_claim(&self, c: &Claim) -> Result<Vec<PreparedNic>, String> {
        if let Some(entry) = self.checkpoint.get(&c.uid) {
            for n in &entry.nics {
                self.apply_vlan(&n.nic).await?;
            }
            tracing::debug!(claim = %format!("{}/{}", c.namespace, c.name), "already prepared: answered from the checkpoint");
            return Ok(entry.nics.into_iter().map(|n| n.nic).collect());
        }
        let claim = self.fetch_claim(c).await?;
        let planned = plan(&claim, &self.node, &self.inventory)?;
        let key = claim_key(&claim);
        let claim_ref = ClaimRef { namespace: c.namespace.clone(), name: c.name.clone(), uid: c.uid.clone() };
        let pods = reserved_pods(&claim);
        let gpus = self.pod_gpus(&c.namespace, &pods).await;
        let taken: BTreeSet<String> = self
            .checkpoint
            .state()
            .claims
            .values()
            .filter(|e| e.claim.uid != c.uid)
            .flat_map(|e| e.nics.iter().map(|n| n.nic.vf_pci.clone()))
            .collect();
        let mut originals = Vec::new();
        for p in &planned {
            originals.push(self.read_vlan(&key, p.device).await?);
        }
        let mut nics = Vec::new();
        for (p, original) in planned.iter().zip(originals) {
            let aligned = self.judge(&key, p, gpus.as_deref(), &taken);
            let address = self.allocate(&key, &claim_ref, p).await?;
            let nic = PreparedNic {
                claim: claim_ref.clone(),
                request: p.request.clone(),
                pool: self.node.clone(),
                device: p.device.name.clone(),
                pod_uids: pods.iter().map(|(_, uid)| uid.clone()).collect(),
                vf_pci: p.device.pci_address.clone(),
                pf: p.device.pf_name().to_string(),
                vf_index: p.device.vf_index,
                network: p.config.network.clone(),
                address,
                vlan: p.config.vlan,
                interface_name: p.config.interface_name.clone(),
                mtu: p.config.mtu,
                aligned,
            };
            nics.push(NicEntry { nic, original });
        }
        let entry = ClaimEntry { claim: claim_ref, nics };
        self.checkpoint
            .insert(entry.clone())
            .await
            .map_err(|e| format!("ResourceClaim {key}: recording the prepared NICs: {e}"))?;
        for n in &entry.nics {
            self.apply_vlan(&n.nic).await?;
        }
        for n in &entry.nics {
            tracing::info!(claim = %key, device = %n.nic.device, vf = %n.nic.vf_pci, address = %n.nic.address, vlan = ?n.nic.vlan, aligned = ?n.nic.aligned, "prepared");
        }
        Ok(entry.nics.into_iter().map(|n| n.nic).collect())
    }

    async fn unprepare_claim(&self, c: &Claim) -> Result<(), String> {
        let key = format!("{}/{}", c.namespace, c.name);
        let entry = self.checkpoint.get(&c.uid);
        for n in entry.iter().flat_map(|e| &e.nics) {
            let o = &n.original;
            match self.vlan.set(&n.nic.pf, n.nic.vf_index, o.vlan, o.qos, o.proto).await {
                Ok(()) => {}
                Err(e) if vf_gone(&e) => {
                    tracing::warn!(claim = %key, vf = %n.nic.vf_pci, error = %e, "the VF is gone: no VLAN to restore");
                }
                Err(e) => {
                    return Err(format!(
                        "ResourceClaim {key}: restoring VLAN {} on VF {} of PF {}: {e}",
                        o.vlan, n.nic.vf_index, n.nic.pf
                    ));
                }
            }
        }
        let released = network_address::release(&self.client, &c.uid)
            .await
            .map_err(|e| format!("ResourceClaim {key}: releasing its addresses: {e}"))?;
        if entry.is_some() {
            self.checkpoint.remove(&c.uid).await.map_err(|e| format!("ResourceClaim {key}: {e}"))?;
            tracing::info!(claim = %key, released = ?released, "unprepared");
        } else if !released.is_empty() {
            tracing::info!(claim = %key, released = ?released, "unprepared a claim the checkpoint did not hold: released its addresses");
        }
        Ok(())
    }

    async fn fetch_claim(&self, c: &Claim) -> Result<ResourceClaim, String> {
        let key = format!("{}/{}", c.namespace, c.name);
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let claim = api
            .get_opt(&c.name)
            .await
            .map_err(|e| format!("reading ResourceClaim {key}: {e}"))?
            .ok_or_else(|| format!("ResourceClaim {key} does not exist"))?;
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        if uid != c.uid {
            return Err(format!(
                "ResourceClaim {key} has UID {uid}, not {} as the kubelet asked: the claim was replaced by another of the same name",
                c.uid
            ));
        }
        Ok(claim)
    }

    /// The GPUs weft's decision gave the claim's pod on this node, when there is one.
    async fn pod_gpus(&self, namespace: &str, pods: &[(String, String)]) -> Option<Vec<usize>> {
        self.topology.as_ref()?;
        let (name, uid) = pods.first()?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = match api.get_opt(name).await {
            Ok(Some(p)) if p.metadata.uid.as_deref() == Some(uid) => p,
            Ok(_) => return None,
            Err(e) => {
                tracing::debug!(pod = %format!("{namespace}/{name}"), error = %e, "reading the pod's GPU decision");
                return None;
            }
        };
        let text = pod.metadata.annotations.as_ref()?.get(GPU_DECISION_ANNOTATION)?;
        match GpuDecision::from_annotation(text) {
            Ok(d) if d.node == self.node => Some(d.gpus),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(pod = %format!("{namespace}/{name}"), error = %e, "unreadable GPU decision");
                None
            }
        }
    }

    fn judge(&self, key: &str, p: &Planned<'_>, gpus: Option<&[usize]>, taken: &BTreeSet<String>) -> Option<bool> {
        let verdict = crate::align::judge(self.topology.as_ref()?, &p.device.pci_address, gpus?, taken)?;
        if verdict.aligned {
            tracing::debug!(claim = %key, reason = %verdict.reason, "the scheduler's VF is aligned with the pod's GPUs");
        } else {
            tracing::info!(claim = %key, reason = %verdict.reason, "the scheduler's VF is not the nearest free one to the pod's GPUs; preparing it as allocated");
        }
        Some(verdict.aligned)
    }

    async fn allocate(&self, key: &str, claim: &ClaimRef, p: &Planned<'_>) -> Result<IpNet, String> {
        let range = p.config.ip_range;
        let request = AddressRequest {
            network: p.config.network.clone(),
            range: cidr(&range),
            claim: AddressClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                uid: claim.uid.clone(),
                request: Some(p.request.clone()),
            },
            node: self.node.clone(),
        };
        let cached = match &self.addresses {
            Some(cache) => match tokio::time::timeout(CACHE_WAIT, cache.wait_until_ready()).await {
                Ok(Ok(())) => Some(cache.state()),
                _ => {
                    tracing::warn!(claim = %key, "the NetworkAddress cache is not filled: listing the network");
                    None
                }
            },
            None => None,
        };
        let got = match cached {
            Some(known) => network_address::allocate_known(&self.client, &request, &known).await,
            None => network_address::allocate(&self.client, &request).await,
        }
        .map_err(|e| format!("ResourceClaim {key}, request {}: allocating an address: {e}", p.request))?;
        let address: IpAddr = got.address;
        IpNet::new(address, range.prefix_len())
            .map_err(|e| format!("ResourceClaim {key}: address {address} with /{}: {e}", range.prefix_len()))
    }

    async fn read_vlan(&self, key: &str, d: &NicDevice) -> Result<PfVfState, String> {
        self.vlan.state(d.pf_name(), d.vf_index).await.map_err(|e| {
            format!("ResourceClaim {key}: reading VF {} ({}) on PF {}: {e}", d.vf_index, d.pci_address, d.pf_name())
        })
    }

    /// Sets the NIC's VLAN on its VF unless it already has it.
    async fn apply_vlan(&self, nic: &PreparedNic) -> Result<(), String> {
        let key = format!("{}/{}", nic.claim.namespace, nic.claim.name);
        let want = wanted_vlan(nic);
        let now = self.vlan.state(&nic.pf, nic.vf_index).await.map_err(|e| {
            format!("ResourceClaim {key}: reading VF {} ({}) on PF {}: {e}", nic.vf_index, nic.vf_pci, nic.pf)
        })?;
        if same_vlan(&now, &want) {
            return Ok(());
        }
        self.vlan.set(&nic.pf, nic.vf_index, want.vlan, want.qos, want.proto).await.map_err(|e| {
            format!(
                "ResourceClaim {key}: setting VLAN {} on VF {} ({}) of PF {}: {e} (the claim stays prepared; unprepare restores the VF)",
                want.vlan, nic.vf_index, nic.vf_pci, nic.pf
            )
        })
    }
}
