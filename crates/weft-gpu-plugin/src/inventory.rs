//! The node's GPUs as the kubelet sees them: one device per GPU, its device ID, what the container
//! is told, its NUMA node.
//!
//! Device IDs follow NVIDIA's device plugin (`deviceIDStrategy`): the GPU's UUID when discovery
//! knows it (NVML always does), else its index. The same IDs go into `NVIDIA_VISIBLE_DEVICES` or
//! the CDI name `nvidia.com/gpu=<id>`, both of which the NVIDIA container toolkit accepts as UUID
//! or index, so a node can switch between NVIDIA's plugin and weft's without the kubelet's
//! checkpointed assignments pointing at unknown devices.

use std::collections::HashMap;

use weft_alloc::PreparedNode;
use weft_deviceplugin::api;
use weft_topology::NodeTopology;

/// One GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// Index (NVML order).
    pub index: usize,
    /// Device ID the kubelet counts: UUID, else the index.
    pub id: String,
    /// NUMA node, when known.
    pub numa: Option<u32>,
}

/// The node's GPUs, with the allocator's view of their links.
#[derive(Clone, Debug)]
pub struct GpuInventory {
    devices: Vec<GpuDevice>,
    by_id: HashMap<String, usize>,
    prepared: PreparedNode,
}

impl GpuInventory {
    /// The inventory of `topology`. Errors name what is wrong: no GPUs, GPU indices out of order,
    /// a UUID given twice, links the allocator cannot use.
    pub fn new(topology: &NodeTopology) -> Result<GpuInventory, String> {
        let node = topology.name.as_deref().unwrap_or("(unnamed)");
        if topology.gpus.is_empty() {
            return Err(format!("node {}: the topology lists no GPUs", node));
        }
        let mut devices = Vec::with_capacity(topology.gpus.len());
        let mut by_id = HashMap::new();
        for (position, gpu) in topology.gpus.iter().enumerate() {
            let index = usize::try_from(gpu.index).unwrap_or(usize::MAX);
            if index != position {
                return Err(format!("node {}: GPU at position {position} has index {}", node, gpu.index));
            }
            let id = gpu.uuid.clone().filter(|u| !u.is_empty()).unwrap_or_else(|| index.to_string());
            if by_id.insert(id.clone(), index).is_some() {
                return Err(format!("node {}: device ID '{id}' is given to two GPUs", node));
            }
            devices.push(GpuDevice { index, id, numa: gpu.numa_node });
        }
        let prepared = PreparedNode::new(topology).map_err(|e| format!("node {}: {e}", node))?;
        Ok(GpuInventory { devices, by_id, prepared })
    }

    /// The GPUs, by index.
    pub fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    /// The allocator's view.
    pub fn prepared(&self) -> &PreparedNode {
        &self.prepared
    }

    /// Indices of device IDs; the error names the first unknown one.
    pub fn indices(&self, ids: &[String]) -> Result<Vec<usize>, String> {
        ids.iter().map(|id| self.by_id.get(id).copied().ok_or_else(|| format!("unknown device '{id}'"))).collect()
    }

    /// Device IDs of indices, in the given order.
    pub fn ids(&self, indices: &[usize]) -> Vec<String> {
        indices.iter().filter_map(|&i| self.devices.get(i)).map(|d| d.id.clone()).collect()
    }

    /// The device list for ListAndWatch, every GPU with the health `healthy(index)` says.
    pub fn api_devices(&self, healthy: impl Fn(usize) -> bool) -> Vec<api::Device> {
        self.devices.iter().map(|d| weft_deviceplugin::device(&d.id, healthy(d.index), d.numa)).collect()
    }
}
