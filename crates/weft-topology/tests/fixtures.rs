//! Every `nvidia-smi topo -m` dump in `shared/fixtures/topology` parsed and checked against facts read
//! off the dumps by hand; the variants real copies come in (space-expanded, `SOC`, stripped trailing
//! cells, truncated NIC legend, an NV18 H100 system); corrupted copies; random text and mutations; and
//! round trips through the inventory (JSON, YAML) and the `topo -m`-style table renderer.

use std::path::PathBuf;

use proptest::prelude::*;
use weft_topology::inventory::{to_json, to_yaml};
use weft_topology::model::pair_label;
use weft_topology::render::{to_dot, to_svg, to_table};
use weft_topology::{NodeTopology, NvlinkGeneration, PcieRelation, parse_node, parse_topo_matrix};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures/topology");

/// `(file name, text)` of every fixture; fails when the directory holds none.
fn fixtures() -> Vec<(String, String)> {
    let dir = PathBuf::from(FIXTURES);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut out: Vec<(String, String)> = entries
        .map(|e| e.expect("directory entry"))
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "README.md")
        .map(|name| {
            let text = std::fs::read_to_string(dir.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, text)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no topology fixtures found in {}", dir.display());
    out
}

fn fixture(name: &str) -> String {
    fixtures().into_iter().find(|(n, _)| n == name).map(|(_, t)| t).unwrap_or_else(|| panic!("fixture {name} missing"))
}

fn parse(text: &str, name: &str) -> NodeTopology {
    parse_topo_matrix(text, name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Facts read off one dump by hand.
struct Facts {
    file: &'static str,
    gpus: usize,
    /// NIC names in column order (legend names where the legend gives one).
    nics: &'static [&'static str],
    /// `(a, b, cell)`: the cell printed for GPU a / GPU b.
    pairs: &'static [(usize, usize, &'static str)],
    /// `(gpu, nic name, cell)`.
    gpu_nic: &'static [(usize, &'static str, &'static str)],
    /// `(gpu, NUMA node)`.
    numa: &'static [(usize, Option<u32>)],
    /// `(gpu, CPU affinity)`.
    affinity: &'static [(usize, &'static str)],
    /// NUMA node ids the GPU rows mention.
    numa_nodes: &'static [u32],
    /// NVLink generation inferred from the largest `NV#`.
    generation: Option<NvlinkGeneration>,
}

