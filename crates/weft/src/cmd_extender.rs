//! `weft scheduler-extender`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use weft_alloc::ScoreConfig;
use weft_extender::cache::CacheLimits;
use weft_extender::gang::NetworkLevels;
use weft_extender::{ClusterView, ExtenderConfig, ExtenderState, InMemoryView, KubeClusterView, serve_with};
use weft_gang::{LabelLevels, LevelSpec};
use weft_kube::http::ServeOptions;
use weft_kube::tls::TlsFiles;

use crate::component::{self, note};
use crate::kube_args::{KubeArgs, OpsArgs};
use crate::output::score_config;

#[derive(Args, Debug)]
pub struct ExtenderArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8888", value_name = "ADDR")]
    listen: SocketAddr,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    ops: OpsArgs,
    /// Extended resource counted as GPUs.
    #[arg(long, default_value = weft_record::DEFAULT_GPU_RESOURCE)]
    resource_name: String,
    /// Reject nodes whose `weft.io/gpu-topology` annotation is missing or unreadable (default: they
    /// pass unjudged and score 0).
    #[arg(long)]
    require_topology: bool,
    /// Weight (0–1) of the remainder-quality term of the node score.
    #[arg(long, default_value_t = ScoreConfig::default().remainder_weight)]
    remainder_weight: f64,
    /// What the score's affinity term measures of a GPU set: `ring` (the slowest hop of its best
    /// ring) or `pair-score` (go-gpuallocator's mean pair score).
    #[arg(long, value_enum, default_value_t = crate::output::SetQualityArg::Ring)]
    set_quality: crate::output::SetQualityArg,
    /// Score (0–10) every node gets for pods that request no GPUs.
    #[arg(long, default_value_t = 5)]
    neutral_score: i64,
    /// Path prefix of the verbs (`/weft` serves /weft/filter, /weft/prioritize, /weft/bind and
    /// /weft/volcano/...).
    #[arg(long, default_value = "")]
    path_prefix: String,
    /// Bytes one request body may send in all (read as it arrives; what weft does not read, such
    /// as the task pods in vc-scheduler's NodeInfos, is dropped as it goes).
    #[arg(long, default_value_t = weft_extender::config::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Bytes of JSON one request may have decoded and kept (its pod, node objects and names), and
    /// the largest single value held to decode (one Node, one NodeInfo, a bind body).
    #[arg(long, default_value_t = weft_extender::config::DEFAULT_MAX_DECODED_BYTES)]
    max_decoded_bytes: usize,
    /// Time to read, decide and answer one request (kube-scheduler waits 5s by default). Decisions
    /// stop at this deadline too.
    #[arg(long, default_value = "3s", value_name = "DURATION", value_parser = crate::duration_arg::positive)]
    request_timeout: Duration,
    /// The old spelling of --request-timeout, in milliseconds.
    #[arg(long, hide = true, value_name = "MS", conflicts_with = "request_timeout")]
    request_timeout_ms: Option<u64>,
    /// Candidate nodes one request may name; larger requests are refused.
    #[arg(long, default_value_t = weft_extender::config::DEFAULT_MAX_NODES_PER_REQUEST)]
    max_nodes_per_request: usize,
    /// Requests deciding at once; later ones wait for a slot within their own time (default: the
    /// number of CPUs).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_concurrent_decisions: Option<u32>,
    /// Node names the topology cache remembers.
    #[arg(long, default_value_t = weft_extender::cache::DEFAULT_MAX_NODES)]
    cache_max_nodes: usize,
    /// Bytes the topology cache may hold (annotation text and prepared topologies).
    #[arg(long, default_value_t = weft_extender::cache::DEFAULT_MAX_BYTES)]
    cache_max_bytes: usize,
    /// How long a GPU decision made by bind counts as used while the watch has not yet shown the
    /// pod on its node (1s to 1h).
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = reservation_ttl)]
    reservation_ttl: Duration,
    /// How long a gang's plan is held after its last member's activity (1s to 1h): the GPUs of the
    /// members not yet placed count as used for other pods meanwhile (docs/gang.md).
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = reservation_ttl)]
    gang_plan_ttl: Duration,
    /// The node labels that describe the cluster's network for gang plans, top (broadest) tier
    /// first, comma-separated; a key ending in `?` is optional (nodes without it are in no domain
    /// of that tier), e.g. `example.com/spine,example.com/leaf,nvidia.com/gpu.clique?`. Default:
    /// Volcano's HyperNodes when the cluster has any, else NVIDIA Topograph's labels with GFD's
    /// GPU clique innermost.
    #[arg(long, value_name = "KEYS", value_parser = network_levels)]
    network_levels: Option<LabelLevels>,
    /// The old spelling of --reservation-ttl, in seconds.
    #[arg(long, hide = true, value_name = "SECONDS", conflicts_with = "reservation_ttl", value_parser = reservation_ttl)]
    reservation_ttl_seconds: Option<Duration>,
    /// Serve HTTPS with this certificate chain (PEM, leaf first; reloaded when the file changes).
    /// Set `enableHTTPS: true` and the CA in kube-scheduler's extender `tlsConfig` to match.
    #[arg(long, value_name = "FILE", requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// Private key of the serving certificate, PEM (PKCS#8, PKCS#1 or SEC1). Reloaded with it.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// How often the certificate files are checked for changes.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::duration_arg::at_least_1s)]
    tls_reload_interval: Duration,
    /// Serve without a cluster, to try the extender locally: nodes from this cluster file (the
    /// simulator's SimCluster format, `weft simulate --cluster`; `default` for the embedded default
    /// cluster), named `<type>-<i>` and annotated with their topologies.
    #[arg(long, value_name = "FILE")]
    cluster_file: Option<PathBuf>,
    /// With --cluster-file: pods already on those nodes (Pod manifests with `spec.nodeName`, and
    /// `weft.io/gpu-ids` where their GPUs are known).
    #[arg(long, value_name = "FILE", requires = "cluster_file")]
    pods_file: Option<PathBuf>,
    /// Honour the `X-Weft-Debug: true` header on prioritize (each node's reason in the answer,
    /// which tells any caller how many GPUs are free on each node). Off by default.
    #[arg(long)]
    debug_reasons: bool,
    /// For pods that ask no SR-IOV VFs, rank nodes with a VF free below those without, keeping the
    /// GPUs beside free VFs for the pods that need them (turn on where pods ask VFs).
    #[arg(long)]
    spare_vfs: bool,
}

