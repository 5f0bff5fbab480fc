//! A fake sysfs tree of SR-IOV functions for tests: PFs under a chain of PCIe bridges, VFs beside
//! them with `virtfn<N>`/`physfn` links, netdevs with link files, RDMA devices and drivers, laid out
//! as the kernel lays them out, so [`super::read_sriov`], [`super::read_vf`] and anything that
//! canonicalises device links read it as they read a host.
//!
//! Test support: a file that cannot be written is a broken test machine, so the builder panics
//! with the path rather than returning errors.

use std::path::{Path, PathBuf};

use super::pci::normalize_pci_bus_id;
use super::sysfs::SysfsRoot;

/// A tree of SR-IOV functions under a root directory.
#[derive(Clone, Debug)]
pub struct FakeSriovTree {
    root: PathBuf,
}

/// One function of the tree, for further builder calls.
#[derive(Clone, Debug)]
pub struct FakeFunction {
    root: PathBuf,
    dev: PathBuf,
}

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn symlink(target: &Path, link: &Path) {
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
    }
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link)
        .unwrap_or_else(|e| panic!("link {} -> {}: {e}", link.display(), target.display()));
}

fn bdf(bus: &str) -> String {
    normalize_pci_bus_id(bus).unwrap_or_else(|| panic!("'{bus}' is not a PCI address"))
}

impl FakeSriovTree {
    /// A tree under `root` (a temporary directory).
    pub fn new(root: &Path) -> FakeSriovTree {
        FakeSriovTree { root: root.to_path_buf() }
    }

    /// The root to read it through.
    pub fn root(&self) -> SysfsRoot {
        SysfsRoot::new(&self.root)
    }

    fn device_dir(&self, bus: &str) -> PathBuf {
        self.root.join("sys/bus/pci/devices").join(bus)
    }

    /// A PF at `bus` below `bridges` (root port first; the PCI root is `pci<domain>:<bus of the
    /// first bridge>`), with netdev `netdev` on NUMA node `numa`, `sriov_totalvfs` 8 and no VFs
    /// enabled until [`Self::vf`] adds them.
    pub fn pf(&self, bus: &str, bridges: &[&str], netdev: &str, numa: u32) -> FakeFunction {
        let f = self.pci_device(bus, bridges, numa);
        write(&f.dev.join("sriov_totalvfs"), "8\n");
        write(&f.dev.join("sriov_numvfs"), "0\n");
        f.netdev(netdev)
    }

    /// A PCI function at `bus` below `bridges` (as for [`Self::pf`]) on NUMA node `numa`, with no
    /// SR-IOV files: a GPU, say, for code that places VFs near it.
    pub fn pci_device(&self, bus: &str, bridges: &[&str], numa: u32) -> FakeFunction {
        let bus = bdf(bus);
        let first = bdf(bridges.first().copied().unwrap_or(&bus));
        let mut dir = self.root.join("sys/devices").join(format!("pci{}", &first[..7]));
        for b in bridges {
            dir.push(bdf(b));
        }
        dir.push(&bus);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        symlink(&dir, &self.device_dir(&bus));
        write(&dir.join("numa_node"), &format!("{numa}\n"));
        FakeFunction { root: self.root.clone(), dev: dir }
    }

    /// VF `index` of the PF at `pf_bus`, at `bus` beside it, with its netdev when `netdev` is given
    /// (a VF whose netdev sits in a pod's namespace has none here).
    pub fn vf(&self, pf_bus: &str, index: u32, bus: &str, netdev: Option<&str>) -> FakeFunction {
        let (pf_bus, bus) = (bdf(pf_bus), bdf(bus));
        let pf_dir = std::fs::canonicalize(self.device_dir(&pf_bus))
            .unwrap_or_else(|e| panic!("PF {pf_bus} must be added before its VFs: {e}"));
        let dir = pf_dir.parent().map_or_else(|| self.root.clone(), Path::to_path_buf).join(&bus);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        symlink(&dir, &self.device_dir(&bus));
        symlink(&pf_dir, &dir.join("physfn"));
        symlink(&dir, &pf_dir.join(format!("virtfn{index}")));
        let numa = std::fs::read_to_string(pf_dir.join("numa_node")).unwrap_or_else(|_| "-1".into());
        write(&dir.join("numa_node"), &numa);
        let enabled = std::fs::read_dir(&pf_dir)
            .map(|rd| {
                rd.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("virtfn")).count()
            })
            .unwrap_or(0);
        write(&pf_dir.join("sriov_numvfs"), &format!("{enabled}\n"));
        let f = FakeFunction { root: self.root.clone(), dev: dir };
        match netdev {
            Some(n) => f.netdev(n),
            None => f,
        }
    }
}

impl FakeFunction {
    /// The function's device directory.
    pub fn dir(&self) -> &Path {
        &self.dev
    }

    fn netdev(self, name: &str) -> FakeFunction {
        let net = self.dev.join("net").join(name);
        std::fs::create_dir_all(&net).unwrap_or_else(|e| panic!("create {}: {e}", net.display()));
        symlink(&self.dev, &net.join("device"));
        symlink(&net, &self.root.join("sys/class/net").join(name));
        self
    }

    /// Link files of its netdev `netdev`: `operstate`, `speed` (Mb/s), `mtu` 1500 and an address.
    pub fn link(self, netdev: &str, operstate: &str, speed_mbps: u32) -> FakeFunction {
        let net = self.dev.join("net").join(netdev);
        write(&net.join("operstate"), &format!("{operstate}\n"));
        write(&net.join("speed"), &format!("{speed_mbps}\n"));
        write(&net.join("mtu"), "1500\n");
        write(&net.join("address"), "02:00:00:00:00:01\n");
        self
    }

    /// An RDMA device `name` on the function.
    pub fn rdma(self, name: &str) -> FakeFunction {
        let ib = self.dev.join("infiniband").join(name);
        std::fs::create_dir_all(&ib).unwrap_or_else(|e| panic!("create {}: {e}", ib.display()));
        symlink(&ib, &self.root.join("sys/class/infiniband").join(name));
        self
    }

    /// The verbs character device `name` (`uverbs3`) of the function's RDMA device, as the kernel
    /// lists it under the device (`infiniband_verbs/<name>`, with `ibdev` naming the RDMA device).
    pub fn uverbs(self, name: &str) -> FakeFunction {
        let verbs = self.dev.join("infiniband_verbs").join(name);
        let ibdev = std::fs::read_dir(self.dev.join("infiniband"))
            .ok()
            .and_then(|mut rd| rd.next())
            .and_then(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .unwrap_or_default();
        write(&verbs.join("ibdev"), &format!("{ibdev}\n"));
        symlink(&verbs, &self.root.join("sys/class/infiniband_verbs").join(name));
        self
    }

    /// Bind it to driver `name`.
    pub fn driver(self, name: &str) -> FakeFunction {
        let drv = self.root.join("sys/bus/pci/drivers").join(name);
        std::fs::create_dir_all(&drv).unwrap_or_else(|e| panic!("create {}: {e}", drv.display()));
        symlink(&drv, &self.dev.join("driver"));
        self
    }
}
