//! Topology Manager semantics, after kubelet's `topologymanager` package: NUMA affinity hints,
//! per-resource hint providers, the merge across providers and the four policies.
//!
//! - A [`TopologyHint`] is a NUMA bitmask ([`NumaMask`]) plus whether that placement is
//!   *preferred*. A provider answers [`ProviderHints::DontCare`] (kubelet's `nil`: any placement
//!   is fine), a list of hints, or an empty list (it cannot be satisfied anywhere).
//! - Providers: [`cpu_hints`] (every NUMA set with enough *free* CPUs; preferred = as narrow as the
//!   narrowest set whose *capacity* could hold the request, as kubelet's
//!   `generateCPUTopologyHints`), [`memory_hints`] (the same over bytes per NUMA node, as the
//!   memory manager), [`device_hints`] (the devices the pod already holds: every NUMA set that
//!   contains all their nodes; preferred = exactly their nodes, as the device manager does for
//!   pre-allocated devices).
//! - [`merge`]: every combination of one hint per provider is ANDed (a don't-care provider
//!   contributes "any, preferred"; an unsatisfiable one "any, not preferred"); a combination is
//!   preferred when all its hints are; the best merged hint is a preferred one over a non-preferred
//!   one, then the narrowest (fewest nodes, then lowest mask), as kubelet's policy merge picks. Empty
//!   intersections are dropped; the start is "all nodes, not preferred". Under `single-numa-node`
//!   the providers' hints are first filtered to preferred single-node hints.
//! - [`TopologyPolicy::admits`]: `none` and `best-effort` admit always; `restricted` and
//!   `single-numa-node` only a preferred best hint.
//!
//! The merge is computed by folding providers one at a time over the set of distinct merged
//! `(mask, preferred)` pairs (at most 2 × 2^nodes), which gives exactly the result of kubelet's
//! iteration over all permutations without its exponential cost.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use thiserror::Error;
use weft_topology::{CpuLayout, CpuSet};

/// The most NUMA nodes the aligning policies handle (kubelet's default `max-allowable-numa-nodes`).
pub const MAX_NUMA_NODES: usize = 8;

/// A set of NUMA node ids (< 64) as a bitmask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NumaMask(u64);

impl NumaMask {
    /// No node.
    pub const EMPTY: NumaMask = NumaMask(0);

    /// The mask of `nodes`; `None` when a node id is 64 or more.
    pub fn from_nodes(nodes: impl IntoIterator<Item = u32>) -> Option<NumaMask> {
        let mut bits = 0u64;
        for n in nodes {
            bits |= 1u64.checked_shl(n)?;
        }
        Some(NumaMask(bits))
    }

    /// The raw bits (bit `i` = node `i`).
    pub fn bits(self) -> u64 {
        self.0
    }

    /// A mask from raw bits.
    pub fn from_bits(bits: u64) -> NumaMask {
        NumaMask(bits)
    }

    /// Node ids, ascending.
    pub fn nodes(self) -> impl Iterator<Item = u32> {
        (0..64u32).filter(move |i| self.0 & (1u64 << i) != 0)
    }

    /// Number of nodes.
    pub fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether no node is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether node `n` is set.
    pub fn contains(self, n: u32) -> bool {
        n < 64 && self.0 & (1u64 << n) != 0
    }

    /// Intersection.
    pub fn and(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 & other.0)
    }

    /// Whether every node of `self` is in `other`.
    pub fn is_subset_of(self, other: NumaMask) -> bool {
        self.0 & !other.0 == 0
    }

    /// kubelet's `IsNarrowerThan`: fewer nodes, or as many and a lower mask value.
    pub fn is_narrower_than(self, other: NumaMask) -> bool {
        self.count() < other.count() || (self.count() == other.count() && self.0 < other.0)
    }

    /// The node ids as a set in list format (`cpuset.mems`).
    pub fn to_cpuset(self) -> CpuSet {
        self.nodes().collect()
    }

    /// Every non-empty subset of `self`, ascending by mask value.
    pub fn subsets(self) -> Vec<NumaMask> {
        // Standard sub-mask enumeration, descending; reversed for ascending order.
        let mut out = Vec::new();
        let mut sub = self.0;
        while sub != 0 {
            out.push(NumaMask(sub));
            sub = (sub - 1) & self.0;
        }
        out.reverse();
        out
    }
}

