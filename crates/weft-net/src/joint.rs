//! One decision for a pod's GPUs and VFs on one node, over the node's published topology: the
//! scheduler extender makes it when it scores and binds, `weft simulate` when it places.
//!
//! 1. The GPU set is weft's (`weft_alloc::choose_set` with the ring quality): the best-effort set
//!    (go-gpuallocator's objective, exact) unless another set has a faster best ring.
//! 2. The VFs of each physnet the pod asks for are chosen nearest that set ([`crate::choice`]).
//! 3. When some chosen VF does not share a PCIe switch with the GPUs, the GPU sets of *equal*
//!    best-effort quality (same set score and same packing objective) that hold a free GPU sharing
//!    a switch with a free VF of an asked physnet are tried, and the one with the most VFs near
//!    wins (ties keep the best-effort set). GPU quality is never traded for NIC nearness; among
//!    equally good GPU sets, the one GPUDirect RDMA pays on is taken.
//! 4. VFs already fixed elsewhere count the same way. Under DRA the scheduler allocates a claim's VF
//!    (weft's NIC driver, docs/nic-dra.md) before the extender binds the pod, so bind passes those
//!    VFs as `fixed`: they are not chosen again, but among equally good GPU sets the one with the
//!    most chosen-or-fixed VFs under a GPU's switch wins.

use std::collections::BTreeMap;

use weft_alloc::{AllocError, Allocation, Policy, PreparedNode, Request, SetQuality, allocate, choose_set};
use weft_topology::NodeTopology;

use crate::choice::{ChoiceError, choose, near_enough, topology_candidates};

/// The VFs a pod asks for, by physnet.
pub type VfAsk = BTreeMap<String, usize>;

/// The VFs chosen for a pod, by physnet, and how many of them share a PCIe switch with its GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VfPlan {
    /// PCI addresses by physnet, in the order chosen.
    pub vfs: BTreeMap<String, Vec<String>>,
    /// Chosen VFs under the same PCIe switch tree as one of the pod's GPUs.
    pub near_switch: usize,
}

impl VfPlan {
    /// Number of VFs chosen.
    pub fn count(&self) -> usize {
        self.vfs.values().map(Vec::len).sum()
    }
}

/// Why a pod's VFs cannot be had on a node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("physnet {physnet}: {error}")]
pub struct VfShortage {
    /// The physnet.
    pub physnet: String,
    /// What is short.
    pub error: ChoiceError,
}

/// Why no joint decision could be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JointError {
    /// The GPUs cannot be had.
    #[error(transparent)]
    Gpus(#[from] AllocError),
    /// The VFs cannot be had.
    #[error(transparent)]
    Vfs(#[from] VfShortage),
}

/// The VFs `ask` names, each physnet's nearest the GPUs at `gpus`, among the VFs `free` accepts.
pub fn plan_vfs(
    node: &NodeTopology,
    free: &dyn Fn(&str) -> bool,
    gpus: &[usize],
    ask: &VfAsk,
) -> Result<VfPlan, VfShortage> {
    let mut plan = VfPlan::default();
    for (physnet, &count) in ask {
        if count == 0 {
            continue;
        }
        let candidates = topology_candidates(node, physnet, free, gpus);
        let chosen = choose(&candidates, &[], count).map_err(|error| VfShortage { physnet: physnet.clone(), error })?;
        plan.near_switch += chosen
            .iter()
            .filter(|a| candidates.iter().any(|c| c.pci_address == a.as_str() && near_enough(c.near)))
            .count();
        plan.vfs.insert(physnet.clone(), chosen);
    }
    Ok(plan)
}

/// A joint decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JointChoice {
    /// The GPU set (empty for a pod that asks for none).
    pub gpus: Vec<usize>,
    /// The GPU set's best-effort allocation, when the pod asks for GPUs.
    pub allocation: Option<Allocation>,
    /// The VFs.
    pub vfs: VfPlan,
}

