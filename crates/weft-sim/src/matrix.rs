//! The scenario matrix (`weft simulate --matrix FILE`): many cells, each a cluster and a generated
//! pod stream over one or more seeds, every policy run on each, and a verdict per cell saying whether
//! weft beat each baseline by the rule in [`judge`].
//!
//! ```yaml
//! apiVersion: weft.io/v1alpha1
//! kind: SimMatrix
//! clusters:                       # named node-type mixes; `default` is the embedded cluster
//!   nic-dense:
//!     description: more of the node types with many NICs
//!     nodeTypes:
//!       - {name: dgx-a100, topology: builtin:dgx-a100, count: 20}
//! cells:
//!   - name: default
//!     cluster: {mix: default}                     # nodes: N scales the mix to N nodes
//!     stream: {pods: 5000, seeds: 1, vfShare: 0.5} # sizes: {8: 1} for an all-8-GPU stream
//!     small: true                                 # cheap enough for CI (`--small-only`)
//!     gate: false                                 # true: a loss fails the command; strict: a tie too
//! ```
//!
//! A cell's stream is [`Generate::default_for`] with its pods, seed and VF share, and its size mix
//! when it gives one; the arrival rate is set so the stream offers [`Generate::DEFAULT_LOAD`] of the
//! cluster's GPUs in expectation whatever the mix. Seeds are 1..=`seeds`; the seed drives both the
//! stream and the blind policy's draws, as in `weft simulate --seed`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;
use weft_alloc::ScoreConfig;

use crate::cluster::{Cluster, ClusterSpec, NodeTypeSpec};
use crate::engine::{PlacementPolicy, PolicyReport, run_policy};
use crate::workload::Generate;
use crate::{SimError, builtin_types};

/// The name of the embedded default cluster in a matrix file.
pub const DEFAULT_MIX: &str = "default";
/// Most seeds one cell may run.
pub const MAX_SEEDS: u64 = 1000;

/// A matrix file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MatrixSpec {
    /// `weft.io/v1alpha1`.
    pub api_version: String,
    /// `SimMatrix`.
    pub kind: String,
    /// Named node-type mixes the cells use (besides `default`, the embedded cluster).
    #[serde(default)]
    pub clusters: BTreeMap<String, MixSpec>,
    /// The cells, run in this order.
    pub cells: Vec<CellSpec>,
}

/// A named cluster mix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MixSpec {
    /// What the mix is for (printed with its cells).
    #[serde(default)]
    pub description: String,
    /// Node types as in a `SimCluster` file (built-in topologies only: a matrix file has no
    /// directory of topology files of its own).
    pub node_types: Vec<NodeTypeSpec>,
}

/// One cell: a cluster and a stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CellSpec {
    /// Unique name.
    pub name: String,
    /// The cluster.
    pub cluster: CellCluster,
    /// The pod stream.
    pub stream: CellStream,
    /// Cheap enough for CI's smoke run (`--small-only`).
    #[serde(default)]
    pub small: bool,
    /// Whether this cell's verdict can fail the command (exit status 1).
    #[serde(default)]
    pub gate: Gate,
}

/// What fails a cell's gate: `false` (nothing, the default), `true` (a loss), `strict` (a loss or a
/// tie: weft not strictly better on a bandwidth or stranded measure).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "GateRepr", into = "GateRepr")]
pub enum Gate {
    /// Reported only.
    #[default]
    Off,
    /// A loss fails.
    Losses,
    /// A loss or a tie fails.
    Strict,
}

/// How a gate is written: a boolean or `strict`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum GateRepr {
    Bool(bool),
    Word(String),
}

impl TryFrom<GateRepr> for Gate {
    type Error = String;
    fn try_from(r: GateRepr) -> Result<Gate, String> {
        match r {
            GateRepr::Bool(false) => Ok(Gate::Off),
            GateRepr::Bool(true) => Ok(Gate::Losses),
            GateRepr::Word(w) if w == "strict" => Ok(Gate::Strict),
            GateRepr::Word(w) => Err(format!("gate: '{w}' is not true, false or strict")),
        }
    }
}

