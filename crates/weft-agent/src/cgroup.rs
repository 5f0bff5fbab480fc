//! Enforcement in bypass mode: write a container's [`ContainerSettings`] into its cgroup files, and
//! read them back to detect drift (Katalyst's executor, §3.3 of the ORM notes, which writes only the
//! cpuset; weft also writes the CFS quota and the memory limits).
//!
//! Three parts:
//! - [`CgroupHierarchy`]: where the controllers are mounted, and whether they are cgroup v1 (one
//!   hierarchy per controller: `/sys/fs/cgroup/cpuset`, `/sys/fs/cgroup/cpu` or `cpu,cpuacct`,
//!   `/sys/fs/cgroup/memory`) or v2 (one unified hierarchy, `cgroup.controllers` at its root). A
//!   hybrid host (v1 controllers plus a controller-less v2 mount at `/sys/fs/cgroup/unified`) is
//!   v1 for resource control.
//! - [`CgroupLayout`] / [`ContainerCgroup`]: a container's cgroup path as the kubelet and the
//!   runtime lay it out (cgroupfs or systemd driver; containerd, CRI-O or Docker), or as NRI hands
//!   it over (`cgroups_path`, either `/kubepods/…` or systemd's `slice:prefix:name`).
//! - [`CgroupWriter`], the real [`CgroupEnforcer`]: applies settings transactionally (a failed write
//!   rolls back what this call wrote) and reads the values back.
//!
//! Files written, in this order (fields that are `None`, or an empty CPU or memory-node set, are
//! left alone; files already holding the value are not rewritten):
//!
//! | setting | v1 | v2 |
//! |---|---|---|
//! | `cpu_quota`, `cpu_period` | `cpu/cpu.cfs_period_us`, `cpu/cpu.cfs_quota_us` | `cpu.max` |
//! | `memory_limit` | `memory/memory.limit_in_bytes` | `memory.max` |
//! | `memory_high` | (none in v1: skipped) | `memory.high` |
//! | `cpus`, `mems` | `cpuset/cpuset.cpus`, `cpuset/cpuset.mems` | `cpuset.cpus`, `cpuset.mems` |
//!
//! v1 cpusets are strict: a cgroup's `cpuset.cpus`/`mems` must lie within its parent's, and a
//! cgroup cannot shrink below what its own children hold (`EINVAL` / `EBUSY`). So in v1 a cpuset
//! that grows first widens the ancestors that lack the new CPUs (top-down; the hierarchy root is
//! never written), and one that shrinks first narrows the descendants that hold CPUs outside the new
//! set (deepest first). In v1 the CFS quota and period are written in whichever order keeps the
//! intermediate quota/period ratio the smaller one, so a parent's bandwidth limit holds throughout.
//! v2 has neither constraint (an out-of-parent cpuset only narrows the effective set).

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use thiserror::Error;
use weft_topology::CpuSet;

use crate::cpus::{intersection, is_subset, union};
use crate::pod::QosClass;
use crate::settings::ContainerSettings;

/// Where the cgroup hierarchies are mounted.
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The kubelet's top-level cgroup for pods (`--cgroup-root` `/`, `kubepods` / `kubepods.slice`).
pub const DEFAULT_KUBEPODS: &str = "kubepods";
/// How deep below a container cgroup v1 descendants are looked for when its cpuset shrinks.
const MAX_DESCENDANT_DEPTH: usize = 8;
/// A memory value read back may be this much below the value written: the kernel rounds limits
/// down to whole pages (4 KiB, up to 64 KiB on some arm64 kernels).
const MAX_PAGE_SIZE: i64 = 64 << 10;
/// v1 reports "no memory limit" as `PAGE_COUNTER_MAX` pages, just below `i64::MAX`.
const V1_UNLIMITED_FLOOR: i64 = 1 << 62;

/// Why a cgroup could not be found, read or written.
#[derive(Debug, Error)]
pub enum CgroupError {
    /// No usable hierarchy under the mount root.
    #[error("no cgroup hierarchy at {}: {why}", root.display())]
    NoHierarchy {
        /// The mount root looked at.
        root: PathBuf,
        /// What is missing.
        why: String,
    },
    /// A v1 controller the settings need is not mounted.
    #[error("cgroup v1 controller {controller} is not mounted under {}", root.display())]
    NoController {
        /// `cpuset`, `cpu` or `memory`.
        controller: &'static str,
        /// The mount root.
        root: PathBuf,
    },
    /// The container's cgroup directory does not exist (the container is gone, or not created
    /// yet).
    #[error("cgroup directory {} does not exist", dir.display())]
    NotFound {
        /// The directory.
        dir: PathBuf,
    },
    /// A cgroup path or one of its parts is not acceptable.
    #[error("invalid cgroup path {path:?}: {why}")]
    InvalidPath {
        /// The path (or pod uid, container id) given.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The settings cannot be written as they are.
    #[error("invalid settings: {why}")]
    InvalidSettings {
        /// What is wrong.
        why: String,
    },
    /// A file could not be read.
    #[error("reading {}: {source}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file holds something unexpected.
    #[error("{}: unexpected content {content:?}: {why}", file.display())]
    Parse {
        /// The file.
        file: PathBuf,
        /// What it holds.
        content: String,
        /// What was expected.
        why: String,
    },
    /// A write failed; what this call had written before it was rolled back.
    #[error("writing {value:?} to {}: {source}{}", file.display(), rollback_note(*rolled_back, rollback_failures))]
    Write {
        /// The file.
        file: PathBuf,
        /// The value.
        value: String,
        /// The kernel's answer (`EINVAL` for CPUs that do not exist or lie outside the parent,
        /// `EBUSY` for a memory limit below usage or a cpuset a child still uses).
        #[source]
        source: std::io::Error,
        /// How many earlier writes were undone.
        rolled_back: usize,
        /// Earlier writes that could not be undone: `file: error`.
        rollback_failures: Vec<String>,
    },
}

fn rollback_note(rolled_back: usize, failures: &[String]) -> String {
    let mut note = String::new();
    if rolled_back > 0 {
        note = format!("; rolled back {rolled_back} earlier write(s)");
    }
    if !failures.is_empty() {
        note.push_str(&format!("; ROLLBACK FAILED for {}", failures.join(", ")));
    }
    note
}

impl CgroupError {
    /// Whether the error means the container's cgroup is not there (container gone): the bypass
    /// loop drops such containers instead of retrying.
    pub fn is_gone(&self) -> bool {
        matches!(self, CgroupError::NotFound { .. })
    }
}

/// Which cgroup version governs CPU and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CgroupVersion {
    /// One hierarchy per controller (including hybrid hosts).
    V1,
    /// The unified hierarchy.
    V2,
}

