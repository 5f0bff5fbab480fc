//! The `hcclrank` plugin (Ascend HCCL): the pod's rank as the annotation `hccl/rankIndex`.
//!
//! Volcano's `pkg/controllers/job/plugins/distributed-framework/hcclrank`, `OnPodCreate`:
//! - nothing when the pod already has a non-empty `hccl/rankIndex`;
//! - the value of the first `RANK` env var of the pod's containers when it is not empty (what a
//!   framework plugin such as pytorch set; weft runs hcclrank after the frameworks);
//! - else, for pods of the master task, the `volcano.sh/task-index` label; for pods of the worker
//!   task, the master task's replicas plus that index; pods of other tasks are left alone.
//!
//! A master or worker pod without a numeric `volcano.sh/task-index` label is refused, as in
//! Volcano. weft's flavor also requires the master task to exist (Volcano then numbers workers
//! from 0, colliding with nothing but meaning nothing) and an explicit `--worker` task to exist.

use k8s_openapi::api::core::v1::Pod;

use crate::flags::FlagDef;
use crate::naming;
use crate::plugin::{BuildInput, Flavor, JobPlugin, PluginError};

/// The plugin's name.
pub const NAME: &str = "hcclrank";

/// The pod annotation the plugin sets.
pub const RANK_ANNOTATION: &str = "hccl/rankIndex";

/// The env var whose value, when a container has it, becomes the rank.
pub const RANK_ENV: &str = "RANK";

/// The plugin's flags (Volcano's names and defaults). Both name tasks.
pub const FLAGS: &[FlagDef] = &[FlagDef::string("master", "master"), FlagDef::string("worker", "worker")];

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let (flags, mut warnings) = super::common::parse_args(NAME, FLAGS, &[], &input)?;
    let strict = input.flavor == Flavor::Weft;
    let job = input.job;
    let master = flags.string("master").to_owned();
    let worker = flags.string("worker").to_owned();
    let task_list = || job.spec.tasks.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");

    if job.task(&master).is_none() {
        if strict {
            return Err(PluginError::missing_task(NAME, "master", &master, job));
        }
        warnings.push(format!(
            "plugin {NAME}: -master names task {master:?}, which the job does not have (its tasks: {}); Volcano counts 0 \
             master replicas, so worker ranks start at 0",
            task_list()
        ));
    }
    if flags.was_given("worker") && job.task(&worker).is_none() {
        if strict {
            return Err(PluginError::missing_task(NAME, "worker", &worker, job));
        }
        warnings.push(format!(
            "plugin {NAME}: -worker names task {worker:?}, which the job does not have (its tasks: {}); Volcano ranks no \
             worker pods",
            task_list()
        ));
    }
    if master == worker {
        let what = format!("-master and -worker both name task {master:?}");
        if strict {
            return Err(PluginError::Invalid { plugin: NAME, message: format!("{what}; name two different tasks") });
        }
        warnings.push(format!("plugin {NAME}: {what}; Volcano ranks its pods as masters"));
    }

    // Volcano's GetTaskReplicasUnderJob: the first task of that name, 0 when there is none.
    let master_replicas = job.task(&master).map_or(0, |t| i64::from(t.replicas));
    Ok(Box::new(HcclRank { master, worker, master_replicas, warnings }))
}

#[derive(Debug)]
struct HcclRank {
    master: String,
    worker: String,
    master_replicas: i64,
    warnings: Vec<String>,
}

impl JobPlugin for HcclRank {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        let annotations = pod.metadata.annotations.as_ref();
        if annotations.and_then(|a| a.get(RANK_ANNOTATION)).is_some_and(|v| !v.is_empty()) {
            return Ok(());
        }
        // Volcano's getEnv: the first RANK of any container, even when its value is empty.
        let rank = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.env.iter().flatten())
            .find(|e| e.name == RANK_ENV)
            .map(|e| e.value.clone().unwrap_or_default())
            .unwrap_or_default();
        if !rank.is_empty() {
            pod.metadata.annotations.get_or_insert_with(Default::default).insert(RANK_ANNOTATION.to_owned(), rank);
            return Ok(());
        }

        // Volcano's GetTaskKey: the task-spec annotation, `default` when there is none.
        let task = naming::pod_task(pod).filter(|t| !t.is_empty()).unwrap_or("default");
        let is_master = task == self.master;
        if !is_master && task != self.worker {
            return Ok(());
        }
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let label = pod.metadata.labels.as_ref().and_then(|l| l.get(naming::TASK_INDEX_KEY));
        let index: i64 = match label {
            None => {
                return Err(PluginError::Pod {
                    plugin: NAME,
                    pod: pod_name.to_owned(),
                    message: format!("it has no label {}, which its rank needs", naming::TASK_INDEX_KEY),
                });
            }
            Some(v) => v.parse().map_err(|_| PluginError::Pod {
                plugin: NAME,
                pod: pod_name.to_owned(),
                message: format!("label {}={v:?} is not an integer", naming::TASK_INDEX_KEY),
            })?,
        };
        let rank = if is_master { index } else { self.master_replicas.wrapping_add(index) };
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(RANK_ANNOTATION.to_owned(), rank.to_string());
        Ok(())
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::{self, Mode};

    #[test]
    fn defaults_parse() {
        let (f, w) = flags::parse(FLAGS, &[], Mode::Strict).expect("defaults parse");
        assert!(w.is_none());
        assert_eq!((f.string("master"), f.string("worker")), ("master", "worker"));
    }
}
