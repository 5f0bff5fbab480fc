//! The kubelet's PodResources API (`v1`, `List`): which devices each container of each pod on the
//! node really holds. A device plugin learns from its own calls only which devices were handed
//! out, never to whom (the kubelet's calls carry no pod identity); `List` is where the kubelet says
//! it, and it survives restarts of the plugin (the kubelet checkpoints its assignments).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use tonic::transport::Channel;

use crate::server::unix_channel;

/// The generated messages and the `PodResourcesLister` client and server.
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod api {
    tonic::include_proto!("v1");
}

/// Where the kubelet serves the API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// `namespace/name` of a pod and one of its containers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerKey {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
}

/// The devices of `resource` each container holds, by container; containers holding none of it
/// are left out.
pub fn devices_of(pods: &[api::PodResources], resource: &str) -> BTreeMap<ContainerKey, Vec<String>> {
    let mut held = BTreeMap::new();
    for pod in pods {
        for container in &pod.containers {
            let ids: Vec<String> = container
                .devices
                .iter()
                .filter(|d| d.resource_name == resource)
                .flat_map(|d| d.device_ids.iter().cloned())
                .collect();
            if !ids.is_empty() {
                let key = ContainerKey {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container.name.clone(),
                };
                held.insert(key, ids);
            }
        }
    }
    held
}

/// What the kubelet says each container holds: PodResources `List` in production
/// ([`PodResourcesClient`]), a fake in tests.
#[async_trait::async_trait]
pub trait AssignedDevices: Send + Sync + 'static {
    /// The kubelet's PodResources list.
    async fn list(&self) -> Result<Vec<api::PodResources>, String>;
}

#[async_trait::async_trait]
impl AssignedDevices for PodResourcesClient {
    async fn list(&self) -> Result<Vec<api::PodResources>, String> {
        PodResourcesClient::list(self).await
    }
}

/// The kubelet's PodResources API on its unix socket: one connection, made on first use and
/// dialled afresh after a failed call (a restarted kubelet serves a new socket).
pub struct PodResourcesClient {
    socket: PathBuf,
    channel: Mutex<Option<Channel>>,
}

impl PodResourcesClient {
    /// A client for the socket at `socket` (nothing is dialled yet).
    pub fn new(socket: impl Into<PathBuf>) -> PodResourcesClient {
        PodResourcesClient { socket: socket.into(), channel: Mutex::new(None) }
    }

    /// The socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Calls `List`, on a fresh connection once more if the kept one fails. The error names the
    /// socket.
    pub async fn list(&self) -> Result<Vec<api::PodResources>, String> {
        let kept = self.channel.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(channel) = kept
            && let Ok(pods) = self.list_on(channel).await
        {
            return Ok(pods);
        }
        let socket = self.socket.display();
        let channel = unix_channel(&self.socket).await.map_err(|e| format!("PodResources socket {socket}: {e}"))?;
        *self.channel.lock().unwrap_or_else(PoisonError::into_inner) = Some(channel.clone());
        self.list_on(channel).await.map_err(|s| format!("PodResources List on {socket}: {}", s.message()))
    }

    async fn list_on(&self, channel: Channel) -> Result<Vec<api::PodResources>, tonic::Status> {
        let reply = api::pod_resources_lister_client::PodResourcesListerClient::new(channel)
            .list(api::ListPodResourcesRequest {})
            .await?;
        Ok(reply.into_inner().pod_resources)
    }
}
