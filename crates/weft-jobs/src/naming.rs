//! Volcano's names: pods `<job>-<task>-<i>`, domain names `<hostname>.<subdomain>` (by default
//! `<job>-<task>-<i>.<job>`), the task and index of a pod, and the labels and annotations
//! Volcano's job controller puts on every pod it creates.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::job::{API_VERSION, Job, TaskSpec};

/// Pod label and annotation: the pod's index within its task (label since Volcano v1.9).
pub const TASK_INDEX_KEY: &str = "volcano.sh/task-index";
/// Pod label and annotation: the pod's task name.
pub const TASK_SPEC_KEY: &str = "volcano.sh/task-spec";
/// Pod label and annotation: the job's name.
pub const JOB_NAME_KEY: &str = "volcano.sh/job-name";
/// Pod label: the job's namespace.
pub const JOB_NAMESPACE_KEY: &str = "volcano.sh/job-namespace";
/// Pod label and annotation: the job's queue.
pub const QUEUE_NAME_KEY: &str = "volcano.sh/queue-name";
/// Pod annotation: the PodGroup, `<job>-<job uid>`.
pub const POD_GROUP_KEY: &str = "scheduling.k8s.io/group-name";
/// Job and pod annotation and label: the job goes to another cluster (set on jobs whose queue has
/// `extendClusters`).
pub const JOB_FORWARDING_KEY: &str = "volcano.sh/job-forwarding";
/// Pod annotation: the task's `topologyPolicy`.
pub const NUMA_POLICY_KEY: &str = "volcano.sh/numa-topology-policy";
/// Pod label: the pod's partition (`index / partitionSize`) when its task has a partition policy.
pub const PARTITION_ID_KEY: &str = "volcano.sh/partition-id";
/// Job annotations Volcano copies onto every pod (the first two as labels too, from job labels).
const COPIED_ANNOTATIONS: [&str; 3] =
    ["volcano.sh/preemptable", "volcano.sh/cooldown-time", "volcano.sh/revocable-zone"];
/// Job labels Volcano copies onto every pod.
const COPIED_LABELS: [&str; 2] = ["volcano.sh/preemptable", "volcano.sh/cooldown-time"];

/// `<job>-<task>-<index>` (Volcano's `PodNameFmt`).
pub fn pod_name(job: &str, task: &str, index: usize) -> String {
    format!("{job}-{task}-{index}")
}

/// The DNS name of replica `index` of `task`: `hostname.subdomain`, where hostname is the
/// template's `hostname` or the pod name, and subdomain the template's `subdomain` or the job name
/// (Volcano's `MakeDomainName`). No namespace: it resolves through the pod's DNS search path.
pub fn domain_name(job: &str, task: &TaskSpec, index: usize) -> String {
    let spec = task.template.spec.as_ref();
    let hostname = spec.and_then(|s| s.hostname.as_deref()).filter(|h| !h.is_empty());
    let subdomain = spec.and_then(|s| s.subdomain.as_deref()).filter(|s| !s.is_empty()).unwrap_or(job);
    match hostname {
        Some(h) => format!("{h}.{subdomain}"),
        None => format!("{}.{subdomain}", pod_name(job, &task.name, index)),
    }
}

/// Whether the task's template fixes the hostname (then every replica has the same DNS name and
/// Volcano's svc and ssh plugins list it once).
pub fn template_sets_hostname(task: &TaskSpec) -> bool {
    task.template.spec.as_ref().and_then(|s| s.hostname.as_deref()).is_some_and(|h| !h.is_empty())
}

/// The replica count of a task as a `usize` (negative counts are zero).
pub fn replicas(task: &TaskSpec) -> usize {
    usize::try_from(task.replicas).unwrap_or(0)
}

/// The pod's index under its task: the last `-` part of its name when the name has at least three
/// parts (Volcano's `GetPodIndexUnderTask`), else `None`.
pub fn pod_index(pod_name: &str) -> Option<&str> {
    let parts: Vec<&str> = pod_name.split('-').collect();
    if parts.len() >= 3 { parts.last().copied() } else { None }
}

/// The pod's index as a number, when its name ends in one.
pub fn pod_index_number(pod_name: &str) -> Option<usize> {
    pod_index(pod_name).and_then(|i| i.parse().ok())
}

