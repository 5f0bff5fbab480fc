//! Admission decisions for Volcano Jobs and their pods, as `weft webhook` serves them. Pure: JSON
//! in, JSON patches and verdicts out.
//!
//! - [`mutate_job`] (CREATE): Volcano's job defaults and the plugin dependencies.
//! - [`validate_job`] (CREATE, UPDATE): weft's plugins parse strictly and fit the job.
//! - [`PodMutator`]: weft's plugins applied to one pod of the job.

use json_patch::PatchOperation;
use serde_json::Value;

use crate::job::Job;
use crate::pipeline::JobPlugins;
use crate::plugin::{BuildOptions, PluginError};

/// Settings of the webhook that shape its decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionOptions {
    /// Scheduler name a job without one gets (Volcano's webhook: its first configured scheduler).
    pub scheduler_name: String,
    /// Settings for building plugins.
    pub build: BuildOptions,
}

impl Default for AdmissionOptions {
    fn default() -> Self {
        Self { scheduler_name: "volcano".to_owned(), build: BuildOptions::default() }
    }
}

/// The JSON patch for a Job being created (being written).
pub fn mutate_job(job: &Value, opts: &AdmissionOptions) -> Result<Vec<PatchOperation>, String> {
    let _ = (job, opts);
    Ok(Vec::new())
}

/// The verdict on a Job: errors deny it, warnings go back to the user (kubectl prints them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Why the job is denied (empty: allowed).
    pub errors: Vec<String>,
    /// What the user should know even though the job is allowed.
    pub warnings: Vec<String>,
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

/// Validates a Job being created (`old` is `None`) or updated (being written).
pub fn validate_job(job: &Job, old: Option<&Job>, opts: &AdmissionOptions) -> Verdict {
    let _ = (job, old, opts);
    Verdict::default()
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

    /// The JSON patch that applies weft's plugins to `pod` (being written).
    pub fn mutate(&self, pod: &Value) -> Result<Vec<PatchOperation>, PluginError> {
        let _ = pod;
        Ok(Vec::new())
    }
}

/// The Volcano Job that controls `pod` (its controller owner reference of kind `Job` in
/// `batch.volcano.sh`): `(name, uid)`.
pub fn owning_job(pod: &Value) -> Option<(String, String)> {
    pod.pointer("/metadata/ownerReferences")?.as_array()?.iter().find_map(|r| {
        let api = r.get("apiVersion")?.as_str()?;
        let is_job = r.get("kind")?.as_str()? == "Job" && api.split('/').next() == Some(crate::job::GROUP);
        let controller = r.get("controller").and_then(Value::as_bool).unwrap_or(false);
        (is_job && controller).then(|| Some((r.get("name")?.as_str()?.to_owned(), r.get("uid")?.as_str()?.to_owned())))?
    })
}
