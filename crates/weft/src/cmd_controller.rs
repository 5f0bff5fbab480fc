//! `weft controller`: the cluster-level controllers (Deployment), behind Lease leader election.

use std::time::Duration;

use clap::{Args, ValueEnum};
use weft_admission::job_controller::{self, JobControllerConfig};
use weft_crds::numanetwork_controller;
use weft_crds::profile_provider::{ProfileProvider, serve};
use weft_kube::controller::{Context, ControllerMetrics, Settings};
use weft_kube::leader::{self, LeaderConfig};

use crate::component::{self, note};
use crate::kube_args::{KubeArgs, OpsArgs, instance_name};

/// The controllers `weft controller` can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ControllerKind {
    /// Validates each NumaNetwork, makes its ResourceClaimTemplates where pipelines use it,
    /// counts its addresses and collects those whose claim is gone.
    Numanetwork,
    /// The DNS registrar: for each ready Numaflow vertex pod on a NumaNetwork, a CoreDNS etcd
    /// (SkyDNS) record of its vertex domain and second-NIC address (docs/dns.md). Needs an etcd
    /// (--dns-etcd-endpoints); not on by default.
    Dns,
    /// Creates, updates and deletes the job-level objects (ConfigMaps, Secrets, Services,
    /// NetworkPolicies) of weft's plugins on Volcano Jobs (annotation `weft.io/job-plugins`).
    Jobs,
}

#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// Controllers to run, comma-separated. All run under the same leader election.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "numanetwork,jobs")]
    controllers: Vec<ControllerKind>,
    /// Time between checks for Volcano's Job API while it is not served (the jobs controller
    /// waits for it).
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::duration_arg::at_least_1s)]
    volcano_poll: Duration,
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
    /// Lease validity after the last renewal (whole seconds: the Lease stores seconds).
    #[arg(long, default_value = "15s", value_name = "DURATION", value_parser = crate::duration_arg::whole_seconds)]
    lease_duration: Duration,
    /// Renew this long before the Lease expires (whole seconds).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = crate::duration_arg::whole_seconds)]
    renew_grace: Duration,
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
    /// Serve dranet's profile provider (`--profile-provider=webhook --webhook-url=http://<this>`)
    /// on this address, handing out NumaNetwork addresses for the profiles `weft.io/<network>`.
    /// Every replica serves it, leader or not (addresses are claimed through the API server).
    #[arg(long, value_name = "ADDR")]
    dranet_profile_provider: Option<std::net::SocketAddr>,
    #[command(flatten)]
    dns: DnsArgs,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    ops: OpsArgs,
}

/// The DNS registrar's settings (`--controllers dns`).
#[derive(Args, Debug)]
pub struct DnsArgs {
    /// etcd client URLs the records go to (CoreDNS's etcd plugin `endpoint`), comma-separated;
    /// plain http only.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    dns_etcd_endpoints: Vec<String>,
    /// etcd path the records live under (CoreDNS's `path`).
    #[arg(long, default_value = "/skydns")]
    dns_prefix: String,
    /// `ttl` of each record (whole seconds: the record stores seconds).
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::duration_arg::whole_seconds)]
    dns_ttl: Duration,
    /// TTL of the registrar's etcd lease (whole seconds): how long a dead registrar's records stay.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::duration_arg::whole_seconds)]
    dns_lease_ttl: Duration,
    /// Zone of the vertex domains (must match `weft webhook`'s).
    #[arg(long, default_value = weft_pipeline::DEFAULT_ZONE)]
    dns_zone: String,
    /// DRA drivers whose devices' networkData carries the vertex address, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "nic.weft.io,dra.net")]
    dns_drivers: Vec<String>,
    /// Owner marker written in every record; keep it stable so a restart collects its stale records.
    #[arg(long, default_value = "weft-controller")]
    dns_registrar_id: String,
    /// Revoke the lease on an orderly stop, removing the records at once (default: they stay until
    /// the lease runs out, so the next leader takes them over without a gap).
    #[arg(long)]
    dns_revoke_on_shutdown: bool,
}

impl DnsArgs {
    fn settings(&self) -> weft_dns::DnsSettings {
        weft_dns::DnsSettings {
            endpoints: self.dns_etcd_endpoints.clone(),
            prefix: self.dns_prefix.clone(),
            ttl: u32::try_from(self.dns_ttl.as_secs()).unwrap_or(u32::MAX),
            lease_ttl: self.dns_lease_ttl,
            zone: self.dns_zone.clone(),
            drivers: self.dns_drivers.clone(),
            registrar_id: self.dns_registrar_id.clone(),
            revoke_on_shutdown: self.dns_revoke_on_shutdown,
            ..weft_dns::DnsSettings::default()
        }
    }
}

pub fn run(a: ControllerArgs) -> anyhow::Result<()> {
    let instance = a.leader_identity.clone().or_else(instance_name);
    let leader_cfg = a.leader_elect.then(|| {
        let mut c = LeaderConfig::new(&a.lease_name, &a.lease_namespace, instance.as_deref().unwrap_or_default());
        c.lease_duration = a.lease_duration;
        c.renew_grace = a.renew_grace;
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
        let mut job_config = JobControllerConfig { api_poll: a.volcano_poll, ..JobControllerConfig::default() };
        job_config.build.max_job_replicas = a.max_job_replicas;
        let (run_nn, run_jobs) =
            (a.controllers.contains(&ControllerKind::Numanetwork), a.controllers.contains(&ControllerKind::Jobs));
        let run_dns = a.controllers.contains(&ControllerKind::Dns);
        let dns_settings = a.dns.settings();
        if run_dns {
            dns_settings.validate().map_err(|e| anyhow::anyhow!("--controllers dns: {e}"))?;
        }
        let dns_controller_settings = settings(weft_dns::NAME);
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
            let dns = async {
                if run_dns {
                    let stop = stop.clone();
                    if let Err(e) = weft_dns::run(ctx.clone(), dns_controller_settings, dns_settings, async move {
                        stop.cancelled().await
                    })
                    .await
                    {
                        tracing::error!(error = %e, "DNS registrar could not start");
                    }
                }
            };
            tokio::join!(nn, jobs, dns);
        };
        if let Some(addr) = a.dranet_profile_provider {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("--dranet-profile-provider {addr}: cannot listen: {e}"))?;
            note(format_args!("weft controller: dranet profile provider on http://{addr}"));
            let stop = c.shutdown.clone();
            let provider = ProfileProvider::new(client.clone());
            tokio::spawn(async move {
                if let Err(e) = serve(provider, listener, async move { stop.cancelled().await }).await {
                    tracing::error!(error = %e, "dranet profile provider stopped");
                }
            });
        }
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
