//! dranet's profile provider, served by `weft controller`: addresses from a NumaNetwork's
//! `ipRange` for NICs that dranet (`dra.net`) prepares.
//!
//! dranet has no IPAM of its own; with `--profile-provider=webhook --webhook-url=<url>` it asks a
//! "bring your own provider" webhook (dranet `pkg/cloudprovider/webhook`) to resolve the claim's
//! `profile`. The NumaNetwork controller writes `{"profile": "weft.io/<network>"}` into the
//! templates of networks whose DeviceClass is dranet's, and this server answers for those
//! profiles, handing out addresses through the same cluster-wide [`network_address`] objects as
//! weft's own NIC driver, so both drivers share one view of each range.
//!
//! The contract (JSON over HTTP, dranet's names):
//! - `GET /health` → `{"cloudProvider": false, "profileProvider": true}`.
//! - `POST /GetProfileConfig` with `{"device": {"name", "pci_address", "mac_address"},
//!   "claim_uid", "config": {"profile", "interface": {...}, ...}}` → a NetworkConfig
//!   `{"interface": {"addresses": ["<ip>/<prefix>"]}}`. Idempotent per (claim, device): a retry
//!   gets the same address. Status codes as dranet documents them: 400 malformed request or an
//!   invalid network, 404 a profile that is not `weft.io/<network>` or a network that does not
//!   exist, 409 no free address (the range is exhausted), 500 an API error (dranet fails the
//!   prepare and the kubelet retries).
//! - `POST /ReleaseProfileConfig`, same body → 200 once the claim's addresses are given back (also
//!   when it held none). dranet does not retry a failed release; addresses whose claim is gone
//!   are collected by the NumaNetwork controller.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::NumaNetwork;
use crate::network_address::{self, AddressClaim, AddressError, AddressRequest};
use crate::numanetwork::Cidr;
use crate::numanetwork_controller::PROFILE_PREFIX;

/// Path of the health (capabilities) endpoint.
pub const PATH_HEALTH: &str = "/health";
/// Path of the allocation endpoint.
pub const PATH_GET_PROFILE_CONFIG: &str = "/GetProfileConfig";
/// Path of the release endpoint.
pub const PATH_RELEASE_PROFILE_CONFIG: &str = "/ReleaseProfileConfig";

/// The device dranet prepares (dranet's `DeviceIdentifiers`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceIdentifiers {
    /// The device's name in dranet's ResourceSlice.
    pub name: String,
    /// PCI address, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// MAC address, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
}

/// dranet's request body for both POST endpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileRequest {
    /// The device.
    pub device: DeviceIdentifiers,
    /// The ResourceClaim's UID.
    pub claim_uid: String,
    /// dranet's merged NetworkConfig; only `profile` is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
}

/// Where the provider reads networks and writes addresses.
#[derive(Clone)]
pub struct ProfileProvider {
    client: kube::Client,
}

impl std::fmt::Debug for ProfileProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfileProvider").finish_non_exhaustive()
    }
}

/// An answer with a status code and a plain-text reason, as dranet logs it.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: StatusCode,
    /// Why.
    pub message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.status, self.message).into_response()
    }
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Refusal {
    Refusal { status, message: message.into() }
}

/// The network a dranet profile names: `weft.io/<network>`.
pub fn profile_network(profile: &str) -> Option<&str> {
    profile.strip_prefix(PROFILE_PREFIX).filter(|n| !n.is_empty() && !n.contains('/'))
}

fn profile_of(req: &ProfileRequest) -> Result<&str, Refusal> {
    let profile = req.config.as_ref().and_then(|c| c.get("profile")).and_then(|p| p.as_str()).unwrap_or("");
    profile_network(profile).ok_or_else(|| {
        refuse(
            StatusCode::NOT_FOUND,
            format!("profile '{profile}' is not weft's: weft answers for {PROFILE_PREFIX}<NumaNetwork name>"),
        )
    })
}

impl ProfileProvider {
    /// A provider using `client`.
    pub fn new(client: kube::Client) -> ProfileProvider {
        ProfileProvider { client }
    }

    /// The HTTP routes.
    pub fn router(self) -> Router {
        Router::new()
            .route(PATH_HEALTH, get(|| async { Json(json!({"cloudProvider": false, "profileProvider": true})) }))
            .route(PATH_GET_PROFILE_CONFIG, post(get_profile_config))
            .route(PATH_RELEASE_PROFILE_CONFIG, post(release_profile_config))
            .with_state(Arc::new(self))
    }