const FACTS: &[Facts] = &[
    Facts {
        // [A] DGX-1 V100 hybrid cube-mesh; NIC columns in PCI order mlx5_0, mlx5_2, mlx5_1, mlx5_3.
        file: "dgx1-v100-mlx5-columns.txt",
        gpus: 8,
        nics: &["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"],
        pairs: &[
            (0, 1, "NV1"),
            (0, 3, "NV2"),
            (0, 4, "NV2"),
            (0, 5, "SYS"),
            (1, 5, "NV2"),
            (3, 7, "NV1"),
            (6, 7, "NV2"),
        ],
        gpu_nic: &[
            (0, "mlx5_0", "PIX"),
            (0, "mlx5_1", "PHB"),
            (0, "mlx5_2", "SYS"),
            (4, "mlx5_2", "PIX"),
            (7, "mlx5_3", "PIX"),
        ],
        numa: &[(0, None), (7, None)],
        affinity: &[(0, "0-19,40-59"), (4, "20-39,60-79")],
        numa_nodes: &[],
        generation: Some(NvlinkGeneration::Nvlink2),
    },
    Facts {
        // [B] 8x V100-SXM2, modern format: one NIC (NIC0 = mlx5_2), NUMA Affinity, GPU NUMA ID.
        file: "v100-sxm2-nic-legend.txt",
        gpus: 8,
        nics: &["mlx5_2"],
        pairs: &[(0, 3, "NV2"), (0, 5, "SYS"), (1, 5, "NV2"), (2, 6, "NV1"), (0, 7, "SYS")],
        gpu_nic: &[(0, "mlx5_2", "NODE"), (3, "mlx5_2", "NODE"), (4, "mlx5_2", "SYS")],
        numa: &[(0, Some(0)), (3, Some(0)), (4, Some(1)), (7, Some(1))],
        affinity: &[(0, "0-19,40-59"), (7, "20-39,60-79")],
        numa_nodes: &[0, 1],
        generation: Some(NvlinkGeneration::Nvlink2),
    },
    Facts {
        // [C] DGX A100: NVSwitch (NV12 everywhere), 10 NIC columns, all 10 named in this dump's legend.
        file: "dgx-a100-nvswitch-10nic.txt",
        gpus: 8,
        nics: &["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"],
        pairs: &[(0, 1, "NV12"), (0, 7, "NV12"), (3, 4, "NV12"), (6, 7, "NV12")],
        gpu_nic: &[
            (0, "mlx5_0", "PXB"),
            (1, "mlx5_1", "PXB"),
            (0, "mlx5_2", "SYS"),
            (2, "mlx5_3", "PXB"),
            (5, "mlx5_4", "PXB"),
            (6, "mlx5_7", "PXB"),
            (0, "mlx5_8", "SYS"),
            (7, "mlx5_9", "SYS"),
        ],
        numa: &[(0, Some(3)), (2, Some(1)), (4, Some(7)), (6, Some(5))],
        affinity: &[(0, "48-63,176-191"), (4, "112-127,240-255")],
        numa_nodes: &[1, 3, 5, 7],
        generation: Some(NvlinkGeneration::Nvlink3),
    },
    Facts {
        // [D] 8x A100 NVSwitch, 4 NICs, NIC rows without trailing cells, GPU NUMA ID N/A.
        file: "a100-nvswitch-4nic-gpu-numa-id.txt",
        gpus: 8,
        nics: &["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"],
        pairs: &[(0, 1, "NV12"), (2, 5, "NV12"), (0, 7, "NV12")],
        gpu_nic: &[
            (0, "mlx5_0", "PXB"),
            (0, "mlx5_2", "SYS"),
            (3, "mlx5_3", "PXB"),
            (4, "mlx5_0", "SYS"),
            (7, "mlx5_3", "SYS"),
        ],
        numa: &[(0, Some(0)), (3, Some(0)), (4, Some(1))],
        affinity: &[(0, "0-31,64-95"), (5, "32-63,96-127")],
        numa_nodes: &[0, 1],
        generation: Some(NvlinkGeneration::Nvlink3),
    },
    Facts {
        // [F] 8x A100 PCIe joined in pairs by NVLink bridges (0-2, 1-3, 4-5, 6-7), no NICs.
        file: "a100-pcie-nvlink-bridges.txt",
        gpus: 8,
        nics: &[],
        pairs: &[
            (0, 2, "NV12"),
            (1, 3, "NV12"),
            (4, 5, "NV12"),
            (6, 7, "NV12"),
            (0, 1, "SYS"),
            (2, 3, "SYS"),
            (0, 4, "SYS"),
        ],
        gpu_nic: &[],
        numa: &[(0, Some(0)), (3, Some(0)), (4, Some(1)), (7, Some(1))],
        affinity: &[(0, "0-31"), (6, "32-63")],
        numa_nodes: &[0, 1],
        generation: Some(NvlinkGeneration::Nvlink3),
    },
    Facts {
        // [G] 4x A100 PCIe, 2 NICs as mlx5 columns, NIC rows without affinity cells.
        file: "a100-pcie-4gpu-mlx5.txt",
        gpus: 4,
        nics: &["mlx5_0", "mlx5_1"],
        pairs: &[(0, 1, "NV12"), (2, 3, "NODE"), (0, 2, "SYS"), (1, 3, "SYS")],
        gpu_nic: &[(0, "mlx5_0", "NODE"), (1, "mlx5_1", "NODE"), (2, "mlx5_0", "SYS"), (3, "mlx5_1", "SYS")],
        numa: &[(0, Some(0)), (2, Some(1))],
        affinity: &[(1, "0-27,56-83"), (3, "28-55,84-111")],
        numa_nodes: &[0, 1],
        generation: Some(NvlinkGeneration::Nvlink3),
    },
];

