//! Discovery: sysfs reading against a fake tree and this machine's real `/sys`; GPU discovery over the
//! fake NVML (level mapping, direct and NVSwitch NVLink counting, failures); GPU–NIC relations from the
//! PCI tree; the cache. With `--features nvml`, the real NVML binding on whatever this machine has.

use std::path::{Path, PathBuf};

use tempfile::TempDir;
use weft_topology::discover::{
    DiscoverOptions, DiscoveryCache, FakeNvml, Fingerprint, GpuBackend, GpuIdentity, GpuSource, NoGpuSource,
    NvmlGpuSource, NvmlTopologyLevel, RemoteDeviceType, SysfsRoot, discover, discover_with, read_cpu_topology,
    read_nics,
};
use weft_topology::model::pair_label;
use weft_topology::{PairLink, PcieGeneration, PcieRelation};

// ---------------------------------------------------------------------------------------------------
// A fake host tree.

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, text).expect("write");
}

fn mkdir(root: &Path, rel: &str) -> PathBuf {
    let p = root.join(rel);
    std::fs::create_dir_all(&p).expect("mkdir");
    p
}

fn link(root: &Path, rel: &str, target: &Path) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::os::unix::fs::symlink(target, &p).expect("symlink");
}

/// A PCI function at `chain` (root first) with a NUMA node and local CPUs, listed in `bus/pci/devices`.
fn pci_device(root: &Path, chain: &str, numa: i32, cpus: &str) -> PathBuf {
    let dir = mkdir(root, &format!("sys/devices/{chain}"));
    std::fs::write(dir.join("numa_node"), format!("{numa}\n")).expect("numa_node");
    std::fs::write(dir.join("local_cpulist"), format!("{cpus}\n")).expect("local_cpulist");
    let bus = chain.rsplit('/').next().expect("bus id");
    link(root, &format!("sys/bus/pci/devices/{bus}"), &dir);
    dir
}

const GPU0_PCI: &str = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:07:00.0";
const NIC0_PCI: &str = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:08:00.0";
const GPU1_PCI: &str = "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:08.0/0000:87:00.0";
const NIC1_PCI: &str = "pci0000:80/0000:80:02.0/0000:90:00.0";
const ETH_PCI: &str = "pci0000:00/0000:00:03.0/0000:03:00.0";
const VF_PCI: &str = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:08:00.2";

/// Two sockets, two NUMA nodes (CPUs 0-7 and 8-15); GPU0 and mlx5_0 under one PCIe switch on node 0;
/// GPU1 on node 1 with mlx5_1 on another root port of the same host bridge; a plain Ethernet NIC
/// (eth0) on node 0; an SR-IOV VF with an RDMA device (mlx5_2); a loopback.
fn fake_host() -> TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = tmp.path();
    write(r, "sys/devices/system/cpu/online", "0-15\n");
    for cpu in 0..16 {
        write(r, &format!("sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"), &format!("{}\n", cpu / 8));
    }
    mkdir(r, "sys/devices/system/cpu/cpufreq");
    write(r, "sys/devices/system/node/node0/cpulist", "0-7\n");
    write(r, "sys/devices/system/node/node1/cpulist", "8-15\n");
    write(r, "sys/devices/system/node/online", "0-1\n");
    write(r, "sys/devices/system/node/has_cpu", "0-1\n");

    pci_device(r, GPU0_PCI, 0, "0-7");
    pci_device(r, GPU1_PCI, 1, "8-15");
    let nic0 = pci_device(r, NIC0_PCI, 0, "0-7");
    mkdir(r, &format!("sys/devices/{NIC0_PCI}/net/ens1f0"));
    let nic1 = pci_device(r, NIC1_PCI, 1, "8-15");
    let eth = pci_device(r, ETH_PCI, 0, "0-7");
    let vf = pci_device(r, VF_PCI, 0, "0-7");
    link(r, &format!("sys/devices/{VF_PCI}/physfn"), &nic0);
    link(r, "sys/class/infiniband/mlx5_0/device", &nic0);
    link(r, "sys/class/infiniband/mlx5_1/device", &nic1);
    link(r, "sys/class/infiniband/mlx5_2/device", &vf);
    link(r, "sys/class/net/ens1f0/device", &nic0);
    link(r, "sys/class/net/eth0/device", &eth);
    mkdir(r, "sys/class/net/lo");

    write(r, "proc/sys/kernel/random/boot_id", "1f0e7a3c-0000-4000-8000-000000000001\n");
    write(r, "proc/sys/kernel/hostname", "gpu-node-7\n");
    tmp
}

