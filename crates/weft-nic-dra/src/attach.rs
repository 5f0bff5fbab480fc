//! The NRI sandbox hooks: move a prepared VF into the pod's network namespace and back.
//!
//! [`NicAttacher`] is an NRI [`Handler`] (RunPodSandbox, StopPodSandbox, RemovePodSandbox,
//! Synchronize). At RunPodSandbox it asks [`PodNics`] for the pod's prepared NICs (by the
//! sandbox's pod UID), finds the sandbox's network namespace (`linux.namespaces`, type
//! `network`), and moves each VF in with weft-cni's shared steps ([`weft_cni::attach::Host`]):
//! down, a temporary name in the host, moved, its name in the pod (`interface_name`, else the
//! first free `netN`, N ≥ 1), its MTU when one is asked, its address, up. A failure returns every
//! VF of the pod to the host and fails the sandbox. A hostNetwork pod that holds NICs fails with
//! an error saying so.
//!
//! What it did is recorded before any VF moves, one small file per pod
//! (`<state_dir>/<pod UID>.json`, written whole or not at all): the sandbox, its namespace, and
//! per VF its claim, its name in the pod and its original host name, MAC, MTU and up state. So
//! StopPodSandbox and RemovePodSandbox can move each VF back under its original name and MTU
//! (best effort: errors are logged, pod teardown never fails), and an agent that restarted finds
//! at Synchronize what it had moved: VFs of sandboxes that no longer run go back to the host,
//! running pods get VFs they miss, and their claim status is applied again.
//!
//! A repeated RunPodSandbox of a sandbox whose VFs are all in place does nothing. A new sandbox
//! of the same pod first takes the VFs back from the old one.
//!
//! After the move the claim's status gets each device's `networkData` and conditions
//! ([`crate::status`]). That write goes to the API server in the background, retried with backoff
//! until it succeeds, fails for good (the claim is gone) or the pod's VFs are taken back: pod
//! start never waits on the API server, and the runtime's request timeout is never at stake.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use ipnet::IpNet;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use weft_cni::CniError;
use weft_cni::attach::{Host, PodLink, TakenBack};
use weft_cni::net::{Link, Netns};
use weft_cni::state::{OriginalState, write_atomic};
use weft_net::vif::interface_name_problem;
use weft_nri::api;
use weft_nri::event::{Event, EventMask};
use weft_nri::plugin::{Handler, HandlerError};

use crate::prepared::{ClaimRef, PodNics, PreparedNic};
use crate::status::{ClaimStatus, DeviceNetwork};

/// The `format` of a record file.
pub const RECORD_FORMAT: &str = "weft.io/nic-dra-attachment/v1";
/// Where the records go by default.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/weft/nic-dra/attached";
/// The NRI plugin name suggested for the hooks.
pub const PLUGIN_NAME: &str = "weft-nic";
/// The NRI plugin index suggested for the hooks: after weft's resource manager (`10-weft`), so a
/// pod it refuses never has a VF moved.
pub const PLUGIN_INDEX: &str = "20";

/// The events the hooks handle.
pub fn subscription() -> EventMask {
    [Event::RunPodSandbox, Event::StopPodSandbox, Event::RemovePodSandbox].into_iter().collect()
}

/// Where the hooks keep their records and find sysfs, and how they retry the status write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachConfig {
    /// The record directory ([`DEFAULT_STATE_DIR`]).
    pub state_dir: PathBuf,
    /// Where sysfs is (`/`; tests point it at a fake tree).
    pub sysfs_root: PathBuf,
    /// First wait before writing a claim's status again after a failure.
    pub status_retry_min: Duration,
    /// Longest wait between status write attempts.
    pub status_retry_max: Duration,
}

impl Default for AttachConfig {
    fn default() -> AttachConfig {
        AttachConfig {
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            sysfs_root: PathBuf::from("/"),
            status_retry_min: Duration::from_millis(200),
            status_retry_max: Duration::from_secs(30),
        }
    }
}

/// One VF as the hook moved it (or is about to).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachedNic {
    /// The claim.
    pub claim: ClaimRef,
    /// The request in the claim.
    pub request: String,
    /// The ResourceSlice pool.
    pub pool: String,
    /// The device's name in the ResourceSlice.
    pub device: String,
    /// The VF's PCI address.
    pub vf_pci: String,
    /// Its interface name in the pod.
    pub ifname: String,
    /// Its address in the pod.
    pub address: IpNet,
    /// The MTU set in the pod, if one was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Its state in the host before the move (what StopPodSandbox restores).
    pub original: OriginalState,
}

