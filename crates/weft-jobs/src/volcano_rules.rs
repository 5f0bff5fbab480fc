//! What Volcano's admission webhook denies, and what Kubernetes would refuse of the pods Volcano
//! then creates, so that weft's webhook denies the same jobs and `weft jobs render` fails on them
//! with the same reasons.
//!
//! [`create_problems`] follows Volcano's `validateJobCreate`
//! (`pkg/webhooks/admission/jobs/validate/admit_job.go`, at the commit weft's golden tests use):
//! its checks in its order and its messages, quirks included (a duplicated task name stops the
//! task checks; the pod name checked is `<job>-<task>-<task index>`). Where Volcano's message lists
//! Go map contents (the valid policy events and actions) the list is sorted here. Two of its checks
//! need the cluster (the queue exists, is open and is a leaf) and are reported as not checked. Of
//! Kubernetes' pod template validation, the parts a Job gets wrong in practice are checked: at
//! least one container, container names that are DNS labels and unique.
//!
//! weft adds what Kubernetes would refuse later and Volcano lets through: task names that are not
//! DNS labels (they become pod names, hostnames and, in ray's plugin, part of a shell command),
//! negative replicas, more pods than [`MAX_TOTAL_REPLICAS`] (configurable), and host lists too
//! large for the ConfigMap the svc plugin keeps them in.
//!
//! [`update_problems`] follows Volcano's `validateJobUpdate` for what can be judged from the two
//! objects (replicas and minAvailable bounds, partitions, the task count); its rule that only
//! `minAvailable`, task `replicas` and `priorityClassName` may change is left to Volcano.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use weft_resources::names::is_dns1123_label as is_dns_label;

use crate::job::{Job, TaskSpec};
use crate::naming;

/// Default cap on a job's pods (the sum of its tasks' replicas). Every pod of a job carries host
/// lists of the whole job (svc's `VC_*_HOSTS`, TF_CONFIG, the MPI hostfile): beyond this, the lists
/// outgrow what one pod or ConfigMap can hold long before the cluster runs out of nodes.
pub const MAX_TOTAL_REPLICAS: u64 = 10_000;

/// The most a ConfigMap holds (etcd's request limit as Kubernetes documents it: 1 MiB).
pub const MAX_CONFIG_MAP_BYTES: usize = 1 << 20;

/// Policy events Volcano accepts in a lifecycle policy (`policyEventMap` entries set to true).
const POLICY_EVENTS: [&str; 8] =
    ["*", "JobUnknown", "JobUpdated", "PodEvicted", "PodFailed", "PodPending", "TaskCompleted", "TaskFailed"];
/// Actions Volcano accepts (`policyActionMap` entries set to true).
const POLICY_ACTIONS: [&str; 8] = [
    "AbortJob",
    "CompleteJob",
    "RestartJob",
    "RestartPartition",
    "RestartPod",
    "RestartTask",
    "ResumeJob",
    "TerminateJob",
];

/// What a create-time validation found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems {
    /// Reasons to deny the job.
    pub errors: Vec<String>,
    /// What could not be judged without the cluster.
    pub unchecked: Vec<String>,
}

