//! The workload: GPU pods, some of them asking for SR-IOV VFs, with arrival times and durations.
//!
//! Two forms are read:
//! - a generator (`kind: SimWorkload`): Poisson arrivals, exponential durations, a size mix, and a
//!   share of pods asking for VFs (`vfShare`, default 0 in a file; `vfsPerPod` VFs of `vfPhysnet`,
//!   default 1 of `fabric`);
//! - the Pod manifests users apply, as a multi-document YAML stream: the GPU count is the pod's
//!   `nvidia.com/gpu` and the VFs of each physnet its `sriov.weft.io/<physnet>`, as the kubelet
//!   counts them (weft-resources' `pod_need`: per container the larger of request and limit, app
//!   containers summed, init containers by their peak, sidecars both ways), and two annotations
//!   place it in time: `sim.weft.io/arrival` and `sim.weft.io/duration`, in seconds.
//!
//! ```yaml
//! apiVersion: weft.io/v1alpha1
//! kind: SimWorkload
//! generate:
//!   pods: 10000
//!   seed: 7
//!   sizes: {"1": 0.45, "2": 0.25, "4": 0.18, "8": 0.12}
//!   meanInterarrivalSeconds: 6
//!   meanDurationSeconds: 3600
//!   vfShare: 0.5
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use weft_resources::{Stage, pod_need};

use crate::SimError;

/// Annotation holding a pod's arrival time in seconds.
pub const ARRIVAL_ANNOTATION: &str = "sim.weft.io/arrival";
/// Annotation holding a pod's run time in seconds.
pub const DURATION_ANNOTATION: &str = "sim.weft.io/duration";
/// The GPU resource name.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The prefix of a physnet's VF resource: `sriov.weft.io/<physnet>`.
pub const VF_RESOURCE_PREFIX: &str = weft_net::config::RESOURCE_PREFIX;

/// One pod of the workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimPod {
    /// Pod name.
    pub name: String,
    /// GPUs requested.
    pub gpus: usize,
    /// Arrival, seconds from the start.
    pub arrival: f64,
    /// Run time, seconds.
    pub duration: f64,
    /// SR-IOV VFs requested: (physnet, count), by physnet, no count 0. The physnet names are
    /// shared between pods (a workload of millions of pods holds each name once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vfs: Vec<(Arc<str>, usize)>,
}

impl SimPod {
    /// A pod of `gpus` GPUs and no VFs.
    pub fn gpus(name: &str, gpus: usize, arrival: f64, duration: f64) -> SimPod {
        SimPod { name: name.to_string(), gpus, arrival, duration, vfs: Vec::new() }
    }

    /// VFs requested in all.
    pub fn vf_count(&self) -> usize {
        self.vfs.iter().map(|(_, n)| n).sum()
    }
}

/// Generator parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Generate {
    /// Number of pods.
    pub pods: usize,
    /// RNG seed (ChaCha8; the same seed gives the same workload on every platform).
    #[serde(default)]
    pub seed: u64,
    /// Share of each pod size; normalised.
    pub sizes: BTreeMap<usize, f64>,
    /// Mean time between arrivals, seconds.
    pub mean_interarrival_seconds: f64,
    /// Mean run time, seconds.
    pub mean_duration_seconds: f64,
    /// Share of pods (0–1) that ask for VFs; drawn apart from the sizes and times, so a stream
    /// keeps its pods when only this changes.
    #[serde(default)]
    pub vf_share: f64,
    /// VFs each such pod asks for.
    #[serde(default = "one")]
    pub vfs_per_pod: usize,
    /// The physnet of those VFs.
    #[serde(default = "default_physnet")]
    pub vf_physnet: String,
}

fn one() -> usize {
    1
}

fn default_physnet() -> String {
    crate::cluster::DEFAULT_PHYSNET.to_string()
}

impl Generate {
    /// The share of the cluster's GPUs the default stream offers, in expectation.
    pub const DEFAULT_LOAD: f64 = 0.95;
    /// The share of the default stream's pods that ask for one VF of `fabric`.
    pub const DEFAULT_VF_SHARE: f64 = 0.5;

