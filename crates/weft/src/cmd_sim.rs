//! `weft simulate`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use indicatif::{HumanCount, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use weft_alloc::ScoreConfig;
use weft_sim::pipeline::{PipelineReport, embedded_default};
use weft_sim::{
    ClusterSpec, Generate, PlacementPolicy, Progress, SimReport, builtin_types, read_scenario, read_workload, simulate,
    simulate_pipelines,
};

use crate::output::{Output, print_json, score_config, table};

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Cluster file (`kind: SimCluster`); default: the embedded cluster.
    #[arg(long, value_name = "FILE")]
    cluster: Option<PathBuf>,
    /// Workload file: a `kind: SimWorkload` generator or Pod manifests with `sim.weft.io/arrival`
    /// and `sim.weft.io/duration` annotations (VFs as `sriov.weft.io/<physnet>` requests); default:
    /// a generated stream, half of its pods asking for one VF of `fabric`.
    #[arg(long, value_name = "FILE")]
    workload: Option<PathBuf>,
    /// Scale the cluster to this many nodes (at most 1,000,000), keeping its mix of node types.
    #[arg(long, value_name = "N")]
    nodes: Option<usize>,
    /// Pods in the default generated stream (at most 10,000,000).
    #[arg(long, default_value_t = 5000)]
    pods: usize,
    /// Seed of the generated stream and of the blind policy's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Policies to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "weft,blind,least-allocated")]
    policies: Vec<PolicyArg>,
    /// Weight (0–1) of the remainder-quality term in weft's node score.
    #[arg(long, default_value_t = ScoreConfig::default().remainder_weight)]
    remainder_weight: f64,
    /// What the score's affinity term measures of a GPU set: `ring` (the slowest hop of its best
    /// ring) or `pair-score` (go-gpuallocator's mean pair score).
    #[arg(long, value_enum, default_value_t = crate::output::SetQualityArg::Ring)]
    set_quality: crate::output::SetQualityArg,
    /// Place Numaflow pipelines on NumaNetworks instead of a pod stream: each vertex pod's node,
    /// GPUs, NIC, IP address and DNS name under each policy, and the NIC–GPU alignment share. FILE
    /// is a `kind: SimPipelines` scenario; without one, the seed's video pipeline
    /// (in → filter-resize → inference → out).
    #[arg(long, value_name = "FILE", num_args = 0..=1, conflicts_with_all = ["workload", "pods"])]
    pipelines: Option<Option<PathBuf>>,
    /// With --pipelines: run every vertex with this many replicas.
    #[arg(long, value_name = "N", requires = "pipelines")]
    replicas: Option<usize>,
    /// Run a scenario matrix (`kind: SimMatrix`, e.g. crates/weft-sim/scenarios/matrix.yaml):
    /// every cell under every policy, with a verdict per cell (weft against each baseline: wins,
    /// ties or loses); exit status 1 when a cell's gate fails (`gate: true`: weft loses there;
    /// `gate: strict`: loses or ties).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["cluster", "workload", "nodes", "pods", "seed", "policies", "pipelines"])]
    matrix: Option<PathBuf>,
    /// With --matrix: only the cells marked `small: true` (CI's smoke run).
    #[arg(long, requires = "matrix")]
    small_only: bool,
    /// Put each policy's pods placed beside a proven upper bound on what any placement of the stream
    /// could place (the offline 0/1 program solved by microlp; docs/simulate.md, "Distance to the
    /// optimum"), on --instances generated streams of seeds --seed, --seed + 1, ... Meant for small
    /// instances: e.g. --nodes 12 --pods 300.
    #[arg(long, conflicts_with_all = ["pipelines", "matrix"])]
    optimum: bool,
    /// With --optimum: how many instances.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "optimum")]
    instances: usize,
    /// With --optimum: time limit of each instance's integer search (500ms, 30s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::duration_arg::positive, requires = "optimum")]
    time_limit: std::time::Duration,
    /// List the built-in node types and exit.
    #[arg(long)]
    list_node_types: bool,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: Output,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum PolicyArg {
    Weft,
    Blind,
    LeastAllocated,
}

