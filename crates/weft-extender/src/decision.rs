//! The extender's decisions, pure: given what the pod asks for (GPUs, and SR-IOV VFs by physnet)
//! and, per candidate node, its prepared topology and the GPUs and VFs in use, which nodes pass the
//! filter and how each scores. No I/O; the HTTP layer ([`crate::server`]) and benchmarks call these
//! directly.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use fnv::FnvHashMap;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use weft_alloc::{NodeFit, PreparedNode, ScoreCache};
use weft_net::joint::{VfAsk, decide, joint_score};
use weft_record::vf_usage::pod_vf_requests;
use weft_resources::RequestError;
use weft_topology::NodeTopology;

use crate::config::ExtenderConfig;
use crate::wire::{MAX_EXTENDER_PRIORITY, MIN_EXTENDER_PRIORITY};

/// When a request's work must stop: decisions check it between nodes, so a request that ran past
/// its time stops computing instead of holding a worker after its answer was given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// No deadline.
    pub const NEVER: Deadline = Deadline(None);

    /// Stop at `at`.
    pub fn at(at: Instant) -> Deadline {
        Deadline(Some(at))
    }

    /// Whether the deadline has passed.
    pub fn passed(&self) -> bool {
        self.0.is_some_and(|at| Instant::now() >= at)
    }
}

/// The deadline passed before the decision was complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the request's time ran out after {done} of {total} nodes")]
pub struct Expired {
    /// Nodes decided before the deadline.
    pub done: usize,
    /// Nodes in the request.
    pub total: usize,
}

/// What a pod asks for that the extender decides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodAsk {
    /// GPUs.
    pub gpus: u64,
    /// SR-IOV VFs by physnet (`sriov.weft.io/<physnet>`); physnets asked none of are absent.
    pub vfs: VfAsk,
}

impl PodAsk {
    /// A pod that asks for `gpus` GPUs and no VFs.
    pub fn gpus(gpus: u64) -> PodAsk {
        PodAsk { gpus, vfs: VfAsk::new() }
    }

    /// What `pod` asks for: `gpu_resource` GPUs and every `sriov.weft.io/<physnet>`, counted as the
    /// kubelet counts them.
    pub fn of(pod: &Pod, gpu_resource: &str) -> Result<PodAsk, RequestError> {
        let gpus = weft_resources::pod_request(pod, gpu_resource)?;
        let vfs = pod_vf_requests(pod)?;
        Ok(PodAsk { gpus, vfs: vfs.into_iter().map(|(p, n)| (p, usize::try_from(n).unwrap_or(usize::MAX))).collect() })
    }

    /// Whether the pod asks for nothing the extender decides.
    pub fn is_empty(&self) -> bool {
        self.gpus == 0 && self.vfs.values().all(|&n| n == 0)
    }
}

/// A node's SR-IOV VFs as decisions see them.
#[derive(Clone, Copy, Debug)]
pub struct NodeVfs<'a> {
    /// The node's topology, which places its VFs (`vfs()`, each beside its NIC).
    pub topology: &'a NodeTopology,
    /// PCI addresses of the VFs held by pods or reserved.
    pub used: &'a BTreeSet<String>,
}

impl NodeVfs<'_> {
    /// VFs of `physnet` on the node, and how many of them are free.
    pub fn count(&self, physnet: &str) -> (usize, usize) {
        let of = self.topology.vfs().iter().filter(|v| v.physnet.as_deref() == Some(physnet));
        of.fold((0, 0), |(total, free), v| (total + 1, free + usize::from(!self.used.contains(&v.pci_address))))
    }

    /// Whether VF `pci_address` is free.
    pub fn is_free(&self, pci_address: &str) -> bool {
        !self.used.contains(pci_address)
    }
}

