//! `weft simulate`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use indicatif::{HumanCount, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use weft_alloc::ScoreConfig;
use weft_sim::pipeline::{PipelineReport, embedded_default};
use weft_sim::{
    ClusterSpec, Generate, PlacementPolicy, Progress, SimReport, builtin_types, read_scenario, read_workload, simulate,
    simulate_pipelines, simulate_recorded,
};

use crate::output::{Output, count, print_json, report_table, score_config, table, wrap};

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Cluster file (`kind: SimCluster`); default: the embedded cluster.
    #[arg(long, value_name = "FILE")]
    cluster: Option<PathBuf>,
    /// Workload file: a `kind: SimWorkload` generator or Pod manifests with `sim.weft.io/arrival`
    /// and `sim.weft.io/duration` annotations (VFs as `sriov.weft.io/<physnet>` requests); default:
    /// a generated stream, half of its pods asking for one VF of `fabric`.
    #[arg(long, value_name = "FILE")]
    workload: Option<PathBuf>,
    /// Scale the cluster to this many nodes (at most 1,000,000), keeping its mix of node types.
    #[arg(long, value_name = "N")]
    nodes: Option<usize>,
    /// Pods in the default generated stream (at most 10,000,000).
    #[arg(long, default_value_t = 5000)]
    pods: usize,
    /// Seed of the generated stream and of the blind policy's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Policies to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "weft,blind,least-allocated")]
    policies: Vec<PolicyArg>,
    /// Weight (0–1) of the remainder-quality term in weft's node score.
    #[arg(long, default_value_t = ScoreConfig::default().remainder_weight)]
    remainder_weight: f64,
    /// What the score's affinity term measures of a GPU set: `ring` (the slowest hop of its best
    /// ring) or `pair-score` (go-gpuallocator's mean pair score).
    #[arg(long, value_enum, default_value_t = crate::output::SetQualityArg::Ring)]
    set_quality: crate::output::SetQualityArg,
    /// Place Numaflow pipelines on NumaNetworks instead of a pod stream: each vertex pod's node,
    /// GPUs, NIC, IP address and DNS name under each policy, and the NIC–GPU alignment share. FILE
    /// is a `kind: SimPipelines` scenario; without one, the seed's video pipeline
    /// (in → filter-resize → inference → out).
    #[arg(long, value_name = "FILE", num_args = 0..=1, conflicts_with_all = ["workload", "pods"])]
    pipelines: Option<Option<PathBuf>>,
    /// With --pipelines: run every vertex with this many replicas.
    #[arg(long, value_name = "N", requires = "pipelines")]
    replicas: Option<usize>,
    /// Run a scenario matrix (`kind: SimMatrix`, e.g. crates/weft-sim/scenarios/matrix.yaml):
    /// every cell under every policy, with a verdict per cell (weft against each baseline: wins,
    /// ties or loses); exit status 1 when a cell's gate fails (`gate: true`: weft loses there;
    /// `gate: strict`: loses or ties).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["cluster", "workload", "nodes", "pods", "seed", "policies", "pipelines"])]
    matrix: Option<PathBuf>,
    /// With --matrix: only the cells marked `small: true` (CI's smoke run).
    #[arg(long, requires = "matrix")]
    small_only: bool,
    /// Put each policy's pods placed beside a proven upper bound on what any placement of the stream
    /// could place (the offline 0/1 program solved by microlp; docs/simulate.md, "Distance to the
    /// optimum"), on --instances generated streams of seeds --seed, --seed + 1, ... Meant for small
    /// instances: e.g. --nodes 12 --pods 300.
    #[arg(long, conflicts_with_all = ["pipelines", "matrix"])]
    optimum: bool,
    /// With --optimum: how many instances.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "optimum")]
    instances: usize,
    /// With --optimum: time limit of each instance's integer search (500ms, 30s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::duration_arg::positive, requires = "optimum")]
    time_limit: std::time::Duration,
    /// Print every column of the report (about 180 columns wide) instead of the table that fits 100.
    #[arg(long, conflicts_with_all = ["matrix", "optimum", "pipelines"])]
    wide: bool,
    /// Write one record per pod per policy to FILE (`-`: stdout, instead of the report): the pod,
    /// what it asked, its node, GPUs and VFs, its set's ring and mean pair bandwidth, arrival,
    /// start and end, or why it was not placed. Fields in docs/simulate.md ("Per-pod output").
    #[arg(long, value_name = "FILE", conflicts_with_all = ["matrix", "optimum", "pipelines"])]
    pods_out: Option<PathBuf>,
    /// Write an HTML report to FILE: one self-contained page (inline SVG charts, nothing fetched)
    /// with each policy's timeline, bandwidth and VF-nearness distributions, utilisation per node
    /// type, the pods not placed and why, and sample nodes with their pods drawn
    /// (docs/simulate.md, "The HTML report"). The terminal report is printed as usual.
    #[arg(long, value_name = "FILE.html", conflicts_with_all = ["matrix", "optimum", "pipelines", "jobs"])]
    report: Option<PathBuf>,
    /// Format of --pods-out: CSV with a header line, or JSON lines (one object per line).
    #[arg(long, value_enum, default_value_t, requires = "pods_out")]
    pods_format: PodsFormat,
    #[command(flatten)]
    jobs: crate::cmd_sim_jobs::JobsArgs,
    /// List the built-in node types and exit.
    #[arg(long)]
    list_node_types: bool,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: Output,
}

