//! The logical-CPU layout of a node: for every online CPU its physical core, socket and NUMA node,
//! plus the memory of each NUMA node where known. This is what a CPU allocator needs (which CPUs
//! are hyperthread siblings, which share a socket or a NUMA node), as kubelet's `CPUTopology` and
//! `CPUDetails` are for its CPU manager.
//!
//! Built from sysfs ([`crate::discover::read_cpu_layout`]), from a list of [`CpuInfo`]
//! ([`CpuLayout::new`]) or synthetically ([`CpuLayout::synthetic`]) for tests, simulations and
//! benchmarks.
//!
//! A core is identified by `(socket, core)`: Linux's `core_id` is unique within a socket only.

use std::collections::{BTreeMap, BTreeSet};

use crate::cpuset::{CpuSet, MAX_CPU};
use crate::error::TopologyError;

/// One logical CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct CpuInfo {
    /// Logical CPU number (`cpuN`).
    pub id: u32,
    /// Physical core id, unique within the socket (`topology/core_id`).
    pub core: u32,
    /// Socket (`topology/physical_package_id`).
    pub socket: u32,
    /// NUMA node.
    pub numa: u32,
}

/// Every online logical CPU with its core, socket and NUMA node, plus memory per NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuLayout {
    /// Sorted by id, ids unique.
    cpus: Vec<CpuInfo>,
    /// Bytes of memory per NUMA node, where known.
    numa_memory: BTreeMap<u32, u64>,
    /// The CPUs of each `(socket, core)` (derived from `cpus`).
    cores: BTreeMap<(u32, u32), CpuSet>,
}

impl CpuLayout {
    /// A layout over `cpus` (any order). Fails on an empty list, a duplicate CPU id or a CPU id above
    /// [`MAX_CPU`]. Memory sizes are added with [`CpuLayout::set_numa_memory`].
    pub fn new(mut cpus: Vec<CpuInfo>) -> Result<CpuLayout, TopologyError> {
        if cpus.is_empty() {
            return Err(TopologyError::Invalid("CPU layout without CPUs".into()));
        }
        cpus.sort_by_key(|c| c.id);
        for pair in cpus.windows(2) {
            if pair[0].id == pair[1].id {
                return Err(TopologyError::Invalid(format!("CPU {} is listed twice in the CPU layout", pair[0].id)));
            }
        }
        if let Some(c) = cpus.iter().find(|c| c.id > MAX_CPU) {
            return Err(TopologyError::Invalid(format!("CPU {} is above the supported maximum {MAX_CPU}", c.id)));
        }
        let mut cores: BTreeMap<(u32, u32), CpuSet> = BTreeMap::new();
        for c in &cpus {
            cores.entry((c.socket, c.core)).or_default().insert(c.id);
        }
        Ok(CpuLayout { cpus, numa_memory: BTreeMap::new(), cores })
    }

    /// A layout numbered the way Linux numbers a typical Intel server: `sockets` sockets, each with
    /// `numa_per_socket` NUMA nodes of `cores_per_numa` cores with `threads_per_core` threads. Cores
    /// are numbered across the machine first (`0..total_cores`, socket by socket, NUMA node by NUMA
    /// node), and thread `t` of core `c` is CPU `c + t * total_cores`: on a 2×32×2 box CPU 0 and CPU
    /// 64 are siblings. `core` ids restart at 0 on every socket. No memory sizes are set.
    ///
    /// Fails when any count is zero or the machine would exceed [`MAX_CPU`] CPUs.
    pub fn synthetic(
        sockets: u32,
        numa_per_socket: u32,
        cores_per_numa: u32,
        threads_per_core: u32,
    ) -> Result<CpuLayout, TopologyError> {
        let total_cpus = u128::from(sockets)
            * u128::from(numa_per_socket)
            * u128::from(cores_per_numa)
            * u128::from(threads_per_core);
        if total_cpus == 0 {
            return Err(TopologyError::Invalid(
                "synthetic CPU layout needs at least one socket, NUMA node, core and thread".into(),
            ));
        }
        if total_cpus > u128::from(MAX_CPU) {
            return Err(TopologyError::Invalid(format!(
                "synthetic CPU layout of {total_cpus} CPUs exceeds the supported maximum {MAX_CPU}"
            )));
        }
        // All products below fit in u32: they are at most total_cpus <= MAX_CPU.
        let cores_per_socket = numa_per_socket * cores_per_numa;
        let total_cores = sockets * cores_per_socket;
        let mut cpus = Vec::with_capacity(total_cpus as usize);
        for t in 0..threads_per_core {
            for c in 0..total_cores {
                cpus.push(CpuInfo {
                    id: c + t * total_cores,
                    core: c % cores_per_socket,
                    socket: c / cores_per_socket,
                    numa: c / cores_per_numa,
                });
            }
        }
        CpuLayout::new(cpus)
    }

    /// Record the memory of NUMA node `node`, in bytes.
    pub fn set_numa_memory(&mut self, node: u32, bytes: u64) {
        self.numa_memory.insert(node, bytes);
    }

    /// The same layout with `bytes` of memory on every NUMA node (a builder for tests).
    pub fn with_memory_per_numa(mut self, bytes: u64) -> CpuLayout {
        for node in self.numa_nodes() {
            self.numa_memory.insert(node, bytes);
        }
        self
    }

    /// Memory of NUMA node `node`, in bytes, where known.
    pub fn numa_memory(&self, node: u32) -> Option<u64> {
        self.numa_memory.get(&node).copied()
    }

    /// Memory per NUMA node, where known.
    pub fn numa_memories(&self) -> &BTreeMap<u32, u64> {
        &self.numa_memory
    }

