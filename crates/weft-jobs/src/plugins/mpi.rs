//! The `mpi` plugin: the launcher (master) learns its workers; every pod opens the sshd port.
//!
//! Volcano (`pkg/controllers/job/plugins/distributed-framework/mpi/mpi.go`):
//! - Master pods get `MPI_HOST`, the worker domain names joined by `,` (one name when the worker
//!   template sets `hostname`), on every container **and** init container. Without a worker task,
//!   master pods are left entirely unchanged.
//! - Every container and init container of every pod gets the port `mpijob-port` (`--port`, the
//!   sshd port, default 22) unless it already exposes that port number.
//! - Volcano's webhook rejects a job whose master task is missing.
//!
//! weft ([`Flavor::Weft`]) adds what the design asks and Volcano never implemented:
//! - a ConfigMap `<job>-mpi-hostfile` with key `hostfile`: one line `<worker domain name>
//!   slots=<N>` per worker (one line when the template sets `hostname`), joined by `\n` with no
//!   trailing newline; `N` is `--slots`, else the worker template's `nvidia.com/gpu` per pod (sum
//!   over its containers, limits else requests) when positive, else 1;
//! - that ConfigMap as volume `<job>-mpi-hostfile`, mounted at `/etc/mpi` in every container and
//!   init container of every pod, and `OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile` on every
//!   container;
//! - on master pods, a `weft wait-for` init container that waits for every worker's sshd
//!   (`--port`), so `mpirun` does not start before the workers resolve and accept connections
//!   (`--wait`, `--wait-timeout`).
//!
//! The master and worker tasks must exist and differ.

use k8s_openapi::api::core::v1::{ConfigMap, ConfigMapVolumeSource, Container, EnvVar, Pod, Volume, VolumeMount};

use super::common::{
    CONTAINER_PORT_REJECTED, check_port, env, go_int32, open_port, parse_args, require_task, task_gpus,
    volcano_port_warning,
};
use crate::flags::FlagDef;
use crate::job::TaskSpec;
use crate::launch::{self, Wait};
use crate::naming;
use crate::plugin::{BuildInput, Flavor, JobObject, JobPlugin, ObjectContext, PluginError, object_meta};

/// The plugin's name.
pub const NAME: &str = "mpi";

/// Volcano's default `--port` (sshd).
pub const DEFAULT_PORT: i64 = 22;

/// Name of the container port the plugin opens.
pub const PORT_NAME: &str = "mpijob-port";

/// Env var with the worker hosts (master pods).
pub const MPI_HOST: &str = "MPI_HOST";

/// Where weft mounts the hostfile ConfigMap.
pub const HOSTFILE_DIR: &str = "/etc/mpi";

/// Key of the hostfile in the ConfigMap (and its file name under [`HOSTFILE_DIR`]).
pub const HOSTFILE_KEY: &str = "hostfile";

/// Open MPI's variable naming the default hostfile.
pub const HOSTFILE_ENV: &str = "OMPI_MCA_orte_default_hostfile";

/// Volcano's flags.
pub const FLAGS: &[FlagDef] =
    &[FlagDef::string("master", "master"), FlagDef::string("worker", "worker"), FlagDef::int("port", "22")];

/// The flags weft's flavor accepts after Volcano's: `--slots` (per worker in the hostfile; 0 =
/// from the worker's GPUs), `--wait` and `--wait-timeout`.
pub const WEFT_EXTRA_FLAGS: &[FlagDef] = &[FlagDef::int("slots", "0"), launch::WAIT_FLAG, launch::WAIT_TIMEOUT_FLAG];

/// Name of the hostfile ConfigMap and its volume: `<job>-mpi-hostfile`.
pub fn hostfile_name(job: &str) -> String {
    format!("{job}-mpi-hostfile")
}

/// The hostfile: `<domain name> slots=<slots>` for each worker replica (one line when the template
/// sets `hostname`), joined by `\n`, no trailing newline.
pub fn hostfile(job: &str, worker: &TaskSpec, slots: u64) -> String {
    let n =
        if naming::template_sets_hostname(worker) { naming::replicas(worker).min(1) } else { naming::replicas(worker) };
    (0..n).map(|i| format!("{} slots={slots}", naming::domain_name(job, worker, i))).collect::<Vec<_>>().join("\n")
}

