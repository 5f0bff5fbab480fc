//! A kubelet's DRA side for tests, over the real gRPC APIs on unix sockets, doing what the
//! kubelet does (k8s.io/kubernetes `pkg/kubelet/pluginmanager` and `pkg/kubelet/cm/dra`):
//!
//! - **Registration** ([`DraKubelet::register`], for a socket the plugin watcher found in
//!   `plugins_registry`): `GetInfo`; a type other than `DRAPlugin` is refused ("no handler
//!   registered for plugin type"), so is a plugin whose supported services do not include one the
//!   kubelet speaks (`v1.DRAPlugin`); an empty endpoint means the registration socket; then
//!   `NotifyRegistrationStatus` with the outcome.
//! - **Prepare** ([`DraKubelet::prepare`], at pod start): for each of the pod's claims, the
//!   ResourceClaim is read from the API server (its name from `resourceClaimName`, or from the
//!   pod's `status.resourceClaimStatuses` for a template's claim, which must then be owned by the
//!   pod); the pod must be in its `reservedFor`; every driver with an allocated device must be
//!   registered. Only after that validation pass does the claim enter the kubelet's claim cache;
//!   a claim already prepared is not prepared again (the pod's other claims still are: the
//!   kubelet snapshot read returns from its cache update at the first prepared claim, which this
//!   harness does not copy). The claims are sent to each driver in one
//!   NodePrepareResources call; a gRPC error, an answer for a claim not asked about, a claim's
//!   `error`, or a claim left out fails the pod's start with the kubelet's message.
//! - **Unprepare** ([`DraKubelet::unprepare`], at pod end): a claim still used by another pod only
//!   loses this pod's reference; the others are sent to their drivers in one
//!   NodeUnprepareResources call and leave the cache once the driver answered without error.
//!
//! The kubelet checkpoints its claim cache; [`DraKubelet::forget_prepared`] plays a kubelet that
//! crashed after the driver prepared a claim and before it recorded that (so the next prepare
//! calls the driver again). [`DraKubelet::plugin`] calls a driver directly, as the kubelet's
//! retries and its restart do.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use tonic::transport::Channel;
use weft_deviceplugin::server::unix_channel;
use weft_nic_dra::api::dra::dra_plugin_client::DraPluginClient;
use weft_nic_dra::api::dra::{Claim, Device, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use weft_nic_dra::api::registration::registration_client::RegistrationClient;
use weft_nic_dra::api::registration::{InfoRequest, PluginInfo, RegistrationStatus};

/// The plugin type DRA drivers register as.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA services this kubelet speaks, most recent first.
pub const SUPPORTED_SERVICES: [&str; 1] = ["v1.DRAPlugin"];

/// One claim in the kubelet's claim cache.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimInfo {
    /// The claim's UID.
    pub uid: String,
    /// Drivers with devices allocated in it.
    pub drivers: BTreeSet<String>,
    /// Pods using it.
    pub pods: BTreeSet<String>,
    /// Whether every driver prepared it.
    pub prepared: bool,
    /// The devices the drivers answered, by driver.
    pub devices: BTreeMap<String, Vec<Device>>,
}

/// The kubelet's DRA manager and plugin registry.
pub struct DraKubelet {
    client: kube::Client,
    plugins: Mutex<BTreeMap<String, PathBuf>>,
    claims: Mutex<BTreeMap<(String, String), ClaimInfo>>,
}

impl std::fmt::Debug for DraKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraKubelet").field("plugins", &self.registered()).finish()
    }
}

/// A claim of a pod, resolved: (pod claim name, ResourceClaim name, must the pod own it).
type PodClaim = (String, Option<String>, bool);

