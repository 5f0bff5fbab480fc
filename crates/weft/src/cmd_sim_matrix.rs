//! `weft simulate --matrix FILE`: the scenario matrix (weft_sim::matrix) as a table or JSON.

use std::path::Path;

use anyhow::Context;
use weft_alloc::ScoreConfig;
use weft_sim::matrix::{CellReport, MatrixOptions, MatrixReport, Measure, Metrics, Outcome, read_matrix, run_matrix};

use crate::output::{Output, print_json, table};

/// Run the matrix and print it. Ends the process with exit status 1 (after printing) when a cell
/// marked `gate: true` loses.
pub fn run(file: &Path, small_only: bool, score_config: ScoreConfig, output: Output) -> anyhow::Result<()> {
    let spec = read_matrix(file).with_context(|| format!("reading matrix {}", file.display()))?;
    let report = run_matrix(&spec, &MatrixOptions { small_only, threads: 0, score_config })?;
    match output {
        Output::Json => print_json(&report)?,
        Output::Table => print_matrix(&report)?,
    }
    if !report.gated_losing.is_empty() {
        crate::component::note(format_args!(
            "error: weft loses on gated cells: {} (see each cell's verdict)",
            report.gated_losing.join(", ")
        ));
        std::process::exit(1);
    }
    Ok(())
}

fn print_matrix(r: &MatrixReport) -> anyhow::Result<()> {
    for (i, c) in r.cells.iter().enumerate() {
        if i > 0 {
            outln!()?;
        }
        print_cell(c)?;
    }
    outln!()?;
    outln!("bottleneck GB/s: {}; p10 and mean over pods.", r.bandwidth_measure)?;
    outln!("pair GB/s: the mean over the set's GPU pairs instead, which hides a slow hop. stranded: free GPUs")?;
    outln!("whose NVLink peers are all busy, averaged over arrivals. Several seeds: mean (worst seed).")?;
    outln!("verdict, against each baseline on every seed: placed and 8-GPU placed ≥; p10 and mean bottleneck >")?;
    outln!("(n/a without multi-GPU pods); stranded < (or both 0).")?;
    outln!()?;
    let gated = |n: &String| if r.gated_losing.contains(n) { format!("{n} (gated)") } else { n.clone() };
    if r.losing.is_empty() {
        outln!("matrix: weft wins on all {} cells", r.cells.len())?;
    } else {
        outln!(
            "matrix: weft loses on {} of {} cells: {}",
            r.losing.len(),
            r.cells.len(),
            r.losing.iter().map(gated).collect::<Vec<_>>().join(", ")
        )?;
    }
    Ok(())
}

fn print_cell(c: &CellReport) -> anyhow::Result<()> {
    let s = &c.spec.stream;
    let seeds = if s.seeds == 1 { "seed 1".to_string() } else { format!("seeds 1-{}", s.seeds) };
    let sizes: Vec<String> = c.by_size.iter().map(|(k, v)| format!("{v}× {k}-GPU")).collect();
    let flags = match (c.spec.small, c.spec.gate) {
        (true, true) => " [small, gate]",
        (true, false) => " [small]",
        (false, true) => " [gate]",
        (false, false) => "",
    };
    outln!("cell {}{flags}", c.name)?;
    let mix = if c.mix_description.is_empty() { String::new() } else { format!(": {}", c.mix_description) };
    outln!("  cluster: {} nodes, {} GPUs, {} VFs, mix {}{mix}", c.nodes, c.gpus, c.vfs, c.spec.cluster.mix)?;
    outln!(
        "  stream:  {} pods per seed ({}), {:.0}% asking one VF, {seeds}",
        s.pods,
        sizes.join(", "),
        s.vf_share * 100.0
    )?;
    let several = s.seeds > 1;
    let cell = |mean: f64, worst: f64, digits: usize| {
        if several { format!("{mean:.digits$} ({worst:.digits$})") } else { format!("{mean:.digits$}") }
    };
    let mut t = table(&[
        "policy",
        "placed",
        "8-GPU placed",
        "p10 bottleneck GB/s",
        "mean bottleneck GB/s",
        "mean pair GB/s",
        "stranded GPUs",
    ]);
    let digits = if several { 1 } else { 0 };
    for p in &c.policies {
        let (m, w): (&Metrics, &Metrics) = (&p.mean, &p.worst);
        t.add_row(vec![
            p.policy.clone(),
            cell(m.placed, w.placed, digits),
            cell(m.eight_gpu_placed, w.eight_gpu_placed, digits),
            cell(m.p10_bottleneck_gbps, w.p10_bottleneck_gbps, 1),
            cell(m.mean_bottleneck_gbps, w.mean_bottleneck_gbps, 1),
            cell(m.mean_pair_gbps, w.mean_pair_gbps, 1),
            cell(m.stranded_gpus, w.stranded_gpus, 1),
        ]);
    }
    outln!("{t}")?;
    let lost: Vec<String> = c
        .checks
        .iter()
        .filter(|k| k.outcome == Outcome::Lose)
        .map(|k| {
            let rule = match k.measure {
                Measure::Placed | Measure::EightGpuPlaced => "not ≥",
                Measure::P10Bottleneck | Measure::MeanBottleneck => "not >",
                Measure::Stranded => "not <",
            };
            let on = if several {
                format!(" on seeds {}", k.lost_seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(","))
            } else {
                String::new()
            };
            format!("{} {rule} {}{on}", k.measure.name(), k.baseline)
        })
        .collect();
    if lost.is_empty() {
        outln!("  verdict: weft wins")?;
    } else {
        outln!("  verdict: weft LOSES: {}", lost.join("; "))?;
    }
    Ok(())
}
