//! `weft agent`: the node agent (DaemonSet). Three duties, each optional:
//! - keep the node's GPU topology annotation current (`--publish-topology`, on by default);
//! - the resource manager (`--mode nri|bypass|auto`, off by default): admit pods, give Guaranteed
//!   integer-CPU pods exclusive CPUs aligned with their devices, and enforce it through NRI or by
//!   writing cgroup files (crate `weft-agent`);
//! - weft's GPU device plugin (`--gpu-plugin`, off by default): serve the node's GPUs to the
//!   kubelet, answer each pod's recorded GPU decision, and write back what each pod really got
//!   (crate `weft-gpu-plugin`);
//! - weft's NIC DRA driver (`--nic-dra`, off by default): the VFs of the node's physnets as
//!   ResourceSlices of driver `nic.weft.io`, NodePrepareResources with cluster-wide IPAM and VLAN
//!   (crate `weft-nic-dra`, docs/nic-dra.md).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use futures::FutureExt;
use weft_agent::cgroup::{CgroupDriver, CgroupHierarchy, CgroupLayout, ContainerRuntime};
use weft_agent::kubelet::{KubeletClient, KubeletConfig, PodSource};
use weft_agent::orm::OrmConfig;
use weft_agent::pod::SysfsLocator;
use weft_agent::policy::TopologyPolicy;
use weft_agent::service::{self, Mode, ServiceConfig};
use weft_cni::state::StateDir;
use weft_deviceplugin::PluginOptions as DevicePluginOptions;
use weft_deviceplugin::handshake::NodePods;
use weft_deviceplugin::podresources::{AssignedDevices, PodResourcesClient};
use weft_gpu_plugin::writeback::KubeAnnotator;
use weft_gpu_plugin::{DeviceListStrategy, GpuInventory, GpuPlugin, GpuPluginConfig};
use weft_kube::write::RetryPolicy;
use weft_net::config::PhysnetConfig;
use weft_nic_dra::{Checkpoint as NicCheckpoint, NicDriver, NicInventory, PfVlan, ServeOptions as NicServeOptions};
use weft_nri::plugin::PluginOptions;
use weft_record::node_agent::{Discover, PublisherConfig, PublisherMetrics, keep_topology_published};
use weft_sriov_plugin::vifs::KubeVifWriter;
use weft_sriov_plugin::{SriovPlugin, SriovPlugins, VfInventory, gpu_places};
use weft_topology::discover::{DiscoveryCache, SysfsRoot, read_cpu_layout, read_sriov};
use weft_topology::model::uniform_node;
use weft_topology::{CpuSet, NodeTopology, PairLink, read_node_file};

use crate::cmd_topo::{DiscoverArgs, discover_node};
use crate::component::{self, note};
use crate::kube_args::{KubeArgs, OpsArgs};

/// Resource-manager mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// No resource manager (topology publishing only).
    Off,
    /// NRI plugin: synchronous, with environment injection.
    Nri,
    /// Poll the kubelet and write cgroup files.
    Bypass,
    /// NRI when the socket answers, bypass until it does.
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DriverArg {
    Cgroupfs,
    Systemd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RuntimeArg {
    Containerd,
    CriO,
    Docker,
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// This node's name (the DaemonSet sets NODE_NAME from `spec.nodeName`). `--node-name` is an
    /// old spelling of it.
    #[arg(long, env = "NODE_NAME", alias = "node-name", value_name = "NAME")]
    node: String,
    /// Publish this topology file instead of discovering (for nodes NVML cannot describe). Also the
    /// GPU NUMA map of the resource manager.
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// Re-discover and re-publish this often (`5m`, `300s`, or whole seconds).
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = crate::duration_arg::at_least_1s)]
    interval: Duration,
    /// Keep the node's `weft.io/gpu-topology` annotation current (needs the API server).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    publish_topology: bool,
    /// Field manager recorded on the writes.
    #[arg(long, default_value = "weft-agent")]
    field_manager: String,
    #[command(flatten)]
    orm: OrmArgs,
    #[command(flatten)]
    gpu: GpuPluginArgs,
    #[command(flatten)]
    sriov: SriovArgs,
    #[command(flatten)]
    nic_dra: NicDraArgs,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    ops: OpsArgs,
    #[command(flatten)]
    discover: DiscoverArgs,
}

