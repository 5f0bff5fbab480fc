//! `weft simulate --report FILE.html`: one self-contained HTML file (inline CSS and SVG, no script,
//! no font, nothing fetched) with the scenario, each policy's timeline, the distributions of its
//! pods' bandwidths and VF nearness, utilisation per node type, the pods it could not place and
//! why, and a few nodes drawn with the pods each policy put there. docs/simulate.md ("The HTML
//! report") says what each chart shows and how it is computed.
//!
//! [`Collector`] takes every pod's [`PodOutcome`] as the engine decides it (the record callback of
//! `simulate_recorded`, as `--pods-out` does) and keeps only what the charts need: a bounded
//! number of timeline points, the bandwidths of placed multi-GPU pods, counts. Charts are drawn by
//! plotters' SVG backend into strings; the node pictures are weft-topology's renderer with each
//! pod's GPUs highlighted.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use weft_sim::{Cluster, NotPlaced, PlacementPolicy, PodOutcome, SimPod, SimReport};
use weft_topology::PcieRelation;
use weft_topology::render::{Highlight, Marked, nics_beside, to_svg_with};

/// Most timeline points kept per policy (the stream is sampled every `pods / POINTS` arrivals).
pub const POINTS: usize = 400;
/// Most pods not placed listed per policy (the counts cover them all).
pub const FAILED_SAMPLE: usize = 20;
/// Most nodes drawn per policy (the first node of each node type, in cluster order).
pub const SAMPLE_NODES: usize = 4;

/// What the report says about how it was run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Where the cluster came from (a file, or the embedded cluster), and any scaling.
    pub cluster: String,
    /// Where the workload came from (a file, or the generator's settings).
    pub workload: String,
    /// The seed.
    pub seed: u64,
    /// weft's score settings.
    pub score: String,
}

/// The timeline at one arrival.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Point {
    hours: f64,
    now: weft_sim::ClusterNow,
}

/// A pod running on a drawn node.
#[derive(Clone, Debug)]
struct Running {
    pod: String,
    gpus: Vec<usize>,
    end: f64,
}

/// A pod not placed, as listed.
#[derive(Clone, Debug)]
struct Failed {
    index: usize,
    pod: String,
    gpus: usize,
    vfs: usize,
    hours: f64,
    why: NotPlaced,
}

/// What one policy's run leaves for the report.
#[derive(Clone, Debug)]
struct Trace {
    policy: PlacementPolicy,
    points: Vec<Point>,
    rings: Vec<f64>,
    pairs: Vec<f64>,
    /// Per placed VF: its relation to the nearest of its pod's GPUs, by [`RELATIONS`] position.
    vf_relations: [usize; RELATIONS.len()],
    gpu_seconds: BTreeMap<String, f64>,
    not_placed: BTreeMap<&'static str, usize>,
    failed: Vec<Failed>,
    /// Pods running on each drawn node, until the snapshot.
    running: Vec<Vec<Running>>,
    /// The pods on each drawn node at the snapshot.
    snapshot: Option<Vec<Vec<Running>>>,
}

/// VF relations from nearest to farthest (the x axis of the nearness chart).
const RELATIONS: [&str; 6] = ["PIX", "PXB", "PHB", "NODE", "SYS", "?"];

fn relation_rank(r: Option<PcieRelation>) -> usize {
    match r {
        Some(PcieRelation::Pix | PcieRelation::SameBoard) => 0,
        Some(PcieRelation::Pxb) => 1,
        Some(PcieRelation::Phb) => 2,
        Some(PcieRelation::Node) => 3,
        Some(PcieRelation::Sys) => 4,
        None => 5,
    }
}

/// Keeps what the report needs of every [`PodOutcome`].
pub struct Collector<'c> {
    cluster: &'c Cluster,
    pods: usize,
    step: usize,
    /// The arrival whose cluster the node pictures show: the middle of the stream.
    snapshot_at: usize,
    snapshot_hours: f64,
    /// Drawn nodes: their position in the cluster.
    nodes: Vec<usize>,
    /// First arrival to last departure, seconds (the span utilisation is taken over).
    span: (f64, f64),
    traces: Vec<Trace>,
}

