//! What a device plugin has handed out, container by container, until the kubelet's PodResources
//! lists it: the state around the [`crate::handshake`] rule that every device kind shares.
//!
//! A plugin calls, per kubelet call:
//!
//! - GetPreferredAllocation: [`Accounting::candidates`] (the kubelet's pods in admission order,
//!   the containers already served, the devices PodResources lists per pod), then
//!   [`Accounting::attribute`] (the container the call is for, with what the pod's other running
//!   containers hold), answers, and [`Accounting::expect`]s the Allocate that follows;
//! - Allocate: [`Accounting::allocating`] (the expected container when the sizes agree, else the
//!   handshake again), answers, and [`Accounting::record`]s the grant, which wakes the
//!   write-back ([`Accounting::allocated`]).
//!
//! The write-back ([`crate::writeback`]) forgets grants once the kubelet lists them
//! ([`Accounting::settle`]): from then on the kubelet's word is the record.
//!
//! Generic over what a pod's recorded decision is (`R`) and how the plugin counts a device (`D`:
//! a GPU index, a VF's PCI address).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;
use weft_resources::Stage;

use crate::handshake::{DeviceContainer, NodePods, PendingPod, Recorded, Served, admission_order, attribute};
use crate::podresources::{self, AssignedDevices, ContainerKey};

/// One container's devices as the plugin handed them out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant<D> {
    /// Pod UID, when the handshake found the pod.
    pub pod_uid: Option<String>,
    /// Pod and container, when found.
    pub container: Option<ContainerKey>,
    /// Whether the container keeps running beside the app containers (app or sidecar) or runs
    /// before them (init: its devices are reused by the next containers).
    pub long_running: bool,
    /// The devices.
    pub devices: Vec<D>,
}

/// The pods a call may belong to, read before the state is locked.
#[derive(Clone, Debug)]
pub struct Candidates<R, D> {
    /// Pods asking for the resource, in admission order.
    pub pods: Vec<PendingPod<R>>,
    /// Containers the kubelet lists devices of the resource for.
    pub served: Served,
    /// The devices the kubelet lists for each pod's containers, by pod UID.
    pub listed: HashMap<String, Vec<D>>,
    raw: Vec<Pod>,
}

impl<R, D> Candidates<R, D> {
    /// The kubelet's pod with UID `uid` (for what else a plugin reads of it).
    pub fn pod(&self, uid: &str) -> Option<&Pod> {
        self.raw.iter().find(|p| p.metadata.uid.as_deref() == Some(uid))
    }
}

/// The container a call belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributed<R, D> {
    /// Its pod.
    pub pod: PendingPod<R>,
    /// Its index in `pod.containers`.
    pub container: usize,
    /// What the pod's running containers hold: the kubelet's list, and this plugin's answers it
    /// does not list yet.
    pub held: Vec<D>,
}

impl<R, D> Attributed<R, D> {
    /// The container.
    pub fn device_container(&self) -> &DeviceContainer {
        &self.pod.containers[self.container]
    }

    /// `namespace/name container <name>`.
    pub fn label(&self) -> String {
        format!("{} container {}", self.pod.label(), self.device_container().name)
    }
}

struct State<R, D> {
    /// The pod the last call belonged to.
    current: Option<String>,
    /// The container the last GetPreferredAllocation was for, and its size.
    pending: Option<(PendingPod<R>, usize, usize)>,
    /// Containers answered, by (pod UID, container name), until PodResources lists them.
    ledger: BTreeMap<(String, String), Grant<D>>,
    /// Allocations the handshake could not place on a pod (for the write-back).
    unplaced: Vec<Grant<D>>,
}

impl<R, D> Default for State<R, D> {
    fn default() -> Self {
        State { current: None, pending: None, ledger: BTreeMap::new(), unplaced: Vec::new() }
    }
}

/// One plugin's accounting of its resource.
pub struct Accounting<R, D> {
    resource: String,
    pods: Arc<dyn NodePods>,
    assigned: Arc<dyn AssignedDevices>,
    state: Mutex<State<R, D>>,
    allocated: Notify,
}

