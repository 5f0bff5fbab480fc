//! `weft webhook`: admission for Volcano Jobs and their pods (see `docs/webhook.md`), and for
//! Numaflow Pipelines on NumaNetworks and NumaNetworks themselves (`docs/pipelines.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use weft_admission::webhook::{
    self, DEFAULT_ZONE, FixedPipelineCrd, InMemoryJobs, InMemoryNumaNetworks, JobSource, KubeJobSource,
    KubeNumaNetworks, KubePipelineCrd, NetworkOptions, NumaNetworkSource, NumaNetworkValidator, PipelineCrdSource,
    TlsFiles, WebhookState, WiringOptions, typed_validator,
};
use weft_crds::NumaNetwork;
use weft_jobs::admission::AdmissionOptions;
use weft_jobs::plugin::{BuildOptions, DEFAULT_WAIT_IMAGE};
use weft_kube::http::ServeOptions;

use crate::component::{self, note};
use crate::kube_args::{KubeArgs, OpsArgs};

#[derive(Args, Debug)]
pub struct WebhookArgs {
    /// Address of the HTTPS admission endpoint (/jobs/mutate, /jobs/validate, /pods/mutate,
    /// /pipelines/mutate, /pipelines/validate, /numanetworks/validate).
    #[arg(long, default_value = "0.0.0.0:8443", value_name = "ADDR")]
    listen: SocketAddr,
    /// Serving certificate chain, PEM (leaf first). Reloaded when the file changes.
    #[arg(long, value_name = "FILE")]
    tls_cert_file: PathBuf,
    /// Private key of the serving certificate, PEM (PKCS#8, PKCS#1 or SEC1). Reloaded with it.
    #[arg(long, value_name = "FILE")]
    tls_key_file: PathBuf,
    /// Scheduler name a Volcano Job without one gets (Volcano's webhook: its first scheduler).
    #[arg(long, default_value = "volcano")]
    scheduler_name: String,
    /// Image of the launch-order init containers weft's plugins add (it runs `weft wait-for`).
    #[arg(long, env = "WEFT_WAIT_IMAGE", default_value = DEFAULT_WAIT_IMAGE, value_name = "IMAGE")]
    wait_image: String,
    /// Most pods a Volcano Job may have, summed over its tasks; larger jobs are denied (every pod
    /// carries the host lists of the whole job).
    #[arg(long, default_value_t = weft_jobs::volcano_rules::MAX_TOTAL_REPLICAS, value_name = "N")]
    max_job_replicas: u64,
    /// Most NumaNetworks that may exist: creating one more is denied (0: no cap). Counted with a
    /// LIST of NumaNetworks at each create.
    #[arg(long, default_value_t = 0, value_name = "N")]
    max_numa_networks: u32,
    /// DNS zone vertex domains end in: <vertex>.<numaNetwork>.<pipeline>.<namespace>.<ZONE>. Keep it
    /// equal to the DNS registrar's and CoreDNS's zone.
    #[arg(long, default_value = DEFAULT_ZONE, value_name = "ZONE")]
    vertex_domain_zone: String,
    /// How often the certificate files are checked for changes.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::duration_arg::at_least_1s)]
    tls_reload_interval: Duration,
    /// Serve without a cluster, to try the webhook locally: the Volcano Jobs that own the pods
    /// reviewed are read from this file (YAML or JSON documents, as the API server stores them)
    /// instead of the API server.
    #[arg(long, value_name = "FILE")]
    jobs_file: Option<PathBuf>,
    /// With --jobs-file: the NumaNetworks that exist, read from this file (YAML or JSON documents)
    /// instead of the API server. Without it, no NumaNetwork exists.
    #[arg(long, value_name = "FILE", requires = "jobs_file")]
    numa_networks_file: Option<PathBuf>,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    ops: OpsArgs,
}

