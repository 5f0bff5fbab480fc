//! Admission decisions for Volcano Jobs and their pods, as `weft webhook` serves them. Pure: JSON
//! in, JSON patches and verdicts out.
//!
//! - [`mutate_job`] (CREATE): Volcano's job defaults and the plugin dependencies.
//! - [`validate_job`] (CREATE, UPDATE): weft's plugins parse strictly and fit the job.
//! - [`PodMutator`]: weft's plugins applied to one pod of the job.

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::job::Job;
use crate::pipeline::JobPlugins;
use crate::plugin::{BuildOptions, PluginError};

/// Settings of the webhook that shape its decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionOptions {
    /// Scheduler name a job without one gets (Volcano's webhook: its first configured scheduler).
    pub scheduler_name: String,
    /// Settings for building plugins (the replica cap among them).
    pub build: BuildOptions,
}

impl Default for AdmissionOptions {
    fn default() -> Self {
        Self { scheduler_name: "volcano".to_owned(), build: BuildOptions::default() }
    }
}

/// Volcano's default `maxRetry` for jobs and tasks.
const DEFAULT_MAX_RETRY: i64 = 3;

/// The JSON patch for a Job being created.
///
/// First Volcano's own defaults, in the order and form of Volcano's mutating webhook
/// (`mutate_job.go`), so that weft's webhook and Volcano's agree whichever runs first:
/// `add /spec/queue` (`default`, if empty), `add /spec/schedulerName` (if empty), `add
/// /spec/maxRetry` (3, if 0), `replace /spec/tasks` (unnamed tasks `default<i>`, `hostNetwork`
/// without dnsPolicy gets `ClusterFirstWithHostNet`, task `minAvailable` defaults to `replicas`
/// or `minPartitions × partitionSize`, task `maxRetry` 0 → 3), `add /spec/minAvailable` (the
/// sum over tasks, if 0), `replace /spec/plugins` (with `svc` for tensorflow/mpi/pytorch/ray and
/// `ssh` for mpi when absent).
///
/// Then weft's: the dependencies of the plugins in the [`crate::PLUGINS_ANNOTATION`] (`svc` for
/// tensorflow/pytorch/mpi/ray/mxnet, `ssh` for mpi) are added to the annotation when neither
/// `spec.plugins` nor the annotation has them. An annotation that does not parse is left alone:
/// validation denies the job with the reason.
pub fn mutate_job(job: &Value, opts: &AdmissionOptions) -> Result<Vec<PatchOperation>, String> {
    let spec = job.get("spec").and_then(Value::as_object).ok_or("the Job has no spec object")?;
    let mut ops = Vec::new();
    let is_unset = |key: &str| spec.get(key).is_none_or(|v| v.is_null() || v == "" || v == 0);
    if is_unset("queue") {
        ops.push(add(&["spec", "queue"], "default".into()));
    }
    if is_unset("schedulerName") {
        ops.push(add(&["spec", "schedulerName"], opts.scheduler_name.clone().into()));
    }
    if is_unset("maxRetry") {
        ops.push(add(&["spec", "maxRetry"], DEFAULT_MAX_RETRY.into()));
    }
    let mut tasks = spec.get("tasks").and_then(Value::as_array).cloned().unwrap_or_default();
    if default_tasks(&mut tasks) {
        ops.push(replace(&["spec", "tasks"], Value::Array(tasks.clone())));
    }
    if is_unset("minAvailable") {
        let sum: i64 = tasks.iter().map(|t| t.get("minAvailable").and_then(Value::as_i64).unwrap_or(0)).sum();
        ops.push(add(&["spec", "minAvailable"], sum.into()));
    }
    let mut volcano_plugins = spec.get("plugins").and_then(Value::as_object).cloned();
    if let Some(plugins) = volcano_plugins.as_mut() {
        for framework in ["tensorflow", "mpi", "pytorch", "ray"] {
            if plugins.contains_key(framework) && !plugins.contains_key("svc") {
                plugins.insert("svc".into(), Value::Array(Vec::new()));
            }
        }
        if plugins.contains_key("mpi") && !plugins.contains_key("ssh") {
            plugins.insert("ssh".into(), Value::Array(Vec::new()));
        }
        ops.push(replace(&["spec", "plugins"], Value::Object(plugins.clone())));
    }
    let annotation = job.pointer("/metadata/annotations").and_then(|a| a.get(crate::PLUGINS_ANNOTATION));
    if let Some(mut weft) = annotation.and_then(Value::as_str).and_then(|t| crate::job::parse_plugin_map(t).ok()) {
        let in_volcano = |name: &str| volcano_plugins.as_ref().is_some_and(|p| p.contains_key(name));
        let needed: Vec<&'static str> =
            missing_dependencies(&weft, in_volcano).into_iter().map(|(_, need)| need).collect();
        if !needed.is_empty() {
            for need in needed {
                weft.insert(need.to_owned(), Vec::new());
            }
            let text = serde_json::to_string(&weft).map_err(|e| e.to_string())?;
            ops.push(replace(&["metadata", "annotations", crate::PLUGINS_ANNOTATION], text.into()));
        }
    }
    Ok(ops)
}

