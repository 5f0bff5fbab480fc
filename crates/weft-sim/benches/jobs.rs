//! `weft simulate --jobs` at the size of issue #27's target: 5,000 nodes (the built-in scenario
//! scaled: 139 GB200 NVL72 racks of 18 trays and 2,498 HGX H100 nodes) and 10,000 jobs of the
//! default generated stream (seed 1), ≤ 10 s on 2 cores for the whole comparison. Each policy alone,
//! then all four as `weft simulate --jobs` runs them (one thread per policy).
//! `cargo bench -p weft-sim --bench jobs`.

use criterion::{Criterion, criterion_group, criterion_main};
use weft_sim::jobs::{JobGenerate, JobPolicyKind, JobRun, asks, builtin_scenario, run_jobs, simulate_jobs};

fn bench(c: &mut Criterion) {
    let (spec, network) = builtin_scenario(139, 5_000 - 139 * 18);
    let net = network.build(&spec, None).expect("the scenario builds");
    let jobs = JobGenerate { jobs: 10_000, seed: 1, ..JobGenerate::default() }
        .jobs(net.cluster.total_gpus())
        .expect("the stream generates");
    let asks = asks(&jobs).expect("constraints read");
    let run = JobRun::default();
    let mut g = c.benchmark_group("jobs_10000_5000_nodes");
    g.sample_size(10);
    for kind in JobPolicyKind::ALL {
        g.bench_function(kind.name(), |b| {
            b.iter(|| {
                let mut p = kind.build(&net, &run.score).expect("builds");
                run_jobs(&net, &jobs, &asks, p.as_mut(), &run)
            })
        });
    }
    g.bench_function("all-four", |b| b.iter(|| simulate_jobs(&net, &jobs, &JobPolicyKind::ALL, &run).expect("runs")));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
