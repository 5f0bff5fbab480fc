//! How well the VF the scheduler allocated agrees with the GPUs weft's scheduler extender gave the
//! pod. Pure.
//!
//! The DRA scheduler chose the device, and it accounts for it: the driver honours that choice and
//! never prepares another VF (a swap would hand out a VF the scheduler still counts as free and
//! leave the allocated one idle, double-booking the node). What it can do is say whether the
//! choice is as near the pod's GPUs as the node allowed: [`judge`] ranks the VFs of the allocated
//! VF's physnet that are free (not prepared for another claim) by `weft_net::choice`'s nearness
//! to the GPUs in the pod's `weft.io/gpu-decision`, and the VF is *aligned* when none of them is
//! nearer. The answer goes on the [`crate::prepared::PreparedNic`] (`aligned`) for the status
//! writer, and a misaligned one is logged with the reason.

use std::collections::BTreeSet;

use weft_net::choice::{Candidate, near_enough, topology_candidates};
use weft_topology::{NodeTopology, PcieRelation};

/// The verdict on one VF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alignment {
    /// Whether no free VF of its physnet is nearer the pod's GPUs.
    pub aligned: bool,
    /// Why, in words.
    pub reason: String,
}

fn words(r: Option<PcieRelation>) -> String {
    match r {
        Some(r) if near_enough(Some(r)) => format!("{} (same PCIe switch tree)", r.token()),
        Some(r) => r.token().to_string(),
        None => "unrelated".to_string(),
    }
}

/// Whether the VF at `vf_pci` is among the free VFs nearest the GPUs `gpus` of `topology`;
/// `taken` are the VFs prepared for other claims. `None` when the topology does not list the VF or
/// the pod holds no GPUs.
pub fn judge(topology: &NodeTopology, vf_pci: &str, gpus: &[usize], taken: &BTreeSet<String>) -> Option<Alignment> {
    if gpus.is_empty() {
        return None;
    }
    let index = topology.vfs().iter().position(|v| v.pci_address == vf_pci)?;
    let physnet = topology.vfs()[index].physnet.as_deref();
    let free = |pci: &str| pci == vf_pci || !taken.contains(pci);
    let candidates: Vec<Candidate<'_>> = match physnet {
        Some(p) => topology_candidates(topology, p, free, gpus),
        None => topology
            .vfs()
            .iter()
            .enumerate()
            .filter(|(_, v)| v.physnet.is_none() && free(&v.pci_address))
            .map(|(i, v)| Candidate { pci_address: &v.pci_address, pf: &v.nic, near: topology.vf_nearest(i, gpus) })
            .collect(),
    };
    let mine = topology.vf_nearest(index, gpus);
    let best = candidates.iter().map(|c| c.near).max().flatten();
    let aligned = mine >= best;
    let pool = physnet.map_or_else(|| "without a physnet".to_string(), |p| format!("of physnet {p}"));
    let reason = if aligned {
        format!("VF {vf_pci} is {} to the pod's GPUs {gpus:?}, as near as any free VF {pool}", words(mine))
    } else {
        let nearer: Vec<&str> = candidates.iter().filter(|c| c.near == best).map(|c| c.pci_address).take(3).collect();
        format!(
            "VF {vf_pci} is {} to the pod's GPUs {gpus:?}; free VFs {pool} are nearer ({}: {})",
            words(mine),
            words(best),
            nearer.join(", ")
        )
    };
    Some(Alignment { aligned, reason })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use weft_topology::Vf;

    /// GPU0 and NIC0 under one switch (PIX), GPU1 and NIC1 under another; each NIC has two VFs.
    fn node() -> NodeTopology {
        let text = "\tGPU0\tGPU1\tNIC0\tNIC1\n\
                    GPU0\t X \tSYS\tPIX\tSYS\n\
                    GPU1\tSYS\t X \tSYS\tPIX\n\
                    NIC0\tPIX\tSYS\t X \tSYS\n\
                    NIC1\tSYS\tPIX\tSYS\t X \n";
        let mut node = weft_topology::parse_node(text, "n1").unwrap();
        let nics: Vec<String> = node.nics.iter().map(|n| n.name.clone()).collect();
        let vf =
            |pci: &str, k: usize| Vf { pci_address: pci.into(), nic: nics[k].clone(), physnet: Some("fabric".into()) };
        node.set_vfs(vec![vf("0000:0c:00.2", 0), vf("0000:0c:00.3", 0), vf("0000:8c:00.2", 1), vf("0000:8c:00.3", 1)])
            .unwrap();
        node
    }

    #[test]
    fn a_vf_beside_the_gpu_is_aligned_one_across_the_node_is_not() {
        let n = node();
        let none = BTreeSet::new();
        let a = judge(&n, "0000:0c:00.3", &[0], &none).unwrap();
        assert!(a.aligned, "{a:?}");
        assert!(a.reason.contains("PIX (same PCIe switch tree)"), "{}", a.reason);
        let a = judge(&n, "0000:8c:00.2", &[0], &none).unwrap();
        assert!(!a.aligned);
        assert!(a.reason.contains("SYS") && a.reason.contains("0000:0c:00.2, 0000:0c:00.3"), "{}", a.reason);
    }

    #[test]
    fn when_the_near_vfs_are_taken_a_far_one_is_the_best_there_is() {
        let n = node();
        let taken: BTreeSet<String> = ["0000:0c:00.2".to_string(), "0000:0c:00.3".to_string()].into();
        assert!(judge(&n, "0000:8c:00.2", &[0], &taken).unwrap().aligned);
        assert_eq!(judge(&n, "0000:8c:00.2", &[], &taken), None, "no GPUs: nothing to align with");
        assert_eq!(judge(&n, "0000:99:00.2", &[0], &taken), None, "a VF the topology does not list");
    }
}
