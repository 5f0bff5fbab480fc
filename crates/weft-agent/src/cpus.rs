//! Exclusive-CPU allocation, in the spirit of kubelet's static CPU manager (`takeByTopology`).
//!
//! [`take_by_topology`] takes `n` CPUs out of a set of available CPUs:
//! 1. **Narrowest domain.** When one NUMA node's available CPUs can hold all `n`, only that node is
//!    used (best fit: the node with the fewest available CPUs that still holds `n`, lowest id on a
//!    tie); else one socket the same way; else everything available.
//! 2. **Whole sockets** whose every CPU is available, while `n` still covers a whole socket.
//! 3. **Whole cores** (every hyperthread sibling available), packed: cores of the NUMA node with
//!    the fewest available CPUs first, then by lowest CPU id, while a whole core still fits.
//! 4. **Single threads**, one at a time, from the core with the fewest available siblings left
//!    (the most-used partially free core), then the lowest core, then the lowest CPU id.
//!
//! Every order is total, so the result is deterministic. CPUs not in the layout are never taken;
//! the caller keeps reserved CPUs out of `available`. [`allocate`] adds kubelet's alignment step:
//! take as many as possible from a preferred (NUMA-aligned) subset first, the rest anywhere.

use std::collections::BTreeMap;

use thiserror::Error;
use weft_topology::{CpuLayout, CpuSet};

/// Not enough CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{requested} CPUs requested but only {available} are available")]
pub struct NotEnoughCpus {
    /// CPUs asked for.
    pub requested: usize,
    /// CPUs available (in the layout).
    pub available: usize,
}

/// `a ∖ b`.
pub fn difference(a: &CpuSet, b: &CpuSet) -> CpuSet {
    a.iter().filter(|c| !b.contains(*c)).collect()
}

/// `a ∩ b`.
pub fn intersection(a: &CpuSet, b: &CpuSet) -> CpuSet {
    a.iter().filter(|c| b.contains(*c)).collect()
}

/// `a ∪ b`.
pub fn union(a: &CpuSet, b: &CpuSet) -> CpuSet {
    a.iter().chain(b.iter()).collect()
}

/// Whether every CPU of `a` is in `b`.
pub fn is_subset(a: &CpuSet, b: &CpuSet) -> bool {
    a.iter().all(|c| b.contains(c))
}

/// Whether `a` and `b` share a CPU.
pub fn overlaps(a: &CpuSet, b: &CpuSet) -> bool {
    a.iter().any(|c| b.contains(c))
}

/// Take `n` CPUs out of `available` by topology (see the module docs).
pub fn take_by_topology(layout: &CpuLayout, available: &CpuSet, n: usize) -> Result<CpuSet, NotEnoughCpus> {
    let available: CpuSet = available.iter().filter(|c| layout.cpu(*c).is_some()).collect();
    if available.len() < n {
        return Err(NotEnoughCpus { requested: n, available: available.len() });
    }
    if n == 0 {
        return Ok(CpuSet::new());
    }
    if available.len() == n {
        return Ok(available);
    }
    let domain = narrowest_domain(layout, &available, n);
    Ok(take_within(layout, &domain, n))
}

/// Take `n` CPUs from `free`, as many as possible from `preferred` first (kubelet's aligned-first
/// step), the rest from the remainder of `free`, each part by [`take_by_topology`].
pub fn allocate(
    layout: &CpuLayout,
    free: &CpuSet,
    preferred: Option<&CpuSet>,
    n: usize,
) -> Result<CpuSet, NotEnoughCpus> {
    let free: CpuSet = free.iter().filter(|c| layout.cpu(*c).is_some()).collect();
    if free.len() < n {
        return Err(NotEnoughCpus { requested: n, available: free.len() });
    }
    let Some(preferred) = preferred else { return take_by_topology(layout, &free, n) };
    let aligned = intersection(&free, preferred);
    let first = take_by_topology(layout, &aligned, n.min(aligned.len()))?;
    if first.len() == n {
        return Ok(first);
    }
    let rest = take_by_topology(layout, &difference(&free, &first), n - first.len())?;
    Ok(union(&first, &rest))
}

