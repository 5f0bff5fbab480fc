//! What a pod asks for and which GPUs the pods on a node hold. Pure functions over Kubernetes types.

use std::borrow::Borrow;
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use thiserror::Error;
use weft_alloc::{Policy, PreparedNode, Request, allocate};
use weft_resources::{RequestError, pod_request};

/// Pod annotation weft writes when it places a pod: the GPU indices it holds, comma-separated
/// (`"0,1,4,5"`).
pub const GPU_IDS_ANNOTATION: &str = "weft.io/gpu-ids";

/// The extended resource name of a whole NVIDIA GPU.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// `namespace/name` of a pod, for messages.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Namespace (empty when absent).
    pub namespace: String,
    /// Name (empty when absent).
    pub name: String,
}

impl PodRef {
    /// The reference of a pod.
    pub fn of(pod: &Pod) -> PodRef {
        PodRef {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where a pod's GPU set came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuSource {
    /// The pod's [`GPU_IDS_ANNOTATION`].
    Annotation,
    /// Not annotated: the set weft's best-effort allocator picks when the pods are replayed.
    Replayed,
}

/// The GPUs one pod holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodGpus {
    /// The pod.
    pub pod: PodRef,
    /// GPU indices, ascending.
    pub gpus: Vec<usize>,
    /// How they were found.
    pub source: GpuSource,
}

/// Something inconsistent found while accounting a node's GPUs. None of these stops the accounting;
/// each says what was assumed instead.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum UsageIssue {
    /// The pod's device request could not be read; it is counted as holding no GPUs unless annotated.
    #[error("pod {pod}: {error}")]
    BadRequest {
        /// The pod.
        pod: PodRef,
        /// Why.
        error: RequestError,
    },
    /// The annotation is not a comma-separated list of GPU indices; the pod is replayed instead.
    #[error("pod {pod}: annotation {GPU_IDS_ANNOTATION}='{value}' is not a list of GPU indices: {why}")]
    BadAnnotation {
        /// The pod.
        pod: PodRef,
        /// The annotation.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// An annotated GPU index the node does not have; it is ignored.
    #[error("pod {pod}: annotation names GPU{gpu} but the node has {gpus} GPUs; ignored")]
    OutOfRange {
        /// The pod.
        pod: PodRef,
        /// The index.
        gpu: usize,
        /// GPUs on the node.
        gpus: usize,
    },
    /// Two pods' annotations claim one GPU; it stays in use.
    #[error("GPU{gpu} is claimed by both {first} and {second}")]
    Conflict {
        /// The GPU.
        gpu: usize,
        /// The pod accounted first.
        first: PodRef,
        /// The pod accounted second.
        second: PodRef,
    },
    /// The annotation lists a different number of GPUs than the pod requests; the annotation wins.
    #[error("pod {pod}: annotation lists {annotated} GPUs but the pod requests {requested}; using the annotation")]
    CountMismatch {
        /// The pod.
        pod: PodRef,
        /// GPUs in the annotation.
        annotated: usize,
        /// GPUs requested.
        requested: u64,
    },
    /// A replayed pod did not fit in the GPUs left; every remaining GPU is counted as used.
    #[error("pod {pod} requests {requested} GPUs but only {free} are left after the other pods; counting all as used")]
    Overcommitted {
        /// The pod.
        pod: PodRef,
        /// GPUs requested.
        requested: u64,
        /// GPUs free at that point.
        free: usize,
    },
}

/// The GPUs in use on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuUsage {
    /// Bit `i` set when GPU `i` is in use.
    pub used: u128,
    /// The set each GPU-holding pod was found to hold.
    pub pods: Vec<PodGpus>,
    /// Inconsistencies found, in the order met.
    pub issues: Vec<UsageIssue>,
}

impl GpuUsage {
    /// Free GPU indices on a node with `gpus` GPUs, ascending.
    pub fn free(&self, gpus: usize) -> Vec<usize> {
        (0..gpus.min(128)).filter(|&g| self.used & (1u128 << g) == 0).collect()
    }
}

