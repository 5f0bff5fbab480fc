//! Cgroup enforcement against this machine's real cgroup v1 hierarchy (`/sys/fs/cgroup/{cpuset,
//! cpu,memory}`; the tests run as root): each test builds a private tree
//! `/sys/fs/cgroup/<controller>/weft-test-<pid>-<n>/kubepods/…/<container>`, applies settings, reads
//! the files back from the kernel, and removes the tree (deepest first) when it ends, pass or fail.
//! The kernel's own refusals (a CPU that does not exist, a CFS period below 1 ms) drive the rollback
//! tests. A test skips (`weft_testkit::require`) only when there is no v1 hierarchy at all.
//!
//! Also the v2 file layout on plain files in a temporary directory, and v2 on a real cgroup2
//! mount: the whole hierarchy at `/sys/fs/cgroup` (a cgroup v2 node: Debian 12 and later) or the
//! controller-less one at `/sys/fs/cgroup/unified` (a hybrid host). This host has neither with
//! controllers, so those tests skip here (the allow-list names them) and run in Debian's kernel
//! under qemu (`scripts/vm-check.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{CONTROLLERS, TestTree, read, write};

use std::path::{Path, PathBuf};

use weft_agent::cgroup::{
    CgroupDriver, CgroupEnforcer, CgroupError, CgroupHierarchy, CgroupLayout, CgroupVersion, CgroupWriter,
    ContainerCgroup, ContainerRuntime, Controller, DEFAULT_CGROUP_ROOT,
};
use weft_agent::pod::QosClass;
use weft_agent::settings::ContainerSettings;
use weft_topology::CpuSet;

const UID: &str = "6f1c2a9e-7d3b-4c55-9e0f-123456789abc";
const CID: &str = "4d2b8f0c1a3e5f7d9b0c2e4f6a8b0d1c3e5f7a9b1d3f5a7c9e1b3d5f7a9c1e3f";

fn set(s: &str) -> CpuSet {
    s.parse().unwrap()
}

/// The real v1 hierarchy, or `None` (a skip through `weft_testkit::require`) when this machine
/// has none.
fn v1_hierarchy() -> Option<CgroupHierarchy> {
    let h = match CgroupHierarchy::detect(DEFAULT_CGROUP_ROOT) {
        Err(e) => Err(format!("a cgroup hierarchy at {DEFAULT_CGROUP_ROOT} ({e})")),
        Ok(h) if h.version() != CgroupVersion::V1 => {
            Err(format!("cgroup v1 at {DEFAULT_CGROUP_ROOT} (it is cgroup v2)"))
        }
        Ok(h) => match CONTROLLERS.iter().find(|c| h.controller_root(**c).is_none()) {
            Some(c) => Err(format!("the v1 controller {} mounted", c.name())),
            None => Ok(h),
        },
    };
    weft_testkit::require_ok(h)
}

/// A burstable containerd container with the cgroupfs driver in a fresh tree.
fn burstable_container(tree: &mut TestTree) -> ContainerCgroup {
    let layout = tree.layout(CgroupDriver::Cgroupfs, ContainerRuntime::Containerd);
    let cgroup = layout.container_cgroup(QosClass::Burstable, UID, CID).unwrap();
    assert_eq!(cgroup.as_str(), format!("{}/kubepods/burstable/pod{UID}/{CID}", tree.parent));
    tree.create(&cgroup);
    cgroup
}

fn files(tree: &TestTree, cgroup: &ContainerCgroup) -> (PathBuf, PathBuf, PathBuf) {
    (tree.dir(Controller::Cpuset, cgroup), tree.dir(Controller::Cpu, cgroup), tree.dir(Controller::Memory, cgroup))
}

