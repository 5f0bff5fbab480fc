//! `weft webhook`: admission for Volcano Jobs and their pods (see `docs/webhook.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use weft_admission::webhook::{self, InMemoryJobs, JobSource, KubeJobSource, TlsFiles, WebhookState};
use weft_jobs::admission::AdmissionOptions;
use weft_jobs::plugin::{BuildOptions, DEFAULT_WAIT_IMAGE};
use weft_kube::http::ServeOptions;

use crate::component::{self, note};
use crate::kube_args::{KubeArgs, OpsArgs};

#[derive(Args, Debug)]
pub struct WebhookArgs {
    /// Address of the HTTPS admission endpoint (/jobs/mutate, /jobs/validate, /pods/mutate).
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
    /// How often the certificate files are checked for changes, seconds.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    tls_reload_interval: u64,
    /// Serve without a cluster, to try the webhook locally: the Volcano Jobs that own the pods
    /// reviewed are read from this file (YAML or JSON documents, as the API server stores them)
    /// instead of the API server.
    #[arg(long, value_name = "FILE")]
    jobs_file: Option<PathBuf>,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    ops: OpsArgs,
}

pub fn run(a: WebhookArgs) -> anyhow::Result<()> {
    if a.tls_reload_interval == 0 {
        anyhow::bail!("--tls-reload-interval must be at least 1 second");
    }
    let opts = AdmissionOptions {
        scheduler_name: a.scheduler_name.clone(),
        build: BuildOptions { wait_image: a.wait_image.clone(), max_job_replicas: a.max_job_replicas },
    };
    let tls = Arc::new(TlsFiles::load(&a.tls_cert_file, &a.tls_key_file).context("loading the serving certificate")?);
    component::run("webhook", &a.ops, |c| async move {
        let jobs: Arc<dyn JobSource> = match &a.jobs_file {
            Some(file) => Arc::new(local_jobs(file)?),
            None => Arc::new(KubeJobSource::spawn(a.kube.client().await?)),
        };
        let state = Arc::new(WebhookState::new(jobs, opts));
        c.ops.register_metrics(|registry| {
            state.register_metrics(registry);
            tls.register_metrics(registry, "webhook");
        });
        state.add_readiness_check(&c.ops);
        c.started();
        let reloader = tls.spawn_reloader(Duration::from_secs(a.tls_reload_interval), c.shutdown.clone());
        let listener =
            tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("listening on {}", a.listen))?;
        note(format_args!(
            "weft webhook listening on https://{} (ready once the Volcano Job cache syncs; certificate {})",
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
