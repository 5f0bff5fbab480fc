//! Numaflow pipelines on NumaNetworks (seed 000): which vertex pod gets which node, GPUs, NIC, IP
//! address and DNS name, under each placement policy.
//!
//! A scenario (`kind: SimPipelines`) names NumaNetworks (`name`, `ipRange`, optional `vlan`, and
//! the `physnet` whose SR-IOV VFs are its NICs) and pipelines (vertices with replicas and GPUs,
//! edges, some bound to a NumaNetwork `direct` or `multi-isbsvc`). [`embedded_default`] is the
//! seed's video pipeline (`scenarios/video-pipeline.yaml`).
//!
//! What each vertex pod asks for follows weft's Pipeline webhook (`weft_pipeline::wire`): every
//! vertex at either end of a bound edge gets one NIC on that edge's network (one per network,
//! however many edges), on top of the GPUs the scenario gives it. Its DNS name on a network is
//! [`weft_pipeline::vertex_domain`] (one A record per pod under it); its `VERTEX_DOMAIN_TARGETS` are
//! the domains of the vertices it sends to over `direct` edges.
//!
//! Pods are placed one by one in scenario order (pipelines, vertices, replicas) on an empty cluster
//! and stay. Each policy places the same pods as in the event loop ([`crate::engine`]):
//! - `weft`: the node with the highest score, ties to fewer free GPUs then node order; a pod with
//!   GPUs is scored with [`weft_alloc::score_node`], and if it asks NICs, gets GPUs and VFs from
//!   [`weft_net::joint::decide`] under [`weft_net::joint::joint_score`] (the scheduler extender's
//!   decision); a pod without GPUs scores the same on every node that has its VFs (the extender's
//!   neutral score) and gets `decide`'s VFs.
//! - `blind`: a seeded uniform draw among the nodes that fit; go-gpuallocator-style GPUs, the lowest
//!   free VF addresses.
//! - `least-allocated`: the largest free GPU share (ties: node order); GPUs and VFs as `blind`.
//!
//! Addresses: each network hands out the lowest free address of its range in placement order
//! ([`next_free_address`]), the network address and the IPv4 broadcast address excluded
//! ([`weft_net::nic_claim::usable_addresses`]). A range too small for the pods on the network is
//! an error before anything is placed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use weft_alloc::{ScoreCache, ScoreConfig};
use weft_net::joint::{VfAsk, decide, joint_score};
use weft_net::nic_claim::usable_addresses;
use weft_pipeline::{DEFAULT_ZONE, vertex_domain};

use crate::cluster::{Cluster, DEFAULT_PHYSNET, MAX_VFS_PER_NODE, valid_physnet};
use crate::engine::{all_near, all_of, gpuallocator_style, mask_to_vec, vec_to_mask};
use crate::{ClusterSummary, PlacementPolicy, SimError};

/// `kind` of a pipeline scenario.
pub const KIND: &str = "SimPipelines";
/// Most replicas one vertex may have.
pub const MAX_REPLICAS: usize = 10_000;
/// Most vertex pods a scenario may have in all.
pub const MAX_VERTEX_PODS: usize = 100_000;

const EMBEDDED: &str = include_str!("../scenarios/video-pipeline.yaml");

/// A pipeline scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PipelineScenario {
    /// `weft.io/v1alpha1`.
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// The zone vertex domains live under; default [`DEFAULT_ZONE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The NumaNetworks.
    pub numa_networks: Vec<NumaNetworkSpec>,
    /// The pipelines.
    pub pipelines: Vec<PipelineSpec>,
}

/// A NumaNetwork: its address range, VLAN and the physnet whose VFs are its NICs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NumaNetworkSpec {
    /// Name (one DNS label: it is a level of the vertex domains).
    pub name: String,
    /// The range addresses come from; a network address (host bits zero).
    pub ip_range: IpNet,
    /// 802.1Q VLAN ID (1–4094); absent: untagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// The physnet (NIC pool) of the VFs; default [`DEFAULT_PHYSNET`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physnet: Option<String>,
}

impl NumaNetworkSpec {
    /// The physnet of the network's NICs.
    pub fn physnet(&self) -> &str {
        self.physnet.as_deref().unwrap_or(DEFAULT_PHYSNET)
    }
}

/// A Numaflow pipeline, as far as placement and wiring go.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PipelineSpec {
    /// Pipeline name.
    pub name: String,
    /// Namespace; default `default`.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Vertices, in placement order.
    pub vertices: Vec<VertexSpec>,
    /// Edges.
    #[serde(default)]
    pub edges: Vec<EdgeSpec>,
}

fn default_namespace() -> String {
    "default".to_string()
}

fn one() -> usize {
    1
}

