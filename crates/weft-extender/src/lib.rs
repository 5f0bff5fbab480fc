//! weft-extender: the kube-scheduler extender.
//!
//! - `POST /filter` and `POST /prioritize` ([`server`]) answer from each node's GPU topology (the
//!   `weft.io/gpu-topology` annotation, read once per text by the [`cache`]) and the GPUs its pods
//!   hold (`weft_record::gpus_in_use`). The decisions are pure ([`decision`]); the wire types are in
//!   [`wire`].
//! - `POST /bind` ([`bind`]) picks the pod's GPUs on the chosen node, records the decision on the
//!   pod and creates its Binding in one write; decisions not yet visible through the watch are held
//!   in [`reservations`] and count as used.
//! - The cluster view ([`view::ClusterView`]): an in-memory one and a reflector-backed one
//!   ([`kube_view::KubeClusterView`]).
//!
//! Operator documentation: `docs/scheduler-extender.md`.

pub mod bind;
pub mod cache;
pub mod claims;
pub mod config;
pub mod decision;
pub mod gang;
pub mod kube_view;
pub mod reservations;
pub mod server;
pub mod stream;
pub mod view;
pub mod volcano;
pub mod wire;

pub use bind::{KubePodBinder, PodBinder};
pub use config::ExtenderConfig;
pub use kube_view::KubeClusterView;
pub use server::{ExtenderError, ExtenderState, router, serve, serve_with};
pub use view::{ClusterView, InMemoryView};
pub use wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority, HostPriorityList,
    MAX_EXTENDER_PRIORITY, NodeList,
};
