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

/// Fill colours of NUMA groups (colour-blind-safe palette, Okabe–Ito). Used as GPU fills only,
/// under black text; text in a NUMA group's colour uses [`NUMA_TEXT_COLOURS`].
const NUMA_COLOURS: [&str; 8] =
    ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999"];

/// Darker shades of [`NUMA_COLOURS`] for text on white: each has a contrast ratio of at least 4.5
/// against white (WCAG AA for normal text), which the yellow and sky blue fills do not.
const NUMA_TEXT_COLOURS: [&str; 8] =
    ["#8A5A00", "#1F6E9C", "#00694D", "#6B6400", "#0072B2", "#A34400", "#9C4A7F", "#595959"];

fn numa_colour(group: usize) -> &'static str {
    NUMA_COLOURS[group % NUMA_COLOURS.len()]
}

fn numa_text_colour(group: usize) -> &'static str {
    NUMA_TEXT_COLOURS[group % NUMA_TEXT_COLOURS.len()]
}

/// Colours of highlighted sets (rings around their GPUs, outlines of their NICs), in order.
const HIGHLIGHT_COLOURS: [&str; 8] =
    ["#C2185B", "#2E7D32", "#6A1B9A", "#EF6C00", "#00838F", "#4E342E", "#283593", "#9E9D24"];

/// The colour of the `i`-th highlighted set.
pub fn highlight_colour(i: usize) -> &'static str {
    HIGHLIGHT_COLOURS[i % HIGHLIGHT_COLOURS.len()]
}

/// The kinds of link a drawing shows. GPU pairs without NVLink are joined only below a host bridge
/// (`PIX`, `PXB`, `PHB`); pairs across host bridges (`NODE`) or sockets (`SYS`) are not drawn (the
/// NUMA colours tell them apart). A NIC is joined to the GPUs on its PCIe switch (`PIX`, `PXB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkKind {
    /// NVLink between two GPUs (width grows with the link count).
    Nvlink,
    /// GPU pair under one PCIe bridge.
    Pix,
    /// GPU pair under several PCIe bridges, no host bridge.
    Pxb,
    /// GPU pair through a PCIe host bridge.
    Phb,
    /// NIC and GPU under one PCIe bridge.
    NicPix,
    /// NIC and GPU under several PCIe bridges.
    NicPxb,
}

/// How a link is drawn: its stroke colour and dash pattern (`None`: solid). Every [`LinkKind`] has
/// its own pair, so kinds differ in colour and in dash alike (readable in grey print and by
/// colour-blind readers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinkStyle {
    /// Stroke colour.
    pub colour: &'static str,
    /// `stroke-dasharray`, or `None` for a solid line.
    pub dash: Option<&'static str>,
}

impl LinkKind {
    /// Every kind, in legend order.
    pub const ALL: [LinkKind; 6] =
        [LinkKind::Nvlink, LinkKind::Pix, LinkKind::Pxb, LinkKind::Phb, LinkKind::NicPix, LinkKind::NicPxb];

    /// Its colour and dash.
    pub fn style(self) -> LinkStyle {
        let (colour, dash) = match self {
            LinkKind::Nvlink => ("#0072B2", None),
            LinkKind::Pix => ("#D55E00", Some("8 4")),
            LinkKind::Pxb => ("#009E73", Some("3 3")),
            LinkKind::Phb => ("#CC79A7", Some("10 3 2 3")),
            LinkKind::NicPix => ("#555555", Some("2 3")),
            LinkKind::NicPxb => ("#8C6D1F", Some("1 5")),
        };
        LinkStyle { colour, dash }
    }

