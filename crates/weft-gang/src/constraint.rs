//! How far apart a gang's members may be: Volcano's `networkTopology` (mode `hard`/`soft`,
//! `highestTierAllowed` or `highestTierName`) and weft's annotation for other workloads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::PlanError;

/// weft's gang topology annotation: `hard:<tier>` (a tier number or a tier name: `hard:2`,
/// `hard:fabric.topograph.run/tier-0`) or `soft`.
pub const GANG_TOPOLOGY_ANNOTATION: &str = "weft.io/network-topology";
/// Volcano's pod annotations for the mode (invalid values read as `hard`, as Volcano reads them).
pub const VOLCANO_MODE_ANNOTATION: &str = "volcano.sh/network-topology-mode";
/// Volcano's pod annotation for the highest tier (an integer).
pub const VOLCANO_TIER_ANNOTATION: &str = "volcano.sh/network-topology-highest-tier";

/// Hard: never place beyond the highest tier; soft: the tightest domain that fits, up to the whole
/// cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refuse a plan beyond the highest tier.
    Hard,
    /// Prefer the tightest domain, fall back to any.
    #[default]
    Soft,
}

/// A tier as a constraint names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TierRef {
    /// Volcano's `highestTierAllowed`: every tier numbered at most this is allowed.
    Number(u32),
    /// Volcano's `highestTierName` (a HyperNode `tierName`) or a label level's key.
    Name(String),
}

impl std::fmt::Display for TierRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TierRef::Number(n) => write!(f, "{n}"),
            TierRef::Name(s) => f.write_str(s),
        }
    }
}

/// A gang's tier constraint. `Hard` without a tier constrains nothing, as in Volcano
/// (`IsHardTopologyMode` needs `highestTierAllowed`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierConstraint {
    /// Hard or soft.
    pub mode: Mode,
    /// The highest tier a hard constraint allows.
    pub highest: Option<TierRef>,
}

impl TierConstraint {
    /// Hard, up to `tier`.
    pub fn hard(tier: TierRef) -> TierConstraint {
        TierConstraint { mode: Mode::Hard, highest: Some(tier) }
    }

    /// Soft: the tightest domain that fits, else the next tier up, up to the whole cluster.
    pub fn soft() -> TierConstraint {
        TierConstraint { mode: Mode::Soft, highest: None }
    }

    /// Read weft's annotation, else Volcano's pod annotations; None when neither is there.
    ///
    /// weft's annotation is strict: anything but `soft`, `hard:<number>` or `hard:<name>` is an
    /// error naming the annotation. Volcano's are read as Volcano's podgroup controller reads them:
    /// a mode other than `soft` is `hard`, the tier must be an integer ≥ 0.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Option<TierConstraint>, PlanError> {
        if let Some(v) = annotations.get(GANG_TOPOLOGY_ANNOTATION) {
            let bad = |message: String| PlanError::Constraint { field: GANG_TOPOLOGY_ANNOTATION.into(), message };
            let v = v.trim();
            if v == "soft" {
                return Ok(Some(TierConstraint::soft()));
            }
            let Some(tier) = v.strip_prefix("hard:") else {
                return Err(bad(format!("`{v}`: expected `soft` or `hard:<tier number or name>`")));
            };
            let tier = tier.trim();
            if tier.is_empty() {
                return Err(bad("`hard:` needs a tier (`hard:1`, `hard:rack`)".into()));
            }
            return Ok(Some(TierConstraint::hard(parse_tier(tier))));
        }
        let mode = annotations.get(VOLCANO_MODE_ANNOTATION);
        let tier = annotations.get(VOLCANO_TIER_ANNOTATION);
        if mode.is_none() && tier.is_none() {
            return Ok(None);
        }
        let highest = match tier {
            None => None,
            Some(t) => Some(TierRef::Number(t.trim().parse::<u32>().map_err(|_| PlanError::Constraint {
                field: VOLCANO_TIER_ANNOTATION.into(),
                message: format!("`{t}` is not a tier number (an integer ≥ 0)"),
            })?)),
        };
        let mode = if mode.is_some_and(|m| m == "soft") { Mode::Soft } else { Mode::Hard };
        Ok(Some(TierConstraint { mode, highest }))
    }

    /// A Volcano Job's, PodGroup's or partition's `networkTopology`. Both tier fields set is an
    /// error (Volcano's webhook refuses it); mode defaults to `hard`.
    pub fn from_volcano(spec: &NetworkTopologySpec, field: &str) -> Result<TierConstraint, PlanError> {
        let mode = match spec.mode.as_deref() {
            None | Some("hard") => Mode::Hard,
            Some("soft") => Mode::Soft,
            Some(other) => {
                return Err(PlanError::Constraint {
                    field: format!("{field}.mode"),
                    message: format!("`{other}`: expected hard or soft"),
                });
            }
        };
        let highest = match (spec.highest_tier_allowed, &spec.highest_tier_name) {
            (Some(_), Some(_)) => {
                return Err(PlanError::Constraint {
                    field: field.into(),
                    message: "highestTierAllowed and highestTierName are both set; set one".into(),
                });
            }
            (Some(n), None) => Some(TierRef::Number(u32::try_from(n).map_err(|_| PlanError::Constraint {
                field: format!("{field}.highestTierAllowed"),
                message: format!("{n} is not a tier number (an integer ≥ 0)"),
            })?)),
            (None, Some(name)) => Some(TierRef::Name(name.clone())),
            (None, None) => None,
        };
        Ok(TierConstraint { mode, highest })
    }
}