fn opts(tmp: &TempDir) -> DiscoverOptions {
    DiscoverOptions { root: SysfsRoot::new(tmp.path()), ..DiscoverOptions::default() }
}

/// Two GPUs at the fake host's bus ids, joined by 4 NVLinks, SYS apart.
fn two_gpus() -> FakeNvml {
    let mut f = FakeNvml::new("535.104.05")
        .gpu("NVIDIA A100-SXM4-80GB", "00000000:07:00.0")
        .gpu("NVIDIA A100-SXM4-80GB", "00000000:87:00.0")
        .all_levels(NvmlTopologyLevel::System)
        .nvlinks(0, 1, 4);
    f.devices[0].max_pcie_link_gen = Some(4);
    f.devices[1].max_pcie_link_gen = Some(5);
    f
}

// ---------------------------------------------------------------------------------------------------
// sysfs.

#[test]
fn fake_sysfs_cpus_numa_and_sockets() {
    let tmp = fake_host();
    let mut notes = Vec::new();
    let cpus = read_cpu_topology(&SysfsRoot::new(tmp.path()), &mut notes);
    assert_eq!(cpus.online.as_ref().map(ToString::to_string).as_deref(), Some("0-15"));
    let nodes: Vec<(u32, String)> = cpus.numa_nodes.iter().map(|n| (n.id, n.cpus.to_string())).collect();
    assert_eq!(nodes, [(0, "0-7".to_string()), (1, "8-15".to_string())]);
    assert_eq!(cpus.sockets, Some(2));
    assert!(notes.is_empty(), "{notes:?}");
}

#[test]
fn fake_sysfs_nics_rdma_then_netdevs_without_vfs() {
    let tmp = fake_host();
    let root = SysfsRoot::new(tmp.path());
    let mut notes = Vec::new();
    let rdma = read_nics(&root, false, &mut notes);
    let names: Vec<&str> = rdma.iter().map(|n| n.nic.name.as_str()).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1"], "the VF mlx5_2 is left out");
    assert_eq!(rdma[0].nic.rdma_device.as_deref(), Some("mlx5_0"));
    assert_eq!(rdma[0].nic.netdev.as_deref(), Some("ens1f0"));
    assert_eq!(rdma[0].nic.pci_bus_id.as_deref(), Some("0000:08:00.0"));
    assert_eq!(rdma[1].nic.numa_node, Some(1));
    assert_eq!(rdma[1].pci_path.as_ref().map(|p| p.root.as_str()), Some("pci0000:80"));

    let all = read_nics(&root, true, &mut notes);
    let names: Vec<&str> = all.iter().map(|n| n.nic.name.as_str()).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1", "eth0"], "ens1f0 belongs to mlx5_0; lo has no PCI device");
    assert_eq!(all[2].nic.rdma_device, None);
    assert_eq!(all[2].nic.netdev.as_deref(), Some("eth0"));
    assert_eq!(all[2].nic.pci_bus_id.as_deref(), Some("0000:03:00.0"));
    assert_eq!(all[2].nic.numa_node, Some(0));
    assert!(notes.is_empty(), "{notes:?}");
}

#[test]
fn an_empty_tree_is_an_empty_node_not_an_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = discover_with(&opts(&tmp), &NoGpuSource::new("no GPUs here")).expect("discover");
    assert_eq!(d.node.gpu_count(), 0);
    assert!(d.node.nics.is_empty());
    assert!(d.node.cpus.numa_nodes.is_empty() && d.node.cpus.online.is_none() && d.node.cpus.sockets.is_none());
    assert_eq!(d.node.name, None);
    assert_eq!(d.notes, ["no GPUs here"], "missing files are not worth a note");
    assert_eq!(d.fingerprint.boot_id, None);
}

