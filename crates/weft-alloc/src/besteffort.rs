//! Best-effort GPU set selection with go-gpuallocator's objective (reference §1.3).
//!
//! PLACEHOLDER: picks the highest-scoring set of the request size holding the required GPUs by
//! enumerating subsets. To be replaced by the exact partition-objective solver.

use crate::{AllocError, Allocation, Optimality, PreparedNode, Request};

/// Best-effort allocation.
pub fn allocate(node: &PreparedNode, req: &Request<'_>) -> Result<Allocation, AllocError> {
    let rest: Vec<usize> = req.available.iter().copied().filter(|g| !req.required.contains(g)).collect();
    let need = req.count - req.required.len();
    let mut best: Option<(u32, Vec<usize>)> = None;
    let mut pick = Vec::new();
    fn rec(
        node: &PreparedNode,
        rest: &[usize],
        start: usize,
        need: usize,
        base: &[usize],
        pick: &mut Vec<usize>,
        best: &mut Option<(u32, Vec<usize>)>,
    ) {
        if pick.len() == need {
            let mut set: Vec<usize> = base.iter().chain(pick.iter()).copied().collect();
            set.sort_unstable();
            let s = node.set_score(&set);
            if best.as_ref().is_none_or(|(b, _)| s > *b) {
                *best = Some((s, set));
            }
            return;
        }
        for i in start..rest.len() {
            pick.push(rest[i]);
            rec(node, rest, i + 1, need, base, pick, best);
            pick.pop();
        }
    }
    rec(node, &rest, 0, need, req.required, &mut pick, &mut best);
    let (set_score, gpus) = best.ok_or(AllocError::InsufficientGpus { requested: req.count, available: req.available.len() })?;
    Ok(Allocation { gpus, set_score, objective: u64::from(set_score), optimality: Optimality::Exact })
}
