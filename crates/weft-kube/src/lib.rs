//! weft-kube: the Kubernetes runtime every weft component shares, and nothing component-specific.
//!
//! - [`client`]: one way to build a client (`--kubeconfig`, `--context`, in-cluster, default).
//! - [`http`]: the HTTP serving every weft server uses (header-read and idle timeouts, a connection
//!   cap, bounded shutdown), and [`tls`]: serving certificates reloaded when their files change.
//! - [`ops`]: the operations endpoint (`/healthz`, `/readyz`, `/metrics`).
//! - [`write`]: writes that survive other writers (bounded retries, re-read after a conflict).
//! - [`controller`]: the controller skeleton (finalizers, backoff, Events, metrics, orderly stop).
//! - [`leader`]: leader election over a Lease.
//!
//! Component crates (the extender, admission, the CRDs and their controllers, the node side) build
//! on this crate and never on each other.

pub mod client;
pub mod controller;
pub mod http;
pub mod leader;
pub mod ops;
pub mod tls;
pub mod write;

pub use client::{ClientError, client_from};
pub use write::{Part, RetryPolicy, update_with_retry};