#[test]
fn applies_settings_and_the_kernel_holds_them() {
    let Some(h) = v1_hierarchy() else { return };
    let mut tree = TestTree::new(h.clone());
    let cgroup = burstable_container(&mut tree);
    let (cpuset, cpu, memory) = files(&tree, &cgroup);
    let writer = CgroupWriter::new(h);
    let settings = ContainerSettings {
        cpus: set("1"),
        mems: set("0"),
        cpu_quota: Some(50_000),
        cpu_period: Some(100_000),
        memory_limit: Some(300_000_000), // not a page multiple: the kernel rounds it down
        memory_high: Some(1 << 28),      // no v1 control
        env: Vec::new(),
    };

    let applied = writer.apply(&cgroup, &settings).unwrap();
    let written: Vec<_> = applied.written.iter().map(|w| (w.file.clone(), w.value.as_str())).collect();
    assert_eq!(
        written,
        [
            (cpu.join("cpu.cfs_quota_us"), "50000"),
            (memory.join("memory.limit_in_bytes"), "300000000"),
            (cpuset.join("cpuset.cpus"), "1"),
        ],
        "the period already was 100000 and the memory nodes 0"
    );
    assert_eq!(applied.skipped, ["memory_high"]);
    assert_eq!(applied.written[0].previous, "-1");

    assert_eq!(read(&cpuset.join("cpuset.cpus")), "1");
    assert_eq!(read(&cpuset.join("cpuset.effective_cpus")), "1");
    assert_eq!(read(&cpuset.join("cpuset.mems")), "0");
    assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000");
    assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
    assert_eq!(read(&memory.join("memory.limit_in_bytes")), (300_000_000 / 4096 * 4096).to_string());

    let values = writer.read(&cgroup).unwrap();
    assert_eq!(values.version, CgroupVersion::V1);
    assert_eq!(values.cpus, Some(set("1")));
    assert_eq!(values.cpu_quota, Some(50_000));
    assert_eq!(values.memory_limit, Some(300_000_000 / 4096 * 4096));
    assert_eq!(values.memory_high, None);
    assert!(writer.drift(&cgroup, &settings).unwrap().is_empty());

    // Applying again writes nothing.
    assert!(!writer.apply(&cgroup, &settings).unwrap().changed());

    // Lifting the limits.
    let unlimited = ContainerSettings { cpu_quota: Some(-1), memory_limit: Some(-1), ..ContainerSettings::default() };
    assert_eq!(writer.apply(&cgroup, &unlimited).unwrap().written.len(), 2);
    assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "-1");
    assert!(read(&memory.join("memory.limit_in_bytes")).parse::<i64>().unwrap() > 1 << 62);
    assert!(writer.drift(&cgroup, &unlimited).unwrap().is_empty());
}

#[test]
fn drift_is_seen_after_someone_else_writes_and_reapplying_fixes_it() {
    let Some(h) = v1_hierarchy() else { return };
    let mut tree = TestTree::new(h.clone());
    let cgroup = burstable_container(&mut tree);
    let (cpuset, cpu, _) = files(&tree, &cgroup);
    let writer = CgroupWriter::new(h);
    let settings = ContainerSettings { cpus: set("0"), cpu_quota: Some(200_000), ..ContainerSettings::default() };
    writer.apply(&cgroup, &settings).unwrap();

    // The runtime (or a person) puts the container back on all CPUs and lifts its quota.
    write(&cpuset.join("cpuset.cpus"), "0-1");
    write(&cpu.join("cpu.cfs_quota_us"), "-1");
    let drift: Vec<String> = writer.drift(&cgroup, &settings).unwrap().iter().map(ToString::to_string).collect();
    assert_eq!(drift, ["cpus: want 0, have 0-1", "cpu_quota: want 200000, have -1"]);
    // Fields the settings leave alone are not compared.
    assert!(
        writer
            .drift(&cgroup, &ContainerSettings { mems: set("0"), ..ContainerSettings::default() })
            .unwrap()
            .is_empty()
    );

    assert_eq!(writer.apply(&cgroup, &settings).unwrap().written.len(), 2);
    assert!(writer.drift(&cgroup, &settings).unwrap().is_empty());
    assert_eq!(read(&cpuset.join("cpuset.cpus")), "0");
}