#[test]
fn malformed_files_are_skipped_with_a_note() {
    let tmp = fake_host();
    write(tmp.path(), "sys/devices/system/node/node1/cpulist", "8-x\n");
    write(tmp.path(), "sys/devices/system/cpu/online", "garbage\n");
    write(tmp.path(), &format!("sys/devices/{NIC1_PCI}/numa_node"), "one\n");
    let d = discover_with(&opts(&tmp), &NoGpuSource::new("none")).expect("discover");
    assert_eq!(d.node.cpus.online, None);
    assert_eq!(d.node.cpus.numa_nodes.len(), 2);
    assert!(d.node.cpus.numa_nodes[1].cpus.is_empty());
    assert_eq!(d.node.nics[1].numa_node, None);
    let joined = d.notes.join("\n");
    assert!(joined.contains("node1/cpulist") && joined.contains("'8-x'"), "{joined}");
    assert!(joined.contains("cpu/online"), "{joined}");
    assert!(joined.contains("'one' is not a NUMA node number"), "{joined}");
}

#[test]
fn real_sys_of_this_machine() {
    let d = discover(&DiscoverOptions { netdevs: true, ..DiscoverOptions::default() }).expect("discover on /");
    let online = d.node.cpus.online.as_ref().expect("/sys/devices/system/cpu/online");
    assert!(!online.is_empty(), "at least one online CPU");
    let mut listed: Vec<u32> = match std::fs::read_dir("/sys/devices/system/node") {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_prefix("node")?.parse().ok()))
            .collect(),
        Err(_) => Vec::new(),
    };
    listed.sort_unstable();
    let found: Vec<u32> = d.node.cpus.numa_nodes.iter().map(|n| n.id).collect();
    assert_eq!(found, listed, "NUMA nodes match /sys/devices/system/node");
    if !d.node.cpus.numa_nodes.is_empty() {
        for cpu in online.iter() {
            assert!(d.node.cpus.numa_nodes.iter().any(|n| n.cpus.contains(cpu)), "online CPU {cpu} is on a NUMA node");
        }
    }
    for nic in &d.node.nics {
        // Plain netdevs are listed only with a PCI device; RDMA devices may be software ones (rxe).
        if nic.rdma_device.is_none() {
            assert!(nic.pci_bus_id.is_some(), "{} is listed as a netdev without a PCI device", nic.name);
        }
        if let Some(bus) = nic.pci_bus_id.as_deref() {
            assert!(Path::new("/sys/bus/pci/devices").join(bus).exists(), "{}: {bus}", nic.name);
        }
    }
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string());
    assert_eq!(d.fingerprint.boot_id, boot_id);
    if d.node.gpu_count() == 0 {
        assert!(d.notes.iter().any(|n| n.starts_with("NVML not available")), "{:?}", d.notes);
    }
    eprintln!("notes: {:?}", d.notes);
}

#[test]
fn disabled_gpu_backend_says_so() {
    let tmp = fake_host();
    let d = discover(&DiscoverOptions { gpus: GpuBackend::Disabled, ..opts(&tmp) }).expect("discover");
    assert_eq!(d.node.gpu_count(), 0);
    assert_eq!(d.notes, ["GPU discovery disabled"]);
    assert_eq!(d.node.name.as_deref(), Some("gpu-node-7"));
}

// ---------------------------------------------------------------------------------------------------
// GPUs over the fake NVML.

