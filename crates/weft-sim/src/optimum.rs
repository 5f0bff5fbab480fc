//! Distance to the optimum: a proven upper bound on the pods any policy could have placed on a
//! stream, and each policy's gap to it.
//!
//! The engine's model ([`crate::engine`]) makes placement feasibility a matter of counts: a pod
//! asks for `g` GPUs and, per physnet, some VFs; any free GPUs of its node serve it, and the VFs of
//! one physnet are interchangeable for fitting. So "which pods to admit, and on which node, so that
//! at every instant each node's GPUs and per-physnet VFs suffice" is exactly this 0/1 program:
//!
//! - a variable `x[p][n]` for each pod `p` and node `n` whose type could hold `p` on its own;
//! - each pod on at most one node: `Σ_n x[p][n] ≤ 1`;
//! - for each node `n` and each instant `q` at which the set of running pods is largest (the
//!   arrival just before some pod departs, and the last arrival), the pods running then fit:
//!   `Σ_{p running at q} g_p·x[p][n] ≤ G_n`, and the same for each physnet's VFs;
//! - maximise `Σ x`.
//!
//! "Running at `q`" follows the engine to the letter: pods are handled in the stream's order, and
//! before pod `q` every earlier pod whose end (`arrival + duration`) is at or before `q`'s arrival
//! has left. Checking at the arrivals is enough because nothing arrives in between, and checking
//! only at the arrivals that precede a departure is enough because at any other arrival the
//! running set only grows until the next one.
//!
//! Every online policy's placements are a feasible point of this program (it places pods where
//! they fit at arrival, and a placed pod stays until its end), so its optimum bounds every policy
//! from above; the online policy also decides without knowing the future, so the bound need not be
//! reachable online. The program is solved by `microlp` (pure Rust branch and bound) under a
//! time limit: a finished search gives the optimum; an interrupted one gives the search's best
//! proven bound, which is still an upper bound. When the integer search fails, the linear
//! relaxation (each `x` in `[0, 1]`) is solved instead: its optimum is also an upper bound. The
//! last resort is the count of pods that fit some node type at all. [`BoundKind`] says which one a
//! number is.
//!
//! Identical nodes make the integer search explore many equivalent placements. The search is kept
//! exact with symmetry-breaking rows that remove only relabellings: among the nodes of one type,
//! node `j + 1` takes a pod only once node `j` has taken an earlier one (`x[p][j+1] ≤ Σ_{r<p}
//! x[r][j]`). Any placement can be relabelled to meet them (number a type's nodes by the first pod
//! each receives), so the optimum is unchanged.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use microlp::{ComparisonOp, OptimizationDirection, Problem, SolveOptions, SolveOutcome, Variable};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use weft_alloc::ScoreConfig;

use crate::SimError;
use crate::cluster::Cluster;
use crate::engine::{PlacementPolicy, run_policy};
use crate::workload::SimPod;

/// Most variables (pod × node pairs) the program may have; larger instances are refused before
/// anything is built (the bound is meant for small instances: a few hundred pods on 8–16 nodes is
/// a few thousand).
pub const MAX_VARIABLES: usize = 200_000;

/// Errors of the optimum computation.
#[derive(Debug, Error)]
pub enum OptimumError {
    /// The cluster, the pods or a policy run refused.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A pod the program cannot take.
    #[error("pod '{pod}' (stream position {index}): {message}")]
    BadPod {
        /// Pod name.
        pod: String,
        /// Its position in the stream.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// A checked placement holds more pods than the bound: the program or the solver is wrong.
    #[error(
        "internal contradiction: a placement of {found} pods passed the check, above the {} of {bound}",
        kind.name()
    )]
    Inconsistent {
        /// The bound.
        bound: usize,
        /// Its kind.
        kind: BoundKind,
        /// Pods of the checked placement.
        found: usize,
    },
    /// The program would be larger than [`MAX_VARIABLES`].
    #[error("the optimum program would have {variables} pod-node variables (at most {limit}): use fewer nodes or pods")]
    TooLarge {
        /// Variables it would have.
        variables: usize,
        /// The limit.
        limit: usize,
    },
}