/// Volcano's `MPI_HOST`: the worker domain names joined by `,` (one when the template sets
/// `hostname`).
fn mpi_hosts(job: &str, worker: &TaskSpec) -> String {
    let n =
        if naming::template_sets_hostname(worker) { naming::replicas(worker).min(1) } else { naming::replicas(worker) };
    (0..n).map(|i| naming::domain_name(job, worker, i)).collect::<Vec<_>>().join(",")
}

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let job = input.job;
    let (flags, mut warnings) = parse_args(NAME, FLAGS, WEFT_EXTRA_FLAGS, &input)?;
    let master = flags.string("master").to_owned();
    let worker = flags.string("worker").to_owned();
    let port = flags.int("port");

    if input.flavor == Flavor::Volcano {
        warnings.extend(volcano_port_warning(NAME, "port", port, CONTAINER_PORT_REJECTED));
        if job.task(&master).is_none() {
            return Err(PluginError::Invalid {
                plugin: NAME,
                message: format!(
                    "flag -master names task {master:?}, which the job does not have; Volcano's webhook rejects the job: \
                     \"The specified mpi master task was not found\""
                ),
            });
        }
        let mpi_host = match job.task(&worker) {
            Some(w) => Some(env(MPI_HOST, &mpi_hosts(job.job_name(), w))),
            None => {
                warnings.push(format!(
                    "plugin {NAME}: flag -worker names task {worker:?}, which the job does not have; \
                     Volcano's mpi plugin leaves master pods unchanged (no {MPI_HOST})"
                ));
                None
            }
        };
        return Ok(Box::new(Mpi { master, container_port: go_int32(port), mpi_host, weft: None, warnings }));
    }

    require_task(NAME, "master", &master, job)?;
    let worker_task = require_task(NAME, "worker", &worker, job)?;
    let invalid = |message: String| PluginError::Invalid { plugin: NAME, message };
    if master == worker {
        return Err(invalid(format!("flags -master and -worker both name task {master:?}; they must differ")));
    }
    check_port(NAME, "port", port)?;
    let slots = match flags.int("slots") {
        s if s > 0 => s.unsigned_abs(),
        0 if !flags.was_given("slots") => task_gpus(worker_task).max(1),
        s => return Err(invalid(format!("flag -slots must be a number > 0, not {s}"))),
    };
    let timeout = launch::wait_timeout(&flags).map_err(invalid)?;

    let job_name = job.job_name();
    let cm_name = hostfile_name(job_name);
    let config_map = ConfigMap {
        metadata: object_meta(job, cm_name.clone()),
        data: Some([(HOSTFILE_KEY.to_owned(), hostfile(job_name, worker_task, slots))].into()),
        ..Default::default()
    };
    let volume = Volume {
        name: cm_name.clone(),
        config_map: Some(ConfigMapVolumeSource { name: cm_name.clone(), ..Default::default() }),
        ..Default::default()
    };
    let mount = VolumeMount { name: cm_name, mount_path: HOSTFILE_DIR.to_owned(), ..Default::default() };
    let targets = launch::task_targets(job_name, worker_task, port);
    let wait = match timeout {
        Some(timeout_secs) if !targets.is_empty() => Some(launch::wait_container(&Wait {
            task: worker.clone(),
            targets,
            timeout_secs,
            image: input.options.wait_image.clone(),
        })),
        _ => None,
    };
    Ok(Box::new(Mpi {
        master,
        container_port: go_int32(port),
        mpi_host: Some(env(MPI_HOST, &mpi_hosts(job_name, worker_task))),
        weft: Some(WeftMpi {
            config_map,
            volume,
            mount,
            hostfile_env: env(HOSTFILE_ENV, &format!("{HOSTFILE_DIR}/{HOSTFILE_KEY}")),
            wait,
        }),
        warnings,
    }))
}

fn is_wait_container(c: &Container) -> bool {
    c.name.starts_with(launch::WAIT_CONTAINER_PREFIX)
}

#[derive(Debug)]
struct Mpi {
    master: String,
    container_port: i32,
    /// `MPI_HOST` for master pods; `None` when the worker task is missing (Volcano: master pods
    /// unchanged).
    mpi_host: Option<EnvVar>,
    weft: Option<WeftMpi>,
    warnings: Vec<String>,
}

#[derive(Debug)]
struct WeftMpi {
    config_map: ConfigMap,
    volume: Volume,
    mount: VolumeMount,
    hostfile_env: EnvVar,
    /// Master pods' wait for the workers' sshd.
    wait: Option<Container>,
}

impl WeftMpi {
    fn mount_into(&self, c: &mut Container) {
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        // A second mount at the same path would make the pod invalid.
        if !mounts.iter().any(|m| m.mount_path == self.mount.mount_path || m.name == self.mount.name) {
            mounts.push(self.mount.clone());
        }
    }
}

impl JobPlugin for Mpi {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        let is_master = naming::pod_task(pod).unwrap_or("default") == self.master;
        let host = match (is_master, &self.mpi_host) {
            (true, None) => return Ok(()),
            (true, Some(h)) => Some(h),
            (false, _) => None,
        };
        let Some(spec) = pod.spec.as_mut() else {
            return Ok(());
        };
        // weft's own wait container (there when a pod is mutated again) is left bare.
        let weft = self.weft.is_some();
        let init = spec.init_containers.iter_mut().flatten().filter(|c| !(weft && is_wait_container(c)));
        for c in init {
            open_port(c, PORT_NAME, self.container_port);
            if let Some(h) = host {
                c.env.get_or_insert_with(Vec::new).push(h.clone());
            }
        }
        for c in &mut spec.containers {
            open_port(c, PORT_NAME, self.container_port);
            if let Some(h) = host {
                c.env.get_or_insert_with(Vec::new).push(h.clone());
            }
        }
        let Some(weft) = &self.weft else {
            return Ok(());
        };
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        if !volumes.iter().any(|v| v.name == weft.volume.name) {
            volumes.push(weft.volume.clone());
        }
        for c in spec.init_containers.iter_mut().flatten().filter(|c| !is_wait_container(c)) {
            weft.mount_into(c);
        }
        for c in &mut spec.containers {
            weft.mount_into(c);
            c.env.get_or_insert_with(Vec::new).push(weft.hostfile_env.clone());
        }
        if is_master && let Some(wait) = &weft.wait {
            launch::add_init_container(spec, wait);
        }
        Ok(())
    }

    fn job_objects(&self, ctx: &ObjectContext<'_>) -> Result<Vec<JobObject>, PluginError> {
        let _ = ctx;
        Ok(self.weft.iter().map(|w| JobObject::ConfigMap(w.config_map.clone())).collect())
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}