/// Count of `available` CPUs per key.
fn count_by(
    layout: &CpuLayout,
    available: &CpuSet,
    key: impl Fn(&weft_topology::CpuInfo) -> u32,
) -> BTreeMap<u32, usize> {
    let mut out = BTreeMap::new();
    for c in available.iter().filter_map(|id| layout.cpu(id)) {
        *out.entry(key(c)).or_default() += 1;
    }
    out
}

/// The available CPUs of the best-fitting single NUMA node, else socket, else all of them.
fn narrowest_domain(layout: &CpuLayout, available: &CpuSet, n: usize) -> CpuSet {
    let best_fit = |counts: BTreeMap<u32, usize>| {
        counts.into_iter().filter(|(_, free)| *free >= n).min_by_key(|(id, free)| (*free, *id)).map(|(id, _)| id)
    };
    if let Some(node) = best_fit(count_by(layout, available, |c| c.numa)) {
        return available.iter().filter(|id| layout.cpu(*id).is_some_and(|c| c.numa == node)).collect();
    }
    if let Some(socket) = best_fit(count_by(layout, available, |c| c.socket)) {
        return available.iter().filter(|id| layout.cpu(*id).is_some_and(|c| c.socket == socket)).collect();
    }
    available.clone()
}

/// Steps 2–4 of the module docs within `domain` (which holds at least `n` CPUs of the layout).
fn take_within(layout: &CpuLayout, domain: &CpuSet, n: usize) -> CpuSet {
    let mut left = domain.clone();
    let mut taken = CpuSet::new();
    let mut need = n;
    let take = |set: &CpuSet, left: &mut CpuSet, taken: &mut CpuSet| {
        for c in set.iter() {
            taken.insert(c);
        }
        *left = difference(left, set);
    };

    // Whole sockets.
    for socket in layout.sockets() {
        let cpus = layout.socket_cpus(socket);
        if need >= cpus.len() && cpus.iter().all(|c| left.contains(c)) {
            need -= cpus.len();
            take(&cpus, &mut left, &mut taken);
        }
    }

    // Whole cores, packed into the NUMA node with the fewest available CPUs first.
    if need > 0 {
        let numa_free = count_by(layout, &left, |c| c.numa);
        let mut cores: Vec<(usize, u32, u32, CpuSet)> = Vec::new();
        for (socket, core) in layout.cores() {
            let cpus = layout.core_cpus(socket, core);
            let Some(first) = cpus.iter().next() else { continue };
            if !cpus.iter().all(|c| left.contains(c)) {
                continue;
            }
            let numa = layout.cpu(first).map_or(0, |c| c.numa);
            cores.push((numa_free.get(&numa).copied().unwrap_or(0), numa, first, cpus));
        }
        cores.sort_by_key(|(free, numa, first, _)| (*free, *numa, *first));
        for (_, _, _, cpus) in cores {
            if need == 0 {
                break;
            }
            if cpus.len() <= need {
                need -= cpus.len();
                take(&cpus, &mut left, &mut taken);
            }
        }
    }

    // Single threads from the most-used cores.
    while need > 0 {
        let pick = left
            .iter()
            .filter_map(|id| {
                let c = layout.cpu(id)?;
                let siblings = layout.core_cpus(c.socket, c.core);
                let free_siblings = siblings.iter().filter(|s| left.contains(*s)).count();
                let core_first = siblings.iter().next().unwrap_or(id);
                Some((free_siblings, core_first, id))
            })
            .min();
        let Some((_, _, id)) = pick else { break };
        taken.insert(id);
        left = difference(&left, &std::iter::once(id).collect());
        need -= 1;
    }
    taken
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    /// 2 sockets × 1 NUMA × 4 cores × 2 threads: node 0 = 0-3,8-11; node 1 = 4-7,12-15.
    fn small() -> CpuLayout {
        CpuLayout::synthetic(2, 1, 4, 2).unwrap()
    }

    #[test]
    fn whole_cores_first_then_threads() {
        let l = small();
        assert_eq!(take_by_topology(&l, &l.online(), 2).unwrap(), set("0,8"), "one whole core");
        assert_eq!(take_by_topology(&l, &l.online(), 4).unwrap(), set("0-1,8-9"));
        assert_eq!(take_by_topology(&l, &l.online(), 3).unwrap(), set("0-1,8"), "two... one core + one thread");
    }

    #[test]
    fn threads_come_from_the_most_used_core() {
        let l = small();
        // CPU 0 is gone: core 0 has one free thread (8); a single CPU comes from there.
        let avail = difference(&l.online(), &set("0"));
        assert_eq!(take_by_topology(&l, &avail, 1).unwrap(), set("8"));
        // Three CPUs: a whole core (1,9), then the lone sibling 8.
        assert_eq!(take_by_topology(&l, &avail, 3).unwrap(), set("1,8-9"));
    }

    #[test]
    fn best_fit_numa_node() {
        let l = small();
        // Node 0 has 3 free (0,1,8), node 1 has all 8: 2 CPUs fit node 0, the tighter fit.
        let avail = union(&set("0-1,8"), &l.numa_cpus(1));
        assert_eq!(take_by_topology(&l, &avail, 2).unwrap(), set("0,8"));
        // 4 CPUs fit only node 1.
        assert_eq!(take_by_topology(&l, &avail, 4).unwrap(), set("4-5,12-13"));
        // 10 CPUs span both: whole socket 1 (8), then a whole core from node 0.
        assert_eq!(take_by_topology(&l, &avail, 10).unwrap(), union(&l.socket_cpus(1), &set("0,8")));
    }

    #[test]
    fn whole_sockets_when_the_request_covers_them() {
        let l = CpuLayout::synthetic(2, 2, 2, 2).unwrap(); // sockets of 8 CPUs, NUMA nodes of 4
        let got = take_by_topology(&l, &l.online(), 8).unwrap();
        assert_eq!(got, l.socket_cpus(0));
        let got = take_by_topology(&l, &l.online(), 12).unwrap();
        assert_eq!(got.len(), 12);
        assert!(l.socket_cpus(0).iter().all(|c| got.contains(c)));
    }

    #[test]
    fn errors_and_edges() {
        let l = small();
        let e = take_by_topology(&l, &set("0-3"), 5).unwrap_err();
        assert_eq!((e.requested, e.available), (5, 4));
        assert!(e.to_string().contains("5 CPUs requested"));
        assert_eq!(take_by_topology(&l, &set("0-3"), 0).unwrap(), CpuSet::new());
        // CPUs the layout lacks are never taken.
        assert!(take_by_topology(&l, &set("0,99"), 2).is_err());
        assert_eq!(take_by_topology(&l, &set("0,99"), 1).unwrap(), set("0"));
    }

    #[test]
    fn allocate_takes_aligned_first() {
        let l = small();
        let free = l.online();
        let node1 = l.numa_cpus(1);
        assert_eq!(allocate(&l, &free, Some(&node1), 2).unwrap(), set("4,12"));
        // Node 1 holds 8: 10 take all of node 1 then 2 from node 0.
        let got = allocate(&l, &free, Some(&node1), 10).unwrap();
        assert_eq!(got, union(&node1, &set("0,8")));
        assert!(allocate(&l, &free, None, 17).is_err());
    }

    #[test]
    fn set_helpers() {
        assert_eq!(difference(&set("0-5"), &set("2-3")), set("0-1,4-5"));
        assert_eq!(intersection(&set("0-5"), &set("4-9")), set("4-5"));
        assert_eq!(union(&set("0-1"), &set("4")), set("0-1,4"));
        assert!(overlaps(&set("0-5"), &set("5-6")) && !overlaps(&set("0-4"), &set("5-6")));
        assert!(is_subset(&set("1-2"), &set("0-5")) && !is_subset(&set("4-6"), &set("0-5")));
    }
}