/// Problems Volcano's webhook (and Kubernetes, for the pods) would find in a job being created.
/// `max_replicas` caps the job's pods.
pub fn create_problems(job: &Job, raw: &Value, max_replicas: u64) -> Problems {
    let mut p = Problems::default();
    let tasks = &job.spec.tasks;
    let job_name = job.job_name();
    if tasks.is_empty() {
        p.errors.push("No task specified in job spec".into());
        return p;
    }
    if let Some(args) = job.spec.plugins.as_ref().and_then(|m| m.get("mpi")) {
        // Volcano's mpi plugin reads its -master flag leniently; its default is "master".
        let master = mpi_master(args);
        if job.task(&master).is_none() {
            p.errors.push("The specified mpi master task was not found".into());
            return p;
        }
    }
    let mut b = Vec::new();
    b.extend(network_topology(raw.pointer("/spec/networkTopology")));
    let mut names = BTreeSet::new();
    let mut total: i64 = 0;
    let mut has_dependencies = false;
    for (index, task) in tasks.iter().enumerate() {
        let raw_task = raw.pointer(&format!("/spec/tasks/{index}")).unwrap_or(&Value::Null);
        if raw_task.get("dependsOn").is_some_and(|d| !d.is_null()) {
            has_dependencies = true;
        }
        if task.min_available.is_some_and(|m| m > task.replicas) {
            b.push(format!("'minAvailable' is greater than 'replicas' in task: {}, job: {job_name};", task.name));
        }
        total += i64::from(task.replicas);
        if !names.insert(task.name.as_str()) {
            b.push(format!("duplicated task name {};", task.name));
            break;
        }
        if let Some(e) = policies(raw_task.get("policies"), "spec.tasks.policies") {
            b.push(e);
        }
        b.extend(qualified_name("create pod with name", &naming::pod_name(job_name, &task.name, index)));
        b.extend(task_template(task, index));
        b.extend(topology_policy(task, raw_task, index));
        b.extend(partition_policy(task, raw_task, job_name));
    }
    if let Some(e) = qualified_name("create job with name", job_name) {
        b.push(e.trim_end_matches(';').to_owned());
    }
    if total < i64::from(job.spec.min_available.unwrap_or(0)) {
        b.push("job 'minAvailable' should not be greater than total replicas in tasks;".into());
    }
    if let Some(e) = policies(raw.pointer("/spec/policies"), "spec.policies") {
        b.push(e);
    }
    for name in job.spec.plugins.iter().flat_map(|m| m.keys()) {
        match crate::plugins::info(name) {
            Some(i) if i.in_volcano => {}
            Some(_) => b.push(format!(
                "unable to find job plugin: {name}; (weft has it: put it in annotation {} instead)",
                crate::PLUGINS_ANNOTATION
            )),
            None => b.push(format!("unable to find job plugin: {name};")),
        }
    }
    b.extend(volumes(raw.pointer("/spec/volumes")));
    p.unchecked.push(format!(
        "queue {:?}: Volcano also requires it to exist, be Open and be a leaf queue (not checked without the cluster)",
        job.spec.queue.as_deref().unwrap_or("default")
    ));
    if has_dependencies && !is_dag(tasks, raw) {
        b.push("job has dependencies between tasks, but doesn't form a directed acyclic graph(DAG);".into());
    }
    p.errors.extend(b);

    // What Kubernetes would refuse later, and weft's own limits.
    for task in tasks {
        if !is_dns_label(&task.name) {
            p.errors.push(format!(
                "task name {:?} is not a DNS label (lowercase letters, digits and '-', starting and ending with a letter or \
                 digit, at most 63): it becomes the pods' names and hostnames, which Kubernetes refuses",
                task.name
            ));
        }
        if task.replicas < 0 {
            p.errors.push(format!("task {:?}: 'replicas' must be >= 0, not {}", task.name, task.replicas));
        }
    }
    let pods: u64 = tasks.iter().map(|t| u64::try_from(t.replicas).unwrap_or(0)).sum();
    if pods > max_replicas {
        p.errors.push(format!(
            "the job has {pods} pods in all; at most {max_replicas} are accepted (every pod carries the host lists of the \
             whole job; the webhook's --max-job-replicas raises the limit)"
        ));
    } else {
        let bytes = crate::plugins::svc::hosts_data_bytes(job);
        if bytes > MAX_CONFIG_MAP_BYTES {
            p.errors.push(format!(
                "the job's host lists take {bytes} bytes in the svc plugin's ConfigMap {} (each task's hosts twice, as \
                 <task>.host and VC_<TASK>_HOSTS); Kubernetes accepts at most {MAX_CONFIG_MAP_BYTES}: fewer pods or \
                 shorter job and task names",
                crate::plugins::svc::config_map_name(job_name)
            ));
        }
    }
    p
}

