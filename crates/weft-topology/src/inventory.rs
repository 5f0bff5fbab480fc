//! The node inventory: weft's own versioned JSON/YAML description of a node. Unlike `topo -m` text it
//! carries both relations of every GPU pair. Format reference: `docs/topology.md`.
//!
//! ```yaml
//! apiVersion: weft.io/v1alpha1
//! kind: NodeTopology
//! name: dgx-a100-01
//! nvlinkGeneration: nvlink3
//! pcieGeneration: 4
//! gpus:
//!   - {index: 0, uuid: GPU-…, pciBusId: "0000:07:00.0", numaNode: 3, cpuAffinity: "48-63,176-191"}
//! links:                     # every unordered GPU pair exactly once
//!   - {gpus: [0, 1], pcie: PXB, nvlinks: 12}
//! nics:
//!   - {name: mlx5_0}
//! nicLinks:
//!   - {gpu: 0, nic: mlx5_0, pcie: PXB}
//! vfs:                       # SR-IOV VFs, by PF, with the physnet each serves
//!   - {pciAddress: "0000:0c:00.2", nic: mlx5_0, physnet: fabric}
//! ```

use serde::{Deserialize, Serialize};
use serde_saphyr::MessageFormatter as _;

use crate::error::TopologyError;
use crate::model::{CpuTopology, Gpu, Nic, NodeTopology, NvlinkGeneration, PairLink, PcieGeneration, PcieRelation, Vf};
use crate::smi::parse_topo_matrix;

/// The `apiVersion` this build writes and reads.
pub const API_VERSION: &str = "weft.io/v1alpha1";
/// The `kind` of a node inventory document.
pub const KIND: &str = "NodeTopology";

/// Serialised form of [`NodeTopology`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inventory {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// Always [`KIND`].
    pub kind: String,
    /// Node name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// NVLink generation (`nvlink1` … `nvlink5`, `nvlink3-ga102`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_generation: Option<NvlinkGeneration>,
    /// PCIe generation of the GPU links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_generation: Option<u8>,
    /// Inter-socket bandwidth, GB/s per direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inter_socket_gbps: Option<f64>,
    /// GPUs in index order.
    pub gpus: Vec<Gpu>,
    /// Every unordered GPU pair once.
    #[serde(default)]
    pub links: Vec<LinkEntry>,
    /// NICs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<Nic>,
    /// GPU–NIC PCIe relations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nic_links: Vec<NicLinkEntry>,
    /// SR-IOV VFs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vfs: Vec<Vf>,
    /// CPU/NUMA layout.
    #[serde(default)]
    pub cpus: CpuTopology,
}

/// Both relations of one GPU pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkEntry {
    /// The two GPU indices.
    pub gpus: [u32; 2],
    /// PCIe relation; `null` when the source did not say (text dumps, NVLinked pairs).
    pub pcie: Option<PcieRelation>,
    /// NVLink count.
    #[serde(default)]
    pub nvlinks: u8,
}

/// The PCIe relation of one GPU–NIC pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicLinkEntry {
    /// GPU index.
    pub gpu: u32,
    /// NIC name as in `nics`.
    pub nic: String,
    /// Relation.
    pub pcie: PcieRelation,
}

impl Inventory {
    /// The inventory of a node.
    pub fn from_node(node: &NodeTopology) -> Inventory {
        let n = node.gpu_count();
        let mut links = Vec::with_capacity(n * n.saturating_sub(1) / 2);
        for a in 0..n {
            for b in (a + 1)..n {
                let l = node.link(a, b);
                links.push(LinkEntry { gpus: [a as u32, b as u32], pcie: l.pcie, nvlinks: l.nvlinks });
            }
        }
        let mut nic_links = Vec::new();
        for g in 0..n {
            for (k, nic) in node.nics.iter().enumerate() {
                if let Some(r) = node.nic_link(g, k) {
                    nic_links.push(NicLinkEntry { gpu: g as u32, nic: nic.name.clone(), pcie: r });
                }
            }
        }
        Inventory {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            name: node.name.clone(),
            nvlink_generation: node.nvlink_generation,
            pcie_generation: node.pcie_generation.map(|g| g.0),
            inter_socket_gbps: node.inter_socket_gbps,
            gpus: node.gpus.clone(),
            links,
            nics: node.nics.clone(),
            nic_links,
            vfs: node.vfs().to_vec(),
            cpus: node.cpus.clone(),
        }
    }