/// The GPU device plugin's settings.
#[derive(Args, Debug)]
pub struct GpuPluginArgs {
    /// Serve the node's GPUs to the kubelet as weft's device plugin (replaces NVIDIA's device
    /// plugin for the resource; see docs/decision-to-container.md).
    #[arg(long)]
    gpu_plugin: bool,
    /// The extended resource the GPUs are counted under. Name another (e.g. `weft.io/gpu`) to run
    /// beside NVIDIA's plugin while switching over.
    #[arg(long, default_value = weft_record::DEFAULT_GPU_RESOURCE, value_name = "NAME")]
    gpu_resource: String,
    /// How a container is told its GPUs: `envvar` (NVIDIA_VISIBLE_DEVICES) or `cdi` (CDI device
    /// names `nvidia.com/gpu=<uuid>`).
    #[arg(long, default_value = "envvar", value_name = "STRATEGY")]
    gpu_device_list_strategy: DeviceListStrategy,
    /// The kubelet's device-plugin directory.
    #[arg(long, default_value = weft_deviceplugin::DEFAULT_DIR, value_name = "DIR")]
    device_plugin_dir: PathBuf,
    /// The plugin's socket name in that directory.
    #[arg(long, default_value = "weft-gpu.sock", value_name = "NAME")]
    gpu_plugin_endpoint: String,
    /// The kubelet's PodResources socket (what each container really got).
    #[arg(long, default_value = weft_deviceplugin::podresources::DEFAULT_SOCKET, value_name = "PATH")]
    pod_resources_socket: PathBuf,
    /// Write back `weft.io/gpu-ids` at least this often (and after every allocation).
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::duration_arg::at_least_1s)]
    gpu_write_back_period: Duration,
}

/// The node's SR-IOV physnets (docs/sriov.md): which PFs' VFs serve which physnet. With them, the
/// published topology lists the VFs, so the scheduler extender decides them with the GPUs.
#[derive(Args, Debug)]
pub struct SriovArgs {
    /// Physnets file (YAML or JSON: name, devices `pf#vf-ranges`, subnet, VLAN, MTU).
    #[arg(long, value_name = "FILE", conflicts_with = "physical_device_mappings")]
    physnet_config: Option<PathBuf>,
    /// The seed's `physical_device_mappings`: `physnet2:ens1f0#0-3,physnet3:ens1f1`.
    #[arg(long, value_name = "MAPPINGS")]
    physical_device_mappings: Option<String>,
    /// The seed's `default_physnet_subnets`: `physnet2:10.56.0.0/24` (with --physical-device-mappings).
    #[arg(long, default_value = "", value_name = "SUBNETS", requires = "physical_device_mappings")]
    default_physnet_subnets: String,
    /// VLAN per physnet: `physnet2:100` (with --physical-device-mappings).
    #[arg(long, default_value = "", value_name = "VLANS", requires = "physical_device_mappings")]
    physnet_vlans: String,
    /// Serve each physnet's VFs to the kubelet as `sriov.weft.io/<physnet>` (socket
    /// `weft-sriov-<physnet>.sock` in --device-plugin-dir), answering each pod's recorded VF
    /// decision and writing back `weft.io/vf-ids` (docs/sriov.md).
    #[arg(long)]
    sriov_plugin: bool,
    /// Re-read the VFs' PF links (health) this often.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::duration_arg::at_least_1s)]
    sriov_health_period: Duration,
    /// Write back `weft.io/vf-ids` at least this often (and after every allocation), and publish
    /// the pods' VIF records from weft-cni's attachments this often.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::duration_arg::at_least_1s)]
    sriov_write_back_period: Duration,
    /// weft-cni's `cacheDir` on the host: its attachments become the pods' `weft.io/vifs` and
    /// network-status (with --sriov-plugin).
    #[arg(long, default_value = weft_cni::conf::DEFAULT_CACHE_DIR, value_name = "DIR")]
    cni_cache_dir: PathBuf,
}

impl SriovArgs {
    /// The physnets, when any are configured.
    fn physnets(&self) -> anyhow::Result<Option<PhysnetConfig>> {
        let cfg = match (&self.physnet_config, &self.physical_device_mappings) {
            (Some(path), _) => PhysnetConfig::from_file(path)?,
            (None, Some(m)) => PhysnetConfig::from_seed(m, &self.default_physnet_subnets, &self.physnet_vlans)?,
            (None, None) => return Ok(None),
        };
        Ok(Some(cfg))
    }
}