impl<'c> Collector<'c> {
    /// A collector for `pods` run under `policies` on `cluster`.
    pub fn new(cluster: &'c Cluster, pods: &[SimPod], policies: &[PlacementPolicy]) -> Collector<'c> {
        let mut nodes = Vec::new();
        let mut types = Vec::new();
        for (i, n) in cluster.nodes.iter().enumerate() {
            if !types.contains(&n.node_type) && nodes.len() < SAMPLE_NODES {
                types.push(n.node_type);
                nodes.push(i);
            }
        }
        let start = pods.iter().map(|p| p.arrival).fold(f64::INFINITY, f64::min);
        let end = pods.iter().map(|p| p.arrival + p.duration).fold(f64::NEG_INFINITY, f64::max);
        let snapshot_at = pods.len() / 2;
        let traces = policies
            .iter()
            .map(|&policy| Trace {
                policy,
                points: Vec::with_capacity(POINTS + 1),
                rings: Vec::new(),
                pairs: Vec::new(),
                vf_relations: [0; RELATIONS.len()],
                gpu_seconds: BTreeMap::new(),
                not_placed: BTreeMap::new(),
                failed: Vec::new(),
                running: vec![Vec::new(); nodes.len()],
                snapshot: None,
            })
            .collect();
        Collector {
            cluster,
            pods: pods.len(),
            step: pods.len().div_ceil(POINTS).max(1),
            snapshot_at,
            snapshot_hours: pods.get(snapshot_at).map_or(0.0, |p| p.arrival / 3600.0),
            nodes,
            span: if start.is_finite() && end > start { (start, end) } else { (0.0, 0.0) },
            traces,
        }
    }

    /// Take one pod's outcome (the record callback).
    pub fn add(&mut self, o: &PodOutcome<'_>) {
        let Some(trace) = self.traces.iter_mut().find(|t| t.policy == o.policy) else { return };
        if o.index.is_multiple_of(self.step) || o.index + 1 == self.pods {
            trace.points.push(Point { hours: o.pod.arrival / 3600.0, now: o.cluster });
        }
        match &o.placement {
            Ok(p) => {
                if let Some(r) = p.ring_gbps {
                    trace.rings.push(r);
                }
                if let Some(m) = p.mean_pair_gbps {
                    trace.pairs.push(m);
                }
                *trace.gpu_seconds.entry(p.node_type.to_string()).or_default() +=
                    p.gpus.len() as f64 * (p.end - p.start);
                if !p.vfs.is_empty()
                    && let Some(t) = self.cluster.types.iter().find(|t| t.name == p.node_type)
                {
                    let topo = &t.topology;
                    for vf in &p.vfs {
                        let nic = topo.nics.iter().position(|n| n.name == vf.nic);
                        let rel = nic.and_then(|k| p.gpus.iter().filter_map(|&g| topo.nic_link(g, k)).max());
                        trace.vf_relations[relation_rank(rel)] += 1;
                    }
                }
                if trace.snapshot.is_none()
                    && let Some(slot) = self.nodes.iter().position(|&n| self.cluster.nodes[n].name == p.node)
                {
                    trace.running[slot].push(Running { pod: o.pod.name.clone(), gpus: p.gpus.clone(), end: p.end });
                }
            }
            Err(why) => {
                *trace.not_placed.entry(why.as_str()).or_default() += 1;
                if trace.failed.len() < FAILED_SAMPLE {
                    trace.failed.push(Failed {
                        index: o.index,
                        pod: o.pod.name.clone(),
                        gpus: o.pod.gpus,
                        vfs: o.pod.vf_count(),
                        hours: o.pod.arrival / 3600.0,
                        why: *why,
                    });
                }
            }
        }
        if o.index == self.snapshot_at && trace.snapshot.is_none() {
            let at = o.pod.arrival;
            let running = std::mem::take(&mut trace.running);
            trace.snapshot =
                Some(running.into_iter().map(|r| r.into_iter().filter(|p| p.end > at).collect()).collect());
        }
    }
}

/// Write the report to `file` (made at `path` before the run).
pub fn write(
    path: &Path,
    mut file: std::fs::File,
    scenario: &Scenario,
    report: &SimReport,
    c: &Collector<'_>,
) -> anyhow::Result<()> {
    let html = render(scenario, report, c)?;
    std::io::Write::write_all(&mut file, html.as_bytes())
        .with_context(|| format!("--report: cannot write {}", path.display()))
}

/// Escape text for HTML element content and double-quoted attributes.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:Helvetica,Arial,sans-serif;margin:24px auto;max-width:1300px;color:#222;\
line-height:1.4}h1{font-size:26px}h2{margin-top:36px;border-bottom:1px solid #ccc}table{border-collapse:collapse;\
margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f2f2f2}td.n{text-align:\
right}figure{display:inline-block;margin:8px;vertical-align:top}figcaption{font-size:13px;color:#444;max-width:\
600px}.nodes figure svg{width:100%;height:auto}.nodes figure{width:410px}p.note{color:#444;font-size:14px;\
max-width:1000px}.failed{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}";

