//! Which VFs a pod gets: the ones nearest the GPUs it holds.
//!
//! GPUDirect RDMA pays only when the NIC and the GPU talk without crossing the CPU's host bridge:
//! under one PCIe switch (tree). So a VF is ranked by its best relation to any of the pod's GPUs,
//! in `nvidia-smi topo -m` terms: `PIX`/`PXB` (same switch tree) before `PHB` (same PCIe root)
//! before `NODE` (same NUMA node) before `SYS`. Among equally near VFs, one on a PF the pod has
//! fewer VFs from comes first (two VFs on two PFs carry twice the bandwidth of two on one), then the
//! lower PCI address, so the choice is the same on every call.
//!
//! Where sysfs gave no PCI path, the NUMA node stands in (`NODE` when equal, else `SYS`).
//!
//! The ranking works on [`Candidate`]s, VFs whose nearness is already judged, so the node (which
//! knows PCI paths from sysfs: [`candidates`]) and the scheduler extender (which knows each NIC's
//! relation to each GPU from the published topology: [`topology_candidates`]) choose by one rule.

use std::collections::BTreeMap;

use weft_topology::discover::PciPath;
use weft_topology::{NodeTopology, PcieRelation};

/// A VF that may be given, and where it sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VfPlace<'a> {
    /// Its PCI address (the device ID the kubelet knows it by).
    pub pci_address: &'a str,
    /// Its PF's PCI address.
    pub pf: &'a str,
    /// Where it sits in the PCI tree.
    pub pci_path: Option<&'a PciPath>,
    /// Its NUMA node.
    pub numa_node: Option<u32>,
}

/// A device the VFs should sit near (a GPU the pod holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePlace<'a> {
    /// Where it sits in the PCI tree.
    pub pci_path: Option<&'a PciPath>,
    /// Its NUMA node.
    pub numa_node: Option<u32>,
}

/// The PCIe relation between a VF and a device (farthest `SYS` … nearest `PIX`).
pub fn relation(vf: &VfPlace<'_>, dev: &DevicePlace<'_>) -> PcieRelation {
    let same_numa = match (vf.numa_node, dev.numa_node) {
        (Some(a), Some(b)) => a == b,
        // One NUMA node (or none known on either side): nothing to cross.
        (None, None) => true,
        _ => false,
    };
    match (vf.pci_path, dev.pci_path) {
        (Some(a), Some(b)) => a.relation_to(b, same_numa),
        _ if same_numa && vf.numa_node.is_some() => PcieRelation::Node,
        _ => PcieRelation::Sys,
    }
}

/// The VF's nearest relation to any of `devices` (`None` without devices).
pub fn nearest(vf: &VfPlace<'_>, devices: &[DevicePlace<'_>]) -> Option<PcieRelation> {
    devices.iter().map(|d| relation(vf, d)).max()
}

/// Whether a VF and a device share a PCIe switch tree (their traffic does not cross the host
/// bridge), which is what GPUDirect RDMA needs.
pub fn shares_switch(vf: &VfPlace<'_>, devices: &[DevicePlace<'_>]) -> bool {
    near_enough(nearest(vf, devices))
}

/// A VF that may be given, with its nearness to the pod's devices judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// Its PCI address.
    pub pci_address: &'a str,
    /// Its PF (a PCI address or NIC name: only compared).
    pub pf: &'a str,
    /// Its nearest relation to any of the pod's devices (`None` without devices).
    pub near: Option<PcieRelation>,
}

/// The VFs as candidates near `devices` (PCI paths from sysfs).
pub fn candidates<'a>(vfs: &[VfPlace<'a>], devices: &[DevicePlace<'_>]) -> Vec<Candidate<'a>> {
    vfs.iter().map(|v| Candidate { pci_address: v.pci_address, pf: v.pf, near: nearest(v, devices) }).collect()
}

/// The VFs of `physnet` on a published node topology that `free` accepts, as candidates near the
/// GPUs at positions `gpus` (each VF takes its NIC's relation to them).
pub fn topology_candidates<'a>(
    node: &'a NodeTopology,
    physnet: &str,
    free: impl Fn(&str) -> bool,
    gpus: &[usize],
) -> Vec<Candidate<'a>> {
    node.vfs()
        .iter()
        .enumerate()
        .filter(|(_, v)| v.physnet.as_deref() == Some(physnet) && free(&v.pci_address))
        .map(|(i, v)| Candidate { pci_address: &v.pci_address, pf: &v.nic, near: node.vf_nearest(i, gpus) })
        .collect()
}

/// Whether a chosen VF's nearness means GPUDirect RDMA pays (same PCIe switch tree).
pub fn near_enough(near: Option<PcieRelation>) -> bool {
    near.is_some_and(|r| !r.crosses_host_bridge())
}

