//! Merging plugin answers the way containerd's NRI adaptation does: each field of a container
//! (and each keyed entry: an env variable, an annotation, a `unified` file) may be set by one
//! plugin only; a second plugin setting it fails the request with
//! `plugins "B" and "A" both tried to set <field>`. A key starting with `-` in env or
//! annotations removes the entry.

use std::collections::HashMap;

use weft_nri::api;

/// Who set which field of which container in one request.
#[derive(Default)]
pub(crate) struct Owners {
    owners: HashMap<(String, String), String>,
}

impl Owners {
    fn claim(&mut self, container: &str, field: String, plugin: &str) -> Result<(), String> {
        match self.owners.get(&(container.to_string(), field.clone())) {
            Some(other) if other != plugin => {
                Err(format!("plugins {plugin:?} and {other:?} both tried to set {field}"))
            }
            _ => {
                self.owners.insert((container.to_string(), field), plugin.to_string());
                Ok(())
            }
        }
    }

    fn clear(&mut self, container: &str, field: String) {
        self.owners.remove(&(container.to_string(), field));
    }
}

/// Folds `adj` (from `plugin`) into the merged adjustment `into` of container `ctr`.
pub(crate) fn adjust(
    owners: &mut Owners,
    ctr: &str,
    into: &mut api::ContainerAdjustment,
    adj: &api::ContainerAdjustment,
    plugin: &str,
) -> Result<(), String> {
    for (k, v) in &adj.annotations {
        if let Some(key) = k.strip_prefix('-') {
            into.annotations.remove(key);
            owners.clear(ctr, format!("Annotations {key}"));
            into.annotations.insert(k.clone(), String::new());
        } else {
            owners.claim(ctr, format!("Annotations {k}"), plugin)?;
            into.annotations.remove(&format!("-{k}"));
            into.annotations.insert(k.clone(), v.clone());
        }
    }
    for kv in &adj.env {
        if let Some(key) = kv.key.strip_prefix('-') {
            into.env.retain(|e| e.key != key);
            owners.clear(ctr, format!("Env {key}"));
            into.env.push(kv.clone());
        } else {
            owners.claim(ctr, format!("Env {}", kv.key), plugin)?;
            let removal = format!("-{}", kv.key);
            into.env.retain(|e| e.key != kv.key && e.key != removal);
            into.env.push(kv.clone());
        }
    }
    if !adj.args.is_empty() {
        owners.claim(ctr, "Args".into(), plugin)?;
        into.args = adj.args.clone();
    }
    if let Some(linux) = adj.linux.as_ref() {
        let target = into.linux.mut_or_insert_default();
        if let Some(res) = linux.resources.as_ref() {
            resources(owners, ctr, target.resources.mut_or_insert_default(), res, plugin)?;
        }
        if !linux.cgroups_path.is_empty() {
            owners.claim(ctr, "CgroupsPath".into(), plugin)?;
            target.cgroups_path = linux.cgroups_path.clone();
        }
    }
    Ok(())
}

/// Folds the resources `src` (from `plugin`) into `dst`, claiming every field set.
pub(crate) fn resources(
    owners: &mut Owners,
    ctr: &str,
    dst: &mut api::LinuxResources,
    src: &api::LinuxResources,
    plugin: &str,
) -> Result<(), String> {
    let mut claim = |field: &str| owners.claim(ctr, field.to_string(), plugin);
    if let Some(m) = src.memory.as_ref() {
        let d = dst.memory.mut_or_insert_default();
        macro_rules! opt {
            ($f:ident, $name:literal) => {
                if m.$f.is_some() {
                    claim($name)?;
                    d.$f = m.$f.clone();
                }
            };
        }
        opt!(limit, "MemLimit");
        opt!(reservation, "MemReservation");
        opt!(swap, "MemSwapLimit");
        opt!(kernel, "MemKernelLimit");
        opt!(kernel_tcp, "MemTCPLimit");
        opt!(swappiness, "MemSwappiness");
        opt!(disable_oom_killer, "MemDisableOomKiller");
        opt!(use_hierarchy, "MemUseHierarchy");
    }
    if let Some(c) = src.cpu.as_ref() {
        let d = dst.cpu.mut_or_insert_default();
        macro_rules! opt {
            ($f:ident, $name:literal) => {
                if c.$f.is_some() {
                    claim($name)?;
                    d.$f = c.$f.clone();
                }
            };
        }
        opt!(shares, "CPUShares");
        opt!(quota, "CPUQuota");
        opt!(period, "CPUPeriod");
        opt!(realtime_runtime, "CPURealtimeRuntime");
        opt!(realtime_period, "CPURealtimePeriod");
        if !c.cpus.is_empty() {
            claim("CPUSetCPUs")?;
            d.cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            claim("CPUSetMems")?;
            d.mems = c.mems.clone();
        }
    }
    for h in &src.hugepage_limits {
        claim(&format!("HugepageLimits {}", h.page_size))?;
        dst.hugepage_limits.retain(|x| x.page_size != h.page_size);
        dst.hugepage_limits.push(h.clone());
    }
    for (k, v) in &src.unified {
        claim(&format!("CgroupsUnified {k}"))?;
        dst.unified.insert(k.clone(), v.clone());
    }
    if src.blockio_class.is_some() {
        claim("BlockioClass")?;
        dst.blockio_class = src.blockio_class.clone();
    }
    if src.rdt_class.is_some() {
        claim("RdtClass")?;
        dst.rdt_class = src.rdt_class.clone();
    }
    if src.pids.is_some() {
        claim("PidsLimit")?;
        dst.pids = src.pids.clone();
    }
    Ok(())
}

