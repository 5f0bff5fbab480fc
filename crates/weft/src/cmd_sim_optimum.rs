//! `weft simulate --optimum`: each policy's pods placed beside a proven upper bound on what any
//! placement could have placed (`weft_sim::optimum`), over a few generated instances.

use std::time::Duration;

use anyhow::Context;
use weft_alloc::ScoreConfig;
use weft_sim::optimum::{InstanceReport, OptimumOptions, compare};
use weft_sim::{Cluster, Generate, PlacementPolicy, SimPod};

use crate::output::{Output, count, print_json, report_table, wrap};

/// What the optimum run needs from `weft simulate`'s flags.
pub struct OptimumRun<'a> {
    pub cluster: &'a Cluster,
    /// A workload file's pods (one instance), or None for generated streams.
    pub workload: Option<Vec<SimPod>>,
    pub pods: usize,
    pub seed: u64,
    pub instances: usize,
    pub time_limit: Duration,
    pub policies: Vec<PlacementPolicy>,
    pub score_config: ScoreConfig,
    pub output: Output,
}

pub fn run(r: OptimumRun<'_>) -> anyhow::Result<()> {
    if r.instances == 0 {
        anyhow::bail!("--instances must be at least 1");
    }
    if r.workload.is_some() && r.instances > 1 {
        anyhow::bail!("--instances applies to generated streams; a --workload file is one instance");
    }
    let options = OptimumOptions { time_limit: r.time_limit };
    let mut reports = Vec::with_capacity(r.instances);
    for i in 0..r.instances {
        let seed = r.seed.wrapping_add(i as u64);
        let pods = match &r.workload {
            Some(p) => p.clone(),
            None => Generate::default_for(r.cluster.total_gpus(), r.pods, seed).pods()?,
        };
        let report = compare(r.cluster, &pods, &r.policies, &r.score_config, seed, &options)
            .with_context(|| format!("instance {} (seed {seed})", i + 1))?;
        reports.push(report);
    }
    match r.output {
        Output::Json => print_json(&reports),
        Output::Table => print_table(&reports),
    }
}

fn percent(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn print_table(reports: &[InstanceReport]) -> anyhow::Result<()> {
    let Some(first) = reports.first() else { return Ok(()) };
    let legend = format!(
        "cluster: {} nodes, {} GPUs; bound: an upper bound on the pods any placement of the stream places \
         (optimal: the offline optimum; MIP bound: the search's proven bound at the time limit; LP bound: the \
         linear relaxation's); best found: the solver's or a best-fit offline placement; optimum ≥: that or the \
         most any policy placed; per policy: pods placed (gap), gap = (bound - placed) / bound, at least the \
         true gap to the optimum",
        count(first.nodes),
        count(first.gpus)
    );
    outln!("{}", wrap(&legend, 0))?;
    let mut header = vec![
        "seed".to_string(),
        "pods\n(VF)".into(),
        "bound".into(),
        "kind".into(),
        "best\nfound".into(),
        "optimum\n≥".into(),
    ];
    header.extend(first.policies.iter().map(|p| policy_header(&p.policy)));
    header.push("solve\ns".into());
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let right: Vec<usize> = (0..header.len()).filter(|&c| c != 3).collect();
    let mut t = report_table(&header, &right);
    let mut gap_sums = vec![0.0; first.policies.len()];
    for r in reports {
        let mut row = vec![
            r.seed.to_string(),
            format!("{} ({})", count(r.bound.pods), count(r.vf_pods)),
            count(r.bound.bound),
            r.bound.kind.name().to_string(),
            r.bound.best_found.map_or("-".to_string(), count),
            count(r.optimum_at_least),
        ];
        for (i, p) in r.policies.iter().enumerate() {
            row.push(format!("{} ({})", count(p.placed), percent(p.gap)));
            gap_sums[i] += p.gap;
        }
        row.push(format!("{:.1}", r.bound.solve_ms / 1000.0));
        t.add_row(row);
    }
    outln!("{t}")?;
    let means: Vec<String> = first
        .policies
        .iter()
        .zip(&gap_sums)
        .map(|(p, s)| format!("{} {}", p.policy, percent(s / reports.len() as f64)))
        .collect();
    outln!("{}", wrap(&format!("mean gap over {} instances: {}", reports.len(), means.join(", ")), 4))?;
    for r in reports {
        if let Some(note) = &r.bound.note {
            outln!("{}", wrap(&format!("seed {}: {note}", r.seed), 4))?;
        }
    }
    print_ring_table(reports)
}

/// A policy's column header: `least-allocated` takes two lines.
fn policy_header(policy: &str) -> String {
    policy.replacen('-', "-\n", 1)
}

/// Each policy's mean bottleneck ring bandwidth beside the bound on it at the pods it placed.
fn print_ring_table(reports: &[InstanceReport]) -> anyhow::Result<()> {
    let Some(first) = reports.first() else { return Ok(()) };
    outln!()?;
    let legend = "bottleneck ring, per policy: its mean over placed multi-GPU pods (GB/s) / the bound on that mean \
                  over every placement of at least as many pods (a linear relaxation over node types, each pod \
                  counted at the best set of its size), and the gap (bound - mean) / bound";
    outln!("{}", wrap(legend, 0))?;
    let mut header = vec!["seed".to_string()];
    header.extend(first.policies.iter().map(|p| policy_header(&p.policy)));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let right: Vec<usize> = (0..header.len()).collect();
    let mut t = report_table(&header, &right);
    let mut sums = vec![(0.0, 0usize); first.policies.len()];
    for r in reports {
        let mut row = vec![r.seed.to_string()];
        for (i, p) in r.policies.iter().enumerate() {
            row.push(match (p.ring_bound_gbps, p.ring_gap) {
                (Some(b), Some(g)) => {
                    sums[i].0 += g;
                    sums[i].1 += 1;
                    format!("{:.0} / {:.0} ({})", p.mean_ring_gbps, b, percent(g))
                }
                _ => "-".to_string(),
            });
        }
        t.add_row(row);
    }
    outln!("{t}")?;
    let means: Vec<String> = first
        .policies
        .iter()
        .zip(&sums)
        .filter(|(_, (_, n))| *n > 0)
        .map(|(p, (s, n))| format!("{} {}", p.policy, percent(s / *n as f64)))
        .collect();
    outln!("{}", wrap(&format!("mean bottleneck gap over {} instances: {}", reports.len(), means.join(", ")), 4))?;
    Ok(())
}