impl From<Gate> for GateRepr {
    fn from(g: Gate) -> GateRepr {
        match g {
            Gate::Off => GateRepr::Bool(false),
            Gate::Losses => GateRepr::Bool(true),
            Gate::Strict => GateRepr::Word("strict".into()),
        }
    }
}

impl Gate {
    /// Whether a cell with this verdict fails the gate.
    pub fn fails(self, verdict: CellVerdict) -> bool {
        match self {
            Gate::Off => false,
            Gate::Losses => verdict == CellVerdict::Loses,
            Gate::Strict => verdict != CellVerdict::Wins,
        }
    }
}

/// A cell's cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CellCluster {
    /// `default` (the embedded cluster) or a name from `clusters`.
    #[serde(default = "default_mix")]
    pub mix: String,
    /// Scale the mix to this many nodes, keeping its shares of node types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<usize>,
}

fn default_mix() -> String {
    DEFAULT_MIX.to_string()
}

/// A cell's pod stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CellStream {
    /// Pods per seed.
    pub pods: usize,
    /// Run seeds 1..=seeds.
    #[serde(default = "one")]
    pub seeds: u64,
    /// Share (0–1) of pods asking for one VF of `fabric`.
    #[serde(default = "default_vf_share")]
    pub vf_share: f64,
    /// Share of each pod size (normalised); default the 1/2/4/8 mix of [`Generate::default_for`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizes: Option<BTreeMap<usize, f64>>,
}

fn one() -> u64 {
    1
}

fn default_vf_share() -> f64 {
    Generate::DEFAULT_VF_SHARE
}

/// Only the cells' names and where each starts, read leniently, so a parse error can name the cell
/// it is in.
#[derive(Deserialize)]
struct NamesOnly {
    #[serde(default)]
    cells: Vec<Spanned<NameOnly>>,
}

#[derive(Deserialize)]
struct NameOnly {
    #[serde(default)]
    name: Option<String>,
}

/// `cells[i] ('name'): ` for the cell a parse error at `at` lies in (the last cell starting before it).
fn cell_of_error(text: &str, at: Option<serde_saphyr::Location>) -> String {
    let (Some(at), Ok(names)) = (at, serde_saphyr::from_str::<NamesOnly>(text)) else { return String::new() };
    let pos = |l: &serde_saphyr::Location| (l.line(), l.column());
    let Some(i) = names.cells.iter().rposition(|c| pos(&c.defined) <= pos(&at)) else { return String::new() };
    match &names.cells[i].value.name {
        Some(n) => format!("cells[{i}] ('{n}'): "),
        None => format!("cells[{i}]: "),
    }
}

/// Read and check a matrix file.
pub fn read_matrix(path: &Path) -> Result<MatrixSpec, SimError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| SimError::Io { path: path.display().to_string(), source })?;
    parse_matrix(&text, &path.display().to_string())
}

/// Parse and check matrix text (see [`read_matrix`]): every error names the cell (index and name)
/// or the cluster mix and the field.
pub fn parse_matrix(text: &str, source_name: &str) -> Result<MatrixSpec, SimError> {
    let fmt = |message: String| SimError::Format { source_name: source_name.to_string(), message };
    let spec: MatrixSpec = serde_saphyr::from_str(text).map_err(|e| {
        let cell = cell_of_error(text, e.location());
        fmt(format!("{cell}{e}"))
    })?;
    if spec.api_version != crate::API_VERSION || spec.kind != "SimMatrix" {
        return Err(fmt(format!(
            "expected apiVersion {} kind SimMatrix, found {} {}",
            crate::API_VERSION,
            spec.api_version,
            spec.kind
        )));
    }
    check(&spec).map_err(fmt)?;
    Ok(spec)
}

