//! weft-jobs: distributed framework plugins for Volcano Jobs (`batch.volcano.sh/v1alpha1`).
//!
//! Everything here is pure: a [`Job`] and a [`Pod`](k8s_openapi::api::core::v1::Pod) go in, pod
//! mutations and job-level objects (ConfigMaps, Secrets, Services, NetworkPolicies) come out. The
//! webhook, the controller, `weft jobs render` and the benchmarks all call the same code.
//!
//! - [`job`]: the Volcano Job types weft reads.
//! - [`naming`]: Volcano's pod names, domain names and the pod/task/index relations.
//! - [`flags`]: plugin argument parsing with Go `flag` syntax; strict for weft, lenient (Volcano's
//!   behaviour, with warnings) for `spec.plugins`.
//! - [`plugin`]: the [`plugin::JobPlugin`] trait, [`plugin::Flavor`], errors, job-level objects.
//! - [`plugins`]: one module per plugin.
//! - [`pipeline`]: which plugins a job has (`spec.plugins` for Volcano, the
//!   [`PLUGINS_ANNOTATION`] for weft), their fixed order, and running them over a pod.
//! - [`admission`]: Job mutate/validate and Pod mutate as the webhook needs them.
//! - [`render`]: every pod and object a job will get.
//! - [`volcano_rules`]: what Volcano's admission (and Kubernetes, for the pods) would deny.
//!
//! Where Volcano implements a behaviour the `Flavor::Volcano` output is byte-compatible with it;
//! `Flavor::Weft` adds what the design asks and Volcano lacks. See `docs/jobs.md`.

pub mod admission;
pub mod flags;
pub mod job;
pub mod launch;
pub mod naming;
pub mod pipeline;
pub mod plugin;
pub mod plugins;
pub mod render;
pub mod volcano_rules;

pub use job::{Job, JobSpec, TaskSpec};
pub use pipeline::JobPlugins;
pub use plugin::{Flavor, JobObject, JobPlugin, PluginError};

/// Job annotation naming the plugins weft runs, in the shape of `spec.plugins`: a JSON object from
/// plugin name to its argument list, e.g. `{"pytorch": ["--master=master"], "mxnet": []}`.
pub const PLUGINS_ANNOTATION: &str = "weft.io/job-plugins";
