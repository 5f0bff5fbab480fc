//! The `env` plugin: the pod's index within its task as `VK_TASK_INDEX` and `VC_TASK_INDEX`.
//!
//! Volcano's `pkg/controllers/job/plugins/env`: on every container and then every init container
//! it appends `VK_TASK_INDEX=<i>` and `VC_TASK_INDEX=<i>`, where `<i>` is the last `-` part of the
//! pod name (`GetPodIndexUnderTask`; empty when the name has fewer than three parts). No objects.
//!
//! Volcano's env plugin reads no arguments at all. weft rejects any argument; the Volcano flavor
//! ignores them with a warning.

use k8s_openapi::api::core::v1::{EnvVar, Pod};

use crate::flags::FlagDef;
use crate::naming;
use crate::plugin::{BuildInput, Flavor, JobPlugin, PluginError};

/// The plugin's name.
pub const NAME: &str = "env";

/// The plugin's flags: none.
pub const FLAGS: &[FlagDef] = &[];

/// The index variables, in the order Volcano appends them.
pub const INDEX_ENV: [&str; 2] = ["VK_TASK_INDEX", "VC_TASK_INDEX"];

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let mut warnings = Vec::new();
    match input.flavor {
        Flavor::Weft => {
            if !input.args.is_empty() {
                return Err(PluginError::Invalid {
                    plugin: NAME,
                    message: format!("takes no arguments, got {:?}", input.args),
                });
            }
        }
        Flavor::Volcano => {
            if !input.args.is_empty() {
                warnings.push(format!("plugin {NAME}: takes no arguments; Volcano ignores {:?}", input.args));
            }
        }
    }
    Ok(Box::new(Env { warnings }))
}

#[derive(Debug)]
struct Env {
    warnings: Vec<String>,
}

impl JobPlugin for Env {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        let index = pod.metadata.name.as_deref().and_then(naming::pod_index).unwrap_or_default().to_owned();
        let spec = pod.spec.get_or_insert_with(Default::default);
        for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
            c.env.get_or_insert_with(Vec::new).extend(INDEX_ENV.iter().map(|n| EnvVar {
                name: (*n).to_owned(),
                value: Some(index.clone()),
                value_from: None,
            }));
        }
        Ok(())
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Job, JobSpec};
    use crate::plugin::BuildOptions;

    #[test]
    fn weft_rejects_any_argument_volcano_warns() {
        let job = Job::new("j", JobSpec::default());
        let args = vec!["--x=1".to_owned()];
        let opts = BuildOptions::default();
        let e = build(BuildInput { job: &job, args: &args, flavor: Flavor::Weft, options: &opts }).expect_err("strict");
        assert_eq!(e.to_string(), r#"plugin env: takes no arguments, got ["--x=1"]"#);
        let p = build(BuildInput { job: &job, args: &args, flavor: Flavor::Volcano, options: &opts }).expect("lenient");
        assert_eq!(p.warnings(), vec![r#"plugin env: takes no arguments; Volcano ignores ["--x=1"]"#.to_owned()]);
    }

    #[test]
    fn a_name_without_index_gets_empty_values_as_in_volcano() {
        let job = Job::new("j", JobSpec::default());
        let opts = BuildOptions::default();
        let p = build(BuildInput { job: &job, args: &[], flavor: Flavor::Weft, options: &opts }).expect("builds");
        let mut pod = Pod::default();
        pod.metadata.name = Some("a-b".into());
        pod.spec =
            Some(k8s_openapi::api::core::v1::PodSpec { containers: vec![Default::default()], ..Default::default() });
        p.on_pod_create(&mut pod).expect("mutates");
        let env = pod.spec.expect("spec").containers[0].env.clone().expect("env");
        assert_eq!(env[0].value.as_deref(), Some(""));
    }
}
