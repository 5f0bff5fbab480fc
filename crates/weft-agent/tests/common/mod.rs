//! Shared by the tests that write this machine's real cgroup v1 hierarchy: a private tree per test,
//! created the way runc creates cgroups and removed deepest first when the test ends, pass or fail.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use weft_agent::cgroup::{CgroupDriver, CgroupHierarchy, CgroupLayout, ContainerCgroup, ContainerRuntime, Controller};

/// The controllers weft writes.
pub const CONTROLLERS: [Controller; 3] = [Controller::Cpuset, Controller::Cpu, Controller::Memory];

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A fresh `/weft-test-<pid>-<n>` cgroup name (unique within this test process).
pub fn unique_root() -> ContainerCgroup {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    ContainerCgroup::new(&format!("/weft-test-{}-{n}", std::process::id())).unwrap()
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_owned()
}

pub fn write(path: &Path, value: &str) {
    std::fs::write(path, value).unwrap_or_else(|e| panic!("writing {value:?} to {}: {e}", path.display()));
}

/// A private cgroup tree in every controller, removed deepest first on drop.
pub struct TestTree {
    pub hierarchy: CgroupHierarchy,
    /// `/weft-test-<pid>-<n>`: the kubelet `--cgroup-root` of this test's layouts.
    pub parent: ContainerCgroup,
    created: Vec<PathBuf>,
}

impl TestTree {
    pub fn new(hierarchy: CgroupHierarchy) -> TestTree {
        let parent = unique_root();
        TestTree { hierarchy, parent, created: Vec::new() }
    }

    pub fn layout(&self, driver: CgroupDriver, runtime: ContainerRuntime) -> CgroupLayout {
        CgroupLayout { parent: self.parent.clone(), ..CgroupLayout::new(driver, runtime) }
    }

    pub fn dir(&self, controller: Controller, cgroup: &ContainerCgroup) -> PathBuf {
        self.hierarchy.dir(controller, cgroup).unwrap()
    }

    /// Create `cgroup` and its missing ancestors in every controller, the way runc does: a new v1
    /// cpuset starts empty, so it gets its parent's CPUs and memory nodes before going deeper.
    pub fn create(&mut self, cgroup: &ContainerCgroup) {
        let mut chain = cgroup.ancestors();
        chain.push(cgroup.clone());
        for controller in CONTROLLERS {
            for level in &chain {
                let dir = self.dir(controller, level);
                if dir.is_dir() {
                    continue;
                }
                std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
                self.created.push(dir.clone());
                if controller == Controller::Cpuset {
                    let parent = dir.parent().unwrap();
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        write(&dir.join(file), &read(&parent.join(file)));
                    }
                }
            }
        }
    }
}

impl Drop for TestTree {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            if let Err(e) = std::fs::remove_dir(dir) {
                eprintln!("cleanup: rmdir {}: {e}", dir.display());
            }
        }
    }
}
