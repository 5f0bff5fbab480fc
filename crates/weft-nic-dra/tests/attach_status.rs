//! The claim status write: against the fake API server (the object it leaves, its field owner,
//! the error of a failing server), and its exact requests against a tower-test mock (the status
//! subresource, the field manager, force, the claim's UID, and a body with only this driver's
//! entries, which is what keeps other drivers' entries on a real API server: `status.devices` is
//! a list map there, while the fake server treats lists as atomic; and the 404 of a claim that is
//! gone, which the fake server does not give: its status apply creates the object, and it does
//! not check the UID of a status apply either).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;
use weft_fakeapi::{FakeApiServer, RequestMatcher, Verb};
use weft_nic_dra::prepared::ClaimRef;
use weft_nic_dra::status::{ClaimStatus, DeviceNetwork, KubeClaimStatus};

async fn guard<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.expect("test hung")
}

fn device(device: &str, ifname: &str, ip: &str) -> DeviceNetwork {
    DeviceNetwork {
        pool: "node-a".into(),
        device: device.into(),
        vf_pci: "0000:3b:00.2".into(),
        interface_name: ifname.into(),
        ips: vec![ip.parse().unwrap()],
        hardware_address: Some("02:00:00:aa:bb:cc".into()),
        since: "2026-03-04T05:06:07Z".parse::<Timestamp>().unwrap(),
    }
}

/// A claim on the fake server, allocated to nic.weft.io; its UID.
fn seed_claim(server: &FakeApiServer, name: &str) -> ClaimRef {
    let stored = server
        .insert(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.weft.io"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "nic", "driver": "nic.weft.io", "pool": "node-a", "device": "vf-0"}
            ]}}},
        }))
        .unwrap();
    ClaimRef { namespace: "ml".into(), name: name.into(), uid: stored["metadata"]["uid"].as_str().unwrap().into() }
}

#[tokio::test]
async fn the_status_apply_writes_network_data_and_conditions_as_nic_weft_io() {
    let server = FakeApiServer::start().await;
    let claim = seed_claim(&server, "c1");
    let status = KubeClaimStatus::new(server.client());
    guard(status.publish(&claim, &[device("vf-0", "net1", "192.168.10.5/24")])).await.unwrap();

    let stored = server.get("resourceclaims", Some("ml"), "c1").unwrap();
    let entries = stored["status"]["devices"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let e = &entries[0];
    assert_eq!(
        (e["driver"].as_str(), e["pool"].as_str(), e["device"].as_str()),
        (Some("nic.weft.io"), Some("node-a"), Some("vf-0"))
    );
    assert_eq!(
        e["networkData"],
        json!({"interfaceName": "net1", "ips": ["192.168.10.5/24"], "hardwareAddress": "02:00:00:aa:bb:cc"})
    );
    let conditions: Vec<(&str, &str)> = e["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    assert_eq!(conditions, [("Ready", "True"), ("NetworkReady", "True")]);
    assert!(stored["status"]["allocation"].is_object(), "the allocation is kept: {stored}");
    assert!(stored["spec"]["devices"]["requests"].is_array(), "a status write leaves the spec alone");

    // The write was a server-side apply on the status subresource, owned by nic.weft.io.
    let patches: Vec<_> = server.requests().into_iter().filter(|r| r.verb == Verb::Patch).collect();
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0].rbac_resource(), "resourceclaims/status");
    assert_eq!(patches[0].field_manager.as_deref(), Some("nic.weft.io"));
    let owners: Vec<(&str, &str, &str)> = stored["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["manager"].as_str().unwrap_or_default(),
                m["operation"].as_str().unwrap_or_default(),
                m["subresource"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert!(owners.contains(&("nic.weft.io", "Apply", "status")), "{owners:?}");

    // The same devices again: the same status.
    guard(status.publish(&claim, &[device("vf-0", "net1", "192.168.10.5/24")])).await.unwrap();
    let again = server.get("resourceclaims", Some("ml"), "c1").unwrap();
    assert_eq!(again["status"], stored["status"]);
    weft_testkit::rbac::assert_granted(&server.requests(), &["base/agent/rbac.yaml", "components/nic-dra/rbac.yaml"]);
}

#[tokio::test]
async fn a_failing_server_is_an_error_worth_another_try() {
    let server = FakeApiServer::start().await;
    let status = KubeClaimStatus::new(server.client());
    let claim = seed_claim(&server, "c3");
    server.fail_next(RequestMatcher::new(Verb::Patch, "resourceclaims/status"), 500, 1);
    let e = guard(status.publish(&claim, &[device("vf-0", "net1", "192.168.10.5/24")])).await.unwrap_err();
    assert!(!e.permanent, "a 500 is worth another try: {e}");
    guard(status.publish(&claim, &[device("vf-0", "net1", "192.168.10.5/24")])).await.unwrap();
}

#[tokio::test]
async fn the_request_is_a_forced_apply_of_only_this_drivers_entries_on_the_status_subresource() {
    let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let status = KubeClaimStatus::new(kube::Client::new(svc, "default"));
    let claim = ClaimRef { namespace: "ml".into(), name: "c1".into(), uid: "u-1".into() };
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("one request");
        assert_eq!(req.method(), Method::PATCH);
        assert_eq!(req.uri().path(), "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c1/status");
        let query: Vec<&str> = req.uri().query().unwrap_or("").split('&').collect();
        assert!(query.contains(&"fieldManager=nic.weft.io"), "{query:?}");
        assert!(query.contains(&"force=true"), "{query:?}");
        assert_eq!(req.headers()["content-type"], "application/apply-patch+yaml");
        let body: Value = serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        let reply = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c1", "namespace": "ml", "uid": "u-1"}, "spec": {}});
        send.send_response(
            Response::builder().status(StatusCode::OK).body(Body::from(serde_json::to_vec(&reply).unwrap())).unwrap(),
        );
        // The claim is gone (a status apply never creates its object: 404).
        let (req, send) = handle.next_request().await.expect("a second request");
        assert_eq!(req.uri().path(), "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c1/status");
        let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "resourceclaims.resource.k8s.io \"c1\" not found", "reason": "NotFound", "code": 404});
        send.send_response(
            Response::builder().status(404).body(Body::from(serde_json::to_vec(&gone).unwrap())).unwrap(),
        );
        body
    });
    let two = [device("vf-0", "net1", "192.168.10.5/24"), device("vf-1", "net2", "192.168.10.6/24")];
    guard(status.publish(&claim, &two)).await.unwrap();
    let e = guard(status.publish(&claim, &two)).await.unwrap_err();
    assert!(e.permanent, "{e}");
    assert!(e.to_string().contains("ResourceClaim ml/c1") && e.to_string().contains("not found"), "{e}");
    let body = guard(server).await.unwrap();
    assert_eq!(body["metadata"], json!({"name": "c1", "namespace": "ml", "uid": "u-1"}));
    assert_eq!(body.as_object().unwrap().keys().collect::<Vec<_>>(), ["apiVersion", "kind", "metadata", "status"]);
    let entries = body["status"]["devices"].as_array().unwrap();
    let keys: Vec<(&str, &str, &str)> = entries
        .iter()
        .map(|e| (e["driver"].as_str().unwrap(), e["pool"].as_str().unwrap(), e["device"].as_str().unwrap()))
        .collect();
    assert_eq!(keys, [("nic.weft.io", "node-a", "vf-0"), ("nic.weft.io", "node-a", "vf-1")]);
    assert_eq!(entries[1]["networkData"]["ips"], json!(["192.168.10.6/24"]));
}
