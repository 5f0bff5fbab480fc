//! weft-record: what weft records on Kubernetes objects, read and written in one place, so every
//! component agrees on names and formats.
//!
//! - A node's GPU topology in the [`TOPOLOGY_ANNOTATION`]: [`publish`] writes it once,
//!   [`node_agent`] keeps it equal to the discovered topology while the agent runs.
//! - The GPUs a pod holds: [`usage`] reads the [`GPU_IDS_ANNOTATION`] and the pods' requests.
//! - The SR-IOV VFs a pod holds: [`vf_usage`] reads the [`VF_IDS_ANNOTATION`] and the pods' requests.
//! - The scheduler's device decision for a pod ([`decision::GpuDecision`]: GPUs and VFs), recorded
//!   when it binds.

pub mod decision;
pub mod node_agent;
pub mod publish;
pub mod usage;
pub mod vf_usage;

/// Node annotation holding the node's GPU topology as weft inventory JSON
/// (`weft_topology::inventory::to_json`, format in `docs/topology.md`).
pub const TOPOLOGY_ANNOTATION: &str = "weft.io/gpu-topology";

pub use decision::{GPU_DECISION_ANNOTATION, GpuDecision};
pub use publish::{PublishError, PublishOutcome, publish_topology, publish_topology_with};
pub use usage::{DEFAULT_GPU_RESOURCE, GPU_IDS_ANNOTATION, GpuUsage, UsageIssue, gpus_in_use};
pub use vf_usage::{VF_IDS_ANNOTATION, VfIds, VfUsage, vfs_in_use};
