//! The resource manager: pure admission and allocation state, no I/O.
//!
//! [`ResourceManager::admit`] decides where a pod runs; [`ResourceManager::settings`] says what each
//! of its containers gets; [`ResourceManager::state`] / [`ResourceManager::restore`] carry the
//! decisions across restarts (see [`crate::checkpoint`]).
//!
//! # Decisions
//!
//! **Exclusive CPUs** follow kubelet's static CPU-manager rule: a container gets exclusive CPUs
//! when its pod is Guaranteed, the pod sets no pod-level resources, and the container's CPU request
//! is a whole number of CPUs (a multiple of 1000m); it gets `request / 1000` of them. Every other
//! container (fractional CPUs, Burstable, BestEffort) runs in the **shared pool** = online CPUs
//! minus every pod's exclusive CPUs. Reserved CPUs ([`OrmConfig::reserved`]) are never exclusive
//! and so always stay in the shared pool; an admission that would leave the shared pool empty is
//! refused.
//!
//! **Scope is the pod** (kubelet's `--topology-manager-scope=pod`): a pod's exclusive CPUs are taken
//! at once, as one set aligned by one merged NUMA hint, and then divided among its containers. The
//! set's size is kubelet's `podGuaranteedCPUs`: the larger of (a) app containers + sidecars and (b)
//! for each regular init container, its CPUs plus those of the sidecars declared before it.
//!
//! **Init containers**: sidecars and app containers get disjoint parts of the pod's set; each
//! regular init container gets its CPUs out of the set minus the sidecars declared before it, so it
//! reuses CPUs that app containers get later (it has finished by the time they start), as kubelet's
//! "CPUs to reuse" do. The pod holds its whole set until it is released, also when its init
//! containers needed more than its long-running containers.
//!
//! **NUMA alignment** ([`crate::policy`]): with any policy but `none`, hints come from the CPUs
//! (the pod's exclusive CPU count), the memory (when [`OrmConfig::align_memory`], for pods with
//! exclusive CPUs, on layouts that know every node's memory) and the devices ([`PodDevice::numa`]);
//! they are merged and the policy admits or refuses. CPUs are then taken from the best hint's nodes
//! first and, where they do not suffice (`best-effort`), from anywhere (kubelet's aligned-first
//! allocation). Under `none` CPUs are packed anywhere ([`crate::cpus`]).
//!
//! **Memory nodes (`cpuset.mems`)**, per pod: the NUMA nodes of its exclusive CPUs; for a pod
//! without exclusive CPUs whose devices have known NUMA nodes, under an aligning policy, those
//! nodes; otherwise every node. With memory alignment, a pod's memory request (kubelet's pod-level
//! rule, as for CPUs) is charged to its memory nodes in node order, up to each node's free memory
//! (the remainder on the first node), and counts against later memory hints until release.
//!
//! **CFS quota**: containers with exclusive CPUs get `-1` (no quota: a container alone on its
//! CPUs has nothing to be throttled for, and throttling hurts latency-sensitive GPU feeders; this is
//! what kubelet does with its `DisableCPUQuotaWithExclusiveCPUs` feature gate on). Other containers
//! get `limit × period / 1000` (at least 1000 µs, as kubelet), or `-1` without a CPU limit. The
//! period is [`OrmConfig::cfs_period_us`]. `memory_limit` is the container's memory limit;
//! `memory_high` is `limit × pct / 100` for containers with a memory limit in Burstable pods when
//! [`OrmConfig::memory_high_percent`] is set.
//!
//! **Environment** added to every container of an admitted pod, in this order:
//! - `WEFT_CPUS`: the container's CPUs in list format (for a shared container the pool at the time
//!   the settings are computed; the pool changes as exclusive pods come and go);
//! - `WEFT_NUMA_NODES`: its memory nodes;
//! - `WEFT_EXCLUSIVE_CPUS`: `true` or `false`;
//! - `OMP_NUM_THREADS`: the number of exclusive CPUs (exclusive containers only), so OpenMP
//!   runtimes do not start a thread per host CPU;
//! - `WEFT_GPU_IDS`: the pod's GPU indices, comma-separated (pods with GPUs only);
//! - `NCCL_SOCKET_IFNAME`: `=` + the pod-side interfaces of its NICs, comma-separated (the `=`
//!   makes NCCL match names exactly instead of as prefixes); only when NICs have interfaces;
//! - `NCCL_IB_HCA`: `=` + the RDMA devices of its NICs (exact match), only when NICs have them;
//! - `UCX_NET_DEVICES`: each RDMA device with port 1 (`mlx5_0:1,mlx5_1:1`), likewise.
//!
//! A container the pod's spec does not list (a pod admitted without a kubelet spec, an ephemeral
//! container) runs in the shared pool with its quota and memory left as the runtime set them.
//!
//! **Transactions**: [`ResourceManager::admit`] is idempotent (an admitted UID returns its existing
//! allocation, whatever the spec says now) and computes everything before it changes anything, so
//! a refused pod leaves the state as it was.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;
use weft_topology::{CpuLayout, CpuSet};

use crate::cpus::{self, difference, intersection, overlaps, union};
use crate::pod::{ContainerKind, ContainerSpec, DeviceKind, PodDevice, PodSpec, QosClass};
use crate::policy::{
    MAX_NUMA_NODES, NumaMask, ProviderHints, TopologyPolicy, cpu_hints, device_hints, memory_hints, merge,
};
use crate::settings::{ContainerSettings, DEFAULT_CFS_PERIOD_US};

/// Shortest CFS quota kubelet writes, µs (`MinQuotaPeriod`).
pub const MIN_CFS_QUOTA_US: i64 = 1000;

/// How the resource manager behaves on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrmConfig {
    /// System-reserved CPUs: never exclusive, always part of the shared pool.
    pub reserved: CpuSet,
    /// Topology policy.
    pub policy: TopologyPolicy,
    /// CFS period, µs (1000–1000000).
    pub cfs_period_us: u64,
    /// `memory.high` = memory limit × pct / 100 for Burstable containers with a memory limit
    /// (1–100); `None` leaves `memory.high` unset.
    pub memory_high_percent: Option<u8>,
    /// Whether memory takes part in NUMA alignment.
    pub align_memory: bool,
}

impl Default for OrmConfig {
    /// No reserved CPUs, `best-effort`, the default CFS period, no `memory.high`, no memory alignment.
    fn default() -> Self {
        OrmConfig {
            reserved: CpuSet::new(),
            policy: TopologyPolicy::BestEffort,
            cfs_period_us: DEFAULT_CFS_PERIOD_US,
            memory_high_percent: None,
            align_memory: false,
        }
    }
}

/// What one container got.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerAllocation {
    /// The container as admitted.
    pub spec: ContainerSpec,
    /// Its exclusive CPUs; empty when it runs in the shared pool.
    pub cpus: CpuSet,
}

impl ContainerAllocation {
    /// Whether the container has exclusive CPUs.
    pub fn is_exclusive(&self) -> bool {
        !self.cpus.is_empty()
    }
}

/// What one admitted pod got.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodAllocation {
    /// Pod UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// QoS class.
    pub qos: QosClass,
    /// Every exclusive CPU the pod holds (the union of its containers', init containers' included).
    pub exclusive: CpuSet,
    /// Its containers, in spec order.
    pub containers: Vec<ContainerAllocation>,
    /// Memory nodes for all its containers; `None` = every node.
    pub mems: Option<CpuSet>,
    /// NUMA nodes of the merged topology hint it was admitted with; `None` under policy `none`.
    pub affinity: Option<CpuSet>,
    /// Its devices, as located at admission.
    pub devices: Vec<PodDevice>,
    /// Memory charged per NUMA node, bytes (memory alignment only).
    #[serde(default)]
    pub memory_numa: BTreeMap<u32, u64>,
}

impl PodAllocation {
    /// `namespace/name`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Container `name`.
    pub fn container(&self, name: &str) -> Option<&ContainerAllocation> {
        self.containers.iter().find(|c| c.spec.name == name)
    }
}