impl fmt::Display for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() { f.write_str("none") } else { write!(f, "{}", self.to_cpuset()) }
    }
}

/// A NUMA placement and whether it is a preferred one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TopologyHint {
    /// The NUMA nodes.
    pub mask: NumaMask,
    /// Whether this placement is as good as the resource allows.
    pub preferred: bool,
}

/// What one resource's provider says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProviderHints {
    /// Any placement will do (kubelet's `nil` hints): the resource is not requested or has no locality.
    DontCare,
    /// The placements that can satisfy the resource; empty when none can.
    Hints(Vec<TopologyHint>),
}

/// The node's topology policy (kubelet's `--topology-manager-policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyPolicy {
    /// No alignment: exclusive CPUs are packed anywhere; memory nodes are not restricted for
    /// shared pods.
    None,
    /// Align where possible, admit always.
    #[default]
    BestEffort,
    /// Admit only when the best merged hint is preferred.
    Restricted,
    /// Admit only when a preferred single-NUMA-node placement exists for every resource.
    SingleNumaNode,
}

impl TopologyPolicy {
    /// Every policy, in order.
    pub const ALL: [TopologyPolicy; 4] =
        [TopologyPolicy::None, TopologyPolicy::BestEffort, TopologyPolicy::Restricted, TopologyPolicy::SingleNumaNode];

    /// The policy's name as kubelet spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            TopologyPolicy::None => "none",
            TopologyPolicy::BestEffort => "best-effort",
            TopologyPolicy::Restricted => "restricted",
            TopologyPolicy::SingleNumaNode => "single-numa-node",
        }
    }

    /// Whether the policy aligns resources at all (every policy but `none`).
    pub fn aligns(self) -> bool {
        self != TopologyPolicy::None
    }

    /// Whether a pod whose best merged hint is `best` is admitted.
    pub fn admits(self, best: &TopologyHint) -> bool {
        match self {
            TopologyPolicy::None | TopologyPolicy::BestEffort => true,
            TopologyPolicy::Restricted | TopologyPolicy::SingleNumaNode => best.preferred,
        }
    }
}

impl fmt::Display for TopologyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown policy name.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("unknown topology policy '{0}' (expected none, best-effort, restricted or single-numa-node)")]
pub struct UnknownPolicy(pub String);

impl FromStr for TopologyPolicy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TopologyPolicy::ALL.into_iter().find(|p| p.as_str() == s.trim()).ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// The NUMA nodes of `layout` as a mask; `None` when a node id is 64 or more.
pub fn layout_mask(layout: &CpuLayout) -> Option<NumaMask> {
    NumaMask::from_nodes(layout.numa_nodes())
}

/// Hints over every subset of `all` from per-node `capacity` and `free` amounts: a subset whose free
/// sum covers `request` is a hint; it is preferred when it has as few nodes as the narrowest subset
/// whose capacity covers `request`.
fn amount_hints(
    all: NumaMask,
    capacity: &BTreeMap<u32, u128>,
    free: &BTreeMap<u32, u128>,
    request: u128,
) -> Vec<TopologyHint> {
    let sum =
        |m: NumaMask, per: &BTreeMap<u32, u128>| m.nodes().map(|n| per.get(&n).copied().unwrap_or(0)).sum::<u128>();
    let subsets = all.subsets();
    let min_width =
        subsets.iter().filter(|m| sum(**m, capacity) >= request).map(|m| m.count()).min().unwrap_or(all.count());
    subsets
        .into_iter()
        .filter(|m| sum(*m, free) >= request)
        .map(|mask| TopologyHint { mask, preferred: mask.count() == min_width })
        .collect()
}

