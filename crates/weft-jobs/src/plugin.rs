//! The plugin interface: a plugin is built once per job (parsing its arguments and checking the
//! job), then mutates each pod of the job and names the job-level objects the job needs.

use std::fmt;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::flags::FlagError;
use crate::job::Job;
use crate::naming;

/// Whose behaviour a plugin follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// Exactly what Volcano's controller does for `spec.plugins` (lenient arguments, Volcano's
    /// skips and quirks). Used to show what Volcano will do; weft never applies it to a cluster.
    Volcano,
    /// weft's plugins from the `weft.io/job-plugins` annotation: Volcano's output where Volcano has
    /// the behaviour, plus the design's additions; strict arguments; missing role tasks rejected.
    Weft,
}

/// Image of the launch-order init containers when the deployment names none: weft's own image,
/// whose `weft wait-for` does the waiting.
pub const DEFAULT_WAIT_IMAGE: &str = concat!("ghcr.io/weft-io/weft:", env!("CARGO_PKG_VERSION"));

/// Deployment-level settings plugins need (not from the job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildOptions {
    /// Image for launch-order init containers (runs `weft wait-for`).
    pub wait_image: String,
    /// Most pods a job may have (the sum of its tasks' replicas): weft's plugins are not built
    /// for a larger job, whose host lists would not fit a pod or a ConfigMap.
    pub max_job_replicas: u64,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self { wait_image: DEFAULT_WAIT_IMAGE.to_owned(), max_job_replicas: crate::volcano_rules::MAX_TOTAL_REPLICAS }
    }
}

/// What building a plugin for a job gets.
#[derive(Debug, Clone, Copy)]
pub struct BuildInput<'a> {
    /// The job.
    pub job: &'a Job,
    /// The plugin's arguments.
    pub args: &'a [String],
    /// Volcano's or weft's behaviour.
    pub flavor: Flavor,
    /// Deployment settings.
    pub options: &'a BuildOptions,
}

/// An ssh key pair for the `ssh` plugin's Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct SshKeyPair {
    /// PEM, `-----BEGIN RSA PRIVATE KEY-----` (PKCS#1), as Volcano generates it.
    pub private_key: String,
    /// Authorized-keys line, `ssh-rsa AAAA…\n` (no comment), as Volcano generates it.
    pub public_key: String,
}

impl fmt::Debug for SshKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshKeyPair").field("public_key", &self.public_key).finish_non_exhaustive()
    }
}

/// Where the `ssh` plugin's keys come from: the controller hands over the keys already in the
/// job's Secret (a job's keys never change) or generates new ones; tests hand over fixed keys.
pub trait SshKeySource {
    /// The key pair to store.
    fn key_pair(&self) -> Result<SshKeyPair, String>;
}

/// A fixed key pair (tests, benchmarks, and the controller when the Secret already holds keys).
impl SshKeySource for SshKeyPair {
    fn key_pair(&self) -> Result<SshKeyPair, String> {
        Ok(self.clone())
    }
}

/// What building job-level objects gets.
pub struct ObjectContext<'a> {
    /// Keys for the ssh plugin's Secret (only asked for when the plugin needs generated keys).
    pub ssh_keys: &'a dyn SshKeySource,
}

impl fmt::Debug for ObjectContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectContext").finish_non_exhaustive()
    }
}

/// A job-level object a plugin needs (created with an owner reference to the job).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
#[expect(clippy::large_enum_variant, reason = "a handful per job, built once; boxing buys nothing")]
pub enum JobObject {
    /// e.g. `<job>-svc` (hosts), the MPI hostfile.
    ConfigMap(ConfigMap),
    /// `<job>-ssh`.
    Secret(Secret),
    /// The headless `<job>` Service, ray's `<job>-head-svc`.
    Service(Service),
    /// svc's `<job>` NetworkPolicy.
    NetworkPolicy(NetworkPolicy),
}