fn pod_claims(pod: &Pod) -> Result<Vec<PodClaim>, String> {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    let mut out = Vec::new();
    for pc in pod.spec.iter().flat_map(|s| s.resource_claims.iter().flatten()) {
        if let Some(name) = &pc.resource_claim_name {
            out.push((pc.name.clone(), Some(name.clone()), false));
        } else if pc.resource_claim_template_name.is_some() {
            let status = statuses
                .into_iter()
                .flatten()
                .find(|s| s.name == pc.name)
                .ok_or_else(|| format!("pod \"{pod_name}\": ResourceClaim not created yet for \"{}\"", pc.name))?;
            out.push((pc.name.clone(), status.resource_claim_name.clone(), true));
        } else {
            return Err(format!("pod \"{pod_name}\", spec.resourceClaim {}: neither a claim nor a template", pc.name));
        }
    }
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DraKubelet {
    /// A kubelet reading claims through `client`, with no plugin registered.
    pub fn new(client: kube::Client) -> DraKubelet {
        DraKubelet { client, plugins: Mutex::new(BTreeMap::new()), claims: Mutex::new(BTreeMap::new()) }
    }

    /// Registers the plugin whose registration socket is `socket` (see the module docs); the
    /// plugin's info, or the kubelet's error (also sent to the plugin).
    pub async fn register(&self, socket: &Path) -> Result<PluginInfo, String> {
        let channel = unix_channel(socket)
            .await
            .map_err(|e| format!("RegisterPlugin error -- dial failed at socket {}, err: {e}", socket.display()))?;
        let mut client = RegistrationClient::new(channel);
        let mut info = client.get_info(InfoRequest {}).await.map_err(|s| {
            format!(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {}, err: {}",
                socket.display(),
                s.message()
            )
        })?;
        let info = info.get_mut().clone();
        let refusal = if info.r#type != DRA_PLUGIN_TYPE {
            Some(format!(
                "RegisterPlugin error -- no handler registered for plugin type: {} at socket {}",
                info.r#type,
                socket.display()
            ))
        } else if info.supported_versions.is_empty() {
            Some(format!(
                "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA driver plugin {} at endpoint {}: empty list of supported gRPC services (aka supported versions)",
                info.name, info.endpoint
            ))
        } else if !info.supported_versions.iter().any(|v| SUPPORTED_SERVICES.contains(&v.as_str())) {
            Some(format!(
                "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA driver plugin {} at endpoint {}: none of services supported by the plugin ({:?}) are supported by the kubelet ({SUPPORTED_SERVICES:?})",
                info.name, info.endpoint, info.supported_versions
            ))
        } else {
            None
        };
        let status =
            RegistrationStatus { plugin_registered: refusal.is_none(), error: refusal.clone().unwrap_or_default() };
        client.notify_registration_status(status).await.map_err(|s| {
            format!(
                "RegisterPlugin error -- failed to send registration status at socket {}, err: {}",
                socket.display(),
                s.message()
            )
        })?;
        if let Some(e) = refusal {
            return Err(e);
        }
        let endpoint = if info.endpoint.is_empty() { socket.to_path_buf() } else { PathBuf::from(&info.endpoint) };
        lock(&self.plugins).insert(info.name.clone(), endpoint);
        Ok(info)
    }

    /// Forgets the driver's plugin (its registration socket went away).
    pub fn deregister(&self, driver: &str) {
        lock(&self.plugins).remove(driver);
    }

    /// The registered drivers and their endpoints.
    pub fn registered(&self) -> BTreeMap<String, PathBuf> {
        lock(&self.plugins).clone()
    }

    /// A client of `driver`'s DRA service, as the kubelet calls it.
    pub async fn plugin(&self, driver: &str) -> Result<DraPluginClient<Channel>, String> {
        let endpoint =
            lock(&self.plugins).get(driver).cloned().ok_or_else(|| format!("DRA driver {driver} is not registered"))?;
        let channel =
            unix_channel(&endpoint).await.map_err(|e| format!("DRA driver {driver} at {}: {e}", endpoint.display()))?;
        Ok(DraPluginClient::new(channel))
    }

    /// The cache entry of claim `namespace/name`.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<ClaimInfo> {
        lock(&self.claims).get(&(namespace.to_string(), name.to_string())).cloned()
    }

    /// A kubelet that crashed after the driver prepared the claim and before recording it: the
    /// claim is no longer marked prepared, so the next prepare calls the driver again.
    pub fn forget_prepared(&self, namespace: &str, name: &str) {
        if let Some(c) = lock(&self.claims).get_mut(&(namespace.to_string(), name.to_string())) {
            c.prepared = false;
            c.devices.clear();
        }
    }

    /// Prepares the pod's claims as the kubelet does at pod start (see the module docs).
    pub async fn prepare(&self, pod: &Pod) -> Result<(), String> {
        self.prepare_inner(pod).await.map_err(|e| format!("prepare dynamic resources: {e}"))
    }

    async fn prepare_inner(&self, pod: &Pod) -> Result<(), String> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".to_string());
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &namespace);
        // Validation pass: nothing enters the cache unless every claim is usable.
        let mut found = Vec::new();
        for (_, claim_name, must_own) in pod_claims(pod)? {
            let Some(claim_name) = claim_name else { continue };
            let claim = api.get(&claim_name).await.map_err(|e| format!("fetch ResourceClaim {claim_name}: {e}"))?;
            let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
            if must_own && !claim.metadata.owner_references.iter().flatten().any(|o| o.uid == pod_uid) {
                return Err(format!(
                    "ResourceClaim {claim_name} was not created for pod {namespace}/{pod_name} (pod is not owner)"
                ));
            }
            let reserved = claim
                .status
                .as_ref()
                .and_then(|s| s.reserved_for.as_ref())
                .is_some_and(|r| r.iter().any(|r| r.resource == "pods" && r.uid == pod_uid));
            if !reserved {
                return Err(format!(
                    "pod {pod_name} ({pod_uid}) is not allowed to use ResourceClaim {claim_name} ({claim_uid})"
                ));
            }
            let results = claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .ok_or_else(|| format!("ResourceClaim {claim_name}: not allocated"))?
                .devices
                .as_ref()
                .and_then(|d| d.results.clone())
                .unwrap_or_default();
            let drivers: BTreeSet<String> = results.into_iter().map(|r| r.driver).collect();
            for d in &drivers {
                if !lock(&self.plugins).contains_key(d) {
                    return Err(format!("DRA driver {d} is not registered"));
                }
            }
            found.push((claim_name, claim_uid, drivers));
        }
        // The cache: add the claims and this pod's reference; collect the unprepared ones.
        let mut batches: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        {
            let mut cache = lock(&self.claims);
            for (name, uid, drivers) in &found {
                let info = cache.entry((namespace.clone(), name.clone())).or_insert_with(|| ClaimInfo {
                    uid: uid.clone(),
                    drivers: drivers.clone(),
                    ..ClaimInfo::default()
                });
                if info.uid != *uid {
                    return Err(format!(
                        "old ResourceClaim with same name {name} and different UID {} still exists (previous pod force-deleted?!)",
                        info.uid
                    ));
                }
                info.pods.insert(pod_uid.clone());
                if info.prepared {
                    continue;
                }
                for d in drivers {
                    batches.entry(d.clone()).or_default().push(Claim {
                        namespace: namespace.clone(),
                        uid: uid.clone(),
                        name: name.clone(),
                    });
                }
            }
        }
        for (driver, claims) in &batches {
            let mut plugin = self.plugin(driver).await?;
            let response = plugin
                .node_prepare_resources(NodePrepareResourcesRequest { claims: claims.clone() })
                .await
                .map_err(|s| format!("NodePrepareResources: {}", s.message()))?
                .into_inner();
            for (uid, result) in &response.claims {
                let asked = claims
                    .iter()
                    .find(|c| c.uid == *uid)
                    .ok_or_else(|| format!("NodePrepareResources returned result for unknown claim UID {uid}"))?;
                if !result.error.is_empty() {
                    return Err(format!(
                        "NodePrepareResources failed for ResourceClaim {}: {}",
                        asked.name, result.error
                    ));
                }
                if let Some(info) = lock(&self.claims).get_mut(&(namespace.clone(), asked.name.clone())) {
                    info.devices.insert(driver.clone(), result.devices.clone());
                }
            }
            let unfinished = claims.len().saturating_sub(response.claims.len());
            if unfinished != 0 {
                return Err(format!("NodePrepareResources skipped {unfinished} ResourceClaims"));
            }
        }
        let mut cache = lock(&self.claims);
        for (name, _, _) in &found {
            if let Some(info) = cache.get_mut(&(namespace.clone(), name.clone())) {
                info.prepared = true;
            }
        }
        Ok(())
    }

    /// Unprepares the pod's claims as the kubelet does when the pod ends (see the module docs).
    pub async fn unprepare(&self, pod: &Pod) -> Result<(), String> {
        self.unprepare_inner(pod).await.map_err(|e| format!("unprepare dynamic resources: {e}"))
    }

    async fn unprepare_inner(&self, pod: &Pod) -> Result<(), String> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".to_string());
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut batches: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        {
            let mut cache = lock(&self.claims);
            for (_, claim_name, _) in pod_claims(pod)? {
                let Some(claim_name) = claim_name else { continue };
                let Some(info) = cache.get_mut(&(namespace.clone(), claim_name.clone())) else { continue };
                if info.pods.len() > 1 {
                    info.pods.remove(&pod_uid);
                    continue;
                }
                for d in &info.drivers {
                    batches.entry(d.clone()).or_default().push(Claim {
                        namespace: namespace.clone(),
                        uid: info.uid.clone(),
                        name: claim_name.clone(),
                    });
                }
            }
        }
        for (driver, claims) in &batches {
            let mut plugin = self.plugin(driver).await?;
            let response = plugin
                .node_unprepare_resources(NodeUnprepareResourcesRequest { claims: claims.clone() })
                .await
                .map_err(|s| format!("NodeUnprepareResources: {}", s.message()))?
                .into_inner();
            for (uid, result) in &response.claims {
                let asked = claims
                    .iter()
                    .find(|c| c.uid == *uid)
                    .ok_or_else(|| format!("NodeUnprepareResources returned result for unknown claim UID {uid}"))?;
                if !result.error.is_empty() {
                    return Err(format!(
                        "NodeUnprepareResources failed for claim {}/{}: {}",
                        asked.namespace, asked.name, result.error
                    ));
                }
                lock(&self.claims).remove(&(namespace.clone(), asked.name.clone()));
            }
            let unfinished = claims.len().saturating_sub(response.claims.len());
            if unfinished != 0 {
                return Err(format!("NodeUnprepareResources left out {unfinished} claims"));
            }
        }
        Ok(())
    }
}