/// weft's NIC DRA driver (docs/nic-dra.md): the VFs of the node's physnets as DRA devices.
#[derive(Args, Debug)]
pub struct NicDraArgs {
    /// Run weft's NIC DRA driver (`nic.weft.io`): publish the VFs of the physnets
    /// (--physnet-config or --physical-device-mappings) as ResourceSlices and prepare the claims
    /// the scheduler allocates from them (address from the claim's NumaNetwork range, VLAN through
    /// the PF).
    #[arg(long)]
    nic_dra: bool,
    /// Offer only this physnet's VFs through the NIC DRA driver (repeatable; default: every
    /// physnet). With --sriov-plugin too it is required: the device plugin then serves the other
    /// physnets, never these (both would hand out the same VFs).
    #[arg(long = "nic-dra-physnet", value_name = "PHYSNET")]
    nic_dra_physnets: Vec<String>,
    /// The kubelet's plugins directory; the DRA socket is `<DIR>/nic.weft.io/dra.sock`.
    #[arg(long, default_value = weft_nic_dra::server::DEFAULT_PLUGINS_DIR, value_name = "DIR")]
    kubelet_plugins_dir: PathBuf,
    /// The kubelet's plugin registration directory (its plugin watcher's); the registration
    /// socket is `<DIR>/nic.weft.io-reg.sock`.
    #[arg(long, default_value = weft_nic_dra::server::DEFAULT_REGISTRY_DIR, value_name = "DIR")]
    kubelet_registry_dir: PathBuf,
    /// The NIC DRA driver's checkpoint of prepared claims (its directory is created).
    #[arg(long, default_value = "/var/lib/weft/nic-dra-checkpoint.json", value_name = "FILE")]
    nic_dra_checkpoint: PathBuf,
}

/// The NIC DRA driver's inventory: the VFs of the physnets it offers on this node.
fn nic_dra_inventory(a: &AgentArgs, physnets: &PhysnetConfig) -> anyhow::Result<NicInventory> {
    let wanted = &a.nic_dra.nic_dra_physnets;
    for p in wanted {
        if physnets.physnet(p).is_none() {
            anyhow::bail!("--nic-dra-physnet {p}: no such physnet in the physnet configuration");
        }
    }
    let root = SysfsRoot::new(a.discover.root());
    let mut notes = Vec::new();
    let inventory = read_sriov(&root, &mut notes);
    let mut assigned = physnets.assign(&inventory, &mut notes);
    assigned.retain(|physnet, _| wanted.is_empty() || wanted.contains(physnet));
    let nics = NicInventory::from_physnets(&assigned, &mut notes);
    for note in &notes {
        tracing::info!(note = %note, "NIC DRA driver discovery");
    }
    Ok(nics)
}

/// Whether `physnet`'s VFs are the NIC DRA driver's.
fn dra_offers(a: &AgentArgs, physnet: &str) -> bool {
    a.nic_dra.nic_dra
        && (a.nic_dra.nic_dra_physnets.is_empty() || a.nic_dra.nic_dra_physnets.iter().any(|p| p == physnet))
}

/// With both VF servers on, the physnets must be split between them explicitly: the NIC DRA driver
/// offers those named by --nic-dra-physnet, the SR-IOV device plugin serves the others. Without
/// the flag the driver would offer every physnet and leave the device plugin none.
fn split_physnets(a: &AgentArgs) -> anyhow::Result<()> {
    if a.sriov.sriov_plugin && a.nic_dra.nic_dra && a.nic_dra.nic_dra_physnets.is_empty() {
        anyhow::bail!(
            "--sriov-plugin with --nic-dra needs --nic-dra-physnet: name the physnets whose VFs the NIC DRA driver offers; the device plugin serves the others"
        );
    }
    Ok(())
}

