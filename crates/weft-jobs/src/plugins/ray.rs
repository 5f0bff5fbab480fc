//! The `ray` plugin: a Ray cluster from a head task and a worker task.
//!
//! Volcano (`pkg/controllers/job/plugins/distributed-framework/ray/ray.go`):
//! - Service `<job>-head-svc` (no `type`, so ClusterIP; selector job name, job namespace and
//!   `volcano.sh/task-spec=<head>`; TCP ports `gcs`, `dashboard`, `client-server`, each with the
//!   target port of the same name).
//! - In head pods, the container named `--headContainer` gets the ports `gcs`, `dashboard` and
//!   `client-server` (each unless that port number is exposed) and the command
//!   `sh -c "ray start --head --block --dashboard-host=0.0.0.0 --port=<gcs>
//!   --dashboard-port=<dashboard> --ray-client-server-port=<client>"`.
//! - In worker pods, the container named `--workerContainer` gets the command
//!   `sh -c "ray start --block --address=<head replica 0 domain name>:<gcs>"`.
//! - Without a head task every pod of the job fails to be created (`OnPodCreate` errs), but
//!   `OnJobAdd` has already created `<job>-head-svc`, selecting no pod. In [`Flavor::Volcano`],
//!   [`build`] gives a plugin with that Service, no pod changes and the failure as a warning.
//!
//! weft ([`Flavor::Weft`]) adds a `weft wait-for` init container on worker pods that waits for the
//! head's GCS port (`--wait`, `--wait-timeout`), and checks the job: the head task exists with one
//! replica, `--headContainer` is a container of the head template and `--workerContainer` one of
//! the worker template (when there is a worker task), the three ports are valid and differ.

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::common::{
    CONTAINER_PORT_REJECTED, check_port, go_int32, parse_args, require_task, shell_word, volcano_port_warning,
};
use crate::flags::FlagDef;
use crate::job::{Job, TaskSpec};
use crate::launch::{self, Wait};
use crate::naming;
use crate::plugin::{BuildInput, Flavor, JobObject, JobPlugin, ObjectContext, PluginError, object_meta};

/// The plugin's name.
pub const NAME: &str = "ray";

/// Port name of the GCS.
pub const GCS_PORT_NAME: &str = "gcs";
/// Port name of the dashboard.
pub const DASHBOARD_PORT_NAME: &str = "dashboard";
/// Port name of the Ray client server.
pub const CLIENT_PORT_NAME: &str = "client-server";

/// Volcano's flags.
pub const FLAGS: &[FlagDef] = &[
    FlagDef::string("head", "head"),
    FlagDef::string("headContainer", "head"),
    FlagDef::string("worker", "worker"),
    FlagDef::string("workerContainer", "worker"),
    FlagDef::int("port", "6379"),
    FlagDef::int("dashboardPort", "8265"),
    FlagDef::int("clientPort", "10001"),
];

/// The flags weft's flavor accepts after Volcano's: `--wait` and `--wait-timeout`.
pub const WEFT_EXTRA_FLAGS: &[FlagDef] = &[launch::WAIT_FLAG, launch::WAIT_TIMEOUT_FLAG];

/// Name of the head Service: `<job>-head-svc`.
pub fn head_service_name(job: &str) -> String {
    format!("{job}-head-svc")
}

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let job = input.job;
    let weft = input.flavor == Flavor::Weft;
    let (flags, mut warnings) = parse_args(NAME, FLAGS, WEFT_EXTRA_FLAGS, &input)?;
    let head = flags.string("head").to_owned();
    let worker = flags.string("worker").to_owned();
    let head_container = flags.string("headContainer").to_owned();
    let worker_container = flags.string("workerContainer").to_owned();
    let ports = [
        ("port", flags.int("port")),
        ("dashboardPort", flags.int("dashboardPort")),
        ("clientPort", flags.int("clientPort")),
    ];
    let [(_, gcs), (_, dashboard), (_, client)] = ports;
    let invalid = |message: String| PluginError::Invalid { plugin: NAME, message };

    if !weft {
        for (flag, port) in ports {
            warnings.extend(volcano_port_warning(NAME, flag, port, CONTAINER_PORT_REJECTED));
        }
    }
    let Some(head_task) = job.task(&head) else {
        if weft {
            return Err(PluginError::missing_task(NAME, "head", &head, job));
        }
        // Volcano's OnJobAdd creates the head Service without looking for the task; only
        // OnPodCreate checks it, and fails every pod.
        let service = head_service(job, &head, gcs, dashboard, client);
        warnings.push(format!(
            "plugin {NAME}: flag -head names task {head:?}, which the job does not have; Volcano's ray plugin fails every \
             pod of the job: \"job {} doesn't have head task {head}\" (it still creates Service {}, which selects no pod)",
            job.job_name(),
            service.metadata.name.as_deref().unwrap_or_default()
        ));
        return Ok(Box::new(Headless { service, warnings }));
    };

    let mut wait = None;
    if weft {
        for (flag, port) in ports {
            check_port(NAME, flag, port)?;
        }
        if gcs == dashboard || gcs == client || dashboard == client {
            return Err(invalid(format!(
                "flags -port ({gcs}), -dashboardPort ({dashboard}) and -clientPort ({client}) must differ: \
                 the head Service cannot have two ports with one number"
            )));
        }
        if head == worker {
            return Err(invalid(format!("flags -head and -worker both name task {head:?}; they must differ")));
        }
        if head_task.replicas != 1 {
            return Err(invalid(format!(
                "flag -head names task {head:?}, which has {} replicas; a Ray cluster has exactly one head: give it replicas: 1",
                head_task.replicas
            )));
        }
        require_container(head_task, "headContainer", &head_container)?;
        if let Some(worker_task) = job.task(&worker) {
            require_container(worker_task, "workerContainer", &worker_container)?;
        } else if flags.was_given("worker") {
            require_task(NAME, "worker", &worker, job)?;
        }
        if let Some(timeout_secs) = launch::wait_timeout(&flags).map_err(invalid)? {
            wait = Some(launch::wait_container(&Wait {
                task: head.clone(),
                targets: launch::task_targets(job.job_name(), head_task, gcs),
                timeout_secs,
                image: input.options.wait_image.clone(),
            }));
        }
    }

    let head_addr = naming::domain_name(job.job_name(), head_task, 0);
    let sh = |script: String| vec!["sh".to_owned(), "-c".to_owned(), script];
    Ok(Box::new(Ray {
        service: head_service(job, &head, gcs, dashboard, client),
        head_command: sh(format!(
            "ray start --head --block --dashboard-host=0.0.0.0 --port={gcs} --dashboard-port={dashboard} --ray-client-server-port={client}"
        )),
        worker_command: sh(format!("ray start --block --address={}", shell_word(&format!("{head_addr}:{gcs}")))),
        head,
        worker,
        head_container,
        worker_container,
        ports: [go_int32(gcs), go_int32(dashboard), go_int32(client)],
        wait,
        warnings,
    }))
}