/// `--pods-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
enum PodsFormat {
    /// Comma-separated values, a header line first; lists inside a field separated by `;`.
    #[default]
    Csv,
    /// One JSON object per line.
    Jsonl,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum PolicyArg {
    Weft,
    Blind,
    LeastAllocated,
}

impl From<PolicyArg> for PlacementPolicy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Weft => PlacementPolicy::Weft,
            PolicyArg::Blind => PlacementPolicy::Blind,
            PolicyArg::LeastAllocated => PlacementPolicy::LeastAllocated,
        }
    }
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if args.list_node_types {
        if args.output == Output::Json {
            let v: Vec<_> = builtin_types()
                .into_iter()
                .map(|(n, d)| serde_json::json!({"name": n, "description": d, "topology": format!("builtin:{n}")}))
                .collect();
            return print_json(&v);
        }
        let mut t = report_table(&["node type", "use as", "description"], &[]);
        for (n, d) in builtin_types() {
            t.add_row(vec![n.to_string(), format!("builtin:{n}"), d.to_string()]);
        }
        outln!("{t}")?;
        return Ok(());
    }
    if let Some(file) = &args.matrix {
        return crate::cmd_sim_matrix::run(
            file,
            args.small_only,
            score_config(args.remainder_weight, args.set_quality)?,
            args.output,
        );
    }
    if args.jobs.jobs.is_some() {
        let score = score_config(args.remainder_weight, args.set_quality)?;
        return crate::cmd_sim_jobs::run(
            &args.jobs,
            args.cluster.as_deref(),
            args.nodes,
            args.seed,
            score,
            args.output,
        );
    }
    let spec = match &args.cluster {
        Some(p) => ClusterSpec::from_file(p).with_context(|| format!("reading cluster file {}", p.display()))?,
        None => ClusterSpec::embedded_default(),
    };
    let spec = match args.nodes {
        Some(0) => anyhow::bail!("--nodes must be at least 1"),
        Some(n) if n > weft_sim::MAX_NODES => {
            anyhow::bail!("--nodes {n} is more than the simulator takes (at most {})", weft_sim::MAX_NODES)
        }
        Some(n) => spec.scaled(n),
        None => spec,
    };
    let base = args.cluster.as_deref().and_then(|p| p.parent());
    let cluster = spec.build(base).context("building the cluster")?;
    if let Some(file) = &args.pipelines {
        return run_pipelines(&args, file.as_deref(), &cluster);
    }
    if args.optimum {
        let workload = match &args.workload {
            Some(p) => Some(read_workload(p).with_context(|| format!("reading workload {}", p.display()))?),
            None => None,
        };
        return crate::cmd_sim_optimum::run(crate::cmd_sim_optimum::OptimumRun {
            cluster: &cluster,
            workload,
            pods: args.pods,
            seed: args.seed,
            instances: args.instances,
            time_limit: args.time_limit,
            policies: args.policies.iter().map(|&p| p.into()).collect(),
            score_config: score_config(args.remainder_weight, args.set_quality)?,
            output: args.output,
        });
    }
    let pods = match &args.workload {
        Some(p) => read_workload(p).with_context(|| format!("reading workload {}", p.display()))?,
        None => Generate::default_for(cluster.total_gpus(), args.pods, args.seed).pods()?,
    };
    let policies: Vec<PlacementPolicy> = args.policies.iter().map(|&p| p.into()).collect();
    let score_config = score_config(args.remainder_weight, args.set_quality)?;

    let progress = PolicyProgress::new(&policies, pods.len(), args.output == Output::Table);
    let show = &mut |i, p| progress.show(i, p);
    let to_stdout = args.pods_out.as_deref().is_some_and(|p| p == std::path::Path::new("-"));
    // The report's file is made before the run, so a path that cannot be written fails at once.
    let report_file = match &args.report {
        Some(path) => {
            Some(std::fs::File::create(path).with_context(|| format!("--report: cannot create {}", path.display()))?)
        }
        None => None,
    };
    let mut collector = args.report.as_ref().map(|_| crate::cmd_sim_report::Collector::new(&cluster, &pods, &policies));
    let mut report = match &args.pods_out {
        None if collector.is_some() => {
            simulate_recorded(&cluster, &pods, &policies, &score_config, args.seed, show, &mut |o| {
                if let Some(c) = collector.as_mut() {
                    c.add(o);
                }
                Ok(())
            })?
        }
        Some(path) => {
            let out: Box<dyn std::io::Write> = if to_stdout {
                Box::new(std::io::stdout().lock())
            } else {
                let file = std::fs::File::create(path)
                    .with_context(|| format!("--pods-out: cannot create {}", path.display()))?;
                Box::new(file)
            };
            let mut records =
                PodRecords::new(out, args.pods_format).with_context(|| format!("--pods-out {}", path.display()))?;
            let report = simulate_recorded(&cluster, &pods, &policies, &score_config, args.seed, show, &mut |o| {
                if let Some(c) = collector.as_mut() {
                    c.add(o);
                }
                records.write(o)
            })
            .with_context(|| format!("--pods-out {}", path.display()))?;
            records.finish().with_context(|| format!("--pods-out {}", path.display()))?;
            report
        }
        None => simulate(&cluster, &pods, &policies, &score_config, args.seed, show)?,
    };
    progress.clear();
    if args.workload.is_none() {
        report.workload.target_load = Some(Generate::DEFAULT_LOAD);
    }
    if let (Some(path), Some(file), Some(collector)) = (&args.report, report_file, &collector) {
        crate::cmd_sim_report::write(path, file, &report_scenario(&args), &report, collector)?;
    }
    if to_stdout {
        return Ok(());
    }
    match args.output {
        Output::Json => print_json(&report),
        Output::Table => print_report(&report, args.wide),
    }
}