/// A vertex: how many pods and how many GPUs each asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VertexSpec {
    /// Vertex name.
    pub name: String,
    /// Pods; default 1.
    #[serde(default = "one")]
    pub replicas: usize,
    /// GPUs each pod asks for; default 0.
    #[serde(default)]
    pub gpus: usize,
}

/// An edge, maybe bound to a NumaNetwork.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EdgeSpec {
    /// From vertex.
    pub from: String,
    /// To vertex.
    pub to: String,
    /// The NumaNetwork it runs over, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_network: Option<EdgeNetwork>,
}

/// `edges[].numaNetwork`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EdgeNetwork {
    /// The NumaNetwork's name.
    pub name: String,
    /// `direct` or `multi-isbsvc`.
    pub connection_type: Connection,
}

/// How an edge uses its NumaNetwork.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Connection {
    /// The from-vertex sends straight to the to-vertex's pods.
    Direct,
    /// Through an inter-step buffer service on the network.
    MultiIsbsvc,
}

/// The embedded scenario: the seed's video pipeline.
pub fn embedded_default() -> PipelineScenario {
    // The embedded file is part of the build and a test parses it.
    parse_scenario(EMBEDDED, "builtin:video-pipeline").unwrap_or_else(|e| panic!("embedded scenario: {e}"))
}

/// Parse a scenario (YAML or JSON).
pub fn parse_scenario(text: &str, source_name: &str) -> Result<PipelineScenario, SimError> {
    let fmt = |message: String| SimError::Format { source_name: source_name.to_string(), message };
    let s: PipelineScenario = serde_saphyr::from_str(text).map_err(|e| fmt(e.to_string()))?;
    if s.api_version != crate::API_VERSION || s.kind != KIND {
        return Err(fmt(format!(
            "expected apiVersion {} kind {KIND}, found {} {}",
            crate::API_VERSION,
            s.api_version,
            s.kind
        )));
    }
    Ok(s)
}

/// Read a scenario file.
pub fn read_scenario(path: &std::path::Path) -> Result<PipelineScenario, SimError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| SimError::Io { path: path.display().to_string(), source })?;
    parse_scenario(&text, &path.display().to_string())
}

impl PipelineScenario {
    /// The same scenario with every vertex at `replicas` pods.
    pub fn with_replicas(mut self, replicas: usize) -> PipelineScenario {
        for v in self.pipelines.iter_mut().flat_map(|p| p.vertices.iter_mut()) {
            v.replicas = replicas;
        }
        self
    }
}

/// The lowest address of `range` that may be handed out (not the network address, nor the IPv4
/// broadcast address; every address of a /31, /32, /127 or /128) and is not in `used`; None when
/// every one is used.
pub fn next_free_address(range: &IpNet, used: &BTreeSet<IpAddr>) -> Option<IpAddr> {
    let (base, host_bits) = match range {
        IpNet::V4(n) => (u128::from(u32::from(n.network())), 32 - u32::from(n.prefix_len())),
        IpNet::V6(n) => (u128::from(n.network()), 128 - u32::from(n.prefix_len())),
    };
    let to_ip = |x: u128| -> IpAddr {
        match range {
            // An IPv4 range's addresses fit 32 bits.
            IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(x as u32)),
            IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(x)),
        }
    };
    let as_int = |ip: &IpAddr| -> u128 {
        match ip {
            IpAddr::V4(a) => u128::from(u32::from(*a)),
            IpAddr::V6(a) => u128::from(*a),
        }
    };
    let first = base + u128::from(host_bits > 1);
    let usable = usable_addresses(range);
    let mut candidate = first;
    for ip in used.range(to_ip(first)..) {
        if ip.is_ipv4() != range.addr().is_ipv4() {
            break;
        }
        match as_int(ip).cmp(&candidate) {
            std::cmp::Ordering::Less => {}
            std::cmp::Ordering::Equal => candidate = candidate.checked_add(1)?,
            std::cmp::Ordering::Greater => break,
        }
    }
    (candidate - first < usable).then(|| to_ip(candidate))
}

/// One NIC a vertex pod holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodNic {
    /// The NumaNetwork.
    pub network: String,
    /// The VF's PCI address.
    pub vf: String,
    /// The VF's physical NIC.
    pub nic: String,
    /// The address from the network's range.
    pub ip: IpAddr,
    /// The network's VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// The pod's DNS name on the network (its vertex domain; one A record per pod).
    pub domain: String,
}

