//! weft's node agent: the resource manager (ORM, after Katalyst's "out-of-band resource manager")
//! that admits pods on this node, gives Guaranteed integer-CPU pods exclusive CPUs aligned with the
//! NUMA nodes of their GPUs and NICs, keeps a shared pool for everything else, and enforces the
//! result either synchronously through NRI ([`nri`]) or by writing cgroup files ([`bypass`]).
//!
//! Pure decision code: [`pod`], [`policy`], [`cpus`], [`orm`], [`settings`], [`sandboxes`]. I/O at the edges:
//! [`checkpoint`] (atomic state file), [`kubelet`] (pod list), [`cgroup`] (cgroup v1/v2 files),
//! [`nri`] (the NRI handler), [`bypass`] (the polling loop), [`agent`] (the shared node state), [`service`] (mode selection).

pub mod agent;
pub mod bypass;
pub mod cgroup;
pub mod checkpoint;
pub mod cpus;
pub mod kubelet;
pub mod nri;
pub mod orm;
pub mod pod;
pub mod policy;
pub mod sandboxes;
pub mod service;
pub mod settings;