/// Check `node` against `facts`, naming the fixture and fact on failure.
fn check_facts(node: &NodeTopology, f: &Facts, what: &str) {
    let file = f.file;
    assert_eq!(node.gpu_count(), f.gpus, "{file} ({what}): GPU count");
    let names: Vec<&str> = node.nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, f.nics, "{file} ({what}): NIC names");
    for &(a, b, cell) in f.pairs {
        assert_eq!(pair_label(node.link(a, b)), cell, "{file} ({what}): GPU{a}-GPU{b}");
        assert_eq!(node.link(a, b), node.link(b, a), "{file} ({what}): GPU{a}-GPU{b} symmetric");
    }
    for &(g, nic, cell) in f.gpu_nic {
        let k = node.nics.iter().position(|n| n.name == nic).unwrap_or_else(|| panic!("{file}: no NIC {nic}"));
        assert_eq!(node.nic_link(g, k).map(PcieRelation::token), Some(cell), "{file} ({what}): GPU{g}-{nic}");
    }
    for &(g, numa) in f.numa {
        assert_eq!(node.gpus[g].numa_node, numa, "{file} ({what}): NUMA node of GPU{g}");
    }
    for &(g, cpus) in f.affinity {
        let got = node.gpus[g].cpu_affinity.as_ref().map(ToString::to_string);
        assert_eq!(got.as_deref(), Some(cpus), "{file} ({what}): CPU affinity of GPU{g}");
    }
    let ids: Vec<u32> = node.cpus.numa_nodes.iter().map(|n| n.id).collect();
    assert_eq!(ids, f.numa_nodes, "{file} ({what}): NUMA nodes");
    assert_eq!(node.nvlink_generation, f.generation, "{file} ({what}): NVLink generation");
}

fn facts_for(name: &str) -> &'static Facts {
    FACTS.iter().find(|f| f.file == name).unwrap_or_else(|| {
        panic!("fixture {name} has no hand-checked facts in tests/fixtures.rs; add an entry to FACTS")
    })
}

#[test]
fn every_fixture_parses_to_its_hand_checked_facts() {
    let all = fixtures();
    for (name, text) in &all {
        check_facts(&parse(text, name), facts_for(name), "as dumped");
        // parse_node detects the format.
        assert_eq!(parse_node(text, name).expect("parse_node"), parse(text, name), "{name}: parse_node");
    }
    for f in FACTS {
        assert!(all.iter().any(|(n, _)| n == f.file), "facts for {} but no such fixture", f.file);
    }
}

/// Expand tabs to the next multiple of 8 columns, as `expand(1)` and pasting into an issue do.
fn expand_tabs(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for line in text.split_inclusive('\n') {
        let mut col = 0;
        for c in line.chars() {
            if c == '\t' {
                let next = (col / 8 + 1) * 8;
                out.extend(std::iter::repeat_n(' ', next - col));
                col = next;
            } else {
                out.push(c);
                col += 1;
            }
        }
    }
    out
}

#[test]
fn space_expanded_copies_parse_to_the_same_model() {
    for (name, text) in fixtures() {
        let original = parse(&text, &name);
        for (how, copy) in [("tab stops", expand_tabs(&text)), ("four spaces", text.replace('\t', "    "))] {
            assert!(!copy.contains('\t'));
            assert_eq!(parse(&copy, &name), original, "{name}: {how}");
        }
    }
}

#[test]
fn soc_instead_of_sys_parses_the_same() {
    for (name, text) in fixtures() {
        let soc = text.replace("\tSYS", "\tSOC");
        assert_ne!(soc, text, "{name}: has SYS cells");
        assert_eq!(parse(&soc, &name), parse(&text, &name), "{name}");
        let spaced = expand_tabs(&soc);
        assert_eq!(parse(&spaced, &name), parse(&text, &name), "{name}: SOC, space-expanded");
    }
}

#[test]
fn stripped_trailing_cells_parse_the_same() {
    for (name, text) in fixtures() {
        let stripped: String = text.lines().map(|l| format!("{}\n", l.trim_end_matches(['\t', ' ']))).collect();
        assert_eq!(parse(&stripped, &name), parse(&text, &name), "{name}");
    }
}