/// One VF plugin per physnet with VFs on this node, choosing near the GPUs of `topology`, except
/// the NIC DRA driver's physnets.
fn sriov_plugins(
    a: &AgentArgs,
    physnets: &PhysnetConfig,
    topology: Option<&NodeTopology>,
) -> anyhow::Result<Vec<Arc<SriovPlugin>>> {
    let root = SysfsRoot::new(a.discover.root());
    let mut notes = Vec::new();
    let inventory = read_sriov(&root, &mut notes);
    let mut per_physnet = VfInventory::per_physnet(physnets, &inventory, &mut notes)?;
    // The NIC DRA driver's physnets are its own (split_physnets).
    per_physnet.retain(|physnet, _| !dra_offers(a, physnet));
    let gpus = topology.map(|t| gpu_places(t, &root, &mut notes)).unwrap_or_default();
    let rdma_cm = weft_sriov_plugin::plugin::rdma_cm_present(&root);
    for note in &notes {
        tracing::info!(note = %note, "SR-IOV discovery");
    }
    let pods: Arc<dyn NodePods> = Arc::new(KubeletPods(Arc::new(kubelet_client(&a.orm)?)));
    let assigned: Arc<dyn AssignedDevices> = Arc::new(PodResourcesClient::new(a.gpu.pod_resources_socket.clone()));
    Ok(per_physnet
        .into_iter()
        .filter(|(physnet, vfs)| {
            if vfs.is_empty() {
                tracing::warn!(%physnet, "no VFs of this physnet on the node: its resource is not served");
            }
            !vfs.is_empty()
        })
        .map(|(physnet, vfs)| {
            let plugin = SriovPlugin::new(&physnet, &a.node, vfs, gpus.clone(), pods.clone(), assigned.clone());
            Arc::new(plugin.with_rdma_cm(rdma_cm))
        })
        .collect())
}

/// `discover` with the node's VFs of `physnets` added (read from sysfs under `root`).
fn with_vfs(discover: Discover, physnets: PhysnetConfig, root: PathBuf) -> Discover {
    Arc::new(move || {
        let mut node = discover()?;
        let mut notes = Vec::new();
        let inventory = read_sriov(&SysfsRoot::new(&root), &mut notes);
        let vfs = physnets.topology_vfs(&node, &inventory, &mut notes);
        for note in &notes {
            tracing::info!(note = %note, "SR-IOV discovery");
        }
        node.set_vfs(vfs).map_err(|e| format!("the node's VFs: {e}"))?;
        Ok(node)
    })
}

/// The kubelet's pod list as the GPU plugin's view of the node's pods.
struct KubeletPods(Arc<KubeletClient>);

#[async_trait::async_trait]
impl NodePods for KubeletPods {
    async fn pods(&self) -> Result<Vec<k8s_openapi::api::core::v1::Pod>, String> {
        self.0.fetch().await.map_err(|e| e.to_string())
    }
}

/// The resource manager's settings.
#[derive(Args, Debug)]
pub struct OrmArgs {
    /// Resource manager: off (placement only: no CPU or memory enforcement), nri, bypass or auto
    /// (NRI when the socket answers, else bypass until it does). CPU management is opt-in: on nodes
    /// whose kubelet runs the static CPU manager keep it off (two managers fight over cpusets).
    #[arg(long, value_enum, default_value = "off")]
    mode: ModeArg,
    /// With --mode nri, bypass or auto: run the resource manager only if this node's Node carries
    /// the label KEY=VALUE (read at start: restart the agent after changing it); other nodes get
    /// placement only, as with --mode off. The DaemonSet uses `weft.io/cpu-management=enabled`.
    #[arg(long, value_name = "KEY=VALUE")]
    cpu_management_label: Option<crate::cpu_gate::LabelGate>,
    /// Topology Manager policy: none, best-effort, restricted or single-numa-node.
    #[arg(long, default_value = "best-effort", value_name = "POLICY")]
    topology_policy: TopologyPolicy,
    /// CPUs kept for the system: never exclusive, always in the shared pool (`0-1,64-65`).
    #[arg(long, default_value = "", value_name = "CPUS")]
    reserved_cpus: CpuSet,
    /// CFS period for the containers' quota, µs.
    #[arg(long, default_value_t = weft_agent::settings::DEFAULT_CFS_PERIOD_US, value_name = "US")]
    cfs_period_us: u64,
    /// Set `memory.high` to this percentage of the memory limit for Burstable containers (cgroup
    /// v2 only).
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=100))]
    memory_high_percent: Option<u8>,
    /// Align memory with the NUMA placement too (memory requests count against each node).
    #[arg(long)]
    align_memory: bool,
    /// Checkpoint of the allocations.
    #[arg(long, default_value = "/var/lib/weft/orm-checkpoint.json", value_name = "FILE")]
    checkpoint: PathBuf,
    /// The runtime's NRI socket. When the runtime launches weft itself (NRI_PLUGIN_SOCKET set),
    /// the inherited socket is used instead.
    #[arg(long, default_value = weft_nri::plugin::DEFAULT_SOCKET_PATH, value_name = "PATH")]
    nri_socket: PathBuf,
    /// NRI plugin name.
    #[arg(long, default_value = "weft", value_name = "NAME")]
    nri_plugin_name: String,
    /// NRI plugin index (two digits; plugins run in ascending index order).
    #[arg(long, default_value = "10", value_name = "NN")]
    nri_plugin_index: String,
    /// Answer the NRI v0.12 per-event calls UNIMPLEMENTED, as a pre-v0.12 plugin (the runtime then
    /// sends them through StateChange).
    #[arg(long)]
    nri_legacy_events: bool,
    /// The kubelet's API: the read-only port (`http://127.0.0.1:10255`) or the authenticated one
    /// (`https://127.0.0.1:10250` with a token).
    #[arg(long, default_value = "http://127.0.0.1:10255", value_name = "URL")]
    kubelet_endpoint: String,
    /// Bearer token file for the kubelet (re-read on every request).
    #[arg(long, value_name = "FILE")]
    kubelet_token_file: Option<PathBuf>,
    /// CA bundle for the kubelet's serving certificate.
    #[arg(long, value_name = "FILE")]
    kubelet_ca_file: Option<PathBuf>,
    /// Accept any kubelet serving certificate (kubelets often serve a self-signed one).
    #[arg(long)]
    kubelet_insecure_skip_verify: bool,
    /// Do not ask the kubelet for pod specs (NRI mode only: every pod runs in the shared pool).
    #[arg(long)]
    no_kubelet: bool,
    /// cgroup mount root.
    #[arg(long, default_value = "/sys/fs/cgroup", value_name = "DIR")]
    cgroup_root: PathBuf,
    /// The kubelet's cgroup driver (bypass mode's container paths).
    #[arg(long, value_enum, default_value = "systemd")]
    cgroup_driver: DriverArg,
    /// The container runtime (bypass mode's systemd scope names).
    #[arg(long, value_enum, default_value = "containerd")]
    container_runtime: RuntimeArg,
    /// Reconcile (NRI) or poll (bypass) period.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = crate::duration_arg::at_least_1s)]
    reconcile_period: Duration,
}

