//! The `svc` plugin: stable DNS names for every pod of a job and the host lists of every task.
//!
//! Volcano's `pkg/controllers/job/plugins/svc`:
//! - `OnJobAdd`: ConfigMap `<job>-svc` with, per task (`K` = task name with `-` → `_`),
//!   `<K>.host` (hosts joined by `\n`), `VC_<UPPER K>_HOSTS` (joined by `,`) and
//!   `VC_<UPPER K>_NUM`; headless Service `<job>`; NetworkPolicy `<job>` (ingress only from the
//!   job's own pods) unless `--disable-network-policy`.
//! - `OnPodCreate`: `hostname` = pod name and `subdomain` = job name where empty; with
//!   `--inject-hosts-env` (default) every task's `VC_<T>_HOSTS` and `VC_<T>_NUM` as
//!   `configMapKeyRef` env on every container and init container; the ConfigMap mounted at
//!   `/etc/volcano` everywhere.
//!
//! Both flavors produce the same objects and pod changes; only argument errors differ (rejected
//! for weft, warnings for Volcano).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapKeySelector, ConfigMapVolumeSource, EnvVar, EnvVarSource, Pod, Service, ServiceSpec, Volume,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::flags::FlagDef;
use crate::job::Job;
use crate::naming;
use crate::plugin::{self, BuildInput, Flavor, JobObject, JobPlugin, ObjectContext, PluginError};

/// The plugin's name.
pub const NAME: &str = "svc";

/// Where the hosts ConfigMap is mounted in every container.
pub const MOUNT_PATH: &str = "/etc/volcano";

/// The plugin's flags (Volcano's names and defaults).
pub const FLAGS: &[FlagDef] = &[
    FlagDef::bool("publish-not-ready-addresses", "false"),
    FlagDef::bool("disable-network-policy", "false"),
    FlagDef::bool("inject-hosts-env", "true"),
];

/// `<job>-svc`: the hosts ConfigMap and its volume.
pub fn config_map_name(job: &str) -> String {
    format!("{job}-{NAME}")
}

/// The task name as it appears in the ConfigMap's `<K>.host` key: `-` → `_`, case kept.
pub fn host_file_key(task: &str) -> String {
    format!("{}.host", task.replace('-', "_"))
}

/// `VC_<TASK>_HOSTS`: the task name upper-cased with `-` → `_`.
pub fn hosts_env_name(task: &str) -> String {
    format!("VC_{}_HOSTS", task.replace('-', "_").to_uppercase())
}

/// `VC_<TASK>_NUM`.
pub fn num_env_name(task: &str) -> String {
    format!("VC_{}_NUM", task.replace('-', "_").to_uppercase())
}

/// The hosts of `task`, as Volcano's `GenerateHosts` lists them: every replica's domain name, or
/// one entry when the template fixes the hostname.
pub fn task_hosts(job: &str, task: &crate::job::TaskSpec) -> Vec<String> {
    let n = naming::replicas(task);
    let n = if naming::template_sets_hostname(task) { n.min(1) } else { n };
    (0..n).map(|i| naming::domain_name(job, task, i)).collect()
}

/// The data of the `<job>-svc` ConfigMap (Volcano's `GenerateHosts`).
pub fn hosts_data(job: &Job) -> BTreeMap<String, String> {
    let name = job.job_name();
    let mut data = BTreeMap::new();
    for task in &job.spec.tasks {
        let hosts = task_hosts(name, task);
        data.insert(host_file_key(&task.name), hosts.join("\n"));
        data.insert(hosts_env_name(&task.name), hosts.join(","));
        data.insert(num_env_name(&task.name), hosts.len().to_string());
    }
    data
}

/// Bytes of the `<job>-svc` ConfigMap's data as Kubernetes counts them against its 1 MiB limit
/// (the sum of the values): every task's hosts twice (`<K>.host`, `VC_<K>_HOSTS`) and its count.
/// Computed without building the lists.
pub fn hosts_data_bytes(job: &Job) -> usize {
    let name = job.job_name();
    job.spec
        .tasks
        .iter()
        .map(|task| {
            let n = task_host_count(task);
            let hosts: usize =
                (0..n).map(|i| naming::domain_name(name, task, i).len()).sum::<usize>() + n.saturating_sub(1);
            2 * hosts + n.to_string().len()
        })
        .sum()
}

