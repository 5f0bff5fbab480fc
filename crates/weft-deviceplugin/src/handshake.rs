//! Which pod a kubelet call belongs to. The device plugin API carries no pod identity:
//! GetPreferredAllocation says only which devices are free and how many one container needs;
//! Allocate says only which devices were picked. weft answers from the pod's recorded decision,
//! so it has to know the pod. The rule, which follows how the kubelet admits pods
//! (k8s.io/kubernetes `pkg/kubelet`: `HandlePodAdditions` sorts new pods by creation time and
//! admits them one at a time; the device manager allocates a pod's init containers in order, then
//! its app containers in order, one call sequence per container):
//!
//! 1. The candidates are the pods the kubelet knows on this node (its own pod list), not finished,
//!    in admission order: creation time, then namespace/name (the kubelet's sort keeps ties in
//!    arrival order, which weft cannot see, so ties are broken by name, the same on every call).
//! 2. A pod's device containers are its init containers in order, then its app containers in
//!    order, each that asks for the resource. One is *served* once the kubelet's PodResources
//!    lists devices for it or this plugin has answered its Allocate.
//! 3. A call asking for `n` devices belongs to the pod the previous call belonged to when that
//!    pod's next unserved container asks for `n` (the kubelet finishes one pod before the next);
//!    otherwise to the first candidate whose next unserved container asks for `n`.
//! 4. No match: the call is answered without a pod (weft's best-effort set) and the write-back
//!    records what the kubelet really did.
//!
//! A misattribution (two pods of one size whose admission order differs from their creation
//! order) costs no correctness: every answer is a valid set from the available devices, and the
//! write-back from PodResources corrects the record (`weft.io/gpu-ids`, `weft.io/vifs`) for both
//! pods.
//!
//! The rule is the same for every device kind; what a pod's recorded decision says is the device
//! plugin's own (a GPU set, VFs), read by the closure [`PendingPod::of`] is given.

use std::collections::BTreeSet;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use weft_resources::{Stage, container_amount};

/// The pods the kubelet knows on this node (its `/pods` list in production).
#[async_trait]
pub trait NodePods: Send + Sync + 'static {
    /// The pods, as the kubelet has them.
    async fn pods(&self) -> Result<Vec<Pod>, String>;
}

/// A function that returns the pods at once (a list kept in memory: tests, a cache).
#[async_trait]
impl<F> NodePods for F
where
    F: Fn() -> Result<Vec<Pod>, String> + Send + Sync + 'static,
{
    async fn pods(&self) -> Result<Vec<Pod>, String> {
        self()
    }
}

/// One container that asks for the resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceContainer {
    /// Container name.
    pub name: String,
    /// Init, sidecar or app.
    pub stage: Stage,
    /// Devices it asks for (≥ 1).
    pub count: usize,
}

/// What the pod's recorded decision says for this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recorded<T> {
    /// No decision on the pod.
    None,
    /// A decision for this node (GPU indices, VFs).
    ForThisNode(T),
    /// A decision for another node (the pod was rebound, or the annotation was copied).
    OtherNode(String),
    /// The annotation could not be read.
    Unreadable(String),
}

impl<T> Recorded<T> {
    /// The decision when it is for this node; a decision for another node or one that cannot be
    /// read is logged (naming `pod`) and ignored.
    pub fn for_this_node(&self, pod: &str) -> Option<&T> {
        match self {
            Recorded::ForThisNode(d) => Some(d),
            Recorded::None => None,
            Recorded::OtherNode(node) => {
                tracing::info!(%pod, %node, "the pod's decision is for another node: ignored");
                None
            }
            Recorded::Unreadable(e) => {
                tracing::warn!(%pod, error = %e, "the pod's decision is unreadable: ignored");
                None
            }
        }
    }
}

/// A pod on this node as the handshake sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingPod<T> {
    /// Pod UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Creation time, when set.
    pub created: Option<Timestamp>,
    /// Its device containers in allocation order: init containers, then app containers.
    pub containers: Vec<DeviceContainer>,
    /// The recorded decision.
    pub decision: Recorded<T>,
}

