//! weft-k8s: weft's Kubernetes plumbing.
//!
//! - The kube-scheduler **extender** ([`server`]): `POST /filter` and `POST /prioritize` answer from
//!   each node's GPU topology (the [`TOPOLOGY_ANNOTATION`]) and the GPUs its pods hold
//!   ([`usage::gpus_in_use`]). The decisions are pure ([`decision`]); the wire types are in [`wire`].
//! - The **cluster view** ([`view::ClusterView`]): an in-memory fake and a reflector-backed
//!   implementation ([`kube_view::KubeClusterView`]).
//! - **Publishing** a node's topology to its annotation ([`publish::publish_topology`]) and building
//!   a client ([`publish::client_from`]).
//!
//! Operator documentation: `docs/scheduler-extender.md`.

pub mod cache;
pub mod client;
pub mod config;
pub mod controller;
pub mod crd;
pub mod decision;
pub mod http;
pub mod job_controller;
pub mod kube_view;
pub mod leader;
pub mod node_agent;
pub mod numanetwork_controller;
pub mod ops;
pub mod publish;
pub mod server;
pub mod usage;
pub mod view;
pub mod webhook;
pub mod wire;
pub mod write;

/// Node annotation holding the node's GPU topology as weft inventory JSON
/// (`weft_topology::inventory::to_json`, format in `docs/topology.md`).
pub const TOPOLOGY_ANNOTATION: &str = "weft.io/gpu-topology";

pub use client::{ClientError, client_from};
pub use config::ExtenderConfig;
pub use kube_view::KubeClusterView;
pub use publish::{PublishError, PublishOutcome, publish_topology, publish_topology_with};
pub use server::{ExtenderError, ExtenderState, router, serve};
pub use usage::{DEFAULT_GPU_RESOURCE, GPU_IDS_ANNOTATION, GpuUsage, UsageIssue, gpus_in_use};
pub use view::{ClusterView, InMemoryView};
pub use wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, HostPriorityList, MAX_EXTENDER_PRIORITY, NodeList};
pub use write::{Part, RetryPolicy, update_with_retry};
