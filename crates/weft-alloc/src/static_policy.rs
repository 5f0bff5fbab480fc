//! Static partition tables (DGX/HGX layouts, Fabric Manager partitions from config).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{AllocError, Allocation, Optimality, PreparedNode, Request};

/// A table of valid GPU sets per request size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaticTable {
    /// Table name.
    pub name: String,
    /// Valid sets, by size.
    pub sets: BTreeMap<usize, Vec<Vec<usize>>>,
}

impl StaticTable {
    /// First listed set of the request size that is fully free and holds every required GPU.
    pub fn allocate(&self, node: &PreparedNode, req: &Request<'_>) -> Result<Allocation, AllocError> {
        let none = || AllocError::NoStaticSet { table: self.name.clone(), count: req.count };
        let sets = self.sets.get(&req.count).ok_or_else(none)?;
        let set = sets
            .iter()
            .find(|s| s.iter().all(|g| req.available.contains(g)) && req.required.iter().all(|r| s.contains(r)))
            .ok_or_else(none)?;
        let mut gpus = set.clone();
        gpus.sort_unstable();
        let set_score = node.set_score(&gpus);
        Ok(Allocation { gpus, set_score, objective: u64::from(set_score), optimality: Optimality::NotApplicable })
    }
}