impl From<PolicyArg> for PlacementPolicy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Weft => PlacementPolicy::Weft,
            PolicyArg::Blind => PlacementPolicy::Blind,
            PolicyArg::LeastAllocated => PlacementPolicy::LeastAllocated,
        }
    }
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if args.list_node_types {
        if args.output == Output::Json {
            let v: Vec<_> = builtin_types()
                .into_iter()
                .map(|(n, d)| serde_json::json!({"name": n, "description": d, "topology": format!("builtin:{n}")}))
                .collect();
            return print_json(&v);
        }
        let mut t = table(&["node type", "use as", "description"]);
        for (n, d) in builtin_types() {
            t.add_row(vec![n.to_string(), format!("builtin:{n}"), d.to_string()]);
        }
        outln!("{t}")?;
        return Ok(());
    }
    if let Some(file) = &args.matrix {
        return crate::cmd_sim_matrix::run(
            file,
            args.small_only,
            score_config(args.remainder_weight, args.set_quality)?,
            args.output,
        );
    }
    let spec = match &args.cluster {
        Some(p) => ClusterSpec::from_file(p).with_context(|| format!("reading cluster file {}", p.display()))?,
        None => ClusterSpec::embedded_default(),
    };
    let spec = match args.nodes {
        Some(0) => anyhow::bail!("--nodes must be at least 1"),
        Some(n) if n > weft_sim::MAX_NODES => {
            anyhow::bail!("--nodes {n} is more than the simulator takes (at most {})", weft_sim::MAX_NODES)
        }
        Some(n) => spec.scaled(n),
        None => spec,
    };
    let base = args.cluster.as_deref().and_then(|p| p.parent());
    let cluster = spec.build(base).context("building the cluster")?;
    if let Some(file) = &args.pipelines {
        return run_pipelines(&args, file.as_deref(), &cluster);
    }
    if args.optimum {
        let workload = match &args.workload {
            Some(p) => Some(read_workload(p).with_context(|| format!("reading workload {}", p.display()))?),
            None => None,
        };
        return crate::cmd_sim_optimum::run(crate::cmd_sim_optimum::OptimumRun {
            cluster: &cluster,
            workload,
            pods: args.pods,
            seed: args.seed,
            instances: args.instances,
            time_limit: args.time_limit,
            policies: args.policies.iter().map(|&p| p.into()).collect(),
            score_config: score_config(args.remainder_weight, args.set_quality)?,
            output: args.output,
        });
    }
    let pods = match &args.workload {
        Some(p) => read_workload(p).with_context(|| format!("reading workload {}", p.display()))?,
        None => Generate::default_for(cluster.total_gpus(), args.pods, args.seed).pods()?,
    };
    let policies: Vec<PlacementPolicy> = args.policies.iter().map(|&p| p.into()).collect();
    let score_config = score_config(args.remainder_weight, args.set_quality)?;

    let progress = PolicyProgress::new(&policies, pods.len(), args.output == Output::Table);
    let mut report = simulate(&cluster, &pods, &policies, &score_config, args.seed, &mut |i, p| progress.show(i, p))?;
    progress.clear();
    if args.workload.is_none() {
        report.workload.target_load = Some(Generate::DEFAULT_LOAD);
    }
    match args.output {
        Output::Json => print_json(&report),
        Output::Table => print_report(&report),
    }
}

fn run_pipelines(
    args: &SimulateArgs,
    file: Option<&std::path::Path>,
    cluster: &weft_sim::Cluster,
) -> anyhow::Result<()> {
    let scenario = match file {
        Some(p) => read_scenario(p).with_context(|| format!("reading pipeline scenario {}", p.display()))?,
        None => embedded_default(),
    };
    let scenario = match args.replicas {
        Some(n) => scenario.with_replicas(n),
        None => scenario,
    };
    let policies: Vec<PlacementPolicy> = args.policies.iter().map(|&p| p.into()).collect();
    let score_config = score_config(args.remainder_weight, args.set_quality)?;
    let report = simulate_pipelines(cluster, &scenario, &policies, &score_config, args.seed)?;
    match args.output {
        Output::Json => print_json(&report),
        Output::Table => print_pipelines(&report),
    }
}

