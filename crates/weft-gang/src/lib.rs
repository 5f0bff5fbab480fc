//! weft-gang: whole jobs placed as one decision (docs/gang.md).
//!
//! - [`network`]: the cluster's network as tiers and a tree of domains, from node labels (an
//!   ordered list of keys; Topograph's as a preset; GFD's GPU clique as the innermost tier), with
//!   rails (which leaf each NIC reaches).
//! - [`hypernode`]: Volcano HyperNodes, parsed and turned into the same model.
//! - [`constraint`]: Volcano's `networkTopology` and weft's `weft.io/network-topology` annotation.
//! - [`plan`]: the gang decision: tightest domain, node per member, GPU sets, rails.
//! - [`builtin`]: the GB200 NVL72 compute tray node type.
//!
//! Pure: no I/O, no clock, deterministic (ties included).

pub mod builtin;
pub mod constraint;
pub mod error;
pub mod hypernode;
pub mod network;
pub mod plan;

pub use constraint::{Mode, NetworkTopologySpec, TierConstraint, TierRef};
pub use error::{ModelError, PlanError};
pub use hypernode::{HyperNode, from_hypernodes, parse_hypernodes};
pub use network::{ClusterNode, LabelLevels, LevelSpec, NetworkModel, RailConfig, Tier, from_labels};
pub use plan::{AllocSets, Gang, GpuSets, MemberPlan, NodeFree, Plan, plan};