/// How a bound was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BoundKind {
    /// The integer program was solved to optimality: the bound is the offline optimum.
    Optimal,
    /// The integer search stopped at the time limit: its best proven bound.
    MipBound,
    /// The linear relaxation's optimum (the integer search failed or found no bound).
    LpBound,
    /// The pods that fit some node type at all (both solves failed).
    Trivial,
}

impl BoundKind {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            BoundKind::Optimal => "optimal",
            BoundKind::MipBound => "MIP bound",
            BoundKind::LpBound => "LP bound",
            BoundKind::Trivial => "trivial",
        }
    }
}

/// Options of the computation.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimumOptions {
    /// Time limit of the integer search (the relaxation, when needed, gets the same again).
    pub time_limit: Duration,
}

impl Default for OptimumOptions {
    fn default() -> Self {
        OptimumOptions { time_limit: Duration::from_secs(10) }
    }
}

/// An upper bound on the pods placed, with what backs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacedBound {
    /// Pods offered.
    pub pods: usize,
    /// Pods that fit some node type of the cluster when it is empty (a first, trivial bound).
    pub placeable: usize,
    /// No policy places more than this many pods of the stream.
    pub bound: usize,
    /// How [`Self::bound`] was obtained.
    pub kind: BoundKind,
    /// The most pods of a placement the solver found and this module checked against the counts
    /// (a feasible offline placement: the optimum is at least this). None when none was found.
    pub best_found: Option<usize>,
    /// Pod-node variables of the program.
    pub variables: usize,
    /// Rows of the program (one-node-per-pod, capacity and symmetry rows).
    pub rows: usize,
    /// Wall time of the solves, milliseconds.
    pub solve_ms: f64,
    /// Why a fallback was taken (the solver's error), when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The program, built without a solver (pure), so it can be checked and tested on its own.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    /// The 0/1 variables: (pod position in the stream, node position in the cluster).
    pub vars: Vec<(usize, usize)>,
    /// Continuous helper variables (≥ 0) of the symmetry rows, numbered after `vars`.
    pub aux: usize,
    /// Rows `Σ coeff·x ≤ rhs`: (variable positions with coefficients, rhs).
    pub rows: Vec<(Vec<(usize, f64)>, f64)>,
    /// Pods that fit some node type.
    pub placeable: usize,
}

/// Per node type: GPUs and, per physnet of the stream, VFs.
struct TypeCapacity {
    gpus: usize,
    vfs: Vec<usize>,
}

/// A pod as counts: GPUs and, per physnet of the stream, VFs.
struct PodNeed {
    gpus: usize,
    vfs: Vec<usize>,
}

/// The stream and the cluster as counts.
struct Counts {
    pods: Vec<PodNeed>,
    types: Vec<TypeCapacity>,
}