impl CgroupVersion {
    /// The version of the hierarchy mounted at `root` (see [`CgroupHierarchy::detect`]).
    pub fn detect(root: &Path) -> Result<CgroupVersion, CgroupError> {
        CgroupHierarchy::detect(root).map(|h| h.version())
    }
}

/// A resource controller weft writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Controller {
    /// `cpuset`.
    Cpuset,
    /// `cpu` (CFS bandwidth).
    Cpu,
    /// `memory`.
    Memory,
}

impl Controller {
    /// The kernel's name of the controller.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpuset => "cpuset",
            Controller::Cpu => "cpu",
            Controller::Memory => "memory",
        }
    }
}

/// Where the controllers are mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupHierarchy {
    version: CgroupVersion,
    root: PathBuf,
    cpuset: Option<PathBuf>,
    cpu: Option<PathBuf>,
    memory: Option<PathBuf>,
}

impl CgroupHierarchy {
    /// Look at the mount root (normally [`DEFAULT_CGROUP_ROOT`]): v2 if `cgroup.controllers` is
    /// there; otherwise v1, with each of `cpuset`, `cpu` (or `cpu,cpuacct`, `cpuacct,cpu`) and
    /// `memory` found as a directory holding that controller's files. An error when neither.
    pub fn detect(root: impl AsRef<Path>) -> Result<CgroupHierarchy, CgroupError> {
        let root = root.as_ref().to_path_buf();
        if root.join("cgroup.controllers").is_file() {
            return Ok(CgroupHierarchy::v2(root));
        }
        let mounted =
            |names: &[&str], marker: &str| names.iter().map(|n| root.join(n)).find(|dir| dir.join(marker).is_file());
        let cpuset = mounted(&["cpuset"], "cpuset.cpus");
        let cpu = mounted(&["cpu", "cpu,cpuacct", "cpuacct,cpu"], "cpu.shares");
        let memory = mounted(&["memory"], "memory.limit_in_bytes");
        if cpuset.is_none() && cpu.is_none() && memory.is_none() {
            let why = if root.is_dir() {
                "neither cgroup.controllers (v2) nor a cpuset, cpu or memory controller directory (v1)"
            } else {
                "not a directory"
            };
            return Err(CgroupError::NoHierarchy { root, why: why.to_owned() });
        }
        Ok(CgroupHierarchy { version: CgroupVersion::V1, root, cpuset, cpu, memory })
    }

    /// A v2 hierarchy at `root`, without looking (tests on plain files).
    pub fn v2(root: impl Into<PathBuf>) -> CgroupHierarchy {
        let root = root.into();
        CgroupHierarchy {
            version: CgroupVersion::V2,
            cpuset: Some(root.clone()),
            cpu: Some(root.clone()),
            memory: Some(root.clone()),
            root,
        }
    }

    /// v1 or v2.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The mount root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `controller`'s hierarchy is mounted (the mount root itself in v2).
    pub fn controller_root(&self, controller: Controller) -> Option<&Path> {
        match controller {
            Controller::Cpuset => self.cpuset.as_deref(),
            Controller::Cpu => self.cpu.as_deref(),
            Controller::Memory => self.memory.as_deref(),
        }
    }

    /// The directory of `cgroup` in `controller`'s hierarchy (not checked for existence).
    pub fn dir(&self, controller: Controller, cgroup: &ContainerCgroup) -> Result<PathBuf, CgroupError> {
        let base = self
            .controller_root(controller)
            .ok_or_else(|| CgroupError::NoController { controller: controller.name(), root: self.root.clone() })?;
        Ok(cgroup.dir_under(base))
    }

    /// A directory that exists exactly when `cgroup` exists: its cpuset directory in v1 (else cpu,
    /// else memory), its directory in v2.
    fn probe_dir(&self, cgroup: &ContainerCgroup) -> Option<PathBuf> {
        [Controller::Cpuset, Controller::Cpu, Controller::Memory]
            .into_iter()
            .find_map(|c| self.controller_root(c))
            .map(|base| cgroup.dir_under(base))
    }
}

/// A cgroup path relative to a hierarchy's root, `/`-separated and starting with `/`:
/// `/kubepods/burstable/pod<uid>/<id>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerCgroup {
    path: String,
}

impl ContainerCgroup {
    /// A path like `/kubepods/pod<uid>/<id>`: absolute, no empty, `.` or `..` components, no NUL.
    /// A trailing `/` is dropped. `/` itself is the root cgroup.
    pub fn new(path: &str) -> Result<ContainerCgroup, CgroupError> {
        let invalid = |why: &str| CgroupError::InvalidPath { path: path.to_owned(), why: why.to_owned() };
        let Some(rest) = path.strip_prefix('/') else { return Err(invalid("not absolute (must start with /)")) };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if path.contains('\0') {
            return Err(invalid("contains NUL"));
        }
        if !rest.is_empty() {
            for part in rest.split('/') {
                if part.is_empty() || part == "." || part == ".." {
                    return Err(invalid("empty, . or .. component"));
                }
            }
        }
        Ok(ContainerCgroup { path: format!("/{rest}") })
    }