/// The scenario as `--report` names it.
fn report_scenario(args: &SimulateArgs) -> crate::cmd_sim_report::Scenario {
    let scaled = args.nodes.map_or(String::new(), |n| format!(", scaled to {} nodes", count(n)));
    let cluster = match &args.cluster {
        Some(p) => format!("{}{scaled}", p.display()),
        None => format!("the embedded cluster{scaled}"),
    };
    let workload = match &args.workload {
        Some(p) => p.display().to_string(),
        None => format!("generated: {} pods, seed {}", count(args.pods), args.seed),
    };
    let quality =
        clap::ValueEnum::to_possible_value(&args.set_quality).map_or(String::new(), |v| v.get_name().to_string());
    let score = format!("remainder weight {}, set quality {quality}", args.remainder_weight);
    crate::cmd_sim_report::Scenario { cluster, workload, seed: args.seed, score }
}

/// The fields of a per-pod record, in order: the CSV header and the JSON keys (docs/simulate.md,
/// "Per-pod output", describes each; keep the two in step).
const POD_FIELDS: [&str; 16] = [
    "policy",
    "index",
    "pod",
    "gpus",
    "vfs",
    "node",
    "nodeType",
    "gpuIds",
    "vfIds",
    "vfsNearGpus",
    "ringGbps",
    "meanPairGbps",
    "arrival",
    "start",
    "end",
    "notPlaced",
];

