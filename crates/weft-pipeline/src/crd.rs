//! Which Pipeline CRD the cluster serves, and so which binding form reaches the webhook.
//!
//! Numaflow ships two Pipeline CRDs (numaflow 63ba4e8, `config/base/crds/`):
//!
//! - **full** (`crds/full`, what `config/install.yaml`, the default install, carries): a
//!   structural schema generated from the Go types, with no `x-kubernetes-preserve-unknown-fields`
//!   anywhere. `spec.edges[]` declares `from`, `to`, `conditions` and `onFull` only, so the API
//!   server refuses `spec.edges[].numaNetwork` (strict field validation, kubectl's default) or
//!   prunes it before admission. Only the annotation [`crate::NUMA_NETWORK_EDGES_ANNOTATION`]
//!   reaches weft.
//! - **minimal** (`config/advanced-install/minimal-crds.yaml`): `spec` is an object with
//!   `x-kubernetes-preserve-unknown-fields: true`, so the field form arrives as written.
//!
//! [`edge_field`] reads the served CRD object and says which of the two holds for the field, by
//! walking the schema of `spec.edges[].numaNetwork` as the API server's pruning does.

use serde_json::Value;

/// The Pipeline CRD's name.
pub const PIPELINE_CRD_NAME: &str = "pipelines.numaflow.numaproj.io";

/// What the served Pipeline CRD does with `spec.edges[].numaNetwork`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdgeField {
    /// The schema keeps it (Numaflow's minimal CRD: unknown fields under `spec` are preserved):
    /// both binding forms reach the webhook.
    Kept,
    /// The schema prunes it (Numaflow's full CRD): only the annotation form reaches the webhook.
    Pruned,
}

/// What the served Pipeline CRD object `crd` (an `apiextensions.k8s.io/v1`
/// CustomResourceDefinition) does with `spec.edges[].numaNetwork` in version
/// [`crate::VERSION`], or why that cannot be told.
pub fn edge_field(crd: &Value) -> Result<EdgeField, String> {
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array).ok_or("the CRD has no spec.versions")?;
    let version = versions
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(crate::VERSION))
        .ok_or_else(|| format!("the CRD has no version {}", crate::VERSION))?;
    if version.get("served").and_then(Value::as_bool) == Some(false) {
        return Err(format!("the CRD does not serve version {}", crate::VERSION));
    }
    let mut node = version
        .pointer("/schema/openAPIV3Schema")
        .ok_or_else(|| format!("version {} has no schema.openAPIV3Schema", crate::VERSION))?;
    // spec → edges → (items) → numaNetwork, as pruning walks it: a declared property is entered,
    // an undeclared one is kept only under x-kubernetes-preserve-unknown-fields.
    for step in ["spec", "edges", "[]", "numaNetwork"] {
        if step == "[]" {
            match node.get("items") {
                Some(items) => node = items,
                None => return Ok(EdgeField::Kept),
            }
            continue;
        }
        match node.get("properties").and_then(|p| p.get(step)) {
            Some(next) => node = next,
            None if preserves_unknown(node) => return Ok(EdgeField::Kept),
            None => return Ok(EdgeField::Pruned),
        }
    }
    Ok(EdgeField::Kept)
}

fn preserves_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(schema: Value) -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": PIPELINE_CRD_NAME},
               "spec": {"group": "numaflow.numaproj.io", "versions": [
                   {"name": "v1alpha1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": schema}}]}})
    }

    #[test]
    fn the_minimal_crd_keeps_the_field_and_the_full_crd_prunes_it() {
        // config/base/crds/minimal: spec preserves unknown fields.
        let minimal = crd(json!({"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}));
        assert_eq!(edge_field(&minimal), Ok(EdgeField::Kept));
        // config/base/crds/full, reduced to the edges: the Go Edge type's fields, nothing preserved.
        let full = crd(json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "edges": {"type": "array", "items": {"type": "object", "required": ["from", "to"], "properties": {
                "from": {"type": "string"}, "to": {"type": "string"},
                "conditions": {"type": "object"}, "onFull": {"type": "string"}}}}}}}}));
        assert_eq!(edge_field(&full), Ok(EdgeField::Pruned));
        // A schema whose edges preserve unknown fields, or that declares the field, keeps it.
        let mut preserving = full.clone();
        preserving["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["edges"]["items"]
            ["x-kubernetes-preserve-unknown-fields"] = json!(true);
        assert_eq!(edge_field(&preserving), Ok(EdgeField::Kept));
        let mut declaring = full;
        declaring["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["edges"]["items"]
            ["properties"]["numaNetwork"] = json!({"type": "object"});
        assert_eq!(edge_field(&declaring), Ok(EdgeField::Kept));
        // A spec without properties and without preserving drops everything under it.
        assert_eq!(edge_field(&crd(json!({"properties": {"spec": {"type": "object"}}}))), Ok(EdgeField::Pruned));
    }

    #[test]
    fn a_crd_that_cannot_be_read_says_why() {
        assert!(edge_field(&json!({})).unwrap_err().contains("spec.versions"));
        let mut other = crd(json!({}));
        other["spec"]["versions"][0]["name"] = json!("v2");
        assert!(edge_field(&other).unwrap_err().contains("no version v1alpha1"));
        let mut unserved = crd(json!({}));
        unserved["spec"]["versions"][0]["served"] = json!(false);
        assert!(edge_field(&unserved).unwrap_err().contains("does not serve"));
        let mut no_schema = crd(json!({}));
        no_schema["spec"]["versions"][0]["schema"] = json!({});
        assert!(edge_field(&no_schema).unwrap_err().contains("openAPIV3Schema"));
    }
}