    /// An OCI / NRI `cgroupsPath`: either a path (`/kubepods/burstable/pod<uid>/<id>`, cgroupfs
    /// driver) or systemd's `slice:prefix:name`
    /// (`kubepods-burstable-pod<uid>.slice:cri-containerd:<id>` →
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`),
    /// as runc expands it (a `name` ending in `.slice` is used as is, an empty prefix gives
    /// `<name>.scope`).
    pub fn from_cgroups_path(cgroups_path: &str) -> Result<ContainerCgroup, CgroupError> {
        if cgroups_path.starts_with('/') {
            return ContainerCgroup::new(cgroups_path);
        }
        let invalid = |why: &str| CgroupError::InvalidPath { path: cgroups_path.to_owned(), why: why.to_owned() };
        let parts: Vec<&str> = cgroups_path.split(':').collect();
        let [slice, prefix, name] = parts.as_slice() else {
            return Err(invalid("neither an absolute path nor systemd's slice:prefix:name"));
        };
        if name.is_empty() || name.contains('/') || prefix.contains('/') {
            return Err(invalid("systemd unit name empty or containing /"));
        }
        let slice_path =
            expand_slice(if slice.is_empty() { "system.slice" } else { slice }).map_err(|e| invalid(&e))?;
        let unit = if name.ends_with(".slice") {
            (*name).to_owned()
        } else if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        };
        ContainerCgroup::new(&format!("{}/{unit}", slice_path.trim_end_matches('/')))
    }

    /// The path, `/`-separated, starting with `/`.
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// The parent cgroup; `None` for the root.
    pub fn parent(&self) -> Option<ContainerCgroup> {
        if self.path == "/" {
            return None;
        }
        let cut = self.path.rfind('/').unwrap_or(0);
        Some(ContainerCgroup { path: if cut == 0 { "/".to_owned() } else { self.path[..cut].to_owned() } })
    }

    /// The cgroups strictly between the root and this one, outermost first.
    pub fn ancestors(&self) -> Vec<ContainerCgroup> {
        let mut out = Vec::new();
        let mut at = self.parent();
        while let Some(cgroup) = at {
            if cgroup.path == "/" {
                break;
            }
            at = cgroup.parent();
            out.push(cgroup);
        }
        out.reverse();
        out
    }

    /// The child cgroup `name` (one path component).
    pub fn child(&self, name: &str) -> Result<ContainerCgroup, CgroupError> {
        if name.is_empty() || name.contains('/') {
            return Err(CgroupError::InvalidPath {
                path: name.to_owned(),
                why: "not a single path component".to_owned(),
            });
        }
        ContainerCgroup::new(&format!("{}/{name}", self.path.trim_end_matches('/')))
    }

    /// The directory of this cgroup in the hierarchy mounted at `mount`.
    pub fn dir_under(&self, mount: &Path) -> PathBuf {
        let rest = self.path.trim_start_matches('/');
        if rest.is_empty() { mount.to_path_buf() } else { mount.join(rest) }
    }
}

impl fmt::Display for ContainerCgroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)
    }
}

/// A systemd slice name as a cgroup path, the way systemd (and runc's `ExpandSlice`) nests it:
/// `a-b-c.slice` → `/a.slice/a-b.slice/a-b-c.slice`; `-.slice` → `/`.
pub fn expand_slice(slice: &str) -> Result<String, String> {
    let Some(name) = slice.strip_suffix(".slice") else { return Err(format!("{slice:?} does not end in .slice")) };
    if name == "-" {
        return Ok("/".to_owned());
    }
    if name.is_empty() || name.contains('/') {
        return Err(format!("{slice:?} is not a slice name"));
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in name.split('-') {
        if part.is_empty() {
            return Err(format!("{slice:?} has an empty component"));
        }
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
    }
    Ok(path)
}

/// How the kubelet names cgroups (its `--cgroup-driver`, which must match the runtime's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CgroupDriver {
    /// Plain directories: `/kubepods/burstable/pod<uid>/<id>`.
    Cgroupfs,
    /// systemd slices and scopes: `/kubepods.slice/kubepods-burstable.slice/…/<prefix>-<id>.scope`.
    Systemd,
}

/// The container runtime, which names the container's own cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerRuntime {
    /// containerd (CRI plugin): `<id>` / `cri-containerd-<id>.scope`.
    Containerd,
    /// CRI-O: `crio-<id>` / `crio-<id>.scope`.
    CriO,
    /// Docker (cri-dockerd): `<id>` / `docker-<id>.scope`.
    Docker,
}

impl ContainerRuntime {
    /// From the scheme of a pod status `containerID` (`containerd`, `cri-o`, `docker`).
    pub fn from_scheme(scheme: &str) -> Option<ContainerRuntime> {
        match scheme {
            "containerd" => Some(ContainerRuntime::Containerd),
            "cri-o" | "crio" => Some(ContainerRuntime::CriO),
            "docker" => Some(ContainerRuntime::Docker),
            _ => None,
        }
    }

    /// The systemd scope prefix: `cri-containerd`, `crio`, `docker`.
    pub fn scope_prefix(self) -> &'static str {
        match self {
            ContainerRuntime::Containerd => "cri-containerd",
            ContainerRuntime::CriO => "crio",
            ContainerRuntime::Docker => "docker",
        }
    }

    /// The container's directory name with the cgroupfs driver: `<id>`, or `crio-<id>` for CRI-O.
    fn cgroupfs_name(self, id: &str) -> String {
        match self {
            ContainerRuntime::CriO => format!("crio-{id}"),
            ContainerRuntime::Containerd | ContainerRuntime::Docker => id.to_owned(),
        }
    }
}

/// Where the kubelet puts pod and container cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLayout {
    /// The kubelet's cgroup driver.
    pub driver: CgroupDriver,
    /// The runtime.
    pub runtime: ContainerRuntime,
    /// The cgroup the pods' root sits in (kubelet `--cgroup-root`): `/`; tests use a private one.
    pub parent: ContainerCgroup,
    /// The pods' root cgroup name: `kubepods` (`kubepods.slice` with systemd).
    pub root_name: String,
}

impl CgroupLayout {
    /// The kubelet's default layout for `driver` and `runtime`: `/kubepods` or `/kubepods.slice`.
    pub fn new(driver: CgroupDriver, runtime: ContainerRuntime) -> CgroupLayout {
        CgroupLayout {
            driver,
            runtime,
            parent: ContainerCgroup { path: "/".to_owned() },
            root_name: DEFAULT_KUBEPODS.to_owned(),
        }
    }

    /// The pod's cgroup: cgroupfs `/kubepods[/burstable|/besteffort]/pod<uid>`, systemd
    /// `/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid with _ for ->.slice`.
    /// Guaranteed pods sit directly under the root.
    pub fn pod_cgroup(&self, qos: QosClass, pod_uid: &str) -> Result<ContainerCgroup, CgroupError> {
        check_name(pod_uid)?;
        check_name(&self.root_name)?;
        let qos_name = match qos {
            QosClass::Guaranteed => None,
            QosClass::Burstable => Some("burstable"),
            QosClass::BestEffort => Some("besteffort"),
        };
        match self.driver {
            CgroupDriver::Cgroupfs => {
                let mut cgroup = self.parent.child(&self.root_name)?;
                if let Some(q) = qos_name {
                    cgroup = cgroup.child(q)?;
                }
                cgroup.child(&format!("pod{pod_uid}"))
            }
            CgroupDriver::Systemd => {
                // The kubelet escapes each component for systemd: '-' is its nesting separator.
                let root = systemd_escape(&self.root_name);
                let mut cgroup = self.parent.child(&format!("{root}.slice"))?;
                let mut prefix = root;
                if let Some(q) = qos_name {
                    prefix = format!("{prefix}-{q}");
                    cgroup = cgroup.child(&format!("{prefix}.slice"))?;
                }
                cgroup.child(&format!("{prefix}-pod{}.slice", systemd_escape(pod_uid)))
            }
        }
    }

    /// The container's cgroup: the pod's, then `<id>` (cgroupfs; `crio-<id>` for CRI-O) or
    /// `<scope prefix>-<id>.scope` (systemd).
    pub fn container_cgroup(
        &self,
        qos: QosClass,
        pod_uid: &str,
        container_id: &str,
    ) -> Result<ContainerCgroup, CgroupError> {
        check_name(container_id)?;
        let pod = self.pod_cgroup(qos, pod_uid)?;
        match self.driver {
            CgroupDriver::Cgroupfs => pod.child(&self.runtime.cgroupfs_name(container_id)),
            CgroupDriver::Systemd => pod.child(&format!("{}-{container_id}.scope", self.runtime.scope_prefix())),
        }
    }

    /// The container's cgroup wherever it exists in `hierarchy`, trying `qos` first and then the
    /// other two classes (a pod's QoS as weft computed it can differ from the kubelet's when the
    /// spec was read differently); `Ok(None)` when it exists under none.
    pub fn find_container(
        &self,
        hierarchy: &CgroupHierarchy,
        qos: QosClass,
        pod_uid: &str,
        container_id: &str,
    ) -> Result<Option<ContainerCgroup>, CgroupError> {
        let mut order = vec![qos];
        order.extend(
            [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort].into_iter().filter(|q| *q != qos),
        );
        for q in order {
            let cgroup = self.container_cgroup(q, pod_uid, container_id)?;
            if hierarchy.probe_dir(&cgroup).is_some_and(|d| d.is_dir()) {
                return Ok(Some(cgroup));
            }
        }
        Ok(None)
    }
}

/// A pod uid, container id or root name: non-empty ASCII letters, digits, `-`, `_`, `.`; not `.`
/// or `..`.
fn check_name(name: &str) -> Result<(), CgroupError> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(CgroupError::InvalidPath {
            path: name.to_owned(),
            why: "pod uids, container ids and root names are ASCII letters, digits, -, _ and .".to_owned(),
        })
    }
}

fn systemd_escape(name: &str) -> String {
    name.replace('-', "_")
}

/// One file write done by [`CgroupEnforcer::apply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileWrite {
    /// The file.
    pub file: PathBuf,
    /// What it held before (trimmed).
    pub previous: String,
    /// What was written.
    pub value: String,
}

/// What [`CgroupEnforcer::apply`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The writes, in order (including ancestors widened and descendants narrowed in v1).
    pub written: Vec<FileWrite>,
    /// Settings that this cgroup version cannot express (`memory_high` on v1), by field name.
    pub skipped: Vec<&'static str>,
}

