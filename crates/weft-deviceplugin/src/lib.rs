//! weft-deviceplugin: a framework for kubelet device plugins (API `v1beta1`, gRPC over unix
//! sockets), so every device kind weft serves (GPUs now, SR-IOV VFs next) shares one lifecycle:
//!
//! - the plugin's own socket in the device-plugin directory, serving `DevicePlugin`
//!   (GetDevicePluginOptions, ListAndWatch, GetPreferredAllocation, Allocate, PreStartContainer);
//! - registration with the kubelet on `kubelet.sock`, retried until it is accepted;
//! - re-registration when the kubelet restarts (it deletes the plugin sockets and creates a new
//!   `kubelet.sock`): the plugin serves a fresh socket and registers again;
//! - an orderly stop that ends the ListAndWatch streams and removes the socket.
//!
//! The resource-specific part is the [`DeviceSource`] trait: the devices and their health, the
//! preferred allocation and what a container gets. [`serve`] runs the rest.
//!
//! What every weft device plugin shares beyond the kubelet's protocol: the pod [`handshake`] (which
//! pod a call is for), the [`accounting`] of what was handed out to which container, the kubelet's
//! [`podresources`], and the [`writeback`] of what each pod really got to its annotation.
//!
//! The message and service definitions are weft's own (`proto/deviceplugin_v1beta1.proto`), written
//! from the API's published field numbers and compiled with protox, so no protoc is needed.

pub mod accounting;
pub mod handshake;
pub mod plugin;
pub mod podresources;
pub mod server;
pub mod writeback;

/// The generated messages, the `DevicePlugin` server and the `Registration` client (and the other
/// halves, which the test kubelet uses).
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

/// The API version a plugin registers with.
pub const API_VERSION: &str = "v1beta1";
/// Where the kubelet looks for device plugins.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's registration socket, inside the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// A device the kubelet may hand out.
pub const HEALTHY: &str = "Healthy";
/// A device the kubelet must not hand out.
pub const UNHEALTHY: &str = "Unhealthy";

pub use plugin::{DeviceSource, check_preferred, device};
pub use server::{PluginError, PluginOptions, serve};