#[test]
fn gpus_from_fake_nvml_with_sysfs_facts_and_nic_relations() {
    let tmp = fake_host();
    let d = discover_with(&DiscoverOptions { netdevs: true, ..opts(&tmp) }, &NvmlGpuSource::new(two_gpus()))
        .expect("discover");
    let node = &d.node;
    assert_eq!(node.name.as_deref(), Some("gpu-node-7"));
    assert_eq!(node.gpu_count(), 2);
    assert_eq!(node.link(0, 1), PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 4 });
    let g0 = &node.gpus[0];
    assert_eq!(g0.uuid.as_deref(), Some("GPU-fake-0000"));
    assert_eq!(g0.pci_bus_id.as_deref(), Some("0000:07:00.0"), "NVML's bus id in sysfs form");
    assert_eq!(g0.numa_node, Some(0), "from sysfs numa_node");
    assert_eq!(g0.cpu_affinity.as_ref().map(ToString::to_string).as_deref(), Some("0-7"), "from local_cpulist");
    assert_eq!(node.gpus[1].numa_node, Some(1));
    assert_eq!(node.pcie_generation, Some(PcieGeneration(4)), "the lowest max link generation");
    assert_eq!(node.nvlink_generation, Some(weft_topology::NvlinkGeneration::Nvlink3), "from the product name");
    let rel = |g: usize, nic: &str| {
        let k = node.nics.iter().position(|n| n.name == nic).expect("NIC");
        node.nic_link(g, k)
    };
    assert_eq!(rel(0, "mlx5_0"), Some(PcieRelation::Pix), "one PCIe switch");
    assert_eq!(rel(0, "mlx5_1"), Some(PcieRelation::Sys), "other root, other NUMA node");
    assert_eq!(rel(1, "mlx5_1"), Some(PcieRelation::Phb), "same host bridge, other root port");
    assert_eq!(rel(1, "mlx5_0"), Some(PcieRelation::Sys));
    assert_eq!(rel(0, "eth0"), Some(PcieRelation::Phb));
    assert_eq!(d.fingerprint.gpu_uuids, ["GPU-fake-0000", "GPU-fake-0001"]);
    assert_eq!(d.fingerprint.driver_version.as_deref(), Some("535.104.05"));
    assert!(!d.from_cache);
    assert!(d.notes.is_empty(), "{:?}", d.notes);
}

fn fake_root() -> (TempDir, SysfsRoot) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = SysfsRoot::new(tmp.path());
    (tmp, root)
}

fn bus(i: u32) -> String {
    format!("00000000:{:02X}:00.0", 0x10 + i * 0x10)
}

/// An 8-GPU NVSwitch baseboard: each GPU has `per_switch[s]` links into switch `s`.
fn nvswitch_board(per_switch: &[u32], device_type: RemoteDeviceType) -> FakeNvml {
    let mut f = FakeNvml::new("550.54.15");
    for i in 0..8 {
        f = f.gpu("NVIDIA H100 80GB HBM3", &bus(i));
    }
    f = f.all_levels(NvmlTopologyLevel::System);
    for i in 0..8 {
        for (s, &count) in per_switch.iter().enumerate() {
            f = f.switch_links(i, &format!("00000000:C{s}:00.0"), count, device_type);
        }
    }
    f
}

fn report(f: FakeNvml) -> weft_topology::discover::GpuReport {
    let (_tmp, root) = fake_root();
    NvmlGpuSource::new(f).report(&root).expect("report")
}

fn nvlinks(r: &weft_topology::discover::GpuReport, a: usize, b: usize) -> u8 {
    r.links[a * r.gpus.len() + b].nvlinks
}

#[test]
fn nvswitch_links_count_as_the_smaller_switch_link_count() {
    // DGX A100: 6 switches × 2 links → NV12 on every pair, whether NVML names the switch or not.
    for t in [RemoteDeviceType::Switch, RemoteDeviceType::Unknown] {
        let r = report(nvswitch_board(&[2, 2, 2, 2, 2, 2], t));
        for a in 0..8 {
            for b in (a + 1)..8 {
                assert_eq!(nvlinks(&r, a, b), 12, "{t:?} GPU{a}-GPU{b}");
            }
        }
    }
    // HGX H100: 4 switches with 5+4+4+5 links → NV18.
    let r = report(nvswitch_board(&[5, 4, 4, 5], RemoteDeviceType::Unknown));
    assert_eq!(nvlinks(&r, 0, 7), 18);
    // A GPU with two ports down has 16 links into the fabric: its pairs get min(16, 18).
    let mut f = nvswitch_board(&[5, 4, 4, 5], RemoteDeviceType::Switch);
    f.ports.remove(&(3, 0));
    f.ports.remove(&(3, 17));
    let r = report(f);
    assert_eq!(nvlinks(&r, 3, 5), 16);
    assert_eq!(nvlinks(&r, 5, 3), 16);
    assert_eq!(nvlinks(&r, 2, 5), 18);
}