fn needs(cluster: &Cluster, pods: &[SimPod]) -> Result<Counts, OptimumError> {
    let physnets: Vec<Arc<str>> = pods
        .iter()
        .flat_map(|p| p.vfs.iter().filter(|(_, n)| *n > 0).map(|(name, _)| name.clone()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut out = Vec::with_capacity(pods.len());
    for (index, p) in pods.iter().enumerate() {
        let bad = |message: String| OptimumError::BadPod { pod: p.name.clone(), index, message };
        if p.gpus == 0 {
            return Err(bad("requests no GPU; the simulator places GPU pods".into()));
        }
        if !p.arrival.is_finite() || p.arrival < 0.0 || !p.duration.is_finite() || p.duration < 0.0 {
            return Err(bad(format!("arrival {} s and duration {} s must be finite and ≥ 0", p.arrival, p.duration)));
        }
        let mut vfs = vec![0usize; physnets.len()];
        for (name, n) in &p.vfs {
            if *n > 0 {
                // Every name with a count > 0 is in `physnets` by construction.
                let i = physnets.binary_search(name).unwrap_or_default();
                vfs[i] = vfs[i].saturating_add(*n);
            }
        }
        out.push(PodNeed { gpus: p.gpus, vfs });
    }
    let caps = cluster
        .types
        .iter()
        .map(|t| TypeCapacity {
            gpus: t.topology.gpu_count(),
            vfs: physnets
                .iter()
                .map(|s| t.topology.vfs().iter().filter(|v| v.physnet.as_deref() == Some(&**s)).count())
                .collect(),
        })
        .collect();
    Ok(Counts { pods: out, types: caps })
}

fn fits(need: &PodNeed, cap: &TypeCapacity) -> bool {
    need.gpus <= cap.gpus && need.vfs.iter().zip(&cap.vfs).all(|(n, c)| n <= c)
}

/// The running sets at the instants that need checking: for each arrival just before a departure
/// (and the last arrival), the pods running then, in stream order. Follows the engine: before pod
/// `q`, every pod running whose end is at or before `q`'s arrival leaves.
pub fn checked_instants(pods: &[SimPod]) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut running: Vec<usize> = Vec::new();
    // The set as it stood after the previous arrival, kept only if someone leaves before the next.
    let mut pending: Option<Vec<usize>> = None;
    for (q, pod) in pods.iter().enumerate() {
        let before = running.len();
        running.retain(|&p| pods[p].arrival + pods[p].duration > pod.arrival);
        if let Some(set) = pending.take()
            && running.len() < before
        {
            out.push(set);
        }
        running.push(q);
        pending = Some(running.clone());
    }
    out.extend(pending);
    out
}

/// Build the program for `pods` on `cluster` (see the module docs).
pub fn build_program(cluster: &Cluster, pods: &[SimPod]) -> Result<Program, OptimumError> {
    Ok(build(cluster, pods)?.0)
}

fn build(cluster: &Cluster, pods: &[SimPod]) -> Result<(Program, Counts), OptimumError> {
    if cluster.nodes.is_empty() {
        return Err(SimError::EmptyCluster.into());
    }
    let counts = needs(cluster, pods)?;
    let (needs, caps) = (&counts.pods, &counts.types);
    let node_type = |n: usize| cluster.nodes[n].node_type;
    let fits_type: Vec<Vec<bool>> = needs.iter().map(|p| caps.iter().map(|c| fits(p, c)).collect()).collect();
    let placeable = fits_type.iter().filter(|f| f.iter().any(|&x| x)).count();
    let variables: usize = fits_type
        .iter()
        .map(|f| (0..cluster.nodes.len()).filter(|&n| f[node_type(n)]).count())
        .try_fold(0usize, |a, b| a.checked_add(b))
        .unwrap_or(usize::MAX);
    if variables > MAX_VARIABLES {
        return Err(OptimumError::TooLarge { variables, limit: MAX_VARIABLES });
    }
    let mut program = Program { placeable, ..Program::default() };
    // var_of[p]: node -> variable.
    let mut var_of: Vec<BTreeMap<usize, usize>> = vec![BTreeMap::new(); pods.len()];
    for (p, f) in fits_type.iter().enumerate() {
        for n in 0..cluster.nodes.len() {
            if f[node_type(n)] {
                var_of[p].insert(n, program.vars.len());
                program.vars.push((p, n));
            }
        }
    }
    for vars in &var_of {
        if vars.len() >= 2 {
            program.rows.push((vars.values().map(|&v| (v, 1.0)).collect(), 1.0));
        }
    }
    for running in checked_instants(pods) {
        for n in 0..cluster.nodes.len() {
            let cap = &caps[node_type(n)];
            let on_n: Vec<(usize, usize)> =
                running.iter().filter_map(|&p| var_of[p].get(&n).map(|&v| (p, v))).collect();
            let gpus: usize = on_n.iter().map(|&(p, _)| needs[p].gpus).sum();
            if gpus > cap.gpus {
                program.rows.push((on_n.iter().map(|&(p, v)| (v, needs[p].gpus as f64)).collect(), cap.gpus as f64));
            }
            for (s, &vfs_cap) in cap.vfs.iter().enumerate() {
                let asks: Vec<(usize, f64)> = on_n
                    .iter()
                    .filter(|&&(p, _)| needs[p].vfs[s] > 0)
                    .map(|&(p, v)| (v, needs[p].vfs[s] as f64))
                    .collect();
                if asks.iter().map(|(_, c)| c).sum::<f64>() > vfs_cap as f64 {
                    program.rows.push((asks, vfs_cap as f64));
                }
            }
        }
    }
    // Symmetry: node j + 1 of a type takes pod p only if node j took an earlier pod. With
    // u[p][j] ≤ Σ_{r≤p} x[r][j] (continuous, chained so each row stays short):
    // u[p][j] − u[p−1][j] − x[p][j] ≤ 0 and x[p][j+1] − u[p−1][j] ≤ 0.
    let mut by_type: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for n in 0..cluster.nodes.len() {
        by_type.entry(node_type(n)).or_default().push(n);
    }
    let first_aux = program.vars.len();
    for nodes in by_type.values() {
        for pair in nodes.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let mut prefix: Option<usize> = None;
            for vars in &var_of {
                let (Some(&va), Some(&vb)) = (vars.get(&a), vars.get(&b)) else { continue };
                match prefix {
                    None => program.rows.push((vec![(vb, 1.0)], 0.0)),
                    Some(u) => program.rows.push((vec![(vb, 1.0), (u, -1.0)], 0.0)),
                }
                let u = first_aux + program.aux;
                program.aux += 1;
                let mut row = vec![(u, 1.0), (va, -1.0)];
                if let Some(prev) = prefix {
                    row.push((prev, -1.0));
                }
                program.rows.push((row, 0.0));
                prefix = Some(u);
            }
        }
    }
    Ok((program, counts))
}

