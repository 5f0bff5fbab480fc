//! The Volcano Job (`batch.volcano.sh/v1alpha1`, kind `Job`) as far as weft reads it.
//!
//! Fields weft does not interpret are kept in `extra` maps so that a Job read and written back by
//! weft loses nothing. Only the fields the plugins and the webhook use are typed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::CustomResource;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// API group of Volcano's batch Job.
pub const GROUP: &str = "batch.volcano.sh";
/// Version of Volcano's batch Job.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of Volcano's batch Job.
pub const API_VERSION: &str = "batch.volcano.sh/v1alpha1";

/// The spec of a Volcano Job. Volcano owns this type; weft never installs its CRD.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "batch.volcano.sh",
    version = "v1alpha1",
    kind = "Job",
    namespaced,
    status = "JobStatus",
    schema = "disabled",
    shortname = "vcjob"
)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// Scheduler of the job's pods (Volcano's webhook defaults it to `volcano`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// Pods that must be schedulable together (gang size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<i32>,
    /// The tasks: groups of identical pods.
    #[serde(default)]
    pub tasks: Vec<TaskSpec>,
    /// Volcano's plugins: name → argv. Volcano runs these itself; weft only reads them (for
    /// `weft jobs render` and admission warnings).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "plugin_map")]
    pub plugins: Option<BTreeMap<String, Vec<String>>>,
    /// Queue (Volcano defaults it to `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Retries before the job fails (Volcano defaults 0 to 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry: Option<i32>,
    /// Everything else in the spec, kept as it came.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One task of a Volcano Job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TaskSpec {
    /// Task name (`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, at most 63). Volcano's webhook names an
    /// unnamed task `default<i>`.
    #[serde(default)]
    pub name: String,
    /// Number of pods of this task.
    #[serde(default)]
    pub replicas: i32,
    /// Pods of this task that must run for the task to count as running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<i32>,
    /// The pod template.
    #[serde(default)]
    pub template: PodTemplateSpec,
    /// Everything else in the task, kept as it came.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// The status of a Volcano Job, as far as weft reads it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// The job's state (`phase`, `reason`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<JobState>,
    /// Incremented by Volcano's controller on every restart or update of the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// How many times the job was retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<i64>,
    /// Everything else in the status.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `status.state` of a Volcano Job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobState {
    /// `Pending`, `Aborting`, `Aborted`, `Running`, `Restarting`, `Completing`, `Completed`,
    /// `Terminating`, `Terminated` or `Failed`.
    #[serde(default)]
    pub phase: String,
    /// Everything else in the state.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Job {
    /// The job's phase, `""` when it has no status yet.
    pub fn phase(&self) -> &str {
        self.status.as_ref().and_then(|s| s.state.as_ref()).map_or("", |s| s.phase.as_str())
    }

    /// Whether the job has ended: Volcano killed its pods for good (`Completed`, `Failed`,
    /// `Terminated`). `Aborted` is not an end: a job can be resumed from it.
    pub fn has_ended(&self) -> bool {
        matches!(self.phase(), "Completed" | "Failed" | "Terminated")
    }

    /// The task named `name`.
    pub fn task(&self, name: &str) -> Option<&TaskSpec> {
        self.spec.tasks.iter().find(|t| t.name == name)
    }

    /// The job's name (`""` when unset).
    pub fn job_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The job's namespace (`""` when unset).
    pub fn job_namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    /// The job's UID (`""` when unset, e.g. a manifest not yet applied).
    pub fn job_uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }
}

/// `spec.plugins` as Go reads it: a map from plugin name to its argument list; a plugin given
/// `null` args (`svc:` in YAML) has no args. Read through [`PluginArgs`], so that with
/// [`from_value`] a malformed entry is named by its path (`spec.plugins.tensorflow`,
/// `spec.plugins.svc[0]`).
fn plugin_map<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, Vec<String>>>, D::Error> {
    let raw: Option<BTreeMap<String, PluginArgs>> = Option::deserialize(d)?;
    Ok(raw.map(|m| m.into_iter().map(|(name, args)| (name, args.0)).collect()))
}

