//! RunPodSandbox admission latency: admit + release of a Guaranteed 8-CPU pod whose GPUs sit on
//! NUMA node 1, on a 2-socket 128-CPU synthetic layout (2 sockets × 1 NUMA node × 32 cores × 2
//! threads, CPUs 0 and 64 reserved) with about half the CPUs already exclusive to other pods, under
//! each aligning policy; plus a Burstable pod (no exclusive CPUs) for comparison.
//!
//! After criterion's runs (only under `cargo bench`, not in `--test` mode), a plain timing loop
//! prints p50 / p99 / max of single admit+release pairs, since criterion reports means and medians
//! of batches.

#![allow(clippy::unwrap_used)] // benchmark setup

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group};
use weft_agent::orm::{OrmConfig, ResourceManager};
use weft_agent::pod::{ContainerKind, ContainerSpec, DeviceKind, PodDevice, PodSpec, QosClass};
use weft_agent::policy::TopologyPolicy;
use weft_topology::CpuLayout;

fn pod(uid: &str, qos: QosClass, milli: u64) -> PodSpec {
    let limit = (qos == QosClass::Guaranteed).then_some(milli);
    PodSpec {
        uid: uid.into(),
        namespace: "bench".into(),
        name: uid.into(),
        qos,
        containers: vec![ContainerSpec {
            name: "main".into(),
            kind: ContainerKind::App,
            cpu_request_milli: milli,
            cpu_limit_milli: limit,
            memory_request: 1 << 30,
            memory_limit: Some(1 << 30),
        }],
        annotations: BTreeMap::new(),
        pod_level_resources: false,
    }
}

fn gpus(ids: &[u32], numa: u32) -> Vec<PodDevice> {
    ids.iter()
        .map(|i| PodDevice {
            kind: DeviceKind::Gpu,
            id: i.to_string(),
            numa: Some(numa),
            interface: None,
            rdma_device: None,
        })
        .collect()
}

/// The 128-CPU node with ~64 CPUs exclusive: pods of 2–6 CPUs, GPUs alternating between the nodes.
fn loaded(policy: TopologyPolicy) -> ResourceManager {
    let layout = CpuLayout::synthetic(2, 1, 32, 2).unwrap().with_memory_per_numa(512 << 30);
    let cfg = OrmConfig { reserved: "0,64".parse().unwrap(), policy, ..OrmConfig::default() };
    let mut m = ResourceManager::new(layout, cfg).unwrap();
    let mut i = 0u32;
    while m.exclusive_cpus().len() < 64 {
        let cpus = [2u64, 4, 6][(i % 3) as usize];
        let p = pod(&format!("fill-{i}"), QosClass::Guaranteed, cpus * 1000);
        m.admit(&p, &gpus(&[i % 8], i % 2)).unwrap();
        i += 1;
    }
    m
}

fn admit_release(c: &mut Criterion) {
    let mut group = c.benchmark_group("admit_release");
    let guaranteed = pod("gpu-pod", QosClass::Guaranteed, 8000);
    let burstable = pod("web", QosClass::Burstable, 500);
    let devices = gpus(&[4, 5], 1);
    for policy in [TopologyPolicy::BestEffort, TopologyPolicy::Restricted, TopologyPolicy::SingleNumaNode] {
        let mut m = loaded(policy);
        eprintln!("{policy}: {} CPUs exclusive before the measured pod", m.exclusive_cpus().len());
        group.bench_function(BenchmarkId::new("guaranteed-8cpu-gpu-numa1", policy), |b| {
            b.iter(|| {
                let a = m.admit(black_box(&guaranteed), black_box(&devices)).unwrap();
                black_box(a.exclusive.len());
                m.release("gpu-pod").unwrap()
            })
        });
    }
    let mut m = loaded(TopologyPolicy::SingleNumaNode);
    group.bench_function(BenchmarkId::new("burstable-shared", "single-numa-node"), |b| {
        b.iter(|| {
            m.admit(black_box(&burstable), &[]).unwrap();
            m.release("web").unwrap()
        })
    });
    group.finish();
}

/// p50 / p99 / max of single admit+release pairs.
fn percentiles() {
    let guaranteed = pod("gpu-pod", QosClass::Guaranteed, 8000);
    let devices = gpus(&[4, 5], 1);
    for policy in [TopologyPolicy::BestEffort, TopologyPolicy::SingleNumaNode] {
        let mut m = loaded(policy);
        let mut samples: Vec<Duration> = Vec::with_capacity(20_000);
        for _ in 0..1_000 {
            m.admit(&guaranteed, &devices).unwrap();
            m.release("gpu-pod").unwrap();
        }
        for _ in 0..20_000 {
            let t = Instant::now();
            m.admit(black_box(&guaranteed), black_box(&devices)).unwrap();
            m.release("gpu-pod").unwrap();
            samples.push(t.elapsed());
        }
        samples.sort();
        let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize];
        println!(
            "admit+release {policy}: p50 {:?}  p99 {:?}  max {:?}  ({} samples)",
            at(0.5),
            at(0.99),
            samples[samples.len() - 1],
            samples.len()
        );
    }
}

criterion_group!(benches, admit_release);

fn main() {
    benches();
    if std::env::args().any(|a| a == "--bench") {
        percentiles();
    }
    Criterion::default().configure_from_args().final_summary();
}
