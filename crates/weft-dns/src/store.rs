//! The seam between the registrar and etcd: the few key-value and lease operations it needs.

use std::time::Duration;

/// One stored key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The key (keys that are not UTF-8 are shown lossily; the registrar never writes those).
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The lease the key is attached to; 0 when none.
    pub lease: i64,
    /// The revision of the key's last change.
    pub mod_revision: i64,
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Its ID.
    pub id: i64,
    /// Its time-to-live as granted, seconds.
    pub ttl: i64,
}

/// An etcd operation that failed; names the operation, the key or lease, and the endpoints.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The server answered with an error.
    #[error("etcd {op} of {target} at {endpoints}: {message} ({code:?})")]
    Rpc {
        /// `put`, `range`, `delete`, `lease grant`, ...
        op: &'static str,
        /// The key or lease concerned.
        target: String,
        /// The endpoints asked.
        endpoints: String,
        /// The gRPC status code.
        code: tonic::Code,
        /// The gRPC status message.
        message: String,
    },
    /// No answer came within the request deadline.
    #[error("etcd {op} of {target} at {endpoints}: no answer within {timeout:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The key or lease concerned.
        target: String,
        /// The endpoints asked.
        endpoints: String,
        /// The deadline.
        timeout: Duration,
    },
    /// The keep-alive stream of a lease ended.
    #[error("etcd lease keep-alive of lease {lease:x} at {endpoints}: the stream ended")]
    StreamEnded {
        /// The lease.
        lease: i64,
        /// The endpoints asked.
        endpoints: String,
    },
}

/// The key-value store the records live in (etcd v3: [`crate::EtcdStore`]).
pub trait RecordStore: Clone + Send + Sync + 'static {
    /// A running keep-alive of one lease.
    type KeepAlive: KeepAlive;

    /// Grants a lease of `ttl` seconds.
    fn grant(&self, ttl: i64) -> impl Future<Output = Result<Lease, StoreError>> + Send;
    /// Starts keeping `lease` alive; each [`KeepAlive::renew`] renews it once.
    fn keep_alive(&self, lease: i64) -> impl Future<Output = Result<Self::KeepAlive, StoreError>> + Send;
    /// Revokes `lease`, deleting every key attached to it.
    fn revoke(&self, lease: i64) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Puts `value` at `key`, attached to `lease` (0 for none).
    fn put(&self, key: &str, value: Vec<u8>, lease: i64) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Every key starting with `prefix`, in key order, read at one revision.
    fn get_prefix(&self, prefix: &str) -> impl Future<Output = Result<Vec<Stored>, StoreError>> + Send;
    /// The key `key` exactly.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Stored>, StoreError>> + Send;
    /// Deletes `key`; whether it existed.
    fn delete(&self, key: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// Renews one lease.
pub trait KeepAlive: Send + 'static {
    /// Renews the lease once: its new TTL in seconds, ≤ 0 when the lease no longer exists.
    fn renew(&mut self) -> impl Future<Output = Result<i64, StoreError>> + Send;
}
