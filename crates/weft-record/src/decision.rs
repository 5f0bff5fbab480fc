//! The device decision the scheduler extender records on a pod when it binds it, beside
//! `weft.io/gpu-ids` (and `weft.io/vf-ids`): which node it was made for, which GPUs and which VFs
//! of each physnet (one decision covers both, so the VFs sit near the GPUs), when and by whom. `gpu-ids` is what
//! the pod holds (the node side rewrites it with what the container really got); the decision stays
//! as made, so a reader can tell a decision for another node (stale: the pod was rebound) or one
//! the node could not honour.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Pod annotation holding a [`GpuDecision`] as JSON.
pub const GPU_DECISION_ANNOTATION: &str = "weft.io/gpu-decision";

/// One recorded decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuDecision {
    /// The node the decision is for.
    pub node: String,
    /// GPU indices on that node, ascending.
    pub gpus: Vec<usize>,
    /// SR-IOV VFs by physnet (PCI addresses, in the order chosen); absent when the pod asks for
    /// none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vfs: BTreeMap<String, Vec<String>>,
    /// When it was made (RFC 3339).
    pub decided_at: String,
    /// The component that made it.
    pub by: String,
}

impl GpuDecision {
    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        // A struct of strings and integers always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read an annotation value; the error names what is wrong.
    pub fn from_annotation(value: &str) -> Result<GpuDecision, String> {
        serde_json::from_str(value).map_err(|e| format!("{GPU_DECISION_ANNOTATION}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_reads_back_and_has_camel_case_fields() {
        let d = GpuDecision {
            node: "n1".into(),
            gpus: vec![0, 3],
            vfs: BTreeMap::new(),
            decided_at: "2026-11-25T10:00:00Z".into(),
            by: "x".into(),
        };
        let text = d.to_annotation();
        assert_eq!(text, r#"{"node":"n1","gpus":[0,3],"decidedAt":"2026-11-25T10:00:00Z","by":"x"}"#);
        assert_eq!(GpuDecision::from_annotation(&text), Ok(d.clone()));
        assert!(GpuDecision::from_annotation("{").unwrap_err().contains(GPU_DECISION_ANNOTATION));
        let with_vfs = GpuDecision { vfs: BTreeMap::from([("fabric".into(), vec!["0000:0c:00.2".into()])]), ..d };
        let text = with_vfs.to_annotation();
        assert!(text.contains(r#""vfs":{"fabric":["0000:0c:00.2"]}"#), "{text}");
        assert_eq!(GpuDecision::from_annotation(&text), Ok(with_vfs));
    }
}
