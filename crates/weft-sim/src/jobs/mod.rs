//! Whole jobs in the simulator (issue #27): a cluster with a network ([`network`]), a stream of
//! gangs and single pods ([`stream`]), and four placement policies compared on the same stream:
//!
//! - `weft-gang`: [`weft_gang::plan`] for the whole job at its arrival (tightest domain, node per
//!   member, ring-first GPU sets);
//! - `weft-pods`: today's per-pod weft policy (the node with the best [`weft_alloc::score_node`]
//!   score, ties: fewer free GPUs, then the lower node), member after member, rolled back when a
//!   member does not fit;
//! - `volcano`: Volcano's allocate action with its network-topology-aware plugin ([`volcano`]);
//! - `kueue`: Kueue's Topology-Aware Scheduling assignment ([`kueue`]).
//!
//! The queue is the same for every policy ([`run_jobs`]): a job that does not fit at arrival
//! waits; whenever a job leaves, the waiting jobs are tried again in arrival order and each one
//! that fits is placed (a later job that fits is not held behind an earlier one that does not, as
//! Volcano's session loop and Kueue's `BestEffortFIFO` behave); a job still waiting
//! [`JobRun::patience`] seconds after its arrival gives up and counts as not placed.

pub mod kueue;
pub mod network;
pub mod policies;
pub mod stream;
pub mod volcano;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use weft_alloc::ScoreConfig;
use weft_gang::TierConstraint;

pub use network::{GroupNetwork, NetCluster, NetworkSpec};
pub use stream::{JobGenerate, JobsFile, SimJob};

use crate::SimError;
use crate::cluster::{ClusterSpec, NodeTypeSpec};

/// What a policy is asked to place: `members` pods of `gpus` GPUs, with the job's constraint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobAsk {
    /// Pods.
    pub members: usize,
    /// GPUs per pod.
    pub gpus: usize,
    /// The job's tier constraint, when it states one.
    pub constraint: Option<TierConstraint>,
}

/// Per member, in rank order: its node and its GPUs (a mask).
pub type JobPlacement = Vec<(usize, u128)>;

/// A job placement policy: one decision for a whole job over the cluster's free GPUs
/// (`free[i]`: node i's free GPUs as a mask). None: the job does not fit now. A policy that keeps
/// an index hears of every change through [`JobPolicy::changed`].
pub trait JobPolicy {
    /// Name in reports.
    fn name(&self) -> &'static str;
    /// Place the whole job or nothing.
    fn place(&mut self, net: &NetCluster, free: &[u128], job: &JobAsk) -> Option<JobPlacement>;
    /// Node `node`'s free GPUs went from `before` to `after`.
    fn changed(&mut self, _node: usize, _before: u128, _after: u128) {}
    /// Whether the policy keeps hard constraints (then a job no domain of its highest tier can hold
    /// is not offered to it).
    fn honours_constraints(&self) -> bool {
        true
    }
}

/// The policies of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobPolicyKind {
    /// weft's gang plan.
    WeftGang,
    /// weft's per-pod policy, member by member.
    WeftPods,
    /// Volcano's network-topology-aware allocate path.
    Volcano,
    /// Kueue's TAS.
    Kueue,
}

impl JobPolicyKind {
    /// All, in report order.
    pub const ALL: [JobPolicyKind; 4] =
        [JobPolicyKind::WeftGang, JobPolicyKind::WeftPods, JobPolicyKind::Volcano, JobPolicyKind::Kueue];

    /// Name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            JobPolicyKind::WeftGang => "weft-gang",
            JobPolicyKind::WeftPods => "weft-pods",
            JobPolicyKind::Volcano => "volcano",
            JobPolicyKind::Kueue => "kueue",
        }
    }

    /// The policy over `net`.
    pub fn build(self, net: &NetCluster, config: &ScoreConfig) -> Result<Box<dyn JobPolicy>, SimError> {
        Ok(match self {
            JobPolicyKind::WeftGang => Box::new(policies::WeftGang::new(net, config)?),
            JobPolicyKind::WeftPods => Box::new(policies::WeftPods::new(net, config)),
            JobPolicyKind::Volcano => Box::new(volcano::Volcano::new(net)),
            JobPolicyKind::Kueue => Box::new(kueue::Kueue::new(net)),
        })
    }
}

