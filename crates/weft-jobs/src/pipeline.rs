//! Which plugins a job has and running them in their fixed order.
//!
//! A job names plugins in two places:
//! - `spec.plugins`: Volcano's. Volcano's controller runs them; weft reads them only to show what
//!   Volcano will do ([`JobPlugins::volcano`], lenient like Volcano, with warnings).
//! - the [`crate::PLUGINS_ANNOTATION`]: weft's. weft's webhook runs them on each pod and weft's
//!   controller creates their objects ([`JobPlugins::weft`], strict).
//!
//! A plugin in both places would run twice. `svc`, `ssh` and `env` behave the same in both, so
//! when one of them is in both with the same arguments weft leaves it to Volcano; any other plugin
//! in both places is an error.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::job::{Job, parse_plugin_map};
use crate::plugin::{BuildInput, BuildOptions, Flavor, JobObject, JobPlugin, ObjectContext, PluginError};
use crate::plugins::{self, PLUGINS};

/// Plugins that behave identically whether Volcano or weft runs them.
const SHARED: &[&str] = &["svc", "ssh", "env"];

/// One plugin built for a job.
#[derive(Debug)]
pub struct PluginRun {
    /// Its name.
    pub name: &'static str,
    /// Volcano's (`spec.plugins`) or weft's (annotation).
    pub flavor: Flavor,
    /// Its arguments as written.
    pub args: Vec<String>,
    /// The built plugin.
    pub plugin: Box<dyn JobPlugin>,
}

/// A job's plugins, in run order.
#[derive(Debug, Default)]
pub struct JobPlugins {
    runs: Vec<PluginRun>,
    warnings: Vec<String>,
}

/// The plugin map in the job's [`crate::PLUGINS_ANNOTATION`], `None` when it has none.
pub fn weft_plugin_map(job: &Job) -> Result<Option<BTreeMap<String, Vec<String>>>, PluginError> {
    let Some(text) = job.metadata.annotations.as_ref().and_then(|a| a.get(crate::PLUGINS_ANNOTATION)) else {
        return Ok(None);
    };
    parse_plugin_map(text).map(Some).map_err(|e| PluginError::BadAnnotation { message: e.to_string() })
}