#[test]
fn direct_links_win_over_switch_links_and_other_ends_do_not_count() {
    let f = FakeNvml::new("1")
        .gpu("g", &bus(0))
        .gpu("g", &bus(1))
        .gpu("g", &bus(2))
        .all_levels(NvmlTopologyLevel::Node)
        .nvlinks(0, 1, 2)
        .switch_links(0, "0000:c0:00.0", 6, RemoteDeviceType::Switch)
        .switch_links(1, "0000:c0:00.0", 6, RemoteDeviceType::Switch)
        .switch_links(2, "0000:c0:00.0", 3, RemoteDeviceType::Switch)
        // A POWER9 CPU link and a GPU outside this node: neither is a switch.
        .switch_links(2, "0000:d0:00.0", 2, RemoteDeviceType::IbmNpu)
        .switch_links(2, "0000:e0:00.0", 2, RemoteDeviceType::Gpu);
    let r = report(f);
    assert_eq!(nvlinks(&r, 0, 1), 2, "direct links, not the 6 switch links");
    assert_eq!(nvlinks(&r, 0, 2), 3, "min(6, 3) through the switch");
    assert_eq!(nvlinks(&r, 1, 2), 3);
}

#[test]
fn a_gpu_without_switch_links_shares_no_fabric() {
    let f = FakeNvml::new("1")
        .gpu("g", &bus(0))
        .gpu("g", &bus(1))
        .all_levels(NvmlTopologyLevel::HostBridge)
        .switch_links(0, "0000:c0:00.0", 12, RemoteDeviceType::Switch);
    let r = report(f);
    assert_eq!(r.links[1], PairLink { pcie: Some(PcieRelation::Phb), nvlinks: 0 });
}

#[test]
fn dgx1_volta_golden_topology() {
    // go-gpuallocator's NewDGX1VoltaNode (reference §1.7), served by the fake NVML: discovery must
    // give back both relations of every pair.
    let reference = weft_topology::reference::dgx1_volta();
    let level_of = |r: PcieRelation| match r {
        PcieRelation::SameBoard => NvmlTopologyLevel::Internal,
        PcieRelation::Pix => NvmlTopologyLevel::Single,
        PcieRelation::Pxb => NvmlTopologyLevel::Multiple,
        PcieRelation::Phb => NvmlTopologyLevel::HostBridge,
        PcieRelation::Node => NvmlTopologyLevel::Node,
        PcieRelation::Sys => NvmlTopologyLevel::System,
    };
    let mut f = FakeNvml::new("1");
    for i in 0..8 {
        f = f.gpu("Tesla V100-SXM2-32GB", &bus(i));
    }
    for a in 0..8usize {
        for b in (a + 1)..8 {
            let l = reference.link(a, b);
            f = f.level(a as u32, b as u32, level_of(l.pcie.unwrap()));
            if l.nvlinks > 0 {
                f = f.nvlinks(a as u32, b as u32, l.nvlinks.into());
            }
        }
    }
    let r = report(f);
    for a in 0..8 {
        for b in 0..8 {
            assert_eq!(r.links[a * 8 + b], reference.link(a, b), "GPU{a}-GPU{b}");
        }
    }
    assert_eq!(r.links[3].score(), 230, "NV2 on a PHB pair scores 230");
}