/// The pod's task name: the `volcano.sh/task-spec` annotation (what Volcano's plugins read), else
/// the label of the same name.
pub fn pod_task(pod: &Pod) -> Option<&str> {
    let meta = &pod.metadata;
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(TASK_SPEC_KEY))
        .or_else(|| meta.labels.as_ref().and_then(|l| l.get(TASK_SPEC_KEY)))
        .map(String::as_str)
}

/// The controller owner reference a job-level object or pod carries to its Job.
pub fn owner_reference(job: &Job) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: "Job".to_owned(),
        name: job.job_name().to_owned(),
        uid: job.job_uid().to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The pod Volcano's job controller creates for replica `index` of `task` (`createJobPod`), before
/// any plugin runs: the template with name, namespace, labels, annotations, owner reference and
/// scheduler/priority class falling back to the job's. Used by `weft jobs render` and tests.
///
/// Also as Volcano does: the job's `spec.volumes` as PVC volumes mounted in every container (the
/// volume name is `<job>-` and twelve random characters there, a fixed stand-in here; a claim
/// Volcano creates itself is named `<job>-pvc-` and twelve random characters); the task's
/// `topologyPolicy` as an annotation; the job's preemptable, cooldown-time and revocable-zone
/// annotations (and the first two labels); the job-disruption-budget annotation; the partition
/// label; and the job-forwarding label and annotation only when the job carries
/// `volcano.sh/job-forwarding: "true"` (which Volcano's controller sets for queues with
/// `extendClusters`).
pub fn volcano_pod(job: &Job, task: &TaskSpec, index: usize) -> Pod {
    let job_name = job.job_name();
    let mut meta = task.template.metadata.clone().unwrap_or_default();
    let mut spec = task.template.spec.clone().unwrap_or_default();
    meta.name = Some(pod_name(job_name, &task.name, index));
    meta.namespace = Some(job.job_namespace().to_owned());
    meta.owner_references = Some(vec![owner_reference(job)]);
    let task_name = if task.name.is_empty() { "default" } else { task.name.as_str() };
    let queue = job.spec.queue.clone().unwrap_or_else(|| "default".to_owned());

    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(TASK_INDEX_KEY.into(), index.to_string());
    labels.insert(JOB_NAME_KEY.into(), job_name.into());
    labels.insert(TASK_SPEC_KEY.into(), task_name.into());
    labels.insert(JOB_NAMESPACE_KEY.into(), job.job_namespace().into());
    labels.insert(QUEUE_NAME_KEY.into(), queue.clone());
    let job_labels = job.metadata.labels.clone().unwrap_or_default();
    for key in COPIED_LABELS {
        if let Some(v) = job_labels.get(key) {
            labels.insert(key.into(), v.clone());
        }
    }
    let job_annotations = job.metadata.annotations.clone().unwrap_or_default();
    let forwarding = job_annotations.get(JOB_FORWARDING_KEY).is_some_and(|v| v == "true");
    if forwarding {
        labels.insert(JOB_FORWARDING_KEY.into(), "true".into());
    }
    if let Some(size) = task.extra.get("partitionPolicy").and_then(|p| p.get("partitionSize")).and_then(|v| v.as_i64())
    {
        let id = if size <= 0 { 0 } else { i64::try_from(index).unwrap_or(i64::MAX) / size };
        labels.insert(PARTITION_ID_KEY.into(), id.to_string());
    }

    let version = job.status.as_ref().and_then(|s| s.version).unwrap_or(0);
    let retries = job.status.as_ref().and_then(|s| s.retry_count).unwrap_or(0);
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(TASK_INDEX_KEY.into(), index.to_string());
    annotations.insert(TASK_SPEC_KEY.into(), task_name.into());
    annotations.insert(POD_GROUP_KEY.into(), format!("{job_name}-{}", job.job_uid()));
    annotations.insert(JOB_NAME_KEY.into(), job_name.into());
    annotations.insert(QUEUE_NAME_KEY.into(), queue);
    annotations.insert("volcano.sh/job-version".into(), version.to_string());
    annotations.insert("volcano.sh/template-uid".into(), format!("{job_name}-{}", task.name));
    annotations.insert("volcano.sh/job-retry-count".into(), retries.to_string());
    if let Some(policy) = task.extra.get("topologyPolicy").and_then(|v| v.as_str()).filter(|p| !p.is_empty()) {
        annotations.insert(NUMA_POLICY_KEY.into(), policy.to_owned());
    }
    for key in COPIED_ANNOTATIONS {
        if let Some(v) = job_annotations.get(key) {
            annotations.insert(key.into(), v.clone());
        }
    }
    match (job_annotations.get("volcano.sh/jdb-min-available"), job_annotations.get("volcano.sh/jdb-max-unavailable")) {
        (Some(v), _) => {
            annotations.insert("volcano.sh/jdb-min-available".into(), v.clone());
        }
        (None, Some(v)) => {
            annotations.insert("volcano.sh/jdb-max-unavailable".into(), v.clone());
        }
        (None, None) => {}
    }
    if forwarding {
        annotations.insert(JOB_FORWARDING_KEY.into(), "true".into());
    }

    if spec.scheduler_name.as_deref().is_none_or(str::is_empty) {
        spec.scheduler_name = job.spec.scheduler_name.clone();
    }
    if spec.priority_class_name.as_deref().is_none_or(str::is_empty) {
        spec.priority_class_name = job.spec.extra.get("priorityClassName").and_then(|v| v.as_str()).map(str::to_owned);
    }
    add_job_volumes(job, &mut spec);
    Pod { metadata: meta, spec: Some(spec), status: None }
}