/// The checks serde cannot make; the message names the cell or mix and the field.
fn check(spec: &MatrixSpec) -> Result<(), String> {
    let builtins: BTreeSet<&str> = builtin_types().into_iter().map(|(n, _)| n).collect();
    if spec.clusters.contains_key(DEFAULT_MIX) {
        return Err(format!("clusters.{DEFAULT_MIX}: '{DEFAULT_MIX}' is the embedded cluster; name the mix otherwise"));
    }
    for (name, mix) in &spec.clusters {
        if mix.node_types.iter().map(|t| t.count).sum::<usize>() == 0 {
            return Err(format!("clusters.{name}.nodeTypes: the mix has no nodes"));
        }
        for (i, t) in mix.node_types.iter().enumerate() {
            let known = t.topology.strip_prefix("builtin:").is_some_and(|b| builtins.contains(b));
            if !known {
                return Err(format!(
                    "clusters.{name}.nodeTypes[{i}] ('{}').topology: '{}' is not a built-in node type; use \
                     builtin:<type>, one of {}",
                    t.name,
                    t.topology,
                    builtins.iter().copied().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    if spec.cells.is_empty() {
        return Err("cells: the matrix has no cells".into());
    }
    let mut names = BTreeSet::new();
    for (i, c) in spec.cells.iter().enumerate() {
        let at = format!("cells[{i}] ('{}')", c.name);
        if c.name.trim().is_empty() {
            return Err(format!("cells[{i}].name: a cell needs a name"));
        }
        if !names.insert(c.name.as_str()) {
            return Err(format!("{at}.name: another cell has this name"));
        }
        if c.cluster.mix != DEFAULT_MIX && !spec.clusters.contains_key(&c.cluster.mix) {
            return Err(format!(
                "{at}.cluster.mix: '{}' is neither '{DEFAULT_MIX}' nor a mix under clusters ({})",
                c.cluster.mix,
                spec.clusters.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        match c.cluster.nodes {
            Some(0) => return Err(format!("{at}.cluster.nodes: a cluster needs at least 1 node")),
            Some(n) if n > crate::MAX_NODES => {
                return Err(format!(
                    "{at}.cluster.nodes: {n} is more than the simulator takes (at most {})",
                    crate::MAX_NODES
                ));
            }
            _ => {}
        }
        let s = &c.stream;
        if s.pods == 0 || s.pods > crate::MAX_PODS {
            return Err(format!("{at}.stream.pods: {} is not between 1 and {}", s.pods, crate::MAX_PODS));
        }
        if s.seeds == 0 || s.seeds > MAX_SEEDS {
            return Err(format!("{at}.stream.seeds: {} is not between 1 and {MAX_SEEDS}", s.seeds));
        }
        if !(0.0..=1.0).contains(&s.vf_share) {
            return Err(format!("{at}.stream.vfShare: {} is not a share between 0 and 1", s.vf_share));
        }
        if let Some(sizes) = &s.sizes {
            let total: f64 = sizes.values().sum();
            if sizes.is_empty()
                || !(total.is_finite() && total > 0.0)
                || sizes.values().any(|p| !p.is_finite() || *p < 0.0)
            {
                return Err(format!(
                    "{at}.stream.sizes: give at least one size with a positive share, no negative shares"
                ));
            }
            if sizes.contains_key(&0) {
                return Err(format!("{at}.stream.sizes: a pod of 0 GPUs is not a GPU pod"));
            }
        }
    }
    Ok(())
}

impl MatrixSpec {
    /// The cluster spec of a cell (its mix, scaled when it says `nodes`).
    pub fn cluster_spec(&self, cell: &CellSpec) -> ClusterSpec {
        let spec = match self.clusters.get(&cell.cluster.mix) {
            Some(mix) => ClusterSpec {
                api_version: crate::API_VERSION.to_string(),
                kind: "SimCluster".to_string(),
                node_types: mix.node_types.clone(),
            },
            None => ClusterSpec::embedded_default(),
        };
        match cell.cluster.nodes {
            Some(n) => spec.scaled(n),
            None => spec,
        }
    }
}

/// The generator of a cell's stream for `seed` on a cluster of `total_gpus`.
pub fn cell_generator(stream: &CellStream, total_gpus: usize, seed: u64) -> Generate {
    let mut g = Generate::default_for(total_gpus, stream.pods, seed);
    g.vf_share = stream.vf_share;
    if let Some(sizes) = &stream.sizes {
        let total: f64 = sizes.values().sum();
        let mean_size: f64 = sizes.iter().map(|(s, p)| *s as f64 * p / total).sum();
        g.sizes = sizes.clone();
        g.mean_interarrival_seconds =
            g.mean_duration_seconds * mean_size / (Generate::DEFAULT_LOAD * total_gpus.max(1) as f64);
    }
    g
}

/// What the bottleneck columns and the bandwidth rules measure (printed with the report).
pub const BANDWIDTH_MEASURE: &str = "the bottleneck ring: what a ring all-reduce over each placed multi-GPU pod's \
     GPUs gets, the slowest hop of its best ring (PolicyReport's ring bandwidth)";

/// What the matrix reads from one policy's run on one seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// Pods placed.
    pub placed: f64,
    /// 8-GPU pods placed.
    pub eight_gpu_placed: f64,
    /// Placed multi-GPU pods (the bandwidth columns are over these).
    pub multi_gpu_placed: f64,
    /// 10th percentile of the bottleneck (ring) bandwidth of placed multi-GPU pods, GB/s.
    pub p10_bottleneck_gbps: f64,
    /// Mean bottleneck (ring) bandwidth of placed multi-GPU pods, GB/s.
    pub mean_bottleneck_gbps: f64,
    /// Mean over placed multi-GPU pods of the mean bandwidth of their GPU pairs, GB/s.
    pub mean_pair_gbps: f64,
    /// Free GPUs stranded away from their NVLink peers, averaged over arrivals.
    pub stranded_gpus: f64,
}

impl Metrics {
    /// The matrix's view of a policy report.
    pub fn of(r: &PolicyReport) -> Metrics {
        Metrics {
            placed: r.placed as f64,
            eight_gpu_placed: r.by_size.get(&8).map_or(0, |c| c.placed) as f64,
            multi_gpu_placed: r.multi_gpu_placed as f64,
            p10_bottleneck_gbps: r.p10_ring_bandwidth_gbps,
            mean_bottleneck_gbps: r.mean_ring_bandwidth_gbps,
            mean_pair_gbps: r.mean_pair_bandwidth_gbps,
            stranded_gpus: r.mean_stranded_gpus,
        }
    }
}

/// One measure of the verdict, with which way is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Measure {
    /// Pods placed: weft ≥ baseline.
    Placed,
    /// 8-GPU pods placed: weft ≥ baseline (n/a when the stream offers none).
    EightGpuPlaced,
    /// p10 bottleneck bandwidth: weft > baseline; equal is a tie (n/a when either placed no
    /// multi-GPU pod).
    P10Bottleneck,
    /// Mean bottleneck bandwidth: as p10.
    MeanBottleneck,
    /// Stranded GPUs: weft < baseline; equal is a tie.
    Stranded,
}

impl Measure {
    /// Every measure, in report order.
    pub const ALL: [Measure; 5] =
        [Measure::Placed, Measure::EightGpuPlaced, Measure::P10Bottleneck, Measure::MeanBottleneck, Measure::Stranded];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Measure::Placed => "placed",
            Measure::EightGpuPlaced => "8-GPU placed",
            Measure::P10Bottleneck => "p10 bottleneck",
            Measure::MeanBottleneck => "mean bottleneck",
            Measure::Stranded => "stranded",
        }
    }
}

/// The outcome of one measure against one baseline on one seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// weft is ahead as the rule asks.
    Win,
    /// weft equals the baseline on a measure where the rule asks for strictly better.
    Tie,
    /// weft is behind.
    Lose,
    /// The rule does not apply (nothing to compare).
    NotApplicable,
}

/// The verdict rule for one measure on one seed, `offered_eight`: 8-GPU pods the stream offers.
///
/// - placed and 8-GPU placed: weft ≥ baseline wins (equal too: the rule is "at least as many"),
///   fewer loses; 8-GPU placed does not apply when the stream offers no 8-GPU pod;
/// - p10 and mean bottleneck bandwidth: higher wins, equal ties, lower loses; the rule does not
///   apply when weft or the baseline placed no multi-GPU pod (an all-1-GPU stream);
/// - stranded GPUs: fewer wins, equal ties (both 0 included), more loses.
///
/// Values are compared exactly: each is computed the same way from the same stream, and a p10 is
/// one pod's value, so equal means equal.
pub fn judge(measure: Measure, weft: &Metrics, baseline: &Metrics, offered_eight: usize) -> Outcome {
    let at_least = |w: f64, b: f64| if w >= b { Outcome::Win } else { Outcome::Lose };
    let higher = |w: f64, b: f64| match w.partial_cmp(&b) {
        Some(std::cmp::Ordering::Greater) => Outcome::Win,
        Some(std::cmp::Ordering::Equal) => Outcome::Tie,
        _ => Outcome::Lose,
    };
    match measure {
        Measure::Placed => at_least(weft.placed, baseline.placed),
        Measure::EightGpuPlaced if offered_eight == 0 => Outcome::NotApplicable,
        Measure::EightGpuPlaced => at_least(weft.eight_gpu_placed, baseline.eight_gpu_placed),
        Measure::P10Bottleneck | Measure::MeanBottleneck
            if weft.multi_gpu_placed == 0.0 || baseline.multi_gpu_placed == 0.0 =>
        {
            Outcome::NotApplicable
        }
        Measure::P10Bottleneck => higher(weft.p10_bottleneck_gbps, baseline.p10_bottleneck_gbps),
        Measure::MeanBottleneck => higher(weft.mean_bottleneck_gbps, baseline.mean_bottleneck_gbps),
        Measure::Stranded => higher(-weft.stranded_gpus, -baseline.stranded_gpus),
    }
}

/// A cell's verdict over all its checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CellVerdict {
    /// No check lost or tied.
    Wins,
    /// No check lost, some tied.
    Ties,
    /// Some check lost.
    Loses,
}

/// One policy over a cell's seeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyOverSeeds {
    /// Policy name.
    pub policy: String,
    /// Mean over the seeds.
    pub mean: Metrics,
    /// Worst seed per measure (fewest placed, lowest bandwidth, most stranded; each measure's own
    /// worst seed).
    pub worst: Metrics,
    /// Per seed, in seed order.
    pub seeds: Vec<Metrics>,
}

/// One measure against one baseline over a cell's seeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// The baseline policy.
    pub baseline: String,
    /// The measure.
    pub measure: Measure,
    /// Lose when some seed loses; else tie when some seed ties; else win when some seed wins; n/a
    /// when the rule applies on no seed.
    pub outcome: Outcome,
    /// Seeds on which weft lost this check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_seeds: Vec<u64>,
    /// Seeds on which weft tied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tied_seeds: Vec<u64>,
}