    /// The default stream for a cluster of `total_gpus`: a 1/2/4/8 mix and an arrival rate that offers
    /// [`Self::DEFAULT_LOAD`] of the cluster's GPUs in expectation, so placement quality decides who
    /// fits. The load a drawn stream really offers scatters around it (the report shows both).
    pub fn default_for(total_gpus: usize, pods: usize, seed: u64) -> Generate {
        let sizes: BTreeMap<usize, f64> = [(1, 0.45), (2, 0.25), (4, 0.18), (8, 0.12)].into_iter().collect();
        let mean_size: f64 = sizes.iter().map(|(s, p)| *s as f64 * p).sum();
        let mean_duration_seconds = 3600.0;
        let offered = Self::DEFAULT_LOAD * total_gpus.max(1) as f64;
        Generate {
            pods,
            seed,
            sizes,
            mean_interarrival_seconds: mean_duration_seconds * mean_size / offered,
            mean_duration_seconds,
            vf_share: Self::DEFAULT_VF_SHARE,
            vfs_per_pod: 1,
            vf_physnet: default_physnet(),
        }
    }

    /// Produce the pods.
    pub fn pods(&self) -> Result<Vec<SimPod>, SimError> {
        let bad = |m: String| SimError::Format { source_name: "generate".into(), message: m };
        if self.pods > crate::MAX_PODS {
            return Err(SimError::TooLarge { what: "pods".into(), asked: self.pods as u128, limit: crate::MAX_PODS });
        }
        let total: f64 = self.sizes.values().sum();
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if self.sizes.is_empty() || !positive(total) || self.sizes.values().any(|p| !p.is_finite() || *p < 0.0) {
            return Err(bad("sizes: give at least one size with a positive share, no negative shares".into()));
        }
        if self.sizes.contains_key(&0) {
            return Err(bad("sizes: a pod of 0 GPUs is not a GPU pod".into()));
        }
        if !positive(self.mean_interarrival_seconds) || !positive(self.mean_duration_seconds) {
            return Err(bad("meanInterarrivalSeconds and meanDurationSeconds must be > 0".into()));
        }
        if !(0.0..=1.0).contains(&self.vf_share) {
            return Err(bad(format!("vfShare: {} is not a share between 0 and 1", self.vf_share)));
        }
        if self.vf_share > 0.0 && self.vfs_per_pod == 0 {
            return Err(bad("vfsPerPod: pods that ask for VFs ask for at least 1".into()));
        }
        if self.vf_share > 0.0 && !crate::cluster::valid_physnet(&self.vf_physnet) {
            return Err(bad(format!(
                "vfPhysnet: '{}' cannot name the resource sriov.weft.io/<physnet>: use 1-63 letters, digits, \
                 '-', '_' and '.', starting and ending with a letter or digit",
                self.vf_physnet
            )));
        }
        let physnet: Arc<str> = Arc::from(self.vf_physnet.as_str());
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        // VF asks come from a stream of their own: the sizes and times are those of the same seed
        // without VFs.
        let mut vf_rng = ChaCha8Rng::seed_from_u64(self.seed);
        vf_rng.set_stream(1);
        let mut t = 0.0;
        let mut pods = Vec::with_capacity(self.pods);
        for i in 0..self.pods {
            t += exp_sample(&mut rng, self.mean_interarrival_seconds);
            let mut u: f64 = rng.random::<f64>() * total;
            let mut size = *self.sizes.keys().next_back().unwrap_or(&1);
            for (s, p) in &self.sizes {
                if u < *p {
                    size = *s;
                    break;
                }
                u -= p;
            }
            let duration = exp_sample(&mut rng, self.mean_duration_seconds);
            let vfs = if vf_rng.random::<f64>() < self.vf_share {
                vec![(physnet.clone(), self.vfs_per_pod)]
            } else {
                Vec::new()
            };
            pods.push(SimPod { name: format!("pod-{i}"), gpus: size, arrival: t, duration, vfs });
        }
        Ok(pods)
    }
}

