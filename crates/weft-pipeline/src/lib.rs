//! weft-pipeline: Numaflow pipelines on NumaNetworks (seed 000), the pure model. No I/O.
//!
//! - [`domain`]: vertex domains, `<vertex>.<numaNetwork>.<pipeline>.<namespace>.<zone>`, checked
//!   against DNS label and name limits; the record of a pod's domains
//!   ([`VERTEX_DOMAINS_ANNOTATION`]) that the DNS registrar reads.
//! - [`edges`]: which edges run over which NumaNetwork and how (`direct` or `multi-isbsvc`), from
//!   `spec.edges[].numaNetwork` and the annotation [`NUMA_NETWORK_EDGES_ANNOTATION`], merged.
//! - [`wiring`]: validation of a Pipeline's bindings, and the JSON Patch that gives each vertex on
//!   a network its claim, `VERTEX_DOMAIN`/`VERTEX_DOMAIN_TARGETS` and the domains annotation
//!   ([`wire`]). The Pipeline webhook answers with it.
//!
//! - [`crd`]: which Pipeline CRD the cluster serves (Numaflow's full CRD prunes
//!   `spec.edges[].numaNetwork`; the minimal one keeps it), read from the served CRD object.
//!
//! The names shared by the Pipeline webhook, the DNS registrar and `weft simulate` live here, so
//! the three agree by construction. Operator documentation: `docs/pipelines.md`.

pub mod crd;
pub mod domain;
pub mod edges;
pub mod problem;
pub mod wiring;

pub use crd::{EdgeField, PIPELINE_CRD_NAME, edge_field};
pub use domain::{
    DEFAULT_ZONE, DomainError, PIPELINE_NAME_LABEL, VERTEX_DOMAIN_ENV, VERTEX_DOMAIN_TARGETS_ENV,
    VERTEX_DOMAINS_ANNOTATION, VERTEX_NAME_LABEL, VertexDomainEntry, vertex_domain,
};
pub use edges::{ConnectionType, EdgeBinding, NUMA_NETWORK_EDGES_ANNOTATION, Origin, bindings, referenced_networks};
pub use problem::{Problem, Problems};
pub use wiring::{
    CLAIM_SUFFIX, MANAGED_ENV_ANNOTATION, VertexWiring, Wiring, WiringOptions, claim_name, user_container, validate,
    wire,
};

/// API group of Numaflow's resources (and of weft's NumaNetwork).
pub const GROUP: &str = "numaflow.numaproj.io";
/// Version of Numaflow's Pipeline and Vertex.
pub const VERSION: &str = "v1alpha1";