/// Problems Volcano's webhook would find in an update from `old` to `new` (the parts of
/// `validateJobUpdate` that need only the two objects).
pub fn update_problems(old: &Job, new: &Job, raw_new: &Value) -> Vec<String> {
    let mut total: i64 = 0;
    for (index, task) in new.spec.tasks.iter().enumerate() {
        if task.replicas < 0 {
            return vec![format!("'replicas' must be >= 0 in task: {}", task.name)];
        }
        if let Some(m) = task.min_available {
            if m < 0 {
                return vec![format!("'minAvailable' must be >= 0 in task: {}", task.name)];
            }
            if m > task.replicas {
                return vec![format!("'minAvailable' must be <= 'replicas' in task: {}", task.name)];
            }
        }
        let raw_task = raw_new.pointer(&format!("/spec/tasks/{index}")).unwrap_or(&Value::Null);
        if let Some(msg) = partition_policy(task, raw_task, new.job_name()) {
            return vec![msg];
        }
        total += i64::from(task.replicas);
    }
    let min = i64::from(new.spec.min_available.unwrap_or(0));
    if min > total {
        return vec!["job 'minAvailable' must not be greater than total replicas".into()];
    }
    if min < 0 {
        return vec!["job 'minAvailable' must be >= 0".into()];
    }
    if let Some(e) = network_topology(raw_new.pointer("/spec/networkTopology")) {
        return vec![e];
    }
    if old.spec.tasks.len() != new.spec.tasks.len() {
        return vec!["job updates may not add or remove tasks".into()];
    }
    Vec::new()
}

/// The master task Volcano's mpi plugin uses: its `-master` flag as Go's flag package reads it
/// (stops at the first problem; the default is `master`).
fn mpi_master(args: &[String]) -> String {
    let defs = crate::plugins::mpi::FLAGS;
    match crate::flags::parse(defs, args, crate::flags::Mode::Lenient) {
        Ok((flags, _)) => flags.string("master").to_owned(),
        Err(_) => "master".to_owned(),
    }
}

fn network_topology(nt: Option<&Value>) -> Option<String> {
    let nt = nt?;
    let allowed = nt.get("highestTierAllowed").is_some_and(|v| !v.is_null());
    let name = nt.get("highestTierName").and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    (allowed && name)
        .then(|| "must not specify 'highestTierAllowed' and 'highestTierName' in networkTopology simultaneously".into())
}

/// Volcano's `validatePolicies`: the first problem (it stops there), with the list of valid
/// events and actions it appends.
fn policies(policies: Option<&Value>, path: &str) -> Option<String> {
    let list = policies?.as_array()?;
    let mut seen_events = BTreeSet::new();
    let mut exit_codes = BTreeSet::new();
    let mut problem = None;
    for policy in list {
        let event = policy.get("event").and_then(Value::as_str).unwrap_or("");
        let events: Vec<&str> = policy
            .get("events")
            .and_then(Value::as_array)
            .map_or_else(Vec::new, |a| a.iter().filter_map(Value::as_str).collect());
        let exit_code = policy.get("exitCode").and_then(Value::as_i64);
        if (!event.is_empty() || !events.is_empty()) && exit_code.is_some() {
            problem = Some("must not specify event and exitCode simultaneously".to_owned());
            break;
        }
        if event.is_empty() && events.is_empty() && exit_code.is_none() {
            problem = Some("either event and exitCode should be specified".to_owned());
            break;
        }
        if let Some(code) = exit_code {
            if code == 0 {
                problem = Some("0 is not a valid error code".to_owned());
                break;
            }
            if !exit_codes.insert(code) {
                problem = Some(format!("duplicate exitCode {code}"));
                break;
            }
            continue;
        }
        // Volcano's getEventList: `events` then `event`, duplicates within one policy removed.
        let mut unique: Vec<&str> = Vec::new();
        for e in events.into_iter().chain((!event.is_empty()).then_some(event)) {
            if !unique.contains(&e) {
                unique.push(e);
            }
        }
        let action = policy.get("action").and_then(Value::as_str).unwrap_or("");
        let mut stop = false;
        for e in unique {
            if !POLICY_EVENTS.contains(&e) {
                problem = Some(format!("{path}: Invalid value: {e:?}: invalid policy event"));
                stop = true;
                break;
            }
            if !POLICY_ACTIONS.contains(&action) {
                problem = Some(format!("{path}: Invalid value: {action:?}: invalid policy action"));
                stop = true;
                break;
            }
            if !seen_events.insert(e) {
                problem = Some(format!("duplicate event {e}  across different policy"));
                stop = true;
                break;
            }
        }
        if stop {
            break;
        }
    }
    if problem.is_none() && seen_events.contains("*") && seen_events.len() > 1 {
        problem = Some("if there's * here, no other policy should be here".to_owned());
    }
    problem.map(|p| {
        format!(
            "{p}; valid events are [{}], valid actions are [{}];",
            POLICY_EVENTS.join(" "),
            POLICY_ACTIONS.join(" ")
        )
    })
}

