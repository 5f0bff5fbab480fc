//! `weft topo show|discover|publish`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use weft_topology::discover::{DiscoverOptions, DiscoveryCache, GpuBackend, SysfsRoot, discover};
use weft_topology::{NodeTopology, inventory, read_node_file, render};

use crate::kube_args::KubeArgs;

#[derive(Subcommand, Debug)]
pub enum TopoCommand {
    /// Print a node topology, convert it, or draw its NVLink graph.
    ///
    /// FILE is `nvidia-smi topo -m` text or a weft inventory (JSON/YAML); the form is detected.
    /// `--output json|yaml` converts to the inventory format; `dot` and `svg` draw the NVLink graph
    /// (`weft topo show node.txt -o svg > node.svg`).
    Show(ShowArgs),
    /// Discover this machine's topology: GPUs through NVML (build feature `nvml`), CPUs, NUMA nodes
    /// and NICs from sysfs. On a machine without GPUs it reports none, with the reason.
    Discover(DiscoverCmd),
    /// Write this node's topology to its `weft.io/gpu-topology` annotation (run by the node agent).
    ///
    /// The topology is discovered (as `weft topo discover`) unless `--topology FILE` gives it. The
    /// write is a merge patch, skipped when the annotation already holds the same value, and retried
    /// on conflicts and server errors.
    Publish(PublishArgs),
}

#[derive(Args, Debug)]
pub struct PublishArgs {
    /// Node to annotate. `--node-name` is an old spelling of it.
    #[arg(long, env = "NODE_NAME", alias = "node-name", value_name = "NAME")]
    node: String,
    /// Publish this topology file instead of discovering.
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    #[command(flatten)]
    kube: KubeArgs,
    /// Field manager recorded on the write.
    #[arg(long, default_value = "weft-agent")]
    field_manager: String,
    #[command(flatten)]
    discover: DiscoverArgs,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ShowOutput {
    /// The GPU matrix, NICs and CPU affinity, laid out like `nvidia-smi topo -m`.
    #[default]
    Table,
    /// Inventory JSON.
    Json,
    /// Inventory YAML.
    Yaml,
    /// Graphviz DOT of the NVLink graph.
    Dot,
    /// SVG drawing of the NVLink graph.
    Svg,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Topology file; `-` reads standard input; `builtin:NAME` is one of the embedded node types
    /// (`weft simulate --list-node-types` lists them).
    #[arg(value_name = "FILE|-|builtin:NAME")]
    file: PathBuf,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: ShowOutput,
    /// With `-o svg`: mark these GPUs (`0,1,2,3`, `4-7`) and the NICs on their PCIe switches
    /// with a coloured ring and outline.
    #[arg(long, value_parser = crate::output::parse_gpu_list_arg, value_name = "LIST")]
    highlight: Option<crate::output::GpuList>,
}

#[derive(Args, Debug, Clone)]
pub struct DiscoverArgs {
    /// Root of the sys/ and proc/ trees (for containers that mount the host's at another path).
    #[arg(long, default_value = "/", value_name = "DIR")]
    root: PathBuf,
    /// Node name recorded in the topology: `topo discover --node` (default: the host name); the
    /// agent and `topo publish` name the node with their own `--node`.
    #[arg(skip)]
    node_name: Option<String>,
    /// Cache of the slow GPU link queries, keyed by GPU UUIDs, driver and boot id. The agent and
    /// `topo publish` use /var/lib/weft/topology.json unless told otherwise; `topo discover`
    /// only inspects, and reads or writes a cache only when given one.
    #[arg(long, value_name = "FILE")]
    cache: Option<PathBuf>,
    /// Do not read or write the cache.
    #[arg(long)]
    no_cache: bool,
    /// Skip GPU discovery (CPUs, NUMA and NICs only).
    #[arg(long)]
    no_gpus: bool,
    /// Also list PCI network interfaces without an RDMA device.
    #[arg(long)]
    netdevs: bool,
}

#[derive(Args, Debug)]
pub struct DiscoverCmd {
    /// Node name recorded in the topology (default: the host name). `--node-name` is an old
    /// spelling of it.
    #[arg(long, alias = "node-name", value_name = "NAME")]
    node: Option<String>,
    #[command(flatten)]
    discover: DiscoverArgs,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: ShowOutput,
}

pub fn run(cmd: TopoCommand) -> anyhow::Result<()> {
    match cmd {
        TopoCommand::Show(a) => {
            let node = read_topology(&a.file)?;
            match a.highlight {
                Some(list) => {
                    if a.output != ShowOutput::Svg {
                        anyhow::bail!("--highlight marks GPUs on a drawing: use it with -o svg");
                    }
                    let set = highlighted(&node, "--highlight", "highlighted", list.0)?;
                    out!("{}", render::to_svg_with(&node, &set))?;
                    Ok(())
                }
                None => show(&node, a.output),
            }
        }
        TopoCommand::Discover(mut a) => {
            a.discover.node_name = a.node.take();
            let found = discover_node(&a.discover, None)?;
            for note in &found.notes {
                crate::component::note(format_args!("note: {note}"));
            }
            show(&found.node, a.output)
        }
        TopoCommand::Publish(a) => publish(a),
    }
}

/// A topology named on the command line: a file, `-` for standard input, or `builtin:NAME` for
/// one of the embedded node types.
pub fn read_topology(arg: &std::path::Path) -> anyhow::Result<NodeTopology> {
    let text = arg.to_str().unwrap_or_default();
    if text == "-" {
        let mut input = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut input).context("reading the topology from stdin")?;
        return Ok(weft_topology::parse_node(&input, "<stdin>")?);
    }
    if let Some(name) = text.strip_prefix("builtin:") {
        return Ok(weft_sim::cluster::builtin_topology(name)?);
    }
    Ok(read_node_file(arg)?)
}