/// Where one vertex pod went and what it got.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VertexPod {
    /// Pipeline.
    pub pipeline: String,
    /// Namespace.
    pub namespace: String,
    /// Vertex.
    pub vertex: String,
    /// Pod name (`<pipeline>-<vertex>-<replica>`).
    pub pod: String,
    /// The node; None when no node could take the pod.
    pub node: Option<String>,
    /// GPUs (positions on the node).
    pub gpus: Vec<usize>,
    /// NICs, one per NumaNetwork the vertex is on.
    pub nics: Vec<PodNic>,
    /// `VERTEX_DOMAIN_TARGETS`: the domains it sends to over `direct` edges.
    pub domain_targets: Vec<String>,
    /// Whether every NIC shares a PCIe switch with one of its GPUs (None: the pod lacks GPUs or NICs,
    /// or was not placed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aligned: Option<bool>,
}

/// One policy's placement of the scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelinePolicyReport {
    /// Policy name.
    pub policy: String,
    /// Vertex pods placed.
    pub placed: usize,
    /// Vertex pods no node could take.
    pub unplaced: usize,
    /// Placed pods holding GPUs and NICs (the alignment share's denominator).
    pub nic_gpu_pods: usize,
    /// Of those, pods whose every NIC shares a PCIe switch with one of their GPUs.
    pub aligned_pods: usize,
    /// `aligned_pods / nic_gpu_pods` (0 when none).
    pub alignment_share: f64,
    /// Every vertex pod, in placement order.
    pub pods: Vec<VertexPod>,
}

/// A NumaNetwork in the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSummary {
    /// Name.
    pub name: String,
    /// Range.
    pub ip_range: IpNet,
    /// VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// Physnet of its NICs.
    pub physnet: String,
    /// Addresses the range can hand out.
    pub usable_addresses: u128,
    /// Vertex pods that ask for a NIC on it.
    pub pods: usize,
}

/// The report of `weft simulate --pipelines`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelineReport {
    /// The cluster.
    pub cluster: ClusterSummary,
    /// The networks.
    pub networks: Vec<NetworkSummary>,
    /// One entry per policy, in the order run.
    pub policies: Vec<PipelinePolicyReport>,
}

/// A vertex pod to place: what it asks for and what it is called.
#[derive(Clone, Debug)]
struct Ask {
    template: VertexPod,
    gpus: usize,
    /// (network position, domain), sorted by network name.
    networks: Vec<(usize, String)>,
    /// VFs per physnet.
    vfs: VfAsk,
}

fn bad(message: String) -> SimError {
    SimError::Format { source_name: "pipelines".into(), message }
}

