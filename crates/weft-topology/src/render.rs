//! Renderers of a node: a `topo -m`-style text table ([`to_table`], the default output of
//! `weft topo show`), Graphviz DOT ([`to_dot`]) and a self-contained SVG picture ([`to_svg`]).
//!
//! All three are pure functions of the model and never fail.

use std::collections::BTreeMap;
use std::f64::consts::PI;
use std::fmt::Write as _;

use svg::Document;
use svg::node::element::{Circle, Group, Line, Rectangle, Text, Title};

use crate::model::{NodeTopology, NvlinkGeneration, PcieRelation};

/// Whether a GPU–NIC or GPU–GPU PCIe relation stays below the host bridge (`PIX`/`PXB`): the pairs
/// where GPUDirect P2P/RDMA pays off, drawn as dashed edges.
fn is_switch_local(rel: Option<PcieRelation>) -> bool {
    matches!(rel, Some(PcieRelation::Pix | PcieRelation::Pxb))
}

/// The cell `topo -m` prints for a GPU pair: `NV#` when NVLinked, else the PCIe token, `?` if unknown.
fn pair_cell(node: &NodeTopology, a: usize, b: usize) -> String {
    if a == b {
        return "X".to_string();
    }
    crate::model::pair_label(node.link(a, b))
}