/// One marked set for a drawing: `gpus` and the NICs on their PCIe switches, named `label` in the
/// legend; a GPU the node does not have is an error naming `flag`.
pub fn highlighted(
    node: &NodeTopology,
    flag: &str,
    label: &str,
    gpus: Vec<usize>,
) -> anyhow::Result<render::Highlight> {
    if let Some(bad) = gpus.iter().find(|&&g| g >= node.gpu_count()) {
        anyhow::bail!("{flag}: GPU{bad} is not on the node, which has {} GPUs", node.gpu_count());
    }
    let list: Vec<String> = gpus.iter().map(|g| format!("GPU{g}")).collect();
    let nics = render::nics_beside(node, &gpus);
    let label = format!("{label}: {}", list.join(" "));
    Ok(render::Highlight { sets: vec![render::Marked { label, gpus, nics }] })
}

fn publish(a: PublishArgs) -> anyhow::Result<()> {
    let mut node = match &a.topology {
        Some(p) => read_node_file(p)?,
        None => {
            let found = discover_node(&a.discover, Some(DiscoveryCache::DEFAULT_PATH))?;
            for note in &found.notes {
                crate::component::note(format_args!("note: {note}"));
            }
            found.node
        }
    };
    node.name = Some(a.node.clone());
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let outcome = rt.block_on(async {
        let client = a.kube.client().await?;
        weft_record::publish_topology(client, &a.node, &node, &a.field_manager)
            .await
            .with_context(|| format!("publishing the topology of node {}", a.node))
    })?;
    outln!("node {}: {} GPUs; annotation {}: {outcome:?}", a.node, node.gpu_count(), weft_record::TOPOLOGY_ANNOTATION)?;
    Ok(())
}

/// Run discovery with the command's options (shared with `weft topo publish`).
impl DiscoverArgs {
    /// Root of the sys/ and proc/ trees.
    pub fn root(&self) -> &std::path::Path {
        &self.root
    }
}

/// Run discovery with the command's options. `default_cache`: the cache used when the flags name
/// none (the agent's and `topo publish`'s; `topo discover` has none).
pub fn discover_node(
    a: &DiscoverArgs,
    default_cache: Option<&str>,
) -> anyhow::Result<weft_topology::discover::Discovery> {
    let cache = match (&a.cache, a.no_cache) {
        (_, true) => None,
        (Some(path), false) => Some(path.clone()),
        (None, false) => default_cache.map(PathBuf::from),
    };
    let opts = DiscoverOptions {
        root: SysfsRoot::new(a.root.clone()),
        node_name: a.node_name.clone(),
        netdevs: a.netdevs,
        gpus: if a.no_gpus { GpuBackend::Disabled } else { GpuBackend::Nvml },
        cache: cache.map(DiscoveryCache::new),
    };
    Ok(discover(&opts)?)
}

fn show(node: &NodeTopology, output: ShowOutput) -> anyhow::Result<()> {
    match output {
        ShowOutput::Json => outln!("{}", inventory::to_json_pretty(node))?,
        ShowOutput::Yaml => out!("{}", inventory::to_yaml(node)?)?,
        ShowOutput::Dot => out!("{}", render::to_dot(node))?,
        ShowOutput::Svg => out!("{}", render::to_svg(node))?,
        ShowOutput::Table => {
            if let Some(name) = &node.name {
                outln!("node {name}: {} GPUs, {} NICs", node.gpu_count(), node.nics.len())?;
            }
            if let Some(g) = node.nvlink_generation {
                outln!("NVLink generation: {g}")?;
            }
            if let Some(p) = node.pcie_generation {
                outln!("PCIe generation:   Gen{}", p.0)?;
            }
            if let Some(online) = &node.cpus.online {
                outln!("CPUs:              {} online ({online})", online.len())?;
            }
            if let Some(sockets) = node.cpus.sockets {
                outln!("sockets:           {sockets}")?;
            }
            for numa in &node.cpus.numa_nodes {
                outln!("NUMA node {}:       CPUs {}", numa.id, numa.cpus)?;
            }
            outln!()?;
            out!("{}", render::to_table(node))?;
        }
    }
    Ok(())
}