/// A per-pod record as a JSON line: [`POD_FIELDS`], in that order.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PodJson<'a> {
    policy: &'a str,
    index: usize,
    pod: &'a str,
    gpus: usize,
    vfs: std::collections::BTreeMap<&'a str, usize>,
    node: Option<&'a str>,
    node_type: Option<&'a str>,
    gpu_ids: Vec<usize>,
    vf_ids: Vec<&'a str>,
    vfs_near_gpus: Option<bool>,
    ring_gbps: Option<f64>,
    mean_pair_gbps: Option<f64>,
    arrival: f64,
    start: Option<f64>,
    end: Option<f64>,
    not_placed: Option<&'a str>,
}

impl<'a> PodJson<'a> {
    fn of(o: &'a weft_sim::PodOutcome<'a>) -> PodJson<'a> {
        let placed = o.placement.as_ref().ok();
        PodJson {
            policy: o.policy.name(),
            index: o.index,
            pod: &o.pod.name,
            gpus: o.pod.gpus,
            vfs: o.pod.vfs.iter().map(|(p, n)| (&**p, *n)).collect(),
            node: placed.map(|p| p.node),
            node_type: placed.map(|p| p.node_type),
            gpu_ids: placed.map_or_else(Vec::new, |p| p.gpus.clone()),
            vf_ids: placed.map_or_else(Vec::new, |p| p.vfs.iter().map(|v| v.pci_address.as_str()).collect()),
            vfs_near_gpus: placed.and_then(|p| p.vfs_near_gpus),
            ring_gbps: placed.and_then(|p| p.ring_gbps),
            mean_pair_gbps: placed.and_then(|p| p.mean_pair_gbps),
            arrival: o.pod.arrival,
            start: placed.map(|p| p.start),
            end: placed.map(|p| p.end),
            not_placed: o.placement.as_ref().err().map(|w| w.as_str()),
        }
    }

    /// Write the CSV row: absent values empty, lists joined by `;`, `vfs` as `physnet:count`. Each
    /// field is formatted into `buf`, which is reused (a row of 16 new strings per pod cost more
    /// than the run at 300,000 records).
    fn write_csv<W: std::io::Write>(&self, w: &mut csv::Writer<W>, buf: &mut String) -> csv::Result<()> {
        use std::fmt::Write;
        let mut field = |w: &mut csv::Writer<W>, f: &dyn Fn(&mut String) -> std::fmt::Result| {
            buf.clear();
            // Writing to a String cannot fail.
            let _ = f(buf);
            w.write_field(buf.as_bytes())
        };
        fn join<T: std::fmt::Display>(buf: &mut String, items: impl Iterator<Item = T>) -> std::fmt::Result {
            for (i, x) in items.enumerate() {
                if i > 0 {
                    buf.push(';');
                }
                write!(buf, "{x}")?;
            }
            Ok(())
        }
        fn opt<T: std::fmt::Display>(buf: &mut String, x: Option<T>) -> std::fmt::Result {
            x.map_or(Ok(()), |x| write!(buf, "{x}"))
        }
        field(w, &|b| b.write_str(self.policy))?;
        field(w, &|b| write!(b, "{}", self.index))?;
        field(w, &|b| b.write_str(self.pod))?;
        field(w, &|b| write!(b, "{}", self.gpus))?;
        field(w, &|b| join(b, self.vfs.iter().map(|(p, n)| format!("{p}:{n}"))))?;
        field(w, &|b| opt(b, self.node))?;
        field(w, &|b| opt(b, self.node_type))?;
        field(w, &|b| join(b, self.gpu_ids.iter()))?;
        field(w, &|b| join(b, self.vf_ids.iter()))?;
        field(w, &|b| opt(b, self.vfs_near_gpus))?;
        field(w, &|b| opt(b, self.ring_gbps))?;
        field(w, &|b| opt(b, self.mean_pair_gbps))?;
        field(w, &|b| write!(b, "{}", self.arrival))?;
        field(w, &|b| opt(b, self.start))?;
        field(w, &|b| opt(b, self.end))?;
        field(w, &|b| opt(b, self.not_placed))?;
        w.write_record(None::<&[u8]>)
    }
}