#[test]
fn a_cpu_that_does_not_exist_fails_names_the_file_and_rolls_back_the_rest() {
    let Some(h) = v1_hierarchy() else { return };
    let online = set(&read(&h.controller_root(Controller::Cpuset).unwrap().join("cpuset.cpus")));
    let missing = (0..1024).find(|c| !online.contains(*c)).unwrap();
    let mut tree = TestTree::new(h.clone());
    let cgroup = burstable_container(&mut tree);
    let (cpuset, cpu, memory) = files(&tree, &cgroup);
    let before = [
        read(&cpuset.join("cpuset.cpus")),
        read(&cpu.join("cpu.cfs_quota_us")),
        read(&memory.join("memory.limit_in_bytes")),
    ];
    let writer = CgroupWriter::new(h);
    let settings = ContainerSettings {
        cpus: [missing].into_iter().collect(),
        cpu_quota: Some(50_000),
        memory_limit: Some(1 << 28),
        ..ContainerSettings::default()
    };

    let err = writer.apply(&cgroup, &settings).unwrap_err();
    let text = err.to_string();
    match &err {
        CgroupError::Write { file, value, source, rolled_back, rollback_failures } => {
            assert_eq!(file, &cpuset.join("cpuset.cpus"));
            assert_eq!(value, &missing.to_string());
            // ERANGE for a CPU beyond the kernel's nr_cpu_ids (the case on a 2-CPU box), EINVAL
            // for one within it but not online.
            assert!(matches!(source.raw_os_error(), Some(22 | 34)), "EINVAL or ERANGE: {source}");
            assert_eq!(*rolled_back, 2, "the quota and the memory limit");
            assert!(rollback_failures.is_empty(), "{rollback_failures:?}");
        }
        other => panic!("expected a write error, got {other:?}"),
    }
    assert!(text.contains(&cpuset.join("cpuset.cpus").display().to_string()), "{text}");
    assert!(text.contains(&format!("{:?}", missing.to_string())) && text.contains("rolled back 2"), "{text}");
    assert!(!err.is_gone());
    let after = [
        read(&cpuset.join("cpuset.cpus")),
        read(&cpu.join("cpu.cfs_quota_us")),
        read(&memory.join("memory.limit_in_bytes")),
    ];
    assert_eq!(after, before);
}

#[test]
fn a_period_the_kernel_refuses_undoes_the_quota_written_before_it() {
    let Some(h) = v1_hierarchy() else { return };
    let mut tree = TestTree::new(h.clone());
    let cgroup = burstable_container(&mut tree);
    let (_, cpu, _) = files(&tree, &cgroup);
    let writer = CgroupWriter::new(h);
    writer
        .apply(
            &cgroup,
            &ContainerSettings { cpu_quota: Some(100_000), cpu_period: Some(100_000), ..Default::default() },
        )
        .unwrap();

    // Quota first (its intermediate ratio 2 is the smaller), then a period below the 1 ms minimum.
    let err = writer
        .apply(&cgroup, &ContainerSettings { cpu_quota: Some(200_000), cpu_period: Some(500), ..Default::default() })
        .unwrap_err();
    let CgroupError::Write { file, value, source, rolled_back, .. } = &err else { panic!("{err:?}") };
    assert_eq!(file, &cpu.join("cpu.cfs_period_us"));
    assert_eq!(value, "500");
    assert_eq!(source.raw_os_error(), Some(22), "{source}");
    assert_eq!(*rolled_back, 1);
    assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "100000");
    assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
}

#[test]
fn a_cpuset_growing_past_its_pod_widens_the_pod_first() {
    let Some(h) = v1_hierarchy() else { return };
    let online = set(&read(&h.controller_root(Controller::Cpuset).unwrap().join("cpuset.cpus")));
    if !weft_testkit::require(online.len() >= 2, format!("2 CPUs (has {online})")) {
        return;
    }
    let first: CpuSet = online.iter().take(1).collect();
    let mut tree = TestTree::new(h.clone());
    let cgroup = burstable_container(&mut tree);
    let pod = cgroup.parent().unwrap();
    let (pod_cpus, container_cpus) = (
        tree.dir(Controller::Cpuset, &pod).join("cpuset.cpus"),
        tree.dir(Controller::Cpuset, &cgroup).join("cpuset.cpus"),
    );
    // Narrow the container, then its pod, to one CPU.
    write(&container_cpus, &first.to_string());
    write(&pod_cpus, &first.to_string());
    // The kernel's rule this works around: the container cannot hold more than its pod.
    assert!(std::fs::write(&container_cpus, online.to_string()).is_err());

    let writer = CgroupWriter::new(h);
    let applied = writer.apply(&cgroup, &ContainerSettings { cpus: online.clone(), ..Default::default() }).unwrap();
    let written: Vec<_> = applied.written.iter().map(|w| (w.file.clone(), w.value.clone())).collect();
    assert_eq!(written, [(pod_cpus.clone(), online.to_string()), (container_cpus.clone(), online.to_string())]);
    assert_eq!(read(&pod_cpus), online.to_string());
    assert_eq!(read(&container_cpus), online.to_string());
}