/// Why no VFs could be chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    /// More VFs asked for than are available.
    #[error("{asked} VFs asked for, {available} available")]
    TooFew {
        /// Asked for.
        asked: usize,
        /// Available.
        available: usize,
    },
    /// A VF that must be included is not available.
    #[error("VF {0} must be included but is not available")]
    MissingRequired(String),
    /// More VFs must be included than asked for.
    #[error("{required} VFs must be included but only {asked} asked for")]
    TooManyRequired {
        /// Must be included.
        required: usize,
        /// Asked for.
        asked: usize,
    },
}

/// `count` VFs from `available`, holding every VF in `must_include`, nearest first (see the module
/// docs for the order). Returned in the order chosen.
pub fn choose(available: &[Candidate<'_>], must_include: &[&str], count: usize) -> Result<Vec<String>, ChoiceError> {
    if count > available.len() {
        return Err(ChoiceError::TooFew { asked: count, available: available.len() });
    }
    if must_include.len() > count {
        return Err(ChoiceError::TooManyRequired { required: must_include.len(), asked: count });
    }
    let mut chosen: Vec<usize> = Vec::with_capacity(count);
    for m in must_include {
        let i = available
            .iter()
            .position(|v| v.pci_address == *m)
            .ok_or_else(|| ChoiceError::MissingRequired((*m).to_string()))?;
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    let mut per_pf: BTreeMap<&str, usize> = BTreeMap::new();
    for &i in &chosen {
        *per_pf.entry(available[i].pf).or_default() += 1;
    }
    while chosen.len() < count {
        let best = (0..available.len()).filter(|i| !chosen.contains(i)).min_by(|&a, &b| {
            let (va, vb) = (&available[a], &available[b]);
            vb.near
                .cmp(&va.near)
                .then_with(|| per_pf.get(va.pf).copied().unwrap_or(0).cmp(&per_pf.get(vb.pf).copied().unwrap_or(0)))
                .then_with(|| va.pci_address.cmp(vb.pci_address))
        });
        let Some(i) = best else { break };
        *per_pf.entry(available[i].pf).or_default() += 1;
        chosen.push(i);
    }
    Ok(chosen.into_iter().map(|i| available[i].pci_address.to_string()).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use std::path::Path;

    use super::*;

    fn path(s: &str) -> PciPath {
        PciPath::from_sysfs_path(Path::new(s)).unwrap()
    }

    // Two PCIe switches on root 00 (NUMA 0), one on root 80 (NUMA 1). Each switch has a GPU and a
    // NIC PF; VFs sit beside their PF.
    const SW_A: &str = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0";
    const SW_B: &str = "/sys/devices/pci0000:00/0000:00:02.0/0000:11:00.0/0000:12:00.0";
    const SW_C: &str = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0";

    struct Node {
        gpus: Vec<(PciPath, u32)>,
        vfs: Vec<(String, String, PciPath, u32)>,
    }

    fn node() -> Node {
        let gpus = vec![
            (path(&format!("{SW_A}/0000:03:00.0")), 0),
            (path(&format!("{SW_B}/0000:13:00.0")), 0),
            (path(&format!("{SW_C}/0000:83:00.0")), 1),
        ];
        let mut vfs = Vec::new();
        for (sw, bus, numa) in [(SW_A, "04", 0), (SW_B, "14", 0), (SW_C, "84", 1)] {
            for f in 2..4 {
                let pci = format!("0000:{bus}:00.{f}");
                vfs.push((pci.clone(), format!("0000:{bus}:00.0"), path(&format!("{sw}/{pci}")), numa));
            }
        }
        Node { gpus, vfs }
    }

    fn places(n: &Node) -> Vec<VfPlace<'_>> {
        n.vfs
            .iter()
            .map(|(pci, pf, p, numa)| VfPlace { pci_address: pci, pf, pci_path: Some(p), numa_node: Some(*numa) })
            .collect()
    }

    fn gpus<'a>(n: &'a Node, which: &[usize]) -> Vec<DevicePlace<'a>> {
        which.iter().map(|&i| DevicePlace { pci_path: Some(&n.gpus[i].0), numa_node: Some(n.gpus[i].1) }).collect()
    }

    #[test]
    fn a_vf_under_the_gpus_switch_comes_first() {
        let n = node();
        let vfs = places(&n);
        assert_eq!(choose(&candidates(&vfs, &gpus(&n, &[1])), &[], 1).unwrap(), ["0000:14:00.2"]);
        assert_eq!(choose(&candidates(&vfs, &gpus(&n, &[2])), &[], 1).unwrap(), ["0000:84:00.2"]);
        assert_eq!(relation(&vfs[2], &gpus(&n, &[1])[0]), PcieRelation::Pix);
        assert_eq!(relation(&vfs[0], &gpus(&n, &[1])[0]), PcieRelation::Phb, "same root, other switch");
        assert_eq!(relation(&vfs[4], &gpus(&n, &[1])[0]), PcieRelation::Sys, "other root, other NUMA node");
        assert!(shares_switch(&vfs[2], &gpus(&n, &[1])));
        assert!(!shares_switch(&vfs[0], &gpus(&n, &[1])));
    }

    #[test]
    fn two_gpus_on_two_switches_get_one_vf_under_each() {
        let n = node();
        let vfs = places(&n);
        let got = choose(&candidates(&vfs, &gpus(&n, &[0, 1])), &[], 2).unwrap();
        assert_eq!(got, ["0000:04:00.2", "0000:14:00.2"]);
        // One GPU: both VFs from its switch's PF (nearness before spreading over PFs).
        assert_eq!(choose(&candidates(&vfs, &gpus(&n, &[0])), &[], 2).unwrap(), ["0000:04:00.2", "0000:04:00.3"]);
    }

    #[test]
    fn when_the_gpus_switch_is_full_the_same_root_then_numa_node_follow() {
        let n = node();
        let vfs: Vec<VfPlace<'_>> = places(&n).into_iter().filter(|v| !v.pci_address.starts_with("0000:04")).collect();
        assert_eq!(choose(&candidates(&vfs, &gpus(&n, &[0])), &[], 1).unwrap(), ["0000:14:00.2"], "same root");
        // Without PCI paths, the NUMA node decides.
        let flat: Vec<VfPlace<'_>> = vfs.iter().map(|v| VfPlace { pci_path: None, ..*v }).collect();
        let g = [DevicePlace { pci_path: None, numa_node: Some(1) }];
        assert_eq!(choose(&candidates(&flat, &g), &[], 1).unwrap(), ["0000:84:00.2"]);
        assert_eq!(relation(&flat[0], &g[0]), PcieRelation::Sys);
    }

    #[test]
    fn without_gpus_vfs_spread_over_pfs_and_required_ones_stay() {
        let n = node();
        let vfs = places(&n);
        assert_eq!(choose(&candidates(&vfs, &[]), &[], 3).unwrap(), ["0000:04:00.2", "0000:14:00.2", "0000:84:00.2"]);
        let got = choose(&candidates(&vfs, &gpus(&n, &[0])), &["0000:84:00.3"], 2).unwrap();
        assert_eq!(got, ["0000:84:00.3", "0000:04:00.2"]);
    }

    #[test]
    fn impossible_requests_are_errors_not_short_sets() {
        let n = node();
        let vfs = places(&n);
        assert_eq!(choose(&candidates(&vfs, &[]), &[], 7), Err(ChoiceError::TooFew { asked: 7, available: 6 }));
        assert_eq!(
            choose(&candidates(&vfs, &[]), &["0000:99:00.0"], 1),
            Err(ChoiceError::MissingRequired("0000:99:00.0".into()))
        );
        assert_eq!(
            choose(&candidates(&vfs, &[]), &["0000:04:00.2", "0000:04:00.3"], 1),
            Err(ChoiceError::TooManyRequired { required: 2, asked: 1 })
        );
    }

    #[test]
    fn the_published_topology_chooses_by_its_nic_relations() {
        // GPU0 and NIC0 under one switch, GPU1 and NIC1 under another switch of the other socket.
        let text = "\tGPU0\tGPU1\tNIC0\tNIC1\nGPU0\t X \tSYS\tPIX\tSYS\nGPU1\tSYS\t X \tSYS\tPXB\n\
                    NIC0\tPIX\tSYS\t X \tSYS\nNIC1\tSYS\tPXB\tSYS\t X \n";
        let mut node = weft_topology::parse_node(text, "t").unwrap();
        let (a, b) = (node.nics[0].name.clone(), node.nics[1].name.clone());
        let vf = |pci: &str, nic: &str, physnet: &str| weft_topology::Vf {
            pci_address: pci.into(),
            nic: nic.into(),
            physnet: Some(physnet.into()),
        };
        node.set_vfs(vec![
            vf("0000:0c:00.2", &a, "fabric"),
            vf("0000:8c:00.2", &b, "fabric"),
            vf("0000:8c:00.3", &b, "fabric"),
            vf("0000:8c:00.4", &b, "storage"),
        ])
        .unwrap();
        let all = |_: &str| true;
        let c = topology_candidates(&node, "fabric", all, &[1]);
        assert_eq!(c.len(), 3, "the storage VF is another physnet's");
        assert_eq!(choose(&c, &[], 1).unwrap(), ["0000:8c:00.2"]);
        assert!(near_enough(c[1].near) && !near_enough(c[0].near));
        // The VF under GPU0's switch is taken: the next one is under the other switch.
        let c = topology_candidates(&node, "fabric", |p| p != "0000:0c:00.2", &[0]);
        assert_eq!(choose(&c, &[], 1).unwrap(), ["0000:8c:00.2"]);
        assert!(topology_candidates(&node, "none", all, &[0]).is_empty());
    }
}
