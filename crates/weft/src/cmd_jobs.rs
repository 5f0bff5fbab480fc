//! `weft jobs render`: the pods and objects a Volcano Job will get from Volcano's plugins
//! (`spec.plugins`) and weft's (annotation `weft.io/job-plugins`), before it is applied.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;
use weft_jobs::admission::AdmissionOptions;
use weft_jobs::plugin::{BuildOptions, DEFAULT_WAIT_IMAGE, SshKeySource};
use weft_jobs::plugins::ssh::RandomKeys;
use weft_jobs::render::{PlaceholderKeys, PodChanges, Rendered, RenderedPod, render};

use crate::output::{print_json, table};

#[derive(Subcommand, Debug)]
pub enum JobsCommand {
    /// Print what a Volcano Job will get: the job after admission defaults, every pod after
    /// Volcano's and weft's plugins, and the ConfigMaps, Secrets, Services and NetworkPolicies they
    /// create. Admission errors are printed as the webhook would deny them.
    Render(RenderArgs),
}

#[derive(Args, Debug)]
pub struct RenderArgs {
    /// File with one or more YAML/JSON documents; every Volcano Job in it is rendered. `-` reads
    /// standard input.
    file: PathBuf,
    /// `table` (a summary), `yaml` (every object, as documents to read or diff) or `json`.
    #[arg(long, short, value_enum, default_value_t = RenderOutput::Table)]
    output: RenderOutput,
    /// Generate real ssh keys for the ssh plugin's Secret instead of a placeholder.
    #[arg(long)]
    generate_ssh_keys: bool,
    /// Scheduler a job without one gets (as the webhook's --scheduler-name).
    #[arg(long, default_value = "volcano")]
    scheduler_name: String,
    /// Image of the launch-order init containers (as the webhook's --wait-image).
    #[arg(long, env = "WEFT_WAIT_IMAGE", default_value = DEFAULT_WAIT_IMAGE)]
    wait_image: String,
    /// Most pods a job may have, summed over its tasks (as the webhook's --max-job-replicas).
    #[arg(long, default_value_t = weft_jobs::volcano_rules::MAX_TOTAL_REPLICAS, value_name = "N")]
    max_job_replicas: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RenderOutput {
    Table,
    Yaml,
    Json,
}

pub fn run(c: JobsCommand) -> anyhow::Result<()> {
    match c {
        JobsCommand::Render(a) => run_render(&a),
    }
}

fn run_render(a: &RenderArgs) -> anyhow::Result<()> {
    let text = if a.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("reading standard input")?;
        s
    } else {
        std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?
    };
    let where_ = a.file.display().to_string();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).with_context(|| format!("{where_}: not YAML or JSON"))?;
    let jobs: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            d.get("kind").and_then(Value::as_str) == Some("Job")
                && d.get("apiVersion").and_then(Value::as_str).is_some_and(|v| v.starts_with("batch.volcano.sh/"))
        })
        .collect();
    if jobs.is_empty() {
        bail!(
            "{where_}: no Volcano Job (apiVersion batch.volcano.sh/v1alpha1, kind Job) among {} document(s)",
            docs.len()
        );
    }
    let opts = AdmissionOptions {
        scheduler_name: a.scheduler_name.clone(),
        build: BuildOptions { wait_image: a.wait_image.clone(), max_job_replicas: a.max_job_replicas },
    };
    let keys: &dyn SshKeySource = if a.generate_ssh_keys { &RandomKeys } else { &PlaceholderKeys };
    let mut rendered = Vec::new();
    for job in jobs {
        let name = job.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("<unnamed>");
        let r = render(job, &opts, keys).with_context(|| format!("{where_}: job {name}"))?;
        for w in &r.warnings {
            eprintln!("warning: job {name}: {w}");
        }
        rendered.push(r);
    }
    match a.output {
        RenderOutput::Json => print_json(&if rendered.len() == 1 {
            serde_json::to_value(&rendered[0])?
        } else {
            serde_json::to_value(&rendered)?
        }),
        RenderOutput::Yaml => {
            for r in &rendered {
                out!("{}", to_yaml_documents(r)?)?;
            }
            Ok(())
        }
        RenderOutput::Table => {
            for r in &rendered {
                print_table(r)?;
            }
            Ok(())
        }
    }
}

