//! Built-in node types of multi-node NVLink systems, for the simulator and tests.

use weft_topology::{NodeTopology, NvlinkGeneration, PcieGeneration, TopologyError, parse_topo_matrix};

/// The GB200 NVL72 compute tray's node type name.
pub const GB200_NVL72_TRAY: &str = "gb200-nvl72-tray";

/// What the tray is, for `weft simulate`'s list of built-in types.
pub const GB200_NVL72_TRAY_DESCRIPTION: &str = "GB200 NVL72 compute tray: 4 B200 GPUs (NV18 all pairs, NVLink 5 through the rack's NVSwitch trays), 2 Grace CPUs, 4 ConnectX-7 NICs; 18 trays form one NVLink domain (synthetic)";

/// The tray's `nvidia-smi topo -m` text (synthetic: written from NVIDIA's published layout, not
/// captured from a machine). GPU i is nearest NIC i (`PHB`, through its Grace CPU); GPUs 0-1 and
/// NICs 0-1 hang off Grace 0 (NUMA 0, CPUs 0-71), GPUs 2-3 and NICs 2-3 off Grace 1.
pub const GB200_NVL72_TRAY_TEXT: &str = include_str!("../topologies/gb200-nvl72-tray.txt");

/// Trays in one GB200 NVL72 rack, one NVLink domain (one `nvidia.com/gpu.clique` value).
pub const NVL72_TRAYS: usize = 18;

/// The tray's topology: the text above with what a `topo -m` dump cannot say (NVLink 5, PCIe 5;
/// from the NV18 count alone the parser would infer NVLink 4).
pub fn gb200_nvl72_tray() -> Result<NodeTopology, TopologyError> {
    let mut node = parse_topo_matrix(GB200_NVL72_TRAY_TEXT, &format!("builtin:{GB200_NVL72_TRAY}"))?;
    node.name = Some(GB200_NVL72_TRAY.to_string());
    node.nvlink_generation = Some(NvlinkGeneration::Nvlink5);
    node.pcie_generation = Some(PcieGeneration(5));
    Ok(node)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_tray_is_four_gpus_on_nvlink5_each_beside_its_own_nic() {
        let t = gb200_nvl72_tray().unwrap();
        assert_eq!(t.gpu_count(), 4);
        assert_eq!(
            t.nics.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
        );
        for a in 0..4 {
            for b in 0..4 {
                if a != b {
                    assert_eq!(t.link(a, b).nvlinks, 18);
                    // 18 links × 50 GB/s (NVLink 5) per direction.
                    assert_eq!(t.pair_bandwidth_gbps(a, b), 900.0);
                }
            }
            assert_eq!(t.nic_link(a, a), Some(weft_topology::PcieRelation::Phb));
        }
        assert_eq!(t.gpus[2].numa_node, Some(1));
    }
}