fn print_pipelines(r: &PipelineReport) -> anyhow::Result<()> {
    let types: Vec<String> = r.cluster.node_types.iter().map(|(k, v)| format!("{v}× {k}")).collect();
    outln!(
        "cluster:  {} nodes, {} GPUs, {} SR-IOV VFs ({})",
        r.cluster.nodes,
        r.cluster.gpus,
        r.cluster.vfs,
        types.join(", ")
    )?;
    for n in &r.networks {
        let vlan = n.vlan.map_or("untagged".to_string(), |v| format!("VLAN {v}"));
        outln!(
            "network:  {} {} ({} usable addresses), {vlan}, NICs from physnet {}; {} vertex pods on it",
            n.name,
            n.ip_range,
            n.usable_addresses,
            n.physnet,
            n.pods
        )?;
    }
    // VERTEX_DOMAIN_TARGETS is the vertex's, whatever the policy: print it once.
    if let Some(first) = r.policies.first() {
        let mut seen = std::collections::BTreeSet::new();
        for p in &first.pods {
            if !p.domain_targets.is_empty() && seen.insert((&p.pipeline, &p.vertex)) {
                outln!("targets:  {}/{} VERTEX_DOMAIN_TARGETS={}", p.pipeline, p.vertex, p.domain_targets.join(","))?;
            }
        }
    }
    for p in &r.policies {
        outln!()?;
        outln!("{}: {}/{} vertex pods placed", p.policy, p.placed, p.placed + p.unplaced)?;
        let mut t = table(&["vertex", "pod", "node", "GPUs", "NIC/VF", "IP", "DNS name"]);
        for pod in &p.pods {
            let dash = || "-".to_string();
            let gpus = if pod.gpus.is_empty() {
                dash()
            } else {
                pod.gpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
            };
            let near = match pod.aligned {
                Some(true) => " (by its GPU)",
                Some(false) => " (across the host bridge)",
                None => "",
            };
            let join = |f: &dyn Fn(&weft_sim::pipeline::PodNic) -> String| {
                if pod.nics.is_empty() { dash() } else { pod.nics.iter().map(f).collect::<Vec<_>>().join("\n") }
            };
            t.add_row(vec![
                pod.vertex.clone(),
                pod.pod.clone(),
                pod.node.clone().unwrap_or_else(|| "not placed".to_string()),
                gpus,
                join(&|n| format!("{} {}{near}", n.nic, n.vf)),
                join(&|n| n.ip.to_string()),
                join(&|n| n.domain.clone()),
            ]);
        }
        outln!("{t}")?;
    }
    outln!()?;
    let shares: Vec<String> = r
        .policies
        .iter()
        .map(|p| {
            if p.nic_gpu_pods == 0 {
                format!("{} -", p.policy)
            } else {
                format!("{} {:.1}% ({}/{})", p.policy, p.alignment_share * 100.0, p.aligned_pods, p.nic_gpu_pods)
            }
        })
        .collect();
    outln!("NIC–GPU alignment: {}", shares.join(", "))?;
    outln!("(share of placed vertex pods holding GPUs and a NIC whose every NIC shares a PCIe switch with one of")?;
    outln!("their GPUs, so GPUDirect RDMA does not cross the host bridge)")?;
    Ok(())
}

/// One progress bar per policy on stderr while the run lasts: pods handled of the total, pods placed,
/// rate and time left. Drawn only for table output on a terminal: JSON output and a stderr that is a
/// pipe or a file (logs, CI) stay clean.
struct PolicyProgress {
    bars: Vec<ProgressBar>,
    _all: MultiProgress,
}

impl PolicyProgress {
    fn new(policies: &[PlacementPolicy], pods: usize, table: bool) -> PolicyProgress {
        let target = if table && std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let all = MultiProgress::with_draw_target(target);
        let style = ProgressStyle::with_template(
            "{prefix:>15} [{bar:24}] {human_pos}/{human_len} pods, {msg} placed, {rate} pods/s, {eta} left",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("rate", |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{}", HumanCount(state.per_sec() as u64));
        })
        .progress_chars("=> ");
        let bars = policies
            .iter()
            .map(|p| {
                let bar =
                    ProgressBar::new(pods as u64).with_style(style.clone()).with_prefix(p.name()).with_message("0");
                all.add(bar)
            })
            .collect();
        PolicyProgress { bars, _all: all }
    }

