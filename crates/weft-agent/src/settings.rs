//! What the agent enforces on one container: the vocabulary shared by the NRI path (turned into a
//! `ContainerAdjustment` / `ContainerUpdate`) and the bypass path (turned into cgroup file writes).

use weft_topology::CpuSet;

/// Default CFS period, microseconds (the kernel's and kubelet's default).
pub const DEFAULT_CFS_PERIOD_US: u64 = 100_000;

/// The settings of one container. `None` means "leave as the runtime set it".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerSettings {
    /// `cpuset.cpus`.
    pub cpus: CpuSet,
    /// `cpuset.mems`: NUMA node ids in the same list format.
    pub mems: CpuSet,
    /// CFS quota in µs per period; `-1` = unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period in µs.
    pub cpu_period: Option<u64>,
    /// Memory limit in bytes (`memory.limit_in_bytes` / `memory.max`).
    pub memory_limit: Option<i64>,
    /// Memory throttling threshold in bytes (cgroup v2 `memory.high`; NRI carries it in `unified`).
    pub memory_high: Option<i64>,
    /// Environment variables to add, in order.
    pub env: Vec<(String, String)>,
}