/// How many of the `fixed` VFs (PCI addresses) share a PCIe switch with one of `gpus`; addresses
/// the node does not publish count as not near.
pub fn fixed_near(node: &NodeTopology, fixed: &[String], gpus: &[usize]) -> usize {
    fixed
        .iter()
        .filter(|a| {
            node.vfs()
                .iter()
                .position(|v| v.pci_address == a.as_str())
                .is_some_and(|i| near_enough(node.vf_nearest(i, gpus)))
        })
        .count()
}

impl JointChoice {
    /// Whether the pod has GPUs and VFs and every VF shares a PCIe switch with one of its GPUs
    /// (`None` when the pod lacks either, so the question does not arise).
    pub fn all_near(&self) -> Option<bool> {
        let count = self.vfs.count();
        (count > 0 && !self.gpus.is_empty()).then_some(self.vfs.near_switch == count)
    }
}

/// Decides a pod's `gpu_count` GPUs among `free_gpus` and its VFs (`ask`) among those `vf_free`
/// accepts, on one node, beside the VFs already `fixed` for it (see the module docs for the rule).
pub fn decide(
    prepared: &PreparedNode,
    node: &NodeTopology,
    free_gpus: &[usize],
    vf_free: &dyn Fn(&str) -> bool,
    gpu_count: usize,
    ask: &VfAsk,
    fixed: &[String],
) -> Result<JointChoice, JointError> {
    if gpu_count == 0 {
        let vfs = plan_vfs(node, vf_free, &[], ask)?;
        return Ok(JointChoice { gpus: Vec::new(), allocation: None, vfs });
    }
    let base = choose_set(prepared, free_gpus, gpu_count, SetQuality::Ring)?;
    let base_plan = plan_vfs(node, vf_free, &base.gpus, ask)?;
    let near = |gpus: &[usize], plan: &VfPlan| plan.near_switch + fixed_near(node, fixed, gpus);
    let wanted = base_plan.count() + fixed.len();
    let mut best_near = near(&base.gpus, &base_plan);
    let mut best = JointChoice { gpus: base.gpus.clone(), allocation: Some(base.clone()), vfs: base_plan };
    if best_near == wanted {
        return Ok(best);
    }
    // A set chosen for its faster ring has no equal among the best-effort sets tried below.
    let best_effort =
        allocate(prepared, &Policy::BestEffort, &Request { count: gpu_count, available: free_gpus, required: &[] })?;
    if best_effort.gpus != base.gpus {
        return Ok(best);
    }
    // GPUs that share a switch with some free VF of an asked physnet or with a fixed VF, not
    // already in the set.
    let hopeful: Vec<usize> = free_gpus
        .iter()
        .copied()
        .filter(|g| !best.gpus.contains(g))
        .filter(|&g| {
            node.vfs().iter().enumerate().any(|(i, v)| {
                let asked =
                    v.physnet.as_ref().is_some_and(|p| ask.get(p).is_some_and(|&n| n > 0)) && vf_free(&v.pci_address);
                (asked || fixed.contains(&v.pci_address)) && near_enough(node.vf_nearest(i, &[g]))
            })
        })
        .collect();
    for g in hopeful {
        let req = Request { count: gpu_count, available: free_gpus, required: &[g] };
        let Ok(alt) = allocate(prepared, &Policy::BestEffort, &req) else { continue };
        if (alt.set_score, alt.objective) != (base.set_score, base.objective) {
            continue;
        }
        let Ok(plan) = plan_vfs(node, vf_free, &alt.gpus, ask) else { continue };
        let alt_near = near(&alt.gpus, &plan);
        if alt_near > best_near {
            best_near = alt_near;
            best = JointChoice { gpus: alt.gpus.clone(), allocation: Some(alt), vfs: plan };
        }
    }
    Ok(best)
}

