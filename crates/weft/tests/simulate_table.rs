//! `weft simulate`'s report in a terminal: every invocation README.md and docs/simulate.md show
//! prints lines of at most 100 columns, `--wide` has every column, and the offered load of a short
//! custom workload is over the time its pods are present.
//!
//! The documented commands are read from the documents themselves: each `weft simulate` line of a
//! `sh` fence (a `| ...` after it dropped) and each `<!-- generated: weft simulate ... -->` block's
//! command. They run in a directory holding the files they name (`cluster.yaml`, `pods.yaml`,
//! ...: the docs' own examples) with `crates/` linked to the repository's, so
//! `crates/weft-sim/scenarios/matrix.yaml` is the shipped matrix. Some are made cheaper for a debug
//! test, none in a way that changes the shape of what is printed: a `--matrix` run takes its small
//! cells only (`--small-only`, CI's smoke run; the 5,000-node cells print the same lines with bigger
//! numbers), and an `--optimum` run takes one instance of at most 100 pods with a 1 s time limit
//! (the program of 12 nodes x 300 pods alone takes minutes unoptimised).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const COLUMNS: usize = 100;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// `weft simulate` commands documented in `text`: fenced `sh` lines (comments and pipes dropped) and
/// generated blocks' commands (`| grep` dropped).
fn documented_commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_sh = trimmed == "```sh";
            continue;
        }
        if in_sh && trimmed.starts_with("weft simulate") {
            let command = trimmed.split(" #").next().unwrap_or(trimmed);
            let command = command.split(" | ").next().unwrap_or(command).trim();
            out.push(command.to_string());
        }
        if let Some(rest) =
            trimmed.strip_prefix("<!-- generated: ").or_else(|| trimmed.strip_prefix("<!-- generated, regen only: "))
        {
            let command = rest.trim_end_matches("-->").trim();
            let command = command.split(" | grep ").next().unwrap_or(command).trim();
            if command.starts_with("weft simulate") {
                out.push(command.to_string());
            }
        }
    }
    out
}

/// The files the documented commands name, from the docs' examples.
fn write_fixtures(dir: &Path) {
    let cluster = "apiVersion: weft.io/v1alpha1\nkind: SimCluster\nnodeTypes:\n  \
                   - {name: dgx-a100, topology: builtin:dgx-a100, count: 8}\n  \
                   - {name: h100, topology: builtin:hgx-h100, count: 8, vfsPerNic: 4, physnet: fabric}\n  \
                   - {name: old, topology: builtin:dgx1-v100, count: 4, vfsPerNic: 0}\n";
    std::fs::write(dir.join("cluster.yaml"), cluster).expect("test fixture");
    std::fs::write(dir.join("my-cluster.yaml"), cluster).expect("test fixture");
    let small = "apiVersion: weft.io/v1alpha1\nkind: SimCluster\nnodeTypes:\n  \
                 - {name: dgx-a100, topology: builtin:dgx-a100, count: 4}\n  \
                 - {name: pcie, topology: builtin:pcie-8gpu, count: 4}\n";
    std::fs::write(dir.join("small.yaml"), small).expect("test fixture");
    std::fs::write(dir.join("pods.yaml"), six_pods()).expect("test fixture");
    let scenario = std::fs::read_to_string(repo_root().join("crates/weft-sim/scenarios/video-pipeline.yaml"))
        .expect("test fixture");
    std::fs::write(dir.join("scenario.yaml"), scenario).expect("test fixture");
    #[cfg(unix)]
    std::os::unix::fs::symlink(repo_root().join("crates"), dir.join("crates")).expect("test fixture");
}

/// Six Pod manifests arriving within 5 s, each running an hour: 1, 2, 4, 8, 1 and 2 GPUs (18 in
/// all), the second with a VF of `fabric`.
fn six_pods() -> String {
    let mut text = String::new();
    for (i, gpus) in [1, 2, 4, 8, 1, 2].into_iter().enumerate() {
        let vf = if i == 1 { ", sriov.weft.io/fabric: 1" } else { "" };
        text.push_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: trainer-{i}\n  annotations: \
             {{sim.weft.io/arrival: \"{i}\", sim.weft.io/duration: \"3600\"}}\nspec:\n  containers:\n    \
             - name: main\n      image: nvcr.io/nvidia/pytorch:24.05-py3\n      resources: {{limits: \
             {{nvidia.com/gpu: {gpus}{vf}}}}}\n---\n"
        ));
    }
    text
}

