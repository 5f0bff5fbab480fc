//! The `ssh` plugin (being written).

use k8s_openapi::api::core::v1::Pod;

use crate::flags::FlagDef;
use k8s_openapi::api::core::v1::Secret;

use crate::plugin::{BuildInput, JobPlugin, PluginError, SshKeyPair, SshKeySource};

/// Generates a fresh RSA-2048 key pair each time it is asked (being written).
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomKeys;

impl SshKeySource for RandomKeys {
    fn key_pair(&self) -> Result<SshKeyPair, String> {
        Err("ssh key generation is being written".to_owned())
    }
}

/// The key pair stored in an existing `<job>-ssh` Secret (keys `id_rsa` and `id_rsa.pub`), so the
/// controller keeps a job's keys when it rewrites the Secret (being written).
pub fn keys_from_secret(secret: &Secret) -> Option<SshKeyPair> {
    let _ = secret;
    None
}

/// The plugin's name.
pub const NAME: &str = "ssh";

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