#[test]
fn every_nvml_level_maps_through_discovery() {
    let levels = [
        (NvmlTopologyLevel::Internal, PcieRelation::SameBoard),
        (NvmlTopologyLevel::Single, PcieRelation::Pix),
        (NvmlTopologyLevel::Multiple, PcieRelation::Pxb),
        (NvmlTopologyLevel::HostBridge, PcieRelation::Phb),
        (NvmlTopologyLevel::Node, PcieRelation::Node),
        (NvmlTopologyLevel::System, PcieRelation::Sys),
    ];
    let mut f = FakeNvml::new("1");
    for i in 0..=levels.len() as u32 {
        f = f.gpu("g", &bus(i));
    }
    for (j, (level, _)) in levels.iter().enumerate() {
        f = f.level(0, j as u32 + 1, *level);
    }
    let f = f.all_levels(NvmlTopologyLevel::System);
    let r = report(f);
    let n = r.gpus.len();
    for (j, (level, rel)) in levels.iter().enumerate() {
        assert_eq!(r.links[j + 1].pcie, Some(*rel), "{level:?}");
        assert_eq!(r.links[(j + 1) * n].pcie, Some(*rel), "{level:?} symmetric");
    }
}

#[test]
fn a_lost_gpu_keeps_its_index_and_its_pairs_degrade_to_sys() {
    let mut f = FakeNvml::new("1");
    for i in 0..4 {
        f = f.gpu("NVIDIA A100-SXM4-80GB", &bus(i));
    }
    let mut f = f.all_levels(NvmlTopologyLevel::Single).nvlinks(0, 1, 12).nvlinks(1, 2, 12).nvlinks(2, 3, 12);
    f.failing_devices.insert(2);
    // As nvml-wrapper 0.13 reports them: no remote type, only the remote PCI id.
    for remote in f.ports.values_mut() {
        remote.device_type = RemoteDeviceType::Unknown;
    }
    let r = report(f);
    assert_eq!(r.gpus.len(), 4);
    assert_eq!(r.gpus[2].uuid, None);
    let at = |a: usize, b: usize| r.links[a * 4 + b];
    assert_eq!(at(1, 2), PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 });
    assert_eq!(at(2, 3), PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 });
    assert_eq!(at(0, 1), PairLink { pcie: Some(PcieRelation::Pix), nvlinks: 12 });
    assert_eq!(at(1, 3).nvlinks, 0, "links to the lost GPU are not mistaken for switch links");
    assert!(r.notes.iter().any(|n| n.contains("GPU2: NVML: GPU2: GPU is lost")), "{:?}", r.notes);
}

#[test]
fn failing_queries_fall_back_and_leave_notes() {
    let tmp = fake_host();
    // No level for the pair: the PCI tree in sysfs decides (different roots, NUMA 0 vs 1 → SYS).
    let mut f = FakeNvml::new("1").gpu("g", "00000000:07:00.0").gpu("g", "00000000:87:00.0").nvlinks(0, 1, 4);
    // GPU1's port 0 (one of the two pair's links seen from GPU1) fails.
    f.failing_ports.insert((1, 0));
    let r = NvmlGpuSource::new(f).report(&SysfsRoot::new(tmp.path())).expect("report");
    assert_eq!(r.links[1], PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 4 }, "the count seen from GPU0");
    let joined = r.notes.join("\n");
    assert!(joined.contains("GPU0-GPU1") && joined.contains("taken as SYS"), "{joined}");
    assert!(joined.contains("GPU1: NVLink 0"), "{joined}");
    assert!(joined.contains("GPU0 sees 4 NVLinks to GPU1 but GPU1 sees 3; using 4"), "{joined}");
}

#[test]
fn same_switch_gpus_fall_back_to_pix_from_sysfs() {
    let tmp = fake_host();
    let second = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:18.0/0000:0a:00.0";
    pci_device(tmp.path(), second, 0, "0-7");
    let f = FakeNvml::new("1").gpu("g", "00000000:07:00.0").gpu("g", "00000000:0A:00.0");
    let r = NvmlGpuSource::new(f).report(&SysfsRoot::new(tmp.path())).expect("report");
    assert_eq!(r.links[1], PairLink { pcie: Some(PcieRelation::Pix), nvlinks: 0 });
}