/// Chart size, pixels.
const CHART: (u32, u32) = (620, 360);

/// A policy's colour on every chart.
fn policy_colour(i: usize) -> RGBColor {
    const COLOURS: [RGBColor; 4] =
        [RGBColor(0, 114, 178), RGBColor(213, 94, 0), RGBColor(0, 158, 115), RGBColor(204, 121, 167)];
    COLOURS[i % COLOURS.len()]
}

fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing a chart: {e}")
}

/// The range of `values` padded a little, or 0..1 when empty or flat.
fn range(values: impl Iterator<Item = f64>, from_zero: bool) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if !lo.is_finite() || !hi.is_finite() {
        return 0.0..1.0;
    }
    if hi - lo < 1e-9 {
        return lo..lo + 1.0;
    }
    lo..hi + (hi - lo) * 0.05
}

/// Tick labels with as many decimals as the axis span needs: none from a span of 10 up, one from
/// 1, two below.
fn tick_format(r: &std::ops::Range<f64>) -> impl Fn(&f64) -> String {
    let span = r.end - r.start;
    let decimals = if span >= 10.0 {
        0
    } else if span >= 1.0 {
        1
    } else {
        2
    };
    move |v: &f64| format!("{v:.decimals$}")
}

/// A line chart: one line per policy.
fn line_chart(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    y_range: Option<std::ops::Range<f64>>,
) -> anyhow::Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, CHART).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let xs = range(series.iter().flat_map(|(_, p)| p.iter().map(|v| v.0)), false);
        // A timeline gets a third of headroom for its legend, top right, above the lines; a CDF
        // (0 to 1, y_range given) keeps its legend bottom right, under the steps.
        let legend_at =
            if y_range.is_some() { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperRight };
        let ys = y_range.unwrap_or_else(|| {
            let r = range(series.iter().flat_map(|(_, p)| p.iter().map(|v| v.1)), true);
            r.start..r.start + (r.end - r.start) * 1.35
        });
        let (x_fmt, y_fmt) = (tick_format(&xs), tick_format(&ys));
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(xs.clone(), ys.clone())
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .x_desc(x_desc)
            .y_desc(y_desc)
            .light_line_style(RGBColor(238, 238, 238))
            .draw()
            .map_err(plot_err)?;
        for (i, (name, points)) in series.iter().enumerate() {
            let colour = policy_colour(i);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(150, 150, 150))
            .position(legend_at)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(out)
}

/// The empirical CDF of `values`: (value, share of values ≤ it), one point per distinct value,
/// starting at (min, 0) so the first step shows.
fn cdf(values: &[f64]) -> Vec<(f64, f64)> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let mut out = Vec::new();
    if let Some(&first) = v.first() {
        out.push((first, 0.0));
    }
    for (i, x) in v.iter().enumerate() {
        if v.get(i + 1) != Some(x) {
            out.push((*x, (i + 1) as f64 / n));
        }
    }
    out
}

