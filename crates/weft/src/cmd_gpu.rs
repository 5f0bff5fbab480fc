//! `weft gpu allocate` and `weft gpu score`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use weft_alloc::{Optimality, Policy, PreparedNode, Request, ScoreConfig, StaticTable, allocate, score_node};

use crate::output::{GpuList, Output, parse_gpu_list, parse_gpu_list_arg, print_json, score_config, table};

#[derive(Subcommand, Debug)]
pub enum GpuCommand {
    /// Choose K GPUs on one node.
    ///
    /// best-effort (default) maximises go-gpuallocator's objective exactly: the total link score of
    /// packing all free GPUs into groups of K, then the best group holding the required GPUs.
    /// A 1-GPU request takes the free GPU whose loss hurts the others least.
    ///
    /// Example: weft gpu allocate --topology dgx1.txt --count 2 --available 0,2,4,5
    Allocate(AllocateArgs),
    /// Score nodes 0–100 for a pod asking for K GPUs, as the scheduler extender does.
    ///
    /// Each NODE is a topology file (or `builtin:NAME`, or `-` for standard input), optionally
    /// followed by `@` and the GPUs already in use: `dgx1.txt@0,3`, `builtin:dgx-a100@0-3`. Nodes that cannot fit K GPUs are listed as filtered, with the reason.
    Score(ScoreArgs),
}

#[derive(Args, Debug)]
pub struct AllocateArgs {
    /// Node topology: `nvidia-smi topo -m` text or inventory JSON/YAML (detected); `-` reads
    /// standard input, `builtin:NAME` is an embedded node type.
    #[arg(long, short, value_name = "FILE|-|builtin:NAME")]
    topology: PathBuf,
    /// Number of GPUs (at least 1).
    #[arg(long, short = 'k', allow_negative_numbers = true, value_parser = gpu_count)]
    count: usize,
    /// Free GPUs (default: all). Order breaks ties, as in go-gpuallocator.
    #[arg(long, value_parser = parse_gpu_list_arg, value_name = "LIST")]
    available: Option<GpuList>,
    /// GPUs that must be in the set.
    #[arg(long, value_parser = parse_gpu_list_arg, value_name = "LIST")]
    required: Option<GpuList>,
    /// Policy: best-effort, simple, static:<table> (built-in: dgx1-pascal, dgx1-volta, dgx2-volta,
    /// hgx-8gpu) or static:<file> (JSON/YAML partition table).
    #[arg(long, default_value = "best-effort")]
    policy: String,
    /// Output format; `svg` draws the node with the chosen GPUs and the NICs on their PCIe
    /// switches marked (`weft topo show -o svg --highlight` with the chosen set).
    #[arg(long, short, value_enum, default_value_t)]
    output: AllocateOutput,
}

/// `weft gpu allocate -o`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
enum AllocateOutput {
    /// Human-readable.
    #[default]
    Table,
    /// JSON.
    Json,
    /// An SVG drawing of the node with the chosen set marked.
    Svg,
}

#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// GPUs the pod asks for (at least 1).
    #[arg(long, short = 'k', allow_negative_numbers = true, value_parser = gpu_count)]
    count: usize,
    /// Nodes: FILE or FILE@USED-GPUS (FILE may be `-` or `builtin:NAME`).
    #[arg(required = true, value_name = "NODE")]
    nodes: Vec<String>,
    /// Weight (0–1) of the remainder-quality term.
    #[arg(long, default_value_t = ScoreConfig::default().remainder_weight)]
    remainder_weight: f64,
    /// What the score's affinity term measures of a GPU set: `ring` (the slowest hop of its best
    /// ring) or `pair-score` (go-gpuallocator's mean pair score).
    #[arg(long, value_enum, default_value_t = crate::output::SetQualityArg::Ring)]
    set_quality: crate::output::SetQualityArg,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: Output,
}

/// A GPU count: a whole number of at least 1.
fn gpu_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 1 => usize::try_from(n).map_err(|_| format!("{n} GPUs is more than any node has")),
        Ok(n) => Err(format!("a pod asks for at least 1 GPU, not {n}")),
        Err(_) => Err(format!("'{s}' is not a whole number of GPUs")),
    }
}

pub fn run(cmd: GpuCommand) -> anyhow::Result<()> {
    match cmd {
        GpuCommand::Allocate(a) => allocate_cmd(a),
        GpuCommand::Score(s) => score_cmd(s),
    }
}

fn parse_policy(s: &str) -> anyhow::Result<Policy> {
    match s {
        "best-effort" => Ok(Policy::BestEffort),
        "simple" => Ok(Policy::Simple),
        _ => {
            let Some(name) = s.strip_prefix("static:") else {
                anyhow::bail!("unknown policy '{s}'; use best-effort, simple, static:<table> or static:<file>");
            };
            if let Some(t) = StaticTable::builtin(name) {
                return Ok(Policy::Static(t));
            }
            let text = std::fs::read_to_string(name).with_context(|| {
                format!(
                    "'{name}' is neither a built-in static table ({}) nor a readable file",
                    StaticTable::builtin_names().join(", ")
                )
            })?;
            Ok(Policy::Static(StaticTable::parse(&text).with_context(|| format!("reading static table {name}"))?))
        }
    }
}

