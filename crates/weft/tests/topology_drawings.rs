//! The topology drawings (`weft topo show -o svg`, `--highlight`, `weft gpu allocate -o svg`): no
//! two texts overlap on any shipped topology (checked on the layout's boxes, not by eye), every
//! link kind has its own colour and dash, every text is readable on white, and a highlight marks
//! exactly the GPUs asked for and their NICs. The browser test (`report_browser.rs`) loads each
//! shipped topology's drawing in Chromium.

use std::collections::BTreeSet;
use std::process::{Command, Output};

use weft_topology::render::{Highlight, LinkKind, Marked, layout, nics_beside, to_svg_with};

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft runs")
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "weft failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

/// Every shipped topology: the simulator's built-in node types (DGX-1 V100, V100-SXM2, DGX and HGX
/// A100 NVSwitch, A100 PCIe with NVLink bridges, H100, the PCIe-only node, ...).
fn shipped() -> Vec<(String, weft_topology::NodeTopology)> {
    weft_sim::builtin_types()
        .into_iter()
        .map(|(name, _)| (name.to_string(), weft_sim::builtin_topology(name).expect("built-in topology")))
        .collect()
}

#[test]
fn no_two_texts_overlap_on_any_shipped_topology() {
    for (name, node) in shipped() {
        // With a highlighted set too: its legend line takes room.
        let half: Vec<usize> = (0..node.gpu_count() / 2).collect();
        let marked =
            Highlight { sets: vec![Marked { label: "chosen".into(), nics: nics_beside(&node, &half), gpus: half }] };
        for highlight in [Highlight::default(), marked] {
            let lay = layout(&node, &highlight);
            for (i, a) in lay.texts.iter().enumerate() {
                assert!(
                    a.rect.x >= 0.0
                        && a.rect.y >= 0.0
                        && a.rect.x + a.rect.w <= lay.width
                        && a.rect.y + a.rect.h <= lay.height,
                    "{name}: '{}' {:?} leaves the {}x{} picture",
                    a.text,
                    a.rect,
                    lay.width,
                    lay.height
                );
                for b in &lay.texts[i + 1..] {
                    assert!(
                        !a.rect.intersects(&b.rect),
                        "{name}: '{}' {:?} overlaps '{}' {:?}",
                        a.text,
                        a.rect,
                        b.text,
                        b.rect
                    );
                }
            }
            // Every NVLinked pair of a non-NVSwitch node has its label.
            let nv_pairs = (0..node.gpu_count())
                .flat_map(|a| (a + 1..node.gpu_count()).map(move |b| (a, b)))
                .filter(|&(a, b)| node.link(a, b).nvlinks > 0)
                .count();
            let uniform = nv_pairs == node.gpu_count() * (node.gpu_count() - 1) / 2
                && (0..node.gpu_count()).all(|b| b == 0 || node.link(0, b).nvlinks == node.link(0, 1).nvlinks);
            if !uniform {
                assert_eq!(lay.edge_labels.len(), nv_pairs, "{name}: one label per NVLinked pair");
            }
            // A label names its own edge only: no other NVLink edge passes through it (the centre
            // of DGX-1's cube mesh, where four chords cross, holds none).
            for ((pair, rect), text) in
                lay.edge_labels.iter().zip(lay.texts.iter().filter(|t| t.text.starts_with("NV")))
            {
                for (other, p, q) in &lay.edges {
                    assert!(
                        other == pair || !rect.meets_segment(*p, *q),
                        "{name}: the label '{}' of GPU{}-GPU{} sits on the edge GPU{}-GPU{}",
                        text.text,
                        pair.0,
                        pair.1,
                        other.0,
                        other.1
                    );
                }
            }
        }
    }
}

#[test]
fn each_link_kind_has_its_own_colour_and_its_own_dash() {
    let styles: Vec<_> = LinkKind::ALL.iter().map(|k| k.style()).collect();
    let colours: BTreeSet<_> = styles.iter().map(|s| s.colour).collect();
    let dashes: BTreeSet<_> = styles.iter().map(|s| s.dash).collect();
    assert_eq!(colours.len(), LinkKind::ALL.len(), "{styles:?}");
    assert_eq!(dashes.len(), LinkKind::ALL.len(), "{styles:?}");
    // And the drawings use them: each kind a shipped topology has is drawn in its style and named in
    // the legend.
    let mut seen = BTreeSet::new();
    for (name, node) in shipped() {
        let svg = to_svg_with(&node, &Highlight::default());
        for kind in layout(&node, &Highlight::default()).kinds {
            seen.insert(kind);
            let s = kind.style();
            let dash = s.dash.map_or(String::new(), |d| format!(" stroke-dasharray=\"{d}\""));
            let line = format!("class=\"{}\" stroke=\"{}\"{dash}", kind.class(), s.colour);
            assert!(svg.contains(&line), "{name}: {kind:?} drawn as {line}");
        }
    }
    assert!(seen.len() >= 4, "the shipped topologies show several kinds: {seen:?}");
}

