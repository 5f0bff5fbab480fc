//! `weft simulate --matrix FILE`: the scenario matrix (weft_sim::matrix) as a table or JSON.

use std::path::Path;

use anyhow::Context;
use weft_alloc::ScoreConfig;
use weft_sim::matrix::{
    CellReport, CellVerdict, Check, Gate, MatrixOptions, MatrixReport, Measure, Metrics, Outcome, read_matrix,
    run_matrix,
};

use crate::output::{Output, count, count_f, print_json, report_table, wrap};

/// Run the matrix and print it. Ends the process with exit status 1 (after printing) when a cell's
/// gate fails (`gate: true`: weft lost there; `gate: strict`: lost or tied).
pub fn run(file: &Path, small_only: bool, score_config: ScoreConfig, output: Output) -> anyhow::Result<()> {
    let spec = read_matrix(file).with_context(|| format!("reading matrix {}", file.display()))?;
    let report = run_matrix(&spec, &MatrixOptions { small_only, threads: 0, score_config })?;
    match output {
        Output::Json => print_json(&report)?,
        Output::Table => print_matrix(&report)?,
    }
    if !report.gate_failed.is_empty() {
        crate::component::note(format_args!(
            "error: the gate fails on cells: {} (see each cell's verdict)",
            report.gate_failed.join(", ")
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
    let legend = format!(
        "bottleneck GB/s: {}; p10 and mean over pods. pair GB/s: the mean over the set's GPU pairs \
         instead, which hides a slow hop. stranded: free GPUs whose NVLink peers are all busy, averaged over \
         arrivals. Several seeds: mean (worst seed). verdict, against each baseline on every seed: placed and \
         8-GPU placed ≥; p10 and mean bottleneck higher (n/a without multi-GPU pods), stranded fewer: equal \
         there is a tie, not a win.",
        r.bandwidth_measure
    );
    outln!("{}", wrap(&legend, 0))?;
    outln!()?;
    let failed = |n: &String| if r.gate_failed.contains(n) { format!("{n} (gate failed)") } else { n.clone() };
    let list = |names: &[String]| names.iter().map(failed).collect::<Vec<_>>().join(", ");
    let wins = r.cells.len() - r.losing.len() - r.tying.len();
    outln!("matrix: {} cells; weft wins {wins}, ties {}, loses {}", r.cells.len(), r.tying.len(), r.losing.len())?;
    if !r.losing.is_empty() {
        outln!("{}", wrap(&format!("loses: {}", list(&r.losing)), 7))?;
    }
    if !r.tying.is_empty() {
        outln!("{}", wrap(&format!("ties:  {}", list(&r.tying)), 7))?;
    }
    Ok(())
}

/// `p10 bottleneck not > blind on seeds 1,3`, or `= blind` for a tie (seeds only when the cell has
/// several).
fn describe(k: &Check, seeds: &[u64], several: bool, tie: bool) -> String {
    let rule = match (k.measure, tie) {
        (Measure::Placed | Measure::EightGpuPlaced, _) => "not ≥",
        (_, true) => "=",
        (Measure::Stranded, _) => "not <",
        _ => "not >",
    };
    let on = if several {
        format!(" on seeds {}", seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(","))
    } else {
        String::new()
    };
    format!("{} {rule} {}{on}", k.measure.name(), k.baseline)
}

fn print_cell(c: &CellReport) -> anyhow::Result<()> {
    let s = &c.spec.stream;
    let seeds = if s.seeds == 1 { "seed 1".to_string() } else { format!("seeds 1-{}", s.seeds) };
    let sizes: Vec<String> = c.by_size.iter().map(|(k, v)| format!("{}× {k}-GPU", count(*v))).collect();
    let mut flags = Vec::new();
    if c.spec.small {
        flags.push("small");
    }
    match c.spec.gate {
        Gate::Off => {}
        Gate::Losses => flags.push("gate"),
        Gate::Strict => flags.push("strict gate"),
    }
    let flags = if flags.is_empty() { String::new() } else { format!(" [{}]", flags.join(", ")) };
    outln!("cell {}{flags}", c.name)?;
    let mix = if c.mix_description.is_empty() { String::new() } else { format!(": {}", c.mix_description) };
    let cluster = format!(
        "  cluster: {} nodes, {} GPUs, {} VFs, mix {}{mix}",
        count(c.nodes),
        count(c.gpus),
        count(c.vfs),
        c.spec.cluster.mix
    );
    outln!("{}", wrap(&cluster, 11))?;
    let stream = format!(
        "  stream:  {} pods per seed ({}), {:.0}% asking one VF, {seeds}",
        count(s.pods),
        sizes.join(", "),
        s.vf_share * 100.0
    );
    outln!("{}", wrap(&stream, 11))?;
    let several = s.seeds > 1;
    let cell = |mean: f64, worst: f64, digits: usize| {
        if several { format!("{} ({})", count_f(mean, digits), count_f(worst, digits)) } else { count_f(mean, digits) }
    };
    let mut t = report_table(
        &[
            "policy",
            "placed",
            "8-GPU\nplaced",
            "bottleneck\np10 GB/s",
            "bottleneck\nmean GB/s",
            "mean pair\nGB/s",
            "stranded\nGPUs",
        ],
        &[1, 2, 3, 4, 5, 6],
    );
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
        .map(|k| describe(k, &k.lost_seeds, several, false))
        .collect();
    let tied: Vec<String> = c
        .checks
        .iter()
        .filter(|k| !k.tied_seeds.is_empty())
        .map(|k| describe(k, &k.tied_seeds, several, true))
        .collect();
    let failed = if c.gate_failed { " (gate failed)" } else { "" };
    let verdict = match c.verdict {
        CellVerdict::Wins => "weft wins".to_string(),
        CellVerdict::Ties => format!("weft ties{failed}: {}", tied.join("; ")),
        CellVerdict::Loses if tied.is_empty() => format!("weft LOSES{failed}: {}", lost.join("; ")),
        CellVerdict::Loses => format!("weft LOSES{failed}: {}; ties: {}", lost.join("; "), tied.join("; ")),
    };
    outln!("{}", wrap(&format!("  verdict for {}: {verdict}", c.name), 4))?;
    Ok(())
}