/// Check the scenario and expand it into the pods to place, in order.
fn expand(s: &PipelineScenario) -> Result<(Vec<Ask>, Vec<NetworkSummary>), SimError> {
    let zone = s.zone.as_deref().unwrap_or(DEFAULT_ZONE);
    let mut nets: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, n) in s.numa_networks.iter().enumerate() {
        let at = format!("numaNetworks[{i}] ('{}')", n.name);
        if nets.insert(n.name.as_str(), i).is_some() {
            return Err(bad(format!("{at}: a second NumaNetwork of that name")));
        }
        if n.ip_range.trunc() != n.ip_range {
            return Err(bad(format!(
                "{at}.ipRange: {} is not a network address (host bits set); use {}",
                n.ip_range,
                n.ip_range.trunc()
            )));
        }
        if let Some(v) = n.vlan
            && !(1..=4094).contains(&v)
        {
            return Err(bad(format!("{at}.vlan: {v} is outside 1–4094")));
        }
        if !valid_physnet(n.physnet()) {
            return Err(bad(format!(
                "{at}.physnet: '{}' is not a physnet name (1-63 letters, digits, '-', '_' and '.')",
                n.physnet()
            )));
        }
    }
    let mut asks = Vec::new();
    let mut per_network = vec![0usize; s.numa_networks.len()];
    for (pi, p) in s.pipelines.iter().enumerate() {
        let at = format!("pipelines[{pi}] ('{}')", p.name);
        let mut index: BTreeMap<&str, usize> = BTreeMap::new();
        for (vi, v) in p.vertices.iter().enumerate() {
            if index.insert(v.name.as_str(), vi).is_some() {
                return Err(bad(format!("{at}.vertices[{vi}]: a second vertex named '{}'", v.name)));
            }
            if v.replicas > MAX_REPLICAS {
                return Err(bad(format!(
                    "{at}.vertices[{vi}] ('{}').replicas: {} is more than the simulator takes (at most {MAX_REPLICAS})",
                    v.name, v.replicas
                )));
            }
        }
        // The networks each vertex is on, and its direct targets, as the Pipeline webhook wires them.
        let mut on: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); p.vertices.len()];
        let mut targets: Vec<BTreeSet<String>> = vec![BTreeSet::new(); p.vertices.len()];
        for (ei, e) in p.edges.iter().enumerate() {
            let end = |name: &str, field: &str| {
                index.get(name).copied().ok_or_else(|| {
                    bad(format!("{at}.edges[{ei}].{field}: vertex '{name}' is not in the pipeline's vertices"))
                })
            };
            let (from, to) = (end(&e.from, "from")?, end(&e.to, "to")?);
            let Some(en) = &e.numa_network else { continue };
            let &n = nets.get(en.name.as_str()).ok_or_else(|| {
                bad(format!("{at}.edges[{ei}].numaNetwork.name: NumaNetwork '{}' is not in numaNetworks", en.name))
            })?;
            on[from].insert(n);
            on[to].insert(n);
            if en.connection_type == Connection::Direct {
                let d = domain(&e.to, &en.name, p, zone, &format!("{at}.edges[{ei}]"))?;
                targets[from].insert(d);
            }
        }
        for (vi, v) in p.vertices.iter().enumerate() {
            let mut networks = Vec::new();
            let mut vfs = VfAsk::new();
            for &n in &on[vi] {
                let net = &s.numa_networks[n];
                networks.push((n, domain(&v.name, &net.name, p, zone, &format!("{at}.vertices[{vi}]"))?));
                *vfs.entry(net.physnet().to_string()).or_insert(0) += 1;
                per_network[n] += v.replicas;
            }
            networks.sort_by(|a, b| s.numa_networks[a.0].name.cmp(&s.numa_networks[b.0].name));
            for r in 0..v.replicas {
                if asks.len() == MAX_VERTEX_PODS {
                    return Err(SimError::TooLarge {
                        what: "vertex pods".into(),
                        asked: s.pipelines.iter().flat_map(|p| &p.vertices).map(|v| v.replicas as u128).sum(),
                        limit: MAX_VERTEX_PODS,
                    });
                }
                asks.push(Ask {
                    template: VertexPod {
                        pipeline: p.name.clone(),
                        namespace: p.namespace.clone(),
                        vertex: v.name.clone(),
                        pod: format!("{}-{}-{r}", p.name, v.name),
                        node: None,
                        gpus: Vec::new(),
                        nics: Vec::new(),
                        domain_targets: targets[vi].iter().cloned().collect(),
                        aligned: None,
                    },
                    gpus: v.gpus,
                    networks: networks.clone(),
                    vfs: vfs.clone(),
                });
            }
        }
    }
    let mut summaries = Vec::new();
    for (n, net) in s.numa_networks.iter().enumerate() {
        let usable = usable_addresses(&net.ip_range);
        if per_network[n] as u128 > usable {
            return Err(SimError::AddressesExhausted {
                network: net.name.clone(),
                range: net.ip_range.to_string(),
                usable,
                needed: per_network[n],
            });
        }
        summaries.push(NetworkSummary {
            name: net.name.clone(),
            ip_range: net.ip_range,
            vlan: net.vlan,
            physnet: net.physnet().to_string(),
            usable_addresses: usable,
            pods: per_network[n],
        });
    }
    Ok((asks, summaries))
}

fn domain(vertex: &str, network: &str, p: &PipelineSpec, zone: &str, at: &str) -> Result<String, SimError> {
    vertex_domain(vertex, network, &p.name, &p.namespace, zone).map_err(|e| bad(format!("{at}: {e}")))
}

/// Free GPUs and VFs of a node (positions).
#[derive(Clone, Copy)]
struct Free {
    gpus: u128,
    vfs: u128,
}

/// Place every vertex pod of `scenario` on `cluster` under each policy.
pub fn simulate_pipelines(
    cluster: &Cluster,
    scenario: &PipelineScenario,
    policies: &[PlacementPolicy],
    score_config: &ScoreConfig,
    seed: u64,
) -> Result<PipelineReport, SimError> {
    let (asks, networks) = expand(scenario)?;
    let mut node_types = BTreeMap::new();
    for n in &cluster.nodes {
        *node_types.entry(cluster.types[n.node_type].name.clone()).or_insert(0) += 1;
    }
    let mut reports = Vec::with_capacity(policies.len());
    for &policy in policies {
        reports.push(place(cluster, scenario, &asks, policy, score_config, seed)?);
    }
    Ok(PipelineReport {
        cluster: ClusterSummary {
            nodes: cluster.nodes.len(),
            gpus: cluster.total_gpus(),
            vfs: cluster.total_vfs(),
            node_types,
        },
        networks,
        policies: reports,
    })
}

/// Per node type, per physnet: its VFs as a mask.
fn physnet_masks(cluster: &Cluster, asks: &[Ask]) -> Vec<BTreeMap<String, u128>> {
    let physnets: BTreeSet<&String> = asks.iter().flat_map(|a| a.vfs.keys()).collect();
    cluster.types.iter().map(|t| physnets.iter().map(|p| ((*p).clone(), t.vf_mask(p))).collect()).collect()
}