#[test]
fn nic_columns_without_legend_entries_keep_their_nic_names() {
    // Cut the DGX A100 legend to 8 entries, as some dumps print it: NIC8/NIC9 stay as named in the header.
    let text = fixture("dgx-a100-nvswitch-10nic.txt");
    let cut: String =
        text.lines().filter(|l| !l.contains("NIC8: ") && !l.contains("NIC9: ")).map(|l| format!("{l}\n")).collect();
    let node = parse(&cut, "cut");
    assert_eq!(node.nics.len(), 10);
    assert_eq!(node.nics[7].name, "mlx5_7");
    assert_eq!(node.nics[7].rdma_device.as_deref(), Some("mlx5_7"));
    assert_eq!(node.nics[8].name, "NIC8");
    assert_eq!(node.nics[9].name, "NIC9");
    assert_eq!(node.nics[8].rdma_device, None);
    assert_eq!(node.nic_link(0, 8), Some(PcieRelation::Sys));
}

/// An HGX H100 as recent drivers print it: NV18 between every pair, 8 NICs (NIC0..NIC7 + legend), one
/// PIX NIC per GPU, NODE within a socket, SYS across, `NUMA Affinity` and `GPU NUMA ID` columns with the
/// extra empty cell before the latter, NIC rows with four empty trailing cells.
fn h100_dump() -> String {
    let mut s = String::from("\t");
    for i in 0..8 {
        s.push_str(&format!("GPU{i}\t"));
    }
    for k in 0..8 {
        s.push_str(&format!("NIC{k}\t"));
    }
    s.push_str("CPU Affinity\tNUMA Affinity\tGPU NUMA ID\n");
    let pcie = |a: usize, b: usize| {
        if a == b {
            "PIX"
        } else if a / 4 == b / 4 {
            "NODE"
        } else {
            "SYS"
        }
    };
    for g in 0..8 {
        s.push_str(&format!("GPU{g}"));
        for b in 0..8 {
            s.push_str(if g == b { "\t X " } else { "\tNV18" });
        }
        for k in 0..8 {
            s.push_str(&format!("\t{}", pcie(g, k)));
        }
        let (cpus, numa) = if g < 4 { ("0-55,112-167", 0) } else { ("56-111,168-223", 1) };
        s.push_str(&format!("\t{cpus}\t{numa}\t\tN/A\n"));
    }
    for k in 0..8 {
        s.push_str(&format!("NIC{k}"));
        for g in 0..8 {
            s.push_str(&format!("\t{}", pcie(g, k)));
        }
        for j in 0..8 {
            s.push_str(if j == k {
                "\t X "
            } else if j / 4 == k / 4 {
                "\tNODE"
            } else {
                "\tSYS"
            });
        }
        s.push_str("\t\t\t\t\n");
    }
    s.push_str("\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n");
    s.push_str("  NV#  = Connection traversing a bonded set of # NVLinks\n\nNIC Legend:\n\n");
    for k in 0..8 {
        s.push_str(&format!("  NIC{k}: mlx5_{k}\n"));
    }
    s
}

#[test]
fn synthetic_h100_nv18_dump_with_eight_nics() {
    let text = h100_dump();
    let node = parse(&text, "h100");
    assert_eq!(node.gpu_count(), 8);
    let names: Vec<&str> = node.nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]);
    for a in 0..8 {
        for b in 0..8 {
            if a != b {
                assert_eq!(pair_label(node.link(a, b)), "NV18", "GPU{a}-GPU{b}");
            }
        }
    }
    assert_eq!(node.nic_link(3, 3), Some(PcieRelation::Pix));
    assert_eq!(node.nic_link(3, 0), Some(PcieRelation::Node));
    assert_eq!(node.nic_link(3, 5), Some(PcieRelation::Sys));
    assert_eq!(node.gpus[5].numa_node, Some(1));
    assert_eq!(node.gpus[5].cpu_affinity.as_ref().map(ToString::to_string).as_deref(), Some("56-111,168-223"));
    assert_eq!(node.nvlink_generation, Some(NvlinkGeneration::Nvlink4));
    assert_eq!(parse(&expand_tabs(&text), "h100 spaced"), node);
    assert_eq!(parse(&text.replace("\tSYS", "\tSOC"), "h100 soc"), node);
}