    /// The `class` of its lines in the SVG.
    pub fn class(self) -> &'static str {
        match self {
            LinkKind::Nvlink => "nvlink",
            LinkKind::Pix => "pcie pix",
            LinkKind::Pxb => "pcie pxb",
            LinkKind::Phb => "pcie phb",
            LinkKind::NicPix => "nic-link pix",
            LinkKind::NicPxb => "nic-link pxb",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            LinkKind::Nvlink => "NVLink",
            LinkKind::Pix => "PCIe PIX: one PCIe bridge, no NVLink",
            LinkKind::Pxb => "PCIe PXB: several PCIe bridges, no NVLink",
            LinkKind::Phb => "PCIe PHB: through the host bridge, no NVLink",
            LinkKind::NicPix => "NIC on the GPU's PCIe bridge (PIX)",
            LinkKind::NicPxb => "NIC on the GPU's PCIe switch tree (PXB)",
        }
    }

    /// The kind of a GPU pair without NVLink, if the drawing joins it.
    fn of_gpu_pair(rel: Option<PcieRelation>) -> Option<LinkKind> {
        match rel? {
            PcieRelation::Pix => Some(LinkKind::Pix),
            PcieRelation::Pxb => Some(LinkKind::Pxb),
            PcieRelation::Phb => Some(LinkKind::Phb),
            _ => None,
        }
    }

    /// The kind of a NIC–GPU relation, if the drawing joins them.
    fn of_nic(rel: Option<PcieRelation>) -> Option<LinkKind> {
        match rel? {
            PcieRelation::Pix => Some(LinkKind::NicPix),
            PcieRelation::Pxb => Some(LinkKind::NicPxb),
            _ => None,
        }
    }
}

/// GPU sets to mark on a drawing (`weft topo show --highlight`, `weft gpu allocate -o svg`, the
/// pods on the nodes of `weft simulate --report`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Highlight {
    /// The sets, each drawn in its [`highlight_colour`].
    pub sets: Vec<Marked>,
}

/// One marked set: its GPUs (a ring around each) and NICs (a thick outline), named in the legend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marked {
    /// What the legend calls it (a pod's name, `chosen`).
    pub label: String,
    /// GPU indexes; those the node does not have are left out.
    pub gpus: Vec<usize>,
    /// NIC positions in the node's NICs; those it does not have are left out.
    pub nics: Vec<usize>,
}

/// The NICs that share a PCIe switch (`PIX`/`PXB`) with one of `gpus`: the NICs a set of GPUs
/// would use for GPUDirect RDMA without crossing the host bridge.
pub fn nics_beside(node: &NodeTopology, gpus: &[usize]) -> Vec<usize> {
    (0..node.nics.len())
        .filter(|&k| gpus.iter().any(|&g| g < node.gpu_count() && is_switch_local(node.nic_link(g, k))))
        .collect()
}

/// An axis-aligned box, in SVG user units (y grows downwards).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rect {
    /// Left.
    pub x: f64,
    /// Top.
    pub y: f64,
    /// Width.
    pub w: f64,
    /// Height.
    pub h: f64,
}

impl Rect {
    fn centred(cx: f64, cy: f64, w: f64, h: f64) -> Rect {
        Rect { x: cx - w / 2.0, y: cy - h / 2.0, w, h }
    }

    /// Whether the two boxes share some area (touching edges do not count).
    pub fn intersects(&self, o: &Rect) -> bool {
        self.x < o.x + o.w && o.x < self.x + self.w && self.y < o.y + o.h && o.y < self.y + self.h
    }

    /// Whether the segment from `a` to `b` passes through the box (Liang–Barsky clipping).
    pub fn meets_segment(&self, a: (f64, f64), b: (f64, f64)) -> bool {
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let (mut t0, mut t1) = (0.0f64, 1.0f64);
        for (p, q) in
            [(-dx, a.0 - self.x), (dx, self.x + self.w - a.0), (-dy, a.1 - self.y), (dy, self.y + self.h - a.1)]
        {
            if p == 0.0 {
                if q < 0.0 {
                    return false;
                }
            } else {
                let t = q / p;
                if p < 0.0 {
                    t0 = t0.max(t);
                } else {
                    t1 = t1.min(t);
                }
                if t0 > t1 {
                    return false;
                }
            }
        }
        true
    }

    fn overlap(&self, o: &Rect) -> f64 {
        let w = (self.x + self.w).min(o.x + o.w) - self.x.max(o.x);
        let h = (self.y + self.h).min(o.y + o.h) - self.y.max(o.y);
        if w > 0.0 && h > 0.0 { w * h } else { 0.0 }
    }
}