    /// Check the document and build the node. Errors name the field (`links[3]`, `nicLinks[0].nic`).
    pub fn into_node(self) -> Result<NodeTopology, TopologyError> {
        if self.api_version != API_VERSION {
            return Err(TopologyError::Invalid(format!(
                "apiVersion is '{}'; this build reads '{API_VERSION}'",
                self.api_version
            )));
        }
        if self.kind != KIND {
            return Err(TopologyError::Invalid(format!("kind is '{}'; expected '{KIND}'", self.kind)));
        }
        let n = self.gpus.len();
        let mut links = vec![PairLink::default(); n * n];
        let mut seen = vec![false; n * n];
        for (i, e) in self.links.iter().enumerate() {
            let [a, b] = e.gpus;
            let (a, b) = (a as usize, b as usize);
            if a >= n || b >= n {
                return Err(TopologyError::Invalid(format!(
                    "links[{i}]: GPU{} is not among the {n} GPUs",
                    if a >= n { a } else { b }
                )));
            }
            if a == b {
                return Err(TopologyError::Invalid(format!("links[{i}]: a GPU cannot link to itself (GPU{a})")));
            }
            if seen[a * n + b] {
                return Err(TopologyError::Invalid(format!("links[{i}]: pair GPU{a}-GPU{b} listed twice")));
            }
            if e.pcie.is_none() && e.nvlinks == 0 {
                return Err(TopologyError::Invalid(format!(
                    "links[{i}]: pair GPU{a}-GPU{b} has neither a PCIe relation nor NVLinks"
                )));
            }
            seen[a * n + b] = true;
            seen[b * n + a] = true;
            let l = PairLink { pcie: e.pcie, nvlinks: e.nvlinks };
            links[a * n + b] = l;
            links[b * n + a] = l;
        }
        for a in 0..n {
            for b in (a + 1)..n {
                if !seen[a * n + b] {
                    return Err(TopologyError::Invalid(format!(
                        "links: pair GPU{a}-GPU{b} is missing; list every GPU pair once"
                    )));
                }
            }
        }
        let m = self.nics.len();
        for (k, nic) in self.nics.iter().enumerate() {
            if self.nics[..k].iter().any(|x| x.name == nic.name) {
                return Err(TopologyError::Invalid(format!(
                    "nics[{k}].name: '{}' is listed twice; NIC names must be unique",
                    nic.name
                )));
            }
        }
        let mut nic_links = vec![None; n * m];
        for (i, e) in self.nic_links.iter().enumerate() {
            let k = self
                .nics
                .iter()
                .position(|x| x.name == e.nic)
                .ok_or_else(|| TopologyError::Invalid(format!("nicLinks[{i}].nic: '{}' is not in nics", e.nic)))?;
            if e.gpu as usize >= n {
                return Err(TopologyError::Invalid(format!(
                    "nicLinks[{i}].gpu: GPU{} is not among the {n} GPUs",
                    e.gpu
                )));
            }
            nic_links[e.gpu as usize * m + k] = Some(e.pcie);
        }
        let mut node = NodeTopology::new(self.name, self.gpus, self.nics, links, nic_links)?;
        node.set_vfs(self.vfs)?;
        node.nvlink_generation = self.nvlink_generation.or(node.nvlink_generation);
        node.pcie_generation = self.pcie_generation.map(PcieGeneration).or(node.pcie_generation);
        node.inter_socket_gbps = self.inter_socket_gbps;
        node.cpus = self.cpus;
        node.check_values()?;
        Ok(node)
    }
}

/// The forms a node description can come in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// `nvidia-smi topo -m` text.
    SmiText,
    /// Inventory JSON.
    Json,
    /// Inventory YAML.
    Yaml,
}

/// Tell the form of a node description from its text: JSON starts with `{`, YAML has an
/// `apiVersion:` key, anything else is read as `topo -m` text.
pub fn detect_format(text: &str) -> SourceFormat {
    let first = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).unwrap_or("");
    if first.starts_with('{') {
        SourceFormat::Json
    } else if text.lines().any(|l| l.starts_with("apiVersion:") || l.starts_with("kind:") || l == "---") {
        SourceFormat::Yaml
    } else {
        SourceFormat::SmiText
    }
}

/// Read a node from any supported form, detected from the text. `source_name` names the input in errors.
pub fn parse_node(text: &str, source_name: &str) -> Result<NodeTopology, TopologyError> {
    match detect_format(text) {
        SourceFormat::SmiText => parse_topo_matrix(text, source_name),
        SourceFormat::Json => {
            let inv: Inventory = serde_json::from_str(text).map_err(|e| json_error(&e, source_name))?;
            inv.into_node().map_err(|e| in_source(e, source_name))
        }
        SourceFormat::Yaml => {
            let inv: Inventory = serde_saphyr::from_str_with_options(text, yaml_options(text)).map_err(|e| {
                let (line, column) = yaml_location(&e);
                let message = serde_saphyr::DefaultMessageFormatter.format_message(e.without_snippet()).into_owned();
                TopologyError::Parse { source_name: source_name.to_string(), line, column, message }
            })?;
            inv.into_node().map_err(|e| in_source(e, source_name))
        }
    }
}

