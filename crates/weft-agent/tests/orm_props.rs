//! Properties of the resource manager over random interleavings of admits and releases, on random
//! layouts, under every topology policy:
//! - exclusive CPU sets of different pods never overlap and never include a reserved CPU;
//! - the shared pool is exactly the online CPUs minus the exclusive ones, and never empty;
//! - every container's CPUs lie within its pod's; long-running containers do not share CPUs; the
//!   pod holds exactly kubelet's pod-level count; the settings agree with the allocation;
//! - under `single-numa-node` every pod's exclusive CPUs and located devices sit on one NUMA node;
//! - a refused admit changes nothing; `restore(state())` gives the same state back;
//! - after releasing everything the pool is whole again and no memory stays charged.

#![allow(clippy::unwrap_used)] // tests assert by unwrapping

use std::collections::BTreeMap;

use proptest::prelude::*;
use weft_agent::orm::{OrmConfig, ResourceManager};
use weft_agent::pod::{ContainerKind, ContainerSpec, DeviceKind, PodDevice, PodSpec, QosClass};
use weft_agent::policy::TopologyPolicy;
use weft_topology::{CpuLayout, CpuSet};

#[derive(Clone, Debug)]
enum Shape {
    /// Guaranteed, integer CPUs per app container, optional sidecar and init container.
    Integer {
        apps: Vec<u64>,
        sidecar: Option<u64>,
        init: Option<u64>,
    },
    /// Guaranteed with a fractional container.
    Fractional {
        milli: u64,
    },
    Burstable {
        milli: u64,
        limit: Option<u64>,
    },
    BestEffort,
}

#[derive(Clone, Debug)]
struct PodGen {
    shape: Shape,
    /// Devices: `None` = none; `Some(numa)` = one GPU with that (possibly unknown) node.
    gpu: Option<Option<u32>>,
    mem_gib: u64,
}

#[derive(Clone, Debug)]
enum Op {
    Admit(PodGen),
    Release(usize),
}

#[derive(Clone, Debug)]
struct Setup {
    sockets: u32,
    numa_per_socket: u32,
    cores: u32,
    threads: u32,
    reserved: usize,
    memory_gib: Option<u64>,
    policy: TopologyPolicy,
    align_memory: bool,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        3 => (prop::collection::vec(1u64..=5, 1..=3), prop::option::of(1u64..=2), prop::option::of(1u64..=6))
            .prop_map(|(apps, sidecar, init)| Shape::Integer { apps, sidecar, init }),
        1 => (1u64..=3999).prop_filter("fractional", |m| !m.is_multiple_of(1000)).prop_map(|milli| Shape::Fractional { milli }),
        1 => (1u64..=4000, prop::option::of(1u64..=8000)).prop_map(|(milli, limit)| Shape::Burstable { milli, limit }),
        1 => Just(Shape::BestEffort),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (shape(), prop::option::of(prop::option::of(0u32..4)), 0u64..=12)
            .prop_map(|(shape, gpu, mem_gib)| Op::Admit(PodGen { shape, gpu, mem_gib })),
        1 => (0usize..64).prop_map(Op::Release),
    ]
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        1u32..=2,
        1u32..=2,
        1u32..=4,
        1u32..=2,
        0usize..=2,
        prop::option::of(8u64..=32),
        prop::sample::select(TopologyPolicy::ALL.to_vec()),
        any::<bool>(),
    )
        .prop_map(|(sockets, numa_per_socket, cores, threads, reserved, memory_gib, policy, align_memory)| Setup {
            sockets,
            numa_per_socket,
            cores,
            threads,
            reserved,
            memory_gib,
            policy,
            align_memory,
        })
}