/// Volcano's `spec.volumes` handling in `createJobPod`: one PVC volume per distinct claim, mounted
/// at its `mountPath` in every container (a second volume with the same claim is skipped, mount
/// and all).
fn add_job_volumes(job: &Job, spec: &mut k8s_openapi::api::core::v1::PodSpec) {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Volume, VolumeMount};
    let Some(volumes) = job.spec.extra.get("volumes").and_then(|v| v.as_array()) else { return };
    let job_name = job.job_name();
    let mut seen = Vec::new();
    for (i, v) in volumes.iter().enumerate() {
        let claim = match v.get("volumeClaimName").and_then(|c| c.as_str()).filter(|c| !c.is_empty()) {
            Some(c) => c.to_owned(),
            None => format!("{job_name}-pvc-{:012}", i),
        };
        if seen.contains(&claim) {
            continue;
        }
        seen.push(claim.clone());
        let name = format!("{job_name}-{:012}", i);
        spec.volumes.get_or_insert_with(Vec::new).push(Volume {
            name: name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource { claim_name: claim, read_only: None }),
            ..Default::default()
        });
        let mount_path = v.get("mountPath").and_then(|m| m.as_str()).unwrap_or_default().to_owned();
        for c in &mut spec.containers {
            c.volume_mounts.get_or_insert_with(Vec::new).push(VolumeMount {
                name: name.clone(),
                mount_path: mount_path.clone(),
                ..Default::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};

    use super::*;

    fn task(name: &str, hostname: Option<&str>, subdomain: Option<&str>) -> TaskSpec {
        TaskSpec {
            name: name.into(),
            replicas: 2,
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    hostname: hostname.map(Into::into),
                    subdomain: subdomain.map(Into::into),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }
    }

    #[test]
    fn domain_names_follow_make_domain_name() {
        assert_eq!(domain_name("j", &task("mpi-worker", None, None), 1), "j-mpi-worker-1.j");
        assert_eq!(domain_name("j", &task("w", Some("fixed"), None), 1), "fixed.j");
        assert_eq!(domain_name("j", &task("w", None, Some("sub")), 0), "j-w-0.sub");
        assert_eq!(domain_name("j", &task("w", Some(""), Some("")), 0), "j-w-0.j");
    }

    #[test]
    fn pod_index_is_the_last_dash_part_of_three_or_more() {
        assert_eq!(pod_index("j-w-3"), Some("3"));
        assert_eq!(pod_index("my-job-mpi-worker-12"), Some("12"));
        assert_eq!(pod_index("a-b"), None);
        assert_eq!(pod_index_number("j-w-x"), None);
    }

    #[test]
    fn volcano_pod_carries_volcano_labels_and_annotations() {
        let mut job = Job::new("j", crate::JobSpec { tasks: vec![task("w", None, None)], ..Default::default() });
        job.metadata.namespace = Some("ns".into());
        job.metadata.uid = Some("u1".into());
        let pod = volcano_pod(&job, &job.spec.tasks[0], 1);
        assert_eq!(pod.metadata.name.as_deref(), Some("j-w-1"));
        let labels = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels[TASK_INDEX_KEY], "1");
        assert_eq!(labels[JOB_NAMESPACE_KEY], "ns");
        let ann = pod.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(ann[POD_GROUP_KEY], "j-u1");
        assert_eq!(ann["volcano.sh/template-uid"], "j-w");
        assert_eq!(pod_task(&pod), Some("w"));
        let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("Job", "u1", Some(true)));
    }
}
