//! The `pytorch` plugin: torch.distributed's rendezvous variables on every pod of the job.
//!
//! Volcano (`pkg/controllers/job/plugins/distributed-framework/pytorch/pytorch.go`):
//! - Every container of every pod gets, in this order, `MASTER_ADDR` (the master task's replica-0
//!   domain name, no port), `MASTER_PORT` (`--port`), `WORLD_SIZE` (replicas of the master and
//!   worker tasks only) and `RANK` (`0` on master pods, `index+1` on worker pods, none on pods of
//!   other tasks), and the port `pytorchjob-port` unless it already exposes that port number.
//! - With `--wait-master-enabled`, worker pods get the init container `wait-for-master`, a shell
//!   loop probing the master's port every 2 s (`--wait-master-image`, `--wait-master-timeout`).
//! - Without a master task it changes nothing.
//!
//! weft ([`Flavor::Weft`]) adds, after Volcano's variables: `PET_MASTER_ADDR`, `PET_MASTER_PORT`,
//! `PET_NNODES` (= `WORLD_SIZE`), `PET_NODE_RANK` (= `RANK`, where `RANK` is set) and
//! `PET_NPROC_PER_NODE` (`--nproc-per-node`, else the container's `nvidia.com/gpu` limit or
//! request when positive, else none), so `torchrun` needs no arguments. Worker pods wait for the
//! master's port in a `weft wait-for` init container (`--wait`, `--wait-timeout`) unless
//! `--wait-master-enabled` asks for Volcano's own wait. The master task must exist and have one
//! replica (RANK assumes one master); a `--worker` given explicitly must exist.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use super::common::{
    CONTAINER_PORT_REJECTED, check_port, container_gpus, env, go_int32, open_port, parse_args, volcano_port_warning,
};
use crate::flags::FlagDef;
use crate::launch::{self, Wait};
use crate::naming;
use crate::plugin::{BuildInput, Flavor, JobPlugin, PluginError};

/// The plugin's name.
pub const NAME: &str = "pytorch";

/// Volcano's default `--port`.
pub const DEFAULT_PORT: i64 = 23456;

/// Name of the container port the plugin opens.
pub const PORT_NAME: &str = "pytorchjob-port";

/// Name of Volcano's wait init container (`--wait-master-enabled`).
pub const WAIT_MASTER_CONTAINER: &str = "wait-for-master";

/// Volcano's default `--wait-master-image`.
pub const DEFAULT_WAIT_MASTER_IMAGE: &str = "busybox:1.36.1";

/// Volcano's flags.
pub const FLAGS: &[FlagDef] = &[
    FlagDef::string("master", "master"),
    FlagDef::string("worker", "worker"),
    FlagDef::int("port", "23456"),
    FlagDef::bool("wait-master-enabled", "false"),
    FlagDef::int("wait-master-timeout", "300"),
    FlagDef::string("wait-master-image", DEFAULT_WAIT_MASTER_IMAGE),
];