pub fn run(a: WebhookArgs) -> anyhow::Result<()> {
    let opts = AdmissionOptions {
        scheduler_name: a.scheduler_name.clone(),
        build: BuildOptions { wait_image: a.wait_image.clone(), max_job_replicas: a.max_job_replicas },
    };
    webhook::check_zone(&a.vertex_domain_zone).context("--vertex-domain-zone")?;
    let network_opts = NetworkOptions {
        wiring: WiringOptions { zone: a.vertex_domain_zone.clone() },
        max_numa_networks: a.max_numa_networks,
        validator: Some(numa_network_rules()),
    };
    let tls = Arc::new(TlsFiles::load(&a.tls_cert_file, &a.tls_key_file).context("loading the serving certificate")?);
    component::run("webhook", &a.ops, |c| async move {
        type Sources = (Arc<dyn JobSource>, Arc<dyn NumaNetworkSource>, Arc<dyn PipelineCrdSource>);
        let (jobs, networks, pipeline_crd): Sources = match &a.jobs_file {
            Some(file) => (
                Arc::new(local_jobs(file)?),
                Arc::new(local_networks(a.numa_networks_file.as_deref())?),
                Arc::new(FixedPipelineCrd(None)),
            ),
            None => {
                let client = a.kube.client().await?;
                (
                    Arc::new(KubeJobSource::spawn(client.clone())),
                    Arc::new(KubeNumaNetworks::spawn(client.clone())),
                    Arc::new(KubePipelineCrd::spawn(client)),
                )
            }
        };
        let state = Arc::new(
            WebhookState::new(jobs, opts).with_numa_networks(networks, network_opts).with_pipeline_crd(pipeline_crd),
        );
        c.ops.register_metrics(|registry| {
            state.register_metrics(registry);
            tls.register_metrics(registry, "webhook");
        });
        state.add_readiness_check(&c.ops);
        c.started();
        let reloader = tls.spawn_reloader(a.tls_reload_interval, c.shutdown.clone());
        let listener =
            tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("listening on {}", a.listen))?;
        note(format_args!(
            "weft webhook listening on https://{} (ready once the Volcano Job and NumaNetwork caches sync; certificate {})",
            listener.local_addr().unwrap_or(a.listen),
            a.tls_cert_file.display()
        ));
        let stop = c.shutdown.clone();
        let served =
            webhook::serve(
                listener,
                state,
                tls.config(),
                ServeOptions::default(),
                async move { stop.cancelled().await },
            )
            .await;
        c.shutdown.cancel();
        served.context("serving the admission webhook")?;
        reloader.await.context("certificate reload task")
    })
}

/// The NumaNetwork rules of the CRD (`weft_crds::NumaNetwork::validate`, and `validate_update`
/// against the stored object on UPDATE), so admission rejects what the API server would.
fn numa_network_rules() -> NumaNetworkValidator {
    typed_validator(|n: &NumaNetwork, old: Option<&NumaNetwork>| {
        let checked = match old {
            None => n.validate(),
            Some(old) => n.validate_update(old),
        };
        checked.err().map(|e| e.errors().iter().map(ToString::to_string).collect()).unwrap_or_default()
    })
}

/// NumaNetworks held in memory from a file (or none), for trying the webhook locally.
fn local_networks(path: Option<&std::path::Path>) -> anyhow::Result<InMemoryNumaNetworks> {
    let networks = InMemoryNumaNetworks::new();
    let Some(path) = path else {
        return Ok(networks);
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("{}: not YAML or JSON", path.display()))?;
    let mut names = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        let network: NumaNetwork = serde_json::from_value(doc)
            .with_context(|| format!("{}: document {} is not a NumaNetwork", path.display(), i + 1))?;
        let name = network.metadata.name.clone().unwrap_or_default();
        networks.insert(&name);
        names.push(name);
    }
    note(format_args!("weft webhook: NumaNetworks from {}: {}", path.display(), names.join(", ")));
    Ok(networks)
}

/// Volcano Jobs held in memory from a file, for trying the webhook locally.
fn local_jobs(path: &std::path::Path) -> anyhow::Result<InMemoryJobs> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("{}: not YAML or JSON", path.display()))?;
    let jobs = InMemoryJobs::new();
    let mut names = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        let job: weft_jobs::Job = serde_json::from_value(doc)
            .with_context(|| format!("{}: document {} is not a Volcano Job", path.display(), i + 1))?;
        names.push(format!("{}/{}", job.job_namespace(), job.job_name()));
        jobs.insert(job);
    }
    note(format_args!("weft webhook: no cluster; Volcano Jobs from {}: {}", path.display(), names.join(", ")));
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn network(range: &str, vlan: i64) -> serde_json::Value {
        json!({"apiVersion": "numaflow.numaproj.io/v1alpha1", "kind": "NumaNetwork", "metadata": {"name": "n"},
            "spec": {"refDeviceClass": {"name": "vf.nvidia.dra.net"},
                "refResourceClaimDranet": {"ipRange": range, "vlanTag": vlan}}})
    }

    #[test]
    fn the_webhook_gets_the_crd_rules() {
        let rules = numa_network_rules();
        assert!(rules(&network("192.168.10.0/24", 10), None).is_empty());
        let errors = rules(&network("192.168.10.5/24", 4095), None);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().all(|e| e.starts_with("spec.refResourceClaimDranet.")), "{errors:?}");
        let errors = rules(&network("10.0.0.0/8", 10), Some(&network("192.168.10.0/24", 10)));
        assert!(errors.iter().any(|e| e.contains("ipRange") && e.contains("immutable")), "{errors:?}");
        assert!(rules(&json!({"spec": {}}), None)[0].starts_with("not a readable NumaNetwork"));
    }

    #[test]
    fn local_networks_come_from_the_example_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/numanetwork.yaml");
        let networks = local_networks(Some(&path)).unwrap();
        assert!(networks.cached("pipeline1-multi-network"));
        assert!(!local_networks(None).unwrap().cached("pipeline1-multi-network"));
        let jobs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/local/jobs.yaml");
        let e = local_networks(Some(&jobs)).unwrap_err();
        assert!(format!("{e:#}").contains("document 1 is not a NumaNetwork"), "{e:#}");
    }
}