    /// Every CPU, by id.
    pub fn cpus(&self) -> &[CpuInfo] {
        &self.cpus
    }

    /// Number of logical CPUs.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// Whether the layout has no CPU (never true for a layout built by this module).
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }

    /// CPU `id`, if online.
    pub fn cpu(&self, id: u32) -> Option<&CpuInfo> {
        self.cpus.binary_search_by_key(&id, |c| c.id).ok().map(|i| &self.cpus[i])
    }

    /// Every online CPU.
    pub fn online(&self) -> CpuSet {
        self.cpus.iter().map(|c| c.id).collect()
    }

    /// NUMA node ids, ascending.
    pub fn numa_nodes(&self) -> Vec<u32> {
        self.cpus.iter().map(|c| c.numa).collect::<BTreeSet<_>>().into_iter().collect()
    }

    /// Socket ids, ascending.
    pub fn sockets(&self) -> Vec<u32> {
        self.cpus.iter().map(|c| c.socket).collect::<BTreeSet<_>>().into_iter().collect()
    }

    /// Physical cores as `(socket, core)`, ascending.
    pub fn cores(&self) -> Vec<(u32, u32)> {
        self.cores.keys().copied().collect()
    }

    /// The hyperthread siblings of CPU `id`, itself included; empty when `id` is not online.
    pub fn siblings(&self, id: u32) -> CpuSet {
        match self.cpu(id) {
            Some(c) => self.core_cpus(c.socket, c.core),
            None => CpuSet::new(),
        }
    }

    /// The CPUs of core `core` on socket `socket`.
    pub fn core_cpus(&self, socket: u32, core: u32) -> CpuSet {
        self.cores.get(&(socket, core)).cloned().unwrap_or_default()
    }

    /// The CPUs of NUMA node `node`.
    pub fn numa_cpus(&self, node: u32) -> CpuSet {
        self.cpus.iter().filter(|c| c.numa == node).map(|c| c.id).collect()
    }

    /// The CPUs of socket `socket`.
    pub fn socket_cpus(&self, socket: u32) -> CpuSet {
        self.cpus.iter().filter(|c| c.socket == socket).map(|c| c.id).collect()
    }

    /// Threads per core of the largest core (2 with SMT on most x86 servers, 1 without).
    pub fn max_threads_per_core(&self) -> usize {
        self.cores.values().map(CpuSet::len).max().unwrap_or(0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    #[test]
    fn synthetic_numbers_siblings_like_an_intel_box() {
        let l = CpuLayout::synthetic(2, 1, 32, 2).unwrap();
        assert_eq!(l.len(), 128);
        assert_eq!(l.siblings(0).to_string(), "0,64");
        assert_eq!(l.siblings(95).to_string(), "31,95");
        assert_eq!(l.socket_cpus(0).to_string(), "0-31,64-95");
        assert_eq!(l.socket_cpus(1).to_string(), "32-63,96-127");
        assert_eq!(l.numa_cpus(1), l.socket_cpus(1));
        assert_eq!(l.sockets(), [0, 1]);
        assert_eq!(l.numa_nodes(), [0, 1]);
        assert_eq!(l.cores().len(), 64);
        // core ids restart per socket
        assert_eq!(l.cpu(32).unwrap().core, 0);
        assert_eq!(l.cpu(32).unwrap().socket, 1);
        assert_eq!(l.max_threads_per_core(), 2);
        assert_eq!(l.online().to_string(), "0-127");
    }

    #[test]
    fn synthetic_with_several_numa_nodes_per_socket() {
        let l = CpuLayout::synthetic(2, 2, 4, 2).unwrap();
        assert_eq!(l.len(), 32);
        assert_eq!(l.numa_nodes(), [0, 1, 2, 3]);
        assert_eq!(l.numa_cpus(1).to_string(), "4-7,20-23");
        assert_eq!(l.socket_cpus(1).to_string(), "8-15,24-31");
        assert_eq!(l.siblings(9).to_string(), "9,25");
        let no_smt = CpuLayout::synthetic(1, 1, 2, 1).unwrap();
        assert_eq!(no_smt.siblings(1).to_string(), "1");
        assert_eq!(no_smt.max_threads_per_core(), 1);
    }

    #[test]
    fn synthetic_rejects_zero_and_huge() {
        assert!(CpuLayout::synthetic(0, 1, 1, 1).is_err());
        assert!(CpuLayout::synthetic(1, 1, 1, 0).is_err());
        assert!(CpuLayout::synthetic(u32::MAX, u32::MAX, u32::MAX, u32::MAX).is_err());
    }

    #[test]
    fn new_rejects_duplicates_and_empty_and_sorts() {
        let c = |id, core| CpuInfo { id, core, socket: 0, numa: 0 };
        assert!(CpuLayout::new(vec![]).is_err());
        let err = CpuLayout::new(vec![c(1, 0), c(1, 1)]).unwrap_err().to_string();
        assert!(err.contains("CPU 1"), "{err}");
        let l = CpuLayout::new(vec![c(3, 1), c(0, 0), c(2, 0)]).unwrap();
        assert_eq!(l.cpus().iter().map(|c| c.id).collect::<Vec<_>>(), [0, 2, 3]);
        assert_eq!(l.siblings(2).to_string(), "0,2");
        assert!(l.siblings(1).is_empty());
        assert!(l.cpu(1).is_none());
    }

    #[test]
    fn memory_per_numa_node() {
        let mut l = CpuLayout::synthetic(2, 1, 2, 1).unwrap().with_memory_per_numa(1 << 30);
        assert_eq!(l.numa_memory(1), Some(1 << 30));
        l.set_numa_memory(1, 5);
        assert_eq!(l.numa_memory(1), Some(5));
        assert_eq!(l.numa_memory(7), None);
    }
}