/// Where `--pods-out` records go, one written as each pod is decided (none is kept).
enum PodRecords {
    /// The writer and a buffer each field is formatted into.
    Csv(Box<csv::Writer<Box<dyn std::io::Write>>>, String),
    Jsonl(std::io::BufWriter<Box<dyn std::io::Write>>),
}

impl PodRecords {
    /// A CSV writer has written its header line.
    fn new(out: Box<dyn std::io::Write>, format: PodsFormat) -> std::io::Result<PodRecords> {
        Ok(match format {
            PodsFormat::Csv => {
                let mut w = csv::Writer::from_writer(out);
                w.write_record(POD_FIELDS)?;
                PodRecords::Csv(Box::new(w), String::new())
            }
            PodsFormat::Jsonl => PodRecords::Jsonl(std::io::BufWriter::with_capacity(1 << 16, out)),
        })
    }

    fn write(&mut self, o: &weft_sim::PodOutcome<'_>) -> std::io::Result<()> {
        let record = PodJson::of(o);
        match self {
            // An I/O error stays one (a closed pipe is not an error to report: see `main`).
            PodRecords::Csv(w, buf) => record.write_csv(w, buf).map_err(|e| match e.into_kind() {
                csv::ErrorKind::Io(e) => e,
                other => std::io::Error::other(format!("{other:?}")),
            })?,
            PodRecords::Jsonl(w) => {
                serde_json::to_writer(&mut *w, &record)?;
                std::io::Write::write_all(w, b"\n")?;
            }
        }
        Ok(())
    }

    fn finish(self) -> std::io::Result<()> {
        match self {
            PodRecords::Csv(mut w, _) => w.flush(),
            PodRecords::Jsonl(mut w) => std::io::Write::flush(&mut w),
        }
    }
}

fn run_pipelines(
    args: &SimulateArgs,
    file: Option<&std::path::Path>,
    cluster: &weft_sim::Cluster,
) -> anyhow::Result<()> {
    let scenario = match file {
        Some(p) => read_scenario(p).with_context(|| format!("reading pipeline scenario {}", p.display()))?,
        None => embedded_default(),
    };
    let scenario = match args.replicas {
        Some(n) => scenario.with_replicas(n),
        None => scenario,
    };
    let policies: Vec<PlacementPolicy> = args.policies.iter().map(|&p| p.into()).collect();
    let score_config = score_config(args.remainder_weight, args.set_quality)?;
    let report = simulate_pipelines(cluster, &scenario, &policies, &score_config, args.seed)?;
    match args.output {
        Output::Json => print_json(&report),
        Output::Table => print_pipelines(&report),
    }
}