/// CPU hints for `request` exclusive CPUs out of `available` (free, non-reserved) CPUs, as kubelet's
/// static CPU manager: every NUMA set with at least `request` available CPUs; preferred = as few
/// nodes as the narrowest set whose total CPUs could hold `request`. `DontCare` for a request of 0.
pub fn cpu_hints(layout: &CpuLayout, all: NumaMask, available: &CpuSet, request: usize) -> ProviderHints {
    if request == 0 {
        return ProviderHints::DontCare;
    }
    let mut capacity: BTreeMap<u32, u128> = BTreeMap::new();
    let mut free: BTreeMap<u32, u128> = BTreeMap::new();
    for c in layout.cpus() {
        *capacity.entry(c.numa).or_default() += 1;
        if available.contains(c.id) {
            *free.entry(c.numa).or_default() += 1;
        }
    }
    ProviderHints::Hints(amount_hints(all, &capacity, &free, request as u128))
}

/// Memory hints for `request` bytes, from each node's `capacity` and `free` bytes, as kubelet's
/// memory manager: every NUMA set whose free memory covers the request; preferred = as few nodes as
/// the narrowest set whose capacity could. `DontCare` for a request of 0 or when a node of `all` has
/// no known capacity.
pub fn memory_hints(
    all: NumaMask,
    capacity: &BTreeMap<u32, u64>,
    free: &BTreeMap<u32, u64>,
    request: u64,
) -> ProviderHints {
    if request == 0 || all.nodes().any(|n| !capacity.contains_key(&n)) {
        return ProviderHints::DontCare;
    }
    let widen = |m: &BTreeMap<u32, u64>| m.iter().map(|(k, v)| (*k, u128::from(*v))).collect::<BTreeMap<_, _>>();
    ProviderHints::Hints(amount_hints(all, &widen(capacity), &widen(free), u128::from(request)))
}

/// Device hints for devices already placed on the NUMA nodes `devices`: every subset of `all` that
/// contains them; preferred = exactly them. Nodes outside `all` are ignored; `DontCare` when no
/// device has a known node.
pub fn device_hints(all: NumaMask, devices: NumaMask) -> ProviderHints {
    let devices = devices.and(all);
    if devices.is_empty() {
        return ProviderHints::DontCare;
    }
    ProviderHints::Hints(
        all.subsets()
            .into_iter()
            .filter(|m| devices.is_subset_of(*m))
            .map(|mask| TopologyHint { mask, preferred: mask == devices })
            .collect(),
    )
}

/// Under `single-numa-node`, kubelet keeps only preferred single-node hints (`filterSingleNumaHints`).
fn filter_single_numa(hints: &ProviderHints) -> ProviderHints {
    match hints {
        ProviderHints::DontCare => ProviderHints::DontCare,
        ProviderHints::Hints(v) => {
            ProviderHints::Hints(v.iter().copied().filter(|h| h.preferred && h.mask.count() == 1).collect())
        }
    }
}

/// kubelet's choice between the best hint so far and a candidate.
fn better(current: TopologyHint, candidate: TopologyHint) -> TopologyHint {
    match (current.preferred, candidate.preferred) {
        (false, true) => candidate,
        (true, false) => current,
        _ if candidate.mask.is_narrower_than(current.mask) => candidate,
        _ => current,
    }
}