/// Run `weft` with the arguments of `command` (`weft simulate ...`) in `dir`.
fn run(dir: &Path, command: &str) -> Output {
    let mut args: Vec<String> = command.split_whitespace().skip(1).map(str::to_string).collect();
    if args.iter().any(|a| a == "--matrix") && !args.iter().any(|a| a == "--small-only") {
        args.push("--small-only".into());
    }
    if args.iter().any(|a| a == "--optimum") {
        let mut cheap = Vec::new();
        let mut words = args.into_iter();
        while let Some(a) = words.next() {
            match a.as_str() {
                "--instances" | "--time-limit" => {
                    words.next();
                }
                "--pods" => {
                    let n: usize = words.next().and_then(|n| n.parse().ok()).unwrap_or(100);
                    cheap.extend(["--pods".to_string(), n.min(100).to_string()]);
                }
                _ => cheap.push(a),
            }
        }
        if !cheap.iter().any(|a| a == "--pods" || a == "--workload") {
            cheap.extend(["--pods".into(), "100".into()]);
        }
        cheap.extend(["--instances".into(), "1".into(), "--time-limit".into(), "1s".into()]);
        args = cheap;
    }
    Command::new(env!("CARGO_BIN_EXE_weft")).args(&args).current_dir(dir).output().expect("weft runs")
}

/// Lines of `text` wider than [`COLUMNS`] (in characters: the box drawing, `×` and `≥` are one
/// column each), with their width.
fn too_wide(text: &str) -> Vec<(usize, String)> {
    text.lines().map(|l| (l.chars().count(), l.to_string())).filter(|(w, _)| *w > COLUMNS).collect()
}

#[test]
fn every_documented_simulate_invocation_prints_lines_of_at_most_100_columns() {
    let root = repo_root();
    let mut commands = Vec::new();
    for doc in ["README.md", "docs/simulate.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        commands.extend(documented_commands(&text));
    }
    commands.sort();
    commands.dedup();
    assert!(commands.len() >= 15, "the docs show many invocations, found {commands:?}");
    for shown in ["weft simulate", "weft simulate --nodes 5000 --pods 100000", "weft simulate --pipelines"] {
        assert!(commands.iter().any(|c| c == shown), "{shown} is documented: {commands:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    write_fixtures(dir.path());
    let mut problems = Vec::new();
    for command in &commands {
        let out = run(dir.path(), command);
        if !out.status.success() {
            problems.push(format!("'{command}' failed: {}", String::from_utf8_lossy(&out.stderr)));
            continue;
        }
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(!stdout.is_empty(), "'{command}' printed nothing");
        // Per-pod records on stdout are for programs: one record a line, however long.
        if command.contains("--pods-out -") {
            continue;
        }
        for (width, line) in too_wide(&stdout) {
            problems.push(format!("'{command}': {width} columns: {line}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_documented_commands_are_found_in_fences_generated_blocks_and_code_spans() {
    let text = "```sh\nweft simulate --pods 10   # comment\nweft simulate --pods-out - | grep x\nother\n```\n\
                <!-- generated: weft simulate --seed 5 | grep x -->\n\
                Run `weft simulate --pipelines`.\n";
    assert_eq!(
        documented_commands(text),
        ["weft simulate --pods 10", "weft simulate --pods-out -", "weft simulate --seed 5"]
    );
}

/// The six pods hold 18 of the 672 GPUs for about an hour: 3% of the cluster while they are present
/// (it was 1,929%, their GPU-hours over the 5 s they took to arrive).
#[test]
fn a_short_custom_workload_offers_its_load_over_the_time_its_pods_are_present() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pods.yaml"), six_pods()).unwrap();
    let out = run(dir.path(), "weft simulate --workload pods.yaml");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let workload: Vec<&str> =
        stdout.lines().skip_while(|l| !l.starts_with("workload:")).take(2).map(str::trim).collect();
    let workload = workload.join(" ");
    assert!(workload.contains("offered load 3% of GPU capacity while pods are present"), "{stdout}");
    let out = run(dir.path(), "weft simulate --workload pods.yaml -o json");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let load = v["workload"]["offeredLoad"].as_f64().unwrap();
    let want = 18.0 * 3600.0 / (3605.0 * 672.0);
    assert!((load - want).abs() < 1e-9, "offeredLoad {load}, want {want}");
}

/// The default table has the headline columns and a legend line for each; `--wide` has every
/// column of the report, on lines as long as they need.
#[test]
fn the_default_table_has_a_legend_and_wide_has_every_column() {
    let dir = tempfile::tempdir().unwrap();
    let narrow = String::from_utf8(run(dir.path(), "weft simulate --pods 400").stdout).unwrap();
    for column in ["placed", "short of VFs", "8-GPU placed", "ring GB/s", "VFs by GPUs", "stranded GPUs"] {
        assert!(narrow.lines().any(|l| l.starts_with(column)), "no legend line for {column}:\n{narrow}");
    }
    let table: Vec<&str> = narrow.lines().filter(|l| l.starts_with('│')).collect();
    assert!(table.iter().all(|l| !l.contains("pair") && !l.contains("NVLink")), "{narrow}");
    assert!(narrow.contains("run time: weft "), "{narrow}");
    let wide = String::from_utf8(run(dir.path(), "weft simulate --pods 400 --wide").stdout).unwrap();
    for column in ["pair GB/s mean/p10", "all-NVLink sets", "VFs by their GPUs", "stranded free GPUs", "run time"] {
        assert!(wide.contains(column), "--wide lacks {column}:\n{wide}");
    }
    assert!(wide.lines().any(|l| l.chars().count() > COLUMNS), "--wide is the whole table, unwrapped:\n{wide}");
}