fn kubelet_client(o: &OrmArgs) -> anyhow::Result<KubeletClient> {
    let cfg = KubeletConfig {
        endpoint: o.kubelet_endpoint.clone(),
        token_file: o.kubelet_token_file.clone(),
        ca_file: o.kubelet_ca_file.clone(),
        insecure_skip_verify: o.kubelet_insecure_skip_verify,
        ..KubeletConfig::default()
    };
    KubeletClient::new(&cfg).context("kubelet client")
}

/// The GPU plugin over this node's topology, the kubelet's pod list and PodResources.
fn gpu_plugin(a: &AgentArgs, topology: &NodeTopology) -> anyhow::Result<Arc<GpuPlugin>> {
    let inventory = GpuInventory::new(topology).map_err(|e| anyhow::anyhow!("the GPU plugin: {e}"))?;
    let cfg = GpuPluginConfig {
        resource: a.gpu.gpu_resource.clone(),
        node: a.node.clone(),
        strategy: a.gpu.gpu_device_list_strategy,
    };
    let pods = Arc::new(KubeletPods(Arc::new(kubelet_client(&a.orm)?)));
    let assigned = Arc::new(PodResourcesClient::new(a.gpu.pod_resources_socket.clone()));
    Ok(Arc::new(GpuPlugin::new(cfg, inventory, pods, assigned)))
}