/// One cell's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CellReport {
    /// Cell name.
    pub name: String,
    /// The cell's spec.
    pub spec: CellSpec,
    /// The mix's description (empty for `default`).
    pub mix_description: String,
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: usize,
    /// SR-IOV VFs.
    pub vfs: usize,
    /// Pods per seed per size (the first seed's stream).
    pub by_size: BTreeMap<usize, usize>,
    /// One entry per policy.
    pub policies: Vec<PolicyOverSeeds>,
    /// weft against each baseline, per measure.
    pub checks: Vec<Check>,
    /// The verdict.
    pub verdict: CellVerdict,
    /// The cell's gate failed.
    pub gate_failed: bool,
}

/// The whole matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatrixReport {
    /// What the bottleneck columns measure.
    pub bandwidth_measure: String,
    /// The cells run, in file order.
    pub cells: Vec<CellReport>,
    /// Cells where weft lost a check.
    pub losing: Vec<String>,
    /// Cells where weft tied some check and lost none.
    pub tying: Vec<String>,
    /// Cells whose gate failed (the command fails when there is one).
    pub gate_failed: Vec<String>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct MatrixOptions {
    /// Only cells marked `small: true`.
    pub small_only: bool,
    /// Worker threads (cells and seeds run in parallel); 0: one per CPU.
    pub threads: usize,
    /// weft's node-score settings.
    pub score_config: ScoreConfig,
}