impl JobObject {
    /// `ConfigMap`, `Secret`, `Service` or `NetworkPolicy`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ConfigMap(_) => "ConfigMap",
            Self::Secret(_) => "Secret",
            Self::Service(_) => "Service",
            Self::NetworkPolicy(_) => "NetworkPolicy",
        }
    }

    /// The object's metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Self::ConfigMap(o) => &o.metadata,
            Self::Secret(o) => &o.metadata,
            Self::Service(o) => &o.metadata,
            Self::NetworkPolicy(o) => &o.metadata,
        }
    }

    /// The object's metadata, mutably.
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::ConfigMap(o) => &mut o.metadata,
            Self::Secret(o) => &mut o.metadata,
            Self::Service(o) => &mut o.metadata,
            Self::NetworkPolicy(o) => &mut o.metadata,
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        self.metadata().name.as_deref().unwrap_or_default()
    }

    /// The object as JSON with `apiVersion` and `kind` set (what server-side apply needs).
    pub fn to_manifest(&self) -> serde_json::Value {
        let v = match self {
            Self::ConfigMap(o) => serde_json::to_value(o),
            Self::Secret(o) => serde_json::to_value(o),
            Self::Service(o) => serde_json::to_value(o),
            Self::NetworkPolicy(o) => serde_json::to_value(o),
        };
        // Serialising k8s-openapi types into a Value cannot fail (string keys, no non-finite floats).
        let mut v = v.unwrap_or(serde_json::Value::Null);
        if let Some(map) = v.as_object_mut() {
            map.insert("apiVersion".into(), self.api_version().into());
            map.insert("kind".into(), self.kind().into());
        }
        v
    }

    /// `v1` or `networking.k8s.io/v1`.
    pub fn api_version(&self) -> &'static str {
        match self {
            Self::NetworkPolicy(_) => "networking.k8s.io/v1",
            _ => "v1",
        }
    }
}

/// Metadata of a job-level object as Volcano writes it: name, the job's namespace and a controller
/// owner reference to the job.
pub fn object_meta(job: &Job, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(job.job_namespace().to_owned()),
        owner_references: Some(vec![naming::owner_reference(job)]),
        ..Default::default()
    }
}

/// One plugin, built for one job.
pub trait JobPlugin: Send + Sync + fmt::Debug {
    /// The plugin's name, as written in `spec.plugins` or the annotation.
    fn name(&self) -> &'static str;

    /// Mutates a pod of the job as it is created (Volcano's `OnPodCreate`). The pod is what the
    /// job controller made from the task template (see [`naming::volcano_pod`]) after the plugins
    /// before this one ran. An error refuses the pod.
    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError>;

    /// The job-level objects the job needs, in Volcano's shapes (Volcano's `OnJobAdd`).
    fn job_objects(&self, ctx: &ObjectContext<'_>) -> Result<Vec<JobObject>, PluginError> {
        let _ = ctx;
        Ok(Vec::new())
    }

    /// Problems that did not stop the plugin: in the Volcano flavor, the argument error Volcano
    /// only logs, or a role task Volcano silently skips.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Why a plugin refused a job or a pod. Every message names the plugin, and the flag and task
/// when there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The arguments do not parse.
    #[error("plugin {plugin}: {source}")]
    Args {
        /// The plugin.
        plugin: &'static str,
        /// What was wrong.
        #[source]
        source: FlagError,
    },
    /// A role flag (or its default) names a task the job does not have.
    #[error("plugin {plugin}: flag -{flag} names task {task:?}, which the job does not have (its tasks: {tasks})")]
    MissingTask {
        /// The plugin.
        plugin: &'static str,
        /// The role flag, e.g. `master`.
        flag: &'static str,
        /// The task it names.
        task: String,
        /// The job's tasks, comma-separated.
        tasks: String,
    },
    /// A flag names a container the task's template does not have.
    #[error(
        "plugin {plugin}: flag -{flag} names container {container:?}, which task {task:?} does not have (its containers: {containers})"
    )]
    MissingContainer {
        /// The plugin.
        plugin: &'static str,
        /// The flag, e.g. `headContainer`.
        flag: &'static str,
        /// The task.
        task: String,
        /// The container it names.
        container: String,
        /// The task's containers, comma-separated.
        containers: String,
    },
    /// Anything else wrong with the job for this plugin (e.g. two pytorch masters).
    #[error("plugin {plugin}: {message}")]
    Invalid {
        /// The plugin.
        plugin: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
    /// A plugin name weft does not know.
    #[error("unknown plugin {name:?} in {place} (known: {known})")]
    Unknown {
        /// The name as written.
        name: String,
        /// `annotation weft.io/job-plugins` or `spec.plugins`.
        place: &'static str,
        /// The plugins that exist there.
        known: String,
    },
    /// The [`crate::PLUGINS_ANNOTATION`] is not a plugin map.
    #[error(
        "annotation weft.io/job-plugins: {message}; expected a JSON object from plugin name to a list of argument strings, e.g. {{\"pytorch\": [\"--master=master\"], \"svc\": []}}"
    )]
    BadAnnotation {
        /// The parse error.
        message: String,
    },
    /// A pod the plugin cannot handle (no task, no index).
    #[error("plugin {plugin}: pod {pod:?}: {message}")]
    Pod {
        /// The plugin.
        plugin: &'static str,
        /// The pod's name.
        pod: String,
        /// What is wrong.
        message: String,
    },
}

impl PluginError {
    /// A [`PluginError::MissingTask`] listing the job's tasks.
    pub fn missing_task(plugin: &'static str, flag: &'static str, task: &str, job: &Job) -> Self {
        let tasks = job.spec.tasks.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");
        Self::MissingTask { plugin, flag, task: task.to_owned(), tasks }
    }
}