/// The record of one pod's VFs: what RunPodSandbox moved into which sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodAttachment {
    /// [`RECORD_FORMAT`].
    pub format: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// `namespace/name`.
    pub pod: String,
    /// The sandbox's ID.
    pub sandbox_id: String,
    /// The sandbox's network namespace.
    pub netns: String,
    /// When the VFs were moved (RFC 3339; the status conditions' transition time).
    pub since: String,
    /// The VFs, in the order they were moved.
    pub nics: Vec<AttachedNic>,
}

/// Why a pod's VFs could not be moved in. Every message names the pod; most name the claim and
/// the VF.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The pod runs in the host's network namespace.
    #[error(
        "pod {pod} holds NICs of driver nic.weft.io (claims {claims}) but its sandbox {sandbox} has no network namespace of its own (hostNetwork pod): a VF can only be moved into a pod network namespace; drop hostNetwork or the claims"
    )]
    HostNetwork {
        /// The pod.
        pod: String,
        /// Its claims.
        claims: String,
        /// The sandbox ID.
        sandbox: String,
    },
    /// The pod UID cannot name a record file.
    #[error("pod {pod}: UID {uid:?} is not usable as a record name (letters, digits, '-', '_' and '.' only)")]
    BadUid {
        /// The pod.
        pod: String,
        /// The UID.
        uid: String,
    },
    /// A claim is reserved for more than one pod.
    #[error("pod {pod}: claim {claim} is reserved for {count} pods, but a VF can be in one pod only")]
    SharedClaim {
        /// The pod.
        pod: String,
        /// The claim.
        claim: String,
        /// How many pods.
        count: usize,
    },
    /// The interface name asked for cannot be used.
    #[error("pod {pod}: claim {claim} (VF {pci}) asks for interface name {name:?}: {why}")]
    InterfaceName {
        /// The pod.
        pod: String,
        /// The claim.
        claim: String,
        /// The VF.
        pci: String,
        /// The name.
        name: String,
        /// Why not.
        why: String,
    },
    /// A link step failed (looking up, moving, configuring the VF; opening the namespace).
    #[error("pod {pod}: {what}: {source}")]
    Link {
        /// The pod.
        pod: String,
        /// What was being done.
        what: String,
        /// The step's error.
        source: CniError,
    },
    /// The record could not be written.
    #[error("pod {pod}: recording its VFs in {path}: {message}")]
    Record {
        /// The pod.
        pod: String,
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

fn pod_name(pod: &api::PodSandbox) -> String {
    format!("{}/{} (uid {})", pod.namespace, pod.name, pod.uid)
}

fn claim_name(c: &ClaimRef) -> String {
    format!("{}/{}", c.namespace, c.name)
}

/// The sandbox's network namespace path; `None` for a hostNetwork pod (no `network` entry, or
/// one with an empty path).
pub fn network_namespace(pod: &api::PodSandbox) -> Option<PathBuf> {
    let linux = pod.linux.as_ref()?;
    linux
        .namespaces
        .iter()
        .find(|n| n.type_ == "network")
        .map(|n| n.path.trim())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

fn usable_uid(uid: &str) -> bool {
    !uid.is_empty() && !uid.starts_with('.') && uid.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// How a RunPodSandbox (or Synchronize) ended for a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attached {
    /// The pod holds no NICs of this driver.
    Nothing,
    /// Its VFs were already in place in this sandbox; nothing was done.
    AlreadyInPlace(PodAttachment),
    /// Its VFs were moved in now.
    Moved(PodAttachment),
}

/// The NRI hooks of the NIC driver.
pub struct NicAttacher {
    nics: Arc<dyn PodNics>,
    status: Arc<dyn ClaimStatus>,
    cfg: AttachConfig,
    /// One attach or detach at a time on the node.
    serial: tokio::sync::Mutex<()>,
    /// Status writes in flight, by pod UID.
    publishing: Mutex<HashMap<String, CancellationToken>>,
}

impl std::fmt::Debug for NicAttacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicAttacher").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

impl NicAttacher {
    /// Hooks that find a pod's NICs through `nics` and write claim status through `status`.
    pub fn new(nics: Arc<dyn PodNics>, status: Arc<dyn ClaimStatus>, cfg: AttachConfig) -> NicAttacher {
        NicAttacher { nics, status, cfg, serial: tokio::sync::Mutex::new(()), publishing: Mutex::new(HashMap::new()) }
    }

    /// The record file of pod `uid`.
    pub fn record_path(&self, uid: &str) -> PathBuf {
        self.cfg.state_dir.join(format!("{uid}.json"))
    }

    /// The record of pod `uid`, if there is one (an unreadable one is an error naming the file).
    pub fn record(&self, uid: &str) -> Result<Option<PodAttachment>, String> {
        if !usable_uid(uid) {
            return Ok(None);
        }
        let path = self.record_path(uid);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Every readable record; unreadable files are logged and skipped.
    pub fn records(&self) -> Vec<PodAttachment> {
        let Ok(entries) = std::fs::read_dir(&self.cfg.state_dir) else { return Vec::new() };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        let mut out = Vec::new();
        for p in paths {
            match std::fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<PodAttachment>(&b).map_err(|e| e.to_string()))
            {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::warn!(file = %p.display(), error = %e, "skipping an unreadable NIC attachment record")
                }
            }
        }
        out
    }

    fn save(&self, rec: &PodAttachment) -> Result<(), AttachError> {
        let path = self.record_path(&rec.pod_uid);
        let fail = |message: String| AttachError::Record { pod: rec.pod.clone(), path: path.clone(), message };
        std::fs::create_dir_all(&self.cfg.state_dir).map_err(|e| fail(e.to_string()))?;
        let data = serde_json::to_vec_pretty(rec).map_err(|e| fail(e.to_string()))?;
        write_atomic(&path, &data).map_err(|e| fail(e.to_string()))
    }

    fn forget(&self, uid: &str) {
        let path = self.record_path(uid);
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %path.display(), error = %e, "removing a NIC attachment record");
        }
    }

    /// RunPodSandbox: the pod's VFs into its sandbox (see the module docs).
    pub async fn attach_pod(&self, pod: &api::PodSandbox) -> Result<Attached, AttachError> {
        let nics = self.nics.nics_for_pod(&pod.uid);
        if nics.is_empty() {
            return Ok(Attached::Nothing);
        }
        let _serial = self.serial.lock().await;
        let outcome = self.ensure(pod, nics).await?;
        if let Attached::Moved(rec) = &outcome {
            self.publish(rec);
        }
        Ok(outcome)
    }

    /// StopPodSandbox / RemovePodSandbox: the sandbox's VFs back to the host. Best effort: what
    /// failed is returned (and logged), and the record stays so a later call can finish.
    pub async fn detach_pod(&self, pod: &api::PodSandbox) -> Vec<String> {
        let _serial = self.serial.lock().await;
        match self.record(&pod.uid) {
            Ok(Some(rec)) if rec.sandbox_id == pod.id => self.detach(&rec).await,
            Ok(_) => Vec::new(),
            Err(e) => {
                tracing::warn!(pod = %pod_name(pod), error = %e, "NIC attachment record unreadable; nothing moved back");
                vec![e]
            }
        }
    }

    /// Synchronize: VFs of sandboxes that are gone back to the host; running pods' VFs in place
    /// and their status applied again. Errors are logged, never returned (a failed Synchronize
    /// would cost the plugin its connection).
    pub async fn resync(&self, pods: &[api::PodSandbox]) {
        let _serial = self.serial.lock().await;
        let live: BTreeSet<&str> = pods.iter().map(|p| p.id.as_str()).collect();
        for rec in self.records() {
            if !live.contains(rec.sandbox_id.as_str()) {
                tracing::info!(pod = %rec.pod, sandbox = %rec.sandbox_id, "sandbox gone: moving its VFs back to the host");
                self.detach(&rec).await;
            }
        }
        for pod in pods {
            let nics = self.nics.nics_for_pod(&pod.uid);
            if nics.is_empty() {
                continue;
            }
            match self.ensure(pod, nics).await {
                Ok(Attached::Moved(rec) | Attached::AlreadyInPlace(rec)) => self.publish(&rec),
                Ok(Attached::Nothing) => {}
                Err(e) => tracing::warn!(error = %e, "a running pod's VFs could not be put in place"),
            }
        }
    }

    /// The pod's VFs in its sandbox: nothing when they already are, else the old sandbox's back
    /// first and then the move.
    async fn ensure(&self, pod: &api::PodSandbox, nics: Vec<PreparedNic>) -> Result<Attached, AttachError> {
        let who = pod_name(pod);
        if !usable_uid(&pod.uid) {
            return Err(AttachError::BadUid { pod: who, uid: pod.uid.clone() });
        }
        let claims: BTreeSet<String> = nics.iter().map(|n| claim_name(&n.claim)).collect();
        let claims = claims.into_iter().collect::<Vec<_>>().join(", ");
        let host_network =
            || AttachError::HostNetwork { pod: who.clone(), claims: claims.clone(), sandbox: pod.id.clone() };
        let netns_path = network_namespace(pod).ok_or_else(host_network)?;
        for n in &nics {
            if n.pod_uids.len() > 1 {
                return Err(AttachError::SharedClaim {
                    pod: who.clone(),
                    claim: claim_name(&n.claim),
                    count: n.pod_uids.len(),
                });
            }
        }
        let link_fail = |what: String| {
            let pod = who.clone();
            move |source: CniError| AttachError::Link { pod, what, source }
        };
        let host = Host::new().map_err(link_fail("opening netlink in the host".into()))?;
        let netns = Netns::open(&netns_path).map_err(|e| AttachError::Link {
            pod: who.clone(),
            what: format!("opening the sandbox's network namespace {}", netns_path.display()),
            source: CniError::new(weft_cni::code::INVALID_ENV, e.to_string()),
        })?;
        if netns.same_as(host.netns()) {
            return Err(host_network());
        }
        let pod_links = netns.links().map_err(|e| AttachError::Link {
            pod: who.clone(),
            what: format!("opening netlink in {}", netns_path.display()),
            source: CniError::new(weft_cni::code::LINK, e.to_string()),
        })?;

        match self.record(&pod.uid) {
            Ok(Some(rec)) => {
                if rec.sandbox_id == pod.id && self.in_place(&rec, &nics, &netns, &pod_links).await {
                    return Ok(Attached::AlreadyInPlace(rec));
                }
                tracing::info!(pod = %who, old_sandbox = %rec.sandbox_id, "taking the pod's VFs back from its earlier sandbox first");
                let errors = self.detach(&rec).await;
                if !errors.is_empty() {
                    return Err(AttachError::Link {
                        pod: who.clone(),
                        what: format!("taking its VFs back from sandbox {}", rec.sandbox_id),
                        source: CniError::new(weft_cni::code::LINK, errors.join("; ")),
                    });
                }
            }
            Ok(None) => {}
            Err(e) => {
                return Err(AttachError::Record { pod: who.clone(), path: self.record_path(&pod.uid), message: e });
            }
        }

        let mut used: BTreeSet<String> = pod_links
            .names()
            .await
            .map_err(|e| AttachError::Link {
                pod: who.clone(),
                what: format!("listing the links in {}", netns_path.display()),
                source: CniError::new(weft_cni::code::LINK, e.to_string()),
            })?
            .into_iter()
            .collect();
        let mut planned: Vec<(AttachedNic, u32)> = Vec::new();
        let mut seen_pci = BTreeSet::new();
        for n in nics {
            let claim = claim_name(&n.claim);
            if !seen_pci.insert(n.vf_pci.clone()) {
                return Err(AttachError::Link {
                    pod: who.clone(),
                    what: format!("claim {claim}"),
                    source: CniError::new(
                        weft_cni::code::VF_IN_USE,
                        format!("VF {} is prepared twice for this pod", n.vf_pci),
                    ),
                });
            }
            let vf_what = format!("claim {claim}, VF {}", n.vf_pci);
            let located = host.locate(&self.cfg.sysfs_root, &n.vf_pci).map_err(link_fail(vf_what.clone()))?;
            let link: Link = host.host_link(&n.vf_pci, &located).await.map_err(link_fail(vf_what.clone()))?;
            let ifname = match &n.interface_name {
                Some(name) => {
                    let bad = |why: String| AttachError::InterfaceName {
                        pod: who.clone(),
                        claim: claim.clone(),
                        pci: n.vf_pci.clone(),
                        name: name.clone(),
                        why,
                    };
                    if let Some(why) = interface_name_problem(name) {
                        return Err(bad(format!("it {why}")));
                    }
                    if used.contains(name) {
                        return Err(bad(format!("{name} already exists in {}", netns_path.display())));
                    }
                    name.clone()
                }
                None => (1..).map(|i| format!("net{i}")).find(|c| !used.contains(c)).unwrap_or_default(),
            };
            used.insert(ifname.clone());
            let original = OriginalState {
                host_ifname: link.name.clone(),
                mac: link.mac.clone(),
                mtu: link.mtu,
                up: link.up,
                pf: None,
            };
            planned.push((
                AttachedNic {
                    claim: n.claim,
                    request: n.request,
                    pool: n.pool,
                    device: n.device,
                    vf_pci: n.vf_pci,
                    ifname,
                    address: n.address,
                    mtu: n.mtu,
                    original,
                },
                link.index,
            ));
        }
        let rec = PodAttachment {
            format: RECORD_FORMAT.to_string(),
            pod_uid: pod.uid.clone(),
            pod: format!("{}/{}", pod.namespace, pod.name),
            sandbox_id: pod.id.clone(),
            netns: netns_path.display().to_string(),
            since: Timestamp::now().to_string(),
            nics: planned.iter().map(|(n, _)| n.clone()).collect(),
        };
        // Recorded before anything moves: an agent killed half-way still knows what to undo.
        self.save(&rec)?;
        for (i, (n, host_index)) in planned.iter().enumerate() {
            let want = PodLink { ifname: &n.ifname, mac: None, mtu: n.mtu };
            let moved = host
                .attach(
                    &netns,
                    &pod_links,
                    &n.vf_pci,
                    *host_index,
                    &n.original,
                    &want,
                    std::slice::from_ref(&n.address),
                )
                .await;
            if let Err(source) = moved {
                for (done, _) in planned[..i].iter().rev() {
                    if let Err(e) =
                        host.detach(&netns_path, &self.cfg.sysfs_root, &done.vf_pci, &done.ifname, &done.original).await
                    {
                        tracing::warn!(pod = %who, vf = %done.vf_pci, error = %e, "returning a VF to the host after a failed attach");
                    }
                }
                self.forget(&pod.uid);
                return Err(AttachError::Link {
                    pod: who.clone(),
                    what: format!(
                        "claim {}, VF {} into {} as {}",
                        claim_name(&n.claim),
                        n.vf_pci,
                        netns_path.display(),
                        n.ifname
                    ),
                    source,
                });
            }
        }
        tracing::info!(pod = %who, sandbox = %pod.id, vfs = rec.nics.len(), "VFs moved into the pod");
        Ok(Attached::Moved(rec))
    }

    /// Whether every VF of `rec` is the pod's NIC set and is in `netns` under its name.
    async fn in_place(
        &self,
        rec: &PodAttachment,
        nics: &[PreparedNic],
        netns: &Netns,
        pod: &weft_cni::net::Links,
    ) -> bool {
        if Path::new(&rec.netns) != netns.path() {
            return false;
        }
        let want: BTreeSet<&str> = nics.iter().map(|n| n.vf_pci.as_str()).collect();
        let have: BTreeSet<&str> = rec.nics.iter().map(|n| n.vf_pci.as_str()).collect();
        if want != have {
            return false;
        }
        for n in &rec.nics {
            if !matches!(pod.get(&n.ifname).await, Ok(Some(_))) {
                return false;
            }
        }
        true
    }

    /// `rec`'s VFs back to the host, in reverse order; the record is removed when nothing failed.
    async fn detach(&self, rec: &PodAttachment) -> Vec<String> {
        if let Some(t) = self.publishing.lock().unwrap_or_else(PoisonError::into_inner).remove(&rec.pod_uid) {
            t.cancel();
        }
        let host = match Host::new() {
            Ok(h) => h,
            Err(e) => {
                let e = format!("pod {}: opening netlink in the host: {e}", rec.pod);
                tracing::warn!(error = %e, "VFs not moved back");
                return vec![e];
            }
        };
        let netns = Path::new(&rec.netns);
        let mut errors = Vec::new();
        for n in rec.nics.iter().rev() {
            match host.detach(netns, &self.cfg.sysfs_root, &n.vf_pci, &n.ifname, &n.original).await {
                Ok(TakenBack::Returned | TakenBack::AlreadyHome) => {}
                Ok(TakenBack::Missing) => tracing::warn!(
                    pod = %rec.pod,
                    vf = %n.vf_pci,
                    "VF is neither {} in {} nor {} in the host; nothing to move back",
                    n.ifname,
                    rec.netns,
                    n.original.host_ifname
                ),
                Err(e) => {
                    let e = format!(
                        "pod {}: VF {} ({} in {}) back to the host as {}: {e}",
                        rec.pod, n.vf_pci, n.ifname, rec.netns, n.original.host_ifname
                    );
                    tracing::warn!(error = %e, "VF not moved back");
                    errors.push(e);
                }
            }
        }
        if errors.is_empty() {
            self.forget(&rec.pod_uid);
            tracing::info!(pod = %rec.pod, sandbox = %rec.sandbox_id, "VFs back in the host");
        }
        errors
    }

    /// Write the claims' status for `rec` in the background (see the module docs).
    fn publish(&self, rec: &PodAttachment) {
        let since = rec.since.parse::<Timestamp>().unwrap_or_else(|_| Timestamp::now());
        let mut by_claim: BTreeMap<String, (ClaimRef, Vec<DeviceNetwork>)> = BTreeMap::new();
        for n in &rec.nics {
            let entry = by_claim.entry(n.claim.uid.clone()).or_insert_with(|| (n.claim.clone(), Vec::new()));
            entry.1.push(DeviceNetwork {
                pool: n.pool.clone(),
                device: n.device.clone(),
                vf_pci: n.vf_pci.clone(),
                interface_name: n.ifname.clone(),
                ips: vec![n.address],
                hardware_address: n.original.mac.as_ref().map(ToString::to_string),
                since,
            });
        }
        let token = CancellationToken::new();
        if let Some(old) =
            self.publishing.lock().unwrap_or_else(PoisonError::into_inner).insert(rec.pod_uid.clone(), token.clone())
        {
            old.cancel();
        }
        let status = self.status.clone();
        let (min, max) = (self.cfg.status_retry_min, self.cfg.status_retry_max);
        let pod = rec.pod.clone();
        tokio::spawn(async move {
            for (claim, devices) in by_claim.into_values() {
                let mut failures = 0u32;
                loop {
                    let written = tokio::select! {
                        _ = token.cancelled() => return,
                        r = status.publish(&claim, &devices) => r,
                    };
                    match written {
                        Ok(()) => break,
                        Err(e) if e.permanent => {
                            tracing::warn!(pod = %pod, error = %e, "claim status not written; not retrying");
                            break;
                        }
                        Err(e) => {
                            failures += 1;
                            let wait = weft_kube::write::doubling_backoff(min, max, failures);
                            tracing::warn!(pod = %pod, error = %e, retry_in = ?wait, "claim status not written yet");
                            tokio::select! {
                                _ = token.cancelled() => return,
                                _ = tokio::time::sleep(wait) => {}
                            }
                        }
                    }
                }
            }
        });
    }
}