fn service_config(a: &AgentArgs, topology: Option<NodeTopology>) -> anyhow::Result<ServiceConfig> {
    let o = &a.orm;
    let mode = match o.mode {
        ModeArg::Off => anyhow::bail!("internal: no resource manager in mode off"),
        ModeArg::Nri => Mode::Nri,
        ModeArg::Bypass => Mode::Bypass,
        ModeArg::Auto => Mode::Auto,
    };
    let sysfs = SysfsRoot::new(a.discover.root());
    let layout = read_cpu_layout(&sysfs).context("reading this node's CPU layout")?;
    let topology = topology.unwrap_or_else(|| uniform_node("", 0, PairLink::default()));
    let locator = Arc::new(SysfsLocator::new(sysfs, &topology));
    let kubelet: Option<Arc<dyn PodSource>> = if o.no_kubelet {
        if mode != Mode::Nri {
            anyhow::bail!("--no-kubelet works only with --mode nri: bypass reads the kubelet's pod list");
        }
        None
    } else {
        Some(Arc::new(kubelet_client(o)?))
    };
    let cgroups = match CgroupHierarchy::detect(&o.cgroup_root) {
        Ok(h) => Some(h),
        Err(e) if mode == Mode::Nri => {
            tracing::warn!(error = %e, "no cgroup hierarchy: NRI reconcile will not see drift");
            None
        }
        Err(e) => return Err(e).context("bypass mode writes cgroup files"),
    };
    let driver = match o.cgroup_driver {
        DriverArg::Cgroupfs => CgroupDriver::Cgroupfs,
        DriverArg::Systemd => CgroupDriver::Systemd,
    };
    let runtime = match o.container_runtime {
        RuntimeArg::Containerd => ContainerRuntime::Containerd,
        RuntimeArg::CriO => ContainerRuntime::CriO,
        RuntimeArg::Docker => ContainerRuntime::Docker,
    };
    let mut nri = PluginOptions::from_env_or(&o.nri_plugin_name, &o.nri_plugin_index, &o.nri_socket)?;
    nri.legacy_events = o.nri_legacy_events;
    Ok(ServiceConfig {
        mode,
        layout,
        orm: OrmConfig {
            reserved: o.reserved_cpus.clone(),
            policy: o.topology_policy,
            cfs_period_us: o.cfs_period_us,
            memory_high_percent: o.memory_high_percent,
            align_memory: o.align_memory,
        },
        locator,
        checkpoint: o.checkpoint.clone(),
        nri,
        kubelet,
        cgroups,
        cgroup_layout: CgroupLayout::new(driver, runtime),
        period: o.reconcile_period,
        ready: Arc::new(tokio::sync::watch::Sender::new(false)),
    })
}