fn place(
    cluster: &Cluster,
    scenario: &PipelineScenario,
    asks: &[Ask],
    policy: PlacementPolicy,
    cfg: &ScoreConfig,
    seed: u64,
) -> Result<PipelinePolicyReport, SimError> {
    let masks = physnet_masks(cluster, asks);
    let mut free: Vec<Free> = cluster
        .nodes
        .iter()
        .map(|n| {
            let t = &cluster.types[n.node_type].topology;
            Free { gpus: all_of(t.gpu_count()), vfs: all_of(t.vfs().len().min(MAX_VFS_PER_NODE)) }
        })
        .collect();
    let mut used: Vec<BTreeSet<IpAddr>> = vec![BTreeSet::new(); scenario.numa_networks.len()];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut cache = ScoreCache::new();
    let mut pods = Vec::with_capacity(asks.len());
    let (mut placed, mut nic_gpu_pods, mut aligned_pods) = (0, 0, 0);
    for ask in asks {
        let fits = |n: usize, f: Free| {
            let m = &masks[cluster.nodes[n].node_type];
            f.gpus.count_ones() as usize >= ask.gpus
                && ask.vfs.iter().all(|(p, &k)| (f.vfs & m.get(p).copied().unwrap_or(0)).count_ones() as usize >= k)
        };
        let fitting: Vec<usize> = (0..cluster.nodes.len()).filter(|&n| fits(n, free[n])).collect();
        let node_local = |n: usize| -> Result<(usize, Free), SimError> {
            let f = free[n];
            let gpus = if ask.gpus == 0 { 0 } else { gpuallocator_style(cluster, n, f.gpus, ask.gpus)? };
            let m = &masks[cluster.nodes[n].node_type];
            let mut vfs = 0u128;
            for (p, &k) in &ask.vfs {
                let mut avail = f.vfs & m.get(p).copied().unwrap_or(0);
                for _ in 0..k {
                    let low = avail & avail.wrapping_neg();
                    vfs |= low;
                    avail &= !low;
                }
            }
            Ok((n, Free { gpus, vfs }))
        };
        let choice: Option<(usize, Free)> = match policy {
            PlacementPolicy::Weft => {
                let mut best: Option<(u8, u32, usize, Free)> = None;
                for &n in &fitting {
                    let Some((score, held)) = weft_fit(cluster, n, free[n], ask, &mut cache, cfg) else { continue };
                    let fc = free[n].gpus.count_ones();
                    if best.as_ref().is_none_or(|(s, f, _, _)| score > *s || (score == *s && fc < *f)) {
                        best = Some((score, fc, n, held));
                    }
                }
                best.map(|(_, _, n, held)| (n, held))
            }
            PlacementPolicy::Blind => match fitting.len() {
                0 => None,
                len => Some(node_local(fitting[rng.random_range(0..len)])?),
            },
            PlacementPolicy::LeastAllocated => {
                let mut best: Option<(f64, usize)> = None;
                for &n in &fitting {
                    let total = cluster.types[cluster.nodes[n].node_type].topology.gpu_count().max(1);
                    let share = free[n].gpus.count_ones() as f64 / total as f64;
                    if best.is_none_or(|(s, _)| share > s) {
                        best = Some((share, n));
                    }
                }
                best.map(|(_, n)| node_local(n)).transpose()?
            }
        };
        let mut pod = ask.template.clone();
        if let Some((n, held)) = choice {
            free[n] = Free { gpus: free[n].gpus & !held.gpus, vfs: free[n].vfs & !held.vfs };
            placed += 1;
            let topology = &cluster.types[cluster.nodes[n].node_type].topology;
            pod.node = Some(cluster.nodes[n].name.clone());
            pod.gpus = mask_to_vec(held.gpus);
            // The VFs held, per physnet in address order, handed to the networks in name order.
            let mut by_physnet: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
            for v in mask_to_vec(held.vfs) {
                by_physnet.entry(topology.vfs()[v].physnet.as_deref().unwrap_or_default()).or_default().push(v);
            }
            for (net, domain) in &ask.networks {
                let spec = &scenario.numa_networks[*net];
                let v = by_physnet.get_mut(spec.physnet()).filter(|l| !l.is_empty()).map(|l| l.remove(0)).ok_or_else(
                    || bad(format!("pod '{}' was placed without a NIC of physnet '{}'", pod.pod, spec.physnet())),
                )?;
                let ip =
                    next_free_address(&spec.ip_range, &used[*net]).ok_or_else(|| SimError::AddressesExhausted {
                        network: spec.name.clone(),
                        range: spec.ip_range.to_string(),
                        usable: usable_addresses(&spec.ip_range),
                        needed: used[*net].len() + 1,
                    })?;
                used[*net].insert(ip);
                let vf = &topology.vfs()[v];
                pod.nics.push(PodNic {
                    network: spec.name.clone(),
                    vf: vf.pci_address.clone(),
                    nic: vf.nic.clone(),
                    ip,
                    vlan: spec.vlan,
                    domain: domain.clone(),
                });
            }
            if held.gpus != 0 && held.vfs != 0 {
                let near = all_near(topology, held.gpus, held.vfs);
                pod.aligned = Some(near);
                nic_gpu_pods += 1;
                aligned_pods += usize::from(near);
            }
        }
        pods.push(pod);
    }
    Ok(PipelinePolicyReport {
        policy: policy.name().to_string(),
        placed,
        unplaced: asks.len() - placed,
        nic_gpu_pods,
        aligned_pods,
        alignment_share: if nic_gpu_pods == 0 { 0.0 } else { aligned_pods as f64 / nic_gpu_pods as f64 },
        pods,
    })
}