/// The dependencies of weft's plugins (`needs` in [`crate::plugins::PLUGINS`]) that neither the
/// annotation's plugin map `weft` nor Volcano's `spec.plugins` (`in_volcano`) has:
/// `(plugin, missing dependency)` pairs.
fn missing_dependencies(
    weft: &BTreeMap<String, Vec<String>>,
    in_volcano: impl Fn(&str) -> bool,
) -> Vec<(&str, &'static str)> {
    let mut missing = Vec::new();
    for name in weft.keys() {
        for need in crate::plugins::info(name).map_or(&[][..], |i| i.needs) {
            if !weft.contains_key(*need) && !in_volcano(need) {
                missing.push((name.as_str(), *need));
            }
        }
    }
    missing
}

/// Volcano's task defaults (`mutateSpec`); true when a task changed.
fn default_tasks(tasks: &mut [Value]) -> bool {
    let mut changed = false;
    for (i, task) in tasks.iter_mut().enumerate() {
        let Some(t) = task.as_object_mut() else { continue };
        if t.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
            t.insert("name".into(), format!("default{i}").into());
            changed = true;
        }
        if let Some(pod_spec) = t.get_mut("template").and_then(|v| v.get_mut("spec")).and_then(Value::as_object_mut) {
            let host_network = pod_spec.get("hostNetwork").and_then(Value::as_bool).unwrap_or(false);
            if host_network && pod_spec.get("dnsPolicy").and_then(Value::as_str).is_none_or(str::is_empty) {
                pod_spec.insert("dnsPolicy".into(), "ClusterFirstWithHostNet".into());
                changed = true;
            }
        }
        if t.get("minAvailable").is_none_or(Value::is_null) {
            let partition = t.get("partitionPolicy");
            let min_partitions = partition.and_then(|p| p.get("minPartitions")).and_then(Value::as_i64).unwrap_or(0);
            let size = partition.and_then(|p| p.get("partitionSize")).and_then(Value::as_i64).unwrap_or(0);
            let min = if min_partitions > 0 {
                min_partitions * size
            } else {
                t.get("replicas").and_then(Value::as_i64).unwrap_or(0)
            };
            t.insert("minAvailable".into(), min.into());
            changed = true;
        }
        if t.get("maxRetry").and_then(Value::as_i64).unwrap_or(0) == 0 {
            t.insert("maxRetry".into(), DEFAULT_MAX_RETRY.into());
            changed = true;
        }
    }
    changed
}

fn pointer(tokens: &[&str]) -> json_patch::jsonptr::PointerBuf {
    json_patch::jsonptr::PointerBuf::from_tokens(tokens.iter().copied())
}

fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(json_patch::AddOperation { path: pointer(tokens), value })
}

fn replace(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Replace(json_patch::ReplaceOperation { path: pointer(tokens), value })
}

/// The verdict on a Job: errors deny it, warnings go back to the user (kubectl prints them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Why the job is denied (empty: allowed).
    pub errors: Vec<String>,
    /// What the user should know even though the job is allowed.
    pub warnings: Vec<String>,
    /// What Volcano checks that needs the cluster and so was not checked (for `jobs render`).
    pub unchecked: Vec<String>,
}

impl Verdict {
    /// Whether the job is allowed.
    pub fn allowed(&self) -> bool {
        self.errors.is_empty()
    }

    /// All errors in one message.
    pub fn message(&self) -> String {
        self.errors.join("; ")
    }
}

/// Longest pod name whose DNS name resolves (a DNS label; Volcano checks the same).
const MAX_POD_NAME: usize = 63;