pub fn run(mut a: AgentArgs) -> anyhow::Result<()> {
    // CPU management only on the nodes labelled for it (crate::cpu_gate).
    if let Some(gate) = a.orm.cpu_management_label.clone().filter(|_| a.orm.mode != ModeArg::Off)
        && !gate.admits(&crate::cpu_gate::node_labels(&a.kube, &a.node)?)
    {
        note(format_args!(
            "weft agent on node {}: placement only (no CPU management): the node lacks the label {gate}",
            a.node
        ));
        a.orm.mode = ModeArg::Off;
    }
    if !a.publish_topology
        && a.orm.mode == ModeArg::Off
        && !a.gpu.gpu_plugin
        && !a.sriov.sriov_plugin
        && !a.nic_dra.nic_dra
    {
        anyhow::bail!(
            "nothing to do: --publish-topology=false, --mode off, no --gpu-plugin, no --sriov-plugin and no --nic-dra"
        );
    }
    split_physnets(&a)?;
    let physnets = a.sriov.physnets()?;
    if a.sriov.sriov_plugin && physnets.is_none() {
        anyhow::bail!("--sriov-plugin needs the physnets: --physnet-config or --physical-device-mappings");
    }
    if a.nic_dra.nic_dra && physnets.is_none() {
        anyhow::bail!("--nic-dra needs the physnets: --physnet-config or --physical-device-mappings");
    }
    let discover: Discover = match a.topology.clone() {
        Some(path) => Arc::new(move || read_node_file(&path).map_err(|e| e.to_string())),
        None => {
            let args = a.discover.clone();
            Arc::new(move || {
                let found = discover_node(&args, Some(DiscoveryCache::DEFAULT_PATH)).map_err(|e| format!("{e:#}"))?;
                for note in &found.notes {
                    tracing::info!(note = %note, "discovery");
                }
                Ok(found.node)
            })
        }
    };
    let discover = match physnets.clone() {
        Some(p) => with_vfs(discover, p, a.discover.root().to_path_buf()),
        None => discover,
    };
    // One discovery at start (cached on disk): the resource manager's GPU NUMA map and the GPU
    // plugin's devices.
    let topology = if a.orm.mode == ModeArg::Off && !a.gpu.gpu_plugin && !a.sriov.sriov_plugin && !a.nic_dra.nic_dra {
        None
    } else {
        match discover() {
            Ok(t) => Some(t),
            Err(e) if a.gpu.gpu_plugin => anyhow::bail!("the GPU plugin needs this node's GPUs: {e}"),
            Err(e) => {
                tracing::warn!(error = %e, "no GPU topology: GPUs will not take part in NUMA alignment");
                None
            }
        }
    };
    let gpu_plugin = match (&topology, a.gpu.gpu_plugin) {
        (Some(t), true) => Some(gpu_plugin(&a, t)?),
        _ => None,
    };
    let sriov = match (&physnets, a.sriov.sriov_plugin) {
        (Some(p), true) => sriov_plugins(&a, p, topology.as_ref())?,
        _ => Vec::new(),
    };
    let nic_dra = match (&physnets, a.nic_dra.nic_dra) {
        (Some(p), true) => Some(nic_dra_inventory(&a, p)?),
        _ => None,
    };
    // The NIC DRA driver judges how near its VFs sit to each pod's GPUs on the same topology.
    let nic_dra_topology = if nic_dra.is_some() { topology.clone() } else { None };
    let service = if a.orm.mode == ModeArg::Off { None } else { Some(service_config(&a, topology)?) };
    component::run("agent", &a.ops, |c| async move {
        let metrics = c.ops.register_metrics(PublisherMetrics::register);
        let mut tasks = Vec::new();
        if let Some(cfg) = service {
            let ready = cfg.ready.clone();
            c.ops.add_readiness_check("resource manager enforcing", move || *ready.borrow());
            note(format_args!("weft agent on node {}: resource manager in mode {:?}", a.node, a.orm.mode));
            let sd = c.shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let r = service::run(cfg, sd.clone()).await.context("resource manager");
                sd.cancel();
                r
            }));
        }
        if let Some(plugin) = gpu_plugin {
            let client = a.kube.client().await?;
            let options = DevicePluginOptions::new(&a.gpu.device_plugin_dir, &a.gpu.gpu_plugin_endpoint);
            note(format_args!(
                "weft agent on node {}: GPU device plugin for {} on {}",
                a.node,
                a.gpu.gpu_resource,
                a.gpu.device_plugin_dir.join(&a.gpu.gpu_plugin_endpoint).display()
            ));
            #[cfg(feature = "nvml")]
            if let Err(e) = weft_gpu_plugin::health::watch_nvml(plugin.clone(), c.shutdown.clone()) {
                tracing::warn!(error = %e, "no NVML health events: GPUs stay healthy");
            }
            let annotator = Arc::new(KubeAnnotator::new(client, a.field_manager.clone()));
            let period = a.gpu.gpu_write_back_period;
            tasks.push(tokio::spawn(
                weft_gpu_plugin::writeback::run(plugin.clone(), annotator, period, c.shutdown.clone()).map(Ok),
            ));
            let sd = c.shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let r = weft_deviceplugin::serve(plugin, options, sd.clone()).await.context("GPU device plugin");
                sd.cancel();
                r
            }));
        }
        if !sriov.is_empty() {
            let client = a.kube.client().await?;
            for plugin in &sriov {
                let endpoint = format!("weft-sriov-{}.sock", plugin.physnet());
                let options = DevicePluginOptions::new(&a.gpu.device_plugin_dir, &endpoint);
                note(format_args!(
                    "weft agent on node {}: VF device plugin for {} ({} VFs) on {}",
                    a.node,
                    plugin.resource(),
                    plugin.inventory().len(),
                    a.gpu.device_plugin_dir.join(&endpoint).display()
                ));
                let (plugin, sd) = (plugin.clone(), c.shutdown.clone());
                tasks.push(tokio::spawn(async move {
                    let what = format!("VF device plugin {}", plugin.resource());
                    let r = weft_deviceplugin::serve(plugin, options, sd.clone()).await.context(what);
                    sd.cancel();
                    r
                }));
            }
            let root = SysfsRoot::new(a.discover.root());
            let health = a.sriov.sriov_health_period;
            tasks.push(tokio::spawn(
                weft_sriov_plugin::health::watch_health(sriov.clone(), root, health, c.shutdown.clone()).map(Ok),
            ));
            let period = a.sriov.sriov_write_back_period;
            let pods: Arc<dyn NodePods> = Arc::new(KubeletPods(Arc::new(kubelet_client(&a.orm)?)));
            let writer = Arc::new(KubeVifWriter::new(client.clone(), a.field_manager.clone()));
            let state = StateDir::new(&a.sriov.cni_cache_dir);
            tasks.push(tokio::spawn(
                weft_sriov_plugin::vifs::run(state, pods, writer, period, c.shutdown.clone()).map(Ok),
            ));
            let annotator = Arc::new(KubeAnnotator::new(client, a.field_manager.clone()));
            let plugins = SriovPlugins::new(sriov)?;
            tasks.push(tokio::spawn(
                weft_sriov_plugin::writeback::run(plugins, annotator, period, c.shutdown.clone()).map(Ok),
            ));
        }
        if let Some(inventory) = nic_dra {
            let client = a.kube.client().await?;
            let n = &a.nic_dra;
            if let Some(dir) = n.nic_dra_checkpoint.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
            let checkpoint =
                Arc::new(NicCheckpoint::open(&n.nic_dra_checkpoint).context("the NIC DRA driver's checkpoint")?);
            let vlan =
                Arc::new(PfVlan::new(Arc::new(weft_cni::NetlinkPfControl)).context("netlink for the VFs' VLANs")?);
            let devices = inventory.api_devices();
            // Addresses are allocated from a watch of the NetworkAddresses, not a LIST per prepare.
            let (addresses, watch_addresses) = weft_nic_dra::driver::address_cache(client.clone());
            let driver = Arc::new(
                NicDriver::new(&a.node, client.clone(), inventory, nic_dra_topology, vlan, checkpoint)
                    .with_address_cache(addresses),
            );
            let sd = c.shutdown.clone();
            tasks.push(tokio::spawn(async move {
                tokio::select! {
                    () = watch_addresses => {}
                    () = sd.cancelled() => {}
                }
                Ok(())
            }));
            // The NRI half (weft_nic_dra::attach): its own NRI plugin (weft-nic, index 20, after
            // weft's resource manager at 10, so a pod whose CPUs are refused never gets a VF
            // moved) reads the prepared NICs by pod from the driver's checkpoint and moves each VF
            // into the pod at RunPodSandbox, then writes networkData on the claim.
            let pod_nics: Arc<dyn weft_nic_dra::prepared::PodNics> = driver.pod_nics();
            let attacher = Arc::new(weft_nic_dra::attach::NicAttacher::new(
                pod_nics,
                Arc::new(weft_nic_dra::status::KubeClaimStatus::new(client.clone())),
                weft_nic_dra::attach::AttachConfig::default(),
            ));
            // Always an external plugin on the runtime's socket: a socket the runtime passed
            // (NRI_PLUGIN_SOCKET) belongs to the resource manager's plugin.
            let mut nri_options =
                PluginOptions::new(weft_nic_dra::attach::PLUGIN_NAME, weft_nic_dra::attach::PLUGIN_INDEX);
            nri_options.socket = weft_nri::plugin::SocketSource::Path(a.orm.nri_socket.clone());
            nri_options.validate()?;
            let sd = c.shutdown.clone();
            tasks.push(tokio::spawn(async move {
                weft_nri::plugin::run(nri_options, attacher, weft_nri::plugin::RuntimeHandle::new(), sd)
                    .await
                    .context("the NIC DRA driver's NRI plugin")
            }));
            let options = NicServeOptions {
                plugins_dir: n.kubelet_plugins_dir.clone(),
                registry_dir: n.kubelet_registry_dir.clone(),
            };
            let serving =
                weft_nic_dra::start(driver.clone(), &options, c.shutdown.clone()).context("NIC DRA driver")?;
            let registration = serving.registration();
            c.ops.add_readiness_check("NIC DRA driver registered", move || {
                registration.borrow().as_ref().is_some_and(|s| s.plugin_registered)
            });
            note(format_args!(
                "weft agent on node {}: NIC DRA driver {} ({} VFs) on {}, registration {}",
                a.node,
                weft_net::nic_claim::DRIVER,
                devices.len(),
                options.dra_socket().display(),
                options.registration_socket().display()
            ));
            tasks.push(tokio::spawn(
                weft_nic_dra::slices::keep_published(client, a.node.clone(), devices, c.shutdown.clone()).map(Ok),
            ));
            let sd = c.shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let r = serving.wait().await.context("NIC DRA driver");
                sd.cancel();
                r
            }));
        }
        if a.publish_topology {
            let client = a.kube.client().await?;
            let ready = Arc::new(AtomicBool::new(false));
            let r = ready.clone();
            c.ops.add_readiness_check("topology published", move || r.load(Ordering::Acquire));
            let cfg = PublisherConfig {
                node: a.node.clone(),
                field_manager: a.field_manager.clone(),
                interval: a.interval,
                retry: RetryPolicy::default(),
            };
            note(format_args!(
                "weft agent on node {}: publishing {} every {}",
                a.node,
                weft_record::TOPOLOGY_ANNOTATION,
                crate::duration_arg::show(a.interval)
            ));
            let sd = c.shutdown.clone();
            tasks.push(tokio::spawn(async move {
                keep_topology_published(client, cfg, discover, metrics, ready, sd.clone()).await;
                sd.cancel();
                Ok(())
            }));
        }
        c.started();
        let mut result = Ok(());
        for t in tasks {
            let r = t.await.context("agent task")?;
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}
