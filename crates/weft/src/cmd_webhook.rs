//! `weft webhook`: admission for Volcano Jobs and their pods (being written).

use clap::Args;

#[derive(Args, Debug)]
pub struct WebhookArgs {}

pub fn run(a: WebhookArgs) -> anyhow::Result<()> {
    let _ = a;
    anyhow::bail!("weft webhook is being written")
}
