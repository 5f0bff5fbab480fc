//! Issue #4's targets: mutate each pod of a 1,000-replica job in ≤ 1 ms per pod including JSON
//! (de)serialisation, and render a 1,000-pod job in ≤ 200 ms.
//!
//! `cargo bench -p weft-admission --bench jobs`. The pod benchmark sends every pod's AdmissionReview
//! body through `weft webhook`'s handler (`WebhookState::review`: parse, find the Job, take the
//! cached plugins, patch, encode) and serialises the response; only HTTP and TLS are left out.
//! Building a job's plugins happens once per job version, so it is outside the loop (and measured
//! on its own).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use weft_admission::webhook::{AdmissionPath, InMemoryJobs, WebhookState};
use weft_jobs::admission::{AdmissionOptions, PodMutator, mutate_job};
use weft_jobs::render::{PlaceholderKeys, render};
use weft_jobs::{Job, naming};

const WORKERS: i64 = 1000;

fn container() -> Value {
    json!({"name": "main", "image": "example/train:1", "resources": {"limits": {"nvidia.com/gpu": "8"}}})
}

/// A job with `framework` in weft's annotation: one master/ps/head/scheduler task and 1,000 workers.
fn job(framework: &str) -> Value {
    let (lead, args, extra): (&str, Value, Vec<Value>) = match framework {
        "tensorflow" => ("ps", json!(["--ps=ps", "--worker=worker"]), vec![]),
        "pytorch" => ("master", json!([]), vec![]),
        "mpi" => ("master", json!([]), vec![]),
        "mxnet" => (
            "scheduler",
            json!([]),
            vec![json!({"name": "server", "replicas": 4, "template": {"spec": {"containers": [container()]}}})],
        ),
        "ray" => ("head", json!([]), vec![]),
        other => panic!("no benchmark job for {other}"),
    };
    let names = |n: &str| if framework == "ray" { json!([{"name": n, "image": "ray"}]) } else { json!([container()]) };
    let mut tasks = vec![json!({"name": lead, "replicas": 1, "template": {"spec": {"containers": names("head")}}})];
    tasks.extend(extra);
    tasks.push(json!({"name": "worker", "replicas": WORKERS, "template": {"spec": {"containers": names("worker")}}}));
    let plugins = json!({ framework: args, "env": [] }).to_string();
    let raw = json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "bench", "namespace": "ml", "uid": "0d4a7c1e-5b7e-4c57-9a55-7f1f2b3c4d5e", "resourceVersion": "7",
                     "annotations": {"weft.io/job-plugins": plugins}},
        "spec": {"tasks": tasks}});
    // As admitted: defaults and plugin dependencies applied.
    let mut admitted = raw.clone();
    json_patch::patch(&mut admitted, &mutate_job(&raw, &AdmissionOptions::default()).expect("mutates"))
        .expect("applies");
    admitted
}

/// AdmissionReview bodies for every pod of the job, as the API server sends them.
fn review_bodies(job: &Job) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for task in &job.spec.tasks {
        for i in 0..naming::replicas(task) {
            let pod = naming::volcano_pod(job, task, i);
            let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": format!("req-{i}"), "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "ml", "operation": "CREATE",
                    "userInfo": {"username": "system:serviceaccount:volcano-system:volcano-controllers"},
                    "object": pod, "dryRun": false}});
            out.push(serde_json::to_vec(&review).expect("serialises"));
        }
    }
    out
}

fn mutate_pods(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut group = c.benchmark_group("mutate_pod_1000_replicas");
    for framework in ["tensorflow", "pytorch", "mpi", "mxnet", "ray"] {
        let job: Job = serde_json::from_value(job(framework)).expect("a Job");
        let jobs = Arc::new(InMemoryJobs::new());
        jobs.insert(job.clone());
        let state = WebhookState::new(jobs, AdmissionOptions::default());
        let bodies = review_bodies(&job);
        // Warm the plugin cache, as the first pod of a job does.
        let first = rt.block_on(state.review(AdmissionPath::PodsMutate, &bodies[0])).expect("answers");
        assert!(serde_json::to_value(&first).expect("json")["response"]["patch"].is_string(), "{framework}: no patch");
        group.throughput(Throughput::Elements(bodies.len() as u64));
        // All pods of the job, one after another: time per element = time per pod.
        group.bench_with_input(BenchmarkId::new("all_pods", framework), &bodies, |b, bodies| {
            b.iter(|| {
                for body in bodies {
                    let response = rt.block_on(state.review(AdmissionPath::PodsMutate, body)).expect("answers");
                    black_box(serde_json::to_vec(&response).expect("serialises"));
                }
            });
        });
    }
    group.finish();

    let job: Job = serde_json::from_value(job("tensorflow")).expect("a Job");
    c.bench_function("build_pod_mutator/tensorflow_1001_pods", |b| {
        b.iter(|| black_box(PodMutator::new(&job, &AdmissionOptions::default()).expect("builds")));
    });
}

fn render_job(c: &mut Criterion) {
    let mut group = c.benchmark_group("render_1000_pod_job");
    group.sample_size(20);
    for framework in ["tensorflow", "pytorch", "mpi"] {
        let job = job(framework);
        group.bench_with_input(BenchmarkId::from_parameter(framework), &job, |b, job| {
            b.iter(|| black_box(render(job, &AdmissionOptions::default(), &PlaceholderKeys).expect("renders")));
        });
    }
    group.finish();
}

criterion_group!(benches, mutate_pods, render_job);
criterion_main!(benches);
