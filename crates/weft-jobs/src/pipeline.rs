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
    /// weft's plugins for `job` (from the annotation), built strictly: every error is returned.
    pub fn weft(job: &Job, options: &BuildOptions) -> Result<Self, Vec<PluginError>> {
        let map = weft_plugin_map(job).map_err(|e| vec![e])?.unwrap_or_default();
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
    /// Volcano would fail on (an error at pod creation) is left out with a warning.
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