/// A plain-text matrix in the layout of `nvidia-smi topo -m`: one row per GPU with its relation to every
/// GPU and NIC, then its CPU and NUMA affinity; NIC columns are `NIC0..` with a `NIC Legend:` block.
/// Columns are aligned with spaces.
///
/// For a node read from `topo -m` text, [`crate::smi::parse_topo_matrix`] reads this back to the same
/// GPU relations. Relations the model does not know print as `?` (which the parser rejects), and NIC
/// rows are left out (the model has no NIC–NIC relations).
pub fn to_table(node: &NodeTopology) -> String {
    let n = node.gpu_count();
    let m = node.nics.len();
    if n == 0 && m == 0 {
        return format!("{}: no GPUs and no NICs found\n", node.name.as_deref().unwrap_or("node"));
    }
    let mut header: Vec<String> = vec![String::new()];
    header.extend((0..n).map(|i| format!("GPU{i}")));
    header.extend((0..m).map(|k| format!("NIC{k}")));
    header.push("CPU Affinity".into());
    header.push("NUMA Affinity".into());
    let mut rows: Vec<Vec<String>> = vec![header];
    for g in 0..n {
        let mut row = vec![format!("GPU{g}")];
        row.extend((0..n).map(|b| pair_cell(node, g, b)));
        row.extend((0..m).map(|k| node.nic_link(g, k).map_or("?".to_string(), |r| r.token().to_string())));
        let gpu = &node.gpus[g];
        row.push(gpu.cpu_affinity.as_ref().filter(|c| !c.is_empty()).map_or("N/A".into(), ToString::to_string));
        row.push(gpu.numa_node.map_or("N/A".into(), |x| x.to_string()));
        rows.push(row);
    }
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            let _ = write!(line, "{cell:<w$}", w = widths[c]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str("\nLegend:\n\n");
    for (token, meaning) in [
        ("X", "Self"),
        ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
        ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
        ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
        ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
        ("PIX", "Connection traversing at most a single PCIe bridge"),
        ("NV#", "Connection traversing a bonded set of # NVLinks"),
    ] {
        let _ = writeln!(out, "  {token:<4} = {meaning}");
    }
    if m > 0 {
        out.push_str("\nNIC Legend:\n\n");
        for (k, nic) in node.nics.iter().enumerate() {
            let _ = writeln!(out, "  NIC{k}: {}", nic.name);
        }
    }
    out
}

/// Escape a string for a DOT double-quoted string (`"` and `\`; newlines become `\n`).
fn dot_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

/// Graphviz DOT of the node: GPUs as ellipses labelled `GPUi` and their NUMA node, grouped in one
/// cluster per NUMA node; NVLink edges labelled `NV#` with a pen width growing with the link count;
/// dashed PCIe edges for `PIX`/`PXB` GPU pairs without NVLink; NICs as boxes joined (dotted) to the GPUs
/// they share a PCIe switch with.
///
/// Written by hand: DOT is a small text format, the workspace has no maintained DOT-writing crate, and
/// node ids here are generated (`gpu0`, `nic0`), so only labels need escaping.
pub fn to_dot(node: &NodeTopology) -> String {
    let n = node.gpu_count();
    let mut out = String::new();
    let title = node.name.as_deref().unwrap_or("node");
    let _ = writeln!(out, "graph \"{}\" {{", dot_escape(title));
    let _ = writeln!(out, "  label=\"{}\";", dot_escape(&picture_title(node)));
    out.push_str("  labelloc=t;\n  node [shape=ellipse, fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\"];\n");

    // GPUs, clustered by NUMA node.
    let mut by_numa: BTreeMap<Option<u32>, Vec<usize>> = BTreeMap::new();
    for (i, g) in node.gpus.iter().enumerate() {
        by_numa.entry(g.numa_node).or_default().push(i);
    }
    for (numa, members) in &by_numa {
        let indent = if numa.is_some() { "    " } else { "  " };
        if let Some(id) = numa {
            let _ = writeln!(out, "  subgraph cluster_numa{id} {{\n    label=\"NUMA {id}\";\n    style=rounded;");
        }
        for &i in members {
            let label = match numa {
                Some(id) => format!("GPU{i}\nNUMA {id}"),
                None => format!("GPU{i}"),
            };
            let _ = writeln!(out, "{indent}gpu{i} [label=\"{}\"];", dot_escape(&label));
        }
        if numa.is_some() {
            out.push_str("  }\n");
        }
    }

    // GPU pairs.
    for a in 0..n {
        for b in (a + 1)..n {
            let l = node.link(a, b);
            if l.nvlinks > 0 {
                let pen = 1.0 + f64::from(l.nvlinks) / 3.0;
                let _ = writeln!(out, "  gpu{a} -- gpu{b} [label=\"NV{}\", penwidth={pen:.2}];", l.nvlinks);
            } else if is_switch_local(l.pcie) {
                let token = l.pcie.map_or("?", PcieRelation::token);
                let _ = writeln!(out, "  gpu{a} -- gpu{b} [label=\"{token}\", style=dashed, color=gray40];");
            }
        }
    }

    // NICs.
    for (k, nic) in node.nics.iter().enumerate() {
        let _ = writeln!(out, "  nic{k} [shape=box, label=\"{}\"];", dot_escape(&nic.name));
        for g in 0..n {
            let rel = node.nic_link(g, k);
            if is_switch_local(rel) {
                let token = rel.map_or("?", PcieRelation::token);
                let _ = writeln!(out, "  nic{k} -- gpu{g} [label=\"{token}\", style=dotted, color=gray40];");
            }
        }
    }
    out.push_str("}\n");
    out
}

/// Human name of an NVLink generation.
fn generation_name(g: NvlinkGeneration) -> &'static str {
    match g {
        NvlinkGeneration::Nvlink1 => "NVLink 1",
        NvlinkGeneration::Nvlink2 => "NVLink 2",
        NvlinkGeneration::Nvlink3 => "NVLink 3",
        NvlinkGeneration::Nvlink3Ga102 => "NVLink 3 (GA102)",
        NvlinkGeneration::Nvlink4 => "NVLink 4",
        NvlinkGeneration::Nvlink5 => "NVLink 5",
    }
}

/// The one-line description used as the title of pictures.
fn picture_title(node: &NodeTopology) -> String {
    let plural = |k: usize| if k == 1 { "" } else { "s" };
    let mut t = format!(
        "{}: {} GPU{}, {} NIC{}",
        node.name.as_deref().unwrap_or("node"),
        node.gpu_count(),
        plural(node.gpu_count()),
        node.nics.len(),
        plural(node.nics.len())
    );
    if let Some(model) = node.gpus.iter().find_map(|g| g.model.as_deref()) {
        let _ = write!(t, ", {model}");
    }
    if node.has_nvlink()
        && let Some(generation) = node.nvlink_generation
    {
        let _ = write!(t, ", {}", generation_name(generation));
    }
    t
}

/// Fill colours of NUMA groups (colour-blind-safe palette, Okabe–Ito).
const NUMA_COLOURS: [&str; 8] =
    ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999"];

fn numa_colour(group: usize) -> &'static str {
    NUMA_COLOURS[group % NUMA_COLOURS.len()]
}

/// Stroke width of an NVLink edge: proportional to the link count, scaled so the node's widest edge is
/// 8 px (and one link is at most 2 px).
fn nvlink_width(node: &NodeTopology, count: u8) -> f64 {
    let per_link = 8.0 / f64::from(node.max_nvlinks().max(4));
    per_link * f64::from(count)
}