/// Where a drawing puts a piece of text (or a labelled box: a GPU, a NIC).
#[derive(Clone, Debug, PartialEq)]
pub struct TextBox {
    /// The text.
    pub text: String,
    /// Its box: estimated from the font size and the number of characters (Helvetica's digits and
    /// capitals are at most 0.62 em wide), with a margin of 2 units; a GPU's is its circle's box, a
    /// NIC's its rectangle.
    pub rect: Rect,
}

/// The width of `text` at `size` as [`TextBox`] estimates it.
fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * 0.62 * size + 4.0
}

fn text_box(cx: f64, cy: f64, size: f64, text: &str) -> Rect {
    Rect::centred(cx, cy, text_width(text, size), size * 1.25)
}

/// The first candidate box that meets none of `taken`, or (none free) the one that overlaps them
/// least.
fn first_free(candidates: impl Iterator<Item = Rect>, taken: &[Rect]) -> Option<Rect> {
    let mut best: Option<(f64, Rect)> = None;
    for c in candidates {
        let overlap: f64 = taken.iter().map(|t| c.overlap(t)).sum();
        if overlap == 0.0 {
            return Some(c);
        }
        if best.is_none_or(|(o, _)| overlap < o) {
            best = Some((overlap, c));
        }
    }
    best.map(|(_, r)| r)
}

/// An NVLink edge of a [`Layout`]: the GPU pair and its two ends.
pub type Edge = ((usize, usize), (f64, f64), (f64, f64));

/// Where everything of [`to_svg`]'s picture goes: computed once, drawn by [`to_svg_with`], and read
/// by tests (no two [`Layout::texts`] intersect on the shipped topologies).
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// Picture width.
    pub width: f64,
    /// Picture height.
    pub height: f64,
    /// Centre of each GPU's circle.
    pub gpus: Vec<(f64, f64)>,
    /// Centre of each NIC's box.
    pub nics: Vec<(f64, f64)>,
    /// NVLink labels: the GPU pair and the label's box.
    pub edge_labels: Vec<((usize, usize), Rect)>,
    /// NVLink edges: the GPU pair and the segment between the GPUs' centres.
    pub edges: Vec<Edge>,
    /// NUMA labels: group position, text and centre.
    pub numa_labels: Vec<(usize, String, (f64, f64))>,
    /// Where the legend starts (its top-left).
    pub legend: (f64, f64),
    /// Every text on the picture with its box: title, GPUs, NICs, NUMA and NVLink labels, legend.
    pub texts: Vec<TextBox>,
    /// The link kinds the picture draws.
    pub kinds: Vec<LinkKind>,
}

/// Radius of a GPU's circle.
const GPU_RADIUS: f64 = 26.0;
/// Size of a NIC's box.
const NIC_BOX: (f64, f64) = (76.0, 24.0);