/// 1-based character column of `needle` in line `line_no` (1-based) of `text`.
fn column_of(text: &str, line_no: usize, needle: &str) -> usize {
    let line = text.lines().nth(line_no - 1).expect("line exists");
    line[..line.find(needle).expect("needle in line")].chars().count() + 1
}

fn parse_err(text: &str) -> String {
    match parse_topo_matrix(text, "f.txt") {
        Ok(_) => panic!("corrupted copy parsed:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// Replace the first `from` in line `line_no` (1-based).
fn edit_line(text: &str, line_no: usize, from: &str, to: &str) -> String {
    text.lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == line_no { format!("{}\n", l.replacen(from, to, 1)) } else { format!("{l}\n") })
        .collect()
}

#[test]
fn a_lost_tab_gives_an_unknown_token_at_its_line_and_column() {
    let text = fixture("a100-nvswitch-4nic-gpu-numa-id.txt");
    let bad = edit_line(&text, 2, "PXB\tPXB", "PXBNODE\tPXB");
    let col = column_of(&bad, 2, "PXBNODE");
    let e = parse_err(&bad);
    assert!(e.starts_with(&format!("f.txt:2:{col}:")), "{e}");
    assert!(e.contains("'PXBNODE'") && e.contains("row 'GPU0'") && e.contains("column 'NIC0'"), "{e}");
    // The same in a space-expanded copy.
    let spaced = expand_tabs(&bad);
    let col = column_of(&spaced, 2, "PXBNODE");
    let e = parse_err(&spaced);
    assert!(e.starts_with(&format!("f.txt:2:{col}:")), "{e}");
}

#[test]
fn a_deleted_cell_is_an_error_at_its_line_and_column() {
    // GPU row: the cells shift left and the self cell lands off the diagonal.
    let text = fixture("dgx1-v100-mlx5-columns.txt");
    let bad = edit_line(&text, 4, "GPU2\tNV1\tNV2", "GPU2\tNV1");
    let col = column_of(&bad, 4, "X");
    let e = parse_err(&bad);
    assert!(e.starts_with(&format!("f.txt:4:{col}:")) && e.contains("'X' off the diagonal"), "{e}");
    // NIC row without trailing cells: the row is short.
    let text = fixture("a100-nvswitch-4nic-gpu-numa-id.txt");
    let bad = edit_line(&text, 10, "NIC0\tPXB\t", "NIC0\t");
    let e = parse_err(&bad);
    assert!(e.starts_with("f.txt:10:") && e.contains("ragged row 'NIC0'"), "{e}");
}

#[test]
fn an_asymmetric_cell_names_both_lines() {
    let text = fixture("a100-pcie-nvlink-bridges.txt");
    let bad = edit_line(&text, 4, "GPU2\tNV12", "GPU2\tNV11");
    // Reported at GPU0's cell for GPU2 (line 2), naming GPU2's line.
    let line2 = bad.lines().nth(1).expect("line 2");
    let col = line2.split('\t').take(3).map(|c| c.chars().count() + 1).sum::<usize>() + 1;
    let e = parse_err(&bad);
    assert!(e.starts_with(&format!("f.txt:2:{col}:")), "{e}");
    assert!(e.contains("GPU0->GPU2 is NV12") && e.contains("(line 4) is NV11"), "{e}");
}

#[test]
fn duplicated_rows_are_errors_at_the_duplicate() {
    let text = fixture("v100-sxm2-nic-legend.txt");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(5, lines[4]);
    let bad = lines.join("\n");
    let e = parse_err(&bad);
    assert!(e.starts_with("f.txt:6:1:") && e.contains("row 'GPU3' out of order; expected 'GPU4'"), "{e}");

    let text = fixture("dgx-a100-nvswitch-10nic.txt");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(10, lines[9]);
    let e = parse_err(&lines.join("\n"));
    assert!(e.starts_with("f.txt:11:1:") && e.contains("NIC row 'NIC0' appears twice"), "{e}");
}

#[test]
fn inventory_round_trip_keeps_every_fixture() {
    for (name, text) in fixtures() {
        let node = parse(&text, &name);
        let json = to_json(&node);
        assert_eq!(parse_node(&json, "json").unwrap_or_else(|e| panic!("{name}: {e}\n{json}")), node, "{name}: JSON");
        let yaml = to_yaml(&node).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(parse_node(&yaml, "yaml").unwrap_or_else(|e| panic!("{name}: {e}\n{yaml}")), node, "{name}: YAML");
    }
}

#[test]
fn table_reparses_to_the_same_relations() {
    let mut all = fixtures();
    all.push(("h100".into(), h100_dump()));
    for (name, text) in all {
        let node = parse(&text, &name);
        let table = to_table(&node);
        let back = parse_topo_matrix(&table, "table").unwrap_or_else(|e| panic!("{name}: {e}\n{table}"));
        assert_eq!(back.links(), node.links(), "{name}: GPU pairs\n{table}");
        for g in 0..node.gpu_count() {
            for k in 0..node.nics.len() {
                assert_eq!(back.nic_link(g, k), node.nic_link(g, k), "{name}: GPU{g}-NIC{k}");
            }
            assert_eq!(back.gpus[g], node.gpus[g], "{name}: GPU{g} affinity");
        }
        let names = |n: &NodeTopology| n.nics.iter().map(|x| x.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&back), names(&node), "{name}: NIC names via the legend");
        assert_eq!(back.cpus, node.cpus, "{name}: NUMA nodes");
    }
}

/// What an SVG document holds, read back with the `svg` crate's parser; panics unless the document is
/// well formed (balanced tags, one `<svg xmlns=…>` root, only the XML entities in text and attributes).
struct SvgSummary {
    texts: Vec<String>,
    title: String,
    classes: Vec<String>,
}

fn read_svg(doc: &str) -> SvgSummary {
    use svg::node::element::tag::Type;
    use svg::parser::Event;
    let mut stack: Vec<String> = Vec::new();
    let mut roots = 0;
    let mut texts = Vec::new();
    let mut classes = Vec::new();
    let mut title = String::new();
    for event in svg::read(doc).expect("svg::read") {
        match event {
            Event::Error(e) => panic!("SVG does not parse: {e}\n{doc}"),
            Event::Tag(name, kind, attrs) => {
                if stack.is_empty() && kind != Type::End {
                    roots += 1;
                    assert_eq!(name, "svg", "root element");
                    assert_eq!(
                        attrs.get("xmlns").map(ToString::to_string).as_deref(),
                        Some("http://www.w3.org/2000/svg"),
                        "SVG namespace"
                    );
                }
                for v in attrs.values() {
                    assert!(!v.to_string().contains('<'), "'<' in an attribute of <{name}>");
                }
                if let Some(c) = attrs.get("class") {
                    classes.push(c.to_string());
                }
                match kind {
                    Type::Start => stack.push(name.to_string()),
                    Type::End => assert_eq!(stack.pop().as_deref(), Some(name), "unbalanced </{name}>"),
                    Type::Empty => {}
                }
            }
            Event::Text(t) => {
                let t = t.trim().to_string();
                if stack.last().map(String::as_str) == Some("title") {
                    title = t.clone();
                }
                texts.push(t);
            }
            _ => {}
        }
    }
    assert!(stack.is_empty(), "unclosed tags {stack:?}");
    assert_eq!(roots, 1, "one root element");
    let mut rest = doc;
    while let Some(i) = rest.find('&') {
        rest = &rest[i..];
        assert!(
            ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| rest.starts_with(e)),
            "bare '&' in the SVG: {}",
            &rest[..rest.len().min(20)]
        );
        rest = &rest[1..];
    }
    SvgSummary { texts, title, classes }
}

