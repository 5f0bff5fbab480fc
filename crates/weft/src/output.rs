//! Output formats shared by the subcommands.

use clap::ValueEnum;
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

/// `--output` for commands that print a result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A readable table.
    #[default]
    Table,
    /// JSON, for scripts.
    Json,
}

/// A table with weft's look.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic).set_header(header.to_vec());
    t
}

/// Print a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Parse a GPU list: `0,1,4-7`.
pub fn parse_gpu_list(s: &str) -> Result<Vec<usize>, String> {
    let set: weft_topology::CpuSet = s.parse().map_err(|e: weft_topology::TopologyError| {
        format!("'{s}' is not a GPU list like 0,1,4-7 ({e})").replace("CPU list", "list")
    })?;
    Ok(set.iter().map(|g| g as usize).collect())
}