impl<T> PendingPod<T> {
    /// The pod as the handshake sees it, for `resource`, its decision read by `decision`; `None`
    /// for a pod that asks for none of the resource or has finished. A quantity that is not a
    /// whole count is an error naming the pod and container.
    pub fn of(
        pod: &Pod,
        resource: &str,
        decision: impl FnOnce(&Pod) -> Recorded<T>,
    ) -> Result<Option<PendingPod<T>>, String> {
        let meta = &pod.metadata;
        let label = format!(
            "pod {}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        );
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let Some(spec) = &pod.spec else { return Ok(None) };
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return Ok(None);
        }
        let init = spec.init_containers.iter().flatten().map(|c| (Stage::of_init(c.restart_policy.as_deref()), c));
        let app = spec.containers.iter().map(|c| (Stage::App, c));
        let mut containers = Vec::new();
        for (stage, c) in init.chain(app) {
            let count = amount(c, resource).map_err(|e| format!("{label}: {e}"))?;
            if count > 0 {
                containers.push(DeviceContainer { name: c.name.clone(), stage, count });
            }
        }
        if containers.is_empty() {
            return Ok(None);
        }
        let decision = decision(pod);
        Ok(Some(PendingPod {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            containers,
            decision,
        }))
    }

    /// `namespace/name`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

fn amount(c: &Container, resource: &str) -> Result<usize, String> {
    let n = container_amount(c, resource).map_err(|e| e.to_string())?;
    usize::try_from(n).map_err(|_| format!("container '{}': {resource} count {n} is too large", c.name))
}

/// Sorts pods into the kubelet's admission order (rule 1).
pub fn admission_order<T>(pods: &mut [PendingPod<T>]) {
    pods.sort_by(|a, b| {
        // A pod without a creation time sorts first, as Go's zero time does.
        (a.created, &a.namespace, &a.name).cmp(&(b.created, &b.namespace, &b.name))
    });
}

/// Which containers are served (rule 2): `(pod UID, container name)`.
pub type Served = BTreeSet<(String, String)>;

/// The container a call for `size` devices belongs to (rule 3): indices into `pods` (in admission
/// order) and into that pod's containers. `current` is the UID of the pod the previous call
/// belonged to.
pub fn attribute<T>(
    pods: &[PendingPod<T>],
    served: &Served,
    current: Option<&str>,
    size: usize,
) -> Option<(usize, usize)> {
    let next_unserved =
        |p: &PendingPod<T>| p.containers.iter().position(|c| !served.contains(&(p.uid.clone(), c.name.clone())));
    let matches = |i: usize| {
        let p = &pods[i];
        next_unserved(p).filter(|&c| p.containers[c].count == size).map(|c| (i, c))
    };
    let in_progress = current.and_then(|uid| pods.iter().position(|p| p.uid == uid));
    in_progress.and_then(matches).or_else(|| (0..pods.len()).find_map(matches))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, created: i64, containers: &[(&str, Stage, usize)]) -> PendingPod<()> {
        PendingPod {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            created: Some(Timestamp::from_second(created).expect("a valid time")),
            containers: containers
                .iter()
                .map(|&(n, stage, count)| DeviceContainer { name: n.into(), stage, count })
                .collect(),
            decision: Recorded::None,
        }
    }

    fn served(pairs: &[(&str, &str)]) -> Served {
        pairs.iter().map(|&(p, c)| (p.to_string(), c.to_string())).collect()
    }

    #[test]
    fn two_pending_pods_of_one_size_go_in_creation_order() {
        let mut pods = vec![pod("young", 20, &[("c", Stage::App, 2)]), pod("old", 10, &[("c", Stage::App, 2)])];
        admission_order(&mut pods);
        assert_eq!(pods[0].uid, "old");
        assert_eq!(attribute(&pods, &Served::new(), None, 2), Some((0, 0)));
        // Once the older one is served, the next call of that size is the younger one's.
        assert_eq!(attribute(&pods, &served(&[("old", "c")]), Some("old"), 2), Some((1, 0)));
    }

    #[test]
    fn equal_creation_times_break_ties_by_name() {
        let mut pods = vec![pod("b", 10, &[("c", Stage::App, 1)]), pod("a", 10, &[("c", Stage::App, 1)])];
        admission_order(&mut pods);
        assert_eq!((pods[0].uid.as_str(), pods[1].uid.as_str()), ("a", "b"));
    }