fn require_container(task: &TaskSpec, flag: &'static str, name: &str) -> Result<(), PluginError> {
    let containers = task.template.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    if containers.iter().any(|c| c.name == name) {
        return Ok(());
    }
    Err(PluginError::MissingContainer {
        plugin: NAME,
        flag,
        task: task.name.clone(),
        container: name.to_owned(),
        containers: containers.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "),
    })
}

/// Volcano's `<job>-head-svc`.
fn head_service(job: &Job, head: &str, gcs: i64, dashboard: i64, client: i64) -> Service {
    let port = |name: &str, port: i64| ServicePort {
        name: Some(name.to_owned()),
        port: go_int32(port),
        target_port: Some(IntOrString::String(name.to_owned())),
        protocol: Some("TCP".to_owned()),
        ..Default::default()
    };
    Service {
        metadata: object_meta(job, head_service_name(job.job_name())),
        spec: Some(ServiceSpec {
            selector: Some(
                [
                    (naming::JOB_NAME_KEY.to_owned(), job.job_name().to_owned()),
                    (naming::JOB_NAMESPACE_KEY.to_owned(), job.job_namespace().to_owned()),
                    (naming::TASK_SPEC_KEY.to_owned(), head.to_owned()),
                ]
                .into(),
            ),
            ports: Some(vec![
                port(GCS_PORT_NAME, gcs),
                port(DASHBOARD_PORT_NAME, dashboard),
                port(CLIENT_PORT_NAME, client),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

/// Volcano's ray plugin on a job without its head task: the head Service and nothing on the pods
/// (Volcano creates none of them).
#[derive(Debug)]
struct Headless {
    service: Service,
    warnings: Vec<String>,
}

impl JobPlugin for Headless {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, _pod: &mut Pod) -> Result<(), PluginError> {
        Ok(())
    }

    fn job_objects(&self, _ctx: &ObjectContext<'_>) -> Result<Vec<JobObject>, PluginError> {
        Ok(vec![JobObject::Service(self.service.clone())])
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

#[derive(Debug)]
struct Ray {
    head: String,
    worker: String,
    head_container: String,
    worker_container: String,
    /// GCS, dashboard, client server (Go's `int32` of the flags).
    ports: [i32; 3],
    service: Service,
    head_command: Vec<String>,
    worker_command: Vec<String>,
    /// weft: worker pods' wait for the head's GCS.
    wait: Option<Container>,
    warnings: Vec<String>,
}

impl JobPlugin for Ray {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        let task = naming::pod_task(pod).unwrap_or("default");
        let (is_head, is_worker) = (task == self.head, task == self.worker);
        let Some(spec) = pod.spec.as_mut() else {
            return Ok(());
        };
        for c in &mut spec.containers {
            if is_head && c.name == self.head_container {
                let ports = c.ports.get_or_insert_with(Vec::new);
                let has = |port: i32| ports.iter().any(|p| p.container_port == port);
                let missing: Vec<(&str, i32)> = [GCS_PORT_NAME, DASHBOARD_PORT_NAME, CLIENT_PORT_NAME]
                    .into_iter()
                    .zip(self.ports)
                    .filter(|(_, port)| !has(*port))
                    .collect();
                ports.extend(missing.into_iter().map(|(name, port)| ContainerPort {
                    name: Some(name.to_owned()),
                    container_port: port,
                    ..Default::default()
                }));
                c.command = Some(self.head_command.clone());
            }
            if is_worker && c.name == self.worker_container {
                c.command = Some(self.worker_command.clone());
            }
        }
        if is_worker && let Some(wait) = &self.wait {
            launch::add_init_container(spec, wait);
        }
        Ok(())
    }

    fn job_objects(&self, ctx: &ObjectContext<'_>) -> Result<Vec<JobObject>, PluginError> {
        let _ = ctx;
        Ok(vec![JobObject::Service(self.service.clone())])
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}