fn print_pipelines(r: &PipelineReport) -> anyhow::Result<()> {
    let types: Vec<String> = r.cluster.node_types.iter().map(|(k, v)| format!("{}× {k}", count(*v))).collect();
    let cluster = format!(
        "cluster:  {} nodes, {} GPUs, {} SR-IOV VFs ({})",
        count(r.cluster.nodes),
        count(r.cluster.gpus),
        count(r.cluster.vfs),
        types.join(", ")
    );
    outln!("{}", wrap(&cluster, 10))?;
    for n in &r.networks {
        let vlan = n.vlan.map_or("untagged".to_string(), |v| format!("VLAN {v}"));
        let network = format!(
            "network:  {} {} ({} usable addresses), {vlan}, NICs from physnet {}; {} vertex pods on it",
            n.name, n.ip_range, n.usable_addresses, n.physnet, n.pods
        );
        outln!("{}", wrap(&network, 10))?;
    }
    // VERTEX_DOMAIN_TARGETS is the vertex's, whatever the policy: print it once.
    if let Some(first) = r.policies.first() {
        let mut seen = std::collections::BTreeSet::new();
        for p in &first.pods {
            if !p.domain_targets.is_empty() && seen.insert((&p.pipeline, &p.vertex)) {
                let targets = format!(
                    "targets:  {}/{} VERTEX_DOMAIN_TARGETS={}",
                    p.pipeline,
                    p.vertex,
                    p.domain_targets.join(",")
                );
                outln!("{}", wrap(&targets, 10))?;
            }
        }
    }
    for p in &r.policies {
        outln!()?;
        outln!("{}: {}/{} vertex pods placed", p.policy, p.placed, p.placed + p.unplaced)?;
        let mut t = report_table(&["pod", "node", "GPUs", "NIC and VF", "IP"], &[]);
        for pod in &p.pods {
            let dash = || "-".to_string();
            let gpus = if pod.gpus.is_empty() {
                dash()
            } else {
                pod.gpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
            };
            let near = match pod.aligned {
                Some(true) => " *",
                Some(false) => " x",
                None => "",
            };
            let join = |f: &dyn Fn(&weft_sim::pipeline::PodNic) -> String| {
                if pod.nics.is_empty() { dash() } else { pod.nics.iter().map(f).collect::<Vec<_>>().join("\n") }
            };
            t.add_row(vec![
                pod.pod.clone(),
                pod.node.clone().unwrap_or_else(|| "not placed".to_string()),
                gpus,
                join(&|n| format!("{} {}{near}", n.nic, n.vf)),
                join(&|n| n.ip.to_string()),
            ]);
        }
        outln!("{t}")?;
    }
    outln!("* the NIC shares a PCIe switch with one of the pod's GPUs; x it does not (across the host bridge)")?;
    // A vertex's name on a network is the same for every pod and policy: print each once.
    let mut names = std::collections::BTreeSet::new();
    for pod in r.policies.iter().flat_map(|p| &p.pods) {
        for n in &pod.nics {
            names.insert((pod.pipeline.as_str(), pod.vertex.as_str(), n.domain.as_str()));
        }
    }
    if !names.is_empty() {
        outln!()?;
        outln!("DNS names (one A record per placed pod on the network):")?;
        for (pipeline, vertex, domain) in names {
            outln!("{}", wrap(&format!("  {pipeline}/{vertex}  {domain}"), 4))?;
        }
    }
    outln!()?;
    let shares: Vec<String> = r
        .policies
        .iter()
        .map(|p| {
            if p.nic_gpu_pods == 0 {
                format!("{} -", p.policy)
            } else {
                format!("{} {:.1}% ({}/{})", p.policy, p.alignment_share * 100.0, p.aligned_pods, p.nic_gpu_pods)
            }
        })
        .collect();
    outln!("NIC–GPU alignment: {}", shares.join(", "))?;
    outln!("(share of placed vertex pods holding GPUs and a NIC whose every NIC shares a PCIe switch with one of")?;
    outln!("their GPUs, so GPUDirect RDMA does not cross the host bridge)")?;
    Ok(())
}

/// One progress bar per policy on stderr while the run lasts: pods handled of the total, pods placed,
/// rate and time left. Drawn only for table output on a terminal: JSON output and a stderr that is a
/// pipe or a file (logs, CI) stay clean.
struct PolicyProgress {
    bars: Vec<ProgressBar>,
    _all: MultiProgress,
}

