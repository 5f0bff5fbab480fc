//! The `ray` plugin (being written).

use k8s_openapi::api::core::v1::Pod;

use crate::flags::FlagDef;
use crate::plugin::{BuildInput, JobPlugin, PluginError};

/// The plugin's name.
pub const NAME: &str = "ray";

/// The plugin's flags.
pub const FLAGS: &[FlagDef] = &[];

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let _ = input;
    Ok(Box::new(Stub))
}

#[derive(Debug)]
struct Stub;

impl JobPlugin for Stub {
    fn name(&self) -> &'static str {
        NAME
    }
    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        let _ = pod;
        Ok(())
    }
}