/// A step line through `cdf`'s points (horizontal, then vertical).
fn steps(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &(x, y)) in points.iter().enumerate() {
        if i > 0 {
            out.push((x, points[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

/// Grouped bars: per category, one bar per policy.
fn bar_chart(
    title: &str,
    y_desc: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> anyhow::Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (CHART.0.max(120 * categories.len() as u32), CHART.1))
            .into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let top = series.iter().flat_map(|(_, v)| v.iter().copied()).fold(0.0f64, f64::max).max(0.01) * 1.1;
        let n = categories.len().max(1) as f64;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..n, 0.0..top)
            .map_err(plot_err)?;
        let names = |x: &f64| {
            let i = x.floor();
            if (x - i - 0.5).abs() < 1e-6 {
                categories.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * categories.len() + 1)
            .x_label_formatter(&names)
            .y_desc(y_desc)
            .x_desc("node type")
            .light_line_style(RGBColor(238, 238, 238))
            .draw()
            .map_err(plot_err)?;
        let width = 0.8 / series.len().max(1) as f64;
        for (p, (name, values)) in series.iter().enumerate() {
            let colour = policy_colour(p);
            chart
                .draw_series(values.iter().enumerate().map(|(c, &v)| {
                    let x = c as f64 + 0.1 + width * p as f64;
                    Rectangle::new([(x, 0.0), (x + width * 0.95, v)], colour.filled())
                }))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(150, 150, 150))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(out)
}

fn figure(html: &mut String, id: &str, caption: &str, svg: &str) {
    let _ =
        writeln!(html, "<figure class=\"chart\" id=\"{id}\">{svg}<figcaption>{}</figcaption></figure>", esc(caption));
}

/// The whole page.
pub fn render(scenario: &Scenario, report: &SimReport, c: &Collector<'_>) -> anyhow::Result<String> {
    let names: Vec<String> = c.traces.iter().map(|t| t.policy.name().to_string()).collect();
    let mut html = String::with_capacity(1 << 20);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>weft simulate report</title>\
         <style>{STYLE}</style></head><body>\n<h1>weft simulate report</h1>\n"
    );

    // The scenario.
    let types: Vec<String> = report.cluster.node_types.iter().map(|(k, v)| format!("{v}× {k}")).collect();
    let sizes: Vec<String> = report.workload.by_size.iter().map(|(k, v)| format!("{v}× {k}-GPU")).collect();
    let rows = [
        (
            "cluster",
            format!(
                "{} ({} nodes, {} GPUs, {} SR-IOV VFs: {})",
                scenario.cluster,
                report.cluster.nodes,
                report.cluster.gpus,
                report.cluster.vfs,
                types.join(", ")
            ),
        ),
        (
            "workload",
            format!(
                "{} ({} pods: {}; {} asking for VFs)",
                scenario.workload,
                report.workload.pods,
                sizes.join(", "),
                report.workload.vf_pods
            ),
        ),
        (
            "offered load",
            format!("{:.0}% of GPU capacity while pods are present", report.workload.offered_load * 100.0),
        ),
        ("seed", scenario.seed.to_string()),
        ("policies", names.join(", ")),
        ("weft's score", scenario.score.clone()),
    ];
    html.push_str("<h2>Scenario</h2>\n<table>");
    for (k, v) in rows {
        let _ = write!(html, "<tr><th>{k}</th><td>{}</td></tr>", esc(&v));
    }
    html.push_str("</table>\n");

    // The headline numbers, as the terminal table has them.
    html.push_str(
        "<h2>Summary</h2>\n<table><tr><th>policy</th><th>placed</th><th>not placed</th><th>short of VFs</th>\
         <th>ring GB/s mean</th><th>ring GB/s p10</th><th>pair GB/s mean</th><th>VFs by GPUs</th>\
         <th>stranded GPUs (mean)</th></tr>",
    );
    for p in &report.policies {
        let near = if p.vf_pods_placed == 0 { "-".to_string() } else { format!("{:.1}%", p.vf_near_gpu_share * 100.0) };
        let _ = write!(
            html,
            "<tr><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{:.1}</td>\
             <td class=n>{:.1}</td><td class=n>{:.1}</td><td class=n>{near}</td><td class=n>{:.1}</td></tr>",
            esc(&p.policy),
            p.placed,
            p.unplaced,
            p.unplaced_for_vfs,
            p.mean_ring_bandwidth_gbps,
            p.p10_ring_bandwidth_gbps,
            p.mean_pair_bandwidth_gbps,
            p.mean_stranded_gpus
        );
    }
    html.push_str("</table>\n");

    // Over time.
    html.push_str("<h2>Over time</h2>\n<p class=note>Sampled at every ");
    let _ = writeln!(
        html,
        "{} arrivals (at most {POINTS} points per policy), each point the cluster just after that \
         arrival's decision. There is no queue: a pod no node can take on arrival is not placed and \
         does not wait, so the pods waiting are always none and the lost ones are counted instead.</p>",
        c.step
    );
    let timeline = |f: &dyn Fn(&weft_sim::ClusterNow) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        c.traces
            .iter()
            .map(|t| (t.policy.name().to_string(), t.points.iter().map(|p| (p.hours, f(&p.now))).collect()))
            .collect()
    };
    type Metric<'a> = &'a dyn Fn(&weft_sim::ClusterNow) -> f64;
    let charts: [(&str, &str, &str, Metric<'_>, &str); 4] = [
        (
            "running",
            "Pods running",
            "pods",
            &|n| n.running_pods as f64,
            "Pods placed and still running after each arrival.",
        ),
        (
            "not-placed",
            "Pods not placed (so far)",
            "pods",
            &|n| n.not_placed as f64,
            "Pods that no node could take on arrival, counted from the start of the stream.",
        ),
        ("gpus-in-use", "GPUs in use", "GPUs", &|n| n.gpus_in_use as f64, "GPUs held by running pods."),
        (
            "stranded",
            "Stranded GPUs",
            "GPUs",
            &|n| n.stranded_gpus as f64,
            "Free GPUs whose NVLink peers on their node are all busy: they can no longer form an NVLinked set.",
        ),
    ];
    for (id, title, unit, f, caption) in charts {
        figure(&mut html, id, caption, &line_chart(title, "time (hours)", unit, &timeline(f), None)?);
    }

    // Distributions.
    html.push_str("<h2>Distributions over placed pods</h2>\n");
    let cdfs = |f: &dyn Fn(&Trace) -> &Vec<f64>| -> Vec<(String, Vec<(f64, f64)>)> {
        c.traces.iter().map(|t| (t.policy.name().to_string(), steps(&cdf(f(t))))).collect()
    };
    figure(
        &mut html,
        "ring-cdf",
        "Per placed multi-GPU pod, the bandwidth of the best ring over its GPUs (its slowest hop: what a ring \
         all-reduce gets, GB/s per direction); the share of pods at or below each value. Further right is better.",
        &line_chart(
            "Ring (bottleneck) bandwidth, CDF",
            "GB/s per direction",
            "share of pods",
            &cdfs(&|t| &t.rings),
            Some(0.0..1.0),
        )?,
    );
    figure(
        &mut html,
        "pair-cdf",
        "Per placed multi-GPU pod, the mean bandwidth over its GPU pairs; the share of pods at or below each value.",
        &line_chart(
            "Mean pair bandwidth, CDF",
            "GB/s per direction",
            "share of pods",
            &cdfs(&|t| &t.pairs),
            Some(0.0..1.0),
        )?,
    );
    let near: Vec<(String, Vec<(f64, f64)>)> = c
        .traces
        .iter()
        .map(|t| {
            let total: usize = t.vf_relations.iter().sum();
            let mut acc = 0usize;
            let points: Vec<(f64, f64)> = (0..RELATIONS.len() - 1)
                .map(|i| {
                    acc += t.vf_relations[i];
                    (i as f64, if total == 0 { 0.0 } else { acc as f64 / total as f64 })
                })
                .collect();
            (t.policy.name().to_string(), steps(&points))
        })
        .collect();
    figure(
        &mut html,
        "vf-cdf",
        "Per placed VF, its NIC's PCIe relation to the nearest of its pod's GPUs, from nearest (PIX) to \
         farthest (SYS); the share of VFs at least that near. PIX and PXB keep GPUDirect RDMA off the host bridge.",
        &relation_chart(&near)?,
    );

    // Utilisation per node type.
    let hours = (c.span.1 - c.span.0).max(0.0);
    let mut type_gpus: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &c.cluster.nodes {
        let t = &c.cluster.types[n.node_type];
        *type_gpus.entry(t.name.as_str()).or_default() += t.topology.gpu_count();
    }
    let categories: Vec<String> = type_gpus.keys().map(|k| k.to_string()).collect();
    let util: Vec<(String, Vec<f64>)> = c
        .traces
        .iter()
        .map(|t| {
            let v = type_gpus
                .iter()
                .map(|(name, gpus)| {
                    let used = t.gpu_seconds.get(*name).copied().unwrap_or(0.0);
                    if hours > 0.0 && *gpus > 0 { used / (hours * *gpus as f64) } else { 0.0 }
                })
                .collect();
            (t.policy.name().to_string(), v)
        })
        .collect();
    html.push_str("<h2>Utilisation per node type</h2>\n");
    figure(
        &mut html,
        "utilisation",
        "GPU-seconds held by placed pods on each node type, over that type's GPUs times the span from the first \
         arrival to the last departure.",
        &bar_chart("GPU utilisation per node type", "share of GPU time", &categories, &util)?,
    );

    // Not placed.
    html.push_str("<h2>Pods not placed</h2>\n<table><tr><th>policy</th><th>no node had the GPUs free</th><th>GPUs free but not the VFs</th></tr>");
    for t in &c.traces {
        let get = |w: NotPlaced| t.not_placed.get(w.as_str()).copied().unwrap_or(0);
        let _ = write!(
            html,
            "<tr><td>{}</td><td class=n>{}</td><td class=n>{}</td></tr>",
            t.policy.name(),
            get(NotPlaced::NoGpus),
            get(NotPlaced::ShortOfVfs)
        );
    }
    html.push_str("</table>\n<div class=failed>");
    for t in &c.traces {
        if t.failed.is_empty() {
            continue;
        }
        let _ = write!(
            html,
            "<div><h3>{}: the first {} not placed</h3><table><tr><th>#</th><th>pod</th><th>GPUs</th><th>VFs</th><th>arrival (h)</th><th>why</th></tr>",
            t.policy.name(),
            t.failed.len()
        );
        for f in &t.failed {
            let _ = write!(
                html,
                "<tr><td class=n>{}</td><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{:.2}</td><td>{}</td></tr>",
                f.index,
                esc(&f.pod),
                f.gpus,
                f.vfs,
                f.hours,
                f.why.as_str()
            );
        }
        html.push_str("</table></div>\n");
    }

    // Nodes.
    let _ = write!(
        html,
        "</div>\n<h2>Nodes at mid-stream</h2>\n<p class=note>The first node of each node type (at most {SAMPLE_NODES}) \
         as it was just after arrival {} ({:.2} h): each pod running there is a coloured ring around its GPUs \
         and an outline of the NICs beside them, named in the legend.</p>\n",
        c.snapshot_at, c.snapshot_hours
    );
    for (slot, &n) in c.nodes.iter().enumerate() {
        let node = &c.cluster.nodes[n];
        let mut topo = (*c.cluster.types[node.node_type].topology).clone();
        topo.name = Some(node.name.clone());
        let _ = write!(html, "<div class=nodes><h3>{}</h3>", esc(&node.name));
        for t in &c.traces {
            let pods = t.snapshot.as_ref().and_then(|s| s.get(slot)).cloned().unwrap_or_default();
            let sets = pods
                .iter()
                .map(|p| Marked { label: p.pod.clone(), nics: nics_beside(&topo, &p.gpus), gpus: p.gpus.clone() })
                .collect();
            let svg = to_svg_with(&topo, &Highlight { sets });
            let _ = write!(
                html,
                "<figure class=\"node\">{svg}<figcaption>{}: {} pods</figcaption></figure>",
                t.policy.name(),
                pods.len()
            );
        }
        html.push_str("</div>\n");
    }
    html.push_str("<p class=note>Written by weft simulate --report. One file, nothing fetched.</p></body></html>\n");
    Ok(html)
}

/// The VF nearness CDF: x is the relation, from PIX to SYS.
fn relation_chart(series: &[(String, Vec<(f64, f64)>)]) -> anyhow::Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, CHART).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("VF nearness to the pod's GPUs, CDF", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(-0.2..4.2, 0.0..1.0)
            .map_err(plot_err)?;
        let names = |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && (0.0..5.0).contains(&i) {
                RELATIONS[i as usize].to_string()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_labels(5)
            .x_label_formatter(&names)
            .x_desc("PCIe relation of the VF's NIC to the nearest GPU of its pod")
            .y_desc("share of VFs at least this near")
            .light_line_style(RGBColor(238, 238, 238))
            .draw()
            .map_err(plot_err)?;
        for (i, (name, points)) in series.iter().enumerate() {
            let colour = policy_colour(i);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(150, 150, 150))
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_steps_through_each_distinct_value() {
        assert_eq!(cdf(&[3.0, 1.0, 3.0, 2.0]), vec![(1.0, 0.0), (1.0, 0.25), (2.0, 0.5), (3.0, 1.0)]);
        assert!(cdf(&[]).is_empty());
        assert_eq!(steps(&[(1.0, 0.0), (2.0, 0.5)]), vec![(1.0, 0.0), (2.0, 0.0), (2.0, 0.5)]);
    }

    /// What the collector keeps agrees with the engine's report: the timeline ends at the run's
    /// counts, the bandwidths are the placed multi-GPU pods' (same mean), the reasons add up, the
    /// GPU time is the placed pods', and the drawn nodes hold only pods running at the snapshot.
    #[test]
    fn the_collector_agrees_with_the_report() {
        let cluster = weft_sim::ClusterSpec::embedded_default().scaled(12).build(None).expect("cluster");
        let pods = weft_sim::Generate::default_for(cluster.total_gpus(), 2000, 5).pods().expect("pods");
        let policies = PlacementPolicy::ALL;
        let mut c = Collector::new(&cluster, &pods, &policies);
        let report = weft_sim::simulate_recorded(
            &cluster,
            &pods,
            &policies,
            &weft_alloc::ScoreConfig::default(),
            5,
            &mut |_, _| {},
            &mut |o| {
                c.add(o);
                Ok(())
            },
        )
        .expect("run");
        for (t, p) in c.traces.iter().zip(&report.policies) {
            let last = t.points.last().expect("points").now;
            assert_eq!((last.placed, last.not_placed), (p.placed, p.unplaced), "{}", p.policy);
            assert!(t.points.len() <= POINTS + 1 && t.points.len() >= POINTS.min(pods.len()) / 2, "{}", t.points.len());
            assert!(t.points.windows(2).all(|w| w[0].hours <= w[1].hours), "in time order");
            assert_eq!(t.rings.len(), p.multi_gpu_placed);
            let mean = t.rings.iter().sum::<f64>() / t.rings.len() as f64;
            assert!((mean - p.mean_ring_bandwidth_gbps).abs() < 1e-9, "{mean} vs {}", p.mean_ring_bandwidth_gbps);
            assert_eq!(t.not_placed.get("short-of-vfs").copied().unwrap_or(0), p.unplaced_for_vfs);
            assert_eq!(t.not_placed.values().sum::<usize>(), p.unplaced);
            assert_eq!(t.failed.len(), p.unplaced.min(FAILED_SAMPLE));
            assert_eq!(t.vf_relations.iter().sum::<usize>() > 0, p.vf_pods_placed > 0);
            let at = pods[c.snapshot_at].arrival;
            let drawn = t.snapshot.as_ref().expect("snapshot taken");
            assert_eq!(drawn.len(), c.nodes.len());
            for running in drawn.iter().flatten() {
                let pod = pods.iter().find(|q| q.name == running.pod).expect("a pod of the stream");
                assert!(pod.arrival <= at && running.end > at, "{} runs at the snapshot", running.pod);
                assert_eq!(running.gpus.len(), pod.gpus);
            }
        }
        // GPU time: the placed pods' GPUs times their durations, whatever the node type.
        let weft: f64 = c.traces[0].gpu_seconds.values().sum();
        assert!(weft > 0.0);
        let html = render(
            &Scenario { cluster: "c".into(), workload: "w <&>".into(), seed: 5, score: "s".into() },
            &report,
            &c,
        )
        .expect("render");
        assert!(html.contains("w &lt;&amp;&gt;") && !html.contains("w <&>"), "scenario text escaped");
        assert_eq!(html.matches("<figure class=\"chart\"").count(), 8);
    }

    #[test]
    fn html_text_is_escaped() {
        assert_eq!(esc("<a href=\"x\">&</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;");
    }
}