/// The job, its pods and its objects as YAML documents.
fn to_yaml_documents(r: &Rendered) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut docs: Vec<Value> = vec![r.job.clone()];
    for p in &r.pods {
        let mut v = serde_json::to_value(&p.pod)?;
        if let Some(m) = v.as_object_mut() {
            m.insert("apiVersion".into(), "v1".into());
            m.insert("kind".into(), "Pod".into());
        }
        docs.push(v);
    }
    docs.extend(r.objects.iter().map(|o| o.object.clone()));
    for d in &docs {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(d).context("writing YAML")?);
    }
    Ok(out)
}

fn print_table(r: &Rendered) -> std::io::Result<()> {
    let ns = r.job.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
    let name = r.job.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    outln!("Job {ns}/{name}: {} pods", r.pods.len())?;
    let mut plugins = table(&["RUN BY", "PLUGIN", "ARGS"]);
    for p in &r.plugins {
        plugins.add_row(vec![format!("{:?}", p.source).to_lowercase(), p.name.to_owned(), p.args.join(" ")]);
    }
    outln!("{plugins}")?;
    let mut pods = table(&["PODS", "DNS NAME", "ENV ADDED", "INIT CONTAINERS", "VOLUMES", "PORTS", "COMMAND SET"]);
    for group in group_pods(&r.pods) {
        let c = &group.changes;
        pods.add_row(vec![
            group.label.clone(),
            group.dns.clone(),
            c.env.join(" "),
            c.init_containers.join(" "),
            c.volumes.join(" "),
            c.ports.join(" "),
            c.commands.join(" "),
        ]);
    }
    outln!("{pods}")?;
    if !r.objects.is_empty() {
        let mut objects = table(&["CREATED BY", "KIND", "NAME", "HOLDS"]);
        for o in &r.objects {
            let v = &o.object;
            let keys = |field: &str| {
                v.get(field).and_then(Value::as_object).map(|m| m.keys().cloned().collect::<Vec<_>>().join(" "))
            };
            let holds = keys("data")
                .or_else(|| {
                    v.pointer("/spec/ports").and_then(Value::as_array).map(|ps| {
                        ps.iter()
                            .map(|p| format!("{}/{}", p["name"].as_str().unwrap_or(""), p["port"]))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                })
                .unwrap_or_default();
            objects.add_row(vec![
                format!("{:?}", o.source).to_lowercase(),
                v["kind"].as_str().unwrap_or("").to_owned(),
                v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_owned(),
                holds,
            ]);
        }
        outln!("{objects}")?;
    }
    outln!("(`-o yaml` prints every pod and object in full)")
}

/// Consecutive pods of one task with the same changes, shown as one row.
struct PodGroup {
    label: String,
    dns: String,
    changes: PodChanges,
}

fn group_pods(pods: &[RenderedPod]) -> Vec<PodGroup> {
    let mut out: Vec<(Vec<&RenderedPod>, PodChanges)> = Vec::new();
    for p in pods {
        let mut key = p.changes.clone();
        key.dns_name = None;
        match out.last_mut() {
            Some((members, k)) if *k == key && members[0].task == p.task => members.push(p),
            _ => out.push((vec![p], key)),
        }
    }
    out.into_iter()
        .map(|(members, changes)| {
            let first = members[0];
            let last = members[members.len() - 1];
            let name = first.pod.metadata.name.clone().unwrap_or_default();
            let dns = first.changes.dns_name.clone().unwrap_or_default();
            if members.len() == 1 {
                return PodGroup { label: name, dns, changes };
            }
            let span = format!("{{{}..{}}}", first.index, last.index);
            let stem = name.strip_suffix(&first.index.to_string()).unwrap_or(&name);
            let dns = dns.replacen(&name, &format!("{stem}{span}"), 1);
            PodGroup { label: format!("{stem}{span}"), dns, changes }
        })
        .collect()
}