impl Applied {
    /// Whether anything was written.
    pub fn changed(&self) -> bool {
        !self.written.is_empty()
    }
}

/// A container's values as the kernel holds them; `None` where the file is absent (controller not
/// mounted or enabled, or no such control in this version).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupValues {
    /// The version they were read from.
    pub version: CgroupVersion,
    /// `cpuset.cpus` (as configured, not the effective set).
    pub cpus: Option<CpuSet>,
    /// `cpuset.mems`.
    pub mems: Option<CpuSet>,
    /// CFS quota, µs; `-1` unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period, µs.
    pub cpu_period: Option<u64>,
    /// Memory limit, bytes; `-1` unlimited.
    pub memory_limit: Option<i64>,
    /// `memory.high` (v2), bytes; `-1` unlimited.
    pub memory_high: Option<i64>,
}

/// One setting whose value in the cgroup differs from what should be enforced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// The [`ContainerSettings`] field.
    pub field: &'static str,
    /// What should be there.
    pub want: String,
    /// What is there (`absent` when the file is missing).
    pub have: String,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: want {}, have {}", self.field, self.want, self.have)
    }
}

impl CgroupValues {
    /// The fields `want` sets (non-empty `cpus`/`mems`, `Some` numbers) whose values differ.
    /// Memory values match when the kernel's page rounding explains the difference;
    /// `memory_high` is not compared on v1, which has no such control.
    pub fn drift(&self, want: &ContainerSettings) -> Vec<Drift> {
        fn show<T: fmt::Display>(v: &Option<T>) -> String {
            v.as_ref().map_or_else(|| "absent".to_owned(), ToString::to_string)
        }
        let mut out = Vec::new();
        let mut check = |field, differs: bool, want: String, have: String| {
            if differs {
                out.push(Drift { field, want, have });
            }
        };
        if !want.cpus.is_empty() {
            check("cpus", self.cpus.as_ref() != Some(&want.cpus), want.cpus.to_string(), show(&self.cpus));
        }
        if !want.mems.is_empty() {
            check("mems", self.mems.as_ref() != Some(&want.mems), want.mems.to_string(), show(&self.mems));
        }
        if let Some(q) = want.cpu_quota {
            let q = if q < 0 { -1 } else { q };
            check("cpu_quota", self.cpu_quota != Some(q), q.to_string(), show(&self.cpu_quota));
        }
        if let Some(p) = want.cpu_period {
            check("cpu_period", self.cpu_period != Some(p), p.to_string(), show(&self.cpu_period));
        }
        if let Some(m) = want.memory_limit {
            let same = self.memory_limit.is_some_and(|have| memory_matches(m, have));
            check("memory_limit", !same, m.to_string(), show(&self.memory_limit));
        }
        if let Some(m) = want.memory_high
            && self.version == CgroupVersion::V2
        {
            let same = self.memory_high.is_some_and(|have| memory_matches(m, have));
            check("memory_high", !same, m.to_string(), show(&self.memory_high));
        }
        out
    }
}

/// Whether memory value `have` (read back) is `want` (written), allowing for page rounding.
fn memory_matches(want: i64, have: i64) -> bool {
    if want < 0 || have < 0 {
        return want < 0 && have < 0;
    }
    have == want || (have < want && want - have < MAX_PAGE_SIZE && have % 4096 == 0)
}

/// Enforces settings on a container cgroup. [`CgroupWriter`] is the real one; the bypass loop's
/// tests use a fake.
pub trait CgroupEnforcer: Send + Sync {
    /// Write `settings` (the fields it sets) into `cgroup`, in a safe order; on a failed write undo
    /// what this call wrote and return the error naming the file and value.
    fn apply(&self, cgroup: &ContainerCgroup, settings: &ContainerSettings) -> Result<Applied, CgroupError>;

    /// The values the kernel holds for `cgroup`.
    fn read(&self, cgroup: &ContainerCgroup) -> Result<CgroupValues, CgroupError>;

    /// What in `cgroup` differs from `settings` (see [`CgroupValues::drift`]).
    fn drift(&self, cgroup: &ContainerCgroup, settings: &ContainerSettings) -> Result<Vec<Drift>, CgroupError> {
        Ok(self.read(cgroup)?.drift(settings))
    }
}

