//! Bypass mode: no runtime hook. Every period the agent lists the kubelet's pods, admits new ones,
//! releases gone ones, and writes each running container's cgroup files itself (cgroup v1 or v2,
//! cgroupfs or systemd driver), rewriting only files that drifted from what the container should
//! have. As Katalyst's bypass mode, it is asynchronous: a container runs with the runtime's
//! settings until the next pass, and environment variables cannot be injected.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::agent::{Manager, PodMeta};
use crate::cgroup::{CgroupEnforcer, CgroupHierarchy, CgroupLayout};
use crate::kubelet::{KubeletError, PodSource, container_status};
use crate::pod::PodSpec;

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Pods admitted.
    pub admitted: Vec<String>,
    /// Pods released.
    pub released: Vec<String>,
    /// Pods that could not be admitted, with the reason (they run unmanaged in the shared pool).
    pub refused: Vec<(String, String)>,
    /// Containers whose cgroup files were rewritten.
    pub enforced: Vec<String>,
    /// Containers weft could not enforce, with the reason.
    pub failed: Vec<(String, String)>,
}

/// Whether a pod still holds resources: not Succeeded or Failed (Katalyst's `PodIsActive`).
pub fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded") | Some("Failed"))
}

fn meta_of(pod: &Pod) -> Option<PodMeta> {
    let m = &pod.metadata;
    Some(PodMeta {
        uid: m.uid.clone()?,
        namespace: m.namespace.clone().unwrap_or_default(),
        name: m.name.clone().unwrap_or_default(),
        annotations: m.annotations.clone().unwrap_or_default(),
    })
}

/// The bypass enforcer.
pub struct Bypass {
    manager: Arc<Manager>,
    source: Arc<dyn PodSource>,
    hierarchy: CgroupHierarchy,
    layout: CgroupLayout,
    enforcer: Arc<dyn CgroupEnforcer>,
}

impl Bypass {
    /// Bypass over `manager`, reading pods from `source` and writing through `enforcer` into
    /// `hierarchy` laid out as `layout`.
    pub fn new(
        manager: Arc<Manager>,
        source: Arc<dyn PodSource>,
        hierarchy: CgroupHierarchy,
        layout: CgroupLayout,
        enforcer: Arc<dyn CgroupEnforcer>,
    ) -> Bypass {
        Bypass { manager, source, hierarchy, layout, enforcer }
    }

    /// One pass: list, admit/release, enforce. Fails only when the kubelet cannot be listed
    /// (nothing is released on a failed list).
    pub async fn pass(&self) -> Result<Pass, KubeletError> {
        let pods = self.source.pods().await?;
        let active: Vec<&Pod> = pods.iter().filter(|p| is_active(p)).collect();
        self.manager.catalog().replace(&pods);
        let live: Vec<PodMeta> = active.iter().filter_map(|p| meta_of(p)).collect();
        let resync = self.manager.resync(&live, &[]).await;
        let mut out =
            Pass { admitted: resync.admitted, released: resync.released, refused: resync.refused, ..Pass::default() };
        for pod in active {
            let Some(meta) = meta_of(pod) else { continue };
            // A pod that could not be admitted runs unmanaged but in the shared pool: only its
            // cpuset is written, so it stays off every exclusive CPU (`Manager::wanted`).
            let spec = match PodSpec::from_pod(pod) {
                Ok(s) => s,
                Err(e) => {
                    out.failed.push((meta.uid.clone(), e.to_string()));
                    continue;
                }
            };
            for c in &spec.containers {
                let Some(status) = container_status(pod, &c.name) else { continue };
                if !status.running {
                    continue;
                }
                let who = format!("{}/{}/{}", spec.namespace, spec.name, c.name);
                let want = self.manager.wanted(&spec.uid, &c.name);
                let cgroup = match self.layout.find_container(&self.hierarchy, spec.qos, &spec.uid, &status.id) {
                    Ok(Some(cg)) => cg,
                    Ok(None) => {
                        out.failed.push((
                            who,
                            format!("no cgroup for container {} under {}", status.id, self.hierarchy.root().display()),
                        ));
                        continue;
                    }
                    Err(e) => {
                        out.failed.push((who, e.to_string()));
                        continue;
                    }
                };
                match self.enforcer.drift(&cgroup, &want) {
                    Ok(d) if d.is_empty() => {}
                    Ok(d) => {
                        let what: Vec<String> = d.iter().map(ToString::to_string).collect();
                        match self.enforcer.apply(&cgroup, &want) {
                            Ok(_) => {
                                tracing::info!(container = %who, drift = %what.join("; "), "cgroup enforced");
                                out.enforced.push(who);
                            }
                            Err(e) if e.is_gone() => {}
                            Err(e) => out.failed.push((who, e.to_string())),
                        }
                    }
                    Err(e) if e.is_gone() => {}
                    Err(e) => out.failed.push((who, e.to_string())),
                }
            }
        }
        for (who, why) in &out.failed {
            tracing::warn!(container = %who, reason = %why, "bypass: not enforced");
        }
        Ok(out)
    }
}
