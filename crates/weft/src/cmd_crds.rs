//! `weft crds`: print weft's CustomResourceDefinitions (generated from the Rust types), or write or
//! check a committed copy of them.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, ValueEnum};
use weft_crds as crd;

/// `--output` of `weft crds`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum CrdFormat {
    /// Multi-document YAML, as committed under deploy/base/crds/.
    #[default]
    Yaml,
    /// A JSON `v1` List of the CRDs, for scripts.
    Json,
}

#[derive(Args, Debug)]
pub struct CrdsArgs {
    /// CRDs to print, by full name (numanetworks.numaflow.numaproj.io), plural, kind or short name.
    /// All of them when none is given.
    #[arg(value_name = "CRD")]
    names: Vec<String>,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: CrdFormat,
    /// Compare FILE with the generated output instead of printing it; fail, naming the first line
    /// that differs, if FILE is out of date. Without CRD names, FILE is compared with the CRDs it
    /// holds (`weft crds --check deploy/base/crds/<name>.yaml` checks that one CRD).
    #[arg(long, value_name = "FILE", conflicts_with = "write")]
    check: Option<PathBuf>,
    /// Write the generated output to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    write: Option<PathBuf>,
}

pub fn run(mut a: CrdsArgs) -> anyhow::Result<()> {
    let on_disk = match &a.check {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading {} to compare it with the generated CRDs", path.display()))?,
        ),
        None => None,
    };
    if let (Some(text), true) = (&on_disk, a.names.is_empty()) {
        a.names = names_in(text);
    }
    let crds = select(&a.names)?;
    let text = render(&crds, a.output)?;
    if let (Some(path), Some(on_disk)) = (&a.check, on_disk) {
        if let Some(diff) = first_difference(&on_disk, &text) {
            anyhow::bail!(
                "{} is out of date with the CRD types in crates/weft-crds/src/: {diff}\nregenerate it with: {}",
                path.display(),
                regenerate_command(&a, path)
            );
        }
        eprintln!("{} is up to date ({})", path.display(), describe(&crds));
    } else if let Some(path) = &a.write {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {} ({})", path.display(), describe(&crds));
    } else {
        out!("{text}")?;
    }
    Ok(())
}

/// The names of the weft CRDs a committed file holds (`metadata.name` of each YAML document, or of
/// each item of a JSON List), so that `--check FILE` compares FILE with those CRDs only. Empty, and
/// so every CRD, when it holds none that weft defines or is not YAML: the comparison then shows
/// where it differs.
fn names_in(text: &str) -> Vec<String> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text).unwrap_or_default();
    let items = docs.iter().flat_map(|d| match d["items"].as_array() {
        Some(items) if d["kind"] == "List" => items.iter().collect::<Vec<_>>(),
        _ => vec![d],
    });
    let all = crd::all();
    items
        .filter_map(|d| d["metadata"]["name"].as_str())
        .filter(|n| all.iter().any(|c| crd::crd_name(c) == *n))
        .map(String::from)
        .collect()
}

/// The CRDs named by `names` (each by any of its names), in `crd::all()` order; all when empty.
fn select(names: &[String]) -> anyhow::Result<Vec<crd::CustomResourceDefinition>> {
    let all = crd::all();
    if names.is_empty() {
        return Ok(all);
    }
    for name in names {
        if !all.iter().any(|c| crd::crd_matches(c, name)) {
            let known: Vec<String> = all
                .iter()
                .map(|c| {
                    let mut aliases = vec![c.spec.names.kind.clone()];
                    aliases.extend(c.spec.names.short_names.iter().flatten().cloned());
                    format!("{} ({})", crd::crd_name(c), aliases.join(", "))
                })
                .collect();
            anyhow::bail!("no CRD named '{name}'; weft defines: {}", known.join("; "));
        }
    }
    Ok(all.into_iter().filter(|c| names.iter().any(|n| crd::crd_matches(c, n))).collect())
}

fn render(crds: &[crd::CustomResourceDefinition], format: CrdFormat) -> anyhow::Result<String> {
    Ok(match format {
        CrdFormat::Yaml => crd::to_yaml(crds)?,
        CrdFormat::Json => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": crds});
            let mut s = serde_json::to_string_pretty(&list)?;
            s.push('\n');
            s
        }
    })
}

fn describe(crds: &[crd::CustomResourceDefinition]) -> String {
    let names: Vec<&str> = crds.iter().map(crd::crd_name).collect();
    let noun = if crds.len() == 1 { "CRD" } else { "CRDs" };
    format!("{} {noun}: {}", crds.len(), names.join(", "))
}

/// The command that rewrites `path` with what these arguments generate.
fn regenerate_command(a: &CrdsArgs, path: &Path) -> String {
    let mut cmd = String::from("weft crds");
    for n in &a.names {
        cmd.push(' ');
        cmd.push_str(n);
    }
    if a.output == CrdFormat::Json {
        cmd.push_str(" --output json");
    }
    format!("{cmd} > {}", path.display())
}

/// Where `actual` first differs from `expected`, as "line N: ..." with both lines; `None` if equal.
fn first_difference(actual: &str, expected: &str) -> Option<String> {
    if actual == expected {
        return None;
    }
    let mut a = actual.split_inclusive('\n');
    let mut e = expected.split_inclusive('\n');
    let mut line = 1usize;
    loop {
        match (a.next(), e.next()) {
            (Some(x), Some(y)) if x == y => line += 1,
            (x, y) => {
                let show = |l: Option<&str>| match l {
                    None => "<end of file>".to_string(),
                    Some(l) if !l.ends_with('\n') => format!("{:?} (no newline at end of file)", l),
                    Some(l) => format!("{:?}", l.trim_end_matches('\n')),
                };
                return Some(format!(
                    "first difference at line {line}\n  file:      {}\n  generated: {}",
                    show(x),
                    show(y)
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_difference_names_the_line() {
        assert_eq!(first_difference("a\nb\n", "a\nb\n"), None);
        let d = first_difference("a\nx\nc\n", "a\nb\nc\n").unwrap();
        assert!(d.starts_with("first difference at line 2\n"), "{d}");
        assert!(d.contains("file:      \"x\""), "{d}");
        assert!(d.contains("generated: \"b\""), "{d}");
        let d = first_difference("a\n", "a\nb\n").unwrap();
        assert!(d.contains("line 2") && d.contains("file:      <end of file>"), "{d}");
        let d = first_difference("a\nb", "a\nb\n").unwrap();
        assert!(d.contains("line 2") && d.contains("no newline at end of file"), "{d}");
    }

    #[test]
    fn selects_by_any_name() {
        assert_eq!(select(&[]).unwrap().len(), crd::all().len());
        for n in ["numanetworks.numaflow.numaproj.io", "NumaNetwork", "nnet", "numanetworks"] {
            assert_eq!(select(&[n.to_string()]).unwrap().len(), 1, "{n}");
        }
        let e = select(&["pipelines".to_string()]).unwrap_err().to_string();
        assert!(e.contains("no CRD named 'pipelines'") && e.contains("numanetworks.numaflow.numaproj.io"), "{e}");
    }
}
