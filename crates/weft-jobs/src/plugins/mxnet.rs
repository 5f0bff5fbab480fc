//! The `mxnet` plugin (weft only): MXNet's parameter-server variables (ps-lite's `DMLC_*`) on the
//! scheduler, server and worker pods.
//!
//! Volcano has no mxnet plugin (the design lists one; it was never written). Its MXNet example,
//! `example/integrations/mxnet/train/train-mnist-cpu.yaml`, writes the same variables by hand in
//! each task; this plugin computes them:
//!
//! | variable | value |
//! |---|---|
//! | `DMLC_PS_ROOT_URI` | the scheduler's replica-0 domain name, e.g. `<job>-scheduler-0.<job>` |
//! | `DMLC_PS_ROOT_PORT` | `--port`, default 9000 (the example's value) |
//! | `DMLC_NUM_SERVER` | replicas of the `--server` task |
//! | `DMLC_NUM_WORKER` | replicas of the `--worker` task |
//! | `DMLC_ROLE` | `scheduler`, `server` or `worker` |
//! | `DMLC_USE_KUBERNETES` | `1` |
//!
//! They go to every container of the three roles' pods, in that order; pods of other tasks are
//! left alone. `DMLC_USE_KUBERNETES=1` is not in the design's table but is in Volcano's example
//! (and Kubeflow's MXJob sets it): without it ps-lite's scheduler binds its own DNS name instead of
//! `0.0.0.0`. The scheduler's containers get the port `mxnet-port` (unless they expose that port
//! number). Server and worker pods wait for the scheduler's port in a `weft wait-for` init
//! container (`--wait`, `--wait-timeout`).
//!
//! The scheduler task must exist with one replica; the server and worker tasks must exist; the
//! three flags must name different tasks.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use super::common::{check_port, env, open_port, require_task};
use crate::flags::{self, FlagDef, Mode};
use crate::launch::{self, Wait};
use crate::naming;
use crate::plugin::{BuildInput, Flavor, JobPlugin, PluginError};

/// The plugin's name.
pub const NAME: &str = "mxnet";

/// Default `--port`: `DMLC_PS_ROOT_PORT` in Volcano's MXNet example.
pub const DEFAULT_PORT: i64 = 9000;

/// Name of the container port opened on the scheduler.
pub const PORT_NAME: &str = "mxnet-port";

/// The plugin's flags (weft only: Volcano has no mxnet plugin).
pub const FLAGS: &[FlagDef] = &[
    FlagDef::string("scheduler", "scheduler"),
    FlagDef::string("server", "server"),
    FlagDef::string("worker", "worker"),
    FlagDef::int("port", "9000"),
    launch::WAIT_FLAG,
    launch::WAIT_TIMEOUT_FLAG,
];

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let invalid = |message: String| PluginError::Invalid { plugin: NAME, message };
    if input.flavor == Flavor::Volcano {
        return Err(invalid(
            "Volcano has no mxnet plugin (its webhook rejects the job: \"unable to find job plugin: mxnet\"); \
             put it in annotation weft.io/job-plugins"
                .to_owned(),
        ));
    }
    let job = input.job;
    let (flags, _) =
        flags::parse(FLAGS, input.args, Mode::Strict).map_err(|source| PluginError::Args { plugin: NAME, source })?;
    let scheduler = flags.string("scheduler").to_owned();
    let server = flags.string("server").to_owned();
    let worker = flags.string("worker").to_owned();
    let port = flags.int("port");
    check_port(NAME, "port", port)?;
    let roles = [("scheduler", &scheduler), ("server", &server), ("worker", &worker)];
    for (i, (a, x)) in roles.iter().enumerate() {
        if let Some((b, _)) = roles[i + 1..].iter().find(|(_, y)| y == x) {
            return Err(invalid(format!("flags -{a} and -{b} both name task {x:?}; they must differ")));
        }
    }
    let scheduler_task = require_task(NAME, "scheduler", &scheduler, job)?;
    let server_task = require_task(NAME, "server", &server, job)?;
    let worker_task = require_task(NAME, "worker", &worker, job)?;
    if scheduler_task.replicas != 1 {
        return Err(invalid(format!(
            "flag -scheduler names task {scheduler:?}, which has {} replicas; MXNet has exactly one scheduler: give it replicas: 1",
            scheduler_task.replicas
        )));
    }
    let timeout = launch::wait_timeout(&flags).map_err(invalid)?;
    let wait = timeout.map(|timeout_secs| {
        launch::wait_container(&Wait {
            task: scheduler.clone(),
            targets: launch::task_targets(job.job_name(), scheduler_task, port),
            timeout_secs,
            image: input.options.wait_image.clone(),
        })
    });
    let common = vec![
        env("DMLC_PS_ROOT_URI", &naming::domain_name(job.job_name(), scheduler_task, 0)),
        env("DMLC_PS_ROOT_PORT", &port.to_string()),
        env("DMLC_NUM_SERVER", &server_task.replicas.to_string()),
        env("DMLC_NUM_WORKER", &worker_task.replicas.to_string()),
    ];
    Ok(Box::new(Mxnet {
        scheduler,
        server,
        worker,
        container_port: i32::try_from(port).unwrap_or_default(),
        common,
        wait,
    }))
}

#[derive(Debug)]
struct Mxnet {
    scheduler: String,
    server: String,
    worker: String,
    container_port: i32,
    /// `DMLC_PS_ROOT_URI`, `DMLC_PS_ROOT_PORT`, `DMLC_NUM_SERVER`, `DMLC_NUM_WORKER`.
    common: Vec<EnvVar>,
    /// Server and worker pods' wait for the scheduler.
    wait: Option<Container>,
}

impl JobPlugin for Mxnet {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        let task = naming::pod_task(pod).unwrap_or("default");
        let role = if task == self.scheduler {
            "scheduler"
        } else if task == self.server {
            "server"
        } else if task == self.worker {
            "worker"
        } else {
            return Ok(());
        };
        let Some(spec) = pod.spec.as_mut() else {
            return Ok(());
        };
        for c in &mut spec.containers {
            if role == "scheduler" {
                open_port(c, PORT_NAME, self.container_port);
            }
            let env_list = c.env.get_or_insert_with(Vec::new);
            env_list.extend(self.common.iter().cloned());
            env_list.push(env("DMLC_ROLE", role));
            env_list.push(env("DMLC_USE_KUBERNETES", "1"));
        }
        if role != "scheduler"
            && let Some(wait) = &self.wait
        {
            launch::add_init_container(spec, wait);
        }
        Ok(())
    }
}