fn allocate_cmd(a: AllocateArgs) -> anyhow::Result<()> {
    let node = crate::cmd_topo::read_topology(&a.topology)?;
    let prepared = PreparedNode::new(&node)?;
    let policy = parse_policy(&a.policy)?;
    if let Policy::Static(t) = &policy {
        t.validate_for(&prepared)?;
    }
    let available = a.available.map_or_else(|| (0..node.gpu_count()).collect(), |l| l.0);
    let required = a.required.unwrap_or_default().0;
    let alloc = allocate(&prepared, &policy, &Request { count: a.count, available: &available, required: &required })
        .with_context(|| format!("allocating {} GPUs on {}", a.count, a.topology.display()))?;
    let mean_bw = node.mean_pair_bandwidth_gbps(&alloc.gpus);
    match a.output {
        AllocateOutput::Svg => {
            let set = crate::cmd_topo::highlighted(&node, "allocate", "chosen", alloc.gpus.clone())?;
            out!("{}", weft_topology::render::to_svg_with(&node, &set))?;
            Ok(())
        }
        AllocateOutput::Json => print_json(&serde_json::json!({
            "node": node.name,
            "policy": policy.name(),
            "gpus": alloc.gpus,
            "setScore": alloc.set_score,
            "objective": alloc.objective,
            "optimality": alloc.optimality,
            "meanPairBandwidthGbps": mean_bw,
        })),
        AllocateOutput::Table => {
            let list: Vec<String> = alloc.gpus.iter().map(|g| format!("GPU{g}")).collect();
            outln!("GPUs:        {}", list.join(" "))?;
            outln!("set score:   {} (sum of go-gpuallocator pair scores)", alloc.set_score)?;
            outln!("mean pair:   {mean_bw:.1} GB/s per direction")?;
            match alloc.optimality {
                Optimality::Exact => outln!("objective:   {} (exact optimum)", alloc.objective)?,
                Optimality::Heuristic { objective, upper_bound } => outln!(
                    "objective:   {objective} (heuristic; optimum ≤ {upper_bound}, gap ≤ {:.2}%)",
                    alloc.optimality.gap() * 100.0
                )?,
                Optimality::NotApplicable => {}
            }
            Ok(())
        }
    }
}

fn score_cmd(s: ScoreArgs) -> anyhow::Result<()> {
    let cfg = score_config(s.remainder_weight, s.set_quality)?;
    let mut rows = Vec::new();
    for spec in &s.nodes {
        let (path, used) = match spec.rsplit_once('@') {
            Some((p, u)) => (p, parse_gpu_list(u).map_err(|e| anyhow::anyhow!("node '{spec}': {e}"))?),
            None => (spec.as_str(), Vec::new()),
        };
        let node = crate::cmd_topo::read_topology(path.as_ref())?;
        let prepared = PreparedNode::new(&node)?;
        if let Some(bad) = used.iter().find(|&&g| g >= node.gpu_count()) {
            anyhow::bail!("node '{spec}': GPU{bad} is in use but the node has {} GPUs", node.gpu_count());
        }
        let free: Vec<usize> = (0..node.gpu_count()).filter(|g| !used.contains(g)).collect();
        let name = node.name.clone().unwrap_or_else(|| path.to_string());
        let row = match score_node(&prepared, &free, s.count, &cfg) {
            Ok(fit) => {
                serde_json::json!({"node": name, "fits": true, "score": fit.score, "gpus": fit.gpus, "setScore": fit.set_score})
            }
            Err(e) => serde_json::json!({"node": name, "fits": false, "score": 0, "reason": e.to_string()}),
        };
        rows.push(row);
    }
    rows.sort_by(|a, b| b["score"].as_u64().cmp(&a["score"].as_u64()));
    match s.output {
        Output::Json => print_json(&rows),
        Output::Table => {
            let mut t = table(&["node", "score", "GPUs", "set score / reason"]);
            for r in &rows {
                let gpus = r["gpus"]
                    .as_array()
                    .map_or(String::new(), |g| g.iter().map(|x| format!("GPU{x}")).collect::<Vec<_>>().join(" "));
                let last = if r["fits"] == true {
                    r["setScore"].to_string()
                } else {
                    r["reason"].as_str().unwrap_or("").to_string()
                };
                t.add_row(vec![r["node"].as_str().unwrap_or("").to_string(), r["score"].to_string(), gpus, last]);
            }
            outln!("{t}")?;
            Ok(())
        }
    }
}