impl JobPlugins {
    /// weft's plugins for `job` (from the annotation), built strictly: every error is returned. A
    /// job with more pods than `options.max_job_replicas` (one admitted before weft's webhook,
    /// say) is refused before anything is built: its host lists would not fit a pod.
    pub fn weft(job: &Job, options: &BuildOptions) -> Result<Self, Vec<PluginError>> {
        let map = weft_plugin_map(job).map_err(|e| vec![e])?.unwrap_or_default();
        let pods: u64 = job.spec.tasks.iter().map(|t| u64::try_from(t.replicas).unwrap_or(0)).sum();
        if !map.is_empty() && pods > options.max_job_replicas {
            return Err(vec![PluginError::Invalid {
                plugin: "weft",
                message: format!(
                    "the job has {pods} pods in all; weft wires at most {} (--max-job-replicas)",
                    options.max_job_replicas
                ),
            }]);
        }
        let volcano = job.spec.plugins.clone().unwrap_or_default();
        let mut out = Self::default();
        let mut errors = Vec::new();
        for (name, args) in sorted(&map) {
            let Some(info) = plugins::info(name) else {
                errors.push(PluginError::Unknown {
                    name: name.to_owned(),
                    place: "annotation weft.io/job-plugins",
                    known: plugins::known_names(false),
                });
                continue;
            };
            if let Some(volcano_args) = volcano.get(name) {
                if SHARED.contains(&name) && volcano_args == args {
                    out.warnings.push(format!(
                        "plugin {name} is in both spec.plugins and weft.io/job-plugins with the same arguments; Volcano runs it, weft does not"
                    ));
                    continue;
                }
                errors.push(PluginError::Invalid {
                    plugin: info.name,
                    message: "listed in both spec.plugins (run by Volcano) and annotation weft.io/job-plugins (run by weft); \
                              it would change each pod twice: keep it in one place"
                        .to_owned(),
                });
                continue;
            }
            let input = BuildInput { job, args, flavor: Flavor::Weft, options };
            match (info.build)(input) {
                Ok(plugin) => {
                    out.runs.push(PluginRun { name: info.name, flavor: Flavor::Weft, args: args.to_vec(), plugin })
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() { Ok(out) } else { Err(errors) }
    }

    /// What Volcano's controller will do with `spec.plugins`: plugins built leniently, as Volcano
    /// does; unknown names, argument errors and silent skips become warnings. A plugin that
    /// Volcano would fail on at pod creation is left out with a warning, or (ray without its head
    /// task) kept for the objects Volcano still creates, with no pod changes and a warning.
    pub fn volcano(job: &Job) -> Self {
        let map = job.spec.plugins.clone().unwrap_or_default();
        let options = BuildOptions::default();
        let mut out = Self::default();
        for (name, args) in sorted(&map) {
            let Some(info) = plugins::info(name).filter(|p| p.in_volcano) else {
                out.warnings.push(format!(
                    "spec.plugins: Volcano has no plugin {name:?} (its webhook rejects the job: \"unable to find job plugin: {name}\"){}",
                    if plugins::info(name).is_some() { "; weft has it: put it in annotation weft.io/job-plugins" } else { "" }
                ));
                continue;
            };
            let input = BuildInput { job, args, flavor: Flavor::Volcano, options: &options };
            match (info.build)(input) {
                Ok(plugin) => {
                    out.warnings.extend(plugin.warnings().into_iter().map(|w| format!("spec.plugins: {w}")));
                    out.runs.push(PluginRun { name: info.name, flavor: Flavor::Volcano, args: args.to_vec(), plugin });
                }
                Err(e) => out.warnings.push(format!("spec.plugins: {e}")),
            }
        }
        out
    }

    /// Volcano's plugins then weft's: everything that happens to the job's pods, in order.
    pub fn all(job: &Job, options: &BuildOptions) -> Result<Self, Vec<PluginError>> {
        let mut out = Self::volcano(job);
        let weft = Self::weft(job, options)?;
        out.runs.extend(weft.runs);
        out.warnings.extend(weft.warnings);
        Ok(out)
    }

    /// The plugins in run order.
    pub fn runs(&self) -> &[PluginRun] {
        &self.runs
    }

    /// Whether there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Warnings found while building (see [`JobPlugins::volcano`]).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Runs every plugin's `on_pod_create` on `pod`, in order. Stops at the first error.
    pub fn mutate_pod(&self, pod: &mut Pod) -> Result<(), PluginError> {
        self.runs.iter().try_for_each(|r| r.plugin.on_pod_create(pod))
    }

    /// How the pod Volcano's plugins make of `base` depends on the order they run in: Volcano
    /// runs `spec.plugins` in Go map order, which changes from pod to pod, so where running them
    /// in weft's order and in the reverse order gives different pods (env var order aside), the
    /// pod's fate is random. Returns the differing fields, each as `path: a | b` (a: weft's
    /// order, b: the reverse); empty when the order does not matter.
    pub fn volcano_order_dependence(&self, base: &Pod) -> Result<Vec<String>, PluginError> {
        let volcano: Vec<&PluginRun> = self.runs.iter().filter(|r| r.flavor == Flavor::Volcano).collect();
        if volcano.len() < 2 {
            return Ok(Vec::new());
        }
        let run = |order: &mut dyn Iterator<Item = &&PluginRun>| -> Result<serde_json::Value, PluginError> {
            let mut pod = base.clone();
            for r in order {
                r.plugin.on_pod_create(&mut pod)?;
            }
            if let Some(spec) = pod.spec.as_mut() {
                for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
                    if let Some(env) = c.env.as_mut() {
                        env.sort_by(|a, b| a.name.cmp(&b.name));
                    }
                }
            }
            Ok(serde_json::to_value(&pod).unwrap_or_default())
        };
        let forward = run(&mut volcano.iter())?;
        let reverse = run(&mut volcano.iter().rev())?;
        Ok(json_patch::diff(&forward, &reverse)
            .0
            .iter()
            .map(|op| {
                let path = op.path().to_string();
                let at = |v: &serde_json::Value| v.pointer(&path).map_or("(absent)".to_owned(), ToString::to_string);
                format!("{path}: {} | {}", at(&forward), at(&reverse))
            })
            .collect())
    }

    /// The job-level objects of every plugin, in run order, with the flavor that makes them.
    pub fn job_objects(&self, ctx: &ObjectContext<'_>) -> Result<Vec<(Flavor, JobObject)>, PluginError> {
        let mut out = Vec::new();
        for r in &self.runs {
            out.extend(r.plugin.job_objects(ctx)?.into_iter().map(|o| (r.flavor, o)));
        }
        Ok(out)
    }
}

/// Map entries in run order ([`PLUGINS`] order; unknown names last, by name).
fn sorted(map: &BTreeMap<String, Vec<String>>) -> Vec<(&str, &[String])> {
    let mut v: Vec<(&str, &[String])> = map.iter().map(|(k, a)| (k.as_str(), a.as_slice())).collect();
    v.sort_by_key(|(k, _)| (plugins::rank(k), *k));
    debug_assert!(PLUGINS.iter().all(|p| plugins::rank(p.name) < PLUGINS.len()));
    v
}
