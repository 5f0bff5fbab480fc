//! The set one container gets: the pod's recorded decision when it fits what the kubelet offers,
//! else weft's exact best-effort set over what it offers. Pure.

use weft_alloc::{AllocError, Policy, PreparedNode, Request, allocate};
use weft_deviceplugin::accounting::decision_left;

/// Why the answer is what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Basis {
    /// From the pod's recorded decision.
    Decision,
    /// weft's best-effort set; the string says why not the decision.
    BestEffort(String),
}

/// `size` GPUs from `available` holding every `required` one. `decided` is the pod's decision for
/// this node; `held` are the GPUs the pod's other running containers already got (a container
/// takes its share from what the decision has left).
///
/// The decision is answered when the GPUs left of it (plus the required ones) are all available
/// and enough: the best `size` of them (one container of a pod with several takes the best-linked
/// part). Otherwise the best `size` of everything available, so the pick is as good as weft can
/// make it with or without the extender.
pub fn choose(
    node: &PreparedNode,
    available: &[usize],
    required: &[usize],
    size: usize,
    decided: Option<&[usize]>,
    held: &[usize],
) -> Result<(Vec<usize>, Basis), AllocError> {
    let best = |pool: &[usize]| {
        allocate(node, &Policy::BestEffort, &Request { count: size, available: pool, required }).map(|a| a.gpus)
    };
    let why_not = match decided.map(|d| decision_left("GPUs", d, held, required, available, size)) {
        None => "the pod has no decision for this node".to_string(),
        Some(Ok(pool)) => return best(&pool).map(|gpus| (gpus, Basis::Decision)),
        Some(Err(why)) => why,
    };
    best(available).map(|gpus| (gpus, Basis::BestEffort(why_not)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_topology::{PairLink, model::uniform_node};

    /// 8 GPUs: two NVLink islands {0..3} and {4..7}; pairs inside an island score higher.
    fn islands() -> PreparedNode {
        let n = 8;
        let mut scores = vec![0u32; n * n];
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    scores[a * n + b] = if a / 4 == b / 4 { 100 } else { 10 };
                }
            }
        }
        PreparedNode::from_scores(n, scores).expect("a valid node")
    }

    #[test]
    fn a_fitting_decision_is_answered() {
        let node = islands();
        let all: Vec<usize> = (0..8).collect();
        let (gpus, basis) = choose(&node, &all, &[], 2, Some(&[0, 5]), &[]).expect("a set");
        assert_eq!((gpus, basis), (vec![0, 5], Basis::Decision), "the decision wins even where a better pair exists");
    }

    #[test]
    fn a_decision_with_a_taken_gpu_falls_back_to_the_best_set() {
        let node = islands();
        let available = [1, 2, 4, 5, 6];
        let (gpus, basis) = choose(&node, &available, &[], 2, Some(&[0, 1]), &[]).expect("a set");
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0] / 4, gpus[1] / 4, "the best-effort pair shares an island: {gpus:?}");
        assert!(matches!(basis, Basis::BestEffort(ref why) if why.contains("[0]")), "{basis:?}");
    }

    #[test]
    fn without_a_decision_the_pick_is_the_exact_best() {
        let node = islands();
        // Free: 0 alone in its island (1..3 taken), and 4..7: the best 4 is the whole second island.
        let available = [0, 4, 5, 6, 7];
        let (gpus, basis) = choose(&node, &available, &[], 4, None, &[]).expect("a set");
        assert_eq!(gpus, vec![4, 5, 6, 7]);
        assert!(matches!(basis, Basis::BestEffort(_)));
    }

    #[test]
    fn a_container_takes_its_share_of_what_the_decision_has_left() {
        let node = islands();
        let all: Vec<usize> = (0..8).collect();
        // The pod was decided 4 GPUs; its first container holds 0 and 1.
        let (gpus, basis) = choose(&node, &all, &[], 2, Some(&[0, 1, 2, 3]), &[0, 1]).expect("a set");
        assert_eq!((gpus, basis), (vec![2, 3], Basis::Decision));
        // Nothing left of the decision for a third container.
        let (_, basis) = choose(&node, &all, &[], 2, Some(&[0, 1, 2, 3]), &[0, 1, 2, 3]).expect("a set");
        assert!(matches!(basis, Basis::BestEffort(ref why) if why.contains("0 decided GPUs are left")), "{basis:?}");
    }

    #[test]
    fn required_devices_are_always_in_the_answer() {
        let node = islands();
        let all: Vec<usize> = (0..8).collect();
        let (gpus, _) = choose(&node, &all, &[6], 2, Some(&[0, 1]), &[]).expect("a set");
        assert!(gpus.contains(&6), "{gpus:?}");
        let (gpus, _) = choose(&node, &all, &[6], 2, None, &[]).expect("a set");
        assert!(gpus.contains(&6) && gpus.iter().all(|g| g / 4 == 1), "{gpus:?}");
    }

    #[test]
    fn an_impossible_request_is_an_error_not_a_short_answer() {
        let node = uniform_node("n", 2, PairLink::default());
        let prepared = PreparedNode::new(&node).expect("prepared");
        assert!(choose(&prepared, &[0], &[], 2, None, &[]).is_err());
    }
}
