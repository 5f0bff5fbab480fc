//! NodePrepareResources and NodeUnprepareResources latency of weft's NIC DRA driver, through its
//! gRPC socket as the kubelet calls it, with the claims on the fake API server (real HTTP on
//! loopback), the checkpoint on disk (fsync included) and the fake PF (no SR-IOV here, so no
//! netlink VLAN call; no netns move: that is the NRI half's).
//!
//! One prepare is: read the claim, read the pod's GPU decision, find a free address (in the watch
//! cache, or by listing the network), create the NetworkAddress, write the checkpoint (fsync), read
//! and set the VF's VLAN. Each cycle prepares
//! a fresh claim and unprepares it (restore the VLAN, list and delete the address, write the
//! checkpoint). Measured on an empty network and on one where 500 addresses are held, with the
//! driver allocating from its watch cache of the NetworkAddresses (as the agent runs it) and
//! listing the network on every prepare (the fallback).
//!
//! `cargo bench -p weft-nic-dra --bench prepare`; `WEFT_NIC_DRA_BENCH_CYCLES` sets the cycles
//! (default 300, after 20 warm-up cycles). Prints p50, p99 and max per call in milliseconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use weft_nic_dra::api::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn report(what: &str, mut v: Vec<Duration>) {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{what:<44} p50 {:>7.3} ms   p99 {:>7.3} ms   max {:>7.3} ms   ({} calls)",
        ms(at(0.50)),
        ms(at(0.99)),
        ms(at(1.0)),
        v.len()
    );
}

async fn cycles(node: &Node, label: &str, held: usize, warm: usize, n: usize) {
    for i in 0..held {
        let (hi, lo) = (i / 250, i % 250 + 1);
        node.api
            .insert(json!({
                "apiVersion": "weft.io/v1alpha1", "kind": "NetworkAddress",
                "metadata": {"name": format!("{label}.10-40-{hi}-{lo}"),
                             "labels": {"weft.io/network": label, "weft.io/claim-uid": format!("other-{i}")}},
                "spec": {"network": label, "address": format!("10.40.{hi}.{lo}"), "node": "node-2",
                         "claim": {"namespace": NS, "name": format!("other-{i}"), "uid": format!("other-{i}")}}
            }))
            .unwrap();
    }
    let mut plugin = node.kubelet.plugin(DRIVER).await.unwrap();
    let (mut prepares, mut unprepares) = (Vec::new(), Vec::new());
    for i in 0..warm + n {
        let name = format!("{label}-{i}");
        let pod_name = format!("p-{name}");
        let vf = format!("vf-0000-03-00-{}", i % 4 + 2);
        node.add(
            claim(&name, &vf, nic_config(label, "10.40.0.0/16", Some(100)), &pod_name),
            &pod(&pod_name, &name, Some(&[0])),
        );
        let c = Claim { namespace: NS.into(), uid: format!("claim-{name}"), name: name.clone() };
        let start = Instant::now();
        let r = plugin.node_prepare_resources(NodePrepareResourcesRequest { claims: vec![c.clone()] }).await.unwrap();
        let took = start.elapsed();
        assert_eq!(r.into_inner().claims[&c.uid].error, "");
        let start = Instant::now();
        let r =
            plugin.node_unprepare_resources(NodeUnprepareResourcesRequest { claims: vec![c.clone()] }).await.unwrap();
        let took_un = start.elapsed();
        assert_eq!(r.into_inner().claims[&c.uid].error, "");
        if i >= warm {
            prepares.push(took);
            unprepares.push(took_un);
        }
    }
    let how = if node.cached { "cache" } else { "list" };
    report(&format!("NodePrepareResources ({how}, {held} held)"), prepares);
    report(&format!("NodeUnprepareResources ({how}, {held} held)"), unprepares);
}

fn main() {
    let n: usize = std::env::var("WEFT_NIC_DRA_BENCH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        for node in [Node::start().await, Node::start_listing().await] {
            cycles(&node, "bench-empty", 0, 20, n).await;
            cycles(&node, "bench-busy", 500, 20, n).await;
        }
    });
}