#[test]
fn pictures_of_every_fixture_name_every_gpu_and_nvlink() {
    let mut all = fixtures();
    all.push(("h100".into(), h100_dump()));
    for (name, text) in all {
        let node = parse(&text, &name);
        let nv_pairs = (0..node.gpu_count())
            .flat_map(|a| (a + 1..node.gpu_count()).map(move |b| (a, b)))
            .filter(|&(a, b)| node.link(a, b).nvlinks > 0)
            .count();

        let dot = to_dot(&node);
        assert!(dot.starts_with("graph \"node\" {") && dot.trim_end().ends_with('}'), "{name}: DOT frame");
        for i in 0..node.gpu_count() {
            assert!(dot.contains(&format!("gpu{i} [label=\"GPU{i}")), "{name}: DOT node GPU{i}");
        }
        assert_eq!(dot.matches(", penwidth=").count(), nv_pairs, "{name}: DOT NVLink edges");
        for nic in &node.nics {
            assert!(dot.contains(&format!("[shape=box, label=\"{}\"]", nic.name)), "{name}: DOT NIC {}", nic.name);
        }

        let svg = read_svg(&to_svg(&node));
        for i in 0..node.gpu_count() {
            assert!(svg.texts.contains(&format!("GPU{i}")), "{name}: SVG label GPU{i}");
        }
        for nic in &node.nics {
            assert!(svg.texts.contains(&nic.name), "{name}: SVG NIC {}", nic.name);
        }
        let count = |c: &str| svg.classes.iter().filter(|x| *x == c).count();
        assert_eq!(count("nvlink"), nv_pairs, "{name}: SVG NVLink edges");
        assert_eq!(count("gpu"), node.gpu_count(), "{name}: SVG GPUs");
        assert_eq!(count("nic"), node.nics.len(), "{name}: SVG NICs");
        assert!(svg.texts.iter().any(|t| t == "Legend"), "{name}: SVG legend");
        assert!(svg.title.starts_with("node: "), "{name}: SVG title {}", svg.title);
        if nv_pairs > 0 {
            let max = node.max_nvlinks();
            assert!(svg.texts.contains(&format!("NV{max}")), "{name}: SVG NV{max} label");
        }
    }
}