/// The common NVLink count when every GPU pair has the same non-zero count (an NVSwitch fabric).
fn uniform_nvlinks(node: &NodeTopology) -> Option<u8> {
    let n = node.gpu_count();
    let first = if n >= 2 { node.link(0, 1).nvlinks } else { 0 };
    let all_same = (0..n).all(|a| (a + 1..n).all(|b| node.link(a, b).nvlinks == first));
    (first > 0 && all_same).then_some(first)
}

fn label(x: f64, y: f64, size: u32, content: impl Into<String>) -> Text {
    Text::new(content)
        .set("x", format!("{x:.1}"))
        .set("y", format!("{y:.1}"))
        .set("font-size", size)
        .set("font-family", "Helvetica, Arial, sans-serif")
        .set("text-anchor", "middle")
        .set("dominant-baseline", "middle")
}

fn line(x1: f64, y1: f64, x2: f64, y2: f64) -> Line {
    Line::new()
        .set("x1", format!("{x1:.1}"))
        .set("y1", format!("{y1:.1}"))
        .set("x2", format!("{x2:.1}"))
        .set("y2", format!("{y2:.1}"))
}

fn nic_box(x: f64, y: f64, name: &str) -> Group {
    Group::new()
        .add(
            Rectangle::new()
                .set("x", format!("{:.1}", x - 38.0))
                .set("y", format!("{:.1}", y - 12.0))
                .set("width", 76)
                .set("height", 24)
                .set("rx", 3)
                .set("fill", "#f4f4f4")
                .set("stroke", "#333333")
                .set("class", "nic"),
        )
        .add(label(x, y, 11, name.to_string()))
}