/// Run every (chosen) cell, every seed, every policy; cells and seeds run in parallel.
pub fn run_matrix(spec: &MatrixSpec, opts: &MatrixOptions) -> Result<MatrixReport, SimError> {
    let cells: Vec<&CellSpec> = spec.cells.iter().filter(|c| c.small || !opts.small_only).collect();
    let clusters: Vec<Cluster> = cells
        .iter()
        .map(|c| {
            spec.cluster_spec(c).build(None).map_err(|e| SimError::Format {
                source_name: "matrix".into(),
                message: format!("cell '{}': cluster: {e}", c.name),
            })
        })
        .collect::<Result<_, _>>()?;
    // One job per (cell, seed): its stream and every policy on it.
    let jobs: Vec<(usize, u64)> =
        cells.iter().enumerate().flat_map(|(i, c)| (1..=c.stream.seeds).map(move |s| (i, s))).collect();
    let results: Mutex<Vec<Option<Result<SeedRun, SimError>>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let next = AtomicUsize::new(0);
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(jobs.len())
    .max(1);
    let work = || {
        loop {
            let j = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(c, seed)) = jobs.get(j) else { return };
            let r = run_job(cells[c], &clusters[c], seed, &opts.score_config);
            if let Ok(mut all) = results.lock() {
                all[j] = Some(r);
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut per_cell: Vec<Vec<SeedRun>> = vec![Vec::new(); cells.len()];
    for (r, &(c, seed)) in results.into_iter().zip(&jobs) {
        let r = r.ok_or_else(|| SimError::Format {
            source_name: "matrix".into(),
            message: format!("cell '{}' seed {seed}: not run", cells[c].name),
        })?;
        per_cell[c].push(r?);
    }
    let mut reports = Vec::new();
    for ((cell, cluster), runs) in cells.iter().zip(&clusters).zip(per_cell) {
        reports.push(cell_report(spec, cell, cluster, &runs));
    }
    let named = |f: &dyn Fn(&CellReport) -> bool| reports.iter().filter(|r| f(r)).map(|r| r.name.clone()).collect();
    let losing = named(&|r| r.verdict == CellVerdict::Loses);
    let tying = named(&|r| r.verdict == CellVerdict::Ties);
    let gate_failed = named(&|r| r.gate_failed);
    Ok(MatrixReport { bandwidth_measure: BANDWIDTH_MEASURE.to_string(), cells: reports, losing, tying, gate_failed })
}

/// One seed of a cell: its stream's pods per size and each policy's metrics (in
/// [`PlacementPolicy::ALL`] order).
#[derive(Clone, Debug)]
struct SeedRun {
    seed: u64,
    by_size: BTreeMap<usize, usize>,
    metrics: Vec<Metrics>,
}

fn run_job(cell: &CellSpec, cluster: &Cluster, seed: u64, score_config: &ScoreConfig) -> Result<SeedRun, SimError> {
    let name = |e: SimError| SimError::Format {
        source_name: "matrix".into(),
        message: format!("cell '{}' seed {seed}: {e}", cell.name),
    };
    let pods = cell_generator(&cell.stream, cluster.total_gpus(), seed).pods().map_err(name)?;
    let mut by_size = BTreeMap::new();
    for p in &pods {
        *by_size.entry(p.gpus).or_insert(0) += 1;
    }
    let mut metrics = Vec::new();
    for policy in PlacementPolicy::ALL {
        let r = run_policy(cluster, &pods, policy, score_config, seed, &mut |_| {}).map_err(name)?;
        metrics.push(Metrics::of(&r));
    }
    Ok(SeedRun { seed, by_size, metrics })
}

fn cell_report(spec: &MatrixSpec, cell: &CellSpec, cluster: &Cluster, runs: &[SeedRun]) -> CellReport {
    let policies: Vec<PolicyOverSeeds> = PlacementPolicy::ALL
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let seeds: Vec<Metrics> = runs.iter().map(|r| r.metrics[i]).collect();
            PolicyOverSeeds { policy: p.name().to_string(), mean: mean(&seeds), worst: worst(&seeds), seeds }
        })
        .collect();
    let mut checks = Vec::new();
    for (b, baseline) in PlacementPolicy::ALL.iter().enumerate().skip(1) {
        for measure in Measure::ALL {
            let (mut lost_seeds, mut tied_seeds, mut applies) = (Vec::new(), Vec::new(), false);
            for SeedRun { seed, by_size, metrics: m } in runs {
                match judge(measure, &m[0], &m[b], by_size.get(&8).copied().unwrap_or(0)) {
                    Outcome::Win => applies = true,
                    Outcome::Tie => tied_seeds.push(*seed),
                    Outcome::Lose => lost_seeds.push(*seed),
                    Outcome::NotApplicable => {}
                }
            }
            let outcome = if !lost_seeds.is_empty() {
                Outcome::Lose
            } else if !tied_seeds.is_empty() {
                Outcome::Tie
            } else if applies {
                Outcome::Win
            } else {
                Outcome::NotApplicable
            };
            checks.push(Check { baseline: baseline.name().to_string(), measure, outcome, lost_seeds, tied_seeds });
        }
    }
    let verdict = if checks.iter().any(|c| c.outcome == Outcome::Lose) {
        CellVerdict::Loses
    } else if checks.iter().any(|c| c.outcome == Outcome::Tie) {
        CellVerdict::Ties
    } else {
        CellVerdict::Wins
    };
    CellReport {
        name: cell.name.clone(),
        spec: cell.clone(),
        mix_description: spec.clusters.get(&cell.cluster.mix).map(|m| m.description.clone()).unwrap_or_default(),
        nodes: cluster.nodes.len(),
        gpus: cluster.total_gpus(),
        vfs: cluster.total_vfs(),
        by_size: runs.first().map(|r| r.by_size.clone()).unwrap_or_default(),
        policies,
        checks,
        verdict,
        gate_failed: cell.gate.fails(verdict),
    }
}

