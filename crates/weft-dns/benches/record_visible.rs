//! DNS record write to visible in etcd, against a local etcd (Debian `etcd-server`, started here on
//! loopback with a temp data dir; fsync on, as in production).
//!
//! 1. **put → visible**: one client puts a record (weft's JSON, on a lease), then a second client
//!    (its own connection) does CoreDNS's prefix Get on the record's domain until the record is
//!    in the answer. Records are spread over 50 vertex domains of up to `n / 50` pods each.
//! 2. **pod Ready → visible** (the registrar end to end): a vertex pod on the fake API server,
//!    already carrying the registrar's finalizer, becomes Ready; the registrar (production
//!    controller settings: 100 ms debounce) reads its claim and puts the record; the second client polls the record's key (every 1 ms) until it is there.
//!
//! `cargo bench -p weft-dns --bench record_visible`; `WEFT_DNS_BENCH_RECORDS` sets n (default
//! 1000, after 50 warm-up records), `WEFT_DNS_BENCH_PODS` the pods of part 2 (default 100).
//! Prints p50, p99, max and mean in milliseconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::Etcd;
use tokio_util::sync::CancellationToken;
use weft_dns::record::{Owner, Prefix, Record};
use weft_dns::{DnsSettings, EtcdStore, RecordStore};
use weft_fakeapi::FakeApiServer;
use weft_kube::controller::{Context, ControllerMetrics, Settings};
use weft_pipeline::domain::{PIPELINE_NAME_LABEL, VERTEX_DOMAINS_ANNOTATION, VERTEX_NAME_LABEL};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn report(what: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let at = |q: f64| ms(v[((v.len() as f64 - 1.0) * q).round() as usize]);
    let mean = v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64;
    println!(
        "{what:<24} n {:>5}   p50 {:>7.2} ms   p99 {:>7.2} ms   max {:>7.2} ms   mean {:>7.2} ms",
        v.len(),
        at(0.50),
        at(0.99),
        ms(v[v.len() - 1]),
        mean
    );
}

fn domain(vertex: usize) -> String {
    format!("v{vertex}.net-a.video.default.vertexdomain.local")
}

async fn put_to_visible(writer: &EtcdStore, reader: &EtcdStore, warm: usize, n: usize) -> Vec<Duration> {
    let prefix = Prefix::new("/skydns").unwrap();
    let lease = writer.grant(60).await.unwrap();
    let mut out = Vec::with_capacity(n);
    for i in 0..warm + n {
        let d = domain(i % 50);
        let pod = format!("video-v-{i}");
        let key = prefix.record_key(&d, &pod);
        let owner =
            Owner { owner: "bench".into(), namespace: "default".into(), pod: pod.clone(), pod_uid: format!("u{i}") };
        let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        let value = Record::new(ip.parse().unwrap(), 10, owner).to_bytes();
        let dir = format!("{}/", prefix.domain_key(&d));
        let start = Instant::now();
        writer.put(&key, value, lease.id).await.unwrap();
        loop {
            let seen = reader.get_prefix(&dir).await.unwrap();
            if seen.iter().any(|kv| kv.key == key) {
                break;
            }
        }
        if i >= warm {
            out.push(start.elapsed());
        }
    }
    out
}

async fn ready_to_visible(etcd: &Etcd, reader: &EtcdStore, n: usize) -> Vec<Duration> {
    let server = FakeApiServer::start().await;
    let metrics = ControllerMetrics::default();
    let ctx = Context::new(server.client(), "weft-controller", None, "weft-controller", metrics);
    let dns =
        DnsSettings { endpoints: vec![etcd.endpoint.clone()], registrar_id: "bench".into(), ..DnsSettings::default() };
    let store = EtcdStore::connect(&dns.endpoints, dns.request_timeout).unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let task = tokio::spawn(async move {
        weft_dns::run_with_store(store, ctx, Settings::new(weft_dns::NAME), dns, async move { s.cancelled().await })
            .await
            .unwrap();
    });
    let prefix = Prefix::new("/skydns").unwrap();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("video-inference-{i}");
        let d = "inference.net-a.video.default.vertexdomain.local";
        server
            .insert(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": format!("{name}-nic"), "namespace": "default"},
                "spec": {},
                "status": {"devices": [{"driver": "nic.weft.io", "pool": "n1", "device": "vf0",
                    "networkData": {"ips": [format!("192.168.{}.{}/16", i / 250, i % 250 + 1)]}}]},
            }))
            .unwrap();
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                "labels": {PIPELINE_NAME_LABEL: "video", VERTEX_NAME_LABEL: "inference"},
                "annotations": {VERTEX_DOMAINS_ANNOTATION: json!([{"network": "net-a", "domain": d, "claim": "nic"}]).to_string()}},
            "spec": {"containers": [{"name": "udf", "image": "udf"}],
                "resourceClaims": [{"name": "nic", "resourceClaimName": format!("{name}-nic")}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        });
        let key = prefix.record_key(d, &name);
        server.insert(pod).unwrap();
        // The pod as the registrar first sees it: created, not yet Ready, given the finalizer.
        let finalized = |p: &serde_json::Value| p["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        server.wait_for_object("pods", Some("default"), &name, finalized).await;
        let start = Instant::now();
        server
            .modify("pods", Some("default"), &name, |p| {
                p["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
            })
            .unwrap();
        while reader.get(&key).await.unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        out.push(start.elapsed());
    }
    stop.cancel();
    task.await.unwrap();
    out
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let Some(etcd) = Etcd::start().await else { return };
        let (writer, reader) = (etcd.store(), etcd.store());
        let n = env_usize("WEFT_DNS_BENCH_RECORDS", 1000);
        report("put -> visible", put_to_visible(&writer, &reader, 50, n).await);
        let pods = env_usize("WEFT_DNS_BENCH_PODS", 100);
        report("pod Ready -> visible", ready_to_visible(&etcd, &reader, pods).await);
    });
}