/// Applies settings by writing cgroup files under a [`CgroupHierarchy`].
#[derive(Clone, Debug)]
pub struct CgroupWriter {
    hierarchy: CgroupHierarchy,
}

impl CgroupWriter {
    /// A writer for `hierarchy`.
    pub fn new(hierarchy: CgroupHierarchy) -> CgroupWriter {
        CgroupWriter { hierarchy }
    }

    /// A writer for the hierarchy detected at `root` ([`CgroupHierarchy::detect`]).
    pub fn detect(root: impl AsRef<Path>) -> Result<CgroupWriter, CgroupError> {
        CgroupHierarchy::detect(root).map(CgroupWriter::new)
    }

    /// The hierarchy written to.
    pub fn hierarchy(&self) -> &CgroupHierarchy {
        &self.hierarchy
    }

    /// The container's directory in `controller`'s hierarchy, which must exist.
    fn existing_dir(&self, controller: Controller, cgroup: &ContainerCgroup) -> Result<PathBuf, CgroupError> {
        let dir = self.hierarchy.dir(controller, cgroup)?;
        if dir.is_dir() { Ok(dir) } else { Err(CgroupError::NotFound { dir }) }
    }

    /// Plan the v1 writes (reads everything first, so executing only writes).
    fn plan_v1(&self, cgroup: &ContainerCgroup, s: &ContainerSettings, plan: &mut Plan) -> Result<(), CgroupError> {
        if s.cpu_quota.is_some() || s.cpu_period.is_some() {
            let dir = self.existing_dir(Controller::Cpu, cgroup)?;
            let (quota_file, period_file) = (dir.join("cpu.cfs_quota_us"), dir.join("cpu.cfs_period_us"));
            let (quota_raw, period_raw) = (read_trimmed(&quota_file)?, read_trimmed(&period_file)?);
            let old_quota = parse_quota(&quota_file, &quota_raw)?;
            let old_period: u64 = parse_num(&period_file, &period_raw)?;
            let new_quota = s.cpu_quota.map_or(old_quota, |q| if q < 0 { -1 } else { q });
            let new_period = s.cpu_period.unwrap_or(old_period);
            let quota_write = (new_quota != old_quota).then(|| Step::new(quota_file, quota_raw, new_quota.to_string()));
            let period_write =
                (new_period != old_period).then(|| Step::new(period_file, period_raw, new_period.to_string()));
            // Intermediate ratios: quota first gives new_q/old_p, period first gives old_q/new_p.
            // The smaller one is within any parent limit both end states are within.
            if quota_first(old_quota, old_period, new_quota, new_period) {
                plan.extend([quota_write, period_write].into_iter().flatten());
            } else {
                plan.extend([period_write, quota_write].into_iter().flatten());
            }
        }
        if let Some(limit) = s.memory_limit {
            let dir = self.existing_dir(Controller::Memory, cgroup)?;
            let file = dir.join("memory.limit_in_bytes");
            let raw = read_trimmed(&file)?;
            let have: i64 = parse_num(&file, &raw)?;
            let have = if have >= V1_UNLIMITED_FLOOR { -1 } else { have };
            if !memory_matches(limit, have) {
                plan.push(Step::new(file, raw, if limit < 0 { "-1".to_owned() } else { limit.to_string() }));
            }
        }
        if s.memory_high.is_some() {
            plan.skipped.push("memory_high");
        }
        for (want, name) in [(&s.cpus, "cpuset.cpus"), (&s.mems, "cpuset.mems")] {
            if want.is_empty() {
                continue;
            }
            let dir = self.existing_dir(Controller::Cpuset, cgroup)?;
            let Some(mount) = self.hierarchy.controller_root(Controller::Cpuset) else { continue };
            self.plan_v1_cpuset(mount, cgroup, &dir, name, want, plan)?;
        }
        Ok(())
    }

    /// One v1 cpuset file (`cpuset.cpus` or `cpuset.mems`) of the container, with the ancestor
    /// widening and descendant narrowing it needs.
    fn plan_v1_cpuset(
        &self,
        mount: &Path,
        cgroup: &ContainerCgroup,
        dir: &Path,
        name: &str,
        want: &CpuSet,
        plan: &mut Plan,
    ) -> Result<(), CgroupError> {
        let file = dir.join(name);
        let raw = read_trimmed(&file)?;
        let have = parse_set(&file, &raw)?;
        if &have == want {
            return Ok(());
        }
        // Growing beyond an ancestor: widen the ancestors that lack CPUs, top-down, provided the
        // hierarchy root has them all (otherwise no widening helps; the container's own write then
        // fails with the kernel's answer).
        let root_set = parse_set(&mount.join(name), &read_trimmed(&mount.join(name))?)?;
        if is_subset(want, &root_set) {
            for ancestor in cgroup.ancestors() {
                let afile = ancestor.dir_under(mount).join(name);
                let araw = read_trimmed(&afile)?;
                let aset = parse_set(&afile, &araw)?;
                if !is_subset(want, &aset) {
                    plan.push(Step::new(afile, araw, union(&aset, want).to_string()));
                }
            }
        }
        // Shrinking below descendants: narrow them first, deepest first.
        if !is_subset(&have, want) {
            let mut narrow = Vec::new();
            collect_narrowing(dir, name, want, 1, &mut narrow)?;
            plan.extend(narrow);
        }
        plan.push(Step::new(file, raw, want.to_string()));
        Ok(())
    }

    fn plan_v2(&self, cgroup: &ContainerCgroup, s: &ContainerSettings, plan: &mut Plan) -> Result<(), CgroupError> {
        let dir = self.existing_dir(Controller::Cpu, cgroup)?;
        if s.cpu_quota.is_some() || s.cpu_period.is_some() {
            let file = dir.join("cpu.max");
            let raw = read_trimmed(&file)?;
            let (old_quota, old_period) = parse_cpu_max(&file, &raw)?;
            let quota = s.cpu_quota.map_or(old_quota, |q| if q < 0 { -1 } else { q });
            let period = s.cpu_period.unwrap_or(old_period);
            if (quota, period) != (old_quota, old_period) {
                let quota_text = if quota < 0 { "max".to_owned() } else { quota.to_string() };
                plan.push(Step::new(file, raw, format!("{quota_text} {period}")));
            }
        }
        for (want, name) in [(s.memory_limit, "memory.max"), (s.memory_high, "memory.high")] {
            let Some(want) = want else { continue };
            let file = dir.join(name);
            let raw = read_trimmed(&file)?;
            let have = parse_memory_v2(&file, &raw)?;
            if !memory_matches(want, have) {
                plan.push(Step::new(file, raw, if want < 0 { "max".to_owned() } else { want.to_string() }));
            }
        }
        for (want, name) in [(&s.cpus, "cpuset.cpus"), (&s.mems, "cpuset.mems")] {
            if want.is_empty() {
                continue;
            }
            let file = dir.join(name);
            let raw = read_trimmed(&file)?;
            if &parse_set(&file, &raw)? != want {
                plan.push(Step::new(file, raw, want.to_string()));
            }
        }
        Ok(())
    }