/// What a node's joint GPU + VF score depends on besides its GPUs: for each asked physnet, how many
/// free VFs each NIC offers and that NIC's relations to every GPU. Nodes of one kind with the same
/// free VFs per NIC share it whatever their VFs' addresses (which only break ties between equally
/// near VFs), so the joint decision is made once per kind of node, as the GPU score is. A 64-bit
/// hash; a collision could only mis-rank a node, never bind a wrong VF (bind decides afresh).
fn vf_signature(v: &NodeVfs<'_>, ask: &VfAsk) -> u64 {
    use std::hash::{Hash, Hasher};
    let t = v.topology;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (physnet, n) in ask {
        physnet.hash(&mut h);
        n.hash(&mut h);
        let mut per_nic = vec![0usize; t.nics.len()];
        for (i, vf) in t.vfs().iter().enumerate() {
            if vf.physnet.as_deref() == Some(physnet.as_str()) && v.is_free(&vf.pci_address) {
                per_nic[t.vf_nic(i)] += 1;
            }
        }
        for (nic, count) in per_nic.iter().enumerate().filter(|(_, c)| **c > 0) {
            (nic, count).hash(&mut h);
            for g in 0..t.gpu_count() {
                t.nic_link(g, nic).map(|r| r.token()).hash(&mut h);
            }
        }
    }
    h.finish()
}

/// Why a node cannot give the pod its VFs, `None` when it can: unresolvable (`true`) when the node
/// has too few VFs of a physnet at all, else a failure preemption may mend.
fn vf_shortage(ask: &VfAsk, vfs: Option<&NodeVfs<'_>>) -> Option<(bool, String)> {
    ask.iter().filter(|(_, n)| **n > 0).find_map(|(physnet, &n)| {
        let (total, free) = vfs.map_or((0, 0), |v| v.count(physnet));
        if total < n {
            Some((true, format!("node has {total} VFs of physnet {physnet}; pod asks for {n}")))
        } else if free < n {
            Some((false, format!("not enough free VFs of physnet {physnet}; pod asks for {n}")))
        } else {
            None
        }
    })
}

/// What the extender knows about one candidate node.
#[derive(Clone, Copy, Debug)]
pub enum NodeState<'a> {
    /// The node's topology was read; `used` has bit `i` set when GPU `i` is held by a pod.
    Known {
        /// The prepared topology.
        prepared: &'a PreparedNode,
        /// GPUs in use, as a mask.
        used: u128,
        /// Its SR-IOV VFs, when it publishes any.
        vfs: Option<NodeVfs<'a>>,
    },
    /// The node cannot be judged (no or unreadable topology annotation, not in the cache).
    Unknown {
        /// Why.
        reason: &'a str,
    },
}

impl NodeState<'_> {
    /// Free GPU indices, ascending (empty for an unknown node).
    pub fn free(&self) -> Vec<usize> {
        match *self {
            NodeState::Known { prepared, used, .. } => {
                (0..prepared.len()).filter(|&g| used & (1u128 << g) == 0).collect()
            }
            NodeState::Unknown { .. } => Vec::new(),
        }
    }
}

/// The filter's answer for one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The node passes. `note` says why when it passed without being judged.
    Pass {
        /// Why it passed unjudged, if so.
        note: Option<String>,
    },
    /// The node fails now; freeing GPUs (preemption) may help. Goes to `FailedNodes`.
    Fail(String),
    /// The node can never run the pod; preemption cannot help. Goes to `FailedAndUnresolvableNodes`.
    Unresolvable(String),
}

impl Verdict {
    /// Whether the node passes.
    pub fn passes(&self) -> bool {
        matches!(self, Verdict::Pass { .. })
    }
}