fn parse_tier(s: &str) -> TierRef {
    s.parse::<u32>().map_or_else(|_| TierRef::Name(s.to_string()), TierRef::Number)
}

/// Volcano's `networkTopology` (Job, PodGroup, task partition), the fields weft reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkTopologySpec {
    /// `hard` (default) or `soft`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The highest tier allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest_tier_allowed: Option<i64>,
    /// The highest tier, by its HyperNodes' `tierName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest_tier_name: Option<String>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn weft_annotation_forms() {
        let c = |v: &str| TierConstraint::from_annotations(&ann(&[(GANG_TOPOLOGY_ANNOTATION, v)]));
        assert_eq!(c("soft").unwrap(), Some(TierConstraint::soft()));
        assert_eq!(c("hard:2").unwrap(), Some(TierConstraint::hard(TierRef::Number(2))));
        assert_eq!(c("hard:rack").unwrap(), Some(TierConstraint::hard(TierRef::Name("rack".into()))));
        let e = c("hard").unwrap_err().to_string();
        assert!(e.starts_with("weft.io/network-topology: `hard`: expected"), "{e}");
        let e = c("hard:").unwrap_err().to_string();
        assert!(e.contains("needs a tier"), "{e}");
    }

    #[test]
    fn volcano_annotations_read_as_volcano_reads_them() {
        let c = TierConstraint::from_annotations(&ann(&[
            (VOLCANO_MODE_ANNOTATION, "bogus"),
            (VOLCANO_TIER_ANNOTATION, "2"),
        ]))
        .unwrap();
        assert_eq!(c, Some(TierConstraint::hard(TierRef::Number(2))));
        let e = TierConstraint::from_annotations(&ann(&[(VOLCANO_TIER_ANNOTATION, "two")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "volcano.sh/network-topology-highest-tier: `two` is not a tier number (an integer ≥ 0)"
        );
        assert_eq!(TierConstraint::from_annotations(&ann(&[])).unwrap(), None);
    }

    #[test]
    fn volcano_spec_defaults_to_hard_and_refuses_both_tiers() {
        let spec: NetworkTopologySpec = serde_json::from_str(r#"{"highestTierAllowed": 1}"#).unwrap();
        assert_eq!(
            TierConstraint::from_volcano(&spec, "spec.networkTopology").unwrap(),
            TierConstraint::hard(TierRef::Number(1))
        );
        let spec: NetworkTopologySpec =
            serde_json::from_str(r#"{"mode": "soft", "highestTierAllowed": 1, "highestTierName": "rack"}"#).unwrap();
        let e = TierConstraint::from_volcano(&spec, "spec.networkTopology").unwrap_err().to_string();
        assert!(e.starts_with("spec.networkTopology: highestTierAllowed and highestTierName"), "{e}");
    }
}