    fn read_v1(&self, cgroup: &ContainerCgroup) -> Result<CgroupValues, CgroupError> {
        let mut values = empty_values(CgroupVersion::V1);
        let mut any = None;
        for controller in [Controller::Cpuset, Controller::Cpu, Controller::Memory] {
            if self.hierarchy.controller_root(controller).is_none() {
                continue;
            }
            let dir = self.existing_dir(controller, cgroup)?;
            any = Some(());
            match controller {
                Controller::Cpuset => {
                    values.cpus = read_optional(&dir.join("cpuset.cpus"), parse_set)?;
                    values.mems = read_optional(&dir.join("cpuset.mems"), parse_set)?;
                }
                Controller::Cpu => {
                    values.cpu_quota = read_optional(&dir.join("cpu.cfs_quota_us"), parse_quota)?;
                    values.cpu_period = read_optional(&dir.join("cpu.cfs_period_us"), parse_num)?;
                }
                Controller::Memory => {
                    values.memory_limit = read_optional(&dir.join("memory.limit_in_bytes"), |f, raw| {
                        let v: i64 = parse_num(f, raw)?;
                        Ok(if v >= V1_UNLIMITED_FLOOR { -1 } else { v })
                    })?;
                }
            }
        }
        match any {
            Some(()) => Ok(values),
            None => Err(CgroupError::NoHierarchy {
                root: self.hierarchy.root.clone(),
                why: "no cpuset, cpu or memory controller".to_owned(),
            }),
        }
    }

    fn read_v2(&self, cgroup: &ContainerCgroup) -> Result<CgroupValues, CgroupError> {
        let dir = self.existing_dir(Controller::Cpu, cgroup)?;
        let mut values = empty_values(CgroupVersion::V2);
        values.cpus = read_optional(&dir.join("cpuset.cpus"), parse_set)?;
        values.mems = read_optional(&dir.join("cpuset.mems"), parse_set)?;
        if let Some((quota, period)) = read_optional(&dir.join("cpu.max"), parse_cpu_max)? {
            values.cpu_quota = Some(quota);
            values.cpu_period = Some(period);
        }
        values.memory_limit = read_optional(&dir.join("memory.max"), parse_memory_v2)?;
        values.memory_high = read_optional(&dir.join("memory.high"), parse_memory_v2)?;
        Ok(values)
    }
}

impl CgroupEnforcer for CgroupWriter {
    fn apply(&self, cgroup: &ContainerCgroup, settings: &ContainerSettings) -> Result<Applied, CgroupError> {
        validate(settings)?;
        let mut plan = Plan::default();
        match self.hierarchy.version {
            CgroupVersion::V1 => self.plan_v1(cgroup, settings, &mut plan)?,
            CgroupVersion::V2 => self.plan_v2(cgroup, settings, &mut plan)?,
        }
        plan.execute()
    }

    fn read(&self, cgroup: &ContainerCgroup) -> Result<CgroupValues, CgroupError> {
        match self.hierarchy.version {
            CgroupVersion::V1 => self.read_v1(cgroup),
            CgroupVersion::V2 => self.read_v2(cgroup),
        }
    }
}

fn empty_values(version: CgroupVersion) -> CgroupValues {
    CgroupValues {
        version,
        cpus: None,
        mems: None,
        cpu_quota: None,
        cpu_period: None,
        memory_limit: None,
        memory_high: None,
    }
}

/// Settings the kernel would refuse in a way better reported before writing anything.
fn validate(s: &ContainerSettings) -> Result<(), CgroupError> {
    if let Some(q) = s.cpu_quota
        && (q == 0 || q < -1)
    {
        return Err(CgroupError::InvalidSettings { why: format!("cpu_quota {q}: must be positive or -1 (unlimited)") });
    }
    if s.cpu_period == Some(0) {
        return Err(CgroupError::InvalidSettings { why: "cpu_period 0".to_owned() });
    }
    for (field, value) in [("memory_limit", s.memory_limit), ("memory_high", s.memory_high)] {
        if let Some(v) = value
            && (v == 0 || v < -1)
        {
            return Err(CgroupError::InvalidSettings {
                why: format!("{field} {v}: must be positive or -1 (unlimited)"),
            });
        }
    }
    Ok(())
}

/// Whether, in v1, the CFS quota should be written before the period: true when
/// `new_q/old_p <= old_q/new_p`, i.e. `new_q*new_p <= old_q*old_p`, with `-1` as infinity.
fn quota_first(old_q: i64, old_p: u64, new_q: i64, new_p: u64) -> bool {
    match (u64::try_from(new_q), u64::try_from(old_q)) {
        (Err(_), _) => false,    // new unlimited: lengthen/shorten the period while still limited
        (Ok(_), Err(_)) => true, // old unlimited: limit first
        (Ok(nq), Ok(oq)) => u128::from(nq) * u128::from(new_p) <= u128::from(oq) * u128::from(old_p),
    }
}

/// Descendants of `dir` (depth `depth` and below) whose `name` set is not within `within`,
/// narrowed to what they hold of it (or all of it when they hold none), deepest first.
fn collect_narrowing(
    dir: &Path,
    name: &str,
    within: &CpuSet,
    depth: usize,
    out: &mut Vec<Step>,
) -> Result<(), CgroupError> {
    if depth > MAX_DESCENDANT_DEPTH {
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).map_err(|source| CgroupError::Read { file: dir.to_path_buf(), source })?;
    let mut children: Vec<PathBuf> =
        entries.filter_map(Result::ok).filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect();
    children.sort();
    for child in children {
        let file = child.join(name);
        let raw = read_trimmed(&file)?;
        let have = parse_set(&file, &raw)?;
        let target = if is_subset(&have, within) {
            have.clone()
        } else {
            let kept = intersection(&have, within);
            if kept.is_empty() { within.clone() } else { kept }
        };
        collect_narrowing(&child, name, &target, depth + 1, out)?;
        if target != have {
            out.push(Step::new(file, raw, target.to_string()));
        }
    }
    Ok(())
}

/// A planned write: what the file held, and what to put there.
#[derive(Clone, Debug)]
struct Step {
    file: PathBuf,
    previous: String,
    value: String,
}

