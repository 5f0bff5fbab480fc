//! Errors of the topology crate. Every parse error names where (file, line, column) and what.

use thiserror::Error;

/// What went wrong reading or building a node topology.
#[derive(Debug, Error)]
pub enum TopologyError {
    /// A `topo -m` cell or inventory relation that is not a known token.
    #[error("unknown link token '{0}' (expected X, NV#, PIX, PXB, PHB, NODE, SYS or SOC)")]
    UnknownRelation(String),
    /// A malformed list of numbers in the kernel's list format (CPUs, GPUs).
    #[error("bad {what} list '{list}': {why}")]
    IdList {
        /// What the numbers are (`CPU`, `GPU`).
        what: &'static str,
        /// The list as given.
        list: String,
        /// What is wrong with it.
        why: String,
    },
    /// The two directions of a pair disagree.
    #[error("asymmetric matrix: GPU{a}->GPU{b} is {ab} but GPU{b}->GPU{a} is {ba}")]
    Asymmetric {
        /// First GPU.
        a: usize,
        /// Second GPU.
        b: usize,
        /// Relation seen from `a`.
        ab: String,
        /// Relation seen from `b`.
        ba: String,
    },
    /// A parse error at a place in the source text.
    #[error("{source_name}:{line}:{column}: {message}")]
    Parse {
        /// File name or `<input>`.
        source_name: String,
        /// 1-based line.
        line: usize,
        /// 1-based column (cell number for `topo -m`; character column for JSON/YAML).
        column: usize,
        /// What is wrong and what was expected.
        message: String,
    },
    /// A structurally invalid model.
    #[error("invalid topology: {0}")]
    Invalid(String),
    /// Reading a file or sysfs entry failed.
    #[error("{path}: {source}")]
    Io {
        /// The path read.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// GPU discovery through NVML failed.
    #[error("NVML: {0}")]
    Nvml(String),
}
