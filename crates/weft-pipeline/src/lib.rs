//! weft-pipeline: Numaflow pipelines on NumaNetworks (seed 000), the pure model. No I/O.
//!
//! - [`domain`]: vertex domains, `<vertex>.<numaNetwork>.<pipeline>.<namespace>.<zone>`, checked
//!   against DNS label and name limits; the record of a pod's domains
//!   ([`VERTEX_DOMAINS_ANNOTATION`]) that the DNS registrar reads.
//!
//! The names shared by the Pipeline webhook, the DNS registrar and `weft simulate` live here, so
//! the three agree by construction.

pub mod domain;

pub use domain::{
    DEFAULT_ZONE, DomainError, PIPELINE_NAME_LABEL, VERTEX_DOMAIN_ENV, VERTEX_DOMAIN_TARGETS_ENV,
    VERTEX_DOMAINS_ANNOTATION, VERTEX_NAME_LABEL, VertexDomainEntry, vertex_domain,
};