/// Whether a placement (per pod: its node or None) keeps every node's GPU and per-physnet VF counts
/// at every instant, replaying the engine's event order. Independent of [`build_program`]: the
/// check that the solver's placements are real.
pub fn placement_fits(cluster: &Cluster, pods: &[SimPod], placement: &[Option<usize>]) -> Result<bool, OptimumError> {
    let Counts { pods: needs, types: caps } = needs(cluster, pods)?;
    let mut running: Vec<usize> = Vec::new();
    for (q, pod) in pods.iter().enumerate() {
        running.retain(|&p| pods[p].arrival + pods[p].duration > pod.arrival);
        let Some(n) = placement.get(q).copied().flatten() else { continue };
        let Some(node) = cluster.nodes.get(n) else { return Ok(false) };
        let cap = &caps[node.node_type];
        running.push(q);
        let on_n: Vec<usize> = running.iter().copied().filter(|&p| placement[p] == Some(n)).collect();
        if on_n.iter().map(|&p| needs[p].gpus).sum::<usize>() > cap.gpus {
            return Ok(false);
        }
        for (s, &c) in cap.vfs.iter().enumerate() {
            if on_n.iter().map(|&p| needs[p].vfs[s]).sum::<usize>() > c {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// A best-fit placement: pods in stream order, each on the node that fits it (by counts) with the
/// fewest free GPUs, ties to the lower node.
fn best_fit(cluster: &Cluster, counts: &Counts, pods: &[SimPod]) -> Vec<Option<usize>> {
    let node_type = |n: usize| cluster.nodes[n].node_type;
    let mut free_gpus: Vec<usize> = (0..cluster.nodes.len()).map(|n| counts.types[node_type(n)].gpus).collect();
    let mut free_vfs: Vec<Vec<usize>> =
        (0..cluster.nodes.len()).map(|n| counts.types[node_type(n)].vfs.clone()).collect();
    let mut placement: Vec<Option<usize>> = vec![None; pods.len()];
    let mut running: Vec<usize> = Vec::new();
    for (q, pod) in pods.iter().enumerate() {
        running.retain(|&p| {
            let stays = pods[p].arrival + pods[p].duration > pod.arrival;
            if !stays && let Some(n) = placement[p] {
                free_gpus[n] += counts.pods[p].gpus;
                for (f, v) in free_vfs[n].iter_mut().zip(&counts.pods[p].vfs) {
                    *f += v;
                }
            }
            stays
        });
        let need = &counts.pods[q];
        let best = (0..cluster.nodes.len())
            .filter(|&n| free_gpus[n] >= need.gpus && free_vfs[n].iter().zip(&need.vfs).all(|(f, v)| f >= v))
            .min_by_key(|&n| (free_gpus[n], n));
        if let Some(n) = best {
            free_gpus[n] -= need.gpus;
            for (f, v) in free_vfs[n].iter_mut().zip(&need.vfs) {
                *f -= v;
            }
            placement[q] = Some(n);
            running.push(q);
        }
    }
    placement
}

fn problem(program: &Program, integral: bool) -> (Problem, Vec<Variable>) {
    let mut problem = Problem::new(OptimizationDirection::Maximize);
    let mut vars: Vec<Variable> = program
        .vars
        .iter()
        .map(|_| if integral { problem.add_binary_var(1.0) } else { problem.add_var(1.0, (0.0, 1.0)) })
        .collect();
    vars.extend((0..program.aux).map(|_| problem.add_var(0.0, (0.0, f64::INFINITY))));
    for (row, rhs) in &program.rows {
        problem.add_constraint(row.iter().map(|&(v, c)| (vars[v], c)), ComparisonOp::Le, *rhs);
    }
    (problem, vars)
}

/// An integral bound from a solver's real one: the objective counts pods, so the largest integer
/// not above the bound (less a round-off allowance) is a bound too.
fn floor_bound(x: f64) -> usize {
    if x.is_finite() && x > 0.0 { (x + 1e-6).floor() as usize } else { 0 }
}

/// The upper bound on pods placed (see the module docs).
pub fn placed_bound(cluster: &Cluster, pods: &[SimPod], options: &OptimumOptions) -> Result<PlacedBound, OptimumError> {
    let started = Instant::now();
    let (program, counts) = build(cluster, pods)?;
    let mut result = PlacedBound {
        pods: pods.len(),
        placeable: program.placeable,
        bound: program.placeable,
        kind: BoundKind::Trivial,
        best_found: None,
        variables: program.vars.len(),
        rows: program.rows.len(),
        solve_ms: 0.0,
        note: None,
    };
    if program.vars.is_empty() {
        result.kind = BoundKind::Optimal;
        result.best_found = Some(0);
        result.solve_ms = started.elapsed().as_secs_f64() * 1000.0;
        return Ok(result);
    }
    let (mip, vars) = problem(&program, true);
    let mut solve_options = SolveOptions::default();
    solve_options.time_limit = Some(options.time_limit);
    // The objective counts pods: a bound less than one pod above the incumbent settles it.
    solve_options.mip_gap = 0.5 / (program.vars.len() as f64 + 1.0);
    // A best-fit placement, checked like the solver's: the optimum is at least its count. (Handed
    // to the search as a warm start it made the search's own placements worse and the bound no
    // better on the default instances, so it only sets the floor.)
    let start = best_fit(cluster, &counts, pods);
    if placement_fits(cluster, pods, &start)? {
        result.best_found = Some(start.iter().filter(|n| n.is_some()).count());
    }
    let mut mip_bound = None;
    match mip.solve_with(solve_options) {
        Ok(SolveOutcome::Solution(s)) => {
            let chosen: Vec<bool> = vars[..program.vars.len()].iter().map(|&v| s.var_value(v) > 0.5).collect();
            let placement = placement_of(&program, pods.len(), &chosen);
            if placement_fits(cluster, pods, &placement)? {
                let found = placement.iter().filter(|n| n.is_some()).count();
                result.best_found = result.best_found.max(Some(found));
            }
            mip_bound = s.stats().best_bound.map(floor_bound);
        }
        Ok(SolveOutcome::Interrupted(i)) => mip_bound = i.stats().best_bound.map(floor_bound),
        Err(e) => result.note = Some(format!("integer search: {e}")),
    }
    match mip_bound {
        Some(b) if b <= result.bound => {
            result.bound = b;
            result.kind = BoundKind::MipBound;
        }
        _ => {
            let (lp, _) = problem(&program, false);
            let mut lp_options = SolveOptions::default();
            lp_options.time_limit = Some(options.time_limit);
            match lp.solve_with(lp_options) {
                Ok(SolveOutcome::Solution(s)) => {
                    let b = floor_bound(s.objective());
                    if b <= result.bound {
                        result.bound = b;
                        result.kind = BoundKind::LpBound;
                    }
                }
                Ok(SolveOutcome::Interrupted(_)) => {
                    push_note(&mut result.note, "linear relaxation: stopped at the time limit".into());
                }
                Err(e) => push_note(&mut result.note, format!("linear relaxation: {e}")),
            }
        }
    }
    if let Some(found) = result.best_found {
        // A placement of `found` pods passed the independent check: a bound below it is wrong
        // (the program or the solver), and no number of this instance can be trusted.
        if found > result.bound {
            return Err(OptimumError::Inconsistent { bound: result.bound, kind: result.kind, found });
        }
        if found == result.bound {
            result.kind = BoundKind::Optimal;
        }
    }
    result.solve_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(result)
}

fn push_note(note: &mut Option<String>, more: String) {
    *note = Some(match note.take() {
        Some(n) => format!("{n}; {more}"),
        None => more,
    });
}

fn placement_of(program: &Program, pods: usize, chosen: &[bool]) -> Vec<Option<usize>> {
    let mut placement = vec![None; pods];
    for (v, &(p, n)) in program.vars.iter().enumerate() {
        if chosen[v] {
            placement[p] = Some(n);
        }
    }
    placement
}

/// One policy's pods placed against the bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyGap {
    /// Policy name.
    pub policy: String,
    /// Pods it placed.
    pub placed: usize,
    /// `(bound − placed) / bound`: at least the true gap to the optimum (equal when the bound is
    /// optimal); 0 when the bound is 0.
    pub gap: f64,
    /// Its mean bottleneck ring bandwidth over its placed multi-GPU pods, GB/s (0 without them).
    pub mean_ring_gbps: f64,
    /// [`ring_bound`] at the pods it placed: no placement of at least as many pods has a higher
    /// mean bottleneck. None without multi-GPU pods placed, or when the solve gave no number.
    pub ring_bound_gbps: Option<f64>,
    /// `(ring bound − mean) / ring bound`, at least the true gap to the best mean bottleneck of a
    /// placement of that many pods.
    pub ring_gap: Option<f64>,
}

/// One instance: the bound and every policy's gap to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceReport {
    /// Seed of the instance (its stream and the blind policy's choices).
    pub seed: u64,
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: usize,
    /// Pods asking VFs.
    pub vf_pods: usize,
    /// The bound.
    pub bound: PlacedBound,
    /// The optimum is at least this: the most pods of the checked offline placement or of any
    /// policy's run (each is a feasible placement).
    pub optimum_at_least: usize,
    /// Each policy, in the order asked.
    pub policies: Vec<PolicyGap>,
}

/// Run `policies` over `pods` on `cluster` and put each beside the bound on pods placed, and its
/// mean bottleneck beside [`ring_bound`] at the pods it placed.
pub fn compare(
    cluster: &Cluster,
    pods: &[SimPod],
    policies: &[PlacementPolicy],
    score_config: &ScoreConfig,
    seed: u64,
    options: &OptimumOptions,
) -> Result<InstanceReport, OptimumError> {
    let bound = placed_bound(cluster, pods, options)?;
    let mut gaps = Vec::with_capacity(policies.len());
    // The ring bound depends only on the count placed: policies that placed as many share a solve.
    let mut ring_bounds: BTreeMap<usize, Option<f64>> = BTreeMap::new();
    for &policy in policies {
        let r = run_policy(cluster, pods, policy, score_config, seed, &mut |_| {})?;
        let gap = if bound.bound == 0 { 0.0 } else { (bound.bound as f64 - r.placed as f64) / bound.bound as f64 };
        let ring_bound_gbps = if r.multi_gpu_placed == 0 {
            None
        } else if let Some(&b) = ring_bounds.get(&r.placed) {
            b
        } else {
            let b = ring_bound(cluster, pods, r.placed, options)?.mean_gbps;
            ring_bounds.insert(r.placed, b);
            b
        };
        let ring_gap = ring_bound_gbps.filter(|&b| b > 0.0).map(|b| ((b - r.mean_ring_bandwidth_gbps) / b).max(0.0));
        gaps.push(PolicyGap {
            policy: r.policy,
            placed: r.placed,
            gap,
            mean_ring_gbps: r.mean_ring_bandwidth_gbps,
            ring_bound_gbps,
            ring_gap,
        });
    }
    let optimum_at_least = gaps.iter().map(|g| g.placed).chain(bound.best_found).max().unwrap_or(0);
    Ok(InstanceReport {
        optimum_at_least,
        seed,
        nodes: cluster.nodes.len(),
        gpus: cluster.total_gpus(),
        vf_pods: pods.iter().filter(|p| p.vf_count() > 0).count(),
        bound,
        policies: gaps,
    })
}

/// Most GPU subsets of one size a node type's best-set bandwidth is searched over; beyond it the
/// fastest GPU pair of the type stands in (a ring is never faster than its fastest hop).
const MAX_SUBSETS: u64 = 20_000;

/// An upper bound on the mean bottleneck ring bandwidth over the placed multi-GPU pods, over every
/// placement that places at least a given number of pods.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RingBound {
    /// The placements bounded place at least this many pods.
    pub min_placed: usize,
    /// No such placement has a higher mean bottleneck ring bandwidth over its multi-GPU pods
    /// (GB/s); None when no placement of that many pods exists even in the relaxation.
    pub mean_gbps: Option<f64>,
    /// Wall time of the solve, milliseconds.
    pub solve_ms: f64,
    /// Why there is no number (the solver's error or its time limit), when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The fastest bottleneck ring any `g` GPUs of `topology` can form: exact over every subset when
/// there are at most [`MAX_SUBSETS`], else the fastest pair (an upper bound either way). 0 for a
/// single GPU (no ring) or more GPUs than the node has.
pub fn best_ring_of_size(topology: &weft_topology::NodeTopology, g: usize) -> f64 {
    let n = topology.gpu_count();
    if g < 2 || g > n {
        return 0.0;
    }
    let subsets = (0..g as u64).try_fold(1u64, |acc, i| acc.checked_mul(n as u64 - i).map(|v| v / (i + 1)));
    if subsets.is_none_or(|s| s > MAX_SUBSETS) {
        let mut best = 0.0f64;
        for a in 0..n {
            for b in a + 1..n {
                best = best.max(topology.pair_bandwidth_gbps(a, b));
            }
        }
        return best;
    }
    let mut best = 0.0f64;
    let mut set: Vec<usize> = (0..g).collect();
    loop {
        if let Some(r) = topology.ring_bandwidth(&set) {
            best = best.max(r.upper_bound_gbps);
        }
        // Next g-subset in lexicographic order.
        let Some(i) = (0..g).rev().find(|&i| set[i] < n - g + i) else { break };
        set[i] += 1;
        for j in i + 1..g {
            set[j] = set[j - 1] + 1;
        }
    }
    best
}

/// The bound of [`RingBound`], by a linear program over node types instead of nodes (a relaxation
/// of [`build_program`]'s: a type's nodes pool their GPUs and VFs, and each pod may be split):
/// `x[p][t] ∈ [0, 1]` is the share of pod `p` on type `t`; at each checked instant each type's
/// running pods use at most its nodes' GPUs and per-physnet VFs together; `Σ x ≥ min_placed`; and
/// a pod of `g ≥ 2` GPUs on type `t` counts [`best_ring_of_size`]`(t, g)`, the best any of its
/// sets could get. Every real placement is a point of this program, so its largest
/// `Σ bw·x / Σ_{g≥2} x` bounds every policy's mean bottleneck. The ratio is made linear the
/// Charnes–Cooper way: `y = s·x` with `Σ_{g≥2} y = 1`, `s ≥ 0`.
pub fn ring_bound(
    cluster: &Cluster,
    pods: &[SimPod],
    min_placed: usize,
    options: &OptimumOptions,
) -> Result<RingBound, OptimumError> {
    let started = Instant::now();
    if cluster.nodes.is_empty() {
        return Err(SimError::EmptyCluster.into());
    }
    let counts = needs(cluster, pods)?;
    let types = cluster.types.len();
    let mut nodes_of = vec![0usize; types];
    for n in &cluster.nodes {
        nodes_of[n.node_type] += 1;
    }
    let mut ring: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    let mut problem = Problem::new(OptimizationDirection::Maximize);
    let scale = problem.add_var(0.0, (0.0, f64::INFINITY));
    // vars[p]: (type, variable) for each type that could hold p.
    let mut vars: Vec<Vec<(usize, Variable)>> = Vec::with_capacity(pods.len());
    for need in &counts.pods {
        let mut of_p = Vec::new();
        for (t, cap) in counts.types.iter().enumerate() {
            if nodes_of[t] == 0 || !fits(need, cap) {
                continue;
            }
            let bw =
                *ring.entry((t, need.gpus)).or_insert_with(|| best_ring_of_size(&cluster.types[t].topology, need.gpus));
            of_p.push((t, problem.add_var(bw, (0.0, f64::INFINITY))));
        }
        if !of_p.is_empty() {
            problem.add_constraint(of_p.iter().map(|&(_, v)| (v, 1.0)).chain([(scale, -1.0)]), ComparisonOp::Le, 0.0);
        }
        vars.push(of_p);
    }
    let multi: Vec<(Variable, f64)> = counts
        .pods
        .iter()
        .zip(&vars)
        .filter(|(need, _)| need.gpus >= 2)
        .flat_map(|(_, of_p)| of_p.iter().map(|&(_, v)| (v, 1.0)))
        .collect();
    if multi.is_empty() {
        return Ok(RingBound {
            min_placed,
            mean_gbps: None,
            solve_ms: started.elapsed().as_secs_f64() * 1000.0,
            note: Some("no multi-GPU pod fits the cluster".into()),
        });
    }
    problem.add_constraint(multi, ComparisonOp::Eq, 1.0);
    let all: Vec<(Variable, f64)> = vars.iter().flatten().map(|&(_, v)| (v, 1.0)).collect();
    problem.add_constraint(all.into_iter().chain([(scale, -(min_placed as f64))]), ComparisonOp::Ge, 0.0);
    for running in checked_instants(pods) {
        for (t, cap) in counts.types.iter().enumerate() {
            let on_t: Vec<(usize, Variable)> =
                running.iter().filter_map(|&p| vars[p].iter().find(|(u, _)| *u == t).map(|&(_, v)| (p, v))).collect();
            let gpus_cap = (cap.gpus * nodes_of[t]) as f64;
            if on_t.iter().map(|&(p, _)| counts.pods[p].gpus as f64).sum::<f64>() > gpus_cap {
                problem.add_constraint(
                    on_t.iter().map(|&(p, v)| (v, counts.pods[p].gpus as f64)).chain([(scale, -gpus_cap)]),
                    ComparisonOp::Le,
                    0.0,
                );
            }
            for (s, &vfs) in cap.vfs.iter().enumerate() {
                let vfs_cap = (vfs * nodes_of[t]) as f64;
                let asks: Vec<(Variable, f64)> = on_t
                    .iter()
                    .filter(|&&(p, _)| counts.pods[p].vfs[s] > 0)
                    .map(|&(p, v)| (v, counts.pods[p].vfs[s] as f64))
                    .collect();
                if asks.iter().map(|(_, c)| c).sum::<f64>() > vfs_cap {
                    problem.add_constraint(asks.into_iter().chain([(scale, -vfs_cap)]), ComparisonOp::Le, 0.0);
                }
            }
        }
    }
    let mut solve_options = SolveOptions::default();
    solve_options.time_limit = Some(options.time_limit);
    let (mean_gbps, note) = match problem.solve_with(solve_options) {
        // A round-off allowance keeps the bound a bound.
        Ok(SolveOutcome::Solution(s)) => (Some(s.objective() * (1.0 + 1e-9) + 1e-9), None),
        Ok(SolveOutcome::Interrupted(_)) => (None, Some("stopped at the time limit".to_string())),
        Err(microlp::Error::Infeasible) => {
            (None, Some(format!("no placement of {min_placed} pods fits, even split over node types")))
        }
        Err(e) => (None, Some(e.to_string())),
    };
    Ok(RingBound { min_placed, mean_gbps, solve_ms: started.elapsed().as_secs_f64() * 1000.0, note })
}