/// A serialisable snapshot of every allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OrmState {
    /// Admitted pods, by UID.
    pub pods: Vec<PodAllocation>,
}

/// A configuration or restored state the manager cannot work with.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum OrmError {
    /// The configuration does not fit the layout.
    #[error("resource manager configuration: {0}")]
    Config(String),
    /// A restored pod allocation is inconsistent with the layout, the configuration or another pod.
    #[error("restoring pod {pod}: {why}")]
    Restore {
        /// `namespace/name (uid)`.
        pod: String,
        /// What is wrong.
        why: String,
    },
}

/// Why a pod was not admitted. Every variant names the pod (`namespace/name`).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum AdmitError {
    /// The spec itself is unusable.
    #[error("pod {pod}: {why}")]
    InvalidPod {
        /// `namespace/name`.
        pod: String,
        /// What is wrong.
        why: String,
    },
    /// Not enough free CPUs for the pod's exclusive CPUs.
    #[error(
        "pod {pod} needs {needed} exclusive CPUs ({containers}) but only {free} are free ({online} online, {reserved} reserved, {taken} exclusive to other pods)"
    )]
    InsufficientCpus {
        /// `namespace/name`.
        pod: String,
        /// Exclusive CPUs the pod needs.
        needed: u64,
        /// Which containers ask for them (`container a: 4, container b: 4`).
        containers: String,
        /// Free CPUs.
        free: usize,
        /// Online CPUs.
        online: usize,
        /// Reserved CPUs.
        reserved: usize,
        /// CPUs exclusive to other pods.
        taken: usize,
    },
    /// Taking the pod's CPUs would leave no CPU for the shared pool.
    #[error("pod {pod} needs {needed} exclusive CPUs, which would leave the shared pool empty (no CPUs are reserved)")]
    SharedPoolExhausted {
        /// `namespace/name`.
        pod: String,
        /// Exclusive CPUs the pod needs.
        needed: u64,
    },
    /// The topology policy refused the placement.
    #[error("topology policy {policy}: pod {pod} {reason}")]
    Topology {
        /// The policy.
        policy: TopologyPolicy,
        /// `namespace/name`.
        pod: String,
        /// The resource that could not be aligned: `cpu`, `memory` or `devices`.
        resource: String,
        /// Why, in words.
        reason: String,
    },
}

/// Why an in-place resize was refused: only what weft's own rules forbid. The message is what the
/// kubelet sees (containerd fails `UpdateContainerResources` with it).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("weft refuses the in-place resize of pod {pod} container {container}: {why}")]
pub struct ResizeError {
    /// `namespace/name`.
    pub pod: String,
    /// The container.
    pub container: String,
    /// Which rule forbids it.
    pub why: String,
}

/// Everything [`ResourceManager::admit`] decided, before it is committed.
struct Plan {
    alloc: PodAllocation,
}

