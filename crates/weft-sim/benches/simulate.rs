//! `weft simulate` at scale, per policy: the embedded mix scaled to 500 nodes with 10,000 pods
//! (target of issue #2: ≤ 10 s), and to 5,000 nodes with 100,000 pods (issue #12: ≤ 10 s for all
//! three policies on 2 cores, weft at most 4× blind). The stream is the default one: half of its
//! pods ask for a VF. `cargo bench -p weft-sim --bench simulate`.

use criterion::{Criterion, criterion_group, criterion_main};
use weft_alloc::ScoreConfig;
use weft_sim::{ClusterSpec, Generate, PlacementPolicy, run_policy};

fn bench(c: &mut Criterion) {
    for (nodes, pods) in [(500, 10_000), (5_000, 100_000)] {
        let cluster = ClusterSpec::embedded_default().scaled(nodes).build(None).expect("embedded cluster builds");
        let stream = Generate::default_for(cluster.total_gpus(), pods, 1).pods().expect("default workload");
        let mut g = c.benchmark_group(format!("simulate_{pods}_pods_{nodes}_nodes"));
        g.sample_size(10);
        for policy in PlacementPolicy::ALL {
            g.bench_function(policy.name(), |b| {
                b.iter(|| run_policy(&cluster, &stream, policy, &ScoreConfig::default(), 1, &mut |_| {}).expect("runs"))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
