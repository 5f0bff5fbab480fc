//! Volcano HyperNodes (`topology.volcano.sh/v1alpha1`, cluster-scoped) as weft's network model.
//!
//! Only the fields weft reads are typed (`metadata.name`, `spec.tier`, `spec.tierName`,
//! `spec.members[].type` and `.selector`); everything else in the object is ignored. Members
//! resolve as Volcano's scheduler cache resolves them (`GetMembers`, `BuildHyperNodeCache`):
//! `exactMatch` yields the name, `regexMatch` matches node names unanchored (Go's
//! `regexp.MatchString`), `labelMatch` matches node labels and an empty selector matches nothing;
//! a HyperNode member is named by `exactMatch` only; a member HyperNode that does not exist is
//! skipped (a warning), as Volcano skips it.
//!
//! Rejected as Volcano rejects: no members, a selector with none or more than one of the three
//! forms (the CRD's CEL rule), a regex that does not compile (the webhook), a negative or missing
//! tier, a HyperNode with two parents and a cycle (`addChild`, which stops Volcano scheduling jobs
//! with a network topology). Rejected by weft because its model is a tree where Volcano tolerates
//! it: a node in two HyperNodes that do not contain one another (Volcano keeps both, §6.5 of the
//! reference), a member HyperNode whose tier is not below its parent's, and a HyperNode member
//! given by regex or labels (Volcano ignores it silently).

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::network::{ClusterNode, NetworkModel, Skeleton, Tier};

/// A HyperNode, the fields weft reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HyperNode {
    /// `metadata`.
    #[serde(default)]
    pub metadata: Metadata,
    /// `spec`.
    #[serde(default)]
    pub spec: HyperNodeSpec,
}

/// `metadata`: the name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// `metadata.name`.
    #[serde(default)]
    pub name: String,
}

/// `spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HyperNodeSpec {
    /// `spec.tier` (required, ≥ 0): lower is closer.
    #[serde(default)]
    pub tier: Option<i64>,
    /// `spec.tierName`, e.g. `rack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_name: Option<String>,
    /// `spec.members` (at least one).
    #[serde(default)]
    pub members: Vec<Member>,
}

/// `spec.members[]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `Node` or `HyperNode`.
    #[serde(rename = "type")]
    pub member_type: MemberType,
    /// Exactly one of the three forms.
    #[serde(default)]
    pub selector: MemberSelector,
}

/// `spec.members[].type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberType {
    /// Real nodes.
    Node,
    /// A child HyperNode.
    HyperNode,
}

/// `spec.members[].selector`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberSelector {
    /// `exactMatch.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_match: Option<ExactMatch>,
    /// `regexMatch.pattern`, matched against node names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex_match: Option<RegexMatch>,
    /// `labelMatch`, a `metav1.LabelSelector` over node labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_match: Option<LabelSelector>,
}

/// `exactMatch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactMatch {
    /// The node's or HyperNode's name.
    #[serde(default)]
    pub name: String,
}

/// `regexMatch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegexMatch {
    /// An RE2 pattern.
    #[serde(default)]
    pub pattern: String,
}

/// A `metav1.LabelSelector`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// `matchLabels`.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// `matchExpressions`.
    #[serde(default)]
    pub match_expressions: Vec<Requirement>,
}