/// The resource manager. See the module docs.
#[derive(Clone, Debug)]
pub struct ResourceManager {
    layout: CpuLayout,
    cfg: OrmConfig,
    all_numa: NumaMask,
    online: CpuSet,
    pods: BTreeMap<String, PodAllocation>,
    exclusive: CpuSet,
    memory_used: BTreeMap<u32, u64>,
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// kubelet's pod-level amount: max(app + sidecars, max over init containers of (sidecars declared
/// before it + itself)), with `amount` per container, in `containers` order.
fn pod_level_amount(containers: &[ContainerSpec], amount: impl Fn(&ContainerSpec) -> u64) -> u64 {
    let mut sidecars = 0u64;
    let mut apps = 0u64;
    let mut inits = 0u64;
    for c in containers {
        let a = amount(c);
        match c.kind {
            ContainerKind::Sidecar => sidecars = sidecars.saturating_add(a),
            ContainerKind::Init => inits = inits.max(sidecars.saturating_add(a)),
            ContainerKind::App => apps = apps.saturating_add(a),
        }
    }
    apps.saturating_add(sidecars).max(inits)
}

/// kubelet's `MilliCPUToQuota`.
fn quota_for(limit_milli: u64, period_us: u64) -> i64 {
    let quota = u128::from(limit_milli) * u128::from(period_us) / 1000;
    i64::try_from(quota).unwrap_or(i64::MAX).max(MIN_CFS_QUOTA_US)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl ResourceManager {
    /// A manager with nothing admitted. Fails when a reserved CPU is not online, the CFS period is
    /// outside 1000–1000000 µs, `memory_high_percent` is outside 1–100, a NUMA node id is 64 or more,
    /// or an aligning policy is asked for on more than [`MAX_NUMA_NODES`] NUMA nodes (as kubelet).
    pub fn new(layout: CpuLayout, cfg: OrmConfig) -> Result<ResourceManager, OrmError> {
        let online = layout.online();
        if online.is_empty() {
            return Err(OrmError::Config("the CPU layout has no CPU".into()));
        }
        let stray = difference(&cfg.reserved, &online);
        if !stray.is_empty() {
            return Err(OrmError::Config(format!("reserved CPUs {stray} are not online (online: {online})")));
        }
        if !(1000..=1_000_000).contains(&cfg.cfs_period_us) {
            return Err(OrmError::Config(format!("CFS period {} µs is outside 1000–1000000 µs", cfg.cfs_period_us)));
        }
        if let Some(p) = cfg.memory_high_percent
            && !(1..=100).contains(&p)
        {
            return Err(OrmError::Config(format!("memory.high percentage {p} is outside 1–100")));
        }
        let nodes = layout.numa_nodes();
        let all_numa = NumaMask::from_nodes(nodes.iter().copied()).ok_or_else(|| {
            OrmError::Config(format!("NUMA node ids {nodes:?} include one of 64 or more, which is not supported"))
        })?;
        if cfg.policy.aligns() && nodes.len() > MAX_NUMA_NODES {
            return Err(OrmError::Config(format!(
                "topology policy {} handles at most {MAX_NUMA_NODES} NUMA nodes; this node has {}",
                cfg.policy,
                nodes.len()
            )));
        }
        Ok(ResourceManager {
            layout,
            cfg,
            all_numa,
            online,
            pods: BTreeMap::new(),
            exclusive: CpuSet::new(),
            memory_used: BTreeMap::new(),
        })
    }

    /// A manager holding the allocations of `state` (a checkpoint), validated: every CPU exists
    /// and is not reserved, no CPU belongs to two pods, container CPUs lie within their pod's,
    /// long-running containers do not share CPUs, memory nodes exist, UIDs are unique, and the shared
    /// pool is not empty. The error names the first offending pod.
    pub fn restore(layout: CpuLayout, cfg: OrmConfig, state: OrmState) -> Result<ResourceManager, OrmError> {
        let mut rm = ResourceManager::new(layout, cfg)?;
        for pod in state.pods {
            let label = format!("{}/{} ({})", pod.namespace, pod.name, pod.uid);
            let bad = |why: String| OrmError::Restore { pod: label.clone(), why };
            if pod.uid.is_empty() {
                return Err(bad("empty UID".into()));
            }
            if rm.pods.contains_key(&pod.uid) {
                return Err(bad("UID listed twice".into()));
            }
            let stray = difference(&pod.exclusive, &rm.online);
            if !stray.is_empty() {
                return Err(bad(format!("exclusive CPUs {stray} are not online")));
            }
            let reserved = intersection(&pod.exclusive, &rm.cfg.reserved);
            if !reserved.is_empty() {
                return Err(bad(format!("exclusive CPUs {reserved} are reserved")));
            }
            if let Some(other) = rm.pods.values().find(|o| overlaps(&o.exclusive, &pod.exclusive)) {
                let shared = intersection(&other.exclusive, &pod.exclusive);
                return Err(bad(format!(
                    "exclusive CPUs {shared} also belong to pod {}/{} ({})",
                    other.namespace, other.name, other.uid
                )));
            }
            let mut long_running = CpuSet::new();
            let mut names = BTreeSet::new();
            for c in &pod.containers {
                if !names.insert(c.spec.name.as_str()) {
                    return Err(bad(format!("container {} is listed twice", c.spec.name)));
                }
                let outside = difference(&c.cpus, &pod.exclusive);
                if !outside.is_empty() {
                    return Err(bad(format!("container {} has CPUs {outside} outside the pod's", c.spec.name)));
                }
                if c.spec.kind != ContainerKind::Init {
                    if overlaps(&long_running, &c.cpus) {
                        return Err(bad(format!(
                            "container {} shares exclusive CPUs {} with another container",
                            c.spec.name,
                            intersection(&long_running, &c.cpus)
                        )));
                    }
                    long_running = union(&long_running, &c.cpus);
                }
            }
            let mems_nodes: Vec<u32> =
                pod.mems.iter().flat_map(|m| m.iter()).chain(pod.memory_numa.keys().copied()).collect();
            if let Some(n) = mems_nodes.iter().find(|n| !rm.all_numa.contains(**n)) {
                return Err(bad(format!("NUMA node {n} does not exist")));
            }
            rm.commit(pod);
        }
        if rm.shared_pool().is_empty() {
            return Err(OrmError::Config("the restored allocations leave the shared pool empty".into()));
        }
        Ok(rm)
    }

    /// The CPU layout.
    pub fn layout(&self) -> &CpuLayout {
        &self.layout
    }

    /// The configuration.
    pub fn config(&self) -> &OrmConfig {
        &self.cfg
    }

    /// Admit `pod` with `devices` (see the module docs); idempotent for an admitted UID. A refused
    /// pod changes nothing.
    pub fn admit(&mut self, pod: &PodSpec, devices: &[PodDevice]) -> Result<&PodAllocation, AdmitError> {
        if self.pods.contains_key(&pod.uid) {
            return Ok(&self.pods[&pod.uid]);
        }
        let Plan { alloc } = self.plan(pod, devices)?;
        let uid = alloc.uid.clone();
        self.commit(alloc);
        Ok(&self.pods[&uid])
    }

    /// Follow an in-place resize of admitted pod `pod.uid` (the kubelet's new spec): each
    /// long-running container of the allocation takes its new CPU and memory requests and limits,
    /// so its settings (quota, memory limit, `memory.high`) follow. Refused, changing nothing, when
    /// weft's rules forbid it:
    /// - the container's number of exclusive CPUs would change (a Guaranteed integer-CPU
    ///   container resized to another count, to a fraction, or a shared container resized to a
    ///   whole number in a Guaranteed pod): exclusive CPUs are fixed at admission, as the kubelet's
    ///   static CPU manager keeps them (it marks such resizes infeasible);
    /// - the pod's memory request would change while it is charged to NUMA nodes (memory
    ///   alignment), as the kubelet's static memory manager refuses.
    ///
    /// Init containers are not resized. Returns whether anything changed; `Ok(false)` for a pod
    /// that is not admitted.
    pub fn resize(&mut self, pod: &PodSpec) -> Result<bool, ResizeError> {
        let Some(alloc) = self.pods.get(&pod.uid) else { return Ok(false) };
        let label = alloc.label();
        let mut updated = alloc.containers.clone();
        let mut changed = false;
        for (c, new) in updated.iter_mut().filter_map(|c| {
            let new = pod.containers.iter().find(|n| n.name == c.spec.name && c.spec.kind != ContainerKind::Init)?;
            Some((c, new))
        }) {
            let refuse = |why: String| ResizeError { pod: label.clone(), container: c.spec.name.clone(), why };
            let had = c.cpus.len() as u64;
            let want = Self::exclusive_count(pod, new);
            if had != want {
                let now = if had == 0 {
                    "it runs in the shared pool".to_string()
                } else {
                    format!("it has {had} exclusive CPUs")
                };
                let then = if want == 0 { "the shared pool".to_string() } else { format!("{want} exclusive CPUs") };
                return Err(refuse(format!(
                    "{now} and a CPU request of {} m would need {then}; weft fixes a container's exclusive CPUs at \
                     admission, as the kubelet's static CPU manager does (re-create the pod to change them)",
                    new.cpu_request_milli
                )));
            }
            let spec = ContainerSpec { name: c.spec.name.clone(), kind: c.spec.kind, ..new.clone() };
            if spec != c.spec {
                c.spec = spec;
                changed = true;
            }
        }
        if !alloc.memory_numa.is_empty() {
            let before = pod_level_amount(&alloc.containers.iter().map(|c| c.spec.clone()).collect::<Vec<_>>(), |c| {
                c.memory_request
            });
            let after =
                pod_level_amount(&updated.iter().map(|c| c.spec.clone()).collect::<Vec<_>>(), |c| c.memory_request);
            if before != after {
                let nodes: Vec<String> = alloc.memory_numa.keys().map(ToString::to_string).collect();
                let container = updated
                    .iter()
                    .zip(&alloc.containers)
                    .find(|(n, o)| n.spec.memory_request != o.spec.memory_request)
                    .map(|(n, _)| n.spec.name.clone())
                    .unwrap_or_default();
                return Err(ResizeError {
                    pod: label,
                    container,
                    why: format!(
                        "its memory is charged to NUMA node(s) {} at admission (memory alignment) and its memory \
                         request would change from {before} to {after} bytes, as the kubelet's static memory \
                         manager refuses too",
                        nodes.join(",")
                    ),
                });
            }
        }
        if changed && let Some(alloc) = self.pods.get_mut(&pod.uid) {
            alloc.containers = updated;
        }
        Ok(changed)
    }

    /// Release pod `uid`: its exclusive CPUs return to the shared pool, its memory charge is dropped.
    pub fn release(&mut self, uid: &str) -> Option<PodAllocation> {
        let alloc = self.pods.remove(uid)?;
        self.exclusive = difference(&self.exclusive, &alloc.exclusive);
        for (node, bytes) in &alloc.memory_numa {
            if let Some(used) = self.memory_used.get_mut(node) {
                *used = used.saturating_sub(*bytes);
            }
        }
        Some(alloc)
    }

    /// The allocation of pod `uid`.
    pub fn allocation(&self, uid: &str) -> Option<&PodAllocation> {
        self.pods.get(uid)
    }

    /// Every admitted pod, by UID.
    pub fn pods(&self) -> impl Iterator<Item = &PodAllocation> {
        self.pods.values()
    }

    /// Every online CPU minus the exclusive ones (reserved CPUs included).
    pub fn shared_pool(&self) -> CpuSet {
        difference(&self.online, &self.exclusive)
    }

    /// Every exclusive CPU of every pod.
    pub fn exclusive_cpus(&self) -> &CpuSet {
        &self.exclusive
    }

    /// CPUs that can still become exclusive: online, not reserved, not exclusive.
    pub fn free_cpus(&self) -> CpuSet {
        difference(&difference(&self.online, &self.cfg.reserved), &self.exclusive)
    }

    /// Memory charged per NUMA node (memory alignment).
    pub fn memory_used(&self) -> &BTreeMap<u32, u64> {
        &self.memory_used
    }

    /// A snapshot of every allocation.
    pub fn state(&self) -> OrmState {
        OrmState { pods: self.pods.values().cloned().collect() }
    }

    /// The settings of container `container` of pod `uid` now (see the module docs); `None` when the
    /// pod is not admitted.
    pub fn settings(&self, uid: &str, container: &str) -> Option<ContainerSettings> {
        let pod = self.pods.get(uid)?;
        let mems = pod.mems.clone().unwrap_or_else(|| self.all_numa.to_cpuset());
        let period = self.cfg.cfs_period_us;
        let Some(c) = pod.container(container) else {
            let cpus = self.shared_pool();
            let env = env_for(pod, &cpus, &mems, None);
            return Some(ContainerSettings { cpus, mems, env, ..ContainerSettings::default() });
        };
        let exclusive = c.is_exclusive();
        let cpus = if exclusive { c.cpus.clone() } else { self.shared_pool() };
        let cpu_quota = if exclusive {
            -1
        } else {
            match c.spec.cpu_limit_milli {
                Some(l) if l > 0 => quota_for(l, period),
                _ => -1,
            }
        };
        let memory_high = match (pod.qos, c.spec.memory_limit, self.cfg.memory_high_percent) {
            (QosClass::Burstable, Some(limit), Some(pct)) if limit > 0 => {
                Some(i64::try_from(u128::from(limit) * u128::from(pct) / 100).unwrap_or(i64::MAX))
            }
            _ => None,
        };
        let env = env_for(pod, &cpus, &mems, exclusive.then_some(c.cpus.len()));
        Some(ContainerSettings {
            cpus,
            mems,
            cpu_quota: Some(cpu_quota),
            cpu_period: Some(period),
            memory_limit: c.spec.memory_limit.map(to_i64),
            memory_high,
            env,
        })
    }

    fn commit(&mut self, alloc: PodAllocation) {
        self.exclusive = union(&self.exclusive, &alloc.exclusive);
        for (node, bytes) in &alloc.memory_numa {
            let used = self.memory_used.entry(*node).or_default();
            *used = used.saturating_add(*bytes);
        }
        self.pods.insert(alloc.uid.clone(), alloc);
    }

    /// Exclusive CPUs container `c` of `pod` gets under the static-policy rule.
    fn exclusive_count(pod: &PodSpec, c: &ContainerSpec) -> u64 {
        if pod.qos == QosClass::Guaranteed
            && !pod.pod_level_resources
            && c.cpu_request_milli > 0
            && c.cpu_request_milli.is_multiple_of(1000)
        {
            c.cpu_request_milli / 1000
        } else {
            0
        }
    }

    /// Free memory per node (capacity minus charges), where capacity is known.
    fn memory_free(&self) -> BTreeMap<u32, u64> {
        self.layout
            .numa_memories()
            .iter()
            .map(|(n, cap)| (*n, cap.saturating_sub(self.memory_used.get(n).copied().unwrap_or(0))))
            .collect()
    }

    /// Whether every NUMA node's memory is known.
    fn memory_known(&self) -> bool {
        self.all_numa.nodes().all(|n| self.layout.numa_memory(n).is_some())
    }

    fn plan(&self, pod: &PodSpec, devices: &[PodDevice]) -> Result<Plan, AdmitError> {
        let label = pod.label();
        let invalid = |why: String| AdmitError::InvalidPod { pod: label.clone(), why };
        if pod.uid.is_empty() {
            return Err(invalid("empty UID".into()));
        }
        let mut names = BTreeSet::new();
        for c in &pod.containers {
            if c.name.is_empty() {
                return Err(invalid("a container has no name".into()));
            }
            if !names.insert(c.name.as_str()) {
                return Err(invalid(format!("container name {} is used twice", c.name)));
            }
        }

        let counts: Vec<u64> = pod.containers.iter().map(|c| Self::exclusive_count(pod, c)).collect();
        let needed = pod_level_amount(&pod.containers, |c| Self::exclusive_count(pod, c));
        let free = self.free_cpus();
        if needed > free.len() as u64 {
            let containers = pod
                .containers
                .iter()
                .zip(&counts)
                .filter(|(_, n)| **n > 0)
                .map(|(c, n)| format!("container {}: {n}", c.name))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(AdmitError::InsufficientCpus {
                pod: label,
                needed,
                containers,
                free: free.len(),
                online: self.online.len(),
                reserved: self.cfg.reserved.len(),
                taken: self.exclusive.len(),
            });
        }
        // needed <= free.len(), so it fits in usize.
        let n = usize::try_from(needed).unwrap_or(usize::MAX);
        if n > 0 && self.shared_pool().len() <= n {
            return Err(AdmitError::SharedPoolExhausted { pod: label, needed });
        }

        let device_mask = NumaMask::from_nodes(devices.iter().filter_map(|d| d.numa).filter(|n| *n < 64))
            .unwrap_or_default()
            .and(self.all_numa);
        let memory_request = if n > 0 { pod_level_amount(&pod.containers, |c| c.memory_request) } else { 0 };
        let align_memory = self.cfg.align_memory && memory_request > 0 && self.memory_known();

        let affinity = if self.cfg.policy.aligns() {
            let mem = if align_memory {
                let capacity = self.layout.numa_memories().clone();
                memory_hints(self.all_numa, &capacity, &self.memory_free(), memory_request)
            } else {
                ProviderHints::DontCare
            };
            let providers = [
                ("devices", device_hints(self.all_numa, device_mask)),
                ("cpu", cpu_hints(&self.layout, self.all_numa, &free, n)),
                ("memory", mem),
            ];
            let hints: Vec<ProviderHints> = providers.iter().map(|(_, h)| h.clone()).collect();
            let best = merge(self.cfg.policy, self.all_numa, &hints);
            if !self.cfg.policy.admits(&best) {
                return Err(self.explain(pod, devices, device_mask, n, memory_request, &free, &providers));
            }
            Some(best.mask)
        } else {
            None
        };

        let pool = if n == 0 {
            CpuSet::new()
        } else {
            let preferred: Option<CpuSet> = affinity
                .map(|m| free.iter().filter(|c| self.layout.cpu(*c).is_some_and(|i| m.contains(i.numa))).collect());
            cpus::allocate(&self.layout, &free, preferred.as_ref(), n).map_err(|e| AdmitError::InsufficientCpus {
                pod: label.clone(),
                needed,
                containers: String::new(),
                free: e.available,
                online: self.online.len(),
                reserved: self.cfg.reserved.len(),
                taken: self.exclusive.len(),
            })?
        };

        // Divide the pod's set among its containers.
        let mut long_running = CpuSet::new();
        let mut sidecars = CpuSet::new();
        let mut containers = Vec::with_capacity(pod.containers.len());
        for (c, k) in pod.containers.iter().zip(&counts) {
            let k = usize::try_from(*k).unwrap_or(usize::MAX);
            let cpus = if k == 0 {
                CpuSet::new()
            } else {
                let from = match c.kind {
                    ContainerKind::Init => difference(&pool, &sidecars),
                    ContainerKind::Sidecar | ContainerKind::App => difference(&pool, &long_running),
                };
                let got = cpus::take_by_topology(&self.layout, &from, k).map_err(|e| AdmitError::InsufficientCpus {
                    pod: label.clone(),
                    needed: *counts.iter().max().unwrap_or(&0),
                    containers: format!("container {}: {k}", c.name),
                    free: e.available,
                    online: self.online.len(),
                    reserved: self.cfg.reserved.len(),
                    taken: self.exclusive.len(),
                })?;
                if c.kind != ContainerKind::Init {
                    long_running = union(&long_running, &got);
                }
                if c.kind == ContainerKind::Sidecar {
                    sidecars = union(&sidecars, &got);
                }
                got
            };
            containers.push(ContainerAllocation { spec: c.clone(), cpus });
        }

        let mems: Option<CpuSet> = if n > 0 {
            Some(pool.iter().filter_map(|c| self.layout.cpu(c)).map(|c| c.numa).collect())
        } else if self.cfg.policy.aligns() && !device_mask.is_empty() {
            Some(device_mask.to_cpuset())
        } else {
            None
        };

        let mut memory_numa = BTreeMap::new();
        if align_memory && let Some(mems) = &mems {
            let free_mem = self.memory_free();
            let mut left = memory_request;
            for node in mems.iter() {
                let take = left.min(free_mem.get(&node).copied().unwrap_or(0));
                if take > 0 {
                    memory_numa.insert(node, take);
                    left -= take;
                }
            }
            if left > 0
                && let Some(first) = mems.iter().next()
            {
                let e = memory_numa.entry(first).or_insert(0);
                *e = e.saturating_add(left);
            }
        }

        Ok(Plan {
            alloc: PodAllocation {
                uid: pod.uid.clone(),
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                qos: pod.qos,
                exclusive: pool,
                containers,
                mems,
                affinity: affinity.map(NumaMask::to_cpuset),
                devices: devices.to_vec(),
                memory_numa,
            },
        })
    }

    /// The refusal of a pod the policy did not admit: the first provider (devices, then CPUs, then
    /// memory) whose hints, merged with those before it, leave no admissible placement is named,
    /// with the numbers that show why.
    #[allow(clippy::too_many_arguments)]
    fn explain(
        &self,
        pod: &PodSpec,
        devices: &[PodDevice],
        device_mask: NumaMask,
        n: usize,
        memory_request: u64,
        free: &CpuSet,
        providers: &[(&str, ProviderHints)],
    ) -> AdmitError {
        let policy = self.cfg.policy;
        let single = policy == TopologyPolicy::SingleNumaNode;
        let mut culprit = providers.last().map_or("cpu", |(name, _)| *name);
        for i in 0..providers.len() {
            let upto: Vec<ProviderHints> = providers[..=i].iter().map(|(_, h)| h.clone()).collect();
            if !policy.admits(&merge(policy, self.all_numa, &upto)) {
                culprit = providers[i].0;
                break;
            }
        }
        let dev = describe_devices(devices, self.all_numa);
        let with_dev = if device_mask.is_empty() { String::new() } else { format!(" with {dev}") };
        // Where the resource had to fit: one node, the devices' nodes, or as few nodes as could hold it.
        let place = |capacity: Vec<u128>, request: u128| {
            if single {
                "on one NUMA node".to_string()
            } else if !device_mask.is_empty() {
                "aligned".to_string()
            } else {
                let w = narrowest_width(capacity, request);
                format!("within {}", plural(u64::from(w), "NUMA node", "NUMA nodes"))
            }
        };
        let cpu_capacity: Vec<u128> = self.all_numa.nodes().map(|x| self.layout.numa_cpus(x).len() as u128).collect();
        let mem_capacity: Vec<u128> =
            self.all_numa.nodes().map(|x| u128::from(self.layout.numa_memory(x).unwrap_or(0))).collect();
        let free_on =
            |m: NumaMask| free.iter().filter(|c| self.layout.cpu(*c).is_some_and(|i| m.contains(i.numa))).count();
        let mem_free = self.memory_free();
        let mem_on = |m: NumaMask| m.nodes().map(|n| mem_free.get(&n).copied().unwrap_or(0)).sum::<u64>();
        let verb = |m: NumaMask| if m.count() == 1 { "has" } else { "have" };
        let per_node = |f: &dyn Fn(NumaMask) -> String| {
            self.all_numa
                .nodes()
                .filter_map(|node| NumaMask::from_nodes([node]).map(|m| format!("NUMA {node}: {}", f(m))))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let reason = match culprit {
            "devices" => format!(
                "holds {dev}, which span {} NUMA nodes; no single NUMA node holds them all",
                device_mask.count()
            ),
            "cpu" => {
                let want = plural(n as u64, "exclusive CPU", "exclusive CPUs");
                let place = place(cpu_capacity, n as u128);
                if !device_mask.is_empty() {
                    format!(
                        "needs {want} {place}{with_dev} but NUMA {device_mask} {} {} free",
                        verb(device_mask),
                        free_on(device_mask)
                    )
                } else {
                    format!(
                        "needs {want} {place} but no NUMA placement the policy accepts has that many free ({})",
                        per_node(&|m| format!(
                            "{} free of {}",
                            free_on(m),
                            m.nodes().map(|x| self.layout.numa_cpus(x).len()).sum::<usize>()
                        ))
                    )
                }
            }
            _ => {
                let want = format!("{memory_request} bytes of memory");
                let place = place(mem_capacity, u128::from(memory_request));
                if !device_mask.is_empty() {
                    format!(
                        "needs {want} {place}{with_dev} but NUMA {device_mask} {} {} bytes free",
                        verb(device_mask),
                        mem_on(device_mask)
                    )
                } else {
                    format!(
                        "needs {want} {place} with its {} but no NUMA placement the policy accepts has both free ({})",
                        plural(n as u64, "exclusive CPU", "exclusive CPUs"),
                        per_node(&|m| format!("{} CPUs and {} bytes free", free_on(m), mem_on(m)))
                    )
                }
            }
        };
        AdmitError::Topology { policy, pod: pod.label(), resource: culprit.to_string(), reason }
    }
}

/// The fewest NUMA nodes whose `capacity` together reaches `request` (all of them when none do).
fn narrowest_width(mut capacity: Vec<u128>, request: u128) -> u32 {
    capacity.sort_unstable_by(|a, b| b.cmp(a));
    let mut sum = 0u128;
    for (i, c) in capacity.iter().enumerate() {
        sum += c;
        if sum >= request {
            return u32::try_from(i + 1).unwrap_or(u32::MAX);
        }
    }
    u32::try_from(capacity.len()).unwrap_or(u32::MAX)
}

/// `GPUs 0,1 and NIC 0000:3b:00.1 (NUMA 0)`: the devices with a known NUMA node on the layout.
fn describe_devices(devices: &[PodDevice], all: NumaMask) -> String {
    let located: Vec<&PodDevice> = devices.iter().filter(|d| d.numa.is_some_and(|n| all.contains(n))).collect();
    let mut parts = Vec::new();
    for (kind, one, many) in [(DeviceKind::Gpu, "GPU", "GPUs"), (DeviceKind::Nic, "NIC", "NICs")] {
        let ids: Vec<&str> = located.iter().filter(|d| d.kind == kind).map(|d| d.id.as_str()).collect();
        if !ids.is_empty() {
            parts.push(format!("{} {}", if ids.len() == 1 { one } else { many }, ids.join(",")));
        }
    }
    let nodes: CpuSet = located.iter().filter_map(|d| d.numa).collect();
    format!("{} (NUMA {nodes})", parts.join(" and "))
}

/// The environment of a container of `pod` with `cpus` and `mems`; `exclusive` = its exclusive CPU
/// count, if any (see the module docs).
fn env_for(pod: &PodAllocation, cpus: &CpuSet, mems: &CpuSet, exclusive: Option<usize>) -> Vec<(String, String)> {
    let mut env = vec![
        ("WEFT_CPUS".to_string(), cpus.to_string()),
        ("WEFT_NUMA_NODES".to_string(), mems.to_string()),
        ("WEFT_EXCLUSIVE_CPUS".to_string(), exclusive.is_some().to_string()),
    ];
    if let Some(n) = exclusive {
        env.push(("OMP_NUM_THREADS".to_string(), n.to_string()));
    }
    let gpus: Vec<&str> = pod.devices.iter().filter(|d| d.kind == DeviceKind::Gpu).map(|d| d.id.as_str()).collect();
    if !gpus.is_empty() {
        env.push(("WEFT_GPU_IDS".to_string(), gpus.join(",")));
    }
    let nics = pod.devices.iter().filter(|d| d.kind == DeviceKind::Nic);
    let ifaces: Vec<&str> = nics.clone().filter_map(|d| d.interface.as_deref()).collect();
    if !ifaces.is_empty() {
        env.push(("NCCL_SOCKET_IFNAME".to_string(), format!("={}", ifaces.join(","))));
    }
    let mut hcas: Vec<&str> = Vec::new();
    for h in nics.filter_map(|d| d.rdma_device.as_deref()) {
        if !hcas.contains(&h) {
            hcas.push(h);
        }
    }
    if !hcas.is_empty() {
        env.push(("NCCL_IB_HCA".to_string(), format!("={}", hcas.join(","))));
        env.push(("UCX_NET_DEVICES".to_string(), hcas.iter().map(|h| format!("{h}:1")).collect::<Vec<_>>().join(",")));
    }
    env
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    fn container(
        name: &str,
        kind: ContainerKind,
        cpu: u64,
        cpu_limit: Option<u64>,
        mem: u64,
        mem_limit: Option<u64>,
    ) -> ContainerSpec {
        ContainerSpec {
            name: name.into(),
            kind,
            cpu_request_milli: cpu,
            cpu_limit_milli: cpu_limit,
            memory_request: mem,
            memory_limit: mem_limit,
        }
    }

    /// A Guaranteed app container with `cpus` CPUs (millicores) and `mem` bytes.
    fn g(name: &str, milli: u64, mem: u64) -> ContainerSpec {
        container(name, ContainerKind::App, milli, Some(milli), mem, Some(mem))
    }

    fn pod(uid: &str, qos: QosClass, containers: Vec<ContainerSpec>) -> PodSpec {
        PodSpec {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            qos,
            containers,
            annotations: BTreeMap::new(),
            pod_level_resources: false,
        }
    }

    fn gpu(id: u32, numa: u32) -> PodDevice {
        PodDevice { kind: DeviceKind::Gpu, id: id.to_string(), numa: Some(numa), interface: None, rdma_device: None }
    }

    fn cfg(policy: TopologyPolicy) -> OrmConfig {
        OrmConfig { policy, ..OrmConfig::default() }
    }

    /// 2 sockets × 1 NUMA × 8 cores × 2 threads: NUMA 0 = 0-7,16-23; NUMA 1 = 8-15,24-31.
    fn rm(policy: TopologyPolicy) -> ResourceManager {
        ResourceManager::new(CpuLayout::synthetic(2, 1, 8, 2).unwrap(), cfg(policy)).unwrap()
    }

    fn env<'a>(s: &'a ContainerSettings, key: &str) -> Option<&'a str> {
        s.env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn resize_follows_new_limits_and_refuses_what_would_change_exclusive_cpus() {
        let mut rm = rm(TopologyPolicy::BestEffort);
        let mib = 1 << 20;
        rm.admit(&pod("p", QosClass::Guaranteed, vec![g("main", 2000, 64 * mib)]), &[]).unwrap();
        let cpus = rm.allocation("p").unwrap().exclusive.clone();

        // Memory 64 -> 128 MiB: followed; the exclusive CPUs stay.
        assert!(rm.resize(&pod("p", QosClass::Guaranteed, vec![g("main", 2000, 128 * mib)])).unwrap());
        let s = rm.settings("p", "main").unwrap();
        assert_eq!((s.memory_limit, s.cpus.clone(), s.cpu_quota), (Some(128 << 20), cpus.clone(), Some(-1)));
        assert!(!rm.resize(&pod("p", QosClass::Guaranteed, vec![g("main", 2000, 128 * mib)])).unwrap(), "no change");

        // 2 -> 3 CPUs, or to a fraction: refused, nothing changed.
        for milli in [3000, 1500] {
            let e = rm.resize(&pod("p", QosClass::Guaranteed, vec![g("main", milli, 32 * mib)])).unwrap_err();
            assert_eq!((e.pod.as_str(), e.container.as_str()), ("ns/p", "main"));
            assert!(e.to_string().contains("it has 2 exclusive CPUs"), "{e}");
            assert_eq!(rm.settings("p", "main").unwrap().memory_limit, Some(128 << 20));
        }

        // A shared container in a Guaranteed pod resized to a whole CPU would need exclusive CPUs.
        rm.admit(&pod("q", QosClass::Guaranteed, vec![g("main", 500, mib)]), &[]).unwrap();
        let e = rm.resize(&pod("q", QosClass::Guaranteed, vec![g("main", 1000, mib)])).unwrap_err().to_string();
        assert!(e.contains("shared pool") && e.contains("1 exclusive CPUs"), "{e}");

        // A Burstable container's CPU limit: the quota follows.
        let b = |limit| container("main", ContainerKind::App, 500, Some(limit), mib, Some(mib));
        rm.admit(&pod("b", QosClass::Burstable, vec![b(1000)]), &[]).unwrap();
        assert!(rm.resize(&pod("b", QosClass::Burstable, vec![b(2000)])).unwrap());
        assert_eq!(rm.settings("b", "main").unwrap().cpu_quota, Some(200_000));

        // Not admitted: nothing to do.
        assert!(!rm.resize(&pod("nope", QosClass::Burstable, vec![b(2000)])).unwrap());
    }

    #[test]
    fn resize_of_numa_charged_memory_is_refused() {
        let layout = CpuLayout::synthetic(2, 1, 8, 2).unwrap().with_memory_per_numa(64 << 30);
        let mut rm =
            ResourceManager::new(layout, OrmConfig { align_memory: true, ..cfg(TopologyPolicy::BestEffort) }).unwrap();
        rm.admit(&pod("p", QosClass::Guaranteed, vec![g("main", 2000, 1 << 30)]), &[]).unwrap();
        assert!(!rm.allocation("p").unwrap().memory_numa.is_empty());
        let e = rm.resize(&pod("p", QosClass::Guaranteed, vec![g("main", 2000, 2 << 30)])).unwrap_err().to_string();
        assert!(e.contains("NUMA node(s) 0") && e.contains("memory alignment"), "{e}");
        assert_eq!(rm.settings("p", "main").unwrap().memory_limit, Some(1 << 30));
    }

    #[test]
    fn config_is_validated() {
        let layout = || CpuLayout::synthetic(1, 1, 2, 1).unwrap();
        let bad = |c: OrmConfig| ResourceManager::new(layout(), c).unwrap_err().to_string();
        assert!(bad(OrmConfig { reserved: set("1-2"), ..OrmConfig::default() }).contains("reserved CPUs 2"));
        assert!(bad(OrmConfig { cfs_period_us: 10, ..OrmConfig::default() }).contains("CFS period"));
        assert!(bad(OrmConfig { memory_high_percent: Some(0), ..OrmConfig::default() }).contains("memory.high"));
        assert!(bad(OrmConfig { memory_high_percent: Some(101), ..OrmConfig::default() }).contains("memory.high"));
        let nine = || CpuLayout::synthetic(1, 9, 1, 1).unwrap();
        let e = ResourceManager::new(nine(), cfg(TopologyPolicy::Restricted)).unwrap_err().to_string();
        assert!(e.contains("at most 8 NUMA nodes") && e.contains("restricted"), "{e}");
        assert!(ResourceManager::new(nine(), cfg(TopologyPolicy::None)).is_ok());
    }

    #[test]
    fn guaranteed_integer_pod_gets_whole_cores_and_its_settings() {
        let mut m = rm(TopologyPolicy::BestEffort);
        let a = m.admit(&pod("a", QosClass::Guaranteed, vec![g("main", 4000, 1 << 30)]), &[]).unwrap().clone();
        assert_eq!(a.exclusive, set("0-1,16-17"));
        assert_eq!(a.mems, Some(set("0")));
        assert_eq!(m.shared_pool(), set("2-15,18-31"));
        let s = m.settings("a", "main").unwrap();
        assert_eq!(s.cpus, set("0-1,16-17"));
        assert_eq!(s.mems, set("0"));
        assert_eq!((s.cpu_quota, s.cpu_period), (Some(-1), Some(DEFAULT_CFS_PERIOD_US)));
        assert_eq!((s.memory_limit, s.memory_high), (Some(1 << 30), None));
        assert_eq!(
            s.env,
            vec![
                ("WEFT_CPUS".to_string(), "0-1,16-17".to_string()),
                ("WEFT_NUMA_NODES".to_string(), "0".to_string()),
                ("WEFT_EXCLUSIVE_CPUS".to_string(), "true".to_string()),
                ("OMP_NUM_THREADS".to_string(), "4".to_string()),
            ]
        );
        assert!(m.settings("a", "main").unwrap() == s, "settings are stable");
        assert!(m.settings("nope", "main").is_none());
    }

    #[test]
    fn burstable_and_fractional_containers_share_the_pool() {
        let mut m = ResourceManager::new(
            CpuLayout::synthetic(2, 1, 8, 2).unwrap(),
            OrmConfig { memory_high_percent: Some(80), reserved: set("0"), ..OrmConfig::default() },
        )
        .unwrap();
        let b = pod(
            "b",
            QosClass::Burstable,
            vec![
                container("web", ContainerKind::App, 250, Some(1500), 100, Some(1000)),
                container("log", ContainerKind::App, 100, None, 0, None),
            ],
        );
        let alloc = m.admit(&b, &[]).unwrap();
        assert!(alloc.exclusive.is_empty() && alloc.mems.is_none());
        let web = m.settings("b", "web").unwrap();
        assert_eq!(web.cpus, m.shared_pool());
        assert_eq!(web.cpus.len(), 32);
        assert_eq!(web.mems, set("0-1"));
        assert_eq!(web.cpu_quota, Some(150_000));
        assert_eq!((web.memory_limit, web.memory_high), (Some(1000), Some(800)));
        assert_eq!(env(&web, "WEFT_EXCLUSIVE_CPUS"), Some("false"));
        assert_eq!(env(&web, "OMP_NUM_THREADS"), None);
        let log = m.settings("b", "log").unwrap();
        assert_eq!((log.cpu_quota, log.memory_limit, log.memory_high), (Some(-1), None, None));

        // A Guaranteed pod with a fractional container: that one shares, the integer one is exclusive;
        // memory.high applies to Burstable pods only.
        let mixed = pod("m", QosClass::Guaranteed, vec![g("int", 2000, 1000), g("frac", 1500, 1000)]);
        m.admit(&mixed, &[]).unwrap();
        let int = m.settings("m", "int").unwrap();
        let frac = m.settings("m", "frac").unwrap();
        assert_eq!(int.cpus.len(), 2);
        assert!(!int.cpus.contains(0), "reserved CPU 0 is never exclusive");
        assert_eq!((frac.cpu_quota, frac.memory_high), (Some(150_000), None));
        assert_eq!(frac.cpus, m.shared_pool());
        assert!(!overlaps(&frac.cpus, &int.cpus));
        // Tiny limits get kubelet's minimum quota.
        let tiny = pod("t", QosClass::Burstable, vec![container("x", ContainerKind::App, 1, Some(1), 0, None)]);
        m.admit(&tiny, &[]).unwrap();
        assert_eq!(m.settings("t", "x").unwrap().cpu_quota, Some(MIN_CFS_QUOTA_US));
    }

    #[test]
    fn init_containers_reuse_cpus_of_app_containers() {
        let mut m = rm(TopologyPolicy::None);
        let p = pod(
            "p",
            QosClass::Guaranteed,
            vec![
                container("proxy", ContainerKind::Sidecar, 1000, Some(1000), 1, Some(1)),
                container("setup", ContainerKind::Init, 4000, Some(4000), 1, Some(1)),
                g("main", 2000, 1),
            ],
        );
        let a = m.admit(&p, &[]).unwrap().clone();
        let cpus = |n: &str| a.container(n).unwrap().cpus.clone();
        // max(app 2 + sidecar 1, sidecar 1 + init 4) = 5
        assert_eq!(a.exclusive.len(), 5);
        assert_eq!(cpus("proxy").len(), 1);
        assert_eq!(cpus("setup").len(), 4);
        assert_eq!(cpus("main").len(), 2);
        assert!(!overlaps(&cpus("setup"), &cpus("proxy")), "the init runs while the sidecar runs");
        assert!(!overlaps(&cpus("main"), &cpus("proxy")));
        assert!(cpus("main").iter().all(|c| cpus("setup").contains(c)), "main reuses the init's CPUs");
        assert_eq!(union(&union(&cpus("proxy"), &cpus("setup")), &cpus("main")), a.exclusive);
        assert_eq!(m.settings("p", "setup").unwrap().cpus, cpus("setup"));
    }

    fn fill_numa0(m: &mut ResourceManager) {
        // 13 CPUs land on NUMA 0 (best fit, lowest id), leaving it 3 free.
        m.admit(&pod("big", QosClass::Guaranteed, vec![g("c", 13_000, 1)]), &[]).unwrap();
        assert_eq!(m.free_cpus().iter().filter(|c| m.layout().cpu(*c).unwrap().numa == 0).count(), 3);
    }

    #[test]
    fn single_numa_node_refusal_says_why_and_changes_nothing() {
        let mut m = rm(TopologyPolicy::SingleNumaNode);
        fill_numa0(&mut m);
        let before = m.state();
        let p = pod("gpu", QosClass::Guaranteed, vec![g("c", 8000, 1)]);
        let err = m.admit(&p, &[gpu(0, 0), gpu(1, 0)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "topology policy single-numa-node: pod ns/gpu needs 8 exclusive CPUs on one NUMA node with GPUs 0,1 (NUMA 0) but NUMA 0 has 3 free"
        );
        assert!(matches!(&err, AdmitError::Topology { resource, .. } if resource == "cpu"));
        assert_eq!(m.state(), before);
        // Devices on NUMA 1 fit.
        let a = m.admit(&p, &[gpu(4, 1)]).unwrap();
        assert!(a.exclusive.iter().all(|c| (8..16).contains(&c) || (24..32).contains(&c)), "{}", a.exclusive);
        assert_eq!(a.mems, Some(set("1")));
        // Devices on both nodes can never be single-NUMA.
        let err = m.admit(&pod("two", QosClass::Burstable, vec![]), &[gpu(0, 0), gpu(4, 1)]).unwrap_err();
        assert!(matches!(&err, AdmitError::Topology { resource, .. } if resource == "devices"), "{err}");
        assert!(err.to_string().contains("GPUs 0,4 (NUMA 0-1)"), "{err}");
        // A request no NUMA node has room for, though the node as a whole does.
        let err = m.admit(&pod("wide", QosClass::Guaranteed, vec![g("c", 10_000, 1)]), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "topology policy single-numa-node: pod ns/wide needs 10 exclusive CPUs on one NUMA node but no NUMA \
             placement the policy accepts has that many free (NUMA 0: 3 free of 16, NUMA 1: 8 free of 16)"
        );
    }

    #[test]
    fn restricted_and_best_effort() {
        let p = pod("gpu", QosClass::Guaranteed, vec![g("c", 8000, 1)]);
        let mut m = rm(TopologyPolicy::Restricted);
        fill_numa0(&mut m);
        let err = m.admit(&p, &[gpu(0, 0)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "topology policy restricted: pod ns/gpu needs 8 exclusive CPUs aligned with GPU 0 (NUMA 0) but NUMA 0 has 3 free"
        );
        // Best-effort admits: the 3 aligned CPUs first, the rest elsewhere.
        let mut m = rm(TopologyPolicy::BestEffort);
        fill_numa0(&mut m);
        let a = m.admit(&p, &[gpu(0, 0)]).unwrap();
        assert_eq!(a.exclusive.len(), 8);
        assert_eq!(a.affinity, Some(set("0")));
        assert_eq!(a.mems, Some(set("0-1")));
        // Restricted without devices: a pod that fits on one node is preferred.
        let mut m = rm(TopologyPolicy::Restricted);
        fill_numa0(&mut m);
        let a = m.admit(&pod("x", QosClass::Guaranteed, vec![g("c", 8000, 1)]), &[]).unwrap();
        assert_eq!(a.mems, Some(set("1")));
        // ... and one that would fit one node were it free, but now needs two, is refused.
        m.admit(&pod("z", QosClass::Guaranteed, vec![g("c", 5000, 1)]), &[]).unwrap();
        let err = m.admit(&pod("y", QosClass::Guaranteed, vec![g("c", 4000, 1)]), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "topology policy restricted: pod ns/y needs 4 exclusive CPUs within 1 NUMA node but no NUMA placement \
             the policy accepts has that many free (NUMA 0: 3 free of 16, NUMA 1: 3 free of 16)"
        );
    }

    #[test]
    fn shared_pods_with_devices_get_device_memory_nodes_when_aligning() {
        let p = pod("s", QosClass::Burstable, vec![container("c", ContainerKind::App, 100, None, 0, None)]);
        let mut m = rm(TopologyPolicy::BestEffort);
        assert_eq!(m.admit(&p, &[gpu(5, 1)]).unwrap().mems, Some(set("1")));
        assert_eq!(m.settings("s", "c").unwrap().mems, set("1"));
        assert_eq!(env(&m.settings("s", "c").unwrap(), "WEFT_GPU_IDS"), Some("5"));
        let mut m = rm(TopologyPolicy::None);
        assert_eq!(m.admit(&p, &[gpu(5, 1)]).unwrap().mems, None);
        assert_eq!(m.settings("s", "c").unwrap().mems, set("0-1"));
    }

    #[test]
    fn nic_environment() {
        let mut m = rm(TopologyPolicy::BestEffort);
        let nic = |addr: &str, iface: &str, rdma: Option<&str>| PodDevice {
            kind: DeviceKind::Nic,
            id: addr.into(),
            numa: Some(0),
            interface: Some(iface.into()),
            rdma_device: rdma.map(str::to_string),
        };
        let devices =
            [gpu(0, 0), gpu(1, 0), nic("0000:3b:00.2", "net1", Some("mlx5_3")), nic("0000:3b:00.3", "net2", None)];
        m.admit(&pod("n", QosClass::Guaranteed, vec![g("c", 2000, 1)]), &devices).unwrap();
        let s = m.settings("n", "c").unwrap();
        assert_eq!(env(&s, "WEFT_GPU_IDS"), Some("0,1"));
        assert_eq!(env(&s, "NCCL_SOCKET_IFNAME"), Some("=net1,net2"));
        assert_eq!(env(&s, "NCCL_IB_HCA"), Some("=mlx5_3"));
        assert_eq!(env(&s, "UCX_NET_DEVICES"), Some("mlx5_3:1"));
        // No NICs, no NCCL hints.
        m.admit(&pod("plain", QosClass::BestEffort, vec![]), &[]).unwrap();
        let s = m.settings("plain", "whatever").unwrap();
        assert!(s.env.iter().all(|(k, _)| k.starts_with("WEFT_")), "{:?}", s.env);
        assert_eq!((s.cpu_quota, s.memory_limit), (None, None), "unknown containers keep the runtime's limits");
    }

    #[test]
    fn memory_alignment_charges_and_releases() {
        let gib = 1u64 << 30;
        let layout = CpuLayout::synthetic(2, 1, 8, 2).unwrap().with_memory_per_numa(10 * gib);
        let mut m = ResourceManager::new(
            layout,
            OrmConfig { policy: TopologyPolicy::Restricted, align_memory: true, ..OrmConfig::default() },
        )
        .unwrap();
        let a = m.admit(&pod("a", QosClass::Guaranteed, vec![g("c", 2000, 8 * gib)]), &[]).unwrap();
        assert_eq!(a.mems, Some(set("0")));
        assert_eq!(a.memory_numa, [(0, 8 * gib)].into());
        // Node 0 has 2 GiB left: the next 8 GiB pod goes to node 1 although node 0 has CPUs.
        let b = m.admit(&pod("b", QosClass::Guaranteed, vec![g("c", 2000, 8 * gib)]), &[]).unwrap();
        assert_eq!(b.mems, Some(set("1")));
        // 6 GiB: no node has it free, nor both together (2 + 2 GiB): refused for memory.
        let before = m.state();
        let err = m.admit(&pod("c", QosClass::Guaranteed, vec![g("c", 2000, 6 * gib)]), &[]).unwrap_err();
        assert!(matches!(&err, AdmitError::Topology { resource, .. } if resource == "memory"), "{err}");
        assert!(err.to_string().contains("6442450944 bytes of memory"), "{err}");
        assert_eq!(m.state(), before);
        m.release("a").unwrap();
        assert_eq!(m.memory_used().get(&0), Some(&0));
        let c = m.admit(&pod("c", QosClass::Guaranteed, vec![g("c", 2000, 6 * gib)]), &[]).unwrap();
        assert_eq!(c.mems, Some(set("0")));
    }

    #[test]
    fn capacity_errors() {
        let mut m = rm(TopologyPolicy::None);
        let err =
            m.admit(&pod("huge", QosClass::Guaranteed, vec![g("a", 20_000, 1), g("b", 20_000, 1)]), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pod ns/huge needs 40 exclusive CPUs (container a: 20, container b: 20) but only 32 are free (32 online, 0 reserved, 0 exclusive to other pods)"
        );
        let err = m.admit(&pod("all", QosClass::Guaranteed, vec![g("a", 32_000, 1)]), &[]).unwrap_err();
        assert!(matches!(err, AdmitError::SharedPoolExhausted { needed: 32, .. }), "{err}");
        assert!(m.admit(&pod("most", QosClass::Guaranteed, vec![g("a", 31_000, 1)]), &[]).is_ok());
        assert_eq!(m.shared_pool().len(), 1);
        let err = m.admit(&pod("dup", QosClass::Guaranteed, vec![g("a", 1000, 1), g("a", 1000, 1)]), &[]).unwrap_err();
        assert!(err.to_string().contains("container name a is used twice"), "{err}");
        assert!(m.admit(&pod("", QosClass::BestEffort, vec![]), &[]).is_err());
    }

    #[test]
    fn pod_level_resources_get_no_exclusive_cpus() {
        let mut m = rm(TopologyPolicy::BestEffort);
        let mut p = pod("pl", QosClass::Guaranteed, vec![g("c", 2000, 1)]);
        p.pod_level_resources = true;
        assert!(m.admit(&p, &[]).unwrap().exclusive.is_empty());
    }

    #[test]
    fn admit_is_idempotent_and_release_returns_cpus() {
        let mut m = rm(TopologyPolicy::BestEffort);
        let first = m.admit(&pod("a", QosClass::Guaranteed, vec![g("c", 2000, 1)]), &[]).unwrap().clone();
        let again = m.admit(&pod("a", QosClass::Guaranteed, vec![g("c", 6000, 1)]), &[]).unwrap().clone();
        assert_eq!(first, again);
        assert_eq!(m.pods().count(), 1);
        assert_eq!(m.release("a"), Some(first));
        assert_eq!(m.release("a"), None);
        assert_eq!(m.shared_pool(), m.layout().online());
        assert!(m.exclusive_cpus().is_empty());
    }

    #[test]
    fn restore_round_trips_and_validates() {
        let mut m = ResourceManager::new(
            CpuLayout::synthetic(2, 1, 8, 2).unwrap(),
            OrmConfig { reserved: set("0"), ..OrmConfig::default() },
        )
        .unwrap();
        m.admit(&pod("a", QosClass::Guaranteed, vec![g("c", 2000, 1)]), &[gpu(0, 0)]).unwrap();
        m.admit(&pod("b", QosClass::Guaranteed, vec![g("c", 4000, 1)]), &[]).unwrap();
        let state = m.state();
        let json = serde_json::to_string(&state).unwrap();
        let back: OrmState = serde_json::from_str(&json).unwrap();
        let r = ResourceManager::restore(m.layout().clone(), m.config().clone(), back).unwrap();
        assert_eq!(r.state(), state);
        assert_eq!(r.shared_pool(), m.shared_pool());
        assert_eq!(r.settings("a", "c"), m.settings("a", "c"));

        let restore =
            |s: OrmState, c: OrmConfig| ResourceManager::restore(m.layout().clone(), c, s).unwrap_err().to_string();
        let mut overlap = state.clone();
        overlap.pods[1].exclusive = union(&overlap.pods[1].exclusive, &overlap.pods[0].exclusive);
        let e = restore(overlap, m.config().clone());
        assert!(e.contains("ns/b (b)") && e.contains("also belong to pod ns/a (a)"), "{e}");
        let e = restore(state.clone(), OrmConfig { reserved: state.pods[0].exclusive.clone(), ..OrmConfig::default() });
        assert!(e.contains("ns/a (a)") && e.contains("reserved"), "{e}");
        let mut ghost = state.clone();
        ghost.pods[0].exclusive.insert(99);
        let e = restore(ghost, m.config().clone());
        assert!(e.contains("ns/a (a)") && e.contains("99") && e.contains("not online"), "{e}");
        let mut outside = state.clone();
        outside.pods[0].containers[0].cpus.insert(31);
        let e = restore(outside, m.config().clone());
        assert!(e.contains("container c has CPUs 31 outside"), "{e}");
        let mut twice = state.clone();
        twice.pods.push(state.pods[0].clone());
        twice.pods[2].exclusive = CpuSet::new();
        twice.pods[2].containers.clear();
        assert!(restore(twice, m.config().clone()).contains("UID listed twice"));
        let mut badnode = state;
        badnode.pods[0].mems = Some(set("7"));
        assert!(restore(badnode, m.config().clone()).contains("NUMA node 7"));
    }
}