#[test]
fn a_cpuset_shrinking_below_a_nested_cgroup_narrows_it_first_and_rollback_restores_both() {
    let Some(h) = v1_hierarchy() else { return };
    let online = set(&read(&h.controller_root(Controller::Cpuset).unwrap().join("cpuset.cpus")));
    if !weft_testkit::require(online.len() >= 2, format!("2 CPUs (has {online})")) {
        return;
    }
    let last: CpuSet = online.iter().last().into_iter().collect();
    let mut tree = TestTree::new(h.clone());
    let cgroup = burstable_container(&mut tree);
    let nested = cgroup.child("nested").unwrap();
    tree.create(&nested);
    let (container_cpus, nested_cpus) = (
        tree.dir(Controller::Cpuset, &cgroup).join("cpuset.cpus"),
        tree.dir(Controller::Cpuset, &nested).join("cpuset.cpus"),
    );
    assert_eq!(read(&nested_cpus), online.to_string());
    // The kernel's rule this works around: the container cannot shrink below its child.
    assert!(std::fs::write(&container_cpus, last.to_string()).is_err());

    let writer = CgroupWriter::new(h);
    // A memory node that does not exist fails after the CPUs were written: both come back.
    let bad_mems: CpuSet = [63].into_iter().collect();
    let err = writer
        .apply(&cgroup, &ContainerSettings { cpus: last.clone(), mems: bad_mems, ..Default::default() })
        .unwrap_err();
    let CgroupError::Write { file, rolled_back, rollback_failures, .. } = &err else { panic!("{err:?}") };
    assert!(file.ends_with("cpuset.mems"), "{err}");
    assert_eq!((*rolled_back, rollback_failures.len()), (2, 0), "{err}");
    assert_eq!(read(&container_cpus), online.to_string());
    assert_eq!(read(&nested_cpus), online.to_string());

    let applied = writer.apply(&cgroup, &ContainerSettings { cpus: last.clone(), ..Default::default() }).unwrap();
    let written: Vec<_> = applied.written.iter().map(|w| w.file.clone()).collect();
    assert_eq!(written, [nested_cpus.clone(), container_cpus.clone()]);
    assert_eq!(read(&nested_cpus), last.to_string());
    assert_eq!(read(&container_cpus), last.to_string());
}

#[test]
fn systemd_layout_paths_work_on_the_real_hierarchy() {
    let Some(h) = v1_hierarchy() else { return };
    let mut tree = TestTree::new(h.clone());
    let layout = tree.layout(CgroupDriver::Systemd, ContainerRuntime::CriO);
    let cgroup = layout.container_cgroup(QosClass::Guaranteed, UID, CID).unwrap();
    let uid_ = UID.replace('-', "_");
    assert_eq!(cgroup.as_str(), format!("{}/kubepods.slice/kubepods-pod{uid_}.slice/crio-{CID}.scope", tree.parent));
    tree.create(&cgroup);
    // Found even when asked under the wrong QoS class.
    assert_eq!(layout.find_container(&h, QosClass::Burstable, UID, CID).unwrap(), Some(cgroup.clone()));
    assert_eq!(layout.find_container(&h, QosClass::Burstable, UID, "0000").unwrap(), None);

    let writer = CgroupWriter::new(h);
    let settings = ContainerSettings { cpus: set("0"), memory_limit: Some(1 << 30), ..Default::default() };
    writer.apply(&cgroup, &settings).unwrap();
    assert_eq!(read(&tree.dir(Controller::Cpuset, &cgroup).join("cpuset.cpus")), "0");
    assert_eq!(read(&tree.dir(Controller::Memory, &cgroup).join("memory.limit_in_bytes")), (1u64 << 30).to_string());
    assert!(writer.drift(&cgroup, &settings).unwrap().is_empty());
}