/// An SVG picture of the node: GPUs on a circle, in NUMA order and coloured by NUMA node; NVLink edges
/// with a width proportional to the link count and an `NV#` label (on an NVSwitch fabric, where every
/// pair has the same count, only the edges between ring neighbours carry the label and the legend says
/// so); dashed edges for `PIX`/`PXB` GPU pairs without NVLink; NICs as boxes on an outer ring next to
/// the GPUs they share a PCIe switch with, the others in a row below; a legend; the node name as title.
/// A complete SVG document (`<svg xmlns=…>`); names are escaped by the `svg` crate (text content only:
/// no user string goes into an attribute).
pub fn to_svg(node: &NodeTopology) -> String {
    let n = node.gpu_count();
    let radius = (40.0 * n as f64 / PI).max(140.0);
    let margin = 170.0;
    let (cx, cy) = (radius + margin, radius + margin + 40.0);
    let nic_radius = radius + 120.0;
    let width = 2.0 * cx;

    // NUMA groups in id order; GPUs without a node last.
    let mut groups: BTreeMap<(bool, u32), Vec<usize>> = BTreeMap::new();
    for (i, g) in node.gpus.iter().enumerate() {
        groups.entry((g.numa_node.is_none(), g.numa_node.unwrap_or(0))).or_default().push(i);
    }
    let mut angle = vec![0.0f64; n];
    let mut colour = vec![""; n];
    let mut slot = 0usize;
    for (gi, members) in groups.values().enumerate() {
        for &i in members {
            angle[i] = -PI / 2.0 + 2.0 * PI * slot as f64 / n.max(1) as f64;
            colour[i] = numa_colour(gi);
            slot += 1;
        }
    }
    let pos = |a: f64, r: f64| (cx + r * a.cos(), cy + r * a.sin());

    // NICs next to the GPUs they share a PCIe switch with go on the outer ring at the mean angle of those
    // GPUs (several wanting one place fan out: 0, +δ, −δ, +2δ, …); the rest go in a row below.
    let mut placed: Vec<(usize, f64)> = Vec::new();
    let mut unplaced: Vec<usize> = Vec::new();
    let mut wanted: Vec<(f64, usize)> = Vec::new();
    for k in 0..node.nics.len() {
        let close: Vec<usize> = (0..n).filter(|&g| is_switch_local(node.nic_link(g, k))).collect();
        if close.is_empty() {
            unplaced.push(k);
            continue;
        }
        let a = close.iter().map(|&g| angle[g]).sum::<f64>() / close.len() as f64;
        let count = match wanted.iter_mut().find(|(x, _)| (*x - a).abs() < 1e-6) {
            Some((_, c)) => {
                *c += 1;
                *c
            }
            None => {
                wanted.push((a, 0));
                0
            }
        };
        let sign = if count % 2 == 1 { 1.0 } else { -1.0 };
        placed.push((k, a + 0.3 * count.div_ceil(2) as f64 * sign));
    }
    let per_row = ((width - 40.0) / 90.0).floor().max(1.0) as usize;
    let row_top = cy + nic_radius + 50.0;
    let rows = unplaced.len().div_ceil(per_row);
    let legend_top = row_top + 40.0 * rows as f64 + if rows > 0 { 20.0 } else { 0.0 };
    let height = legend_top + 22.0 + 20.0 * groups.len().max(6) as f64 + 20.0;

    let title = picture_title(node);
    let mut doc = Document::new()
        .set("width", format!("{width:.0}"))
        .set("height", format!("{height:.0}"))
        .set("viewBox", format!("0 0 {width:.0} {height:.0}"))
        .add(Title::new(title.clone()))
        .add(Rectangle::new().set("width", "100%").set("height", "100%").set("fill", "white"))
        .add(label(cx, 30.0, 20, title).set("font-weight", "bold"));

    // NUMA group labels just outside the ring (none when no GPU has a known node).
    if groups.keys().any(|(unknown, _)| !unknown) {
        for (gi, ((unknown, id), members)) in groups.iter().enumerate() {
            let mean = members.iter().map(|&i| angle[i]).sum::<f64>() / members.len() as f64;
            let (x, y) = pos(mean, radius + 50.0);
            let text = if *unknown { "NUMA ?".to_string() } else { format!("NUMA {id}") };
            doc = doc.add(label(x, y, 14, text).set("fill", numa_colour(gi)).set("font-weight", "bold"));
        }
    }

    // Edges first, so GPUs sit on top.
    let fabric = uniform_nvlinks(node);
    let neighbours = |a: usize, b: usize| {
        let slot_of = |i: usize| ((angle[i] + PI / 2.0) / (2.0 * PI) * n as f64).round() as usize % n.max(1);
        let d = slot_of(a).abs_diff(slot_of(b));
        d == 1 || d + 1 == n
    };
    let mut edges = Group::new().set("id", "edges");
    let mut edge_labels = Group::new().set("id", "edge-labels");
    for a in 0..n {
        for b in (a + 1)..n {
            let l = node.link(a, b);
            let (x1, y1) = pos(angle[a], radius);
            let (x2, y2) = pos(angle[b], radius);
            if l.nvlinks > 0 {
                edges = edges.add(
                    line(x1, y1, x2, y2)
                        .set("stroke", "#2b6cb0")
                        .set("stroke-opacity", 0.7)
                        .set("stroke-width", format!("{:.2}", nvlink_width(node, l.nvlinks)))
                        .set("class", "nvlink"),
                );
                if fabric.is_none() || neighbours(a, b) {
                    // Chords through the middle would stack their labels at the centre: put those a third
                    // of the way from the lower-numbered GPU.
                    let t = if neighbours(a, b) { 0.5 } else { 0.32 };
                    let (mx, my) = (x1 + t * (x2 - x1), y1 + t * (y2 - y1));
                    edge_labels = edge_labels.add(
                        label(mx, my, 11, format!("NV{}", l.nvlinks))
                            .set("stroke", "white")
                            .set("stroke-width", 3)
                            .set("paint-order", "stroke"),
                    );
                }
            } else if is_switch_local(l.pcie) {
                edges = edges.add(
                    line(x1, y1, x2, y2)
                        .set("stroke", "#666666")
                        .set("stroke-width", 1.5)
                        .set("stroke-dasharray", "6 4")
                        .set("class", "pcie"),
                );
            }
        }
    }

    let mut nics = Group::new().set("id", "nics");
    for &(k, a) in &placed {
        let (x, y) = pos(a, nic_radius);
        for g in (0..n).filter(|&g| is_switch_local(node.nic_link(g, k))) {
            let (gx, gy) = pos(angle[g], radius);
            edges = edges.add(
                line(x, y, gx, gy)
                    .set("stroke", "#666666")
                    .set("stroke-width", 1)
                    .set("stroke-dasharray", "2 3")
                    .set("class", "nic-link"),
            );
        }
        nics = nics.add(nic_box(x, y, &node.nics[k].name));
    }
    if !unplaced.is_empty() {
        nics = nics.add(
            label(20.0, row_top - 22.0, 12, "NICs on no GPU's PCIe switch:".to_string()).set("text-anchor", "start"),
        );
    }
    for (j, &k) in unplaced.iter().enumerate() {
        let x = 20.0 + 38.0 + 90.0 * (j % per_row) as f64;
        let y = row_top + 40.0 * (j / per_row) as f64;
        nics = nics.add(nic_box(x, y, &node.nics[k].name));
    }

    let mut gpus = Group::new().set("id", "gpus");
    for i in 0..n {
        let (x, y) = pos(angle[i], radius);
        gpus = gpus
            .add(
                Circle::new()
                    .set("cx", format!("{x:.1}"))
                    .set("cy", format!("{y:.1}"))
                    .set("r", 26)
                    .set("fill", colour[i])
                    .set("stroke", "#222222")
                    .set("stroke-width", 1.5)
                    .set("class", "gpu"),
            )
            .add(label(x, y, 13, format!("GPU{i}")).set("font-weight", "bold"));
    }
    doc = doc.add(edges).add(edge_labels).add(nics).add(gpus).add(legend(node, &groups, fabric, 20.0, legend_top));
    doc.to_string()
}

