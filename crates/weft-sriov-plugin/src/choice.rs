//! The VFs one container gets: what the pod's recorded decision has left for it when all of that
//! is on offer, else the VFs nearest the GPUs the pod holds
//! ([`weft_net::choice`]: same PCIe switch tree, then root, then NUMA node; spread over PFs; by
//! address). Pure.

use weft_deviceplugin::accounting::decision_left;
use weft_net::choice::{ChoiceError, DevicePlace, VfPlace, candidates, choose};

use crate::inventory::VfInventory;

/// Why the answer is what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Basis {
    /// From the pod's recorded decision.
    Decision,
    /// The VFs nearest the pod's GPUs; the string says why not the decision.
    Nearest(String),
}

/// `size` VFs from `available` holding every `required` one. `decided` is the pod's decision for
/// this physnet on this node; `held` are the VFs its other running containers already got; `gpus`
/// are the places of the GPUs the pod holds.
///
/// The decision is answered when what it has left (plus the required VFs) is all available and
/// enough: the nearest `size` of that (the whole of it when the sizes match). Otherwise the
/// nearest `size` of everything available.
pub fn pick(
    vfs: &VfInventory,
    available: &[String],
    required: &[String],
    size: usize,
    decided: Option<&[String]>,
    held: &[String],
    gpus: &[DevicePlace<'_>],
) -> Result<(Vec<String>, Basis), ChoiceError> {
    let must: Vec<&str> = required.iter().map(String::as_str).collect();
    let nearest = |pool: &[String]| {
        let places: Vec<VfPlace<'_>> = pool.iter().filter_map(|a| vfs.get(a)).map(|d| d.place()).collect();
        choose(&candidates(&places, gpus), &must, size)
    };
    let why_not = match decided.map(|d| decision_left("VFs", d, held, required, available, size)) {
        None => "the pod has no VFs of this physnet decided for this node".to_string(),
        Some(Ok(pool)) => return nearest(&pool).map(|chosen| (chosen, Basis::Decision)),
        Some(Err(why)) => why,
    };
    nearest(available).map(|chosen| (chosen, Basis::Nearest(why_not)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use std::path::Path;

    use weft_topology::discover::PciPath;

    use super::*;
    use crate::inventory::VfDevice;

    const SW_A: &str = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
    const SW_B: &str = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";

    fn path(s: &str) -> PciPath {
        PciPath::from_sysfs_path(Path::new(s)).unwrap()
    }

    /// Two VFs under switch A (PF 03:00.0), two under switch B (PF 83:00.0).
    fn vfs() -> VfInventory {
        let vf = |sw: &str, bus: &str, f: u32, numa: u32| VfDevice {
            pci_address: format!("0000:{bus}:00.{f}"),
            pf_pci_address: format!("0000:{bus}:00.0"),
            pf_netdev: None,
            index: f - 2,
            pci_path: Some(path(&format!("{sw}/0000:02:00.0/0000:{bus}:00.{f}"))),
            numa_node: Some(numa),
            rdma_device: None,
            uverbs: None,
            pf_link: Default::default(),
        };
        VfInventory::from_devices([
            vf(SW_A, "03", 2, 0),
            vf(SW_A, "03", 3, 0),
            vf(SW_B, "83", 2, 1),
            vf(SW_B, "83", 3, 1),
        ])
        .unwrap()
    }

    fn all(v: &VfInventory) -> Vec<String> {
        v.devices().map(|d| d.pci_address.clone()).collect()
    }

    fn ids(s: &[&str]) -> Vec<String> {
        s.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_fitting_decision_wins_over_nearness() {
        let v = vfs();
        let gpu_b = path(&format!("{SW_B}/0000:02:01.0/0000:84:00.0"));
        let near_b = [DevicePlace { pci_path: Some(&gpu_b), numa_node: Some(1) }];
        let decided = ids(&["0000:03:00.3"]);
        let (got, basis) = pick(&v, &all(&v), &[], 1, Some(&decided), &[], &near_b).unwrap();
        assert_eq!((got, basis), (decided, Basis::Decision));
        let (got, basis) = pick(&v, &all(&v), &[], 1, None, &[], &near_b).unwrap();
        assert_eq!(got, ["0000:83:00.2"]);
        assert!(matches!(basis, Basis::Nearest(ref why) if why.contains("no VFs")), "{basis:?}");
    }

    #[test]
    fn a_taken_decided_vf_falls_back_to_the_nearest_free_one() {
        let v = vfs();
        let gpu_b = path(&format!("{SW_B}/0000:02:01.0/0000:84:00.0"));
        let near_b = [DevicePlace { pci_path: Some(&gpu_b), numa_node: Some(1) }];
        let free = ids(&["0000:03:00.2", "0000:03:00.3", "0000:83:00.3"]);
        let (got, basis) = pick(&v, &free, &[], 1, Some(&ids(&["0000:83:00.2"])), &[], &near_b).unwrap();
        assert_eq!(got, ["0000:83:00.3"]);
        assert!(matches!(basis, Basis::Nearest(ref why) if why.contains("0000:83:00.2")), "{basis:?}");
    }

    #[test]
    fn containers_share_out_the_decision_and_required_vfs_stay() {
        let v = vfs();
        let decided = ids(&["0000:03:00.2", "0000:83:00.2"]);
        let (got, basis) = pick(&v, &all(&v), &[], 1, Some(&decided), &ids(&["0000:03:00.2"]), &[]).unwrap();
        assert_eq!((got, basis), (ids(&["0000:83:00.2"]), Basis::Decision));
        let (got, _) = pick(&v, &all(&v), &ids(&["0000:83:00.3"]), 2, None, &[], &[]).unwrap();
        assert!(got.contains(&"0000:83:00.3".to_string()) && got.len() == 2, "{got:?}");
        assert_eq!(
            pick(&v, &all(&v), &[], 5, None, &[], &[]).unwrap_err(),
            ChoiceError::TooFew { asked: 5, available: 4 }
        );
    }
}