#[test]
fn pictures_escape_names() {
    let mut node = parse(&fixture("a100-pcie-4gpu-mlx5.txt"), "g");
    node.name = Some("rack <7> & \"bay\" \\ 2".into());
    node.nics[0].name = "nic<&>\"0\"".into();
    let svg = read_svg(&to_svg(&node));
    assert!(svg.title.starts_with("rack &lt;7&gt; &amp; \"bay\""), "{}", svg.title);
    assert!(svg.texts.iter().any(|t| t == "nic&lt;&amp;&gt;\"0\""), "{:?}", svg.texts);
    let dot = to_dot(&node);
    assert!(dot.starts_with("graph \"rack <7> & \\\"bay\\\" \\\\ 2\" {"), "{dot}");
    assert!(dot.contains("label=\"nic<&>\\\"0\\\"\""), "{dot}");
}

#[test]
fn pictures_of_an_empty_node_are_valid() {
    let node = NodeTopology::new(Some("empty".into()), vec![], vec![], vec![], vec![]).expect("empty node");
    let svg = read_svg(&to_svg(&node));
    assert_eq!(svg.title, "empty: 0 GPUs, 0 NICs");
    assert!(to_dot(&node).starts_with("graph \"empty\" {"));
    assert_eq!(to_table(&node), "empty: no GPUs and no NICs found\n");
}

const TOKENS: &[&str] = &[
    "\t", " ", "\n", "X", " X ", "NV12", "NV0", "NV19", "SYS", "SOC", "PIX", "PXBNODE", "GPU0", "NIC0", "N/A", "0-3",
    "", ":",
];