#[async_trait]
impl Handler for NicAttacher {
    fn events(&self) -> EventMask {
        subscription()
    }

    async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        _containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
        self.resync(&pods).await;
        Ok(Vec::new())
    }

    async fn run_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), HandlerError> {
        self.attach_pod(&pod).await.map(|_| ()).map_err(|e| HandlerError::new(e.to_string()))
    }

    async fn stop_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), HandlerError> {
        self.detach_pod(&pod).await;
        Ok(())
    }

    async fn remove_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), HandlerError> {
        self.detach_pod(&pod).await;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sandbox(namespaces: &[(&str, &str)]) -> api::PodSandbox {
        let mut p = api::PodSandbox::new();
        let mut linux = api::LinuxPodSandbox::new();
        for (kind, path) in namespaces {
            let mut n = api::LinuxNamespace::new();
            n.type_ = kind.to_string();
            n.path = path.to_string();
            linux.namespaces.push(n);
        }
        p.linux = Some(linux).into();
        p
    }

    #[test]
    fn the_network_namespace_is_the_network_entry_and_host_network_has_none() {
        let p = sandbox(&[("pid", "/proc/1/ns/pid"), ("network", "/var/run/netns/cni-1")]);
        assert_eq!(network_namespace(&p), Some(PathBuf::from("/var/run/netns/cni-1")));
        assert_eq!(network_namespace(&sandbox(&[("pid", "")])), None);
        assert_eq!(network_namespace(&sandbox(&[("network", " ")])), None);
        assert_eq!(network_namespace(&api::PodSandbox::new()), None);
    }

    #[test]
    fn interface_names_follow_the_kernels_rules() {
        assert_eq!(interface_name_problem("net1"), None);
        assert_eq!(interface_name_problem("fast0.100"), None);
        for bad in ["", ".", "..", "a/b", "a b", "a:b", "sixteen-chars-xx"] {
            assert!(interface_name_problem(bad).is_some(), "{bad:?}");
        }
        assert!(usable_uid("0b6f-11ee"));
        assert!(!usable_uid("../x") && !usable_uid("") && !usable_uid(".hidden"));
    }
}
