//! Discovery of the node this process runs on: GPUs and their pair relations (NVML, behind the `nvml`
//! feature), CPUs/NUMA and NICs (sysfs under a configurable root), GPU–NIC relations (from the PCI tree
//! in sysfs), with a cache keyed by the GPU set so the slow NVLink queries run once per boot.
//!
//! Used by `weft topo discover` and the node agent. Every OS/GPU call sits behind a seam:
//! [`SysfsRoot`] for files, [`GpuSource`] for GPUs, and [`NvmlLike`] for the NVML calls under
//! [`NvmlGpuSource`], with [`FakeNvml`] as the test double. See `docs/topology.md`.

mod cache;
mod fake;
mod fake_sriov;
mod gpu;
#[cfg(feature = "nvml")]
mod nvml;
mod pci;
mod sriov;
mod sysfs;

pub use cache::{CACHE_FORMAT, DiscoveryCache, Fingerprint};
pub use fake::{FAKE_GPU_PCI_ID, FAKE_NVSWITCH_PCI_ID, FakeNvml};
pub use fake_sriov::{FakeFunction, FakeSriovTree};
pub use gpu::{
    GpuIdentity, GpuReport, GpuSource, LinkEnd, NVIDIA_PCI_VENDOR, NVLINK_MAX_LINKS, NoGpuSource, NvlinkRemote,
    NvmlDeviceInfo, NvmlGpuSource, NvmlLike, NvmlTopologyLevel, RemoteDeviceType, classify_remote, count_nvlinks,
};
#[cfg(feature = "nvml")]
pub use nvml::NvmlLib;
pub use pci::{PciPath, normalize_pci_bus_id};
pub use sriov::{LinkInfo, PciFunction, PhysicalFunction, SriovInventory, VirtualFunction, read_sriov, read_vf};
pub use sysfs::{
    DiscoveredNic, PciDeviceInfo, SysfsRoot, read_boot_id, read_cpu_layout, read_cpu_topology, read_hostname,
    read_nics, read_pci_device,
};

use crate::error::TopologyError;
use crate::model::NodeTopology;

/// Where GPUs come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuBackend {
    /// NVML, when built with the `nvml` feature and the driver's library loads; otherwise no GPUs, with
    /// the reason in the notes.
    #[default]
    Nvml,
    /// Skip GPU discovery.
    Disabled,
}

/// What to discover and where.
#[derive(Clone, Debug, Default)]
pub struct DiscoverOptions {
    /// Root of the `sys/` and `proc/` trees (default `/`).
    pub root: SysfsRoot,
    /// Node name; defaults to the host name from `proc/sys/kernel/hostname`.
    pub node_name: Option<String>,
    /// Also list PCI network interfaces that have no RDMA device (plain Ethernet NICs).
    pub netdevs: bool,
    /// GPU source.
    pub gpus: GpuBackend,
    /// Cache for the GPU part; `None` always queries.
    pub cache: Option<DiscoveryCache>,
}

/// The result of a discovery.
#[derive(Clone, Debug, PartialEq)]
pub struct Discovery {
    /// The node.
    pub node: NodeTopology,
    /// What was skipped, guessed or could not be read, in words (for `weft topo discover` and logs).
    pub notes: Vec<String>,
    /// The fingerprint of the GPU set (the cache key).
    pub fingerprint: Fingerprint,
    /// Whether the GPU part came from the cache.
    pub from_cache: bool,
}

/// The GPU source [`discover`] uses for `backend`: NVML when built with the `nvml` feature and the
/// library loads; otherwise a source with no GPUs whose note says why.
pub fn default_gpu_source(backend: GpuBackend) -> Box<dyn GpuSource> {
    match backend {
        GpuBackend::Disabled => Box::new(NoGpuSource::new("GPU discovery disabled")),
        GpuBackend::Nvml => nvml_source(),
    }
}

#[cfg(feature = "nvml")]
fn nvml_source() -> Box<dyn GpuSource> {
    match NvmlLib::open() {
        Ok(lib) => Box::new(NvmlGpuSource::new(lib)),
        Err(TopologyError::Nvml(m)) => Box::new(NoGpuSource::new(format!("NVML not available: {m}"))),
        Err(e) => Box::new(NoGpuSource::new(format!("NVML not available: {e}"))),
    }
}