fn exp_sample(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    let u: f64 = rng.random::<f64>();
    -mean * (1.0 - u).ln()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorkloadDoc {
    api_version: String,
    kind: String,
    generate: Generate,
}

// The slice of a Pod manifest the simulator reads. Unknown fields are ignored, as kubectl would
// accept the same manifest.
#[derive(Deserialize)]
struct PodDoc {
    kind: Option<String>,
    #[serde(default)]
    metadata: PodMeta,
    #[serde(default)]
    spec: PodSpecDoc,
}

#[derive(Default, Deserialize)]
struct PodMeta {
    name: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpecDoc {
    #[serde(default)]
    containers: Vec<ContainerDoc>,
    #[serde(default)]
    init_containers: Vec<ContainerDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerDoc {
    #[serde(default)]
    name: String,
    #[serde(default)]
    restart_policy: Option<String>,
    #[serde(default)]
    resources: ResourcesDoc,
}

#[derive(Default, Deserialize)]
struct ResourcesDoc {
    #[serde(default)]
    limits: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    requests: BTreeMap<String, serde_json::Value>,
}

/// A container's amount of `resource`: the quantities are strings or YAML numbers (both are valid
/// quantities).
fn container_amount(c: &ContainerDoc, resource: &str, where_: &str) -> Result<u64, String> {
    let mut quantities = Vec::new();
    for (field, map) in [("requests", &c.resources.requests), ("limits", &c.resources.limits)] {
        match map.get(resource) {
            None => {}
            Some(serde_json::Value::String(s)) => quantities.push(s.clone()),
            Some(serde_json::Value::Number(n)) => quantities.push(n.to_string()),
            Some(other) => {
                return Err(format!("{where_}: resources.{field}.{resource} is {other}, expected a quantity"));
            }
        }
    }
    weft_resources::container_request(&c.name, resource, quantities.iter().map(String::as_str))
        .map_err(|e| format!("{where_}: {e}"))
}

/// The pod's need of `resource` over its containers, as the kubelet counts it.
fn pod_amount(spec: &PodSpecDoc, resource: &str, where_: &str) -> Result<u64, String> {
    let mut amounts = Vec::new();
    for c in &spec.init_containers {
        amounts.push((Stage::of_init(c.restart_policy.as_deref()), container_amount(c, resource, where_)?));
    }
    for c in &spec.containers {
        amounts.push((Stage::App, container_amount(c, resource, where_)?));
    }
    Ok(pod_need(amounts))
}

/// The VFs a pod asks for: every `sriov.weft.io/<physnet>` its containers name, counted as the
/// kubelet counts; physnets it asks none of are left out. Names are shared through `names`.
fn pod_vfs(
    spec: &PodSpecDoc,
    where_: &str,
    names: &mut BTreeMap<String, Arc<str>>,
) -> Result<Vec<(Arc<str>, usize)>, String> {
    let mut resources = std::collections::BTreeSet::new();
    for c in spec.init_containers.iter().chain(&spec.containers) {
        for map in [&c.resources.requests, &c.resources.limits] {
            resources.extend(map.keys().filter(|k| k.starts_with(VF_RESOURCE_PREFIX)));
        }
    }
    let mut vfs = Vec::new();
    for resource in resources {
        let physnet = &resource[VF_RESOURCE_PREFIX.len()..];
        if !crate::cluster::valid_physnet(physnet) {
            return Err(format!(
                "{where_}: resource '{resource}' names no valid physnet (1-63 letters, digits, '-', '_' and '.')"
            ));
        }
        let n = pod_amount(spec, resource, where_)?;
        let n = usize::try_from(n).map_err(|_| format!("{where_}: {resource} is too large"))?;
        if n > 0 {
            let name = names.entry(physnet.to_string()).or_insert_with(|| Arc::from(physnet)).clone();
            vfs.push((name, n));
        }
    }
    Ok(vfs)
}

/// Read a workload file: a `SimWorkload` generator or a stream of Pod manifests.
pub fn read_workload(path: &Path) -> Result<Vec<SimPod>, SimError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| SimError::Io { path: path.display().to_string(), source })?;
    parse_workload(&text, &path.display().to_string())
}

/// Parse workload text (see [`read_workload`]).
pub fn parse_workload(text: &str, source_name: &str) -> Result<Vec<SimPod>, SimError> {
    let fmt = |m: String| SimError::Format { source_name: source_name.to_string(), message: m };
    if text.lines().any(|l| l.trim() == "kind: SimWorkload") {
        let doc: WorkloadDoc = serde_saphyr::from_str(text).map_err(|e| fmt(e.to_string()))?;
        if doc.api_version != crate::API_VERSION || doc.kind != "SimWorkload" {
            return Err(fmt(format!("expected apiVersion {} kind SimWorkload", crate::API_VERSION)));
        }
        return doc.generate.pods();
    }
    let docs: Vec<PodDoc> = serde_saphyr::from_multiple(text).map_err(|e| fmt(e.to_string()))?;
    let mut pods = Vec::new();
    let mut physnets = BTreeMap::new();
    for (i, d) in docs.into_iter().enumerate() {
        let name = d.metadata.name.clone().unwrap_or_else(|| format!("document-{i}"));
        let where_ = format!("document {} (pod '{name}')", i + 1);
        if d.kind.as_deref() != Some("Pod") {
            return Err(fmt(format!("{where_}: kind is {:?}; the simulator reads Pods", d.kind.unwrap_or_default())));
        }
        let gpus = pod_amount(&d.spec, GPU_RESOURCE, &where_).map_err(fmt)?;
        let gpus = usize::try_from(gpus).map_err(|_| fmt(format!("{where_}: {GPU_RESOURCE} is too large")))?;
        if gpus == 0 {
            return Err(fmt(format!("{where_}: requests no {GPU_RESOURCE}; the simulator places GPU pods")));
        }
        let vfs = pod_vfs(&d.spec, &where_, &mut physnets).map_err(fmt)?;
        let seconds = |key: &str| -> Result<f64, SimError> {
            let v =
                d.metadata.annotations.get(key).ok_or_else(|| fmt(format!("{where_}: annotation {key} is missing")))?;
            let x: f64 =
                v.parse().map_err(|_| fmt(format!("{where_}: annotation {key}='{v}' is not a number of seconds")))?;
            if !x.is_finite() || x < 0.0 {
                return Err(fmt(format!("{where_}: annotation {key}='{v}' must be ≥ 0")));
            }
            Ok(x)
        };
        if pods.len() == crate::MAX_PODS {
            return Err(fmt(format!("more than {} pods; the simulator takes at most that many", crate::MAX_PODS)));
        }
        pods.push(SimPod {
            name,
            gpus,
            arrival: seconds(ARRIVAL_ANNOTATION)?,
            duration: seconds(DURATION_ANNOTATION)?,
            vfs,
        });
    }
    pods.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_deterministic_and_follows_the_mix() {
        let g = Generate::default_for(640, 4000, 3);
        let a = g.pods().unwrap();
        assert_eq!(a, g.pods().unwrap());
        assert_eq!(a.len(), 4000);
        assert!(a.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        let ones = a.iter().filter(|p| p.gpus == 1).count() as f64 / 4000.0;
        assert!((ones - 0.45).abs() < 0.05, "share of 1-GPU pods {ones}");
        assert!(a.iter().all(|p| [1, 2, 4, 8].contains(&p.gpus)));
    }

    #[test]
    fn pod_manifests_are_read_like_kubelet_counts_gpus() {
        let text = r#"
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  annotations: {sim.weft.io/arrival: "10", sim.weft.io/duration: "600"}
spec:
  initContainers:
    - name: warm
      resources: {limits: {nvidia.com/gpu: 1}}
  containers:
    - name: a
      resources: {limits: {nvidia.com/gpu: "2"}}
    - name: b
      resources: {requests: {nvidia.com/gpu: 2}}
---
apiVersion: v1
kind: Pod
metadata:
  name: early
  annotations: {sim.weft.io/arrival: "1", sim.weft.io/duration: "5"}
spec:
  containers:
    - name: a
      resources: {limits: {nvidia.com/gpu: 1}}
"#;
        let pods = parse_workload(text, "w.yaml").unwrap();
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].name, "early");
        assert_eq!(pods[1].gpus, 4);
        assert_eq!(pods[1].duration, 600.0);
    }

    #[test]
    fn sidecars_and_any_whole_quantity_notation_count_as_the_kubelet_counts_them() {
        let text = r#"
kind: Pod
metadata:
  name: served
  annotations: {sim.weft.io/arrival: "0", sim.weft.io/duration: "60"}
spec:
  initContainers:
    - name: proxy
      restartPolicy: Always
      resources: {limits: {nvidia.com/gpu: 1}}
    - name: warm
      resources: {limits: {nvidia.com/gpu: 2000m}}
  containers:
    - name: a
      resources: {requests: {nvidia.com/gpu: 1}, limits: {nvidia.com/gpu: "2"}}
"#;
        // warm runs beside the sidecar: 1 + 2 = 3; afterwards app 2 + sidecar 1 = 3.
        assert_eq!(parse_workload(text, "w").unwrap()[0].gpus, 3);
        let fractional = text.replace("2000m", "500m");
        let e = parse_workload(&fractional, "w").unwrap_err().to_string();
        assert!(e.contains("container 'warm'") && e.contains("500m"), "{e}");
    }

    #[test]
    fn bad_manifests_name_the_document_and_field() {
        let text = "kind: Pod\nmetadata: {name: x, annotations: {sim.weft.io/arrival: '1'}}\nspec: {containers: [{resources: {limits: {nvidia.com/gpu: 1}}}]}\n";
        let e = parse_workload(text, "w.yaml").unwrap_err().to_string();
        assert!(e.contains("w.yaml") && e.contains("pod 'x'") && e.contains(DURATION_ANNOTATION), "{e}");
        let text = "kind: Deployment\nmetadata: {name: d}\n";
        assert!(parse_workload(text, "w").unwrap_err().to_string().contains("Deployment"));
    }

    #[test]
    fn the_vf_share_adds_vf_asks_without_changing_the_pods() {
        let with = Generate::default_for(640, 4000, 3);
        assert_eq!(with.vf_share, Generate::DEFAULT_VF_SHARE);
        let without = Generate { vf_share: 0.0, ..with.clone() };
        let (a, b) = (with.pods().unwrap(), without.pods().unwrap());
        assert!(b.iter().all(|p| p.vfs.is_empty()));
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.gpus, x.arrival, x.duration), (y.gpus, y.arrival, y.duration), "{}", x.name);
        }
        let asking: Vec<&SimPod> = a.iter().filter(|p| !p.vfs.is_empty()).collect();
        let share = asking.len() as f64 / a.len() as f64;
        assert!((share - 0.5).abs() < 0.05, "share asking VFs {share}");
        assert!(asking.iter().all(|p| p.vfs.len() == 1 && &*p.vfs[0].0 == "fabric" && p.vfs[0].1 == 1));
        assert_eq!(a, with.pods().unwrap(), "deterministic");
    }

    #[test]
    fn a_generator_file_reads_the_vf_fields_and_defaults_to_none() {
        let base = "apiVersion: weft.io/v1alpha1\nkind: SimWorkload\ngenerate:\n  pods: 200\n  seed: 2\n  sizes: {1: 1}\n  meanInterarrivalSeconds: 1\n  meanDurationSeconds: 10\n";
        assert!(parse_workload(base, "w").unwrap().iter().all(|p| p.vfs.is_empty()), "no vfShare: no VFs");
        let text = format!("{base}  vfShare: 1\n  vfsPerPod: 2\n  vfPhysnet: rail-0\n");
        let pods = parse_workload(&text, "w").unwrap();
        assert!(pods.iter().all(|p| p.vfs == [(Arc::from("rail-0"), 2)]), "{:?}", pods[0]);
        let e = parse_workload(&format!("{base}  vfShare: 1.5\n"), "w").unwrap_err().to_string();
        assert!(e.contains("vfShare") && e.contains("1.5"), "{e}");
        let e = parse_workload(&format!("{base}  vfShare: 0.5\n  vfsPerPod: 0\n"), "w").unwrap_err().to_string();
        assert!(e.contains("vfsPerPod"), "{e}");
        let e = parse_workload(&format!("{base}  vfShare: 0.5\n  vfPhysnet: 'a b'\n"), "w").unwrap_err().to_string();
        assert!(e.contains("vfPhysnet") && e.contains("'a b'"), "{e}");
    }

    #[test]
    fn pod_manifests_ask_for_vfs_as_the_kubelet_counts_them() {
        let text = r#"
kind: Pod
metadata:
  name: rdma
  annotations: {sim.weft.io/arrival: "0", sim.weft.io/duration: "60"}
spec:
  initContainers:
    - name: setup
      resources: {limits: {sriov.weft.io/fabric: 3}}
  containers:
    - name: a
      resources: {limits: {nvidia.com/gpu: 2, sriov.weft.io/fabric: "1", sriov.weft.io/storage: 1}}
    - name: b
      resources: {requests: {sriov.weft.io/fabric: 1}}
---
kind: Pod
metadata:
  name: plain
  annotations: {sim.weft.io/arrival: "1", sim.weft.io/duration: "60"}
spec:
  containers:
    - name: a
      resources: {limits: {nvidia.com/gpu: 1, sriov.weft.io/fabric: 0}}
"#;
        let pods = parse_workload(text, "w").unwrap();
        // fabric: app 1 + 1 = 2, init peak 3: 3. storage: 1.
        assert_eq!(pods[0].vfs, [(Arc::from("fabric"), 3), (Arc::from("storage"), 1)]);
        assert_eq!(pods[0].vf_count(), 4);
        assert!(pods[1].vfs.is_empty(), "0 VFs is no ask");
        let bad = text.replace("sriov.weft.io/storage: 1", "sriov.weft.io/storage: 500m");
        let e = parse_workload(&bad, "w").unwrap_err().to_string();
        assert!(e.contains("pod 'rdma'") && e.contains("sriov.weft.io/storage") && e.contains("500m"), "{e}");
        let bad = text.replace("sriov.weft.io/storage", "sriov.weft.io/-x");
        let e = parse_workload(&bad, "w").unwrap_err().to_string();
        assert!(e.contains("pod 'rdma'") && e.contains("'sriov.weft.io/-x'"), "{e}");
    }

    #[test]
    fn generator_rejects_nonsense() {
        let mut g = Generate::default_for(8, 10, 1);
        g.mean_interarrival_seconds = 0.0;
        assert!(g.pods().is_err());
        let mut g = Generate::default_for(8, 10, 1);
        g.sizes.clear();
        assert!(g.pods().is_err());
    }
}