/// The run's settings shared by every policy.
#[derive(Clone, Debug)]
pub struct JobRun {
    /// Seconds a job waits before it gives up.
    pub patience: f64,
    /// weft's score settings (weft-gang's and weft-pods' GPU sets).
    pub score: ScoreConfig,
}

impl Default for JobRun {
    fn default() -> Self {
        JobRun { patience: 3600.0, score: ScoreConfig::default() }
    }
}

/// One policy's results over a job stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobPolicyReport {
    /// Policy name.
    pub policy: String,
    /// Jobs placed.
    pub placed: usize,
    /// Jobs that gave up waiting.
    pub not_placed: usize,
    /// Gangs (≥ 2 pods) placed, of those offered.
    pub gangs_placed: usize,
    /// GPUs of the jobs placed.
    pub gpus_placed: usize,
    /// Mean wait of the placed jobs from arrival to placement, seconds.
    pub mean_wait_s: f64,
    /// Median wait, seconds.
    pub p50_wait_s: f64,
    /// 90th percentile wait, seconds.
    pub p90_wait_s: f64,
    /// Placed jobs of ≥ 2 GPUs (the ones that communicate).
    pub multi_gpu_jobs: usize,
    /// Of those, the share inside one NVLink domain (one node, or one multi-node domain).
    pub one_nvlink_domain_share: f64,
    /// Of those, the share inside one leaf (one node counts).
    pub one_leaf_share: f64,
    /// Of those, the mean estimated collective bandwidth (the slowest hop), GB/s per direction.
    pub mean_bandwidth_gbps: f64,
    /// 10th percentile of the same.
    pub p10_bandwidth_gbps: f64,
    /// Hard-constrained jobs placed beyond their highest tier (only weft-pods ignores constraints).
    pub constraint_violations: usize,
    /// Wall time of the run, milliseconds.
    pub run_ms: f64,
}

/// One job's outcome under one policy.
#[derive(Clone, Debug, PartialEq)]
pub struct JobOutcome {
    /// Placement time, when placed.
    pub start: Option<f64>,
    /// Its placement.
    pub placement: JobPlacement,
    /// Estimated collective bandwidth (≥ 2 GPUs), GB/s.
    pub bandwidth_gbps: Option<f64>,
    /// The innermost domain holding it.
    pub domain: Option<usize>,
}

/// The job-level report: the cluster, the stream, and one entry per policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobsReport {
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: usize,
    /// The network's tiers, innermost first (`1 (nvidia.com/gpu.clique), 2 (...)`).
    pub tiers: String,
    /// Domains per tier, innermost first (the root last).
    pub domains_per_tier: Vec<usize>,
    /// Jobs offered.
    pub jobs: usize,
    /// Of those, gangs (≥ 2 pods).
    pub gangs: usize,
    /// GPUs asked for by all jobs.
    pub gpus_asked: usize,
    /// One entry per policy, in the order run.
    pub policies: Vec<JobPolicyReport>,
}

/// A departure: (time, job).
struct Due(f64, usize);
impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
    }
}

/// Node `node`'s GPUs in `mask`, ascending.
pub fn mask_gpus(mask: u128) -> Vec<usize> {
    (0..128).filter(|&g| mask >> g & 1 == 1).collect()
}

/// The constraints of a stream, read once.
pub fn asks(jobs: &[SimJob]) -> Result<Vec<JobAsk>, SimError> {
    jobs.iter().map(|j| Ok(JobAsk { members: j.members, gpus: j.gpus, constraint: j.constraint()? })).collect()
}