impl PolicyProgress {
    fn new(policies: &[PlacementPolicy], pods: usize, table: bool) -> PolicyProgress {
        let target = if table && std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let all = MultiProgress::with_draw_target(target);
        let style = ProgressStyle::with_template(
            "{prefix:>15} [{bar:24}] {human_pos}/{human_len} pods, {msg} placed, {rate} pods/s, {eta} left",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("rate", |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{}", HumanCount(state.per_sec() as u64));
        })
        .progress_chars("=> ");
        let bars = policies
            .iter()
            .map(|p| {
                let bar =
                    ProgressBar::new(pods as u64).with_style(style.clone()).with_prefix(p.name()).with_message("0");
                all.add(bar)
            })
            .collect();
        PolicyProgress { bars, _all: all }
    }

    fn show(&self, policy: usize, p: Progress) {
        if let Some(bar) = self.bars.get(policy) {
            bar.set_position(p.handled as u64);
            bar.set_message(HumanCount(p.placed as u64).to_string());
        }
    }

    fn clear(&self) {
        for bar in &self.bars {
            bar.finish_and_clear();
        }
    }
}

fn print_report(r: &SimReport, wide: bool) -> anyhow::Result<()> {
    for line in report_head(r) {
        outln!("{line}")?;
    }
    outln!()?;
    if wide { print_wide(r) } else { print_narrow(r) }
}

/// The `cluster:` and `workload:` lines, wrapped to 100 columns under their labels.
fn report_head(r: &SimReport) -> [String; 2] {
    let types: Vec<String> = r.cluster.node_types.iter().map(|(k, v)| format!("{}× {k}", count(*v))).collect();
    let cluster = format!(
        "cluster:  {} nodes, {} GPUs, {} SR-IOV VFs ({})",
        count(r.cluster.nodes),
        count(r.cluster.gpus),
        count(r.cluster.vfs),
        types.join(", ")
    );
    let sizes: Vec<String> = r.workload.by_size.iter().map(|(k, v)| format!("{}× {k}-GPU", count(*v))).collect();
    let sizes = if sizes.is_empty() { String::new() } else { format!(" ({})", sizes.join(", ")) };
    // The generator's target is a rate: compare it with the load over the arrival window.
    let target = r.workload.target_load.map_or(String::new(), |t| {
        format!(
            " ({:.0}% over the arrival window, generated for {:.0}%)",
            r.workload.arrival_window_load * 100.0,
            t * 100.0
        )
    });
    let vfs = match r.workload.vf_pods {
        0 => String::new(),
        n => format!(", {} asking for VFs", count(n)),
    };
    let workload = format!(
        "workload: {} pods{sizes}{vfs}, offered load {:.0}% of GPU capacity while pods are present{target}",
        count(r.workload.pods),
        r.workload.offered_load * 100.0
    );
    [wrap(&cluster, 10), wrap(&workload, 10)]
}

/// `placed/offered` with thousands separators.
fn of(placed: usize, offered: usize) -> String {
    format!("{}/{}", count(placed), count(offered))
}

