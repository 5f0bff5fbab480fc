//! Static partition tables (DGX/HGX layouts, Fabric Manager partitions from config).
//!
//! A table lists, per request size, the GPU sets a pod may get; the allocator hands out the first
//! listed set that is fully free and holds every required GPU (go-gpuallocator's `findGPUSet`,
//! reference §1.6). Sizes without an entry cannot be served.
//!
//! # Built-in tables ([`StaticTable::builtin`])
//! | name | sets |
//! | --- | --- |
//! | `dgx1-pascal` | {i}; {0,2},{1,3},{4,6},{5,7}; {0-3},{4-7}; {0-7} (upstream `staticDGX1PascalPolicy`) |
//! | `dgx1-volta` | {i}; {0,3},{1,2},{4,7},{5,6}; {0-3},{4-7}; {0-7} (upstream `staticDGX1VoltaPolicy`) |
//! | `dgx2-volta` | {i}; consecutive pairs; consecutive quads; {0-7},{8-15}; {0-15} (upstream `staticDGX2VoltaPolicy`) |
//! | `hgx-8gpu` | {i}; {0,1},{2,3},{4,5},{6,7}; {0-3},{4-7}; {0-7} (Koordinator's built-in Hopper table) |
//!
//! # Text format ([`StaticTable::from_json`], [`StaticTable::from_yaml`], [`StaticTable::parse`])
//! ```json
//! { "name": "hgx-fm-partitions",
//!   "sets": { "1": [[0], [1], [2], [3]],
//!             "2": [[0, 1], [2, 3]],
//!             "4": [[0, 1, 2, 3]] } }
//! ```
//! or the same in YAML:
//! ```yaml
//! name: hgx-fm-partitions
//! sets:
//!   "2": [[0, 1], [2, 3]]
//!   "4": [[0, 1, 2, 3]]
//! ```
//! `name` is free text used in errors. `sets` maps a request size (a decimal string key in JSON;
//! YAML accepts `2:` or `"2":`) to a list of GPU sets by index; the order of the list is the order of
//! preference. Unknown fields are rejected. A parsed table is only checked for shape; check it
//! against a node with [`StaticTable::validate_for`] (every GPU exists, every set has the size of its
//! key, no GPU twice in a set).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{AllocError, Allocation, Optimality, PreparedNode, Request};

/// A table of valid GPU sets per request size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticTable {
    /// Table name.
    pub name: String,
    /// Valid sets, by size, in order of preference.
    pub sets: BTreeMap<usize, Vec<Vec<usize>>>,
}

/// Names of the built-in tables.
const BUILTIN_NAMES: [&str; 4] = ["dgx1-pascal", "dgx1-volta", "dgx2-volta", "hgx-8gpu"];

impl StaticTable {
    /// A built-in table by name (see the module docs), or `None`.
    pub fn builtin(name: &str) -> Option<StaticTable> {
        let singles = |n: usize| (0..n).map(|i| vec![i]).collect::<Vec<_>>();
        let runs = |n: usize, size: usize| (0..n / size).map(|i| (i * size..(i + 1) * size).collect()).collect();
        let sets: BTreeMap<usize, Vec<Vec<usize>>> = match name {
            "dgx1-pascal" => BTreeMap::from([
                (1, singles(8)),
                (2, vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]),
                (4, runs(8, 4)),
                (8, runs(8, 8)),
            ]),
            "dgx1-volta" => BTreeMap::from([
                (1, singles(8)),
                (2, vec![vec![0, 3], vec![1, 2], vec![4, 7], vec![5, 6]]),
                (4, runs(8, 4)),
                (8, runs(8, 8)),
            ]),
            "dgx2-volta" => BTreeMap::from([
                (1, singles(16)),
                (2, runs(16, 2)),
                (4, runs(16, 4)),
                (8, runs(16, 8)),
                (16, runs(16, 16)),
            ]),
            "hgx-8gpu" => BTreeMap::from([(1, singles(8)), (2, runs(8, 2)), (4, runs(8, 4)), (8, runs(8, 8))]),
            _ => return None,
        };
        Some(StaticTable { name: name.to_string(), sets })
    }

    /// Names accepted by [`StaticTable::builtin`].
    pub fn builtin_names() -> &'static [&'static str] {
        &BUILTIN_NAMES
    }

    /// Parse a table from JSON (format in the module docs).
    pub fn from_json(text: &str) -> Result<StaticTable, AllocError> {
        serde_json::from_str(text).map_err(|e| AllocError::StaticTableFormat(format!("JSON: {e}")))
    }

    /// Parse a table from YAML (format in the module docs).
    pub fn from_yaml(text: &str) -> Result<StaticTable, AllocError> {
        serde_saphyr::from_str(text).map_err(|e| AllocError::StaticTableFormat(format!("YAML: {e}")))
    }

    /// Parse JSON if the text starts with `{`, else YAML.
    pub fn parse(text: &str) -> Result<StaticTable, AllocError> {
        if text.trim_start().starts_with('{') { StaticTable::from_json(text) } else { StaticTable::from_yaml(text) }
    }

    /// Check the table against a node: every GPU index exists, every set has the size of its key,
    /// no GPU appears twice in a set. The error names the table, the size and the set.
    pub fn validate_for(&self, node: &PreparedNode) -> Result<(), AllocError> {
        for (&size, sets) in &self.sets {
            for set in sets {
                self.check_set(node, size, set)?;
            }
        }
        Ok(())
    }

    fn check_set(&self, node: &PreparedNode, size: usize, set: &[usize]) -> Result<(), AllocError> {
        let bad = |why: String| AllocError::BadStaticTable { table: self.name.clone(), size, set: set.to_vec(), why };
        if set.len() != size {
            return Err(bad(format!("the set has {} GPUs but is listed under size {size}", set.len())));
        }
        let mut seen = 0u128;
        for &g in set {
            if g >= node.len() {
                return Err(bad(format!("GPU{g} does not exist (the node has {} GPUs)", node.len())));
            }
            if seen >> g & 1 == 1 {
                return Err(bad(format!("GPU{g} appears twice")));
            }
            seen |= 1u128 << g;
        }
        Ok(())
    }

    /// First listed set of the request size that is fully free and holds every required GPU.
    /// A malformed candidate set (wrong size, duplicate or unknown GPU) is an error, not a result.
    pub fn allocate(&self, node: &PreparedNode, req: &Request<'_>) -> Result<Allocation, AllocError> {
        let (avail, required) = crate::validate(node, req)?;
        let none = || AllocError::NoStaticSet { table: self.name.clone(), count: req.count };
        let sets = self.sets.get(&req.count).ok_or_else(none)?;
        for set in sets {
            self.check_set(node, req.count, set)?;
            let mask = set.iter().fold(0u128, |m, &g| m | (1u128 << g));
            if mask & avail == mask && mask & required == required {
                let mut gpus = set.clone();
                gpus.sort_unstable();
                let set_score = node.set_score(&gpus);
                return Ok(Allocation {
                    gpus,
                    set_score,
                    objective: u64::from(set_score),
                    optimality: Optimality::NotApplicable,
                });
            }
        }
        Err(none())
    }
}
