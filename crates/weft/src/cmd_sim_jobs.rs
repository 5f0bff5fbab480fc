//! `weft simulate --jobs [FILE]`: whole jobs (gangs and single pods) on a cluster with a network,
//! under weft's gang plan, weft pod by pod, Volcano's network-topology-aware plugin and Kueue's TAS
//! (weft_sim::jobs; docs/gang.md, "Simulating jobs").

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use weft_alloc::ScoreConfig;
use weft_sim::ClusterSpec;
use weft_sim::jobs::{
    JobGenerate, JobPolicyKind, JobRun, JobsFile, JobsReport, NetworkSpec, builtin_scenario, default_scenario,
    simulate_jobs,
};

use crate::output::{Output, count, count_f, print_json, report_table, wrap};

/// The job options of `weft simulate`.
#[derive(Args, Debug, Default)]
pub struct JobsArgs {
    /// Simulate whole jobs instead of pods: gangs of 2-64 pods and single pods arriving and leaving,
    /// placed by weft's gang plan, weft pod by pod, Volcano's network-topology-aware plugin and
    /// Kueue's TAS, with wait times, one-domain shares and each job's slowest-hop bandwidth. FILE is
    /// a `kind: SimJobs` stream (a generator and/or listed jobs); without one, a generated stream
    /// of --job-count jobs. The cluster is --cluster (its `network:` section), else the built-in
    /// GB200 NVL72 + H100 scenario.
    #[arg(long, value_name = "FILE", num_args = 0..=1,
          conflicts_with_all = ["workload", "pods", "pipelines", "matrix", "optimum", "pods_out", "policies", "wide", "report"])]
    pub jobs: Option<Option<PathBuf>>,
    /// With --jobs and no FILE: jobs in the generated stream.
    #[arg(long, value_name = "N", default_value_t = 2000, requires = "jobs")]
    pub job_count: usize,
    /// With --jobs: seconds a job waits for room before it gives up (counted as not placed).
    #[arg(long, value_name = "SECONDS", default_value_t = 3600.0, requires = "jobs")]
    pub patience: f64,
}

/// Nodes of the built-in scenario scaled to `nodes`: half of them GB200 NVL72 trays in whole racks
/// of 18 (at least one rack), the rest H100.
pub fn scenario(nodes: Option<usize>) -> (ClusterSpec, NetworkSpec) {
    match nodes {
        None => default_scenario(),
        Some(n) => {
            let racks = (n / 2 / weft_gang::builtin::NVL72_TRAYS).max(1).min(n / weft_gang::builtin::NVL72_TRAYS);
            builtin_scenario(racks, n - racks * weft_gang::builtin::NVL72_TRAYS)
        }
    }
}

/// Run `--jobs`.
pub fn run(
    args: &JobsArgs,
    cluster: Option<&Path>,
    nodes: Option<usize>,
    seed: u64,
    score: ScoreConfig,
    output: Output,
) -> anyhow::Result<()> {
    if !(args.patience.is_finite() && args.patience >= 0.0) {
        anyhow::bail!("--patience must be a number of seconds ≥ 0, got {}", args.patience);
    }
    let (spec, network) = match cluster {
        Some(p) => {
            if nodes.is_some() {
                anyhow::bail!("--nodes scales the built-in job scenario; with --cluster, the file gives the nodes");
            }
            let (spec, network) = ClusterSpec::from_file_with_network(p)
                .with_context(|| format!("reading cluster file {}", p.display()))?;
            (spec, network.unwrap_or_default())
        }
        None => {
            if nodes == Some(0) || nodes.is_some_and(|n| n < weft_gang::builtin::NVL72_TRAYS + 1) {
                anyhow::bail!(
                    "--nodes with --jobs: at least {} (one NVL72 rack and a node)",
                    weft_gang::builtin::NVL72_TRAYS + 1
                );
            }
            if nodes.is_some_and(|n| n > weft_sim::MAX_NODES) {
                anyhow::bail!("--nodes is more than the simulator takes (at most {})", weft_sim::MAX_NODES);
            }
            scenario(nodes)
        }
    };
    let net = network.build(&spec, cluster.and_then(Path::parent)).context("building the cluster and its network")?;
    let gpus = net.cluster.total_gpus();
    let jobs = match args.jobs.as_ref().and_then(|f| f.as_deref()) {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading jobs file {}", p.display()))?;
            let name = p.display().to_string();
            JobsFile::parse(&text, &name)?.jobs(gpus, &name)?
        }
        None => JobGenerate { jobs: args.job_count, seed, ..JobGenerate::default() }.jobs(gpus)?,
    };
    let run = JobRun { patience: args.patience, score };
    let report = simulate_jobs(&net, &jobs, &JobPolicyKind::ALL, &run)?;
    match output {
        Output::Json => print_json(&report),
        Output::Table => print_table(&report),
    }
}