/// apimachinery's `IsQualifiedName` of `name`, as Volcano reports it: `<what> <name> validate
/// failed [<messages>];`.
fn qualified_name(what: &str, name: &str) -> Option<String> {
    let (prefix, local) = match name.split_once('/') {
        Some((p, l)) => (Some(p), l),
        None => (None, name),
    };
    let mut msgs = Vec::new();
    if local.is_empty() {
        msgs.push("name part must be non-empty".to_owned());
    } else {
        if local.len() > 63 {
            msgs.push("name part must be no more than 63 characters".to_owned());
        }
        let b = local.as_bytes();
        let ok = b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c));
        if !ok {
            msgs.push(
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an \
                 alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is \
                 '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
                    .to_owned(),
            );
        }
    }
    if let Some(prefix) = prefix
        && (prefix.is_empty() || !is_dns_subdomain(prefix))
    {
        msgs.push("prefix part must be a lowercase RFC 1123 subdomain".to_owned());
    }
    (!msgs.is_empty()).then(|| format!("{what} {name} validate failed [{}];", msgs.join(" ")))
}

/// A subdomain whose every part is a DNS-1123 label, so at most 63 characters each: stricter than
/// apimachinery's `IsDNS1123Subdomain` (`weft_resources::names`), which bounds only the whole.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// The parts of Kubernetes' pod template validation a job gets wrong in practice, reported as
/// Volcano does (`spec.task[<i>].<field>: <problem>. `).
fn task_template(task: &TaskSpec, index: usize) -> Option<String> {
    let spec = task.template.spec.as_ref();
    let containers = spec.map_or(&[][..], |s| s.containers.as_slice());
    let mut msgs = Vec::new();
    if containers.is_empty() {
        msgs.push("spec.template.spec.containers: Required value".to_owned());
    }
    let mut seen = BTreeSet::new();
    let all = containers
        .iter()
        .map(|c| ("containers", c))
        .chain(spec.and_then(|s| s.init_containers.as_ref()).into_iter().flatten().map(|c| ("initContainers", c)));
    for (i, (field, c)) in all.enumerate() {
        if c.name.is_empty() {
            msgs.push(format!("spec.template.spec.{field}[{i}].name: Required value"));
        } else if !is_dns_label(&c.name) {
            msgs.push(format!(
                "spec.template.spec.{field}[{i}].name: Invalid value: {:?}: a lowercase RFC 1123 label",
                c.name
            ));
        } else if !seen.insert(c.name.as_str()) {
            msgs.push(format!("spec.template.spec.{field}[{i}].name: Duplicate value: {:?}", c.name));
        }
    }
    (!msgs.is_empty()).then(|| format!("spec.task[{index}].{}. ", msgs.join(". ")))
}

/// Volcano's `validateTaskTopoPolicy`: with a topology policy every container needs whole CPUs.
fn topology_policy(task: &TaskSpec, raw_task: &Value, index: usize) -> Option<String> {
    let policy = raw_task.get("topologyPolicy").and_then(Value::as_str).unwrap_or("");
    if policy.is_empty() || policy == "none" {
        return None;
    }
    let spec = task.template.spec.as_ref()?;
    let all = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    for (id, c) in all.enumerate() {
        let res = c.resources.as_ref();
        let requests = res.and_then(|r| r.requests.as_ref()).filter(|r| !r.is_empty());
        let cpu = requests.or_else(|| res.and_then(|r| r.limits.as_ref())).and_then(|m| m.get("cpu"));
        let whole =
            cpu.is_some_and(|q| weft_value(&q.0).is_some_and(|(units, millis)| units * 1000 == millis && units > 0));
        if !whole {
            return Some(format!("the cpu request isn't an integer in spec.task[{index}] container[{id}]."));
        }
    }
    None
}