/// The legend: NVLink widths, PCIe-switch edges, NIC links and NUMA colours.
fn legend(
    node: &NodeTopology,
    groups: &BTreeMap<(bool, u32), Vec<usize>>,
    fabric: Option<u8>,
    x0: f64,
    y0: f64,
) -> Group {
    let text = |x: f64, y: f64, s: String| {
        Text::new(s)
            .set("x", format!("{x:.1}"))
            .set("y", format!("{y:.1}"))
            .set("font-size", 12)
            .set("font-family", "Helvetica, Arial, sans-serif")
            .set("dominant-baseline", "middle")
    };
    let sample = |y: f64, width: f64, dash: Option<&str>| {
        let mut l = line(x0, y, x0 + 40.0, y)
            .set("stroke", if dash.is_some() { "#666666" } else { "#2b6cb0" })
            .set("stroke-width", format!("{width:.2}"));
        if let Some(d) = dash {
            l = l.set("stroke-dasharray", d);
        }
        l
    };
    let mut g = Group::new().set("id", "legend").add(text(x0, y0, "Legend".into()).set("font-weight", "bold"));
    let max = node.max_nvlinks();
    let mut y = y0 + 22.0;
    // The counts that occur (at most four: the smallest three and the largest).
    let mut counts: Vec<u8> = node.links().iter().map(|l| l.nvlinks).filter(|c| *c > 0).collect();
    counts.sort_unstable();
    counts.dedup();
    if counts.len() > 4 {
        counts = counts[..3].iter().copied().chain([max]).collect();
    }
    for count in counts {
        let what = match fabric {
            Some(c) if c == count => format!("NV{count} on every GPU pair (NVSwitch)"),
            _ => format!("NV{count}: {count} NVLink{} (width ∝ links)", if count == 1 { "" } else { "s" }),
        };
        g = g.add(sample(y, nvlink_width(node, count), None)).add(text(x0 + 50.0, y, what));
        y += 20.0;
    }
    g = g.add(sample(y, 1.5, Some("6 4"))).add(text(x0 + 50.0, y, "PCIe via a switch (PIX/PXB), no NVLink".into()));
    y += 20.0;
    if !node.nics.is_empty() {
        g = g.add(sample(y, 1.0, Some("2 3"))).add(text(x0 + 50.0, y, "NIC on the GPU's PCIe switch".into()));
    }
    // NUMA colours in a second column.
    let x1 = x0 + 360.0;
    let mut y = y0 + 22.0;
    for (gi, (unknown, id)) in groups.keys().enumerate() {
        let name = if *unknown { "NUMA node unknown".to_string() } else { format!("NUMA node {id}") };
        g = g
            .add(
                Circle::new()
                    .set("cx", format!("{:.1}", x1 + 8.0))
                    .set("cy", format!("{y:.1}"))
                    .set("r", 7)
                    .set("fill", numa_colour(gi))
                    .set("stroke", "#222222"),
            )
            .add(text(x1 + 22.0, y, name));
        y += 20.0;
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_escape_handles_quotes_backslashes_and_newlines() {
        assert_eq!(dot_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