/// Validates a Job being created (`old` is `None`) or updated.
///
/// Denied for what Volcano's own webhook denies and what Kubernetes would refuse of the pods
/// ([`crate::volcano_rules`]: on create, Volcano's create rules and weft's limits on task names,
/// replicas and host lists; on update, Volcano's update rules); and when weft's plugins do not build (unknown plugin, bad argument, missing role task, a
/// plugin listed in both places: see [`JobPlugins::weft`]), when a weft plugin's dependency is in
/// neither place, when a pod name of a job with weft plugins is too long for DNS, or (on update)
/// when the annotation changed: pods already created carry the old wiring. Problems Volcano would
/// only log for `spec.plugins` come back as warnings.
pub fn validate_job(job: &Job, old: Option<&Job>, opts: &AdmissionOptions) -> Verdict {
    // The job as it came (Job keeps the fields it does not type), for the rules that read them.
    let raw = serde_json::to_value(job).unwrap_or(Value::Null);
    let mut verdict = Verdict::default();
    match old {
        None => {
            let p = crate::volcano_rules::create_problems(job, &raw, opts.build.max_job_replicas);
            verdict.errors = p.errors;
            verdict.unchecked = p.unchecked;
        }
        Some(old) => verdict.errors = crate::volcano_rules::update_problems(old, job, &raw),
    }
    if !verdict.errors.is_empty() {
        // Plugins are built over the tasks; with tasks Volcano refuses there is nothing to build.
        return verdict;
    }
    verdict.warnings = JobPlugins::volcano(job).warnings().to_vec();
    let annotation = |j: &Job| j.metadata.annotations.as_ref().and_then(|a| a.get(crate::PLUGINS_ANNOTATION)).cloned();
    if let Some(old) = old
        && annotation(old) != annotation(job)
    {
        verdict.errors.push(format!(
            "annotation {} cannot change after the job is created (its pods already carry the old wiring); \
             delete and recreate the job",
            crate::PLUGINS_ANNOTATION
        ));
    }
    let weft = match crate::pipeline::weft_plugin_map(job) {
        Ok(Some(map)) => map,
        Ok(None) => return verdict,
        Err(e) => {
            verdict.errors.push(e.to_string());
            return verdict;
        }
    };
    match JobPlugins::weft(job, &opts.build) {
        Ok(plugins) => verdict.warnings.extend(plugins.warnings().iter().cloned()),
        Err(errors) => verdict.errors.extend(errors.iter().map(ToString::to_string)),
    }
    let volcano = job.spec.plugins.clone().unwrap_or_default();
    for (name, need) in missing_dependencies(&weft, |n| volcano.contains_key(n)) {
        verdict.errors.push(format!(
            "plugin {name} needs plugin {need} ({}); add \"{need}\": [] to annotation {} \
             (weft's mutating webhook adds it when a job is created)",
            if need == "svc" { "DNS names for the job's pods" } else { "ssh keys shared by the job's pods" },
            crate::PLUGINS_ANNOTATION
        ));
    }
    for task in &job.spec.tasks {
        let last = crate::naming::replicas(task).saturating_sub(1);
        let name = crate::naming::pod_name(job.job_name(), &task.name, last);
        if name.len() > MAX_POD_NAME {
            verdict.errors.push(format!(
                "task {:?}: pod name {name:?} has {} characters, more than {MAX_POD_NAME}: its DNS name cannot resolve; \
                 shorten the job or task name",
                task.name,
                name.len()
            ));
        }
    }
    verdict
}

/// weft's plugins built for one job, ready to mutate its pods. Build once per job version and
/// reuse for every pod.
#[derive(Debug)]
pub struct PodMutator {
    plugins: JobPlugins,
}

impl PodMutator {
    /// Builds weft's plugins for `job`.
    pub fn new(job: &Job, opts: &AdmissionOptions) -> Result<Self, Vec<PluginError>> {
        Ok(Self { plugins: JobPlugins::weft(job, &opts.build)? })
    }

    /// Whether the job has no weft plugins (pods pass unchanged).
    pub fn is_empty(&self) -> bool {
        self.plugins.is_empty()
    }

    /// The JSON patch that applies weft's plugins to `pod`.
    ///
    /// The pod is read into the typed `Pod`, mutated, and the patch is the difference between the
    /// typed pod before and after, so fields the typed model does not know are never touched.
    pub fn mutate(&self, pod: &Value) -> Result<Vec<PatchOperation>, PluginError> {
        let bad_pod = |message: String| PluginError::Pod {
            plugin: "webhook",
            pod: pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned(),
            message,
        };
        let mut typed: Pod = serde_json::from_value(pod.clone()).map_err(|e| bad_pod(format!("not a Pod: {e}")))?;
        let before = serde_json::to_value(&typed).map_err(|e| bad_pod(e.to_string()))?;
        self.plugins.mutate_pod(&mut typed)?;
        let after = serde_json::to_value(&typed).map_err(|e| bad_pod(e.to_string()))?;
        Ok(json_patch::diff(&before, &after).0)
    }

    /// The plugins, in run order.
    pub fn plugins(&self) -> &JobPlugins {
        &self.plugins
    }
}

/// The Volcano Job that controls `pod` (its controller owner reference of kind `Job` in
/// `batch.volcano.sh`): `(name, uid)`.
pub fn owning_job(pod: &Value) -> Option<(String, String)> {
    pod.pointer("/metadata/ownerReferences")?.as_array()?.iter().find_map(|r| {
        let api = r.get("apiVersion")?.as_str()?;
        let is_job = r.get("kind")?.as_str()? == "Job" && api.split('/').next() == Some(crate::job::GROUP);
        let controller = r.get("controller").and_then(Value::as_bool).unwrap_or(false);
        (is_job && controller)
            .then(|| Some((r.get("name")?.as_str()?.to_owned(), r.get("uid")?.as_str()?.to_owned())))?
    })
}
