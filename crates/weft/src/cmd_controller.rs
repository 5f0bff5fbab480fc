//! `weft controller`: the cluster-level controllers (Deployment), behind Lease leader election.

use std::time::Duration;

use clap::{Args, ValueEnum};
use weft_admission::job_controller::{self, JobControllerConfig};
use weft_crds::numanetwork_controller;
use weft_kube::controller::{Context, ControllerMetrics, Settings};
use weft_kube::leader::{self, LeaderConfig};

use crate::component::{self, note};
use crate::kube_args::{KubeArgs, OpsArgs, instance_name};

/// The controllers `weft controller` can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ControllerKind {
    /// Validates each NumaNetwork and records the verdict in its status.
    Numanetwork,
    /// Creates, updates and deletes the job-level objects (ConfigMaps, Secrets, Services,
    /// NetworkPolicies) of weft's plugins on Volcano Jobs (annotation `weft.io/job-plugins`).
    Jobs,
}

#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// Controllers to run, comma-separated. All run under the same leader election.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "numanetwork,jobs")]
    controllers: Vec<ControllerKind>,
    /// Seconds between checks for Volcano's Job API while it is not served (the jobs controller
    /// waits for it).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    volcano_poll: u64,
    /// Run only while holding the leader Lease, so that one replica of several acts at a time.
    #[arg(long)]
    leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, default_value = "weft-controller")]
    lease_name: String,
    /// Namespace of the leader Lease (the Deployment sets POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "weft-system")]
    lease_namespace: String,
    /// This replica's identity in the Lease (default: $POD_NAME, else the host name).
    #[arg(long)]
    leader_identity: Option<String>,
    /// Lease validity after the last renewal, seconds.
    #[arg(long, default_value_t = 15)]
    lease_duration: u64,
    /// Renew this many seconds before the Lease expires.
    #[arg(long, default_value_t = 5)]
    renew_grace: u64,
    /// Reconciles running at once, per controller.
    #[arg(long, default_value_t = 4)]
    concurrency: u16,
    /// Field manager recorded on writes.
    #[arg(long, default_value = "weft-controller")]
    field_manager: String,
    /// Most pods a Volcano Job may have for weft to build its objects (keep it equal to the
    /// webhook's --max-job-replicas).
    #[arg(long, default_value_t = weft_jobs::volcano_rules::MAX_TOTAL_REPLICAS, value_name = "N")]
    max_job_replicas: u64,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    ops: OpsArgs,
}

pub fn run(a: ControllerArgs) -> anyhow::Result<()> {
    let instance = a.leader_identity.clone().or_else(instance_name);
    let leader_cfg = a.leader_elect.then(|| {
        let mut c = LeaderConfig::new(&a.lease_name, &a.lease_namespace, instance.as_deref().unwrap_or_default());
        c.lease_duration = Duration::from_secs(a.lease_duration);
        c.renew_grace = Duration::from_secs(a.renew_grace);
        c
    });
    component::run("controller", &a.ops, |c| async move {
        let client = a.kube.client().await?;
        let (metrics, leader_gauge) = c.ops.register_metrics(|registry| {
            (ControllerMetrics::register(registry), leader::register_leader_gauge(registry))
        });
        let ctx = Context::new(client.clone(), "weft-controller", instance.clone(), &a.field_manager, metrics);
        let settings = |name| Settings { concurrency: a.concurrency, ..Settings::new(name) };
        let (nn_settings, job_settings) = (settings(numanetwork_controller::NAME), settings(job_controller::NAME));
        let mut job_config =
            JobControllerConfig { api_poll: Duration::from_secs(a.volcano_poll), ..JobControllerConfig::default() };
        job_config.build.max_job_replicas = a.max_job_replicas;
        let (run_nn, run_jobs) =
            (a.controllers.contains(&ControllerKind::Numanetwork), a.controllers.contains(&ControllerKind::Jobs));
        let names: Vec<_> =
            a.controllers.iter().filter_map(|c| c.to_possible_value()).map(|v| v.get_name().to_owned()).collect();
        note(format_args!("weft controller: controllers {}", names.join(", ")));
        let work = move |stop: tokio_util::sync::CancellationToken| async move {
            let nn = async {
                if run_nn {
                    let stop = stop.clone();
                    numanetwork_controller::run(ctx.clone(), nn_settings, async move { stop.cancelled().await }).await;
                }
            };
            let jobs = async {
                if run_jobs {
                    let stop = stop.clone();
                    job_controller::run(ctx.clone(), job_settings, job_config, async move { stop.cancelled().await })
                        .await;
                }
            };
            tokio::join!(nn, jobs);
        };
        // Ready once the client works and (for the leader) the controllers started; standbys are
        // ready too, or a rolling update could never finish.
        c.started();
        match &leader_cfg {
            Some(cfg) => {
                note(format_args!(
                    "weft controller {}: waiting for lease {}/{}",
                    cfg.identity, cfg.namespace, cfg.lease_name
                ));
                leader::run_as_leader(client, cfg, leader_gauge, c.shutdown.clone(), work)
                    .await
                    .map_err(anyhow::Error::from)
            }
            None => {
                note("weft controller: running without leader election");
                work(c.shutdown.clone()).await;
                Ok(())
            }
        }
    })
}