/// `--network-levels`: label keys, top first, `?` marking an optional level.
fn network_levels(s: &str) -> Result<LabelLevels, String> {
    let mut levels = Vec::new();
    for (i, key) in s.split(',').map(str::trim).enumerate() {
        let (key, optional) = match key.strip_suffix('?') {
            Some(k) => (k.trim(), true),
            None => (key, false),
        };
        if key.is_empty() {
            return Err(format!("{s:?}: level {} has no label key", i + 1));
        }
        levels.push(LevelSpec { keys: vec![key.to_string()], optional });
    }
    Ok(LabelLevels { levels })
}

/// `--reservation-ttl`: 1s to 1h.
fn reservation_ttl(s: &str) -> Result<Duration, String> {
    let d = crate::duration_arg::at_least_1s(s)?;
    if d > Duration::from_secs(3600) {
        return Err(format!("{s:?}: at most 1h"));
    }
    Ok(d)
}

pub fn run(a: ExtenderArgs) -> anyhow::Result<()> {
    if !(0..=10).contains(&a.neutral_score) {
        anyhow::bail!("--neutral-score must be between 0 and 10 (MaxExtenderPriority), got {}", a.neutral_score);
    }
    let defaults = ExtenderConfig::default();
    let cfg = ExtenderConfig {
        resource_name: a.resource_name.clone(),
        require_topology: a.require_topology,
        score_config: score_config(a.remainder_weight, a.set_quality)?,
        neutral_score: a.neutral_score,
        path_prefix: a.path_prefix.clone(),
        max_body_bytes: a.max_body_bytes,
        max_decoded_bytes: a.max_decoded_bytes,
        request_timeout: a.request_timeout_ms.map_or(a.request_timeout, Duration::from_millis),
        max_nodes_per_request: a.max_nodes_per_request,
        max_concurrent_decisions: a.max_concurrent_decisions.map_or(defaults.max_concurrent_decisions, |n| n as usize),
        debug_reasons: a.debug_reasons,
        spare_vfs: a.spare_vfs,
        cache_limits: CacheLimits { max_nodes: a.cache_max_nodes, max_bytes: a.cache_max_bytes },
        reservation_ttl: a.reservation_ttl_seconds.unwrap_or(a.reservation_ttl),
        gang_plan_ttl: a.gang_plan_ttl,
        network_levels: a.network_levels.clone().map_or(NetworkLevels::Auto, NetworkLevels::Levels),
    };
    let tls = match (&a.tls_cert_file, &a.tls_key_file) {
        (Some(cert), Some(key)) => {
            Some(Arc::new(TlsFiles::load(cert, key).context("loading the serving certificate")?))
        }
        _ => None,
    };
    component::run("scheduler-extender", &a.ops, |c| async move {
        // Against a cluster the extender also binds (`POST /bind`); from files it cannot write.
        let state = match &a.cluster_file {
            Some(file) => ExtenderState::new(Arc::new(local_view(file, a.pods_file.as_deref())?), cfg),
            None => {
                let client = a.kube.client().await?;
                let view: Arc<dyn ClusterView> = Arc::new(KubeClusterView::spawn(client.clone()));
                ExtenderState::new(view, cfg).with_binder(Arc::new(weft_extender::KubePodBinder::new(client)))
            }
        };
        let state = Arc::new(state);
        c.ops.register_metrics(|registry| {
            state.register_metrics(registry);
            if let Some(tls) = &tls {
                tls.register_metrics(registry, "extender");
            }
        });
        state.add_readiness_check(&c.ops);
        c.started();
        let reloader = tls.as_ref().map(|t| t.spawn_reloader(a.tls_reload_interval, c.shutdown.clone()));
        let listener =
            tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("listening on {}", a.listen))?;
        let addr = listener.local_addr().unwrap_or(a.listen);
        let scheme = if tls.is_some() { "https" } else { "http" };
        note(format_args!(
            "weft scheduler-extender listening on {scheme}://{addr} (ready once node and pod caches sync)"
        ));
        let stop = c.shutdown.clone();
        let config = tls.as_ref().map(|t| t.config());
        let served =
            serve_with(listener, state, config, ServeOptions::default(), async move { stop.cancelled().await }).await;
        c.shutdown.cancel();
        served.context("serving")?;
        if let Some(reloader) = reloader {
            reloader.await.context("certificate reload task")?;
        }
        Ok(())
    })
}