fn mean(ms: &[Metrics]) -> Metrics {
    let n = ms.len().max(1) as f64;
    let sum = |f: fn(&Metrics) -> f64| ms.iter().map(f).sum::<f64>() / n;
    Metrics {
        placed: sum(|m| m.placed),
        eight_gpu_placed: sum(|m| m.eight_gpu_placed),
        multi_gpu_placed: sum(|m| m.multi_gpu_placed),
        p10_bottleneck_gbps: sum(|m| m.p10_bottleneck_gbps),
        mean_bottleneck_gbps: sum(|m| m.mean_bottleneck_gbps),
        mean_pair_gbps: sum(|m| m.mean_pair_gbps),
        stranded_gpus: sum(|m| m.stranded_gpus),
    }
}

fn worst(ms: &[Metrics]) -> Metrics {
    let low = |f: fn(&Metrics) -> f64| ms.iter().map(f).fold(f64::INFINITY, f64::min);
    let high = |f: fn(&Metrics) -> f64| ms.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
    if ms.is_empty() {
        return Metrics::default();
    }
    Metrics {
        placed: low(|m| m.placed),
        eight_gpu_placed: low(|m| m.eight_gpu_placed),
        multi_gpu_placed: low(|m| m.multi_gpu_placed),
        p10_bottleneck_gbps: low(|m| m.p10_bottleneck_gbps),
        mean_bottleneck_gbps: low(|m| m.mean_bottleneck_gbps),
        mean_pair_gbps: low(|m| m.mean_pair_gbps),
        stranded_gpus: high(|m| m.stranded_gpus),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(placed: f64, eight: f64, multi: f64, p10: f64, mean: f64, stranded: f64) -> Metrics {
        Metrics {
            placed,
            eight_gpu_placed: eight,
            multi_gpu_placed: multi,
            p10_bottleneck_gbps: p10,
            mean_bottleneck_gbps: mean,
            mean_pair_gbps: mean,
            stranded_gpus: stranded,
        }
    }

    #[test]
    fn equal_counts_win_equal_bandwidth_and_stranded_tie() {
        let w = m(10.0, 2.0, 5.0, 50.0, 100.0, 1.0);
        assert_eq!(judge(Measure::Placed, &w, &w, 1), Outcome::Win);
        assert_eq!(judge(Measure::EightGpuPlaced, &w, &w, 1), Outcome::Win);
        assert_eq!(judge(Measure::P10Bottleneck, &w, &w, 1), Outcome::Tie);
        assert_eq!(judge(Measure::MeanBottleneck, &w, &w, 1), Outcome::Tie);
        assert_eq!(judge(Measure::Stranded, &w, &w, 1), Outcome::Tie);
        let z = m(10.0, 2.0, 5.0, 50.0, 100.0, 0.0);
        assert_eq!(judge(Measure::Stranded, &z, &z, 1), Outcome::Tie);
        let b = m(11.0, 3.0, 5.0, 49.0, 99.0, 2.0);
        assert_eq!(judge(Measure::Placed, &w, &b, 1), Outcome::Lose);
        assert_eq!(judge(Measure::EightGpuPlaced, &w, &b, 1), Outcome::Lose);
        assert_eq!(judge(Measure::P10Bottleneck, &w, &b, 1), Outcome::Win);
        assert_eq!(judge(Measure::MeanBottleneck, &w, &b, 1), Outcome::Win);
        assert_eq!(judge(Measure::Stranded, &w, &b, 1), Outcome::Win);
        assert_eq!(judge(Measure::P10Bottleneck, &b, &w, 1), Outcome::Lose);
        assert_eq!(judge(Measure::Stranded, &b, &w, 1), Outcome::Lose);
    }

    #[test]
    fn a_gate_fails_on_losses_or_when_strict_on_ties_too() {
        use CellVerdict::*;
        assert_eq!([Wins, Ties, Loses].map(|v| Gate::Off.fails(v)), [false, false, false]);
        assert_eq!([Wins, Ties, Loses].map(|v| Gate::Losses.fails(v)), [false, false, true]);
        assert_eq!([Wins, Ties, Loses].map(|v| Gate::Strict.fails(v)), [false, true, true]);
    }

    #[test]
    fn rules_without_anything_to_compare_do_not_apply() {
        let w = m(10.0, 0.0, 0.0, 0.0, 0.0, 1.0);
        let b = m(10.0, 0.0, 4.0, 10.0, 10.0, 2.0);
        assert_eq!(judge(Measure::EightGpuPlaced, &w, &b, 0), Outcome::NotApplicable);
        assert_eq!(judge(Measure::P10Bottleneck, &w, &b, 0), Outcome::NotApplicable);
        assert_eq!(judge(Measure::MeanBottleneck, &b, &w, 0), Outcome::NotApplicable);
    }
}
