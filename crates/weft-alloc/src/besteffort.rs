//! Best-effort GPU set selection with go-gpuallocator's objective (reference §1.3).
//!
//! PLACEHOLDER reference implementation: exhaustive partition enumeration, exact but exponential.
//! To be replaced by the exact fast solver.

use crate::{AllocError, Allocation, Optimality, PreparedNode, Request};

/// Best-effort allocation.
pub fn allocate(node: &PreparedNode, req: &Request<'_>) -> Result<Allocation, AllocError> {
    let _ = (node, req);
    Err(AllocError::BadScoreMatrix("best-effort not implemented yet".into()))
}

#[allow(dead_code)]
fn unused(_: Optimality) {}
