//! The DNS registrar (docs/dns.md): for each ready vertex pod on a NumaNetwork, a CoreDNS etcd
//! (SkyDNS) record under `<prefix>/<domain labels reversed>/<pod>`, holding the address of the
//! pod's NIC from its ResourceClaim, with a short `ttl` and an owner marker; every record of one
//! registrar on one etcd lease kept alive, so a dead registrar's records expire.
//!
//! - [`record`]: keys and values as CoreDNS's etcd plugin reads them (pure).
//! - [`pod`]: what a pod should have: its checked vertex domains, readiness, the address in its
//!   claim (pure).
//! - [`store`]: the [`RecordStore`] seam; [`etcd`] its implementation over etcd's v3 gRPC API.
//! - [`registrar`]: the pod reconciler, the lease keeper, the start-up collection of stale
//!   records, and [`run`].

pub mod etcd;
pub mod pod;
pub mod record;
pub mod registrar;
pub mod settings;
pub mod store;

pub use etcd::EtcdStore;
pub use registrar::{FINALIZER, NAME, Registrar, RegistrarError, run, run_with_store};
pub use settings::{DnsSettings, SettingsError};
pub use store::{KeepAlive, Lease, RecordStore, StoreError, Stored};
