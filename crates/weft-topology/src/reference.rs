//! Reference nodes with published relations, for tests, benchmarks and examples.

use crate::model::{NodeTopology, NvlinkGeneration, PairLink, PcieGeneration, PcieRelation, uniform_node};

/// NVLink counts of the DGX-1 V100 hybrid cube-mesh, as go-gpuallocator's `NewDGX1VoltaNode` test
/// node and the real machine (fixture `dgx1-v100-mlx5-columns.txt`) have them: `(a, b, links)`.
pub const DGX1_VOLTA_NVLINKS: [(usize, usize, u8); 16] = [
    (0, 1, 1),
    (0, 2, 1),
    (0, 3, 2),
    (0, 4, 2),
    (1, 2, 2),
    (1, 3, 1),
    (1, 5, 2),
    (2, 3, 2),
    (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1),
    (4, 6, 1),
    (4, 7, 2),
    (5, 6, 2),
    (5, 7, 1),
    (6, 7, 2),
];

/// go-gpuallocator's DGX-1 Volta test node (reference §1.7), with both relations per pair: the
/// NVLinks of [`DGX1_VOLTA_NVLINKS`]; PCIe PIX for 0-1, 2-3, 4-5, 6-7, PHB for the other pairs within
/// a half, SYS across halves. Its golden allocation results are pinned in weft-alloc's parity tests.
pub fn dgx1_volta() -> NodeTopology {
    let mut node = uniform_node("dgx1-volta", 8, PairLink::default());
    for a in 0..8 {
        for b in a + 1..8 {
            let pcie = if a / 4 != b / 4 {
                PcieRelation::Sys
            } else if a / 2 == b / 2 {
                PcieRelation::Pix
            } else {
                PcieRelation::Phb
            };
            node.set_link(a, b, PairLink { pcie: Some(pcie), nvlinks: 0 });
        }
    }
    for (a, b, n) in DGX1_VOLTA_NVLINKS {
        let l = node.link(a, b);
        node.set_link(a, b, PairLink { nvlinks: n, ..l });
    }
    node.nvlink_generation = Some(NvlinkGeneration::Nvlink2);
    node.pcie_generation = Some(PcieGeneration(3));
    node
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dgx1_volta_matches_the_real_machines_nvlinks() {
        let text = include_str!("../../weft-sim/topologies/dgx1-v100-mlx5-columns.txt");
        let real = crate::parse_topo_matrix(text, "dgx1").unwrap();
        let reference = dgx1_volta();
        for a in 0..8 {
            for b in 0..8 {
                assert_eq!(real.link(a, b).nvlinks, reference.link(a, b).nvlinks, "GPU{a}-GPU{b}");
            }
        }
        // go-gpuallocator's score of 0-3: NV2 (200) + PHB (30).
        assert_eq!(reference.link(0, 3).score(), 230);
        assert_eq!(reference.link(0, 1).score(), 150);
    }
}