fn spec(uid: &str, g: &PodGen) -> PodSpec {
    let mem = g.mem_gib << 30;
    let c = |name: &str, kind, milli: u64, limit: Option<u64>, mem_limit: Option<u64>| ContainerSpec {
        name: name.into(),
        kind,
        cpu_request_milli: milli,
        cpu_limit_milli: limit,
        memory_request: mem,
        memory_limit: mem_limit,
    };
    let (qos, containers) = match &g.shape {
        Shape::Integer { apps, sidecar, init } => {
            let mut cs = Vec::new();
            if let Some(s) = sidecar {
                cs.push(c("side", ContainerKind::Sidecar, s * 1000, Some(s * 1000), Some(mem)));
            }
            if let Some(i) = init {
                cs.push(c("init", ContainerKind::Init, i * 1000, Some(i * 1000), Some(mem)));
            }
            for (i, a) in apps.iter().enumerate() {
                cs.push(c(&format!("app{i}"), ContainerKind::App, a * 1000, Some(a * 1000), Some(mem)));
            }
            (QosClass::Guaranteed, cs)
        }
        Shape::Fractional { milli } => (
            QosClass::Guaranteed,
            vec![
                c("frac", ContainerKind::App, *milli, Some(*milli), Some(mem)),
                c("int", ContainerKind::App, 1000, Some(1000), Some(mem)),
            ],
        ),
        Shape::Burstable { milli, limit } => {
            (QosClass::Burstable, vec![c("b", ContainerKind::App, *milli, *limit, None)])
        }
        Shape::BestEffort => (QosClass::BestEffort, vec![c("e", ContainerKind::App, 0, None, None)]),
    };
    PodSpec {
        uid: uid.into(),
        namespace: "ns".into(),
        name: uid.into(),
        qos,
        containers,
        annotations: BTreeMap::new(),
        pod_level_resources: false,
    }
}

fn devices(g: &PodGen, layout: &CpuLayout) -> Vec<PodDevice> {
    let nodes = layout.numa_nodes();
    match g.gpu {
        None => vec![],
        Some(numa) => vec![PodDevice {
            kind: DeviceKind::Gpu,
            id: "0".into(),
            // Map the drawn node onto one the layout has (or leave it unknown).
            numa: numa.map(|n| nodes[n as usize % nodes.len()]),
            interface: None,
            rdma_device: None,
        }],
    }
}

/// kubelet's pod-level exclusive CPU count for the specs built by `spec`.
fn expected_exclusive(p: &PodSpec) -> usize {
    if p.qos != QosClass::Guaranteed {
        return 0;
    }
    let n = |c: &ContainerSpec| {
        if c.cpu_request_milli.is_multiple_of(1000) { (c.cpu_request_milli / 1000) as usize } else { 0 }
    };
    let (mut sidecars, mut apps, mut inits) = (0, 0, 0);
    for c in &p.containers {
        match c.kind {
            ContainerKind::Sidecar => sidecars += n(c),
            ContainerKind::Init => inits = std::cmp::max(inits, sidecars + n(c)),
            ContainerKind::App => apps += n(c),
        }
    }
    std::cmp::max(apps + sidecars, inits)
}

fn minus(a: &CpuSet, b: &CpuSet) -> CpuSet {
    a.iter().filter(|c| !b.contains(*c)).collect()
}