impl Step {
    fn new(file: PathBuf, previous: String, value: String) -> Step {
        Step { file, previous, value }
    }
}

/// The writes of one `apply`, executed in order and rolled back in reverse on failure.
#[derive(Debug, Default)]
struct Plan {
    steps: Vec<Step>,
    skipped: Vec<&'static str>,
}

impl Plan {
    fn push(&mut self, step: Step) {
        self.steps.push(step);
    }

    fn extend(&mut self, steps: impl IntoIterator<Item = Step>) {
        self.steps.extend(steps);
    }

    fn execute(self) -> Result<Applied, CgroupError> {
        let mut done: Vec<Step> = Vec::with_capacity(self.steps.len());
        for step in self.steps {
            if let Err(source) = write_file(&step.file, &step.value) {
                let mut rollback_failures = Vec::new();
                for undo in done.iter().rev() {
                    if let Err(e) = write_file(&undo.file, &undo.previous) {
                        rollback_failures.push(format!("{} (back to {:?}): {e}", undo.file.display(), undo.previous));
                    }
                }
                // The directory vanished under us: the container is gone.
                if source.kind() == std::io::ErrorKind::NotFound
                    && let Some(dir) = step.file.parent()
                    && !dir.is_dir()
                {
                    return Err(CgroupError::NotFound { dir: dir.to_path_buf() });
                }
                return Err(CgroupError::Write {
                    file: step.file,
                    value: step.value,
                    source,
                    rolled_back: done.len() - rollback_failures.len(),
                    rollback_failures,
                });
            }
            done.push(step);
        }
        Ok(Applied {
            written: done
                .into_iter()
                .map(|s| FileWrite { file: s.file, previous: s.previous, value: s.value })
                .collect(),
            skipped: self.skipped,
        })
    }
}

/// Write `value` in one `write(2)` to an existing file (cgroup files are never created).
fn write_file(file: &Path, value: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(file)?;
    // An empty write does not reach the kernel's handler; a lone newline clears a cpuset.
    let bytes = if value.is_empty() { b"\n".as_slice() } else { value.as_bytes() };
    f.write_all(bytes)
}

fn read_trimmed(file: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(file)
        .map(|s| s.trim().to_owned())
        .map_err(|source| CgroupError::Read { file: file.to_path_buf(), source })
}

/// The file parsed, or `None` when it does not exist.
fn read_optional<T>(
    file: &Path,
    parse: impl Fn(&Path, &str) -> Result<T, CgroupError>,
) -> Result<Option<T>, CgroupError> {
    match std::fs::read_to_string(file) {
        Ok(raw) => parse(file, raw.trim()).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::Read { file: file.to_path_buf(), source }),
    }
}

fn parse_error(file: &Path, content: &str, why: impl Into<String>) -> CgroupError {
    CgroupError::Parse { file: file.to_path_buf(), content: content.chars().take(200).collect(), why: why.into() }
}

fn parse_num<T: std::str::FromStr>(file: &Path, raw: &str) -> Result<T, CgroupError> {
    raw.parse().map_err(|_| parse_error(file, raw, "expected a number"))
}

fn parse_quota(file: &Path, raw: &str) -> Result<i64, CgroupError> {
    let q: i64 = parse_num(file, raw)?;
    Ok(if q < 0 { -1 } else { q })
}

fn parse_set(file: &Path, raw: &str) -> Result<CpuSet, CgroupError> {
    raw.parse().map_err(|e| parse_error(file, raw, format!("expected a CPU list: {e}")))
}

/// `max 100000` / `50000 100000` → (quota or -1, period).
fn parse_cpu_max(file: &Path, raw: &str) -> Result<(i64, u64), CgroupError> {
    let mut parts = raw.split_whitespace();
    let (Some(quota), Some(period), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(parse_error(file, raw, "expected \"<quota|max> <period>\""));
    };
    let quota = if quota == "max" { -1 } else { parse_num(file, quota)? };
    Ok((quota, parse_num(file, period)?))
}

