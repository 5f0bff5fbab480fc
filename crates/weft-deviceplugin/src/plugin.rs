//! The `DevicePlugin` service over a [`DeviceSource`]: the framework answers the kubelet's calls
//! container by container and checks what the source answers before the kubelet sees it.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::api;

/// The resource-specific half of a device plugin.
#[tonic::async_trait]
pub trait DeviceSource: Send + Sync + 'static {
    /// The extended resource the devices are counted under, e.g. `nvidia.com/gpu`.
    fn resource_name(&self) -> String;

    /// What the kubelet is told at registration and by GetDevicePluginOptions.
    fn options(&self) -> api::DevicePluginOptions;

    /// The devices now, and every change after: each value is sent whole on every ListAndWatch
    /// stream (a health change is a new value with that device's `health` changed).
    fn devices(&self) -> watch::Receiver<Vec<api::Device>>;

    /// The devices one container should get: `allocation_size` of `available_device_ids`,
    /// including every `must_include_device_ids`. Called only when [`Self::options`] offers it.
    async fn preferred_allocation(
        &self,
        request: &api::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, Status>;

    /// What one container needs to use `request.devices_ids`: environment, mounts, device nodes,
    /// annotations, CDI names.
    async fn allocate(&self, request: &api::ContainerAllocateRequest)
    -> Result<api::ContainerAllocateResponse, Status>;

    /// Work before a container starts; called only when [`Self::options`] asks for it.
    async fn pre_start_container(&self, _request: &api::PreStartContainerRequest) -> Result<(), Status> {
        Ok(())
    }
}

/// A device as ListAndWatch lists it: its ID, `Healthy` or `Unhealthy`, and its NUMA node when
/// known (the kubelet's Topology Manager reads it).
pub fn device(id: &str, healthy: bool, numa: Option<u32>) -> api::Device {
    api::Device {
        id: id.to_string(),
        health: if healthy { crate::HEALTHY } else { crate::UNHEALTHY }.to_string(),
        topology: numa.map(|n| api::TopologyInfo { nodes: vec![api::NumaNode { id: i64::from(n) }] }),
    }
}

/// Checks a preferred allocation against its request: the right number of distinct devices, all
/// from the available ones, every required one included. The error names what is wrong.
pub fn check_preferred(request: &api::ContainerPreferredAllocationRequest, answer: &[String]) -> Result<(), String> {
    let size = usize::try_from(request.allocation_size)
        .map_err(|_| format!("allocation size {} is negative", request.allocation_size))?;
    if answer.len() != size {
        return Err(format!("{} devices chosen, {size} asked for", answer.len()));
    }
    let available: HashSet<&str> = request.available_device_i_ds.iter().map(String::as_str).collect();
    let mut seen = HashSet::new();
    for id in answer {
        if !available.contains(id.as_str()) {
            return Err(format!("device '{id}' is not among the available ones"));
        }
        if !seen.insert(id.as_str()) {
            return Err(format!("device '{id}' chosen twice"));
        }
    }
    if let Some(missing) = request.must_include_device_i_ds.iter().find(|id| !seen.contains(id.as_str())) {
        return Err(format!("device '{missing}' must be included"));
    }
    Ok(())
}

/// The gRPC service of one plugin session; its ListAndWatch streams end when `stop` fires.
pub(crate) struct Service<S> {
    pub(crate) source: Arc<S>,
    pub(crate) stop: CancellationToken,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<S: DeviceSource> api::device_plugin_server::DevicePlugin for Service<S> {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(self.source.options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<api::Empty>) -> Result<Response<DeviceStream>, Status> {
        let updates = WatchStream::new(self.source.devices())
            .map(|devices| Ok(api::ListAndWatchResponse { devices }))
            .take_until(self.stop.clone().cancelled_owned());
        Ok(Response::new(Box::pin(updates)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        if !self.source.options().get_preferred_allocation_available {
            return Err(Status::unimplemented("this plugin offers no preferred allocation"));
        }
        let mut container_responses = Vec::new();
        for (i, container) in request.get_ref().container_requests.iter().enumerate() {
            let device_i_ds = self.source.preferred_allocation(container).await?;
            check_preferred(container, &device_i_ds).map_err(|e| {
                tracing::error!(resource = %self.source.resource_name(), container = i, "preferred allocation: {e}");
                Status::internal(format!("container request {i}: {e}"))
            })?;
            container_responses.push(api::ContainerPreferredAllocationResponse { device_i_ds });
        }
        Ok(Response::new(api::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for container in &request.get_ref().container_requests {
            container_responses.push(self.source.allocate(container).await?);
        }
        Ok(Response::new(api::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        self.source.pre_start_container(request.get_ref()).await?;
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