/// Whether a pod still holds its devices: every phase but `Succeeded` and `Failed`.
pub fn holds_devices(pod: &Pod) -> bool {
    !matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// The GPUs held by `pods`, the pods bound to one node (callers pass the pods whose `spec.nodeName`
/// is the node; terminal pods are skipped here).
///
/// 1. Pods with the [`GPU_IDS_ANNOTATION`] hold exactly the GPUs listed (facts, accounted first).
///    Indices past the node's GPUs are ignored; a GPU claimed twice stays used. Both are reported.
/// 2. Pods without it that request `resource` were placed by something other than weft's agent (or
///    before it annotated them). They are replayed in creation order (then namespace, name), each
///    getting the set weft's best-effort allocator picks among the GPUs still free, which is what
///    weft's device plugin would have given them. The result is deterministic.
///
/// Inconsistent input never fails the call: each problem becomes a [`UsageIssue`] and the accounting
/// takes the conservative reading (more GPUs used, not fewer).
pub fn gpus_in_use<P: Borrow<Pod>>(node: &PreparedNode, pods: &[P], resource: &str) -> GpuUsage {
    let n = node.len();
    let mut usage = GpuUsage::default();
    // For each GPU, the index in `usage.pods` of the annotated pod that claimed it first.
    let mut owner: Vec<Option<usize>> = vec![None; n];
    let mut replay: Vec<(&Pod, u64)> = Vec::new();

    for pod in pods.iter().map(Borrow::borrow).filter(|p| holds_devices(p)) {
        let requested = match pod_request(pod, resource) {
            Ok(q) => q,
            Err(error) => {
                usage.issues.push(UsageIssue::BadRequest { pod: PodRef::of(pod), error });
                0
            }
        };
        let annotation = pod.metadata.annotations.as_ref().and_then(|a| a.get(GPU_IDS_ANNOTATION));
        let Some(value) = annotation else {
            if requested > 0 {
                replay.push((pod, requested));
            }
            continue;
        };
        let ids = match parse_gpu_ids(value) {
            Ok(ids) => ids,
            Err(why) => {
                usage.issues.push(UsageIssue::BadAnnotation { pod: PodRef::of(pod), value: value.clone(), why });
                if requested > 0 {
                    replay.push((pod, requested));
                }
                continue;
            }
        };
        let me = usage.pods.len();
        usage.pods.push(PodGpus {
            pod: PodRef::of(pod),
            gpus: Vec::with_capacity(ids.len()),
            source: GpuSource::Annotation,
        });
        if ids.len() as u64 != requested {
            let pod = usage.pods[me].pod.clone();
            usage.issues.push(UsageIssue::CountMismatch { pod, annotated: ids.len(), requested });
        }
        for gpu in ids {
            if gpu >= n {
                usage.issues.push(UsageIssue::OutOfRange { pod: usage.pods[me].pod.clone(), gpu, gpus: n });
                continue;
            }
            match owner[gpu] {
                Some(first) => usage.issues.push(UsageIssue::Conflict {
                    gpu,
                    first: usage.pods[first].pod.clone(),
                    second: usage.pods[me].pod.clone(),
                }),
                None => owner[gpu] = Some(me),
            }
            usage.used |= 1u128 << gpu;
            usage.pods[me].gpus.push(gpu);
        }
        usage.pods[me].gpus.sort_unstable();
    }

    replay.sort_by(|(a, _), (b, _)| {
        let key = |p: &Pod| {
            (
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            )
        };
        key(a).cmp(&key(b))
    });
    for (pod, requested) in replay {
        let free = usage.free(n);
        let count = usize::try_from(requested).unwrap_or(usize::MAX);
        let req = Request { count, available: &free, required: &[] };
        match allocate(node, &Policy::BestEffort, &req) {
            Ok(a) => {
                for &g in &a.gpus {
                    usage.used |= 1u128 << g;
                }
                usage.pods.push(PodGpus { pod: PodRef::of(pod), gpus: a.gpus, source: GpuSource::Replayed });
            }
            Err(_) => {
                usage.issues.push(UsageIssue::Overcommitted { pod: PodRef::of(pod), requested, free: free.len() });
                for &g in &free {
                    usage.used |= 1u128 << g;
                }
                usage.pods.push(PodGpus { pod: PodRef::of(pod), gpus: free, source: GpuSource::Replayed });
            }
        }
    }
    usage
}

/// Parse a [`GPU_IDS_ANNOTATION`] value: comma-separated indices, spaces allowed, no duplicates.
/// An empty value is an empty list.
pub fn parse_gpu_ids(value: &str) -> Result<Vec<usize>, String> {
    let mut ids: Vec<usize> = Vec::new();
    for part in value.split(',').map(str::trim) {
        if part.is_empty() && value.trim().is_empty() {
            continue;
        }
        let id: usize = part.parse().map_err(|_| format!("'{part}' is not a GPU index"))?;
        if ids.contains(&id) {
            return Err(format!("GPU{id} is listed twice"));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// Render GPU indices as a [`GPU_IDS_ANNOTATION`] value.
pub fn format_gpu_ids(gpus: &[usize]) -> String {
    gpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_ids_parse_and_reject_duplicates() {
        assert_eq!(parse_gpu_ids("0, 1,4"), Ok(vec![0, 1, 4]));
        assert_eq!(parse_gpu_ids(""), Ok(vec![]));
        assert!(parse_gpu_ids("1,1").expect_err("duplicate").contains("twice"));
        assert!(parse_gpu_ids("1,,2").expect_err("empty item").contains("''"));
        assert!(parse_gpu_ids("GPU1").expect_err("not a number").contains("GPU1"));
        assert_eq!(format_gpu_ids(&[0, 3]), "0,3");
    }
}