/// A cluster held in memory from a cluster file (and pods), for trying the extender locally.
fn local_view(cluster_file: &std::path::Path, pods_file: Option<&std::path::Path>) -> anyhow::Result<InMemoryView> {
    let (spec, base) = if cluster_file.as_os_str() == "default" {
        (weft_sim::cluster::ClusterSpec::embedded_default(), None)
    } else {
        (weft_sim::cluster::ClusterSpec::from_file(cluster_file)?, cluster_file.parent())
    };
    let cluster = spec.build(base)?;
    let view = InMemoryView::new();
    for node in &cluster.nodes {
        let topology = &cluster.types[node.node_type].topology;
        let annotations = [(weft_record::TOPOLOGY_ANNOTATION.to_string(), weft_topology::inventory::to_json(topology))];
        view.insert_node(k8s_openapi::api::core::v1::Node {
            metadata: kube::api::ObjectMeta {
                name: Some(node.name.clone()),
                resource_version: Some("1".into()),
                annotations: Some(annotations.into_iter().collect()),
                ..Default::default()
            },
            ..Default::default()
        });
    }
    let mut pods = 0;
    if let Some(path) = pods_file {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let docs: Vec<k8s_openapi::api::core::v1::Pod> =
            serde_saphyr::from_multiple(&text).with_context(|| format!("{}: not Pod manifests", path.display()))?;
        for pod in docs {
            pods += 1;
            view.insert_pod(pod);
        }
    }
    let names: Vec<&str> = cluster.nodes.iter().map(|n| n.name.as_str()).collect();
    let shown = names.iter().take(6).copied().collect::<Vec<_>>().join(", ");
    note(format_args!(
        "weft scheduler-extender: no cluster; {} nodes from {} ({shown}{}) and {pods} pods",
        names.len(),
        cluster_file.display(),
        if names.len() > 6 { ", …" } else { "" }
    ));
    Ok(view)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn network_levels_are_label_keys_top_first_with_a_question_mark_for_optional_ones() {
        let levels = network_levels("example.com/spine, example.com/leaf ,nvidia.com/gpu.clique?").unwrap();
        let got: Vec<(&str, bool)> = levels.levels.iter().map(|l| (l.keys[0].as_str(), l.optional)).collect();
        assert_eq!(got, [("example.com/spine", false), ("example.com/leaf", false), ("nvidia.com/gpu.clique", true)]);
    }

    #[test]
    fn a_network_level_without_a_key_is_refused_naming_its_position() {
        let e = network_levels("example.com/spine,,x").unwrap_err();
        assert!(e.contains("level 2 has no label key"), "{e}");
        assert!(network_levels("?").unwrap_err().contains("level 1"));
    }
}
