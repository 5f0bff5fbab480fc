//! What the agent's benches share: the kubelet's pod list in memory, and a node without devices.

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