/// A JSON error at its place, the message without serde_json's own position suffix (the place is
/// already in front of it).
pub(crate) fn json_error(e: &serde_json::Error, source_name: &str) -> TopologyError {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = text.strip_suffix(&suffix).unwrap_or(&text).to_string();
    TopologyError::Parse { source_name: source_name.to_string(), line: e.line(), column: e.column(), message }
}

/// YAML parser limits that grow with the text: a document is already in memory, so its size is
/// the bound, and whatever weft writes (a node of any size) reads back. The limits that stop
/// alias and nesting bombs stay at serde-saphyr's defaults.
fn yaml_options(text: &str) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = budget.max_events.max(text.len());
    budget.max_nodes = budget.max_nodes.max(text.len());
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

fn in_source(e: TopologyError, source_name: &str) -> TopologyError {
    match e {
        TopologyError::Invalid(m) => TopologyError::Invalid(format!("{source_name}: {m}")),
        other => other,
    }
}

fn yaml_location(e: &serde_saphyr::Error) -> (usize, usize) {
    e.location().map_or((0, 0), |l| (l.line() as usize, l.column() as usize))
}

/// Read a node from a file in any supported form.
pub fn read_node_file(path: &std::path::Path) -> Result<NodeTopology, TopologyError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| TopologyError::Io { path: path.display().to_string(), source })?;
    let mut node = parse_node(&text, &path.display().to_string())?;
    if node.name.is_none() {
        node.name = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    }
    Ok(node)
}

/// Compact JSON of a node's inventory, as stored in the `weft.io/gpu-topology` node annotation.
pub fn to_json(node: &NodeTopology) -> String {
    // Serialising plain structs of strings and numbers cannot fail.
    serde_json::to_string(&Inventory::from_node(node)).unwrap_or_default()
}

/// Pretty JSON of a node's inventory.
pub fn to_json_pretty(node: &NodeTopology) -> String {
    serde_json::to_string_pretty(&Inventory::from_node(node)).unwrap_or_default()
}