    fn show(&self, policy: usize, p: Progress) {
        if let Some(bar) = self.bars.get(policy) {
            bar.set_position(p.handled as u64);
            bar.set_message(HumanCount(p.placed as u64).to_string());
        }
    }

    fn clear(&self) {
        for bar in &self.bars {
            bar.finish_and_clear();
        }
    }
}

fn print_report(r: &SimReport) -> anyhow::Result<()> {
    let types: Vec<String> = r.cluster.node_types.iter().map(|(k, v)| format!("{v}× {k}")).collect();
    outln!(
        "cluster:  {} nodes, {} GPUs, {} SR-IOV VFs ({})",
        r.cluster.nodes,
        r.cluster.gpus,
        r.cluster.vfs,
        types.join(", ")
    )?;
    let sizes: Vec<String> = r.workload.by_size.iter().map(|(k, v)| format!("{v}× {k}-GPU")).collect();
    let sizes = if sizes.is_empty() { String::new() } else { format!(" ({})", sizes.join(", ")) };
    let target = r.workload.target_load.map_or(String::new(), |t| format!(" (generated for {:.0}%)", t * 100.0));
    let vfs = match r.workload.vf_pods {
        0 => String::new(),
        n => format!(", {n} asking for VFs"),
    };
    outln!(
        "workload: {} pods{sizes}{vfs}, offered load {:.0}% of GPU capacity{target}",
        r.workload.pods,
        r.workload.offered_load * 100.0
    )?;
    outln!()?;
    let mut t = table(&[
        "policy",
        "placed",
        "8-GPU placed",
        "ring GB/s mean/p10",
        "pair GB/s mean/p10",
        "all-NVLink sets",
        "VFs by their GPUs",
        "stranded free GPUs",
        "run time",
    ]);
    for p in &r.policies {
        let eight = p.by_size.get(&8).map_or("-".to_string(), |c| format!("{}/{}", c.placed, c.offered));
        let short =
            if p.unplaced_for_vfs > 0 { format!(" ({} short of VFs)", p.unplaced_for_vfs) } else { String::new() };
        let near = if p.vf_pods_placed == 0 { "-".to_string() } else { format!("{:.1}%", p.vf_near_gpu_share * 100.0) };
        t.add_row(vec![
            p.policy.clone(),
            format!("{}/{}{short}", p.placed, p.placed + p.unplaced),
            eight,
            format!("{:.1} / {:.1}", p.mean_ring_bandwidth_gbps, p.p10_ring_bandwidth_gbps),
            format!("{:.1} / {:.1}", p.mean_pair_bandwidth_gbps, p.p10_pair_bandwidth_gbps),
            format!("{:.1}%", p.all_nvlink_share * 100.0),
            near,
            format!("{:.1} ({:.1}% of free)", p.mean_stranded_gpus, p.stranded_share_of_free * 100.0),
            format!("{:.0} ms", p.run_ms),
        ]);
    }
    outln!("{t}")?;
    outln!()?;
    outln!("ring GB/s: what a ring all-reduce over each multi-GPU pod's GPUs gets, the slowest hop of the best")?;
    outln!("ring (per direction, estimated from link type and generation); mean and 10th percentile over pods.")?;
    outln!("pair GB/s: the mean over the set's GPU pairs instead, which hides a slow hop. VFs by their GPUs:")?;
    outln!("share of placed pods asking for VFs whose every VF shares a PCIe switch with one of their GPUs")?;
    outln!("(GPUDirect RDMA without the host bridge); short of VFs: pods not placed because no node with their")?;
    outln!("GPUs free had their VFs free. stranded: free GPUs whose NVLink peers are all busy, averaged over")?;
    outln!("arrivals.")?;
    Ok(())
}
