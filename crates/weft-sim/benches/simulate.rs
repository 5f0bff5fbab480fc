//! `weft simulate` at scale: 10,000 pods on 500 nodes (the embedded mix scaled), per policy.
//! Target (issue #2): ≤ 10 s for the run. `cargo bench -p weft-sim --bench simulate`.

use criterion::{Criterion, criterion_group, criterion_main};
use weft_alloc::ScoreConfig;
use weft_sim::{ClusterSpec, Generate, PlacementPolicy, run_policy};

fn bench(c: &mut Criterion) {
    let cluster = ClusterSpec::embedded_default().scaled(500).build(None).expect("embedded cluster builds");
    let pods = Generate::default_for(cluster.total_gpus(), 10_000, 1).pods().expect("default workload");
    let mut g = c.benchmark_group("simulate_10000_pods_500_nodes");
    g.sample_size(10);
    for policy in PlacementPolicy::ALL {
        g.bench_function(policy.name(), |b| {
            b.iter(|| run_policy(&cluster, &pods, policy, &ScoreConfig::default(), 1, &mut |_| {}).expect("runs"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