/// `(Value(), MilliValue())` of a quantity, as apimachinery rounds them.
fn weft_value(q: &str) -> Option<(u64, u64)> {
    Some((weft_resources::value(q).ok()?, weft_resources::milli_value(q).ok()?))
}

/// Volcano's `validatePartitionPolicy`.
fn partition_policy(task: &TaskSpec, raw_task: &Value, job_name: &str) -> Option<String> {
    let pp = raw_task.get("partitionPolicy").filter(|v| !v.is_null())?;
    let int = |k: &str| pp.get(k).and_then(Value::as_i64).unwrap_or(0);
    let (total, size, min) = (int("totalPartitions"), int("partitionSize"), int("minPartitions"));
    let name = &task.name;
    let mut msg = if total <= 0 {
        format!("'TotalPartitions' must be greater than 0 in task: {name}, job: {job_name}")
    } else if size <= 0 {
        format!("'PartitionSize' must be greater than 0 in task: {name}, job: {job_name}")
    } else if i64::from(task.replicas) != total * size {
        format!("'Replicas' are not equal to TotalPartitions*PartitionSize in task: {name}, job: {job_name}")
    } else if task.min_available.is_some_and(|m| min > 0 && min * size != i64::from(m)) {
        format!("'MinAvailable' is not equal to MinPartitions*PartitionSize in task: {name}, job: {job_name}")
    } else {
        String::new()
    };
    msg.extend(network_topology(pp.get("networkTopology")));
    (!msg.is_empty()).then_some(msg)
}

/// Volcano's `validateIO`: the first problem with `spec.volumes`.
fn volumes(volumes: Option<&Value>) -> Option<String> {
    let mut paths = BTreeSet::new();
    for v in volumes?.as_array()? {
        let path = v.get("mountPath").and_then(Value::as_str).unwrap_or("");
        if path.is_empty() {
            return Some("mountPath is required;".into());
        }
        if !paths.insert(path) {
            return Some(format!("duplicated mountPath: {path};"));
        }
        let claim = v.get("volumeClaim").is_some_and(|c| !c.is_null());
        let claim_name = v.get("volumeClaimName").and_then(Value::as_str).unwrap_or("");
        if !claim && claim_name.is_empty() {
            return Some("either VolumeClaim or VolumeClaimName must be specified;".into());
        }
        if !claim_name.is_empty() {
            if claim {
                return Some(
                    "conflict: If you want to use an existing PVC, just specify VolumeClaimName.If you want to create a new \
                     PVC, you do not need to specify VolumeClaimName"
                        .into(),
                );
            }
            if !is_dns_subdomain(claim_name) {
                return Some(format!("invalid VolumeClaimName {claim_name} : a lowercase RFC 1123 subdomain"));
            }
        }
    }
    None
}

/// Whether the tasks' `dependsOn` form a DAG, as Volcano's `topoSort` decides it: each name in a
/// task's `dependsOn` counts once towards its in-degree (a name listed twice, or a task the job
/// lacks, therefore never lets it be sorted), and sorting removes one edge per depended-on task.
fn is_dag(tasks: &[TaskSpec], raw: &Value) -> bool {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut indegree: BTreeMap<String, usize> = BTreeMap::new();
    for (i, t) in tasks.iter().enumerate() {
        indegree.insert(t.name.clone(), 0);
        let names = raw.pointer(&format!("/spec/tasks/{i}/dependsOn/name")).and_then(Value::as_array);
        for d in names.into_iter().flatten().filter_map(Value::as_str) {
            graph.entry(d.to_owned()).or_default().insert(t.name.clone());
            *indegree.entry(t.name.clone()).or_default() += 1;
        }
    }
    let mut ready: Vec<String> = indegree.iter().filter(|(_, d)| **d == 0).map(|(k, _)| k.clone()).collect();
    let mut sorted = 0;
    while let Some(t) = ready.pop() {
        sorted += 1;
        for next in graph.get(&t).into_iter().flatten() {
            if let Some(d) = indegree.get_mut(next) {
                *d -= 1;
                if *d == 0 {
                    ready.push(next.clone());
                }
            }
        }
    }
    sorted == tasks.len()
}