#[derive(Clone, Debug)]
enum Mutation {
    DeleteChar(prop::sample::Index),
    InsertToken(prop::sample::Index, prop::sample::Index),
    ReplaceCell(prop::sample::Index, prop::sample::Index),
    DuplicateLine(prop::sample::Index),
    DeleteLine(prop::sample::Index),
    SwapLines(prop::sample::Index, prop::sample::Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<prop::sample::Index>().prop_map(Mutation::DeleteChar),
        (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(|(a, b)| Mutation::InsertToken(a, b)),
        (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(|(a, b)| Mutation::ReplaceCell(a, b)),
        any::<prop::sample::Index>().prop_map(Mutation::DuplicateLine),
        any::<prop::sample::Index>().prop_map(Mutation::DeleteLine),
        (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
    ]
}

fn apply(text: &str, m: &Mutation) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    match m {
        Mutation::DeleteChar(i) if !chars.is_empty() => {
            let at = i.index(chars.len());
            chars[..at].iter().chain(&chars[at + 1..]).collect()
        }
        Mutation::InsertToken(i, t) => {
            let at = i.index(chars.len() + 1);
            let tok = TOKENS[t.index(TOKENS.len())];
            chars[..at].iter().collect::<String>() + tok + &chars[at..].iter().collect::<String>()
        }
        Mutation::ReplaceCell(i, t) => {
            let cells: Vec<&str> = text.split('\t').collect();
            let at = i.index(cells.len());
            let tok = TOKENS[t.index(TOKENS.len())];
            cells.iter().enumerate().map(|(j, c)| if j == at { tok } else { c }).collect::<Vec<_>>().join("\t")
        }
        Mutation::DuplicateLine(i) if !lines.is_empty() => {
            let at = i.index(lines.len());
            lines.insert(at, lines[at].clone());
            lines.join("\n")
        }
        Mutation::DeleteLine(i) if !lines.is_empty() => {
            lines.remove(i.index(lines.len()));
            lines.join("\n")
        }
        Mutation::SwapLines(a, b) if !lines.is_empty() => {
            let (a, b) = (a.index(lines.len()), b.index(lines.len()));
            lines.swap(a, b);
            lines.join("\n")
        }
        _ => text.to_string(),
    }
}

/// Whatever parses must be a valid node that survives the inventory round trip.
fn check_parsed(text: &str) {
    if let Ok(node) = parse_node(text, "fuzz") {
        let json = to_json(&node);
        match parse_node(&json, "json") {
            Ok(back) => assert_eq!(back, node, "JSON round trip of a parsed mutation\n{text}"),
            Err(e) => panic!("parsed, but its inventory does not read back: {e}\n{text}"),
        }
        let _ = to_table(&node);
        let _ = to_svg(&node);
        let _ = to_dot(&node);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        check_parsed(&text);
    }

    #[test]
    fn topo_like_text_never_panics(text in "[\tGPUNICXSYOPHBDV0-9 :/A\n-]{0,300}") {
        check_parsed(&text);
    }

    #[test]
    fn mutated_fixtures_never_panic(which in any::<prop::sample::Index>(), muts in prop::collection::vec(mutation(), 1..6)) {
        let all = fixtures();
        let (_, text) = &all[which.index(all.len())];
        let mut text = text.clone();
        for m in &muts {
            text = apply(&text, m);
        }
        check_parsed(&text);
    }
}

#[test]
fn two_nic_columns_with_one_name_are_rejected() {
    // Through the legend: reported at the second legend line.
    let text = fixture("a100-nvswitch-4nic-gpu-numa-id.txt").replace("NIC1: mlx5_1", "NIC1: mlx5_0");
    let line = text.lines().position(|l| l.contains("NIC1: mlx5_0")).expect("legend line") + 1;
    let e = parse_err(&text);
    assert!(e.starts_with(&format!("f.txt:{line}:1:")), "{e}");
    assert!(e.contains("'NIC0' and 'NIC1' both name 'mlx5_0'"), "{e}");
    // Through the header: reported at the second column.
    // (NIC rows are optional; drop them so the renamed column is the only change.)
    let text: String = fixture("a100-pcie-4gpu-mlx5.txt")
        .lines()
        .take(5)
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .replacen("mlx5_1", "mlx5_0", 1);
    assert!(
        parse_topo_matrix(&fixture("a100-pcie-4gpu-mlx5.txt").lines().take(5).collect::<Vec<_>>().join("\n"), "ok")
            .is_ok()
    );
    let col = column_of(&text, 1, "mlx5_0\tCPU");
    let e = parse_err(&text);
    assert!(e.starts_with(&format!("f.txt:1:{col}:")) && e.contains("both name 'mlx5_0'"), "{e}");
    // And in an inventory document.
    let node = parse(&fixture("a100-pcie-4gpu-mlx5.txt"), "g");
    let mut doc: serde_json::Value = serde_json::from_str(&to_json(&node)).expect("JSON");
    doc["nics"][1]["name"] = serde_json::json!("mlx5_0");
    let e = parse_node(&doc.to_string(), "inv.json").map(|_| ()).expect_err("duplicate NIC names");
    assert!(e.to_string().contains("nics[1].name: 'mlx5_0' is listed twice"), "{e}");
}