#[test]
fn a_container_whose_cgroup_is_gone_is_reported_as_gone() {
    let Some(h) = v1_hierarchy() else { return };
    let tree = TestTree::new(h.clone());
    let layout = tree.layout(CgroupDriver::Cgroupfs, ContainerRuntime::Containerd);
    let cgroup = layout.container_cgroup(QosClass::BestEffort, UID, CID).unwrap();
    let writer = CgroupWriter::new(h);
    let err = writer.apply(&cgroup, &ContainerSettings { cpus: set("0"), ..Default::default() }).unwrap_err();
    assert!(err.is_gone(), "{err:?}");
    assert!(err.to_string().contains(cgroup.as_str().trim_start_matches('/')), "{err}");
    assert!(writer.read(&cgroup).unwrap_err().is_gone());
    // Settings that touch nothing do not need the cgroup.
    assert!(!writer.apply(&cgroup, &ContainerSettings::default()).unwrap().changed());
}

// ----- cgroup v2 -----

/// A v2 container directory of plain files with the kernel's defaults.
fn v2_files(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for (file, value) in [
        ("cpuset.cpus", ""),
        ("cpuset.mems", ""),
        ("cpu.max", "max 100000"),
        ("memory.max", "max"),
        ("memory.high", "max"),
    ] {
        write(&dir.join(file), &format!("{value}\n"));
    }
}

#[test]
fn v2_file_names_and_values_on_plain_files() {
    let root = tempfile::tempdir().unwrap();
    write(&root.path().join("cgroup.controllers"), "cpuset cpu io memory pids\n");
    let h = CgroupHierarchy::detect(root.path()).unwrap();
    assert_eq!(h.version(), CgroupVersion::V2);
    let layout = CgroupLayout::new(CgroupDriver::Systemd, ContainerRuntime::Containerd);
    let cgroup = layout.container_cgroup(QosClass::Burstable, UID, CID).unwrap();
    let dir = cgroup.dir_under(root.path());
    v2_files(&dir);
    let writer = CgroupWriter::new(h);
    let settings = ContainerSettings {
        cpus: set("2-3,6"),
        mems: set("0"),
        cpu_quota: Some(250_000),
        cpu_period: None,
        memory_limit: Some(1 << 30),
        memory_high: Some(900 << 20),
        env: Vec::new(),
    };
    let applied = writer.apply(&cgroup, &settings).unwrap();
    let written: Vec<_> =
        applied.written.iter().map(|w| (w.file.file_name().unwrap().to_str().unwrap(), w.value.as_str())).collect();
    assert_eq!(
        written,
        [
            ("cpu.max", "250000 100000"),
            ("memory.max", "1073741824"),
            ("memory.high", "943718400"),
            ("cpuset.cpus", "2-3,6"),
            ("cpuset.mems", "0"),
        ]
    );
    assert!(applied.skipped.is_empty());
    assert_eq!(read(&dir.join("cpu.max")), "250000 100000");
    assert_eq!(read(&dir.join("cpuset.cpus")), "2-3,6");
    let values = writer.read(&cgroup).unwrap();
    assert_eq!(
        (values.cpu_quota, values.cpu_period, values.memory_high),
        (Some(250_000), Some(100_000), Some(900 << 20))
    );
    assert!(writer.drift(&cgroup, &settings).unwrap().is_empty());
    assert!(!writer.apply(&cgroup, &settings).unwrap().changed());

    // Unlimited, and a new period keeping the quota.
    writer
        .apply(&cgroup, &ContainerSettings { cpu_quota: Some(-1), memory_limit: Some(-1), ..Default::default() })
        .unwrap();
    assert_eq!(read(&dir.join("cpu.max")), "max 100000");
    assert_eq!(read(&dir.join("memory.max")), "max");
    writer.apply(&cgroup, &ContainerSettings { cpu_period: Some(50_000), ..Default::default() }).unwrap();
    assert_eq!(read(&dir.join("cpu.max")), "max 50000");
}