/// weft's score of node `n` with `free` free for `ask`, and what the pod gets there: the
/// engine's rule (see the module docs). None when the node cannot take the pod.
fn weft_fit(
    cluster: &Cluster,
    n: usize,
    free: Free,
    ask: &Ask,
    cache: &mut ScoreCache,
    cfg: &ScoreConfig,
) -> Option<(u8, Free)> {
    let t = &cluster.types[cluster.nodes[n].node_type];
    let gpus = mask_to_vec(free.gpus);
    let vfs = t.topology.vfs();
    let vf_free = |a: &str| {
        vfs.binary_search_by(|v| v.pci_address.as_str().cmp(a))
            .is_ok_and(|i| i < MAX_VFS_PER_NODE && free.vfs >> i & 1 == 1)
    };
    let held = |choice: &weft_net::joint::JointChoice| Free {
        gpus: vec_to_mask(&choice.gpus),
        vfs: choice.vfs.vfs.values().flatten().filter_map(|a| t.vf_position(a)).fold(0, |m, i| m | 1u128 << i),
    };
    if ask.gpus == 0 {
        // The extender's neutral score: the same on every node that has the VFs.
        let choice = decide(&t.prepared, &t.topology, &gpus, &vf_free, 0, &ask.vfs, &[]).ok()?;
        return Some((0, held(&choice)));
    }
    let fit = cache.score(&t.prepared, &gpus, ask.gpus, cfg).ok()?;
    if ask.vfs.is_empty() {
        return Some((fit.score, Free { gpus: vec_to_mask(&fit.gpus), vfs: 0 }));
    }
    let choice = decide(&t.prepared, &t.topology, &gpus, &vf_free, ask.gpus, &ask.vfs, &[]).ok()?;
    Some((joint_score(fit.score, &choice), held(&choice)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ClusterSpec, NodeTypeSpec};

    fn default_cluster() -> Cluster {
        ClusterSpec::embedded_default().build(None).unwrap()
    }

    fn run(cluster: &Cluster, s: &PipelineScenario, seed: u64) -> PipelineReport {
        simulate_pipelines(cluster, s, &PlacementPolicy::ALL, &ScoreConfig::default(), seed).unwrap()
    }

    fn ipnet(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn the_embedded_scenario_is_the_seed_video_pipeline() {
        let s = embedded_default();
        assert_eq!(s.numa_networks[0].name, "pipeline1-multi-network");
        let names: Vec<&str> = s.pipelines[0].vertices.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["in", "filter-resize", "inference", "out"]);
        let (asks, nets) = expand(&s).unwrap();
        // in: no NIC; filter-resize, inference (direct) and out (multi-isbsvc): one each.
        let nics: Vec<(&str, usize, usize)> =
            asks.iter().map(|a| (a.template.vertex.as_str(), a.gpus, a.networks.len())).collect();
        assert_eq!(
            nics,
            [
                ("in", 0, 0),
                ("in", 0, 0),
                ("filter-resize", 1, 1),
                ("filter-resize", 1, 1),
                ("inference", 2, 1),
                ("inference", 2, 1),
                ("out", 0, 1),
                ("out", 0, 1)
            ]
        );
        assert_eq!(nets[0].pods, 6);
        assert_eq!(nets[0].usable_addresses, 254);
    }

    #[test]
    fn every_vertex_pod_is_placed_with_distinct_addresses_in_range_and_its_domain() {
        let s = embedded_default();
        let cluster = default_cluster();
        for seed in [1, 2, 7] {
            let report = run(&cluster, &s, seed);
            for p in &report.policies {
                assert_eq!((p.placed, p.unplaced), (8, 0), "{}", p.policy);
                let mut ips = BTreeSet::new();
                for pod in &p.pods {
                    assert!(pod.node.is_some(), "{}: {pod:?}", p.policy);
                    for nic in &pod.nics {
                        assert!(ips.insert(nic.ip), "{}: {} handed out twice", p.policy, nic.ip);
                        let range = ipnet("192.168.10.0/24");
                        assert!(range.contains(&nic.ip), "{}: {} outside {range}", p.policy, nic.ip);
                        assert_ne!(nic.ip, range.network());
                        assert_ne!(nic.ip, range.broadcast());
                        let want = vertex_domain(&pod.vertex, &nic.network, "video", "default", DEFAULT_ZONE).unwrap();
                        assert_eq!(nic.domain, want);
                        assert_eq!(nic.vlan, Some(10));
                    }
                    let expect_nics = usize::from(pod.vertex != "in");
                    assert_eq!(pod.nics.len(), expect_nics, "{}: {pod:?}", p.policy);
                    let gpus = match pod.vertex.as_str() {
                        "filter-resize" => 1,
                        "inference" => 2,
                        _ => 0,
                    };
                    assert_eq!(pod.gpus.len(), gpus, "{}: {pod:?}", p.policy);
                    let targets: &[&str] = if pod.vertex == "filter-resize" {
                        &["inference.pipeline1-multi-network.video.default.vertexdomain.local"]
                    } else {
                        &[]
                    };
                    assert_eq!(pod.domain_targets, targets, "{}: {pod:?}", p.policy);
                }
                assert_eq!(ips.len(), 6);
                // Lowest first, in placement order: .1 to .6.
                let want: BTreeSet<IpAddr> = (1..=6).map(|i| IpAddr::from([192, 168, 10, i])).collect();
                assert_eq!(ips, want, "{}", p.policy);
                assert_eq!(p.nic_gpu_pods, 4, "{}", p.policy);
            }
        }
    }

    #[test]
    fn weft_aligns_nics_with_gpus_at_least_as_often_as_the_baselines() {
        let s = embedded_default();
        let cluster = default_cluster();
        for seed in 0..20 {
            let r = run(&cluster, &s, seed);
            let weft = &r.policies[0];
            assert_eq!(weft.alignment_share, 1.0, "seed {seed}: {weft:?}");
            for other in &r.policies[1..] {
                assert!(weft.alignment_share >= other.alignment_share, "seed {seed}: {} beat weft", other.policy);
            }
        }
        // blind is not always aligned on the default: the comparison is not empty.
        let blind: Vec<f64> = (0..20).map(|seed| run(&cluster, &s, seed).policies[1].alignment_share).collect();
        assert!(blind.iter().any(|&x| x < 1.0), "{blind:?}");
    }

    #[test]
    fn the_same_seed_gives_the_same_placement() {
        let s = embedded_default();
        let cluster = default_cluster();
        assert_eq!(run(&cluster, &s, 3), run(&cluster, &s, 3));
    }

    #[test]
    fn a_range_too_small_for_the_replicas_is_an_error_naming_network_and_range() {
        let mut s = embedded_default();
        s.numa_networks[0].ip_range = ipnet("192.168.10.0/30"); // 2 usable, 6 pods
        let e = simulate_pipelines(&default_cluster(), &s, &PlacementPolicy::ALL, &ScoreConfig::default(), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'pipeline1-multi-network'") && e.contains("192.168.10.0/30"), "{e}");
        assert!(e.contains("2 usable") && e.contains("6 vertex pods"), "{e}");
        // Exactly enough is fine: /29 has 6.
        let mut s = embedded_default();
        s.numa_networks[0].ip_range = ipnet("192.168.10.0/29");
        let r = run(&default_cluster(), &s, 1);
        assert!(r.policies.iter().all(|p| p.placed == 8));
        // More replicas than a /29 holds.
        let s = s.with_replicas(3);
        let e = simulate_pipelines(&default_cluster(), &s, &[PlacementPolicy::Weft], &ScoreConfig::default(), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("9 vertex pods") && e.contains("192.168.10.0/29"), "{e}");
    }

    #[test]
    fn bad_scenarios_name_the_field() {
        let text = EMBEDDED
            .replace("name: pipeline1-multi-network, connectionType: direct", "name: nope, connectionType: direct");
        let e = expand(&parse_scenario(&text, "s").unwrap()).unwrap_err().to_string();
        assert!(e.contains("edges[1].numaNetwork.name") && e.contains("'nope'"), "{e}");
        let text = EMBEDDED.replace("connectionType: direct", "connectionType: fast");
        assert!(parse_scenario(&text, "s.yaml").unwrap_err().to_string().contains("s.yaml"));
        let text = EMBEDDED.replace("{from: in, to: filter-resize}", "{from: in, to: resize}");
        let e = expand(&parse_scenario(&text, "s").unwrap()).unwrap_err().to_string();
        assert!(e.contains("edges[0].to") && e.contains("'resize'"), "{e}");
        let text = EMBEDDED.replace("192.168.10.0/24", "192.168.10.7/24");
        let e = expand(&parse_scenario(&text, "s").unwrap()).unwrap_err().to_string();
        assert!(e.contains("ipRange") && e.contains("192.168.10.0/24"), "{e}");
        let text = EMBEDDED.replace("vlan: 10", "vlan: 5000");
        let e = expand(&parse_scenario(&text, "s").unwrap()).unwrap_err().to_string();
        assert!(e.contains("vlan") && e.contains("5000"), "{e}");
        let text = EMBEDDED.replace("name: video", "name: Video");
        let e = expand(&parse_scenario(&text, "s").unwrap()).unwrap_err().to_string();
        assert!(e.contains("pipeline 'Video'"), "{e}");
        let text = EMBEDDED.replace("kind: SimPipelines", "kind: SimWorkload");
        assert!(parse_scenario(&text, "s").unwrap_err().to_string().contains("SimPipelines"));
    }

    #[test]
    fn nics_come_from_the_networks_physnet_and_pods_not_fitting_are_reported() {
        // One HGX H100 whose VFs serve `rail`; the network's NICs are `fabric`: no NIC pod fits.
        let cluster = ClusterSpec {
            api_version: crate::API_VERSION.into(),
            kind: "SimCluster".into(),
            node_types: vec![NodeTypeSpec { physnet: Some("rail".into()), ..NodeTypeSpec::builtin("hgx-h100", 1) }],
        }
        .build(None)
        .unwrap();
        let s = embedded_default();
        let r = run(&cluster, &s, 1);
        for p in &r.policies {
            assert_eq!((p.placed, p.unplaced), (2, 6), "{}: only `in` fits", p.policy);
            assert!(p.pods.iter().filter(|x| x.vertex != "in").all(|x| x.node.is_none() && x.nics.is_empty()));
        }
        let mut s = s;
        s.numa_networks[0].physnet = Some("rail".into());
        let r = run(&cluster, &s, 1);
        for p in &r.policies {
            assert_eq!(p.placed, 8, "{}", p.policy);
            assert!(p.pods.iter().flat_map(|x| &x.nics).all(|n| n.vf.starts_with("0000:1")), "{}", p.policy);
        }
        // weft on an HGX H100: NIC k beside GPU k, so every GPU pod's NIC is beside one of its GPUs.
        assert_eq!(r.policies[0].alignment_share, 1.0);
    }

    #[test]
    fn next_free_address_is_the_lowest_usable_one_not_taken() {
        let none = BTreeSet::new();
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert_eq!(next_free_address(&ipnet("10.0.0.0/30"), &none), Some(ip("10.0.0.1")));
        let used: BTreeSet<IpAddr> = [ip("10.0.0.1"), ip("10.0.0.3")].into();
        assert_eq!(next_free_address(&ipnet("10.0.0.0/29"), &used), Some(ip("10.0.0.2")));
        let used: BTreeSet<IpAddr> = [ip("10.0.0.1"), ip("10.0.0.2")].into();
        assert_eq!(next_free_address(&ipnet("10.0.0.0/30"), &used), None, "broadcast .3 is not handed out");
        // /31 and /32: every address.
        assert_eq!(next_free_address(&ipnet("10.0.0.4/31"), &none), Some(ip("10.0.0.4")));
        assert_eq!(next_free_address(&ipnet("10.0.0.9/32"), &none), Some(ip("10.0.0.9")));
        // IPv6: the network address is skipped, the last one is usable.
        let used: BTreeSet<IpAddr> = [ip("fd00::1"), ip("fd00::2")].into();
        assert_eq!(next_free_address(&ipnet("fd00::/126"), &used), Some(ip("fd00::3")));
        let used: BTreeSet<IpAddr> = [ip("fd00::1"), ip("fd00::2"), ip("fd00::3")].into();
        assert_eq!(next_free_address(&ipnet("fd00::/126"), &used), None);
        // Addresses of other ranges and families are ignored.
        let used: BTreeSet<IpAddr> = [ip("10.0.1.1"), ip("fd00::1")].into();
        assert_eq!(next_free_address(&ipnet("10.0.0.0/24"), &used), Some(ip("10.0.0.1")));
    }
}