/// How many hosts [`task_hosts`] lists for `task`.
fn task_host_count(task: &crate::job::TaskSpec) -> usize {
    let n = naming::replicas(task);
    if naming::template_sets_hostname(task) { n.min(1) } else { n }
}

/// Most bytes the host env references svc adds to one pod may take, as JSON, summed over the
/// pod's containers and init containers. Each reference names a ConfigMap key (one
/// `VC_<TASK>_HOSTS` and one `VC_<TASK>_NUM` per task), so a job of many tasks makes every pod
/// large: 10,000 tasks put 20,000 references (1.9 MB) on every container. weft's svc refuses a
/// job beyond this; for Volcano's svc it is a warning. See `docs/jobs.md` ("Size limits").
pub const MAX_POD_HOSTS_ENV_BYTES: usize = 256 << 10;

/// Linux's limit on one environment string, `NAME=value` and its NUL (`MAX_ARG_STRLEN`, 32 pages
/// of 4 KiB): execve fails with E2BIG ("argument list too long") beyond it, so a container whose
/// `VC_<TASK>_HOSTS` resolves to more cannot start.
pub const MAX_ENV_STRING_BYTES: usize = 128 << 10;

/// What svc's host env makes of one job's pods, for the size limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsEnvSize {
    /// The task whose pods carry the most reference bytes.
    pub largest_pod_task: String,
    /// Its containers and init containers (each gets every reference).
    pub largest_pod_containers: usize,
    /// References in one container (two per task).
    pub references: usize,
    /// JSON bytes of the references on a pod of [`Self::largest_pod_task`].
    pub largest_pod_bytes: usize,
    /// The longest `VC_<TASK>_HOSTS=<hosts>` string as a container's environment holds it (with
    /// its NUL), and the variable's name.
    pub longest_string: (String, usize),
}

/// Measures svc's host env for `job` (references named after the ConfigMap `cm_name`).
pub fn hosts_env_size(job: &Job, cm_name: &str) -> HostsEnvSize {
    let reference_bytes = |name: String| {
        let entry = EnvVar {
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: cm_name.to_owned(),
                    key: name.clone(),
                    optional: None,
                }),
                ..Default::default()
            }),
            name,
            value: None,
        };
        // One entry and the comma that separates it from the next.
        serde_json::to_vec(&entry).map_or(0, |v| v.len() + 1)
    };
    let tasks = &job.spec.tasks;
    let per_container: usize =
        tasks.iter().map(|t| reference_bytes(hosts_env_name(&t.name)) + reference_bytes(num_env_name(&t.name))).sum();
    let containers = |t: &crate::job::TaskSpec| {
        t.template.spec.as_ref().map_or(0, |s| s.containers.len() + s.init_containers.as_ref().map_or(0, Vec::len))
    };
    let largest = tasks.iter().max_by_key(|t| containers(t));
    let longest_string = tasks
        .iter()
        .map(|t| {
            let n = task_host_count(t);
            let hosts: usize =
                (0..n).map(|i| naming::domain_name(job.job_name(), t, i).len()).sum::<usize>() + n.saturating_sub(1);
            let name = hosts_env_name(&t.name);
            let bytes = name.len() + 1 + hosts + 1;
            (name, bytes)
        })
        .max_by_key(|(_, bytes)| *bytes)
        .unwrap_or_default();
    HostsEnvSize {
        largest_pod_task: largest.map(|t| t.name.clone()).unwrap_or_default(),
        largest_pod_containers: largest.map_or(0, containers),
        references: 2 * tasks.len(),
        largest_pod_bytes: per_container * largest.map_or(0, containers),
        longest_string,
    }
}