#[test]
fn v2_a_failed_write_rolls_back_in_reverse() {
    let root = tempfile::tempdir().unwrap();
    let h = CgroupHierarchy::v2(root.path());
    let cgroup = ContainerCgroup::from_cgroups_path("kubepods-pod1.slice:cri-containerd:c1").unwrap();
    assert_eq!(cgroup.as_str(), "/kubepods.slice/kubepods-pod1.slice/cri-containerd-c1.scope");
    let dir = cgroup.dir_under(root.path());
    v2_files(&dir);
    let writer = CgroupWriter::new(h);

    // A file that cannot even be read fails before anything is written.
    std::fs::remove_file(dir.join("cpuset.cpus")).unwrap();
    std::fs::create_dir(dir.join("cpuset.cpus")).unwrap();
    let settings = ContainerSettings { cpu_quota: Some(10_000), cpus: set("1"), ..Default::default() };
    let err = writer.apply(&cgroup, &settings).unwrap_err();
    assert!(matches!(&err, CgroupError::Read { file, .. } if file.ends_with("cpuset.cpus")), "{err:?}");
    assert_eq!(read(&dir.join("cpu.max")), "max 100000");
    std::fs::remove_dir(dir.join("cpuset.cpus")).unwrap();
    write(&dir.join("cpuset.cpus"), "0-3\n");

    // cpuset.mems reads fine but refuses writes: a read-only sysfs file, which the kernel will not
    // open for writing even for root.
    let read_only = Path::new("/sys/devices/system/cpu/online");
    std::fs::remove_file(dir.join("cpuset.mems")).unwrap();
    std::os::unix::fs::symlink(read_only, dir.join("cpuset.mems")).unwrap();
    let settings = ContainerSettings {
        cpus: set("1"),
        mems: set("0"),
        cpu_quota: Some(10_000),
        memory_limit: Some(1 << 20),
        ..Default::default()
    };
    let err = writer.apply(&cgroup, &settings).unwrap_err();
    let CgroupError::Write { file, value, rolled_back, rollback_failures, .. } = &err else { panic!("{err:?}") };
    assert_eq!((file, value.as_str()), (&dir.join("cpuset.mems"), "0"));
    assert_eq!((*rolled_back, rollback_failures.len()), (3, 0), "{err}");
    assert_eq!(read(&dir.join("cpu.max")), "max 100000");
    assert_eq!(read(&dir.join("memory.max")), "max");
    assert_eq!(read(&dir.join("cpuset.cpus")), "0-3");
}

/// This machine's cgroup2 mount: `/sys/fs/cgroup` on a cgroup v2 node, else `/sys/fs/cgroup/unified`
/// on a hybrid host; or what is missing.
fn v2_mount() -> Result<(PathBuf, CgroupHierarchy), String> {
    let root = Path::new(DEFAULT_CGROUP_ROOT);
    let mut tried = Vec::new();
    for mount in [root.to_path_buf(), root.join("unified")] {
        match CgroupHierarchy::detect(&mount) {
            Ok(h) if h.version() == CgroupVersion::V2 => return Ok((mount, h)),
            other => tried.push(format!("{}: {other:?}", mount.display())),
        }
    }
    Err(format!("a cgroup2 mount at {DEFAULT_CGROUP_ROOT} or {DEFAULT_CGROUP_ROOT}/unified ({})", tried.join("; ")))
}