/// `max` → -1, else bytes.
fn parse_memory_v2(file: &Path, raw: &str) -> Result<i64, CgroupError> {
    if raw == "max" { Ok(-1) } else { parse_num(file, raw) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    #[test]
    fn cgroupfs_layout_follows_the_kubelet() {
        let l = CgroupLayout::new(CgroupDriver::Cgroupfs, ContainerRuntime::Containerd);
        let c = |q| l.container_cgroup(q, "1234-ab", "c0ffee").unwrap().to_string();
        assert_eq!(c(QosClass::Guaranteed), "/kubepods/pod1234-ab/c0ffee");
        assert_eq!(c(QosClass::Burstable), "/kubepods/burstable/pod1234-ab/c0ffee");
        assert_eq!(c(QosClass::BestEffort), "/kubepods/besteffort/pod1234-ab/c0ffee");
        let crio = CgroupLayout::new(CgroupDriver::Cgroupfs, ContainerRuntime::CriO);
        assert_eq!(crio.container_cgroup(QosClass::Guaranteed, "u", "c").unwrap().as_str(), "/kubepods/podu/crio-c");
        let private = CgroupLayout { parent: ContainerCgroup::new("/weft-test-1").unwrap(), ..l.clone() };
        assert_eq!(
            private.container_cgroup(QosClass::Guaranteed, "u", "c").unwrap().as_str(),
            "/weft-test-1/kubepods/podu/c"
        );
    }

    #[test]
    fn systemd_layout_follows_the_kubelet() {
        let l = CgroupLayout::new(CgroupDriver::Systemd, ContainerRuntime::Containerd);
        assert_eq!(
            l.container_cgroup(QosClass::Burstable, "12-34", "abc").unwrap().as_str(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice/cri-containerd-abc.scope"
        );
        assert_eq!(
            l.container_cgroup(QosClass::Guaranteed, "12-34", "abc").unwrap().as_str(),
            "/kubepods.slice/kubepods-pod12_34.slice/cri-containerd-abc.scope"
        );
        for (runtime, prefix) in [(ContainerRuntime::CriO, "crio"), (ContainerRuntime::Docker, "docker")] {
            let l = CgroupLayout::new(CgroupDriver::Systemd, runtime);
            assert_eq!(
                l.container_cgroup(QosClass::BestEffort, "u", "i").unwrap().as_str(),
                format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu.slice/{prefix}-i.scope")
            );
        }
    }

    #[test]
    fn bad_names_are_refused() {
        let l = CgroupLayout::new(CgroupDriver::Cgroupfs, ContainerRuntime::Containerd);
        for (uid, id) in [("..", "c"), ("u", ".."), ("u/v", "c"), ("u", "a/b"), ("", "c"), ("u", "")] {
            assert!(l.container_cgroup(QosClass::Burstable, uid, id).is_err(), "{uid:?} {id:?}");
        }
        for bad in ["kubepods", "/a//b", "/a/../b", "/a/./b", "/a\0"] {
            assert!(ContainerCgroup::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(ContainerCgroup::new("/a/b/").unwrap().as_str(), "/a/b");
    }

    #[test]
    fn nri_cgroups_paths_in_both_forms() {
        assert_eq!(
            ContainerCgroup::from_cgroups_path("/kubepods/burstable/podu/c").unwrap().as_str(),
            "/kubepods/burstable/podu/c"
        );
        assert_eq!(
            ContainerCgroup::from_cgroups_path("kubepods-burstable-pod12_34.slice:cri-containerd:abc")
                .unwrap()
                .as_str(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice/cri-containerd-abc.scope"
        );
        assert_eq!(ContainerCgroup::from_cgroups_path("-.slice:p:n").unwrap().as_str(), "/p-n.scope");
        assert_eq!(ContainerCgroup::from_cgroups_path("a.slice::n").unwrap().as_str(), "/a.slice/n.scope");
        assert_eq!(
            ContainerCgroup::from_cgroups_path("a-b.slice:p:c.slice").unwrap().as_str(),
            "/a.slice/a-b.slice/c.slice"
        );
        for bad in ["kubepods", "a:b", "a.slice:p:", "notslice:p:n", "a--b.slice:p:n", "a.slice:p:x/y", "a:b:c:d"] {
            assert!(ContainerCgroup::from_cgroups_path(bad).is_err(), "{bad:?}");
        }
        // The systemd layout and its NRI form agree.
        let l = CgroupLayout::new(CgroupDriver::Systemd, ContainerRuntime::CriO);
        assert_eq!(
            l.container_cgroup(QosClass::Burstable, "u-1", "i").unwrap(),
            ContainerCgroup::from_cgroups_path("kubepods-burstable-podu_1.slice:crio:i").unwrap()
        );
    }

    #[test]
    fn ancestors_and_parents() {
        let c = ContainerCgroup::new("/a/b/c").unwrap();
        let names: Vec<_> = c.ancestors().iter().map(|a| a.to_string()).collect();
        assert_eq!(names, ["/a", "/a/b"]);
        assert_eq!(ContainerCgroup::new("/").unwrap().parent(), None);
        assert_eq!(ContainerCgroup::new("/a").unwrap().parent().unwrap().as_str(), "/");
        assert_eq!(c.dir_under(Path::new("/m")), Path::new("/m/a/b/c"));
    }

    #[test]
    fn quota_order_keeps_the_intermediate_ratio_small() {
        // 1 CPU (50000/50000) to 2 CPUs (200000/100000): period first gives 0.5, quota first 4.
        assert!(!quota_first(50_000, 50_000, 200_000, 100_000));
        // 2 CPUs to 0.5 CPU with the same period: quota first.
        assert!(quota_first(200_000, 100_000, 50_000, 100_000));
        assert!(!quota_first(100_000, 100_000, -1, 50_000));
        assert!(quota_first(-1, 100_000, 50_000, 50_000));
    }

    #[test]
    fn drift_compares_what_the_settings_set() {
        let have = CgroupValues {
            version: CgroupVersion::V1,
            cpus: Some(set("0-1")),
            mems: Some(set("0")),
            cpu_quota: Some(-1),
            cpu_period: Some(100_000),
            memory_limit: Some(999_424), // 1_000_000 rounded down to pages
            memory_high: None,
        };
        assert!(have.drift(&ContainerSettings::default()).is_empty());
        let want = ContainerSettings {
            cpus: set("0-1"),
            memory_limit: Some(1_000_000),
            memory_high: Some(5), // not a v1 control
            ..ContainerSettings::default()
        };
        assert!(have.drift(&want).is_empty(), "{:?}", have.drift(&want));
        let want = ContainerSettings { cpus: set("1"), cpu_quota: Some(50_000), ..ContainerSettings::default() };
        let drift = have.drift(&want);
        assert_eq!(drift.len(), 2);
        assert_eq!(drift[0].to_string(), "cpus: want 1, have 0-1");
        assert_eq!(drift[1].to_string(), "cpu_quota: want 50000, have -1");
        let v2 = CgroupValues { version: CgroupVersion::V2, memory_high: None, ..have };
        let drift = v2.drift(&ContainerSettings { memory_high: Some(1 << 20), ..ContainerSettings::default() });
        assert_eq!(drift[0].to_string(), "memory_high: want 1048576, have absent");
    }

    #[test]
    fn memory_rounding_and_unlimited() {
        assert!(memory_matches(-1, -1));
        assert!(!memory_matches(-1, 4096));
        assert!(memory_matches(1_000_000, 999_424));
        assert!(!memory_matches(1_000_000, 1_003_520));
        assert!(!memory_matches(1 << 30, (1 << 30) - (1 << 20)));
    }

    #[test]
    fn settings_the_kernel_would_misread_are_refused_up_front() {
        for s in [
            ContainerSettings { cpu_quota: Some(0), ..Default::default() },
            ContainerSettings { cpu_quota: Some(-5), ..Default::default() },
            ContainerSettings { cpu_period: Some(0), ..Default::default() },
            ContainerSettings { memory_limit: Some(0), ..Default::default() },
        ] {
            assert!(matches!(validate(&s), Err(CgroupError::InvalidSettings { .. })), "{s:?}");
        }
    }

    #[test]
    fn detection_on_plain_directories() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(CgroupHierarchy::detect(dir.path()), Err(CgroupError::NoHierarchy { .. })));
        assert!(CgroupHierarchy::detect(dir.path().join("nope")).is_err());
        std::fs::create_dir(dir.path().join("cpu,cpuacct")).unwrap();
        std::fs::write(dir.path().join("cpu,cpuacct/cpu.shares"), "1024").unwrap();
        let h = CgroupHierarchy::detect(dir.path()).unwrap();
        assert_eq!(h.version(), CgroupVersion::V1);
        assert_eq!(h.controller_root(Controller::Cpu), Some(dir.path().join("cpu,cpuacct").as_path()));
        assert_eq!(h.controller_root(Controller::Cpuset), None);
        let c = ContainerCgroup::new("/x").unwrap();
        assert!(matches!(h.dir(Controller::Memory, &c), Err(CgroupError::NoController { controller: "memory", .. })));
        std::fs::write(dir.path().join("cgroup.controllers"), "cpuset cpu memory").unwrap();
        assert_eq!(CgroupVersion::detect(dir.path()).unwrap(), CgroupVersion::V2);
    }
}