/// One policy's run: the cluster's free GPUs and the queue's bookkeeping.
struct Sim<'a> {
    net: &'a NetCluster,
    jobs: &'a [SimJob],
    asks: &'a [JobAsk],
    policy: &'a mut dyn JobPolicy,
    free: Vec<u128>,
    /// Per domain, whole pods of each size it holds (`slots[d][g]`). Every policy puts a pod on a
    /// node with its GPUs free, so a job of m pods of g GPUs needs `slots[root][g] ≥ m`, and one
    /// that keeps a hard constraint a domain of its highest tier with that many; a job short of
    /// them is not offered to the policy (which would refuse it).
    slots: Vec<Vec<usize>>,
    /// Per job, the tier its policy must keep it within (None: the whole cluster).
    limits: Vec<Option<usize>>,
    departures: BinaryHeap<Reverse<Due>>,
    /// A departure starts a new epoch; a (pod size, members, constraint) that failed in this epoch
    /// fails again (placements only take GPUs away until the next departure, and every policy's
    /// fit is monotone in the free GPUs), so it is not offered again.
    epoch: u64,
    failed: FxHashMap<(usize, usize, usize), u64>,
    class: Vec<usize>,
    out: Vec<JobOutcome>,
}

impl Sim<'_> {
    fn set(&mut self, node: usize, after: u128) {
        let before = self.free[node];
        let (b, a) = (before.count_ones() as usize, after.count_ones() as usize);
        let mut d = Some(self.net.model.lowest_domain(node));
        while let Some(x) = d {
            for (g, s) in self.slots[x].iter_mut().enumerate().skip(1) {
                *s = *s + a / g - b / g;
            }
            d = self.net.model.domains()[x].parent;
        }
        self.free[node] = after;
        self.policy.changed(node, before, after);
    }

    fn try_job(&mut self, j: usize, now: f64) -> bool {
        let ask = &self.asks[j];
        let m = &self.net.model;
        if ask.gpus >= self.slots[m.root()].len() {
            return false;
        }
        let room = match self.limits[j] {
            Some(t) => m.tier_domains(t).iter().any(|&d| self.slots[d][ask.gpus] >= ask.members),
            None => self.slots[m.root()][ask.gpus] >= ask.members,
        };
        if !room {
            return false;
        }
        let key = (ask.gpus, ask.members, self.class[j]);
        if self.failed.get(&key) == Some(&self.epoch) {
            return false;
        }
        let Some(placement) = self.policy.place(self.net, &self.free, ask) else {
            self.failed.insert(key, self.epoch);
            return false;
        };
        for &(node, mask) in &placement {
            debug_assert_eq!(self.free[node] & mask, mask, "a policy gave GPUs that are not free");
            self.set(node, self.free[node] & !mask);
        }
        self.out[j].start = Some(now);
        self.out[j].placement = placement;
        self.departures.push(Reverse(Due(now + self.jobs[j].duration, j)));
        true
    }

    fn release(&mut self, j: usize) {
        let placement = std::mem::take(&mut self.out[j].placement);
        for &(node, mask) in &placement {
            self.set(node, self.free[node] | mask);
        }
        self.out[j].placement = placement;
    }
}