/// A `matchExpressions` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`.
    pub operator: String,
    /// Values (for `In`/`NotIn`).
    #[serde(default)]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Check the operators and values as `LabelSelectorAsSelector` does.
    fn validate(&self) -> Result<(), String> {
        for (i, r) in self.match_expressions.iter().enumerate() {
            match r.operator.as_str() {
                "In" | "NotIn" if r.values.is_empty() => {
                    return Err(format!("matchExpressions[{i}]: operator {} needs values", r.operator));
                }
                "Exists" | "DoesNotExist" if !r.values.is_empty() => {
                    return Err(format!("matchExpressions[{i}]: operator {} takes no values", r.operator));
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                other => {
                    return Err(format!(
                        "matchExpressions[{i}]: unknown operator `{other}` (In, NotIn, Exists, DoesNotExist)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether `labels` match; an empty selector matches nothing (Volcano's `GetMembers`).
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        if self.match_labels.is_empty() && self.match_expressions.is_empty() {
            return false;
        }
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let v = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => v.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => v.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    _ => false,
                }
            })
    }
}

/// One document: a HyperNode, or a list of them (`items`).
#[derive(Deserialize)]
struct Document {
    #[serde(default)]
    items: Option<Vec<HyperNode>>,
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: HyperNodeSpec,
}

/// Parse HyperNodes from YAML or JSON: one or more documents, each a HyperNode or a list
/// (`items`, as `kubectl get hypernodes -o yaml` prints). Errors name the line and field.
pub fn parse_hypernodes(text: &str, source_name: &str) -> Result<Vec<HyperNode>, ModelError> {
    let docs: Vec<Option<Document>> = serde_saphyr::from_multiple(text)
        .map_err(|e| ModelError::Parse { source_name: source_name.to_string(), message: e.to_string() })?;
    let mut out = Vec::new();
    for doc in docs.into_iter().flatten() {
        match doc.items {
            Some(items) => out.extend(items),
            None => out.push(HyperNode { metadata: doc.metadata, spec: doc.spec }),
        }
    }
    Ok(out)
}

/// Build the network model from HyperNodes over `nodes` (names and labels, for regex and label
/// members). Tiers are the HyperNodes' distinct `spec.tier` values, innermost first, named by
/// their `tierName` (the first in HyperNode name order that has one; else `tier<N>`); the root
/// (the whole cluster, Volcano's virtual top HyperNode) is one tier above the highest.
pub fn from_hypernodes(hypernodes: &[HyperNode], nodes: &[ClusterNode]) -> Result<NetworkModel, ModelError> {
    let mut warnings = Vec::new();
    let mut sorted: Vec<&HyperNode> = hypernodes.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut by_name: FxHashMap<&str, usize> = FxHashMap::default();
    let mut tiers_of = Vec::with_capacity(sorted.len());
    let mut regexes: Vec<Vec<Option<Regex>>> = Vec::with_capacity(sorted.len());
    for (i, hn) in sorted.iter().enumerate() {
        let name = hn.metadata.name.as_str();
        let bad = |field: &str, message: String| ModelError::HyperNode {
            name: if name.is_empty() { "(unnamed)".into() } else { name.to_string() },
            field: field.to_string(),
            message,
        };
        if name.is_empty() {
            return Err(bad("metadata.name", "empty".into()));
        }
        if by_name.insert(name, i).is_some() {
            return Err(bad("metadata.name", "two HyperNodes have this name".into()));
        }
        let tier = match hn.spec.tier {
            None => return Err(bad("spec.tier", "missing (required)".into())),
            Some(t) if t < 0 => return Err(bad("spec.tier", format!("{t} is negative (minimum 0)"))),
            Some(t) => u32::try_from(t).map_err(|_| bad("spec.tier", format!("{t} is too large")))?,
        };
        tiers_of.push(tier);
        if hn.spec.members.is_empty() {
            return Err(bad("spec.members", "no members (at least one)".into()));
        }
        let mut res = Vec::with_capacity(hn.spec.members.len());
        for (mi, m) in hn.spec.members.iter().enumerate() {
            let field = format!("spec.members[{mi}].selector");
            let s = &m.selector;
            let forms = usize::from(s.exact_match.is_some())
                + usize::from(s.regex_match.is_some())
                + usize::from(s.label_match.is_some());
            if forms != 1 {
                return Err(bad(
                    &field,
                    format!("{forms} of exactMatch, regexMatch, labelMatch given; exactly one is required"),
                ));
            }
            if let Some(e) = &s.exact_match
                && e.name.is_empty()
            {
                return Err(bad(&format!("{field}.exactMatch.name"), "empty".into()));
            }
            if m.member_type == MemberType::HyperNode && s.exact_match.is_none() {
                return Err(bad(
                    &field,
                    "a HyperNode member is named by exactMatch only (Volcano ignores regexMatch and labelMatch here)"
                        .into(),
                ));
            }
            let mut re = None;
            if let Some(r) = &s.regex_match {
                re = Some(Regex::new(&r.pattern).map_err(|e| {
                    bad(&format!("{field}.regexMatch.pattern"), format!("`{}` does not compile: {e}", r.pattern))
                })?);
            }
            if let Some(l) = &s.label_match {
                l.validate().map_err(|e| bad(&format!("{field}.labelMatch"), e))?;
            }
            res.push(re);
        }
        regexes.push(res);
    }
    // Parents: one per HyperNode.
    let mut parent: Vec<Option<usize>> = vec![None; sorted.len()];
    for (p, hn) in sorted.iter().enumerate() {
        for m in hn.spec.members.iter().filter(|m| m.member_type == MemberType::HyperNode) {
            let Some(child_name) = m.selector.exact_match.as_ref().map(|e| e.name.as_str()) else { continue };
            let Some(&c) = by_name.get(child_name) else {
                warnings.push(format!(
                    "HyperNode `{}`: member HyperNode `{child_name}` does not exist; skipped",
                    hn.metadata.name
                ));
                continue;
            };
            match parent[c] {
                Some(q) if q != p => {
                    return Err(ModelError::HyperNodeTwoParents {
                        child: child_name.to_string(),
                        first: sorted[q].metadata.name.clone(),
                        second: hn.metadata.name.clone(),
                    });
                }
                _ => parent[c] = Some(p),
            }
        }
    }
    // Cycles: follow parents from every HyperNode.
    for start in 0..sorted.len() {
        let mut chain = vec![start];
        let mut cur = start;
        while let Some(p) = parent[cur] {
            if let Some(at) = chain.iter().position(|&c| c == p) {
                let mut names: Vec<&str> = chain[at..].iter().map(|&c| sorted[c].metadata.name.as_str()).collect();
                names.push(sorted[p].metadata.name.as_str());
                return Err(ModelError::HyperNodeCycle { chain: names.join(" -> ") });
            }
            chain.push(p);
            cur = p;
        }
    }
    for (c, p) in parent.iter().enumerate() {
        if let Some(p) = *p
            && tiers_of[c] >= tiers_of[p]
        {
            return Err(ModelError::HyperNode {
                name: sorted[p].metadata.name.clone(),
                field: "spec.members".into(),
                message: format!(
                    "member HyperNode `{}` has tier {}, not below this HyperNode's tier {}",
                    sorted[c].metadata.name, tiers_of[c], tiers_of[p]
                ),
            });
        }
    }
    // Tiers.
    let numbers: BTreeSet<u32> = tiers_of.iter().copied().collect();
    let tier_index: BTreeMap<u32, usize> = numbers.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let tiers: Vec<Tier> = numbers
        .iter()
        .map(|&n| {
            let name = sorted
                .iter()
                .zip(&tiers_of)
                .filter(|&(_, &t)| t == n)
                .find_map(|(h, _)| h.spec.tier_name.clone().filter(|s| !s.is_empty()))
                .unwrap_or_else(|| format!("tier{n}"));
            Tier { name, number: n }
        })
        .collect();
    // Node members.
    let node_index: FxHashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    if node_index.len() != nodes.len() {
        let mut seen = BTreeSet::new();
        let dup = nodes.iter().find(|n| !seen.insert(n.name.as_str())).map(|n| n.name.clone()).unwrap_or_default();
        return Err(ModelError::DuplicateNode { name: dup });
    }
    let mut containing: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (h, hn) in sorted.iter().enumerate() {
        let mut members = BTreeSet::new();
        for (mi, m) in hn.spec.members.iter().enumerate().filter(|(_, m)| m.member_type == MemberType::Node) {
            let s = &m.selector;
            if let Some(e) = &s.exact_match {
                match node_index.get(e.name.as_str()) {
                    Some(&n) => {
                        members.insert(n);
                    }
                    None => warnings.push(format!(
                        "HyperNode `{}`: member node `{}` is not a node of the cluster; skipped",
                        hn.metadata.name, e.name
                    )),
                }
            }
            if let Some(re) = &regexes[h][mi] {
                members.extend(nodes.iter().enumerate().filter(|(_, n)| re.is_match(&n.name)).map(|(i, _)| i));
            }
            if let Some(l) = &s.label_match {
                members.extend(nodes.iter().enumerate().filter(|(_, n)| l.matches(&n.labels)).map(|(i, _)| i));
            }
        }
        for n in members {
            containing[n].push(h);
        }
    }
    let is_ancestor = |a: usize, mut of: usize| {
        while let Some(p) = parent[of] {
            if p == a {
                return true;
            }
            of = p;
        }
        false
    };
    let mut node_domain = Vec::with_capacity(nodes.len());
    for (n, list) in containing.iter_mut().enumerate() {
        list.sort_by_key(|&h| (tiers_of[h], h));
        for w in list.windows(2) {
            if !is_ancestor(w[1], w[0]) {
                return Err(ModelError::NodeInTwoHyperNodes {
                    node: nodes[n].name.clone(),
                    first: sorted[w[0]].metadata.name.clone(),
                    first_tier: tiers_of[w[0]],
                    second: sorted[w[1]].metadata.name.clone(),
                    second_tier: tiers_of[w[1]],
                });
            }
        }
        node_domain.push(list.first().copied());
    }
    let domains = sorted
        .iter()
        .enumerate()
        .map(|(h, hn)| (hn.metadata.name.clone(), tier_index[&tiers_of[h]], parent[h]))
        .collect();
    Skeleton { tiers, domains, nodes: nodes.iter().map(|n| n.name.clone()).collect(), node_domain, warnings }.finish()
}
