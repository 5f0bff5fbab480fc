//! Which nodes get the agent's resource manager: `weft agent --cpu-management-label KEY=VALUE`
//! runs it only on nodes whose Node carries that label, so that CPU management is a per-node
//! choice (many GPU nodes run the kubelet's static CPU manager, and two managers writing cpusets
//! fight each other). Elsewhere the agent is placement-only, as with `--mode off`.

use std::collections::BTreeMap;
use std::str::FromStr;

use anyhow::Context;

use crate::kube_args::KubeArgs;

/// A node label that must be present with this value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelGate {
    pub key: String,
    pub value: String,
}

impl FromStr for LabelGate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (key, value) = s.split_once('=').ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("{s:?} has no label key before '='"));
        }
        // A label key is an optional DNS-subdomain prefix and a name of letters, digits, '-', '_'
        // and '.'; a value is the same characters (or empty).
        let name = key.rsplit_once('/').map_or(key, |(_, n)| n);
        let ok = |t: &str| t.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if name.is_empty() || !ok(name) || key.split('/').count() > 2 {
            return Err(format!("{key:?} is not a label key (prefix/name, letters, digits, '-', '_', '.')"));
        }
        if !ok(value) {
            return Err(format!("{value:?} is not a label value (letters, digits, '-', '_', '.')"));
        }
        Ok(LabelGate { key: key.to_string(), value: value.to_string() })
    }
}

impl std::fmt::Display for LabelGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

impl LabelGate {
    /// Whether a node with these labels gets the resource manager.
    pub fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        labels.get(&self.key) == Some(&self.value)
    }
}

/// The labels of Node `node`, read once from the API server (before the agent's runtime starts).
pub fn node_labels(kube: &KubeArgs, node: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
    rt.block_on(async {
        let client = kube.client().await?;
        let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let n = api.get(node).await.with_context(|| format!("reading Node {node} for --cpu-management-label"))?;
        Ok(n.metadata.labels.unwrap_or_default())
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_admits_only_nodes_with_the_label_and_value() {
        let g: LabelGate = "weft.io/cpu-management=enabled".parse().unwrap();
        let with = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(g.admits(&with("weft.io/cpu-management", "enabled")));
        assert!(!g.admits(&with("weft.io/cpu-management", "disabled")));
        assert!(!g.admits(&with("other", "enabled")));
        assert!(!g.admits(&BTreeMap::new()));
    }

    #[test]
    fn bad_gates_are_refused_naming_what_is_wrong() {
        assert!("weft.io/cpu-management".parse::<LabelGate>().unwrap_err().contains("KEY=VALUE"));
        assert!("=enabled".parse::<LabelGate>().unwrap_err().contains("no label key"));
        assert!("a/b/c=x".parse::<LabelGate>().unwrap_err().contains("not a label key"));
        assert!("k=a b".parse::<LabelGate>().unwrap_err().contains("not a label value"));
        assert_eq!("k=".parse::<LabelGate>().unwrap(), LabelGate { key: "k".into(), value: String::new() });
    }
}
