//! Shared test helpers: topologies from go-gpuallocator's tests, built in code, and a brute force
//! that enumerates partitions exactly as upstream does.
#![allow(dead_code, unused_imports, clippy::unwrap_used)]

use weft_alloc::PreparedNode;
use weft_topology::model::uniform_node;
use weft_topology::{NodeTopology, PairLink, PcieRelation};

fn pcie(r: PcieRelation) -> PairLink {
    PairLink { pcie: Some(r), nvlinks: 0 }
}

fn add_nvlinks(node: &mut NodeTopology, links: &[(usize, usize, u8)]) {
    for &(a, b, nv) in links {
        let l = node.link(a, b);
        node.set_link(a, b, PairLink { nvlinks: nv, ..l });
    }
}

/// go-gpuallocator `NewDGX1VoltaNode` (common_test.go), shared with the other crates' tests.
pub use weft_topology::reference::dgx1_volta;

/// go-gpuallocator `NewDGX1PascalNode`: PIX within {0,2},{1,3},{4,6},{5,7}; PHB in the rest of each
/// half; SYS across; one NVLink on each cube-mesh edge.
pub fn dgx1_pascal() -> NodeTopology {
    let mut node = uniform_node("dgx1-pascal", 8, pcie(PcieRelation::Sys));
    for a in 0..8 {
        for b in a + 1..8 {
            let rel = if a / 4 != b / 4 {
                PcieRelation::Sys
            } else if a % 2 == b % 2 {
                PcieRelation::Pix
            } else {
                PcieRelation::Phb
            };
            node.set_link(a, b, pcie(rel));
        }
    }
    let edges = [
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (1, 2),
        (1, 3),
        (1, 5),
        (2, 3),
        (2, 6),
        (3, 7),
        (4, 5),
        (4, 6),
        (4, 7),
        (5, 6),
        (5, 7),
        (6, 7),
    ];
    let links: Vec<(usize, usize, u8)> = edges.iter().map(|&(a, b)| (a, b, 1)).collect();
    add_nvlinks(&mut node, &links);
    node
}

/// go-gpuallocator `New4xRTX8000Node`: NV2 bridges 0-3 and 1-2 (no PCIe entry on those pairs),
/// NODE on 0-1 and 2-3, SYS on 0-2 and 1-3.
pub fn rtx8000x4() -> NodeTopology {
    let mut node = uniform_node("4xrtx8000", 4, PairLink::default());
    node.set_link(0, 3, PairLink { pcie: None, nvlinks: 2 });
    node.set_link(1, 2, PairLink { pcie: None, nvlinks: 2 });
    node.set_link(0, 1, pcie(PcieRelation::Node));
    node.set_link(2, 3, pcie(PcieRelation::Node));
    node.set_link(0, 2, pcie(PcieRelation::Sys));
    node.set_link(1, 3, pcie(PcieRelation::Sys));
    node
}

pub fn prepared(node: &NodeTopology) -> PreparedNode {
    PreparedNode::new(node).unwrap()
}

/// Upstream's enumeration of partitions of `devices` (nils as `None`, already padded at the end)
/// into sets of `size`, calling `cb` on each in upstream's order.
/// A set of upstream's padded device list: `None` is a nil.
pub type Set = Vec<Option<usize>>;

pub fn iterate_partitions(
    devices: &[Option<usize>],
    size: usize,
    padding: usize,
    accum: &mut Vec<Set>,
    cb: &mut dyn FnMut(&[Set]),
) {
    if devices.len() == size {
        accum.push(devices.to_vec());
        cb(accum);
        accum.pop();
        return;
    }
    let rest = &devices[1..];
    // (size-1)-combinations of `rest` in lexicographic order of positions (iterateGPUSets).
    let mut idx: Vec<usize> = (0..size - 1).collect();
    if size - 1 > rest.len() {
        return;
    }
    loop {
        let mut set = vec![devices[0]];
        set.extend(idx.iter().map(|&i| rest[i]));
        let p = set.iter().filter(|d| d.is_none()).count();
        if p == 0 || p == padding {
            // gpuSetContains compares pointers: a set holding a nil removes every nil.
            let remaining: Vec<Option<usize>> = devices.iter().copied().filter(|d| !set.contains(d)).collect();
            accum.push(set);
            iterate_partitions(&remaining, size, padding, accum, cb);
            accum.pop();
        }
        // next combination
        let m = idx.len();
        if m == 0 {
            return;
        }
        let mut i = m;
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            if idx[i] < rest.len() - (m - i) {
                idx[i] += 1;
                for j in i + 1..m {
                    idx[j] = idx[j - 1] + 1;
                }
                break;
            }
        }
    }
}