/// The report: a head, one row per policy in 100 columns, run times, a legend.
pub fn print_table(r: &JobsReport) -> anyhow::Result<()> {
    let domains: Vec<String> = r.domains_per_tier.iter().map(|d| count(*d)).collect();
    outln!(
        "{}",
        wrap(
            &format!(
                "cluster:  {} nodes, {} GPUs; tiers {} with {} domains",
                count(r.nodes),
                count(r.gpus),
                r.tiers,
                domains.join(" / ")
            ),
            10
        )
    )?;
    outln!(
        "{}",
        wrap(
            &format!(
                "jobs:     {} ({} gangs, {} single pods), {} GPUs asked",
                count(r.jobs),
                count(r.gangs),
                count(r.jobs - r.gangs),
                count(r.gpus_asked)
            ),
            10
        )
    )?;
    outln!()?;
    let mut t = report_table(
        &[
            "policy",
            "jobs\nplaced",
            "gangs\nplaced",
            "wait s\nmean/p50/p90",
            "one NVL\ndomain",
            "one\nleaf",
            "bandwidth GB/s\nmean / p10",
            "over\ntier",
        ],
        &[1, 2, 3, 4, 5, 6, 7],
    );
    for p in &r.policies {
        t.add_row(vec![
            p.policy.clone(),
            count(p.placed),
            count(p.gangs_placed),
            format!("{}/{}/{}", count_f(p.mean_wait_s, 0), count_f(p.p50_wait_s, 0), count_f(p.p90_wait_s, 0)),
            format!("{:.1}%", p.one_nvlink_domain_share * 100.0),
            format!("{:.1}%", p.one_leaf_share * 100.0),
            format!("{:.1} / {:.1}", p.mean_bandwidth_gbps, p.p10_bandwidth_gbps),
            count(p.constraint_violations),
        ]);
    }
    outln!("{t}")?;
    let times: Vec<String> = r.policies.iter().map(|p| format!("{} {:.0} ms", p.policy, p.run_ms)).collect();
    outln!("{}", wrap(&format!("run time: {}", times.join(", ")), 10))?;
    outln!()?;
    let legend = [
        (
            "jobs placed",
            "jobs placed / offered; a job waits in one FIFO queue (retried at each departure, later jobs that fit go first) and gives up after --patience",
        ),
        ("gangs placed", "jobs of 2 or more pods placed"),
        ("wait s", "seconds from arrival to placement of the placed jobs"),
        ("one NVL domain", "share of placed jobs of 2+ GPUs inside one node or one multi-node NVLink domain"),
        ("one leaf", "share of those inside one leaf switch (or one node)"),
        (
            "bandwidth",
            "per job of 2+ GPUs, its slowest hop: the ring over its GPUs on each node, the NVLink domain, the leaf's NICs, the spine or core over their oversubscription (GB/s per direction); mean and 10th percentile",
        ),
        ("over tier", "hard-constrained jobs placed beyond their highest tier (weft-pods does not read constraints)"),
    ];
    for (column, meaning) in legend {
        outln!("{}", wrap(&format!("{column:<16}{meaning}"), 16))?;
    }
    Ok(())
}