/// Place `jobs` (in arrival order) under `policy`; one outcome per job. The queue is described in
/// the module docs.
pub fn run_jobs(
    net: &NetCluster,
    jobs: &[SimJob],
    asks: &[JobAsk],
    policy: &mut dyn JobPolicy,
    run: &JobRun,
) -> Vec<JobOutcome> {
    let cluster = &net.cluster;
    let free: Vec<u128> = cluster
        .nodes
        .iter()
        .map(|n| weft_gang::NodeFree::all_gpus(cluster.types[n.node_type].topology.gpu_count()).gpus)
        .collect();
    let sizes = cluster.max_node_gpus() + 1;
    let mut slots = vec![vec![0usize; sizes]; net.model.domains().len()];
    for (n, f) in free.iter().enumerate() {
        let c = f.count_ones() as usize;
        let mut d = Some(net.model.lowest_domain(n));
        while let Some(x) = d {
            for (g, s) in slots[x].iter_mut().enumerate().skip(1) {
                *s += c / g;
            }
            d = net.model.domains()[x].parent;
        }
    }
    let honours = policy.honours_constraints();
    let limits = asks.iter().map(|a| if honours { hard_limit(net, a.constraint.as_ref()) } else { None }).collect();
    let mut classes: Vec<Option<TierConstraint>> = Vec::new();
    let class: Vec<usize> = asks
        .iter()
        .map(|a| match classes.iter().position(|c| *c == a.constraint) {
            Some(i) => i,
            None => {
                classes.push(a.constraint.clone());
                classes.len() - 1
            }
        })
        .collect();
    let out = jobs
        .iter()
        .map(|_| JobOutcome { start: None, placement: Vec::new(), bandwidth_gbps: None, domain: None })
        .collect();
    let mut sim = Sim {
        net,
        jobs,
        asks,
        policy,
        free,
        slots,
        limits,
        departures: BinaryHeap::new(),
        epoch: 0,
        failed: FxHashMap::default(),
        class,
        out,
    };
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut next = 0usize;
    loop {
        let arrival = jobs.get(next).map(|j| j.arrival);
        let departure = sim.departures.peek().map(|Reverse(d)| d.0);
        let (now, leaving) = match (arrival, departure) {
            (None, None) => break,
            (Some(a), Some(d)) if d <= a => (d, true),
            (None, Some(d)) => (d, true),
            (Some(a), _) => (a, false),
        };
        if leaving {
            // Every departure due now, then the queue once.
            while let Some(Reverse(Due(t, j))) = sim.departures.peek() {
                if *t > now {
                    break;
                }
                let j = *j;
                sim.departures.pop();
                sim.release(j);
            }
            sim.epoch += 1;
            queue.retain(|&j| jobs[j].arrival + run.patience >= now);
            let waiting: Vec<usize> = queue.drain(..).collect();
            for j in waiting {
                if !sim.try_job(j, now) {
                    queue.push_back(j);
                }
            }
        } else {
            let j = next;
            next += 1;
            if !sim.try_job(j, now) {
                queue.push_back(j);
            }
        }
    }
    let mut out = sim.out;
    for o in &mut out {
        if o.start.is_some() {
            o.bandwidth_gbps = bandwidth(net, &o.placement);
            let nodes: Vec<usize> = o.placement.iter().map(|&(n, _)| n).collect();
            o.domain = Some(net.common_domain(&nodes));
        }
    }
    out
}

