//! What the agent's benches share: the kubelet's pod list in memory, a node without devices, and
//! the pods, sandboxes and containers they start.

use std::sync::Mutex;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use weft_agent::kubelet::{KubeletError, PodSource};
use weft_agent::pod::DeviceLocator;

/// The kubelet's pod list, in memory; the bench adds pods as it starts them.
#[derive(Default)]
pub struct Pods(pub Mutex<Vec<Pod>>);

#[async_trait]
impl PodSource for Pods {
    async fn pods(&self) -> Result<Vec<Pod>, KubeletError> {
        Ok(self.0.lock().unwrap().clone())
    }
}

/// No devices on this node.
pub struct NoDevices;

impl DeviceLocator for NoDevices {
    fn gpu_numa(&self, _index: u32) -> Option<u32> {
        None
    }
    fn pci_numa(&self, _address: &str) -> Option<u32> {
        None
    }
    fn pci_rdma_device(&self, _address: &str) -> Option<String> {
        None
    }
}

/// A pod of one container in `bench`: Guaranteed (`cpu` requested and limited) or Burstable (`cpu`
/// requested, no CPU limit), 256Mi.
pub fn k8s_pod(uid: &str, cpu: &str, guaranteed: bool) -> k8s_openapi::api::core::v1::Pod {
    let mem = "256Mi";
    let resources = if guaranteed {
        serde_json::json!({"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}})
    } else {
        serde_json::json!({"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"uid": uid, "namespace": "bench", "name": uid},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

/// Pod `uid`'s sandbox, `sb-<uid>`.
pub fn sandbox(uid: &str) -> weft_nri::api::PodSandbox {
    let mut p = weft_nri::api::PodSandbox::new();
    p.id = format!("sb-{uid}");
    p.uid = uid.to_string();
    p.name = uid.to_string();
    p.namespace = "bench".to_string();
    p
}

/// Container `id` of pod `uid`'s sandbox.
pub fn container(uid: &str, id: &str) -> weft_nri::api::Container {
    let mut c = weft_nri::api::Container::new();
    c.id = id.to_string();
    c.pod_sandbox_id = format!("sb-{uid}");
    c.name = "main".to_string();
    c
}