/// The node score of a joint decision: the GPU score (1..=100) alone when the pod lacks GPUs or
/// VFs; otherwise the mean of the GPU score and the share of VFs under a GPU's switch (as 0..=100),
/// so of two nodes equally good for the GPUs, the one where GPUDirect RDMA pays scores higher.
pub fn joint_score(gpu_score: u8, choice: &JointChoice) -> u8 {
    match choice.all_near() {
        None => gpu_score,
        Some(_) => {
            let share = 100 * choice.vfs.near_switch / choice.vfs.count();
            let mean = (usize::from(gpu_score) + share).div_ceil(2);
            u8::try_from(mean.clamp(1, 100)).unwrap_or(100)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use weft_topology::{Vf, parse_node};

    /// Four PCIe GPUs, two per switch (PIX within a switch, SYS across); NIC0 under switch A
    /// (GPU0, GPU1), NIC1 under switch B (GPU2, GPU3); `per_nic` fabric VFs on each NIC.
    fn node(per_nic: usize) -> NodeTopology {
        let text = "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\n\
                    GPU0\t X \tPIX\tSYS\tSYS\tPIX\tSYS\n\
                    GPU1\tPIX\t X \tSYS\tSYS\tPIX\tSYS\n\
                    GPU2\tSYS\tSYS\t X \tPIX\tSYS\tPIX\n\
                    GPU3\tSYS\tSYS\tPIX\t X \tSYS\tPIX\n\
                    NIC0\tPIX\tPIX\tSYS\tSYS\t X \tSYS\n\
                    NIC1\tSYS\tSYS\tPIX\tPIX\tSYS\t X \n";
        let mut node = parse_node(text, "t").unwrap();
        let names: Vec<String> = node.nics.iter().map(|n| n.name.clone()).collect();
        let mut vfs = Vec::new();
        for (k, bus) in [(0, "0c"), (1, "8c")] {
            for f in 0..per_nic {
                vfs.push(Vf {
                    pci_address: format!("0000:{bus}:00.{}", f + 2),
                    nic: names[k].clone(),
                    physnet: Some("fabric".into()),
                });
            }
        }
        node.set_vfs(vfs).unwrap();
        node
    }

    fn ask(n: usize) -> VfAsk {
        VfAsk::from([("fabric".to_string(), n)])
    }

    #[test]
    fn the_vf_follows_the_gpus_switch() {
        let n = node(2);
        let p = PreparedNode::new(&n).unwrap();
        let all = |_: &str| true;
        let c = decide(&p, &n, &[0, 1, 2, 3], &all, 2, &ask(1), &[]).unwrap();
        assert_eq!(c.gpus, [0, 1], "best-effort takes a PIX pair; lowest first");
        assert_eq!(c.vfs.vfs["fabric"], ["0000:0c:00.2"]);
        assert_eq!(c.all_near(), Some(true));
    }

    #[test]
    fn among_equally_good_gpu_sets_the_one_beside_a_free_vf_wins() {
        let n = node(1);
        let p = PreparedNode::new(&n).unwrap();
        // Switch A's only VF is taken: the best-effort pair (0, 1) would get a VF across the
        // host bridge; the equally good pair (2, 3) sits beside a free VF.
        let free = |a: &str| a != "0000:0c:00.2";
        let c = decide(&p, &n, &[0, 1, 2, 3], &free, 2, &ask(1), &[]).unwrap();
        assert_eq!(c.gpus, [2, 3]);
        assert_eq!(c.vfs.vfs["fabric"], ["0000:8c:00.2"]);
        assert_eq!(c.all_near(), Some(true));
        // A worse GPU set is never taken for NIC nearness: with only GPU0, GPU1 and GPU2 free, a
        // pair means (0, 1) (PIX), not a SYS pair with GPU2.
        let c = decide(&p, &n, &[0, 1, 2], &free, 2, &ask(1), &[]).unwrap();
        assert_eq!(c.gpus, [0, 1]);
        assert_eq!(c.all_near(), Some(false));
    }

    #[test]
    fn gpus_go_beside_a_vf_fixed_before_bind() {
        let n = node(1);
        let p = PreparedNode::new(&n).unwrap();
        let all = |_: &str| true;
        let on_b = ["0000:8c:00.2".to_string()];
        // Without it the best-effort pair is (0, 1); the scheduler's DRA allocation put the pod's
        // VF under switch B, so the equally good pair (2, 3) beside it wins.
        assert_eq!(decide(&p, &n, &[0, 1, 2, 3], &all, 2, &VfAsk::new(), &[]).unwrap().gpus, [0, 1]);
        let c = decide(&p, &n, &[0, 1, 2, 3], &all, 2, &VfAsk::new(), &on_b).unwrap();
        assert_eq!(c.gpus, [2, 3]);
        assert_eq!(c.vfs.count(), 0, "a fixed VF is not chosen again");
        assert_eq!(fixed_near(&n, &on_b, &c.gpus), 1);
        // A worse GPU set is never taken for it: with GPU3 busy, (2, x) would be a SYS pair.
        let c = decide(&p, &n, &[0, 1, 2], &all, 2, &VfAsk::new(), &on_b).unwrap();
        assert_eq!(c.gpus, [0, 1]);
        assert_eq!(fixed_near(&n, &on_b, &c.gpus), 0);
        // Fixed and asked VFs count together: with B's VF fixed and one more asked while A's two
        // VFs are free and B's other is taken, (2, 3) holds the fixed VF near but the asked one
        // far, (0, 1) the opposite: a tie, which keeps the best-effort pair; with B's other VF
        // free as well, (2, 3) has both near and wins.
        let n2 = node(2);
        let p2 = PreparedNode::new(&n2).unwrap();
        let not_b_other = |a: &str| a != "0000:8c:00.3" && a != "0000:8c:00.2";
        let c = decide(&p2, &n2, &[0, 1, 2, 3], &not_b_other, 2, &ask(1), &on_b).unwrap();
        assert_eq!(
            (c.gpus.as_slice(), c.vfs.vfs["fabric"].as_slice()),
            (&[0, 1][..], &["0000:0c:00.2".to_string()][..])
        );
        let not_fixed = |a: &str| a != "0000:8c:00.2";
        let c = decide(&p2, &n2, &[0, 1, 2, 3], &not_fixed, 2, &ask(1), &on_b).unwrap();
        assert_eq!(c.gpus, [2, 3]);
        assert_eq!(c.vfs.vfs["fabric"], ["0000:8c:00.3"]);
        // An address the node does not publish is never near.
        assert_eq!(fixed_near(&n, &["0000:ff:00.7".to_string()], &[0, 1, 2, 3]), 0);
    }

    #[test]
    fn scores_and_shortages() {
        let n = node(1);
        let p = PreparedNode::new(&n).unwrap();
        let all = |_: &str| true;
        let near = decide(&p, &n, &[0, 1, 2, 3], &all, 1, &ask(1), &[]).unwrap();
        let none = |_: &str| false;
        let far = decide(&p, &n, &[0, 1], &|a: &str| a == "0000:8c:00.2", 1, &ask(1), &[]).unwrap();
        assert_eq!(far.all_near(), Some(false));
        assert_eq!(joint_score(80, &near), 90);
        assert_eq!(joint_score(80, &far), 40);
        let gpus_only = decide(&p, &n, &[0, 1], &all, 1, &VfAsk::new(), &[]).unwrap();
        assert_eq!(joint_score(80, &gpus_only), 80, "no VFs asked: the GPU score alone");
        let e = decide(&p, &n, &[0, 1], &none, 1, &ask(1), &[]).unwrap_err();
        assert!(
            e.to_string().contains("physnet fabric") && e.to_string().contains("1 VFs asked for, 0 available"),
            "{e}"
        );
        let vfs_only = decide(&p, &n, &[], &all, 0, &ask(2), &[]).unwrap();
        assert_eq!(vfs_only.vfs.count(), 2);
        assert_eq!(vfs_only.all_near(), None);
        assert!(matches!(decide(&p, &n, &[0], &all, 2, &ask(0), &[]), Err(JointError::Gpus(_))));
    }
}