/// The default table: the headline columns in 100 columns, run times on a line below, a legend.
fn print_narrow(r: &SimReport) -> anyhow::Result<()> {
    let mut t = report_table(
        &[
            "policy",
            "placed",
            "short\nof VFs",
            "8-GPU\nplaced",
            "ring GB/s\nmean / p10",
            "VFs by\nGPUs",
            "stranded\nGPUs",
        ],
        &[1, 2, 3, 4, 5, 6],
    );
    for p in &r.policies {
        t.add_row(vec![
            p.policy.clone(),
            of(p.placed, p.placed + p.unplaced),
            count(p.unplaced_for_vfs),
            p.by_size.get(&8).map_or("-".to_string(), |c| of(c.placed, c.offered)),
            format!("{:.1} / {:.1}", p.mean_ring_bandwidth_gbps, p.p10_ring_bandwidth_gbps),
            near_share(p),
            format!("{:.1}", p.mean_stranded_gpus),
        ]);
    }
    outln!("{t}")?;
    let times: Vec<String> = r.policies.iter().map(|p| format!("{} {:.0} ms", p.policy, p.run_ms)).collect();
    outln!("{}", wrap(&format!("run time: {}", times.join(", ")), 10))?;
    outln!()?;
    let legend = [
        ("placed", "pods placed / offered (no queue: a pod that no node can take on arrival is lost)"),
        ("short of VFs", "pods asking VFs not placed although a node had their GPUs free (but not their VFs)"),
        ("8-GPU placed", "8-GPU pods placed / offered"),
        (
            "ring GB/s",
            "per placed multi-GPU pod, the best ring over its GPUs: its slowest hop, what a ring \
             all-reduce gets (GB/s per direction); mean and 10th percentile over pods",
        ),
        (
            "VFs by GPUs",
            "share of placed pods asking VFs whose every VF shares a PCIe switch with one of their \
             GPUs, so GPUDirect RDMA does not cross the host bridge",
        ),
        ("stranded GPUs", "free GPUs whose NVLink peers are all busy, mean over arrivals"),
        ("--wide", "adds the mean pair bandwidth, all-NVLink sets and stranded share of the free GPUs"),
    ];
    for (column, meaning) in legend {
        outln!("{}", wrap(&format!("{column:<14}{meaning}"), 14))?;
    }
    Ok(())
}

/// `VFs by GPUs`: the share, or `-` when no pod asking VFs was placed.
fn near_share(p: &weft_sim::PolicyReport) -> String {
    if p.vf_pods_placed == 0 { "-".to_string() } else { format!("{:.1}%", p.vf_near_gpu_share * 100.0) }
}

/// `--wide`: every column, as before the table had to fit 100 columns.
fn print_wide(r: &SimReport) -> anyhow::Result<()> {
    let mut t = table(&[
        "policy",
        "placed",
        "8-GPU placed",
        "ring GB/s mean/p10",
        "pair GB/s mean/p10",
        "all-NVLink sets",
        "VFs by their GPUs",
        "stranded free GPUs",
        "run time",
    ]);
    t.set_content_arrangement(comfy_table::ContentArrangement::Disabled);
    for p in &r.policies {
        let eight = p.by_size.get(&8).map_or("-".to_string(), |c| of(c.placed, c.offered));
        let short = if p.unplaced_for_vfs > 0 {
            format!(" ({} short of VFs)", count(p.unplaced_for_vfs))
        } else {
            String::new()
        };
        t.add_row(vec![
            p.policy.clone(),
            format!("{}{short}", of(p.placed, p.placed + p.unplaced)),
            eight,
            format!("{:.1} / {:.1}", p.mean_ring_bandwidth_gbps, p.p10_ring_bandwidth_gbps),
            format!("{:.1} / {:.1}", p.mean_pair_bandwidth_gbps, p.p10_pair_bandwidth_gbps),
            format!("{:.1}%", p.all_nvlink_share * 100.0),
            near_share(p),
            format!("{:.1} ({:.1}% of free)", p.mean_stranded_gpus, p.stranded_share_of_free * 100.0),
            format!("{:.0} ms", p.run_ms),
        ]);
    }
    outln!("{t}")?;
    outln!()?;
    let legend = "ring GB/s: what a ring all-reduce over each multi-GPU pod's GPUs gets, the slowest hop of the \
                  best ring (per direction, estimated from link type and generation); mean and 10th percentile \
                  over pods. pair GB/s: the mean over the set's GPU pairs instead, which hides a slow hop. VFs \
                  by their GPUs: share of placed pods asking for VFs whose every VF shares a PCIe switch with \
                  one of their GPUs (GPUDirect RDMA without the host bridge); short of VFs: pods not placed \
                  because no node with their GPUs free had their VFs free. stranded: free GPUs whose NVLink \
                  peers are all busy, averaged over arrivals.";
    outln!("{}", wrap(legend, 0))?;
    Ok(())
}