#[test]
fn v2_paths_on_the_real_unified_mount() {
    let Some((unified, h)) = weft_testkit::require_ok(v2_mount()) else { return };
    let parent = common::unique_root();
    let parent_dir = parent.dir_under(&unified);
    let made = std::fs::create_dir(&parent_dir)
        .map_err(|e| format!("a cgroup it can create under {} ({e})", unified.display()));
    if weft_testkit::require_ok(made).is_none() {
        return;
    }
    struct Cleanup(Vec<PathBuf>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for dir in self.0.iter().rev() {
                if let Err(e) = std::fs::remove_dir(dir) {
                    eprintln!("cleanup: rmdir {}: {e}", dir.display());
                }
            }
        }
    }
    let mut cleanup = Cleanup(vec![parent_dir]);
    let layout = CgroupLayout {
        parent: parent.clone(),
        ..CgroupLayout::new(CgroupDriver::Systemd, ContainerRuntime::Containerd)
    };
    let cgroup = layout.container_cgroup(QosClass::BestEffort, UID, CID).unwrap();
    for level in
        cgroup.ancestors().into_iter().chain([cgroup.clone()]).filter(|c| c.as_str().len() > parent.as_str().len())
    {
        let dir = level.dir_under(&unified);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        cleanup.0.push(dir);
    }
    let dir = cgroup.dir_under(&unified);
    assert!(dir.join("cgroup.procs").is_file(), "the kernel made {} a cgroup", dir.display());
    assert_eq!(layout.find_container(&h, QosClass::Guaranteed, UID, CID).unwrap(), Some(cgroup.clone()));

    let writer = CgroupWriter::new(h);
    // What this mount offers is read; controllers it lacks read as absent.
    let values = writer.read(&cgroup).unwrap();
    assert_eq!(values.version, CgroupVersion::V2);
    // Here (a hybrid host) cpuset is bound to v1, so the file is not there and applying says so.
    if !dir.join("cpuset.cpus").exists() {
        assert_eq!(values.cpus, None);
        let err = writer.apply(&cgroup, &ContainerSettings { cpus: set("0"), ..Default::default() }).unwrap_err();
        assert!(matches!(&err, CgroupError::Read { file, .. } if *file == dir.join("cpuset.cpus")), "{err:?}");
    }
    drop(cleanup);
    assert!(writer.read(&cgroup).unwrap_err().is_gone());
}

/// The controllers weft writes, as cgroup v2 names them in `cgroup.subtree_control`.
const V2_CONTROLLERS: [&str; 3] = ["cpu", "cpuset", "memory"];

