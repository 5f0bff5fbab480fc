//! weft-topology: the model of an accelerated node (GPUs, NVLink/PCIe relations, NICs, CPUs, NUMA),
//! its parsers (`nvidia-smi topo -m` text, the versioned inventory in JSON/YAML), renderers (DOT, SVG)
//! and discovery (sysfs; NVML behind the `nvml` feature).
//!
//! Everything here except [`discover`] is pure: text in, model out.

pub mod cpu_layout;
pub mod cpuset;
pub mod discover;
pub mod error;
pub mod inventory;
pub mod model;
pub mod reference;
pub mod render;
pub mod ring;
pub mod smi;

pub use cpu_layout::{CpuInfo, CpuLayout};
pub use cpuset::CpuSet;
pub use error::TopologyError;
pub use inventory::{Inventory, parse_node, read_node_file};
pub use model::{
    CpuTopology, Gpu, MAX_PAIR_SCORE, Nic, NodeTopology, NumaNode, NvlinkGeneration, PairLink, PcieGeneration,
    PcieRelation, Vf,
};
pub use ring::{MAX_EXACT_RING_GPUS, RingBandwidth, best_ring};
pub use smi::parse_topo_matrix;