/// What is wrong with the host env svc would add to `job`'s pods: each problem in words, naming
/// the job, the size and the limit.
fn hosts_env_problems(job: &Job, cm_name: &str) -> Vec<String> {
    let size = hosts_env_size(job, cm_name);
    let job_ref = format!("{}/{}", job.job_namespace(), job.job_name());
    let mut out = Vec::new();
    if size.largest_pod_bytes > MAX_POD_HOSTS_ENV_BYTES {
        out.push(format!(
            "job {job_ref}: every container would carry {} host env references (VC_<task>_HOSTS and VC_<task>_NUM for \
             each of the job's {} tasks), {} bytes on a pod of task {:?} (containers and init containers: {}); at most \
             {MAX_POD_HOSTS_ENV_BYTES} bytes per pod",
            size.references,
            size.references / 2,
            size.largest_pod_bytes,
            size.largest_pod_task,
            size.largest_pod_containers,
        ));
    }
    let (name, bytes) = &size.longest_string;
    if *bytes > MAX_ENV_STRING_BYTES {
        out.push(format!(
            "job {job_ref}: {name} holds {bytes} bytes in a container's environment; Linux starts no process with an \
             environment string over {MAX_ENV_STRING_BYTES} (E2BIG, argument list too long), so the containers could not start"
        ));
    }
    out
}

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let (flags, mut warnings) = super::common::parse_args(NAME, FLAGS, &[], &input)?;
    let job = input.job;
    let job_name = job.job_name().to_owned();
    let cm_name = config_map_name(&job_name);
    if input.flavor == Flavor::Volcano && !flags.bool("inject-hosts-env") && !flags.was_given("inject-hosts-env") {
        // Off without being set: a value Go could not parse stored false.
        warnings.push(format!(
            "plugin {NAME}: Volcano will use -inject-hosts-env=false: the pods get no VC_<task>_HOSTS and \
             VC_<task>_NUM variables"
        ));
    }

    if flags.bool("inject-hosts-env") {
        let problems = hosts_env_problems(job, &cm_name);
        let remedy = format!(
            "-inject-hosts-env=false leaves the variables out (the host lists stay in {MOUNT_PATH}/<task>.host and \
             ConfigMap {cm_name}), or use fewer tasks"
        );
        if !problems.is_empty() {
            if input.flavor == Flavor::Weft {
                return Err(PluginError::Invalid {
                    plugin: NAME,
                    message: format!("{}: {remedy}", problems.join("; ")),
                });
            }
            warnings.extend(problems.into_iter().map(|p| {
                format!(
                    "plugin {NAME}: {p} (Volcano's svc adds them all the same; weft's refuses such a job): {remedy}"
                )
            }));
        }
    }
    let host_env = if flags.bool("inject-hosts-env") {
        job.spec
            .tasks
            .iter()
            .flat_map(|t| [hosts_env_name(&t.name), num_env_name(&t.name)])
            .map(|name| EnvVar {
                value_from: Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: cm_name.clone(),
                        key: name.clone(),
                        optional: None,
                    }),
                    ..Default::default()
                }),
                name,
                value: None,
            })
            .collect()
    } else {
        Vec::new()
    };
    let volume = Volume {
        name: cm_name.clone(),
        config_map: Some(ConfigMapVolumeSource { name: cm_name.clone(), ..Default::default() }),
        ..Default::default()
    };
    let mount = VolumeMount { name: cm_name.clone(), mount_path: MOUNT_PATH.to_owned(), ..Default::default() };

    Ok(Box::new(Svc {
        job: job.clone(),
        job_name,
        cm_name,
        publish_not_ready_addresses: flags.bool("publish-not-ready-addresses"),
        disable_network_policy: flags.bool("disable-network-policy"),
        host_env,
        volume,
        mount,
        warnings,
    }))
}

#[derive(Debug)]
struct Svc {
    job: Job,
    job_name: String,
    cm_name: String,
    publish_not_ready_addresses: bool,
    disable_network_policy: bool,
    /// `VC_<T>_HOSTS`, `VC_<T>_NUM` for every task, in task order (empty without inject-hosts-env).
    host_env: Vec<EnvVar>,
    volume: Volume,
    mount: VolumeMount,
    warnings: Vec<String>,
}