/// Enforcement on a real cgroup v2 hierarchy with the cpu, cpuset and memory controllers (a v2
/// node, where kubelet and systemd enable them down to each pod): the settings land in `cpu.max`,
/// `memory.max`, `memory.high` and `cpuset.*`, the kernel holds them (page-rounded memory), and a
/// write the kernel refuses (CPUs that do not exist) rolls back the writes before it.
#[test]
fn v2_applies_settings_the_kernel_holds_them_and_rolls_back() {
    let Some((mount, h)) = weft_testkit::require_ok(v2_mount()) else { return };
    let enabled = std::fs::read_to_string(mount.join("cgroup.subtree_control")).unwrap_or_default();
    let has_all = V2_CONTROLLERS.iter().all(|c| enabled.split_whitespace().any(|e| e == *c));
    let need =
        format!("cpu, cpuset and memory enabled in {}/cgroup.subtree_control (has {enabled:?})", mount.display());
    if !weft_testkit::require(has_all, need) {
        return;
    }
    struct Cleanup(Vec<PathBuf>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for dir in self.0.iter().rev() {
                if let Err(e) = std::fs::remove_dir(dir) {
                    eprintln!("cleanup: rmdir {}: {e}", dir.display());
                }
            }
        }
    }
    let mut cleanup = Cleanup(Vec::new());
    let parent = common::unique_root();
    let layout = CgroupLayout {
        parent: parent.clone(),
        ..CgroupLayout::new(CgroupDriver::Cgroupfs, ContainerRuntime::Containerd)
    };
    let cgroup = layout.container_cgroup(QosClass::Burstable, UID, CID).unwrap();
    // Each level above the container hands the controllers down, as kubelet and systemd do.
    let levels: Vec<_> = cgroup.ancestors().into_iter().filter(|c| c.as_str().len() >= parent.as_str().len()).collect();
    for level in levels.iter().chain([&cgroup]) {
        let dir = level.dir_under(&mount);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        cleanup.0.push(dir.clone());
        if *level != cgroup {
            write(&dir.join("cgroup.subtree_control"), "+cpu +cpuset +memory");
        }
    }
    let dir = cgroup.dir_under(&mount);
    for file in ["cpu.max", "memory.max", "memory.high", "cpuset.cpus", "cpuset.mems"] {
        assert!(dir.join(file).is_file(), "the kernel gave {} its {file}", dir.display());
    }
    assert_eq!(read(&dir.join("cpu.max")), "max 100000");

    let writer = CgroupWriter::new(h);
    let settings = ContainerSettings {
        cpus: set("1"),
        mems: set("0"),
        cpu_quota: Some(50_000),
        cpu_period: Some(100_000),
        memory_limit: Some(300_000_000), // not a page multiple: the kernel rounds it down
        memory_high: Some(1 << 28),
        env: Vec::new(),
    };
    let applied = writer.apply(&cgroup, &settings).unwrap();
    let written: Vec<_> = applied.written.iter().map(|w| (w.file.clone(), w.value.as_str())).collect();
    assert_eq!(
        written,
        [
            (dir.join("cpu.max"), "50000 100000"),
            (dir.join("memory.max"), "300000000"),
            (dir.join("memory.high"), "268435456"),
            (dir.join("cpuset.cpus"), "1"),
            (dir.join("cpuset.mems"), "0"),
        ],
        "a new v2 cgroup's cpuset files are empty, so both are written"
    );
    assert!(applied.skipped.is_empty(), "v2 expresses every field: {:?}", applied.skipped);
    assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
    assert_eq!(read(&dir.join("memory.max")), (300_000_000 / 4096 * 4096).to_string());
    assert_eq!(read(&dir.join("memory.high")), (1u64 << 28).to_string());
    assert_eq!(read(&dir.join("cpuset.cpus")), "1");
    assert_eq!(read(&dir.join("cpuset.cpus.effective")), "1");
    assert_eq!(read(&dir.join("cpuset.mems")), "0");

    let values = writer.read(&cgroup).unwrap();
    assert_eq!(values.version, CgroupVersion::V2);
    assert_eq!((values.cpus, values.mems), (Some(set("1")), Some(set("0"))));
    assert_eq!((values.cpu_quota, values.cpu_period), (Some(50_000), Some(100_000)));
    assert_eq!(values.memory_limit, Some(300_000_000 / 4096 * 4096));
    assert_eq!(values.memory_high, Some(1 << 28));
    assert!(writer.drift(&cgroup, &settings).unwrap().is_empty());
    assert!(!writer.apply(&cgroup, &settings).unwrap().changed(), "applying again writes nothing");

    // CPUs this machine does not have: the kernel refuses cpuset.cpus, the last write, and the
    // quota and memory limit written before it come back.
    let bad = ContainerSettings {
        cpus: set("0-63"),
        cpu_quota: Some(20_000),
        memory_limit: Some(1 << 26),
        ..Default::default()
    };
    let err = writer.apply(&cgroup, &bad).unwrap_err();
    let CgroupError::Write { file, value, rolled_back, rollback_failures, .. } = &err else { panic!("{err:?}") };
    assert_eq!((file, value.as_str()), (&dir.join("cpuset.cpus"), "0-63"));
    assert_eq!((*rolled_back, rollback_failures.len()), (2, 0), "{err}");
    assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
    assert_eq!(read(&dir.join("memory.max")), (300_000_000 / 4096 * 4096).to_string());
    assert_eq!(read(&dir.join("cpuset.cpus")), "1");

    // Lifting the limits.
    let unlimited =
        ContainerSettings { cpu_quota: Some(-1), memory_limit: Some(-1), memory_high: Some(-1), ..Default::default() };
    assert_eq!(writer.apply(&cgroup, &unlimited).unwrap().written.len(), 3);
    assert_eq!(read(&dir.join("cpu.max")), "max 100000");
    assert_eq!(read(&dir.join("memory.max")), "max");
    assert_eq!(read(&dir.join("memory.high")), "max");
    drop(cleanup);
    assert!(writer.read(&cgroup).unwrap_err().is_gone());
}
