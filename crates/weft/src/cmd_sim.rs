//! `weft simulate`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use weft_alloc::ScoreConfig;
use weft_sim::{ClusterSpec, Generate, PlacementPolicy, SimReport, builtin_types, read_workload, simulate};

use crate::output::{Output, print_json, score_config, table};

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Cluster file (`kind: SimCluster`); default: the embedded cluster.
    #[arg(long, value_name = "FILE")]
    cluster: Option<PathBuf>,
    /// Workload file: a `kind: SimWorkload` generator or Pod manifests with `sim.weft.io/arrival`
    /// and `sim.weft.io/duration` annotations; default: a generated stream.
    #[arg(long, value_name = "FILE")]
    workload: Option<PathBuf>,
    /// Scale the cluster to this many nodes, keeping its mix of node types.
    #[arg(long, value_name = "N")]
    nodes: Option<usize>,
    /// Pods in the default generated stream.
    #[arg(long, default_value_t = 5000)]
    pods: usize,
    /// Seed of the generated stream and of the blind policy's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Policies to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_values = ["weft", "blind", "least-allocated"])]
    policies: Vec<PolicyArg>,
    /// Weight (0–1) of the remainder-quality term in weft's node score.
    #[arg(long, default_value_t = ScoreConfig::default().remainder_weight)]
    remainder_weight: f64,
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
        println!("{t}");
        return Ok(());
    }
    let spec = match &args.cluster {
        Some(p) => ClusterSpec::from_file(p).with_context(|| format!("reading cluster file {}", p.display()))?,
        None => ClusterSpec::embedded_default(),
    };
    let spec = match args.nodes {
        Some(0) => anyhow::bail!("--nodes must be at least 1"),
        Some(n) => spec.scaled(n),
        None => spec,
    };
    let base = args.cluster.as_deref().and_then(|p| p.parent());
    let cluster = spec.build(base).context("building the cluster")?;
    let pods = match &args.workload {
        Some(p) => read_workload(p).with_context(|| format!("reading workload {}", p.display()))?,
        None => Generate::default_for(cluster.total_gpus(), args.pods, args.seed).pods()?,
    };
    let policies: Vec<PlacementPolicy> = args.policies.iter().map(|&p| p.into()).collect();
    let score_config = score_config(args.remainder_weight)?;

    let bar = ProgressBar::new((pods.len() * policies.len()) as u64);
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:16} [{bar:30}] {pos}/{len} pod placements ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let n = pods.len();
    let report = simulate(&cluster, &pods, &policies, &score_config, args.seed, &mut |i, done| {
        bar.set_message(policies[i].name());
        bar.set_position((i * n + done) as u64);
    })?;
    bar.finish_and_clear();
    match args.output {
        Output::Json => print_json(&report),
        Output::Table => {
            print_report(&report);
            Ok(())
        }
    }
}

fn print_report(r: &SimReport) {
    let types: Vec<String> = r.cluster.node_types.iter().map(|(k, v)| format!("{v}× {k}")).collect();
    println!("cluster:  {} nodes, {} GPUs ({})", r.cluster.nodes, r.cluster.gpus, types.join(", "));
    let sizes: Vec<String> = r.workload.by_size.iter().map(|(k, v)| format!("{v}× {k}-GPU")).collect();
    println!(
        "workload: {} pods ({}), offered load {:.0}% of GPU capacity",
        r.workload.pods,
        sizes.join(", "),
        r.workload.offered_load * 100.0
    );
    println!();
    let mut t = table(&[
        "policy",
        "placed",
        "8-GPU placed",
        "mean pair GB/s",
        "p10 pair GB/s",
        "all-NVLink sets",
        "stranded free GPUs",
        "run time",
    ]);
    for p in &r.policies {
        let eight = p.by_size.get(&8).map_or("-".to_string(), |c| format!("{}/{}", c.placed, c.offered));
        t.add_row(vec![
            p.policy.clone(),
            format!("{}/{}", p.placed, p.placed + p.unplaced),
            eight,
            format!("{:.1}", p.mean_pair_bandwidth_gbps),
            format!("{:.1}", p.p10_pair_bandwidth_gbps),
            format!("{:.1}%", p.all_nvlink_share * 100.0),
            format!("{:.1} ({:.1}% of free)", p.mean_stranded_gpus, p.stranded_share_of_free * 100.0),
            format!("{:.0} ms", p.run_ms),
        ]);
    }
    println!("{t}");
    println!();
    println!("pair GB/s: mean bandwidth between the GPUs of each multi-GPU pod (per direction, estimated from");
    println!("link type and generation). stranded: free GPUs whose NVLink peers are all busy, averaged over arrivals.");
}