/// Filter the candidates for a pod requesting `request` GPUs and no VFs ([`filter_pod`]).
pub fn filter(request: u64, nodes: &[NodeState<'_>], cfg: &ExtenderConfig) -> Vec<Verdict> {
    filter_pod(&PodAsk::gpus(request), nodes, cfg)
}

/// Filter the candidates for a pod asking for `ask`; one verdict per candidate, in order.
///
/// - nothing asked: every node passes (topology does not constrain the pod).
/// - unknown topology: passes with a note unless `cfg.require_topology`, then unresolvable.
/// - fewer GPUs on the node than requested: unresolvable (preemption cannot add GPUs).
/// - fewer free GPUs than requested: fails with a reason that names the request but not the
///   node's occupancy (reasons end up in pod events, which the pod's owner reads).
/// - VFs: fewer VFs of an asked physnet on the node than asked (none published counts as none):
///   unresolvable; fewer free: fails.
pub fn filter_pod(ask: &PodAsk, nodes: &[NodeState<'_>], cfg: &ExtenderConfig) -> Vec<Verdict> {
    nodes.iter().map(|node| filter_one(ask, node, cfg)).collect()
}

fn filter_one(ask: &PodAsk, node: &NodeState<'_>, cfg: &ExtenderConfig) -> Verdict {
    if ask.is_empty() {
        return Verdict::Pass { note: None };
    }
    let request = ask.gpus;
    match *node {
        NodeState::Unknown { reason } if cfg.require_topology => {
            Verdict::Unresolvable(format!("{reason}; GPU topology is required (--require-topology)"))
        }
        NodeState::Unknown { reason } => Verdict::Pass { note: Some(format!("{reason}; passed unjudged")) },
        NodeState::Known { prepared, used, vfs } => {
            let total = prepared.len() as u64;
            let free = total - u64::from((used & mask(prepared.len())).count_ones());
            if total < request {
                Verdict::Unresolvable(format!("node has {total} GPUs; pod requests {request}"))
            } else if free < request {
                Verdict::Fail(format!("not enough free GPUs; pod requests {request}"))
            } else {
                match vf_shortage(&ask.vfs, vfs.as_ref()) {
                    Some((true, why)) => Verdict::Unresolvable(why),
                    Some((false, why)) => Verdict::Fail(why),
                    None => Verdict::Pass { note: None },
                }
            }
        }
    }
}

fn mask(n: usize) -> u128 {
    if n >= 128 { u128::MAX } else { (1u128 << n) - 1 }
}

/// One node's priority.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeScore {
    /// Extender score, [`MIN_EXTENDER_PRIORITY`]..=[`MAX_EXTENDER_PRIORITY`].
    pub score: i64,
    /// weft-alloc's fit (score 1..=100 and the GPU set) when the node was scored; for a pod that
    /// asks for VFs too, its score is the joint score.
    pub fit: Option<Arc<NodeFit>>,
    /// Why the node got this score when it was not scored from its topology.
    pub reason: Option<String>,
}

/// Map weft-alloc's node score (1..=100) to the extender range 0..=10: `round(score / 10)`, halves
/// up. Ten points of resolution become one, so nodes within a band tie; scores 1–4 map to 0. Used
/// when every fitting candidate has the same score (see [`spread`]).
pub fn to_extender_priority(score: u8) -> i64 {
    ((i64::from(score) + 5) / 10).clamp(MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY)
}

/// Raw-score distance below which differences are not stretched (see [`spread`]).
pub const MIN_SPREAD: f64 = 10.0;

/// The extender priority of a fitting node with raw score `raw` among fitting candidates whose raw
/// scores span `lo..=hi`: the best gets 10, and each raw point below it costs `9 / max(hi − lo,
/// MIN_SPREAD)`, rounded, so the worst of a wide spread gets 1 and a fitting node never gets 0 (0 is
/// for nodes that cannot take the pod). The whole 1–10 range is used whatever band the candidates'
/// raw scores fall in, so good nodes a point apart are not collapsed into one band; differences
/// smaller than `MIN_SPREAD` raw points are never stretched beyond one priority step per raw point.
/// When all fitting candidates score the same, the absolute [`to_extender_priority`] is kept.
pub fn spread(raw: u8, lo: u8, hi: u8) -> i64 {
    if lo == hi {
        return to_extender_priority(raw).max(1);
    }
    let span = f64::from(hi - lo).max(MIN_SPREAD);
    let below = f64::from(hi.saturating_sub(raw));
    (MAX_EXTENDER_PRIORITY - (9.0 * below / span).round() as i64).clamp(1, MAX_EXTENDER_PRIORITY)
}

/// Score the candidates for a pod requesting `request` GPUs; one score per candidate, in order.
///
/// - `request == 0`: every node gets `cfg.neutral_score` (the same for all, so the extender does not
///   change the ranking).
/// - unknown topology, or too few free GPUs: 0 with a reason.
/// - otherwise `weft_alloc::score_node` over the free GPUs, mapped to 1–10 relative to the other
///   fitting candidates by [`spread`].
///
/// Nodes with the same topology and the same GPUs in use are scored once (a `ScoreCache` local to
/// the call). [`prioritize_with`] keeps that cache across calls.
pub fn prioritize(request: u64, nodes: &[NodeState<'_>], cfg: &ExtenderConfig) -> Vec<NodeScore> {
    let mut cache = ScoreCache::with_capacity(nodes.len().max(1));
    prioritize_with(request, nodes, cfg, &mut cache)
}

/// [`prioritize`] with a caller-owned `ScoreCache` (best-effort sets keyed by topology, free GPUs
/// and request size), so repeated requests over a cluster of few topologies cost hash lookups.
pub fn prioritize_with(
    request: u64,
    nodes: &[NodeState<'_>],
    cfg: &ExtenderConfig,
    cache: &mut ScoreCache,
) -> Vec<NodeScore> {
    // Without a deadline the scoring always completes.
    prioritize_until(request, nodes, cfg, cache, Deadline::NEVER).unwrap_or_default()
}

/// [`prioritize_with`] that stops with [`Expired`] once `deadline` passes (checked before each
/// node).
pub fn prioritize_until(
    request: u64,
    nodes: &[NodeState<'_>],
    cfg: &ExtenderConfig,
    cache: &mut ScoreCache,
    deadline: Deadline,
) -> Result<Vec<NodeScore>, Expired> {
    prioritize_pod_until(&PodAsk::gpus(request), nodes, cfg, cache, deadline)
}

/// A kind of node's GPU fit in one request: the topology it was made for, and the fit.
type KindFit<'a> = (&'a PreparedNode, Result<Arc<NodeFit>, String>);

/// Scores the candidates for a pod asking for `ask`, as [`prioritize`] does for GPUs, with VFs:
///
/// - a node without enough free VFs of an asked physnet: 0 with a reason;
/// - a pod that asks for VFs and no GPUs: `cfg.neutral_score` on every node that has them (no GPU
///   for the VFs to sit near);
/// - GPUs and VFs: the raw score is [`weft_net::joint::joint_score`] of the GPU score and the
///   joint decision's share of VFs under a GPU's PCIe switch, so among nodes equally good for the
///   GPUs, the ones where GPUDirect RDMA pays come first;
/// - GPUs and no VFs, with `cfg.spare_vfs`: when the fitting candidates include nodes with no VF
///   free and nodes with VFs free, the first get 6–10 and the second 1–5 (each spread over its own raw scores): the GPUs
///   beside free VFs are what pods asking VFs are short of (docs/gpu-placement.md, "GPUs and VFs
///   packed together", the rule `weft simulate` measured).
pub fn prioritize_pod_until(
    ask: &PodAsk,
    nodes: &[NodeState<'_>],
    cfg: &ExtenderConfig,
    cache: &mut ScoreCache,
    deadline: Deadline,
) -> Result<Vec<NodeScore>, Expired> {
    let request = ask.gpus;
    if request == 0 {
        let score = cfg.neutral_score.clamp(MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY);
        let neutral = || NodeScore { score, fit: None, reason: Some("pod requests no GPUs; neutral score".into()) };
        return Ok(nodes
            .iter()
            .map(|node| {
                let vfs = match node {
                    NodeState::Known { vfs, .. } => vfs.as_ref(),
                    NodeState::Unknown { .. } => None,
                };
                match vf_shortage(&ask.vfs, vfs) {
                    Some((_, why)) => NodeScore { score: MIN_EXTENDER_PRIORITY, fit: None, reason: Some(why) },
                    None => neutral(),
                }
            })
            .collect());
    }
    let count = usize::try_from(request).unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(nodes.len());
    // Joint scores by (GPU topology, GPUs in use, VF signature): made once per kind of node.
    let mut joint: HashMap<(u64, u128, u64), u8> = HashMap::new();
    // GPU fits by (topology fingerprint, GPUs in use), made once per kind of node in this request;
    // a hit is checked to be the same topology, so a fingerprint collision is scored apart.
    let mut fits: FnvHashMap<(u64, u128), Vec<KindFit<'_>>> = FnvHashMap::default();
    for (i, node) in nodes.iter().enumerate() {
        // The clock is read once per 64 nodes.
        if i % 64 == 0 && deadline.passed() {
            return Err(Expired { done: i, total: nodes.len() });
        }
        out.push(match *node {
            NodeState::Unknown { reason } => {
                NodeScore { score: MIN_EXTENDER_PRIORITY, fit: None, reason: Some(format!("{reason}; not scored")) }
            }
            NodeState::Known { prepared, used, vfs } => {
                let total = prepared.len() as u64;
                let free_count = total - u64::from((used & mask(prepared.len())).count_ones());
                if free_count < request {
                    NodeScore {
                        score: MIN_EXTENDER_PRIORITY,
                        fit: None,
                        reason: Some(format!("{free_count} of {total} GPUs free; pod requests {request}")),
                    }
                } else if let Some((_, why)) = vf_shortage(&ask.vfs, vfs.as_ref()) {
                    NodeScore { score: MIN_EXTENDER_PRIORITY, fit: None, reason: Some(why) }
                } else {
                    let in_use = used & mask(prepared.len());
                    let kinds = fits.entry((prepared.fingerprint(), in_use)).or_default();
                    let known = kinds.iter().find(|(p, _)| std::ptr::eq(*p, prepared) || p.same_topology(prepared));
                    let scored = match known {
                        Some((_, fit)) => fit.clone(),
                        None => {
                            let fit = cache.score(prepared, &node.free(), count, &cfg.score_config);
                            let fit = fit.map(Arc::new).map_err(|e| e.to_string());
                            kinds.push((prepared, fit.clone()));
                            fit
                        }
                    };
                    match scored {
                        // Mapped to 1–10 below, once every candidate is scored.
                        Ok(mut fit) => {
                            if let Some(v) = vfs.filter(|_| !ask.vfs.is_empty()) {
                                let free = node.free();
                                let key =
                                    (prepared.fingerprint(), used & mask(prepared.len()), vf_signature(&v, &ask.vfs));
                                let gpu_score = fit.score;
                                Arc::make_mut(&mut fit).score = *joint.entry(key).or_insert_with(|| {
                                    // The filter's counts guarantee the VFs; a failure leaves the GPU score.
                                    decide(prepared, v.topology, &free, &|a| v.is_free(a), count, &ask.vfs, &[])
                                        .map_or(gpu_score, |choice| joint_score(gpu_score, &choice))
                                });
                            }
                            NodeScore { score: 0, fit: Some(fit), reason: None }
                        }
                        Err(e) => NodeScore { score: MIN_EXTENDER_PRIORITY, fit: None, reason: Some(e) },
                    }
                }
            }
        });
    }
    // A pod that asks no VFs leaves the GPUs beside free VFs to the pods that need them: while some
    // fitting node has no VF free, the nodes with VFs free rank below every one of them.
    let spares: Vec<bool> = nodes
        .iter()
        .map(|n| match n {
            NodeState::Known { vfs: Some(v), .. } => cfg.spare_vfs && ask.vfs.is_empty() && has_free_vf(v),
            _ => false,
        })
        .collect();
    let tiered = out.iter().zip(&spares).any(|(s, &sp)| s.fit.is_some() && sp)
        && out.iter().zip(&spares).any(|(s, &sp)| s.fit.is_some() && !sp);
    // Untiered, one pass spreads every candidate together.
    let tiers: &[bool] = if tiered { &[false, true] } else { &[false] };
    for &tier in tiers {
        let in_tier = |sp: bool| !tiered || sp == tier;
        let raws = out.iter().zip(&spares).filter(|(_, sp)| in_tier(**sp)).filter_map(|(s, _)| s.fit.as_ref());
        let (lo, hi) = raws.map(|f| f.score).fold((u8::MAX, u8::MIN), |(lo, hi), r| (lo.min(r), hi.max(r)));
        for (s, &sp) in out.iter_mut().zip(&spares) {
            if let (Some(fit), true) = (&s.fit, in_tier(sp)) {
                s.score = if tiered { tier_band(spread(fit.score, lo, hi), tier) } else { spread(fit.score, lo, hi) };
            }
        }
    }
    Ok(out)
}

/// Whether any of the node's VFs is free.
fn has_free_vf(v: &NodeVfs<'_>) -> bool {
    v.topology.vfs().iter().any(|vf| v.is_free(&vf.pci_address))
}

/// A 1–10 priority squeezed into the band of its tier: 6–10 for the nodes without a VF free, 1–5
/// for those with (see [`prioritize_pod_until`]).
fn tier_band(priority: i64, spares_vfs: bool) -> i64 {
    let within = (priority.clamp(1, MAX_EXTENDER_PRIORITY) - 1) * 4 / 9;
    if spares_vfs { 1 + within } else { 6 + within }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vf_node(near: bool, per_nic: usize) -> NodeTopology {
        let nic = if near { weft_topology::PcieRelation::Pix } else { weft_topology::PcieRelation::Node };
        weft_testkit::two_switches("t", nic, per_nic)
    }

    #[test]
    fn shared_joint_scores_equal_the_ones_each_node_gets_alone() {
        let kinds = [vf_node(true, 2), vf_node(false, 2), vf_node(true, 1)];
        let prepared: Vec<PreparedNode> = kinds.iter().map(|t| PreparedNode::new(t).expect("prepared")).collect();
        let used_vfs: Vec<BTreeSet<String>> = [vec![], vec!["0000:0c:00.2"], vec!["0000:0c:00.2", "0000:0c:00.3"]]
            .iter()
            .map(|v| v.iter().map(|s| s.to_string()).collect())
            .collect();
        let mut nodes = Vec::new();
        for (k, t) in kinds.iter().enumerate() {
            for (g, used) in [0u128, 0b1, 0b11, 0b1100].into_iter().enumerate() {
                for vfs in &used_vfs {
                    nodes.push((
                        k,
                        g,
                        NodeState::Known {
                            prepared: &prepared[k],
                            used,
                            vfs: Some(NodeVfs { topology: t, used: vfs }),
                        },
                    ));
                }
            }
        }
        let ask = PodAsk { gpus: 2, vfs: VfAsk::from([("fabric".to_string(), 1)]) };
        let cfg = ExtenderConfig::default();
        let states: Vec<NodeState<'_>> = nodes.iter().map(|n| n.2).collect();
        let mut cache = ScoreCache::with_capacity(8);
        let together = prioritize_pod_until(&ask, &states, &cfg, &mut cache, Deadline::NEVER).expect("no deadline");
        let raw = |s: &NodeScore| s.fit.as_ref().map(|f| f.score);
        let mut differ = BTreeSet::new();
        for (state, shared) in states.iter().zip(&together) {
            let mut fresh = ScoreCache::with_capacity(1);
            let alone = prioritize_pod_until(&ask, &[*state], &cfg, &mut fresh, Deadline::NEVER).expect("no deadline");
            assert_eq!(raw(shared), raw(&alone[0]));
            differ.insert(raw(shared));
        }
        assert!(differ.len() >= 2, "near and far VFs both occur: {differ:?}");
    }

    /// A GPU-only pod ranks a node whose VFs are all taken above one with a VF free, whatever
    /// their raw scores; a pod asking VFs ranks them by score alone.
    #[test]
    fn a_pod_without_vfs_ranks_the_nodes_with_free_vfs_last() {
        let t = vf_node(true, 1);
        let prepared = PreparedNode::new(&t).expect("prepared");
        let all_vfs: BTreeSet<String> = t.vfs().iter().map(|v| v.pci_address.clone()).collect();
        let none = BTreeSet::new();
        // Node 0: GPUs 2,3 busy (a PIX pair left), every VF free. Node 1: GPUs 0,1 busy, no VF free.
        // Node 2: as node 0. Raw scores alike; node 1 must come first.
        let states = [
            NodeState::Known { prepared: &prepared, used: 0b1100, vfs: Some(NodeVfs { topology: &t, used: &none }) },
            NodeState::Known { prepared: &prepared, used: 0b0011, vfs: Some(NodeVfs { topology: &t, used: &all_vfs }) },
            NodeState::Known { prepared: &prepared, used: 0b1100, vfs: Some(NodeVfs { topology: &t, used: &none }) },
        ];
        // Off by default: the raw scores alone, all alike here.
        let mut cache = ScoreCache::with_capacity(8);
        let plain = ExtenderConfig::default();
        let off = prioritize_pod_until(&PodAsk::gpus(2), &states, &plain, &mut cache, Deadline::NEVER).unwrap();
        assert!(off.iter().all(|s| s.score == off[0].score), "{off:?}");
        let cfg = ExtenderConfig { spare_vfs: true, ..ExtenderConfig::default() };
        let gpu_only = prioritize_pod_until(&PodAsk::gpus(2), &states, &cfg, &mut cache, Deadline::NEVER).unwrap();
        let scores: Vec<i64> = gpu_only.iter().map(|s| s.score).collect();
        assert!(scores[1] >= 6 && scores[0] <= 5 && scores[2] <= 5, "{scores:?}");
        let ask = PodAsk { gpus: 2, vfs: VfAsk::from([("fabric".to_string(), 1)]) };
        let with_vf = prioritize_pod_until(&ask, &states, &cfg, &mut cache, Deadline::NEVER).unwrap();
        assert_eq!(with_vf[1].score, MIN_EXTENDER_PRIORITY, "no VF free: {with_vf:?}");
        assert!(with_vf[0].score >= 6, "{with_vf:?}");
        // Nodes all alike in VFs: the plain spread, no band.
        let plain =
            prioritize_pod_until(&PodAsk::gpus(2), &[states[0], states[2]], &cfg, &mut cache, Deadline::NEVER).unwrap();
        let raw = plain[0].fit.as_ref().unwrap().score;
        assert_eq!((plain[0].score, plain[1].score), (spread(raw, raw, raw), spread(raw, raw, raw)));
    }

    #[test]
    fn the_spread_gives_the_best_10_keeps_fitting_nodes_above_0_and_separates_close_ones() {
        // A wide spread uses the whole range.
        assert_eq!(spread(95, 40, 95), 10);
        assert_eq!(spread(40, 40, 95), 1);
        assert_eq!(spread(67, 40, 95), 5, "28 of 55 points below the best: 9·28/55 = 4.6 steps");
        // Close good nodes stay apart (the absolute mapping put 91 and 94 both at 9).
        assert_eq!(spread(94, 91, 94), 10);
        assert_eq!(spread(93, 91, 94), 9);
        assert_eq!(spread(91, 91, 94), 7);
        assert_ne!(to_extender_priority(91), 10);
        // All alike: the absolute score, never 0 for a fitting node.
        assert_eq!(spread(62, 62, 62), 6);
        assert_eq!(spread(3, 3, 3), 1);
        // Monotone over every pair of raw scores in every range.
        for lo in (1..=100u8).step_by(7) {
            for hi in lo..=100 {
                let mut last = 0;
                for raw in lo..=hi {
                    let p = spread(raw, lo, hi);
                    assert!((1..=10).contains(&p) && p >= last, "raw {raw} in {lo}..={hi}: {p} after {last}");
                    last = p;
                }
                assert_eq!(spread(hi, lo, hi), if lo == hi { to_extender_priority(hi).max(1) } else { 10 });
            }
        }
    }

    #[test]
    fn priority_mapping_rounds_half_up_into_0_to_10() {
        assert_eq!(to_extender_priority(1), 0);
        assert_eq!(to_extender_priority(4), 0);
        assert_eq!(to_extender_priority(5), 1);
        assert_eq!(to_extender_priority(14), 1);
        assert_eq!(to_extender_priority(15), 2);
        assert_eq!(to_extender_priority(94), 9);
        assert_eq!(to_extender_priority(95), 10);
        assert_eq!(to_extender_priority(100), 10);
        assert_eq!(to_extender_priority(255), 10);
    }
}