#[cfg(not(feature = "nvml"))]
fn nvml_source() -> Box<dyn GpuSource> {
    Box::new(NoGpuSource::new("NVML not available: weft-topology was built without the `nvml` feature"))
}

/// Discover this node with the GPU source `opts.gpus` selects.
///
/// No NVML library or driver is not an error: the node has zero GPUs and a note says why. Errors are
/// a GPU source that loaded but cannot count its GPUs, and an inconsistent result.
pub fn discover(opts: &DiscoverOptions) -> Result<Discovery, TopologyError> {
    let source = default_gpu_source(opts.gpus);
    discover_with(opts, source.as_ref())
}

/// Discover this node with an explicit GPU source (a fake in tests). `opts.gpus` is ignored.
pub fn discover_with(opts: &DiscoverOptions, source: &dyn GpuSource) -> Result<Discovery, TopologyError> {
    let root = &opts.root;
    let mut notes = Vec::new();
    let cpus = read_cpu_topology(root, &mut notes);
    let nics = read_nics(root, opts.netdevs, &mut notes);
    let boot_id = read_boot_id(root, &mut notes);
    let name = opts.node_name.clone().or_else(|| read_hostname(root, &mut notes));

    let identity = source.identity()?;
    let fingerprint = Fingerprint::new(&identity, boot_id);

    let mut cached = None;
    if let Some(cache) = &opts.cache {
        match cache.load() {
            Ok(Some((stored, node))) => match stored.difference(&fingerprint) {
                None => cached = Some(node),
                Some(why) => notes.push(format!("cache {} is stale ({why}); rediscovered", cache.path().display())),
            },
            Ok(None) => {}
            Err(e) => notes.push(format!("cache unreadable ({e}); rediscovered")),
        }
    }

    let from_cache = cached.is_some();
    let (gpus, links, nvlink_generation, pcie_generation) = match cached {
        Some(node) => {
            if let Some(cache) = &opts.cache {
                notes.push(format!("GPU topology from cache {}", cache.path().display()));
            }
            (node.gpus.clone(), node.links().to_vec(), node.nvlink_generation, node.pcie_generation)
        }
        None => {
            let report = source.report(root)?;
            notes.extend(report.notes);
            (report.gpus, report.links, None, report.pcie_generation)
        }
    };

    // GPU–NIC relations from the PCI tree (cheap; never cached, NICs can change).
    let single_numa = cpus.numa_nodes.len() <= 1;
    let gpu_places: Vec<(Option<PciPath>, Option<u32>)> = gpus
        .iter()
        .map(|g| {
            let path = g.pci_bus_id.as_deref().and_then(|b| read_pci_device(root, b, &mut notes).path);
            (path, g.numa_node)
        })
        .collect();
    let mut nic_links = Vec::with_capacity(gpus.len() * nics.len());
    for (gpu_path, gpu_numa) in &gpu_places {
        for nic in &nics {
            let rel = match (gpu_path, &nic.pci_path) {
                (Some(g), Some(n)) => {
                    let same_numa =
                        single_numa || matches!((gpu_numa, nic.nic.numa_node), (Some(a), Some(b)) if *a == b);
                    Some(g.relation_to(n, same_numa))
                }
                _ => None,
            };
            nic_links.push(rel);
        }
    }

    let mut node = NodeTopology::new(name, gpus, nics.into_iter().map(|n| n.nic).collect(), links, nic_links)?;
    node.cpus = cpus;
    if from_cache {
        node.nvlink_generation = nvlink_generation.or(node.nvlink_generation);
        node.pcie_generation = pcie_generation.or(node.pcie_generation);
    } else {
        node.pcie_generation = pcie_generation.or(node.pcie_generation);
        if let Some(cache) = &opts.cache
            && let Err(e) = cache.store(&fingerprint, &node)
        {
            notes.push(format!("could not write the cache: {e}"));
        }
    }
    Ok(Discovery { node, notes, fingerprint, from_cache })
}