impl<R: Clone, D: Clone> Accounting<R, D> {
    /// Accounting of `resource`, finding pods through `pods` and served containers through
    /// `assigned`.
    pub fn new(resource: impl Into<String>, pods: Arc<dyn NodePods>, assigned: Arc<dyn AssignedDevices>) -> Self {
        Accounting {
            resource: resource.into(),
            pods,
            assigned,
            state: Mutex::new(State::default()),
            allocated: Notify::new(),
        }
    }

    /// The resource.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    fn state(&self) -> MutexGuard<'_, State<R, D>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pods the kubelet knows on this node.
    pub async fn node_pods(&self) -> Result<Vec<Pod>, String> {
        self.pods.pods().await
    }

    /// What the kubelet says each container holds.
    pub async fn assigned(&self) -> Result<Vec<podresources::api::PodResources>, String> {
        self.assigned.list().await
    }

    /// Resolves once an Allocate was recorded since the last call (the write-back's cue).
    pub async fn allocated(&self) {
        self.allocated.notified().await;
    }

    /// Containers answered and not yet known to be listed by the kubelet.
    pub fn grants(&self) -> Vec<Grant<D>> {
        let state = self.state();
        state.ledger.values().chain(&state.unplaced).cloned().collect()
    }

    /// Forgets grants the kubelet now lists (`listed`: the resource's devices by container; its
    /// word supersedes the plugin's), and grants of pods not in `live_pods` (UIDs).
    pub fn settle(&self, listed: &BTreeMap<ContainerKey, Vec<String>>, live_pods: &[String]) {
        let mut state = self.state();
        state.ledger.retain(|(uid, _), g| {
            live_pods.contains(uid) && !g.container.as_ref().is_some_and(|k| listed.contains_key(k))
        });
        state.unplaced.clear();
    }

    /// The kubelet's pods asking for the resource (each decision read by `decision`), in
    /// admission order, with the containers already served and the devices listed per pod
    /// (device IDs turned into the plugin's devices by `devices`). A kubelet that cannot be read
    /// leaves the answer without pods or without served containers, with a warning.
    pub async fn candidates(
        &self,
        decision: impl Fn(&Pod) -> Recorded<R>,
        devices: impl Fn(&[String]) -> Vec<D>,
    ) -> Candidates<R, D> {
        let raw = match self.pods.pods().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(resource = %self.resource, error = %e, "the kubelet's pod list: calls are answered without a pod");
                Vec::new()
            }
        };
        let mut pods: Vec<PendingPod<R>> = raw
            .iter()
            .filter_map(|p| match PendingPod::of(p, &self.resource, &decision) {
                Ok(seen) => seen,
                Err(e) => {
                    tracing::warn!(resource = %self.resource, error = %e, "pod left out of the handshake");
                    None
                }
            })
            .collect();
        admission_order(&mut pods);
        let mut served = Served::new();
        let mut listed = HashMap::<String, Vec<D>>::new();
        match self.assigned.list().await {
            Ok(list) => {
                let by_name: HashMap<(&str, &str), &str> =
                    pods.iter().map(|p| ((p.namespace.as_str(), p.name.as_str()), p.uid.as_str())).collect();
                for (key, ids) in podresources::devices_of(&list, &self.resource) {
                    if let Some(uid) = by_name.get(&(key.namespace.as_str(), key.pod.as_str())) {
                        listed.entry(uid.to_string()).or_default().extend(devices(&ids));
                        served.insert((uid.to_string(), key.container));
                    }
                }
            }
            Err(e) => tracing::warn!(
                resource = %self.resource, error = %e,
                "PodResources: served containers known from this plugin's own answers only"
            ),
        }
        Candidates { pods, served, listed, raw }
    }

    fn find(state: &State<R, D>, c: &Candidates<R, D>, size: usize) -> Option<(PendingPod<R>, usize)> {
        let mut served = c.served.clone();
        served.extend(state.ledger.keys().cloned());
        attribute(&c.pods, &served, state.current.as_deref(), size).map(|(p, i)| (c.pods[p].clone(), i))
    }

    /// The container a call for `size` devices belongs to ([`attribute`], counting the containers
    /// this plugin answered as served), with what its pod's running containers hold.
    pub fn attribute(&self, c: &Candidates<R, D>, size: usize) -> Option<Attributed<R, D>> {
        let state = self.state();
        let (pod, container) = Self::find(&state, c, size)?;
        let mut held = c.listed.get(&pod.uid).cloned().unwrap_or_default();
        held.extend(
            state
                .ledger
                .iter()
                .filter(|((uid, _), g)| *uid == pod.uid && g.long_running)
                .flat_map(|(_, g)| g.devices.iter().cloned()),
        );
        Some(Attributed { pod, container, held })
    }

    /// Remembers the container a preferred allocation of `size` devices was answered for: the
    /// Allocate of that size that follows is its.
    pub fn expect(&self, found: Option<&Attributed<R, D>>, size: usize) {
        self.state().pending = found.map(|a| (a.pod.clone(), a.container, size));
    }

    /// The container an Allocate of `size` devices belongs to: the one the preferred allocation
    /// was for, when the sizes agree; otherwise (no preferred call: the kubelet reused an init
    /// container's devices, or had no choice) the handshake runs for this call.
    pub async fn allocating(
        &self,
        size: usize,
        decision: impl Fn(&Pod) -> Recorded<R>,
        devices: impl Fn(&[String]) -> Vec<D>,
    ) -> Option<(PendingPod<R>, usize)> {
        let pending = self.state().pending.take().filter(|(_, _, s)| *s == size);
        if let Some((pod, c, _)) = pending {
            return Some((pod, c));
        }
        let c = self.candidates(decision, devices).await;
        Self::find(&self.state(), &c, size)
    }

    /// Records what an Allocate gave the container `found` (or a container no pod matched) and
    /// wakes the write-back.
    pub fn record(&self, found: Option<(PendingPod<R>, usize)>, devices: Vec<D>) {
        let mut state = self.state();
        state.pending = None;
        match found {
            Some((pod, c)) => {
                let container = &pod.containers[c];
                let grant = Grant {
                    pod_uid: Some(pod.uid.clone()),
                    container: Some(ContainerKey {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                    }),
                    long_running: container.stage != Stage::Init,
                    devices,
                };
                state.current = Some(pod.uid.clone());
                state.ledger.insert((pod.uid.clone(), container.name.clone()), grant);
            }
            None => state.unplaced.push(Grant { pod_uid: None, container: None, long_running: true, devices }),
        }
        drop(state);
        self.allocated.notify_one();
    }
}

