//! `weft jobs render`: the pods and objects a Volcano Job will get from Volcano's plugins
//! (`spec.plugins`) and weft's (annotation `weft.io/job-plugins`), before it is applied.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;
use weft_jobs::admission::AdmissionOptions;
use weft_jobs::plugin::{BuildOptions, DEFAULT_WAIT_IMAGE, SshKeySource};
use weft_jobs::plugins::ssh::RandomKeys;
use weft_jobs::render::{PlaceholderKeys, PodChanges, Prepared, RenderedPod, prepare};

use crate::output::table;

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
    // Every job is admitted and its objects built before anything is printed; the pods are made
    // and written one at a time, so memory stays that of one pod however many the job has.
    let mut prepared = Vec::new();
    for job in jobs {
        let name = job_name(job);
        let p = prepare(job, &opts, keys).with_context(|| format!("{where_}: job {name}"))?;
        for w in &p.warnings {
            eprintln!("warning: job {name}: {w}");
        }
        prepared.push(p);
    }
    drop(docs);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match a.output {
        RenderOutput::Json => write_json(&mut out, &prepared, &where_)?,
        RenderOutput::Yaml => {
            for p in &prepared {
                write_yaml(&mut out, p, &where_)?;
            }
        }
        RenderOutput::Table => {
            for p in &prepared {
                write_table(&mut out, p, &where_)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

fn job_name(job: &Value) -> &str {
    job.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("<unnamed>")
}

/// `p`'s pods, each passed to `each` as it is made; warnings found on the way go to stderr.
fn each_pod(p: &Prepared, where_: &str, mut each: impl FnMut(RenderedPod) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let name = job_name(&p.job);
    let mut pods = p.pods();
    let mut warned = 0;
    while let Some(pod) = pods.next() {
        each(pod.with_context(|| format!("{where_}: job {name}"))?)?;
        for w in &pods.warnings()[warned..] {
            eprintln!("warning: job {name}: {w}");
        }
        warned = pods.warnings().len();
    }
    Ok(())
}

/// What `serde_json::to_string_pretty` gives for the render (one job: an object; more: a list of
/// them), written a pod at a time. Keys come in serde_json's order (sorted), so `pods` comes after
/// `objects` and `plugins`, and `warnings`, which making the pods adds to, comes last.
fn write_json(out: &mut impl Write, prepared: &[Prepared], where_: &str) -> anyhow::Result<()> {
    if let [one] = prepared {
        write_json_job(out, one, 0, where_)?;
    } else {
        out.write_all(b"[")?;
        for (i, p) in prepared.iter().enumerate() {
            out.write_all(if i == 0 { b"\n  " } else { b",\n  " })?;
            write_json_job(out, p, 2, where_)?;
        }
        out.write_all(if prepared.is_empty() { b"]" } else { b"\n]" })?;
    }
    out.write_all(b"\n")?;
    Ok(())
}

/// One job's render as a pretty JSON object whose lines after the first are indented by `indent`.
fn write_json_job(out: &mut impl Write, p: &Prepared, indent: usize, where_: &str) -> anyhow::Result<()> {
    let pad = " ".repeat(indent);
    out.write_all(b"{\n")?;
    for (key, value) in [
        ("job", &p.job),
        ("objects", &serde_json::to_value(&p.objects)?),
        ("plugins", &serde_json::to_value(&p.plugins)?),
    ] {
        write!(out, "{pad}  \"{key}\": ")?;
        write_pretty(out, value, indent + 2)?;
        out.write_all(b",\n")?;
    }
    write!(out, "{pad}  \"pods\": [")?;
    let mut first = true;
    let mut warnings = p.warnings.clone();
    let mut pods = p.pods();
    for pod in pods.by_ref() {
        let pod = pod.with_context(|| format!("{where_}: job {}", job_name(&p.job)))?;
        write!(out, "{}{pad}    ", if first { "\n" } else { ",\n" })?;
        write_pretty(out, &serde_json::to_value(&pod)?, indent + 4)?;
        first = false;
    }
    for w in pods.warnings() {
        eprintln!("warning: job {}: {w}", job_name(&p.job));
    }
    warnings.extend(pods.into_warnings());
    if first {
        out.write_all(b"],\n")?;
    } else {
        write!(out, "\n{pad}  ],\n")?;
    }
    write!(out, "{pad}  \"warnings\": ")?;
    write_pretty(out, &serde_json::to_value(&warnings)?, indent + 2)?;
    write!(out, "\n{pad}}}")?;
    Ok(())
}

/// `value` as `serde_json::to_string_pretty` writes it, its lines after the first indented by
/// `indent` (pretty JSON breaks lines only between tokens: strings keep their newlines escaped).
fn write_pretty(out: &mut impl Write, value: &Value, indent: usize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    let pad = " ".repeat(indent);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            write!(out, "\n{pad}")?;
        }
        out.write_all(line.as_bytes())?;
    }
    Ok(())
}

/// The job, its pods and its objects as YAML documents, a pod at a time.
fn write_yaml(out: &mut impl Write, p: &Prepared, where_: &str) -> anyhow::Result<()> {
    let doc = |out: &mut dyn Write, d: &Value| -> anyhow::Result<()> {
        out.write_all(b"---\n")?;
        out.write_all(serde_saphyr::to_string(d).context("writing YAML")?.as_bytes())?;
        Ok(())
    };
    doc(out, &p.job)?;
    each_pod(p, where_, |pod| {
        let mut v = serde_json::to_value(&pod.pod)?;
        if let Some(m) = v.as_object_mut() {
            m.insert("apiVersion".into(), "v1".into());
            m.insert("kind".into(), "Pod".into());
        }
        doc(out, &v)
    })?;
    for o in &p.objects {
        doc(out, &o.object)?;
    }
    Ok(())
}

/// Env names a table row shows; the rest are counted.
const TABLE_ENV_NAMES: usize = 32;

fn write_table(out: &mut impl Write, p: &Prepared, where_: &str) -> anyhow::Result<()> {
    let ns = p.job.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
    let name = p.job.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    writeln!(out, "Job {ns}/{name}: {} pods", p.pod_count())?;
    let mut plugins = table(&["RUN BY", "PLUGIN", "ARGS"]);
    for r in &p.plugins {
        plugins.add_row(vec![format!("{:?}", r.source).to_lowercase(), r.name.to_owned(), r.args.join(" ")]);
    }
    writeln!(out, "{plugins}")?;
    let mut pods = table(&["PODS", "DNS NAME", "ENV ADDED", "INIT CONTAINERS", "VOLUMES", "PORTS", "COMMAND SET"]);
    let mut add_row = |group: PodGroup| {
        let c = &group.changes;
        let env = if c.env.len() > TABLE_ENV_NAMES {
            format!("{} … and {} more", c.env[..TABLE_ENV_NAMES].join(" "), c.env.len() - TABLE_ENV_NAMES)
        } else {
            c.env.join(" ")
        };
        pods.add_row(vec![
            group.label(),
            group.dns(),
            env,
            c.init_containers.join(" "),
            c.volumes.join(" "),
            c.ports.join(" "),
            c.commands.join(" "),
        ]);
    };
    let mut current: Option<PodGroup> = None;
    each_pod(p, where_, |pod| {
        if let Some(g) = current.as_mut().filter(|g| g.takes(&pod)) {
            g.last = pod.index;
        } else if let Some(done) = current.replace(PodGroup::new(pod)) {
            add_row(done);
        }
        Ok(())
    })?;
    if let Some(done) = current {
        add_row(done);
    }
    writeln!(out, "{pods}")?;
    if !p.objects.is_empty() {
        let mut objects = table(&["CREATED BY", "KIND", "NAME", "HOLDS"]);
        for o in &p.objects {
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
        writeln!(out, "{objects}")?;
    }
    writeln!(out, "(`-o yaml` prints every pod and object in full)")?;
    Ok(())
}

/// Consecutive pods of one task with the same changes, shown as one row.
struct PodGroup {
    task: String,
    /// The first pod's name and DNS name.
    name: String,
    dns: String,
    first: usize,
    last: usize,
    /// The changes, DNS name left out (it differs from pod to pod).
    changes: PodChanges,
}

impl PodGroup {
    fn new(pod: RenderedPod) -> Self {
        let mut changes = pod.changes;
        let dns = changes.dns_name.take().unwrap_or_default();
        Self {
            name: pod.pod.metadata.name.unwrap_or_default(),
            task: pod.task,
            dns,
            first: pod.index,
            last: pod.index,
            changes,
        }
    }

    /// Whether `pod` belongs in this row: same task, same changes.
    fn takes(&self, pod: &RenderedPod) -> bool {
        let c = &pod.changes;
        pod.task == self.task
            && c.env == self.changes.env
            && c.init_containers == self.changes.init_containers
            && c.volumes == self.changes.volumes
            && c.ports == self.changes.ports
            && c.commands == self.changes.commands
            && c.annotations == self.changes.annotations
    }

    fn span(&self) -> Option<(String, &str)> {
        (self.last != self.first).then(|| {
            let span = format!("{{{}..{}}}", self.first, self.last);
            let stem = self.name.strip_suffix(&self.first.to_string()).unwrap_or(&self.name);
            (span, stem)
        })
    }

    fn label(&self) -> String {
        self.span().map_or_else(|| self.name.clone(), |(span, stem)| format!("{stem}{span}"))
    }

    fn dns(&self) -> String {
        self.span()
            .map_or_else(|| self.dns.clone(), |(span, stem)| self.dns.replacen(&self.name, &format!("{stem}{span}"), 1))
    }
}