#[test]
fn identity_is_cheap_and_reads_no_links() {
    let f = nvswitch_board(&[2, 2, 2, 2, 2, 2], RemoteDeviceType::Switch);
    let src = NvmlGpuSource::new(f);
    let id = src.identity().expect("identity");
    assert_eq!(id.uuids.len(), 8);
    assert_eq!(id.driver_version.as_deref(), Some("550.54.15"));
    assert_eq!(src.nvml().nvlink_calls(), 0);
    let (_tmp, root) = fake_root();
    src.report(&root).expect("report");
    assert_eq!(src.nvml().nvlink_calls(), 8 * 18, "one query per GPU and port, not per pair");
}

// ---------------------------------------------------------------------------------------------------
// Cache.

#[test]
fn the_cache_skips_link_queries_until_the_fingerprint_changes() {
    let tmp = fake_host();
    let cache_path = tmp.path().join("var/lib/weft/topology.json");
    let o = DiscoverOptions { cache: Some(DiscoveryCache::new(&cache_path)), ..opts(&tmp) };

    let first_src = NvmlGpuSource::new(two_gpus());
    let first = discover_with(&o, &first_src).expect("first");
    assert!(!first.from_cache);
    assert!(first_src.nvml().nvlink_calls() > 0);
    assert!(cache_path.exists(), "the cache file is written, parent directories included");
    let text = std::fs::read_to_string(&cache_path).expect("cache file");
    assert!(text.contains("\"apiVersion\": \"weft.io/v1alpha1\"") && text.contains("GPU-fake-0001"), "{text}");

    let second_src = NvmlGpuSource::new(two_gpus());
    let second = discover_with(&o, &second_src).expect("second");
    assert!(second.from_cache);
    assert_eq!(second_src.nvml().nvlink_calls(), 0, "no NVLink queries on a cache hit");
    assert_eq!(second.node, first.node);
    assert!(second.notes.iter().any(|n| n.starts_with("GPU topology from cache")), "{:?}", second.notes);

    // A driver update invalidates it.
    let mut updated = two_gpus();
    updated.driver_version = Some("550.54.15".into());
    let third = discover_with(&o, &NvmlGpuSource::new(updated)).expect("third");
    assert!(!third.from_cache);
    assert!(
        third
            .notes
            .iter()
            .any(|n| n.contains("stale") && n.contains("driver version changed from 535.104.05 to 550.54.15")),
        "{:?}",
        third.notes
    );

    // So does a reboot.
    write(tmp.path(), "proc/sys/kernel/random/boot_id", "1f0e7a3c-0000-4000-8000-000000000002\n");
    let fourth = discover_with(&o, &NvmlGpuSource::new(two_gpus())).expect("fourth");
    assert!(!fourth.from_cache);
    assert!(fourth.notes.iter().any(|n| n.contains("the node rebooted")), "{:?}", fourth.notes);
}

#[test]
fn nics_and_cpus_are_read_fresh_on_a_cache_hit() {
    let tmp = fake_host();
    let o = DiscoverOptions { cache: Some(DiscoveryCache::new(tmp.path().join("cache.json"))), ..opts(&tmp) };
    let first = discover_with(&o, &NvmlGpuSource::new(two_gpus())).expect("first");
    assert_eq!(first.node.nics.len(), 2);
    std::fs::remove_dir_all(tmp.path().join("sys/class/infiniband/mlx5_1")).expect("unplug mlx5_1");
    let second = discover_with(&o, &NvmlGpuSource::new(two_gpus())).expect("second");
    assert!(second.from_cache);
    let names: Vec<&str> = second.node.nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["mlx5_0"]);
    assert_eq!(second.node.nic_link(0, 0), Some(PcieRelation::Pix));
    assert_eq!(second.node.links(), first.node.links());
}

#[test]
fn a_corrupt_cache_is_rediscovered_and_rewritten() {
    let tmp = fake_host();
    let path = tmp.path().join("topology.json");
    std::fs::write(&path, "{\n  \"fingerprint\": 7,\n}").expect("write");
    let o = DiscoverOptions { cache: Some(DiscoveryCache::new(&path)), ..opts(&tmp) };
    let d = discover_with(&o, &NvmlGpuSource::new(two_gpus())).expect("discover");
    assert!(!d.from_cache);
    let note = d.notes.iter().find(|n| n.starts_with("cache unreadable")).expect("note");
    assert!(note.contains(&format!("{}:2:", path.display())), "{note}");
    let (fp, node) = DiscoveryCache::new(&path).load().expect("load").expect("rewritten");
    assert_eq!(fp, d.fingerprint);
    assert_eq!(node, d.node);
}