/// Lay the picture out; see [`to_svg_with`] for what goes where.
pub fn layout(node: &NodeTopology, highlight: &Highlight) -> Layout {
    let n = node.gpu_count();
    let radius = (48.0 * n as f64 / PI).max(170.0);
    let margin = 180.0;
    let (cx, cy) = (radius + margin, radius + margin + 40.0);
    let nic_radius = radius + 125.0;
    let width = 2.0 * cx;
    let groups = numa_groups(node);
    let mut angle = vec![0.0f64; n];
    let mut slot = 0usize;
    for members in groups.values() {
        for &i in members {
            angle[i] = -PI / 2.0 + 2.0 * PI * slot as f64 / n.max(1) as f64;
            slot += 1;
        }
    }
    let pos = |a: f64, r: f64| (cx + r * a.cos(), cy + r * a.sin());
    let gpus: Vec<(f64, f64)> = (0..n).map(|i| pos(angle[i], radius)).collect();

    let mut texts: Vec<TextBox> = Vec::new();
    let title = picture_title(node);
    texts.push(TextBox { rect: text_box(cx, 30.0, 20.0, &title), text: title });
    for (i, &(x, y)) in gpus.iter().enumerate() {
        let d = 2.0 * GPU_RADIUS;
        texts.push(TextBox { text: format!("GPU{i}"), rect: Rect::centred(x, y, d, d) });
    }
    let taken = |texts: &[TextBox]| texts.iter().map(|t| t.rect).collect::<Vec<_>>();

    // NUMA labels just outside the ring (none when no GPU has a known node), moved outwards until
    // clear.
    let mut numa_labels = Vec::new();
    if groups.keys().any(|(unknown, _)| !unknown) {
        for (gi, ((unknown, id), members)) in groups.iter().enumerate() {
            let mean = members.iter().map(|&i| angle[i]).sum::<f64>() / members.len() as f64;
            let text = if *unknown { "NUMA ?".to_string() } else { format!("NUMA {id}") };
            let occupied = taken(&texts);
            let rect = first_free(
                (0..12).map(|s| {
                    let (x, y) = pos(mean, radius + 50.0 + 8.0 * s as f64);
                    text_box(x, y, 14.0, &text)
                }),
                &occupied,
            );
            if let Some(rect) = rect {
                let c = (rect.x + rect.w / 2.0, rect.y + rect.h / 2.0);
                numa_labels.push((gi, text.clone(), c));
                texts.push(TextBox { text, rect });
            }
        }
    }

    // NICs beside GPUs go on the outer ring at the mean angle of those GPUs, fanned out from there
    // until clear of what is placed; the rest go in a row below.
    let mut nics = vec![(0.0, 0.0); node.nics.len()];
    let mut unplaced: Vec<usize> = Vec::new();
    for (k, nic) in node.nics.iter().enumerate() {
        let close: Vec<usize> = (0..n).filter(|&g| is_switch_local(node.nic_link(g, k))).collect();
        if close.is_empty() {
            unplaced.push(k);
            continue;
        }
        let a = close.iter().map(|&g| angle[g]).sum::<f64>() / close.len() as f64;
        let occupied = taken(&texts);
        let candidates = (0..40usize).map(|step| {
            let sign = if step % 2 == 1 { 1.0 } else { -1.0 };
            let (x, y) = pos(a + 0.06 * step.div_ceil(2) as f64 * sign, nic_radius);
            Rect::centred(x, y, NIC_BOX.0 + 8.0, NIC_BOX.1 + 6.0)
        });
        if let Some(r) = first_free(candidates, &occupied) {
            nics[k] = (r.x + r.w / 2.0, r.y + r.h / 2.0);
            texts.push(TextBox {
                text: nic.name.clone(),
                rect: Rect::centred(nics[k].0, nics[k].1, NIC_BOX.0, NIC_BOX.1),
            });
        }
    }
    let per_row = ((width - 40.0) / 90.0).floor().max(1.0) as usize;
    let row_top = cy + nic_radius + 50.0;
    let rows = unplaced.len().div_ceil(per_row);
    if !unplaced.is_empty() {
        let text = "NICs on no GPU's PCIe switch:";
        texts.push(TextBox {
            text: text.into(),
            rect: Rect { x: 20.0, y: row_top - 22.0 - 8.0, w: text_width(text, 12.0), h: 15.0 },
        });
    }
    for (j, &k) in unplaced.iter().enumerate() {
        nics[k] = (20.0 + 38.0 + 90.0 * (j % per_row) as f64, row_top + 40.0 * (j / per_row) as f64);
        texts.push(TextBox {
            text: node.nics[k].name.clone(),
            rect: Rect::centred(nics[k].0, nics[k].1, NIC_BOX.0, NIC_BOX.1),
        });
    }

    // NVLink labels: on an NVSwitch fabric (every pair the same count) only the edges between
    // ring neighbours carry one; each goes at the first point along its edge (middle first) where
    // it meets no GPU, NIC or label already placed.
    let fabric = uniform_nvlinks(node);
    let slot_of = |i: usize| ((angle[i] + PI / 2.0) / (2.0 * PI) * n as f64).round() as usize % n.max(1);
    let neighbours = |a: usize, b: usize| {
        let d = slot_of(a).abs_diff(slot_of(b));
        d == 1 || d + 1 == n
    };
    let mut edge_labels = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    let edges: Vec<Edge> = (0..n)
        .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
        .filter(|&(a, b)| node.link(a, b).nvlinks > 0)
        .map(|(a, b)| ((a, b), gpus[a], gpus[b]))
        .collect();
    const ALONG: [f64; 17] =
        [0.5, 0.42, 0.58, 0.35, 0.65, 0.28, 0.72, 0.46, 0.54, 0.38, 0.62, 0.31, 0.69, 0.24, 0.76, 0.2, 0.8];
    const CHORD: [f64; 15] = [0.3, 0.7, 0.26, 0.74, 0.34, 0.66, 0.22, 0.78, 0.38, 0.62, 0.18, 0.82, 0.42, 0.58, 0.5];
    for a in 0..n {
        for b in (a + 1)..n {
            let l = node.link(a, b);
            if l.nvlinks == 0 {
                if let Some(kind) = LinkKind::of_gpu_pair(l.pcie) {
                    kinds.insert(kind);
                }
                continue;
            }
            kinds.insert(LinkKind::Nvlink);
            if fabric.is_some() && !neighbours(a, b) {
                continue;
            }
            let text = format!("NV{}", l.nvlinks);
            let ((x1, y1), (x2, y2)) = (gpus[a], gpus[b]);
            let occupied = taken(&texts);
            // A chord through the middle keeps its label off the centre, where chords cross; a
            // label no other edge passes through is preferred, so it names its own edge only.
            let along: &[f64] = if neighbours(a, b) { &ALONG } else { &CHORD };
            let candidates = along.iter().map(|t| text_box(x1 + t * (x2 - x1), y1 + t * (y2 - y1), 11.0, &text));
            let clear = |r: &Rect| edges.iter().all(|(pair, p, q)| *pair == (a, b) || !r.meets_segment(*p, *q));
            let rect = first_free(candidates.clone().filter(clear), &occupied)
                .filter(|r| occupied.iter().all(|o| !r.intersects(o)))
                .or_else(|| first_free(candidates, &occupied));
            if let Some(rect) = rect {
                edge_labels.push(((a, b), rect));
                texts.push(TextBox { text, rect });
            }
        }
    }
    for k in 0..node.nics.len() {
        for g in 0..n {
            if let Some(kind) = LinkKind::of_nic(node.nic_link(g, k)) {
                kinds.insert(kind);
            }
        }
    }
    let kinds: Vec<LinkKind> = kinds.into_iter().collect();

    // The legend: link kinds (and NVLink counts), then the highlighted sets, in a first column;
    // NUMA colours in a second column right of the widest entry.
    let legend_top = row_top + 40.0 * rows as f64 + if rows > 0 { 20.0 } else { 0.0 };
    let x0 = 20.0;
    let mut entries = legend_entries(node, fabric, &kinds);
    entries.extend(highlight.sets.iter().map(|s| s.label.clone()));
    texts.push(TextBox {
        text: "Legend".into(),
        rect: Rect { x: x0, y: legend_top - 8.0, w: text_width("Legend", 12.0), h: 15.0 },
    });
    let mut y = legend_top + 22.0;
    let mut widest: f64 = 0.0;
    for e in &entries {
        let w = text_width(e, 12.0);
        widest = widest.max(w);
        texts.push(TextBox { text: e.clone(), rect: Rect { x: x0 + 50.0, y: y - 7.5, w, h: 15.0 } });
        y += 20.0;
    }
    let x1 = x0 + 50.0 + widest + 30.0;
    let mut y2 = legend_top + 22.0;
    for (unknown, id) in groups.keys() {
        let name = if *unknown { "NUMA node unknown".to_string() } else { format!("NUMA node {id}") };
        texts.push(TextBox {
            rect: Rect { x: x1 + 22.0, y: y2 - 7.5, w: text_width(&name, 12.0), h: 15.0 },
            text: name,
        });
        y2 += 20.0;
    }
    let width = width.max(x1 + 22.0 + text_width("NUMA node unknown", 12.0) + 20.0);
    let height = y.max(y2) + 20.0;
    Layout { width, height, gpus, nics, edge_labels, edges, numa_labels, legend: (x0, legend_top), texts, kinds }
}