/// YAML of a node's inventory.
pub fn to_yaml(node: &NodeTopology) -> Result<String, TopologyError> {
    serde_saphyr::to_string(&Inventory::from_node(node)).map_err(|e| TopologyError::Invalid(e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use crate::model::uniform_node;

    fn sample() -> NodeTopology {
        let mut node = uniform_node("n1", 3, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 });
        node.set_link(0, 1, PairLink { pcie: Some(PcieRelation::Phb), nvlinks: 2 });
        node.infer_generations();
        node
    }

    #[test]
    fn json_and_yaml_round_trip_keep_both_relations() {
        let node = sample();
        let json = to_json(&node);
        let back = parse_node(&json, "j").unwrap();
        assert_eq!(back.link(0, 1), PairLink { pcie: Some(PcieRelation::Phb), nvlinks: 2 });
        assert_eq!(back, node);
        let yaml = to_yaml(&node).unwrap();
        assert_eq!(detect_format(&yaml), SourceFormat::Yaml, "{yaml}");
        assert_eq!(parse_node(&yaml, "y").unwrap(), node);
    }

    /// Two GPUs, NIC `a` under GPU0's switch and NIC `b` on the other socket, two VFs on each.
    fn with_vfs() -> NodeTopology {
        let text = "\tGPU0\tGPU1\tNIC0\tNIC1\nGPU0\t X \tSYS\tPIX\tSYS\nGPU1\tSYS\t X \tSYS\tPXB\n\
                    NIC0\tPIX\tSYS\t X \tSYS\nNIC1\tSYS\tPXB\tSYS\t X \n";
        let mut node = parse_node(text, "t").unwrap();
        let vf = |pci: &str, nic: &str, physnet: Option<&str>| Vf {
            pci_address: pci.into(),
            nic: nic.into(),
            physnet: physnet.map(Into::into),
        };
        let (a, b) = (node.nics[0].name.clone(), node.nics[1].name.clone());
        node.set_vfs(vec![
            vf("0000:0c:00.2", &a, Some("fabric")),
            vf("0000:0c:00.3", &a, Some("fabric")),
            vf("0000:8c:00.2", &b, Some("fabric")),
            vf("0000:8c:00.3", &b, None),
        ])
        .unwrap();
        node
    }

    #[test]
    fn vfs_round_trip_and_take_their_nics_relations() {
        let node = with_vfs();
        assert_eq!(node.vf_nearest(0, &[0]), Some(PcieRelation::Pix));
        assert_eq!(node.vf_nearest(2, &[0]), Some(PcieRelation::Sys));
        assert_eq!(node.vf_nearest(2, &[0, 1]), Some(PcieRelation::Pxb), "the nearest of the GPUs");
        assert_eq!(node.vf_nearest(0, &[]), None);
        let json = to_json(&node);
        assert!(json.contains(r#""pciAddress":"0000:0c:00.2""#), "{json}");
        assert_eq!(parse_node(&json, "j").unwrap(), node);
        assert_eq!(parse_node(&to_yaml(&node).unwrap(), "y").unwrap(), node);
        // A node without VFs writes no `vfs` key, so annotations of older agents stay equal.
        assert!(!to_json(&sample()).contains("vfs"));
    }

    #[test]
    fn bad_vfs_are_named() {
        let node = with_vfs();
        let mut inv = Inventory::from_node(&node);
        inv.vfs[1].nic = "mlx5_9".into();
        let e = inv.into_node().unwrap_err().to_string();
        assert!(e.contains("vfs[1].nic") && e.contains("mlx5_9"), "{e}");
        let mut inv = Inventory::from_node(&node);
        inv.vfs[3].pci_address = "0000:0c:00.2".into();
        let e = inv.into_node().unwrap_err().to_string();
        assert!(e.contains("vfs[3].pciAddress") && e.contains("twice"), "{e}");
        let mut inv = Inventory::from_node(&node);
        inv.vfs[0].physnet = Some(String::new());
        assert!(inv.into_node().unwrap_err().to_string().contains("vfs[0].physnet"));
    }

    #[test]
    fn missing_pair_and_wrong_version_are_named() {
        let mut inv = Inventory::from_node(&sample());
        inv.links.pop();
        let e = inv.into_node().unwrap_err().to_string();
        assert!(e.contains("GPU1-GPU2") && e.contains("missing"), "{e}");
        let mut inv = Inventory::from_node(&sample());
        inv.api_version = "weft.io/v9".into();
        assert!(inv.into_node().unwrap_err().to_string().contains("weft.io/v9"));
    }

    #[test]
    fn json_syntax_error_has_a_line_said_once() {
        let e = parse_node("{\n  \"apiVersion\": 3,\n}", "bad.json").unwrap_err().to_string();
        assert!(e.starts_with("bad.json:2:17: "), "{e}");
        assert!(!e.contains("at line"), "the position is said once: {e}");
    }

    #[test]
    fn yaml_error_has_a_line_said_once_and_no_snippet() {
        let text = "apiVersion: weft.io/v1alpha1\nkind: NodeTopology\ngpus: [{index: x}]\n";
        let e = parse_node(text, "bad.yaml").unwrap_err().to_string();
        assert!(e.starts_with("bad.yaml:3:16: "), "{e}");
        assert!(!e.contains("line 3") && !e.contains('\n'), "the position is said once: {e}");
    }

    #[test]
    fn what_weft_writes_reads_back_at_any_size() {
        let node = uniform_node("big", 400, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 });
        let yaml = to_yaml(&node).unwrap();
        // Over serde-saphyr's default node budget: this is the case that did not read back.
        assert!(serde_saphyr::from_str::<Inventory>(&yaml).is_err());
        assert_eq!(parse_node(&yaml, "big.yaml").unwrap(), node);
        assert_eq!(parse_node(&to_json(&node), "big.json").unwrap(), node);
    }

    #[test]
    fn values_out_of_range_are_refused_naming_the_field() {
        let json = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value = serde_json::from_str(&to_json(&sample())).unwrap();
            edit(&mut v);
            parse_node(&v.to_string(), "n.json").map(|_| ()).unwrap_err().to_string()
        };
        let e = json(&|v| v["pcieGeneration"] = 200.into());
        assert!(e.contains("pcieGeneration") && e.contains("200"), "{e}");
        let e = json(&|v| v["interSocketGbps"] = (-5.0).into());
        assert!(e.contains("interSocketGbps") && e.contains("-5"), "{e}");
        let e = json(&|v| v["interSocketGbps"] = 1e300.into());
        assert!(e.contains("interSocketGbps"), "{e}");
        let e = json(&|v| v["gpus"][1]["numaNode"] = 99_999_999.into());
        assert!(e.contains("gpus[1].numaNode") && e.contains("99999999"), "{e}");
        let e = json(&|v| v["cpus"]["numaNodes"] = serde_json::json!([{"id": 5000, "cpus": "0-3"}]));
        assert!(e.contains("cpus.numaNodes[0].id"), "{e}");
    }

    #[test]
    fn unknown_field_is_rejected() {
        let mut v: serde_json::Value = serde_json::from_str(&to_json(&sample())).unwrap();
        v["gpuz"] = serde_json::json!([]);
        let e = parse_node(&v.to_string(), "x").unwrap_err().to_string();
        assert!(e.contains("gpuz"), "{e}");
    }
}