fn check(m: &ResourceManager, reserved: &CpuSet, specs: &BTreeMap<String, PodSpec>, policy: TopologyPolicy) {
    let layout = m.layout();
    let online = layout.online();
    let mut all_exclusive = CpuSet::new();
    let mut memory: BTreeMap<u32, u64> = BTreeMap::new();
    for pod in m.pods() {
        for c in pod.exclusive.iter() {
            assert!(!all_exclusive.contains(c), "CPU {c} of pod {} is exclusive to two pods", pod.uid);
            assert!(!reserved.contains(c), "reserved CPU {c} is exclusive to pod {}", pod.uid);
            assert!(online.contains(c));
            all_exclusive.insert(c);
        }
        assert_eq!(pod.exclusive.len(), expected_exclusive(&specs[&pod.uid]), "pod {}", pod.uid);
        let mut long_running = CpuSet::new();
        for c in &pod.containers {
            assert!(c.cpus.iter().all(|x| pod.exclusive.contains(x)), "container {} outside its pod", c.spec.name);
            if c.spec.kind != ContainerKind::Init {
                assert!(c.cpus.iter().all(|x| !long_running.contains(x)), "containers of {} share CPUs", pod.uid);
                long_running = long_running.iter().chain(c.cpus.iter()).collect();
            }
            let s = m.settings(&pod.uid, &c.spec.name).unwrap();
            if c.is_exclusive() {
                assert_eq!(s.cpus, c.cpus);
                assert_eq!(s.cpu_quota, Some(-1));
            } else {
                assert_eq!(s.cpus, m.shared_pool());
            }
            assert!(!s.cpus.is_empty());
            assert!(s.mems.iter().all(|n| layout.numa_nodes().contains(&n)));
        }
        if policy == TopologyPolicy::SingleNumaNode && !pod.exclusive.is_empty() {
            let nodes: CpuSet = pod.exclusive.iter().map(|c| layout.cpu(c).unwrap().numa).collect();
            assert_eq!(nodes.len(), 1, "pod {} spans NUMA nodes {nodes} under single-numa-node", pod.uid);
            for d in &pod.devices {
                if let Some(n) = d.numa {
                    assert!(nodes.contains(n), "pod {} CPUs on {nodes}, device on {n}", pod.uid);
                }
            }
        }
        for (n, b) in &pod.memory_numa {
            *memory.entry(*n).or_default() += b;
        }
    }
    assert_eq!(m.exclusive_cpus(), &all_exclusive);
    assert_eq!(m.shared_pool(), minus(&online, &all_exclusive));
    assert!(!m.shared_pool().is_empty());
    assert!(reserved.iter().all(|c| m.shared_pool().contains(c)));
    for (n, used) in m.memory_used() {
        assert_eq!(*used, memory.get(n).copied().unwrap_or(0), "memory charged on NUMA {n}");
    }
    let restored = ResourceManager::restore(layout.clone(), m.config().clone(), m.state()).unwrap();
    assert_eq!(restored.state(), m.state());
    assert_eq!(restored.shared_pool(), m.shared_pool());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn admits_and_releases_keep_the_invariants(s in setup(), ops in prop::collection::vec(op(), 1..40)) {
        let mut layout = CpuLayout::synthetic(s.sockets, s.numa_per_socket, s.cores, s.threads).unwrap();
        if let Some(gib) = s.memory_gib {
            layout = layout.with_memory_per_numa(gib << 30);
        }
        // Reserve the first `reserved` CPUs, but never all of them.
        let reserved: CpuSet = layout.online().iter().take(s.reserved.min(layout.len() - 1)).collect();
        let cfg = OrmConfig { reserved: reserved.clone(), policy: s.policy, align_memory: s.align_memory, memory_high_percent: Some(90), ..OrmConfig::default() };
        let mut m = ResourceManager::new(layout.clone(), cfg).unwrap();
        let mut specs: BTreeMap<String, PodSpec> = BTreeMap::new();
        let mut admitted: Vec<String> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Admit(g) => {
                    let uid = format!("p{i}");
                    let p = spec(&uid, g);
                    let before = m.state();
                    let pool_before = m.shared_pool();
                    specs.insert(uid.clone(), p.clone());
                    match m.admit(&p, &devices(g, &layout)) {
                        Ok(a) => {
                            prop_assert_eq!(&a.uid, &uid);
                            admitted.push(uid.clone());
                            // Idempotent.
                            let again = m.admit(&p, &[]).unwrap().clone();
                            prop_assert_eq!(Some(&again), m.allocation(&uid));
                        }
                        Err(e) => {
                            prop_assert!(e.to_string().contains(&format!("ns/{uid}")), "error does not name the pod: {}", e);
                            prop_assert_eq!(m.state(), before);
                            prop_assert_eq!(m.shared_pool(), pool_before);
                        }
                    }
                }
                Op::Release(k) => {
                    if !admitted.is_empty() {
                        let uid = admitted.remove(k % admitted.len());
                        let gone = m.release(&uid).unwrap();
                        prop_assert!(gone.exclusive.iter().all(|c| m.shared_pool().contains(c)));
                        prop_assert!(m.release(&uid).is_none());
                    }
                }
            }
            check(&m, &reserved, &specs, s.policy);
        }
        for uid in admitted {
            m.release(&uid).unwrap();
        }
        prop_assert_eq!(m.pods().count(), 0);
        prop_assert_eq!(m.shared_pool(), layout.online());
        prop_assert!(m.memory_used().values().all(|b| *b == 0));
    }
}