/// WCAG relative luminance of `#rrggbb`.
fn luminance(hex: &str) -> f64 {
    let c = |i: usize| {
        let v = f64::from(u8::from_str_radix(&hex[i..i + 2], 16).expect("hex colour")) / 255.0;
        if v <= 0.03928 { v / 12.92 } else { ((v + 0.055) / 1.055).powf(2.4) }
    };
    0.2126 * c(1) + 0.7152 * c(3) + 0.0722 * c(5)
}

#[test]
fn every_text_is_readable_on_white() {
    for (name, node) in shipped() {
        let svg = to_svg_with(&node, &Highlight::default());
        for text in svg.split("<text").skip(1) {
            let head = text.split('>').next().expect("text element");
            let Some(fill) = head.split("fill=\"").nth(1).map(|f| &f[..7]) else { continue };
            let contrast = 1.05 / (luminance(fill) + 0.05);
            assert!(contrast >= 4.5, "{name}: text in {fill} has contrast {contrast:.2} on white: <text{head}>");
        }
    }
}

/// The GPUs (and NICs) a drawing marks: `data-gpu` of its highlight rings, `data-nic` of its NIC
/// outlines.
fn marked(svg: &str, attr: &str) -> BTreeSet<usize> {
    svg.split(&format!("{attr}=\""))
        .skip(1)
        .map(|s| s.split('"').next().expect("value").parse().expect("index"))
        .collect()
}

#[test]
fn highlight_marks_exactly_the_chosen_gpus_and_their_nics() {
    let node = weft_sim::builtin_topology("dgx1-v100").expect("built-in");
    let svg = ok(&weft(&["topo", "show", "builtin:dgx1-v100", "-o", "svg", "--highlight", "0,1,2,3"]));
    assert_eq!(marked(&svg, "data-gpu"), BTreeSet::from([0, 1, 2, 3]));
    let nics: BTreeSet<usize> = nics_beside(&node, &[0, 1, 2, 3]).into_iter().collect();
    assert!(!nics.is_empty(), "DGX-1's NICs sit beside GPU pairs");
    assert_eq!(marked(&svg, "data-nic"), nics);
    // Without --highlight nothing is marked.
    let plain = ok(&weft(&["topo", "show", "builtin:dgx1-v100", "-o", "svg"]));
    assert!(marked(&plain, "data-gpu").is_empty() && marked(&plain, "data-nic").is_empty());
    // A GPU the node does not have is an error naming it.
    let out = weft(&["topo", "show", "builtin:dgx1-v100", "-o", "svg", "--highlight", "0,9"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--highlight") && err.contains("GPU9") && err.contains("8 GPUs"), "{err}");
    // --highlight draws: with another output it is refused.
    let out = weft(&["topo", "show", "builtin:dgx1-v100", "--highlight", "0"]);
    assert!(!out.status.success(), "--highlight without -o svg");

    // weft gpu allocate -o svg draws the set it chose.
    let args = ["gpu", "allocate", "-t", "builtin:hgx-h100", "-k", "4", "--available", "1,2,3,5,6,7"];
    let chosen: serde_json::Value =
        serde_json::from_str(&ok(&weft(&[&args[..], &["-o", "json"]].concat()))).expect("JSON");
    let chosen: BTreeSet<usize> =
        chosen["gpus"].as_array().expect("gpus").iter().map(|g| g.as_u64().expect("index") as usize).collect();
    let svg = ok(&weft(&[&args[..], &["-o", "svg"]].concat()));
    assert_eq!(marked(&svg, "data-gpu"), chosen);
    let h100 = weft_sim::builtin_topology("hgx-h100").expect("built-in");
    let gpus: Vec<usize> = chosen.iter().copied().collect();
    assert_eq!(marked(&svg, "data-nic"), nics_beside(&h100, &gpus).into_iter().collect());
    assert!(svg.starts_with("<svg") && svg.contains("chosen"), "a picture with the set in its legend");
}