/// The flags weft's flavor accepts after Volcano's: `--nproc-per-node` (an integer, `gpu`, `cpu`
/// or `auto`, as `torchrun` takes it; empty = from the container's GPUs), `--wait` and
/// `--wait-timeout`.
pub const WEFT_EXTRA_FLAGS: &[FlagDef] =
    &[FlagDef::string("nproc-per-node", ""), launch::WAIT_FLAG, launch::WAIT_TIMEOUT_FLAG];

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let job = input.job;
    let weft = input.flavor == Flavor::Weft;
    let (flags, mut warnings) = parse_args(NAME, FLAGS, WEFT_EXTRA_FLAGS, &input)?;
    let master = flags.string("master").to_owned();
    let worker = flags.string("worker").to_owned();
    let port = flags.int("port");

    let Some(master_task) = job.task(&master) else {
        if weft {
            return Err(PluginError::missing_task(NAME, "master", &master, job));
        }
        warnings.push(format!(
            "plugin {NAME}: flag -master names task {master:?}, which the job does not have; \
             Volcano's pytorch plugin leaves every pod unchanged"
        ));
        return Ok(Box::new(Pytorch { inactive: true, warnings, ..Pytorch::new(master, worker, port) }));
    };

    if !weft {
        warnings.extend(volcano_port_warning(NAME, "port", port, CONTAINER_PORT_REJECTED));
    }
    let wait_master = flags.bool("wait-master-enabled");
    let mut nproc = None;
    let mut weft_wait = None;
    if weft {
        check_port(NAME, "port", port)?;
        if worker == master {
            return Err(invalid(format!("flags -master and -worker both name task {master:?}; they must differ")));
        }
        if flags.was_given("worker") && job.task(&worker).is_none() {
            return Err(PluginError::missing_task(NAME, "worker", &worker, job));
        }
        if master_task.replicas != 1 {
            return Err(invalid(format!(
                "flag -master names task {master:?}, which has {} replicas; RANK assumes exactly one master: \
                 give it replicas: 1 and put the other pods in the -worker task",
                master_task.replicas
            )));
        }
        let nproc_flag = flags.string("nproc-per-node");
        if !nproc_flag.is_empty() {
            let ok = matches!(nproc_flag, "gpu" | "cpu" | "auto") || nproc_flag.parse::<u32>().is_ok_and(|n| n > 0);
            if !ok {
                return Err(invalid(format!(
                    "flag -nproc-per-node: invalid value {nproc_flag:?}: expected a number > 0, gpu, cpu or auto"
                )));
            }
            nproc = Some(nproc_flag.to_owned());
        }
        let timeout = launch::wait_timeout(&flags).map_err(invalid)?;
        if wait_master {
            if flags.was_given("wait") && timeout.is_some() {
                return Err(invalid(
                    "flags -wait and -wait-master-enabled both ask for a wait init container on worker pods; \
                     use one (-wait-master-enabled is Volcano's busybox loop, -wait weft's wait-for)"
                        .to_owned(),
                ));
            }
            if flags.int("wait-master-timeout") <= 0 {
                return Err(invalid(format!(
                    "flag -wait-master-timeout must be a number of seconds > 0, not {}",
                    flags.int("wait-master-timeout")
                )));
            }
            if flags.string("wait-master-image").is_empty() {
                return Err(invalid("flag -wait-master-image must name an image".to_owned()));
            }
        } else if let Some(timeout_secs) = timeout {
            let targets = launch::task_targets(job.job_name(), master_task, port);
            weft_wait = Some(launch::wait_container(&Wait {
                task: master.clone(),
                targets,
                timeout_secs,
                image: input.options.wait_image.clone(),
            }));
        }
    }

    let master_addr = naming::domain_name(job.job_name(), master_task, 0);
    let world_size: i64 =
        job.spec.tasks.iter().filter(|t| t.name == master || t.name == worker).map(|t| i64::from(t.replicas)).sum();
    let worker_init = if wait_master {
        Some(wait_for_master_container(
            flags.string("wait-master-image"),
            &master_addr,
            port,
            flags.int("wait-master-timeout"),
        ))
    } else {
        weft_wait
    };
    let mut common = vec![env("MASTER_ADDR", &master_addr), env("MASTER_PORT", &port.to_string())];
    common.push(env("WORLD_SIZE", &world_size.to_string()));
    let pet_common = if weft {
        vec![
            env("PET_MASTER_ADDR", &master_addr),
            env("PET_MASTER_PORT", &port.to_string()),
            env("PET_NNODES", &world_size.to_string()),
        ]
    } else {
        Vec::new()
    };
    Ok(Box::new(Pytorch {
        common,
        pet_common,
        weft,
        nproc,
        worker_init,
        warnings,
        ..Pytorch::new(master, worker, port)
    }))
}

fn invalid(message: String) -> PluginError {
    PluginError::Invalid { plugin: NAME, message }
}