/// What a container may take of its pod's decision: the decided devices the pod's running
/// containers do not hold (`held`), with the `required` ones, sorted. The decision is answered
/// only when all of these are `available` and at least `size`; otherwise the error says why not
/// (`kind` names the devices: `GPUs`, `VFs`), for the plugin's log.
pub fn decision_left<D: Clone + Ord + Debug>(
    kind: &str,
    decided: &[D],
    held: &[D],
    required: &[D],
    available: &[D],
    size: usize,
) -> Result<Vec<D>, String> {
    let mut pool: Vec<D> = decided.iter().filter(|d| !held.contains(d)).chain(required).cloned().collect();
    pool.sort_unstable();
    pool.dedup();
    let missing: Vec<&D> = pool.iter().filter(|d| !available.contains(d)).collect();
    if !missing.is_empty() {
        Err(format!("decided {kind} {missing:?} are not available (taken or unhealthy)"))
    } else if pool.len() < size {
        Err(format!("{} decided {kind} are left for this container, it needs {size}", pool.len()))
    } else {
        Ok(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_takes_what_its_pods_decision_has_left() {
        let all = [0, 1, 2, 3, 4];
        assert_eq!(decision_left("GPUs", &[3, 1], &[], &[], &all, 2), Ok(vec![1, 3]));
        assert_eq!(decision_left("GPUs", &[0, 1, 2, 3], &[0, 1], &[], &all, 2), Ok(vec![2, 3]));
        assert_eq!(decision_left("GPUs", &[0, 1], &[], &[4], &all, 2), Ok(vec![0, 1, 4]), "required joins");
        let e = decision_left("VFs", &[0, 1], &[], &[], &[1, 2], 2).unwrap_err();
        assert!(e.contains("decided VFs [0] are not available"), "{e}");
        let e = decision_left("GPUs", &[0, 1], &[0, 1], &[], &all, 1).unwrap_err();
        assert!(e.contains("0 decided GPUs are left for this container, it needs 1"), "{e}");
    }
}
