//! `weft wait-for`: the launch-order init container (being written).

use clap::Args;

#[derive(Args, Debug)]
pub struct WaitArgs {}

pub fn run(a: WaitArgs) -> anyhow::Result<()> {
    let _ = a;
    anyhow::bail!("weft wait-for is being written")
}
