//! Allocation errors. Each says what was asked and why it cannot be met.

use thiserror::Error;

/// Why an allocation or score could not be produced.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AllocError {
    /// A request for zero GPUs.
    #[error("requested 0 GPUs; ask for at least 1")]
    ZeroCount,
    /// Fewer free GPUs than requested.
    #[error("requested {requested} GPUs but only {available} are available")]
    InsufficientGpus {
        /// GPUs asked for.
        requested: usize,
        /// GPUs free.
        available: usize,
    },
    /// A required GPU is not free.
    #[error("required GPU{gpu} is not among the available GPUs")]
    RequiredNotAvailable {
        /// The GPU.
        gpu: usize,
    },
    /// More required GPUs than the request size.
    #[error("{required} GPUs are required but only {count} requested")]
    TooManyRequired {
        /// Number required.
        required: usize,
        /// Request size.
        count: usize,
    },
    /// A GPU index beyond the node.
    #[error("GPU{gpu} does not exist on this node (it has {n} GPUs)")]
    UnknownGpu {
        /// The index.
        gpu: usize,
        /// GPUs on the node.
        n: usize,
    },
    /// A GPU listed twice.
    #[error("GPU{gpu} is listed twice")]
    DuplicateGpu {
        /// The index.
        gpu: usize,
    },
    /// The node is larger than the allocator supports.
    #[error("node has {n} GPUs; at most {} are supported", crate::MAX_GPUS)]
    TooManyGpus {
        /// GPUs on the node.
        n: usize,
    },
    /// A malformed score matrix.
    #[error("bad score matrix: {0}")]
    BadScoreMatrix(String),
    /// No partition of the free GPUs keeps the required GPUs together in one full group (cannot
    /// happen for a validated request; reported instead of panicking).
    #[error("no partition of the free GPUs into groups of {count} keeps the required GPUs in one group")]
    NoPartition {
        /// Request size.
        count: usize,
    },
    /// The static table has no set for this request.
    #[error("static table '{table}' has no fully free set of {count} GPUs holding the required GPUs")]
    NoStaticSet {
        /// Table name.
        table: String,
        /// Request size.
        count: usize,
    },
    /// A static table that does not fit the node.
    #[error("static table '{table}', size {size}, set {set:?}: {why}")]
    BadStaticTable {
        /// Table name.
        table: String,
        /// The size key the set is listed under.
        size: usize,
        /// The offending set.
        set: Vec<usize>,
        /// What is wrong.
        why: String,
    },
    /// Static table text that does not parse.
    #[error("static table does not parse: {0}; expected {{\"name\": ..., \"sets\": {{\"2\": [[0, 1], ...]}}}}")]
    StaticTableFormat(String),
}