/// The best merged hint of `providers` over the NUMA nodes `all` under `policy` (see the module
/// docs). For `none` it is "all nodes, preferred".
pub fn merge(policy: TopologyPolicy, all: NumaMask, providers: &[ProviderHints]) -> TopologyHint {
    if !policy.aligns() {
        return TopologyHint { mask: all, preferred: true };
    }
    let mut merged: BTreeSet<(NumaMask, bool)> = BTreeSet::from([(all, true)]);
    for provider in providers {
        let provider =
            if policy == TopologyPolicy::SingleNumaNode { filter_single_numa(provider) } else { provider.clone() };
        let hints: Vec<(NumaMask, bool)> = match &provider {
            ProviderHints::DontCare => vec![(all, true)],
            ProviderHints::Hints(v) if v.is_empty() => vec![(all, false)],
            ProviderHints::Hints(v) => v.iter().map(|h| (h.mask, h.preferred)).collect(),
        };
        let mut next = BTreeSet::new();
        for (mask, preferred) in &merged {
            for (h_mask, h_preferred) in &hints {
                let m = mask.and(*h_mask);
                if !m.is_empty() {
                    next.insert((m, *preferred && *h_preferred));
                }
            }
        }
        merged = next;
    }
    merged.into_iter().fold(TopologyHint { mask: all, preferred: false }, |best, (mask, preferred)| {
        better(best, TopologyHint { mask, preferred })
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    fn m(nodes: &[u32]) -> NumaMask {
        NumaMask::from_nodes(nodes.iter().copied()).unwrap()
    }

    fn h(nodes: &[u32], preferred: bool) -> TopologyHint {
        TopologyHint { mask: m(nodes), preferred }
    }

    #[test]
    fn mask_basics() {
        let a = m(&[0, 2]);
        assert_eq!(a.count(), 2);
        assert_eq!(a.to_string(), "0,2");
        assert_eq!(NumaMask::EMPTY.to_string(), "none");
        assert!(a.contains(2) && !a.contains(1) && !a.contains(99));
        assert!(m(&[0]).is_subset_of(a) && !m(&[1]).is_subset_of(a));
        assert!(m(&[1]).is_narrower_than(m(&[0, 1])));
        assert!(m(&[0]).is_narrower_than(m(&[1])));
        assert!(!m(&[1]).is_narrower_than(m(&[0])));
        assert_eq!(m(&[0, 1]).subsets(), vec![m(&[0]), m(&[1]), m(&[0, 1])]);
        assert_eq!(m(&[0, 1, 2]).subsets().len(), 7);
        assert!(NumaMask::from_nodes([64]).is_none());
        assert_eq!(NumaMask::from_nodes([63]).unwrap().count(), 1);
    }

    #[test]
    fn policy_names_round_trip() {
        for p in TopologyPolicy::ALL {
            assert_eq!(p.as_str().parse::<TopologyPolicy>().unwrap(), p);
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
        }
        assert!("strict".parse::<TopologyPolicy>().unwrap_err().to_string().contains("strict"));
    }

    #[test]
    fn cpu_hints_prefer_the_narrowest_by_capacity() {
        // 2 NUMA nodes × 4 cores × 2 threads = 8 CPUs per node.
        let layout = CpuLayout::synthetic(2, 1, 4, 2).unwrap();
        let all = layout_mask(&layout).unwrap();
        let every = layout.online();
        let ProviderHints::Hints(hints) = cpu_hints(&layout, all, &every, 4) else { panic!("hints") };
        assert_eq!(hints, vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]);
        // 10 CPUs need both nodes: the two-node set is then the preferred (narrowest) one.
        let ProviderHints::Hints(hints) = cpu_hints(&layout, all, &every, 10) else { panic!("hints") };
        assert_eq!(hints, vec![h(&[0, 1], true)]);
        // Node 0 has only 3 free CPUs: it is no hint, node 1 stays preferred.
        let free: CpuSet = "0-2,4-7,12-15".parse().unwrap();
        let ProviderHints::Hints(hints) = cpu_hints(&layout, all, &free, 4) else { panic!("hints") };
        assert_eq!(hints, vec![h(&[1], true), h(&[0, 1], false)]);
        // More than the machine has: no hint at all.
        assert_eq!(cpu_hints(&layout, all, &every, 17), ProviderHints::Hints(vec![]));
        assert_eq!(cpu_hints(&layout, all, &every, 0), ProviderHints::DontCare);
    }

    #[test]
    fn memory_hints_need_known_capacity() {
        let all = m(&[0, 1]);
        let cap: BTreeMap<u32, u64> = [(0, 100), (1, 100)].into();
        let free: BTreeMap<u32, u64> = [(0, 10), (1, 100)].into();
        assert_eq!(memory_hints(all, &cap, &free, 50), ProviderHints::Hints(vec![h(&[1], true), h(&[0, 1], false)]));
        assert_eq!(memory_hints(all, &cap, &free, 0), ProviderHints::DontCare);
        let partial: BTreeMap<u32, u64> = [(0, 100)].into();
        assert_eq!(memory_hints(all, &partial, &free, 50), ProviderHints::DontCare);
    }

    #[test]
    fn device_hints_contain_the_devices() {
        let all = m(&[0, 1, 2]);
        assert_eq!(
            device_hints(all, m(&[1])),
            ProviderHints::Hints(vec![h(&[1], true), h(&[0, 1], false), h(&[1, 2], false), h(&[0, 1, 2], false)])
        );
        assert_eq!(device_hints(all, NumaMask::EMPTY), ProviderHints::DontCare);
        assert_eq!(device_hints(all, m(&[5])), ProviderHints::DontCare, "a node the layout lacks is ignored");
    }

    #[test]
    fn merge_ands_and_picks_preferred_then_narrowest() {
        let all = m(&[0, 1]);
        let cpu = ProviderHints::Hints(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]);
        let gpu = device_hints(all, m(&[1]));
        for p in [TopologyPolicy::BestEffort, TopologyPolicy::Restricted, TopologyPolicy::SingleNumaNode] {
            assert_eq!(merge(p, all, &[cpu.clone(), gpu.clone()]), h(&[1], true), "{p}");
        }
        // CPUs fit only on node 0, the GPU is on node 1: no combination is preferred; among the
        // non-preferred ones ({0}, {1}, {0,1}) the narrowest, lowest wins, as in kubelet.
        let cpu0 = ProviderHints::Hints(vec![h(&[0], true), h(&[0, 1], false)]);
        let best = merge(TopologyPolicy::BestEffort, all, &[cpu0.clone(), gpu.clone()]);
        assert_eq!(best, h(&[0], false));
        assert!(TopologyPolicy::BestEffort.admits(&best));
        assert!(!TopologyPolicy::Restricted.admits(&best));
        // single-numa-node filters to single-node preferred hints: no combination is left.
        let best = merge(TopologyPolicy::SingleNumaNode, all, &[cpu0, gpu]);
        assert_eq!(best, h(&[0, 1], false));
        assert!(!TopologyPolicy::SingleNumaNode.admits(&best));
    }

    #[test]
    fn merge_of_dont_care_and_unsatisfiable() {
        let all = m(&[0, 1]);
        assert_eq!(merge(TopologyPolicy::Restricted, all, &[]), h(&[0, 1], true));
        assert_eq!(merge(TopologyPolicy::Restricted, all, &[ProviderHints::DontCare]), h(&[0, 1], true));
        let none = ProviderHints::Hints(vec![]);
        assert_eq!(merge(TopologyPolicy::BestEffort, all, &[none, ProviderHints::DontCare]), h(&[0, 1], false));
        assert_eq!(merge(TopologyPolicy::None, all, &[ProviderHints::Hints(vec![])]), h(&[0, 1], true));
    }

    #[test]
    fn merge_matches_kubelet_permutation_order_independence() {
        // A non-preferred narrower hint never beats a preferred wider one.
        let all = m(&[0, 1, 2, 3]);
        let a = ProviderHints::Hints(vec![h(&[0, 1], true), h(&[0], false)]);
        let b = ProviderHints::Hints(vec![h(&[0, 1, 2], true), h(&[0], false)]);
        assert_eq!(merge(TopologyPolicy::BestEffort, all, &[a.clone(), b.clone()]), h(&[0, 1], true));
        assert_eq!(merge(TopologyPolicy::BestEffort, all, &[b, a]), h(&[0, 1], true));
    }
}