impl Svc {
    /// `{volcano.sh/job-name: <job>, volcano.sh/job-namespace: <ns>}`.
    fn job_selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (naming::JOB_NAME_KEY.to_owned(), self.job_name.clone()),
            (naming::JOB_NAMESPACE_KEY.to_owned(), self.job.job_namespace().to_owned()),
        ])
    }
}

impl JobPlugin for Svc {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.get_or_insert_with(Default::default);
        if spec.hostname.as_deref().is_none_or(str::is_empty) && !pod_name.is_empty() {
            spec.hostname = Some(pod_name);
        }
        if spec.subdomain.as_deref().is_none_or(str::is_empty) && !self.job_name.is_empty() {
            spec.subdomain = Some(self.job_name.clone());
        }
        if !self.host_env.is_empty() {
            for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
                c.env.get_or_insert_with(Vec::new).extend(self.host_env.iter().cloned());
            }
        }
        spec.volumes.get_or_insert_with(Vec::new).push(self.volume.clone());
        for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
            c.volume_mounts.get_or_insert_with(Vec::new).push(self.mount.clone());
        }
        Ok(())
    }

    fn job_objects(&self, ctx: &ObjectContext<'_>) -> Result<Vec<JobObject>, PluginError> {
        let _ = ctx;
        let job = &self.job;
        let mut out = vec![
            JobObject::ConfigMap(ConfigMap {
                metadata: plugin::object_meta(job, self.cm_name.clone()),
                data: Some(hosts_data(job)),
                ..Default::default()
            }),
            JobObject::Service(Service {
                metadata: plugin::object_meta(job, self.job_name.clone()),
                spec: Some(ServiceSpec {
                    cluster_ip: Some("None".to_owned()),
                    selector: Some(self.job_selector()),
                    // Go's `omitempty` drops false.
                    publish_not_ready_addresses: self.publish_not_ready_addresses.then_some(true),
                    ..Default::default()
                }),
                status: None,
            }),
        ];
        if !self.disable_network_policy {
            let selector = LabelSelector { match_labels: Some(self.job_selector()), match_expressions: None };
            out.push(JobObject::NetworkPolicy(NetworkPolicy {
                metadata: plugin::object_meta(job, self.job_name.clone()),
                spec: Some(NetworkPolicySpec {
                    pod_selector: Some(selector.clone()),
                    ingress: Some(vec![NetworkPolicyIngressRule {
                        from: Some(vec![NetworkPolicyPeer { pod_selector: Some(selector), ..Default::default() }]),
                        ports: None,
                    }]),
                    egress: None,
                    policy_types: Some(vec!["Ingress".to_owned()]),
                }),
            }));
        }
        Ok(out)
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

    use super::*;
    use crate::flags::{self, Mode};
    use crate::job::{JobSpec, TaskSpec};
    use crate::plugin::Flavor;
    use crate::plugin::{BuildOptions, SshKeyPair};

    fn task(name: &str, replicas: i32) -> TaskSpec {
        TaskSpec {
            name: name.into(),
            replicas,
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    containers: vec![Container { name: "main".into(), ..Default::default() }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }
    }

    fn job(tasks: Vec<TaskSpec>) -> Job {
        let mut j = Job::new("j", JobSpec { tasks, ..Default::default() });
        j.metadata.namespace = Some("ns".into());
        j
    }

    fn built(job: &Job, args: &[&str], flavor: Flavor) -> Result<Box<dyn JobPlugin>, PluginError> {
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        build(BuildInput { job, args: &args, flavor, options: &BuildOptions::default() })
    }

    #[test]
    fn defaults_parse() {
        let (f, w) = flags::parse(FLAGS, &[], Mode::Strict).expect("defaults parse");
        assert!(w.is_none());
        assert!(f.bool("inject-hosts-env"));
        assert!(!f.bool("publish-not-ready-addresses"));
        assert!(!f.bool("disable-network-policy"));
    }

    #[test]
    fn env_names_replace_dashes_and_upper_case() {
        assert_eq!(host_file_key("mpi-worker"), "mpi_worker.host");
        assert_eq!(hosts_env_name("mpi-worker"), "VC_MPI_WORKER_HOSTS");
        assert_eq!(num_env_name("ps"), "VC_PS_NUM");
    }

    #[test]
    fn the_config_map_size_is_the_sum_of_its_values() {
        let mut fixed = task("fixed", 3);
        fixed.template.spec.as_mut().expect("spec").hostname = Some("h".into());
        for tasks in [vec![], vec![task("w", 0)], vec![task("ps", 1), task("mpi-worker", 12), fixed]] {
            let j = job(tasks);
            let sum: usize = hosts_data(&j).values().map(String::len).sum();
            assert_eq!(hosts_data_bytes(&j), sum);
        }
    }

    #[test]
    fn the_reference_bytes_are_those_of_the_pod() {
        let mut j = job((0..5).map(|i| task(&format!("t{i}"), 1)).collect());
        j.spec.tasks[2].template.spec.as_mut().expect("spec").init_containers =
            Some(vec![Container { name: "init".into(), ..Default::default() }]);
        let size = hosts_env_size(&j, "j-svc");
        assert_eq!((size.largest_pod_task.as_str(), size.largest_pod_containers, size.references), ("t2", 2, 10));
        let p = built(&j, &[], Flavor::Weft).expect("builds");
        let mut pod = naming::volcano_pod(&j, &j.spec.tasks[2], 0);
        p.on_pod_create(&mut pod).expect("mutates");
        let spec = pod.spec.expect("spec");
        let env_bytes: usize = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .map(|c| serde_json::to_vec(c.env.as_ref().expect("env")).expect("json").len() - 1)
            .sum();
        assert_eq!(size.largest_pod_bytes, env_bytes, "each list's brackets stand in for its last comma");
    }

    #[test]
    fn disabling_the_network_policy_drops_it() {
        let j = job(vec![task("w", 2)]);
        let keys = SshKeyPair { private_key: String::new(), public_key: String::new() };
        let ctx = ObjectContext { ssh_keys: &keys };
        let kinds = |args: &[&str]| -> Vec<&'static str> {
            built(&j, args, Flavor::Weft)
                .expect("builds")
                .job_objects(&ctx)
                .expect("objects")
                .iter()
                .map(|o| o.kind())
                .collect()
        };
        assert_eq!(kinds(&[]), ["ConfigMap", "Service", "NetworkPolicy"]);
        assert_eq!(kinds(&["--disable-network-policy"]), ["ConfigMap", "Service"]);
    }

    #[test]
    fn no_hosts_env_keeps_volume_and_names() {
        let j = job(vec![task("w", 2)]);
        let p = built(&j, &["--inject-hosts-env=false"], Flavor::Weft).expect("builds");
        let mut pod = naming::volcano_pod(&j, &j.spec.tasks[0], 1);
        p.on_pod_create(&mut pod).expect("mutates");
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.containers[0].env, None);
        assert_eq!(spec.hostname.as_deref(), Some("j-w-1"));
        assert_eq!(spec.subdomain.as_deref(), Some("j"));
        assert_eq!(spec.volumes.expect("volumes")[0].name, "j-svc");
    }

    #[test]
    fn lenient_keeps_flags_before_the_error() {
        let j = job(vec![task("w", 2)]);
        let p = built(&j, &["--inject-hosts-env=false", "--nope", "--disable-network-policy"], Flavor::Volcano)
            .expect("lenient builds");
        let w = p.warnings();
        assert_eq!(w.len(), 1);
        assert!(w[0].starts_with("plugin svc: unknown flag -nope"), "{w:?}");
        let mut pod = naming::volcano_pod(&j, &j.spec.tasks[0], 0);
        p.on_pod_create(&mut pod).expect("mutates");
        assert_eq!(pod.spec.expect("spec").containers[0].env, None, "inject-hosts-env=false applied");
        let e = built(&j, &["--inject-hosts-env=false", "--nope"], Flavor::Weft).expect_err("strict rejects");
        assert!(e.to_string().starts_with("plugin svc: unknown flag -nope"), "{e}");
    }
}