    #[test]
    fn a_size_picks_the_first_pod_whose_next_container_asks_for_it() {
        let mut pods = vec![pod("one", 10, &[("c", Stage::App, 1)]), pod("four", 20, &[("c", Stage::App, 4)])];
        admission_order(&mut pods);
        assert_eq!(attribute(&pods, &Served::new(), None, 4), Some((1, 0)));
        assert_eq!(attribute(&pods, &Served::new(), None, 3), None);
    }

    #[test]
    fn init_containers_come_first_and_the_pod_in_progress_keeps_the_calls() {
        let p = pod("p", 30, &[("init", Stage::Init, 2), ("main", Stage::App, 2), ("side", Stage::App, 1)]);
        // An older pod of size 2 exists, but the kubelet is in the middle of `p`.
        let pods = vec![pod("older", 10, &[("c", Stage::App, 2)]), p];
        let s = served(&[("p", "init")]);
        assert_eq!(attribute(&pods, &s, Some("p"), 2), Some((1, 1)), "p's app container follows its init container");
        let s = served(&[("p", "init"), ("p", "main")]);
        assert_eq!(attribute(&pods, &s, Some("p"), 1), Some((1, 2)));
        // Without a pod in progress, the older pod comes first.
        assert_eq!(attribute(&pods, &Served::new(), None, 2), Some((0, 0)));
    }

    #[test]
    fn a_pod_in_progress_whose_next_size_differs_gives_way() {
        let pods =
            vec![pod("p", 10, &[("a", Stage::App, 2), ("b", Stage::App, 4)]), pod("q", 20, &[("c", Stage::App, 1)])];
        // p's admission stopped after its first container (another resource was short): a call
        // for one device is q's.
        assert_eq!(attribute(&pods, &served(&[("p", "a")]), Some("p"), 1), Some((1, 0)));
    }

    fn api_pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("a pod")
    }

    /// A decision reader as a device plugin writes one: the annotation `example.com/decision`
    /// holds `<node>=<ids>`.
    fn read(node: &'static str) -> impl FnOnce(&Pod) -> Recorded<String> {
        move |pod| match pod.metadata.annotations.as_ref().and_then(|a| a.get("example.com/decision")) {
            None => Recorded::None,
            Some(v) => match v.split_once('=') {
                Some((n, ids)) if n == node => Recorded::ForThisNode(ids.to_string()),
                Some((n, _)) => Recorded::OtherNode(n.to_string()),
                None => Recorded::Unreadable(format!("'{v}' has no '='")),
            },
        }
    }

    #[test]
    fn a_pod_reads_its_device_containers_and_decision() {
        let decision = "n1=2,3";
        let p = api_pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "creationTimestamp": "2026-11-25T10:00:00Z",
                         "annotations": {"example.com/decision": decision}},
            "spec": {
                "initContainers": [{"name": "fetch", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                                   {"name": "side", "restartPolicy": "Always"}],
                "containers": [{"name": "cpu-only"}, {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
            }
        }));
        let seen = PendingPod::of(&p, "nvidia.com/gpu", read("n1")).expect("readable").expect("asks for GPUs");
        let names: Vec<_> = seen.containers.iter().map(|c| (c.name.as_str(), c.stage, c.count)).collect();
        assert_eq!(names, [("fetch", Stage::Init, 1), ("main", Stage::App, 2)]);
        assert_eq!(seen.decision, Recorded::ForThisNode("2,3".to_string()));
        let elsewhere = PendingPod::of(&p, "nvidia.com/gpu", read("n2")).expect("readable").expect("asks");
        assert_eq!(elsewhere.decision, Recorded::OtherNode("n1".into()));
        assert_eq!(PendingPod::of(&p, "example.com/vf", read("n1")), Ok(None));
    }

    #[test]
    fn finished_pods_and_bad_quantities() {
        let done = api_pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Succeeded"}
        }));
        assert_eq!(PendingPod::of(&done, "nvidia.com/gpu", read("n1")), Ok(None));
        let bad = api_pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "500m"}}}]}
        }));
        let e = PendingPod::of(&bad, "nvidia.com/gpu", read("n1")).unwrap_err();
        assert!(e.contains("pod ns/p") && e.contains("container 'c'") && e.contains("500m"), "{e}");
    }
}
