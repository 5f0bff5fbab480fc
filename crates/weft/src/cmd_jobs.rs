//! `weft jobs`: see what weft and Volcano will do with a Volcano Job (being written).

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum JobsCommand {}

pub fn run(c: JobsCommand) -> anyhow::Result<()> {
    match c {}
}