#[test]
fn an_unwritable_cache_is_a_note_not_an_error() {
    let tmp = fake_host();
    let blocker = tmp.path().join("not-a-dir");
    std::fs::write(&blocker, "").expect("file");
    let o = DiscoverOptions { cache: Some(DiscoveryCache::new(blocker.join("topology.json"))), ..opts(&tmp) };
    let d = discover_with(&o, &NvmlGpuSource::new(two_gpus())).expect("discover");
    assert_eq!(d.node.gpu_count(), 2);
    assert!(d.notes.iter().any(|n| n.starts_with("could not write the cache")), "{:?}", d.notes);
}

#[test]
fn cache_load_store_and_clear() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = DiscoveryCache::new(tmp.path().join("a/b/t.json"));
    assert!(cache.load().expect("missing is fine").is_none());
    let node = weft_topology::model::uniform_node("n", 3, PairLink { pcie: Some(PcieRelation::Node), nvlinks: 0 });
    let fp = Fingerprint::new(
        &GpuIdentity { driver_version: Some("1".into()), uuids: vec!["a".into(), "b".into(), "c".into()] },
        Some("boot".into()),
    );
    cache.store(&fp, &node).expect("store");
    let (back_fp, back) = cache.load().expect("load").expect("present");
    assert_eq!(back_fp, fp);
    assert_eq!(back, node);
    assert_eq!(pair_label(back.link(0, 2)), "NODE");
    let other = Fingerprint::new(&GpuIdentity { driver_version: Some("1".into()), uuids: vec!["a".into()] }, None);
    let why = fp.difference(&other).expect("differs");
    assert!(why.contains("the node rebooted") && why.contains("GPU set changed (3 GPUs cached, 1 now)"), "{why}");
    assert_eq!(fp.difference(&fp), None);
    cache.clear().expect("clear");
    assert!(cache.load().expect("load").is_none());
    cache.clear().expect("clearing twice is fine");
}

// ---------------------------------------------------------------------------------------------------
// The real NVML binding (only with `--features nvml`): on a machine without a driver it must say so;
// on a GPU machine it must produce a consistent node.

#[cfg(feature = "nvml")]
#[test]
fn real_nvml_reports_absence_or_a_consistent_node() {
    use weft_topology::discover::{NvmlLib, NvmlLike};
    match NvmlLib::open() {
        Err(e) => {
            assert!(matches!(e, weft_topology::TopologyError::Nvml(_)), "{e}");
            let d = discover(&DiscoverOptions::default()).expect("discover without NVML");
            assert_eq!(d.node.gpu_count(), 0);
            assert!(d.notes.iter().any(|n| n.starts_with("NVML not available: init")), "{:?}", d.notes);
        }
        Ok(lib) => {
            let count = lib.device_count().expect("device count") as usize;
            let d = discover(&DiscoverOptions { netdevs: true, ..DiscoverOptions::default() }).expect("discover");
            eprintln!("{}", weft_topology::render::to_table(&d.node));
            eprintln!("notes: {:#?}", d.notes);
            assert_eq!(d.node.gpu_count(), count);
            for (i, g) in d.node.gpus.iter().enumerate() {
                assert!(g.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")), "GPU{i} uuid");
                let bus = g.pci_bus_id.as_deref().expect("bus id");
                assert!(Path::new("/sys/bus/pci/devices").join(bus).exists(), "GPU{i} {bus} in sysfs");
            }
            for a in 0..count {
                for b in (a + 1)..count {
                    assert!(d.node.link(a, b).pcie.is_some(), "GPU{a}-GPU{b} has a PCIe relation");
                }
            }
        }
    }
}