/// Sets on `dst` every resource field `src` sets (no ownership: applying a final result).
pub(crate) fn apply_resources(dst: &mut api::LinuxResources, src: &api::LinuxResources) {
    let mut scratch = Owners::default();
    // A fresh owner table never conflicts.
    let _ = resources(&mut scratch, "", dst, src, "");
}

/// Applies a merged adjustment to a container being created.
pub(crate) fn apply_adjustment(ctr: &mut api::Container, adj: &api::ContainerAdjustment) {
    for (k, v) in &adj.annotations {
        match k.strip_prefix('-') {
            Some(key) => {
                ctr.annotations.remove(key);
            }
            None => {
                ctr.annotations.insert(k.clone(), v.clone());
            }
        }
    }
    for kv in &adj.env {
        let key = kv.key.strip_prefix('-').unwrap_or(&kv.key);
        ctr.env.retain(|e| e.split_once('=').map(|(k, _)| k).unwrap_or(e) != key);
        if !kv.key.starts_with('-') {
            ctr.env.push(format!("{}={}", kv.key, kv.value));
        }
    }
    if !adj.args.is_empty() {
        ctr.args = adj.args.clone();
    }
    if let Some(linux) = adj.linux.as_ref() {
        let target = ctr.linux.mut_or_insert_default();
        if let Some(res) = linux.resources.as_ref() {
            apply_resources(target.resources.mut_or_insert_default(), res);
        }
        if !linux.cgroups_path.is_empty() {
            target.cgroups_path = linux.cgroups_path.clone();
        }
    }
}

/// Merged updates of several containers in one request.
#[derive(Default)]
pub(crate) struct Updates {
    pub(crate) order: Vec<String>,
    pub(crate) by_id: HashMap<String, api::ContainerUpdate>,
}

impl Updates {
    /// Folds `u` (from `plugin`) in.
    pub(crate) fn add(&mut self, owners: &mut Owners, u: &api::ContainerUpdate, plugin: &str) -> Result<(), String> {
        let id = u.container_id.clone();
        let entry = self.by_id.entry(id.clone()).or_insert_with(|| {
            self.order.push(id.clone());
            let mut n = api::ContainerUpdate::new();
            n.container_id = id.clone();
            n.ignore_failure = u.ignore_failure;
            n
        });
        entry.ignore_failure &= u.ignore_failure;
        if let Some(res) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
            let dst = entry.linux.mut_or_insert_default().resources.mut_or_insert_default();
            resources(owners, &id, dst, res, plugin)?;
        }
        Ok(())
    }

    /// The merged updates in first-seen order.
    pub(crate) fn into_vec(mut self) -> Vec<api::ContainerUpdate> {
        self.order.iter().filter_map(|id| self.by_id.remove(id)).collect()
    }
}

/// The resources of `ctr`, created if absent.
pub(crate) fn container_resources(ctr: &mut api::Container) -> &mut api::LinuxResources {
    ctr.linux.mut_or_insert_default().resources.mut_or_insert_default()
}