/// One plugin's arguments: a list of strings, or `null` for none.
struct PluginArgs(Vec<String>);

impl<'de> Deserialize<'de> for PluginArgs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = PluginArgs;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(r#"a list of argument strings (e.g. ["--port=2222"]) or null"#)
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<PluginArgs, E> {
                Ok(PluginArgs(Vec::new()))
            }

            fn visit_none<E: serde::de::Error>(self) -> Result<PluginArgs, E> {
                Ok(PluginArgs(Vec::new()))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<PluginArgs, A::Error> {
                let mut args = Vec::new();
                while let Some(arg) = seq.next_element::<String>()? {
                    args.push(arg);
                }
                Ok(PluginArgs(args))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Why a document is not a readable Volcano Job: the path of the malformed field
/// (`spec.tasks[1].replicas`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct JobParseError {
    /// Where, as `spec.tasks[1].replicas`; `.` for the document itself.
    pub path: String,
    /// What is wrong there (serde's description).
    pub message: String,
}

/// Reads a Volcano Job from JSON, naming the malformed field by its path when it cannot.
pub fn from_value(value: Value) -> Result<Job, JobParseError> {
    serde_path_to_error::deserialize(value)
        .map_err(|e| JobParseError { path: e.path().to_string(), message: e.into_inner().to_string() })
}

/// Parses a plugin map in the shape of `spec.plugins` (the [`crate::PLUGINS_ANNOTATION`] value):
/// a JSON object from plugin name to an array of strings (`null` means no arguments).
pub fn parse_plugin_map(text: &str) -> Result<BTreeMap<String, Vec<String>>, serde_json::Error> {
    let raw: BTreeMap<String, Option<Vec<String>>> = serde_json::from_str(text)?;
    Ok(raw.into_iter().map(|(k, v)| (k, v.unwrap_or_default())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_round_trips_unknown_fields() {
        let text = r#"{"apiVersion":"batch.volcano.sh/v1alpha1","kind":"Job","metadata":{"name":"j"},
            "spec":{"minAvailable":3,"policies":[{"event":"PodEvicted","action":"RestartJob"}],
              "plugins":{"svc":null,"ssh":["--ssh-port=2222"]},
              "tasks":[{"name":"w","replicas":2,"dependsOn":{"name":["m"]},"template":{"spec":{"containers":[]}}}]}}"#;
        let job: Job = serde_json::from_str(text).expect("job parses");
        assert_eq!(job.spec.plugins.as_ref().map(|p| p["svc"].len()), Some(0));
        assert_eq!(job.spec.tasks[0].replicas, 2);
        let back = serde_json::to_value(&job).expect("serialises");
        assert_eq!(back["spec"]["policies"][0]["action"], "RestartJob");
        assert_eq!(back["spec"]["tasks"][0]["dependsOn"]["name"][0], "m");
        assert_eq!(back["spec"]["plugins"]["svc"], serde_json::json!([]));
    }

    #[test]
    fn plugin_map_rejects_non_string_args() {
        assert!(parse_plugin_map(r#"{"svc":[1]}"#).is_err());
        assert!(parse_plugin_map(r#"["svc"]"#).is_err());
        assert_eq!(parse_plugin_map(r#"{"env":null}"#).expect("null args")["env"], Vec::<String>::new());
    }

    #[test]
    fn phases_that_end_a_job() {
        let mut job = Job::new("j", JobSpec::default());
        assert!(!job.has_ended());
        for (phase, ended) in
            [("Running", false), ("Aborted", false), ("Completed", true), ("Failed", true), ("Terminated", true)]
        {
            job.status = Some(JobStatus {
                state: Some(JobState { phase: phase.into(), ..Default::default() }),
                ..Default::default()
            });
            assert_eq!(job.has_ended(), ended, "{phase}");
        }
    }
}
