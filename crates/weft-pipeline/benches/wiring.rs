//! Pipeline wiring (what the mutating webhook computes per request): a 64-vertex pipeline whose
//! 63 edges are all bound (alternately `direct` and `multi-isbsvc`, on two networks), each vertex
//! a udf with a GPU claim and some environment. Issue #15's budget is 1 ms per vertex.
//!
//! `wire/unwired/64`: the first admission (every vertex gets claims, env, annotation).
//! `wire/wired/64`: an update of an already wired pipeline (no operations).
//! The criterion time divided by 64 is the time per vertex.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use weft_pipeline::{WiringOptions, wire};

fn pipeline(n: usize) -> Value {
    let vertices: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "name": format!("vertex-{i}"),
                "scale": {"min": 1, "max": 4},
                "limits": {"readBatchSize": 1},
                "udf": {"container": {
                    "image": format!("registry.example/stage-{i}:1.2.3"),
                    "args": ["--model", "/models/m.onnx"],
                    "env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": "BATCH", "value": "1"}],
                    "resources": {"limits": {"cpu": "4", "memory": "8Gi"}, "claims": [{"name": "gpu"}]}
                }},
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "a100"}]
            })
        })
        .collect();
    let edges: Vec<Value> = (1..n)
        .map(|i| {
            json!({"from": format!("vertex-{}", i - 1), "to": format!("vertex-{i}"),
                "numaNetwork": {"name": format!("net-{}", i % 2),
                    "connectionType": if i % 2 == 0 { "direct" } else { "multi-isbsvc" }}})
        })
        .collect();
    json!({"apiVersion": "numaflow.numaproj.io/v1alpha1", "kind": "Pipeline",
        "metadata": {"name": "video", "namespace": "media"},
        "spec": {"vertices": vertices, "edges": edges}})
}

fn bench(c: &mut Criterion) {
    let opts = WiringOptions::default();
    let exists = |_: &str| true;
    let mut group = c.benchmark_group("wire");
    for n in [8usize, 64] {
        let p = pipeline(n);
        let w = wire(&p, Some("media"), &opts, &exists).expect("valid");
        assert!(!w.ops.is_empty());
        let mut wired = p.clone();
        json_patch::patch(&mut wired, &w.ops).expect("applies");
        group.bench_with_input(BenchmarkId::new("unwired", n), &p, |b, p| {
            b.iter(|| wire(black_box(p), Some("media"), &opts, &exists))
        });
        group.bench_with_input(BenchmarkId::new("wired", n), &wired, |b, p| {
            b.iter(|| wire(black_box(p), Some("media"), &opts, &exists))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
