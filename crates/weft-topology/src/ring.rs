//! What a collective over a GPU set feels: the bandwidth of its best ring, which is the bandwidth of
//! that ring's slowest hop.
//!
//! NCCL runs all-reduce, all-gather and reduce-scatter inside a node as rings: each GPU sends to
//! one neighbour and receives from the other, and every hop carries the same bytes, so the ring
//! runs at the speed of its slowest hop. NCCL searches for the ring whose slowest hop is fastest;
//! so does this module. The mean over the set's pairs hides a slow hop (a quad with one NVLinked
//! pair and four cross-socket pairs averages well and runs at the cross-socket rate); the
//! bottleneck does not.
//!
//! # Model
//! - A hop's rate is the pair's bandwidth per direction as the caller gives it
//!   ([`crate::NodeTopology::pair_bandwidth_gbps`]: NVLink count × the generation's per-link
//!   rate, NVSwitch pairs as their NVLink count, the PCIe x16 rate of the generation under a
//!   switch, ÷1.2 through a host bridge, capped by the inter-socket rate across sockets).
//! - Each hop is counted on its own link. A ring crosses every cut of the set an even number of
//!   times, half in each direction, and the best ring crosses a socket or switch boundary once each
//!   way when the set allows it, so a shared uplink carries one hop per direction; rings that would
//!   cross a boundary more often are not what NCCL builds and are not modelled.
//! - Two GPUs: the pair's rate (NCCL's two-GPU ring uses the one link both ways). One GPU or none:
//!   no collective, no value.
//!
//! # Exactness
//! Up to [`MAX_EXACT_RING_GPUS`] GPUs the answer is exact: the distinct hop rates are tried from
//! the largest down (a binary search), and for each the existence of a Hamiltonian cycle using only
//! hops at least that fast is decided by the subset dynamic programme (paths from GPU 0 by the set
//! they cover and their end). Larger sets get the best of greedy rings (a lower bound, reached by a
//! real ring) and an upper bound: every GPU has two ring neighbours, so no ring beats the least,
//! over GPUs, of a GPU's second-fastest hop. [`RingBandwidth::upper_bound_gbps`] says how far off
//! the answer may be.

/// Largest set whose best ring is computed exactly (2^15 subsets · 16 ends per threshold).
pub const MAX_EXACT_RING_GPUS: usize = 16;

/// The best ring over a GPU set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RingBandwidth {
    /// The slowest hop of the best ring found, GB/s per direction.
    pub gbps: f64,
    /// No ring over the set is faster than this; equal to `gbps` when the answer is exact.
    pub upper_bound_gbps: f64,
}

impl RingBandwidth {
    /// Whether `gbps` is proven the best.
    pub fn is_exact(&self) -> bool {
        self.gbps >= self.upper_bound_gbps
    }
}

/// The best ring over `k` GPUs (numbered 0..k) whose pair rates `rate(a, b)` gives (symmetric,
/// GB/s per direction; non-finite or negative rates count as 0). None for fewer than two GPUs.
pub fn best_ring(k: usize, rate: &dyn Fn(usize, usize) -> f64) -> Option<RingBandwidth> {
    let r = |a: usize, b: usize| {
        let v = rate(a, b);
        if v.is_finite() && v > 0.0 { v } else { 0.0 }
    };
    match k {
        0 | 1 => return None,
        2 => {
            let v = r(0, 1);
            return Some(RingBandwidth { gbps: v, upper_bound_gbps: v });
        }
        _ => {}
    }
    // Every GPU has two ring neighbours: none can do better than its second-fastest hop.
    let upper = (0..k)
        .map(|a| {
            let mut rates: Vec<f64> = (0..k).filter(|&b| b != a).map(|b| r(a, b)).collect();
            rates.sort_by(|x, y| y.total_cmp(x));
            rates[1]
        })
        .fold(f64::INFINITY, f64::min);
    if k > MAX_EXACT_RING_GPUS {
        let found = greedy_rings(k, &r);
        return Some(RingBandwidth { gbps: found, upper_bound_gbps: upper.max(found) });
    }
    let mut levels: Vec<f64> = (0..k).flat_map(|a| (a + 1..k).map(move |b| (a, b))).map(|(a, b)| r(a, b)).collect();
    levels.retain(|&v| v <= upper);
    levels.sort_by(f64::total_cmp);
    levels.dedup();
    // levels[lo] always has a ring (the lowest rate: the complete graph); find the highest that does.
    let (mut lo, mut hi) = (0usize, levels.len() - 1);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if has_ring(k, &|a, b| r(a, b) >= levels[mid]) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let v = levels[lo];
    Some(RingBandwidth { gbps: v, upper_bound_gbps: v })
}