/// What weft must return, computed by brute force: upstream's enumeration and choice, except that
/// padded sets never qualify as the answer and k = 1 takes the GPU with the smallest total score to
/// the other free GPUs (ties → earliest). Returns (set in `available` order, partition objective),
/// or `None` if no partition qualifies.
pub fn brute_force(
    node: &PreparedNode,
    available: &[usize],
    required: &[usize],
    k: usize,
) -> Option<(Vec<usize>, u64)> {
    if k == 1 {
        if let Some(&g) = required.first() {
            return Some((vec![g], 0));
        }
        let mut best: Option<(usize, u64)> = None;
        for &a in available {
            let loss: u64 = available.iter().map(|&b| u64::from(node.pair_score(a, b))).sum();
            if best.is_none_or(|(_, l)| loss < l) {
                best = Some((a, loss));
            }
        }
        return best.map(|(g, _)| (vec![g], 0));
    }
    let mut devices: Vec<Option<usize>> = available.iter().map(|&g| Some(g)).collect();
    while !devices.len().is_multiple_of(k) {
        devices.push(None);
    }
    let padding = devices.len() - available.len();
    let set_score = |set: &[Option<usize>]| -> u64 {
        let mut s = 0u64;
        for (i, a) in set.iter().enumerate() {
            for b in &set[i + 1..] {
                if let (Some(a), Some(b)) = (a, b) {
                    s += u64::from(node.pair_score(*a, *b));
                }
            }
        }
        s
    };
    let qualifies =
        |set: &[Option<usize>]| set.iter().all(|d| d.is_some()) && required.iter().all(|r| set.contains(&Some(*r)));
    let mut best: Option<(Vec<Vec<Option<usize>>>, u64)> = None;
    let mut accum = Vec::new();
    iterate_partitions(&devices, k, padding, &mut accum, &mut |part| {
        if !part.iter().any(|s| qualifies(s)) {
            return;
        }
        let score: u64 = part.iter().map(|s| set_score(s)).sum();
        if best.as_ref().is_none_or(|(_, b)| score > *b) {
            best = Some((part.to_vec(), score));
        }
    });
    let (part, objective) = best?;
    let mut chosen: Option<(&Vec<Option<usize>>, u64)> = None;
    for set in part.iter().filter(|s| qualifies(s)) {
        let s = set_score(set);
        if chosen.is_none_or(|(_, b)| s > b) {
            chosen = Some((set, s));
        }
    }
    let (set, _) = chosen?;
    Some((set.iter().flatten().copied().collect(), objective))
}

/// A seeded random node: every pair's PCIe relation uniform over the six, 0..=`max_nv` NVLinks.
pub fn random_topology(n: usize, max_nv: u8, seed: u64) -> NodeTopology {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut node = uniform_node("random", n, PairLink::default());
    for a in 0..n {
        for b in a + 1..n {
            let pcie = PcieRelation::ALL[rng.random_range(0..6usize)];
            let nvlinks = rng.random_range(0..=max_nv);
            node.set_link(a, b, PairLink { pcie: Some(pcie), nvlinks });
        }
    }
    node
}

/// NVL72-like: 18 trays of 4 GPUs, every pair NV18 through the switches; in a tray, GPUs 0-1 and
/// 2-3 share a CPU (NODE), the other tray pairs cross CPUs (SYS); no PCIe relation across trays.
pub fn nvl72() -> NodeTopology {
    let mut node = uniform_node("nvl72", 72, PairLink { pcie: None, nvlinks: 18 });
    for a in 0..72 {
        for b in a + 1..72 {
            if a / 4 == b / 4 {
                let rel = if a / 2 == b / 2 { PcieRelation::Node } else { PcieRelation::Sys };
                node.set_link(a, b, PairLink { pcie: Some(rel), nvlinks: 18 });
            }
        }
    }
    node
}