/// Volcano's `wait-for-master` init container, script byte for byte.
fn wait_for_master_container(image: &str, addr: &str, port: i64, timeout: i64) -> Container {
    // The address is a DNS name, so quoting leaves it as it is, but nothing else reaches the shell.
    let addr = super::common::shell_word(addr);
    let script = format!(
        r#"echo "Waiting for master node {addr}:{port} to be ready..."
TIMEOUT={timeout}
ELAPSED=0
until {{ nc -z {addr} {port} || echo > /dev/tcp/{addr}/{port}; }} 2>/dev/null; do
  if [ $ELAPSED -ge $TIMEOUT ]; then
    echo "Timeout waiting for master after ${{TIMEOUT}} seconds"
    exit 1
  fi
  echo "Master not ready yet, retrying in 2 seconds... (elapsed: ${{ELAPSED}}s)"
  sleep 2
  ELAPSED=$((ELAPSED + 2))
done
echo "Master node is ready!""#
    );
    Container {
        name: WAIT_MASTER_CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        command: Some(vec!["sh".to_owned(), "-c".to_owned(), script]),
        ..Default::default()
    }
}

#[derive(Debug)]
struct Pytorch {
    master: String,
    worker: String,
    /// `--port` as Go's `int32(port)` makes it for container ports.
    container_port: i32,
    /// Volcano found no master task: the plugin does nothing.
    inactive: bool,
    /// `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`.
    common: Vec<EnvVar>,
    /// weft: `PET_MASTER_ADDR`, `PET_MASTER_PORT`, `PET_NNODES`.
    pet_common: Vec<EnvVar>,
    weft: bool,
    /// weft: `--nproc-per-node` when given.
    nproc: Option<String>,
    /// The init container worker pods get (Volcano's `wait-for-master` or weft's wait), if any.
    worker_init: Option<Container>,
    warnings: Vec<String>,
}

impl Pytorch {
    fn new(master: String, worker: String, port: i64) -> Self {
        Self {
            master,
            worker,
            container_port: go_int32(port),
            inactive: false,
            common: Vec::new(),
            pet_common: Vec::new(),
            weft: false,
            nproc: None,
            worker_init: None,
            warnings: Vec::new(),
        }
    }
}

impl JobPlugin for Pytorch {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        if self.inactive {
            return Ok(());
        }
        let task = naming::pod_task(pod).unwrap_or("default");
        let is_worker = task == self.worker;
        // Volcano checks the worker role first, so a task named by both flags counts as a worker.
        let rank = if is_worker {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let index = naming::pod_index_number(name).ok_or_else(|| PluginError::Pod {
                plugin: NAME,
                pod: name.to_owned(),
                message: "a worker pod's name must end in -<index> (<job>-<task>-<index>)".to_owned(),
            })?;
            Some((index + 1).to_string())
        } else if task == self.master {
            Some("0".to_owned())
        } else {
            None
        };
        let Some(spec) = pod.spec.as_mut() else {
            return Ok(());
        };
        if is_worker && let Some(init) = &self.worker_init {
            launch::add_init_container(spec, init);
        }
        for c in &mut spec.containers {
            open_port(c, PORT_NAME, self.container_port);
            let nproc =
                if self.weft { self.nproc.clone().or_else(|| container_gpus(c).map(|n| n.to_string())) } else { None };
            let env_list = c.env.get_or_insert_with(Vec::new);
            env_list.extend(self.common.iter().cloned());
            if let Some(rank) = &rank {
                env_list.push(env("RANK", rank));
            }
            env_list.extend(self.pet_common.iter().cloned());
            if self.weft {
                if let Some(rank) = &rank {
                    env_list.push(env("PET_NODE_RANK", rank));
                }
                if let Some(nproc) = nproc {
                    env_list.push(env("PET_NPROC_PER_NODE", &nproc));
                }
            }
        }
        Ok(())
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}