/// Whether the graph on `k ≤ 16` vertices with edges `edge` has a Hamiltonian cycle.
fn has_ring(k: usize, edge: &dyn Fn(usize, usize) -> bool) -> bool {
    let adj: Vec<u32> =
        (0..k).map(|a| (0..k).filter(|&b| b != a && edge(a, b)).fold(0u32, |m, b| m | 1 << b)).collect();
    if adj.iter().any(|m| m.count_ones() < 2) {
        return false;
    }
    // ends[mask]: the vertices a path from vertex 0 covering exactly `mask` can end at. Only masks
    // holding vertex 0 are used; they are the odd ones.
    let full = (1u32 << k) - 1;
    let mut ends = vec![0u32; 1 << k];
    ends[1] = 1;
    for mask in (1..=full).step_by(2) {
        let mut e = ends[mask as usize];
        while e != 0 {
            let v = e.trailing_zeros() as usize;
            e &= e - 1;
            let mut next = adj[v] & !mask;
            while next != 0 {
                let u = next.trailing_zeros();
                next &= next - 1;
                ends[(mask | 1 << u) as usize] |= 1 << u;
            }
        }
    }
    ends[full as usize] & adj[0] != 0
}

/// The best slowest hop over greedy rings: from each start, always to the fastest unvisited GPU.
fn greedy_rings(k: usize, r: &dyn Fn(usize, usize) -> f64) -> f64 {
    let mut best = 0.0f64;
    for start in 0..k {
        let mut visited = vec![false; k];
        visited[start] = true;
        let (mut at, mut slowest) = (start, f64::INFINITY);
        for _ in 1..k {
            let next = (0..k).filter(|&b| !visited[b]).max_by(|&x, &y| r(at, x).total_cmp(&r(at, y)).then(y.cmp(&x)));
            let Some(next) = next else { break };
            slowest = slowest.min(r(at, next));
            visited[next] = true;
            at = next;
        }
        slowest = slowest.min(r(at, start));
        best = best.max(slowest);
    }
    best
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn matrix(k: usize, m: &[f64]) -> impl Fn(usize, usize) -> f64 + '_ {
        move |a, b| m[a * k + b]
    }

    /// Brute force over every ring (permutations of 1..k with 0 first).
    fn brute(k: usize, r: &dyn Fn(usize, usize) -> f64) -> f64 {
        fn go(path: &mut Vec<usize>, left: &mut Vec<usize>, r: &dyn Fn(usize, usize) -> f64, best: &mut f64) {
            if left.is_empty() {
                let mut slowest = r(*path.last().unwrap(), path[0]);
                for w in path.windows(2) {
                    slowest = slowest.min(r(w[0], w[1]));
                }
                *best = best.max(slowest);
                return;
            }
            for i in 0..left.len() {
                let v = left.remove(i);
                path.push(v);
                go(path, left, r, best);
                path.pop();
                left.insert(i, v);
            }
        }
        let mut best = 0.0;
        go(&mut vec![0], &mut (1..k).collect(), r, &mut best);
        best
    }

    #[test]
    fn one_slow_hop_that_no_ring_avoids_is_the_answer() {
        // GPU0-GPU1 fast, everything else slow: any ring through GPU2 uses two slow hops.
        let m = [0.0, 300.0, 10.0, 300.0, 0.0, 10.0, 10.0, 10.0, 0.0];
        let ring = best_ring(3, &matrix(3, &m)).unwrap();
        assert_eq!(ring, RingBandwidth { gbps: 10.0, upper_bound_gbps: 10.0 });
    }

    #[test]
    fn a_ring_around_the_slow_pairs_is_found() {
        // Four GPUs where 0-2 and 1-3 are slow: the ring 0-1-2-3 avoids both.
        let (f, s) = (50.0, 10.0);
        let m = [0.0, f, s, f, f, 0.0, f, s, s, f, 0.0, f, f, s, f, 0.0];
        assert_eq!(best_ring(4, &matrix(4, &m)).unwrap().gbps, 50.0);
    }

    #[test]
    fn fewer_than_two_gpus_have_no_ring_and_two_use_their_pair() {
        assert_eq!(best_ring(0, &|_, _| 1.0), None);
        assert_eq!(best_ring(1, &|_, _| 1.0), None);
        assert_eq!(best_ring(2, &|_, _| 7.5).unwrap().gbps, 7.5);
    }

    #[test]
    fn bad_rates_count_as_no_link() {
        let ring = best_ring(3, &|a, b| if a + b == 1 { f64::NAN } else { 5.0 }).unwrap();
        assert_eq!(ring.gbps, 0.0);
    }

    #[test]
    fn large_sets_get_a_real_ring_and_a_bound() {
        // 24 GPUs in two NVSwitch islands of 12 joined by slow links: any ring crosses twice.
        let r = |a: usize, b: usize| if (a < 12) == (b < 12) { 300.0 } else { 10.0 };
        let ring = best_ring(24, &r).unwrap();
        assert_eq!(ring.gbps, 10.0);
        assert!(ring.upper_bound_gbps >= ring.gbps);
        // All alike: greedy reaches the bound.
        assert!(best_ring(32, &|_, _| 450.0).unwrap().is_exact());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn the_exact_answer_is_the_brute_force_best(k in 3usize..=7, seed in proptest::collection::vec(0u8..5, 49)) {
            let rates = [10.0, 26.25, 31.5, 50.0, 300.0];
            let rate = |a: usize, b: usize| {
                let (i, j) = if a < b { (a, b) } else { (b, a) };
                rates[usize::from(seed[i * 7 + j])]
            };
            let ring = best_ring(k, &rate).unwrap();
            prop_assert!(ring.is_exact());
            prop_assert_eq!(ring.gbps, brute(k, &rate));
        }
    }
}