/// A placed job's estimated collective bandwidth, GB/s per direction: its slowest hop. On each node
/// the best ring over the job's GPUs there (weft's bottleneck ring measure); between nodes the
/// link of their innermost common domain ([`NetCluster::hop_gbps`]). None for a job of one GPU.
pub fn bandwidth(net: &NetCluster, placement: &JobPlacement) -> Option<f64> {
    let mut per_node: Vec<(usize, u128)> = Vec::new();
    for &(n, m) in placement {
        match per_node.iter_mut().find(|(x, _)| *x == n) {
            Some((_, acc)) => *acc |= m,
            None => per_node.push((n, m)),
        }
    }
    let gpus: u32 = per_node.iter().map(|(_, m)| m.count_ones()).sum();
    if gpus < 2 {
        return None;
    }
    let mut slowest = f64::INFINITY;
    for &(n, m) in &per_node {
        if m.count_ones() >= 2 {
            let topo = &net.cluster.types[net.cluster.nodes[n].node_type].topology;
            let ring = topo.ring_bandwidth(&mask_gpus(m)).map_or(0.0, |r| r.gbps);
            slowest = slowest.min(ring);
        }
    }
    if per_node.len() > 1 {
        let nodes: Vec<usize> = per_node.iter().map(|&(n, _)| n).collect();
        let d = net.common_domain(&nodes);
        let hop = nodes.iter().map(|&n| net.hop_gbps(d, n)).fold(f64::INFINITY, f64::min);
        slowest = slowest.min(hop);
    }
    Some(slowest)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    // Nearest rank.
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The tier index a hard constraint allows at most (None: unconstrained or soft).
pub fn hard_limit(net: &NetCluster, c: Option<&TierConstraint>) -> Option<usize> {
    let c = c?;
    if c.mode != weft_gang::Mode::Hard {
        return None;
    }
    let tier = c.highest.as_ref()?;
    match net.model.tier_index(tier) {
        // A number below every tier reads as the innermost tier here.
        None if matches!(tier, weft_gang::TierRef::Number(_)) => Some(0),
        found => found,
    }
}

/// Summarise one policy's outcomes.
pub fn summarise(
    net: &NetCluster,
    jobs: &[SimJob],
    asks: &[JobAsk],
    name: &str,
    out: &[JobOutcome],
    run_ms: f64,
) -> JobPolicyReport {
    let mut waits = Vec::new();
    let mut bws = Vec::new();
    let (mut placed, mut gangs, mut gpus, mut one_domain, mut one_leaf, mut violations) = (0, 0, 0, 0, 0, 0);
    for ((j, a), o) in jobs.iter().zip(asks).zip(out) {
        let Some(start) = o.start else { continue };
        placed += 1;
        gangs += usize::from(j.members > 1);
        gpus += j.total_gpus();
        waits.push(start - j.arrival);
        if let (Some(limit), Some(d)) = (hard_limit(net, a.constraint.as_ref()), o.domain) {
            let single = o.placement.iter().all(|&(n, _)| n == o.placement[0].0);
            if !single && net.model.domains()[d].tier > limit {
                violations += 1;
            }
        }
        let Some(bw) = o.bandwidth_gbps else { continue };
        bws.push(bw);
        let single = o.placement.iter().all(|&(n, _)| n == o.placement[0].0);
        let tier = o.domain.map(|d| net.model.domains()[d].tier);
        if single || (tier.is_some() && tier == net.clique_tier) {
            one_domain += 1;
        }
        if single || tier.is_some_and(|t| t <= net.leaf_tier) {
            one_leaf += 1;
        }
    }
    waits.sort_by(f64::total_cmp);
    bws.sort_by(f64::total_cmp);
    let share = |x: usize| if bws.is_empty() { 0.0 } else { x as f64 / bws.len() as f64 };
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    JobPolicyReport {
        policy: name.to_string(),
        placed,
        not_placed: jobs.len() - placed,
        gangs_placed: gangs,
        gpus_placed: gpus,
        mean_wait_s: mean(&waits),
        p50_wait_s: percentile(&waits, 0.5),
        p90_wait_s: percentile(&waits, 0.9),
        multi_gpu_jobs: bws.len(),
        one_nvlink_domain_share: share(one_domain),
        one_leaf_share: share(one_leaf),
        mean_bandwidth_gbps: mean(&bws),
        p10_bandwidth_gbps: percentile(&bws, 0.1),
        constraint_violations: violations,
        run_ms,
    }
}

/// Run every policy over the same stream (policies in parallel threads, one each, up to the
/// machine's cores) and report.
pub fn simulate_jobs(
    net: &NetCluster,
    jobs: &[SimJob],
    kinds: &[JobPolicyKind],
    run: &JobRun,
) -> Result<JobsReport, SimError> {
    let asks = asks(jobs)?;
    for a in &asks {
        if let Some(c) = &a.constraint
            && let Some(weft_gang::TierRef::Name(n)) = &c.highest
            && net.model.tier_by_name(n).is_none()
        {
            return Err(SimError::Format {
                source_name: "jobs".into(),
                message: format!(
                    "a job's topology names tier '{n}'; the cluster's tiers are {}",
                    net.model.tiers_text()
                ),
            });
        }
    }
    let mut policies: Vec<Box<dyn JobPolicy + Send>> = Vec::new();
    for k in kinds {
        policies.push(build_send(*k, net, &run.score)?);
    }
    let reports: Vec<JobPolicyReport> = std::thread::scope(|s| {
        let handles: Vec<_> = policies
            .into_iter()
            .map(|mut p| {
                let asks = &asks;
                s.spawn(move || {
                    let started = Instant::now();
                    let out = run_jobs(net, jobs, asks, p.as_mut(), run);
                    let ms = started.elapsed().as_secs_f64() * 1000.0;
                    summarise(net, jobs, asks, p.name(), &out, ms)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a policy thread panicked")).collect()
    });
    let m = &net.model;
    Ok(JobsReport {
        nodes: net.cluster.nodes.len(),
        gpus: net.cluster.total_gpus(),
        tiers: m.tiers_text(),
        domains_per_tier: (0..m.tiers().len()).map(|t| m.tier_domains(t).len()).collect(),
        jobs: jobs.len(),
        gangs: jobs.iter().filter(|j| j.members > 1).count(),
        gpus_asked: jobs.iter().map(SimJob::total_gpus).sum(),
        policies: reports,
    })
}

fn build_send(k: JobPolicyKind, net: &NetCluster, config: &ScoreConfig) -> Result<Box<dyn JobPolicy + Send>, SimError> {
    Ok(match k {
        JobPolicyKind::WeftGang => Box::new(policies::WeftGang::new(net, config)?),
        JobPolicyKind::WeftPods => Box::new(policies::WeftPods::new(net, config)),
        JobPolicyKind::Volcano => Box::new(volcano::Volcano::new(net)),
        JobPolicyKind::Kueue => Box::new(kueue::Kueue::new(net)),
    })
}

/// The built-in job scenario's cluster: `racks` GB200 NVL72 racks (18 trays each, one NVLink
/// domain; two racks per leaf) and `h100` HGX H100 nodes (leaves of 32), four leaves per spine,
/// 400 Gb/s NICs (50 GB/s), leaf and spine uplinks 2:1 oversubscribed.
pub fn builtin_scenario(racks: usize, h100: usize) -> (ClusterSpec, NetworkSpec) {
    let tray = weft_gang::builtin::GB200_NVL72_TRAY;
    let spec = ClusterSpec {
        api_version: crate::API_VERSION.into(),
        kind: "SimCluster".into(),
        node_types: vec![
            NodeTypeSpec {
                vfs_per_nic: Some(0),
                ..NodeTypeSpec { name: "nvl72".into(), ..NodeTypeSpec::builtin(tray, racks * 18) }
            },
            NodeTypeSpec {
                vfs_per_nic: Some(0),
                ..NodeTypeSpec { name: "h100".into(), ..NodeTypeSpec::builtin("hgx-h100", h100) }
            },
        ],
    };
    let network = NetworkSpec {
        nic_gbps: 50.0,
        spine_oversubscription: 2.0,
        core_oversubscription: 2.0,
        leaves_per_spine: 4,
        groups: vec![
            GroupNetwork {
                node_type: "nvl72".into(),
                nodes_per_leaf: 36,
                nodes_per_nvlink_domain: Some(18),
                nvlink_domain_gbps: Some(900.0),
            },
            GroupNetwork {
                node_type: "h100".into(),
                nodes_per_leaf: 32,
                nodes_per_nvlink_domain: None,
                nvlink_domain_gbps: None,
            },
        ],
    };
    (spec, network)
}

/// The default built-in scenario: 8 NVL72 racks (144 trays, 576 GPUs) and 128 H100 nodes (1,024
/// GPUs): 4 + 4 leaves, 2 spines.
pub fn default_scenario() -> (ClusterSpec, NetworkSpec) {
    builtin_scenario(8, 128)
}