/// NUMA groups in id order, GPUs without a node last.
fn numa_groups(node: &NodeTopology) -> BTreeMap<(bool, u32), Vec<usize>> {
    let mut groups: BTreeMap<(bool, u32), Vec<usize>> = BTreeMap::new();
    for (i, g) in node.gpus.iter().enumerate() {
        groups.entry((g.numa_node.is_none(), g.numa_node.unwrap_or(0))).or_default().push(i);
    }
    groups
}

/// The legend's link lines, in order: one per NVLink count that occurs (at most four: the smallest
/// three and the largest), then each other kind drawn.
fn legend_entries(node: &NodeTopology, fabric: Option<u8>, kinds: &[LinkKind]) -> Vec<String> {
    let mut out = Vec::new();
    for count in nvlink_counts(node) {
        out.push(match fabric {
            Some(c) if c == count => format!("NV{count} on every GPU pair (NVSwitch)"),
            _ => format!("NV{count}: {count} NVLink{} (width ∝ links)", if count == 1 { "" } else { "s" }),
        });
    }
    out.extend(kinds.iter().filter(|k| **k != LinkKind::Nvlink).map(|k| k.describe().to_string()));
    out
}

fn nvlink_counts(node: &NodeTopology) -> Vec<u8> {
    let mut counts: Vec<u8> = node.links().iter().map(|l| l.nvlinks).filter(|c| *c > 0).collect();
    counts.sort_unstable();
    counts.dedup();
    if counts.len() > 4 {
        counts = counts[..3].iter().copied().chain([node.max_nvlinks()]).collect();
    }
    counts
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

/// A line in a kind's colour and dash.
fn styled(l: Line, kind: LinkKind) -> Line {
    let style = kind.style();
    let l = l.set("stroke", style.colour).set("class", kind.class());
    match style.dash {
        Some(d) => l.set("stroke-dasharray", d),
        None => l,
    }
}

fn nic_box(x: f64, y: f64, name: &str) -> Group {
    Group::new()
        .add(
            Rectangle::new()
                .set("x", format!("{:.1}", x - NIC_BOX.0 / 2.0))
                .set("y", format!("{:.1}", y - NIC_BOX.1 / 2.0))
                .set("width", NIC_BOX.0)
                .set("height", NIC_BOX.1)
                .set("rx", 3)
                .set("fill", "#f4f4f4")
                .set("stroke", "#333333")
                .set("class", "nic"),
        )
        .add(label(x, y, 11, name.to_string()))
}

/// An SVG picture of the node ([`to_svg_with`] with nothing highlighted).
pub fn to_svg(node: &NodeTopology) -> String {
    to_svg_with(node, &Highlight::default())
}

/// An SVG picture of the node: GPUs on a circle, in NUMA order and filled by NUMA node (NUMA labels
/// in a darker shade of the fill, readable on white); NVLink edges solid, with a width
/// proportional to the link count and an `NV#` label placed along the edge where it meets no other
/// label, GPU or NIC (on an NVSwitch fabric, where every pair has the same count, only the edges
/// between ring neighbours carry the label and the legend says so); GPU pairs without NVLink
/// below a host bridge (`PIX`, `PXB`, `PHB`) and NIC–GPU links each in their own colour and dash
/// ([`LinkKind::style`]); NICs as boxes on an outer ring next to the GPUs they share a PCIe switch
/// with, the others in a row below; each highlighted set as coloured rings around its GPUs and
/// thick outlines of its NICs; a legend of every kind drawn, the sets and the NUMA colours; the
/// node name as title. A complete SVG document (`<svg xmlns=…>`); names are escaped by the `svg`
/// crate (text content only: no user string goes into an attribute).
pub fn to_svg_with(node: &NodeTopology, highlight: &Highlight) -> String {
    let n = node.gpu_count();
    let lay = layout(node, highlight);
    let groups = numa_groups(node);
    let mut colour = vec![""; n];
    for (gi, members) in groups.values().enumerate() {
        for &i in members {
            colour[i] = numa_colour(gi);
        }
    }

    let title = picture_title(node);
    let (width, height) = (lay.width, lay.height);
    let mut doc = Document::new()
        .set("width", format!("{width:.0}"))
        .set("height", format!("{height:.0}"))
        .set("viewBox", format!("0 0 {width:.0} {height:.0}"))
        .add(Title::new(title.clone()))
        .add(Rectangle::new().set("width", "100%").set("height", "100%").set("fill", "white"))
        .add(label(lay.texts[0].rect.x + lay.texts[0].rect.w / 2.0, 30.0, 20, title).set("font-weight", "bold"));

    for (gi, text, (x, y)) in &lay.numa_labels {
        doc = doc.add(label(*x, *y, 14, text.clone()).set("fill", numa_text_colour(*gi)).set("font-weight", "bold"));
    }

    // Edges first, so GPUs sit on top.
    let mut edges = Group::new().set("id", "edges");
    for a in 0..n {
        for b in (a + 1)..n {
            let l = node.link(a, b);
            let ((x1, y1), (x2, y2)) = (lay.gpus[a], lay.gpus[b]);
            if l.nvlinks > 0 {
                edges = edges.add(
                    styled(line(x1, y1, x2, y2), LinkKind::Nvlink)
                        .set("stroke-opacity", 0.7)
                        .set("stroke-width", format!("{:.2}", nvlink_width(node, l.nvlinks))),
                );
            } else if let Some(kind) = LinkKind::of_gpu_pair(l.pcie) {
                edges = edges.add(styled(line(x1, y1, x2, y2), kind).set("stroke-width", 1.5));
            }
        }
    }
    let mut edge_labels = Group::new().set("id", "edge-labels");
    for ((a, b), r) in &lay.edge_labels {
        edge_labels = edge_labels.add(
            label(r.x + r.w / 2.0, r.y + r.h / 2.0, 11, format!("NV{}", node.link(*a, *b).nvlinks))
                .set("stroke", "white")
                .set("stroke-width", 3)
                .set("paint-order", "stroke"),
        );
    }

    let marked = |set: &Marked| -> (Vec<usize>, Vec<usize>) {
        let gpus = set.gpus.iter().copied().filter(|&g| g < n).collect();
        let nics = set.nics.iter().copied().filter(|&k| k < node.nics.len()).collect();
        (gpus, nics)
    };
    let mut nics = Group::new().set("id", "nics");
    for (k, nic) in node.nics.iter().enumerate() {
        let (x, y) = lay.nics[k];
        for g in 0..n {
            if let Some(kind) = LinkKind::of_nic(node.nic_link(g, k)) {
                let (gx, gy) = lay.gpus[g];
                edges = edges.add(styled(line(x, y, gx, gy), kind).set("stroke-width", 1.2));
            }
        }
        nics = nics.add(nic_box(x, y, &nic.name));
    }
    if let Some(t) = lay.texts.iter().find(|t| t.text == "NICs on no GPU's PCIe switch:") {
        nics = nics.add(label(t.rect.x, t.rect.y + t.rect.h / 2.0, 12, t.text.clone()).set("text-anchor", "start"));
    }

    let mut gpus = Group::new().set("id", "gpus");
    for (i, &(x, y)) in lay.gpus.iter().enumerate() {
        gpus = gpus
            .add(
                Circle::new()
                    .set("cx", format!("{x:.1}"))
                    .set("cy", format!("{y:.1}"))
                    .set("r", GPU_RADIUS)
                    .set("fill", colour[i])
                    .set("stroke", "#222222")
                    .set("stroke-width", 1.5)
                    .set("class", "gpu"),
            )
            .add(label(x, y, 13, format!("GPU{i}")).set("font-weight", "bold"));
    }
    // Highlighted sets: a ring per GPU (one ring further out per set a GPU is in) and an outline
    // per NIC, with data-set and data-gpu / data-nic naming what each marks.
    let mut marks = Group::new().set("id", "highlight");
    let mut rings = vec![0usize; n];
    let mut outlines = vec![0usize; node.nics.len()];
    for (si, set) in highlight.sets.iter().enumerate() {
        let (set_gpus, set_nics) = marked(set);
        for g in set_gpus {
            let (x, y) = lay.gpus[g];
            marks = marks.add(
                Circle::new()
                    .set("cx", format!("{x:.1}"))
                    .set("cy", format!("{y:.1}"))
                    .set("r", GPU_RADIUS + 5.0 + 5.0 * rings[g] as f64)
                    .set("fill", "none")
                    .set("stroke", highlight_colour(si))
                    .set("stroke-width", 4)
                    .set("class", "highlight")
                    .set("data-set", si)
                    .set("data-gpu", g),
            );
            rings[g] += 1;
        }
        for k in set_nics {
            let (x, y) = lay.nics[k];
            let grow = 3.0 + 4.0 * outlines[k] as f64;
            marks = marks.add(
                Rectangle::new()
                    .set("x", format!("{:.1}", x - NIC_BOX.0 / 2.0 - grow))
                    .set("y", format!("{:.1}", y - NIC_BOX.1 / 2.0 - grow))
                    .set("width", format!("{:.1}", NIC_BOX.0 + 2.0 * grow))
                    .set("height", format!("{:.1}", NIC_BOX.1 + 2.0 * grow))
                    .set("rx", 4)
                    .set("fill", "none")
                    .set("stroke", highlight_colour(si))
                    .set("stroke-width", 3)
                    .set("class", "highlight-nic")
                    .set("data-set", si)
                    .set("data-nic", k),
            );
            outlines[k] += 1;
        }
    }
    doc = doc.add(edges).add(edge_labels).add(nics).add(gpus).add(marks).add(legend(node, &lay, &groups, highlight));
    doc.to_string()
}

/// The legend, at [`Layout::legend`]: a sample line per NVLink count and per other kind drawn, a
/// ring per highlighted set, and the NUMA colours in a second column.
fn legend(
    node: &NodeTopology,
    lay: &Layout,
    groups: &BTreeMap<(bool, u32), Vec<usize>>,
    highlight: &Highlight,
) -> Group {
    let (x0, y0) = lay.legend;
    let text = |x: f64, y: f64, s: String| {
        Text::new(s)
            .set("x", format!("{x:.1}"))
            .set("y", format!("{y:.1}"))
            .set("font-size", 12)
            .set("font-family", "Helvetica, Arial, sans-serif")
            .set("dominant-baseline", "middle")
    };
    let fabric = uniform_nvlinks(node);
    let entries = legend_entries(node, fabric, &lay.kinds);
    let mut g = Group::new().set("id", "legend").add(text(x0, y0, "Legend".into()).set("font-weight", "bold"));
    let mut y = y0 + 22.0;
    let counts = nvlink_counts(node);
    let mut entry = entries.into_iter();
    for count in counts {
        let l = styled(line(x0, y, x0 + 40.0, y), LinkKind::Nvlink)
            .set("stroke-width", format!("{:.2}", nvlink_width(node, count)))
            .set("class", "legend-sample");
        g = g.add(l).add(text(x0 + 50.0, y, entry.next().unwrap_or_default()));
        y += 20.0;
    }
    for kind in lay.kinds.iter().filter(|k| **k != LinkKind::Nvlink) {
        g = g
            .add(styled(line(x0, y, x0 + 40.0, y), *kind).set("stroke-width", 2).set("class", "legend-sample"))
            .add(text(x0 + 50.0, y, entry.next().unwrap_or_default()));
        y += 20.0;
    }
    for (si, set) in highlight.sets.iter().enumerate() {
        g = g
            .add(
                Circle::new()
                    .set("cx", format!("{:.1}", x0 + 20.0))
                    .set("cy", format!("{y:.1}"))
                    .set("r", 7)
                    .set("fill", "none")
                    .set("stroke", highlight_colour(si))
                    .set("stroke-width", 3),
            )
            .add(text(x0 + 50.0, y, set.label.clone()));
        y += 20.0;
    }
    // NUMA colours in a second column, where the layout put their names.
    let mut y = y0 + 22.0;
    for (gi, (unknown, id)) in groups.keys().enumerate() {
        let name = if *unknown { "NUMA node unknown".to_string() } else { format!("NUMA node {id}") };
        let x = lay.texts.iter().find(|t| t.text == name).map_or(x0 + 360.0, |t| t.rect.x);
        g = g
            .add(
                Circle::new()
                    .set("cx", format!("{:.1}", x - 14.0))
                    .set("cy", format!("{y:.1}"))
                    .set("r", 7)
                    .set("fill", numa_colour(gi))
                    .set("stroke", "#222222"),
            )
            .add(text(x, y, name));
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