    /// Hands out an address of the profile's network for `req`'s (claim, device); the NetworkConfig
    /// dranet merges.
    pub async fn allocate(&self, req: &ProfileRequest) -> Result<serde_json::Value, Refusal> {
        if req.claim_uid.is_empty() || req.device.name.is_empty() {
            return Err(refuse(StatusCode::BAD_REQUEST, "claim_uid and device.name are required"));
        }
        let network = profile_of(req)?;
        let nets: Api<NumaNetwork> = Api::all(self.client.clone());
        let nn = nets
            .get_opt(network)
            .await
            .map_err(|e| refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("reading NumaNetwork {network}: {e}")))?
            .ok_or_else(|| refuse(StatusCode::NOT_FOUND, format!("NumaNetwork {network} does not exist")))?;
        nn.validate().map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("NumaNetwork {network} is invalid: {e}")))?;
        let range = Cidr::parse(&nn.spec.ref_resource_claim_dranet.ip_range)
            .map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("NumaNetwork {network}: ipRange: {e}")))?;
        let request = AddressRequest {
            network: network.to_string(),
            range,
            claim: AddressClaim {
                namespace: String::new(),
                name: String::new(),
                uid: req.claim_uid.clone(),
                request: Some(req.device.name.clone()),
            },
            node: String::new(),
        };
        let allocated = network_address::allocate(&self.client, &request).await.map_err(|e| match e {
            AddressError::Exhausted { .. } => refuse(StatusCode::CONFLICT, e.to_string()),
            AddressError::Name { .. } => refuse(StatusCode::BAD_REQUEST, e.to_string()),
            other => refuse(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        })?;
        Ok(json!({"interface": {"addresses": [format!("{}/{}", allocated.address, range.prefix_len)]}}))
    }

    /// Gives back the claim's addresses.
    pub async fn release(&self, req: &ProfileRequest) -> Result<(), Refusal> {
        if req.claim_uid.is_empty() {
            return Err(refuse(StatusCode::BAD_REQUEST, "claim_uid is required"));
        }
        // A profile that is not weft's holds nothing here.
        if profile_of(req).is_err() {
            return Ok(());
        }
        network_address::release(&self.client, &req.claim_uid)
            .await
            .map(|_| ())
            .map_err(|e| refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
    }
}

async fn get_profile_config(
    State(p): State<Arc<ProfileProvider>>,
    body: Result<Json<ProfileRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("request body: {e}")).into_response(),
    };
    match p.allocate(&req).await {
        Ok(config) => Json(config).into_response(),
        Err(r) => {
            tracing::warn!(claim = %req.claim_uid, device = %req.device.name, status = %r.status, "{}", r.message);
            r.into_response()
        }
    }
}

async fn release_profile_config(
    State(p): State<Arc<ProfileProvider>>,
    body: Result<Json<ProfileRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("request body: {e}")).into_response(),
    };
    match p.release(&req).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(r) => r.into_response(),
    }
}

/// Serve the provider on `listener` until `shutdown` completes.
pub async fn serve(
    provider: ProfileProvider,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, provider.router()).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_weft_profiles_name_a_network() {
        assert_eq!(profile_network("weft.io/net-a"), Some("net-a"));
        assert_eq!(profile_network("weft.io/"), None);
        assert_eq!(profile_network("acme.com/net-a"), None);
        assert_eq!(profile_network("weft.io/a/b"), None);
    }

    #[test]
    fn requests_use_dranets_field_names() {
        let body = json!({
            "device": {"name": "pci-0000-3b-02-1", "pci_address": "0000:3b:02.1", "mac_address": "aa:bb:cc:dd:ee:ff"},
            "claim_uid": "uid-1",
            "config": {"profile": "weft.io/net-a", "interface": {"name": "net1"}}
        });
        let req: ProfileRequest = serde_json::from_value(body).unwrap();
        assert_eq!(req.device.pci_address.as_deref(), Some("0000:3b:02.1"));
        assert_eq!(req.claim_uid, "uid-1");
        assert_eq!(profile_of(&req).unwrap(), "net-a");
    }
}
