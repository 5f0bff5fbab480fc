//! The plugins, one module each, and the registry that fixes their order.
//!
//! Every module exports `NAME`, `FLAGS` (its arguments) and `build`, which parses the arguments
//! (strictly for [`Flavor::Weft`](crate::Flavor::Weft), leniently for
//! [`Flavor::Volcano`](crate::Flavor::Volcano)), checks the job and returns
//! the plugin ready to mutate that job's pods.

use crate::plugin::{BuildInput, JobPlugin, PluginError};

mod common;
pub mod env;
pub mod hcclrank;
pub mod mpi;
pub mod mxnet;
pub mod pytorch;
pub mod ray;
pub mod ssh;
pub mod svc;
pub mod tensorflow;

/// Builds a plugin for one job.
pub type BuildFn = fn(BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError>;

/// A plugin weft knows.
#[derive(Debug, Clone, Copy)]
pub struct PluginInfo {
    /// Name as written in `spec.plugins` or the annotation.
    pub name: &'static str,
    /// Whether Volcano has this plugin (may appear in `spec.plugins`).
    pub in_volcano: bool,
    /// Builds it.
    pub build: BuildFn,
    /// Plugins the webhook adds when this one is present and they are absent from both
    /// `spec.plugins` and the annotation.
    pub needs: &'static [&'static str],
}

/// Every plugin, in the order they run on a pod. The order is fixed (Volcano's is Go map order,
/// i.e. random): first the plugins that set up names, keys and mounts, then the frameworks, then
/// `hcclrank`, which reads the `RANK` a framework set.
pub const PLUGINS: &[PluginInfo] = &[
    PluginInfo { name: svc::NAME, in_volcano: true, build: svc::build, needs: &[] },
    PluginInfo { name: ssh::NAME, in_volcano: true, build: ssh::build, needs: &[] },
    PluginInfo { name: env::NAME, in_volcano: true, build: env::build, needs: &[] },
    PluginInfo { name: tensorflow::NAME, in_volcano: true, build: tensorflow::build, needs: &["svc"] },
    PluginInfo { name: pytorch::NAME, in_volcano: true, build: pytorch::build, needs: &["svc"] },
    PluginInfo { name: mpi::NAME, in_volcano: true, build: mpi::build, needs: &["svc", "ssh"] },
    PluginInfo { name: mxnet::NAME, in_volcano: false, build: mxnet::build, needs: &["svc"] },
    PluginInfo { name: ray::NAME, in_volcano: true, build: ray::build, needs: &["svc"] },
    PluginInfo { name: hcclrank::NAME, in_volcano: true, build: hcclrank::build, needs: &[] },
];

/// The plugin called `name`.
pub fn info(name: &str) -> Option<&'static PluginInfo> {
    PLUGINS.iter().find(|p| p.name == name)
}

/// Position of `name` in the run order ([`PLUGINS`]); unknown names sort last.
pub fn rank(name: &str) -> usize {
    PLUGINS.iter().position(|p| p.name == name).unwrap_or(usize::MAX)
}

/// Names of the plugins available where `volcano_only` says, comma-separated (for messages).
pub fn known_names(volcano_only: bool) -> String {
    PLUGINS.iter().filter(|p| !volcano_only || p.in_volcano).map(|p| p.name).collect::<Vec<_>>().join(", ")
}
